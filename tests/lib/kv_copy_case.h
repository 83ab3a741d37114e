/* kv_copy_case.h — the batched KV block copy (sf_backend_ops.kv_copy_blocks) checked against the
 * per-block copies (kv_copy_out / kv_copy_in) on any backend, and timed. Header-only, for
 * tests/unit/test_swap_copy.c (CPU backend) and tests/device/test_swap_copy.c (CUDA).
 *
 * kvc_roundtrip: fills full and INT8 blocks through kv_copy_in, copies them out to scattered host
 * slots with kv_copy_blocks and compares each slot with kv_copy_out of the same block; then copies
 * the slots back into other blocks with kv_copy_blocks and reads those with kv_copy_out. Returns
 * NULL when everything matched, else what did not. */
#ifndef SF_TEST_KV_COPY_CASE_H
#define SF_TEST_KV_COPY_CASE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/sf.h"
#include "../../hal/hal.h"

/* The bytes of a block's host image that hold data (an INT8 block leaves the rest of the stride). */
static inline size_t kvc_used(const sf_kv_config *kc, size_t stride, int i8)
{
    size_t rows = (size_t)kc->n_kv_heads * kc->block_size, scales = (size_t)kc->n_layers * 2 * rows * 4;
    if (i8) return (size_t)kc->n_layers * 2 * rows * kc->head_dim + scales; /* one unit: int8 rows + scales */
    return kc->int8 ? stride - 2 * scales : stride; /* a full block's stride includes two units' scales */
}

static inline const char *kvc_roundtrip(sf_backend *b, const sf_kv_config *kc, sf_rng *r)
{
    static char why[256];
    const struct sf_backend_ops *o = b->ops;
    sf_error err = { 0 };
    if (!o->kv_copy_blocks) return "the backend has no kv_copy_blocks";
    if (o->kv_init(b, kc, &err)) {
        snprintf(why, sizeof why, "kv_init: %s", err.msg);
        return why;
    }
    size_t bb = o->kv_block_bytes(b, kc);
    /* full blocks 1, 3, 4 -> 0, 2, 5 and, with INT8, units 13, 16 -> 19, 22 (ids n_blocks + u, inside
     * full blocks 6-11, which no full block here uses); n_blocks >= 12 */
    int nb = kc->n_blocks;
    int32_t src[5] = { 1, 3, 4, nb + 13, nb + 16 }, dst[5] = { 0, 2, 5, nb + 19, nb + 22 };
    int n = kc->int8 ? 5 : 3;
    int32_t slots[5] = { 7, 2, 4, 0, 5 }; /* scattered, out of order */
    unsigned char *img = malloc(bb * 5), *host = malloc(bb * 8), *one = malloc(bb);
    const char *res = NULL;
    if (!img || !host || !one) {
        res = "out of host memory";
        goto done;
    }
    for (size_t i = 0; i < bb * 5; i++) img[i] = (unsigned char)(sf_rng_next(r) >> 9);
    for (int i = 0; i < n; i++)
        if (o->kv_copy_in(b, &src[i], 1, img + (size_t)i * bb)) {
            res = "kv_copy_in failed";
            goto done;
        }
    memset(host, 0xa5, bb * 8);
    if (o->kv_copy_blocks(b, src, slots, n, host, bb, 1)) {
        res = "kv_copy_blocks out failed";
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t used = kvc_used(kc, bb, src[i] >= nb);
        if (o->kv_copy_out(b, &src[i], 1, one) || memcmp(one, host + (size_t)slots[i] * bb, used) ||
            memcmp(one, img + (size_t)i * bb, used)) {
            size_t k = 0, k2 = 0;
            while (k < used && one[k] == host[(size_t)slots[i] * bb + k]) k++;
            while (k2 < used && one[k2] == img[(size_t)i * bb + k2]) k2++;
            snprintf(why, sizeof why, "block %d in slot %d differs from kv_copy_out's copy (byte %zu; from the "
                     "image written, byte %zu; %zu bytes compared)", src[i], slots[i], k, k2, used);
            res = why;
            goto done;
        }
    }
    if (o->kv_copy_blocks(b, dst, slots, n, host, bb, 0)) {
        res = "kv_copy_blocks in failed";
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t used = kvc_used(kc, bb, dst[i] >= nb);
        if (o->kv_copy_out(b, &dst[i], 1, one) || memcmp(one, img + (size_t)i * bb, used)) {
            snprintf(why, sizeof why, "block %d copied in from slot %d differs", dst[i], slots[i]);
            res = why;
            goto done;
        }
    }
    /* refused without copying: an id past the pool, a negative slot, a stride below a block */
    int32_t bad = kc->int8 ? 3 * nb : nb, neg = -1, ok = 0;
    if (o->kv_copy_blocks(b, &bad, slots, 1, host, bb, 1) != SF_EINVAL ||
        o->kv_copy_blocks(b, &ok, &neg, 1, host, bb, 1) != SF_EINVAL ||
        o->kv_copy_blocks(b, &ok, slots, 1, host, bb - 1, 1) != SF_EINVAL)
        res = "a bad block id, slot or stride was not refused";
done:
    free(img);
    free(host);
    free(one);
    return res;
}

/* Microseconds to move n blocks (every other block from first_id, to slots in reverse order) out
 * and back, with kv_copy_blocks and with one kv_copy_out / kv_copy_in call per block (what the
 * swap path did before), best of reps. host holds n blocks of stride bytes. */
static inline void kvc_time(sf_backend *b, size_t stride, int n, int32_t first_id, void *host, int reps,
                     double *us_batched, double *us_per_block)
{
    const struct sf_backend_ops *o = b->ops;
    int32_t *blocks = malloc((size_t)n * sizeof *blocks), *slots = malloc((size_t)n * sizeof *slots);
    *us_batched = *us_per_block = -1;
    if (!blocks || !slots) goto done;
    for (int i = 0; i < n; i++) blocks[i] = first_id + 2 * i, slots[i] = n - 1 - i;
    for (int k = 0; k < 2; k++) {
        double best = -1;
        for (int rep = 0; rep < reps; rep++) {
            uint64_t t0 = sf_now_ns();
            int rc = 0;
            for (int out = 1; out >= 0 && !rc; out--) {
                if (k == 0) {
                    rc = o->kv_copy_blocks(b, blocks, slots, n, host, stride, out);
                    continue;
                }
                for (int i = 0; i < n && !rc; i++) {
                    char *h = (char *)host + (size_t)slots[i] * stride;
                    rc = out ? o->kv_copy_out(b, &blocks[i], 1, h) : o->kv_copy_in(b, &blocks[i], 1, h);
                }
            }
            double us = (sf_now_ns() - t0) * 1e-3;
            if (rc) goto done;
            if (best < 0 || us < best) best = us;
        }
        *(k == 0 ? us_batched : us_per_block) = best;
    }
done:
    free(blocks);
    free(slots);
}

#endif
