/* rope_kv.cu — RoPE on q and k fused with the write of k and v into the paged cache.
 *
 * Fast path (head_dim % 8 == 0, head_dim <= 256, rot_dim % 16 == 0 for halves or % 8 == 0 for
 * pairs, 16-byte aligned rows): a block per (token, group of heads). The block first computes
 * the token's cos/sin table (rot/2 entries, sincosf of the fp32 angle pos * inv_freq[i], as the
 * element-wise path) into shared memory, once for all its heads, then its threads walk the
 * heads' 16-byte units: with halves (NeoX/HF layout) a unit is the vector pair (i, i + rot/16)
 * whose elements a rotation mixes, with interleaved pairs (GPT-J/GGUF) one vector of four pairs,
 * past rot_dim one vector passed through; v heads take the same units, copied. Q and k are
 * rotated in place, k and v written to the token's slot. The head groups are sized so that
 * even a handful of tokens (decode) gives a few hundred blocks; 2048 tokens are 2048 blocks.
 *
 * INT8 slots: a token's slot is one block kind, so the whole block knows; after the rotation
 * (written in place to q/k) one warp per k or v head finds max|x| of the bf16 values and
 * writes the int8 row and its scale.
 *
 * The fast path is launched as a programmatic dependent (common.cuh): the block builds its
 * cos/sin table (metadata) before it waits for the QKV GEMM, and lets the attention kernel after it
 * start on its own metadata.
 *
 * Other shapes take the element-wise kernel: a block per (token, head). */
#include "common.cuh"

/* q[d] = round(x[d] / s), s = max|x| / 127 (0 for a zero row), over hd values; all threads of
 * the block call it (it synchronises). x is global memory written by this block before. */
static __device__ void quant_store(const bf16 *x, int hd, int8_t *q, float *scale)
{
    __shared__ float red[32];
    __syncthreads(); /* x fully written by every thread */
    float m = 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) m = fmaxf(m, fabsf(bf2f(x[d])));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, red[w]);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        q[d] = (int8_t)max(-127, min(127, __float2int_rn(bf2f(x[d]) * inv)));
    if (threadIdx.x == 0) *scale = amax / 127.0f;
}

__global__ void k_rope_kv(bf16 *qkv, int64_t ld, const int32_t *pos, const int32_t *slot, int H, int Hkv,
                          int hd, int rot, int interleaved, const float *inv_freq, sf_k_kv kv)
{
    /* block (token t, head h) of the H q heads, Hkv k heads and Hkv v heads: rotate q, rotate k
     * and write it to the cache, copy v to the cache */
    const int t = blockIdx.x, h = blockIdx.y, half = rot / 2;
    bf16 *hp = qkv + (int64_t)t * ld + (int64_t)h * hd;
    const int sl = slot[t];
    const bool is_q = h < H, is_v = h >= H + Hkv;
    bf16 *cache = NULL;
    int8_t *c8 = NULL;
    float *sc = NULL;
    if (!is_q && sl >= 0) {
        int64_t blk = sl / kv.block_size, off = sl % kv.block_size;
        int kh = is_v ? h - H - Hkv : h - H;
        if (kv.i8_base && blk >= kv.i8_base) {
            int64_t row = ((blk - kv.i8_base) * Hkv + kh) * kv.block_size + off;
            c8 = (int8_t *)(is_v ? kv.v : kv.k) + row * hd;
            sc = (is_v ? kv.v_scale : kv.k_scale) + row;
        } else {
            cache = (is_v ? (bf16 *)kv.v : (bf16 *)kv.k) + ((blk * Hkv + kh) * kv.block_size + off) * hd;
        }
    }
    if (is_v) {
        if (cache)
            for (int d = threadIdx.x; d < hd; d += blockDim.x) cache[d] = hp[d];
        if (c8) quant_store(hp, hd, c8, sc);
        return;
    }
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        float x0 = bf2f(hp[a]), x1 = bf2f(hp[b]);
        bf16 y0 = f2bf(x0 * c - x1 * s), y1 = f2bf(x1 * c + x0 * s);
        hp[a] = y0;
        hp[b] = y1;
        if (cache) { cache[a] = y0; cache[b] = y1; }
    }
    if (cache)
        for (int d = rot + threadIdx.x; d < hd; d += blockDim.x) cache[d] = hp[d];
    if (c8) quant_store(hp, hd, c8, sc); /* c8 is uniform over the block */
}

/* ---- fast path ---------------------------------------------------------------------------- */
#define RK_THREADS 128
#define RK_MAX_HD 256
#define RK_TARGET_BLOCKS 512 /* about four per SM of a 132-SM GPU */

/* One warp quantises the bf16 row x[hd] (hd <= RK_MAX_HD) into q and *scale, the rule of
 * quant_store. */
static __device__ void quant_row_warp(const bf16 *x, int hd, int8_t *q, float *scale)
{
    const int lane = threadIdx.x & 31;
    float v[RK_MAX_HD / 32], m = 0.0f;
#pragma unroll
    for (int i = 0; i < RK_MAX_HD / 32; i++) {
        int d = lane + 32 * i;
        v[i] = d < hd ? bf2f(x[d]) : 0.0f;
        m = fmaxf(m, fabsf(v[i]));
    }
    const float amax = warp_max(m), inv = amax > 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
    for (int i = 0; i < RK_MAX_HD / 32; i++) {
        int d = lane + 32 * i;
        if (d < hd) q[d] = (int8_t)max(-127, min(127, __float2int_rn(v[i] * inv)));
    }
    if (lane == 0) *scale = amax / 127.0f;
}

/* Rotates the 8 pairs (a[e], b[e]) with cos cs[e], sin sn[e]. */
static __device__ __forceinline__ void rot_halves(bf16x8 &a, bf16x8 &b, const float *cs, const float *sn)
{
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 x0 = __bfloat1622float2(a.h[h]), x1 = __bfloat1622float2(b.h[h]);
        float c0 = cs[2 * h], c1 = cs[2 * h + 1], s0 = sn[2 * h], s1 = sn[2 * h + 1];
        a.h[h] = __floats2bfloat162_rn(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
        b.h[h] = __floats2bfloat162_rn(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
    }
}

/* Rotates the 4 adjacent pairs of a with cos cs[i], sin sn[i]. */
static __device__ __forceinline__ void rot_pairs(bf16x8 &a, const float *cs, const float *sn)
{
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 x = __bfloat1622float2(a.h[h]);
        a.h[h] = __floats2bfloat162_rn(x.x * cs[h] - x.y * sn[h], x.y * cs[h] + x.x * sn[h]);
    }
}

/* Unit w of a block: head h, first vector va, pair (halves: va and va + hv rotate together). */
struct rk_unit {
    bf16 *hp;
    int h, va;
    bool pair;
    bf16x8 a, b;
};

static __device__ __forceinline__ void rk_load(rk_unit &x, bf16 *row, int w, int U, int hv, int h0, int hd)
{
    const int hi = w / U, u = w - hi * U;
    x.h = h0 + hi;
    x.hp = row + (int64_t)x.h * hd;
    x.pair = u < hv;
    x.va = x.pair ? u : u + hv;
    x.a = ((const bf16x8 *)x.hp)[x.va];
    if (x.pair) x.b = ((const bf16x8 *)x.hp)[x.va + hv];
}

/* Block (token blockIdx.x, heads [blockIdx.y * hpb, + hpb) of the H + 2 Hkv). Each thread keeps
 * two units in flight: the next unit's loads are issued before the current one's stores (units
 * touch disjoint memory), and the first unit's before the cos/sin table is built. */
template <int NT>
__global__ void __launch_bounds__(NT) k_rope_kv_vec(bf16 *qkv, int64_t ld, const int32_t *__restrict__ pos,
                                                            const int32_t *__restrict__ slot, int H, int Hkv, int hd,
                                                            int rot, int interleaved,
                                                            const float *__restrict__ inv_freq, sf_k_kv kv, int hpb)
{
    __shared__ float cs[RK_MAX_HD / 2], sn[RK_MAX_HD / 2];
    const int t = blockIdx.x, NH = H + 2 * Hkv, half = rot / 2, h8 = hd / 8;
    const int h0 = blockIdx.y * hpb, h1 = min(NH, h0 + hpb);
    /* units per head: with halves, the pairs (i, i + half/8) for i < half/8 count once */
    const int hv = interleaved ? 0 : half / 8, U = h8 - hv;
    bf16 *row = qkv + (int64_t)t * ld;
    const int items = (h1 - h0) * U;
    int w = threadIdx.x;
    rk_unit cur;
    sf_pdl_trigger();
    if (h0 < H + Hkv) { /* the block rotates something: the token's table (metadata only) */
        const float p = (float)pos[t];
        for (int j = threadIdx.x; j < half; j += NT) sincosf(p * inv_freq[j], &sn[j], &cs[j]);
    }
    sf_pdl_wait(); /* q, k, v come from the GEMM before */
    if (w < items) rk_load(cur, row, w, U, hv, h0, hd);
    __syncthreads();
    const int sl = slot[t];
    const int64_t blk = sl >= 0 ? sl / kv.block_size : 0, off = sl >= 0 ? sl % kv.block_size : 0;
    const bool i8 = sl >= 0 && kv.i8_base && blk >= kv.i8_base;
    const bool to_cache = sl >= 0 && !i8;
    while (w < items) {
        rk_unit nxt;
        const int nw = w + NT;
        if (nw < items) rk_load(nxt, row, nw, U, hv, h0, hd);
        const int h = cur.h, va = cur.va;
        if (h < H + Hkv && va * 8 < rot) {
            if (cur.pair) rot_halves(cur.a, cur.b, cs + va * 8, sn + va * 8);
            else rot_pairs(cur.a, cs + va * 4, sn + va * 4);
            ((bf16x8 *)cur.hp)[va] = cur.a;
            if (cur.pair) ((bf16x8 *)cur.hp)[va + hv] = cur.b;
        }
        if (h >= H && to_cache) {
            const bool is_v = h >= H + Hkv;
            const int kh = is_v ? h - H - Hkv : h - H;
            bf16x8 *c = (bf16x8 *)((is_v ? (bf16 *)kv.v : (bf16 *)kv.k) +
                                   ((blk * Hkv + kh) * kv.block_size + off) * hd);
            c[va] = cur.a;
            if (cur.pair) c[va + hv] = cur.b;
        }
        cur = nxt;
        w = nw;
    }
    if (i8 && h1 > H) { /* block-uniform */
        __syncthreads(); /* the rotated k rows are in place */
        const int warp = threadIdx.x >> 5;
        for (int h = max(h0, H) + warp; h < h1; h += NT / 32) {
            const bool is_v = h >= H + Hkv;
            const int kh = is_v ? h - H - Hkv : h - H;
            const int64_t r8 = ((blk - kv.i8_base) * Hkv + kh) * kv.block_size + off;
            quant_row_warp(row + (int64_t)h * hd, hd, (int8_t *)(is_v ? kv.v : kv.k) + r8 * hd,
                           (is_v ? kv.v_scale : kv.k_scale) + r8);
        }
    }
}

static bool rk_vec_ok(const uint16_t *qkv, int64_t ld, int hd, int rot_dim, int interleaved, const sf_k_kv &kv)
{
    return hd % 8 == 0 && hd <= RK_MAX_HD && rot_dim % (interleaved ? 8 : 16) == 0 && ld % 8 == 0 &&
           (uintptr_t)qkv % 16 == 0 && (uintptr_t)kv.k % 16 == 0 && (uintptr_t)kv.v % 16 == 0;
}

static int rk_launch(int nt, int target_blocks, uint16_t *qkv, int64_t ld, int T, const int32_t *pos,
                     const int32_t *slot, int H, int Hkv, int hd, int rot_dim, int interleaved, const float *inv_freq,
                     sf_k_kv kv, cudaStream_t s)
{
    const int NH = H + 2 * Hkv;
    int splits = SF_MIN(NH, (target_blocks + T - 1) / T);
    int hpb = (NH + splits - 1) / splits;
    splits = (NH + hpb - 1) / hpb;
    dim3 grid(T, splits);
    bf16 *q = (bf16 *)qkv;
    const int th = nt == 64 || nt == 256 ? nt : 128;
    int rc = sf_launch_pdl(th == 64 ? k_rope_kv_vec<64> : th == 256 ? k_rope_kv_vec<256> : k_rope_kv_vec<128>, grid,
                           dim3(th), 0, s, q, ld, pos, slot, H, Hkv, hd, rot_dim, interleaved, inv_freq, kv, hpb);
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_rope_kv_tune(int threads, int target_blocks, uint16_t *qkv, int64_t ld, int T, const int32_t *pos,
                                 const int32_t *slot, int H, int Hkv, int hd, int rot_dim, int interleaved,
                                 const float *inv_freq, sf_k_kv kv, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv || kv.head_dim != hd ||
        !rk_vec_ok(qkv, ld, hd, rot_dim, interleaved, kv) || (threads != 64 && threads != 128 && threads != 256) ||
        target_blocks < 1)
        return (int)cudaErrorInvalidValue;
    return rk_launch(threads, target_blocks, qkv, ld, T, pos, slot, H, Hkv, hd, rot_dim, interleaved, inv_freq, kv, s);
}

extern "C" int sf_k_rope_kv(uint16_t *qkv, int64_t ld, int T, const int32_t *pos, const int32_t *slot,
                            int H, int Hkv, int hd, int rot_dim, int interleaved, const float *inv_freq,
                            sf_k_kv kv, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv || kv.head_dim != hd) return (int)cudaErrorInvalidValue;
    if (rk_vec_ok(qkv, ld, hd, rot_dim, interleaved, kv))
        return rk_launch(RK_THREADS, RK_TARGET_BLOCKS, qkv, ld, T, pos, slot, H, Hkv, hd, rot_dim, interleaved,
                         inv_freq, kv, s);
    dim3 grid(T, H + 2 * Hkv);
    int threads = hd / 2 >= 64 ? 64 : 32;
    k_rope_kv<<<grid, threads, 0, s>>>((bf16 *)qkv, ld, pos, slot, H, Hkv, hd, rot_dim, interleaved, inv_freq, kv);
    return sf_launch_status();
}
