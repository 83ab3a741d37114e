/* qgemv.cu — GGUF's Q8_0, Q4_K, Q5_K and Q6_K weights read in their own bytes: the GEMV of up
 * to 8 rows of activations, and rows into bf16 (the embedding's gather, and the chunks a
 * cuBLASLt GEMM takes for longer steps).
 *
 * The weights are in the layout hal.h describes (sf_qdev_pack_row: a 32-group's quants one
 * aligned 16- or 32-byte load, the scales in planes beside them). Every element is
 * w = A q - B with q the group's unsigned (Q8_0: signed) quant and A, B per 16 elements:
 *   Q8_0: A = d, B = 0; Q4_K, Q5_K: A = d sc_j, B = dmin m_j; Q6_K: A = d sc_i, B = 32 A.
 * The GEMV rounds each row of x to int8 per 32 elements (dx = max |x| / 127) in shared memory,
 * as llama.cpp's CUDA and CPU paths do, and meets the quants in dp4a: four int8 products a
 * lane an instruction, so a group of 32 costs eight of them and a dozen bit operations, well
 * under what its bytes take to arrive. Each group adds dx (A0 s0 + A1 s1) - (B0 sx0 + B1 sx1),
 * s the integer sums over its two 16-halves and sx the halves' sums of x as rounded: exact
 * against that x. One warp takes QG_R rows at a time, its lanes the groups of each (a row's
 * quants are read in 512-byte runs), QG_U groups a lane fetched before any is decoded: every
 * load of a 4096-column row in flight at once, the first ones issued before the block rounds
 * x, the next rows' before this row's reductions. The grid is what stays resident, looping
 * over the rows, so x is rounded once a block. (The first form, one group's loads at a time,
 * took 11.4 us for a 4096 x 4096 Q4_K matrix, 20% of the copy bandwidth.) */
#include "common.cuh"

#include <cuda_fp16.h>

extern "C" {
#include "../../hal/hal.h"
#include "kernels.h"
}

enum { QF_Q8_0, QF_Q4_K, QF_Q5_K, QF_Q6_K };
#define QG_WARPS 8
#define QG_R 2
#define QG_U 4

struct qgroup {
    int q[8]; /* int8 x 4 each: words 0-3 the group's elements 0-15, 4-7 elements 16-31 */
    float a0, a1, b0, b1;
};

static __device__ __forceinline__ unsigned byte_of(unsigned w0, unsigned w1, unsigned w2, int i)
{
    unsigned w = i < 4 ? w0 : i < 8 ? w1 : w2;
    return (w >> (8 * (i & 3))) & 0xFF;
}

/* The raw bytes of group g of the row at rp (k elements: G groups, S super-blocks), fetched
 * before any of them is decoded so that a lane has all its loads in flight at once. */
struct qraw {
    uint4 a, b; /* quants (Q8_0: both; the others a); K-quants' meta in b (Q6_K: its qh in b.x, b.y) */
    unsigned h, s; /* Q5_K's fifth bits; Q6_K's two scales; Q8_0's d */
    float d;       /* Q6_K's d */
};

template <int F>
static __device__ __forceinline__ void q_fetch(const uint8_t *__restrict__ rp, int G, int g, qraw &o)
{
    const int S = G / 8, sb = g / 8;
    if constexpr (F == QF_Q8_0) {
        o.a = __ldg((const uint4 *)(rp + 32 * g));
        o.b = __ldg((const uint4 *)(rp + 32 * g + 16));
        o.h = __ldg((const unsigned short *)(rp + 32 * G + 2 * g));
        return;
    }
    const uint8_t *qs = rp + (F == QF_Q6_K ? 0 : 16 * S) + 16 * g, *qh = rp + (F == QF_Q6_K ? 0 : 16 * S) + 16 * G;
    o.a = __ldg((const uint4 *)qs);
    if constexpr (F == QF_Q6_K) {
        uint2 h = __ldg((const uint2 *)(qh + 8 * g));
        o.b.x = h.x;
        o.b.y = h.y;
        o.s = __ldg((const unsigned short *)(rp + 24 * G + 16 * sb + 2 * (g % 8)));
        o.d = __half2float(__ldg((const __half *)(rp + 24 * G + 16 * S + 2 * sb)));
        return;
    }
    if constexpr (F == QF_Q5_K) o.h = __ldg((const unsigned *)(qh + 4 * g));
    o.b = __ldg((const uint4 *)(rp + 16 * sb)); /* d, dmin, then the 12 scale bytes */
}

template <int F>
static __device__ __forceinline__ void q_decode_k(const qraw &r, int g, qgroup &o);

template <int F>
static __device__ __forceinline__ void q_decode(const qraw &r, int g, qgroup &o)
{
    if constexpr (F == QF_Q8_0) {
        o.q[0] = r.a.x; o.q[1] = r.a.y; o.q[2] = r.a.z; o.q[3] = r.a.w;
        o.q[4] = r.b.x; o.q[5] = r.b.y; o.q[6] = r.b.z; o.q[7] = r.b.w;
        o.a0 = o.a1 = __half2float(__ushort_as_half((unsigned short)r.h));
        o.b0 = o.b1 = 0.0f;
    } else
        q_decode_k<F>(r, g, o);
}

template <int F>
static __device__ __forceinline__ void q_decode_k(const qraw &r, int g, qgroup &o)
{
    const int j = g % 8;
    const unsigned w[4] = { r.a.x, r.a.y, r.a.z, r.a.w };
#pragma unroll
    for (int i = 0; i < 4; i++) {
        o.q[i] = w[i] & 0x0F0F0F0F;
        o.q[4 + i] = (w[i] >> 4) & 0x0F0F0F0F;
    }
    if constexpr (F == QF_Q6_K) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o.q[i] |= ((r.b.x >> (2 * i)) & 0x03030303) << 4;
            o.q[4 + i] |= ((r.b.y >> (2 * i)) & 0x03030303) << 4;
        }
        o.a0 = r.d * (float)(int8_t)(r.s & 0xFF);
        o.a1 = r.d * (float)(int8_t)(r.s >> 8);
        o.b0 = 32.0f * o.a0;
        o.b1 = 32.0f * o.a1;
        return;
    }
    if constexpr (F == QF_Q5_K)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            o.q[i] |= ((r.h >> i) & 0x01010101) << 4;
            o.q[4 + i] |= ((r.h >> (4 + i)) & 0x01010101) << 4;
        }
    unsigned sc, mn;
    if (j < 4) {
        sc = byte_of(r.b.y, r.b.z, r.b.w, j) & 63;
        mn = byte_of(r.b.y, r.b.z, r.b.w, j + 4) & 63;
    } else {
        sc = (byte_of(r.b.y, r.b.z, r.b.w, j + 4) & 15) | (byte_of(r.b.y, r.b.z, r.b.w, j - 4) >> 6) << 4;
        mn = (byte_of(r.b.y, r.b.z, r.b.w, j + 4) >> 4) | (byte_of(r.b.y, r.b.z, r.b.w, j) >> 6) << 4;
    }
    __half2 dm = *(const __half2 *)&r.b.x;
    o.a0 = o.a1 = __low2float(dm) * (float)sc;
    o.b0 = o.b1 = __high2float(dm) * (float)mn;
}

template <int F>
static __device__ __forceinline__ void q_load(const uint8_t *__restrict__ rp, int G, int g, qgroup &o)
{
    qraw r;
    q_fetch<F>(rp, G, g, r);
    q_decode<F>(r, g, o);
}

/* y[t, r] (+)= sum_c W[r, c] x[t, c] (+ bias[r]) for t < n <= N */
template <int F, int N>
__global__ void __launch_bounds__(QG_WARPS * 32, 2) k_qgemv(const uint8_t *__restrict__ w, int64_t pitch, int m, int k,
                                                         const bf16 *__restrict__ x, int64_t ldx, int n,
                                                         const bf16 *__restrict__ bias, bf16 *y, int64_t ldy, int add)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int G = k / 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int8_t *x8 = (int8_t *)smem;
    float *dx = (float *)(smem + (size_t)N * k), *sx = dx + N * G;
    /* QG_U groups of QG_R rows a lane, fetched together; the first rows' before x is rounded */
    qraw raw[QG_U][QG_R];
    auto fetch = [&](int64_t r0, int gb) {
#pragma unroll
        for (int u = 0; u < QG_U; u++) {
            const int g = gb + 32 * u + lane;
            if (g >= G) break;
#pragma unroll
            for (int r = 0; r < QG_R; r++) q_fetch<F>(w + (r0 + SF_MIN(r, m - 1 - r0)) * pitch, G, g, raw[u][r]);
        }
    };
    const int64_t first = ((int64_t)blockIdx.x * QG_WARPS + warp) * QG_R;
    if (first < m) fetch(first, 0);
    for (int i = threadIdx.x; i < n * G; i += blockDim.x) {
        const int t = i / G, g = i % G;
        const bf16x8 *xp = (const bf16x8 *)(x + t * ldx + 32 * g);
        float v[32], amax = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            bf16x8 e = xp[u];
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(e.h[h]);
                v[8 * u + 2 * h] = f.x;
                v[8 * u + 2 * h + 1] = f.y;
                amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        int s[2] = { 0, 0 };
        unsigned pk[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            unsigned word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int q = __float2int_rn(v[4 * u + b] * inv);
                s[u / 4] += q;
                word |= (unsigned)(q & 0xFF) << (8 * b);
            }
            pk[u] = word;
        }
        uint4 *dst = (uint4 *)(x8 + (size_t)t * k + 32 * g);
        dst[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        dst[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
        dx[t * G + g] = d;
        sx[t * 2 * G + 2 * g] = d * (float)s[0];
        sx[t * 2 * G + 2 * g + 1] = d * (float)s[1];
    }
    __syncthreads();
    for (int64_t r0 = ((int64_t)blockIdx.x * QG_WARPS + warp) * QG_R; r0 < m; r0 += (int64_t)gridDim.x * QG_WARPS * QG_R) {
        float acc[QG_R][N];
#pragma unroll
        for (int r = 0; r < QG_R; r++)
#pragma unroll
            for (int t = 0; t < N; t++) acc[r][t] = 0.0f;
        for (int gb = 0; gb < G; gb += 32 * QG_U) {
            if (gb) fetch(r0, gb);
#pragma unroll
            for (int u = 0; u < QG_U; u++) {
                const int g = gb + 32 * u + lane;
                if (g >= G) break;
#pragma unroll
                for (int t = 0; t < N; t++) {
                    if (t >= n) break;
                    const uint4 *xv = (const uint4 *)(x8 + (size_t)t * k + 32 * g);
                    uint4 xa = xv[0], xb = xv[1];
                    const int xw[8] = { (int)xa.x, (int)xa.y, (int)xa.z, (int)xa.w, (int)xb.x, (int)xb.y, (int)xb.z, (int)xb.w };
                    const float d = dx[t * G + g], s0 = sx[t * 2 * G + 2 * g], s1 = sx[t * 2 * G + 2 * g + 1];
#pragma unroll
                    for (int r = 0; r < QG_R; r++) {
                        qgroup qg;
                        q_decode<F>(raw[u][r], g, qg);
                        int i0 = 0, i1 = 0;
#pragma unroll
                        for (int v = 0; v < 4; v++) {
                            i0 = __dp4a(qg.q[v], xw[v], i0);
                            i1 = __dp4a(qg.q[4 + v], xw[4 + v], i1);
                        }
                        acc[r][t] += d * (qg.a0 * (float)i0 + qg.a1 * (float)i1) - (qg.b0 * s0 + qg.b1 * s1);
                    }
                }
            }
        }
        /* the next rows' first loads before this row's reductions and stores */
        const int64_t next = r0 + (int64_t)gridDim.x * QG_WARPS * QG_R;
        if (next < m) fetch(next, 0);
#pragma unroll
        for (int r = 0; r < QG_R; r++)
#pragma unroll
            for (int t = 0; t < N; t++) acc[r][t] = warp_sum(acc[r][t]);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < QG_R; r++) {
                const int64_t row = r0 + r;
                if (row >= m) break;
                const float b = bias ? bf2f(bias[row]) : 0.0f;
#pragma unroll
                for (int t = 0; t < N; t++) {
                    if (t >= n) break;
                    bf16 *o = y + t * ldy + row;
                    *o = f2bf(acc[r][t] + b + (add ? bf2f(*o) : 0.0f));
                }
            }
    }
}

/* out[i, :] = W[rows ? rows[i] : row0 + i, :] in bf16, i < n: a thread a 32-group */
template <int F>
__global__ void k_qdequant(const uint8_t *__restrict__ w, int64_t pitch, int k, const int32_t *__restrict__ rows,
                           int64_t row0, int n, bf16 *__restrict__ out, int64_t ldo)
{
    const int G = k / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * G) return;
    const int r = (int)(i / G), g = (int)(i % G);
    const int64_t src = rows ? rows[r] : row0 + r;
    qgroup qg;
    q_load<F>(w + src * pitch, G, g, qg);
    bf16x8 o[4];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const float a = u < 4 ? qg.a0 : qg.a1, b = u < 4 ? qg.b0 : qg.b1;
        float v[4];
#pragma unroll
        for (int bt = 0; bt < 4; bt++) v[bt] = a * (float)(int8_t)(qg.q[u] >> (8 * bt)) - b;
        o[u / 2].h[2 * (u % 2)] = __floats2bfloat162_rn(v[0], v[1]);
        o[u / 2].h[2 * (u % 2) + 1] = __floats2bfloat162_rn(v[2], v[3]);
    }
    bf16x8 *dst = (bf16x8 *)(out + r * ldo + 32 * g);
#pragma unroll
    for (int u = 0; u < 4; u++) dst[u] = o[u];
}

static int fmt_of(int dtype)
{
    switch (dtype) {
    case SF_DT_Q8_0: return QF_Q8_0;
    case SF_DT_Q4_K: return QF_Q4_K;
    case SF_DT_Q5_K: return QF_Q5_K;
    case SF_DT_Q6_K: return QF_Q6_K;
    default: return -1;
    }
}

template <int F, int N>
static int launch_qgemv(const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
                        const uint16_t *bias, uint16_t *y, int64_t ldy, int add, cudaStream_t s)
{
    const size_t smem = (size_t)N * k + (size_t)N * (k / 32) * 12;
    static int smem_set[64]; /* per device: the opt-in above 48 KiB, once */
    int dev = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&dev);
    if (smem > 48 * 1024 && dev < 64 && smem_set[dev] < (int)smem) {
        cudaError_t e = cudaFuncSetAttribute(k_qgemv<F, N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        smem_set[dev] = (int)smem;
    }
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_qgemv<F, N>, QG_WARPS * 32, smem);
    const int64_t need = (m + QG_WARPS * QG_R - 1) / (QG_WARPS * QG_R);
    const int grid = (int)SF_MIN(need, (int64_t)SF_MAX(1, sms * SF_MAX(1, per_sm)));
    k_qgemv<F, N><<<grid, QG_WARPS * 32, smem, s>>>((const uint8_t *)w, pitch, m, k, (const bf16 *)x, ldx, n,
                                                    (const bf16 *)bias, (bf16 *)y, ldy, add);
    return sf_launch_status();
}

template <int F>
static int qgemv_n(const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
                   const uint16_t *bias, uint16_t *y, int64_t ldy, int add, cudaStream_t s)
{
    if (n == 1) return launch_qgemv<F, 1>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    if (n == 2) return launch_qgemv<F, 2>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    if (n <= 4) return launch_qgemv<F, 4>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    return launch_qgemv<F, 8>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
}

extern "C" int sf_k_qgemv(int dtype, const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
                          const uint16_t *bias, uint16_t *y, int64_t ldy, int add, cudaStream_t s)
{
    if (n < 1 || n > SF_K_QGEMV_MAX_N || fmt_of(dtype) < 0 || k < 32 || k % sf_dtype_block((sf_dtype)dtype) ||
        m < 1 || ldx % 8 || (uintptr_t)x % 16 || pitch % 16 || (uintptr_t)w % 16)
        return (int)cudaErrorInvalidValue;
    switch (fmt_of(dtype)) {
    case QF_Q8_0: return qgemv_n<QF_Q8_0>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    case QF_Q4_K: return qgemv_n<QF_Q4_K>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    case QF_Q5_K: return qgemv_n<QF_Q5_K>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    case QF_Q6_K: return qgemv_n<QF_Q6_K>(w, pitch, m, k, x, ldx, n, bias, y, ldy, add, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

extern "C" int sf_k_qdequant(int dtype, const void *w, int64_t pitch, int k, const int32_t *rows, int64_t row0, int n,
                             uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n < 1) return 0;
    if (fmt_of(dtype) < 0 || k < 32 || k % sf_dtype_block((sf_dtype)dtype) || ldo % 8 || (uintptr_t)out % 16 || pitch % 16 || (uintptr_t)w % 16)
        return (int)cudaErrorInvalidValue;
    const int64_t threads = (int64_t)n * (k / 32);
    const int grid = (int)((threads + 255) / 256);
    switch (fmt_of(dtype)) {
    case QF_Q8_0: k_qdequant<QF_Q8_0><<<grid, 256, 0, s>>>((const uint8_t *)w, pitch, k, rows, row0, n, (bf16 *)out, ldo); break;
    case QF_Q4_K: k_qdequant<QF_Q4_K><<<grid, 256, 0, s>>>((const uint8_t *)w, pitch, k, rows, row0, n, (bf16 *)out, ldo); break;
    case QF_Q5_K: k_qdequant<QF_Q5_K><<<grid, 256, 0, s>>>((const uint8_t *)w, pitch, k, rows, row0, n, (bf16 *)out, ldo); break;
    case QF_Q6_K: k_qdequant<QF_Q6_K><<<grid, 256, 0, s>>>((const uint8_t *)w, pitch, k, rows, row0, n, (bf16 *)out, ldo); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return sf_launch_status();
}
