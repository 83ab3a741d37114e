/* kvcache.h — the paged KV cache's block allocator (host-side bookkeeping; the blocks'
 * memory lives in the backend, see sf_backend_ops.kv_init). Internal to engine/.
 * Called on the engine thread only.
 *
 * Two kinds of block share one pool: full-precision blocks (bf16 on CUDA, f32 on the CPU) and
 * INT8 blocks (the degrade path: one int8 per value plus a scale per token per kv head). The
 * pool is carved in half-block units: a full-precision block is an aligned pair of units, an
 * INT8 block one unit, so an INT8 block takes half the memory of a full one.
 *
 *   full block  id b        in [0, n_blocks)              = units 2b and 2b + 1
 *   INT8 block  id n_blocks + u, u in [0, 2 * n_blocks)   = unit u
 *
 * The id alone says the kind (sf_kv_is_i8); backends read it the same way (hal.h). A sequence
 * normally holds one kind, chosen when it is admitted (sf_seq.kv_i8 in scheduler.h).
 *
 * Fragmentation: INT8 blocks go into half-used pairs first, and a pair whose two halves are free
 * again is a whole free pair at once, so lone free halves only exist next to a held INT8 block.
 *
 * Blocks have a reference count so a prefix can be shared (prefix reuse); a block goes back
 * to the free lists when its count drops to zero. */
#ifndef SF_KVCACHE_H
#define SF_KVCACHE_H

#include <stdint.h>

#include "../common/sf.h"

typedef struct sf_kv_pool {
    int n_blocks, block_size;  /* full-precision blocks (unit pairs), tokens per block */
    int i8_ok;                 /* INT8 blocks may be allocated (sf_kv_pool_enable_i8) */
    int n_free;                /* whole free pairs: full-precision blocks that can be taken now */
    int n_free_units;          /* free units, in pairs and lone halves: INT8 blocks that can be taken now */
    int n_half;                /* lone free halves (the other half holds an INT8 block) */
    int32_t *free_list;        /* stack of wholly free pair ids */
    int32_t *half_list;        /* [n_half] unit ids of lone free halves */
    int32_t *half_pos;         /* [2 * n_blocks] index of a unit in half_list, -1 when not there */
    int32_t *refcnt;           /* [2 * n_blocks] per unit; a full block counts on its first unit */
    uint8_t *pair_state;       /* [n_blocks] SF_KV_PAIR_* */
} sf_kv_pool;

enum { SF_KV_PAIR_FREE = 0, SF_KV_PAIR_FULL, SF_KV_PAIR_SPLIT };

int sf_kv_pool_init(sf_kv_pool *p, int n_blocks, int block_size, sf_error *err);
void sf_kv_pool_free(sf_kv_pool *p);
/* Let INT8 blocks be allocated too (the backend's cache was set up with sf_kv_config.int8). */
static inline void sf_kv_pool_enable_i8(sf_kv_pool *p) { p->i8_ok = 1; }

/* Take n full-precision blocks into out; SF_AGAIN (nothing taken) when fewer than n are free. */
int sf_kv_alloc(sf_kv_pool *p, int n, int32_t *out);
/* Take n blocks of one kind (i8: 1 = INT8, 0 = full precision) into out. SF_AGAIN (nothing
 * taken) when they do not fit; SF_EUNSUPPORTED for INT8 when the pool has them off. */
int sf_kv_alloc_as(sf_kv_pool *p, int i8, int n, int32_t *out);
/* 1 when n blocks of that kind can be taken now. */
int sf_kv_can_alloc(const sf_kv_pool *p, int i8, int n);
/* Either kind, told apart by id. */
void sf_kv_release(sf_kv_pool *p, const int32_t *blocks, int n);
void sf_kv_retain(sf_kv_pool *p, const int32_t *blocks, int n);
/* Holders of a block (0 when it is free or the id names nothing). */
int sf_kv_refs(const sf_kv_pool *p, int32_t id);

static inline int sf_kv_blocks_for(const sf_kv_pool *p, int tokens) {
    return (tokens + p->block_size - 1) / p->block_size;
}
static inline int sf_kv_is_i8(const sf_kv_pool *p, int32_t id) { return id >= p->n_blocks; }
/* Units one block of a kind takes: the currency of KV usage and reserves. */
static inline int sf_kv_units(int i8) { return i8 ? 1 : 2; }
static inline int sf_kv_total_units(const sf_kv_pool *p) { return 2 * p->n_blocks; }
/* Share of the pool's memory in use, [0, 1]. */
static inline double sf_kv_usage(const sf_kv_pool *p) {
    return p->n_blocks ? 1.0 - (double)p->n_free_units / (2.0 * p->n_blocks) : 0.0;
}

#endif
