/* rope_kv.c — rotary position embedding of q and k, and the append of k and v to the paged
 * KV cache. Angles pos * inv_freq are computed in double once per token and shared by all
 * heads. Two conventions: halves (Hugging Face: dim i pairs with i + rot/2) and interleaved
 * (GGUF: dim 2i pairs with 2i+1). Dimensions past rot_dim are left as they are. Tokens whose
 * slot lies in an INT8 block are stored quantised (sf_cpu_quant_row). */
#include "cpu.h"

#include <math.h>
#include <string.h>

#define MAX_HALF 512

void sf_cpu_rope_apply(float *v, int rot_dim, int interleaved, const float *c, const float *s)
{
    int half = rot_dim / 2;
    if (interleaved) {
        for (int i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * c[i] - x1 * s[i];
            v[2 * i + 1] = x0 * s[i] + x1 * c[i];
        }
    } else {
        for (int i = 0; i < half; i++) {
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c[i] - x1 * s[i];
            v[i + half] = x0 * s[i] + x1 * c[i];
        }
    }
}

void sf_cpu_rope_kv_task(void *arg, int ith, int nth)
{
    const sf_cpu_rope_kv *a = arg;
    int hd = a->head_dim, half = a->rot_dim / 2;
    int64_t stride = (int64_t)(a->n_heads + 2 * a->n_kv_heads) * hd;
    float c[MAX_HALF], s[MAX_HALF];
    int64_t lo, hi;
    sf_cpu_split(a->T, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *row = a->qkv + t * stride;
        for (int i = 0; i < half; i++) {
            double ang = (double)a->pos[t] * (double)a->inv_freq[i];
            c[i] = (float)cos(ang);
            s[i] = (float)sin(ang);
        }
        for (int h = 0; h < a->n_heads + a->n_kv_heads; h++)
            sf_cpu_rope_apply(row + (int64_t)h * hd, a->rot_dim, a->interleaved, c, s);
        int64_t blk = a->slot[t] / a->block_size, off = a->slot[t] % a->block_size;
        const float *k = row + (int64_t)a->n_heads * hd;
        const float *v = k + (int64_t)a->n_kv_heads * hd;
        if (a->kv8.i8_base && blk >= a->kv8.i8_base) { /* an INT8 unit: one scale per token per kv head */
            int64_t u = blk - a->kv8.i8_base;
            for (int h = 0; h < a->n_kv_heads; h++) {
                int64_t row = (u * a->n_kv_heads + h) * a->block_size + off;
                int64_t at = u * a->kv8.unit_bytes + ((int64_t)h * a->block_size + off) * hd;
                a->kv8.k_scale[row] = sf_cpu_quant_row(k + (int64_t)h * hd, hd, a->kv8.k8 + at);
                a->kv8.v_scale[row] = sf_cpu_quant_row(v + (int64_t)h * hd, hd, a->kv8.v8 + at);
            }
            continue;
        }
        for (int h = 0; h < a->n_kv_heads; h++) {
            int64_t dst = ((blk * a->n_kv_heads + h) * a->block_size + off) * hd;
            memcpy(a->k_cache + dst, k + (int64_t)h * hd, (size_t)hd * sizeof(float));
            memcpy(a->v_cache + dst, v + (int64_t)h * hd, (size_t)hd * sizeof(float));
        }
    }
}
