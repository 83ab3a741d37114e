/* gemv.cu — skinny GEMM for n <= 8 rows of activations: y[n, m] = x[n, k] . W[m, k]^T (+ bias).
 *
 * Decode is bound by reading W once. One warp per output feature streams its row of W with
 * 16-byte loads (UNROLL of them in flight per lane) and multiplies it with all n rows of x
 * (small, served from L1/L2), accumulating in fp32; a warp reduction finishes each dot.
 * UNROLL loads of W per lane are in flight at a time (8 for n <= 2, 4 above). */
#include "common.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define GEMV_WARPS 4

template <int N>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv(const bf16 *__restrict__ x, int64_t ldx,
                                                          const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                                                          int m, int k, bf16 *__restrict__ y, int64_t ldy, int vec)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (r >= m) return;
    const bf16 *wr = w + r * k;
    constexpr int UNROLL = N <= 2 ? 8 : 4; /* 16-byte loads in flight per lane */
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; i++) acc[i] = 0.0f;
    int c0 = 0;
    if (vec) {
        const int k8 = k / 8;
        const bf16x8 *w8 = (const bf16x8 *)wr;
        int c = lane;
        for (; c + (UNROLL - 1) * 32 < k8; c += UNROLL * 32) {
            bf16x8 wv[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) { uint4 t4 = __ldg((const uint4 *)(w8 + c + u * 32)); wv[u] = *(const bf16x8 *)&t4; }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
#pragma unroll
                for (int i = 0; i < N; i++) {
                    bf16x8 xv = *(const bf16x8 *)(x + i * ldx + (int64_t)(c + u * 32) * 8);
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        float2 wf = __bfloat1622float2(wv[u].h[h]), xf = __bfloat1622float2(xv.h[h]);
                        acc[i] = fmaf(wf.x, xf.x, acc[i]);
                        acc[i] = fmaf(wf.y, xf.y, acc[i]);
                    }
                }
            }
        }
        for (; c < k8; c += 32) {
            bf16x8 wv = w8[c];
#pragma unroll
            for (int i = 0; i < N; i++) {
                bf16x8 xv = *(const bf16x8 *)(x + i * ldx + (int64_t)c * 8);
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 wf = __bfloat1622float2(wv.h[h]), xf = __bfloat1622float2(xv.h[h]);
                    acc[i] = fmaf(wf.x, xf.x, acc[i]);
                    acc[i] = fmaf(wf.y, xf.y, acc[i]);
                }
            }
        }
        c0 = k8 * 8;
    }
    for (int c = c0 + lane; c < k; c += 32) {
        float wf = bf2f(wr[c]);
#pragma unroll
        for (int i = 0; i < N; i++) acc[i] = fmaf(wf, bf2f(x[i * ldx + c]), acc[i]);
    }
#pragma unroll
    for (int i = 0; i < N; i++) acc[i] = warp_sum(acc[i]);
    if (lane == 0) {
        float b = bias ? bf2f(bias[r]) : 0.0f;
#pragma unroll
        for (int i = 0; i < N; i++) y[i * ldy + r] = f2bf(acc[i] + b);
    }
}

/* n >= 2 rows of x: each warp takes R output features at once, so a 16-byte vector of x read
 * through L1 serves R rows of W (k_gemv reads x once per feature: at n = 5 its x traffic was 5x
 * the weight stream, and QKV at n = 5 ran at 22% of HBM in a step, docs/PERFORMANCE.md); UNROLL x
 * R 16-byte loads of W per lane in flight. Vector path only (the caller checks alignment). */
template <int N, int R>
__global__ void __launch_bounds__(GEMV_WARPS * 32) k_gemv_rb(const bf16 *__restrict__ x, int64_t ldx,
                                                             const bf16 *__restrict__ w, const bf16 *__restrict__ bias,
                                                             int m, int k, bf16 *__restrict__ y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    const int64_t r0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * R;
    if (r0 >= m) return;
    constexpr int UNROLL = 2;
    const int k8 = k / 8;
    const bf16x8 *wr[R];
#pragma unroll
    for (int j = 0; j < R; j++) wr[j] = (const bf16x8 *)(w + (r0 + j < m ? r0 + j : (int64_t)m - 1) * k); /* past m: a repeat, not stored */
    float acc[N][R];
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < R; j++) acc[i][j] = 0.0f;
    int c = lane;
    for (; c + (UNROLL - 1) * 32 < k8; c += UNROLL * 32) {
        bf16x8 wv[UNROLL][R];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
#pragma unroll
            for (int j = 0; j < R; j++) { uint4 t4 = __ldg((const uint4 *)(wr[j] + c + u * 32)); wv[u][j] = *(const bf16x8 *)&t4; }
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
#pragma unroll
            for (int i = 0; i < N; i++) {
                bf16x8 xv = *(const bf16x8 *)(x + i * ldx + (int64_t)(c + u * 32) * 8);
#pragma unroll
                for (int h = 0; h < 4; h++) {
                    float2 xf = __bfloat1622float2(xv.h[h]);
#pragma unroll
                    for (int j = 0; j < R; j++) {
                        float2 wf = __bfloat1622float2(wv[u][j].h[h]);
                        acc[i][j] = fmaf(wf.x, xf.x, acc[i][j]);
                        acc[i][j] = fmaf(wf.y, xf.y, acc[i][j]);
                    }
                }
            }
    }
    for (; c < k8; c += 32) {
        bf16x8 wv[R];
#pragma unroll
        for (int j = 0; j < R; j++) wv[j] = wr[j][c];
#pragma unroll
        for (int i = 0; i < N; i++) {
            bf16x8 xv = *(const bf16x8 *)(x + i * ldx + (int64_t)c * 8);
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 xf = __bfloat1622float2(xv.h[h]);
#pragma unroll
                for (int j = 0; j < R; j++) {
                    float2 wf = __bfloat1622float2(wv[j].h[h]);
                    acc[i][j] = fmaf(wf.x, xf.x, acc[i][j]);
                    acc[i][j] = fmaf(wf.y, xf.y, acc[i][j]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < R; j++) acc[i][j] = warp_sum(acc[i][j]);
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < R; j++) {
            if (r0 + j >= m) break;
            float b = bias ? bf2f(bias[r0 + j]) : 0.0f;
#pragma unroll
            for (int i = 0; i < N; i++) y[i * ldy + r0 + j] = f2bf(acc[i][j] + b);
        }
    }
}

template <int N>
static void launch_rb(const bf16 *X, int64_t ldx, const bf16 *W, const bf16 *B, int m, int k, bf16 *Y, int64_t ldy,
                      cudaStream_t s)
{
    /* 4 features a warp where there are enough of them to fill the GPU, else 2 */
    if (m >= 8192) k_gemv_rb<N, 4><<<sf_div_up(m, GEMV_WARPS * 4), GEMV_WARPS * 32, 0, s>>>(X, ldx, W, B, m, k, Y, ldy);
    else k_gemv_rb<N, 2><<<sf_div_up(m, GEMV_WARPS * 2), GEMV_WARPS * 32, 0, s>>>(X, ldx, W, B, m, k, Y, ldy);
}

extern "C" int sf_k_gemv(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias, int n, int m,
                         int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    if (n < 1 || n > 8) return (int)cudaErrorInvalidValue;
    int vec = (k % 8 == 0) && (ldx % 8 == 0) && ((uintptr_t)x % 16 == 0) && ((uintptr_t)w % 16 == 0);
    static int rb = -1; /* SEMFLOW_CUDA_GEMV_RB=0: k_gemv for every n (the comparison) */
    if (rb < 0) rb = sf_env_bool("SEMFLOW_CUDA_GEMV_RB", 1);
    if (vec && n >= 2 && rb) {
        const bf16 *X = (const bf16 *)x, *W = (const bf16 *)w, *B = (const bf16 *)bias;
        bf16 *Y = (bf16 *)y;
        switch (n) {
        case 2: launch_rb<2>(X, ldx, W, B, m, k, Y, ldy, s); break;
        case 3: launch_rb<3>(X, ldx, W, B, m, k, Y, ldy, s); break;
        case 4: launch_rb<4>(X, ldx, W, B, m, k, Y, ldy, s); break;
        case 5: launch_rb<5>(X, ldx, W, B, m, k, Y, ldy, s); break;
        case 6: launch_rb<6>(X, ldx, W, B, m, k, Y, ldy, s); break;
        case 7: launch_rb<7>(X, ldx, W, B, m, k, Y, ldy, s); break;
        default: launch_rb<8>(X, ldx, W, B, m, k, Y, ldy, s); break;
        }
        return sf_launch_status();
    }
    dim3 grid(sf_div_up(m, GEMV_WARPS)), block(GEMV_WARPS * 32);
    const bf16 *X = (const bf16 *)x, *W = (const bf16 *)w, *B = (const bf16 *)bias;
    bf16 *Y = (bf16 *)y;
    switch (n) {
    case 1: k_gemv<1><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 2: k_gemv<2><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 3: k_gemv<3><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 4: k_gemv<4><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 5: k_gemv<5><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 6: k_gemv<6><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    case 7: k_gemv<7><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    default: k_gemv<8><<<grid, block, 0, s>>>(X, ldx, W, B, m, k, Y, ldy, vec); break;
    }
    return sf_launch_status();
}
