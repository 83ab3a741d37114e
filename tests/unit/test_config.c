/* test_config.c — config.json parsing and RoPE frequencies. */
#include <math.h>

#include "engine/model.h"
#include "tests/test.h"

static int rc_; /* REQUIRE evaluates its condition twice: call first, then check */

static int parse(const char *json, sf_model_config *c, sf_error *e)
{
    memset(c, 0, sizeof *c);
    memset(e, 0, sizeof *e);
    return sf_config_parse_json(json, c, e);
}

#define BASE "\"vocab_size\": 1000, \"hidden_size\": 64, \"intermediate_size\": 128, " \
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 8"

TEST(llama_defaults)
{
    sf_model_config c;
    sf_error e;
    REQUIRE(parse("{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], " BASE "}", &c, &e) == SF_OK,
            "%s", e.msg);
    CHECK(!strcmp(c.arch, "llama"));
    CHECK(c.vocab_size == 1000 && c.hidden == 64 && c.intermediate == 128 && c.n_layers == 2);
    CHECK(c.n_heads == 8 && c.n_kv_heads == 8 && c.head_dim == 8);
    CHECK(c.rope_theta == 10000.0f && c.rope_scaling == SF_ROPE_SCALING_NONE);
    CHECK(fabsf(c.rms_eps - 1e-6f) < 1e-12f);
    CHECK(c.tie_embeddings == 0 && c.attention_bias == 0 && c.sliding_window == 0);
    CHECK(c.bos_id == -1 && c.n_eos == 0 && c.rope_interleaved == 0);
    CHECK(c.max_pos == 2048 && c.dtype == SF_DT_BF16);
}

TEST(llama3_full)
{
    sf_model_config c;
    sf_error e;
    const char *j = "{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 2, \"head_dim\": 16,"
                    "\"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-5, \"max_position_embeddings\": 131072,"
                    "\"tie_word_embeddings\": true, \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009],"
                    "\"torch_dtype\": \"float16\", \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
                    "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}}";
    REQUIRE(parse(j, &c, &e) == SF_OK, "%s", e.msg);
    CHECK(c.n_kv_heads == 2 && c.head_dim == 16 && c.rope_theta == 500000.0f && c.max_pos == 131072);
    CHECK(c.tie_embeddings == 1 && c.bos_id == 128000 && c.n_eos == 3 && c.eos_ids[2] == 128009);
    CHECK(c.rope_scaling == SF_ROPE_SCALING_LLAMA3 && c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f &&
          c.rope_high_freq_factor == 4.0f && c.rope_orig_max_pos == 8192);
    CHECK(c.dtype == SF_DT_F16);
}

TEST(qwen2_and_mistral)
{
    sf_model_config c;
    sf_error e;
    REQUIRE(parse("{\"model_type\": \"qwen2\", " BASE ", \"sliding_window\": 1024, \"use_sliding_window\": false,"
                  "\"max_position_embeddings\": 4096, \"eos_token_id\": 7}", &c, &e) == SF_OK, "%s", e.msg);
    CHECK(!strcmp(c.arch, "qwen2") && c.attention_bias == 1 && c.sliding_window == 0);
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 7);
    REQUIRE(parse("{\"model_type\": \"mistral\", " BASE ", \"sliding_window\": 1024, \"head_dim\": null,"
                  "\"max_position_embeddings\": 4096}", &c, &e) == SF_OK, "%s", e.msg);
    CHECK(!strcmp(c.arch, "mistral") && c.sliding_window == 1024 && c.head_dim == 8 && c.attention_bias == 0);
    /* model_type missing: architectures decides */
    REQUIRE(parse("{\"architectures\": [\"MistralForCausalLM\"], " BASE "}", &c, &e) == SF_OK, "%s", e.msg);
    CHECK(!strcmp(c.arch, "mistral"));
}

TEST(linear_scaling)
{
    sf_model_config c;
    sf_error e;
    REQUIRE(parse("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}}",
                  &c, &e) == SF_OK, "%s", e.msg);
    CHECK(c.rope_scaling == SF_ROPE_SCALING_LINEAR && c.rope_factor == 4.0f);
    float a[4], b[4];
    sf_rope_inv_freq(&c, a);
    c.rope_scaling = SF_ROPE_SCALING_NONE;
    sf_rope_inv_freq(&c, b);
    for (int i = 0; i < 4; i++) CHECK_MSG(fabsf(a[i] * 4 - b[i]) < 1e-7f, "i=%d %g %g", i, a[i], b[i]);
    CHECK(b[0] == 1.0f && fabsf(b[1] - 1.0f / powf(10000.0f, 0.25f)) < 1e-7f);
}

TEST(llama3_inv_freq)
{
    /* Llama-3.1-8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192 */
    sf_model_config c = { .head_dim = 128, .rope_theta = 500000.0f, .rope_scaling = SF_ROPE_SCALING_LLAMA3,
                          .rope_factor = 8, .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                          .rope_orig_max_pos = 8192 };
    float f[64];
    sf_rope_inv_freq(&c, f);
    double pi = 3.14159265358979;
    CHECK(f[0] == 1.0f);                       /* wavelength 2pi < 2048: unchanged */
    for (int i = 0; i < 64; i++) {
        double base = 1.0 / pow(500000.0, 2.0 * i / 128), wl = 2 * pi / base;
        if (wl < 2048) CHECK_MSG(fabs(f[i] - base) <= 1e-6 * base, "i=%d", i);
        else if (wl > 8192) CHECK_MSG(fabs(f[i] - base / 8) <= 1e-6 * base, "i=%d", i);
        else CHECK_MSG(f[i] < base && f[i] > base / 8, "i=%d smooth", i);
    }
    /* a value in the smooth band, from the formula by hand: i = 30 */
    double base = 1.0 / pow(500000.0, 60.0 / 128), wl = 2 * pi / base, s = (8192 / wl - 1) / 3;
    CHECK_MSG(wl > 2048 && wl < 8192, "wl %g", wl);
    CHECK_MSG(fabs(f[30] - ((1 - s) * base / 8 + s * base)) < 1e-6 * base, "got %g", f[30]);
}

TEST(bad_configs)
{
    sf_model_config c;
    sf_error e;
    CHECK(parse("{not json", &c, &e) == SF_EFORMAT && strstr(e.msg, "not valid JSON"));
    CHECK(parse("[1, 2]", &c, &e) == SF_EFORMAT);
    CHECK(parse("{\"model_type\": \"gpt2\", " BASE "}", &c, &e) == SF_EUNSUPPORTED && strstr(e.msg, "gpt2") &&
          strstr(e.msg, "llama, qwen2, mistral"));
    CHECK(parse("{\"model_type\": \"llama\", \"architectures\": [\"LlamaForSequenceClassification\"], " BASE "}",
                &c, &e) == SF_EUNSUPPORTED && strstr(e.msg, "LlamaForSequenceClassification"));
    CHECK(parse("{\"model_type\": \"llama\", \"vocab_size\": 10}", &c, &e) == SF_EFORMAT &&
          strstr(e.msg, "hidden_size"));
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"num_key_value_heads\": 3}", &c, &e) == SF_EFORMAT &&
          strstr(e.msg, "num_key_value_heads"));
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}}",
                &c, &e) == SF_EUNSUPPORTED && strstr(e.msg, "yarn"));
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"hidden_size\": \"big\"}", &c, &e) == SF_EFORMAT);
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"num_hidden_layers\": -1}", &c, &e) == SF_EFORMAT);
    CHECK(parse("{\"model_type\": \"llama\", " BASE ", \"rms_norm_eps\": 0}", &c, &e) == SF_EFORMAT);
    CHECK(parse("{}", &c, &e) == SF_EFORMAT && strstr(e.msg, "model_type"));
}

TEST(presets)
{
    sf_model_config c;
    sf_error e;
    rc_ = sf_model_preset_config("llama-3-8b", &c, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(c.hidden == 4096 && c.n_layers == 32 && c.n_kv_heads == 8 && c.vocab_size == 128256);
    rc_ = sf_model_preset_config("qwen2-7b", &c, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(c.attention_bias == 1 && c.hidden == 3584 && c.n_heads == 28 && c.head_dim == 128);
    rc_ = sf_model_preset_config("llama-3-70b", &c, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(c.n_layers == 80 && c.hidden == 8192);
    rc_ = sf_model_preset_config("1b", &c, &e);
    REQUIRE(rc_ == SF_OK, "%s", e.msg);
    CHECK(c.hidden == 2048 && c.n_layers == 22 && c.vocab_size == 32000);
    CHECK(sf_model_preset_config("gpt-5", &c, &e) == SF_ENOTFOUND && strstr(e.msg, "llama-3-8b"));
}

int main(void)
{
    RUN(llama_defaults);
    RUN(llama3_full);
    RUN(qwen2_and_mistral);
    RUN(linear_scaling);
    RUN(llama3_inv_freq);
    RUN(bad_configs);
    RUN(presets);
    return test_summary();
}
