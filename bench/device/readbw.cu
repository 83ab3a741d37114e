/* readbw.cu — the HBM bandwidth a read-only stream gets, beside the device-to-device copy that
 * hal measures (`semflow hal`: bytes read + written). Batch-1 decode reads its weights and
 * never writes them back, so its physical ceiling is the read rate, not the copy rate; the
 * issue's roofline (docs/PERFORMANCE.md) uses the copy rate, and this program says how far the
 * two are apart on the machine it runs on. Three ways of reading 2 GiB (far past L2): 16-byte
 * loads with U in flight per thread; per-warp cp.async rings into shared memory (as the
 * batch-1 GEMVs stream, kernels/cuda/gemv_stream.cu); cp.async.bulk chunks into an mbarrier
 * ring, one issuing thread per block. Then the 16-byte loads over one GEMV's worth of bytes
 * (32, 117 and 235 MB: O, down and gate/up of Llama-3-8B), a launch each, which shows the fixed
 * cost of a launch's ramp and tail. Medians of 10-20 runs, timed with events.
 *   build: make (build/bench/readbw, with every CUDA build)   run: build/bench/readbw */
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ unsigned sink;

template <int U>
__global__ void k_ldg(const uint4 *__restrict__ p, size_t n)
{
    unsigned acc = 0;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    if (acc == 0x12345678u) sink = acc;
}

// cp.async 16B per lane into a per-warp ring of ST stages, each stage V loads per lane
template <int ST, int V>
__global__ void k_cpasync(const uint4 *__restrict__ p, size_t n)
{
    extern __shared__ uint4 sm[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    uint4 *ring = sm + (size_t)warp * ST * V * 32;
    const size_t gw = (size_t)blockIdx.x * nw + warp, nwarps = (size_t)gridDim.x * nw;
    const size_t chunk = V * 32; // uint4 per stage per warp
    const size_t nchunks = n / chunk;
    unsigned acc = 0;
    size_t issue = gw, cons = gw;
    int is = 0, cs = 0;
    auto iss = [&]() {
        if (issue < nchunks) {
#pragma unroll
            for (int v = 0; v < V; v++) {
                unsigned d = (unsigned)__cvta_generic_to_shared(ring + (is * V + v) * 32 + lane);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(p + issue * chunk + v * 32 + lane));
            }
            issue += nwarps;
        }
        asm volatile("cp.async.commit_group;");
        if (++is == ST) is = 0;
    };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) iss();
    for (; cons < nchunks; cons += nwarps) {
        iss();
        asm volatile("cp.async.wait_group %0;" ::"n"(ST - 1));
#pragma unroll
        for (int v = 0; v < V; v++) {
            uint4 x = ring[(cs * V + v) * 32 + lane];
            acc ^= x.x ^ x.y ^ x.z ^ x.w;
        }
        if (++cs == ST) cs = 0;
    }
    asm volatile("cp.async.wait_group 0;");
    if (acc == 0x12345678u) sink = acc;
}

// cp.async.bulk: one thread per block issues CH-byte chunks into ST stages, mbarrier completion
template <int ST>
__global__ void k_bulk(const char *__restrict__ p, size_t bytes, int ch)
{
    extern __shared__ __align__(128) unsigned char bsm[];
    __shared__ __align__(8) uint64_t full[ST], empty[ST];
    const int tid = threadIdx.x;
    const size_t nch = bytes / ch;
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            asm volatile("mbarrier.init.shared.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&full[s])));
            asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"((unsigned)__cvta_generic_to_shared(&empty[s])), "r"(blockDim.x));
        }
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    unsigned acc = 0;
    size_t c_issue = blockIdx.x, c = blockIdx.x;
    unsigned ph_empty[ST];
    for (int s = 0; s < ST; s++) ph_empty[s] = 0;
    // prologue
    if (tid == 0)
        for (int s = 0; s < ST && c_issue < nch; s++, c_issue += gridDim.x) {
            unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(fb), "r"(ch));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"((unsigned)__cvta_generic_to_shared(bsm + (size_t)s * ch)), "l"(p + c_issue * ch), "r"(ch), "r"(fb) : "memory");
        }
    int s = 0;
    unsigned ph = 0;
    for (; c < nch; c += gridDim.x) {
        unsigned fb = (unsigned)__cvta_generic_to_shared(&full[s]);
        asm volatile("{ .reg .pred P; W: mbarrier.try_wait.parity.shared.b64 P, [%0], %1; @!P bra W; }" ::"r"(fb), "r"(ph));
        const uint4 *q = (const uint4 *)(bsm + (size_t)s * ch);
        for (int i = tid; i < ch / 16; i += blockDim.x) { uint4 x = q[i]; acc ^= x.x ^ x.y ^ x.z ^ x.w; }
        unsigned eb = (unsigned)__cvta_generic_to_shared(&empty[s]);
        asm volatile("mbarrier.arrive.shared.b64 _, [%0];" ::"r"(eb));
        if (tid == 0 && c_issue < nch) {
            asm volatile("{ .reg .pred P; W2: mbarrier.try_wait.parity.shared.b64 P, [%0], %1; @!P bra W2; }" ::"r"(eb), "r"(ph_empty[s]));
            ph_empty[s] ^= 1;
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" ::"r"(fb), "r"(ch));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"((unsigned)__cvta_generic_to_shared(bsm + (size_t)s * ch)), "l"(p + c_issue * ch), "r"(ch), "r"(fb) : "memory");
            c_issue += gridDim.x;
        }
        if (++s == ST) { s = 0; ph ^= 1; }
    }
    if (acc == 0x12345678u) sink = acc;
}

static float med(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

template <typename F>
static float timeit(F f, int reps)
{
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    f(); cudaDeviceSynchronize();
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a); f(); cudaEventRecord(b); cudaEventSynchronize(b);
        float ms; cudaEventElapsedTime(&ms, a, b); t.push_back(ms);
    }
    return med(t);
}

int main()
{
    size_t bytes = (size_t)2 << 30;
    char *a, *b;
    CK(cudaMalloc(&a, bytes)); CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    float ms = timeit([&] { cudaMemcpyAsync(b, a, bytes / 2, cudaMemcpyDeviceToDevice); }, 10);
    printf("copy D2D 1 GiB: %.0f GB/s (read+write)\n", 2.0 * bytes / 2 / ms / 1e6);
    const size_t n = bytes / 16;
    for (int bpsm : {1, 2, 4, 8}) for (int thr : {256, 512, 1024}) {
        if (bpsm * thr > 2048) continue;
        ms = timeit([&] { k_ldg<4><<<sms * bpsm, thr>>>((const uint4 *)a, n); }, 10);
        float ms8 = timeit([&] { k_ldg<8><<<sms * bpsm, thr>>>((const uint4 *)a, n); }, 10);
        printf("ldg  %d blk/SM x %4d thr: U4 %.0f GB/s  U8 %.0f GB/s\n", bpsm, thr, bytes / ms / 1e6, bytes / ms8 / 1e6);
    }
    CK(cudaGetLastError());
    {
        auto k = k_cpasync<4, 2>; size_t sm = 8 * 4 * 2 * 32 * 16;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        for (int bpsm : {2, 3}) { ms = timeit([&] { k<<<sms * bpsm, 256, sm>>>((const uint4 *)a, n); }, 10);
            printf("cp.async ST4 V2 8 warps %d blk/SM: %.0f GB/s\n", bpsm, bytes / ms / 1e6); }
        auto k6 = k_cpasync<6, 2>; size_t sm6 = 8 * 6 * 2 * 32 * 16;
        cudaFuncSetAttribute(k6, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        for (int bpsm : {2, 3}) { ms = timeit([&] { k6<<<sms * bpsm, 256, sm6>>>((const uint4 *)a, n); }, 10);
            printf("cp.async ST6 V2 8 warps %d blk/SM: %.0f GB/s\n", bpsm, bytes / ms / 1e6); }
    }
    CK(cudaGetLastError());
    for (int ch : {4096, 8192, 16384, 32768}) for (int st : {4, 8}) for (int bpsm : {1, 2}) {
        size_t sm = (size_t)st * ch;
        if (sm * bpsm > 220 * 1024) continue;
        auto k = st == 4 ? k_bulk<4> : k_bulk<8>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        ms = timeit([&] { k<<<sms * bpsm, 256, sm>>>(a, bytes, ch); }, 10);
        cudaError_t e = cudaGetLastError();
        printf("bulk ch %5d st %d %d blk/SM: %.0f GB/s %s\n", ch, st, bpsm, bytes / ms / 1e6, e ? cudaGetErrorString(e) : "");
    }
    // smaller sizes like one GEMV: 117 MB and 235 MB
    for (size_t mb : {32, 117, 235}) {
        size_t nn = mb * 1000000 / 16 / 4096 * 4096;
        ms = timeit([&] { k_ldg<4><<<sms * 4, 512>>>((const uint4 *)a, nn); }, 20);
        printf("ldg U4 4x512 %zu MB: %.1f us %.0f GB/s\n", mb, ms * 1e3, nn * 16 / ms / 1e6);
    }
    return 0;
}
