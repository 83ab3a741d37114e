/* swap.h — the engine's swap space: host memory holding the K/V of sequences preempted by swap,
 * one slot per KV block, and the copies the scheduler plans (sf_swap_op) run through the DMA
 * scheduler (dma.h), chunked by the sequence's urgency, with the backend's kv_copy_out/in.
 *
 * The memory comes from sf_backend_host_alloc: page-locked on CUDA (real DMA at link speed),
 * aligned host memory on the CPU backend. It is taken whole at init (pinned memory cannot be
 * lazily mapped), so --swap-space is host RAM held for the server's life.
 *
 * DMA tuning (sf_swap_opts): with the tuner on, each class gets its chunk size and low-class
 * copies made while the PCIe link is contended book the link share left to them; sf_swap_in_ok
 * (the scheduler's swap_in_ok gate) keeps further low-class swap-ins waiting until that booking
 * has drained, so a contended link is not filled with low-class K/V at the expense of the
 * steps that carry high-class tokens. With the tuner off every copy is one piece, never held.
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
    unsigned char *mem;       /* n_slots x block_bytes, from sf_backend_host_alloc */
    size_t block_bytes, bytes;
    int n_slots;
} sf_swap;

typedef struct sf_swap_opts {
    int untuned;                      /* 1: DMA tuner off (one piece per copy, never held back) */
    sf_dma_contention_fn contention;  /* the link's contention index; NULL: never paced */
    void *contention_arg;
} sf_swap_opts;

/* Swap space of `gib` GiB for blocks of block_bytes. n_slots is 0 (swap off, nothing allocated)
 * when gib is 0, the backend cannot copy KV blocks, or gib holds no block. o may be NULL
 * (tuner on, no contention source). */
int sf_swap_init(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, sf_error *err);
int sf_swap_init_opts(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, const sf_swap_opts *o,
                      sf_error *err);
void sf_swap_free(sf_swap *w);
/* Run one planned copy: device blocks -> slots (SF_DMA_D2H, swap-out) or back (SF_DMA_H2D). */
int sf_swap_run(sf_swap *w, const sf_swap_op *op, int dir, sf_error *err);
/* May a sequence of this urgency be swapped in now (the DMA tuner's gate, see above)? */
int sf_swap_in_ok(sf_swap *w, int urgency);

#endif
