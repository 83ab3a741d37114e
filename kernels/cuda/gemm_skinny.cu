/* gemm_skinny.cu — y[n, m] = x[n, k] . W[m, k]^T (+ bias) (+ y) for 9-32 rows of x: the decode
 * steps of 9-32 sequences, where cuBLASLt's best has too few output tiles to stream the weight
 * at the memory's rate (O and QKV at 36-48% of their bytes' time, docs/PERFORMANCE.md "Session
 * 37").
 *
 * The weight is the mma's A operand (16 weight rows a tile), x the B operand (8 rows of x a
 * group, up to 4 groups): each warp owns one 16-row tile and streams its rows straight from
 * memory into registers (no shared-memory ring: the weight crosses the SM once), 16 bytes a lane
 * a load, in a ring of DEPTH 64-column stages. The k order inside a 64-column stage is permuted
 * so that each lane's 16-byte loads feed its own fragments: lane (g = lane / 4, q = lane % 4)
 * loads columns 32 i + 8 q .. +7 (i = 0, 1) of rows g and g + 8, and mma step j = 2 i + jj takes
 * columns 32 i + 8 q + 4 jj + {0, 1} as the fragment's k = 2q, 2q + 1 and + {2, 3} as k = 2q + 8,
 * 2q + 9. x's rows are read in the same order, so the dot products are unchanged.
 *
 * A block is 8 warps (128 weight rows) over one k-range of K / S columns; the block's x rows for
 * that range sit in shared memory (8 NG rows, 16-byte units XOR-swizzled by the row's parity:
 * each 16-byte B load of a warp is conflict-free), loaded once after the programmatic wait. The
 * weight's first stages are issued before the wait: they do not depend on the kernel before.
 * With S > 1, each block writes fp32 partial sums to the context's split workspace ([S][m][8 NG])
 * and the last block of a row group to arrive (a counter per row group, reset by that block)
 * adds the S partials, the bias and y, and rounds once to bf16. S and the grid are chosen by
 * sf_gemm_skinny_plan from the SM count (gemm_impl.cuh). */
#include <stdio.h>
#include <stdlib.h>

#include "gemm_impl.cuh"
#include "gemv_ring.cuh"

#define SK_WARPS 8
#define SK_ROWS (SK_WARPS * 16) /* weight rows a block */
#define SK_DEPTH 4              /* 64-column stages in flight a warp: one part of x */
#define SK_PART (SK_DEPTH * 64) /* columns of x a ring slot */
#define SK_SLOTS 3              /* x's ring: the part in use, the next, the one after landing */

typedef struct sk_args {
    const bf16 *x;
    int64_t ldx;
    const bf16 *w, *bias;
    bf16 *y;
    int64_t ldy;
    float *sum; /* [m][8 NG] fp32, zero between launches (S > 1) */
    unsigned *cnt;
    int n, m, k, acc, S, KR;
} sk_args;

/* Element (r, c) of a ring slot (8 NG rows of SK_PART columns): 16-byte units XOR'd by 4 on odd
 * rows, so a warp's 16-byte loads of rows g = 0..7 hit every bank once in four wavefronts. */
static __device__ __forceinline__ int sk_xs(int r, int c)
{
    return r * SK_PART + ((((c >> 3) ^ ((r & 1) << 2))) << 3) + (c & 7);
}

/* Part p of the block's columns (from k0, len long) into its ring slot, one commit group. */
template <int NG>
static __device__ __forceinline__ void sk_load_part(const sk_args &a, bf16 *xs, int k0, int len, int p)
{
    const int c0 = p * SK_PART, units = min(SK_PART, len - c0) >> 3;
    bf16 *slot = xs + (p % SK_SLOTS) * 8 * NG * SK_PART;
    if (units > 0)
        for (int i = threadIdx.x; i < 8 * NG * units; i += blockDim.x) {
            const int r = i / units, u = i - r * units;
            const bool in = r < a.n;
            sf_cp_async16(slot + sk_xs(r, u * 8), a.x + (in ? (int64_t)r * a.ldx + k0 + c0 + u * 8 : 0), in ? 16 : 0);
        }
    sf_cp_async_commit(); /* empty past the end: the group count stays regular */
}

template <int NG>
static __global__ void __launch_bounds__(SK_WARPS * 32, 2) k_gemm_skinny(const sk_args a)
{
    extern __shared__ uint4 sk_smem[];
    bf16 *xs = (bf16 *)sk_smem;
    __shared__ unsigned sk_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int tile = blockIdx.x * SK_WARPS + warp, s = blockIdx.y;
    const bool live = tile * 16 < a.m;
    const int k0 = s * a.KR, len = min(a.k, k0 + a.KR) - k0, nch = len >> 6, parts = (nch + SK_DEPTH - 1) / SK_DEPTH;
    const bf16 *w0 = a.w + (int64_t)(tile * 16 + g) * a.k + k0 + 8 * q, *w1 = w0 + 8 * (int64_t)a.k;

    uint4 ra[SK_DEPTH][4]; /* stage d: row g cols +0, +32; row g + 8 cols +0, +32 */
#pragma unroll
    for (int d = 0; d < SK_DEPTH; d++)
        if (live && d < nch) {
            ra[d][0] = gr_ld_stream(w0 + d * 64);
            ra[d][1] = gr_ld_stream(w0 + d * 64 + 32);
            ra[d][2] = gr_ld_stream(w1 + d * 64);
            ra[d][3] = gr_ld_stream(w1 + d * 64 + 32);
        }
    sf_pdl_wait(); /* x (and y, accumulating) come from the kernels before */
    sk_load_part<NG>(a, xs, k0, len, 0);
    sk_load_part<NG>(a, xs, k0, len, 1);

    float acc[NG][4];
#pragma unroll
    for (int gi = 0; gi < NG; gi++) acc[gi][0] = acc[gi][1] = acc[gi][2] = acc[gi][3] = 0.0f;
    const int sw = (g & 1) << 2;

    for (int p = 0; p < parts; p++) {
        sf_cp_async_wait<1>(); /* part p landed (p + 1 may still fly) */
        __syncthreads();       /* ... for every thread's copies; and part p - 1's slot is free */
        sk_load_part<NG>(a, xs, k0, len, p + 2);
        const uint4 *xrow = (const uint4 *)(xs + ((p % SK_SLOTS) * 8 * NG + g) * SK_PART); /* row g of the slot */
        if (live) {
#pragma unroll
            for (int d = 0; d < SK_DEPTH; d++) {
                const int ch = p * SK_DEPTH + d;
                if (ch < nch) {
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        uint4 b[NG]; /* row 8 gi + g: + gi SK_PART units */
#pragma unroll
                        for (int gi = 0; gi < NG; gi++) b[gi] = xrow[gi * SK_PART + ((d * 8 + 4 * i + q) ^ sw)];
                        const uint4 r0 = ra[d][i], r1 = ra[d][2 + i];
                        const unsigned f0[4] = { r0.x, r1.x, r0.y, r1.y }, f1[4] = { r0.z, r1.z, r0.w, r1.w };
#pragma unroll
                        for (int gi = 0; gi < NG; gi++) {
                            sf_mma_bf16(acc[gi], f0, b[gi].x, b[gi].y);
                            sf_mma_bf16(acc[gi], f1, b[gi].z, b[gi].w);
                        }
                    }
                    const int nx = ch + SK_DEPTH;
                    if (nx < nch) {
                        ra[d][0] = gr_ld_stream(w0 + nx * 64);
                        ra[d][1] = gr_ld_stream(w0 + nx * 64 + 32);
                        ra[d][2] = gr_ld_stream(w1 + nx * 64);
                        ra[d][3] = gr_ld_stream(w1 + nx * 64 + 32);
                    }
                }
            }
        }
    }
    /* the next kernel may start once every block is here: triggered earlier, its blocks would
     * take the SM slots this grid's later blocks wait for */
    sf_pdl_trigger();

    const int r0 = tile * 16 + g, r1 = r0 + 8;
    if (a.S == 1) {
        if (!live) return;
#pragma unroll
        for (int gi = 0; gi < NG; gi++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = 8 * gi + 2 * q + (e & 1), r = e < 2 ? r0 : r1;
                if (t >= a.n) continue;
                float v = acc[gi][e];
                if (a.bias) v += bf2f(a.bias[r]);
                bf16 *o = a.y + (int64_t)t * a.ldy + r;
                if (a.acc) v += bf2f(*o);
                *o = f2bf(v);
            }
        return;
    }
    /* S > 1: every block adds its sums into sum [m][8 NG] (L2 reductions, no return), and the
     * row group's last block to arrive rounds them into y and zeroes them for the next launch */
    const int NP = 8 * NG;
    if (live)
#pragma unroll
        for (int gi = 0; gi < NG; gi++) {
            float *p0 = a.sum + (int64_t)r0 * NP + 8 * gi + 2 * q, *p1 = a.sum + (int64_t)r1 * NP + 8 * gi + 2 * q;
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p0), "f"(acc[gi][0]), "f"(acc[gi][1]) : "memory");
            asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p1), "f"(acc[gi][2]), "f"(acc[gi][3]) : "memory");
        }
    __syncthreads();
    if (threadIdx.x == 0) sk_last = sf_atom_add_acq_rel_gpu(a.cnt + blockIdx.x, 1u) == (unsigned)a.S - 1;
    __syncthreads();
    if (!sk_last) return;
    const int rb = blockIdx.x * SK_ROWS, rows = min(SK_ROWS, a.m - rb), quads = NP / 4;
    for (int i = threadIdx.x; i < rows * quads; i += blockDim.x) {
        const int r = rb + i / quads, t0 = (i % quads) * 4;
        float4 *sp = (float4 *)(a.sum + (int64_t)r * NP + t0);
        const float4 v = __ldcg(sp);
        __stcg(sp, make_float4(0.f, 0.f, 0.f, 0.f));
        if (t0 >= a.n) continue;
        const float b = a.bias ? bf2f(a.bias[r]) : 0.0f, vv[4] = { v.x, v.y, v.z, v.w };
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (t0 + e >= a.n) break;
            bf16 *o = a.y + (int64_t)(t0 + e) * a.ldy + r;
            *o = f2bf(vv[e] + b + (a.acc ? bf2f(*o) : 0.0f));
        }
    }
    if (threadIdx.x == 0) a.cnt[blockIdx.x] = 0; /* for the next launch (stream order) */
}

int sf_gemm_skinny_ok(int n, int m, int k, int64_t ldx, const void *x, const void *w)
{
    return n >= 1 && n <= SK_NMAX && m % 16 == 0 && k % 64 == 0 && ldx % 8 == 0 && ((uintptr_t)x & 15) == 0 &&
           ((uintptr_t)w & 15) == 0 && (int64_t)sf_div_up(m, SK_ROWS) <= SK_COUNTERS;
}

/* Splits of k for n rows against m x k on `slots` resident blocks: the fewest waves of the
 * longest k-range, a block's start (the ring's fill, x's first parts) counted as 192 columns;
 * S > 1 needs the sums' buffer to hold m x 8 NG floats. $SEMFLOW_CUDA_SKINNY_S forces S where it
 * applies (benchmarks). 0: no plan. */
int sf_gemm_skinny_plan(int n, int m, int k, int slots, int *KR)
{
    const int NP = 8 * ((n + 7) / 8), rg = (int)sf_div_up(m, SK_ROWS);
    static int forced = -1;
    if (forced < 0) {
        const char *e = getenv("SEMFLOW_CUDA_SKINNY_S");
        forced = e ? atoi(e) : 0;
    }
    int best = 0;
    double best_cost = 0;
    for (int S = 1; S <= 64 && (S - 1) * 64 < k; S++) {
        const int kr = (int)sf_div_up(sf_div_up(k, S), 64) * 64;
        if ((S - 1) * kr >= k || (S > 1 && (size_t)m * NP * 4 > SK_SUM_BYTES)) continue;
        const double cost = (double)sf_div_up((long)rg * S, slots) * (kr + 192);
        if (forced ? S == forced : (!best || cost < best_cost)) {
            best = S;
            best_cost = cost;
            *KR = kr;
        }
    }
    return best;
}

template <int NG>
static int launch(const sk_args &a, cudaStream_t s)
{
    const size_t smem = (size_t)SK_SLOTS * 8 * NG * SK_PART * 2;
    static sf_k_smem have;
    int rc = sf_k_smem_attr(&have, k_gemm_skinny<NG>, smem);
    if (rc) return rc;
    static int pdl = -1;
    if (pdl < 0) {
        const char *e = getenv("SEMFLOW_CUDA_SKINNY_PDL");
        pdl = !(e && e[0] == '0');
    }
    if (!pdl) {
        k_gemm_skinny<NG><<<dim3(sf_div_up(a.m, SK_ROWS), a.S), dim3(SK_WARPS * 32), smem, s>>>(a);
        return sf_launch_status();
    }
    return sf_launch_pdl(k_gemm_skinny<NG>, dim3(sf_div_up(a.m, SK_ROWS), a.S), dim3(SK_WARPS * 32), smem, s, a);
}

int sf_gemm_skinny_run(sf_k_gemm_ctx *g, int n, int m, int k, const uint16_t *x, int64_t ldx, const uint16_t *w,
                       const uint16_t *bias, uint16_t *y, int64_t ldy, int acc, cudaStream_t s)
{
    if (!g->skinny_sum || !g->skinny_cnt || !sf_gemm_skinny_ok(n, m, k, ldx, x, w)) return (int)cudaErrorInvalidValue;
    sk_args a;
    a.x = (const bf16 *)x; a.ldx = ldx; a.w = (const bf16 *)w; a.bias = (const bf16 *)bias;
    a.y = (bf16 *)y; a.ldy = ldy; a.sum = g->skinny_sum; a.cnt = g->skinny_cnt;
    a.n = n; a.m = m; a.k = k; a.acc = acc;
    a.S = sf_gemm_skinny_plan(n, m, k, 2 * sf_k_sm_count(132), &a.KR);
    if (!a.S) return (int)cudaErrorInvalidValue;
    switch ((n + 7) / 8) {
    case 1: return launch<1>(a, s);
    case 2: return launch<2>(a, s);
    case 3: return launch<3>(a, s);
    default: return launch<4>(a, s);
    }
}
