/* attention_prefill.cu — causal attention for prefill chunks on the tensor cores (WMMA bf16,
 * fp32 accumulation), over the paged KV cache, with an online softmax (flash attention).
 *
 * One block per (query tile, head). A query tile is up to 64 consecutive tokens of one
 * sequence (the host builds the tile list); each of the 4 warps owns 16 of its rows. For each
 * tile of 64 keys (positions 0 .. last row's position, read through the block table):
 *   S = Q K^T (WMMA) -> shared fp32; per row: scale, causal mask, running max and sum,
 *   P = exp(S - m) as bf16; O (shared fp32) *= alpha; O += P V (WMMA).
 * Keys past the tile's context are zero-filled so masked products never touch unwritten cache.
 * Shared memory (hd = 128): Q, K, V 17 KB each, S 17 KB, P 9 KB, O 33 KB: 113 KB, 2 blocks/SM.
 * Head sizes 64 and 128 take the register-resident variant below (k_attn_prefill_reg).
 * sf_k_attention_prefill picks the FlashAttention-2-style kernel (attention_prefill_fa2.cu) where
 * it applies, these WMMA kernels elsewhere or with SEMFLOW_ATTN_PREFILL=wmma. */
#include <mma.h>

#include "common.cuh"

extern "C" {
#include "../../common/sf.h"
}

using namespace nvcuda;

#define BQ 64
#define BK 64
#define NW 4

struct prefill_smem {
    int ld_bf, lds, ldp, ldo;
    size_t q, k, v, s, p, o, ml, total;
};

static __host__ __device__ size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

static __host__ __device__ prefill_smem smem_layout(int hd, bool with_o)
{
    prefill_smem L;
    L.ld_bf = hd + 8;
    L.lds = BK + 4;
    L.ldp = BK + 8;
    L.ldo = hd + 4;
    size_t off = 0;
    L.q = off; off = align128(off + (size_t)BQ * L.ld_bf * 2);
    L.k = off; off = align128(off + (size_t)BK * L.ld_bf * 2);
    L.v = off; off = align128(off + (size_t)BK * L.ld_bf * 2);
    L.s = off; off = align128(off + (size_t)BQ * L.lds * 4);
    L.p = off; off = align128(off + (size_t)BQ * L.ldp * 2);
    L.o = off; off = align128(off + (with_o ? (size_t)BQ * L.ldo * 4 : 0));
    L.ml = off; off = align128(off + (size_t)3 * BQ * 4);
    L.total = off;
    return L;
}

__global__ void __launch_bounds__(NW * 32) k_attn_prefill(sf_k_attn a)
{
    extern __shared__ __align__(128) unsigned char sm[];
    const int hd = a.hd, G = a.H / a.Hkv;
    const prefill_smem L = smem_layout(hd, true);
    bf16 *Q = (bf16 *)(sm + L.q), *K = (bf16 *)(sm + L.k), *V = (bf16 *)(sm + L.v), *P = (bf16 *)(sm + L.p);
    float *S = (float *)(sm + L.s), *O = (float *)(sm + L.o), *M = (float *)(sm + L.ml), *Ls = M + BQ, *Al = Ls + BQ;
    const int tile = blockIdx.x, h = blockIdx.y, kh = h / G, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t0 = a.tiles[2 * tile], nrows = a.tiles[2 * tile + 1];
    const int seq = a.tok_seq[t0], pos0 = a.pos[t0], ctx = a.pos[t0 + nrows - 1] + 1;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int h8 = hd / 8;

    /* Q tile (zero rows past the tile), O = 0, m = -inf, l = 0 */
    for (int i = tid; i < BQ * h8; i += NW * 32) {
        int r = i / h8, d = (i - r * h8) * 8;
        bf16x8 v;
        if (r < nrows) v = *(const bf16x8 *)((const bf16 *)a.q + (int64_t)(t0 + r) * a.ld_q + (int64_t)h * hd + d);
        else memset(&v, 0, sizeof v);
        *(bf16x8 *)(Q + r * L.ld_bf + d) = v;
    }
    for (int i = tid; i < BQ * hd; i += NW * 32) O[(i / hd) * L.ldo + i % hd] = 0.0f;
    if (tid < BQ) { M[tid] = -INFINITY; Ls[tid] = 0.0f; }

    const int r0 = warp * 16;
    __shared__ int64_t koff[BK];
    for (int kb = 0; kb < ctx; kb += BK) {
        __syncthreads(); /* K, V, P of the previous tile consumed; Q, O, M ready */
        sf_load_kv_tile(a.kv, bt, kh, hd, kb, BK, ctx, K, L.ld_bf, V, L.ld_bf, koff);
        /* S[r0:r0+16, 0:64] = Q K^T */
        for (int j = 0; j < BK / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < hd / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, Q + r0 * L.ld_bf + kk * 16, L.ld_bf);
                wmma::load_matrix_sync(fb, K + (j * 16) * L.ld_bf + kk * 16, L.ld_bf);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(S + r0 * L.lds + j * 16, acc, L.lds, wmma::mem_row_major);
        }
        __syncwarp();
        /* online softmax: two lanes per row, 32 columns each */
        {
            int row = r0 + (lane >> 1), c0 = (lane & 1) * 32;
            int qpos = pos0 + row;
            bool valid = row < nrows;
            float mx = -INFINITY;
            float *srow = S + row * L.lds + c0;
            for (int c = 0; c < 32; c++) {
                int key = kb + c0 + c;
                float v = (valid && key <= qpos) ? srow[c] * a.scale : -INFINITY;
                srow[c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = M[row], m_new = fmaxf(m_old, mx), alpha = 1.0f, sum = 0.0f;
            bf16 *prow = P + row * L.ldp + c0;
            if (m_new == -INFINITY) {
                for (int c = 0; c < 32; c++) prow[c] = f2bf(0.0f);
            } else {
                alpha = expf(m_old - m_new);
                for (int c = 0; c < 32; c++) {
                    float p = expf(srow[c] - m_new);
                    bf16 pb = f2bf(p);
                    prow[c] = pb;
                    sum += bf2f(pb); /* the sum matches the bf16 weights P V uses */
                }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            __syncwarp();
            if ((lane & 1) == 0) {
                Ls[row] = Ls[row] * alpha + sum;
                M[row] = m_new;
                Al[row] = alpha;
            }
        }
        __syncwarp();
        /* O[r0:r0+16] *= alpha */
        for (int i = lane; i < 16 * hd; i += 32) {
            int r = r0 + i / hd, d = i % hd;
            O[r * L.ldo + d] *= Al[r];
        }
        __syncwarp();
        /* O += P V */
        for (int jd = 0; jd < hd / 16; jd++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, O + r0 * L.ldo + jd * 16, L.ldo, wmma::mem_row_major);
            for (int kk = 0; kk < BK / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, P + r0 * L.ldp + kk * 16, L.ldp);
                wmma::load_matrix_sync(fb, V + (kk * 16) * L.ld_bf + jd * 16, L.ld_bf);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(O + r0 * L.ldo + jd * 16, acc, L.ldo, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int i = tid; i < nrows * hd; i += NW * 32) {
        int r = i / hd, d = i - r * hd;
        float l = Ls[r];
        ((bf16 *)a.out)[(int64_t)(t0 + r) * a.ld_out + (int64_t)h * hd + d] = f2bf(l > 0.0f ? O[r * L.ldo + d] / l : 0.0f);
    }
}


/* Register-resident variant for head_dim 16 * HDF (64, 128): Q fragments stay in registers for
 * the whole key loop, O accumulates in registers (its rows rescaled in place), and P fragments
 * are loaded once per 16 keys. Rescaling needs the accumulator fragment's element -> row map,
 * which WMMA leaves unspecified: each warp checks the expected map (that of the m16n8k16 pair
 * the compiler emits on sm_80+) against a known tile first and, if it differs, rescales
 * through shared memory instead. Shared memory: Q, K, V, S, P, as above, no O (78 KB). */
template <int HDF>
__global__ void __launch_bounds__(NW * 32) k_attn_prefill_reg(sf_k_attn a)
{
    extern __shared__ __align__(128) unsigned char sm[];
    constexpr int hd = HDF * 16;
    const int G = a.H / a.Hkv;
    const prefill_smem L = smem_layout(hd, false);
    bf16 *Q = (bf16 *)(sm + L.q), *K = (bf16 *)(sm + L.k), *V = (bf16 *)(sm + L.v), *P = (bf16 *)(sm + L.p);
    float *S = (float *)(sm + L.s), *M = (float *)(sm + L.ml), *Ls = M + BQ, *Al = Ls + BQ;
    const int tile = blockIdx.x, h = blockIdx.y, kh = h / G, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t0 = a.tiles[2 * tile], nrows = a.tiles[2 * tile + 1];
    const int seq = a.tok_seq[t0], pos0 = a.pos[t0], ctx = a.pos[t0 + nrows - 1] + 1;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int h8 = hd / 8, r0 = warp * 16;
    float *Sw = S + r0 * L.lds; /* this warp's 16 rows of S, also its 16x16 scratch */

    for (int i = tid; i < BQ * h8; i += NW * 32) {
        int r = i / h8, d = (i - r * h8) * 8;
        bf16x8 v;
        if (r < nrows) v = *(const bf16x8 *)((const bf16 *)a.q + (int64_t)(t0 + r) * a.ld_q + (int64_t)h * hd + d);
        else memset(&v, 0, sizeof v);
        *(bf16x8 *)(Q + r * L.ld_bf + d) = v;
    }
    if (tid < BQ) { M[tid] = -INFINITY; Ls[tid] = 0.0f; }
    /* the accumulator map check */
    for (int e = lane; e < 256; e += 32) Sw[(e / 16) * L.lds + e % 16] = (float)(e / 16);
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[HDF];
    bool map_ok;
    {
        wmma::load_matrix_sync(o[0], Sw, L.lds, wmma::mem_row_major);
        bool ok = o[0].num_elements == 8;
        for (int i = 0; i < o[0].num_elements && ok; i++) ok = o[0].x[i] == (float)((lane >> 2) + 8 * ((i >> 1) & 1));
        map_ok = __all_sync(0xffffffffu, ok);
    }
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qf[HDF];
#pragma unroll
    for (int kk = 0; kk < HDF; kk++) {
        wmma::load_matrix_sync(qf[kk], Q + r0 * L.ld_bf + kk * 16, L.ld_bf);
        wmma::fill_fragment(o[kk], 0.0f);
    }

    __shared__ int64_t koff[BK];
    for (int kb = 0; kb < ctx; kb += BK) {
        __syncthreads();
        sf_load_kv_tile(a.kv, bt, kh, hd, kb, BK, ctx, K, L.ld_bf, V, L.ld_bf, koff);
#pragma unroll
        for (int j = 0; j < BK / 16; j++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HDF; kk++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb;
                wmma::load_matrix_sync(fb, K + (j * 16) * L.ld_bf + kk * 16, L.ld_bf);
                wmma::mma_sync(acc, qf[kk], fb, acc);
            }
            wmma::store_matrix_sync(Sw + j * 16, acc, L.lds, wmma::mem_row_major);
        }
        __syncwarp();
        {
            int row = r0 + (lane >> 1), c0 = (lane & 1) * 32, qpos = pos0 + row;
            bool valid = row < nrows;
            const float *srow = S + row * L.lds + c0;
            float sv[32], mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < 32; c++) {
                sv[c] = (valid && kb + c0 + c <= qpos) ? srow[c] * a.scale : -INFINITY;
                mx = fmaxf(mx, sv[c]);
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            float m_old = M[row], m_new = fmaxf(m_old, mx), alpha = 1.0f, sum = 0.0f;
            bf16 *prow = P + row * L.ldp + c0;
            if (m_new == -INFINITY) {
#pragma unroll
                for (int c = 0; c < 32; c++) prow[c] = f2bf(0.0f);
            } else {
                alpha = expf(m_old - m_new);
#pragma unroll
                for (int c = 0; c < 32; c++) {
                    bf16 pb = f2bf(expf(sv[c] - m_new));
                    prow[c] = pb;
                    sum += bf2f(pb);
                }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            __syncwarp();
            if ((lane & 1) == 0) {
                Ls[row] = Ls[row] * alpha + sum;
                M[row] = m_new;
                Al[row] = alpha;
            }
        }
        __syncwarp();
        /* O rows *= alpha */
        if (map_ok) {
            float a_lo = Al[r0 + (lane >> 2)], a_hi = Al[r0 + (lane >> 2) + 8];
#pragma unroll
            for (int jd = 0; jd < HDF; jd++)
#pragma unroll
                for (int i = 0; i < 8; i++) o[jd].x[i] *= ((i >> 1) & 1) ? a_hi : a_lo;
        } else {
#pragma unroll
            for (int jd = 0; jd < HDF; jd++) {
                wmma::store_matrix_sync(Sw, o[jd], L.lds, wmma::mem_row_major);
                __syncwarp();
                for (int e = lane; e < 256; e += 32) Sw[(e / 16) * L.lds + e % 16] *= Al[r0 + e / 16];
                __syncwarp();
                wmma::load_matrix_sync(o[jd], Sw, L.lds, wmma::mem_row_major);
                __syncwarp();
            }
        }
        /* O += P V, each P fragment loaded once */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
            wmma::load_matrix_sync(pa, P + r0 * L.ldp + kk * 16, L.ldp);
#pragma unroll
            for (int jd = 0; jd < HDF; jd++) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
                wmma::load_matrix_sync(vb, V + (kk * 16) * L.ld_bf + jd * 16, L.ld_bf);
                wmma::mma_sync(o[jd], pa, vb, o[jd]);
            }
        }
    }
    /* out = O / l, through the warp's scratch */
    __syncwarp();
#pragma unroll
    for (int jd = 0; jd < HDF; jd++) {
        wmma::store_matrix_sync(Sw, o[jd], L.lds, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            int r = e / 16, c = e % 16;
            if (r0 + r < nrows) {
                float l = Ls[r0 + r];
                ((bf16 *)a.out)[(int64_t)(t0 + r0 + r) * a.ld_out + (int64_t)h * hd + jd * 16 + c] =
                    f2bf(l > 0.0f ? Sw[r * L.lds + c] / l : 0.0f);
            }
        }
        __syncwarp();
    }
}

template <int HDF>
static int launch_reg(const sf_k_attn *a, cudaStream_t s)
{
    static sf_k_smem smem_set;
    size_t total = smem_layout(HDF * 16, false).total; /* no O region: S doubles as scratch */
    int e = sf_k_smem_attr(&smem_set, k_attn_prefill_reg<HDF>, total);
    if (e) return e;
    dim3 grid(a->n_tiles, a->H);
    k_attn_prefill_reg<HDF><<<grid, NW * 32, total, s>>>(*a);
    return sf_launch_status();
}

extern "C" int sf_k_attention_prefill_ok(int hd) { return hd % 16 == 0 && hd <= SF_K_ATTN_MAX_HD; }

extern "C" int sf_k_attention_prefill(const sf_k_attn *a, cudaStream_t s)
{
    enum { P_FA2, P_FA2_64, P_FA2_128, P_WMMA };
    static const char *const paths[] = { "fa2", "fa2-64", "fa2-128", "wmma" };
    /* read once (a thread-safe static): not a scan of the environment per layer per step */
    static const int path = sf_env_choice("SEMFLOW_ATTN_PREFILL", P_FA2, paths, 4);
    if (a->n_tiles <= 0) return 0;
    if (path != P_WMMA && sf_k_attention_prefill_fa2_ok(a))
        return sf_k_attention_prefill_fa2(a, path == P_FA2_64 ? 64 : path == P_FA2_128 ? 128 : 0, s);
    return sf_k_attention_prefill_wmma(a, s);
}

extern "C" int sf_k_attention_prefill_wmma(const sf_k_attn *a, cudaStream_t s)
{
    if (a->n_tiles <= 0) return 0;
    if (!sf_k_attention_prefill_ok(a->hd) || a->Hkv <= 0 || a->H % a->Hkv || !a->tiles) return (int)cudaErrorInvalidValue;
    if (a->hd == 128) return launch_reg<8>(a, s);
    if (a->hd == 64) return launch_reg<4>(a, s);
    static sf_k_smem smem_set;
    size_t smem = smem_layout(a->hd, true).total;
    int e = sf_k_smem_attr(&smem_set, k_attn_prefill, smem);
    if (e) return e;
    dim3 grid(a->n_tiles, a->H);
    k_attn_prefill<<<grid, NW * 32, smem, s>>>(*a);
    return sf_launch_status();
}
