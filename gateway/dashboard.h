/* dashboard.h — the live contention dashboard: GET /dashboard (one HTML page with its
 * scripts and styles embedded in the binary, uPlot charts) and GET /dashboard/events (a
 * Server-Sent Events stream: one `data: {json}` message per second with the monitor's
 * snapshot and the server's stats).
 *
 * The gateway calls sf_dashboard_register once per evhttp it serves (one per worker event
 * loop). Everything the dashboard does then runs on that loop's thread: a one-second timer
 * writes to every open event stream of that loop. */
#ifndef SF_DASHBOARD_H
#define SF_DASHBOARD_H

#include <stdio.h>

#include "../common/sf.h"

struct evhttp;
struct event_base;
struct sf_monitor;
struct sf_engine;

/* Returns a malloc'd JSON object (one line) of the server's own stats — queues and latency
 * per class, scheduler decisions — merged into each event under "server". Called on the
 * loop's thread once a second; may return NULL. */
typedef char *(*sf_dashboard_stats_fn)(void *arg);

typedef struct sf_dashboard_opts {
    struct sf_monitor *monitor;   /* may be NULL: the page says why BPF is off (monitor_off) */
    const char *monitor_off;      /* one-line reason the monitor is off, copied */
    struct sf_engine *engine;     /* may be NULL: engine stats are left out */
    sf_dashboard_stats_fn stats;  /* may be NULL */
    void *stats_arg;
    /* Where the engine is known only later (the gateway loads it after its workers start):
     * called on the loop's thread each tick when engine is NULL; may return NULL. */
    struct sf_engine *(*engine_fn)(void *arg);
    void *engine_arg;
} sf_dashboard_opts;

typedef struct sf_dashboard sf_dashboard;

/* Registers /dashboard and /dashboard/events on http (whose loop is base). The monitor and
 * engine must outlive the dashboard. Free before freeing http and base. */
int sf_dashboard_register(struct evhttp *http, struct event_base *base, const sf_dashboard_opts *o,
                          sf_dashboard **out, sf_error *err);
void sf_dashboard_free(sf_dashboard *d);

/* ---- glue for sf_gateway_config (gateway/gateway.h) ----------------------------------------
 *   set = sf_dashboard_set_new(&opts);
 *   cfg.worker_init = sf_dashboard_worker_init;      cfg.worker_init_user = set;
 *   cfg.extra_metrics = sf_monitor_metrics_write;    cfg.extra_metrics_user = monitor;
 *   ... sf_gateway_free(gw);  sf_dashboard_set_free(set);
 * sf_dashboard_set_free runs after the loops and their evhttp/event_base are freed: it
 * releases only the dashboards' own memory (their timers live inside it, so freeing the base
 * first is safe). */
typedef struct sf_dashboard_set sf_dashboard_set;
sf_dashboard_set *sf_dashboard_set_new(const sf_dashboard_opts *o); /* NULL: out of memory */
int sf_dashboard_worker_init(void *set, int worker, struct evhttp *http, struct event_base *base, sf_error *err);
void sf_dashboard_set_free(sf_dashboard_set *s);
/* sf_gateway_config.extra_metrics: the monitor's Prometheus text (monitor may be NULL). */
void sf_monitor_metrics_write(void *monitor, FILE *out);

/* 1 when the page's scripts were bundled into this build (npm was available at build time);
 * otherwise /dashboard answers 503 saying so. */
int sf_dashboard_available(void);

#endif
