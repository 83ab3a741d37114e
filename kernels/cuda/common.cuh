/* common.cuh — helpers shared by the CUDA kernels: bf16 conversions, warp reductions, the
 * launch-check convention. Device code only; the C-callable API is in kernels.h. */
#ifndef SF_KERNELS_COMMON_CUH
#define SF_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

typedef __nv_bfloat16 bf16;
typedef __nv_bfloat162 bf162;

static __device__ __forceinline__ float sf_ld_bf16(const uint16_t *p) { return __bfloat162float(*(const bf16 *)p); }
static __device__ __forceinline__ float bf2f(bf16 v) { return __bfloat162float(v); }
static __device__ __forceinline__ bf16 f2bf(float v) { return __float2bfloat16_rn(v); }

/* %globaltimer: ns, the same clock on every SM. */
static __device__ __forceinline__ uint64_t global_ns(void)
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum for blockDim.x a multiple of 32 (<= 1024). `red` is >= 32 floats of shared
 * memory. Every thread gets the result. */
static __device__ __forceinline__ float block_sum(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0.0f;
    return warp_sum(v);
}

/* 8 bf16 in one 16-byte load. */
struct __align__(16) bf16x8 { bf162 h[4]; };

/* Row (token p of kv head kh) of the paged cache: for a bf16 block, 2 * (element offset of the
 * row); for an INT8 block (kv.i8_base, kernels.h), 2 * (row index) + 1: the int8 values start at
 * row * hd, the scale is scale[row]. */
static __device__ __forceinline__ int64_t sf_kv_row(const sf_k_kv &kv, const int32_t *bt, int kh, int p)
{
    const int bs = kv.block_size;
    int64_t id = bt[p / bs];
    if (kv.i8_base && id >= kv.i8_base)
        return ((((id - kv.i8_base) * kv.n_kv_heads + kh) * bs + p % bs) << 1) | 1;
    return (((id * kv.n_kv_heads + kh) * bs + p % bs) * kv.head_dim) << 1;
}

/* 8 int8 values times a scale, as 8 bf16. */
static __device__ __forceinline__ bf16x8 sf_dequant8(const int8_t *q, float s)
{
    int2 raw = *(const int2 *)q;
    const int8_t *b = (const int8_t *)&raw;
    bf16x8 r;
#pragma unroll
    for (int i = 0; i < 4; i++) r.h[i] = __floats2bfloat162_rn((float)b[2 * i] * s, (float)b[2 * i + 1] * s);
    return r;
}

/* Loads the K and V rows of keys kb .. kb + rows - 1 of kv head kh (head_dim hd, hd % 8 == 0)
 * from the paged cache into shared memory as bf16 (INT8 blocks dequantised): K to Kd (row stride
 * ldk, rows 4-byte aligned), V to Vd (row stride ldv, rows 16-byte aligned); keys at or past
 * `valid` become zero rows. The rows are looked up once per key (koff: `rows` int64 of shared
 * memory, sf_kv_row), then every thread has 4 independent 16-byte (bf16) or 8-byte (int8)
 * loads of K and of V in flight at a time. Ends with __syncthreads. */
static __device__ __forceinline__ void sf_load_kv_tile(const sf_k_kv &kv, const int32_t *bt, int kh, int hd, int kb,
                                                       int rows, int valid, bf16 *Kd, int ldk, bf16 *Vd, int ldv,
                                                       int64_t *koff)
{
    const int tid = threadIdx.x, nt = blockDim.x, h8 = hd / 8, items = rows * h8;
    const uint16_t *kc = kv.k, *vc = kv.v;
    for (int j = tid; j < rows; j += nt) {
        int p = kb + j;
        koff[j] = p < valid ? sf_kv_row(kv, bt, kh, p) : -1;
    }
    __syncthreads();
    for (int base = tid; base < items; base += 4 * nt) {
        bf16x8 kr[4], vr[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = base + u * nt;
            int64_t o = i < items ? koff[i / h8] : -1;
            if (o >= 0 && (o & 1)) {
                int64_t row = o >> 1;
                int d = (i % h8) * 8;
                kr[u] = sf_dequant8((const int8_t *)kc + row * hd + d, kv.k_scale[row]);
                vr[u] = sf_dequant8((const int8_t *)vc + row * hd + d, kv.v_scale[row]);
            } else if (o >= 0) {
                int d = (i % h8) * 8;
                kr[u] = *(const bf16x8 *)(kc + (o >> 1) + d);
                vr[u] = *(const bf16x8 *)(vc + (o >> 1) + d);
            } else {
                memset(&kr[u], 0, sizeof kr[u]);
                memset(&vr[u], 0, sizeof vr[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = base + u * nt;
            if (i < items) {
                int j = i / h8, d = (i % h8) * 8;
                bf162 *kd = (bf162 *)(Kd + j * ldk + d);
#pragma unroll
                for (int q = 0; q < 4; q++) kd[q] = kr[u].h[q];
                *(bf16x8 *)(Vd + j * ldv + d) = vr[u];
            }
        }
    }
    __syncthreads();
}

/* ---- tensor-core building blocks (sm_80+) ------------------------------------------------------
 * sf_cp_async16: 16 bytes global -> shared without registers; src_bytes 0 writes zeros (src must
 * still be a valid address). Groups: sf_cp_async_commit closes the copies issued so far into a
 * group; sf_cp_async_wait<N> waits until at most N groups are pending (then __syncthreads for
 * other threads' copies). sf_ldsm_x4(_t): ldmatrix of four 8x8 b16 matrices, lanes 8j..8j+7
 * giving the row addresses of matrix j (16-byte aligned); register j of lane l holds row l / 4,
 * columns 2 (l % 4), +1 of matrix j (_t: the transpose). sf_mma_bf16: d (m16n8, fp32) += a (m16k16
 * bf16, row) * b (k16n8 bf16, col) in the PTX fragment layouts. */
static __device__ __forceinline__ void sf_cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src),
                 "r"(src_bytes));
}
static __device__ __forceinline__ void sf_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void sf_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
static __device__ __forceinline__ void sf_ldsm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
static __device__ __forceinline__ void sf_ldsm_x4_t(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
}
/* pure register arithmetic: not volatile, so the compiler may schedule it */
static __device__ __forceinline__ void sf_mma_bf16(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* two floats as a bf16 pair, lo in the low half (the lower column of a fragment) */
static __device__ __forceinline__ unsigned sf_pack_bf16(float lo, float hi)
{
    bf162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

/* Programmatic dependent launch (sm_90), for kernels whose first work does not depend on the
 * kernel before them (a GEMV's weights, a step's block table). A kernel launched with
 * sf_launch_pdl may start while the previous kernel in the stream is still running, once every
 * block of that kernel has called sf_pdl_trigger (or exited); it must call sf_pdl_wait before it
 * reads anything an earlier kernel of the step writes, and before it writes anything. What runs
 * before the wait may read only memory no kernel of the step writes (weights, metadata copied
 * before the step's first kernel). Both are no-ops for kernels launched without the attribute. */
static __device__ __forceinline__ void sf_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

static __device__ __forceinline__ void sf_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* Synchronisation between blocks (scope gpu) and between devices and the host (scope sys), as
 * CUTLASS's barrier does it: a block's writes, then __syncthreads, then one thread's release (or
 * acq_rel) operation publishes every write of the block (release is cumulative over the
 * barrier); one thread's acquire, then __syncthreads, makes them visible to the whole block. No
 * fence.sc (`__threadfence`, membar.gl) on the way. sf_ld_acquire_gpu, sf_st_release_sys, ... */
#define SF_SCOPED_ST(sem, scope)                                                                                \
    static __device__ __forceinline__ void sf_st_##sem##_##scope(unsigned *p, unsigned v)                     \
    {                                                                                                           \
        asm volatile("st." #sem "." #scope ".global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");               \
    }
#define SF_SCOPED_LD(sem, scope)                                                                                \
    static __device__ __forceinline__ unsigned sf_ld_##sem##_##scope(const unsigned *p)                       \
    {                                                                                                           \
        unsigned v;                                                                                             \
        asm volatile("ld." #sem "." #scope ".global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");             \
        return v;                                                                                               \
    }
#define SF_SCOPED_SYNC(scope)                                                                                   \
    static __device__ __forceinline__ unsigned sf_atom_add_acq_rel_##scope(unsigned *p, unsigned v)           \
    {                                                                                                           \
        unsigned old;                                                                                           \
        asm volatile("atom.add.acq_rel." #scope ".global.u32 %0, [%1], %2;"                                   \
                     : "=r"(old)                                                                                \
                     : "l"(p), "r"(v)                                                                           \
                     : "memory");                                                                               \
        return old;                                                                                             \
    }                                                                                                           \
    static __device__ __forceinline__ void sf_red_add_release_##scope(unsigned *p, unsigned v)                \
    {                                                                                                           \
        asm volatile("red.release." #scope ".global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");           \
    }                                                                                                           \
    SF_SCOPED_ST(release, scope)                                                                                \
    SF_SCOPED_ST(relaxed, scope)                                                                                \
    SF_SCOPED_LD(acquire, scope)                                                                                \
    SF_SCOPED_LD(relaxed, scope)
SF_SCOPED_SYNC(gpu)
SF_SCOPED_SYNC(sys)
#undef SF_SCOPED_SYNC
#undef SF_SCOPED_LD
#undef SF_SCOPED_ST

/* 1 unless SEMFLOW_CUDA_PDL=0 (read once). */
static inline int sf_pdl_enabled(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("SEMFLOW_CUDA_PDL");
        on = !(e && e[0] == '0');
    }
    return on;
}

/* kernel<<<grid, block, smem, s>>>(args...) with programmatic stream serialisation allowed
 * (when sf_pdl_enabled). Returns the cudaError_t of the launch. */
template <typename... P, typename... A>
static inline int sf_launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = sf_pdl_enabled() ? 1 : 0;
    return (int)cudaLaunchKernelEx(&cfg, kernel, ((P)args)...);
}

/* ---- more tensor-core building blocks (beside the ones above) ------------------------------ */
/* 4 bytes global -> shared (cp.async.ca), in the current group. */
static __device__ __forceinline__ void sf_cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
/* sf_mma_bf16 with fp16 inputs */
static __device__ __forceinline__ void sf_mma_f16(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* The 8x8 b16 matrix whose fragment (row lane / 4, columns 2 (lane % 4), +1) is x, transposed, as
 * the same kind of fragment (turns an accumulator tile into a B operand). */
static __device__ __forceinline__ unsigned sf_movmatrix_trans(unsigned x)
{
    unsigned y;
    asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}
/* two floats as an fp16 pair, lo in the low half */
static __device__ __forceinline__ unsigned sf_pack_f16(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *(unsigned *)&h;
}

/* Status of the last launch, as the C API returns it. */
static inline int sf_launch_status(void) { return (int)cudaGetLastError(); }

#define SF_MIN(a, b) ((a) < (b) ? (a) : (b))

/* ---- per-device caches ------------------------------------------------------------------------
 * A kernel's attributes (max dynamic shared memory, carveout) and a device's figures (SM count)
 * belong to a DEVICE, and one process may drive several (a launch thread per device), so what a
 * launch site caches is kept per device: slot sf_k_dev(), the calling thread's current device
 * (-1 past SF_K_MAX_DEVICES: nothing cached, the attribute set at every launch). Threads on
 * different devices touch different slots. */
#define SF_K_MAX_DEVICES 16

static inline int sf_k_dev(void)
{
    int d = -1;
    return cudaGetDevice(&d) == cudaSuccess && d >= 0 && d < SF_K_MAX_DEVICES ? d : -1;
}

/* A launch site's record of what it set, zero-initialised (a static). */
struct sf_k_smem {
    size_t bytes[SF_K_MAX_DEVICES];
};

/* Kernel fn's max dynamic shared memory raised to `bytes` on the current device (and, with
 * carveout, all of L1 asked for as shared memory), once per device and size (have: the launch
 * site's record, one per kernel instance). 0 or a cudaError_t. Set at every size: the default
 * limit is 48 KiB less the kernel's static shared memory, so no size is safe without it. */
template <typename F>
static inline int sf_k_smem_attr(sf_k_smem *have, F *fn, size_t bytes, bool carveout = false)
{
    if (!bytes && !carveout) return 0;
    const int d = sf_k_dev();
    if (d >= 0 && have->bytes[d] >= bytes) return 0;
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e == cudaSuccess && carveout)
        e = cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, (int)cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return (int)e;
    if (d >= 0) have->bytes[d] = bytes;
    return 0;
}

/* The current device's SM count (cached per device), `dflt` when it cannot be read. */
static inline int sf_k_sm_count(int dflt)
{
    static int sms[SF_K_MAX_DEVICES];
    int dev = -1, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) {
        cudaGetLastError();
        return dflt;
    }
    if (dev < SF_K_MAX_DEVICES && sms[dev] > 0) return sms[dev];
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
        cudaGetLastError();
        return dflt;
    }
    if (dev < SF_K_MAX_DEVICES) sms[dev] = v;
    return v;
}

/* Threads a block for an elementwise kernel of `items` vectors (add, silu_mul): 256, or 64 for
 * calls below two 256-thread blocks an SM (decode), so that they reach more SMs. */
static inline int sf_k_vec_threads(int64_t items)
{
    return items >= (int64_t)sf_k_sm_count(132) * 256 * 2 ? 256 : 64;
}

/* Registers a block of `threads` threads of a kernel (attributes a) takes of its SM's file: they
 * are allocated per warp, in steps of 8 per thread. */
static inline int sf_k_block_regs(const cudaFuncAttributes &a, int threads)
{
    return (a.numRegs + 7) / 8 * 8 * threads;
}

static inline unsigned sf_div_up(long a, long b) { return (unsigned)((a + b - 1) / b); }

#endif
