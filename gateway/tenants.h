/* tenants.h — who is asking: API keys, default intents, urgency caps, token-rate and
 * concurrency limits, client address prefixes (--tenants FILE).
 *
 * File format (JSON; unknown keys are errors so typos do not silently disable a limit):
 *   { "tenants": [ {
 *       "name": "acme",                          required, 1..63 chars [A-Za-z0-9._-]
 *       "api_keys": ["sk-acme-1", ...],          required, non-empty, unique across tenants
 *       "default_intent": "realtime-chat; urgency=high",   optional (header grammar or object)
 *       "max_urgency": "normal",                 optional, default "high"
 *       "token_rate_limit": 200,                 output tokens/s, optional (0/absent: none)
 *       "token_burst": 400,                      bucket size, default 10 s of the rate
 *       "max_concurrent": 8,                     in-flight requests, optional (0/absent: none)
 *       "client_prefixes": ["10.1.0.0/16", "fd00::/8"]  optional; for eBPF connection steering
 *   } ] }
 *
 * Urgency above a tenant's max_urgency is capped to it (not refused): a client that asks for
 * more than it may have still gets served, in its own lane, and the applied intent is echoed in
 * the X-Semantic-Intent-Applied response header. No tenant can escalate itself.
 *
 * The table is immutable after loading except each tenant's limiter state, which is guarded
 * by the tenant's own mutex: admit/release/charge may be called from any thread. */
#ifndef SF_GW_TENANTS_H
#define SF_GW_TENANTS_H

#include <pthread.h>
#include <stdint.h>

#include "../common/sf.h"
#include "../engine/engine.h"

typedef struct sf_prefix {
    int family;               /* AF_INET | AF_INET6 */
    uint8_t addr[16];         /* network byte order; 4 bytes used for AF_INET */
    int bits;                 /* prefix length */
} sf_prefix;

typedef struct sf_tenant {
    char name[64];
    char **keys;
    int n_keys;
    sf_intent default_intent; /* class "default"/normal when the file gives none */
    int max_urgency;          /* SF_URGENCY_* */
    double rate_tps;          /* 0: unlimited */
    double burst;
    int max_concurrent;       /* 0: unlimited */
    sf_prefix *prefixes;
    int n_prefixes;
    /* limiter state (mu) */
    pthread_mutex_t mu;
    double bucket;            /* tokens available; negative: in debt */
    double bucket_t;          /* last refill, sf_now_s() */
    int active;               /* admitted, not yet released */
} sf_tenant;

typedef struct sf_tenants {
    sf_tenant *t;
    int n;
    int open;                 /* 1: no file; one tenant "default", no key needed */
} sf_tenants;

int sf_tenants_load(const char *path, sf_tenants **out, sf_error *err);
int sf_tenants_parse(const char *json, size_t len, sf_tenants **out, sf_error *err);
/* The open server: one tenant "default" without limits. */
int sf_tenants_open(sf_tenants **out, sf_error *err);
void sf_tenants_free(sf_tenants *ts);

/* The tenant of an Authorization header value ("Bearer KEY"), NULL when the key is missing or
 * unknown (answer 401). An open table returns its default tenant for any header. */
sf_tenant *sf_tenants_auth(sf_tenants *ts, const char *authorization);

/* Admission: SF_OK (active++), or SF_AGAIN with *retry_after_s when the tenant is at its
 * concurrency limit or its token bucket is empty; *why says which ("concurrency" | "rate"). */
int sf_tenant_admit(sf_tenant *t, double now, double *retry_after_s, const char **why);
void sf_tenant_release(sf_tenant *t);
/* Take n output tokens from the bucket (may go into debt; the debt delays later admissions). */
void sf_tenant_charge(sf_tenant *t, int n, double now);

/* Applies the urgency cap; returns 1 when it lowered the urgency. */
int sf_tenant_cap(const sf_tenant *t, sf_intent *in);

/* Parse "10.0.0.0/8" / "fd00::/8" / a bare address (full length). Host bits must be zero. */
int sf_prefix_parse(const char *s, sf_prefix *p, sf_error *err);
/* 1 if addr (family, network byte order) lies in p. */
int sf_prefix_match(const sf_prefix *p, int family, const uint8_t *addr);

#endif
