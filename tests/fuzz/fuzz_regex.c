/* fuzz_regex.c — libFuzzer target: any bytes as a guided_regex pattern (engine/regex.c; the
 * first byte's low bit: read as a search, as JSON Schema's `pattern` is). A
 * refused one has a message that says where; a compiled one is walked over its own bytes and
 * over every byte from each state it reaches: states stay in range, and a live state with no
 * way on matches (the token mask never corners the model). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_regex *re = NULL;
    sf_error err = { 0 };
    if (!size) return 0;
    int flags = data[0] & 1 ? SF_REGEX_SEARCH : 0;
    data++, size--;
    if (sf_regex_compile((const char *)data, size, flags, &re, &err)) {
        if (!err.msg[0] || (err.code == SF_EINVAL && !strstr(err.msg, "regex: "))) abort();
        return 0;
    }
    int n = sf_regex_states(re);
    if (n < 1 || n > SF_REGEX_MAX_STATES) abort();
    for (int s = 0; s < n && s < 512; s++) {
        if (!sf_regex_more(re, s) && !sf_regex_accepts(re, s)) abort();
        for (int c = 0; c < 256; c++) {
            int t = sf_regex_next(re, s, (unsigned char)c);
            if (t < -1 || t >= n) abort();
        }
    }
    (void)sf_regex_match(re, (const char *)data, size);
    sf_regex_free(re);
    return 0;
}
