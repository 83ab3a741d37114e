/* allreduce.h — the one-shot all-reduce over peer memory (allreduce.cu), for hal/comm_custom.c.
 *
 * Every rank owns one region of device memory, mapped into every other rank's process (CUDA
 * IPC): a signal block (per-block flags written by the peers, per-block call counters) and two
 * message buffers used alternately. One launch, all ranks in the same order:
 *   1. each block copies its share of the local message into the own region's buffer;
 *   2. it raises its flag (this call's number, from its own counter) in every rank's region
 *      with a system-scope release store, and waits until every rank's same block raised it;
 *   3. it sums its share over the ranks' buffers in rank order (fp32) and writes the result
 *      over the local message — the same bits on every rank.
 * Call numbers live in device memory, so a CUDA graph replays the launch unchanged. The grid is
 * fixed (SF_AR_BLOCKS), so block b's counter counts every call and the buffer parity is the
 * same in every block; a rank that raised call k's flags has finished call k-1, so writing the
 * buffer of call k-2 is safe without a second barrier. A wait longer than timeout_ns gives up,
 * writes 1 + the missing rank into *err (mapped host memory) and leaves the message unsummed.
 *
 * The LL variant (ll = 1, messages up to ll_bytes; for decode sizes) takes one NVLink crossing
 * instead of a flag write then a remote read: each 8 bytes of the message travel as one 16-byte
 * line {4 bytes, flag, 4 bytes, flag}, written straight into every peer's LL buffer (slot of
 * the sending rank, parity of the call). 8-byte halves arrive whole, so a reader that sees both
 * flags equal to this call's number has the line, with no fence and no separate signal. The
 * grid is as large as the message needs (one line per thread, up to SF_AR_BLOCKS blocks), the
 * call numbers are per block as above, and the parity argument is the same (kernels on a
 * stream run one after the other). Region: signal block, the two one-shot buffers, then the LL
 * buffers [2 parities][size ranks][2 * ll_bytes]. */
#ifndef SF_KERNELS_ALLREDUCE_H
#define SF_KERNELS_ALLREDUCE_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SF_AR_MAX_RANKS 8
#define SF_AR_BLOCKS 64
#define SF_AR_THREADS 512
#define SF_AR_SIG_BYTES 16384 /* the signal block at the start of each region */
#define SF_ARN_BLOCKS 256      /* the fused all-reduce + RMSNorm kernel's fixed grid */
#define SF_ARN_THREADS 256
#define SF_ARN_MAX_COLS 16384  /* widest row it takes (8 vectors of 8 values per thread) */

typedef struct sf_k_ar {
    char *region[SF_AR_MAX_RANKS]; /* every rank's region as mapped in this process (own included) */
    uint16_t *data;                /* the local bf16 message, 16-byte aligned; summed in place */
    int64_t n;                     /* elements; n * 2 <= buf_bytes */
    size_t buf_bytes;              /* bytes of each of the two message buffers of a region */
    int rank, size;
    uint64_t timeout_ns;
    volatile unsigned *err;        /* device pointer of mapped host memory */
    int ll;                        /* 1: the LL variant (n * 2 <= ll_bytes) */
    size_t ll_off, ll_bytes;       /* the LL buffers' offset in a region; largest LL message */
    int pdl;                       /* LL: launched with programmatic dependent launch (common.cuh):
                                    * the kernel after it may start early and stream its weights */
} sf_k_ar;

/* The all-reduce fused with the residual add and the RMSNorm after it (push + flag, rows):
 *   x[rows, cols] = sum over ranks (res == NULL), or res[rows, cols] += that sum (rounded to
 *   bf16, x then unspecified); out = bf16(bf16(v * rsqrt(mean(v^2) + eps)) * w) of the summed
 *   stream v, as sf_k_rmsnorm rounds.
 * One launch of a fixed grid (SF_ARN_BLOCKS blocks: every block takes part in every call, so
 * every block's call counter is the call number): block b owns rows b, b + grid, ...; it
 * writes its rows of the local message with 16-byte stores straight into slot [this rank] of
 * every peer's push buffer of the call's parity (posted NVLink writes, once), raises its flag
 * at every peer (fence, system-scope release), waits for every peer's block b, then sums each
 * row in rank order from the own region (local reads) and norms it in the same block. A rank
 * that finished call k - 1 saw every peer start call k - 1, so a peer is done reading the
 * buffers of call k - 2 that call k overwrites. Push buffers: [2 parities][size][push_bytes]
 * at push_off. cols % 8 == 0, cols <= SF_ARN_MAX_COLS, rows * cols * 2 <= push_bytes, every
 * pointer 16-byte aligned.
 * pdl = 1: launched with programmatic dependent launch (common.cuh): the launch may start
 * while the projection before it ends; the kernel waits for it before anything else. */
typedef struct sf_k_arn {
    char *region[SF_AR_MAX_RANKS];
    uint16_t *x;                   /* [rows, cols] this rank's partial sums */
    uint16_t *res;                 /* NULL, or [rows, cols] the residual stream */
    const uint16_t *w;             /* [cols] the norm's weight */
    uint16_t *out;                 /* [rows, cols] */
    int64_t rows;
    int cols;
    float eps;
    size_t push_off, push_bytes;
    int rank, size;
    uint64_t timeout_ns;
    volatile unsigned *err;
    int pdl;                       /* launched with PDL (above) */
    int early;                     /* 1: the local loads overlap the counter's and the flags' waits
                                    * (allreduce.cu); the same results */
} sf_k_arn;

/* Bytes of one rank's region: one-shot buffers of buf_bytes each, LL buffers for messages of
 * up to ll_bytes from `size` ranks, then the fused kernel's push buffers (buf_bytes per rank
 * and parity). The LL buffers start at SF_AR_SIG_BYTES + 2 * buf_bytes, the push buffers at
 * sf_k_ar_push_off. */
size_t sf_k_ar_region_bytes(size_t buf_bytes, size_t ll_bytes, int size);
size_t sf_k_ar_push_off(size_t buf_bytes, size_t ll_bytes, int size);
/* Queues the one-shot all-reduce on s (see the top). Returns the launch's cudaError_t. */
int sf_k_allreduce(const sf_k_ar *a, cudaStream_t s);
/* Queues the fused all-reduce + residual add + RMSNorm (above); cudaErrorInvalidValue for
 * shapes or pointers it does not take. */
int sf_k_allreduce_norm(const sf_k_arn *a, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
