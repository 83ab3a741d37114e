/* tok_util.c — buffers, hash maps, UTF-8 helpers and the GPT-2 byte<->unicode table used by
 * the tokenizer. No global mutable state: the byte table is a constant. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

/* ---- buffers ------------------------------------------------------------------------------- */
int tok_buf_put(tok_buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return SF_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return SF_OK;
}

int tok_strs_push(tok_strs *l, const char *s, size_t n)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        size_t *off = realloc(l->off, cap * sizeof *off);
        if (!off) return SF_ENOMEM;
        l->off = off;
        size_t *len = realloc(l->len, cap * sizeof *len);
        if (!len) return SF_ENOMEM;
        l->len = len;
        l->cap = cap;
    }
    size_t at = l->buf.len;
    /* s must not point into l->buf (it may move) */
    if (tok_buf_put(&l->buf, s, n)) return SF_ENOMEM;
    l->off[l->n] = at;
    l->len[l->n] = n;
    l->n++;
    return SF_OK;
}

void tok_strs_clear(tok_strs *l)
{
    l->n = 0;
    l->buf.len = 0;
}

void tok_strs_free(tok_strs *l)
{
    free(l->buf.p);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

/* ---- hash maps ------------------------------------------------------------------------------ */
static uint32_t hash_bytes(const char *s, size_t n)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h ^ (h >> 15);
}

static uint32_t pow2_for(size_t n)
{
    uint32_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
}

int tok_strmap_init(tok_strmap *m, size_t n_keys)
{
    uint32_t cap = pow2_for(n_keys);
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return SF_ENOMEM;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = cap - 1;
    return SF_OK;
}

void tok_strmap_put(tok_strmap *m, char *const *pieces, const uint32_t *lens, int32_t id)
{
    const char *s = pieces[id];
    size_t n = lens[id];
    for (uint32_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0) { m->slot[i] = id; return; }
        if (lens[o] == n && !memcmp(pieces[o], s, n)) return;
    }
}

int32_t tok_strmap_get(const tok_strmap *m, char *const *pieces, const uint32_t *lens, const char *s, size_t n)
{
    if (!m->slot) return -1;
    for (uint32_t i = hash_bytes(s, n) & m->mask;; i = (i + 1) & m->mask) {
        int32_t o = m->slot[i];
        if (o < 0) return -1;
        if (lens[o] == n && !memcmp(pieces[o], s, n)) return o;
    }
}

void tok_strmap_free(tok_strmap *m)
{
    free(m->slot);
    m->slot = NULL;
}

static uint32_t hash_u64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (uint32_t)k;
}

int tok_mergemap_init(tok_mergemap *m, size_t n_keys)
{
    uint32_t cap = pow2_for(n_keys);
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot) return SF_ENOMEM;
    for (uint32_t i = 0; i < cap; i++) m->slot[i].key = UINT64_MAX;
    m->mask = cap - 1;
    return SF_OK;
}

void tok_mergemap_put(tok_mergemap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = hash_u64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slot[i].key == UINT64_MAX) {
            m->slot[i] = (tok_merge){ k, rank, id };
            return;
        }
        if (m->slot[i].key == k) return; /* first (best-ranked) merge wins, as in HF */
    }
}

const tok_merge *tok_mergemap_get(const tok_mergemap *m, int32_t a, int32_t b)
{
    if (!m->slot) return NULL;
    uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = hash_u64(k) & m->mask;; i = (i + 1) & m->mask) {
        if (m->slot[i].key == k) return &m->slot[i];
        if (m->slot[i].key == UINT64_MAX) return NULL;
    }
}

void tok_mergemap_free(tok_mergemap *m)
{
    free(m->slot);
    m->slot = NULL;
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */
int tok_utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xc2) return 0;
    if (c < 0xe0) return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c < 0xf0) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
        if (c == 0xe0 && s[1] < 0xa0) return 0;   /* overlong */
        if (c == 0xed && s[1] >= 0xa0) return 0;  /* surrogate */
        return 3;
    }
    if (c < 0xf5) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80) return 0;
        if (c == 0xf0 && s[1] < 0x90) return 0;   /* overlong */
        if (c == 0xf4 && s[1] >= 0x90) return 0;  /* > U+10FFFF */
        return 4;
    }
    return 0;
}

size_t tok_utf8_check(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int l = tok_utf8_len(u + i, n - i);
        if (!l) return i;
        i += (size_t)l;
    }
    return n;
}

/* Length of the longest prefix of s that could start a valid sequence (the "maximal subpart"). */
static size_t maximal_subpart(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c < 0xe0) need = 1;
    else if (c >= 0xe0 && c < 0xf0) { need = 2; if (c == 0xe0) lo = 0xa0; if (c == 0xed) hi = 0x9f; }
    else if (c >= 0xf0 && c < 0xf5) { need = 3; if (c == 0xf0) lo = 0x90; if (c == 0xf4) hi = 0x8f; }
    else return 1;
    size_t i = 1;
    for (int k = 0; k < need && i < n; k++, i++) {
        if (s[i] < lo || s[i] > hi) break;
        lo = 0x80; hi = 0xbf;
    }
    return i;
}

int tok_utf8_lossy(tok_buf *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    while (i < n) {
        int l = u[i] < 0x80 ? 1 : tok_utf8_len(u + i, n - i);
        if (l) { i += (size_t)l; continue; }
        if (tok_buf_put(out, s + run, i - run) || tok_buf_put(out, "\xef\xbf\xbd", 3)) return SF_ENOMEM;
        i += maximal_subpart(u + i, n - i);
        run = i;
    }
    return tok_buf_put(out, s + run, n - run);
}

uint32_t tok_utf8_cp(const char *s, size_t n, int *adv)
{
    const unsigned char *u = (const unsigned char *)s;
    int l = u[0] < 0x80 ? 1 : tok_utf8_len(u, n);
    if (l <= 1) { *adv = 1; return u[0]; }
    *adv = l;
    if (l == 2) return (uint32_t)(u[0] & 0x1f) << 6 | (u[1] & 0x3f);
    if (l == 3) return (uint32_t)(u[0] & 0x0f) << 12 | (uint32_t)(u[1] & 0x3f) << 6 | (u[2] & 0x3f);
    return (uint32_t)(u[0] & 0x07) << 18 | (uint32_t)(u[1] & 0x3f) << 12 | (uint32_t)(u[2] & 0x3f) << 6 | (u[3] & 0x3f);
}

int tok_utf8_enc(uint32_t cp, unsigned char *c)
{
    if (cp < 0x80) { c[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { c[0] = (unsigned char)(0xc0 | cp >> 6); c[1] = (unsigned char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        c[0] = (unsigned char)(0xe0 | cp >> 12); c[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        c[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    c[0] = (unsigned char)(0xf0 | cp >> 18); c[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    c[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f)); c[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

int tok_utf8_put(tok_buf *b, uint32_t cp)
{
    unsigned char c[4];
    return tok_buf_put(b, (const char *)c, (size_t)tok_utf8_enc(cp, c));
}

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
#define R4(b) b, b + 1, b + 2, b + 3
#define R16(b) R4(b), R4(b + 4), R4(b + 8), R4(b + 12)
const uint16_t tok_byte_to_cp[256] = {
    /* 0x00-0x20 -> U+0100..U+0120 */
    R16(0x100), R16(0x110), 0x120,
    /* 0x21-0x7e printable ASCII */
    0x21, 0x22, 0x23, R4(0x24), R4(0x28), R4(0x2c), R16(0x30), R16(0x40), R16(0x50), R16(0x60),
    R4(0x70), R4(0x74), R4(0x78), 0x7c, 0x7d, 0x7e,
    /* 0x7f-0xa0 -> U+0121..U+0142 */
    0x121, 0x122, 0x123, R4(0x124), R4(0x128), R4(0x12c), R16(0x130), 0x140, 0x141, 0x142,
    /* 0xa1-0xac */
    0xa1, 0xa2, 0xa3, R4(0xa4), R4(0xa8), 0xac,
    /* 0xad -> U+0143 */
    0x143,
    /* 0xae-0xff */
    0xae, 0xaf, R16(0xb0), R16(0xc0), R16(0xd0), R16(0xe0), R16(0xf0),
};

int tok_cp_to_byte(uint32_t cp)
{
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff)) return (int)cp;
    if (cp >= 0x100 && cp <= 0x120) return (int)(cp - 0x100);
    if (cp >= 0x121 && cp <= 0x142) return (int)(cp - 0x121 + 0x7f);
    if (cp == 0x143) return 0xad;
    return -1;
}
