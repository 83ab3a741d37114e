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
 * took 11.4 us for a 4096 x 4096 Q4_K matrix, 20% of the copy bandwidth.)
 *
 * The small ops around a decode step's GEMVs go into them (hal_cuda.c, SEMFLOW_CUDA_QFUSE): the
 * RMSNorm before QKV and gate/up, computed by every block from x as it rounds x (each row's sum
 * of squares is a block reduction over a few KiB that L2 holds); for gate/up the SiLU-gated
 * product, a warp's two rows being gate row u and up row f + u; for QKV RoPE and the K/V
 * write, a warp's two rows being a rotation pair. The epilogues are the bf16 GEMVs'
 * (gemv_ring.cuh), so fused and unfused steps give the same values up to the order of the sum
 * of squares. */
#include "common.cuh"
#include "gemv_ring.cuh"

#include <cuda_fp16.h>

extern "C" {
#include "../../hal/hal.h"
#include "kernels.h"
}

enum { QF_Q8_0, QF_Q4_K, QF_Q5_K, QF_Q6_K };
#define QG_WARPS 8
#define QG_R 2
#define QG_U 4
#define QG_ROWS 8 /* rows of x one launch takes; more are taken QG_ROWS at a time */

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

/* y[t, r] (+)= sum_c W[r, c] x'[t, c] (+ bias[r]) for t < n <= N, x' = x or, with nw, x's
 * RMSNorm times nw (rounded as rmsnorm.cu rounds it, so that the GEMV meets the bf16 row the
 * unfused norm would have written). MODE 0: unit u is row u, a warp takes QG_R of them at a
 * time. FG_GLU: W's m rows are gate rows then up rows, unit u the pair (u, m/2 + u), a warp's
 * QG_R rows; y[t, u] = silu(gate) * up. FG_ROPE: W is the rows [row0, row0 + m) of a QKV weight
 * (whole heads), unit u that weight's rotation pair row0 / 2 + u (gemv_ring.cuh fg_unit_rows),
 * rotated by position pos[t] and, for k and v heads, written to the cache at slot[t]; bias and y
 * are the whole weight's. The GLU and RoPE epilogues are the bf16 GEMVs' (fg_epilogue_row). */
template <int F, int N, int MODE>
__global__ void __launch_bounds__(QG_WARPS * 32, 2) k_qgemv(const uint8_t *__restrict__ w, int64_t pitch, int m, int k,
                                                         const bf16 *__restrict__ x, int64_t ldx, int n,
                                                         const bf16 *__restrict__ nw, float eps,
                                                         const bf16 *__restrict__ bias, bf16 *y, int64_t ldy, int add,
                                                         int row0, fg_rope rp)
{
    static_assert(!MODE || QG_R == 2, "a GLU or RoPE unit is the warp's two rows");
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float red[32], inv[N];
    constexpr int UR = MODE ? 1 : QG_R; /* units a warp a pass */
    const int G = k / 32, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, units = MODE ? m / 2 : m;
    int8_t *x8 = (int8_t *)smem;
    float *dx = (float *)(smem + (size_t)N * k), *sx = dx + N * G;
    /* the weight rows of the QG_R rows from unit u0 */
    auto rows_of = [&](int64_t u0, int64_t rr[QG_R]) {
        if constexpr (MODE == FG_ROPE) {
            const fg_unit r = fg_unit_rows<FG_ROPE>(row0 / 2 + (int)u0, m, rp);
            rr[0] = r.ra - row0;
            rr[1] = r.rb - row0;
        } else
#pragma unroll
            for (int r = 0; r < QG_R; r++) rr[r] = MODE ? u0 + (int64_t)r * units : u0 + SF_MIN((int64_t)r, units - 1 - u0);
    };
    /* QG_U groups of QG_R rows a lane, fetched together; the first rows' before x is rounded */
    qraw raw[QG_U][QG_R];
    auto fetch = [&](int64_t u0, int gb) {
        int64_t rr[QG_R];
        rows_of(u0, rr);
#pragma unroll
        for (int u = 0; u < QG_U; u++) {
            const int g = gb + 32 * u + lane;
            if (g >= G) break;
#pragma unroll
            for (int r = 0; r < QG_R; r++) q_fetch<F>(w + rr[r] * pitch, G, g, raw[u][r]);
        }
    };
    const int64_t first = ((int64_t)blockIdx.x * QG_WARPS + warp) * UR, stride = (int64_t)gridDim.x * QG_WARPS * UR;
    if (first < units) fetch(first, 0);
    if (nw) { /* each row's 1 / rms, the same sum in every block */
        for (int t = 0; t < n; t++) {
            const bf16x8 *xp = (const bf16x8 *)(x + t * ldx);
            float ss = 0.0f;
            for (int i = threadIdx.x; i < k / 8; i += blockDim.x) ss = gr_sumsq8(xp[i], ss);
            ss = block_sum(ss, red);
            if (threadIdx.x == 0) inv[t] = rsqrtf(ss / (float)k + eps);
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < n * G; i += blockDim.x) {
        const int t = i / G, g = i % G;
        const bf16x8 *xp = (const bf16x8 *)(x + t * ldx + 32 * g);
        float v[32], amax = 0.0f;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const bf16x8 e = nw ? gr_scale8(xp[u], ((const bf16x8 *)(nw + 32 * g))[u], inv[t]) : xp[u];
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(e.h[h]);
                v[8 * u + 2 * h] = f.x;
                v[8 * u + 2 * h + 1] = f.y;
                amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
            }
        }
        const float inv_d = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        int s[2] = { 0, 0 };
        unsigned pk[8];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            unsigned word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                int q = __float2int_rn(v[4 * u + b] * inv_d);
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
    for (int64_t r0 = first; r0 < units; r0 += stride) {
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
        if (r0 + stride < units) fetch(r0 + stride, 0);
#pragma unroll
        for (int r = 0; r < QG_R; r++)
#pragma unroll
            for (int t = 0; t < N; t++) acc[r][t] = warp_sum(acc[r][t]);
        if (lane != 0) continue;
        if constexpr (MODE != 0) {
#pragma unroll
            for (int t = 0; t < N; t++) {
                if (t >= n) break;
                fg_epilogue_row<MODE>(MODE == FG_ROPE ? row0 / 2 + (int)r0 : (int)r0, acc[0][t], acc[1][t], t, m, bias, y,
                                      ldy, rp);
            }
        } else {
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
}

/* out[i, :] = W[rows ? rows[i] : row0 + i, :] in bf16, i < n: four threads a 32-group, each
 * decoding the group (its loads one line for the four) and storing its 8 elements, so that a
 * warp's stores are 512 contiguous bytes */
template <int F>
__global__ void k_qdequant(const uint8_t *__restrict__ w, int64_t pitch, int k, const int32_t *__restrict__ rows,
                           int64_t row0, int n, bf16 *__restrict__ out, int64_t ldo)
{
    const int G = k / 32;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (int64_t)n * G * 4) return;
    const int qq = (int)(i & 3), r = (int)(i / 4 / G), g = (int)(i / 4 % G);
    const int64_t src = rows ? rows[r] : row0 + r;
    qgroup qg;
    q_load<F>(w + src * pitch, G, g, qg);
    const float a = qq < 2 ? qg.a0 : qg.a1, b = qq < 2 ? qg.b0 : qg.b1;
    int wq[2] = { qg.q[0], qg.q[1] }; /* words 2 qq, 2 qq + 1, chosen without indexing qg at run time */
#pragma unroll
    for (int j = 1; j < 4; j++)
        if (qq == j) { wq[0] = qg.q[2 * j]; wq[1] = qg.q[2 * j + 1]; }
    bf16x8 o;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int word = wq[u];
        float v[4];
#pragma unroll
        for (int bt = 0; bt < 4; bt++) v[bt] = a * (float)(int8_t)(word >> (8 * bt)) - b;
        o.h[2 * u] = __floats2bfloat162_rn(v[0], v[1]);
        o.h[2 * u + 1] = __floats2bfloat162_rn(v[2], v[3]);
    }
    *(bf16x8 *)(out + r * ldo + 32 * g + 8 * qq) = o;
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

/* Blocks of k_qgemv<F, N, MODE> resident on an SM for a row of k columns, per device: a few k
 * (a model has two or three) cached, so that a launch outside a graph asks the driver nothing. */
struct qg_occ {
    int k[SF_K_MAX_DEVICES][4], per_sm[SF_K_MAX_DEVICES][4], next[SF_K_MAX_DEVICES];
};

/* The arguments of one call, whatever its mode. */
struct qg_args {
    const void *w;
    int64_t pitch;
    int m, k;
    const uint16_t *x;
    int64_t ldx;
    int n;
    const uint16_t *nw;
    float eps;
    const uint16_t *bias;
    uint16_t *y;
    int64_t ldy;
    int add, row0;
    fg_rope rp;
};

template <int F, int N, int MODE>
static int launch_qgemv(const qg_args &a, cudaStream_t s)
{
    static sf_k_smem have;
    static qg_occ occ;
    const size_t smem = (size_t)N * a.k + (size_t)N * (a.k / 32) * 12;
    int rc = sf_k_smem_attr(&have, k_qgemv<F, N, MODE>, smem), per_sm = 0;
    if (rc) return rc;
    const int dev = sf_k_dev();
    for (int i = 0; dev >= 0 && i < 4 && !per_sm; i++)
        if (occ.k[dev][i] == a.k) per_sm = occ.per_sm[dev][i];
    if (!per_sm) {
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_qgemv<F, N, MODE>, QG_WARPS * 32, smem);
        if (e != cudaSuccess) return (int)e;
        per_sm = SF_MAX(1, per_sm);
        if (dev >= 0) {
            const int i = occ.next[dev]++ & 3;
            occ.per_sm[dev][i] = per_sm;
            occ.k[dev][i] = a.k;
        }
    }
    const int ur = MODE ? 1 : QG_R, units = MODE ? a.m / 2 : a.m;
    const int64_t need = (units + QG_WARPS * ur - 1) / (QG_WARPS * ur);
    const int grid = (int)SF_MIN(need, (int64_t)sf_k_sm_count(132) * per_sm);
    k_qgemv<F, N, MODE><<<grid, QG_WARPS * 32, smem, s>>>((const uint8_t *)a.w, a.pitch, a.m, a.k, (const bf16 *)a.x, a.ldx,
                                                          a.n, (const bf16 *)a.nw, a.eps, (const bf16 *)a.bias, (bf16 *)a.y,
                                                          a.ldy, a.add, a.row0, a.rp);
    return sf_launch_status();
}

template <int F, int MODE>
static int qgemv_n(const qg_args &a, cudaStream_t s)
{
    if (a.n == 1) return launch_qgemv<F, 1, MODE>(a, s);
    if (a.n == 2) return launch_qgemv<F, 2, MODE>(a, s);
    if (a.n <= 4) return launch_qgemv<F, 4, MODE>(a, s);
    return launch_qgemv<F, 8, MODE>(a, s);
}

template <int F, int MODE>
static int qgemv_chunks(qg_args a, cudaStream_t s)
{
    /* QG_ROWS rows of x a launch, each launch reading the weights again */
    const int n = a.n;
    for (int t0 = 0; t0 < n; t0 += QG_ROWS) {
        qg_args c = a;
        c.n = SF_MIN(QG_ROWS, n - t0);
        c.x += t0 * a.ldx;
        c.y += t0 * a.ldy;
        if (MODE == FG_ROPE) {
            c.rp.pos += t0;
            c.rp.slot += t0;
        }
        int rc = qgemv_n<F, MODE>(c, s);
        if (rc) return rc;
    }
    return 0;
}

template <int MODE>
static int qgemv_mode(int dtype, const qg_args &a, cudaStream_t s)
{
    switch (fmt_of(dtype)) {
    case QF_Q8_0: return qgemv_chunks<QF_Q8_0, MODE>(a, s);
    case QF_Q4_K: return qgemv_chunks<QF_Q4_K, MODE>(a, s);
    case QF_Q5_K: return qgemv_chunks<QF_Q5_K, MODE>(a, s);
    case QF_Q6_K: return qgemv_chunks<QF_Q6_K, MODE>(a, s);
    default: return (int)cudaErrorInvalidValue;
    }
}

/* What every mode needs of its arguments. */
static bool qg_ok(int dtype, const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
                  const uint16_t *nw)
{
    return n >= 1 && n <= SF_K_QGEMV_MAX_N && fmt_of(dtype) >= 0 && k >= 32 && k % sf_dtype_block((sf_dtype)dtype) == 0 &&
           m >= 1 && ldx % 8 == 0 && (uintptr_t)x % 16 == 0 && pitch % 16 == 0 && (uintptr_t)w % 16 == 0 &&
           (uintptr_t)nw % 16 == 0;
}

extern "C" int sf_k_qgemv(int dtype, const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
                          const uint16_t *nw, float eps, const uint16_t *bias, int glu, uint16_t *y, int64_t ldy,
                          int add, cudaStream_t s)
{
    if (!qg_ok(dtype, w, pitch, m, k, x, ldx, n, nw) || (glu && (m % 2 || add))) return (int)cudaErrorInvalidValue;
    qg_args a = { w, pitch, m, k, x, ldx, n, nw, eps, bias, y, ldy, add, 0, {} };
    return glu ? qgemv_mode<FG_GLU>(dtype, a, s) : qgemv_mode<0>(dtype, a, s);
}

extern "C" int sf_k_qgemv_rope(int dtype, const void *w, int64_t pitch, int m, int row0, int k, const uint16_t *x,
                               int64_t ldx, int n, const uint16_t *nw, float eps, const uint16_t *bias, int H, int Hkv,
                               int hd, int rot_dim, int interleaved, const int32_t *pos, const int32_t *slot,
                               const float *inv_freq, sf_k_kv kv, uint16_t *qkv, int64_t ldq, cudaStream_t s)
{
    /* (INT8 cache blocks are refused: their steps take sf_k_rope_kv, which writes them) */
    if (!qg_ok(dtype, w, pitch, m, k, x, ldx, n, nw) || H < 1 || Hkv < 1 || hd < 2 || hd % 2 || rot_dim < 0 ||
        rot_dim > hd || rot_dim % 2 || row0 < 0 || row0 % hd || m % hd || row0 + m > (H + 2 * Hkv) * hd || !pos || !slot ||
        !inv_freq || kv.block_size < 1 || kv.n_kv_heads != Hkv || kv.head_dim != hd || kv.i8_base)
        return (int)cudaErrorInvalidValue;
    qg_args a = { w, pitch, m, k, x, ldx, n, nw, eps, bias, qkv, ldq, 0, row0, {} };
    a.rp.pos = pos;
    a.rp.slot = slot;
    a.rp.inv_freq = inv_freq;
    a.rp.H = H;
    a.rp.Hkv = Hkv;
    a.rp.hd = hd;
    a.rp.rot = rot_dim;
    a.rp.interleaved = interleaved;
    a.rp.kv = kv;
    return qgemv_mode<FG_ROPE>(dtype, a, s);
}

extern "C" int sf_k_qdequant(int dtype, const void *w, int64_t pitch, int k, const int32_t *rows, int64_t row0, int n,
                             uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n < 1) return 0;
    if (fmt_of(dtype) < 0 || k < 32 || k % sf_dtype_block((sf_dtype)dtype) || ldo % 8 || (uintptr_t)out % 16 || pitch % 16 || (uintptr_t)w % 16)
        return (int)cudaErrorInvalidValue;
    const int64_t threads = (int64_t)n * (k / 32) * 4;
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
