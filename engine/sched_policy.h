/* sched_policy.h — the scheduler's policy pieces that look at time and targets: the step-time
 * model, step shaping by latency budget and throughput floor, floor protection from preemption,
 * and the degrade state machine. Internal to the scheduler (scheduler.c calls these); engine
 * thread only. */
#ifndef SF_SCHED_POLICY_H
#define SF_SCHED_POLICY_H

#include "scheduler.h"

/* Tokens past its current length that a sequence is counted to need at most (its max length when
 * nearer): what admission reserves and KV demand counts for a request without max_tokens. */
#define SF_KV_AHEAD 512

/* Start of a plan at s->now: follow KV usage into or out of the degraded state. */
void sf_policy_update(sf_sched *s);
/* After the decode part of the plan (n_decode tokens planned): cap the prefill of this step so
 * it stays within the tightest latency budget (s->budget_left) and, for classes below high,
 * within the throughput floor of sequences that decode (s->low_budget_left). */
void sf_policy_caps(sf_sched *s, int n_decode);
/* 1 when asker may take victim's place. A sequence with a min-throughput floor that decodes is
 * preempted only for a high-urgency sequence with a deadline (or by itself). */
int sf_policy_may_preempt(const sf_sched *s, const sf_seq *victim, const sf_seq *asker);
/* 1 when v is a throughput floor that decodes: a victim search takes it only when nothing else
 * will do. */
int sf_policy_protected(const sf_seq *v);
/* May q (below high urgency, waiting) take a seat now? No when it would take a seat or KV the
 * high class has needed lately (its decaying peak, with a margin), when its full length does not
 * fit in what the high class leaves (sequences with a floor, and low urgency), or when the
 * step-time model says its floor cannot be held with the seats the high class may fill. Counts
 * the refusal by reason; a refusal for KV records q's need in s->blocked_units. */
int sf_policy_may_admit_low(sf_sched *s, const sf_seq *q, int kind);
/* KV units q needs to finish (its max length, at most SF_KV_AHEAD tokens past what it has), in
 * blocks of the given kind. */
int sf_policy_full_units(const sf_sched *s, const sf_seq *q, int i8);
/* A sequence enters the waiting queue for the first time: relaxed when degraded and low. */
void sf_policy_on_add(sf_sched *s, sf_seq *q);
/* A sequence is admitted with nothing computed yet: INT8 KV when degraded and low. */
void sf_policy_on_admit(sf_sched *s, sf_seq *q);
/* Put the waiting list back in order after deadlines changed. */
void sf_sched_resort_waiting(sf_sched *s);

#endif
