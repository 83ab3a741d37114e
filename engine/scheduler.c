/* scheduler.c — continuous batching with chunked prefill, urgency lanes, deadlines, a KV share
 * reserved for high urgency, and preemption by recompute. See scheduler.h for the contract.
 * Engine thread only. */
#include "scheduler.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "sched_policy.h"

/* ---- sequences ------------------------------------------------------------------------- */

int sf_seq_init(sf_seq *q, const int32_t *prompt, int n_prompt, sf_error *err)
{
    memset(q, 0, sizeof *q);
    q->deadline = INFINITY;
    q->plan_idx = -1;
    q->cap_tokens = n_prompt + 16;
    q->tokens = malloc((size_t)q->cap_tokens * sizeof *q->tokens);
    if (!q->tokens) return sf_err(err, SF_ENOMEM, "sequence of %d tokens: out of memory", n_prompt);
    if (n_prompt > 0) memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    q->n_tokens = q->n_prompt = n_prompt;
    q->max_len = n_prompt;
    return SF_OK;
}

void sf_seq_free(sf_seq *q)
{
    if (!q) return;
    free(q->tokens);
    free(q->blocks);
    free(q->swap_slots);
    q->tokens = NULL;
    q->blocks = NULL;
    q->swap_slots = NULL;
    q->n_tokens = q->n_blocks = q->cap_tokens = q->cap_blocks = q->n_swap = q->cap_swap = 0;
}

int sf_seq_append(sf_seq *q, int32_t id)
{
    if (q->n_tokens == q->cap_tokens) {
        int cap = q->cap_tokens * 2 + 16;
        int32_t *t = realloc(q->tokens, (size_t)cap * sizeof *t);
        if (!t) return SF_ENOMEM;
        q->tokens = t;
        q->cap_tokens = cap;
    }
    q->tokens[q->n_tokens++] = id;
    return SF_OK;
}

/* ---- lists ------------------------------------------------------------------------------ */

static void list_init(sf_seq *head) { head->prev = head->next = head; }

static void list_unlink(sf_seq *q)
{
    q->prev->next = q->next;
    q->next->prev = q->prev;
    q->prev = q->next = NULL;
}

static void list_insert_before(sf_seq *pos, sf_seq *q)
{
    q->prev = pos->prev;
    q->next = pos;
    pos->prev->next = q;
    pos->prev = q;
}

/* Running order: urgency (high first), then arrival. */
static int run_before(const sf_seq *a, const sf_seq *b)
{
    if (a->urgency != b->urgency) return a->urgency > b->urgency;
    return a->arrival < b->arrival;
}

/* Waiting order: urgency (high first), then earliest deadline, then arrival. */
static int wait_before(const sf_seq *a, const sf_seq *b)
{
    if (a->urgency != b->urgency) return a->urgency > b->urgency;
    if (a->deadline != b->deadline) return a->deadline < b->deadline;
    return a->arrival < b->arrival;
}

static void insert_sorted(sf_seq *head, sf_seq *q, int (*before)(const sf_seq *, const sf_seq *))
{
    sf_seq *p = head->next;
    while (p != head && !before(q, p)) p = p->next;
    list_insert_before(p, q);
}

static int lane(int urgency)
{
    return urgency < 0 ? 0 : urgency >= SF_URGENCY_COUNT ? SF_URGENCY_COUNT - 1 : urgency;
}

/* ---- init ------------------------------------------------------------------------------- */

int sf_sched_init(sf_sched *s, const sf_sched_config *c, sf_kv_pool *pool, sf_error *err)
{
    memset(s, 0, sizeof *s);
    if (c->max_num_seqs < 1 || c->max_batched_tokens < 1 || c->max_model_len < 2)
        return sf_err(err, SF_EINVAL,
                      "scheduler: max_num_seqs (%d), max_batched_tokens (%d) must be >= 1 and "
                      "max_model_len (%d) >= 2", c->max_num_seqs, c->max_batched_tokens, c->max_model_len);
    if (c->max_batched_tokens < c->max_num_seqs)
        return sf_err(err, SF_EINVAL,
                      "scheduler: max_batched_tokens (%d) is smaller than max_num_seqs (%d): every running "
                      "sequence needs one token per step; raise --max-batched-tokens or lower --max-num-seqs",
                      c->max_batched_tokens, c->max_num_seqs);
    if (!(c->kv_high_reserve >= 0.0f && c->kv_high_reserve < 1.0f))
        return sf_err(err, SF_EINVAL, "scheduler: kv_high_reserve %g must be in [0, 1)", (double)c->kv_high_reserve);
    if (c->swap_blocks < 0)
        return sf_err(err, SF_EINVAL, "scheduler: swap space of %d blocks; it must be 0 (off) or more", c->swap_blocks);
    if (c->shape && !(c->shape_frac > 0.0f && c->shape_frac <= 1.0f))
        return sf_err(err, SF_EINVAL, "scheduler: the step-shaping fraction %g must be in (0, 1]", (double)c->shape_frac);
    if (c->degrade_high > 0 && !(c->degrade_high <= 1.0f && c->degrade_low >= 0 && c->degrade_low <= c->degrade_high &&
                                 c->degrade_hold_s >= 0 && c->relax_ms >= 0))
        return sf_err(err, SF_EINVAL,
                      "scheduler: degrade thresholds: enter above %g, leave below %g, hold %g s, relax to %d ms; "
                      "need 0 <= leave <= enter <= 1, hold >= 0 and relax >= 0",
                      (double)c->degrade_high, (double)c->degrade_low, c->degrade_hold_s, c->relax_ms);
    if (c->prefix_cache && sf_kv_prefix_enable(pool, err) != SF_OK) return sf_err_wrap(err, "scheduler");
    if (c->swap_blocks > 0 && sf_kv_pool_init(&s->swap, c->swap_blocks, 1, err) != SF_OK)
        return sf_err_wrap(err, "scheduler: swap space of %d blocks", c->swap_blocks);
    s->cfg = *c;
    if (s->cfg.max_logits < c->max_num_seqs) s->cfg.max_logits = c->max_num_seqs;
    s->pool = pool;
    s->deg_since = s->deg_dip_since = -1;
    s->low_prefill_at = -INFINITY;
    s->rt_alone = sf_env_bool("SEMFLOW_SCHED_RT_ALONE", 1);
    s->cap_tokens = s->cap_low = s->low_budget_left = INT_MAX;
    s->reserve_units = 2 * (int)((double)pool->n_blocks * c->kv_high_reserve);
    list_init(&s->running);
    list_init(&s->waiting);

    int max_blocks = (c->max_model_len + pool->block_size - 1) / pool->block_size + 1;
    int T = c->max_batched_tokens, S = c->max_num_seqs, quantum = SF_MAX(c->table_quantum, 1);
    max_blocks = (max_blocks + quantum - 1) / quantum * quantum;
    s->cap_table = S * max_blocks;
    s->cap_items = 2 * S + 8;
    s->plan.items = malloc((size_t)s->cap_items * sizeof *s->plan.items);
    s->cap_stuck = S + 8;
    s->plan.stuck = malloc((size_t)s->cap_stuck * sizeof *s->plan.stuck);
    s->b_tokens = malloc((size_t)T * sizeof(int32_t));
    s->b_pos = malloc((size_t)T * sizeof(int32_t));
    s->b_slot = malloc((size_t)T * sizeof(int32_t));
    s->b_seq_start = malloc((size_t)(S + 1) * sizeof(int32_t));
    s->b_seq_ctx = malloc((size_t)S * sizeof(int32_t));
    s->b_logit_rows = malloc((size_t)s->cfg.max_logits * sizeof(int32_t));
    s->b_table = malloc((size_t)s->cap_table * sizeof(int32_t));
    s->cap_snap = S;
    s->snap = malloc((size_t)S * sizeof *s->snap);
    if (!s->snap || !s->plan.items || !s->plan.stuck || !s->b_tokens || !s->b_pos || !s->b_slot || !s->b_seq_start ||
        !s->b_seq_ctx || !s->b_logit_rows || !s->b_table) {
        sf_sched_free(s);
        return sf_err(err, SF_ENOMEM, "scheduler: out of memory for %d tokens x %d sequences", T, S);
    }
    return SF_OK;
}

void sf_sched_free(sf_sched *s)
{
    if (!s) return;
    free(s->plan.items);
    free(s->plan.stuck);
    free(s->b_tokens);
    free(s->b_pos);
    free(s->b_slot);
    free(s->b_seq_start);
    free(s->b_seq_ctx);
    free(s->b_logit_rows);
    free(s->b_table);
    free(s->snap);
    for (int i = 0; i < s->plan.n_swap_out; i++) free(s->plan.swap_out[i].blocks);
    free(s->plan.swap_out);
    free(s->plan.swap_in);
    if (s->swap.n_blocks) sf_kv_pool_free(&s->swap);
    memset(s, 0, sizeof *s);
}

/* ---- blocks ----------------------------------------------------------------------------- */

static void release_blocks(sf_sched *s, sf_seq *q)
{
    if (q->n_blocks) {
        sf_kv_release(s->pool, q->blocks, q->n_blocks);
        if (q->urgency < SF_URGENCY_HIGH) s->held_low_units -= (q->n_blocks - q->n_uncounted) * sf_kv_units(q->kv_i8_held);
    }
    q->n_blocks = q->n_uncounted = q->n_hashed = 0;
}

/* Give back q's swap slots and call off its pending swap copies. */
static void release_swap(sf_sched *s, sf_seq *q)
{
    if (q->n_swap) sf_kv_release(&s->swap, q->swap_slots, q->n_swap);
    q->n_swap = 0;
    if (q->swap_in_op) s->plan.swap_in[q->swap_in_op - 1].seq = NULL;
    if (q->swap_out_op) s->plan.swap_out[q->swap_out_op - 1].seq = NULL;
    q->swap_in_op = q->swap_out_op = 0;
}

/* Room for one more op in *ops (capacity *cap). */
static int ops_reserve(sf_swap_op **ops, int n, int *cap)
{
    if (n < *cap) return SF_OK;
    int c = *cap * 2 + 8;
    sf_swap_op *o = realloc(*ops, (size_t)c * sizeof *o);
    if (!o) return SF_ENOMEM;
    *ops = o;
    *cap = c;
    return SF_OK;
}

/* Preempting q: move the K/V of its computed tokens to swap slots if they fit. Returns 1 if q
 * keeps its computed tokens (the caller copies them out before the step), 0 for recompute. */
static int swap_out(sf_sched *s, sf_seq *q)
{
    int nb = sf_kv_blocks_for(s->pool, q->n_computed);
    if (!s->swap.n_blocks || nb == 0 || nb > q->n_blocks) return 0;
    if (s->swap.n_free < nb) {
        s->swap_fallbacks++;
        return 0;
    }
    sf_plan *p = &s->plan;
    if (ops_reserve(&p->swap_out, p->n_swap_out, &s->cap_swap_out) != SF_OK) return 0;
    if (q->cap_swap < nb) {
        int32_t *t = realloc(q->swap_slots, (size_t)nb * sizeof *t);
        if (!t) return 0;
        q->swap_slots = t;
        q->cap_swap = nb;
    }
    int32_t *ids = malloc(2 * (size_t)nb * sizeof *ids);
    if (!ids) return 0;
    if (sf_kv_alloc(&s->swap, nb, q->swap_slots) != SF_OK) {
        free(ids);
        return 0;
    }
    memcpy(ids, q->blocks, (size_t)nb * sizeof *ids);
    memcpy(ids + nb, q->swap_slots, (size_t)nb * sizeof *ids);
    p->swap_out[p->n_swap_out] = (sf_swap_op){ .seq = q, .urgency = q->urgency, .n = nb, .blocks = ids, .slots = ids + nb };
    q->n_swap = nb;
    q->swap_out_op = ++p->n_swap_out;
    s->swaps_out++;
    return 1;
}

void sf_sched_swap_out_failed(sf_sched *s, int i)
{
    if (i < 0 || i >= s->plan.n_swap_out || !s->plan.swap_out[i].seq) return;
    sf_seq *q = s->plan.swap_out[i].seq;
    if (q->n_swap) s->swaps_dropped++;
    release_swap(s, q);
    q->n_computed = 0;
}

/* Units a sequence of this urgency could hold with the pool to itself. */
static int usable_units(const sf_sched *s, int urgency)
{
    int all = sf_kv_total_units(s->pool);
    return urgency >= SF_URGENCY_HIGH ? all : all - s->reserve_units;
}

/* The kind of block q takes next: its choice when it holds nothing, else what it holds. */
static int next_kind(const sf_sched *s, const sf_seq *q)
{
    if (q->n_blocks || q->n_swap) return q->kv_i8_held;
    return q->kv_i8 && s->pool->i8_ok;
}

/* Make q hold blocks for `tokens` tokens. SF_AGAIN (nothing taken) when the pool, or the share
 * open to q's urgency, is short; SF_ENOMEM when the block list cannot grow. */
static int grow_blocks(sf_sched *s, sf_seq *q, int tokens)
{
    int need = sf_kv_blocks_for(s->pool, tokens) - q->n_blocks;
    if (need <= 0) return SF_OK;
    int i8 = next_kind(s, q), units = need * sf_kv_units(i8);
    if (!sf_kv_can_alloc(s->pool, i8, need)) return SF_AGAIN;
    int low = q->urgency < SF_URGENCY_HIGH;
    if (low && s->held_low_units + units > usable_units(s, SF_URGENCY_LOW)) return SF_AGAIN;
    if (q->n_blocks + need > q->cap_blocks) {
        int cap = SF_MAX(q->n_blocks + need, q->cap_blocks * 2 + 4);
        int32_t *b = realloc(q->blocks, (size_t)cap * sizeof *b);
        if (!b) return SF_ENOMEM;
        q->blocks = b;
        q->cap_blocks = cap;
    }
    if (sf_kv_alloc_as(s->pool, i8, need, q->blocks + q->n_blocks) != SF_OK) return SF_AGAIN;
    q->kv_i8_held = i8;
    q->n_blocks += need;
    if (low) s->held_low_units += units;
    return SF_OK;
}

/* ---- prefix cache ----------------------------------------------------------------------- */

/* q, admitted with nothing computed or held, takes the cached blocks of its leading tokens:
 * whole blocks, before its last token (whose row it needs) and before any position it scores. */
static void prefix_lookup(sf_sched *s, sf_seq *q)
{
    if (!s->cfg.prefix_cache || q->n_blocks || q->n_swap || q->n_computed || next_kind(s, q)) return;
    const int bs = s->pool->block_size;
    int limit = q->n_tokens - 1;
    if (q->score_from < q->score_to) limit = SF_MIN(limit, q->score_from);
    int nb = limit / bs, j = 0, low = q->urgency < SF_URGENCY_HIGH;
    s->prefix_queries += (uint64_t)q->n_tokens;
    if (nb > q->cap_blocks) {
        int32_t *b = realloc(q->blocks, (size_t)nb * sizeof *b);
        if (!b) nb = 0;
        else {
            q->blocks = b;
            q->cap_blocks = nb;
        }
    }
    uint64_t parent = q->cache_salt;
    for (; j < nb; j++) {
        const int32_t *t = q->tokens + (size_t)j * bs;
        uint64_t key = sf_kv_prefix_key(s->pool, parent, t);
        int32_t b = sf_kv_prefix_find(s->pool, key, parent, t);
        if (b < 0) break;
        /* one that nobody holds becomes q's: within the share open to q's class */
        if (low && !sf_kv_refs(s->pool, b) && s->held_low_units + sf_kv_units(0) > usable_units(s, SF_URGENCY_LOW)) break;
        if (sf_kv_prefix_take(s->pool, b)) {
            if (low) s->held_low_units += sf_kv_units(0);
        } else {
            q->n_uncounted++;
        }
        q->blocks[j] = b;
        parent = key;
    }
    q->n_blocks = q->n_hashed = j;
    q->hash_last = parent;
    q->kv_i8_held = 0;
    q->n_computed = j * bs;
    s->prefix_hits += (uint64_t)q->n_computed;
    if (!q->looked_up) q->n_cached = q->n_computed;
    q->looked_up = 1;
}

/* q's step was committed: its blocks now full of computed K/V go into the cache. */
static void prefix_register(sf_sched *s, sf_seq *q)
{
    const int bs = s->pool->block_size;
    int full = SF_MIN((q->n_computed - q->n_draft) / bs, q->n_blocks); /* drafts: not known right yet */
    for (int j = q->n_hashed; j < full; j++) {
        const int32_t *t = q->tokens + (size_t)j * bs;
        uint64_t parent = j ? q->hash_last : q->cache_salt, key = sf_kv_prefix_key(s->pool, parent, t);
        sf_kv_prefix_register(s->pool, q->blocks[j], key, parent, t);
        q->hash_last = key;
        q->n_hashed = j + 1;
    }
}

/* ---- queue changes ---------------------------------------------------------------------- */

static void withdraw(sf_sched *s, sf_seq *q)
{
    if (q->plan_idx < 0) return;
    sf_plan_item *it = &s->plan.items[q->plan_idx];
    s->plan.n_tokens -= it->n;
    if (it->n == 1 && it->logits) s->plan.n_decode -= 1;
    else s->plan.n_prefill -= it->n;
    s->budget_left += it->n;
    s->rows_used -= it->logits + it->n_score;
    it->seq = NULL;
    it->n = 0;
    q->plan_idx = -1;
}

void sf_sched_add(sf_sched *s, sf_seq *q)
{
    q->arrival = s->next_arrival++;
    q->state = SF_SEQ_WAITING;
    q->n_computed = 0;
    q->plan_idx = -1;
    q->urgency = lane(q->urgency);
    sf_policy_on_add(s, q);
    insert_sorted(&s->waiting, q, wait_before);
    s->n_waiting[q->urgency]++;
}

void sf_sched_remove(sf_sched *s, sf_seq *q)
{
    if (q->state == SF_SEQ_RUNNING) {
        withdraw(s, q);
        list_unlink(q);
        s->n_running--;
        s->n_running_u[q->urgency]--;
    } else if (q->state == SF_SEQ_WAITING) {
        list_unlink(q);
        s->n_waiting[q->urgency]--;
    }
    release_blocks(s, q);
    if (q->n_swap && !q->swap_in_op) s->swaps_dropped++; /* ended while swapped out */
    release_swap(s, q);
    q->state = SF_SEQ_DONE;
}

static void preempt(sf_sched *s, sf_seq *q)
{
    withdraw(s, q);
    list_unlink(q);
    s->n_running--;
    s->n_running_u[q->urgency]--;
    int kept;
    if (q->swap_in_op) { /* swapped in during this plan: the copy has not run, its slots still hold the K/V */
        s->plan.swap_in[q->swap_in_op - 1].seq = NULL;
        q->swap_in_op = 0;
        s->swaps_in--;
        kept = 1;
    } else {
        kept = swap_out(s, q);
    }
    release_blocks(s, q);
    if (!kept) q->n_computed = 0;
    s->decisions[kept ? SF_DECISION_PREEMPT_SWAP : SF_DECISION_PREEMPT_RECOMPUTE]++;
    q->state = SF_SEQ_WAITING;
    q->n_preempted++;
    q->preempted_at = s->steps + 1;
    insert_sorted(&s->waiting, q, wait_before);
    s->n_waiting[q->urgency]++;
    s->preemptions++;
}

/* Returns 0 when the stuck list is full this step (q stays; it is reported next step). */
static int take_out_stuck(sf_sched *s, sf_seq *q)
{
    if (s->plan.n_stuck == s->cap_stuck) return 0;
    sf_sched_remove(s, q);
    s->plan.stuck[s->plan.n_stuck++] = q;
    return 1;
}

static int add_item(sf_sched *s, sf_seq *q, int n)
{
    if (s->plan.n_items == s->cap_items) {
        int cap = s->cap_items * 2;
        sf_plan_item *it = realloc(s->plan.items, (size_t)cap * sizeof *it);
        if (!it) return SF_ENOMEM;
        s->plan.items = it;
        s->cap_items = cap;
    }
    sf_plan_item *it = &s->plan.items[s->plan.n_items];
    it->seq = q;
    it->start = q->n_computed;
    it->n = n;
    it->logits = q->n_computed + n == q->n_tokens;
    it->score_at = SF_MAX(q->score_from, it->start);
    it->n_score = SF_MAX(0, SF_MIN(it->start + n, q->score_to) - it->score_at);
    s->rows_used += it->logits + it->n_score;
    q->plan_idx = s->plan.n_items++;
    s->plan.n_tokens += n;
    if (n == 1 && it->logits) s->plan.n_decode++;
    else {
        s->plan.n_prefill += n;
        if (q->urgency < SF_URGENCY_HIGH) s->low_prefill_at = s->now;
    }
    s->budget_left -= n;
    return SF_OK;
}

/* ---- planning --------------------------------------------------------------------------- */

/* The most of n next tokens of q (a prefill chunk) whose logit rows fit in the step: its scored
 * positions and, when it ends at q's last token, the next-token row. A chunk cut short stops
 * before the first position that does not fit (and before the end); 0: none fits. Decodes are
 * planned first and are at most max_num_seqs <= max_logits rows, so they always fit. */
static int rows_cap(const sf_sched *s, const sf_seq *q, int n)
{
    const int c = q->n_computed, room = s->cfg.max_logits - s->rows_used;
    const int a = SF_MAX(q->score_from, c), b = q->score_to;
    const int scored = SF_MAX(0, SF_MIN(c + n, b) - a), ends = c + n == q->n_tokens;
    if (scored + ends <= room) return n;
    int m = SF_MIN(n, q->n_tokens - c - 1);
    if (a < b) m = SF_MIN(m, a - c + SF_MAX(room, 0));
    return SF_MAX(m, 0);
}

/* The sequence to preempt so that asker can go on: from the tail of the running list (lowest
 * urgency, latest arrival), skipping those the policy protects (throughput floors that decode).
 * A floor is taken only when nothing unprotected below the asker will do (and only by a
 * high-urgency deadline, sched_policy.c); a running asker reached first gives way itself. With
 * strictly_lower, only sequences of a lower class than asker qualify. NULL when none does. */
static sf_seq *pick_victim(sf_sched *s, const sf_seq *asker, int strictly_lower)
{
    for (int pass = 0; pass < 2; pass++)
        for (sf_seq *v = s->running.prev; v != &s->running; v = v->prev) {
            if (strictly_lower && v->urgency >= asker->urgency) break;
            if (v == asker) {
                if (pass == 1) return v;
                break;
            }
            if (!sf_policy_may_preempt(s, v, asker) || (pass == 0 && sf_policy_protected(v))) continue;
            return v;
        }
    return NULL;
}

/* Is the high class running or waiting? */
static int high_active(const sf_sched *s)
{
    return s->n_running_u[SF_URGENCY_HIGH] > 0 || s->n_waiting[SF_URGENCY_HIGH] > 0;
}

/* Schedule n more tokens of running sequence q, preempting from the tail of the running list
 * (lowest urgency, latest arrival) while blocks are short. Returns 1 if q was planned. */
static int plan_running(sf_sched *s, sf_seq *q, int n)
{
    if (q->n_computed + n > s->cfg.max_model_len) {
        take_out_stuck(s, q);
        return 0;
    }
    for (;;) {
        int rc = grow_blocks(s, q, q->n_computed + n);
        if (rc == SF_OK) return add_item(s, q, n) == SF_OK;
        sf_seq *victim = pick_victim(s, q, 0);
        if (!victim) victim = q; /* everyone below is protected: q gives way itself */
        if (rc == SF_ENOMEM || (victim == q && s->n_running == 1)) {
            take_out_stuck(s, q); /* cannot grow even alone: the pool is too small for it */
            return 0;
        }
        preempt(s, victim);
        if (victim == q) return 0;
    }
}

/* q stays waiting after all: it gives back the blocks it took (cached ones found, or new ones
 * for a swap-in); without swapped K/V it has nothing computed again. Returns 0. */
static int unadmit(sf_sched *s, sf_seq *q)
{
    release_blocks(s, q);
    if (!q->n_swap) q->n_computed = 0;
    return 0;
}

/* q (nothing computed, a group, its prompt not scored) has a running sequence of its group that
 * has not computed the prompt's whole blocks yet (those a lookup can find): q waits for it
 * rather than computing the same prompt too. */
static int sibling_computes(const sf_sched *s, const sf_seq *q)
{
    if (!s->cfg.prefix_cache || !q->group || q->n_computed || q->n_swap || q->score_from < q->score_to) return 0;
    const int bs = s->pool->block_size;
    for (const sf_seq *p = s->running.next; p != &s->running; p = p->next)
        if (p->group == q->group && p->n_computed < (p->n_prompt - 1) / bs * bs) return 1;
    return 0;
}

/* Admit a sequence of the waiting queue: the head, or one a waiting sibling let pass
 * (sibling_computes). Returns 1 if admitted, 0 to stop admitting. */
static int admit_head(sf_sched *s, sf_seq *q)
{
    if (q->preempted_at == s->steps + 1) return 0; /* preempted in this very step: wait for the next */
    if (q->n_swap && s->cfg.swap_in_ok && !s->cfg.swap_in_ok(s->cfg.swap_in_ok_arg, q->urgency)) return 0;
    if (sf_kv_blocks_for(s->pool, q->n_tokens) * sf_kv_units(next_kind(s, q)) > usable_units(s, q->urgency) ||
        q->n_tokens > s->cfg.max_model_len)
        return take_out_stuck(s, q);
    int low = q->urgency < SF_URGENCY_HIGH;
    if (low) {
        sf_policy_on_admit(s, q); /* the kind first: the gate counts q's memory in it */
        /* a swap-in runs before the step: while realtime is in, one lower-class swap-in a step */
        if (q->n_swap && s->swap_in_low_step >= 1 && high_active(s)) return 0;
        if (!sf_policy_may_admit_low(s, q, next_kind(s, q))) return 0;
    }
    while (s->n_running >= s->cfg.max_num_seqs) {
        sf_seq *victim = pick_victim(s, q, 1);
        if (!victim) return 0;
        preempt(s, victim);
    }
    prefix_lookup(s, q); /* undone (unadmit) when q is not admitted after all */
    int n = SF_MIN(q->n_tokens - q->n_computed, s->budget_left);
    if (q->urgency < SF_URGENCY_HIGH) n = SF_MIN(n, s->low_budget_left);
    if (n > 0 && (n = rows_cap(s, q, n)) <= 0) return unadmit(s, q); /* the step's logit rows are taken */
    if (n <= 0) {
        unadmit(s, q);
        /* held back for step time (realtime prompts take the steps): refused all the same, so
         * its need is demand too (sched_policy.c) */
        if (low && s->low_budget_left <= 0 && !s->blocked_units)
            s->blocked_units = sf_policy_full_units(s, q, next_kind(s, q));
        return 0;
    }
    if (q->n_swap && ops_reserve(&s->plan.swap_in, s->plan.n_swap_in, &s->cap_swap_in) != SF_OK) return 0;
    for (;;) {
        int rc = grow_blocks(s, q, q->n_computed + n);
        if (rc == SF_OK) break;
        sf_seq *victim = s->n_running ? pick_victim(s, q, 1) : NULL;
        if (rc == SF_ENOMEM || !victim) {
            unadmit(s, q);
            if (rc == SF_AGAIN && !s->blocked_units) /* no room: its need is KV demand (sched_policy.c) */
                s->blocked_units = sf_policy_full_units(s, q, next_kind(s, q));
            return 0;
        }
        preempt(s, victim);
        /* a preempted victim may have held budget: the chunk may grow back, but keep n */
    }
    list_unlink(q);
    s->n_waiting[q->urgency]--;
    q->state = SF_SEQ_RUNNING;
    insert_sorted(&s->running, q, run_before);
    s->n_running++;
    s->n_running_u[q->urgency]++;
    if (low) s->low_reserved_units += sf_policy_full_units(s, q, q->kv_i8_held);
    if (add_item(s, q, n) != SF_OK) return take_out_stuck(s, q);
    if (q->urgency < SF_URGENCY_HIGH && s->low_budget_left != INT_MAX) s->low_budget_left -= n;
    if (q->n_swap) { /* its K/V comes back into the first n_swap of its new blocks before the step */
        sf_plan *p = &s->plan;
        p->swap_in[p->n_swap_in] = (sf_swap_op){ .seq = q, .urgency = q->urgency, .n = q->n_swap,
                                                 .blocks = q->blocks, .slots = q->swap_slots };
        q->swap_in_op = ++p->n_swap_in;
        s->swaps_in++;
        if (low) s->swap_in_low_step++;
    }
    return 1;
}

const sf_plan *sf_sched_plan(sf_sched *s) { return sf_sched_plan_at(s, sf_now_s()); }

const sf_plan *sf_sched_plan_at(sf_sched *s, double now)
{
    sf_plan *p = &s->plan;
    s->now = now;
    sf_policy_update(s);
    /* the previous step's swap copies ran: swapped-in sequences give their slots back */
    for (int i = 0; i < p->n_swap_in; i++) {
        sf_seq *q = p->swap_in[i].seq;
        if (!q) continue;
        q->swap_in_op = 0;
        release_swap(s, q);
    }
    for (int i = 0; i < p->n_swap_out; i++) {
        if (p->swap_out[i].seq) p->swap_out[i].seq->swap_out_op = 0;
        free(p->swap_out[i].blocks);
    }
    p->n_swap_in = p->n_swap_out = 0;
    p->n_items = p->n_tokens = p->n_decode = p->n_prefill = p->n_stuck = 0;
    s->budget_left = s->cfg.max_batched_tokens;
    s->rows_used = 0;

    /* snapshot of the running list in priority order (preemption changes the list); running
     * sequences never outnumber the seats, the array's size */
    int k = 0;
    sf_seq **snap = s->snap;
    if (s->n_running > s->cap_snap) return p;
    for (sf_seq *q = s->running.next; q != &s->running; q = q->next) snap[k++] = q;

    /* 1. decode: one token each, before any prefill, so decodes are never starved */
    for (int i = 0; i < k; i++) {
        sf_seq *q = snap[i];
        if (q->state != SF_SEQ_RUNNING || q->plan_idx >= 0) continue;
        if (q->n_tokens - q->n_computed != 1 || s->budget_left < 1) continue;
        plan_running(s, q, 1);
    }
    /* the rest of the step: prefill, within the latency budget and floors present (policy) */
    sf_policy_caps(s, p->n_tokens);
    /* 2. chunked prefill of running sequences */
    for (int i = 0; i < k && s->budget_left > 0; i++) {
        sf_seq *q = snap[i];
        if (q->state != SF_SEQ_RUNNING || q->plan_idx >= 0) continue;
        int need = SF_MIN(q->n_tokens - q->n_computed, s->budget_left);
        int low = q->urgency < SF_URGENCY_HIGH && s->low_budget_left != INT_MAX;
        if (low) need = SF_MIN(need, s->low_budget_left);
        need = rows_cap(s, q, need);
        if (need < 1) continue;
        if (plan_running(s, q, need) && low) s->low_budget_left -= need;
    }

    /* 3. admission from the waiting queue, head first */
    s->blocked_units = 0;
    s->swap_in_low_step = 0;
    while (s->budget_left > 0) {
        /* the first waiting sequence but those whose prompt a sibling is computing (they come in
         * after it, from the cache); from the head again after each admission, as preemption
         * may have queued victims in front */
        sf_seq *q = s->waiting.next;
        while (q != &s->waiting && sibling_computes(s, q)) q = q->next;
        if (q == &s->waiting || !admit_head(s, q)) break;
    }
    s->steps++;
    return p;
}

void sf_sched_resort_waiting(sf_sched *s)
{
    sf_seq tmp;
    list_init(&tmp);
    while (s->waiting.next != &s->waiting) {
        sf_seq *q = s->waiting.next;
        list_unlink(q);
        insert_sorted(&tmp, q, wait_before);
    }
    if (tmp.next == &tmp) return;
    /* move the sorted chain back under the real head */
    s->waiting.next = tmp.next;
    s->waiting.prev = tmp.prev;
    tmp.next->prev = &s->waiting;
    tmp.prev->next = &s->waiting;
}

void sf_sched_batch(sf_sched *s, sf_batch *b)
{
    const sf_plan *p = &s->plan;
    int bs = s->pool->block_size, T = 0, S = 0, L = 0, stride = 1, quantum = SF_MAX(s->cfg.table_quantum, 1);
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq) stride = SF_MAX(stride, p->items[i].seq->n_blocks);
    stride = (stride + quantum - 1) / quantum * quantum;
    for (int i = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        const sf_seq *q = it->seq;
        if (!q) continue;
        s->b_seq_start[S] = T;
        for (int t = it->start; t < it->start + it->n; t++, T++) {
            s->b_tokens[T] = q->tokens[t];
            s->b_pos[T] = t;
            s->b_slot[T] = q->blocks[t / bs] * bs + t % bs;
        }
        s->b_seq_ctx[S] = it->start + it->n;
        int32_t *row = s->b_table + (size_t)S * stride;
        memcpy(row, q->blocks, (size_t)q->n_blocks * sizeof *row);
        for (int j = q->n_blocks; j < stride; j++) row[j] = 0; /* never read: past seq_ctx */
        if (it->logits) s->b_logit_rows[L++] = T - 1;
        S++;
    }
    s->b_seq_start[S] = T;
    /* the scored positions after every next-token row: those are drawn or read as one block of
     * rows, these scored as another (sf_batch.n_scored, set by the caller where the backend
     * scores) */
    for (int i = 0, k = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        if (!it->seq) continue;
        for (int j = 0; j < it->n_score; j++) s->b_logit_rows[L++] = s->b_seq_start[k] + it->score_at - it->start + j;
        k++;
    }
    memset(b, 0, sizeof *b);
    b->n_tokens = T;
    b->n_seqs = S;
    b->tokens = s->b_tokens;
    b->pos = s->b_pos;
    b->slot = s->b_slot;
    b->seq_start = s->b_seq_start;
    b->seq_ctx = s->b_seq_ctx;
    b->block_table = s->b_table;
    b->max_blocks = stride;
    b->logit_rows = s->b_logit_rows;
    b->n_logits = L;
}

void sf_sched_commit(sf_sched *s)
{
    const sf_plan *p = &s->plan;
    for (int i = 0; i < p->n_items; i++) {
        sf_seq *q = p->items[i].seq;
        if (!q) continue;
        q->n_computed = p->items[i].start + p->items[i].n;
        if (p->items[i].n_score) q->score_from = p->items[i].score_at + p->items[i].n_score;
        if (s->cfg.prefix_cache && !q->kv_i8_held) prefix_register(s, q);
        q->plan_idx = -1; /* the step is done: removing q now must not touch the plan */
    }
    s->tokens_prefill += (uint64_t)p->n_prefill;
    s->tokens_decode += (uint64_t)p->n_decode;
}

void sf_sched_rewind(sf_sched *s, sf_seq *q, int n)
{
    (void)s;
    if (n >= 0 && n < q->n_computed) q->n_computed = n;
}

void sf_sched_discard(sf_sched *s)
{
    sf_plan *p = &s->plan;
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq) p->items[i].seq->plan_idx = -1;
    p->n_items = p->n_tokens = p->n_decode = p->n_prefill = 0;
    s->rows_used = 0;
}

void sf_sched_foreach(sf_sched *s, void (*fn)(sf_seq *q, void *arg), void *arg)
{
    sf_seq *heads[2] = { &s->running, &s->waiting };
    for (int h = 0; h < 2; h++) {
        sf_seq *q = heads[h]->next;
        while (q != heads[h]) {
            sf_seq *next = q->next;
            fn(q, arg);
            q = next;
        }
    }
}
