/* test_model.c — whole-model logits of the CUDA backend against the CPU backend (fp32
 * activations, the reference kernels) on the same models and token streams: chunked prefill,
 * then greedy decode steps, every logit row compared by ||cuda - cpu|| / ||cpu||.
 *
 *   test_model                              the checks (GPU host only)
 *   test_model --dump MODEL IDS OUT [cpu]   write the logits of every position of the prompt
 *                                           IDS (comma-separated) as float32 [T, vocab] to OUT
 *                                           (used by test_model.py against transformers) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/forward.h"
#include "../../engine/model.h"
#include "../../hal/hal.h"
#include "../test.h"

/* One model + backend + forward pass + the KV blocks of one sequence. */
typedef struct runner {
    sf_backend *b;
    sf_forward *f;
    sf_kv_config kc;
    int32_t *blocks;
    int max_blocks, len;
} runner;

static int runner_open(runner *r, const char *backend, const sf_model *m, int max_tokens, int max_ctx, sf_error *err)
{
    memset(r, 0, sizeof *r);
    sf_backend_opts o = { .name = backend };
    int rc = sf_backend_open(&o, &r->b, err);
    if (rc) return rc;
    const sf_model_config *c = &m->cfg;
    int bs = 16;
    r->max_blocks = (max_ctx + bs - 1) / bs;
    r->kc = (sf_kv_config){ .n_layers = c->n_layers, .n_blocks = r->max_blocks + 5, .block_size = bs,
                            .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .dtype = SF_DT_BF16,
                            .group = c->n_heads / c->n_kv_heads };
    r->blocks = malloc(sizeof(int32_t) * r->max_blocks);
    for (int i = 0; i < r->max_blocks; i++) r->blocks[i] = (i * 7 + 3) % (r->max_blocks + 5); /* scattered */
    if ((rc = r->b->ops->kv_init(r->b, &r->kc, err))) return rc;
    return sf_forward_new(r->b, m, max_tokens, max_tokens, &r->f, err);
}

static void runner_close(runner *r)
{
    sf_forward_free(r->f);
    sf_backend_close(r->b);
    free(r->blocks);
}

/* Appends n tokens; logits of all n positions (all_rows) or of the last one. */
static int runner_feed(runner *r, const int32_t *tok, int n, int all_rows, float *logits, sf_error *err)
{
    int32_t *pos = malloc(4 * n), *slot = malloc(4 * n), *rows = malloc(4 * n), ss[2] = { 0, n }, ctx[1];
    int bs = r->kc.block_size;
    for (int i = 0; i < n; i++) {
        pos[i] = r->len + i;
        slot[i] = r->blocks[pos[i] / bs] * bs + pos[i] % bs;
        rows[i] = all_rows ? i : n - 1;
    }
    ctx[0] = r->len + n;
    sf_batch b = { .n_tokens = n, .n_seqs = 1, .tokens = tok, .pos = pos, .slot = slot, .seq_start = ss,
                   .seq_ctx = ctx, .block_table = r->blocks, .max_blocks = r->max_blocks, .logit_rows = rows,
                   .n_logits = all_rows ? n : 1 };
    int rc = sf_forward_step(r->f, &b, logits, err);
    if (!rc) r->len += n;
    free(pos); free(slot); free(rows);
    return rc;
}

static double rel(const float *a, const float *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isinf(a[i])) return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* name=value for the calls between env_set and env_restore (name NULL: nothing), then as it was */
static char *env_set(const char *name, const char *value)
{
    if (!name) return NULL;
    const char *old = getenv(name);
    char *keep = old ? strdup(old) : NULL;
    setenv(name, value, 1);
    return keep;
}

static void env_restore(const char *name, char *keep)
{
    if (!name) return;
    if (keep) setenv(name, keep, 1);
    else unsetenv(name);
    free(keep);
}

/* Opens runner r on backend with env=value set while it opens (env NULL: as the process has it). */
static int runner_open_env(runner *r, const char *backend, const char *env, const char *value, const sf_model *m,
                           int max_tokens, int max_ctx, sf_error *err)
{
    char *keep = env_set(env, value);
    int rc = runner_open(r, backend, m, max_tokens, max_ctx, err);
    env_restore(env, keep);
    return rc;
}

/* Prefill of T tokens in chunks of 20, then 8 greedy decode steps (tokens chosen by the
 * reference run, fed to both). Past 64 keys the decode steps split their keys (at batch 1 over
 * a thread-block cluster per kv head, attention_decode.cu). The reference is the CPU backend,
 * or (ref "cuda" with env) the CUDA backend with env=0 against env=1. */
static void compare_model_with(const char *path, int dummy, const char *fmt, const char *ref, const char *env, double tol,
                               int T)
{
    sf_load_opts lo = { .dummy = dummy, .seed = 3, .dummy_format = fmt };
    sf_model *m = NULL;
    sf_error err = { 0 };
    runner refr = { 0 }, gpu = { 0 };
    float *lc = NULL, *lg = NULL;
    int32_t *prompt = NULL;
    if (sf_model_load(path, &lo, &m, &err)) {
        CHECK_MSG(0, "loading %s: %s", path, err.msg);
        return;
    }
    int V = m->cfg.vocab_size, n_dec = 8;
    lc = malloc(sizeof(float) * V * 20);
    lg = malloc(sizeof(float) * V * 20);
    if (runner_open_env(&refr, ref, env, "0", m, 20, T + n_dec + 1, &err) ||
        runner_open_env(&gpu, "cuda", env, "1", m, 20, T + n_dec + 1, &err)) {
        CHECK_MSG(0, "%s: opening backends: %s", path, err.msg);
        goto out;
    }
    sf_rng rng;
    sf_rng_seed(&rng, 99);
    prompt = malloc(sizeof(int32_t) * T);
    for (int i = 0; i < T; i++) prompt[i] = (int32_t)(sf_rng_next(&rng) % (uint64_t)V);
    double worst = 0;
    int agree = 0, total = 0;
    for (int c0 = 0; c0 < T; c0 += 20) {
        int n = SF_MIN(20, T - c0);
        if (runner_feed(&refr, prompt + c0, n, 1, lc, &err) || runner_feed(&gpu, prompt + c0, n, 1, lg, &err)) {
            CHECK_MSG(0, "%s: prefill: %s", path, err.msg);
            goto out;
        }
        for (int i = 0; i < n; i++) {
            worst = fmax(worst, rel(lg + (size_t)i * V, lc + (size_t)i * V, V));
            agree += argmax(lg + (size_t)i * V, V) == argmax(lc + (size_t)i * V, V);
            total++;
        }
    }
    int32_t tok = argmax(lc + (size_t)((T - 1) % 20) * V, V);
    for (int s = 0; s < n_dec; s++) {
        if (runner_feed(&refr, &tok, 1, 0, lc, &err) || runner_feed(&gpu, &tok, 1, 0, lg, &err)) {
            CHECK_MSG(0, "%s: decode: %s", path, err.msg);
            goto out;
        }
        worst = fmax(worst, rel(lg, lc, V));
        agree += argmax(lg, V) == argmax(lc, V);
        total++;
        tok = argmax(lc, V);
    }
    printf("  %-40s %-6s layers %2d hidden %4d heads %2d/%d: worst rel err %.2e, argmax agrees %d/%d%s%s%s\n", m->name,
           fmt ? fmt : "", m->cfg.n_layers, m->cfg.hidden, m->cfg.n_heads, m->cfg.n_kv_heads, worst, agree, total,
           env ? " (" : "", env ? env : "", env ? "=1 against =0)" : "");
    CHECK_MSG(worst < tol, "%s %s: CUDA vs %s%s logits rel err %.3g (tolerance %.g)", path, fmt ? fmt : "", ref,
              env ? " (the env switch off)" : "", worst, tol);
    CHECK_MSG(agree >= total * 9 / 10, "%s: argmax agrees on %d of %d positions", path, agree, total);
out:
    runner_close(&refr);
    runner_close(&gpu);
    sf_model_free(m);
    free(lc);
    free(lg);
    free(prompt);
}

static void compare_model_fmt(const char *path, int dummy, const char *fmt, double tol, int T)
{
    compare_model_with(path, dummy, fmt, "cpu", NULL, tol, T);
}

static void compare_model(const char *path, int dummy, double tol, int T) { compare_model_fmt(path, dummy, NULL, tol, T); }

TEST(stories260K_gguf_f32) { compare_model(test_data("stories260K/stories260K.gguf"), 0, 2e-2, 37); }
TEST(llama2_tiny_random_gguf_f16) { compare_model(test_data("llama-2-tiny-random-gguf/llama-2-tiny-random.gguf"), 0, 2e-2, 37); }
TEST(tiny_random_llama2_hf_bf16) { compare_model(test_data("tiny-random-llama-2"), 0, 2e-2, 37); }
TEST(demo_model) { compare_model("demo", 0, 3e-2, 37); }
TEST(dummy_1b) { compare_model("preset:1b", 1, 3e-2, 37); }
TEST(dummy_1b_split_keys) { compare_model("preset:1b", 1, 3e-2, 150); }
/* From 512 keys a one-token step of the 1B's groups of 4 takes the tensor-core attention
 * (attention_decode.cu DEC_MMA_B1) and its QKV projection the per-warp ring kernel beside it
 * (gemv_fused.cu sf_k_gemv_norm_rope). */
TEST(dummy_1b_one_token_mma) { compare_model("preset:1b", 1, 3e-2, 515); }
/* GGUF block formats: the CUDA backend reads Q8_0, Q4_K, Q5_K and Q6_K in place (qgemv.cu; x
 * in int8 per 32 for up to 8 rows, as the CPU's kernels, but from bf16 activations: the two
 * roundings of x differ, so the logits are 4-7% apart after 22 random layers), prefill
 * chunks of 20 through bf16 rows and cuBLASLt; Q4_K_M mixes in Q6_K (the head, some attn_v and
 * ffn_down: a QKV of Q4_K and Q6_K parts). */
TEST(dummy_1b_q4_k_m) { compare_model_fmt("preset:1b", 1, "q4_k_m", 1e-1, 37); }
TEST(dummy_1b_q8_0) { compare_model_fmt("preset:1b", 1, "q8_0", 1e-1, 37); }
TEST(dummy_1b_q5_k) { compare_model_fmt("preset:1b", 1, "q5_k", 1e-1, 37); }
/* SEMFLOW_CUDA_QFUSE: the decode steps' RMSNorm, SiLU-gated product, RoPE and K/V write inside
 * the quantized GEMVs, a fused weight's parts of one format stacked. The fused kernels round as
 * the unfused ones, so against the unfused CUDA run the logits stay close (only the order of
 * the norm's sum of squares differs), the later steps reading the keys the fused QKV wrote; and
 * against the CPU as the unfused path is. */
TEST(dummy_1b_q4_k_m_qfuse) { compare_model_with("preset:1b", 1, "q4_k_m", "cuda", "SEMFLOW_CUDA_QFUSE", 2e-2, 37); }
TEST(dummy_1b_q6_k_qfuse) { compare_model_with("preset:1b", 1, "q6_k", "cuda", "SEMFLOW_CUDA_QFUSE", 2e-2, 37); }
TEST(dummy_1b_q8_0_qfuse_cpu)
{
    char *keep = env_set("SEMFLOW_CUDA_QFUSE", "1");
    compare_model_fmt("preset:1b", 1, "q8_0", 1e-1, 37);
    env_restore("SEMFLOW_CUDA_QFUSE", keep);
}

static int dump(const char *model, const char *ids, const char *out, const char *backend)
{
    int32_t tok[4096];
    int n = 0;
    for (const char *p = ids; *p && n < 4096;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) { fprintf(stderr, "test_model --dump: bad id list at '%s'\n", p); return 2; }
        tok[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    sf_load_opts lo = { .seed = 3 };
    sf_model *m = NULL;
    sf_error err = { 0 };
    runner r = { 0 };
    if (sf_model_load(model, &lo, &m, &err) || runner_open(&r, backend, m, n, n + 1, &err)) {
        fprintf(stderr, "test_model --dump: %s\n", err.msg);
        return 1;
    }
    float *l = malloc(sizeof(float) * (size_t)n * m->cfg.vocab_size);
    int rc = runner_feed(&r, tok, n, 1, l, &err);
    if (rc) fprintf(stderr, "test_model --dump: %s\n", err.msg);
    FILE *f = rc ? NULL : fopen(out, "wb");
    if (!rc && (!f || fwrite(l, sizeof(float) * m->cfg.vocab_size, n, f) != (size_t)n)) {
        fprintf(stderr, "test_model --dump: cannot write %s\n", out);
        rc = 1;
    }
    if (f) fclose(f);
    free(l);
    runner_close(&r);
    sf_model_free(m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[1], "--dump")) return dump(argv[2], argv[3], argv[4], argc > 5 ? argv[5] : "cuda");
    RUN(stories260K_gguf_f32);
    RUN(llama2_tiny_random_gguf_f16);
    RUN(tiny_random_llama2_hf_bf16);
    RUN(demo_model);
    RUN(dummy_1b);
    RUN(dummy_1b_split_keys);
    RUN(dummy_1b_one_token_mma);
    RUN(dummy_1b_q4_k_m);
    RUN(dummy_1b_q8_0);
    RUN(dummy_1b_q5_k);
    RUN(dummy_1b_q4_k_m_qfuse);
    RUN(dummy_1b_q6_k_qfuse);
    RUN(dummy_1b_q8_0_qfuse_cpu);
    return test_summary();
}
