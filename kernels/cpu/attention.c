/* attention.c — paged causal attention with grouped-query heads and online softmax (fp32).
 *
 * One work unit is (token, kv head): the unit loads each cached K/V row once and serves
 * all n_heads / n_kv_heads query heads that share it. Units are dealt round-robin to the
 * threads, which balances prefill (later tokens see longer contexts). The context of a token
 * at position p is cache positions 0..p of its sequence, visited block by block: scores of a
 * block, then the running max / sum / accumulator are rescaled once per block. */
#include "cpu.h"

#include <math.h>
#include <string.h>

int64_t sf_cpu_attention_scratch(int n_heads, int n_kv_heads, int head_dim, int block_size)
{
    int g = n_heads / n_kv_heads;
    return (int64_t)g * head_dim + 2 * g + (int64_t)g * block_size + 16;
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

static void attend_unit(const sf_cpu_attention *a, int s, int t, int kvh, float *scratch)
{
    int hd = a->head_dim, bs = a->block_size, Hkv = a->n_kv_heads;
    int g = a->n_heads / Hkv;
    int64_t stride = (int64_t)(a->n_heads + 2 * Hkv) * hd;
    float *acc = scratch, *m = acc + (int64_t)g * hd, *l = m + g, *sc = l + g;
    for (int j = 0; j < g; j++) { m[j] = -INFINITY; l[j] = 0; }
    memset(acc, 0, (size_t)g * hd * sizeof(float));
    const float *q = a->qkv + t * stride + (int64_t)kvh * g * hd;
    int ctx = a->pos[t] + 1;
    const int32_t *bt = a->block_table + (int64_t)s * a->max_blocks;
    for (int b0 = 0; b0 < ctx; b0 += bs) {
        int n = SF_MIN(bs, ctx - b0);
        int64_t base = (((int64_t)bt[b0 / bs] * Hkv + kvh) * bs) * hd;
        const float *K = a->k_cache + base, *V = a->v_cache + base;
        for (int j = 0; j < g; j++) {
            const float *qj = q + (int64_t)j * hd;
            float *sj = sc + (int64_t)j * bs, bmax = -INFINITY;
            for (int i = 0; i < n; i++) {
                sj[i] = dotf(qj, K + (int64_t)i * hd, hd) * a->scale;
                if (sj[i] > bmax) bmax = sj[i];
            }
            float mnew = m[j] > bmax ? m[j] : bmax;
            float corr = expf(m[j] - mnew); /* exp(-inf) = 0 on the first block */
            float *accj = acc + (int64_t)j * hd;
            float sum = 0;
            for (int d = 0; d < hd; d++) accj[d] *= corr;
            for (int i = 0; i < n; i++) {
                float p = expf(sj[i] - mnew);
                sum += p;
                const float *vi = V + (int64_t)i * hd;
                for (int d = 0; d < hd; d++) accj[d] += p * vi[d];
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
    int64_t u = 0;
    for (int s = 0; s < a->S; s++)
        for (int t = a->seq_start[s]; t < a->seq_start[s + 1]; t++)
            for (int kvh = 0; kvh < a->n_kv_heads; kvh++, u++)
                if (u % nth == ith) attend_unit(a, s, t, kvh, scratch);
}
