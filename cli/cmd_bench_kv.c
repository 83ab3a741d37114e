/* cmd_bench_kv.c — `semflow bench kv-quality`: the quality cost of INT8 KV on a fixed prompt
 * set (engine/kv_quality.h): full-precision KV vs INT8 KV on the same model and backend,
 * max/mean |delta logit|, relative L2 and top-1 agreement over the generated positions, and
 * how many free-running greedy tokens stay the same.
 *
 * Prompts: --prompts FILE (one per line, tokenized with the model's tokenizer), else a built-in
 * set of eight English prompts; a model without a tokenizer (dummy presets) gets eight prompts
 * of random token ids (fixed seed, 16 to 72 tokens). */
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/kv_quality.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "hal/hal.h"

static const char *const builtin_prompts[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside",
    "The quick brown fox jumps over the lazy dog, and then",
    "Explain why the sky is blue in two sentences.",
    "Write a short poem about the sea at night.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of France is Paris. The capital of Germany is",
    "Tom had three apples. He gave one to Sue and",
    "A list of things to pack for a weekend trip: 1.",
};

typedef struct kvq_args {
    const char *model, *preset, *backend, *prompts;
    int dummy, threads, gen, chunk, json;
} kvq_args;

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow bench kv-quality (--model PATH | --load-format dummy --preset NAME) [options]\n\n"
               "Runs each prompt with full-precision KV and with INT8 KV and compares the logits over the\n"
               "generated positions (teacher-forced), and the free-running greedy tokens.\n\n"
               "options:\n"
               "  --model PATH          Hugging Face folder, .gguf file or demo\n"
               "  --load-format dummy   random weights from the config alone\n"
               "  --preset NAME         a built-in shape for dummy weights (e.g. 1b, llama-3-8b)\n"
               "  --backend NAME        auto | cpu | cuda (default auto)\n"
               "  --threads N           CPU threads (default: all cores)\n"
               "  --prompts FILE        one prompt per line (default: eight built-in prompts)\n"
               "  --gen N               positions compared per prompt (default 32)\n"
               "  --chunk N             prefill chunk (default 256)\n"
               "  --json                machine-readable result\n");
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == 0 || *end || x < lo || x > hi) {
        fprintf(stderr, "semflow bench kv-quality: %s wants an integer in [%d, %d], got '%s'\n", flag, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

/* Prompts as token ids: from the file or the built-in set through the tokenizer, else random. */
static int load_prompts(const kvq_args *a, const sf_model *m, int32_t ***ids, int **lens, int *n, sf_error *err)
{
    char *text = NULL;
    size_t tlen = 0;
    const char *lines[256];
    int nl = 0, rc = SF_OK;
    if (a->prompts) {
        if ((rc = sf_read_file(a->prompts, &text, &tlen, err))) return sf_err_wrap(err, "--prompts");
        for (char *s = text, *e; *s && nl < 256; s = e) {
            e = strchr(s, '\n');
            if (e) *e++ = 0;
            else e = s + strlen(s);
            if (*s) lines[nl++] = s;
        }
        if (!nl) { free(text); return sf_err(err, SF_EINVAL, "--prompts %s: no prompts (one per line)", a->prompts); }
        if (!m->tok) { free(text); return sf_err(err, SF_EINVAL, "--prompts: %s has no tokenizer to read them with", m->name); }
    } else {
        for (size_t i = 0; i < SF_ARRAY_LEN(builtin_prompts); i++) lines[nl++] = builtin_prompts[i];
    }
    *ids = calloc((size_t)nl, sizeof **ids);
    *lens = calloc((size_t)nl, sizeof **lens);
    if (!*ids || !*lens) { free(text); return sf_err(err, SF_ENOMEM, "out of memory"); }
    sf_rng rng;
    sf_rng_seed(&rng, 11);
    for (int i = 0; i < nl && !rc; i++) {
        if (m->tok) {
            size_t k = 0;
            rc = sf_tok_encode(m->tok, lines[i], strlen(lines[i]), 1, &(*ids)[i], &k, err);
            (*lens)[i] = (int)k;
            if (!rc && k == 0) rc = sf_err(err, SF_EINVAL, "prompt %d encodes to no tokens", i + 1);
        } else {
            int k = 16 + 8 * i;
            (*ids)[i] = malloc(sizeof(int32_t) * (size_t)k);
            if (!(*ids)[i]) { rc = sf_err(err, SF_ENOMEM, "out of memory"); break; }
            for (int j = 0; j < k; j++) (*ids)[i][j] = (int32_t)(sf_rng_next(&rng) % (uint64_t)m->cfg.vocab_size);
            (*lens)[i] = k;
        }
    }
    *n = nl;
    free(text);
    return rc;
}

int sf_cmd_bench_kv_quality(int argc, char **argv)
{
    kvq_args a = { .backend = "auto", .gen = 32, .chunk = 256 };
    static const struct option opts[] = {
        { "model", required_argument, NULL, 'm' }, { "load-format", required_argument, NULL, 'l' },
        { "preset", required_argument, NULL, 'p' }, { "backend", required_argument, NULL, 'b' },
        { "threads", required_argument, NULL, 't' }, { "prompts", required_argument, NULL, 'P' },
        { "gen", required_argument, NULL, 'g' }, { "chunk", required_argument, NULL, 'k' },
        { "json", no_argument, NULL, 'j' }, { "help", no_argument, NULL, 'h' }, { 0 }
    };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': a.model = optarg; break;
        case 'l':
            if (strcmp(optarg, "dummy") && strcmp(optarg, "auto")) {
                fprintf(stderr, "semflow bench kv-quality: --load-format takes dummy or auto, got '%s'\n", optarg);
                return 2;
            }
            a.dummy = !strcmp(optarg, "dummy");
            break;
        case 'p': a.preset = optarg; break;
        case 'b': a.backend = optarg; break;
        case 't': if (parse_int("--threads", optarg, 1, 1024, &a.threads)) return 2; break;
        case 'P': a.prompts = optarg; break;
        case 'g': if (parse_int("--gen", optarg, 1, 4096, &a.gen)) return 2; break;
        case 'k': if (parse_int("--chunk", optarg, 1, 65536, &a.chunk)) return 2; break;
        case 'j': a.json = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "semflow bench kv-quality: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!a.model == !a.preset) {
        fprintf(stderr, "semflow bench kv-quality: give either --model PATH or --load-format dummy --preset NAME\n");
        return 2;
    }
    if (a.preset && !a.dummy) {
        fprintf(stderr, "semflow bench kv-quality: --preset has no weight files; add --load-format dummy\n");
        return 2;
    }
    sf_error err = { 0 };
    sf_model *m = NULL;
    sf_backend *b = NULL;
    int32_t **ids = NULL;
    int *lens = NULL, n = 0, rc = 1;
    char path[1100];
    if (a.preset) snprintf(path, sizeof path, "preset:%s", a.preset);
    else snprintf(path, sizeof path, "%s", a.model);
    sf_load_opts lo = { .dummy = a.dummy, .seed = 1, .progress = 1 };
    sf_backend_opts bo = { .name = a.backend, .n_threads = a.threads };
    sf_kvq_opts qo = { .n_gen = a.gen, .chunk = a.chunk };
    sf_kvq_stats st;
    if (sf_model_load(path, &lo, &m, &err) || sf_backend_open(&bo, &b, &err) ||
        load_prompts(&a, m, &ids, &lens, &n, &err) ||
        sf_kvq_run(b, m, (const int32_t *const *)ids, lens, n, &qo, &st, &err)) {
        fprintf(stderr, "semflow bench kv-quality: %s\n", err.msg);
        goto cleanup;
    }
    const char *kv_full = strcmp(b->ops->name, "cpu") ? "bf16" : "f32";
    if (a.json) {
        json_t *j = json_pack("{s:s, s:s, s:b, s:s, s:s, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:I, s:I, s:i, s:I, s:I, s:f, s:f}",
                              "mode", "kv-quality", "model", m->name, "random_weights", m->random_weights,
                              "backend", b->ops->name, "kv_full", kv_full, "prompts", st.n_prompts,
                              "positions", st.n_positions, "vocab", m->cfg.vocab_size, "max_abs_dlogit", st.max_abs,
                              "mean_abs_dlogit", st.mean_abs, "rel_l2", st.rel_l2, "top1_agreement", st.top1,
                              "greedy_same", (json_int_t)st.greedy_same, "greedy_total", (json_int_t)st.greedy_total,
                              "greedy_prefix_min", st.prefix_min, "kv_bytes_per_token_full", (json_int_t)st.kv_bytes_full,
                              "kv_bytes_per_token_int8", (json_int_t)st.kv_bytes_i8, "seconds_full", st.s_full,
                              "seconds_int8", st.s_i8);
        json_object_set_new(j, "floor_max_abs_dlogit", json_real(st.floor_max_abs));
        json_object_set_new(j, "floor_rel_l2", json_real(st.floor_rel_l2));
        json_object_set_new(j, "floor_top1_agreement", json_real(st.floor_top1));
        json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(j);
    } else {
        printf("kv-quality  %s%s, backend %s: %s KV vs INT8 KV (per token per kv head scales)\n", m->name,
               m->random_weights ? " (random weights)" : "", b->ops->name, kv_full);
        printf("positions   %d prompts x %d generated positions = %d (vocabulary %d), teacher-forced\n", st.n_prompts,
               a.gen, st.n_positions, m->cfg.vocab_size);
        printf("logits      max |d| %.4g, mean |d| %.4g, relative L2 %.3g\n", st.max_abs, st.mean_abs, st.rel_l2);
        printf("top-1       %.1f%% of positions agree\n", 100 * st.top1);
        printf("floor       %s KV again, prompt one token per step (only rounding differs): max |d| %.4g, "
               "relative L2 %.3g, top-1 %.1f%%\n", kv_full, st.floor_max_abs, st.floor_rel_l2, 100 * st.floor_top1);
        printf("greedy      %ld of %ld free-running tokens identical (%.1f%%); shortest identical prefix %d\n",
               st.greedy_same, st.greedy_total, 100.0 * st.greedy_same / st.greedy_total, st.prefix_min);
        printf("memory      KV bytes per token: %zu in %s, %zu in INT8 with its scales (%.2fx less); in the pool an\n"
               "            INT8 block takes half a full block\n", st.kv_bytes_full, kv_full, st.kv_bytes_i8,
               (double)st.kv_bytes_full / st.kv_bytes_i8);
    }
    rc = 0;
cleanup:
    for (int i = 0; ids && i < n; i++) free(ids[i]);
    free(ids);
    free(lens);
    sf_backend_close(b);
    sf_model_free(m);
    return rc;
}
