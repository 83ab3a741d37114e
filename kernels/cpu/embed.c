/* embed.c — token embedding lookup from a weight of any dtype, dequantized to fp32. */
#include "cpu.h"

void sf_cpu_embed_task(void *arg, int ith, int nth)
{
    const sf_cpu_embed *a = arg;
    int64_t lo, hi;
    sf_cpu_split(a->T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++)
        sf_cpu_row_to_f32(a->emb.dtype, sf_cpu_row_ptr(a->emb.dtype, a->emb.data, a->emb.cols, a->tokens[t]),
                          a->emb.cols, a->x + t * a->emb.cols);
}
