/* model.h — a loaded Llama-family model: configuration, host views of its weights (memory-
 * mapped, never copied on the CPU path) and its tokenizer. Internal to engine/ and cli/.
 *
 * Loaders: loader_hf.c (Hugging Face folder: config.json, *.safetensors, tokenizer.json),
 * loader_gguf.c (.gguf), demo.c (`--model demo`, written by `semflow gen-model`), dummy
 * weights from a config alone (`--load-format dummy`). All fill the same struct. */
#ifndef SF_MODEL_H
#define SF_MODEL_H

#include "../hal/hal.h"

struct sf_tokenizer;

enum { SF_ROPE_SCALING_NONE = 0, SF_ROPE_SCALING_LINEAR, SF_ROPE_SCALING_LLAMA3 };

typedef struct sf_model_config {
    char arch[32];            /* "llama" | "qwen2" | "mistral" */
    int vocab_size;
    int hidden;               /* d_model */
    int intermediate;         /* FFN width */
    int n_layers;
    int n_heads, n_kv_heads, head_dim;
    int max_pos;              /* context length the model supports */
    float rms_eps;
    float rope_theta;
    int rope_scaling;         /* SF_ROPE_SCALING_* */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_orig_max_pos;
    int rope_interleaved;     /* 1: GGUF convention (adjacent pairs); 0: HF (halves) */
    int tie_embeddings;
    int attention_bias;       /* q/k/v biases (Qwen2) */
    int sliding_window;       /* 0: none (Mistral may set one; used as a context cap) */
    int bos_id;               /* -1 if none */
    int eos_ids[8];
    int n_eos;
    sf_dtype dtype;           /* dominant weight dtype as stored */
} sf_model_config;

typedef struct sf_layer_w {
    sf_view attn_norm;        /* [1, hidden] */
    sf_view wq, wk, wv, wo;   /* [H*hd, hidden], [Hkv*hd, hidden] x2, [hidden, H*hd] */
    sf_view bq, bk, bv;       /* biases [1, n] or data == NULL */
    sf_view ffn_norm;         /* [1, hidden] */
    sf_view wgate, wup, wdown;/* [inter, hidden] x2, [hidden, inter] */
} sf_layer_w;

typedef struct sf_mapping {
    void *addr;
    size_t len;
} sf_mapping;

typedef struct sf_model {
    sf_model_config cfg;
    sf_view tok_embd;         /* [vocab, hidden] */
    sf_view out_norm;         /* [1, hidden] */
    sf_view lm_head;          /* [vocab, hidden]; == tok_embd when tied */
    sf_layer_w *layers;       /* [n_layers] */
    struct sf_tokenizer *tok; /* NULL when the source has none (presets, folders without tokenizer.json) */
    char path[1024];          /* folder or file it came from */
    char name[256];           /* model id shown to users (folder/file basename, or "demo") */
    int random_weights;       /* 1 for demo / dummy: outputs are meaningless */
    /* storage */
    sf_mapping *maps;         /* mmap'd files (and anonymous mappings of dummy weights) */
    int n_maps;
    void **owned;             /* malloc'd buffers (dummy weights, converted tensors) */
    int n_owned;
    size_t weight_bytes;      /* sum of all weight bytes as stored */
} sf_model;

typedef struct sf_load_opts {
    int dummy;                /* --load-format dummy: random weights from config.json alone */
    const char *dummy_format; /* dummy weights: NULL or "bf16" (the default), "f16", or GGUF block
                                 formats for the matrices: "q8_0", "q4_k", "q6_k", "q4_k_m" */
    uint64_t seed;            /* dummy weight seed */
    int progress;             /* show a progress bar on a TTY */
    /* Dummy weights of a tensor-parallel rank: every tensor is mapped, but only the bytes
     * rank shard_rank of shard_size reads (engine/shard.h) are filled — the same values as a
     * full fill there — so N ranks on one host do not each hold the whole model. 0/1: all. */
    int shard_rank, shard_size;
} sf_load_opts;

/* SF_OK when `name` is a format dummy weights take (sf_load_opts.dummy_format), else SF_EINVAL
 * with the list. */
int sf_dummy_format_check(const char *name, sf_error *err);

/* path: a Hugging Face folder, a .gguf file, or "demo".
 * Extension: "preset:NAME" loads dummy (random) weights of a built-in shape without any file:
 * NAME is llama-3-8b, qwen2-7b, llama-3-70b or 1b (TinyLlama-1.1B). tok is NULL for presets.
 * With o->dummy a folder needs only config.json (tokenizer.json is loaded when present). */
int sf_model_load(const char *path, const sf_load_opts *o, sf_model **out, sf_error *err);
void sf_model_free(sf_model *m);

/* Individual loaders (sf_model_load dispatches). */
int sf_model_load_hf(const char *dir, const sf_load_opts *o, sf_model **out, sf_error *err);
int sf_model_load_gguf(const char *file, const sf_load_opts *o, sf_model **out, sf_error *err);
/* Parse config.json text into cfg (used by HF loader and dummy loader). */
int sf_config_parse_json(const char *json_text, sf_model_config *cfg, sf_error *err);
/* Check that every view has the shape the config requires; clear message naming the tensor. */
int sf_model_validate(const sf_model *m, sf_error *err);
/* Bytes of the weights as `backend` ("cpu", "cuda") holds them (sf_weight_dtype): all of them
 * (decode 0), or those one decode step reads (decode 1: every layer, the final norm and the
 * lm_head; the embedding table is touched at one row only, unless it doubles as the lm_head). */
size_t sf_model_weight_bytes(const sf_model *m, const char *backend, int decode);

/* Demo model: the seed `--model demo` and `semflow gen-model` use unless told otherwise. */
#define SF_DEMO_SEED 20240611ull
/* Demo model: write a real HF folder (config.json, model.safetensors, tokenizer.json,
 * tokenizer_config.json) with random weights from a fixed seed. */
int sf_demo_write(const char *dir, uint64_t seed, sf_error *err);
/* Folder where `--model demo` lives ($SEMFLOW_DEMO_DIR, else $XDG_CACHE_HOME/semflow/demo,
 * else ~/.cache/semflow/demo); written on first use. */
int sf_demo_path(char *out, size_t n, sf_error *err);

/* Built-in configuration of a preset (see sf_model_load); SF_ENOTFOUND lists the names. */
int sf_model_preset_config(const char *name, sf_model_config *cfg, sf_error *err);

/* RoPE inverse frequencies with the configured scaling: fills rot_dim/2 floats. */
void sf_rope_inv_freq(const sf_model_config *cfg, float *inv_freq);

#endif
