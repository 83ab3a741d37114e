/* test_gemm.c — the GEMM dispatcher at the engine's real shapes (Llama-3-8B: QKV, O, gate/up,
 * down; n = decode batches and prefill chunks), with the measured algorithm choice on.
 *
 * Every case runs through the same entry points as the CUDA backend (sf_k_gemm, and
 * sf_k_gemm_lt_acc for the accumulating O and down projections) on fresh random inputs: the
 * output is poisoned with NaN first (the accumulating flavour starts from random values), every
 * output is checked for NaN and every column padding for writes, and a stratified sample of
 * columns (every row) is compared with a float64 host reference: |y - ref| <= 0.02 + 0.01 |ref|.
 * The tuner's disk cache is checked too: reused by a second context, ignored when corrupt,
 * made for another GPU or by an older format, or holding an algorithm cuBLASLt rejects.
 *
 *   test_gemm            the checks (GPU host only; exit 77 without a GPU)
 *   test_gemm --perf     also the tables: µs per call with the heuristic's first choice and with
 *                        the tuner's, against max(bytes / HBM, FLOPs / peak) from hal, at prefill
 *                        and saturated sizes (PERF) and at 8-32 rows (SMALL, bytes / HBM)
 *   test_gemm --fresh    tune into a temporary cache instead of this GPU's cache
 *   test_gemm --pretune  only tune the Llama-3-8B shapes at every bucket (lm_head: up to 256
 *                        rows) into this GPU's cache, as a deployment would once per GPU */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../hal/hal.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include "../../hal/hal_cuda_impl.h"
#include "../../kernels/cuda/kernels.h"

typedef struct shape {
    const char *name;
    int m, k, acc;
} shape;

static const shape SHAPES[] = {
    { "qkv", 6144, 4096, 0 }, { "o", 4096, 4096, 1 }, { "gate_up", 28672, 4096, 0 }, { "down", 4096, 14336, 1 },
};
static const int NS[] = { 128, 192, 256, 1500, 2048 };
/* --perf: the engine's shapes and their TP=2 shards (half the heads, half the FFN) */
static const shape PERF_SHAPES[] = {
    { "qkv", 6144, 4096, 0 },   { "o", 4096, 4096, 1 },     { "gate_up", 28672, 4096, 0 }, { "down", 4096, 14336, 1 },
    { "qkv/2", 3072, 4096, 0 }, { "o/2", 4096, 2048, 1 },   { "gu/2", 14336, 4096, 0 },    { "down/2", 4096, 7168, 1 },
};

static int perf, fresh, pretune;
static cudaStream_t S;
static sf_rng R;
static sf_hw_info HW;
static sf_k_gemm_ctx *G;   /* tuner on, this GPU's cache (or a fresh one) */
static char cache_path[1024], tmpdir[256];

#define CU(call) REQUIRE((call) == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(cudaGetLastError()))

static float bf(uint16_t h) { return sf_bf16_to_f32(h); }

/* A weight on the device and its host copy (uniform in [-3/sqrt(k), 3/sqrt(k)): outputs O(1)). */
typedef struct weight {
    int m, k;
    uint16_t *d, *h, *bias_d, *bias_h;
} weight;

static int weight_new(weight *w, int m, int k, int bias)
{
    memset(w, 0, sizeof *w);
    w->m = m; w->k = k;
    size_t n = (size_t)m * k;
    if (cudaMalloc((void **)&w->d, n * 2) != cudaSuccess || !(w->h = malloc(n * 2))) return -1;
    if (sf_k_fill_random(w->d, (int64_t)n, sf_rng_next(&R), 3.0f / sqrtf((float)k), S)) return -1;
    if (cudaMemcpyAsync(w->h, w->d, n * 2, cudaMemcpyDeviceToHost, S) != cudaSuccess) return -1;
    if (bias) {
        if (cudaMalloc((void **)&w->bias_d, (size_t)m * 2) != cudaSuccess || !(w->bias_h = malloc((size_t)m * 2)) ||
            sf_k_fill_random(w->bias_d, m, sf_rng_next(&R), 1.0f, S) ||
            cudaMemcpyAsync(w->bias_h, w->bias_d, (size_t)m * 2, cudaMemcpyDeviceToHost, S) != cudaSuccess)
            return -1;
    }
    return cudaStreamSynchronize(S) == cudaSuccess ? 0 : -1;
}

static void weight_free(weight *w)
{
    cudaFree(w->d); cudaFree(w->bias_d);
    free(w->h); free(w->bias_h);
}

/* One case through the dispatcher of g; returns 0 when it matches the reference. Prints the
 * tuner's decision for the case. */
static int check_case(sf_k_gemm_ctx *g, const char *name, const weight *w, int acc, int n, int pad)
{
    const int m = w->m, k = w->k;
    const int64_t ldx = k + pad, ldy = m + pad;
    uint16_t *x_d = NULL, *y_d = NULL, *x_h = NULL, *y0_h = NULL, *y_h = NULL;
    int fails = 0, rc;
    size_t xs = (size_t)n * ldx, ys = (size_t)n * ldy;
    if (cudaMalloc((void **)&x_d, xs * 2) || cudaMalloc((void **)&y_d, ys * 2) || !(x_h = malloc(xs * 2)) ||
        !(y0_h = malloc(ys * 2)) || !(y_h = malloc(ys * 2))) {
        printf("  %s n=%d: out of memory\n", name, n);
        fails = 1;
        goto out;
    }
    sf_k_fill_random(x_d, (int64_t)xs, sf_rng_next(&R), 1.0f, S);
    if (acc) sf_k_fill_random(y_d, (int64_t)ys, sf_rng_next(&R), 1.0f, S);
    else cudaMemsetAsync(y_d, 0xff, ys * 2, S); /* NaN */
    cudaMemcpyAsync(x_h, x_d, xs * 2, cudaMemcpyDeviceToHost, S);
    cudaMemcpyAsync(y0_h, y_d, ys * 2, cudaMemcpyDeviceToHost, S);
    rc = acc ? sf_k_gemm_lt_acc(g, x_d, ldx, w->d, w->bias_d, n, m, k, y_d, ldy, S)
             : sf_k_gemm(g, x_d, ldx, w->d, w->bias_d, n, m, k, y_d, ldy, S);
    if (rc) {
        printf("  %s n=%d: GEMM failed: %s\n", name, n, sf_k_gemm_error_str(rc));
        fails = 1;
        goto out;
    }
    cudaMemcpyAsync(y_h, y_d, ys * 2, cudaMemcpyDeviceToHost, S);
    if (cudaStreamSynchronize(S) != cudaSuccess) {
        printf("  %s n=%d: %s\n", name, n, cudaGetErrorString(cudaGetLastError()));
        fails = 1;
        goto out;
    }
    long nan = 0, pad_bad = 0;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++) nan += isnan(bf(y_h[(size_t)i * ldy + j]));
        for (int j = m; j < ldy; j++) pad_bad += memcmp(&y_h[(size_t)i * ldy + j], &y0_h[(size_t)i * ldy + j], 2) != 0;
    }
    /* rows: all up to 256, else 256 strata; columns: about 3e7 / (rows k) strata of m (at least
     * 32); one random pick per stratum, the first and last row and column always */
    int nr = n < 256 ? n : 256;
    int nc = (int)fmin(m, fmax(32, 3e7 / ((double)nr * k)));
    double worst = 0, num = 0, den = 0;
    int wi = 0, wj = 0;
    float *xf = malloc((size_t)k * sizeof *xf);
    for (int c = 0; c < nc && xf; c++) {
        int j0 = (int)((int64_t)c * m / nc), j1 = (int)((int64_t)(c + 1) * m / nc);
        int j = c == 0 ? 0 : c == nc - 1 ? m - 1 : j0 + (int)(sf_rng_next(&R) % (uint64_t)(j1 - j0));
        const uint16_t *wr = w->h + (size_t)j * k;
        for (int kk = 0; kk < k; kk++) xf[kk] = bf(wr[kk]);
        for (int r = 0; r < nr; r++) {
            int r0 = (int)((int64_t)r * n / nr), r1 = (int)((int64_t)(r + 1) * n / nr);
            int i = r == 0 ? 0 : r == nr - 1 ? n - 1 : r0 + (int)(sf_rng_next(&R) % (uint64_t)(r1 - r0));
            const uint16_t *xr = x_h + (size_t)i * ldx;
            double s = (acc ? bf(y0_h[(size_t)i * ldy + j]) : 0.0) + (w->bias_h ? bf(w->bias_h[j]) : 0.0);
            double d[4] = { 0, 0, 0, 0 };
            for (int kk = 0; kk + 3 < k; kk += 4)
                for (int u = 0; u < 4; u++) d[u] += (double)bf(xr[kk + u]) * xf[kk + u];
            for (int kk = k & ~3; kk < k; kk++) d[0] += (double)bf(xr[kk]) * xf[kk];
            s += (d[0] + d[1]) + (d[2] + d[3]);
            double got = bf(y_h[(size_t)i * ldy + j]), e = fabs(got - s) / (0.02 + 0.01 * fabs(s));
            if (!(e <= worst)) { worst = isnan(e) ? INFINITY : e; wi = i; wj = j; }
            num += (got - s) * (got - s);
            den += s * s;
        }
    }
    free(xf);
    double rel = den > 0 ? sqrt(num / den) : 0;
    sf_k_gemm_tune_stat st;
    int tuned = sf_k_gemm_tune_info(g, n, m, k, w->bias_d != NULL, acc, &st);
    printf("  %-8s m=%-5d k=%-5d n=%-4d%s%s: %dx%d checked, worst %.2f of tolerance, rel %.1e; %s", name, m, k, n,
           acc ? " acc" : "", pad ? " padded" : "", nr, nc, worst, rel, tuned ? "" : "not tuned\n");
    if (tuned)
        printf("bucket %d: %.1f us vs heuristic %.1f us (%d candidates, %s)\n", st.nb, st.us, st.heuristic_us,
               st.n_candidates, st.from_cache ? "from cache" : "tuned now");
    if (nan || pad_bad || !(worst <= 1.0) || !(rel <= 1e-2)) {
        printf("  %s n=%d: %ld NaN outputs, %ld padding writes, worst at [%d, %d]\n", name, n, nan, pad_bad, wi, wj);
        fails = 1;
    }
out:
    cudaFree(x_d); cudaFree(y_d);
    free(x_h); free(y0_h); free(y_h);
    return fails;
}

/* ---- tests -------------------------------------------------------------------------------- */
TEST(engine_shapes)
{
    for (size_t s = 0; s < SF_ARRAY_LEN(SHAPES); s++) {
        weight w;
        REQUIRE(weight_new(&w, SHAPES[s].m, SHAPES[s].k, 0) == 0, "cannot make the %s weight", SHAPES[s].name);
        for (size_t i = 0; i < SF_ARRAY_LEN(NS); i++)
            CHECK_MSG(check_case(G, SHAPES[s].name, &w, SHAPES[s].acc, NS[i], 0) == 0, "%s n=%d", SHAPES[s].name, NS[i]);
        weight_free(&w);
    }
    CHECK(sf_k_gemm_tune_spent(G) < 120);
}

/* Inside a bucket (tuned at its upper end), padded leading dimensions, a bias epilogue, small n. */
TEST(odd_shapes)
{
    weight w;
    REQUIRE(weight_new(&w, 6144, 4096, 1) == 0, "cannot make the weight");
    CHECK(check_case(G, "qkv+bias", &w, 0, 200, 0) == 0);
    CHECK(check_case(G, "qkv+bias", &w, 0, 256, 8) == 0);
    CHECK(check_case(G, "qkv+bias", &w, 1, 100, 0) == 0);
    CHECK(check_case(G, "qkv+bias", &w, 0, 16, 0) == 0);
    CHECK(check_case(G, "qkv+bias", &w, 0, 5, 0) == 0); /* GEMV / cuBLASLt choice, untuned */
    weight_free(&w);
}

static sf_k_gemm_ctx *ctx_with_cache(const char *path)
{
    sf_k_gemm_ctx *g = NULL;
    if (sf_k_gemm_ctx_new(&g, NULL)) return NULL;
    if (sf_k_gemm_tune_enable(g, path, 60.0)) { sf_k_gemm_ctx_free(g); return NULL; }
    return g;
}

/* A second context (a restarted process) takes the winners from the disk cache. */
TEST(cache_reused)
{
    sf_k_gemm_ctx *g = ctx_with_cache(cache_path);
    REQUIRE(g, "cannot make a context");
    sf_k_gemm_tune_stat st;
    CHECK(sf_k_gemm_tune_info(g, 256, 28672, 4096, 0, 0, &st) == 1 && st.from_cache);
    CHECK(sf_k_gemm_tune_info(g, 128, 4096, 14336, 0, 1, &st) == 1 && st.from_cache);
    weight w;
    REQUIRE(weight_new(&w, 4096, 4096, 0) == 0, "cannot make the weight");
    CHECK(check_case(g, "o", &w, 1, 256, 0) == 0);
    CHECK_MSG(sf_k_gemm_tune_spent(g) == 0, "%.3f s tuned although cached", sf_k_gemm_tune_spent(g));
    weight_free(&w);
    sf_k_gemm_ctx_free(g);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

/* Garbage, another GPU's cache, an older or retired format, a rejected algorithm: each ignored,
 * the shape tuned again and still correct. */
TEST(cache_distrusted)
{
    char path[512], text[2048], gpu[256];
    int drv = 0, dev = 0;
    struct cudaDeviceProp p;
    CU(cudaGetDevice(&dev));
    CU(cudaGetDeviceProperties(&p, dev));
    CU(cudaDriverGetVersion(&drv));
    snprintf(gpu, sizeof gpu, "%s", p.name);
    snprintf(path, sizeof path, "%s/bad.json", tmpdir);
    weight w;
    REQUIRE(weight_new(&w, 1024, 2048, 0) == 0, "cannot make the weight");
    const char *bad_algo = "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"
                           "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";
    /* 0: not JSON; 1: another GPU's; 2: an older format; 3: an algorithm cuBLASLt rejects; 4: the
     * retired version 3 (own-kernel fields) */
    for (int variant = 0; variant < 5; variant++) {
        if (variant == 0) write_file(path, "{\"version\": 2, \"gpu\": tru");
        else {
            snprintf(text, sizeof text,
                     "{\"version\": %d, \"gpu\": \"%s\", \"driver\": %d, \"cublaslt\": %zu, \"entries\": [{\"m\": "
                     "1024, \"k\": 2048, \"bias\": 0, \"acc\": 0, \"n\": 64, \"algo\": \"%s\", \"us\": 1.0, "
                     "\"heuristic_us\": 2.0, \"candidates\": 3%s}]}",
                     variant == 2 ? 1 : variant == 4 ? 3 : 2, variant == 1 ? "Another GPU" : gpu, drv,
                     cublasLtGetVersion(), bad_algo,
                     variant == 4 ? ", \"own\": 2, \"own_us\": 0.5, \"lt_us\": 1.0, \"own_best\": 2" : "");
            write_file(path, text);
        }
        sf_k_gemm_ctx *g = ctx_with_cache(path);
        REQUIRE(g, "cannot make a context");
        sf_k_gemm_tune_stat st;
        int had = sf_k_gemm_tune_info(g, 64, 1024, 2048, 0, 0, &st);
        CHECK_MSG(variant == 3 ? had == 1 : had == 0, "variant %d: entry %s", variant, had ? "loaded" : "missing");
        CHECK_MSG(check_case(g, "cache", &w, 0, 64, 0) == 0, "variant %d", variant);
        if (variant != 3) {
            CHECK_MSG(sf_k_gemm_tune_info(g, 64, 1024, 2048, 0, 0, &st) == 1 && !st.from_cache && st.n_candidates > 0,
                      "variant %d: not tuned again", variant);
            sf_k_gemm_ctx *g2 = ctx_with_cache(path); /* the rewritten cache is good */
            CHECK_MSG(g2 && sf_k_gemm_tune_info(g2, 64, 1024, 2048, 0, 0, &st) == 1 && st.from_cache,
                      "variant %d: cache not rewritten", variant);
            sf_k_gemm_ctx_free(g2);
        }
        sf_k_gemm_ctx_free(g);
    }
    weight_free(&w);
}

/* Every bucket of every Llama-3-8B GEMM (the lm_head for up to 256 logit rows). */
TEST(pretune)
{
    static const int buckets[] = { 16, 24, 32, 48, 64, 96, 128, 192, 256 }; /* the tuned ones */
    double t0 = sf_now_s();
    int n_tuned = 0;
    for (size_t s = 0; s <= SF_ARRAY_LEN(SHAPES); s++) {
        int lm = s == SF_ARRAY_LEN(SHAPES), m = lm ? 128256 : SHAPES[s].m, k = lm ? 4096 : SHAPES[s].k;
        int acc = lm ? 0 : SHAPES[s].acc;
        for (size_t i = 0; i < SF_ARRAY_LEN(buckets) && (!lm || buckets[i] <= 256); i++) {
            int rc = sf_k_gemm_prepare(G, NULL, buckets[i], m, k, k, m, acc, S);
            CHECK_MSG(rc == 0, "m=%d k=%d n=%d: %s", m, k, buckets[i], sf_k_gemm_error_str(rc));
            sf_k_gemm_tune_stat st;
            n_tuned += sf_k_gemm_tune_info(G, buckets[i], m, k, 0, acc, &st) && st.n_candidates > 0;
        }
    }
    printf("pretune: %d shapes x buckets decided in %.1f s (%.1f s of it tuning)\n", n_tuned, sf_now_s() - t0,
           sf_k_gemm_tune_spent(G));
}

/* ---- perf --------------------------------------------------------------------------------- */
/* Mean µs of one call over reps calls rotating over `copies` weights (each streamed from HBM). */
static double time_calls(sf_k_gemm_ctx *g, const uint16_t *w, size_t w_elems, int copies, const uint16_t *x,
                         uint16_t *y, int n, int m, int k, int acc)
{
    cudaEvent_t e0, e1;
    float ms = 0;
    int reps = 20, rc = 0;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = -2; r < reps && !rc; r++) { /* two untimed calls: the first may tune */
        if (r == 0) cudaEventRecord(e0, S);
        const uint16_t *wc = w + (size_t)((r + 2) % copies) * w_elems;
        rc = acc ? sf_k_gemm_lt_acc(g, x, k, wc, NULL, n, m, k, y, m, S) : sf_k_gemm(g, x, k, wc, NULL, n, m, k, y, m, S);
    }
    cudaEventRecord(e1, S);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc ? NAN : 1e3 * ms / reps;
}

static void perf_table(void)
{
    sf_k_gemm_ctx *off = NULL;
    if (sf_k_gemm_ctx_new(&off, NULL)) return;
    printf("\nGEMM per call (weights rotated past L2), bound = max(bytes / %.0f GB/s, FLOPs / %.0f TFLOP/s):\n",
           HW.mem_bw_gbs, HW.gemm_tflops);
    printf("PERF %-8s %6s %6s %5s %9s %9s %8s %9s %6s %6s\n", "shape", "m", "k", "n", "heur_us", "tuned_us",
           "TFLOP/s", "bound_us", "heur%", "tuned%");
    for (size_t s = 0; s < SF_ARRAY_LEN(PERF_SHAPES); s++) {
        const shape *sh = &PERF_SHAPES[s];
        size_t we = (size_t)sh->m * sh->k, wb = we * 2;
        int copies = wb >= 2 * HW.l2_bytes ? 1 : (int)fmin(16, ceil(3.0 * HW.l2_bytes / wb));
        int nmax = NS[SF_ARRAY_LEN(NS) - 1];
        uint16_t *w = NULL, *x = NULL, *y = NULL;
        if (cudaMalloc((void **)&w, wb * copies) || cudaMalloc((void **)&x, (size_t)nmax * sh->k * 2) ||
            cudaMalloc((void **)&y, (size_t)nmax * sh->m * 2)) {
            printf("PERF %s: out of device memory\n", sh->name);
            cudaGetLastError();
        } else {
            for (int c = 0; c < copies; c++) sf_k_fill_random(w + c * we, (int64_t)we, 7 + c, 3.0f / sqrtf(sh->k), S);
            sf_k_fill_random(x, (int64_t)nmax * sh->k, 5, 1.0f, S);
            cudaMemsetAsync(y, 0, (size_t)nmax * sh->m * 2, S);
            for (size_t i = 0; i < SF_ARRAY_LEN(NS); i++) {
                int n = NS[i];
                double t0 = time_calls(off, w, we, copies, x, y, n, sh->m, sh->k, sh->acc);
                double t1 = time_calls(G, w, we, copies, x, y, n, sh->m, sh->k, sh->acc);
                double bytes = wb + (double)n * sh->k * 2 + (double)n * sh->m * 2 * (sh->acc ? 2 : 1);
                double flops = 2.0 * sh->m * (double)n * sh->k;
                double bound = fmax(bytes / (HW.mem_bw_gbs * 1e3), flops / (HW.gemm_tflops * 1e6));
                printf("PERF %-8s %6d %6d %5d %9.1f %9.1f %8.0f %9.1f %5.0f%% %5.0f%%\n", sh->name, sh->m, sh->k, n, t0,
                       t1, flops / (t1 * 1e6), bound, 100 * bound / t0, 100 * bound / t1);
            }
        }
        cudaFree(w); cudaFree(x); cudaFree(y);
    }
    /* steps of 8-32 sequences (buckets 16-32 are tuned; 8 takes the GEMV / cuBLASLt choice) */
    static const int small[] = { 8, 12, 16, 24, 32 };
    printf("\nGEMM per call at 8-32 rows (weights rotated past L2), bound = bytes / %.0f GB/s:\n", HW.mem_bw_gbs);
    printf("SMALL %-8s %6s %6s %4s %8s %8s %8s %6s %6s\n", "shape", "m", "k", "n", "heur_us", "tuned_us", "bound_us",
           "heur%", "tuned%");
    for (size_t s = 0; s < SF_ARRAY_LEN(PERF_SHAPES); s++) {
        const shape *sh = &PERF_SHAPES[s];
        size_t we = (size_t)sh->m * sh->k, wb = we * 2;
        int copies = wb >= 2 * HW.l2_bytes ? 1 : (int)fmin(16, ceil(3.0 * HW.l2_bytes / wb));
        uint16_t *w = NULL, *x = NULL, *y = NULL;
        if (cudaMalloc((void **)&w, wb * copies) || cudaMalloc((void **)&x, (size_t)32 * sh->k * 2) ||
            cudaMalloc((void **)&y, (size_t)32 * sh->m * 2)) {
            printf("SMALL %s: out of device memory\n", sh->name);
            cudaGetLastError();
        } else {
            for (int c = 0; c < copies; c++) sf_k_fill_random(w + c * we, (int64_t)we, 7 + c, 3.0f / sqrtf(sh->k), S);
            sf_k_fill_random(x, (int64_t)32 * sh->k, 5, 1.0f, S);
            cudaMemsetAsync(y, 0, (size_t)32 * sh->m * 2, S);
            for (size_t i = 0; i < SF_ARRAY_LEN(small); i++) {
                int n = small[i];
                double t0 = time_calls(off, w, we, copies, x, y, n, sh->m, sh->k, sh->acc);
                double t1 = time_calls(G, w, we, copies, x, y, n, sh->m, sh->k, sh->acc);
                double bound = (wb + (double)n * sh->k * 2 + (double)n * sh->m * 2 * (sh->acc ? 2 : 1)) /
                               (HW.mem_bw_gbs * 1e3);
                printf("SMALL %-8s %6d %6d %4d %8.1f %8.1f %8.1f %5.0f%% %5.0f%%\n", sh->name, sh->m, sh->k, n, t0, t1,
                       bound, 100 * bound / t0, 100 * bound / t1);
            }
        }
        cudaFree(w); cudaFree(x); cudaFree(y);
    }
    printf("tuning time in this process: %.2f s\n", sf_k_gemm_tune_spent(G));
    sf_k_gemm_ctx_free(off);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf")) perf = 1;
        else if (!strcmp(argv[i], "--fresh")) fresh = 1;
        else if (!strcmp(argv[i], "--pretune")) pretune = 1;
        else {
            fprintf(stderr, "usage: test_gemm [--perf] [--fresh] [--pretune]\n");
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a run cut by a timeout keeps what it printed */
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("test_gemm: no CUDA GPU here; skipped\n");
        return 77;
    }
    sf_rng_seed(&R, (uint64_t)sf_now_ns()); /* fresh inputs every run; the seed is printed */
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    sf_error err = { 0 };
    if (sf_hal_cuda_probe(0, &HW, 0, &err)) {
        printf("FAIL: probe: %s\n", err.msg);
        return 1;
    }
    const char *td = test_tmpdir();
    snprintf(tmpdir, sizeof tmpdir, "%s", td ? td : "/tmp");
    char bus[64] = "";
    if (fresh || cudaDeviceGetPCIBusId(bus, sizeof bus, 0) != cudaSuccess ||
        sf_hal_cuda_cache_path(bus, "gemm-cuda", cache_path, sizeof cache_path) != 0)
        snprintf(cache_path, sizeof cache_path, "%s/gemm-cuda.json", tmpdir);
    printf("%s, cache %s\n", HW.name, cache_path);
    if (cudaSetDevice(0) || cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking) || !(G = ctx_with_cache(cache_path))) {
        printf("FAIL: setup: cannot make a stream and a GEMM context\n");
        return 1;
    }
    if (pretune) {
        RUN(pretune);
        sf_k_gemm_ctx_free(G);
        cudaStreamDestroy(S);
        return test_summary();
    }
    RUN(engine_shapes);
    RUN(odd_shapes);
    RUN(cache_reused);
    RUN(cache_distrusted);
    if (perf) perf_table();
    sf_k_gemm_ctx_free(G);
    cudaStreamDestroy(S);
    return test_summary();
}

#else
int main(void)
{
    printf("test_gemm: built without CUDA; skipped\n");
    return 77;
}
#endif
