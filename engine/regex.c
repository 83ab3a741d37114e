/* regex.c — patterns to byte-level DFAs (regex.h): a parser to a tree whose leaves are sets of
 * bytes (a character outside ASCII is its UTF-8 bytes in a row), Glushkov's positions over the
 * leaves, and the subset construction over classes of bytes. */
#include "regex.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

enum { R_EMPTY, R_LEAF, R_CAT, R_ALT, R_STAR, R_OPT };

typedef struct rnode {
    uint8_t op;
    int k0, nk;   /* R_CAT, R_ALT: kids[k0 .. k0 + nk); R_STAR, R_OPT: one kid; R_LEAF: k0 its leaf */
} rnode;

typedef struct ivec { int *v, n, cap; } ivec;

typedef struct parser {
    const unsigned char *p;
    size_t n, i;
    rnode *nodes;
    int n_nodes, cap_nodes;
    int *kids;
    int n_kids, cap_kids;
    uint64_t (*sets)[4];      /* leaf i's bytes */
    int n_leaves, cap_leaves;
    int depth;
    int search;               /* SF_REGEX_SEARCH */
    sf_error *err;
    int rc;
} parser;

struct sf_regex {
    int n_states, n_cls;
    uint8_t cls[256];         /* byte -> class */
    int32_t *next;            /* [n_states * n_cls]; -1 dead */
    uint8_t *acc, *more;      /* [n_states] */
};

static int push(ivec *v, int x)
{
    if (!sf_grow((void **)&v->v, &v->cap, v->n + 1, sizeof *v->v)) return 0;
    v->v[v->n++] = x;
    return 1;
}

/* the first error stands; the message says where in the pattern */
static int fail(parser *ps, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(parser *ps, size_t at, const char *fmt, ...)
{
    if (ps->rc) return -1;
    char m[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    ps->rc = sf_err(ps->err, SF_EINVAL, "regex: %s at byte %zu", m, at);
    return -1;
}

static int oom(parser *ps)
{
    if (!ps->rc) ps->rc = sf_err(ps->err, SF_ENOMEM, "regex: out of memory");
    return -1;
}

static int node(parser *ps, int op, int k0, int nk)
{
    if (ps->n_nodes >= SF_REGEX_MAX_NODES)
        return fail(ps, ps->i, "the pattern is over %d parts once its repeats are written out", SF_REGEX_MAX_NODES);
    if (!sf_grow((void **)&ps->nodes, &ps->cap_nodes, ps->n_nodes + 1, sizeof *ps->nodes)) return oom(ps);
    ps->nodes[ps->n_nodes] = (rnode){ .op = (uint8_t)op, .k0 = k0, .nk = nk };
    return ps->n_nodes++;
}

static int leaf(parser *ps, const uint64_t set[4])
{
    if (ps->n_leaves >= SF_REGEX_MAX_POS)
        return fail(ps, ps->i, "the pattern is over %d bytes long once its repeats are written out", SF_REGEX_MAX_POS);
    if (!sf_grow((void **)&ps->sets, &ps->cap_leaves, ps->n_leaves + 1, sizeof *ps->sets)) return oom(ps);
    memcpy(ps->sets[ps->n_leaves], set, sizeof ps->sets[0]);
    return node(ps, R_LEAF, ps->n_leaves++, 0);
}

static int byte_range(parser *ps, int lo, int hi)
{
    uint64_t s[4] = { 0 };
    for (int b = lo; b <= hi; b++) s[b >> 6] |= 1ull << (b & 63);
    return leaf(ps, s);
}

/* a node over the items (one item stands for itself; none: the empty string) */
static int group_of(parser *ps, int op, const ivec *v)
{
    if (v->n == 0) return node(ps, R_EMPTY, 0, 0);
    if (v->n == 1) return v->v[0];
    if (!sf_grow((void **)&ps->kids, &ps->cap_kids, ps->n_kids + v->n, sizeof *ps->kids)) return oom(ps);
    memcpy(ps->kids + ps->n_kids, v->v, sizeof *v->v * (size_t)v->n);
    ps->n_kids += v->n;
    return node(ps, op, ps->n_kids - v->n, v->n);
}

static int wrap(parser *ps, int op, int kid) { return kid < 0 ? -1 : node(ps, op, kid, 1); }

static int pair(parser *ps, int op, int a, int b)
{
    if (a < 0 || b < 0) return -1;
    int v[2] = { a, b };
    ivec iv = { v, 2, 2 };
    return group_of(ps, op, &iv);
}

/* a copy of the subtree at x, with leaves of its own (positions are leaves) */
static int copy_tree(parser *ps, int x)
{
    rnode r = ps->nodes[x];
    if (r.op == R_LEAF) {
        uint64_t s[4];
        memcpy(s, ps->sets[r.k0], sizeof s);
        return leaf(ps, s);
    }
    if (r.op == R_EMPTY) return node(ps, R_EMPTY, 0, 0);
    if (r.op == R_STAR || r.op == R_OPT) return wrap(ps, r.op, copy_tree(ps, r.k0));
    ivec v = { 0 };
    int out = -1;
    for (int k = 0; k < r.nk; k++) {
        int c = copy_tree(ps, ps->kids[r.k0 + k]);
        if (c < 0 || !push(&v, c)) goto done;
    }
    out = group_of(ps, r.op, &v);
done:
    if (out < 0 && !ps->rc) oom(ps);
    free(v.v);
    return out;
}

/* ---- characters: sets of code points to trees of bytes ------------------------------------ */
typedef struct cset { uint32_t (*r)[2]; int n, cap; } cset;

static int cs_add(cset *c, uint32_t lo, uint32_t hi)
{
    if (!sf_grow((void **)&c->r, &c->cap, c->n + 1, sizeof *c->r)) return 0;
    c->r[c->n][0] = lo;
    c->r[c->n][1] = hi;
    c->n++;
    return 1;
}

static int by_lo(const void *a, const void *b)
{
    uint32_t x = ((const uint32_t *)a)[0], y = ((const uint32_t *)b)[0];
    return x < y ? -1 : x > y;
}

static void cs_norm(cset *c)
{
    if (c->n < 2) return;
    qsort(c->r, (size_t)c->n, sizeof *c->r, by_lo);
    int o = 0;
    for (int i = 1; i < c->n; i++) {
        if (c->r[i][0] <= c->r[o][1] + 1) {
            if (c->r[i][1] > c->r[o][1]) c->r[o][1] = c->r[i][1];
        } else {
            c->r[++o][0] = c->r[i][0];
            c->r[o][1] = c->r[i][1];
        }
    }
    c->n = o + 1;
}

/* every code point not in c (sorted and merged first) */
static int cs_negate(cset *c)
{
    cs_norm(c);
    cset o = { 0 };
    uint32_t at = 0;
    int ok = 1;
    for (int i = 0; i < c->n && ok; i++) {
        if (c->r[i][0] > at) ok = cs_add(&o, at, c->r[i][0] - 1);
        at = c->r[i][1] + 1;
    }
    if (ok && at <= 0x10FFFF) ok = cs_add(&o, at, 0x10FFFF);
    free(c->r);
    *c = o;
    return ok;
}


/* a character's bytes as a row of ranges, one per byte */
typedef struct useq { uint8_t lo[4], hi[4], n; } useq;
typedef struct uvec { useq *v; int n, cap; } uvec;

/* The code points lo..hi (no surrogates, above ASCII) as rows of byte ranges: split where the
 * encoded length changes, then until every continuation byte after the first differing one
 * spans 80..BF (the way RE2 and Rust's regex-syntax do it), so that each row's bytes are
 * exactly those of its code points. */
static int utf8_seqs(uint32_t lo, uint32_t hi, uvec *out)
{
    static const uint32_t top[3] = { 0x7F, 0x7FF, 0xFFFF };
    for (int k = 0; k < 3; k++)
        if (lo <= top[k] && hi > top[k]) return utf8_seqs(lo, top[k], out) && utf8_seqs(top[k] + 1, hi, out);
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) return utf8_seqs(lo, lo | m, out) && utf8_seqs((lo | m) + 1, hi, out);
            if ((hi & m) != m) return utf8_seqs(lo, (hi & ~m) - 1, out) && utf8_seqs(hi & ~m, hi, out);
        }
    }
    if (!sf_grow((void **)&out->v, &out->cap, out->n + 1, sizeof *out->v)) return 0;
    useq *q = &out->v[out->n++];
    q->n = (uint8_t)tok_utf8_enc(lo, q->lo);
    tok_utf8_enc(hi, q->hi);
    return 1;
}

/* The rows in[0..n), which share their last d ranges, as a tree for what comes before those:
 * grouped by the range before them, each group's tree followed by that range's leaf; groups
 * whose rows all begin at that range make one leaf together (E1..EC and EE..EF before the same
 * two continuation bytes, say). Sharing the ends this way, `.` takes 15 positions, not 27. */
static int seq_tree(parser *ps, const useq *in, int n, int d)
{
    ivec alts = { 0 };
    uint64_t firsts[4] = { 0 };
    int have_firsts = 0, x = 0;
    uint8_t *done = calloc((size_t)n, 1);
    if (!done) return oom(ps);
    for (int i = 0; i < n && x >= 0; i++) {
        if (done[i] || in[i].n == d) continue;
        int at = in[i].n - 1 - d;
        uint8_t lo = in[i].lo[at], hi = in[i].hi[at];
        useq *sub = malloc(sizeof *sub * (size_t)n);
        int m = 0, all_begin = 1;
        if (!sub) {
            x = oom(ps);
            break;
        }
        for (int j = i; j < n; j++)
            if (!done[j] && in[j].n > d && in[j].lo[in[j].n - 1 - d] == lo && in[j].hi[in[j].n - 1 - d] == hi) {
                done[j] = 1;
                sub[m++] = in[j];
                all_begin &= in[j].n == d + 1;
            }
        if (all_begin) {
            for (int b = lo; b <= hi; b++) firsts[b >> 6] |= 1ull << (b & 63);
            have_firsts = 1;
        } else {
            int before = seq_tree(ps, sub, m, d + 1), r = before < 0 ? -1 : byte_range(ps, lo, hi);
            if ((x = pair(ps, R_CAT, before, r)) >= 0 && !push(&alts, x)) x = oom(ps);
        }
        free(sub);
    }
    if (x >= 0 && have_firsts && ((x = leaf(ps, firsts)) < 0 || !push(&alts, x))) x = x < 0 ? -1 : oom(ps);
    for (int i = 0; i < n && x >= 0; i++) /* a row that begins here: the empty text before it */
        if (in[i].n == d) {
            if ((x = node(ps, R_EMPTY, 0, 0)) >= 0 && !push(&alts, x)) x = oom(ps);
            break;
        }
    if (x >= 0) x = group_of(ps, R_ALT, &alts);
    free(alts.v);
    free(done);
    return x;
}

/* c as a tree: ASCII in one leaf, the rest as UTF-8 rows; c is freed */
static int from_cset(parser *ps, cset *c, size_t at)
{
    cs_norm(c);
    uint64_t ascii[4] = { 0 };
    int have_ascii = 0, ok = 1;
    uvec seqs = { 0 };
    for (int i = 0; i < c->n && ok; i++) {
        uint32_t lo = c->r[i][0], hi = c->r[i][1] > 0x10FFFF ? 0x10FFFF : c->r[i][1];
        for (; lo <= hi && lo < 0x80; lo++, have_ascii = 1) ascii[lo >> 6] |= 1ull << (lo & 63);
        if (lo > hi) continue;
        if (lo < 0xD800) ok = utf8_seqs(lo, hi < 0xD7FF ? hi : 0xD7FF, &seqs);
        if (ok && hi > 0xDFFF) ok = utf8_seqs(lo > 0xE000 ? lo : 0xE000, hi, &seqs);
    }
    free(c->r);
    *c = (cset){ 0 };
    int x = ok ? 0 : oom(ps), y = -1;
    if (x >= 0 && !have_ascii && !seqs.n) x = fail(ps, at, "a class that matches no character");
    if (x >= 0 && seqs.n) x = y = seq_tree(ps, seqs.v, seqs.n, 0);
    if (x >= 0 && have_ascii) x = leaf(ps, ascii);
    if (x >= 0 && have_ascii && y >= 0) x = pair(ps, R_ALT, y, x);
    free(seqs.v);
    return x;
}

/* ---- the parser ---------------------------------------------------------------------------- */
static int peek(const parser *ps) { return ps->i < ps->n ? ps->p[ps->i] : -1; }

/* one UTF-8 character of the pattern; -1 when it is not one */
static int32_t take_char(parser *ps)
{
    int len = tok_utf8_len(ps->p + ps->i, ps->n - ps->i);
    if (!len) return fail(ps, ps->i, "the pattern is not valid UTF-8");
    uint32_t c = tok_utf8_cp((const char *)ps->p + ps->i, ps->n - ps->i, &len);
    ps->i += (size_t)len;
    return (int32_t)c;
}

/* \d \w \s and their negations into c; 0 when e is none of them */
static int class_escape(cset *c, int e, int *ok)
{
    int neg = e == 'D' || e == 'W' || e == 'S';
    switch (e | 0x20) {
    case 'd': *ok = cs_add(c, '0', '9'); break;
    case 'w': *ok = cs_add(c, '0', '9') && cs_add(c, 'A', 'Z') && cs_add(c, 'a', 'z') && cs_add(c, '_', '_'); break;
    case 's': *ok = cs_add(c, ' ', ' ') && cs_add(c, '\t', '\r'); break;
    default: return 0;
    }
    if (neg && *ok) *ok = cs_negate(c);
    return 1;
}

/* After '\': one code point (or, for \d and the like, a set added to c): returns the code point,
 * -2 for a set, -1 on error. in_class: inside [...]. */
static int32_t escape(parser *ps, cset *c, int in_class)
{
    size_t at = ps->i - 1;
    if (ps->i >= ps->n) return fail(ps, at, "a pattern that ends with '\\'");
    int e = ps->p[ps->i];
    cset tmp = { 0 };
    int ok = 1;
    if (class_escape(&tmp, e, &ok)) {
        ps->i++;
        for (int k = 0; k < tmp.n && ok; k++) ok = cs_add(c, tmp.r[k][0], tmp.r[k][1]);
        free(tmp.r);
        return ok ? -2 : oom(ps);
    }
    ps->i++;
    switch (e) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case 'a': return '\a';
    case '0': return 0;
    case 'x': case 'u': case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            int h = ps->i < ps->n ? sf_hexval(ps->p[ps->i]) : -1;
            if (h < 0) return fail(ps, at, "'\\%c' needs %d hexadecimal digits", e, digits);
            v = v << 4 | (uint32_t)h;
            ps->i++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail(ps, at, "'\\%c' names no character", e);
        return (int32_t)v;
    }
    case 'b': case 'B':
        if (in_class && e == 'b') return '\b';
        return fail(ps, at, "word boundaries ('\\%c') are not supported", e);
    case 'A': case 'Z': case 'z': case 'G':
        return fail(ps, at, "'\\%c' is supported only at the %s of the pattern or of one of its top-level alternatives",
                    e, e == 'A' ? "beginning" : "end");
    case 'g': return fail(ps, at, "back-references are not supported");
    default:
        if (e >= '1' && e <= '9') return fail(ps, at, "back-references are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return fail(ps, at, "unknown escape '\\%c'", e);
        ps->i--;
        return take_char(ps); /* punctuation or any other character stands for itself */
    }
}

/* after '[' */
static int parse_class(parser *ps)
{
    size_t at = ps->i - 1;
    cset c = { 0 };
    int neg = 0, first = 1, ok = 1;
    if (peek(ps) == '^') neg = 1, ps->i++;
    for (;;) {
        if (ps->i >= ps->n) {
            free(c.r);
            return fail(ps, at, "a class '[' without its ']'");
        }
        if (ps->p[ps->i] == ']' && !first) {
            ps->i++;
            break;
        }
        first = 0;
        int32_t lo;
        if (ps->p[ps->i] == '\\') {
            ps->i++;
            lo = escape(ps, &c, 1);
        } else if (ps->p[ps->i] == '[' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == ':') {
            free(c.r);
            return fail(ps, ps->i, "POSIX classes ('[:name:]') are not supported");
        } else {
            lo = take_char(ps);
        }
        if (lo == -1) {
            free(c.r);
            return -1;
        }
        if (lo == -2) continue; /* \d and the like: added */
        int32_t hi = lo;
        if (peek(ps) == '-' && ps->i + 1 < ps->n && ps->p[ps->i + 1] != ']') {
            size_t dash = ps->i;
            ps->i++;
            if (ps->p[ps->i] == '\\') {
                ps->i++;
                hi = escape(ps, &c, 1);
                if (hi == -2) {
                    free(c.r);
                    return fail(ps, dash, "a range that ends in a class escape");
                }
            } else {
                hi = take_char(ps);
            }
            if (hi == -1) {
                free(c.r);
                return -1;
            }
            if (hi < lo) {
                free(c.r);
                return fail(ps, dash, "a range whose end comes before its start");
            }
        }
        if (!(ok = cs_add(&c, (uint32_t)lo, (uint32_t)hi))) break;
    }
    if (ok && neg) ok = cs_negate(&c);
    if (!ok) {
        free(c.r);
        return oom(ps);
    }
    return from_cset(ps, &c, at);
}

/* a count with one more digit (-1: none yet), held at 10^7 once past it (refused later) */
static long digit(long v, int c) { return v >= 10000000 ? v : (v < 0 ? 0 : v) * 10 + (c - '0'); }

/* {n}, {n,}, {,m}, {n,m}, {,} at i (Python's rule): 1 and the bounds (max -1: none), else 0 */
static int brace_quant(const parser *ps, size_t *end, long *mn, long *mx)
{
    size_t i = ps->i + 1;
    long lo = -1, hi = -1;
    int comma = 0;
    for (; i < ps->n && ps->p[i] >= '0' && ps->p[i] <= '9'; i++) lo = digit(lo, ps->p[i]);
    if (i < ps->n && ps->p[i] == ',') {
        comma = 1;
        for (i++; i < ps->n && ps->p[i] >= '0' && ps->p[i] <= '9'; i++) hi = digit(hi, ps->p[i]);
    } else {
        hi = lo;
    }
    if (i >= ps->n || ps->p[i] != '}' || (!comma && lo < 0)) return 0;
    *mn = lo < 0 ? 0 : lo;
    *mx = hi;
    *end = i + 1;
    return 1;
}

static int is_quant(const parser *ps)
{
    int c = peek(ps);
    size_t e;
    long a, b;
    return c == '*' || c == '+' || c == '?' || (c == '{' && brace_quant(ps, &e, &a, &b));
}

/* x repeated mn to mx times (mx -1: no limit), each copy beyond the first with leaves of its own */
static int repeat(parser *ps, int x, long mn, long mx, size_t at)
{
    if (mn > SF_REGEX_MAX_REPEAT || mx > SF_REGEX_MAX_REPEAT)
        return fail(ps, at, "a repeat count over %d", SF_REGEX_MAX_REPEAT);
    if (mx >= 0 && mx < mn) return fail(ps, at, "a repeat whose minimum is over its maximum");
    ivec v = { 0 };
    int used = 0, out = 0;
    for (long k = 0; k < mn && out >= 0; k++)
        if ((out = used++ ? copy_tree(ps, x) : x) >= 0 && !push(&v, out)) out = oom(ps);
    if (out >= 0 && mx < 0) {
        if ((out = wrap(ps, R_STAR, used++ ? copy_tree(ps, x) : x)) >= 0 && !push(&v, out)) out = oom(ps);
    } else if (out >= 0 && mx > mn) { /* x (x (x)?)? ... built from the inside out */
        int tail = -1;
        for (long k = mx - mn; k > 0 && out >= 0; k--) {
            int c = used++ ? copy_tree(ps, x) : x;
            out = tail < 0 ? wrap(ps, R_OPT, c) : wrap(ps, R_OPT, pair(ps, R_CAT, c, tail));
            tail = out;
        }
        if (out >= 0 && !push(&v, out)) out = oom(ps);
    }
    if (out >= 0) out = group_of(ps, R_CAT, &v);
    free(v.v);
    return out;
}

static int parse_alt(parser *ps);

/* after '(' */
static int parse_group(parser *ps)
{
    size_t at = ps->i - 1;
    if (peek(ps) == '?') {
        ps->i++;
        int c = peek(ps);
        if (c == ':') {
            ps->i++;
        } else if (c == 'P' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '<') {
            ps->i += 2;
            goto name;
        } else if (c == '<' && ps->i + 1 < ps->n && ps->p[ps->i + 1] != '=' && ps->p[ps->i + 1] != '!') {
            ps->i++;
        name:
            while (ps->i < ps->n && ps->p[ps->i] != '>') {
                int d = ps->p[ps->i];
                if (!(d == '_' || (d >= '0' && d <= '9') || (d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z') || d >= 0x80))
                    return fail(ps, ps->i, "a group name with '%c' in it", d);
                ps->i++;
            }
            if (ps->i >= ps->n) return fail(ps, at, "a group name without its '>'");
            ps->i++;
        } else if (c == '=' || c == '!' || c == '<') {
            return fail(ps, at, "lookaround assertions are not supported");
        } else if (c == 'P' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == '=') {
            return fail(ps, at, "back-references are not supported");
        } else if (c == '#') {
            while (ps->i < ps->n && ps->p[ps->i] != ')') ps->i++;
            if (ps->i >= ps->n) return fail(ps, at, "a comment '(?#' without its ')'");
            ps->i++;
            return node(ps, R_EMPTY, 0, 0);
        } else {
            return fail(ps, at, "'(?%c' (inline flags, conditionals, atomic groups) is not supported", c < 0 ? ' ' : c);
        }
    }
    if (++ps->depth > SF_REGEX_MAX_NEST) return fail(ps, at, "groups nested over %d deep", SF_REGEX_MAX_NEST);
    int x = parse_alt(ps);
    ps->depth--;
    if (x < 0) return -1;
    if (peek(ps) != ')') return fail(ps, at, "a '(' without its ')'");
    ps->i++;
    return x;
}

static int parse_atom(parser *ps)
{
    size_t at = ps->i;
    int c = ps->p[ps->i];
    cset cs = { 0 };
    switch (c) {
    case '(': ps->i++; return parse_group(ps);
    case '[': ps->i++; return parse_class(ps);
    case '.':
        ps->i++;
        if (!cs_add(&cs, '\n', '\n') || !cs_negate(&cs)) return free(cs.r), oom(ps);
        return from_cset(ps, &cs, at);
    case '*': case '+': case '?': return fail(ps, at, "'%c' with nothing to repeat", c);
    case '^': case '$':
        return fail(ps, at, "'%c' is supported only at the %s of the pattern or of one of its top-level alternatives",
                    c, c == '^' ? "beginning" : "end");
    case '\\': {
        ps->i++;
        int32_t v = escape(ps, &cs, 0);
        if (v == -1) return free(cs.r), -1;
        if (v >= 0 && !cs_add(&cs, (uint32_t)v, (uint32_t)v)) return free(cs.r), oom(ps);
        return from_cset(ps, &cs, at);
    }
    default:
        if (c == '{' && is_quant(ps)) return fail(ps, at, "'{' with nothing to repeat");
        int32_t v = take_char(ps);
        if (v < 0) return -1;
        if (!cs_add(&cs, (uint32_t)v, (uint32_t)v)) return free(cs.r), oom(ps);
        return from_cset(ps, &cs, at);
    }
}

/* '$' or \Z (\z) at i, ending a top-level alternative: consumed, 1 */
static int end_anchor(parser *ps)
{
    size_t k = ps->i;
    if (ps->depth || k >= ps->n) return 0;
    if (ps->p[k] == '$') k++;
    else if (ps->p[k] == '\\' && k + 1 < ps->n && (ps->p[k + 1] == 'Z' || ps->p[k + 1] == 'z')) k += 2;
    else return 0;
    if (k < ps->n && ps->p[k] != '|') return 0;
    ps->i = k;
    return 1;
}

/* any text: [\s\S]* */
static int any_text(parser *ps)
{
    cset c = { 0 };
    if (!cs_add(&c, 0, 0x10FFFF)) return oom(ps);
    return wrap(ps, R_STAR, from_cset(ps, &c, ps->i));
}

static int parse_cat(parser *ps)
{
    ivec v = { 0 };
    int x = 0, start = 0, end = 0;
    if (!ps->depth && peek(ps) == '^') start = 1, ps->i++; /* a top-level alternative's beginning */
    else if (!ps->depth && peek(ps) == '\\' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == 'A') start = 1, ps->i += 2;
    const int top = ps->search && !ps->depth; /* a search's top-level alternative: any text around it */
    if (top && !start && ((x = any_text(ps)) < 0 || !push(&v, x))) x = x < 0 ? -1 : oom(ps);
    while (x >= 0 && ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        if ((end = end_anchor(ps))) break;
        x = parse_atom(ps);
        if (x >= 0 && is_quant(ps)) {
            size_t at = ps->i, end;
            long mn = 0, mx = -1;
            int q = ps->p[ps->i];
            if (q == '{') brace_quant(ps, &end, &mn, &mx), ps->i = end;
            else ps->i++, mn = q == '+', mx = q == '?' ? 1 : -1;
            if (peek(ps) == '?') ps->i++; /* lazy: the same texts match */
            else if (peek(ps) == '+') x = fail(ps, ps->i, "possessive quantifiers are not supported");
            if (x >= 0 && is_quant(ps)) x = fail(ps, ps->i, "a repeat of a repeat ('%c' after a quantifier)", peek(ps));
            if (x >= 0) x = repeat(ps, x, mn, mx, at);
        }
        if (x >= 0 && !push(&v, x)) x = oom(ps);
    }
    if (x >= 0 && top && !end && ((x = any_text(ps)) < 0 || !push(&v, x))) x = x < 0 ? -1 : oom(ps);
    if (x >= 0) x = group_of(ps, R_CAT, &v);
    free(v.v);
    return x;
}

static int parse_alt(parser *ps)
{
    ivec v = { 0 };
    int x;
    for (;;) {
        if ((x = parse_cat(ps)) < 0) break;
        if (!push(&v, x)) {
            x = oom(ps);
            break;
        }
        if (peek(ps) != '|') break;
        ps->i++;
    }
    if (x >= 0) x = group_of(ps, R_ALT, &v);
    free(v.v);
    return x;
}

/* ---- positions (Glushkov) ------------------------------------------------------------------ */
typedef struct glu {
    int W;             /* words of a position set: positions 0 (the start) .. n_leaves */
    uint64_t *follow;  /* [(n_leaves + 1) * W] */
    int oom;
} glu;

static void or_into(uint64_t *d, const uint64_t *s, int W) { for (int w = 0; w < W; w++) d[w] |= s[w]; }

/* for every position in from: its followers gain to */
static void follow_all(glu *g, const uint64_t *from, const uint64_t *to)
{
    for (int w = 0; w < g->W; w++)
        for (uint64_t b = from[w]; b; b &= b - 1) or_into(g->follow + (size_t)(w * 64 + __builtin_ctzll(b)) * (size_t)g->W, to, g->W);
}

/* The first and last positions of the subtree at x into F and L (zeroed by the caller), its
 * followers into g->follow; returns whether it matches the empty text. The kids' sets live
 * only while their parent reads them: memory goes with the nesting, not the tree's size. */
static int positions(const parser *ps, glu *g, int x, uint64_t *F, uint64_t *L)
{
    const rnode *r = &ps->nodes[x];
    const size_t bytes = sizeof *F * (size_t)g->W;
    switch (r->op) {
    case R_EMPTY: return 1;
    case R_LEAF: {
        int p = r->k0 + 1;
        F[p >> 6] |= 1ull << (p & 63);
        L[p >> 6] |= 1ull << (p & 63);
        return 0;
    }
    case R_STAR: case R_OPT:
        positions(ps, g, r->k0, F, L);
        if (r->op == R_STAR) follow_all(g, L, F);
        return 1;
    }
    uint64_t *kf = malloc(2 * bytes), *kl = kf + g->W;
    if (!kf) return g->oom = 1, 0;
    int null = r->op == R_CAT;
    for (int i = 0; i < r->nk; i++) {
        int k = ps->kids[r->k0 + i];
        memset(kf, 0, 2 * bytes);
        int kn = positions(ps, g, k, kf, kl);
        if (r->op == R_ALT) {
            or_into(F, kf, g->W);
            or_into(L, kl, g->W);
            null |= kn;
            continue;
        }
        /* R_CAT: L collects the positions the next kid's first ones may follow: the last ones of
         * the kid before, and of those before it while the kids between can be empty */
        follow_all(g, L, kf);
        if (null) or_into(F, kf, g->W);
        if (!kn) memset(L, 0, bytes);
        or_into(L, kl, g->W);
        null &= kn;
    }
    free(kf);
    return null;
}

/* ---- the automaton ------------------------------------------------------------------------- */
typedef struct dfa_build {
    int W;
    uint64_t *sets;      /* [cap * W] each state's positions */
    int n, cap;
    int32_t *slot;       /* open addressing over sets' hashes; -1 empty */
    int n_slot;
} dfa_build;

static uint64_t set_hash(const uint64_t *s, int W)
{
    uint64_t h = 0;
    for (int w = 0; w < W; w++) h = sf_mix64(h ^ s[w]);
    return h;
}

/* the state whose positions are s, made if new; -1 out of memory, -2 too many */
static int intern(dfa_build *d, const uint64_t *s)
{
    uint64_t h = set_hash(s, d->W);
    size_t mask = (size_t)d->n_slot - 1, i = (size_t)h & mask;
    for (; d->slot[i] >= 0; i = (i + 1) & mask)
        if (!memcmp(d->sets + (size_t)d->slot[i] * (size_t)d->W, s, sizeof *s * (size_t)d->W)) return d->slot[i];
    if (d->n >= SF_REGEX_MAX_STATES) return -2;
    if (!sf_grow((void **)&d->sets, &d->cap, d->n + 1, sizeof *d->sets * (size_t)d->W)) return -1;
    memcpy(d->sets + (size_t)d->n * (size_t)d->W, s, sizeof *s * (size_t)d->W);
    d->slot[i] = d->n;
    return d->n++;
}

static int build_dfa(parser *ps, glu *g, const uint64_t *root_last, int root_null, sf_regex *re)
{
    const int W = g->W;
    /* classes of bytes: two bytes share one when every leaf takes both or neither */
    int n_cls = 1;
    memset(re->cls, 0, sizeof re->cls);
    for (int p = 0; p < ps->n_leaves; p++) {
        int16_t remap[512];
        memset(remap, -1, sizeof remap);
        int n = 0;
        uint8_t nc[256];
        for (int b = 0; b < 256; b++) {
            int key = re->cls[b] * 2 + (int)(ps->sets[p][b >> 6] >> (b & 63) & 1);
            if (remap[key] < 0) remap[key] = (int16_t)n++;
            nc[b] = (uint8_t)remap[key];
        }
        memcpy(re->cls, nc, sizeof nc);
        n_cls = n;
    }
    re->n_cls = n_cls;
    uint64_t *pos_of = calloc((size_t)n_cls * (size_t)W, sizeof *pos_of); /* class -> positions taking it */
    uint64_t *acc = calloc((size_t)W, sizeof *acc), *u = calloc((size_t)W, sizeof *u), *t = calloc((size_t)W, sizeof *t);
    dfa_build d = { .W = W, .n_slot = 1 };
    while (d.n_slot < 2 * SF_REGEX_MAX_STATES) d.n_slot *= 2;
    d.slot = malloc(sizeof *d.slot * (size_t)d.n_slot);
    int rc = -1, cap_next = 0, cap_acc = 0, cap_more = 0;
    if (!pos_of || !acc || !u || !t || !d.slot) goto done;
    memset(d.slot, -1, sizeof *d.slot * (size_t)d.n_slot);
    for (int b = 0; b < 256; b++)
        for (int p = 0; p < ps->n_leaves; p++)
            if (ps->sets[p][b >> 6] >> (b & 63) & 1) pos_of[(size_t)re->cls[b] * (size_t)W + (size_t)(p + 1) / 64] |= 1ull << ((p + 1) & 63);
    memcpy(acc, root_last, sizeof *acc * (size_t)W);
    if (root_null) acc[0] |= 1;
    memset(t, 0, sizeof *t * (size_t)W);
    t[0] = 1;
    if (intern(&d, t) != 0) goto done;
    for (int s = 0; s < d.n; s++) {
        if (!sf_grow((void **)&re->next, &cap_next, (d.n + 1) * n_cls, sizeof *re->next) ||
            !sf_grow((void **)&re->acc, &cap_acc, d.n + 1, 1) || !sf_grow((void **)&re->more, &cap_more, d.n + 1, 1)) goto done;
        const uint64_t *S = d.sets + (size_t)s * (size_t)W;
        memset(u, 0, sizeof *u * (size_t)W);
        int a = 0, more = 0;
        for (int w = 0; w < W; w++) {
            a |= (S[w] & acc[w]) != 0;
            for (uint64_t b = S[w]; b; b &= b - 1) or_into(u, g->follow + (size_t)(w * 64 + __builtin_ctzll(b)) * (size_t)W, W);
        }
        for (int k = 0; k < n_cls; k++) {
            uint64_t any = 0;
            for (int w = 0; w < W; w++) any |= t[w] = u[w] & pos_of[(size_t)k * (size_t)W + (size_t)w];
            int id = -1;
            if (any && (id = intern(&d, t)) < 0) {
                if (id == -2) fail(ps, 0, "the pattern needs over %d automaton states (nested repeats of overlapping "
                                          "parts); write it more simply", SF_REGEX_MAX_STATES);
                goto done;
            }
            if (id >= 0) more = 1;
            re->next[(size_t)s * (size_t)n_cls + (size_t)k] = id;
        }
        re->acc[s] = (uint8_t)a;
        re->more[s] = (uint8_t)more;
    }
    re->n_states = d.n;
    rc = 0;
done:
    if (rc && !ps->rc) oom(ps);
    free(pos_of);
    free(acc);
    free(u);
    free(t);
    free(d.sets);
    free(d.slot);
    return rc;
}

void sf_regex_free(sf_regex *re)
{
    if (!re) return;
    free(re->next);
    free(re->acc);
    free(re->more);
    free(re);
}

int sf_regex_compile(const char *pat, size_t len, int flags, sf_regex **out, sf_error *err)
{
    *out = NULL;
    if (len > SF_REGEX_MAX_LEN) return sf_err(err, SF_EINVAL, "regex: a pattern of over %d bytes", SF_REGEX_MAX_LEN);
    parser ps = { .p = (const unsigned char *)pat, .n = len, .err = err, .search = !!(flags & SF_REGEX_SEARCH) };
    int root = parse_alt(&ps);
    if (root >= 0 && ps.i < ps.n) root = fail(&ps, ps.i, "a ')' without its '('");
    glu g = { 0 };
    sf_regex *re = NULL;
    uint64_t *first = NULL;
    if (root >= 0) {
        g.W = (ps.n_leaves + 1 + 63) / 64;
        first = calloc(2 * (size_t)g.W, sizeof *first);
        g.follow = calloc((size_t)(ps.n_leaves + 1) * (size_t)g.W, sizeof *g.follow);
        re = calloc(1, sizeof *re);
        if (!first || !g.follow || !re) {
            oom(&ps);
        } else {
            uint64_t *last = first + g.W;
            int null = positions(&ps, &g, root, first, last);
            or_into(g.follow, first, g.W); /* the start, position 0, before them */
            if (g.oom) oom(&ps);
            else build_dfa(&ps, &g, last, null, re);
        }
    }
    int rc = ps.rc;
    free(first);
    free(g.follow);
    free(ps.nodes);
    free(ps.kids);
    free(ps.sets);
    if (rc) {
        sf_regex_free(re);
        return rc;
    }
    *out = re;
    return SF_OK;
}

int sf_regex_next(const sf_regex *re, int state, unsigned char c)
{
    return state < 0 ? -1 : re->next[(size_t)state * (size_t)re->n_cls + re->cls[c]];
}

int sf_regex_accepts(const sf_regex *re, int state) { return state >= 0 && re->acc[state]; }
int sf_regex_more(const sf_regex *re, int state) { return state >= 0 && re->more[state]; }
int sf_regex_states(const sf_regex *re) { return re->n_states; }

int sf_regex_match(const sf_regex *re, const char *s, size_t n)
{
    int st = 0;
    for (size_t i = 0; i < n && st >= 0; i++) st = sf_regex_next(re, st, (unsigned char)s[i]);
    return sf_regex_accepts(re, st);
}
