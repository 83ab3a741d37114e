/* fuzz_gbnf.c — libFuzzer target: any bytes as a GBNF grammar (engine/gbnf.c, llama.cpp's
 * `grammar`). A refused one says where (line and column); an accepted one is written out as a
 * pattern that compiles, or is refused by the pattern's own caps. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gbnf.h"
#include "engine/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *rx = NULL;
    sf_error err = { 0 };
    if (sf_gbnf_to_regex((const char *)data, size, &rx, &err)) {
        if (rx || (err.code == SF_EINVAL && !strstr(err.msg, "grammar: line "))) abort();
        return 0;
    }
    if (!rx || strlen(rx) > SF_REGEX_MAX_LEN) abort();
    sf_regex *re = NULL;
    err = (sf_error){ 0 };
    int rc = sf_regex_compile(rx, strlen(rx), 0, &re, &err);
    /* what the writer wrote is the pattern syntax it means to write: only a cap may refuse it */
    if (rc && (rc != SF_EINVAL || (!strstr(err.msg, "written out") && !strstr(err.msg, "automaton states") &&
                                   !strstr(err.msg, "over 1000") && !strstr(err.msg, "nested") && !strstr(err.msg, "parts")))) abort();
    sf_regex_free(re);
    free(rx);
    return 0;
}
