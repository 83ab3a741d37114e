/* test_smallops.c — the bandwidth-bound CUDA kernels (rmsnorm with the residual add, silu_mul,
 * add, embed / get_rows, rope_kv with the paged K/V write) called through kernels.h, against the
 * CPU references of kernels/cpu (float math on the same bf16-representable inputs), over token
 * counts 1 .. 2048 and the hidden sizes / head layouts of the supported models. Outputs and the
 * KV cache are poisoned with NaN before each call; a NaN never passes, and cache rows a call must
 * not write must still hold the poison afterwards.
 *
 *   test_smallops          the checks (GPU host only; exits 77 without a GPU)
 *   test_smallops --perf   also time each op at Llama-3-8B shapes over n = 1 .. 2048: µs per
 *                          call, GB/s of the bytes it must move, share of hal's HBM figure
 *
 * Tolerances: bf16 keeps 8 significant bits; the kernels round where the stored stream is bf16
 * (residual sum, normalised row, act(gate)), the references do not, so an element may differ by
 * a few bf16 ulps: |got - ref| <= 2^-6 |ref| + 2^-8 rms(ref), and relative L2 <= 1e-2. Copies
 * (embed, get_rows) and the add are exact. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/sf.h"
#include "../../hal/hal.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cpu/cpu.h"
#include "../../kernels/cuda/kernels.h"

static sf_rng R;
static int perf;
static const int NS[] = { 1, 7, 64, 256, 1500, 2048 };
#define N_NS (int)(sizeof NS / sizeof NS[0])

/* ---- helpers ------------------------------------------------------------------------------ */
static float bfr(float x) { return sf_bf16_to_f32(sf_f32_to_bf16(x)); }

/* n bf16-representable values, uniform with standard deviation `scale` (uniform, not normal:
 * tens of millions of them per run). */
static float *rand_vals(int64_t n, float scale)
{
    float *v = malloc((size_t)n * sizeof *v);
    const float a = 2.0f * 1.7320508f * scale;
    for (int64_t i = 0; i < n; i++) v[i] = bfr((sf_rng_uniform(&R) - 0.5f) * a);
    return v;
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 16) != cudaSuccess) {
        printf("cudaMalloc(%zu) failed\n", bytes);
        return NULL;
    }
    return p;
}

/* Device bf16 copy of v[n] (rows of `cols` values at stride `ld` when ld > cols). */
static uint16_t *upload(const float *v, int64_t rows, int64_t cols, int64_t ld)
{
    uint16_t *h = malloc((size_t)(rows * ld) * 2), *d = dalloc((size_t)(rows * ld) * 2);
    for (int64_t i = 0; i < rows * ld; i++) h[i] = 0xffff; /* padding: NaN */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) h[r * ld + c] = sf_f32_to_bf16(v[r * cols + c]);
    if (d) cudaMemcpy(d, h, (size_t)(rows * ld) * 2, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

/* rows x cols floats read back from a bf16 device matrix with leading dimension ld. */
static float *download(const uint16_t *d, int64_t rows, int64_t cols, int64_t ld)
{
    uint16_t *h = malloc((size_t)(rows * ld) * 2);
    float *v = malloc((size_t)(rows * cols) * sizeof *v);
    cudaMemcpy(h, d, (size_t)(rows * ld) * 2, cudaMemcpyDeviceToHost);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) v[r * cols + c] = sf_bf16_to_f32(h[r * ld + c]);
    free(h);
    return v;
}

static uint16_t *poisoned(int64_t n)
{
    uint16_t *d = dalloc((size_t)n * 2);
    if (d) cudaMemset(d, 0xff, (size_t)n * 2); /* 0xffff: NaN */
    return d;
}

/* Element-wise and L2 check of got against ref (n values); exact: bit-equal as floats.
 * Reports the first bad element under `what`. */
static int close_enough(const char *what, const float *got, const float *ref, int64_t n, int exact)
{
    double ss = 0, se = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)ref[i] * ref[i];
    double rms = sqrt(ss / (double)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        int bad = isnan(got[i]) || isinf(got[i]) != isinf(ref[i]) ||
                  (exact ? got[i] != ref[i] : d > fabs(ref[i]) / 64.0 + rms / 256.0);
        if (bad) {
            CHECK_MSG(0, "%s: element %lld is %g, reference %g (rms %g)", what, (long long)i, got[i], ref[i], rms);
            return 0;
        }
        se += d * d;
    }
    double rel = ss > 0 ? sqrt(se / ss) : sqrt(se);
    CHECK_MSG(rel <= 1e-2, "%s: relative L2 error %.3g > 1e-2", what, rel);
    return rel <= 1e-2;
}

static int kcheck(int rc, const char *what)
{
    if (!rc) rc = (int)cudaDeviceSynchronize();
    CHECK_MSG(rc == 0, "%s: %s", what, cudaGetErrorString((cudaError_t)rc));
    return rc == 0;
}

/* The launch's status (rc, then a synchronise), then rows x cols of the bf16 device matrix d
 * (leading dimension ld) against ref under close_enough. 0 when the launch failed. */
static int launched_close(int rc, const char *what, const uint16_t *d, int64_t rows, int64_t cols, int64_t ld,
                          const float *ref, int exact)
{
    if (!kcheck(rc, what)) return 0;
    float *got = download(d, rows, cols, ld);
    close_enough(what, got, ref, rows * cols, exact);
    free(got);
    return 1;
}

/* ---- rmsnorm (+ residual add) ----------------------------------------------------------- */
/* variant: NULL for sf_k_rmsnorm, else {vpt, prefetch_w, rows_per_block} of sf_k_rmsnorm_tune */
static void rmsnorm_case_v(int n, int d, int with_add, int in_place, int64_t pad, const int *variant)
{
    char what[128];
    snprintf(what, sizeof what, "rmsnorm n=%d d=%d add=%d in_place=%d ld=+%lld variant=%d/%d/%d", n, d, with_add,
             in_place, (long long)pad, variant ? variant[0] : 0, variant ? variant[1] : 0, variant ? variant[2] : 0);
    const int64_t ld = d + pad;
    float *x = rand_vals((int64_t)n * d, 1.0f), *a = rand_vals((int64_t)n * d, 0.5f), *w = rand_vals(d, 1.0f);
    uint16_t *dx = upload(x, n, d, ld), *da = upload(a, n, d, ld), *dw = upload(w, 1, d, d);
    uint16_t *dout = in_place ? dx : poisoned((int64_t)n * ld);
    float *out = malloc((size_t)n * d * sizeof *out);
    if (!dx || !da || !dw || !dout) goto cleanup;
    /* reference: the residual stream as the kernel stores it (bf16), then the norm */
    if (with_add)
        for (int64_t i = 0; i < (int64_t)n * d; i++) x[i] = bfr(x[i] + a[i]);
    sf_cpu_rmsnorm ref = { .x = x, .add = NULL, .w = w, .out = out, .n = n, .d = d, .eps = 1e-5f };
    sf_cpu_rmsnorm_task(&ref, 0, 1);
    const uint16_t *dadd = with_add ? da : NULL;
    int rc = variant ? sf_k_rmsnorm_tune(variant[0], variant[1], variant[2], dx, ld, dadd, ld, dw, 1e-5f, n, d, dout,
                                         ld, NULL)
                     : sf_k_rmsnorm(dx, ld, dadd, ld, dw, 1e-5f, n, d, dout, ld, NULL);
    if (!launched_close(rc, what, dout, n, d, ld, out, 0)) goto cleanup;
    if (with_add && !in_place) { /* the updated residual, exactly bf16(x + add) */
        float *gx = download(dx, n, d, ld);
        char w2[128];
        snprintf(w2, sizeof w2, "%s residual", what);
        close_enough(w2, gx, x, (int64_t)n * d, 1);
        free(gx);
    }
cleanup:
    if (dout != dx) cudaFree(dout);
    cudaFree(dx); cudaFree(da); cudaFree(dw);
    free(x); free(a); free(w); free(out);
}

static void rmsnorm_case(int n, int d, int with_add, int in_place, int64_t pad)
{
    rmsnorm_case_v(n, d, with_add, in_place, pad, NULL);
}

/* The variants --perf times (sf_k_rmsnorm_tune at d = 4096). */
static const int RN_VARIANTS[][3] = { { 2, 0, 1 }, { 2, 1, 1 }, { 1, 0, 1 }, { 4, 0, 1 }, { 2, 0, 2 },
                                      { 1, 0, 2 }, { 2, 1, 4 }, { 1, 1, 4 }, { 2, 1, 8 }, { 1, 1, 8 } };
#define N_RN_VARIANTS (int)(sizeof RN_VARIANTS / sizeof RN_VARIANTS[0])

TEST(rmsnorm)
{
    for (int v = 0; v < N_RN_VARIANTS; v++) {
        rmsnorm_case_v(7, 4096, 1, 0, 0, RN_VARIANTS[v]);  /* odd n: a block's second row missing */
        rmsnorm_case_v(256, 4096, 0, 1, 8, RN_VARIANTS[v]);
    }
    for (int i = 0; i < N_NS; i++) rmsnorm_case(NS[i], 4096, 1, 0, 0);
    for (int i = 0; i < N_NS; i += 2) {
        rmsnorm_case(NS[i], 3584, 1, 0, 0);
        rmsnorm_case(NS[i + 1], 8192, 1, 0, 0);
        rmsnorm_case(NS[i], 4096, 0, 1, 0);
    }
    rmsnorm_case(64, 896, 1, 0, 8);     /* small rows, padded leading dimension */
    rmsnorm_case(7, 16384, 1, 0, 0);    /* the widest row of the one-pass path */
    rmsnorm_case(64, 100, 1, 0, 3);     /* element-wise path: d % 8 != 0 */
    rmsnorm_case(3, 20000, 1, 0, 0);    /* element-wise path: wider than the one-pass path */
}

/* ---- silu_mul ------------------------------------------------------------------------------ */
static void silu_case(int n, int f, int64_t pad_out)
{
    char what[96];
    snprintf(what, sizeof what, "silu_mul n=%d f=%d ldo=+%lld", n, f, (long long)pad_out);
    float *gu = rand_vals((int64_t)n * 2 * f, 2.0f), *out = malloc((size_t)n * f * sizeof *out);
    gu[0] = -100.0f; /* exp overflow side of the sigmoid */
    if (n * f > 1) gu[1] = 60.0f;
    const int64_t ldo = f + pad_out;
    uint16_t *dgu = upload(gu, n, 2 * f, 2 * f), *dout = poisoned((int64_t)n * ldo);
    if (!dgu || !dout) goto cleanup;
    sf_cpu_silu_mul ref = { .gu = gu, .out = out, .n = n, .f = f };
    sf_cpu_silu_mul_task(&ref, 0, 1);
    launched_close(sf_k_silu_mul(dgu, 2 * f, n, f, dout, ldo, NULL), what, dout, n, f, ldo, out, 0);
cleanup:
    cudaFree(dgu); cudaFree(dout);
    free(gu); free(out);
}

TEST(silu_mul)
{
    for (int i = 0; i < N_NS; i++) silu_case(NS[i], 14336, 0);
    for (int i = 0; i < N_NS; i += 2) silu_case(NS[i], 18944, 8);
    silu_case(256, 11008, 0);
    silu_case(33, 100, 0); /* element-wise path */
    silu_case(5, 4, 1);
}

/* ---- add --------------------------------------------------------------------------------- */
static void add_case(int n, int d, int64_t pad)
{
    char what[96];
    snprintf(what, sizeof what, "add n=%d d=%d ld=+%lld", n, d, (long long)pad);
    const int64_t ld = d + pad;
    float *y = rand_vals((int64_t)n * d, 1.0f), *a = rand_vals((int64_t)n * d, 1.0f);
    uint16_t *dy = upload(y, n, d, ld), *da = upload(a, n, d, ld);
    if (!dy || !da) goto cleanup;
    for (int64_t i = 0; i < (int64_t)n * d; i++) y[i] = bfr(y[i] + a[i]);
    launched_close(sf_k_add(dy, ld, da, ld, n, d, NULL), what, dy, n, d, ld, y, 1);
cleanup:
    cudaFree(dy); cudaFree(da);
    free(y); free(a);
}

TEST(add)
{
    for (int i = 0; i < N_NS; i++) add_case(NS[i], 4096, 0);
    add_case(256, 3584, 8);
    add_case(64, 8192, 0);
    add_case(17, 100, 3); /* element-wise path */
}

/* ---- embed / get_rows -------------------------------------------------------------------------- */
static void embed_case(int T, int vocab, int d)
{
    char what[96];
    snprintf(what, sizeof what, "embed T=%d vocab=%d d=%d", T, vocab, d);
    float *emb = rand_vals((int64_t)vocab * d, 1.0f), *ref = malloc((size_t)T * d * sizeof *ref);
    int32_t *ids = malloc((size_t)T * 4), *did = dalloc((size_t)T * 4);
    for (int t = 0; t < T; t++) ids[t] = (int32_t)(sf_rng_next(&R) % (uint64_t)vocab);
    if (T > 3) { ids[1] = -1; ids[2] = vocab; } /* out of range: zero rows */
    for (int t = 0; t < T; t++)
        for (int c = 0; c < d; c++) ref[(int64_t)t * d + c] = ids[t] >= 0 && ids[t] < vocab ? emb[(int64_t)ids[t] * d + c] : 0;
    uint16_t *demb = upload(emb, vocab, d, d), *dx = poisoned((int64_t)T * d), *dr = poisoned((int64_t)T * d);
    if (!demb || !dx || !dr || !did) goto cleanup;
    cudaMemcpy(did, ids, (size_t)T * 4, cudaMemcpyHostToDevice);
    if (!launched_close(sf_k_embed(demb, vocab, d, did, T, dx, d, NULL), what, dx, T, d, d, ref, 1)) goto cleanup;
    /* get_rows: rows of the embedded matrix back in reverse order */
    for (int t = 0; t < T; t++) ids[t] = T - 1 - t;
    cudaMemcpy(did, ids, (size_t)T * 4, cudaMemcpyHostToDevice);
    snprintf(what, sizeof what, "get_rows n=%d d=%d", T, d);
    float *back = malloc((size_t)T * d * sizeof *back);
    sf_cpu_get_rows(ref, d, ids, T, back);
    launched_close(sf_k_get_rows(dx, d, did, T, d, dr, d, NULL), what, dr, T, d, d, back, 1);
    free(back);
cleanup:
    cudaFree(demb); cudaFree(dx); cudaFree(dr); cudaFree(did);
    free(emb); free(ref); free(ids);
}

TEST(embed_get_rows)
{
    for (int i = 0; i < N_NS; i++) embed_case(NS[i], 3000, 4096);
    embed_case(64, 500, 8192);
    embed_case(9, 300, 100); /* element-wise path */
}

/* ---- rope_kv ----------------------------------------------------------------------------- */
typedef struct rope_shape {
    int H, Hkv, hd, rot, interleaved, int8;
} rope_shape;

/* T tokens of up to 3 sequences at positions p0 + i (p0 > 0 random), slots through a random
 * block table (block size 16) over a pool of bf16 blocks (and INT8 units when sh.int8);
 * every 37th token has slot -1 (not written). */
static void rope_case_v(int T, rope_shape sh, int threads, int target)
{
    char what[160];
    snprintf(what, sizeof what, "rope_kv T=%d H=%d Hkv=%d hd=%d rot=%d %s%s variant=%d/%d", T, sh.H, sh.Hkv, sh.hd,
             sh.rot, sh.interleaved ? "pairs" : "halves", sh.int8 ? " int8" : "", threads, target);
    const int H = sh.H, Hkv = sh.Hkv, hd = sh.hd, NH = H + 2 * Hkv, bs = 16, half = sh.rot / 2;
    const int64_t ld = (int64_t)NH * hd + 8; /* padded rows */
    const int nb = 2 * ((T + bs - 1) / bs + 4) + 8; /* bf16 blocks; INT8 units live in the top half */
    const int64_t rows = (int64_t)nb * Hkv * bs, cache_n = rows * hd;
    float *qkv = rand_vals((int64_t)T * NH * hd, 1.0f), *inv = malloc((size_t)(half ? half : 1) * 4);
    int32_t *pos = malloc((size_t)T * 4), *slot = malloc((size_t)T * 4);
    for (int i = 0; i < half; i++) inv[i] = powf(500000.0f, -2.0f * i / (float)sh.rot);
    if (half > 4) inv[half - 1] *= 0.125f; /* an llama3-scaled low frequency */
    /* block ids: a random permutation of the bf16 blocks of the lower half, or INT8 units of the
     * upper half (unit u = id - nb lies in bf16 block u / 2) */
    int n_ids = nb / 2, *perm = malloc((size_t)n_ids * sizeof *perm);
    for (int i = 0; i < n_ids; i++) perm[i] = i;
    for (int i = n_ids - 1; i > 0; i--) {
        int j = (int)(sf_rng_next(&R) % (uint64_t)(i + 1)), x = perm[i];
        perm[i] = perm[j]; perm[j] = x;
    }
    int used = 0, t = 0;
    for (int s = 0; s < 3 && t < T; s++) {
        int len = s == 2 ? T - t : SF_MIN(T - t, (T + 2) / 3);
        int p0 = 1 + (int)(sf_rng_next(&R) % 3000);
        int first_blk = used;
        for (int i = 0; i < len; i++, t++) {
            pos[t] = p0 + i;
            int b = first_blk + (p0 % bs + i) / bs;
            if (b >= n_ids) b = n_ids - 1; /* cannot happen with the pool sized above */
            used = SF_MAX(used, b + 1);
            int id = perm[b];
            /* with int8: odd entries of the table are INT8 units u = nb + 2 perm[b] (id nb + u),
             * which lie in bf16 blocks of the upper half, never handed out as bf16 here */
            if (sh.int8 && (b & 1)) id = 2 * nb + 2 * perm[b];
            slot[t] = (i % 37 == 36) ? -1 : id * bs + (p0 + i) % bs;
        }
    }
    uint16_t *dqkv = upload(qkv, T, (int64_t)NH * hd, ld);
    uint16_t *kc = poisoned(cache_n), *vc = poisoned(cache_n);
    float *ksc = dalloc((size_t)2 * rows * 4), *vsc = dalloc((size_t)2 * rows * 4);
    float *dinv = dalloc((size_t)(half ? half : 1) * 4);
    int32_t *dpos = dalloc((size_t)T * 4), *dslot = dalloc((size_t)T * 4);
    uint16_t *hk = malloc((size_t)cache_n * 2), *hv = malloc((size_t)cache_n * 2);
    float *hks = malloc((size_t)2 * rows * 4), *hvs = malloc((size_t)2 * rows * 4);
    char *written = calloc((size_t)rows, 1);
    if (!dqkv || !kc || !vc || !ksc || !vsc || !dinv || !dpos || !dslot) goto cleanup;
    cudaMemcpy(dinv, inv, (size_t)half * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dpos, pos, (size_t)T * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dslot, slot, (size_t)T * 4, cudaMemcpyHostToDevice);
    sf_k_kv kv = { .k = kc, .v = vc, .block_size = bs, .n_kv_heads = Hkv, .head_dim = hd, .k_scale = ksc,
                   .v_scale = vsc, .i8_base = sh.int8 ? nb : 0 };
    int rc = threads ? sf_k_rope_kv_tune(threads, target, dqkv, ld, T, dpos, dslot, H, Hkv, hd, sh.rot,
                                         sh.interleaved, dinv, kv, NULL)
                     : sf_k_rope_kv(dqkv, ld, T, dpos, dslot, H, Hkv, hd, sh.rot, sh.interleaved, dinv, kv, NULL);
    if (!kcheck(rc, what)) goto cleanup;
    /* reference: the CPU rotation with angles in double, as kernels/cpu/rope_kv.c */
    float c[256], s_[256];
    for (int tt = 0; tt < T; tt++) {
        for (int i = 0; i < half; i++) {
            double ang = (double)pos[tt] * (double)inv[i];
            c[i] = (float)cos(ang);
            s_[i] = (float)sin(ang);
        }
        for (int h = 0; h < H + Hkv; h++)
            sf_cpu_rope_apply(qkv + ((int64_t)tt * NH + h) * hd, sh.rot, sh.interleaved, c, s_);
    }
    float *got = download(dqkv, T, (int64_t)NH * hd, ld);
    close_enough(what, got, qkv, (int64_t)T * NH * hd, 0);
    free(got);
    cudaMemcpy(hk, kc, (size_t)cache_n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hv, vc, (size_t)cache_n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(hks, ksc, (size_t)2 * rows * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hvs, vsc, (size_t)2 * rows * 4, cudaMemcpyDeviceToHost);
    /* every written row: bf16 rows against the rotated k / plain v, INT8 rows dequantised */
    float *gk = malloc((size_t)hd * 4), *gv = malloc((size_t)hd * 4);
    int bad = 0;
    for (int tt = 0; tt < T && !bad; tt++) {
        if (slot[tt] < 0) continue;
        int64_t id = slot[tt] / bs, off = slot[tt] % bs;
        for (int h = 0; h < Hkv && !bad; h++) {
            const float *rk = qkv + ((int64_t)tt * NH + H + h) * hd, *rv = rk + (int64_t)Hkv * hd;
            if (sh.int8 && id >= nb) {
                int64_t r8 = ((id - nb) * Hkv + h) * bs + off;
                const int8_t *k8 = (const int8_t *)hk + r8 * hd, *v8 = (const int8_t *)hv + r8 * hd;
                float amk = 0, amv = 0;
                for (int e = 0; e < hd; e++) { amk = fmaxf(amk, fabsf(rk[e])); amv = fmaxf(amv, fabsf(rv[e])); }
                bad |= !(fabsf(hks[r8] - amk / 127) <= amk / 127 / 64) || !(fabsf(hvs[r8] - amv / 127) <= amv / 127 / 64);
                for (int e = 0; e < hd && !bad; e++)
                    bad |= !(fabsf(k8[e] * hks[r8] - rk[e]) <= 0.6f * hks[r8] + fabsf(rk[e]) / 64) ||
                           !(fabsf(v8[e] * hvs[r8] - rv[e]) <= 0.6f * hvs[r8] + fabsf(rv[e]) / 64);
                CHECK_MSG(!bad, "%s: INT8 row of token %d kv head %d (slot %d) off (scales %g %g, want %g %g)", what,
                          tt, h, slot[tt], hks[r8], hvs[r8], amk / 127, amv / 127);
                continue;
            }
            int64_t row = (id * Hkv + h) * bs + off;
            written[row] = 1;
            for (int e = 0; e < hd; e++) {
                gk[e] = sf_bf16_to_f32(hk[row * hd + e]);
                gv[e] = sf_bf16_to_f32(hv[row * hd + e]);
            }
            bad |= !close_enough(what, gk, rk, hd, 0) || !close_enough(what, gv, rv, hd, 1);
            if (bad) printf("      (token %d, kv head %d, slot %d)\n", tt, h, slot[tt]);
        }
    }
    /* rows no token of this call maps to keep the poison (bf16 pools only: INT8 units share bytes) */
    if (!sh.int8 && !bad)
        for (int64_t r = 0; r < rows && !bad; r++) {
            if (written[r]) continue;
            for (int e = 0; e < hd; e++)
                if (hk[r * hd + e] != 0xffff || hv[r * hd + e] != 0xffff) {
                    CHECK_MSG(0, "%s: cache row %lld written though no token maps to it", what, (long long)r);
                    bad = 1;
                    break;
                }
        }
    free(gk); free(gv);
cleanup:
    cudaFree(dqkv); cudaFree(kc); cudaFree(vc); cudaFree(ksc); cudaFree(vsc); cudaFree(dinv);
    cudaFree(dpos); cudaFree(dslot);
    free(qkv); free(inv); free(pos); free(slot); free(perm); free(hk); free(hv); free(hks); free(hvs);
    free(written);
}

static void rope_case(int T, rope_shape sh) { rope_case_v(T, sh, 0, 0); }

/* The variants --perf times (sf_k_rope_kv_tune): threads per block, target blocks. */
static const int RK_VARIANTS[][2] = { { 128, 512 }, { 64, 512 }, { 256, 512 }, { 128, 1024 }, { 64, 1024 },
                                      { 128, 2048 }, { 64, 2048 }, { 256, 2048 } };
#define N_RK_VARIANTS (int)(sizeof RK_VARIANTS / sizeof RK_VARIANTS[0])

TEST(rope_kv)
{
    const rope_shape llama3 = { 32, 8, 128, 128, 0, 0 }, qwen2 = { 28, 4, 128, 128, 0, 0 },
                     gguf64 = { 32, 8, 64, 64, 1, 0 }, partial = { 32, 8, 128, 64, 0, 0 },
                     phi = { 32, 32, 80, 32, 0, 0 }, tiny = { 4, 2, 12, 12, 0, 0 },
                     l3_int8 = { 32, 8, 128, 128, 0, 1 }, gguf_int8 = { 28, 4, 64, 64, 1, 1 },
                     stories = { 8, 4, 8, 8, 1, 0 }, demo = { 4, 2, 32, 32, 0, 0 };
    for (int i = 0; i < N_NS; i++) rope_case(NS[i], llama3);
    for (int i = 0; i < N_NS; i += 2) {
        rope_case(NS[i], qwen2);
        rope_case(NS[i + 1], gguf64);
    }
    rope_case(64, partial);
    rope_case(7, phi);
    rope_case(33, tiny); /* element-wise path: head_dim % 8 != 0 */
    rope_case(300, stories); /* one 16-byte vector per head */
    rope_case(64, demo);
    rope_case(1, l3_int8);
    rope_case(256, l3_int8);
    rope_case(64, gguf_int8);
    for (int v = 0; v < N_RK_VARIANTS; v++) {
        rope_case_v(7, llama3, RK_VARIANTS[v][0], RK_VARIANTS[v][1]);
        rope_case_v(256, gguf_int8, RK_VARIANTS[v][0], RK_VARIANTS[v][1]);
    }
}

/* ---- --perf --------------------------------------------------------------------------------- */
/* Times `reps` calls of an op captured in a CUDA graph (no launch gaps from the host), each call
 * on its own instance of the buffers so that the instances together exceed L2 (the bytes come
 * from HBM, as they do in a forward pass over a large batch). Returns µs per call. */
typedef int (*perf_fn)(int inst, void *ctx, cudaStream_t s);

static double time_op(perf_fn fn, void *ctx, int n_inst, cudaStream_t s)
{
    const int reps = SF_MAX(n_inst, 20);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double us = -1;
    float ms = 0;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)) return -1;
    for (int r = 0; r < reps; r++) fn(r % n_inst, ctx, s);
    if (cudaStreamEndCapture(s, &g) || cudaGraphInstantiate(&ge, g, 0)) goto cleanup;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaGraphLaunch(ge, s); /* warm-up */
    cudaEventRecord(e0, s);
    for (int k = 0; k < 3; k++) cudaGraphLaunch(ge, s);
    cudaEventRecord(e1, s);
    if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&ms, e0, e1) == cudaSuccess)
        us = ms * 1e3 / (3.0 * reps);
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return us;
}

typedef struct perf_ctx {
    int n, d, f;
    int64_t in_elems, out_elems;        /* per instance */
    uint16_t *in, *in2, *out, *w;
    int32_t *idx, *pos, *slot;
    float *inv;
    sf_k_kv kv;
    const int *variant; /* tune runs: RN_VARIANTS / RK_VARIANTS row, NULL: the dispatcher */
    int no_add;
} perf_ctx;

static int p_rmsnorm(int i, void *c_, cudaStream_t s)
{
    perf_ctx *c = c_;
    const uint16_t *a = c->no_add ? NULL : c->in2 + i * c->in_elems;
    if (c->variant)
        return sf_k_rmsnorm_tune(c->variant[0], c->variant[1], c->variant[2], c->in + i * c->in_elems, c->d, a, c->d,
                                 c->w, 1e-5f, c->n, c->d, c->out + i * c->out_elems, c->d, s);
    return sf_k_rmsnorm(c->in + i * c->in_elems, c->d, a, c->d, c->w, 1e-5f, c->n, c->d, c->out + i * c->out_elems,
                        c->d, s);
}
static int p_silu(int i, void *c_, cudaStream_t s)
{
    perf_ctx *c = c_;
    return sf_k_silu_mul(c->in + i * c->in_elems, 2 * c->f, c->n, c->f, c->out + i * c->out_elems, c->f, s);
}
static int p_add(int i, void *c_, cudaStream_t s)
{
    perf_ctx *c = c_;
    return sf_k_add(c->out + i * c->out_elems, c->d, c->in + i * c->in_elems, c->d, c->n, c->d, s);
}
static int p_embed(int i, void *c_, cudaStream_t s)
{
    perf_ctx *c = c_;
    return sf_k_embed(c->in, 128256, c->d, c->idx + (int64_t)i * c->n, c->n, c->out + i * c->out_elems, c->d, s);
}
static int p_rope(int i, void *c_, cudaStream_t s)
{
    perf_ctx *c = c_;
    if (c->variant)
        return sf_k_rope_kv_tune(c->variant[0], c->variant[1], c->in + i * c->in_elems, 6144, c->n, c->pos,
                                 c->slot + (int64_t)i * c->n, 32, 8, 128, 128, 0, c->inv, c->kv, s);
    return sf_k_rope_kv(c->in + i * c->in_elems, 6144, c->n, c->pos, c->slot + (int64_t)i * c->n, 32, 8, 128, 128, 0,
                        c->inv, c->kv, s);
}

static void perf_row(const char *op, int n, double bytes, double us, double hbm)
{
    if (us <= 0) {
        printf("perf: %-13s n=%-5d failed to time\n", op, n);
        return;
    }
    double gbs = bytes / us / 1e3;
    printf("perf: %-13s n=%-5d %9.2f us %8.1f GB/s %6.1f%% of HBM\n", op, n, us, gbs, hbm > 0 ? 100 * gbs / hbm : 0);
}

/* Llama-3-8B shapes: hidden 4096, FFN 14336, 32 q / 8 kv heads of 128, vocab 128256. */
static void run_perf(void)
{
    sf_hw_info hw;
    sf_error err = { 0 };
    double hbm = 0;
    if (sf_hal_cuda_probe(0, &hw, 0, &err) == SF_OK) hbm = hw.mem_bw_gbs;
    printf("perf: Llama-3-8B shapes; GB/s = bytes the op must read + write / time; HBM ceiling %.0f GB/s (hal%s)\n",
           hbm, hbm > 0 ? "" : ": unavailable");
    cudaStream_t s = NULL;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const int pn[] = { 1, 64, 256, 1500, 2048 };
    const int64_t L2_SPAN = 256ll << 20; /* bytes of instances per timed graph */
    const int d = 4096, f = 14336, NH = 48, hd = 128, bs = 16;
    for (int k = 0; k < (int)(sizeof pn / sizeof pn[0]); k++) {
        const int n = pn[k];
        perf_ctx c = { .n = n, .d = d, .f = f };
        /* rmsnorm + add: reads x, add (and w), writes x, out */
        double b = 4.0 * n * d * 2 + d * 2;
        int ni = (int)SF_MIN(64, SF_MAX(1, L2_SPAN / (int64_t)b));
        c.in_elems = c.out_elems = (int64_t)n * d;
        c.in = dalloc((size_t)(ni * c.in_elems) * 2); c.in2 = dalloc((size_t)(ni * c.in_elems) * 2);
        c.out = dalloc((size_t)(ni * c.out_elems) * 2); c.w = dalloc((size_t)d * 2);
        if (c.in && c.in2 && c.out && c.w) {
            sf_k_fill_random(c.in, ni * c.in_elems, 1, 1.0f, s);
            sf_k_fill_random(c.in2, ni * c.in_elems, 2, 0.01f, s);
            sf_k_fill_random(c.w, d, 3, 1.0f, s);
            perf_row("rmsnorm", n, b, time_op(p_rmsnorm, &c, ni, s), hbm);
            c.no_add = 1; /* prefill's norms: the residual add is in the GEMM */
            perf_row("rmsnorm-x", n, 2.0 * n * d * 2 + d * 2, time_op(p_rmsnorm, &c, ni, s), hbm);
            for (int v = 0; n >= 256 && v < N_RN_VARIANTS; v++) {
                char name[32];
                c.variant = RN_VARIANTS[v];
                for (int na = 0; na < 2; na++) {
                    c.no_add = na;
                    snprintf(name, sizeof name, "rn%s:%d/%d/%d", na ? "-x" : "", c.variant[0], c.variant[1],
                             c.variant[2]);
                    perf_row(name, n, (na ? 2.0 : 4.0) * n * d * 2 + d * 2, time_op(p_rmsnorm, &c, ni, s), hbm);
                }
            }
            c.variant = NULL;
            c.no_add = 0;
            /* add: reads y, a, writes y */
            perf_row("add", n, 3.0 * n * d * 2, time_op(p_add, &c, ni, s), hbm);
        }
        cudaFree(c.in); cudaFree(c.in2); cudaFree(c.out); cudaFree(c.w);
        /* silu_mul: reads n x 2f, writes n x f */
        b = 3.0 * n * f * 2;
        ni = (int)SF_MIN(64, SF_MAX(1, L2_SPAN / (int64_t)b));
        c.in_elems = (int64_t)n * 2 * f; c.out_elems = (int64_t)n * f;
        c.in = dalloc((size_t)(ni * c.in_elems) * 2); c.out = dalloc((size_t)(ni * c.out_elems) * 2);
        if (c.in && c.out) {
            sf_k_fill_random(c.in, ni * c.in_elems, 4, 3.0f, s);
            perf_row("silu_mul", n, b, time_op(p_silu, &c, ni, s), hbm);
        }
        cudaFree(c.in); cudaFree(c.out);
        /* embed: random rows of a 128256 x 4096 table, reads and writes n rows */
        b = 2.0 * n * d * 2;
        ni = (int)SF_MIN(64, SF_MAX(1, L2_SPAN / (int64_t)b));
        c.in = dalloc((size_t)128256 * d * 2); c.out_elems = (int64_t)n * d;
        c.out = dalloc((size_t)(ni * c.out_elems) * 2); c.idx = dalloc((size_t)ni * n * 4);
        if (c.in && c.out && c.idx) {
            int32_t *ids = malloc((size_t)ni * n * 4);
            for (int64_t i = 0; i < (int64_t)ni * n; i++) ids[i] = (int32_t)(sf_rng_next(&R) % 128256);
            cudaMemcpy(c.idx, ids, (size_t)ni * n * 4, cudaMemcpyHostToDevice);
            free(ids);
            perf_row("embed", n, b, time_op(p_embed, &c, ni, s), hbm);
        }
        cudaFree(c.in); cudaFree(c.out); cudaFree(c.idx);
        c.idx = NULL;
        /* rope_kv: reads q, k, v; writes q and k in place, k and v into the cache */
        b = (double)n * hd * 2 * (NH + 40 + 16);
        ni = (int)SF_MIN(64, SF_MAX(1, L2_SPAN / (int64_t)b));
        c.in_elems = (int64_t)n * NH * hd;
        const int nblk = (n + bs - 1) / bs * ni;
        c.in = dalloc((size_t)(ni * c.in_elems) * 2);
        c.kv = (sf_k_kv){ .block_size = bs, .n_kv_heads = 8, .head_dim = hd };
        c.kv.k = dalloc((size_t)nblk * 8 * bs * hd * 2); c.kv.v = dalloc((size_t)nblk * 8 * bs * hd * 2);
        c.pos = dalloc((size_t)n * 4); c.slot = dalloc((size_t)ni * n * 4); c.inv = dalloc(64 * 4);
        if (c.in && c.kv.k && c.kv.v && c.pos && c.slot && c.inv) {
            int32_t *hp = malloc((size_t)n * 4), *hs = malloc((size_t)ni * n * 4);
            float inv[64];
            for (int i = 0; i < 64; i++) inv[i] = powf(500000.0f, -i / 64.0f);
            for (int i = 0; i < n; i++) hp[i] = 1000 + i;
            for (int64_t i = 0; i < (int64_t)ni * n; i++) hs[i] = (int32_t)i; /* consecutive blocks per instance */
            cudaMemcpy(c.pos, hp, (size_t)n * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(c.slot, hs, (size_t)ni * n * 4, cudaMemcpyHostToDevice);
            cudaMemcpy(c.inv, inv, sizeof inv, cudaMemcpyHostToDevice);
            free(hp); free(hs);
            sf_k_fill_random(c.in, ni * c.in_elems, 5, 1.0f, s);
            perf_row("rope_kv", n, b, time_op(p_rope, &c, ni, s), hbm);
            for (int v = 0; n >= 64 && v < N_RK_VARIANTS; v++) {
                char name[32];
                c.variant = RK_VARIANTS[v];
                snprintf(name, sizeof name, "rk:%d/%d", c.variant[0], c.variant[1]);
                perf_row(name, n, b, time_op(p_rope, &c, ni, s), hbm);
            }
            c.variant = NULL;
        }
        cudaFree(c.in); cudaFree(c.kv.k); cudaFree(c.kv.v); cudaFree(c.pos); cudaFree(c.slot); cudaFree(c.inv);
    }
    cudaStreamDestroy(s);
}
#endif

int main(int argc, char **argv)
{
#ifdef SF_HAVE_CUDA
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--perf")) perf = 1;
        else {
            printf("test_smallops: unknown option '%s' (options: --perf)\n", argv[i]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        printf("test_smallops: no CUDA device: skipped (run it on the GPU host)\n");
        return 77;
    }
    sf_rng_seed(&R, sf_now_ns()); /* fresh inputs every run; the seed is printed */
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    RUN(rmsnorm);
    RUN(silu_mul);
    RUN(add);
    RUN(embed_get_rows);
    RUN(rope_kv);
    if (perf) run_perf();
    return test_summary();
#else
    (void)argc; (void)argv;
    printf("test_smallops: built without CUDA: skipped\n");
    return 77;
#endif
}
