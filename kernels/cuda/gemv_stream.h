/* gemv_stream.h — C entry points of the persistent-warp GEMVs (gemv_stream.cu) beside those of
 * kernels.h. Called on the backend's launch thread. */
#ifndef SF_KERNELS_GEMV_STREAM_H
#define SF_KERNELS_GEMV_STREAM_H

#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y[m] = x[k] . W[m, k]^T (+ bias) for one row of x, rounded once to bf16 (as sf_k_gemv): the
 * persistent-warp kernel without a prologue or an epilogue, launched as a programmatic
 * dependent like the fused GEMVs beside it (a plain GEMV kernel among them would cost the
 * programmatic-launch overlap on both sides). Shapes it does not take (x over 64 KiB, misaligned
 * or k % 8 pointers, SEMFLOW_CUDA_GEMV_RING other than 3) run sf_k_gemv. x and y must not
 * overlap. Returns 0 or a cudaError_t. sf_k_gemv_stream_tune (kernels.h) takes this as kind 3. */
int sf_k_gemv_stream_plain(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                           cudaStream_t s);

#ifdef __cplusplus
}
#endif
#endif
