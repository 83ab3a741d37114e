/* rmsnorm.cu — RMSNorm fused with the residual add: one block per row, one pass over memory.
 *
 * Fast path (d % 8 == 0, 16-byte aligned rows, d <= 16384): the block's threads each hold VPT
 * 16-byte vectors of the row (the bf16 values after the add: 4 registers per vector), so x and add
 * are read once and x (when add is given) and out written once; the sum of squares is one block
 * reduction. VPT is the smallest of 1, 2, 4, 8 that keeps the block within 512 threads, so a
 * 4096-wide row is 512 threads x 1 vector: of the variants timed on the H200 (test_smallops
 * --perf, docs/PERFORMANCE.md) the fastest with the add at 256, 1500 and 2048 rows, and faster
 * than 256 x 2 without it. Other variants (two rows per block, a software-pipelined row loop)
 * stay reachable through sf_k_rmsnorm_tune for measurements.
 * Rounding as HF: x + add rounded to bf16 (the stored stream is bf16), sum of squares in fp32,
 * the normalised value rounded to bf16, then multiplied by w and rounded.
 * Each element is read and written by the same thread, so out may alias x.
 * The one-pass kernels are launched as programmatic dependents (common.cuh): resident, with
 * their weights loaded, before the kernel before them ends. */
#include "common.cuh"

__global__ void k_rmsnorm(bf16 *x, int64_t ldx, const bf16 *add, int64_t ld_add, const bf16 *w, float eps,
                          int d, bf16 *out, int64_t ldo)
{
    __shared__ float red[32];
    int64_t r = blockIdx.x;
    bf16 *xr = x + r * ldx;
    float ss = 0.0f;
    if (add) {
        const bf16 *ar = add + r * ld_add;
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            bf16 v = f2bf(bf2f(xr[c]) + bf2f(ar[c]));
            xr[c] = v;
            float f = bf2f(v);
            ss += f * f;
        }
    } else {
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            float f = bf2f(xr[c]);
            ss += f * f;
        }
    }
    ss = block_sum(ss, red);
    float inv = rsqrtf(ss / (float)d + eps);
    bf16 *orow = out + r * ldo;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float nv = bf2f(f2bf(bf2f(xr[c]) * inv)); /* HF: normalise in fp32, round, then scale */
        orow[c] = f2bf(nv * bf2f(w[c]));
    }
}

#define RN_MAX_VPT 8
#define RN_MAX_THREADS 512  /* threads per block of the one-pass kernels */
#define RN_MAX_D 16384      /* widest row of the one-pass path */

/* One pass over RPB rows per block (rows blockIdx.x + k * gridDim.x): every load of the rows
 * (x, add and, with PW, the weights) is issued before any arithmetic, then per row the add, the
 * sum of squares (one block reduction), the normalised output. Registers are capped so that
 * small VPT keeps many blocks per SM (<= 42 for 2 vectors: 6 blocks of 256 threads); holding the
 * weights too (PW) costs registers, so those instances get twice the cap. */
template <int VPT, bool PW, int RPB>
__global__ void __launch_bounds__(512, VPT * RPB <= 2 && !PW ? 3 : VPT * RPB <= 2 ? 2 : VPT * RPB <= 4 && !PW ? 2 : 1) k_rmsnorm_vec(bf16 *x, int64_t ldx, const bf16 *add, int64_t ld_add,
                                                     const bf16 *__restrict__ w, float eps, int n, int d, bf16 *out,
                                                     int64_t ldo)
{
    __shared__ float red[32];
    const int nv = d / 8;
    const bf16x8 *wv8 = (const bf16x8 *)w;
    bf16x8 v[RPB][VPT], a[RPB][VPT], wv[VPT];
    sf_pdl_trigger();
    if (PW)
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            if (i < nv) wv[u] = wv8[i]; /* weights: no kernel of the step writes them */
        }
    sf_pdl_wait(); /* x and add come from the kernels before */
#pragma unroll
    for (int k = 0; k < RPB; k++) {
        const int64_t r = blockIdx.x + (int64_t)k * gridDim.x;
        const bf16x8 *xr = (const bf16x8 *)(x + r * ldx);
        const bf16x8 *ar = add ? (const bf16x8 *)(add + r * ld_add) : NULL;
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            bool in = i < nv && r < n;
            if (in) v[k][u] = xr[i];
            else memset(&v[k][u], 0, sizeof v[k][u]);
            if (in && ar) a[k][u] = ar[i];
            else memset(&a[k][u], 0, sizeof a[k][u]);
        }
    }
#pragma unroll
    for (int k = 0; k < RPB; k++) {
        const int64_t r = blockIdx.x + (int64_t)k * gridDim.x;
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            ss += add_sumsq(v[k][u], a[k][u], add != NULL, x, ldx, r, i, i < nv && r < n);
        }
        ss = block_sum(ss, red); /* every thread of the block takes part, also past the last row */
        if (r >= n) continue;
        const float inv = rsqrtf(ss / (float)d + eps);
        bf16x8 *orow = (bf16x8 *)(out + r * ldo);
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            if (i < nv) {
                bf16x8 ww = PW ? wv[u] : wv8[i], o;
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 w2 = __bfloat1622float2(ww.h[h]), x2 = __bfloat1622float2(v[k][u].h[h]);
                    float n0 = bf2f(f2bf(x2.x * inv)), n1 = bf2f(f2bf(x2.y * inv));
                    o.h[h] = __floats2bfloat162_rn(n0 * w2.x, n1 * w2.y);
                }
                orow[i] = o;
            }
        }
    }
}

/* The residual add of one 8-wide vector (written back to x at row r when `store`) and its
 * contribution to the row's sum of squares. */
static __device__ __forceinline__ float add_sumsq(bf16x8 &v, const bf16x8 &a, bool has_add, bf16 *x, int64_t ldx,
                                                  int64_t r, int i, bool store)
{
    if (has_add) {
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float2 a2 = __bfloat1622float2(a.h[h]), x2 = __bfloat1622float2(v.h[h]);
            v.h[h] = __floats2bfloat162_rn(x2.x + a2.x, x2.y + a2.y);
        }
        if (store) ((bf16x8 *)(x + r * ldx))[i] = v;
    }
    float ss = 0.0f;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 f = __bfloat1622float2(v.h[h]);
        ss += f.x * f.x + f.y * f.y;
    }
    return ss;
}

/* Loads row r's VPT vectors of x (and of add, when given) per thread; zeros past the row's end
 * and for r >= n, so every thread can still join the block's reduction. */
template <int VPT>
static __device__ __forceinline__ void load_row(bf16x8 (&v)[VPT], bf16x8 (&a)[VPT], const bf16 *x, int64_t ldx,
                                                const bf16 *add, int64_t ld_add, int64_t r, int n, int nv)
{
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int i = threadIdx.x + u * blockDim.x;
        bool in = i < nv && r < n;
        if (in) v[u] = ((const bf16x8 *)(x + r * ldx))[i];
        else memset(&v[u], 0, sizeof v[u]);
        if (in && add) a[u] = ((const bf16x8 *)(add + r * ld_add))[i];
        else memset(&a[u], 0, sizeof a[u]);
    }
}

/* Rows blockIdx.x, + gridDim.x, ... in a loop, software-pipelined: the next row's x and add are
 * loaded before the current row's add, reduction and stores, so a block always has a row's loads
 * in flight; the weights are loaded once per block. Same arithmetic as k_rmsnorm_vec. */
template <int VPT>
__global__ void __launch_bounds__(512, VPT <= 2 ? 2 : 1) k_rmsnorm_loop(bf16 *x, int64_t ldx, const bf16 *add, int64_t ld_add,
                                                         const bf16 *__restrict__ w, float eps, int n, int d,
                                                         bf16 *out, int64_t ldo)
{
    __shared__ float red[32];
    const int nv = d / 8;
    bf16x8 v[VPT], a[VPT], wv[VPT];
    int64_t r = blockIdx.x;
    sf_pdl_trigger();
#pragma unroll
    for (int u = 0; u < VPT; u++) {
        int i = threadIdx.x + u * blockDim.x;
        if (i < nv) wv[u] = ((const bf16x8 *)w)[i]; /* weights: no kernel of the step writes them */
    }
    sf_pdl_wait(); /* x and add come from the kernels before */
    load_row<VPT>(v, a, x, ldx, add, ld_add, r, n, nv);
    for (; r < n; r += gridDim.x) { /* block-uniform */
        const int64_t rn = r + gridDim.x;
        bf16x8 vn[VPT], an[VPT];
        load_row<VPT>(vn, an, x, ldx, add, ld_add, rn, n, nv);
        float ss = 0.0f;
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            ss += add_sumsq(v[u], a[u], add != NULL, x, ldx, r, i, i < nv);
        }
        ss = block_sum(ss, red);
        const float inv = rsqrtf(ss / (float)d + eps);
        bf16x8 *orow = (bf16x8 *)(out + r * ldo);
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            int i = threadIdx.x + u * blockDim.x;
            if (i < nv) {
                bf16x8 o;
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 w2 = __bfloat1622float2(wv[u].h[h]), x2 = __bfloat1622float2(v[u].h[h]);
                    float n0 = bf2f(f2bf(x2.x * inv)), n1 = bf2f(f2bf(x2.y * inv));
                    o.h[h] = __floats2bfloat162_rn(n0 * w2.x, n1 * w2.y);
                }
                orow[i] = o;
            }
            v[u] = vn[u];
            a[u] = an[u];
        }
    }
}

static bool rn_vec_ok(const uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add, const uint16_t *w, int d,
                      const uint16_t *out, int64_t ldo)
{
    return d % 8 == 0 && d <= RN_MAX_D && ldx % 8 == 0 && ldo % 8 == 0 &&
           (!add || ld_add % 8 == 0) && (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0 &&
           (uintptr_t)w % 16 == 0 && (uintptr_t)add % 16 == 0;
}

template <bool PW, int RPB>
static int rn_launch(int vpt, int threads, uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add,
                      const uint16_t *w, float eps, int n, int d, uint16_t *out, int64_t ldo, cudaStream_t s)
{
    bf16 *xb = (bf16 *)x, *ob = (bf16 *)out;
    const bf16 *ab = (const bf16 *)add, *wb = (const bf16 *)w;
    const unsigned grid = (unsigned)((n + RPB - 1) / RPB);
    void (*k)(bf16 *, int64_t, const bf16 *, int64_t, const bf16 *, float, int, int, bf16 *, int64_t) =
        vpt == 1 ? k_rmsnorm_vec<1, PW, RPB> : vpt == 2 ? k_rmsnorm_vec<2, PW, RPB>
                                             : vpt == 4 ? k_rmsnorm_vec<4, PW, RPB> : k_rmsnorm_vec<8, PW, RPB>;
    return sf_launch_pdl(k, dim3(grid), dim3(threads), 0, s, xb, ldx, ab, ld_add, wb, eps, n, d, ob, ldo);
}

/* Threads for vpt vectors per thread over d / 8 vectors, whole warps (block_sum wants them). */
static int rn_threads(int d, int vpt) { return ((d / 8 + vpt - 1) / vpt + 31) / 32 * 32; }

extern "C" int sf_k_rmsnorm_tune(int vpt, int prefetch_w, int rows_per_block, uint16_t *x, int64_t ldx,
                                 const uint16_t *add, int64_t ld_add, const uint16_t *w, float eps, int n, int d,
                                 uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n <= 0) return 0;
    if (!rn_vec_ok(x, ldx, add, ld_add, w, d, out, ldo) || (vpt != 1 && vpt != 2 && vpt != 4 && vpt != 8) ||
        rn_threads(d, vpt) > RN_MAX_THREADS || rows_per_block < 1)
        return (int)cudaErrorInvalidValue;
    const int t = rn_threads(d, vpt);
    int rc;
    if (rows_per_block > 2) { /* the pipelined loop */
        bf16 *xb = (bf16 *)x, *ob = (bf16 *)out;
        const bf16 *ab = (const bf16 *)add, *wb = (const bf16 *)w;
        const unsigned grid = (unsigned)((n + rows_per_block - 1) / rows_per_block);
        void (*k)(bf16 *, int64_t, const bf16 *, int64_t, const bf16 *, float, int, int, bf16 *, int64_t) =
            vpt == 1 ? k_rmsnorm_loop<1> : vpt == 2 ? k_rmsnorm_loop<2> : vpt == 4 ? k_rmsnorm_loop<4> : k_rmsnorm_loop<8>;
        rc = sf_launch_pdl(k, dim3(grid), dim3(t), 0, s, xb, ldx, ab, ld_add, wb, eps, n, d, ob, ldo);
    } else if (rows_per_block == 2) {
        rc = prefetch_w ? rn_launch<true, 2>(vpt, t, x, ldx, add, ld_add, w, eps, n, d, out, ldo, s)
                        : rn_launch<false, 2>(vpt, t, x, ldx, add, ld_add, w, eps, n, d, out, ldo, s);
    } else {
        rc = prefetch_w ? rn_launch<true, 1>(vpt, t, x, ldx, add, ld_add, w, eps, n, d, out, ldo, s)
                        : rn_launch<false, 1>(vpt, t, x, ldx, add, ld_add, w, eps, n, d, out, ldo, s);
    }
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_rmsnorm(uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add, const uint16_t *w,
                            float eps, int n, int d, uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n <= 0) return 0;
    if (rn_vec_ok(x, ldx, add, ld_add, w, d, out, ldo)) {
        int vpt = 1;
        while (vpt < RN_MAX_VPT && rn_threads(d, vpt) > RN_MAX_THREADS) vpt *= 2;
        int rc = rn_launch<false, 1>(vpt, rn_threads(d, vpt), x, ldx, add, ld_add, w, eps, n, d, out, ldo, s);
        return rc ? rc : sf_launch_status();
    }
    int threads = d >= 1024 ? 512 : d >= 256 ? 256 : 64;
    k_rmsnorm<<<n, threads, 0, s>>>((bf16 *)x, ldx, (const bf16 *)add, ld_add, (const bf16 *)w, eps, d,
                                    (bf16 *)out, ldo);
    return sf_launch_status();
}
