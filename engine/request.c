/* request.c — a request's life inside the engine: validation and copy at submit, then (engine
 * thread) sampled token → detokenized text → stop checks → events. See request.h. */
#include "request.h"

#include "kernels/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SF_MAX_STOP_LEN 256

static int check_submit(const sf_submit *s, int vocab, int max_model_len, sf_error *err)
{
    const sf_sampling *p = &s->sampling;
    if (!s->cb) return sf_err(err, SF_EINVAL, "submit: no event callback given");
    if (!s->prompt || s->n_prompt < 1)
        return sf_err(err, SF_EINVAL, "the prompt is empty: give at least one token");
    if (s->n_prompt > max_model_len - 1)
        return sf_err(err, SF_EINVAL,
                      "the prompt has %d tokens but the context holds %d (at most %d prompt tokens, leaving "
                      "room for one output token); shorten the prompt or raise --max-model-len",
                      s->n_prompt, max_model_len, max_model_len - 1);
    for (int i = 0; i < s->n_prompt; i++)
        if (s->prompt[i] < 0 || s->prompt[i] >= vocab)
            return sf_err(err, SF_EINVAL, "prompt token %d at position %d is outside the vocabulary [0, %d)",
                          s->prompt[i], i, vocab);
    if (s->intent.urgency < SF_URGENCY_LOW || s->intent.urgency > SF_URGENCY_HIGH)
        return sf_err(err, SF_EINVAL, "urgency %d is not low (0), normal (1) or high (2)", s->intent.urgency);
    if (s->intent.max_latency_ms < 0)
        return sf_err(err, SF_EINVAL, "max latency %d ms is negative (0 means none)", s->intent.max_latency_ms);
    if (!(s->intent.min_tps >= 0))
        return sf_err(err, SF_EINVAL, "min throughput %g tokens/s is negative (0 means none)", s->intent.min_tps);
    if (p->n_stop < 0 || p->n_stop > SF_MAX_STOP)
        return sf_err(err, SF_EINVAL, "%d stop strings: at most %d are allowed", p->n_stop, SF_MAX_STOP);
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n == 0) return sf_err(err, SF_EINVAL, "stop string %d is empty", i);
        if (n > SF_MAX_STOP_LEN)
            return sf_err(err, SF_EINVAL, "stop string %d is %zu bytes long: at most %d", i, n, SF_MAX_STOP_LEN);
    }
    if (p->min_tokens < 0 || (p->max_tokens > 0 && p->min_tokens > p->max_tokens))
        return sf_err(err, SF_EINVAL, "min_tokens %d must be from 0 to max_tokens (%d)", p->min_tokens, p->max_tokens);
    if (p->prompt_score_from < 0)
        return sf_err(err, SF_EINVAL, "prompt_score_from %d is negative", p->prompt_score_from);
    if (p->prompt_logprobs > SF_MAX_LOGPROBS)
        return sf_err(err, SF_EINVAL, "prompt_logprobs %d is more than %d", p->prompt_logprobs, SF_MAX_LOGPROBS);
    if (p->n_stop_ids < 0 || p->n_stop_ids > SF_MAX_STOP)
        return sf_err(err, SF_EINVAL, "%d stop token ids: at most %d are allowed", p->n_stop_ids, SF_MAX_STOP);
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] < 0 || p->stop_ids[i] >= vocab)
            return sf_err(err, SF_EINVAL, "stop token id %d is outside the vocabulary [0, %d)", p->stop_ids[i], vocab);
    return SF_OK;
}

int sf_request_new(const sf_submit *s, const sf_tokenizer *tok, int vocab, int max_model_len,
                   sf_request **out, sf_error *err)
{
    sf_request *r = NULL;
    int rc;
    *out = NULL;
    if ((rc = check_submit(s, vocab, max_model_len, err)) != SF_OK) return rc;
    r = calloc(1, sizeof *r);
    if (!r) return sf_err(err, SF_ENOMEM, "submit: out of memory");
    r->t_submit = sf_now_s();
    r->sp = s->sampling;
    for (int i = 0; i < SF_MAX_STOP; i++) r->sp.stop[i] = NULL;
    r->sp.bias = NULL; /* the sampler refuses a count out of range (a list it would not find) */
    if (r->sp.n_bias > 0 && r->sp.n_bias <= SF_MAX_LOGIT_BIAS && s->sampling.bias) {
        sf_logit_bias *b = malloc((size_t)r->sp.n_bias * sizeof *b);
        if (!b) {
            rc = sf_err(err, SF_ENOMEM, "submit: out of memory");
            goto fail;
        }
        memcpy(b, s->sampling.bias, (size_t)r->sp.n_bias * sizeof *b);
        r->sp.bias = b;
    }
    for (int i = 0; i < s->sampling.n_stop; i++) {
        if (!(r->sp.stop[i] = strdup(s->sampling.stop[i]))) {
            rc = sf_err(err, SF_ENOMEM, "submit: out of memory");
            goto fail;
        }
    }
    if ((r->sp.choice || r->sp.regex) && (!r->sp.json || !r->sp.schema || (r->sp.choice && r->sp.regex))) {
        rc = sf_err(err, SF_EINVAL, "a choice or a pattern needs json and its list or pattern as schema, not both");
        goto fail;
    }
    if (r->sp.json) { /* the mask's only way out is an end-of-sequence token, drawn when the object is done */
        const char *what = r->sp.choice ? "guided_choice" : r->sp.regex ? "guided_regex / guided_grammar" : "a JSON response_format";
        if (!tok || sf_tok_eos(tok) < 0) {
            rc = sf_err(err, SF_EINVAL, "%s needs the model's tokenizer and its end-of-sequence token", what);
            goto fail;
        }
        if (r->sp.ignore_eos || r->sp.min_tokens > 0) {
            rc = sf_err(err, SF_EINVAL, "%s cannot be combined with %s", what, r->sp.ignore_eos ? "ignore_eos" : "min_tokens");
            goto fail;
        }
        if (r->sp.schema && (rc = r->sp.choice  ? sf_jschema_choice(r->sp.schema, r->sp.schema_len, &r->schema, err)
                                  : r->sp.regex ? sf_jschema_regex(r->sp.schema, r->sp.schema_len, &r->schema, err)
                                                : sf_jschema_compile(r->sp.schema, r->sp.schema_len, &r->schema, err)) != SF_OK)
            goto fail;
        sf_json_init(&r->json, r->schema);
    }
    r->sp.schema = NULL; /* the caller's */
    if ((rc = sf_sampler_seq_init(&r->ss, &r->sp, vocab, s->prompt, s->n_prompt, err)) != SF_OK) goto fail;
    if (r->sp.min_tokens > 0) { /* what ends the output is not drawn before min_tokens */
        int32_t ban[SF_SS_MAX_BAN];
        int n = 0;
        for (int i = 0; i < r->sp.n_stop_ids && n < SF_SS_MAX_BAN; i++) ban[n++] = r->sp.stop_ids[i];
        const int tv = tok ? SF_MIN(sf_tok_vocab_size(tok), vocab) : 0;
        for (int32_t id = 0; !r->sp.ignore_eos && id < tv && n < SF_SS_MAX_BAN; id++)
            if (sf_tok_is_eog(tok, id)) ban[n++] = id;
        sf_sampler_set_ban(&r->ss, ban, n, vocab);
    }
    if ((rc = sf_seq_init(&r->seq, s->prompt, s->n_prompt, err)) != SF_OK) goto fail;
    r->seq.owner = r;
    if (r->sp.prompt_logprobs && s->n_prompt > 1) { /* positions 0 .. n - 2 score the tokens after them */
        r->plk = SF_MAX(r->sp.prompt_logprobs, 0);
        r->plp = malloc((size_t)s->n_prompt * sizeof *r->plp);
        r->prank = calloc((size_t)s->n_prompt, sizeof *r->prank);
        r->ptop = r->plk ? calloc((size_t)s->n_prompt * (size_t)r->plk, sizeof *r->ptop) : NULL;
        if (!r->plp || !r->prank || (r->plk && !r->ptop)) {
            rc = sf_err(err, SF_ENOMEM, "submit: out of memory for the prompt's %d logprobs", s->n_prompt);
            goto fail;
        }
        for (int i = 0; i < s->n_prompt; i++) r->plp[i] = NAN;
        r->seq.score_from = SF_MIN(SF_MAX(r->sp.prompt_score_from - 1, 0), s->n_prompt - 1);
        r->seq.score_to = s->n_prompt - 1;
    }
    r->seq.urgency = s->intent.urgency;
    r->seq.deadline = s->intent.max_latency_ms > 0 ? r->t_submit + s->intent.max_latency_ms * 1e-3 : INFINITY;
    r->seq.max_latency_ms = s->intent.max_latency_ms;
    r->seq.min_tps = s->intent.min_tps;
    r->seq.t_submit = r->t_submit;
    long max_out = r->sp.prompt_only ? 1 : r->sp.max_tokens > 0 ? r->sp.max_tokens : max_model_len;
    r->seq.max_len = (int)SF_MIN((long)max_model_len, (long)s->n_prompt + max_out);
    r->max_out = r->seq.max_len - s->n_prompt;
    r->tok = tok;
    if (tok) {
        /* The prompt is the detokenizer's context, so the first generated token decodes as a
         * continuation (" time", not "time" with the stream-start space stripped). */
        char *scratch = NULL;
        size_t scratch_len = 0;
        sf_detok_init(&r->detok, tok, !r->sp.keep_special);
        for (int i = 0; i < s->n_prompt; i++) sf_detok_push(&r->detok, s->prompt[i], &scratch, &scratch_len);
        free(scratch);
    }
    r->cb = s->cb;
    r->user = s->user;
    memcpy(r->tenant, s->tenant, sizeof r->tenant);
    r->tenant[sizeof r->tenant - 1] = 0;
    r->seq.group = s->group;
    r->seq.cache_salt = sf_hash_str(sf_hash_str(0x5345464c4f57ull, r->tenant), s->cache_salt ? s->cache_salt : "");
    atomic_init(&r->cancel, 0);
    *out = r;
    return SF_OK;
fail:
    sf_request_free(r);
    return rc;
}

void sf_request_free(sf_request *r)
{
    if (!r) return;
    for (int i = 0; i < SF_MAX_STOP; i++) free(r->sp.stop[i]);
    free((void *)r->sp.bias);
    sf_jschema_free(r->schema);
    sf_sampler_seq_free(&r->ss);
    sf_seq_free(&r->seq);
    free(r->plp);
    free(r->prank);
    free(r->ptop);
    if (r->tok) sf_detok_free(&r->detok);
    free(r->text);
    free(r);
}

/* ---- stop strings ----------------------------------------------------------------------- */

/* Earliest occurrence of any stop string in the pending text (none before min_tokens, as in
 * vLLM); 1 and the length of the text the output keeps if found: up to the stop string, or
 * through it with include_stop_str. */
static int find_stop(const sf_request *r, size_t *at)
{
    int hit = 0;
    size_t len = 0;
    if (!r->text_len || r->n_out < r->sp.min_tokens) return 0;
    for (int i = 0; i < r->sp.n_stop; i++) {
        const char *m = memmem(r->text, r->text_len, r->sp.stop[i], strlen(r->sp.stop[i]));
        if (m && (!hit || (size_t)(m - r->text) < *at)) {
            *at = (size_t)(m - r->text);
            len = strlen(r->sp.stop[i]);
            hit = 1;
        }
    }
    if (hit && r->sp.include_stop_str) *at += len;
    return hit;
}

/* Bytes at the end of the pending text that could be the start of a stop string. Those are
 * held back until later text shows whether the stop string follows. The text is whole UTF-8
 * sequences and a stop string begins with a lead byte, so the cut never splits a character. */
static size_t held_suffix(const sf_request *r)
{
    size_t keep = 0;
    if (!r->text_len) return 0;
    for (int i = 0; i < r->sp.n_stop; i++) {
        size_t n = strlen(r->sp.stop[i]);
        for (size_t k = SF_MIN(n - 1, r->text_len); k > keep; k--) {
            if (!memcmp(r->text + r->text_len - k, r->sp.stop[i], k)) {
                keep = k;
                break;
            }
        }
    }
    return keep;
}

/* ---- events ----------------------------------------------------------------------------- */

/* Cut the first n bytes off the pending text into a NUL-terminated string the event points at.
 * The returned buffer lives until the next call (the pending buffer itself is reused). */
static char *take_text(sf_request *r, size_t *len, char *small, size_t small_cap, char **heap)
{
    char *dst = small;
    size_t n = *len;
    if (n + 1 > small_cap) {
        *heap = malloc(n + 1);
        if (!*heap) n = small_cap - 1; /* out of memory: deliver what fits rather than nothing */
        else dst = *heap;
    }
    *len = n;
    dst[n] = 0;
    if (n) {
        memcpy(dst, r->text, n);
        memmove(r->text, r->text + n, r->text_len - n);
        r->text_len -= n;
    }
    return dst;
}

static void deliver_done(sf_request *r, int reason, int flush)
{
    char small[512], *heap = NULL, *text = small;
    size_t n = 0;
    small[0] = 0;
    if (flush && r->tok) {
        sf_detok_finish(&r->detok, &r->text, &r->text_len);
        size_t at;
        if (find_stop(r, &at)) {
            n = at;
            reason = SF_FINISH_STOP;
        } else {
            n = r->text_len;
        }
        text = take_text(r, &n, small, sizeof small, &heap);
    }
    double now = sf_now_s();
    sf_event ev = { 0 };
    ev.type = SF_EV_DONE;
    ev.req = r;
    ev.user = r->user;
    ev.token = -1;
    ev.text = text;
    ev.text_len = n;
    ev.finish_reason = reason;
    ev.prompt_tokens = r->seq.n_prompt;
    ev.completion_tokens = r->n_out;
    ev.cached_tokens = r->seq.n_cached;
    ev.e2e_s = now - r->t_submit;
    ev.ttft_s = r->n_out ? r->t_first - r->t_submit : ev.e2e_s;
    r->cb(&ev);
    free(heap);
}

void sf_request_finish(sf_request *r, int reason, int status, const char *message)
{
    if (status != SF_OK) {
        sf_event ev = { 0 };
        ev.type = SF_EV_ERROR;
        ev.req = r;
        ev.user = r->user;
        ev.token = -1;
        ev.status = status;
        ev.message = message ? message : sf_status_str(status);
        ev.text = "";
        r->cb(&ev);
        return;
    }
    deliver_done(r, reason, reason != SF_FINISH_CANCELLED);
}

void sf_request_score(sf_request *r, int pos, const float *row, int vocab)
{
    if (!r->plp || pos < 0 || pos + 1 >= r->seq.n_prompt) return;
    float lp, top_lp[SF_MAX_LOGPROBS];
    int32_t rank, top_id[SF_MAX_LOGPROBS];
    sf_cpu_score_row(row, vocab, r->seq.tokens[pos + 1], r->plk, &lp, &rank, top_id, top_lp); /* the score op's reference */
    sf_request_score_put(r, pos, lp, rank, top_id, top_lp, r->plk);
}

void sf_request_score_put(sf_request *r, int pos, float lp, int32_t rank, const int32_t *top_id, const float *top_lp,
                          int k)
{
    if (!r->plp || pos < 0 || pos + 1 >= r->seq.n_prompt) return;
    const int i = pos + 1;
    r->plp[i] = lp;
    r->prank[i] = rank;
    for (int j = 0; j < r->plk; j++)
        r->ptop[(size_t)i * r->plk + j] = j < k && top_id[j] >= 0 ? (sf_logprob){ top_id[j], top_lp[j] }
                                                                  : (sf_logprob){ -1, -INFINITY };
}

/* SF_EV_PROMPT, once, before anything else the request delivers after its prompt */
static void deliver_prompt(sf_request *r)
{
    if (!r->sp.prompt_logprobs || r->prompt_sent) return;
    r->prompt_sent = 1;
    float none = NAN;
    int32_t zero = 0;
    sf_event ev = { 0 };
    ev.type = SF_EV_PROMPT;
    ev.req = r;
    ev.user = r->user;
    ev.token = -1;
    ev.text = "";
    ev.n_prompt_lp = r->seq.n_prompt;
    ev.prompt_k = r->plk;
    ev.prompt_ids = r->seq.tokens;
    ev.prompt_lp = r->plp ? r->plp : &none;   /* a one-token prompt: position 0 alone */
    ev.prompt_rank = r->prank ? r->prank : &zero;
    ev.prompt_top = r->ptop;
    r->cb(&ev);
}

int sf_request_take(sf_request *r, int32_t id)
{
    if (r->sp.prompt_only) return SF_REQ_END_PROMPT;
    if (r->n_out++ == 0) r->t_first = sf_now_s();
    sf_sampler_accept(&r->ss, id);
    if (r->placed) { /* the stand-in the next step was planned with becomes the id */
        r->seq.tokens[r->seq.n_tokens - 1] = id;
        r->placed = 0;
    } else if (sf_seq_append(&r->seq, id) != SF_OK) {
        return SF_REQ_END_ERROR;
    }
    if (!r->sp.ignore_eos && r->tok && sf_tok_is_eog(r->tok, id)) return SF_REQ_END_STOP;
    for (int i = 0; i < r->sp.n_stop_ids; i++)
        if (id == r->sp.stop_ids[i]) return SF_REQ_END_STOP_ID;
    if (r->n_out >= r->max_out || r->seq.n_tokens >= r->seq.max_len) return SF_REQ_END_LENGTH;
    return SF_REQ_CONTINUE;
}

int sf_request_may_place(const sf_request *r)
{
    return !r->placed && !r->sp.prompt_only && r->n_out + 1 < r->max_out && r->seq.n_tokens + 1 < r->seq.max_len && !r->ss.counts &&
           r->n_out >= r->sp.min_tokens;
}

int sf_request_deliver(sf_request *r, int32_t id, int end, float logprob, const sf_logprob *top, int n_top)
{
    if (end == SF_REQ_END_ERROR) {
        sf_request_finish(r, SF_FINISH_ERROR, SF_ENOMEM, "out of memory while appending a generated token");
        return SF_REQ_FINISHED;
    }
    if (end == SF_REQ_END_NO_FIT) {
        sf_request_finish(r, SF_FINISH_ERROR, SF_ENOFIT,
                          r->sp.regex    ? "no token of the model's vocabulary continues the output as its pattern or grammar asks"
                          : r->sp.choice ? "no token of the model's vocabulary continues the output as 'guided_choice' asks"
                                         : "no token of the model's vocabulary continues the JSON output");
        return SF_REQ_FINISHED;
    }
    deliver_prompt(r);
    if (end == SF_REQ_END_PROMPT) { /* prompt_only: nothing is generated */
        deliver_done(r, SF_FINISH_LENGTH, 0);
        return SF_REQ_FINISHED;
    }
    if (end == SF_REQ_END_STOP) { /* the end-of-sequence token itself is not shown */
        deliver_done(r, SF_FINISH_STOP, 1);
        return SF_REQ_FINISHED;
    }
    if (r->tok) sf_detok_push(&r->detok, id, &r->text, &r->text_len);
    size_t at = 0;
    int hit = find_stop(r, &at);
    size_t n = hit ? at : r->text_len - held_suffix(r);

    char small[512], *heap = NULL;
    const char *text = take_text(r, &n, small, sizeof small, &heap);
    sf_event ev = { 0 };
    ev.type = SF_EV_TOKEN;
    ev.req = r;
    ev.user = r->user;
    ev.token = id;
    ev.text = text;
    ev.text_len = n;
    ev.logprob = logprob;
    ev.n_top = n_top;
    ev.top = top;
    r->cb(&ev);
    free(heap);

    if (hit) { /* anything after the stop string is dropped, and the stop string too unless included */
        r->text_len = 0;
        deliver_done(r, SF_FINISH_STOP, 0);
        return SF_REQ_FINISHED;
    }
    if (end == SF_REQ_END_LENGTH || end == SF_REQ_END_STOP_ID) {
        deliver_done(r, end == SF_REQ_END_LENGTH ? SF_FINISH_LENGTH : SF_FINISH_STOP, 1);
        return SF_REQ_FINISHED;
    }
    return SF_REQ_CONTINUE;
}
