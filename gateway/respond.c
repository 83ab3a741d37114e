/* respond.c — a generation request's way back: engine events into the worker, SSE chunks or
 * whole OpenAI responses, logprobs, disconnects and slow clients. Contracts in gw-request.h. */
#include "gw-request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>

#include "../engine/tokenizer.h"

static const char *finish_name(int f)
{
    switch (f) {
    case SF_FINISH_STOP: return "stop";
    case SF_FINISH_LENGTH: return "length";
    case SF_FINISH_CANCELLED: return "abort";
    }
    return "error";
}

/* ---- engine thread ------------------------------------------------------------------ */

void gw_plp_free(gw_plp *p)
{
    if (!p) return;
    free(p->ids);
    free(p->rank);
    free(p->lp);
    free(p->top);
    free(p);
}

void gw_req_on_event(const sf_event *ev)
{
    gw_choice *c = ev->user;
    gw_req *r = c->req;
    gw_ev e;
    memset(&e, 0, sizeof e);
    e.choice = c->idx;
    e.type = ev->type;
    e.t = sf_now_s();
    if (ev->type == SF_EV_PROMPT) {
        const int n = ev->n_prompt_lp, k = ev->prompt_k;
        gw_plp *pl = calloc(1, sizeof *pl);
        if (pl) {
            pl->n = n, pl->k = k;
            pl->ids = malloc((size_t)n * sizeof *pl->ids);
            pl->rank = malloc((size_t)n * sizeof *pl->rank);
            pl->lp = malloc((size_t)n * sizeof *pl->lp);
            pl->top = k ? malloc((size_t)n * (size_t)k * sizeof *pl->top) : NULL;
            if (!pl->ids || !pl->rank || !pl->lp || (k && !pl->top)) {
                gw_plp_free(pl);
                pl = NULL;
            } else {
                memcpy(pl->ids, ev->prompt_ids, (size_t)n * sizeof *pl->ids);
                memcpy(pl->rank, ev->prompt_rank, (size_t)n * sizeof *pl->rank);
                memcpy(pl->lp, ev->prompt_lp, (size_t)n * sizeof *pl->lp);
                if (k) memcpy(pl->top, ev->prompt_top, (size_t)n * (size_t)k * sizeof *pl->top);
            }
        }
        e.plp = pl; /* out of memory: the echo goes without its logprobs */
    } else if (ev->type == SF_EV_TOKEN) {
        e.token = ev->token;
        e.logprob = ev->logprob;
        e.n_top = ev->n_top > SF_MAX_LOGPROBS ? SF_MAX_LOGPROBS : ev->n_top;
        if (e.n_top > 0 && ev->top) memcpy(e.top, ev->top, sizeof *e.top * (size_t)e.n_top);
        if (ev->text_len) {
            e.text = malloc(ev->text_len);
            if (e.text) memcpy(e.text, ev->text, ev->text_len), e.text_len = ev->text_len;
        }
    } else {
        e.finish = ev->type == SF_EV_DONE ? ev->finish_reason : SF_FINISH_ERROR;
        e.prompt_tokens = ev->prompt_tokens;
        e.completion_tokens = ev->completion_tokens;
        e.cached_tokens = ev->cached_tokens;
        e.e2e_s = ev->e2e_s;
        if (ev->type == SF_EV_ERROR) e.message = strdup(ev->message ? ev->message : sf_status_str(ev->status)), e.status = ev->status;
    }
    pthread_mutex_lock(&r->mu);
    if (r->qn == r->qcap) {
        int cap = r->qcap ? r->qcap * 2 : 16;
        gw_ev *q = realloc(r->q, sizeof *q * (size_t)cap);
        if (!q && e.type != SF_EV_DONE && e.type != SF_EV_ERROR) { /* drop a token rather than the final event */
            pthread_mutex_unlock(&r->mu);
            free(e.text);
            gw_plp_free(e.plp);
            return;
        }
        if (q) r->q = q, r->qcap = cap;
    }
    if (r->qn < r->qcap) r->q[r->qn++] = e;
    if (e.type == SF_EV_DONE || e.type == SF_EV_ERROR) c->engine_done = 1;
    if (!r->wake_pending) {
        r->wake_pending = 1;
        event_active(r->wake, EV_READ, 1); /* under mu: the worker cannot free r meanwhile */
    }
    pthread_mutex_unlock(&r->mu);
}

/* ---- worker thread ------------------------------------------------------------------ */

void gw_req_free(gw_req *r)
{
    for (int i = 0; i < r->qn; i++) free(r->q[i].text), free(r->q[i].message), gw_plp_free(r->q[i].plp);
    free(r->q);
    for (int i = 0; i < r->n; i++) {
        free(r->ch[i].text);
        free(r->ch[i].error);
        json_decref(r->ch[i].lp);
        json_decref(r->ch[i].plp);
        free(r->ch[i].echo);
        json_decref(r->ch[i].calls);
        free(r->ch[i].said);
    }
    if (r->wake) event_free(r->wake);
    if (r->hup) event_free(r->hup);
    pthread_mutex_destroy(&r->mu);
    sf_tenant_release(r->tenant);
    sf_metrics_active(&r->gw->metrics, -1);
    gw_worker_load(r->w, -1);
    free(r);
}

void gw_req_maybe_free(gw_req *r)
{
    if (r->engine_refs == 0 && r->answered) gw_req_free(r);
}

void gw_req_cancel_running(gw_req *r)
{
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++)
        if (r->ch[i].r && !r->ch[i].engine_done) sf_engine_cancel(r->engine, r->ch[i].r);
    pthread_mutex_unlock(&r->mu);
}

void gw_req_on_close(struct evhttp_connection *conn, void *arg)
{
    gw_req *r = arg;
    if (r->answered) return;
    if (r->hup) event_del(r->hup);
    /* When evhttp itself drops the connection (EOF or timeout while we still owe the reply) it
     * detaches the request (evcon == NULL) and leaves it to us; when we freed the connection
     * (on_hup) the request is still attached and evhttp frees it right after this callback. */
    if (r->http && !evhttp_request_get_connection(r->http)) evhttp_request_free(r->http);
    r->http = NULL;
    r->answered = 1;
    r->status = 499; /* nginx's "client closed request" */
    sf_metrics_add(&r->gw->metrics, &r->gw->metrics.client_disconnects, 1);
    sf_metrics_request(&r->gw->metrics, r->tenant->name, r->intent.cls, r->status);
    gw_req_cancel_running(r);
    gw_req_maybe_free(r);
}

/* evhttp (2.1) does not read from a connection while its request waits for the reply, so a
 * client that hangs up then would only be noticed at the next write; EV_CLOSED (EPOLLRDHUP)
 * notices it at once, and freeing the connection runs on_close. */
void gw_req_on_hup(evutil_socket_t fd, short what, void *arg)
{
    gw_req *r = arg;
    if (!r->answered && r->conn) evhttp_connection_free(r->conn);
}

static void detach_http(gw_req *r)
{
    if (r->hup) event_del(r->hup);
    if (r->conn) evhttp_connection_set_closecb(r->conn, NULL, NULL);
    r->http = NULL;
    r->answered = 1;
    sf_metrics_request(&r->gw->metrics, r->tenant->name, r->intent.cls, r->status);
}

static char *token_str(const gw_req *r, int32_t id)
{
    char *s = NULL;
    const sf_tokenizer *t = sf_engine_tokenizer(r->engine);
    if (r->tokens_as_ids || !t || sf_tok_decode(t, &id, 1, 0, &s, NULL)) {
        s = malloc(24);
        if (s) snprintf(s, 24, "token_id:%d", id);
    }
    return s;
}

static json_t *bytes_of(const char *s)
{
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

/* Chat logprobs entry for one token: {"token","logprob","bytes","top_logprobs":[...]}. */
static json_t *chat_lp(const gw_req *r, const gw_ev *e)
{
    char *ts = token_str(r, e->token);
    json_t *top = json_array();
    for (int k = 0; k < e->n_top && k < r->top_logprobs; k++) {
        char *s = token_str(r, e->top[k].id);
        json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", gw_json_text(s, strlen(s)), "logprob",
                                             (double)e->top[k].logprob, "bytes", bytes_of(s)));
        free(s);
    }
    json_t *o = json_pack("{s:o, s:f, s:o, s:o}", "token", gw_json_text(ts, strlen(ts)), "logprob", (double)e->logprob,
                          "bytes", bytes_of(ts), "top_logprobs", top);
    free(ts);
    return o;
}

/* Completions logprobs: appends one token to {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static void cmpl_lp_add(gw_req *r, json_t *lp, const gw_ev *e, int offset)
{
    char *ts = token_str(r, e->token);
    json_array_append_new(json_object_get(lp, "tokens"), gw_json_text(ts, strlen(ts)));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(e->logprob));
    json_t *top = json_object();
    for (int k = 0; k < e->n_top && k < r->top_logprobs; k++) {
        char *s = token_str(r, e->top[k].id);
        json_t *key = gw_json_text(s, strlen(s));
        json_object_set_new(top, json_string_value(key), json_real(e->top[k].logprob));
        json_decref(key);
        free(s);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer(offset));
    free(ts);
}

static json_t *cmpl_lp_new(void)
{
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...], the
 * prompt's token at each position and its most likely alternatives (rank 1 first) */
static void plp_entry(const gw_req *r, json_t *o, int32_t id, float lp, int rank)
{
    char key[16], *s = token_str(r, id);
    snprintf(key, sizeof key, "%d", id);
    json_object_set_new(o, key, json_pack("{s:f, s:i, s:o}", "logprob", (double)lp, "rank", rank, "decoded_token",
                                          gw_json_text(s ? s : "", s ? strlen(s) : 0)));
    free(s);
}

static json_t *vllm_plp(const gw_req *r, const gw_plp *pl)
{
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    const int k = SF_MIN(r->prompt_logprobs, pl->k);
    for (int i = 1; i < pl->n; i++) {
        json_t *o = json_object();
        plp_entry(r, o, pl->ids[i], pl->lp[i], pl->rank[i]);
        for (int j = 0; j < k; j++) {
            const sf_logprob *t = &pl->top[(size_t)i * pl->k + j];
            if (t->id >= 0 && t->id != pl->ids[i]) plp_entry(r, o, t->id, t->logprob, j + 1);
        }
        json_array_append_new(a, o);
    }
    return a;
}

/* Completions echo with logprobs: the prompt's tokens as the first entries of the logprobs object,
 * the first with no logprob (nothing precedes it). A token's offset is the length of the text
 * the tokens before it decode to (special tokens skipped), so it indexes the echoed prompt as
 * the output's offsets index what follows it. */
static json_t *echo_lp(gw_req *r, const gw_choice *c, const gw_plp *pl)
{
    json_t *lp = cmpl_lp_new();
    const int k = SF_MIN(r->top_logprobs, pl->k);
    const sf_tokenizer *t = sf_engine_tokenizer(r->engine);
    sf_detok d;
    char *dec = NULL;
    size_t off = 0;
    if (t) sf_detok_init(&d, t, 1);
    for (int i = 0; i < pl->n; i++) {
        char *ts = token_str(r, pl->ids[i]);
        size_t n = ts ? strlen(ts) : 0;
        json_array_append_new(json_object_get(lp, "tokens"), gw_json_text(ts ? ts : "", n));
        json_array_append_new(json_object_get(lp, "token_logprobs"), i ? json_real(pl->lp[i]) : json_null());
        json_t *top = i ? json_object() : json_null();
        for (int j = 0; i && j < k; j++) {
            const sf_logprob *t = &pl->top[(size_t)i * pl->k + j];
            if (t->id < 0) break;
            char *s = token_str(r, t->id);
            json_t *key = gw_json_text(s ? s : "", s ? strlen(s) : 0);
            json_object_set_new(top, json_string_value(key), json_real(t->logprob));
            json_decref(key);
            free(s);
        }
        json_array_append_new(json_object_get(lp, "top_logprobs"), top);
        json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)SF_MIN(off, c->echo_len)));
        if (t) sf_detok_push(&d, pl->ids[i], &dec, &off);
        else off += n;
        free(ts);
    }
    if (t) sf_detok_free(&d);
    free(dec);
    return lp;
}

static json_t *chunk_base(const gw_req *r)
{
    return json_pack("{s:s, s:s, s:I, s:s}", "id", r->id, "object",
                     r->kind == SF_GW_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                     (json_int_t)r->created, "model", r->gw->model_name);
}

static void sse_send(gw_req *r, json_t *obj)
{
    if (!r->http) {
        json_decref(obj);
        return;
    }
    char *s = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    if (!s) return;
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "data: %s\n\n", s);
    free(s);
    evhttp_send_reply_chunk(r->http, b);
    evbuffer_free(b);
    /* a client that reads slower than the model writes must not make us buffer its whole
     * answer; the write timeout alone does not catch one that reads a trickle */
    struct bufferevent *bev = r->conn ? evhttp_connection_get_bufferevent(r->conn) : NULL;
    if (bev && evbuffer_get_length(bufferevent_get_output(bev)) > GW_MAX_UNSENT) r->slow = 1;
}

static json_t *usage(const gw_req *r)
{
    int out = 0;
    int cached = 0; /* each prompt once, as its first choice found it */
    for (int i = 0; i < r->n; i++) out += r->ch[i].completion_tokens;
    for (int i = 0; i < r->n; i += SF_MAX(r->per_prompt, 1)) cached += r->ch[i].cached_tokens;
    return json_pack("{s:i, s:i, s:i, s:{s:i}}", "prompt_tokens", r->prompt_tokens, "completion_tokens", out,
                     "total_tokens", r->prompt_tokens + out, "prompt_tokens_details", "cached_tokens", cached);
}

static void stream_token(gw_req *r, gw_choice *c, const gw_ev *e)
{
    if (!e->text_len && !r->logprobs) return;
    json_t *choice, *text = gw_json_text(e->text ? e->text : "", e->text_len);
    json_t *lp = json_null();
    if (r->logprobs) {
        if (r->kind == SF_GW_CHAT) {
            lp = json_pack("{s:[o]}", "content", chat_lp(r, e));
        } else {
            lp = cmpl_lp_new();
            cmpl_lp_add(r, lp, e, (int)c->len);
        }
    }
    c->len += e->text_len; /* streaming keeps only the offset */
    if (r->kind == SF_GW_CHAT)
        choice = json_pack("{s:i, s:{s:o}, s:o, s:n}", "index", c->idx, "delta", "content", text, "logprobs", lp,
                           "finish_reason");
    else
        choice = json_pack("{s:i, s:o, s:o, s:n}", "index", c->idx, "text", text, "logprobs", lp, "finish_reason");
    json_t *chunk = chunk_base(r);
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    sse_send(r, chunk);
}

static void append_text(gw_choice *c, const char *s, size_t n);

/* A completions stream's echo: the prompt's text (and, scored, its logprobs and vLLM's
 * prompt_logprobs) before the output. A chat stream gets prompt_logprobs in a chunk of its own. */
static void stream_echo(gw_req *r, gw_choice *c, json_t *elp, json_t *plp)
{
    json_t *chunk = chunk_base(r), *choice;
    if (r->kind == SF_GW_CHAT) {
        choice = json_pack("{s:i, s:{}, s:n, s:n}", "index", c->idx, "delta", "logprobs", "finish_reason");
        if (plp) json_object_set_new(chunk, "prompt_logprobs", plp);
    } else {
        choice = json_pack("{s:i, s:o, s:o, s:n}", "index", c->idx, "text",
                           gw_json_text(r->echo ? c->echo : "", r->echo ? c->echo_len : 0), "logprobs",
                           elp ? elp : json_null(), "finish_reason");
        elp = NULL;
        if (plp) json_object_set_new(choice, "prompt_logprobs", plp);
    }
    json_decref(elp);
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    sse_send(r, chunk);
    if (r->echo) c->len = c->echo_len; /* the output's offsets follow the prompt's text */
}

/* SF_EV_PROMPT: the prompt's scores, before any token of the choice */
static void on_prompt(gw_req *r, gw_choice *c, const gw_ev *e)
{
    json_t *plp = r->prompt_logprobs >= 0 && e->plp ? vllm_plp(r, e->plp) : NULL;
    json_t *elp = r->echo && r->logprobs && e->plp ? echo_lp(r, c, e->plp) : NULL;
    if (r->stream) {
        stream_echo(r, c, elp, plp);
        return;
    }
    json_decref(c->plp);
    c->plp = plp;
    if (elp) { /* the prompt's entries first: no token was kept before */
        json_decref(c->lp);
        c->lp = elp;
    }
}

void gw_req_echo_whole(gw_req *r)
{
    for (int i = 0; r->echo && i < r->n; i++) append_text(&r->ch[i], r->ch[i].echo, r->ch[i].echo_len);
}

static void append_text(gw_choice *c, const char *s, size_t n)
{
    if (c->len + n + 1 > c->cap) {
        size_t cap = (c->len + n + 1) * 2;
        char *t = realloc(c->text, cap);
        if (!t) return;
        c->text = t, c->cap = cap;
    }
    memcpy(c->text + c->len, s, n);
    c->len += n;
    c->text[c->len] = 0;
}

/* A token kept for a reply sent later (whole responses, held tool replies): its text and logprobs */
static void keep_token(gw_req *r, gw_choice *c, const gw_ev *e)
{
    if (r->logprobs) {
        if (r->kind == SF_GW_CHAT) {
            if (!c->lp) c->lp = json_pack("{s:[]}", "content");
            json_array_append_new(json_object_get(c->lp, "content"), chat_lp(r, e));
        } else {
            if (!c->lp) c->lp = cmpl_lp_new();
            cmpl_lp_add(r, c->lp, e, (int)c->len);
        }
    }
    append_text(c, e->text ? e->text : "", e->text_len);
}

/* A choice's finish_reason: "tool_calls" when its reply was read as calls */
static const char *choice_finish(const gw_choice *c) { return c->calls ? "tool_calls" : finish_name(c->finish); }

/* tools: read the finished reply for calls (a reply that stopped, not one cut short) */
static void read_calls(gw_req *r, gw_choice *c)
{
    if (!r->tools || c->finish != SF_FINISH_STOP || c->error) return;
    char id[64];
    snprintf(id, sizeof id, "%s_%d", r->id, c->idx);
    c->calls = sf_gw_parse_tool_calls(c->text ? c->text : "", c->len, id, &c->said);
}

/* tools, streamed: the held reply in one delta, as content or as tool_calls (each with its index) */
static void stream_held(gw_req *r, gw_choice *c)
{
    read_calls(r, c);
    json_t *delta;
    if (c->calls) {
        size_t k;
        json_t *call;
        json_array_foreach(c->calls, k, call) json_object_set_new(call, "index", json_integer((json_int_t)k));
        delta = json_pack("{s:O}", "tool_calls", c->calls);
        if (c->said) json_object_set_new(delta, "content", json_string(c->said));
    } else if (c->len) {
        delta = json_pack("{s:o}", "content", gw_json_text(c->text, c->len));
    } else {
        return;
    }
    json_t *chunk = chunk_base(r);
    json_object_set_new(chunk, "choices", json_pack("[{s:i, s:o, s:o, s:n}]", "index", c->idx, "delta", delta,
                                                    "logprobs", c->lp ? json_incref(c->lp) : json_null(),
                                                    "finish_reason"));
    sse_send(r, chunk);
    if (c->calls) /* the whole response's form has no index in its calls */
        for (size_t k = 0; k < json_array_size(c->calls); k++) json_object_del(json_array_get(c->calls, k), "index");
}

/* tools, streamed: a reply is held while it may be a call: a forced one always, an "auto" one
 * while what it wrote so far (less leading whitespace) is "{" or on the way to "<tool_call>";
 * once it is plainly text, what was held goes out and the rest streams. */
static void stream_or_hold(gw_req *r, gw_choice *c, const gw_ev *e)
{
    static const char mark[] = "<tool_call>";
    if (c->held == 2) {
        stream_token(r, c, e);
        return;
    }
    keep_token(r, c, e);
    if (c->held == 1) return;
    const char *s = c->text ? c->text : "";
    size_t n = c->len;
    while (n && strchr(" \t\r\n", *s)) s++, n--;
    if (r->tools >= SF_GW_TOOLS_REQUIRED || (n && (*s == '{' || !strncmp(s, mark, SF_MIN(n, sizeof mark - 1))))) {
        if (n >= sizeof mark - 1 || *s == '{' || r->tools >= SF_GW_TOOLS_REQUIRED) c->held = 1;
        return; /* a call, or still on the way to the mark */
    }
    if (!n) return;
    c->held = 2; /* text: out with what was held, in one delta */
    json_t *chunk = chunk_base(r);
    json_object_set_new(chunk, "choices", json_pack("[{s:i, s:{s:o}, s:o, s:n}]", "index", c->idx, "delta", "content",
                                                    gw_json_text(c->text, c->len), "logprobs",
                                                    c->lp ? c->lp : json_null(), "finish_reason"));
    c->lp = NULL;
    sse_send(r, chunk);
}

/* a choice's engine error as the API reports it: a form no token of the model continues is the
 * request's error (400), any other the server's (500); returns the status */
static int error_kind(const gw_choice *c, const char **type, const char **code)
{
    int req = c->error_status == SF_ENOFIT;
    *type = req ? "invalid_request_error" : "server_error";
    *code = req ? "no_token_fits" : "engine_error";
    return req ? 400 : 500;
}

static void stream_finish_choice(gw_req *r, gw_choice *c)
{
    json_t *choice;
    if (r->tools && c->held != 2) stream_held(r, c);
    if (r->kind == SF_GW_CHAT)
        choice = json_pack("{s:i, s:{}, s:n, s:s}", "index", c->idx, "delta", "logprobs", "finish_reason",
                           choice_finish(c));
    else
        choice = json_pack("{s:i, s:s, s:n, s:s}", "index", c->idx, "text", "", "logprobs", "finish_reason",
                           finish_name(c->finish));
    json_t *chunk = chunk_base(r);
    json_object_set_new(chunk, "choices", json_pack("[o]", choice));
    sse_send(r, chunk);
    if (c->error) {
        const char *type, *code;
        error_kind(c, &type, &code);
        sse_send(r, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", c->error, "type", type, "param", "code", code));
    }
}


static void finish_response(gw_req *r)
{
    struct evhttp_request *http = r->http;
    int n_err = 0;
    for (int i = 0; i < r->n; i++) n_err += r->ch[i].error != NULL;
    if (r->stream) {
        if (r->include_usage) {
            json_t *chunk = chunk_base(r);
            json_object_set_new(chunk, "choices", json_array());
            json_object_set_new(chunk, "usage", usage(r));
            sse_send(r, chunk);
        }
        struct evbuffer *b = evbuffer_new();
        evbuffer_add_printf(b, "data: [DONE]\n\n");
        evhttp_send_reply_chunk(http, b);
        evbuffer_free(b);
        r->status = n_err ? 500 : 200;
        detach_http(r);
        evhttp_send_reply_end(http);
        return;
    }
    if (n_err == r->n) {
        const char *type, *code;
        r->status = error_kind(&r->ch[0], &type, &code);
        detach_http(r);
        gw_error(http, r->status, type, code, NULL, "%s", r->ch[0].error);
        return;
    }
    json_t *choices = json_array();
    for (int i = 0; i < r->n; i++) {
        gw_choice *c = &r->ch[i];
        read_calls(r, c);
        json_t *text = c->calls ? (c->said ? json_string(c->said) : json_null()) : gw_json_text(c->text ? c->text : "", c->len);
        json_t *lp = c->lp ? json_incref(c->lp) : json_null();
        if (r->kind == SF_GW_CHAT) {
            json_t *msg = json_pack("{s:s, s:o}", "role", "assistant", "content", text);
            if (c->calls) json_object_set(msg, "tool_calls", c->calls);
            json_array_append_new(choices, json_pack("{s:i, s:o, s:o, s:s}", "index", i, "message", msg, "logprobs", lp,
                                                     "finish_reason", choice_finish(c)));
        } else {
            json_t *ch = json_pack("{s:i, s:o, s:o, s:s}", "index", i, "text", text, "logprobs", lp, "finish_reason",
                                   finish_name(c->finish));
            if (r->prompt_logprobs >= 0) json_object_set(ch, "prompt_logprobs", c->plp ? c->plp : json_null());
            json_array_append_new(choices, ch);
        }
    }
    json_t *body = json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", r->id, "object",
                             r->kind == SF_GW_CHAT ? "chat.completion" : "text_completion", "created",
                             (json_int_t)r->created, "model", r->gw->model_name, "choices", choices, "usage", usage(r));
    if (r->kind == SF_GW_CHAT && r->prompt_logprobs >= 0) /* vLLM: the request's, beside its choices */
        json_object_set(body, "prompt_logprobs", r->ch[0].plp ? r->ch[0].plp : json_null());
    r->status = 200;
    detach_http(r);
    gw_send_json(http, 200, body);
}

void gw_req_on_wake(evutil_socket_t fd, short what, void *arg)
{
    gw_req *r = arg;
    gw_ev *q;
    int qn;
    pthread_mutex_lock(&r->mu);
    q = r->q;
    qn = r->qn;
    r->q = NULL;
    r->qn = r->qcap = 0;
    r->wake_pending = 0;
    pthread_mutex_unlock(&r->mu);

    sf_metrics *m = &r->gw->metrics;
    int tokens = 0;
    for (int i = 0; i < qn; i++) {
        gw_ev *e = &q[i];
        gw_choice *c = &r->ch[e->choice];
        if (e->type == SF_EV_TOKEN) {
            tokens++;
            c->completion_tokens++;
            if (!r->first_token) {
                r->first_token = 1;
                sf_hist_observe(&m->ttft, e->t - r->t0);
            }
            if (c->last_t > 0) sf_hist_observe(&m->itl, e->t - c->last_t);
            c->last_t = e->t;
            if (r->stream && r->tools) {
                stream_or_hold(r, c, e);
            } else if (r->stream) {
                stream_token(r, c, e);
            } else {
                keep_token(r, c, e);
            }
        } else if (e->type == SF_EV_PROMPT) {
            on_prompt(r, c, e);
        } else {
            c->done = 1;
            c->finish = e->finish;
            if (e->completion_tokens > c->completion_tokens) c->completion_tokens = e->completion_tokens;
            c->cached_tokens = e->cached_tokens;
            if (e->type == SF_EV_ERROR) c->error = e->message, e->message = NULL, c->error_status = e->status;
            r->engine_refs--;
            sf_hist_observe(&m->e2e, e->t - r->t0);
            if (e->e2e_s > r->engine_s) r->engine_s = e->e2e_s;
            if (r->stream && !r->answered) stream_finish_choice(r, c);
        }
        free(e->text);
        free(e->message);
        gw_plp_free(e->plp);
    }
    free(q);
    if (tokens) {
        sf_metrics_add(m, &m->completion_tokens, (uint64_t)tokens);
        sf_tenant_charge(r->tenant, tokens, sf_now_s());
    }
    if (r->slow && !r->answered && r->conn) {
        SF_LOGW("request %s: client left %u+ bytes unread; closing its connection", r->id, GW_MAX_UNSENT);
        evhttp_connection_free(r->conn); /* on_close cancels and frees r when nothing runs */
        return;
    }
    if (r->engine_refs == 0 && !r->answered) {
        finish_response(r);
        /* arrival..now minus the engine's own submit..done: what the gateway added */
        double g = (sf_now_s() - r->t0) - r->engine_s;
        if (r->status == 200 && g >= 0) sf_hist_observe(&m->gateway, g);
    }
    gw_req_maybe_free(r);
}

void gw_req_start_stream(gw_req *r)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->http);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_send_reply_start(r->http, 200, "OK");
    if (r->kind != SF_GW_CHAT) {
        for (int i = 0; r->echo && !r->scored && i < r->n; i++) stream_echo(r, &r->ch[i], NULL, NULL);
        return;
    }
    for (int i = 0; i < r->n; i++) {
        json_t *chunk = chunk_base(r);
        json_object_set_new(chunk, "choices", json_pack("[{s:i, s:{s:s, s:s}, s:n, s:n}]", "index", i, "delta", "role",
                                                        "assistant", "content", "", "logprobs", "finish_reason"));
        sse_send(r, chunk);
    }
}

