/* hal_cuda_impl.h — internals shared by the CUDA backend's files (hal_cuda.c, hal_cuda_probe.c,
 * nvml.c). Not part of the hal interface. */
#ifndef SF_HAL_CUDA_IMPL_H
#define SF_HAL_CUDA_IMPL_H

#include "hal.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

/* Check a CUDA runtime call; on failure fill err with the call's text, file and line, set rc
 * and jump to cleanup. Out of memory becomes SF_ENOMEM, anything else SF_ERROR. */
#define SF_CUDA_GOTO(call, err, rc)                                                              \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess) {                                                                 \
            (rc) = sf_err((err), e_ == cudaErrorMemoryAllocation ? SF_ENOMEM : SF_ERROR,         \
                          "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            goto cleanup;                                                                        \
        }                                                                                        \
    } while (0)

#include "../kernels/cuda/kernels.h"
#include "../kernels/cuda/allreduce.h"

/* ---- recorded ops and CUDA graphs (hal_cuda_graph.c) ------------------------------------- */
/* One launch of a step, with everything that determines it: ops are built as records so a
 * step can be captured into a CUDA graph and later steps checked against the capture. Records
 * are zeroed before they are filled, so they compare with memcmp. */
enum { SF_OP_EMBED = 1, SF_OP_RMSNORM, SF_OP_GEMM, SF_OP_ROPE_KV, SF_OP_ATTN, SF_OP_SILU, SF_OP_ROWS, SF_OP_COLL,
       SF_OP_GEMV_NORM, SF_OP_GEMV_ADD, SF_OP_ADD, SF_OP_ATTN_DEC, SF_OP_GEMV_ROPE, SF_OP_GEMM_ACC,
       SF_OP_COLL_NORM, SF_OP_GEMV_PLAIN, SF_OP_BEST_PUT, SF_OP_QGEMV, SF_OP_QDEQ };
typedef struct sf_op_rec {
    int kind;
    const void *p[8];
    int64_t n[16];
    float f;
    sf_k_kv kv;
    sf_k_attn attn;
    sf_coll_fn coll; /* SF_OP_COLL: the communicator's collective, called with coll_arg, p[0], n[0] */
    void *coll_arg;
    /* SF_OP_COLL_NORM: called with coll_arg and {x p[0], res p[1], out p[3], w p[2], rows n[0],
     * cols n[1], eps f} */
    sf_coll_norm_fn coll_norm;
} sf_op_rec;

/* What sf_cuda_op_exec returns when a collective (SF_OP_COLL) failed: the communicator holds
 * the message. */
#define SF_K_COLL_FAILED 20000

int sf_cuda_op_exec(sf_k_gemm_ctx *g, cudaStream_t s, const sf_op_rec *r);

#define SF_GRAPH_SLOTS 64
#define SF_GRAPH_KEY 6
typedef struct sf_graph_slot {
    int64_t key[SF_GRAPH_KEY];
    int seen, failures;
    cudaGraphExec_t exec;
    sf_op_rec *trace;
    int n_trace, cap_trace;
    uint64_t last_use;
} sf_graph_slot;

/* Step graphs: a step whose key (batch shape) was seen before is captured; once captured, its
 * ops are only compared with the recorded ones and the graph is launched at the step's end.
 * Any difference (or anything that cannot be captured) falls back to running the step's ops
 * directly, in order, so results never depend on whether a graph ran. Engine thread only. */
typedef struct sf_cuda_graphs {
    int enabled, max_tokens;
    sf_graph_slot slots[SF_GRAPH_SLOTS];
    int mode; /* 0 direct, 1 capturing, 2 replaying */
    sf_graph_slot *cur;
    int pos;
    uint64_t tick;
    long n_captured, n_replayed, n_fallbacks;
} sf_cuda_graphs;

void sf_cuda_graphs_init(sf_cuda_graphs *G, int enabled, int max_tokens);
void sf_cuda_graphs_free(sf_cuda_graphs *G);
/* Destroys every recorded graph, keeping the settings and counters (backend graphs_release).
 * A capture in progress is abandoned without running its ops; graphs still executing finish
 * on their own (CUDA defers their release). */
void sf_cuda_graphs_drop(sf_cuda_graphs *G, cudaStream_t s);
/* Called at the end of batch_begin with the step's key; key[0] is the token count. */
void sf_cuda_graph_begin(sf_cuda_graphs *G, cudaStream_t s, const int64_t key[SF_GRAPH_KEY]);
/* Runs (direct), records (capture) or checks (replay) one op. `capturable`: 0 when running it
 * would synchronise or allocate (then a capture is abandoned first). */
int sf_cuda_graph_submit(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s, const sf_op_rec *r, int capturable);
/* Ends the step's capture or replay (launching the graph); before anything reads results,
 * frees memory or synchronises. Returns the cudaError_t of the launch path (0 ok). */
int sf_cuda_graph_end(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s);
/* Abandons a capture or replay in progress, running the step's ops so far directly. */
int sf_cuda_graph_bail(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s);
#endif

/* $XDG_CACHE_HOME/semflow/<prefix>-<pci bus id>.json (or under ~/.cache), creating the folder:
 * where hal's calibration ("hal-cuda") and the GEMM tuner ("gemm-cuda") keep what they measured
 * on one GPU. Returns 0, or -1 when there is no cache folder. (hal_cuda_probe.c) */
int sf_hal_cuda_cache_path(const char *bus_id, const char *prefix, char *out, size_t n);

/* PCIe link of the GPU with PCI bus id `bus_id` (as cudaDeviceGetPCIBusId writes it), read
 * through NVML loaded with dlopen. Fills 0 when NVML is missing; returns SF_OK or SF_ENODEV
 * with a message saying why. */
int sf_nvml_pcie_link(const char *bus_id, int *gen, int *width, int *max_gen, int *max_width, sf_error *err);

#endif
