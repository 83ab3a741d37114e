/* tok_encode.c — text -> ids: added-token split, normalizers, pre-tokenizers, model,
 * post-processor, in the order and with the semantics of Hugging Face `tokenizers`.
 * Thread-safe: all state is per call (PCRE2 match data included). */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

typedef struct enc {
    const sf_tokenizer *t;
    pcre2_match_data *md;
    tok_scratch *sc;
    tok_strs a, b;            /* pre-tokenizer ping-pong lists */
    tok_buf norm, tmp;
    int32_t *ids;
    size_t n, cap;
} enc;

/* ---- splitting by a regex with a HF SplitDelimiterBehavior -------------------------------- */
typedef struct part {
    size_t s, e;
    int match;
} part;

static int parts_push(part **p, size_t *n, size_t *cap, part v)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 16;
        part *q = realloc(*p, c * sizeof *q);
        if (!q) return SF_ENOMEM;
        *p = q;
        *cap = c;
    }
    (*p)[(*n)++] = v;
    return SF_OK;
}

/* Appends the pieces of s[0..n) to out. */
static int split_re(enc *E, pcre2_code *re, const char *s, size_t n, int behavior, int invert, tok_strs *out)
{
    part *p = NULL;
    size_t np = 0, cap = 0, prev = 0, off = 0;
    int rc = SF_OK;
    while (off <= n) {
        int m = pcre2_match(re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, E->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            rc = SF_ERROR;
            goto cleanup;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms && (rc = parts_push(&p, &np, &cap, (part){ prev, ms, 0 }))) goto cleanup;
        if ((rc = parts_push(&p, &np, &cap, (part){ ms, me, 1 }))) goto cleanup;
        prev = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= n) break;
            int adv;
            tok_utf8_cp(s + me, n - me, &adv);
            off = me + (size_t)adv;
        } else {
            off = me;
        }
    }
    if (prev != n && (rc = parts_push(&p, &np, &cap, (part){ prev, n, 0 }))) goto cleanup;
    if (invert)
        for (size_t i = 0; i < np; i++) p[i].match = !p[i].match;
    /* fold by behavior (tokenizers' NormalizedString::split) */
    size_t k = 0;
    int prev_match = 0;
    if (behavior == TOK_SPLIT_MERGED_NEXT) {
        /* right to left, writing from the end: slot j >= i is never read again */
        size_t j = np;
        for (size_t i = np; i-- > 0;) {
            int m = p[i].match;
            if (m && !prev_match && j < np) p[j].s = p[i].s;
            else p[--j] = (part){ p[i].s, p[i].e, 0 };
            prev_match = m;
        }
        k = np - j;
        memmove(p, p + j, k * sizeof *p);
    } else {
        for (size_t i = 0; i < np; i++) {
            part c = p[i];
            int m = c.match;
            switch (behavior) {
            case TOK_SPLIT_REMOVED:
                if (!m) p[k++] = c;
                break;
            case TOK_SPLIT_ISOLATED:
                p[k++] = c;
                break;
            case TOK_SPLIT_MERGED_PREV:
                if (m && !prev_match && k) p[k - 1].e = c.e;
                else p[k++] = c;
                break;
            case TOK_SPLIT_CONTIGUOUS:
                if (m == prev_match && k) p[k - 1].e = c.e;
                else p[k++] = c;
                break;
            }
            prev_match = m;
        }
    }
    for (size_t i = 0; i < k; i++)
        if (p[i].e > p[i].s && (rc = tok_strs_push(out, s + p[i].s, p[i].e - p[i].s))) goto cleanup;
cleanup:
    free(p);
    return rc;
}

/* ---- normalizers ---------------------------------------------------------------------------- */
static int replace_all(tok_buf *out, const char *s, size_t n, const char *pat, size_t pl, const char *rep)
{
    size_t i = 0, run = 0, rl = strlen(rep);
    while (i + pl <= n) {
        if (!memcmp(s + i, pat, pl)) {
            if (tok_buf_put(out, s + run, i - run) || tok_buf_put(out, rep, rl)) return SF_ENOMEM;
            i += pl;
            run = i;
        } else {
            i++;
        }
    }
    return tok_buf_put(out, s + run, n - run);
}

static int normalize(enc *E, const char *s, size_t n)
{
    const sf_tokenizer *t = E->t;
    E->norm.len = 0;
    if (tok_buf_put(&E->norm, s, n)) return SF_ENOMEM;
    for (int i = 0; i < t->n_norms; i++) {
        const tok_norm *nm = &t->norms[i];
        E->tmp.len = 0;
        if (nm->kind == TOK_NORM_PREPEND) {
            if (!E->norm.len) continue;
            if (tok_buf_puts(&E->tmp, nm->a) || tok_buf_put(&E->tmp, E->norm.p, E->norm.len)) return SF_ENOMEM;
        } else if (nm->kind == TOK_NORM_REPLACE && !nm->re) {
            if (replace_all(&E->tmp, E->norm.p, E->norm.len, nm->a, strlen(nm->a), nm->b)) return SF_ENOMEM;
        } else if (nm->kind == TOK_NORM_REPLACE) {
            size_t off = 0, run = 0;
            while (off <= E->norm.len) {
                int m = pcre2_match(nm->re, (PCRE2_SPTR)E->norm.p, E->norm.len, off, PCRE2_NO_UTF_CHECK, E->md, NULL);
                if (m < 0) break;
                PCRE2_SIZE *ov = pcre2_get_ovector_pointer(E->md);
                if (tok_buf_put(&E->tmp, E->norm.p + run, ov[0] - run) || tok_buf_puts(&E->tmp, nm->b)) return SF_ENOMEM;
                run = ov[1];
                off = ov[1] > ov[0] ? ov[1] : ov[1] + 1;
                if (ov[1] == ov[0] && ov[1] < E->norm.len) { /* keep the character we step over */
                    int adv;
                    tok_utf8_cp(E->norm.p + ov[1], E->norm.len - ov[1], &adv);
                    off = ov[1] + (size_t)adv;
                    if (tok_buf_put(&E->tmp, E->norm.p + ov[1], (size_t)adv)) return SF_ENOMEM;
                    run = off;
                }
            }
            if (run < E->norm.len && tok_buf_put(&E->tmp, E->norm.p + run, E->norm.len - run)) return SF_ENOMEM;
        } else if (tok_nfc(&E->tmp, E->norm.p, E->norm.len)) { /* TOK_NORM_NFC */
            return SF_ENOMEM;
        }
        tok_buf x = E->norm;
        E->norm = E->tmp;
        E->tmp = x;
    }
    return SF_OK;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */
static int bytelevel_map(tok_buf *out, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tok_utf8_put(out, tok_byte_to_cp[(unsigned char)s[i]])) return SF_ENOMEM;
    return SF_OK;
}

/* Pre-tokenizes s[0..n) (normalized text) into E->a. at_origin: s starts at offset 0 of the
 * input (Metaspace prepend_scheme "first"). */
static int pretokenize(enc *E, const char *s0, size_t n0, int at_origin)
{
    const sf_tokenizer *t = E->t;
    tok_strs *cur = &E->a, *nxt = &E->b;
    tok_strs_clear(cur);
    if (n0 && tok_strs_push(cur, s0, n0)) return SF_ENOMEM;
    for (int k = 0; k < t->n_pres; k++) {
        const tok_pre *pr = &t->pres[k];
        tok_strs_clear(nxt);
        for (size_t i = 0; i < cur->n; i++) {
            const char *s = TOK_STR(cur, i);
            size_t n = cur->len[i];
            int rc = SF_OK;
            switch (pr->kind) {
            case TOK_PRE_SPLIT:
                rc = split_re(E, pr->re, s, n, pr->behavior, pr->invert, nxt);
                break;
            case TOK_PRE_DIGITS:
            case TOK_PRE_WSPLIT:
                rc = split_re(E, pr->re, s, n, pr->kind == TOK_PRE_WSPLIT ? TOK_SPLIT_REMOVED : pr->behavior, 0, nxt);
                break;
            case TOK_PRE_BYTELEVEL: {
                E->tmp.len = 0;
                if (pr->add_prefix_space && (n == 0 || s[0] != ' ') && tok_buf_put(&E->tmp, " ", 1)) return SF_ENOMEM;
                if (tok_buf_put(&E->tmp, s, n)) return SF_ENOMEM;
                size_t first = nxt->n;
                if (pr->re) rc = split_re(E, pr->re, E->tmp.p, E->tmp.len, TOK_SPLIT_ISOLATED, 0, nxt);
                else rc = tok_strs_push(nxt, E->tmp.p, E->tmp.len);
                if (rc) break;
                /* map the new pieces' bytes in place: rebuild them at the end of nxt */
                for (size_t j = first; j < nxt->n; j++) {
                    E->tmp.len = 0;
                    if (bytelevel_map(&E->tmp, TOK_STR(nxt, j), nxt->len[j])) return SF_ENOMEM;
                    size_t at = nxt->buf.len;
                    if (tok_buf_put(&nxt->buf, E->tmp.p, E->tmp.len)) return SF_ENOMEM;
                    nxt->off[j] = at;
                    nxt->len[j] = E->tmp.len;
                }
                break;
            }
            case TOK_PRE_METASPACE: {
                size_t rl = strlen(pr->replacement);
                E->tmp.len = 0;
                if (replace_all(&E->tmp, s, n, " ", 1, pr->replacement)) return SF_ENOMEM;
                int starts = E->tmp.len >= rl && !memcmp(E->tmp.p, pr->replacement, rl);
                int prepend = !starts && (pr->prepend_scheme == TOK_PREPEND_ALWAYS ||
                                          (pr->prepend_scheme == TOK_PREPEND_FIRST && at_origin && i == 0));
                if (prepend) {
                    tok_buf x = { 0 };
                    if (tok_buf_puts(&x, pr->replacement) || tok_buf_put(&x, E->tmp.p, E->tmp.len)) {
                        free(x.p);
                        return SF_ENOMEM;
                    }
                    free(E->tmp.p);
                    E->tmp = x;
                }
                if (!pr->split) {
                    rc = tok_strs_push(nxt, E->tmp.p, E->tmp.len);
                    break;
                }
                /* split before each replacement character (MergedWithNext) */
                size_t st = 0;
                for (size_t j = 1; j + rl <= E->tmp.len; j++) {
                    if (memcmp(E->tmp.p + j, pr->replacement, rl)) continue;
                    if ((rc = tok_strs_push(nxt, E->tmp.p + st, j - st))) break;
                    st = j;
                }
                if (!rc && E->tmp.len > st) rc = tok_strs_push(nxt, E->tmp.p + st, E->tmp.len - st);
                break;
            }
            }
            if (rc) return rc;
        }
        tok_strs *x = cur;
        cur = nxt;
        nxt = x;
    }
    if (cur != &E->a) { /* leave the result in E->a */
        tok_strs x = E->a;
        E->a = E->b;
        E->b = x;
    }
    return SF_OK;
}

/* ---- added tokens --------------------------------------------------------------------------- */
static int is_ws(const char *s, size_t n, int *adv)
{
    uint32_t c = tok_utf8_cp(s, n, adv);
    return c == ' ' || (c >= 9 && c <= 13) || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

static int is_word_byte(unsigned char c)
{
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

/* Finds the first added token of the given kind (normalized: matched in normalized text, or
 * not: matched in the raw input) in s[from..n): sets [*ms,*me) (with lstrip/rstrip applied,
 * never before lo) and returns its index, or -1. */
static int find_added(const sf_tokenizer *t, const char *s, size_t n, size_t from, size_t lo, int normalized, size_t *ms,
                      size_t *me)
{
    for (size_t p = from; p < n; p++) {
        unsigned c = (unsigned char)s[p];
        for (int i = t->first_added[c]; i < t->first_added[c + 1]; i++) {
            const tok_added *a = &t->added[i];
            if (!a->normalized != !normalized || a->len > n - p || memcmp(s + p, a->content, a->len)) continue;
            size_t st = p, en = p + a->len;
            if (a->single_word && ((st > 0 && is_word_byte((unsigned char)s[st - 1])) ||
                                   (en < n && is_word_byte((unsigned char)s[en]))))
                continue;
            if (a->lstrip) /* walk back over whitespace (ASCII and the common Unicode spaces) */
                while (st > lo) {
                    size_t q = st - 1;
                    while (q > lo && ((unsigned char)s[q] & 0xc0) == 0x80) q--;
                    int adv;
                    if (!is_ws(s + q, n - q, &adv)) break;
                    st = q;
                }
            if (a->rstrip) {
                int adv;
                while (en < n && is_ws(s + en, n - en, &adv)) en += (size_t)adv;
            }
            *ms = st;
            *me = en;
            return i;
        }
    }
    return -1;
}

static int encode_words(enc *E, const char *s, size_t n, int at_origin)
{
    int rc = pretokenize(E, s, n, at_origin);
    for (size_t i = 0; i < E->a.n && !rc; i++)
        rc = E->t->model == TOK_MODEL_SPM ? tok_spm_word(E->t, E->sc, TOK_STR(&E->a, i), E->a.len[i], &E->ids, &E->n, &E->cap)
                                          : tok_bpe_word(E->t, E->sc, TOK_STR(&E->a, i), E->a.len[i], &E->ids, &E->n, &E->cap);
    return rc;
}

/* A stretch of input between raw-matched added tokens: normalize it, then split it again by the
 * added tokens that match normalized text (HF AddedVocabulary's second pass), then words. */
static int encode_text(enc *E, const char *s, size_t n, int at_origin)
{
    if (!n) return SF_OK;
    int rc = normalize(E, s, n), ai;
    size_t seg = 0, ms, me, len = E->norm.len;
    const char *ns = E->norm.p;
    while (!rc && (ai = find_added(E->t, ns, len, seg, seg, 1, &ms, &me)) >= 0) {
        if (!(rc = encode_words(E, ns + seg, ms - seg, at_origin && seg == 0)))
            rc = tok_ids_push(&E->ids, &E->n, &E->cap, E->t->added[ai].id);
        seg = me;
    }
    if (!rc && seg < len) rc = encode_words(E, ns + seg, len - seg, at_origin && seg == 0);
    return rc;
}

int sf_tok_encode(const sf_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids, size_t *n_ids,
                  sf_error *err)
{
    enc E = { .t = t };
    int rc = SF_OK;
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return sf_err(err, SF_EINVAL, "sf_tok_encode: text is NULL");
    if (!text) text = "";
    size_t bad = tok_utf8_check(text, len);
    if (bad < len)
        return sf_err(err, SF_EINVAL, "input text is not valid UTF-8 at byte offset %zu (byte 0x%02x); send UTF-8 text",
                      bad, (unsigned char)text[bad]);
    if (!(E.md = pcre2_match_data_create(1, NULL)) || !(E.sc = tok_scratch_new())) {
        pcre2_match_data_free(E.md);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    if (add_special)
        for (int i = 0; i < t->n_post_pre && !rc; i++) rc = tok_ids_push(&E.ids, &E.n, &E.cap, t->post_pre[i]);
    size_t seg = 0, ms, me;
    int ai;
    while (!rc && seg <= len && (ai = find_added(t, text, len, seg, seg, 0, &ms, &me)) >= 0) {
        if ((rc = encode_text(&E, text + seg, ms - seg, seg == 0))) break;
        rc = tok_ids_push(&E.ids, &E.n, &E.cap, t->added[ai].id);
        seg = me;
    }
    if (!rc && seg < len) rc = encode_text(&E, text + seg, len - seg, seg == 0);
    if (add_special)
        for (int i = 0; i < t->n_post_post && !rc; i++) rc = tok_ids_push(&E.ids, &E.n, &E.cap, t->post_post[i]);
    if (rc) {
        sf_err(err, rc, rc == SF_ENOMEM ? "encoding %zu bytes: out of memory" : "encoding %zu bytes: regex matching failed", len);
        free(E.ids);
        E.ids = NULL;
        E.n = 0;
    }
    *ids = E.ids;
    *n_ids = E.n;
    pcre2_match_data_free(E.md);
    tok_scratch_free(E.sc);
    tok_strs_free(&E.a);
    tok_strs_free(&E.b);
    free(E.norm.p);
    free(E.tmp.p);
    return rc;
}
