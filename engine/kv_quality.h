/* kv_quality.h — what INT8 KV costs in output quality, measured on a model and backend.
 * Internal to engine/; used by `semflow bench kv-quality` and the tests.
 *
 * For each prompt, three runs over the forward pass (one sequence at a time):
 *   1. full precision: the prompt, then n_gen greedy tokens; the logits before each of them
 *      are the reference (n_gen positions);
 *   2. INT8 KV, teacher-forced: the same prompt and the same n_gen - 1 tokens, so every
 *      position sees the same context; its logits are compared with the reference there;
 *   3. INT8 KV, free-running greedy: how many of the n_gen tokens come out the same, and the
 *      identical prefix;
 *   4. the noise floor: full precision again, teacher-forced, with the prompt fed one token per
 *      step instead of in chunks: other kernels (decode instead of prefill attention, GEMV
 *      instead of GEMM), so only rounding differs. A model that amplifies rounding shows it here,
 *      and INT8's figures read against it.
 * The comparison of run 2 gives max and mean |delta logit| over every position and vocabulary
 * entry, the relative L2 (||delta|| / ||reference||) and the top-1 agreement (share of positions
 * whose argmax is the same). Called on one thread; the backend is used exclusively meanwhile. */
#ifndef SF_KV_QUALITY_H
#define SF_KV_QUALITY_H

#include <stdint.h>

#include "../hal/hal.h"
#include "model.h"

typedef struct sf_kvq_opts {
    int n_gen;                /* positions per prompt (>= 1) */
    int chunk;                /* prefill tokens per step (>= 1) */
} sf_kvq_opts;

typedef struct sf_kvq_stats {
    int n_prompts, n_positions;
    double max_abs, mean_abs; /* |delta logit| over all positions x vocabulary */
    double rel_l2;            /* ||delta|| / ||reference|| over all positions */
    double top1;              /* share of positions whose argmax agrees (teacher-forced) */
    double floor_max_abs, floor_rel_l2, floor_top1; /* run 4 against the reference, same measures */
    long greedy_same, greedy_total; /* free-running INT8 greedy tokens equal to full precision's */
    int prefix_min;           /* shortest identical greedy prefix over the prompts */
    double s_full, s_i8;      /* seconds of runs 1 and 2 */
    size_t kv_bytes_full, kv_bytes_i8; /* KV bytes per token of each kind (data and scales) */
} sf_kvq_stats;

/* The backend must be open with no KV cache in use: this sets one up (kv_init) for the
 * longest prompt plus n_gen tokens. Prompts need lengths >= 1 and prompt + n_gen within the
 * model's context. */
int sf_kvq_run(sf_backend *b, const sf_model *m, const int32_t *const *prompts, const int *lens, int n_prompts,
               const sf_kvq_opts *o, sf_kvq_stats *st, sf_error *err);

#endif
