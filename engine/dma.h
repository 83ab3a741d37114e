/* dma.h — the DMA scheduler: every host<->device copy of the engine goes through sf_dma_copy,
 * which cuts it into chunks sized by the request's urgency and paces low-urgency copies while
 * other processes contend for the PCIe link.
 *
 *   urgency high:   the smallest chunk whose measured bandwidth (hal's curve) reaches 80% of the
 *                   link's peak; 512 KiB without a curve
 *   urgency normal: the smallest chunk reaching 45% of peak; 128 KiB without a curve
 *   urgency low:    at most 64 KiB, so that higher-class chunks interleave on the copy engine;
 *                   while the contention index (other processes' DMA / link bandwidth) is at or
 *                   over pace_threshold, low-class copies are held to
 *                   max(pace_floor, 1 - contention) x the link bandwidth at their chunk size.
 *
 * Two ways to pace (opts.defer):
 *   0  the copying thread sleeps between low-class chunks (callers that may block);
 *   1  copies never sleep; each low-class copy made while contended books its bytes against the
 *      link share, and sf_dma_may_start says no to the next low-class copy until that booking
 *      has drained. The engine thread uses this: a sleep there would stall every class's step,
 *      so instead the scheduler keeps low-class swap-ins waiting (sf_sched_config.swap_in_ok).
 * With opts.untuned the scheduler is off: every copy is one piece, nothing is paced (the
 * baseline the contention experiment compares against).
 *
 * The copy itself is a callback (the backend's: cudaMemcpyAsync on its copy stream; memcpy on
 * the CPU backend). Threads: sf_dma_copy may be called from any thread; chunks of one call are
 * issued in order on the caller's thread; stats are updated under a lock. */
#ifndef SF_DMA_H
#define SF_DMA_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"
#include "../hal/hal.h"
#include "engine.h"

enum { SF_DMA_H2D = 0, SF_DMA_D2H = 1 };

/* Copy n bytes (one chunk). Returns SF_OK or an SF_E* code with err set. */
typedef int (*sf_dma_copy_fn)(void *arg, void *dst, const void *src, size_t n, int dir, sf_error *err);
/* The current PCIe contention index of the link (>= 0); e.g. sf_monitor_contention. */
typedef double (*sf_dma_contention_fn)(void *arg);

typedef struct sf_dma_opts {
    sf_dma_copy_fn copy;              /* required (used by sf_dma_copy) */
    void *copy_arg;
    const sf_hw_info *hw;             /* measured chunk curve (pinned); NULL or no GPU: defaults */
    sf_dma_contention_fn contention;  /* NULL: never paced */
    void *contention_arg;
    double pace_threshold;            /* <= 0: 0.5 */
    double pace_floor;                /* share of the link low copies keep when paced; <= 0: 0.05 */
    double link_gbs;                  /* > 0: overrides the curve's bandwidth for pacing (tests) */
    int defer;                        /* 1: never sleep, gate with sf_dma_may_start (see above) */
    int untuned;                      /* 1: one piece per copy, never paced */
} sf_dma_opts;

typedef struct sf_dma_stats {
    uint64_t bytes[SF_URGENCY_COUNT][2];  /* [urgency][dir] */
    uint64_t chunks[SF_URGENCY_COUNT];
    uint64_t paced_copies;                    /* low-class chunks delayed (sleep mode) */
    double paced_s;                           /* total time low-class copies waited (sleep mode) */
    uint64_t deferred;                        /* sf_dma_may_start answers "not yet" (defer mode) */
    uint64_t booked_bytes;                    /* low-class bytes booked against the link share */
} sf_dma_stats;

typedef struct sf_dma sf_dma;

int sf_dma_new(const sf_dma_opts *o, sf_dma **out, sf_error *err);
void sf_dma_free(sf_dma *d);

/* Chunk size used for urgency (SF_URGENCY_* of engine.h: 0 low, 1 normal, 2 high) and dir. */
size_t sf_dma_chunk(const sf_dma *d, int urgency, int dir);
/* Copies n bytes in chunks; low urgency may sleep (pacing). Stops at the first failing chunk. */
int sf_dma_copy(sf_dma *d, void *dst, const void *src, size_t n, int dir, int urgency, sf_error *err);
/* Copies n_units whole units of unit_bytes (e.g. KV blocks, which the backend copies by id) by
 * calling fn(arg, first, count) on consecutive runs: count units, as many as fit in the
 * urgency's chunk (at least one). Same pacing and stats as sf_dma_copy; stops at the first
 * failing run. */
typedef int (*sf_dma_unit_fn)(void *arg, int first, int count, sf_error *err);
int sf_dma_copy_units(sf_dma *d, int n_units, size_t unit_bytes, int dir, int urgency, sf_dma_unit_fn fn, void *arg,
                      sf_error *err);
void sf_dma_get_stats(sf_dma *d, sf_dma_stats *st);
/* Defer mode: may a copy of this urgency and direction start now? Always 1 for normal and high
 * urgency, when untuned, and while the contention index is under pace_threshold; for low
 * urgency under contention, 0 until the bytes booked by earlier low-class copies have drained
 * at max(pace_floor, 1 - contention) of the link. Counts each 0 in stats.deferred. */
int sf_dma_may_start(sf_dma *d, int urgency, int dir);
/* The contention index the pacing sees now (0 without a contention function); whether it is at
 * or over pace_threshold; whether the tuner is on (not untuned); count one held-back copy. */
double sf_dma_contention(sf_dma *d);
int sf_dma_contended(sf_dma *d);
int sf_dma_tuned(const sf_dma *d);
void sf_dma_count_deferred(sf_dma *d);

#endif
