/* test_sample.c — the CUDA sample op against the CPU reference (kernels/cpu/sample.c through
 * the CPU backend's op) on the same bf16 logits: fresh random rows every run (the seed is
 * printed), vocabularies 512 .. 152064 (odd sizes too), batches of 1 .. 96 rows, every sampling
 * option and penalties, rows with heavy ties, few-row calls (rows cut over several blocks), rows
 * with allow masks (never an id outside them), rows asking for logprobs (the drawn id's and the
 * top 1 .. 20, within 1e-4 of the CPU's, the top ids exact).
 * Greedy rows must agree exactly; drawn rows agree except where expf/logf of the two machines
 * differ in the last place right at a boundary (at most 1 in 100 is allowed, and the count is
 * printed). Also: the same call twice gives the same ids, ids are always in range, a bad
 * penalty id is refused, and --perf times the op by batch size. And the score op (prompt
 * logprobs) against the CPU backend's.
 *
 *   test_sample          the checks (GPU host only)
 *   test_sample --perf   also the timing table (no assertions)
 *   test_sample --quick  fewer and smaller cases, each kind of launch once (under
 *                        compute-sanitizer: tools/cuda_device_run.sh sanitize)
 *   SF_TEST_TRACE=1      prints each case before it runs (to place a sanitizer's report) */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../hal/hal.h"
#include "../lib/sample_lp_case.h"
#include "../test.h"

static sf_backend *G, *C;
static sf_rng R;
static int perf, quick;

static float bfr(float x) { return sf_bf16_to_f32(sf_f32_to_bf16(x)); }

/* Both backends' op on the same rows; 0 or the first failing status. */
static int both_lp(const float *l, int n, int V, const sf_sample_row *rows, const sf_sample_pen *pen, int n_pen,
                   int32_t *gpu, int32_t *cpu, sf_sample_lp *glp, sf_sample_lp *clp)
{
    sf_buf *bg = NULL, *bc = NULL;
    sf_error err = { 0 };
    int rc = G->ops->buf_new(G, n, V, &bg, &err);
    if (!rc) rc = C->ops->buf_new(C, n, V, &bc, &err);
    if (!rc) rc = G->ops->write_f32(G, bg, n, l);
    if (!rc) rc = C->ops->write_f32(C, bc, n, l);
    for (int i = 0; i < n; i++) gpu[i] = cpu[i] = -7; /* poisoned */
    if (!rc) rc = G->ops->sample(G, bg, n, V, rows, pen, n_pen, gpu, glp);
    if (!rc) rc = C->ops->sample(C, bc, n, V, rows, pen, n_pen, cpu, clp);
    if (rc && err.msg[0]) printf("  %s\n", err.msg);
    if (bg) G->ops->buf_free(G, bg);
    if (bc) C->ops->buf_free(C, bc);
    return rc;
}

/* A random row configuration; kind cycles through the options. */
static sf_sample_row random_row(int kind, int V)
{
    sf_sample_row r = { .temperature = 0.5f + 1.5f * sf_rng_uniform(&R), .top_p = 1, .repetition_penalty = 1,
                        .seed = sf_rng_next(&R), .step = sf_rng_next(&R) % 5000 };
    switch (kind % 9) {
    case 0: r.temperature = 0; break;
    case 1: break;
    case 2: r.top_k = 1 + (int)(sf_rng_next(&R) % 100); break;
    case 3: r.top_p = 0.5f + 0.49f * sf_rng_uniform(&R); break;
    case 4: r.min_p = 0.01f + 0.2f * sf_rng_uniform(&R); break;
    case 5: r.top_k = 40; r.top_p = 0.9f; r.min_p = 0.05f; break;
    case 6: r.top_k = V > 2000 ? 1024 : V / 2; r.top_p = 0.95f; break; /* the gathered set at its largest */
    case 7: r.top_k = 1; break;
    case 8: r.top_k = V > 6000 ? 3000 : V / 3; r.top_p = 0.9f; break; /* beyond the kernel's gathered set */
    }
    return r;
}

static int total_rows, total_drawn, mismatched_drawn;

static int total_masked, total_lp, lp_checked;
static double lp_worst;

/* n rows of V random logits (tied: in 6 values) with random configurations, penalties on most
 * rows (with_pen), allow masks on two rows in three (masked: one id, 1%, 30% or 90% of them). */
static void one_case_m(int V, int n, int with_pen, int tied, int masked)
{
    if (getenv("SF_TEST_TRACE")) printf("case: vocab %d, %d rows, pen %d, tied %d, masked %d\n", V, n, with_pen, tied, masked);
    const int words = (V + 31) / 32;
    uint32_t *masks = masked ? calloc((size_t)n * words, 4) : NULL;
    float *l = malloc(sizeof(float) * (size_t)n * V);
    sf_sample_row *rows = malloc(sizeof *rows * (size_t)n);
    int32_t *g = malloc(4 * (size_t)n), *c = malloc(4 * (size_t)n), *g2 = malloc(4 * (size_t)n);
    sf_sample_lp *glp = malloc(sizeof *glp * (size_t)n), *clp = malloc(sizeof *clp * (size_t)n);
    int cap = with_pen ? n * 64 : 1, n_pen = 0;
    sf_sample_pen *pen = malloc(sizeof *pen * (size_t)cap);
    float scale = 1 + 3 * sf_rng_uniform(&R);
    for (int64_t i = 0; i < (int64_t)n * V; i++)
        l[i] = tied ? (float)(int)(sf_rng_uniform(&R) * 6) : bfr(sf_rng_normal(&R) * scale);
    for (int i = 0; i < n; i++) {
        rows[i] = random_row(i + (int)(sf_rng_next(&R) % 9), V);
        static const int lps[] = { 0, 1, 2, 6, 21 }; /* none, the id's alone, top 1, 5, 20 */
        rows[i].logprobs = lps[sf_rng_next(&R) % 5];
        if (with_pen && i % 4 != 3) { /* distinct ids, a few repeated outputs, some from the prompt;
                                        * logit_bias on some (row 1 of 4: with no penalty) */
            const int pens = i % 4 != 1, biased = i % 4 != 0;
            if (pens) {
                rows[i].repetition_penalty = 1.0f + sf_rng_uniform(&R);
                rows[i].presence_penalty = sf_rng_uniform(&R);
                rows[i].frequency_penalty = sf_rng_uniform(&R) - 0.2f;
            }
            rows[i].pen_off = n_pen;
            int k = 1 + (int)(sf_rng_next(&R) % SF_MIN(64, V / 4));
            for (int j = 0; j < k; j++) {
                const int32_t count = pens ? (int32_t)(sf_rng_next(&R) % 4) : 0, in_prompt = pens && sf_rng_next(&R) % 2;
                /* -inf: min_tokens keeps the row's stop ids out so */
                const float bias = !biased || !(sf_rng_next(&R) % 3) ? 0
                                   : sf_rng_next(&R) % 8 ? bfr(sf_rng_uniform(&R) * 20 - 10) : -INFINITY;
                pen[n_pen + j] = (sf_sample_pen){ (int32_t)((j * 7919 + i) % V), count, in_prompt, bias };
            }
            /* the top of the row among them, so the penalty (or a bias of -100) decides */
            int top = 0;
            for (int t = 1; t < V; t++) if (l[(size_t)i * V + t] > l[(size_t)i * V + top]) top = t;
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= pen[n_pen + j].id == top;
            if (!dup) pen[n_pen + k++] = (sf_sample_pen){ top, pens, pens, biased ? -100.0f : 0.0f };
            rows[i].n_pen = k;
            n_pen += k;
        }
        if (masks && i % 3 != 2) {
            static const float dens[] = { 0, 0.01f, 0.3f, 0.9f };
            uint32_t *m = masks + (size_t)i * words;
            const float d = dens[(i / 3 + (int)(sf_rng_next(&R) % 4)) % 4];
            for (int t = 0; t < V; t++)
                if (sf_rng_uniform(&R) < d) m[t >> 5] |= 1u << (t & 31);
            const int one = (int)(sf_rng_next(&R) % (uint64_t)V); /* at least one */
            m[one >> 5] |= 1u << (one & 31);
            rows[i].allow = m;
        }
    }
    int rc = both_lp(l, n, V, rows, pen, n_pen, g, c, glp, clp);
    CHECK_MSG(rc == SF_OK, "vocab %d, %d rows: status %d", V, n, rc);
    if (rc == SF_OK) {
        int greedy_bad = 0, drawn_bad = 0, drawn = 0, range_bad = 0, mask_bad = 0, lp_bad = 0;
        for (int i = 0; i < n; i++) {
            if (rows[i].logprobs) { /* the top entries whatever was drawn; the id's own where both drew it */
                const sf_sample_lp *a = &glp[i], *b = &clp[i];
                int bad = a->n_top != b->n_top;
                for (int k = 0; k < a->n_top && !bad; k++) {
                    const double d = fabs((double)a->top_lp[k] - b->top_lp[k]);
                    lp_worst = d > lp_worst ? d : lp_worst;
                    bad |= a->top_id[k] != b->top_id[k] || !(d < 1e-4);
                }
                if (g[i] == c[i]) {
                    const double d = a->lp == b->lp ? 0 : fabs((double)a->lp - b->lp);
                    lp_worst = d > lp_worst ? d : lp_worst;
                    bad |= !(d < 1e-4);
                    lp_checked++;
                }
                if (bad && lp_bad < 3)
                    printf("  vocab %d row %d (logprobs %d, ids %d / %d): lp %.6f / %.6f, %d / %d top, first %d %.6f / %d %.6f\n",
                           V, i, rows[i].logprobs, g[i], c[i], a->lp, b->lp, a->n_top, b->n_top,
                           a->n_top ? a->top_id[0] : -1, a->n_top ? a->top_lp[0] : 0, b->n_top ? b->top_id[0] : -1,
                           b->n_top ? b->top_lp[0] : 0);
                lp_bad += bad;
                total_lp++;
            }
            range_bad += g[i] < 0 || g[i] >= V;
            if (rows[i].allow && g[i] >= 0 && g[i] < V) {
                mask_bad += !((rows[i].allow[g[i] >> 5] >> (g[i] & 31)) & 1u);
                total_masked++;
            }
            if (rows[i].temperature <= 0 || rows[i].top_k == 1) greedy_bad += g[i] != c[i];
            else { drawn++; drawn_bad += g[i] != c[i]; }
        }
        CHECK_MSG(range_bad == 0, "vocab %d, %d rows: %d ids out of range", V, n, range_bad);
        CHECK_MSG(lp_bad == 0, "vocab %d, %d rows: %d rows' log-probabilities differ from the CPU's", V, n, lp_bad);
        CHECK_MSG(mask_bad == 0, "vocab %d, %d rows: %d ids outside their row's allow mask", V, n, mask_bad);
        CHECK_MSG(greedy_bad == 0, "vocab %d, %d rows%s%s: %d greedy rows differ from the CPU", V, n,
                  with_pen ? ", penalties" : "", tied ? ", ties" : "", greedy_bad);
        total_rows += n;
        total_drawn += drawn;
        mismatched_drawn += drawn_bad;
        /* the same call again: the same ids */
        rc = both_lp(l, n, V, rows, pen, n_pen, g2, c, glp, clp);
        CHECK_MSG(rc == SF_OK && !memcmp(g, g2, 4 * (size_t)n), "vocab %d, %d rows: a second run differs", V, n);
    }
    free(l); free(rows); free(g); free(c); free(g2); free(pen); free(masks); free(glp); free(clp);
}

static void one_case(int V, int n, int with_pen, int tied) { one_case_m(V, n, with_pen, tied, 0); }

TEST(matches_cpu_reference)
{
    static const int vocabs[] = { 512, 1001, 3000, 32000, 32001, 128256, 152064 }; /* odd ones: rows not 16-byte aligned, a short last load */
    static const int batch[] = { 1, 7, 33, 96 };
    for (size_t v = 0; v < SF_ARRAY_LEN(vocabs); v++)
        for (size_t b = 0; b < SF_ARRAY_LEN(batch); b++) {
            if (vocabs[v] > 100000 && batch[b] > 33) continue; /* keeps the CPU side of the test short */
            if (quick && (b > 1 || v % 2)) continue;
            one_case(vocabs[v], batch[b], (int)(b % 2), 0);
        }
    one_case(32000, 16, 1, 1);
    one_case(600, 40, 0, 1);
    /* a few rows: rows cut over several blocks (greedy, temperature, top-k; penalties on half) */
    for (int it = 0; it < (quick ? 4 : 24); it++) one_case(it % 2 ? 128256 : 32000, 1 + it % 8, it % 4 >= 2, it % 3 == 0);
    /* rows with allow masks (requests held to a form), whole and cut over blocks, odd vocabularies */
    static const int mv[] = { 1001, 32000, 32001, 128256 };
    for (int it = 0; it < 16; it++)
        if (!quick || it == 3 || it == 5 || it == 8 || it == 10) one_case_m(mv[it % 4], it < 8 ? 1 + it : 24 + it, it % 2, it == 5, 1);
    printf("  %d rows (%d with allow masks), %d drawn at random: %d differ from the CPU reference\n", total_rows,
           total_masked, total_drawn, mismatched_drawn);
    printf("  %d rows with logprobs (%d drawn ids' compared): worst |GPU - CPU| %.2g\n", total_lp, lp_checked, lp_worst);
    CHECK_MSG(mismatched_drawn * 100 <= total_drawn, "%d of %d drawn rows differ", mismatched_drawn, total_drawn);
}

/* The draw's distribution on the device: 4000 steps of one row against the exact softmax. */
TEST(distribution)
{
    enum { V = 8 };
    float l[V] = { 2, 1.5f, 1, 0.5f, 0, -1, -2, -INFINITY };
    sf_buf *bg = NULL;
    sf_error err = { 0 };
    REQUIRE(G->ops->buf_new(G, 4000, V, &bg, &err) == SF_OK, "%s", err.msg);
    float *rep = malloc(sizeof(float) * 4000 * V);
    sf_sample_row *rows = malloc(sizeof *rows * 4000);
    int32_t *ids = malloc(4 * 4000);
    for (int i = 0; i < 4000; i++) {
        memcpy(rep + (size_t)i * V, l, sizeof l);
        rows[i] = (sf_sample_row){ .temperature = 1, .top_p = 1, .repetition_penalty = 1, .seed = 9, .step = (uint64_t)i };
    }
    REQUIRE(G->ops->write_f32(G, bg, 4000, rep) == SF_OK, "write");
    REQUIRE(G->ops->sample(G, bg, 4000, V, rows, NULL, 0, ids, NULL) == SF_OK, "sample");
    double z = 0, f[V] = { 0 };
    for (int i = 0; i < V - 1; i++) z += exp(l[i]);
    for (int i = 0; i < 4000; i++) f[ids[i]] += 1.0 / 4000;
    for (int i = 0; i < V - 1; i++) {
        double p = exp(l[i]) / z, sd = sqrt(p * (1 - p) / 4000);
        CHECK_MSG(fabs(f[i] - p) < 5 * sd + 1e-3, "token %d: %.4f drawn, %.4f expected", i, f[i], p);
    }
    CHECK_MSG(f[V - 1] == 0, "-inf drawn %.4f", f[V - 1]);
    G->ops->buf_free(G, bg);
    free(rep); free(rows); free(ids);
}

TEST(bad_inputs)
{
    float l[16] = { 0 };
    sf_buf *bg = NULL;
    sf_error err = { 0 };
    int32_t id;
    REQUIRE(G->ops->buf_new(G, 1, 16, &bg, &err) == SF_OK, "%s", err.msg);
    G->ops->write_f32(G, bg, 1, l);
    sf_sample_row r = { .temperature = 1, .top_p = 1, .repetition_penalty = 1, .n_pen = 1 };
    sf_sample_pen pen[1] = { { 16, 1, 0 } };
    CHECK(G->ops->sample(G, bg, 1, 16, &r, pen, 1, &id, NULL) == SF_EINVAL);
    CHECK(G->ops->sample(G, bg, 1, 17, &r, NULL, 0, &id, NULL) == SF_EINVAL);
    r.n_pen = 0;
    CHECK(G->ops->sample(G, bg, 1, 16, &r, NULL, 0, &id, NULL) == SF_OK && id >= 0 && id < 16);
    uint32_t allow = 0xffff0000u; /* ids 16.. only: none of the vocabulary's */
    r.allow = &allow;
    CHECK(G->ops->sample(G, bg, 1, 16, &r, NULL, 0, &id, NULL) == SF_EINVAL);
    allow = 1u << 9;
    CHECK(G->ops->sample(G, bg, 1, 16, &r, NULL, 0, &id, NULL) == SF_OK && id == 9);
    sample_lp_case(G, bg, 16, r, 9);
    G->ops->buf_free(G, bg);
}

/* The score op (prompt logprobs) against the CPU backend's on the same bf16 rows: ranks and top
 * ids exactly (ties broken by id in both), log-probabilities within 1e-4; rows past the first
 * chunk of the op's pinned memory (6000+ at k = 20); a bad target refused. Also times it. */
TEST(score_matches_cpu_reference)
{
    static const int vocabs[] = { 1000, 32000, 128256 }, ns[] = { 6500, 257, 512 }, ks[] = { 20, 5, 0 };
    int cases = 0, bad = 0;
    double worst = 0;
    for (size_t vi = 0; vi < SF_ARRAY_LEN(vocabs); vi++) {
        const int V = vocabs[vi], n = quick ? 9 : ns[vi], k = ks[vi], row0 = 2;
        float *l = malloc(sizeof(float) * (size_t)(n + row0) * V);
        for (int64_t i = 0; i < (int64_t)(n + row0) * V; i++) /* every fourth row in 8 values: heavy ties */
            l[i] = (i / V) % 4 == 3 ? (float)(sf_rng_next(&R) % 8) : bfr(sf_rng_normal(&R) * 3);
        int32_t *tg = malloc(sizeof(int32_t) * n), *rk[2], *tid[2];
        float *lp[2], *tlp[2];
        for (int i = 0; i < n; i++) tg[i] = (int32_t)(sf_rng_next(&R) % (uint64_t)V);
        sf_backend *be[2] = { G, C };
        sf_buf *bf[2] = { NULL, NULL };
        sf_error err = { 0 };
        int rc = 0;
        for (int b = 0; b < 2; b++) {
            rk[b] = malloc(sizeof(int32_t) * n);
            lp[b] = malloc(sizeof(float) * n);
            tid[b] = malloc(sizeof(int32_t) * ((size_t)n * k + 1));
            tlp[b] = malloc(sizeof(float) * ((size_t)n * k + 1));
            for (int i = 0; i < n; i++) lp[b][i] = NAN, rk[b][i] = -7; /* poisoned */
            if (!rc) rc = be[b]->ops->buf_new(be[b], n + row0, V, &bf[b], &err);
            if (!rc) rc = be[b]->ops->write_f32(be[b], bf[b], n + row0, l);
            double t0 = sf_now_s();
            if (!rc) rc = be[b]->ops->score(be[b], bf[b], row0, n, V, tg, k, lp[b], rk[b], tid[b], tlp[b]);
            printf("  score: %d rows of %d, top %d: %s op %.2f ms\n", n, V, k, b ? "CPU" : "GPU", (sf_now_s() - t0) * 1e3);
        }
        CHECK_MSG(rc == 0, "score op: %s", err.msg);
        for (int i = 0; i < n && !rc; i++) {
            double d = fabs((double)lp[0][i] - lp[1][i]);
            int same = rk[0][i] == rk[1][i] && d < 1e-4;
            for (int j = 0; j < k; j++)
                same &= tid[0][(size_t)i * k + j] == tid[1][(size_t)i * k + j] &&
                        fabs((double)tlp[0][(size_t)i * k + j] - tlp[1][(size_t)i * k + j]) < 1e-4;
            worst = d > worst ? d : worst;
            bad += !same;
            cases++;
        }
        for (int b = 0; b < 2; b++) {
            if (bf[b]) be[b]->ops->buf_free(be[b], bf[b]);
            free(rk[b]), free(lp[b]), free(tid[b]), free(tlp[b]);
        }
        free(l);
        free(tg);
    }
    printf("  score: %d rows, %d differ from the CPU op, worst |logprob difference| %.2e\n", cases, bad, worst);
    CHECK_MSG(cases > (quick ? 20 : 6000) && bad == 0, "%d of %d rows differ", bad, cases);
    float l[16] = { 0 }, lp1;
    int32_t t = 16, r1;
    sf_buf *bg = NULL;
    sf_error err = { 0 };
    REQUIRE(G->ops->buf_new(G, 1, 16, &bg, &err) == SF_OK, "%s", err.msg);
    G->ops->write_f32(G, bg, 1, l);
    CHECK(G->ops->score(G, bg, 0, 1, 16, &t, 0, &lp1, &r1, NULL, NULL) == SF_EINVAL);
    t = 3;
    CHECK(G->ops->score(G, bg, 0, 1, 16, &t, 0, &lp1, &r1, NULL, NULL) == SF_OK && r1 == 1 &&
          fabsf(lp1 + logf(16)) < 1e-5f);
    G->ops->buf_free(G, bg);
}

static void perf_table(void)
{
    enum { V = 128256 };
    static const int batch[] = { 1, 8, 64, 256 };
    /* llama.cpp's defaults: top-k 40, top-p 0.95, min-p 0.05, repeat 1.1; the last three kinds are
     * the temperature row's with an allow mask of half the vocabulary (a form), with logprobs
     * (the drawn id's and the top 5), with the top 20 */
    static const char *kinds[] = { "greedy", "temperature", "top-k 50 + top-p 0.9", "top-p 0.95 + penalties",
                                   "llama.cpp's defaults", "temperature + mask", "temperature + logprobs 5",
                                   "temperature + logprobs 20" };
    enum { KINDS = SF_ARRAY_LEN(kinds) };
    static uint32_t half[(V + 31) / 32];
    for (int w = 0; w < (V + 31) / 32; w++) half[w] = 0x55555555u;
    printf("perf: sample op (upload rows, kernel, ids back), vocab %d, us per call (median of 20)\n", V);
    printf("  %-24s %8s %8s %8s %8s\n", "rows", "1", "8", "64", "256");
    float *l = malloc(sizeof(float) * 256 * V);
    for (int64_t i = 0; i < 256LL * V; i++) l[i] = bfr(sf_rng_normal(&R) * 2);
    sf_buf *bg = NULL;
    sf_error err = { 0 };
    if (G->ops->buf_new(G, 256, V, &bg, &err) || G->ops->write_f32(G, bg, 256, l)) { free(l); return; }
    sf_sample_row rows[256];
    sf_sample_pen pen[256 * 32];
    int32_t ids[256];
    static sf_sample_lp lp[256];
    for (int k = 0; k < KINDS; k++) {
        printf("  %-24s", kinds[k]);
        for (size_t b = 0; b < SF_ARRAY_LEN(batch); b++) {
            int n_pen = 0;
            for (int i = 0; i < batch[b]; i++) {
                const int plain = k == 1 || k >= 5;
                rows[i] = (sf_sample_row){ .temperature = k ? 0.8f : 0, .top_p = k >= 2 && !plain ? (k == 2 ? 0.9f : 0.95f) : 1,
                                           .top_k = k == 2 ? 50 : k == 4 ? 40 : 0, .min_p = k == 4 ? 0.05f : 0,
                                           .repetition_penalty = k == 3 || k == 4 ? 1.1f : 1, .seed = (uint64_t)i,
                                           .step = 3, .allow = k == 5 ? half : NULL,
                                           .logprobs = k == 6 ? 6 : k == 7 ? 21 : 0 };
                if (k == 3 || k == 4) {
                    rows[i].pen_off = n_pen;
                    rows[i].n_pen = 32;
                    for (int j = 0; j < 32; j++) pen[n_pen++] = (sf_sample_pen){ j * 1000 + i, 1, 1 };
                }
            }
            double t[20];
            for (int it = 0; it < 20; it++) {
                double t0 = sf_now_s();
                G->ops->sample(G, bg, batch[b], V, rows, pen, n_pen, ids, lp);
                t[it] = (sf_now_s() - t0) * 1e6;
            }
            for (int i = 0; i < 20; i++) for (int j = i + 1; j < 20; j++) if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
            printf(" %8.0f", t[10]);
        }
        printf("\n");
    }
    G->ops->buf_free(G, bg);
    free(l);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--perf")) perf = 1;
        else if (!strcmp(argv[i], "--quick")) quick = 1;
    sf_rng_seed(&R, (uint64_t)sf_now_ns()); /* fresh inputs every run; the seed is printed */
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    sf_backend_opts go = { .name = "cuda" }, co = { .name = "cpu" };
    sf_error err = { 0 };
    if (sf_backend_cuda_new(&go, &G, &err)) {
        printf("FAIL: open_cuda_backend: %s\n", err.msg);
        return 1;
    }
    if (sf_backend_cpu_new(&co, &C, &err)) {
        printf("FAIL: open_cpu_backend: %s\n", err.msg);
        return 1;
    }
    RUN(matches_cpu_reference);
    RUN(distribution);
    RUN(bad_inputs);
    RUN(score_matches_cpu_reference);
    if (perf) perf_table();
    G->ops->destroy(G);
    C->ops->destroy(C);
    return test_summary();
}
