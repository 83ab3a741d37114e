/* attention_decode.cu — attention of single query tokens over the paged bf16 KV cache (INT8
 * blocks, kernels.h, are read as 8 bytes plus a scale and widened to the same registers) (decode,
 * and short chunks that do not take the tensor-core prefill kernel), for head sizes 64 and 128
 * and GQA groups up to 8.
 *
 * At batch 1 a decode step's attention reads little (2 MiB for Llama-3-8B at 512 keys), so
 * what matters is latency: enough blocks to cover the SMs, every load 16 bytes wide and several
 * in flight, no shared-memory round trips in the key loop. One block per (token, kv head, key
 * split); its 8 warps take interleaved runs of keys. Within a warp, HD/8 lanes share one key
 * (8 dims each, one 16-byte load of K and of V), so a warp covers 32*8/HD keys per load and
 * AD_U such loads are in flight. Every lane group keeps its own online softmax (running max,
 * sum and 8 output dims per head of the group), in base 2 with q pre-scaled by log2(e)/sqrt(hd);
 * groups merge by shuffles, warps through shared memory. Splits: bf16 steps of 2..16 splits run
 * each (token, kv head) as one thread-block cluster (CL): every block writes the pieces of its
 * result into the shared memory of the peer that combines them, and after one cluster barrier
 * each combines its share of the outputs from its own memory (session 12; reading the peers'
 * memory instead took a second barrier, so that none left while read: 0.4% slower at 512 keys);
 * otherwise through the workspace: the last block of each (token, kv head) to finish combines
 * the splits (no second launch). At batch 1 the cluster takes the workspace's store, fence,
 * count and the last block's loads (each an L2 round trip while the O projection's weight
 * stream fills the memory system) off the critical path: Llama-3-8B at 512 keys 4.07-4.10
 * against 4.16-4.18 ms a token in one device call (docs/PERFORMANCE.md, session 11).
 *
 * Groups of 5..8 heads (Qwen2-7B's 7) run as two blocks of the 4-head instance per (token, kv
 * head, split), each with its part of the group's heads (PARTS; both read all of the split's
 * keys), rather than one block of the 8-head instance: that one holds ~220 registers
 * a lane, runs one block an SM and half the keys per round, and its blocks took 8.45 us from
 * the wait to their piece against 4.10 for Llama-3-8B's 4-head blocks; split, the attention's
 * last piece is stored 8.6-9.2 us after the QKV kernel ends rather than 10.4. Qwen2-7B, with the
 * QKV bias instance that came with it (gemv_stream.cu): 3.650-3.705 against 3.699-3.730 ms a
 * token at 512 keys, 4.047-4.052 against 4.107-4.124 at 4096 (docs/PERFORMANCE.md, session 15).
 * Through the workspace each part counts its own blocks and the last of them combines its own
 * heads (the last block of both had combined all 7: 4.05-4.09 against 3.93-3.97 ms at 4096 keys,
 * attention_decode.cuh's sf_attn_split_finish, session 17).
 *
 * Launched as a programmatic dependent (common.cuh): the block reads the step's metadata and
 * looks up its first keys' cache offsets before it waits for the QKV kernel, and lets the next
 * kernel (the O projection) start streaming its weights at once. In the key loop the offsets of
 * the next run of keys are looked up while the current K and V loads are in flight.
 *
 * Workspace layout (as attention.cu's): ws[((t * H + h) * n_split + split) * (hd + 2) + d],
 * then the split's max (base 2) and sum at d = hd, hd + 1. */
#include <string.h>

#include "attention_decode.cuh"
#include "b1trace.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define AD_WARPS 8

#define AD_MAX_SPLIT SF_AD_MAX_SPLIT
/* Loads of K (and of V) in flight per lane; the cluster instance's dynamic shared memory holds
 * one such run of every lane (the first keys, copied before the wait). */
template <int MAXG> constexpr int ad_loads() { return MAXG <= 4 ? 4 : 2; }
template <int MAXG> constexpr size_t ad_pre_bytes() { return (size_t)AD_WARPS * ad_loads<MAXG>() * 2 * 32 * sizeof(uint4); }
#define SF_AD_MMA_MIN_TOKENS 4 /* steps of this many tokens or more run the batch kernel */

extern "C" int sf_k_attention_decode_ok(const sf_k_attn *a)
{
    int G = a->Hkv > 0 ? a->H / a->Hkv : 0;
    return a->n_tiles == 0 && !a->rows && (a->hd == 64 || a->hd == 128) && a->Hkv > 0 && a->H % a->Hkv == 0 && G >= 1 &&
           G <= SF_K_ATTN_DECODE_MAX_GROUP && a->n_split >= 1 && a->n_split <= AD_MAX_SPLIT &&
           (a->n_split == 1 || (a->ws && a->counters)) && a->ld_q % 8 == 0 && (uintptr_t)a->q % 16 == 0 &&
           (uintptr_t)a->kv.k % 16 == 0 && (uintptr_t)a->kv.v % 16 == 0 && a->kv.head_dim == a->hd;
}

static __device__ __forceinline__ uint4 ld_kv(const uint16_t *p)
{
    return __ldg((const uint4 *)p);
}

/* Byte i (0..3) of w, a signed int8, as a float: 0x4B0000xx is 2^23 + xx exactly, so with the
 * sign bit flipped (xx = b + 128) one byte permute and one add give b (no int-to-float convert). */
static __device__ __forceinline__ float i8_to_f(uint32_t w_flipped, int i)
{
    return __int_as_float((int)__byte_perm(w_flipped, 0x4B000000u, 0x7540u + i)) - 8388736.0f;
}

/* 8 dims of a key or value row: bf16 (4 words) or int8 (the first 2 words; the scale is applied
 * by the caller, to the score or to the softmax weight) as floats. */
static __device__ __forceinline__ void row8_to_f(const uint4 &r, bool i8, float (&f)[8])
{
    if (i8) {
        const uint32_t w0 = r.x ^ 0x80808080u, w1 = r.y ^ 0x80808080u;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[i] = i8_to_f(w0, i);
            f[4 + i] = i8_to_f(w1, i);
        }
    } else {
        const bf162 *h2 = (const bf162 *)&r;
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float2 x = __bfloat1622float2(h2[h]);
            f[2 * h] = x.x;
            f[2 * h + 1] = x.y;
        }
    }
}

/* Cache rows (sf_kv_row: bf16 offset or INT8 row, tagged) of keys kb + u * kpw + sub, u < U;
 * -1 past k1. Without I8 every block is bf16 (the step has no INT8 block). */
template <int U, bool I8>
static __device__ __forceinline__ void kv_offsets(int64_t (&off)[U], int kb, int kpw, int sub, int k1, const int32_t *bt,
                                                  const sf_k_kv &kv, int kh)
{
#pragma unroll
    for (int u = 0; u < U; u++) {
        int p = kb + u * kpw + sub;
        if (I8) off[u] = p < k1 ? sf_kv_row(kv, bt, kh, p) : -1;
        else off[u] = p < k1 ? ((((int64_t)bt[p / kv.block_size] * kv.n_kv_heads + kh) * kv.block_size +
                                 p % kv.block_size) * kv.head_dim) << 1 : -1;
    }
}

/* I8: the step has INT8 blocks (kv.i8_base set). The INT8 handling costs registers (about 155
 * against 128), which would halve the blocks per SM of every bf16 step, so it is a separate
 * instance that only steps with INT8 blocks launch. The bf16 instances for groups up to 4 are
 * held to 128 registers (two blocks per SM, and room beside one for the O projection's two
 * 64-register blocks). CL: the splits are a cluster (above), with the first keys in dynamic
 * shared memory. Tried and removed (docs/PERFORMANCE.md): the first run of K/V loads of
 * one-token steps issued before the programmatic wait (~195 registers, one block per SM): 4.143
 * against 4.126 ms at 512 keys, 4.574 against 4.402 at 4096. */
template <int HD, int MAXG, bool I8, bool CL, int PARTS>
__global__ void __launch_bounds__(AD_WARPS * 32, MAXG <= 4 && !I8 ? 2 : 1) k_attn_decode(sf_k_attn a)
{
    constexpr int LPK = HD / 8;          /* lanes per key */
    constexpr int KPW = 32 / LPK;        /* keys per warp per load */
    constexpr int U = ad_loads<MAXG>();
    constexpr int STEP = KPW * U;        /* keys per warp per iteration */
    __shared__ float o_s[AD_WARPS][MAXG][HD];
    __shared__ float ml_s[AD_WARPS][MAXG][2];
    static_assert(PARTS <= SF_K_ATTN_CNT_PER_KVH, "a counter per part (kernels.h)");
    __shared__ float wsm[MAXG * PARTS][AD_MAX_SPLIT]; /* the whole group's */
    __shared__ int last;
    /* CL: what the peers send this block (attention_decode.cuh) */
    __shared__ __align__(16) float recv[CL ? sf_cl_recv_max(MAXG, HD) : 1];
    extern __shared__ uint4 kv_pre[]; /* CL: [AD_WARPS][U][K, V][32 lanes] */

    __shared__ sf_tr tr;
    tr_begin(tr);
    sf_pdl_trigger();
    if (CL) cluster_arrive_relaxed(); /* waited for before the first write to a peer */
    const int t = blockIdx.x, kh = blockIdx.y / PARTS, split = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5, sub = lane / LPK, dl = lane % LPK;
    const int G = a.H / a.Hkv, ns = a.n_split;
    const int ctx = a.pos[t] + 1, seq = a.tok_seq[t];
    const int per = (ctx + ns - 1) / ns;
    const int k0 = split * per, k1 = min(ctx, k0 + per);
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    int64_t off[U];
    kv_offsets<U, I8>(off, k0 + warp * STEP, KPW, sub, k1, bt, a.kv, kh);
    /* CL, one-token steps: the first run's keys of earlier steps need nothing of this step, so
     * they are copied into shared memory before the wait (no registers held across it, unlike
     * the register version tried in session 7); the newest key (position ctx - 1, which the QKV
     * kernel appends) is read after it */
    const bool pre = CL && a.T == 1;
    if (pre) {
#pragma unroll
        for (int u = 0; u < U; u++)
            if (off[u] >= 0 && k0 + warp * STEP + u * KPW + sub != ctx - 1) {
                sf_cp_async16(&kv_pre[((warp * U + u) * 2) * 32 + lane], a.kv.k + (off[u] >> 1) + dl * 8, 16);
                sf_cp_async16(&kv_pre[((warp * U + u) * 2 + 1) * 32 + lane], a.kv.v + (off[u] >> 1) + dl * 8, 16);
            }
        sf_cp_async_commit();
    }
    sf_pdl_wait(); /* q and the newest keys come from the kernel before */
    tr_waited(tr);

    /* q of the group's heads, dims dl*8 .. dl*8+7, scaled so that scores are in base 2 */
    const float qs = a.scale * 1.4426950408889634f;
    float q[MAXG][8];
    const int g0 = blockIdx.y % PARTS * MAXG, Gb = PARTS == 1 ? G : min(MAXG, G - g0);
    const bf16 *qp = (const bf16 *)a.q + (int64_t)t * a.ld_q + (int64_t)kh * G * HD + g0 * HD + dl * 8;
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        if (g < Gb) {
            bf16x8 v = *(const bf16x8 *)(qp + g * HD);
#pragma unroll
            for (int h = 0; h < 4; h++) {
                float2 f = __bfloat1622float2(v.h[h]);
                q[g][2 * h] = f.x * qs;
                q[g][2 * h + 1] = f.y * qs;
            }
        } else {
#pragma unroll
            for (int d = 0; d < 8; d++) q[g][d] = 0.0f;
        }
    }
    float m[MAXG], l[MAXG], o[MAXG][8];
#pragma unroll
    for (int g = 0; g < MAXG; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < 8; d++) o[g][d] = 0.0f;
    }

    for (int kb = k0 + warp * STEP; kb < k1; kb += AD_WARPS * STEP) {
        const bool from_pre = pre && kb == k0 + warp * STEP; /* this lane's own copies: no barrier */
        if (from_pre) asm volatile("cp.async.wait_all;\n" ::: "memory");
        uint4 kr[U], vr[U];
        bool valid[U], i8[U];
        float ks[U], vs[U]; /* INT8 rows' scales (1 for bf16) */
#pragma unroll
        for (int u = 0; u < U; u++) {
            valid[u] = off[u] >= 0;
            i8[u] = I8 && valid[u] && (off[u] & 1);
            ks[u] = vs[u] = 1.0f;
            if (i8[u]) {
                /* an INT8 block (kernels.h): 8 bytes of K and of V, and the rows' scales */
                const int64_t row = off[u] >> 1;
                const uint2 k8 = __ldg((const uint2 *)((const int8_t *)a.kv.k + row * HD + dl * 8));
                const uint2 v8 = __ldg((const uint2 *)((const int8_t *)a.kv.v + row * HD + dl * 8));
                kr[u] = make_uint4(k8.x, k8.y, 0u, 0u);
                vr[u] = make_uint4(v8.x, v8.y, 0u, 0u);
                ks[u] = __ldg(a.kv.k_scale + row);
                vs[u] = __ldg(a.kv.v_scale + row);
            } else if (CL && from_pre && valid[u] && kb + u * KPW + sub != ctx - 1) {
                kr[u] = kv_pre[((warp * U + u) * 2) * 32 + lane];
                vr[u] = kv_pre[((warp * U + u) * 2 + 1) * 32 + lane];
            } else if (valid[u]) {
                kr[u] = ld_kv(a.kv.k + (off[u] >> 1) + dl * 8);
                vr[u] = ld_kv(a.kv.v + (off[u] >> 1) + dl * 8);
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
                vr[u] = kr[u];
            }
        }
        kv_offsets<U, I8>(off, kb + AD_WARPS * STEP, KPW, sub, k1, bt, a.kv, kh); /* next run's */
        float s[U][MAXG];
#pragma unroll
        for (int u = 0; u < U; u++) {
            float kf[8];
            row8_to_f(kr[u], i8[u], kf);
#pragma unroll
            for (int g = 0; g < MAXG; g++) {
                float d0 = 0.0f;
#pragma unroll
                for (int d = 0; d < 8; d++) d0 = fmaf(q[g][d], kf[d], d0);
#pragma unroll
                for (int x = LPK / 2; x > 0; x >>= 1) d0 += __shfl_xor_sync(0xffffffffu, d0, x);
                s[u][g] = valid[u] ? d0 * ks[u] : -INFINITY;
            }
        }
        float vf[U][8]; /* INT8 steps: the value rows as floats, once for all heads of the group */
        if (I8) {
#pragma unroll
            for (int u = 0; u < U; u++) row8_to_f(vr[u], i8[u], vf[u]);
        }
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            float mx = s[0][g];
#pragma unroll
            for (int u = 1; u < U; u++) mx = fmaxf(mx, s[u][g]);
            const float mn = fmaxf(m[g], mx);
            if (mn == -INFINITY) continue; /* nothing valid for this lane group yet */
            const float alpha = exp2f(m[g] - mn);
            l[g] *= alpha;
#pragma unroll
            for (int d = 0; d < 8; d++) o[g][d] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                const float p = exp2f(s[u][g] - mn);
                l[g] += p;
                if (I8) {
                    const float pv = p * vs[u]; /* the V scale rides on the weight */
#pragma unroll
                    for (int d = 0; d < 8; d++) o[g][d] = fmaf(pv, vf[u][d], o[g][d]);
                } else {
                    const bf162 *vh = (const bf162 *)&vr[u];
#pragma unroll
                    for (int h = 0; h < 4; h++) {
                        float2 f = __bfloat1622float2(vh[h]);
                        o[g][2 * h] = fmaf(p, f.x, o[g][2 * h]);
                        o[g][2 * h + 1] = fmaf(p, f.y, o[g][2 * h + 1]);
                    }
                }
            }
            m[g] = mn;
        }
    }

    /* merge the lane groups of the warp (lanes dl, dl + LPK, ...) */
#pragma unroll
    for (int x = LPK; x < 32; x <<= 1) {
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
            const float mb = __shfl_xor_sync(0xffffffffu, m[g], x), lb = __shfl_xor_sync(0xffffffffu, l[g], x);
            const float mn = fmaxf(m[g], mb);
            const float ea = mn == -INFINITY ? 0.0f : exp2f(m[g] - mn), eb = mn == -INFINITY ? 0.0f : exp2f(mb - mn);
            l[g] = l[g] * ea + lb * eb;
#pragma unroll
            for (int d = 0; d < 8; d++) {
                const float ob = __shfl_xor_sync(0xffffffffu, o[g][d], x);
                o[g][d] = o[g][d] * ea + ob * eb;
            }
            m[g] = mn;
        }
    }
    if (lane < LPK) {
#pragma unroll
        for (int g = 0; g < MAXG; g++) {
#pragma unroll
            for (int d = 0; d < 8; d++) o_s[warp][g][dl * 8 + d] = o[g][d];
            if (lane == 0) { ml_s[warp][g][0] = m[g]; ml_s[warp][g][1] = l[g]; }
        }
    }
    __syncthreads();

    /* merge the warps; write the output (one split) or this split's partial (CL: into the peers'
     * shared memory, once every block of the cluster has started) */
    if (CL) cluster_wait();
    for (int idx = tid; idx < Gb * HD; idx += AD_WARPS * 32) {
        const int g = idx / HD, d = idx - g * HD, h = kh * G + g0 + g;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) M = fmaxf(M, ml_s[w][g][0]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int w = 0; w < AD_WARPS; w++) {
                const float e = exp2f(ml_s[w][g][0] - M);
                L = fmaf(ml_s[w][g][1], e, L);
                O = fmaf(o_s[w][g][d], e, O);
            }
        }
        if (CL) sf_cl_push<HD>(recv, Gb, ns, split, g, d, O, M, L);
        else sf_attn_split_store<HD>(a, t, h, split, d, O, M, L);
    }
    tr_ready(tr);
    if (CL) {
        /* everything this block combines is in its own shared memory after one barrier; nothing
         * reads a peer's memory after it, so every block may leave as soon as it is done */
        cluster_sync();
        sf_cl_combine<HD>(recv, Gb, ns, split, AD_WARPS * 32, (bf16 *)a.out + (int64_t)t * a.ld_out + (int64_t)(kh * G + g0) * HD);
    } else if (ns > 1) {
        /* the last block of this (token, kv head, part) to finish combines the splits, the 33
         * pieces of batch 1 at 4096 keys in one round of loads (16 at a time took three: 33
         * against 16, Qwen2-7B 3.883-3.893 against 3.890-3.937 ms, ahead in 5 of 5 pairs;
         * Llama-3-8B 3 of 5, within the noise; no spills; docs/PERFORMANCE.md session 17) */
        __shared__ uint64_t mk[3];
        sf_attn_split_finish<HD, 33>(a, t, kh, G, g0, Gb, AD_WARPS, &wsm[0][0], &last, blockIdx.y % PARTS, PARTS,
                                     tr_buf ? mk : nullptr);
        if (tr_buf && last && tid == 0) tr_combine(tr, mk, ns, ctx);
    }
    tr_end(tr, SF_TR_ATTN, ns, ctx);
}

SF_TR_SETTER(sf_k_attn_decode_trace)

/* SEMFLOW_CUDA_ATTN_HEAD_SPLIT=0: groups of 5..8 heads take the 8-head instance, one block per
 * (token, kv head, split), rather than two blocks of the 4-head instance (comparisons; read once);
 * sf_k_attention_decode_head_split overrides it (tests run both). */
static int head_split_mode = -1;
extern "C" void sf_k_attention_decode_head_split(int on) { head_split_mode = on; }
static bool head_split(void)
{
    static const int env = sf_env_bool("SEMFLOW_CUDA_ATTN_HEAD_SPLIT", 1);
    return head_split_mode < 0 ? env : head_split_mode;
}

/* SEMFLOW_CUDA_ATTN_CLUSTER=0 turns the cluster combines off (this kernel's and the one-token
 * tensor-core plan's; comparisons; read once);
 * sf_k_attention_decode_cluster overrides it (tests run both). */
static int cluster_mode = -1;
extern "C" void sf_k_attention_decode_cluster(int on) { cluster_mode = on; }
static bool cluster_on(void)
{
    static const int env = sf_env_bool("SEMFLOW_CUDA_ATTN_CLUSTER", 1);
    return cluster_mode < 0 ? env : cluster_mode;
}

/* bf16 steps of 2..16 splits combine them in a cluster, and their first keys are copied into
 * shared memory before the wait (measured on the H200, docs/PERFORMANCE.md session 11); INT8
 * steps and other splits combine through the workspace. */
template <int HD, int MAXG, int PARTS>
static int launch(const sf_k_attn *a, cudaStream_t s)
{
    static int fits[SF_K_MAX_DEVICES][SF_AD_CL_MAX + 1]; /* per device (common.cuh) */
    const dim3 grid(a->T, a->Hkv * PARTS, a->n_split), block(AD_WARPS * 32);
    const int dev = sf_k_dev();
    int own[SF_AD_CL_MAX + 1] = { 0 }, *fc = dev >= 0 ? fits[dev] : own;
    int rc;
    constexpr size_t pre = ad_pre_bytes<MAXG>();
    if (a->kv.i8_base) rc = sf_launch_pdl(k_attn_decode<HD, MAXG, true, false, PARTS>, grid, block, 0, s, *a);
    else if (cluster_on() && sf_cl_fits<k_attn_decode<HD, MAXG, false, true, PARTS>>(a->n_split, AD_WARPS * 32, pre, fc)) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = sf_cl_config(at, grid, AD_WARPS * 32, pre, s, sf_pdl_enabled());
        rc = (int)cudaLaunchKernelEx(&cfg, k_attn_decode<HD, MAXG, false, true, PARTS>, *a);
    } else {
        rc = sf_launch_pdl(k_attn_decode<HD, MAXG, false, false, PARTS>, grid, block, 0, s, *a);
    }
    return rc ? rc : sf_launch_status();
}

/* SEMFLOW_CUDA_DECODE_ATTN: "lanes" (this file's kernel), "mma" (attention_decode_mma.cu where it
 * applies), "stream" (attention_decode_stream.cu where it applies), else auto;
 * SEMFLOW_CUDA_DECODE_ATTN_CFG: the tensor-core kernels' warps x 10 + ring depth (kernels.h; 42
 * by default). Read once (the launch thread is the backend's only thread). */
enum { DEC_AUTO, DEC_LANES, DEC_MMA, DEC_STREAM, DEC_MMA_B1, DEC_MMA_B1_8W };
static_assert(DEC_MMA_B1 == SF_K_ATTN_DEC_B1 && DEC_MMA_B1_8W == SF_K_ATTN_DEC_B1_8W,
              "kernels.h names these kernels for the QKV projection");
/* One-token bf16 steps from this many keys, in groups of 4 query heads (Llama-3's, Mistral's),
 * or of 5 to 8 from SF_AD_B1_MMA_MIN_CTX_WIDE (Qwen2's 7), take the tensor-core kernel in its
 * B1_CFG configuration (4 warps, a 4-stage ring, one block an SM; its combine's outputs in one
 * round of loads) rather than the lanes kernel; the planned kernel DEC_MMA_B1 says so to the
 * launch, and the split is one wave of blocks (plan()). Measured on the H200 in the step
 * (docs/PERFORMANCE.md): session 20, with a 3-stage ring and the planner's split then,
 * Llama-3-8B 1024 / 2048 / 4096 / 7900 keys 0.8 / 0.7 / 1.4 / 7.9% faster a token than the lanes
 * kernel; session 21, the 4-stage ring (144) against the 3-stage one (143), 0.4 / 0.6 / 0.5 /
 * 0.6% faster. Session 22, the ring's first tiles loaded before the programmatic wait and one
 * wave of blocks, against session 21's kernel and split: Llama-3-8B 1024 / 2048 / 4096 / 7900
 * keys 1.8 / 2.9 / 2.0 / 1.4% faster, 512 keys 0.2-0.4% faster than the lanes kernel's cluster
 * instance; Qwen2-7B (group 7) 2048 / 4096 keys 0.6 / 1.5% faster than the lanes kernel's two
 * 4-head blocks, but 0.4% slower at 1024 and even at 512. Smaller groups keep the lanes kernel
 * until measured.
 * Groups of 4 from SF_AD_B1_8W_MIN_CTX keys, and the wider groups at every length they take the
 * tensor-core kernel, are planned DEC_MMA_B1_8W (head size 128), configuration B1_8W_CFG: 8-warp
 * blocks, tiles of 128 keys, a 3-stage ring (192 KiB, one block an SM), in the same one wave of
 * splits through the workspace (at most SF_AD_B1_8W_MAX_SPLIT); each block has two 128-key tiles
 * (256 keys) in flight from before the programmatic wait where 144 had three 64-key ones (192),
 * and a group of 7 has twice the warps for its wider products. Measured in the step on H200s
 * (session 27, hal 4248-4251 GB/s, docs/PERFORMANCE.md), against 144: Llama-3-8B 4096 / 6000 /
 * 8000 keys 0.5-0.6 / 0.9 / 0.8% faster a token, but at 512 / 1024 / 2048 / 3072 keys (4 to 16
 * splits of one tile, 24 of 1-2) -0.3 / +0.2 / -0.1 / -0.2%, so those keep 144; Qwen2-7B 2048 /
 * 3072 / 4096 / 6000 / 8000 keys 1.3 / 1.9 / 1.2 / 2.1 / 1.5% faster. In 8 splits whose clusters
 * all fit it was 1.6% slower. */
#define SF_AD_B1_8W_MIN_CTX 4096
#define SF_AD_B1_MMA_MIN_CTX 512
#define SF_AD_B1_MMA_MIN_CTX_WIDE 2048
#define SF_AD_B1_MMA_GROUP 4
#define SF_AD_B1_MMA_MAX_GROUP 8
#define SF_AD_B1_MAX_SPLIT 32
/* At most this many splits of the 8-warp configuration: Qwen2-7B's 4 kv heads (33 slots a head
 * on 132 SMs) in 24 splits rather than 32 were 0.7 / 0.1 / 0.5 / 0.1 / 0.1% faster a token at
 * 2048 / 3072 / 4096 / 6000 / 8000 keys (session 27; 20 splits slower from 6000 keys) */
#define SF_AD_B1_8W_MAX_SPLIT 24
#define B1_CFG SF_K_DEC_MMA_B1_CFG
#define B1_8W_CFG SF_K_DEC_MMA_B1_8W_CFG
/* SEMFLOW_CUDA_DECODE_ATTN (auto, lanes, mma, stream: the DEC_* order) and _CFG (the batch
 * kernels' warps x ring depth: 42, 43, 23, 24; the one-token instances 143, 144, 145, 183), read once
 * per process (thread-safe statics); a malformed value warns and keeps auto / 42. */
static const char *const dec_cfgs[] = { "42", "43", "23", "24", "143", "144", "145", "183" };
/* SEMFLOW_CUDA_DECODE_B1_CFG: the one-token plans' configuration, forced (comparisons): auto (by
 * the context, plan()), 144 or 183; read once per process, a malformed value warns and keeps auto */
static int b1_cfg_forced(void)
{
    static const char *const c[] = { "auto", "144", "183" };
    static const int v = atoi(c[sf_env_choice("SEMFLOW_CUDA_DECODE_B1_CFG", 0, c, (int)SF_ARRAY_LEN(c))]);
    return v;
}
/* A configuration's index in dec_cfgs (0, the default, for any other). */
static int dec_cfg_index(int cfg)
{
    for (int i = 0; i < (int)SF_ARRAY_LEN(dec_cfgs); i++)
        if (atoi(dec_cfgs[i]) == cfg) return i;
    return 0;
}
static int dec_mode(int *cfg)
{
    static const char *const modes[] = { "auto", "lanes", "mma", "stream" };
    static const int mode = sf_env_choice("SEMFLOW_CUDA_DECODE_ATTN", DEC_AUTO, modes, 4);
    static const int c =
        atoi(dec_cfgs[sf_env_choice("SEMFLOW_CUDA_DECODE_ATTN_CFG", 0, dec_cfgs, (int)SF_ARRAY_LEN(dec_cfgs))]);
    *cfg = c;
    return mode;
}

/* The kernel that takes this step: forced by the mode, else auto. 4 or more tokens take a
 * tensor-core kernel (test_decode_attn --perf on the H200, docs/PERFORMANCE.md: 87% of HBM
 * against 49% at 256 x 192 keys, 89% against 63% at 128 x 1500, 29.4 against 48.5 us at 4 x
 * 4096); single sequences keep the lanes kernel (15.4 against 18.9 us at 4096 keys timed alone;
 * at 512 keys the mma kernel was faster, 7.6 against 8.6) unless batch_begin planned the
 * one-token tensor-core kernel (DEC_MMA_B1: faster inside the step, where the timing alone had
 * said otherwise). The stream kernel only where the split gave it its workspace (n_split >= 2),
 * and always for a subset of the step's tokens (a->rows). */
static int pick(const sf_k_attn *a, int *cfg)
{
    const int mode = dec_mode(cfg);
    if (a->rows) return DEC_STREAM; /* a subset of the tokens: only that kernel takes it */
    if (a->kernel) { /* batch_begin's plan */
        if (a->kernel == DEC_STREAM && sf_k_attention_decode_stream_ok(a)) return DEC_STREAM;
        if (a->kernel == DEC_MMA_B1) {
            if (!sf_k_attention_decode_mma_ok(a)) return DEC_LANES;
            *cfg = B1_CFG;
            return DEC_MMA;
        }
        if (a->kernel == DEC_MMA_B1_8W) {
            if (!sf_k_attention_decode_mma_ok(a)) return DEC_LANES;
            *cfg = B1_8W_CFG;
            return DEC_MMA;
        }
        return a->kernel != DEC_LANES && sf_k_attention_decode_mma_ok(a) ? DEC_MMA : DEC_LANES;
    }
    if (mode == DEC_LANES || !sf_k_attention_decode_mma_ok(a)) return DEC_LANES;
    if (mode == DEC_STREAM && a->T >= SF_AD_MMA_MIN_TOKENS && sf_k_attention_decode_stream_ok(a)) return DEC_STREAM;
    if (mode == DEC_MMA || mode == DEC_STREAM) return DEC_MMA;
    return a->T >= SF_AD_MMA_MIN_TOKENS ? DEC_MMA : DEC_LANES;
}

/* Tiles of keys per block of the mma configuration (16 keys per warp). */
static int mma_tile_keys(int cfg) { return 16 * (cfg % 100 / 10); }

/* The kernel for a decode step (kernel: forced, else the mode, else auto) and its key split.
 * Auto: batches (4+ tokens) take the stream kernel from SF_AD_STREAM_MIN_CTX keys and the
 * per-item mma kernel below (test_decode_attn --perf on the H200, docs/PERFORMANCE.md: stream
 * 191.7 against 212.7 us at 128 x 1500, 253.6 against 259.5 at 64 x 4096, 27.9 against 29.5 at
 * 4 x 4096; but 60.7 against 56.4 at 256 x 192 and 109.7 against 106.1 at 512 x 192, where items
 * of 3 tiles make its per-item and per-piece work weigh), single sequences the lanes kernel but
 * for the one-token rule above (DEC_MMA_B1). */
#define SF_AD_STREAM_MIN_CTX 1024
static int plan(int T, int Hkv, int group, int hd, int max_ctx, int block_size, int int8, int sms, int kernel,
                int *chosen)
{
    int cfg, mode = dec_mode(&cfg);
    const int work = T * (Hkv > 0 ? Hkv : 1);
    if (kernel) mode = kernel;
    *chosen = DEC_LANES;
    if (T <= 0 || sms <= 0) return 1;
    const bool shape = (hd == 64 || hd == 128) && block_size >= 16 && (block_size & (block_size - 1)) == 0;
    if (shape && mode == DEC_AUTO && T >= SF_AD_MMA_MIN_TOKENS) mode = max_ctx >= SF_AD_STREAM_MIN_CTX ? DEC_STREAM : DEC_MMA;
    if (shape && mode == DEC_AUTO && T == 1 && !int8 && group >= SF_AD_B1_MMA_GROUP && group <= SF_AD_B1_MMA_MAX_GROUP &&
        max_ctx >= (group == SF_AD_B1_MMA_GROUP ? SF_AD_B1_MMA_MIN_CTX : SF_AD_B1_MMA_MIN_CTX_WIDE))
        mode = DEC_MMA_B1;
    if (mode == DEC_MMA_B1 && !kernel) { /* planned here: its configuration by the context */
        const int f = b1_cfg_forced();
        if (hd == 128 && (f ? f == B1_8W_CFG : group > SF_AD_B1_MMA_GROUP || max_ctx >= SF_AD_B1_8W_MIN_CTX))
            mode = DEC_MMA_B1_8W;
    }
    const bool b1 = mode == DEC_MMA_B1 || mode == DEC_MMA_B1_8W;
    if (b1) cfg = mode == DEC_MMA_B1 ? B1_CFG : B1_8W_CFG; /* planned, or named (sf_k_attention_decode_split) */
    const bool mma = shape && mode != DEC_LANES && (mode == DEC_MMA || b1 || T >= SF_AD_MMA_MIN_TOKENS);
    if (mma) *chosen = b1 ? mode : DEC_MMA;
    if (shape && mode == DEC_STREAM && (kernel == DEC_STREAM || T >= SF_AD_MMA_MIN_TOKENS)) {
        *chosen = DEC_STREAM;
        /* stream kernel: enough workspace slots (two per block) for a block per resident slot;
         * the split itself is the kernel's (every context, even short ones, is cut evenly) */
        const int n = sf_k_attention_decode_stream_per_sm(hd, int8, cfg);
        const int64_t slots = (int64_t)(n > 0 ? n : 1) * sms;
        const int64_t ns = (2 * slots + work - 1) / work;
        return ns < 2 ? 2 : (int)SF_MIN(ns, (int64_t)AD_MAX_SPLIT);
    }
    if (max_ctx <= 64) return 1;
    /* SEMFLOW_CUDA_DECODE_SPLIT=n: the lanes and mma kernels' key split, forced (comparisons) */
    static const int forced_split = (int)sf_env_long("SEMFLOW_CUDA_DECODE_SPLIT", 0, 0, AD_MAX_SPLIT);
    if (forced_split) return SF_MIN(forced_split, (max_ctx + 63) / 64);
    if (!mma) {
        /* lanes kernel: at least 64 keys per block; a block per SM, or more blocks while each keeps
         * >= 128 keys (test_ops --perf on the H200, one token: 512 keys of 8 kv heads 8.4 us at 8
         * splits, 8.9 at 16; 4096 keys: 8 kv heads 15.4 us at 32 splits, 19.4 at 17; 4 kv heads
         * 20.9 at 32, 32.9 at 64) */
        if (work >= sms) return 1;
        const int per_sm = (sms + work - 1) / work, by_keys = (max_ctx + 127) / 128;
        const int ns = SF_MIN((max_ctx + 63) / 64, per_sm > by_keys ? per_sm : by_keys);
        return ns < 1 ? 1 : SF_MIN(ns, AD_MAX_SPLIT);
    }
    /* mma kernel: the blocks resident at once (measured) are `slots`; a block's time is about its
     * tiles plus one (its start: block-table and first-tile latency; its end: the merge). Pick the
     * split with the least (waves x that), the smallest on ties, among the splits below the first
     * that would leave a split empty (its tiles rounded up): whole waves at every batch and
     * context, no split where the waves already come out even (256 x 192: 1; 128 x 1500: 3).
     * One-token steps on the B1 configuration take the rule below instead. */
    static int slots_cache[SF_K_MAX_DEVICES][2][2][SF_ARRAY_LEN(dec_cfgs)]; /* per device (common.cuh), cfg */
    const int dev = sf_k_dev();
    int own = 0, *sc = dev >= 0 ? &slots_cache[dev][hd == 128][int8 != 0][dec_cfg_index(cfg)] : &own;
    if (!*sc) {
        const int n = sf_k_attention_decode_mma_per_sm(hd, int8, cfg);
        *sc = (n > 0 ? n : 1) * sms;
    }
    const int slots = *sc, tk = hd == 64 ? 64 : mma_tile_keys(cfg);
    if (b1) {
        /* one-token steps: one wave of blocks, as many as fit (16 splits for 8 kv heads on 132 SMs, at
         * most 32; 24 for the 8-warp configuration), each block's first tiles loaded before the
         * programmatic wait while the QKV projection ends. Splits past the last key are empty blocks
         * that combine nothing; the same tiles in fewer splits measured slower (Llama-3-8B at 4097
         * keys: 16 splits of 5 tiles, 3 of them empty, 3.952 / 3.998 ms a token on two cards, 13
         * splits 3.983 / 4.019; Qwen2-7B, 4 kv heads: 32 splits 3.736, 22 3.749; session 22,
         * docs/PERFORMANCE.md) */
        const int cap = mode == DEC_MMA_B1_8W ? SF_AD_B1_8W_MAX_SPLIT : SF_AD_B1_MAX_SPLIT;
        const int ns = SF_MIN(SF_MIN(slots / work, cap), (max_ctx + tk - 1) / tk);
        return ns < 1 ? 1 : ns;
    }
    int best = 1;
    double best_cost = 1e300;
    for (int ns = 1; ns <= AD_MAX_SPLIT; ns++) {
        const int per_keys = (max_ctx + ns - 1) / ns, tiles = (per_keys + tk - 1) / tk;
        if (ns > 1 && (int64_t)(ns - 1) * ((per_keys + tk - 1) / tk * tk) >= max_ctx) break; /* empty splits */
        const double waves = (double)(((int64_t)work * ns + slots - 1) / slots), cost = waves * (tiles + 1);
        if (cost < best_cost) { best_cost = cost; best = ns; }
    }
    return best;
}

extern "C" int sf_k_attention_decode_split(int T, int Hkv, int hd, int max_ctx, int block_size, int int8, int sms,
                                           int kernel)
{
    int chosen;
    return plan(T, Hkv, 0, hd, max_ctx, block_size, int8, sms, kernel, &chosen);
}

extern "C" int sf_k_attention_decode_plan(int T, int Hkv, int group, int hd, int max_ctx, int block_size, int int8,
                                          int sms, int *kernel)
{
    return plan(T, Hkv, group, hd, max_ctx, block_size, int8, sms, 0, kernel);
}

/* What one block of a one-token bf16 step (the cluster instance, as at 512 keys) takes of an SM:
 * registers (sf_k_block_regs) and shared memory (static, its dynamic
 * pre-copy and the per-block reservation). For a kernel launched before it that wants room for
 * such a block beside its own (gemv_stream.cu's QKV plan). Cached per device; 0 if unknown. */
template <int HD, int MAXG, int PARTS>
static int ad_block_res(int *regs, int *smem)
{
    static int rg[SF_K_MAX_DEVICES], sm[SF_K_MAX_DEVICES];
    const int d = sf_k_dev();
    if (d >= 0 && rg[d]) { *regs = rg[d]; *smem = sm[d]; return 0; }
    cudaFuncAttributes at;
    int dev = -1, r = 0;
    if (cudaFuncGetAttributes(&at, k_attn_decode<HD, MAXG, false, true, PARTS>) || cudaGetDevice(&dev) ||
        cudaDeviceGetAttribute(&r, cudaDevAttrReservedSharedMemoryPerBlock, dev)) {
        cudaGetLastError();
        return -1;
    }
    *regs = sf_k_block_regs(at, AD_WARPS * 32);
    *smem = (int)(at.sharedSizeBytes + ad_pre_bytes<MAXG>()) + r;
    if (d >= 0) { rg[d] = *regs; sm[d] = *smem; }
    return 0;
}

/* The instance a group of G heads runs on: the 4-head one, two blocks of it (groups of 5..8
 * with the head split), or the 8-head one. The launch and what the QKV plan leaves room for
 * (sf_k_attention_decode_block) both ask here, so they cannot disagree. */
enum { AD_G4, AD_G4X2, AD_G8 };
static int ad_instance(int G)
{
    return G <= 4 ? AD_G4 : head_split() ? AD_G4X2 : AD_G8;
}

extern "C" int sf_k_attention_decode_block(int hd, int group, int *regs, int *smem)
{
    *regs = *smem = 0;
    if ((hd != 64 && hd != 128) || group < 1 || group > 8) return -1;
    switch (ad_instance(group)) {
    case AD_G4: return hd == 128 ? ad_block_res<128, 4, 1>(regs, smem) : ad_block_res<64, 4, 1>(regs, smem);
    case AD_G4X2: return hd == 128 ? ad_block_res<128, 4, 2>(regs, smem) : ad_block_res<64, 4, 2>(regs, smem);
    default: return hd == 128 ? ad_block_res<128, 8, 1>(regs, smem) : ad_block_res<64, 8, 1>(regs, smem);
    }
}

extern "C" int sf_k_attention_decode(const sf_k_attn *a, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    int cfg;
    const int k = pick(a, &cfg);
    if (k == DEC_STREAM) return sf_k_attention_decode_stream(a, cfg, 0, s);
    if (k == DEC_MMA) {
        /* one-token plans: the splits combined in a cluster where all of the step's clusters
         * fit at once (kernels.h; on the H200 up to 8 splits of 8 kv heads, attention_decode_mma.cu) */
        int rc;
        if (a->kernel == DEC_MMA_B1 && cluster_on() && (rc = sf_k_attention_decode_mma_cluster(a, cfg, s)) >= 0) return rc;
        return sf_k_attention_decode_mma(a, cfg, s);
    }
    if (!sf_k_attention_decode_ok(a)) return (int)cudaErrorInvalidValue;
    switch (ad_instance(a->H / a->Hkv)) {
    case AD_G4: return a->hd == 128 ? launch<128, 4, 1>(a, s) : launch<64, 4, 1>(a, s);
    case AD_G4X2: return a->hd == 128 ? launch<128, 4, 2>(a, s) : launch<64, 4, 2>(a, s);
    default: return a->hd == 128 ? launch<128, 8, 1>(a, s) : launch<64, 8, 1>(a, s);
    }
}
