/* bench_throughput.c — `semflow bench throughput`: saturated offline throughput through the
 * engine itself (its scheduler, continuous batching, chunked prefill and sampler), as vLLM's
 * benchmark_throughput measures it: --num-prompts requests of --input random prompt tokens
 * and --output output tokens each (EOS ignored), all submitted at once; output and total
 * tokens per second from the first submit to the last finish. --structured-output-ratio holds a
 * share of them to JSON output (each then ends with its object, up to --output tokens): what a
 * form's mask costs a saturated step; --logprobs N has every request ask for its tokens'
 * log-probabilities and top N alternatives: what they cost it.
 *
 * Beside the figure it prints the physical bound of the same work on the measured hardware
 * (docs/PERFORMANCE.md derives it): prefill at the GEMM rate hal measured, then every decode
 * step of b running sequences at the slower of reading the weights plus the KV of all b
 * contexts at the measured memory bandwidth, and its FLOPs at the GEMM rate (and the same
 * again at the GEMM rate the GPU sustains once its clocks settle under the load). And the host's
 * share of a decode step (the engine thread's time not spent waiting for the device), and on a
 * GPU the device memory the run took beyond what the engine allocated at start (the decode-step
 * CUDA graphs: the pool is sized once), per captured graph. */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench.h"
#include "engine/engine.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>
#endif

/* Free device memory of the current device in bytes; -1 without CUDA or on error. */
static double device_free_bytes(void)
{
#ifdef SF_HAVE_CUDA
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) return (double)fr;
    cudaGetLastError();
#endif
    return -1;
}

typedef struct run_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done, n_failed;        /* under mu */
    long completion_tokens;      /* under mu: as the DONE events report them */
    atomic_long token_events;
    double t_last;               /* under mu: the last finish */
    char first_error[256];
    /* the run's timeline (engine thread; read after the last DONE, under mu): requests that had
     * their first token, when the last of them had it, the first finish and the tokens
     * delivered by then */
    int n_started, n_started_want;
    double t_all_started, t_first_done;
    long tokens_at_all_started, tokens_at_first_done;
} run_state;

/* One request's event context: the run and whether its first token came. */
typedef struct run_req {
    run_state *st;
    int started;
} run_req;

/* Engine thread: count tokens and finishes; never blocks for long. */
static void on_event(const sf_event *ev)
{
    run_req *q = ev->user;
    run_state *r = q->st;
    if (ev->type == SF_EV_TOKEN) {
        atomic_fetch_add(&r->token_events, 1);
        if (!q->started) {
            q->started = 1;
            if (++r->n_started == r->n_started_want) {
                r->t_all_started = sf_now_s();
                r->tokens_at_all_started = atomic_load(&r->token_events);
            }
        }
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (!r->n_done) {
        r->t_first_done = sf_now_s();
        r->tokens_at_first_done = atomic_load(&r->token_events);
    }
    if (ev->type == SF_EV_DONE) r->completion_tokens += ev->completion_tokens;
    else {
        r->n_failed++;
        if (!r->first_error[0]) snprintf(r->first_error, sizeof r->first_error, "%s", ev->message ? ev->message : "?");
    }
    r->n_done++;
    r->t_last = sf_now_s();
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int open_engine(const bench_opts *o, const char *path, int max_seqs, sf_engine **out, sf_error *err)
{
    sf_engine_config c;
    sf_engine_config_default(&c);
    c.model = path;
    c.backend = o->backend;
    c.load_dummy = o->dummy;
    c.n_threads = o->threads;
    c.tensor_parallel = o->tp;
    c.max_num_seqs = max_seqs;
    c.max_batched_tokens = SF_MAX(o->max_batched_tokens, max_seqs);
    c.max_model_len = o->input + o->output + 1;
    c.gpu_memory_utilization = (float)o->gpu_util;
    c.host_sampling = o->sample_host;
    c.progress = !o->json;
    c.prefix_caching = !o->no_prefix_cache;
    for (int i = 0; i < SF_URGENCY_COUNT; i++) c.queue_limit[i] = o->num_prompts + 1;
    return sf_engine_new(&c, out, err);
}

/* The physical bound of the run (see the file comment): seconds of prefill and of decode. */
typedef struct bound { double prefill_s, decode_s, weight_bytes, bw, peak; } bound;

/* Under tensor parallelism (tp > 1) every GPU reads 1/tp of the weights and does 1/tp of the
 * FLOPs, and kv_bytes_per_token is already one rank's share (its kv heads), so the bound is that
 * of one GPU's share; the collectives are left out (they are what TP costs beyond it). */
static bound physical_bound(const sf_engine_info *in, int N, int I, int O, int B, int tp, double tflops)
{
    const sf_model_config *c = &in->model->cfg;
    const sf_hw_info *hw = in->hw;
    bound r = { 0 };
    r.bw = (hw->mem_read_gbs > 0 ? hw->mem_read_gbs : hw->mem_bw_gbs) * 1e9;
    r.peak = tflops * 1e12;
    tp = tp > 1 ? tp : 1;
    r.weight_bytes = (double)sf_model_weight_bytes(in->model, in->backend, 1) / tp;
    if (r.bw <= 0 || r.peak <= 0) return r;
    double d = c->hidden, hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads, f = c->intermediate;
    double gemm_tok = 2.0 * (c->n_layers * (d * (H + 2 * Hkv) * hd + H * hd * d + 3 * d * f) + d * c->vocab_size);
    double attn_per_key = 4.0 * c->n_layers * H * hd, kv_tok = (double)in->kv_bytes_per_token;
    r.prefill_s = N * sf_bench_prefill_flops(c, I) / tp / r.peak;
    /* the first output token comes with the prefill; the other O - 1 from decode steps, the
     * sequences in waves of at most B */
    for (int left = N; left > 0; left -= B) {
        double b = SF_MIN(left, B);
        for (int j = 1; j < O; j++) {
            double ctx = (double)I + j + 1;
            double mem = (r.weight_bytes + b * kv_tok * ctx) / r.bw, fl = b * (gemm_tok + attn_per_key * ctx) / tp / r.peak;
            r.decode_s += mem > fl ? mem : fl;
        }
    }
    return r;
}

/* --compare: the decode-batch result the engine's step is set beside; NULL with a message in
 * err when the file is not one. */
static json_t *load_compare(const char *path, sf_error *err)
{
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        sf_err(err, SF_EINVAL, "--compare %s: not readable JSON (%s, line %d); give the output of `semflow bench "
               "decode-batch --json`", path, je.text, je.line);
        return NULL;
    }
    json_t *mode = json_object_get(j, "mode"), *ms = json_object_get(j, "ms_per_step_median");
    if (!json_is_string(mode) || strcmp(json_string_value(mode), "decode-batch") || !json_is_number(ms)) {
        sf_err(err, SF_EINVAL, "--compare %s: not a decode-batch result (no \"mode\": \"decode-batch\" with "
               "ms_per_step_median); give the output of `semflow bench decode-batch --json`", path);
        json_decref(j);
        return NULL;
    }
    return j;
}

int sf_bench_throughput(const bench_opts *o)
{
    sf_error err = { 0 };
    sf_engine *e = NULL;
    int32_t *prompt = NULL;
    run_req *reqs = NULL;
    json_t *cmp = NULL; /* --compare */
    int rc = 1, N = o->num_prompts, I = o->input, O = o->output, P = o->prefix_len;
    char path[1100];
    run_state st;
    memset(&st, 0, sizeof st);
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    if (o->preset) snprintf(path, sizeof path, "preset:%s", o->preset);
    else snprintf(path, sizeof path, "%s", o->model);

    if (P > I) {
        sf_err(&err, SF_EINVAL, "--prefix-len %d is longer than --input %d", P, I);
        goto fail;
    }
    int max_seqs = SF_MIN(o->max_num_seqs, N);
    if (o->compare && !(cmp = load_compare(o->compare, &err))) goto fail;
    if (open_engine(o, path, max_seqs, &e, &err)) goto fail;
    sf_engine_info in;
    sf_engine_get_info(e, &in);
    if (in.max_model_len < I + O + 1) {
        sf_err(&err, SF_EINVAL, "--input %d + --output %d need a context of %d tokens; %s holds %d here (the model's "
               "context, or what the KV cache holds): lower them or raise --gpu-memory-utilization", I, O, I + O + 1,
               in.model_name, in.max_model_len);
        goto fail;
    }
    /* As many sequences as the KV cache holds whole, so none is preempted (serve sizes the pool
     * the same way from --gpu-memory-utilization; below high urgency a request may use
     * (1 - kv_high_reserve) of it). */
    {
        int per_seq = (I + O + 1 + in.kv_block_size - 1) / in.kv_block_size;
        int usable = in.kv_blocks - (int)((double)in.kv_blocks * 0.1);
        int fit = usable / per_seq;
        if (fit < max_seqs) {
            if (fit < 1) {
                sf_err(&err, SF_ENOMEM, "the KV cache (%d blocks of %d tokens) holds no sequence of %d tokens",
                       in.kv_blocks, in.kv_block_size, I + O + 1);
                goto fail;
            }
            if (!o->json)
                printf("note     the KV cache holds %d sequences of %d tokens: --max-num-seqs %d -> %d\n", fit,
                       I + O + 1, max_seqs, fit);
            sf_engine_free(e);
            e = NULL;
            max_seqs = fit;
            if (open_engine(o, path, max_seqs, &e, &err)) goto fail;
            sf_engine_get_info(e, &in);
        }
    }

    st.n_started_want = N;
    if (!(prompt = malloc((size_t)I * sizeof *prompt)) || !(reqs = calloc((size_t)N, sizeof *reqs))) {
        sf_err(&err, SF_ENOMEM, "out of memory for the prompts");
        goto fail;
    }
    sf_rng rng;
    sf_rng_seed(&rng, 7);
    /* one GPU (tp 1, cuda): the engine's device; what the run takes beyond it is graphs */
    const int on_gpu = !strcmp(in.backend, "cuda") && o->tp <= 1;
    const double free0 = on_gpu ? device_free_bytes() : -1;
    int n_json = 0;
    double t0 = sf_now_s();
    for (int i = 0; i < N; i++) { /* the first P tokens drawn once, the same in every prompt */
        for (int k = i ? P : 0; k < I; k++) prompt[k] = (int32_t)(sf_rng_next(&rng) % (uint64_t)in.vocab_size);
        reqs[i].st = &st;
        sf_submit s = { .prompt = prompt, .n_prompt = I, .cb = on_event, .user = &reqs[i] };
        sf_sampling_default(&s.sampling);
        s.sampling.temperature = (float)o->temperature;
        s.sampling.top_p = (float)o->top_p;
        s.sampling.top_k = o->top_k;
        s.sampling.max_tokens = O;
        /* held to JSON output: request i where the running count of such requests steps up */
        s.sampling.json = (int)((i + 1) * o->structured) > (int)(i * o->structured);
        n_json += s.sampling.json;
        s.sampling.ignore_eos = !s.sampling.json; /* a form ends with its object */
        if (o->logprobs >= 0) s.sampling.logprobs = o->logprobs ? o->logprobs : -1; /* 0: the token's alone */
        s.sampling.seed = (uint64_t)i;
        s.sampling.has_seed = 1;
        s.intent.urgency = SF_URGENCY_NORMAL;
        snprintf(s.intent.cls, sizeof s.intent.cls, "bench-throughput");
        if (sf_engine_submit(e, &s, NULL, NULL, &err)) {
            sf_err_wrap(&err, "submitting request %d of %d", i + 1, N);
            goto fail;
        }
    }
    pthread_mutex_lock(&st.mu);
    while (st.n_done < N) pthread_cond_wait(&st.cv, &st.mu);
    double elapsed = st.t_last - t0;
    pthread_mutex_unlock(&st.mu);
    if (st.n_failed) {
        sf_err(&err, SF_ERROR, "%d of %d requests failed; the first: %s", st.n_failed, N, st.first_error);
        goto fail;
    }
    sf_engine_drain(e, 10.0); /* the engine thread's accounting of the last step, then idle */
    sf_engine_stats es;
    sf_engine_get_stats(e, &es);
    const double free1 = free0 >= 0 ? device_free_bytes() : -1;
    const double run_mib = free0 >= 0 && free1 >= 0 ? (free0 - free1) / 1048576.0 : -1;
    long out_tok = st.completion_tokens;
    const long ev_tok = (long)atomic_load(&st.token_events);
    /* every request runs to O tokens, but one held to JSON output ends with its object (its end
     * token counted, not delivered) */
    if (n_json ? out_tok > (long)N * O || ev_tok > out_tok || ev_tok < out_tok - n_json
               : out_tok != (long)N * O || ev_tok != out_tok) {
        sf_err(&err, SF_ERROR, "expected %s%ld output tokens, the requests reported %ld and delivered %ld",
               n_json ? "at most " : "", (long)N * O, out_tok, ev_tok);
        goto fail;
    }
    bound bd = physical_bound(&in, N, I, O, max_seqs, o->tp, in.hw->gemm_tflops);
    /* the same at the GEMM rate the GPU sustains past its first ~50 ms (hal): a second figure */
    bound bs = physical_bound(&in, N, I, O, max_seqs, o->tp, in.hw->gemm_tflops_sustained);
    /* prompt tokens found in the prefix cache are not computed: the bound's prefill counts the
     * others (in proportion: at these lengths the GEMMs are nearly all of a prompt's FLOPs) */
    const double computed = es.prefix_hits < (uint64_t)N * I ? 1.0 - (double)es.prefix_hits / ((double)N * I) : 0.0;
    bd.prefill_s *= computed;
    bs.prefill_s *= computed;
    double out_tps = out_tok / elapsed, tot_tps = ((double)N * I + out_tok) / elapsed;
    double bound_s = bd.prefill_s + bd.decode_s, bound_out = bound_s > 0 ? (double)N * O / bound_s : 0;
    double bound_tot = bound_s > 0 ? (double)N * (I + O) / bound_s : 0;
    double sus_s = bs.prefill_s + bs.decode_s, sus_out = sus_s > 0 ? (double)N * O / sus_s : 0;
    double dec_ms = es.decode_steps ? 1e3 * es.decode_step_s / es.decode_steps : 0;
    /* host share of a decode step: the host time on the device's critical path (from a step's
     * ids to the next step's work all queued); host work: all the engine thread's time but its
     * waits for the device (part of it runs while the device runs the next step) */
    double host_dec = es.decode_step_s > 0 ? es.decode_exposed_s / es.decode_step_s : 0;
    double work_dec = es.decode_step_s > 0 ? es.decode_host_s / es.decode_step_s : 0;
    double host_all = es.step_s > 0 ? es.host_s / es.step_s : 0;
    double enq_dec = es.decode_step_s > 0 ? es.decode_enqueue_s / es.decode_step_s : 0;
    double mean_b = es.decode_steps ? (double)es.decode_step_tokens / es.decode_steps : 0;
    /* Where the run's time went. Client side: until every request had its first token (with
     * every request seated at once: the prefill, during which the early ones already decode),
     * then until the first finish (every seat decoding), then the ramp-down while the seats
     * empty. Engine side: the steps that carried prompt tokens, the decode-only steps, and the
     * rest (between steps, or idle). */
    const double tl_first = st.t_all_started > 0 ? st.t_all_started - t0 : -1, tl_fin = st.t_first_done - t0;
    const double tl_full = tl_first >= 0 && tl_fin > tl_first ? tl_fin - tl_first : 0, tl_ramp = elapsed - tl_fin;
    const long tok_full = tl_full > 0 ? st.tokens_at_first_done - st.tokens_at_all_started : 0;
    const long tok_ramp = out_tok - st.tokens_at_first_done;
    const uint64_t pf_steps = es.steps > es.decode_steps ? es.steps - es.decode_steps : 0;
    const double pf_s = SF_MAX(0.0, es.step_s - es.decode_step_s), other_s = SF_MAX(0.0, elapsed - es.step_s);
    const char *sampling = es.rows_sampled_host ? (es.rows_sampled_backend ? "mixed" : "host") : "backend";
    if (o->json) {
        json_t *j = json_pack("{s:s, s:s, s:b, s:s, s:i, s:i, s:i, s:i, s:i, s:f, s:I, s:f, s:f, s:f}",
                              "mode", "throughput", "model", in.model_name, "random_weights", in.random_weights,
                              "backend", in.backend, "input", I, "output", O, "num_prompts", N, "max_num_seqs", max_seqs,
                              "kv_blocks", in.kv_blocks, "elapsed_s", elapsed, "output_tokens", (json_int_t)out_tok,
                              "output_tokens_per_s", out_tps, "total_tokens_per_s", tot_tps, "requests_per_s", N / elapsed);
        json_object_set_new(j, "sampling", json_pack("{s:f, s:f, s:i, s:f, s:o}", "temperature", o->temperature, "top_p",
                                                     o->top_p, "top_k", o->top_k, "structured_output_ratio",
                                                     o->structured, "logprobs",
                                                     o->logprobs >= 0 ? json_integer(o->logprobs) : json_null()));
        json_object_set_new(j, "json_requests", json_integer(n_json));
        json_object_set_new(j, "prefix_cache", json_pack("{s:b, s:i, s:I, s:I}", "on", es.prefix_caching, "prefix_len", P,
                                                         "hit_tokens", (json_int_t)es.prefix_hits, "query_tokens",
                                                         (json_int_t)es.prefix_queries));
        json_t *b = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I}", "output_tokens_per_s", bound_out,
                              "total_tokens_per_s", bound_tot, "ratio", bound_out > 0 ? out_tps / bound_out : 0.0,
                              "prefill_s", bd.prefill_s, "decode_s", bd.decode_s, "mem_gbs", bd.bw / 1e9,
                              "gemm_tflops", bd.peak / 1e12, "weight_bytes", bd.weight_bytes,
                              "kv_bytes_per_token", (json_int_t)in.kv_bytes_per_token);
        if (sus_out > 0)
            json_object_set_new(b, "sustained", json_pack("{s:f, s:f, s:f, s:f, s:f}", "output_tokens_per_s", sus_out,
                                                          "ratio", out_tps / sus_out, "prefill_s", bs.prefill_s,
                                                          "decode_s", bs.decode_s, "gemm_tflops", bs.peak / 1e12));
        json_t *s = json_pack("{s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:s, s:I, s:I}", "steps", (json_int_t)es.steps,
                              "decode_steps", (json_int_t)es.decode_steps, "mean_decode_batch", mean_b,
                              "decode_step_ms", dec_ms, "host_share_decode", host_dec,
                              "enqueue_share_decode", enq_dec, "host_share_all", host_all,
                              "sampling", sampling, "rows_sampled_backend", (json_int_t)es.rows_sampled_backend,
                              "rows_sampled_host", (json_int_t)es.rows_sampled_host);
        json_object_set_new(s, "host_work_share_decode", json_real(work_dec));
        json_object_set_new(s, "overlapped", json_boolean(es.overlapped));
        json_object_set_new(s, "async", json_boolean(es.async));
        json_object_set_new(s, "async_steps", json_integer((json_int_t)es.async_steps));
        json_object_set_new(s, "async_form_steps", json_integer((json_int_t)es.async_form_steps));
        json_object_set_new(s, "mask_threads", json_integer(es.mask_threads));
        if (es.dev_idle_n) { /* the device's own clock: idle from a step's ids to the next step's work */
            json_object_set_new(s, "device_idle_us_per_step", json_real(es.dev_idle_s * 1e6 / (double)es.dev_idle_n));
            json_object_set_new(s, "device_idle_s", json_real(es.dev_idle_s));
            json_object_set_new(s, "device_idle_steps", json_integer(es.dev_idle_n));
        }
        json_object_set_new(s, "decode_step_p50_ms", json_real(es.decode_step_p50_ms));
        json_object_set_new(s, "decode_step_p90_ms", json_real(es.decode_step_p90_ms));
        json_object_set_new(s, "device_idle_gap_p50_ms", json_real(es.decode_gap_p50_ms));
        json_object_set_new(s, "device_idle_gap_p90_ms", json_real(es.decode_gap_p90_ms));
        if (es.decode_steps) { /* ms per decode step, by phase of the engine thread's turn */
            double k = 1e3 / (double)es.decode_steps;
            json_t *ph = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "wait_device", es.decode_wait_s * k,
                                   "take", es.decode_take_s * k, "plan", es.decode_plan_s * k, "batch",
                                   es.decode_batch_s * k, "launch", es.decode_launch_s * k, "tp_plan_send",
                                   es.decode_send_s * k, "enqueue", es.decode_enqueue_s * k, "deliver",
                                   es.decode_deliver_s * k, "device_idle_gap", es.decode_exposed_s * k);
            json_object_set_new(ph, "masks_beside_forward", json_real(es.decode_masks_s * k));
            json_object_set_new(s, "phases_ms", ph);
        }
        json_object_set_new(s, "graphs_captured", json_integer(es.graphs_captured));
        json_object_set_new(s, "graph_replays", json_integer(es.graph_replays));
        json_object_set_new(s, "graph_fallbacks", json_integer(es.graph_fallbacks));
        if (run_mib >= 0) {
            json_object_set_new(s, "device_mib_taken_in_run", json_real(run_mib));
            json_object_set_new(s, "device_mib_per_graph", json_real(es.graphs_captured ? run_mib / es.graphs_captured : 0));
        }
        if (cmp) { /* the forward pass alone at a similar shape, and the engine's step over it */
            double ms = json_number_value(json_object_get(cmp, "ms_per_step_median"));
            json_t *d = json_pack("{s:s, s:O?, s:O?, s:O?, s:f, s:O?, s:f}", "file", o->compare, "batch",
                                  json_object_get(cmp, "batch"), "ctx", json_object_get(cmp, "ctx"), "tensor_parallel",
                                  json_object_get(cmp, "tensor_parallel"), "ms_per_step", ms, "host_us_per_step",
                                  json_object_get(cmp, "host_us_per_step"), "engine_step_over_it",
                                  ms > 0 ? dec_ms / ms : 0.0);
            json_object_set_new(s, "decode_batch", d);
        }
        json_t *tl = json_pack("{s:f, s:f, s:f, s:I, s:f, s:I, s:I, s:f, s:f, s:f}", "first_tokens_s", tl_first,
                               "full_decode_s", tl_full, "ramp_down_s", tl_ramp, "full_decode_tokens", (json_int_t)tok_full,
                               "full_decode_tokens_per_s", tl_full > 0 ? tok_full / tl_full : 0.0,
                               "ramp_down_tokens", (json_int_t)tok_ramp, "prompt_steps", (json_int_t)pf_steps,
                               "prompt_steps_s", pf_s, "decode_steps_s", es.decode_step_s, "outside_steps_s", other_s);
        json_object_set_new(j, "timeline", tl);
        json_object_set_new(b, "tensor_parallel", json_integer(SF_MAX(o->tp, 1)));
        json_object_set_new(b, "kv_tokens", json_integer((json_int_t)in.kv_blocks * in.kv_block_size));
        json_object_set_new(j, "tensor_parallel", json_integer(SF_MAX(o->tp, 1)));
        json_object_set_new(j, "bound", b);
        json_object_set_new(j, "engine", s);
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("throughput %s%s, backend %s, %d requests of %d in / %d out (EOS ignored%s), %d running at most, "
               "KV %d blocks x %d\n", in.model_name, in.random_weights ? " (random weights)" : "", in.backend, N, I, O,
               n_json ? "; those held to JSON output end with their object" : "", max_seqs, in.kv_blocks,
               in.kv_block_size);
        printf("measured %.2f s: %.1f output tokens/s, %.1f total tokens/s, %.2f requests/s\n", elapsed, out_tps, tot_tps,
               N / elapsed);
        if (P || es.prefix_hits)
            printf("prefix   %d tokens the same in every prompt; prefix cache %s: %llu of %llu prompt tokens found cached "
                   "(the bound's prefill counts the %.1f%% computed)\n", P, es.prefix_caching ? "on" : "off",
                   (unsigned long long)es.prefix_hits, (unsigned long long)es.prefix_queries, 100 * computed);
        if (o->tp > 1)
            printf("tp       %d ranks: each holds 1/%d of the weights (%.2f GB) and KV for %d tokens (%zu bytes per token "
                   "per GPU); the bound below is one GPU's share of the work\n", o->tp, o->tp, bd.weight_bytes / 1e9,
                   in.kv_blocks * in.kv_block_size, in.kv_bytes_per_token);
        if (bound_s > 0)
            printf("bound    %.1f output tokens/s, %.1f total (prefill %.2f s at %.1f TFLOP/s, decode %.2f s at %.0f GB/s "
                   "or the GEMM rate) = %.0f%% reached\n", bound_out, bound_tot, bd.prefill_s, bd.peak / 1e12,
                   bd.decode_s, bd.bw / 1e9, 100 * out_tps / bound_out);
        if (sus_out > 0 && bs.peak != bd.peak)
            printf("         at the sustained GEMM rate (%.1f TFLOP/s): %.1f output tokens/s = %.0f%% reached\n",
                   bs.peak / 1e12, sus_out, 100 * out_tps / sus_out);
        printf("engine   %llu steps, %llu decode steps of %.1f sequences on average, %.2f ms each (median %.2f, p90 "
               "%.2f); host on the critical path %.1f%% of a decode step, host work %.1f%% (enqueuing %.1f%%; %.1f%% "
               "of all steps); %s loop; sampling on the %s; %d requests held to JSON output\n",
               (unsigned long long)es.steps, (unsigned long long)es.decode_steps, mean_b, dec_ms, es.decode_step_p50_ms,
               es.decode_step_p90_ms, 100 * host_dec, 100 * work_dec, 100 * enq_dec, 100 * host_all,
               es.async ? "async" : es.overlapped ? "overlapped" : "serial", sampling, n_json);
        printf("timeline every request's first token at %.2f s; every seat decoding for %.2f s (%.0f tokens/s); "
               "ramp-down %.2f s (%ld tokens); steps with prompt tokens: %llu, %.2f s; decode-only steps %.2f s; "
               "outside steps %.2f s\n", tl_first, tl_full, tl_full > 0 ? tok_full / tl_full : 0.0, tl_ramp, tok_ramp,
               (unsigned long long)pf_steps, pf_s, es.decode_step_s, other_s);
        if (es.decode_steps) {
            double k = 1e3 / (double)es.decode_steps;
            printf("phases   ms per decode step: wait for the device %.3f, take %.3f, plan %.3f, batch %.3f, launch %.3f "
                   "(TP plan send %.3f, enqueue %.3f), deliver %.3f; device idle gap %.3f (median %.3f, p90 %.3f)"
                   "; forms' masks beside the forward pass %.3f\n",
                   es.decode_wait_s * k, es.decode_take_s * k, es.decode_plan_s * k, es.decode_batch_s * k,
                   es.decode_launch_s * k, es.decode_send_s * k, es.decode_enqueue_s * k, es.decode_deliver_s * k,
                   es.decode_exposed_s * k, es.decode_gap_p50_ms, es.decode_gap_p90_ms, es.decode_masks_s * k);
        }
        if (es.dev_idle_n)
            printf("device   idle %.1f us per step on its own clock, from a step's ids to the next step's work (%ld steps, "
                   "%.3f s)\n", es.dev_idle_s * 1e6 / (double)es.dev_idle_n, es.dev_idle_n, es.dev_idle_s);
        if (cmp) {
            double ms = json_number_value(json_object_get(cmp, "ms_per_step_median"));
            printf("compare  the forward pass alone (%s: batch %lld, context %lld) %.2f ms/step: the engine's decode step "
                   "is %.2fx of it\n", o->compare, (long long)json_integer_value(json_object_get(cmp, "batch")),
                   (long long)json_integer_value(json_object_get(cmp, "ctx")), ms, ms > 0 ? dec_ms / ms : 0.0);
        }
        if (es.graphs_captured || es.graph_replays || es.graph_fallbacks)
            printf("graphs   %ld captured, %ld replays, %ld fallbacks (steps over the graph size limit run op by op)\n", es.graphs_captured, es.graph_replays,
                   es.graph_fallbacks);
        if (run_mib >= 0)
            printf("memory   %.1f MiB of device memory taken during the run (%.2f MiB per captured graph)\n", run_mib,
                   es.graphs_captured ? run_mib / es.graphs_captured : 0.0);
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "semflow bench throughput: %s\n", err.msg);
out:
    sf_engine_free(e);
    json_decref(cmp);
    free(prompt);
    free(reqs);
    pthread_cond_destroy(&st.cv);
    pthread_mutex_destroy(&st.mu);
    return rc;
}
