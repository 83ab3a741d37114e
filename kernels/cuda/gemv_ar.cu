/* gemv_ar.cu — the batch-1 GEMVs of a tensor-parallel layer that carry its all-reduces (the
 * batch-1 link, allreduce.h): the row-parallel projections (O, down) push their contribution to
 * the peers as each warp finishes, and the norm GEMV after each sums the ranks' contributions in
 * its prologue, so no all-reduce kernel and no extra kernel boundary sits between them.
 *
 * The GEMV core is the one of gemv_fused.cu's ring mode (gemv_ring.cuh): two output rows per
 * warp, the weight rows streamed through a per-warp ring of cp.async stages that is filled
 * before the programmatic wait (the stream starts under the previous kernel's tail). Rounding
 * is the unfused path's: products rounded to bf16, then added to the residual and rounded; the
 * sum over ranks in fp32 in rank order, rounded; the norm as gr_row_scale rounds. */
#include "allreduce.cuh"
#include "allreduce.h"
#include "gemv_ring.cuh"

#define TP_V 2  /* 16-byte loads per row per lane in a stage; stages per warp: the template's ST */
#define TP_CNT_BYTES ((size_t)SF_TPL_CHANNELS * SF_TPL_MAX_BLOCKS * sizeof(unsigned))
#define TP_SLOT_BYTES ((size_t)(SF_TPL_MAX_COLS / 2) * 8)

static __device__ __forceinline__ unsigned *tp_cnt(const sf_k_tpl &l, int ch)
{
    return (unsigned *)(l.region[l.rank] + l.off) + (size_t)ch * SF_TPL_MAX_BLOCKS;
}

/* Channel ch's lines from rank `from`, in the region of rank `at`. */
static __device__ __forceinline__ uint2 *tp_lines(const sf_k_tpl &l, int at, int ch, int from)
{
    return (uint2 *)(l.region[at] + l.off + TP_CNT_BYTES + ((size_t)ch * l.size + from) * TP_SLOT_BYTES);
}

/* Channel ch's norm scratch in this rank's region: the call number, then (256 bytes on) the row. */
static __device__ __forceinline__ unsigned *tp_scratch(const sf_k_tpl &l, int ch)
{
    return (unsigned *)(l.region[l.rank] + l.off + TP_CNT_BYTES + (size_t)SF_TPL_CHANNELS * l.size * TP_SLOT_BYTES +
                        (size_t)ch * (256 + (size_t)SF_TPL_MAX_COLS * 2));
}

/* The data word of a line once it carries `flag` (0 after a timeout, *failed set). */
static __device__ __forceinline__ unsigned tp_wait8(const uint2 *p, unsigned flag, const sf_k_tpl &l, int peer,
                                                    volatile int *failed)
{
    uint2 v = ld_volatile_v2(p);
    uint64_t t0 = 0;
    for (unsigned spins = 1; v.y != flag; spins++) {
        if (spin_late(spins, &t0, l.timeout_ns, l.err, peer, failed)) return 0;
        v = ld_volatile_v2(p);
    }
    return v.x;
}

/* Two neighbouring lines (4 values) once both carry `flag`. */
static __device__ __forceinline__ uint2 tp_wait16(const uint4 *p, unsigned flag, const sf_k_tpl &l, int peer,
                                                  volatile int *failed)
{
    uint4 v = ld_volatile_v4(p);
    uint64_t t0 = 0;
    for (unsigned spins = 1; v.y != flag || v.w != flag; spins++) {
        if (spin_late(spins, &t0, l.timeout_ns, l.err, peer, failed)) return make_uint2(0, 0);
        v = ld_volatile_v4(p);
    }
    return make_uint2(v.x, v.z);
}

/* Values [8i, 8i + 8) of the sum over ranks of channel ch (h: this rank's contribution), in
 * rank order in fp32, rounded to bf16. */
static __device__ __forceinline__ uint4 tp_sum8(const sf_k_tpl &l, int ch, unsigned flag, const uint16_t *h, int i,
                                                volatile int *failed)
{
    float acc[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int r = 0; r < l.size; r++) {
        uint4 v;
        if (r == l.rank) {
            v = __ldcg((const uint4 *)h + i);
        } else {
            const uint4 *p = (const uint4 *)tp_lines(l, l.rank, ch, r) + 2 * i;
            uint2 lo = tp_wait16(p, flag, l, r, failed), hi = tp_wait16(p + 1, flag, l, r, failed);
            v = make_uint4(lo.x, lo.y, hi.x, hi.y);
        }
        add8(acc, v);
    }
    uint4 o;
    bf162 *oh = (bf162 *)&o;
#pragma unroll
    for (int q = 0; q < 4; q++) oh[q] = __floats2bfloat162_rn(acc[2 * q], acc[2 * q + 1]);
    return o;
}

/* MODE: SF_TPK_PUSH, GLU, NORM or ROPE. One unit (two output rows) per warp, TP_ST ring stages
 * per warp. Dynamic shared memory: the normalised row (not PUSH), then the warps' rings. */
template <int MODE, int WARPS, int TP_ST>
__global__ void __launch_bounds__(WARPS * 32) k_gemv_tp(sf_k_tp a, sf_k_tpl l)
{
    extern __shared__ __align__(16) unsigned char tp_smem[];
    __shared__ float red[32];
    __shared__ unsigned flag_s, prev_s;
    __shared__ int failed_s, have_s;
    constexpr bool NORM = MODE != SF_TPK_PUSH;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = a.k / 8;
    const int units = a.m / 2, u = blockIdx.x * WARPS + warp;
    const bool active = u < units;
    int ra = 0, rb = 0, hh = 0, ri = 0;
    bool rotate = false;
    if (active) {
        if (MODE == SF_TPK_GLU) { ra = u; rb = u + units; }
        else if (MODE == SF_TPK_ROPE) {
            const int half = a.hd / 2;
            hh = u / half;
            ri = u - hh * half;
            rotate = hh < a.H + a.Hkv && ri < a.rot / 2;
            ra = hh * a.hd + (rotate && !a.interleaved ? ri : 2 * ri);
            rb = ra + (rotate && !a.interleaved ? a.rot / 2 : 1);
        } else { ra = 2 * u; rb = 2 * u + 1; }
    }
    const uint4 *wa = (const uint4 *)(a.w + (int64_t)ra * a.k), *wb = (const uint4 *)(a.w + (int64_t)rb * a.k);
    sf_pdl_trigger();

    uint4 *ring = (uint4 *)(tp_smem + (NORM ? ((size_t)a.k * 2 + 15) / 16 * 16 : 0)) +
                  (size_t)warp * TP_ST * 2 * TP_V * 32 + lane;
    const int n_st = active ? (k8 + 32 * TP_V - 1) / (32 * TP_V) : 0;
    auto issue = [&](int t) {
        if (t < n_st) {
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int v = 0; v < TP_V; v++) {
                    const int c = (t * TP_V + v) * 32 + lane;
                    if (c < k8) gr_cp16(ring + (((t % TP_ST) * 2 + rr) * TP_V + v) * 32, (rr ? wb : wa) + c);
                }
        }
        gr_commit();
    };
#pragma unroll
    for (int t = 0; t < TP_ST - 1; t++) issue(t);
    sf_pdl_wait(); /* x, h, the counters and the cache are written by the kernels before */

    if (threadIdx.x == 0) {
        failed_s = 0;
        if (MODE == SF_TPK_PUSH) {
            unsigned *cnt = tp_cnt(l, a.ch) + blockIdx.x;
            flag_s = *cnt + 1;
            *cnt = flag_s;
            prev_s = a.prev >= 0 ? *tp_cnt(l, a.prev) : 0;
        } else {
            flag_s = *tp_cnt(l, a.ch);
        }
    }
    __syncthreads();
    const bf16x8 *xv = NORM ? (const bf16x8 *)tp_smem : (const bf16x8 *)a.x;
    if (NORM) { /* the sum over ranks, then the norm, into shared memory */
        bf16x8 *xs = (bf16x8 *)tp_smem;
        unsigned *scr = tp_scratch(l, a.ch);
        uint4 *scr_row = (uint4 *)((char *)scr + 256);
        if (threadIdx.x == 0) have_s = a.share && ld_acquire_gpu(scr) == flag_s;
        __syncthreads();
        if (have_s) { /* an earlier block of this call left the normed row */
            for (int i = threadIdx.x; i < k8; i += WARPS * 32) {
                uint4 v = __ldcg(scr_row + i);
                xs[i] = *(const bf16x8 *)&v;
            }
        } else {
            float ss = 0.0f;
            for (int i = threadIdx.x; i < k8; i += WARPS * 32) {
                uint4 o = tp_sum8(l, a.ch, flag_s, a.h, i, &failed_s);
                xs[i] = *(const bf16x8 *)&o;
                const bf162 *oh = (const bf162 *)&o;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    float2 f = __bfloat1622float2(oh[q]);
                    ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
                }
            }
            ss = block_sum(ss, red);
            gr_row_scale(xs, (const bf16x8 *)a.nw, rsqrtf(ss / (float)a.k + a.eps), k8, WARPS * 32);
            __syncthreads();
            if (a.share && !failed_s) { /* leave it for the blocks that start later */
                for (int i = threadIdx.x; i < k8; i += WARPS * 32) __stcg(scr_row + i, *(const uint4 *)&xs[i]);
                __syncthreads();
                if (threadIdx.x == 0) {
                    __threadfence();
                    st_release_gpu(scr, flag_s);
                }
            }
        }
        __syncthreads();
    }
    if (!active) {
        gr_wait<0>();
        return;
    }

    float acc_a = 0.0f, acc_b = 0.0f;
    for (int t = 0; t < n_st; t++) {
        issue(t + TP_ST - 1);
        gr_wait<TP_ST - 1>();
        const uint4 *st = ring + (size_t)(t % TP_ST) * 2 * TP_V * 32;
#pragma unroll
        for (int v = 0; v < TP_V; v++) {
            const int c = (t * TP_V + v) * 32 + lane;
            if (c < k8) {
                bf16x8 xx = xv[c];
                acc_a = gr_dot8(st[v * 32], xx, acc_a);
                acc_b = gr_dot8(st[(TP_V + v) * 32], xx, acc_b);
            }
        }
    }
    gr_wait<0>();
    acc_a = warp_sum(acc_a);
    acc_b = warp_sum(acc_b);
    if (lane) return;
    if (a.bias) { acc_a += bf2f(((const bf16 *)a.bias)[ra]); acc_b += bf2f(((const bf16 *)a.bias)[rb]); }
    bf16 *y = (bf16 *)a.y;
    if (MODE == SF_TPK_PUSH) {
        float pa = bf2f(f2bf(acc_a)), pb = bf2f(f2bf(acc_b));
        unsigned *hw = (unsigned *)a.h + u; /* rows 2u, 2u + 1 */
        bf162 v;
        if (l.rank == 0) {
            float2 res;
            if (a.prev >= 0) { /* the stream at these rows: the sum of channel prev */
                float sa = 0.0f, sb = 0.0f;
                for (int r = 0; r < l.size; r++) {
                    unsigned d = r == 0 ? __ldcg(hw) : tp_wait8(tp_lines(l, 0, a.prev, r) + u, prev_s, l, r, &failed_s);
                    float2 f = __bfloat1622float2(*(const bf162 *)&d);
                    sa += f.x;
                    sb += f.y;
                }
                res = __bfloat1622float2(__floats2bfloat162_rn(sa, sb));
            } else {
                const unsigned hv = __ldcg(hw);
                res = __bfloat1622float2(*(const bf162 *)&hv);
            }
            v = __floats2bfloat162_rn(res.x + pa, res.y + pb);
        } else {
            v = __floats2bfloat162_rn(pa, pb);
        }
        const unsigned d = *(const unsigned *)&v;
        *hw = d;
        for (int p = 0; p < l.size; p++)
            if (p != l.rank) st_volatile_v2(tp_lines(l, p, a.ch, l.rank) + u, make_uint2(d, flag_s));
    } else if (MODE == SF_TPK_GLU) {
        float g = bf2f(f2bf(acc_a)), up = bf2f(f2bf(acc_b));
        float sg = bf2f(f2bf(g / (1.0f + __expf(-g)))); /* HF rounds act(gate) to bf16 first */
        y[u] = f2bf(sg * up);
    } else if (MODE == SF_TPK_ROPE) {
        const int sl = a.slot[0];
        const bool i8 = a.kv.i8_base && sl / a.kv.block_size >= a.kv.i8_base;
        gr_rope_store(acc_a, acc_b, rotate, ri, hh, ra, rb, a.pos[0], a.inv_freq, i8 ? -1 : sl, a.H, a.Hkv, a.hd,
                      a.kv.block_size, a.kv.k, a.kv.v, y);
    } else {
        y[ra] = f2bf(acc_a);
        y[rb] = f2bf(acc_b);
    }
}

/* h = the sum over ranks of channel ch: one thread per 8 values. */
__global__ void __launch_bounds__(256) k_tp_sum(sf_k_tp a, sf_k_tpl l)
{
    __shared__ unsigned flag_s;
    __shared__ int failed_s;
    sf_pdl_trigger();
    sf_pdl_wait();
    if (threadIdx.x == 0) {
        flag_s = *tp_cnt(l, a.ch);
        failed_s = 0;
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < a.k / 8) {
        uint4 o = tp_sum8(l, a.ch, flag_s, a.h, i, &failed_s);
        ((uint4 *)a.h)[i] = o;
    }
}

static size_t smem_bytes(int mode, int warps, int st, int k)
{
    return (mode != SF_TPK_PUSH ? ((size_t)k * 2 + 15) / 16 * 16 : 0) + (size_t)warps * st * 2 * TP_V * 32 * 16;
}

/* Lets k_gemv_tp<MODE, WARPS, ST> take `smem` bytes of dynamic shared memory (the attribute
 * only grows; the amount a launch passes is what sets its occupancy). */
template <int MODE, int WARPS, int ST>
static int allow_smem(size_t smem)
{
    static size_t set = 48 * 1024; /* the launch thread is the backend's only thread */
    if (smem <= set) return 0;
    cudaError_t e = cudaFuncSetAttribute(k_gemv_tp<MODE, WARPS, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e == cudaSuccess) set = smem;
    return (int)e;
}

template <int MODE, int WARPS, int ST>
static int launch_st(const sf_k_tp *a, const sf_k_tpl *l, unsigned grid, cudaStream_t s)
{
    const size_t smem = smem_bytes(MODE, WARPS, ST, a->k);
    int rc = allow_smem<MODE, WARPS, ST>(smem);
    if (!rc) rc = sf_launch_pdl(k_gemv_tp<MODE, WARPS, ST>, dim3(grid), dim3(WARPS * 32), smem, s, *a, *l);
    return rc ? rc : sf_launch_status();
}

/* Blocks of k_gemv_tp<MODE, WARPS, ST> one SM holds at once (0 when the query fails). */
template <int MODE, int WARPS, int ST>
static int per_sm(int k)
{
    const size_t smem = smem_bytes(MODE, WARPS, ST, k);
    int n = 0;
    if (allow_smem<MODE, WARPS, ST>(smem) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_gemv_tp<MODE, WARPS, ST>, WARPS * 32, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

/* Ring stages: a->stages when set (2..4), else 4 unless the grid then needs more than one wave
 * and 3 or 2 stages (less shared memory per block, more blocks per SM) fit it in one: a grid
 * just over one wave runs its last blocks alone (the 70B shards: O and down 1024 blocks of 4
 * warps, QKV 320 of 8). Decided once per shape (cached; the launch thread is the backend's only
 * thread). */
template <int MODE, int WARPS>
static int launch(const sf_k_tp *a, const sf_k_tpl *l, cudaStream_t s)
{
    const unsigned grid = sf_div_up(a->m / 2, WARPS);
    if (MODE == SF_TPK_PUSH && grid > SF_TPL_MAX_BLOCKS) return (int)cudaErrorInvalidValue;
    int st = a->stages;
    if (st < 2 || st > 4) {
        static struct { int m, k, st; } memo[16];
        static int n_memo, sms;
        for (int i = 0; i < n_memo && st < 2; i++)
            if (memo[i].m == a->m && memo[i].k == a->k) st = memo[i].st;
        if (st < 2) {
            if (!sms) {
                int dev = 0;
                if (cudaGetDevice(&dev) != cudaSuccess ||
                    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
                    sms = 0;
                cudaGetLastError();
            }
            st = 4;
            if (sms && (unsigned)(per_sm<MODE, WARPS, 4>(a->k) * sms) < grid) {
                if ((unsigned)(per_sm<MODE, WARPS, 3>(a->k) * sms) >= grid) st = 3;
                else if ((unsigned)(per_sm<MODE, WARPS, 2>(a->k) * sms) >= grid) st = 2;
            }
            if (n_memo < 16) memo[n_memo++] = { a->m, a->k, st };
        }
    }
    if (st == 2) return launch_st<MODE, WARPS, 2>(a, l, grid, s);
    if (st == 3) return launch_st<MODE, WARPS, 3>(a, l, grid, s);
    return launch_st<MODE, WARPS, 4>(a, l, grid, s);
}

extern "C" int sf_k_gemv_tp(const sf_k_tp *a, const sf_k_tpl *l, cudaStream_t s)
{
    const int cols = a->mode == SF_TPK_PUSH ? a->m : a->k;
    if (l->size < 2 || l->size > SF_AR_MAX_RANKS || l->rank < 0 || l->rank >= l->size || a->ch < 0 ||
        a->ch >= SF_TPL_CHANNELS || cols < 8 || cols % 8 || cols > SF_TPL_MAX_COLS || !a->h || ((uintptr_t)a->h & 15))
        return (int)cudaErrorInvalidValue;
    if (a->mode == SF_TPK_SUM) {
        int rc = sf_launch_pdl(k_tp_sum, dim3(sf_div_up(cols / 8, 256)), dim3(256), 0, s, *a, *l);
        return rc ? rc : sf_launch_status();
    }
    if (!a->w || ((uintptr_t)a->w & 15) || a->k < 8 || a->k % 8 || a->m < 2 || a->m % 2 ||
        (a->mode != SF_TPK_PUSH && !a->y))
        return (int)cudaErrorInvalidValue;
    switch (a->mode) {
    case SF_TPK_PUSH:
        if (a->bias || a->prev >= SF_TPL_CHANNELS || a->prev == a->ch || !a->x || ((uintptr_t)a->x & 15))
            return (int)cudaErrorInvalidValue;
        return launch<SF_TPK_PUSH, 4>(a, l, s);
    case SF_TPK_GLU:
    case SF_TPK_NORM:
    case SF_TPK_ROPE:
        if (!a->nw || ((uintptr_t)a->nw & 15) || ((uintptr_t)a->y & 3)) return (int)cudaErrorInvalidValue;
        if (a->mode == SF_TPK_GLU) return launch<SF_TPK_GLU, 8>(a, l, s);
        if (a->mode == SF_TPK_NORM) return launch<SF_TPK_NORM, 8>(a, l, s);
        if (a->H < 1 || a->Hkv < 1 || a->hd < 2 || a->hd % 2 || a->rot < 2 || a->rot % 2 || a->rot > a->hd ||
            a->m != (a->H + 2 * a->Hkv) * a->hd || a->kv.n_kv_heads != a->Hkv || a->kv.head_dim != a->hd ||
            a->kv.block_size < 1 || !a->pos || !a->slot || !a->inv_freq)
            return (int)cudaErrorInvalidValue;
        return launch<SF_TPK_ROPE, 8>(a, l, s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}
