/* sched_bench.c — host time the scheduler adds to one engine step: plan + batch + commit, with
 * no model, for N running sequences decoding (the steady state) and with prefill admission
 * (the churn), with the policy on (step shaping with realtime targets and batch floors, the
 * degrade watch). `make bench-sched`, then build/bench/sched_bench [N ...]. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "engine/scheduler.h"

static void run(int n_seqs)
{
    sf_kv_pool pool;
    sf_sched s;
    sf_error err = { 0 };
    if (sf_kv_pool_init(&pool, 1 << 20, 16, &err) != SF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    sf_sched_config c = { .max_num_seqs = n_seqs, .max_batched_tokens = SF_MAX(2048, n_seqs),
                          .max_model_len = 8192, .kv_high_reserve = 0.1f, .shape = 1, .shape_frac = 0.25f,
                          .min_chunk = 32, .degrade_high = 0.92f, .degrade_low = 0.8f, .degrade_hold_s = 5,
                          .relax_ms = 2000 };
    if (sf_sched_init(&s, &c, &pool, &err) != SF_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    sf_seq *q = calloc((size_t)n_seqs, sizeof *q);
    int32_t *prompt = calloc(1024, sizeof *prompt);
    for (int i = 0; i < n_seqs; i++) {
        sf_seq_init(&q[i], prompt, 128 + (i * 37) % 896, &err);
        q[i].urgency = i % SF_URGENCY_COUNT;
        /* the policy's inputs: realtime targets and batch floors, as in the overload scenario */
        if (q[i].urgency == SF_URGENCY_HIGH) q[i].max_latency_ms = 400;
        if (q[i].urgency == SF_URGENCY_LOW) q[i].min_tps = 50;
        sf_sched_add(&s, &q[i]);
    }
    double t_dec = 0, t_pre = 0;
    int n_dec = 0, n_pre = 0;
    for (int step = 0; step < 4000; step++) {
        double t0 = sf_now_s();
        const sf_plan *p = sf_sched_plan(&s);
        sf_batch b;
        sf_sched_batch(&s, &b);
        sf_sched_commit(&s);
        for (int i = 0; i < p->n_items; i++)
            if (p->items[i].seq && p->items[i].logits) sf_seq_append(p->items[i].seq, 7);
        double dt = sf_now_s() - t0;
        sf_sched_observe(&s, p->n_tokens, p->n_decode, 5.0 + 0.03 * p->n_tokens); /* an H200-like step */
        if (p->n_prefill) t_pre += dt, n_pre++;
        else t_dec += dt, n_dec++;
    }
    printf("%4d sequences: decode-only step %7.1f us (%d steps), step with prefill %7.1f us (%d steps)\n", n_seqs,
           n_dec ? t_dec / n_dec * 1e6 : 0.0, n_dec, n_pre ? t_pre / n_pre * 1e6 : 0.0, n_pre);
    for (int i = 0; i < n_seqs; i++) {
        sf_sched_remove(&s, &q[i]);
        sf_seq_free(&q[i]);
    }
    free(q);
    free(prompt);
    sf_sched_free(&s);
    sf_kv_pool_free(&pool);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        int sizes[] = { 1, 16, 64, 256 };
        for (size_t i = 0; i < SF_ARRAY_LEN(sizes); i++) run(sizes[i]);
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        int n = atoi(argv[i]);
        if (n < 1 || n > 65536) {
            fprintf(stderr, "sched_bench: '%s' is not a sequence count in [1, 65536]\n", argv[i]);
            return 2;
        }
        run(n);
    }
    return 0;
}
