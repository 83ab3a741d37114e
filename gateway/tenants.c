/* tenants.c — the tenants file, API-key lookup and per-tenant limiters. */
#include "tenants.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <jansson.h>

#include "intent.h"

int sf_prefix_parse(const char *s, sf_prefix *p, sf_error *err)
{
    char addr[64];
    const char *slash = strchr(s, '/');
    size_t n = slash ? (size_t)(slash - s) : strlen(s);
    if (n == 0 || n >= sizeof addr)
        return sf_err(err, SF_EINVAL, "client prefix '%.80s' is not an address or address/bits", s);
    memcpy(addr, s, n);
    addr[n] = 0;
    memset(p, 0, sizeof *p);
    int maxbits;
    if (inet_pton(AF_INET, addr, p->addr) == 1) p->family = AF_INET, maxbits = 32;
    else if (inet_pton(AF_INET6, addr, p->addr) == 1) p->family = AF_INET6, maxbits = 128;
    else return sf_err(err, SF_EINVAL, "client prefix '%.80s': '%s' is not an IPv4 or IPv6 address", s, addr);
    p->bits = maxbits;
    if (slash) {
        const char *b = slash + 1;
        char *end;
        if (!isdigit((unsigned char)*b))
            return sf_err(err, SF_EINVAL, "client prefix '%.80s': prefix length must be a number", s);
        long v = strtol(b, &end, 10);
        if (*end || v < 0 || v > maxbits)
            return sf_err(err, SF_EINVAL, "client prefix '%.80s': prefix length must be 0..%d", s, maxbits);
        p->bits = (int)v;
    }
    for (int i = p->bits; i < maxbits; i++)
        if (p->addr[i / 8] & (0x80 >> (i % 8)))
            return sf_err(err, SF_EINVAL, "client prefix '%.80s' has bits set beyond /%d; write the "
                                          "network address", s, p->bits);
    return SF_OK;
}

int sf_prefix_match(const sf_prefix *p, int family, const uint8_t *addr)
{
    if (family != p->family) return 0;
    int full = p->bits / 8, rest = p->bits % 8;
    if (memcmp(p->addr, addr, (size_t)full)) return 0;
    if (rest) {
        uint8_t m = (uint8_t)(0xff << (8 - rest));
        if ((p->addr[full] & m) != (addr[full] & m)) return 0;
    }
    return 1;
}

static void tenant_init(sf_tenant *t, const char *name)
{
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    sf_intent_default(&t->default_intent);
    t->max_urgency = SF_URGENCY_HIGH;
    pthread_mutex_init(&t->mu, NULL);
    t->bucket_t = sf_now_s();
}

void sf_tenants_free(sf_tenants *ts)
{
    if (!ts) return;
    for (int i = 0; i < ts->n; i++) {
        sf_tenant *t = &ts->t[i];
        for (int k = 0; k < t->n_keys; k++) free(t->keys[k]);
        free(t->keys);
        free(t->prefixes);
        pthread_mutex_destroy(&t->mu);
    }
    free(ts->t);
    free(ts);
}

int sf_tenants_open(sf_tenants **out, sf_error *err)
{
    sf_tenants *ts = calloc(1, sizeof *ts);
    if (ts) ts->t = calloc(1, sizeof *ts->t);
    if (!ts || !ts->t) {
        free(ts);
        return sf_err(err, SF_ENOMEM, "tenants: out of memory");
    }
    ts->n = 1;
    ts->open = 1;
    tenant_init(&ts->t[0], "default");
    *out = ts;
    return SF_OK;
}

static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i])) return 0;
    return 1;
}

static int nonneg_number(const json_t *v, const char *what, int i, double *out, sf_error *err)
{
    if (!json_is_number(v) || !(json_number_value(v) >= 0) || !isfinite(json_number_value(v)))
        return sf_err(err, SF_EFORMAT, "tenants[%d].%s must be a non-negative number", i, what);
    *out = json_number_value(v);
    return SF_OK;
}

static int parse_tenant(json_t *o, int i, sf_tenant *t, sf_error *err)
{
    const char *key;
    json_t *v;
    int rc;
    if (!json_is_object(o)) return sf_err(err, SF_EFORMAT, "tenants[%d] must be an object", i);
    json_t *name = json_object_get(o, "name");
    if (!json_is_string(name) || !valid_name(json_string_value(name)))
        return sf_err(err, SF_EFORMAT, "tenants[%d].name must be a string of 1-63 letters, digits, "
                                       "'-', '_' or '.'", i);
    tenant_init(t, json_string_value(name));
    int have_burst = 0;
    json_object_foreach(o, key, v) {
        if (!strcmp(key, "name")) continue;
        if (!strcmp(key, "api_keys")) {
            if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 1024)
                return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).api_keys must be a non-empty array of "
                                               "strings", i, t->name);
            t->keys = calloc(json_array_size(v), sizeof *t->keys);
            if (!t->keys) return sf_err(err, SF_ENOMEM, "tenants: out of memory");
            size_t k;
            json_t *kv;
            json_array_foreach(v, k, kv) {
                if (!json_is_string(kv) || json_string_length(kv) < 8 || json_string_length(kv) > 256 ||
                    strlen(json_string_value(kv)) != json_string_length(kv))
                    return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).api_keys[%zu] must be a string of "
                                                   "8 to 256 characters", i, t->name, k);
                for (const char *c = json_string_value(kv); *c; c++)
                    if (*c <= 0x20 || *c >= 0x7f)
                        return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).api_keys[%zu] may only hold "
                                                       "printable ASCII without spaces", i, t->name, k);
                if (!(t->keys[t->n_keys++] = strdup(json_string_value(kv))))
                    return sf_err(err, SF_ENOMEM, "tenants: out of memory");
            }
        } else if (!strcmp(key, "default_intent")) {
            if ((rc = sf_intent_from_json(v, &t->default_intent, err)))
                return sf_err_wrap(err, "tenants[%d] (%s).default_intent", i, t->name), SF_EFORMAT;
        } else if (!strcmp(key, "max_urgency")) {
            int u = json_is_string(v) ? sf_urgency_from_name(json_string_value(v), json_string_length(v)) : -1;
            if (u < 0)
                return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).max_urgency must be \"high\", \"normal\" "
                                               "or \"low\"", i, t->name);
            t->max_urgency = u;
        } else if (!strcmp(key, "token_rate_limit")) {
            if ((rc = nonneg_number(v, key, i, &t->rate_tps, err))) return rc;
        } else if (!strcmp(key, "token_burst")) {
            if ((rc = nonneg_number(v, key, i, &t->burst, err))) return rc;
            have_burst = 1;
        } else if (!strcmp(key, "max_concurrent")) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
                return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).max_concurrent must be an integer "
                                               "0..1000000", i, t->name);
            t->max_concurrent = (int)json_integer_value(v);
        } else if (!strcmp(key, "client_prefixes")) {
            if (!json_is_array(v) || json_array_size(v) > 4096)
                return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).client_prefixes must be an array of "
                                               "strings", i, t->name);
            t->prefixes = calloc(json_array_size(v) + 1, sizeof *t->prefixes);
            if (!t->prefixes) return sf_err(err, SF_ENOMEM, "tenants: out of memory");
            size_t k;
            json_t *pv;
            json_array_foreach(v, k, pv) {
                if (!json_is_string(pv))
                    return sf_err(err, SF_EFORMAT, "tenants[%d] (%s).client_prefixes[%zu] must be a "
                                                   "string", i, t->name, k);
                if ((rc = sf_prefix_parse(json_string_value(pv), &t->prefixes[t->n_prefixes++], err)))
                    return sf_err_wrap(err, "tenants[%d] (%s)", i, t->name), SF_EFORMAT;
            }
        } else {
            return sf_err(err, SF_EFORMAT, "tenants[%d] (%s): unknown key '%.64s'; known are name, "
                                           "api_keys, default_intent, max_urgency, token_rate_limit, "
                                           "token_burst, max_concurrent, client_prefixes", i, t->name, key);
        }
    }
    if (!t->n_keys)
        return sf_err(err, SF_EFORMAT, "tenants[%d] (%s) needs \"api_keys\": [\"...\"]", i, t->name);
    if (!have_burst) t->burst = t->rate_tps * 10;
    if (t->rate_tps > 0 && t->burst < 1) t->burst = 1;
    t->bucket = t->burst;
    sf_tenant_cap(t, &t->default_intent);
    return SF_OK;
}

int sf_tenants_parse(const char *json, size_t len, sf_tenants **out, sf_error *err)
{
    json_error_t je;
    sf_tenants *ts = NULL;
    int rc = SF_OK;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return sf_err(err, SF_EFORMAT, "tenants: line %d column %d: %s", je.line, je.column, je.text);
    json_t *arr = json_object_get(root, "tenants");
    if (!json_is_object(root) || json_object_size(root) != 1 || !json_is_array(arr)) {
        rc = sf_err(err, SF_EFORMAT, "tenants: the file must be {\"tenants\": [ ... ]}");
        goto cleanup;
    }
    if (json_array_size(arr) == 0 || json_array_size(arr) > 10000) {
        rc = sf_err(err, SF_EFORMAT, "tenants: the list must hold 1 to 10000 tenants");
        goto cleanup;
    }
    ts = calloc(1, sizeof *ts);
    if (ts) ts->t = calloc(json_array_size(arr), sizeof *ts->t);
    if (!ts || !ts->t) {
        rc = sf_err(err, SF_ENOMEM, "tenants: out of memory");
        goto cleanup;
    }
    size_t i;
    json_t *o;
    json_array_foreach(arr, i, o) {
        ts->n++;
        if ((rc = parse_tenant(o, (int)i, &ts->t[i], err))) goto cleanup;
        for (int j = 0; j < (int)i; j++) {
            if (!strcmp(ts->t[j].name, ts->t[i].name)) {
                rc = sf_err(err, SF_EFORMAT, "tenants[%zu]: name '%s' is also used by tenants[%d]", i,
                            ts->t[i].name, j);
                goto cleanup;
            }
            for (int a = 0; a < ts->t[i].n_keys; a++)
                for (int b = 0; b < ts->t[j].n_keys; b++)
                    if (!strcmp(ts->t[i].keys[a], ts->t[j].keys[b])) {
                        rc = sf_err(err, SF_EFORMAT, "tenants[%zu] (%s): an API key is also given to "
                                                     "tenants[%d] (%s)", i, ts->t[i].name, j, ts->t[j].name);
                        goto cleanup;
                    }
        }
    }
    *out = ts;
    ts = NULL;
cleanup:
    sf_tenants_free(ts);
    json_decref(root);
    return rc;
}

int sf_tenants_load(const char *path, sf_tenants **out, sf_error *err)
{
    char *text = NULL;
    size_t len;
    int rc = sf_read_file(path, &text, &len, err);
    if (rc) return sf_err_wrap(err, "tenants file %s", path), rc;
    rc = sf_tenants_parse(text, len, out, err);
    if (rc) sf_err_wrap(err, "%s", path);
    free(text);
    return rc;
}

/* Compares every byte regardless of where the first difference is. */
static int key_equal(const char *a, const char *b, size_t bn)
{
    size_t an = strlen(a);
    unsigned char d = an != bn;
    for (size_t i = 0; i < bn; i++) d |= (unsigned char)(a[i % (an ? an : 1)] ^ b[i]);
    return an && d == 0;
}

sf_tenant *sf_tenants_auth(sf_tenants *ts, const char *authorization)
{
    if (ts->open) return &ts->t[0];
    if (!authorization || strncasecmp(authorization, "Bearer ", 7)) return NULL;
    const char *k = authorization + 7;
    while (*k == ' ') k++;
    size_t kn = strlen(k);
    while (kn && k[kn - 1] == ' ') kn--;
    if (!kn) return NULL;
    sf_tenant *found = NULL;
    for (int i = 0; i < ts->n; i++)
        for (int j = 0; j < ts->t[i].n_keys; j++)
            if (key_equal(ts->t[i].keys[j], k, kn)) found = &ts->t[i];
    return found;
}

static void refill(sf_tenant *t, double now)
{
    if (t->rate_tps <= 0) return;
    double dt = now - t->bucket_t;
    if (dt > 0) t->bucket = fmin(t->burst, t->bucket + dt * t->rate_tps);
    t->bucket_t = now;
}

int sf_tenant_admit(sf_tenant *t, double now, double *retry_after_s, const char **why)
{
    int rc = SF_OK;
    pthread_mutex_lock(&t->mu);
    refill(t, now);
    if (t->max_concurrent > 0 && t->active >= t->max_concurrent) {
        *why = "concurrency";
        *retry_after_s = 1;
        rc = SF_AGAIN;
    } else if (t->rate_tps > 0 && t->bucket < 1) {
        *why = "rate";
        *retry_after_s = fmax(1, (1 - t->bucket) / t->rate_tps);
        rc = SF_AGAIN;
    } else {
        t->active++;
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void sf_tenant_release(sf_tenant *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->active > 0) t->active--;
    pthread_mutex_unlock(&t->mu);
}

void sf_tenant_charge(sf_tenant *t, int n, double now)
{
    if (t->rate_tps <= 0 || n <= 0) return;
    pthread_mutex_lock(&t->mu);
    refill(t, now);
    t->bucket -= n;
    pthread_mutex_unlock(&t->mu);
}

int sf_tenant_cap(const sf_tenant *t, sf_intent *in)
{
    if (in->urgency <= t->max_urgency) return 0;
    in->urgency = t->max_urgency;
    return 1;
}
