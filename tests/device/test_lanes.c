/* test_lanes.c — steps split into two lanes on the CUDA backend (hal.h lanes_plan; lane 1 on its
 * own stream, overlapping lane 0 on the device) against the same steps run whole.
 *
 *   test_lanes                          the checks: a mixed prefill step and decode steps of 40
 *                                       sequences (captured, then replayed as graphs) give the
 *                                       whole steps' logits within bf16 tolerance; no device
 *                                       allocation in steady state
 *   SEMFLOW_LANES_TEST_TP=1 test_lanes  the same at tensor-parallel size 2 on 2 GPUs instead (ranks
 *                                       started from $SEMFLOW_BIN, default build/semflow): the
 *                                       lanes' all-reduces inside the step
 *   test_lanes --bench PRESET LAYERS BATCH CTX [STEPS]
 *                                       the layer benchmark: a dummy PRESET cut to LAYERS layers,
 *                                       BATCH sequences of CTX cached tokens, decode steps timed
 *                                       whole, split on one stream (the half-size GEMMs alone)
 *                                       and split on two streams (the overlap) with lane 1 starting
 *                                       at once, half a layer or a layer behind: median ms/step */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "../../engine/forward.h"
#include "../../engine/model.h"
#include "../../engine/tp.h"
#include "../../hal/hal.h"
#include "../test.h"

#define BS 16

/* A backend + forward pass over nseq sequences, each with its own run of KV blocks. */
typedef struct lrun {
    sf_backend *b;
    sf_forward *f;
    sf_tp *tp; /* tensor parallelism (NULL: one GPU) */
    int nseq, per, max_tokens;
    int32_t *bt, *len, *tok, *pos, *slot, *ss, *ctx, *rows;
} lrun;

/* lanes: "0" whole, "2" split on two streams, "serial" split on one stream. tp > 1: ranks of
 * the model at path (dummy weights with seed 5 when dummy), as m was loaded. */
static int lrun_open(lrun *r, const sf_model *m, const char *path, int dummy, int tp, const char *lanes, int nseq,
                     int max_ctx, int max_tokens, sf_error *err)
{
    memset(r, 0, sizeof *r);
    int serial = !strcmp(lanes, "serial");
    setenv("SEMFLOW_LANES", serial ? "2" : lanes, 1);
    setenv("SEMFLOW_LANES_MIN", "2", 1);
    if (serial) setenv("SEMFLOW_CUDA_LANES_SERIAL", "1", 1);
    sf_backend_opts o = { .name = "cuda" };
    int rc = sf_backend_open(&o, &r->b, err);
    r->nseq = nseq;
    r->per = (max_ctx + BS - 1) / BS;
    r->max_tokens = max_tokens;
    const sf_model_config *c = &m->cfg;
    sf_kv_config kc = { .n_layers = c->n_layers, .n_blocks = nseq * r->per, .block_size = BS,
                        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .dtype = SF_DT_BF16 };
    if (!rc && tp > 1) { /* the followers read the same switches from the environment */
        sf_tp_rank_opts to = { .size = tp, .model = path, .load_dummy = dummy, .seed = 5, .backend = "cuda",
                               .max_tokens = max_tokens, .max_logits = max_tokens, .shm_fd = -1 };
        const char *exe = getenv("SEMFLOW_BIN");
        rc = sf_tp_start(&to, exe ? exe : "build/semflow", m, r->b, &r->tp, err);
        if (!rc) {
            r->f = sf_tp_forward(r->tp);
            kc.n_kv_heads = sf_tp_kv_heads(r->tp);
            rc = sf_tp_kv_init(r->tp, &kc, err);
        }
    } else {
        if (!rc) rc = r->b->ops->kv_init(r->b, &kc, err);
        if (!rc) rc = sf_forward_new(r->b, m, max_tokens, max_tokens, &r->f, err);
    }
    unsetenv("SEMFLOW_LANES");
    unsetenv("SEMFLOW_LANES_MIN");
    unsetenv("SEMFLOW_CUDA_LANES_SERIAL");
    if (rc) return rc;
    r->bt = malloc(sizeof(int32_t) * (size_t)nseq * r->per);
    r->len = calloc((size_t)nseq, sizeof(int32_t));
    r->tok = malloc(sizeof(int32_t) * max_tokens);
    r->pos = malloc(sizeof(int32_t) * max_tokens);
    r->slot = malloc(sizeof(int32_t) * max_tokens);
    r->rows = malloc(sizeof(int32_t) * max_tokens);
    r->ss = malloc(sizeof(int32_t) * (nseq + 1));
    r->ctx = malloc(sizeof(int32_t) * nseq);
    if (!r->bt || !r->len || !r->tok || !r->pos || !r->slot || !r->rows || !r->ss || !r->ctx)
        return sf_err(err, SF_ENOMEM, "test: out of memory");
    for (int i = 0; i < nseq * r->per; i++) r->bt[i] = (int32_t)(((int64_t)i * 7919) % (nseq * r->per)); /* scattered */
    return SF_OK;
}

static void lrun_close(lrun *r)
{
    if (r->tp) sf_tp_free(r->tp); /* its forward pass with it */
    else sf_forward_free(r->f);
    sf_backend_close(r->b);
    free(r->bt); free(r->len); free(r->tok); free(r->pos); free(r->slot); free(r->rows); free(r->ss); free(r->ctx);
}

/* Sequences first .. first + n - 1 append cnt[i] tokens each (ids from their positions); logits
 * of every sequence's last token (all == 0) or of every token, into out (NULL: one row only). */
static int lrun_step(lrun *r, int first, int n, const int *cnt, int vocab, int all, float *out, sf_error *err)
{
    int T = 0, L = 0;
    r->ss[0] = 0;
    for (int i = 0; i < n; i++) {
        int s = first + i;
        if (T + cnt[i] > r->max_tokens || r->len[s] + cnt[i] > r->per * BS)
            return sf_err(err, SF_EINVAL, "test: step too large");
        for (int j = 0; j < cnt[i]; j++, T++) {
            int p = r->len[s] + j;
            r->tok[T] = (int32_t)(((unsigned)p * 2654435761u + (unsigned)s * 40503u) % (unsigned)vocab);
            r->pos[T] = p;
            r->slot[T] = r->bt[s * r->per + p / BS] * BS + p % BS;
            if (all || j == cnt[i] - 1) r->rows[L++] = T;
        }
        r->len[s] += cnt[i];
        r->ctx[i] = r->len[s];
        r->ss[i + 1] = T;
    }
    if (!out) L = 1;
    sf_batch b = { .n_tokens = T, .n_seqs = n, .tokens = r->tok, .pos = r->pos, .slot = r->slot, .seq_start = r->ss,
                   .seq_ctx = r->ctx, .block_table = r->bt + (size_t)first * r->per, .max_blocks = r->per,
                   .logit_rows = r->rows, .n_logits = L };
    static float one_row[1 << 18];
    if (!out && vocab > (int)SF_ARRAY_LEN(one_row)) return sf_err(err, SF_EINVAL, "test: vocabulary too large");
    float *dst = out ? out : one_row;
    return r->tp ? sf_tp_step(r->tp, &b, dst, err) : sf_forward_step(r->f, &b, dst, err);
}

static double rel(const float *a, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* 40 sequences: one mixed step (prompts of 1..13 tokens), then 6 decode steps of all of them
 * (the second is captured, the rest replay), then 3 decode steps of 33 (another split). */
static void compare_split(const char *path, int dummy, int layers, int tp, double tol)
{
    enum { NSEQ = 40 };
    sf_load_opts lo = { .dummy = dummy, .dummy_dtype = SF_DT_BF16, .seed = 5 };
    sf_model *m = NULL;
    sf_error err = { 0 };
    lrun w = { 0 }, l = { 0 };
    float *a = NULL, *b = NULL;
    if (sf_model_load(path, &lo, &m, &err)) {
        CHECK_MSG(0, "loading %s: %s", path, err.msg);
        return;
    }
    if (layers > 0 && layers < m->cfg.n_layers) m->cfg.n_layers = layers;
    int V = m->cfg.vocab_size, cnt[NSEQ], one[NSEQ];
    a = malloc(sizeof(float) * V * NSEQ);
    b = malloc(sizeof(float) * V * NSEQ);
    if (lrun_open(&w, m, path, dummy, tp, "0", NSEQ, 64, 512, &err) ||
        lrun_open(&l, m, path, dummy, tp, "2", NSEQ, 64, 512, &err)) {
        CHECK_MSG(0, "%s: opening: %s", path, err.msg);
        goto out;
    }
    for (int i = 0; i < NSEQ; i++) cnt[i] = 1 + (i * 5) % 13, one[i] = 1;
    double worst = 0;
    int agree = 0, total = 0;
    sf_backend_stats st0 = { 0 }, st1 = { 0 };
    for (int step = 0; step < 10; step++) {
        int n = step < 7 ? NSEQ : 33;
        const int *c = step ? one : cnt;
        if (step == 3) sf_backend_cuda_stats(l.b, &st0); /* steps 3..6: one shape, replayed */
        if (step == 7) sf_backend_cuda_stats(l.b, &st1);
        if (lrun_step(&w, 0, n, c, V, 0, a, &err) || lrun_step(&l, 0, n, c, V, 0, b, &err)) {
            CHECK_MSG(0, "%s: step %d: %s", path, step, err.msg);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            worst = fmax(worst, rel(b + (size_t)i * V, a + (size_t)i * V, V));
            agree += argmax(b + (size_t)i * V, V) == argmax(a + (size_t)i * V, V);
            total++;
        }
    }
    int steady_allocs = st1.n_device_allocs - st0.n_device_allocs;
    sf_backend_cuda_stats(l.b, &st1);
    printf("  %-24s TP=%d layers %2d: split vs whole worst rel err %.2e, argmax agrees %d/%d; lanes %ld steps, "
           "graphs %ld captured %ld replayed %ld fallbacks\n", m->name, tp, m->cfg.n_layers, worst, agree, total,
           sf_forward_lane_steps(l.f), st1.graphs_captured, st1.graph_replays, st1.graph_fallbacks);
    CHECK_MSG(worst < tol, "%s: split vs whole logits rel err %.3g (tolerance %.g)", path, worst, tol);
    CHECK_MSG(agree >= total * 9 / 10, "%s: argmax agrees on %d of %d rows", path, agree, total);
    CHECK_MSG(sf_forward_lane_steps(l.f) == 10, "%s: %ld of 10 steps ran in lanes", path, sf_forward_lane_steps(l.f));
    CHECK_MSG(st1.graph_replays > st0.graph_replays, "%s: no graph replays of split steps", path);
    CHECK_MSG(steady_allocs == 0, "%s: %d device allocations in steady state", path, steady_allocs);
out:
    lrun_close(&w);
    lrun_close(&l);
    sf_model_free(m);
    free(a);
    free(b);
}

TEST(stories260K_split) { compare_split(test_data("stories260K/stories260K.gguf"), 0, 0, 1, 2e-2); }
TEST(dummy_1b_split) { compare_split("preset:1b", 1, 4, 1, 3e-2); }
TEST(stories260K_tp2_split) { compare_split(test_data("stories260K/stories260K.gguf"), 0, 0, 2, 2e-2); }
TEST(dummy_1b_tp2_split) { compare_split("preset:1b", 1, 0, 2, 3e-2); }

static int cmp_d(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The layer benchmark (see the top). */
static int bench(const char *preset, int layers, int batch, int ctx, int steps)
{
    char path[128];
    snprintf(path, sizeof path, "preset:%s", preset);
    sf_load_opts lo = { .dummy = 1, .dummy_dtype = SF_DT_BF16, .seed = 5 };
    sf_model *m = NULL;
    sf_error err = { 0 };
    if (sf_model_load(path, &lo, &m, &err)) {
        fprintf(stderr, "test_lanes --bench: %s\n", err.msg);
        return 1;
    }
    if (layers > 0 && layers < m->cfg.n_layers) m->cfg.n_layers = layers;
    /* lanes mode and $SEMFLOW_LANES_STAGGER of each run */
    static const char *modes[] = { "0", "serial", "2", "2", "2" }, *stagger[] = { "1", "1", "0", "1", "2" };
    static const char *names[] = { "whole", "split-1stream", "2streams-stag0", "2streams-stag1", "2streams-stag2" };
    enum { NM = 5 };
    double med[NM] = { 0 };
    int V = m->cfg.vocab_size, chunk = SF_MAX(1, 2048 / ctx), rc = 0;
    int *cnt = malloc(sizeof(int) * batch), *one = malloc(sizeof(int) * batch);
    double *ms = malloc(sizeof(double) * steps);
    for (int i = 0; i < batch; i++) cnt[i] = ctx, one[i] = 1;
    if (!getenv("SEMFLOW_CUDA_GRAPH_TOKENS")) setenv("SEMFLOW_CUDA_GRAPH_TOKENS", "4096", 1); /* graphs at every batch */
    if (!getenv("SEMFLOW_LANES_MAX")) setenv("SEMFLOW_LANES_MAX", "4096", 1);
    for (int k = 0; k < NM && !rc; k++) {
        lrun r;
        setenv("SEMFLOW_LANES_STAGGER", stagger[k], 1);
        if ((rc = lrun_open(&r, m, path, 1, 1, modes[k], batch, ctx + steps + 8, SF_MAX(batch, chunk * ctx), &err))) break;
        for (int s0 = 0; s0 < batch && !rc; s0 += chunk) /* prefill, chunk sequences a step */
            rc = lrun_step(&r, s0, SF_MIN(chunk, batch - s0), cnt, V, 0, NULL, &err);
        for (int i = 0; i < 3 && !rc; i++) rc = lrun_step(&r, 0, batch, one, V, 0, NULL, &err); /* warm: capture */
        for (int i = 0; i < steps && !rc; i++) {
            double t0 = sf_now_s();
            rc = lrun_step(&r, 0, batch, one, V, 0, NULL, &err);
            ms[i] = (sf_now_s() - t0) * 1e3;
        }
        if (!rc) {
            qsort(ms, (size_t)steps, sizeof *ms, cmp_d);
            med[k] = ms[steps / 2];
        }
        lrun_close(&r);
    }
    unsetenv("SEMFLOW_LANES_STAGGER");
    if (rc) fprintf(stderr, "test_lanes --bench: %s\n", err.msg);
    else {
        printf("lanes bench: %s, %d layers, %d sequences x %d keys, median of %d decode steps (ms/step, one logit row)\n",
               preset, m->cfg.n_layers, batch, ctx, steps);
        for (int k = 0; k < NM; k++)
            printf("  %-16s %8.3f ms  %.3fx of whole  (%.1f us/layer)\n", names[k], med[k], med[k] / med[0],
                   1e3 * med[k] / m->cfg.n_layers);
        printf("LANES_BENCH preset=%s layers=%d batch=%d ctx=%d whole=%.4f serial=%.4f stag0=%.4f stag1=%.4f "
               "stag2=%.4f\n", preset, m->cfg.n_layers, batch, ctx, med[0], med[1], med[2], med[3], med[4]);
    }
    free(cnt);
    free(one);
    free(ms);
    sf_model_free(m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 6 && !strcmp(argv[1], "--bench"))
        return bench(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), argc > 6 ? atoi(argv[6]) : 30);
    if (argc > 1) {
        fprintf(stderr, "usage: test_lanes [--bench PRESET LAYERS BATCH CTX [STEPS]]\n");
        return 2;
    }
    if (!sf_hal_cuda_available()) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    int n_gpus = 0;
    if (cudaGetDeviceCount(&n_gpus) != cudaSuccess) n_gpus = 0;
    if (!getenv("SEMFLOW_LANES_TEST_TP")) {
        RUN(stories260K_split);
        RUN(dummy_1b_split);
    } else if (n_gpus >= 2) { /* SEMFLOW_LANES_TEST_TP=1: the TP=2 set alone (mbatch2.sh, on both GPUs) */
        RUN(stories260K_tp2_split);
        RUN(dummy_1b_tp2_split);
    } else {
        printf("      TP=2 set not run: %d GPU(s)\n", n_gpus);
    }
    return test_summary();
}
