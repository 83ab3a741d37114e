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
    /* Local copy of `height` rows of `width` bytes, rows `spitch` apart at src to rows `dpitch`
     * apart at dst (memory of the communicator's backend, queued on its stream). Used to lay
     * gathered logit slices out as whole rows. May be NULL: no such layout on this rank. */
    int (*copy_2d)(sf_comm *c, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                   size_t height, void *stream, sf_error *err);
    /* The all-reduce fused with the residual add and the RMSNorm after it (hal.h sf_coll_norm),
     * queued on stream. Called only for messages sf_comm_takes_norm accepts. May be NULL: no
     * fused kernel (sf_comm_all_reduce_norm_buf runs the all-reduce and the backend's rmsnorm). */
    int (*all_reduce_norm)(sf_comm *c, const sf_coll_norm *a, void *stream, sf_error *err);
    /* Waits until everything queued on stream has completed, watching the peers as the
     * collectives' own waits do (a dead or hung rank fails it with the rank named). May be NULL:
     * collectives complete before they return (cpu). */
    int (*wait)(sf_comm *c, void *stream, const char *what, sf_error *err);
    /* mark queues a marker on stream after the work queued there (at most SF_COMM_MARKS not yet
     * waited for); wait_mark waits, watching the peers as wait does, until the oldest marker's
     * work has completed, and forgets it. Both NULL where collectives complete before they
     * return (cpu). */
    int (*mark)(sf_comm *c, void *stream, sf_error *err);
    int (*wait_mark)(sf_comm *c, const char *what, sf_error *err);
};

/* Which all-reduce path a communicator with more than one takes (comm_nccl.c: NCCL, or the
 * peer-memory kernels of comm_custom.c for messages up to the measured crossover: the LL
 * variant up to its own measured crossover, the one-shot kernel above). CUSTOM forces the own
 * path (LL where measured faster), ONESHOT and LL force one kernel (up to its cap). */
typedef enum sf_comm_path {
    SF_COMM_PATH_AUTO = 0,
    SF_COMM_PATH_NCCL = 1,
    SF_COMM_PATH_CUSTOM = 2,
    SF_COMM_PATH_ONESHOT = 3,
    SF_COMM_PATH_LL = 4
} sf_comm_path;

struct sf_comm {
    const struct sf_comm_ops *ops;
    void *ctx;
    int rank, size;
    int timeout_ms;      /* longest wait for a peer in any call (default 60000, $SEMFLOW_TP_TIMEOUT_MS) */
    /* All-reduce path: AUTO picks by message size; NCCL or CUSTOM force one (benchmarks). Every
     * rank must hold the same value. CUSTOM falls back to NCCL where the custom path cannot
     * take the message (too large, peer memory unavailable). */
    sf_comm_path path;
    /* Largest message (bytes) the custom path takes under AUTO; 0: never (set at open). */
    size_t custom_max_bytes;
    /* Largest message (bytes) the custom path can take at all; 0: no custom path. */
    size_t custom_cap_bytes;
    /* The same for the LL variant of the custom path: up to ll_max_bytes it takes the messages
     * of the custom path (set at open from a measurement); it can take up to ll_cap_bytes. */
    size_t ll_max_bytes, ll_cap_bytes;
    /* 1 ($SEMFLOW_TP_NCCL_GRAPH=1): base-path collectives (NCCL) are queued as backend ops too,
     * inside the step's graph. 0 (default): the graph ends at them and they run eagerly. The
     * own path's kernel is always inside. NCCL's destroy and abort wait for every graph that
     * captured its calls to be destroyed: backends' graphs_release comes first (engine/tp.c). */
    int base_in_graph;
    /* The fused all-reduce + RMSNorm (all_reduce_norm): largest message in bytes (0: off, set at
     * open; $SEMFLOW_TP_ARNORM=0 keeps it off), widest row, fewest rows it takes. */
    size_t norm_max_bytes;
    int norm_max_cols, norm_min_rows;
    /* 1: the fused kernel is launched with programmatic dependent launch ($SEMFLOW_TP_ARNORM_PDL,
     * default 0); norm_early 1: it overlaps its local loads with its waits
     * ($SEMFLOW_TP_ARNORM_EARLY, default 0). Either way the same results; the same on every rank. */
    int norm_pdl, norm_early;
    /* The message of the last collective that failed inside a backend op (sf_coll_fn). */
    sf_error coll_err;
    /* 1: all_gather returns once the gather is queued instead of waiting for it; the caller
     * then waits with sf_comm_wait before it reads anything the stream produced (rank 0 of an
     * overlapped engine step, engine/forward.c). 0 (default): all_gather waits. */
    int gather_nowait;
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
/* The all-reduce and the RMSNorm after it: x[0:rows, :] summed over ranks; with res (the
 * residual stream), res += that sum (x is then scratch); out = rmsnorm(res or x) * w. One
 * kernel where the communicator and the backend have it and sf_comm_takes_norm accepts the
 * message, else sf_comm_all_reduce_buf then the backend's rmsnorm (the same values, up to the
 * order of the norm's fp32 sum). c == NULL or size 1: the rmsnorm alone. Buffers cols wide. */
int sf_comm_all_reduce_norm_buf(sf_comm *c, sf_backend *b, sf_buf *x, sf_buf *res, const sf_weight *w, float eps,
                                int rows, int64_t cols, sf_buf *out, sf_error *err);
/* Whether such a call of rows x cols takes the fused kernel: a function of the communicator's
 * settings and the backend only, so every rank decides the same way. */
int sf_comm_takes_norm(const sf_comm *c, const sf_backend *b, int rows, int64_t cols);
/* recv[rank * rows .. , :] = each rank's send[0:rows, :] (both buffers cols wide). */
int sf_comm_all_gather_buf(sf_comm *c, sf_backend *b, sf_buf *send, sf_buf *recv, int rows, int64_t cols,
                           sf_error *err);
/* The vocabulary-parallel logits as whole rows on rank `root`: out[i, r * cols + j] = rank r's
 * send[i, j] for i < rows (out is size * cols wide). Every rank calls it (one all-gather, the
 * same bytes as sf_comm_all_gather_buf); tmp [size * rows, cols] is the gather's landing
 * buffer, and only root rearranges it into out (one row needs no rearranging: the gather lands
 * in out directly). Returns when the gather is done on this rank (the rearrangement may still
 * be queued on root's stream, before anything queued after it). SF_EUNSUPPORTED when the
 * communicator has no copy_2d. */
int sf_comm_gather_rows_buf(sf_comm *c, sf_backend *b, sf_buf *send, sf_buf *tmp, sf_buf *out, int rows,
                            int64_t cols, int root, sf_error *err);

/* $SEMFLOW_TP_SKIP_ALLREDUCE_WRONG_RESULTS=1: sf_comm_all_reduce_buf returns without summing
 * (and sf_comm_all_reduce_norm_buf runs only the norm). For timing what the all-reduces cost
 * inside a step; every result is wrong. The same on every rank (one environment). */
int sf_comm_skip_all_reduce(void);

/* Waits (watching the peers) until the work queued on the stream of b (the one x's ops run
 * on) has completed; SF_OK at once for a communicator whose collectives complete before
 * returning. what: for messages ("the step's logits gather"). */
int sf_comm_wait(sf_comm *c, sf_backend *b, sf_buf *x, const char *what, sf_error *err);
/* The same wait split in two, so that later work can be queued in between: sf_comm_mark notes
 * what is queued on b's stream now; sf_comm_wait_mark waits for the oldest such note (marks are
 * waited for in the order they were made; at most SF_COMM_MARKS at once, SF_EINVAL beyond).
 * Both SF_OK at once for a communicator whose collectives complete before returning. */
#define SF_COMM_MARKS 4
int sf_comm_mark(sf_comm *c, sf_backend *b, sf_buf *x, sf_error *err);
int sf_comm_wait_mark(sf_comm *c, const char *what, sf_error *err);

/* Whether an all-reduce of n values of dt takes the own (custom) path: a function of the
 * communicator's path, cap and crossover only, so every rank decides the same way. */
int sf_comm_takes_custom(const sf_comm *c, int64_t n, sf_dtype dt);
/* Of those, whether it takes the LL variant (same contract). */
int sf_comm_takes_ll(const sf_comm *c, int64_t n, sf_dtype dt);

/* ---- the all-reduce crossover (pure logic, comm.c) ------------------------------------- */
/* Given n message sizes in increasing order and the measured µs of NCCL and of the custom
 * path at each, the largest size up to which the custom path wins at every size (by at least
 * `margin`, e.g. 0.05 = 5%); 0 when it does not win at the smallest. Sizes where a path has no
 * measurement (<= 0) end the run. */
size_t sf_comm_pick_crossover(const size_t *bytes, const double *nccl_us, const double *own_us, int n, double margin);
/* Cache of a measured crossover, hal-style: $XDG_CACHE_HOME/semflow/allreduce-<key>.json (or
 * ~/.cache/semflow/). key: what the figure depends on (ranks, GPUs' bus ids, NCCL version;
 * file-name safe characters are kept, the rest become '_'). load: 0 and *crossover filled
 * when a cache for key exists; save: best effort (a warning when it cannot write). */
int sf_comm_crossover_load(const char *key, size_t *crossover);
void sf_comm_crossover_save(const char *key, size_t crossover, const size_t *bytes, const double *nccl_us,
                            const double *own_us, int n);

#endif
