/* gemv_ring.cuh — device pieces shared by the batch-1 GEMVs that stream weights through a
 * cp.async ring (gemv_fused.cu) and the persistent decoder-layer kernel (decode_persist.cu):
 * the ring's copies, the 8-wide dot product, the normalised row and the RoPE + K/V epilogue.
 * Device code only. */
#ifndef SF_KERNELS_GEMV_RING_CUH
#define SF_KERNELS_GEMV_RING_CUH

#include "common.cuh"

/* 16 bytes global -> shared, L2 only. The "memory" clobbers keep shared-memory reads of a slot
 * on their side of the copy that refills it and of the wait that lands it. */
static __device__ __forceinline__ void gr_cp16(void *smem, const void *g)
{
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
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

/* Sum of squares of the k8 8-wide vectors of x (this thread's share: i = threadIdx.x, step
 * nt), copying them to xs. */
static __device__ __forceinline__ float gr_row_sumsq(const bf16x8 *x, bf16x8 *xs, int k8, int nt)
{
    float ss = 0.0f;
    for (int i = threadIdx.x; i < k8; i += nt) {
        bf16x8 v = x[i];
        xs[i] = v;
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float2 f = __bfloat1622float2(v.h[h]);
            ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
        }
    }
    return ss;
}

/* xs[i] = bf16(bf16(xs[i] * inv) * nw[i]) (HF: round, then scale), this thread's share. */
static __device__ __forceinline__ void gr_row_scale(bf16x8 *xs, const bf16x8 *nw, float inv, int k8, int nt)
{
    for (int i = threadIdx.x; i < k8; i += nt) {
        bf16x8 v = xs[i], g = nw[i], o;
#pragma unroll
        for (int h = 0; h < 4; h++) {
            float2 f = __bfloat1622float2(v.h[h]), gw = __bfloat1622float2(g.h[h]);
            float n0 = bf2f(f2bf(f.x * inv)), n1 = bf2f(f2bf(f.y * inv));
            o.h[h] = __floats2bfloat162_rn(n0 * gw.x, n1 * gw.y);
        }
        xs[i] = o;
    }
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

#endif
