/* cmd_generate.c — `semflow generate`: one prompt through the engine, the continuation streamed
 * to stdout as it is produced, timing to stderr. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/gbnf.h"
#include "engine/json_mask.h"
#include "engine/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: semflow generate --model M --prompt P [options]\n"
            "\n"
            "  --model M           Hugging Face folder, .gguf file, or \"demo\"\n"
            "  --prompt P          the prompt text\n"
            "  --max-tokens N      output tokens at most (default 128; 0: up to the context)\n"
            "  --temperature T     0 is greedy (default 0.8)\n"
            "  --top-p P           nucleus sampling, (0, 1] (default 1: off)\n"
            "  --top-k K           keep the K most likely tokens (default 0: off)\n"
            "  --min-p P           drop tokens below P x the top probability (default 0: off)\n"
            "  --seed S            same seed, same text (default: from the clock)\n"
            "  --stop S            stop before this text (repeatable, up to %d)\n"
            "  --ignore-eos        keep going after the end-of-sequence token\n"
            "  --json              the output is one JSON object (JSON mode)\n"
            "  --json-schema S     ... one that the JSON Schema S describes (a file, or the schema itself\n"
            "                      when S starts with '{'; the subset in docs/API.md)\n"
            "  --regex P           the whole output matches the regular expression P (Python's syntax,\n"
            "                      less back-references and lookarounds: docs/API.md)\n"
            "  --grammar G         ... the GBNF grammar G (llama.cpp's format, without recursion)\n"
            "  --grammar-file F    ... the GBNF grammar in file F\n"
            "  --backend B         auto | cpu | cuda (default auto)\n"
            "  --threads N         CPU backend threads (default: all cores)\n"
            "  --max-model-len N   context length cap (default: the model's)\n"
            "  --chat              wrap the prompt in the model's chat template\n"
            "  --no-special        do not add BOS / special tokens to the prompt\n"
            "  --load-format F     auto | dummy (random weights from config.json)\n"
            "  --tensor-parallel-size N  split the model over N rank processes / GPUs (default 1)\n"
            "  --speculative-config J  n-gram speculative decoding, vLLM's JSON: {\"method\": \"ngram\",\n"
            "                      \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}\n",
            SF_MAX_STOP);
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    return sf_cli_long("generate", flag, s, lo, hi, out);
}

static int parse_float(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "semflow generate: %s '%s' is not a number in [%g, %g]\n", flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* State shared between the engine thread (callback) and main. */
typedef struct gen_state {
    pthread_mutex_t mu;
    pthread_cond_t done_cv;
    int done;
    sf_event last;            /* the SF_EV_DONE / SF_EV_ERROR event (text pointers not kept) */
    char message[512];
    int ends_with_newline;
    int wrote;
} gen_state;

static void on_event(const sf_event *ev)
{
    gen_state *g = ev->user;
    if ((ev->type == SF_EV_TOKEN || ev->type == SF_EV_DONE) && ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        g->wrote = 1;
        g->ends_with_newline = ev->text[ev->text_len - 1] == '\n';
    }
    if (ev->type == SF_EV_DONE || ev->type == SF_EV_ERROR) {
        pthread_mutex_lock(&g->mu);
        g->last = *ev;
        g->last.text = NULL;
        g->last.message = NULL;
        if (ev->type == SF_EV_ERROR) snprintf(g->message, sizeof g->message, "%s", ev->message);
        g->done = 1;
        pthread_cond_signal(&g->done_cv);
        pthread_mutex_unlock(&g->mu);
    }
}

static volatile sig_atomic_t interrupted;
static void on_sigint(int sig) { (void)sig; interrupted = 1; }

static const char *finish_name(int r)
{
    switch (r) {
    case SF_FINISH_STOP: return "stop";
    case SF_FINISH_LENGTH: return "length";
    case SF_FINISH_CANCELLED: return "cancelled";
    default: return "error";
    }
}

int sf_cmd_generate(int argc, char **argv)
{
    sf_engine_config cfg;
    sf_sampling sp;
    const char *model = NULL, *prompt = NULL;
    int chat = 0, add_special = 1, rc = 1;
    sf_engine *e = NULL;
    int32_t *ids = NULL;
    char *rendered = NULL, *schema = NULL;
    const char *schema_arg = NULL, *regex_arg = NULL, *grammar_arg = NULL;
    int grammar_file = 0;
    char *grammar_rx = NULL;
    size_t n_ids = 0;
    sf_error err = { 0 };
    gen_state g = { .mu = PTHREAD_MUTEX_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER };

    sf_engine_config_default(&cfg);
    sf_sampling_default(&sp);
    sp.temperature = 0.8f;
    sp.max_tokens = 128;
    cfg.max_num_seqs = 1;
    cfg.max_batched_tokens = 512;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        int is_flag_only = !strcmp(a, "--chat") || !strcmp(a, "--no-special") || !strcmp(a, "--ignore-eos") ||
                           !strcmp(a, "--json");
        if (is_flag_only) {
            if (!strcmp(a, "--chat")) chat = 1;
            else if (!strcmp(a, "--no-special")) add_special = 0;
            else if (!strcmp(a, "--json")) sp.json = 1;
            else sp.ignore_eos = 1;
            continue;
        }
        if (strncmp(a, "--", 2)) {
            fprintf(stderr, "semflow generate: unexpected argument '%s' (the prompt goes after --prompt)\n", a);
            return 2;
        }
        static const char *const with_value[] = { "--model", "--prompt", "--max-tokens", "--temperature", "--top-p",
                                                  "--top-k", "--min-p", "--seed", "--stop", "--backend", "--threads",
                                                  "--max-model-len", "--load-format", "--tensor-parallel-size",
                                                  "--json-schema", "--regex", "--grammar", "--grammar-file",
                                                  "--speculative-config" };
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "semflow generate: unknown option '%s' (see semflow generate --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "semflow generate: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long l;
        double d;
        int ef = sf_cli_engine_flag("generate", a, v, &cfg);
        if (ef < 0) return 2;
        if (ef) continue;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--max-tokens")) {
            if (parse_long(a, v, 0, 1 << 30, &l)) return 2;
            sp.max_tokens = (int)l;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_float(a, v, 0, 100, &d)) return 2;
            sp.temperature = (float)d;
        } else if (!strcmp(a, "--top-p")) {
            if (parse_float(a, v, 1e-9, 1, &d)) return 2;
            sp.top_p = (float)d;
        } else if (!strcmp(a, "--top-k")) {
            if (parse_long(a, v, 0, 1 << 30, &l)) return 2;
            sp.top_k = (int)l;
        } else if (!strcmp(a, "--min-p")) {
            if (parse_float(a, v, 0, 1, &d)) return 2;
            sp.min_p = (float)d;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') {
                fprintf(stderr, "semflow generate: --seed '%s' is not a non-negative integer\n", v);
                return 2;
            }
            sp.seed = s;
            sp.has_seed = 1;
        } else if (!strcmp(a, "--stop")) {
            if (sp.n_stop == SF_MAX_STOP) {
                fprintf(stderr, "semflow generate: at most %d --stop strings\n", SF_MAX_STOP);
                return 2;
            }
            if (!*v) {
                fprintf(stderr, "semflow generate: --stop needs a non-empty string\n");
                return 2;
            }
            sp.stop[sp.n_stop++] = (char *)v;
        } else if (!strcmp(a, "--tensor-parallel-size")) {
            if (parse_long(a, v, 1, 64, &l)) return 2;
            cfg.tensor_parallel = (int)l;
        } else if (!strcmp(a, "--max-model-len")) {
            if (parse_long(a, v, 2, 1 << 24, &l)) return 2;
            cfg.max_model_len = (int)l;
        } else if (!strcmp(a, "--json-schema")) {
            schema_arg = v;
        } else if (!strcmp(a, "--regex")) {
            regex_arg = v;
        } else if (!strcmp(a, "--grammar") || !strcmp(a, "--grammar-file")) {
            grammar_arg = v;
            grammar_file = !strcmp(a, "--grammar-file");
        } else {
            fprintf(stderr, "semflow generate: unknown option '%s' (see semflow generate --help)\n", a);
            return 2;
        }
    }
    if (!model || !prompt) {
        fprintf(stderr, "semflow generate: %s is required\n", !model ? "--model" : "--prompt");
        usage(stderr);
        return 2;
    }
    if (!!(schema_arg || sp.json) + !!regex_arg + !!grammar_arg > 1) {
        fprintf(stderr, "semflow generate: give one of --json / --json-schema, --regex and --grammar, not both\n");
        return 2;
    }
    if (grammar_arg) { /* written out as a pattern, checked before the model loads */
        char *text = NULL;
        size_t n = strlen(grammar_arg);
        if (grammar_file && sf_read_file(grammar_arg, &text, &n, &err) != SF_OK) {
            fprintf(stderr, "semflow generate: --grammar-file: %s\n", err.msg);
            return 2;
        }
        int rc = sf_gbnf_to_regex(text ? text : grammar_arg, n, &grammar_rx, &err);
        free(text);
        if (rc != SF_OK) {
            fprintf(stderr, "semflow generate: %s: %s\n", grammar_file ? "--grammar-file" : "--grammar", err.msg);
            return 2;
        }
        regex_arg = grammar_rx;
    }
    if (regex_arg) { /* checked before the model loads */
        sf_jschema *c = NULL;
        if (sf_jschema_regex(regex_arg, strlen(regex_arg), &c, &err) != SF_OK) {
            fprintf(stderr, "semflow generate: %s: %s%s\n", grammar_arg ? "--grammar" : "--regex", err.msg,
                    grammar_arg ? " (the grammar written out as one pattern)" : "");
            free(grammar_rx);
            return 2;
        }
        sf_jschema_free(c);
        sp.json = sp.regex = 1;
        sp.schema = regex_arg;
        sp.schema_len = strlen(regex_arg);
    }
    if (schema_arg) { /* the schema itself, or a file holding it; checked before the model loads */
        size_t n = 0;
        sf_jschema *c = NULL;
        if (schema_arg[0] == '{' ? !(schema = strdup(schema_arg)) && sf_err(&err, SF_ENOMEM, "out of memory")
                                 : sf_read_file(schema_arg, &schema, &n, &err) != SF_OK) {
            fprintf(stderr, "semflow generate: --json-schema: %s\n", err.msg);
            return 2;
        }
        if (sf_jschema_compile(schema, strlen(schema), &c, &err) != SF_OK) {
            fprintf(stderr, "semflow generate: --json-schema: %s\n", err.msg);
            free(schema);
            return 2;
        }
        sf_jschema_free(c);
        sp.json = 1;
        sp.schema = schema;
        sp.schema_len = strlen(schema);
    }
    cfg.model = model;
    cfg.progress = isatty(2);

    double t0 = sf_now_s();
    if (sf_engine_new(&cfg, &e, &err) != SF_OK) {
        fprintf(stderr, "semflow generate: %s\n", err.msg);
        return 1;
    }
    double t_load = sf_now_s() - t0;
    sf_engine_info info;
    sf_engine_get_info(e, &info);
    if (info.random_weights)
        fprintf(stderr, "semflow: model '%s' has random weights: the generated text is meaningless\n",
                info.model_name);
    const sf_tokenizer *tok = sf_engine_tokenizer(e);
    if (!tok) {
        fprintf(stderr, "semflow generate: model '%s' has no tokenizer (tokenizer.json); generate needs one\n",
                info.model_name);
        goto out;
    }
    const char *text = prompt;
    if (chat) {
        sf_chat_msg msg = { "user", prompt };
        if (sf_chat_render(tok, SF_CHAT_AUTO, &msg, 1, 1, &rendered, &err) != SF_OK) {
            fprintf(stderr, "semflow generate: applying the chat template: %s\n", err.msg);
            goto out;
        }
        text = rendered;
        add_special = 0; /* the template carries its own special tokens, as apply_chat_template does */
    }
    if (sf_tok_encode(tok, text, strlen(text), add_special, &ids, &n_ids, &err) != SF_OK) {
        fprintf(stderr, "semflow generate: tokenizing the prompt: %s\n", err.msg);
        goto out;
    }
    if (n_ids == 0) {
        fprintf(stderr, "semflow generate: the prompt gives no tokens (empty with --no-special); write some text\n");
        rc = 2;
        goto out;
    }

    sf_submit sub;
    memset(&sub, 0, sizeof sub);
    sub.prompt = ids;
    sub.n_prompt = (int)n_ids;
    sub.sampling = sp;
    sub.intent.urgency = SF_URGENCY_NORMAL;
    snprintf(sub.intent.cls, sizeof sub.intent.cls, "cli");
    sub.cb = on_event;
    sub.user = &g;
    sf_request *req = NULL;
    double retry;
    struct sigaction sa = { 0 }, old_sa;
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, &old_sa);
    if (sf_engine_submit(e, &sub, &req, &retry, &err) != SF_OK) {
        fprintf(stderr, "semflow generate: %s\n", err.msg);
        rc = err.code == SF_EINVAL ? 2 : 1;
        sigaction(SIGINT, &old_sa, NULL);
        goto out;
    }
    pthread_mutex_lock(&g.mu);
    int cancelled = 0;
    while (!g.done) {
        if (interrupted && !cancelled) {
            sf_engine_cancel(e, req); /* req stays valid until its DONE callback returned */
            cancelled = 1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g.done_cv, &g.mu, &ts);
    }
    pthread_mutex_unlock(&g.mu);
    sigaction(SIGINT, &old_sa, NULL);
    if (g.wrote && !g.ends_with_newline) fputc('\n', stdout);
    fflush(stdout);

    if (g.last.type == SF_EV_ERROR) {
        fprintf(stderr, "semflow generate: %s\n", g.message);
        goto out;
    }
    const sf_event *d = &g.last;
    double decode_s = d->e2e_s - d->ttft_s;
    int decoded = d->completion_tokens > 1 ? d->completion_tokens - 1 : 0;
    fprintf(stderr,
            "semflow: %s on %s | load %.2f s | prompt %d tokens, TTFT %.1f ms (prefill %.1f tokens/s) | "
            "%d tokens in %.2f s (decode %.1f tokens/s) | finish: %s\n",
            info.model_name, info.backend, t_load, d->prompt_tokens, d->ttft_s * 1e3,
            d->ttft_s > 0 ? d->prompt_tokens / d->ttft_s : 0.0, d->completion_tokens, d->e2e_s,
            decoded && decode_s > 0 ? decoded / decode_s : 0.0, finish_name(d->finish_reason));
    if (cfg.spec_tokens > 0) {
        sf_engine_stats st;
        sf_engine_get_stats(e, &st);
        fprintf(stderr, "semflow: speculative (n-gram) | %llu steps with drafts | %llu of %llu draft tokens accepted "
                "(%.1f%%) | %.2f tokens a step\n", (unsigned long long)st.spec_steps,
                (unsigned long long)st.spec_accepted_tokens, (unsigned long long)st.spec_draft_tokens,
                st.spec_draft_tokens ? 100.0 * st.spec_accepted_tokens / st.spec_draft_tokens : 0.0,
                st.steps ? (double)d->completion_tokens / (double)st.steps : 0.0);
    }
    rc = d->finish_reason == SF_FINISH_CANCELLED ? 130 : 0;
out:
    sf_engine_free(e);
    free(ids);
    free(rendered);
    free(schema);
    free(grammar_rx);
    return rc;
}
