/* kvcache.c — the paged KV cache's block allocator: full-precision blocks (unit pairs) and
 * INT8 blocks (single units) out of one pool, with a reference count per block (prefix
 * sharing). Host-side bookkeeping only; the blocks' memory lives in the backend. Engine thread
 * only. See kvcache.h for the id scheme. */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>

int sf_kv_pool_init(sf_kv_pool *p, int n_blocks, int block_size, sf_error *err)
{
    memset(p, 0, sizeof *p);
    if (n_blocks < 1 || block_size < 1)
        return sf_err(err, SF_EINVAL, "kv pool: %d blocks of %d tokens; both must be at least 1", n_blocks, block_size);
    if (n_blocks > (1 << 28))
        return sf_err(err, SF_EINVAL, "kv pool: %d blocks is more than the %d the block ids can name", n_blocks, 1 << 28);
    size_t units = 2 * (size_t)n_blocks;
    p->free_list = malloc((size_t)n_blocks * sizeof *p->free_list);
    p->half_list = malloc(units * sizeof *p->half_list);
    p->half_pos = malloc(units * sizeof *p->half_pos);
    p->refcnt = calloc(units, sizeof *p->refcnt);
    p->pair_state = calloc((size_t)n_blocks, 1);
    if (!p->free_list || !p->half_list || !p->half_pos || !p->refcnt || !p->pair_state) {
        sf_kv_pool_free(p);
        return sf_err(err, SF_ENOMEM, "kv pool: out of memory for %d blocks", n_blocks);
    }
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    /* low ids on top of the stack: a fresh pool hands out 0, 1, 2, ... */
    for (int i = 0; i < n_blocks; i++) p->free_list[i] = n_blocks - 1 - i;
    for (size_t u = 0; u < units; u++) p->half_pos[u] = -1;
    p->n_free = n_blocks;
    p->n_free_units = (int)units;
    return SF_OK;
}

void sf_kv_pool_free(sf_kv_pool *p)
{
    if (!p) return;
    free(p->free_list);
    free(p->half_list);
    free(p->half_pos);
    free(p->refcnt);
    free(p->pair_state);
    memset(p, 0, sizeof *p);
}

int sf_kv_can_alloc(const sf_kv_pool *p, int i8, int n)
{
    if (n < 0) return 0;
    if (i8) return p->i8_ok && n <= p->n_free_units;
    return n <= p->n_free;
}

static void half_push(sf_kv_pool *p, int32_t u)
{
    p->half_pos[u] = p->n_half;
    p->half_list[p->n_half++] = u;
}

static void half_remove(sf_kv_pool *p, int32_t u)
{
    int i = p->half_pos[u];
    int32_t last = p->half_list[--p->n_half];
    p->half_list[i] = last;
    p->half_pos[last] = i;
    p->half_pos[u] = -1;
}

/* One INT8 unit: a lone half first (it completes a pair), else the first half of a free pair. */
static int32_t take_unit(sf_kv_pool *p)
{
    int32_t u;
    if (p->n_half) {
        u = p->half_list[p->n_half - 1];
        half_remove(p, u);
    } else {
        int32_t b = p->free_list[--p->n_free];
        p->pair_state[b] = SF_KV_PAIR_SPLIT;
        u = 2 * b;
        half_push(p, u + 1);
    }
    p->refcnt[u] = 1;
    p->n_free_units--;
    return u;
}

int sf_kv_alloc_as(sf_kv_pool *p, int i8, int n, int32_t *out)
{
    if (i8 && !p->i8_ok) return SF_EUNSUPPORTED;
    if (!sf_kv_can_alloc(p, i8, n)) return SF_AGAIN;
    for (int i = 0; i < n; i++) {
        if (i8) {
            out[i] = p->n_blocks + take_unit(p);
        } else {
            int32_t b = p->free_list[--p->n_free];
            p->pair_state[b] = SF_KV_PAIR_FULL;
            p->refcnt[2 * b] = 1;
            p->n_free_units -= 2;
            out[i] = b;
        }
    }
    return SF_OK;
}

int sf_kv_alloc(sf_kv_pool *p, int n, int32_t *out) { return sf_kv_alloc_as(p, 0, n, out); }

/* The unit whose count a block id keeps, or -1 when the id names no held block. */
static int64_t held_unit(const sf_kv_pool *p, int32_t id)
{
    if (id < 0 || id >= 3 * p->n_blocks) return -1;
    if (id < p->n_blocks) return p->pair_state[id] == SF_KV_PAIR_FULL && p->refcnt[2 * id] > 0 ? 2 * (int64_t)id : -1;
    int64_t u = id - p->n_blocks;
    return p->pair_state[u / 2] == SF_KV_PAIR_SPLIT && p->refcnt[u] > 0 ? u : -1;
}

/* Releasing a block that is not held is a caller bug: it is logged and ignored rather than
 * corrupting the free lists (a block on them twice would be handed to two sequences). */
void sf_kv_release(sf_kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        int32_t id = blocks[i];
        int64_t u = held_unit(p, id);
        if (u < 0) {
            SF_LOGE("kv pool: release of block %d that is not held (ignored)", id);
            continue;
        }
        if (--p->refcnt[u] > 0) continue;
        int32_t b = (int32_t)(u / 2);
        if (id < p->n_blocks) {
            p->pair_state[b] = SF_KV_PAIR_FREE;
            p->free_list[p->n_free++] = b;
            p->n_free_units += 2;
            continue;
        }
        p->n_free_units++;
        int64_t other = u ^ 1;
        if (p->half_pos[other] >= 0) { /* both halves free: a whole pair again */
            half_remove(p, (int32_t)other);
            p->pair_state[b] = SF_KV_PAIR_FREE;
            p->free_list[p->n_free++] = b;
        } else {
            half_push(p, (int32_t)u);
        }
    }
}

void sf_kv_retain(sf_kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        int64_t u = held_unit(p, blocks[i]);
        if (u < 0) {
            SF_LOGE("kv pool: retain of block %d that is not held (ignored)", blocks[i]);
            continue;
        }
        p->refcnt[u]++;
    }
}

int sf_kv_refs(const sf_kv_pool *p, int32_t id)
{
    int64_t u = held_unit(p, id);
    return u < 0 ? 0 : p->refcnt[u];
}
