/* test_qgemv.c — GGUF block formats read in place on the GPU (qgemv.cu): the GEMV of 1-8 rows
 * and the rows into bf16, for Q8_0, Q4_K, Q5_K and Q6_K, against a float64 host reference from
 * tests/lib/quant_ref.h over fresh random blocks (the seed is printed): the GEMV against x
 * rounded to int8 per 32 as the kernel rounds it (||out - ref|| / ||ref|| <= 1e-2, the output's
 * bf16 rounding) and against x itself (<= 3e-2); with and without a bias, written and added;
 * outputs poisoned with NaN first, NaN never passing.
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

/* x rounded as the kernel rounds it (qr_round_x8) */
static void round_x(const uint16_t *x, int k, double *xr)
{
    float *v = malloc(sizeof(float) * k);
    for (int i = 0; i < k; i++) v[i] = sf_bf16_to_f32(x[i]);
    qr_round_x8(v, k);
    for (int i = 0; i < k; i++) xr[i] = v[i];
    free(v);
}

static void check_gemv(sf_dtype t, int m, int k, int n, int with_bias, int add)
{
    uint8_t *src;
    int64_t pitch;
    void *w = make_weight(t, m, k, &src, &pitch);
    const int blk = sf_dtype_block(t);
    const size_t bb = sf_dtype_bytes(t, blk), rb = sf_dtype_bytes(t, k);
    const int ldx = k + 8, ldy = m + 5;
    uint16_t *x = malloc(2 * (size_t)n * ldx), *bias = malloc(2 * (size_t)m), *y0 = malloc(2 * (size_t)n * ldy),
             *y = malloc(2 * (size_t)n * ldy);
    for (int64_t i = 0; i < (int64_t)n * ldx; i++) x[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) * 2 - 1));
    for (int i = 0; i < m; i++) bias[i] = sf_f32_to_bf16((float)(sf_rng_uniform(&R) - 0.5));
    for (int64_t i = 0; i < (int64_t)n * ldy; i++) y0[i] = add ? sf_f32_to_bf16((float)(sf_rng_uniform(&R) - 0.5)) : 0xffff;
    uint16_t *dx = to_dev(x, (size_t)n * ldx), *db = to_dev(bias, m), *dy = to_dev(y0, (size_t)n * ldy);
    REQUIRE(w && dx && db && dy, "device memory");
    int rc = sf_k_qgemv(t, w, pitch, m, k, dx, ldx, n, with_bias ? db : NULL, dy, ldy, add, S);
    CHECK_MSG(rc == 0 && cudaStreamSynchronize(S) == 0, "%s: launch %d", sf_dtype_name(t), rc);
    cudaMemcpy(y, dy, 2 * (size_t)n * ldy, cudaMemcpyDeviceToHost);
    double *xr = malloc(sizeof(double) * k), *wr = malloc(sizeof(double) * k);
    double num = 0, den = 0, numx = 0, denx = 0;
    int nan = 0, untouched = 0;
    for (int r = 0; r < m; r++) {
        for (int i = 0; i < k; i++) wr[i] = qr_value(t, src + rb * r + (size_t)(i / blk) * bb, i % blk);
        for (int tk = 0; tk < n; tk++) {
            round_x(x + (size_t)tk * ldx, k, xr);
            double s = 0, sx = 0;
            for (int i = 0; i < k; i++) {
                s += wr[i] * xr[i];
                sx += wr[i] * sf_bf16_to_f32(x[(size_t)tk * ldx + i]);
            }
            double base = (with_bias ? sf_bf16_to_f32(bias[r]) : 0) + (add ? sf_bf16_to_f32(y0[(size_t)tk * ldy + r]) : 0);
            double got = sf_bf16_to_f32(y[(size_t)tk * ldy + r]);
            if (isnan(got)) nan++;
            num += (got - s - base) * (got - s - base);
            den += (s + base) * (s + base);
            numx += (got - sx - base) * (got - sx - base);
            denx += (sx + base) * (sx + base);
        }
    }
    for (int tk = 0; tk < n; tk++) /* the padding past m stays as it was */
        for (int r = m; r < ldy; r++) untouched += y[(size_t)tk * ldy + r] == y0[(size_t)tk * ldy + r];
    double e = sqrt(num / den), ex = sqrt(numx / denx);
    /* against x unrounded, one dot of 256 may stray further than a row's worth of them */
    CHECK_MSG(!nan && e <= 1e-2 && ex <= (m * n >= 16 ? 3e-2 : 1e-1) && untouched == n * (ldy - m),
              "%s m %d k %d n %d bias %d add %d: rel err %.3g (against x unrounded %.3g), %d NaN, %d of %d padding kept",
              sf_dtype_name(t), m, k, n, with_bias, add, e, ex, nan, untouched, n * (ldy - m));
    printf("    %-5s m %5d k %5d n %d bias %d add %d: rel err %.2e (x unrounded %.2e)\n", sf_dtype_name(t), m, k, n,
           with_bias, add, e, ex);
    cudaFree(w); cudaFree(dx); cudaFree(db); cudaFree(dy);
    free(src); free(x); free(bias); free(y0); free(y); free(xr); free(wr);
}

TEST(qgemv_formats)
{
    static const struct { int m, k, n, bias, add; } cases[] = {
        { 96, 256, 1, 0, 0 },   { 1000, 4096, 1, 1, 0 }, { 300, 14336, 1, 0, 1 }, { 77, 512, 2, 1, 1 },
        { 130, 1024, 3, 0, 0 }, { 64, 4096, 4, 1, 0 },   { 33, 768, 5, 0, 1 },    { 200, 2048, 8, 1, 1 },
        { 1, 256, 1, 0, 0 },
    };
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t c = 0; c < SF_ARRAY_LEN(cases); c++)
            check_gemv(fmts[f], cases[c].m, cases[c].k, cases[c].n, cases[c].bias, cases[c].add);
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
    CHECK(sf_k_qgemv(SF_DT_Q4_0, w, 144, 4, 256, x, 256, 1, NULL, y, 4, 0, S) != 0);  /* not a device format */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 300, x, 304, 1, NULL, y, 4, 0, S) != 0);  /* not whole blocks */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x, 256, 9, NULL, y, 4, 0, S) != 0);  /* more rows than it takes */
    CHECK(sf_k_qgemv(SF_DT_Q4_K, w, 144, 4, 256, x + 1, 256, 1, NULL, y, 4, 0, S) != 0); /* x unaligned */
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
    static const struct { const char *name; int m, k; } shapes[] = {
        { "qkv", 6144, 4096 }, { "o", 4096, 4096 }, { "gate_up", 28672, 4096 }, { "down", 4096, 14336 }, { "lm_head", 128256, 4096 },
    };
    uint16_t *x = NULL, *y = NULL;
    if (cudaMalloc((void **)&x, 2 * 8 * 14336) || cudaMalloc((void **)&y, 2 * 8 * 128256)) return 1;
    cudaMemset(x, 0x3c, 2 * 8 * 14336);
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++)
        for (size_t s = 0; s < SF_ARRAY_LEN(shapes); s++)
            for (int n = 1; n <= 4; n *= 4) {
                sf_dtype t = fmts[f];
                int m = shapes[s].m, k = shapes[s].k;
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
                for (int i = 0; i < 10; i++) sf_k_qgemv(t, w + one * (i % copies), pitch, m, k, x, k, n, NULL, y, m, 0, S);
                cudaEventRecord(e0, S);
                for (int i = 0; i < iters; i++) sf_k_qgemv(t, w + one * (i % copies), pitch, m, k, x, k, n, NULL, y, m, 0, S);
                cudaEventRecord(e1, S);
                cudaEventSynchronize(e1);
                float ms = 0;
                cudaEventElapsedTime(&ms, e0, e1);
                double us = ms * 1e3 / iters, gbps = (double)one / (us * 1e-6) / 1e9;
                printf("  %-5s %-8s %6d x %5d n %d: %7.1f us  %6.0f GB/s  %5.1f%% of copy\n", sf_dtype_name(t),
                       shapes[s].name, m, k, n, us, gbps, 100 * gbps / bw);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                cudaFree(w);
            }
    cudaFree(x);
    cudaFree(y);
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
