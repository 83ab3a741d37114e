/* loadgen.c — the load generator's event loop: arrivals, requests, SSE parsing, timing. */
#include "loadgen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

/* ---- the run ------------------------------------------------------------------------ */

typedef struct lg_run lg_run;
typedef struct lg_req {
    lg_run *run;
    struct lg_req *prev, *next; /* in flight */
    int idx;
    struct evhttp_connection *conn;
    char *line;               /* partial SSE line */
    size_t line_len;
    int done;
    int errored;              /* the stream carried an error event or finish_reason "error" */
    double last_t;
    int cap_itl;
} lg_req;

struct lg_run {
    const sf_lg_config *c;
    struct event_base *base;
    struct event *arrival;
    sf_rng rng;
    sf_lg_result *res;
    int issued, inflight;
    double t0, wsum;
    double next_t;            /* open loop: when the next arrival is due (absolute, sf_now_s clock) */
    lg_req *active;           /* requests in flight */
    struct evhttp_connection **dead; /* finished; freed outside their callbacks */
    int n_dead, cap_dead;
};

static void reap(lg_run *r)
{
    for (int i = 0; i < r->n_dead; i++) evhttp_connection_free(r->dead[i]);
    r->n_dead = 0;
}

static const char *words[] = { "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while",
                               "river", "light", "stone", "garden", "music", "paper", "window", "green", "small", "story" };

static int draw(sf_rng *rng, const sf_lg_dist *d)
{
    double v = d->a;
    if (d->kind == SF_LG_UNIFORM) v = d->a + floor(sf_rng_uniform(rng) * (d->b - d->a + 1));
    else if (d->kind == SF_LG_NORMAL) v = round(d->a + d->b * sf_rng_normal(rng));
    if (v < d->min) v = d->min;
    if (v > d->max) v = d->max;
    return (int)v;
}

static void finish(lg_req *q);

static void on_line(lg_req *q, const char *line, size_t n)
{
    sf_lg_sample *s = &q->run->res->s[q->idx];
    if (n < 6 || memcmp(line, "data: ", 6)) return;
    line += 6, n -= 6;
    if (n == 6 && !memcmp(line, "[DONE]", 6)) {
        q->done = 1;
        return;
    }
    json_t *o = json_loadb(line, n, 0, NULL);
    if (!o) return;
    json_t *usage = json_object_get(o, "usage");
    if (json_is_object(usage)) {
        s->output_tokens = (int)json_integer_value(json_object_get(usage, "completion_tokens"));
        s->prompt_tokens = (int)json_integer_value(json_object_get(usage, "prompt_tokens"));
        s->cached_tokens = (int)json_integer_value(json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                                                   "cached_tokens"));
    }
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
    json_t *fr = json_object_get(ch, "finish_reason");
    if (json_object_get(o, "error") || (json_is_string(fr) && !strcmp(json_string_value(fr), "error"))) q->errored = 1;
    json_t *text = json_object_get(ch, "text");
    if (!text) text = json_object_get(json_object_get(ch, "delta"), "content");
    if (json_is_string(text) && json_string_length(text) > 0) {
        double now = sf_now_s();
        if (s->ttft == 0) s->ttft = now - s->t_start;
        else if (s->n_itl < q->cap_itl) s->itl[s->n_itl++] = now - q->last_t;
        q->last_t = now;
    }
    json_decref(o);
}

static void on_chunk(struct evhttp_request *req, void *arg)
{
    lg_req *q = arg;
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(b);
    char *nl;
    q->line = realloc(q->line, q->line_len + n + 1);
    evbuffer_remove(b, q->line + q->line_len, n);
    q->line_len += n;
    size_t off = 0;
    while ((nl = memchr(q->line + off, '\n', q->line_len - off))) {
        on_line(q, q->line + off, (size_t)(nl - (q->line + off)));
        off = (size_t)(nl - q->line) + 1;
    }
    memmove(q->line, q->line + off, q->line_len - off);
    q->line_len -= off;
}

static void issue(lg_run *r);

static void on_done(struct evhttp_request *req, void *arg)
{
    lg_req *q = arg;
    sf_lg_sample *s = &q->run->res->s[q->idx];
    s->status = req ? evhttp_request_get_response_code(req) : 0;
    s->e2el = sf_now_s() - s->t_start;
    /* A 200 whose stream reported an error (the engine failed the request) is a failure, not a
     * completion. A completion without any text (every token held back or empty) had its first
     * text, for a client, at the end. */
    s->ok = s->status == 200 && q->done && !q->errored;
    if (s->ok && s->ttft == 0) s->ttft = s->e2el;
    if (s->ok && s->output_tokens > 1) s->tpot = (s->e2el - s->ttft) / (s->output_tokens - 1);
    finish(q);
}

static void finish(lg_req *q)
{
    lg_run *r = q->run;
    /* this callback runs inside evhttp's handling of q->conn: free it on a later turn */
    reap(r);
    if (r->n_dead == r->cap_dead) {
        int cap = r->cap_dead ? r->cap_dead * 2 : 64;
        struct evhttp_connection **d = realloc(r->dead, sizeof *d * (size_t)cap);
        if (d) r->dead = d, r->cap_dead = cap;
    }
    if (r->n_dead < r->cap_dead) r->dead[r->n_dead++] = q->conn;
    if (q->prev) q->prev->next = q->next;
    else r->active = q->next;
    if (q->next) q->next->prev = q->prev;
    free(q->line);
    free(q);
    r->inflight--;
    if (r->c->rate <= 0) issue(r);
    if (r->inflight == 0 && (r->issued == r->c->num_requests || (r->c->duration_s > 0 && sf_now_s() - r->t0 >= r->c->duration_s)))
        event_base_loopexit(r->base, NULL);
}

static int pick_class(lg_run *r)
{
    double x = sf_rng_uniform(&r->rng) * r->wsum;
    for (int i = 0; i < r->c->n_classes; i++) {
        x -= r->c->classes[i].weight;
        if (x < 0) return i;
    }
    return r->c->n_classes - 1;
}

static void issue(lg_run *r)
{
    const sf_lg_config *c = r->c;
    if (r->issued >= c->num_requests || (c->duration_s > 0 && sf_now_s() - r->t0 >= c->duration_s)) return;
    int idx = r->issued++;
    sf_lg_sample *s = &r->res->s[idx];
    r->res->n = r->issued;
    s->cls = pick_class(r);
    const sf_lg_class *k = &c->classes[s->cls];
    int pw = draw(&r->rng, &k->prompt), out = draw(&r->rng, &k->output);
    lg_req *q = calloc(1, sizeof *q);
    s->itl = calloc((size_t)out + 1, sizeof *s->itl);
    if (!q || !s->itl) {
        free(q);
        s->status = 0;
        return;
    }
    q->run = r, q->idx = idx, q->cap_itl = out;
    /* the class's shared beginning: the same words for every request (its own rng, seeded by the
     * class), then the request's own */
    const int pre = k->prefix_words;
    char *prompt = malloc((size_t)(pw + pre) * 8 + 2);
    size_t o = 0;
    sf_rng prng;
    sf_rng_seed(&prng, c->seed * 1000003u + (uint64_t)s->cls + 1);
    for (int i = 0; i < pre; i++) o += (size_t)sprintf(prompt + o, "%s%s", i ? " " : "", words[sf_rng_next(&prng) % SF_ARRAY_LEN(words)]);
    const size_t split = o; /* the beginning ends here; for chat it is the system message */
    if (pre && !k->chat) prompt[o++] = ' ';
    for (int i = 0; i < pw; i++) o += (size_t)sprintf(prompt + o, "%s%s", i ? " " : "", words[sf_rng_next(&r->rng) % SF_ARRAY_LEN(words)]);
    prompt[o] = 0;
    json_t *body = json_pack("{s:i, s:b, s:{s:b}, s:b, s:f}", "max_tokens", out, "stream", 1, "stream_options",
                             "include_usage", 1, "ignore_eos", c->ignore_eos, "temperature", 0.0);
    if (k->chat && pre)
        json_object_set_new(body, "messages", json_pack("[{s:s, s:s%}, {s:s, s:s}]", "role", "system", "content", prompt,
                                                        split, "role", "user", "content", prompt + split));
    else if (k->chat) json_object_set_new(body, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", prompt));
    else json_object_set_new(body, "prompt", json_string(prompt));
    if (c->model[0]) json_object_set_new(body, "model", json_string(c->model));
    free(prompt);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);

    q->conn = evhttp_connection_base_new(r->base, NULL, c->host, (unsigned short)c->port);
    if (!q->conn) {
        free(text);
        free(q);
        return; /* status 0: failed */
    }
    evhttp_connection_set_timeout(q->conn, (int)c->timeout_s);
    struct evhttp_request *req = evhttp_request_new(on_done, q);
    evhttp_request_set_chunked_cb(req, on_chunk);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    char host[300], auth[300];
    snprintf(host, sizeof host, "%s:%d", c->host, c->port);
    evhttp_add_header(h, "Host", host);
    evhttp_add_header(h, "Content-Type", "application/json");
    /* one connection per request; "close" lets evhttp free it once the response is read */
    evhttp_add_header(h, "Connection", "close");
    if (k->api_key[0]) {
        snprintf(auth, sizeof auth, "Bearer %s", k->api_key);
        evhttp_add_header(h, "Authorization", auth);
    }
    if (k->intent[0]) evhttp_add_header(h, "X-Semantic-Intent", k->intent);
    evbuffer_add(evhttp_request_get_output_buffer(req), text, strlen(text));
    free(text);
    s->t_start = sf_now_s();
    r->inflight++;
    q->next = r->active;
    if (r->active) r->active->prev = q;
    r->active = q;
    if (evhttp_make_request(q->conn, req, EVHTTP_REQ_POST, k->chat ? "/v1/chat/completions" : "/v1/completions")) {
        s->status = 0; /* evhttp freed req */
        finish(q);
    }
}

static int may_issue(const lg_run *r)
{
    return r->issued < r->c->num_requests && !(r->c->duration_s > 0 && sf_now_s() - r->t0 >= r->c->duration_s);
}

/* Arrivals are due at absolute times (exponential gaps: Poisson). A busy loop that wakes late
 * issues every arrival that fell due meanwhile, so the offered rate is the one asked for. */
static void on_arrival(evutil_socket_t fd, short what, void *arg)
{
    lg_run *r = arg;
    double now = sf_now_s();
    while (r->next_t <= now && may_issue(r)) {
        issue(r);
        r->next_t += -log(1.0 - sf_rng_uniform(&r->rng)) / r->c->rate;
    }
    if (may_issue(r)) {
        double gap = SF_MAX(r->next_t - sf_now_s(), 0.0);
        struct timeval tv = { (time_t)gap, (suseconds_t)((gap - floor(gap)) * 1e6) };
        evtimer_add(r->arrival, &tv);
    } else if (r->inflight == 0) {
        event_base_loopexit(r->base, NULL);
    }
}

int sf_loadgen_run(const sf_lg_config *c, sf_lg_result **out, sf_error *err)
{
    if (c->num_requests < 1 || c->num_requests > 10000000)
        return sf_err(err, SF_EINVAL, "--num-requests must be from 1 to 10000000");
    if (c->rate <= 0 && c->concurrency < 1) return sf_err(err, SF_EINVAL, "give --concurrency N or --rate R");
    lg_run r = { .c = c };
    r.res = calloc(1, sizeof *r.res);
    if (r.res) r.res->s = calloc((size_t)c->num_requests, sizeof *r.res->s);
    r.base = event_base_new();
    if (!r.res || !r.res->s || !r.base) {
        if (r.base) event_base_free(r.base);
        sf_lg_result_free(r.res);
        return sf_err(err, SF_ENOMEM, "loadgen: out of memory");
    }
    sf_rng_seed(&r.rng, c->seed);
    for (int i = 0; i < c->n_classes; i++) r.wsum += c->classes[i].weight;
    r.t0 = r.next_t = sf_now_s();
    if (c->rate > 0) {
        r.arrival = evtimer_new(r.base, on_arrival, &r);
        struct timeval zero = { 0, 0 };
        evtimer_add(r.arrival, &zero);
    } else {
        for (int i = 0; i < c->concurrency; i++) issue(&r);
    }
    /* hard bound: the issuing window plus one request timeout */
    double limit = (c->duration_s > 0 ? c->duration_s : 1e6) + c->timeout_s + 5;
    struct timeval tv = { (time_t)limit, 0 };
    event_base_loopexit(r.base, &tv);
    event_base_dispatch(r.base);
    r.res->elapsed_s = sf_now_s() - r.t0;
    reap(&r);
    while (r.active) { /* still running at the hard bound: counted as failed (status 0) */
        lg_req *q = r.active;
        r.active = q->next;
        evhttp_connection_free(q->conn); /* frees its request */
        free(q->line);
        free(q);
    }
    free(r.dead);
    if (r.arrival) event_free(r.arrival);
    event_base_free(r.base);
    *out = r.res;
    return SF_OK;
}

void sf_lg_result_free(sf_lg_result *r)
{
    if (!r) return;
    for (int i = 0; r->s && i < r->n; i++) free(r->s[i].itl);
    free(r->s);
    free(r);
}
