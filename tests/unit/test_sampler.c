/* test_sampler.c — greedy, temperature, top-k, top-p, min-p, penalties, seeding, logprobs:
 * each checked against a direct computation (full softmax / full sort) done here. */
#include "engine/sampler.h"
#include "tests/test.h"

static sf_sampling defaults(void)
{
    sf_sampling p;
    memset(&p, 0, sizeof p);
    p.temperature = 1.0f;
    p.top_p = 1.0f;
    p.repetition_penalty = 1.0f;
    p.has_seed = 1;
    p.seed = 42;
    return p;
}

static void log_softmax(const float *l, int n, double *out)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++) m = fmax(m, l[i]);
    for (int i = 0; i < n; i++) z += exp(l[i] - m);
    for (int i = 0; i < n; i++) out[i] = l[i] - m - log(z);
}

TEST(greedy_and_logprobs)
{
    sf_sampling p = defaults();
    p.temperature = 0;
    p.logprobs = 5;
    sf_sampler_seq s;
    sf_error err = { 0 };
    int rc = sf_sampler_seq_init(&s, &p, 1000, NULL, 0, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    sf_rng r;
    sf_rng_seed(&r, 7);
    float l[1000], copy[1000];
    for (int i = 0; i < 1000; i++) l[i] = sf_rng_normal(&r) * 3;
    l[611] = 20;
    memcpy(copy, l, sizeof l);
    double ls[1000];
    log_softmax(copy, 1000, ls);
    float lp = 0;
    sf_logprob top[SF_MAX_LOGPROBS];
    int n_top = 0;
    int32_t id = sf_sample(&p, &s, l, 1000, &lp, top, &n_top);
    CHECK(id == 611);
    CHECK_MSG(fabs(lp - ls[611]) < 1e-5, "logprob %g vs %g", lp, ls[611]);
    REQUIRE(n_top == 5, "n_top %d", n_top);
    /* top 5 by full sort */
    int order[1000];
    for (int i = 0; i < 1000; i++) order[i] = i;
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 1000; j++)
            if (copy[order[j]] > copy[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(top[i].id == order[i], "top[%d] = %d, expected %d", i, top[i].id, order[i]);
        CHECK(fabs(top[i].logprob - ls[order[i]]) < 1e-5);
    }
    sf_sampler_seq_free(&s);
}

/* Draw N samples from logits l (n entries) and return frequencies. */
static void histogram(sf_sampling *p, const float *l, int n, int N, double *freq)
{
    sf_sampler_seq s;
    sf_sampler_seq_init(&s, p, n, NULL, 0, NULL);
    float *tmp = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) freq[i] = 0;
    for (int k = 0; k < N; k++) {
        memcpy(tmp, l, sizeof(float) * n);
        int32_t id = sf_sample(p, &s, tmp, n, NULL, NULL, NULL);
        freq[id] += 1.0 / N;
        sf_sampler_accept(&s, id); /* the next draw is the next step's */
    }
    free(tmp);
    sf_sampler_seq_free(&s);
}

TEST(temperature_topk_topp_minp_distributions)
{
    /* probabilities 0.5, 0.3, 0.15, 0.05 */
    float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    double f[4];
    const int N = 40000;
    sf_sampling p = defaults();
    histogram(&p, l, 4, N, f);
    CHECK_MSG(fabs(f[0] - 0.5) < 0.015 && fabs(f[1] - 0.3) < 0.015 && fabs(f[2] - 0.15) < 0.01 && fabs(f[3] - 0.05) < 0.01,
              "T=1: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    /* T = 0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 normalised */
    p.temperature = 0.5f;
    histogram(&p, l, 4, N, f);
    double z = 0.25 + 0.09 + 0.0225 + 0.0025;
    CHECK_MSG(fabs(f[0] - 0.25 / z) < 0.015 && fabs(f[1] - 0.09 / z) < 0.015, "T=0.5: %.3f %.3f", f[0], f[1]);
    p.temperature = 1;
    p.top_k = 2;
    histogram(&p, l, 4, N, f);
    CHECK_MSG(f[2] == 0 && f[3] == 0 && fabs(f[0] - 0.625) < 0.015, "top_k=2: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    p.top_k = 0;
    p.top_p = 0.7f; /* 0.5 < 0.7 <= 0.8: keeps the first two */
    histogram(&p, l, 4, N, f);
    CHECK_MSG(f[2] == 0 && f[3] == 0 && fabs(f[0] - 0.625) < 0.015, "top_p=0.7: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    p.top_p = 0.45f; /* the first alone reaches it */
    histogram(&p, l, 4, N, f);
    CHECK_MSG(f[0] > 0.9999 && f[1] == 0, "top_p=0.45: %.3f", f[0]);
    p.top_p = 1;
    p.min_p = 0.2f; /* keeps p >= 0.1: the first three */
    histogram(&p, l, 4, N, f);
    CHECK_MSG(f[3] == 0 && fabs(f[0] - 0.5 / 0.95) < 0.015, "min_p=0.2: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
}

/* top-p over a large vocabulary whose nucleus spans several selection rounds. */
TEST(top_p_large_vocab_matches_full_sort)
{
    const int V = 128256;
    float *l = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    sf_rng r;
    sf_rng_seed(&r, 99);
    for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&r) * 0.5f;
    /* reference nucleus: sort all (here, in the test), keep the smallest prefix reaching 0.3 */
    double *pr = malloc(sizeof(double) * V);
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) m = fmax(m, l[i]);
    for (int i = 0; i < V; i++) z += (pr[i] = exp(l[i] - m));
    float *sorted = malloc(sizeof(float) * V);
    memcpy(sorted, l, sizeof(float) * V);
    int cmp(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return (x < y) - (x > y); }
    qsort(sorted, V, sizeof(float), cmp);
    double cum = 0;
    float cutoff = sorted[V - 1];
    int nucleus = V;
    for (int i = 0; i < V; i++) {
        cum += exp(sorted[i] - m);
        if (cum >= 0.3 * z) { cutoff = sorted[i]; nucleus = i + 1; break; }
    }
    sf_sampling p = defaults();
    p.top_p = 0.3f;
    sf_sampler_seq s;
    sf_sampler_seq_init(&s, &p, V, NULL, 0, NULL);
    int outside = 0, distinct = 0;
    char *seen = calloc(V, 1);
    double t0 = sf_now_s();
    const int N = 200;
    for (int k = 0; k < N; k++) {
        memcpy(tmp, l, sizeof(float) * V);
        int32_t id = sf_sample(&p, &s, tmp, V, NULL, NULL, NULL);
        sf_sampler_accept(&s, id);
        if (l[id] < cutoff) outside++;
        if (!seen[id]++) distinct++;
    }
    double dt = (sf_now_s() - t0) / N;
    CHECK_MSG(nucleus > 1024, "the case must span several rounds (nucleus %d)", nucleus);
    CHECK_MSG(outside == 0, "%d of %d samples outside the nucleus of %d", outside, N, nucleus);
    CHECK_MSG(distinct > N / 2, "only %d distinct ids in %d draws from a nucleus of %d", distinct, N, nucleus);
    printf("  vocab %d, nucleus %d: %.2f ms per sample\n", V, nucleus, dt * 1e3);
    sf_sampler_seq_free(&s);
    free(seen); free(sorted); free(pr); free(l); free(tmp);
}

TEST(seed_reproducible)
{
    const int V = 5000;
    float *l = malloc(sizeof(float) * V), *tmp = malloc(sizeof(float) * V);
    sf_rng r;
    sf_rng_seed(&r, 5);
    for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&r);
    int32_t a[32], b[32], c[32];
    sf_sampling p = defaults();
    p.top_k = 50;
    p.top_p = 0.9f;
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 43 : 42;
        sf_sampler_seq s;
        sf_sampler_seq_init(&s, &p, V, NULL, 0, NULL);
        for (int k = 0; k < 32; k++) {
            memcpy(tmp, l, sizeof(float) * V);
            int32_t id = sf_sample(&p, &s, tmp, V, NULL, NULL, NULL);
            sf_sampler_accept(&s, id);
            (run == 0 ? a : run == 1 ? b : c)[k] = id;
        }
        sf_sampler_seq_free(&s);
    }
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_MSG(memcmp(a, c, sizeof a) != 0, "a different seed gives a different stream");
    free(l); free(tmp);
}

TEST(penalties)
{
    const int V = 8;
    sf_sampling p = defaults();
    p.temperature = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repetition_penalty = 2.0f;
    int32_t prompt[2] = { 1, 6 };
    sf_sampler_seq s;
    sf_error err = { 0 };
    int rc = sf_sampler_seq_init(&s, &p, V, prompt, 2, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    sf_sampler_accept(&s, 3);
    sf_sampler_accept(&s, 3);
    sf_sampler_accept(&s, 6);
    float l[8] = { 1, 2, 3, 4, -1, 0.5f, -2, 0 };
    /* id 1: prompt only -> 2/2 = 1; id 3: count 2 -> 4/2 - 2*0.25 - 0.5 = 1; id 6: prompt + 1 ->
     * -2*2 - 0.25 - 0.5 = -4.75; others unchanged */
    float want[8] = { 1, 1, 3, 1, -1, 0.5f, -4.75f, 0 };
    float lp;
    int32_t id = sf_sample(&p, &s, l, V, &lp, NULL, NULL);
    for (int i = 0; i < V; i++) CHECK_MSG(fabsf(l[i] - want[i]) < 1e-6f, "logit %d: %g, want %g", i, l[i], want[i]);
    CHECK_MSG(id == 2, "greedy after penalties picks 2, got %d", id);
    double ls[8];
    log_softmax(want, V, ls);
    CHECK(fabs(lp - ls[2]) < 1e-5);
    sf_sampler_seq_free(&s);
}

/* logit_bias: added to the raw logits before the penalties, on the host path and in the op's
 * entries (the bias ids first, each once, beside the penalized ones) */
TEST(logit_bias)
{
    const int V = 8;
    sf_sampling p = defaults();
    p.temperature = 0;
    const sf_logit_bias b[2] = { { 2, -100 }, { 5, 3.5f } };
    p.n_bias = 2;
    p.bias = b;
    sf_sampler_seq s;
    sf_error err = { 0 };
    REQUIRE(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_OK, "%s", err.msg);
    CHECK(!s.counts); /* no penalties: no per-vocabulary state */
    float l[8] = { 1, 2, 3, 0, -1, 0.5f, -2, 0 };
    int32_t id = sf_sample(&p, &s, l, V, NULL, NULL, NULL);
    CHECK_MSG(id == 5 && l[5] == 4.0f && l[2] == -97.0f, "id %d, l[5] %g, l[2] %g", id, l[5], l[2]);
    sf_sample_row row;
    sf_sample_pen *pen = NULL;
    int n_pen = 3, cap = 0; /* appended after 3 entries of other rows */
    REQUIRE(sf_sampler_row(&p, &s, &row, &pen, &n_pen, &cap) == SF_OK, "row");
    CHECK(row.pen_off == 3 && row.n_pen == 2 && n_pen == 5);
    CHECK(pen[3].id == 2 && pen[3].bias == -100 && pen[3].count == 0 && !pen[3].in_prompt);
    CHECK(pen[4].id == 5 && pen[4].bias == 3.5f);
    sf_sampler_seq_free(&s);

    /* with penalties: prompt id 5 (biased) and id 1, output 5 and 3; bias 5 first, then penalty */
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    int32_t prompt[3] = { 5, 1, 5 };
    REQUIRE(sf_sampler_seq_init(&s, &p, V, prompt, 3, &err) == SF_OK, "%s", err.msg);
    sf_sampler_accept(&s, 5);
    sf_sampler_accept(&s, 3);
    n_pen = 0;
    REQUIRE(sf_sampler_row(&p, &s, &row, &pen, &n_pen, &cap) == SF_OK, "row");
    CHECK_MSG(n_pen == 4, "%d entries: 2, 5, 1, 3 each once", n_pen);
    static const int32_t want_id[4] = { 2, 5, 1, 3 }, want_count[4] = { 0, 1, 0, 1 }, want_prompt[4] = { 0, 1, 1, 0 };
    static const float want_bias[4] = { -100, 3.5f, 0, 0 };
    for (int i = 0; i < 4 && i < n_pen; i++)
        CHECK_MSG(pen[i].id == want_id[i] && pen[i].count == want_count[i] && pen[i].in_prompt == want_prompt[i] &&
                      pen[i].bias == want_bias[i],
                  "entry %d: id %d count %d in_prompt %d bias %g", i, pen[i].id, pen[i].count, pen[i].in_prompt,
                  pen[i].bias);
    float l2[8] = { 1, 2, 3, 0, -1, 0.5f, -2, 0 };
    sf_sample(&p, &s, l2, V, NULL, NULL, NULL);
    /* 5: (0.5 + 3.5) / 2 - 0.5 = 1.5; 2 (neither drawn nor in the prompt): 3 - 100; 1: 2 / 2 = 1;
     * 3: 0 * 2 - 0.5 */
    CHECK_MSG(l2[5] == 1.5f && l2[2] == -97.0f && l2[1] == 1.0f && l2[3] == -0.5f, "%g %g %g %g", l2[5], l2[2],
              l2[1], l2[3]);
    free(pen);
    sf_sampler_seq_free(&s);

    /* refused: an id twice, outside the vocabulary, a bias outside [-100, 100], too many, no list */
    const sf_logit_bias twice[2] = { { 4, 1 }, { 4, 2 } }, past[1] = { { 8, 1 } }, big[1] = { { 1, 100.5f } };
    p = defaults();
    p.n_bias = 2, p.bias = twice;
    CHECK(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "twice"));
    p.n_bias = 1, p.bias = past;
    CHECK(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "vocabulary"));
    p.bias = big;
    CHECK(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "[-100, 100]"));
    p.n_bias = SF_MAX_LOGIT_BIAS + 1;
    CHECK(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "at most"));
    p.n_bias = 1, p.bias = NULL;
    CHECK(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_EINVAL);
}

/* min_tokens: the ban list is -inf (an entry of its own, or the id's entry) until that many
 * tokens were accepted, on the host path and in the op's entries */
TEST(min_tokens_ban)
{
    const int V = 8;
    sf_sampling p = defaults();
    p.temperature = 0;
    p.min_tokens = 2;
    const sf_logit_bias b[1] = { { 3, 50 } };
    p.n_bias = 1;
    p.bias = b;
    sf_sampler_seq s;
    sf_error err = { 0 };
    REQUIRE(sf_sampler_seq_init(&s, &p, V, NULL, 0, &err) == SF_OK, "%s", err.msg);
    const int32_t ban[5] = { 3, 6, 3, 7, 8 }; /* 3 also biased; a duplicate and an id past V dropped */
    sf_sampler_set_ban(&s, ban, 5, V);
    CHECK(s.n_ban == 3);
    sf_sample_row row;
    sf_sample_pen *pen = NULL;
    int n_pen = 0, cap = 0;
    REQUIRE(sf_sampler_row(&p, &s, &row, &pen, &n_pen, &cap) == SF_OK, "row");
    CHECK_MSG(row.n_pen == 3 && pen[0].id == 3 && isinf(pen[0].bias) && pen[0].bias < 0 && pen[1].id == 6 &&
                  isinf(pen[1].bias) && pen[2].id == 7,
              "%d entries: %d %g, %d %g", row.n_pen, pen[0].id, pen[0].bias, pen[1].id, pen[1].bias);
    float l[8] = { 0, 1, 2, 3, 0, 0, 9, 0 };
    int32_t id = sf_sample(&p, &s, l, V, NULL, NULL, NULL);
    CHECK_MSG(id == 2, "banned 3 (biased) and 6: greedy picks 2, got %d", id);
    sf_sampler_accept(&s, id);
    sf_sampler_accept(&s, id); /* two accepted: the ban ends */
    n_pen = 0;
    REQUIRE(sf_sampler_row(&p, &s, &row, &pen, &n_pen, &cap) == SF_OK, "row");
    CHECK(row.n_pen == 1 && pen[0].id == 3 && pen[0].bias == 50);
    float l2[8] = { 0, 1, 2, 3, 0, 0, 9, 0 };
    CHECK(sf_sample(&p, &s, l2, V, NULL, NULL, NULL) == 3);
    free(pen);
    sf_sampler_seq_free(&s);
}

TEST(rejects_bad_parameters)
{
    sf_sampler_seq s;
    sf_error err = { 0 };
    sf_sampling p = defaults();
    p.top_p = 0;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "top_p"));
    p = defaults();
    p.temperature = -1;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "temperature"));
    p = defaults();
    p.min_p = 1.5f;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "min_p"));
    p = defaults();
    p.repetition_penalty = 0;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL && strstr(err.msg, "repetition_penalty"));
    p = defaults();
    p.top_k = -3;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL);
    p = defaults();
    p.logprobs = 21;
    CHECK(sf_sampler_seq_init(&s, &p, 10, NULL, 0, &err) == SF_EINVAL);
    p = defaults();
    p.repetition_penalty = 1.2f;
    int32_t bad[1] = { 10 };
    CHECK(sf_sampler_seq_init(&s, &p, 10, bad, 1, &err) == SF_EINVAL && strstr(err.msg, "prompt token"));
    /* masked logits (-inf) are never drawn */
    p = defaults();
    float l[4] = { -INFINITY, 0, -INFINITY, 0 };
    int rc = sf_sampler_seq_init(&s, &p, 4, NULL, 0, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    for (int k = 0; k < 200; k++) {
        float t[4];
        memcpy(t, l, sizeof t);
        int32_t id = sf_sample(&p, &s, t, 4, NULL, NULL, NULL);
        CHECK(id == 1 || id == 3);
    }
    sf_sampler_seq_free(&s);
}

int main(void)
{
    RUN(greedy_and_logprobs);
    RUN(temperature_topk_topp_minp_distributions);
    RUN(top_p_large_vocab_matches_full_sort);
    RUN(seed_reproducible);
    RUN(penalties);
    RUN(logit_bias);
    RUN(min_tokens_ban);
    RUN(rejects_bad_parameters);
    return test_summary();
}
