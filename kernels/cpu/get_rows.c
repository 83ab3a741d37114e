/* get_rows.c — gather rows of an activation (the logit rows of a batch). */
#include "cpu.h"

#include <string.h>

void sf_cpu_get_rows(const float *x, int cols, const int32_t *rows, int n, float *out)
{
    for (int i = 0; i < n; i++)
        memcpy(out + (int64_t)i * cols, x + (int64_t)rows[i] * cols, (size_t)cols * sizeof(float));
}
