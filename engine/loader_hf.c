/* loader_hf.c — a Hugging Face model folder: config.json (+ generation_config.json),
 * model.safetensors or model.safetensors.index.json + shards, tokenizer.json.
 * Weights stay in the read-only mappings; views point into them. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model-impl.h"
#include "safetensors.h"
#include "tokenizer.h"

typedef struct hf_ctx {
    const char *dir;
    sf_st_file **files;       /* opened shards */
    char **file_names;        /* shard basenames */
    int n_files;
    json_t *weight_map;       /* from the index, or NULL for a single file */
    sf_model *m;
    size_t bound_bytes;
} hf_ctx;

static int open_shard(hf_ctx *c, const char *name, sf_error *err)
{
    char path[2048];
    for (int i = 0; i < c->n_files; i++)
        if (!strcmp(c->file_names[i], name)) return SF_OK;
    if (!*name || strchr(name, '/') || !strcmp(name, "..") || !strcmp(name, "."))
        return sf_err(err, SF_EFORMAT, "%s/model.safetensors.index.json: shard name '%s' is not a file "
                      "name in the folder", c->dir, name);
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    sf_st_file **nf = realloc(c->files, (size_t)(c->n_files + 1) * sizeof *nf);
    if (nf) c->files = nf;
    char **nn = realloc(c->file_names, (size_t)(c->n_files + 1) * sizeof *nn);
    if (nn) c->file_names = nn;
    if (!nf || !nn) return sf_err(err, SF_ENOMEM, "out of memory");
    sf_st_file *f;
    int rc = sf_st_open(path, &f, err);
    if (rc) {
        if (rc == SF_ENOTFOUND && c->weight_map)
            sf_err(err, rc, "%s: shard '%s' named by model.safetensors.index.json is missing (incomplete "
                   "download?)", c->dir, name);
        return rc;
    }
    c->file_names[c->n_files] = strdup(name);
    c->files[c->n_files] = f;
    c->n_files++;
    if (!c->file_names[c->n_files - 1]) return sf_err(err, SF_ENOMEM, "out of memory");
    return SF_OK;
}

static int open_weights(hf_ctx *c, sf_error *err)
{
    char path[2048];
    char *text = NULL;
    json_t *root = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", c->dir);
    if (access(path, F_OK) == 0) {
        if ((rc = sf_read_file(path, &text, NULL, err))) return rc;
        json_error_t je;
        root = json_loads(text, 0, &je);
        free(text);
        json_t *wm = json_object_get(root, "weight_map");
        if (!json_is_object(wm)) {
            rc = sf_err(err, SF_EFORMAT, "%s: %s", path,
                        root ? "no \"weight_map\" object" : je.text);
            json_decref(root);
            return rc;
        }
        c->weight_map = json_incref(wm);
        json_decref(root);
        const char *k;
        json_t *v;
        json_object_foreach(c->weight_map, k, v) {
            if (!json_is_string(v))
                return sf_err(err, SF_EFORMAT, "%s: weight_map[\"%s\"] is not a file name", path, k);
            if ((rc = open_shard(c, json_string_value(v), err))) return rc;
        }
        return SF_OK;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", c->dir);
    if (access(path, F_OK) != 0)
        return sf_err(err, SF_ENOTFOUND,
                      "%s: no model.safetensors or model.safetensors.index.json (semflow loads "
                      "safetensors; convert PyTorch .bin checkpoints first)", c->dir);
    return open_shard(c, "model.safetensors", err);
}

static const sf_st_tensor *find_tensor(hf_ctx *c, const char *name, const char **file)
{
    if (c->weight_map) {
        const char *shard = json_string_value(json_object_get(c->weight_map, name));
        if (!shard) return NULL;
        for (int i = 0; i < c->n_files; i++)
            if (!strcmp(c->file_names[i], shard)) {
                *file = c->file_names[i];
                return sf_st_find(c->files[i], name);
            }
        return NULL;
    }
    for (int i = 0; i < c->n_files; i++) {
        const sf_st_tensor *t = sf_st_find(c->files[i], name);
        if (t) {
            *file = c->file_names[i];
            return t;
        }
    }
    return NULL;
}

/* Bind tensor `name` of shape [rows, cols] (rows == 0: a 1-D tensor of cols) into *v. */
static int bind(hf_ctx *c, sf_view *v, const char *name, int64_t rows, int64_t cols, sf_error *err)
{
    const char *file = c->weight_map ? json_string_value(json_object_get(c->weight_map, name)) : NULL;
    const sf_st_tensor *t = find_tensor(c, name, &file);
    if (!t) {
        if (c->weight_map && file)
            return sf_err(err, SF_ENOTFOUND, "%s: tensor '%s' is not in %s although the index names that "
                          "shard", c->dir, name, file);
        return sf_err(err, SF_ENOTFOUND, "%s: tensor '%s' is missing (model_type %s, %d layers)", c->dir,
                      name, c->m->cfg.arch, c->m->cfg.n_layers);
    }
    int ok = rows ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols
                  : t->ndim == 1 && t->shape[0] == cols;
    if (!ok) {
        char got[128] = "[";
        for (int i = 0; i < t->ndim; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", i ? ", " : "", (long long)t->shape[i]);
        strcat(got, "]");
        char want[64];
        if (rows) snprintf(want, sizeof want, "[%lld, %lld]", (long long)rows, (long long)cols);
        else snprintf(want, sizeof want, "[%lld]", (long long)cols);
        return sf_err(err, SF_EFORMAT, "%s/%s: tensor '%s' has shape %s, expected %s from config.json",
                      c->dir, file, name, got, want);
    }
    v->data = t->data;
    v->dtype = t->dtype;
    v->rows = rows ? rows : 1;
    v->cols = cols;
    c->bound_bytes += t->nbytes;
    return SF_OK;
}

static int bind_all(hf_ctx *c, sf_error *err)
{
    sf_model *m = c->m;
    const sf_model_config *k = &m->cfg;
    int64_t h = k->hidden, q = (int64_t)k->n_heads * k->head_dim, kv = (int64_t)k->n_kv_heads * k->head_dim;
    char n[256];
    int rc;
    if ((rc = bind(c, &m->tok_embd, "model.embed_tokens.weight", k->vocab_size, h, err)) ||
        (rc = bind(c, &m->out_norm, "model.norm.weight", 0, h, err)))
        return rc;
    if (k->tie_embeddings) m->lm_head = m->tok_embd;
    else if ((rc = bind(c, &m->lm_head, "lm_head.weight", k->vocab_size, h, err))) {
        if (rc == SF_ENOTFOUND)
            sf_err(err, rc, "%s: tensor 'lm_head.weight' is missing and config.json says "
                   "tie_word_embeddings is false", c->dir);
        return rc;
    }
    for (int i = 0; i < k->n_layers; i++) {
        sf_layer_w *l = &m->layers[i];
        static const char *P = "model.layers";
#define B(V, SUFFIX, R, C) \
    do { snprintf(n, sizeof n, "%s.%d.%s", P, i, SUFFIX); if ((rc = bind(c, V, n, R, C, err))) return rc; } while (0)
        B(&l->attn_norm, "input_layernorm.weight", 0, h);
        B(&l->wq, "self_attn.q_proj.weight", q, h);
        B(&l->wk, "self_attn.k_proj.weight", kv, h);
        B(&l->wv, "self_attn.v_proj.weight", kv, h);
        B(&l->wo, "self_attn.o_proj.weight", h, q);
        if (k->attention_bias) {
            B(&l->bq, "self_attn.q_proj.bias", 0, q);
            B(&l->bk, "self_attn.k_proj.bias", 0, kv);
            B(&l->bv, "self_attn.v_proj.bias", 0, kv);
        }
        B(&l->ffn_norm, "post_attention_layernorm.weight", 0, h);
        B(&l->wgate, "mlp.gate_proj.weight", k->intermediate, h);
        B(&l->wup, "mlp.up_proj.weight", k->intermediate, h);
        B(&l->wdown, "mlp.down_proj.weight", h, k->intermediate);
#undef B
    }
    m->cfg.dtype = m->layers[0].wq.dtype;
    return SF_OK;
}

int sf_model_load_hf(const char *dir, const sf_load_opts *o, sf_model **out, sf_error *err)
{
    hf_ctx c = { .dir = dir };
    char path[2048], *text = NULL;
    struct stat st;
    int rc;
    *out = NULL;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return sf_err(err, SF_ENOTFOUND, "model folder %s %s", dir,
                      errno == ENOENT ? "does not exist" : "is not a folder");
    if (!(c.m = sf_model_alloc(err))) return SF_ENOMEM;
    sf_model_set_name(c.m, dir, NULL);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = sf_read_file(path, &text, NULL, err))) {
        if (rc == SF_ENOTFOUND)
            sf_err(err, rc, "%s: no config.json; a Hugging Face model folder holds config.json, "
                   "*.safetensors and tokenizer.json", dir);
        goto cleanup;
    }
    if ((rc = sf_config_parse_json(text, &c.m->cfg, err))) {
        sf_err_wrap(err, "%s", dir);
        goto cleanup;
    }
    free(text);
    text = NULL;
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (access(path, F_OK) == 0) {
        if ((rc = sf_read_file(path, &text, NULL, err)) ||
            (rc = sf_config_merge_eos_json(text, &c.m->cfg, err))) {
            sf_err_wrap(err, "%s", dir);
            goto cleanup;
        }
        free(text);
        text = NULL;
    }
    if ((rc = sf_model_alloc_layers(c.m, err)) || (rc = open_weights(&c, err)) || (rc = bind_all(&c, err)))
        goto cleanup;
    c.m->weight_bytes = c.bound_bytes;
    /* the mappings now belong to the model */
    size_t mapped = 0;
    for (int i = 0; i < c.n_files; i++) {
        sf_st_file *f = c.files[i];
        mapped += f->map_len;
        rc = sf_model_add_map(c.m, f->map, f->map_len, err);
        f->map = NULL;
        if (rc) goto cleanup;
    }
    if (o && o->progress) {
        sf_progress pg;
        sf_progress_begin(&pg, "loading weights", mapped, 1);
        if (pg.on)
            for (int i = 0; i < c.m->n_maps; i++) sf_progress_touch(&pg, c.m->maps[i].addr, c.m->maps[i].len);
        sf_progress_end(&pg);
    }
    if ((rc = sf_model_validate(c.m, err))) {
        sf_err_wrap(err, "%s", dir);
        goto cleanup;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, F_OK) == 0) {
        if ((rc = sf_tok_load_dir(dir, &c.m->tok, err))) {
            sf_err_wrap(err, "%s: tokenizer", dir);
            goto cleanup;
        }
        if (sf_tok_vocab_size(c.m->tok) > c.m->cfg.vocab_size) {
            rc = sf_err(err, SF_EFORMAT, "%s: tokenizer.json has %d tokens but config.json's vocab_size is "
                        "%d (the embedding has no row for the extra ids)", dir,
                        sf_tok_vocab_size(c.m->tok), c.m->cfg.vocab_size);
            goto cleanup;
        }
    } else {
        SF_LOGW("%s: no tokenizer.json; the model can run on token ids only", dir);
    }
    *out = c.m;
    c.m = NULL;
    rc = SF_OK;
cleanup:
    free(text);
    for (int i = 0; i < c.n_files; i++) {
        sf_st_close(c.files[i], 0);
        free(c.file_names[i]);
    }
    free(c.files);
    free(c.file_names);
    json_decref(c.weight_map);
    sf_model_free(c.m);
    return rc;
}
