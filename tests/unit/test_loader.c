/* test_loader.c — model loading: Hugging Face folders (single and sharded safetensors), GGUF
 * (F32, F16, Q8_0 and the other block formats; tokenizer metadata), the demo model, dummy weights, and the bad-input list:
 * every broken file is written here, loaded, and must give the right code and a message that
 * names the problem, without crashing. */
#include <jansson.h>
#include <sys/stat.h>

#include "engine/gguf.h"
#include "engine/model.h"
#include "engine/tokenizer.h"
#include "tests/lib/quant_ref.h"
#include "tests/test.h"

static int rc_; /* REQUIRE evaluates its condition twice: call first, then check */

static char tmp_root[256];

static const char *tmp_path(const char *rel)
{
    static char bufs[8][512];
    static int i;
    char *b = bufs[i++ & 7];
    snprintf(b, 512, "%s/%s", tmp_root, rel);
    return b;
}

static int write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static int copy_file(const char *src, const char *dst)
{
    size_t n;
    char *b = read_all(src, &n);
    int rc = b ? write_file(dst, b, n) : -1;
    free(b);
    return rc;
}

static const char *mkdir_tmp(const char *rel)
{
    const char *p = tmp_path(rel);
    mkdir(p, 0755);
    return p;
}

/* a folder under the test's tmp dir holding config.json with this text */
static const char *config_dir(const char *rel, const char *json)
{
    const char *d = mkdir_tmp(rel);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", d);
    write_file(p, json, strlen(json));
    return d;
}

#define TINY "tiny-random-llama-2"

/* The tiny checkpoint's safetensors split into header (parsed) and data blob. */
typedef struct st_parts { json_t *hdr; char *data; size_t data_len; } st_parts;

static int st_split(const char *path, st_parts *p)
{
    size_t n;
    char *b = read_all(path, &n);
    if (!b) return -1;
    uint64_t hl;
    memcpy(&hl, b, 8);
    p->hdr = json_loadb(b + 8, hl, JSON_DECODE_ANY, NULL);
    p->data_len = n - 8 - hl;
    p->data = malloc(p->data_len);
    memcpy(p->data, b + 8 + hl, p->data_len);
    free(b);
    return p->hdr ? 0 : -1;
}

static int st_write(const char *path, json_t *hdr, const char *data, size_t data_len)
{
    char *h = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    size_t hl = strlen(h);
    uint64_t hl64 = hl;
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(&hl64, 8, 1, f) == 1 && fwrite(h, 1, hl, f) == hl &&
             (!data_len || fwrite(data, 1, data_len, f) == data_len);
    if (f) ok &= fclose(f) == 0;
    free(h);
    return ok ? 0 : -1;
}

/* A copy of the tiny checkpoint in tmp/<name> whose header went through mutate(). */
static const char *tiny_variant(const char *name, void (*mutate)(json_t *hdr))
{
    const char *dir = mkdir_tmp(name);
    char p[600];
    st_parts sp;
    snprintf(p, sizeof p, "%s/config.json", dir);
    copy_file(test_data(TINY "/config.json"), p);
    if (st_split(test_data(TINY "/model.safetensors"), &sp)) return dir;
    if (mutate) mutate(sp.hdr);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_write(p, sp.hdr, sp.data, sp.data_len);
    json_decref(sp.hdr);
    free(sp.data);
    return dir;
}

/* Load and expect failure with code and a message containing every given substring. */
static void expect_fail(const char *path, int code, const char *s1, const char *s2)
{
    sf_model *m = (sf_model *)1;
    sf_error e = { 0 };
    int rc = sf_model_load(path, NULL, &m, &e);
    CHECK_MSG(rc == code, "%s: rc %d (%s), want %d; msg: %s", path, rc, sf_status_str(rc), code, e.msg);
    CHECK_MSG(m == NULL, "%s: model not NULL on failure", path);
    CHECK_MSG(!s1 || strstr(e.msg, s1), "%s: message lacks '%s': %s", path, s1, e.msg);
    CHECK_MSG(!s2 || strstr(e.msg, s2), "%s: message lacks '%s': %s", path, s2, e.msg);
    if (rc == SF_OK) sf_model_free(m);
}

/* First element(s) of a tensor read straight from the file, independent of the loader. */
static uint16_t st_read_u16(const char *path, const char *name, int64_t index)
{
    st_parts sp;
    uint16_t v = 0xffff;
    if (st_split(path, &sp)) return v;
    json_t *t = json_object_get(sp.hdr, name);
    json_int_t begin = json_integer_value(json_array_get(json_object_get(t, "data_offsets"), 0));
    memcpy(&v, sp.data + begin + 2 * index, 2);
    json_decref(sp.hdr);
    free(sp.data);
    return v;
}

/* ---- Hugging Face ------------------------------------------------------------------------ */
TEST(hf_tiny_random_llama2)
{
    sf_model *m = NULL;
    sf_error e = { 0 };
    sf_load_opts o = { 0 };
    rc_ = sf_model_load(test_data(TINY), &o, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    const sf_model_config *c = &m->cfg;
    CHECK(!strcmp(c->arch, "llama"));
    CHECK(c->vocab_size == 3000 && c->hidden == 16 && c->intermediate == 64 && c->n_layers == 2);
    CHECK(c->n_heads == 4 && c->n_kv_heads == 4 && c->head_dim == 4 && c->max_pos == 256);
    CHECK(fabsf(c->rms_eps - 1e-5f) < 1e-12f && c->rope_theta == 10000.0f);
    CHECK(c->rope_scaling == SF_ROPE_SCALING_NONE && c->rope_interleaved == 0);
    CHECK(c->tie_embeddings == 0 && c->attention_bias == 0 && c->sliding_window == 0);
    CHECK(c->bos_id == 1 && c->n_eos == 1 && c->eos_ids[0] == 2 && c->dtype == SF_DT_BF16);
    CHECK(!strcmp(m->name, TINY) && m->random_weights == 0 && m->tok == NULL);
    CHECK_MSG(m->weight_bytes == 208544, "weight_bytes %zu", m->weight_bytes);
    CHECK(m->n_maps == 1 && m->maps[0].len == 210712);
    CHECK(m->tok_embd.rows == 3000 && m->tok_embd.cols == 16 && m->tok_embd.dtype == SF_DT_BF16);
    CHECK(m->lm_head.data != m->tok_embd.data && m->lm_head.rows == 3000);
    CHECK(m->layers[1].wdown.rows == 16 && m->layers[1].wdown.cols == 64);
    CHECK(m->out_norm.rows == 1 && m->out_norm.cols == 16);
    CHECK(m->layers[0].bq.data == NULL);
    /* views point into the mapping, and hold the file's bytes */
    const char *st = test_data(TINY "/model.safetensors");
    const uint8_t *base = m->maps[0].addr;
    CHECK((const uint8_t *)m->tok_embd.data > base && (const uint8_t *)m->tok_embd.data < base + m->maps[0].len);
    CHECK(((const uint16_t *)m->tok_embd.data)[0] == st_read_u16(st, "model.embed_tokens.weight", 0));
    CHECK(((const uint16_t *)m->tok_embd.data)[47999] == st_read_u16(st, "model.embed_tokens.weight", 47999));
    CHECK(((const uint16_t *)m->layers[1].wdown.data)[1023] ==
          st_read_u16(st, "model.layers.1.mlp.down_proj.weight", 1023));
    CHECK(((const uint16_t *)m->lm_head.data)[5] == st_read_u16(st, "lm_head.weight", 5));
    CHECK(sf_model_validate(m, &e) == SF_OK);
    sf_model_free(m);
}

static void drop_up_proj(json_t *h) { json_object_del(h, "model.layers.1.mlp.up_proj.weight"); }

TEST(hf_sharded)
{
    const char *dir = mkdir_tmp("sharded");
    char p[600];
    st_parts sp;
    rc_ = st_split(test_data(TINY "/model.safetensors"), &sp);
    REQUIRE(rc_ == 0, "split");
    snprintf(p, sizeof p, "%s/config.json", dir);
    copy_file(test_data(TINY "/config.json"), p);
    /* shard 1: the first half of the tensors, shard 2: the rest, each with compacted data */
    json_t *h[2] = { json_object(), json_object() }, *wm = json_object();
    char *data[2] = { malloc(sp.data_len), malloc(sp.data_len) };
    size_t off[2] = { 0, 0 };
    const char *names[2] = { "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" };
    size_t n = json_object_size(sp.hdr), i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(sp.hdr, k, v) {
        if (!strcmp(k, "__metadata__")) continue;
        int s = i++ < n / 2 ? 0 : 1;
        json_t *o = json_object_get(v, "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(o, 0)), en = (size_t)json_integer_value(json_array_get(o, 1));
        memcpy(data[s] + off[s], sp.data + b, en - b);
        json_object_set_new(h[s], k, json_pack("{s:O, s:O, s:[I, I]}", "dtype", json_object_get(v, "dtype"), "shape",
                                               json_object_get(v, "shape"), "data_offsets", (json_int_t)off[s],
                                               (json_int_t)(off[s] + en - b)));
        off[s] += en - b;
        json_object_set_new(wm, k, json_string(names[s]));
    }
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[s]);
        st_write(p, h[s], data[s], off[s]);
        json_decref(h[s]);
        free(data[s]);
    }
    json_t *idx = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)sp.data_len, "weight_map", wm);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_dump_file(idx, p, JSON_INDENT(2));
    json_decref(sp.hdr);
    free(sp.data);

    sf_model *a = NULL, *b = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(dir, NULL, &a, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    rc_ = sf_model_load(test_data(TINY), NULL, &b, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(a->n_maps == 2 && a->weight_bytes == b->weight_bytes);
    CHECK(!memcmp(a->tok_embd.data, b->tok_embd.data, 3000 * 16 * 2));
    CHECK(!memcmp(a->lm_head.data, b->lm_head.data, 3000 * 16 * 2));
    for (int l = 0; l < 2; l++) {
        CHECK(!memcmp(a->layers[l].wq.data, b->layers[l].wq.data, 16 * 16 * 2));
        CHECK(!memcmp(a->layers[l].wdown.data, b->layers[l].wdown.data, 16 * 64 * 2));
        CHECK(!memcmp(a->layers[l].ffn_norm.data, b->layers[l].ffn_norm.data, 16 * 2));
    }
    sf_model_free(a);
    sf_model_free(b);

    /* the index names a shard that is not there */
    json_object_set_new(wm, "model.norm.weight", json_string("model-00003-of-00003.safetensors"));
    json_dump_file(idx, p, JSON_INDENT(2));
    expect_fail(dir, SF_ENOTFOUND, "model-00003-of-00003.safetensors", "missing");
    /* the index points outside the folder */
    json_object_set_new(wm, "model.norm.weight", json_string("../etc/passwd"));
    json_dump_file(idx, p, JSON_INDENT(2));
    expect_fail(dir, SF_EFORMAT, "../etc/passwd", NULL);
    json_decref(idx);
}

/* ---- bad Hugging Face inputs -------------------------------------------------------------- */
static void bad_shape(json_t *h)
{
    json_object_set_new(json_object_get(h, "model.layers.0.self_attn.q_proj.weight"), "shape", json_pack("[i, i]", 8, 32));
}
static void bad_dtype_i64(json_t *h)
{
    json_t *t = json_object_get(h, "model.layers.0.input_layernorm.weight");
    json_object_set_new(t, "dtype", json_string("I64"));
    json_object_set_new(t, "shape", json_pack("[i]", 4));
}
static void bad_dtype_f8(json_t *h)
{
    json_t *t = json_object_get(h, "model.norm.weight");
    json_object_set_new(t, "dtype", json_string("F8_E4M3"));
    json_object_set_new(t, "shape", json_pack("[i]", 32));
}
static void bad_offsets(json_t *h)
{
    json_object_set_new(json_object_get(h, "model.norm.weight"), "data_offsets", json_pack("[i, i]", 1000000, 1000032));
}
static void bad_overlap(json_t *h)
{
    json_t *a = json_object_get(json_object_get(h, "model.norm.weight"), "data_offsets");
    json_t *b = json_object_get(json_object_get(h, "model.layers.0.input_layernorm.weight"), "data_offsets");
    json_object_set_new(json_object_get(h, "model.norm.weight"), "data_offsets", json_copy(b));
    (void)a;
}
static void bad_type_in_header(json_t *h) { json_object_set_new(h, "model.norm.weight", json_string("oops")); }

TEST(hf_bad_inputs)
{
    char p[600];
    sf_model_config c;
    (void)c;
    expect_fail(tmp_path("no-such-folder"), SF_ENOTFOUND, "no-such-folder", "not found");
    expect_fail(mkdir_tmp("empty"), SF_ENOTFOUND, "config.json", NULL);
    const char *d = config_dir("notjson", "{\"model_type\": llama");
    expect_fail(d, SF_EFORMAT, "not valid JSON", NULL);
    d = config_dir("gpt2", "{\"model_type\": \"gpt2\", \"architectures\": [\"GPT2LMHeadModel\"], \"vocab_size\": 50257}");
    expect_fail(d, SF_EUNSUPPORTED, "gpt2", "llama, qwen2, mistral");
    d = mkdir_tmp("noweights");
    snprintf(p, sizeof p, "%s/config.json", d);
    copy_file(test_data(TINY "/config.json"), p);
    expect_fail(d, SF_ENOTFOUND, "model.safetensors", NULL);
    /* truncated: the last tensors run past the end */
    d = mkdir_tmp("truncated");
    snprintf(p, sizeof p, "%s/config.json", d);
    copy_file(test_data(TINY "/config.json"), p);
    size_t n;
    char *st = read_all(test_data(TINY "/model.safetensors"), &n);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    write_file(p, st, n - 1000);
    expect_fail(d, SF_EFORMAT, "truncated", NULL);
    /* header length past the end of the file */
    uint64_t big = 1u << 20;
    memcpy(st, &big, 8);
    write_file(p, st, 4096);
    expect_fail(d, SF_EFORMAT, "header length", NULL);
    write_file(p, st, 5);
    expect_fail(d, SF_EFORMAT, "too short", NULL);
    /* header that is not JSON */
    uint64_t ten = 10;
    memcpy(st, &ten, 8);
    memcpy(st + 8, "not json!!", 10);
    write_file(p, st, 200);
    expect_fail(d, SF_EFORMAT, "not a JSON", NULL);
    write_file(p, "", 0);
    expect_fail(d, SF_EFORMAT, "empty", NULL);
    free(st);
    expect_fail(tiny_variant("offsets", bad_offsets), SF_EFORMAT, "model.norm.weight", "data_offsets");
    expect_fail(tiny_variant("overlap", bad_overlap), SF_EFORMAT, "overlap", NULL);
    expect_fail(tiny_variant("hdrtype", bad_type_in_header), SF_EFORMAT, "model.norm.weight", NULL);
    expect_fail(tiny_variant("missing", drop_up_proj), SF_ENOTFOUND, "model.layers.1.mlp.up_proj.weight", NULL);
    expect_fail(tiny_variant("shape", bad_shape), SF_EFORMAT, "model.layers.0.self_attn.q_proj.weight", "[8, 32]");
    expect_fail(tiny_variant("shape", bad_shape), SF_EFORMAT, "expected [16, 16]", "model.safetensors");
    expect_fail(tiny_variant("i64", bad_dtype_i64), SF_EUNSUPPORTED, "model.layers.0.input_layernorm.weight", "I64");
    expect_fail(tiny_variant("f8", bad_dtype_f8), SF_EUNSUPPORTED, "model.norm.weight", "F8_E4M3");
    /* tied config with an untied checkpoint loads (lm_head ignored); untied without lm_head fails */
    d = tiny_variant("tied", NULL);
    snprintf(p, sizeof p, "%s/config.json", d);
    char *cfg = read_all(p, NULL);
    char *t = strstr(cfg, "\"tie_word_embeddings\": false");
    REQUIRE(t, "config has tie_word_embeddings");
    memcpy(t, "\"tie_word_embeddings\": true ", 28);
    write_file(p, cfg, strlen(cfg));
    free(cfg);
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(d, NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(m->cfg.tie_embeddings == 1 && m->lm_head.data == m->tok_embd.data);
    sf_model_free(m);
}

/* A qwen2 folder written here: q/k/v biases, tied embeddings (no lm_head), F16 matrices and
 * F32 norms side by side. */
static const char *qwen2_folder(const char *name, int with_bias)
{
    const char *dir = mkdir_tmp(name);
    char p[600], n[128];
    snprintf(p, sizeof p, "%s/config.json", dir);
    const char *cfg = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 50,"
                      "\"hidden_size\": 16, \"intermediate_size\": 32, \"num_hidden_layers\": 1,"
                      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"tie_word_embeddings\": true,"
                      "\"rope_theta\": 1000000.0, \"sliding_window\": 32768, \"use_sliding_window\": false,"
                      "\"max_position_embeddings\": 32768, \"torch_dtype\": \"float16\", \"eos_token_id\": 3}";
    write_file(p, cfg, strlen(cfg));
    struct { const char *name; int rows, cols, f32; } t[] = {
        { "model.embed_tokens.weight", 50, 16, 0 }, { "model.norm.weight", 0, 16, 1 },
        { "input_layernorm.weight", 0, 16, 1 }, { "post_attention_layernorm.weight", 0, 16, 1 },
        { "self_attn.q_proj.weight", 16, 16, 0 }, { "self_attn.k_proj.weight", 8, 16, 0 },
        { "self_attn.v_proj.weight", 8, 16, 0 }, { "self_attn.o_proj.weight", 16, 16, 0 },
        { "self_attn.q_proj.bias", 0, 16, 0 }, { "self_attn.k_proj.bias", 0, 8, 0 }, { "self_attn.v_proj.bias", 0, 8, 0 },
        { "mlp.gate_proj.weight", 32, 16, 0 }, { "mlp.up_proj.weight", 32, 16, 0 }, { "mlp.down_proj.weight", 16, 32, 0 },
    };
    json_t *h = json_object();
    char *data = calloc(1, 1 << 16);
    size_t off = 0;
    for (size_t i = 0; i < SF_ARRAY_LEN(t); i++) {
        if (!with_bias && strstr(t[i].name, "bias")) continue;
        if (i < 2) snprintf(n, sizeof n, "%s", t[i].name);
        else snprintf(n, sizeof n, "model.layers.0.%s", t[i].name);
        size_t cnt = (size_t)(t[i].rows ? t[i].rows : 1) * (size_t)t[i].cols, es = t[i].f32 ? 4 : 2;
        for (size_t k = 0; k < cnt; k++) {
            float v = (float)(k % 13) * 0.01f;
            if (t[i].f32) memcpy(data + off + 4 * k, &v, 4);
            else { uint16_t hv = sf_f32_to_f16(v); memcpy(data + off + 2 * k, &hv, 2); }
        }
        json_t *shape = t[i].rows ? json_pack("[i, i]", t[i].rows, t[i].cols) : json_pack("[i]", t[i].cols);
        json_object_set_new(h, n, json_pack("{s:s, s:o, s:[I, I]}", "dtype", t[i].f32 ? "F32" : "F16", "shape", shape,
                                            "data_offsets", (json_int_t)off, (json_int_t)(off + cnt * es)));
        off += cnt * es;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    st_write(p, h, data, off);
    json_decref(h);
    free(data);
    return dir;
}

TEST(hf_qwen2_bias_tied)
{
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(qwen2_folder("qwen2", 1), NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    const sf_model_config *c = &m->cfg;
    CHECK(!strcmp(c->arch, "qwen2") && c->attention_bias == 1 && c->tie_embeddings == 1 && c->sliding_window == 0);
    CHECK(c->n_kv_heads == 2 && c->head_dim == 4 && c->rope_theta == 1000000.0f && c->eos_ids[0] == 3);
    CHECK(m->lm_head.data == m->tok_embd.data && c->dtype == SF_DT_F16);
    CHECK(m->layers[0].bk.data && m->layers[0].bk.rows == 1 && m->layers[0].bk.cols == 8 &&
          m->layers[0].bk.dtype == SF_DT_F16);
    CHECK(m->layers[0].attn_norm.dtype == SF_DT_F32 && ((const float *)m->layers[0].attn_norm.data)[3] == 0.03f);
    CHECK(sf_f16_to_f32(((const uint16_t *)m->layers[0].wup.data)[14]) == sf_f16_to_f32(sf_f32_to_f16(0.01f)));
    sf_model_free(m);
    expect_fail(qwen2_folder("qwen2-nobias", 0), SF_ENOTFOUND, "model.layers.0.self_attn.q_proj.bias", NULL);
}

/* ---- GGUF ---------------------------------------------------------------------------------- */
TEST(gguf_stories260k)
{
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(test_data("stories260K/stories260K.gguf"), NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    const sf_model_config *c = &m->cfg;
    CHECK(!strcmp(c->arch, "llama") && c->hidden == 64 && c->intermediate == 172 && c->n_layers == 5);
    CHECK(c->n_heads == 8 && c->n_kv_heads == 4 && c->head_dim == 8 && c->vocab_size == 512);
    CHECK(c->max_pos == 2048 && fabsf(c->rms_eps - 1e-5f) < 1e-12f && c->rope_theta == 10000.0f);
    CHECK(c->rope_interleaved == 1 && c->rope_scaling == SF_ROPE_SCALING_NONE);
    CHECK(c->bos_id == 1 && c->n_eos == 1 && c->eos_ids[0] == 2 && c->dtype == SF_DT_F32);
    /* output.weight is stored as its own copy: untied, equal bytes */
    CHECK(c->tie_embeddings == 0 && m->lm_head.data != m->tok_embd.data);
    CHECK(!memcmp(m->lm_head.data, m->tok_embd.data, 512 * 64 * 4));
    CHECK(m->layers[0].wq.rows == 64 && m->layers[0].wq.cols == 64 && m->layers[0].wk.rows == 32);
    CHECK(m->layers[4].wdown.rows == 64 && m->layers[4].wdown.cols == 172);
    CHECK(!strcmp(m->name, "stories260K") && m->tok != NULL);
    /* tensor data starts at 14176 (README) */
    CHECK((const uint8_t *)m->tok_embd.data >= (const uint8_t *)m->maps[0].addr + 14176);
    /* the same weights as the llama2.c checkpoint: its first weight (token embedding[0][0])
     * follows the 28-byte header */
    size_t n;
    char *bin = read_all(test_data("stories260K/stories260K.bin"), &n);
    REQUIRE(bin, "read stories260K.bin");
    CHECK(!memcmp(bin + 28, m->tok_embd.data, 512 * 64 * 4));
    free(bin);
    sf_model_free(m);
}

TEST(gguf_llama2_tiny_f16)
{
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(test_data("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf"), NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    const sf_model_config *c = &m->cfg;
    CHECK(c->hidden == 8 && c->n_layers == 1 && c->intermediate == 32 && c->n_heads == 2 && c->n_kv_heads == 2);
    CHECK(c->head_dim == 4 && c->max_pos == 4096 && c->vocab_size == 32000 && c->rope_interleaved == 1);
    CHECK(c->dtype == SF_DT_F16 && m->tok_embd.dtype == SF_DT_F16 && m->lm_head.dtype == SF_DT_F16);
    CHECK(m->layers[0].attn_norm.dtype == SF_DT_F32 && m->out_norm.dtype == SF_DT_F32);
    CHECK(m->tok_embd.rows == 32000 && m->tok_embd.cols == 8 && c->tie_embeddings == 0);
    CHECK(m->tok != NULL && c->bos_id == 1 && c->eos_ids[0] == 2);
    CHECK(m->weight_bytes == (size_t)(2 * 32000 * 8 * 2 + 4 * 8 * 8 * 2 + 3 * 32 * 8 * 2 + 3 * 8 * 4));
    /* F16 values are finite and small (random init) */
    const uint16_t *w = m->layers[0].wq.data;
    float mx = 0;
    for (int i = 0; i < 64; i++) mx = fmaxf(mx, fabsf(sf_f16_to_f32(w[i])));
    CHECK_MSG(mx > 0 && mx < 10, "max |wq| %g", mx);
    sf_model_free(m);
}

/* A small GGUF writer for synthetic files. */
typedef struct gw { uint8_t *b; size_t n, cap; } gw;
static void gw_put(gw *w, const void *p, size_t n)
{
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 4096;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void gw_u32(gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(gw *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_str(gw *w, const char *s) { gw_u64(w, strlen(s)); gw_put(w, s, strlen(s)); }
static void gw_kv_u32(gw *w, const char *k, uint32_t v) { gw_str(w, k); gw_u32(w, SF_GGUF_U32); gw_u32(w, v); }
static void gw_kv_f32(gw *w, const char *k, float v) { gw_str(w, k); gw_u32(w, SF_GGUF_F32); gw_put(w, &v, 4); }
static void gw_kv_str(gw *w, const char *k, const char *v) { gw_str(w, k); gw_u32(w, SF_GGUF_STRING); gw_str(w, v); }
static void gw_pad(gw *w, size_t align) { while (w->n % align) { uint8_t z = 0; gw_put(w, &z, 1); } }

enum { G_H = 32, G_FF = 64, G_V = 64, G_HEADS = 2, G_KV = 1, G_HD = 16 };

typedef struct gopts {
    uint32_t version;
    int q8;                   /* matrices as Q8_0 */
    int q_type;               /* override attn_q's type (-1: none) */
    int tied;                 /* no output.weight */
    int bad_strlen;           /* the architecture string's length points past the end */
    uint32_t alignment;       /* 0: default 32, not written */
    int qwen2;                /* architecture qwen2: q/k/v biases */
} gopts;

/* Q8_0 test pattern: block b has scale 0.01*(b%7+1), quant i is (b*31+i*7)%255-127. */
static float q8_expect(int64_t idx) { int64_t b = idx / 32, i = idx % 32; return sf_f16_to_f32(sf_f32_to_f16(0.01f * (float)(b % 7 + 1))) * (float)((b * 31 + i * 7) % 255 - 127); }

static size_t gguf_synth(const char *path, gopts o)
{
    gw w = { 0 };
    struct { const char *name; int64_t ne0, ne1; int mat; } t[] = {
        { "token_embd.weight", G_H, G_V, 1 }, { "output_norm.weight", G_H, 1, 0 }, { "output.weight", G_H, G_V, 1 },
        { "blk.0.attn_norm.weight", G_H, 1, 0 }, { "blk.0.attn_q.weight", G_H, G_HEADS * G_HD, 1 },
        { "blk.0.attn_k.weight", G_H, G_KV * G_HD, 1 }, { "blk.0.attn_v.weight", G_H, G_KV * G_HD, 1 },
        { "blk.0.attn_output.weight", G_HEADS * G_HD, G_H, 1 }, { "blk.0.ffn_norm.weight", G_H, 1, 0 },
        { "blk.0.ffn_gate.weight", G_H, G_FF, 1 }, { "blk.0.ffn_up.weight", G_H, G_FF, 1 },
        { "blk.0.ffn_down.weight", G_FF, G_H, 1 }, { "blk.0.attn_q.bias", G_HEADS * G_HD, 1, 0 },
        { "blk.0.attn_k.bias", G_KV * G_HD, 1, 0 }, { "blk.0.attn_v.bias", G_KV * G_HD, 1, 0 },
    };
    int nt = (int)SF_ARRAY_LEN(t) - (o.qwen2 ? 0 : 3);
    uint32_t align = o.alignment ? o.alignment : 32;
    gw_put(&w, "GGUF", 4);
    gw_u32(&w, o.version);
    if (o.bad_strlen) {
        gw_u64(&w, 0);
        gw_u64(&w, 1);
        gw_str(&w, "general.architecture");
        gw_u32(&w, SF_GGUF_STRING);
        gw_u64(&w, 1ull << 40);
        gw_put(&w, "llama", 5);
        goto done;
    }
    gw_u64(&w, (uint64_t)(nt - (o.tied ? 1 : 0)));
    gw_u64(&w, 17 + (o.alignment ? 1 : 0));
    const char *A = o.qwen2 ? "qwen2" : "llama";
    char key[96];
#define K(S) (snprintf(key, sizeof key, "%s.%s", A, S), key)
    gw_kv_str(&w, "general.architecture", A);
    gw_kv_u32(&w, K("embedding_length"), G_H);
    gw_kv_u32(&w, K("block_count"), 1);
    gw_kv_u32(&w, K("feed_forward_length"), G_FF);
    gw_kv_u32(&w, K("attention.head_count"), G_HEADS);
    gw_kv_u32(&w, K("attention.head_count_kv"), G_KV);
    gw_kv_u32(&w, K("rope.dimension_count"), G_HD);
    gw_kv_f32(&w, K("rope.freq_base"), 500000.0f);
    gw_kv_f32(&w, K("attention.layer_norm_rms_epsilon"), 1e-6f);
    gw_kv_u32(&w, K("context_length"), 128);
#undef K
    if (o.alignment) gw_kv_u32(&w, "general.alignment", o.alignment);
    /* one of every other metadata type */
    { gw_str(&w, "test.u8"); gw_u32(&w, SF_GGUF_U8); uint8_t v = 200; gw_put(&w, &v, 1); }
    { gw_str(&w, "test.i16"); gw_u32(&w, SF_GGUF_I16); int16_t v = -300; gw_put(&w, &v, 2); }
    { gw_str(&w, "test.i64"); gw_u32(&w, SF_GGUF_I64); gw_u64(&w, (uint64_t)-5); }
    { gw_str(&w, "test.f64"); gw_u32(&w, SF_GGUF_F64); double v = 2.5; gw_put(&w, &v, 8); }
    { gw_str(&w, "test.bool"); gw_u32(&w, SF_GGUF_BOOL); uint8_t v = 1; gw_put(&w, &v, 1); }
    { gw_str(&w, "test.strs"); gw_u32(&w, SF_GGUF_ARRAY); gw_u32(&w, SF_GGUF_STRING); gw_u64(&w, 2); gw_str(&w, "a"); gw_str(&w, "bc"); }
    { gw_str(&w, "test.nested"); gw_u32(&w, SF_GGUF_ARRAY); gw_u32(&w, SF_GGUF_ARRAY); gw_u64(&w, 2);
      for (int k = 0; k < 2; k++) { gw_u32(&w, SF_GGUF_I32); gw_u64(&w, 3); for (int j = 0; j < 3; j++) gw_u32(&w, (uint32_t)j); } }
    size_t offs[16], off = 0;
    for (int i = 0; i < nt; i++) {
        if (o.tied && !strcmp(t[i].name, "output.weight")) continue;
        int q8 = o.q8 && t[i].mat;
        int type = q8 ? SF_GGML_Q8_0 : SF_GGML_F32;
        if (o.q_type >= 0 && !strcmp(t[i].name, "blk.0.attn_q.weight")) type = o.q_type;
        gw_str(&w, t[i].name);
        gw_u32(&w, t[i].ne1 > 1 ? 2 : 1);
        gw_u64(&w, (uint64_t)t[i].ne0);
        if (t[i].ne1 > 1) gw_u64(&w, (uint64_t)t[i].ne1);
        gw_u32(&w, (uint32_t)type);
        gw_u64(&w, off);
        offs[i] = off;
        size_t bytes = q8 ? (size_t)(t[i].ne0 * t[i].ne1 / 32 * 34) : (size_t)(t[i].ne0 * t[i].ne1 * 4);
        off += (bytes + align - 1) / align * align;
    }
    gw_pad(&w, align);
    size_t data0 = w.n;
    for (int i = 0; i < nt; i++) {
        if (o.tied && !strcmp(t[i].name, "output.weight")) continue;
        while (w.n < data0 + offs[i]) { uint8_t z = 0; gw_put(&w, &z, 1); }
        int64_t cnt = t[i].ne0 * t[i].ne1;
        if (o.q8 && t[i].mat) {
            for (int64_t b = 0; b < cnt / 32; b++) {
                uint16_t d = sf_f32_to_f16(0.01f * (float)(b % 7 + 1));
                gw_put(&w, &d, 2);
                for (int k = 0; k < 32; k++) { int8_t q = (int8_t)((b * 31 + k * 7) % 255 - 127); gw_put(&w, &q, 1); }
            }
        } else {
            for (int64_t k = 0; k < cnt; k++) { float v = t[i].mat ? 0.001f * (float)(k % 100) : 1.0f; gw_put(&w, &v, 4); }
        }
    }
    gw_pad(&w, align);
done:
    write_file(path, w.b, w.n);
    free(w.b);
    return w.n;
}

TEST(gguf_synthetic_q8_0)
{
    const char *p = tmp_path("q8.gguf");
    gguf_synth(p, (gopts){ .version = 3, .q8 = 1, .q_type = -1, .tied = 1, .alignment = 64 });
    sf_gguf *g = NULL;
    sf_error e = { 0 };
    rc_ = sf_gguf_open(p, &g, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(g->version == 3 && g->alignment == 64 && g->data_offset % 64 == 0);
    int64_t iv = 0;
    double fv = 0;
    CHECK(sf_gguf_get_int(g, "test.u8", &iv, &e) == SF_OK && iv == 200);
    CHECK(sf_gguf_get_int(g, "test.i16", &iv, &e) == SF_OK && iv == -300);
    CHECK(sf_gguf_get_int(g, "test.i64", &iv, &e) == SF_OK && iv == -5);
    CHECK(sf_gguf_get_float(g, "test.f64", &fv, &e) == SF_OK && fv == 2.5);
    CHECK(sf_gguf_get_int(g, "test.bool", &iv, &e) == SF_OK && iv == 1);
    CHECK(sf_gguf_get_int(g, "general.architecture", &iv, &e) == SF_EFORMAT);
    CHECK(sf_gguf_get_int(g, "no.such.key", &iv, &e) == SF_ENOTFOUND);
    const sf_gguf_kv *kv = sf_gguf_find(g, "test.strs");
    CHECK(kv && kv->arr_n == 2 && !strcmp(kv->arr_str[1], "bc"));
    kv = sf_gguf_find(g, "test.nested");
    CHECK(kv && kv->type == SF_GGUF_ARRAY && kv->arr_type == SF_GGUF_ARRAY && kv->arr_n == 2);
    const sf_gguf_tensor *t = sf_gguf_find_tensor(g, "blk.0.ffn_down.weight");
    REQUIRE(t && t->dtype == SF_DT_Q8_0 && t->ne[0] == G_FF && t->ne[1] == G_H, "ffn_down Q8_0");
    float deq[G_FF * G_H];
    sf_dequant_row(SF_DT_Q8_0, t->data, G_FF * G_H, deq);
    int bad = 0;
    for (int i = 0; i < G_FF * G_H; i++) bad += deq[i] != q8_expect(i);
    CHECK_MSG(!bad, "%d dequantized values differ", bad);
    CHECK(deq[33] == q8_expect(33) && deq[33] != 0);
    sf_gguf_close(g, 0);

    sf_model *m = NULL;
    rc_ = sf_model_load(p, NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(m->cfg.hidden == G_H && m->cfg.n_kv_heads == G_KV && m->cfg.head_dim == G_HD && m->cfg.vocab_size == G_V);
    CHECK(m->cfg.rope_theta == 500000.0f && m->cfg.max_pos == 128 && m->cfg.dtype == SF_DT_Q8_0);
    CHECK(m->cfg.tie_embeddings == 1 && m->lm_head.data == m->tok_embd.data);
    CHECK(m->layers[0].wq.dtype == SF_DT_Q8_0 && m->layers[0].attn_norm.dtype == SF_DT_F32);
    CHECK(m->tok == NULL && !strcmp(m->name, "q8"));
    sf_dequant_row(SF_DT_Q8_0, m->layers[0].wdown.data, G_FF * G_H, deq);
    CHECK(deq[100] == q8_expect(100));
    sf_model_free(m);
}

TEST(gguf_synthetic_qwen2)
{
    const char *p = tmp_path("qwen2.gguf");
    gguf_synth(p, (gopts){ .version = 3, .q_type = -1, .qwen2 = 1 });
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(p, NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(!strcmp(m->cfg.arch, "qwen2") && m->cfg.attention_bias == 1 && m->cfg.rope_interleaved == 0);
    CHECK(m->cfg.hidden == G_H && m->cfg.n_kv_heads == G_KV && m->cfg.tie_embeddings == 0);
    CHECK(m->layers[0].bq.data && m->layers[0].bq.cols == G_HEADS * G_HD && m->layers[0].bv.cols == G_KV * G_HD);
    CHECK(((const float *)m->layers[0].bk.data)[0] == 1.0f);
    sf_model_free(m);
}

/* A 1-layer model (hidden 256, ffn 512) whose matrices take GGUF's block formats in turn from
 * `first` (so q, k and v differ), norms F32; its matrices' bytes go to mats[] for comparison. */
enum { B_H = 256, B_FF = 512, B_V = 40, B_HEADS = 4, B_KV = 2, B_HD = 64, B_NT = 12 };
typedef struct bmat { const char *name; int64_t ne0, ne1; sf_dtype t; uint8_t *data; size_t bytes; } bmat;

static int ggml_type_of(sf_dtype t)
{
    static const struct { sf_dtype t; int g; } m[] = {
        { SF_DT_F32, SF_GGML_F32 }, { SF_DT_Q8_0, SF_GGML_Q8_0 }, { SF_DT_Q4_0, SF_GGML_Q4_0 },
        { SF_DT_Q4_1, SF_GGML_Q4_1 }, { SF_DT_Q5_0, SF_GGML_Q5_0 }, { SF_DT_Q5_1, SF_GGML_Q5_1 },
        { SF_DT_Q2_K, SF_GGML_Q2_K }, { SF_DT_Q3_K, SF_GGML_Q3_K }, { SF_DT_Q4_K, SF_GGML_Q4_K },
        { SF_DT_Q5_K, SF_GGML_Q5_K }, { SF_DT_Q6_K, SF_GGML_Q6_K }, { SF_DT_IQ4_NL, SF_GGML_IQ4_NL },
        { SF_DT_IQ4_XS, SF_GGML_IQ4_XS },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(m); i++)
        if (m[i].t == t) return m[i].g;
    return -1;
}

/* norm_type: the type of attn_norm (SF_DT_F32 normally) */
static void gguf_blocks(const char *path, int first, sf_dtype norm_type, bmat mats[B_NT])
{
    bmat t[B_NT] = {
        { "token_embd.weight", B_H, B_V }, { "output_norm.weight", B_H, 1 }, { "output.weight", B_H, B_V },
        { "blk.0.attn_norm.weight", B_H, 1 }, { "blk.0.attn_q.weight", B_H, B_HEADS * B_HD },
        { "blk.0.attn_k.weight", B_H, B_KV * B_HD }, { "blk.0.attn_v.weight", B_H, B_KV * B_HD },
        { "blk.0.attn_output.weight", B_HEADS * B_HD, B_H }, { "blk.0.ffn_norm.weight", B_H, 1 },
        { "blk.0.ffn_gate.weight", B_H, B_FF }, { "blk.0.ffn_up.weight", B_H, B_FF }, { "blk.0.ffn_down.weight", B_FF, B_H },
    };
    sf_rng r;
    sf_rng_seed(&r, 77 + (uint64_t)first);
    int k = first;
    for (int i = 0; i < B_NT; i++) {
        t[i].t = t[i].ne1 > 1 ? qr_types[k++ % SF_ARRAY_LEN(qr_types)] : SF_DT_F32;
        if (!strcmp(t[i].name, "blk.0.attn_norm.weight")) t[i].t = norm_type;
        int64_t n = t[i].ne0 * t[i].ne1, blk = sf_dtype_block(t[i].t);
        t[i].bytes = sf_dtype_bytes(t[i].t, n);
        t[i].data = malloc(t[i].bytes);
        if (blk > 1) {
            size_t bb = sf_dtype_bytes(t[i].t, blk);
            for (int64_t b = 0; b < n / blk; b++) sf_quant_random_block(t[i].t, t[i].data + b * bb, &r);
        } else {
            for (int64_t j = 0; j < n; j++) ((float *)t[i].data)[j] = 1.0f + 0.01f * (float)(j % 7);
        }
    }
    gw w = { 0 };
    gw_put(&w, "GGUF", 4);
    gw_u32(&w, 3);
    gw_u64(&w, B_NT);
    gw_u64(&w, 10);
    gw_kv_str(&w, "general.architecture", "llama");
    gw_kv_u32(&w, "llama.embedding_length", B_H);
    gw_kv_u32(&w, "llama.block_count", 1);
    gw_kv_u32(&w, "llama.feed_forward_length", B_FF);
    gw_kv_u32(&w, "llama.attention.head_count", B_HEADS);
    gw_kv_u32(&w, "llama.attention.head_count_kv", B_KV);
    gw_kv_u32(&w, "llama.rope.dimension_count", B_HD);
    gw_kv_f32(&w, "llama.rope.freq_base", 10000.0f);
    gw_kv_f32(&w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gw_kv_u32(&w, "llama.context_length", 64);
    size_t off = 0, offs[B_NT];
    for (int i = 0; i < B_NT; i++) {
        gw_str(&w, t[i].name);
        gw_u32(&w, t[i].ne1 > 1 ? 2 : 1);
        gw_u64(&w, (uint64_t)t[i].ne0);
        if (t[i].ne1 > 1) gw_u64(&w, (uint64_t)t[i].ne1);
        gw_u32(&w, (uint32_t)ggml_type_of(t[i].t));
        gw_u64(&w, off);
        offs[i] = off;
        off += (t[i].bytes + 31) / 32 * 32;
    }
    gw_pad(&w, 32);
    size_t data0 = w.n;
    for (int i = 0; i < B_NT; i++) {
        while (w.n < data0 + offs[i]) { uint8_t z = 0; gw_put(&w, &z, 1); }
        gw_put(&w, t[i].data, t[i].bytes);
    }
    gw_pad(&w, 32);
    write_file(path, w.b, w.n);
    free(w.b);
    memcpy(mats, t, sizeof t);
}

static const sf_view *bound_view(const sf_model *m, const char *name)
{
    const sf_layer_w *l = &m->layers[0];
    static const char *names[] = { "token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                   "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_gate.weight",
                                   "blk.0.ffn_up.weight", "blk.0.ffn_down.weight", "output_norm.weight",
                                   "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight" };
    const sf_view *vs[] = { &m->tok_embd, &m->lm_head, &l->wq, &l->wk, &l->wv, &l->wo, &l->wgate, &l->wup, &l->wdown,
                            &m->out_norm, &l->attn_norm, &l->ffn_norm };
    for (size_t i = 0; i < SF_ARRAY_LEN(names); i++)
        if (!strcmp(names[i], name)) return vs[i];
    return NULL;
}

/* Every GGUF block format: sf_dequant_row against the element-by-element reference, then a file
 * with all of them (two rotations, so each format serves several tensors) loads with each
 * tensor bound to its own bytes in its own format. Vectors in a block format, rows that are not
 * whole blocks and the IQ formats are refused by name. (The forward pass over such weights is
 * test_forward's "block formats" cases.) */
/* element e of a row packed for the CUDA backend (hal.h's sf_qdev layout), read as that
 * comment describes it */
static double qdev_value(sf_dtype t, const uint8_t *r, int64_t k, int64_t e)
{
    const int64_t G = k / 32, S = k / 256, g = e / 32, sb = e / 256;
    const int i = (int)(e % 32), j = (int)(g % 8);
    if (t == SF_DT_Q8_0) return qr_f16(r + 32 * G + 2 * g) * (int8_t)r[32 * g + i];
    const uint8_t *qs = r + (t == SF_DT_Q6_K ? 0 : 16 * S) + 16 * g, *qh = r + (t == SF_DT_Q6_K ? 0 : 16 * S) + 16 * G;
    int q = (qs[i % 16] >> (4 * (i / 16))) & 15;
    const int w = i % 16, bt = w % 4, jj = w / 4, h = i / 16;
    if (t == SF_DT_Q6_K) {
        q |= ((qh[8 * g + 4 * h + bt] >> (2 * jj)) & 3) << 4;
        return qr_f16(r + 24 * G + 16 * S + 2 * sb) * (int8_t)r[24 * G + 16 * sb + 2 * j + h] * (q - 32);
    }
    if (t == SF_DT_Q5_K) q |= ((qh[4 * g + bt] >> (4 * h + jj)) & 1) << 4;
    const uint8_t *m = r + 16 * sb;
    return qr_f16(m) * qr_k4(m + 4, j, 0) * q - qr_f16(m + 2) * qr_k4(m + 4, j, 1);
}

/* The CUDA backend's repacked rows (sf_qdev_pack_row) hold every element of the file's blocks:
 * read back through the layout's description, each equals the reference's value. */
TEST(qdev_pack_rows)
{
    static const sf_dtype ts[] = { SF_DT_Q8_0, SF_DT_Q4_K, SF_DT_Q5_K, SF_DT_Q6_K };
    sf_rng rng;
    sf_rng_seed(&rng, 11);
    for (size_t ti = 0; ti < SF_ARRAY_LEN(ts); ti++)
        for (int64_t k = 256; k <= 1280; k += 512) { /* odd and even super-block counts */
            sf_dtype t = ts[ti];
            int blk = sf_dtype_block(t);
            size_t bb = sf_dtype_bytes(t, blk), rb = sf_qdev_row_bytes(t, k);
            uint8_t *src = malloc(sf_dtype_bytes(t, k)), *dst = malloc(rb);
            for (int64_t b = 0; b < k / blk; b++) sf_quant_random_block(t, src + b * bb, &rng);
            sf_qdev_pack_row(t, src, k, dst);
            int bad = 0;
            for (int64_t e = 0; e < k; e++)
                bad += qdev_value(t, dst, k, e) != qr_value(t, src + (e / blk) * bb, (int)(e % blk));
            CHECK_MSG(!bad && rb % 16 == 0 && rb >= sf_dtype_bytes(t, k) && rb < sf_dtype_bytes(t, k) + 16,
                      "%s k %lld: %d elements differ (row %zu bytes)", sf_dtype_name(t), (long long)k, bad, rb);
            free(src);
            free(dst);
        }
    CHECK(sf_qdev_ok(SF_DT_Q4_K) && !sf_qdev_ok(SF_DT_Q4_0) && sf_qdev_row_bytes(SF_DT_Q4_K, 100) == 0 &&
          sf_qdev_row_bytes(SF_DT_Q3_K, 256) == 0);
}

TEST(gguf_block_formats)
{
    sf_rng r;
    sf_rng_seed(&r, 3);
    for (size_t i = 0; i < SF_ARRAY_LEN(qr_types); i++) {
        sf_dtype t = qr_types[i];
        int blk = sf_dtype_block(t), bad = 0;
        size_t bb = sf_dtype_bytes(t, blk);
        uint8_t *b = malloc(8 * bb);
        float *y = malloc(sizeof(float) * 8 * (size_t)blk);
        for (int k = 0; k < 8; k++) sf_quant_random_block(t, b + k * bb, &r);
        sf_dequant_row(t, b, 8 * blk, y);
        double worst = 0;
        for (int e = 0; e < 8 * blk; e++) {
            double ref = qr_value(t, b + (e / blk) * bb, e % blk), d = fabs(y[e] - ref);
            bad += !(d <= 1e-7 + 1e-6 * fabs(ref));
            worst = fmax(worst, fabs(ref));
        }
        CHECK_MSG(!bad && worst > 0.01, "%s: %d of %d values differ from the reference (max |w| %g)", sf_dtype_name(t),
                  bad, 8 * blk, worst);
        free(b);
        free(y);
    }

    for (int first = 0; first < 12; first += 5) { /* three rotations of 9 matrices: every format */
        const char *p = tmp_path("blocks.gguf");
        bmat mats[B_NT];
        gguf_blocks(p, first, SF_DT_F32, mats);
        sf_model *m = NULL;
        sf_error e = { 0 };
        rc_ = sf_model_load(p, NULL, &m, &e);
        CHECK_MSG(rc_ == SF_OK, "rotation %d: %s", first, e.msg);
        for (int i = 0; i < B_NT && rc_ == SF_OK; i++) {
            const sf_view *v = bound_view(m, mats[i].name);
            int ok = v && v->dtype == mats[i].t && v->cols == mats[i].ne0 && v->rows == mats[i].ne1 &&
                     !memcmp(v->data, mats[i].data, mats[i].bytes);
            CHECK_MSG(ok, "rotation %d: %s (%s) is not bound to its bytes", first, mats[i].name, sf_dtype_name(mats[i].t));
        }
        if (rc_ == SF_OK) CHECK(m->layers[0].wq.dtype != m->layers[0].wk.dtype && m->layers[0].wk.dtype != m->layers[0].wv.dtype);
        sf_model_free(m);
        for (int i = 0; i < B_NT; i++) free(mats[i].data);
    }

    const char *p = tmp_path("blocks-bad.gguf");
    bmat mats[B_NT];
    gguf_blocks(p, 0, SF_DT_Q4_0, mats);
    for (int i = 0; i < B_NT; i++) free(mats[i].data);
    expect_fail(p, SF_EUNSUPPORTED, "blk.0.attn_norm.weight", "Q4_0 (2) for a vector");
    gguf_synth(p, (gopts){ .version = 3, .q_type = SF_GGML_Q4_K }); /* rows of 32 */
    expect_fail(p, SF_EUNSUPPORTED, "Q4_K (12) with rows of 32, not whole 256-blocks", NULL);
    gguf_synth(p, (gopts){ .version = 3, .q_type = 16 });
    expect_fail(p, SF_EUNSUPPORTED, "IQ2_XXS (16)", "not the other IQ formats");
}

TEST(gguf_bad_inputs)
{
    size_t n;
    char *b = read_all(test_data("stories260K/stories260K.gguf"), &n);
    REQUIRE(b, "read stories260K.gguf");
    const char *p = tmp_path("bad.gguf");
    memcpy(b, "GGML", 4);
    write_file(p, b, n);
    expect_fail(p, SF_EFORMAT, "not a GGUF file", "magic");
    memcpy(b, "GGUF", 4);
    uint32_t v1 = 1;
    memcpy(b + 4, &v1, 4);
    write_file(p, b, n);
    expect_fail(p, SF_EUNSUPPORTED, "version 1", NULL);
    uint32_t v3 = 3;
    memcpy(b + 4, &v3, 4);
    write_file(p, b, 5000);
    expect_fail(p, SF_EFORMAT, "truncated", NULL);
    write_file(p, b, n - 100);
    expect_fail(p, SF_EFORMAT, "does not fit", NULL);
    /* a token type outside 0..6 (tokenizer.ggml.token_type: value type u32, element type u32,
     * count u64, then int32 elements) */
    char *tt = memmem(b, n, "tokenizer.ggml.token_type", 25);
    REQUIRE(tt, "token_type key");
    int32_t bad_type = 258;
    memcpy(tt + 25 + 4 + 4 + 8 + 5 * 4, &bad_type, 4);
    write_file(p, b, n);
    expect_fail(p, SF_EFORMAT, "token_type[5] = 258", NULL);
    free(b);
    gguf_synth(p, (gopts){ .version = 3, .q_type = 12 /* Q4_K */ });
    expect_fail(p, SF_EUNSUPPORTED, "blk.0.attn_q.weight", "Q4_K");
    gguf_synth(p, (gopts){ .version = 2, .q_type = 77 });
    expect_fail(p, SF_EUNSUPPORTED, "unknown", "(77)");
    gguf_synth(p, (gopts){ .version = 3, .q_type = -1, .bad_strlen = 1 });
    expect_fail(p, SF_EFORMAT, "general.architecture", "length");
    gguf_synth(p, (gopts){ .version = 2, .q_type = -1 });
    sf_model *m = NULL;
    sf_error e = { 0 };
    CHECK_MSG(sf_model_load(p, NULL, &m, &e) == SF_OK, "v2: %s", e.msg);
    sf_model_free(m);
}

/* Truncations and byte flips of a real file: any result but a crash. */
TEST(gguf_fuzz)
{
    size_t n;
    char *b = read_all(test_data("stories260K/stories260K.gguf"), &n);
    REQUIRE(b, "read stories260K.gguf");
    const char *p = tmp_path("fuzz.gguf");
    int ok = 0;
    for (size_t cut = 0; cut < 14300; cut += 97) {
        write_file(p, b, cut);
        sf_model *m = NULL;
        sf_error e = { 0 };
        if (sf_model_load(p, NULL, &m, &e) == SF_OK) {
            ok++;
            sf_model_free(m);
        } else {
            CHECK_MSG(e.msg[0], "cut %zu: empty message", cut);
        }
    }
    CHECK_MSG(ok == 0, "%d truncated files loaded", ok);
    sf_rng r;
    sf_rng_seed(&r, 1234);
    for (int i = 0; i < 150; i++) {
        char *c = malloc(n);
        memcpy(c, b, n);
        for (int k = 0; k < 4; k++) c[sf_rng_next(&r) % 14176] ^= (char)(1u << (sf_rng_next(&r) % 8));
        write_file(p, c, n);
        sf_model *m = NULL;
        sf_error e = { 0 };
        if (sf_model_load(p, NULL, &m, &e) == SF_OK) sf_model_free(m);
        else CHECK_MSG(e.msg[0], "flip %d: empty message", i);
        free(c);
    }
    free(b);
}

/* Byte flips in a safetensors header and truncations: any result but a crash. */
TEST(safetensors_fuzz)
{
    size_t n;
    char *b = read_all(test_data(TINY "/model.safetensors"), &n);
    REQUIRE(b, "read model.safetensors");
    const char *d = tiny_variant("st-fuzz", NULL);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    sf_rng r;
    sf_rng_seed(&r, 99);
    int loaded = 0;
    for (int i = 0; i < 200; i++) {
        char *c = malloc(n);
        memcpy(c, b, n);
        for (int k = 0; k < 3; k++) c[sf_rng_next(&r) % (8 + 2160)] ^= (char)(1u << (sf_rng_next(&r) % 8));
        size_t len = i % 4 == 3 ? sf_rng_next(&r) % n : n;
        write_file(p, c, len);
        sf_model *m = NULL;
        sf_error e = { 0 };
        if (sf_model_load(d, NULL, &m, &e) == SF_OK) {
            loaded++;
            CHECK(sf_model_validate(m, &e) == SF_OK);
            sf_model_free(m);
        } else {
            CHECK_MSG(e.msg[0], "flip %d: empty message", i);
        }
        free(c);
    }
    CHECK_MSG(loaded < 200, "every corrupted file loaded");
    free(b);
}

/* The SentencePiece vocabulary of stories260K (scores, no merges) through the tokenizer. */
TEST(gguf_tokenizer)
{
    sf_model *m = NULL;
    sf_error e = { 0 };
    rc_ = sf_model_load(test_data("stories260K/stories260K.gguf"), NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    REQUIRE(m->tok, "tokenizer from metadata");
    CHECK(sf_tok_vocab_size(m->tok) == 512 && sf_tok_bos(m->tok) == 1 && sf_tok_eos(m->tok) == 2);
    const char *text = "Once upon a time, there was a little girl named Lily.";
    int32_t *ids = NULL;
    size_t nid = 0;
    rc_ = sf_tok_encode(m->tok, text, strlen(text), 1, &ids, &nid, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(nid > 5 && ids[0] == 1);
    char *back = NULL;
    rc_ = sf_tok_decode(m->tok, ids, nid, 1, &back, &e);
    CHECK_MSG(rc_ == SF_OK && back && !strcmp(back, text), "decoded '%s'", back ? back : e.msg);
    free(back);
    free(ids);
    sf_model_free(m);
}

/* ---- demo, dummy ------------------------------------------------------------------------ */
static int same_file(const char *a, const char *b)
{
    size_t na, nb;
    char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = x && y && na == nb && !memcmp(x, y, na);
    free(x);
    free(y);
    return same;
}

TEST(demo_model)
{
    const char *a = tmp_path("demo-a"), *b = tmp_path("demo-b"), *c = tmp_path("demo-c");
    sf_error e = { 0 };
    rc_ = sf_demo_write(a, 7, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    rc_ = sf_demo_write(b, 7, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    rc_ = sf_demo_write(c, 8, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    static const char *files[] = { "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                   "tokenizer_config.json" };
    char pa[600], pb[600], pc[600];
    for (size_t i = 0; i < SF_ARRAY_LEN(files); i++) {
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        CHECK_MSG(same_file(pa, pb), "%s differs for the same seed", files[i]);
    }
    snprintf(pa, sizeof pa, "%s/model.safetensors", a);
    snprintf(pc, sizeof pc, "%s/model.safetensors", c);
    CHECK(!same_file(pa, pc));
    snprintf(pa, sizeof pa, "%s/tokenizer.json", a);
    snprintf(pc, sizeof pc, "%s/tokenizer.json", c);
    CHECK(same_file(pa, pc)); /* the tokenizer does not depend on the seed */

    sf_model *m = NULL;
    rc_ = sf_model_load(a, NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    const sf_model_config *k = &m->cfg;
    CHECK(k->hidden == 256 && k->n_layers == 4 && k->n_heads == 8 && k->n_kv_heads == 4 && k->head_dim == 32);
    CHECK(k->intermediate == 688 && k->max_pos == 2048 && k->rope_theta == 500000.0f && k->tie_embeddings == 0);
    /* tests/fixtures/hf_logits.json was made from these exact bytes: the demo must not drift */
    CHECK_MSG(k->vocab_size == 1763, "vocab %d", k->vocab_size);
    CHECK(k->bos_id == k->vocab_size - 5 && k->n_eos == 2 && k->eos_ids[1] == k->vocab_size - 1);
    REQUIRE(m->tok, "demo has a tokenizer");
    CHECK_MSG(sf_tok_vocab_size(m->tok) == k->vocab_size, "tokenizer %d, config %d", sf_tok_vocab_size(m->tok),
              k->vocab_size);
    /* the trained byte-level BPE: BOS added, common words are single tokens, round trip exact */
    const char *text = "Once upon a time, the lighthouse keeper's daughter counted 112 steps.";
    int32_t *ids = NULL;
    size_t nid = 0;
    rc_ = sf_tok_encode(m->tok, text, strlen(text), 1, &ids, &nid, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(nid > 5 && nid < 30 && ids[0] == k->bos_id);
    CHECK(sf_tok_lookup(m->tok, "\xc4\xa0lighthouse") >= 0 && sf_tok_lookup(m->tok, "<|eot_id|>") == k->vocab_size - 1);
    char *back = NULL;
    rc_ = sf_tok_decode(m->tok, ids + 1, nid - 1, 1, &back, &e);
    CHECK_MSG(rc_ == SF_OK && back && !strcmp(back, text), "decoded '%s'", back ? back : e.msg);
    free(back);
    free(ids);
    CHECK(sf_tok_is_eog(m->tok, k->vocab_size - 1));
    /* weights: matrices ~N(0, 0.02), norms ~1 + N(0, 0.1) */
    const uint16_t *w = m->layers[2].wup.data;
    double s = 0, s2 = 0;
    int64_t cnt = 688 * 256;
    for (int64_t i = 0; i < cnt; i++) {
        double x = sf_bf16_to_f32(w[i]);
        s += x;
        s2 += x * x;
    }
    double sd = sqrt(s2 / cnt - (s / cnt) * (s / cnt));
    CHECK_MSG(fabs(sd - 0.02) < 0.001 && fabs(s / cnt) < 0.001, "std %g mean %g", sd, s / cnt);
    const uint16_t *nw = m->layers[0].attn_norm.data;
    s = 0;
    for (int i = 0; i < 256; i++) s += sf_bf16_to_f32(nw[i]);
    CHECK_MSG(fabs(s / 256 - 1) < 0.03, "norm mean %g", s / 256);
    sf_model_free(m);
}

TEST(demo_path)
{
    char dir[1024];
    sf_error e = { 0 };
    setenv("SEMFLOW_DEMO_DIR", tmp_path("cache/semflow/demo"), 1);
    rc_ = sf_demo_path(dir, sizeof dir, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(!strcmp(dir, tmp_path("cache/semflow/demo")));
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat st1, st2;
    REQUIRE(stat(p, &st1) == 0, "demo written");
    rc_ = sf_demo_path(dir, sizeof dir, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    REQUIRE(stat(p, &st2) == 0, "still there");
    CHECK(st1.st_ino == st2.st_ino); /* not rewritten */
    /* a stale stamp makes it rewrite */
    snprintf(p, sizeof p, "%s/semflow-demo.version", dir);
    write_file(p, "old\n", 4);
    rc_ = sf_demo_path(dir, sizeof dir, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    snprintf(p, sizeof p, "%s/semflow-demo.version", dir);
    char *stamp = read_all(p, NULL);
    CHECK(stamp && strcmp(stamp, "old\n"));
    free(stamp);
    sf_model *m = NULL;
    rc_ = sf_model_load("demo", NULL, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(!strcmp(m->name, "demo") && m->random_weights == 1 && m->cfg.hidden == 256);
    sf_model_free(m);
}

TEST(dummy_weights)
{
    const char *d = config_dir("dummy", "{\"model_type\": \"qwen2\", \"vocab_size\": 500, \"hidden_size\": 64, "
                                        "\"intermediate_size\": 96, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
                                        "\"num_key_value_heads\": 2, \"tie_word_embeddings\": true}");
    sf_model *m = NULL;
    sf_error e = { 0 };
    sf_load_opts o = { .dummy = 1, .seed = 3 };
    rc_ = sf_model_load(d, &o, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(m->random_weights == 1 && m->cfg.dtype == SF_DT_BF16 && m->tok == NULL);
    CHECK(m->lm_head.data == m->tok_embd.data && m->layers[2].bv.data && m->layers[2].bv.cols == 32);
    CHECK(sf_model_validate(m, &e) == SF_OK);
    const uint16_t *n = m->layers[1].ffn_norm.data, *w = m->layers[1].wgate.data;
    int ones = 0, in_range = 0, nonzero = 0;
    for (int i = 0; i < 64; i++) ones += sf_bf16_to_f32(n[i]) == 1.0f;
    for (int i = 0; i < 96 * 64; i++) {
        float x = sf_bf16_to_f32(w[i]);
        in_range += fabsf(x) < 0.035f;
        nonzero += x != 0;
    }
    CHECK(ones == 64 && in_range == 96 * 64 && nonzero > 96 * 60);
    sf_model_free(m);
    o.dummy_format = "f16";
    rc_ = sf_model_load(d, &o, &m, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(m->tok_embd.dtype == SF_DT_F16 && sf_f16_to_f32(((const uint16_t *)m->out_norm.data)[3]) == 1.0f);
    sf_model_free(m);
    expect_fail("preset:nope", SF_ENOTFOUND, "llama-3-8b", NULL);
    o.dummy = 1;
    CHECK(sf_model_load(test_data("stories260K/stories260K.gguf"), &o, &m, &e) == SF_EINVAL);
}

/* the standard deviation of a block-format matrix's dequantized values (all finite, else -1) */
static double dequant_std(const sf_view *v)
{
    int64_t n = v->rows * v->cols;
    float *y = malloc(sizeof(float) * n);
    sf_dequant_row(v->dtype, v->data, n, y);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(y[i])) { free(y); return -1; }
        s += y[i];
        s2 += (double)y[i] * y[i];
    }
    free(y);
    return sqrt(s2 / n - (s / n) * (s / n));
}

/* Dummy weights in GGUF's block formats: the matrices in the format (Q4_K_M, Q5_K_M: Q6_K for the head
 * and, in llama.cpp's layers, attn_v and ffn_down), norms and biases f32, values of std ~0.02. */
TEST(dummy_weights_block_formats)
{
    const char *d = config_dir("dummyq", "{\"model_type\": \"qwen2\", \"vocab_size\": 300, \"hidden_size\": 256, "
                                         "\"intermediate_size\": 512, \"num_hidden_layers\": 8, \"num_attention_heads\": 4, "
                                         "\"num_key_value_heads\": 2, \"tie_word_embeddings\": false}");
    static const struct { const char *name; sf_dtype t; } fmts[] = {
        { "q8_0", SF_DT_Q8_0 }, { "q4_k", SF_DT_Q4_K },   { "q5_k", SF_DT_Q5_K },
        { "q6_k", SF_DT_Q6_K }, { "q4_k_m", SF_DT_Q4_K }, { "q5_k_m", SF_DT_Q5_K },
        { "q4_0", SF_DT_Q4_0 }, { "iq4_nl", SF_DT_IQ4_NL }, { "iq4_xs", SF_DT_IQ4_XS },
        { "q2_k", SF_DT_Q2_K }, { "q3_k", SF_DT_Q3_K }, { "q4_1", SF_DT_Q4_1 },
        { "q5_0", SF_DT_Q5_0 }, { "q5_1", SF_DT_Q5_1 },
    };
    sf_error e = { 0 };
    for (size_t f = 0; f < SF_ARRAY_LEN(fmts); f++) {
        sf_model *m = NULL;
        sf_load_opts o = { .dummy = 1, .seed = 5, .dummy_format = fmts[f].name };
        rc_ = sf_model_load(d, &o, &m, &e);
        REQUIRE(rc_ == SF_OK, "%s: %s", fmts[f].name, e.msg);
        int km = strstr(fmts[f].name, "_k_m") != NULL, wrong = 0;
        double lo = 1, hi = 0;
        for (int i = 0; i < 8; i++) {
            const sf_layer_w *l = &m->layers[i];
            int more = km && (i == 0 || i == 3 || i == 6 || i == 7); /* llama.cpp's use_more_bits at 8 layers */
            sf_dtype big = more ? SF_DT_Q6_K : fmts[f].t;
            wrong += l->wq.dtype != fmts[f].t || l->wv.dtype != big || l->wdown.dtype != big || l->wup.dtype != fmts[f].t;
            wrong += l->attn_norm.dtype != SF_DT_F32 || ((const float *)l->ffn_norm.data)[7] != 1.0f;
            wrong += l->bq.dtype != SF_DT_F32 || !isfinite(((const float *)l->bq.data)[3]);
            const sf_view *vs[] = { &l->wq, &l->wv, &l->wdown, &l->wgate };
            for (size_t k = 0; k < SF_ARRAY_LEN(vs); k++) {
                double sd = dequant_std(vs[k]);
                lo = fmin(lo, sd);
                hi = fmax(hi, sd);
            }
        }
        CHECK_MSG(!wrong, "%s: %d tensors of the wrong dtype or value", fmts[f].name, wrong);
        CHECK_MSG(m->lm_head.dtype == (km ? SF_DT_Q6_K : fmts[f].t) && m->tok_embd.dtype == fmts[f].t, "%s: head %s, embedding %s",
                  fmts[f].name, sf_dtype_name(m->lm_head.dtype), sf_dtype_name(m->tok_embd.dtype));
        CHECK_MSG(lo > 0.014 && hi < 0.028, "%s: weights' std %.4f .. %.4f, expected ~0.02", fmts[f].name, lo, hi);
        CHECK(sf_model_validate(m, &e) == SF_OK);
        sf_model_free(m);
    }
    /* the bytes each backend holds (sf_model_weight_bytes: KV sizing, the benchmarks' roofline):
     * the CPU every format as stored; CUDA Q8_0 and Q4_K..Q6_K as stored unless
     * SEMFLOW_CUDA_QUANT=0, everything else (norms and biases too) as bf16, and a fused weight with
     * any part it does not keep wholly as bf16 */
    {
        sf_model *qm = NULL, *q0 = NULL;
        sf_load_opts o = { .dummy = 1, .seed = 5, .dummy_format = "q4_k_m" };
        REQUIRE(sf_model_load(d, &o, &qm, &e) == SF_OK, "%s", e.msg);
        o.dummy_format = "q4_0";
        REQUIRE(sf_model_load(d, &o, &q0, &e) == SF_OK, "%s", e.msg);
        int64_t f32 = qm->out_norm.cols * qm->out_norm.rows; /* elements held in f32 on the CPU */
        for (int i = 0; i < 8; i++) {
            const sf_layer_w *l = &qm->layers[i];
            f32 += l->attn_norm.cols + l->ffn_norm.cols + l->bq.cols + l->bk.cols + l->bv.cols;
        }
        size_t cpu = sf_model_weight_bytes(qm, "cpu", 1), cuda = sf_model_weight_bytes(qm, "cuda", 1);
        setenv("SEMFLOW_CUDA_QUANT", "0", 1);
        size_t cuda_bf16 = sf_model_weight_bytes(qm, "cuda", 1), q0_bf16 = sf_model_weight_bytes(q0, "cuda", 1);
        unsetenv("SEMFLOW_CUDA_QUANT");
        CHECK_MSG(cuda == cpu - 2 * (size_t)f32, "q4_k_m: CUDA holds %zu bytes, the CPU %zu (%lld f32 elements)", cuda, cpu,
                  (long long)f32);
        CHECK_MSG(cuda * 3 < cuda_bf16 && sf_model_weight_bytes(q0, "cuda", 1) == q0_bf16 && q0_bf16 == cuda_bf16,
                  "q4_k_m %zu, with bf16 copies %zu; q4_0 %zu / %zu", cuda, cuda_bf16, sf_model_weight_bytes(q0, "cuda", 1),
                  q0_bf16);
        /* layer 0's v (Q6_K) in a format CUDA does not keep: its whole QKV becomes bf16 */
        sf_layer_w *l0 = &qm->layers[0];
        size_t qkv_kept = sf_dtype_bytes(l0->wq.dtype, l0->wq.rows * l0->wq.cols) +
                          sf_dtype_bytes(l0->wk.dtype, l0->wk.rows * l0->wk.cols) +
                          sf_dtype_bytes(l0->wv.dtype, l0->wv.rows * l0->wv.cols);
        size_t qkv_bf16 = 2 * (size_t)(l0->wq.rows * l0->wq.cols + l0->wk.rows * l0->wk.cols + l0->wv.rows * l0->wv.cols);
        l0->wv.dtype = SF_DT_Q4_0;
        CHECK_MSG(sf_model_weight_bytes(qm, "cuda", 1) == cuda - qkv_kept + qkv_bf16, "a mixed QKV counted %zu, expected %zu",
                  sf_model_weight_bytes(qm, "cuda", 1), cuda - qkv_kept + qkv_bf16);
        l0->wv.dtype = SF_DT_Q6_K;
        sf_model_free(qm);
        sf_model_free(q0);
    }
    /* a format the rows cannot hold, and a name that is none */
    d = config_dir("dummyq64", "{\"model_type\": \"llama\", \"vocab_size\": 300, \"hidden_size\": 64, "
                               "\"intermediate_size\": 512, \"num_hidden_layers\": 1, \"num_attention_heads\": 4, "
                               "\"num_key_value_heads\": 2}");
    sf_model *m = NULL;
    sf_load_opts o = { .dummy = 1, .dummy_format = "q4_k" };
    CHECK(sf_model_load(d, &o, &m, &e) == SF_EINVAL && strstr(e.msg, "64 columns") && strstr(e.msg, "256-blocks"));
    o.dummy_format = "q8_0"; /* 64 columns are two Q8_0 blocks */
    rc_ = sf_model_load(d, &o, &m, &e);
    CHECK_MSG(rc_ == SF_OK, "%s", e.msg);
    sf_model_free(m);
    m = NULL;
    o.dummy_format = "q5_x";
    CHECK(sf_model_load(d, &o, &m, &e) == SF_EINVAL && strstr(e.msg, "q4_k_m") && strstr(e.msg, "q5_x"));
    CHECK(sf_dummy_format_check("bf16", &e) == SF_OK && sf_dummy_format_check("Q4_K", &e) == SF_EINVAL);
}

int main(void)
{
    snprintf(tmp_root, sizeof tmp_root, "%s", test_tmpdir());
    RUN(hf_tiny_random_llama2);
    RUN(hf_sharded);
    RUN(hf_bad_inputs);
    RUN(hf_qwen2_bias_tied);
    RUN(gguf_stories260k);
    RUN(gguf_llama2_tiny_f16);
    RUN(gguf_synthetic_q8_0);
    RUN(gguf_synthetic_qwen2);
    RUN(gguf_block_formats);
    RUN(qdev_pack_rows);
    RUN(gguf_bad_inputs);
    RUN(gguf_fuzz);
    RUN(safetensors_fuzz);
    RUN(gguf_tokenizer);
    RUN(demo_model);
    RUN(demo_path);
    RUN(dummy_weights);
    RUN(dummy_weights_block_formats);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_root);
    return test_summary();
}
