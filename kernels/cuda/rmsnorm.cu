/* rmsnorm.cu — RMSNorm fused with the residual add: one block per row.
 * Pass 1 adds the residual (rounding to bf16 as the stored stream is bf16) and sums squares;
 * pass 2 normalises. Each element is read and written by the same thread in both passes, so
 * out may alias x. */
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

/* Fast path for d % 8 == 0, d <= 8 * 8 * RN_THREADS and 16-byte aligned rows: the row stays in
 * registers (one read of x and add, one write of x and out), 16-byte loads and stores. */
#define RN_THREADS 256
#define RN_VEC 8
__global__ void __launch_bounds__(RN_THREADS) k_rmsnorm_vec(bf16 *x, int64_t ldx, const bf16 *add, int64_t ld_add,
                                                             const bf16 *w, float eps, int d, bf16 *out, int64_t ldo)
{
    __shared__ float red[32];
    const int64_t r = blockIdx.x;
    const int nv = d / 8;
    bf16x8 *xr = (bf16x8 *)(x + r * ldx);
    const bf16x8 *ar = add ? (const bf16x8 *)(add + r * ld_add) : NULL;
    float v[RN_VEC][8];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < RN_VEC; u++) {
        int i = threadIdx.x + u * RN_THREADS;
        if (i < nv) {
            bf16x8 xv = xr[i];
            if (ar) {
                bf16x8 av = ar[i];
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 a2 = __bfloat1622float2(av.h[h]), x2 = __bfloat1622float2(xv.h[h]);
                    xv.h[h] = __floats2bfloat162_rn(x2.x + a2.x, x2.y + a2.y);
                }
                xr[i] = xv;
            }
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(xv.h[h]);
                v[u][2 * h] = f.x;
                v[u][2 * h + 1] = f.y;
                ss += f.x * f.x + f.y * f.y;
            }
        }
    }
    ss = block_sum(ss, red);
    const float inv = rsqrtf(ss / (float)d + eps);
    const bf16x8 *wv8 = (const bf16x8 *)w;
    bf16x8 *orow = (bf16x8 *)(out + r * ldo);
#pragma unroll
    for (int u = 0; u < RN_VEC; u++) {
        int i = threadIdx.x + u * RN_THREADS;
        if (i < nv) {
            bf16x8 wv = wv8[i], o;
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 w2 = __bfloat1622float2(wv.h[h]);
                float n0 = bf2f(f2bf(v[u][2 * h] * inv)), n1 = bf2f(f2bf(v[u][2 * h + 1] * inv));
                o.h[h] = __floats2bfloat162_rn(n0 * w2.x, n1 * w2.y);
            }
            orow[i] = o;
        }
    }
}

extern "C" int sf_k_rmsnorm(uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add, const uint16_t *w,
                            float eps, int n, int d, uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n <= 0) return 0;
    bool vec = d % 8 == 0 && d <= 8 * RN_VEC * RN_THREADS && ldx % 8 == 0 && ldo % 8 == 0 && (!add || ld_add % 8 == 0) &&
               (uintptr_t)x % 16 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)add % 16 == 0;
    if (vec) {
        k_rmsnorm_vec<<<n, RN_THREADS, 0, s>>>((bf16 *)x, ldx, (const bf16 *)add, ld_add, (const bf16 *)w, eps, d,
                                               (bf16 *)out, ldo);
        return sf_launch_status();
    }
    int threads = d >= 1024 ? 512 : d >= 256 ? 256 : 64;
    k_rmsnorm<<<n, threads, 0, s>>>((bf16 *)x, ldx, (const bf16 *)add, ld_add, (const bf16 *)w, eps, d,
                                    (bf16 *)out, ldo);
    return sf_launch_status();
}
