/* fuzz_params.c — libFuzzer target: any bytes as a chat or completions request body.
 * The first byte picks the endpoint. Must never crash, leak or read out of bounds; every
 * rejection must carry a 4xx/5xx status and a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/params.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    int kind = data[0] & 1 ? SF_GW_CHAT : SF_GW_COMPLETIONS;
    sf_gw_params p;
    sf_gw_err e;
    memset(&e, 0, sizeof e);
    if (sf_gw_params_parse(kind, (const char *)data + 1, size - 1, &p, &e) == 0) {
        if (p.n < 1 || p.n > SF_GW_MAX_N || p.sampling.n_stop > SF_MAX_STOP || !(p.sampling.top_p > 0))
            abort();
        sf_gw_params_free(&p);
    } else if (e.status < 400 || !e.msg[0]) {
        abort();
    }
    return 0;
}
