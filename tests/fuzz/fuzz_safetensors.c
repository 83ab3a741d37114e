/* fuzz_safetensors.c — libFuzzer target: any bytes as model.safetensors in a folder whose
 * config.json matches the seed (tests/fuzz/make_loader_seeds.py). A model that loads must
 * validate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model.h"

static const char config[] =
    "{\"model_type\": \"llama\", \"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 16,"
    " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1}";

static void put(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
}

static char dir[128], cfg[160], st[160];

static void cleanup(void)
{
    unlink(st);
    unlink(cfg);
    rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        sf_log_level = SF_LOG_ERROR;
        snprintf(dir, sizeof dir, "/dev/shm/semflow-fuzz-st-%d", (int)getpid());
        if (mkdir(dir, 0700) != 0) abort();
        atexit(cleanup);
        snprintf(cfg, sizeof cfg, "%s/config.json", dir);
        put(cfg, config, strlen(config));
        snprintf(st, sizeof st, "%s/model.safetensors", dir);
    }
    put(st, data, size);
    sf_model *m = NULL;
    sf_error err = { 0 };
    if (sf_model_load(dir, NULL, &m, &err) != SF_OK) {
        if (!err.msg[0] || m) abort();
        return 0;
    }
    if (sf_model_validate(m, &err) != SF_OK) abort();
    sf_model_free(m);
    return 0;
}
