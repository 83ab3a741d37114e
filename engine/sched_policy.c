/* sched_policy.c — step-time model, step shaping, floor protection and degrade-instead-of-reject.
 * See sched_policy.h and scheduler.h (sf_sched_config) for the contracts. Engine thread only.
 *
 * Why the step is shaped: a step runs every planned token before any sequence gets its next
 * one, so the step time is everyone's inter-token latency, and the time a request that just
 * arrived waits before its own prefill can start. A full token budget of prompt tokens takes
 * ~1.5 s on two CPU cores; every request that arrives meanwhile is admitted into the next
 * equally full step, so the engine locks into long steps that no ordering of the queue can
 * shorten. Planning the step for a time budget instead of a token count keeps the latency
 * targets that are present within reach, at the cost of prefill throughput (more, smaller
 * steps) only while such targets exist. */
#include "sched_policy.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "engine.h"

#define CM_FORGET 0.95      /* recursive least squares forgetting factor (~20 steps of memory) */
#define CM_MIN_STEPS 8      /* steps measured before the model is trusted */
#define AVG_ALPHA 0.1       /* moving average of step time (admission's floor check) */
#define CM_REF_ALPHA 0.02   /* slow average of the per-token term (~50 steps): its floor in tokens_within */
#define TARGET_MEMORY_S 10.0 /* a latency target shapes steps this long after the last request that had it */
#define FLOOR_MARGIN 0.8    /* floors shape steps to this share of 1000 / min_tps: the model's error and
                             * the prefill of higher classes (never held back) stay inside the floor */
#define RT_EXTRA_MS 2.0     /* ... and at most this when it rides in one after LOW_STARVE_S without prefill */
#define LOW_STEP_FRAC 0.05  /* while a latency target is present, a step with lower-class prefill takes at most
                             * this share of the tightest target (20 ms for 400 ms): what a realtime request
                             * arriving during it waits for */
#define LOW_STARVE_S 0.1    /* lower-class prefill stays out of steps that carry a realtime prompt unless it
                             * had none for this long (under 8x load nearly every step carries one) */
#define DIP_BRIDGE_S 0.5    /* the degrade watch bridges a dip back across its threshold this short */
#define HI_MEMORY_S 3.0     /* the high class's peaks (seats, KV) decay with this time constant */
#define HI_MARGIN 1.25      /* seats and KV kept for the high class: this much over its recent peak */

/* ---- step-time model: ms = th0 + th1 x tokens ------------------------------------------- */

void sf_sched_observe(sf_sched *s, int n_tokens, int n_decode, double ms)
{
    if (n_tokens <= 0 || !(ms >= 0)) return;
    if (s->cm_n == 0) { /* P = diag(1e4, 1): vague prior on both terms */
        s->cm_p[0] = 1e4, s->cm_p[1] = 0, s->cm_p[2] = 1;
        s->cm_th[0] = ms, s->cm_th[1] = 0;
    }
    double x = n_tokens, *p = s->cm_p, *th = s->cm_th;
    double px0 = p[0] + p[1] * x, px1 = p[1] + p[2] * x;
    double den = CM_FORGET + px0 + px1 * x;
    double k0 = px0 / den, k1 = px1 / den;
    double e = ms - (th[0] + th[1] * x);
    th[0] += k0 * e;
    th[1] += k1 * e;
    p[0] = (p[0] - k0 * px0) / CM_FORGET;
    p[1] = (p[1] - k0 * px1) / CM_FORGET;
    p[2] = (p[2] - k1 * px1) / CM_FORGET;
    /* steady decode-only traffic never varies x: keep P from winding up in that direction */
    if (p[0] > 1e6 || p[2] > 1e2) p[0] *= 0.5, p[1] *= 0.5, p[2] *= 0.5;
    s->cm_n++;
    if (th[1] > 1e-9) s->cm_b_ref = s->cm_b_ref > 0 ? s->cm_b_ref + CM_REF_ALPHA * (th[1] - s->cm_b_ref) : th[1];
    if (n_decode > 0) s->step_ms_avg = s->step_ms_avg > 0 ? s->step_ms_avg + AVG_ALPHA * (ms - s->step_ms_avg) : ms;
}

double sf_sched_predict_ms(const sf_sched *s, int n_tokens)
{
    if (s->cm_n < CM_MIN_STEPS) return 0;
    double t = s->cm_th[0] + s->cm_th[1] * n_tokens;
    return t > 0 ? t : 0;
}

/* Tokens a step may hold to take at most ms; INT_MAX when the model cannot tell. The per-token
 * term is held to at least half its slow average: steps that all carry about as many tokens (a
 * capped prefill chunk beside the same decode rows) leave the slope unidentified, and a slope
 * drifting to zero must not lift the cap (on the CPU rehearsal it let a 2042-token step of 1.4 s
 * through while realtime requests waited). */
static double per_token_ms(const sf_sched *s)
{
    return s->cm_n < CM_MIN_STEPS ? 0 : SF_MAX(s->cm_th[1], 0.5 * s->cm_b_ref);
}

static int tokens_within(const sf_sched *s, double ms)
{
    double b = per_token_ms(s);
    if (!(b > 1e-9)) return INT_MAX;
    double n = (ms - SF_MAX(s->cm_th[0], 0.0)) / b;
    return n <= 0 ? 0 : n >= INT_MAX ? INT_MAX : (int)n;
}

/* ---- step shaping ----------------------------------------------------------------------- */

/* A high-urgency sequence waits, or runs with prompt tokens still to compute. */
static int high_prefill_pending(const sf_sched *s)
{
    if (s->n_waiting[SF_URGENCY_HIGH] > 0) return 1;
    for (const sf_seq *q = s->running.next; q != &s->running && q->urgency >= SF_URGENCY_HIGH; q = q->next)
        if (q->n_tokens - q->n_computed > 1) return 1;
    return 0;
}

void sf_policy_caps(sf_sched *s, int n_decode)
{
    s->cap_tokens = s->cap_low = s->low_budget_left = INT_MAX;
    if (!s->cfg.shape) return;
    double t_rt = INFINITY, t_fl = INFINITY;
    sf_seq *heads[2] = { &s->running, &s->waiting };
    for (int h = 0; h < 2; h++)
        for (sf_seq *q = heads[h]->next; q != heads[h]; q = q->next) {
            if (q->max_latency_ms > 0 && !q->relaxed) t_rt = SF_MIN(t_rt, q->max_latency_ms * (double)s->cfg.shape_frac);
            if (h == 0 && q->min_tps > 0 && q->n_tokens - q->n_computed <= 1)
                t_fl = SF_MIN(t_fl, FLOOR_MARGIN * 1000.0 / q->min_tps);
        }
    /* A request with a target that arrives during a step waits for it: keep shaping for the
     * tightest target seen lately, not only while one is in, so a lone long prompt between two
     * realtime requests does not become the step the next one waits behind. */
    if (t_rt < INFINITY) s->rt_seen_ms = t_rt, s->rt_seen_at = s->now;
    else if (s->rt_seen_ms > 0 && s->now - s->rt_seen_at < TARGET_MEMORY_S) t_rt = s->rt_seen_ms;
    int min_chunk = SF_MAX(1, s->cfg.min_chunk);
    if (t_rt < INFINITY) {
        int n = tokens_within(s, t_rt);
        if (n != INT_MAX) s->cap_tokens = SF_MAX(min_chunk, n - n_decode);
    }
    if (t_fl < INFINITY) {
        int n = tokens_within(s, t_fl);
        if (n != INT_MAX) s->cap_low = SF_MAX(min_chunk, n - n_decode);
    }
    s->cap_low = SF_MIN(s->cap_low, s->cap_tokens);
    /* Lower-class prefill while realtime is about: a realtime request arriving during the step
     * waits for all of it, so that step stays short too (held back from realtime steps, below,
     * lower-class prompts pile up and would otherwise take the whole latency budget). */
    if (t_rt < INFINITY) {
        int n = tokens_within(s, t_rt / s->cfg.shape_frac * LOW_STEP_FRAC);
        if (n != INT_MAX) s->cap_low = SF_MIN(s->cap_low, SF_MAX(min_chunk, n - n_decode));
    }
    /* High-urgency prompts in this step (waiting, or a running one not yet prefilled): the step
     * that brings realtime its first token carries no lower-class prompt (their floors are about
     * decode, which is not held back), so it is as short at 8x as at 1x. Lower-class prefill
     * runs in the steps without one; only when it had none for LOW_STARVE_S (a realtime prompt in
     * every step) does it ride, adding at most RT_EXTRA_MS as the model predicts (at least one
     * small chunk), so admitted batch work never stops. */
    if (t_rt < INFINITY && high_prefill_pending(s)) {
        if (s->rt_alone && s->now - s->low_prefill_at < LOW_STARVE_S) {
            s->cap_low = 0;
        } else {
            double b = per_token_ms(s);
            int extra = b > 1e-9 ? (int)SF_MIN(RT_EXTRA_MS / b, 1e9) : 0;
            s->cap_low = SF_MIN(s->cap_low, SF_MAX(min_chunk, extra));
        }
    }
    if (s->cap_tokens < s->budget_left) s->budget_left = s->cap_tokens;
    s->low_budget_left = s->cap_low;
}

int sf_policy_protected(const sf_seq *v)
{
    /* still prefilling: no rate to protect yet */
    return v->min_tps > 0 && v->n_tokens - v->n_computed <= 1;
}

int sf_policy_may_preempt(const sf_sched *s, const sf_seq *victim, const sf_seq *asker)
{
    (void)s;
    if (victim == asker || !sf_policy_protected(victim)) return 1;
    return asker->urgency >= SF_URGENCY_HIGH && asker->deadline < INFINITY;
}

/* ---- admission below high: headroom for the high class, floors that can be held ----------- */

/* The kind of block q holds or will take (scheduler.c's next_kind). */
static int seq_kind(const sf_sched *s, const sf_seq *q)
{
    if (q->n_blocks || q->n_swap) return q->kv_i8_held;
    return q->kv_i8 && s->pool->i8_ok;
}

int sf_policy_full_units(const sf_sched *s, const sf_seq *q, int i8)
{
    int len = SF_MIN(SF_MAX(q->max_len, q->n_tokens), q->n_tokens + SF_KV_AHEAD);
    return sf_kv_blocks_for(s->pool, len) * sf_kv_units(i8);
}

/* Seats the high class may still claim beyond those it holds: its recent peak with a margin. */
static int hi_seat_claim(const sf_sched *s)
{
    int c = (int)ceil(HI_MARGIN * s->hi_seats_peak - 1e-9) - s->n_running_u[SF_URGENCY_HIGH];
    return c > 0 ? c : 0;
}

/* KV units kept for the high class: its recent peak with a margin, at least the static reserve. */
static int hi_keep_units(const sf_sched *s)
{
    return SF_MAX(s->reserve_units, (int)ceil(HI_MARGIN * s->hi_units_peak - 1e-9));
}

int sf_policy_may_admit_low(sf_sched *s, const sf_seq *q, int kind)
{
    /* Without step shaping the plan is the plain one; with nothing running, whatever q gets is
     * the best there is (and the high class's peak decays while it waits). */
    if (!s->cfg.shape || s->n_running == 0) return 1;
    int claim = hi_seat_claim(s), held = 0; /* seats of lower classes are q's to take by preemption */
    for (int u = q->urgency; u < SF_URGENCY_COUNT; u++) held += s->n_running_u[u];
    if (held + 1 + claim > s->cfg.max_num_seqs) {
        s->gate_seats++;
        return 0;
    }
    if (q->min_tps > 0 || (q->urgency == SF_URGENCY_LOW && s->hi_units_peak > 0)) {
        /* admitted once, it must be able to finish without taking what realtime will ask for:
         * a preempted floor misses its rate, and its swap runs inside a realtime step */
        int full = sf_policy_full_units(s, q, kind);
        if (s->low_reserved_units + full > sf_kv_total_units(s->pool) - hi_keep_units(s)) {
            s->gate_kv++;
            if (!s->blocked_units) s->blocked_units = full;
            return 0;
        }
    }
    if (q->min_tps > 0) {
        /* the decode step with the seats the high class may fill, plus a prefill chunk */
        double ms = sf_sched_predict_ms(s, s->n_running + 1 + claim + SF_MAX(1, s->cfg.min_chunk));
        if (ms > 1000.0 / q->min_tps) {
            s->gate_floor++;
            return 0;
        }
    }
    return 1;
}

/* ---- degrade instead of reject ---------------------------------------------------------- */

double sf_sched_kv_usage(const sf_sched *s)
{
    return sf_kv_usage(s->pool); /* in units: an INT8 block is half a full one */
}

double sf_sched_kv_demand(const sf_sched *s)
{
    return s->kv_demand;
}

/* KV demand, the low classes' reservation and the high class's peaks, from the queues. Why
 * demand and not the blocks held: under pressure preemption by swap empties blocks within a
 * fraction of a second (the H200 ladder crossed 92% often but never held it 0.54 s), and the
 * sequences it swapped out still need their memory back to finish; so does the rest of every
 * running sequence's length, and the request at the head of the queue that found no room. The
 * high class counts for what it holds and needs or for the headroom kept for it (its recent peak
 * with a margin, hi_keep_units), whichever is more: that headroom is as closed to lower classes
 * as held blocks (admission refuses them for it), so a pool that admits batch work only by
 * eating into it is a pool under pressure (docs/SCHEDULER.md, "Degrade instead of reject"). */
static void refresh(sf_sched *s)
{
    int total = sf_kv_total_units(s->pool);
    double need = 0, hi_units = 0;
    int low_res = 0, hi_seats = 0, i8 = 0;
    for (sf_seq *q = s->running.next; q != &s->running; q = q->next) {
        /* blocks it shares from another holder's (prefix cache) are that one's memory, counted there */
        int k = seq_kind(s, q), own = q->n_uncounted * sf_kv_units(k), full = sf_policy_full_units(s, q, k) - own;
        int n = SF_MAX(full, q->n_blocks * sf_kv_units(k) - own);
        i8 += q->n_blocks > 0 && q->kv_i8_held;
        if (q->urgency >= SF_URGENCY_HIGH) {
            hi_units += n, hi_seats++;
        } else {
            low_res += full;
            need += n;
        }
    }
    for (sf_seq *q = s->waiting.next; q != &s->waiting; q = q->next) {
        int full = sf_policy_full_units(s, q, seq_kind(s, q));
        if (q->urgency >= SF_URGENCY_HIGH) hi_units += full, hi_seats++;
        else if (q->n_preempted > 0) need += full; /* admitted work waiting to resume */
    }
    if (s->waiting.next == &s->waiting) s->blocked_units = 0;
    need += s->blocked_units;
    s->low_reserved_units = low_res;
    s->n_running_i8 = i8;
    double dt = s->now - s->hi_peak_at;
    if (dt > 0) {
        double f = exp(-dt / HI_MEMORY_S);
        s->hi_seats_peak *= f, s->hi_units_peak *= f;
        s->hi_peak_at = s->now;
    }
    if (hi_seats > s->hi_seats_peak) s->hi_seats_peak = hi_seats;
    if (hi_units > s->hi_units_peak) s->hi_units_peak = hi_units;
    need += SF_MAX(hi_units, (double)hi_keep_units(s));
    s->kv_demand = total ? need / total : 0;
}

static void relax(sf_sched *s, sf_seq *q)
{
    if (q->relaxed || q->urgency != SF_URGENCY_LOW) return;
    q->relaxed = 1;
    q->deadline_orig = q->deadline;
    double d = q->t_submit + s->cfg.relax_ms * 1e-3;
    if (q->deadline < d) q->deadline = d;
    s->decisions[SF_DECISION_RELAX]++;
}

static void for_all(sf_sched *s, void (*fn)(sf_sched *, sf_seq *))
{
    sf_seq *heads[2] = { &s->running, &s->waiting };
    for (int h = 0; h < 2; h++)
        for (sf_seq *q = heads[h]->next; q != heads[h]; q = q->next) fn(s, q);
}

static void unrelax(sf_sched *s, sf_seq *q)
{
    if (!q->relaxed) return;
    q->relaxed = 0;
    q->deadline = q->deadline_orig;
}

void sf_policy_update(sf_sched *s)
{
    refresh(s);
    if (!(s->cfg.degrade_high > 0)) return;
    double u = s->kv_demand;
    int past = s->degraded ? u < s->cfg.degrade_low : u > s->cfg.degrade_high;
    if (!past) { /* a dip of a few steps (a long request finishing, the refused head let in) is bridged */
        if (s->deg_since >= 0 && s->deg_dip_since < 0) s->deg_dip_since = s->now;
        if (s->deg_since >= 0 && s->now - s->deg_dip_since <= DIP_BRIDGE_S) return;
        s->deg_since = s->deg_dip_since = -1;
        return;
    }
    s->deg_dip_since = -1;
    if (s->deg_since < 0) s->deg_since = s->now;
    if (s->now - s->deg_since < s->cfg.degrade_hold_s) return;
    s->deg_since = -1;
    s->degraded = !s->degraded;
    if (s->degraded) {
        for_all(s, relax);
    } else {
        for_all(s, unrelax);
        s->decisions[SF_DECISION_RESTORE]++;
    }
    sf_sched_resort_waiting(s);
}

void sf_sched_tick(sf_sched *s, double now)
{
    s->now = now;
    sf_policy_update(s);
}

void sf_policy_on_add(sf_sched *s, sf_seq *q)
{
    if (s->degraded) relax(s, q);
}

void sf_policy_on_admit(sf_sched *s, sf_seq *q)
{
    if (!s->degraded || q->urgency != SF_URGENCY_LOW || !s->cfg.kv_i8_ok || q->kv_i8) return;
    if (q->n_computed != 0 || q->n_blocks != 0 || q->n_swap != 0) return;
    q->kv_i8 = 1;
    s->decisions[SF_DECISION_KV_INT8]++;
}
