/* swap.h — the engine's swap space: host memory holding the K/V of sequences preempted by swap,
 * one slot per KV block, and the copies the scheduler plans (sf_swap_op) run through the DMA
 * scheduler (dma.h), chunked by the sequence's urgency, with the backend's kv_copy_out/in.
 * Engine thread only. */
#ifndef SF_SWAP_H
#define SF_SWAP_H

#include <stddef.h>

#include "../common/sf.h"
#include "../hal/hal.h"
#include "dma.h"
#include "scheduler.h"

typedef struct sf_swap {
    sf_backend *be;           /* not owned */
    sf_dma *dma;              /* owned */
    unsigned char *mem;       /* n_slots x block_bytes, mapped lazily (pages appear when written) */
    size_t block_bytes, bytes;
    int n_slots;
} sf_swap;

/* Swap space of `gib` GiB for blocks of block_bytes. n_slots is 0 (swap off, nothing allocated)
 * when gib is 0, the backend cannot copy KV blocks, or gib holds no block. */
int sf_swap_init(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, sf_error *err);
void sf_swap_free(sf_swap *w);
/* Run one planned copy: device blocks -> slots (SF_DMA_D2H, swap-out) or back (SF_DMA_H2D). */
int sf_swap_run(sf_swap *w, const sf_swap_op *op, int dir, sf_error *err);

#endif
