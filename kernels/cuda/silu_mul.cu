/* silu_mul.cu — out = silu(gate) * up over the fused gate/up GEMM output.
 *
 * Fast path (f % 8 == 0, 16-byte aligned rows): one thread per 8 outputs, one 16-byte load of
 * gate and one of up in flight per thread, one 16-byte store; a flat grid over n x f/8 (no
 * per-row loop), so a 2048 x 14336 call is ~14k blocks and a batch-1 call still spreads over
 * f/8/64 blocks. Rounding as HF: act(gate) is rounded to bf16 before the product.
 * Launched as a programmatic dependent (common.cuh): at decode batches a call moves a few MB,
 * about as long as a launch gap, so the grid is resident before the GEMM before it ends. */
#include "common.cuh"

static __device__ __forceinline__ float silu_bf16(float g)
{
    return bf2f(f2bf(g / (1.0f + __expf(-g)))); /* HF rounds act(gate) to bf16 first */
}

__global__ void k_silu_mul(const bf16 *gu, int64_t ld_gu, int n, int f, bf16 *out, int64_t ldo)
{
    int64_t total = (int64_t)n * f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / f, c = i - r * f;
        float g = bf2f(gu[r * ld_gu + c]), u = bf2f(gu[r * ld_gu + f + c]);
        out[r * ldo + c] = f2bf(silu_bf16(g) * u);
    }
}

/* 16 bytes read once (streaming: evict first from L2). */
static __device__ __forceinline__ bf16x8 ld8_stream(const bf16 *p)
{
    int4 v = __ldcs((const int4 *)p);
    bf16x8 r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* Item i = (row i / fv, 16-byte column i % fv), fv = f / 8; total = n * fv. */
__global__ void __launch_bounds__(256) k_silu_mul_vec(const bf16 *__restrict__ gu, int64_t ld_gu, int fv, int64_t total,
                                                      bf16 *__restrict__ out, int64_t ldo)
{
    sf_pdl_trigger();
    sf_pdl_wait(); /* gate/up come from the GEMM before */
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int64_t r = i / fv;
    const int c = (int)(i - r * fv);
    const bf16 *gr = gu + r * ld_gu + 8 * (int64_t)c;
    const bf16x8 g8 = ld8_stream(gr), u8 = ld8_stream(gr + 8 * (int64_t)fv);
    bf16x8 o;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 g = __bfloat1622float2(g8.h[h]), u = __bfloat1622float2(u8.h[h]);
        o.h[h] = __floats2bfloat162_rn(silu_bf16(g.x) * u.x, silu_bf16(g.y) * u.y);
    }
    ((bf16x8 *)(out + r * ldo))[c] = o;
}

extern "C" int sf_k_silu_mul(const uint16_t *gu, int64_t ld_gu, int n, int f, uint16_t *out, int64_t ldo,
                             cudaStream_t s)
{
    int64_t total = (int64_t)n * f;
    if (total == 0) return 0;
    if (f % 8 == 0 && ld_gu % 8 == 0 && ldo % 8 == 0 && (uintptr_t)gu % 16 == 0 && (uintptr_t)out % 16 == 0) {
        int64_t items = total / 8;
        int threads = sf_k_vec_threads(items);
        int rc = sf_launch_pdl(k_silu_mul_vec, dim3(sf_div_up(items, threads)), dim3(threads), 0, s, (const bf16 *)gu,
                               ld_gu, f / 8, items, (bf16 *)out, ldo);
        return rc ? rc : sf_launch_status();
    }
    unsigned grid = (unsigned)SF_MIN(sf_div_up(total, 256), 65535u * 8);
    k_silu_mul<<<grid, 256, 0, s>>>((const bf16 *)gu, ld_gu, n, f, (bf16 *)out, ldo);
    return sf_launch_status();
}
