/* test_sample_op.c — the backend sample op on the CPU backend (kernels/cpu/sample.c, the
 * reference the CUDA kernel is tested against): greedy with penalties against a direct
 * argmax, distributions against the exact truncated softmax, ties cut by id, top-p over a
 * large vocabulary against a full sort, determinism per (seed, step), rows of a batch
 * independent, the engine's two paths (host sf_sample and the op) choosing alike, allow masks
 * drawing as -inf logits do, the draw's skipped tokens never the winner, the log-probabilities
 * it gives against a full sort, bad input. */
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "kernels/sample_draw.h"
#include "tests/lib/sample_lp_case.h"
#include "tests/test.h"

static sf_backend *be;

static sf_sample_row row_default(void)
{
    return (sf_sample_row){ .temperature = 1, .top_p = 1, .repetition_penalty = 1, .seed = 42 };
}

/* ids of n rows of logits [n * V] through the op. */
static int op_lp(const float *l, int n, int V, const sf_sample_row *rows, const sf_sample_pen *pen, int n_pen,
                 int32_t *ids, sf_sample_lp *lp)
{
    sf_buf *buf = NULL;
    sf_error err = { 0 };
    if (be->ops->buf_new(be, n, V, &buf, &err)) return -100;
    be->ops->write_f32(be, buf, n, l);
    int rc = be->ops->sample(be, buf, n, V, rows, pen, n_pen, ids, lp);
    be->ops->buf_free(be, buf);
    return rc;
}

static int op(const float *l, int n, int V, const sf_sample_row *rows, const sf_sample_pen *pen, int n_pen,
              int32_t *ids)
{
    return op_lp(l, n, V, rows, pen, n_pen, ids, NULL);
}

/* Frequencies of N draws (steps 0..N-1) from one row. */
static void freq_of(const float *l, int V, sf_sample_row r, int N, double *f)
{
    for (int i = 0; i < V; i++) f[i] = 0;
    for (int k = 0; k < N; k++) {
        int32_t id = -1;
        r.step = (uint64_t)k;
        if (op(l, 1, V, &r, NULL, 0, &id) || id < 0 || id >= V) { f[0] = -1; return; }
        f[id] += 1.0 / N;
    }
}

TEST(greedy_with_penalties_is_argmax)
{
    enum { V = 3000 };
    static float l[V];
    sf_rng g;
    sf_rng_seed(&g, 3);
    for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&g);
    l[77] = 9;  /* the top, then penalized below the second */
    l[1234] = 8;
    sf_sample_row r = row_default();
    r.temperature = 0;
    int32_t id = -1;
    REQUIRE(op(l, 1, V, &r, NULL, 0, &id) == SF_OK, "op failed");
    CHECK_MSG(id == 77, "greedy %d", id);
    sf_sample_pen pen[1] = { { 77, 2, 0 } };
    r.frequency_penalty = 1.0f; /* 9 - 2 = 7 < 8 */
    r.n_pen = 1;
    REQUIRE(op(l, 1, V, &r, pen, 1, &id) == SF_OK, "op failed");
    CHECK_MSG(id == 1234, "frequency penalty: %d", id);
    r.frequency_penalty = 0;
    r.repetition_penalty = 1.2f; /* 9 / 1.2 = 7.5 < 8, through in_prompt alone */
    pen[0] = (sf_sample_pen){ 77, 0, 1 };
    REQUIRE(op(l, 1, V, &r, pen, 1, &id) == SF_OK, "op failed");
    CHECK_MSG(id == 1234, "repetition penalty: %d", id);
    /* ties: the smallest id, as the host's argmax */
    float t[4] = { 1, 5, 5, 2 };
    r = row_default();
    r.temperature = 0;
    REQUIRE(op(t, 1, 4, &r, NULL, 0, &id) == SF_OK, "op failed");
    CHECK_MSG(id == 1, "tie: %d", id);
}

TEST(distributions_match_the_truncated_softmax)
{
    float l[4] = { logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f) };
    double f[4];
    const int N = 20000;
    sf_sample_row r = row_default();
    freq_of(l, 4, r, N, f);
    CHECK_MSG(fabs(f[0] - 0.5) < 0.02 && fabs(f[1] - 0.3) < 0.02 && fabs(f[2] - 0.15) < 0.015 && fabs(f[3] - 0.05) < 0.01,
              "T=1: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    r.temperature = 0.5f;
    freq_of(l, 4, r, N, f);
    double z = 0.25 + 0.09 + 0.0225 + 0.0025;
    CHECK_MSG(fabs(f[0] - 0.25 / z) < 0.02 && fabs(f[1] - 0.09 / z) < 0.02, "T=0.5: %.3f %.3f", f[0], f[1]);
    r.temperature = 1;
    r.top_k = 2;
    freq_of(l, 4, r, N, f);
    CHECK_MSG(f[2] == 0 && f[3] == 0 && fabs(f[0] - 0.625) < 0.02, "top_k=2: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    r.top_k = 0;
    r.top_p = 0.7f;
    freq_of(l, 4, r, N, f);
    CHECK_MSG(f[2] == 0 && f[3] == 0 && fabs(f[0] - 0.625) < 0.02, "top_p=0.7: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    r.top_p = 0.45f;
    freq_of(l, 4, r, N, f);
    CHECK_MSG(f[0] > 0.9999 && f[1] == 0, "top_p=0.45: %.3f", f[0]);
    r.top_p = 1;
    r.min_p = 0.2f;
    freq_of(l, 4, r, N, f);
    CHECK_MSG(f[3] == 0 && fabs(f[0] - 0.5 / 0.95) < 0.02, "min_p=0.2: %.3f %.3f %.3f %.3f", f[0], f[1], f[2], f[3]);
    /* -inf is never drawn */
    float m[3] = { 0, -INFINITY, 0 };
    r = row_default();
    freq_of(m, 3, r, 2000, f);
    CHECK_MSG(f[1] == 0 && f[0] > 0.4 && f[2] > 0.4, "-inf: %.3f %.3f %.3f", f[0], f[1], f[2]);
}

TEST(ties_on_the_boundary_are_cut_by_id)
{
    /* five equal logits: top_k 2 keeps ids 0 and 1 only, each half the time */
    float l[6] = { 3, 3, 3, 3, 3, -1 };
    double f[6];
    sf_sample_row r = row_default();
    r.top_k = 2;
    freq_of(l, 6, r, 4000, f);
    CHECK_MSG(f[2] == 0 && f[3] == 0 && f[4] == 0 && f[5] == 0 && fabs(f[0] - 0.5) < 0.04, "top_k ties: %.3f %.3f %.3f",
              f[0], f[1], f[2]);
    /* top_p 0.5 of five equal masses needs three of them (0.6 >= 0.5): ids 0, 1, 2 */
    r.top_k = 0;
    r.top_p = 0.5f;
    l[5] = -50;
    freq_of(l, 6, r, 6000, f);
    CHECK_MSG(f[3] == 0 && f[4] == 0 && f[5] == 0 && fabs(f[2] - 1.0 / 3) < 0.04, "top_p ties: %.3f %.3f %.3f %.3f",
              f[0], f[1], f[2], f[3]);
}

TEST(top_p_large_vocab_matches_full_sort)
{
    enum { V = 128256 };
    static float l[V], sorted[V];
    sf_rng g;
    sf_rng_seed(&g, 99);
    for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&g) * 0.5f;
    double m = -INFINITY, z = 0, cum = 0;
    for (int i = 0; i < V; i++) m = fmax(m, l[i]);
    for (int i = 0; i < V; i++) z += exp(l[i] - m);
    memcpy(sorted, l, sizeof l);
    int cmp(const void *a, const void *b) { float x = *(const float *)a, y = *(const float *)b; return (x < y) - (x > y); }
    qsort(sorted, V, sizeof(float), cmp);
    float cutoff = sorted[V - 1];
    for (int i = 0; i < V; i++) {
        cum += exp(sorted[i] - m);
        if (cum >= 0.3 * z) { cutoff = sorted[i]; break; }
    }
    sf_sample_row r = row_default();
    r.top_p = 0.3f;
    r.top_k = 40000;
    int outside = 0, distinct = 0;
    static char seen[V];
    for (int k = 0; k < 100; k++) {
        int32_t id = -1;
        r.step = (uint64_t)k;
        REQUIRE(op(l, 1, V, &r, NULL, 0, &id) == SF_OK, "op failed");
        if (l[id] < cutoff) outside++;
        if (!seen[id]++) distinct++;
    }
    CHECK_MSG(outside == 0, "%d draws outside the nucleus", outside);
    CHECK_MSG(distinct > 50, "only %d distinct ids in 100 draws", distinct);
}

/* The draw skips the logarithms of tokens that cannot reach the running best (kernels/cpu/sample.c):
 * the op must still give the argmax of x - log(-log1p(-u)) over every token, on narrow rows
 * (random weights), wide ones (trained models), rows with many equal logits and at several
 * temperatures. */
TEST(draw_equals_the_full_gumbel_argmax)
{
    enum { V = 3000 };
    static float l[V];
    static const float spread[] = { 0.05f, 0.5f, 3.0f, 12.0f };
    static const float temps[] = { 1.0f, 0.7f, 1.9f };
    sf_rng g;
    sf_rng_seed(&g, 7);
    int differ = 0, runs = 0;
    for (int si = 0; si < 4; si++)
        for (int ti = 0; ti < 3; ti++)
            for (int k = 0; k < 40; k++) {
                for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&g) * spread[si];
                if (k % 4 == 3)
                    for (int i = 0; i < V; i++) l[i] = (float)(int)(l[i] * 2) * 0.5f; /* many ties */
                sf_sample_row r = row_default();
                r.temperature = temps[ti];
                r.seed = 1000 + (uint64_t)k;
                r.step = (uint64_t)(k * 7 + si);
                int32_t id = -1;
                REQUIRE(op(l, 1, V, &r, NULL, 0, &id) == SF_OK, "op failed");
                const uint64_t stream = sf_sample_stream(r.seed, r.step);
                const float inv_t = 1.0f / r.temperature;
                int best = -1;
                float bv = -INFINITY;
                for (int i = 0; i < V; i++) {
                    float v = l[i] * inv_t - logf(-log1pf(-sf_sample_uniform(stream, (uint32_t)i)));
                    if (best < 0 || v > bv) { best = i; bv = v; }
                }
                differ += id != best;
                runs++;
            }
    CHECK_MSG(differ == 0, "%d of %d draws differ from the full argmax", differ, runs);
}

TEST(deterministic_and_rows_independent)
{
    enum { V = 5000, R = 6 };
    static float l[R * V];
    sf_rng g;
    sf_rng_seed(&g, 5);
    for (int i = 0; i < R * V; i++) l[i] = sf_rng_normal(&g) * 2;
    sf_sample_row rows[R];
    sf_sample_pen pen[3] = { { 10, 1, 0 }, { 11, 0, 1 }, { 4999, 3, 1 } };
    for (int i = 0; i < R; i++) {
        rows[i] = row_default();
        rows[i].seed = 100 + i;
        rows[i].step = 7;
        rows[i].top_k = i % 3 ? 50 : 0;
        rows[i].top_p = i % 2 ? 0.9f : 1;
        rows[i].min_p = i == 5 ? 0.05f : 0;
        rows[i].temperature = i == 4 ? 0 : 0.8f;
    }
    rows[3].pen_off = 0;
    rows[3].n_pen = 3;
    rows[3].repetition_penalty = 1.3f;
    rows[3].presence_penalty = 0.5f;
    int32_t a[R], b[R], one;
    REQUIRE(op(l, R, V, rows, pen, 3, a) == SF_OK, "op failed");
    REQUIRE(op(l, R, V, rows, pen, 3, b) == SF_OK, "op failed");
    CHECK(memcmp(a, b, sizeof a) == 0);
    for (int i = 0; i < R; i++) {
        sf_sample_row r = rows[i];
        REQUIRE(op(l + (size_t)i * V, 1, V, &r, pen, 3, &one) == SF_OK, "op failed");
        CHECK_MSG(one == a[i], "row %d: %d alone, %d in the batch", i, one, a[i]);
    }
    int differ = 0;
    for (int s = 0; s < 8; s++) {
        rows[0].step = (uint64_t)s + 100;
        REQUIRE(op(l, 1, V, rows, NULL, 0, &one) == SF_OK, "op failed");
        differ += one != a[0];
    }
    CHECK_MSG(differ > 0, "another step draws another token now and then");
}

/* The engine's host path (sf_sample on copied logits) and the op choose the same token: with
 * penalties, logit_bias (one of its ids in the prompt) and a min_tokens ban, then with logit_bias
 * alone. */
TEST(host_path_and_op_agree)
{
    enum { V = 4000 };
    static float l[V], tmp[V];
    sf_rng g;
    sf_rng_seed(&g, 8);
    for (int i = 0; i < V; i++) l[i] = sf_rng_normal(&g) * 1.5f;
    sf_sampling p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.9f;
    p.top_p = 0.95f;
    p.top_k = 100;
    p.repetition_penalty = 1.1f;
    p.frequency_penalty = 0.3f;
    p.has_seed = 1;
    p.seed = 1234;
    int32_t prompt[3] = { 5, 6, 5 };
    int top = 0;
    for (int i = 1; i < V; i++) top = l[i] > l[top] ? i : top;
    const sf_logit_bias bias[4] = { { 6, 2.5f }, { top, -100 }, { 3999, 8 }, { 17, -1.25f } };
    p.n_bias = 4;
    p.bias = bias;
    sf_sampler_seq s;
    sf_error err = { 0 };
    sf_sample_pen *pen = NULL;
    int cap = 0, same = 0, n_top = 0;
    for (int pass = 0; pass < 2; pass++) {
    if (pass) { /* logit_bias alone */
        p.repetition_penalty = 1, p.frequency_penalty = 0;
        sf_sampler_seq_free(&s);
    }
    REQUIRE(sf_sampler_seq_init(&s, &p, V, prompt, 3, &err) == SF_OK, "%s", err.msg);
    /* min_tokens: two ids (one of them biased) kept out of the first 10 draws */
    const int32_t ban[2] = { 6, 123 };
    p.min_tokens = 10;
    sf_sampler_set_ban(&s, ban, 2, V);
    for (int k = 0; k < 40; k++) {
        sf_sample_row row;
        int n_pen = 0;
        REQUIRE(sf_sampler_row(&p, &s, &row, &pen, &n_pen, &cap) == SF_OK, "row");
        int32_t dev = -1;
        REQUIRE(op(l, 1, V, &row, pen, n_pen, &dev) == SF_OK, "op failed");
        memcpy(tmp, l, sizeof l);
        int32_t host = sf_sample(&p, &s, tmp, V, NULL, NULL, NULL);
        same += host == dev;
        n_top += host == top;
        sf_sampler_accept(&s, host);
    }
    }
    CHECK_MSG(same == 80, "%d of 80 draws agree", same);
    CHECK_MSG(n_top == 0, "the id biased by -100 drawn %d times", n_top);
    free(pen);
    sf_sampler_seq_free(&s);
}

/* A row's allow mask: the op draws as the host path does with the disallowed logits at -inf
 * (greedy, temperature alone, top-k, top-p, min-p, with and without penalty entries, masks of
 * one id to most of them), never a disallowed id, and rows without a mask beside it unchanged. */
TEST(allow_mask_draws_as_minus_inf)
{
    enum { V = 3001, W = (V + 31) / 32 }; /* a vocabulary that ends inside a word */
    static float l[2 * V], ref[V];
    static uint32_t allow[W];
    sf_rng g;
    sf_rng_seed(&g, 21);
    for (int i = 0; i < 2 * V; i++) l[i] = sf_rng_normal(&g) * 2.0f;
    sf_cpu_sample_scratch sc = { malloc(V * sizeof(float)), malloc(V * sizeof(uint32_t)), malloc(V * sizeof(uint64_t)) };
    REQUIRE(sc.x && sc.key && sc.mass, "out of memory");
    static const float keep[] = { 0.0005f, 0.01f, 0.3f, 0.9f };
    const sf_sample_pen pen[2] = { { 5, 2, 1, 1.5f }, { 2999, 0, 0, -3.0f } };
    int n = 0, bad = 0, differ = 0, plain_differ = 0;
    for (int m = 0; m < 4; m++) {
        memset(allow, 0, sizeof allow);
        for (int i = 0; i < V; i++)
            if (sf_rng_uniform(&g) < keep[m]) allow[i >> 5] |= 1u << (i & 31);
        allow[3000 >> 5] |= 1u << (3000 & 31); /* the last id, always one */
        for (int kind = 0; kind < 5; kind++)
            for (int with_pen = 0; with_pen < 2; with_pen++)
                for (int step = 0; step < 8; step++) {
                    sf_sample_row r[2] = { row_default(), row_default() };
                    r[0].temperature = kind == 0 ? 0 : 0.8f;
                    r[0].top_k = kind == 2 ? 20 : 0;
                    r[0].top_p = kind == 3 ? 0.7f : 1;
                    r[0].min_p = kind == 4 ? 0.05f : 0;
                    r[0].step = r[1].step = (uint64_t)step;
                    r[0].n_pen = with_pen ? 2 : 0;
                    r[0].repetition_penalty = 1.2f;
                    r[0].allow = allow;
                    r[1].temperature = 0.8f; /* a row without a mask in the same call */
                    int32_t ids[2] = { -1, -1 };
                    REQUIRE(op(l, 2, V, r, pen, 2, ids) == SF_OK, "op failed");
                    for (int i = 0; i < V; i++) ref[i] = (allow[i >> 5] >> (i & 31)) & 1u ? l[i] : -INFINITY;
                    sf_sample_row rr = r[0];
                    rr.allow = NULL;
                    const int32_t want = sf_cpu_sample_row(ref, V, &rr, pen, &sc, NULL);
                    sf_sample_row r1 = r[1];
                    const int32_t want1 = sf_cpu_sample_row(l + V, V, &r1, pen, &sc, NULL);
                    n++;
                    bad += ids[0] < 0 || ids[0] >= V || !((allow[ids[0] >> 5] >> (ids[0] & 31)) & 1u);
                    differ += ids[0] != want;
                    plain_differ += ids[1] != want1;
                }
    }
    CHECK_MSG(!bad, "%d of %d draws outside their mask", bad, n);
    CHECK_MSG(!differ, "%d of %d draws differ from the host path's -inf", differ, n);
    CHECK_MSG(!plain_differ, "%d of %d unmasked rows beside them differ", plain_differ, n);
    free(sc.x);
    free(sc.key);
    free(sc.mass);
}

/* The row's values after step 1 (bias, penalties, mask), by hand. */
static void step1_by_hand(const float *l, int V, const sf_sample_row *r, const sf_sample_pen *pen, double *x)
{
    for (int i = 0; i < V; i++) x[i] = r->allow && !((r->allow[i >> 5] >> (i & 31)) & 1u) ? -INFINITY : l[i];
    for (int j = 0; j < r->n_pen; j++) {
        const sf_sample_pen *e = &pen[r->pen_off + j];
        if (x[e->id] == -INFINITY) continue;
        float v = l[e->id] + e->bias;
        if (r->repetition_penalty != 1.0f && (e->count > 0 || e->in_prompt))
            v = v > 0 ? v / r->repetition_penalty : v * r->repetition_penalty;
        if (e->count > 0) v -= r->frequency_penalty * (float)e->count + r->presence_penalty;
        x[e->id] = v;
    }
}

/* Log-probabilities from the op (sf_sample_row.logprobs): the drawn id's and the top n against a
 * log-softmax and a full sort in doubles over the row after step 1, with penalties, a bias to
 * -inf, ties on the boundary (the lower id first), masks leaving fewer ids than asked for, every
 * kind of draw; rows without logprobs beside them untouched; and the host sampler (sf_sample,
 * the engine's path for steps drawn on the host) giving the same figures. */
TEST(logprobs_match_a_full_sort)
{
    enum { V = 3001, W = (V + 31) / 32 };
    static float l[2 * V], tmp[V];
    static double x[V];
    static uint32_t allow[W];
    static int32_t order[V];
    sf_rng g;
    sf_rng_seed(&g, 33);
    const sf_sample_pen pen[3] = { { 5, 2, 1, 1.5f }, { 2999, 0, 0, -INFINITY }, { 40, 1, 0, 0.0f } };
    int n = 0, bad_lp = 0, bad_top = 0, bad_n = 0, touched = 0, host_bad = 0;
    double worst = 0;
    for (int c = 0; c < 48; c++) {
        const int tied = c % 4 == 1, masked = c % 3 == 2, kind = c % 5, want = (int[]){ 0, 1, 5, 20 }[c / 4 % 4];
        for (int i = 0; i < 2 * V; i++) l[i] = tied ? (float)(int)(sf_rng_uniform(&g) * 4) : sf_rng_normal(&g) * 2.0f;
        memset(allow, 0, sizeof allow);
        for (int i = 0; masked && i < V; i++)
            if (sf_rng_uniform(&g) < (c % 2 ? 0.001f : 0.2f)) allow[i >> 5] |= 1u << (i & 31);
        allow[17 >> 5] |= 1u << 17;
        sf_sample_row r[2] = { row_default(), row_default() };
        r[0].temperature = kind == 0 ? 0 : 0.8f;
        r[0].top_k = kind == 2 ? 20 : 0;
        r[0].top_p = kind == 3 ? 0.7f : 1;
        r[0].min_p = kind == 4 ? 0.05f : 0;
        r[0].step = (uint64_t)c;
        r[0].n_pen = c % 2 ? 3 : 0;
        r[0].repetition_penalty = 1.2f;
        r[0].frequency_penalty = 0.5f;
        r[0].allow = masked ? allow : NULL;
        r[0].logprobs = 1 + want;
        sf_sample_lp lp[2];
        memset(lp, 0x5a, sizeof lp);
        int32_t ids[2] = { -1, -1 };
        REQUIRE(op_lp(l, 2, V, r, pen, 3, ids, lp) == SF_OK, "op failed");
        n++;
        sf_sample_lp poison;
        memset(&poison, 0x5a, sizeof poison);
        touched += memcmp(&lp[1], &poison, sizeof poison) != 0;
        step1_by_hand(l, V, &r[0], pen, x);
        double m = -INFINITY, s = 0;
        int nv = 0;
        for (int i = 0; i < V; i++) m = x[i] > m ? x[i] : m;
        for (int i = 0; i < V; i++) {
            if (x[i] == -INFINITY) continue;
            s += exp(x[i] - m);
            order[nv++] = i;
        }
        const double lse = m + log(s);
        for (int a = 1; a < nv; a++) { /* insertion sort: value descending, id ascending (stable) */
            const int32_t t = order[a];
            int b = a;
            while (b > 0 && x[order[b - 1]] < x[t]) order[b] = order[b - 1], b--;
            order[b] = t;
        }
        const double d = fabs(lp[0].lp - (x[ids[0]] - lse));
        worst = d > worst ? d : worst;
        bad_lp += !(d < 1e-5);
        bad_n += lp[0].n_top != (want < nv ? want : nv);
        for (int k = 0; k < lp[0].n_top && k < want; k++)
            bad_top += lp[0].top_id[k] != order[k] || !(fabs(lp[0].top_lp[k] - (x[order[k]] - lse)) < 1e-5);
        /* the host sampler on the same row */
        sf_sampling p;
        memset(&p, 0, sizeof p);
        p.temperature = r[0].temperature, p.top_k = r[0].top_k, p.top_p = r[0].top_p, p.min_p = r[0].min_p;
        p.logprobs = want ? want : -1;
        sf_sampler_seq ss;
        memset(&ss, 0, sizeof ss);
        ss.step = r[0].step, ss.seed = r[0].seed;
        for (int i = 0; i < V; i++) tmp[i] = (float)x[i];
        float hlp = 0;
        sf_logprob top[SF_MAX_LOGPROBS];
        int ntop = -1;
        const int32_t hid = sf_sample(&p, &ss, tmp, V, &hlp, top, &ntop);
        int hb = hid != ids[0] || hlp != lp[0].lp || ntop != (want ? lp[0].n_top : 0);
        for (int k = 0; k < ntop && !hb; k++) hb |= top[k].id != lp[0].top_id[k] || top[k].logprob != lp[0].top_lp[k];
        host_bad += hb;
    }
    printf("  %d rows: worst |logprob - the double-precision one| %.2g\n", n, worst);
    CHECK_MSG(!bad_lp, "%d of %d drawn ids' log-probabilities off", bad_lp, n);
    CHECK_MSG(!bad_n, "%d of %d rows with the wrong number of top entries", bad_n, n);
    CHECK_MSG(!bad_top, "%d top entries differ from the full sort", bad_top);
    CHECK_MSG(!touched, "%d rows without logprobs had theirs written", touched);
    CHECK_MSG(!host_bad, "%d of %d rows differ on the host sampler's path", host_bad, n);
}

TEST(rejects_bad_input)
{
    float l[8] = { 0 };
    int32_t id;
    sf_sample_row r = row_default();
    sf_sample_pen pen[1] = { { 8, 1, 0 } };
    r.n_pen = 1;
    CHECK(op(l, 1, 8, &r, pen, 1, &id) == SF_EINVAL);
    r.pen_off = 1;
    pen[0].id = 3;
    CHECK(op(l, 1, 8, &r, pen, 1, &id) == SF_EINVAL);
    r = row_default();
    sf_buf *buf = NULL;
    sf_error err = { 0 };
    REQUIRE(be->ops->buf_new(be, 1, 8, &buf, &err) == SF_OK, "%s", err.msg);
    REQUIRE(be->ops->write_f32(be, buf, 1, l) == SF_OK, "write"); /* a new buffer's contents are undefined */
    CHECK(be->ops->sample(be, buf, 1, 9, &r, NULL, 0, &id, NULL) == SF_EINVAL); /* more tokens than columns */
    CHECK(be->ops->sample(be, buf, 2, 8, &r, NULL, 0, &id, NULL) == SF_EINVAL); /* more rows than the buffer */
    uint32_t none = 0xffffff00u; /* ids 8.. only: none of the vocabulary's 8 */
    r.allow = &none;
    CHECK(be->ops->sample(be, buf, 1, 8, &r, NULL, 0, &id, NULL) == SF_EINVAL);
    none = 0x80u; /* id 7 alone */
    CHECK(be->ops->sample(be, buf, 1, 8, &r, NULL, 0, &id, NULL) == SF_OK && id == 7);
    sample_lp_case(be, buf, 8, r, 7);
    be->ops->buf_free(be, buf);
}

int main(void)
{
    sf_error err = { 0 };
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    if (sf_backend_open(&o, &be, &err)) {
        printf("FAIL: backend: %s\n", err.msg);
        return 1;
    }
    RUN(greedy_with_penalties_is_argmax);
    RUN(distributions_match_the_truncated_softmax);
    RUN(ties_on_the_boundary_are_cut_by_id);
    RUN(top_p_large_vocab_matches_full_sort);
    RUN(draw_equals_the_full_gumbel_argmax);
    RUN(deterministic_and_rows_independent);
    RUN(host_path_and_op_agree);
    RUN(allow_mask_draws_as_minus_inf);
    RUN(logprobs_match_a_full_sort);
    RUN(rejects_bad_input);
    sf_backend_close(be);
    return test_summary();
}
