/* bench.h — what the modes of `semflow bench` share (cli/cmd_bench.c parses the options and
 * holds the single-sequence modes; cli/bench_throughput.c the engine-driven one). */
#ifndef SF_CLI_BENCH_H
#define SF_CLI_BENCH_H

#include <stddef.h>

#include "engine/model.h"
#include "hal/hal.h"

typedef struct bench_opts {
    const char *mode, *model, *preset, *backend;
    int dummy, ctx, steps, threads, json, chunk;
    int tp;              /* --tensor-parallel-size: ranks (1: none) */
    int hidden;          /* allreduce: row width of the messages (0: the model's hidden size) */
    int kv_i8;           /* --kv-dtype int8: the sequence's KV in INT8 blocks */
    int batch;           /* decode-batch: sequences decoded together */
    const char *dtype;   /* --dtype: dummy weights' format (sf_load_opts.dummy_format) */
    int sample_host;     /* --sample host: copy the logits and choose on the host (default: the backend's sampler) */
    int serial_loop;     /* decode --loop serial: launch a step once the id before it is in (default async) */
    /* throughput */
    int input, output, num_prompts, max_num_seqs, max_batched_tokens;
    double gpu_util, temperature, top_p; /* throughput: every request's sampling (top_p 1: off) */
    int top_k;
    const char *compare; /* throughput: a `bench decode-batch --json` result to set the engine's step beside */
    int prefix_len;      /* throughput: the first prefix_len prompt tokens the same in every request */
    int no_prefix_cache; /* throughput: --no-prefix-caching (the engine's prefix cache off) */
    double structured;   /* throughput: --structured-output-ratio, the share of requests held to JSON output */
    int logprobs;        /* throughput: --logprobs N, every request's top N log-probabilities (-1: off) */
} bench_opts;

/* FLOPs of one prefill step of T tokens from position 0 (GEMMs, causal attention, one lm_head row). */
double sf_bench_prefill_flops(const sf_model_config *c, int T);

int sf_bench_throughput(const bench_opts *o);

#endif
