/* metrics.h — the gateway's Prometheus metrics: requests by tenant/class/status, TTFT, ITL and
 * E2E histograms, rejections, plus the engine's gauges at scrape time.
 *
 * Updated from every worker thread (each histogram and the request table have their own
 * mutex; scrapes are rare, updates are short). One instance per server. */
#ifndef SF_GW_METRICS_H
#define SF_GW_METRICS_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>

#include "../engine/engine.h"

#define SF_HIST_BUCKETS 16
typedef struct sf_hist {
    pthread_mutex_t mu;
    const double *bounds;     /* [SF_HIST_BUCKETS] upper bounds, seconds */
    uint64_t counts[SF_HIST_BUCKETS + 1]; /* last: +Inf */
    uint64_t n;
    double sum;
} sf_hist;

#define SF_METRICS_KEYS 512
typedef struct sf_metrics_key {
    char tenant[64], cls[48];
    int status;
    uint64_t count;
} sf_metrics_key;

typedef struct sf_metrics {
    sf_hist ttft, itl, e2e;
    sf_hist gateway;          /* request time outside the engine: arrival to submit, plus
                                 engine-done to response handed to the socket */
    pthread_mutex_t mu;
    sf_metrics_key keys[SF_METRICS_KEYS];
    int n_keys;
    uint64_t overflow;        /* requests whose key did not fit in the table */
    uint64_t prompt_tokens, completion_tokens;
    uint64_t rejected_tenant_rate, rejected_tenant_conc, rejected_queue_full;
    uint64_t client_disconnects;
    uint64_t accept_errors;   /* accept() failures (out of file descriptors, ...) */
    int active;               /* requests in flight in the gateway */
} sf_metrics;

void sf_metrics_init(sf_metrics *m);
void sf_metrics_destroy(sf_metrics *m);
void sf_hist_observe(sf_hist *h, double seconds);
/* One finished HTTP request (any status). */
void sf_metrics_request(sf_metrics *m, const char *tenant, const char *cls, int status);
void sf_metrics_add(sf_metrics *m, uint64_t *counter, uint64_t n);
void sf_metrics_active(sf_metrics *m, int delta);

/* Prometheus text exposition. engine may be NULL (still loading). */
void sf_metrics_render(sf_metrics *m, sf_engine *engine, FILE *out);

#endif
