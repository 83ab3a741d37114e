/* allreduce.cu — all-reduce of bf16 messages over peer memory: one-shot and LL kernels, and
 * the all-reduce fused with the residual add and RMSNorm (see allreduce.h). */
#include <stddef.h>

#include "allreduce.h"
#include "allreduce.cuh"

typedef struct ar_sig {
    unsigned flag[SF_AR_BLOCKS][SF_AR_MAX_RANKS]; /* [block][from rank]: written by that rank */
    unsigned count[SF_AR_BLOCKS];                 /* this rank's one-shot calls, per block */
    unsigned ll_count[SF_AR_BLOCKS];              /* this rank's LL calls, per block */
    unsigned nflag[SF_ARN_BLOCKS][SF_AR_MAX_RANKS]; /* the fused kernel's flags, [block][from rank] */
    unsigned ncount[SF_ARN_BLOCKS];               /* this rank's fused calls, per block */
} ar_sig;

static_assert(sizeof(ar_sig) <= SF_AR_SIG_BYTES, "signal block too large");

/* Values [4i, 4i + 4) of the message as 8 bytes (zeros past n). */
static __device__ __forceinline__ uint2 load4(const uint16_t *d, int64_t i, int64_t n)
{
    if (4 * i + 4 <= n) return ((const uint2 *)d)[i];
    uint16_t h[4] = { 0, 0, 0, 0 };
    for (int k = 0; k < 4 && 4 * i + k < n; k++) h[k] = d[4 * i + k];
    return make_uint2(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16);
}

/* Threads [0, size) of the block, thread p != rank: raise `flag` in peer p's signal block at
 * byte off + 4 * rank with a system-scope release store (after a block barrier the caller
 * placed; fence: a system-scope fence before it as well), then wait until this rank's own word
 * at off + 4 * p reached it. Ends with a block barrier; returns 1 in every thread when a wait
 * timed out (the missing rank written to *err). The block's stores before the barrier are
 * visible to the peers once they see the flag: the release is cumulative over what the barrier
 * ordered before it. */
static __device__ int exchange_flags(char *const *region, int rank, int size, size_t off, unsigned flag,
                                     uint64_t timeout_ns, volatile unsigned *err, int *failed_s, bool fence)
{
    const int p = threadIdx.x;
    if (p < size && p != rank) {
        if (fence) __threadfence_system();
        sf_st_release_sys((unsigned *)(region[p] + off) + rank, flag);
        const unsigned *in = (const unsigned *)(region[rank] + off) + p;
        uint64_t t0 = 0;
        for (unsigned spins = 0; (int)(sf_ld_acquire_sys(in) - flag) < 0; spins++) {
            if ((spins & 1023) == 0) {
                uint64_t t = global_ns();
                if (!t0) t0 = t;
                else if (t - t0 > timeout_ns) {
                    *err = 1u + p;
                    __threadfence_system();
                    *failed_s = 1;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return *failed_s;
}

__global__ void __launch_bounds__(SF_AR_THREADS) k_allreduce(sf_k_ar a)
{
    __shared__ unsigned flag_s;
    __shared__ int failed_s;
    ar_sig *self = (ar_sig *)a.region[a.rank];
    if (threadIdx.x == 0) {
        flag_s = self->count[blockIdx.x] + 1;
        self->count[blockIdx.x] = flag_s;
        failed_s = 0;
    }
    __syncthreads();
    const unsigned flag = flag_s;
    const size_t off = SF_AR_SIG_BYTES + (flag & 1) * a.buf_bytes;
    const int64_t nv = a.n / 8, tail = a.n - nv * 8;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;

    /* 1. this block's share into the own buffer (the peers' same block reads exactly it) */
    uint4 *mine = (uint4 *)(a.region[a.rank] + off);
    const uint4 *src = (const uint4 *)a.data;
    for (int64_t v = first; v < nv; v += step) mine[v] = src[v];
    if (blockIdx.x == 0 && threadIdx.x < tail) ((uint16_t *)mine)[nv * 8 + threadIdx.x] = a.data[nv * 8 + threadIdx.x];
    __syncthreads();

    /* 2. raise this call's flag at every rank; wait for every rank's */
    if (exchange_flags(a.region, a.rank, a.size, offsetof(ar_sig, flag) + blockIdx.x * sizeof self->flag[0], flag,
                       a.timeout_ns, a.err, &failed_s, true))
        return;

    /* 3. sum in rank order, the same on every rank */
    for (int64_t v = first; v < nv; v += step) {
        float acc[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
        /* L2 loads (__ldcg): never an L1 line of an earlier call */
        for (int r = 0; r < a.size; r++) add8(acc, __ldcg((const uint4 *)(a.region[r] + off) + v));
        uint4 o;
        bf162 *h = (bf162 *)&o;
#pragma unroll
        for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
        ((uint4 *)a.data)[v] = o;
    }
    if (blockIdx.x == 0 && threadIdx.x < tail) {
        float acc = 0;
        for (int r = 0; r < a.size; r++)
            acc += __bfloat162float(
                __ushort_as_bfloat16(__ldcg((const unsigned short *)(a.region[r] + off) + nv * 8 + threadIdx.x)));
        ((bf16 *)a.data)[nv * 8 + threadIdx.x] = f2bf(acc);
    }
}

/* The 8 data bytes of an LL line of this call, once both its flags are `flag`. Gives up (zeros,
 * *failed set, 1 + peer in *err) after the timeout, or at once when another thread of the block
 * gave up, so that every thread still reaches the block's barriers. */
static __device__ uint2 ll_wait(const uint4 *p, unsigned flag, uint64_t timeout_ns, volatile unsigned *err, int peer,
                                volatile int *failed)
{
    uint4 l = ld_volatile_v4(p);
    uint64_t t0 = 0;
    for (unsigned spins = 1; l.y != flag || l.w != flag; spins++) {
        if (spin_late(spins, &t0, timeout_ns, err, peer, failed)) return make_uint2(0, 0);
        l = ld_volatile_v4(p);
    }
    return make_uint2(l.x, l.z);
}

/* The LL variant (allreduce.h): line i = values [4i, 4i + 4) goes, with this call's flag beside
 * each 4-byte half, straight into slot [this rank] of every peer's LL buffer of the call's
 * parity; then each line of every peer is read from the own region until both its flags are
 * this call's, and the lines are summed in rank order. Line i belongs to block (i / blockDim)
 * mod SF_AR_BLOCKS whatever the grid, so a block's counter numbers the uses of its lines. */
__global__ void __launch_bounds__(SF_AR_THREADS) k_allreduce_ll(sf_k_ar a)
{
    __shared__ unsigned flag_s;
    __shared__ int failed_s;
    /* launched with PDL (a.pdl): the next kernel (a GEMV that streams its weights before its
     * own wait) may start now; this one waits for the kernel before, which wrote the message */
    sf_pdl_trigger();
    sf_pdl_wait();
    ar_sig *self = (ar_sig *)a.region[a.rank];
    if (threadIdx.x == 0) {
        flag_s = self->ll_count[blockIdx.x] + 1;
        self->ll_count[blockIdx.x] = flag_s;
        failed_s = 0;
    }
    __syncthreads();
    const unsigned flag = flag_s;
    const int64_t nl = (a.n + 3) / 4, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x,
                  step = (int64_t)gridDim.x * blockDim.x;
    const size_t slot = 2 * a.ll_bytes, base = a.ll_off + (size_t)(flag & 1) * a.size * slot;

    /* 1. push: every line of this thread to every peer (one-way NVLink writes, no fence) */
    for (int64_t i = first; i < nl; i += step) {
        uint2 v = load4(a.data, i, a.n);
        uint4 line = make_uint4(v.x, flag, v.y, flag);
        for (int r = 0; r < a.size; r++)
            if (r != a.rank) st_volatile_v4((uint4 *)(a.region[r] + base + (size_t)a.rank * slot) + i, line);
    }

    /* 2. wait for each peer's line in the own region, sum in rank order (the same bits everywhere) */
    for (int64_t i = first; i < nl; i += step) {
        float acc[4] = { 0, 0, 0, 0 };
        for (int r = 0; r < a.size; r++)
            add4(acc, r == a.rank ? load4(a.data, i, a.n)
                                  : ll_wait((const uint4 *)(a.region[a.rank] + base + (size_t)r * slot) + i, flag,
                                            a.timeout_ns, a.err, r, &failed_s));
        if (failed_s) return; /* the message stays unsummed; the watchdog reports the rank */
        bf162 lo = __floats2bfloat162_rn(acc[0], acc[1]), hi = __floats2bfloat162_rn(acc[2], acc[3]);
        if (4 * i + 4 <= a.n) {
            ((uint2 *)a.data)[i] = make_uint2(*(unsigned *)&lo, *(unsigned *)&hi);
        } else {
            bf16 o[4] = { lo.x, lo.y, hi.x, hi.y };
            for (int k = 0; k < 4 && 4 * i + k < a.n; k++) ((bf16 *)a.data)[4 * i + k] = o[k];
        }
    }
}


/* The fused all-reduce + residual add + RMSNorm (allreduce.h sf_k_arn). Launched with PDL
 * (a.pdl): it may start while the projection before it still runs, and waits for it before it
 * touches anything but the norm's weight, the call counter included.
 * EARLY (a.early): the latencies that do not depend on the peers overlap instead of following
 * each other: the block's first row is loaded together with the call counter and kept in
 * registers for the sum, the norm's weight before the programmatic wait, and the first row's
 * residual before the flag wait. */
template <int VPT, bool EARLY>
__global__ void __launch_bounds__(SF_ARN_THREADS) k_allreduce_norm(sf_k_arn a)
{
    __shared__ unsigned flag_s;
    __shared__ int failed_s;
    __shared__ float red[32];
    const int nv = a.cols / 8;
    const int64_t r0 = blockIdx.x;
    const bool first = r0 < a.rows; /* this block has a row */
    uint4 wv[VPT], v0[VPT], rv0[VPT];
    if (EARLY) { /* the weight: no kernel of the step writes it */
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i < nv) wv[u] = ((const uint4 *)a.w)[i];
        }
    }
    sf_pdl_wait();
    ar_sig *self = (ar_sig *)a.region[a.rank];
    if (EARLY && first) { /* in flight with the counter's load below */
        const uint4 *xr = (const uint4 *)(a.x + r0 * a.cols);
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i < nv) v0[u] = xr[i];
        }
    }
    if (threadIdx.x == 0) {
        flag_s = self->ncount[blockIdx.x] + 1;
        self->ncount[blockIdx.x] = flag_s;
        failed_s = 0;
    }
    __syncthreads();
    const unsigned flag = flag_s;
    const size_t base = a.push_off + (size_t)(flag & 1) * a.size * a.push_bytes;

    /* 1. push this block's rows to every peer, slot of this rank (all loads, then the stores) */
    for (int64_t r = r0; r < a.rows; r += gridDim.x) {
        const uint4 *xr = (const uint4 *)(a.x + r * a.cols);
        uint4 v[VPT];
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i < nv) v[u] = EARLY && r == r0 ? v0[u] : xr[i];
        }
        for (int p = 0; p < a.size; p++) {
            if (p == a.rank) continue;
            uint4 *dst = (uint4 *)(a.region[p] + base + (size_t)a.rank * a.push_bytes) + r * nv;
#pragma unroll
            for (int u = 0; u < VPT; u++) {
                const int i = threadIdx.x + u * SF_ARN_THREADS;
                if (i < nv) dst[i] = v[u];
            }
        }
    }
    if (EARLY && first && a.res) { /* local: in flight during the flag exchange */
        const uint4 *rr = (const uint4 *)(a.res + r0 * a.cols);
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i < nv) rv0[u] = rr[i];
        }
    }

    /* 2. flags */
    __syncthreads();
    if (exchange_flags(a.region, a.rank, a.size, offsetof(ar_sig, nflag) + blockIdx.x * sizeof self->nflag[0], flag,
                       a.timeout_ns, a.err, &failed_s, false))
        return;
    /* the kernel after this one may launch: it waits for this one's end before it reads */
    sf_pdl_trigger();

    /* 3. per row: sum in rank order (the same bits on every rank), residual add, norm */
    for (int64_t r = r0; r < a.rows; r += gridDim.x) {
        const bool kept = EARLY && r == r0;
        uint4 hv[VPT];
        float ss = 0.0f;
        uint4 *xr = (uint4 *)(a.x + r * a.cols), *rr = a.res ? (uint4 *)(a.res + r * a.cols) : NULL;
#pragma unroll
        for (int u = 0; u < VPT; u++) { /* loads and sums only: no store yet */
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i >= nv) continue;
            float acc[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
            for (int p = 0; p < a.size; p++)
                /* L2 loads: a peer's line never comes from a stale L1 line */
                add8(acc, p == a.rank ? (kept ? v0[u] : xr[i])
                                      : __ldcg((const uint4 *)(a.region[a.rank] + base + (size_t)p * a.push_bytes) +
                                               r * nv + i));
            bf162 *h = (bf162 *)&hv[u];
            if (rr) {
                const uint4 rv = kept ? rv0[u] : rr[i];
                const bf162 *rh = (const bf162 *)&rv;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    float2 sm = __bfloat1622float2(__floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]));
                    float2 o = __bfloat1622float2(rh[k]);
                    h[k] = __floats2bfloat162_rn(o.x + sm.x, o.y + sm.y);
                }
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) h[k] = __floats2bfloat162_rn(acc[2 * k], acc[2 * k + 1]);
            }
        }
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i >= nv) continue;
            (rr ? rr : xr)[i] = hv[u];
            const bf162 *h = (const bf162 *)&hv[u];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 f = __bfloat1622float2(h[k]);
                ss += f.x * f.x + f.y * f.y;
            }
        }
        ss = block_sum(ss, red);
        const float inv = rsqrtf(ss / (float)a.cols + a.eps);
#pragma unroll
        for (int u = 0; u < VPT; u++) {
            const int i = threadIdx.x + u * SF_ARN_THREADS;
            if (i >= nv) continue;
            const uint4 w = EARLY ? wv[u] : ((const uint4 *)a.w)[i];
            const bf162 *h = (const bf162 *)&hv[u], *wh = (const bf162 *)&w;
            uint4 o;
            bf162 *oh = (bf162 *)&o;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                float2 f = __bfloat1622float2(h[k]), g = __bfloat1622float2(wh[k]);
                /* as sf_k_rmsnorm: normalise in fp32, round, then scale */
                float2 nrm = __bfloat1622float2(__floats2bfloat162_rn(f.x * inv, f.y * inv));
                oh[k] = __floats2bfloat162_rn(nrm.x * g.x, nrm.y * g.y);
            }
            ((uint4 *)(a.out + r * a.cols))[i] = o;
        }
    }
}

template <int V, bool E>
static int arn_launch(const sf_k_arn *a, cudaStream_t s)
{
    if (a->pdl) return sf_launch_pdl(k_allreduce_norm<V, E>, dim3(SF_ARN_BLOCKS), dim3(SF_ARN_THREADS), 0, s, *a);
    k_allreduce_norm<V, E><<<SF_ARN_BLOCKS, SF_ARN_THREADS, 0, s>>>(*a);
    return sf_launch_status();
}

template <int V>
static int arn_launch(const sf_k_arn *a, cudaStream_t s)
{
    return a->early ? arn_launch<V, true>(a, s) : arn_launch<V, false>(a, s);
}

extern "C" size_t sf_k_ar_push_off(size_t buf_bytes, size_t ll_bytes, int size)
{
    return SF_AR_SIG_BYTES + 2 * buf_bytes + 2 * (size_t)size * 2 * ll_bytes;
}

extern "C" size_t sf_k_ar_region_bytes(size_t buf_bytes, size_t ll_bytes, int size)
{
    return sf_k_ar_push_off(buf_bytes, ll_bytes, size) + 2 * (size_t)size * buf_bytes;
}

extern "C" int sf_k_allreduce_norm(const sf_k_arn *a, cudaStream_t s)
{
    if (a->rows <= 0) return 0;
    const int nv = a->cols / 8, vpt = (nv + SF_ARN_THREADS - 1) / SF_ARN_THREADS;
    if (a->size < 2 || a->size > SF_AR_MAX_RANKS || a->cols < 8 || a->cols % 8 || a->cols > SF_ARN_MAX_COLS ||
        (size_t)a->rows * a->cols * 2 > a->push_bytes || ((uintptr_t)a->x & 15) || ((uintptr_t)a->res & 15) ||
        ((uintptr_t)a->w & 15) || ((uintptr_t)a->out & 15))
        return (int)cudaErrorInvalidValue;
    if (vpt <= 1) return arn_launch<1>(a, s);
    if (vpt <= 2) return arn_launch<2>(a, s);
    if (vpt <= 4) return arn_launch<4>(a, s);
    return arn_launch<8>(a, s);
}

extern "C" int sf_k_allreduce(const sf_k_ar *a, cudaStream_t s)
{
    if (a->n <= 0) return 0;
    if (a->size < 1 || a->size > SF_AR_MAX_RANKS || ((uintptr_t)a->data & 15)) return (int)cudaErrorInvalidValue;
    if (a->ll) {
        if ((size_t)a->n * 2 > a->ll_bytes) return (int)cudaErrorInvalidValue;
        int64_t lines = (a->n + 3) / 4, blocks = (lines + SF_AR_THREADS - 1) / SF_AR_THREADS;
        dim3 grid((unsigned)(blocks < SF_AR_BLOCKS ? blocks : SF_AR_BLOCKS));
        if (a->pdl) return sf_launch_pdl(k_allreduce_ll, grid, dim3(SF_AR_THREADS), 0, s, *a);
        k_allreduce_ll<<<grid, SF_AR_THREADS, 0, s>>>(*a);
        return sf_launch_status();
    }
    if ((size_t)a->n * 2 > a->buf_bytes) return (int)cudaErrorInvalidValue;
    k_allreduce<<<SF_AR_BLOCKS, SF_AR_THREADS, 0, s>>>(*a);
    return sf_launch_status();
}
