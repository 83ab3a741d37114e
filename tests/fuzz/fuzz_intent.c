/* fuzz_intent.c — libFuzzer target: any bytes as an X-Semantic-Intent header value, and the
 * canonical form of every accepted intent must parse back to the same intent. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/intent.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_intent a, b;
    sf_error err = { 0 };
    if (sf_intent_parse((const char *)data, size, &a, &err)) {
        if (!err.msg[0]) abort();
        return 0;
    }
    if (a.urgency < 0 || a.urgency >= SF_URGENCY_COUNT || !a.cls[0]) abort();
    char buf[256];
    sf_intent_format(&a, buf, sizeof buf);
    if (sf_intent_parse(buf, strlen(buf), &b, &err)) abort();
    if (strcmp(a.cls, b.cls) || a.urgency != b.urgency || a.max_latency_ms != b.max_latency_ms) abort();
    return 0;
}
