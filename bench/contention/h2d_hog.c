/* h2d_hog.c — a neighbour that saturates one GPU's PCIe link host-to-device: pinned buffers,
 * cudaMemcpyAsync of CHUNK bytes in a loop on two streams, for SECONDS seconds. It stands for
 * another tenant's data loader on the same GPU in the contention experiment (run.sh).
 *
 *   h2d_hog [SECONDS=30] [CHUNK_MIB=8] [DEVICE=0]
 *
 * Prints one line per second (GB/s this second) and the average at the end; exits 0, or 1
 * with a message when CUDA is not usable. SIGTERM/SIGINT stop it early (the average is still
 * printed). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) { (void)sig; stop = 1; }

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                                     \
    do {                                                                                                \
        cudaError_t e_ = (call);                                                                        \
        if (e_ != cudaSuccess) {                                                                        \
            fprintf(stderr, "h2d_hog: %s failed: %s\n", #call, cudaGetErrorString(e_));                 \
            return 1;                                                                                   \
        }                                                                                               \
    } while (0)

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 30;
    size_t chunk = (size_t)(argc > 2 ? atof(argv[2]) : 8) * (1 << 20);
    int dev = argc > 3 ? atoi(argv[3]) : 0;
    if (!(seconds > 0) || chunk == 0) {
        fprintf(stderr, "usage: h2d_hog [SECONDS>0] [CHUNK_MIB>0] [DEVICE]\n");
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    enum { DEPTH = 4 };
    void *host = NULL, *dst[2] = { 0 };
    cudaStream_t st[2];
    CHECK(cudaSetDevice(dev));
    CHECK(cudaHostAlloc(&host, chunk, cudaHostAllocDefault));
    for (int i = 0; i < 2; i++) {
        CHECK(cudaMalloc(&dst[i], chunk));
        CHECK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
    }
    double t0 = now_s(), t_sec = t0, bytes_sec = 0, total = 0;
    while (!stop && now_s() - t0 < seconds) {
        for (int k = 0; k < DEPTH; k++)
            for (int i = 0; i < 2; i++) CHECK(cudaMemcpyAsync(dst[i], host, chunk, cudaMemcpyHostToDevice, st[i]));
        for (int i = 0; i < 2; i++) CHECK(cudaStreamSynchronize(st[i]));
        bytes_sec += 2.0 * DEPTH * (double)chunk;
        double t = now_s();
        if (t - t_sec >= 1.0) {
            printf("h2d_hog: %.1f GB/s\n", bytes_sec / (t - t_sec) / 1e9);
            fflush(stdout);
            total += bytes_sec;
            bytes_sec = 0;
            t_sec = t;
        }
    }
    total += bytes_sec;
    printf("h2d_hog: average %.2f GB/s over %.1f s (%zu MiB copies, device %d)\n", total / (now_s() - t0) / 1e9,
           now_s() - t0, chunk >> 20, dev);
    for (int i = 0; i < 2; i++) {
        cudaFree(dst[i]);
        cudaStreamDestroy(st[i]);
    }
    cudaFreeHost(host);
    return 0;
}
