/* test_gemv.c — the batch-1 GEMVs (gemv.cu, gemv_fused.cu) against a float64 host reference over
 * the decode shapes of Llama-3-8B and Qwen2-7B and the tensor-parallel shards of 8B and 70B:
 * fresh random weights and activations every run (the seed is printed), outputs poisoned with
 * NaN before each launch, every output row checked on the model shapes and 256 sampled rows on
 * the TP shapes (the reference is the host's work), ||out - ref|| / ||ref|| <= 1e-2 per launch
 * and NaN never passing. Which kernel each fused op takes comes from the environment
 * (SEMFLOW_CUDA_GEMV_RING), so bench/device/decode.sh runs this binary once per setting.
 *
 *   test_gemv            the checks (GPU host only)
 *   test_gemv --quick    every kernel and kind of launch on small shapes (for compute-sanitizer)
 *   test_gemv --perf-rows [N ...]
 *                        time the fused GEMVs of N rows each (gemv_rows.cu; default 2, 4 and 8)
 *                        at Llama-3-8B's shapes, planned and at forced configurations, beside
 *                        gemv.cu, and the layer chain of 2 and 4 rows at several rings
 *   test_gemv --perf     instead time a decode layer's four fused GEMVs in one CUDA graph (PDL
 *                        as the backend launches them) over 8 layers of weights (past L2), at
 *                        the shapes of Llama-3-8B, its TP=2 shard, Llama-3-70B's TP=2 shard and
 *                        Qwen2-7B: the chain and each op alone, with every kernel variant, in %
 *                        of the device's copy bandwidth measured first; and the one-row lm_head
 *                        of Llama-3-8B and Qwen2-7B on each GEMV that can take it */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/sf.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cuda/gemv_stream.h"
#include "../../kernels/cuda/kernels.h"

static cudaStream_t S;
static uint64_t seed;
/* the worst relative error of the planned one-row fused GEMVs and of the 2-8 row ones (printed) */
static double worst_fused, worst_rows;

static double bf(uint16_t v) { return (double)sf_bf16_to_f32(v); }

/* Device buffer of n bf16 with random values (scale), and its host copy. */
static uint16_t *dev_rand(int64_t n, float scale, uint16_t **host)
{
    uint16_t *d = NULL;
    if (cudaMalloc((void **)&d, (size_t)n * 2)) return NULL;
    if (sf_k_fill_random(d, n, seed++, scale, S) || cudaStreamSynchronize(S)) { cudaFree(d); return NULL; }
    if (host) {
        *host = malloc((size_t)n * 2);
        if (!*host || cudaMemcpy(*host, d, (size_t)n * 2, cudaMemcpyDeviceToHost)) { cudaFree(d); return NULL; }
    }
    return d;
}

static void poison(uint16_t *d, int64_t n) { cudaMemsetAsync(d, 0xff, (size_t)n * 2, S); /* bf16 NaN */ }

/* The normalised row as the kernels round it: bf16(bf16(x * inv) * nw). */
static void host_norm(const uint16_t *x, const uint16_t *nw, int k, double *xn)
{
    double ss = 0;
    for (int i = 0; i < k; i++) ss += bf(x[i]) * bf(x[i]);
    float inv = 1.0f / sqrtf((float)(ss / k) + 1e-5f);
    for (int i = 0; i < k; i++) {
        float n0 = sf_bf16_to_f32(sf_f32_to_bf16((float)bf(x[i]) * inv));
        xn[i] = sf_bf16_to_f32(sf_f32_to_bf16(n0 * (float)bf(nw[i])));
    }
}

static double dot(const uint16_t *w, const double *x, int k)
{
    double a = 0;
    for (int i = 0; i < k; i++) a += bf(w[i]) * x[i];
    return a;
}

/* relative error over the checked rows; NaN -> inf */
typedef struct errsum {
    double num, den;
    int nan;
} errsum;

static void err_add(errsum *e, double got, double ref)
{
    if (isnan(got) || isinf(got)) e->nan = 1;
    e->num += (got - ref) * (got - ref);
    e->den += ref * ref;
}

static double err_rel(const errsum *e) { return e->nan ? INFINITY : sqrt(e->num / (e->den > 0 ? e->den : 1e-30)); }

/* Rows checked: all when m <= all_up_to, else 256 spread over [0, m) including both ends. */
static int row_at(int i, int n_check, int m) { return n_check == m ? i : (int)((int64_t)i * (m - 1) / (n_check - 1)); }

/* kind 0 norm, 1 norm + glu, 2 add (y += ...); st 0: as the launchers choose their kernels (per
 * SEMFLOW_CUDA_GEMV_RING), bias optional; else the persistent-warp kernel (gemv_stream.cu) with
 * st = blocks per SM x 10 + ring stages, no bias. */
static void check_fused_st(int kind, int m, int k, int with_bias, int st)
{
    const int add = kind == 2, plain = kind == 3;
    uint16_t *hx, *hnw, *hw, *hb = NULL, *hy0;
    const int out = kind == 1 ? m / 2 : m;
    uint16_t *x = dev_rand(k, 1.0f, &hx), *nw = dev_rand(k, 1.0f, &hnw), *w = dev_rand((int64_t)m * k, 0.05f, &hw);
    uint16_t *b = with_bias ? dev_rand(m, 0.5f, &hb) : NULL, *y = dev_rand(out, 1.0f, &hy0);
    REQUIRE(x && nw && w && y && (!with_bias || b), "cudaMalloc/fill of %d x %d failed", m, k);
    if (!add) poison(y, out);
    int rc = st ? sf_k_gemv_stream_tune(kind, st, x, nw, w, m, k, y, S)
             : add ? sf_k_gemv_add(x, w, b, m, k, y, S)
             : plain ? sf_k_gemv_stream_plain(x, w, b, m, k, y, S) : sf_k_gemv_norm(x, nw, 1e-5f, w, b, m, k, kind, y, S);
    cudaError_t e = cudaStreamSynchronize(S);
    CHECK_MSG(!rc && !e, "%s m=%d k=%d: launch %d, sync %s", add ? "add" : plain ? "plain" : "norm", m, k, rc,
              cudaGetErrorString(e));
    uint16_t *hy = malloc((size_t)out * 2);
    cudaMemcpy(hy, y, (size_t)out * 2, cudaMemcpyDeviceToHost);
    double *xn = malloc(sizeof(double) * k);
    if (add || plain) for (int i = 0; i < k; i++) xn[i] = bf(hx[i]);
    else host_norm(hx, hnw, k, xn);
    const int n_check = out <= 8192 ? out : 256;
    errsum es = { 0 };
    for (int i = 0; i < n_check; i++) {
        int r = row_at(i, n_check, out);
        double ref;
        if (kind == 1) {
            double g = sf_bf16_to_f32(sf_f32_to_bf16((float)(dot(hw + (int64_t)r * k, xn, k) + (hb ? bf(hb[r]) : 0))));
            double u = sf_bf16_to_f32(
                sf_f32_to_bf16((float)(dot(hw + (int64_t)(r + m / 2) * k, xn, k) + (hb ? bf(hb[r + m / 2]) : 0))));
            ref = sf_bf16_to_f32(sf_f32_to_bf16((float)(g / (1 + exp(-g))))) * u;
        } else {
            ref = dot(hw + (int64_t)r * k, xn, k) + (hb ? bf(hb[r]) : 0);
            if (add) ref = bf(hy0[r]) + sf_bf16_to_f32(sf_f32_to_bf16((float)ref));
        }
        err_add(&es, bf(hy[r]), ref);
    }
    double rel = err_rel(&es);
    if (!st && rel > worst_fused) worst_fused = rel;
    static const char *names[] = { "norm", "glu", "add", "plain" };
    CHECK_MSG(rel <= 1e-2, "%s%s m=%d k=%d st=%d: relative error %.3g over %d rows", names[kind],
              with_bias ? "+bias" : "", m, k, st, rel, n_check);
    free(xn); free(hy); free(hx); free(hnw); free(hw); free(hb); free(hy0);
    cudaFree(x); cudaFree(nw); cudaFree(w); cudaFree(b); cudaFree(y);
}

static void check_fused(int kind, int m, int k, int with_bias) { check_fused_st(kind, m, k, with_bias, 0); }

/* plain GEMV y[n, m] = x[n, k] W^T for n = 1, 2, 4, 8 (the TP shards run it) */
static void check_plain(int m, int k)
{
    uint16_t *hx, *hw;
    uint16_t *x = dev_rand((int64_t)8 * k, 1.0f, &hx), *w = dev_rand((int64_t)m * k, 0.05f, &hw), *y = NULL;
    REQUIRE(x && w && !cudaMalloc((void **)&y, (size_t)8 * m * 2), "cudaMalloc/fill of %d x %d failed", m, k);
    uint16_t *hy = malloc((size_t)8 * m * 2);
    double *xr = malloc(sizeof(double) * k);
    for (int n = 1; n <= 8; n *= 2) {
        poison(y, (int64_t)8 * m);
        int rc = sf_k_gemv(x, k, w, NULL, n, m, k, y, m, S);
        cudaError_t e = cudaStreamSynchronize(S);
        CHECK_MSG(!rc && !e, "gemv n=%d m=%d k=%d: launch %d, sync %s", n, m, k, rc, cudaGetErrorString(e));
        cudaMemcpy(hy, y, (size_t)8 * m * 2, cudaMemcpyDeviceToHost);
        const int n_check = m <= 8192 ? m : 256;
        errsum es = { 0 };
        for (int j = 0; j < n; j++) {
            for (int i = 0; i < k; i++) xr[i] = bf(hx[(int64_t)j * k + i]);
            for (int i = 0; i < n_check; i += (n > 1 ? 3 : 1)) { /* batches: every third row */
                int r = row_at(i, n_check, m);
                err_add(&es, bf(hy[(int64_t)j * m + r]), dot(hw + (int64_t)r * k, xr, k));
            }
        }
        double rel = err_rel(&es);
        CHECK_MSG(rel <= 1e-2, "gemv n=%d m=%d k=%d: relative error %.3g", n, m, k, rel);
        /* rows past n stay poisoned: nothing written outside y[n, m] */
        uint16_t past = n < 8 ? hy[(int64_t)n * m] : 0;
        CHECK_MSG(n == 8 || isnan(bf(past)), "gemv n=%d m=%d k=%d wrote past its %d rows", n, m, k, n);
    }
    free(hy); free(xr); free(hx); free(hw);
    cudaFree(x); cudaFree(w); cudaFree(y);
}

/* The same ops for n = 2..8 rows (gemv_rows.cu): kind as above (0 norm, 1 glu, 2 add, 3 plain),
 * x rows ldx = k + pad apart and output rows `out + pad` apart, every row of x checked (on 256
 * sampled output rows past 8192); the padding columns of y stay poisoned (add: untouched). A
 * shape the kernel does not take must be refused by sf_k_gemv_rows_ok and the launch alike. */
static void check_rows_cfg(int kind, int n, int m, int k, int with_bias, int pad, int cfg);
static void check_rows(int kind, int n, int m, int k, int with_bias, int pad)
{
    check_rows_cfg(kind, n, m, k, with_bias, pad, 0);
}

/* cfg: a forced configuration (sf_k_gemv_rows_tune: no bias, no padding), 0 as the backend runs */
static void check_rows_cfg(int kind, int n, int m, int k, int with_bias, int pad, int cfg)
{
    const int add = kind == 2, out = kind == 1 ? m / 2 : m, ldx = k + pad, ldy = out + pad;
    static const int kinds[] = { SF_K_ROWS_NORM, SF_K_ROWS_GLU, SF_K_ROWS_ADD, SF_K_ROWS_PLAIN };
    uint16_t *hx, *hnw, *hw, *hb = NULL, *hy0;
    uint16_t *x = dev_rand((int64_t)n * ldx, 1.0f, &hx), *nw = dev_rand(k, 1.0f, &hnw),
             *w = dev_rand((int64_t)m * k, 0.05f, &hw), *b = with_bias ? dev_rand(m, 0.5f, &hb) : NULL,
             *y = dev_rand((int64_t)n * ldy, 1.0f, &hy0);
    REQUIRE(x && nw && w && y && (!with_bias || b), "cudaMalloc/fill of %d x %d failed", m, k);
    int ok = sf_k_gemv_rows_ok(kinds[kind], n, x, ldx, w, m, k, ldy);
    if (!add) poison(y, (int64_t)n * ldy);
    int rc = cfg ? sf_k_gemv_rows_tune(kinds[kind], cfg, n, x, nw, w, m, k, y, S)
             : kind == 2 ? sf_k_gemv_rows_add(x, ldx, w, b, n, m, k, y, ldy, S)
             : kind == 3 ? sf_k_gemv_rows_plain(x, ldx, w, b, n, m, k, y, ldy, S)
                         : sf_k_gemv_rows_norm(x, ldx, nw, 1e-5f, w, b, n, m, k, kind, y, ldy, S);
    cudaError_t e = cudaStreamSynchronize(S);
    static const char *names[] = { "norm", "glu", "add", "plain" };
    if (cfg && rc == cudaErrorInvalidValue) goto done; /* the configuration does not fit the shape */
    if (cfg) ok = 1;
    if (!ok) { /* refused: by both, and nothing written */
        CHECK_MSG(rc == cudaErrorInvalidValue && !e, "rows %s n=%d m=%d k=%d: refused by rows_ok, launch gave %d",
                  names[kind], n, m, k, rc);
        goto done;
    }
    CHECK_MSG(!rc && !e, "rows %s n=%d m=%d k=%d: launch %d, sync %s", names[kind], n, m, k, rc, cudaGetErrorString(e));
    {
        uint16_t *hy = malloc((size_t)n * ldy * 2);
        double *xn = malloc(sizeof(double) * k);
        cudaMemcpy(hy, y, (size_t)n * ldy * 2, cudaMemcpyDeviceToHost);
        const int n_check = out <= 8192 ? out : 256;
        errsum es = { 0 };
        int pad_bad = 0;
        for (int j = 0; j < n; j++) {
            const uint16_t *xj = hx + (int64_t)j * ldx, *y0 = hy0 + (int64_t)j * ldy, *yj = hy + (int64_t)j * ldy;
            if (add || kind == 3) for (int i = 0; i < k; i++) xn[i] = bf(xj[i]);
            else host_norm(xj, hnw, k, xn);
            for (int i = 0; i < n_check; i++) {
                int r = row_at(i, n_check, out);
                double ref;
                if (kind == 1) {
                    double gt = sf_bf16_to_f32(sf_f32_to_bf16((float)(dot(hw + (int64_t)r * k, xn, k) + (hb ? bf(hb[r]) : 0))));
                    double u = sf_bf16_to_f32(sf_f32_to_bf16(
                        (float)(dot(hw + (int64_t)(r + m / 2) * k, xn, k) + (hb ? bf(hb[r + m / 2]) : 0))));
                    ref = sf_bf16_to_f32(sf_f32_to_bf16((float)(gt / (1 + exp(-gt))))) * u;
                } else {
                    ref = dot(hw + (int64_t)r * k, xn, k) + (hb ? bf(hb[r]) : 0);
                    if (add) ref = bf(y0[r]) + sf_bf16_to_f32(sf_f32_to_bf16((float)ref));
                }
                err_add(&es, bf(yj[r]), ref);
            }
            for (int i = out; i < ldy; i++) pad_bad += add ? yj[i] != y0[i] : !isnan(bf(yj[i]));
        }
        double rel = err_rel(&es);
        if (!cfg && rel > worst_rows) worst_rows = rel;
        CHECK_MSG(rel <= 1e-2, "rows %s%s n=%d m=%d k=%d pad=%d: relative error %.3g", names[kind],
                  with_bias ? "+bias" : "", n, m, k, pad, rel);
        CHECK_MSG(!pad_bad, "rows %s n=%d m=%d k=%d: %d padding columns written", names[kind], n, m, k, pad_bad);
        free(hy); free(xn);
    }
done:
    free(hx); free(hnw); free(hw); free(hb); free(hy0);
    cudaFree(x); cudaFree(nw); cudaFree(w); cudaFree(b); cudaFree(y);
}

/* Every row count on a decode layer's shapes (Llama-3-8B; Qwen2-7B with its biases), the lm_head
 * of a decode step, and small and odd ones: k shorter than a ring stage, k not a whole stage,
 * strided rows, and shapes the kernel refuses (x past its shared memory, k % 32, units of 8). */
TEST(rows_llama3_8b)
{
    for (int n = 2; n <= 8; n++) {
        check_rows(0, n, 6144, 4096, 0, 0);
        check_rows(2, n, 4096, 4096, 0, 0);
        check_rows(1, n, 28672, 4096, 0, 0);
        check_rows(2, n, 4096, 14336, 0, 0); /* refused past 6 rows */
    }
    check_rows(0, 4, 128256, 4096, 0, 0);
    check_rows(0, 8, 128256, 4096, 0, 0);
}

TEST(rows_qwen2_7b)
{
    for (int n = 2; n <= 8; n += 3) {
        check_rows(0, n, 4608, 3584, 1, 0);
        check_rows(2, n, 3584, 3584, 0, 0);
        check_rows(1, n, 37888, 3584, 0, 0);
        check_rows(2, n, 3584, 18944, 1, 0);
    }
}

/* Every configuration of the kernel (ring kinds, blocks per SM, depths, 8 warps a block or as
 * many as the units), whatever the planner picks: shapes with units for every warp, for few
 * warps, several per warp, and k shorter than a stage. */
TEST(rows_configs)
{
    static const int r[] = { 1, 3 }, bd[] = { 13, 14, 15, 16, 18, 23, 24, 25, 26, 28 };
    for (size_t i = 0; i < SF_ARRAY_LEN(r); i++)
        for (size_t j = 0; j < SF_ARRAY_LEN(bd); j++)
            for (int w8 = 0; w8 <= 1000; w8 += 1000) {
                const int cfg = w8 + r[i] * 100 + bd[j];
                check_rows_cfg(0, 3, 1536, 4096, 0, 0, cfg);
                check_rows_cfg(2, 5, 512, 14336, 0, 0, cfg);
                check_rows_cfg(1, 8, 2 * 1024, 1024, 0, 0, cfg);
                check_rows_cfg(3, 4, 16384, 256, 0, 0, cfg); /* several units a warp */
                check_rows_cfg(3, 2, 64, 96, 0, 0, cfg);
            }
}

TEST(rows_odd_shapes)
{
    for (int n = 1; n <= 8; n++) {
        check_rows(0, n, 8, 32, 1, 0);     /* one unit, k of two vectors a lane */
        check_rows(2, n, 40, 96, 0, 8);    /* a stage not whole; strided rows */
        check_rows(1, n, 16, 64, 1, 16);
        check_rows(3, n, 6144, 4096, 1, 0);
        check_rows(3, n, 24, 800, 0, 0);
    }
    check_rows(0, 3, 12, 64, 0, 0);  /* 6 pair units: not units of 8 rows */
    check_rows(2, 3, 16, 40, 0, 0);  /* k % 32 */
    check_rows(2, 8, 64, 20000, 0, 0); /* x past shared memory */
}

TEST(fused_llama3_8b)
{
    check_fused(0, 6144, 4096, 0);  /* QKV (norm prologue) */
    check_fused(2, 4096, 4096, 0);  /* O + residual */
    check_fused(1, 28672, 4096, 0); /* gate/up + SiLU */
    check_fused(2, 4096, 14336, 0); /* down + residual */
    check_fused(0, 128256, 4096, 0); /* the lm_head of a batch-1 step, the output norm in its prologue */
}

TEST(fused_qwen2_7b)
{
    check_fused(0, 4608, 3584, 1); /* QKV with bias */
    check_fused(2, 3584, 3584, 0);
    check_fused(1, 37888, 3584, 0);
    check_fused(2, 3584, 18944, 1);
}

TEST(fused_odd_shapes)
{
    check_fused(0, 7, 64, 1); /* an odd row count: the last warp's pair repeats a row */
    check_fused(2, 5, 8, 0);
    check_fused(1, 2, 16, 1);
    check_fused(2, 33, 16384, 1);
    check_fused(2, 3, 24, 0); /* k shorter than one stage of the ring */
}

/* The persistent-warp kernels at every ring depth, whatever the environment picks: shapes with
 * one unit per warp (O), several (gate/up), a long row (down), a unit count that leaves warps
 * idle, and k shorter than a stage. */
TEST(stream_depths)
{
    static const int cfg[] = { 23, 24, 25, 26, 13, 16, 33, 34 };
    for (size_t i = 0; i < SF_ARRAY_LEN(cfg); i++) {
        const int st = cfg[i], wide = st != 26 && st / 10 != 3; /* 26, 3x: no room for a 28 KiB x */
        check_fused_st(0, 6144, 4096, 0, st);
        check_fused_st(1, 28672, 4096, 0, st);
        check_fused_st(2, 4096, 4096, 0, st);
        if (wide) check_fused_st(2, 4096, 14336, 0, st);
        check_fused_st(0, 4608, 3584, 0, st);
        check_fused_st(2, 6, 24, 0, st);
        check_fused_st(1, 2, 16, 0, st);
    }
}

/* The persistent-warp GEMV without prologue or epilogue (the TP ranks' O and down at one row),
 * planned and at every configuration, with and without a bias, and shapes it hands to sf_k_gemv. */
TEST(stream_plain)
{
    check_fused(3, 4096, 2048, 0);  /* 8B TP=2 O */
    check_fused(3, 4096, 7168, 1);  /* 8B TP=2 down, with a bias */
    check_fused(3, 8192, 14336, 0); /* 70B TP=2 down */
    check_fused(3, 7, 64, 1);       /* an odd row count */
    check_fused(3, 64, 40000, 0);   /* x over 64 KiB: sf_k_gemv */
    static const int cfg[] = { 23, 26, 13, 33 };
    for (size_t i = 0; i < SF_ARRAY_LEN(cfg); i++) {
        check_fused_st(3, 4096, 2048, 0, cfg[i]);
        check_fused_st(3, 6, 24, 0, cfg[i]);
    }
}

TEST(gemv_tp_8b)
{
    check_plain(3072, 4096);
    check_plain(4096, 2048);
    check_plain(14336, 4096);
    check_plain(4096, 7168);
}

TEST(gemv_tp_70b)
{
    check_plain(5120, 8192);
    check_plain(8192, 4096);
    check_plain(28672, 8192);
    check_plain(8192, 14336);
}

/* The lm_head that draws its row (sf_k_gemv_norm_best, then sf_k_sample_best_put): its logits
 * are sf_k_gemv_norm's bit for bit, and the id put is sf_k_sample's over them with the same row
 * (greedy: also the host's rule, the largest value below best_n, NaN left out, the smaller id on
 * ties; 0 when none), in the device ids, the mapped host ids and the next step's token slot, both
 * words left at zero. Rows [0, nan) are NaN, and three rows (nan + 3, m / 2, m - 1) are the same
 * row, made the largest: a tie. temp > 0: the row is drawn at that temperature (seed, step). */
static void check_best(int m, int k, int nan, int best_n, float temp, uint64_t step)
{
    uint16_t *hx = NULL, *hnw = NULL, *hw = NULL, *y1 = NULL, *y2 = NULL;
    uint16_t *x = dev_rand(k, 1.0f, &hx), *nw = dev_rand(k, 1.0f, &hnw), *w = dev_rand((int64_t)m * k, 0.05f, &hw);
    unsigned long long *best = NULL, word[2];
    int32_t *ids = NULL, *hids = NULL, *hids_d = NULL, got[3] = { -1, -1, -1 };
    sf_k_sample_row *row = NULL;
    void *scratch = NULL;
    float *pen_val = NULL;
    double *xn = malloc((size_t)k * sizeof *xn);
    uint16_t *out = malloc((size_t)m * 2 * 2);
    REQUIRE(x && nw && w && xn && out && !cudaMalloc((void **)&y1, (size_t)m * 2) &&
                !cudaMalloc((void **)&y2, (size_t)m * 2) && !cudaMalloc((void **)&best, 16) &&
                !cudaMalloc((void **)&ids, 12) && !cudaMalloc((void **)&row, sizeof *row) &&
                !cudaMalloc(&scratch, SF_K_SAMPLE_SCRATCH) && !cudaMalloc((void **)&pen_val, 16) &&
                !cudaHostAlloc((void **)&hids, 4, cudaHostAllocMapped) &&
                !cudaHostGetDevicePointer((void **)&hids_d, hids, 0),
            "allocations failed");
    host_norm(hx, hnw, k, xn);
    const int tie[3] = { nan + 3, m / 2, m - 1 };
    for (int t = 0; t < 3; t++)
        for (int j = 0; j < k; j++) hw[(int64_t)tie[t] * k + j] = sf_f32_to_bf16(xn[j] < 0 ? -0.2f : 0.2f);
    for (int r = 0; r < nan; r++)
        for (int j = 0; j < k; j++) hw[(int64_t)r * k + j] = 0x7fc0;
    const sf_k_sample_row hrow = { .temperature = temp, .top_p = 1, .repetition_penalty = 1, .seed = 1234 + step,
                                   .step = step };
    REQUIRE(!cudaMemcpy(w, hw, (size_t)m * k * 2, cudaMemcpyHostToDevice) &&
                !cudaMemcpy(row, &hrow, sizeof hrow, cudaMemcpyHostToDevice) && !cudaMemset(scratch, 0, SF_K_SAMPLE_SCRATCH),
            "upload failed");
    CHECK_MSG(sf_k_gemv_norm_best_ok(x, nw, w, m, k), "m %d k %d: the kernel declines the shape", m, k);
    poison(y1, m);
    poison(y2, m);
    *hids = -1;
    cudaMemsetAsync(best, 0, 16, S);
    cudaMemsetAsync(ids, 0xff, 12, S);
    int rc = sf_k_gemv_norm(x, nw, 1e-5f, w, NULL, m, k, 0, y1, S);
    if (!rc) rc = sf_k_gemv_norm_best(x, nw, 1e-5f, w, NULL, m, k, y2, best, best_n, temp > 0 ? row : NULL, S);
    if (!rc) rc = sf_k_sample_best_put(best, ids, hids_d, ids + 1, S);
    if (!rc && best_n > 0) rc = sf_k_sample(y2, m, 1, best_n, row, NULL, 0, pen_val, ids + 2, NULL, NULL, scratch, S);
    if (!rc) rc = (int)cudaStreamSynchronize(S);
    CHECK_MSG(!rc, "m %d k %d: launch failed: %s", m, k, cudaGetErrorString((cudaError_t)rc));
    if (!rc) {
        cudaMemcpy(out, y1, (size_t)m * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(out + m, y2, (size_t)m * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(got, ids, 12, cudaMemcpyDeviceToHost);
        cudaMemcpy(word, best, sizeof word, cudaMemcpyDeviceToHost);
        int dirty = 0;
        for (size_t i = 0; i < SF_ARRAY_LEN(word); i++) dirty += word[i] != 0;
        int ref = -1;
        for (int i = 0; i < best_n; i++) {
            const float v = sf_bf16_to_f32(out[m + i]);
            if (v == v && (ref < 0 || v > sf_bf16_to_f32(out[m + ref]))) ref = i;
        }
        if (ref < 0) ref = 0;
        const int draw = best_n > 0 ? got[2] : 0; /* sf_k_sample's id (none over no row) */
        const int want = temp > 0 ? draw : best_n > tie[0] ? tie[0] : ref; /* greedy: the tie's first row */
        printf("      m %5d k %4d nan %d best_n %5d t %.1f: id %d (device %d, next %d; sf_k_sample %d, host argmax %d)\n",
               m, k, nan, best_n, temp, *hids, got[0], got[1], draw, ref);
        CHECK_MSG(!memcmp(out, out + m, (size_t)m * 2), "m %d: the logits differ from sf_k_gemv_norm's", m);
        CHECK_MSG(got[0] == want && got[1] == want && *hids == want && draw == want && (temp > 0 || ref == want) &&
                      !dirty,
                  "m %d best_n %d t %.1f: ids %d %d %d, sf_k_sample %d, host rule %d, want %d, %d words left set", m,
                  best_n, temp, got[0], got[1], *hids, draw, ref, want, dirty);
    }
    cudaFree(x); cudaFree(nw); cudaFree(w); cudaFree(y1); cudaFree(y2); cudaFree(best); cudaFree(ids);
    cudaFree(row); cudaFree(scratch); cudaFree(pen_val);
    cudaFreeHost(hids);
    free(hx); free(hnw); free(hw); free(xn); free(out);
}

TEST(head_draw)
{
    check_best(40000, 4096, 1, 40000, 0, 0); /* the lm_head's plan (past HEAD_ROWS) */
    check_best(40000, 4096, 1, 30000, 0, 0); /* the last tied row past best_n */
    check_best(513, 64, 2, 513, 0, 0);       /* odd: the last unit has one row */
    check_best(512, 64, 3, 3, 0, 0);         /* nothing but NaN below best_n: id 0 */
    check_best(512, 64, 0, 0, 0, 0);         /* no row: id 0 */
    for (int s = 0; s < 4; s++) {            /* drawn: sf_k_sample's Gumbel-max, bit for bit */
        check_best(40000, 4096, 1, 40000, s % 2 ? 100.0f : 1.0f, (uint64_t)s); /* 100: the others win */
        check_best(513, 64, 2, 500, 30.0f, (uint64_t)s); /* hot: the tie rarely wins */
    }
    check_best(512, 64, 3, 3, 0.7f, 9); /* nothing drawable: the fallback's 0 */
}

/* --quick (compute-sanitizer): every kernel and kind of launch once or a few times on small
 * shapes: the rows kernel at every row count and kind and at a spread of forced configurations,
 * the one-row fused and persistent-warp kernels at every ring depth, the plain GEMV. */
TEST(quick_all)
{
    for (int n = 2; n <= 6; n++) {
        check_rows(0, n, 256, 512, 1, 0);
        check_rows(2, n, 128, 1024, 0, 8);
        check_rows(1, n, 512, 512, 0, 0);
        check_rows(3, n, 256, 256, 1, 0);
    }
    check_rows(0, 3, 12, 64, 0, 0);    /* refused: not units of 8 rows */
    check_rows(2, 8, 64, 20000, 0, 0); /* refused: x past shared memory */
    static const int bd[] = { 13, 18, 26, 28 };
    for (int r = 1; r <= 3; r += 2)
        for (size_t j = 0; j < SF_ARRAY_LEN(bd); j++)
            for (int w8 = 0; w8 <= 1000; w8 += 1000) {
                const int cfg = w8 + r * 100 + bd[j];
                check_rows_cfg(0, 3, 384, 1024, 0, 0, cfg);
                check_rows_cfg(2, 5, 128, 2048, 0, 0, cfg);
                check_rows_cfg(3, 4, 2048, 256, 0, 0, cfg); /* several units a warp */
                check_rows_cfg(3, 2, 64, 96, 0, 0, cfg);
            }
    check_fused(0, 7, 64, 1);
    check_fused(2, 33, 2048, 1);
    check_fused(1, 512, 512, 0);
    check_fused(2, 3, 24, 0);
    static const int st[] = { 23, 24, 25, 26, 13, 16, 33, 34 };
    for (size_t i = 0; i < SF_ARRAY_LEN(st); i++) {
        check_fused_st(0, 384, 512, 0, st[i]);
        check_fused_st(1, 1024, 512, 0, st[i]);
        check_fused_st(2, 256, 1024, 0, st[i]);
        check_fused_st(2, 6, 24, 0, st[i]);
        check_fused_st(3, 256, 512, 0, st[i]); /* forced configurations take no bias */
    }
    check_fused(3, 256, 512, 1);
    check_plain(256, 512);
    check_best(513, 64, 2, 513, 0, 0);
    check_best(513, 64, 2, 500, 30.0f, 3);
}

TEST(bad_inputs)
{
    uint16_t *x = NULL, *w = NULL, *y = NULL;
    REQUIRE(!cudaMalloc((void **)&x, 4096) && !cudaMalloc((void **)&w, 65536) && !cudaMalloc((void **)&y, 4096),
            "cudaMalloc failed");
    CHECK(sf_k_gemv_add(x, w, NULL, 4, 12, y, S) != 0);           /* k % 8 */
    unsigned long long *best = (unsigned long long *)(y + 1024);
    CHECK(sf_k_gemv_norm_best(x, w, 1e-5f, w, NULL, 4, 12, y, best, 4, NULL, S) == (int)cudaErrorNotSupported); /* k % 8 */
    CHECK(sf_k_gemv_norm_best(x, w, 1e-5f, w, NULL, 4, 16, y, best, 5, NULL, S) == (int)cudaErrorInvalidValue); /* best_n > m */
    CHECK(sf_k_sample_best_put(NULL, (int32_t *)y, NULL, NULL, S) == (int)cudaErrorInvalidValue);
    CHECK(sf_k_gemv_add(x + 1, w, NULL, 4, 16, y, S) != 0);       /* misaligned x */
    CHECK(sf_k_gemv_norm(x, x, 1e-5f, w, NULL, 3, 16, 1, y, S) != 0); /* glu needs even m */
    CHECK(sf_k_gemv_norm(x, NULL, 1e-5f, w, NULL, 4, 16, 0, y, S) != 0);
    CHECK(sf_k_gemv(x, 16, w, NULL, 9, 4, 16, y, 4, S) != 0); /* n > 8 */
    CHECK(sf_k_gemv_stream_tune(2, 27, x, NULL, w, 4, 16, y, S) != 0); /* no such ring depth */
    CHECK(sf_k_gemv_stream_tune(2, 44, x, NULL, w, 4, 16, y, S) != 0); /* nor blocks per SM */
    CHECK(sf_k_gemv_stream_tune(4, 24, x, NULL, w, 4, 16, y, S) != 0); /* no such kind */
    CHECK(sf_k_gemv_stream_plain(x, w, NULL, 0, 16, y, S) != 0);      /* no rows */
    CHECK(sf_k_gemv_rows_add(x, 32, w, NULL, 9, 8, 32, y, 8, S) != 0);   /* n > 8 */
    CHECK(sf_k_gemv_rows_add(x, 32, w, NULL, 0, 8, 32, y, 8, S) != 0);   /* no rows */
    CHECK(sf_k_gemv_rows_add(x, 36, w, NULL, 2, 8, 32, y, 8, S) != 0);   /* ldx % 8 */
    CHECK(sf_k_gemv_rows_add(x, 32, w, NULL, 2, 8, 32, y, 4, S) != 0);   /* ldy < m */
    CHECK(sf_k_gemv_rows_norm(x, 32, NULL, 1e-5f, w, NULL, 2, 8, 32, 0, y, 8, S) != 0); /* no norm weight */
    CHECK(sf_k_gemv_rows_norm(x, 32, x, 1e-5f, w, NULL, 2, 6, 32, 1, y, 8, S) != 0);   /* glu: 3 pairs */
    CHECK(cudaStreamSynchronize(S) == cudaSuccess);
    cudaFree(x); cudaFree(w); cudaFree(y);
}

/* ---- perf: a decode layer's four fused GEMVs in a graph, at TP=1 and TP=2 shard shapes -------- */
static const char *env_or_unset(const char *name)
{
    const char *v = getenv(name);
    return v ? v : "unset";
}

/* Instantiates the captured graph g (and destroys it), replays it `reps` times after one warm-up
 * and returns the time per kernel in us (n kernels in g); NAN when it cannot run. */
static double graph_us(cudaGraph_t g, int n, int reps)
{
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = NAN;
    if (g && !cudaGraphInstantiate(&ge, g, 0) && !cudaEventCreate(&e0) && !cudaEventCreate(&e1)) {
        cudaGraphLaunch(ge, S);
        cudaEventRecord(e0, S);
        for (int r = 0; r < reps; r++) cudaGraphLaunch(ge, S);
        cudaEventRecord(e1, S);
        if (cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)) ms = NAN;
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return ms * 1000.0 / ((double)reps * n);
}

/* Device copy bandwidth (read + write bytes per second, GB/s) over 1 GiB, as `semflow hal`
 * measures its ceiling; NAN when it cannot run. */
static double copy_gbs(void)
{
    const size_t n = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = NAN;
    if (!cudaMalloc(&a, n) && !cudaMalloc(&b, n) && !cudaEventCreate(&e0) && !cudaEventCreate(&e1)) {
        cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, S);
        cudaEventRecord(e0, S);
        for (int r = 0; r < 10; r++) cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, S);
        cudaEventRecord(e1, S);
        if (cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1)) ms = NAN;
    }
    cudaGetLastError();
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * 10 * (double)n / (ms * 1e-3) / 1e9;
}

/* One layer's GEMV shapes: d model dim, qkv rows, o_k the O projection's k (its rows are d),
 * ff the FFN rows per gate/up half (down's k); vocab the lm_head's rows (0: none). */
typedef struct perf_shape {
    const char *name;
    int d, qkv, o_k, ff, vocab;
} perf_shape;

/* Launches op (0 QKV, 1 O, 2 gate/up, 3 down) of layer weights w with variant v: 0 the
 * dispatchers (per the environment); 1 gemv_fused.cu's ring (8 warps, 4 for add); else the
 * persistent-warp kernel with v = blocks per SM x 10 + ring stages. */
static int perf_launch(int op, int v, const perf_shape *p, const uint16_t *w, uint16_t *h, const uint16_t *nw,
                       uint16_t *q, const uint16_t *att, uint16_t *act)
{
    const int m[] = { p->qkv, p->d, 2 * p->ff, p->d }, k[] = { p->d, p->o_k, p->d, p->ff }, kind[] = { 0, 2, 1, 2 };
    const uint16_t *x = op == 1 ? att : op == 3 ? act : h;
    uint16_t *y = op == 0 ? q : op == 2 ? act : h;
    if (v == 0) {
        if (op == 1 || op == 3) return sf_k_gemv_add(x, w, NULL, m[op], k[op], y, S);
        return sf_k_gemv_norm(x, nw, 1e-5f, w, NULL, m[op], k[op], op == 2, y, S);
    }
    if (v == 1) return sf_k_gemv_fused_tune(kind[op], kind[op] == 2 ? 4 : 8, 201, x, nw, w, m[op], k[op], y, S);
    return sf_k_gemv_stream_tune(kind[op], v, x, nw, w, m[op], k[op], y, S);
}

/* Times the chain (QKV, O, gate/up, down, L layers of weights back to back in one graph, as the
 * backend launches them, no attention) and each op alone, with % of the copy bandwidth bw. */
static void perf_layers(const perf_shape *p, double bw, int variants)
{
    enum { L = 8, REPS = 20 };
    uint16_t *wt[4][L], *nw = NULL, *h = NULL, *q = NULL, *att = NULL, *act = NULL;
    const double mb[4] = { (double)p->qkv * p->d * 2 / 1e6, (double)p->d * p->o_k * 2 / 1e6,
                           2.0 * p->ff * p->d * 2 / 1e6, (double)p->d * p->ff * 2 / 1e6 };
    const int64_t n[4] = { (int64_t)p->qkv * p->d, (int64_t)p->d * p->o_k, 2LL * p->ff * p->d, (int64_t)p->d * p->ff };
    memset(wt, 0, sizeof wt);
    for (int l = 0; l < L; l++)
        for (int o = 0; o < 4; o++)
            if (!(wt[o][l] = dev_rand(n[o], 0.05f, NULL))) {
                printf("perf: %s: cudaMalloc of layer %d failed\n", p->name, l);
                goto cleanup;
            }
    nw = dev_rand(p->d, 1.0f, NULL); h = dev_rand(p->d, 1.0f, NULL); q = dev_rand(p->qkv, 1.0f, NULL);
    att = dev_rand(p->o_k, 1.0f, NULL); act = dev_rand(2 * p->ff, 1.0f, NULL);
    if (!nw || !h || !q || !att || !act) { printf("perf: %s: cudaMalloc failed\n", p->name); goto cleanup; }
    static const char *names[] = { "QKV (norm)", "O (add)", "gate/up (norm+glu)", "down (add)" };
    for (int op = -1; op < 4; op++) {
        static const int vars[] = { 0, 1, 24, 25, 26, 33, 34, 16 };
        const int nv = op < 0 || !variants ? 1 : (int)SF_ARRAY_LEN(vars);
        if (op >= 0) printf("perf: %-12s %-18s %5d x %5d:", p->name, names[op], op == 2 ? 2 * p->ff : op == 0 ? p->qkv : p->d,
                            op == 1 ? p->o_k : op == 3 ? p->ff : p->d);
        for (int vi = 0; vi < nv; vi++) {
            const int v = vars[vi];
            cudaGraph_t g = NULL;
            int rc = 0;
            if (cudaStreamBeginCapture(S, cudaStreamCaptureModeRelaxed)) { printf(" capture failed\n"); goto cleanup; }
            for (int l = 0; l < L; l++)
                for (int o = 0; o < 4; o++)
                    if (op < 0 || op == o) rc |= perf_launch(o, v, p, wt[o][l], h, nw, q, att, act);
            cudaStreamEndCapture(S, &g);
            double t = rc ? NAN : graph_us(g, L, REPS);
            if (rc && g) cudaGraphDestroy(g);
            if (rc) cudaGetLastError();
            const double gbs = (op < 0 ? mb[0] + mb[1] + mb[2] + mb[3] : mb[op]) / t * 1e3;
            if (op < 0)
                printf("perf: %-12s layer chain (QKV, O, gate/up, down): %.1f us per layer, %.0f GB/s = %.1f%% of copy "
                       "%.0f GB/s (%.1f MB; SEMFLOW_CUDA_GEMV_RING=%s)\n",
                       p->name, t, gbs, 100 * gbs / bw, bw, mb[0] + mb[1] + mb[2] + mb[3],
                       env_or_unset("SEMFLOW_CUDA_GEMV_RING"));
            else {
                char lab[16]; /* dispatch, ring4 (gemv_fused.cu), sBS (blocks per SM, stages) */
                snprintf(lab, sizeof lab, v == 0 ? "dispatch" : v == 1 ? "ring4" : "s%d", v);
                if (isnan(t)) printf(" %s -", lab);
                else printf(" %s %.1f us %.1f%%", lab, t, 100 * gbs / bw);
                if (v == 0) printf(variants ? ";" : "\n");
            }
        }
        if (op >= 0 && variants) printf("\n");
    }
cleanup:
    for (int l = 0; l < L; l++)
        for (int o = 0; o < 4; o++) cudaFree(wt[o][l]);
    cudaFree(nw); cudaFree(h); cudaFree(q); cudaFree(att); cudaFree(act);
}

/* The lm_head's one-row GEMV (vocab x d), as the backend may run it: gemv.cu's register GEMV
 * (what sf_k_gemm picks for one row against cuBLASLt), the persistent-warp kernel planned
 * (sf_k_gemv_stream_plain) and forced to blocks per SM x 10 + stages; REPS launches in a graph. */
static void perf_lm_head(const perf_shape *p, double bw)
{
    enum { REPS = 20 };
    const int64_t n = (int64_t)p->vocab * p->d;
    const double mb = (double)n * 2 / 1e6;
    uint16_t *w = dev_rand(n, 0.05f, NULL), *x = dev_rand(p->d, 1.0f, NULL), *y = dev_rand(p->vocab, 1.0f, NULL);
    static const int vars[] = { 0, 1, 24, 25, 26, 16 };
    if (!w || !x || !y) { printf("perf: %s: lm_head: cudaMalloc failed\n", p->name); goto cleanup; }
    printf("perf: %-12s %-18s %6d x %5d:", p->name, "lm_head (plain)", p->vocab, p->d);
    for (size_t vi = 0; vi < SF_ARRAY_LEN(vars); vi++) {
        const int v = vars[vi];
        cudaGraph_t g = NULL;
        int rc = 0;
        if (cudaStreamBeginCapture(S, cudaStreamCaptureModeRelaxed)) { printf(" capture failed\n"); goto cleanup; }
        for (int r = 0; r < REPS; r++)
            rc |= v == 0 ? sf_k_gemv(x, p->d, w, NULL, 1, p->vocab, p->d, y, p->vocab, S)
                  : v == 1 ? sf_k_gemv_stream_plain(x, w, NULL, p->vocab, p->d, y, S)
                           : sf_k_gemv_stream_tune(3, v, x, NULL, w, p->vocab, p->d, y, S);
        cudaStreamEndCapture(S, &g);
        double t = rc ? NAN : graph_us(g, REPS, 3);
        if (rc && g) cudaGraphDestroy(g);
        if (rc) cudaGetLastError();
        const double gbs = mb / t * 1e3;
        char lab[16];
        snprintf(lab, sizeof lab, v == 0 ? "gemv" : v == 1 ? "stream" : "s%d", v);
        if (isnan(t)) printf(" %s -", lab);
        else printf(" %s %.1f us %.1f%%", lab, t, 100 * gbs / bw);
    }
    printf("\n");
cleanup:
    cudaFree(w); cudaFree(x); cudaFree(y);
}

/* --perf-rows' launch of op (0 QKV, 1 O, 2 gate/up, 3 down; m, k its shape) over n rows: cfg 0
 * as the backend plans it, else that configuration (nonzero, nothing launched, when it does not
 * fit). */
static int rows_op(int op, int cfg, int n, const int *m, const int *k, const uint16_t *x, const uint16_t *nw,
                   const uint16_t *w, uint16_t *y)
{
    static const int kind[4] = { SF_K_ROWS_NORM, SF_K_ROWS_ADD, SF_K_ROWS_GLU, SF_K_ROWS_ADD };
    if (cfg) return sf_k_gemv_rows_tune(kind[op], cfg, n, x, nw, w, m[op], k[op], y, S);
    return kind[op] == SF_K_ROWS_ADD ? sf_k_gemv_rows_add(x, k[op], w, NULL, n, m[op], k[op], y, m[op], S)
                                     : sf_k_gemv_rows_norm(x, k[op], nw, 1e-5f, w, NULL, n, m[op], k[op], op == 2, y,
                                                           op == 2 ? m[op] / 2 : m[op], S);
}

/* Ends the capture begun for a --perf-rows variant (rc: its launches' errors), times the graph
 * (L kernels or layers in it) and prints "label us %" against mb megabytes at bw GB/s. */
static void rows_print(const char *lab, int rc, int L, int reps, double mb, double bw)
{
    cudaGraph_t g = NULL;
    cudaStreamEndCapture(S, &g);
    const double t = rc ? NAN : graph_us(g, L, reps);
    if (rc && g) cudaGraphDestroy(g);
    if (rc) cudaGetLastError();
    if (isnan(t)) printf(" %s -", lab);
    else printf(" %s %.1f %.0f%%", lab, t, 100 * mb / t * 1e3 / bw);
}

/* --perf-rows: each of a decode layer's fused GEMVs for the nn row counts ns (gemv_rows.cu) alone, L
 * layers of weights back to back in a graph (past L2): planned and at forced configurations
 * (as SEMFLOW_CUDA_GEMV_ROWS_CFG: gemv_rows.cu's cfg_valid), beside gemv.cu's skinny
 * GEMV of the same rows (no norm, no epilogue: what the general path's GEMM may run); us per
 * launch and % of the copy bandwidth bw. */
static void perf_rows(const perf_shape *p, double bw, const int *ns, int nn)
{
    enum { L = 8, REPS = 20 };
    uint16_t *wt[4][L], *nw = NULL, *h = NULL, *q = NULL, *att = NULL, *act = NULL, *gu = NULL;
    const int m[4] = { p->qkv, p->d, 2 * p->ff, p->d }, k[4] = { p->d, p->o_k, p->d, p->ff };
    static const int vars[] = { 0, -1, 316, 314, 313, 326, 324, 323, 116 };
    static const char *names[] = { "QKV (norm)", "O (add)", "gate/up (norm+glu)", "down (add)" };
    memset(wt, 0, sizeof wt);
    for (int l = 0; l < L; l++)
        for (int o = 0; o < 4; o++)
            if (!(wt[o][l] = dev_rand((int64_t)m[o] * k[o], 0.05f, NULL))) {
                printf("perf: %s: cudaMalloc of layer %d failed\n", p->name, l);
                goto cleanup;
            }
    nw = dev_rand(p->d, 1.0f, NULL); h = dev_rand(8LL * p->d, 1.0f, NULL); q = dev_rand(8LL * p->qkv, 1.0f, NULL);
    att = dev_rand(8LL * p->o_k, 1.0f, NULL); act = dev_rand(8LL * p->ff, 1.0f, NULL);
    gu = dev_rand(16LL * p->ff, 1.0f, NULL);
    if (!nw || !h || !q || !att || !act || !gu) { printf("perf: %s: cudaMalloc failed\n", p->name); goto cleanup; }
    /* the layer chain (QKV, O, gate/up, down; L layers in one graph), every op at one
     * configuration: what the op boundaries cost, with rings that leave room for the next op's
     * blocks (3 and 4 stages) or not; an op a configuration does not fit runs the plan */
    const uint16_t *xs[4] = { h, att, h, act }; /* each op's x and y, as a layer chains them */
    uint16_t *ys[4] = { q, h, act, h };
    for (int n = 2; n <= 4; n *= 2) {
        static const int cv[] = { 0, 316, 314, 313, 326, 324, 323 };
        const double mb = ((double)m[0] * k[0] + (double)m[1] * k[1] + (double)m[2] * k[2] + (double)m[3] * k[3]) * 2 / 1e6;
        printf("perf: %-8s n=%d layer chain (%.1f MB):", p->name, n, mb);
        for (size_t vi = 0; vi < SF_ARRAY_LEN(cv); vi++) {
            int rc = 0;
            if (cudaStreamBeginCapture(S, cudaStreamCaptureModeRelaxed)) { printf(" capture failed\n"); goto cleanup; }
            for (int l = 0; l < L; l++)
                for (int op = 0; op < 4; op++) /* an op the configuration does not fit takes the plan */
                    if (!cv[vi] || rows_op(op, cv[vi], n, m, k, xs[op], nw, wt[op][l], ys[op]))
                        rc |= rows_op(op, 0, n, m, k, xs[op], nw, wt[op][l], ys[op]);
            char lab[16];
            snprintf(lab, sizeof lab, cv[vi] ? "c%d" : "plan", cv[vi]);
            rows_print(lab, rc, L, REPS, mb, bw);
        }
        printf("\n");
    }
    for (int ni = 0; ni < nn; ni++)
        for (int op = 0, n = ns[ni]; op < 4; op++) {
            const double mb = (double)m[op] * k[op] * 2 / 1e6;
            printf("perf: %-8s n=%d %-18s %5d x %5d:", p->name, n, names[op], m[op], k[op]);
            for (size_t vi = 0; vi < SF_ARRAY_LEN(vars); vi++) {
                const int v = vars[vi];
                int rc = 0;
                if (cudaStreamBeginCapture(S, cudaStreamCaptureModeRelaxed)) { printf(" capture failed\n"); goto cleanup; }
                for (int l = 0; l < L; l++)
                    rc |= v < 0 ? sf_k_gemv(xs[op], k[op], wt[op][l], NULL, n, m[op], k[op], op == 2 ? gu : ys[op], m[op], S)
                                : rows_op(op, v, n, m, k, xs[op], nw, wt[op][l], ys[op]);
                char lab[16];
                snprintf(lab, sizeof lab, v == 0 ? "plan" : v < 0 ? "gemv.cu" : "c%d", v);
                rows_print(lab, rc, L, REPS, mb, bw);
            }
            printf("\n");
        }
cleanup:
    for (int l = 0; l < L; l++)
        for (int o = 0; o < 4; o++) cudaFree(wt[o][l]);
    cudaFree(nw); cudaFree(h); cudaFree(q); cudaFree(att); cudaFree(act); cudaFree(gu);
}

static void perf_all(void)
{
    static const perf_shape shapes[] = {
        { "8B", 4096, 6144, 4096, 14336, 128256 },  /* Llama-3-8B, TP=1 */
        { "8B/TP2", 4096, 3072, 2048, 7168, 0 },    /* its TP=2 shard */
        { "70B/TP2", 8192, 5120, 4096, 14336, 0 },  /* Llama-3-70B's TP=2 shard */
        { "Qwen2-7B", 3584, 4608, 3584, 18944, 152064 },
    };
    const double bw = copy_gbs();
    printf("perf: copy bandwidth %.0f GB/s (1 GiB device to device, read + write)\n", bw);
    for (size_t i = 0; i < SF_ARRAY_LEN(shapes); i++) {
        perf_layers(&shapes[i], bw, 1);
        if (shapes[i].vocab) perf_lm_head(&shapes[i], bw);
    }
}

int main(int argc, char **argv)
{
    int perf = argc > 1 && !strcmp(argv[1], "--perf"), perf_r = argc > 1 && !strcmp(argv[1], "--perf-rows");
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("test_gemv: no CUDA device (cudaGetDeviceCount found none): run it on the GPU host\n");
        return 77;
    }
    if (cudaStreamCreate(&S)) { printf("FAIL: stream: cudaStreamCreate failed\n"); return 1; }
    seed = (uint64_t)sf_now_ns();
    if (!perf && !perf_r) printf("seed %llu\n", (unsigned long long)seed);
    if (perf_r) {
        static const perf_shape p8b = { "8B", 4096, 6144, 4096, 14336, 0 };
        const double bw = copy_gbs();
        printf("perf: copy bandwidth %.0f GB/s; us per launch and %% of it (plan: as the backend runs them)\n", bw);
        int ns[8] = { 2, 4, 8 }, nn = 3; /* --perf-rows [N ...]: the row counts of the per-op rows */
        if (argc > 2) nn = 0;
        for (int i = 2; i < argc; i++) {
            char *end = NULL;
            const long v = strtol(argv[i], &end, 10);
            if (end == argv[i] || *end || v < 1 || v > SF_K_GEMV_ROWS_MAX || nn == (int)SF_ARRAY_LEN(ns)) {
                printf("test_gemv: --perf-rows takes up to %d row counts of 1 to %d, not '%s'\n",
                       (int)SF_ARRAY_LEN(ns), SF_K_GEMV_ROWS_MAX, argv[i]);
                return 2;
            }
            ns[nn++] = (int)v;
        }
        perf_rows(&p8b, bw, ns, nn);
        cudaStreamDestroy(S);
        return 0;
    }
    if (perf) {
        perf_all();
        cudaStreamDestroy(S);
        return 0;
    }
    if (quick) {
        RUN(quick_all);
        RUN(bad_inputs);
        cudaStreamDestroy(S);
        return test_summary();
    }
    RUN(rows_llama3_8b);
    RUN(rows_qwen2_7b);
    RUN(rows_odd_shapes);
    RUN(rows_configs);
    RUN(fused_llama3_8b);
    RUN(fused_qwen2_7b);
    RUN(fused_odd_shapes);
    RUN(stream_depths);
    RUN(stream_plain);
    RUN(gemv_tp_8b);
    RUN(gemv_tp_70b);
    RUN(head_draw);
    RUN(bad_inputs);
    printf("worst relative error against the float64 reference: one-row fused GEMVs %.3g, 2-8 rows %.3g\n",
           worst_fused, worst_rows);
    cudaStreamDestroy(S);
    return test_summary();
}
#else
int main(void)
{
    printf("test_gemv: built without CUDA: nothing to check\n");
    return 77;
}
#endif
