/* attention_prefill_fa2.cu — causal prefill attention over the paged KV cache in the style of
 * FlashAttention-2: bf16 mma.sync.m16n8k16 with fp32 accumulation, operands fetched with ldmatrix
 * from XOR-swizzled shared memory, K/V tiles copied with cp.async (double-buffered) straight from
 * the paged blocks, the online softmax kept in registers (exp2 with the scale folded in).
 *
 * Work split: a block of 4 warps per (query rows, head). The host's tile list (kernels.h) gives
 * runs of up to 64 consecutive tokens of one sequence at consecutive positions p0 .. p0 + rows - 1,
 * so chunked prefill (p0 > 0) and prefix reuse read the earlier keys from the cache. With 64 rows
 * per block each warp owns 16 rows and keeps its Q fragments in registers; with 128 (two
 * consecutive tiles of one sequence) each warp owns 32 rows as two m16 tiles that share every K
 * and V fragment (half the ldmatrix traffic per mma), Q reloaded from shared memory per key tile.
 * Per key tile: S = Q K^T (m16n8 accumulators), the causal mask where needed, the online softmax
 * of the warp's rows, O += P V with P taken directly from the S accumulators (the m16n8k16 C
 * layout of two n-tiles is the A layout of one k-step). Key tiles run from the last (the diagonal,
 * where the causal mask and the context end are applied) to the first; the tiles strictly below
 * the diagonal take no mask. Blocks are ordered longest query tile first.
 *
 * Shared memory (head size HD = 64 or 128): Q [rows][HD], K [2][BK][HD], V [2][BK][HD] bf16, rows
 * of HD/8 16-byte chunks stored at chunk ^ (row & 7), so the 8 row addresses of every ldmatrix
 * phase fall in distinct banks. HD 128, BK 64: 80 KB at 64 rows, 96 KB at 128 rows: two blocks
 * per SM either way (registers: 199 and 255 per thread, no spills).
 *
 * INT8 KV blocks (kernels.h) are dequantised by plain loads and shared-memory stores in the same
 * tile loader; bf16 rows go through cp.async. Requires scale > 0 (the max runs on raw scores). */
#include "common.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define FA_BQ 64
#define FA_NT 128

/* Pulls the block-table entries of keys kb .. min(kb + BK, ctx) - 1 into L1 ahead of their use,
 * so the tile loader's address lookups do not wait on L2. */
template <int BK>
static __device__ __forceinline__ void prefetch_bt(const int32_t *bt, int bs, int kb, int ctx)
{
    if (kb < 0) return;
    const int e0 = kb / bs, e1 = (min(kb + BK, ctx) - 1) / bs;
    if ((int)threadIdx.x <= e1 - e0) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(bt + e0 + threadIdx.x));
}

static __device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Element offset of 16-byte chunk c of row r in a [rows][HD] swizzled tile. */
template <int HD>
static __device__ __forceinline__ int swz(int r, int c)
{
    return r * HD + ((c ^ (r & 7)) << 3);
}

/* Issues the copies of keys kb .. kb + BK - 1 of kv head kh into K and V (swizzled); keys at or past
 * ctx become zero rows. Thread tid copies chunk tid % (HD/8) of rows tid / (HD/8) + i * FA_NT /
 * (HD/8): BK / 8 (HD 128) or BK / 16 (HD 64) rows of K and of V. */
template <int HD, int BK>
static __device__ __forceinline__ void load_kv(const sf_k_kv &kv, const int32_t *bt, int kh, int kb, int ctx, bf16 *K,
                                               bf16 *V, int lbs)
{
    constexpr int CH = HD / 8, RSTEP = FA_NT / CH;
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
#pragma unroll
    for (int i = 0; i < BK / RSTEP; i++) {
        const int r = r0 + i * RSTEP, p = kb + r, so = swz<HD>(r, c);
        if (p < ctx) {
            /* sf_kv_row, with shifts when the block size is a power of two (lbs = log2, else -1) */
            const int bs = kv.block_size, blk = lbs >= 0 ? p >> lbs : p / bs, off = p - blk * bs;
            const int64_t id = bt[blk];
            const int64_t o = kv.i8_base && id >= kv.i8_base
                                  ? ((((id - kv.i8_base) * kv.n_kv_heads + kh) * bs + off) << 1) | 1
                                  : (((id * kv.n_kv_heads + kh) * bs + off) * HD) << 1;
            if (o & 1) { /* INT8 block: dequantise through registers */
                int64_t row = o >> 1;
                *(bf16x8 *)(K + so) = sf_dequant8((const int8_t *)kv.k + row * HD + c * 8, kv.k_scale[row]);
                *(bf16x8 *)(V + so) = sf_dequant8((const int8_t *)kv.v + row * HD + c * 8, kv.v_scale[row]);
            } else {
                sf_cp_async16(K + so, kv.k + (o >> 1) + c * 8, 16);
                sf_cp_async16(V + so, kv.v + (o >> 1) + c * 8, 16);
            }
        } else {
            sf_cp_async16(K + so, kv.k, 0);
            sf_cp_async16(V + so, kv.v, 0);
        }
    }
}

/* One pass over query rows t0 .. t0 + nrows - 1 (one sequence, consecutive positions, nrows <=
 * 64 * MT) of head h: warp w owns rows mt * 64 + w * 16 .. + 15 for mt < MT. With MT = 1 the
 * warp's Q fragments stay in registers; with MT = 2 they are reloaded from shared memory for each
 * key tile, and every K and V fragment feeds two m-tiles (half the ldmatrix traffic per mma). */
template <int HD, int MT, int BK>
static __device__ __forceinline__ void fa2_pass(const sf_k_attn &a, int h, int t0, int nrows, bf16 *Qs, bf16 *Ks,
                                                bf16 *Vs)
{
    constexpr int CH = HD / 8, KD = HD / 16, ND = HD / 8, NS = BK / 8, BQ = FA_BQ * MT;
    const int kh = h / (a.H / a.Hkv), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int seq = a.tok_seq[t0], pos0 = a.pos[t0], ctx = a.pos[t0 + nrows - 1] + 1;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int n_kt = (ctx + BK - 1) / BK;
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */

    __syncthreads(); /* a previous pass's output staging in Qs is done */
    /* Q tile (rows past the tile zero) and the last key tile: group 0 */
    {
        const int c = tid % CH;
        for (int r = tid / CH; r < BQ; r += FA_NT / CH) {
            const bf16 *src = (const bf16 *)a.q + (int64_t)(t0 + (r < nrows ? r : 0)) * a.ld_q + (int64_t)h * HD + c * 8;
            sf_cp_async16(Qs + swz<HD>(r, c), src, r < nrows ? 16 : 0);
        }
    }
    const int bsz = a.kv.block_size, lbs = (bsz & (bsz - 1)) ? -1 : __ffs(bsz) - 1;
    load_kv<HD, BK>(a.kv, bt, kh, (n_kt - 1) * BK, ctx, Ks, Vs, lbs);
    sf_cp_async_commit();
    prefetch_bt<BK>(bt, a.kv.block_size, (n_kt - 2) * BK, ctx);

    const int g = lane >> 2, tq = lane & 3;
    unsigned qf[MT == 1 ? KD : 1][4];
    float o[MT][ND][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < ND; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }

    for (int it = 0; it < n_kt; it++) {
        const int kb = (n_kt - 1 - it) * BK, buf = it & 1;
        const bf16 *K = Ks + buf * BK * HD, *V = Vs + buf * BK * HD;
        if (it + 1 < n_kt) load_kv<HD, BK>(a.kv, bt, kh, kb - BK, ctx, Ks + (buf ^ 1) * BK * HD, Vs + (buf ^ 1) * BK * HD, lbs);
        sf_cp_async_commit();
        prefetch_bt<BK>(bt, a.kv.block_size, kb - 2 * BK, ctx);
        sf_cp_async_wait<1>(); /* everything but the tile just issued has landed */
        __syncthreads();
        if (MT == 1 && it == 0) {
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
                sf_ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                        Qs + swz<HD>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)));
        }

        /* S = Q K^T: 16 rows x 64 keys per m-tile */
        float s[MT][NS][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < NS; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
            unsigned qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                if (MT == 1) {
                    qa[mt][0] = qf[MT == 1 ? kk : 0][0]; qa[mt][1] = qf[MT == 1 ? kk : 0][1];
                    qa[mt][2] = qf[MT == 1 ? kk : 0][2]; qa[mt][3] = qf[MT == 1 ? kk : 0][3];
                } else {
                    sf_ldsm_x4(qa[mt][0], qa[mt][1], qa[mt][2], qa[mt][3],
                            Qs + swz<HD>(mt * 64 + warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)));
                }
            }
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                unsigned b0, b1, b2, b3;
                sf_ldsm_x4(b0, b1, b2, b3, K + swz<HD>(np * 16 + (lane & 7) + (lane >> 4) * 8, 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    sf_mma_bf16(s[mt][2 * np], qa[mt], b0, b1);
                    sf_mma_bf16(s[mt][2 * np + 1], qa[mt], b2, b3);
                }
            }
        }

#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int qpos = pos0 + mt * 64 + warp * 16 + g; /* row g; row g + 8 is qpos + 8 */
            float (&sm_)[NS][4] = s[mt];
            /* causal mask (and the context end) only where a key can pass the first query */
            if (kb + BK - 1 > pos0) {
#pragma unroll
                for (int n = 0; n < NS; n++) {
                    const int key = kb + n * 8 + 2 * tq;
                    if (key > qpos) sm_[n][0] = -INFINITY;
                    if (key + 1 > qpos) sm_[n][1] = -INFINITY;
                    if (key > qpos + 8) sm_[n][2] = -INFINITY;
                    if (key + 1 > qpos + 8) sm_[n][3] = -INFINITY;
                }
            }
            /* online softmax: rows g (0) and g + 8 (1), four lanes per row */
            float mx0 = m[mt][0], mx1 = m[mt][1];
#pragma unroll
            for (int n = 0; n < NS; n++) {
                mx0 = fmaxf(mx0, fmaxf(sm_[n][0], sm_[n][1]));
                mx1 = fmaxf(mx1, fmaxf(sm_[n][2], sm_[n][3]));
            }
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
            /* a row with no key yet keeps max -inf: subtract 0 instead so exp2 gives 0, not NaN */
            const float b0 = mx0 == -INFINITY ? 0.0f : mx0 * sl2, b1 = mx1 == -INFINITY ? 0.0f : mx1 * sl2;
            const float al0 = fast_exp2(m[mt][0] * sl2 - b0), al1 = fast_exp2(m[mt][1] * sl2 - b1);
            m[mt][0] = mx0;
            m[mt][1] = mx1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NS; n++) {
                sm_[n][0] = fast_exp2(fmaf(sm_[n][0], sl2, -b0));
                sm_[n][1] = fast_exp2(fmaf(sm_[n][1], sl2, -b0));
                sm_[n][2] = fast_exp2(fmaf(sm_[n][2], sl2, -b1));
                sm_[n][3] = fast_exp2(fmaf(sm_[n][3], sl2, -b1));
                sum0 += sm_[n][0] + sm_[n][1];
                sum1 += sm_[n][2] + sm_[n][3];
            }
            l[mt][0] = l[mt][0] * al0 + sum0;
            l[mt][1] = l[mt][1] * al1 + sum1;
            if (__any_sync(0xffffffffu, al0 != 1.0f || al1 != 1.0f)) { /* skipped when no row max moved */
#pragma unroll
                for (int n = 0; n < ND; n++) {
                    o[mt][n][0] *= al0;
                    o[mt][n][1] *= al0;
                    o[mt][n][2] *= al1;
                    o[mt][n][3] *= al1;
                }
            }
        }

        /* O += P V: P's k-step kk is S n-tiles 2kk, 2kk + 1 */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                pa[mt][0] = sf_pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                pa[mt][1] = sf_pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                pa[mt][2] = sf_pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                pa[mt][3] = sf_pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < ND / 2; dp++) {
                unsigned b0, b1, b2, b3;
                sf_ldsm_x4_t(b0, b1, b2, b3, V + swz<HD>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    sf_mma_bf16(o[mt][2 * dp], pa[mt], b0, b1);
                    sf_mma_bf16(o[mt][2 * dp + 1], pa[mt], b2, b3);
                }
            }
        }
        __syncthreads(); /* this buffer is refilled by the next iteration's copies */
    }

    /* out = O / l, staged through this warp's own rows of Q for 16-byte stores */
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        float inv[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float lj = l[mt][j];
            lj += __shfl_xor_sync(0xffffffffu, lj, 1);
            lj += __shfl_xor_sync(0xffffffffu, lj, 2);
            inv[j] = lj > 0.0f ? 1.0f / lj : 0.0f;
        }
        const int rA = mt * 64 + warp * 16 + g, rB = rA + 8;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            *(unsigned *)(Qs + swz<HD>(rA, n) + 2 * tq) = sf_pack_bf16(o[mt][n][0] * inv[0], o[mt][n][1] * inv[0]);
            *(unsigned *)(Qs + swz<HD>(rB, n) + 2 * tq) = sf_pack_bf16(o[mt][n][2] * inv[1], o[mt][n][3] * inv[1]);
        }
    }
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = lane; i < 16 * CH; i += 32) {
            const int r = mt * 64 + warp * 16 + i / CH, c = i % CH;
            if (r < nrows)
                *(bf16x8 *)((bf16 *)a.out + (int64_t)(t0 + r) * a.ld_out + (int64_t)h * HD + c * 8) =
                    *(const bf16x8 *)(Qs + swz<HD>(r, c));
        }
}

/* Grid (H, work items), the items in reverse list order so the longest query tiles start first.
 * MT = 1: item i is tile i. MT = 2: item i is tiles 2i and 2i + 1, one 128-row pass when the
 * second continues the first in the same sequence, else two passes. */
template <int HD, int MT, int BK>
__global__ void __launch_bounds__(FA_NT, 2) k_attn_prefill_fa2(sf_k_attn a)
{
    extern __shared__ __align__(128) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm, *Ks = Qs + FA_BQ * MT * HD, *Vs = Ks + 2 * BK * HD;
    const int h = blockIdx.x, n_items = (a.n_tiles + MT - 1) / MT, item = n_items - 1 - (int)blockIdx.y;
    if (MT == 1) {
        fa2_pass<HD, MT, BK>(a, h, a.tiles[2 * item], a.tiles[2 * item + 1], Qs, Ks, Vs);
        return;
    }
    const int ta = 2 * item, tb = ta + 1;
    const int t0 = a.tiles[2 * ta], rows = a.tiles[2 * ta + 1];
    const bool paired = tb < a.n_tiles && rows == FA_BQ && a.tiles[2 * tb] == t0 + FA_BQ &&
                        a.tok_seq[a.tiles[2 * tb]] == a.tok_seq[t0];
    const int n_pass = paired || tb >= a.n_tiles ? 1 : 2;
    for (int p = 0; p < n_pass; p++) {
        const int tp = p ? tb : ta;
        fa2_pass<HD, MT, BK>(a, h, a.tiles[2 * tp], paired ? FA_BQ + a.tiles[2 * tb + 1] : a.tiles[2 * tp + 1], Qs, Ks, Vs);
    }
}

template <int HD, int MT, int BK>
static int launch_fa2(const sf_k_attn *a, cudaStream_t s)
{
    static sf_k_smem smem_set;
    const int smem = (FA_BQ * MT + 4 * BK) * HD * 2;
    int e = sf_k_smem_attr(&smem_set, k_attn_prefill_fa2<HD, MT, BK>, (size_t)smem);
    if (e) return e;
    dim3 grid(a->H, (a->n_tiles + MT - 1) / MT);
    k_attn_prefill_fa2<HD, MT, BK><<<grid, FA_NT, smem, s>>>(*a);
    return sf_launch_status();
}

extern "C" int sf_k_attention_prefill_fa2_ok(const sf_k_attn *a)
{
    return (a->hd == 64 || a->hd == 128) && a->scale > 0.0f && a->Hkv > 0 && a->H % a->Hkv == 0 && a->tiles &&
           a->n_tiles <= 65535 && a->ld_q % 8 == 0 && a->ld_out % 8 == 0 && a->kv.head_dim == a->hd;
}

extern "C" int sf_k_attention_prefill_fa2(const sf_k_attn *a, int block_rows, cudaStream_t s)
{
    return sf_k_attention_prefill_fa2_keys(a, block_rows, 0, s);
}

extern "C" int sf_k_attention_prefill_fa2_keys(const sf_k_attn *a, int block_rows, int key_rows, cudaStream_t s)
{
    static const char *const keys[] = { "64", "32" };
    static const int bk32 = sf_env_choice("SEMFLOW_ATTN_FA2_BK", 0, keys, 2) == 1; /* read once, thread-safe */
    if (a->n_tiles <= 0) return 0;
    if (!sf_k_attention_prefill_fa2_ok(a) || (block_rows != 0 && block_rows != 64 && block_rows != 128) ||
        (key_rows != 0 && key_rows != 32 && key_rows != 64))
        return (int)cudaErrorInvalidValue;
    if (block_rows == 0) { /* 128 rows when the pairs still make >= 2 blocks per SM (2048 tokens of
                            * 32 heads: 201 against 270 us; 512 tokens: 44 against 35 us) */
        const int sms = sf_k_sm_count(132);
        block_rows = (int64_t)(a->n_tiles + 1) / 2 * a->H >= 2 * (int64_t)sms ? 128 : 64;
    }
    const int mt2 = block_rows == 128;
    /* 128 rows of head size 128: 64-key tiles (255 registers; call 3: 165 against 185 us with 32-key
     * tiles at 2048 tokens), 32 with SEMFLOW_ATTN_FA2_BK=32 */
    if (a->hd == 128 && mt2) {
        const bool k32 = key_rows ? key_rows == 32 : bk32;
        return k32 ? launch_fa2<128, 2, 32>(a, s) : launch_fa2<128, 2, 64>(a, s);
    }
    if (a->hd == 128) return launch_fa2<128, 1, 64>(a, s);
    return mt2 ? launch_fa2<64, 2, 64>(a, s) : launch_fa2<64, 1, 64>(a, s);
}
