/* sampler.c — one row of logits to one token.
 *
 * Order, as Hugging Face and vLLM apply it: penalties (repetition: HF, over prompt and output;
 * presence/frequency: OpenAI, over output) on the raw logits; the reported logprobs come from
 * these penalized logits; then temperature; then top-k, top-p, min-p; then a draw from the
 * seeded rng. temperature 0 is greedy (argmax of the penalized logits).
 * No full sort of the vocabulary: top-k is a quickselect, top-p a bucket walk that sorts
 * only its boundary bucket, min-p a threshold. */
#include "sampler.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

typedef struct cand { float v, e; int32_t id, b; } cand; /* logit, exp(logit - max), id, top-p bucket */

/* ---- vector helpers: max and exp over a whole vocabulary ------------------------------ */
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

/* sum of exp(scale * l[i] - m); stores the terms in e when e != NULL */
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

static float vmax(const float *l, int n)
{
    if (sf_cpu_has_avx2()) return max_avx2(l, n);
    float r = -INFINITY;
    for (int i = 0; i < n; i++) r = l[i] > r ? l[i] : r;
    return r;
}

static double vsumexp(const float *l, int n, float scale, float m, float *e)
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

int sf_sampler_seq_init(sf_sampler_seq *s, const sf_sampling *p, int vocab, const int32_t *prompt, int n_prompt,
                        sf_error *err)
{
    memset(s, 0, sizeof *s);
    if (vocab < 1) return sf_err(err, SF_EINVAL, "sampler: vocabulary size %d", vocab);
    if (!(p->temperature >= 0) || p->temperature > 100)
        return sf_err(err, SF_EINVAL, "temperature %g is outside [0, 100]", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1)) return sf_err(err, SF_EINVAL, "top_p %g is outside (0, 1]", p->top_p);
    if (p->top_k < 0) return sf_err(err, SF_EINVAL, "top_k %d is negative (0 turns it off)", p->top_k);
    if (!(p->min_p >= 0 && p->min_p <= 1)) return sf_err(err, SF_EINVAL, "min_p %g is outside [0, 1]", p->min_p);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return sf_err(err, SF_EINVAL, "presence_penalty %g is outside [-2, 2]", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return sf_err(err, SF_EINVAL, "frequency_penalty %g is outside [-2, 2]", p->frequency_penalty);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 10))
        return sf_err(err, SF_EINVAL, "repetition_penalty %g is outside (0, 10] (1 turns it off)", p->repetition_penalty);
    if (p->logprobs > SF_MAX_LOGPROBS)
        return sf_err(err, SF_EINVAL, "logprobs %d is more than %d", p->logprobs, SF_MAX_LOGPROBS);
    sf_rng_seed(&s->rng, p->has_seed ? p->seed : sf_now_ns() ^ ((uint64_t)(uintptr_t)s << 17));
    int rep = p->repetition_penalty != 1.0f;
    if (rep || p->presence_penalty != 0 || p->frequency_penalty != 0) {
        if (!(s->counts = calloc((size_t)vocab, sizeof *s->counts))) goto oom;
    }
    if (rep) {
        if (!(s->in_prompt = calloc((size_t)vocab, 1))) goto oom;
        for (int i = 0; i < n_prompt; i++) {
            if (prompt[i] < 0 || prompt[i] >= vocab) {
                sf_sampler_seq_free(s);
                return sf_err(err, SF_EINVAL, "sampler: prompt token %d at %d is outside the vocabulary [0, %d)",
                              prompt[i], i, vocab);
            }
            s->in_prompt[prompt[i]] = 1;
        }
    }
    return SF_OK;
oom:
    sf_sampler_seq_free(s);
    return sf_err(err, SF_ENOMEM, "sampler: out of memory for a vocabulary of %d", vocab);
}

void sf_sampler_seq_free(sf_sampler_seq *s)
{
    if (!s) return;
    free(s->counts);
    free(s->in_prompt);
    s->counts = NULL;
    s->in_prompt = NULL;
}

void sf_sampler_accept(sf_sampler_seq *s, int32_t id)
{
    if (s->counts && id >= 0) s->counts[id]++;
}

static void apply_penalties(const sf_sampling *p, const sf_sampler_seq *s, float *l, int vocab)
{
    if (!s->counts) return;
    float rp = p->repetition_penalty, pp = p->presence_penalty, fp = p->frequency_penalty;
    for (int i = 0; i < vocab; i++) {
        int c = s->counts[i];
        if (rp != 1.0f && (c > 0 || (s->in_prompt && s->in_prompt[i])))
            l[i] = l[i] > 0 ? l[i] / rp : l[i] * rp;
        if (c > 0) l[i] -= fp * (float)c + pp;
    }
}

/* Rearranges a[0..n) so that a[0..k) hold the k largest values (in no order). */
static void select_top(cand *a, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        /* median of three as pivot */
        float x = a[lo].v, y = a[mid].v, z = a[hi].v;
        float piv = (x > y) ? ((y > z) ? y : (x > z ? z : x)) : ((x > z) ? x : (y > z ? z : y));
        int i = lo, j = hi;
        while (i <= j) {
            while (a[i].v > piv) i++;
            while (a[j].v < piv) j--;
            if (i <= j) { cand t = a[i]; a[i] = a[j]; a[j] = t; i++; j--; }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

static int cmp_desc(const void *x, const void *y)
{
    float a = ((const cand *)x)->v, b = ((const cand *)y)->v;
    return (a < b) - (a > b);
}

/* Top n (value, id) pairs of l by insertion into a small sorted array. */
static int top_n(const float *l, int vocab, int n, cand *out)
{
    int have = 0;
    for (int i = 0; i < vocab; i++) {
        if (have == n && !(l[i] > out[n - 1].v)) continue;
        int j = have < n ? have++ : n - 1;
        while (j > 0 && out[j - 1].v < l[i]) { out[j] = out[j - 1]; j--; }
        out[j].v = l[i];
        out[j].id = i;
    }
    return have;
}

static int32_t argmax(const float *l, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* Draw from the truncated, temperature-scaled distribution. Returns -1 on out of memory.
 * top-p without sorting the vocabulary: candidates are bucketed by how far their logit lies
 * below the max (NB buckets over R nats, the rest in the last bucket); whole buckets are
 * taken from the top until the wanted mass is reached, and only the boundary bucket is
 * sorted. Bucket order is logit order, so the kept set is exactly the sorted prefix. */
#define NB 1024
#define RANGE 40.0f

static int32_t sample_truncated(const sf_sampling *p, sf_rng *rng, const float *l, int vocab)
{
    cand *c = malloc((size_t)vocab * sizeof *c);
    float *e = malloc((size_t)vocab * sizeof *e);
    if (!c || !e) { free(c); free(e); return -1; }
    float inv_t = 1.0f / p->temperature;
    float m = vmax(l, vocab) * inv_t;
    if (m != m || m == -INFINITY) { free(c); free(e); return argmax(l, vocab); }
    double z = vsumexp(l, vocab, inv_t, m, e);
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        if (l[i] == -INFINITY || l[i] != l[i]) continue; /* masked or NaN: never drawn */
        c[n].v = l[i] * inv_t;
        c[n].e = e[i];
        c[n].id = i;
        n++;
    }
    free(e);
    if (p->top_k > 0 && p->top_k < n) {
        select_top(c, n, p->top_k);
        n = p->top_k;
        z = 0;
        for (int i = 0; i < n; i++) z += c[i].e;
    }
    if (p->top_p < 1.0f) {
        double mass[NB] = { 0 }, want = p->top_p * z, cum = 0;
        const float scale = NB / RANGE;
        for (int i = 0; i < n; i++) {
            float d = (m - c[i].v) * scale;
            c[i].b = d < NB - 1 ? (int)d : NB - 1;
            mass[c[i].b] += c[i].e;
        }
        int bstar = NB - 1;
        for (int b = 0; b < NB; b++) {
            if (cum + mass[b] >= want) { bstar = b; break; }
            cum += mass[b];
        }
        /* buckets <= bstar to the front (one pass over all), then bstar behind the rest */
        int k2 = 0;
        for (int i = 0; i < n; i++)
            if (c[i].b <= bstar) { cand t = c[k2]; c[k2] = c[i]; c[i] = t; k2++; }
        int k1 = 0;
        for (int i = 0; i < k2; i++)
            if (c[i].b < bstar) { cand t = c[k1]; c[k1] = c[i]; c[i] = t; k1++; }
        qsort(c + k1, (size_t)(k2 - k1), sizeof *c, cmp_desc);
        int keep = k2;
        for (int i = k1; i < k2; i++) {
            cum += c[i].e;
            if (cum >= want) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float thr = m + logf(p->min_p);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (c[i].v >= thr) c[k++] = c[i];
        n = k; /* the max always passes: n >= 1 */
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += c[i].e;
    double u = (double)sf_rng_uniform(rng) * tot;
    int32_t id = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        u -= c[i].e;
        if (u < 0) { id = c[i].id; break; }
    }
    free(c);
    return id;
}

int32_t sf_sample(const sf_sampling *p, sf_sampler_seq *s, float *logits, int vocab, float *logprob,
                  sf_logprob *top, int *n_top)
{
    apply_penalties(p, s, logits, vocab);
    int32_t id;
    if (p->temperature <= 0 || p->top_k == 1) id = argmax(logits, vocab);
    else {
        id = sample_truncated(p, &s->rng, logits, vocab);
        if (id < 0) {
            SF_LOGW("sampler: out of memory for %d candidates; falling back to greedy", vocab);
            id = argmax(logits, vocab);
        }
    }
    /* log-softmax of the penalized logits */
    float m = vmax(logits, vocab);
    float lse = m + (float)log(vsumexp(logits, vocab, 1.0f, m, NULL));
    if (logprob) *logprob = logits[id] - lse;
    if (n_top) *n_top = 0;
    if (p->logprobs > 0 && top && n_top) {
        cand best[SF_MAX_LOGPROBS];
        int n = top_n(logits, vocab, SF_MIN(p->logprobs, SF_MAX_LOGPROBS), best);
        for (int i = 0; i < n; i++) { top[i].id = best[i].id; top[i].logprob = best[i].v - lse; }
        *n_top = n;
    }
    return id;
}
