/* kvcache.c — the paged KV cache's block allocator: full-precision blocks (unit pairs) and
 * INT8 blocks (single units) out of one pool, with a reference count per block (prefix
 * sharing). Host-side bookkeeping only; the blocks' memory lives in the backend. Engine thread
 * only. See kvcache.h for the id scheme. */
#include "kvcache.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    p->n_free = p->n_stack = n_blocks;
    p->n_free_units = (int)units;
    p->pc_head = p->pc_tail = -1;
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
    free(p->pc_table);
    free(p->pc_key);
    free(p->pc_parent);
    free(p->pc_toks);
    free(p->pc_reg);
    free(p->pc_prev);
    free(p->pc_next);
    memset(p, 0, sizeof *p);
}

/* ---- prefix cache ----------------------------------------------------------------------- */

int sf_kv_prefix_enable(sf_kv_pool *p, sf_error *err)
{
    if (p->pc_on) return SF_OK;
    size_t n = (size_t)p->n_blocks, cap = 16;
    while (cap < 2 * n) cap *= 2;
    p->pc_table = malloc(cap * sizeof *p->pc_table);
    p->pc_key = malloc(n * sizeof *p->pc_key);
    p->pc_parent = malloc(n * sizeof *p->pc_parent);
    p->pc_toks = malloc(n * (size_t)p->block_size * sizeof *p->pc_toks);
    p->pc_reg = calloc(n, 1);
    p->pc_prev = malloc(n * sizeof *p->pc_prev);
    p->pc_next = malloc(n * sizeof *p->pc_next);
    if (!p->pc_table || !p->pc_key || !p->pc_parent || !p->pc_toks || !p->pc_reg || !p->pc_prev || !p->pc_next)
        return sf_err(err, SF_ENOMEM, "kv pool: out of memory for the prefix cache's index of %d blocks", p->n_blocks);
    for (size_t i = 0; i < cap; i++) p->pc_table[i] = -1;
    p->pc_mask = (uint32_t)(cap - 1);
    /* a seed per pool: keys cannot be aimed at each other from outside (a lookup still
     * compares the tokens and parent key, so a collision only costs a miss) */
    uint64_t seed = 0;
    if (getentropy(&seed, sizeof seed) != 0) seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
    p->pc_seed = seed;
    p->pc_head = p->pc_tail = -1;
    p->pc_on = 1;
    return SF_OK;
}

uint64_t sf_kv_prefix_key(const sf_kv_pool *p, uint64_t parent, const int32_t *toks)
{
    uint64_t h = sf_mix64(parent ^ p->pc_seed);
    for (int i = 0; i < p->block_size; i++) h = sf_mix64(h ^ (uint32_t)toks[i]) + (uint64_t)i;
    return h;
}

int32_t sf_kv_prefix_find(const sf_kv_pool *p, uint64_t key, uint64_t parent, const int32_t *toks)
{
    if (!p->pc_on) return -1;
    size_t bs = (size_t)p->block_size;
    for (uint32_t i = (uint32_t)key & p->pc_mask;; i = (i + 1) & p->pc_mask) {
        int32_t b = p->pc_table[i];
        if (b < 0) return -1;
        if (p->pc_key[b] == key && p->pc_parent[b] == parent && !memcmp(p->pc_toks + b * bs, toks, bs * sizeof *toks))
            return b;
    }
}

static void lru_unlink(sf_kv_pool *p, int32_t b)
{
    int32_t a = p->pc_prev[b], c = p->pc_next[b];
    if (a >= 0) p->pc_next[a] = c;
    else p->pc_head = c;
    if (c >= 0) p->pc_prev[c] = a;
    else p->pc_tail = a;
    p->n_evictable--;
}

static void lru_push(sf_kv_pool *p, int32_t b)
{
    p->pc_prev[b] = p->pc_tail;
    p->pc_next[b] = -1;
    if (p->pc_tail >= 0) p->pc_next[p->pc_tail] = b;
    else p->pc_head = b;
    p->pc_tail = b;
    p->n_evictable++;
}

/* Take b out of the index (linear probing: the entries after it in its run move back). */
static void unregister(sf_kv_pool *p, int32_t b)
{
    uint32_t m = p->pc_mask, i = (uint32_t)p->pc_key[b] & m;
    while (p->pc_table[i] != b) i = (i + 1) & m;
    for (uint32_t j = (i + 1) & m;; j = (j + 1) & m) {
        int32_t c = p->pc_table[j];
        if (c < 0) break;
        uint32_t home = (uint32_t)p->pc_key[c] & m;
        /* c may fill the hole at i when its home is not in (i, j] */
        if (((j - home) & m) >= ((j - i) & m)) {
            p->pc_table[i] = c;
            i = j;
        }
    }
    p->pc_table[i] = -1;
    p->pc_reg[b] = 0;
    p->n_registered--;
}

void sf_kv_prefix_register(sf_kv_pool *p, int32_t b, uint64_t key, uint64_t parent, const int32_t *toks)
{
    if (!p->pc_on || b < 0 || b >= p->n_blocks || p->pc_reg[b] || p->pair_state[b] != SF_KV_PAIR_FULL) return;
    uint32_t i = (uint32_t)key & p->pc_mask;
    for (; p->pc_table[i] >= 0; i = (i + 1) & p->pc_mask)
        if (p->pc_key[p->pc_table[i]] == key) return; /* that key is served by another block */
    size_t bs = (size_t)p->block_size;
    p->pc_table[i] = b;
    p->pc_key[b] = key;
    p->pc_parent[b] = parent;
    memcpy(p->pc_toks + b * bs, toks, bs * sizeof *toks);
    p->pc_reg[b] = 1;
    p->n_registered++;
}

int sf_kv_prefix_take(sf_kv_pool *p, int32_t b)
{
    if (p->refcnt[2 * b] > 0) {
        p->refcnt[2 * b]++;
        return 0;
    }
    lru_unlink(p, b);
    p->pair_state[b] = SF_KV_PAIR_FULL;
    p->refcnt[2 * b] = 1;
    p->n_free--;
    p->n_free_units -= 2;
    return 1;
}

void sf_kv_prefix_reset(sf_kv_pool *p)
{
    if (!p->pc_on) return;
    while (p->pc_head >= 0) {
        int32_t b = p->pc_head;
        lru_unlink(p, b);
        p->free_list[p->n_stack++] = b;
    }
    memset(p->pc_reg, 0, (size_t)p->n_blocks);
    memset(p->pc_table, 0xff, ((size_t)p->pc_mask + 1) * sizeof *p->pc_table); /* -1 */
    p->n_registered = 0;
}

/* A whole free pair, counted out of n_free: a plain one first, else the least recently freed
 * registered one, which is forgotten. */
static int32_t take_pair(sf_kv_pool *p)
{
    int32_t b;
    if (p->n_stack) {
        b = p->free_list[--p->n_stack];
    } else {
        b = p->pc_head;
        lru_unlink(p, b);
        unregister(p, b);
        p->pc_evictions++;
    }
    p->n_free--;
    return b;
}

/* Pair b has no holder left. */
static void put_pair(sf_kv_pool *p, int32_t b)
{
    p->pair_state[b] = SF_KV_PAIR_FREE;
    if (p->pc_on && p->pc_reg[b]) lru_push(p, b);
    else p->free_list[p->n_stack++] = b;
    p->n_free++;
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
        int32_t b = take_pair(p);
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
            int32_t b = take_pair(p);
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
            put_pair(p, b);
            p->n_free_units += 2;
            continue;
        }
        p->n_free_units++;
        int64_t other = u ^ 1;
        if (p->half_pos[other] >= 0) { /* both halves free: a whole pair again */
            half_remove(p, (int32_t)other);
            put_pair(p, b);
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
