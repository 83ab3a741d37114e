/* sampler.c — one row of logits to one token.
 *
 * Order, as vLLM and llama.cpp apply it: logit_bias (OpenAI) added to the raw logits, then
 * penalties (repetition: HF, over prompt and output; presence/frequency: OpenAI, over output);
 * the reported logprobs come from these penalized logits; then temperature; then top-k, top-p,
 * min-p; then a draw. Before a request's min_tokens its EOS and stop ids are -inf. Temperature 0
 * is greedy (argmax of the penalized logits). The truncations and the draw are
 * the backend sample op's reference (kernels/cpu/sample.c: radix selection, no sort; a
 * Gumbel-max draw keyed by (seed, step, id)), so the host path here and the op on any backend
 * choose the same way. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"


/* Appends an id to the penalty list unless it is there. */
static int touch(sf_sampler_seq *s, int32_t id)
{
    if (s->flags[id] & SF_SS_TOUCHED) return 0;
    if (s->n_touched == s->cap_touched) {
        int cap = s->cap_touched ? 2 * s->cap_touched : 64;
        int32_t *t = realloc(s->touched, (size_t)cap * sizeof *t);
        if (!t) return -1;
        s->touched = t;
        s->cap_touched = cap;
    }
    s->touched[s->n_touched++] = id;
    s->flags[id] |= SF_SS_TOUCHED;
    return 0;
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
    if (p->n_bias < 0 || p->n_bias > SF_MAX_LOGIT_BIAS || (p->n_bias && !p->bias))
        return sf_err(err, SF_EINVAL, "%d logit_bias entries: at most %d are allowed", p->n_bias, SF_MAX_LOGIT_BIAS);
    for (int i = 0; i < p->n_bias; i++) {
        const sf_logit_bias *b = &p->bias[i];
        if (b->id < 0 || b->id >= vocab)
            return sf_err(err, SF_EINVAL, "logit_bias token id %d is outside the vocabulary [0, %d)", b->id, vocab);
        if (!(b->bias >= -100 && b->bias <= 100))
            return sf_err(err, SF_EINVAL, "logit_bias of token %d is %g: outside [-100, 100]", b->id, b->bias);
        for (int j = 0; j < i; j++) /* at most ~0.5M compares */
            if (p->bias[j].id == b->id) return sf_err(err, SF_EINVAL, "logit_bias names token %d twice", b->id);
    }
    s->seed = p->has_seed ? p->seed : sf_now_ns() ^ ((uint64_t)(uintptr_t)s << 17);
    sf_rng_seed(&s->rng, s->seed);
    int rep = p->repetition_penalty != 1.0f;
    if (!rep && p->presence_penalty == 0 && p->frequency_penalty == 0) return SF_OK; /* the bias alone: its list */
    if (!(s->counts = calloc((size_t)vocab, sizeof *s->counts)) || !(s->flags = calloc((size_t)vocab, 1))) goto oom;
    s->cap_touched = 64;
    if (!(s->touched = malloc((size_t)s->cap_touched * sizeof *s->touched))) goto oom;
    for (int i = 0; i < p->n_bias; i++) /* first, in order (distinct): entry i carries bias i */
        if (touch(s, p->bias[i].id)) goto oom;
    for (int i = 0; rep && i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= vocab) {
            sf_sampler_seq_free(s);
            return sf_err(err, SF_EINVAL, "sampler: prompt token %d at %d is outside the vocabulary [0, %d)", prompt[i],
                          i, vocab);
        }
        if (touch(s, prompt[i])) goto oom;
        s->flags[prompt[i]] |= SF_SS_IN_PROMPT;
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
    free(s->flags);
    free(s->touched);
    s->counts = NULL;
    s->flags = NULL;
    s->touched = NULL;
    s->n_touched = s->cap_touched = 0;
}

void sf_sampler_accept(sf_sampler_seq *s, int32_t id)
{
    s->step++;
    if (!s->counts || id < 0) return;
    if (touch(s, id))
        SF_LOGW("sampler: out of memory for the penalty list; token %d keeps no penalty on the device path", id);
    s->counts[id]++;
}

void sf_sampler_lp_out(const sf_sample_lp *lp, const sf_sampling *p, float *logprob, sf_logprob *top, int *n_top)
{
    if (logprob) *logprob = lp->lp;
    if (!n_top) return;
    *n_top = p->logprobs > 0 && top ? SF_MIN(lp->n_top, SF_MIN(p->logprobs, SF_MAX_LOGPROBS)) : 0;
    for (int i = 0; i < *n_top; i++) top[i] = (sf_logprob){ lp->top_id[i], lp->top_lp[i] };
}

void sf_sampler_set_ban(sf_sampler_seq *s, const int32_t *ids, int n, int vocab)
{
    s->n_ban = 0;
    for (int i = 0; i < n && s->n_ban < SF_SS_MAX_BAN; i++) {
        int dup = 0;
        for (int j = 0; j < s->n_ban; j++) dup |= s->ban[j] == ids[i];
        if (!dup && ids[i] >= 0 && ids[i] < vocab) s->ban[s->n_ban++] = ids[i];
    }
}

/* Whether the next draw keeps the ban list out (fewer than min_tokens accepted). */
static int banning(const sf_sampling *p, const sf_sampler_seq *s)
{
    return s->n_ban > 0 && s->step < (uint64_t)(p->min_tokens > 0 ? p->min_tokens : 0);
}

int sf_sampler_row(const sf_sampling *p, const sf_sampler_seq *s, sf_sample_row *row, sf_sample_pen **pen,
                   int *n_pen, int *cap_pen)
{
    *row = (sf_sample_row){ .temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
                            .repetition_penalty = p->repetition_penalty, .presence_penalty = p->presence_penalty,
                            .frequency_penalty = p->frequency_penalty, .seed = s->seed, .step = s->step,
                            .pen_off = *n_pen, .n_pen = 0,
                            .logprobs = p->logprobs < 0   ? 1
                                        : p->logprobs > 0 ? 1 + SF_MIN(p->logprobs, SF_SAMPLE_TOP_MAX)
                                                          : 0 };
    const int n = s->counts ? s->n_touched : p->n_bias, ban = banning(p, s) ? s->n_ban : 0;
    if (!n && !ban) return SF_OK;
    if (*n_pen + n + ban > *cap_pen) {
        int cap = SF_MAX(2 * *cap_pen, *n_pen + n + ban);
        sf_sample_pen *t = realloc(*pen, (size_t)cap * sizeof *t);
        if (!t) return SF_ENOMEM;
        *pen = t;
        *cap_pen = cap;
    }
    sf_sample_pen *e = *pen + *n_pen;
    for (int i = 0; i < n; i++) {
        const float bias = i < p->n_bias ? p->bias[i].bias : 0.0f;
        if (!s->counts) {
            e[i] = (sf_sample_pen){ p->bias[i].id, 0, 0, bias };
            continue;
        }
        const int32_t id = s->touched[i];
        e[i] = (sf_sample_pen){ id, s->counts[id], (s->flags[id] & SF_SS_IN_PROMPT) != 0, bias };
    }
    int m = n;
    for (int b = 0; b < ban; b++) { /* -inf: an entry of the id if it has one, else its own */
        int j = 0;
        while (j < n && e[j].id != s->ban[b]) j++;
        if (j == n) e[j = m++] = (sf_sample_pen){ s->ban[b], 0, 0, 0.0f };
        e[j].bias = -INFINITY;
    }
    *n_pen += m;
    row->n_pen = m;
    return SF_OK;
}

static void apply_penalties(const sf_sampling *p, const sf_sampler_seq *s, float *l, int vocab)
{
    for (int i = 0; i < p->n_bias; i++) l[p->bias[i].id] += p->bias[i].bias;
    if (banning(p, s))
        for (int i = 0; i < s->n_ban; i++) l[s->ban[i]] = -INFINITY;
    if (!s->counts) return;
    float rp = p->repetition_penalty, pp = p->presence_penalty, fp = p->frequency_penalty;
    for (int i = 0; i < vocab; i++) {
        int c = s->counts[i];
        if (rp != 1.0f && (c > 0 || (s->flags[i] & SF_SS_IN_PROMPT)))
            l[i] = l[i] > 0 ? l[i] / rp : l[i] * rp;
        if (c > 0) l[i] -= fp * (float)c + pp;
    }
}

static int32_t argmax(const float *l, int vocab)
{
    int32_t best = 0;
    for (int i = 1; i < vocab; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* The op's reference on the penalized row (penalties already applied: no entries). */
static int32_t draw(const sf_sampling *p, const sf_sampler_seq *s, const float *l, int vocab)
{
    sf_sample_row row = { .temperature = p->temperature, .top_p = p->top_p, .min_p = p->min_p, .top_k = p->top_k,
                          .repetition_penalty = 1.0f, .seed = s->seed, .step = s->step };
    sf_cpu_sample_scratch sc = { malloc((size_t)vocab * sizeof(float)), malloc((size_t)vocab * sizeof(uint32_t)),
                                 malloc((size_t)vocab * sizeof(uint64_t)) };
    int32_t id = -1;
    if (sc.x && sc.key && sc.mass) id = sf_cpu_sample_row(l, vocab, &row, NULL, &sc, NULL);
    free(sc.x);
    free(sc.key);
    free(sc.mass);
    return id;
}

int32_t sf_sample(const sf_sampling *p, sf_sampler_seq *s, float *logits, int vocab, float *logprob,
                  sf_logprob *top, int *n_top)
{
    apply_penalties(p, s, logits, vocab);
    int32_t id = draw(p, s, logits, vocab);
    if (id < 0) {
        SF_LOGW("sampler: out of memory for a row of %d; falling back to greedy", vocab);
        id = argmax(logits, vocab);
    }
    /* log-softmax of the penalized logits: what the backend's op gives (sf_sample_lp) */
    sf_sample_lp lp;
    sf_cpu_sample_lp(logits, vocab, id, top && n_top ? p->logprobs : 0, &lp);
    sf_sampler_lp_out(&lp, p, logprob, top, n_top);
    return id;
}
