/* sample.c — one logit row to one token id: the reference of the backend's sample op
 * (hal.h, sf_sample_row), written to be mirrored step for step by kernels/cuda/sample.cu.
 *
 * No sort of the vocabulary. Every truncation (top-k, top-p, min-p) keeps a prefix of the
 * order (x descending, id ascending), written as a boundary (t, c): a token with key k and id
 * i is kept when k > t, or k == t and i <= c. Boundaries are found by radix selection over the
 * 32-bit ordered keys, 8 bits a pass: by count for top-k, by fixed-point mass for top-p. Ties
 * on the boundary key are cut by id. The draw is Gumbel-max over the kept tokens, with a
 * counter-based uniform per (seed, step, id), so it needs neither a cumulative sum nor state. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "../sample_draw.h"
#include "cpu.h"

typedef struct bound { uint32_t t; int32_t c; } bound; /* kept: key > t, or key == t and id <= c */

static int shorter(bound a, bound b) { return a.t > b.t || (a.t == b.t && a.c < b.c); }

static int kept(bound b, uint32_t k, int32_t id) { return k > b.t || (k == b.t && id <= b.c); }

/* The key t of the prefix that reaches `want`: by count (mass NULL: want-th largest key) or
 * by mass (the smallest key whose suffix mass reaches want). *above: count or mass of the
 * keys strictly above t. Key 0 (not a candidate) never counts. */
static uint32_t radix_select(const uint32_t *key, const uint64_t *mass, int n, uint64_t want, uint64_t *above)
{
    uint32_t prefix = 0, mask = 0;
    uint64_t acc = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        uint64_t h[256] = { 0 };
        for (int i = 0; i < n; i++)
            if (key[i] && (key[i] & mask) == prefix) h[(key[i] >> shift) & 255] += mass ? mass[i] : 1;
        int b = 255;
        for (; b > 0; b--) {
            if (acc + h[b] >= want) break;
            acc += h[b];
        }
        prefix |= (uint32_t)b << shift;
        mask |= 255u << shift;
    }
    *above = acc;
    return prefix;
}

/* The boundary that keeps the r first (by id) of the tokens with key t. */
static bound cut_ties(const uint32_t *key, int n, uint32_t t, uint64_t r)
{
    bound b = { t, INT_MAX };
    uint64_t seen = 0;
    for (int i = 0; i < n; i++)
        if (key[i] == t && ++seen == r) { b.c = i; break; }
    for (int i = b.c + 1; b.c != INT_MAX && i < n; i++)
        if (key[i] == t) return b; /* a tie remains beyond: the cut is real */
    b.c = INT_MAX;
    return b;
}

static int32_t argmax_first(const float *l, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best] || (l[best] != l[best] && l[i] == l[i])) best = i;
    return best;
}

/* The draw keeps the argmax of x - log(-log1p(-u)) (Gumbel-max). A token cannot reach the best
 * value v found so far when u > exp(x - v): reaching v needs -log1p(-u) <= exp(x - v), and
 * -log1p(-u) >= u. The factor 1.001 (1e-3 in the value) is far more than the float rounding on
 * either side, so a token passed over is one whose value would have been below v: the draw is
 * the same token, without its two logarithms (a running best soon stands ~ln(n) above the row's
 * max, so most tokens are passed over: ~1 ms of a 58 ms token of the 1B preset on two cores).
 * The kernel does not skip: a warp takes the logarithms when any of its 32 tokens needs them
 * (256 rows of 128256 on the H200: 160 us with the skip, 157 without). */
static int below(float u, float x, float v)
{
    return u > expf(x - v) * 1.001f;
}

/* Step 1 of an entry's id: its logit_bias, then its penalties. */
static float penalize(const sf_sample_row *p, const sf_sample_pen *e, float l)
{
    float v = l + e->bias;
    if (p->repetition_penalty != 1.0f && (e->count > 0 || e->in_prompt))
        v = v > 0 ? v / p->repetition_penalty : v * p->repetition_penalty;
    if (e->count > 0) v -= p->frequency_penalty * (float)e->count + p->presence_penalty;
    return v;
}

static int allowed(const sf_sample_row *p, int32_t id) { return !p->allow || ((p->allow[id >> 5] >> (id & 31)) & 1u); }

/* The log-sum-exp of x's ids that are not -inf (-inf when none is), and x's n most likely of
 * them into lp's top entries. */
static float lse_top(const float *x, int vocab, int n, sf_sample_lp *lp)
{
    const float m = sf_cpu_max(x, vocab);
    lp->n_top = 0;
    if (!(m > -INFINITY)) return -INFINITY;
    const float lse = m + (float)log(sf_cpu_sumexp(x, vocab, 1.0f, m, NULL));
    int k = n > 0 ? sf_cpu_top_n(x, vocab, SF_MIN(n, SF_SAMPLE_TOP_MAX), lp->top_id, lp->top_lp) : 0;
    while (k > 0 && !(lp->top_lp[k - 1] > -INFINITY)) k--; /* -inf sorts last */
    for (int i = 0; i < k; i++) lp->top_lp[i] -= lse;
    lp->n_top = k;
    return lse;
}

void sf_cpu_sample_lp(const float *x, int vocab, int32_t id, int n, sf_sample_lp *lp)
{
    const float lse = lse_top(x, vocab, n, lp);
    lp->lp = lse > -INFINITY ? x[id] - lse : -INFINITY;
}

static int32_t draw_row(float *x, int vocab, const sf_sample_row *p, sf_cpu_sample_scratch *sc);

int32_t sf_cpu_sample_row(const float *logits, int vocab, const sf_sample_row *p, const sf_sample_pen *pen,
                          sf_cpu_sample_scratch *sc, sf_sample_lp *lp)
{
    float *x = sc->x;
    memcpy(x, logits, (size_t)vocab * sizeof *x);
    const sf_sample_pen *e = p->n_pen > 0 ? pen + p->pen_off : NULL;
    for (int j = 0; j < p->n_pen; j++) x[e[j].id] = penalize(p, &e[j], x[e[j].id]);
    if (p->allow)
        for (int i = 0; i < vocab; i++)
            if (!allowed(p, i)) x[i] = -INFINITY;
    if (!lp || p->logprobs <= 0) return draw_row(x, vocab, p, sc);
    const float lse = lse_top(x, vocab, p->logprobs - 1, lp);
    const int32_t id = draw_row(x, vocab, p, sc); /* x is the draw's scratch from here */
    float v = logits[id];
    for (int j = 0; j < p->n_pen; j++)
        if (e[j].id == id) v = penalize(p, &e[j], v);
    lp->lp = lse > -INFINITY && allowed(p, id) ? v - lse : -INFINITY;
    return id;
}

/* The draw (steps 2-4) from x, the row after step 1 (x is scaled in place). */
static int32_t draw_row(float *x, int vocab, const sf_sample_row *p, sf_cpu_sample_scratch *sc)
{
    uint32_t *key = sc->key;
    uint64_t *mass = sc->mass;
    if (sf_sample_greedy(p->temperature, p->top_k)) return argmax_first(x, vocab);

    float inv_t = 1.0f / p->temperature, m = -INFINITY;
    int n_valid = 0;
    for (int i = 0; i < vocab; i++) {
        float v = x[i] * inv_t;
        x[i] = v;
        if (v == v && v != -INFINITY) {
            n_valid++;
            if (v > m) m = v;
        }
    }
    if (!n_valid) return argmax_first(x, vocab);
    uint64_t z = 0;
    for (int i = 0; i < vocab; i++) {
        int ok = x[i] == x[i] && x[i] != -INFINITY;
        key[i] = ok ? sf_sample_key(x[i]) : 0;
        mass[i] = ok ? (uint64_t)(expf(x[i] - m) * SF_SAMPLE_MASS_ONE) : 0;
        z += mass[i];
    }
    bound keep = { 0, -1 }; /* every candidate */
    uint64_t zk = z, above;
    if (p->top_k > 0 && p->top_k < n_valid) {
        uint32_t t = radix_select(key, NULL, vocab, (uint64_t)p->top_k, &above);
        uint64_t m_above = 0, m_t = 0;
        for (int i = 0; i < vocab; i++) {
            if (key[i] > t) m_above += mass[i];
            else if (key[i] == t) m_t = mass[i];
        }
        uint64_t r = (uint64_t)p->top_k - above;
        keep = cut_ties(key, vocab, t, r);
        zk = m_above + r * m_t;
    }
    if (p->top_p < 1.0f) {
        uint64_t want = (uint64_t)((double)p->top_p * (double)zk);
        if (want < 1) want = 1;
        uint32_t t = radix_select(key, mass, vocab, want, &above);
        uint64_t m_t = 0, n_t = 0;
        for (int i = 0; i < vocab; i++)
            if (key[i] == t) { m_t = mass[i]; n_t++; }
        uint64_t r = m_t ? (want - above + m_t - 1) / m_t : n_t;
        if (r < 1) r = 1;
        if (r > n_t) r = n_t;
        bound b = cut_ties(key, vocab, t, r);
        if (shorter(b, keep)) keep = b;
    }
    if (p->min_p > 0) {
        bound b = { sf_sample_key(m + logf(p->min_p)), INT_MAX }; /* key >= the threshold's */
        if (shorter(b, keep)) keep = b;
    }
    uint64_t stream = sf_sample_stream(p->seed, p->step);
    int32_t best = -1;
    float best_g = -INFINITY;
    for (int i = 0; i < vocab; i++) {
        if (!key[i] || !kept(keep, key[i], i)) continue;
        const float u = sf_sample_uniform(stream, (uint32_t)i);
        if (best >= 0 && below(u, x[i], best_g)) continue;
        float g = sf_sample_gumbel(x[i], u);
        if (best < 0 || g > best_g) { best = i; best_g = g; }
    }
    return best >= 0 ? best : argmax_first(x, vocab);
}

void sf_cpu_sample_task(void *arg, int ith, int nth)
{
    const sf_cpu_sample *a = arg;
    int64_t lo, hi;
    sf_cpu_split(a->n, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        a->ids[r] = sf_cpu_sample_row(a->logits + r * a->ld, a->vocab, &a->rows[r], a->pen, &a->scratch[ith],
                                      a->lp ? &a->lp[r] : NULL);
}
