/* host_bench.c — host work outside the forward pass, per core: GGUF block formats dequantized
 * into bf16 (what the CUDA backend's upload does to every weight that is neither float nor
 * Q8_0, and the CPU backend into f16), a scored prompt position (prompt_logprobs: log-softmax,
 * rank, top n of one row of logits) at 32k and 128k vocabularies, and JSON output's token
 * mask for one draw over a real vocabulary, in the states that cost least and most, and under
 * patterns (guided_regex, a schema's pattern). `make bench-host`, then
 * build/bench/host_bench [TOKENIZER_DIR ...] (default: the testdata's TinyLlama and GPT-2). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/json_mask.h"
#include "engine/engine.h"
#include "kernels/cpu/cpu.h"
#include "engine/tokenizer.h"
#include "hal/hal.h"
#include "tests/lib/quant_ref.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void dequant(void)
{
    const int64_t N = 1 << 24, ROW = 4096; /* 16 M weights in rows of 4096 */
    uint16_t *out = malloc(2 * (size_t)N);
    sf_rng r;
    sf_rng_seed(&r, 1);
    printf("GGUF block formats into bf16, one core, %lld weights (best of 7):\n", (long long)N);
    for (size_t ti = 0; ti < SF_ARRAY_LEN(qr_types); ti++) {
        sf_dtype t = qr_types[ti];
        int blk = sf_dtype_block(t);
        size_t bb = sf_dtype_bytes(t, blk);
        uint8_t *src = malloc(sf_dtype_bytes(t, N));
        for (int64_t b = 0; b < N / blk; b++) sf_quant_random_block(t, src + b * bb, &r);
        double best = 1e30;
        for (int it = 0; it < 7; it++) {
            double t0 = now(); /* what the CUDA upload runs on each of its threads */
            sf_dequant_rows(t, src, sf_dtype_bytes(t, ROW), N / ROW, ROW, SF_DT_BF16, out);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("  %-7s %6.0f M weights/s  (%.2f GB/s read + %.2f GB/s bf16 written)\n", sf_dtype_name(t), N / best / 1e6,
               (double)sf_dtype_bytes(t, N) / best / 1e9, 2.0 * N / best / 1e9);
        free(src);
    }
    free(out);
}

/* One scored prompt position (kernels/cpu/score.c sf_cpu_score_row): what the engine does on the
 * host for each logit row of a scored prompt. */
static void score(void)
{
    static const int vocabs[] = { 32000, 128256 };
    printf("a scored prompt position (log-softmax, rank, top n of one row), one core (best of 9 x 64 rows):\n");
    for (size_t vi = 0; vi < SF_ARRAY_LEN(vocabs); vi++) {
        const int V = vocabs[vi], R = 64;
        float *l = malloc(sizeof(float) * (size_t)V * R);
        sf_rng r;
        sf_rng_seed(&r, 3);
        for (size_t i = 0; i < (size_t)V * R; i++) l[i] = 8.0f * (sf_rng_uniform(&r) - 0.5f);
        for (int k = 0; k <= 20; k += 20) {
            double best = 1e30;
            for (int it = 0; it < 9; it++) {
                double t0 = now();
                for (int row = 0; row < R; row++) {
                    float lp;
                    int32_t rank;
                    int32_t top_id[SF_MAX_LOGPROBS];
                    float top_lp[SF_MAX_LOGPROBS];
                    sf_cpu_score_row(l + (size_t)row * V, V, (row * 7919) % V, k, &lp, &rank, top_id, top_lp);
                }
                double dt = (now() - t0) / R;
                if (dt < best) best = dt;
            }
            printf("  vocab %6d, top %2d: %6.1f us a row (%.2f GB/s of logits read)\n", V, k, best * 1e6,
                   4.0 * V / best / 1e9);
        }
        free(l);
    }
}

/* ms of one mask, best of 20: as -inf on a logits row (host sampling; the row zeroed before,
 * untimed), then as the allow bits the engine sends the backend's sampler (*bits_ms) */
static double mask_ms(const sf_json *j, const sf_json_vocab *v, float *l, int V, double *bits_ms)
{
    double best = 1e30, best_bits = 1e30;
    uint32_t *bits = malloc(sizeof *bits * (size_t)(V + 31) / 32);
    for (int it = 0; it < 20; it++) {
        for (int i = 0; i < V; i++) l[i] = 0;
        double t0 = now();
        sf_json_mask(j, v, l);
        double t1 = now();
        sf_json_mask_bits(j, v, bits);
        double t2 = now();
        best = SF_MIN(best, t1 - t0);
        best_bits = SF_MIN(best_bits, t2 - t1);
    }
    free(bits);
    *bits_ms = best_bits * 1e3;
    return best * 1e3;
}

static void mask(const char *dir)
{
    sf_tokenizer *t = NULL;
    sf_error err = { 0 };
    if (sf_tok_load_dir(dir, &t, &err) != SF_OK) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        return;
    }
    int V = sf_tok_vocab_size(t);
    sf_json_vocab *v = NULL;
    double t0 = now();
    if (sf_json_vocab_new(t, V, &v, &err) != SF_OK) {
        fprintf(stderr, "%s: %s\n", dir, err.msg);
        sf_tok_free(t);
        return;
    }
    double build = now() - t0;
    float *l = malloc(sizeof(float) * (size_t)V);
    static const char *const states[][2] = {
        { "start", "" }, { "in a string", "{\"a\": \"x" }, { "after a number", "{\"a\": 1" },
        { "after a key", "{\"a\"" }, { "after a value", "{\"a\": true" },
    };
    const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"age\": {\"type\": "
                         "\"integer\"}, \"pet\": {\"enum\": [\"cat\", \"dog\"]}}, \"required\": [\"name\", \"age\", \"pet\"]}";
    sf_jschema *sc = NULL;
    sf_jschema_compile(schema, strlen(schema), &sc, NULL);
    printf("JSON mask, one draw, %s (%d tokens; texts built in %.0f ms; best of 20; a logits row, then bits):\n", dir,
           V, build * 1e3);
    double b;
    for (size_t i = 0; i < SF_ARRAY_LEN(states); i++) {
        sf_json j;
        sf_json_init(&j, NULL);
        sf_json_feed(&j, states[i][1], strlen(states[i][1]));
        double r = mask_ms(&j, v, l, V, &b);
        printf("  json_object %-15s %6.3f ms, bits %6.3f ms\n", states[i][0], r, b);
    }
    static const char *const sstates[][2] = { { "at a key", "{\"name\": \"A\", \"" }, { "at an enum", "{\"name\": \"A\", \"age\": 3, \"pet\": " } };
    for (size_t i = 0; i < SF_ARRAY_LEN(sstates); i++) {
        sf_json j;
        sf_json_init(&j, sc);
        sf_json_feed(&j, sstates[i][1], strlen(sstates[i][1]));
        double r = mask_ms(&j, v, l, V, &b);
        printf("  schema      %-15s %6.3f ms, bits %6.3f ms\n", sstates[i][0], r, b);
    }
    /* patterns (guided_regex): a bounded any-text run, and a string held to a schema's pattern */
    static const char *const rx[][3] = {
        { "regex .{0,100}", ".{0,100}", "Once upon a time" },
        { "regex email", "[a-z0-9._]{1,32}@[a-z0-9-]{1,32}\\.(com|org|net)", "jane.doe@exam" },
        { "regex date", "\\d{4}-\\d{2}-\\d{2}", "2026-1" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(rx); i++) {
        sf_jschema *rs = NULL;
        double c0 = now();
        if (sf_jschema_regex(rx[i][1], strlen(rx[i][1]), &rs, &err) != SF_OK) {
            fprintf(stderr, "%s: %s\n", rx[i][1], err.msg);
            continue;
        }
        double compile = now() - c0;
        sf_json j;
        sf_json_init(&j, rs);
        sf_json_feed(&j, rx[i][2], strlen(rx[i][2]));
        double r = mask_ms(&j, v, l, V, &b);
        printf("  %-27s %6.3f ms, bits %6.3f ms (compiled in %.2f ms)\n", rx[i][0], r, b, compile * 1e3);
        sf_jschema_free(rs);
    }
    const char *ps = "{\"type\": \"object\", \"properties\": {\"code\": {\"type\": \"string\", \"pattern\": "
                     "\"^[A-Z]{2}-\\\\d{3}$\"}}}";
    sf_jschema *pc = NULL;
    if (sf_jschema_compile(ps, strlen(ps), &pc, &err) == SF_OK) {
        sf_json j;
        sf_json_init(&j, pc);
        sf_json_feed(&j, "{\"code\": \"AB", 11);
        double r = mask_ms(&j, v, l, V, &b);
        printf("  schema      %-15s %6.3f ms, bits %6.3f ms\n", "in a pattern", r, b);
    }
    sf_jschema_free(pc);
    sf_jschema_free(sc);
    free(l);
    sf_json_vocab_free(v);
    sf_tok_free(t);
}

int main(int argc, char **argv)
{
    dequant();
    score();
    if (argc > 1)
        for (int i = 1; i < argc; i++) mask(argv[i]);
    else {
        mask("../shared/testdata/tinyllama-1.1b-chat-v1.0");
        mask("../shared/testdata/gpt2-tokenizer");
    }
    return 0;
}
