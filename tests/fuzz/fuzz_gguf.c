/* fuzz_gguf.c — libFuzzer target: any bytes as a .gguf file through the whole GGUF load
 * (parser, config, tensor binding, tokenizer from metadata). A model that loads must validate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        sf_log_level = SF_LOG_ERROR;
        fd = memfd_create("fuzz.gguf", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    sf_model *m = NULL;
    sf_error err = { 0 };
    if (sf_model_load(path, NULL, &m, &err) != SF_OK) {
        if (!err.msg[0] || m) abort();
        return 0;
    }
    if (sf_model_validate(m, &err) != SF_OK) abort();
    sf_model_free(m);
    return 0;
}
