/* quant.h — the packed scale fields of GGUF's block formats, unpacked once for the host's
 * dequantization (quant.c) and the CPU's in-place kernels (kernels/cpu/qdot.c). Layouts as in
 * quant.c's header. */
#ifndef SF_HAL_QUANT_H
#define SF_HAL_QUANT_H

#include <stdint.h>
#include <string.h>

/* IQ4_NL's and IQ4_XS's 16 levels (ggml's kvalues_iq4nl) */
extern const int8_t sf_iq4nl_values[16];

/* Q4_K/Q5_K's 12 scale bytes as 8 6-bit scales (sm[0..7]) and 8 mins (sm[8..15]): sub-blocks
 * 0-3 in the low 6 bits of bytes j and j + 4, 4-7 in byte j + 4's nibbles with their top two
 * bits in the top bits of bytes j - 4 and j (ggml's unpacking, four at a time). */
static inline void sf_q4k_scales(const uint8_t *s, uint8_t sm[16])
{
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
    u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
    uint32_t mins_lo = u[1] & m1;
    u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
    u[2] = mins_lo;
    u[0] &= m1;
    memcpy(sm, u, 16);
}

/* Q3_K's 16 6-bit scales from their 12 bytes, as four words of four (not yet less 32): scale
 * i's low 4 bits in byte i % 8 (nibble i / 8), its high 2 in byte 8 + i % 4 (pair i / 4). The
 * CPU kernels move the words into a vector register whole: bytes stored one word at a time
 * and loaded back as 16 stall on store forwarding (27% of Q3_K's kernel time when they did). */
static inline void sf_q3k_scale_words(const uint8_t *ps, uint32_t u[4])
{
    uint32_t a[3];
    const uint32_t m2 = 0x0f0f0f0f, m3 = 0x03030303;
    memcpy(a, ps, 12);
    u[0] = (a[0] & m2) | ((a[2] & m3) << 4);
    u[1] = (a[1] & m2) | (((a[2] >> 2) & m3) << 4);
    u[2] = ((a[0] >> 4) & m2) | (((a[2] >> 4) & m3) << 4);
    u[3] = ((a[1] >> 4) & m2) | (((a[2] >> 6) & m3) << 4);
}

/* the same, less 32, as 16 bytes */
static inline void sf_q3k_scales(const uint8_t *ps, int8_t s[16])
{
    uint32_t u[4];
    uint8_t v[16];
    sf_q3k_scale_words(ps, u);
    memcpy(v, u, 16);
    for (int i = 0; i < 16; i++) s[i] = (int8_t)(v[i] - 32);
}

/* IQ4_XS block b's 6-bit scale of group g, less 32: low nibble in byte 4 + g / 2, high two bits
 * in the u16 at 2 */
static inline int sf_iq4xs_scale(const uint8_t *b, int g)
{
    return (((b[4 + g / 2] >> (4 * (g % 2))) & 15) | (((b[2] | b[3] << 8) >> (2 * g)) & 3) << 4) - 32;
}

#endif
