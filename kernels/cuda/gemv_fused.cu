/* gemv_fused.cu — batch-1 GEMV with the neighbouring small ops folded in, so a decode layer runs
 * three GEMV launches instead of three GEMVs plus two norms, a SiLU·mul and two residual adds:
 *
 *   norm:  y = rmsnorm(x) * nw . W^T (+ bias)           (RMSNorm as the prologue)
 *   glu:   y[j] = silu(z[j]) * z[f + j], z = rmsnorm(x) * nw . W^T (+ bias)   (W = gate rows, then up rows)
 *   add:   y += x . W^T (+ bias)                          (the residual add as the epilogue)
 *
 * Decode is bound by reading W once. A warp streams two rows of W (two neighbouring rows, or a
 * gate row and its up row) with 16-byte loads that bypass L1, FG_UNROLL per row in flight per
 * lane, against x held in shared memory (norm: every block normalises the row itself from L2,
 * 8 KiB for d = 4096, after its first weight loads are issued) or read through L1 (add).
 *
 * Rounding follows the unfused path exactly: the normalised x is bf16(bf16(x * inv) * nw), GEMV
 * outputs are rounded to bf16 before SiLU (which is rounded again, as HF does) and before the
 * residual add. Only the order of the fp32 sums differs. */
#include "common.cuh"

#define FG_UNROLL 4

enum { FG_NORM = 1, FG_GLU = 2, FG_ADD = 4 };

static __device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

static __device__ __forceinline__ float dot8(const uint4 &w, const bf16x8 &x, float acc)
{
    const bf162 *wh = (const bf162 *)&w;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 wf = __bfloat1622float2(wh[h]), xf = __bfloat1622float2(x.h[h]);
        acc = fmaf(wf.x, xf.x, acc);
        acc = fmaf(wf.y, xf.y, acc);
    }
    return acc;
}

/* One output unit per warp: rows (ra, rb) of W. MODE is a set of FG_* flags. k % 8 == 0 and
 * every pointer 16-byte aligned (the launcher checks). Dynamic shared memory: k bf16 (norm). */
template <int MODE, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) k_gemv_fused(const bf16 *__restrict__ x, const bf16 *__restrict__ nw,
                                                           float eps, const bf16 *__restrict__ w,
                                                           const bf16 *__restrict__ bias, int m, int k,
                                                           bf16 *__restrict__ y)
{
    extern __shared__ __align__(16) unsigned char fg_smem[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = k / 8;
    /* units: glu -> f = m / 2 outputs, one (gate, up) pair each; else ceil(m / 2) row pairs */
    const int units = (MODE & FG_GLU) ? m / 2 : (m + 1) / 2;
    const int u = blockIdx.x * WARPS + warp;
    const bool active = u < units;
    int ra = 0, rb = 0;
    if (active) {
        if (MODE & FG_GLU) { ra = u; rb = u + m / 2; }
        else { ra = 2 * u; rb = min(2 * u + 1, m - 1); }
    }
    const uint4 *wa = (const uint4 *)(w + (int64_t)ra * k), *wb = (const uint4 *)(w + (int64_t)rb * k);

    /* first weight loads in flight before the prologue */
    uint4 va[FG_UNROLL], vb[FG_UNROLL];
#pragma unroll
    for (int i = 0; i < FG_UNROLL; i++) {
        int c = lane + i * 32;
        if (active && c < k8) { va[i] = ld_stream(wa + c); vb[i] = ld_stream(wb + c); }
        else { va[i] = make_uint4(0, 0, 0, 0); vb[i] = va[i]; }
    }

    const bf16x8 *xv;
    if (MODE & FG_NORM) {
        bf16x8 *xs = (bf16x8 *)fg_smem;
        const bf16x8 *x8 = (const bf16x8 *)x, *n8 = (const bf16x8 *)nw;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < k8; i += WARPS * 32) {
            bf16x8 v = x8[i];
            xs[i] = v;
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(v.h[h]);
                ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
            }
        }
        ss = block_sum(ss, red);
        const float inv = rsqrtf(ss / (float)k + eps);
        for (int i = threadIdx.x; i < k8; i += WARPS * 32) {
            bf16x8 v = xs[i], g = n8[i], o;
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(v.h[h]), gw = __bfloat1622float2(g.h[h]);
                float n0 = bf2f(f2bf(f.x * inv)), n1 = bf2f(f2bf(f.y * inv)); /* HF: round, then scale */
                o.h[h] = __floats2bfloat162_rn(n0 * gw.x, n1 * gw.y);
            }
            xs[i] = o;
        }
        __syncthreads();
        xv = xs;
    } else {
        xv = (const bf16x8 *)x;
    }
    if (!active) return;

    float acc_a = 0.0f, acc_b = 0.0f;
    for (int c0 = lane;; c0 += FG_UNROLL * 32) {
#pragma unroll
        for (int i = 0; i < FG_UNROLL; i++) {
            int c = c0 + i * 32;
            if (c < k8) {
                bf16x8 xx = xv[c];
                acc_a = dot8(va[i], xx, acc_a);
                acc_b = dot8(vb[i], xx, acc_b);
            }
        }
        const int next = c0 + FG_UNROLL * 32;
        if (next - lane >= k8) break;
#pragma unroll
        for (int i = 0; i < FG_UNROLL; i++) {
            int c = next + i * 32;
            if (c < k8) { va[i] = ld_stream(wa + c); vb[i] = ld_stream(wb + c); }
            else { va[i] = make_uint4(0, 0, 0, 0); vb[i] = va[i]; }
        }
    }
    acc_a = warp_sum(acc_a);
    acc_b = warp_sum(acc_b);
    if (lane) return;
    if (bias) { acc_a += bf2f(bias[ra]); acc_b += bf2f(bias[rb]); }
    if (MODE & FG_GLU) {
        float g = bf2f(f2bf(acc_a)), up = bf2f(f2bf(acc_b));
        float sg = bf2f(f2bf(g / (1.0f + __expf(-g)))); /* HF rounds act(gate) to bf16 first */
        y[u] = f2bf(sg * up);
    } else if (MODE & FG_ADD) {
        y[ra] = f2bf(bf2f(y[ra]) + bf2f(f2bf(acc_a)));
        if (rb != ra) y[rb] = f2bf(bf2f(y[rb]) + bf2f(f2bf(acc_b)));
    } else {
        y[ra] = f2bf(acc_a);
        if (rb != ra) y[rb] = f2bf(acc_b);
    }
}

extern "C" int sf_k_gemv_fused_ok(const void *x, const void *w, int k)
{
    return k > 0 && k % 8 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)w % 16 == 0;
}

template <int MODE, int WARPS>
static int launch(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias, int m,
                  int k, uint16_t *y, cudaStream_t s)
{
    const int units = (MODE & FG_GLU) ? m / 2 : (m + 1) / 2;
    const size_t smem = (size_t)k * 2 * ((MODE & FG_NORM) != 0);
    static size_t smem_set = 48 * 1024; /* the launch thread is the backend's only thread */
    if (smem > smem_set) {
        cudaError_t e = cudaFuncSetAttribute(k_gemv_fused<MODE, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return (int)e;
        smem_set = smem;
    }
    k_gemv_fused<MODE, WARPS><<<sf_div_up(units, WARPS), WARPS * 32, smem, s>>>(
        (const bf16 *)x, (const bf16 *)nw, eps, (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y);
    return sf_launch_status();
}

extern "C" int sf_k_gemv_norm(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                              const uint16_t *bias, int m, int k, int glu, uint16_t *y, cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || k > SF_K_GEMV_NORM_MAX_K || !nw || (uintptr_t)nw % 16 || !y || m < 1 ||
        (glu && m % 2))
        return (int)cudaErrorInvalidValue;
    return glu ? launch<FG_NORM | FG_GLU, 8>(x, nw, eps, w, bias, m, k, y, s)
               : launch<FG_NORM, 8>(x, nw, eps, w, bias, m, k, y, s);
}

extern "C" int sf_k_gemv_add(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                             cudaStream_t s)
{
    if (!sf_k_gemv_fused_ok(x, w, k) || !y || m < 1) return (int)cudaErrorInvalidValue;
    return launch<FG_ADD, 4>(x, NULL, 0.0f, w, bias, m, k, y, s);
}
