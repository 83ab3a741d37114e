/* attention.cu — causal attention over the paged KV cache, for prefill and decode alike.
 *
 * One block per (token, kv head, key split). The block handles the G = H/Hkv query heads that
 * share the kv head (GQA-grouped: each K/V tile is read once for the group), walks the keys
 * 0..pos[t] of the token's sequence in tiles of TILE through the block table, and keeps an
 * online softmax in fp32. With n_split > 1 (decode: few tokens, long contexts) each block
 * covers one range of keys and writes an unnormalised partial (o, m, l) to the workspace; a
 * second kernel combines the partials.
 *
 * Shared memory: q (fp32, pre-scaled) [G][hd], K tile [TILE][hd + 2] bf16 (the +2 pad keeps
 * rows in distinct banks), V tile [TILE][hd] bf16, probabilities [G][TILE] fp32. */
#include "common.cuh"

#define TILE 64
#define NT 128
#define MAX_ACC ((SF_K_ATTN_MAX_GROUP * SF_K_ATTN_MAX_HD + NT - 1) / NT)

static size_t attn_smem(int G, int hd)
{
    return (size_t)G * hd * 4 + (size_t)TILE * (hd + 2) * 2 + (size_t)TILE * hd * 2 + (size_t)G * TILE * 4 +
           3 * (size_t)G * 4;
}

/* Combines the n_split partials of heads kh*G .. kh*G+G-1 of token t into out:
 * out = sum_i o_i e^(m_i - M) / sum_i l_i e^(m_i - M). Weights first (one pass over the m, l
 * pairs, in parallel), then each output element sums its column with independent loads.
 * `wsm` holds G * n_split floats of shared memory. Partials written by other blocks are read
 * past L1 (__ldcg). */
static __device__ void combine_group(const sf_k_attn &a, int t, int kh, int G, int tid, int nt, float *wsm)
{
    const int hd = a.hd, ns = a.n_split, stride = hd + 2;
    __syncthreads(); /* wsm may alias the caller's shared memory */
    for (int g = tid >> 5; g < G; g += nt >> 5) {
        const float *w = a.ws + ((int64_t)t * a.H + kh * G + g) * ns * stride;
        int lane = tid & 31;
        float M = -INFINITY;
        for (int i = lane; i < ns; i += 32) M = fmaxf(M, __ldcg(w + i * stride + hd));
        M = warp_max(M);
        float L = 0.0f;
        for (int i = lane; i < ns; i += 32) {
            float m = __ldcg(w + i * stride + hd);
            float e = m == -INFINITY ? 0.0f : expf(m - M);
            wsm[g * ns + i] = e;
            L += e * __ldcg(w + i * stride + hd + 1);
        }
        L = warp_sum(L);
        __syncwarp();
        for (int i = lane; i < ns; i += 32) wsm[g * ns + i] = L > 0.0f ? wsm[g * ns + i] / L : 0.0f;
    }
    __syncthreads();
    for (int idx = tid; idx < G * hd; idx += nt) {
        int g = idx / hd, d = idx - g * hd, h = kh * G + g;
        const float *w = a.ws + ((int64_t)t * a.H + h) * ns * stride + d;
        const float *e = wsm + g * ns;
        float o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
        int i = 0;
        for (; i + 3 < ns; i += 4) {
            o0 = fmaf(__ldcg(w + i * stride), e[i], o0);
            o1 = fmaf(__ldcg(w + (i + 1) * stride), e[i + 1], o1);
            o2 = fmaf(__ldcg(w + (i + 2) * stride), e[i + 2], o2);
            o3 = fmaf(__ldcg(w + (i + 3) * stride), e[i + 3], o3);
        }
        for (; i < ns; i++) o0 = fmaf(__ldcg(w + i * stride), e[i], o0);
        ((bf16 *)a.out)[(int64_t)t * a.ld_out + (int64_t)h * hd + d] = f2bf((o0 + o1) + (o2 + o3));
    }
}

__global__ void __launch_bounds__(NT) k_attn(sf_k_attn a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    const int G = a.H / a.Hkv, hd = a.hd, kstride = hd + 2;
    float *q_s = (float *)smem;
    bf16 *k_s = (bf16 *)(q_s + G * hd);
    bf16 *v_s = k_s + TILE * kstride;
    float *p_s = (float *)(v_s + TILE * hd);
    float *m_s = p_s + G * TILE, *l_s = m_s + G, *al_s = l_s + G;

    const int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int ctx = a.pos[t] + 1, seq = a.tok_seq[t];
    const int per = ((ctx + a.n_split - 1) / a.n_split + TILE - 1) / TILE * TILE;
    const int k0 = split * per, k1 = min(ctx, k0 + per);
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int Hkv = a.Hkv;
    const bf16 *kc = (const bf16 *)a.kv.k, *vc = (const bf16 *)a.kv.v;

    const bf16 *q = (const bf16 *)a.q + (int64_t)t * a.ld_q + (int64_t)kh * G * hd;
    for (int i = tid; i < G * hd; i += NT) q_s[i] = bf2f(q[i]) * a.scale;
    if (tid < G) { m_s[tid] = -INFINITY; l_s[tid] = 0.0f; }

    float acc[MAX_ACC];
#pragma unroll
    for (int r = 0; r < MAX_ACC; r++) acc[r] = 0.0f;

    const bool vec = (hd % 8) == 0;
    __shared__ int64_t koff[TILE];
    for (int kb = k0; kb < k1; kb += TILE) {
        const int n = min(TILE, k1 - kb);
        __syncthreads(); /* previous tile fully consumed */
        if (vec) {
            sf_load_kv_tile(a.kv, bt, kh, hd, kb, n, k1, k_s, kstride, v_s, hd, koff);
        } else {
            for (int i = tid; i < n * hd; i += NT) {
                int j = i / hd, d = i - j * hd;
                int64_t o = sf_kv_row(a.kv, bt, kh, kb + j);
                if (o & 1) { /* INT8 block */
                    int64_t row = o >> 1;
                    k_s[j * kstride + d] = f2bf((float)((const int8_t *)kc)[row * hd + d] * a.kv.k_scale[row]);
                    v_s[j * hd + d] = f2bf((float)((const int8_t *)vc)[row * hd + d] * a.kv.v_scale[row]);
                } else {
                    k_s[j * kstride + d] = kc[(o >> 1) + d];
                    v_s[j * hd + d] = vc[(o >> 1) + d];
                }
            }
        }
        __syncthreads();
        /* scores */
        for (int i = tid; i < G * TILE; i += NT) {
            int g = i / TILE, j = i - g * TILE;
            float s = -INFINITY;
            if (j < n) {
                const float *qg = q_s + g * hd;
                const bf162 *kr = (const bf162 *)(k_s + j * kstride);
                float acc0 = 0.0f, acc1 = 0.0f;
                for (int d = 0; d < hd / 2; d++) {
                    float2 kf = __bfloat1622float2(kr[d]);
                    acc0 = fmaf(qg[2 * d], kf.x, acc0);
                    acc1 = fmaf(qg[2 * d + 1], kf.y, acc1);
                }
                s = acc0 + acc1;
            }
            p_s[i] = s;
        }
        __syncthreads();
        /* online softmax, one warp per head */
        for (int g = tid >> 5; g < G; g += NT / 32) {
            int lane = tid & 31;
            float s0 = p_s[g * TILE + lane], s1 = p_s[g * TILE + lane + 32];
            float mt = warp_max(fmaxf(s0, s1));
            float m_old = m_s[g], m_new = fmaxf(m_old, mt);
            float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                p0 = expf(s0 - m_new);
                p1 = expf(s1 - m_new);
                alpha = expf(m_old - m_new);
            }
            float sum = warp_sum(p0 + p1);
            p_s[g * TILE + lane] = p0;
            p_s[g * TILE + lane + 32] = p1;
            __syncwarp(); /* every lane has read m_s[g] and l_s[g] before lane 0 updates them */
            if (lane == 0) { l_s[g] = l_s[g] * alpha + sum; m_s[g] = m_new; al_s[g] = alpha; }
        }
        __syncthreads();
        /* o = o * alpha + P V */
#pragma unroll
        for (int r = 0; r < MAX_ACC; r++) {
            int idx = tid + r * NT;
            if (idx < G * hd) {
                int g = idx / hd, d = idx - g * hd;
                const float *pg = p_s + g * TILE;
                float o = acc[r] * al_s[g];
                for (int j = 0; j < n; j++) o = fmaf(pg[j], bf2f(v_s[j * hd + d]), o);
                acc[r] = o;
            }
        }
    }
    __syncthreads();
    if (a.n_split == 1) {
        bf16 *out = (bf16 *)a.out + (int64_t)t * a.ld_out + (int64_t)kh * G * hd;
#pragma unroll
        for (int r = 0; r < MAX_ACC; r++) {
            int idx = tid + r * NT;
            if (idx < G * hd) {
                float l = l_s[idx / hd];
                out[idx] = f2bf(l > 0.0f ? acc[r] / l : 0.0f);
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < MAX_ACC; r++) {
            int idx = tid + r * NT;
            if (idx < G * hd) {
                int g = idx / hd, d = idx - g * hd, h = kh * G + g;
                a.ws[(((int64_t)t * a.H + h) * a.n_split + split) * (hd + 2) + d] = acc[r];
            }
        }
        if (tid < G) {
            int h = kh * G + tid;
            float *w = a.ws + (((int64_t)t * a.H + h) * a.n_split + split) * (hd + 2) + hd;
            w[0] = m_s[tid];
            w[1] = l_s[tid];
        }
        if (!a.counters) return;
        /* the last block of this (token, kv head) to finish combines the partials */
        __shared__ int last;
        __syncthreads(); /* then one acq_rel count publishes the block's partials (common.cuh) */
        if (tid == 0) last = sf_atom_add_acq_rel_gpu(&a.counters[t * Hkv + kh], 1u) == (unsigned)a.n_split - 1;
        __syncthreads();
        if (!last) return;
        combine_group(a, t, kh, G, tid, NT, (float *)smem);
        if (tid == 0) a.counters[t * Hkv + kh] = 0; /* ready for the next launch (graph replays too) */
    }
}

/* One block per (token, kv head), when no counters are given. */
__global__ void k_attn_combine(sf_k_attn a)
{
    extern __shared__ float wsm[];
    combine_group(a, blockIdx.x / a.Hkv, blockIdx.x % a.Hkv, a.H / a.Hkv, threadIdx.x, blockDim.x, wsm);
}

extern "C" int sf_k_attention(const sf_k_attn *a, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (a->n_tiles > 0 && sf_k_attention_prefill_ok(a->hd)) return sf_k_attention_prefill(a, s);
    if (a->Hkv <= 0 || a->H % a->Hkv || a->H / a->Hkv > SF_K_ATTN_MAX_GROUP || a->hd > SF_K_ATTN_MAX_HD ||
        a->hd % 2 || a->n_split < 1 || (a->n_split > 1 && !a->ws))
        return (int)cudaErrorInvalidValue;
    static sf_k_smem smem_set;
    size_t smem = attn_smem(a->H / a->Hkv, a->hd);
    int e = sf_k_smem_attr(&smem_set, k_attn, smem);
    if (e) return e;
    dim3 grid(a->T, a->Hkv, a->n_split);
    k_attn<<<grid, NT, smem, s>>>(*a);
    int rc = sf_launch_status();
    if (rc || a->n_split == 1 || a->counters) return rc;
    k_attn_combine<<<a->T * a->Hkv, 128, (size_t)(a->H / a->Hkv) * a->n_split * 4, s>>>(*a);
    return sf_launch_status();
}
