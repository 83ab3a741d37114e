/* attention_prefill.cu — causal attention for prefill chunks on the tensor cores (WMMA bf16,
 * fp32 accumulation), over the paged KV cache, with an online softmax (flash attention).
 *
 * One block per (query tile, head). A query tile is up to 64 consecutive tokens of one
 * sequence (the host builds the tile list); each of the 4 warps owns 16 of its rows. For each
 * tile of 64 keys (positions 0 .. last row's position, read through the block table):
 *   S = Q K^T (WMMA) -> shared fp32; per row: scale, causal mask, running max and sum,
 *   P = exp(S - m) as bf16; O (shared fp32) *= alpha; O += P V (WMMA).
 * Keys past the tile's context are zero-filled so masked products never touch unwritten cache.
 * Shared memory (hd = 128): Q, K, V 17 KB each, S 17 KB, P 9 KB, O 33 KB: 113 KB, 2 blocks/SM. */
#include <mma.h>

#include "common.cuh"

using namespace nvcuda;

#define BQ 64
#define BK 64
#define NW 4

struct prefill_smem {
    int ld_bf, lds, ldp, ldo;
    size_t q, k, v, s, p, o, ml, total;
};

static __host__ __device__ size_t align128(size_t x) { return (x + 127) & ~(size_t)127; }

static __host__ __device__ prefill_smem smem_layout(int hd)
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
    L.o = off; off = align128(off + (size_t)BQ * L.ldo * 4);
    L.ml = off; off = align128(off + (size_t)3 * BQ * 4);
    L.total = off;
    return L;
}

__global__ void __launch_bounds__(NW * 32) k_attn_prefill(sf_k_attn a)
{
    extern __shared__ __align__(128) unsigned char sm[];
    const int hd = a.hd, G = a.H / a.Hkv;
    const prefill_smem L = smem_layout(hd);
    bf16 *Q = (bf16 *)(sm + L.q), *K = (bf16 *)(sm + L.k), *V = (bf16 *)(sm + L.v), *P = (bf16 *)(sm + L.p);
    float *S = (float *)(sm + L.s), *O = (float *)(sm + L.o), *M = (float *)(sm + L.ml), *Ls = M + BQ, *Al = Ls + BQ;
    const int tile = blockIdx.x, h = blockIdx.y, kh = h / G, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t0 = a.tiles[2 * tile], nrows = a.tiles[2 * tile + 1];
    const int seq = a.tok_seq[t0], pos0 = a.pos[t0], ctx = a.pos[t0 + nrows - 1] + 1;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int bs = a.kv.block_size, Hkv = a.Hkv, h8 = hd / 8;
    const bf16 *kc = (const bf16 *)a.kv.k, *vc = (const bf16 *)a.kv.v;

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
    for (int kb = 0; kb < ctx; kb += BK) {
        __syncthreads(); /* K, V, P of the previous tile consumed; Q, O, M ready */
        for (int i = tid; i < BK * h8; i += NW * 32) {
            int j = i / h8, d = (i - j * h8) * 8, p = kb + j;
            bf16x8 kv8, vv8;
            if (p < ctx) {
                int64_t src = (((int64_t)bt[p / bs] * Hkv + kh) * bs + p % bs) * hd + d;
                kv8 = *(const bf16x8 *)(kc + src);
                vv8 = *(const bf16x8 *)(vc + src);
            } else {
                memset(&kv8, 0, sizeof kv8);
                memset(&vv8, 0, sizeof vv8);
            }
            *(bf16x8 *)(K + j * L.ld_bf + d) = kv8;
            *(bf16x8 *)(V + j * L.ld_bf + d) = vv8;
        }
        __syncthreads();
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

extern "C" int sf_k_attention_prefill_ok(int hd) { return hd % 16 == 0 && hd <= SF_K_ATTN_MAX_HD; }

extern "C" int sf_k_attention_prefill(const sf_k_attn *a, cudaStream_t s)
{
    if (a->n_tiles <= 0) return 0;
    if (!sf_k_attention_prefill_ok(a->hd) || a->Hkv <= 0 || a->H % a->Hkv || !a->tiles) return (int)cudaErrorInvalidValue;
    static size_t smem_set = 48 * 1024; /* the launch thread is the backend's only thread */
    size_t smem = smem_layout(a->hd).total;
    if (smem > smem_set) {
        cudaError_t e = cudaFuncSetAttribute(k_attn_prefill, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return (int)e;
        smem_set = smem;
    }
    dim3 grid(a->n_tiles, a->H);
    k_attn_prefill<<<grid, NW * 32, smem, s>>>(*a);
    return sf_launch_status();
}
