/* common.cuh — helpers shared by the CUDA kernels: bf16 conversions, warp reductions, the
 * launch-check convention. Device code only; the C-callable API is in kernels.h. */
#ifndef SF_KERNELS_COMMON_CUH
#define SF_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels.h"

typedef __nv_bfloat16 bf16;
typedef __nv_bfloat162 bf162;

static __device__ __forceinline__ float sf_ld_bf16(const uint16_t *p) { return __bfloat162float(*(const bf16 *)p); }
static __device__ __forceinline__ float bf2f(bf16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ bf16 f2bf(float v) { return __float2bfloat16_rn(v); }

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum for blockDim.x a multiple of 32 (<= 1024). `red` is >= 32 floats of shared
 * memory. Every thread gets the result. */
static __device__ __forceinline__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

/* 8 bf16 in one 16-byte load. */
struct __align__(16) bf16x8 { bf162 h[4]; };

/* Status of the last launch, as the C API returns it. */
static inline int sf_launch_status(void) { return (int)cudaGetLastError(); }

#define SF_MIN(a, b) ((a) < (b) ? (a) : (b))

static inline unsigned sf_div_up(long a, long b) { return (unsigned)((a + b - 1) / b); }

#endif
