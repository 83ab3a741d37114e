/* engine.h — the engine's public API: the only engine header the gateway and cli may include.
 *
 * The engine owns a model, a backend, a paged KV cache and one engine thread that runs the
 * scheduler and the forward pass. Requests are submitted from any thread; their events
 * (tokens, finish, error) are delivered by callback ON THE ENGINE THREAD — the callback must
 * not block; the gateway copies the event into the request's output ring and wakes its worker.
 * The engine never includes libevent. */
#ifndef SF_ENGINE_H
#define SF_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"

typedef struct sf_engine sf_engine;
typedef struct sf_request sf_request; /* engine-owned; valid from submit until SF_EV_DONE/ERROR returns */

/* ---- semantic intents ------------------------------------------------------------- */
enum { SF_URGENCY_LOW = 0, SF_URGENCY_NORMAL = 1, SF_URGENCY_HIGH = 2, SF_URGENCY_COUNT = 3 };

typedef struct sf_intent {
    char cls[48];             /* class name, e.g. "realtime-chat", "batch-summarize" */
    int urgency;              /* SF_URGENCY_* : the priority lane */
    int max_latency_ms;       /* 0: none. Target for first token / per token */
    double min_tps;           /* 0: none. Output tokens/s the request wants */
} sf_intent;

/* ---- sampling ---------------------------------------------------------------------- */
#define SF_MAX_STOP 8
#define SF_MAX_LOGIT_BIAS 1024
/* OpenAI's logit_bias: bias (in [-100, 100]) added to token id's logit before the penalties */
typedef struct sf_logit_bias { int32_t id; float bias; } sf_logit_bias;
typedef struct sf_sampling {
    float temperature;        /* 0: greedy */
    float top_p;              /* 1: off */
    int top_k;                /* 0: off */
    float min_p;              /* 0: off */
    float presence_penalty, frequency_penalty; /* OpenAI semantics, 0: off */
    float repetition_penalty; /* HF/llama.cpp semantics, 1: off */
    uint64_t seed;
    int has_seed;             /* 0: seed drawn from the clock */
    int max_tokens;           /* output tokens; <= 0: up to the context */
    int min_tokens;           /* output tokens before EOS or a stop id may be drawn (vLLM); 0: none */
    int ignore_eos;
    int include_stop_str;     /* a stop string that ends the output is part of it (vLLM's
                               * include_stop_str_in_output); 0: cut before it */
    int keep_special;         /* special tokens' text is shown (vLLM's skip_special_tokens false) */
    int n_stop;
    char *stop[SF_MAX_STOP];  /* stop strings (owned by the caller until submit returns; engine copies) */
    int n_stop_ids;
    int32_t stop_ids[SF_MAX_STOP];
    int logprobs;             /* number of top logprobs per token (0: none; < 0: only the chosen token's) */
    int n_bias;               /* logit_bias entries, distinct ids (owned by the caller until submit
                               * returns; the engine copies) */
    const sf_logit_bias *bias;
    int json;                 /* JSON output (response_format): the output is one JSON object
                               * (engine/json_mask.h); drawn by the backend's sampler with an allow
                               * mask made on the host (step.c form_masks) */
    const char *schema;       /* with json: the JSON Schema it follows (text, schema_len bytes;
                               * owned by the caller until submit returns), NULL: any object */
    size_t schema_len;
    int choice;               /* with json: schema is instead a JSON array of strings and the output is
                               * exactly one of them (vLLM's guided_choice; engine/json_mask.h) */
    int regex;                /* with json: schema is instead a regular expression (engine/regex.h) the
                               * whole output matches (vLLM's guided_regex) */
    int prompt_logprobs;      /* the prompt's own log-probabilities (vLLM's prompt_logprobs, OpenAI's echo
                               * with logprobs): 0 none; < 0 each prompt token's alone; n > 0 with the top n
                               * (<= SF_MAX_LOGPROBS) of each position. Scored from the raw logits, with
                               * no bias or penalty; delivered in one SF_EV_PROMPT before the first token */
    int prompt_score_from;    /* prompt_logprobs: positions before this one are not scored (NAN, rank 0, no
                               * top): a perplexity window scores its second half alone; 0: all */
    int prompt_only;          /* no output: the request ends after its prompt (OpenAI's echo with
                               * max_tokens 0), finish reason length, no SF_EV_TOKEN */
} sf_sampling;
void sf_sampling_default(sf_sampling *s);

/* ---- events ------------------------------------------------------------------------ */
enum { SF_EV_TOKEN = 1, SF_EV_DONE = 2, SF_EV_ERROR = 3, SF_EV_PROMPT = 4 };
enum { SF_FINISH_STOP = 0, SF_FINISH_LENGTH = 1, SF_FINISH_CANCELLED = 2, SF_FINISH_ERROR = 3 };
#define SF_MAX_LOGPROBS 20

typedef struct sf_logprob { int32_t id; float logprob; } sf_logprob;

typedef struct sf_event {
    int type;                 /* SF_EV_* */
    sf_request *req;
    void *user;               /* as given at submit */
    /* SF_EV_TOKEN */
    int32_t token;            /* -1 in SF_EV_DONE / SF_EV_ERROR */
    const char *text;         /* newly completed UTF-8 text, NUL-terminated, valid during the callback.
                               * "" while a UTF-8 sequence is incomplete or while the text could be the
                               * start of a stop string (it is held back). SF_EV_DONE may carry the last
                               * held-back text; a stop string and what follows it are never delivered,
                               * nor is the EOS / stop-id token's text. */
    size_t text_len;
    float logprob;            /* of the chosen token */
    int n_top;
    const sf_logprob *top;    /* [n_top] */
    /* SF_EV_PROMPT (sampling.prompt_logprobs): position i of the prompt, its token
     * prompt_ids[i], its log-probability given the tokens before it prompt_lp[i] (NAN at 0),
     * its rank among the vocabulary (1: the most likely; 0 at 0) and the prompt_k most likely
     * tokens there, prompt_top[i * prompt_k ...] (empty at 0); arrays of n_prompt_lp */
    int n_prompt_lp, prompt_k;
    const int32_t *prompt_ids, *prompt_rank;
    const float *prompt_lp;
    const sf_logprob *prompt_top;
    /* SF_EV_DONE */
    int finish_reason;        /* SF_FINISH_* */
    int prompt_tokens, completion_tokens;
    int cached_tokens;        /* prompt tokens whose K/V came from the prefix cache */
    double ttft_s, e2e_s;     /* from submit */
    /* SF_EV_ERROR */
    int status;               /* SF_E* */
    const char *message;
} sf_event;

typedef void (*sf_event_cb)(const sf_event *ev);

typedef struct sf_submit {
    const int32_t *prompt;    /* tokenized prompt (engine copies) */
    int n_prompt;
    sf_sampling sampling;
    sf_intent intent;
    char tenant[64];
    const char *cache_salt;   /* NULL or a string: requests share cached prefix blocks only under the
                               * same tenant and salt (vLLM's cache_salt) */
    uint64_t group;           /* 0, or an id the requests of one prompt share (an API request's n
                               * choices): with the prefix cache the later ones wait while one of them
                               * computes the prompt, then find it cached instead of computing it too */
    sf_event_cb cb;
    void *user;
} sf_submit;

/* ---- engine ------------------------------------------------------------------------ */
#define SF_SPEC_MAX_TOKENS 16 /* draft tokens a step at most (speculative decoding) */
typedef struct sf_engine_config {
    const char *model;        /* folder, .gguf or "demo" */
    const char *backend;      /* "auto" | "cpu" | "cuda" */
    int load_dummy;           /* --load-format dummy */
    int n_threads;            /* CPU backend threads; <= 0 all cores */
    int device;               /* CUDA device */
    int max_num_seqs;         /* running sequences at most (default 64) */
    int max_batched_tokens;   /* token budget per step (default 2048) */
    int max_logits;           /* logit rows per step: next-token rows and scored prompt positions
                               * (prompt_logprobs); 0: max_num_seqs, else at least that */
    int max_model_len;        /* context cap; 0: the model's */
    int kv_block_size;        /* tokens per KV block (default 16) */
    int num_kv_blocks;        /* 0: sized from memory */
    float gpu_memory_utilization; /* default 0.9 */
    float kv_high_reserve;    /* share of KV blocks only high urgency may take (default 0.1) */
    int queue_limit[SF_URGENCY_COUNT]; /* waiting requests per lane before SF_AGAIN (default 256) */
    int progress;             /* loader progress bar */
    int tensor_parallel;      /* ranks the model is split over (processes; GPUs on CUDA); <= 1: none */
    double swap_space_gib;    /* host memory for preemption by swap (default 1); 0: recompute only */
    const char *sched_trace;  /* NULL: off; else a file that gets one TSV line per engine step */
    /* step shaping by latency budget and throughput floor (default on; docs/SCHEDULER.md) */
    int step_shaping;
    /* degrade instead of reject: KV usage above kv_degrade_high for kv_degrade_hold_s seconds
     * relaxes low-urgency requests to relax_latency_ms and gives new ones INT8 KV; below
     * kv_degrade_low for as long restores (defaults 0.92, 0.80, 5 s, 2000 ms; high 0: off) */
    float kv_degrade_high, kv_degrade_low;
    double kv_degrade_hold_s;
    int relax_latency_ms;
    /* DMA tuning of the swap copies (engine/swap.h): 1 (default) per-class chunk sizes, and
     * low-urgency swap-ins held back while the PCIe link is contended; 0: every copy in one
     * piece, never held back (the baseline). */
    int dma_tuner;
    /* The PCIe contention index of CUDA device `device` (other processes' DMA / the link's
     * measured bandwidth; e.g. a wrapper of sf_monitor_contention). Called on the engine thread
     * before and after swap copies: must be cheap and never block. NULL: never paced. */
    double (*pcie_contention)(void *arg, int device);
    void *pcie_contention_arg;
    int host_sampling;        /* 1: always copy the logits and sample on the host (comparisons);
                               * 0: sample on the backend when it can (logprobs and forms included,
                               * under tensor parallelism too) */
    int serial_steps;         /* 1: deliver a step's tokens before launching the next (the serial loop;
                               * also $SEMFLOW_ENGINE_OVERLAP=0); 0 (default): launch the next step
                               * first and deliver while the device runs it (docs/ENGINE.md) */
    int async_steps;          /* 1 (default): async scheduling — queue the next step before the ids
                               * of the one in flight reach the host, its decode tokens taken from
                               * that step's draw on the backend (backends with sample_take, every
                               * rank under TP; where it cannot, the overlapped loop; docs/ENGINE.md);
                               * 0: the next step is planned after the ids are taken.
                               * $SEMFLOW_ENGINE_ASYNC=0/1 overrides it */
    int prefix_caching;       /* 1 (default): prompts reuse the K/V of earlier prompts' identical leading
                               * blocks (same tenant and salt; docs/SCHEDULER.md); 0: off */
    /* Speculative decoding by n-gram lookup (vLLM's "ngram" method, prompt lookup decoding): up to
     * spec_tokens draft tokens a step for a decoding sequence whose last spec_ngram_max ..
     * spec_ngram_min tokens occurred before in its context (the tokens that followed them
     * then), verified in one step by the same draws that would have chosen them one by one, so
     * the output is the one without drafts; while at most spec_max_batch sequences run.
     * spec_tokens 0 (default): off. Defaults 2, 4, 8. docs/ENGINE.md */
    int spec_tokens, spec_ngram_min, spec_ngram_max, spec_max_batch; /* spec_tokens <= SF_SPEC_MAX_TOKENS */
    /* Threads that make the allow masks of a step's rows held to a form (JSON, schemas, patterns,
     * choices), while the device runs the step's forward pass: 0 (default) half the online cores,
     * at most 8 ($SEMFLOW_MASK_THREADS overrides it); 1: the engine thread alone. Started at the
     * first step with two or more such rows. */
    int mask_threads;
} sf_engine_config;
void sf_engine_config_default(sf_engine_config *c);

/* Loads the model, opens the backend, sizes and initialises the KV cache, starts the engine
 * thread. Any thread; the engine may then be shared by all threads until sf_engine_free. */
int sf_engine_new(const sf_engine_config *c, sf_engine **out, sf_error *err);
/* Stops the thread (cancelling what runs: each request gets DONE with SF_FINISH_CANCELLED) and
 * frees everything. NULL is fine. Call once, from a thread that is not the engine thread (not from
 * a callback), after every other thread has stopped calling into e. */
void sf_engine_free(sf_engine *e);

/* Any thread. Returns SF_OK, SF_AGAIN (lane queue full: answer 429 with *retry_after_s, an
 * estimate from the queue ahead and the recent finish rate), SF_EINVAL (empty prompt, prompt
 * longer than max_model_len - 1, token outside the vocabulary, bad sampling values: message in
 * err), SF_ENODEV (the engine is draining: answer 503). The prompt and stop strings are copied.
 * On SF_OK the callback will be called until one SF_EV_DONE or SF_EV_ERROR; *out (may be NULL)
 * receives the handle for sf_engine_cancel. The callback may call submit and cancel. */
int sf_engine_submit(sf_engine *e, const sf_submit *s, sf_request **out, double *retry_after_s, sf_error *err);
/* Any thread. The request finishes with SF_FINISH_CANCELLED at the next step; its KV blocks
 * are freed then. Safe to call after it finished (until its DONE callback returned). */
void sf_engine_cancel(sf_engine *e, sf_request *r);

/* Any thread. Stop admitting (submit returns SF_ENODEV from now on, for good); returns when
 * nothing is queued or running, or after timeout_s, when it cancels the rest (each gets DONE with
 * SF_FINISH_CANCELLED) and waits for that. */
void sf_engine_drain(sf_engine *e, double timeout_s);
/* Any thread. A drain in progress (or the next one) takes its timeout as past: what still runs is
 * cancelled now (a second SIGTERM). */
void sf_engine_drain_cut(sf_engine *e);

typedef struct sf_engine_stats {
    int running, waiting[SF_URGENCY_COUNT];
    int kv_blocks_total, kv_blocks_used;
    uint64_t steps, tokens_prefill, tokens_decode, preemptions;
    uint64_t finished, cancelled;
    double tokens_per_s;       /* output tokens/s over the last few seconds */
    /* preemption by swap: sequences swapped out / in, preemptions that fell back to recompute
     * because the swap space was full, and the swap space in KV blocks */
    uint64_t swaps_out, swaps_in, swap_fallbacks;
    uint64_t swaps_dropped; /* swapped out and never back (ended while out, or the copy failed) */
    int swap_blocks_total, swap_blocks_used;
    /* the scheduler's policy: decisions by kind (SF_DECISION_*: relax, kv_int8, restore,
     * preempt_swap, preempt_recompute, reject), whether it is degraded now, the KV usage it
     * watches, the moving average of step time (ms) and the step caps of the last plan
     * (prefill tokens; -1: none) */
    uint64_t decisions[6];
    int degraded;
    double kv_usage, step_ms;
    int cap_tokens, cap_low;
    /* DMA tuner: swap bytes copied per urgency lane (both directions), low-class swap-ins held
     * back because the link was contended, and the contention index it last saw */
    uint64_t dma_bytes[SF_URGENCY_COUNT], dma_deferred;
    double pcie_contention;
    /* Engine-thread time per step, summed: wall time of each loop turn that ran a step, and the
     * host's part of it (all of it but the wait for the device: scheduling, batch building,
     * launches, token delivery). On the CPU backend the device is the host: host = step time.
     * decode_*: the same over steps in which every sequence brought one token; decode_enqueue_s
     * is the part of decode_host_s the backend spent enqueuing the step's work (launches, or the
     * check of a CUDA graph replay), which may overlap the device's work on earlier kernels.
     * Rows sampled on the backend (only ids came back) and on the host (logits copied); prompt
     * positions scored (prompt logprobs), and of them on the backend (only results came back). */
    double step_s, host_s, decode_step_s, decode_host_s, decode_enqueue_s;
    uint64_t decode_steps, decode_step_tokens, rows_sampled_backend, rows_sampled_host;
    uint64_t prompt_tokens_scored, prompt_tokens_scored_backend;
    /* prefix cache: prompt tokens looked up and found (each admission with nothing computed),
     * blocks registered (held or evictable), of them evictable (free, K/V kept), and registered
     * blocks taken for other K/V; prefix_caching: on */
    uint64_t prefix_queries, prefix_hits, prefix_evictions;
    int prefix_blocks, prefix_evictable, prefix_caching;
    /* speculative decoding: steps that carried drafts, draft tokens, and those accepted */
    uint64_t spec_steps, spec_draft_tokens, spec_accepted_tokens;
    /* CUDA backend: decode-step graphs captured and replayed, and steps that ran op by op */
    long graphs_captured, graph_replays, graph_fallbacks;
    /* KV demand the degrade policy watches (docs/SCHEDULER.md): units admitted work holds or
     * needs to finish, over the pool (may pass 1); kv_usage above is the memory held now.
     * Sequences running with INT8 KV now. */
    double kv_demand;
    int running_kv_i8;
    /* Where a decode step's time goes (docs/ENGINE.md), summed over the loop turns that took a
     * decode step's ids (decode_steps of them; their wall time is decode_step_s): blocked
     * waiting for the device (the ids; under TP also the logits' gather inside the launch),
     * taking the ids, planning (scheduler, swaps), building the batch and sampling rows,
     * launching the next step (of which sending the TP step plan), delivering text and events.
     * decode_exposed_s: the host time on the device's critical path — from the moment a step's
     * ids arrived to the moment the next step's work was all queued, when the device has
     * nothing to run, less decode_masks_s. decode_masks_s: forms' masks made after those ids
     * while the next step's forward pass, queued before them, runs (async steps with a form's
     * rows; the device idles only where they outlast it: dev_idle_s). overlapped: 1 when tokens
     * are delivered while the next step runs. */
    double decode_wait_s, decode_take_s, decode_plan_s, decode_batch_s, decode_launch_s, decode_send_s,
        decode_deliver_s, decode_exposed_s, decode_masks_s;
    double decode_step_p50_ms, decode_step_p90_ms; /* of those turns' wall times */
    double decode_gap_p50_ms, decode_gap_p90_ms;   /* of their device idle gaps */
    int overlapped;
    int async;                /* 1: async scheduling ran (sf_engine_config.async_steps) */
    uint64_t async_steps;     /* steps queued before the ids of the step before them reached the host */
    uint64_t async_form_steps; /* of them, steps with rows held to a form: the forward pass queued ahead,
                                * the draw once the ids before it came and the masks were made */
    int mask_threads;         /* threads making the forms' masks (1 until a step with two such rows) */
    /* CUDA: the device's idle time between a step's ids copied back and the next step's first
     * work, on the device's clock (sf_backend_stats), summed over dev_idle_n steps */
    double dev_idle_s;
    long dev_idle_n;
} sf_engine_stats;
/* Name of decision i for /metrics ("relax", "kv_int8", ...); "?" outside the range. */
const char *sf_decision_name(int i);
/* Any thread. Forget the prefix cache's blocks (vLLM's /reset_prefix_cache): done by the engine
 * thread before its next plan; what runs keeps its blocks. */
void sf_engine_reset_prefix_cache(sf_engine *e);
/* Any thread. A snapshot taken after every engine step (and when the engine goes idle). */
void sf_engine_get_stats(sf_engine *e, sf_engine_stats *st);

/* Model facts for /v1/models, tokenize routes and the cli. Any thread; strings live as long as e.
 * max_model_len is the context in effect (the model's, capped by config and by the KV pool). */
typedef struct sf_engine_info {
    const char *model_name;
    const char *backend;
    int vocab_size, max_model_len;
    int random_weights;
    /* for benchmarks: the loaded model (engine/model.h), the backend's hardware description
     * (hal/hal.h), the KV pool and the bytes one token of context takes in it */
    const struct sf_model *model;
    const struct sf_hw_info *hw;
    int kv_blocks, kv_block_size;
    size_t kv_bytes_per_token;
} sf_engine_info;
void sf_engine_get_info(sf_engine *e, sf_engine_info *info);

/* The engine's tokenizer (immutable, any thread). */
const struct sf_tokenizer *sf_engine_tokenizer(sf_engine *e);

#endif
