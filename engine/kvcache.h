/* kvcache.h — the paged KV cache's block allocator (host-side bookkeeping; the blocks'
 * memory lives in the backend, see sf_backend_ops.kv_init). Internal to engine/.
 * Called on the engine thread only.
 *
 * Blocks have a reference count so a prefix can be shared (prefix reuse); a block goes back
 * to the free list when its count drops to zero. */
#ifndef SF_KVCACHE_H
#define SF_KVCACHE_H

#include <stdint.h>

#include "../common/sf.h"

typedef struct sf_kv_pool {
    int n_blocks, block_size;
    int n_free;
    int32_t *free_list;   /* stack of free block ids */
    int32_t *refcnt;      /* [n_blocks] */
} sf_kv_pool;

int sf_kv_pool_init(sf_kv_pool *p, int n_blocks, int block_size, sf_error *err);
void sf_kv_pool_free(sf_kv_pool *p);
/* Take n blocks into out; SF_AGAIN (nothing taken) when fewer than n are free. */
int sf_kv_alloc(sf_kv_pool *p, int n, int32_t *out);
void sf_kv_release(sf_kv_pool *p, const int32_t *blocks, int n);
void sf_kv_retain(sf_kv_pool *p, const int32_t *blocks, int n);
static inline int sf_kv_blocks_for(const sf_kv_pool *p, int tokens) {
    return (tokens + p->block_size - 1) / p->block_size;
}

#endif
