/* attention.c — paged causal attention with grouped-query heads and online softmax (fp32).
 *
 * One work unit is (token, kv head): the unit loads each cached K/V row once and serves
 * all n_heads / n_kv_heads query heads that share it. Units are dealt round-robin to the
 * threads, which balances prefill (later tokens see longer contexts). The context of a token
 * at position p is cache positions 0..p of its sequence, visited block by block: scores of a
 * block, then the running max / sum / accumulator are rescaled once per block. An INT8 block
 * (id >= kv8.i8_base) is dequantised into the unit's scratch first, then read the same way. */
#include "cpu.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

int64_t sf_cpu_attention_scratch(int n_heads, int n_kv_heads, int head_dim, int block_size)
{
    int g = n_heads / n_kv_heads;
    /* acc, m, l, scores, then a dequantised K and V block (INT8 blocks) */
    return (int64_t)g * head_dim + 2 * g + (int64_t)g * block_size + 2 * (int64_t)block_size * head_dim + 16;
}

/* dst[i][d] = q[i][d] * scale[i] for n rows of hd */
static void dequant_rows(const int8_t *q, const float *scale, int n, int hd, float *dst)
{
    for (int i = 0; i < n; i++)
        for (int d = 0; d < hd; d++) dst[(int64_t)i * hd + d] = (float)q[(int64_t)i * hd + d] * scale[i];
}

static inline float dotf(const float *a, const float *b, int n)
{
    float s[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* AVX2 versions for head dims that are whole vectors (64, 128, ...). */
__attribute__((target("avx2,fma")))
static float dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    return sf_cpu_hsum8(_mm256_add_ps(s0, s1));
}

/* acc = acc * corr + sum_i p[i] * V[i] over n rows of V */
__attribute__((target("avx2,fma")))
static void rescale_axpy_avx2(float *acc, float corr, const float *p, const float *V, int n, int hd)
{
    __m256 c = _mm256_set1_ps(corr);
    for (int d = 0; d < hd; d += 8) {
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(acc + d), c);
        for (int i = 0; i < n; i++)
            s = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), _mm256_loadu_ps(V + (int64_t)i * hd + d), s);
        _mm256_storeu_ps(acc + d, s);
    }
}

/* p[i] = exp(p[i] - m) for i < n; returns their sum */
__attribute__((target("avx2,fma")))
static float exp_sum_avx2(float *p, int n, float m)
{
    __m256 mm = _mm256_set1_ps(m), acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = sf_cpu_exp256(_mm256_sub_ps(_mm256_loadu_ps(p + i), mm));
        _mm256_storeu_ps(p + i, v);
        acc = _mm256_add_ps(acc, v);
    }
    float t[8], s = 0;
    _mm256_storeu_ps(t, acc);
    for (int j = 0; j < 8; j++) s += t[j];
    for (; i < n; i++) s += (p[i] = expf(p[i] - m));
    return s;
}

static void attend_unit(const sf_cpu_attention *a, int s, int t, int kvh, float *scratch, int avx2)
{
    int hd = a->head_dim, bs = a->block_size, Hkv = a->n_kv_heads;
    int g = a->n_heads / Hkv;
    int64_t stride = (int64_t)(a->n_heads + 2 * Hkv) * hd;
    float *acc = scratch, *m = acc + (int64_t)g * hd, *l = m + g, *sc = l + g;
    float *kdq = sc + (int64_t)g * bs, *vdq = kdq + (int64_t)bs * hd;
    for (int j = 0; j < g; j++) { m[j] = -INFINITY; l[j] = 0; }
    memset(acc, 0, (size_t)g * hd * sizeof(float));
    const float *q = a->qkv + t * stride + (int64_t)kvh * g * hd;
    int ctx = a->pos[t] + 1;
    const int32_t *bt = a->block_table + (int64_t)s * a->max_blocks;
    for (int b0 = 0; b0 < ctx; b0 += bs) {
        int n = SF_MIN(bs, ctx - b0);
        int32_t id = bt[b0 / bs];
        const float *K, *V;
        if (a->kv8.i8_base && id >= a->kv8.i8_base) {
            int64_t u = id - a->kv8.i8_base, row = (u * Hkv + kvh) * bs;
            int64_t at = u * a->kv8.unit_bytes + (int64_t)kvh * bs * hd;
            dequant_rows(a->kv8.k8 + at, a->kv8.k_scale + row, n, hd, kdq);
            dequant_rows(a->kv8.v8 + at, a->kv8.v_scale + row, n, hd, vdq);
            K = kdq;
            V = vdq;
        } else {
            int64_t base = (((int64_t)id * Hkv + kvh) * bs) * hd;
            K = a->k_cache + base;
            V = a->v_cache + base;
        }
        for (int j = 0; j < g; j++) {
            const float *qj = q + (int64_t)j * hd;
            float *sj = sc + (int64_t)j * bs, bmax = -INFINITY;
            for (int i = 0; i < n; i++) {
                sj[i] = (avx2 ? dot_avx2(qj, K + (int64_t)i * hd, hd) : dotf(qj, K + (int64_t)i * hd, hd)) * a->scale;
                if (sj[i] > bmax) bmax = sj[i];
            }
            float mnew = m[j] > bmax ? m[j] : bmax;
            float corr = expf(m[j] - mnew); /* exp(-inf) = 0 on the first block */
            float *accj = acc + (int64_t)j * hd;
            float sum = 0;
            if (avx2) sum = exp_sum_avx2(sj, n, mnew);
            else
                for (int i = 0; i < n; i++) {
                    sj[i] = expf(sj[i] - mnew);
                    sum += sj[i];
                }
            if (avx2) {
                rescale_axpy_avx2(accj, corr, sj, V, n, hd);
            } else {
                for (int d = 0; d < hd; d++) accj[d] *= corr;
                for (int i = 0; i < n; i++) {
                    const float *vi = V + (int64_t)i * hd;
                    for (int d = 0; d < hd; d++) accj[d] += sj[i] * vi[d];
                }
            }
            l[j] = l[j] * corr + sum;
            m[j] = mnew;
        }
    }
    float *out = a->out + (int64_t)t * a->n_heads * hd + (int64_t)kvh * g * hd;
    for (int j = 0; j < g; j++) {
        float inv = 1.0f / l[j];
        for (int d = 0; d < hd; d++) out[(int64_t)j * hd + d] = acc[(int64_t)j * hd + d] * inv;
    }
}

void sf_cpu_attention_task(void *arg, int ith, int nth)
{
    const sf_cpu_attention *a = arg;
    float *scratch = a->scratch + ith * a->scratch_floats;
    int avx2 = sf_cpu_has_avx2() && a->head_dim % 8 == 0;
    int64_t u = 0;
    for (int s = 0; s < a->S; s++)
        for (int t = a->seq_start[s]; t < a->seq_start[s + 1]; t++)
            for (int kvh = 0; kvh < a->n_kv_heads; kvh++, u++)
                if (u % nth == ith) attend_unit(a, s, t, kvh, scratch, avx2);
}
