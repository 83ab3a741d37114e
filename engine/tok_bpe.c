/* tok_bpe.c — the two subword models, applied to one pre-tokenized word.
 *
 *  BPE (Hugging Face `tokenizers` BPE): characters -> ids (byte fallback <0xNN> or unk for
 *  characters missing from the vocab), then repeatedly apply the best-ranked merge (lowest rank,
 *  leftmost on ties) through a binary heap of candidate pairs: O(n log n) per word.
 *
 *  SPM (llama.cpp's SentencePiece tokenizer for GGUF "llama" vocabularies): characters, then
 *  repeatedly merge the adjacent pair whose concatenation is the highest-scoring vocab piece
 *  (leftmost on ties); what stays unknown becomes byte tokens.
 *
 * Both are pure functions of the (immutable) tokenizer: scratch memory is per call. */
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

int tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, c * sizeof *p);
        if (!p) return SF_ENOMEM;
        *ids = p;
        *cap = c;
    }
    (*ids)[(*n)++] = id;
    return SF_OK;
}

struct tok_scratch {
    struct sym *s;
    size_t cap;
    struct cand *h;
    size_t hcap;
};

typedef struct sym {
    int32_t id;
    int32_t prev, next;       /* -1 at the ends */
    uint32_t start, len;      /* bytes of the word (SPM); len 0 = merged away */
} sym;

typedef struct cand {
    float score;              /* SPM: higher first. BPE: -rank */
    int32_t left, right;      /* symbol indices */
    int32_t lid, rid;         /* BPE: ids at push time (stale check) */
    uint32_t size;            /* SPM: bytes of the pair at push time (stale check) */
    int32_t merged;           /* BPE: id of the merged token */
} cand;

typedef struct heap {
    cand *a;
    size_t n, cap;
} heap;

tok_scratch *tok_scratch_new(void) { return calloc(1, sizeof(tok_scratch)); }

void tok_scratch_free(tok_scratch *sc)
{
    if (!sc) return;
    free(sc->s);
    free(sc->h);
    free(sc);
}

/* a before b: higher score, then leftmost */
static int before(const cand *a, const cand *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static int heap_push(heap *h, cand c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 32;
        cand *p = realloc(h->a, cap * sizeof *p);
        if (!p) return SF_ENOMEM;
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(&c, &h->a[up])) break;
        h->a[i] = h->a[up];
        i = up;
    }
    h->a[i] = c;
    return SF_OK;
}

static cand heap_pop(heap *h)
{
    cand top = h->a[0], last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, best = i;
        const cand *bc = &last;
        if (l < h->n && before(&h->a[l], bc)) { best = l; bc = &h->a[l]; }
        if (r < h->n && before(&h->a[r], bc)) best = r;
        if (best == i) break;
        h->a[i] = h->a[best];
        i = best;
    }
    if (h->n) h->a[i] = last;
    return top;
}

static int sym_push(sym **s, size_t *n, size_t *cap, sym v)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 32;
        sym *p = realloc(*s, c * sizeof *p);
        if (!p) return SF_ENOMEM;
        *s = p;
        *cap = c;
    }
    (*s)[(*n)++] = v;
    return SF_OK;
}

static int bpe_try(const sf_tokenizer *t, heap *h, const sym *s, int32_t l)
{
    if (l < 0 || s[l].next < 0) return SF_OK;
    int32_t r = s[l].next;
    const tok_merge *m = tok_mergemap_get(&t->merges, s[l].id, s[r].id);
    if (!m) return SF_OK;
    return heap_push(h, (cand){ .score = -(float)m->rank, .left = l, .right = r, .lid = s[l].id, .rid = s[r].id, .merged = m->id });
}

int tok_bpe_word(const sf_tokenizer *t, tok_scratch *sc, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
    sym *s = sc->s;
    size_t ns = 0, scap = sc->cap;
    heap h = { sc->h, 0, sc->hcap };
    int rc = SF_OK;
    int32_t direct;
    if (t->ignore_merges && (direct = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, w, n)) >= 0)
        return tok_ids_push(ids, nids, cap, direct);
    if (n == 0) return SF_OK;
    int last_unk = 0;
    for (size_t i = 0; i < n;) {
        int adv;
        tok_utf8_cp(w + i, n - i, &adv);
        int32_t id = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, w + i, (size_t)adv);
        if (id >= 0) {
            if ((rc = sym_push(&s, &ns, &scap, (sym){ .id = id }))) goto cleanup;
            last_unk = 0;
        } else {
            int all = t->byte_fallback;
            for (int k = 0; all && k < adv; k++) all = t->byte_id[(unsigned char)w[i + k]] >= 0;
            if (all) {
                for (int k = 0; k < adv; k++)
                    if ((rc = sym_push(&s, &ns, &scap, (sym){ .id = t->byte_id[(unsigned char)w[i + k]] }))) goto cleanup;
                last_unk = 0;
            } else if (t->unk_id >= 0) {
                if (!(t->fuse_unk && last_unk) && (rc = sym_push(&s, &ns, &scap, (sym){ .id = t->unk_id }))) goto cleanup;
                last_unk = 1;
            } /* no unk token: the character is dropped, as HF does */
        }
        i += (size_t)adv;
    }
    for (size_t i = 0; i < ns; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < ns; i++)
        if ((rc = bpe_try(t, &h, s, (int32_t)i))) goto cleanup;
    while (h.n) {
        cand c = heap_pop(&h);
        sym *L = &s[c.left], *R = &s[c.right];
        if (L->len == UINT32_MAX || R->len == UINT32_MAX || L->next != c.right || L->id != c.lid || R->id != c.rid) continue;
        L->id = c.merged;
        R->len = UINT32_MAX; /* dead */
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = c.left;
        if ((rc = bpe_try(t, &h, s, L->prev)) || (rc = bpe_try(t, &h, s, c.left))) goto cleanup;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = s[i].next)
        if ((rc = tok_ids_push(ids, nids, cap, s[i].id))) goto cleanup;
cleanup:
    sc->s = s; /* keep the (possibly grown) buffers for the next word */
    sc->cap = scap;
    sc->h = h.a;
    sc->hcap = h.cap;
    return rc;
}

/* ---- SPM ------------------------------------------------------------------------------------ */
/* Pieces SentencePiece never produces from text: control, unknown, user-defined (matched
 * before the model), unused and byte tokens. */
static int spm_allowed(const sf_tokenizer *t, int32_t id)
{
    int ty = t->ptype ? t->ptype[id] : 1;
    return ty == 0 || ty == 1;
}

static int spm_try(const sf_tokenizer *t, heap *h, const sym *s, const char *w, int32_t l)
{
    if (l < 0 || s[l].next < 0) return SF_OK;
    int32_t r = s[l].next;
    uint32_t size = s[l].len + s[r].len;
    int32_t id = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, w + s[l].start, size);
    if (id < 0 || !spm_allowed(t, id)) return SF_OK;
    return heap_push(h, (cand){ .score = t->scores[id], .left = l, .right = r, .size = size });
}

int tok_spm_word(const sf_tokenizer *t, tok_scratch *sc, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
    sym *s = sc->s;
    size_t ns = 0, scap = sc->cap;
    heap h = { sc->h, 0, sc->hcap };
    int rc = SF_OK;
    for (size_t i = 0; i < n;) {
        int adv;
        tok_utf8_cp(w + i, n - i, &adv);
        if ((rc = sym_push(&s, &ns, &scap, (sym){ .start = (uint32_t)i, .len = (uint32_t)adv }))) goto cleanup;
        i += (size_t)adv;
    }
    for (size_t i = 0; i < ns; i++) {
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < ns; i++)
        if ((rc = spm_try(t, &h, s, w, (int32_t)i))) goto cleanup;
    while (h.n) {
        cand c = heap_pop(&h);
        sym *L = &s[c.left], *R = &s[c.right];
        if (!L->len || !R->len || L->next != c.right || L->len + R->len != c.size) continue;
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        if (R->next >= 0) s[R->next].prev = c.left;
        if ((rc = spm_try(t, &h, s, w, L->prev)) || (rc = spm_try(t, &h, s, w, c.left))) goto cleanup;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = s[i].next) {
        int32_t id = tok_strmap_get(&t->vocab, t->pieces, t->piece_len, w + s[i].start, s[i].len);
        if (id >= 0 && spm_allowed(t, id)) {
            if ((rc = tok_ids_push(ids, nids, cap, id))) goto cleanup;
            continue;
        }
        for (uint32_t k = 0; k < s[i].len; k++) { /* byte fallback, else unk */
            int32_t b = t->byte_id[(unsigned char)w[s[i].start + k]];
            if (b < 0) b = t->unk_id;
            if (b >= 0 && (rc = tok_ids_push(ids, nids, cap, b))) goto cleanup;
            if (b == t->unk_id) break; /* one unk per unknown character */
        }
    }
cleanup:
    sc->s = s; /* keep the (possibly grown) buffers for the next word */
    sc->cap = scap;
    sc->h = h.a;
    sc->hcap = h.cap;
    return rc;
}
