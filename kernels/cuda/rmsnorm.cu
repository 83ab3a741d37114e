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

extern "C" int sf_k_rmsnorm(uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add, const uint16_t *w,
                            float eps, int n, int d, uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n <= 0) return 0;
    int threads = d >= 1024 ? 512 : d >= 256 ? 256 : 64;
    k_rmsnorm<<<n, threads, 0, s>>>((bf16 *)x, ldx, (const bf16 *)add, ld_add, (const bf16 *)w, eps, d,
                                    (bf16 *)out, ldo);
    return sf_launch_status();
}
