/* json_mask.c — JSON mode: the byte recognizer and the per-draw token mask (json_mask.h). */
#include "json_mask.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
    J_DONE,      /* the object is complete */
};
/* number parts: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
enum { N_MINUS = 1, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static const char *const lits[3] = { "true", "false", "null" };

void sf_json_init(sf_json *j) { memset(j, 0, sizeof *j); }

int sf_json_done(const sf_json *j) { return j->mode == J_DONE; }

static int is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int top_is_object(const sf_json *j) { return j->stack[(j->depth - 1) / 8] >> ((j->depth - 1) % 8) & 1; }

static int push(sf_json *j, int object)
{
    if (j->depth >= SF_JSON_MAX_DEPTH) return 0;
    uint8_t bit = (uint8_t)(1u << (j->depth % 8));
    j->stack[j->depth / 8] = (uint8_t)(object ? j->stack[j->depth / 8] | bit : j->stack[j->depth / 8] & ~bit);
    j->depth++;
    j->mode = object ? J_OBJ_FIRST : J_ARR_FIRST;
    return 1;
}

static void pop(sf_json *j)
{
    j->depth--;
    j->mode = j->depth ? J_AFTER : J_DONE;
}

static int start_value(sf_json *j, int c)
{
    switch (c) {
    case '{': return push(j, 1);
    case '[': return push(j, 0);
    case '"': j->mode = J_STR; j->key = 0; return 1;
    case '-': j->mode = J_NUM; j->sub = N_MINUS; return 1;
    case 't': case 'f': case 'n':
        j->mode = J_LIT;
        j->lit = c == 't' ? 0 : c == 'f' ? 1 : 2;
        j->pos = 1;
        return 1;
    default:
        if (!is_digit(c)) return 0;
        j->mode = J_NUM;
        j->sub = c == '0' ? N_ZERO : N_INT;
        return 1;
    }
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
    if (c == '.') { j->sub = N_DOT; return 1; }
    if (c == 'e' || c == 'E') { j->sub = N_E; return 1; }
    return 0;
}

static int hexval(int c)
{
    return is_digit(c) ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int str_byte(sf_json *j, int c)
{
    if (j->need) { /* inside a UTF-8 sequence */
        if (c < j->lo || c > j->hi) return 0;
        j->need--;
        j->lo = 0x80;
        j->hi = 0xBF;
        return 1;
    }
    if (c == '"') {
        j->mode = j->key ? J_COLON : J_AFTER;
        return 1;
    }
    if (c == '\\') {
        j->mode = J_ESC;
        return 1;
    }
    if (c < 0x20) return 0;
    if (c < 0x80) return 1;
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
    return 1;
}

/* whitespace between tokens of the grammar: at most SF_JSON_MAX_WS bytes in a row */
static int take_ws(sf_json *j) { return ++j->ws <= SF_JSON_MAX_WS; }

static int feed_byte(sf_json *j, int c)
{
    if (!is_ws(c)) j->ws = 0;
    switch (j->mode) {
    case J_TOP:
        if (is_ws(c)) return take_ws(j);
        return c == '{' && push(j, 1);
    case J_DONE: return is_ws(c) && take_ws(j);
    case J_ARR_FIRST:
        if (c == ']') {
            pop(j);
            return 1;
        }
        /* fall through */
    case J_VALUE:
        if (is_ws(c)) return take_ws(j);
        return start_value(j, c);
    case J_OBJ_FIRST:
        if (c == '}') {
            pop(j);
            return 1;
        }
        /* fall through */
    case J_KEY:
        if (is_ws(c)) return take_ws(j);
        if (c != '"') return 0;
        j->mode = J_STR;
        j->key = 1;
        return 1;
    case J_COLON:
        if (is_ws(c)) return take_ws(j);
        if (c != ':') return 0;
        j->mode = J_VALUE;
        return 1;
    case J_AFTER:
        if (is_ws(c)) return take_ws(j);
        if (c == ',') {
            j->mode = top_is_object(j) ? J_KEY : J_VALUE;
            return 1;
        }
        if (c == (top_is_object(j) ? '}' : ']')) {
            pop(j);
            return 1;
        }
        return 0;
    case J_STR: return str_byte(j, c);
    case J_ESC:
        if (c == 'u') {
            j->mode = J_HEX;
            j->hex = 0;
            j->cp = 0;
            j->low = 0;
            return 1;
        }
        if (!c || !strchr("\"\\/bfnrt", c)) return 0;
        j->mode = J_STR;
        return 1;
    case J_HEX: {
        int h = hexval(c);
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
    uint8_t *plain;  /* [n] printable ASCII but '"' and '\\': fits anywhere inside a string as it stands */
};

void sf_json_vocab_free(sf_json_vocab *v)
{
    if (!v) return;
    free(v->off);
    free(v->text);
    free(v->eog);
    free(v->plain);
    free(v);
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
        v->plain[id] = n > 0;
        for (size_t k = 0; k < n; k++)
            if ((unsigned char)s[1 + k] < 0x20 || (unsigned char)s[1 + k] > 0x7E || s[1 + k] == '"' || s[1 + k] == '\\')
                v->plain[id] = 0;
        len += n;
        free(s);
    }
    v->off[n_logits] = (uint32_t)len;
    *out = v;
    return SF_OK;
}

int sf_json_mask(const sf_json *j, const sf_json_vocab *v, float *logits)
{
    int done = sf_json_done(j), kept = 0, in_str = j->mode == J_STR && !j->need;
    uint8_t first[256]; /* which bytes may come next: a token is tried only if its first may */
    for (int c = 0; c < 256; c++) {
        sf_json t = *j;
        first[c] = (uint8_t)feed_byte(&t, c);
    }
    for (int id = 0; id < v->n; id++) {
        int ok;
        uint32_t a = v->off[id], n = v->off[id + 1] - a;
        if (v->eog[id]) ok = done;
        else if (in_str && v->plain[id]) ok = 1; /* most of a vocabulary, inside a string */
        else if (done || !n || !first[(unsigned char)v->text[a]]) ok = 0;
        else if (n == 1) ok = 1;
        else {
            sf_json c = *j;
            ok = sf_json_feed(&c, v->text + v->off[id], v->off[id + 1] - v->off[id]);
        }
        if (ok) kept++;
        else logits[id] = -INFINITY;
    }
    return kept;
}

int sf_json_accept(sf_json *j, const sf_json_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n) return 0;
    if (v->eog[id]) return 1;
    sf_json c = *j;
    if (v->off[id] == v->off[id + 1] || !sf_json_feed(&c, v->text + v->off[id], v->off[id + 1] - v->off[id])) return 0;
    *j = c;
    return 1;
}
