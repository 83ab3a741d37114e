/* score.c — a logit row's log-softmax at one token: its log-probability, its rank and the k most
 * likely tokens (the reference of the backend's score op, and what the engine's host path runs
 * for prompt logprobs). The max and the sum of exponentials are vectorized (AVX2), as the host
 * sampler's log-softmax is. */
#include <immintrin.h>
#include <math.h>

#include "cpu.h"

__attribute__((target("avx2,fma")))
static float max_avx2(const float *l, int n)
{
    __m256 m = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(l + i));
    float t[8], r = -INFINITY;
    _mm256_storeu_ps(t, m);
    for (int j = 0; j < 8; j++) r = t[j] > r ? t[j] : r;
    for (; i < n; i++) r = l[i] > r ? l[i] : r;
    return r;
}

__attribute__((target("avx2,fma")))
static double sumexp_avx2(const float *l, int n, float scale, float m, float *e)
{
    __m256 acc = _mm256_setzero_ps(), sc = _mm256_set1_ps(scale), mm = _mm256_set1_ps(m);
    double total = 0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = sf_cpu_exp256(_mm256_fmsub_ps(_mm256_loadu_ps(l + i), sc, mm));
        if (e) _mm256_storeu_ps(e + i, v);
        acc = _mm256_add_ps(acc, v);
        if ((i & 1023) == 1016) { /* fold into double now and then: 128k terms stay exact enough */
            float t[8];
            _mm256_storeu_ps(t, acc);
            for (int j = 0; j < 8; j++) total += t[j];
            acc = _mm256_setzero_ps();
        }
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    for (int j = 0; j < 8; j++) total += t[j];
    for (; i < n; i++) {
        float v = expf(l[i] * scale - m);
        if (e) e[i] = v;
        total += v;
    }
    return total;
}

float sf_cpu_max(const float *l, int n)
{
    if (sf_cpu_has_avx2()) return max_avx2(l, n);
    float r = -INFINITY;
    for (int i = 0; i < n; i++) r = l[i] > r ? l[i] : r;
    return r;
}

double sf_cpu_sumexp(const float *l, int n, float scale, float m, float *e)
{
    if (sf_cpu_has_avx2()) return sumexp_avx2(l, n, scale, m, e);
    double total = 0;
    for (int i = 0; i < n; i++) {
        float v = expf(l[i] * scale - m);
        if (e) e[i] = v;
        total += v;
    }
    return total;
}

int sf_cpu_top_n(const float *l, int vocab, int n, int32_t *id, float *v)
{
    int have = 0;
    for (int i = 0; i < vocab && n > 0; i++) {
        if (have == n && !(l[i] > v[n - 1])) continue;
        int j = have < n ? have++ : n - 1;
        while (j > 0 && v[j - 1] < l[i]) { v[j] = v[j - 1]; id[j] = id[j - 1]; j--; }
        v[j] = l[i];
        id[j] = i;
    }
    return have;
}

int sf_cpu_score_row(const float *l, int vocab, int32_t id, int k, float *logprob, int32_t *rank, int32_t *top_id,
                     float *top_lp)
{
    const float m = sf_cpu_max(l, vocab);
    const float lse = m + (float)log(sf_cpu_sumexp(l, vocab, 1.0f, m, NULL));
    const float x = l[id];
    int32_t above = 0;
    for (int i = 0; i < vocab; i++) above += l[i] > x;
    *logprob = x - lse;
    *rank = above + 1;
    int n = k > 0 ? sf_cpu_top_n(l, vocab, k, top_id, top_lp) : 0;
    for (int i = 0; i < n; i++) top_lp[i] -= lse;
    for (int i = n; i < k; i++) top_id[i] = -1, top_lp[i] = -INFINITY;
    return n;
}

void sf_cpu_score_task(void *arg, int ith, int nth)
{
    sf_cpu_score *s = arg;
    for (int r = ith; r < s->n; r += nth)
        sf_cpu_score_row(s->logits + (size_t)r * s->ld, s->vocab, s->targets[r], s->k, &s->lp[r], &s->rank[r],
                         s->top_id + (size_t)r * s->k, s->top_lp + (size_t)r * s->k);
}
