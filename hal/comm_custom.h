/* comm_custom.h — the all-reduce over peer memory (one-shot, LL, fused with RMSNorm), for the NCCL communicator
 * (comm_nccl.c). Internal to hal/. See kernels/cuda/allreduce.h for the protocol.
 *
 * Setup is collective: every rank calls sf_ar_custom_open in the same order with the same
 * arguments but its own rank, and the ranks' records (host name, GPU bus id, CUDA IPC handle
 * of its region, whether it could make one) travel through `exchange` (an all-gather of host
 * bytes the caller provides). Every rank reaches the same answer: all ranks open all peers'
 * regions, or none keeps the path (SF_EUNSUPPORTED with the reason: different hosts, no peer
 * access between two GPUs, IPC refused). Engine thread only. */
#ifndef SF_COMM_CUSTOM_H
#define SF_COMM_CUSTOM_H

#include <stddef.h>
#include <stdint.h>

#include "hal.h"

typedef struct sf_ar_custom sf_ar_custom;

/* all[size * bytes] = every rank's mine[bytes], in rank order. */
typedef int (*sf_ar_exchange_fn)(void *ctx, const void *mine, size_t bytes, void *all, sf_error *err);

int sf_ar_custom_open(int rank, int size, int device, size_t buf_bytes, int timeout_ms, sf_ar_exchange_fn exchange,
                      void *ctx, sf_ar_custom **out, sf_error *err);
void sf_ar_custom_free(sf_ar_custom *a); /* NULL is fine */
/* Largest message in bytes; of the LL variant (kernels/cuda/allreduce.h). */
size_t sf_ar_custom_cap(const sf_ar_custom *a);
size_t sf_ar_custom_ll_cap(const sf_ar_custom *a);
#define SF_AR_LL_BYTES ((size_t)512 << 10) /* the LL variant's largest message */
/* Every rank's GPU bus id joined by '-' (for the crossover cache key). */
const char *sf_ar_custom_gpus(const sf_ar_custom *a);
/* The kernels (kernels/cuda/allreduce.h). */
typedef enum sf_ar_kernel { SF_AR_ONESHOT = 0, SF_AR_LL = 1 } sf_ar_kernel;
/* Queues the all-reduce of n bf16 values at data (16-byte aligned, n * 2 <= cap, or <= the LL
 * cap for SF_AR_LL) on stream with that kernel. Every rank must pass the same kernel for a
 * call. Returns SF_OK or an error with the rank in the message. */
int sf_ar_custom_run(sf_ar_custom *a, void *data, int64_t n, sf_ar_kernel kernel, void *stream, sf_error *err);
/* Queues the all-reduce fused with the residual add and RMSNorm (kernels/cuda/allreduce.h
 * sf_k_arn) of a: rows * cols * 2 <= cap, cols a multiple of 8 up to SF_AR_NORM_MAX_COLS,
 * pointers 16-byte aligned. flags: SF_AR_NORM_PDL launches it with programmatic dependent launch
 * (the launch may begin while the kernel before it ends); SF_AR_NORM_EARLY overlaps its local
 * loads with its waits (the same results). */
int sf_ar_custom_run_norm(sf_ar_custom *a, const sf_coll_norm *n, unsigned flags, void *stream, sf_error *err);
enum { SF_AR_NORM_PDL = 1, SF_AR_NORM_EARLY = 2 };
#define SF_AR_NORM_MAX_COLS 16384 /* SF_ARN_MAX_COLS */
/* 0, or 1 + the rank a kernel gave up waiting for (its timeout passed). */
int sf_ar_custom_failed(const sf_ar_custom *a);

#endif
