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
#endif

/* PCIe link of the GPU with PCI bus id `bus_id` (as cudaDeviceGetPCIBusId writes it), read
 * through NVML loaded with dlopen. Fills 0 when NVML is missing; returns SF_OK or SF_ENODEV
 * with a message saying why. */
int sf_nvml_pcie_link(const char *bus_id, int *gen, int *width, int *max_gen, int *max_width, sf_error *err);

#endif
