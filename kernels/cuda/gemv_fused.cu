/* gemv_fused.cu — batch-1 GEMV with the neighbouring small ops folded in, so a decode layer runs
 * three GEMV launches instead of three GEMVs plus two norms, a SiLU·mul and two residual adds:
 *
 *   norm:  y = rmsnorm(x) * nw . W^T (+ bias)           (RMSNorm as the prologue)
 *   glu:   y[j] = silu(z[j]) * z[f + j], z = rmsnorm(x) * nw . W^T (+ bias)   (W = gate rows, then up rows)
 *   add:   y += x . W^T (+ bias)                          (the residual add as the epilogue)
 *   rope:  qkv = rmsnorm(x) * nw . Wqkv^T (+ bias), then RoPE on the q and k heads and the k and
 *          v heads written to the paged cache at the token's slot   (rope_kv.cu as the epilogue)
 *
 * Decode is bound by reading W once. A warp streams two rows of W (two neighbouring rows, or a
 * gate row and its up row; one row per warp is a variant) with 16-byte loads that bypass L1,
 * against x held in shared memory (norm: every block normalises the row itself from L2, 8 KiB
 * for d = 4096, after its first weight loads are issued) or read through L1 (add). The loads go
 * either into registers (FG_U per row in flight per lane, drained at each loop iteration) or,
 * in the ring mode, through a per-warp ring of shared-memory stages filled by cp.async that
 * stays full across iterations. Which op takes which: ring_mode() (measured per op in a graph,
 * docs/PERFORMANCE.md).
 *
 * Launched as programmatic dependents (common.cuh): a block issues its first weight loads (into
 * registers or the ring) before it waits for the kernel before it, so the weight stream starts
 * under that kernel's tail (attention, the previous GEMV's last wave) instead of after it; and it
 * lets the next kernel start the same way. Pulling weights into L2 ahead of their GEMV (bulk
 * prefetches of a launch's rows before its wait, rolling prefetches ahead of the loads, the next
 * GEMV's weight during attention, evict_first on the stream) was tried in several forms and
 * dropped: none was faster end to end, and the first-wave and rolling prefetches were slower
 * (docs/PERFORMANCE.md).
 *
 * Rounding follows the unfused path exactly: the normalised x is bf16(bf16(x * inv) * nw), GEMV
 * outputs are rounded to bf16 before SiLU (which is rounded again, as HF does) and before the
 * residual add. Only the order of the fp32 sums differs. */
#include "b1trace.cuh"
#include "gemv_ring.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define FG_UNROLL 4 /* default loads of each of the two rows in flight per lane */

/* One output unit per warp (fg_unit_rows: its rows ra, rb of W). MODE is a set of FG_* flags.
 * k % 8 == 0 and every pointer 16-byte aligned (the launcher checks). Dynamic shared memory:
 * k bf16 (norm), then the ring. */
/* RING: the weight loads go through a per-warp ring of fg_ring_st shared-memory stages filled by
 * cp.async (FG_RING_V 16-byte loads per row per lane each), after the normalised row; a lane
 * reads back only the slots it filled, so cp.async.wait_group is the only synchronisation. The
 * loads then stay in flight across loop iterations instead of draining at each (FG_U unused). */
static constexpr int fg_ring_st(int mode) { return (mode & FG_ONE) ? 6 : 4; }
/* MODE | FG_TRACE: with the timeline marks (b1trace.cuh), norm modes only (their prologue's
 * barrier orders the block's marks); an instance of its own, as in gemv_stream.cu, and a mode bit
 * rather than a template parameter so that the unmarked instances stay as they were. The warps
 * end on their own, so the last warp of the block to finish writes the record (tr_warp_end). */
enum { FG_TRACE = 64 };
template <int MODE, int WARPS, int FG_U, bool RING = false>
__global__ void __launch_bounds__(WARPS * 32) k_gemv_fused(const bf16 *__restrict__ x, const bf16 *__restrict__ nw,
                                                           float eps, const bf16 *__restrict__ w,
                                                           const bf16 *__restrict__ bias, int m, int k,
                                                           bf16 *__restrict__ y, fg_rope rp)
{
    constexpr bool TR = (MODE & FG_TRACE) != 0;
    static_assert(!TR || (MODE & FG_NORM), "the marks need the norm prologue's barrier");
    extern __shared__ __align__(16) unsigned char fg_smem[];
    __shared__ float red[32];
    __shared__ sf_tr tr;
    __shared__ unsigned tr_done;
    if (TR) {
        tr_begin(tr);
        if (threadIdx.x == 0) tr_done = 0;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = k / 8;
    /* units: glu -> f = m / 2 outputs, one (gate, up) pair each; one row: m; else ceil(m / 2) row pairs */
    constexpr bool TWO = !(MODE & FG_ONE);
    const int units = fg_units(MODE, m);
    const int u = blockIdx.x * WARPS + warp;
    const bool active = u < units;
    const fg_unit r = active ? fg_unit_rows<MODE>(u, m, rp) : fg_unit{ 0, 0, 0, 0, false };
    const int ra = r.ra, rb = r.rb;
    const uint4 *wa = (const uint4 *)(w + (int64_t)ra * k), *wb = (const uint4 *)(w + (int64_t)rb * k);
    sf_pdl_trigger();

    constexpr int NR = TWO ? 2 : 1, FG_RING_ST = fg_ring_st(MODE); /* rows per warp, ring stages */
    uint4 *ring = (uint4 *)(fg_smem + (MODE & FG_NORM ? ((size_t)k * 2 + 15) / 16 * 16 : 0)) +
                  (size_t)warp * FG_RING_ST * NR * FG_RING_V * 32 + lane;
    const int n_st = RING && active ? (k8 + 32 * FG_RING_V - 1) / (32 * FG_RING_V) : 0;
    /* stage t: uint4 columns [t * 32 * FG_RING_V, (t + 1) * 32 * FG_RING_V) of each row */
    auto ring_issue = [&](int t) {
        if (t < n_st) gr_stage_copy<NR>(ring + (size_t)(t % FG_RING_ST) * NR * FG_RING_V * 32, wa, wb, t, k8, lane);
        gr_commit(); /* one group per stage, empty or not: wait_group counts them */
    };
    if constexpr (RING) {
#pragma unroll
        for (int t = 0; t < FG_RING_ST - 1; t++) ring_issue(t);
    }

    /* first weight loads in flight before the wait */
    uint4 va[FG_U], vb[FG_U];
#pragma unroll
    for (int i = 0; i < FG_U; i++) {
        int c = lane + i * 32;
        if (!RING && active && c < k8) { va[i] = gr_ld_stream(wa + c); vb[i] = TWO ? gr_ld_stream(wb + c) : va[i]; }
        else { va[i] = make_uint4(0, 0, 0, 0); vb[i] = va[i]; }
    }
    sf_pdl_wait(); /* x, y, the cache and pos/slot may be written by the kernels before */
    if (TR) tr_waited(tr);

    const bf16x8 *xv;
    if (MODE & FG_NORM) {
        bf16x8 *xs = (bf16x8 *)fg_smem;
        const bf16x8 *x8 = (const bf16x8 *)x, *n8 = (const bf16x8 *)nw;
        const float ss = block_sum(gr_row_sumsq(x8, xs, k8, WARPS * 32), red);
        gr_row_scale(xs, n8, rsqrtf(ss / (float)k + eps), k8, WARPS * 32);
        __syncthreads();
        if (TR) tr_ready(tr);
        xv = xs;
    } else {
        xv = (const bf16x8 *)x;
    }
    if (!active) {
        if (RING) gr_wait<0>();
        if (TR && lane == 0) tr_warp_end(tr, &tr_done, WARPS, SF_TR_GEMV + (MODE & ~FG_TRACE), m, k);
        return;
    }

    float acc_a = 0.0f, acc_b = 0.0f;
    if constexpr (RING) {
        for (int t = 0; t < n_st; t++) {
            ring_issue(t + FG_RING_ST - 1); /* into the slot consumed at t - 1 */
            gr_wait<FG_RING_ST - 1>();       /* stage t has landed */
            gr_stage_dot<NR>(ring + (size_t)(t % FG_RING_ST) * NR * FG_RING_V * 32, xv, t, k8, lane, acc_a, acc_b);
        }
        gr_wait<0>();
    } else
    for (int c0 = lane;; c0 += FG_U * 32) {
#pragma unroll
        for (int i = 0; i < FG_U; i++) {
            int c = c0 + i * 32;
            if (c < k8) {
                bf16x8 xx = xv[c];
                acc_a = gr_dot8(va[i], xx, acc_a);
                if (TWO) acc_b = gr_dot8(vb[i], xx, acc_b);
            }
        }
        const int next = c0 + FG_U * 32;
        if (next - lane >= k8) break;
#pragma unroll
        for (int i = 0; i < FG_U; i++) {
            int c = next + i * 32;
            if (c < k8) { va[i] = gr_ld_stream(wa + c); if (TWO) vb[i] = gr_ld_stream(wb + c); }
            else { va[i] = make_uint4(0, 0, 0, 0); vb[i] = va[i]; }
        }
    }
    acc_a = warp_sum(acc_a);
    if (TWO) acc_b = warp_sum(acc_b);
    if (lane) return;
    fg_epilogue<MODE>(r, u, acc_a, acc_b, bias, y, rp);
    if (TR) tr_warp_end(tr, &tr_done, WARPS, SF_TR_GEMV + (MODE & ~FG_TRACE), m, k);
}

SF_TR_SETTER(sf_k_gemv_fused_trace)

extern "C" int sf_k_gemv_fused_ok(const void *x, const void *w, int k)
{
    return k > 0 && k % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

/* SEMFLOW_CUDA_GEMV_RING: 3 (default) -> every fused GEMV on persistent warps (gemv_stream.cu)
 * where x fits shared memory and the planner makes a plan (not for the QKV projection beside
 * the one-token tensor-core attention), else as 2; 2 -> every fused GEMV through the cp.async ring, a warp
 * per unit, two rows per warp for O and down; 1 -> the ring, one row per warp for O and
 * down; 0 -> registers everywhere, one row per warp for O and down (the choice before the ring).
 * Ops are not mixed: a ring kernel (dynamic shared memory) next to a register kernel (none)
 * cannot share an SM's carveout, so the next kernel's blocks wait for the SM to drain and the
 * programmatic-launch overlap is lost (measured: 146 us per layer mixed against 119.5 all on the
 * ring, docs/PERFORMANCE.md). Read once (the launch thread is the backend's only thread). */
static int ring_mode(void)
{
    static const int mode = (int)sf_env_long("SEMFLOW_CUDA_GEMV_RING", 3, 0, 3);
    return mode;
}

template <int MODE, int WARPS, int FG_U = FG_UNROLL, bool RING = false>
static int launch(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias, int m,
                  int k, uint16_t *y, const fg_rope &rp, cudaStream_t s)
{
    const int units = fg_units(MODE, m);
    const size_t ring = RING ? (size_t)WARPS * fg_ring_st(MODE) * ((MODE & FG_ONE) ? 1 : 2) * FG_RING_V * 32 * 16 : 0;
    const size_t smem = ((size_t)k * 2 * ((MODE & FG_NORM) != 0) + 15) / 16 * 16 + ring;
    static sf_k_smem smem_set;
    int e = sf_k_smem_attr(&smem_set, k_gemv_fused<MODE, WARPS, FG_U, RING>, smem);
    if (e) return e;
    const int grid = (int)sf_div_up(units, WARPS);
    int rc = sf_launch_pdl(k_gemv_fused<MODE, WARPS, FG_U, RING>, dim3(grid), dim3(WARPS * 32), smem, s, (const bf16 *)x,
                           (const bf16 *)nw, eps, (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y, rp);
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_gemv_norm(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                              const uint16_t *bias, int m, int k, int glu, uint16_t *y, cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || k > SF_K_GEMV_NORM_MAX_K || !nw || (uintptr_t)nw % 16 || !y || m < 1 ||
        (glu && m % 2))
        return (int)cudaErrorInvalidValue;
    fg_rope rp = {};
    int rc;
    if (ring_mode() == 3 &&
        (rc = sf_gemv_stream(glu ? FG_NORM | FG_GLU : FG_NORM, x, nw, eps, w, bias, m, k, y, rp, s)) >= 0)
        return rc;
    if (glu && ring_mode() >= 1) return launch<FG_NORM | FG_GLU, 8, 8, true>(x, nw, eps, w, bias, m, k, y, rp, s);
    if (!glu && ring_mode() != 0) return launch<FG_NORM, 8, 4, true>(x, nw, eps, w, bias, m, k, y, rp, s);
    return glu ? launch<FG_NORM | FG_GLU, 8, 8>(x, nw, eps, w, bias, m, k, y, rp, s)
               : launch<FG_NORM, 8>(x, nw, eps, w, bias, m, k, y, rp, s);
}

extern "C" int sf_k_gemv_add(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                             cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || !y || m < 1) return (int)cudaErrorInvalidValue;
    fg_rope rp = {};
    int rc;
    if (ring_mode() == 3 && (rc = sf_gemv_stream(FG_ADD, x, NULL, 0.0f, w, bias, m, k, y, rp, s)) >= 0) return rc;
    switch (ring_mode()) {
    case 0: return launch<FG_ADD | FG_ONE, 4, 8>(x, NULL, 0.0f, w, bias, m, k, y, rp, s);
    case 1: return launch<FG_ADD | FG_ONE, 4, 8, true>(x, NULL, 0.0f, w, bias, m, k, y, rp, s);
    default: return launch<FG_ADD, 4, 4, true>(x, NULL, 0.0f, w, bias, m, k, y, rp, s);
    }
}

extern "C" int sf_k_gemv_norm_rope(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                                   const uint16_t *bias, int k, int H, int Hkv, int hd, int rot_dim, int interleaved,
                                   const int32_t *pos, const int32_t *slot, const float *inv_freq, sf_k_kv kv,
                                   int attn_kernel, uint16_t *qkv, cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || k > SF_K_GEMV_NORM_MAX_K || !nw || (uintptr_t)nw % 16 || !qkv || H < 1 ||
        Hkv < 1 || hd < 2 || hd % 2 || rot_dim < 2 || rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv ||
        kv.head_dim != hd || kv.block_size < 1)
        return (int)cudaErrorInvalidValue;
    /* A pool with INT8 blocks (ids >= kv.i8_base) is fine as long as this token's slot is in a
     * full-precision block: the backend sends steps that touch INT8 blocks to rope_kv.cu, which
     * quantises them, and the kernel never writes into one. */
    fg_rope rp = { pos, slot, inv_freq, H, Hkv, hd, rot_dim, interleaved, kv };
    const int m = (H + 2 * Hkv) * hd;
    /* the persistent warps unless their planner declines (beside the one-token tensor-core
     * attention: gemv_stream.cu plan()), then the per-warp ring kernel */
    int rc;
    if (ring_mode() == 3 &&
        (rc = sf_gemv_stream(FG_NORM | FG_ROPE, x, nw, eps, w, bias, m, k, qkv, rp, s, attn_kernel)) >= 0)
        return rc;
    static const bool traced = tr_wanted(); /* SEMFLOW_CUDA_TRACE: the marked instance */
    if (ring_mode() != 0 && traced)
        return launch<FG_NORM | FG_ROPE | FG_TRACE, 8, 4, true>(x, nw, eps, w, bias, m, k, qkv, rp, s);
    if (ring_mode() != 0) return launch<FG_NORM | FG_ROPE, 8, 4, true>(x, nw, eps, w, bias, m, k, qkv, rp, s);
    return launch<FG_NORM | FG_ROPE, 8>(x, nw, eps, w, bias, m, k, qkv, rp, s);
}

/* Benchmarks only: the same kernels with other block sizes and load depths. */
template <int MODE>
static int tune(int warps, int unroll, const uint16_t *x, const uint16_t *nw, const uint16_t *w, int m, int k,
                uint16_t *y, cudaStream_t s)
{
    fg_rope rp = {};
    if (warps == 4 && unroll == 4) return launch<MODE, 4, 4>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 4 && unroll == 8) return launch<MODE, 4, 8>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 8 && unroll == 4) return launch<MODE, 8, 4>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 8 && unroll == 8) return launch<MODE, 8, 8>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 16 && unroll == 4) return launch<MODE, 16, 4>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 4 && unroll == 201) return launch<MODE, 4, 4, true>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if (warps == 8 && unroll == 201) return launch<MODE, 8, 4, true>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    if constexpr (!(MODE & FG_GLU)) { /* one row per warp (unroll + 100) */
        if (warps == 4 && unroll == 108) return launch<MODE | FG_ONE, 4, 8>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
        if (warps == 8 && unroll == 108) return launch<MODE | FG_ONE, 8, 8>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
        if (warps == 4 && unroll == 116) return launch<MODE | FG_ONE, 4, 16>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
        if (warps == 4 && unroll == 200) return launch<MODE | FG_ONE, 4, 8, true>(x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int sf_k_gemv_fused_tune(int kind, int warps, int unroll, const uint16_t *x, const uint16_t *nw,
                                    const uint16_t *w, int m, int k, uint16_t *y, cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || m < 2 || m % 2 || k > SF_K_GEMV_NORM_MAX_K * (kind == 2 ? 4 : 1))
        return (int)cudaErrorInvalidValue;
    return kind == 0 ? tune<FG_NORM>(warps, unroll, x, nw, w, m, k, y, s)
           : kind == 1 ? tune<FG_NORM | FG_GLU>(warps, unroll, x, nw, w, m, k, y, s)
                       : tune<FG_ADD>(warps, unroll, x, nw, w, m, k, y, s);
}
