/* nvml.c — dlopen'd NVML PCIe counters (see nvml.h). */
#include "bpf/nvml.h"

#include <dlfcn.h>
#include <stdlib.h>

typedef int nvml_ret;
typedef void *nvml_dev;
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

struct sf_nvml {
    void *lib;
    nvml_ret (*init)(void);
    nvml_ret (*shutdown)(void);
    nvml_ret (*handle)(unsigned idx, nvml_dev *dev);
    nvml_ret (*throughput)(nvml_dev dev, int counter, unsigned *kb_per_s);
    nvml_ret (*link_gen)(nvml_dev dev, unsigned *gen);
    nvml_ret (*link_width)(nvml_dev dev, unsigned *width);
    nvml_ret (*procs)(nvml_dev dev, unsigned *count, void *infos);
};

/* nvmlProcessInfo_t as the _v2/_v3 process queries fill it */
typedef struct nvml_proc {
    unsigned pid;
    unsigned long long used_mem;
    unsigned gpu_instance, compute_instance;
} nvml_proc;

sf_nvml *sf_nvml_open(void)
{
    sf_nvml *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    if (!(n->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL))) goto fail;
    *(void **)&n->init = dlsym(n->lib, "nvmlInit_v2");
    *(void **)&n->shutdown = dlsym(n->lib, "nvmlShutdown");
    *(void **)&n->handle = dlsym(n->lib, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&n->throughput = dlsym(n->lib, "nvmlDeviceGetPcieThroughput");
    *(void **)&n->link_gen = dlsym(n->lib, "nvmlDeviceGetCurrPcieLinkGeneration");
    *(void **)&n->link_width = dlsym(n->lib, "nvmlDeviceGetCurrPcieLinkWidth");
    *(void **)&n->procs = dlsym(n->lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!n->procs) *(void **)&n->procs = dlsym(n->lib, "nvmlDeviceGetComputeRunningProcesses_v2");
    if (!n->init || !n->shutdown || !n->handle || !n->throughput || n->init() != 0) goto fail;
    return n;
fail:
    if (n->lib) dlclose(n->lib);
    free(n);
    return NULL;
}

void sf_nvml_close(sf_nvml *n)
{
    if (!n) return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

int sf_nvml_pcie(sf_nvml *n, int idx, double *rx_per_s, double *tx_per_s, int *gen, int *width)
{
    nvml_dev dev;
    unsigned rx = 0, tx = 0, g = 0, w = 0;
    if (!n || n->handle((unsigned)idx, &dev) != 0) return -1;
    if (n->throughput(dev, NVML_PCIE_UTIL_RX_BYTES, &rx) != 0) return -1;
    if (n->throughput(dev, NVML_PCIE_UTIL_TX_BYTES, &tx) != 0) return -1;
    if (n->link_gen) n->link_gen(dev, &g);
    if (n->link_width) n->link_width(dev, &w);
    *rx_per_s = rx * 1024.0; /* NVML reports KB/s */
    *tx_per_s = tx * 1024.0;
    *gen = (int)g;
    *width = (int)w;
    return 0;
}

int sf_nvml_pids(sf_nvml *n, int idx, unsigned *pids, int cap)
{
    nvml_dev dev;
    nvml_proc info[64];
    unsigned count = 64;
    if (!n || !n->procs || n->handle((unsigned)idx, &dev) != 0) return -1;
    if (n->procs(dev, &count, info) != 0) return -1; /* more than 64 contexts: NVML says so, skip */
    int k = 0;
    for (unsigned i = 0; i < count && i < 64 && k < cap; i++)
        if (info[i].pid) pids[k++] = info[i].pid;
    return k;
}
