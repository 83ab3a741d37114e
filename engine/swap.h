/* swap.h — the engine's swap space: host memory holding the K/V of sequences preempted by swap,
 * one slot per KV block, and the copies the scheduler plans (sf_swap_op) run through the DMA
 * scheduler (dma.h), chunked by the sequence's urgency, with the backend's kv_copy_out/in.
 *
 * The memory comes from sf_backend_host_alloc: page-locked on CUDA (real DMA at link speed),
 * aligned host memory on the CPU backend. It is taken whole at init (pinned memory cannot be
 * lazily mapped), so --swap-space is host RAM held for the server's life. When pinning fails
 * (a locked-memory limit) it falls back to plain memory with a warning.
 *
 * Copies use the backend's batched kv_copy_blocks (one call per piece, one pitched copy per block
 * on CUDA) when it has one, else kv_copy_out/in per run of consecutive slots.
 *
 * DMA tuning (sf_swap_opts): with the tuner on, each class gets its chunk size, and while the
 * PCIe link is contended (index >= the DMA scheduler's pace_threshold) sf_swap_in_ok (the
 * scheduler's swap_in_ok gate) holds low-class swap-ins back:
 *   - while sequences of a higher class run or wait: a swap-in runs inside the engine step, so
 *     on a contended link it would stretch the step that carries their tokens; held at most
 *     SF_SWAP_MAX_HOLD_S at a time, so low-class work is delayed, never starved;
 *   - otherwise until the bytes earlier low-class copies booked against the link share left to
 *     them have drained (dma.h, defer mode), so other tenants keep most of the link.
 * With the tuner off every copy is one piece and nothing is held back.
 *
 * Tensor parallelism: each rank holds its share of every block (its kv heads), so each keeps a
 * swap space of its own with the same slots; every piece rank 0 copies is first sent to the
 * other ranks (sf_swap_opts.peers, engine/tp.c's sf_tp_kv_copy), which copy their shares between
 * the same blocks and slots in the order of their step plans.
 * Engine thread only. */
#ifndef SF_SWAP_H
#define SF_SWAP_H

#include <stddef.h>

#include "../common/sf.h"
#include "../hal/hal.h"
#include "dma.h"
#include "scheduler.h"

#define SF_SWAP_MAX_HOLD_S 1.0

/* The other ranks' share of a piece: blocks[i] <-> slot slots[i], n of them, d2h: out. */
typedef int (*sf_swap_peers_fn)(void *arg, const int32_t *blocks, const int32_t *slots, int n, int d2h,
                                sf_error *err);

typedef struct sf_swap {
    sf_backend *be;           /* not owned */
    sf_dma *dma;              /* owned */
    unsigned char *mem;       /* n_slots x block_bytes, from sf_backend_host_alloc */
    size_t block_bytes, bytes;
    int n_slots;
    double held_since;        /* a low-class swap-in has been held back since (0: none held) */
    int pinned;               /* mem is the backend's (pinned); 0: plain memory (the fallback) */
    int batched_off;          /* the backend's kv_copy_blocks failed once: per-block copies only */
    sf_swap_peers_fn peers;   /* tensor parallelism: the other ranks copy each piece too */
    void *peers_arg;
} sf_swap;

typedef struct sf_swap_opts {
    int untuned;                      /* 1: DMA tuner off (one piece per copy, never held back) */
    sf_dma_contention_fn contention;  /* the link's contention index; NULL: never paced */
    void *contention_arg;
    sf_swap_peers_fn peers;           /* NULL: one rank */
    void *peers_arg;
} sf_swap_opts;

/* Swap space of `gib` GiB for blocks of block_bytes. n_slots is 0 (swap off, nothing allocated)
 * when gib is 0, the backend cannot copy KV blocks, or gib holds no block. o may be NULL
 * (tuner on, no contention source). */
int sf_swap_init(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, sf_error *err);
int sf_swap_init_opts(sf_swap *w, sf_backend *be, size_t block_bytes, double gib, const sf_swap_opts *o,
                      sf_error *err);
/* Swap space of exactly n_slots slots and no DMA scheduler: a tensor-parallel follower's,
 * whose copies come from rank 0's plan (engine/tp.c). Copy with sf_swap_copy_blocks. */
int sf_swap_init_slots(sf_swap *w, sf_backend *be, size_t block_bytes, int n_slots, sf_error *err);
void sf_swap_free(sf_swap *w);
/* Run one planned copy: device blocks -> slots (SF_DMA_D2H, swap-out) or back (SF_DMA_H2D). */
int sf_swap_run(sf_swap *w, const sf_swap_op *op, int dir, sf_error *err);
/* Copies n KV blocks of be to or from (d2h) their slots in mem (block_bytes a slot): one
 * kv_copy_blocks call when the backend has it and *batched_off is 0 (set when it fails on the
 * device: the per-block copies then, the same bytes to the same places; arguments it refuses,
 * SF_EINVAL, are an error here), else kv_copy_out/in per run of consecutive slots. The slots
 * are the caller's to check against its swap space. */
int sf_swap_copy_blocks(sf_backend *be, unsigned char *mem, size_t block_bytes, const int32_t *blocks,
                        const int32_t *slots, int n, int d2h, int *batched_off, sf_error *err);
/* May a sequence of this urgency be swapped in now (the DMA tuner's gate, see above)?
 * higher_busy: sequences of a higher class are running or waiting. */
int sf_swap_in_ok(sf_swap *w, int urgency, int higher_busy);

#endif
