/* intent.c — the strict X-Semantic-Intent parser and its JSON twin. */
#include "intent.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void sf_intent_default(sf_intent *in)
{
    memset(in, 0, sizeof *in);
    strcpy(in->cls, "default");
    in->urgency = SF_URGENCY_NORMAL;
}

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

int sf_intent_class_urgency(const char *cls)
{
    if (has_prefix(cls, "realtime") || has_prefix(cls, "interactive")) return SF_URGENCY_HIGH;
    if (has_prefix(cls, "batch") || has_prefix(cls, "background") || has_prefix(cls, "offline") ||
        has_prefix(cls, "bulk"))
        return SF_URGENCY_LOW;
    return SF_URGENCY_NORMAL;
}

int sf_urgency_from_name(const char *s, size_t n)
{
    static const char *names[SF_URGENCY_COUNT] = { "low", "normal", "high" };
    for (int i = 0; i < SF_URGENCY_COUNT; i++)
        if (n == strlen(names[i]) && !memcmp(s, names[i], n)) return i;
    return -1;
}

const char *sf_urgency_name(int u)
{
    switch (u) {
    case SF_URGENCY_LOW: return "low";
    case SF_URGENCY_NORMAL: return "normal";
    case SF_URGENCY_HIGH: return "high";
    }
    return "?";
}

static int class_char(int c) { return isalnum(c) || c == '-' || c == '_' || c == '.'; }

/* Writes a printable, bounded rendering of s[0..n) for error messages. */
static const char *quote(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\'') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        if (i == 40 && n > 44) { memcpy(buf + o, "...", 3); o += 3; break; }
    }
    buf[o] = 0;
    return buf;
}

static int check_class(const char *s, size_t n, sf_error *err)
{
    char q[256];
    if (n == 0)
        return sf_err(err, SF_EINVAL, "intent: the class is empty; start with a class name such as "
                                      "'realtime-chat' (letters, digits, '-', '_', '.')");
    if (n >= sizeof(((sf_intent *)0)->cls))
        return sf_err(err, SF_EINVAL, "intent: class '%s' is longer than %zu characters",
                      quote(s, n, q, sizeof q), sizeof(((sf_intent *)0)->cls) - 1);
    for (size_t i = 0; i < n; i++)
        if (!class_char((unsigned char)s[i]))
            return sf_err(err, SF_EINVAL,
                          "intent: class '%s' has character '%s' at position %zu; allowed are "
                          "letters, digits, '-', '_' and '.'",
                          quote(s, n, q, sizeof q), quote(s + i, 1, q + 128, 128), i + 1);
    return SF_OK;
}

/* A plain decimal number followed by one of the given units (longest first). */
static int parse_quantity(const char *key, const char *s, size_t n, const char *const *units,
                          const double *scale, double *out, sf_error *err)
{
    char q[256], num[32];
    size_t i = 0, dots = 0;
    while (i < n && (isdigit((unsigned char)s[i]) || s[i] == '.')) dots += s[i++] == '.';
    if (i == 0 || dots > 1 || i >= sizeof num || s[0] == '.' || s[i - 1] == '.')
        return sf_err(err, SF_EINVAL, "intent: %s='%s' must start with a number such as 400 or 0.5",
                      key, quote(s, n, q, sizeof q));
    memcpy(num, s, i);
    num[i] = 0;
    for (int u = 0; units[u]; u++) {
        if (n - i == strlen(units[u]) && !memcmp(s + i, units[u], n - i)) {
            *out = strtod(num, NULL) * scale[u];
            return SF_OK;
        }
    }
    char list[128] = "";
    for (int u = 0; units[u]; u++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s'%s'", u ? ", " : "", units[u]);
    return sf_err(err, SF_EINVAL, "intent: %s='%s' needs a unit: one of %s", key,
                  quote(s, n, q, sizeof q), list);
}

static int set_latency(sf_intent *in, const char *v, size_t n, sf_error *err)
{
    static const char *const units[] = { "ms", "s", NULL };
    static const double scale[] = { 1, 1000 };
    double ms;
    int rc = parse_quantity("max-latency", v, n, units, scale, &ms, err);
    if (rc) return rc;
    if (!(ms >= 1 && ms <= 3600e3))
        return sf_err(err, SF_EINVAL, "intent: max-latency must be between 1ms and 3600s");
    in->max_latency_ms = (int)lround(ms);
    return SF_OK;
}

static int set_throughput(sf_intent *in, const char *v, size_t n, sf_error *err)
{
    static const char *const units[] = { "tokens/sec", "tokens/s", NULL };
    static const double scale[] = { 1, 1 };
    double tps;
    int rc = parse_quantity("min-throughput", v, n, units, scale, &tps, err);
    if (rc) return rc;
    if (!(tps >= 1e-3 && tps <= 1e6))
        return sf_err(err, SF_EINVAL, "intent: min-throughput must be at least 0.001 and at most 1000000 tokens/s");
    in->min_tps = tps;
    return SF_OK;
}

static int set_urgency(sf_intent *in, const char *v, size_t n, sf_error *err)
{
    char q[256];
    int u = sf_urgency_from_name(v, n);
    if (u < 0)
        return sf_err(err, SF_EINVAL, "intent: urgency='%s' is not one of high, normal, low",
                      quote(v, n, q, sizeof q));
    in->urgency = u;
    return SF_OK;
}

static int is_ows(char c) { return c == ' ' || c == '\t'; }

static void trim(const char **s, size_t *n)
{
    while (*n && is_ows(**s)) { (*s)++; (*n)--; }
    while (*n && is_ows((*s)[*n - 1])) (*n)--;
}

int sf_intent_parse(const char *s, size_t len, sf_intent *out, sf_error *err)
{
    char q[256];
    sf_intent in;
    memset(&in, 0, sizeof in);
    in.urgency = -1;
    int seen_u = 0, seen_l = 0, seen_t = 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 && s[i] != '\t')
            return sf_err(err, SF_EINVAL, "intent: control character 0x%02x at position %zu",
                          (unsigned char)s[i], i + 1);
    size_t pos = 0;
    for (int seg = 0;; seg++) {
        const char *p = s + pos;
        const char *semi = memchr(p, ';', len - pos);
        size_t n = semi ? (size_t)(semi - p) : len - pos;
        trim(&p, &n);
        if (seg == 0) {
            int rc = check_class(p, n, err);
            if (rc) return rc;
            memcpy(in.cls, p, n);
            in.cls[n] = 0;
        } else {
            if (n == 0)
                return sf_err(err, SF_EINVAL, "intent: empty parameter after ';' (parameter %d); "
                                              "remove the extra ';'", seg);
            const char *eq = memchr(p, '=', n);
            if (!eq)
                return sf_err(err, SF_EINVAL, "intent: parameter '%s' is not key=value",
                              quote(p, n, q, sizeof q));
            const char *k = p, *v = eq + 1;
            size_t kn = (size_t)(eq - p), vn = n - kn - 1;
            trim(&k, &kn);
            trim(&v, &vn);
            if (vn == 0)
                return sf_err(err, SF_EINVAL, "intent: parameter '%s' has an empty value",
                              quote(k, kn, q, sizeof q));
            int rc, *seen;
            if (kn == 7 && !memcmp(k, "urgency", 7)) seen = &seen_u, rc = seen_u ? 0 : set_urgency(&in, v, vn, err);
            else if (kn == 11 && !memcmp(k, "max-latency", 11)) seen = &seen_l, rc = seen_l ? 0 : set_latency(&in, v, vn, err);
            else if (kn == 14 && !memcmp(k, "min-throughput", 14)) seen = &seen_t, rc = seen_t ? 0 : set_throughput(&in, v, vn, err);
            else
                return sf_err(err, SF_EINVAL, "intent: unknown parameter '%s'; known are urgency, "
                                              "max-latency, min-throughput", quote(k, kn, q, sizeof q));
            if (*seen)
                return sf_err(err, SF_EINVAL, "intent: parameter '%s' given twice",
                              quote(k, kn, q, sizeof q));
            if (rc) return rc;
            *seen = 1;
        }
        if (!semi) break;
        pos = (size_t)(semi - s) + 1;
    }
    if (in.urgency < 0) in.urgency = sf_intent_class_urgency(in.cls);
    *out = in;
    return SF_OK;
}

static int json_str_param(const char *key, const json_t *v, const char **s, size_t *n, sf_error *err)
{
    if (!json_is_string(v))
        return sf_err(err, SF_EINVAL, "intent.%s must be a string", key);
    *s = json_string_value(v);
    *n = json_string_length(v);
    return SF_OK;
}

int sf_intent_from_json(const json_t *v, sf_intent *out, sf_error *err)
{
    if (json_is_string(v)) return sf_intent_parse(json_string_value(v), json_string_length(v), out, err);
    if (!json_is_object(v))
        return sf_err(err, SF_EINVAL, "intent must be a string (the X-Semantic-Intent form) or an object");
    sf_intent in;
    memset(&in, 0, sizeof in);
    in.urgency = -1;
    const char *key, *s = NULL;
    size_t n = 0;
    json_t *val;
    int rc, have_cls = 0, have_l = 0, have_t = 0;
    json_object_foreach((json_t *)v, key, val) {
        if (!strcmp(key, "class")) {
            if ((rc = json_str_param(key, val, &s, &n, err))) return rc;
            if ((rc = check_class(s, n, err))) return rc;
            memcpy(in.cls, s, n);
            in.cls[n] = 0;
            have_cls = 1;
        } else if (!strcmp(key, "urgency")) {
            if ((rc = json_str_param(key, val, &s, &n, err)) || (rc = set_urgency(&in, s, n, err))) return rc;
        } else if (!strcmp(key, "max_latency") || !strcmp(key, "max-latency")) {
            if (have_l++) return sf_err(err, SF_EINVAL, "intent: max latency given twice");
            if ((rc = json_str_param(key, val, &s, &n, err)) || (rc = set_latency(&in, s, n, err))) return rc;
        } else if (!strcmp(key, "max_latency_ms")) {
            if (have_l++) return sf_err(err, SF_EINVAL, "intent: max latency given twice");
            if (!json_is_integer(val) || json_integer_value(val) < 1 || json_integer_value(val) > 3600000)
                return sf_err(err, SF_EINVAL, "intent.max_latency_ms must be an integer from 1 to 3600000");
            in.max_latency_ms = (int)json_integer_value(val);
        } else if (!strcmp(key, "min_throughput") || !strcmp(key, "min-throughput")) {
            if (have_t++) return sf_err(err, SF_EINVAL, "intent: min throughput given twice");
            if ((rc = json_str_param(key, val, &s, &n, err)) || (rc = set_throughput(&in, s, n, err))) return rc;
        } else if (!strcmp(key, "min_tps")) {
            if (have_t++) return sf_err(err, SF_EINVAL, "intent: min throughput given twice");
            double d = json_number_value(val);
            if (!json_is_number(val) || !(d >= 1e-3 && d <= 1e6))
                return sf_err(err, SF_EINVAL, "intent.min_tps must be a number from 0.001 to 1000000");
            in.min_tps = d;
        } else {
            char q[256];
            return sf_err(err, SF_EINVAL, "intent: unknown field '%s'; known are class, urgency, "
                                          "max_latency, max_latency_ms, min_throughput, min_tps",
                          quote(key, strlen(key), q, sizeof q));
        }
    }
    if (!have_cls) return sf_err(err, SF_EINVAL, "intent: the object needs a \"class\" string");
    if (in.urgency < 0) in.urgency = sf_intent_class_urgency(in.cls);
    *out = in;
    return SF_OK;
}

void sf_intent_format(const sf_intent *in, char *buf, size_t n)
{
    int o = snprintf(buf, n, "%s; urgency=%s", in->cls, sf_urgency_name(in->urgency));
    if (o < 0 || (size_t)o >= n) return;
    if (in->max_latency_ms > 0) o += snprintf(buf + o, n - (size_t)o, "; max-latency=%dms", in->max_latency_ms);
    if (o < 0 || (size_t)o >= n) return;
    if (in->min_tps > 0) { /* a plain decimal, as the parser reads it back (%g would write 1e+06) */
        char num[48];
        snprintf(num, sizeof num, "%.15f", in->min_tps);
        char *e = num + strlen(num);
        while (e > num && e[-1] == '0') *--e = 0;
        if (e > num && e[-1] == '.') *--e = 0;
        snprintf(buf + o, n - (size_t)o, "; min-throughput=%stokens/s", num);
    }
}
