/* add.cu — the residual add on its own: y += a, both bf16, rounded to bf16 as the stored stream
 * is. The fused GEMVs (gemv_fused.cu) do this in their epilogue at batch 1; larger batches run a
 * GEMM and then this kernel, with the same rounding.
 *
 * Fast path (d % 8 == 0, 16-byte aligned rows): one thread per 8 values, 16-byte loads and
 * stores, a flat grid over n x d/8. */
#include "common.cuh"

__global__ void k_add(bf16 *y, int64_t ldy, const bf16 *a, int64_t lda, int n, int d)
{
    int64_t total = (int64_t)n * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / d, c = i - r * d;
        y[r * ldy + c] = f2bf(bf2f(y[r * ldy + c]) + bf2f(a[r * lda + c]));
    }
}

/* Item i = (row i / dv, 16-byte column i % dv), dv = d / 8; total = n * dv. */
__global__ void __launch_bounds__(256) k_add_vec(bf16 *__restrict__ y, int64_t ldy, const bf16 *__restrict__ a,
                                                 int64_t lda, int dv, int64_t total)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int64_t r = i / dv;
    const int c = (int)(i - r * dv);
    bf16x8 *yp = (bf16x8 *)(y + r * ldy) + c;
    const bf16x8 av = ((const bf16x8 *)(a + r * lda))[c];
    bf16x8 yv = *yp;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 y2 = __bfloat1622float2(yv.h[h]), a2 = __bfloat1622float2(av.h[h]);
        yv.h[h] = __floats2bfloat162_rn(y2.x + a2.x, y2.y + a2.y);
    }
    *yp = yv;
}

extern "C" int sf_k_add(uint16_t *y, int64_t ldy, const uint16_t *a, int64_t lda, int n, int d, cudaStream_t s)
{
    int64_t total = (int64_t)n * d;
    if (total <= 0) return 0;
    if (d % 8 == 0 && ldy % 8 == 0 && lda % 8 == 0 && (uintptr_t)y % 16 == 0 && (uintptr_t)a % 16 == 0) {
        int64_t items = total / 8;
        int threads = sf_k_vec_threads(items);
        k_add_vec<<<(unsigned)sf_div_up(items, threads), threads, 0, s>>>((bf16 *)y, ldy, (const bf16 *)a, lda, d / 8,
                                                                           items);
        return sf_launch_status();
    }
    unsigned grid = (unsigned)SF_MIN(sf_div_up(total, 256), 65535u * 8);
    k_add<<<grid, 256, 0, s>>>((bf16 *)y, ldy, (const bf16 *)a, lda, n, d);
    return sf_launch_status();
}
