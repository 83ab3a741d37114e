/* fuzz_tenants.c — libFuzzer target: any bytes as a tenants file; accepted tables must answer
 * auth lookups and limiter calls without faults. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/tenants.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sf_tenants *ts = NULL;
    sf_error err = { 0 };
    if (sf_tenants_parse((const char *)data, size, &ts, &err)) {
        if (!err.msg[0] || ts) abort();
        return 0;
    }
    for (int i = 0; i < ts->n; i++) {
        sf_tenant *t = &ts->t[i];
        char auth[300];
        snprintf(auth, sizeof auth, "Bearer %s", t->keys[0]);
        if (sf_tenants_auth(ts, auth) != t) abort();
        double ra;
        const char *why;
        if (sf_tenant_admit(t, 1.0, &ra, &why) == 0) sf_tenant_release(t);
        sf_tenant_charge(t, 3, 2.0);
    }
    sf_tenants_free(ts);
    return 0;
}
