/* tok_nfc.c — Unicode NFC for the tokenizer's NFC normalizer (Qwen2's tokenizer.json has one):
 * canonical decomposition, canonical ordering of combining marks, canonical composition
 * (UAX #15), with the tables in tok_nfc_tables.h. Text without a code point >= U+0300 is NFC
 * as it is and is copied straight through. Pure function; any thread. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"
#include "tok_nfc_tables.h"

enum { S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7, L_COUNT = 19, V_COUNT = 21, T_COUNT = 28,
       N_COUNT = V_COUNT * T_COUNT, S_COUNT = L_COUNT * N_COUNT };

static int ccc(uint32_t cp)
{
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = SF_ARRAY_LEN(nfc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_ccc[mid].lo) hi = mid;
        else if (cp > nfc_ccc[mid].hi) lo = mid + 1;
        else return nfc_ccc[mid].ccc;
    }
    return 0;
}

static int dec_find(uint32_t cp)
{
    size_t lo = 0, hi = SF_ARRAY_LEN(nfc_dec);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_dec[mid].cp) hi = mid;
        else if (cp > nfc_dec[mid].cp) lo = mid + 1;
        else return (int)mid;
    }
    return -1;
}

/* Composite of a + b, or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
    if (a >= L_BASE && a < L_BASE + L_COUNT && b >= V_BASE && b < V_BASE + V_COUNT)
        return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
    if (a >= S_BASE && a < S_BASE + S_COUNT && (a - S_BASE) % T_COUNT == 0 && b > T_BASE && b < T_BASE + T_COUNT)
        return a + (b - T_BASE);
    size_t lo = 0, hi = SF_ARRAY_LEN(nfc_comp);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < nfc_comp[mid].a || (a == nfc_comp[mid].a && b < nfc_comp[mid].b)) hi = mid;
        else if (a > nfc_comp[mid].a || b > nfc_comp[mid].b) lo = mid + 1;
        else return nfc_comp[mid].cp;
    }
    return 0;
}

typedef struct cps {
    uint32_t *v;
    size_t n, cap;
} cps;

static int cps_push(cps *c, uint32_t cp)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        uint32_t *p = realloc(c->v, cap * sizeof *p);
        if (!p) return SF_ENOMEM;
        c->v = p;
        c->cap = cap;
    }
    c->v[c->n++] = cp;
    return SF_OK;
}

/* Full canonical decomposition of cp (decompositions nest at most a few levels). */
static int decompose(cps *c, uint32_t cp, int depth)
{
    if (cp >= S_BASE && cp < S_BASE + S_COUNT) {
        uint32_t s = cp - S_BASE, t = s % T_COUNT;
        if (cps_push(c, L_BASE + s / N_COUNT) || cps_push(c, V_BASE + (s % N_COUNT) / T_COUNT)) return SF_ENOMEM;
        return t ? cps_push(c, T_BASE + t) : SF_OK;
    }
    int i = cp < 0xc0 || depth > 8 ? -1 : dec_find(cp);
    if (i < 0) return cps_push(c, cp);
    if (decompose(c, nfc_dec[i].a, depth + 1)) return SF_ENOMEM;
    return nfc_dec[i].b ? decompose(c, nfc_dec[i].b, depth + 1) : SF_OK;
}

int tok_nfc(tok_buf *out, const char *s, size_t n)
{
    size_t i = 0;
    for (; i < n; i++) /* lead bytes of U+0300 and above are >= 0xCC */
        if ((unsigned char)s[i] >= 0xcc) break;
    if (i == n) return tok_buf_put(out, s, n);
    cps c = { 0 };
    int rc = SF_OK;
    for (i = 0; i < n && !rc;) {
        int adv;
        uint32_t cp = tok_utf8_cp(s + i, n - i, &adv);
        rc = decompose(&c, cp, 0);
        i += (size_t)adv;
    }
    /* canonical ordering: stable insertion sort of each run of non-starters by class */
    for (size_t k = 1; k < c.n && !rc; k++) {
        int ck = ccc(c.v[k]);
        if (!ck) continue;
        uint32_t x = c.v[k];
        size_t j = k;
        while (j > 0 && ccc(c.v[j - 1]) > ck) {
            c.v[j] = c.v[j - 1];
            j--;
        }
        c.v[j] = x;
    }
    /* canonical composition */
    if (!rc && c.n) {
        size_t starter = 0, w = 1;
        int last = ccc(c.v[0]) ? 256 : 0; /* a leading non-starter blocks everything after it */
        for (size_t k = 1; k < c.n; k++) {
            uint32_t ch = c.v[k], comp = 0;
            int cc = ccc(ch);
            if (last < cc || last == 0) comp = compose(c.v[starter], ch);
            if (comp && (last < cc || last == 0)) {
                c.v[starter] = comp;
                continue;
            }
            if (cc == 0) starter = w;
            last = cc;
            c.v[w++] = ch;
        }
        c.n = w;
    }
    for (size_t k = 0; k < c.n && !rc; k++) rc = tok_utf8_put(out, c.v[k]);
    free(c.v);
    return rc;
}
