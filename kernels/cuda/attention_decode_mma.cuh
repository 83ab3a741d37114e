/* attention_decode_mma.cuh — the tile machinery both tensor-core decode kernels share: the
 * per-(token, kv head, split) kernel (attention_decode_mma.cu) and the persistent key-stream
 * kernel (attention_decode_stream.cu). A tile is 16 keys per warp of one (token, kv head): its
 * shared-memory layout (dm_layout), its cp.async loads (dm_issue, block-table entries from
 * dm_ids), a warp's mma over it (dm_compute: QK^T, online softmax, PV), and the merge of the
 * block's warps into one (o, m, l) per query head (dm_merge_warps). The layouts (K dims
 * permuted, rows XOR-swizzled, INT8 rows widened to fp16) are described in
 * attention_decode_mma.cu. Device code only. */
#ifndef SF_KERNELS_ATTENTION_DECODE_MMA_CUH
#define SF_KERNELS_ATTENTION_DECODE_MMA_CUH

#include "attention_decode.cuh"

#define DM_MAX_SPLIT SF_AD_MAX_SPLIT

/* d += a . b (m16n8k16, fp32 accumulators; fp16 or bf16 inputs) from four A registers */
template <bool F16>
static __device__ __forceinline__ void mma4(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint32_t b0, uint32_t b1)
{
    const unsigned a[4] = { a0, a1, a2, a3 };
    if (F16) sf_mma_f16(d, a, b0, b1);
    else sf_mma_bf16(d, a, b0, b1);
}

static __device__ __forceinline__ uint32_t u4w(const uint4 &v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/* Two signed int8 (bytes of w_flipped = w ^ 0x80808080 picked by `sel`: 0x4140 bytes 0 and 1,
 * 0x4342 bytes 2 and 3) as an fp16 pair, exactly: 0x64xx is 1024 + xx, less 1152 is the int8.
 * One byte permute and one half2 subtract (INT8 rows take the fp16 tensor-core path). */
static __device__ __forceinline__ uint32_t i8x2_h2(uint32_t w_flipped, uint32_t sel)
{
    const uint32_t u = __byte_perm(w_flipped, 0x64646464u, sel);
    __half2 h = __hsub2(*(const __half2 *)&u, __half2half2(__ushort_as_half((unsigned short)0x6480u)));
    return *(uint32_t *)&h;
}

/* Shared-memory position (16-byte chunk) of chunk k of tile row `row`: bf16 rows (hd/8 chunks),
 * INT8 rows (hd/16 chunks, in the first half of the row's slot). */
static __device__ __forceinline__ int sw_bf(int row, int k) { return k ^ ((row ^ ((k >> 3) << 1)) & 7); }
template <int HD>
static __device__ __forceinline__ int sw_i8(int row, int k)
{
    return k ^ (row & (HD / 16 - 1) & 7);
}

/* ---- one tile: its layout, loads and compute ---------------------------------------------- */
template <int HD, bool I8, int NW>
struct dm_layout {
    static constexpr int NT = 32 * NW;               /* threads */
    static constexpr int TK = 16 * NW;               /* keys per tile */
    static constexpr int ROWB = HD * 2;               /* bytes of one key's slot (a bf16 row) */
    static constexpr int KB = TK * ROWB;              /* bytes of K (and of V) per stage */
    static constexpr int CH = HD / 8;                 /* 16-byte chunks of a bf16 row */
    static constexpr int RP = NT / CH;                /* rows one pass of the block's loads covers */
    static constexpr int NR = TK / RP;                /* passes per tile */
    static constexpr int SCB = I8 ? 2 * TK * 4 + 16 : 0; /* INT8: K, V scales and kinds */
    static constexpr int STB = 2 * KB + SCB;          /* bytes per stage */
};

/* Issues the cp.async loads of the tile starting at key `base` (a multiple of 16) into stage
 * `st`. blk: the block-table entries of this thread's rows (row j0 + r * RP). Keys at or past k1
 * are zero-filled. The rows of one 16-key group share their cache block (dm_ids loads the group's
 * entry once) and, RP being a multiple of 8, their swizzle, so a group's addresses are one wide
 * multiply and a few adds, and a bf16 pass is a compare and its two copies at constant offsets
 * (they had taken ~17 instructions a copy, a third of the one-token kernel's instructions: ncu at
 * 1 x 4120 keys, session 24). */
template <int HD, bool I8, int NW>
static __device__ __forceinline__ void dm_issue(unsigned char *st, const sf_k_attn &a, int kh, int base, int k1,
                                                const int (&blk)[dm_layout<HD, I8, NW>::NR], int ck, int j0)
{
    using Lo = dm_layout<HD, I8, NW>;
    constexpr int GP = Lo::RP >= 16 ? 1 : 16 / Lo::RP; /* passes per 16-key group */
    static_assert(Lo::RP * GP == 16 || Lo::RP % 16 == 0, "a pass's rows within one 16-key group");
    const int bs = a.kv.block_size, Hkv = a.Hkv;
    float *ks = (float *)(st + 2 * Lo::KB), *vs = ks + Lo::TK;
    int *kind = (int *)(vs + Lo::TK);
    const int lim = k1 - base - j0; /* row j0 + r * RP holds a key iff r * RP < lim */
    const int bstride = Hkv * bs * HD, rowoff = (kh * bs + j0) * HD + ck * 8; /* elements */
    const ptrdiff_t vdelta = a.kv.v - a.kv.k;
    const uint16_t *grp = a.kv.k;
#pragma unroll
    for (int r = 0; r < Lo::NR; r++) {
        const int j = j0 + r * Lo::RP, p = base + j;
        unsigned char *dk = st + j * Lo::ROWB, *dv = dk + Lo::KB;
        const bool valid = r * Lo::RP < lim;
        const int id = blk[r];
        /* the group's first key is base + 16 (r / GP), this row (r % GP) * RP past j0 in it */
        if (r % GP == 0) grp = a.kv.k + (int64_t)id * bstride + rowoff + ((base + 16 * (r / GP)) & (bs - 1)) * HD;
        if (I8 && valid && id >= a.kv.i8_base) {
            const int64_t row = ((int64_t)(id - a.kv.i8_base) * Hkv + kh) * bs + (p & (bs - 1));
            if (ck < HD / 16) {
                sf_cp_async16(dk + sw_i8<HD>(j, ck) * 16, (const int8_t *)a.kv.k + row * HD + ck * 16, 16);
                sf_cp_async16(dv + sw_i8<HD>(j, ck) * 16, (const int8_t *)a.kv.v + row * HD + ck * 16, 16);
            }
            if (ck == 0) {
                sf_cp_async4(ks + j, a.kv.k_scale + row);
                sf_cp_async4(vs + j, a.kv.v_scale + row);
                if ((j & 15) == 0) kind[j >> 4] = 1;
            }
        } else {
            /* j & 7 == j0 & 7 where RP is a multiple of 8: the swizzle is the thread's own */
            const int sw = (Lo::RP % 8 == 0 ? sw_bf(j0, ck) : sw_bf(j, ck)) * 16;
            /* masked rows of INT8-capable instances: their group's entry may be an INT8 unit */
            const uint16_t *src = I8 && !valid ? a.kv.k : grp + (r % GP) * Lo::RP * HD;
            /* dk + sw, written as the thread's constant part plus the pass's constant offset:
             * as dk + sw the compiler recomputed it each pass (22 more PTX instructions a tile) */
            sf_cp_async16((r * Lo::RP) * Lo::ROWB + (st + j0 * Lo::ROWB + sw), src, valid ? 16 : 0);
            sf_cp_async16((r * Lo::RP) * Lo::ROWB + Lo::KB + (st + j0 * Lo::ROWB + sw), src + vdelta, valid ? 16 : 0);
            if (I8 && ck == 0) {
                if (!valid) ks[j] = vs[j] = 0.0f; /* the weights of masked keys stay 0 */
                if ((j & 15) == 0) kind[j >> 4] = 0;
            }
        }
    }
}

template <int HD, bool I8, int NW>
static __device__ __forceinline__ void dm_ids(int (&blk)[dm_layout<HD, I8, NW>::NR], const int32_t *bt, int lbs, int base,
                                              int k1, int j0)
{
    using Lo = dm_layout<HD, I8, NW>;
#pragma unroll
    for (int r = 0; r < Lo::NR; r++) {
        /* rows of one 16-key group are in one block (blocks are >= 16 keys and tiles start at
         * multiples of 16): one load per group */
        const int p = base + j0 + r * Lo::RP;
        if (Lo::RP >= 16 || (r * Lo::RP) % 16 == 0) blk[r] = p < k1 ? __ldg(bt + (p >> lbs)) : 0;
        else blk[r] = blk[r - 1];
    }
}

/* One warp's 16 keys (tile rows 16w .. 16w + 15, keys kb ..) into its softmax state and O^T. */
template <int HD, bool I8, int NW>
static __device__ __forceinline__ void dm_compute(const unsigned char *st, int w, int kb, int k1, float qs,
                                                  const uint32_t (&qb)[HD / 16][2], const uint32_t (&qh)[I8 ? HD / 16 : 1][2],
                                                  float (&m)[2], float (&l)[2], float (&o)[HD / 16][4])
{
    using Lo = dm_layout<HD, I8, NW>;
    const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const float *ksm = (const float *)(st + 2 * Lo::KB), *vsm = ksm + Lo::TK;
    const int *kind = (const int *)(vsm + Lo::TK);
    const bool i8 = I8 && kind[w];
    const unsigned char *sk = st, *sv = st + Lo::KB;
    const int r0 = 16 * w + g, r1 = r0 + 8; /* this lane's K rows */

    /* S^T[key][head] = K . Q^T; logical k index (2c, 2c+1 | 2c+8, 2c+9) of step s = row dims
     * c*hd/4 + 4s + (0, 1 | 2, 3) */
    float sc[4] = { 0.0f, 0.0f, 0.0f, 0.0f }, sd[4] = { 0.0f, 0.0f, 0.0f, 0.0f }; /* two chains */
    if (!i8) {
        constexpr int KC = HD / 32;
        uint4 x0[KC], x1[KC];
#pragma unroll
        for (int q = 0; q < KC; q++) {
            x0[q] = *(const uint4 *)(sk + r0 * Lo::ROWB + sw_bf(r0, c * KC + q) * 16);
            x1[q] = *(const uint4 *)(sk + r1 * Lo::ROWB + sw_bf(r1, c * KC + q) * 16);
        }
#pragma unroll
        for (int s = 0; s < HD / 16; s++) {
            const int q = s >> 1, wd = (s & 1) * 2;
            mma4<false>(s & 1 ? sd : sc, u4w(x0[q], wd), u4w(x1[q], wd), u4w(x0[q], wd + 1), u4w(x1[q], wd + 1), qb[s][0],
                     qb[s][1]);
        }
    } else {
        constexpr int KC = HD / 64;
        uint4 x0[KC], x1[KC];
#pragma unroll
        for (int q = 0; q < KC; q++) {
            x0[q] = *(const uint4 *)(sk + r0 * Lo::ROWB + sw_i8<HD>(r0, c * KC + q) * 16);
            x1[q] = *(const uint4 *)(sk + r1 * Lo::ROWB + sw_i8<HD>(r1, c * KC + q) * 16);
        }
#pragma unroll
        for (int s = 0; s < HD / 16; s++) {
            const uint32_t w0 = u4w(x0[s >> 2], s & 3) ^ 0x80808080u, w1 = u4w(x1[s >> 2], s & 3) ^ 0x80808080u;
            mma4<true>(s & 1 ? sd : sc, i8x2_h2(w0, 0x4140u), i8x2_h2(w1, 0x4140u), i8x2_h2(w0, 0x4342u),
                      i8x2_h2(w1, 0x4342u), qh[I8 ? s : 0][0], qh[I8 ? s : 0][1]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) sc[i] += sd[i];

    /* online softmax per head (columns 2c, 2c+1), base 2 */
    float ks0 = 1.0f, ks1 = 1.0f;
    if (i8) { ks0 = ksm[r0]; ks1 = ksm[r1]; }
    const bool v0 = kb + g < k1, v1 = kb + g + 8 < k1;
    float s00 = v0 ? sc[0] * qs * ks0 : -INFINITY, s01 = v0 ? sc[1] * qs * ks0 : -INFINITY;
    float s10 = v1 ? sc[2] * qs * ks1 : -INFINITY, s11 = v1 ? sc[3] * qs * ks1 : -INFINITY;
    float mx0 = fmaxf(s00, s10), mx1 = fmaxf(s01, s11);
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    /* key kb is valid (the caller skips empty subtiles), so mx0 and mx1 are finite */
    const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
    const float al0 = exp2f(m[0] - mn0), al1 = exp2f(m[1] - mn1);
    float p00 = exp2f(s00 - mn0), p01 = exp2f(s01 - mn1), p10 = exp2f(s10 - mn0), p11 = exp2f(s11 - mn1);
    l[0] = l[0] * al0 + p00 + p10;
    l[1] = l[1] * al1 + p01 + p11;
    m[0] = mn0;
    m[1] = mn1;
#pragma unroll
    for (int j = 0; j < HD / 16; j++) {
        o[j][0] *= al0; o[j][1] *= al1; o[j][2] *= al0; o[j][3] *= al1;
    }
    if (i8) { /* the V scale rides on the weight (the sum l does not take it) */
        const float vs0 = vsm[r0], vs1 = vsm[r1];
        p00 *= vs0; p01 *= vs0; p10 *= vs1; p11 *= vs1;
    }
    /* P^T as the B operand: bf16 for bf16 rows, fp16 for INT8 rows (the V scale makes p small) */
    const uint32_t b0 = sf_movmatrix_trans(i8 ? sf_pack_f16(p00, p01) : sf_pack_bf16(p00, p01));
    const uint32_t b1 = sf_movmatrix_trans(i8 ? sf_pack_f16(p10, p11) : sf_pack_bf16(p10, p11));

    /* O^T += V^T . P^T; output dim rows (g | g+8) of tile j = row dims (e, e + 1) of lane g's run,
     * e = 8 * (g + 8 * (j / 4)) + 2 * (j % 4); keys (2c, 2c+1 | 2c+8, 2c+9) */
    const int q0 = 16 * w + 2 * c;
    const int rows[4] = { q0, q0 + 1, q0 + 8, q0 + 9 };
    if (!i8) {
        constexpr int VC = HD / 64;
        uint4 y[4][VC];
#pragma unroll
        for (int rr = 0; rr < 4; rr++)
#pragma unroll
            for (int q = 0; q < VC; q++)
                y[rr][q] = *(const uint4 *)(sv + rows[rr] * Lo::ROWB + sw_bf(rows[rr], g + 8 * q) * 16);
#pragma unroll
        for (int j = 0; j < HD / 16; j++) {
            const int q = j >> 2, wi = j & 3;
            const uint32_t w0 = u4w(y[0][q], wi), w1 = u4w(y[1][q], wi), w2 = u4w(y[2][q], wi), w3 = u4w(y[3][q], wi);
            mma4<false>(o[j], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), __byte_perm(w2, w3, 0x5410),
                     __byte_perm(w2, w3, 0x7632), b0, b1);
        }
    } else {
        constexpr int VC = HD / 64;
        uint2 y[4][VC];
#pragma unroll
        for (int rr = 0; rr < 4; rr++)
#pragma unroll
            for (int q = 0; q < VC; q++)
                y[rr][q] = *(const uint2 *)(sv + rows[rr] * Lo::ROWB + sw_i8<HD>(rows[rr], (g >> 1) + 4 * q) * 16 +
                                            (g & 1) * 8);
#pragma unroll
        for (int j = 0; j < HD / 16; j += 2) {
            /* tiles j, j + 1: bytes 0..3 of one word of each of the 4 rows; keys 2c and 2c+1 (and
             * 2c+8, 2c+9) interleaved first, so one permute then picks a key pair of a byte */
            const int q = j >> 2, wi = j & 3;
            const uint32_t w0 = (wi < 2 ? y[0][q].x : y[0][q].y) ^ 0x80808080u,
                           w1 = (wi < 2 ? y[1][q].x : y[1][q].y) ^ 0x80808080u,
                           w2 = (wi < 2 ? y[2][q].x : y[2][q].y) ^ 0x80808080u,
                           w3 = (wi < 2 ? y[3][q].x : y[3][q].y) ^ 0x80808080u;
            const uint32_t lo01 = __byte_perm(w0, w1, 0x5140), hi01 = __byte_perm(w0, w1, 0x7362);
            const uint32_t lo23 = __byte_perm(w2, w3, 0x5140), hi23 = __byte_perm(w2, w3, 0x7362);
            mma4<true>(o[j], i8x2_h2(lo01, 0x4140u), i8x2_h2(lo01, 0x4342u), i8x2_h2(lo23, 0x4140u),
                      i8x2_h2(lo23, 0x4342u), b0, b1);
            mma4<true>(o[j + 1], i8x2_h2(hi01, 0x4140u), i8x2_h2(hi01, 0x4342u), i8x2_h2(hi23, 0x4140u),
                      i8x2_h2(hi23, 0x4342u), b0, b1);
        }
    }
}

/* q of head g of the group as dm_compute's B fragments: qp points at this lane's HD / 4
 * consecutive dims (c * HD / 4 ..: the K rows' permuted order) in global or shared memory; zeros
 * for padded heads (valid false). INT8 rows multiply in fp16 (int8 widens to fp16 in two
 * instructions), so the I8 instance also gets q as fp16 (qh). */
template <int HD, bool I8>
static __device__ __forceinline__ void dm_q_frags(const uint16_t *qp, bool valid, uint32_t (&qb)[HD / 16][2],
                                                  uint32_t (&qh)[I8 ? HD / 16 : 1][2])
{
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
        uint2 v = make_uint2(0u, 0u);
        if (valid) v = *(const uint2 *)(qp + 4 * s);
        qb[s][0] = v.x;
        qb[s][1] = v.y;
    }
#pragma unroll
    for (int s = 0; s < (I8 ? HD / 16 : 1); s++)
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float2 f = __bfloat1622float2(*(const bf162 *)&qb[s][k]);
            qh[s][k] = I8 ? sf_pack_f16(f.x, f.y) : 0u;
        }
}

/* Bytes of dm_merge_warps' scratch: o [NW][8][HD], then (m, l) [NW][8][2], then the split merge's
 * weights [8][DM_MAX_SPLIT] (sf_attn_split_finish). */
template <int HD, int NW>
struct dm_scratch {
    static constexpr int BYTES = (NW * 8 * (HD + 2) + 8 * DM_MAX_SPLIT) * 4;
};

/* Combines the NW warps' online-softmax states (m, l per column pair, o as O^T fragments) into
 * one (O unnormalised, M in base 2, L) per query head g < G of the group and dimension d, passed
 * to store(g, d, O, M, L) by the thread that owns (g, d). scratch: dm_scratch bytes of shared
 * memory no warp reads or writes any more (the caller synchronises before); every thread of the
 * block calls it. On return *wsm points past o and (m, l): the split merge's weights. */
template <int HD, int NW, class Store>
static __device__ __forceinline__ void dm_merge_warps(unsigned char *scratch, int G, float (&m)[2], float (&l)[2],
                                                      float (&o)[HD / 16][4], float **wsm, const Store &store)
{
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
    /* the warp's l over its lanes (each lane summed its own keys) */
#pragma unroll
    for (int x = 4; x < 32; x <<= 1) {
        l[0] += __shfl_xor_sync(0xffffffffu, l[0], x);
        l[1] += __shfl_xor_sync(0xffffffffu, l[1], x);
    }
    float *o_s = (float *)scratch;   /* [NW][8][HD] */
    float *ml_s = o_s + NW * 8 * HD; /* [NW][8][2] */
    *wsm = ml_s + NW * 8 * 2;        /* [8][DM_MAX_SPLIT] */
#pragma unroll
    for (int j = 0; j < HD / 16; j++) {
        const int e = 8 * (g + 8 * (j >> 2)) + 2 * (j & 3);
        float *oh = o_s + (w * 8 + 2 * c) * HD + e;
        oh[0] = o[j][0];
        oh[HD] = o[j][1];
        oh[1] = o[j][2];
        oh[HD + 1] = o[j][3];
    }
    if (g == 0) {
        ml_s[(w * 8 + 2 * c) * 2] = m[0];
        ml_s[(w * 8 + 2 * c) * 2 + 1] = l[0];
        ml_s[(w * 8 + 2 * c + 1) * 2] = m[1];
        ml_s[(w * 8 + 2 * c + 1) * 2 + 1] = l[1];
    }
    __syncthreads();
    for (int idx = tid; idx < G * HD; idx += 32 * NW) {
        const int hg = idx / HD, d = idx - hg * HD;
        float M = -INFINITY;
#pragma unroll
        for (int v = 0; v < NW; v++) M = fmaxf(M, ml_s[(v * 8 + hg) * 2]);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY) {
#pragma unroll
            for (int v = 0; v < NW; v++) {
                const float e = exp2f(ml_s[(v * 8 + hg) * 2] - M);
                L = fmaf(ml_s[(v * 8 + hg) * 2 + 1], e, L);
                O = fmaf(o_s[(v * 8 + hg) * HD + d], e, O);
            }
        }
        store(hg, d, O, M, L);
    }
}

#endif
