/* scheduler.h — continuous batching: which tokens of which sequences run in the next step.
 * Internal to engine/. Pure bookkeeping over the KV block pool (kvcache.h): it never touches
 * the backend, so tests drive it directly. Every function is called on the engine thread only.
 *
 * A sequence (sf_seq) carries all its known tokens (prompt, then generated ones); n_computed of
 * them have their K/V in the cache. Each step the scheduler plans, in this order:
 *   1. decode: one token for every running sequence whose prompt is fully computed;
 *   2. chunked prefill of running sequences whose prompt is partly computed;
 *   3. admission of waiting sequences (first chunk of their prefill),
 * under a token budget (max_batched_tokens) and a seat limit (max_num_seqs). The waiting queue
 * is ordered by urgency (high first), then earliest deadline, then arrival. KV blocks are
 * allocated as a step's tokens need them; the last kv_high_reserve share of the pool is for
 * high-urgency sequences only. When blocks or seats run out, the lowest-class running sequence
 * (latest arrival first) is preempted: by swap when its K/V fits in the free swap slots (the plan
 * lists the block copies the caller runs before the step; the K/V comes back into new blocks
 * when the sequence is admitted again), else by recompute: its blocks are freed and it goes back
 * to the waiting queue with all its tokens, to be prefilled again.
 *
 * Ownership: sf_seq structs belong to the caller (the engine embeds one in each request); the
 * scheduler links them into its queues and owns their block lists. */
#ifndef SF_SCHEDULER_H
#define SF_SCHEDULER_H

#include <stdint.h>

#include "../common/sf.h"
#include "../hal/hal.h"
#include "kvcache.h"

enum { SF_SEQ_NEW = 0, SF_SEQ_WAITING, SF_SEQ_RUNNING, SF_SEQ_DONE };

typedef struct sf_seq {
    /* set by the caller before sf_sched_add */
    int urgency;              /* SF_URGENCY_* */
    double deadline;          /* absolute time (s, sf_now_s clock); INFINITY when none */
    int max_len;              /* tokens (prompt + output) the sequence may reach, <= max_model_len */
    void *owner;              /* the caller's object (the engine's request) */
    /* tokens: prompt, then generated ones; sf_seq_append adds */
    int32_t *tokens;
    int n_tokens, cap_tokens;
    int n_prompt;             /* original prompt length (for usage) */
    /* prompt scoring (the engine's prompt_logprobs): the logits of positions [score_from,
     * score_to) are wanted too, each a logit row of the step that computes it (0, 0: none);
     * score_from moves on as steps are committed, so a recompute does not score twice */
    int score_from, score_to;
    /* owned by the scheduler */
    int n_computed;           /* tokens whose K/V is in the cache */
    int32_t *blocks;          /* KV block ids, in position order */
    int n_blocks, cap_blocks;
    int kv_i8_held;           /* kind of the blocks and swap slots it holds (kv_i8 when they were taken) */
    int state;                /* SF_SEQ_* */
    uint64_t arrival;         /* admission order, kept across preemption */
    int n_preempted;
    uint64_t preempted_at;    /* step number (1-based) of the last preemption */
    int plan_idx;             /* index in the current plan, -1 when not planned */
    struct sf_seq *prev, *next;
    /* swap: while preempted by swap, the K/V of its n_computed tokens is in these swap slots */
    int32_t *swap_slots;
    int n_swap, cap_swap;
    int swap_in_op;           /* 1 + index in the plan's swap_in when swapped in this step, else 0 */
    int swap_out_op;          /* 1 + index in the plan's swap_out when swapped out this step, else 0 */
    /* targets (set by the caller before sf_sched_add; 0: none) */
    int max_latency_ms;       /* first token / per token target: shapes the step while it is in */
    double min_tps;           /* decode floor: the step stays under 1000 / min_tps ms while it decodes,
                               * and it is not preempted except for a high-urgency deadline */
    double t_submit;          /* sf_now_s clock; the relaxed deadline counts from it */
    /* set by the degrade policy (sched_policy.c) */
    int relaxed;              /* its max-latency no longer shapes the step (KV pressure); floors stay */
    double deadline_orig;     /* deadline before relaxing */
    int kv_i8;                /* its KV blocks are INT8 (chosen at admission): half the memory, when
                               * the pool has them (kvcache.h). Read when the sequence next takes
                               * blocks with none held or swapped (kv_i8_held is what it holds). */
    /* prefix cache (sf_sched_config.prefix_cache) */
    uint64_t cache_salt;      /* set by the caller: the first block's parent key; sequences share
                               * cached blocks only under the same salt (the engine: per tenant) */
    int n_cached;             /* prompt tokens found cached when first admitted (usage) */
    int looked_up;            /* n_cached is set */
    int n_hashed;             /* leading blocks registered or found (hash_last: the last one's key) */
    uint64_t hash_last;
    int n_uncounted;          /* blocks it shares that it took from another holder: not in held_low_units */
    uint64_t group;           /* set by the caller (0: none): sequences of one group have the same prompt
                               * (an API request's choices); with the prefix cache a later one waits,
                               * skipped by admission, while one of its group computes that prompt,
                               * then finds it cached */
    int n_draft;              /* its last n_draft tokens are drafts (speculative decoding): the caller
                               * set them with score_from/score_to over the positions before them, and
                               * calls sf_sched_rewind once it knows how many were right; they are
                               * never registered in the prefix cache */
} sf_seq;

/* Initialise with a copy of the prompt. */
int sf_seq_init(sf_seq *q, const int32_t *prompt, int n_prompt, sf_error *err);
void sf_seq_free(sf_seq *q);
/* Append a generated token; SF_ENOMEM on allocation failure. */
int sf_seq_append(sf_seq *q, int32_t id);

typedef struct sf_sched_config {
    int max_num_seqs;         /* running sequences at most */
    int max_batched_tokens;   /* tokens per step at most; >= max_num_seqs */
    int max_logits;           /* logit rows per step at most (the next-token rows and the scored
                               * positions); >= max_num_seqs; 0: max_num_seqs */
    int max_model_len;        /* context length cap */
    float kv_high_reserve;    /* share of the pool only SF_URGENCY_HIGH may take, [0, 1) */
    int swap_blocks;          /* swap space in KV blocks (host memory); 0: preemption by recompute only */
    /* Step shaping (0 / off when left zero): while a sequence with a max-latency target is waiting
     * or running, a step is planned to take at most shape_frac x its target (the tightest one), and
     * while a sequence with a min-throughput floor decodes, steps that carry prefill of classes
     * below high stay under 1000 / min_tps ms. Step time is predicted from the steps measured so
     * far (sf_sched_observe). Prefill keeps at least min_chunk tokens a step, so it never stops. */
    int shape;
    float shape_frac;         /* default 0.25 */
    int min_chunk;            /* default 16 */
    /* Degrade instead of reject (0 / off when degrade_high is 0): KV usage above degrade_high for
     * degrade_hold_s seconds enters the degraded state: low-urgency sequences are relaxed (deadline
     * at least relax_ms after submit, their max-latency stops shaping the step) and new low-urgency
     * sequences get INT8 KV when kv_i8_ok; usage below degrade_low for degrade_hold_s restores. */
    float degrade_high, degrade_low;
    double degrade_hold_s;
    int relax_ms;
    int kv_i8_ok;             /* the backend's cache can hold INT8 blocks */
    /* May a sequence of this urgency, preempted by swap, be swapped in this step? NULL: always.
     * A "no" keeps it (and what waits behind it) waiting for a later step. The engine's DMA
     * tuner says no to low urgency while the PCIe link is contended (swap.h). */
    int (*swap_in_ok)(void *arg, int urgency);
    void *swap_in_ok_arg;
    /* sf_sched_batch rounds the block table's row stride up to a multiple of this many blocks
     * (0 or 1: the widest sequence's blocks). The entries past a sequence's blocks are 0. */
    int table_quantum;
    /* Prefix cache (0: off): a sequence's full blocks are registered in the pool as their K/V is
     * committed, and a sequence admitted with nothing computed takes the registered blocks that
     * match its leading tokens instead of computing them (kvcache.h). Positions it scores
     * (score_from) and its last token are always computed. Full-precision blocks only. */
    int prefix_cache;
} sf_sched_config;

/* Every decision the policy takes, counted (/metrics: semflow_sched_decisions_total). */
enum { SF_DECISION_RELAX = 0, SF_DECISION_KV_INT8, SF_DECISION_RESTORE, SF_DECISION_PREEMPT_SWAP,
       SF_DECISION_PREEMPT_RECOMPUTE, SF_DECISION_REJECT, SF_DECISION_COUNT };

/* A KV copy the caller runs between sf_sched_plan and the forward step: every swap_out first,
 * then every swap_in. Block i goes to / comes from swap slot slots[i]. seq is NULL when the
 * copy was called off (the sequence was preempted again or removed in the same plan). */
typedef struct sf_swap_op {
    sf_seq *seq;
    int urgency;              /* the sequence's class: the DMA chunk size */
    int n;
    int32_t *blocks, *slots;  /* [n] each, owned by the scheduler, valid until the next plan */
} sf_swap_op;

/* One planned piece of work: tokens [start, start + n) of seq. logits: this piece ends at the
 * sequence's last known token, so the step yields its next-token distribution. Positions
 * [score_at, score_at + n_score) of it are scored (seq.score_from/score_to): sf_sched_batch
 * puts every item's next-token row first, in item order, then every item's scored positions,
 * in item and position order. */
typedef struct sf_plan_item {
    sf_seq *seq;
    int start, n;
    int logits;
    int score_at, n_score;
} sf_plan_item;

typedef struct sf_plan {
    sf_plan_item *items;      /* [n_items]; items with seq == NULL were withdrawn (preempted) */
    int n_items;
    int n_tokens;             /* sum of n over live items */
    int n_decode, n_prefill;  /* tokens of each kind */
    sf_seq **stuck;           /* sequences that cannot make progress even alone (pool too small): */
    int n_stuck;              /* the caller finishes them (length) and calls sf_sched_remove */
    sf_swap_op *swap_out, *swap_in;
    int n_swap_out, n_swap_in;
} sf_plan;

typedef struct sf_sched {
    sf_sched_config cfg;
    sf_kv_pool *pool;
    int reserve_units;        /* KV units (half blocks, kvcache.h) only high urgency may hold */
    int held_low_units;       /* units held by sequences below high urgency */
    sf_seq running;           /* list heads (sentinels), running in (urgency desc, arrival) order */
    sf_seq waiting;           /* waiting in (urgency desc, deadline, arrival) order */
    int n_running, n_waiting[3];
    uint64_t next_arrival;
    sf_plan plan;
    int cap_items, cap_stuck;
    int budget_left;          /* tokens left in the step being planned */
    int rows_used;            /* logit rows of the step being planned */
    /* the batch of the current plan (sf_sched_batch) */
    int32_t *b_tokens, *b_pos, *b_slot, *b_seq_start, *b_seq_ctx, *b_table, *b_logit_rows;
    int cap_table;
    sf_seq **snap;            /* the running list in priority order, copied at the start of a plan */
    int cap_snap;
    /* counters */
    uint64_t steps, tokens_prefill, tokens_decode, preemptions;
    /* swap space: a pool of slots of one KV block each (bookkeeping; the memory is the caller's) */
    sf_kv_pool swap;
    int cap_swap_out, cap_swap_in;
    uint64_t swaps_out, swaps_in, swap_fallbacks; /* fallbacks: preempted by recompute, swap full */
    uint64_t swaps_dropped; /* swapped out, never back: the sequence ended while out (its last token
                             * already in flight), or the copy out failed; out = in + dropped */
    /* policy (sched_policy.c) */
    double now;               /* time of the plan being built (sf_sched_plan_at) */
    double cm_p[3], cm_th[2]; /* step-time model ms = th0 + th1 x tokens: recursive least squares */
    int cm_n;                 /* steps observed */
    double cm_b_ref;          /* slow average of the per-token term while positive: a floor for it when steps
                               * of one size leave the slope unidentified (it may drift to 0 or below) */
    double step_ms_avg;       /* moving average of measured steps that decoded */
    int low_budget_left;      /* prefill tokens left this step for classes below high (floor cap) */
    int cap_tokens, cap_low;  /* the caps of the last plan (INT_MAX: none), for traces and tests */
    double rt_seen_ms, rt_seen_at; /* tightest latency budget (ms) seen lately, and when */
    int degraded;
    double deg_since;         /* since when demand is past the threshold being watched; < 0: not */
    double deg_dip_since;     /* since when it is back across it, in a stretch (bridged up to 0.5 s); < 0: not */
    uint64_t decisions[SF_DECISION_COUNT];
    /* KV demand and the high class's headroom (sched_policy.c), refreshed at the start of a plan */
    int n_running_u[3]; /* running sequences per class (kept live) */
    double kv_demand;         /* units admitted work holds or needs to finish, over all units (may pass 1) */
    int blocked_units;        /* full need of the first waiting sequence refused for KV in the last plan */
    int low_reserved_units;   /* full need of running sequences below high (grows as admission goes) */
    double hi_seats_peak, hi_units_peak, hi_peak_at; /* decaying peaks of what the high class holds or asks */
    int swap_in_low_step;     /* swap-ins below high planned in this step */
    double low_prefill_at;    /* when prefill below high urgency was last planned (step shaping) */
    int rt_alone;             /* a step with a realtime prompt holds lower-class prefill out (1, the
                               * default; SEMFLOW_SCHED_RT_ALONE=0 at init: the earlier rule, up to
                               * ~2 ms of it in every such step, for comparison on a device) */
    int n_running_i8;         /* running sequences holding INT8 blocks (at the start of the plan) */
    uint64_t gate_seats, gate_kv, gate_floor; /* admissions below high held back, by reason */
    uint64_t prefix_queries, prefix_hits; /* prompt tokens looked up in the prefix cache, and found */
} sf_sched;

/* pool: an initialised KV pool the scheduler allocates from (not owned). SF_EINVAL with a clear
 * message for inconsistent settings. */
int sf_sched_init(sf_sched *s, const sf_sched_config *c, sf_kv_pool *pool, sf_error *err);
void sf_sched_free(sf_sched *s);

/* Queue a new sequence (state NEW). Lane limits are the engine's business (admission). */
void sf_sched_add(sf_sched *s, sf_seq *q);
/* Take a sequence out wherever it is (waiting or running), releasing its blocks; state DONE.
 * Safe on a DONE sequence. If it was planned this step, its plan item is withdrawn. */
void sf_sched_remove(sf_sched *s, sf_seq *q);

/* Plan the next step. Returns the plan (owned by the scheduler, valid until the next call).
 * Every plan must be closed by sf_sched_commit (the step ran) or sf_sched_discard (it did not)
 * before the next sf_sched_plan; after either, planned sequences may be removed and freed. */
const sf_plan *sf_sched_plan(sf_sched *s);
/* The same at a given time (sf_now_s clock): tests drive the policy's clock with it. */
const sf_plan *sf_sched_plan_at(sf_sched *s, double now);
/* The step of n_tokens tokens took ms milliseconds (the caller measured it): feeds the step-time
 * model that step shaping predicts with. */
void sf_sched_observe(sf_sched *s, int n_tokens, int n_decode, double ms);
/* Predicted milliseconds of a step of n tokens; 0 while too few steps were measured. */
double sf_sched_predict_ms(const sf_sched *s, int n_tokens);
/* Follow KV usage at time now without planning (the engine calls it while idle, so a degraded
 * state ends even when no request comes). */
void sf_sched_tick(sf_sched *s, double now);
/* KV usage of the pool in [0, 1]: memory held now. */
double sf_sched_kv_usage(const sf_sched *s);
/* KV demand as the degrade policy reads it (sched_policy.c): the units admitted work holds or
 * needs to finish (resident blocks, the rest of running sequences' lengths, preempted sequences
 * waiting to resume, and the first waiting sequence refused for lack of KV), over the pool's
 * units; may pass 1. Refreshed at the start of each plan and each tick. */
double sf_sched_kv_demand(const sf_sched *s);
/* Fill b with the current plan's batch (arrays owned by the scheduler). Logit rows are in
 * plan item order, skipping items without logits. */
void sf_sched_batch(sf_sched *s, sf_batch *b);
/* The step ran: advance n_computed of every planned sequence. */
void sf_sched_commit(sf_sched *s);
/* After a committed step, q's K/V holds only its first n tokens (drafts that were wrong, its
 * tokens cut back to n + 1 by the caller): n_computed goes back to n (n <= n_computed). */
void sf_sched_rewind(sf_sched *s, sf_seq *q, int n);
/* The step did not run: nothing advances; the blocks stay with their sequences. */
void sf_sched_discard(sf_sched *s);

/* The caller could not run swap_out op i (copy failed): the sequence gets recomputed instead. */
void sf_sched_swap_out_failed(sf_sched *s, int i);

static inline int sf_sched_waiting_total(const sf_sched *s)
{
    return s->n_waiting[0] + s->n_waiting[1] + s->n_waiting[2];
}
/* Walk every sequence the scheduler holds (running then waiting); fn may call sf_sched_remove
 * on the sequence it is given. */
void sf_sched_foreach(sf_sched *s, void (*fn)(sf_seq *q, void *arg), void *arg);

#endif
