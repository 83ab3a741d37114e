/* loadgen.c — the load generator's event loop: arrivals, requests, SSE parsing, timing. */
#include "loadgen.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>

void sf_lg_config_default(sf_lg_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    c->concurrency = 8;
    c->num_requests = 100;
    c->timeout_s = 300;
    c->seed = 1;
    c->ignore_eos = 1;
    c->n_classes = 1;
    sf_lg_class *k = &c->classes[0];
    snprintf(k->name, sizeof k->name, "default");
    k->weight = 1;
    k->prompt = (sf_lg_dist){ SF_LG_FIXED, 32, 0, 1, 1 << 20 };
    k->output = (sf_lg_dist){ SF_LG_FIXED, 32, 0, 1, 1 << 20 };
}

int sf_lg_parse_url(sf_lg_config *c, const char *url, sf_error *err)
{
    struct evhttp_uri *u = evhttp_uri_parse(url);
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL, *host = u ? evhttp_uri_get_host(u) : NULL;
    int rc = SF_OK;
    if (!u || !scheme || strcmp(scheme, "http") || !host) {
        rc = sf_err(err, SF_EINVAL, "--url '%s' must look like http://127.0.0.1:8080", url);
        goto done;
    }
    struct in_addr a4;
    struct in6_addr a6;
    int loop = !strcmp(host, "localhost") || (inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127) ||
               (inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6));
    if (!loop) {
        rc = sf_err(err, SF_EINVAL, "--url host '%s' is not a loopback address; loadgen only targets this machine "
                                    "(127.0.0.0/8, ::1, localhost)", host);
        goto done;
    }
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : 80;
done:
    if (u) evhttp_uri_free(u);
    return rc;
}

static int parse_duration(const char *s, size_t n, double *out)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, s, n);
    buf[n] = 0;
    char *end;
    double v = strtod(buf, &end);
    if (end == buf || !(v > 0)) return -1;
    if (!strcmp(end, "ms")) *out = v / 1000;
    else if (!strcmp(end, "s")) *out = v;
    else return -1;
    return 0;
}

int sf_lg_parse_slo(sf_lg_config *c, const char *s, sf_error *err)
{
    while (*s) {
        size_t n = strcspn(s, ",");
        const char *eq = memchr(s, '=', n);
        double v;
        if (!eq || parse_duration(eq + 1, n - (size_t)(eq + 1 - s), &v))
            return sf_err(err, SF_EINVAL, "--slo '%.*s': write name=VALUE with ms or s, e.g. ttft=300ms,tpot=50ms",
                          (int)n, s);
        size_t kn = (size_t)(eq - s);
        if (kn == 4 && !memcmp(s, "ttft", 4)) c->slo_ttft_s = v;
        else if (kn == 4 && !memcmp(s, "tpot", 4)) c->slo_tpot_s = v;
        else if (kn == 4 && !memcmp(s, "e2el", 4)) c->slo_e2el_s = v;
        else return sf_err(err, SF_EINVAL, "--slo: unknown metric '%.*s'; use ttft, tpot or e2el", (int)kn, s);
        s += n;
        if (*s == ',') s++;
    }
    return SF_OK;
}

int sf_lg_parse_dist(const char *t, sf_lg_dist *d, sf_error *err)
{
    double a = 0, b = 0;
    char kind[16] = "";
    *d = (sf_lg_dist){ SF_LG_FIXED, 0, 0, 1, 1 << 20 };
    if (sscanf(t, "%lf", &a) == 1 && strspn(t, "0123456789.") == strlen(t)) {
        d->a = a;
    } else if (sscanf(t, "%15[a-z]:%lf:%lf", kind, &a, &b) == 3 && !strcmp(kind, "uniform") && a >= 1 && b >= a) {
        *d = (sf_lg_dist){ SF_LG_UNIFORM, a, b, (int)a, (int)b };
    } else if (sscanf(t, "%15[a-z]:%lf:%lf", kind, &a, &b) == 3 && !strcmp(kind, "normal") && a >= 1 && b >= 0) {
        d->kind = SF_LG_NORMAL, d->a = a, d->b = b;
    } else {
        return sf_err(err, SF_EINVAL, "length '%s': use N, uniform:MIN:MAX or normal:MEAN:STD", t);
    }
    if (d->a < 1 || d->a > 1 << 20) return sf_err(err, SF_EINVAL, "length '%s' must be from 1 to %d", t, 1 << 20);
    return SF_OK;
}

static int dist_from_json(json_t *v, const char *what, int i, sf_lg_dist *d, sf_error *err)
{
    *d = (sf_lg_dist){ SF_LG_FIXED, 32, 0, 1, 1 << 20 };
    if (!v) return SF_OK;
    if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 1 << 20) {
        d->a = (double)json_integer_value(v);
        return SF_OK;
    }
    json_t *dist = json_object_get(v, "dist");
    const char *k = json_is_string(dist) ? json_string_value(dist) : "";
    json_t *mn = json_object_get(v, "min"), *mx = json_object_get(v, "max");
    d->min = json_is_integer(mn) ? (int)json_integer_value(mn) : 1;
    d->max = json_is_integer(mx) ? (int)json_integer_value(mx) : 1 << 20;
    if (!strcmp(k, "uniform") && json_is_integer(mn) && json_is_integer(mx) && d->min >= 1 && d->max >= d->min) {
        d->kind = SF_LG_UNIFORM, d->a = d->min, d->b = d->max;
        return SF_OK;
    }
    json_t *mean = json_object_get(v, "mean"), *std = json_object_get(v, "std");
    if (!strcmp(k, "normal") && json_is_number(mean) && json_number_value(mean) >= 1 && json_is_number(std) &&
        json_number_value(std) >= 0 && d->min >= 1 && d->max >= d->min) {
        d->kind = SF_LG_NORMAL, d->a = json_number_value(mean), d->b = json_number_value(std);
        return SF_OK;
    }
    return sf_err(err, SF_EFORMAT, "scenario classes[%d].%s: use a positive integer, {\"dist\": \"uniform\", \"min\", "
                                   "\"max\"} or {\"dist\": \"normal\", \"mean\", \"std\", \"min\", \"max\"}", i, what);
}

int sf_lg_load_scenario(sf_lg_config *c, const char *path, sf_error *err)
{
    json_error_t je;
    int rc = SF_OK;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return sf_err(err, SF_EFORMAT, "scenario %s: line %d: %s", path, je.line, je.text);
    json_t *arr = json_object_get(root, "classes");
    if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > SF_LG_MAX_CLASSES) {
        rc = sf_err(err, SF_EFORMAT, "scenario %s: needs \"classes\": [ 1 to %d objects ]", path, SF_LG_MAX_CLASSES);
        goto done;
    }
    size_t i;
    json_t *o;
    c->n_classes = 0;
    json_array_foreach(arr, i, o) {
        sf_lg_class *k = &c->classes[c->n_classes++];
        memset(k, 0, sizeof *k);
        json_t *name = json_object_get(o, "name"), *w = json_object_get(o, "weight"), *in = json_object_get(o, "intent"),
               *key = json_object_get(o, "api_key"), *ep = json_object_get(o, "endpoint");
        if (!json_is_object(o) || !json_is_string(name) || json_string_length(name) >= sizeof k->name) {
            rc = sf_err(err, SF_EFORMAT, "scenario %s: classes[%zu] needs a \"name\" (up to 47 characters)", path, i);
            goto done;
        }
        snprintf(k->name, sizeof k->name, "%s", json_string_value(name));
        k->weight = w ? json_number_value(w) : 1;
        if ((w && !json_is_number(w)) || !(k->weight > 0)) {
            rc = sf_err(err, SF_EFORMAT, "scenario %s: classes[%zu].weight must be a positive number", path, i);
            goto done;
        }
        if ((in && (!json_is_string(in) || json_string_length(in) >= sizeof k->intent)) ||
            (key && (!json_is_string(key) || json_string_length(key) >= sizeof k->api_key)) ||
            (ep && (!json_is_string(ep) || (strcmp(json_string_value(ep), "chat") && strcmp(json_string_value(ep), "completions"))))) {
            rc = sf_err(err, SF_EFORMAT, "scenario %s: classes[%zu]: intent and api_key are strings, endpoint is "
                                         "\"completions\" or \"chat\"", path, i);
            goto done;
        }
        if (in) snprintf(k->intent, sizeof k->intent, "%s", json_string_value(in));
        if (key) snprintf(k->api_key, sizeof k->api_key, "%s", json_string_value(key));
        k->chat = ep && !strcmp(json_string_value(ep), "chat");
        if ((rc = dist_from_json(json_object_get(o, "prompt_tokens"), "prompt_tokens", (int)i, &k->prompt, err)) ||
            (rc = dist_from_json(json_object_get(o, "output_tokens"), "output_tokens", (int)i, &k->output, err))) {
            sf_err_wrap(err, "scenario %s", path);
            goto done;
        }
    }
done:
    json_decref(root);
    return rc;
}

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
    }
    json_t *ch = json_array_get(json_object_get(o, "choices"), 0);
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
    s->ok = s->status == 200 && q->done;
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
    char *prompt = malloc((size_t)pw * 8 + 1);
    size_t o = 0;
    for (int i = 0; i < pw; i++) o += (size_t)sprintf(prompt + o, "%s%s", i ? " " : "", words[sf_rng_next(&r->rng) % SF_ARRAY_LEN(words)]);
    prompt[o] = 0;
    json_t *body = json_pack("{s:i, s:b, s:{s:b}, s:b, s:f}", "max_tokens", out, "stream", 1, "stream_options",
                             "include_usage", 1, "ignore_eos", c->ignore_eos, "temperature", 0.0);
    if (k->chat) json_object_set_new(body, "messages", json_pack("[{s:s, s:s}]", "role", "user", "content", prompt));
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

static void on_arrival(evutil_socket_t fd, short what, void *arg)
{
    lg_run *r = arg;
    issue(r);
    if (r->issued < r->c->num_requests && !(r->c->duration_s > 0 && sf_now_s() - r->t0 >= r->c->duration_s)) {
        double gap = -log(1.0 - sf_rng_uniform(&r->rng)) / r->c->rate; /* exponential: Poisson arrivals */
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
    r.t0 = sf_now_s();
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
