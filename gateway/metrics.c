/* metrics.c — counters, histograms and the Prometheus text rendering. */
#include "metrics.h"

#include <string.h>

#include "intent.h"

/* seconds; the same buckets for TTFT, ITL and E2E so dashboards can share panels */
static const double bounds[SF_HIST_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                0.5, 1, 2.5, 5, 10, 30, 60, 120 };

/* the gateway's own share is tens of microseconds: finer buckets */
static const double fine[SF_HIST_BUCKETS] = { 10e-6, 20e-6, 50e-6, 100e-6, 150e-6, 200e-6, 300e-6, 500e-6,
                                              750e-6, 1e-3, 2e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3 };

static void hist_init(sf_hist *h, const double *b)
{
    memset(h, 0, sizeof *h);
    h->bounds = b;
    pthread_mutex_init(&h->mu, NULL);
}

void sf_metrics_init(sf_metrics *m)
{
    memset(m, 0, sizeof *m);
    hist_init(&m->ttft, bounds);
    hist_init(&m->itl, bounds);
    hist_init(&m->e2e, bounds);
    hist_init(&m->gateway, fine);
    pthread_mutex_init(&m->mu, NULL);
}

void sf_metrics_destroy(sf_metrics *m)
{
    pthread_mutex_destroy(&m->ttft.mu);
    pthread_mutex_destroy(&m->itl.mu);
    pthread_mutex_destroy(&m->e2e.mu);
    pthread_mutex_destroy(&m->gateway.mu);
    pthread_mutex_destroy(&m->mu);
}

void sf_hist_observe(sf_hist *h, double s)
{
    int b = 0;
    while (b < SF_HIST_BUCKETS && s > h->bounds[b]) b++;
    pthread_mutex_lock(&h->mu);
    h->counts[b]++;
    h->n++;
    h->sum += s;
    pthread_mutex_unlock(&h->mu);
}

void sf_metrics_request(sf_metrics *m, const char *tenant, const char *cls, int status)
{
    pthread_mutex_lock(&m->mu);
    int i = 0;
    for (; i < m->n_keys; i++)
        if (m->keys[i].status == status && !strcmp(m->keys[i].cls, cls) && !strcmp(m->keys[i].tenant, tenant))
            break;
    if (i == m->n_keys) {
        if (m->n_keys == SF_METRICS_KEYS) {
            m->overflow++;
            pthread_mutex_unlock(&m->mu);
            return;
        }
        sf_metrics_key *k = &m->keys[m->n_keys++];
        snprintf(k->tenant, sizeof k->tenant, "%s", tenant);
        snprintf(k->cls, sizeof k->cls, "%s", cls);
        k->status = status;
    }
    m->keys[i].count++;
    pthread_mutex_unlock(&m->mu);
}

void sf_metrics_add(sf_metrics *m, uint64_t *counter, uint64_t n)
{
    __atomic_add_fetch(counter, n, __ATOMIC_RELAXED);
}

void sf_metrics_active(sf_metrics *m, int delta)
{
    __atomic_add_fetch(&m->active, delta, __ATOMIC_RELAXED);
}

static void render_hist(FILE *out, const char *name, const char *help, sf_hist *h)
{
    uint64_t counts[SF_HIST_BUCKETS + 1], n;
    double sum;
    pthread_mutex_lock(&h->mu);
    memcpy(counts, h->counts, sizeof counts);
    n = h->n;
    sum = h->sum;
    pthread_mutex_unlock(&h->mu);
    fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int b = 0; b < SF_HIST_BUCKETS; b++) {
        cum += counts[b];
        fprintf(out, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], (unsigned long long)cum);
    }
    fprintf(out, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)n,
            name, sum, name, (unsigned long long)n);
}

static void counter(FILE *out, const char *name, const char *help, uint64_t v)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

static void gauge(FILE *out, const char *name, const char *help, double v)
{
    fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %.6g\n", name, help, name, name, v);
}

void sf_metrics_render(sf_metrics *m, sf_engine *engine, FILE *out)
{
    fprintf(out, "# HELP semflow_requests_total HTTP requests by tenant, intent class and status.\n"
                 "# TYPE semflow_requests_total counter\n");
    pthread_mutex_lock(&m->mu);
    /* tenant names and classes are restricted to [A-Za-z0-9._-], so no label escaping is needed */
    for (int i = 0; i < m->n_keys; i++)
        fprintf(out, "semflow_requests_total{tenant=\"%s\",class=\"%s\",status=\"%d\"} %llu\n", m->keys[i].tenant,
                m->keys[i].cls, m->keys[i].status, (unsigned long long)m->keys[i].count);
    uint64_t overflow = m->overflow;
    pthread_mutex_unlock(&m->mu);
    counter(out, "semflow_requests_unlabeled_total", "Requests not labeled because the label table was full.", overflow);
    render_hist(out, "semflow_time_to_first_token_seconds", "Time from arrival to the first output token.", &m->ttft);
    render_hist(out, "semflow_inter_token_latency_seconds", "Time between consecutive output tokens.", &m->itl);
    render_hist(out, "semflow_e2e_request_latency_seconds", "Time from arrival to the last output token.", &m->e2e);
    render_hist(out, "semflow_gateway_overhead_seconds",
                "Per request, time spent outside the engine: arrival to submit plus last event to response sent.",
                &m->gateway);
    counter(out, "semflow_prompt_tokens_total", "Prompt tokens of admitted requests.",
            __atomic_load_n(&m->prompt_tokens, __ATOMIC_RELAXED));
    counter(out, "semflow_generation_tokens_total", "Output tokens sent.",
            __atomic_load_n(&m->completion_tokens, __ATOMIC_RELAXED));
    fprintf(out, "# HELP semflow_rejected_total Requests answered 429, by reason.\n"
                 "# TYPE semflow_rejected_total counter\n"
                 "semflow_rejected_total{reason=\"tenant_rate\"} %llu\n"
                 "semflow_rejected_total{reason=\"tenant_concurrency\"} %llu\n"
                 "semflow_rejected_total{reason=\"queue_full\"} %llu\n",
            (unsigned long long)__atomic_load_n(&m->rejected_tenant_rate, __ATOMIC_RELAXED),
            (unsigned long long)__atomic_load_n(&m->rejected_tenant_conc, __ATOMIC_RELAXED),
            (unsigned long long)__atomic_load_n(&m->rejected_queue_full, __ATOMIC_RELAXED));
    counter(out, "semflow_client_disconnects_total", "Requests cancelled because the client went away.",
            __atomic_load_n(&m->client_disconnects, __ATOMIC_RELAXED));
    counter(out, "semflow_accept_errors_total",
            "accept() failures (out of file descriptors or memory); each pauses the worker's accepting for 0.1 s.",
            __atomic_load_n(&m->accept_errors, __ATOMIC_RELAXED));
    gauge(out, "semflow_gateway_active_requests", "Requests in flight in the gateway.",
          __atomic_load_n(&m->active, __ATOMIC_RELAXED));
    if (!engine) return;
    sf_engine_stats st;
    memset(&st, 0, sizeof st);
    sf_engine_get_stats(engine, &st);
    fprintf(out, "# HELP semflow_queue_depth Requests waiting in each urgency lane.\n# TYPE semflow_queue_depth gauge\n");
    for (int u = SF_URGENCY_COUNT - 1; u >= 0; u--)
        fprintf(out, "semflow_queue_depth{lane=\"%s\"} %d\n", sf_urgency_name(u), st.waiting[u]);
    gauge(out, "semflow_running_sequences", "Sequences in the running batch.", st.running);
    gauge(out, "semflow_kv_blocks_used", "KV cache blocks in use.", st.kv_blocks_used);
    gauge(out, "semflow_kv_blocks_free", "KV cache blocks free.", st.kv_blocks_total - st.kv_blocks_used);
    gauge(out, "semflow_kv_blocks_total", "KV cache blocks in the pool.", st.kv_blocks_total);
    gauge(out, "semflow_tokens_per_second", "Output tokens per second over the last few seconds.", st.tokens_per_s);
    counter(out, "semflow_engine_steps_total", "Engine scheduler steps.", st.steps);
    counter(out, "semflow_engine_prefill_tokens_total", "Prompt tokens computed by the engine.", st.tokens_prefill);
    counter(out, "semflow_engine_decode_tokens_total", "Tokens decoded by the engine.", st.tokens_decode);
    counter(out, "semflow_preemptions_total", "Sequences preempted for a higher class.", st.preemptions);
    counter(out, "semflow_swaps_out_total", "Preempted sequences whose KV went to host swap.", st.swaps_out);
    counter(out, "semflow_swaps_dropped_total",
            "Swapped-out sequences whose KV never came back (they ended while out, or the copy failed).",
            st.swaps_dropped);
    counter(out, "semflow_engine_finished_total", "Sequences finished.", st.finished);
    counter(out, "semflow_engine_prompt_tokens_scored_total",
            "Prompt positions scored for their logprobs (echo with logprobs, prompt_logprobs, perplexity).",
            st.prompt_tokens_scored);
    counter(out, "semflow_engine_prompt_tokens_scored_backend_total",
            "Of those, scored by the backend (only the results crossed to the host).", st.prompt_tokens_scored_backend);
    counter(out, "semflow_engine_cancelled_total", "Sequences cancelled.", st.cancelled);
    counter(out, "semflow_prefix_cache_queries_total",
            "Prompt tokens of sequences admitted with nothing computed, looked up in the prefix cache.",
            st.prefix_queries);
    counter(out, "semflow_prefix_cache_hits_total", "Of those, found cached (their K/V not computed again).",
            st.prefix_hits);
    counter(out, "semflow_prefix_cache_evictions_total", "Cached KV blocks taken for other K/V.", st.prefix_evictions);
    counter(out, "semflow_spec_decode_steps_total", "Engine steps that carried n-gram draft tokens (speculative decoding).",
            st.spec_steps);
    counter(out, "semflow_spec_decode_num_draft_tokens_total", "Draft tokens computed.", st.spec_draft_tokens);
    counter(out, "semflow_spec_decode_num_accepted_tokens_total", "Draft tokens the draws confirmed (each one a step saved).",
            st.spec_accepted_tokens);
    gauge(out, "semflow_prefix_cache_blocks", "KV blocks in the prefix cache (held by sequences or free).",
          st.prefix_blocks);
    gauge(out, "semflow_prefix_cache_blocks_free",
          "Of those, held by no sequence: free (counted in semflow_kv_blocks_free), kept until taken.",
          st.prefix_evictable);
    fprintf(out, "# HELP semflow_sched_decisions_total Scheduler policy decisions: relax (a low-urgency request's "
                 "targets relaxed under KV pressure), kv_int8 (a new low-urgency sequence given INT8 KV), restore "
                 "(KV pressure over), preempt_swap, preempt_recompute, reject (429 before any work).\n"
                 "# TYPE semflow_sched_decisions_total counter\n");
    for (int i = 0; i < (int)(sizeof st.decisions / sizeof st.decisions[0]); i++)
        fprintf(out, "semflow_sched_decisions_total{decision=\"%s\"} %llu\n", sf_decision_name(i),
                (unsigned long long)st.decisions[i]);
    gauge(out, "semflow_sched_degraded", "1 while the scheduler degrades low-urgency work instead of rejecting it.",
          st.degraded);
    gauge(out, "semflow_kv_usage_ratio", "Share of the KV cache held now.", st.kv_usage);
    gauge(out, "semflow_kv_demand_ratio",
          "KV the admitted work holds or needs to finish (running sequences to their length, preempted ones "
          "waiting to resume, the first request refused for lack of KV), over the cache: what the degrade policy "
          "watches; may pass 1.", st.kv_demand);
    gauge(out, "semflow_running_kv_int8", "Running sequences whose KV cache is INT8 (the degrade path).",
          st.running_kv_i8);
    gauge(out, "semflow_engine_step_seconds", "Moving average of the engine step time (steps that decode).",
          st.step_ms * 1e-3);
}
