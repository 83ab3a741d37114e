/* test_bpf_cuda — the monitor on a real GPU: uprobes on the driver's libcuda count exactly the
 * bytes this process copies with cudaMemcpy (pageable) and cudaMemcpyAsync (pinned), per
 * direction, and during a sustained pinned H2D stream the monitor's rate is within 10% of
 * NVML's PCIe RX counter. Needs root (BPF) and a GPU. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../../bpf/monitor.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

static sf_monitor *mon;
static sf_error mon_err;

static const sf_mon_proc *self_in(const sf_mon_snapshot *s)
{
    for (int i = 0; i < s->n_procs; i++)
        if (s->procs[i].pid == getpid()) return &s->procs[i];
    return NULL;
}

static void settle(sf_mon_snapshot *s)
{
    uint64_t seq = sf_monitor_wait(mon, 0, 0);
    seq = sf_monitor_wait(mon, seq, 2.0);
    sf_monitor_wait(mon, seq, 2.0);
    sf_monitor_snapshot(mon, s);
}

TEST(libcuda_copies_are_counted_exactly)
{
    REQUIRE(mon, "monitor is off: %s", mon_err.msg);
    sf_mon_snapshot s0, s1;
    settle(&s0);
    CHECK_MSG(s0.n_libs >= 1 && s0.n_uprobes >= 8, "libcuda not attached (%d libs, %d uprobes)", s0.n_libs,
              s0.n_uprobes);
    const sf_mon_proc *p0 = self_in(&s0);
    uint64_t b0[SF_DIR_COUNT] = { 0 }, c0[SF_DIR_COUNT] = { 0 };
    for (int d = 0; p0 && d < SF_DIR_COUNT; d++) { b0[d] = p0->bytes[d]; c0[d] = p0->calls[d]; }

    size_t max = 8 << 20, sizes[] = { 4096, 65536, 1 << 20, 3000000, 8 << 20 };
    char *host = malloc(max), *pinned = NULL, *dev = NULL;
    REQUIRE(host, "malloc");
    memset(host, 1, max);
    cudaError_t ea = cudaMallocHost((void **)&pinned, max), eb = cudaMalloc((void **)&dev, max);
    REQUIRE(ea == cudaSuccess && eb == cudaSuccess,
            "cuda allocation failed");
    uint64_t want_h2d = 0, want_d2h = 0, n_h2d = 0, n_d2h = 0;
    cudaStream_t st;
    cudaStreamCreate(&st);
    for (size_t i = 0; i < SF_ARRAY_LEN(sizes); i++) {
        CHECK(cudaMemcpy(dev, host, sizes[i], cudaMemcpyHostToDevice) == cudaSuccess);
        CHECK(cudaMemcpy(host, dev, sizes[i], cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(cudaMemcpyAsync(dev, pinned, sizes[i], cudaMemcpyHostToDevice, st) == cudaSuccess);
        CHECK(cudaMemcpyAsync(pinned, dev, sizes[i], cudaMemcpyDeviceToHost, st) == cudaSuccess);
        want_h2d += 2 * sizes[i];
        want_d2h += 2 * sizes[i];
        n_h2d += 2;
        n_d2h += 2;
    }
    cudaStreamSynchronize(st);
    settle(&s1);
    const sf_mon_proc *p = self_in(&s1);
    REQUIRE(p, "this process (pid %d) is not in the snapshot", getpid());
    uint64_t h2d = p->bytes[SF_DIR_H2D] - b0[SF_DIR_H2D], d2h = p->bytes[SF_DIR_D2H] - b0[SF_DIR_D2H];
    uint64_t ch = p->calls[SF_DIR_H2D] - c0[SF_DIR_H2D], cd = p->calls[SF_DIR_D2H] - c0[SF_DIR_D2H];
    printf("      copied H2D %llu B in %llu calls, counted %llu B in %llu; D2H %llu B in %llu, counted %llu B in %llu\n",
           (unsigned long long)want_h2d, (unsigned long long)n_h2d, (unsigned long long)h2d, (unsigned long long)ch,
           (unsigned long long)want_d2h, (unsigned long long)n_d2h, (unsigned long long)d2h, (unsigned long long)cd);
    CHECK(h2d == want_h2d && ch == n_h2d);
    CHECK(d2h == want_d2h && cd == n_d2h);
    cudaStreamDestroy(st);
    cudaFree(dev);
    cudaFreeHost(pinned);
    free(host);
    sf_mon_snapshot_free(&s0);
    sf_mon_snapshot_free(&s1);
}

static volatile int streaming;
static void *stream_h2d(void *arg)
{
    size_t n = 64 << 20;
    char *pinned = NULL, *dev = NULL;
    if (cudaMallocHost((void **)&pinned, n) != cudaSuccess || cudaMalloc((void **)&dev, n) != cudaSuccess) return NULL;
    while (streaming) cudaMemcpy(dev, pinned, n, cudaMemcpyHostToDevice);
    cudaFree(dev);
    cudaFreeHost(pinned);
    return NULL;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

TEST(rate_matches_nvml_less_link_overhead)
{
    REQUIRE(mon, "monitor is off: %s", mon_err.msg);
    pthread_t t;
    streaming = 1;
    int rt = pthread_create(&t, NULL, stream_h2d, NULL);
    REQUIRE(rt == 0, "thread");
    double ours[12], nvml[12];
    int n = 0, nvml_seen = 0;
    sf_mon_snapshot s;
    settle(&s); /* let the stream start */
    sf_mon_snapshot_free(&s);
    for (int i = 0; i < 12; i++) {
        usleep(1100 * 1000); /* NVML is read once a second */
        sf_monitor_snapshot(mon, &s);
        if (s.n_gpus && s.gpus[0].nvml_ok) {
            nvml_seen = 1;
            ours[n] = s.gpus[0].own_h2d_per_s + s.gpus[0].other_h2d_per_s;
            nvml[n++] = s.gpus[0].nvml_rx_per_s;
        }
        sf_mon_snapshot_free(&s);
    }
    streaming = 0;
    pthread_join(t, NULL);
    REQUIRE(nvml_seen, "NVML PCIe counters unavailable (libnvidia-ml.so.1)");
    qsort(ours, (size_t)n, sizeof *ours, cmp_d);
    qsort(nvml, (size_t)n, sizeof *nvml, cmp_d);
    double a = ours[n / 2], b = nvml[n / 2];
    printf("      pinned H2D stream: monitor %.2f GB/s, NVML RX %.2f GB/s (medians of %d)\n", a / 1e9, b / 1e9, n);
    /* NVML counts what crosses the link (TLP headers, framing, flow control: ~8-12% over the
     * payload at 256-byte TLPs), the monitor the payload the copies asked for: below NVML's,
     * never above it by more than the sampling jitter. Measured 9.2%, 9.6% and 10.2% apart on
     * H200s (docs/PERFORMANCE.md, "eBPF monitoring and DMA"). */
    CHECK_MSG(b > 0 && a > 0.85 * b && a < 1.02 * b, "monitor %.2f GB/s vs NVML %.2f GB/s (%.1f%% apart)", a / 1e9,
              b / 1e9, b > 0 ? 100.0 * (b - a) / b : 0.0);
}

int main(void)
{
    if (cudaFree(0) != cudaSuccess) {
        printf("FAIL: setup: no usable CUDA device\n");
        return 1;
    }
    sf_monitor_opts o;
    sf_monitor_opts_default(&o);
    o.n_gpus = 1;
    if (sf_monitor_open(&o, &mon, &mon_err) != SF_OK) mon = NULL; /* libcuda is mapped now: discovery finds it */
    RUN(libcuda_copies_are_counted_exactly);
    RUN(rate_matches_nvml_less_link_overhead);
    sf_monitor_close(mon);
    return test_summary();
}
#else
int main(void)
{
    printf("FAIL: setup: built without CUDA\n");
    return 1;
}
#endif
