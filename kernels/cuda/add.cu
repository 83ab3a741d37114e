/* add.cu — the residual add on its own: y += a, both bf16, rounded to bf16 as the stored stream
 * is. The fused GEMVs (gemv_fused.cu) do this in their epilogue at batch 1; larger batches run a
 * GEMM and then this kernel, with the same rounding. */
#include "common.cuh"

__global__ void k_add(bf16 *y, int64_t ldy, const bf16 *a, int64_t lda, int n, int d)
{
    int64_t total = (int64_t)n * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / d, c = i - r * d;
        y[r * ldy + c] = f2bf(bf2f(y[r * ldy + c]) + bf2f(a[r * lda + c]));
    }
}

extern "C" int sf_k_add(uint16_t *y, int64_t ldy, const uint16_t *a, int64_t lda, int n, int d, cudaStream_t s)
{
    int64_t total = (int64_t)n * d;
    if (total <= 0) return 0;
    unsigned grid = (unsigned)SF_MIN(sf_div_up(total, 256), 65535u * 8);
    k_add<<<grid, 256, 0, s>>>((bf16 *)y, ldy, (const bf16 *)a, lda, n, d);
    return sf_launch_status();
}
