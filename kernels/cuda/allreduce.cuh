/* allreduce.cuh — device pieces shared by the peer-memory kernels (allreduce.cu): the global
 * timer, LL stores and loads, bf16 sums (their system-scope flags are common.cuh's
 * sf_st_release_sys and sf_ld_acquire_sys). Device code only. */
#ifndef SF_KERNELS_ALLREDUCE_CUH
#define SF_KERNELS_ALLREDUCE_CUH

#include "common.cuh"

/* LL lines: 16-byte (or 8-byte) stores and loads whose 8-byte halves each arrive whole */
static __device__ __forceinline__ void st_volatile_v4(uint4 *p, uint4 v)
{
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
}

static __device__ __forceinline__ uint4 ld_volatile_v4(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p)
                 : "memory");
    return v;
}

static __device__ __forceinline__ void st_volatile_v2(uint2 *p, uint2 v)
{
    asm volatile("st.volatile.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y) : "memory");
}

static __device__ __forceinline__ uint2 ld_volatile_v2(const uint2 *p)
{
    uint2 v;
    asm volatile("ld.volatile.global.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p) : "memory");
    return v;
}

/* A spin that gives up: call spin_late every iteration; it returns 1 (after writing 1 + peer
 * to *err) once timeout_ns have passed since the first call, or at once when *failed is set
 * (another thread of the block gave up), and then sets *failed. */
static __device__ __forceinline__ int spin_late(unsigned spins, uint64_t *t0, uint64_t timeout_ns,
                                                volatile unsigned *err, int peer, volatile int *failed)
{
    if ((spins & 1023) != 0) return 0;
    if (*failed) return 1;
    uint64_t t = global_ns();
    if (!*t0) *t0 = t;
    else if (t - *t0 > timeout_ns) {
        *err = 1u + peer;
        __threadfence_system();
        *failed = 1;
        return 1;
    }
    return 0;
}

static __device__ __forceinline__ void add4(float *acc, uint2 v)
{
    float2 a = __bfloat1622float2(*(const bf162 *)&v.x), b = __bfloat1622float2(*(const bf162 *)&v.y);
    acc[0] += a.x;
    acc[1] += a.y;
    acc[2] += b.x;
    acc[3] += b.y;
}

static __device__ __forceinline__ void add8(float *acc, uint4 v)
{
    const bf162 *h = (const bf162 *)&v;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(h[i]);
        acc[2 * i] += f.x;
        acc[2 * i + 1] += f.y;
    }
}

#endif
