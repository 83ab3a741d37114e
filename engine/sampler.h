/* sampler.h — turning one row of logits into a token: penalties, temperature, top-k, top-p,
 * min-p, seeded sampling, greedy, logprobs. Internal to engine/.
 *
 * The draw is the backend sample op's (hal.h, sf_sample_row): a pure function of the logits,
 * the request's seed and the number of tokens drawn so far, whether it runs here on the host
 * (sf_sample: requests that want logprobs) or on the backend (sf_sampler_row), so the same
 * seed gives the same text on either path. */
#ifndef SF_SAMPLER_H
#define SF_SAMPLER_H

#include <stdint.h>

#include "../common/sf.h"
#include "../hal/hal.h"
#include "engine.h"

enum { SF_SS_IN_PROMPT = 1, SF_SS_TOUCHED = 2 };
#define SF_SS_MAX_BAN 24 /* ids kept from the draw before min_tokens: the stop ids and the EOS ids */
/* Per-sequence state kept by the engine. */
typedef struct sf_sampler_seq {
    sf_rng rng;
    int32_t *counts;     /* [vocab] occurrences of each id in the generated output (penalties) */
    uint8_t *flags;      /* [vocab] SF_SS_IN_PROMPT (repetition penalty), SF_SS_TOUCHED; with counts */
    uint64_t seed;       /* the request's seed, or one drawn from the clock */
    uint64_t step;       /* tokens accepted so far: the counter of the next draw */
    int32_t *touched;    /* distinct ids: the logit_bias ones first (in its order), then those with
                          * counts > 0 or in the prompt (penalties only) */
    int n_touched, cap_touched;
    int32_t ban[SF_SS_MAX_BAN]; /* distinct ids never drawn while step < the request's min_tokens */
    int n_ban;
} sf_sampler_seq;

int sf_sampler_seq_init(sf_sampler_seq *s, const sf_sampling *p, int vocab,
                        const int32_t *prompt, int n_prompt, sf_error *err);
void sf_sampler_seq_free(sf_sampler_seq *s);
/* The ids (in the vocabulary) that are not drawn while fewer than p->min_tokens tokens were
 * accepted: their logits are -inf then (on the host path and in the op's entries). Duplicates
 * and ids outside [0, vocab) are dropped; at most SF_SS_MAX_BAN are kept. */
void sf_sampler_set_ban(sf_sampler_seq *s, const int32_t *ids, int n, int vocab);
/* Record a generated id (for penalties). p->bias must stay as it was at init. */
void sf_sampler_accept(sf_sampler_seq *s, int32_t id);

/* Choose a token. logits [vocab] is modified in place (scratch). Writes the chosen id, its
 * log-probability under the model's distribution (after penalties and a form's mask, before
 * temperature and truncation, as OpenAI reports it), and the top n_top alternatives (ids whose
 * logit is not -inf) when p->logprobs > 0. */
int32_t sf_sample(const sf_sampling *p, sf_sampler_seq *s, float *logits, int vocab,
                  float *logprob, sf_logprob *top, int *n_top);

/* The backend sample op's view of this sequence: its parameters and draw counter in *row,
 * its penalty and logit_bias entries appended to *pen (grown with realloc; *n_pen entries used
 * of *cap_pen). SF_ENOMEM leaves *pen valid. */
int sf_sampler_row(const sf_sampling *p, const sf_sampler_seq *s, sf_sample_row *row, sf_sample_pen **pen,
                   int *n_pen, int *cap_pen);

/* A row's sf_sample_lp (the backend's, or sf_sample's) as the request reports it: the drawn
 * id's log-probability, and its top alternatives when p->logprobs > 0 (n_top NULL: none). */
void sf_sampler_lp_out(const sf_sample_lp *lp, const sf_sampling *p, float *logprob, sf_logprob *top, int *n_top);

#endif
