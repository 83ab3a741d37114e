/* engine-impl.h — the engine's state, shared by engine.c (API, setup, the engine thread) and
 * step.c (the step pipeline). Internal to engine/.
 *
 * Threads: the fields above `mu` are the engine thread's alone once the thread runs; those
 * below are shared under `mu` (see each comment). */
#ifndef SF_ENGINE_IMPL_H
#define SF_ENGINE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "engine.h"
#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "request.h"
#include "scheduler.h"
#include "swap.h"
#include "tp.h"

/* A sampled token between take (appended to its sequence) and delivery (text and events). */
typedef struct sf_taken {
    sf_request *r;
    int32_t id;
    int end;                     /* sf_request_take's answer */
    int removed;                 /* already out of the scheduler (take ended it, or it got stuck) */
    int stuck;                   /* the next plan found it stuck: finish it (length) after delivery */
    float logprob;
    int n_top;
    sf_logprob top[SF_MAX_LOGPROBS];
} sf_taken;

/* A launched step whose ids are not taken yet. Its logit rows' sequences are row_seq[0..k) of
 * its slot (NULL for a request freed meanwhile: sf_engine_forget), its drawn ids ids[0..k) of
 * the slot. Its plan is the scheduler's current plan until the next step is planned: committed
 * when its ids are taken, or (async scheduling) just before the next step is planned. */
typedef struct sf_flight {
    int active;
    int on_dev;                  /* ids drawn on the backend; else e->logits hold the rows */
    int queued;                  /* its draw is queued on the backend until sample_take (async) */
    int committed;               /* its plan was committed (the next one was planned after it) */
    int slot;                    /* its half of e->ids and e->row_seq */
    int k;                       /* logit rows */
    int n_scored;                /* the last of them, scored on the backend at the take */
    int k_draw;                  /* the first of them, the next-token rows (the rest: scored positions) */
    int n_tokens, n_decode, n_prefill;
    int decode;                  /* every sequence brought one token */
    int n_spec;                  /* sequences with draft tokens (speculative decoding): taken, never planned behind */
    int taken;                   /* its rows were taken, early: by the launch of the step behind it, whose
                                  * forms' masks follow from its ids (step.c, form_masks) */
    int rt, sw;                  /* for the trace: high-urgency tokens, swapped blocks */
    double swap_ms;
    double t_plan;               /* sf_now_s when it was planned */
    double t_ready;              /* when the device could start it: t_plan, or (queued behind the
                                  * step before it) when that step's ids came */
    double t_enq;                /* when its work was all queued */
    double mask_s;               /* its forms' masks made after the ids of the step before it, while its
                                  * forward pass, queued before them, ran (step.c, form_masks) */
    double t_done;               /* its launch returned only once the step was done (0: not so) */
} sf_flight;

/* Where one loop turn's time went (seconds). */
typedef struct sf_turn_clock {
    double wait;                 /* blocked waiting for the device: the ids, or (TP) the gather inside the launch */
    double take, plan, batch, launch, send, deliver;
    double enqueue;              /* the backend's host time queuing the launched step (CUDA) */
    double exposed;              /* from the taken ids to the next step's work all queued: the device's idle gap,
                                  * less the masks made while that step's forward pass ran */
    double masks;                /* those masks' time (the gap only where they outlast the forward pass) */
} sf_turn_clock;

/* Block tables go to the backend with their row stride rounded up to a multiple of this many
 * blocks (sf_sched_config.table_quantum; the entries past a sequence's blocks are 0 and never
 * read): the stride is part of a step's CUDA graph key, and a rounded one keeps one graph for the
 * steps of many context lengths instead of one per block of growth. */
#define TABLE_STRIDE_QUANTUM 16
#define SF_STEP_HIST 1700        /* decode turn durations in buckets 1% wide from 10 µs (step.c) */

struct sf_engine {
    sf_engine_config cfg;
    sf_model *model;
    sf_backend *be;
    sf_forward *fwd;
    sf_tp *tp;                  /* tensor parallelism: the follower ranks (owns fwd then) */
    sf_kv_pool pool;
    int pool_ready;
    sf_sched sched;
    int sched_ready;
    sf_swap swap;               /* host swap space for preemption by swap (n_slots 0: off) */
    float *logits;              /* [max_num_seqs * vocab] host */
    int vocab, max_model_len;
    /* sampling on the backend: per-row parameters, drawn ids, penalty entries */
    sf_sample_row *rows;        /* [max_num_seqs] */
    int32_t *ids;               /* [2 * max_num_seqs]: the drawn ids of each flight slot */
    sf_seq **row_seq;           /* [2 * max_num_seqs]: the sequence of each logit row of each flight slot */
    int32_t *row_score;         /* [2 * max_logits]: the prompt position a logit row scores, -1: a draw's row */
    /* prompt scoring on the backend (dev_score): a step's scored rows' targets and results
     * ([max_logits], tops [max_logits * SF_MAX_LOGPROBS], score_k of them a row) */
    int dev_score;
    int32_t *sc_target, *sc_rank, *sc_tid;
    float *sc_lp, *sc_tlp;
    int score_k;
    int32_t *src_row;           /* [max_batched_tokens]: async scheduling, sf_batch.src_row */
    sf_request **victims;       /* [2 * max_num_seqs]: the requests of a failed step (step.c step_failed) */
    sf_sample_pen *pen;
    int cap_pen;
    /* requests held to a form drawn on the backend (step.c form_masks): their rows' allow masks
     * (vocab bits each, mask_cap of them), the row each mask is for, a float row per mask thread
     * to compute a mask on, the threads (mask_threads, the engine thread one of them; the pool
     * started at the first step with two such rows), and for each logit row of a flight slot
     * whether no token fitted its form */
    uint32_t *masks;
    int mask_cap;
    int *mask_row;              /* [max_logits] */
    int mask_threads;
    struct sf_cpu_pool *mask_pool;
    uint8_t *row_nofit;         /* [2 * max_logits] */
    sf_sample_lp *lp;           /* [2 * max_logits]: a flight slot's rows' log-probabilities drawn on the
                                 * backend (requests with logprobs) */
    /* the step pipeline (step.c) */
    int serial;                 /* 1: deliver before planning the next step (SEMFLOW_ENGINE_OVERLAP=0) */
    int async;                  /* 1: async scheduling (the backend's draws deferred: sample_defer) */
    uint64_t n_async;           /* steps queued behind the step before them (async) */
    uint64_t n_async_forms;     /* of them, with rows held to a form (masks made once the ids before came) */
    sf_flight fl;               /* the oldest step in flight: its ids are taken next */
    sf_flight fl2;              /* async: the step queued behind fl (launched before fl's ids came) */
    int next_slot;              /* the slot of the next step launched */
    sf_taken *taken;            /* [max_logits] tokens taken, not yet delivered */
    /* speculative decoding (sf_engine_config.spec_tokens; step.c): sequences given draft tokens
     * in the step being launched, and what drafting did */
    sf_seq **spec_seqs;         /* [max_num_seqs] */
    int n_spec;
    int spec_quiet;             /* steps still planned ahead (async) before drafts are looked for again */
    int spec_misses;            /* looks in a row that found no draft */
    uint64_t spec_steps, spec_drafted, spec_accepted;
    int n_taken;
    double t_ids;               /* when the device ran out of work in the step taken this turn: its
                                 * ids arrived, or its launch returned after the step (0: none) */
    double t_took;              /* when the wait for those ids returned */

    /* JSON mode's token texts: built by the first submit that asks for JSON (under jv_mu), read
     * by the engine thread for requests submitted after that */
    pthread_mutex_t jv_mu;
    sf_json_vocab *jv;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t wake;        /* the engine thread waits for work */
    pthread_cond_t idle;        /* drain waits for the engine to empty */
    sf_request *in_head, *in_tail;
    int in_count[SF_URGENCY_COUNT];
    int stop, draining, busy;
    int tp_failed;              /* the tensor-parallel group failed: submit answers SF_ENODEV */
    char tp_failed_msg[512];
    atomic_int cancel_all;      /* drain timed out: cancel everything (read by the engine thread) */
    atomic_int drain_cut;       /* sf_engine_drain_cut: the drain's timeout is past */
    atomic_int reset_prefix;    /* sf_engine_reset_prefix_cache: forget the cached blocks before the next plan */
    atomic_uint cancels;        /* sf_engine_cancel calls so far: the engine thread walks its
                                 * sequences for cancelled ones only when this moved */
    unsigned cancels_seen;      /* engine thread: the count at its last walk */
    sf_engine_stats st;         /* snapshot, updated after every step */
    /* throughput windows (engine thread writes, under mu) */
    double win_start;
    uint64_t win_tokens, win_finished;
    double req_per_s;           /* finished requests per second, last window */
    /* engine thread only; copied into st by update_stats */
    uint64_t n_finished, n_cancelled, n_tokens_out;
    uint64_t st_tokens_seen;    /* n_tokens_out at the last update_stats (under mu) */
    uint64_t n_rejected;        /* submits refused with SF_AGAIN (under mu) */
    FILE *trace;                /* --sched-trace (engine thread only) */
    double t_start;
    double step_s, host_s, decode_step_s, decode_host_s, decode_enqueue_s;
    uint64_t decode_steps, decode_tokens, rows_dev, rows_host, rows_scored, rows_scored_dev;
    sf_turn_clock dclk;         /* summed over decode turns */
    uint32_t *step_hist;        /* [2 * SF_STEP_HIST] decode turn durations, then their idle gaps */
};

/* step.c, engine thread only. */
/* r is about to be freed: the steps in flight forget its rows. */
void sf_engine_forget(sf_engine *e, sf_request *r);
/* Finish r with reason/status (events delivered), take it out of the scheduler and free it. */
void sf_engine_finish_free(sf_engine *e, sf_request *r, int reason, int status, const char *msg);
/* One loop turn: take the ids of the step in flight, launch the next step, deliver. Returns
 * whether anything progressed (a step taken or launched, or a request finished). */
int sf_engine_turn(sf_engine *e);
/* Whether a step is in flight (the loop must come back for it even with nothing queued). fl2
 * is only active while fl is. */
static inline int sf_engine_in_flight(const sf_engine *e) { return e->fl.active; }
/* Stopping: wait for the step in flight, if any, and drop its ids (the requests are cancelled
 * next). */
void sf_engine_settle(sf_engine *e);
/* Before serving, on a backend that makes per-size choices on first use (CUDA: the GEMM
 * tuner): one step at each token count those choices are made for, up to 256 (within
 * max_batched_tokens; and max_num_seqs when larger), every rank under TP; each sequence one
 * token in its own block of the still empty KV pool (n_blocks of them), logits for up to
 * max_num_seqs rows; so that no served step pays for them. */
int sf_engine_warm_up(sf_engine *e, int n_blocks, sf_error *err);
/* Median and 90th percentile of the decode turns so far (which 0) or of their device idle
 * gaps (which 1), ms (0 without any). */
void sf_engine_step_percentiles(const sf_engine *e, int which, double *p50, double *p90);

#endif
