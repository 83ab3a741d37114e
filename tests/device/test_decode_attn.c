/* test_decode_attn.c — decode attention (one query token per sequence over the paged KV cache)
 * against a float64 host reference: both kernels of attention_decode*.cu (the 8-warp CUDA-core
 * "lanes" kernel, the tensor-core "mma" kernel in each configuration), batches of 1..256
 * sequences with ragged contexts of 1..8192 keys, GQA 32/8, 28/4, 64/8 (head 128) and 8/2
 * (head 64), bf16 blocks, INT8 blocks and sequences mixing both, shuffled block tables, with and
 * without key splits (up to 33, past the cluster), their pieces combined through the workspace or
 * in a thread-block cluster (the lanes kernel's and the one-token tensor-core instance's, where
 * the device holds the clusters). Outputs are poisoned (NaN) before each run;
 * the check is ||out - ref|| / ||ref|| <= 1e-2 per case with NaN never passing, and every split
 * counter back at zero after the launch.
 *
 *   test_decode_attn           the checks (GPU host only)
 *   test_decode_attn --quick   the checks on six short cases, one per kind of launch (groups of
 *                              4, 7 and 8 heads, head 64, INT8, a batch), for compute-sanitizer
 *   test_decode_attn --perf    instead, time both kernels on the batch and batch-1 shapes of
 *                              Llama-3-8B (32/8 heads of 128, block 16), bf16 and INT8, and print
 *                              each as a share of hal's measured HBM bandwidth (no assertions);
 *                              a cache under four times L2 is read from rotating copies of it,
 *                              so the keys come from HBM as in a step
 *   test_decode_attn --perf TxCTX [PATH]
 *                              one shape (bf16) and one path only (e.g. 1x4120 plan-b1): for a
 *                              profiler's kernel filter */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../hal/hal.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cuda/kernels.h"

static sf_rng R;
/* the mma kernel's configurations (kernels.h: warps x 10 + ring depth) */
static const int CFGS[] = { 42, 43, 23, 24, 143, 144, 145, 183 };
static int perf, quick;
static int perf_T, perf_ctx;        /* --perf TxCTX: that shape only */
static const char *perf_path;       /* --perf TxCTX PATH: that path only */
static double hbm_gbs = 0;
static int sms = 132;

/* A fast uniform value of unit variance, as bf16 (the cache of a 256-sequence case holds tens of
 * millions of values). */
static uint16_t rand_bf16(void)
{
    static uint64_t bits;
    static int left;
    if (!left) { bits = sf_rng_next(&R); left = 4; }
    int u = (int)(bits & 0xFFFF) - 32768;
    bits >>= 16;
    left--;
    return sf_f32_to_bf16((float)u * (1.7320508f / 32768.0f));
}

/* ---- one case: T sequences (one query token each) ------------------------------------------ */
typedef struct dcase {
    int T, H, Hkv, hd, bs;
    int ctx_min, ctx_max; /* contexts drawn uniformly from [min, max] per sequence */
    int i8_pct;           /* share of blocks stored as INT8 (0, 100, or mixed) */
    float q_scale;        /* larger: peakier softmax */
} dcase;

typedef struct dhost {
    int n_blocks, max_blocks, i8_base;
    int *ctx, *bt;            /* [T], [T][max_blocks] */
    uint16_t *k, *v, *q;      /* cache as n_blocks full bf16 blocks (INT8 units inside), q [T][H*hd] */
    float *ks, *vs;           /* INT8 scales: [2 * n_blocks][Hkv][bs] */
    double *ref;              /* [T][H][hd] */
} dhost;

/* Row of key p of sequence t, kv head h as the kernel must see it (INT8: q * scale), into r. */
static void key_row(const dcase *c, const dhost *x, const uint16_t *kc, const float *sc, int t, int h, int p, double *r)
{
    int id = x->bt[t * x->max_blocks + p / c->bs], off = p % c->bs;
    if (id >= x->i8_base) {
        int64_t row = ((int64_t)(id - x->i8_base) * c->Hkv + h) * c->bs + off;
        const int8_t *k8 = (const int8_t *)kc + row * c->hd;
        for (int d = 0; d < c->hd; d++) r[d] = (double)k8[d] * sc[row];
    } else {
        const uint16_t *kb = kc + (((int64_t)id * c->Hkv + h) * c->bs + off) * c->hd;
        for (int d = 0; d < c->hd; d++) r[d] = sf_bf16_to_f32(kb[d]);
    }
}

static void make_case(const dcase *c, dhost *x)
{
    const int T = c->T, hd = c->hd, Hkv = c->Hkv, bs = c->bs;
    x->ctx = malloc(T * sizeof(int));
    int total = 0, maxb = 1;
    for (int t = 0; t < T; t++) {
        x->ctx[t] = c->ctx_min + (int)(sf_rng_uniform(&R) * (c->ctx_max - c->ctx_min + 1));
        if (x->ctx[t] > c->ctx_max) x->ctx[t] = c->ctx_max;
        int nb = (x->ctx[t] + bs - 1) / bs;
        total += nb;
        maxb = nb > maxb ? nb : maxb;
    }
    x->max_blocks = maxb;
    x->n_blocks = total + 3;
    x->i8_base = x->n_blocks;
    int64_t blk_elems = (int64_t)Hkv * bs * hd;
    x->k = malloc((size_t)x->n_blocks * blk_elems * 2);
    x->v = malloc((size_t)x->n_blocks * blk_elems * 2);
    x->ks = malloc((size_t)2 * x->n_blocks * Hkv * bs * sizeof(float));
    x->vs = malloc((size_t)2 * x->n_blocks * Hkv * bs * sizeof(float));
    for (int64_t i = 0; i < (int64_t)x->n_blocks * blk_elems; i++) {
        x->k[i] = rand_bf16();
        x->v[i] = rand_bf16();
    }
    for (int64_t i = 0; i < (int64_t)2 * x->n_blocks * Hkv * bs; i++) {
        x->ks[i] = 0.004f + 0.012f * sf_rng_uniform(&R);
        x->vs[i] = 0.004f + 0.012f * sf_rng_uniform(&R);
    }
    /* a shuffled pool of full blocks; an INT8 block takes one half of a full block */
    int *perm = malloc(x->n_blocks * sizeof(int));
    for (int i = 0; i < x->n_blocks; i++) perm[i] = i;
    for (int i = x->n_blocks - 1; i > 0; i--) {
        int j = (int)(sf_rng_uniform(&R) * (i + 1)) % (i + 1), tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    x->bt = malloc((size_t)T * maxb * sizeof(int));
    int next = 0;
    for (int t = 0; t < T; t++) {
        int nb = (x->ctx[t] + bs - 1) / bs;
        for (int b = 0; b < maxb; b++) {
            if (b >= nb) { x->bt[t * maxb + b] = -1; continue; } /* never read */
            int fb = perm[next++];
            int i8 = (int)(sf_rng_uniform(&R) * 100) < c->i8_pct;
            if (i8) {
                int u = 2 * fb + (sf_rng_next(&R) & 1);
                x->bt[t * maxb + b] = x->i8_base + u;
                int8_t *k8 = (int8_t *)x->k, *v8 = (int8_t *)x->v;
                for (int64_t i = 0; i < blk_elems; i++) {
                    k8[(int64_t)u * blk_elems + i] = (int8_t)((int)(rand_bf16() & 0xFF) % 255 - 127);
                    v8[(int64_t)u * blk_elems + i] = (int8_t)((int)(rand_bf16() & 0xFF) % 255 - 127);
                }
            } else {
                x->bt[t * maxb + b] = fb;
            }
        }
    }
    free(perm);
    const int H = c->H, G = H / Hkv;
    x->q = malloc((size_t)T * H * hd * 2);
    for (int64_t i = 0; i < (int64_t)T * H * hd; i++) x->q[i] = sf_f32_to_bf16(sf_rng_normal(&R) * c->q_scale);
    /* float64 reference */
    x->ref = malloc((size_t)T * H * hd * sizeof(double));
    const double scale = 1.0 / sqrt((double)hd);
    double *s = malloc((size_t)c->ctx_max * sizeof(double)), row[256], qd[256];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int kh = h / G, n = x->ctx[t];
            const uint16_t *qh = x->q + ((int64_t)t * H + h) * hd;
            for (int d = 0; d < hd; d++) qd[d] = sf_bf16_to_f32(qh[d]);
            double mx = -INFINITY;
            for (int p = 0; p < n; p++) {
                double d0 = 0;
                key_row(c, x, x->k, x->ks, t, kh, p, row);
                for (int d = 0; d < hd; d++) d0 += qd[d] * row[d];
                s[p] = d0 * scale;
                mx = s[p] > mx ? s[p] : mx;
            }
            double sum = 0;
            for (int p = 0; p < n; p++) sum += (s[p] = exp(s[p] - mx));
            double *o = x->ref + ((int64_t)t * H + h) * hd;
            for (int d = 0; d < hd; d++) o[d] = 0;
            for (int p = 0; p < n; p++) {
                key_row(c, x, x->v, x->vs, t, kh, p, row);
                for (int d = 0; d < hd; d++) o[d] += s[p] / sum * row[d];
            }
        }
    free(s);
}

static void free_host(dhost *x)
{
    free(x->ctx); free(x->bt); free(x->k); free(x->v); free(x->q); free(x->ks); free(x->vs); free(x->ref);
    memset(x, 0, sizeof *x);
}

/* Device copies of a case, and an sf_k_attn over them. */
typedef struct ddev {
    uint16_t *k, *v, *q, *o;
    float *ks, *vs, *ws;
    int32_t *meta; /* pos [T], tok_seq [T], block table [T][max_blocks] */
    size_t ws_floats;
} ddev;

static int upload(const dcase *c, const dhost *x, ddev *d, int max_split)
{
    const int T = c->T, H = c->H;
    size_t cache = (size_t)x->n_blocks * c->Hkv * c->bs * c->hd * 2, sc = (size_t)2 * x->n_blocks * c->Hkv * c->bs * 4;
    size_t nmeta = 2 * (size_t)T + (size_t)T * x->max_blocks;
    d->ws_floats = (size_t)T * H * max_split * (c->hd + 2);
    if (cudaMalloc((void **)&d->k, cache) || cudaMalloc((void **)&d->v, cache) || cudaMalloc((void **)&d->ks, sc) ||
        cudaMalloc((void **)&d->vs, sc) || cudaMalloc((void **)&d->q, (size_t)T * H * c->hd * 2) ||
        cudaMalloc((void **)&d->o, (size_t)T * H * c->hd * 2) || cudaMalloc((void **)&d->meta, nmeta * 4) ||
        cudaMalloc((void **)&d->ws, d->ws_floats * 4 + (size_t)T * c->Hkv * SF_K_ATTN_CNT_PER_KVH * 4))
        return -1;
    int32_t *meta = malloc(nmeta * 4);
    for (int t = 0; t < T; t++) {
        meta[t] = x->ctx[t] - 1;
        meta[T + t] = t;
    }
    memcpy(meta + 2 * T, x->bt, (size_t)T * x->max_blocks * 4);
    int rc = cudaMemcpy(d->k, x->k, cache, cudaMemcpyHostToDevice) || cudaMemcpy(d->v, x->v, cache, cudaMemcpyHostToDevice) ||
             cudaMemcpy(d->ks, x->ks, sc, cudaMemcpyHostToDevice) || cudaMemcpy(d->vs, x->vs, sc, cudaMemcpyHostToDevice) ||
             cudaMemcpy(d->q, x->q, (size_t)T * H * c->hd * 2, cudaMemcpyHostToDevice) ||
             cudaMemcpy(d->meta, meta, nmeta * 4, cudaMemcpyHostToDevice) ||
             cudaMemset(d->ws + d->ws_floats, 0, (size_t)T * c->Hkv * SF_K_ATTN_CNT_PER_KVH * 4);
    free(meta);
    return rc ? -1 : 0;
}

static void free_dev(ddev *d)
{
    cudaFree(d->k); cudaFree(d->v); cudaFree(d->ks); cudaFree(d->vs); cudaFree(d->q); cudaFree(d->o);
    cudaFree(d->meta); cudaFree(d->ws);
    memset(d, 0, sizeof *d);
}

static sf_k_attn make_attn(const dcase *c, const dhost *x, const ddev *d, int n_split)
{
    int any_i8 = 0;
    for (int i = 0; i < c->T * x->max_blocks; i++) any_i8 |= x->bt[i] >= x->i8_base;
    sf_k_attn a = { .q = d->q, .ld_q = (int64_t)c->H * c->hd, .out = d->o, .ld_out = (int64_t)c->H * c->hd, .T = c->T,
                    .H = c->H, .Hkv = c->Hkv, .hd = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .pos = d->meta,
                    .tok_seq = d->meta + c->T, .block_table = d->meta + 2 * c->T, .max_blocks = x->max_blocks,
                    .kv = { d->k, d->v, c->bs, c->Hkv, c->hd, any_i8 ? d->ks : NULL, any_i8 ? d->vs : NULL,
                            any_i8 ? x->i8_base : 0 },
                    .ws = d->ws, .n_split = n_split, .counters = (unsigned *)(d->ws + d->ws_floats) };
    return a;
}

/* The kernels under test: the lanes kernel (its splits combined in a cluster, or through the
 * workspace), the mma kernel in a configuration (kernels.h), the stream kernel in a configuration
 * on at most max_blocks blocks (0: as many as are resident). */
typedef struct dpath {
    const char *name;
    int kind; /* 0 lanes, 1 mma, 2 stream, 3 lanes without the cluster combine, 4 the dispatcher
                 on a plan of the one-token tensor-core kernel (sf_k_attn.kernel 4; its splits
                 in a cluster where it fits), 5 the same through the workspace, 6 that kernel's
                 cluster instance called directly (n/a where it does not apply), 7 the dispatcher
                 on a plan of its 8-warp one-token configuration (kernel 5) */
    int cfg, max_blocks;
    int h8; /* lanes: groups of 5..8 on the 8-head instance rather than two 4-head blocks */
} dpath;
static const dpath PATHS[] = {
    { "lanes", 0, 0, 0 },          { "lanes/ws", 3, 0, 0 },       { "mma42", 1, 42, 0 },    { "mma43", 1, 43, 0 },
    { "mma23", 1, 23, 0 },         { "mma24", 1, 24, 0 },         { "stream42", 2, 42, 0 }, { "stream43", 2, 43, 0 },
    { "stream42/1blk", 2, 42, 1 }, { "stream42/7blk", 2, 42, 7 }, { "lanes/8h", 0, 0, 0, 1 }, { "lanes/ws/8h", 3, 0, 0, 1 },
    { "plan-b1", 4, 0, 0 },        { "mma143", 1, 143, 0 },       { "mma144", 1, 144, 0 },  { "mma145", 1, 145, 0 },
    { "plan-b1/ws", 5, 0, 0 },     { "mma144/cl", 6, 144, 0 },    { "mma183", 1, 183, 0 },  { "plan-b1/8w", 7, 0, 0 },
};
static int cl_runs; /* launches of the cluster instance (kind 6) that applied */
#define NOT_APPLICABLE (-2) /* launch_path: kind 6 where the cluster instance does not apply */

static int launch_path(const dpath *p, const sf_k_attn *a, cudaStream_t s)
{
    if (p->kind == 0 || p->kind == 3) { /* the lanes kernel: splits combined in a cluster / the workspace */
        sf_k_attention_decode_cluster(p->kind == 0);
        sf_k_attention_decode_head_split(!p->h8);
        const int rc = sf_k_attention_decode(a, s);
        sf_k_attention_decode_cluster(-1);
        sf_k_attention_decode_head_split(-1);
        return rc;
    }
    if (p->kind == 4 || p->kind == 5 || p->kind == 7) { /* what batch_begin's one-token plans make the dispatcher launch */
        sf_k_attn b = *a;
        b.kernel = p->kind == 7 ? SF_K_ATTN_DEC_B1_8W : SF_K_ATTN_DEC_B1;
        sf_k_attention_decode_cluster(p->kind == 4);
        const int rc = sf_k_attention_decode(&b, s);
        sf_k_attention_decode_cluster(-1);
        return rc;
    }
    if (p->kind == 6) {
        const int rc = sf_k_attention_decode_mma_cluster(a, p->cfg, s);
        cl_runs += rc == 0;
        return rc < 0 ? NOT_APPLICABLE : rc;
    }
    if (p->kind == 1) return sf_k_attention_decode_mma(a, p->cfg, s);
    return sf_k_attention_decode_stream(a, p->cfg, p->max_blocks, s);
}

/* Returns the relative error of one kernel on one case (NaN or INFINITY when the output has a
 * NaN or the launch failed; -1 where the path does not apply). */
static double run_path(const dcase *c, const dhost *x, const ddev *d, const dpath *p, int n_split)
{
    const int64_t n = (int64_t)c->T * c->H * c->hd;
    cudaMemset(d->o, 0xFF, n * 2); /* NaN */
    sf_k_attn a = make_attn(c, x, d, n_split);
    int rc = launch_path(p, &a, 0);
    if (rc == NOT_APPLICABLE) return -1.0;
    if (rc || cudaDeviceSynchronize()) {
        printf("  launch failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return INFINITY;
    }
    /* the combine leaves its counters at zero for the next launch (graph replays reuse them) */
    const size_t nc = (size_t)c->T * c->Hkv * SF_K_ATTN_CNT_PER_KVH;
    unsigned *cnt = malloc(nc * 4), nz = 0;
    cudaMemcpy(cnt, d->ws + d->ws_floats, nc * 4, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < nc; i++) nz += cnt[i] != 0;
    free(cnt);
    if (nz) {
        printf("  %s: %u counter words left non-zero\n", p->name, nz);
        return NAN;
    }
    uint16_t *o = malloc(n * 2);
    cudaMemcpy(o, d->o, n * 2, cudaMemcpyDeviceToHost);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        float f = sf_bf16_to_f32(o[i]);
        if (f != f) { free(o); return NAN; }
        num += (f - x->ref[i]) * (f - x->ref[i]);
        den += x->ref[i] * x->ref[i];
    }
    free(o);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_case(const dcase *c)
{
    dhost x = { 0 };
    ddev d = { 0 };
    make_case(c, &x);
    /* 9: a cluster past the portable size of 8; 33: past the cluster (4096 keys at batch 1) */
    const int splits[] = { 1, 3, 9, 16, 33 };
    int ok_up = upload(c, &x, &d, 33) == 0;
    CHECK_MSG(ok_up, "device allocation for T=%d failed", c->T);
    if (ok_up) {
        for (size_t si = 0; si < SF_ARRAY_LEN(splits); si++) {
            int ns = splits[si];
            sf_k_attn a = make_attn(c, &x, &d, ns);
            int lanes_ok = sf_k_attention_decode_ok(&a), mma_ok = sf_k_attention_decode_mma_ok(&a);
            int stream_ok = sf_k_attention_decode_stream_ok(&a);
            CHECK_MSG(mma_ok, "mma kernel refuses H=%d Hkv=%d hd=%d bs=%d split=%d", c->H, c->Hkv, c->hd, c->bs, ns);
            /* the stream kernel needs the workspace (two slots per block, n_split >= 2) */
            CHECK_MSG(stream_ok == (ns >= 2), "stream kernel %s split %d", stream_ok ? "takes" : "refuses", ns);
            char line[768];
            int len = snprintf(line, sizeof line, "T=%3d H=%2d/%d hd=%3d bs=%2d ctx %4d..%4d int8 %3d%% split %2d:",
                               c->T, c->H, c->Hkv, c->hd, c->bs, c->ctx_min, c->ctx_max, c->i8_pct, ns);
            int pass = 1;
            for (size_t k = 0; k < SF_ARRAY_LEN(PATHS); k++) {
                const dpath *p = &PATHS[k];
                if (((p->kind == 0 || p->kind == 3) && !lanes_ok) || (p->kind == 2 && !stream_ok)) continue;
                if (p->h8 && c->H / c->Hkv <= 4) continue; /* the same launch as without h8 */
                const double e = run_path(c, &x, &d, p, ns);
                if (e == -1.0) {
                    if (len < (int)sizeof line) len += snprintf(line + len, sizeof line - len, " %s n/a", p->name);
                    continue;
                }
                pass &= e <= 1e-2; /* NaN compares false */
                if (len < (int)sizeof line) len += snprintf(line + len, sizeof line - len, " %s %.2e", p->name, e);
            }
            CHECK_MSG(pass, "%s (relative error over 1e-2)", line);
            printf("  %s\n", line);
        }
    }
    free_dev(&d);
    free_host(&x);
}

TEST(decode_attention_vs_reference)
{
    const dcase cases[] = {
        /* T    H  Hkv  hd  bs  ctx       int8  q */
        { 1, 32, 8, 128, 16, 1, 1, 0, 1.0f },
        { 1, 32, 8, 128, 16, 17, 17, 0, 1.0f },
        { 1, 32, 8, 128, 16, 8192, 8192, 0, 1.0f },
        { 1, 32, 8, 128, 16, 4096, 4096, 100, 1.0f },
        { 1, 28, 4, 128, 16, 4096, 4096, 0, 1.0f },
        { 1, 8, 2, 64, 16, 1500, 1500, 0, 1.0f },
        { 2, 64, 8, 128, 16, 1, 8192, 50, 1.0f },
        { 3, 28, 4, 128, 16, 100, 3000, 0, 3.0f },
        { 7, 28, 4, 128, 32, 1, 700, 50, 1.0f },
        { 16, 32, 8, 128, 16, 1, 1000, 30, 2.0f },
        { 64, 32, 8, 128, 16, 1, 300, 0, 1.0f },
        { 32, 64, 8, 128, 16, 60, 200, 100, 1.0f },
        { 256, 32, 8, 128, 16, 1, 130, 0, 1.0f },
        { 256, 32, 8, 128, 16, 60, 100, 100, 1.0f },
        { 128, 28, 4, 128, 16, 1, 200, 50, 3.0f },
        { 9, 8, 2, 64, 16, 1, 900, 0, 1.0f },
        { 33, 8, 2, 64, 16, 1, 300, 50, 1.0f },
        { 5, 8, 8, 64, 16, 1, 200, 100, 1.0f },
    };
    const dcase short_cases[] = { /* --quick: every launch kind, few keys */
        { 1, 32, 8, 128, 16, 17, 17, 0, 1.0f },  { 1, 32, 8, 128, 16, 300, 600, 0, 1.0f },
        { 3, 28, 4, 128, 16, 100, 600, 0, 3.0f }, { 2, 64, 8, 128, 16, 1, 600, 50, 1.0f },
        { 9, 8, 2, 64, 16, 1, 300, 0, 1.0f },     { 16, 32, 8, 128, 16, 1, 200, 30, 2.0f },
    };
    cl_runs = 0;
    if (quick)
        for (size_t i = 0; i < SF_ARRAY_LEN(short_cases); i++) check_case(&short_cases[i]);
    else
        for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) check_case(&cases[i]);
    /* clusters (sm_90 on) of up to 16 blocks: the first case's 8 clusters fit an H100/H200 */
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    CHECK_MSG(major < 9 || cl_runs > 0, "the one-token cluster instance never applied (compute capability %d)", major);
    printf("  the one-token cluster instance ran %d times\n", cl_runs);
}

/* The stream kernel over one batch three times in a row: its counters come back to zero after
 * every launch (graph replays rely on it; run_path checks them) and a second and third run give
 * the same result. */
TEST(decode_attention_stream_replays)
{
    const dcase c = { 96, 32, 8, 128, 16, 1, 700, 0, 1.0f };
    dhost x = { 0 };
    ddev d = { 0 };
    make_case(&c, &x);
    int ok_up = upload(&c, &x, &d, 4) == 0;
    CHECK_MSG(ok_up, "device allocation failed");
    if (ok_up) {
        const dpath p = { "stream42/50blk", 2, 42, 50 };
        for (int r = 0; r < 3; r++) {
            double e = run_path(&c, &x, &d, &p, 4);
            CHECK_MSG(e <= 1e-2, "run %d: relative error %.3g (NaN: the output, or counters left non-zero)", r, e);
        }
    }
    free_dev(&d);
    free_host(&x);
}

/* The stream kernel over a subset of the step's tokens (a->rows: the single-token sequences of a
 * step whose other sequences take the prefill kernel): the listed rows match the reference, every
 * other row keeps its poison, and the per-item kernels refuse such a call. */
TEST(decode_attention_stream_rows)
{
    for (int i8 = 0; i8 <= 50; i8 += 50) {
        const dcase c = { 40, 32, 8, 128, 16, 1, 900, i8, 1.0f };
        dhost x = { 0 };
        ddev d = { 0 };
        int32_t *rows_d = NULL, rows[40], n = 0;
        make_case(&c, &x);
        for (int t = 0; t < c.T; t++)
            if (t % 3 != 1) rows[n++] = t;
        int ok_up = upload(&c, &x, &d, 4) == 0 && cudaMalloc((void **)&rows_d, sizeof rows) == cudaSuccess &&
                    cudaMemcpy(rows_d, rows, sizeof rows, cudaMemcpyHostToDevice) == cudaSuccess;
        CHECK_MSG(ok_up, "device allocation failed");
        if (ok_up) {
            const int64_t per = (int64_t)c.H * c.hd, total = (int64_t)c.T * per;
            sf_k_attn a = make_attn(&c, &x, &d, 4);
            a.T = n;
            a.rows = rows_d;
            CHECK(sf_k_attention_decode_stream_ok(&a));
            CHECK(!sf_k_attention_decode_mma_ok(&a) && !sf_k_attention_decode_ok(&a));
            for (int mb = 0; mb <= 7; mb += 7) { /* as many blocks as are resident; 7 */
                cudaMemset(d.o, 0xFF, total * 2);
                int rc = sf_k_attention_decode_stream(&a, 42, mb, 0);
                CHECK_MSG(rc == 0 && cudaDeviceSynchronize() == cudaSuccess, "launch failed: %s",
                          cudaGetErrorString(cudaGetLastError()));
                uint16_t *o = malloc(total * 2);
                cudaMemcpy(o, d.o, total * 2, cudaMemcpyDeviceToHost);
                double num = 0, den = 0;
                int64_t untouched = 0, nan_listed = 0;
                for (int t = 0; t < c.T; t++) {
                    const int listed = t % 3 != 1;
                    for (int64_t k = 0; k < per; k++) {
                        const uint16_t b = o[t * per + k];
                        const float f = sf_bf16_to_f32(b);
                        const double r = x.ref[t * per + k];
                        if (!listed) { untouched += b == 0xFFFF; continue; }
                        if (f != f) { nan_listed++; continue; }
                        num += (f - r) * (f - r);
                        den += r * r;
                    }
                }
                const double e = den > 0 ? sqrt(num / den) : sqrt(num);
                CHECK_MSG(nan_listed == 0 && e <= 1e-2, "int8 %d%% blocks %d: %lld NaN in listed rows, rel err %.3g", i8,
                          mb, (long long)nan_listed, e);
                CHECK_MSG(untouched == (int64_t)(c.T - n) * per, "int8 %d%% blocks %d: %lld of %lld values of unlisted "
                          "rows written", i8, mb, (long long)((c.T - n) * per - untouched), (long long)((c.T - n) * per));
                printf("  rows %d of %d, int8 %d%%, blocks %d: rel err %.2e\n", n, c.T, i8, mb, e);
                free(o);
            }
        }
        cudaFree(rows_d);
        free_dev(&d);
        free_host(&x);
    }
}

/* A bad shape is refused with an error code, never launched. */
TEST(decode_attention_refuses_bad_shapes)
{
    sf_k_attn a = { 0 };
    a.T = 1; a.H = 32; a.Hkv = 8; a.hd = 96; a.n_split = 1; a.ld_q = 4096;
    a.kv.head_dim = 96; a.kv.block_size = 16;
    CHECK(!sf_k_attention_decode_mma_ok(&a));
    CHECK(sf_k_attention_decode_mma(&a, 42, 0) != 0);
    a.hd = a.kv.head_dim = 128; a.kv.block_size = 8; /* a warp's 16 keys in one block */
    CHECK(!sf_k_attention_decode_mma_ok(&a));
    a.kv.block_size = 48; /* not a power of 2 */
    CHECK(!sf_k_attention_decode_mma_ok(&a));
    a.kv.block_size = 16; a.H = 80; /* group of 10 */
    CHECK(!sf_k_attention_decode_mma_ok(&a));
    a.H = 32; a.n_split = 4; /* split without a workspace */
    CHECK(!sf_k_attention_decode_mma_ok(&a));
    CHECK(!sf_k_attention_decode_stream_ok(&a));
    CHECK(sf_k_attention_decode_stream(&a, 42, 0, 0) != 0);
    a.n_split = 1; /* the stream kernel's pieces need a workspace even without a split */
    CHECK(!sf_k_attention_decode_stream_ok(&a));
}

/* What a one-token step's attention block takes of an SM (the QKV GEMV's plan leaves room for
 * one): registers of whole warps, shared memory within an SM's, the same instance for groups of
 * 1..4 and of 5..8; groups of 5..8 split into two blocks of the 4-head instance take what a
 * 4-head block takes, on the 8-head instance more; other head sizes and groups refused with
 * zeros. */
TEST(decode_attention_block_resources)
{
    int regfile = 0, smem_sm = 0, dev = 0;
    CHECK(cudaGetDevice(&dev) == cudaSuccess);
    CHECK(cudaDeviceGetAttribute(&regfile, cudaDevAttrMaxRegistersPerMultiprocessor, dev) == cudaSuccess);
    CHECK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess);
    static const int shapes[][2] = { { 128, 1 }, { 128, 4 }, { 128, 7 }, { 128, 8 }, { 64, 2 }, { 64, 8 } };
    for (int split = 1; split >= 0; split--) {
        sf_k_attention_decode_head_split(split);
        int r4 = 0, s4 = 0, r8 = 0, s8 = 0;
        for (size_t i = 0; i < SF_ARRAY_LEN(shapes); i++) {
            int regs = -1, smem = -1;
            const int rc = sf_k_attention_decode_block(shapes[i][0], shapes[i][1], &regs, &smem);
            CHECK_MSG(rc == 0 && regs > 0 && regs % (8 * 32) == 0 && regs <= regfile && smem > 0 && smem <= smem_sm,
                      "hd %d group %d: rc %d, %d registers (SM %d), %d bytes (SM %d)", shapes[i][0], shapes[i][1],
                      rc, regs, regfile, smem, smem_sm);
            printf("  head split %d, hd %3d group %d: %6d registers, %6d bytes of shared memory a block\n", split,
                   shapes[i][0], shapes[i][1], regs, smem);
            if (shapes[i][0] == 128 && shapes[i][1] == 1) { r4 = regs; s4 = smem; }
            if (shapes[i][0] == 128 && shapes[i][1] == 4) CHECK(regs == r4 && smem == s4);
            if (shapes[i][0] == 128 && shapes[i][1] == 7) { r8 = regs; s8 = smem; }
            if (shapes[i][0] == 128 && shapes[i][1] == 8) CHECK(regs == r8 && smem == s8);
        }
        if (split) CHECK_MSG(r8 == r4, "split group of 7: %d registers against %d for 4", r8, r4);
        else CHECK(r8 > r4 && s8 > s4); /* the 8-head instance holds more per lane */
    }
    sf_k_attention_decode_head_split(-1);
    static const int bad[][2] = { { 96, 4 }, { 128, 0 }, { 128, 9 }, { 256, 4 } };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        int regs = -1, smem = -1;
        CHECK(sf_k_attention_decode_block(bad[i][0], bad[i][1], &regs, &smem) != 0 && regs == 0 && smem == 0);
    }
}

/* ---- --perf: Llama-3-8B decode attention at batch and batch-1 shapes ------------------------ */
/* The split the backend would pick for this path's kernel (kind 0 and 3 lanes, 1 mma, 2 stream;
 * 4 and 7, the one-token tensor-core configurations: the split batch_begin's plan gives the engine's
 * steps when it plans that kernel; main() forces the lanes kernel on the dispatcher's own plan). */
static int split_for(int T, int Hkv, int ctx, int i8, int kind)
{
    static const int kernel[] = { 1, 2, 3, 1, SF_K_ATTN_DEC_B1, SF_K_ATTN_DEC_B1, SF_K_ATTN_DEC_B1, SF_K_ATTN_DEC_B1_8W };
    return sf_k_attention_decode_split(T, Hkv, 128, ctx, 16, i8, sms, kernel[kind]);
}

static void perf_shape(int T, int ctx, int i8, cudaStream_t s)
{
    const int H = 32, Hkv = 8, hd = 128, bs = 16, nb = (ctx + bs - 1) / bs;
    const int64_t n_blocks = (int64_t)T * nb;
    const size_t blk_bytes = (size_t)Hkv * bs * hd * 2;
    uint16_t *k = NULL, *v = NULL, *q = NULL, *o = NULL;
    float *sc = NULL, *ws = NULL;
    int32_t *meta = NULL, *host = NULL;
    const size_t ws_floats = (size_t)T * H * 64 * (hd + 2);
    const size_t nmeta = 2 * (size_t)T + (size_t)T * nb;
    /* INT8: every block is an INT8 unit; a copy of the cache holds n_blocks / 2 full blocks (+1) */
    const int64_t full = i8 ? n_blocks / 2 + 1 : n_blocks;
    /* Copies of the cache, each launch reading the next (its own block table), so that the keys
     * come from HBM as in a step, where a layer's weights pass between two reads of its cache:
     * one copy of a batch-1 cache fits in L2 and would be read from there after the first launch. */
    int l2 = 0, dev = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
    const double copy_bytes = (double)full * blk_bytes * 2;
    const int C = (int)SF_MIN(256.0, SF_MAX(1.0, ceil(4.0 * l2 / copy_bytes)));
    const int64_t F = full * C; /* blocks of memory; INT8 units start at id F */
    if (cudaMalloc((void **)&k, F * blk_bytes) || cudaMalloc((void **)&v, F * blk_bytes) ||
        cudaMalloc((void **)&q, (size_t)T * H * hd * 2) || cudaMalloc((void **)&o, (size_t)T * H * hd * 2) ||
        cudaMalloc((void **)&sc, (size_t)2 * 2 * F * Hkv * bs * 4) || cudaMalloc((void **)&meta, C * nmeta * 4) ||
        cudaMalloc((void **)&ws, ws_floats * 4 + (size_t)T * Hkv * SF_K_ATTN_CNT_PER_KVH * 4)) {
        printf("perf: T=%d ctx=%d: out of device memory, skipped\n", T, ctx);
        goto cleanup;
    }
    sf_k_fill_random(k, (int64_t)(F * blk_bytes / 2), 21, 1.0f, s);
    sf_k_fill_random(v, (int64_t)(F * blk_bytes / 2), 22, 1.0f, s);
    sf_k_fill_random(q, (int64_t)T * H * hd, 23, 1.0f, s);
    cudaMemsetAsync(sc, 0x3C, (size_t)2 * 2 * F * Hkv * bs * 4, s); /* 0.0115 */
    cudaMemsetAsync(ws + ws_floats, 0, (size_t)T * Hkv * SF_K_ATTN_CNT_PER_KVH * 4, s);
    host = malloc(C * nmeta * 4);
    for (int c = 0; c < C; c++) {
        int32_t *h = host + c * nmeta;
        for (int t = 0; t < T; t++) { h[t] = ctx - 1; h[T + t] = t; }
        for (int64_t i = 0; i < n_blocks; i++) {
            int64_t id = c * n_blocks + (i * 7919) % n_blocks; /* shuffled, in copy c */
            h[2 * T + i] = i8 ? (int32_t)(F + id) : (int32_t)id;
        }
    }
    cudaMemcpy(meta, host, C * nmeta * 4, cudaMemcpyHostToDevice);
    double bytes = (double)T * ctx * Hkv * hd * 2 * (i8 ? 1 : 2) + (i8 ? (double)T * ctx * Hkv * 8 : 0) +
                   (double)T * H * hd * 2 * 2;
    if (T == 256 && ctx == 192) { /* once per kind: what each configuration fits per SM */
        printf("perf: %s blocks per SM:", i8 ? "int8" : "bf16");
        for (size_t k = 0; k < SF_ARRAY_LEN(CFGS); k++)
            printf(" mma%d %d", CFGS[k], sf_k_attention_decode_mma_per_sm(hd, i8, CFGS[k]));
        printf(" stream42 %d stream43 %d", sf_k_attention_decode_stream_per_sm(hd, i8, 42),
               sf_k_attention_decode_stream_per_sm(hd, i8, 43));
        printf("\n");
    }
    printf("perf: T=%3d ctx=%4d %-4s %7.1f MB x%3d |", T, ctx, i8 ? "int8" : "bf16", bytes / 1e6, C);
    for (size_t pi = 0; pi < SF_ARRAY_LEN(PATHS); pi++) {
        const dpath *p = &PATHS[pi];
        if (p->max_blocks) continue; /* the test's small grids */
        if (perf_path && strcmp(perf_path, p->name)) continue;
        /* the one-token configurations at the one-token plan's split */
        int ns = split_for(T, Hkv, ctx, i8, p->kind != 1 || p->cfg < 100 ? p->kind : p->cfg == SF_K_DEC_MMA_B1_8W_CFG ? 7 : 4);
        sf_k_attn a = { .q = q, .ld_q = H * hd, .out = o, .ld_out = H * hd, .T = T, .H = H, .Hkv = Hkv, .hd = hd,
                        .scale = 0.088f, .pos = meta, .tok_seq = meta + T, .block_table = meta + 2 * T,
                        .max_blocks = nb, .kv = { k, v, bs, Hkv, hd, i8 ? sc : NULL, i8 ? sc + 2 * F * Hkv * bs : NULL,
                                                  i8 ? (int)F : 0 },
                        .ws = ws, .n_split = ns, .counters = (unsigned *)(ws + ws_floats) };
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0);
        cudaEventCreate(&e1);
        const int reps = T * ctx > 100000 ? 20 : 200;
        int rc = 0;
        for (int r = 0; r < reps + 3; r++) {
            if (r == 3) cudaEventRecord(e0, s);
            const int32_t *m = meta + (size_t)(r % C) * nmeta;
            a.pos = m; a.tok_seq = m + T; a.block_table = m + 2 * T;
            const int r1 = launch_path(p, &a, s);
            if (r1 == NOT_APPLICABLE) { rc = r1; break; }
            rc |= r1;
        }
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        /* n/a: nothing was timed (e0 never recorded, whose error the next launch would read) */
        if (rc != NOT_APPLICABLE) cudaEventElapsedTime(&ms, e0, e1);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        if (rc == NOT_APPLICABLE) {
            printf(" %s(split %2d) n/a |", p->name, ns);
            continue;
        }
        double us = rc ? NAN : ms * 1000.0 / reps;
        printf(" %s(split %2d) %7.1f us %5.1f%% |", p->name, ns, us,
               100.0 * bytes / (us * 1e3) / hbm_gbs);
    }
    printf("\n");
cleanup:
    free(host);
    cudaFree(k); cudaFree(v); cudaFree(q); cudaFree(o); cudaFree(sc); cudaFree(meta); cudaFree(ws);
    cudaGetLastError();
}

static void perf_all(void)
{
    cudaStream_t s;
    if (cudaStreamCreate(&s)) return;
    printf("perf: decode attention, Llama-3-8B heads (32/8 x 128), block 16; %% of hal's HBM %.0f GB/s "
           "(bytes: K+V (+scales) + q + o)\n", hbm_gbs);
    const int shapes[][2] = { { 256, 192 }, { 512, 192 }, { 128, 1500 }, { 64, 4096 },
                              { 16, 1024 }, { 4, 4096 },  { 1, 512 },    { 1, 4096 },
                              { 1, 4120 } }; /* 4120: a batch-1 bench's steps at --ctx 4096 */
    if (perf_T > 0) perf_shape(perf_T, perf_ctx, 0, s);
    else
        for (int i8 = 0; i8 <= 1; i8++)
            for (size_t i = 0; i < SF_ARRAY_LEN(shapes); i++) perf_shape(shapes[i][0], shapes[i][1], i8, s);
    cudaStreamDestroy(s);
}
#endif

int main(int argc, char **argv)
{
#ifdef SF_HAVE_CUDA
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--perf")) {
            perf = 1;
            if (i + 1 < argc && sscanf(argv[i + 1], "%dx%d", &perf_T, &perf_ctx) == 2) {
                if (perf_T < 1 || perf_T > 512 || perf_ctx < 1 || perf_ctx > 65536) {
                    fprintf(stderr, "--perf %s: T 1..512, CTX 1..65536\n", argv[i + 1]);
                    return 2;
                }
                i++;
                if (i + 1 < argc && argv[i + 1][0] != '-') {
                    perf_path = argv[++i];
                    size_t k = 0;
                    while (k < SF_ARRAY_LEN(PATHS) && strcmp(PATHS[k].name, perf_path)) k++;
                    if (k == SF_ARRAY_LEN(PATHS)) {
                        fprintf(stderr, "--perf: no path '%s' (the names --perf prints)\n", perf_path);
                        return 2;
                    }
                }
            }
        } else if (!strcmp(argv[i], "--quick")) quick = 1;
    /* sf_k_attention_decode is the lanes kernel here; the mma kernel is called directly */
    setenv("SEMFLOW_CUDA_DECODE_ATTN", "lanes", 1);
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    sf_rng_seed(&R, (uint64_t)sf_now_ns());
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    sf_backend_opts o = { .name = "cuda" };
    sf_backend *B = NULL;
    sf_error err = { 0 };
    if (sf_backend_cuda_new(&o, &B, &err)) {
        printf("FAIL: open_cuda_backend: %s\n", err.msg);
        return 1;
    }
    const sf_hw_info *hw = B->ops->hw(B);
    hbm_gbs = hw->mem_bw_gbs > 0 ? hw->mem_bw_gbs : 4000;
    sms = hw->n_cores > 0 ? hw->n_cores : 132;
    if (perf) {
        perf_all();
    } else {
        RUN(decode_attention_refuses_bad_shapes);
        RUN(decode_attention_block_resources);
        RUN(decode_attention_vs_reference);
        RUN(decode_attention_stream_replays);
        RUN(decode_attention_stream_rows);
    }
    B->ops->destroy(B);
    return test_summary();
#else
    (void)argc; (void)argv;
    printf("SKIP: built without CUDA\n");
    return 77;
#endif
}
