/* gemv_ring.cuh — device pieces shared by the batch-1 GEMVs that stream weights through a
 * cp.async ring (gemv_fused.cu: a warp per unit of rows; gemv_stream.cu: persistent warps):
 * the ring's copies, the 8-wide dot product, the normalised row, the rows of a unit and the
 * epilogues (GLU, RoPE + K/V append, residual add). Device code, and the launch entry of
 * gemv_stream.cu for gemv_fused.cu's dispatchers. */
#ifndef SF_KERNELS_GEMV_RING_CUH
#define SF_KERNELS_GEMV_RING_CUH

#include "common.cuh"

extern "C" {
#include "../../common/sf.h"
}

/* 16 bytes global -> shared, L2 only. The "memory" clobbers keep shared-memory reads of a slot
 * on their side of the copy that refills it and of the wait that lands it. */
static __device__ __forceinline__ void gr_cp16(void *smem, const void *g)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}
/* 16 bytes of a weight into registers, L1 not allocated. */
static __device__ __forceinline__ uint4 gr_ld_stream(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}
static __device__ __forceinline__ void gr_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void gr_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* acc + w . x over 8 bf16 pairs, in fp32. */
static __device__ __forceinline__ float gr_dot8(const uint4 &w, const bf16x8 &x, float acc)
{
    const bf162 *wh = (const bf162 *)&w;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 wf = __bfloat1622float2(wh[h]), xf = __bfloat1622float2(x.h[h]);
        acc = fmaf(wf.x, xf.x, acc);
        acc = fmaf(wf.y, xf.y, acc);
    }
    return acc;
}

/* ss + the sum of squares of 8 values. */
static __device__ __forceinline__ float gr_sumsq8(const bf16x8 &v, float ss)
{
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 f = __bfloat1622float2(v.h[h]);
        ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
    }
    return ss;
}

/* Sum of squares of the k8 8-wide vectors of x (this thread's share: i = threadIdx.x, step
 * nt), copying them to xs. */
static __device__ __forceinline__ float gr_row_sumsq(const bf16x8 *x, bf16x8 *xs, int k8, int nt)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < k8; i += nt) {
        bf16x8 v = x[i];
        xs[i] = v;
        ss = gr_sumsq8(v, ss);
    }
    return ss;
}

/* bf16(bf16(v * inv) * g) (HF: round, then scale) of 8 values. */
static __device__ __forceinline__ bf16x8 gr_scale8(bf16x8 v, bf16x8 g, float inv)
{
    bf16x8 o;
#pragma unroll
    for (int h = 0; h < 4; h++) {
        float2 f = __bfloat1622float2(v.h[h]), gw = __bfloat1622float2(g.h[h]);
        float n0 = bf2f(f2bf(f.x * inv)), n1 = bf2f(f2bf(f.y * inv));
        o.h[h] = __floats2bfloat162_rn(n0 * gw.x, n1 * gw.y);
    }
    return o;
}

/* xs[i] = gr_scale8(xs[i], nw[i], inv), this thread's share. */
static __device__ __forceinline__ void gr_row_scale(bf16x8 *xs, const bf16x8 *nw, float inv, int k8, int nt)
{
    for (int i = threadIdx.x; i < k8; i += nt) xs[i] = gr_scale8(xs[i], nw[i], inv);
}

/* The QKV epilogue of one rotation pair: rows ra, rb of head hh (q heads < H, then Hkv k heads,
 * then Hkv v heads) with their GEMV sums a, b (bias included): rounded to bf16 (rope_kv reads
 * the rounded product), rotated by pos * inv_freq[ri] when `rotate`, stored to y[ra], y[rb]
 * and, for k and v heads with slot >= 0, to the paged cache (kc, vc: [blocks][Hkv][bs][hd]). */
static __device__ __forceinline__ void gr_rope_store(float a, float b, bool rotate, int ri, int hh, int ra, int rb,
                                                     int pos, const float *inv_freq, int slot, int H, int Hkv, int hd,
                                                     int bs, uint16_t *kc, uint16_t *vc, bf16 *y)
{
    float va = bf2f(f2bf(a)), vb = bf2f(f2bf(b));
    bf16 ya, yb;
    if (rotate) {
        float sn, cs;
        sincosf((float)pos * inv_freq[ri], &sn, &cs);
        ya = f2bf(va * cs - vb * sn);
        yb = f2bf(vb * cs + va * sn);
    } else {
        ya = f2bf(va);
        yb = f2bf(vb);
    }
    y[ra] = ya;
    y[rb] = yb;
    if (hh >= H && slot >= 0) {
        const bool is_v = hh >= H + Hkv;
        const int kvh = is_v ? hh - H - Hkv : hh - H;
        const int64_t blk = slot / bs, off = slot % bs;
        bf16 *cache = (bf16 *)(is_v ? vc : kc) + ((blk * Hkv + kvh) * bs + off) * hd;
        cache[ra - hh * hd] = ya;
        cache[rb - hh * hd] = yb;
    }
}

/* ---- the fused GEMVs' units and epilogues (gemv_fused.cu, gemv_stream.cu) ------------------ */
enum { FG_NORM = 1, FG_GLU = 2, FG_ADD = 4, FG_ROPE = 8, FG_ONE = 16 /* one row per warp (not glu, rope) */ };
#define FG_RING_V 2 /* 16-byte loads per row per lane in one ring stage */

/* RoPE + KV append of the one token (rope mode only); best, best_n, draw: gemv_stream.cu's
 * FG_BEST instance (the lm_head that draws its row) only. */
struct fg_rope {
    const int32_t *pos, *slot;
    const float *inv_freq;
    int H, Hkv, hd, rot, interleaved;
    sf_k_kv kv;
    unsigned long long *best;
    int best_n;
    const sf_k_sample_row *draw;
};

/* Output units of an m-row weight: glu -> m / 2 (a gate row and its up row), rope -> m / 2
 * (the two rows a rotation mixes), one row per warp -> m, else ceil(m / 2) neighbouring pairs. */
static __host__ __device__ __forceinline__ int fg_units(int mode, int m)
{
    return (mode & FG_ONE) ? m : (mode & (FG_GLU | FG_ROPE)) ? m / 2 : (m + 1) / 2;
}

/* The rows (ra, rb) of unit u < fg_units(MODE, m); rope mode: the head hh, the rotation index ri
 * and whether the pair is rotated: (i, i + rot/2) of a head (halves) or (2i, 2i + 1)
 * (interleaved, and the unrotated dims past rot and the v heads in both conventions). */
struct fg_unit {
    int ra, rb, hh, ri;
    bool rotate;
};
template <int MODE>
static __device__ __forceinline__ fg_unit fg_unit_rows(int u, int m, const fg_rope &rp)
{
    fg_unit r = { 0, 0, 0, 0, false };
    if (MODE & FG_GLU) { r.ra = u; r.rb = u + m / 2; }
    else if (MODE & FG_ROPE) {
        const int half = rp.hd / 2;
        r.hh = u / half;
        r.ri = u - r.hh * half;
        r.rotate = r.hh < rp.H + rp.Hkv && r.ri < rp.rot / 2;
        r.ra = r.hh * rp.hd + (r.rotate && !rp.interleaved ? r.ri : 2 * r.ri);
        r.rb = r.ra + (r.rotate && !rp.interleaved ? rp.rot / 2 : 1);
    } else if (MODE & FG_ONE) { r.ra = r.rb = u; }
    else { r.ra = 2 * u; r.rb = min(2 * u + 1, m - 1); }
    return r;
}

/* The QKV epilogue of unit r (bias added) for the token at *pos, slot: gr_rope_store, with the
 * cache written for full-precision blocks only (the caller sends INT8 steps through rope_kv.cu). */
static __device__ __forceinline__ void fg_rope_out(const fg_unit &r, float a, float b, const int *pos, int slot,
                                                   const float *inv_freq, const fg_rope &rp, bf16 *y)
{
    const bool i8 = rp.kv.i8_base && slot / rp.kv.block_size >= rp.kv.i8_base;
    gr_rope_store(a, b, r.rotate, r.ri, r.hh, r.ra, r.rb, *pos, inv_freq, i8 ? -1 : slot, rp.H, rp.Hkv, rp.hd,
                  rp.kv.block_size, rp.kv.k, rp.kv.v, y);
}

/* The residual add of a GEMV output v (rounded to bf16 first, as the unfused GEMV-then-add). */
static __device__ __forceinline__ float fg_add_res(float res, float v) { return res + bf2f(f2bf(v)); }

/* One lane writes unit r's outputs from its two sums a, b (b unused with one row per warp):
 * bias, then glu (y[u] = bf16(silu(bf16 g)) * bf16 u), rope (gr_rope_store), add (y += bf16)
 * or a plain store. Rounding as the unfused kernels round. */
template <int MODE>
static __device__ __forceinline__ void fg_epilogue(const fg_unit &r, int u, float a, float b,
                                                   const bf16 *__restrict__ bias, bf16 *__restrict__ y,
                                                   const fg_rope &rp)
{
    if (bias) { a += bf2f(bias[r.ra]); b += bf2f(bias[r.rb]); }
    if (MODE & FG_GLU) {
        float g = bf2f(f2bf(a)), up = bf2f(f2bf(b));
        float sg = bf2f(f2bf(g / (1.0f + __expf(-g)))); /* HF rounds act(gate) to bf16 first */
        y[u] = f2bf(sg * up);
    } else if (MODE & FG_ROPE) {
        const int sl = rp.slot[0];
        fg_rope_out(r, a, b, rp.pos, sl, rp.inv_freq, rp, y);
    } else if (MODE & FG_ADD) {
        y[r.ra] = f2bf(fg_add_res(bf2f(y[r.ra]), a));
        if (r.rb != r.ra) y[r.rb] = f2bf(fg_add_res(bf2f(y[r.rb]), b));
    } else {
        y[r.ra] = f2bf(a);
        if (r.rb != r.ra) y[r.rb] = f2bf(b);
    }
}

/* The epilogue of pair unit pu for x row `row` of a step of several: fg_epilogue on that row's
 * outputs (y rows ldy apart) and, for RoPE, that row's position and cache slot (gemv_rows.cu,
 * qgemv.cu). */
template <int MODE>
static __device__ __forceinline__ void fg_epilogue_row(int pu, float a, float b, int row, int m,
                                                       const bf16 *__restrict__ bias, bf16 *__restrict__ y,
                                                       int64_t ldy, fg_rope rp)
{
    const fg_unit r = fg_unit_rows<MODE>(pu, m, rp);
    if (MODE & FG_ROPE) {
        rp.pos += row;
        rp.slot += row;
    }
    fg_epilogue<MODE>(r, pu, a, b, bias, y + (int64_t)row * ldy, rp);
}

/* Ring stage t (16-byte columns [t * 32 * FG_RING_V, (t + 1) * 32 * FG_RING_V)) of NR rows wa
 * (and wb) into one slot: slot is the slot's base plus the lane (a lane copies, and later reads,
 * only its own columns); columns past k8 are left alone. In the caller's current group. */
template <int NR>
static __device__ __forceinline__ void gr_stage_copy(uint4 *slot, const uint4 *wa, const uint4 *wb, int t, int k8,
                                                     int lane)
{
#pragma unroll
    for (int rr = 0; rr < NR; rr++)
#pragma unroll
        for (int v = 0; v < FG_RING_V; v++) {
            const int c = (t * FG_RING_V + v) * 32 + lane;
            if (c < k8) gr_cp16(slot + (rr * FG_RING_V + v) * 32, (rr ? wb : wa) + c);
        }
}

/* acc_a (+ acc_b for the second row) += the landed slot of stage t . x (xv: 16-byte columns). */
template <int NR>
static __device__ __forceinline__ void gr_stage_dot(const uint4 *slot, const bf16x8 *xv, int t, int k8, int lane,
                                                    float &acc_a, float &acc_b)
{
#pragma unroll
    for (int v = 0; v < FG_RING_V; v++) {
        const int c = (t * FG_RING_V + v) * 32 + lane;
        if (c < k8) {
            const bf16x8 xx = xv[c];
            acc_a = gr_dot8(slot[v * 32], xx, acc_a);
            if (NR > 1) acc_b = gr_dot8(slot[(FG_RING_V + v) * 32], xx, acc_b);
        }
    }
}

/* One issue of a persistent warp's ring (gemv_stream.cu, gemv_rows.cu): the cursor's stage (it
 * of unit iu) copied by copy(it, islot) into its slot, the cursor moved on (after a unit's n_st
 * stages to the warp's next unit, iu + nwarps, whose rows rows_of(iu) looks up while there is
 * one), then one group closed, empty once the warp's units are done, so that the waits keep
 * counting ST - 1 groups ahead. */
template <int ST, typename C, typename R>
static __device__ __forceinline__ void gr_issue(int &iu, int &it, int &islot, int n_st, int nwarps, int units, C &&copy,
                                                R &&rows_of)
{
    if (iu < units) {
        copy(it, islot);
        if (++it == n_st) {
            it = 0;
            iu += nwarps;
            if (iu < units) rows_of(iu);
        }
    }
    gr_commit();
    if (++islot == ST) islot = 0;
}

/* A configuration forced from the environment (benchmarks; read by the caller once): name's
 * value when valid() takes it, else 0 (planned), with a warning naming it and what it takes. */
static inline int gr_env_cfg(const char *name, long hi, bool (*valid)(int), const char *takes)
{
    const int c = (int)sf_env_long(name, 0, 0, hi);
    if (c && !valid(c)) SF_LOGW("%s=%d: takes %s; using the planned configuration", name, c, takes);
    return c && valid(c) ? c : 0;
}

/* The current device's shared memory per SM, per-block reservation and SMs (0s when they
 * cannot be read); cached per device, as the kernels' attributes are (common.cuh). */
static inline void gr_smem_limits(int *per_sm, int *reserved, int *sms)
{
    static int sm[SF_K_MAX_DEVICES], rs[SF_K_MAX_DEVICES];
    const int d = sf_k_dev(); /* -1 past SF_K_MAX_DEVICES: read, not cached */
    int s = 0, r = 0, dev = -1;
    if (d >= 0 && sm[d]) {
        s = sm[d];
        r = rs[d];
    } else if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&s, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) ||
               cudaDeviceGetAttribute(&r, cudaDevAttrReservedSharedMemoryPerBlock, dev)) {
        cudaGetLastError();
        s = r = 0;
    } else if (d >= 0) {
        sm[d] = s;
        rs[d] = r;
    }
    *per_sm = s;
    *reserved = r;
    *sms = s ? sf_k_sm_count(0) : 0;
}

/* gemv_stream.cu: the fused GEMV of MODE (FG_NORM, | FG_GLU, | FG_ROPE, or FG_ADD) on
 * persistent warps. Returns a cudaError_t, or -1 when the shape does not fit the kernel's
 * shared memory, or no plan suits the step's attention (attn_kernel, sf_k_attn.kernel: the QKV
 * projection beside the one-token tensor-core kernel), unless a plan is forced; the caller then
 * takes gemv_fused.cu's kernels. */
int sf_gemv_stream(int mode, const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                   const uint16_t *bias, int m, int k, uint16_t *y, const fg_rope &rp, cudaStream_t s,
                   int attn_kernel = 0);

#endif
