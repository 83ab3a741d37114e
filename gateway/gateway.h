/* gateway.h — the HTTP server: OpenAI API over libevent, one event base per worker thread,
 * each worker with its own SO_REUSEPORT listening socket on the same address.
 *
 *   sf_gateway_new()   binds the listeners and starts the workers (/health answers 503)
 *   sf_gateway_run()   loads the engine (then /health answers 200), serves until SIGTERM/SIGINT
 *                      or sf_gateway_stop(), drains in-flight requests, returns
 *   sf_gateway_free()  joins the workers and frees everything
 *
 * Threads: the caller's thread runs sf_gateway_run (signals are blocked in every gateway
 * thread and taken with sigtimedwait there); workers own their evhttp; the engine's callbacks
 * (engine thread) only copy events into per-request queues and wake the owning worker. */
#ifndef SF_GATEWAY_H
#define SF_GATEWAY_H

#include <stdio.h>

#include "../common/sf.h"
#include "../engine/engine.h"

struct evhttp;
struct evhttp_request;
struct sf_tenants;
struct event_base;
typedef struct sf_gateway sf_gateway;

typedef struct sf_gateway_config {
    const char *host;            /* default "127.0.0.1" */
    int port;                    /* default 8080; 0: pick a free port (see sf_gateway_port) */
    int workers;                 /* event-loop threads; <= 0: one per core (at most 16) */
    const char *tenants_path;    /* NULL: open server, tenant "default" */
    sf_engine_config engine;
    int max_body_bytes;          /* request bodies above this get 413 (default 4 MiB) */
    int max_header_bytes;        /* default 16 KiB */
    int timeout_s;               /* read/write timeout per connection (default 30) */
    double drain_timeout_s;      /* SIGTERM: how long in-flight requests may run on (default 30) */
    const char *served_name;     /* model id clients must use; NULL: the engine's model name */
    /* Optional hooks for other subsystems (the eBPF dashboard and monitor). Both run on a
     * worker thread and must not block. http_hook returns 1 when it answered the request. */
    int (*http_hook)(void *user, struct evhttp_request *req);
    void *http_hook_user;
    void (*extra_metrics)(void *user, FILE *out);
    void *extra_metrics_user;
    /* Called once per worker before it serves (e.g. sf_dashboard_register); non-zero fails
     * sf_gateway_new with the message in err. */
    int (*worker_init)(void *user, int worker, struct evhttp *http, struct event_base *base, sf_error *err);
    /* Called once per initialized worker after its thread stopped, before its evhttp and base
     * are freed (e.g. sf_dashboard_free). */
    void (*worker_fini)(void *user, int worker);
    void *worker_init_user;
    /* Called on worker `worker`'s thread whenever its in-flight generation count changes (e.g.
     * sf_steer_set_load, so new connections go to the least-loaded worker). */
    void (*on_worker_load)(void *user, int worker, int inflight);
    void *on_worker_load_user;
} sf_gateway_config;
void sf_gateway_config_default(sf_gateway_config *c);

int sf_gateway_new(const sf_gateway_config *c, sf_gateway **out, sf_error *err);
/* Blocks until stopped; SF_OK after a clean drain, an error when the model failed to load. */
int sf_gateway_run(sf_gateway *gw, sf_error *err);
/* Any thread (also a signal-free way to end sf_gateway_run). */
void sf_gateway_stop(sf_gateway *gw);
void sf_gateway_free(sf_gateway *gw);

/* The listening sockets (one per worker, one SO_REUSEPORT group), for an SK_REUSEPORT
 * program to attach to: returns how many; *fds stays valid until sf_gateway_free. */
int sf_gateway_listen_fds(const sf_gateway *gw, const int **fds);
int sf_gateway_port(const sf_gateway *gw);
/* The tenants table (immutable; its limiter state is internal): for steering prefixes. */
const struct sf_tenants *sf_gateway_tenants(const sf_gateway *gw);
/* The engine once loaded (NULL before). */
sf_engine *sf_gateway_engine(const sf_gateway *gw);

#endif
