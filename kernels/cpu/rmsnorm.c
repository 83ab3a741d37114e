/* rmsnorm.c — x += add (residual), out = x / sqrt(mean(x^2) + eps) * w, row by row.
 * The sum of squares is accumulated in double: d is a few thousand, the cost is nil and
 * the result does not depend on the vector width. out may equal x only when add is NULL. */
#include "cpu.h"

#include <math.h>

void sf_cpu_rmsnorm_task(void *arg, int ith, int nth)
{
    const sf_cpu_rmsnorm *a = arg;
    int64_t lo, hi;
    sf_cpu_split(a->n, ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *x = a->x + r * a->d;
        float *out = a->out + r * a->d;
        if (a->add) {
            const float *ad = a->add + r * a->d;
            for (int i = 0; i < a->d; i++) x[i] += ad[i];
        }
        double ss = 0;
        for (int i = 0; i < a->d; i++) ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / a->d + a->eps));
        for (int i = 0; i < a->d; i++) out[i] = x[i] * inv * a->w[i];
    }
}
