/* loadgen.h — a load generator for OpenAI-compatible servers (libevent HTTP client, one
 * thread): fixed concurrency or Poisson arrivals, a scenario mixing intent classes, tenants
 * (API keys), prompt and output lengths; streaming; the vLLM `bench serve` metrics per class.
 *
 * Targets are restricted to loopback addresses. Runs are bounded in requests and in time. */
#ifndef SF_GW_LOADGEN_H
#define SF_GW_LOADGEN_H

#include <stdint.h>
#include <stdio.h>

#include "../common/sf.h"

enum { SF_LG_FIXED = 0, SF_LG_UNIFORM, SF_LG_NORMAL };
typedef struct sf_lg_dist {
    int kind;                 /* SF_LG_* */
    double a, b;              /* fixed: a; uniform: [a, b]; normal: mean a, std b */
    int min, max;             /* clamp */
} sf_lg_dist;

typedef struct sf_lg_class {
    char name[48];
    double weight;
    char intent[256];         /* X-Semantic-Intent value, "" for none */
    char api_key[256];        /* "" for none */
    int chat;                 /* 1: /v1/chat/completions, 0: /v1/completions */
    sf_lg_dist prompt, output;/* prompt words, output tokens */
    int prefix_words;         /* words every prompt of the class begins with (drawn once per class;
                               * for chat, a system message), before its own drawn words */
} sf_lg_class;

#define SF_LG_MAX_CLASSES 16
#define SF_LG_DEFAULT_REQUESTS 100
typedef struct sf_lg_config {
    char host[256];
    int port;
    int concurrency;          /* > 0: closed loop with this many in flight */
    double rate;              /* > 0: Poisson arrivals per second (open loop) */
    int num_requests;         /* stop issuing after this many (default 100) */
    double duration_s;        /* stop issuing after this long (0: no limit) */
    double timeout_s;         /* per request (default 300) */
    sf_lg_class classes[SF_LG_MAX_CLASSES];
    int n_classes;
    double slo_ttft_s, slo_tpot_s, slo_e2el_s; /* 0: none */
    uint64_t seed;
    int ignore_eos;
    char model[256];          /* "" : not sent */
} sf_lg_config;

void sf_lg_config_default(sf_lg_config *c);
/* "http://127.0.0.1:8080" (loopback only). */
int sf_lg_parse_url(sf_lg_config *c, const char *url, sf_error *err);
/* "ttft=300ms,tpot=50ms,e2el=2s" */
int sf_lg_parse_slo(sf_lg_config *c, const char *s, sf_error *err);
/* Scenario file: {"rate": R, "duration_s": S, "slo": "ttft=400ms,tpot=20ms" (all three optional: they
 *   apply where the command line left them unset; with rate and duration the request cap becomes
 *   2 x rate x duration + 10 unless --num-requests changed it), "classes": [{"name", "weight", "intent", "api_key", "endpoint": "completions"|"chat",
 *   "prompt_tokens": N | {"dist": "uniform", "min", "max"} | {"dist": "normal", "mean", "std", "min", "max"},
 *   "output_tokens": same, "prefix_tokens": N (words every prompt of the class begins with)}]} */
int sf_lg_load_scenario(sf_lg_config *c, const char *path, sf_error *err);
int sf_lg_parse_dist(const char *text, sf_lg_dist *d, sf_error *err); /* "32" | "uniform:16:64" | "normal:32:8" */

typedef struct sf_lg_sample {
    int cls;
    int status;               /* HTTP status, 0: connection error / timeout */
    int ok;                   /* 200 and the stream ended with [DONE] */
    double t_start, ttft, e2el, tpot;
    int prompt_tokens, output_tokens;
    int cached_tokens;        /* usage.prompt_tokens_details.cached_tokens: found in the prefix cache */
    double *itl;              /* [n_itl] */
    int n_itl;
} sf_lg_sample;

typedef struct sf_lg_result {
    sf_lg_sample *s;
    int n;
    double elapsed_s;
} sf_lg_result;

int sf_loadgen_run(const sf_lg_config *c, sf_lg_result **out, sf_error *err);
void sf_lg_result_free(sf_lg_result *r);
void sf_lg_report_table(const sf_lg_config *c, const sf_lg_result *r, FILE *f);
int sf_lg_report_json(const sf_lg_config *c, const sf_lg_result *r, const char *path, sf_error *err);

#endif
