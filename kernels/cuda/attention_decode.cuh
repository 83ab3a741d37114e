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

/* After a block of (token t, kv head kh) has written its piece of the keys (o unnormalised, m in
 * base 2, l: hd + 2 floats per query head) to the workspace, the last of the np blocks to finish
 * (a.counters[t * Hkv + kh] counts them, and is reset for the next launch: graph replays reuse it)
 * combines the pieces into a.out. piece(g, p) is where piece p (0..np-1, np <= SF_AD_MAX_SPLIT)
 * of head g of the group is. Called by every thread of the block (nwarps warps); wsm:
 * [G][SF_AD_MAX_SPLIT] floats and `last` one int of shared memory. */
template <int HD, class Piece>
static __device__ void sf_attn_pieces_finish(const sf_k_attn &a, int t, int kh, int G, int np, int nwarps, float *wsm,
                                             int *last, const Piece &piece)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    __threadfence();
    __syncthreads();
    if (tid == 0) *last = atomicAdd(&a.counters[t * a.Hkv + kh], 1u) == (unsigned)np - 1;
    __syncthreads();
    if (!*last) return;
    __threadfence();
    for (int g = warp; g < G; g += nwarps) {
        const float *p0 = lane < np ? piece(g, lane) : NULL, *p1 = lane + 32 < np ? piece(g, lane + 32) : NULL;
        const float m0 = p0 ? __ldcg(p0 + HD) : -INFINITY;
        const float m1 = p1 ? __ldcg(p1 + HD) : -INFINITY;
        const float M = warp_max(fmaxf(m0, m1));
        float e0 = 0.0f, e1 = 0.0f;
        if (M != -INFINITY) {
            if (m0 != -INFINITY) e0 = exp2f(m0 - M);
            if (m1 != -INFINITY) e1 = exp2f(m1 - M);
        }
        float L = (p0 ? e0 * __ldcg(p0 + HD + 1) : 0.0f) + (p1 ? e1 * __ldcg(p1 + HD + 1) : 0.0f);
        L = warp_sum(L);
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        wsm[g * SF_AD_MAX_SPLIT + lane] = e0 * inv;
        wsm[g * SF_AD_MAX_SPLIT + lane + 32] = e1 * inv;
    }
    __syncthreads();
    for (int idx = tid; idx < G * HD; idx += nwarps * 32) {
        const int g = idx / HD, d = idx - g * HD;
        const float *e = wsm + g * SF_AD_MAX_SPLIT;
        float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
        int i = 0;
        for (; i + 3 < np; i += 4) {
            o0 = fmaf(__ldcg(piece(g, i) + d), e[i], o0);
            o1 = fmaf(__ldcg(piece(g, i + 1) + d), e[i + 1], o1);
            o2 = fmaf(__ldcg(piece(g, i + 2) + d), e[i + 2], o2);
            o3 = fmaf(__ldcg(piece(g, i + 3) + d), e[i + 3], o3);
        }
        for (; i < np; i++) o0 = fmaf(__ldcg(piece(g, i) + d), e[i], o0);
        ((bf16 *)a.out)[(int64_t)t * a.ld_out + (int64_t)(kh * G + g) * HD + d] = f2bf((o0 + o1) + (o2 + o3));
    }
    if (tid == 0) a.counters[t * a.Hkv + kh] = 0;
}

/* sf_attn_pieces_finish over the n_split pieces of a split launch (a block per (t, kv head,
 * split)), in the layout sf_attn_split_store writes. */
template <int HD>
static __device__ void sf_attn_split_finish(const sf_k_attn &a, int t, int kh, int G, int nwarps, float *wsm,
                                            int *last)
{
    const int ns = a.n_split;
    sf_attn_pieces_finish<HD>(a, t, kh, G, ns, nwarps, wsm, last, [&](int g, int p) {
        return (const float *)a.ws + (((int64_t)t * a.H + kh * G + g) * ns + p) * (HD + 2);
    });
}

#endif
