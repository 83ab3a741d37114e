/* nvml.h — the few NVML calls the monitor uses to cross-check its PCIe numbers, loaded with
 * dlopen (libnvidia-ml.so.1 has no header on the GPU hosts). Called from the monitor thread only. */
#ifndef SF_NVML_H
#define SF_NVML_H

typedef struct sf_nvml sf_nvml;

/* NULL when NVML is absent or fails to initialise (no GPU): callers then skip the cross-check. */
sf_nvml *sf_nvml_open(void);
void sf_nvml_close(sf_nvml *n);
/* PCIe throughput of GPU idx over NVML's 20 ms sample, bytes/s (rx = into the GPU), and the
 * current link generation and width. 0 on success. Blocks ~20 ms per direction. */
int sf_nvml_pcie(sf_nvml *n, int idx, double *rx_per_s, double *tx_per_s, int *gen, int *width);

/* Pids with a compute context on GPU idx (NVML's running compute processes), at most cap.
 * Returns how many were written, or -1 when NVML cannot say (old driver, no such GPU). */
int sf_nvml_pids(sf_nvml *n, int idx, unsigned *pids, int cap);

#endif
