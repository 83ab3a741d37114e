/* convert.cu — weight conversion to bf16 at upload (F32 / F16 / BF16 / Q8_0 sources), bf16 to
 * fp32 for downloads, and a deterministic random fill (calibration and tests). */
#include "common.cuh"

/* sf_dtype values from hal.h (kernels know hal types; the enum is mirrored to keep C++ out of
 * the C header's way). */
enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_Q8_0 = 3 };

__global__ void k_to_bf16(const void *src, int dt, int64_t rows, int64_t cols, bf16 *dst, int64_t ld)
{
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        float v;
        switch (dt) {
        case DT_F32: v = ((const float *)src)[i]; break;
        case DT_F16: v = __half2float(((const __half *)src)[i]); break;
        case DT_BF16: v = bf2f(((const bf16 *)src)[i]); break;
        default: { /* Q8_0: per row cols/32 blocks of {fp16 d, int8 q[32]} */
            const uint8_t *row = (const uint8_t *)src + r * (cols / 32) * 34;
            const uint8_t *blk = row + (c / 32) * 34;
            __half d;
            memcpy(&d, blk, 2);
            v = __half2float(d) * (float)(int8_t)blk[2 + (c & 31)];
        }
        }
        dst[r * ld + c] = f2bf(v);
    }
}

extern "C" int sf_k_to_bf16(const void *src, int src_dtype, int64_t rows, int64_t cols, uint16_t *dst,
                            int64_t ld_dst, cudaStream_t s)
{
    if (src_dtype < DT_F32 || src_dtype > DT_Q8_0) return (int)cudaErrorInvalidValue;
    int64_t n = rows * cols;
    if (n == 0) return 0;
    unsigned grid = (unsigned)SF_MIN(sf_div_up(n, 256), 65535u * 8);
    k_to_bf16<<<grid, 256, 0, s>>>(src, src_dtype, rows, cols, (bf16 *)dst, ld_dst);
    return sf_launch_status();
}

__global__ void k_bf16_to_f32(const bf16 *src, int64_t ld, int64_t rows, int64_t cols, float *dst)
{
    int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i - r * cols;
        dst[i] = bf2f(src[r * ld + c]);
    }
}

extern "C" int sf_k_bf16_to_f32(const uint16_t *src, int64_t ld_src, int64_t rows, int64_t cols, float *dst,
                                cudaStream_t s)
{
    int64_t n = rows * cols;
    if (n == 0) return 0;
    unsigned grid = (unsigned)SF_MIN(sf_div_up(n, 256), 65535u * 8);
    k_bf16_to_f32<<<grid, 256, 0, s>>>((const bf16 *)src, ld_src, rows, cols, dst);
    return sf_launch_status();
}

static __device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__global__ void k_fill_random(bf16 *dst, int64_t n, uint64_t seed, float scale)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1));
        float u = (float)(z >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
        dst[i] = f2bf((2.0f * u - 1.0f) * scale);
    }
}

extern "C" int sf_k_fill_random(uint16_t *dst, int64_t n, uint64_t seed, float scale, cudaStream_t s)
{
    if (n == 0) return 0;
    unsigned grid = (unsigned)SF_MIN(sf_div_up(n, 256), 65535u * 8);
    k_fill_random<<<grid, 256, 0, s>>>((bf16 *)dst, n, seed, scale);
    return sf_launch_status();
}

/* One thread that holds the stream for ns nanoseconds (%globaltimer). */
__global__ void k_hold(uint64_t ns)
{
    const uint64_t t0 = global_ns();
    do __nanosleep(1000);
    while (global_ns() - t0 < ns);
}

extern "C" int sf_k_hold(uint64_t ns, cudaStream_t s)
{
    k_hold<<<1, 1, 0, s>>>(ns);
    return sf_launch_status();
}
