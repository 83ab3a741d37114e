/* silu_mul.c — the SwiGLU gate: out[r, i] = silu(gu[r, i]) * gu[r, f + i]. */
#include "cpu.h"

#include <math.h>

void sf_cpu_silu_mul_task(void *arg, int ith, int nth)
{
    const sf_cpu_silu_mul *a = arg;
    int64_t total = (int64_t)a->n * a->f, lo, hi;
    sf_cpu_split(total, ith, nth, &lo, &hi);
    for (int64_t e = lo; e < hi; e++) {
        int64_t r = e / a->f, i = e % a->f;
        float g = a->gu[r * 2 * a->f + i], u = a->gu[r * 2 * a->f + a->f + i];
        a->out[e] = g / (1.0f + expf(-g)) * u;
    }
}
