/* forward.h — the Llama-family forward pass, written once against the backend table.
 * Internal to engine/. Called on the engine thread only.
 *
 *   h = embed(tokens)
 *   per layer:  x = rmsnorm(h (+= mlp_out of the previous layer)) ; qkv = x·Wqkv (+b)
 *               rope_kv(qkv) -> K,V appended to the paged cache ; a = attention(q, cache)
 *               x = rmsnorm(h += a·Wo) ; y = (silu(x·Wg) * x·Wu)·Wd
 *   logits = rmsnorm(h += y)[logit_rows] · Wlm
 */
#ifndef SF_FORWARD_H
#define SF_FORWARD_H

#include "../hal/hal.h"
#include "model.h"

typedef struct sf_forward sf_forward;

/* Uploads (or references) the model's weights into the backend — QKV and gate/up fused into
 * one weight each — precomputes RoPE frequencies and allocates activations for up to
 * max_tokens tokens per step and max_logits logit rows. Does not allocate the KV cache. */
int sf_forward_new(sf_backend *b, const sf_model *m, int max_tokens, int max_logits,
                   sf_forward **out, sf_error *err);
void sf_forward_free(sf_forward *f);

/* Tensor parallelism: the same, for one rank. sh is this rank's shard (shard.h; it and the full
 * model outlive the forward pass) and comm joins the ranks (hal/comm.h; rank and size must match
 * the shard). Adds an all-reduce after the O and down projections and gathers the
 * vocabulary-parallel logits. Every rank runs every step with the same batch. */
struct sf_shard;
struct sf_comm;
int sf_forward_new_tp(sf_backend *b, const struct sf_shard *sh, struct sf_comm *comm, int max_tokens,
                      int max_logits, sf_forward **out, sf_error *err);

/* Runs one step. logits: host memory, [batch->n_logits * vocab] fp32, row i for the token at
 * batch->logit_rows[i] (NULL: not wanted, e.g. on a follower rank). The backend's KV cache must
 * have been initialised (kv_init). */
int sf_forward_step(sf_forward *f, const sf_batch *batch, float *logits, sf_error *err);

/* Sampling on the backend, so that only token ids leave it. */
typedef struct sf_forward_sample {
    const sf_sample_row *rows;   /* [batch->n_logits], row i for the token at batch->logit_rows[i] */
    const sf_sample_pen *pen;    /* penalty entries the rows point into */
    int n_pen;
    int32_t *ids;                /* out: [batch->n_logits] the drawn tokens */
    sf_sample_lp *lp;            /* out: [batch->n_logits] where rows ask for logprobs; NULL when none does */
    /* Called once the step's logits are queued (the backend flushed, so the device computes
     * them meanwhile) and before the draw is queued: host work the draw needs and the forward
     * pass does not (a form's allow mask), done while the device runs. SF_EUNSUPPORTED: draw on
     * the host (sf_forward_read_logits); another status fails the step. NULL: none. */
    int (*prepare)(void *arg);
    void *prepare_arg;
} sf_forward_sample;
/* 1 when sf_forward_step_sample can run: the backend has a sample op and, with a vocabulary split
 * over ranks, the communicator can lay the gathered slices out as whole rows (every rank takes
 * part in the same gather; a rank that does not draw runs sf_forward_step with logits NULL). */
int sf_forward_can_sample(const sf_forward *f);
/* The same step as sf_forward_step, ending in the backend's sample op instead of a copy of the
 * logits. SF_EUNSUPPORTED when the backend declined this call's sizes: the step has run, and
 * sf_forward_read_logits then gives its logits for the host sampler. */
int sf_forward_step_sample(sf_forward *f, const sf_batch *batch, const sf_forward_sample *s, sf_error *err);
/* sf_forward_step_sample in two halves, so that the host can work while the device runs the
 * step: launch queues the step and its draw and returns (on a backend with sample_start; on
 * others it runs the whole step and s->ids is written when it returns), and wait waits for the
 * ids (written to s->ids, which must stay valid until then). After a successful launch, wait
 * comes before any other call on f. Under tensor parallelism launch returns once the logits'
 * gather has completed (the communicator waits for it). */
int sf_forward_launch_sample(sf_forward *f, const sf_batch *batch, const sf_forward_sample *s, sf_error *err);
int sf_forward_wait_sample(sf_forward *f, sf_error *err);
/* After a successful sf_forward_launch_sample: 1 when it returned only once the step's work
 * but the draw was done (the backend drew synchronously, or under TP the logits' gather
 * waited), 0 when it returned with the step queued. */
int sf_forward_launch_waited(const sf_forward *f);
/* The first n logit rows of the last step, to host memory [n * vocab] fp32. Under tensor
 * parallelism: of the last sf_forward_step_sample (its gathered rows). */
int sf_forward_read_logits(sf_forward *f, int n, float *logits, sf_error *err);

/* Whether the backend scores logit rows itself (its score op, and the vocabulary not split
 * over ranks): a step's scored rows (sf_batch.n_scored) then never reach the host. */
int sf_forward_can_score(const sf_forward *f);
/* After a step (and its draw, if any, waited for): rows [row0, row0 + n) of its logits scored
 * at targets (hal.h's score op): log-probability, rank, and the k most likely ids with theirs
 * (top_id / top_lp [n * k]). */
int sf_forward_score(sf_forward *f, int row0, int n, const int32_t *targets, int k, float *lp, int32_t *rank,
                     int32_t *top_id, float *top_lp, sf_error *err);
/* Async scheduling. sf_forward_defer(f, 1) turns on the backend's sample_defer (hal.h): from
 * then on sf_forward_wait_sample returns at once and leaves the draw queued (under TP its
 * logits' gather too), and sf_forward_take waits for the oldest queued draw — under TP watching
 * the peers, as the communicator's waits do — and takes its ids (to the launch's s->ids). Up to
 * SF_COMM_MARKS draws may be queued (the backend may allow fewer). SF_EINVAL with draws queued;
 * SF_EUNSUPPORTED for a backend without sample_defer. sf_forward_take with none queued calls the
 * backend's sample_take (SF_OK: nothing to take). */
int sf_forward_defer(sf_forward *f, int on, sf_error *err);
int sf_forward_take(sf_forward *f, sf_error *err);

#endif
