/* quant.c — GGUF's block formats into fp32, for the weights of GGUF files that are neither
 * float nor Q8_0 (Q8_0 has its own kernels; it is here too, for completeness). The IQ formats
 * other than IQ4_NL and IQ4_XS (lattice codebooks of hundreds of entries) are not read.
 *
 * Every format stores a block of 32 or 256 weights as small integers q with scales: the
 * "_0" formats give w = d * q (q centred), "_1" w = d * q + m, and the K-quants (super-blocks
 * of 256 made of 16 or 8 sub-blocks) w = d * s_j * q - dmin * m_j, with the sub-block scales
 * s_j and mins m_j themselves quantized against the fp16 d and dmin. Multi-byte fields are
 * little-endian, as GGUF is. Layouts, byte offsets within a block:
 *   Q4_0 (32, 18 B): d f16 @0, 16 bytes of nibbles @2; w[i] = d (lo(i) - 8), w[i+16] = d (hi(i) - 8)
 *   Q4_1 (32, 20 B): d @0, m @2, nibbles @4
 *   Q5_0 (32, 22 B): d @0, 32 fifth bits (u32) @2, nibbles @6; q = nibble | bit << 4, less 16
 *   Q5_1 (32, 24 B): d @0, m @2, fifth bits @4, nibbles @8
 *   Q8_0 (32, 34 B): d @0, 32 int8 @2
 *   Q2_K (256, 84 B): 16 bytes of 4-bit scale | 4-bit min @0, 64 bytes of 2-bit q @16, d @80, dmin @82
 *   Q3_K (256, 110 B): 32 bytes of high bits @0, 64 bytes of 2-bit q @32, 16 6-bit scales
 *        (less 32) in 12 bytes @96, d @108; q is 2 bits minus 4 where its high bit is clear
 *   Q4_K (256, 144 B): d @0, dmin @2, 8 6-bit scales and mins in 12 bytes @4, nibbles @16
 *   Q5_K (256, 176 B): as Q4_K, with 32 bytes of fifth bits @16 and the nibbles @48
 *   Q6_K (256, 210 B): low nibbles @0, 2-bit high parts @128, 16 int8 scales @192, d @208; q less 32
 *   IQ4_NL (32, 18 B): as Q4_0, but a nibble indexes a fixed non-linear table (sf_iq4nl_values) instead of
 *        counting from -8
 *   IQ4_XS (256, 136 B): d @0, the high 2 bits of 8 6-bit sub-block scales (u16) @2, their low
 *        nibbles @4, then 8 sub-blocks of IQ4_NL nibbles @8; a sub-block's scale is d (s - 32)
 * The order of weights inside a block follows ggml: in the 2-bit formats each byte serves
 * four weights 32 apart (bit pairs 0-1, 2-3, 4-5, 6-7), in the 4-bit ones two weights 32 apart
 * (low, high nibble) — 16 apart in Q4_0..Q5_1. */
#include "hal.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

static float f16at(const uint8_t *p) { return sf_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t u32at(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static void q4_0(const uint8_t *b, float *y)
{
    float d = f16at(b);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((b[2 + i] & 15) - 8);
        y[i + 16] = d * (float)((b[2 + i] >> 4) - 8);
    }
}

static void q4_1(const uint8_t *b, float *y)
{
    float d = f16at(b), m = f16at(b + 2);
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)(b[4 + i] & 15) + m;
        y[i + 16] = d * (float)(b[4 + i] >> 4) + m;
    }
}

/* Q5_0 (off 16, no min) and Q5_1 (off 0, min) */
static void q5(const uint8_t *b, float *y, int has_min)
{
    float d = f16at(b), m = has_min ? f16at(b + 2) : 0.0f;
    int off = has_min ? 0 : 16;
    const uint8_t *hb = b + (has_min ? 4 : 2), *qs = hb + 4;
    uint32_t h = u32at(hb);
    for (int i = 0; i < 16; i++) {
        int lo = (qs[i] & 15) | (int)((h >> i) & 1) << 4, hi = (qs[i] >> 4) | (int)((h >> (i + 16)) & 1) << 4;
        y[i] = d * (float)(lo - off) + m;
        y[i + 16] = d * (float)(hi - off) + m;
    }
}

static void q8_0(const uint8_t *b, float *y)
{
    float d = f16at(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(int8_t)b[2 + i];
}

static void q2_k(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *qs = b + 16;
    float d = f16at(b + 80), dmin = f16at(b + 82);
    for (int half = 0; half < 2; half++, qs += 32)
        for (int j = 0; j < 4; j++)        /* bit pair j of each byte */
            for (int g = 0; g < 2; g++) {  /* bytes 0-15, then 16-31: a sub-block of 16 each */
                int s = sc[half * 8 + 2 * j + g];
                float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * (float)((qs[16 * g + l] >> (2 * j)) & 3) - ml;
            }
}

static void q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *qs = b + 32, *ps = b + 96;
    float d = f16at(b + 108);
    int8_t scale[16];
    sf_q3k_scales(ps, scale);
    for (int half = 0; half < 2; half++, qs += 32)
        for (int j = 0; j < 4; j++) {
            int hbit = half * 4 + j;
            for (int g = 0; g < 2; g++) {
                float dl = d * (float)scale[half * 8 + 2 * j + g];
                for (int l = 16 * g; l < 16 * g + 16; l++) {
                    int q = ((qs[l] >> (2 * j)) & 3) - ((hm[l] >> hbit) & 1 ? 0 : 4);
                    *y++ = dl * (float)q;
                }
            }
        }
}

/* Q4_K (fifth = NULL) and Q5_K */
static void q45_k(const uint8_t *b, float *y, int five)
{
    float d = f16at(b), dmin = f16at(b + 2);
    const uint8_t *qh = five ? b + 16 : NULL, *qs = b + (five ? 48 : 16);
    uint8_t sm[16];
    sf_q4k_scales(b + 4, sm);
    for (int g = 0; g < 4; g++, qs += 32)
        for (int n = 0; n < 2; n++) { /* low nibbles, then high: sub-block 2g + n */
            float dl = d * (float)sm[2 * g + n], ml = dmin * (float)sm[8 + 2 * g + n];
            for (int l = 0; l < 32; l++) {
                int q = (qs[l] >> (4 * n)) & 15;
                if (qh) q |= ((qh[l] >> (2 * g + n)) & 1) << 4;
                *y++ = dl * (float)q - ml;
            }
        }
}

const int8_t sf_iq4nl_values[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

static void iq4_nibbles(const uint8_t *qs, float d, float *y)
{
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)sf_iq4nl_values[qs[i] & 15];
        y[i + 16] = d * (float)sf_iq4nl_values[qs[i] >> 4];
    }
}

static void iq4_xs(const uint8_t *b, float *y)
{
    float d = f16at(b);
    for (int s = 0; s < 8; s++) iq4_nibbles(b + 8 + 16 * s, d * (float)sf_iq4xs_scale(b, s), y + 32 * s);
}

static void q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16at(b + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8)
        for (int k = 0; k < 4; k++) /* rows 32 apart: low nibbles of ql[0..31], ql[32..63], then high */
            for (int l = 0; l < 32; l++) {
                int q = ((ql[l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) | ((qh[l] >> (2 * k)) & 3) << 4;
                *y++ = d * (float)sc[2 * k + l / 16] * (float)(q - 32);
            }
}

void sf_dequant_row(sf_dtype t, const void *src, int64_t n, float *dst)
{
    const uint8_t *b = src;
    int blk = sf_dtype_block(t);
    size_t bb = sf_dtype_bytes(t, blk);
    if (blk <= 1) return;
    for (int64_t i = 0; i + blk <= n; i += blk, b += bb, dst += blk) {
        switch (t) {
        case SF_DT_Q8_0: q8_0(b, dst); break;
        case SF_DT_Q4_0: q4_0(b, dst); break;
        case SF_DT_Q4_1: q4_1(b, dst); break;
        case SF_DT_Q5_0: q5(b, dst, 0); break;
        case SF_DT_Q5_1: q5(b, dst, 1); break;
        case SF_DT_Q2_K: q2_k(b, dst); break;
        case SF_DT_Q3_K: q3_k(b, dst); break;
        case SF_DT_Q4_K: q45_k(b, dst, 0); break;
        case SF_DT_Q5_K: q45_k(b, dst, 1); break;
        case SF_DT_Q6_K: q6_k(b, dst); break;
        case SF_DT_IQ4_NL: iq4_nibbles(b + 2, f16at(b), dst); break;
        case SF_DT_IQ4_XS: iq4_xs(b, dst); break;
        default: return;
        }
    }
}

int sf_dequant_rows(sf_dtype t, const void *src, size_t pitch, int64_t rows, int64_t cols, sf_dtype out_t,
                    uint16_t *out)
{
    float *row = malloc((size_t)cols * sizeof(float));
    if (!row) return SF_ENOMEM;
    for (int64_t r = 0; r < rows; r++, out += cols) {
        sf_dequant_row(t, (const char *)src + (size_t)r * pitch, cols, row);
        if (out_t == SF_DT_BF16)
            for (int64_t i = 0; i < cols; i++) out[i] = sf_f32_to_bf16(row[i]);
        else
            for (int64_t i = 0; i < cols; i++) out[i] = sf_f32_to_f16(row[i]);
    }
    free(row);
    return SF_OK;
}

static void put_f16(uint8_t *p, float v)
{
    uint16_t h = sf_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

/* Random bytes, then the scales set so that the weights' standard deviation is about 0.02 (u
 * spreads them +-25% a block). Per format, the mean square of what d multiplies:
 *   Q8_0 d q: E q^2 ~ 5460;  Q4_0 d (q - 8): 21.5;  Q5_0 d (q - 16): 85.5;  Q4_1 / Q5_1 d q + m
 *   with m = -7.5 d / -15.5 d (the quants' mean): 21.3 / 85.3;  IQ4_NL d kvalues[q]: 4550;
 *   IQ4_XS d (ls - 32) kvalues[q]: 340 x 4550;  Q2_K d sc q - dmin m with dmin = 1.5 d: 193;
 *   Q3_K d (sc - 32) q: 340 x 5.5;  Q4_K / Q5_K d sc q - dmin m with dmin = 7.5 d / 15.5 d (a
 *   sub-block's mean 7.5 d (sc - m) / 15.5 d (sc - m)): 258^2 / 527^2;  Q6_K d sc (q - 32):
 *   5460 x 340. */
void sf_quant_random_block(sf_dtype t, uint8_t *b, sf_rng *r)
{
    size_t n = sf_dtype_bytes(t, sf_dtype_block(t));
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = sf_rng_next(r);
        memcpy(b + i, &v, SF_MIN((size_t)8, n - i));
    }
    float u = 0.75f + 0.5f * sf_rng_uniform(r);
    switch (t) {
    case SF_DT_Q8_0: put_f16(b, 2.7e-4f * u); break;
    case SF_DT_Q4_0: put_f16(b, 4.3e-3f * u); break;
    case SF_DT_Q4_1: put_f16(b, 4.3e-3f * u); put_f16(b + 2, -7.5f * 4.3e-3f * u); break;
    case SF_DT_Q5_0: put_f16(b, 2.16e-3f * u); break;
    case SF_DT_Q5_1: put_f16(b, 2.16e-3f * u); put_f16(b + 2, -15.5f * 2.16e-3f * u); break;
    case SF_DT_Q2_K: put_f16(b + 80, 1.44e-3f * u); put_f16(b + 82, 1.5f * 1.44e-3f * u); break;
    case SF_DT_Q3_K: put_f16(b + 108, 4.6e-4f * u); break;
    case SF_DT_Q4_K: put_f16(b, 7.7e-5f * u); put_f16(b + 2, 7.5f * 7.7e-5f * u); break;
    case SF_DT_Q5_K: put_f16(b, 3.8e-5f * u); put_f16(b + 2, 15.5f * 3.8e-5f * u); break;
    case SF_DT_Q6_K: put_f16(b + 208, 1.47e-5f * u); break;
    case SF_DT_IQ4_NL: put_f16(b, 3.0e-4f * u); break;
    case SF_DT_IQ4_XS: put_f16(b, 1.6e-5f * u); break;
    default: break;
    }
}

/* ---- the CUDA backend's layout (kernels/cuda/qgemv.cu) ------------------------------------ */
size_t sf_qdev_row_bytes(sf_dtype t, int64_t k)
{
    return sf_qdev_ok(t) && k % sf_dtype_block(t) == 0 ? (sf_dtype_bytes(t, k) + 15) / 16 * 16 : 0;
}

/* the unsigned quants of a K-quant super-block in element order (Q6_K's before their -32) */
static void k_quants(sf_dtype t, const uint8_t *b, uint8_t q[256])
{
    if (t == SF_DT_Q6_K) {
        for (int h = 0; h < 2; h++)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < 32; l++)
                    q[128 * h + 32 * k + l] = (uint8_t)(((b[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15) |
                                                        ((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4);
        return;
    }
    const int five = t == SF_DT_Q5_K;
    const uint8_t *qs = b + (five ? 48 : 16);
    for (int g = 0; g < 4; g++)
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++)
                q[64 * g + 32 * n + l] = (uint8_t)(((qs[32 * g + l] >> (4 * n)) & 15) |
                                                   (five ? ((b[16 + l] >> (2 * g + n)) & 1) << 4 : 0));
}

void sf_qdev_pack_row(sf_dtype t, const void *src, int64_t k, void *dst)
{
    const uint8_t *s = src;
    uint8_t *d = dst;
    const int64_t G = k / 32, S = k / 256;
    memset(d, 0, sf_qdev_row_bytes(t, k));
    if (t == SF_DT_Q8_0) {
        for (int64_t g = 0; g < G; g++, s += 34) {
            memcpy(d + 32 * g, s + 2, 32);
            memcpy(d + 32 * G + 2 * g, s, 2);
        }
        return;
    }
    uint8_t *qs = d + (t == SF_DT_Q6_K ? 0 : 16 * S), *qh = qs + 16 * G;
    const size_t bb = sf_dtype_bytes(t, 256);
    for (int64_t sb = 0; sb < S; sb++, s += bb) {
        uint8_t q[256];
        k_quants(t, s, q);
        if (t == SF_DT_Q6_K) {
            memcpy(d + 24 * G + 16 * sb, s + 192, 16);
            memcpy(d + 24 * G + 16 * S + 2 * sb, s + 208, 2);
        } else {
            memcpy(d + 16 * sb, s, 4);      /* d, dmin */
            memcpy(d + 16 * sb + 4, s + 4, 12); /* the packed scales and mins */
        }
        for (int j = 0; j < 8; j++) {
            const int64_t g = 8 * sb + j;
            const uint8_t *e = q + 32 * j;
            for (int i = 0; i < 16; i++) qs[16 * g + i] = (uint8_t)((e[i] & 15) | (e[16 + i] & 15) << 4);
            if (t == SF_DT_Q5_K)
                for (int h = 0; h < 2; h++)
                    for (int jj = 0; jj < 4; jj++)
                        for (int bt = 0; bt < 4; bt++)
                            qh[4 * g + bt] |= (uint8_t)(((e[16 * h + 4 * jj + bt] >> 4) & 1) << (4 * h + jj));
            if (t == SF_DT_Q6_K)
                for (int h = 0; h < 2; h++)
                    for (int jj = 0; jj < 4; jj++)
                        for (int bt = 0; bt < 4; bt++)
                            qh[8 * g + 4 * h + bt] |= (uint8_t)(((e[16 * h + 4 * jj + bt] >> 4) & 3) << (2 * jj));
        }
    }
}
