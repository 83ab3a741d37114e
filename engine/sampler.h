/* sampler.h — turning one row of logits into a token: penalties, temperature, top-k, top-p,
 * min-p, seeded sampling, greedy, logprobs. Internal to engine/. Pure functions of their
 * inputs (plus the caller's rng), so the same seed gives the same text. */
#ifndef SF_SAMPLER_H
#define SF_SAMPLER_H

#include <stdint.h>

#include "../common/sf.h"
#include "engine.h"

/* Per-sequence state kept by the engine. */
typedef struct sf_sampler_seq {
    sf_rng rng;
    int32_t *counts;     /* [vocab] occurrences of each id in the generated output (penalties) */
    uint8_t *in_prompt;  /* [vocab] 1 if the id occurs in the prompt (repetition penalty) */
} sf_sampler_seq;

int sf_sampler_seq_init(sf_sampler_seq *s, const sf_sampling *p, int vocab,
                        const int32_t *prompt, int n_prompt, sf_error *err);
void sf_sampler_seq_free(sf_sampler_seq *s);
/* Record a generated id (for penalties). */
void sf_sampler_accept(sf_sampler_seq *s, int32_t id);

/* Choose a token. logits [vocab] is modified in place (scratch). Writes the chosen id, its
 * log-probability under the model's distribution (after penalties, before temperature and
 * truncation, as OpenAI reports it), and the top n_top alternatives when p->logprobs > 0. */
int32_t sf_sample(const sf_sampling *p, sf_sampler_seq *s, float *logits, int vocab,
                  float *logprob, sf_logprob *top, int *n_top);

#endif
