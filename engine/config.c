/* config.c — Hugging Face config.json → sf_model_config. */
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "model-impl.h"

static int get_int(json_t *o, const char *key, int required, int def, int lo, int hi, int *out,
                   sf_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return sf_err(err, SF_EFORMAT, "config.json: \"%s\" is missing (an integer is required)", key);
        *out = def;
        return SF_OK;
    }
    json_int_t x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)))
        x = (json_int_t)json_real_value(v);
    else
        return sf_err(err, SF_EFORMAT, "config.json: \"%s\" must be an integer", key);
    if (x < lo || x > hi)
        return sf_err(err, SF_EFORMAT, "config.json: \"%s\" = %lld is out of range [%d, %d]", key,
                      (long long)x, lo, hi);
    *out = (int)x;
    return SF_OK;
}

static int get_float(json_t *o, const char *key, float def, float *out, sf_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return SF_OK;
    }
    if (!json_is_number(v)) return sf_err(err, SF_EFORMAT, "config.json: \"%s\" must be a number", key);
    double d = json_number_value(v);
    if (!isfinite(d) || d <= 0)
        return sf_err(err, SF_EFORMAT, "config.json: \"%s\" = %g must be a positive number", key, d);
    *out = (float)d;
    return SF_OK;
}

static int get_bool(json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    return def;
}

static int parse_rope_scaling(json_t *rs, sf_model_config *c, sf_error *err)
{
    int rc;
    c->rope_scaling = SF_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    if (!rs || json_is_null(rs)) return SF_OK;
    if (!json_is_object(rs)) return sf_err(err, SF_EFORMAT, "config.json: \"rope_scaling\" must be null or an object");
    json_t *t = json_object_get(rs, "rope_type");
    if (!json_is_string(t)) t = json_object_get(rs, "type");
    if (!json_is_string(t))
        return sf_err(err, SF_EFORMAT, "config.json: \"rope_scaling\" has no \"rope_type\" (or \"type\")");
    const char *type = json_string_value(t);
    if (!strcmp(type, "default")) return SF_OK;
    if (!strcmp(type, "linear")) {
        c->rope_scaling = SF_ROPE_SCALING_LINEAR;
        if ((rc = get_float(rs, "factor", 1.0f, &c->rope_factor, err))) return sf_err_wrap(err, "rope_scaling");
        return SF_OK;
    }
    if (!strcmp(type, "llama3")) {
        c->rope_scaling = SF_ROPE_SCALING_LLAMA3;
        if ((rc = get_float(rs, "factor", 8.0f, &c->rope_factor, err)) ||
            (rc = get_float(rs, "low_freq_factor", 1.0f, &c->rope_low_freq_factor, err)) ||
            (rc = get_float(rs, "high_freq_factor", 4.0f, &c->rope_high_freq_factor, err)) ||
            (rc = get_int(rs, "original_max_position_embeddings", 0, 8192, 1, 1 << 30,
                          &c->rope_orig_max_pos, err)))
            return sf_err_wrap(err, "rope_scaling");
        if (c->rope_high_freq_factor <= c->rope_low_freq_factor)
            return sf_err(err, SF_EFORMAT,
                          "config.json: rope_scaling high_freq_factor (%g) must exceed low_freq_factor (%g)",
                          c->rope_high_freq_factor, c->rope_low_freq_factor);
        return SF_OK;
    }
    return sf_err(err, SF_EUNSUPPORTED,
                  "config.json: rope_scaling type '%s' is not supported (supported: none, default, "
                  "linear, llama3)",
                  type);
}

static int parse_eos(json_t *v, sf_model_config *c, sf_error *err)
{
    if (!v || json_is_null(v)) return SF_OK;
    if (json_is_integer(v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)json_integer_value(v);
        return SF_OK;
    }
    if (!json_is_array(v)) return sf_err(err, SF_EFORMAT, "\"eos_token_id\" must be an integer or a list of integers");
    c->n_eos = 0;
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        if (!json_is_integer(e)) return sf_err(err, SF_EFORMAT, "\"eos_token_id\"[%zu] is not an integer", i);
        if (c->n_eos < (int)SF_ARRAY_LEN(c->eos_ids)) c->eos_ids[c->n_eos++] = (int)json_integer_value(e);
    }
    return SF_OK;
}

int sf_config_merge_eos_json(const char *json_text, sf_model_config *cfg, sf_error *err)
{
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        return sf_err(err, SF_EFORMAT, "generation_config.json is not a JSON object (%s, line %d)",
                      root ? "wrong type" : je.text, root ? 0 : je.line);
    }
    sf_model_config tmp = { .n_eos = 0 };
    int rc = parse_eos(json_object_get(root, "eos_token_id"), &tmp, err);
    json_decref(root);
    if (rc) return sf_err_wrap(err, "generation_config.json");
    for (int i = 0; i < tmp.n_eos; i++) {
        int dup = 0;
        for (int j = 0; j < cfg->n_eos; j++) dup |= cfg->eos_ids[j] == tmp.eos_ids[i];
        if (!dup && cfg->n_eos < (int)SF_ARRAY_LEN(cfg->eos_ids)) cfg->eos_ids[cfg->n_eos++] = tmp.eos_ids[i];
    }
    return SF_OK;
}

static const struct { const char *type, *arch; } known_archs[] = {
    { "llama", "LlamaForCausalLM" },
    { "qwen2", "Qwen2ForCausalLM" },
    { "mistral", "MistralForCausalLM" },
};

int sf_config_parse_json(const char *json_text, sf_model_config *cfg, sf_error *err)
{
    json_error_t je;
    json_t *root = NULL;
    sf_model_config c;
    int rc = SF_OK;
    memset(&c, 0, sizeof c);
    root = json_loads(json_text, 0, &je);
    if (!root) return sf_err(err, SF_EFORMAT, "config.json is not valid JSON: %s (line %d, column %d)",
                             je.text, je.line, je.column);
    if (!json_is_object(root)) {
        rc = sf_err(err, SF_EFORMAT, "config.json must be a JSON object");
        goto cleanup;
    }
    /* architecture: model_type, cross-checked with architectures[0] */
    json_t *mt = json_object_get(root, "model_type"), *ar = json_object_get(root, "architectures");
    const char *arch0 = json_is_array(ar) && json_is_string(json_array_get(ar, 0))
                            ? json_string_value(json_array_get(ar, 0)) : NULL;
    const char *type = json_is_string(mt) ? json_string_value(mt) : NULL;
    int k = -1;
    for (size_t i = 0; i < SF_ARRAY_LEN(known_archs); i++) {
        if (type && !strcmp(type, known_archs[i].type)) k = (int)i;
        if (!type && arch0 && !strcmp(arch0, known_archs[i].arch)) k = (int)i;
    }
    if (!type && !arch0) {
        rc = sf_err(err, SF_EFORMAT, "config.json has neither \"model_type\" nor \"architectures\"");
        goto cleanup;
    }
    if (k < 0) {
        rc = sf_err(err, SF_EUNSUPPORTED,
                    "model_type '%s' is not supported (supported: llama, qwen2, mistral)",
                    type ? type : arch0);
        goto cleanup;
    }
    if (arch0 && strcmp(arch0, known_archs[k].arch)) {
        rc = sf_err(err, SF_EUNSUPPORTED,
                    "architectures[0] '%s' is not supported for model_type '%s' (expected %s: a "
                    "causal LM head)", arch0, known_archs[k].type, known_archs[k].arch);
        goto cleanup;
    }
    snprintf(c.arch, sizeof c.arch, "%s", known_archs[k].type);

    if ((rc = get_int(root, "vocab_size", 1, 0, 1, 1 << 24, &c.vocab_size, err)) ||
        (rc = get_int(root, "hidden_size", 1, 0, 1, 1 << 17, &c.hidden, err)) ||
        (rc = get_int(root, "intermediate_size", 1, 0, 1, 1 << 20, &c.intermediate, err)) ||
        (rc = get_int(root, "num_hidden_layers", 1, 0, 1, 4096, &c.n_layers, err)) ||
        (rc = get_int(root, "num_attention_heads", 1, 0, 1, 4096, &c.n_heads, err)) ||
        (rc = get_int(root, "num_key_value_heads", 0, c.n_heads, 1, 4096, &c.n_kv_heads, err)) ||
        (rc = get_int(root, "head_dim", 0, c.hidden / c.n_heads, 1, 4096, &c.head_dim, err)) ||
        (rc = get_int(root, "max_position_embeddings", 0, 2048, 1, 1 << 30, &c.max_pos, err)) ||
        (rc = get_float(root, "rms_norm_eps", 1e-6f, &c.rms_eps, err)) ||
        (rc = get_float(root, "rope_theta", 10000.0f, &c.rope_theta, err)))
        goto cleanup;
    if (c.n_heads % c.n_kv_heads) {
        rc = sf_err(err, SF_EFORMAT, "config.json: num_attention_heads (%d) is not a multiple of "
                    "num_key_value_heads (%d)", c.n_heads, c.n_kv_heads);
        goto cleanup;
    }
    if (c.head_dim % 2) {
        rc = sf_err(err, SF_EFORMAT, "config.json: head_dim %d must be even for RoPE", c.head_dim);
        goto cleanup;
    }
    if ((rc = parse_rope_scaling(json_object_get(root, "rope_scaling"), &c, err))) goto cleanup;
    c.rope_interleaved = 0;
    c.tie_embeddings = get_bool(root, "tie_word_embeddings", 0);
    c.attention_bias = !strcmp(c.arch, "qwen2") ? 1 : get_bool(root, "attention_bias", 0);
    c.sliding_window = 0;
    json_t *sw = json_object_get(root, "sliding_window");
    int use_sw = !strcmp(c.arch, "qwen2") ? get_bool(root, "use_sliding_window", 0) : 1;
    if (use_sw && json_is_integer(sw) && json_integer_value(sw) > 0 &&
        json_integer_value(sw) < c.max_pos)
        c.sliding_window = (int)json_integer_value(sw);
    json_t *bos = json_object_get(root, "bos_token_id");
    c.bos_id = json_is_integer(bos) ? (int)json_integer_value(bos) : -1;
    if ((rc = parse_eos(json_object_get(root, "eos_token_id"), &c, err))) {
        sf_err_wrap(err, "config.json");
        goto cleanup;
    }
    json_t *dt = json_object_get(root, "torch_dtype");
    if (!json_is_string(dt)) dt = json_object_get(root, "dtype");
    const char *dts = json_is_string(dt) ? json_string_value(dt) : "bfloat16";
    if (!strcmp(dts, "float32")) c.dtype = SF_DT_F32;
    else if (!strcmp(dts, "float16")) c.dtype = SF_DT_F16;
    else c.dtype = SF_DT_BF16;
    *cfg = c;
    rc = SF_OK;
cleanup:
    json_decref(root);
    return rc;
}
