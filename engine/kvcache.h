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
 * to the free lists when its count drops to zero.
 *
 * Prefix cache (sf_kv_prefix_enable): a full-precision block whose tokens all have their K/V
 * can be registered under a key chained over the blocks before it (sf_kv_prefix_key: the
 * parent's key and the block's tokens, under a per-pool random seed), with the parent key and
 * tokens kept beside it so that a lookup (sf_kv_prefix_find) matches exactly, never on the key
 * alone. A registered block whose count drops to zero keeps its K/V: it is free (n_free counts
 * it, so usage and admission see it as room) but evictable, on a least-recently-freed list
 * taken only when no plain free pair is left; taking it from there unregisters it. A lookup
 * hit is taken with sf_kv_prefix_take, off that list or shared with its holders. INT8 blocks
 * are never registered. */
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
    int n_stack;               /* plain free pairs on free_list (n_free - n_evictable) */
    /* prefix cache (sf_kv_prefix_enable; pc_on 0: off, none of these allocated) */
    int pc_on;
    uint64_t pc_seed;
    int32_t *pc_table;         /* open addressing by key: block ids, -1 empty */
    uint32_t pc_mask;          /* table size - 1 (a power of two >= 2 x n_blocks) */
    uint64_t *pc_key, *pc_parent; /* [n_blocks] of registered blocks */
    int32_t *pc_toks;          /* [n_blocks x block_size] their tokens */
    uint8_t *pc_reg;           /* [n_blocks] registered */
    int32_t *pc_prev, *pc_next; /* [n_blocks] evictable list links, -1 at the ends */
    int32_t pc_head, pc_tail;  /* least recently freed first */
    int n_evictable;           /* registered blocks with no holder (counted in n_free) */
    int n_registered;
    uint64_t pc_evictions;     /* registered blocks taken for other K/V */
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

/* Turn the prefix cache on (allocates its index; SF_ENOMEM). A fresh pool only. */
int sf_kv_prefix_enable(sf_kv_pool *p, sf_error *err);
/* The key of a block of block_size tokens after the block keyed parent (the first block's
 * parent: the sequence's salt). */
uint64_t sf_kv_prefix_key(const sf_kv_pool *p, uint64_t parent, const int32_t *toks);
/* The registered block with this key, parent key and tokens, or -1. */
int32_t sf_kv_prefix_find(const sf_kv_pool *p, uint64_t key, uint64_t parent, const int32_t *toks);
/* Hold block b, found by sf_kv_prefix_find: off the evictable list (returns 1: it was free)
 * or one more holder (returns 0). */
int sf_kv_prefix_take(sf_kv_pool *p, int32_t b);
/* Register held full-precision block b (its tokens' K/V all written) under key; nothing when
 * the key is taken already (another block holds the same tokens) or b is registered. */
void sf_kv_prefix_register(sf_kv_pool *p, int32_t b, uint64_t key, uint64_t parent, const int32_t *toks);
/* Forget every registered block (their K/V may be wrong: a step that wrote them failed); the
 * evictable ones become plain free pairs. */
void sf_kv_prefix_reset(sf_kv_pool *p);

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
