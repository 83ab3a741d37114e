/* json_mask.c — JSON output: the schema compiler, the byte recognizer and the per-draw token
 * mask (json_mask.h). */
#include "json_mask.h"

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- schemas --------------------------------------------------------------------------------- */
enum { K_OBJ = 1, K_ARR = 2, K_STR = 4, K_NUM = 8, K_INT = 16, K_BOOL = 32, K_NULL = 64, K_ANY = 127 };

typedef struct jnode {
    uint8_t kinds;          /* K_* a value may be (enums: by their texts instead) */
    uint8_t any_obj;        /* an object without properties: any members */
    int items;              /* array items' node; -1: any value */
    int prop0, n_props;     /* into props[] */
    uint64_t required;      /* bit i: property prop0 + i is required */
    int enum0, n_enum;      /* into enums[] */
    int min_items, max_items; /* -1: no bound */
    sf_regex *re;           /* strings: the `pattern` their text holds, read as a search */
} jnode;

typedef struct jtext { char *s; int len; int node; } jtext;

struct sf_jschema {
    int choice;             /* node 0's enums are raw strings the whole output is one of */
    sf_regex *re;           /* else, when set: a pattern the whole output matches */
    jnode *nodes;
    int n_nodes, cap_nodes;
    jtext *props, *enums;
    int n_props, cap_props, n_enums, cap_enums;
};

void sf_jschema_free(sf_jschema *s)
{
    if (!s) return;
    sf_regex_free(s->re);
    for (int i = 0; i < s->n_nodes; i++) sf_regex_free(s->nodes[i].re);
    for (int i = 0; i < s->n_props; i++) free(s->props[i].s);
    for (int i = 0; i < s->n_enums; i++) free(s->enums[i].s);
    free(s->props);
    free(s->enums);
    free(s->nodes);
    free(s);
}

static int add_text(jtext **arr, int *n, int *cap, const char *s, size_t len, int node)
{
    if (!sf_grow((void **)arr, cap, *n + 1, sizeof **arr)) return -1;
    char *c = malloc(len + 1);
    if (!c) return -1;
    memcpy(c, s, len);
    c[len] = 0;
    (*arr)[*n] = (jtext){ c, (int)len, node };
    return (*n)++;
}

static int kind_of(const char *t)
{
    static const struct { const char *n; int k; } k[] = { { "object", K_OBJ }, { "array", K_ARR }, { "string", K_STR },
                                                         { "number", K_NUM }, { "integer", K_INT }, { "boolean", K_BOOL },
                                                         { "null", K_NULL } };
    for (size_t i = 0; i < SF_ARRAY_LEN(k); i++)
        if (!strcmp(t, k[i].n)) return k[i].k;
    return 0;
}

static int bound(json_t *v, const char *what, const char *path, int *out, sf_error *err)
{
    if (!v) return SF_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65535)
        return sf_err(err, SF_EINVAL, "schema: '%s' at %s must be an integer in 0..65535", what, path);
    *out = (int)json_integer_value(v);
    return SF_OK;
}

/* compile schema s into a node; *idx is its index, or -1 for "any value" */
static int compile(sf_jschema *sc, json_t *s, const char *path, int depth, int *idx, sf_error *err)
{
    static const char *const known[] = { "type", "properties", "required", "additionalProperties", "items", "enum",
                                         "const", "minItems", "maxItems", "pattern", "title", "description",
                                         "default", "examples", "$schema", "$comment" };
    *idx = -1;
    if (json_is_true(s)) return SF_OK;
    if (!json_is_object(s)) return sf_err(err, SF_EINVAL, "schema: %s must be an object", path);
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        size_t i = 0;
        while (i < SF_ARRAY_LEN(known) && strcmp(k, known[i])) i++;
        if (i == SF_ARRAY_LEN(known))
            return sf_err(err, SF_EINVAL, "schema: '%.64s' at %s is not supported (supported: type, properties, "
                          "required, additionalProperties false, items, enum, const, minItems, maxItems, pattern)", k, path);
    }
    json_t *type = json_object_get(s, "type"), *props = json_object_get(s, "properties"),
           *items = json_object_get(s, "items"), *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"),
           *ap = json_object_get(s, "additionalProperties"), *req = json_object_get(s, "required"),
           *pat = json_object_get(s, "pattern");
    int kinds = 0;
    if (json_is_string(type)) {
        if (!(kinds = kind_of(json_string_value(type))))
            return sf_err(err, SF_EINVAL, "schema: type '%.32s' at %s is not a JSON type", json_string_value(type), path);
    } else if (json_is_array(type) && json_array_size(type) > 0) {
        size_t i;
        json_array_foreach(type, i, v) {
            int kk = json_is_string(v) ? kind_of(json_string_value(v)) : 0;
            if (!kk) return sf_err(err, SF_EINVAL, "schema: type[%zu] at %s is not a JSON type", i, path);
            kinds |= kk;
        }
    } else if (type) {
        return sf_err(err, SF_EINVAL, "schema: 'type' at %s must be a type name or a list of them", path);
    }
    if (pat && !json_is_string(pat)) return sf_err(err, SF_EINVAL, "schema: 'pattern' at %s must be a string", path);
    if (pat && (en || cn)) return sf_err(err, SF_EINVAL, "schema: 'pattern' at %s with 'enum' or 'const' is not supported", path);
    /* a pattern without a type: strings only (any other value would also do; strings that match
     * are what it is there for) */
    if (!type && !en && !cn) kinds = props ? K_OBJ : items ? K_ARR : pat ? K_STR : 0;
    if (!kinds && !en && !cn) return SF_OK; /* annotations only: any value */
    if (depth >= SF_JSON_MAX_FRAMES)
        return sf_err(err, SF_EINVAL, "schema: %s is nested deeper than %d levels", path, SF_JSON_MAX_FRAMES);
    if (!sf_grow((void **)&sc->nodes, &sc->cap_nodes, sc->n_nodes + 1, sizeof *sc->nodes))
        return sf_err(err, SF_ENOMEM, "schema: out of memory");
    int me = sc->n_nodes++;
    sc->nodes[me] = (jnode){ .kinds = (uint8_t)kinds, .items = -1, .min_items = -1, .max_items = -1 };
    *idx = me;
    if (en || cn) { /* values written exactly as the schema writes them */
        json_t *vals = en ? en : json_array();
        if (!en) json_array_append(vals, cn);
        int rc = SF_OK;
        if (!json_is_array(vals) || json_array_size(vals) == 0 || json_array_size(vals) > SF_JSON_MAX_PROPS)
            rc = sf_err(err, SF_EINVAL, "schema: 'enum' at %s must list 1 to %d values", path, SF_JSON_MAX_PROPS);
        sc->nodes[me].enum0 = sc->n_enums;
        size_t i;
        json_array_foreach(vals, i, v) {
            if (rc) break;
            if (!json_is_string(v) && !json_is_boolean(v) && !json_is_null(v)) {
                rc = sf_err(err, SF_EINVAL, "schema: enum values at %s must be strings, booleans or null", path);
                break;
            }
            char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
            if (t && strlen(t) > 255) {
                free(t);
                rc = sf_err(err, SF_EINVAL, "schema: an enum value at %s is longer than 255 bytes", path);
                break;
            }
            if (!t || add_text(&sc->enums, &sc->n_enums, &sc->cap_enums, t, strlen(t), me) < 0)
                rc = sf_err(err, SF_ENOMEM, "schema: out of memory");
            free(t);
        }
        if (!en) json_decref(vals);
        sc->nodes[me].n_enum = sc->n_enums - sc->nodes[me].enum0;
        return rc;
    }
    if (pat && (kinds & K_STR)) {
        int rc = sf_regex_compile(json_string_value(pat), json_string_length(pat), SF_REGEX_SEARCH, &sc->nodes[me].re, err);
        if (rc) return sf_err_wrap(err, "schema: 'pattern' at %s", path), rc;
    }
    if (kinds & K_OBJ) {
        if (ap && !json_is_false(ap))
            return sf_err(err, SF_EINVAL, "schema: 'additionalProperties' at %s must be false or absent (only the "
                          "listed properties are written)", path);
        if (props && !json_is_object(props)) return sf_err(err, SF_EINVAL, "schema: 'properties' at %s must be an object", path);
        if (!props || json_object_size(props) == 0) {
            sc->nodes[me].any_obj = 1;
            if (req && json_array_size(req))
                return sf_err(err, SF_EINVAL, "schema: 'required' at %s names properties it does not list", path);
        } else {
            if (json_object_size(props) > SF_JSON_MAX_PROPS)
                return sf_err(err, SF_EINVAL, "schema: %s has more than %d properties", path, SF_JSON_MAX_PROPS);
            /* the properties' names first, contiguous; their schemas after */
            int p0 = sc->n_props, n = 0;
            json_object_foreach(props, k, v) {
                if (strlen(k) > 255)
                    return sf_err(err, SF_EINVAL, "schema: a property name at %s is longer than 255 bytes", path);
                for (const char *c = k; *c; c++)
                    if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7E || *c == '"' || *c == '\\')
                        return sf_err(err, SF_EINVAL, "schema: property name '%.64s' at %s: only printable ASCII "
                                      "without '\"' and '\\' is supported", k, path);
                if (add_text(&sc->props, &sc->n_props, &sc->cap_props, k, strlen(k), -1) < 0)
                    return sf_err(err, SF_ENOMEM, "schema: out of memory");
                n++;
            }
            sc->nodes[me].prop0 = p0;
            sc->nodes[me].n_props = n;
            int i = 0;
            json_object_foreach(props, k, v) {
                char sub[256];
                snprintf(sub, sizeof sub, "%s.properties.%.64s", path, k);
                int child, rc = compile(sc, v, sub, depth + 1, &child, err);
                if (rc) return rc;
                sc->props[p0 + i++].node = child;
            }
            if (req && !json_is_array(req)) return sf_err(err, SF_EINVAL, "schema: 'required' at %s must be a list", path);
            size_t ri;
            json_array_foreach(req, ri, v) {
                int j = 0;
                while (j < n && (!json_is_string(v) || strcmp(sc->props[p0 + j].s, json_string_value(v)))) j++;
                if (j == n) return sf_err(err, SF_EINVAL, "schema: required[%zu] at %s is not one of its properties", ri, path);
                sc->nodes[me].required |= 1ull << j;
            }
        }
    }
    if (kinds & K_ARR) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s.items", path);
        int child = -1, rc;
        if (items && (rc = compile(sc, items, sub, depth + 1, &child, err))) return rc;
        sc->nodes[me].items = child;
        if ((rc = bound(json_object_get(s, "minItems"), "minItems", path, &sc->nodes[me].min_items, err)) ||
            (rc = bound(json_object_get(s, "maxItems"), "maxItems", path, &sc->nodes[me].max_items, err)))
            return rc;
        if (sc->nodes[me].max_items >= 0 && sc->nodes[me].min_items > sc->nodes[me].max_items)
            return sf_err(err, SF_EINVAL, "schema: minItems is more than maxItems at %s", path);
    }
    return SF_OK;
}

int sf_jschema_compile(const char *text, size_t len, sf_jschema **out, sf_error *err)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    if (!root) return sf_err(err, SF_EINVAL, "schema: not JSON: %s", je.text);
    sf_jschema *sc = calloc(1, sizeof *sc);
    if (!sc) {
        json_decref(root);
        return sf_err(err, SF_ENOMEM, "schema: out of memory");
    }
    int node = -1, rc = compile(sc, root, "$", 0, &node, err);
    json_decref(root);
    if (!rc && (node < 0 || sc->nodes[node].kinds != K_OBJ || sc->nodes[node].n_enum))
        rc = sf_err(err, SF_EINVAL, "schema: the root must be {\"type\": \"object\", ...}");
    if (rc) {
        sf_jschema_free(sc);
        return rc;
    }
    *out = sc; /* the root is node 0 */
    return SF_OK;
}

int sf_jschema_choice(const char *text, size_t len, sf_jschema **out, sf_error *err)
{
    *out = NULL;
    json_t *root = json_loadb(text, len, 0, NULL), *v;
    size_t n = json_array_size(root), i;
    int rc = SF_OK;
    if (!json_is_array(root) || n == 0 || n > SF_JSON_MAX_PROPS) {
        json_decref(root);
        return sf_err(err, SF_EINVAL, "choice: a list of 1 to %d strings", SF_JSON_MAX_PROPS);
    }
    sf_jschema *sc = calloc(1, sizeof *sc);
    if (!sc || !sf_grow((void **)&sc->nodes, &sc->cap_nodes, 1, sizeof *sc->nodes)) rc = sf_err(err, SF_ENOMEM, "choice: out of memory");
    json_array_foreach(root, i, v) {
        if (rc) break;
        size_t l = json_string_length(v);
        if (!json_is_string(v) || l == 0 || l > 255 || strlen(json_string_value(v)) != l) {
            rc = sf_err(err, SF_EINVAL, "choice %zu: a string of 1 to 255 bytes without NUL", i);
            break;
        }
        for (int k = 0; k < sc->n_enums && !rc; k++)
            if (sc->enums[k].len == (int)l && !memcmp(sc->enums[k].s, json_string_value(v), l))
                rc = sf_err(err, SF_EINVAL, "choice %zu: the same as choice %d", i, k);
        if (!rc && add_text(&sc->enums, &sc->n_enums, &sc->cap_enums, json_string_value(v), l, 0) < 0)
            rc = sf_err(err, SF_ENOMEM, "choice: out of memory");
    }
    json_decref(root);
    if (rc) {
        sf_jschema_free(sc);
        return rc;
    }
    sc->choice = 1;
    sc->nodes[0] = (jnode){ .items = -1, .enum0 = 0, .n_enum = sc->n_enums, .min_items = -1, .max_items = -1 };
    sc->n_nodes = 1;
    *out = sc;
    return SF_OK;
}

int sf_jschema_regex(const char *pattern, size_t len, sf_jschema **out, sf_error *err)
{
    *out = NULL;
    sf_jschema *sc = calloc(1, sizeof *sc);
    if (!sc) return sf_err(err, SF_ENOMEM, "regex: out of memory");
    int rc = sf_regex_compile(pattern, len, 0, &sc->re, err);
    if (rc) {
        free(sc);
        return rc;
    }
    *out = sc;
    return SF_OK;
}

/* ---- the recognizer ------------------------------------------------------------------------ */
enum {
    J_TOP,       /* before the object: whitespace, then '{' */
    J_VALUE,     /* a value (after ':', or after ',' in an array) */
    J_ARR_FIRST, /* after '[': a value or ']' */
    J_OBJ_FIRST, /* after '{': a key or '}' */
    J_KEY,       /* after ',' in an object: a key */
    J_COLON,     /* after a key */
    J_AFTER,     /* after a value: ',' or the end of its container */
    J_STR,       /* in a string (key says which kind) */
    J_ESC,       /* after '\' */
    J_HEX,       /* in \uXXXX */
    J_LOW_BS,    /* after a high surrogate's escape: its low half's '\' */
    J_LOW_U,     /* then its 'u' */
    J_NUM,       /* in a number (sub: N_*) */
    J_LIT,       /* in true, false or null */
    J_SKEY,      /* in a key of a schema's object: one of its property names */
    J_ENUM,      /* in an enum's value: one of its texts */
    J_DONE,      /* the object is complete */
    J_CHOICE,    /* a choice's output: ecand the strings it can still be, pos the bytes written */
    J_REGEX,     /* a pattern's output: rs the automaton's state */
};
/* number parts: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
enum { N_MINUS = 1, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const lits[3] = { "true", "false", "null" };

void sf_json_init(sf_json *j, const sf_jschema *sc)
{
    memset(j, 0, offsetof(sf_json, f));
    j->sc = sc;
    if (sc && sc->choice) {
        j->mode = J_CHOICE;
        j->ecand = sc->n_enums == 64 ? ~0ull : (1ull << sc->n_enums) - 1;
    } else if (sc && sc->re) {
        j->mode = J_REGEX;
    }
}

void sf_json_copy(sf_json *dst, const sf_json *src)
{
    memcpy(dst, src, offsetof(sf_json, f) + (size_t)src->nf * sizeof src->f[0]);
}

/* A choice's strings it can still be: which of them it equals now (done), and whether one is
 * longer (it may go on). */
static void choice_state(const sf_json *j, int *done, int *more)
{
    *done = *more = 0;
    for (int i = 0; i < j->sc->n_enums; i++)
        if (j->ecand >> i & 1) {
            if (j->sc->enums[i].len == j->pos) *done = 1;
            else *more = 1;
        }
}

int sf_json_done(const sf_json *j)
{
    if (j->mode == J_REGEX) return sf_regex_accepts(j->sc->re, j->rs);
    if (j->mode != J_CHOICE) return j->mode == J_DONE;
    int done, more;
    choice_state(j, &done, &more);
    return done;
}

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int top_is_object(const sf_json *j) { return j->stack[(j->depth - 1) / 8] >> ((j->depth - 1) % 8) & 1; }

/* the schema frame of the innermost container, NULL when it is free-form */
static sf_json_frame *frame(sf_json *j)
{
    return j->nf && j->f[j->nf - 1].depth == j->depth ? &j->f[j->nf - 1] : NULL;
}

static const jnode *node_of(const sf_json *j, const sf_json_frame *f) { return &j->sc->nodes[f->node]; }

/* the node the value about to start must match; -1: any value */
static int expected(sf_json *j)
{
    if (!j->depth) return j->sc ? 0 : -1;
    sf_json_frame *f = frame(j);
    if (!f) return -1;
    const jnode *n = node_of(j, f);
    return top_is_object(j) ? j->sc->props[n->prop0 + f->cur].node : n->items;
}

static int push(sf_json *j, int object, int node)
{
    if (j->depth >= SF_JSON_MAX_DEPTH) return 0;
    uint8_t bit = (uint8_t)(1u << (j->depth % 8));
    j->stack[j->depth / 8] = (uint8_t)(object ? j->stack[j->depth / 8] | bit : j->stack[j->depth / 8] & ~bit);
    j->depth++;
    j->mode = object ? J_OBJ_FIRST : J_ARR_FIRST;
    if (node >= 0) { /* a constrained container: its frame */
        if (j->nf >= SF_JSON_MAX_FRAMES) return 0;
        j->f[j->nf++] = (sf_json_frame){ .node = (uint16_t)node, .depth = j->depth };
    }
    return 1;
}

static void pop(sf_json *j)
{
    if (frame(j)) j->nf--;
    j->depth--;
    j->mode = j->depth ? J_AFTER : J_DONE;
}

/* an object's properties a key may name now: from the next one up to the first required */
static uint64_t key_candidates(const jnode *n, int next)
{
    uint64_t c = 0;
    for (int i = next; i < n->n_props; i++) {
        c |= 1ull << i;
        if (n->required >> i & 1) break;
    }
    return c;
}

static int required_left(const jnode *n, int next) { return next < 64 && (n->required >> next) != 0; }

static int start_value(sf_json *j, int c)
{
    int node = expected(j);
    const jnode *n = node >= 0 ? &j->sc->nodes[node] : NULL;
    int kinds = n ? n->kinds : K_ANY;
    if (n && n->n_enum) { /* an enum: its texts, byte by byte */
        uint64_t cand = 0;
        for (int i = 0; i < n->n_enum; i++)
            if ((unsigned char)j->sc->enums[n->enum0 + i].s[0] == c) cand |= 1ull << i;
        if (!cand) return 0;
        j->mode = J_ENUM;
        j->ecand = cand;
        j->enode = (uint16_t)node;
        j->pos = 1;
        return 1;
    }
    switch (c) {
    case '{':
        return (kinds & K_OBJ) && push(j, 1, n && !n->any_obj ? node : -1);
    case '[':
        return (kinds & K_ARR) && push(j, 0, n && (n->items >= 0 || n->min_items > 0 || n->max_items >= 0) ? node : -1);
    case '"':
        if (!(kinds & K_STR)) return 0;
        j->mode = J_STR;
        j->key = 0;
        if ((j->pat = n && n->re)) {
            j->pnode = (uint16_t)node;
            j->rs = 0;
        }
        return 1;
    case '-':
        if (!(kinds & (K_NUM | K_INT))) return 0;
        j->mode = J_NUM;
        j->sub = N_MINUS;
        j->intonly = !(kinds & K_NUM);
        return 1;
    case 't': case 'f': case 'n':
        if (!(kinds & (c == 'n' ? K_NULL : K_BOOL))) return 0;
        j->mode = J_LIT;
        j->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        j->pos = 1;
        return 1;
    default:
        if (!is_digit(c) || !(kinds & (K_NUM | K_INT))) return 0;
        j->mode = J_NUM;
        j->sub = c == '0' ? N_ZERO : N_INT;
        j->intonly = !(kinds & K_NUM);
        return 1;
    }
}

/* a value starts in an array: counted against maxItems */
static int array_value(sf_json *j, int c)
{
    sf_json_frame *f = frame(j);
    if (f) {
        const jnode *n = node_of(j, f);
        if (n->max_items >= 0 && f->count >= n->max_items) return 0;
        if (!start_value(j, c)) return 0;
        f->count++; /* after start_value: a pushed frame does not move f */
        return 1;
    }
    return start_value(j, c);
}

/* a number's next byte: 1 taken, 0 not a number byte here (the number may end before it) */
static int num_byte(sf_json *j, int c)
{
    int d = is_digit(c);
    switch (j->sub) {
    case N_MINUS: if (d) { j->sub = c == '0' ? N_ZERO : N_INT; return 1; } return 0;
    case N_ZERO: break;
    case N_INT: if (d) return 1; break;
    case N_DOT: if (d) { j->sub = N_FRAC; return 1; } return 0;
    case N_FRAC: if (d) return 1; if (c == 'e' || c == 'E') { j->sub = N_E; return 1; } return 0;
    case N_E: if (c == '+' || c == '-') { j->sub = N_ESIGN; return 1; } /* fall through */
    case N_ESIGN: if (d) { j->sub = N_EXP; return 1; } return 0;
    case N_EXP: return d;
    }
    /* N_ZERO, N_INT */
    if (j->intonly) return 0;
    if (c == '.') { j->sub = N_DOT; return 1; }
    if (c == 'e' || c == 'E') { j->sub = N_E; return 1; }
    return 0;
}

/* a byte of a pattern-held string's text (escapes decoded) through its pattern */
static int pat_byte(sf_json *j, int c)
{
    return !j->pat || (j->rs = sf_regex_next(j->sc->nodes[j->pnode].re, j->rs, (unsigned char)c)) >= 0;
}

static int str_byte(sf_json *j, int c)
{
    if (j->need) { /* inside a UTF-8 sequence */
        if (c < j->lo || c > j->hi) return 0;
        j->need--;
        j->lo = 0x80;
        j->hi = 0xBF;
        return pat_byte(j, c);
    }
    if (c == '"') {
        if (j->pat && !sf_regex_accepts(j->sc->nodes[j->pnode].re, j->rs)) return 0;
        j->pat = 0;
        j->mode = j->key ? J_COLON : J_AFTER;
        return 1;
    }
    if (c == '\\') { /* in a held string, only when an escape's character can go on */
        if (j->pat) {
            const sf_regex *re = j->sc->nodes[j->pnode].re;
            int any = 0;
            for (const char *e = "\"\\/\b\f\n\r\t"; *e && !any; e++) any = sf_regex_next(re, j->rs, (unsigned char)*e) >= 0;
            if (!any) return 0;
        }
        j->mode = J_ESC;
        return 1;
    }
    if (c < 0x20) return 0;
    if (c < 0x80) return pat_byte(j, c);
    /* a lead byte: how many follow, and the range of the first (no overlongs, surrogates or
     * code points past U+10FFFF) */
    j->lo = 0x80;
    j->hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) j->need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        j->need = 2;
        if (c == 0xE0) j->lo = 0xA0;
        if (c == 0xED) j->hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        j->need = 3;
        if (c == 0xF0) j->lo = 0x90;
        if (c == 0xF4) j->hi = 0x8F;
    } else {
        return 0;
    }
    return pat_byte(j, c);
}

/* a key of a constrained object: narrow its candidates byte by byte; '"' ends it on a name */
static int skey_byte(sf_json *j, int c)
{
    sf_json_frame *f = frame(j);
    const jnode *n = node_of(j, f);
    const jtext *p = j->sc->props + n->prop0;
    if (c == '"') {
        for (int i = 0; i < n->n_props; i++)
            if (f->cand >> i & 1 && p[i].len == f->kpos) {
                f->cur = (uint16_t)i;
                f->next = (uint16_t)(i + 1);
                j->mode = J_COLON;
                return 1;
            }
        return 0;
    }
    for (int i = 0; i < n->n_props; i++)
        if (f->cand >> i & 1 && (f->kpos >= p[i].len || (unsigned char)p[i].s[f->kpos] != c)) f->cand &= ~(1ull << i);
    f->kpos++;
    return f->cand != 0;
}

static int enum_byte(sf_json *j, int c)
{
    const jnode *n = &j->sc->nodes[j->enode];
    const jtext *e = j->sc->enums + n->enum0;
    int whole = 0;
    for (int i = 0; i < n->n_enum; i++) {
        if (!(j->ecand >> i & 1)) continue;
        if (j->pos >= e[i].len || (unsigned char)e[i].s[j->pos] != c) j->ecand &= ~(1ull << i);
        else if (j->pos + 1 == e[i].len) whole = 1; /* texts are strings and literals: none is a prefix of another */
    }
    j->pos++;
    if (whole) j->mode = J_AFTER;
    return j->ecand != 0;
}

/* whitespace between tokens of the grammar: at most SF_JSON_MAX_WS bytes in a row */
static int take_ws(sf_json *j) { return ++j->ws <= SF_JSON_MAX_WS; }

static int feed_byte(sf_json *j, int c)
{
    if (!is_ws(c)) j->ws = 0;
    switch (j->mode) {
    case J_TOP:
        if (is_ws(c)) return take_ws(j);
        return c == '{' && start_value(j, c);
    case J_DONE: return is_ws(c) && take_ws(j);
    case J_ARR_FIRST:
        if (is_ws(c)) return take_ws(j);
        if (c == ']') {
            sf_json_frame *f = frame(j);
            if (f && node_of(j, f)->min_items > 0) return 0;
            pop(j);
            return 1;
        }
        return array_value(j, c);
    case J_VALUE:
        if (is_ws(c)) return take_ws(j);
        return top_is_object(j) ? start_value(j, c) : array_value(j, c);
    case J_OBJ_FIRST:
        if (c == '}') {
            sf_json_frame *f = frame(j);
            if (f && required_left(node_of(j, f), f->next)) return 0;
            pop(j);
            return 1;
        }
        /* fall through */
    case J_KEY: {
        if (is_ws(c)) return take_ws(j);
        if (c != '"') return 0;
        sf_json_frame *f = frame(j);
        if (f) {
            f->cand = key_candidates(node_of(j, f), f->next);
            f->kpos = 0;
            j->mode = J_SKEY;
            return f->cand != 0;
        }
        j->mode = J_STR;
        j->key = 1;
        return 1;
    }
    case J_COLON:
        if (is_ws(c)) return take_ws(j);
        if (c != ':') return 0;
        j->mode = J_VALUE;
        return 1;
    case J_AFTER: {
        if (is_ws(c)) return take_ws(j);
        int obj = top_is_object(j);
        sf_json_frame *f = frame(j);
        if (c == ',') {
            if (f && obj && f->next >= node_of(j, f)->n_props) return 0; /* no property left */
            if (f && !obj && node_of(j, f)->max_items >= 0 && f->count >= node_of(j, f)->max_items) return 0;
            j->mode = obj ? J_KEY : J_VALUE;
            return 1;
        }
        if (c != (obj ? '}' : ']')) return 0;
        if (f && (obj ? required_left(node_of(j, f), f->next) : f->count < node_of(j, f)->min_items)) return 0;
        pop(j);
        return 1;
    }
    case J_STR: return str_byte(j, c);
    case J_ESC:
        if (c == 'u' && j->pat) return 0; /* a pattern-held string writes its characters as themselves */
        if (c == 'u') {
            j->mode = J_HEX;
            j->hex = 0;
            j->cp = 0;
            j->low = 0;
            return 1;
        }
        if (!c || !strchr("\"\\/bfnrt", c)) return 0;
        j->mode = J_STR;
        return pat_byte(j, c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c);
    case J_HEX: {
        int h = sf_hexval(c);
        if (h < 0) return 0;
        j->cp = (uint16_t)(j->cp << 4 | h);
        if (++j->hex < 4) return 1;
        int high = j->cp >= 0xD800 && j->cp <= 0xDBFF, lowhalf = j->cp >= 0xDC00 && j->cp <= 0xDFFF;
        if (j->low ? !lowhalf : lowhalf) return 0; /* a pair's halves in order, never alone */
        j->mode = !j->low && high ? J_LOW_BS : J_STR;
        return 1;
    }
    case J_LOW_BS:
        if (c != '\\') return 0;
        j->mode = J_LOW_U;
        return 1;
    case J_LOW_U:
        if (c != 'u') return 0;
        j->mode = J_HEX;
        j->hex = 0;
        j->cp = 0;
        j->low = 1;
        return 1;
    case J_NUM:
        if (num_byte(j, c)) return 1;
        if (j->sub == N_MINUS || j->sub == N_DOT || j->sub == N_E || j->sub == N_ESIGN) return 0;
        j->mode = J_AFTER; /* the number ended before c */
        return feed_byte(j, c);
    case J_LIT:
        if (c != lits[j->lit][j->pos]) return 0;
        if (!lits[j->lit][++j->pos]) j->mode = J_AFTER;
        return 1;
    case J_SKEY: return skey_byte(j, c);
    case J_ENUM: return enum_byte(j, c);
    case J_CHOICE: {
        const jtext *e = j->sc->enums;
        for (int i = 0; i < j->sc->n_enums; i++)
            if (j->ecand >> i & 1 && (j->pos >= e[i].len || (unsigned char)e[i].s[j->pos] != c)) j->ecand &= ~(1ull << i);
        j->pos++;
        return j->ecand != 0;
    }
    case J_REGEX: return (j->rs = sf_regex_next(j->sc->re, j->rs, (unsigned char)c)) >= 0;
    }
    return 0;
}

int sf_json_feed(sf_json *j, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(j, (unsigned char)p[i])) return 0;
    return 1;
}

/* ---- the vocabulary ---------------------------------------------------------------------- */
struct sf_json_vocab {
    int n;           /* logits row width */
    uint32_t *off;   /* [n + 1] text of id i: text[off[i], off[i + 1]); empty: never drawn */
    char *text;
    uint8_t *eog;    /* [n] ends generation */
    uint8_t *plain;  /* [n] whole characters a string takes as they stand (no '"', '\\' or control
                      * byte; UTF-8 complete and well-formed): fits anywhere inside a free string */
    /* the ids with a text, in byte order of their texts, and each one's common prefix with the
     * one before: the mask walks them as a trie, feeding each shared prefix once */
    int32_t *order;
    uint16_t *lcp;
    int n_order;
    /* inside a free string only the other texts are fed: their walk indices (np), each one's
     * prefix shared with the one before it in np (the least lcp between them), and the plain
     * ones as bits */
    int32_t *np;
    uint16_t *np_l;
    int n_np, n_plain;
    uint32_t *plain_bits;
    int32_t *rest;   /* the other ids: end-of-generation ones and those without a text */
    int n_rest;
};

/* the longest common prefix a mask's walk keeps states for; longer tokens are fed alone */
#define WALK_MAX 48

void sf_json_vocab_free(sf_json_vocab *v)
{
    if (!v) return;
    free(v->off);
    free(v->text);
    free(v->eog);
    free(v->plain);
    free(v->order);
    free(v->lcp);
    free(v->np);
    free(v->np_l);
    free(v->plain_bits);
    free(v->rest);
    free(v);
}

static int by_text(const void *a, const void *b, void *arg)
{
    const sf_json_vocab *v = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t nx = v->off[x + 1] - v->off[x], ny = v->off[y + 1] - v->off[y];
    int c = memcmp(v->text + v->off[x], v->text + v->off[y], nx < ny ? nx : ny);
    return c ? c : nx < ny ? -1 : nx > ny ? 1 : x - y;
}

static int sort_texts(sf_json_vocab *v)
{
    v->order = malloc(sizeof *v->order * (size_t)(v->n ? v->n : 1));
    v->lcp = malloc(sizeof *v->lcp * (size_t)(v->n ? v->n : 1));
    v->rest = malloc(sizeof *v->rest * (size_t)(v->n ? v->n : 1));
    if (!v->order || !v->lcp || !v->rest) return SF_ENOMEM;
    for (int32_t id = 0; id < v->n; id++)
        if (!v->eog[id] && v->off[id + 1] > v->off[id]) v->order[v->n_order++] = id;
        else v->rest[v->n_rest++] = id;
    qsort_r(v->order, (size_t)v->n_order, sizeof *v->order, by_text, v);
    for (int i = 0; i < v->n_order; i++) {
        size_t l = 0;
        if (i) {
            size_t na, nb;
            const char *a = sf_json_vocab_text(v, v->order[i - 1], &na), *b = sf_json_vocab_text(v, v->order[i], &nb);
            while (l < na && l < nb && a[l] == b[l]) l++;
        }
        v->lcp[i] = (uint16_t)(l < 65535 ? l : 65535);
    }
    v->np = malloc(sizeof *v->np * (size_t)(v->n ? v->n : 1));
    v->np_l = malloc(sizeof *v->np_l * (size_t)(v->n ? v->n : 1));
    v->plain_bits = calloc((size_t)(v->n + 31) / 32 + 1, sizeof *v->plain_bits);
    if (!v->np || !v->np_l || !v->plain_bits) return SF_ENOMEM;
    uint16_t minl = 0;
    for (int i = 0; i < v->n_order; i++) {
        minl = i ? SF_MIN(minl, v->lcp[i]) : 0;
        if (v->plain[v->order[i]]) {
            v->plain_bits[v->order[i] >> 5] |= 1u << (v->order[i] & 31);
            v->n_plain++;
            continue;
        }
        v->np[v->n_np] = i;
        v->np_l[v->n_np++] = minl;
        minl = UINT16_MAX;
    }
    return SF_OK;
}

/* 1 when a string's byte rules (str_byte, outside any pattern) take all n bytes from a character
 * boundary and end on one, without leaving the string: such a text fits wherever a free string
 * is at a boundary, and leaves it there, so the mask need not feed it. */
static int in_string_whole(const char *p, size_t n)
{
    sf_json j;
    memset(&j, 0, offsetof(sf_json, f));
    j.mode = J_STR;
    for (size_t k = 0; k < n; k++)
        if (!str_byte(&j, (unsigned char)p[k]) || j.mode != J_STR) return 0;
    return !j.need;
}

/* A token whose text alone is one printable ASCII byte: decoded before each token, it makes the
 * token read as it does mid-output (no stream-start space stripping). */
static int32_t find_anchor(const sf_tokenizer *t, int tv, char *anchor)
{
    static const char *const tries[] = { "a", "x", "0", "A" };
    for (size_t i = 0; i < SF_ARRAY_LEN(tries); i++) {
        int32_t id = sf_tok_lookup(t, tries[i]);
        char *s = NULL;
        if (id >= 0 && id < tv && sf_tok_decode(t, &id, 1, 1, &s, NULL) == SF_OK && s && !strcmp(s, tries[i])) {
            free(s);
            *anchor = tries[i][0];
            return id;
        }
        free(s);
    }
    return -1;
}

int sf_json_vocab_new(const sf_tokenizer *t, int n_logits, sf_json_vocab **out, sf_error *err)
{
    *out = NULL;
    int tv = SF_MIN(sf_tok_vocab_size(t), n_logits);
    char anchor = 0;
    int32_t a = find_anchor(t, tv, &anchor);
    if (a < 0)
        return sf_err(err, SF_EUNSUPPORTED, "JSON mode: the tokenizer has no token for a single letter to read "
                      "the others against");
    sf_json_vocab *v = calloc(1, sizeof *v);
    size_t cap = (size_t)tv * 8 + 64, len = 0;
    if (v) {
        v->n = n_logits;
        v->off = calloc((size_t)n_logits + 1, sizeof *v->off);
        v->eog = calloc((size_t)n_logits, 1);
        v->plain = calloc((size_t)n_logits, 1);
        v->text = malloc(cap);
    }
    if (!v || !v->off || !v->eog || !v->plain || !v->text) {
        sf_json_vocab_free(v);
        return sf_err(err, SF_ENOMEM, "JSON mode: out of memory for the vocabulary's texts");
    }
    for (int32_t id = 0; id < n_logits; id++) {
        v->off[id] = (uint32_t)len;
        if (id >= tv) continue;
        v->eog[id] = (uint8_t)sf_tok_is_eog(t, id);
        int32_t pair[2] = { a, id };
        char *s = NULL;
        if (v->eog[id] || sf_tok_decode(t, pair, 2, 1, &s, NULL) != SF_OK || !s || s[0] != anchor) {
            free(s);
            continue;
        }
        size_t n = strlen(s + 1);
        if (len + n > cap) {
            cap = (len + n) * 2;
            char *g = realloc(v->text, cap);
            if (!g) {
                free(s);
                sf_json_vocab_free(v);
                return sf_err(err, SF_ENOMEM, "JSON mode: out of memory for the vocabulary's texts");
            }
            v->text = g;
        }
        memcpy(v->text + len, s + 1, n);
        v->plain[id] = n > 0 && in_string_whole(s + 1, n);
        len += n;
        free(s);
    }
    v->off[n_logits] = (uint32_t)len;
    if (sort_texts(v)) {
        sf_json_vocab_free(v);
        return sf_err(err, SF_ENOMEM, "JSON mode: out of memory for the vocabulary's texts");
    }
    *out = v;
    return SF_OK;
}

const char *sf_json_vocab_text(const sf_json_vocab *v, int32_t id, size_t *n)
{
    if (id < 0 || id >= v->n) return *n = 0, "";
    *n = v->off[id + 1] - v->off[id];
    return v->text + v->off[id];
}

/* Where a mask goes: -inf on a logits row for each token that cannot come next, or a bit set for
 * each that can (bits zeroed first). The walks below are inlined into sf_json_mask and
 * sf_json_mask_bits, each with one of the two a constant NULL, so neither pays for the other. */
#define MASK_WALK static inline __attribute__((always_inline))

MASK_WALK void mask_put(float *logits, uint32_t *bits, int32_t id, int ok)
{
    if (bits) bits[id >> 5] |= (uint32_t)ok << (id & 31);
    else if (!ok) logits[id] = -INFINITY;
}

/* sf_json_mask's walk for a pattern's output, whose state is an int: the same trie, with a
 * table lookup a byte instead of a copy of the recognizer and its switch (2.2-2.3x faster where
 * nearly every token fits, as under `.{0,100}`) */
MASK_WALK int regex_walk(const sf_regex *re, int s0, const sf_json_vocab *v, float *logits, uint32_t *bits)
{
    int st[WALK_MAX + 1], have = 0, bad = INT32_MAX, kept = 0;
    st[0] = s0;
    for (int i = 0; i < v->n_order; i++) {
        size_t n;
        const unsigned char *t = (const unsigned char *)sf_json_vocab_text(v, v->order[i], &n);
        int l = i ? v->lcp[i] : 0, ok;
        if (bad <= l) { /* a failed prefix of this text */
            ok = 0;
        } else if (n > WALK_MAX) { /* too long for the stack: alone */
            int s = s0;
            for (size_t k = 0; k < n && s >= 0; k++) s = sf_regex_next(re, s, t[k]);
            ok = s >= 0;
            have = 0;
            bad = INT32_MAX;
        } else {
            int d = SF_MIN(have, l);
            bad = INT32_MAX;
            for (; d < (int)n; d++)
                if ((st[d + 1] = sf_regex_next(re, st[d], t[d])) < 0) {
                    bad = d + 1;
                    break;
                }
            have = d;
            ok = bad == INT32_MAX;
        }
        kept += ok;
        mask_put(logits, bits, v->order[i], ok);
    }
    return kept;
}

/* The texts in byte order are a trie laid flat: st[d] holds the state after the first d bytes of
 * the current text, valid up to depth `have`; a text shares its first l bytes with the one fed
 * before, so only the rest is fed, and once a prefix fails (at depth `bad`) every text that
 * shares it fails without a byte fed. */
typedef struct trie_walk {
    const sf_json *j;
    sf_json *st;
    int have, bad;
} trie_walk;

static inline int walk_text(trie_walk *w, const char *t, size_t n, int l)
{
    if (w->bad <= l) return 0; /* a failed prefix of this text */
    if (n > WALK_MAX) {        /* too long for the stack: alone */
        sf_json c;
        sf_json_copy(&c, w->j);
        w->have = 0;
        w->bad = INT32_MAX;
        return sf_json_feed(&c, t, n);
    }
    int d = SF_MIN(w->have, l);
    w->bad = INT32_MAX;
    for (; d < (int)n; d++) {
        sf_json_copy(&w->st[d + 1], &w->st[d]);
        if (!feed_byte(&w->st[d + 1], (unsigned char)t[d])) {
            w->bad = d + 1;
            break;
        }
    }
    w->have = d;
    return w->bad == INT32_MAX;
}

/* Inside a free string at a character boundary the plain texts fit as they stand: only the
 * others are walked (np, with their shared prefixes np_l). */
MASK_WALK int json_mask(const sf_json *j, const sf_json_vocab *v, float *logits, uint32_t *bits)
{
    int done = sf_json_done(j), kept = 0, in_str = j->mode == J_STR && !j->need && !j->pat, more = 0;
    if (j->mode == J_CHOICE) choice_state(j, &done, &more); /* done, yet a longer one may go on */
    if (j->mode == J_REGEX) more = sf_regex_more(j->sc->re, j->rs);
    for (int i = 0; i < v->n_rest; i++) { /* end-of-generation ids fit once the object is done */
        int32_t id = v->rest[i];
        const int ok = done && v->eog[id];
        kept += ok;
        mask_put(logits, bits, id, ok);
    }
    if (done && !more) {
        if (!bits)
            for (int i = 0; i < v->n_order; i++) logits[v->order[i]] = -INFINITY;
        return kept;
    }
    if (j->mode == J_REGEX) return kept + regex_walk(j->sc->re, j->rs, v, logits, bits);
    static __thread sf_json st[WALK_MAX + 1];
    sf_json_copy(&st[0], j);
    trie_walk w = { .j = j, .st = st, .have = 0, .bad = INT32_MAX };
    size_t n;
    if (in_str) {
        kept += v->n_plain;
        if (bits)
            for (int k = 0; k < (v->n + 31) / 32; k++) bits[k] |= v->plain_bits[k];
        for (int k = 0; k < v->n_np; k++) {
            const int32_t id = v->order[v->np[k]];
            const char *t = sf_json_vocab_text(v, id, &n);
            const int ok = walk_text(&w, t, n, v->np_l[k]);
            kept += ok;
            mask_put(logits, bits, id, ok);
        }
        return kept;
    }
    for (int i = 0; i < v->n_order; i++) {
        const int32_t id = v->order[i];
        const char *t = sf_json_vocab_text(v, id, &n);
        const int ok = walk_text(&w, t, n, i ? v->lcp[i] : 0);
        kept += ok;
        mask_put(logits, bits, id, ok);
    }
    return kept;
}

int sf_json_mask(const sf_json *j, const sf_json_vocab *v, float *logits)
{
    return json_mask(j, v, logits, NULL);
}

int sf_json_mask_bits(const sf_json *j, const sf_json_vocab *v, uint32_t *allow)
{
    memset(allow, 0, (size_t)(v->n + 31) / 32 * sizeof *allow);
    return json_mask(j, v, NULL, allow);
}

int sf_json_accept(sf_json *j, const sf_json_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n) return 0;
    if (v->eog[id]) return 1;
    sf_json c;
    sf_json_copy(&c, j);
    if (v->off[id] == v->off[id + 1] || !sf_json_feed(&c, v->text + v->off[id], v->off[id + 1] - v->off[id])) return 0;
    sf_json_copy(j, &c);
    return 1;
}
