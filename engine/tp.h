/* tp.h — tensor-parallel rank processes. Internal to engine/ and cli/.
 *
 * One engine spans `size` ranks, one process each (one GPU each on CUDA). Rank 0, the leader,
 * is the engine itself: it runs the scheduler once and, before every forward step, broadcasts
 * the step's sf_batch over the communicator; the followers (`semflow rank`, started by the
 * leader from its own binary) wait for those plans and run the same sf_forward_step on their
 * shard. The forward pass's all-reduces keep every rank's residual stream identical; the
 * leader receives the gathered logits and samples.
 *
 * Failure: every wait has a timeout (SEMFLOW_TP_TIMEOUT_MS, default 60 s) and a dead rank is
 * noticed at the next collective; the leader's calls then fail with SF_ENODEV and a message
 * naming the rank, and keep failing (the group cannot recover). Followers exit when the leader
 * dies (noticed at their next wait) or the group fails. Threads: all calls on one thread (the
 * engine thread after setup). */
#ifndef SF_TP_H
#define SF_TP_H

#include <sys/types.h>

#include "../hal/comm.h"
#include "forward.h"
#include "model.h"

/* What every rank needs to rebuild the leader's setup (passed to followers as arguments). */
typedef struct sf_tp_rank_opts {
    int rank, size;
    const char *model;        /* path as given to sf_model_load */
    int load_dummy;
    const char *dummy_format; /* dummy weights' format (sf_load_opts.dummy_format; NULL: bf16) */
    uint64_t seed;
    const char *backend;      /* "cpu" | "cuda" (resolved, not "auto") */
    int n_threads;
    int device;               /* this rank's device (CUDA) */
    int max_tokens, max_logits;
    int shm_fd;               /* cpu: the group's segment */
    const char *bootstrap;    /* cuda: rank 0's host:port */
    int timeout_ms;           /* 0: default */
} sf_tp_rank_opts;

typedef struct sf_tp sf_tp;

/* Leader, the whole setup: makes the group, starts size-1 followers from `exe` (NULL:
 * /proc/self/exe) as `exe rank ...`, joins as rank 0 and builds this rank's forward pass for
 * the loaded model m on backend b. o->rank must be 0; o describes the setup. */
int sf_tp_start(const sf_tp_rank_opts *o, const char *exe, const sf_model *m, sf_backend *b, sf_tp **out,
                sf_error *err);

/* Leader, in parts (tests start followers with fork): the group (a shared segment for cpu, a
 * bootstrap port for cuda) filled into o, then the leader proper. pids: the followers' process
 * ids (n = size-1), which the leader reaps at sf_tp_free. */
int sf_tp_group_create(sf_tp_rank_opts *o, sf_error *err);
int sf_tp_leader_new(const sf_tp_rank_opts *o, const sf_model *m, sf_backend *b, const pid_t *pids, sf_tp **out,
                     sf_error *err);

/* This rank's kv heads (for sizing the KV cache). */
int sf_tp_kv_heads(const sf_tp *tp);
/* Rank 0's shard: its model views with local shapes (per-rank weight bytes). */
const sf_model *sf_tp_model(const sf_tp *tp);
/* The forward pass of rank 0. */
sf_forward *sf_tp_forward(sf_tp *tp);
/* Every rank initialises its KV cache with kc (n_kv_heads = sf_tp_kv_heads). */
int sf_tp_kv_init(sf_tp *tp, const sf_kv_config *kc, sf_error *err);
/* Swap (engine/swap.h), after sf_tp_kv_init: every follower takes a swap space of n_slots slots
 * for its share of a block (SF_ENODEV, the group failed, when one cannot). sf_tp_kv_copy sends
 * the followers a copy of their shares of blocks[i] to (d2h) or from slot slots[i], which they
 * run behind the steps already sent; rank 0's own share is the caller's to copy. */
int sf_tp_swap_init(sf_tp *tp, int n_slots, sf_error *err);
int sf_tp_kv_copy(sf_tp *tp, const int32_t *blocks, const int32_t *slots, int n, int d2h, sf_error *err);
/* One step on every rank; logits as sf_forward_step. SF_ENODEV once the group failed. */
int sf_tp_step(sf_tp *tp, const sf_batch *b, float *logits, sf_error *err);
/* The same step, sampled on rank 0's device (sf_forward_step_sample on the gathered rows): only
 * ids cross to the host. SF_EUNSUPPORTED (the group stays up) when the sampler declined: the
 * step ran, and sf_forward_read_logits(sf_tp_forward(tp), ...) gives the rows. */
int sf_tp_step_sample(sf_tp *tp, const sf_batch *b, const sf_forward_sample *smp, sf_error *err);
/* sf_tp_step_sample in two halves (sf_forward_launch_sample / sf_forward_wait_sample on rank
 * 0): launch sends the plan and queues the step; wait waits for the ids. SF_ENODEV once the
 * group failed; launch's SF_EUNSUPPORTED as sf_tp_step_sample's. */
int sf_tp_launch_sample(sf_tp *tp, const sf_batch *b, const sf_forward_sample *smp, sf_error *err);
int sf_tp_wait_sample(sf_tp *tp, sf_error *err);
/* Async scheduling (engine/forward.h sf_forward_defer): on, every rank draws the steps launched
 * with sf_tp_launch_sample (the followers with the same rows on the same gathered logits), so a
 * later step may take its tokens from the last draw on every rank's device (sf_batch.src_row);
 * sf_tp_wait_sample then leaves the draw queued and sf_tp_take waits for the oldest (watching
 * the peers) and takes its ids. SF_EUNSUPPORTED when rank 0's backend cannot keep draws queued;
 * SF_ENODEV once the group failed. */
int sf_tp_defer(sf_tp *tp, int on, sf_error *err);
int sf_tp_take(sf_tp *tp, sf_error *err);
/* Seconds the last step plan took to send to the followers (the leader's part of a TP step). */
double sf_tp_last_send_s(const sf_tp *tp);
/* Benchmark: every rank all-reduces an activation buffer of n elements `iters` times back to
 * back (after `iters / 10 + 1` untimed); *us = the leader's wall time per all-reduce, queued
 * and completed (the backend synced at the end). For the all-reduce latency table. */
int sf_tp_bench_all_reduce(sf_tp *tp, int64_t n, int iters, double *us, sf_error *err);
/* The same on a given all-reduce path (SF_COMM_PATH_NCCL / _CUSTOM force one on every rank;
 * CUSTOM falls back to NCCL for messages the custom path cannot take). */
int sf_tp_bench_all_reduce_path(sf_tp *tp, int64_t n, int iters, sf_comm_path path, double *us, sf_error *err);
/* Correctness of the all-reduce on `path` (every rank, real processes): `iters` rounds of
 * messages up to max_n values whose size changes every round, each against the exact sum,
 * then 8 all-reduces back to back. A rank that sees a wrong value fails the group with that
 * value in its message. *worst: the leader's largest relative error. */
int sf_tp_check_all_reduce(sf_tp *tp, int64_t max_n, int iters, sf_comm_path path, double *worst, sf_error *err);
/* The leader's communicator (read-only: its paths and crossover, for reports). */
const sf_comm *sf_tp_comm(const sf_tp *tp);
/* Stops the followers (waits up to 5 s, then kills them) and frees. NULL is fine. */
void sf_tp_free(sf_tp *tp);

/* Follower: joins, loads, serves step plans until the leader stops it. Returns SF_OK on a
 * clean stop, else the error that ended it. */
int sf_tp_follower_run(const sf_tp_rank_opts *o, sf_error *err);

/* argv of a follower for `semflow rank` (static strings in buf; argv[0] = exe). */
int sf_tp_follower_argv(const sf_tp_rank_opts *o, int rank, const char *exe, char *buf, size_t n, char **argv,
                        int max_args);
/* Parses `semflow rank` arguments into o (strings point into argv). */
int sf_tp_parse_rank_args(int argc, char **argv, sf_tp_rank_opts *o, sf_error *err);

#endif
