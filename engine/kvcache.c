/* kvcache.c — the paged KV cache's block allocator: a stack of free block ids and a
 * reference count per block (prefix sharing). Host-side bookkeeping only; the blocks'
 * memory lives in the backend. Engine thread only. */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>

int sf_kv_pool_init(sf_kv_pool *p, int n_blocks, int block_size, sf_error *err)
{
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || block_size < 1)
        return sf_err(err, SF_EINVAL, "kv pool: %d blocks of %d tokens; both must be at least 1", n_blocks, block_size);
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->refcnt = calloc((size_t)n_blocks, sizeof *p->refcnt);
    if (!p->free_list || !p->refcnt) {
        sf_kv_pool_free(p);
        return sf_err(err, SF_ENOMEM, "kv pool: out of memory for %d blocks", n_blocks);
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* low ids on top of the stack: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return SF_OK;
}

void sf_kv_pool_free(sf_kv_pool *p)
{
    if (!p) return;
    free(p->free_list);
    free(p->refcnt);
    memset(p, 0, sizeof *p);
}

int sf_kv_alloc(sf_kv_pool *p, int n, int32_t *out)
{
    if (n < 0 || n > p->n_free) return SF_AGAIN;
    for (int i = 0; i < n; i++) {
        int32_t b = p->free_list[--p->n_free];
        p->refcnt[b] = 1;
        out[i] = b;
    }
    return SF_OK;
}

/* Releasing a block that is not held is a caller bug: it is logged and ignored rather than
 * corrupting the free list (a block on it twice would be handed to two sequences). */
void sf_kv_release(sf_kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b < 0 || b >= p->n_blocks || p->refcnt[b] <= 0) {
            SF_LOGE("kv pool: release of block %d that is not held (ignored)", b);
            continue;
        }
        if (--p->refcnt[b] == 0) p->free_list[p->n_free++] = b;
    }
}

void sf_kv_retain(sf_kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t b = blocks[i];
        if (b < 0 || b >= p->n_blocks || p->refcnt[b] <= 0) {
            SF_LOGE("kv pool: retain of block %d that is not held (ignored)", b);
            continue;
        }
        p->refcnt[b]++;
    }
}
