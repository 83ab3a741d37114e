/* server.c — listeners, worker threads, request dispatch, model loading, signals, drain. */
#include "gw-impl.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/listener.h>
#include <event2/thread.h>

#include "intent.h"

void sf_gateway_config_default(sf_gateway_config *c)
{
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_body_bytes = 4 << 20;
    c->max_header_bytes = 16 << 10;
    c->timeout_s = 30;
    c->drain_timeout_s = 30;
    sf_engine_config_default(&c->engine);
}

static const char *allow_for(const char *path)
{
    if (!strcmp(path, "/v1/chat/completions") || !strcmp(path, "/v1/completions") || !strcmp(path, "/tokenize") ||
        !strcmp(path, "/detokenize"))
        return "POST";
    if (!strcmp(path, "/health") || !strcmp(path, "/metrics") || !strcmp(path, "/v1/models")) return "GET, HEAD";
    return NULL;
}

static const char *method_name(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_TRACE: return "TRACE";
    case EVHTTP_REQ_CONNECT: return "CONNECT";
    case EVHTTP_REQ_PATCH: return "PATCH";
    }
    return "?";
}

/* The one request callback of every worker. */
static void dispatch(struct evhttp_request *req, void *arg)
{
    gw_worker *w = arg;
    sf_gateway *gw = w->gw;
    if (gw->cfg.http_hook && gw->cfg.http_hook(gw->cfg.http_hook_user, req)) return;

    const char *uri = evhttp_request_get_uri(req);
    char path[256];
    size_t n = strcspn(uri, "?#");
    if (n >= sizeof path) n = sizeof path - 1;
    memcpy(path, uri, n);
    path[n] = 0;
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;

    const char *allow = allow_for(path);
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    if (!allow) {
        gw_error(req, 404, "invalid_request_error", "not_found", NULL,
                 "no route for %s %.200s; see GET /v1/models, POST /v1/chat/completions, POST /v1/completions, "
                 "POST /tokenize, POST /detokenize, GET /health, GET /metrics",
                 method_name(m), path);
        sf_metrics_request(&gw->metrics, "-", "-", 404);
        return;
    }
    int is_post = !strcmp(allow, "POST");
    if ((is_post && m != EVHTTP_REQ_POST) || (!is_post && m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD)) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", allow);
        gw_error(req, 405, "invalid_request_error", "method_not_allowed", NULL, "%s is not allowed on %s; use %s",
                 method_name(m), path, allow);
        sf_metrics_request(&gw->metrics, "-", "-", 405);
        return;
    }
    if (!strcmp(path, "/health")) return gw_route_health(gw, req);
    if (!strcmp(path, "/metrics")) return gw_route_metrics(gw, req);

    sf_engine *engine = atomic_load(&gw->engine);
    if (atomic_load(&gw->draining)) {
        gw_error(req, 503, "service_unavailable", "draining", NULL, "the server is shutting down; retry on another instance");
        sf_metrics_request(&gw->metrics, "-", "-", 503);
        return;
    }
    if (!engine) {
        gw_error(req, 503, "service_unavailable", "loading", NULL, "the model is still loading; retry shortly "
                                                                   "(GET /health answers 200 when ready)");
        sf_metrics_request(&gw->metrics, "-", "-", 503);
        return;
    }
    if (!strcmp(path, "/v1/models")) return gw_route_models(gw, req);
    if (!strcmp(path, "/tokenize")) return gw_route_tokenize(gw, req, engine);
    if (!strcmp(path, "/detokenize")) return gw_route_detokenize(gw, req, engine);
    if (!strcmp(path, "/v1/chat/completions")) return gw_route_generate(w, req, SF_GW_CHAT, engine);
    gw_route_generate(w, req, SF_GW_COMPLETIONS, engine);
}

static int open_listener(const struct addrinfo *ai, sf_error *err)
{
    int one = 1;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return sf_err(err, SF_EIO, "socket(): %s", strerror(errno)), -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one)) {
        sf_err(err, SF_EIO, "setsockopt(SO_REUSEPORT): %s", strerror(errno));
        goto fail;
    }
    if (bind(fd, ai->ai_addr, ai->ai_addrlen)) {
        sf_err(err, SF_EIO, "bind(): %s%s", strerror(errno),
               errno == EADDRINUSE ? " (another process holds the port; choose one with --port)" : "");
        goto fail;
    }
    if (listen(fd, 1024)) {
        sf_err(err, SF_EIO, "listen(): %s", strerror(errno));
        goto fail;
    }
    return fd;
fail:
    close(fd);
    return -1;
}

/* The workers' listeners share the port with SO_REUSEPORT, which would as well let them join the
 * group of another process of the same user listening there (a second semflow on the same port:
 * each would get part of the connections, silently). A socket without it binds only where no one
 * listens (SO_REUSEADDR still passes connections in TIME_WAIT). */
static int port_taken(const struct addrinfo *ai)
{
    int one = 1, taken = 0;
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return 0; /* open_listener reports it */
    if (!setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) && bind(fd, ai->ai_addr, ai->ai_addrlen))
        taken = errno == EADDRINUSE;
    close(fd);
    return taken;
}

static int open_listeners(sf_gateway *gw, sf_error *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE }, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", gw->cfg.port);
    int rc = getaddrinfo(gw->host, port, &hints, &ai);
    if (rc) return sf_err(err, SF_EINVAL, "cannot resolve --host %s: %s", gw->host, gai_strerror(rc));
    if (gw->cfg.port && port_taken(ai)) {
        freeaddrinfo(ai);
        return sf_err(err, SF_EIO, "listening on %s:%d: another process listens there (a second semflow?); choose "
                                   "another port with --port", gw->host, gw->cfg.port);
    }
    for (int i = 0; i < gw->n_workers; i++) {
        if (i == 1 && gw->cfg.port == 0) {
            /* port 0: the first bind picked a port; the rest of the group joins it */
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            getsockname(gw->fds[0], (struct sockaddr *)&ss, &sl);
            memcpy(ai->ai_addr, &ss, ai->ai_addrlen);
        }
        gw->fds[i] = open_listener(ai, err);
        if (gw->fds[i] < 0) {
            sf_err_wrap(err, "listening on %s:%d", gw->host, gw->cfg.port);
            freeaddrinfo(ai);
            return SF_EIO;
        }
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(gw->fds[0], (struct sockaddr *)&ss, &sl);
    gw->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    freeaddrinfo(ai);
    return SF_OK;
}

static __thread gw_worker *this_worker; /* the worker whose loop runs on this thread */

static void *worker_main(void *arg)
{
    gw_worker *w = arg;
    this_worker = w;
    event_base_loop(w->base, EVLOOP_NO_EXIT_ON_EMPTY);
    return NULL;
}

/* Out of file descriptors (EMFILE, ENFILE) or memory, accept() fails and the connection stays in
 * the backlog, so the listener would be readable again at once: libevent would retry (and warn)
 * in a loop that takes the worker's CPU. As nginx does, stop accepting for a while instead, and
 * say so once per episode; the connections waiting in the backlog are accepted after it. */
#define ACCEPT_PAUSE_US 100000

static void accept_resume_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    if (w->bound) evconnlistener_enable(evhttp_bound_socket_get_listener(w->bound)); /* gone: draining */
}

static void accept_error_cb(struct evconnlistener *l, void *arg)
{
    const int e = EVUTIL_SOCKET_ERROR();
    gw_worker *w = this_worker;
    const double now = sf_now_s();
    sf_metrics_add(&w->gw->metrics, &w->gw->metrics.accept_errors, 1);
    if (now - w->accept_warned > 10) {
        w->accept_warned = now;
        SF_LOGW("worker %d: accept(): %s; not accepting for %d ms at a time until it passes%s", w->idx,
                evutil_socket_error_to_string(e), ACCEPT_PAUSE_US / 1000,
                e == EMFILE || e == ENFILE ? " (raise the open-files limit: ulimit -n)" : "");
    }
    evconnlistener_disable(l);
    static const struct timeval pause = { 0, ACCEPT_PAUSE_US };
    event_base_once(w->base, -1, EV_TIMEOUT, accept_resume_cb, w, &pause);
}

static int worker_init(sf_gateway *gw, gw_worker *w, sf_error *err)
{
    w->gw = gw;
    w->base = event_base_new();
    if (!w->base) return sf_err(err, SF_ENOMEM, "event_base_new() failed");
    w->http = evhttp_new(w->base);
    if (!w->http) return sf_err(err, SF_ENOMEM, "evhttp_new() failed");
    /* The transport cap is twice the API limit so bodies just above the limit still reach the
     * handler and get an OpenAI-shaped 413; far larger ones are cut off by evhttp itself. */
    evhttp_set_max_body_size(w->http, (ev_ssize_t)gw->cfg.max_body_bytes * 2);
    evhttp_set_max_headers_size(w->http, gw->cfg.max_header_bytes);
    struct timeval tv = { gw->cfg.timeout_s, 0 };
    evhttp_set_timeout_tv(w->http, &tv);
    evhttp_set_allowed_methods(w->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD | EVHTTP_REQ_PUT |
                                            EVHTTP_REQ_DELETE | EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                            EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(w->http, dispatch, w);
    if (gw->cfg.worker_init) {
        int rc = gw->cfg.worker_init(gw->cfg.worker_init_user, w->idx, w->http, w->base, err);
        if (rc) return rc;
        w->inited = 1;
    }
    w->bound = evhttp_accept_socket_with_handle(w->http, w->fd);
    if (!w->bound) return sf_err(err, SF_EIO, "evhttp_accept_socket() failed for worker %d", w->idx);
    evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(w->bound), accept_error_cb);
    if (sf_thread_create(&w->thread, worker_main, w)) return sf_err(err, SF_ERROR, "pthread_create() failed");
    w->started = 1;
    return SF_OK;
}

int sf_gateway_new(const sf_gateway_config *c, sf_gateway **out, sf_error *err)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    int rc;
    pthread_once(&once, (void (*)(void))evthread_use_pthreads);
    sf_gateway *gw = calloc(1, sizeof *gw);
    if (!gw) return sf_err(err, SF_ENOMEM, "gateway: out of memory");
    gw->cfg = *c;
    snprintf(gw->host, sizeof gw->host, "%s", c->host ? c->host : "127.0.0.1");
    gw->cfg.host = gw->host;
    if (gw->cfg.max_body_bytes <= 0) gw->cfg.max_body_bytes = 4 << 20;
    if (gw->cfg.max_header_bytes <= 0) gw->cfg.max_header_bytes = 16 << 10;
    if (gw->cfg.timeout_s <= 0) gw->cfg.timeout_s = 30;
    gw->n_workers = c->workers > 0 ? c->workers : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (gw->n_workers < 1) gw->n_workers = 1;
    if (gw->n_workers > 64) gw->n_workers = 64;
    if (c->workers <= 0 && gw->n_workers > 16) gw->n_workers = 16;
    gw->created = (long)time(NULL);
    atomic_init(&gw->engine, NULL);
    sf_metrics_init(&gw->metrics);
    gw->workers = calloc((size_t)gw->n_workers, sizeof *gw->workers);
    gw->fds = malloc((size_t)gw->n_workers * sizeof *gw->fds);
    if (!gw->workers || !gw->fds) {
        rc = sf_err(err, SF_ENOMEM, "gateway: out of memory");
        goto fail;
    }
    for (int i = 0; i < gw->n_workers; i++) gw->fds[i] = -1;
    rc = c->tenants_path ? sf_tenants_load(c->tenants_path, &gw->tenants, err) : sf_tenants_open(&gw->tenants, err);
    if (rc) goto fail;
    if ((rc = open_listeners(gw, err))) goto fail;
    /* sf_gateway_run takes SIGTERM and SIGINT with sigtimedwait; threads a library starts from
     * this one later inherit the mask (the caller blocks them earlier if anything starts threads
     * before this: cmd_serve's eBPF monitor and CUDA) */
    sf_block_stop_signals(NULL);
    signal(SIGPIPE, SIG_IGN);
    for (int i = 0; i < gw->n_workers; i++) {
        gw->workers[i].idx = i;
        gw->workers[i].fd = gw->fds[i];
        if ((rc = worker_init(gw, &gw->workers[i], err))) goto fail;
    }
    *out = gw;
    return SF_OK;
fail:
    sf_gateway_free(gw);
    return rc;
}

static void exit_loop_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    event_base_loopexit(w->base, NULL);
}

/* A round of the worker's loop: the timer is processed after the loop has polled its sockets,
 * and the writes it found ready ran before this (same priority, queued first). */
static const struct timeval flush_tv = { 0, 1 };

static void flush_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    if (atomic_fetch_add(&w->flush_rounds, 1) + 1 < 2) event_base_once(w->base, -1, EV_TIMEOUT, flush_cb, w, &flush_tv);
}

static void close_listener_cb(evutil_socket_t fd, short what, void *arg)
{
    gw_worker *w = arg;
    if (w->bound) evhttp_del_accept_socket(w->http, w->bound); /* closes the fd */
    w->bound = NULL;
    w->gw->fds[w->idx] = -1;
}

void sf_gateway_free(sf_gateway *gw)
{
    if (!gw) return;
    for (int i = 0; i < gw->n_workers && gw->workers; i++) {
        gw_worker *w = &gw->workers[i];
        if (w->started) {
            event_base_once(w->base, -1, EV_TIMEOUT, exit_loop_cb, w, NULL);
            pthread_join(w->thread, NULL);
        }
        if (w->inited && gw->cfg.worker_fini) gw->cfg.worker_fini(gw->cfg.worker_init_user, i);
        if (w->http) evhttp_free(w->http); /* closes bound sockets */
        else if (gw->fds && gw->fds[i] >= 0) close(gw->fds[i]);
        if (w->base) event_base_free(w->base);
    }
    if (!gw->workers && gw->fds)
        for (int i = 0; i < gw->n_workers; i++)
            if (gw->fds[i] >= 0) close(gw->fds[i]);
    sf_engine_free(atomic_load(&gw->engine));
    sf_tenants_free(gw->tenants);
    sf_metrics_destroy(&gw->metrics);
    free(gw->workers);
    free(gw->fds);
    free(gw);
}

void sf_gateway_stop(sf_gateway *gw) { atomic_store(&gw->stop, 1); }

typedef struct loader {
    sf_gateway *gw;
    sf_error err;
    int rc;
    atomic_int done;
} loader;

static void *load_main(void *arg)
{
    loader *l = arg;
    sf_engine *e = NULL;
    double t0 = sf_now_s();
    l->rc = sf_engine_new(&l->gw->cfg.engine, &e, &l->err);
    if (l->rc == SF_OK) {
        sf_engine_info info;
        sf_engine_get_info(e, &info);
        snprintf(l->gw->model_name, sizeof l->gw->model_name, "%s",
                 l->gw->cfg.served_name ? l->gw->cfg.served_name : info.model_name);
        l->gw->max_model_len = info.max_model_len;
        atomic_store(&l->gw->engine, e);
        SF_LOGI("model %s ready in %.1f s (backend %s, context %d%s)", l->gw->model_name, sf_now_s() - t0,
                info.backend, info.max_model_len, info.random_weights ? ", random weights" : "");
    }
    atomic_store(&l->done, 1);
    return NULL;
}

static const char *sig_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "stop"; }

/* A signal of set (returned), or 0 once *done is set (looked at every 50 ms). */
static int wait_signal(const sigset_t *set, atomic_int *done)
{
    while (!atomic_load(done)) {
        int s = sigtimedwait(set, NULL, &(struct timespec){ 0, 50 * 1000 * 1000 });
        if (s > 0) return s;
    }
    return 0;
}

typedef struct drainer {
    sf_gateway *gw;
    atomic_int done;
} drainer;

/* The engine's drain, then the workers' last events and responses (the engine is idle). */
static void *drain_main(void *arg)
{
    drainer *d = arg;
    sf_gateway *gw = d->gw;
    sf_engine *e = atomic_load(&gw->engine);
    double t0 = sf_now_s();
    if (e) sf_engine_drain(e, gw->cfg.drain_timeout_s);
    while (__atomic_load_n(&gw->metrics.active, __ATOMIC_RELAXED) > 0 && sf_now_s() - t0 < gw->cfg.drain_timeout_s + 5) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    atomic_store(&d->done, 1);
    return NULL;
}

int sf_gateway_run(sf_gateway *gw, sf_error *err)
{
    loader l = { .gw = gw };
    pthread_t lt;
    SF_LOGI("listening on http://%s:%d (%d workers); loading %s", gw->host, gw->port, gw->n_workers,
            gw->cfg.engine.model ? gw->cfg.engine.model : "?");
    if (sf_thread_create(&lt, load_main, &l)) return sf_err(err, SF_ERROR, "pthread_create() failed");
    sigset_t set;
    sf_block_stop_signals(&set); /* blocked since sf_gateway_new: the set to wait for */
    int sig = 0, joined = 0;
    while (!atomic_load(&gw->stop)) {
        struct timespec ts = { 0, 100 * 1000 * 1000 };
        int s = sigtimedwait(&set, NULL, &ts);
        if (s > 0) {
            sig = s;
            break;
        }
        if (!joined && atomic_load(&l.done)) {
            pthread_join(lt, NULL);
            joined = 1;
            if (l.rc) {
                *err = l.err;
                return sf_err_wrap(err, "loading the model");
            }
        }
    }
    SF_LOGI("%s: no longer accepting; draining in-flight requests (at most %.0f s; a second SIGTERM or "
            "SIGINT cancels them now)", sig_name(sig), gw->cfg.drain_timeout_s);
    atomic_store(&gw->draining, 1);
    for (int i = 0; i < gw->n_workers; i++)
        event_base_once(gw->workers[i].base, -1, EV_TIMEOUT, close_listener_cb, &gw->workers[i], NULL);
    if (!joined) { /* a load in progress finishes first */
        if ((sig = wait_signal(&set, &l.done))) {
            SF_LOGW("%s again while the model loads: exiting now", sig_name(sig));
            _exit(1); /* the loader cannot be stopped; the kernel closes its files and BPF links */
        }
        pthread_join(lt, NULL);
    }
    /* the drain on its own thread, so that this one still takes a second signal */
    drainer d = { .gw = gw };
    pthread_t dt;
    double t0 = sf_now_s();
    if (sf_thread_create(&dt, drain_main, &d)) {
        drain_main(&d);
    } else {
        for (int cut = 0; (sig = wait_signal(&set, &d.done));)
            if (!cut++) {
                SF_LOGI("%s again: cancelling the in-flight requests", sig_name(sig));
                sf_engine_drain_cut(atomic_load(&gw->engine));
            }
        pthread_join(dt, NULL);
    }
    /* the last replies may still sit in their connections' output buffers: every worker runs two
     * more rounds of its loop (each writes what its sockets take) before sf_gateway_free ends it;
     * a worker that waits its turn for a CPU is waited for (a client that reads nothing is not) */
    for (int i = 0; i < gw->n_workers; i++) {
        atomic_store(&gw->workers[i].flush_rounds, 0);
        event_base_once(gw->workers[i].base, -1, EV_TIMEOUT, flush_cb, &gw->workers[i], &flush_tv);
    }
    for (double t1 = sf_now_s(); sf_now_s() - t1 < 5;) {
        int n = 0;
        for (int i = 0; i < gw->n_workers; i++) n += atomic_load(&gw->workers[i].flush_rounds) >= 2;
        if (n == gw->n_workers) break;
        struct timespec ts = { 0, 1000 * 1000 };
        nanosleep(&ts, NULL);
    }
    SF_LOGI("drained in %.2f s", sf_now_s() - t0);
    if (!joined && l.rc) {
        *err = l.err;
        return sf_err_wrap(err, "loading the model");
    }
    return SF_OK;
}

int sf_gateway_listen_fds(const sf_gateway *gw, const int **fds)
{
    *fds = gw->fds;
    return gw->n_workers;
}

int sf_gateway_port(const sf_gateway *gw) { return gw->port; }
const struct sf_tenants *sf_gateway_tenants(const sf_gateway *gw) { return gw->tenants; }

void gw_worker_load(gw_worker *w, int delta)
{
    w->inflight += delta;
    if (w->gw->cfg.on_worker_load) w->gw->cfg.on_worker_load(w->gw->cfg.on_worker_load_user, w->idx, w->inflight);
}
sf_engine *sf_gateway_engine(const sf_gateway *gw) { return atomic_load(&((sf_gateway *)gw)->engine); }
