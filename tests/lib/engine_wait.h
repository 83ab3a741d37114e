/* engine_wait.h — waiting for an engine under test to go idle. Header-only: include it once
 * per test binary. */
#ifndef SF_TESTS_ENGINE_WAIT_H
#define SF_TESTS_ENGINE_WAIT_H

#include <unistd.h>

#include "../../engine/engine.h"

/* Stats are a snapshot taken after each step: polls (up to 2 s) until nothing runs, waits or
 * holds KV blocks; st holds the last snapshot either way. */
static void wait_idle(sf_engine *e, sf_engine_stats *st)
{
    for (int i = 0; i < 400; i++) {
        sf_engine_get_stats(e, st);
        if (!st->running && !st->waiting[0] && !st->waiting[1] && !st->waiting[2] && !st->kv_blocks_used) return;
        usleep(5000);
    }
}

#endif
