/* sample_draw.h — the pieces of the sampler that the CPU reference (kernels/cpu/sample.c) and
 * the CUDA kernels (kernels/cuda/sample.cu, and the lm_head that draws in gemv_stream.cu) must
 * compute bit for bit alike: which rows are greedy, the ordered key of a logit and a best packed
 * with its id, the fixed-point mass, and the counter-based uniform and Gumbel value of the draw.
 * Plain C, usable from C and CUDA (host and device). */
#ifndef SF_KERNELS_SAMPLE_DRAW_H
#define SF_KERNELS_SAMPLE_DRAW_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SF_HD static __host__ __device__ __forceinline__
#else
#define SF_HD static inline
#endif

/* Masses exp(x - max) in [0, 1] are summed as integers of 2^-40: a row of up to 2^23 tokens
 * cannot overflow 64 bits, and the sum is the same in any order (thread, block, machine). */
#define SF_SAMPLE_MASS_ONE 1099511627776.0f /* 2^40 */

/* splitmix64's finaliser: a bijection on 64 bits with full avalanche. */
SF_HD uint64_t sf_sample_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The stream of one draw: a pure function of the request's seed and the draw's step. */
SF_HD uint64_t sf_sample_stream(uint64_t seed, uint64_t step)
{
    return sf_sample_mix64(seed ^ sf_sample_mix64(step ^ 0x5bd1e9955bd1e995ull));
}

/* v in (0, 1): 2^32 evenly spaced points, (h + 1/2) / 2^32 for the token's 32 hash bits. */
SF_HD float sf_sample_uniform(uint64_t stream, uint32_t id)
{
    uint32_t h = (uint32_t)(sf_sample_mix64(stream + id) >> 32);
    return ((float)h + 0.5f) * 2.3283064365386963e-10f;
}

/* Orders floats as unsigned integers (larger float, larger key); 0 is kept for "not a
 * candidate" (-inf maps to 0x007fffff and every finite value above it). */
SF_HD uint32_t sf_sample_key(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return (v.u & 0x80000000u) ? ~v.u : (v.u | 0x80000000u);
}

/* A best (v, id) as one word that compares as (value ascending, id descending): the larger
 * packed word is the larger value, on ties the smaller id; 0 is below every pair. */
SF_HD uint64_t sf_sample_pack(float v, int id)
{
    return (uint64_t)sf_sample_key(v) << 32 | (uint32_t)~(uint32_t)id;
}

/* A row of hal.h's sf_sample_row is drawn greedily (the smallest id of the largest logit). */
SF_HD int sf_sample_greedy(float temperature, int top_k)
{
    return temperature <= 0 || top_k == 1;
}

/* The Gumbel-max value of x (a logit over the temperature) for the token's uniform u. */
SF_HD float sf_sample_gumbel(float x, float u)
{
    return x - logf(-log1pf(-u));
}

#endif
