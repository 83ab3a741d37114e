/* nvml.c — the few NVML calls the hal uses, through dlopen("libnvidia-ml.so.1"): the driver
 * ships the library but no header, so the functions used are declared here. Loaded on first use,
 * never unloaded. */
#include <dlfcn.h>
#include <string.h>

#include "hal_cuda_impl.h"

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef int nvmlReturn_t; /* NVML_SUCCESS = 0 */

static struct {
    int tried, ok;
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    nvmlReturn_t (*by_bus_id)(const char *bus_id, nvmlDevice_t *dev);
    nvmlReturn_t (*curr_gen)(nvmlDevice_t dev, unsigned *gen);
    nvmlReturn_t (*curr_width)(nvmlDevice_t dev, unsigned *width);
    nvmlReturn_t (*max_gen)(nvmlDevice_t dev, unsigned *gen);
    nvmlReturn_t (*max_width)(nvmlDevice_t dev, unsigned *width);
    const char *(*error_string)(nvmlReturn_t r);
    char why[256];
} nv;

static void nvml_load(void)
{
    nv.tried = 1;
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(nv.why, sizeof nv.why, "dlopen(libnvidia-ml.so.1): %s (the NVIDIA driver's NVML library)", dlerror());
        return;
    }
#define SYM(field, name)                                                                        \
    do {                                                                                        \
        *(void **)&nv.field = dlsym(h, name);                                                   \
        if (!nv.field) { snprintf(nv.why, sizeof nv.why, "libnvidia-ml.so.1 lacks %s (driver too old?)", name); return; } \
    } while (0)
    SYM(init, "nvmlInit_v2");
    SYM(shutdown, "nvmlShutdown");
    SYM(by_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    SYM(curr_gen, "nvmlDeviceGetCurrPcieLinkGeneration");
    SYM(curr_width, "nvmlDeviceGetCurrPcieLinkWidth");
    SYM(max_gen, "nvmlDeviceGetMaxPcieLinkGeneration");
    SYM(max_width, "nvmlDeviceGetMaxPcieLinkWidth");
    SYM(error_string, "nvmlErrorString");
#undef SYM
    nv.ok = 1;
}

int sf_nvml_pcie_link(const char *bus_id, int *gen, int *width, int *max_gen, int *max_width, sf_error *err)
{
    *gen = *width = *max_gen = *max_width = 0;
    if (!nv.tried) nvml_load();
    if (!nv.ok) return sf_err(err, SF_ENODEV, "NVML unavailable: %s", nv.why);
    nvmlReturn_t r = nv.init();
    if (r) return sf_err(err, SF_ENODEV, "nvmlInit: %s", nv.error_string(r));
    nvmlDevice_t dev;
    int rc = SF_OK;
    unsigned v;
    r = nv.by_bus_id(bus_id, &dev);
    if (r) {
        rc = sf_err(err, SF_ENODEV, "nvmlDeviceGetHandleByPciBusId(%s): %s", bus_id, nv.error_string(r));
        goto cleanup;
    }
    if (!nv.curr_gen(dev, &v)) *gen = (int)v;
    if (!nv.curr_width(dev, &v)) *width = (int)v;
    if (!nv.max_gen(dev, &v)) *max_gen = (int)v;
    if (!nv.max_width(dev, &v)) *max_width = (int)v;
cleanup:
    nv.shutdown();
    return rc;
}
