/* loader_gguf.c — a llama- or qwen2-architecture .gguf file: configuration from llama.* metadata, weights
 * as views into the mapping (F32/F16/BF16/Q8_0), tokenizer from tokenizer.ggml.* metadata.
 *
 * GGUF dims are ne[0] = row length (in features), ne[1] = rows (out features): a weight of
 * ne = [in, out] is the same row-major [out, in] matrix as in a Hugging Face checkpoint. Q/K
 * were permuted at conversion for llama, so RoPE rotates adjacent pairs there
 * (cfg.rope_interleaved = 1); qwen2 conversions keep HF's order (halves) and carry q/k/v biases. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "model-impl.h"
#include "tokenizer.h"

static int need_int(const sf_gguf *g, const char *key, int64_t def, int required, int64_t lo, int64_t hi,
                    int *out, sf_error *err)
{
    int64_t v = def;
    int rc = sf_gguf_get_int(g, key, &v, err);
    if (rc == SF_ENOTFOUND) {
        if (required) return sf_err(err, SF_EFORMAT, "%s: metadata '%s' is missing", g->path, key);
        v = def;
    } else if (rc) {
        return rc;
    }
    if (v < lo || v > hi)
        return sf_err(err, SF_EFORMAT, "%s: metadata '%s' = %lld is out of range [%lld, %lld]", g->path, key,
                      (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return SF_OK;
}

static int get_f(const sf_gguf *g, const char *key, double def, float *out, sf_error *err)
{
    double v = def;
    int rc = sf_gguf_get_float(g, key, &v, err);
    if (rc && rc != SF_ENOTFOUND) return rc;
    if (!isfinite(v) || v <= 0) return sf_err(err, SF_EFORMAT, "%s: metadata '%s' = %g must be positive", g->path, key, v);
    *out = (float)v;
    return SF_OK;
}

/* A token id from metadata; absent or 0xFFFFFFFF → -1. */
static int tok_id(const sf_gguf *g, const char *key)
{
    int64_t v;
    if (sf_gguf_get_int(g, key, &v, NULL) != SF_OK || v < 0 || v >= 0xFFFFFFFFll) return -1;
    return (int)v;
}

/* "<arch>.<suffix>": metadata keys are prefixed by the architecture. The buffer is reused by
 * the next call; every caller consumes the key before that. */
static const char *akey(const sf_model_config *c, const char *suffix)
{
    static _Thread_local char buf[128];
    snprintf(buf, sizeof buf, "%s.%s", c->arch, suffix);
    return buf;
}

static int parse_config(const sf_gguf *g, sf_model_config *c, sf_error *err)
{
    const char *arch = sf_gguf_get_str(g, "general.architecture");
    int rc;
    if (!arch) return sf_err(err, SF_EFORMAT, "%s: metadata 'general.architecture' is missing", g->path);
    if (strcmp(arch, "llama") && strcmp(arch, "qwen2"))
        return sf_err(err, SF_EUNSUPPORTED, "%s: GGUF architecture '%s' is not supported (supported: llama, "
                      "which covers Llama 2/3 and Mistral conversions, and qwen2)", g->path, arch);
    memset(c, 0, sizeof *c);
    snprintf(c->arch, sizeof c->arch, "%s", arch);
    if ((rc = need_int(g, akey(c, "embedding_length"), 0, 1, 1, 1 << 17, &c->hidden, err)) ||
        (rc = need_int(g, akey(c, "block_count"), 0, 1, 1, 4096, &c->n_layers, err)) ||
        (rc = need_int(g, akey(c, "feed_forward_length"), 0, 1, 1, 1 << 20, &c->intermediate, err)) ||
        (rc = need_int(g, akey(c, "attention.head_count"), 0, 1, 1, 4096, &c->n_heads, err)) ||
        (rc = need_int(g, akey(c, "attention.head_count_kv"), c->n_heads, 0, 1, 4096, &c->n_kv_heads, err)) ||
        (rc = need_int(g, akey(c, "attention.key_length"), c->hidden / c->n_heads, 0, 2, 4096, &c->head_dim, err)) ||
        (rc = need_int(g, akey(c, "context_length"), 2048, 0, 1, 1 << 30, &c->max_pos, err)) ||
        (rc = get_f(g, akey(c, "rope.freq_base"), 10000.0, &c->rope_theta, err)) ||
        (rc = get_f(g, akey(c, "attention.layer_norm_rms_epsilon"), 1e-5, &c->rms_eps, err)))
        return rc;
    if (c->n_heads % c->n_kv_heads || c->head_dim % 2)
        return sf_err(err, SF_EFORMAT, "%s: head counts %d/%d or head size %d are inconsistent", g->path,
                      c->n_heads, c->n_kv_heads, c->head_dim);
    int rot = c->head_dim;
    if ((rc = need_int(g, akey(c, "rope.dimension_count"), c->head_dim, 0, 1, 4096, &rot, err))) return rc;
    if (rot != c->head_dim)
        return sf_err(err, SF_EUNSUPPORTED, "%s: partial rotary embeddings (rope.dimension_count %d, head size "
                      "%d) are not supported", g->path, rot, c->head_dim);
    c->rope_factor = 1.0f;
    const char *st = sf_gguf_get_str(g, akey(c, "rope.scaling.type"));
    if (st && !strcmp(st, "linear")) {
        c->rope_scaling = SF_ROPE_SCALING_LINEAR;
        if ((rc = get_f(g, akey(c, "rope.scaling.factor"), 1.0, &c->rope_factor, err))) return rc;
    } else if (st && strcmp(st, "none")) {
        return sf_err(err, SF_EUNSUPPORTED, "%s: rope scaling type '%s' is not supported (supported: none, "
                      "linear, llama3)", g->path, st);
    } else if (!st && sf_gguf_find(g, akey(c, "rope.scale_linear"))) {
        c->rope_scaling = SF_ROPE_SCALING_LINEAR;
        if ((rc = get_f(g, akey(c, "rope.scale_linear"), 1.0, &c->rope_factor, err))) return rc;
    }
    /* llama conversions permute Q/K rows so RoPE rotates adjacent pairs; qwen2 conversions do
     * not (llama.cpp's NEOX rope type): halves, as in the HF checkpoint */
    c->rope_interleaved = strcmp(arch, "qwen2") != 0;
    c->attention_bias = !strcmp(arch, "qwen2");
    c->bos_id = tok_id(g, "tokenizer.ggml.bos_token_id");
    int eos = tok_id(g, "tokenizer.ggml.eos_token_id"), eot = tok_id(g, "tokenizer.ggml.eot_token_id");
    if (eos >= 0) c->eos_ids[c->n_eos++] = eos;
    if (eot >= 0 && eot != eos) c->eos_ids[c->n_eos++] = eot;
    return SF_OK;
}

/* Llama 3.1 GGUFs carry the llama3 RoPE scaling as per-frequency divisors (rope_freqs.weight).
 * Accept them when they equal the llama3 formula with the published parameters. */
static int check_rope_freqs(const sf_gguf *g, sf_model_config *c, sf_error *err)
{
    const sf_gguf_tensor *t = sf_gguf_find_tensor(g, "rope_freqs.weight");
    if (!t) return SF_OK;
    int half = c->head_dim / 2;
    if (t->ggml_type != SF_GGML_F32 || t->ne[0] != half || !t->data)
        return sf_err(err, SF_EUNSUPPORTED, "%s: rope_freqs.weight must be F32 [%d]", g->path, half);
    sf_model_config s = *c;
    s.rope_scaling = SF_ROPE_SCALING_LLAMA3;
    s.rope_factor = 8.0f;
    s.rope_low_freq_factor = 1.0f;
    s.rope_high_freq_factor = 4.0f;
    s.rope_orig_max_pos = 8192;
    sf_model_config base = *c;
    base.rope_scaling = SF_ROPE_SCALING_NONE;
    float *a = malloc(sizeof(float) * (size_t)half * 2);
    if (!a) return sf_err(err, SF_ENOMEM, "out of memory");
    sf_rope_inv_freq(&base, a);
    sf_rope_inv_freq(&s, a + half);
    int ok = 1;
    for (int i = 0; i < half; i++) {
        float div;
        memcpy(&div, (const uint8_t *)t->data + 4 * i, 4);
        float want = a[i] / a[half + i];
        if (!(fabsf(div - want) <= 1e-3f * fabsf(want))) ok = 0;
    }
    free(a);
    if (!ok)
        return sf_err(err, SF_EUNSUPPORTED, "%s: rope_freqs.weight does not match llama3 RoPE scaling (factor "
                      "8, low 1, high 4, original context 8192); other per-frequency scalings are not "
                      "supported", g->path);
    *c = s;
    return SF_OK;
}

static int bind(const sf_gguf *g, sf_model *m, sf_view *v, const char *name, int64_t rows, int64_t cols,
                sf_error *err)
{
    const sf_gguf_tensor *t = sf_gguf_find_tensor(g, name);
    if (!t) return sf_err(err, SF_ENOTFOUND, "%s: tensor '%s' is missing", g->path, name);
    int64_t want_ne1 = rows ? rows : 1;
    int dims_ok = t->ne[0] == cols && t->ne[1] == want_ne1 && t->ne[2] == 1 && t->ne[3] == 1;
    if (!dims_ok)
        return sf_err(err, SF_EFORMAT, "%s: tensor '%s' has ne [%lld, %lld, %lld, %lld], expected [%lld, %lld] "
                      "(in, out) from the metadata", g->path, name, (long long)t->ne[0], (long long)t->ne[1],
                      (long long)t->ne[2], (long long)t->ne[3], (long long)cols, (long long)want_ne1);
    if (!t->supported || !t->data || (!rows && sf_dtype_block(t->dtype) > 1)) {
        char why[96] = "";
        if (t->supported && !rows) snprintf(why, sizeof why, " for a vector");
        else if (sf_dtype_block(t->dtype) > 1)
            snprintf(why, sizeof why, " with rows of %lld, not whole %d-blocks", (long long)t->ne[0], sf_dtype_block(t->dtype));
        return sf_err(err, SF_EUNSUPPORTED, "%s: tensor '%s' has type %s (%d)%s; semflow loads F32, F16, BF16, Q8_0, "
                      "Q4_0, Q4_1, Q5_0, Q5_1, Q2_K..Q6_K, IQ4_NL and IQ4_XS GGUF weights in whole blocks "
                      "(F32/F16/BF16 for norms and biases), not the other IQ formats: re-quantize the model to one "
                      "of those (Q4_K_M, IQ4_XS, Q8_0, F16)",
                      g->path, name, sf_gguf_type_name(t->ggml_type), t->ggml_type, why);
    }
    v->data = t->data;
    v->dtype = t->dtype;
    v->rows = want_ne1;
    v->cols = cols;
    m->weight_bytes += t->nbytes;
    return SF_OK;
}

static int bind_all(const sf_gguf *g, sf_model *m, sf_error *err)
{
    sf_model_config *k = &m->cfg;
    int64_t h = k->hidden, q = (int64_t)k->n_heads * k->head_dim, kv = (int64_t)k->n_kv_heads * k->head_dim;
    char n[128];
    int rc;
    const sf_gguf_tensor *te = sf_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return sf_err(err, SF_ENOTFOUND, "%s: tensor 'token_embd.weight' is missing", g->path);
    int vocab = 0;
    if ((rc = need_int(g, akey(k, "vocab_size"), te->ne[1], 0, 1, 1 << 24, &vocab, err))) return rc;
    k->vocab_size = vocab;
    if ((rc = bind(g, m, &m->tok_embd, "token_embd.weight", vocab, h, err)) ||
        (rc = bind(g, m, &m->out_norm, "output_norm.weight", 0, h, err)))
        return rc;
    if (sf_gguf_find_tensor(g, "output.weight")) {
        k->tie_embeddings = 0;
        if ((rc = bind(g, m, &m->lm_head, "output.weight", vocab, h, err))) return rc;
    } else {
        k->tie_embeddings = 1;
        m->lm_head = m->tok_embd;
    }
    for (int i = 0; i < k->n_layers; i++) {
        sf_layer_w *l = &m->layers[i];
#define B(V, NAME, R, C) \
    do { snprintf(n, sizeof n, "blk.%d.%s", i, NAME); if ((rc = bind(g, m, V, n, R, C, err))) return rc; } while (0)
        B(&l->attn_norm, "attn_norm.weight", 0, h);
        B(&l->wq, "attn_q.weight", q, h);
        B(&l->wk, "attn_k.weight", kv, h);
        B(&l->wv, "attn_v.weight", kv, h);
        B(&l->wo, "attn_output.weight", h, q);
        if (k->attention_bias) {
            B(&l->bq, "attn_q.bias", 0, q);
            B(&l->bk, "attn_k.bias", 0, kv);
            B(&l->bv, "attn_v.bias", 0, kv);
        }
        B(&l->ffn_norm, "ffn_norm.weight", 0, h);
        B(&l->wgate, "ffn_gate.weight", k->intermediate, h);
        B(&l->wup, "ffn_up.weight", k->intermediate, h);
        B(&l->wdown, "ffn_down.weight", h, k->intermediate);
#undef B
    }
    k->dtype = m->layers[0].wq.dtype;
    return SF_OK;
}

/* Copy a string array into one buffer owned by the model; returns the pointer array. */
static const char *const *own_strings(sf_model *m, const sf_gguf_kv *kv, sf_error *err)
{
    size_t total = 0;
    for (uint64_t i = 0; i < kv->arr_n; i++) total += strlen(kv->arr_str[i]) + 1;
    char **ptrs = malloc(sizeof *ptrs * (kv->arr_n ? kv->arr_n : 1));
    char *buf = malloc(total ? total : 1);
    if (!ptrs || !buf) {
        free(ptrs);
        free(buf);
        sf_err(err, SF_ENOMEM, "out of memory copying '%s'", kv->key);
        return NULL;
    }
    char *p = buf;
    for (uint64_t i = 0; i < kv->arr_n; i++) {
        size_t l = strlen(kv->arr_str[i]) + 1;
        memcpy(p, kv->arr_str[i], l);
        ptrs[i] = p;
        p += l;
    }
    if (sf_model_add_owned(m, buf, err)) {
        free(ptrs);
        return NULL;
    }
    if (sf_model_add_owned(m, ptrs, err)) return NULL;
    return (const char *const *)ptrs;
}

static double arr_num(const sf_gguf_kv *kv, uint64_t i)
{
    const uint8_t *p = kv->arr_data;
    switch (kv->arr_type) {
    case SF_GGUF_U8: case SF_GGUF_BOOL: return p[i];
    case SF_GGUF_I8: return (int8_t)p[i];
    case SF_GGUF_U16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case SF_GGUF_I16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case SF_GGUF_U32: { uint32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case SF_GGUF_I32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case SF_GGUF_F32: { float v; memcpy(&v, p + 4 * i, 4); return v; }
    case SF_GGUF_U64: { uint64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case SF_GGUF_I64: { int64_t v; memcpy(&v, p + 8 * i, 8); return (double)v; }
    case SF_GGUF_F64: { double v; memcpy(&v, p + 8 * i, 8); return v; }
    }
    return 0;
}

static int flag(const sf_gguf *g, const char *key)
{
    int64_t v;
    return sf_gguf_get_int(g, key, &v, NULL) == SF_OK ? (int)(v != 0) : -1;
}

static int load_tokenizer(const sf_gguf *g, sf_model *m, sf_error *err)
{
    sf_tok_vocab v = { 0 };
    const sf_gguf_kv *tk = sf_gguf_find(g, "tokenizer.ggml.tokens");
    const sf_gguf_kv *sc = sf_gguf_find(g, "tokenizer.ggml.scores");
    const sf_gguf_kv *ty = sf_gguf_find(g, "tokenizer.ggml.token_type");
    const sf_gguf_kv *mg = sf_gguf_find(g, "tokenizer.ggml.merges");
    v.model = sf_gguf_get_str(g, "tokenizer.ggml.model");
    if (!tk || !v.model) {
        SF_LOGW("%s: no tokenizer in the GGUF metadata; the model can run on token ids only", g->path);
        return SF_OK;
    }
    if (tk->type != SF_GGUF_ARRAY || tk->arr_type != SF_GGUF_STRING || !tk->arr_n || tk->arr_n > (1u << 24))
        return sf_err(err, SF_EFORMAT, "%s: tokenizer.ggml.tokens must be a non-empty array of strings", g->path);
    v.n_tokens = (int)tk->arr_n;
    if (!(v.tokens = own_strings(m, tk, err))) return SF_ENOMEM;
    if (sc) {
        if (sc->type != SF_GGUF_ARRAY || !sc->arr_data || sc->arr_n != tk->arr_n)
            return sf_err(err, SF_EFORMAT, "%s: tokenizer.ggml.scores must be %d numbers", g->path, v.n_tokens);
        float *s = malloc(sizeof *s * tk->arr_n);
        if (!s || sf_model_add_owned(m, s, err)) return sf_err(err, SF_ENOMEM, "out of memory");
        for (uint64_t i = 0; i < sc->arr_n; i++) s[i] = (float)arr_num(sc, i);
        v.scores = s;
    }
    if (ty) {
        if (ty->type != SF_GGUF_ARRAY || !ty->arr_data || ty->arr_n != tk->arr_n)
            return sf_err(err, SF_EFORMAT, "%s: tokenizer.ggml.token_type must be %d integers", g->path, v.n_tokens);
        int32_t *t = malloc(sizeof *t * tk->arr_n);
        if (!t || sf_model_add_owned(m, t, err)) return sf_err(err, SF_ENOMEM, "out of memory");
        for (uint64_t i = 0; i < ty->arr_n; i++) {
            double x = arr_num(ty, i);
            if (!(x >= 0 && x <= 6))   /* 0 undefined, 1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte */
                return sf_err(err, SF_EFORMAT, "%s: tokenizer.ggml.token_type[%llu] = %g is not a token type (0..6)",
                              g->path, (unsigned long long)i, x);
            t[i] = (int32_t)x;
        }
        v.types = t;
    }
    if (mg) {
        if (mg->type != SF_GGUF_ARRAY || mg->arr_type != SF_GGUF_STRING || mg->arr_n > (1u << 24))
            return sf_err(err, SF_EFORMAT, "%s: tokenizer.ggml.merges must be an array of strings", g->path);
        v.n_merges = (int)mg->arr_n;
        if (!(v.merges = own_strings(m, mg, err))) return SF_ENOMEM;
    }
    v.pre = sf_gguf_get_str(g, "tokenizer.ggml.pre");
    v.bos_id = tok_id(g, "tokenizer.ggml.bos_token_id");
    v.eos_id = tok_id(g, "tokenizer.ggml.eos_token_id");
    v.unk_id = tok_id(g, "tokenizer.ggml.unknown_token_id");
    v.pad_id = tok_id(g, "tokenizer.ggml.padding_token_id");
    v.add_bos = flag(g, "tokenizer.ggml.add_bos_token");
    v.add_eos = flag(g, "tokenizer.ggml.add_eos_token");
    v.chat_template = sf_gguf_get_str(g, "tokenizer.chat_template");
    int rc = sf_tok_from_vocab(&v, &m->tok, err);
    if (rc) return sf_err_wrap(err, "%s: tokenizer", g->path);
    if (v.n_tokens > m->cfg.vocab_size)
        return sf_err(err, SF_EFORMAT, "%s: the tokenizer has %d tokens but token_embd has %d rows", g->path,
                      v.n_tokens, m->cfg.vocab_size);
    return SF_OK;
}

int sf_model_load_gguf(const char *file, const sf_load_opts *o, sf_model **out, sf_error *err)
{
    sf_gguf *g = NULL;
    sf_model *m = NULL;
    int rc;
    *out = NULL;
    if ((rc = sf_gguf_open(file, &g, err))) return rc;
    if (!(m = sf_model_alloc(err))) {
        rc = SF_ENOMEM;
        goto cleanup;
    }
    sf_model_set_name(m, file, ".gguf");
    if ((rc = parse_config(g, &m->cfg, err)) || (rc = sf_model_alloc_layers(m, err)) ||
        (rc = bind_all(g, m, err)) || (rc = check_rope_freqs(g, &m->cfg, err)) ||
        (rc = sf_model_validate(m, err)))
        goto cleanup;
    if ((rc = load_tokenizer(g, m, err))) goto cleanup;
    if ((rc = sf_model_add_map(m, g->map, g->map_len, err))) {
        g->map = NULL;
        goto cleanup;
    }
    g->map = NULL;
    if (o && o->progress) {
        sf_progress pg;
        sf_progress_begin(&pg, "loading weights", m->maps[0].len, 1);
        if (pg.on) sf_progress_touch(&pg, m->maps[0].addr, m->maps[0].len);
        sf_progress_end(&pg);
    }
    *out = m;
    m = NULL;
    rc = SF_OK;
cleanup:
    sf_gguf_close(g, 0);
    sf_model_free(m);
    return rc;
}
