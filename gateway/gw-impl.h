/* gw-impl.h — internals shared by the gateway's files (server.c, http.c, routes.c,
 * completions.c). Not for use outside gateway/. */
#ifndef SF_GW_IMPL_H
#define SF_GW_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include <event2/event.h>
#include <event2/http.h>
#include <jansson.h>

#include "gateway.h"
#include "metrics.h"
#include "params.h"
#include "tenants.h"

typedef struct gw_worker {
    struct sf_gateway *gw;
    int idx;
    struct event_base *base;
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    int fd;
    pthread_t thread;
    int started;
    int inited;               /* worker_init ran: worker_fini is owed */
    int inflight;             /* generation requests in flight (this worker's thread only) */
    atomic_int flush_rounds;  /* drain: loop rounds run since the last request ended (flush_cb) */
    double accept_warned;     /* when accept()'s last failure was logged (this worker's thread) */
} gw_worker;

struct sf_gateway {
    sf_gateway_config cfg;
    char host[256];
    int port;
    gw_worker *workers;
    int n_workers;
    int *fds;
    sf_tenants *tenants;
    sf_metrics metrics;
    _Atomic(sf_engine *) engine;  /* set once loaded */
    atomic_int draining;          /* 1: SIGTERM seen, new requests get 503 */
    atomic_int stop;              /* sf_gateway_stop() */
    char model_name[256];
    int max_model_len;
    long created;                 /* unix time, for /v1/models and responses */
    atomic_ulong next_id;
};

/* http.c */
void gw_send_json(struct evhttp_request *req, int status, json_t *body); /* steals body */
void gw_send_error(struct evhttp_request *req, const sf_gw_err *e, double retry_after_s);
int gw_error(struct evhttp_request *req, int status, const char *type, const char *code, const char *param,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Body bytes (linearized; valid until the request is answered), NULL when empty. */
const char *gw_body(struct evhttp_request *req, size_t *len);
const char *gw_header(struct evhttp_request *req, const char *name);
const char *gw_status_reason(int status);
/* A JSON string of text that should be UTF-8; invalid bytes become U+FFFD. */
json_t *gw_json_text(const char *s, size_t n);

/* routes.c */
void gw_route_health(sf_gateway *gw, struct evhttp_request *req);
void gw_route_metrics(sf_gateway *gw, struct evhttp_request *req);
void gw_route_models(sf_gateway *gw, struct evhttp_request *req);
void gw_route_tokenize(sf_gateway *gw, struct evhttp_request *req, sf_engine *e);
void gw_route_detokenize(sf_gateway *gw, struct evhttp_request *req, sf_engine *e);
/* Shared by routes: tokenize a chat or a completion prompt. Fills e on failure. */
/* The prompt's ids: chat's messages rendered and encoded, or completions prompt `which`. */
int gw_tokenize_prompt(sf_engine *engine, const sf_gw_params *p, int which, int32_t **ids, int *n, sf_gw_err *e);

/* server.c: a worker's in-flight count changed by delta (worker thread) */
void gw_worker_load(gw_worker *w, int delta);

/* completions.c */
void gw_route_generate(gw_worker *w, struct evhttp_request *req, int kind, sf_engine *engine);

#endif
