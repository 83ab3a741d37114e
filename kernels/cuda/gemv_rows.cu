/* gemv_rows.cu — the fused GEMVs of a decode layer (gemv_fused.cu's modes: norm, norm + glu,
 * norm + RoPE + K/V append, residual add) for 2-8 rows of x: decode at batch 2-8, the drafted
 * steps of speculative decoding, small prefill chunks. Such a step reads the same weights as a
 * batch-1 step and should take about as long; on the general path (separate norm, GEMM, RoPE,
 * add and SiLU kernels, the GEMM on cuBLASLt or gemv.cu) it took 4.75-4.98 ms against 3.9
 * (docs/PERFORMANCE.md, "Speculative decoding").
 *
 * Why tensor cores: with CUDA cores every weight element costs n FMAs plus n conversions of x
 * from bf16; at 8 rows and the H200's ~8 weight elements per SM per clock that is past the SM's
 * 128 lanes. One mma.m16n8k16 takes 8 weight rows (B, n = 8) against x (A: rows 0-7 are the x
 * rows, clamped to n - 1; rows 8-15 are zero registers) over 16 columns: the tensor core is idle
 * most of the time and costs one instruction per 256 bytes of weights.
 *
 * The unit is 8 weight rows over all of k: pair units 4u .. 4u + 3 of fg_unit_rows (so a GLU
 * unit holds 4 gate rows and their 4 up rows, a RoPE unit 4 rotation pairs), B row j = the pair
 * unit 4u + j / 2's row a (j even) or b (j odd). Each warp streams its units' rows through a
 * cp.async ring (as gemv_stream.cu: the ring runs on from unit to unit, stages issued before the
 * programmatic-launch wait); lane (g = lane / 4, t = lane % 4) reads weight row g's 16-byte
 * vectors c = 4 i + t from the ring and x row g's vector c from shared memory (how the ring is
 * copied, and so its layout, is the configuration's: LINES below). The fragment's k order is
 * permuted, identically for A and B (a dot product does not care): lane t's 8 columns are one
 * 16-byte vector, pairs 0-1 feed the first mma's k {2t, 2t+1, 2t+8, 2t+9}, pairs 2-3 the
 * second's. The accumulator's (row g,
 * columns 2t, 2t + 1) are then x row g against pair unit 4u + t's rows a and b: the lane runs
 * gemv_ring.cuh's epilogue for that pair and that row, the same one the batch-1 kernels run.
 *
 * x (n rows, normalised in place for the norm modes, a warp a row) is held in shared memory,
 * rows 64 bytes past a 128-byte multiple apart, so that a quarter warp's 8 16-byte reads (two
 * rows, four vectors each) touch 32 banks once. That caps n * k: the down projection of
 * Llama-3-8B (k = 14336) takes up to 6 rows; larger shapes run the general path (the caller asks
 * sf_k_gemv_rows_ok). What it reaches and what was tried: plan() below, docs/PERFORMANCE.md. */
#include <stdlib.h>
#include <string.h>

#include "b1trace.cuh"
#include "gemv_ring.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define GW_WARPS 8 /* at most; a launch has as many as the SM has units for (plan) */
#define GW_PAIRS 4 /* pair units (fg_units) per 8-row unit */
/* A warp's ring stage of V 16-byte loads per lane: 8 rows x 32 V columns (V = 8: 4 KiB) */
#define GW_STAGE_BYTES(V) ((V) * 32 * 16)

/* Row stride of x in shared memory, in 16-byte vectors: 64 bytes past a multiple of 128. */
static __host__ __device__ __forceinline__ int gw_x_stride(int k) { return ((k * 2 + 127) / 128 * 128 + 64) / 16; }
/* Shared memory before the rings (x's n rows), in 16-byte vectors: a multiple of 128 bytes, so
 * that the rings' lines are 128-byte lines (an odd n's rows end 64 bytes past one: the ring's
 * copies then straddled lines and its fragment reads conflicted; Llama-3-8B's gate/up at 3 rows
 * took 76 us against 62 at 4, session 33's profile). */
static __host__ __device__ __forceinline__ size_t gw_x_vecs(int n, int k) { return ((size_t)n * gw_x_stride(k) + 7) / 8 * 8; }

/* MODE: FG_NORM (| FG_GLU | FG_ROPE), FG_ADD or 0; ST ring stages per warp of GW_V 16-byte loads
 * per lane. Dynamic shared memory: x (n rows of gw_x_stride(k) vectors; gw_x_vecs), then GW_WARPS rings of
 * ST stages (at most GW_WARPS warps; the launch's blockDim says how many). LINES (8 loads a
 * lane): the ring's copies by whole 128-byte lines (copy instruction v takes row v's 32
 * consecutive vectors, not 64 bytes of each of 8 rows), stored row by row with odd rows' halves
 * of 64 bytes swapped, so that a quarter warp's reads (rows g, g + 1) still
 * touch every bank once; lanes then read what others copied (a warp barrier after the wait, and
 * before a slot is refilled). */
template <int MODE, int ST, int GW_V, bool LINES, bool TR>
__global__ void __launch_bounds__(GW_WARPS * 32) k_gemv_rows(const bf16 *__restrict__ x, int ldx, int n,
                                                             const bf16 *__restrict__ nw, float eps,
                                                             const bf16 *__restrict__ w,
                                                             const bf16 *__restrict__ bias, int m, int k,
                                                             bf16 *__restrict__ y, int ldy, fg_rope rp)
{
    extern __shared__ __align__(128) unsigned char gw_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int k8 = k / 8, xst = gw_x_stride(k);
    const int W = blockDim.x >> 5, units = fg_units(MODE, m) / GW_PAIRS, nwarps = gridDim.x * W;
    const int n_st = (k8 + 4 * GW_V - 1) / (4 * GW_V); /* ring stages per unit */
    uint4 *xs = (uint4 *)gw_smem, *rings = xs + gw_x_vecs(n, k);
    /* TR: the timeline marks (SEMFLOW_CUDA_TRACE; tag SF_TR_GEMV + MODE), after the rings */
    sf_tr &tr = *(sf_tr *)(rings + (size_t)W * ST * GW_V * 32);
    if (TR) tr_begin(tr);
    uint4 *ringw = rings + (size_t)warp * ST * GW_V * 32; /* this warp's ring */
    sf_pdl_trigger();

    /* The issue cursor: unit iu, its stage it, the ring slot islot; wr: this lane's weight row
     * (B row g of the unit), from its vector t. Units go round the blocks first (as
     * gemv_stream.cu deals them), so every SM gets the same number plus or minus one. */
    int iu = warp * gridDim.x + blockIdx.x, it = 0, islot = 0;
    const uint4 *wr = NULL;
    /* LINES: the unit's 8 weight rows (copy instruction v takes row v: 32 vectors, 512 bytes) */
    static_assert(!LINES || GW_V == 8, "copies by whole lines take 8 loads a lane per stage");
    int rw[LINES ? 8 : 1];
    auto b_row = [&](int u, int j) { /* B row j of unit u: its weight row */
        const fg_unit r = fg_unit_rows<MODE>(u * GW_PAIRS + (j >> 1), m, rp);
        return (j & 1) ? r.rb : r.ra;
    };
    auto row_of = [&](int u) {
        if constexpr (LINES) {
#pragma unroll
            for (int i = 0; i < 8; i++) rw[i] = b_row(u, i);
        } else {
            wr = (const uint4 *)(w + (int64_t)b_row(u, g) * k) + t;
        }
    };
    if (iu < units) row_of(iu);
    auto copy = [&](int st, int sl) { /* stage st of the cursor's unit into ring slot sl */
#pragma unroll
        for (int v = 0; v < GW_V; v++) {
            if constexpr (LINES) { /* row v's vectors lane, stored with odd rows' 64-byte halves swapped */
                if (st * 4 * GW_V + lane < k8)
                    gr_cp16(ringw + (sl * GW_V + v) * 32 + (lane ^ ((v & 1) << 2)),
                            (const uint4 *)(w + (int64_t)rw[v] * k) + st * 4 * GW_V + lane);
            } else {
                const int c = (st * GW_V + v) * 4;
                if (c < k8) gr_cp16(ringw + (sl * GW_V + v) * 32 + lane, wr + c);
            }
        }
    };
    auto issue = [&]() { gr_issue<ST>(iu, it, islot, n_st, nwarps, units, copy, row_of); };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) issue(); /* weights only: before the wait */
    /* The norm weight into ring slot ST - 1 of every warp (free until the loop's first issue),
     * as gemv_stream.cu does: k up to W * SLOT * 8. */
    constexpr int SLOT = GW_V * 32;
    const int NT = W * 32;
    auto nw_at = [&](int i) { return (bf16x8 *)(rings + (i / SLOT) * (ST * SLOT) + (ST - 1) * SLOT + i % SLOT); };
    (void)wr;
    const bool nw_pre = (MODE & FG_NORM) && k8 <= W * SLOT;
    if (nw_pre)
        for (int i = threadIdx.x; i < k8; i += NT) sf_cp_async16(nw_at(i), (const uint4 *)nw + i, 16);
    gr_commit();
    sf_pdl_wait(); /* x, y and the cache may be written by the kernels before */
    if (TR) tr_waited(tr);

    /* x into shared memory in one round of copies */
    for (int i = threadIdx.x; i < n * k8; i += NT) {
        const int r = i / k8, c = i - r * k8;
        sf_cp_async16(xs + (size_t)r * xst + c, (const uint4 *)(x + (int64_t)r * ldx) + c, 16);
    }
    gr_commit();
    gr_wait<0>(); /* x, the norm weight, and the ring's first stages */
    __syncthreads();
    if (MODE & FG_NORM) {
        for (int row = warp; row < n; row += W) { /* bf16(bf16(x * inv) * nw), as the other kernels */
            bf16x8 *xr = (bf16x8 *)(xs + (size_t)row * xst);
            float ss = 0.0f;
            for (int c = lane; c < k8; c += 32) ss = gr_sumsq8(xr[c], ss);
            const float inv = rsqrtf(warp_sum(ss) / (float)k + eps);
            for (int c = lane; c < k8; c += 32)
                xr[c] = gr_scale8(xr[c], nw_pre ? *nw_at(c) : ((const bf16x8 *)nw)[c], inv);
        }
        __syncthreads(); /* x complete, and the norm weight read before the loop refills its slot */
    }
    if (TR) tr_ready(tr);

    const uint4 *xr = xs + (size_t)min(g, n - 1) * xst + t;
    int cslot = 0;
    for (int u = warp * gridDim.x + blockIdx.x; u < units; u += nwarps) {
        float d0[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, d1[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        for (int s = 0; s < n_st; s++) {
            if (LINES) __syncwarp(); /* the slot consumed last is read by every lane */
            issue();                 /* into the slot consumed last */
            gr_wait<ST - 1>();       /* this stage has landed (each lane reads only what it copied) */
            if (LINES) __syncwarp(); /* ... or what the warp copied */
            const uint4 *sl = ringw + cslot * GW_V * 32;
#pragma unroll
            for (int v = 0; v < GW_V; v++) {
                const int c = (s * GW_V + v) * 4;
                if (c < k8) {
                    const uint4 wv = LINES ? sl[g * 4 * GW_V + (v ^ (g & 1)) * 4 + t] : sl[v * 32 + lane], xv = xr[c];
                    const unsigned a0[4] = { xv.x, 0u, xv.y, 0u }, a1[4] = { xv.z, 0u, xv.w, 0u };
                    sf_mma_bf16(d0, a0, wv.x, wv.y);
                    sf_mma_bf16(d1, a1, wv.z, wv.w);
                }
            }
            if (++cslot == ST) cslot = 0;
        }
        if (g < n) fg_epilogue_row<MODE>(u * GW_PAIRS + t, d0[0] + d1[0], d0[1] + d1[1], g, m, bias, y, ldy, rp);
    }
    gr_wait<0>();
    if (TR) tr_end(tr, SF_TR_GEMV + MODE, m, k);
}

SF_TR_SETTER(sf_k_gemv_rows_trace)

/* SEMFLOW_CUDA_GEMV_ROWS: 1 (default) the kernel where it fits, 0 never (the general path);
 * SEMFLOW_CUDA_GEMV_ROWS_CFG: a configuration (cfg_valid) for every launch that fits it
 * (benchmarks); 0 planned. Read once. */
static bool rows_on(void)
{
    static const bool on = sf_env_bool("SEMFLOW_CUDA_GEMV_ROWS", 1);
    return on;
}
/* A configuration: [1000: 8 warps a block, else as many as the SM has units] + ring x 100 (1: 4
 * loads a lane per stage, each lane its own; 3: 8 loads, LINES; the numbers of session 32's
 * measurements, where 2 and 4 were LINES at 4 and 16 loads, slower everywhere, removed) + blocks
 * per SM (1, 2) x 10 + stages (3, 4, 5, 6, 8). */
static bool cfg_valid(int c)
{
    const int r = c % 1000 / 100, b = c % 100 / 10, d = c % 10;
    return c < 2000 && (r == 1 || r == 3) && b >= 1 && b <= 2 && d >= 3 && d <= 8 && d != 7;
}
static int cfg_v(int c) { return c % 1000 / 100 == 3 ? 8 : 4; }
static int forced_cfg(void)
{
    static const int cfg = gr_env_cfg("SEMFLOW_CUDA_GEMV_ROWS_CFG", 1999, cfg_valid,
                                      "[1000 for 8 warps a block] + ring (1 or 3) x 100 + blocks per SM (1..2) x 10 "
                                      "+ ring stages (3, 4, 5, 6, 8), e.g. 316");
    return cfg;
}

/* The configuration of the most weight bytes in flight an SM (blocks x warps x (ST - 1) stages x
 * the stage's loads; ties: the earlier) among rings r0 .. r1 (3: LINES, 1: 4 loads a lane), 1 or
 * 2 blocks an SM and `depths`, where x (fixed bytes a block) and the rings fit the SM's shared
 * memory. Warps a block: as many as the SM's share of the units (up to 8; 8 for want >= 1000):
 * fewer, each with more units and a deeper ring, were slower (Llama-3-8B's down projection at 6
 * rows, 3 warps of 8 stages of 4 loads: 55.1 us against 39.7 with 4 warps of 6; session 34).
 * want: only that configuration. 0 when none fits. */
static int plan_pick(int r0, int r1, long fixed, int per_sm, int sms, int units, int want, int *warps)
{
    static const int depths[] = { 3, 4, 5, 6, 8 };
    int cfg = 0;
    long best = 0;
    *warps = 0;
    for (int r = r0; r >= r1; r -= 2)
        for (int b = 1; b <= 2; b++)
            for (int d : depths) {
                const int c = (want >= 1000 ? 1000 : 0) + (want ? want % 1000 / 100 : r) * 100 + b * 10 + d;
                if (want ? want != c : r == 3 && d > 6) continue;
                const int wb = want >= 1000 ? GW_WARPS : (int)SF_MIN((long)GW_WARPS, (units + (long)b * sms - 1) / ((long)b * sms));
                if ((fixed + (long)wb * d * GW_STAGE_BYTES(cfg_v(c))) * b > per_sm) continue;
                const long score = (long)b * wb * (d - 1) * cfg_v(c);
                if (score > best) { best = score; cfg = c; *warps = wb; }
            }
    return cfg;
}

/* Configuration (as cfg_valid), grid and warps a block for n rows of k columns and `units` 8-row
 * units. A block has as many warps as its share of the units (up to 8): idle warps' rings would
 * take shared memory from the deeper rings of the others. Planned (want 0): copies by whole
 * lines, 8 loads a lane per stage (4 KiB a warp), 1 or 2 blocks per SM and 3-6 stages, what
 * fits the SM's shared memory with the most weight bytes in flight per SM (plan_pick). Measured
 * so per op on the H200 (test_gemv --perf-rows, docs/PERFORMANCE.md, Llama-3-8B, 2 and 4 rows):
 * this ring at 6 stages took the O projection in 10.3 us (76% of the copy bandwidth), QKV
 * 15.6-15.8 (74-76%), gate/up 57.8-58.3 (94-95%), down 31.1-32.7 (84-88%); 8 stages were no
 * faster (O 11.2: deeper is not better), 16 loads a lane were slower everywhere (O 14.4-15.4),
 * and so were 4 loads copied by lines (O 14.5, down 43.8) and 4 a lane each lane its own (O 10.8,
 * gate/up 74.6); 8 warps a block with idle warps (O 10.2) only where their rings fit. Where x
 * leaves these rings 3 stages or none (the down projection's 28 KiB of x a row: 6 rows and
 * more), rings of 4 loads a lane are scored beside them: at 6 rows 3 stages of lines took down
 * 47.4-47.8 us, 6 stages of 4 loads 39.4-39.7 (session 34). At 5-8 rows a 5-stage ring of lines
 * fits gate/up where 6 do not (4 stages: 65.5 us against 58.6 at 4 rows with 6).
 * A grid of one block an SM whose blocks would fit two (O at 2 rows: 112.5 KiB) is not spread
 * evenly in a step: started as attention's blocks leave, some SMs take two and some none
 * (traced: 99 SMs); padding its blocks to one an SM gained nothing in the step (gate/up, which
 * had started early on the SMs left idle, then starts later; session 33, docs/PERFORMANCE.md).
 * Else want, if it fits. Returns 0 when nothing fits. */
static int plan(int n, int k, int units, int want, int *grid, int *warps)
{
    int per_sm, reserved, sms;
    gr_smem_limits(&per_sm, &reserved, &sms);
    if (!sms) return 0;
    const long fixed = (long)gw_x_vecs(n, k) * 16 + reserved + 128 /* the timeline marks, and slack */;
    int cfg;
    if (want) cfg = plan_pick(want % 1000 / 100, want % 1000 / 100, fixed, per_sm, sms, units, want, warps);
    else if ((cfg = plan_pick(3, 3, fixed, per_sm, sms, units, 0, warps)) == 0 || cfg % 10 <= 3)
        cfg = plan_pick(3, 1, fixed, per_sm, sms, units, 0, warps);
    if (cfg) *grid = (int)SF_MIN((long)(cfg % 100 / 10) * sms, (long)units);
    return cfg;
}

static bool shape_ok(int mode, int n, const void *x, int64_t ldx, const void *w, int m, int k, int64_t ldy)
{
    return rows_on() && n >= 1 && n <= SF_K_GEMV_ROWS_MAX && k > 0 && k % 32 == 0 && m > 0 &&
           fg_units(mode, m) % GW_PAIRS == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0 && ldx % 8 == 0 &&
           ldx >= k && ldy >= ((mode & FG_GLU) ? m / 2 : m) && ldx <= INT32_MAX && ldy <= INT32_MAX;
}

template <int MODE, int ST, int V, bool LINES, bool TR>
static int launch_tr(const uint16_t *x, int64_t ldx, int n, const uint16_t *nw, float eps, const uint16_t *w,
                  const uint16_t *bias, int m, int k, uint16_t *y, int64_t ldy, const fg_rope &rp, int grid, int warps,
                  cudaStream_t s)
{
    /* x, the rings, the timeline marks (TR; in dynamic shared memory, so that nothing static
     * comes before the rings' 128-byte alignment) */
    const size_t smem = gw_x_vecs(n, k) * 16 + (size_t)warps * ST * GW_STAGE_BYTES(V) + (TR ? sizeof(sf_tr) : 0);
    static sf_k_smem smem_set; /* per instance */
    int e = sf_k_smem_attr(&smem_set, k_gemv_rows<MODE, ST, V, LINES, TR>, smem);
    if (e) return e;
    int rc = sf_launch_pdl(k_gemv_rows<MODE, ST, V, LINES, TR>, dim3(grid), dim3(warps * 32), smem, s, (const bf16 *)x,
                           (int)ldx, n, (const bf16 *)nw, eps, (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y,
                           (int)ldy, rp);
    return rc ? rc : sf_launch_status();
}

/* The marked instance when SEMFLOW_CUDA_TRACE asks for the timeline: a264515, with the marks in
 * every launch, was 1.5% slower than the build before it at 2 and 4 rows, where nothing else of
 * it differs */
template <int MODE, int ST, int V, bool LINES>
static int launch(const uint16_t *x, int64_t ldx, int n, const uint16_t *nw, float eps, const uint16_t *w,
                  const uint16_t *bias, int m, int k, uint16_t *y, int64_t ldy, const fg_rope &rp, int grid, int warps,
                  cudaStream_t s)
{
    static const bool traced = tr_wanted();
    return traced ? launch_tr<MODE, ST, V, LINES, true>(x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s)
                  : launch_tr<MODE, ST, V, LINES, false>(x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
}

template <int MODE>
static int launch_st(int cfg, const uint16_t *x, int64_t ldx, int n, const uint16_t *nw, float eps, const uint16_t *w,
                     const uint16_t *bias, int m, int k, uint16_t *y, int64_t ldy, const fg_rope &rp, int grid,
                     int warps, cudaStream_t s)
{
    switch (cfg % 1000 / 100 * 10 + cfg % 10) {
#define GW_CASE(C, ST, V, LINES) \
    case C: return launch<MODE, ST, V, LINES>(x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
        GW_CASE(13, 3, 4, false) GW_CASE(14, 4, 4, false) GW_CASE(16, 6, 4, false) GW_CASE(18, 8, 4, false)
        GW_CASE(15, 5, 4, false) GW_CASE(33, 3, 8, true) GW_CASE(34, 4, 8, true) GW_CASE(35, 5, 8, true)
        GW_CASE(36, 6, 8, true) GW_CASE(38, 8, 8, true)
#undef GW_CASE
    default: return (int)cudaErrorInvalidValue;
    }
}

/* want: a configuration (cfg_valid), 0 planned (or SEMFLOW_CUDA_GEMV_ROWS_CFG) */
static int rows(int mode, const uint16_t *x, int64_t ldx, int n, const uint16_t *nw, float eps, const uint16_t *w,
                const uint16_t *bias, int m, int k, uint16_t *y, int64_t ldy, const fg_rope &rp, cudaStream_t s,
                int want = 0)
{
    int grid = 0, warps = 0;
    if (!y || !shape_ok(mode, n, x, ldx, w, m, k, ldy) || ((mode & FG_NORM) && (!nw || (uintptr_t)nw % 16)))
        return (int)cudaErrorInvalidValue;
    const int st = plan(n, k, fg_units(mode, m) / GW_PAIRS, want ? want : forced_cfg(), &grid, &warps);
    if (!st) return (int)cudaErrorInvalidValue;
    switch (mode) {
    case 0: return launch_st<0>(st, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
    case FG_NORM: return launch_st<FG_NORM>(st, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
    case FG_NORM | FG_GLU: return launch_st<FG_NORM | FG_GLU>(st, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
    case FG_NORM | FG_ROPE: return launch_st<FG_NORM | FG_ROPE>(st, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
    case FG_ADD: return launch_st<FG_ADD>(st, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, grid, warps, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

static int kind_mode(int kind)
{
    return kind == SF_K_ROWS_NORM   ? FG_NORM
           : kind == SF_K_ROWS_GLU  ? FG_NORM | FG_GLU
           : kind == SF_K_ROWS_ADD  ? FG_ADD
           : kind == SF_K_ROWS_ROPE ? FG_NORM | FG_ROPE
                                    : 0;
}

extern "C" int sf_k_gemv_rows_ok(int kind, int n, const void *x, int64_t ldx, const void *w, int m, int k, int64_t ldy)
{
    int grid = 0, warps = 0;
    const int mode = kind_mode(kind);
    return kind >= SF_K_ROWS_NORM && kind <= SF_K_ROWS_PLAIN && shape_ok(mode, n, x, ldx, w, m, k, ldy) &&
           plan(n, k, fg_units(mode, m) / GW_PAIRS, forced_cfg(), &grid, &warps) > 0;
}

/* Benchmarks: kind as sf_k_gemv_rows_ok (not RoPE), cfg as SEMFLOW_CUDA_GEMV_ROWS_CFG. */
extern "C" int sf_k_gemv_rows_tune(int kind, int cfg, int n, const uint16_t *x, const uint16_t *nw, const uint16_t *w,
                                   int m, int k, uint16_t *y, cudaStream_t s)
{
    fg_rope rp = {};
    const int mode = kind_mode(kind);
    if (!cfg_valid(cfg) || kind == SF_K_ROWS_ROPE || kind < SF_K_ROWS_NORM || kind > SF_K_ROWS_PLAIN)
        return (int)cudaErrorInvalidValue;
    return rows(mode, x, k, n, nw, 1e-5f, w, NULL, m, k, y, (mode & FG_GLU) ? m / 2 : m, rp, s, cfg);
}

extern "C" int sf_k_gemv_rows_norm(const uint16_t *x, int64_t ldx, const uint16_t *nw, float eps, const uint16_t *w,
                                   const uint16_t *bias, int n, int m, int k, int glu, uint16_t *y, int64_t ldy,
                                   cudaStream_t s)
{
    fg_rope rp = {};
    if (glu && m % 2) return (int)cudaErrorInvalidValue;
    return rows(glu ? FG_NORM | FG_GLU : FG_NORM, x, ldx, n, nw, eps, w, bias, m, k, y, ldy, rp, s);
}

extern "C" int sf_k_gemv_rows_add(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias, int n, int m,
                                  int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    fg_rope rp = {};
    return rows(FG_ADD, x, ldx, n, NULL, 0.0f, w, bias, m, k, y, ldy, rp, s);
}

extern "C" int sf_k_gemv_rows_plain(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias, int n,
                                    int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    fg_rope rp = {};
    return rows(0, x, ldx, n, NULL, 0.0f, w, bias, m, k, y, ldy, rp, s);
}

extern "C" int sf_k_gemv_rows_rope(const uint16_t *x, int64_t ldx, const uint16_t *nw, float eps, const uint16_t *w,
                                   const uint16_t *bias, int n, int k, int H, int Hkv, int hd, int rot_dim,
                                   int interleaved, const int32_t *pos, const int32_t *slot, const float *inv_freq,
                                   sf_k_kv kv, uint16_t *qkv, int64_t ldq, cudaStream_t s)
{
    if (H < 1 || Hkv < 1 || hd < 2 || hd % 2 || rot_dim < 2 || rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv ||
        kv.head_dim != hd || kv.block_size < 1 || !pos || !slot || !inv_freq)
        return (int)cudaErrorInvalidValue;
    /* as sf_k_gemv_norm_rope: the cache is written for full-precision blocks only (the backend
     * sends steps that touch INT8 blocks through rope_kv.cu) */
    fg_rope rp = { pos, slot, inv_freq, H, Hkv, hd, rot_dim, interleaved, kv };
    return rows(FG_NORM | FG_ROPE, x, ldx, n, nw, eps, w, bias, (H + 2 * Hkv) * hd, k, qkv, ldq, rp, s);
}
