/* b1trace.cuh — an in-kernel timeline of the batch-1 decode kernels (SEMFLOW_CUDA_TRACE=FILE;
 * b1trace.cu opens and writes it, bench/device/b1trace.py reads it).
 *
 * Thread 0 of every block of a traced kernel notes %globaltimer (ns, common to all SMs) when the
 * block starts, when it is past the programmatic-launch wait, when its prologue is done (x in
 * shared memory; attention: its partial stored) and when its last thread is done, and appends
 * one record to a device ring. So the overlap of neighbouring kernels in a graph replay is seen
 * as it runs, which per-kernel profilers (each kernel alone) cannot show. Off (the default), a
 * traced kernel pays one constant-cache read of a NULL pointer per mark.
 *
 * Every .cu file that includes this has its own copy of the pointer (no relocatable device
 * code) and a setter made by SF_TR_SETTER, which b1trace.cu calls for each. */
#ifndef SF_KERNELS_B1TRACE_CUH
#define SF_KERNELS_B1TRACE_CUH

#include <stdint.h>
#include <stdlib.h>

#include "common.cuh"

/* One block of one launch (32 bytes). Record 0 of the buffer is the header: t0 counts the
 * records ever appended, grid is the ring's capacity (records after the header). */
struct sf_tr_rec {
    uint32_t id;          /* tag << 24 | SM << 16 | block (low 16 bits) */
    uint16_t m, k;        /* the launch's shape (GEMV rows and columns; attention: splits, keys) */
    unsigned long long t0; /* %globaltimer at the block's start */
    uint32_t d_wait, d_ready, d_end; /* ns after t0: past the wait, prologue done, block done */
    uint32_t grid;        /* blocks of the launch */
};

/* Tags: the fused GEMVs (gemv_stream.cu's persistent warps; gemv_fused.cu's per-warp kernel in its
 * norm modes) are SF_TR_GEMV + their mode bits (gemv_ring.cuh FG_*). */
#define SF_TR_GEMV 16
#define SF_TR_ATTN 64
#define SF_TR_SAMPLE 80 /* the draw (sample.cu): m = vocabulary, k = parts per row */
#define SF_TR_EMBED 81  /* the embedding gather (embed.cu): m = row width, k = rows */

static __constant__ sf_tr_rec *tr_buf; /* this file's copy (NULL: off) */

#define SF_TR_SETTER(name) \
    extern "C" int name(void *buf) { return (int)cudaMemcpyToSymbol(tr_buf, &buf, sizeof buf); }

/* Host: whether SEMFLOW_CUDA_TRACE asks for the timeline (kernels whose marks cost registers pick
 * a marked variant by it; b1trace.cu opens the file). */
static inline bool tr_wanted(void)
{
    const char *p = getenv("SEMFLOW_CUDA_TRACE");
    return p && *p;
}

/* A block's marks so far; kept in shared memory (declare it __shared__ in the kernel) so that
 * tracing costs the kernel no registers. */
struct sf_tr {
    unsigned long long t0;
    uint32_t tw, tr;
};

static __device__ __forceinline__ void tr_begin(sf_tr &s)
{
    if (tr_buf && threadIdx.x == 0) { s.t0 = global_ns(); s.tw = s.tr = 0; }
}
static __device__ __forceinline__ void tr_waited(sf_tr &s)
{
    if (tr_buf && threadIdx.x == 0) s.tw = (uint32_t)(global_ns() - s.t0);
}
static __device__ __forceinline__ void tr_ready(sf_tr &s)
{
    if (tr_buf && threadIdx.x == 0) s.tr = (uint32_t)(global_ns() - s.t0);
}
/* One record of this block (thread 0; tracing on). */
static __device__ void tr_put(int tag, int m, int k, unsigned long long t0, uint32_t dw, uint32_t dr, uint32_t de)
{
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned long long i = atomicAdd(&tr_buf[0].t0, 1ull);
    sf_tr_rec *r = &tr_buf[1 + i % tr_buf[0].grid];
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r->id = (unsigned)tag << 24 | (sm & 0xff) << 16 | (b & 0xffff);
    r->m = (uint16_t)min(m, 65535);
    r->k = (uint16_t)min(k, 65535);
    r->t0 = t0;
    r->d_wait = dw;
    r->d_ready = dr;
    r->d_end = de;
    r->grid = gridDim.x * gridDim.y * gridDim.z;
}
/* Called by every thread of the block (it synchronises the block when tracing). */
static __device__ __forceinline__ void tr_end(const sf_tr &s, int tag, int m, int k)
{
    if (!tr_buf) return;
    __syncthreads();
    if (threadIdx.x) return;
    tr_put(tag, m, k, s.t0, s.tw, s.tr, (uint32_t)(global_ns() - s.t0));
}
/* For kernels whose warps end on their own (no barrier at the end): lane 0 of each of the block's
 * `warps` warps calls this when its warp is done, and the last to come appends the block's
 * record. *done: a shared counter thread 0 zeroed before a barrier all warps pass first. */
static __device__ __forceinline__ void tr_warp_end(const sf_tr &s, unsigned *done, int warps, int tag, int m, int k)
{
    if (!tr_buf) return;
    __threadfence_block(); /* this warp's marks (thread 0's, for warp 0) before its count */
    if (atomicAdd(done, 1u) != (unsigned)warps - 1) return;
    __threadfence_block();
    tr_put(tag, m, k, s.t0, s.tw, s.tr, (uint32_t)(global_ns() - s.t0));
}
/* The split combine of an attention block that combined (sf_attn_pieces_finish's marks: the
 * count back, m and l in, the outputs stored), as a record of tag SF_TR_ATTN_COMBINE whose
 * times are ns after the block's start. Thread 0; tracing on. */
#define SF_TR_ATTN_COMBINE 65
static __device__ __forceinline__ void tr_combine(const sf_tr &s, const uint64_t *mk, int m, int k)
{
    tr_put(SF_TR_ATTN_COMBINE, m, k, s.t0, (uint32_t)(mk[0] - s.t0), (uint32_t)(mk[1] - s.t0), (uint32_t)(mk[2] - s.t0));
}

#endif
