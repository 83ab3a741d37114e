/* comm.h — the communicator that joins the ranks of one tensor-parallel engine: rank, size,
 * all-reduce (sum) of an activation buffer, all-gather of logit slices, broadcast of a step
 * plan's bytes, barrier. Chosen per backend: comm_cpu.c (processes on one host over shared
 * memory, for the CPU backend) and comm_nccl.c (NCCL over the GPUs of one or several hosts).
 *
 * Contracts:
 *  - Collectives are called by every rank in the same order with the same sizes (the forward
 *    pass and the step plan guarantee it). Like the backend, a communicator is driven by one
 *    thread per process.
 *  - all_reduce_sum / all_gather take memory of the backend the communicator was opened for
 *    (host memory for "cpu", device memory for "cuda") and that backend's stream; they are
 *    ordered after the work already queued there. The sum is the same on every rank, bit for
 *    bit (ranks then hold identical residual streams).
 *  - broadcast / barrier move host bytes and return when done.
 *  - Every wait has a timeout (sf_comm.timeout_ms); a rank that exits or hangs makes the others'
 *    calls fail with a message naming the rank, never hang. A failed communicator stays failed:
 *    later calls return the first error at once.
 *  - Errors carry the rank and the failing call. */
#ifndef SF_COMM_H
#define SF_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "hal.h"

#define SF_COMM_MAX_RANKS 64

typedef struct sf_comm sf_comm;

struct sf_comm_ops {
    const char *name;
    /* data[n] = sum over ranks of data[n], in place. dt: SF_DT_F32 (cpu) or SF_DT_BF16 (cuda). */
    int (*all_reduce_sum)(sf_comm *c, void *data, int64_t n, sf_dtype dt, void *stream, sf_error *err);
    /* recv[size * bytes] = rank 0's send[bytes], then rank 1's, ... */
    int (*all_gather)(sf_comm *c, const void *send, void *recv, size_t bytes, void *stream, sf_error *err);
    /* Host bytes from root to every rank. idle != 0: a follower waiting for the next step, which
     * may take as long as the server is idle — no timeout, but a dead root still ends the wait. */
    int (*broadcast)(sf_comm *c, void *data, size_t bytes, int root, int idle, sf_error *err);
    int (*barrier)(sf_comm *c, sf_error *err);
    /* Mark the group failed so that peers waiting on this rank stop at once (why is shown to
     * them). Safe to call more than once. */
    void (*abort)(sf_comm *c, const char *why);
    void (*destroy)(sf_comm *c);
};

struct sf_comm {
    const struct sf_comm_ops *ops;
    void *ctx;
    int rank, size;
    int timeout_ms;      /* longest wait for a peer in any call (default 60000, $SEMFLOW_TP_TIMEOUT_MS) */
};

/* How this process joins the group. */
typedef struct sf_comm_opts {
    int rank, size;
    const char *backend;  /* backend name: "cpu" -> shared memory, "cuda" -> NCCL */
    /* cpu: the shared segment made by sf_comm_cpu_create (its fd, inherited across fork/exec) */
    int shm_fd;
    /* cuda: "host:port" where rank 0 listens to hand out the ncclUniqueId; device ordinal */
    const char *bootstrap;
    int device;
    int timeout_ms;       /* 0: default */
} sf_comm_opts;

/* Joins the group (blocks until every rank joined or the timeout passed). */
int sf_comm_open(const sf_comm_opts *o, sf_comm **out, sf_error *err);
void sf_comm_free(sf_comm *c); /* NULL is fine */
int sf_comm_default_timeout_ms(void);

/* CPU communicator. create: a shared segment for `size` ranks with `slot_bytes` of staging per
 * rank (larger messages go in pieces); *fd is inherited by children (no CLOEXEC). */
int sf_comm_cpu_create(int size, size_t slot_bytes, int *fd, sf_error *err);
int sf_comm_cpu_open(const sf_comm_opts *o, sf_comm **out, sf_error *err);
/* NCCL communicator (comm_nccl.c); SF_ENODEV when NCCL or CUDA is missing. */
int sf_comm_nccl_open(const sf_comm_opts *o, sf_comm **out, sf_error *err);

/* ---- on backend buffers (what the forward pass calls) ---------------------------------- */
/* x[0:rows, :] = sum over ranks. c == NULL or size 1: nothing to do. */
int sf_comm_all_reduce_buf(sf_comm *c, sf_backend *b, sf_buf *x, int rows, int64_t cols, sf_error *err);
/* recv[rank * rows .. , :] = each rank's send[0:rows, :] (both buffers cols wide). */
int sf_comm_all_gather_buf(sf_comm *c, sf_backend *b, sf_buf *send, sf_buf *recv, int rows, int64_t cols,
                           sf_error *err);

#endif
