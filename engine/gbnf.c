/* gbnf.c — GBNF grammars written out as one pattern (gbnf.h). Two passes over the text: the
 * first checks the syntax and finds each rule's body; the second writes each rule out, a
 * reference becoming a copy of its rule's pattern, so a rule met again while it is being written
 * is recursion, refused. */
#include "gbnf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "regex.h"
#include "tok_impl.h"

typedef struct grule {
    const char *name;
    size_t name_len, at, body; /* the name's offset; the body's */
    int state;                 /* 0 not written, 1 being written, 2 written */
    char *rx;                  /* written out */
    size_t rx_len;
} grule;

typedef struct gparse {
    const unsigned char *p;
    size_t n, i;
    grule *rules;
    int n_rules, cap_rules;
    int emit;                  /* second pass: write the pattern */
    int depth;                 /* groups and references within each other */
    char *o;                   /* the pattern of the rule being written */
    size_t on, ocap;
    sf_error *err;
    int rc;
} gparse;

static int fail(gparse *g, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(gparse *g, size_t at, const char *fmt, ...)
{
    if (g->rc) return -1;
    int line = 1, col = 1;
    for (size_t k = 0; k < at && k < g->n; k++) {
        if (g->p[k] == '\n') line++, col = 1;
        else col++;
    }
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    g->rc = sf_err(g->err, SF_EINVAL, "grammar: line %d, column %d: %s", line, col, m);
    return -1;
}

static int peek(const gparse *g) { return g->i < g->n ? g->p[g->i] : -1; }

static int out(gparse *g, const char *s, size_t n)
{
    if (!g->emit || g->rc) return g->rc ? -1 : 0;
    if (g->on + n + 1 > SF_REGEX_MAX_LEN)
        return fail(g, g->i, "the grammar written out as one pattern is over %d bytes (each use of a rule copies it)",
                    SF_REGEX_MAX_LEN);
    if (g->on + n + 1 > g->ocap) {
        size_t c = g->ocap ? g->ocap * 2 : 256;
        while (c < g->on + n + 1) c *= 2;
        char *q = realloc(g->o, c);
        if (!q) return g->rc = sf_err(g->err, SF_ENOMEM, "grammar: out of memory"), -1;
        g->o = q;
        g->ocap = c;
    }
    memcpy(g->o + g->on, s, n);
    g->on += n;
    g->o[g->on] = 0;
    return 0;
}

static int outs(gparse *g, const char *s) { return out(g, s, strlen(s)); }

/* spaces, tabs and comments; newlines too where a rule goes on past them */
static void skip_space(gparse *g, int newlines)
{
    while (g->i < g->n) {
        int c = g->p[g->i];
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) g->i++;
        else if (c == '#') while (g->i < g->n && g->p[g->i] != '\n' && g->p[g->i] != '\r') g->i++;
        else break;
    }
}

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* one character of a literal or class: an escape or a UTF-8 character; -1 on error */
static int32_t parse_char(gparse *g)
{
    size_t at = g->i;
    if (g->p[g->i] == '\\') {
        if (++g->i >= g->n) return fail(g, at, "a '\\' at the end");
        int e = g->p[g->i++];
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++, g->i++) {
                int h = g->i < g->n ? sf_hexval(g->p[g->i]) : -1;
                if (h < 0) return fail(g, at, "'\\%c' needs %d hexadecimal digits", e, digits);
                v = v << 4 | (uint32_t)h;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail(g, at, "'\\%c' names no character", e);
            return (int32_t)v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': return e;
        default: return fail(g, at, "unknown escape '\\%c'", e);
        }
    }
    int len = tok_utf8_len(g->p + g->i, g->n - g->i);
    if (!len) return fail(g, at, "the grammar is not valid UTF-8");
    uint32_t c = tok_utf8_cp((const char *)g->p + g->i, g->n - g->i, &len);
    g->i += (size_t)len;
    return (int32_t)c;
}

/* c as the pattern writes it: letters, digits and space as they are, other ASCII escaped,
 * control characters as \xHH, the rest as its UTF-8 */
static int put_char(gparse *g, uint32_t c)
{
    char b[8];
    if (c < 0x20 || c == 0x7F) return snprintf(b, sizeof b, "\\x%02X", c), outs(g, b);
    if (c < 0x80) {
        int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == ' ';
        b[0] = '\\', b[1] = (char)c;
        return plain ? out(g, b + 1, 1) : out(g, b, 2);
    }
    unsigned char u[4];
    return out(g, (const char *)u, (size_t)tok_utf8_enc(c, u));
}

static grule *find(gparse *g, const unsigned char *name, size_t len)
{
    for (int k = 0; k < g->n_rules; k++)
        if (g->rules[k].name_len == len && !memcmp(g->rules[k].name, name, len)) return &g->rules[k];
    return NULL;
}

static int emit_rule(gparse *g, grule *r, size_t at);
static int parse_alternates(gparse *g, int nested);

/* wrap what was written since `from` in a group (a quantifier after a quantifier) */
static int wrap_from(gparse *g, size_t from)
{
    if (!g->emit) return 0;
    if (out(g, ")", 1)) return -1;
    if (out(g, "(?:", 3)) return -1; /* room for it; moved into place below */
    memmove(g->o + from + 3, g->o + from, g->on - 3 - from);
    memcpy(g->o + from, "(?:", 3);
    return 0;
}

static int parse_sequence(gparse *g, int nested)
{
    for (;;) {
        int c = peek(g);
        size_t at = g->i, from = g->on;
        if (c == '"') {
            g->i++;
            if (outs(g, "(?:")) return -1;
            while (peek(g) != '"') {
                if (g->i >= g->n) return fail(g, at, "a literal without its closing '\"'");
                int32_t ch = parse_char(g);
                if (ch < 0 || put_char(g, (uint32_t)ch)) return -1;
            }
            g->i++;
            if (outs(g, ")")) return -1;
        } else if (c == '[') {
            g->i++;
            if (outs(g, "[")) return -1;
            if (peek(g) == '^' && (g->i++, outs(g, "^"))) return -1;
            if (peek(g) == ']') return fail(g, at, "an empty class");
            while (peek(g) != ']') {
                if (g->i >= g->n) return fail(g, at, "a class without its closing ']'");
                int32_t lo = parse_char(g);
                if (lo < 0 || put_char(g, (uint32_t)lo)) return -1;
                if (peek(g) == '-' && g->i + 1 < g->n && g->p[g->i + 1] != ']') {
                    g->i++;
                    int32_t hi = parse_char(g);
                    if (hi < 0) return -1;
                    if (hi < lo) return fail(g, at, "a range whose end comes before its start");
                    if (outs(g, "-") || put_char(g, (uint32_t)hi)) return -1;
                }
            }
            g->i++;
            if (outs(g, "]")) return -1;
        } else if (c >= 0 && is_word(c)) {
            while (g->i < g->n && is_word(g->p[g->i])) g->i++;
            if (g->emit) {
                grule *r = find(g, g->p + at, g->i - at);
                if (!r) return fail(g, at, "rule '%.*s' is not defined", (int)SF_MIN(g->i - at, 64), (const char *)g->p + at);
                if (emit_rule(g, r, at) || outs(g, "(?:") || out(g, r->rx, r->rx_len) || outs(g, ")")) return -1;
            }
        } else if (c == '(') {
            g->i++;
            skip_space(g, 1);
            if (++g->depth > SF_REGEX_MAX_NEST) return fail(g, at, "groups and rules nested over %d deep", SF_REGEX_MAX_NEST);
            if (outs(g, "(?:") || parse_alternates(g, 1)) return -1;
            g->depth--;
            if (peek(g) != ')') return fail(g, at, "a '(' without its ')'");
            g->i++;
            if (outs(g, ")")) return -1;
        } else if (c == '.') {
            g->i++;
            if (outs(g, "[\\s\\S]")) return -1;
        } else {
            return 0; /* the sequence ends: '|', ')', a newline, the end, or what the caller refuses */
        }
        skip_space(g, nested);
        for (int quantified = 0; (c = peek(g)) == '*' || c == '+' || c == '?' || c == '{'; quantified = 1) {
            if (quantified && wrap_from(g, from)) return -1;
            size_t qat = g->i++;
            if (c == '{') {
                long m = -1, x = -1;
                int comma = 0;
                skip_space(g, nested);
                for (; g->i < g->n && g->p[g->i] >= '0' && g->p[g->i] <= '9'; g->i++) m = (m < 0 ? 0 : m) * 10 + (g->p[g->i] - '0'), m = SF_MIN(m, 100000);
                skip_space(g, nested);
                if (peek(g) == ',') {
                    comma = 1;
                    g->i++;
                    skip_space(g, nested);
                    for (; g->i < g->n && g->p[g->i] >= '0' && g->p[g->i] <= '9'; g->i++) x = (x < 0 ? 0 : x) * 10 + (g->p[g->i] - '0'), x = SF_MIN(x, 100000);
                    skip_space(g, nested);
                }
                if (m < 0 || peek(g) != '}') return fail(g, qat, "a repetition is {m}, {m,} or {m,n}");
                g->i++;
                if (comma && x >= 0 && x < m) return fail(g, qat, "a repetition whose maximum is under its minimum");
                char b[48];
                if (!comma) snprintf(b, sizeof b, "{%ld}", m);
                else if (x < 0) snprintf(b, sizeof b, "{%ld,}", m);
                else snprintf(b, sizeof b, "{%ld,%ld}", m, x);
                if (outs(g, b)) return -1;
            } else if (out(g, (const char *)&g->p[qat], 1)) {
                return -1;
            }
            skip_space(g, nested);
        }
    }
}

static int parse_alternates(gparse *g, int nested)
{
    if (parse_sequence(g, nested)) return -1;
    while (peek(g) == '|') {
        g->i++;
        skip_space(g, 1); /* a rule goes on after '|', newlines or not */
        if (outs(g, "|") || parse_sequence(g, nested)) return -1;
    }
    return 0;
}

/* the rule written out (once; its references first) */
static int emit_rule(gparse *g, grule *r, size_t at)
{
    if (r->state == 2) return 0;
    if (r->state == 1)
        return fail(g, at, "rule '%.*s' refers back to itself (directly or through other rules): recursion is not "
                    "supported (write repetition with * + {m,n})", (int)SF_MIN(r->name_len, 64), r->name);
    if (g->depth + 1 > SF_REGEX_MAX_NEST) return fail(g, at, "groups and rules nested over %d deep", SF_REGEX_MAX_NEST);
    r->state = 1;
    g->depth++;
    char *o = g->o;
    size_t on = g->on, ocap = g->ocap, i = g->i;
    g->o = NULL, g->on = g->ocap = 0, g->i = r->body;
    int rc = parse_alternates(g, 0);
    r->rx = g->o, r->rx_len = g->on;
    if (!r->rx && !rc) r->rx = calloc(1, 1); /* an empty rule */
    g->o = o, g->on = on, g->ocap = ocap, g->i = i;
    g->depth--;
    if (rc || !r->rx) return rc ? rc : (g->rc = sf_err(g->err, SF_ENOMEM, "grammar: out of memory"), -1);
    r->state = 2;
    return 0;
}

int sf_gbnf_to_regex(const char *text, size_t len, char **out_rx, sf_error *err)
{
    *out_rx = NULL;
    gparse g = { .p = (const unsigned char *)text, .n = len, .err = err };
    skip_space(&g, 1);
    while (!g.rc && g.i < g.n) { /* the first pass: rules and their bodies */
        size_t at = g.i;
        while (g.i < g.n && is_word(g.p[g.i])) g.i++;
        if (g.i == at) {
            fail(&g, at, "a rule's name was expected");
            break;
        }
        size_t nl = g.i - at;
        skip_space(&g, 0);
        if (g.i + 3 > g.n || memcmp(g.p + g.i, "::=", 3)) {
            fail(&g, g.i, "'::=' was expected after '%.*s'", (int)SF_MIN(nl, 64), text + at);
            break;
        }
        if (find(&g, g.p + at, nl)) {
            fail(&g, at, "rule '%.*s' is defined twice", (int)SF_MIN(nl, 64), text + at);
            break;
        }
        if (!sf_grow((void **)&g.rules, &g.cap_rules, g.n_rules + 1, sizeof *g.rules)) {
            g.rc = sf_err(err, SF_ENOMEM, "grammar: out of memory");
            break;
        }
        g.i += 3;
        skip_space(&g, 1);
        g.rules[g.n_rules++] = (grule){ .name = text + at, .name_len = nl, .at = at, .body = g.i };
        if (parse_alternates(&g, 0)) break;
        skip_space(&g, 0);
        if (g.i < g.n && g.p[g.i] != '\n' && g.p[g.i] != '\r') {
            fail(&g, g.i, "'%c' was not expected here", g.p[g.i]);
            break;
        }
        skip_space(&g, 1);
    }
    grule *root = g.rc ? NULL : find(&g, (const unsigned char *)"root", 4);
    if (!g.rc && !root) fail(&g, g.n, "no rule 'root' (the output)");
    g.emit = 1;
    for (int k = 0; k < g.n_rules && !g.rc; k++) emit_rule(&g, &g.rules[k], g.rules[k].at); /* every rule checked */
    int rc = g.rc;
    if (!rc && !(*out_rx = strdup(root->rx))) rc = sf_err(err, SF_ENOMEM, "grammar: out of memory");
    for (int k = 0; k < g.n_rules; k++) free(g.rules[k].rx);
    free(g.rules);
    free(g.o);
    return rc;
}
