/* attention_decode.cuh — what the decode-attention kernels (attention_decode.cu, the lanes kernel;
 * attention_decode_mma.cu and attention_decode_stream.cu, the batch kernels) share: the end of a
 * key split (a block's piece of the keys, and the combine of the pieces). Device code only. */
#ifndef SF_KERNELS_ATTENTION_DECODE_CUH
#define SF_KERNELS_ATTENTION_DECODE_CUH

#include "common.cuh"

#define SF_AD_MAX_SPLIT 64

/* A block's result for query head h, dimension d of token t: the output itself when there is one
 * split, else its partial (o unnormalised, m in base 2, l) in the workspace for
 * sf_attn_split_finish. */
template <int HD>
static __device__ __forceinline__ void sf_attn_split_store(const sf_k_attn &a, int t, int h, int split, int d, float O,
                                                           float M, float L)
{
    const int ns = a.n_split;
    if (ns == 1) {
        ((bf16 *)a.out)[(int64_t)t * a.ld_out + (int64_t)h * HD + d] = f2bf(L > 0.0f ? O / L : 0.0f);
    } else {
        float *wp = a.ws + (((int64_t)t * a.H + h) * ns + split) * (HD + 2);
        wp[d] = O;
        if (d == 0) { wp[HD] = M; wp[HD + 1] = L; }
    }
}

/* After a block has written its piece of the keys for G query heads (o unnormalised, m in base
 * 2, l: hd + 2 floats per head) to the workspace, the last of the np blocks to finish (*cnt
 * counts the `arrivals` blocks that write pieces of them, and is reset for the next launch: graph
 * replays reuse it) combines the pieces into out (G x HD outputs). piece(g, p) is where piece p
 * (0..np-1, np <= SF_AD_MAX_SPLIT) of head g is. Called by every thread of the block (nwarps
 * warps); wsm: [G][SF_AD_MAX_SPLIT] floats and `last` one int of shared memory.
 *
 * Every load here is an L2 round trip while the next kernel streams its weights, so they are
 * issued together: a piece's m and l at once, then CH pieces of each of a thread's two outputs
 * (four pieces at a time before: Llama-3-8B batch 1 at 4096 keys, 33 splits, is 0.6-1.2% faster
 * a token; most of the ~11 us from the last piece to the combine's end there is the wait behind
 * the O projection's ring prefetch, docs/PERFORMANCE.md session 12). The batch kernels, whose
 * steps split into few pieces, keep CH small (registers: blocks per SM). */
template <int HD, int CH, class Piece>
static __device__ void sf_attn_pieces_finish(unsigned *cnt, bf16 *out, int G, int np, int arrivals, int nwarps,
                                             float *wsm, int *last, const Piece &piece)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = nwarps * 32;
    /* the block's pieces published and, for the last block, every other block's acquired by one
     * acq_rel count (common.cuh); no fence.sc before or after it */
    __syncthreads();
    if (tid == 0) *last = sf_atom_add_acq_rel_gpu(cnt, 1u) == (unsigned)arrivals - 1;
    __syncthreads();
    if (!*last) return;
    for (int g = warp; g < G; g += nwarps) {
        const float *p0 = lane < np ? piece(g, lane) : NULL, *p1 = lane + 32 < np ? piece(g, lane + 32) : NULL;
        const float m0 = p0 ? __ldcg(p0 + HD) : -INFINITY, l0 = p0 ? __ldcg(p0 + HD + 1) : 0.0f;
        const float m1 = p1 ? __ldcg(p1 + HD) : -INFINITY, l1 = p1 ? __ldcg(p1 + HD + 1) : 0.0f;
        const float M = warp_max(fmaxf(m0, m1));
        float e0 = 0.0f, e1 = 0.0f;
        if (M != -INFINITY) {
            if (m0 != -INFINITY) e0 = exp2f(m0 - M);
            if (m1 != -INFINITY) e1 = exp2f(m1 - M);
        }
        const float L = warp_sum(e0 * l0 + e1 * l1);
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        wsm[g * SF_AD_MAX_SPLIT + lane] = e0 * inv;
        wsm[g * SF_AD_MAX_SPLIT + lane + 32] = e1 * inv;
    }
    __syncthreads();
    for (int i0 = tid; i0 < G * HD; i0 += 2 * nt) {
        const int i1 = i0 + nt, g0 = i0 / HD, d0 = i0 - g0 * HD;
        const bool two = i1 < G * HD;
        const int g1 = two ? i1 / HD : g0, d1 = two ? i1 - g1 * HD : d0;
        const float *e0 = wsm + g0 * SF_AD_MAX_SPLIT, *e1 = wsm + g1 * SF_AD_MAX_SPLIT;
        float o0 = 0.0f, o1 = 0.0f;
        for (int c = 0; c < np; c += CH) {
            float x0[CH], x1[CH];
#pragma unroll
            for (int j = 0; j < CH; j++) {
                x0[j] = c + j < np ? __ldcg(piece(g0, c + j) + d0) : 0.0f;
                x1[j] = two && c + j < np ? __ldcg(piece(g1, c + j) + d1) : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < CH; j++)
                if (c + j < np) {
                    o0 = fmaf(x0[j], e0[c + j], o0);
                    o1 = fmaf(x1[j], e1[c + j], o1);
                }
        }
        out[i0] = f2bf(o0);
        if (two) out[i1] = f2bf(o1);
    }
    if (tid == 0) *cnt = 0;
}

/* sf_attn_pieces_finish over the n_split pieces of a split launch (a block per (t, kv head,
 * split), or per (t, kv head, part, split) where a group's G heads are cut into parts: g0 ..
 * g0 + Gb - 1 are the block's), in the layout sf_attn_split_store writes. Each part has its own
 * counter ((t * Hkv + kh) * parts + part, parts <= SF_K_ATTN_CNT_PER_KVH) and the last of its
 * n_split blocks combines its heads alone: with Qwen2-7B's groups of 7 as parts of 4 and 3 heads
 * (attention_decode.cu) one block had combined all 7 (two rounds of a thread's two outputs), and
 * its attention ended 3.3 us later (22.4 against 19.1 us after QKV at 4096 keys, traced; 4.05
 * against 3.93-3.97 ms a token, docs/PERFORMANCE.md session 17). */
template <int HD, int CH>
static __device__ void sf_attn_split_finish(const sf_k_attn &a, int t, int kh, int G, int g0, int Gb, int nwarps,
                                            float *wsm, int *last, int part = 0, int parts = 1)
{
    const int ns = a.n_split;
    bf16 *out = (bf16 *)a.out + (int64_t)t * a.ld_out + (int64_t)(kh * G + g0) * HD;
    sf_attn_pieces_finish<HD, CH>(&a.counters[(t * a.Hkv + kh) * parts + part], out, Gb, ns, ns, nwarps, wsm, last,
                                  [&](int g, int p) {
                                      return (const float *)a.ws + (((int64_t)t * a.H + kh * G + g0 + g) * ns + p) * (HD + 2);
                                  });
}

#endif
