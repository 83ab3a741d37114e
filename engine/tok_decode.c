/* tok_decode.c — ids -> text through the tokenizer's decoder chain (Hugging Face `tokenizers`
 * semantics: ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace), and the streaming
 * detokenizer that only ever hands out whole UTF-8 characters. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

#define FFFD "\xef\xbf\xbd"

static int dec_bytelevel(tok_strs *in, tok_strs *out)
{
    tok_buf bytes = { 0 }, txt = { 0 };
    int rc = SF_OK;
    for (size_t i = 0; i < in->n && !rc; i++) {
        const char *s = TOK_STR(in, i);
        size_t n = in->len[i], start = bytes.len;
        for (size_t j = 0; j < n;) {
            int adv, b = tok_cp_to_byte(tok_utf8_cp(s + j, n - j, &adv));
            if (b < 0) { /* not a byte-level piece (e.g. an added token): its bytes as they are */
                bytes.len = start;
                rc = tok_buf_put(&bytes, s, n);
                break;
            }
            unsigned char c = (unsigned char)b;
            if ((rc = tok_buf_put(&bytes, &c, 1))) break;
            j += (size_t)adv;
        }
    }
    if (!rc) rc = tok_utf8_lossy(&txt, bytes.p ? bytes.p : "", bytes.len);
    if (!rc) rc = tok_strs_push(out, txt.p ? txt.p : "", txt.len);
    free(bytes.p);
    free(txt.p);
    return rc;
}

static int parse_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static int flush_bytes(tok_buf *pend, tok_strs *out)
{
    int rc = SF_OK;
    if (!pend->len) return SF_OK;
    if (tok_utf8_check(pend->p, pend->len) == pend->len) rc = tok_strs_push(out, pend->p, pend->len);
    else
        for (size_t k = 0; k < pend->len && !rc; k++) rc = tok_strs_push(out, FFFD, 3);
    pend->len = 0;
    return rc;
}

static int dec_bytefallback(tok_strs *in, tok_strs *out)
{
    tok_buf pend = { 0 };
    int rc = SF_OK;
    for (size_t i = 0; i < in->n && !rc; i++) {
        int b = parse_byte_token(TOK_STR(in, i), in->len[i]);
        if (b >= 0) {
            unsigned char c = (unsigned char)b;
            rc = tok_buf_put(&pend, &c, 1);
            continue;
        }
        if (!(rc = flush_bytes(&pend, out))) rc = tok_strs_push(out, TOK_STR(in, i), in->len[i]);
    }
    if (!rc) rc = flush_bytes(&pend, out);
    free(pend.p);
    return rc;
}

static int dec_step(const tok_dec *d, tok_strs *in, tok_strs *out, tok_buf *tmp)
{
    int rc = SF_OK;
    switch (d->kind) {
    case TOK_DEC_BYTELEVEL:
        return dec_bytelevel(in, out);
    case TOK_DEC_BYTEFALLBACK:
        return dec_bytefallback(in, out);
    case TOK_DEC_FUSE:
        return tok_strs_push(out, in->n ? TOK_STR(in, 0) : "", in->n ? in->buf.len - in->off[0] : 0);
    default:
        break;
    }
    for (size_t i = 0; i < in->n && !rc; i++) {
        const char *s = TOK_STR(in, i);
        size_t n = in->len[i];
        tmp->len = 0;
        if (d->kind == TOK_DEC_REPLACE) {
            size_t pl = strlen(d->a), bl = strlen(d->b), run = 0;
            for (size_t j = 0; j + pl <= n;) {
                if (memcmp(s + j, d->a, pl)) { j++; continue; }
                if (tok_buf_put(tmp, s + run, j - run) || tok_buf_put(tmp, d->b, bl)) return SF_ENOMEM;
                j += pl;
                run = j;
            }
            if (tok_buf_put(tmp, s + run, n - run)) return SF_ENOMEM;
        } else if (d->kind == TOK_DEC_STRIP) {
            size_t cl = strlen(d->a), st = 0, en = n;
            for (int k = 0; k < d->start && st + cl <= en && !memcmp(s + st, d->a, cl); k++) st += cl;
            for (int k = 0; k < d->stop && en >= st + cl && !memcmp(s + en - cl, d->a, cl); k++) en -= cl;
            if (tok_buf_put(tmp, s + st, en - st)) return SF_ENOMEM;
        } else if (d->kind == TOK_DEC_METASPACE) {
            /* every replacement char becomes a space, except in the first token where they vanish
             * (tokenizers' Metaspace::decode_chain) */
            size_t rl = strlen(d->replacement), run = 0;
            int drop = i == 0 && d->prepend_scheme != TOK_PREPEND_NEVER;
            for (size_t j = 0; j + rl <= n;) {
                if (memcmp(s + j, d->replacement, rl)) { j++; continue; }
                if (tok_buf_put(tmp, s + run, j - run) || (!drop && tok_buf_put(tmp, " ", 1))) return SF_ENOMEM;
                j += rl;
                run = j;
            }
            if (tok_buf_put(tmp, s + run, n - run)) return SF_ENOMEM;
        }
        rc = tok_strs_push(out, tmp->p ? tmp->p : "", tmp->len);
    }
    return rc;
}

/* Decodes ids into out (appended). */
static int decode_into(const sf_tokenizer *t, const int32_t *ids, size_t n, int skip_special, tok_buf *out, sf_error *err)
{
    tok_strs a = { 0 }, b = { 0 };
    tok_buf tmp = { 0 };
    int rc = SF_OK;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->pieces[id]) {
            rc = sf_err(err, SF_EINVAL, "token id %d (position %zu) is not in the vocabulary (0..%d)", id, i, t->n_vocab - 1);
            goto cleanup;
        }
        if (skip_special && t->is_special[id]) continue;
        if ((rc = tok_strs_push(&a, t->pieces[id], t->piece_len[id]))) goto oom;
    }
    if (!t->has_decoder) { /* tokenizers joins the pieces with spaces */
        for (size_t i = 0; i < a.n; i++)
            if ((i && tok_buf_put(out, " ", 1)) || tok_buf_put(out, TOK_STR(&a, i), a.len[i])) goto oom;
        goto cleanup;
    }
    tok_strs *cur = &a, *nxt = &b;
    for (int k = 0; k < t->n_decs; k++) {
        tok_strs_clear(nxt);
        if ((rc = dec_step(&t->decs[k], cur, nxt, &tmp))) goto oom;
        tok_strs *x = cur;
        cur = nxt;
        nxt = x;
    }
    for (size_t i = 0; i < cur->n; i++)
        if (tok_buf_put(out, TOK_STR(cur, i), cur->len[i])) goto oom;
    goto cleanup;
oom:
    rc = sf_err(err, SF_ENOMEM, "decoding %zu tokens: out of memory", n);
cleanup:
    tok_strs_free(&a);
    tok_strs_free(&b);
    free(tmp.p);
    return rc;
}

int sf_tok_decode(const sf_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text, sf_error *err)
{
    tok_buf out = { 0 };
    *text = NULL;
    int rc = decode_into(t, ids, n, skip_special, &out, err);
    if (!rc && tok_buf_put(&out, "", 0)) rc = sf_err(err, SF_ENOMEM, "out of memory");
    if (rc) {
        free(out.p);
        return rc;
    }
    *text = out.p;
    return SF_OK;
}

/* ---- streaming -------------------------------------------------------------------------------
 * The window scheme of text-generation-inference: decode ids[prefix_off..read_off) (already
 * returned) and ids[prefix_off..n); the difference is new text, released once it does not end in
 * U+FFFD (an incomplete UTF-8 sequence from byte tokens). Keeping the previous tokens as context
 * makes context-sensitive decoders (the leading-space Strip, Metaspace) see the same first token
 * both times, so only the start of the whole stream is stripped. The work per token is bounded:
 * the window only spans the last release and the tokens pending since. */
void sf_detok_init(sf_detok *d, const sf_tokenizer *t, int skip_special)
{
    memset(d, 0, sizeof *d);
    d->t = t;
    d->skip_special = skip_special;
}

static int emit(char **out, size_t *out_len, const char *s, size_t n)
{
    char *p = realloc(*out, *out_len + n + 1);
    if (!p) return SF_ENOMEM;
    memcpy(p + *out_len, s, n);
    *out_len += n;
    p[*out_len] = 0;
    *out = p;
    return SF_OK;
}

/* Text ending in U+FFFD is held back while it may still be an incomplete UTF-8 sequence: at
 * most 3 trailing U+FFFD (one per byte with ByteFallback, one per sequence with ByteLevel).
 * Past that, or past DETOK_MAX_PENDING held tokens, it is released as it is, which keeps the
 * work per token bounded whatever ids come in. */
#define DETOK_MAX_PENDING 64

static int trailing_fffd(const char *s, size_t n)
{
    int k = 0;
    while (n >= 3 && !memcmp(s + n - 3, FFFD, 3)) {
        n -= 3;
        k++;
    }
    return k;
}

static int detok_step(sf_detok *d, int final, char **out, size_t *out_len)
{
    tok_buf pre = { 0 }, full = { 0 };
    int rc;
    size_t pending = d->n - d->read_off;
    if ((rc = decode_into(d->t, d->ids + d->prefix_off, d->read_off - d->prefix_off, d->skip_special, &pre, NULL)) ||
        (rc = decode_into(d->t, d->ids + d->prefix_off, d->n - d->prefix_off, d->skip_special, &full, NULL)))
        goto cleanup;
    const char *add = full.p + pre.len;
    size_t add_len = full.len - pre.len;
    if (full.len < pre.len || (pre.len && memcmp(full.p, pre.p, pre.len))) {
        /* The new tokens changed text already released: ByteFallback turns a whole run of byte
         * tokens into U+FFFDs once any byte in it is invalid. What is out stays out; the new
         * tokens are decoded on their own, so the stream stays whole UTF-8 (and differs from
         * the full decode only in such invalid byte runs). */
        pre.len = 0;
        full.len = 0;
        if ((rc = decode_into(d->t, d->ids + d->read_off, pending, d->skip_special, &full, NULL))) goto cleanup;
        d->prefix_off = d->read_off;
        add = full.p;
        add_len = full.len;
    }
    int k = trailing_fffd(add, add_len);
    int hold = k >= 1 && k <= 3 && pending < DETOK_MAX_PENDING;
    if (add_len > 0 && (final || !hold)) {
        if ((rc = emit(out, out_len, add, add_len))) goto cleanup;
        d->emitted += add_len;
        d->prefix_off = d->read_off;
        d->read_off = d->n;
    }
cleanup:
    free(pre.p);
    free(full.p);
    return rc;
}

int sf_detok_push(sf_detok *d, int32_t id, char **out, size_t *out_len)
{
    if (id < 0 || id >= d->t->n_vocab || !d->t->pieces[id]) return SF_EINVAL;
    /* a skipped special token decodes to nothing and changes nothing around it */
    if (d->skip_special && d->t->is_special[id]) return SF_OK;
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 64;
        int32_t *p = realloc(d->ids, c * sizeof *p);
        if (!p) return SF_ENOMEM;
        d->ids = p;
        d->cap = c;
    }
    d->ids[d->n++] = id;
    return detok_step(d, 0, out, out_len);
}

int sf_detok_finish(sf_detok *d, char **out, size_t *out_len)
{
    if (d->read_off == d->n) return SF_OK;
    return detok_step(d, 1, out, out_len);
}

void sf_detok_free(sf_detok *d)
{
    free(d->ids);
    d->ids = NULL;
    d->n = d->cap = 0;
}
