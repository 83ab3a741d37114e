/* dashboard.c — GET /dashboard (the bundled page) and GET /dashboard/events (SSE, one message a
 * second) on a gateway evhttp. All callbacks run on the evhttp's event-loop thread. */
#include "gateway/dashboard.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/event_struct.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bpf/monitor.h"
#include "engine/engine.h"
#include "web/dashboard_page.h"

/* The engine is optional at link time too: builds of the dashboard without the engine (the
 * standalone `semflow top --listen`) leave this NULL. */
#pragma weak sf_engine_get_stats

typedef struct sse_client {
    struct evhttp_request *req;
    struct sf_dashboard *d;
    struct sse_client *next;
} sse_client;

struct sf_dashboard {
    struct evhttp *http;
    struct event_base *base;
    struct event tick;          /* ours, so the base may be freed before us (sf_dashboard_set_free) */
    int tick_added;
    sf_dashboard_opts o;
    char off_reason[512];
    sse_client *clients;
    int n_clients;
};

int sf_dashboard_available(void) { return SF_DASHBOARD_BUNDLED; }

static void page_cb(struct evhttp_request *req, void *arg)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    struct evbuffer *b = evbuffer_new();
    if (!b) { evhttp_send_error(req, 500, "out of memory"); return; }
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_add_header(h, "Allow", "GET");
        evhttp_send_error(req, 405, "only GET is served here");
        evbuffer_free(b);
        return;
    }
#if SF_DASHBOARD_BUNDLED
    evhttp_add_header(h, "Content-Type", "text/html; charset=utf-8");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evbuffer_add_reference(b, sf_dashboard_page, sf_dashboard_page_len, NULL, NULL);
    evhttp_send_reply(req, 200, "OK", b);
#else
    evhttp_add_header(h, "Content-Type", "text/plain; charset=utf-8");
    evbuffer_add_printf(b, "The dashboard page is not part of this build: npm was unavailable when it was built "
                           "(install nodejs/npm, then make). /dashboard/events and /metrics still work.\n");
    evhttp_send_reply(req, 503, "Dashboard not built", b);
#endif
    evbuffer_free(b);
}

/* One event: {"t", "monitor": snapshot|null, "monitor_off", "engine": {...}, "server": {...}} */
static char *event_json(sf_dashboard *d)
{
    json_t *root = json_object();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    json_object_set_new(root, "t", json_real((double)ts.tv_sec + ts.tv_nsec * 1e-9)); /* Unix time */
    if (d->o.monitor) {
        char *m = sf_monitor_json(d->o.monitor);
        json_t *mj = m ? json_loads(m, 0, NULL) : NULL;
        json_object_set_new(root, "monitor", mj ? mj : json_null());
        free(m);
    } else {
        json_object_set_new(root, "monitor", json_null());
        json_object_set_new(root, "monitor_off", json_string(d->off_reason[0] ? d->off_reason : "monitor not started"));
    }
    struct sf_engine *engine = d->o.engine ? d->o.engine : d->o.engine_fn ? d->o.engine_fn(d->o.engine_arg) : NULL;
    if (engine && sf_engine_get_stats) {
        sf_engine_stats st;
        static const char *const urg[SF_URGENCY_COUNT] = { "low", "normal", "high" };
        sf_engine_get_stats(engine, &st);
        json_t *e = json_object(), *w = json_object();
        for (int i = 0; i < SF_URGENCY_COUNT; i++) json_object_set_new(w, urg[i], json_integer(st.waiting[i]));
        json_object_set_new(e, "running", json_integer(st.running));
        json_object_set_new(e, "waiting", w);
        json_object_set_new(e, "kv_blocks_used", json_integer(st.kv_blocks_used));
        json_object_set_new(e, "kv_blocks_total", json_integer(st.kv_blocks_total));
        json_object_set_new(e, "prefix_cache_blocks", json_integer(st.prefix_blocks));
        json_object_set_new(e, "prefix_cache_hit_tokens", json_integer((json_int_t)st.prefix_hits));
        json_object_set_new(e, "prefix_cache_query_tokens", json_integer((json_int_t)st.prefix_queries));
        json_object_set_new(e, "tokens_per_s", json_real(st.tokens_per_s));
        json_object_set_new(e, "steps", json_integer((json_int_t)st.steps));
        json_object_set_new(e, "preemptions", json_integer((json_int_t)st.preemptions));
        json_object_set_new(e, "finished", json_integer((json_int_t)st.finished));
        json_object_set_new(root, "engine", e);
    }
    if (d->o.stats) {
        char *s = d->o.stats(d->o.stats_arg);
        json_t *sj = s ? json_loads(s, 0, NULL) : NULL;
        if (sj) json_object_set_new(root, "server", sj);
        free(s);
    }
    char *out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return out;
}

static void send_event(sse_client *c, const char *js)
{
    struct evbuffer *b = evbuffer_new();
    if (!b) return;
    evbuffer_add_printf(b, "data: %s\n\n", js);
    evhttp_send_reply_chunk(c->req, b);
    evbuffer_free(b);
}

static void client_remove(sf_dashboard *d, sse_client *c)
{
    for (sse_client **p = &d->clients; *p; p = &(*p)->next)
        if (*p == c) { *p = c->next; d->n_clients--; break; }
    free(c);
}

static void client_closed(struct evhttp_connection *conn, void *arg)
{
    sse_client *c = arg;
    /* A client that went away mid-stream leaves its request detached from the connection
     * (libevent: the streaming side must end it, which then frees it). When the whole evhttp is
     * being freed the request is still attached and libevent frees it itself. */
    if (!evhttp_request_get_connection(c->req)) evhttp_send_reply_end(c->req);
    client_remove(c->d, c);
}

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
    sf_dashboard *d = arg;
    if (!d->clients) return;
    char *js = event_json(d);
    if (!js) return;
    for (sse_client *c = d->clients; c; c = c->next) send_event(c, js);
    free(js);
}

static void events_cb(struct evhttp_request *req, void *arg)
{
    sf_dashboard *d = arg;
    if (evhttp_request_get_command(req) != EVHTTP_REQ_GET) {
        evhttp_send_error(req, 405, "only GET is served here");
        return;
    }
    sse_client *c = calloc(1, sizeof *c);
    if (!c) { evhttp_send_error(req, 503, "out of memory"); return; }
    c->req = req;
    c->d = d;
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Accel-Buffering", "no");
    evhttp_send_reply_start(req, 200, "OK");
    evhttp_connection_set_closecb(evhttp_request_get_connection(req), client_closed, c);
    c->next = d->clients;
    d->clients = c;
    d->n_clients++;
    char *js = event_json(d); /* the first message right away, then one per tick */
    if (js) send_event(c, js);
    free(js);
}

int sf_dashboard_register(struct evhttp *http, struct event_base *base, const sf_dashboard_opts *o,
                          sf_dashboard **out, sf_error *err)
{
    sf_dashboard *d = NULL;
    int rc;

    *out = NULL;
    if (!http || !base) return sf_err(err, SF_EINVAL, "dashboard: no HTTP server to register on");
    if (!(d = calloc(1, sizeof *d))) return sf_err(err, SF_ENOMEM, "dashboard: out of memory");
    d->http = http;
    d->base = base;
    if (o) d->o = *o;
    if (d->o.monitor_off) snprintf(d->off_reason, sizeof d->off_reason, "%s", d->o.monitor_off);
    d->o.monitor_off = NULL;
    struct timeval one = { .tv_sec = 1 };
    if (event_assign(&d->tick, base, -1, EV_PERSIST, tick_cb, d) || event_add(&d->tick, &one)) {
        rc = sf_err(err, SF_ERROR, "dashboard: cannot create its timer");
        goto fail;
    }
    d->tick_added = 1;
    if (evhttp_set_cb(http, "/dashboard", page_cb, d)) {
        rc = sf_err(err, SF_EINVAL, "dashboard: /dashboard is already routed on this server");
        goto fail;
    }
    if (evhttp_set_cb(http, "/dashboard/events", events_cb, d)) {
        evhttp_del_cb(http, "/dashboard"); /* ours, just added */
        rc = sf_err(err, SF_EINVAL, "dashboard: /dashboard/events is already routed on this server");
        goto fail;
    }
    *out = d;
    return SF_OK;
fail:
    if (d->tick_added) event_del(&d->tick);
    free(d);
    return rc;
}

void sf_dashboard_free(sf_dashboard *d)
{
    if (!d) return;
    evhttp_del_cb(d->http, "/dashboard");
    evhttp_del_cb(d->http, "/dashboard/events");
    while (d->clients) {
        sse_client *c = d->clients;
        evhttp_connection_set_closecb(evhttp_request_get_connection(c->req), NULL, NULL);
        evhttp_send_reply_end(c->req);
        client_remove(d, c);
    }
    event_del(&d->tick);
    free(d);
}

/* ---- glue for the gateway's hooks ---------------------------------------------------------- */
struct sf_dashboard_set {
    pthread_mutex_t mu;
    sf_dashboard_opts o;
    char off_reason[512];
    sf_dashboard **dash;
    int n;
};

sf_dashboard_set *sf_dashboard_set_new(const sf_dashboard_opts *o)
{
    sf_dashboard_set *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    if (o) s->o = *o;
    if (s->o.monitor_off) snprintf(s->off_reason, sizeof s->off_reason, "%s", s->o.monitor_off);
    s->o.monitor_off = s->off_reason;
    return s;
}

int sf_dashboard_worker_init(void *set, int worker, struct evhttp *http, struct event_base *base, sf_error *err)
{
    sf_dashboard_set *s = set;
    sf_dashboard *d = NULL;
    if (!s) return sf_err(err, SF_EINVAL, "dashboard: no dashboard set given to worker %d", worker);
    int rc = sf_dashboard_register(http, base, &s->o, &d, err);
    if (rc != SF_OK) return sf_err_wrap(err, "worker %d", worker);
    pthread_mutex_lock(&s->mu);
    sf_dashboard **nd = realloc(s->dash, (size_t)(s->n + 1) * sizeof *nd);
    if (nd) {
        s->dash = nd;
        s->dash[s->n++] = d;
    }
    pthread_mutex_unlock(&s->mu);
    if (!nd) {
        sf_dashboard_free(d);
        return sf_err(err, SF_ENOMEM, "dashboard: out of memory registering worker %d", worker);
    }
    return SF_OK;
}

void sf_dashboard_set_free(sf_dashboard_set *s)
{
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        sf_dashboard *d = s->dash[i];
        /* the evhttp is gone: its connections' close callbacks have removed the clients already;
         * anything left is only our memory */
        while (d->clients) {
            sse_client *c = d->clients;
            d->clients = c->next;
            free(c);
        }
        free(d);
    }
    free(s->dash);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void sf_monitor_metrics_write(void *monitor, FILE *out)
{
    char *text = sf_monitor_metrics(monitor);
    if (text) fputs(text, out);
    free(text);
}
