/* loadgen_config.c — the load generator's configuration: defaults, --url (loopback only),
 * --slo, length distributions and scenario files. */
#include "loadgen.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <event2/http.h>
#include <jansson.h>

void sf_lg_config_default(sf_lg_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    c->concurrency = 8;
    c->num_requests = SF_LG_DEFAULT_REQUESTS;
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
    /* optional run settings: a scenario file can describe one load level whole; the command line wins */
    json_t *rate = json_object_get(root, "rate"), *dur = json_object_get(root, "duration_s"),
           *slo = json_object_get(root, "slo");
    if ((rate && (!json_is_number(rate) || !(json_number_value(rate) > 0 && json_number_value(rate) <= 1e6))) ||
        (dur && (!json_is_number(dur) || !(json_number_value(dur) > 0 && json_number_value(dur) <= 86400))) ||
        (slo && !json_is_string(slo))) {
        rc = sf_err(err, SF_EFORMAT, "scenario %s: \"rate\" (requests/s, up to 1e6) and \"duration_s\" (up to 86400) "
                                     "are positive numbers, \"slo\" a string like \"ttft=400ms,tpot=20ms\"", path);
        goto done;
    }
    if (rate && c->rate == 0) c->rate = json_number_value(rate);
    if (dur && c->duration_s == 0) c->duration_s = json_number_value(dur);
    if (slo && c->slo_ttft_s == 0 && c->slo_tpot_s == 0 && c->slo_e2el_s == 0 &&
        (rc = sf_lg_parse_slo(c, json_string_value(slo), err)) != SF_OK) {
        sf_err_wrap(err, "scenario %s: slo", path);
        goto done;
    }
    /* an open-loop level bounded by time: the request cap must not end it first */
    if (c->rate > 0 && c->duration_s > 0 && c->num_requests == SF_LG_DEFAULT_REQUESTS)
        c->num_requests = (int)ceil(c->rate * c->duration_s * 2) + 10;
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
        json_t *pre = json_object_get(o, "prefix_tokens");
        if (pre && (!json_is_integer(pre) || json_integer_value(pre) < 0 || json_integer_value(pre) > 100000)) {
            rc = sf_err(err, SF_EFORMAT, "scenario %s: classes[%zu].prefix_tokens must be an integer from 0 to 100000",
                        path, i);
            goto done;
        }
        k->prefix_words = pre ? (int)json_integer_value(pre) : 0;
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
