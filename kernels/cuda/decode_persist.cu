/* decode_persist.cu — the decoder layers of a batch-1 decode step in one persistent launch:
 *
 *   phase 0  x = rmsnorm(h) * attn_norm; qkv = x . Wqkv^T (+ bias); RoPE on q, k; k, v -> cache
 *   phase A  attention of the token's q over the layer's paged cache (GQA, keys split over warps)
 *   phase 1  h += bf16(att . Wo^T)
 *   phase 2  x = rmsnorm(h) * ffn_norm; act = silu(x . Wgate^T) * (x . Wup^T)
 *   phase 3  h += bf16(act . Wdown^T)
 *
 * for each of n_layers layers (a whole step's layers, or one per launch).
 * One block per SM (grid = SMs x blocks that fit, all resident: the grid-wide barriers between
 * the phases spin on a counter in global memory). What the separate kernels of gemv_fused.cu
 * lose is the time between them: each kernel's ramp-up and tail, and attention's latency while
 * HBM idles. Here every warp streams its share of the layer's four weights through one per-warp
 * ring of cp.async stages (4 stages, 5 or 6 on request, of two rows x DP_V 16-byte loads per lane) that runs
 * across the phases: the stages a warp issues while it consumes the last ones of a phase are
 * the first ones of its next phase (or of the next layer's QKV), so before it reaches a barrier (or attention) its next
 * weights are already in flight, and they land while the barrier and attention wait. Weights do
 * not depend on activations, so nothing orders those loads; activations are read only after
 * the barrier that publishes them (through L2: __ldcg, never a stale L1 line).
 *
 * Work split: a GEMV unit is two rows of a weight (a rotation pair of QKV, a gate row and its up
 * row, two neighbouring rows of O or down); unit u goes to block u % G, warp (u / G) % DP_WARPS,
 * so blocks differ by at most one unit per phase. Attention items are (kv head, key range) with
 * ranges of >= 32 keys (up to DP_MAX_SPLIT per kv head), one warp each, lanes one key each for q.k and 4 dims each for p.v;
 * partials go to a workspace and the last warp of a kv head combines them (a counter per kv head).
 * Norms are recomputed by every block from h (d values, L2).
 *
 * Rounding follows gemv_fused.cu and attention: normalised x bf16(bf16(x * inv) * w), GEMV
 * outputs rounded to bf16 before RoPE, SiLU (rounded again) and residual adds; attention in fp32
 * with the output rounded once. Only the order of fp32 sums differs.
 *
 * Launched as a programmatic dependent (common.cuh): a block issues its first QKV stages, then
 * waits for the kernel before it (the embedding, or the launch of the layers before). */
#include <string.h>

#include "gemv_ring.cuh"

#define DP_WARPS 16
#define DP_V 2     /* 16-byte loads per row per lane per stage */
#define DP_SYNC_WORDS 128
/* Key splits per kv head (<= SF_K_DECODE_PERSIST_MAX_SPLIT, which sizes the workspace): 64
 * measured no faster than 32 at 4096 keys (docs/PERFORMANCE.md). */
#define DP_MAX_SPLIT 32

/* Ring bytes of a block with ST stages per warp (4, or 5 and 6 on request). */
static constexpr size_t dp_ring_bytes(int st) { return (size_t)DP_WARPS * st * 2 * DP_V * 32 * 16; }

enum { DP_QKV = 0, DP_O = 1, DP_GU = 2, DP_DOWN = 3, DP_PHASES = 4 };

/* Grid-wide barrier over G resident blocks: sync[0] counts arrivals, sync[1] is the generation;
 * the last block to arrive resets the count and bumps the generation. Self-resetting, so a
 * graph can replay the kernel without clearing anything. */
static __device__ __forceinline__ void dp_grid_sync(unsigned *sync, unsigned G)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = sync + 1;
        const unsigned g0 = *gen;
        __threadfence();
        if (atomicAdd(sync, 1u) == G - 1) {
            atomicExch(sync, 0u);
            __threadfence();
            atomicAdd(sync + 1, 1u);
        } else {
            while (*gen == g0) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

/* Rows (ra, rb) of unit u of phase `ph`; rope: the pair a rotation mixes (gemv_fused.cu). */
struct dp_rows { int ra, rb, hh, ri; bool rotate; };
static __device__ __forceinline__ dp_rows dp_unit_rows(const sf_k_layer1 &p, int kind, int u)
{
    dp_rows r = { 0, 0, 0, 0, false };
    if (kind == DP_QKV) {
        const int half = p.hd / 2;
        r.hh = u / half;
        r.ri = u - r.hh * half;
        r.rotate = r.hh < p.H + p.Hkv && r.ri < p.rot / 2;
        r.ra = r.hh * p.hd + (r.rotate && !p.interleaved ? r.ri : 2 * r.ri);
        r.rb = r.ra + (r.rotate && !p.interleaved ? p.rot / 2 : 1);
    } else if (kind == DP_GU) {
        r.ra = u;
        r.rb = u + p.ffn;
    } else {
        r.ra = 2 * u;
        r.rb = 2 * u + 1;
    }
    return r;
}

/* The weight stream of one warp: its units of the four phases of each layer in order (phase
 * ph: layer ph / 4, kind ph % 4), DP_V * 32 16-byte columns of both rows per stage. Two cursors
 * walk it: one issuing, ST - 1 stages ahead of the one consuming, into the next phases and
 * the next layer. */
struct dp_cursor { int ph, i, j; };
struct dp_stream {
    int k8[DP_PHASES], units[DP_PHASES], nsu[DP_PHASES]; /* by kind */
    int n_ph;        /* 4 * layers */
    int first, step; /* this warp's units: first + step * i */
};

static __device__ __forceinline__ const uint4 *dp_weight(const sf_k_layer1 &p, int ph)
{
    const sf_k_layer1_w *L = p.lw + (ph >> 2);
    const uint16_t *w;
    switch (ph & 3) {
    case DP_QKV: w = L->wqkv; break;
    case DP_O: w = L->wo; break;
    case DP_GU: w = L->wgu; break;
    default: w = L->wdown; break;
    }
    return (const uint4 *)w;
}

static __device__ __forceinline__ void dp_skip_empty(const dp_stream &s, dp_cursor &c)
{
    while (c.ph < s.n_ph && s.first + s.step * c.i >= s.units[c.ph & 3]) { c.ph++; c.i = 0; c.j = 0; }
}

static __device__ __forceinline__ void dp_advance(const dp_stream &s, dp_cursor &c)
{
    if (++c.j == s.nsu[c.ph & 3]) {
        c.j = 0;
        c.i++;
        dp_skip_empty(s, c);
    }
}

/* Issues the stage at cursor c into ring slot `slot` (one commit group, empty past the end). */
static __device__ __forceinline__ void dp_issue(const sf_k_layer1 &p, const dp_stream &s, dp_cursor &c, uint4 *ring,
                                                int slot, int lane)
{
    if (c.ph < s.n_ph) {
        const dp_rows r = dp_unit_rows(p, c.ph & 3, s.first + s.step * c.i);
        const int k8 = s.k8[c.ph & 3];
        const uint4 *w = dp_weight(p, c.ph), *wa = w + (int64_t)r.ra * k8, *wb = w + (int64_t)r.rb * k8;
#pragma unroll
        for (int v = 0; v < DP_V; v++) {
            const int col = (c.j * DP_V + v) * 32 + lane;
            if (col < k8) {
                gr_cp16(ring + ((slot * 2 + 0) * DP_V + v) * 32, wa + col);
                gr_cp16(ring + ((slot * 2 + 1) * DP_V + v) * 32, wb + col);
            }
        }
        dp_advance(s, c);
    }
    gr_commit();
}

/* xs[i] = bf16(bf16(h[i] * inv) * w[i]), inv = rsqrt(mean(h^2) + eps); whole block, ends synced. */
static __device__ void dp_norm(const uint16_t *h, const uint16_t *w, int d, float eps, bf16x8 *xs, float *red)
{
    const uint4 *h8 = (const uint4 *)h;
    for (int i = threadIdx.x; i < d / 8; i += blockDim.x) { /* through L2: other blocks wrote h */
        uint4 raw = __ldcg(h8 + i);
        xs[i] = *(bf16x8 *)&raw;
    }
    const float ss = block_sum(gr_row_sumsq(xs, xs, d / 8, blockDim.x), red); /* a thread's own entries */
    gr_row_scale(xs, (const bf16x8 *)w, rsqrtf(ss / (float)d + eps), d / 8, blockDim.x);
    __syncthreads();
}

/* xs = v[0 .. n) through L2; whole block, ends synced. */
static __device__ void dp_load_vec(const uint16_t *v, int n, bf16x8 *xs)
{
    const uint4 *v8 = (const uint4 *)v;
    for (int i = threadIdx.x; i < n / 8; i += blockDim.x) {
        uint4 raw = __ldcg(v8 + i);
        xs[i] = *(bf16x8 *)&raw;
    }
    __syncthreads();
}

/* The GEMV epilogue of one unit (lane 0): what gemv_fused.cu's epilogues do. */
static __device__ __forceinline__ void dp_epilogue(const sf_k_layer1 &p, const sf_k_layer1_w *L, int kind, int u,
                                                   float acc_a, float acc_b)
{
    const dp_rows r = dp_unit_rows(p, kind, u);
    if (kind == DP_QKV) {
        if (L->bqkv) { acc_a += sf_ld_bf16(L->bqkv + r.ra); acc_b += sf_ld_bf16(L->bqkv + r.rb); }
        gr_rope_store(acc_a, acc_b, r.rotate, r.ri, r.hh, r.ra, r.rb, p.pos[0], p.inv_freq, p.slot[0], p.H, p.Hkv, p.hd,
                      p.block_size, L->k, L->v, (bf16 *)p.qkv);
    } else if (kind == DP_GU) {
        float g = bf2f(f2bf(acc_a)), up = bf2f(f2bf(acc_b));
        float sg = bf2f(f2bf(g / (1.0f + __expf(-g))));
        ((bf16 *)p.act)[u] = f2bf(sg * up);
    } else {
        uint32_t *h2 = (uint32_t *)p.h + u; /* rows 2u, 2u + 1: one 4-byte word */
        uint32_t old = __ldcg(h2);
        bf162 hv = *(bf162 *)&old;
        float2 hf = __bfloat1622float2(hv);
        bf162 o = __floats2bfloat162_rn(hf.x + bf2f(f2bf(acc_a)), hf.y + bf2f(f2bf(acc_b)));
        __stcg(h2, *(uint32_t *)&o);
    }
}

/* Consumes this warp's units of phase `ph` (x in xs), issuing ST - 1 stages ahead. */
template <int ST>
static __device__ __forceinline__ void dp_gemv_phase(const sf_k_layer1 &p, const dp_stream &s, int ph, dp_cursor &ci,
                                                     int &slot_c, uint4 *ring, const bf16x8 *xs, int lane)
{
    const int kind = ph & 3, k8 = s.k8[kind], nsu = s.nsu[kind];
    const sf_k_layer1_w *L = p.lw + (ph >> 2);
    for (int u = s.first; u < s.units[kind]; u += s.step) {
        float acc_a = 0.0f, acc_b = 0.0f;
        for (int j = 0; j < nsu; j++) {
            dp_issue(p, s, ci, ring, (slot_c + ST - 1) % ST, lane); /* the slot consumed last */
            gr_wait<ST - 1>();
            const uint4 *st = ring + (size_t)slot_c * 2 * DP_V * 32;
#pragma unroll
            for (int v = 0; v < DP_V; v++) {
                const int col = (j * DP_V + v) * 32 + lane;
                if (col < k8) {
                    bf16x8 xx = xs[col];
                    acc_a = gr_dot8(st[v * 32], xx, acc_a);
                    acc_b = gr_dot8(st[(DP_V + v) * 32], xx, acc_b);
                }
            }
            slot_c = (slot_c + 1) % ST;
        }
        acc_a = warp_sum(acc_a);
        acc_b = warp_sum(acc_b);
        if (lane == 0) dp_epilogue(p, L, kind, u, acc_a, acc_b);
    }
}

/* Attention of the token over keys 0 .. pos[0] of kv head items; q of every head in qs (bf16,
 * H * HD, shared memory). A lane holds DL = HD / 32 output dims of each head of the group. */
template <int HD>
static __device__ void dp_attention(const sf_k_layer1 &p, const sf_k_layer1_w *L, const bf16x8 *qs, int gw, int n_warps,
                                    int lane)
{
    constexpr int MG = SF_K_DECODE_PERSIST_MAX_GROUP, DL = HD / 32;
    const int GQ = p.H / p.Hkv, ctx = p.pos[0] + 1, bs = p.block_size;
    const int max_split = max(1, min(DP_MAX_SPLIT, n_warps / p.Hkv));
    int chunk = (ctx + max_split - 1) / max_split;
    chunk = max(32, (chunk + 31) / 32 * 32);
    const int n_split = (ctx + chunk - 1) / chunk, items = p.Hkv * n_split;
    unsigned *cnt = p.sync + 2;
    bf16 *att = (bf16 *)p.att;
    for (int it = gw; it < items; it += n_warps) {
        const int kvh = it / n_split, sp = it - kvh * n_split;
        const int k0 = sp * chunk, k1 = min(ctx, k0 + chunk);
        const uint16_t *kc = L->k, *vc = L->v;
        float m[MG], l[MG], acc[MG][DL];
#pragma unroll
        for (int g = 0; g < MG; g++) {
            m[g] = -INFINITY;
            l[g] = 0.0f;
#pragma unroll
            for (int q = 0; q < DL; q++) acc[g][q] = 0.0f;
        }
        for (int kb = k0; kb < k1; kb += 32) {
            const int key = kb + lane;
            const bool valid = key < k1;
            int64_t off = 0;
            if (valid) off = ((int64_t)p.block_table[key / bs] * p.Hkv + kvh) * bs * HD + (int64_t)(key % bs) * HD;
            float s[MG];
#pragma unroll
            for (int g = 0; g < MG; g++) s[g] = 0.0f;
            if (valid) {
                const uint4 *kr = (const uint4 *)(kc + off);
#pragma unroll 4
                for (int c = 0; c < HD / 8; c++) {
                    const uint4 raw = __ldcg(kr + c);
                    const bf16x8 kk = *(bf16x8 *)&raw;
#pragma unroll
                    for (int g = 0; g < MG; g++)
                        if (g < GQ) {
                            const bf16x8 qq = qs[((kvh * GQ + g) * HD) / 8 + c];
#pragma unroll
                            for (int q = 0; q < 4; q++) {
                                float2 kf = __bfloat1622float2(kk.h[q]), qf = __bfloat1622float2(qq.h[q]);
                                s[g] = fmaf(kf.x, qf.x, fmaf(kf.y, qf.y, s[g]));
                            }
                        }
                }
            }
            float pr[MG];
#pragma unroll
            for (int g = 0; g < MG; g++) {
                if (g >= GQ) { pr[g] = 0.0f; continue; }
                const float sc = valid ? s[g] * p.scale : -INFINITY;
                const float mn = fmaxf(m[g], warp_max(sc)); /* finite: key kb is valid */
                const float corr = __expf(m[g] - mn);
                pr[g] = valid ? __expf(sc - mn) : 0.0f;
                l[g] = l[g] * corr + warp_sum(pr[g]);
                m[g] = mn;
#pragma unroll
                for (int q = 0; q < DL; q++) acc[g][q] *= corr;
            }
            const int nk = min(32, k1 - kb);
            for (int j0 = 0; j0 < nk; j0 += 8) {
                bf162 vr[8][DL / 2];
#pragma unroll
                for (int jj = 0; jj < 8; jj++) {
                    const int64_t o = __shfl_sync(0xffffffffu, off, j0 + jj);
#pragma unroll
                    for (int q = 0; q < DL / 2; q++) {
                        unsigned raw = j0 + jj < nk ? __ldcg((const unsigned *)(vc + o + lane * DL) + q) : 0u;
                        vr[jj][q] = *(bf162 *)&raw;
                    }
                }
#pragma unroll
                for (int jj = 0; jj < 8; jj++) {
#pragma unroll
                    for (int g = 0; g < MG; g++)
                        if (g < GQ) {
                            const float pj = __shfl_sync(0xffffffffu, pr[g], j0 + jj);
#pragma unroll
                            for (int q = 0; q < DL / 2; q++) {
                                const float2 v = __bfloat1622float2(vr[jj][q]);
                                acc[g][2 * q] = fmaf(pj, v.x, acc[g][2 * q]);
                                acc[g][2 * q + 1] = fmaf(pj, v.y, acc[g][2 * q + 1]);
                            }
                        }
                }
            }
        }
        if (n_split == 1) {
#pragma unroll
            for (int g = 0; g < MG; g++)
                if (g < GQ) {
                    const float il = 1.0f / l[g];
                    bf162 *o = (bf162 *)(att + (kvh * GQ + g) * HD + lane * DL);
#pragma unroll
                    for (int q = 0; q < DL / 2; q++) o[q] = __floats2bfloat162_rn(acc[g][2 * q] * il, acc[g][2 * q + 1] * il);
                }
            continue;
        }
        /* partial of split sp: ws[((kvh * max_split + sp) * GQ + g) * (HD + 2) + ...]: dims, max, sum */
#pragma unroll
        for (int g = 0; g < MG; g++)
            if (g < GQ) {
                float *w = p.ws + ((size_t)(kvh * max_split + sp) * GQ + g) * (HD + 2);
#pragma unroll
                for (int q = 0; q < DL; q++) __stcg(w + lane * DL + q, acc[g][q]);
                if (lane == 0) { __stcg(w + HD, m[g]); __stcg(w + HD + 1, l[g]); }
            }
        __threadfence();
        unsigned prev = 0;
        if (lane == 0) prev = atomicAdd(cnt + kvh, 1u);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev != (unsigned)n_split - 1) continue;
        __threadfence(); /* the last of the kv head's splits: combine them */
        for (int g = 0; g < GQ; g++) {
            float M = -INFINITY;
            for (int t = 0; t < n_split; t++)
                M = fmaxf(M, __ldcg(p.ws + ((size_t)(kvh * max_split + t) * GQ + g) * (HD + 2) + HD));
            float L = 0.0f, o[DL];
#pragma unroll
            for (int q = 0; q < DL; q++) o[q] = 0.0f;
            for (int t = 0; t < n_split; t++) {
                const float *w = p.ws + ((size_t)(kvh * max_split + t) * GQ + g) * (HD + 2);
                const float e = __expf(__ldcg(w + HD) - M);
                L = fmaf(e, __ldcg(w + HD + 1), L);
#pragma unroll
                for (int q = 0; q < DL; q++) o[q] = fmaf(e, __ldcg(w + lane * DL + q), o[q]);
            }
            const float il = 1.0f / L;
            bf162 *out = (bf162 *)(att + (kvh * GQ + g) * HD + lane * DL);
#pragma unroll
            for (int q = 0; q < DL / 2; q++) out[q] = __floats2bfloat162_rn(o[2 * q] * il, o[2 * q + 1] * il);
        }
        if (lane == 0) atomicExch(cnt + kvh, 0u);
    }
}

template <int ST>
__global__ void __launch_bounds__(DP_WARPS * 32, 1) k_decode_persist(const sf_k_layer1 p)
{
    extern __shared__ __align__(16) unsigned char dp_smem[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, G = gridDim.x;
    uint4 *ring = (uint4 *)dp_smem + (size_t)warp * ST * 2 * DP_V * 32 + lane;
    bf16x8 *xs = (bf16x8 *)(dp_smem + dp_ring_bytes(ST));

    dp_stream s;
    const int d = p.d, q_dim = p.H * p.hd;
    s.k8[DP_QKV] = d / 8; s.units[DP_QKV] = (p.H + 2 * p.Hkv) * p.hd / 2;
    s.k8[DP_O] = q_dim / 8; s.units[DP_O] = d / 2;
    s.k8[DP_GU] = d / 8; s.units[DP_GU] = p.ffn;
    s.k8[DP_DOWN] = p.ffn / 8; s.units[DP_DOWN] = d / 2;
#pragma unroll
    for (int k = 0; k < DP_PHASES; k++) s.nsu[k] = (s.k8[k] + 32 * DP_V - 1) / (32 * DP_V);
    s.n_ph = DP_PHASES * p.n_layers;
    s.first = blockIdx.x + G * warp;
    s.step = G * DP_WARPS;

    sf_pdl_trigger();
    /* the first stages of QKV (weights only) before waiting for the kernel before */
    dp_cursor ci = { 0, 0, 0 };
    dp_skip_empty(s, ci);
#pragma unroll
    for (int t = 0; t < ST - 1; t++) dp_issue(p, s, ci, ring, t, lane);
    int slot_c = 0;
    sf_pdl_wait();

    for (int l = 0; l < p.n_layers; l++) {
        const sf_k_layer1_w *L = p.lw + l;
        const int ph = DP_PHASES * l;
        if (l) dp_grid_sync(p.sync, G); /* h of the layer before */
        dp_norm(p.h, L->attn_norm, d, p.eps, xs, red);
        dp_gemv_phase<ST>(p, s, ph + DP_QKV, ci, slot_c, ring, xs, lane);
        dp_grid_sync(p.sync, G); /* q, k, v and the cache written */

        dp_load_vec(p.qkv, q_dim, xs);
        if (p.hd == 128) dp_attention<128>(p, L, xs, blockIdx.x + G * warp, G * DP_WARPS, lane);
        else dp_attention<64>(p, L, xs, blockIdx.x + G * warp, G * DP_WARPS, lane);
        dp_grid_sync(p.sync, G); /* att written */

        dp_load_vec(p.att, q_dim, xs);
        dp_gemv_phase<ST>(p, s, ph + DP_O, ci, slot_c, ring, xs, lane);
        dp_grid_sync(p.sync, G); /* h += o */

        dp_norm(p.h, L->ffn_norm, d, p.eps, xs, red);
        dp_gemv_phase<ST>(p, s, ph + DP_GU, ci, slot_c, ring, xs, lane);
        dp_grid_sync(p.sync, G); /* act written */

        dp_load_vec(p.act, p.ffn, xs);
        dp_gemv_phase<ST>(p, s, ph + DP_DOWN, ci, slot_c, ring, xs, lane);
    }
    gr_wait<0>(); /* the groups issued past the end are empty */
}

static size_t smem_bytes(const sf_k_layer1 *p, int st)
{
    int kmax = p->d > p->H * p->hd ? p->d : p->H * p->hd;
    if (p->ffn > kmax) kmax = p->ffn;
    return dp_ring_bytes(st) + ((size_t)kmax * 2 + 15) / 16 * 16;
}

/* SMs of the current device times the blocks of k_decode_persist<ST> resident per SM with smem
 * bytes of dynamic shared memory (0: none fit). */
template <int ST>
static int grid_size(size_t smem)
{
    static int dev = -1, sms = 0, per_sm = 0;
    static size_t smem_for = 0;
    int cur = 0;
    if (cudaGetDevice(&cur) != cudaSuccess) return 0;
    if (cur != dev || smem != smem_for) {
        int max_optin = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, cur) != cudaSuccess ||
            cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cur) != cudaSuccess ||
            smem + 1024 > (size_t)max_optin) /* + the static shared memory */
            return 0;
        if (cudaFuncSetAttribute(k_decode_persist<ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_decode_persist<ST>, DP_WARPS * 32, smem) !=
                cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        dev = cur;
        smem_for = smem;
    }
    return sms * per_sm;
}

/* Ring depth: 4 stages (measured faster than 6, docs/PERFORMANCE.md); SEMFLOW_CUDA_PERSIST_ST=5
 * or 6 asks for a deeper ring, taken where it fits beside the activation row. */
static int ring_stages(const sf_k_layer1 *p)
{
    static const int want = [] {
        const char *e = getenv("SEMFLOW_CUDA_PERSIST_ST");
        return e && (!strcmp(e, "5") || !strcmp(e, "6")) ? e[0] - '0' : 4;
    }();
    if (want == 6 && grid_size<6>(smem_bytes(p, 6)) > 0) return 6;
    return want >= 5 && grid_size<5>(smem_bytes(p, 5)) > 0 ? 5 : 4;
}

extern "C" size_t sf_k_decode_persist_ws_floats(int H, int hd)
{
    return (size_t)H * SF_K_DECODE_PERSIST_MAX_SPLIT * (hd + 2);
}

extern "C" size_t sf_k_decode_persist_sync_bytes(void) { return DP_SYNC_WORDS * sizeof(unsigned); }

extern "C" int sf_k_decode_persist_ok(const sf_k_layer1 *p)
{
    const int G = p->Hkv > 0 ? p->H / p->Hkv : 0;
    const uintptr_t a = (uintptr_t)p->h | (uintptr_t)p->qkv | (uintptr_t)p->att | (uintptr_t)p->act | (uintptr_t)p->ws;
    return (p->hd == 128 || p->hd == 64) && p->H > 0 && p->Hkv > 0 && p->H % p->Hkv == 0 &&
           G <= SF_K_DECODE_PERSIST_MAX_GROUP && p->Hkv + 2 <= DP_SYNC_WORDS && p->d > 0 && p->d % 8 == 0 &&
           p->ffn > 0 && p->ffn % 8 == 0 && p->rot >= 2 && p->rot % 2 == 0 && p->rot <= p->hd &&
           p->block_size > 0 && p->lw && p->n_layers >= 1 && a % 16 == 0 && p->sync && p->pos && p->slot &&
           p->block_table && p->inv_freq && grid_size<4>(smem_bytes(p, 4)) > 0;
}

extern "C" int sf_k_decode_persist(const sf_k_layer1 *p, cudaStream_t s)
{
    if (!sf_k_decode_persist_ok(p)) return (int)cudaErrorInvalidValue;
    int rc;
    const int st = ring_stages(p);
    if (st == 6) {
        const size_t smem = smem_bytes(p, 6);
        rc = sf_launch_pdl(k_decode_persist<6>, dim3(grid_size<6>(smem)), dim3(DP_WARPS * 32), smem, s, *p);
    } else if (st == 5) {
        const size_t smem = smem_bytes(p, 5);
        rc = sf_launch_pdl(k_decode_persist<5>, dim3(grid_size<5>(smem)), dim3(DP_WARPS * 32), smem, s, *p);
    } else {
        const size_t smem = smem_bytes(p, 4);
        rc = sf_launch_pdl(k_decode_persist<4>, dim3(grid_size<4>(smem)), dim3(DP_WARPS * 32), smem, s, *p);
    }
    return rc ? rc : sf_launch_status();
}
