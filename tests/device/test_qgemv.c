/* test_qgemv.c — GGUF block formats read in place on the GPU (qgemv.cu): the GEMV of 1-64 rows
 * and the rows into bf16, for Q8_0, Q4_K, Q5_K and Q6_K, against a float64 host reference from
 * tests/lib/quant_ref.h over fresh random blocks (the seed is printed): the GEMV against x
 * rounded to int8 per 32 as the kernel rounds it (||out - ref|| / ||ref|| <= 1e-2, the output's
 * bf16 rounding) and against x itself (<= 3e-2); with and without a bias, written and added,
 * with the RMSNorm in its pass and with gate/up's SiLU-gated pairs, and those fused calls
 * against the unfused kernels, steps of more rows than a launch takes; outputs poisoned with NaN
 * first, NaN never passing.
 *
 *   test_qgemv           the checks (GPU host only)
 *   test_qgemv --perf    time the GEMV at Llama-3-8B's shapes (one row of x) in each format,
 *                        weights rotated past L2, against the device's copy bandwidth */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../common/sf.h"
#include "../../hal/hal.h"
#include "../lib/quant_ref.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cuda/kernels.h"

static cudaStream_t S;
static sf_rng R;
static const sf_dtype fmts[] = { SF_DT_Q8_0, SF_DT_Q4_K, SF_DT_Q5_K, SF_DT_Q6_K };

/* m x k random blocks of t on the host (src) and packed on the device (returned) */
static void *make_weight(sf_dtype t, int m, int k, uint8_t **src, int64_t *pitch)
{
    int blk = sf_dtype_block(t);
    size_t bb = sf_dtype_bytes(t, blk), rb = sf_dtype_bytes(t, k);
    *pitch = (int64_t)sf_qdev_row_bytes(t, k);
    *src = malloc(rb * m);
    uint8_t *packed = malloc((size_t)*pitch * m);
    for (int64_t b = 0; b < (int64_t)m * k / blk; b++) sf_quant_random_block(t, *src + b * bb, &R);
    for (int r = 0; r < m; r++) sf_qdev_pack_row(t, *src + rb * r, k, packed + (size_t)*pitch * r);
    void *d = NULL;
    if (cudaMalloc(&d, (size_t)*pitch * m) || cudaMemcpy(d, packed, (size_t)*pitch * m, cudaMemcpyHostToDevice)) d = NULL;
    free(packed);
    return d;
}

static uint16_t *to_dev(const uint16_t *h, size_t n)
{
    uint16_t *d = NULL;
    if (cudaMalloc((void **)&d, n * 2) || cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice)) return NULL;
    return d;
}

/* x' of one row (x, or its RMSNorm times nw rounded as the kernel rounds it) unrounded in xu and
 * rounded to int8 per 32 as the kernel rounds it (qr_round_x8) in xr */
static void x_prime(const uint16_t *x, int k, const uint16_t *nw, float eps, double *xu, double *xr)
{
    float *v = malloc(sizeof(float) * k);
    double ss = 0;
    for (int i = 0; i < k; i++) {
        v[i] = sf_bf16_to_f32(x[i]);
        ss += (double)v[i] * v[i];
    }
    const float inv = 1.0f / sqrtf((float)(ss / k) + eps);
    for (int i = 0; nw && i < k; i++)
        v[i] = sf_bf16_to_f32(sf_f32_to_bf16(sf_bf16_to_f32(sf_f32_to_bf16(v[i] * inv)) * sf_bf16_to_f32(nw[i])));
    for (int i = 0; i < k; i++) xu[i] = v[i];
    qr_round_x8(v, k);
    for (int i = 0; i < k; i++) xr[i] = v[i];
    free(v);
}

typedef struct gemv_case {
    int m, k, n, bias, add, norm, glu;
} gemv_case;

static double silu(double g) { return g / (1 + exp(-g)); }

/* One call of sf_k_qgemv against the float64 reference: rel err against x' as the kernel rounds
 * it (<= 1e-2) and against x' unrounded; the padding past the outputs kept. */
static void check_gemv(sf_dtype t, gemv_case c)
{
    const int m = c.m, k = c.k, n = c.n, outs = c.glu ? m / 2 : m;
    const float eps = 1e-5f;
    uint8_t *src;
    int64_t pitch;
    void *w = make_weight(t, m, k, &src, &pitch);
    const int blk = sf_dtype_block(t);
    const size_t bb = sf_dtype_bytes(t, blk), rb = sf_dtype_bytes(t, k);
    const int ldx = k + 8, ldy = outs + 5;
    uint16_t *x = malloc(2 * (size_t)n * ldx), *bias = malloc(2 * (size_t)m), *y0 = malloc(2 * (size_t)n * ldy),
             *y = malloc(2 * (size_t)n * ldy), *nw = malloc(2 * (size_t)k);
    /* rows of different scales, so that the norm has something to undo */
    for (int64_t i = 0; i < (int64_t)n * ldx; i++)
        x[i] = sf_f32_to_bf16((float)((sf_rng_uniform(&R) * 2 - 1) * (1 + 3 * (i / ldx))));
    for (int i = 0; i < m; i++) bias[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) - 0.5));
    for (int i = 0; i < k; i++) nw[i] = sf_f32_to_bf16((float)(0.5 + sf_rng_uniform(&R)));
    for (int64_t i = 0; i < (int64_t)n * ldy; i++) y0[i] = c.add ? sf_f32_to_bf16((float)(sf_rng_uniform(&R) - 0.5)) : 0xffff;
    uint16_t *dx = to_dev(x, (size_t)n * ldx), *db = to_dev(bias, m), *dy = to_dev(y0, (size_t)n * ldy), *dnw = to_dev(nw, k);
    REQUIRE(w && dx && db && dy && dnw, "device memory");
    int rc = sf_k_qgemv(t, w, pitch, m, k, dx, ldx, n, c.norm ? dnw : NULL, eps, c.bias ? db : NULL, c.glu, dy, ldy, c.add, S);
    CHECK_MSG(rc == 0 && cudaStreamSynchronize(S) == 0, "%s: launch %d", sf_dtype_name(t), rc);
    cudaMemcpy(y, dy, 2 * (size_t)n * ldy, cudaMemcpyDeviceToHost);
    double *xr = malloc(sizeof(double) * n * k), *xu = malloc(sizeof(double) * n * k), *wr = malloc(sizeof(double) * k);
    double *dr = malloc(sizeof(double) * n * m), *du = malloc(sizeof(double) * n * m); /* [t][r] */
    for (int tk = 0; tk < n; tk++) x_prime(x + (size_t)tk * ldx, k, c.norm ? nw : NULL, eps, xu + (size_t)tk * k, xr + (size_t)tk * k);
    for (int r = 0; r < m; r++) {
        for (int i = 0; i < k; i++) wr[i] = qr_value(t, src + rb * r + (size_t)(i / blk) * bb, i % blk);
        for (int tk = 0; tk < n; tk++) {
            double s = 0, su = 0, b = c.bias ? sf_bf16_to_f32(bias[r]) : 0;
            for (int i = 0; i < k; i++) {
                s += wr[i] * xr[(size_t)tk * k + i];
                su += wr[i] * xu[(size_t)tk * k + i];
            }
            dr[(size_t)tk * m + r] = s + b;
            du[(size_t)tk * m + r] = su + b;
        }
    }
    double num = 0, den = 0, numx = 0, denx = 0;
    int nan = 0, untouched = 0;
    for (int tk = 0; tk < n; tk++)
        for (int u = 0; u < outs; u++) {
            const double *a = dr + (size_t)tk * m, *au = du + (size_t)tk * m;
            double base = c.add ? sf_bf16_to_f32(y0[(size_t)tk * ldy + u]) : 0;
            double ref = c.glu ? silu(a[u]) * a[outs + u] : a[u] + base;
            double refu = c.glu ? silu(au[u]) * au[outs + u] : au[u] + base;
            double got = sf_bf16_to_f32(y[(size_t)tk * ldy + u]);
            if (isnan(got)) nan++;
            num += (got - ref) * (got - ref);
            den += ref * ref;
            numx += (got - refu) * (got - refu);
            denx += refu * refu;
        }
    for (int tk = 0; tk < n; tk++) /* the padding past the outputs stays as it was */
        for (int r = outs; r < ldy; r++) untouched += y[(size_t)tk * ldy + r] == y0[(size_t)tk * ldy + r];
    double e = sqrt(num / den), ex = sqrt(numx / denx);
    /* against x unrounded only over 16 outputs or more: a single one (a GLU's product of two
     * dots, either near zero) may stray far */
    CHECK_MSG(!nan && e <= 1e-2 && (outs * n < 16 || ex <= 3e-2) && untouched == n * (ldy - outs),
              "%s m %d k %d n %d bias %d add %d norm %d glu %d: rel err %.3g (against x unrounded %.3g), %d NaN, "
              "%d of %d padding kept", sf_dtype_name(t), m, k, n, c.bias, c.add, c.norm, c.glu, e, ex, nan, untouched,
              n * (ldy - outs));
    printf("    %-5s m %5d k %5d n %d bias %d add %d norm %d glu %d: rel err %.2e (x unrounded %.2e)\n",
           sf_dtype_name(t), m, k, n, c.bias, c.add, c.norm, c.glu, e, ex);
    cudaFree(w); cudaFree(dx); cudaFree(db); cudaFree(dy); cudaFree(dnw);
    free(src); free(x); free(bias); free(y0); free(y); free(nw); free(xr); free(xu); free(wr); free(dr); free(du);
}

TEST(qgemv_formats)
{
    static const gemv_case cases[] = {
        { 96, 256, 1, 0, 0, 0, 0 },   { 1000, 4096, 1, 1, 0, 0, 0 }, { 300, 14336, 1, 0, 1, 0, 0 },
        { 77, 512, 2, 1, 1, 0, 0 },   { 130, 1024, 3, 0, 0, 0, 0 },  { 64, 4096, 4, 1, 0, 0, 0 },
        { 33, 768, 5, 0, 1, 0, 0 },   { 200, 2048, 8, 1, 1, 0, 0 },  { 1, 256, 1, 0, 0, 0, 0 },
        /* more rows than a launch takes: 8 at a time */
        { 70, 512, 13, 1, 1, 0, 0 },  { 40, 1024, 24, 0, 0, 0, 0 },
    };
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) check_gemv(fmts[f], cases[i]);
}

/* the RMSNorm in the GEMV's pass over x (QKV), and the SiLU-gated pair of rows (gate/up) */
TEST(qgemv_norm_glu)
{
    static const gemv_case cases[] = {
        { 512, 4096, 1, 0, 0, 1, 0 },  { 1000, 2048, 3, 1, 1, 1, 0 }, { 45, 256, 8, 0, 0, 1, 0 },
        { 600, 4096, 1, 0, 0, 1, 1 },  { 260, 1024, 5, 1, 0, 1, 1 },  { 128, 512, 8, 0, 0, 0, 1 },
        { 66, 256, 2, 1, 0, 1, 1 },    { 64, 256, 1, 0, 0, 1, 1 },
        /* more units than the resident grid has warps: the grid-stride loop and its prefetch */
        { 16384, 256, 2, 1, 0, 1, 1 }, { 9000, 256, 1, 1, 1, 1, 0 },
        /* more rows than a launch takes */
        { 96, 512, 11, 1, 0, 1, 1 },   { 50, 256, 17, 0, 1, 1, 0 },
    };
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) check_gemv(fmts[f], cases[i]);
}

/* The fused call against the unfused kernels it replaces (sf_k_rmsnorm, the GEMV, sf_k_silu_mul):
 * the same roundings, so the same values but where the two sums of squares round apart. */
TEST(qgemv_fused_matches_unfused)
{
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (int glu = 0; glu < 2; glu++) {
            sf_dtype t = fmts[f];
            const int m = 2 * 384, k = 2048, n = 3, outs = glu ? m / 2 : m;
            const float eps = 1e-6f;
            uint8_t *src;
            int64_t pitch;
            void *w = make_weight(t, m, k, &src, &pitch);
            uint16_t *x = malloc(2 * (size_t)n * k), *nw = malloc(2 * (size_t)k), *a = malloc(2 * (size_t)n * outs),
                     *b = malloc(2 * (size_t)n * outs);
            for (int64_t i = 0; i < (int64_t)n * k; i++) x[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) * 4 - 2));
            for (int i = 0; i < k; i++) nw[i] = sf_f32_to_bf16((float)(0.5 + sf_rng_uniform(&R)));
            uint16_t *dx = to_dev(x, (size_t)n * k), *dnw = to_dev(nw, k), *dn = NULL, *dgu = NULL, *d1 = NULL, *d2 = NULL;
            REQUIRE(w && dx && dnw && !cudaMalloc((void **)&dn, 2 * (size_t)n * k) &&
                        !cudaMalloc((void **)&dgu, 2 * (size_t)n * m) && !cudaMalloc((void **)&d1, 2 * (size_t)n * outs) &&
                        !cudaMalloc((void **)&d2, 2 * (size_t)n * outs),
                    "device memory");
            cudaMemset(d1, 0xff, 2 * (size_t)n * outs);
            cudaMemset(d2, 0xff, 2 * (size_t)n * outs);
            int rc = sf_k_rmsnorm(dx, k, NULL, 0, dnw, eps, n, k, dn, k, S);
            if (!rc) rc = sf_k_qgemv(t, w, pitch, m, k, dn, k, n, NULL, 0, NULL, 0, glu ? dgu : d1, glu ? m : outs, 0, S);
            if (!rc && glu) rc = sf_k_silu_mul(dgu, m, n, outs, d1, outs, S);
            if (!rc) rc = sf_k_qgemv(t, w, pitch, m, k, dx, k, n, dnw, eps, NULL, glu, d2, outs, 0, S);
            CHECK_MSG(rc == 0 && cudaStreamSynchronize(S) == 0, "%s glu %d: launch %d", sf_dtype_name(t), glu, rc);
            cudaMemcpy(a, d1, 2 * (size_t)n * outs, cudaMemcpyDeviceToHost);
            cudaMemcpy(b, d2, 2 * (size_t)n * outs, cudaMemcpyDeviceToHost);
            double num = 0, den = 0;
            int same = 0, nan = 0;
            for (int64_t i = 0; i < (int64_t)n * outs; i++) {
                double u = sf_bf16_to_f32(a[i]), v = sf_bf16_to_f32(b[i]);
                nan += isnan(u) || isnan(v);
                same += a[i] == b[i];
                num += (u - v) * (u - v);
                den += u * u;
            }
            double e = sqrt(num / den);
            CHECK_MSG(!nan && e <= 2e-3 && same >= n * outs * 9 / 10, "%s glu %d: fused against unfused rel err %.3g, "
                      "%d of %d equal, %d NaN", sf_dtype_name(t), glu, e, same, n * outs, nan);
            printf("    %-5s glu %d: fused against unfused rel err %.2e, %d of %d equal\n", sf_dtype_name(t), glu, e, same,
                   n * outs);
            cudaFree(w); cudaFree(dx); cudaFree(dnw); cudaFree(dn); cudaFree(dgu); cudaFree(d1); cudaFree(d2);
            free(src); free(x); free(nw); free(a); free(b);
        }
}

/* RoPE and the K/V write in the QKV GEMV's epilogue (sf_k_qgemv_rope, a launch a part: q and k
 * one part and v another, q another and k and v a third, or all three one) against the unfused
 * kernels it replaces (sf_k_rmsnorm, the GEMV, sf_k_rope_kv): the outputs and both caches,
 * poisoned alike first. Both conventions, a partial rotation, 1, 3 and 11 rows (slot -1: not
 * written). */
TEST(qgemv_rope_matches_unfused)
{
    enum { H = 4, HKV = 2, HD = 64, K = 512, BS = 16, NB = 4 };
    static const struct { int n, interleaved, rot, split; } cases[] = {
        { 1, 1, 64, (H + HKV) * HD }, { 3, 0, 64, (H + HKV) * HD }, { 3, 1, 32, H * HD }, { 1, 0, 32, (H + HKV) * HD },
        { 3, 0, 32, 0 },             { 11, 1, 64, H * HD },
    };
    const int m = (H + 2 * HKV) * HD, ldq = m + 8;
    const size_t cache = (size_t)NB * HKV * BS * HD;
    const int32_t pos[11] = { 5, 17, 1000, 2, 3, 4, 6, 7, 8, 9, 10 }, slot[11] = { 3, -1, 50, 4, 5, 6, 7, 8, 9, 10, 11 };
    float inv_freq[HD / 2] = { 0 };
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t c = 0; c < SF_ARRAY_LEN(cases); c++) {
            sf_dtype t = fmts[f];
            const int n = cases[c].n, rot = cases[c].rot, il = cases[c].interleaved, split = cases[c].split;
            for (int i = 0; i < rot / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * i / rot);
            uint8_t *src;
            int64_t pitch;
            uint8_t *w = make_weight(t, m, K, &src, &pitch);
            uint16_t *x = malloc(2 * (size_t)n * K), *nw = malloc(2 * K), *bias = malloc(2 * (size_t)m);
            for (int i = 0; i < n * K; i++) x[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) * 4 - 2));
            for (int i = 0; i < K; i++) nw[i] = sf_f32_to_bf16((float)(0.5 + sf_rng_uniform(&R)));
            for (int i = 0; i < m; i++) bias[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) - 0.5));
            uint16_t *dx = to_dev(x, (size_t)n * K), *dnw = to_dev(nw, K), *db = to_dev(bias, m), *dn = NULL;
            uint16_t *q[2] = { NULL, NULL }, *kc[2] = { NULL, NULL }, *vc[2] = { NULL, NULL };
            int32_t *dpos = NULL, *dslot = NULL;
            float *dfreq = NULL;
            int ok = w && dx && dnw && db && !cudaMalloc((void **)&dn, 2 * (size_t)n * K) &&
                     !cudaMalloc((void **)&dpos, sizeof pos) && !cudaMalloc((void **)&dslot, sizeof slot) &&
                     !cudaMalloc((void **)&dfreq, sizeof inv_freq);
            for (int j = 0; j < 2; j++)
                ok = ok && !cudaMalloc((void **)&q[j], 2 * (size_t)n * ldq) && !cudaMalloc((void **)&kc[j], 2 * cache) &&
                     !cudaMalloc((void **)&vc[j], 2 * cache) && !cudaMemset(q[j], 0xff, 2 * (size_t)n * ldq) &&
                     !cudaMemset(kc[j], 0xff, 2 * cache) && !cudaMemset(vc[j], 0xff, 2 * cache);
            REQUIRE(ok, "device memory");
            cudaMemcpy(dpos, pos, sizeof pos, cudaMemcpyHostToDevice);
            cudaMemcpy(dslot, slot, sizeof slot, cudaMemcpyHostToDevice);
            cudaMemcpy(dfreq, inv_freq, sizeof inv_freq, cudaMemcpyHostToDevice);
            sf_k_kv kv[2];
            for (int j = 0; j < 2; j++) kv[j] = (sf_k_kv){ .k = kc[j], .v = vc[j], .block_size = BS, .n_kv_heads = HKV, .head_dim = HD };
            /* unfused: the norm, the GEMV of each part, then RoPE and the cache */
            int rc = sf_k_rmsnorm(dx, K, NULL, 0, dnw, 1e-5f, n, K, dn, K, S);
            if (!rc) rc = sf_k_qgemv(t, w, pitch, m, K, dn, K, n, NULL, 0, db, 0, q[0], ldq, 0, S);
            if (!rc) rc = sf_k_rope_kv(q[0], ldq, n, dpos, dslot, H, HKV, HD, rot, il, dfreq, kv[0], S);
            /* fused: the parts [0, split) and [split, m) (split 0: one part), the second first */
            if (!rc && split)
                rc = sf_k_qgemv_rope(t, w + (size_t)split * pitch, pitch, m - split, split, K, dx, K, n, dnw, 1e-5f, db, H,
                                     HKV, HD, rot, il, dpos, dslot, dfreq, kv[1], q[1], ldq, S);
            if (!rc) rc = sf_k_qgemv_rope(t, w, pitch, split ? split : m, 0, K, dx, K, n, dnw, 1e-5f, db, H, HKV, HD, rot, il,
                                          dpos, dslot, dfreq, kv[1], q[1], ldq, S);
            CHECK_MSG(rc == 0 && cudaStreamSynchronize(S) == 0, "%s: launch %d", sf_dtype_name(t), rc);
            const size_t lens[3] = { (size_t)n * ldq, cache, cache };
            uint16_t *const bufs[3][2] = { { q[0], q[1] }, { kc[0], kc[1] }, { vc[0], vc[1] } };
            const char *names[3] = { "qkv", "k cache", "v cache" };
            for (int b = 0; b < 3; b++) {
                uint16_t *ha = malloc(2 * lens[b]), *hb = malloc(2 * lens[b]);
                cudaMemcpy(ha, bufs[b][0], 2 * lens[b], cudaMemcpyDeviceToHost);
                cudaMemcpy(hb, bufs[b][1], 2 * lens[b], cudaMemcpyDeviceToHost);
                double num = 0, den = 0;
                long same = 0, written = 0, mismatch_nan = 0;
                for (size_t i = 0; i < lens[b]; i++) {
                    double u = sf_bf16_to_f32(ha[i]), v = sf_bf16_to_f32(hb[i]);
                    same += ha[i] == hb[i];
                    if (isnan(u) || isnan(v)) { mismatch_nan += ha[i] != hb[i]; continue; }
                    written++;
                    num += (u - v) * (u - v);
                    den += u * u;
                }
                double e = den > 0 ? sqrt(num / den) : 0;
                /* what was written: every output row, and one cache row a kv head for each row with a slot */
                long want = b == 0 ? (long)n * m : (long)HKV * HD * (n == 1 ? 1 : n - 1);
                CHECK_MSG(!mismatch_nan && written == want && e <= 2e-3 && same >= (long)lens[b] * 9 / 10,
                          "%s n %d interleaved %d rot %d, %s: rel err %.3g, %ld of %zu equal, %ld written (want %ld), %ld "
                          "written by one only", sf_dtype_name(t), n, il, rot, names[b], e, same, lens[b], written, want,
                          mismatch_nan);
                free(ha);
                free(hb);
            }
            printf("    %-5s n %2d interleaved %d rot %2d split at %3d: fused RoPE + K/V against unfused checked\n",
                   sf_dtype_name(t), n, il, rot, split);
            for (int j = 0; j < 2; j++) { cudaFree(q[j]); cudaFree(kc[j]); cudaFree(vc[j]); }
            cudaFree(w); cudaFree(dx); cudaFree(dnw); cudaFree(db); cudaFree(dn); cudaFree(dpos); cudaFree(dslot);
            cudaFree(dfreq);
            free(src); free(x); free(nw); free(bias);
        }
}

/* rows by index (an embedding's gather, repeats and all) and a run of rows (a GEMM's chunk) */
TEST(qdequant_rows)
{
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++) {
        sf_dtype t = fmts[f];
        const int m = 50, k = 1536, n = 7, ldo = k + 24, blk = sf_dtype_block(t);
        const size_t bb = sf_dtype_bytes(t, blk), rb = sf_dtype_bytes(t, k);
        uint8_t *src;
        int64_t pitch;
        void *w = make_weight(t, m, k, &src, &pitch);
        int32_t ids[7] = { 3, 49, 0, 3, 17, 48, 25 }, *dids = NULL;
        uint16_t *out = malloc(2 * (size_t)n * ldo), *dout = NULL;
        REQUIRE(w && !cudaMalloc((void **)&dids, sizeof ids) && !cudaMalloc((void **)&dout, 2 * (size_t)n * ldo), "memory");
        cudaMemcpy(dids, ids, sizeof ids, cudaMemcpyHostToDevice);
        for (int pass = 0; pass < 2; pass++) {
            cudaMemset(dout, 0xff, 2 * (size_t)n * ldo);
            int rc = sf_k_qdequant(t, w, pitch, k, pass ? NULL : dids, pass ? 11 : 0, n, dout, ldo, S);
            CHECK_MSG(rc == 0 && cudaStreamSynchronize(S) == 0, "%s: launch %d", sf_dtype_name(t), rc);
            cudaMemcpy(out, dout, 2 * (size_t)n * ldo, cudaMemcpyDeviceToHost);
            int bad = 0;
            for (int i = 0; i < n; i++) {
                int r = pass ? 11 + i : ids[i];
                for (int c = 0; c < k; c++) {
                    double v = qr_value(t, src + rb * r + (size_t)(c / blk) * bb, c % blk);
                    double got = sf_bf16_to_f32(out[(size_t)i * ldo + c]);
                    bad += !(fabs(got - v) <= fabs(v) * 8e-3 + 1e-7);
                }
                for (int c = k; c < ldo; c++) bad += out[(size_t)i * ldo + c] != 0xffff;
            }
            CHECK_MSG(!bad, "%s %s: %d values wrong", sf_dtype_name(t), pass ? "run of rows" : "rows by index", bad);
        }
        cudaFree(w); cudaFree(dids); cudaFree(dout);
        free(src); free(out);
    }
}

TEST(qgemv_refuses)
{
    uint16_t *x = NULL, *y = NULL;
    void *w = NULL;
    REQUIRE(!cudaMalloc((void **)&x, 4096) && !cudaMalloc((void **)&y, 4096) && !cudaMalloc(&w, 65536), "memory");
    CHECK(sf_k_qgemv(SF_DT_Q4_0, w, 144, 4, 256, x, 256, 1, NULL, 0, NULL, 0, y, 4, 0, S) != 0);  /* not a device format */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 300, x, 304, 1, NULL, 0, NULL, 0, y, 4, 0, S) != 0);  /* not whole blocks */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x, 256, SF_K_QGEMV_MAX_N + 1, NULL, 0, NULL, 0, y, 4, 0, S) != 0); /* too many rows */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x + 1, 256, 1, NULL, 0, NULL, 0, y, 4, 0, S) != 0); /* x unaligned */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x, 256, 1, x + 1, 1e-5f, NULL, 0, y, 4, 0, S) != 0); /* norm unaligned */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 3, 256, x, 256, 1, NULL, 0, NULL, 1, y, 4, 0, S) != 0);  /* glu of odd rows */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x, 256, 1, NULL, 0, NULL, 1, y, 4, 1, S) != 0);  /* glu that adds */
    int32_t *ip = (int32_t *)y;
    sf_k_kv good = { .k = y, .v = y, .block_size = 16, .n_kv_heads = 1, .head_dim = 64 }, i8 = good, other = good;
    /* a part that is not whole heads, one past the weight, one not starting at a head, odd or too
     * wide a rotation, a cache of other heads or of INT8 blocks */
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 96, 0, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 64, 0, ip, ip, (float *)x,
                          good, y, 256, S) != 0);
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 128, 192, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 64, 0, ip, ip, (float *)x,
                          good, y, 256, S) != 0);
    i8.i8_base = 1;
    other.n_kv_heads = 2;
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 64, 32, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 64, 0, ip, ip, (float *)x,
                          good, y, 256, S) != 0);
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 64, 0, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 33, 0, ip, ip, (float *)x,
                          good, y, 256, S) != 0);
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 64, 0, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 66, 0, ip, ip, (float *)x,
                          good, y, 256, S) != 0);
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 64, 0, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 64, 0, ip, ip, (float *)x,
                          i8, y, 256, S) != 0);
    CHECK(sf_k_qgemv_rope(SF_DT_Q4_K, w, 144, 64, 0, 256, x, 256, 1, NULL, 0, NULL, 2, 1, 64, 64, 0, ip, ip, (float *)x,
                          other, y, 256, S) != 0);
    CHECK(sf_k_qdequant(SF_DT_Q3_K, w, 112, 256, NULL, 0, 1, y, 256, S) != 0);
    cudaGetLastError();
    cudaFree(x); cudaFree(y); cudaFree(w);
}

/* ---- --perf --------------------------------------------------------------------------- */
static double copy_gbps(void)
{
    size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) || cudaMalloc(&b, bytes)) return 0;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S);
    cudaEventRecord(e0, S);
    for (int i = 0; i < 10; i++) cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S);
    cudaEventRecord(e1, S);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * bytes * 10 / (ms * 1e-3) / 1e9;
}

static int perf(void)
{
    double bw = copy_gbps();
    printf("copy bandwidth %.0f GB/s\n", bw);
    /* +norm: the RMSNorm in the same pass; +glu: gate/up's SiLU-gated pairs as well */
    static const struct { const char *name; int m, k, norm, glu; } shapes[] = {
        { "qkv", 6144, 4096, 0, 0 },          { "qkv+norm", 6144, 4096, 1, 0 }, { "o", 4096, 4096, 0, 0 },
        { "gate_up", 28672, 4096, 0, 0 },     { "gate_up+glu", 28672, 4096, 1, 1 }, { "down", 4096, 14336, 0, 0 },
        { "lm_head", 128256, 4096, 0, 0 },
    };
    uint16_t *x = NULL, *y = NULL, *nwd = NULL;
    if (cudaMalloc((void **)&x, 2 * 8 * 14336) || cudaMalloc((void **)&y, 2 * 8 * 128256) ||
        cudaMalloc((void **)&nwd, 2 * 14336))
        return 1;
    cudaMemset(x, 0x3c, 2 * 8 * 14336);
    cudaMemset(nwd, 0x3f, 2 * 14336);
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t s = 0; s < SF_ARRAY_LEN(shapes); s++)
            for (int n = 1; n <= 4; n *= 4) {
                sf_dtype t = fmts[f];
                int m = shapes[s].m, k = shapes[s].k, glu = shapes[s].glu;
                const uint16_t *nw = shapes[s].norm ? nwd : NULL;
                int64_t pitch = (int64_t)sf_qdev_row_bytes(t, k);
                size_t one = (size_t)pitch * m;
                int copies = (int)SF_MAX(1, SF_MIN(16, ((size_t)512 << 20) / one)); /* past L2 */
                uint8_t *w = NULL;
                if (cudaMalloc((void **)&w, one * copies)) return 1;
                cudaMemset(w, 0x11, one * copies);
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                const int iters = 200;
                for (int i = 0; i < 10; i++) sf_k_qgemv(t, w + one * (i % copies), pitch, m, k, x, k, n, nw, 1e-5f, NULL, glu, y, m, 0, S);
                cudaEventRecord(e0, S);
                for (int i = 0; i < iters; i++) sf_k_qgemv(t, w + one * (i % copies), pitch, m, k, x, k, n, nw, 1e-5f, NULL, glu, y, m, 0, S);
                cudaEventRecord(e1, S);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                double us = ms * 1e3 / iters, gbps = (double)one / (us * 1e-6) / 1e9;
                printf("  %-5s %-11s %6d x %5d n %d: %7.1f us  %6.0f GB/s  %5.1f%% of copy\n", sf_dtype_name(t),
                       shapes[s].name, m, k, n, us, gbps, 100 * gbps / bw);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                cudaFree(w);
            }
    cudaFree(x);
    cudaFree(y);
    cudaFree(nwd);
    return cudaGetLastError() != cudaSuccess;
}

int main(int argc, char **argv)
{
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("test_qgemv: no CUDA device (cudaGetDeviceCount found none): run it on the GPU host\n");
        return 77;
    }
    cudaStreamCreate(&S);
    if (argc > 1 && !strcmp(argv[1], "--perf")) return perf();
    uint64_t seed = (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)seed);
    sf_rng_seed(&R, seed);
    RUN(qgemv_formats);
    RUN(qgemv_norm_glu);
    RUN(qgemv_fused_matches_unfused);
    RUN(qgemv_rope_matches_unfused);
    RUN(qdequant_rows);
    RUN(qgemv_refuses);
    return test_summary();
}
#else
int main(void)
{
    printf("test_qgemv: built without CUDA: nothing to check\n");
    return 77;
}
#endif
