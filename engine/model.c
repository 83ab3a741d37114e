/* model.c — sf_model_load dispatch (folder / .gguf / demo / preset), model lifetime, shape
 * validation and RoPE frequencies. Dummy weights live in dummy.c. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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

const char *sf_ld_dtype_name(sf_dtype t)
{
    static const char *names[] = { "F32", "F16", "BF16", "Q8_0", "I32", "I8", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS" };
    _Static_assert(SF_ARRAY_LEN(names) == SF_DT_COUNT, "a name for every dtype");
    return (unsigned)t < SF_ARRAY_LEN(names) ? names[t] : "?";
}

static size_t held_bytes(const sf_view *v, const char *backend)
{
    return v->data ? sf_dtype_bytes(sf_weight_dtype(backend, v->dtype), v->rows * v->cols) : 0;
}

/* the parts of a weight the backend fuses (QKV, gate/up): CUDA keeps their block formats only
 * if it keeps every part's, else the whole weight is bf16 */
static size_t fused_bytes(const sf_view *const *v, int n, const char *backend)
{
    int conv = 0;
    for (int i = 0; i < n; i++) conv |= v[i]->data && sf_weight_dtype(backend, v[i]->dtype) != v[i]->dtype;
    size_t s = 0;
    for (int i = 0; i < n; i++)
        s += conv ? (v[i]->data ? sf_dtype_bytes(SF_DT_BF16, v[i]->rows * v[i]->cols) : 0) : held_bytes(v[i], backend);
    return s;
}

size_t sf_model_weight_bytes(const sf_model *m, const char *backend, int decode)
{
    int untied = m->lm_head.data && m->lm_head.data != m->tok_embd.data;
    size_t s = held_bytes(&m->out_norm, backend) + held_bytes(untied ? &m->lm_head : &m->tok_embd, backend);
    if (!decode && untied) s += held_bytes(&m->tok_embd, backend);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const sf_layer_w *w = &m->layers[l];
        const sf_view *vs[] = { &w->attn_norm, &w->wo, &w->bq, &w->bk, &w->bv, &w->ffn_norm, &w->wdown };
        for (size_t i = 0; i < SF_ARRAY_LEN(vs); i++) s += held_bytes(vs[i], backend);
        const sf_view *qkv[] = { &w->wq, &w->wk, &w->wv }, *gu[] = { &w->wgate, &w->wup };
        s += fused_bytes(qkv, 3, backend) + fused_bytes(gu, 2, backend);
    }
    return s;
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
        !(sf_dtype_block(v->dtype) > 1 && !norm && cols % sf_dtype_block(v->dtype) == 0))
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
        return sf_model_load_dummy(path, &cfg, o, out, err);
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
        if (o && o->dummy) return sf_model_load_dummy(path, NULL, o, out, err);
        return sf_model_load_hf(path, o, out, err);
    }
    if (S_ISREG(st.st_mode)) {
        if (o && o->dummy)
            return sf_err(err, SF_EINVAL, "%s: dummy weights need a folder with config.json, not a file", path);
        return sf_model_load_gguf(path, o, out, err);
    }
    return sf_err(err, SF_EINVAL, "%s is neither a folder nor a file", path);
}
