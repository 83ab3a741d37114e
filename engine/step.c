/* step.c — the engine's step pipeline (engine thread only): plan and launch a step, take its
 * sampled ids, deliver their text and events, and account where the time of a step goes.
 *
 * One loop turn, overlapped (the default):
 *
 *     wait for step N's ids ─ take them ─ plan N+1, build its batch, launch it ─ deliver N
 *                                                     └── the device runs N+1 ──────────────┘
 *
 * Taking an id appends it to its sequence and ends the request when the token alone decides it
 * (EOS, a stop id, max_tokens, the context's end), so N+1 is planned from exactly what a serial
 * loop would plan from. Delivery — detokenizing, stop strings, the callbacks — runs while the
 * device runs N+1. A request that a stop string ends there was planned into N+1: it is withdrawn
 * from that plan, and its row of N+1 is dropped when the ids come (its K/V write lands in blocks
 * that are freed now and reused only by later steps, which the device runs after N+1). Sampling
 * is a pure function of (seed, step, logits), so every request gets the same tokens as in the
 * serial order (SEMFLOW_ENGINE_OVERLAP=0: deliver, then plan and launch).
 *
 * Async scheduling (sf_engine_config.async_steps, SEMFLOW_ENGINE_ASYNC=1) also hides the take
 * and the plan:
 *
 *     plan N+1 assuming every sequence of N continues, launch it ─ wait for N's ids ─ take ─ deliver N
 *     └──────── the device runs N, then N+1 at once ──────────────────────────────────────────────┘
 *
 * N's plan is committed first; each sequence that N draws for gets a stand-in token (its
 * request's `placed`) so the scheduler plans its decode, and N+1's batch takes that token from
 * N's draw on the backend (sf_batch.src_row). Sequences whose next id cannot be stood in for
 * (it decides their length, or it feeds their penalties) are left out of N+1 and planned again
 * once taken. When N's ids come, the stand-ins become the ids; a sequence that they end is
 * removed (its row of N+1 is dropped, as above). A plan that swaps, or finds a sequence stuck,
 * waits for N's ids before it runs (swaps move blocks N may still write). When N+1 has rows held
 * to a form, whose masks follow from N's ids, its forward pass is queued ahead and its launch
 * then takes N's ids and makes the masks before it queues N+1's draw (form_masks):
 *
 *     plan N+1, queue its forward pass ─ wait for N's ids ─ take ─ masks ─ queue N+1's draw ─ deliver N
 *     └──────── the device runs N, then N+1's forward pass, then its draw ─────────────────────────────┘
 *
 * Swaps, preemption and stuck sequences are otherwise planned with no step in flight: a step is
 * launched only after the ids of the one before it were taken. */
#include <limits.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "engine-impl.h"
#include "kernels/cpu/cpu.h"
#include "sampler.h"

void sf_engine_forget(sf_engine *e, sf_request *r)
{
    const sf_flight *fs[2] = { &e->fl, &e->fl2 };
    for (int f = 0; f < 2; f++) {
        if (!fs[f]->active) continue;
        sf_seq **rows = e->row_seq + (size_t)fs[f]->slot * e->cfg.max_logits;
        for (int j = 0; j < fs[f]->k; j++)
            if (rows[j] == &r->seq) rows[j] = NULL;
    }
}

static void free_request(sf_engine *e, sf_request *r)
{
    sf_engine_forget(e, r);
    sf_request_free(r);
}

void sf_engine_finish_free(sf_engine *e, sf_request *r, int reason, int status, const char *msg)
{
    sf_sched_remove(&e->sched, &r->seq);
    sf_request_finish(r, reason, status, msg);
    if (reason == SF_FINISH_CANCELLED) e->n_cancelled++;
    e->n_finished++;
    free_request(e, r);
}

/* Run the plan's swap copies: every swap-out (its blocks may already be planned for others),
 * then every swap-in. A failed swap-out turns into a recompute; a failed swap-in fails its
 * request (its K/V is lost). */
static void run_swaps(sf_engine *e, const sf_plan *p)
{
    sf_error err = { 0 };
    for (int i = 0; i < p->n_swap_out; i++) {
        if (!p->swap_out[i].seq) continue;
        if (sf_swap_run(&e->swap, &p->swap_out[i], SF_DMA_D2H, &err) != SF_OK) {
            SF_LOGW("%s; the sequence will be recomputed instead", err.msg);
            sf_sched_swap_out_failed(&e->sched, i);
        }
    }
    for (int i = 0; i < p->n_swap_in; i++) {
        sf_seq *q = p->swap_in[i].seq;
        if (!q) continue;
        int rc = sf_swap_run(&e->swap, &p->swap_in[i], SF_DMA_H2D, &err);
        if (rc != SF_OK) {
            SF_LOGE("%s", err.msg);
            sf_engine_finish_free(e, q->owner, SF_FINISH_ERROR, rc, err.msg);
        }
    }
}

/* --sched-trace: one line per step (TSV), for finding where step time and latency go. rt: tokens
 * of high-urgency sequences in the step; sw: KV blocks swapped out or in before it, in swap_ms. */
static void trace_step(sf_engine *e, const sf_flight *f)
{
    const sf_sched *s = &e->sched;
    double now = sf_now_s();
    fprintf(e->trace, "%.4f\t%.2f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%llu\t%d\t%d\t%.2f\t%d\t%.4f\t%d\t%d\t%d\t%.2f\t%llu\n",
            now - e->t_start, (now - f->t_plan) * 1e3, f->n_decode, f->n_prefill, s->n_running,
            s->n_waiting[SF_URGENCY_HIGH], s->n_waiting[SF_URGENCY_NORMAL], s->n_waiting[SF_URGENCY_LOW],
            (sf_kv_total_units(&e->pool) - e->pool.n_free_units + 1) / 2, (unsigned long long)s->preemptions,
            s->cap_tokens == INT_MAX ? -1 : s->cap_tokens, s->cap_low == INT_MAX ? -1 : s->cap_low,
            sf_sched_predict_ms(s, f->n_tokens), s->degraded, sf_sched_kv_demand(s), s->n_running_i8, f->rt, f->sw,
            f->swap_ms, (unsigned long long)s->steps);
}

/* Text and events of one token taken (sf_request_deliver); 1 when it ended its request, which
 * is then freed. */
static int deliver_one(sf_engine *e, const sf_taken *t)
{
    sf_request *r = t->r;
    r->taken_slot = 0;
    int fin = sf_request_deliver(r, t->id, t->end, t->logprob, t->top, t->n_top);
    if (fin != SF_REQ_FINISHED && t->stuck) { /* the KV pool cannot hold it even alone */
        sf_request_finish(r, SF_FINISH_LENGTH, SF_OK, NULL);
        fin = SF_REQ_FINISHED;
    }
    if (fin != SF_REQ_FINISHED) return 0;
    if (!t->removed) sf_sched_remove(&e->sched, &r->seq); /* withdrawn from the step in flight, if in it */
    e->n_finished++;
    free_request(e, r);
    return 1;
}

/* The tokens taken, delivered; requests that end are freed. */
static void deliver(sf_engine *e, sf_turn_clock *tc)
{
    double t0 = sf_now_s();
    for (int i = 0; i < e->n_taken; i++) deliver_one(e, &e->taken[i]);
    e->n_taken = 0;
    tc->deliver += sf_now_s() - t0;
}

/* Async scheduling: wait for the oldest draw queued on the backend and take its ids (under TP
 * watching the peers). */
static int take_draw(sf_engine *e, sf_error *err)
{
    return e->tp ? sf_tp_take(e->tp, err) : sf_forward_take(e->fwd, err);
}

/* Wait for the draw just launched (under TP watching the peers; deferred: it stays queued). */
static int wait_sample(sf_engine *e, sf_error *err)
{
    return e->tp ? sf_tp_wait_sample(e->tp, err) : sf_forward_wait_sample(e->fwd, err);
}

/* Wait for the ids of step f: its queued draw, or its draw (the host drew: nothing to wait for). */
static int wait_ids(sf_engine *e, const sf_flight *f, sf_error *err)
{
    return f->queued ? take_draw(e, err) : f->on_dev ? wait_sample(e, err) : SF_OK;
}

/* Draws still queued on the backend (async) are dropped: their ids are taken and ignored. */
static void drop_queued(sf_engine *e)
{
    sf_flight *fs[2] = { &e->fl, &e->fl2 };
    for (int f = 0; f < 2; f++) {
        sf_error err = { 0 };
        if (fs[f]->active && fs[f]->queued && take_draw(e, &err) != SF_OK)
            SF_LOGW("engine: a queued draw failed too: %s", err.msg);
    }
}

/* A step in flight (or being launched) failed: fail the requests in it and in any other step in
 * flight, keep serving the others. A dead tensor-parallel group stops admission for good. */
static void step_failed(sf_engine *e, int rc, const sf_error *err, int n_tokens, sf_turn_clock *tc)
{
    if (rc == SF_ENODEV && e->tp) {
        pthread_mutex_lock(&e->mu);
        if (!e->tp_failed) snprintf(e->tp_failed_msg, sizeof e->tp_failed_msg, "%s", err->msg);
        e->tp_failed = 1;
        pthread_mutex_unlock(&e->mu);
    }
    SF_LOGE("forward step of %d tokens failed: %s", n_tokens, err->msg);
    drop_queued(e);
    deliver(e, tc); /* what was taken before comes first; it may end requests of this plan */
    const sf_plan *p = &e->sched.plan;
    int nv = 0, cap = 2 * e->cfg.max_num_seqs;
    /* the plan's live items and the rows of the steps in flight: running sequences, each once */
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq && nv < cap) e->victims[nv++] = p->items[i].seq->owner;
    const sf_flight *fs[2] = { &e->fl, &e->fl2 };
    for (int f = 0; f < 2; f++) {
        if (!fs[f]->active) continue;
        sf_seq **rows = e->row_seq + (size_t)fs[f]->slot * e->cfg.max_logits;
        for (int j = 0; j < fs[f]->k; j++) {
            int seen = !rows[j] || rows[j]->state == SF_SEQ_DONE;
            for (int v = 0; v < nv && !seen; v++) seen = e->victims[v] == rows[j]->owner;
            if (!seen && nv < cap) e->victims[nv++] = rows[j]->owner;
        }
    }
    sf_sched_discard(&e->sched);
    e->fl.active = e->fl2.active = 0;
    for (int i = 0; i < nv; i++) sf_engine_finish_free(e, e->victims[i], SF_FINISH_ERROR, rc, err->msg);
    sf_kv_prefix_reset(&e->pool); /* blocks registered at the failed step's commit may not hold their K/V */
}

static int take_rows(sf_engine *e, sf_turn_clock *tc);
static int step_take(sf_engine *e, sf_turn_clock *tc);

/* ---- speculative decoding by n-gram lookup (sf_engine_config.spec_tokens) -------------------- */

/* Tokens back from the end an n-gram is looked for in (the rest of a long context is not read). */
#define SPEC_WINDOW 16384

/* Drafting is on and the batch small enough for it: a step that looks for drafts is planned
 * once the ids of the one before are in (not ahead), so drafts follow the last real token. */
static int spec_on(const sf_engine *e)
{
    return e->cfg.spec_tokens > 0 && !e->tp && e->sched.n_running > 0 && e->sched.n_running <= e->cfg.spec_max_batch;
}

/* After looks that found no draft, steps are planned ahead as without drafting before the next
 * look: 0, 1, 3, then 7 of them (looks in a row that failed: 1, 2, 3, more), so text without
 * repeats keeps most of what async scheduling saves and text with them loses few drafts. */
static int spec_quiet_after(int misses) { return misses >= 4 ? 7 : (1 << (misses - 1)) - 1; }

/* Up to max tokens that followed the latest earlier occurrence of q's last n tokens, for n from
 * spec_ngram_max down to spec_ngram_min; 0 when none occurred. */
static int ngram_draft(const sf_engine *e, const sf_seq *q, int max, int32_t *out)
{
    const int32_t *t = q->tokens;
    const int L = q->n_tokens;
    for (int n = SF_MIN(e->cfg.spec_ngram_max, L - 1); n >= e->cfg.spec_ngram_min; n--) {
        const int32_t *pat = t + L - n;
        for (int i = L - n - 1; i >= SF_MAX(0, L - n - SPEC_WINDOW); i--) {
            if (t[i] != pat[0] || memcmp(t + i, pat, (size_t)n * sizeof *t)) continue;
            int d = SF_MIN(max, L - (i + n));
            memcpy(out, t + i + n, (size_t)d * sizeof *out);
            return d;
        }
    }
    return 0;
}

static void spec_drop(sf_seq *q)
{
    q->n_tokens -= q->n_draft;
    q->n_draft = 0;
    q->score_from = q->score_to = 0;
}

/* Before a plan: every decoding sequence with a draft gets it appended to its tokens (n_draft)
 * and the positions before the drafts' end marked for logit rows (score_from / score_to), so
 * its item computes them all; drafts never take KV blocks another sequence would wait for. */
static void spec_propose(sf_engine *e)
{
    if (!spec_on(e)) return; /* e->n_spec is 0: step_launch cleared it */
    sf_sched *s = &e->sched;
    int free_blocks = e->pool.n_free - s->n_running;
    for (sf_seq *q = s->running.next; q != &s->running; q = q->next) {
        sf_request *r = q->owner;
        if (q->n_tokens - q->n_computed != 1 || q->n_draft || q->score_from < q->score_to || r->placed ||
            r->sp.prompt_only)
            continue;
        /* the step yields up to d + 1 tokens: within max_tokens, the sequence's length and the context */
        int room = SF_MIN(e->cfg.spec_tokens, r->max_out - r->n_out - 1);
        room = SF_MIN(room, SF_MIN(q->max_len, e->max_model_len) - q->n_tokens - 1);
        int32_t d[SF_SPEC_MAX_TOKENS];
        int n = room > 0 ? ngram_draft(e, q, room, d) : 0;
        int need = n ? sf_kv_blocks_for(&e->pool, q->n_tokens + n) - q->n_blocks : 0;
        if (!n || need > free_blocks) continue;
        int k = 0;
        while (k < n && sf_seq_append(q, d[k]) == SF_OK) k++;
        if (k < n) { /* out of memory: no draft */
            q->n_tokens -= k;
            continue;
        }
        q->n_draft = n;
        q->score_from = q->n_computed;
        q->score_to = q->n_computed + n;
        free_blocks -= SF_MAX(need, 0);
        e->spec_seqs[e->n_spec++] = q;
    }
}

/* After the plan: drafts of sequences it left out (preempted, or no room in the step) go.
 * looked: spec_propose ran for it (the plan was not made ahead). */
static int spec_planned(sf_engine *e, int looked)
{
    int k = 0;
    for (int i = 0; i < e->n_spec; i++) {
        sf_seq *q = e->spec_seqs[i];
        if (q->plan_idx < 0 || q->state != SF_SEQ_RUNNING) spec_drop(q);
        else {
            e->spec_drafted += (uint64_t)q->n_draft;
            e->spec_seqs[k++] = q;
        }
    }
    e->n_spec = k;
    if (k) e->spec_steps++;
    if (looked && spec_on(e)) { /* the next look now, or after some steps ahead */
        e->spec_misses = k ? 0 : e->spec_misses + 1;
        e->spec_quiet = k ? 0 : spec_quiet_after(e->spec_misses);
    }
    return k;
}

/* Async scheduling: may the next step be planned before the ids of the step in flight come? */
static int may_plan_ahead(const sf_engine *e)
{
    /* not behind a step whose rows the backend scores: its logits are read at its take */
    return e->async && e->fl.active && e->fl.on_dev && !e->fl2.active && !e->fl.committed && !e->fl.n_scored &&
           !e->fl.n_spec && !(spec_on(e) && !e->spec_quiet);
}

/* Async scheduling: commit the plan of the step in flight and give each sequence it draws for
 * that may be planned ahead a stand-in for its id (its request's `placed`). */
static void plan_ahead(sf_engine *e)
{
    sf_flight *f = &e->fl;
    sf_sched_commit(&e->sched);
    f->committed = 1;
    sf_seq **rows = e->row_seq + (size_t)f->slot * e->cfg.max_logits;
    for (int j = 0; j < f->k; j++) {
        sf_request *r = rows[j] ? rows[j]->owner : NULL;
        /* a stand-in that cannot be appended: the sequence waits for its id instead */
        if (r && e->row_score[(size_t)f->slot * e->cfg.max_logits + j] < 0 && rows[j]->state == SF_SEQ_RUNNING && sf_request_may_place(r) && sf_seq_append(&r->seq, 0) == SF_OK)
            r->placed = j + 1;
    }
}

/* Async scheduling: b's tokens that are stand-ins come from the draw in flight (src_row). */
static void src_rows(sf_engine *e, const sf_plan *p, sf_batch *b)
{
    int T = 0, any = 0;
    for (int i = 0; i < p->n_items; i++) {
        const sf_plan_item *it = &p->items[i];
        if (!it->seq) continue;
        for (int t = 0; t < it->n; t++) e->src_row[T + t] = -1;
        const sf_request *r = it->seq->owner;
        if (r->placed && it->start + it->n == it->seq->n_tokens) { /* the stand-in ends the item */
            e->src_row[T + it->n - 1] = r->placed - 1;
            any = 1;
        }
        T += it->n;
    }
    b->src_row = any ? e->src_row : NULL;
}

/* Tensor parallelism: a step that scores prompt positions (read and scored on the host, a step
 * the followers do not draw, and such a step cannot take tokens from the draw in flight: tp.c)
 * is planned once the ids in flight are taken. A step with forms' rows is planned ahead as
 * without TP: its masks follow its plan to the followers (tp.c, masks_later). */
static int tp_takes_first(const sf_engine *e, const sf_plan *p)
{
    if (!e->tp) return 0;
    for (int i = 0; i < p->n_items; i++)
        if (p->items[i].seq && p->items[i].n_score) return 1;
    return 0;
}

/* The forms' masks of a step being launched (sf_forward_sample.prepare), computed while the
 * device runs its forward pass: each row k < k_draw that draws for a request held to a form
 * gets its allow mask, the tokens that can come next (sf_json_mask_bits), or, when none can,
 * draws unmasked and is taken as ending the request (nofit). The rows are shared out over the
 * mask threads (e->mask_pool, the engine thread one of them).
 * Out of memory: SF_EUNSUPPORTED, the step's rows drawn here.
 * A step launched ahead (async) first takes the ids of the step in flight (take_rows): a form's
 * mask follows from the id before it, which the stand-in this step was planned with stood for;
 * the device runs this step's forward pass meanwhile, and only the draw waits. A take that
 * fails (every request in either step was failed) gives SF_ECANCELED. */
typedef struct masks_job {
    sf_engine *e;
    sf_turn_clock *tc;
    sf_seq **rows;
    int k_draw;
    uint8_t *nofit;
    int take_first;             /* ahead: take the step in flight's ids first */
    int take_failed;
    double s;                   /* seconds it took (the backend's enqueue time less them) */
    double after_ids;           /* of them, the masks after take_first's take: the forward pass runs */
    int n;                      /* rows with a form: e->mask_row[0, n) */
    _Atomic int next;           /* the next of them a thread takes */
} masks_job;

/* One mask thread's share: the rows it takes in turn, each mask at its row's index. */
static void masks_share(void *arg, int ith, int nth)
{
    (void)ith, (void)nth;
    masks_job *j = arg;
    sf_engine *e = j->e;
    const int words = (e->vocab + 31) / 32;
    for (int i; (i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n;) {
        const int k = e->mask_row[i];
        const sf_request *r = j->rows[k]->owner;
        j->nofit[k] = sf_json_mask_bits(&r->json, e->jv, e->masks + (size_t)i * words) <= 0;
    }
}

static int form_masks(void *arg)
{
    masks_job *j = arg;
    sf_engine *e = j->e;
    const double t0 = sf_now_s();
    const int words = (e->vocab + 31) / 32;
    if (j->take_first) {
        if (!take_rows(e, j->tc)) {
            j->take_failed = 1;
            return SF_ECANCELED;
        }
        e->n_async_forms++;
    }
    const double t_masks = sf_now_s();
    j->n = 0;
    for (int k = 0; k < j->k_draw; k++) {
        const sf_request *r = j->rows[k] ? j->rows[k]->owner : NULL; /* NULL: failed or freed since the plan */
        if (r && r->sp.json) e->mask_row[j->n++] = k;
    }
    /* the threads at the first step with two */
    sf_error err = { 0 };
    if (j->n > 1 && e->mask_threads > 1 && !e->mask_pool && sf_cpu_pool_new(e->mask_threads, &e->mask_pool, &err)) {
        SF_LOGW("engine: the forms' mask threads: %s; making masks on the engine thread", err.msg);
        e->mask_threads = 1;
    }
    if (!sf_grow((void **)&e->masks, &e->mask_cap, j->n, (size_t)words * sizeof *e->masks)) return SF_EUNSUPPORTED;
    atomic_store_explicit(&j->next, 0, memory_order_relaxed);
    sf_cpu_pool_run(j->n > 1 ? e->mask_pool : NULL, masks_share, j);
    for (int i = 0; i < j->n; i++)
        if (!j->nofit[e->mask_row[i]]) e->rows[e->mask_row[i]].allow = e->masks + (size_t)i * words;
    const double t_end = sf_now_s();
    j->s = t_end - t0;
    j->after_ids = j->take_first ? t_end - t_masks : 0;
    return SF_OK;
}

/* Plan the next step and launch it. Returns the tokens launched (0: none); *progress is set when
 * stuck requests were finished. ahead (async): the step in flight's ids have not come; the new
 * step is planned assuming its sequences continue, or its ids are taken first when the plan
 * needs them (*took is then set). */
static int step_launch(sf_engine *e, sf_turn_clock *tc, int *progress, int ahead, int *took)
{
    sf_error err = { 0 };
    double t0 = sf_now_s();
    e->n_spec = 0;
    if (ahead) {
        plan_ahead(e);
        if (e->spec_quiet > 0) e->spec_quiet--;
    }
    else spec_propose(e); /* drafts for the plan to compute */
    const sf_plan *p = sf_sched_plan_at(&e->sched, t0);
    const int n_spec = spec_planned(e, !ahead);
    if (ahead && (p->n_stuck || p->n_swap_out || p->n_swap_in || tp_takes_first(e, p))) {
        /* swaps move blocks the step in flight may still write, a stuck sequence's last token
         * is still to come, and under tensor parallelism a step the followers do not draw cannot
         * take tokens from a draw, nor can a form's masks be sent before the ids they follow:
         * take the step's ids first (the stand-ins become ids) */
        double tw = sf_now_s();
        tc->plan += tw - t0;
        *took = step_take(e, tc);
        if (!*took) return 0; /* it failed: every request in it or in this plan was failed */
        t0 = sf_now_s();
        ahead = 0;
    }
    sf_flight *f = ahead ? &e->fl2 : &e->fl;
    for (int i = 0; i < p->n_stuck; i++) { /* the KV pool cannot hold them even alone */
        sf_request *r = p->stuck[i]->owner;
        *progress = 1;
        if (r->taken_slot) { /* its last token is still to deliver: finish it after that */
            sf_sched_remove(&e->sched, &r->seq);
            e->taken[r->taken_slot - 1].removed = 1;
            e->taken[r->taken_slot - 1].stuck = 1;
        } else {
            sf_engine_finish_free(e, r, SF_FINISH_LENGTH, SF_OK, NULL);
        }
    }
    memset(f, 0, sizeof *f);
    f->n_spec = n_spec;
    f->t_plan = f->t_ready = t0;
    f->slot = e->next_slot; /* at most two steps in flight, launched in turn */
    e->next_slot ^= 1;
    if (e->trace) { /* the plan's sequences may be freed by the time the trace line is written */
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].seq && p->items[i].seq->urgency == SF_URGENCY_HIGH) f->rt += p->items[i].n;
        for (int i = 0; i < p->n_swap_out; i++) f->sw += p->swap_out[i].seq ? p->swap_out[i].n : 0;
        for (int i = 0; i < p->n_swap_in; i++) f->sw += p->swap_in[i].seq ? p->swap_in[i].n : 0;
    }
    double t_sw = sf_now_s();
    run_swaps(e, p);
    double t1 = sf_now_s();
    f->swap_ms = (t1 - t_sw) * 1e3;
    tc->plan += t1 - t0;
    if (p->n_tokens == 0) {
        sf_sched_discard(&e->sched);
        return 0;
    }
    sf_batch b;
    sf_sched_batch(&e->sched, &b); /* its table stride rounded to TABLE_STRIDE_QUANTUM blocks */
    if (ahead) src_rows(e, p, &b);
    /* The sequences that yield logits, in logit-row order; they pick the sampling path. */
    sf_seq **rows = e->row_seq + (size_t)f->slot * e->cfg.max_logits;
    int32_t *ids = e->ids + (size_t)f->slot * e->cfg.max_logits, *score = e->row_score + (size_t)f->slot * e->cfg.max_logits;
    int k = 0, n_pen = 0, n_forms = 0, n_lp = 0, on_dev = !e->cfg.host_sampling && sf_forward_can_sample(e->fwd);
    uint8_t *nofit = e->row_nofit + (size_t)f->slot * e->cfg.max_logits;
    for (int i = 0; i < p->n_items; i++) { /* the next-token rows, in item order (sf_sched_batch) */
        const sf_plan_item *it = &p->items[i];
        if (!it->seq || !it->logits) continue;
        sf_request *r = it->seq->owner;
        score[k] = it->seq->n_draft ? it->start + it->n - 1 : -1; /* a drafted sequence's rows: by position */
        rows[k] = it->seq;
        nofit[k] = 0;
        /* a request held to a form draws on the backend with its mask, one with logprobs gets
         * them with its id (under tensor parallelism too: tp.c sends the masks with the plan) */
        if (on_dev && sf_sampler_row(&r->sp, &r->ss, &e->rows[k], &e->pen, &n_pen, &e->cap_pen) != SF_OK)
            on_dev = 0; /* the whole batch on the host */
        else if (on_dev && r->placed)
            e->rows[k].step++; /* its stand-in's draw comes first */
        n_forms += r->sp.json != 0;
        n_lp += r->sp.logprobs != 0;
        k++;
    }
    const int k_draw = k;
    for (int i = 0; i < p->n_items; i++) { /* then the scored prompt positions */
        const sf_plan_item *it = &p->items[i];
        for (int j = 0; it->seq && j < it->n_score; j++) {
            rows[k] = it->seq;
            score[k++] = it->score_at + j; /* k <= the scheduler's max_logits */
        }
    }
    /* scored on the backend where it can (only their results cross PCIe); else read with the
     * drawn rows and scored here, which takes the whole step to the host */
    f->n_scored = k > k_draw && e->dev_score && !n_spec ? k - k_draw : 0;
    f->k_draw = k_draw;
    b.n_scored = f->n_scored;
    if ((k > k_draw && !f->n_scored) || n_spec) on_dev = 0; /* drafts are checked against host draws */
    f->k = k;
    f->n_tokens = b.n_tokens;
    f->n_decode = p->n_decode;
    f->n_prefill = p->n_prefill;
    f->decode = p->n_decode == b.n_tokens && b.n_tokens == b.n_seqs;
    f->active = 1; /* its rows are known now: a request freed from here on is forgotten in them */
    /* under tensor parallelism the masks follow the step's plan to the other ranks (tp.c) */
    masks_job mj = { .e = e, .tc = tc, .rows = rows, .k_draw = k_draw, .nofit = nofit, .take_first = ahead };
    double t2 = sf_now_s();
    tc->batch += t2 - t1;
    const double w0 = tc->wait + tc->take; /* a take inside the launch (form_masks) is not launch time */
    double prep_s = 0;
    int rc;
    if (e->tp && !on_dev) rc = sf_tp_step(e->tp, &b, e->logits, &err);
    else if (on_dev) { /* under TP: rank 0 samples the gathered rows on its device */
        sf_forward_sample smp = { .rows = e->rows, .pen = e->pen, .n_pen = n_pen, .ids = ids,
                                  .lp = n_lp ? e->lp + (size_t)f->slot * e->cfg.max_logits : NULL,
                                  .prepare = n_forms ? form_masks : NULL, .prepare_arg = &mj };
        rc = e->tp ? sf_tp_launch_sample(e->tp, &b, &smp, &err) : sf_forward_launch_sample(e->fwd, &b, &smp, &err);
        if (mj.take_failed) return 0; /* the step in flight failed: this one's requests went with it */
        prep_s = mj.s;
        if (rc == SF_EUNSUPPORTED) { /* the backend declined these sizes: the step ran, sample here */
            on_dev = 0;
            rc = sf_forward_read_logits(e->fwd, k_draw, e->logits, &err);
        }
    } else rc = sf_forward_step(e->fwd, &b, e->logits, &err);
    double t3 = sf_now_s(), t_enq = t3;
    int device_ran = 0; /* a device ran the queued forward pass while the host went on (CUDA) */
    sf_backend_stats bs;
    if (sf_backend_cuda_stats(e->be, &bs) == SF_OK && bs.last_step_begin_s >= t2 && bs.last_step_enqueued_s <= t3) {
        /* the device's work was all queued at t_enq; after it the launch waited (TP: the
         * logits' gather; host sampling: the copy of the logits) */
        t_enq = bs.last_step_enqueued_s;
        tc->enqueue += SF_MAX(0.0, bs.last_step_host_us * 1e-6 - prep_s); /* the masks are not the backend's */
        /* a launch that waited for its step (host sampling, or a gather that waits) leaves the
         * device with at most the draw from t3: its idle gap starts there, not at the ids, and
         * the launch's time after t_enq was a wait; otherwise that time queued the gather and
         * the draw (host work) */
        if (!on_dev || sf_forward_launch_waited(e->fwd)) {
            f->t_done = t3;
            tc->wait += t3 - t_enq;
        } else device_ran = 1;
    }
    tc->launch += t3 - t2 - (tc->wait + tc->take - w0);
    if (e->tp) tc->send += sf_tp_last_send_s(e->tp);
    f->t_enq = t_enq;
    f->mask_s = device_ran ? mj.after_ids : 0;
    if (!ahead && e->t_ids > 0) tc->exposed += t_enq - e->t_ids;
    if (rc == SF_OK && on_dev && e->async) { /* the draw stays queued until sample_take */
        rc = wait_sample(e, &err);
        f->queued = rc == SF_OK;
    }
    if (rc != SF_OK) {
        step_failed(e, rc, &err, b.n_tokens, tc);
        return 0;
    }
    f->on_dev = on_dev;
    if (ahead) e->n_async++;
    return b.n_tokens;
}

/* The rows of step f that the backend scores (its last n_scored): each its prompt token's
 * log-probability, rank and the top alternatives the requests among them ask for (e->score_k,
 * the most any asks), into e->sc_*. A row whose request is gone scores token 0. */
static int score_rows(sf_engine *e, const sf_flight *f, sf_error *err)
{
    sf_seq **rows = e->row_seq + (size_t)f->slot * e->cfg.max_logits;
    const int32_t *score = e->row_score + (size_t)f->slot * e->cfg.max_logits;
    const int j0 = f->k - f->n_scored;
    int kk = 0;
    for (int s = 0; s < f->n_scored; s++) {
        const sf_seq *q = rows[j0 + s];
        e->sc_target[s] = q ? q->tokens[score[j0 + s] + 1] : 0;
        if (q) kk = SF_MAX(kk, ((const sf_request *)q->owner)->plk);
    }
    e->score_k = kk;
    return sf_forward_score(e->fwd, j0, f->n_scored, e->sc_target, kk, e->sc_lp, e->sc_rank, e->sc_tid, e->sc_tlp, err);
}

/* Row j of step f, q's: its id (drawn on the backend, or here with JSON mode's mask) taken by
 * q's request into e->taken; a sequence it ends is taken out of the scheduler. */
static const sf_taken *take_row(sf_engine *e, const sf_flight *f, int j, sf_seq *q)
{
    const int32_t *ids = e->ids + (size_t)f->slot * e->cfg.max_logits;
    sf_request *r = q->owner;
    sf_taken *t = &e->taken[e->n_taken];
    t->r = r;
    t->logprob = 0;
    t->n_top = 0;
    float *row = e->logits + (size_t)j * e->vocab;
    /* a form: what cannot continue goes (on the backend: its mask); when nothing is left the
     * request ends in an error */
    int fits = f->on_dev ? !e->row_nofit[(size_t)f->slot * e->cfg.max_logits + j]
                         : !r->sp.json || sf_json_mask(&r->json, e->jv, row) > 0;
    t->id = !fits ? sf_tok_eos(r->tok) : f->on_dev ? ids[j] : sf_sample(&r->sp, &r->ss, row, e->vocab, &t->logprob, t->top, &t->n_top);
    if (fits && f->on_dev && r->sp.logprobs)
        sf_sampler_lp_out(&e->lp[(size_t)f->slot * e->cfg.max_logits + j], &r->sp, &t->logprob, t->top, &t->n_top);
    if (fits && r->sp.json) sf_json_accept(&r->json, e->jv, t->id);
    t->end = fits ? sf_request_take(r, t->id) : SF_REQ_END_NO_FIT;
    t->removed = t->end != SF_REQ_CONTINUE;
    t->stuck = 0;
    if (t->removed) sf_sched_remove(&e->sched, q); /* not planned again */
    r->taken_slot = ++e->n_taken;
    e->n_tokens_out += t->end != SF_REQ_END_PROMPT && t->end != SF_REQ_END_NO_FIT;
    return t;
}

/* A drafted sequence of step f: its rows, by position from its last real token, are drawn in
 * order as decoding would draw them one step each (the sampler's counter, penalties, JSON state
 * and stop checks advancing with every token taken), each token delivered at once, so a stop
 * string ends the request where it would have without drafts; a draft equal to its draw is
 * kept and the next row checks the one after it; the first draw that differs (or the row after
 * the last draft) is the step's last token. Its K/V then holds the tokens before that one. */
static void spec_verify(sf_engine *e, const sf_flight *f, sf_seq *q)
{
    sf_seq **rows = e->row_seq + (size_t)f->slot * e->cfg.max_logits;
    const int32_t *pos = e->row_score + (size_t)f->slot * e->cfg.max_logits;
    int js[SF_SPEC_MAX_TOKENS + 1], n = 0;
    for (int j = 0; j < f->k && n <= SF_SPEC_MAX_TOKENS; j++) {
        if (rows[j] != q) continue;
        int i = n++; /* insertion by position */
        while (i > 0 && pos[js[i - 1]] > pos[j]) js[i] = js[i - 1], i--;
        js[i] = j;
    }
    const int d = q->n_draft, c = q->n_tokens - 1 - d; /* c: the last real token's position */
    int32_t draft[SF_SPEC_MAX_TOKENS];
    memcpy(draft, q->tokens + c + 1, (size_t)d * sizeof *draft);
    q->n_tokens = c + 1; /* the ids taken append themselves */
    q->n_draft = 0;
    q->score_from = q->score_to = 0;
    int taken = 0;
    for (int i = 0; i < n && pos[js[i]] == c + i; i++) {
        const sf_taken *t = take_row(e, f, js[i], q);
        const int hit = i < d && t->id == draft[i], removed = t->removed;
        e->n_taken--; /* delivered here, not with the step's other tokens */
        if (deliver_one(e, t)) return; /* ended (and freed) by this token */
        taken++;
        e->spec_accepted += (uint64_t)hit;
        if (removed || !hit) break;
    }
    sf_sched_rewind(&e->sched, q, c + taken);
}

/* Wait for the ids of the oldest step in flight and take its rows. Returns 1 when they were
 * taken; 0: the step failed (every request in it, or in the step queued or planned behind it,
 * was failed). */
static int take_rows(sf_engine *e, sf_turn_clock *tc)
{
    sf_error err = { 0 };
    sf_flight *f = &e->fl;
    double t0 = sf_now_s();
    int rc = wait_ids(e, f, &err);
    f->queued = 0; /* its draw taken, or failed */
    double t1 = sf_now_s();
    tc->wait += t1 - t0;
    e->t_ids = f->t_done > 0 && f->t_done < t1 ? f->t_done : t1;
    e->t_took = t1;
    if (rc == SF_OK && f->n_scored) rc = score_rows(e, f, &err);
    if (rc != SF_OK) {
        step_failed(e, rc, &err, f->n_tokens, tc);
        return 0;
    }
    if (!f->committed) sf_sched_commit(&e->sched);
    if (f->on_dev) e->rows_dev += (uint64_t)f->k_draw;
    else e->rows_host += (uint64_t)f->k_draw;
    e->rows_scored += (uint64_t)(f->k - f->k_draw);
    e->rows_scored_dev += (uint64_t)f->n_scored;
    sf_seq **rows = e->row_seq + (size_t)f->slot * e->cfg.max_logits;
    const int32_t *score = e->row_score + (size_t)f->slot * e->cfg.max_logits;
    for (int j = 0; j < f->k; j++) {
        sf_seq *q = rows[j];
        /* freed while the step ran: cancelled, ended by a stop string, or (async) ended by the
         * step before it, whose ids were taken after this step was planned; drafted: below */
        if (!q || q->n_draft) continue;
        sf_request *r = q->owner;
        if (score[j] >= 0) { /* a prompt position's row: scored on the backend, or here */
            const int s = j - (f->k - f->n_scored), kk = e->score_k;
            if (f->n_scored)
                sf_request_score_put(r, score[j], e->sc_lp[s], e->sc_rank[s], e->sc_tid + (size_t)s * kk,
                                     e->sc_tlp + (size_t)s * kk, kk);
            else
                sf_request_score(r, score[j], e->logits + (size_t)j * e->vocab, e->vocab);
            continue;
        }
        take_row(e, f, j, q);
    }
    for (int j = 0; f->n_spec && j < f->k; j++) /* each drafted sequence once: spec_verify clears n_draft */
        if (rows[j] && rows[j]->n_draft) spec_verify(e, f, rows[j]);
    sf_sched_observe(&e->sched, f->n_tokens, f->n_decode, (t1 - f->t_ready) * 1e3);
    if (e->trace) trace_step(e, f);
    f->taken = 1;
    tc->take += sf_now_s() - t1;
    return 1;
}

/* Take the oldest step in flight (its rows, unless the launch behind it took them already) and
 * make the step queued behind it the oldest. Returns 1 when a step was taken. */
static int step_take(sf_engine *e, sf_turn_clock *tc)
{
    if (!e->fl.taken && !take_rows(e, tc)) return 0;
    const double t1 = sf_now_s();
    /* the step queued behind it becomes the oldest; it could start once these ids were in (its
     * draw, when it waited for them in its launch, counts from them to its queueing as exposed) */
    e->fl = e->fl2;
    e->fl2.active = 0;
    if (e->fl.active) {
        e->fl.t_ready = SF_MAX(e->fl.t_ready, e->t_took);
        /* its forms' masks, made after these ids, overlapped its forward pass (queued before
         * them): not the host's gap; they are counted apart (the device's own clock,
         * dev_idle_s, shows where they outlast the forward pass) */
        tc->exposed += SF_MAX(0.0, e->fl.t_enq - e->t_ids - e->fl.mask_s);
        tc->masks += e->fl.mask_s;
    }
    tc->take += sf_now_s() - t1;
    return 1;
}
/* Decode turn durations are kept in buckets 1% wide from 10 µs up (SF_STEP_HIST of them reach
 * past 100 s): bucket i holds [0.01 * 1.01^i, 0.01 * 1.01^(i+1)) ms. */
static int hist_bucket(double ms)
{
    double i = ms > 0.01 ? floor(log(ms / 0.01) / log(1.01)) : 0;
    return i < SF_STEP_HIST - 1 ? (int)i : SF_STEP_HIST - 1;
}

int sf_engine_turn(sf_engine *e)
{
    sf_turn_clock tc = { 0 };
    double t_turn = sf_now_s();
    sf_flight done = e->fl; /* the step whose ids this turn takes */
    int took = 0, progress = 0, launched;
    e->t_ids = 0;
    if (may_plan_ahead(e)) { /* async: queue the next step behind it, then take its ids */
        launched = step_launch(e, &tc, &progress, 1, &took);
        if (!took && e->fl.active) took = step_take(e, &tc);
    } else {
        if (e->fl.active) took = step_take(e, &tc);
        if (e->serial) deliver(e, &tc);
        int unused = 0;
        launched = step_launch(e, &tc, &progress, 0, &unused);
    }
    deliver(e, &tc);
    if (took) { /* the turn's time, less what it spent waiting for the device */
        double turn = sf_now_s() - t_turn, host = SF_MAX(0.0, turn - tc.wait);
        e->step_s += turn;
        e->host_s += host;
        if (done.decode) {
            e->decode_steps++;
            e->decode_step_s += turn;
            e->decode_host_s += host;
            e->decode_enqueue_s += tc.enqueue;
            e->decode_tokens += (uint64_t)done.n_tokens;
            sf_turn_clock *d = &e->dclk;
            d->wait += tc.wait, d->take += tc.take, d->plan += tc.plan, d->batch += tc.batch;
            d->launch += tc.launch, d->send += tc.send, d->deliver += tc.deliver, d->enqueue += tc.enqueue;
            d->exposed += launched ? tc.exposed : 0;
            d->masks += launched ? tc.masks : 0;
            if (e->step_hist) e->step_hist[hist_bucket(turn * 1e3)]++;
            if (e->step_hist && launched) e->step_hist[SF_STEP_HIST + hist_bucket(tc.exposed * 1e3)]++;
        }
    }
    return took || launched || progress;
}

void sf_engine_settle(sf_engine *e)
{
    while (e->fl.active) { /* the oldest first; the ids are dropped with the requests */
        sf_error err = { 0 };
        const sf_flight *f = &e->fl;
        int rc = wait_ids(e, f, &err);
        if (rc) SF_LOGW("engine: the step in flight at shutdown failed: %s", err.msg[0] ? err.msg : sf_status_str(rc));
        e->fl = e->fl2;
        e->fl2.active = 0;
    }
    sf_sched_discard(&e->sched);
}

void sf_engine_step_percentiles(const sf_engine *e, int which, double *p50, double *p90)
{
    uint64_t n = 0, c = 0;
    int i50 = -1, i90 = -1;
    *p50 = *p90 = 0;
    if (!e->step_hist) return;
    const uint32_t *h = e->step_hist + (which ? SF_STEP_HIST : 0);
    for (int i = 0; i < SF_STEP_HIST; i++) n += h[i];
    for (int i = 0; i < SF_STEP_HIST && n && i90 < 0; i++) {
        c += h[i];
        if (i50 < 0 && 2 * c >= n) i50 = i;
        if (10 * c >= 9 * n) i90 = i;
    }
    /* each bucket's middle: within 0.5% */
    if (i50 >= 0) *p50 = 0.01 * pow(1.01, i50 + 0.5);
    if (i90 >= 0) *p90 = 0.01 * pow(1.01, i90 + 0.5);
}

/* Decode batch sizes the warm-up runs: the row counts the CUDA backend's GEMM tuner times its
 * choices at (kernels/cuda/gemm.cu tune_buckets; any count up to one of them uses its choice). */
static const int warm_sizes[] = { 16, 24, 32, 48, 64, 96, 128, 192, 256 };

/* One warm-up step: n sequences of one token each at position 0 of block s (the pool is still
 * empty), block tables `stride` wide, logits for the first L; greedy draws on the backend where
 * it samples. buf: [n * (5 + stride) + 1] scratch. */
static int warm_step(sf_engine *e, int n, int L, int stride, int32_t *buf, sf_error *err)
{
    int32_t *tok = buf, *pos = tok + n, *slot = pos + n, *start = slot + n, *ctx = start + n + 1, *table = ctx + n;
    for (int s = 0; s < n; s++) {
        tok[s] = (int32_t)((s * 7919) % e->vocab);
        pos[s] = 0;
        slot[s] = s * e->cfg.kv_block_size;
        start[s] = s;
        ctx[s] = 1;
        table[(size_t)s * stride] = s;
        for (int j = 1; j < stride; j++) table[(size_t)s * stride + j] = 0; /* past the context: never read */
    }
    start[n] = n;
    sf_batch b = { .n_tokens = n, .n_seqs = n, .tokens = tok, .pos = pos, .slot = slot, .seq_start = start,
                   .seq_ctx = ctx, .block_table = table, .max_blocks = stride, .logit_rows = start, .n_logits = L };
    int rc;
    if (!e->cfg.host_sampling && sf_forward_can_sample(e->fwd)) {
        for (int s = 0; s < L; s++) e->rows[s] = (sf_sample_row){ .temperature = 0, .top_p = 1, .repetition_penalty = 1 };
        sf_forward_sample smp = { .rows = e->rows, .ids = e->ids };
        rc = e->tp ? sf_tp_step_sample(e->tp, &b, &smp, err) : sf_forward_step_sample(e->fwd, &b, &smp, err);
        if (rc == SF_EUNSUPPORTED) rc = SF_OK; /* the step ran; the sampler declined these sizes */
    } else {
        rc = e->tp ? sf_tp_step(e->tp, &b, e->logits, err) : sf_forward_step(e->fwd, &b, e->logits, err);
    }
    return rc;
}

int sf_engine_warm_up(sf_engine *e, int n_blocks, sf_error *err)
{
    /* steps of up to 256 tokens (decode, or a mix with prefill) use the tuned choices; logit
     * rows up to max_num_seqs */
    int max_n = SF_MIN(SF_MIN(SF_MAX(e->cfg.max_num_seqs, 256), e->cfg.max_batched_tokens), n_blocks);
    int full = SF_MIN(SF_MIN(e->cfg.max_num_seqs, e->cfg.max_batched_tokens), n_blocks); /* every seat decoding */
    int rc = SF_OK, ran = 0;
    int32_t *buf = malloc(((size_t)(5 + TABLE_STRIDE_QUANTUM) * SF_MAX(max_n, full) + 1) * sizeof *buf);
    if (!buf) return sf_err(err, SF_ENOMEM, "engine warm-up: out of memory");
    int sizes[SF_ARRAY_LEN(warm_sizes) + 1], n_sizes = 0;
    for (size_t i = 0; i < SF_ARRAY_LEN(warm_sizes) && warm_sizes[i] <= max_n; i++) sizes[n_sizes++] = warm_sizes[i];
    if (max_n > 8 && (!n_sizes || sizes[n_sizes - 1] != max_n)) sizes[n_sizes++] = max_n; /* its bucket's choice */
    double t0 = sf_now_s();
    for (int i = 0; i < n_sizes && !rc; i++, ran++)
        rc = warm_step(e, sizes[i], SF_MIN(sizes[i], e->cfg.max_num_seqs), 1, buf, err);
    /* The decode step of every seat, with block tables as wide as contexts of up to
     * TABLE_STRIDE_QUANTUM blocks send them, twice: a backend that records steps (CUDA graphs:
     * seen once, then captured) then has that step ready for the saturated decode steps. */
    for (int k = 0; k < 2 && !rc && full > 8; k++, ran++)
        rc = warm_step(e, full, full, TABLE_STRIDE_QUANTUM, buf, err);
    free(buf);
    if (rc) return sf_err_wrap(err, "engine warm-up");
    if (ran)
        SF_LOGI("engine: warm-up of %d steps of up to %d tokens in %.2f s (the backend's per-size choices made "
                "before serving)", ran, SF_MAX(max_n, full), sf_now_s() - t0);
    return SF_OK;
}
