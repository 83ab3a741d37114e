/* forward.c — the Llama-family forward pass over the backend table (see forward.h).
 *
 * Weights: QKV fused into one 3-part weight (with Qwen2's biases), gate/up into one 2-part
 * weight, a tied lm_head shares the embedding's weight object. Activations live in backend
 * buffers sized for max_tokens rows; the residual stream h is updated by the fused
 * add-then-norm of the next rmsnorm, so each layer costs two norms and no separate adds.
 * Backends with the optional fused ops (norm_qkv_rope, norm_matmul, matmul_add) run each layer
 * as norm+QKV+RoPE+KV append, attention, O+residual, norm+gate/up+SiLU·mul, down+residual.
 * Under tensor parallelism too: the row-parallel projections (O, down) write into h itself —
 * rank 0 adds its partial product to h, the other ranks overwrite h with theirs — and the
 * all-reduce of h then leaves h + the whole product on every rank ($SEMFLOW_TP_FUSED=0: the
 * plain ops with the all-reduce before the add). Above one row (and always with the plain ops)
 * each all-reduce is one op with the residual add and the norm after it
 * (sf_comm_all_reduce_norm_buf), which leaves the next norm's output in x for a plain matmul. */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../hal/comm.h"
#include "../kernels/sample_draw.h"
#include "shard.h"

typedef struct fw_layer {
    sf_weight *attn_norm, *wqkv, *wo, *ffn_norm, *wgu, *wdown;
} fw_layer;

struct sf_forward {
    sf_backend *b;
    const sf_model *m;
    int max_tokens, max_logits;
    sf_weight *emb, *out_norm, *lm;
    fw_layer *layers;
    float *inv_freq;
    sf_rope rope;
    /* activations */
    sf_buf *h, *x, *qkv, *att, *ao, *gu, *act, *mo, *sel, *logits;
    /* tensor parallelism (NULL without): this rank's shard, the communicator, the logit
     * slices of all ranks [size * max_logits, vocab_pad] and their host copy */
    const sf_shard *shard;
    sf_comm *comm;
    int tp_fused; /* the fused ops under tensor parallelism (see the top) */
    sf_buf *gathered;
    float *gather_host;
    sf_buf *rows_full; /* with a sampler: [max_logits, size * vocab_pad], whole logit rows */
    int launching;     /* step(): queue the draw with sample_start (sf_forward_launch_sample) */
    int draw_pending;  /* a draw queued by sample_start waits for sf_forward_wait_sample */
    int gather_pending; /* launching under TP: the logits' gather was queued without waiting for it */
    /* sf_forward_defer: draws stay queued on the backend until sf_forward_take; for each, in
     * order, whether a communicator mark (the gather's wait) goes with it */
    int deferred;
    unsigned char dq[SF_COMM_MARKS];
    int dq_r, dq_n;
};

#define OPS(f) ((f)->b->ops)

static int check_view(const sf_view *v, int64_t rows, int64_t cols, const char *name, int layer, sf_error *err)
{
    char where[32] = "";
    if (layer >= 0) snprintf(where, sizeof where, " of layer %d", layer);
    if (!v->data)
        return sf_err(err, SF_ENOTFOUND, "tensor %s%s is missing from the model", name, where);
    if (v->rows * v->cols != rows * cols || (v->rows != rows && !(rows == 1 || cols == 1)))
        return sf_err(err, SF_EFORMAT, "tensor %s%s has shape [%lld, %lld], the config needs [%lld, %lld]",
                      name, where, (long long)v->rows, (long long)v->cols, (long long)rows, (long long)cols);
    return SF_OK;
}

static int new_weight(sf_forward *f, sf_weight **out, sf_error *err, int n, const sf_view *parts, const sf_view *bias)
{
    sf_weight_desc d;
    memset(&d, 0, sizeof d);
    d.n_parts = n;
    for (int i = 0; i < n; i++) {
        d.part[i] = parts[i];
        if (bias) d.bias[i] = bias[i];
    }
    return OPS(f)->weight_new(f->b, &d, out, err);
}

static int new_vec(sf_forward *f, sf_weight **out, const sf_view *v, sf_error *err)
{
    sf_view row = *v;
    row.cols = row.rows * row.cols;
    row.rows = 1;
    return new_weight(f, out, err, 1, &row, NULL);
}

void sf_forward_free(sf_forward *f)
{
    if (!f) return;
    const struct sf_backend_ops *o = OPS(f);
    sf_buf *bufs[] = { f->h, f->x, f->qkv, f->att, f->ao, f->gu, f->act, f->mo, f->sel, f->logits, f->gathered,
                       f->rows_full };
    for (size_t i = 0; i < SF_ARRAY_LEN(bufs); i++)
        if (bufs[i]) o->buf_free(f->b, bufs[i]);
    if (f->layers) {
        for (int l = 0; l < f->m->cfg.n_layers; l++) {
            fw_layer *L = &f->layers[l];
            sf_weight *ws[] = { L->attn_norm, L->wqkv, L->wo, L->ffn_norm, L->wgu, L->wdown };
            for (size_t i = 0; i < SF_ARRAY_LEN(ws); i++)
                if (ws[i]) o->weight_free(f->b, ws[i]);
        }
    }
    if (f->lm && f->lm != f->emb) o->weight_free(f->b, f->lm);
    if (f->emb) o->weight_free(f->b, f->emb);
    if (f->out_norm) o->weight_free(f->b, f->out_norm);
    free(f->layers);
    free(f->inv_freq);
    free(f->gather_host);
    free(f);
}

static int check_model(const sf_model *m, int sharded, sf_error *err)
{
    const sf_model_config *c = &m->cfg;
    if (c->hidden < 1 || c->n_layers < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->head_dim < 2 ||
        c->intermediate < 1 || c->vocab_size < 1 || c->n_heads % c->n_kv_heads || c->head_dim % 2)
        return sf_err(err, SF_EFORMAT, "model config: hidden %d, layers %d, heads %d/%d kv, head_dim %d, ffn %d, vocab %d "
                      "(heads must be a multiple of kv heads, head_dim even)", c->hidden, c->n_layers, c->n_heads,
                      c->n_kv_heads, c->head_dim, c->intermediate, c->vocab_size);
    int64_t d = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int rc;
    if ((rc = check_view(&m->tok_embd, c->vocab_size, d, "token embedding", -1, err)) ||
        (rc = check_view(&m->out_norm, 1, d, "output norm", -1, err)))
        return rc;
    if (!sharded && m->lm_head.data && (rc = check_view(&m->lm_head, c->vocab_size, d, "lm_head", -1, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        const sf_layer_w *w = &m->layers[l];
        if ((rc = check_view(&w->attn_norm, 1, d, "attn_norm", l, err)) ||
            (rc = check_view(&w->wq, q, d, "q_proj", l, err)) || (rc = check_view(&w->wk, kv, d, "k_proj", l, err)) ||
            (rc = check_view(&w->wv, kv, d, "v_proj", l, err)) || (rc = check_view(&w->wo, d, q, "o_proj", l, err)) ||
            (rc = check_view(&w->ffn_norm, 1, d, "ffn_norm", l, err)) ||
            (rc = check_view(&w->wgate, c->intermediate, d, "gate_proj", l, err)) ||
            (rc = check_view(&w->wup, c->intermediate, d, "up_proj", l, err)) ||
            (rc = check_view(&w->wdown, d, c->intermediate, "down_proj", l, err)))
            return rc;
        if (w->bq.data && (rc = check_view(&w->bq, 1, q, "q_proj.bias", l, err))) return rc;
        if (w->bk.data && (rc = check_view(&w->bk, 1, kv, "k_proj.bias", l, err))) return rc;
        if (w->bv.data && (rc = check_view(&w->bv, 1, kv, "v_proj.bias", l, err))) return rc;
    }
    return SF_OK;
}

static int forward_new(sf_backend *b, const sf_model *m, const sf_shard *sh, sf_comm *comm, int max_tokens,
                       int max_logits, sf_forward **out, sf_error *err)
{
    *out = NULL;
    if (max_tokens < 1 || max_logits < 1 || max_logits > max_tokens)
        return sf_err(err, SF_EINVAL, "forward: max_tokens %d and max_logits %d (need 1 <= max_logits <= max_tokens)",
                      max_tokens, max_logits);
    int rc = check_model(m, sh != NULL, err);
    if (rc) return rc;
    const sf_model_config *c = &m->cfg;
    sf_forward *f = calloc(1, sizeof *f);
    if (!f) return sf_err(err, SF_ENOMEM, "forward: out of memory");
    f->b = b;
    f->m = m;
    f->max_tokens = max_tokens;
    f->max_logits = max_logits;
    f->shard = sh;
    f->comm = comm;
    f->tp_fused = sf_env_bool("SEMFLOW_TP_FUSED", 1);
    f->layers = calloc((size_t)c->n_layers, sizeof *f->layers);
    f->inv_freq = calloc((size_t)c->head_dim / 2 + 1, sizeof(float));
    if (!f->layers || !f->inv_freq) { rc = sf_err(err, SF_ENOMEM, "forward: out of memory"); goto fail; }

    if ((rc = new_weight(f, &f->emb, err, 1, &m->tok_embd, NULL)) || (rc = new_vec(f, &f->out_norm, &m->out_norm, err)))
        goto fail;
    int tied = !sh && (c->tie_embeddings || !m->lm_head.data || m->lm_head.data == m->tok_embd.data);
    if (tied) f->lm = f->emb;
    else if (sh) { /* this rank's vocabulary rows, then zero rows up to vocab_pad */
        sf_view lm[2];
        int n = 0;
        if (m->lm_head.rows > 0) lm[n++] = m->lm_head;
        if (sh->lm_pad.data) lm[n++] = sh->lm_pad;
        if ((rc = new_weight(f, &f->lm, err, n, lm, NULL))) goto fail;
    } else if ((rc = new_weight(f, &f->lm, err, 1, &m->lm_head, NULL))) goto fail;
    for (int l = 0; l < c->n_layers; l++) {
        const sf_layer_w *w = &m->layers[l];
        fw_layer *L = &f->layers[l];
        sf_view qkv[3] = { w->wq, w->wk, w->wv }, bias[3] = { w->bq, w->bk, w->bv }, gu[2] = { w->wgate, w->wup };
        for (int i = 0; i < 3; i++)
            if (bias[i].data) { bias[i].cols *= bias[i].rows; bias[i].rows = 1; }
        if ((rc = new_vec(f, &L->attn_norm, &w->attn_norm, err)) || (rc = new_weight(f, &L->wqkv, err, 3, qkv, bias)) ||
            (rc = new_weight(f, &L->wo, err, 1, &w->wo, NULL)) || (rc = new_vec(f, &L->ffn_norm, &w->ffn_norm, err)) ||
            (rc = new_weight(f, &L->wgu, err, 2, gu, NULL)) || (rc = new_weight(f, &L->wdown, err, 1, &w->wdown, NULL))) {
            sf_err_wrap(err, "layer %d", l);
            goto fail;
        }
    }

    int hd = c->head_dim, H = c->n_heads, Hkv = c->n_kv_heads;
    sf_rope_inv_freq(c, f->inv_freq);
    f->rope = (sf_rope){ .head_dim = hd, .rot_dim = hd, .interleaved = c->rope_interleaved,
                         .inv_freq = f->inv_freq, .attn_scale = 1.0f / sqrtf((float)hd) };

    const struct sf_backend_ops *o = b->ops;
    int T = max_tokens, Lg = max_logits;
    if ((rc = o->buf_new(b, T, c->hidden, &f->h, err)) || (rc = o->buf_new(b, T, c->hidden, &f->x, err)) ||
        (rc = o->buf_new(b, T, (int64_t)(H + 2 * Hkv) * hd, &f->qkv, err)) ||
        (rc = o->buf_new(b, T, (int64_t)H * hd, &f->att, err)) || (rc = o->buf_new(b, T, c->hidden, &f->ao, err)) ||
        (rc = o->buf_new(b, T, 2 * (int64_t)c->intermediate, &f->gu, err)) ||
        (rc = o->buf_new(b, T, c->intermediate, &f->act, err)) || (rc = o->buf_new(b, T, c->hidden, &f->mo, err)) ||
        (rc = o->buf_new(b, Lg, c->hidden, &f->sel, err)) ||
        (rc = o->buf_new(b, Lg, sh ? sh->vocab_pad : c->vocab_size, &f->logits, err)))
        goto fail;
    if (sh && sh->size > 1) {
        if ((rc = o->buf_new(b, (int64_t)sh->size * Lg, sh->vocab_pad, &f->gathered, err))) goto fail;
        if (o->sample && comm->ops->copy_2d &&
            (rc = o->buf_new(b, Lg, (int64_t)sh->size * sh->vocab_pad, &f->rows_full, err)))
            goto fail;
        if (!(f->gather_host = malloc((size_t)sh->size * Lg * sh->vocab_pad * sizeof(float)))) {
            rc = sf_err(err, SF_ENOMEM, "forward: out of memory for the gathered logits");
            goto fail;
        }
    }
    *out = f;
    return SF_OK;
fail:
    sf_forward_free(f);
    return sf_err_wrap(err, "preparing the forward pass");
}

int sf_forward_new(sf_backend *b, const sf_model *m, int max_tokens, int max_logits, sf_forward **out, sf_error *err)
{
    return forward_new(b, m, NULL, NULL, max_tokens, max_logits, out, err);
}

int sf_forward_new_tp(sf_backend *b, const sf_shard *sh, sf_comm *comm, int max_tokens, int max_logits,
                      sf_forward **out, sf_error *err)
{
    *out = NULL;
    if (!comm || comm->size != sh->size || comm->rank != sh->rank)
        return sf_err(err, SF_EINVAL, "forward: shard %d of %d needs a communicator of that rank and size", sh->rank,
                      sh->size);
    return forward_new(b, &sh->m, sh, comm, max_tokens, max_logits, out, err);
}

/* Logits of a vocabulary-parallel head: gather every rank's [L, vocab_pad] slice, then lay the
 * real columns of slice r at [r * vocab_pad, ...) of each host row. logits may be NULL (a
 * follower rank, which takes part in the gather but needs no copy). */
static int gather_logits(sf_forward *f, int L, float *logits, sf_error *err)
{
    const sf_shard *sh = f->shard;
    int V = f->m->cfg.vocab_size, P = sh->vocab_pad, rc;
    if ((rc = sf_comm_all_gather_buf(f->comm, f->b, f->logits, f->gathered, L, P, err)))
        return sf_err_wrap(err, "forward step: gathering the logit slices");
    if (!logits) return OPS(f)->sync(f->b);
    if ((rc = OPS(f)->read_f32(f->b, f->gathered, sh->size * L, f->gather_host)))
        return sf_err(err, rc, "forward step: reading the gathered logits failed on the %s backend", OPS(f)->name);
    for (int r = 0; r < sh->size; r++) {
        int lo = r * P, n = SF_MIN(V, lo + P) - lo;
        for (int i = 0; i < L && n > 0; i++)
            memcpy(logits + (size_t)i * V + lo, f->gather_host + ((size_t)r * L + i) * P, (size_t)n * sizeof(float));
    }
    return SF_OK;
}

/* One decoder layer over the step's T rows. Returns SF_OK, or a status with *op naming the
 * failed op (NULL: a collective failed, err holds why). */
static int layer_run(sf_forward *f, int T, int layer, int fused, int rn, const char **op, sf_error *err)
{
    const sf_model_config *c = &f->m->cfg;
    const struct sf_backend_ops *o = OPS(f);
    sf_backend *b = f->b;
    const int tp = f->comm && f->comm->size > 1, rank = f->comm ? f->comm->rank : 0;
    int rc;
    fw_layer *L = &f->layers[layer];
    /* the norm after each row-parallel projection's all-reduce: ffn_norm, then the next
     * layer's attn_norm (the output norm after the last layer) */
    const sf_weight *next_norm = layer + 1 < c->n_layers ? f->layers[layer + 1].attn_norm : f->out_norm;
#define STEP(name, call) do { *op = name; if ((rc = (call)) != SF_OK) return rc; } while (0)
#define COMM(call) do { if ((rc = (call)) != SF_OK) { *op = NULL; return rc; } } while (0)
    if (fused) {
        if (rn && layer) { /* x holds this layer's attn_norm(h) */
            STEP("qkv", o->matmul(b, f->x, L->wqkv, T, f->qkv));
            STEP("rope_kv", o->rope_kv(b, f->qkv, layer, c->n_heads, c->n_kv_heads, &f->rope));
        } else {
            STEP("attn_norm+qkv+rope_kv", o->norm_qkv_rope(b, f->h, L->attn_norm, c->rms_eps, L->wqkv, layer,
                                                          c->n_heads, c->n_kv_heads, &f->rope, f->x, f->qkv));
        }
        STEP("attention", o->attention(b, f->qkv, layer, c->n_heads, c->n_kv_heads, &f->rope, f->att));
        /* under TP: rank 0 adds its partial into h, the others write theirs there */
        STEP("o_proj+residual", tp && rank ? o->matmul(b, f->att, L->wo, T, f->h)
                                           : o->matmul_add(b, f->att, L->wo, T, f->ao, f->h));
        if (rn) {
            COMM(sf_comm_all_reduce_norm_buf(f->comm, b, f->h, NULL, L->ffn_norm, c->rms_eps, T, c->hidden, f->x, err));
            STEP("gate_up", o->matmul(b, f->x, L->wgu, T, f->gu));
            STEP("silu_mul", o->silu_mul(b, f->gu, T, c->intermediate, f->act));
        } else {
            if (tp) COMM(sf_comm_all_reduce_buf(f->comm, b, f->h, T, c->hidden, err));
            STEP("ffn_norm+gate_up+silu_mul",
                 o->norm_matmul(b, f->h, L->ffn_norm, c->rms_eps, L->wgu, T, 1, f->x, f->gu, f->act));
        }
        STEP("down_proj+residual", tp && rank ? o->matmul(b, f->act, L->wdown, T, f->h)
                                              : o->matmul_add(b, f->act, L->wdown, T, f->mo, f->h));
        if (rn)
            COMM(sf_comm_all_reduce_norm_buf(f->comm, b, f->h, NULL, next_norm, c->rms_eps, T, c->hidden, f->x, err));
        else if (tp) COMM(sf_comm_all_reduce_buf(f->comm, b, f->h, T, c->hidden, err));
        return SF_OK;
    }
    if (!(rn && layer))
        STEP("attn_norm", o->rmsnorm(b, f->h, layer ? f->mo : NULL, L->attn_norm, c->rms_eps, T, f->x));
    STEP("qkv", o->matmul(b, f->x, L->wqkv, T, f->qkv));
    STEP("rope_kv", o->rope_kv(b, f->qkv, layer, c->n_heads, c->n_kv_heads, &f->rope));
    STEP("attention", o->attention(b, f->qkv, layer, c->n_heads, c->n_kv_heads, &f->rope, f->att));
    STEP("o_proj", o->matmul(b, f->att, L->wo, T, f->ao));
    if (rn) /* h += the all-reduced ao, x = ffn_norm(h) */
        COMM(sf_comm_all_reduce_norm_buf(f->comm, b, f->ao, f->h, L->ffn_norm, c->rms_eps, T, c->hidden, f->x, err));
    else
        STEP("ffn_norm", o->rmsnorm(b, f->h, f->ao, L->ffn_norm, c->rms_eps, T, f->x));
    STEP("gate_up", o->matmul(b, f->x, L->wgu, T, f->gu));
    STEP("silu_mul", o->silu_mul(b, f->gu, T, c->intermediate, f->act));
    STEP("down_proj", o->matmul(b, f->act, L->wdown, T, f->mo));
    if (rn) COMM(sf_comm_all_reduce_norm_buf(f->comm, b, f->mo, f->h, next_norm, c->rms_eps, T, c->hidden, f->x, err));
#undef COMM
#undef STEP
    return SF_OK;
}

/* Whether a step of up to 8 rows wants the logits of every row, in order (a decode step, a
 * drafted one): then no rows are gathered, and the backend's fused norm + GEMV of a few rows
 * takes the lm_head. */
static int logits_all_rows(const sf_batch *bt)
{
    if (bt->n_logits != bt->n_tokens || bt->n_tokens > 8) return 0;
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] != i) return 0;
    return 1;
}

/* sf_batch.draw_row for a step: its one row, whose logits the fused output norm + lm_head make,
 * when the backend's draw takes it greedily or at a temperature alone with nothing else. */
static const sf_sample_row *draw_row(const sf_forward *f, const sf_batch *bt, const sf_forward_sample *smp, int fused,
                                     int rn)
{
    if (!smp || smp->prepare || smp->n_pen || bt->n_logits != 1 || bt->n_scored || !fused || rn ||
        (f->shard && f->shard->size > 1) || !logits_all_rows(bt))
        return NULL;
    const sf_sample_row *r = &smp->rows[0];
    const int plain = r->top_k <= 0 && r->top_p >= 1 && r->min_p <= 0;
    return (sf_sample_greedy(r->temperature, r->top_k) || plain) && !r->n_pen && !r->allow && !r->logprobs ? r : NULL;
}

/* One step; its logits go to host memory (logits), or through the backend's sampler (smp). */
static int step(sf_forward *f, const sf_batch *bt, float *logits, const sf_forward_sample *smp, sf_error *err)
{
    const sf_model_config *c = &f->m->cfg;
    const struct sf_backend_ops *o = OPS(f);
    sf_backend *b = f->b;
    int T = bt->n_tokens, rc;
    const int tp = f->comm && f->comm->size > 1;
    const int fused = o->norm_qkv_rope && o->norm_matmul && o->matmul_add && (!tp || f->tp_fused);
    /* under TP, each all-reduce and the norm after it as one op (sf_comm_all_reduce_norm_buf),
     * leaving the next norm's output in x; with the fused ops only above one row, where the
     * GEMV takes the norm in its prologue */
    const int rn = tp && (!fused || T > 1);
    const char *op = "";
    int layer = -1;
    if (T < 1 || T > f->max_tokens || bt->n_logits < 0 || bt->n_logits > f->max_logits)
        return sf_err(err, SF_EINVAL, "forward step: %d tokens and %d logit rows (this forward pass takes up to %d and %d)",
                      T, bt->n_logits, f->max_tokens, f->max_logits);
    if (bt->n_scored < 0 || bt->n_scored > bt->n_logits || (bt->n_scored && !sf_forward_can_score(f)))
        return sf_err(err, SF_EINVAL, "forward step: %d of %d logit rows to score, on a pass that %s", bt->n_scored,
                      bt->n_logits, sf_forward_can_score(f) ? "has fewer" : "cannot score");
    const int L = bt->n_logits - bt->n_scored; /* rows drawn or read */
#define STEP(name, call) do { op = name; if ((rc = (call)) != SF_OK) goto fail; } while (0)
    sf_batch bg = *bt;
    bg.draw_row = draw_row(f, bt, smp, fused, rn);
    STEP("batch_begin", o->batch_begin(b, &bg));
    STEP("embed", o->embed(b, f->emb, f->h));
    for (layer = 0; layer < c->n_layers; layer++)
        if ((rc = layer_run(f, T, layer, fused, rn, &op, err))) {
            if (!op) goto comm_fail;
            goto fail;
        }
    layer = -1;
    if (bt->n_logits > 0) {
        /* fused: h already holds every residual add; rn: x already holds output_norm(h) */
        if (fused && !rn && logits_all_rows(bt)) {
            /* a decode step's rows, every one drawn, in order: the output norm in the lm_head
             * GEMV's prologue, as the layers' norms are (two kernels fewer a step) */
            STEP("output_norm+lm_head", o->norm_matmul(b, f->h, f->out_norm, c->rms_eps, f->lm, T, 0, f->x, NULL, f->logits));
        } else {
            if (!rn) STEP("output_norm", o->rmsnorm(b, f->h, fused ? NULL : f->mo, f->out_norm, c->rms_eps, T, f->x));
            STEP("get_rows", o->get_rows(b, f->x, f->sel));
            STEP("lm_head", o->matmul(b, f->sel, f->lm, bt->n_logits, f->logits));
        }
        if (f->shard && f->shard->size > 1) {
            if (!smp) return gather_logits(f, L, logits, err);
            /* the sampling rank gets whole rows; the followers take part in the same gather.
             * Launching with a backend that draws asynchronously, the gather is only queued:
             * sf_forward_wait_sample waits for it (watching the peers) with the draw. */
            int nowait = f->launching && o->sample_start;
            f->comm->gather_nowait = nowait;
            rc = sf_comm_gather_rows_buf(f->comm, b, f->logits, f->gathered, f->rows_full, L,
                                         f->shard->vocab_pad, f->shard->rank, err);
            f->comm->gather_nowait = 0;
            if (rc) return sf_err_wrap(err, "forward step: gathering the logit rows");
            f->gather_pending = nowait;
        }
        if (smp) {
            int prc = SF_OK; /* the draw's preparation (forms' masks), after the step is launched */
            if (smp->prepare) {
                if (o->flush) STEP("flush", o->flush(b));
                prc = smp->prepare(smp->prepare_arg);
            }
            op = "sample";
            const sf_buf *lg = f->rows_full ? f->rows_full : f->logits;
            if (prc) {
                rc = prc;
            } else if (f->launching && o->sample_start) {
                rc = o->sample_start(b, lg, L, c->vocab_size, smp->rows, smp->pen, smp->n_pen, smp->ids, smp->lp);
                f->draw_pending = rc == SF_OK;
            } else {
                rc = o->sample(b, lg, L, c->vocab_size, smp->rows, smp->pen, smp->n_pen, smp->ids, smp->lp);
            }
            if (rc != SF_OK && f->gather_pending) { /* nothing to wait for later: wait for the gather now */
                f->gather_pending = 0;
                int wrc = sf_comm_wait(f->comm, b, f->logits, "the step and its logits gather", err);
                if (wrc) return wrc;
            }
            if (prc == SF_EUNSUPPORTED) return sf_err(err, prc, "forward step: the draw's rows are for the host");
            if (prc) return sf_err(err, prc, "forward step: preparing the draw (%s)", sf_status_str(prc));
            if (rc == SF_EUNSUPPORTED) return sf_err(err, rc, "forward step: the %s backend's sampler declined "
                                                     "%d rows; sample on the host", o->name, L);
            if (rc) goto fail;
        } else if (logits) STEP("read logits", o->read_f32(b, f->logits, L, logits));
        else STEP("sync", o->sync(b));
    } else {
        STEP("sync", o->sync(b));
    }
#undef STEP
    return SF_OK;
comm_fail:
    return sf_err_wrap(err, "forward step: all-reduce in layer %d", layer);
fail:
    if (layer >= 0)
        return sf_err(err, rc, "forward step: %s of layer %d failed on the %s backend (%s; details logged above)",
                      op, layer, o->name, sf_status_str(rc));
    return sf_err(err, rc, "forward step: %s failed on the %s backend (%s; details logged above)", op, o->name,
                  sf_status_str(rc));
}

int sf_forward_step(sf_forward *f, const sf_batch *bt, float *logits, sf_error *err)
{
    return step(f, bt, logits, NULL, err);
}

int sf_forward_can_sample(const sf_forward *f)
{
    return f->b->ops->sample != NULL && (!(f->shard && f->shard->size > 1) || f->rows_full);
}

int sf_forward_can_score(const sf_forward *f)
{
    return f->b->ops->score != NULL && !(f->shard && f->shard->size > 1);
}

int sf_forward_score(sf_forward *f, int row0, int n, const int32_t *targets, int k, float *lp, int32_t *rank,
                     int32_t *top_id, float *top_lp, sf_error *err)
{
    if (!sf_forward_can_score(f)) return sf_err(err, SF_EUNSUPPORTED, "forward: the %s backend cannot score rows", OPS(f)->name);
    if (row0 < 0 || n < 0 || row0 + n > f->max_logits)
        return sf_err(err, SF_EINVAL, "forward: rows [%d, +%d) to score; the step keeps up to %d", row0, n, f->max_logits);
    int rc = OPS(f)->score(f->b, f->logits, row0, n, f->m->cfg.vocab_size, targets, k, lp, rank, top_id, top_lp);
    return rc ? sf_err(err, rc, "forward: scoring %d logit rows failed on the %s backend", n, OPS(f)->name) : SF_OK;
}

int sf_forward_step_sample(sf_forward *f, const sf_batch *bt, const sf_forward_sample *s, sf_error *err)
{
    if (!sf_forward_can_sample(f))
        return sf_err(err, SF_EUNSUPPORTED, "forward step: the %s backend cannot sample%s", OPS(f)->name,
                      f->shard && f->shard->size > 1 ? " on this rank of a split vocabulary" : "");
    return step(f, bt, NULL, s, err);
}

int sf_forward_launch_sample(sf_forward *f, const sf_batch *bt, const sf_forward_sample *s, sf_error *err)
{
    if (f->draw_pending)
        return sf_err(err, SF_EINVAL, "forward: a step was launched while the draw of the last one was not waited for");
    f->launching = 1;
    int rc = sf_forward_step_sample(f, bt, s, err);
    f->launching = 0;
    return rc;
}

int sf_forward_launch_waited(const sf_forward *f)
{
    return !f->draw_pending || (f->shard && f->shard->size > 1 && !f->gather_pending);
}

int sf_forward_wait_sample(sf_forward *f, sf_error *err)
{
    if (!f->draw_pending) return SF_OK; /* the backend drew synchronously in the launch */
    f->draw_pending = 0;
    if (f->deferred) { /* the draw stays queued: its gather is waited for in sf_forward_take */
        if (f->dq_n == SF_COMM_MARKS)
            return sf_err(err, SF_EINVAL, "forward: %d draws queued already (sf_forward_take first)", SF_COMM_MARKS);
        int marked = f->gather_pending;
        f->gather_pending = 0;
        if (marked) {
            int rc = sf_comm_mark(f->comm, f->b, f->logits, err);
            if (rc) return rc;
        }
        f->dq[(f->dq_r + f->dq_n++) % SF_COMM_MARKS] = (unsigned char)marked;
        int rc = OPS(f)->sample_wait(f->b);
        return rc ? sf_err(err, rc, "forward step: queueing the draw failed on the %s backend (%s; details logged "
                           "above)", OPS(f)->name, sf_status_str(rc)) : SF_OK;
    }
    if (f->gather_pending) { /* under TP: wait watching the peers, so a dead rank is an error, not a hang */
        f->gather_pending = 0;
        int rc = sf_comm_wait(f->comm, f->b, f->logits, "the step, its logits gather and the draw", err);
        if (rc) return rc;
    }
    int rc = OPS(f)->sample_wait(f->b);
    return rc ? sf_err(err, rc, "forward step: waiting for the sampled ids failed on the %s backend (%s; details "
                       "logged above)", OPS(f)->name, sf_status_str(rc)) : SF_OK;
}

int sf_forward_read_logits(sf_forward *f, int n, float *logits, sf_error *err)
{
    if (n < 0 || n > f->max_logits)
        return sf_err(err, SF_EINVAL, "forward: %d logit rows asked, the step keeps up to %d", n, f->max_logits);
    if (!f->rows_full) {
        int rc = OPS(f)->read_f32(f->b, f->logits, n, logits);
        return rc ? sf_err(err, rc, "forward: reading the logits failed on the %s backend", OPS(f)->name) : SF_OK;
    }
    /* tensor parallelism: the whole rows the last sampled step gathered, without their padding */
    int V = f->m->cfg.vocab_size;
    size_t W = (size_t)f->shard->size * f->shard->vocab_pad;
    int rc = OPS(f)->read_f32(f->b, f->rows_full, n, f->gather_host);
    if (rc) return sf_err(err, rc, "forward: reading the gathered logit rows failed on the %s backend", OPS(f)->name);
    for (int i = 0; i < n; i++) memcpy(logits + (size_t)i * V, f->gather_host + i * W, (size_t)V * sizeof(float));
    return SF_OK;
}

int sf_forward_defer(sf_forward *f, int on, sf_error *err)
{
    if (f->dq_n || f->draw_pending)
        return sf_err(err, SF_EINVAL, "forward: draws are queued: take them before deferring is switched");
    if (on && (!OPS(f)->sample_defer || !OPS(f)->sample_take))
        return sf_err(err, SF_EUNSUPPORTED, "forward: the %s backend cannot keep its draws queued", OPS(f)->name);
    int rc = OPS(f)->sample_defer ? OPS(f)->sample_defer(f->b, on) : SF_OK;
    if (rc) return sf_err(err, rc, "forward: the %s backend's sample_defer failed (logged above)", OPS(f)->name);
    f->deferred = on != 0;
    return SF_OK;
}

int sf_forward_take(sf_forward *f, sf_error *err)
{
    int rc = SF_OK;
    if (f->dq_n) {
        int marked = f->dq[f->dq_r];
        f->dq_r = (f->dq_r + 1) % SF_COMM_MARKS;
        f->dq_n--;
        if (marked && (rc = sf_comm_wait_mark(f->comm, "the step, its logits gather and the draw", err))) return rc;
    }
    if (!OPS(f)->sample_take) return SF_OK;
    rc = OPS(f)->sample_take(f->b);
    return rc ? sf_err(err, rc, "forward step: taking the sampled ids failed on the %s backend (%s; details logged "
                       "above)", OPS(f)->name, sf_status_str(rc)) : SF_OK;
}
