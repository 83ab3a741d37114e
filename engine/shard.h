/* shard.h — one tensor-parallel rank's share of a model (Megatron-style), as views into the
 * full model's storage: nothing is copied, so with memory-mapped files each rank touches only
 * the bytes of its slices. Internal to engine/.
 *
 *   q/k/v, gate/up   column-parallel: rows [lo, hi) of [out, in] (contiguous)
 *   o, down          row-parallel: columns [lo, hi) of [out, in] (strided views); the forward
 *                    pass all-reduces their outputs
 *   kv heads         divided across ranks; when there are fewer kv heads than ranks each kv
 *                    head is replicated on size / n_kv_heads consecutive ranks
 *   lm_head          vocabulary-parallel: rows [vocab_lo, vocab_hi), padded with zero rows to
 *                    vocab_pad so that every rank's logit slice has the same width
 *   embedding, norms replicated
 *
 * Requirements (checked, with a message naming the number that does not divide): n_heads a
 * multiple of size; n_kv_heads a multiple of size, or size a multiple of n_kv_heads. The FFN
 * width may split unevenly (in whole 32-blocks for Q8_0 weights). */
#ifndef SF_SHARD_H
#define SF_SHARD_H

#include "model.h"

typedef struct sf_shard {
    sf_model m;              /* this rank's model: cfg holds the LOCAL head counts and FFN width
                                (vocab_size stays the full vocabulary); storage fields are empty:
                                the full model owns the memory and must outlive the shard */
    int rank, size;
    int q_head0, kv_head0;   /* first global query / kv head of this rank */
    int ffn_lo, ffn_hi;      /* FFN columns of this rank */
    int vocab_lo, vocab_hi;  /* real lm_head rows of this rank */
    int vocab_pad;           /* logit slice width of every rank: ceil(vocab / size) */
    sf_view lm_pad;          /* zero rows completing lm_head to vocab_pad (data NULL when none) */
} sf_shard;

/* Fills s for `rank` of `size` (size 1 gives the whole model as one shard). */
int sf_shard_make(const sf_model *full, int rank, int size, sf_shard *s, sf_error *err);
void sf_shard_free(sf_shard *s);

/* Checks that a model can be split `size` ways; the message says what to choose instead. */
int sf_shard_check(const sf_model_config *c, int size, sf_error *err);

#endif
