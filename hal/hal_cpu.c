/* hal_cpu.c — the CPU backend: fp32 activations, weights referenced in place (the model's
 * mmap'd views, no copy), a paged fp32 KV cache, and the kernels of kernels/cpu run over a
 * small thread pool owned by the backend context.
 *
 * Driven by one thread (see hal.h). Every op checks the shapes it is given and returns
 * SF_EINVAL with a logged message naming the op and the mismatch rather than touching memory
 * out of range. KV layout per layer, K and V alike: [n_blocks][n_kv_heads][block_size][hd] fp32;
 * INT8 blocks (kv.int8) are half-block units of the same memory, per hal.h: on the CPU one
 * uses a quarter of a block's bytes (int8 against fp32), so each unit's second half is idle. */
#include "hal.h"
#include "kernels/cpu/cpu.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct sf_buf {
    int64_t rows, cols;
    float *data;
};

struct sf_weight {
    int n_parts;
    sf_view part[4];
    float *bias[4];     /* fp32 copies (small), NULL when absent */
    float *vec;         /* fp32 copy of a 1-row weight (norm scales) */
    void *slice[4];     /* own copies: strided parts (tensor-parallel column slices) */
    int64_t m, k;
};

typedef struct cpu_ctx {
    sf_hw_info hw;
    sf_cpu_pool *pool;
    int n_threads;
    /* the current batch (copied in batch_begin) */
    int T, S, L, max_blocks, have_batch;
    int32_t *tokens, *pos, *slot, *seq_start, *seq_ctx, *block_table, *logit_rows;
    size_t cap[7];           /* capacity of each array above, in that order */
    /* KV cache */
    sf_kv_config kv;
    int kv_ready;
    float *kv_mem;
    size_t kv_bytes;
    int64_t kv_layer_floats; /* floats of K (or V) of one layer */
    float *kv_scale;         /* INT8 blocks (kv.int8): per layer K then V scales, kv_layer_rows each */
    int64_t kv_layer_rows;   /* INT8 rows (token, kv head) of one layer: 2 * n_blocks * Hkv * bs */
    int32_t kv_ids;          /* block ids in use: n_blocks, or 3 * n_blocks with INT8 blocks */
    /* per-thread scratch */
    float *scratch;
    int64_t scratch_floats;  /* per thread */
    float *xq;               /* a short step's x as the block formats' kernels read it (qdot.c) */
    int64_t xq_floats;
    /* sampler scratch, one per thread, for rows of up to sample_vocab tokens */
    sf_cpu_sample_scratch *sample;
    int sample_vocab;
    /* the ids of the last draw, for batches that take tokens from it (sf_batch.src_row) */
    int32_t *last_ids;
    int n_last, cap_last;
    /* $SEMFLOW_CPU_FAIL_TAKE=N: the Nth sample_take fails, as a device lost mid-step would (tests
     * of the engine's failure paths: the step in flight, the one queued behind it); 0: never */
    long fail_take, n_take;
} cpu_ctx;

#define CTX(b) ((cpu_ctx *)(b)->ctx)

/* Ops smaller than this (in multiply-adds or elements touched) run on the calling thread:
 * waking the pool costs more than the op, and on a busy machine a descheduled worker
 * would stall a step for a whole time slice. */
#define SMALL_WORK 32768

static void run(cpu_ctx *c, sf_cpu_task fn, void *arg, int64_t work)
{
    if (work < SMALL_WORK) fn(arg, 0, 1);
    else sf_cpu_pool_run(c->pool, fn, arg);
}
#define BAD(...) (SF_LOGE(__VA_ARGS__), SF_EINVAL)

static int ensure_scratch(cpu_ctx *c, int64_t per_thread)
{
    if (per_thread <= c->scratch_floats) return SF_OK;
    float *s = aligned_alloc(64, ((size_t)per_thread * c->n_threads * sizeof(float) + 63) & ~(size_t)63);
    if (!s) return SF_ENOMEM;
    free(c->scratch);
    c->scratch = s;
    c->scratch_floats = per_thread;
    return SF_OK;
}

/* ---- memory ---------------------------------------------------------------------------- */
/* what the kernels read in place: the float types and every GGUF block format */
static int dtype_ok(sf_dtype t)
{
    return t == SF_DT_F32 || t == SF_DT_F16 || t == SF_DT_BF16 || sf_dtype_block(t) > 1;
}

static void cpu_weight_free(sf_backend *b, sf_weight *w)
{
    if (!w) return;
    for (int i = 0; i < 4; i++) {
        free(w->bias[i]);
        free(w->slice[i]);
    }
    free(w->vec);
    free(w);
}

static float *to_f32_copy(const sf_view *v, int64_t n)
{
    float *out = malloc((size_t)n * sizeof(float) + 1);
    if (out) sf_cpu_row_to_f32(v->dtype, v->data, n, out);
    return out;
}

static int cpu_weight_new(sf_backend *b, const sf_weight_desc *d, sf_weight **out, sf_error *err)
{
    *out = NULL;
    if (!d || d->n_parts < 1 || d->n_parts > 4)
        return sf_err(err, SF_EINVAL, "cpu weight: %d parts (1 to 4 expected)", d ? d->n_parts : 0);
    sf_weight *w = calloc(1, sizeof *w);
    if (!w) return sf_err(err, SF_ENOMEM, "cpu weight: out of memory");
    w->n_parts = d->n_parts;
    w->k = d->part[0].cols;
    for (int p = 0; p < d->n_parts; p++) {
        const sf_view *v = &d->part[p];
        if (!v->data || v->rows < 1 || v->cols < 1) {
            cpu_weight_free(b, w);
            return sf_err(err, SF_EINVAL, "cpu weight: part %d is empty (%lld x %lld)", p, (long long)v->rows, (long long)v->cols);
        }
        if (!dtype_ok(v->dtype)) {
            cpu_weight_free(b, w);
            return sf_err(err, SF_EUNSUPPORTED, "cpu weight: part %d has dtype %s; the CPU backend reads f32, f16, bf16 "
                          "and the GGUF block formats", p, sf_dtype_name(v->dtype));
        }
        int blk = sf_dtype_block(v->dtype);
        if (v->cols % blk || (v->stride && v->stride % blk)) {
            cpu_weight_free(b, w);
            return sf_err(err, SF_EFORMAT, "cpu weight: %s part %d has %lld columns (row stride %lld), not whole "
                          "%d-blocks", sf_dtype_name(v->dtype), p, (long long)v->cols, (long long)v->stride, blk);
        }
        if (v->cols != w->k) {
            cpu_weight_free(b, w);
            return sf_err(err, SF_EINVAL, "cpu weight: part %d has %lld columns, part 0 has %lld (fused parts must agree)",
                          p, (long long)v->cols, (long long)d->part[0].cols);
        }
        w->part[p] = *v;
        w->m += v->rows;
        if (v->stride && v->stride != v->cols) { /* a column slice: the kernels read rows back to back */
            size_t rb = sf_dtype_bytes(v->dtype, v->cols), sb = sf_dtype_bytes(v->dtype, v->stride);
            if (v->stride < v->cols) {
                cpu_weight_free(b, w);
                return sf_err(err, SF_EINVAL, "cpu weight: part %d has row stride %lld for %lld columns of %s",
                              p, (long long)v->stride, (long long)v->cols, sf_dtype_name(v->dtype));
            }
            if (!(w->slice[p] = malloc(rb * (size_t)v->rows))) {
                cpu_weight_free(b, w);
                return sf_err(err, SF_ENOMEM, "cpu weight: out of memory for a %lld x %lld slice",
                              (long long)v->rows, (long long)v->cols);
            }
            for (int64_t r = 0; r < v->rows; r++)
                memcpy((char *)w->slice[p] + (size_t)r * rb, (const char *)v->data + (size_t)r * sb, rb);
            w->part[p].data = w->slice[p];
            w->part[p].stride = 0;
        }
        const sf_view *bv = &d->bias[p];
        if (bv->data) {
            if (bv->rows * bv->cols != v->rows || sf_dtype_block(bv->dtype) > 1 || !dtype_ok(bv->dtype)) {
                cpu_weight_free(b, w);
                return sf_err(err, SF_EINVAL, "cpu weight: bias of part %d has %lld elements of %s, expected %lld f32/f16/bf16",
                              p, (long long)(bv->rows * bv->cols), sf_dtype_name(bv->dtype), (long long)v->rows);
            }
            if (!(w->bias[p] = to_f32_copy(bv, v->rows))) {
                cpu_weight_free(b, w);
                return sf_err(err, SF_ENOMEM, "cpu weight: out of memory");
            }
        }
    }
    if (w->n_parts == 1 && w->m == 1) {
        if (!(w->vec = to_f32_copy(&w->part[0], w->k))) {
            cpu_weight_free(b, w);
            return sf_err(err, SF_ENOMEM, "cpu weight: out of memory");
        }
    }
    *out = w;
    return SF_OK;
}

static int cpu_buf_new(sf_backend *b, int64_t rows, int64_t cols, sf_buf **out, sf_error *err)
{
    *out = NULL;
    if (rows < 1 || cols < 1)
        return sf_err(err, SF_EINVAL, "cpu buffer: bad shape %lld x %lld", (long long)rows, (long long)cols);
    sf_buf *buf = calloc(1, sizeof *buf);
    size_t bytes = ((size_t)rows * (size_t)cols * sizeof(float) + 63) & ~(size_t)63;
    if (buf) buf->data = aligned_alloc(64, bytes);
    if (!buf || !buf->data) {
        free(buf);
        return sf_err(err, SF_ENOMEM, "cpu buffer: cannot allocate %lld x %lld floats", (long long)rows, (long long)cols);
    }
    buf->rows = rows;
    buf->cols = cols;
    *out = buf;
    return SF_OK;
}

static void cpu_buf_free(sf_backend *b, sf_buf *buf)
{
    if (!buf) return;
    free(buf->data);
    free(buf);
}

static size_t kv_block_floats(const sf_kv_config *c)
{
    return (size_t)c->n_kv_heads * c->block_size * c->head_dim;
}

/* Scale bytes one full block's worth of units (two) takes across layers, K and V. */
static size_t kv_block_scale_bytes(const sf_kv_config *c)
{
    return c->int8 ? (size_t)c->n_layers * 2 * 2 * c->n_kv_heads * c->block_size * sizeof(float) : 0;
}

static size_t cpu_kv_block_bytes(sf_backend *b, const sf_kv_config *c)
{
    return (size_t)c->n_layers * 2 * kv_block_floats(c) * sizeof(float) + kv_block_scale_bytes(c);
}

static void kv_release(cpu_ctx *c)
{
    if (c->kv_mem) munmap(c->kv_mem, c->kv_bytes);
    free(c->kv_scale);
    c->kv_mem = NULL;
    c->kv_scale = NULL;
    c->kv_bytes = 0;
    c->kv_ready = 0;
}

static int cpu_kv_init(sf_backend *b, const sf_kv_config *kc, sf_error *err)
{
    cpu_ctx *c = CTX(b);
    if (kc->n_layers < 1 || kc->n_blocks < 1 || kc->block_size < 1 || kc->n_kv_heads < 1 || kc->head_dim < 1)
        return sf_err(err, SF_EINVAL, "cpu kv cache: bad config (layers %d, blocks %d, block size %d, kv heads %d, head dim %d)",
                      kc->n_layers, kc->n_blocks, kc->block_size, kc->n_kv_heads, kc->head_dim);
    if (kc->dtype == SF_DT_I8)
        return sf_err(err, SF_EUNSUPPORTED, "cpu kv cache: an all-INT8 cache is not a mode; set int8 = 1 for INT8 "
                      "blocks beside full-precision ones (chosen per sequence)");
    if ((int64_t)kc->n_blocks * (kc->int8 ? 3 : 1) > INT32_MAX / kc->block_size)
        return sf_err(err, SF_EINVAL, "cpu kv cache: %d blocks of %d tokens overflow the 32-bit slot numbers; "
                      "lower --num-kv-blocks", kc->n_blocks, kc->block_size);
    /* The CPU keeps KV in fp32 whatever float type is asked for: conversions would cost more
     * than the bandwidth they save at the context lengths a CPU serves. */
    kv_release(c);
    size_t bytes = (size_t)kc->n_blocks * (cpu_kv_block_bytes(b, kc) - kv_block_scale_bytes(kc));
    void *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED)
        return sf_err(err, SF_ENOMEM, "cpu kv cache: mmap(%zu MiB) for %d blocks failed: %s; lower --num-kv-blocks or the context",
                      bytes >> 20, kc->n_blocks, strerror(errno));
    c->kv_mem = mem;
    c->kv_bytes = bytes;
    c->kv_layer_rows = 2 * (int64_t)kc->n_blocks * kc->n_kv_heads * kc->block_size;
    if (kc->int8 && !(c->kv_scale = calloc((size_t)kc->n_layers * 2 * c->kv_layer_rows, sizeof(float)))) {
        kv_release(c);
        return sf_err(err, SF_ENOMEM, "cpu kv cache: out of memory for the INT8 scales of %d blocks", kc->n_blocks);
    }
    c->kv = *kc;
    c->kv.dtype = SF_DT_F32;
    c->kv_layer_floats = (int64_t)kc->n_blocks * (int64_t)kv_block_floats(kc);
    c->kv_ids = kc->n_blocks * (kc->int8 ? 3 : 1);
    c->kv_ready = 1;
    return SF_OK;
}

static float *kv_k(cpu_ctx *c, int layer) { return c->kv_mem + (int64_t)layer * 2 * c->kv_layer_floats; }
static float *kv_v(cpu_ctx *c, int layer) { return kv_k(c, layer) + c->kv_layer_floats; }

/* The INT8 view of a layer (i8_base 0 when the cache has no INT8 blocks). */
static sf_cpu_kv8 kv8_of(cpu_ctx *c, int layer)
{
    sf_cpu_kv8 v = { 0 };
    if (!c->kv.int8) return v;
    v.k8 = (int8_t *)kv_k(c, layer);
    v.v8 = (int8_t *)kv_v(c, layer);
    v.k_scale = c->kv_scale + (int64_t)layer * 2 * c->kv_layer_rows;
    v.v_scale = v.k_scale + c->kv_layer_rows;
    v.unit_bytes = (int64_t)kv_block_floats(&c->kv) * sizeof(float) / 2;
    v.i8_base = c->kv.n_blocks;
    return v;
}

static void move(void *host, void *cache, size_t n, int out)
{
    if (out) memcpy(host, cache, n);
    else memcpy(cache, host, n);
}

/* Host layout of a copied block (stride kv_block_bytes): a full block is, for each layer, K then
 * V, n_kv_heads*block_size*hd floats each; an INT8 block, for each layer, K then V int8 rows,
 * then K then V scales. */
static int kv_copy(sf_backend *b, const int32_t *blocks, int n, void *host, int out)
{
    cpu_ctx *c = CTX(b);
    if (!c->kv_ready) return BAD("kv copy: the KV cache is not initialised (kv_init)");
    size_t bf = kv_block_floats(&c->kv), rows = (size_t)c->kv.n_kv_heads * c->kv.block_size;
    size_t stride = cpu_kv_block_bytes(b, &c->kv);
    for (int i = 0; i < n; i++) {
        int32_t id = blocks[i];
        if (id < 0 || id >= c->kv_ids)
            return BAD("kv copy: block id %d out of range [0, %d)", id, c->kv_ids);
        char *h = (char *)host + (size_t)i * stride;
        for (int l = 0; l < c->kv.n_layers; l++) {
            if (id < c->kv.n_blocks) {
                move(h, kv_k(c, l) + (size_t)id * bf, bf * 4, out);
                move(h + bf * 4, kv_v(c, l) + (size_t)id * bf, bf * 4, out);
                h += 2 * bf * 4;
                continue;
            }
            sf_cpu_kv8 v = kv8_of(c, l);
            size_t u = (size_t)(id - v.i8_base);
            move(h, v.k8 + u * v.unit_bytes, bf, out);
            move(h + bf, v.v8 + u * v.unit_bytes, bf, out);
            move(h + 2 * bf, v.k_scale + u * rows, rows * 4, out);
            move(h + 2 * bf + rows * 4, v.v_scale + u * rows, rows * 4, out);
            h += 2 * bf + 2 * rows * 4;
        }
    }
    return SF_OK;
}
static int cpu_kv_copy_out(sf_backend *b, const int32_t *blocks, int n, void *host) { return kv_copy(b, blocks, n, host, 1); }
static int cpu_kv_copy_in(sf_backend *b, const int32_t *blocks, int n, const void *host) { return kv_copy(b, blocks, n, (void *)host, 0); }
static int cpu_kv_copy_blocks(sf_backend *b, const int32_t *blocks, const int32_t *slots, int n, void *host,
                              size_t stride, int out)
{
    cpu_ctx *c = CTX(b);
    if (!c->kv_ready) return BAD("kv copy: the KV cache is not initialised (kv_init)");
    if (stride < cpu_kv_block_bytes(b, &c->kv))
        return BAD("kv copy: host stride %zu is below a block's %zu bytes", stride, cpu_kv_block_bytes(b, &c->kv));
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || blocks[i] < 0 || blocks[i] >= c->kv_ids)
            return BAD("kv copy: block %d to slot %d: block out of range [0, %d) or negative slot", blocks[i],
                       slots[i], c->kv_ids);
    for (int i = 0; i < n; i++) {
        int rc = kv_copy(b, blocks + i, 1, (char *)host + (size_t)slots[i] * stride, out);
        if (rc != SF_OK) return rc;
    }
    return SF_OK;
}

/* ---- one step ---------------------------------------------------------------------------- */
static int grow(int32_t **p, size_t *cap, size_t n)
{
    if (n <= *cap) return 0;
    int32_t *q = realloc(*p, n * sizeof(int32_t));
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static int cpu_batch_begin(sf_backend *b, const sf_batch *bt)
{
    cpu_ctx *c = CTX(b);
    c->have_batch = 0;
    if (bt->n_tokens < 1 || bt->n_seqs < 1 || bt->n_logits < 0 || bt->max_blocks < 1)
        return BAD("batch: %d tokens, %d sequences, %d logit rows, max_blocks %d", bt->n_tokens, bt->n_seqs,
                   bt->n_logits, bt->max_blocks);
    if (!c->kv_ready) return BAD("batch: the KV cache is not initialised (kv_init)");
    int T = bt->n_tokens, S = bt->n_seqs, bs = c->kv.block_size;
    if (bt->seq_start[0] != 0 || bt->seq_start[S] != T)
        return BAD("batch: seq_start must run from 0 to n_tokens %d (got %d .. %d)", T, bt->seq_start[0], bt->seq_start[S]);
    for (int s = 0; s < S; s++) {
        int a = bt->seq_start[s], e = bt->seq_start[s + 1];
        if (e < a) return BAD("batch: seq_start decreases at sequence %d", s);
        for (int t = a; t < e; t++) {
            int p = bt->pos[t];
            if (p < 0 || p >= bt->max_blocks * bs)
                return BAD("batch: token %d has position %d outside [0, %d)", t, p, bt->max_blocks * bs);
            int32_t blk = bt->block_table[(int64_t)s * bt->max_blocks + p / bs];
            if (blk < 0 || blk >= c->kv_ids)
                return BAD("batch: sequence %d position %d maps to block %d, outside [0, %d)", s, p, blk, c->kv_ids);
            if (bt->slot[t] != blk * bs + p % bs)
                return BAD("batch: token %d slot %d does not match its block table (block %d offset %d)",
                           t, bt->slot[t], blk, p % bs);
        }
        /* every context position of every token must map to a valid block */
        int maxp = 0;
        for (int t = a; t < e; t++) maxp = SF_MAX(maxp, bt->pos[t]);
        for (int j = 0; e > a && j <= maxp / bs; j++) {
            int32_t blk = bt->block_table[(int64_t)s * bt->max_blocks + j];
            if (blk < 0 || blk >= c->kv_ids)
                return BAD("batch: sequence %d block table entry %d is %d, outside [0, %d)", s, j, blk, c->kv_ids);
        }
    }
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= T)
            return BAD("batch: logit row %d is %d, outside [0, %d)", i, bt->logit_rows[i], T);
    size_t nbt = (size_t)S * bt->max_blocks;
    if (grow(&c->tokens, &c->cap[0], T) || grow(&c->pos, &c->cap[1], T) || grow(&c->slot, &c->cap[2], T) ||
        grow(&c->seq_start, &c->cap[3], S + 1) || grow(&c->seq_ctx, &c->cap[4], S + 1) ||
        grow(&c->block_table, &c->cap[5], nbt) || grow(&c->logit_rows, &c->cap[6], bt->n_logits + 1))
        return (SF_LOGE("batch: out of memory"), SF_ENOMEM);
    memcpy(c->tokens, bt->tokens, T * 4);
    if (bt->src_row)
        for (int t = 0; t < T; t++) {
            if (bt->src_row[t] < 0) continue;
            if (bt->src_row[t] >= c->n_last)
                return BAD("batch: token %d takes row %d of the last draw, which had %d rows", t, bt->src_row[t],
                           c->n_last);
            c->tokens[t] = c->last_ids[bt->src_row[t]];
        }
    memcpy(c->pos, bt->pos, T * 4);
    memcpy(c->slot, bt->slot, T * 4);
    memcpy(c->seq_start, bt->seq_start, (S + 1) * 4);
    if (bt->seq_ctx) memcpy(c->seq_ctx, bt->seq_ctx, S * 4);
    memcpy(c->block_table, bt->block_table, nbt * 4);
    if (bt->n_logits) memcpy(c->logit_rows, bt->logit_rows, bt->n_logits * 4);
    c->T = T;
    c->S = S;
    c->L = bt->n_logits;
    c->max_blocks = bt->max_blocks;
    c->have_batch = 1;
    return SF_OK;
}

static int cpu_embed(sf_backend *b, const sf_weight *emb, sf_buf *x)
{
    cpu_ctx *c = CTX(b);
    if (!c->have_batch) return BAD("embed: no batch (call batch_begin first)");
    if (emb->n_parts != 1) return BAD("embed: the embedding must be a single-part weight");
    if (x->rows < c->T || x->cols != emb->k)
        return BAD("embed: output %lld x %lld, need at least %d x %lld", (long long)x->rows, (long long)x->cols, c->T, (long long)emb->k);
    for (int t = 0; t < c->T; t++)
        if (c->tokens[t] < 0 || c->tokens[t] >= emb->m)
            return BAD("embed: token id %d at batch index %d is outside the vocabulary [0, %lld)", c->tokens[t], t, (long long)emb->m);
    sf_cpu_embed a = { .emb = emb->part[0], .tokens = c->tokens, .T = c->T, .x = x->data };
    run(c, sf_cpu_embed_task, &a, (int64_t)c->T * emb->k);
    return SF_OK;
}

static int cpu_rmsnorm(sf_backend *b, sf_buf *x, const sf_buf *add, const sf_weight *w, float eps, int n, sf_buf *out)
{
    cpu_ctx *c = CTX(b);
    if (!w->vec || w->k != x->cols) return BAD("rmsnorm: weight must be one row of %lld values", (long long)x->cols);
    if (n < 1 || n > x->rows || n > out->rows || out->cols != x->cols || (add && (add->cols != x->cols || n > add->rows)))
        return BAD("rmsnorm: %d rows of width %lld do not fit the buffers", n, (long long)x->cols);
    if (add && out == x) return BAD("rmsnorm: out must differ from x when a residual is added");
    sf_cpu_rmsnorm a = { .x = x->data, .add = add ? add->data : NULL, .w = w->vec, .out = out->data,
                         .n = n, .d = (int)x->cols, .eps = eps };
    run(c, sf_cpu_rmsnorm_task, &a, (int64_t)n * x->cols);
    return SF_OK;
}

static int cpu_matmul(sf_backend *b, const sf_buf *x, const sf_weight *w, int n, sf_buf *y)
{
    cpu_ctx *c = CTX(b);
    if (n < 1 || n > x->rows || n > y->rows) return BAD("matmul: %d rows, buffers have %lld and %lld", n, (long long)x->rows, (long long)y->rows);
    if (x->cols != w->k || y->cols != w->m)
        return BAD("matmul: x is [%d, %lld], W is [%lld, %lld], y is [%d, %lld]", n, (long long)x->cols,
                   (long long)w->m, (long long)w->k, n, (long long)y->cols);
    if (ensure_scratch(c, sf_cpu_matmul_scratch(w->k))) return (SF_LOGE("matmul: out of memory"), SF_ENOMEM);
    sf_cpu_matmul a = { .n_parts = w->n_parts, .m = w->m, .k = w->k, .x = x->data, .y = y->data, .n = n,
                        .ldx = (int)x->cols, .ldy = (int)y->cols, .l2_bytes = c->hw.l2_bytes,
                        .scratch = c->scratch, .scratch_floats = c->scratch_floats };
    int blocks = 0;
    for (int p = 0; p < w->n_parts; p++) {
        a.part[p] = w->part[p];
        a.bias[p] = w->bias[p];
        blocks |= sf_dtype_block(w->part[p].dtype) > 1;
    }
    /* a few tokens against block formats: x in int8 once here, not in every thread's chunk */
    if (blocks && n <= sf_cpu_direct_tokens(w->part, w->n_parts) && sf_cpu_has_avx2()) {
        int64_t pf = sf_cpu_kq_prep_floats(w->k), need = pf * n;
        if (need > c->xq_floats) {
            float *q = aligned_alloc(64, ((size_t)need * sizeof(float) + 63) & ~(size_t)63);
            if (!q) return (SF_LOGE("matmul: out of memory"), SF_ENOMEM);
            free(c->xq);
            c->xq = q;
            c->xq_floats = need;
        }
        for (int t = 0; t < n; t++) sf_cpu_kq_prep_x(x->data + (int64_t)t * x->cols, w->k, c->xq + t * pf);
        a.xq = c->xq;
    }
    run(c, sf_cpu_matmul_task, &a, (int64_t)n * w->m * w->k);
    return SF_OK;
}

static int check_heads(cpu_ctx *c, const char *op, const sf_buf *qkv, int layer, int H, int Hkv, const sf_rope *r)
{
    if (!c->have_batch) return BAD("%s: no batch (call batch_begin first)", op);
    if (!c->kv_ready) return BAD("%s: the KV cache is not initialised (kv_init)", op);
    if (layer < 0 || layer >= c->kv.n_layers) return BAD("%s: layer %d outside [0, %d)", op, layer, c->kv.n_layers);
    if (H < 1 || Hkv < 1 || H % Hkv) return BAD("%s: %d query heads is not a multiple of %d kv heads", op, H, Hkv);
    if (Hkv != c->kv.n_kv_heads || r->head_dim != c->kv.head_dim)
        return BAD("%s: %d kv heads of %d dims, the KV cache has %d of %d", op, Hkv, r->head_dim, c->kv.n_kv_heads, c->kv.head_dim);
    if (r->rot_dim < 0 || r->rot_dim > r->head_dim || r->rot_dim % 2 || r->rot_dim > 1024)
        return BAD("%s: rot_dim %d must be even and at most head_dim %d", op, r->rot_dim, r->head_dim);
    if (qkv->rows < c->T || qkv->cols != (int64_t)(H + 2 * Hkv) * r->head_dim)
        return BAD("%s: qkv is %lld x %lld, need %d x %d", op, (long long)qkv->rows, (long long)qkv->cols, c->T, (H + 2 * Hkv) * r->head_dim);
    return SF_OK;
}

static int cpu_rope_kv(sf_backend *b, sf_buf *qkv, int layer, int H, int Hkv, const sf_rope *r)
{
    cpu_ctx *c = CTX(b);
    int rc = check_heads(c, "rope_kv", qkv, layer, H, Hkv, r);
    if (rc) return rc;
    sf_cpu_rope_kv a = { .qkv = qkv->data, .T = c->T, .pos = c->pos, .slot = c->slot, .n_heads = H, .n_kv_heads = Hkv,
                         .head_dim = r->head_dim, .rot_dim = r->rot_dim, .interleaved = r->interleaved,
                         .inv_freq = r->inv_freq, .k_cache = kv_k(c, layer), .v_cache = kv_v(c, layer),
                         .block_size = c->kv.block_size, .kv8 = kv8_of(c, layer) };
    run(c, sf_cpu_rope_kv_task, &a, (int64_t)c->T * (H + 2 * Hkv) * r->head_dim * 4);
    return SF_OK;
}

static int cpu_attention(sf_backend *b, const sf_buf *qkv, int layer, int H, int Hkv, const sf_rope *r, sf_buf *out)
{
    cpu_ctx *c = CTX(b);
    int rc = check_heads(c, "attention", qkv, layer, H, Hkv, r);
    if (rc) return rc;
    if (out->rows < c->T || out->cols != (int64_t)H * r->head_dim)
        return BAD("attention: out is %lld x %lld, need %d x %d", (long long)out->rows, (long long)out->cols, c->T, H * r->head_dim);
    if (ensure_scratch(c, sf_cpu_attention_scratch(H, Hkv, r->head_dim, c->kv.block_size)))
        return (SF_LOGE("attention: out of memory"), SF_ENOMEM);
    sf_cpu_attention a = { .qkv = qkv->data, .out = out->data, .T = c->T, .S = c->S, .pos = c->pos,
                           .seq_start = c->seq_start, .block_table = c->block_table, .max_blocks = c->max_blocks,
                           .n_heads = H, .n_kv_heads = Hkv, .head_dim = r->head_dim, .scale = r->attn_scale,
                           .k_cache = kv_k(c, layer), .v_cache = kv_v(c, layer), .block_size = c->kv.block_size,
                           .kv8 = kv8_of(c, layer), .scratch = c->scratch, .scratch_floats = c->scratch_floats };
    int64_t ctx_sum = 0;
    for (int t = 0; t < c->T; t++) ctx_sum += c->pos[t] + 1;
    run(c, sf_cpu_attention_task, &a, ctx_sum * H * r->head_dim * 2);
    return SF_OK;
}

static int cpu_silu_mul(sf_backend *b, const sf_buf *gu, int n, int f, sf_buf *out)
{
    cpu_ctx *c = CTX(b);
    if (n < 1 || f < 1 || n > gu->rows || n > out->rows || gu->cols != 2 * (int64_t)f || out->cols != f)
        return BAD("silu_mul: gu %lld x %lld and out %lld x %lld do not fit %d rows of %d", (long long)gu->rows,
                   (long long)gu->cols, (long long)out->rows, (long long)out->cols, n, f);
    sf_cpu_silu_mul a = { .gu = gu->data, .out = out->data, .n = n, .f = f };
    run(c, sf_cpu_silu_mul_task, &a, (int64_t)n * f * 8);
    return SF_OK;
}

static int cpu_get_rows(sf_backend *b, const sf_buf *x, sf_buf *out)
{
    cpu_ctx *c = CTX(b);
    if (!c->have_batch) return BAD("get_rows: no batch (call batch_begin first)");
    if (out->rows < c->L || out->cols != x->cols || x->rows < c->T)
        return BAD("get_rows: %d rows of %lld into %lld x %lld", c->L, (long long)x->cols, (long long)out->rows, (long long)out->cols);
    sf_cpu_get_rows(x->data, (int)x->cols, c->logit_rows, c->L, out->data);
    return SF_OK;
}

static int cpu_read_f32(sf_backend *b, const sf_buf *buf, int n, float *host)
{
    if (n < 0 || n > buf->rows) return BAD("read_f32: %d rows from a buffer of %lld", n, (long long)buf->rows);
    memcpy(host, buf->data, (size_t)n * buf->cols * sizeof(float));
    return SF_OK;
}

static int cpu_write_f32(sf_backend *b, sf_buf *buf, int n, const float *host)
{
    if (n < 0 || n > buf->rows) return BAD("write_f32: %d rows into a buffer of %lld", n, (long long)buf->rows);
    memcpy(buf->data, host, (size_t)n * buf->cols * sizeof(float));
    return SF_OK;
}

static void sample_scratch_free(cpu_ctx *c)
{
    for (int i = 0; c->sample && i < c->n_threads; i++) {
        free(c->sample[i].x);
        free(c->sample[i].key);
        free(c->sample[i].mass);
    }
    free(c->sample);
    c->sample = NULL;
    c->sample_vocab = 0;
}

/* The reference sampler (kernels/cpu/sample.c) over rows of the logits, one row per thread. */
static int cpu_sample(sf_backend *b, const sf_buf *logits, int n, int vocab, const sf_sample_row *rows,
                      const sf_sample_pen *pen, int n_pen, int32_t *ids, sf_sample_lp *lp)
{
    cpu_ctx *c = CTX(b);
    if (n < 0 || n > logits->rows || vocab < 1 || vocab > logits->cols)
        return BAD("sample: %d rows of %d tokens from a buffer of %lld x %lld", n, vocab, (long long)logits->rows,
                   (long long)logits->cols);
    for (int i = 0; i < n; i++) {
        const sf_sample_row *r = &rows[i];
        if (r->n_pen < 0 || r->pen_off < 0 || (int64_t)r->pen_off + r->n_pen > n_pen)
            return BAD("sample: row %d has penalty entries [%d, +%d) of %d", i, r->pen_off, r->n_pen, n_pen);
        for (int j = 0; j < r->n_pen; j++)
            if (pen[r->pen_off + j].id < 0 || pen[r->pen_off + j].id >= vocab)
                return BAD("sample: row %d penalizes token %d, outside the vocabulary [0, %d)", i,
                           pen[r->pen_off + j].id, vocab);
        if (!sf_sample_allow_ok(r->allow, vocab))
            return BAD("sample: row %d allows no token of the vocabulary [0, %d)", i, vocab);
        if (r->logprobs < 0 || r->logprobs > 1 + SF_SAMPLE_TOP_MAX || (r->logprobs && !lp))
            return BAD("sample: row %d asks for logprobs %d (0..%d, with somewhere to put them)", i, r->logprobs,
                       1 + SF_SAMPLE_TOP_MAX);
    }
    if (vocab > c->sample_vocab) {
        sample_scratch_free(c);
        if (!(c->sample = calloc((size_t)c->n_threads, sizeof *c->sample))) goto oom;
        for (int i = 0; i < c->n_threads; i++) {
            sf_cpu_sample_scratch *s = &c->sample[i];
            s->x = malloc((size_t)vocab * sizeof *s->x);
            s->key = malloc((size_t)vocab * sizeof *s->key);
            s->mass = malloc((size_t)vocab * sizeof *s->mass);
            if (!s->x || !s->key || !s->mass) goto oom;
        }
        c->sample_vocab = vocab;
    }
    sf_cpu_sample a = { .logits = logits->data, .ld = logits->cols, .n = n, .vocab = vocab, .rows = rows, .pen = pen,
                        .ids = ids, .lp = lp, .scratch = c->sample };
    run(c, sf_cpu_sample_task, &a, (int64_t)n * vocab * 4);
    if (n > c->cap_last) {
        int32_t *t = realloc(c->last_ids, (size_t)n * sizeof *t);
        if (!t) goto oom;
        c->last_ids = t;
        c->cap_last = n;
    }
    if (n) memcpy(c->last_ids, ids, (size_t)n * sizeof *ids); /* a step may draw no row (all scored) */
    c->n_last = n;
    return SF_OK;
oom:
    sample_scratch_free(c);
    SF_LOGE("cpu backend: sample: out of memory for %d threads' scratch of %d tokens", c->n_threads, vocab);
    return SF_ENOMEM;
}

static int cpu_sync(sf_backend *b) { return SF_OK; }

/* Async scheduling: the draw is synchronous here (sample writes the ids), so nothing is ever
 * queued; batches may still take their tokens from the last draw (src_row). */
static int cpu_score(sf_backend *b, const sf_buf *logits, int row0, int n, int vocab, const int32_t *targets, int k,
                     float *lp, int32_t *rank, int32_t *top_id, float *top_lp)
{
    cpu_ctx *c = CTX(b);
    if (row0 < 0 || n < 0 || row0 + n > logits->rows || vocab < 1 || vocab > logits->cols || k < 0 || k > 20)
        return BAD("score: rows [%d, +%d) of %d tokens, top %d, from a buffer of %lld x %lld", row0, n, vocab, k,
                   (long long)logits->rows, (long long)logits->cols);
    for (int i = 0; i < n; i++)
        if (targets[i] < 0 || targets[i] >= vocab) return BAD("score: row %d's token %d is outside [0, %d)", i, targets[i], vocab);
    sf_cpu_score a = { .logits = logits->data + (size_t)row0 * logits->cols, .ld = logits->cols, .n = n, .vocab = vocab,
                       .k = k, .targets = targets, .lp = lp, .rank = rank, .top_id = top_id, .top_lp = top_lp };
    run(c, sf_cpu_score_task, &a, (int64_t)n * vocab * 4);
    return SF_OK;
}

static int cpu_sample_defer(sf_backend *b, int on) { return SF_OK; }
static int cpu_sample_take(sf_backend *b)
{
    cpu_ctx *c = CTX(b);
    if (!c->fail_take || ++c->n_take != c->fail_take) return SF_OK;
    SF_LOGE("cpu backend: sample_take: failure %ld injected ($SEMFLOW_CPU_FAIL_TAKE)", c->n_take);
    return SF_ERROR;
}

static int cpu_buf_raw(sf_backend *b, sf_buf *buf, void **data, sf_dtype *dt, void **stream)
{
    *data = buf->data;
    *dt = SF_DT_F32;
    *stream = NULL;
    return SF_OK;
}

static const sf_hw_info *cpu_hw(sf_backend *b) { return &CTX(b)->hw; }

static void cpu_destroy(sf_backend *b)
{
    if (!b) return;
    cpu_ctx *c = CTX(b);
    if (c) {
        sf_cpu_pool_free(c->pool);
        kv_release(c);
        free(c->scratch);
        free(c->xq);
        sample_scratch_free(c);
        free(c->tokens); free(c->last_ids); free(c->pos); free(c->slot); free(c->seq_start); free(c->seq_ctx);
        free(c->block_table); free(c->logit_rows);
        free(c);
    }
    free(b);
}

static const struct sf_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .hw = cpu_hw,
    .weight_new = cpu_weight_new,
    .weight_free = cpu_weight_free,
    .buf_new = cpu_buf_new,
    .buf_free = cpu_buf_free,
    .kv_init = cpu_kv_init,
    .kv_block_bytes = cpu_kv_block_bytes,
    .batch_begin = cpu_batch_begin,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .rope_kv = cpu_rope_kv,
    .attention = cpu_attention,
    .silu_mul = cpu_silu_mul,
    .get_rows = cpu_get_rows,
    .read_f32 = cpu_read_f32,
    .sync = cpu_sync,
    .kv_copy_out = cpu_kv_copy_out,
    .kv_copy_in = cpu_kv_copy_in,
    .kv_copy_blocks = cpu_kv_copy_blocks,
    .write_f32 = cpu_write_f32,
    .buf_raw = cpu_buf_raw,
    .sample = cpu_sample,
    .score = cpu_score,
    .sample_defer = cpu_sample_defer,
    .sample_take = cpu_sample_take,
};

int sf_backend_cpu_new(const sf_backend_opts *o, sf_backend **out, sf_error *err)
{
    *out = NULL;
    sf_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return sf_err(err, SF_ENOMEM, "cpu backend: out of memory");
    }
    b->ops = &cpu_ops;
    b->ctx = c;
    int rc = sf_hal_cpu_probe(&c->hw, 0, err);
    if (rc) goto fail;
    c->n_threads = o && o->n_threads > 0 ? o->n_threads : c->hw.n_cores;
    c->hw.n_threads = c->n_threads;
    c->fail_take = sf_env_long("SEMFLOW_CPU_FAIL_TAKE", 0, 0, LONG_MAX);
    rc = sf_cpu_pool_new(c->n_threads, &c->pool, err);
    if (rc) goto fail;
    SF_LOGD("cpu backend: %d threads, %s, avx2 %s", c->n_threads, c->hw.name, sf_cpu_has_avx2() ? "yes" : "no");
    *out = b;
    return SF_OK;
fail:
    cpu_destroy(b);
    return sf_err_wrap(err, "cpu backend");
}
