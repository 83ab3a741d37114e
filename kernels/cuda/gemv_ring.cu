/* gemv_ring.cu — batch-1 GEMV with the residual add (y[m] += x . W^T (+ bias)) whose weight loads
 * go through a ring of shared-memory stages filled by cp.async (16 bytes per lane, L2 only),
 * instead of registers: a warp keeps RING_ST x RING_V 16-byte loads per lane in flight all the
 * time (the register kernel, gemv_fused.cu, drains its loads at every loop iteration), and
 * registers no longer bound how many are in flight.
 *
 * One row per warp, RING_WARPS warps per block. Each lane reads back only the slots it filled
 * itself, so cp.async.wait_group is the only synchronisation. Launched as a programmatic
 * dependent (common.cuh): the first RING_ST - 1 stages are issued before the wait. Rounding is
 * that of gemv_fused.cu's add mode (the product rounded to bf16, then added). Opt-in:
 * SEMFLOW_CUDA_GEMV_RING=1 (read once), which also switches gemv_fused.cu's norm, glu and rope
 * launches to their ring mode. */
#include "common.cuh"

#define RING_WARPS 4
#define RING_ST 6 /* stages */
#define RING_V 2  /* 16-byte loads per lane per stage */

static __device__ __forceinline__ void cp_async16(void *smem, const void *g)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(g) : "memory");
}
static __device__ __forceinline__ void cp_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void cp_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

__global__ void __launch_bounds__(RING_WARPS * 32) k_gemv_ring_add(const bf16 *__restrict__ x,
                                                                   const bf16 *__restrict__ w,
                                                                   const bf16 *__restrict__ bias, int m, int k,
                                                                   bf16 *__restrict__ y)
{
    __shared__ uint4 ring[RING_WARPS][RING_ST][RING_V][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = k / 8;
    const int r = blockIdx.x * RING_WARPS + warp;
    const bool active = r < m;
    const uint4 *wr = (const uint4 *)(w + (int64_t)(active ? r : 0) * k);
    const int n_st = active ? (k8 + 32 * RING_V - 1) / (32 * RING_V) : 0; /* stages of this row */
    sf_pdl_trigger();
    /* stage t holds uint4 columns [t * 32 * RING_V, (t + 1) * 32 * RING_V) of the row */
#pragma unroll
    for (int t = 0; t < RING_ST - 1; t++) {
        if (t < n_st) {
#pragma unroll
            for (int v = 0; v < RING_V; v++) {
                const int c = (t * RING_V + v) * 32 + lane;
                if (c < k8) cp_async16(&ring[warp][t][v][lane], wr + c);
            }
        }
        cp_commit(); /* one group per stage, empty or not: wait_group counts them */
    }
    sf_pdl_wait(); /* x and y are written by the kernels before */
    const bf16x8 *x8 = (const bf16x8 *)x;
    float acc = 0.0f;
    for (int t = 0; t < n_st; t++) {
        const int tn = t + RING_ST - 1; /* refill the slot consumed at t - 1 */
        if (tn < n_st) {
#pragma unroll
            for (int v = 0; v < RING_V; v++) {
                const int c = (tn * RING_V + v) * 32 + lane;
                if (c < k8) cp_async16(&ring[warp][tn % RING_ST][v][lane], wr + c);
            }
        }
        cp_commit();
        cp_wait<RING_ST - 1>(); /* stage t has landed */
        const int sl = t % RING_ST;
#pragma unroll
        for (int v = 0; v < RING_V; v++) {
            const int c = (t * RING_V + v) * 32 + lane;
            if (c < k8) {
                const uint4 wv = ring[warp][sl][v][lane];
                const bf16x8 xv = x8[c];
                const bf162 *wh = (const bf162 *)&wv;
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 wf = __bfloat1622float2(wh[h]), xf = __bfloat1622float2(xv.h[h]);
                    acc = fmaf(wf.x, xf.x, acc);
                    acc = fmaf(wf.y, xf.y, acc);
                }
            }
        }
    }
    cp_wait<0>();
    if (!active) return;
    acc = warp_sum(acc);
    if (lane) return;
    if (bias) acc += bf2f(bias[r]);
    y[r] = f2bf(bf2f(y[r]) + bf2f(f2bf(acc)));
}

extern "C" int sf_k_gemv_ring_enabled(void)
{
    static const int on = [] {
        const char *e = getenv("SEMFLOW_CUDA_GEMV_RING");
        return e && e[0] == '1';
    }();
    return on;
}

extern "C" int sf_k_gemv_ring_add(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                                  cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || !y || m < 1) return (int)cudaErrorInvalidValue;
    int rc = sf_launch_pdl(k_gemv_ring_add, dim3(sf_div_up(m, RING_WARPS)), dim3(RING_WARPS * 32), 0, s, (const bf16 *)x,
                           (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y);
    return rc ? rc : sf_launch_status();
}
