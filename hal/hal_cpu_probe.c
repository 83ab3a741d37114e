/* hal_cpu_probe.c — what the CPU is: cores (sched_getaffinity), caches (sysfs), RAM
 * (/proc/meminfo), and two measured ceilings:
 *   mem_read_gbs  all threads summing disjoint slices of a 256 MiB buffer (read only): the
 *                 fair ceiling for decode, which streams weights and writes almost nothing;
 *   mem_bw_gbs    all threads copying 128 MiB into another 128 MiB, counted as bytes read +
 *                 written;
 *   gemm_tflops   the fp32 matmul kernel on a 64 x 1024 x 1024 problem.
 * Each is the best of a few repetitions; calibration takes a few hundred milliseconds and is
 * cached as JSON in $XDG_CACHE_HOME/semflow/ (or ~/.cache/semflow/) keyed by CPU model and
 * core count; force = 1 measures again. */
#include "hal.h"
#include "kernels/cpu/cpu.h"

#include <ctype.h>
#include <errno.h>
#include <immintrin.h>
#include <jansson.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define BW_BYTES ((size_t)256 << 20)
#define BW_REPS 5          /* best of: a busy machine still leaves some quiet slices */
#define CALIB_BUDGET_S 1.0 /* on a busy machine, stop repeating after this (at least 2 runs each) */

static size_t parse_size(const char *s)
{
    char *end;
    size_t v = strtoull(s, &end, 10);
    if (*end == 'K') v <<= 10;
    else if (*end == 'M') v <<= 20;
    else if (*end == 'G') v <<= 30;
    return v;
}

static int read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    buf[strcspn(buf, "\n")] = 0;
    return 0;
}

static void probe_static(sf_hw_info *hw)
{
    strcpy(hw->backend, "cpu");
    cpu_set_t set;
    CPU_ZERO(&set);
    hw->n_cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (hw->n_cores < 1) hw->n_cores = 1;
    hw->n_threads = hw->n_cores;

    snprintf(hw->name, sizeof hw->name, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10)) continue;
            char *c = strchr(line, ':');
            if (!c) continue;
            c++;
            while (*c == ' ') c++;
            c[strcspn(c, "\n")] = 0;
            snprintf(hw->name, sizeof hw->name, "%s", c);
            break;
        }
        fclose(f);
    }

    for (int i = 0; i < 8; i++) {
        char path[128], level[16], type[32], size[32];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        if (read_line(path, level, sizeof level)) break;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if (read_line(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (read_line(path, size, sizeof size)) continue;
        if (!strcmp(type, "Instruction")) continue;
        size_t b = parse_size(size);
        if (level[0] == '1') hw->l1d_bytes = b;
        else if (level[0] == '2') hw->l2_bytes = b;
        else if (level[0] == '3') hw->l3_bytes = b;
    }
    /* sysfs may be missing in containers: assume a common modern core rather than zero */
    if (!hw->l1d_bytes) hw->l1d_bytes = 32 << 10;
    if (!hw->l2_bytes) hw->l2_bytes = 512 << 10;

    f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) hw->mem_total = (size_t)kb << 10;
            else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) hw->mem_free = (size_t)kb << 10;
        }
        fclose(f);
    }
}

/* ---- measurements ------------------------------------------------------------------- */
struct bw_arg { const float *src; float *dst; size_t n; double sums[64]; };

__attribute__((target("avx2")))
static double sum_avx2(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

static double sum_scalar(const float *p, size_t n)
{
    float s[8] = { 0 };
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += p[i + l];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void read_task(void *arg, int ith, int nth)
{
    struct bw_arg *a = arg;
    int64_t lo, hi;
    sf_cpu_split((int64_t)(a->n / 64), ith, nth, &lo, &hi); /* 256-byte aligned slices */
    const float *p = a->src + lo * 64;
    size_t n = (size_t)(hi - lo) * 64;
    a->sums[ith & 63] = sf_cpu_has_avx2() ? sum_avx2(p, n) : sum_scalar(p, n);
}

static void copy_task(void *arg, int ith, int nth)
{
    struct bw_arg *a = arg;
    int64_t lo, hi;
    sf_cpu_split((int64_t)(a->n / 64), ith, nth, &lo, &hi);
    memcpy(a->dst + lo * 64, a->src + lo * 64, (size_t)(hi - lo) * 64 * sizeof(float));
}

static void fill_task(void *arg, int ith, int nth)
{
    struct bw_arg *a = arg;
    int64_t lo, hi;
    sf_cpu_split((int64_t)a->n, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) a->dst[i] = (float)(i & 1023);
}

static int measure(sf_hw_info *hw, sf_error *err)
{
    double t0 = sf_now_s();
    sf_cpu_pool *pool = NULL;
    float *buf = MAP_FAILED, *gx = NULL, *gw = NULL, *gy = NULL, *scratch = NULL;
    int rc = sf_cpu_pool_new(hw->n_threads, &pool, err);
    if (rc) return rc;
    buf = mmap(NULL, BW_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        rc = sf_err(err, SF_ENOMEM, "hal cpu: mmap(%zu MiB) for the bandwidth test: %s", BW_BYTES >> 20, strerror(errno));
        goto cleanup;
    }
    struct bw_arg a = { .src = buf, .dst = buf, .n = BW_BYTES / sizeof(float) };
    sf_cpu_pool_run(pool, fill_task, &a); /* fault the pages in, on the threads that read them */
    double best = 1e30;
    for (int r = 0; r < BW_REPS && !(r >= 2 && sf_now_s() - t0 > CALIB_BUDGET_S / 2); r++) {
        double s = sf_now_s();
        sf_cpu_pool_run(pool, read_task, &a);
        double dt = sf_now_s() - s;
        if (dt < best) best = dt;
    }
    hw->mem_read_gbs = BW_BYTES / best / 1e9;

    struct bw_arg c = { .src = buf, .dst = buf + BW_BYTES / 2 / sizeof(float), .n = BW_BYTES / 2 / sizeof(float) };
    best = 1e30;
    for (int r = 0; r < BW_REPS && !(r >= 2 && sf_now_s() - t0 > CALIB_BUDGET_S); r++) {
        double s = sf_now_s();
        sf_cpu_pool_run(pool, copy_task, &c);
        double dt = sf_now_s() - s;
        if (dt < best) best = dt;
    }
    hw->mem_bw_gbs = (double)BW_BYTES / best / 1e9; /* half read + half written */

    /* fp32 GEMM with the backend's own kernel */
    const int n = 64, m = 1024, k = 1024;
    gx = malloc(sizeof(float) * n * k);
    gw = malloc(sizeof(float) * m * k);
    gy = malloc(sizeof(float) * n * m);
    int64_t sf = sf_cpu_matmul_scratch(k);
    scratch = malloc(sizeof(float) * sf * hw->n_threads);
    if (!gx || !gw || !gy || !scratch) { rc = sf_err(err, SF_ENOMEM, "hal cpu: out of memory for the GEMM test"); goto cleanup; }
    for (int i = 0; i < n * k; i++) gx[i] = (float)((i % 7) - 3) * 0.1f;
    for (int i = 0; i < m * k; i++) gw[i] = (float)((i % 5) - 2) * 0.1f;
    sf_cpu_matmul mm = { .n_parts = 1, .part = { { gw, SF_DT_F32, m, k } }, .m = m, .k = k,
                         .x = gx, .y = gy, .n = n, .ldx = k, .ldy = m, .l2_bytes = hw->l2_bytes,
                         .scratch = scratch, .scratch_floats = sf };
    best = 1e30;
    for (int r = 0; r < 4; r++) {
        mm.next_chunk = 0;
        double s = sf_now_s();
        sf_cpu_pool_run(pool, sf_cpu_matmul_task, &mm);
        double dt = sf_now_s() - s;
        if (dt < best) best = dt;
    }
    hw->gemm_tflops = 2.0 * n * m * k / best / 1e12;
    hw->calib_seconds = sf_now_s() - t0;
    rc = SF_OK;
cleanup:
    free(scratch);
    free(gy);
    free(gw);
    free(gx);
    if (buf != MAP_FAILED) munmap(buf, BW_BYTES);
    sf_cpu_pool_free(pool);
    return rc;
}

/* ---- cache file ---------------------------------------------------------------------- */
static int cache_path(const sf_hw_info *hw, char *out, size_t n, int mkdirs)
{
    char dir[768];
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (x && *x) snprintf(dir, sizeof dir, "%s/semflow", x);
    else if (home && *home) snprintf(dir, sizeof dir, "%s/.cache/semflow", home);
    else return -1;
    if (mkdirs) {
        char parent[768];
        snprintf(parent, sizeof parent, "%s", dir);
        char *sl = strrchr(parent, '/');
        if (sl) { *sl = 0; mkdir(parent, 0755); }
        mkdir(dir, 0755);
    }
    char key[128];
    size_t j = 0;
    for (const char *c = hw->name; *c && j + 1 < sizeof key; c++)
        key[j++] = isalnum((unsigned char)*c) ? (char)tolower((unsigned char)*c) : '-';
    key[j] = 0;
    snprintf(out, n, "%s/hal-cpu-%s-%dc.json", dir, key, hw->n_cores);
    return 0;
}

static int cache_load(sf_hw_info *hw)
{
    char path[1024];
    if (cache_path(hw, path, sizeof path, 0)) return -1;
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return -1;
    json_t *r = json_object_get(o, "mem_read_gbs"), *b = json_object_get(o, "mem_bw_gbs"),
           *g = json_object_get(o, "gemm_tflops");
    int ok = json_is_number(r) && json_is_number(b) && json_is_number(g) &&
             json_number_value(r) > 0 && json_number_value(b) > 0 && json_number_value(g) > 0;
    if (ok) {
        hw->mem_read_gbs = json_number_value(r);
        hw->mem_bw_gbs = json_number_value(b);
        hw->gemm_tflops = json_number_value(g);
        hw->from_cache = 1;
        hw->calib_seconds = 0;
    } else {
        SF_LOGW("hal cpu: ignoring malformed calibration cache %s; measuring again", path);
    }
    json_decref(o);
    return ok ? 0 : -1;
}

static void cache_store(const sf_hw_info *hw)
{
    char path[1024], tmp[1100];
    if (cache_path(hw, path, sizeof path, 1)) return;
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(hw->name));
    json_object_set_new(o, "n_cores", json_integer(hw->n_cores));
    json_object_set_new(o, "mem_read_gbs", json_real(hw->mem_read_gbs));
    json_object_set_new(o, "mem_bw_gbs", json_real(hw->mem_bw_gbs));
    json_object_set_new(o, "gemm_tflops", json_real(hw->gemm_tflops));
    json_object_set_new(o, "calib_seconds", json_real(hw->calib_seconds));
    if (json_dump_file(o, tmp, JSON_INDENT(2)) == 0 && rename(tmp, path) == 0)
        SF_LOGD("hal cpu: calibration cached in %s", path);
    else {
        SF_LOGW("hal cpu: could not write the calibration cache %s: %s (it will be measured again next time)",
                path, strerror(errno));
        unlink(tmp);
    }
    json_decref(o);
}

int sf_hal_cpu_probe(sf_hw_info *hw, int force, sf_error *err)
{
    memset(hw, 0, sizeof *hw);
    probe_static(hw);
    if (force || cache_load(hw) != 0) {
        int rc = measure(hw, err);
        if (rc) return sf_err_wrap(err, "measuring the CPU");
        cache_store(hw);
    }
    hw->gemm_tflops_sustained = hw->gemm_tflops; /* no clock that falls under a longer load is measured here */
    return SF_OK;
}
