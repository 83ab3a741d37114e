/* silu_mul.cu — out = silu(gate) * up over the fused gate/up GEMM output. */
#include "common.cuh"

__global__ void k_silu_mul(const bf16 *gu, int64_t ld_gu, int n, int f, bf16 *out, int64_t ldo)
{
    int64_t total = (int64_t)n * f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / f, c = i - r * f;
        float g = bf2f(gu[r * ld_gu + c]), u = bf2f(gu[r * ld_gu + f + c]);
        float sg = bf2f(f2bf(g / (1.0f + __expf(-g)))); /* HF rounds act(gate) to bf16 first */
        out[r * ldo + c] = f2bf(sg * u);
    }
}

extern "C" int sf_k_silu_mul(const uint16_t *gu, int64_t ld_gu, int n, int f, uint16_t *out, int64_t ldo,
                             cudaStream_t s)
{
    int64_t total = (int64_t)n * f;
    if (total == 0) return 0;
    unsigned grid = (unsigned)SF_MIN(sf_div_up(total, 256), 65535u * 8);
    k_silu_mul<<<grid, 256, 0, s>>>((const bf16 *)gu, ld_gu, n, f, (bf16 *)out, ldo);
    return sf_launch_status();
}
