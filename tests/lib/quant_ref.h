/* quant_ref.h — the tests' reference for GGUF's block formats (hal/quant.c): the value of one
 * element of one block, computed from its index alone (which bytes and bits hold it, which
 * scale applies), not by walking the block as hal/quant.c does. (Random blocks come from the
 * library's sf_quant_random_block.) Header-only. */
#ifndef SF_TESTS_QUANT_REF_H
#define SF_TESTS_QUANT_REF_H

#include <math.h>
#include <string.h>

#include "../../hal/hal.h"

static const sf_dtype qr_types[] = { SF_DT_Q8_0, SF_DT_Q4_0, SF_DT_Q4_1, SF_DT_Q5_0, SF_DT_Q5_1, SF_DT_Q2_K,
                                     SF_DT_Q3_K, SF_DT_Q4_K, SF_DT_Q5_K, SF_DT_Q6_K, SF_DT_IQ4_NL, SF_DT_IQ4_XS };
static const int8_t qr_iq4nl[16] = { -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113 };

static inline double qr_f16(const uint8_t *p) { return sf_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static inline int qr_bit(const uint8_t *p, int i) { return p[i / 8] >> (i % 8) & 1; }

/* the 6-bit scale (what 0) or min (what 1) of sub-block j of Q4_K/Q5_K from their 12 bytes */
static inline int qr_k4(const uint8_t *s, int j, int what)
{
    if (j < 4) return s[j + 4 * what] & 63;
    int lo = what ? s[j + 4] >> 4 : s[j + 4] & 15;
    int hi = s[j - 4 + 4 * what] >> 6;
    return lo | hi << 4;
}

/* x rounded in place as the kernels that read block formats round it (kernels/cpu/qdot.c,
 * kernels/cuda/qgemv.cu): per 32 elements, q = rint(x * 127 / amax), x = q * amax / 127 */
static inline void qr_round_x8(float *x, int64_t n)
{
    for (int64_t g = 0; g < n / 32; g++) {
        float amax = 0, *v = x + 32 * g;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
        float inv = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int i = 0; i < 32; i++) v[i] = rintf(v[i] * inv) * d;
    }
}

/* element e of block b of type t */
static inline double qr_value(sf_dtype t, const uint8_t *b, int e)
{
    switch (t) {
    case SF_DT_Q8_0: return qr_f16(b) * (int8_t)b[2 + e];
    case SF_DT_Q4_0: return qr_f16(b) * (((b[2 + e % 16] >> (e / 16 * 4)) & 15) - 8);
    case SF_DT_Q4_1: return qr_f16(b) * ((b[4 + e % 16] >> (e / 16 * 4)) & 15) + qr_f16(b + 2);
    case SF_DT_Q5_0: return qr_f16(b) * ((((b[6 + e % 16] >> (e / 16 * 4)) & 15) | qr_bit(b + 2, e) << 4) - 16);
    case SF_DT_Q5_1:
        return qr_f16(b) * (((b[8 + e % 16] >> (e / 16 * 4)) & 15) | qr_bit(b + 4, e) << 4) + qr_f16(b + 2);
    case SF_DT_Q2_K: { /* 128-halves; in each, bit pair j = r / 32 of bytes 32*half + r % 32 */
        int half = e / 128, r = e % 128, j = r / 32, l = r % 32, sc = b[half * 8 + 2 * j + l / 16];
        int q = (b[16 + 32 * half + l] >> (2 * j)) & 3;
        return qr_f16(b + 80) * (sc & 15) * q - qr_f16(b + 82) * (sc >> 4);
    }
    case SF_DT_Q3_K: {
        int half = e / 128, r = e % 128, j = r / 32, l = r % 32, i = half * 8 + 2 * j + l / 16;
        int lo = i < 8 ? b[96 + i] & 15 : b[96 + i - 8] >> 4, hi = (b[104 + i % 4] >> (2 * (i / 4))) & 3;
        int q = ((b[32 + 32 * half + l] >> (2 * j)) & 3) - (qr_bit(b + l, half * 4 + j) ? 0 : 4);
        return qr_f16(b + 108) * ((lo | hi << 4) - 32) * q;
    }
    case SF_DT_Q4_K:
    case SF_DT_Q5_K: { /* 64-groups: low nibbles of 32 bytes, then their high nibbles */
        int five = t == SF_DT_Q5_K, g = e / 64, n = e % 64 / 32, l = e % 32, sub = 2 * g + n;
        int q = (b[(five ? 48 : 16) + 32 * g + l] >> (4 * n)) & 15;
        if (five) q |= qr_bit(b + 16 + l, sub) << 4;
        return qr_f16(b) * qr_k4(b + 4, sub, 0) * q - qr_f16(b + 2) * qr_k4(b + 4, sub, 1);
    }
    case SF_DT_Q6_K: { /* 128-halves of 4 rows of 32: low/high nibble of ql[l] or ql[32 + l] */
        int half = e / 128, k = e % 128 / 32, l = e % 32;
        int lo = (b[64 * half + 32 * (k & 1) + l] >> (4 * (k >> 1))) & 15;
        int hi = (b[128 + 32 * half + l] >> (2 * k)) & 3;
        return qr_f16(b + 208) * (int8_t)b[192 + 8 * half + 2 * k + l / 16] * ((lo | hi << 4) - 32);
    }
    case SF_DT_IQ4_NL: return qr_f16(b) * qr_iq4nl[(b[2 + e % 16] >> (e / 16 * 4)) & 15];
    case SF_DT_IQ4_XS: { /* sub-block s = e / 32: its 6-bit scale, then IQ4_NL nibbles */
        int s = e / 32, l = e % 32;
        int ls = ((b[4 + s / 2] >> (s % 2 * 4)) & 15) | ((b[2 + s / 4] >> (s % 4 * 2)) & 3) << 4;
        return qr_f16(b) * (ls - 32) * qr_iq4nl[(b[8 + 16 * s + l % 16] >> (l / 16 * 4)) & 15];
    }
    default: return NAN;
    }
}

#endif
