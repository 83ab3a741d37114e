/* model.c — sf_model_load dispatch (folder / .gguf / demo / preset), model lifetime, shape
 * validation, RoPE frequencies, and dummy (random) weights. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model-impl.h"
#include "tokenizer.h"

/* ---- small helpers ---------------------------------------------------------------------- */
size_t sf_ld_elem_size(sf_dtype t)
{
    switch (t) {
    case SF_DT_F32: return 4;
    case SF_DT_F16:
    case SF_DT_BF16: return 2;
    default: return 0;
    }
}

size_t sf_ld_tensor_bytes(sf_dtype t, int64_t rows, int64_t cols)
{
    if (rows < 0 || cols < 0 || (cols && (uint64_t)rows > (UINT64_MAX >> 8) / (uint64_t)cols)) return 0;
    if (t == SF_DT_Q8_0) return cols % 32 ? 0 : (size_t)(rows * (cols / 32) * 34);
    return (size_t)(rows * cols) * sf_ld_elem_size(t);
}

const char *sf_ld_dtype_name(sf_dtype t)
{
    static const char *names[] = { "F32", "F16", "BF16", "Q8_0", "I32", "I8" };
    return (unsigned)t < SF_ARRAY_LEN(names) ? names[t] : "?";
}

sf_model *sf_model_alloc(sf_error *err)
{
    sf_model *m = calloc(1, sizeof *m);
    if (!m) sf_err(err, SF_ENOMEM, "out of memory allocating the model");
    return m;
}

int sf_model_add_map(sf_model *m, void *addr, size_t len, sf_error *err)
{
    sf_mapping *n = realloc(m->maps, (size_t)(m->n_maps + 1) * sizeof *n);
    if (!n) {
        munmap(addr, len);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    m->maps = n;
    m->maps[m->n_maps].addr = addr;
    m->maps[m->n_maps].len = len;
    m->n_maps++;
    return SF_OK;
}

int sf_model_add_owned(sf_model *m, void *p, sf_error *err)
{
    void **n = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *n);
    if (!n) {
        free(p);
        return sf_err(err, SF_ENOMEM, "out of memory");
    }
    m->owned = n;
    m->owned[m->n_owned++] = p;
    return SF_OK;
}

int sf_model_alloc_layers(sf_model *m, sf_error *err)
{
    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    return m->layers ? SF_OK : sf_err(err, SF_ENOMEM, "out of memory allocating %d layers", m->cfg.n_layers);
}

void sf_model_set_name(sf_model *m, const char *path, const char *ext)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    const char *b = strrchr(buf, '/');
    b = b ? b + 1 : buf;
    snprintf(m->name, sizeof m->name, "%s", b);
    size_t ln = strlen(m->name), le = ext ? strlen(ext) : 0;
    if (le && ln > le && !strcmp(m->name + ln - le, ext)) m->name[ln - le] = 0;
    snprintf(m->path, sizeof m->path, "%s", path);
}

int sf_map_file(const char *path, void **addr, size_t *len, sf_error *err)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *addr = NULL;
    *len = 0;
    if (fd < 0)
        return sf_err(err, errno == ENOENT ? SF_ENOTFOUND : SF_EIO, "open %s: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sf_err(err, SF_EIO, "stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sf_err(err, SF_EINVAL, "%s is not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return sf_err(err, SF_EFORMAT, "%s is empty (0 bytes): the download is incomplete", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return sf_err(err, SF_EIO, "mmap %s (%lld bytes): %s", path, (long long)st.st_size, strerror(e));
    *addr = p;
    *len = (size_t)st.st_size;
    return SF_OK;
}

void sf_model_free(sf_model *m)
{
    if (!m) return;
    if (m->tok) sf_tok_free(m->tok);
    for (int i = 0; i < m->n_maps; i++) munmap(m->maps[i].addr, m->maps[i].len);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->maps);
    free(m->owned);
    free(m->layers);
    free(m);
}

/* ---- validation ------------------------------------------------------------------------- */
static int check_view(const sf_view *v, const char *what, int layer, int64_t rows, int64_t cols,
                      int norm, sf_error *err)
{
    char name[64];
    if (layer >= 0) snprintf(name, sizeof name, "layer %d %s", layer, what);
    else snprintf(name, sizeof name, "%s", what);
    if (!v->data) return sf_err(err, SF_ENOTFOUND, "model weight %s is missing", name);
    if (v->rows != rows || v->cols != cols)
        return sf_err(err, SF_EFORMAT, "model weight %s has shape [%lld, %lld], expected [%lld, %lld]",
                      name, (long long)v->rows, (long long)v->cols, (long long)rows, (long long)cols);
    if (v->dtype != SF_DT_F32 && v->dtype != SF_DT_F16 && v->dtype != SF_DT_BF16 &&
        !(v->dtype == SF_DT_Q8_0 && !norm && cols % 32 == 0))
        return sf_err(err, SF_EUNSUPPORTED, "model weight %s has dtype %s, which is not supported there",
                      name, sf_ld_dtype_name(v->dtype));
    return SF_OK;
}

int sf_model_validate(const sf_model *m, sf_error *err)
{
    const sf_model_config *c = &m->cfg;
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int rc;
    if (c->n_layers <= 0 || c->hidden <= 0 || c->n_heads <= 0 || c->n_kv_heads <= 0 ||
        c->head_dim <= 0 || c->vocab_size <= 0 || c->intermediate <= 0 || c->n_heads % c->n_kv_heads)
        return sf_err(err, SF_EFORMAT, "model configuration is inconsistent (layers %d, hidden %d, heads "
                      "%d/%d, head_dim %d, vocab %d, intermediate %d)", c->n_layers, c->hidden,
                      c->n_heads, c->n_kv_heads, c->head_dim, c->vocab_size, c->intermediate);
    if (!m->layers) return sf_err(err, SF_EINVAL, "model has no layers allocated");
    if ((rc = check_view(&m->tok_embd, "token embedding", -1, c->vocab_size, h, 0, err)) ||
        (rc = check_view(&m->out_norm, "output norm", -1, 1, h, 1, err)) ||
        (rc = check_view(&m->lm_head, "lm_head", -1, c->vocab_size, h, 0, err)))
        return rc;
    for (int i = 0; i < c->n_layers; i++) {
        const sf_layer_w *l = &m->layers[i];
        if ((rc = check_view(&l->attn_norm, "attn_norm", i, 1, h, 1, err)) ||
            (rc = check_view(&l->wq, "q_proj", i, q, h, 0, err)) ||
            (rc = check_view(&l->wk, "k_proj", i, kv, h, 0, err)) ||
            (rc = check_view(&l->wv, "v_proj", i, kv, h, 0, err)) ||
            (rc = check_view(&l->wo, "o_proj", i, h, q, 0, err)) ||
            (rc = check_view(&l->ffn_norm, "ffn_norm", i, 1, h, 1, err)) ||
            (rc = check_view(&l->wgate, "gate_proj", i, c->intermediate, h, 0, err)) ||
            (rc = check_view(&l->wup, "up_proj", i, c->intermediate, h, 0, err)) ||
            (rc = check_view(&l->wdown, "down_proj", i, h, c->intermediate, 0, err)))
            return rc;
        if (c->attention_bias &&
            ((rc = check_view(&l->bq, "q_proj bias", i, 1, q, 1, err)) ||
             (rc = check_view(&l->bk, "k_proj bias", i, 1, kv, 1, err)) ||
             (rc = check_view(&l->bv, "v_proj bias", i, 1, kv, 1, err))))
            return rc;
    }
    return SF_OK;
}

/* ---- RoPE ------------------------------------------------------------------------------- */
void sf_rope_inv_freq(const sf_model_config *cfg, float *inv_freq)
{
    int d = cfg->head_dim;
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < d / 2; i++) {
        /* computed as HF does: fp32 exponent, then 1 / base^x */
        float x = (float)(2 * i) / (float)d;
        double f = 1.0 / pow((double)cfg->rope_theta, (double)x);
        if (cfg->rope_scaling == SF_ROPE_SCALING_LINEAR && cfg->rope_factor > 0) {
            f /= cfg->rope_factor;
        } else if (cfg->rope_scaling == SF_ROPE_SCALING_LLAMA3) {
            double old = cfg->rope_orig_max_pos, lo = cfg->rope_low_freq_factor,
                   hi = cfg->rope_high_freq_factor, fac = cfg->rope_factor;
            double lo_wl = old / lo, hi_wl = old / hi, wl = 2 * pi / f;
            if (wl < hi_wl) {
                /* high frequency: unchanged */
            } else if (wl > lo_wl) {
                f /= fac;
            } else {
                double smooth = (old / wl - lo) / (hi - lo);
                f = (1 - smooth) * f / fac + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

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

typedef struct dummy_job {
    uint8_t *dst;
    size_t len;
    size_t src_off;           /* where in the random block this tensor starts */
    int norm;                 /* fill with 1.0 */
} dummy_job;

typedef struct dummy_ctx {
    dummy_job *jobs;
    int n_jobs;
    atomic_int next;
    atomic_size_t done;
    const uint8_t *block;
    size_t block_len;
    sf_dtype dt;
    uint8_t one[4];           /* 1.0 in dt */
} dummy_ctx;

static void dummy_run_job(dummy_ctx *c, const dummy_job *j)
{
    size_t es = sf_ld_elem_size(c->dt);
    if (j->norm) {
        for (size_t i = 0; i < j->len; i += es) memcpy(j->dst + i, c->one, es);
        return;
    }
    size_t off = j->src_off % c->block_len, pos = 0;
    while (pos < j->len) {
        size_t n = SF_MIN(j->len - pos, c->block_len - off);
        memcpy(j->dst + pos, c->block + off, n);
        pos += n;
        off = 0;
    }
}

static void *dummy_worker(void *arg)
{
    dummy_ctx *c = arg;
    for (;;) {
        int i = atomic_fetch_add(&c->next, 1);
        if (i >= c->n_jobs) break;
        dummy_run_job(c, &c->jobs[i]);
        atomic_fetch_add(&c->done, c->jobs[i].len);
    }
    return NULL;
}

static size_t host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (size_t)pages * (size_t)psz : 0;
}

int sf_model_fill_dummy(sf_model *m, sf_dtype dt, uint64_t seed, int progress, sf_error *err)
{
    const sf_model_config *c = &m->cfg;
    size_t es = sf_ld_elem_size(dt);
    int64_t h = c->hidden, q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
    int n_views = 3 + c->n_layers * 12, nv = 0, rc = SF_OK;
    struct { sf_view *v; int64_t rows, cols; int norm; } *views = NULL;
    dummy_ctx ctx = { 0 };
    pthread_t th[32];
    int n_th = 0;
    uint8_t *block = NULL;
    if (!es) return sf_err(err, SF_EUNSUPPORTED, "dummy weights can be F32, F16 or BF16, not %s", sf_ld_dtype_name(dt));
    views = calloc((size_t)n_views, sizeof *views);
    if (!views) return sf_err(err, SF_ENOMEM, "out of memory");
#define ADD(V, R, C, N) do { views[nv].v = (V); views[nv].rows = (R); views[nv].cols = (C); views[nv].norm = (N); nv++; } while (0)
    ADD(&m->tok_embd, c->vocab_size, h, 0);
    ADD(&m->out_norm, 1, h, 1);
    if (!c->tie_embeddings) ADD(&m->lm_head, c->vocab_size, h, 0);
    for (int i = 0; i < c->n_layers; i++) {
        sf_layer_w *l = &m->layers[i];
        ADD(&l->attn_norm, 1, h, 1);
        ADD(&l->wq, q, h, 0);
        ADD(&l->wk, kv, h, 0);
        ADD(&l->wv, kv, h, 0);
        ADD(&l->wo, h, q, 0);
        if (c->attention_bias) {
            ADD(&l->bq, 1, q, 0);
            ADD(&l->bk, 1, kv, 0);
            ADD(&l->bv, 1, kv, 0);
        }
        ADD(&l->ffn_norm, 1, h, 1);
        ADD(&l->wgate, c->intermediate, h, 0);
        ADD(&l->wup, c->intermediate, h, 0);
        ADD(&l->wdown, h, c->intermediate, 0);
    }
#undef ADD
    size_t total = 0, max_t = 0;
    for (int i = 0; i < nv; i++) {
        size_t b = (size_t)(views[i].rows * views[i].cols) * es;
        total += b;
        max_t = SF_MAX(max_t, b);
    }
    size_t ram = host_ram();
    if (ram && total > ram / 10 * 9) {
        rc = sf_err(err, SF_ENOMEM,
                    "dummy weights for this model need %.1f GiB but the host has %.1f GiB of RAM; pick "
                    "a smaller preset or model", (double)total / (1 << 30), (double)ram / (1 << 30));
        goto cleanup;
    }
    /* one random block (at most 64 MiB, ~U(-a, a) with std 0.02), repeated with per-tensor
     * offsets: filling an 8B model is then a memcpy at memory bandwidth */
    ctx.block_len = SF_MIN((size_t)DUMMY_BLOCK, max_t) / es * es;
    block = malloc(ctx.block_len);
    if (!block) {
        rc = sf_err(err, SF_ENOMEM, "out of memory (%zu bytes for the random block)", ctx.block_len);
        goto cleanup;
    }
    sf_rng rng;
    sf_rng_seed(&rng, seed);
    const float a = 0.02f * 1.7320508f;
    for (size_t i = 0; i < ctx.block_len / es; i += 4) {
        uint64_t r = sf_rng_next(&rng);
        for (size_t k = 0; k < 4 && i + k < ctx.block_len / es; k++) {
            float x = ((float)((r >> (16 * k)) & 0xffff) / 32768.0f - 1.0f) * a;
            if (dt == SF_DT_F32) memcpy(block + (i + k) * 4, &x, 4);
            else {
                uint16_t hv = dt == SF_DT_BF16 ? sf_f32_to_bf16(x) : sf_f32_to_f16(x);
                memcpy(block + (i + k) * 2, &hv, 2);
            }
        }
    }
    float one = 1.0f;
    if (dt == SF_DT_F32) memcpy(ctx.one, &one, 4);
    else {
        uint16_t hv = dt == SF_DT_BF16 ? sf_f32_to_bf16(one) : sf_f32_to_f16(one);
        memcpy(ctx.one, &hv, 2);
    }
    ctx.block = block;
    ctx.dt = dt;
    /* allocate each tensor, cut it into jobs of DUMMY_CHUNK */
    size_t n_jobs = 0;
    for (int i = 0; i < nv; i++) {
        size_t b = (size_t)(views[i].rows * views[i].cols) * es;
        n_jobs += (b + DUMMY_CHUNK - 1) / DUMMY_CHUNK;
    }
    ctx.jobs = calloc(n_jobs, sizeof *ctx.jobs);
    if (!ctx.jobs) {
        rc = sf_err(err, SF_ENOMEM, "out of memory");
        goto cleanup;
    }
    for (int i = 0; i < nv; i++) {
        size_t b = (size_t)(views[i].rows * views[i].cols) * es;
        /* anonymous mappings with transparent huge pages: 512x fewer page faults than 4 KiB
         * pages, which is most of the cost of filling gigabytes */
        size_t len = (b + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            rc = sf_err(err, SF_ENOMEM, "out of memory mapping %zu bytes of dummy weights: %s", b, strerror(errno));
            goto cleanup;
        }
        madvise(p, len, MADV_HUGEPAGE);
        if ((rc = sf_model_add_map(m, p, len, err))) goto cleanup;
        views[i].v->data = p;
        views[i].v->dtype = dt;
        views[i].v->rows = views[i].rows;
        views[i].v->cols = views[i].cols;
        size_t src_off = ((uint64_t)i * 0x9e3779b97f4a7c15ull >> 20) % ctx.block_len / es * es;
        for (size_t o = 0; o < b; o += DUMMY_CHUNK) {
            dummy_job *j = &ctx.jobs[ctx.n_jobs++];
            j->dst = p + o;
            j->len = SF_MIN((size_t)DUMMY_CHUNK, b - o);
            j->src_off = src_off + o;
            j->norm = views[i].norm;
        }
    }
    if (c->tie_embeddings) m->lm_head = m->tok_embd;
    m->weight_bytes = total;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int want = (int)SF_MIN(SF_MAX(ncpu, 1), (long)SF_ARRAY_LEN(th));
    if (total < (64u << 20)) want = 1;
    for (int i = 1; i < want; i++)
        if (pthread_create(&th[n_th], NULL, dummy_worker, &ctx) == 0) n_th++;
    sf_progress pg;
    sf_progress_begin(&pg, "dummy weights", total, progress);
    for (;;) {
        int i = atomic_fetch_add(&ctx.next, 1);
        if (i >= ctx.n_jobs) break;
        dummy_run_job(&ctx, &ctx.jobs[i]);
        size_t d = atomic_fetch_add(&ctx.done, ctx.jobs[i].len) + ctx.jobs[i].len;
        if (d > pg.done) sf_progress_add(&pg, d - pg.done);
    }
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    n_th = 0;
    sf_progress_add(&pg, total - pg.done);
    sf_progress_end(&pg);
    m->cfg.dtype = dt;
    m->random_weights = 1;
cleanup:
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    free(ctx.jobs);
    free(block);
    free(views);
    return rc;
}

static int load_dummy(const char *path, const sf_model_config *preset, const sf_load_opts *o,
                      sf_model **out, sf_error *err)
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
    /* dummy_dtype 0 (F32, the zero value of the options) means the default, BF16 */
    sf_dtype dt = o && o->dummy_dtype == SF_DT_F16 ? SF_DT_F16 : SF_DT_BF16;
    if ((rc = sf_model_fill_dummy(m, dt, o ? o->seed : 0, o ? o->progress : 0, err))) goto cleanup;
    if (!preset) {
        snprintf(fn, sizeof fn, "%s/tokenizer.json", path);
        if (access(fn, R_OK) == 0 && (rc = sf_tok_load_dir(path, &m->tok, err))) goto cleanup;
    }
    if ((rc = sf_model_validate(m, err))) goto cleanup;
    SF_LOGI("%s: dummy weights (random values, outputs are meaningless): %.1f MiB %s", m->name,
            (double)m->weight_bytes / (1 << 20), sf_ld_dtype_name(dt));
    *out = m;
    m = NULL;
    rc = SF_OK;
cleanup:
    free(text);
    sf_model_free(m);
    return rc;
}

/* ---- dispatch ----------------------------------------------------------------------------- */
int sf_model_load(const char *path, const sf_load_opts *o, sf_model **out, sf_error *err)
{
    struct stat st;
    int rc;
    *out = NULL;
    if (!path || !*path) return sf_err(err, SF_EINVAL, "no model given (--model FOLDER|FILE.gguf|demo)");
    if (!strncmp(path, "preset:", 7)) {
        sf_model_config cfg;
        if ((rc = sf_model_preset_config(path + 7, &cfg, err))) return rc;
        return load_dummy(path, &cfg, o, out, err);
    }
    if (!strcmp(path, "demo") && stat(path, &st) != 0) {
        char dir[1024];
        if ((rc = sf_demo_path(dir, sizeof dir, err))) return rc;
        if ((rc = sf_model_load_hf(dir, o, out, err))) return sf_err_wrap(err, "demo model");
        (*out)->random_weights = 1;
        snprintf((*out)->name, sizeof (*out)->name, "demo");
        return SF_OK;
    }
    if (stat(path, &st) != 0)
        return sf_err(err, SF_ENOTFOUND,
                      "model '%s' not found: give a Hugging Face folder (config.json + *.safetensors), "
                      "a .gguf file, 'demo' or 'preset:NAME'", path);
    if (S_ISDIR(st.st_mode)) {
        if (o && o->dummy) return load_dummy(path, NULL, o, out, err);
        return sf_model_load_hf(path, o, out, err);
    }
    if (S_ISREG(st.st_mode)) {
        if (o && o->dummy)
            return sf_err(err, SF_EINVAL, "%s: dummy weights need a folder with config.json, not a file", path);
        return sf_model_load_gguf(path, o, out, err);
    }
    return sf_err(err, SF_EINVAL, "%s is neither a folder nor a file", path);
}
