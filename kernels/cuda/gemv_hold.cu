/* gemv_hold.cu — the batch-1 residual-add GEMV (y += x . W^T, the O projection) with each warp's
 * whole unit of two rows on the chip before it waits for the kernel before it
 * (SEMFLOW_CUDA_GEMV_RING=3, SEMFLOW_CUDA_GEMV_HOLD).
 *
 * The O projection follows attention, which at batch 1 reads ~2 MB in ~8 µs on a few SMs while
 * HBM idles; its own 33.5 MB (Llama-3-8B) take ~8 µs at full bandwidth. A ring kernel has only
 * its first stages in flight when attention ends and streams the rest after. Here every warp
 * issues all of its unit's loads at its start: GH_RING stages by cp.async into shared memory and
 * GH_REGS stages into registers (16 bytes per lane per row each), and only then waits. With one
 * unit per warp and the whole grid resident (two 8-warp blocks per SM: 96 KB of shared memory and
 * 64 registers per thread each, leaving room for an attention block), the weight read overlaps
 * attention, and what is left after the wait is the dot products and the epilogue. Shapes with
 * more units than resident warps or rows longer than GH_RING + GH_REGS stages decline (-1) and
 * take gemv_stream.cu. x is read through L1 (8 KB, shared by the block's warps). */
#include "gemv_ring.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define GH_WARPS 8
#define GH_RING 6 /* stages of a unit in shared memory */
#define GH_REGS 2 /* stages of a unit in registers */
#define GH_STAGE_WARP (2 * FG_RING_V * 32 * 16) /* bytes of one stage of one warp (two rows) */

/* One unit (fg_unit_rows, add mode) per warp; at most GH_RING + GH_REGS stages of 32 x FG_RING_V
 * 16-byte columns per row (the launcher checks). Dynamic shared memory: GH_WARPS x min(stages,
 * GH_RING) stages. */
__global__ void __launch_bounds__(GH_WARPS * 32, 4) k_gemv_hold(const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                                                                const bf16 *__restrict__ bias, int m, int k,
                                                                bf16 *__restrict__ y, int ring_slots)
{
    extern __shared__ __align__(16) unsigned char gh_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = k / 8;
    const int u = blockIdx.x * GH_WARPS + warp;
    const bool active = u < fg_units(FG_ADD, m);
    const fg_rope rp = {};
    const fg_unit r = active ? fg_unit_rows<FG_ADD>(u, m, rp) : fg_unit{ 0, 0, 0, 0, false };
    const uint4 *wa = (const uint4 *)(w + (int64_t)r.ra * k), *wb = (const uint4 *)(w + (int64_t)r.rb * k);
    uint4 *ring = (uint4 *)gh_smem + (size_t)warp * ring_slots * 2 * FG_RING_V * 32 + lane;
    sf_pdl_trigger();

    /* everything of the unit in flight: ring stages, then register stages */
    if (active)
        for (int t = 0; t < ring_slots; t++)
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int v = 0; v < FG_RING_V; v++) {
                    const int c = (t * FG_RING_V + v) * 32 + lane;
                    if (c < k8) gr_cp16(ring + ((t * 2 + rr) * FG_RING_V + v) * 32, (rr ? wb : wa) + c);
                }
    gr_commit();
    uint4 rg[GH_REGS][2][FG_RING_V];
#pragma unroll
    for (int j = 0; j < GH_REGS; j++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
#pragma unroll
            for (int v = 0; v < FG_RING_V; v++) {
                const int c = ((ring_slots + j) * FG_RING_V + v) * 32 + lane;
                rg[j][rr][v] = active && c < k8 ? gr_ld_stream((rr ? wb : wa) + c) : make_uint4(0, 0, 0, 0);
            }
    sf_pdl_wait(); /* x and y are written by the kernels before */
    gr_wait<0>();
    if (!active) return;

    const bf16x8 *x8 = (const bf16x8 *)x;
    float acc_a = 0.0f, acc_b = 0.0f;
    for (int t = 0; t < ring_slots; t++)
#pragma unroll
        for (int v = 0; v < FG_RING_V; v++) {
            const int c = (t * FG_RING_V + v) * 32 + lane;
            if (c < k8) {
                const bf16x8 xx = x8[c];
                acc_a = gr_dot8(ring[((t * 2) * FG_RING_V + v) * 32], xx, acc_a);
                acc_b = gr_dot8(ring[((t * 2 + 1) * FG_RING_V + v) * 32], xx, acc_b);
            }
        }
#pragma unroll
    for (int j = 0; j < GH_REGS; j++)
#pragma unroll
        for (int v = 0; v < FG_RING_V; v++) {
            const int c = ((ring_slots + j) * FG_RING_V + v) * 32 + lane;
            if (c < k8) {
                const bf16x8 xx = x8[c];
                acc_a = gr_dot8(rg[j][0][v], xx, acc_a);
                acc_b = gr_dot8(rg[j][1][v], xx, acc_b);
            }
        }
    acc_a = warp_sum(acc_a);
    acc_b = warp_sum(acc_b);
    if (lane == 0) fg_epilogue<FG_ADD>(r, u, acc_a, acc_b, bias, y, rp);
}

/* SEMFLOW_CUDA_GEMV_HOLD=0 sends these shapes to gemv_stream.cu instead (comparisons). */
static int hold_on(void)
{
    static const int on = sf_env_bool("SEMFLOW_CUDA_GEMV_HOLD", 1);
    return on;
}

int sf_gemv_hold(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                 cudaStream_t s)
{
    int per_sm, reserved, sms;
    gr_smem_limits(&per_sm, &reserved, &sms);
    const int units = fg_units(FG_ADD, m), n_st = (k / 8 + 32 * FG_RING_V - 1) / (32 * FG_RING_V);
    const int slots = n_st < GH_RING ? n_st : GH_RING;
    const size_t smem = (size_t)GH_WARPS * slots * GH_STAGE_WARP;
    const long blocks = (units + GH_WARPS - 1) / GH_WARPS, fit = per_sm / (long)(smem + reserved);
    if (!hold_on() || !sms || n_st > GH_RING + GH_REGS || blocks > (long)sms * (fit < 2 ? fit : 2)) return -1;
    static size_t smem_set = 48 * 1024; /* the launch thread is the backend's only thread */
    static bool carve_set = false;
    if (smem > smem_set) {
        cudaError_t e = cudaFuncSetAttribute(k_gemv_hold, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        smem_set = smem;
    }
    if (!carve_set && sf_k_batch1_carveout()) {
        cudaError_t e = cudaFuncSetAttribute(k_gemv_hold, cudaFuncAttributePreferredSharedMemoryCarveout,
                                             (int)cudaSharedmemCarveoutMaxShared);
        if (e != cudaSuccess) return (int)e;
        carve_set = true;
    }
    int rc = sf_launch_pdl(k_gemv_hold, dim3((unsigned)blocks), dim3(GH_WARPS * 32), smem, s, (const bf16 *)x,
                           (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y, slots);
    return rc ? rc : sf_launch_status();
}

/* Benchmarks: the hold kernel on an add shape, cudaErrorInvalidValue where it declines. */
extern "C" int sf_k_gemv_hold_tune(const uint16_t *x, const uint16_t *w, int m, int k, uint16_t *y, cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || m < 1 || !y) return (int)cudaErrorInvalidValue;
    const int rc = sf_gemv_hold(x, w, NULL, m, k, y, s);
    return rc < 0 ? (int)cudaErrorInvalidValue : rc;
}
