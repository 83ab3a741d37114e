/* b1trace.h — the batch-1 kernel timeline (b1trace.cuh says what it records), C side.
 * SEMFLOW_CUDA_TRACE=FILE turns it on for a CUDA backend: sf_k_trace_open at creation,
 * sf_k_trace_close when it is destroyed writes the newest records to FILE (one line per block:
 * tag m k grid block sm t0 d_wait d_ready d_end; ns). For measurements only: tracing adds a block
 * barrier and an atomic per block. Called on the backend's thread. */
#ifndef SF_KERNELS_B1TRACE_H
#define SF_KERNELS_B1TRACE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sf_k_trace sf_k_trace;

/* *out = NULL (and 0) when SEMFLOW_CUDA_TRACE is unset; else a ring of $SEMFLOW_CUDA_TRACE_RECORDS
 * (default 131072) records on the current device. Returns 0 or a cudaError_t. */
int sf_k_trace_open(sf_k_trace **out);
/* Writes the newest records (after a device synchronisation) and frees everything; NULL: no-op.
 * Returns 0, a cudaError_t, or -1 when the file cannot be written (logged). */
int sf_k_trace_close(sf_k_trace *t);

#ifdef __cplusplus
}
#endif
#endif
