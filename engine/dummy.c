/* dummy.c — dummy (random) weights of the right shapes, from a config.json or a built-in
 * preset: for memory and speed measurements without a download. One random block of at most
 * 64 MiB per stored format is generated and repeated with a per-tensor offset by several
 * threads, so filling is bound by page faults and memory bandwidth, not by the random number
 * generator. The format (sf_load_opts.dummy_format) is bf16 or f16 for every tensor, or one
 * of GGUF's block formats for the matrices (norms and biases f32, as GGUF files keep them):
 * q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, or llama.cpp's
 * mixes q4_k_m and q5_k_m (with q6_k). */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model-impl.h"
#include "shard.h"
#include "tokenizer.h"

/* ---- presets ------------------------------------------------------------------------------ */
static const struct {
    const char *name;
    sf_model_config c;
} presets[] = {
    { "llama-3-8b", { .arch = "llama", .vocab_size = 128256, .hidden = 4096, .intermediate = 14336,
                      .n_layers = 32, .n_heads = 32, .n_kv_heads = 8, .head_dim = 128, .max_pos = 8192,
                      .rms_eps = 1e-5f, .rope_theta = 500000.0f, .rope_factor = 1.0f, .bos_id = 128000,
                      .eos_ids = { 128001, 128009 }, .n_eos = 2, .dtype = SF_DT_BF16 } },
    { "qwen2-7b", { .arch = "qwen2", .vocab_size = 152064, .hidden = 3584, .intermediate = 18944,
                    .n_layers = 28, .n_heads = 28, .n_kv_heads = 4, .head_dim = 128, .max_pos = 32768,
                    .rms_eps = 1e-6f, .rope_theta = 1000000.0f, .rope_factor = 1.0f, .attention_bias = 1,
                    .bos_id = 151643, .eos_ids = { 151643, 151645 }, .n_eos = 2, .dtype = SF_DT_BF16 } },
    { "llama-3-70b", { .arch = "llama", .vocab_size = 128256, .hidden = 8192, .intermediate = 28672,
                       .n_layers = 80, .n_heads = 64, .n_kv_heads = 8, .head_dim = 128, .max_pos = 8192,
                       .rms_eps = 1e-5f, .rope_theta = 500000.0f, .rope_factor = 1.0f, .bos_id = 128000,
                       .eos_ids = { 128001, 128009 }, .n_eos = 2, .dtype = SF_DT_BF16 } },
    { "1b", { .arch = "llama", .vocab_size = 32000, .hidden = 2048, .intermediate = 5632, .n_layers = 22,
              .n_heads = 32, .n_kv_heads = 4, .head_dim = 64, .max_pos = 2048, .rms_eps = 1e-5f,
              .rope_theta = 10000.0f, .rope_factor = 1.0f, .bos_id = 1, .eos_ids = { 2 }, .n_eos = 1,
              .dtype = SF_DT_BF16 } },
};

int sf_model_preset_config(const char *name, sf_model_config *cfg, sf_error *err)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(presets); i++) {
        if (strcmp(name, presets[i].name)) continue;
        *cfg = presets[i].c;
        return SF_OK;
    }
    return sf_err(err, SF_ENOTFOUND, "unknown preset '%s' (known: llama-3-8b, qwen2-7b, llama-3-70b, 1b)", name);
}

/* ---- dummy weights ------------------------------------------------------------------------ */
#define DUMMY_BLOCK (64u << 20)
#define DUMMY_CHUNK (16u << 20)

/* the random bytes of one stored format, and 1.0 in it (float formats) */
typedef struct dummy_src {
    sf_dtype dt;
    uint8_t *block;
    size_t len;               /* a whole number of elements (blocks of a block format) */
    size_t unit;              /* bytes of an element or block: offsets into block are multiples */
    uint8_t one[4];
} dummy_src;

typedef struct dummy_job {
    uint8_t *dst;
    size_t len;
    size_t src_off;           /* where in the random block this tensor starts */
    const dummy_src *src;
    int norm;                 /* fill with 1.0 */
    int64_t rows;             /* rows segments of len bytes, pitch apart (a column slice); 1: one */
    size_t pitch;
} dummy_job;

typedef struct dummy_ctx {
    dummy_job *jobs;
    int n_jobs;
    atomic_int next;
    atomic_size_t done;
} dummy_ctx;

static void dummy_run_job(const dummy_job *j)
{
    const dummy_src *s = j->src;
    for (int64_t r = 0; r < j->rows; r++) {
        uint8_t *dst = j->dst + (size_t)r * j->pitch;
        if (j->norm) {
            for (size_t i = 0; i < j->len; i += s->unit) memcpy(dst + i, s->one, s->unit);
            continue;
        }
        size_t off = (j->src_off + (size_t)r * j->pitch) % s->len, pos = 0;
        while (pos < j->len) {
            size_t n = SF_MIN(j->len - pos, s->len - off);
            memcpy(dst + pos, s->block + off, n);
            pos += n;
            off = 0;
        }
    }
}

/* The view of the shard that corresponds to view v of the full model m (same field). */
static const sf_view *shard_view(const sf_model *m, const sf_shard *s, const sf_view *v)
{
    const char *pv = (const char *)v, *pl = (const char *)m->layers;
    if (pv >= pl && pv < pl + (size_t)m->cfg.n_layers * sizeof *m->layers)
        return (const sf_view *)((const char *)s->m.layers + (pv - pl));
    return (const sf_view *)((const char *)&s->m + (pv - (const char *)m));
}

/* Jobs filling the bytes of sub-view sv of tensor p (its src_off), DUMMY_CHUNK at most each. */
static size_t add_jobs(dummy_ctx *ctx, size_t cap, const uint8_t *p, const sf_view *sv, const dummy_src *src,
                       size_t src_off, int norm)
{
    size_t rb = sf_dtype_bytes(sv->dtype, sv->cols), pitch = sf_dtype_bytes(sv->dtype, sv->stride ? sv->stride : sv->cols);
    size_t filled = 0;
    size_t base = (size_t)((const uint8_t *)sv->data - p);
    if (pitch == rb) { /* contiguous */
        size_t b = rb * (size_t)sv->rows;
        for (size_t o = 0; o < b && (size_t)ctx->n_jobs < cap; o += DUMMY_CHUNK) {
            dummy_job *j = &ctx->jobs[ctx->n_jobs++];
            *j = (dummy_job){ .dst = (uint8_t *)p + base + o, .len = SF_MIN((size_t)DUMMY_CHUNK, b - o),
                              .src_off = src_off + base + o, .src = src, .norm = norm, .rows = 1 };
            filled += j->len;
        }
        return filled;
    }
    int64_t per = (int64_t)SF_MAX((size_t)1, DUMMY_CHUNK / rb);
    for (int64_t r = 0; r < sv->rows && (size_t)ctx->n_jobs < cap; r += per) {
        dummy_job *j = &ctx->jobs[ctx->n_jobs++];
        *j = (dummy_job){ .dst = (uint8_t *)p + base + (size_t)r * pitch, .len = rb,
                          .src_off = src_off + base + (size_t)r * pitch, .src = src, .norm = norm,
                          .rows = SF_MIN(per, sv->rows - r), .pitch = pitch };
        filled += rb * (size_t)j->rows;
    }
    return filled;
}

static void *dummy_worker(void *arg)
{
    dummy_ctx *c = arg;
    for (;;) {
        int i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n_jobs) break;
        dummy_run_job(&c->jobs[i]);
        atomic_fetch_add(&c->done, c->jobs[i].len);
    }
    return NULL;
}

static size_t host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

/* ---- formats ------------------------------------------------------------------------------- */
typedef struct dummy_fmt {
    const char *name;
    sf_dtype mat, vec;        /* matrices; norms and biases */
    int k_m;                  /* Q4_K_M, Q5_K_M: Q6_K for the head and some layers' attn_v / ffn_down */
} dummy_fmt;

static const dummy_fmt formats[] = {
    { "bf16", SF_DT_BF16, SF_DT_BF16, 0 }, { "f16", SF_DT_F16, SF_DT_F16, 0 },
    { "q8_0", SF_DT_Q8_0, SF_DT_F32, 0 },  { "q4_k", SF_DT_Q4_K, SF_DT_F32, 0 },
    { "q6_k", SF_DT_Q6_K, SF_DT_F32, 0 },  { "q4_k_m", SF_DT_Q4_K, SF_DT_F32, 1 },
    { "q5_k", SF_DT_Q5_K, SF_DT_F32, 0 },  { "q5_k_m", SF_DT_Q5_K, SF_DT_F32, 1 },
    { "q4_0", SF_DT_Q4_0, SF_DT_F32, 0 },  { "iq4_nl", SF_DT_IQ4_NL, SF_DT_F32, 0 },
    { "iq4_xs", SF_DT_IQ4_XS, SF_DT_F32, 0 }, { "q2_k", SF_DT_Q2_K, SF_DT_F32, 0 },
    { "q3_k", SF_DT_Q3_K, SF_DT_F32, 0 }, { "q4_1", SF_DT_Q4_1, SF_DT_F32, 0 },
    { "q5_0", SF_DT_Q5_0, SF_DT_F32, 0 },  { "q5_1", SF_DT_Q5_1, SF_DT_F32, 0 },
};

static const dummy_fmt *format_find(const char *name)
{
    if (!name || !*name) return &formats[0];
    for (size_t i = 0; i < SF_ARRAY_LEN(formats); i++)
        if (!strcmp(name, formats[i].name)) return &formats[i];
    return NULL;
}

int sf_dummy_format_check(const char *name, sf_error *err)
{
    if (format_find(name)) return SF_OK;
    char names[256] = "";
    for (size_t i = 0; i < SF_ARRAY_LEN(formats); i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", formats[i].name);
    return sf_err(err, SF_EINVAL, "dummy weights come as one of %s; not '%s'", names, name);
}

/* llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps in Q6_K */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* Random bytes of dtype t: floats ~U(-a, a) with std 0.02; blocks of random quants whose
 * scales make the weights' std about 0.02 too. */
static void random_fill(sf_dtype t, uint8_t *p, size_t len, sf_rng *rng)
{
    if (sf_dtype_block(t) > 1) {
        size_t bb = sf_dtype_bytes(t, sf_dtype_block(t));
        for (size_t o = 0; o + bb <= len; o += bb) sf_quant_random_block(t, p + o, rng);
        return;
    }
    size_t es = sf_dtype_bytes(t, 1);
    const float a = 0.02f * 1.7320508f;
    for (size_t i = 0; i < len / es; i += 4) {
        uint64_t r = sf_rng_next(rng);
        for (size_t k = 0; k < 4 && i + k < len / es; k++) {
            float x = ((float)((r >> (16 * k)) & 0xffff) / 32768.0f - 1.0f) * a;
            if (t == SF_DT_F32) memcpy(p + (i + k) * 4, &x, 4);
            else {
                uint16_t hv = t == SF_DT_BF16 ? sf_f32_to_bf16(x) : sf_f32_to_f16(x);
                memcpy(p + (i + k) * 2, &hv, 2);
            }
        }
    }
}

int sf_model_fill_dummy(sf_model *m, const char *format, uint64_t seed, int progress, sf_error *err)
{
    return sf_model_fill_dummy_shard(m, format, seed, progress, 0, 1, err);
}

int sf_model_fill_dummy_shard(sf_model *m, const char *format, uint64_t seed, int progress, int rank, int size,
                              sf_error *err)
{
    const sf_model_config *c = &m->cfg;
    const dummy_fmt *f = format_find(format);
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int n_views = 3 + c->n_layers * 12, nv = 0, rc = SF_OK;
    struct { sf_view *v; int64_t rows, cols; int norm, src; sf_dtype dt; } *views = NULL;
    dummy_src src[3] = { { .dt = SF_DT_COUNT }, { .dt = SF_DT_COUNT }, { .dt = SF_DT_COUNT } };
    dummy_ctx ctx = { 0 };
    pthread_t th[32];
    int n_th = 0;
    if (!f) return sf_dummy_format_check(format, err);
    views = calloc((size_t)n_views, sizeof *views);
    if (!views) return sf_err(err, SF_ENOMEM, "out of memory");
#define ADD(V, R, C, N, T)                                                                                  \
    do {                                                                                                  \
        views[nv].v = (V); views[nv].rows = (R); views[nv].cols = (C); views[nv].norm = (N);             \
        views[nv].dt = (R) == 1 ? f->vec : (T);                                                          \
        nv++;                                                                                             \
    } while (0)
    sf_dtype mat = f->mat, hi = f->k_m ? SF_DT_Q6_K : f->mat;
    ADD(&m->tok_embd, c->vocab_size, h, 0, mat);
    ADD(&m->out_norm, 1, h, 1, mat);
    if (!c->tie_embeddings) ADD(&m->lm_head, c->vocab_size, h, 0, hi);
    for (int i = 0; i < c->n_layers; i++) {
        sf_layer_w *l = &m->layers[i];
        int more = more_bits(i, c->n_layers);
        ADD(&l->attn_norm, 1, h, 1, mat);
        ADD(&l->wq, q, h, 0, mat);
        ADD(&l->wk, kv, h, 0, mat);
        ADD(&l->wv, kv, h, 0, more ? hi : mat);
        ADD(&l->wo, h, q, 0, mat);
        if (c->attention_bias) {
            ADD(&l->bq, 1, q, 0, mat);
            ADD(&l->bk, 1, kv, 0, mat);
            ADD(&l->bv, 1, kv, 0, mat);
        }
        ADD(&l->ffn_norm, 1, h, 1, mat);
        ADD(&l->wgate, c->intermediate, h, 0, mat);
        ADD(&l->wup, c->intermediate, h, 0, mat);
        ADD(&l->wdown, h, c->intermediate, 0, more ? hi : mat);
    }
#undef ADD
    size_t total = 0;
    for (int i = 0; i < nv; i++) {
        int blk = sf_dtype_block(views[i].dt);
        if (views[i].cols % blk) {
            rc = sf_err(err, SF_EINVAL, "dummy %s weights: a tensor of %lld columns is not whole %d-blocks of %s", f->name,
                        (long long)views[i].cols, blk, sf_dtype_name(views[i].dt));
            goto cleanup;
        }
        size_t b = sf_dtype_bytes(views[i].dt, views[i].rows * views[i].cols);
        total += b;
        /* the random block this tensor copies from: one per stored format */
        int k = 0;
        while (k < 3 && src[k].dt != SF_DT_COUNT && src[k].dt != views[i].dt) k++;
        src[k].dt = views[i].dt;
        src[k].len = SF_MAX(src[k].len, SF_MIN((size_t)DUMMY_BLOCK, b));
        views[i].src = k;
    }
    /* each random block (at most 64 MiB) is repeated with per-tensor offsets: filling an 8B
     * model is then a memcpy at memory bandwidth */
    sf_rng rng;
    sf_rng_seed(&rng, seed);
    for (int k = 0; k < 3 && src[k].dt != SF_DT_COUNT; k++) {
        dummy_src *d = &src[k];
        d->unit = sf_dtype_bytes(d->dt, sf_dtype_block(d->dt));
        d->len = SF_MAX(d->len / d->unit, 1) * d->unit;
        if (!(d->block = malloc(d->len))) {
            rc = sf_err(err, SF_ENOMEM, "out of memory (%zu bytes for the random block)", d->len);
            goto cleanup;
        }
        random_fill(d->dt, d->block, d->len, &rng);
        float one = 1.0f;
        if (d->dt == SF_DT_F32) memcpy(d->one, &one, 4);
        else if (d->unit == 2) {
            uint16_t hv = d->dt == SF_DT_BF16 ? sf_f32_to_bf16(one) : sf_f32_to_f16(one);
            memcpy(d->one, &hv, 2);
        }
    }
    /* allocate each tensor, cut it into jobs of DUMMY_CHUNK */
    size_t n_jobs = 0, need = 0;
    for (int i = 0; i < nv; i++)
        n_jobs += (sf_dtype_bytes(views[i].dt, views[i].rows * views[i].cols) + DUMMY_CHUNK - 1) / DUMMY_CHUNK;
    n_jobs = 2 * n_jobs + 2 * (size_t)nv; /* column slices may cut rows into more, smaller jobs */
    ctx.jobs = calloc(n_jobs, sizeof *ctx.jobs);
    if (!ctx.jobs) {
        rc = sf_err(err, SF_ENOMEM, "out of memory");
        goto cleanup;
    }
    for (int i = 0; i < nv; i++) {
        size_t b = sf_dtype_bytes(views[i].dt, views[i].rows * views[i].cols);
        /* anonymous mappings with transparent huge pages: 512x fewer page faults than 4 KiB
         * pages, which is most of the cost of filling gigabytes. Pages never filled (other
         * ranks' slices) are never touched and take no memory. */
        size_t len = (b + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            rc = sf_err(err, SF_ENOMEM, "out of memory mapping %zu bytes of dummy weights: %s", b, strerror(errno));
            goto cleanup;
        }
        madvise(p, len, MADV_HUGEPAGE);
        if ((rc = sf_model_add_map(m, p, len, err))) goto cleanup;
        views[i].v->data = p;
        views[i].v->dtype = views[i].dt;
        views[i].v->rows = views[i].rows;
        views[i].v->cols = views[i].cols;
    }
    if (c->tie_embeddings) m->lm_head = m->tok_embd;
    sf_shard sh;
    memset(&sh, 0, sizeof sh);
    if (size > 1 && (rc = sf_shard_make(m, rank, size, &sh, err))) goto cleanup;
    for (int i = 0; i < nv; i++) {
        const dummy_src *d = &src[views[i].src];
        size_t src_off = ((uint64_t)i * 0x9e3779b97f4a7c15ull >> 20) % d->len / d->unit * d->unit;
        const uint8_t *p = views[i].v->data;
        const sf_view *sv = size > 1 ? shard_view(m, &sh, views[i].v) : views[i].v;
        if (sv->data && sv->rows > 0) need += add_jobs(&ctx, n_jobs, p, sv, d, src_off, views[i].norm);
        /* (a tied head's slice lies in the embedding, which every rank fills whole) */
    }
    sf_shard_free(&sh);
    size_t ram = host_ram();
    if (ram && need > ram / 10 * 9) {
        rc = sf_err(err, SF_ENOMEM,
                    "dummy weights for this model need %.1f GiB%s but the host has %.1f GiB of RAM; pick "
                    "a smaller preset or model%s", (double)need / (1 << 30), size > 1 ? " per rank" : "",
                    (double)ram / (1 << 30), size > 1 ? ", or more ranks" : "");
        goto cleanup;
    }
    m->weight_bytes = total;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int want = (int)SF_MIN(SF_MAX(ncpu, 1), (long)SF_ARRAY_LEN(th));
    if (need < (64u << 20)) want = 1;
    for (int i = 1; i < want; i++)
        if (sf_thread_create(&th[n_th], dummy_worker, &ctx) == 0) n_th++;
    sf_progress pg;
    sf_progress_begin(&pg, "dummy weights", need, progress);
    for (;;) {
        int i = atomic_fetch_add(&ctx.next, 1);
        if (i >= ctx.n_jobs) break;
        dummy_run_job(&ctx.jobs[i]);
        size_t d = atomic_fetch_add(&ctx.done, ctx.jobs[i].len) + ctx.jobs[i].len;
        if (d > pg.done) sf_progress_add(&pg, d - pg.done);
    }
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    n_th = 0;
    sf_progress_add(&pg, need - pg.done);
    sf_progress_end(&pg);
    m->cfg.dtype = f->mat;
    m->random_weights = 1;
cleanup:
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    free(ctx.jobs);
    for (int k = 0; k < 3; k++) free(src[k].block);
    free(views);
    return rc;
}

int sf_model_load_dummy(const char *path, const sf_model_config *preset, const sf_load_opts *o, sf_model **out,
                        sf_error *err)
{
    sf_model *m = NULL;
    char *text = NULL, fn[1200];
    int rc;
    if (!(m = sf_model_alloc(err))) return SF_ENOMEM;
    if (preset) {
        m->cfg = *preset;
        snprintf(m->name, sizeof m->name, "%s", path + strlen("preset:"));
        snprintf(m->path, sizeof m->path, "%s", path);
    } else {
        snprintf(fn, sizeof fn, "%s/config.json", path);
        if ((rc = sf_read_file(fn, &text, NULL, err))) {
            if (rc == SF_ENOTFOUND)
                sf_err(err, rc, "%s: no config.json (dummy weights need a folder with config.json)", path);
            goto cleanup;
        }
        if ((rc = sf_config_parse_json(text, &m->cfg, err))) {
            sf_err_wrap(err, "%s", fn);
            goto cleanup;
        }
        sf_model_set_name(m, path, NULL);
    }
    if ((rc = sf_model_alloc_layers(m, err))) goto cleanup;
    const char *fmt = o && o->dummy_format ? o->dummy_format : "bf16";
    if ((rc = sf_model_fill_dummy_shard(m, fmt, o ? o->seed : 0, o ? o->progress : 0, o ? o->shard_rank : 0,
                                        o ? o->shard_size : 1, err)))
        goto cleanup;
    if (!preset) {
        snprintf(fn, sizeof fn, "%s/tokenizer.json", path);
        if (access(fn, R_OK) == 0 && (rc = sf_tok_load_dir(path, &m->tok, err))) goto cleanup;
    }
    if ((rc = sf_model_validate(m, err))) goto cleanup;
    SF_LOGI("%s: dummy weights (random values, outputs are meaningless): %.1f MiB %s", m->name,
            (double)m->weight_bytes / (1 << 20), fmt);
    *out = m;
    m = NULL;
    rc = SF_OK;
cleanup:
    free(text);
    sf_model_free(m);
    return rc;
}
