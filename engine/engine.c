/* engine.c — the engine: model + backend + paged KV cache + one engine thread that runs the
 * scheduler, the forward pass and the sampler, and delivers events by callback.
 *
 * Threads: sf_engine_submit / cancel / drain / get_stats / get_info / tokenizer may be called
 * from any thread. They share with the engine thread only the inbox, the flags and the stats
 * snapshot, all under e->mu. Everything else (scheduler, KV pool, backend, requests after
 * submit) is touched by the engine thread alone. */
#include "engine-impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"
#include "tokenizer.h"

#define CPU_KV_CAP_BYTES (4ull << 30) /* the CPU backend's KV pool at most (host RAM is shared) */
#define RATE_WINDOW_S 2.0             /* throughput is measured over windows this long */

void sf_sampling_default(sf_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f;
    s->top_p = 1.0f;
    s->top_k = 0;
    s->min_p = 0.0f;
    s->repetition_penalty = 1.0f;
    s->max_tokens = 0;
}

void sf_engine_config_default(sf_engine_config *c)
{
    memset(c, 0, sizeof *c);
    c->model = "demo";
    c->backend = "auto";
    c->max_num_seqs = 64;
    c->max_batched_tokens = 2048;
    c->kv_block_size = 16;
    c->gpu_memory_utilization = 0.9f;
    c->kv_high_reserve = 0.1f;
    c->swap_space_gib = 1.0;
    c->step_shaping = 1;
    c->kv_degrade_high = 0.92f;
    c->kv_degrade_low = 0.80f;
    c->kv_degrade_hold_s = 5.0;
    c->relax_latency_ms = 2000;
    c->dma_tuner = 1;
    c->async_steps = 1; /* H200, 2026-12-01: +0.6-1.0% output tokens/s at 128/128, 1000/1000 and batch 1 */
    c->prefix_caching = 1;
    c->spec_ngram_min = 2;
    c->spec_ngram_max = 4;
    c->spec_max_batch = 8;
    for (int i = 0; i < SF_URGENCY_COUNT; i++) c->queue_limit[i] = 256;
}

/* ---- sizing ----------------------------------------------------------------------------- */

/* Activation bytes a step of T tokens and S logit rows may need (fp32, generous). */
static size_t activation_bytes(const sf_model_config *m, int T, int S)
{
    size_t qkv = (size_t)(m->n_heads + 2 * m->n_kv_heads) * (size_t)m->head_dim;
    size_t per_tok = 4 * (size_t)m->hidden + qkv + (size_t)m->n_heads * m->head_dim + 3 * (size_t)m->intermediate;
    return ((size_t)T * per_tok + (size_t)S * (size_t)m->vocab_size + (size_t)S * m->hidden) * 4;
}

/* Number of KV blocks: the configured number, or what memory allows. */
static int size_kv_pool(sf_engine *e, sf_kv_config *kc, sf_error *err)
{
    const sf_engine_config *c = &e->cfg;
    const sf_hw_info *hw = e->be->ops->hw(e->be);
    size_t bb = e->be->ops->kv_block_bytes(e->be, kc);
    if (bb == 0) return sf_err(err, SF_ERROR, "backend %s reports 0 bytes per KV block", e->be->ops->name);
    if (c->num_kv_blocks > 0) return c->num_kv_blocks;

    double util = c->gpu_memory_utilization;
    size_t weights = sf_model_weight_bytes(e->model, e->be->ops->name, 0); /* as the backend holds them */
    size_t act = activation_bytes(&e->model->cfg, c->max_batched_tokens, c->max_logits);
    double budget;
    int is_cpu = !strcmp(hw->backend, "cpu");
    if (is_cpu) {
        /* Host RAM: the weights are memory-mapped (page cache), so count them once, and never
         * take more than a few GiB or what max_num_seqs full contexts would use. */
        budget = (double)hw->mem_free * util * 0.5 - (double)act;
        if (budget > (double)CPU_KV_CAP_BYTES) budget = (double)CPU_KV_CAP_BYTES;
    } else {
        /* Device memory: what the probe found free, less the share left to others, the weights,
         * the activations and a margin for workspaces and graphs. */
        double keep = (double)hw->mem_total * (1.0 - util);
        budget = (double)hw->mem_free - keep - (double)weights - (double)act - 512.0 * 1024 * 1024;
    }
    long want = (long)c->max_num_seqs * ((e->max_model_len + c->kv_block_size - 1) / c->kv_block_size);
    want = (long)((double)want / (1.0 - c->kv_high_reserve)) + 1;
    long n = budget > 0 ? (long)(budget / (double)bb) : 0;
    if (is_cpu && n > want) n = want;
    if (n > 1 << 24) n = 1 << 24;
    if (n < 2)
        return sf_err(err, SF_ENOMEM,
                      "no memory left for the KV cache: %s has %.1f GiB free, the weights take %.2f GiB and "
                      "activations %.2f GiB; lower --max-batched-tokens / --max-num-seqs / --max-logit-rows, raise "
                      "--gpu-memory-utilization, or set --num-kv-blocks",
                      hw->backend, (double)hw->mem_free / (1 << 30), (double)weights / (1 << 30),
                      (double)act / (1 << 30));
    return (int)n;
}

/* ---- the engine thread ------------------------------------------------------------------ */

static void cancel_if_asked(sf_seq *q, void *arg)
{
    sf_engine *e = arg;
    sf_request *r = q->owner;
    if (atomic_load(&r->cancel) || atomic_load(&e->cancel_all)) sf_engine_finish_free(e, r, SF_FINISH_CANCELLED, SF_OK, NULL);
}

/* The DMA tuner's view of the link (engine thread). */
static double link_contention(void *arg)
{
    sf_engine *e = arg;
    return e->cfg.pcie_contention(e->cfg.pcie_contention_arg, e->cfg.device);
}

/* The swap space's peers under tensor parallelism (swap.h sf_swap_opts.peers). */
static int tp_kv_copy(void *arg, const int32_t *blocks, const int32_t *slots, int n, int d2h, sf_error *err)
{
    return sf_tp_kv_copy(arg, blocks, slots, n, d2h, err);
}

/* The scheduler's gate for swap-ins: is a class above `urgency` running (the running list is in
 * urgency order) or waiting? */
static int swap_in_ok(void *arg, int urgency)
{
    sf_engine *e = arg;
    const sf_sched *s = &e->sched;
    int higher = s->running.next != &s->running && s->running.next->urgency > urgency;
    for (int u = urgency + 1; u < SF_URGENCY_COUNT; u++) higher |= s->n_waiting[u] > 0;
    return sf_swap_in_ok(&e->swap, urgency, higher);
}

void sf_engine_reset_prefix_cache(sf_engine *e)
{
    atomic_store(&e->reset_prefix, 1);
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

/* Under e->mu: refresh the stats snapshot from the scheduler. */
static void update_stats(sf_engine *e)
{
    sf_sched *s = &e->sched;
    e->st.running = s->n_running;
    for (int i = 0; i < SF_URGENCY_COUNT; i++) e->st.waiting[i] = s->n_waiting[i] + e->in_count[i];
    e->st.kv_blocks_total = e->pool.n_blocks;
    /* in full-block equivalents: an INT8 block is half a block (kvcache.h) */
    e->st.kv_blocks_used = (sf_kv_total_units(&e->pool) - e->pool.n_free_units + 1) / 2;
    e->st.steps = s->steps;
    e->st.tokens_prefill = s->tokens_prefill;
    e->st.tokens_decode = s->tokens_decode;
    e->st.preemptions = s->preemptions;
    e->st.swaps_out = s->swaps_out;
    e->st.swaps_in = s->swaps_in;
    e->st.swap_fallbacks = s->swap_fallbacks;
    e->st.swaps_dropped = s->swaps_dropped;
    e->st.swap_blocks_total = s->swap.n_blocks;
    e->st.swap_blocks_used = s->swap.n_blocks - s->swap.n_free;
    e->st.prefix_queries = s->prefix_queries;
    e->st.prefix_hits = s->prefix_hits;
    e->st.prefix_evictions = e->pool.pc_evictions;
    e->st.prefix_blocks = e->pool.n_registered;
    e->st.prefix_evictable = e->pool.n_evictable;
    e->st.prefix_caching = s->cfg.prefix_cache;
    e->st.spec_steps = e->spec_steps;
    e->st.spec_draft_tokens = e->spec_drafted;
    e->st.spec_accepted_tokens = e->spec_accepted;
    for (int i = 0; i < SF_DECISION_COUNT; i++) e->st.decisions[i] = s->decisions[i];
    e->st.degraded = s->degraded;
    e->st.kv_usage = sf_sched_kv_usage(s);
    e->st.kv_demand = sf_sched_kv_demand(s);
    e->st.running_kv_i8 = s->n_running_i8;
    e->st.step_ms = s->step_ms_avg;
    e->st.cap_tokens = s->cap_tokens == INT_MAX ? -1 : s->cap_tokens;
    e->st.cap_low = s->cap_low == INT_MAX ? -1 : s->cap_low;
    if (e->swap.dma) {
        sf_dma_stats ds;
        sf_dma_get_stats(e->swap.dma, &ds);
        for (int u = 0; u < SF_URGENCY_COUNT; u++) e->st.dma_bytes[u] = ds.bytes[u][0] + ds.bytes[u][1];
        e->st.dma_deferred = ds.deferred;
        e->st.pcie_contention = sf_dma_contention(e->swap.dma);
    }
    e->st.step_s = e->step_s;
    e->st.host_s = e->host_s;
    e->st.decode_steps = e->decode_steps;
    e->st.decode_step_s = e->decode_step_s;
    e->st.decode_host_s = e->decode_host_s;
    e->st.decode_enqueue_s = e->decode_enqueue_s;
    e->st.decode_step_tokens = e->decode_tokens;
    e->st.decode_wait_s = e->dclk.wait;
    e->st.decode_take_s = e->dclk.take;
    e->st.decode_plan_s = e->dclk.plan;
    e->st.decode_batch_s = e->dclk.batch;
    e->st.decode_launch_s = e->dclk.launch;
    e->st.decode_send_s = e->dclk.send;
    e->st.decode_deliver_s = e->dclk.deliver;
    e->st.decode_exposed_s = e->dclk.exposed;
    e->st.decode_masks_s = e->dclk.masks;
    sf_engine_step_percentiles(e, 0, &e->st.decode_step_p50_ms, &e->st.decode_step_p90_ms);
    sf_engine_step_percentiles(e, 1, &e->st.decode_gap_p50_ms, &e->st.decode_gap_p90_ms);
    e->st.overlapped = !e->serial;
    e->st.async = e->async;
    e->st.async_steps = e->n_async;
    e->st.async_form_steps = e->n_async_forms;
    e->st.mask_threads = e->mask_pool ? e->mask_threads : 1;
    sf_backend_stats bs;
    if (sf_backend_cuda_stats(e->be, &bs) == SF_OK) {
        e->st.graphs_captured = bs.graphs_captured;
        e->st.graph_replays = bs.graph_replays;
        e->st.graph_fallbacks = bs.graph_fallbacks;
        e->st.dev_idle_s = bs.idle_after_draw_us * 1e-6;
        e->st.dev_idle_n = bs.idle_after_draw_n;
    }
    e->st.rows_sampled_backend = e->rows_dev;
    e->st.rows_sampled_host = e->rows_host;
    e->st.prompt_tokens_scored = e->rows_scored;
    e->st.prompt_tokens_scored_backend = e->rows_scored_dev;
    e->win_tokens += e->n_tokens_out - e->st_tokens_seen;
    e->win_finished += e->n_finished - e->st.finished;
    e->st_tokens_seen = e->n_tokens_out;
    e->st.finished = e->n_finished;
    e->st.cancelled = e->n_cancelled;
    double now = sf_now_s(), dt = now - e->win_start;
    if (dt >= RATE_WINDOW_S) {
        e->st.tokens_per_s = (double)e->win_tokens / dt;
        e->req_per_s = (double)e->win_finished / dt;
        e->win_start = now;
        e->win_tokens = e->win_finished = 0;
    }
}

static int engine_has_work(sf_engine *e)
{
    return e->in_head || e->sched.n_running || sf_sched_waiting_total(&e->sched) || sf_engine_in_flight(e);
}

static void *engine_main(void *arg)
{
    sf_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->stop && !engine_has_work(e)) {
            e->busy = 0;
            if (atomic_exchange(&e->reset_prefix, 0)) sf_kv_prefix_reset(&e->pool); /* the engine thread's pool */
            update_stats(e);
            pthread_cond_broadcast(&e->idle);
            if (!e->sched.degraded) {
                pthread_cond_wait(&e->wake, &e->mu);
                continue;
            }
            /* degraded with nothing to do: the KV is free, so wake to let the state end */
            double hold = SF_MAX(e->cfg.kv_degrade_hold_s / 4, 0.01), until;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + hold;
            ts.tv_sec = (time_t)until;
            ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
            pthread_cond_timedwait(&e->wake, &e->mu, &ts);
            sf_sched_tick(&e->sched, sf_now_s()); /* sched is the engine thread's; the lock is only held longer */
        }
        if (e->stop) break;
        e->busy = 1;
        sf_request *in = e->in_head;
        e->in_head = e->in_tail = NULL;
        for (int i = 0; i < SF_URGENCY_COUNT; i++) e->in_count[i] = 0;
        pthread_mutex_unlock(&e->mu);

        /* Requests and their callbacks run without the lock, so a callback may submit or cancel. */
        while (in) {
            sf_request *next = in->next_in;
            sf_sched_add(&e->sched, &in->seq);
            in = next;
        }
        /* cancels: a walk over every sequence, so only in turns after a cancel or a drain's timeout */
        unsigned nc = atomic_load(&e->cancels);
        if (nc != e->cancels_seen || atomic_load(&e->cancel_all)) {
            e->cancels_seen = nc;
            sf_sched_foreach(&e->sched, cancel_if_asked, e);
        }
        if (atomic_exchange(&e->reset_prefix, 0)) sf_kv_prefix_reset(&e->pool);
        int ran = sf_engine_turn(e);

        pthread_mutex_lock(&e->mu);
        update_stats(e);
        if (!ran && !e->in_head && !e->stop) {
            /* Work is queued but none could be planned (the DMA tuner holds a low-class swap-in
             * back on a contended link). Do not spin: wait for a submit or cancel, 1 ms at most. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 1000000;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->wake, &e->mu, &ts);
        }
    }
    e->busy = 0;
    sf_request *in = e->in_head; /* submit refuses new work once stop is set */
    e->in_head = e->in_tail = NULL;
    pthread_mutex_unlock(&e->mu);

    /* Stopping: everything still queued or running is cancelled (after the step in flight). */
    sf_engine_settle(e);
    while (in) {
        sf_request *next = in->next_in;
        sf_sched_add(&e->sched, &in->seq);
        in = next;
    }
    atomic_store(&e->cancel_all, 1);
    sf_sched_foreach(&e->sched, cancel_if_asked, e);
    pthread_mutex_lock(&e->mu);
    update_stats(e);
    pthread_cond_broadcast(&e->idle);
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- public API ------------------------------------------------------------------------- */

int sf_engine_new(const sf_engine_config *cin, sf_engine **out, sf_error *err)
{
    sf_engine *e = NULL;
    int rc;
    *out = NULL;
    e = calloc(1, sizeof *e);
    if (!e) return sf_err(err, SF_ENOMEM, "engine: out of memory");
    e->cfg = *cin;
    sf_engine_config *c = &e->cfg;
    e->serial = c->serial_steps || !sf_env_bool("SEMFLOW_ENGINE_OVERLAP", 1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->jv_mu, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->idle, NULL);

    if (c->max_num_seqs <= 0 || c->max_batched_tokens <= 0 || c->kv_block_size <= 0 || c->max_model_len < 0 ||
        c->num_kv_blocks < 0) {
        rc = sf_err(err, SF_EINVAL,
                    "engine: max_num_seqs (%d), max_batched_tokens (%d) and kv_block_size (%d) must be positive, "
                    "max_model_len (%d) and num_kv_blocks (%d) not negative",
                    c->max_num_seqs, c->max_batched_tokens, c->kv_block_size, c->max_model_len, c->num_kv_blocks);
        goto fail;
    }
    if (c->max_logits < 0 || c->max_logits > (1 << 20)) {
        rc = sf_err(err, SF_EINVAL, "engine: max_logits %d must be from 0 (max_num_seqs) to %d", c->max_logits, 1 << 20);
        goto fail;
    }
    if (c->spec_tokens < 0 || c->spec_tokens > SF_SPEC_MAX_TOKENS ||
        (c->spec_tokens && !(c->spec_ngram_min >= 1 && c->spec_ngram_min <= c->spec_ngram_max &&
                             c->spec_ngram_max <= 16 && c->spec_max_batch >= 1))) {
        rc = sf_err(err, SF_EINVAL, "engine: speculative decoding: %d tokens (0 to %d), n-grams of %d to %d tokens "
                    "(1 <= min <= max <= 16), at most %d sequences (>= 1)", c->spec_tokens, SF_SPEC_MAX_TOKENS,
                    c->spec_ngram_min, c->spec_ngram_max, c->spec_max_batch);
        goto fail;
    }
    if (c->max_logits < c->max_num_seqs) c->max_logits = c->max_num_seqs; /* every seat's next-token row */
    if (c->spec_tokens) /* a drafted sequence's rows: one per draft and the next-token row */
        c->max_logits = SF_MAX(c->max_logits, SF_MIN(c->max_num_seqs, c->spec_max_batch) * (c->spec_tokens + 1));
    if (c->max_logits > c->max_batched_tokens) c->max_logits = SF_MAX(c->max_batched_tokens, c->max_num_seqs);
    if (!(c->gpu_memory_utilization > 0 && c->gpu_memory_utilization <= 1)) {
        rc = sf_err(err, SF_EINVAL, "engine: gpu_memory_utilization %g must be in (0, 1]",
                    (double)c->gpu_memory_utilization);
        goto fail;
    }
    for (int i = 0; i < SF_URGENCY_COUNT; i++) {
        if (c->queue_limit[i] <= 0) {
            rc = sf_err(err, SF_EINVAL, "engine: queue limit of lane %d is %d; it must be positive", i,
                        c->queue_limit[i]);
            goto fail;
        }
    }

    sf_load_opts lo = { .dummy = c->load_dummy, .seed = 0, .progress = c->progress,
                        .shard_rank = 0, .shard_size = c->tensor_parallel }; /* dummy: fill rank 0's share */
    if ((rc = sf_model_load(c->model ? c->model : "demo", &lo, &e->model, err)) != SF_OK) goto fail;
    const sf_model_config *mc = &e->model->cfg;
    e->vocab = mc->vocab_size;
    e->max_model_len = mc->max_pos;
    if (mc->sliding_window > 0 && mc->sliding_window < e->max_model_len) e->max_model_len = mc->sliding_window;
    if (c->max_model_len > 0) {
        if (c->max_model_len > e->max_model_len)
            SF_LOGW("max_model_len %d is more than the model's context %d; using %d", c->max_model_len,
                    e->max_model_len, e->max_model_len);
        else
            e->max_model_len = c->max_model_len;
    }
    if (c->max_batched_tokens < c->max_num_seqs) {
        rc = sf_err(err, SF_EINVAL,
                    "max_batched_tokens (%d) is smaller than max_num_seqs (%d): every running sequence needs "
                    "one token per step; raise --max-batched-tokens or lower --max-num-seqs",
                    c->max_batched_tokens, c->max_num_seqs);
        goto fail;
    }

    sf_backend_opts bo = { .name = c->backend ? c->backend : "auto", .n_threads = c->n_threads, .device = c->device };
    if ((rc = sf_backend_open(&bo, &e->be, err)) != SF_OK) goto fail;
    if (c->tensor_parallel > 1) {
        sf_tp_rank_opts to = { .rank = 0, .size = c->tensor_parallel, .model = c->model ? c->model : "demo",
                               .load_dummy = c->load_dummy, .backend = e->be->ops->name, .n_threads = c->n_threads,
                               .device = c->device, .max_tokens = c->max_batched_tokens,
                               .max_logits = c->max_logits, .shm_fd = -1 };
        if ((rc = sf_tp_start(&to, NULL, e->model, e->be, &e->tp, err)) != SF_OK) goto fail;
        e->fwd = sf_tp_forward(e->tp);
    } else if ((rc = sf_forward_new(e->be, e->model, c->max_batched_tokens, c->max_logits, &e->fwd, err)) != SF_OK)
        goto fail;

    sf_kv_config kc = { .n_layers = mc->n_layers, .n_blocks = 0, .block_size = c->kv_block_size,
                        .n_kv_heads = e->tp ? sf_tp_kv_heads(e->tp) : mc->n_kv_heads, .head_dim = mc->head_dim,
                        .dtype = strcmp(e->be->ops->name, "cpu") ? SF_DT_BF16 : SF_DT_F32,
                        .group = mc->n_heads / mc->n_kv_heads,
                        /* INT8 blocks for sequences set to kv_i8 (the degrade path); tensor-parallel
                         * followers set up their caches without them, so it stays off there */
                        .int8 = !e->tp };
    int n_blocks = size_kv_pool(e, &kc, err);
    if (n_blocks < 0) {
        rc = n_blocks;
        goto fail;
    }
    /* A sequence below high urgency may hold (1 - reserve) of the pool: the context must fit. */
    int usable = n_blocks - (int)((double)n_blocks * c->kv_high_reserve);
    if ((long)usable * c->kv_block_size < e->max_model_len) {
        int len = usable * c->kv_block_size;
        if (len < 2) {
            rc = sf_err(err, SF_ENOMEM, "KV cache of %d blocks x %d tokens holds no sequence; raise --num-kv-blocks",
                        n_blocks, c->kv_block_size);
            goto fail;
        }
        SF_LOGW("the KV cache (%d blocks of %d tokens) holds %d tokens per sequence: max_model_len lowered from "
                "%d to %d", n_blocks, c->kv_block_size, len, e->max_model_len, len);
        e->max_model_len = len;
    }
    kc.n_blocks = n_blocks;
    if ((rc = e->tp ? sf_tp_kv_init(e->tp, &kc, err) : e->be->ops->kv_init(e->be, &kc, err)) != SF_OK) goto fail;
    if ((rc = sf_kv_pool_init(&e->pool, n_blocks, c->kv_block_size, err)) != SF_OK) goto fail;
    if (kc.int8) sf_kv_pool_enable_i8(&e->pool);
    e->pool_ready = 1;
    /* Swap space: under tensor parallelism each rank holds its share of every block, in a swap
     * space of its own with rank 0's slots (sized from rank 0's share), and copies it when rank 0
     * does (swap.h). */
    sf_swap_opts so = { .untuned = !c->dma_tuner, .contention = c->pcie_contention ? link_contention : NULL,
                        .contention_arg = e, .peers = e->tp ? tp_kv_copy : NULL, .peers_arg = e->tp };
    if ((rc = sf_swap_init_opts(&e->swap, e->be, e->be->ops->kv_block_bytes(e->be, &kc), c->swap_space_gib, &so,
                                err)) != SF_OK ||
        (e->tp && e->swap.n_slots && (rc = sf_tp_swap_init(e->tp, e->swap.n_slots, err)) != SF_OK))
        goto fail;
    sf_sched_config sc = { .max_num_seqs = c->max_num_seqs, .max_batched_tokens = c->max_batched_tokens,
                           .max_logits = c->max_logits,
                           .max_model_len = e->max_model_len, .kv_high_reserve = c->kv_high_reserve,
                           .swap_blocks = e->swap.n_slots, .swap_in_ok = e->swap.n_slots ? swap_in_ok : NULL,
                           .swap_in_ok_arg = e, .shape = c->step_shaping, .shape_frac = 0.25f,
                           .min_chunk = 32, .degrade_high = c->kv_degrade_high, .degrade_low = c->kv_degrade_low,
                           .degrade_hold_s = c->kv_degrade_hold_s, .relax_ms = c->relax_latency_ms,
                           .kv_i8_ok = kc.int8, .table_quantum = TABLE_STRIDE_QUANTUM,
                           .prefix_cache = c->prefix_caching };
    if ((rc = sf_sched_init(&e->sched, &sc, &e->pool, err)) != SF_OK) goto fail;
    e->sched_ready = 1;
    e->logits = malloc((size_t)c->max_logits * (size_t)e->vocab * sizeof *e->logits);
    e->rows = malloc((size_t)c->max_logits * sizeof *e->rows);
    e->ids = malloc(2 * (size_t)c->max_logits * sizeof *e->ids);
    e->row_seq = malloc(2 * (size_t)c->max_logits * sizeof *e->row_seq);
    e->row_score = malloc(2 * (size_t)c->max_logits * sizeof *e->row_score);
    e->mask_row = malloc((size_t)c->max_logits * sizeof *e->mask_row);
    e->row_nofit = calloc(2 * (size_t)c->max_logits, sizeof *e->row_nofit);
    e->lp = malloc(2 * (size_t)c->max_logits * sizeof *e->lp);
    e->sc_target = malloc((size_t)c->max_logits * sizeof *e->sc_target);
    e->sc_rank = malloc((size_t)c->max_logits * sizeof *e->sc_rank);
    e->sc_lp = malloc((size_t)c->max_logits * sizeof *e->sc_lp);
    e->sc_tid = malloc((size_t)c->max_logits * SF_MAX_LOGPROBS * sizeof *e->sc_tid);
    e->sc_tlp = malloc((size_t)c->max_logits * SF_MAX_LOGPROBS * sizeof *e->sc_tlp);
    /* the backend scores prompt positions unless $SEMFLOW_ENGINE_HOST_SCORE=1 (a comparison) */
    e->dev_score = sf_forward_can_score(e->fwd) && !sf_env_bool("SEMFLOW_ENGINE_HOST_SCORE", 0);
    e->src_row = malloc((size_t)c->max_batched_tokens * sizeof *e->src_row);
    {
        /* the forms' mask threads: half the online cores, at most 8, unless asked */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN), def = c->mask_threads > 0 ? c->mask_threads : SF_MIN(8, ncpu / 2);
        e->mask_threads = (int)sf_env_long("SEMFLOW_MASK_THREADS", SF_MAX(1, def), 1, 64);
    }
    e->victims = malloc(2 * (size_t)c->max_num_seqs * sizeof *e->victims);
    e->taken = malloc((size_t)c->max_logits * sizeof *e->taken); /* a row yields at most one token */
    e->spec_seqs = malloc((size_t)c->max_num_seqs * sizeof *e->spec_seqs);
    e->step_hist = calloc(2 * SF_STEP_HIST, sizeof *e->step_hist);
    if (!e->logits || !e->rows || !e->ids || !e->row_seq || !e->row_score || !e->mask_row || !e->row_nofit ||
        !e->lp || !e->sc_target || !e->sc_rank ||
        !e->sc_lp || !e->sc_tid || !e->sc_tlp || !e->src_row || !e->victims || !e->taken || !e->spec_seqs ||
        !e->step_hist) {
        rc = sf_err(err, SF_ENOMEM, "engine: out of memory for %d x %d logits", c->max_logits, e->vocab);
        goto fail;
    }
    {
        /* $SEMFLOW_ENGINE_WARMUP: 0 off, 1 on any backend; unset: where choices are made on first
         * use (CUDA) */
        sf_backend_stats bs;
        int warm = sf_env_bool("SEMFLOW_ENGINE_WARMUP", -1);
        if (warm < 0) warm = sf_backend_cuda_stats(e->be, &bs) == SF_OK;
        if (warm && (rc = sf_engine_warm_up(e, n_blocks, err)) != SF_OK) goto fail;
    }
    /* Async scheduling: sampling on the device, a backend that keeps its draws queued, the
     * overlapped loop; under tensor parallelism every rank draws (engine/tp.c). */
    const int asked = sf_env_bool("SEMFLOW_ENGINE_ASYNC", -1); /* -1: unset (or malformed: warned) */
    e->async = (asked >= 0 ? asked : c->async_steps != 0) && !e->serial;
    if (e->async && (!e->be->ops->sample_defer || !e->be->ops->sample_take || c->host_sampling ||
                     !sf_forward_can_sample(e->fwd))) {
        /* a warning only when asked for by name; on by default it quietly falls back */
        sf_log(asked == 1 ? SF_LOG_WARN : SF_LOG_DEBUG,
               "engine: async scheduling is off: it needs sampling on the device and a backend that queues its "
               "draws (the %s backend %s)", e->be->ops->name, e->be->ops->sample_take ? "does" : "does not");
        e->async = 0;
    }
    if (e->async && (rc = e->tp ? sf_tp_defer(e->tp, 1, err) : sf_forward_defer(e->fwd, 1, err)) != SF_OK) {
        sf_err_wrap(err, "engine: async scheduling (run with SEMFLOW_ENGINE_ASYNC=0)");
        goto fail;
    }
    SF_LOGD("engine: %s on %s, context %d, KV %d blocks x %d tokens (%.1f MiB)", e->model->name, e->be->ops->name,
            e->max_model_len, n_blocks, c->kv_block_size,
            (double)e->be->ops->kv_block_bytes(e->be, &kc) * n_blocks / (1 << 20));
    e->st.kv_blocks_total = n_blocks;
    e->win_start = e->t_start = sf_now_s();
    if (c->sched_trace && c->sched_trace[0]) {
        if (!(e->trace = fopen(c->sched_trace, "w"))) {
            rc = sf_err(err, SF_EIO, "cannot open the scheduler trace %s: %s; give a writable path", c->sched_trace,
                        strerror(errno));
            goto fail;
        }
        fprintf(e->trace, "t_s\tstep_ms\tdecode\tprefill\trunning\twait_high\twait_normal\twait_low\tkv_used\tpreemptions\tcap\tcap_low\tpredicted_ms\tdegraded\tkv_demand\trunning_i8\trt_tokens\tswap_blocks\tswap_ms\tstep\n");
    }
    if (sf_thread_create(&e->thread, engine_main, e) != 0) {
        rc = sf_err(err, SF_ERROR, "engine: cannot start the engine thread");
        goto fail;
    }
    e->thread_started = 1;
    *out = e;
    return SF_OK;
fail:
    sf_engine_free(e);
    return rc;
}

void sf_engine_free(sf_engine *e)
{
    if (!e) return;
    if (e->thread_started) {
        pthread_mutex_lock(&e->mu);
        e->stop = 1;
        pthread_cond_broadcast(&e->wake);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
    }
    if (e->trace) fclose(e->trace);
    free(e->logits);
    free(e->rows);
    free(e->ids);
    free(e->row_seq);
    free(e->row_score);
    free(e->mask_row);
    free(e->row_nofit);
    free(e->lp);
    free(e->masks);
    sf_cpu_pool_free(e->mask_pool);
    free(e->sc_target);
    free(e->sc_rank);
    free(e->sc_lp);
    free(e->sc_tid);
    free(e->sc_tlp);
    free(e->src_row);
    free(e->victims);
    free(e->taken);
    free(e->spec_seqs);
    free(e->step_hist);
    free(e->pen);
    if (e->sched_ready) sf_sched_free(&e->sched);
    if (e->pool_ready) sf_kv_pool_free(&e->pool);
    sf_swap_free(&e->swap);
    if (e->tp) sf_tp_free(e->tp); /* stops the followers; frees fwd */
    else sf_forward_free(e->fwd);
    if (e->be) sf_backend_close(e->be);
    sf_model_free(e->model);
    pthread_cond_destroy(&e->idle);
    pthread_cond_destroy(&e->wake);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->jv_mu);
    sf_json_vocab_free(e->jv);
    free(e);
}

/* Under e->mu: seconds until a request in lane u would likely be served, from the queue ahead
 * of it and the rate at which requests finished recently. */
static double retry_after(sf_engine *e, int u)
{
    int ahead = 0;
    for (int i = u; i < SF_URGENCY_COUNT; i++) ahead += e->st.waiting[i];
    double rate = e->req_per_s;
    double t = rate > 0 ? (double)(ahead + 1) / rate : 1.0 + (double)ahead / (double)e->cfg.max_num_seqs;
    return t < 0.1 ? 0.1 : t > 60 ? 60 : t;
}

int sf_engine_submit(sf_engine *e, const sf_submit *s, sf_request **out, double *retry_after_s, sf_error *err)
{
    sf_request *r = NULL;
    int rc;
    if (out) *out = NULL;
    if (retry_after_s) *retry_after_s = 0;
    if (!e || !s) return sf_err(err, SF_EINVAL, "submit: no engine or no request");
    if ((rc = sf_request_new(s, e->model->tok, e->vocab, e->max_model_len, &r, err)) != SF_OK) return rc;
    if (r->sp.json) { /* the vocabulary's texts, once (tens of ms for 100k tokens) */
        pthread_mutex_lock(&e->jv_mu);
        if (!e->jv) rc = sf_json_vocab_new(e->model->tok, e->vocab, &e->jv, err);
        pthread_mutex_unlock(&e->jv_mu);
        if (rc != SF_OK) {
            sf_request_free(r);
            return rc;
        }
    }
    int u = r->seq.urgency;
    pthread_mutex_lock(&e->mu);
    if (e->draining || e->stop) {
        pthread_mutex_unlock(&e->mu);
        sf_request_free(r);
        return sf_err(err, SF_ENODEV, "the engine is draining (shutting down) and admits no new requests");
    }
    if (e->tp_failed) {
        pthread_mutex_unlock(&e->mu);
        sf_request_free(r);
        return sf_err(err, SF_ENODEV, "the engine stopped: %s", e->tp_failed_msg);
    }
    int queued = e->st.waiting[u]; /* queued in the scheduler (last step) + in the inbox */
    if (r->seq.min_tps > 0 && e->cfg.step_shaping && e->st.running > 0 &&
        e->st.step_ms > 1000.0 / r->seq.min_tps) {
        /* Its floor cannot be met: steps already take longer than one token's share of it. */
        double t = retry_after(e, u), ms = e->st.step_ms, floor = r->seq.min_tps;
        e->n_rejected++;
        pthread_mutex_unlock(&e->mu);
        sf_request_free(r);
        if (retry_after_s) *retry_after_s = t;
        return sf_err(err, SF_AGAIN, "a min-throughput of %g tokens/s cannot be met now: engine steps take %.1f ms "
                      "(%.1f tokens/s per request); retry in %.1f s or ask for a lower min-throughput",
                      floor, ms, 1000.0 / ms, t);
    }
    if (queued >= e->cfg.queue_limit[u]) {
        double t = retry_after(e, u);
        e->n_rejected++;
        pthread_mutex_unlock(&e->mu);
        sf_request_free(r);
        if (retry_after_s) *retry_after_s = t;
        return sf_err(err, SF_AGAIN, "the %s-urgency queue is full (%d waiting); retry in %.1f s",
                      u == SF_URGENCY_HIGH ? "high" : u == SF_URGENCY_NORMAL ? "normal" : "low", queued, t);
    }
    r->next_in = NULL;
    if (e->in_tail) e->in_tail->next_in = r;
    else e->in_head = r;
    e->in_tail = r;
    e->in_count[u]++;
    e->st.waiting[u]++;
    if (out) *out = r;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
    return SF_OK;
}

void sf_engine_cancel(sf_engine *e, sf_request *r)
{
    if (!e || !r) return;
    atomic_store(&r->cancel, 1);
    atomic_fetch_add(&e->cancels, 1); /* after the flag: the walk that sees the count sees the flag */
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->mu);
}

void sf_engine_drain(sf_engine *e, double timeout_s)
{
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    double deadline = sf_now_s() + (timeout_s > 0 ? timeout_s : 0);
    while (!e->stop && (e->busy || e->in_head || e->st.running || e->st.waiting[0] || e->st.waiting[1] ||
                        e->st.waiting[2])) {
        double left = atomic_load(&e->drain_cut) ? 0 : deadline - sf_now_s();
        if (left <= 0) {
            atomic_store(&e->cancel_all, 1); /* the engine thread cancels the rest at its next step */
            pthread_cond_signal(&e->wake);
            pthread_cond_wait(&e->idle, &e->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double until = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + SF_MIN(left, 0.05);
        ts.tv_sec = (time_t)until;
        ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&e->idle, &e->mu, &ts);
    }
    atomic_store(&e->cancel_all, 0);
    pthread_mutex_unlock(&e->mu);
}

void sf_engine_drain_cut(sf_engine *e)
{
    if (!e) return;
    atomic_store(&e->drain_cut, 1);
    pthread_mutex_lock(&e->mu);
    pthread_cond_broadcast(&e->idle); /* the drain's wait looks again */
    pthread_mutex_unlock(&e->mu);
}

void sf_engine_get_stats(sf_engine *e, sf_engine_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!e) return;
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    st->decisions[SF_DECISION_REJECT] += e->n_rejected; /* counted at submit: live, not per step */
    double dt = sf_now_s() - e->win_start;
    if (dt >= RATE_WINDOW_S) st->tokens_per_s = (double)e->win_tokens / dt; /* idle: the rate decays */
    pthread_mutex_unlock(&e->mu);
}

_Static_assert(SF_DECISION_COUNT == sizeof ((sf_engine_stats *)0)->decisions / sizeof(uint64_t),
               "sf_engine_stats.decisions must hold every SF_DECISION_*");

const char *sf_decision_name(int i)
{
    static const char *names[SF_DECISION_COUNT] = { "relax", "kv_int8", "restore", "preempt_swap",
                                                    "preempt_recompute", "reject" };
    return i >= 0 && i < SF_DECISION_COUNT ? names[i] : "?";
}

void sf_engine_get_info(sf_engine *e, sf_engine_info *info)
{
    memset(info, 0, sizeof *info);
    if (!e) return;
    info->model_name = e->model->name;
    info->backend = e->be->ops->name;
    info->vocab_size = e->vocab;
    info->max_model_len = e->max_model_len;
    info->random_weights = e->model->random_weights;
    info->model = e->model;
    info->hw = e->be->ops->hw(e->be);
    info->kv_blocks = e->pool.n_blocks;
    info->kv_block_size = e->cfg.kv_block_size;
    const sf_model_config *mc = &e->model->cfg;
    sf_kv_config kc = { .n_layers = mc->n_layers, .n_blocks = 1, .block_size = e->cfg.kv_block_size,
                        .n_kv_heads = e->tp ? sf_tp_kv_heads(e->tp) : mc->n_kv_heads, .head_dim = mc->head_dim,
                        .dtype = strcmp(e->be->ops->name, "cpu") ? SF_DT_BF16 : SF_DT_F32 };
    info->kv_bytes_per_token = e->be->ops->kv_block_bytes(e->be, &kc) / (size_t)e->cfg.kv_block_size;
}

const struct sf_tokenizer *sf_engine_tokenizer(sf_engine *e) { return e ? e->model->tok : NULL; }
