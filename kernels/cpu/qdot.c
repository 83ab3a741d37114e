/* qdot.c — GGUF block formats read in place: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS and the
 * K-quants Q2_K..Q6_K (llama.cpp's Q2_K, Q3_K_*, Q4_K_*, Q5_K_* and Q6_K files): the one-token dot
 * products of the matmul, and rows into fp32 for the many-token path.
 *
 * Layouts (hal/quant.c has them all):
 *   Q8_0 (32, 34 B): d f16, 32 int8: w = d q.
 *   Q4_0, IQ4_NL (32, 18 B): d f16, 16 bytes of nibbles (elements 0-15 low, 16-31 high):
 *        w = d (q - 8), or d kvalues[q] (a fixed table of 16 levels).
 *   Q4_1 (32, 20 B): d, m f16, 16 bytes of nibbles: w = d q + m.
 *   Q5_0 (32, 22 B): d f16, 32 fifth bits (bit l: element l), 16 bytes of nibbles: w = d (q - 16).
 *   Q5_1 (32, 24 B): d, m f16, 32 fifth bits, 16 bytes of nibbles: w = d q + m.
 *   IQ4_XS (256, 136 B): d f16, 8 6-bit group scales ls in 6 bytes, 8 groups of IQ4_NL nibbles:
 *        w = d (ls - 32) kvalues[q].
 *   Q2_K (256, 84 B): 16 bytes of 4-bit scale | 4-bit min (per 16), 64 bytes of 2-bit q, d, dmin:
 *        w = d sc_i q - dmin m_i.
 *   Q3_K (256, 110 B): 32 bytes of third bits, 64 bytes of 2-bit q, 16 6-bit scales in 12 bytes,
 *        d: w = d (sc_i - 32) q, q = low2 - (third bit clear ? 4 : 0).
 *   Q4_K (256, 144 B): d, dmin f16; 8 6-bit scales and mins in 12 bytes; then 4 x 32 bytes
 *        whose low nibbles are 32-group 2g and high nibbles group 2g + 1: w = d sc_j q - dmin m_j.
 *   Q5_K (256, 176 B): as Q4_K, with 32 bytes of fifth bits @16 (bit j of byte l: element l of
 *        group j) and the nibbles @48.
 *   Q6_K (256, 210 B): ql[128] low nibbles, qh[64] 2-bit high parts, 16 int8 scales (one per
 *        16 weights), d f16: w = d sc (q - 32), q 6 bits.
 *
 * One token: x is quantized once per matmul call to int8 in groups of 32 (dx_j = max |x| / 127,
 * as llama.cpp's Q8 activations, but with a scale per 32 rather than per 256), and the quants
 * meet it in integer multiply-adds (maddubs: unsigned quant x signed x, 32 products in one
 * instruction; Q8_0's signed quants lend their sign to x); each group's sum is scaled by its
 * weight scale times dx_j in fp32. The offsets (Q2_K's and Q4_K's mins, Q3_K's 4, Q6_K's 32) multiply the rounded
 * x's sums over 16 or 32 elements, which prep also keeps (the exact sums would leave the
 * rounding of x times the quants' mean: twice the error). Each output is then exact against x
 * so rounded, and 0.3-1% off the dot product with x itself (test_cpu_ops), 0.2-1% in a
 * model's logits (test_forward's random two-layer models): as in llama.cpp, and a tenth of a
 * 4-bit format's own quantization error. A float kernel (quants to fp32, FMA against x) did
 * 3.9 weights a cycle a core out of cache (Q4_K), under the memory's speed.
 *
 * Many tokens (prefill): rows into fp32 (sf_cpu_kq_row_to_f32, sf_cpu_row_to_f32) and the fp32
 * kernel, exact. */
#include "cpu.h"
#include "../../hal/quant.h"

/* Software prefetch distance of each row's stream, in bytes: without it the kernels read
 * 7.3 GB/s a core from memory against 15 from the last-level cache (a Zen 4 VM, 2048-column
 * rows; 1024 bytes ahead: 7.8, 4096: 14.9 for Q4_K, 8192: 14.0 for Q6_K). */
#define PF_Q8 4096
#define PF_Q4K 4096
#define PF_Q6K 8192

__attribute__((target("avx2,fma,f16c")))
static inline float f16le(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* the prepared x: k int8 (k / 4 floats' room), then dx per 32, sums per 32, sums per 16 */
#define PX_X8(xp) ((const int8_t *)(xp))
#define PX_DX(xp, k) ((xp) + (k) / 4)
#define PX_S32(xp, k) ((xp) + (k) / 4 + (k) / 32)
#define PX_S16(xp, k) ((xp) + (k) / 4 + (k) / 16)

int64_t sf_cpu_kq_prep_floats(int64_t k) { return k / 4 + k / 32 + k / 32 + k / 16; }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_kq_prep_x(const float *x, int64_t k, float *xp)
{
    int8_t *x8 = (int8_t *)xp;
    float *dx = PX_DX(xp, k), *s32 = PX_S32(xp, k), *s16 = PX_S16(xp, k);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t j = 0; j < k / 32; j++) {
        const float *g = x + 32 * j;
        __m256 v[4] = { _mm256_loadu_ps(g), _mm256_loadu_ps(g + 8), _mm256_loadu_ps(g + 16), _mm256_loadu_ps(g + 24) };
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        dx[j] = amax / 127.0f;
        __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
        /* 32 int32 -> 32 int8 in order: the packs interleave 128-bit lanes, one permute undoes it */
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(x8 + 32 * j), p);
        /* the sums of x as rounded, so that an offset cancels exactly against the quants' products */
        __m256 r = _mm256_set1_ps(dx[j]);
        s16[2 * j] = sf_cpu_hsum8(_mm256_mul_ps(r, _mm256_cvtepi32_ps(_mm256_add_epi32(q[0], q[1]))));
        s16[2 * j + 1] = sf_cpu_hsum8(_mm256_mul_ps(r, _mm256_cvtepi32_ps(_mm256_add_epi32(q[2], q[3]))));
        s32[j] = s16[2 * j] + s16[2 * j + 1];
    }
}

/* the 8 int32 sums of 4 products each of 32 unsigned quants q with 32 int8 of x */
__attribute__((target("avx2,fma,f16c")))
static inline __m256 qdot32(__m256i q, const int8_t *x8)
{
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)x8));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

/* Q6_K's quants (0..63) of 128-half h of block b, its four 32-groups in order: group kk takes
 * ql[32 (kk & 1) + l]'s nibble kk >> 1 and bits 2kk..2kk+1 of qh[l] (moved to bits 4-5) */
__attribute__((target("avx2,fma,f16c")))
static inline void q6k_quants(const uint8_t *b, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(hb, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
}

/* A Q4_K / Q5_K super-block's 8 group scales (d folded in by the caller, with x's dx) and its
 * mins times dmin. Shared by the one-token and the many-token kernels, whose arithmetic must
 * stay the same to the bit. */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void q45k_scales(const uint8_t *b, __m256 *scales, __m256 *dmins)
{
    uint8_t sm[16];
    sf_q4k_scales(b + 4, sm);
    *scales = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm)));
    __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 8))));
    *dmins = _mm256_mul_ps(_mm256_set1_ps(f16le(b + 2)), mins);
}

/* Group pair g's quants (group 2g in ql, 2g + 1 in qh) from its 32 bytes v; Q5_K (five): their
 * fifth bits from hb, which moves on to the next pair */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void q45k_pair(__m256i v, __m256i *hb, int five, __m256i *ql, __m256i *qh)
{
    const __m256i m4 = _mm256_set1_epi8(0xF), m10 = _mm256_set1_epi8(0x10);
    *ql = _mm256_and_si256(v, m4);
    *qh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (five) { /* bit 2g to bit 4 of each byte, then bit 2g + 1 */
        *ql = _mm256_or_si256(*ql, _mm256_and_si256(_mm256_slli_epi16(*hb, 4), m10));
        *qh = _mm256_or_si256(*qh, _mm256_and_si256(_mm256_slli_epi16(*hb, 3), m10));
        *hb = _mm256_srli_epi16(*hb, 2);
    }
}

/* Q4_K and Q5_K (five: a fifth bit of each quant from the 32 bytes of qh, bit j for group j) */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void dot4_q45_K(const void *const *w, const float *xp, int64_t k, float *out, int five)
{
    const int8_t *x8 = PX_X8(xp);
    const float *dx = PX_DX(xp, k), *s32 = PX_S32(xp, k);
    const size_t bb = five ? 176 : 144, qs0 = five ? 48 : 16;
    __m256 acc[4][2], accm[4];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = accm[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const int8_t *xs = x8 + 256 * sb;
        __m256 dxv = _mm256_loadu_ps(dx + 8 * sb), sums = _mm256_loadu_ps(s32 + 8 * sb);
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = (const uint8_t *)w[r] + bb * sb;
            for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + PF_Q4K + l, _MM_HINT_T0);
            __m256 scales, dmins;
            q45k_scales(b, &scales, &dmins);
            float sc[8];
            _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(f16le(b)), dxv), scales));
            accm[r] = _mm256_fmadd_ps(dmins, sums, accm[r]);
            __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
            __m256 a0 = acc[r][0], a1 = acc[r][1];
            for (int g = 0; g < 4; g++) {
                __m256i ql, qh;
                q45k_pair(_mm256_loadu_si256((const __m256i *)(b + qs0 + 32 * g)), &hb, five, &ql, &qh);
                __m256 lo = qdot32(ql, xs + 64 * g), hi = qdot32(qh, xs + 64 * g + 32);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * g]), lo, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * g + 1]), hi, a1);
            }
            acc[r][0] = a0;
            acc[r][1] = a1;
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sf_cpu_hsum8(_mm256_sub_ps(_mm256_add_ps(acc[r][0], acc[r][1]), accm[r]));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q4_K(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q45_K(w, xp, k, out, 0); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q5_K(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q45_K(w, xp, k, out, 1); }

/* One Q4_K or Q5_K row against nt prepared x rows (pf floats apart, nt <= SF_CPU_DIRECT_DOTN): a
 * super-block's scales and quants are unpacked once for all nt, each token's arithmetic being
 * dot4_q45_K's in its order, so that a token's result does not depend on the tokens beside it. */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void dotn_q45_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k,
                                                             float *out, int five)
{
    const size_t bb = five ? 176 : 144, qs0 = five ? 48 : 16;
    __m256 acc[SF_CPU_DIRECT_DOTN][3]; /* the low and high groups' sums, the mins' */
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = acc[t][2] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const uint8_t *b = (const uint8_t *)w + bb * sb;
        for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + PF_Q4K + l, _MM_HINT_T0);
        __m256 d = _mm256_set1_ps(f16le(b)), scales, dmins;
        q45k_scales(b, &scales, &dmins);
        __m256i q[8], hb = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++)
            q45k_pair(_mm256_loadu_si256((const __m256i *)(b + qs0 + 32 * g)), &hb, five, &q[2 * g], &q[2 * g + 1]);
        for (int t = 0; t < nt; t++) {
            const float *xp = xq + t * pf;
            const int8_t *xs = PX_X8(xp) + 256 * sb;
            float sc[8];
            _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(PX_DX(xp, k) + 8 * sb)), scales));
            acc[t][2] = _mm256_fmadd_ps(dmins, _mm256_loadu_ps(PX_S32(xp, k) + 8 * sb), acc[t][2]);
            __m256 a0 = acc[t][0], a1 = acc[t][1];
            for (int g = 0; g < 4; g++) {
                __m256 lo = qdot32(q[2 * g], xs + 64 * g), hi = qdot32(q[2 * g + 1], xs + 64 * g + 32);
                a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * g]), lo, a0);
                a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(&sc[2 * g + 1]), hi, a1);
            }
            acc[t][0] = a0;
            acc[t][1] = a1;
        }
    }
    for (int t = 0; t < nt; t++) out[t] = sf_cpu_hsum8(_mm256_sub_ps(_mm256_add_ps(acc[t][0], acc[t][1]), acc[t][2]));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q4_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    dotn_q45_K(w, xq, pf, nt, k, out, 0);
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q5_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    dotn_q45_K(w, xq, pf, nt, k, out, 1);
}

/* A Q8_0 group's 8 partial sums against x's 32 int8: |q| x (x with q's sign), maddubs wanting
 * its first operand unsigned (aq = |q|) */
__attribute__((target("avx2,fma,f16c")))
static inline __m256 q8_dot32(__m256i q, __m256i aq, __m256i xv)
{
    __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xv, q));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q8_0(const void *const *w, const float *xp, int64_t k, float *out)
{
    const int8_t *x8 = PX_X8(xp);
    const float *dx = PX_DX(xp, k);
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int64_t j = 0; j < k / 32; j++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x8 + 32 * j));
        __m256 dxj = _mm256_broadcast_ss(&dx[j]);
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = (const uint8_t *)w[r] + 34 * j;
            if (!(j & 1)) _mm_prefetch((const char *)b + PF_Q8, _MM_HINT_T0);
            __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2));
            __m256 s = q8_dot32(q, _mm256_sign_epi8(q, q), xv);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(f16le(b)), dxj), s, acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sf_cpu_hsum8(acc[r]);
}

/* One Q8_0 row against nt prepared x rows, as dotn_q45_K: each group's quants and scale read
 * once, each token's arithmetic sf_cpu_dot4_q8_0's in its order. */
__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q8_0(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    __m256 acc[SF_CPU_DIRECT_DOTN];
    for (int t = 0; t < nt; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < k / 32; j++) {
        const uint8_t *b = (const uint8_t *)w + 34 * j;
        if (!(j & 1)) _mm_prefetch((const char *)b + PF_Q8, _MM_HINT_T0);
        __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2)), aq = _mm256_sign_epi8(q, q);
        __m256 d = _mm256_set1_ps(f16le(b));
        for (int t = 0; t < nt; t++) {
            const float *xp = xq + t * pf;
            __m256 s = q8_dot32(q, aq, _mm256_loadu_si256((const __m256i *)(PX_X8(xp) + 32 * j)));
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_broadcast_ss(PX_DX(xp, k) + j)), s, acc[t]);
        }
    }
    for (int t = 0; t < nt; t++) out[t] = sf_cpu_hsum8(acc[t]);
}

/* The formats of 32-groups of nibbles: Q4_0 (d (q - 8)), Q4_1 (d q + m), Q5_0 and Q5_1 (a fifth
 * bit each: d (q - 16), d q + m), IQ4_NL (d kvalues[q]) and IQ4_XS (256-blocks of 8 such groups,
 * each with a 6-bit scale ls: d (ls - 32) kvalues[q]). A group's 16 bytes hold elements 0-15 in
 * their low nibbles and 16-31 in the high ones; the values, bytes, meet x as Q8_0's do, and
 * Q4_1's and Q5_1's m multiplies x's sum over the group. */
static inline size_t q32_bytes(sf_dtype t)
{
    switch (t) {
    case SF_DT_Q4_1: return 20;
    case SF_DT_Q5_0: return 22;
    case SF_DT_Q5_1: return 24;
    default: return 18;
    }
}

/* 32 bits (little-endian) as 32 bytes, 0x10 where the bit is set */
__attribute__((target("avx2,fma,f16c")))
static inline __m256i bits_to_0x10(const uint8_t *p)
{
    uint32_t h;
    memcpy(&h, p, 4);
    /* byte l gets source byte l / 8, then keeps only its bit l % 8 */
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                                  0x0101010101010101, 0));
    __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit), _mm256_set1_epi8(0x10));
}

/* group j of a row of t: its 32 values as bytes, its scale and its offset m (0 but for Q4_1, Q5_1) */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) __m256i q4_group(sf_dtype t, const uint8_t *row, int64_t j, float *scale,
                                                              float *m)
{
    const uint8_t *nib;
    *m = 0;
    if (t == SF_DT_IQ4_XS) {
        const uint8_t *b = row + 136 * (j / 8);
        int s = (int)(j % 8);
        *scale = f16le(b) * (float)sf_iq4xs_scale(b, s);
        nib = b + 8 + 16 * s;
    } else {
        const uint8_t *b = row + q32_bytes(t) * j;
        *scale = f16le(b);
        if (t == SF_DT_Q4_1 || t == SF_DT_Q5_1) *m = f16le(b + 2);
        nib = b + (t == SF_DT_Q4_1 ? 4 : t == SF_DT_Q5_0 ? 6 : t == SF_DT_Q5_1 ? 8 : 2);
    }
    __m128i v = _mm_loadu_si128((const __m128i *)nib);
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0xF));
    switch (t) {
    case SF_DT_Q4_0: return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
    case SF_DT_Q4_1: return q;
    case SF_DT_Q5_0: return _mm256_sub_epi8(_mm256_or_si256(q, bits_to_0x10(nib - 4)), _mm256_set1_epi8(16));
    case SF_DT_Q5_1: return _mm256_or_si256(q, bits_to_0x10(nib - 4));
    default: return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)sf_iq4nl_values)), q);
    }
}

__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void dot4_q4_32(const void *const *w, const float *xp, int64_t k, float *out, sf_dtype t)
{
    const int8_t *x8 = PX_X8(xp);
    const float *dx = PX_DX(xp, k), *s32 = PX_S32(xp, k);
    const size_t gb = q32_bytes(t); /* bytes a group, for the prefetch (IQ4_XS has its own loop) */
    const int with_m = t == SF_DT_Q4_1 || t == SF_DT_Q5_1;
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    float off[4] = { 0, 0, 0, 0 };
    for (int64_t j = 0; j < k / 32; j++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x8 + 32 * j));
        for (int r = 0; r < 4; r++) {
            const uint8_t *row = w[r];
            if (!(j & 3)) _mm_prefetch((const char *)row + gb * j + PF_Q4K, _MM_HINT_T0);
            float sc, m;
            __m256i v = q4_group(t, row, j, &sc, &m);
            /* Q4_1's and Q5_1's quants are unsigned already: no sign to move onto x */
            __m256i p = with_m ? _mm256_maddubs_epi16(v, xv) : _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xv, v));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc * dx[j]), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1))),
                                     acc[r]);
            if (with_m) off[r] += m * s32[j];
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sf_cpu_hsum8(acc[r]) + off[r];
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q4_0(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q4_32(w, xp, k, out, SF_DT_Q4_0); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q4_1(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q4_32(w, xp, k, out, SF_DT_Q4_1); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q5_0(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q4_32(w, xp, k, out, SF_DT_Q5_0); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q5_1(const void *const *w, const float *xp, int64_t k, float *out) { dot4_q4_32(w, xp, k, out, SF_DT_Q5_1); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_iq4_nl(const void *const *w, const float *xp, int64_t k, float *out)
{
    dot4_q4_32(w, xp, k, out, SF_DT_IQ4_NL);
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_iq4_xs(const void *const *w, const float *xp, int64_t k, float *out)
{
    /* a super-block's 8 scales unpacked at once (ls_g: 4 bits from bytes 4-7, 2 from bytes
     * 2-3) and multiplied by the 8 groups' dx in one go, rather than group by group */
    const int8_t *x8 = PX_X8(xp);
    const float *dx = PX_DX(xp, k);
    const __m256i lo_sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), hi_sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m128i table = _mm_loadu_si128((const __m128i *)sf_iq4nl_values);
    __m256 acc[4] = { _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps() };
    for (int64_t sb = 0; sb < k / 256; sb++) {
        float sc[4][8];
        const __m256 dx8 = _mm256_loadu_ps(dx + 8 * sb);
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = (const uint8_t *)w[r] + 136 * sb;
            _mm_prefetch((const char *)b + PF_Q4K, _MM_HINT_T0);
            _mm_prefetch((const char *)b + PF_Q4K + 64, _MM_HINT_T0);
            uint32_t l32, h16 = (uint32_t)(b[2] | b[3] << 8);
            memcpy(&l32, b + 4, 4);
            __m256i ls = _mm256_or_si256(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)l32), lo_sh), _mm256_set1_epi32(15)),
                                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)h16), hi_sh),
                                                                            _mm256_set1_epi32(3)), 4));
            __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))), _mm256_set1_ps(f16le(b)));
            _mm256_storeu_ps(sc[r], _mm256_mul_ps(s, dx8));
        }
        for (int g = 0; g < 8; g++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x8 + 256 * sb + 32 * g));
            for (int r = 0; r < 4; r++) {
                __m128i v = _mm_loadu_si128((const __m128i *)((const uint8_t *)w[r] + 136 * sb + 8 + 16 * g));
                __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0xF));
                q = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), q);
                __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(sc[r][g]), _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1))),
                                         acc[r]);
            }
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sf_cpu_hsum8(acc[r]);
}

/* Q2_K, Q3_K and Q6_K: every 16 elements have a scale of their own, and a 128-half's quants
 * come as four 32-groups (k16_quants), kept unsigned; the offset of each 16 (Q2_K's min, Q3_K's
 * 4, Q6_K's 32, times the scale) multiplies x's sum over them.
 *   Q2_K / Q3_K: group j is bit pair j of the half's 32 bytes; Q3_K's third bit (set: q = low2,
 *   clear: q = low2 - 4) is bit 4h + j of hmask[l], so q + 4 = low2 | bit << 2.
 *   Q6_K: group kk takes ql[32 (kk & 1) + l]'s nibble kk >> 1 and bits 2kk..2kk+1 of qh[l].
 * After the multiply-adds a group's first 16 elements are int32 lanes 0-3 and the next 16 lanes
 * 4-7, so its scales are the half's scale vector permuted (idx[j]). */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void k16_scales(sf_dtype t, const uint8_t *b, __m256 sc[2], __m256 off[2])
{
    if (t == SF_DT_Q2_K) { /* 4-bit scale | 4-bit min */
        __m128i raw = _mm_loadu_si128((const __m128i *)b), m = _mm_set1_epi8(0xF);
        __m128i lo = _mm_and_si128(raw, m), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m);
        __m256 d = _mm256_set1_ps(f16le(b + 80)), dmin = _mm256_set1_ps(f16le(b + 82));
        for (int h = 0; h < 2; h++) {
            /* (a byte shift takes an immediate: the unoptimized builds do not unroll this loop) */
            sc[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(lo, 8) : lo)));
            off[h] = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(hi, 8) : hi)));
        }
        return;
    }
    __m128i s;
    float d, o;
    if (t == SF_DT_Q3_K) { /* (each field read from its own format's place: a Q3_K block is 110 bytes) */
        uint32_t u[4];
        sf_q3k_scale_words(b + 96, u);
        s = _mm_sub_epi8(_mm_setr_epi32((int)u[0], (int)u[1], (int)u[2], (int)u[3]), _mm_set1_epi8(32));
        d = f16le(b + 108), o = 4.0f;
    } else {
        s = _mm_loadu_si128((const __m128i *)(b + 192)), d = f16le(b + 208), o = 32.0f;
    }
    for (int h = 0; h < 2; h++) {
        /* (a byte shift takes an immediate: the unoptimized builds do not unroll this loop) */
        sc[h] = _mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h ? _mm_srli_si128(s, 8) : s)));
        off[h] = _mm256_mul_ps(_mm256_set1_ps(o), sc[h]);
    }
}

__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void k16_quants(sf_dtype t, const uint8_t *b, int h, __m256i q[4])
{
    if (t == SF_DT_Q6_K) {
        q6k_quants(b, h, q);
        return;
    }
    int three = t == SF_DT_Q3_K;
    __m256i qs = _mm256_loadu_si256((const __m256i *)(b + (three ? 32 : 16) + 32 * h));
    __m256i hm = three ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        q[j] = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), _mm256_set1_epi8(3));
        if (three)
            q[j] = _mm256_or_si256(q[j], _mm256_and_si256(_mm256_slli_epi16(_mm256_srli_epi16(hm, 4 * h + j), 2), _mm256_set1_epi8(4)));
    }
}

static inline size_t k16_bytes(sf_dtype t) { return t == SF_DT_Q2_K ? 84 : t == SF_DT_Q3_K ? 110 : 210; }

__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void dot4_k16(const void *const *w, const float *xp, int64_t k, float *out,
                                                           sf_dtype t)
{
    const int8_t *x8 = PX_X8(xp);
    const float *dx = PX_DX(xp, k), *s16 = PX_S16(xp, k);
    const size_t bb = k16_bytes(t), pf = t == SF_DT_Q6_K ? PF_Q6K : PF_Q4K;
    __m256i idx[4];
    for (int j = 0; j < 4; j++) idx[j] = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
    __m256 acc[4][2], accm[4];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = accm[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        __m256 sum0 = _mm256_loadu_ps(s16 + 16 * sb), sum1 = _mm256_loadu_ps(s16 + 16 * sb + 8);
        for (int r = 0; r < 4; r++) {
            const uint8_t *b = (const uint8_t *)w[r] + bb * sb;
            for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + pf + l, _MM_HINT_T0);
            __m256 sc[2], off[2];
            k16_scales(t, b, sc, off);
            accm[r] = _mm256_fmadd_ps(off[0], sum0, _mm256_fmadd_ps(off[1], sum1, accm[r]));
            __m256 a0 = acc[r][0], a1 = acc[r][1];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                k16_quants(t, b, h, q);
                const int8_t *xs = x8 + 256 * sb + 128 * h;
                const float *dxs = dx + 8 * sb + 4 * h;
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(sc[h], idx[j]), _mm256_broadcast_ss(&dxs[j]));
                    __m256 p = qdot32(q[j], xs + 32 * j);
                    if (j & 1) a1 = _mm256_fmadd_ps(s, p, a1);
                    else a0 = _mm256_fmadd_ps(s, p, a0);
                }
            }
            acc[r][0] = a0;
            acc[r][1] = a1;
        }
    }
    for (int r = 0; r < 4; r++) out[r] = sf_cpu_hsum8(_mm256_sub_ps(_mm256_add_ps(acc[r][0], acc[r][1]), accm[r]));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q2_K(const void *const *w, const float *xp, int64_t k, float *out) { dot4_k16(w, xp, k, out, SF_DT_Q2_K); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q3_K(const void *const *w, const float *xp, int64_t k, float *out) { dot4_k16(w, xp, k, out, SF_DT_Q3_K); }

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dot4_q6_K(const void *const *w, const float *xp, int64_t k, float *out) { dot4_k16(w, xp, k, out, SF_DT_Q6_K); }

/* One Q2_K, Q3_K or Q6_K row against nt prepared x rows, as dotn_q45_K: a super-block's scales
 * and quants unpacked once, each token's arithmetic dot4_k16's in its order. */
__attribute__((target("avx2,fma,f16c")))
static inline __attribute__((always_inline)) void dotn_k16(const void *w, const float *xq, int64_t pf, int nt, int64_t k,
                                                           float *out, sf_dtype t)
{
    const size_t bb = k16_bytes(t), pfd = t == SF_DT_Q6_K ? PF_Q6K : PF_Q4K;
    __m256i idx[4];
    for (int j = 0; j < 4; j++) idx[j] = _mm256_setr_epi32(2 * j, 2 * j, 2 * j, 2 * j, 2 * j + 1, 2 * j + 1, 2 * j + 1, 2 * j + 1);
    __m256 acc[SF_CPU_DIRECT_DOTN][3];
    for (int u = 0; u < nt; u++) acc[u][0] = acc[u][1] = acc[u][2] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < k / 256; sb++) {
        const uint8_t *b = (const uint8_t *)w + bb * sb;
        for (size_t l = 0; l < bb; l += 64) _mm_prefetch((const char *)b + pfd + l, _MM_HINT_T0);
        __m256 sc[2], off[2];
        k16_scales(t, b, sc, off);
        __m256i q[2][4];
        k16_quants(t, b, 0, q[0]);
        k16_quants(t, b, 1, q[1]);
        for (int u = 0; u < nt; u++) {
            const float *xp = xq + u * pf, *s16 = PX_S16(xp, k) + 16 * sb;
            acc[u][2] = _mm256_fmadd_ps(off[0], _mm256_loadu_ps(s16), _mm256_fmadd_ps(off[1], _mm256_loadu_ps(s16 + 8), acc[u][2]));
            __m256 a0 = acc[u][0], a1 = acc[u][1];
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                const int8_t *xs = PX_X8(xp) + 256 * sb + 128 * h;
                const float *dxs = PX_DX(xp, k) + 8 * sb + 4 * h;
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    __m256 s = _mm256_mul_ps(_mm256_permutevar8x32_ps(sc[h], idx[j]), _mm256_broadcast_ss(&dxs[j]));
                    __m256 p = qdot32(q[h][j], xs + 32 * j);
                    if (j & 1) a1 = _mm256_fmadd_ps(s, p, a1);
                    else a0 = _mm256_fmadd_ps(s, p, a0);
                }
            }
            acc[u][0] = a0;
            acc[u][1] = a1;
        }
    }
    for (int u = 0; u < nt; u++) out[u] = sf_cpu_hsum8(_mm256_sub_ps(_mm256_add_ps(acc[u][0], acc[u][1]), acc[u][2]));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q2_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    dotn_k16(w, xq, pf, nt, k, out, SF_DT_Q2_K);
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q3_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    dotn_k16(w, xq, pf, nt, k, out, SF_DT_Q3_K);
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_dotn_q6_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out)
{
    dotn_k16(w, xq, pf, nt, k, out, SF_DT_Q6_K);
}

/* ---- rows into fp32, in the natural order (the many-token path) ------------------------- */
/* 32 unsigned quants into y as q * s0 - m0 (elements 0-15) and q * s1 - m1 (16-31) */
__attribute__((target("avx2,fma,f16c")))
static inline void store32(float *y, __m256i q, float s0, float m0, float s1, float m1)
{
    __m128i a = _mm256_castsi256_si128(q), c = _mm256_extracti128_si256(q, 1);
    __m128i parts[4] = { a, _mm_srli_si128(a, 8), c, _mm_srli_si128(c, 8) };
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[i])),
                                                     _mm256_set1_ps(i < 2 ? s0 : s1), _mm256_set1_ps(i < 2 ? m0 : m1)));
}

__attribute__((target("avx2,fma,f16c")))
void sf_cpu_kq_row_to_f32(sf_dtype t, const void *src, int64_t k, float *y)
{
    const uint8_t *b = src;
    if (t == SF_DT_Q2_K || t == SF_DT_Q3_K || t == SF_DT_Q6_K) {
        for (int64_t sb = 0; sb < k / 256; sb++, b += k16_bytes(t), y += 256) {
            __m256 sc[2], off[2];
            k16_scales(t, b, sc, off);
            float fs[16], fo[16];
            for (int h = 0; h < 2; h++) {
                _mm256_storeu_ps(fs + 8 * h, sc[h]);
                _mm256_storeu_ps(fo + 8 * h, off[h]);
            }
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                k16_quants(t, b, h, q);
                for (int j = 0; j < 4; j++) {
                    int i = 8 * h + 2 * j; /* the scales of its elements 0-15, 16-31 */
                    store32(y + 128 * h + 32 * j, q[j], fs[i], fo[i], fs[i + 1], fo[i + 1]);
                }
            }
        }
        return;
    }
    if (t != SF_DT_Q4_K && t != SF_DT_Q5_K) { /* the formats of 32-groups */
        for (int64_t j = 0; j < k / 32; j++, y += 32) {
            float sc, m;
            __m256i v = q4_group(t, b, j, &sc, &m);
            __m128i a = _mm256_castsi256_si128(v), c = _mm256_extracti128_si256(v, 1);
            __m128i parts[4] = { a, _mm_srli_si128(a, 8), c, _mm_srli_si128(c, 8) };
            for (int i = 0; i < 4; i++)
                _mm256_storeu_ps(y + 8 * i, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[i])), _mm256_set1_ps(sc),
                                                            _mm256_set1_ps(m)));
        }
        return;
    }
    /* SF_DT_Q4_K, SF_DT_Q5_K */
    const __m256i m4 = _mm256_set1_epi8(0xF), m10 = _mm256_set1_epi8(0x10);
    int five = t == SF_DT_Q5_K;
    for (int64_t sb = 0; sb < k / 256; sb++, b += five ? 176 : 144, y += 256) {
        uint8_t sm[16];
        sf_q4k_scales(b + 4, sm);
        float d = f16le(b), dmin = f16le(b + 2);
        __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + (five ? 48 : 16) + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m10));
                hb = _mm256_srli_epi16(hb, 2);
            }
            float s0 = d * sm[2 * g], m0 = dmin * sm[8 + 2 * g], s1 = d * sm[2 * g + 1], m1 = dmin * sm[8 + 2 * g + 1];
            store32(y + 64 * g, lo, s0, m0, s0, m0);
            store32(y + 64 * g + 32, hi, s1, m1, s1, m1);
        }
    }
}
