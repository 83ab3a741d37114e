/* cmd_perplexity.c — `semflow perplexity`: a text's perplexity under the model, as llama.cpp's
 * perplexity tool measures it: the tokens cut into windows of --ctx, each window (a BOS first
 * when the tokenizer has one) scored by the engine (sampling.prompt_logprobs, no output), and
 * the negative log-likelihood of the second half of each window averaged, so that every scored
 * token has at least ctx / 2 tokens before it. The windows go to the engine at once, so they run
 * in batches like any other requests. Prints the running estimate after each window and the
 * result with its standard error. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow perplexity --model M --file F [options]\n"
               "\n"
               "  --model M            Hugging Face folder, .gguf file, or \"demo\"\n"
               "  --file F             the text (UTF-8)\n"
               "  --ctx N              tokens per window (default 512); the second half of each is scored\n"
               "  --max-windows N      score at most N windows (default: all)\n"
               "  --max-num-seqs N     windows in flight at once (default 16)\n"
               "  --max-logit-rows N   positions scored per engine step (default 512)\n"
               "  --backend B          auto | cpu | cuda (default auto)\n"
               "  --threads N          CPU backend threads (default: all cores)\n"
               "  --load-format F      auto | dummy (random weights from config.json: a measurement)\n"
               "  --json               print the result as one JSON object\n");
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out)
{
    return sf_cli_long("perplexity", flag, s, lo, hi, out);
}

/* One window's scores, written by the engine thread. */
typedef struct window {
    int first, n;             /* positions scored: [first, n) */
    double nll;               /* their summed negative log-likelihood */
    int done, failed;
    char message[256];
} window;

typedef struct ppl_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_done;
} ppl_state;

static ppl_state st = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };

static void on_event(const sf_event *ev)
{
    window *w = ev->user;
    if (ev->type == SF_EV_PROMPT) {
        double s = 0;
        for (int i = w->first; i < w->n && i < ev->n_prompt_lp; i++) s -= ev->prompt_lp[i];
        w->nll = s;
        return;
    }
    if (ev->type != SF_EV_DONE && ev->type != SF_EV_ERROR) return;
    pthread_mutex_lock(&st.mu);
    if (ev->type == SF_EV_ERROR) {
        w->failed = 1;
        snprintf(w->message, sizeof w->message, "%s", ev->message ? ev->message : "error");
    }
    w->done = 1;
    st.n_done++;
    pthread_cond_broadcast(&st.cv);
    pthread_mutex_unlock(&st.mu);
}

int sf_cmd_perplexity(int argc, char **argv)
{
    sf_engine_config cfg;
    sf_engine_config_default(&cfg);
    cfg.max_num_seqs = 16;
    cfg.max_logits = 512;
    const char *model = NULL, *file = NULL;
    long ctx = 512, max_windows = 0;
    int json = 0, rc = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (strncmp(a, "--", 2)) {
            fprintf(stderr, "semflow perplexity: unexpected argument '%s' (the text goes in --file)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "semflow perplexity: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long l;
        int ef = sf_cli_engine_flag("perplexity", a, v, &cfg);
        if (ef < 0) return 2;
        if (ef) continue;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--file")) file = v;
        else if (!strcmp(a, "--ctx")) {
            if (parse_long(a, v, 4, 1 << 20, &ctx)) return 2;
        } else if (!strcmp(a, "--max-windows")) {
            if (parse_long(a, v, 1, 1 << 30, &max_windows)) return 2;
        } else if (!strcmp(a, "--max-num-seqs")) {
            if (parse_long(a, v, 1, 4096, &l)) return 2;
            cfg.max_num_seqs = (int)l;
        } else if (!strcmp(a, "--max-logit-rows")) {
            if (parse_long(a, v, 1, 65536, &l)) return 2;
            cfg.max_logits = (int)l;
        } else {
            fprintf(stderr, "semflow perplexity: unknown option '%s' (see semflow perplexity --help)\n", a);
            return 2;
        }
    }
    if (!model || !file) {
        fprintf(stderr, "semflow perplexity: %s is required\n", !model ? "--model" : "--file");
        usage(stderr);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    sf_error err = { 0 };
    if (sf_read_file(file, &text, &len, &err) != SF_OK) {
        fprintf(stderr, "semflow perplexity: %s\n", err.msg);
        return 2;
    }
    cfg.model = model;
    cfg.max_model_len = (int)ctx + 1; /* a window is ctx tokens; the engine keeps room for one more */
    cfg.max_batched_tokens = SF_MAX(SF_MAX(2048, cfg.max_num_seqs), cfg.max_logits);
    cfg.progress = isatty(2);
    sf_engine *e = NULL;
    int32_t *ids = NULL, *buf = NULL;
    window *w = NULL;
    size_t n_ids = 0;
    if (sf_engine_new(&cfg, &e, &err) != SF_OK) {
        fprintf(stderr, "semflow perplexity: %s\n", err.msg);
        goto out;
    }
    sf_engine_info info;
    sf_engine_get_info(e, &info);
    const sf_tokenizer *tok = sf_engine_tokenizer(e);
    if (!tok) {
        fprintf(stderr, "semflow perplexity: model '%s' has no tokenizer; perplexity needs one\n", info.model_name);
        goto out;
    }
    if (info.random_weights)
        fprintf(stderr, "semflow: model '%s' has random weights: its perplexity is that of noise\n", info.model_name);
    if (sf_tok_encode(tok, text, len, 0, &ids, &n_ids, &err) != SF_OK) {
        fprintf(stderr, "semflow perplexity: tokenizing %s: %s\n", file, err.msg);
        rc = 2;
        goto out;
    }
    /* windows of ctx tokens: a BOS, then ctx - 1 of the text's (ctx of them without a BOS) */
    const int32_t bos = sf_tok_bos(tok);
    const int body = (int)ctx - (bos >= 0);
    long n_win = (long)n_ids / body;
    if (max_windows && n_win > max_windows) n_win = max_windows;
    if (n_win < 1) {
        fprintf(stderr, "semflow perplexity: %s has %zu tokens; one window of --ctx %ld needs %d: lower --ctx or give "
                "more text\n", file, n_ids, ctx, body);
        rc = 2;
        goto out;
    }
    w = calloc((size_t)n_win, sizeof *w);
    buf = malloc((size_t)n_win * (size_t)ctx * sizeof *buf);
    if (!w || !buf) {
        fprintf(stderr, "semflow perplexity: out of memory for %ld windows\n", n_win);
        goto out;
    }
    const int wl = (int)ctx; /* tokens in a window */
    double t0 = sf_now_s();
    for (long k = 0; k < n_win; k++) {
        int32_t *p = buf + (size_t)k * ctx;
        int o = 0;
        if (bos >= 0) p[o++] = bos;
        memcpy(p + o, ids + (size_t)k * body, (size_t)(wl - o) * sizeof *p);
        w[k].first = wl / 2;
        w[k].n = wl;
        sf_submit s;
        memset(&s, 0, sizeof s);
        s.prompt = p;
        s.n_prompt = wl;
        sf_sampling_default(&s.sampling);
        s.sampling.prompt_logprobs = -1;
        s.sampling.prompt_score_from = w[k].first;
        s.sampling.prompt_only = 1;
        s.intent.urgency = SF_URGENCY_LOW;
        snprintf(s.intent.cls, sizeof s.intent.cls, "perplexity");
        s.cb = on_event;
        s.user = &w[k];
        double retry;
        int src;
        while ((src = sf_engine_submit(e, &s, NULL, &retry, &err)) == SF_AGAIN) usleep(10000); /* its queue is full */
        if (src != SF_OK) {
            fprintf(stderr, "semflow perplexity: window %ld: %s\n", k + 1, err.msg);
            n_win = k; /* wait for those submitted, then stop */
            break;
        }
    }
    /* the running estimate, in window order, as windows finish */
    double nll = 0, nll2 = 0;
    long scored = 0, shown = 0;
    for (long k = 0; k < n_win; k++) {
        pthread_mutex_lock(&st.mu);
        while (!w[k].done) pthread_cond_wait(&st.cv, &st.mu);
        pthread_mutex_unlock(&st.mu);
        if (w[k].failed) {
            fprintf(stderr, "semflow perplexity: window %ld failed: %s\n", k + 1, w[k].message);
            goto out;
        }
        const int m = w[k].n - w[k].first;
        nll += w[k].nll;
        nll2 += w[k].nll * w[k].nll / m; /* per-window means, for the spread across windows */
        scored += m;
        if (!json) {
            fprintf(stdout, "%s[%ld]%.4f", shown++ % 8 ? " " : (k ? "\n" : ""), k + 1, exp(nll / (double)scored));
            fflush(stdout);
        }
    }
    double secs = sf_now_s() - t0;
    double mean = nll / (double)scored;
    /* the standard error of the mean NLL from the spread of the windows' means (llama.cpp
     * reports the per-token one; windows are what is independent here), carried to the
     * perplexity by its derivative */
    const long n = n_win;
    double var = n > 1 ? (nll2 / (double)(scored / n) - n * mean * mean) / (double)(n - 1) : 0;
    double se = n > 1 && var > 0 ? sqrt(var / (double)n) * exp(mean) : 0;
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f}", "model", info.model_name, "backend",
                              info.backend, "ctx", (json_int_t)ctx, "windows", (json_int_t)n, "tokens_scored",
                              (json_int_t)scored, "nll_mean", mean, "perplexity", exp(mean), "stderr", se, "seconds",
                              secs, "tokens_per_s", (double)n * wl / (secs > 0 ? secs : 1e-9));
        char *js = o ? json_dumps(o, 0) : NULL;
        if (js) puts(js);
        free(js);
        json_decref(o);
    } else {
        printf("\nsemflow: %s on %s | %ld windows of %d tokens, %ld scored | perplexity %.4f +/- %.4f | %.2f s "
               "(%.0f tokens/s)\n",
               info.model_name, info.backend, n, wl, scored, exp(mean), se, secs, (double)n * wl / (secs > 0 ? secs : 1e-9));
        printf("Final estimate: PPL = %.4f +/- %.5f\n", exp(mean), se); /* llama.cpp's last line, for its scripts */
    }
    rc = 0;
out:
    sf_engine_free(e); /* cancels what still runs; callbacks end before it returns */
    free(w);
    free(buf);
    free(ids);
    free(text);
    return rc;
}
