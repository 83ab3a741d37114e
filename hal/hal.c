/* hal.c — backend selection, and printing what the probes measured (dtype facts: dtype.c). */
#include "hal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

int sf_backend_open(const sf_backend_opts *o, sf_backend **out, sf_error *err)
{
    const char *name = o && o->name ? o->name : "auto";
    *out = NULL;
    if (!strcmp(name, "cpu")) return sf_backend_cpu_new(o, out, err);
    if (!strcmp(name, "cuda")) return sf_backend_cuda_new(o, out, err); /* says why when it cannot */
    if (strcmp(name, "auto"))
        return sf_err(err, SF_EINVAL, "unknown backend '%s': use auto, cpu or cuda", name);

    if (!sf_hal_cuda_available()) {
#ifdef SF_HAVE_CUDA
        SF_LOGI("backend auto: no usable CUDA device found; using the CPU backend");
#else
        SF_LOGI("backend auto: this build has no CUDA support (no nvcc at build time); using the CPU backend");
#endif
    } else {
        sf_error cerr = { 0 };
        int rc = sf_backend_cuda_new(o, out, &cerr);
        if (rc == SF_OK) return SF_OK;
        SF_LOGI("backend auto: CUDA backend failed to start (%s); using the CPU backend", cerr.msg);
    }
    return sf_backend_cpu_new(o, out, err);
}

void sf_backend_close(sf_backend *b)
{
    if (b && b->ops && b->ops->destroy) b->ops->destroy(b);
}

int sf_backend_host_alloc(sf_backend *b, size_t bytes, void **out, sf_error *err)
{
    *out = NULL;
    if (b && b->ops->host_alloc) return b->ops->host_alloc(b, bytes, out, err);
    size_t n = (bytes + 4095) & ~(size_t)4095;
    if (!n || !(*out = aligned_alloc(4096, n)))
        return sf_err(err, SF_ENOMEM, "host memory: cannot allocate %.1f MiB; ask for less (e.g. a smaller --swap-space)",
                      bytes / 1048576.0);
    return SF_OK;
}

void sf_backend_host_free(sf_backend *b, void *p)
{
    if (!p) return;
    if (b && b->ops->host_free) b->ops->host_free(b, p);
    else free(p);
}

static json_t *gbs_array(const double *v)
{
    json_t *a = json_array();
    for (int i = 0; i < SF_HAL_CHUNKS; i++) json_array_append_new(a, json_real(v[i]));
    return a;
}

char *sf_hw_info_json(const sf_hw_info *hw)
{
    json_t *o = json_object();
    json_object_set_new(o, "backend", json_string(hw->backend));
    json_object_set_new(o, "name", json_string(hw->name));
    json_object_set_new(o, "n_cores", json_integer(hw->n_cores));
    json_object_set_new(o, "n_threads", json_integer(hw->n_threads));
    json_object_set_new(o, "l1d_bytes", json_integer((json_int_t)hw->l1d_bytes));
    json_object_set_new(o, "l2_bytes", json_integer((json_int_t)hw->l2_bytes));
    json_object_set_new(o, "l3_bytes", json_integer((json_int_t)hw->l3_bytes));
    json_object_set_new(o, "mem_total", json_integer((json_int_t)hw->mem_total));
    json_object_set_new(o, "mem_free", json_integer((json_int_t)hw->mem_free));
    json_object_set_new(o, "mem_bw_gbs", json_real(hw->mem_bw_gbs));
    json_object_set_new(o, "mem_read_gbs", json_real(hw->mem_read_gbs));
    json_object_set_new(o, "gemm_tflops", json_real(hw->gemm_tflops));
    json_object_set_new(o, "gemm_tflops_sustained", json_real(hw->gemm_tflops_sustained));
    if (!strcmp(hw->backend, "cuda")) {
        json_object_set_new(o, "smem_per_block", json_integer((json_int_t)hw->smem_per_block));
        json_object_set_new(o, "cc", json_sprintf("%d.%d", hw->cc_major, hw->cc_minor));
        json_t *c = json_array();
        for (int i = 0; i < SF_HAL_CHUNKS; i++) json_array_append_new(c, json_integer((json_int_t)hw->chunk_bytes[i]));
        json_object_set_new(o, "chunk_bytes", c);
        json_object_set_new(o, "h2d_pinned_gbs", gbs_array(hw->h2d_pinned_gbs));
        json_object_set_new(o, "d2h_pinned_gbs", gbs_array(hw->d2h_pinned_gbs));
        json_object_set_new(o, "h2d_pageable_gbs", gbs_array(hw->h2d_pageable_gbs));
        json_object_set_new(o, "d2h_pageable_gbs", gbs_array(hw->d2h_pageable_gbs));
        json_object_set_new(o, "pcie_gen", json_integer(hw->pcie_gen));
        json_object_set_new(o, "pcie_width", json_integer(hw->pcie_width));
    }
    json_object_set_new(o, "calib_seconds", json_real(hw->calib_seconds));
    json_object_set_new(o, "from_cache", json_boolean(hw->from_cache));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

static const char *human_bytes(size_t b, char *buf, size_t n)
{
    if (b >= ((size_t)1 << 30)) snprintf(buf, n, "%.1f GiB", b / (double)(1 << 30));
    else if (b >= ((size_t)1 << 20)) snprintf(buf, n, "%.1f MiB", b / (double)(1 << 20));
    else if (b >= 1024) snprintf(buf, n, "%zu KiB", b >> 10);
    else snprintf(buf, n, "%zu B", b);
    return buf;
}

void sf_hw_info_print(FILE *f, const sf_hw_info *hw)
{
    char a[32], b[32], c[32];
    fprintf(f, "backend      %s\n", hw->backend);
    fprintf(f, "device       %s\n", hw->name);
    if (!strcmp(hw->backend, "cuda")) {
        fprintf(f, "SMs          %d (compute capability %d.%d)\n", hw->n_cores, hw->cc_major, hw->cc_minor);
        fprintf(f, "L2           %s, shared memory per block %s\n", human_bytes(hw->l2_bytes, a, sizeof a),
                human_bytes(hw->smem_per_block, b, sizeof b));
        fprintf(f, "memory       %s total, %s free\n", human_bytes(hw->mem_total, a, sizeof a),
                human_bytes(hw->mem_free, b, sizeof b));
        fprintf(f, "HBM copy     %.1f GB/s (read + write)\n", hw->mem_bw_gbs);
        fprintf(f, "GEMM         %.1f TFLOP/s (bf16), %.1f sustained\n", hw->gemm_tflops, hw->gemm_tflops_sustained);
        if (hw->pcie_gen) fprintf(f, "PCIe         Gen%d x%d\n", hw->pcie_gen, hw->pcie_width);
        fprintf(f, "chunk        H2D pinned  D2H pinned  H2D pageable  D2H pageable (GB/s)\n");
        for (int i = 0; i < SF_HAL_CHUNKS; i++)
            fprintf(f, "  %-9s  %9.1f  %10.1f  %12.1f  %12.1f\n", human_bytes(hw->chunk_bytes[i], a, sizeof a),
                    hw->h2d_pinned_gbs[i], hw->d2h_pinned_gbs[i], hw->h2d_pageable_gbs[i], hw->d2h_pageable_gbs[i]);
    } else {
        fprintf(f, "cores        %d usable, %d threads\n", hw->n_cores, hw->n_threads);
        fprintf(f, "caches       L1d %s, L2 %s (per core), L3 %s\n", human_bytes(hw->l1d_bytes, a, sizeof a),
                human_bytes(hw->l2_bytes, b, sizeof b), human_bytes(hw->l3_bytes, c, sizeof c));
        fprintf(f, "memory       %s total, %s available\n", human_bytes(hw->mem_total, a, sizeof a),
                human_bytes(hw->mem_free, b, sizeof b));
        fprintf(f, "bandwidth    %.1f GB/s read, %.1f GB/s copy (read + write), all threads\n",
                hw->mem_read_gbs, hw->mem_bw_gbs);
        fprintf(f, "GEMM         %.1f GFLOP/s (fp32, all threads)\n", hw->gemm_tflops * 1e3);
    }
    if (hw->from_cache) fprintf(f, "calibration  from cache (semflow hal --recalibrate to measure again)\n");
    else fprintf(f, "calibration  %.2f s\n", hw->calib_seconds);
}
