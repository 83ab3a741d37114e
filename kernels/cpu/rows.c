/* rows.c — CPU feature detection and dequantization of one weight row to fp32. */
#include "cpu.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint16_t d; int8_t qs[32]; } q8_block; /* GGUF Q8_0: 34 bytes */

int sf_cpu_has_avx2(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *e = getenv("SEMFLOW_NO_AVX2");
        __builtin_cpu_init();
        cached = (!e || !*e || !strcmp(e, "0")) && __builtin_cpu_supports("avx2") &&
                 __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    }
    return cached;
}

const void *sf_cpu_row_ptr(sf_dtype t, const void *data, int64_t cols, int64_t r)
{
    return (const char *)data + (size_t)r * sf_dtype_bytes(t, cols);
}

__attribute__((target("avx2,fma,f16c")))
static void row_to_f32_avx2(sf_dtype t, const void *src, int64_t k, float *dst)
{
    int64_t i = 0;
    switch (t) {
    case SF_DT_BF16: {
        const uint16_t *s = src;
        for (; i + 8 <= k; i += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; i < k; i++) dst[i] = sf_bf16_to_f32(s[i]);
        return;
    }
    case SF_DT_F16: {
        const uint16_t *s = src;
        for (; i + 8 <= k; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
        for (; i < k; i++) dst[i] = sf_f16_to_f32(s[i]);
        return;
    }
    case SF_DT_Q8_0: {
        const q8_block *b = src;
        for (int64_t j = 0; j < k / 32; j++) {
            __m256 d = _mm256_set1_ps(_cvtsh_ss(b[j].d));
            for (int g = 0; g < 4; g++) {
                __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[j].qs + 8 * g)));
                _mm256_storeu_ps(dst + j * 32 + 8 * g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
            }
        }
        return;
    }
    case SF_DT_Q4_0:
    case SF_DT_Q4_1:
    case SF_DT_Q5_0:
    case SF_DT_Q5_1:
    case SF_DT_Q2_K:
    case SF_DT_Q3_K:
    case SF_DT_Q4_K:
    case SF_DT_Q5_K:
    case SF_DT_Q6_K:
    case SF_DT_IQ4_NL:
    case SF_DT_IQ4_XS: sf_cpu_kq_row_to_f32(t, src, k, dst); return;
    default:
        if (sf_dtype_block(t) > 1) sf_dequant_row(t, src, k, dst);
        else memcpy(dst, src, (size_t)k * sizeof(float));
        return;
    }
}

static void row_to_f32_scalar(sf_dtype t, const void *src, int64_t k, float *dst)
{
    switch (t) {
    case SF_DT_BF16:
        for (int64_t i = 0; i < k; i++) dst[i] = sf_bf16_to_f32(((const uint16_t *)src)[i]);
        return;
    case SF_DT_F16:
        for (int64_t i = 0; i < k; i++) dst[i] = sf_f16_to_f32(((const uint16_t *)src)[i]);
        return;
    case SF_DT_Q8_0: {
        const q8_block *b = src;
        for (int64_t j = 0; j < k / 32; j++) {
            float d = sf_f16_to_f32(b[j].d);
            for (int i = 0; i < 32; i++) dst[j * 32 + i] = d * (float)b[j].qs[i];
        }
        return;
    }
    default:
        if (sf_dtype_block(t) > 1) sf_dequant_row(t, src, k, dst);
        else memcpy(dst, src, (size_t)k * sizeof(float));
        return;
    }
}

void sf_cpu_row_to_f32(sf_dtype t, const void *src, int64_t k, float *dst)
{
    if (sf_cpu_has_avx2()) row_to_f32_avx2(t, src, k, dst);
    else row_to_f32_scalar(t, src, k, dst);
}
