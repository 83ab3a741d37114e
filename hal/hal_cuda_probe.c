/* hal_cuda_probe.c — what the GPU is and what it measurably does: properties from the runtime,
 * HBM copy bandwidth, PCIe copy bandwidth by chunk size (pinned and pageable, each way), the
 * bf16 GEMM rate through cuBLASLt, and the PCIe link from NVML. Calibration takes about a second
 * and is cached in $XDG_CACHE_HOME/semflow/hal-cuda-<pci bus id>.json (keyed by GPU name and
 * driver version); force = 1 measures again. Called from the engine thread or the CLI. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hal_cuda_impl.h"

#ifndef SF_HAVE_CUDA

int sf_hal_cuda_available(void) { return 0; }

int sf_hal_cuda_probe(int device, sf_hw_info *hw, int force, sf_error *err)
{
    return sf_err(err, SF_ENODEV, "CUDA backend: built without CUDA (no nvcc/cuBLASLt at build time); "
                                  "rebuild on a machine with the CUDA toolkit, or use --backend cpu");
}

#else

#include <jansson.h>

#include "../kernels/cuda/kernels.h"

/* The CUDA runtime loads every kernel with the context (CUDA_MODULE_LOADING=EAGER) rather than
 * each on its first launch, unless the environment already says which: a decode step's kernels
 * then run faster, by ~0.5% of a batch-1 step of Llama-3-8B (docs/PERFORMANCE.md, session 23;
 * not explained further). The driver reads the variable when the process's first CUDA call
 * initialises it, so both entry points below set it before theirs. */
static void cuda_loading_default(void)
{
    setenv("CUDA_MODULE_LOADING", "EAGER", 0); /* 0: a value already set stays */
}

int sf_hal_cuda_available(void)
{
    int n = 0;
    cuda_loading_default();
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

/* ---- cache ------------------------------------------------------------------------------ */
int sf_hal_cuda_cache_path(const char *bus_id, const char *prefix, char *out, size_t n)
{
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[768];
    if (x && *x) snprintf(dir, sizeof dir, "%s/semflow", x);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/semflow", home);
    else return -1;
    char parent[768];
    snprintf(parent, sizeof parent, "%.*s", (int)(strrchr(dir, '/') - dir), dir);
    mkdir(parent, 0755);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return -1;
    char id[64];
    snprintf(id, sizeof id, "%s", bus_id);
    for (char *p = id; *p; p++)
        if (*p == ':' || *p == '.') *p = '_';
    snprintf(out, n, "%s/%s-%s.json", dir, prefix, id);
    return 0;
}

static json_t *dbl_array(const double *v, int n)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

static void cache_save(const char *path, const sf_hw_info *hw, int driver)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(hw->name));
    json_object_set_new(o, "driver", json_integer(driver));
    json_object_set_new(o, "mem_bw_gbs", json_real(hw->mem_bw_gbs));
    json_object_set_new(o, "gemm_tflops", json_real(hw->gemm_tflops));
    json_object_set_new(o, "gemm_tflops_sustained", json_real(hw->gemm_tflops_sustained));
    json_object_set_new(o, "h2d_pinned_gbs", dbl_array(hw->h2d_pinned_gbs, SF_HAL_CHUNKS));
    json_object_set_new(o, "d2h_pinned_gbs", dbl_array(hw->d2h_pinned_gbs, SF_HAL_CHUNKS));
    json_object_set_new(o, "h2d_pageable_gbs", dbl_array(hw->h2d_pageable_gbs, SF_HAL_CHUNKS));
    json_object_set_new(o, "d2h_pageable_gbs", dbl_array(hw->d2h_pageable_gbs, SF_HAL_CHUNKS));
    json_object_set_new(o, "calib_seconds", json_real(hw->calib_seconds));
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (json_dump_file(o, tmp, JSON_INDENT(1)) == 0) rename(tmp, path);
    else SF_LOGW("hal: cannot write calibration cache %s (it will be measured again next time)", tmp);
    json_decref(o);
}

static int read_arr(json_t *o, const char *key, double *v)
{
    json_t *a = json_object_get(o, key);
    if (!json_is_array(a) || json_array_size(a) != SF_HAL_CHUNKS) return -1;
    for (int i = 0; i < SF_HAL_CHUNKS; i++) {
        json_t *e = json_array_get(a, i);
        if (!json_is_number(e)) return -1;
        v[i] = json_number_value(e);
    }
    return 0;
}

/* 0 when the cache matched this GPU and driver and filled hw's measured fields. */
static int cache_load(const char *path, sf_hw_info *hw, int driver)
{
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return -1;
    int rc = -1;
    json_t *name = json_object_get(o, "name"), *drv = json_object_get(o, "driver");
    if (!json_is_string(name) || strcmp(json_string_value(name), hw->name) || !json_is_integer(drv) ||
        json_integer_value(drv) != driver)
        goto cleanup;
    json_t *bw = json_object_get(o, "mem_bw_gbs"), *tf = json_object_get(o, "gemm_tflops"),
           *ts = json_object_get(o, "gemm_tflops_sustained"); /* absent from caches before it: measured again */
    if (!json_is_number(bw) || !json_is_number(tf) || !json_is_number(ts)) goto cleanup;
    if (read_arr(o, "h2d_pinned_gbs", hw->h2d_pinned_gbs) || read_arr(o, "d2h_pinned_gbs", hw->d2h_pinned_gbs) ||
        read_arr(o, "h2d_pageable_gbs", hw->h2d_pageable_gbs) || read_arr(o, "d2h_pageable_gbs", hw->d2h_pageable_gbs))
        goto cleanup;
    hw->mem_bw_gbs = json_number_value(bw);
    hw->gemm_tflops = json_number_value(tf);
    hw->gemm_tflops_sustained = json_number_value(ts);
    rc = 0;
cleanup:
    json_decref(o);
    return rc;
}

/* ---- measurements ----------------------------------------------------------------------- */
static int measure_hbm(cudaStream_t s, double *gbs, sf_error *err)
{
    size_t free_b = 0, total_b = 0, bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = SF_OK, reps = 10;
    float ms = 0;
    SF_CUDA_GOTO(cudaMemGetInfo(&free_b, &total_b), err, rc);
    while (bytes > ((size_t)64 << 20) && bytes * 3 > free_b) bytes /= 2;
    SF_CUDA_GOTO(cudaMalloc(&a, bytes), err, rc);
    SF_CUDA_GOTO(cudaMalloc(&b, bytes), err, rc);
    SF_CUDA_GOTO((cudaError_t)sf_k_fill_random(a, (int64_t)(bytes / 2), 1, 1.0f, s), err, rc);
    SF_CUDA_GOTO(cudaEventCreate(&e0), err, rc);
    SF_CUDA_GOTO(cudaEventCreate(&e1), err, rc);
    SF_CUDA_GOTO(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), err, rc);
    SF_CUDA_GOTO(cudaEventRecord(e0, s), err, rc);
    for (int i = 0; i < reps; i++)
        SF_CUDA_GOTO(cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, s), err, rc);
    SF_CUDA_GOTO(cudaEventRecord(e1, s), err, rc);
    SF_CUDA_GOTO(cudaEventSynchronize(e1), err, rc);
    SF_CUDA_GOTO(cudaEventElapsedTime(&ms, e0, e1), err, rc);
    *gbs = 2.0 * (double)bytes * reps / (ms * 1e-3) / 1e9; /* bytes read + written */
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

/* Copies `total` bytes in chunks of `chunk`; pinned copies are async on s and timed with
 * events, pageable ones are synchronous cudaMemcpy timed with the host clock. */
static int time_copies(void *dst, const void *src, size_t chunk, size_t total, enum cudaMemcpyKind kind,
                       int pinned, cudaStream_t s, cudaEvent_t e0, cudaEvent_t e1, double *gbs, sf_error *err)
{
    int rc = SF_OK;
    size_t n = total / chunk;
    /* warm: one chunk */
    SF_CUDA_GOTO(cudaMemcpyAsync(dst, src, chunk, kind, s), err, rc);
    SF_CUDA_GOTO(cudaStreamSynchronize(s), err, rc);
    if (pinned) {
        float ms = 0;
        SF_CUDA_GOTO(cudaEventRecord(e0, s), err, rc);
        for (size_t i = 0; i < n; i++) {
            size_t off = i * chunk;
            SF_CUDA_GOTO(cudaMemcpyAsync((char *)dst + off, (const char *)src + off, chunk, kind, s), err, rc);
        }
        SF_CUDA_GOTO(cudaEventRecord(e1, s), err, rc);
        SF_CUDA_GOTO(cudaEventSynchronize(e1), err, rc);
        SF_CUDA_GOTO(cudaEventElapsedTime(&ms, e0, e1), err, rc);
        *gbs = (double)(n * chunk) / (ms * 1e-3) / 1e9;
    } else {
        double t0 = sf_now_s();
        for (size_t i = 0; i < n; i++) {
            size_t off = i * chunk;
            SF_CUDA_GOTO(cudaMemcpy((char *)dst + off, (const char *)src + off, chunk, kind), err, rc);
        }
        *gbs = (double)(n * chunk) / (sf_now_s() - t0) / 1e9;
    }
cleanup:
    return rc;
}

static int measure_pcie(sf_hw_info *hw, cudaStream_t s, sf_error *err)
{
    const size_t total = (size_t)64 << 20;
    void *pin = NULL, *page = NULL, *dev = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = SF_OK;
    SF_CUDA_GOTO(cudaHostAlloc(&pin, total, cudaHostAllocDefault), err, rc);
    page = malloc(total);
    if (!page) { rc = sf_err(err, SF_ENOMEM, "malloc(%zu) for the PCIe calibration failed", total); goto cleanup; }
    memset(page, 0x5a, total);
    memset(pin, 0x5a, total);
    SF_CUDA_GOTO(cudaMalloc(&dev, total), err, rc);
    SF_CUDA_GOTO(cudaEventCreate(&e0), err, rc);
    SF_CUDA_GOTO(cudaEventCreate(&e1), err, rc);
    for (int i = 0; i < SF_HAL_CHUNKS; i++) {
        size_t chunk = (size_t)64 << 10 << i;
        hw->chunk_bytes[i] = chunk;
        if ((rc = time_copies(dev, pin, chunk, total, cudaMemcpyHostToDevice, 1, s, e0, e1, &hw->h2d_pinned_gbs[i], err)) ||
            (rc = time_copies(pin, dev, chunk, total, cudaMemcpyDeviceToHost, 1, s, e0, e1, &hw->d2h_pinned_gbs[i], err)) ||
            (rc = time_copies(dev, page, chunk, total, cudaMemcpyHostToDevice, 0, s, e0, e1, &hw->h2d_pageable_gbs[i], err)) ||
            (rc = time_copies(page, dev, chunk, total, cudaMemcpyDeviceToHost, 0, s, e0, e1, &hw->d2h_pageable_gbs[i], err)))
            goto cleanup;
    }
cleanup:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(dev);
    cudaFreeHost(pin);
    free(page);
    return rc;
}

/* reps n^3 GEMMs on gb's stream; with tflops: timed with its events, their rate into it. */
#define GEMM_N 8192
typedef struct gemm_bench { sf_k_gemm_ctx *g; uint16_t *x, *w, *y; cudaStream_t s; cudaEvent_t e0, e1; } gemm_bench;

static int gemm_calls(const gemm_bench *gb, int reps, double *tflops, sf_error *err)
{
    const int n = GEMM_N;
    int rc = SF_OK;
    float ms = 0;
    if (tflops) SF_CUDA_GOTO(cudaEventRecord(gb->e0, gb->s), err, rc);
    for (int i = 0; i < reps; i++) {
        int krc = sf_k_gemm_lt(gb->g, gb->x, n, gb->w, NULL, n, n, n, gb->y, n, gb->s);
        if (krc) return sf_err(err, SF_ERROR, "cuBLASLt bf16 GEMM %dx%dx%d: %s", n, n, n, sf_k_gemm_error_str(krc));
    }
    if (!tflops) {
        SF_CUDA_GOTO(cudaStreamSynchronize(gb->s), err, rc);
        return SF_OK;
    }
    SF_CUDA_GOTO(cudaEventRecord(gb->e1, gb->s), err, rc);
    SF_CUDA_GOTO(cudaEventSynchronize(gb->e1), err, rc);
    SF_CUDA_GOTO(cudaEventElapsedTime(&ms, gb->e0, gb->e1), err, rc);
    *tflops = 2.0 * n * (double)n * n * reps / (ms * 1e-3) / 1e12;
cleanup:
    return rc;
}

/* The burst rate (10 calls after 3 warm-ups, ~18 ms) and the sustained one: the calls go on back
 * to back for ~0.4 s (the H200's SM clock falls from 1980 to ~1500 MHz after ~50 ms of them) and
 * 10 more are timed. */
static int measure_gemm(cudaStream_t s, double *tflops, double *sustained, sf_error *err)
{
    const int n = GEMM_N;
    gemm_bench gb = { NULL, NULL, NULL, NULL, s, NULL, NULL };
    int rc = SF_OK, krc, nm = 0;
    size_t bytes = (size_t)n * n * 2;
    SF_CUDA_GOTO(cudaMalloc((void **)&gb.x, bytes), err, rc);
    SF_CUDA_GOTO(cudaMalloc((void **)&gb.w, bytes), err, rc);
    SF_CUDA_GOTO(cudaMalloc((void **)&gb.y, bytes), err, rc);
    /* random data: a product of zeros runs measurably faster than real data */
    SF_CUDA_GOTO((cudaError_t)sf_k_fill_random(gb.x, (int64_t)n * n, 11, 1.0f, s), err, rc);
    SF_CUDA_GOTO((cudaError_t)sf_k_fill_random(gb.w, (int64_t)n * n, 12, 1.0f, s), err, rc);
    if ((krc = sf_k_gemm_ctx_new(&gb.g, &nm))) {
        rc = sf_err(err, SF_ERROR, "cuBLASLt init: %s", sf_k_gemm_error_str(krc));
        goto cleanup;
    }
    SF_CUDA_GOTO(cudaEventCreate(&gb.e0), err, rc);
    SF_CUDA_GOTO(cudaEventCreate(&gb.e1), err, rc);
    if ((rc = gemm_calls(&gb, 3, NULL, err)) || (rc = gemm_calls(&gb, 10, tflops, err))) goto cleanup;
    for (double t0 = sf_now_s(); sf_now_s() - t0 < 0.4;)
        if ((rc = gemm_calls(&gb, 10, NULL, err))) goto cleanup;
    rc = gemm_calls(&gb, 10, sustained, err);
cleanup:
    if (gb.e0) cudaEventDestroy(gb.e0);
    if (gb.e1) cudaEventDestroy(gb.e1);
    sf_k_gemm_ctx_free(gb.g);
    cudaFree(gb.x);
    cudaFree(gb.w);
    cudaFree(gb.y);
    return rc;
}

int sf_hal_cuda_probe(int device, sf_hw_info *hw, int force, sf_error *err)
{
    struct cudaDeviceProp p;
    cudaStream_t s = NULL;
    int rc = SF_OK, n_dev = 0, driver = 0;
    char bus_id[64] = "", path[1024] = "";
    memset(hw, 0, sizeof *hw);
    cuda_loading_default();
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        cudaGetLastError();
        return sf_err(err, SF_ENODEV, "CUDA backend: no usable GPU (cudaGetDeviceCount found none; "
                                      "is the NVIDIA driver loaded?); use --backend cpu");
    }
    if (device < 0 || device >= n_dev)
        return sf_err(err, SF_EINVAL, "CUDA device %d does not exist (this machine has %d: 0..%d)", device, n_dev,
                      n_dev - 1);
    SF_CUDA_GOTO(cudaSetDevice(device), err, rc);
    SF_CUDA_GOTO(cudaGetDeviceProperties(&p, device), err, rc);
    SF_CUDA_GOTO(cudaDriverGetVersion(&driver), err, rc);
    SF_CUDA_GOTO(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, device), err, rc);
    snprintf(hw->backend, sizeof hw->backend, "cuda");
    snprintf(hw->name, sizeof hw->name, "%s", p.name);
    hw->n_cores = p.multiProcessorCount;
    hw->n_threads = 1;
    hw->l2_bytes = (size_t)p.l2CacheSize;
    hw->smem_per_block = p.sharedMemPerBlockOptin;
    hw->cc_major = p.major;
    hw->cc_minor = p.minor;
    SF_CUDA_GOTO(cudaMemGetInfo(&hw->mem_free, &hw->mem_total), err, rc);
    for (int i = 0; i < SF_HAL_CHUNKS; i++) hw->chunk_bytes[i] = (size_t)64 << 10 << i;
    {
        int mg, mw;
        sf_error nerr = { 0 };
        if (sf_nvml_pcie_link(bus_id, &hw->pcie_gen, &hw->pcie_width, &mg, &mw, &nerr))
            SF_LOGD("hal: PCIe link unknown: %s", nerr.msg);
    }
    if (!force && sf_hal_cuda_cache_path(bus_id, "hal-cuda", path, sizeof path) == 0 && cache_load(path, hw, driver) == 0) {
        hw->from_cache = 1;
        return SF_OK;
    }
    double t0 = sf_now_s();
    SF_CUDA_GOTO(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), err, rc);
    if ((rc = measure_hbm(s, &hw->mem_bw_gbs, err)) || (rc = measure_pcie(hw, s, err)) ||
        (rc = measure_gemm(s, &hw->gemm_tflops, &hw->gemm_tflops_sustained, err))) {
        sf_err_wrap(err, "calibrating %s", hw->name);
        goto cleanup;
    }
    hw->calib_seconds = sf_now_s() - t0;
    if (path[0] || sf_hal_cuda_cache_path(bus_id, "hal-cuda", path, sizeof path) == 0) cache_save(path, hw, driver);
cleanup:
    if (s) cudaStreamDestroy(s);
    return rc;
}

#endif
