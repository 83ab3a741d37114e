/* cmd_gen_model.c — `semflow gen-model [--out DIR] [--seed N]`: write the demo model (a small
 * Llama-architecture Hugging Face folder with random weights) so it can be served or inspected
 * with any tool that reads HF folders. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "engine/model.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: semflow gen-model [--out DIR] [--seed N]\n"
               "  writes the demo model (Llama architecture, 4 layers, hidden 256, byte-level BPE tokenizer\n"
               "  trained on a short built-in text) as a Hugging Face folder. Its weights are RANDOM:\n"
               "  what it generates is meaningless; it exists to run semflow without a download.\n"
               "  --out DIR   folder to write (default: where --model demo looks: $SEMFLOW_DEMO_DIR,\n"
               "              $XDG_CACHE_HOME/semflow/demo or ~/.cache/semflow/demo)\n"
               "  --seed N    weight seed (default: the demo's fixed seed)\n");
}

int sf_cmd_gen_model(int argc, char **argv)
{
    const char *out = NULL;
    uint64_t seed = 0;
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            char *end;
            errno = 0;
            seed = strtoull(argv[++i], &end, 0);
            if (errno || *end || !*argv[i]) {
                fprintf(stderr, "semflow gen-model: --seed wants a non-negative integer, got '%s'\n", argv[i]);
                return 2;
            }
            have_seed = 1;
        } else {
            fprintf(stderr, "semflow gen-model: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    sf_error err = { 0 };
    char dir[1024];
    int rc;
    if (!out && !have_seed) {
        rc = sf_demo_path(dir, sizeof dir, &err);
    } else {
        if (!out) {
            fprintf(stderr, "semflow gen-model: --seed needs --out DIR (the default demo uses the fixed seed)\n");
            return 2;
        }
        snprintf(dir, sizeof dir, "%s", out);
        rc = sf_demo_write(dir, have_seed ? seed : SF_DEMO_SEED, &err);
    }
    if (rc) {
        fprintf(stderr, "semflow gen-model: %s\n", err.msg);
        return 1;
    }
    sf_model *m = NULL;
    if ((rc = sf_model_load_hf(dir, NULL, &m, &err))) {
        fprintf(stderr, "semflow gen-model: wrote %s but it does not load: %s\n", dir, err.msg);
        return 1;
    }
    printf("demo model in %s: %s, %d layers, hidden %d, vocab %d, %.1f MiB %s. Its weights are random: "
           "generated text is meaningless.\n", dir, m->cfg.arch, m->cfg.n_layers, m->cfg.hidden, m->cfg.vocab_size,
           (double)m->weight_bytes / (1 << 20), m->cfg.dtype == SF_DT_BF16 ? "bf16" : "");
    sf_model_free(m);
    return 0;
}
