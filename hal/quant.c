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
 *   IQ4_NL (32, 18 B): as Q4_0, but a nibble indexes a fixed non-linear table (iq4nl) instead of
 *        counting from -8
 *   IQ4_XS (256, 136 B): d @0, the high 2 bits of 8 6-bit sub-block scales (u16) @2, their low
 *        nibbles @4, then 8 sub-blocks of IQ4_NL nibbles @8; a sub-block's scale is d (s - 32)
 * The order of weights inside a block follows ggml: in the 2-bit formats each byte serves
 * four weights 32 apart (bit pairs 0-1, 2-3, 4-5, 6-7), in the 4-bit ones two weights 32 apart
 * (low, high nibble) — 16 apart in Q4_0..Q5_1. */
#include "hal.h"

#include <stdlib.h>
#include <string.h>

static float f16at(const uint8_t *p) { return sf_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static uint32_t u32at(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Q4_K/Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes:
 * sub-blocks 0-3 in the low 6 bits of bytes j and j+4, 4-7 in byte j+4's nibbles with their
 * top two bits in the top bits of bytes j-4 and j. */
static void k4_scale_min(const uint8_t *s, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        *mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

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
    int scale[16];
    for (int i = 0; i < 16; i++) /* low 4 bits: bytes 0-7 (nibble i / 8); high 2: bytes 8-11 */
        scale[i] = (((ps[i % 8] >> (4 * (i / 8))) & 15) | ((ps[8 + i % 4] >> (2 * (i / 4))) & 3) << 4) - 32;
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
    const uint8_t *s = b + 4, *qh = five ? b + 16 : NULL, *qs = b + (five ? 48 : 16);
    for (int g = 0; g < 4; g++, qs += 32)
        for (int n = 0; n < 2; n++) { /* low nibbles, then high: sub-block 2g + n */
            int sc, mn;
            k4_scale_min(s, 2 * g + n, &sc, &mn);
            float dl = d * (float)sc, ml = dmin * (float)mn;
            for (int l = 0; l < 32; l++) {
                int q = (qs[l] >> (4 * n)) & 15;
                if (qh) q |= ((qh[l] >> (2 * g + n)) & 1) << 4;
                *y++ = dl * (float)q - ml;
            }
        }
}

/* IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl) */
static const int8_t iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

static void iq4_nibbles(const uint8_t *qs, float d, float *y)
{
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)iq4nl[qs[i] & 15];
        y[i + 16] = d * (float)iq4nl[qs[i] >> 4];
    }
}

static void iq4_xs(const uint8_t *b, float *y)
{
    float d = f16at(b);
    unsigned hi = (unsigned)(b[2] | b[3] << 8);
    for (int s = 0; s < 8; s++) {
        int ls = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (int)((hi >> (2 * s)) & 3) << 4;
        iq4_nibbles(b + 8 + 16 * s, d * (float)(ls - 32), y + 32 * s);
    }
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

/* Random bytes, then scales that give std ~0.02: Q8_0 d * q (E q^2 ~ 5460); Q6_K d * sc * (q - 32)
 * (E sc^2 ~ 5460, E (q - 32)^2 ~ 340); Q4_K d * sc * q - dmin * m with dmin = 7.5 d, so that a
 * sub-block's mean is 7.5 d (sc - m), and E w^2 ~ (258 d)^2; Q5_K as Q4_K with q < 32, dmin = 15.5 d,
 * E w^2 ~ (527 d)^2; Q4_0 d (q - 8) (E (q - 8)^2 = 21.5); IQ4_NL d kvalues[q] (their rms 67.4); IQ4_XS
 * d (ls - 32) kvalues[q] (E (ls - 32)^2 ~ 340); Q2_K d sc q - dmin m with dmin = 1.5 d, E w^2 ~ (13.9 d)^2;
 * Q3_K d (sc - 32) q, E q^2 = 5.5. */
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
    case SF_DT_Q6_K: put_f16(b + 208, 1.47e-5f * u); break;
    case SF_DT_Q4_K: put_f16(b, 7.7e-5f * u); put_f16(b + 2, 7.5f * 7.7e-5f * u); break;
    case SF_DT_Q5_K: put_f16(b, 3.8e-5f * u); put_f16(b + 2, 15.5f * 3.8e-5f * u); break;
    case SF_DT_Q4_0: put_f16(b, 4.3e-3f * u); break;
    case SF_DT_Q2_K: put_f16(b + 80, 1.44e-3f * u); put_f16(b + 82, 1.5f * 1.44e-3f * u); break;
    case SF_DT_Q3_K: put_f16(b + 108, 4.6e-4f * u); break;
    case SF_DT_IQ4_NL: put_f16(b, 3.0e-4f * u); break;
    case SF_DT_IQ4_XS: put_f16(b, 1.6e-5f * u); break;
    default: break;
    }
}
