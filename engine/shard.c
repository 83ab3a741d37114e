/* shard.c — slicing a model's weight views for one tensor-parallel rank (see shard.h). */
#include "shard.h"

#include <stdlib.h>
#include <string.h>

int sf_shard_check(const sf_model_config *c, int size, sf_error *err)
{
    if (size < 1)
        return sf_err(err, SF_EINVAL, "tensor-parallel size %d: it must be at least 1", size);
    if (c->n_heads % size)
        return sf_err(err, SF_EINVAL, "tensor-parallel size %d does not divide the model's %d attention heads; "
                      "use a size that does (a divisor of %d)", size, c->n_heads, c->n_heads);
    if (c->n_kv_heads % size && size % c->n_kv_heads)
        return sf_err(err, SF_EINVAL, "tensor-parallel size %d and the model's %d kv heads: one must divide the "
                      "other (kv heads are split, or replicated when fewer than ranks)", size, c->n_kv_heads);
    if (c->intermediate < size)
        return sf_err(err, SF_EINVAL, "tensor-parallel size %d is larger than the FFN width %d", size, c->intermediate);
    return SF_OK;
}

static size_t row_pitch(const sf_view *v)
{
    return sf_dtype_bytes(v->dtype, v->stride ? v->stride : v->cols);
}

/* rows [r0, r0 + n) of v */
static sf_view rows_of(const sf_view *v, int64_t r0, int64_t n)
{
    sf_view o = *v;
    o.data = (const char *)v->data + (size_t)r0 * row_pitch(v);
    o.rows = n;
    return o;
}

/* columns [c0, c0 + n) of v: a strided view */
static int cols_of(const sf_view *v, int64_t c0, int64_t n, const char *name, int layer, sf_view *o, sf_error *err)
{
    int blk = sf_dtype_block(v->dtype);
    if (c0 % blk || n % blk)
        return sf_err(err, SF_EUNSUPPORTED, "tensor parallelism: %s of layer %d is %s and would be split at column "
                      "%lld, inside a %d-block; choose a tensor-parallel size that splits it in whole blocks",
                      name, layer, sf_dtype_name(v->dtype), (long long)c0, blk);
    *o = *v;
    o->data = (const char *)v->data + sf_dtype_bytes(v->dtype, c0);
    o->cols = n;
    o->stride = v->stride ? v->stride : v->cols;
    return SF_OK;
}

/* elements [c0, c0 + n) of a bias vector (stored [1, N] or [N, 1]) */
static sf_view vec_part(const sf_view *v, int64_t c0, int64_t n)
{
    sf_view o = *v;
    if (!v->data) return o;
    o.data = (const char *)v->data + sf_dtype_bytes(v->dtype, c0);
    o.rows = 1;
    o.cols = n;
    o.stride = 0;
    return o;
}

/* [lo, hi) of n split `size` ways in units of `align` (n must be a multiple of align). */
static void split(int64_t n, int rank, int size, int align, int *lo, int *hi)
{
    int64_t units = n / align;
    *lo = (int)(units * rank / size * align);
    *hi = (int)(units * (rank + 1) / size * align);
}

void sf_shard_free(sf_shard *s)
{
    if (!s) return;
    free(s->m.layers);
    free((void *)s->lm_pad.data);
    memset(s, 0, sizeof *s);
}

int sf_shard_make(const sf_model *full, int rank, int size, sf_shard *s, sf_error *err)
{
    memset(s, 0, sizeof *s);
    const sf_model_config *c = &full->cfg;
    int rc = sf_shard_check(c, size, err);
    if (rc) return rc;
    if (rank < 0 || rank >= size) return sf_err(err, SF_EINVAL, "tensor parallelism: rank %d of %d", rank, size);
    s->rank = rank;
    s->size = size;
    s->m = *full;
    s->m.maps = NULL;
    s->m.n_maps = 0;
    s->m.owned = NULL;
    s->m.n_owned = 0;
    s->m.layers = calloc((size_t)c->n_layers, sizeof *s->m.layers);
    if (!s->m.layers) return sf_err(err, SF_ENOMEM, "tensor parallelism: out of memory");

    int hd = c->head_dim, H = c->n_heads / size, Hkv;
    s->q_head0 = rank * H;
    if (c->n_kv_heads >= size) {
        Hkv = c->n_kv_heads / size;
        s->kv_head0 = rank * Hkv;
    } else { /* replicated: ranks [k * size/Hkv, (k+1) * size/Hkv) hold kv head k */
        Hkv = 1;
        s->kv_head0 = rank / (size / c->n_kv_heads);
    }
    int align = 1; /* block-format down projections split in whole blocks (32 or 256) */
    for (int l = 0; l < c->n_layers; l++) align = SF_MAX(align, sf_dtype_block(full->layers[l].wdown.dtype));
    if (c->intermediate % align) {
        sf_shard_free(s);
        return sf_err(err, SF_EUNSUPPORTED, "tensor parallelism: FFN width %d is not a multiple of %d, which the "
                      "down projections' blocks need to split", c->intermediate, align);
    }
    split(c->intermediate, rank, size, align, &s->ffn_lo, &s->ffn_hi);
    if (s->ffn_hi <= s->ffn_lo) {
        sf_shard_free(s);
        return sf_err(err, SF_EINVAL, "tensor parallelism: rank %d of %d gets no FFN columns (width %d); use fewer "
                      "ranks", rank, size, c->intermediate);
    }
    int F = s->ffn_hi - s->ffn_lo;
    sf_model_config *lc = &s->m.cfg;
    lc->n_heads = H;
    lc->n_kv_heads = Hkv;
    lc->intermediate = F;
    lc->tie_embeddings = 0; /* the lm_head slice is its own weight */

    for (int l = 0; l < c->n_layers; l++) {
        const sf_layer_w *w = &full->layers[l];
        sf_layer_w *o = &s->m.layers[l];
        *o = *w;
        o->wq = rows_of(&w->wq, (int64_t)s->q_head0 * hd, (int64_t)H * hd);
        o->wk = rows_of(&w->wk, (int64_t)s->kv_head0 * hd, (int64_t)Hkv * hd);
        o->wv = rows_of(&w->wv, (int64_t)s->kv_head0 * hd, (int64_t)Hkv * hd);
        o->bq = vec_part(&w->bq, (int64_t)s->q_head0 * hd, (int64_t)H * hd);
        o->bk = vec_part(&w->bk, (int64_t)s->kv_head0 * hd, (int64_t)Hkv * hd);
        o->bv = vec_part(&w->bv, (int64_t)s->kv_head0 * hd, (int64_t)Hkv * hd);
        o->wgate = rows_of(&w->wgate, s->ffn_lo, F);
        o->wup = rows_of(&w->wup, s->ffn_lo, F);
        if ((rc = cols_of(&w->wo, (int64_t)s->q_head0 * hd, (int64_t)H * hd, "o_proj", l, &o->wo, err)) ||
            (rc = cols_of(&w->wdown, s->ffn_lo, F, "down_proj", l, &o->wdown, err))) {
            sf_shard_free(s);
            return rc;
        }
    }

    /* vocabulary-parallel lm_head (a tied head slices the embedding) */
    const sf_view *lm = full->lm_head.data && !c->tie_embeddings ? &full->lm_head : &full->tok_embd;
    int V = c->vocab_size;
    s->vocab_pad = (V + size - 1) / size;
    s->vocab_lo = SF_MIN(V, rank * s->vocab_pad);
    s->vocab_hi = SF_MIN(V, (rank + 1) * s->vocab_pad);
    int real = s->vocab_hi - s->vocab_lo, pad = s->vocab_pad - real;
    s->m.lm_head = rows_of(lm, s->vocab_lo, real);
    if (pad > 0) {
        if (lm->cols % sf_dtype_block(lm->dtype)) {
            sf_shard_free(s);
            return sf_err(err, SF_EFORMAT, "tensor parallelism: %s lm_head with %lld columns", sf_dtype_name(lm->dtype),
                          (long long)lm->cols);
        }
        void *z = calloc(1, sf_dtype_bytes(lm->dtype, (int64_t)pad * lm->cols) + 1);
        if (!z) {
            sf_shard_free(s);
            return sf_err(err, SF_ENOMEM, "tensor parallelism: out of memory for %d padding rows", pad);
        }
        s->lm_pad = (sf_view){ z, lm->dtype, pad, lm->cols, 0 };
    }
    return SF_OK;
}
