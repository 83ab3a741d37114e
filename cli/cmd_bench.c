/* cmd_bench.c — `semflow bench MODE ...`: offline benchmarks straight over the forward pass
 * (no scheduler, no server), so what they time is the backend.
 *
 *   decode   batch-1 decode after a prompt of --ctx tokens: ms/token, and the weight bytes
 *            read per second as a share of the memory bandwidth hal measured (read
 *            bandwidth on the CPU: decode streams every weight once per token and writes
 *            almost nothing). The next token is drawn by the backend's sampler unless
 *            --sample host, and the next step is queued before its id reaches the host, as
 *            the engine's async loop does (--loop serial: launched once the id is in).
 *   throughput  the one mode over the engine (scheduler, continuous batching, sampler):
 *            cli/bench_throughput.c.
 *
 * Modes are a table (bench_modes below); each gets the parsed options and the shared setup
 * helpers (bench_open / bench_feed), so a prefill or throughput mode is one more function. */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench.h"
#include "cli/cli.h"
#include "engine/forward.h"
#include "engine/kvcache.h"
#include "engine/model.h"
#include "engine/tp.h"
#include "hal/hal.h"


/* One model, one backend, one forward pass, one sequence's worth of KV blocks. */
typedef struct bench_env {
    sf_model *m;
    sf_backend *b;
    sf_forward *f;
    sf_tp *tp;           /* tensor parallelism: follower ranks (owns f then) */
    sf_kv_pool pool;
    sf_kv_config kc;
    int32_t *blocks;     /* the sequence's block table */
    int max_blocks, len, max_tokens;
    float *logits;       /* [max_tokens * vocab] */
    int sample_dev;      /* decode steps draw on the backend (only the id comes back) */
} bench_env;

static void bench_close(bench_env *e)
{
    if (e->tp) sf_tp_free(e->tp);
    else sf_forward_free(e->f);
    sf_kv_pool_free(&e->pool);
    sf_backend_close(e->b);
    sf_model_free(e->m);
    free(e->blocks);
    free(e->logits);
    memset(e, 0, sizeof *e);
}

/* Loads the model, opens the backend, prepares a forward pass for steps of up to max_tokens
 * and a KV cache of kv_tokens for sequences of up to seq_tokens each. */
static int bench_open_seqs(const bench_opts *o, int max_tokens, int kv_tokens, int seq_tokens, bench_env *e,
                           sf_error *err)
{
    memset(e, 0, sizeof *e);
    sf_load_opts lo = { .dummy = o->dummy, .dummy_format = o->dtype, .seed = 1, .progress = 1,
                        .shard_rank = 0, .shard_size = o->tp }; /* dummy: fill rank 0's share only */
    char path[1100];
    if (o->preset) snprintf(path, sizeof path, "preset:%s", o->preset);
    else snprintf(path, sizeof path, "%s", o->model);
    int rc = sf_model_load(path, &lo, &e->m, err);
    if (rc) return sf_err_wrap(err, "loading %s", path);
    if (e->m->cfg.max_pos > 0 && seq_tokens > e->m->cfg.max_pos) {
        rc = sf_err(err, SF_EINVAL, "--ctx %d plus %d steps is longer than %s's context of %d tokens; lower --ctx or --steps",
                    o->ctx, o->steps, e->m->name, e->m->cfg.max_pos);
        goto fail;
    }
    sf_backend_opts bo = { .name = o->backend, .n_threads = o->threads };
    if ((rc = sf_backend_open(&bo, &e->b, err))) goto fail;
    if (o->tp > 1) {
        sf_tp_rank_opts to = { .size = o->tp, .model = path, .load_dummy = o->dummy, .dummy_format = o->dtype,
                               .seed = 1, .backend = e->b->ops->name, .n_threads = o->threads,
                               .max_tokens = max_tokens, .max_logits = 1, .shm_fd = -1 };
        if ((rc = sf_tp_start(&to, NULL, e->m, e->b, &e->tp, err))) goto fail;
        e->f = sf_tp_forward(e->tp);
    }
    const sf_model_config *c = &e->m->cfg;
    int bs = 16;
    e->max_blocks = (kv_tokens + bs - 1) / bs;
    e->kc = (sf_kv_config){ .n_layers = c->n_layers, .n_blocks = e->max_blocks, .block_size = bs,
                            .n_kv_heads = e->tp ? sf_tp_kv_heads(e->tp) : c->n_kv_heads, .head_dim = c->head_dim,
                            .dtype = SF_DT_BF16, .int8 = o->kv_i8, .group = c->n_heads / c->n_kv_heads };
    if (o->kv_i8 && e->tp) {
        rc = sf_err(err, SF_EUNSUPPORTED, "--kv-dtype int8 is not available with tensor parallelism");
        goto fail;
    }
    e->max_tokens = max_tokens;
    e->blocks = calloc((size_t)e->max_blocks, sizeof *e->blocks);
    e->logits = malloc(sizeof(float) * (size_t)c->vocab_size * max_tokens);
    if (!e->blocks || !e->logits) { rc = sf_err(err, SF_ENOMEM, "out of memory"); goto fail; }
    if ((rc = e->tp ? sf_tp_kv_init(e->tp, &e->kc, err) : e->b->ops->kv_init(e->b, &e->kc, err)) ||
        (rc = sf_kv_pool_init(&e->pool, e->max_blocks, bs, err)) ||
        (o->kv_i8 && (sf_kv_pool_enable_i8(&e->pool), 0)) ||
        (rc = sf_kv_alloc_as(&e->pool, o->kv_i8, e->max_blocks, e->blocks)) ||
        (!e->tp && (rc = sf_forward_new(e->b, e->m, max_tokens, 1, &e->f, err))))
        goto fail;
    return SF_OK;
fail:
    bench_close(e);
    return rc;
}

/* One sequence of kv_tokens. */
static int bench_open(const bench_opts *o, int max_tokens, int kv_tokens, bench_env *e, sf_error *err)
{
    return bench_open_seqs(o, max_tokens, kv_tokens, kv_tokens, e, err);
}

static int32_t argmax(const float *l, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

/* A step appending n tokens to the sequence: its batch, over the caller's pos and slot [n]. */
typedef struct bench_step {
    int32_t ss[2], ctx[1], row[1];
    sf_batch b;
} bench_step;

static int bench_batch(bench_env *e, const int32_t *tokens, int n, int32_t *pos, int32_t *slot, bench_step *st,
                       sf_error *err)
{
    int bs = e->kc.block_size;
    if (e->len + n > e->max_blocks * bs) return sf_err(err, SF_EINVAL, "bench: context of %d tokens exceeded", e->max_blocks * bs);
    for (int i = 0; i < n; i++) {
        pos[i] = e->len + i;
        slot[i] = e->blocks[pos[i] / bs] * bs + pos[i] % bs;
    }
    st->ss[0] = 0;
    st->ss[1] = n;
    st->ctx[0] = e->len + n;
    st->row[0] = n - 1;
    st->b = (sf_batch){ .n_tokens = n, .n_seqs = 1, .tokens = tokens, .pos = pos, .slot = slot, .seq_start = st->ss,
                        .seq_ctx = st->ctx, .block_table = e->blocks, .max_blocks = e->max_blocks,
                        .logit_rows = st->row, .n_logits = 1 };
    return SF_OK;
}

static const sf_sample_row bench_greedy = { .temperature = 0, .top_p = 1, .repetition_penalty = 1 };

/* Appends n tokens to the sequence in one step. next == NULL: the logits of the last one in
 * e->logits; else its greedy successor in *next, drawn by the backend's sampler when
 * e->sample_dev (only the id crosses), else chosen from the logits on the host. */
static int bench_feed(bench_env *e, const int32_t *tokens, int n, int32_t *next, sf_error *err)
{
    int32_t pos[n], slot[n];
    bench_step st;
    int rc = bench_batch(e, tokens, n, pos, slot, &st, err);
    if (rc) return rc;
    if (next && e->sample_dev) {
        sf_forward_sample smp = { .rows = &bench_greedy, .ids = next };
        /* under TP rank 0 draws on its GPU from the gathered rows: only the id crosses PCIe */
        rc = e->tp ? sf_tp_step_sample(e->tp, &st.b, &smp, err) : sf_forward_step_sample(e->f, &st.b, &smp, err);
        if (rc == SF_EUNSUPPORTED) { /* the sampler declined: the step ran, its logits are there */
            rc = sf_forward_read_logits(e->tp ? sf_tp_forward(e->tp) : e->f, 1, e->logits, err);
            if (rc == SF_OK) *next = argmax(e->logits, e->m->cfg.vocab_size);
        }
    } else {
        rc = e->tp ? sf_tp_step(e->tp, &st.b, e->logits, err) : sf_forward_step(e->f, &st.b, e->logits, err);
        if (rc == SF_OK && next) *next = argmax(e->logits, e->m->cfg.vocab_size);
    }
    if (rc == SF_OK) e->len += n;
    return rc;
}

/* A one-token step queued with its greedy draw on the backend (e->sample_dev), returning before
 * the id reaches the host when draws are deferred (sf_forward_defer); the id lands in *id at the
 * matching take (bench_take). from_draw: the token is the id the last draw gave, taken on the
 * backend (sf_batch.src_row) — the engine's async loop (engine/step.c) — and tok only a stand-in. */
static int bench_launch(bench_env *e, int32_t tok, int from_draw, int32_t *id, sf_error *err)
{
    int32_t pos[1], slot[1], src[1] = { 0 };
    bench_step st;
    int rc = bench_batch(e, &tok, 1, pos, slot, &st, err);
    if (rc) return rc;
    st.b.src_row = from_draw ? src : NULL;
    sf_forward_sample smp = { .rows = &bench_greedy, .ids = id };
    rc = e->tp ? sf_tp_launch_sample(e->tp, &st.b, &smp, err) : sf_forward_launch_sample(e->f, &st.b, &smp, err);
    if (rc == SF_OK) rc = e->tp ? sf_tp_wait_sample(e->tp, err) : sf_forward_wait_sample(e->f, err);
    if (rc == SF_OK) e->len++;
    return rc;
}

/* Waits for the oldest queued draw and writes its id. */
static int bench_take(bench_env *e, sf_error *err)
{
    return e->tp ? sf_tp_take(e->tp, err) : sf_forward_take(e->f, err);
}

static int bench_defer(bench_env *e, int on, sf_error *err)
{
    return e->tp ? sf_tp_defer(e->tp, on, err) : sf_forward_defer(e->f, on, err);
}

/* KV bytes one token's K and V take, read once per decode step that attends to it: bf16 (f32 on
 * the CPU) values, or INT8 values with one fp32 scale per kv head. */
static double kv_token_bytes(const bench_env *e, const bench_opts *o)
{
    double vals = 2.0 * e->m->cfg.n_layers * e->kc.n_kv_heads * e->kc.head_dim;
    if (o->kv_i8) return vals + 2.0 * e->m->cfg.n_layers * e->kc.n_kv_heads * 4;
    return vals * (strcmp(e->b->ops->name, "cpu") ? 2 : 4);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_decode(const bench_opts *o)
{
    bench_env e;
    sf_error err = { 0 };
    int chunk = SF_MIN(o->chunk, o->ctx > 0 ? o->ctx : 1);
    if (bench_open(o, chunk, o->ctx + o->steps + 2, &e, &err)) {
        fprintf(stderr, "semflow bench decode: %s\n", err.msg);
        return 1;
    }
    const sf_model_config *c = &e.m->cfg;
    int rc = 1;
    double *ms = calloc((size_t)o->steps + 1, sizeof(double)), *host_us = calloc((size_t)o->steps + 1, sizeof(double));
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)(o->ctx + 1)), *ids = NULL;
    sf_backend_stats st = { 0 };
    int have_host = 0;
    if (!ms || !host_us || !prompt) { fprintf(stderr, "semflow bench decode: out of memory\n"); goto out; }
    sf_rng rng;
    sf_rng_seed(&rng, 7);
    for (int i = 0; i < o->ctx; i++) prompt[i] = (int32_t)(sf_rng_next(&rng) % (uint64_t)c->vocab_size);
    double t0 = sf_now_s();
    for (int i = 0; i < o->ctx; i += chunk)
        if (bench_feed(&e, prompt + i, SF_MIN(chunk, o->ctx - i), NULL, &err)) goto fail;
    double prefill_s = sf_now_s() - t0;
    int32_t tok = o->ctx ? argmax(e.logits, c->vocab_size) : (c->bos_id >= 0 ? c->bos_id : 0);
    e.sample_dev = !o->sample_host && sf_forward_can_sample(e.tp ? sf_tp_forward(e.tp) : e.f);
    /* The engine's loop (async scheduling, engine/step.c) unless --loop serial or the host
     * samples: step s+1 is queued, its token taken on the backend from step s's draw, before
     * s's id reaches the host, so the host's work per step overlaps the device's and a step's
     * time is the interval between two ids reaching the host. Serial: each step is launched
     * once the id before it is in, and timed from its launch to its id (the host's work and the
     * id's round trip count in the step). */
    int async = e.sample_dev && !o->serial_loop;
    if (async) {
        int drc = bench_defer(&e, 1, &err);
        if (drc == SF_EUNSUPPORTED) async = 0;
        else if (drc) goto fail;
    }
    ids = calloc((size_t)o->steps + 2, sizeof *ids);
    if (!ids) { sf_err(&err, SF_ENOMEM, "out of memory"); goto fail; }
    sf_backend_stats st0 = { 0 };
    int have_st0 = 0;
    /* one untimed step first: page faults of the weights and lazy allocations land there */
    if (async) {
        double t_prev = sf_now_s();
        if (bench_launch(&e, tok, 0, &ids[0], &err)) goto fail_async;
        /* every interval holds one launch: the step after the last timed one is queued as well
         * and taken untimed (a backend that runs a step within its launch, as the CPU's does,
         * would otherwise time the last take alone: ~0 ms) */
        for (int s = 0; s <= o->steps; s++) {
            if (bench_launch(&e, tok, 1, &ids[s + 1], &err)) goto fail_async;
            if (s < o->steps && sf_backend_cuda_stats(e.b, &st) == SF_OK) {
                host_us[s + 1] = st.last_step_host_us;
                have_host = 1;
            }
            if (bench_take(&e, &err)) goto fail_async;
            double t = sf_now_s();
            ms[s] = (t - t_prev) * 1e3;
            t_prev = t;
            if (s == 0 && sf_backend_cuda_stats(e.b, &st0) == SF_OK) have_st0 = 1;
        }
        if (bench_take(&e, &err)) goto fail_async;
        if (bench_defer(&e, 0, &err)) goto fail;
    } else {
        for (int s = 0; s <= o->steps; s++) {
            double ts = sf_now_s();
            if (bench_feed(&e, &tok, 1, &tok, &err)) goto fail;
            ids[s] = tok;
            ms[s] = (sf_now_s() - ts) * 1e3;
            /* CUDA: host time from batch_begin until the step's work was enqueued */
            if (sf_backend_cuda_stats(e.b, &st) == SF_OK) { host_us[s] = st.last_step_host_us; have_host = 1; }
            if (s == 0 && have_host) { st0 = st; have_st0 = 1; }
        }
    }
    /* the device's idle time between a draw and the next step's first work (CUDA events) */
    double dev_idle_us = -1;
    if (have_st0 && sf_backend_cuda_stats(e.b, &st) == SF_OK && st.idle_after_draw_n > st0.idle_after_draw_n)
        dev_idle_us = (st.idle_after_draw_us - st0.idle_after_draw_us) / (double)(st.idle_after_draw_n - st0.idle_after_draw_n);
    uint64_t digest = 1469598103934665603ull; /* FNV-1a over the drawn ids: the loops must agree */
    for (int s = 0; s <= o->steps; s++) digest = (digest ^ (uint32_t)ids[s]) * 1099511628211ull;
    double host_med = 0;
    if (have_host) {
        qsort(host_us + 1, (size_t)o->steps, sizeof(double), cmp_double);
        host_med = host_us[1 + o->steps / 2];
    }
    int n = o->steps;
    double *t = ms + 1, mean = 0;
    for (int i = 0; i < n; i++) mean += t[i] / n;
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    double med = t[n / 2], best = t[0];
    const sf_hw_info *hw = e.b->ops->hw(e.b);
    int read_bw = hw->mem_read_gbs > 0;
    double ceil_gbs = read_bw ? hw->mem_read_gbs : hw->mem_bw_gbs;
    double load[1] = { 0 };
    if (getloadavg(load, 1) != 1) load[0] = -1;
    size_t wbytes = sf_model_weight_bytes(e.tp ? sf_tp_model(e.tp) : e.m, e.b->ops->name, 1); /* per rank (GPU) under TP */
    double kv_per_tok = kv_token_bytes(&e, o);
    double kv_bytes = kv_per_tok * (o->ctx + o->steps / 2.0); /* mean context over the timed steps */
    double gbs = wbytes / (med * 1e-3) / 1e9, gbs_kv = (wbytes + kv_bytes) / (med * 1e-3) / 1e9;
    if (o->json) {
        json_t *j = json_pack("{s:s, s:s, s:b, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:f, s:f, s:f, s:s, s:f, s:f, s:f}",
                              "mode", "decode", "model", e.m->name, "random_weights", e.m->random_weights,
                              "dtype", sf_dtype_name(c->dtype), "backend", e.b->ops->name, "threads", hw->n_threads,
                              "ctx", o->ctx, "steps", o->steps, "ms_per_token_median", med, "ms_per_token_mean", mean,
                              "ms_per_token_min", best, "tokens_per_s", 1e3 / med, "weight_bytes_per_token", (json_int_t)wbytes,
                              "weight_gbs", gbs, "weight_kv_gbs", gbs_kv, "ceiling_gbs", ceil_gbs,
                              "ceiling", read_bw ? "read bandwidth" : "copy bandwidth", "ratio", gbs / ceil_gbs,
                              "prefill_tokens_per_s", o->ctx ? o->ctx / prefill_s : 0.0, "loadavg_1min", load[0]);
        json_object_set_new(j, "tensor_parallel", json_integer(o->tp > 1 ? o->tp : 1));
        json_object_set_new(j, "sampling", json_string(e.sample_dev ? "backend" : "host"));
        json_object_set_new(j, "loop", json_string(async ? "async" : "serial"));
        char dg[17];
        snprintf(dg, sizeof dg, "%016llx", (unsigned long long)digest);
        json_object_set_new(j, "ids_digest", json_string(dg));
        if (dev_idle_us >= 0) json_object_set_new(j, "device_idle_us_per_step", json_real(dev_idle_us));
        /* the KV side: what a step reads of the cache, and the roofline with it */
        json_object_set_new(j, "kv_dtype", json_string(o->kv_i8 ? "int8" : strcmp(e.b->ops->name, "cpu") ? "bf16" : "f32"));
        json_object_set_new(j, "kv_bytes_per_step", json_real(kv_bytes));
        json_object_set_new(j, "roofline_weights_kv_ms", json_real((wbytes + kv_bytes) / (ceil_gbs * 1e9) * 1e3));
        json_object_set_new(j, "ratio_weights_kv", json_real(gbs_kv / ceil_gbs));
        if (have_host) {
            json_object_set_new(j, "host_us_per_step", json_real(host_med));
            json_object_set_new(j, "host_share", json_real(host_med / (med * 1e3)));
            json_object_set_new(j, "roofline_ms", json_real(wbytes / (ceil_gbs * 1e9) * 1e3));
            json_object_set_new(j, "cuda_graph_replays", json_integer(st.graph_replays));
        }
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("decode   %s%s, %s, %.2f GB of weights read per token, backend %s (%d threads)\n", e.m->name,
               e.m->random_weights ? " (random weights)" : "", sf_dtype_name(c->dtype), wbytes / 1e9, e.b->ops->name,
               hw->n_threads);
        printf("sampling %s\n", e.sample_dev ? "on the backend (greedy; only the token id is copied back)"
                                               : "on the host (greedy; the row of logits is copied back)");
        printf("context  %d tokens, then %d decode steps%s\n", o->ctx, o->steps,
               o->tp > 1 ? " (tensor parallel: weight bytes and bandwidth are per rank)" : "");
        printf("loop     %s\n", async ? "async, as the engine runs (the next step queued before the id of the one before it "
                                         "comes; a step is the interval between two ids)"
                                       : "serial (each step launched once the id before it came, timed launch to id)");
        printf("latency  %.1f ms/token median (mean %.1f, best %.1f) = %.2f tokens/s\n", med, mean, best, 1e3 / med);
        printf("weights  %.2f GB/s = %.0f%% of the %.1f GB/s %s hal measured (with KV reads %.2f GB/s)\n", gbs,
               100 * gbs / ceil_gbs, ceil_gbs, read_bw ? "read bandwidth" : "copy bandwidth", gbs_kv);
        if (o->ctx) printf("prefill  %d tokens in %.2f s = %.1f tokens/s (chunks of %d)\n", o->ctx, prefill_s, o->ctx / prefill_s, chunk);
        printf("kv       %s cache, %.1f MB read per step; weights + KV roofline %.2f ms/token = %.0f%% reached\n",
               o->kv_i8 ? "INT8" : strcmp(e.b->ops->name, "cpu") ? "bf16" : "f32", kv_bytes / 1e6,
               (wbytes + kv_bytes) / (ceil_gbs * 1e9) * 1e3, 100 * gbs_kv / ceil_gbs);
        if (hw->l3_bytes && wbytes < 2 * hw->l3_bytes)
            printf("note     the weights (%.1f MiB) fit in the caches: this is not a memory-bandwidth figure\n",
                   wbytes / 1048576.0);
        if (load[0] > hw->n_cores)
            printf("load     1-minute load average %.1f on %d cores: above the core count, other processes shared them\n",
                   load[0], hw->n_cores);
        if (have_host)
            printf("roofline %.2f ms/token (weights / measured bandwidth) = %.0f%% reached; host %.0f us/step = %.1f%% of "
                   "the step; CUDA graphs: %ld captured, %ld replays, %ld fallbacks\n",
                   wbytes / (ceil_gbs * 1e9) * 1e3, 100 * wbytes / (ceil_gbs * 1e9) * 1e3 / med, host_med,
                   100 * host_med / (med * 1e3), st.graphs_captured, st.graph_replays, st.graph_fallbacks);
        if (dev_idle_us >= 0) printf("device   idle %.1f us a step between a draw and the next step's first work\n", dev_idle_us);
    }
    rc = 0;
    goto out;
fail_async:
    for (int i = 0; i < 2; i++) { /* the draws still queued; their errors are the one above's */
        sf_error e2 = { 0 };
        bench_take(&e, &e2);
    }
fail:
    fprintf(stderr, "semflow bench decode: %s\n", err.msg);
out:
    free(ms);
    free(host_us);
    free(prompt);
    free(ids);
    bench_close(&e);
    return rc;
}

/* The GEMMs (2 per weight element per token), causal attention (QK^T and PV over on average
 * (T+1)/2 keys), and the lm_head for the one logit row. */
double sf_bench_prefill_flops(const sf_model_config *c, int T)
{
    double d = c->hidden, hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads, f = c->intermediate;
    double per_layer = d * (H + 2 * Hkv) * hd + H * hd * d + 3 * d * f;
    double attn = 2.0 * 2.0 * H * hd * ((double)T * (T + 1) / 2);
    return c->n_layers * (2.0 * per_layer * T + attn) + 2.0 * d * c->vocab_size;
}

static int bench_prefill(const bench_opts *o)
{
    bench_env e;
    sf_error err = { 0 };
    int T = o->ctx > 0 ? o->ctx : 1, rc = 1, n = o->steps;
    if (bench_open(o, T, T, &e, &err)) {
        fprintf(stderr, "semflow bench prefill: %s\n", err.msg);
        return 1;
    }
    const sf_model_config *c = &e.m->cfg;
    double *ms = calloc((size_t)n + 1, sizeof(double));
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)T);
    if (!ms || !prompt) { fprintf(stderr, "semflow bench prefill: out of memory\n"); goto out; }
    sf_rng rng;
    sf_rng_seed(&rng, 7);
    for (int i = 0; i < T; i++) prompt[i] = (int32_t)(sf_rng_next(&rng) % (uint64_t)c->vocab_size);
    /* the same prompt from position 0 each time (the KV blocks are overwritten); one untimed run first */
    for (int s = 0; s <= n; s++) {
        e.len = 0;
        double ts = sf_now_s();
        if (bench_feed(&e, prompt, T, NULL, &err)) goto fail;
        ms[s] = (sf_now_s() - ts) * 1e3;
    }
    qsort(ms + 1, (size_t)n, sizeof(double), cmp_double);
    double med = ms[1 + n / 2], flops = sf_bench_prefill_flops(c, T);
    const sf_hw_info *hw = e.b->ops->hw(e.b);
    double tflops = flops / (med * 1e-3) / 1e12;
    if (o->json) {
        json_t *j = json_pack("{s:s, s:s, s:b, s:s, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "mode", "prefill",
                              "model", e.m->name, "random_weights", e.m->random_weights, "backend", e.b->ops->name,
                              "tokens", T, "runs", n, "ms_median", med, "tokens_per_s", T / (med * 1e-3),
                              "flops", flops, "tflops", tflops, "gemm_peak_tflops", hw->gemm_tflops,
                              "mfu", hw->gemm_tflops > 0 ? tflops / hw->gemm_tflops : 0.0);
        json_object_set_new(j, "gemm_sustained_tflops", json_real(hw->gemm_tflops_sustained));
        json_object_set_new(j, "mfu_sustained", json_real(hw->gemm_tflops_sustained > 0 ? tflops / hw->gemm_tflops_sustained : 0.0));
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("prefill  %s%s, %d tokens in one step, backend %s\n", e.m->name,
               e.m->random_weights ? " (random weights)" : "", T, e.b->ops->name);
        printf("latency  %.1f ms median of %d (best %.1f) = %.0f tokens/s\n", med, n, ms[1], T / (med * 1e-3));
        printf("compute  %.2f TFLOP per step, %.1f TFLOP/s = %.0f%% MFU of the %.1f TFLOP/s GEMM rate hal measured\n",
               flops / 1e12, tflops, hw->gemm_tflops > 0 ? 100 * tflops / hw->gemm_tflops : 0.0, hw->gemm_tflops);
        if (hw->gemm_tflops_sustained > 0 && hw->gemm_tflops_sustained != hw->gemm_tflops)
            printf("         %.0f%% of the %.1f TFLOP/s it sustains past its first ~50 ms\n",
                   100 * tflops / hw->gemm_tflops_sustained, hw->gemm_tflops_sustained);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "semflow bench prefill: %s\n", err.msg);
out:
    free(ms);
    free(prompt);
    bench_close(&e);
    return rc;
}

/* The all-reduce latency table: messages of T rows of the hidden width (what each layer's two
 * all-reduces carry at T tokens per step), back to back on every rank. */
/* All-reduce latency by message size, 2 KiB .. 16 MiB, on the communicator's base path (NCCL,
 * or shared memory on the CPU) and on its own peer-memory kernels where it has them (one-shot,
 * LL), and which one it picks by itself. JSON: sizes[] = {bytes, rows, us (base), own_us and
 * ll_us (null: none), auto}. */
static int bench_allreduce(const bench_opts *o)
{
    bench_env e;
    sf_error err = { 0 };
    if (o->tp < 2) {
        fprintf(stderr, "semflow bench allreduce: needs --tensor-parallel-size 2 or more\n");
        return 2;
    }
    if (bench_open(o, 1, 16, &e, &err)) {
        fprintf(stderr, "semflow bench allreduce: %s\n", err.msg);
        return 1;
    }
    int width = o->hidden > 0 ? o->hidden : e.m->cfg.hidden, esize = strcmp(e.b->ops->name, "cpu") ? 2 : 4;
    const sf_comm *c = sf_tp_comm(e.tp);
    size_t cap = c->custom_cap_bytes, cross = c->custom_max_bytes, ll_cap = c->ll_cap_bytes;
    json_t *arr = json_array();
    if (!o->json) {
        printf("all-reduce over %d ranks, backend %s, %s values; one decode token = %d bytes (row of %d)\n", o->tp,
               e.b->ops->name, esize == 2 ? "bf16" : "f32", width * esize, width);
        if (cap)
            printf("own path: one-shot peer memory up to %zu bytes, LL up to %zu; auto picks the own path up to %zu "
                   "bytes (LL up to %zu)\n", cap, ll_cap, cross, c->ll_max_bytes);
        else printf("own path: none on this communicator (only %s)\n", strcmp(e.b->ops->name, "cpu") ? "NCCL" : "shared memory");
        char base[32];
        snprintf(base, sizeof base, "%s_us", c->ops->name);
        printf("%10s %10s %10s %10s %10s %6s\n", "bytes", "rows", base, "own_us", "ll_us", "auto");
    }
    int rc = 0;
    for (size_t bytes = 2048; bytes <= ((size_t)16 << 20) && !rc; bytes *= 2) {
        int64_t n = (int64_t)(bytes / (size_t)esize);
        double us[3] = { 0, 0, 0 }; /* base, one-shot, LL */
        static const sf_comm_path paths[3] = { SF_COMM_PATH_NCCL, SF_COMM_PATH_ONESHOT, SF_COMM_PATH_LL };
        int iters = bytes <= (1u << 20) ? o->steps * 20 : o->steps * 2;
        for (int p = 0; p < 3 && !rc; p++) {
            if ((p != 0 && bytes > cap) || (p == 2 && bytes > ll_cap)) continue;
            if (sf_tp_bench_all_reduce_path(e.tp, n, iters, paths[p], &us[p], &err)) {
                fprintf(stderr, "semflow bench allreduce: %s\n", err.msg);
                rc = 1;
            }
        }
        if (rc) break;
        const char *pick = !cap || bytes > cross ? c->ops->name : bytes <= c->ll_max_bytes ? "ll" : "own";
        double rows = (double)bytes / ((double)width * esize);
        if (o->json) {
            json_t *row = json_pack("{s:I, s:f, s:f, s:s}", "bytes", (json_int_t)bytes, "rows", rows, "us", us[0],
                                    "auto", pick);
            json_object_set_new(row, "own_us", us[1] > 0 ? json_real(us[1]) : json_null());
            json_object_set_new(row, "ll_us", us[2] > 0 ? json_real(us[2]) : json_null());
            json_array_append_new(arr, row);
        } else {
            char own[2][16] = { "-", "-" };
            for (int p = 1; p < 3; p++)
                if (us[p] > 0) snprintf(own[p - 1], sizeof own[p - 1], "%.1f", us[p]);
            printf("%10zu %10.3g %10.1f %10s %10s %6s\n", bytes, rows, us[0], own[0], own[1], pick);
        }
    }
    if (o->json && !rc) {
        json_t *j = json_pack("{s:s, s:s, s:i, s:i, s:s, s:I, s:I, s:o}", "mode", "allreduce", "backend", e.b->ops->name,
                              "tensor_parallel", o->tp, "width", width, "base", c->ops->name, "own_cap_bytes", (json_int_t)cap,
                              "crossover_bytes", (json_int_t)cross, "sizes", arr);
        json_object_set_new(j, "ll_cap_bytes", json_integer((json_int_t)ll_cap));
        json_object_set_new(j, "ll_crossover_bytes", json_integer((json_int_t)c->ll_max_bytes));
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        json_decref(arr);
    }
    bench_close(&e);
    return rc;
}

/* One load, two figures: batch-1 decode (sequence 0 alone) and decode steps of --batch
 * sequences together, each sequence first prefilled with --ctx tokens in chunks; ms per step,
 * tokens/s and host µs per step (CUDA). Only one logit row is read back per step (the step's
 * forward cost, not the logits' download), so the batch figure is a decode step rate, not the
 * engine's served throughput. Sequence s owns blocks [s * per, (s + 1) * per) of the pool. */
typedef struct batch_run {
    int B, per, bs, chunk;
    int32_t *tok, *pos, *slot, *ss, *ctx, *bt, *len;
} batch_run;

static int batch_step(bench_env *e, batch_run *r, int n_seqs, double *ms, double *host_us, sf_error *err)
{
    const sf_model_config *c = &e->m->cfg;
    for (int s = 0; s < n_seqs; s++) {
        r->tok[s] = (int32_t)((r->len[s] * 2654435761u + (unsigned)s * 40503u) % (unsigned)c->vocab_size);
        r->pos[s] = r->len[s];
        r->slot[s] = r->bt[s * r->per + r->pos[s] / r->bs] * r->bs + r->pos[s] % r->bs;
        r->ss[s] = s;
        r->ctx[s] = ++r->len[s];
    }
    r->ss[n_seqs] = n_seqs;
    int32_t row[1] = { 0 };
    sf_batch b = { .n_tokens = n_seqs, .n_seqs = n_seqs, .tokens = r->tok, .pos = r->pos, .slot = r->slot,
                   .seq_start = r->ss, .seq_ctx = r->ctx, .block_table = r->bt, .max_blocks = r->per, .logit_rows = row,
                   .n_logits = 1 };
    double t0 = sf_now_s();
    int rc = e->tp ? sf_tp_step(e->tp, &b, e->logits, err) : sf_forward_step(e->f, &b, e->logits, err);
    *ms = (sf_now_s() - t0) * 1e3;
    sf_backend_stats st;
    *host_us = sf_backend_cuda_stats(e->b, &st) == SF_OK ? st.last_step_host_us : 0;
    return rc;
}

/* Median of v[1..n] (v[0], the untimed first step, left out). */
static double median_after_first(double *v, int n)
{
    qsort(v + 1, (size_t)n, sizeof(double), cmp_double);
    return v[1 + n / 2];
}

static int bench_decode_batch(const bench_opts *o)
{
    bench_env e;
    sf_error err = { 0 };
    batch_run r = { .B = o->batch, .bs = 16 };
    r.per = (o->ctx + 2 * o->steps + 2 + r.bs - 1) / r.bs;
    r.chunk = SF_MAX(1, SF_MIN(o->chunk, o->ctx));
    int max_tokens = SF_MAX(r.B, r.chunk), rc = 1, B = r.B;
    if (bench_open_seqs(o, max_tokens, B * r.per * r.bs, r.per * r.bs, &e, &err)) {
        fprintf(stderr, "semflow bench decode-batch: %s\n", err.msg);
        return 1;
    }
    const sf_model_config *c = &e.m->cfg;
    r.tok = calloc((size_t)max_tokens, 4), r.pos = calloc((size_t)max_tokens, 4), r.slot = calloc((size_t)max_tokens, 4);
    r.ss = calloc((size_t)B + 1, 4), r.ctx = calloc((size_t)B, 4), r.bt = calloc((size_t)B * r.per, 4);
    r.len = calloc((size_t)B, 4);
    double *ms1 = calloc((size_t)o->steps + 1, sizeof(double)), *h1 = calloc((size_t)o->steps + 1, sizeof(double));
    double *msb = calloc((size_t)o->steps + 1, sizeof(double)), *hb = calloc((size_t)o->steps + 1, sizeof(double));
    if (!r.tok || !r.pos || !r.slot || !r.ss || !r.ctx || !r.bt || !r.len || !ms1 || !h1 || !msb || !hb) {
        sf_err(&err, SF_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < B * r.per; i++) r.bt[i] = e.blocks[i];
    for (int s = 0; s < B; s++) /* prefill: one sequence's chunk per step */
        for (int p = 0; p < o->ctx; p += r.chunk) {
            int n = SF_MIN(r.chunk, o->ctx - p);
            for (int i = 0; i < n; i++) {
                r.tok[i] = (int32_t)((unsigned)(p + i + 7 * s) * 2654435761u % (unsigned)c->vocab_size);
                r.pos[i] = p + i;
                r.slot[i] = r.bt[s * r.per + r.pos[i] / r.bs] * r.bs + r.pos[i] % r.bs;
            }
            int32_t s2[2] = { 0, n }, cx[1] = { p + n }, row[1] = { n - 1 };
            sf_batch b = { .n_tokens = n, .n_seqs = 1, .tokens = r.tok, .pos = r.pos, .slot = r.slot, .seq_start = s2,
                           .seq_ctx = cx, .block_table = r.bt + s * r.per, .max_blocks = r.per, .logit_rows = row,
                           .n_logits = 1 };
            if (e.tp ? sf_tp_step(e.tp, &b, e.logits, &err) : sf_forward_step(e.f, &b, e.logits, &err)) goto fail;
            r.len[s] = p + n;
        }
    for (int st = 0; st <= o->steps; st++) /* step 0 of each part untimed */
        if (batch_step(&e, &r, 1, &ms1[st], &h1[st], &err)) goto fail;
    for (int st = 0; st <= o->steps; st++)
        if (batch_step(&e, &r, B, &msb[st], &hb[st], &err)) goto fail;
    double m1 = median_after_first(ms1, o->steps), mb = median_after_first(msb, o->steps);
    double hm1 = median_after_first(h1, o->steps), hmb = median_after_first(hb, o->steps);
    if (o->json) {
        json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "mode", "decode-batch",
                              "model", e.m->name, "backend", e.b->ops->name, "tensor_parallel", o->tp > 1 ? o->tp : 1,
                              "batch", B, "ctx", o->ctx, "steps", o->steps, "batch1_ms_per_step", m1, "batch1_host_us", hm1,
                              "ms_per_step_median", mb, "host_us_per_step", hmb, "tokens_per_s", B * 1e3 / mb,
                              "batch1_tokens_per_s", 1e3 / m1);
        /* the memory roofline of a step: every weight once, and every sequence's KV (its mean
         * context over the timed steps) once */
        const sf_hw_info *hw = e.b->ops->hw(e.b);
        double ceil_gbs = hw->mem_read_gbs > 0 ? hw->mem_read_gbs : hw->mem_bw_gbs;
        double wbytes = (double)sf_model_weight_bytes(e.tp ? sf_tp_model(e.tp) : e.m, e.b->ops->name, 1), kvt = kv_token_bytes(&e, o);
        double kv1 = kvt * (o->ctx + o->steps / 2.0), kvb = kvt * (B * (o->ctx + o->steps / 2.0) + o->steps + 1);
        json_object_set_new(j, "kv_dtype", json_string(o->kv_i8 ? "int8" : strcmp(e.b->ops->name, "cpu") ? "bf16" : "f32"));
        json_object_set_new(j, "weight_bytes", json_real(wbytes));
        json_object_set_new(j, "kv_bytes_per_step", json_real(kvb));
        json_object_set_new(j, "ceiling_gbs", json_real(ceil_gbs));
        json_object_set_new(j, "roofline_ms", json_real((wbytes + kvb) / (ceil_gbs * 1e9) * 1e3));
        json_object_set_new(j, "ratio", json_real((wbytes + kvb) / (ceil_gbs * 1e9) * 1e3 / mb));
        json_object_set_new(j, "batch1_roofline_ms", json_real((wbytes + kv1) / (ceil_gbs * 1e9) * 1e3));
        json_object_set_new(j, "batch1_ratio", json_real((wbytes + kv1) / (ceil_gbs * 1e9) * 1e3 / m1));
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("decode-batch %s%s, backend %s, tensor parallel %d, context %d + up to %d steps\n", e.m->name,
               e.m->random_weights ? " (random weights)" : "", e.b->ops->name, o->tp > 1 ? o->tp : 1, o->ctx,
               2 * o->steps + 2);
        printf("batch 1  %.2f ms/step median = %.0f tokens/s", m1, 1e3 / m1);
        if (hm1 > 0) printf(", host %.0f us/step", hm1);
        printf("\nbatch %d %.2f ms/step median = %.0f tokens/s", B, mb, B * 1e3 / mb);
        if (hmb > 0) printf(", host %.0f us/step", hmb);
        printf(" (one logit row read back per step)\n");
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "semflow bench decode-batch: %s\n", err.msg);
out:
    free(r.tok); free(r.pos); free(r.slot); free(r.ss); free(r.ctx); free(r.bt); free(r.len);
    free(ms1); free(h1); free(msb); free(hb);
    bench_close(&e);
    return rc;
}

static const struct {
    const char *name;
    int (*fn)(const bench_opts *o);
    const char *help;
} bench_modes[] = {
    { "decode", bench_decode, "batch-1 decode: ms/token and weight GB/s vs measured memory bandwidth" },
    { "allreduce", bench_allreduce, "all-reduce latency by message size across --tensor-parallel-size ranks" },
    { "decode-batch", bench_decode_batch, "batch-1 decode, then steps of --batch sequences together: ms/step, tokens/s" },
    { "prefill", bench_prefill, "one prefill step of --ctx tokens: tokens/s and MFU vs the measured GEMM rate" },
    { "throughput", sf_bench_throughput, "offline: --num-prompts requests of --input/--output tokens through the engine; "
                                         "tokens/s vs the physical bound" },
};

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow bench MODE (--model PATH | --load-format dummy --preset NAME) [options]\n\nmodes:\n");
    for (size_t i = 0; i < SF_ARRAY_LEN(bench_modes); i++) fprintf(f, "  %-10s %s\n", bench_modes[i].name, bench_modes[i].help);
    fprintf(f, "  %-10s %s\n", "kv-quality", "INT8 vs full-precision KV: logit error and top-1 agreement (kv-quality --help)");
    fprintf(f, "\noptions:\n"
               "  --model PATH          Hugging Face folder, .gguf file or demo\n"
               "  --load-format dummy   random weights from the config alone (no weight files needed)\n"
               "  --preset NAME         a built-in shape for dummy weights (e.g. 1b, llama-3-8b, qwen2-7b)\n"
               "  --dtype NAME          format of dummy weights: bf16 (default), f16, or GGUF's q8_0, q4_0,\n"
               "                        q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs,\n"
               "                        q4_k_m, q5_k_m (llama.cpp's mixes) for the matrices\n"
               "  --backend NAME        auto | cpu | cuda (default auto)\n"
               "  --threads N           CPU threads (default: all cores)\n"
               "  --ctx N               prompt tokens before the timed steps (default 128)\n"
               "  --steps N             timed decode steps (default 16)\n"
               "  --chunk N             prefill chunk size (default 256)\n"
               "  --kv-dtype int8       decode/prefill: keep the sequence's KV in INT8 blocks (default: full precision)\n"
               "  --tensor-parallel-size N  split the model over N ranks (weight bytes are then per rank)\n"
               "  --hidden N            allreduce: message row width (default: the model's hidden size)\n"
               "  --batch N             decode-batch: sequences decoded together (default 64)\n"
               "  --sample host|backend decode, throughput: where tokens are chosen (default backend when it can)\n"
               "  --loop async|serial   decode: queue each step before the id of the one before it comes, as the\n"
               "                        engine does (default), or launch it once that id is in (host work counts)\n"
               "  --json                machine-readable result\n"
               "\nthroughput options:\n"
               "  --input N             prompt tokens per request (default 128)\n"
               "  --output N            output tokens per request, EOS ignored (default 128)\n"
               "  --num-prompts N       requests, all submitted at once (default 256)\n"
               "  --max-num-seqs N      running sequences at most (default 1024, vLLM's offline default on\n"
               "                        70+ GiB GPUs; lowered to --num-prompts and to what the KV cache holds)\n"
               "  --max-batched-tokens N  token budget per step (default 16384, vLLM's offline default on\n"
               "                        70+ GiB GPUs; the prompt steps are fewer and fuller)\n"
               "  --gpu-memory-utilization F  share of device memory for weights + KV (default 0.9)\n"
               "  --temperature F       sampling temperature (default 1; 0 is greedy)\n"
               "  --top-p F             nucleus sampling for every request, (0, 1] (default 1: off)\n"
               "  --top-k N             keep the N most likely tokens (default 0: off)\n"
               "  --prefix-len N        the first N of the --input tokens the same in every prompt (default 0)\n"
               "  --no-prefix-caching   the engine's prefix cache off (on by default)\n"
               "  --structured-output-ratio F  this share of the requests (spread evenly) held to JSON output\n"
               "                        (response_format json_object; needs --model with a tokenizer): they end\n"
               "                        when their object does, so they count their own tokens (default 0)\n"
               "  --logprobs N          every request asks for its tokens' log-probabilities and the top N\n"
               "                        alternatives, 0..20 (vLLM's; default: none)\n"
               "  --compare FILE        a `bench decode-batch --json` result: its step (the forward pass alone) is\n"
               "                        reported beside the engine's decode step\n");
}

/* A flag that takes one of two words: *is_a = 1 for a, 0 for b. */
static int parse_pair(const char *flag, const char *v, const char *a, const char *b, int *is_a)
{
    if (strcmp(v, a) && strcmp(v, b)) {
        fprintf(stderr, "semflow bench: %s takes %s or %s, got '%s'\n", flag, a, b, v);
        return -1;
    }
    *is_a = !strcmp(v, a);
    return 0;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end || x < lo || x > hi) {
        fprintf(stderr, "semflow bench: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* A number in [lo, hi], or in (lo, hi] when open_lo. */
static int parse_range(const char *flag, const char *v, double lo, int open_lo, double hi, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (*v == 0 || *end || !((open_lo ? x > lo : x >= lo) && x <= hi)) {
        fprintf(stderr, "semflow bench: %s wants a number in %c%g, %g], got '%s'\n", flag, open_lo ? '(' : '[', lo, hi,
                v);
        return -1;
    }
    *out = x;
    return 0;
}

int sf_cmd_bench(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "kv-quality")) /* its own options (cmd_bench_kv.c) */
        return sf_cmd_bench_kv_quality ? sf_cmd_bench_kv_quality(argc - 1, argv + 1) : 2;
    bench_opts o = { .backend = "auto", .ctx = 128, .steps = 16, .chunk = 256, .dtype = "bf16", .batch = 64,
                     .input = 128, .output = 128, .num_prompts = 256, .max_num_seqs = 1024, .max_batched_tokens = 16384,
                     .gpu_util = 0.9, .temperature = 1.0, .top_p = 1.0, .logprobs = -1 };
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' }, { "load-format", required_argument, NULL, 'l' },
        { "preset", required_argument, NULL, 'p' }, { "backend", required_argument, NULL, 'b' },
        { "threads", required_argument, NULL, 't' }, { "ctx", required_argument, NULL, 'c' },
        { "steps", required_argument, NULL, 's' }, { "chunk", required_argument, NULL, 'k' },
        { "dtype", required_argument, NULL, 'd' }, { "json", no_argument, NULL, 'j' },
        { "tensor-parallel-size", required_argument, NULL, 'P' }, { "hidden", required_argument, NULL, 'H' },
        { "kv-dtype", required_argument, NULL, 'K' }, { "batch", required_argument, NULL, 'B' },
        { "sample", required_argument, NULL, 'S' }, { "input", required_argument, NULL, 'I' },
        { "output", required_argument, NULL, 'O' }, { "num-prompts", required_argument, NULL, 'N' },
        { "max-num-seqs", required_argument, NULL, 'M' }, { "max-batched-tokens", required_argument, NULL, 'X' },
        { "gpu-memory-utilization", required_argument, NULL, 'G' }, { "temperature", required_argument, NULL, 'T' },
        { "top-p", required_argument, NULL, 'Q' }, { "top-k", required_argument, NULL, 'Y' },
        { "compare", required_argument, NULL, 'C' }, { "loop", required_argument, NULL, 'L' },
        { "prefix-len", required_argument, NULL, 'R' }, { "no-prefix-caching", no_argument, NULL, 'Z' },
        { "structured-output-ratio", required_argument, NULL, 'W' }, { "logprobs", required_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' }, { 0 }
    };
    int c;
    sf_error de = { 0 };
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': o.model = optarg; break;
        case 'l': if (parse_pair("--load-format", optarg, "dummy", "auto", &o.dummy)) return 2; break;
        case 'p': o.preset = optarg; break;
        case 'b': o.backend = optarg; break;
        case 't': if (parse_int("--threads", optarg, 1, 1024, &o.threads)) return 2; break;
        case 'c': if (parse_int("--ctx", optarg, 0, 1 << 20, &o.ctx)) return 2; break;
        case 's': if (parse_int("--steps", optarg, 1, 100000, &o.steps)) return 2; break;
        case 'k': if (parse_int("--chunk", optarg, 1, 65536, &o.chunk)) return 2; break;
        case 'd':
            if (sf_dummy_format_check(optarg, &de)) {
                fprintf(stderr, "semflow bench: --dtype: %s\n", de.msg);
                return 2;
            }
            o.dtype = optarg;
            break;
        case 'j': o.json = 1; break;
        case 'K':
            if (!strcmp(optarg, "int8")) o.kv_i8 = 1;
            else if (strcmp(optarg, "auto") && strcmp(optarg, "bf16")) {
                fprintf(stderr, "semflow bench: --kv-dtype takes int8 or auto (bf16 on CUDA, f32 on the CPU), got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'H': if (parse_int("--hidden", optarg, 1, 1 << 20, &o.hidden)) return 2; break;
        case 'B': if (parse_int("--batch", optarg, 1, 4096, &o.batch)) return 2; break;
        case 'P': if (parse_int("--tensor-parallel-size", optarg, 1, 64, &o.tp)) return 2; break;
        case 'S': if (parse_pair("--sample", optarg, "host", "backend", &o.sample_host)) return 2; break;
        case 'I': if (parse_int("--input", optarg, 1, 1 << 20, &o.input)) return 2; break;
        case 'O': if (parse_int("--output", optarg, 1, 1 << 20, &o.output)) return 2; break;
        case 'N': if (parse_int("--num-prompts", optarg, 1, 1 << 20, &o.num_prompts)) return 2; break;
        case 'M': if (parse_int("--max-num-seqs", optarg, 1, 65536, &o.max_num_seqs)) return 2; break;
        case 'X': if (parse_int("--max-batched-tokens", optarg, 1, 1 << 20, &o.max_batched_tokens)) return 2; break;
        case 'G': if (parse_range("--gpu-memory-utilization", optarg, 0.05, 0, 1, &o.gpu_util)) return 2; break;
        case 'T': if (parse_range("--temperature", optarg, 0, 0, 100, &o.temperature)) return 2; break;
        case 'Q': if (parse_range("--top-p", optarg, 0, 1, 1, &o.top_p)) return 2; break;
        case 'Y': if (parse_int("--top-k", optarg, 0, 1 << 20, &o.top_k)) return 2; break;
        case 'C': o.compare = optarg; break;
        case 'R': if (parse_int("--prefix-len", optarg, 0, 1 << 20, &o.prefix_len)) return 2; break;
        case 'Z': o.no_prefix_cache = 1; break;
        case 'W': if (parse_range("--structured-output-ratio", optarg, 0, 0, 1, &o.structured)) return 2; break;
        case 'V': if (parse_int("--logprobs", optarg, 0, 20, &o.logprobs)) return 2; break; /* SF_MAX_LOGPROBS */
        case 'L': if (parse_pair("--loop", optarg, "serial", "async", &o.serial_loop)) return 2; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind >= argc) {
        fprintf(stderr, "semflow bench: which benchmark? (a MODE is required)\n");
        usage(stderr);
        return 2;
    }
    o.mode = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "semflow bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!o.model == !o.preset) {
        fprintf(stderr, "semflow bench: give either --model PATH or --load-format dummy --preset NAME\n");
        return 2;
    }
    if (o.preset && !o.dummy) {
        fprintf(stderr, "semflow bench: --preset has no weight files; add --load-format dummy\n");
        return 2;
    }
    if (o.preset && o.structured > 0) {
        fprintf(stderr, "semflow bench: --structured-output-ratio needs a tokenizer, which a --preset has not: give "
                        "--model PATH (a folder with tokenizer.json) --load-format dummy\n");
        return 2;
    }
    for (size_t i = 0; i < SF_ARRAY_LEN(bench_modes); i++)
        if (!strcmp(o.mode, bench_modes[i].name)) return bench_modes[i].fn(&o);
    fprintf(stderr, "semflow bench: unknown mode '%s'\n", o.mode);
    usage(stderr);
    return 2;
}
