/* gemm_wgmma.cu — the own GEMM for decode batches on Hopper: y[n, m] (+)= x[n, k] . W[m, k]^T
 * (+ bias) for n <= 256 rows, bf16 in and out, fp32 accumulation, one rounding.
 *
 * At decode-batch sizes a flat GEMM has too few output tiles for 132 SMs (4096 x 256 outputs
 * are 32 tiles of 128 x 256), and cuBLASLt's split-K variants reduce through global memory. Here
 * a CTA owns 128 weight rows x all n tokens (n rounded up to 64, 128, 192 or 256 columns of the
 * warpgroup MMA), and `split` CTAs of one thread-block cluster share a tile, each taking a
 * contiguous 1/split of k; their fp32 partial tiles are summed through distributed shared
 * memory, so the only global traffic is W (once), x (from L2) and y (once).
 *
 * One CTA = three warpgroups (384 threads): warpgroup 0's first thread issues the bulk tensor
 * copies (TMA) of a 128 x 64 slice of W and an n x 64 slice of x per stage into a ring of
 * 128-byte-swizzled stages (full/empty mbarriers); warpgroups 1 and 2 each multiply 64 weight
 * rows by all tokens with wgmma (m64nNk16, both operands from shared memory, accumulators in
 * registers). At the end the accumulators are staged as fp32 [token][feature] in the CTA's own
 * shared memory; after a cluster barrier, cluster rank r sums rows r/split of the tile over the
 * cluster's CTAs, adds the bias and (accumulating flavour) y, and writes bf16 rows coalesced.
 *
 * Variants (`own`): 1..4 = that many ranks along k; 5..8 = the same (own - 4 ranks) with pairs of
 * neighbouring tiles in the cluster too, whose CTAs each copy half of the x slice and multicast it
 * to both (half the L2 reads of x, the bigger operand at n = 256).
 *
 * Contract (sf_gemm_wg_ok): compute capability 9.0 exactly (the sm_90a code; the compute_90 PTX
 * of this file traps), 1 <= n <= 256, m % 128 == 0 (% 256 with pairs, and then n > half the
 * rounded-up token columns), k % 64 == 0 with at least one 64-slice per rank along k,
 * ldx % 8 == 0, ldy % 4 == 0, x and W 16-byte aligned, y and bias 8-byte aligned.
 * Used by the tuner as one more candidate per shape and bucket (gemm_tune.cu), so only where it
 * measured fastest. Not thread-safe: the context's one thread. */
#include <cuda.h>
#include <string.h>

#include "gemm_impl.cuh"
#include "gemm_wgmma_ops.cuh"

#define WG_BM 128     /* weight rows per CTA: two consumer warpgroups of 64 */
#define WG_BK 64      /* k per stage: one 128-byte swizzle row of bf16 */
#define WG_THREADS 384
#define WG_RING_BYTES (192 * 1024)

template <int BN> struct wg_cfg {
    static constexpr int A_BYTES = WG_BM * WG_BK * 2;
    static constexpr int B_BYTES = BN * WG_BK * 2;
    static constexpr int STAGE = A_BYTES + B_BYTES;
    static constexpr int STAGES = WG_RING_BYTES / STAGE > 8 ? 8 : WG_RING_BYTES / STAGE;
    static constexpr int LDR = WG_BM + 4; /* fp32 staging row of one token: conflict-free writes */
    static constexpr int SMEM = STAGES * STAGE + 1024; /* + room to align the ring to 1 KiB */
    static_assert(BN * LDR * 4 <= STAGES * STAGE, "the staging tile reuses the ring");
};

#ifdef SF_WGMMA
static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

static __device__ __forceinline__ void mbar_init(uint64_t *b, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}

static __device__ __forceinline__ void mbar_expect_tx(uint64_t *b, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}

static __device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

static __device__ __forceinline__ void mbar_wait(uint64_t *b, unsigned parity)
{
    uint32_t done = 0, a = smem_u32(b);
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* One box of a 2-D tensor map (c0: element along k, c1: row) into shared memory at dst. */
static __device__ __forceinline__ void tma_load(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
                 : "memory");
}

/* Matrix descriptor of a K-major tile in the 128-byte swizzle: 8-row atoms of 128 bytes, 1 KiB
 * apart; p is the tile's (1 KiB-aligned) start plus 32 bytes per 16-element k step. */
static __device__ __forceinline__ uint64_t wg_desc(const void *p)
{
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}

template <int BN> static __device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db)
{
    if (BN == 64) wg_mma_n64(d, da, db);
    else if (BN == 128) wg_mma_n128(d, da, db);
    else if (BN == 192) wg_mma_n192(d, da, db);
    else wg_mma_n256(d, da, db);
}

/* The same box, written to the same shared-memory offset (and completing on the same mbarrier
 * offset) in every CTA of the cluster named in mask. */
static __device__ __forceinline__ void tma_load_mc(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                   uint16_t mask)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
                 " [%0], [%1, {%4, %5}], [%2], %3;"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(smem_u32(bar)), "h"(mask), "r"(c0), "r"(c1)
                 : "memory");
}

/* One arrival on the mbarrier at b's offset in cluster CTA `rank` (this CTA included). */
static __device__ __forceinline__ void mbar_arrive_cluster(uint64_t *b, unsigned rank)
{
    asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\nmbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n"
                 ::"r"(smem_u32(b)), "r"(rank)
                 : "memory");
}

/* 4 bf16 (8-byte aligned) as floats, and back with round-to-nearest. */
static __device__ __forceinline__ float4 ld_bf16x4(const bf16 *p)
{
    uint2 raw = *(const uint2 *)p;
    float2 a = __bfloat1622float2(*(bf162 *)&raw.x), b = __bfloat1622float2(*(bf162 *)&raw.y);
    return make_float4(a.x, a.y, b.x, b.y);
}

static __device__ __forceinline__ void st_bf16x4(bf16 *p, float4 v)
{
    bf162 h0 = __floats2bfloat162_rn(v.x, v.y), h1 = __floats2bfloat162_rn(v.z, v.w);
    uint2 out;
    out.x = *(uint32_t *)&h0;
    out.y = *(uint32_t *)&h1;
    *(uint2 *)p = out;
}

/* silu(gate) * up from fp32 sums, rounded as silu_mul.cu rounds its bf16 inputs */
static __device__ __forceinline__ float glu1(float g, float u)
{
    g = bf2f(f2bf(g));
    return bf2f(f2bf(g / (1.0f + __expf(-g)))) * bf2f(f2bf(u));
}

static __device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

/* 4 floats at p in the shared memory of cluster CTA `rank`. */
static __device__ __forceinline__ float4 ld_cluster4(const float *p, unsigned rank)
{
    uint32_t r;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_u32(p)), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(r)
                 : "memory");
    return v;
}
#endif

/* Grid: m / 128 * split CTAs in clusters of split * MC along x. Cluster rank r: ki = r % split
 * (which k slice), mi = r / split (which of the MC tiles). MC = 2: the two tiles' CTAs of one k
 * slice load half the x box each and multicast it to both (x read from L2 once per pair), so a
 * stage is free for the next copy only when both CTAs' consumers released it: 4 arrivals. */
template <int BN, int MC, int GLU>
static __global__ void __launch_bounds__(WG_THREADS, 1)
    k_gemm_wg(const __grid_constant__ CUtensorMap tw, const __grid_constant__ CUtensorMap tx, int n, int k, int split,
              int f, const bf16 *__restrict__ bias, bf16 *y, int64_t ldy, int acc)
{
#ifdef SF_WGMMA
    typedef wg_cfg<BN> C;
    extern __shared__ uint8_t wg_smem_raw[];
    __shared__ uint64_t full[C::STAGES], empty[C::STAGES];
    uint8_t *sm = wg_smem_raw + ((1024 - (smem_u32(wg_smem_raw) & 1023)) & 1023); /* 1 KiB-aligned shared offset */
    const int cs = split * MC, rank = blockIdx.x % cs, ki = rank % split, mi = rank / split;
    const int tile = blockIdx.x / cs * MC + mi, tid = threadIdx.x, wg = tid / 128;
    const int kt = k / WG_BK, kb0 = ki * kt / split, nk = (ki + 1) * kt / split - kb0;
    if (tid == 0) {
        for (int s = 0; s < C::STAGES; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 2 * MC); /* one arrival per consumer warpgroup of each sharing CTA */
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    cluster_sync(); /* every CTA's barriers are set before any copy or arrival reaches them */
    if (wg == 0) {
        if (tid == 0)
            for (int i = 0; i < nk; i++) {
                const int s = i % C::STAGES;
                if (i >= C::STAGES) mbar_wait(&empty[s], ((i / C::STAGES) & 1) ^ 1);
                uint8_t *a = sm + s * C::STAGE;
                mbar_expect_tx(&full[s], C::STAGE); /* out-of-range token rows arrive as zeros, counted */
                if (GLU) { /* gate rows to the first consumer, the matching up rows to the second */
                    tma_load(a, &tw, &full[s], (kb0 + i) * WG_BK, tile * (WG_BM / 2));
                    tma_load(a + C::A_BYTES / 2, &tw, &full[s], (kb0 + i) * WG_BK, f + tile * (WG_BM / 2));
                } else {
                    tma_load(a, &tw, &full[s], (kb0 + i) * WG_BK, tile * WG_BM);
                }
                if (MC == 1)
                    tma_load(a + C::A_BYTES, &tx, &full[s], (kb0 + i) * WG_BK, 0);
                else
                    tma_load_mc(a + C::A_BYTES + mi * (BN / 2) * 128, &tx, &full[s], (kb0 + i) * WG_BK, mi * (BN / 2),
                                (uint16_t)((1u << ki) | (1u << (split + ki))));
            }
    } else {
        float d[BN / 2];
#pragma unroll
        for (int j = 0; j < BN / 2; j++) d[j] = 0.0f;
        const int c = wg - 1;
        for (int i = 0; i < nk; i++) {
            const int s = i % C::STAGES;
            mbar_wait(&full[s], (i / C::STAGES) & 1);
            const uint8_t *a = sm + s * C::STAGE + c * 64 * 128, *b = sm + s * C::STAGE + C::A_BYTES;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++) wg_mma<BN>(d, wg_desc(a + 32 * kk), wg_desc(b + 32 * kk));
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); /* stage i - 1 is read */
            if (i > 0 && tid % 128 == 0) {
                if (MC == 1) {
                    mbar_arrive(&empty[(i - 1) % C::STAGES]);
                } else {
                    mbar_arrive_cluster(&empty[(i - 1) % C::STAGES], ki);
                    mbar_arrive_cluster(&empty[(i - 1) % C::STAGES], split + ki);
                }
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
        for (int j = 0; j < BN / 2; j++) asm volatile("" : "+f"(d[j])::"memory");
        asm volatile("bar.sync 1, 256;" ::: "memory"); /* both consumers are done with the ring */
        /* accumulator j of lane l, warp w: feature w*16 + l/4 + 8*((j/2)%2), token 8*(j/4) + 2*(l%4) + j%2 */
        float *red = (float *)sm;
        const int lane = tid % 32, f0 = c * 64 + ((tid % 128) / 32) * 16 + lane / 4;
#pragma unroll
        for (int j = 0; j < BN / 2; j++)
            red[(8 * (j / 4) + 2 * (lane % 4) + (j % 2)) * C::LDR + f0 + 8 * ((j / 2) % 2)] = d[j];
    }
    __syncwarp();
    cluster_sync(); /* every CTA's partial tile is staged */
    {
        const float *red = (const float *)sm;
        const int t0 = ki * BN / split, t1 = SF_MIN((ki + 1) * BN / split, n), r0 = mi * split;
        if (GLU) {
            /* y[t, tile*64 + j] = silu(gate) * up, rounded as the GEMM then silu_mul would: the
             * products to bf16, silu(gate) to bf16, the product once more */
            for (int e = tid; e < (t1 - t0) * (WG_BM / 8); e += WG_THREADS) {
                const int t = t0 + e / (WG_BM / 8), j = (e % (WG_BM / 8)) * 4;
                float4 g = ld_cluster4(red + t * C::LDR + j, r0), u = ld_cluster4(red + t * C::LDR + 64 + j, r0);
                for (int q = 1; q < split; q++) {
                    float4 a = ld_cluster4(red + t * C::LDR + j, r0 + q), b = ld_cluster4(red + t * C::LDR + 64 + j, r0 + q);
                    g.x += a.x; g.y += a.y; g.z += a.z; g.w += a.w;
                    u.x += b.x; u.y += b.y; u.z += b.z; u.w += b.w;
                }
                const int64_t col = (int64_t)tile * (WG_BM / 2) + j;
                if (bias) {
                    float4 bg = ld_bf16x4(bias + col), bu = ld_bf16x4(bias + f + col);
                    g.x += bg.x; g.y += bg.y; g.z += bg.z; g.w += bg.w;
                    u.x += bu.x; u.y += bu.y; u.z += bu.z; u.w += bu.w;
                }
                float4 v = make_float4(glu1(g.x, u.x), glu1(g.y, u.y), glu1(g.z, u.z), glu1(g.w, u.w));
                st_bf16x4(y + (int64_t)t * ldy + col, v);
            }
        } else {
            for (int e = tid; e < (t1 - t0) * (WG_BM / 4); e += WG_THREADS) {
                const int t = t0 + e / (WG_BM / 4), j = (e % (WG_BM / 4)) * 4;
                float4 v = ld_cluster4(red + t * C::LDR + j, r0);
                for (int q = 1; q < split; q++) {
                    float4 u = ld_cluster4(red + t * C::LDR + j, r0 + q);
                    v.x += u.x; v.y += u.y; v.z += u.z; v.w += u.w;
                }
                const int64_t col = (int64_t)tile * WG_BM + j;
                if (bias) {
                    float4 b = ld_bf16x4(bias + col);
                    v.x += b.x; v.y += b.y; v.z += b.z; v.w += b.w;
                }
                bf16 *o = y + (int64_t)t * ldy + col;
                if (acc) {
                    float4 a = ld_bf16x4(o);
                    v.x += a.x; v.y += a.y; v.z += a.z; v.w += a.w;
                }
                st_bf16x4(o, v);
            }
        }
    }
    cluster_sync(); /* no CTA leaves while a neighbour still reads its shared memory */
#else
    __trap(); /* the compute_90 PTX pass: sf_gemm_wg_ok admits only the sm_90a code */
#endif
}

/* ---- host ---------------------------------------------------------------------------------- */
typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                              const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                              CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static int wg_bn(int n) { return n <= 64 ? 64 : n <= 128 ? 128 : n <= 192 ? 192 : 256; }

/* A variant `own` (1..8): ranks along k, and 2 when pairs of tiles share x by multicast. */
static int own_split(int own) { return (own - 1) % 4 + 1; }
static int own_mc(int own) { return own > 4 ? 2 : 1; }

template <int MC, int GLU> static int wg_attrs()
{
    const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
    return cudaFuncSetAttribute(k_gemm_wg<64, MC, GLU>, a, wg_cfg<64>::SMEM) ||
           cudaFuncSetAttribute(k_gemm_wg<128, MC, GLU>, a, wg_cfg<128>::SMEM) ||
           cudaFuncSetAttribute(k_gemm_wg<192, MC, GLU>, a, wg_cfg<192>::SMEM) ||
           cudaFuncSetAttribute(k_gemm_wg<256, MC, GLU>, a, wg_cfg<256>::SMEM);
}

/* The context's one-time set-up: the driver's tensor-map encoder, the device's compute
 * capability, the kernels' shared-memory limits. wg_state: 0 not tried, 1 usable, -1 not here. */
static int wg_setup(sf_k_gemm_ctx *g)
{
    if (g->wg_state) return g->wg_state > 0;
    g->wg_state = -1;
    int dev = 0, major = 0, minor = 0;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) || major != 9 || minor != 0 ||
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) ||
        q != cudaDriverEntryPointSuccess || !fn || wg_attrs<1, 0>() || wg_attrs<2, 0>() || wg_attrs<1, 1>() ||
        wg_attrs<2, 1>()) {
        cudaGetLastError();
        return 0;
    }
    g->wg_encode = fn;
    g->wg_state = 1;
    return 1;
}

/* m: weight rows; out: the output's columns (m, or m / 2 for the GLU epilogue) */
static int wg_ok(sf_k_gemm_ctx *g, int own, int n, int m, int k, int64_t ldx, int64_t ldy, int out)
{
    if (own < 1 || own > 8) return 0;
    const int split = own_split(own), mc = own_mc(own);
    return n >= 1 && n <= 256 && m > 0 && m % (WG_BM * mc) == 0 && k > 0 && k % WG_BK == 0 && k / WG_BK >= split &&
           (mc == 1 || n > wg_bn(n) / 2) /* no multicast half wholly past the rows */ && ldx % 8 == 0 && ldx >= k &&
           ldy % 4 == 0 && ldy >= out && wg_setup(g);
}

int sf_gemm_wg_ok(sf_k_gemm_ctx *g, int own, int n, int m, int k, int64_t ldx, int64_t ldy)
{
    return wg_ok(g, own, n, m, k, ldx, ldy, m);
}

/* A 2-D tensor map over rows x k bf16 (row stride ld elements), boxes of box_rows x 64. */
static int wg_map(sf_k_gemm_ctx *g, CUtensorMap *map, const uint16_t *p, int rows, int k, int64_t ld, int box_rows)
{
    cuuint64_t dims[2] = { (cuuint64_t)k, (cuuint64_t)rows }, strides[1] = { (cuuint64_t)ld * 2 };
    cuuint32_t box[2] = { WG_BK, (cuuint32_t)box_rows }, estr[2] = { 1, 1 };
    CUresult r = ((encode_fn)g->wg_encode)(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, estr,
                                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : (int)cudaErrorInvalidValue;
}

template <int BN, int MC, int GLU>
static int wg_launch(const CUtensorMap &tw, const CUtensorMap &tx, int split, int n, int m, int k, const uint16_t *bias,
                     uint16_t *y, int64_t ldy, int acc, cudaStream_t s)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1] = {};
    cfg.gridDim = dim3((unsigned)(m / WG_BM * split));
    cfg.blockDim = dim3(WG_THREADS);
    cfg.dynamicSmemBytes = wg_cfg<BN>::SMEM;
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)(split * MC);
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return (int)cudaLaunchKernelEx(&cfg, k_gemm_wg<BN, MC, GLU>, tw, tx, n, k, split, m / 2, (const bf16 *)bias,
                                   (bf16 *)y, ldy, acc);
}

template <int MC, int GLU>
static int wg_launch_bn(int bn, const CUtensorMap &tw, const CUtensorMap &tx, int split, int n, int m, int k,
                        const uint16_t *bias, uint16_t *y, int64_t ldy, int acc, cudaStream_t s)
{
    switch (bn) {
    case 64: return wg_launch<64, MC, GLU>(tw, tx, split, n, m, k, bias, y, ldy, acc, s);
    case 128: return wg_launch<128, MC, GLU>(tw, tx, split, n, m, k, bias, y, ldy, acc, s);
    case 192: return wg_launch<192, MC, GLU>(tw, tx, split, n, m, k, bias, y, ldy, acc, s);
    default: return wg_launch<256, MC, GLU>(tw, tx, split, n, m, k, bias, y, ldy, acc, s);
    }
}

/* glu: m = 2f weight rows (gate then up), y gets f columns; acc is then 0 */
static int wg_run(sf_k_gemm_ctx *g, int own, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                  int n, int m, int k, uint16_t *y, int64_t ldy, int acc, int glu, cudaStream_t s)
{
    CUtensorMap tw, tx;
    int rc, bn = wg_bn(n), split = own_split(own), mc = own_mc(own);
    if (!wg_ok(g, own, n, m, k, ldx, ldy, glu ? m / 2 : m) || ((uintptr_t)x | (uintptr_t)w) % 16 ||
        ((uintptr_t)y | (uintptr_t)bias) % 8)
        return (int)cudaErrorInvalidValue;
    if ((rc = wg_map(g, &tw, w, m, k, k, glu ? WG_BM / 2 : WG_BM)) || (rc = wg_map(g, &tx, x, n, k, ldx, bn / mc)))
        return rc;
    if (glu)
        return mc == 1 ? wg_launch_bn<1, 1>(bn, tw, tx, split, n, m, k, bias, y, ldy, 0, s)
                       : wg_launch_bn<2, 1>(bn, tw, tx, split, n, m, k, bias, y, ldy, 0, s);
    return mc == 1 ? wg_launch_bn<1, 0>(bn, tw, tx, split, n, m, k, bias, y, ldy, acc, s)
                   : wg_launch_bn<2, 0>(bn, tw, tx, split, n, m, k, bias, y, ldy, acc, s);
}

int sf_gemm_wg_run(sf_k_gemm_ctx *g, int own, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                   int n, int m, int k, uint16_t *y, int64_t ldy, int acc, cudaStream_t s)
{
    return wg_run(g, own, x, ldx, w, bias, n, m, k, y, ldy, acc, 0, s);
}

extern "C" int sf_k_gemm_own_ok(sf_k_gemm_ctx *g, int own, int n, int m, int k, int64_t ldx, int64_t ldy)
{
    return sf_gemm_wg_ok(g, own, n, m, k, ldx, ldy);
}

extern "C" int sf_k_gemm_own(sf_k_gemm_ctx *g, int own, const uint16_t *x, int64_t ldx, const uint16_t *w,
                             const uint16_t *bias, int n, int m, int k, uint16_t *y, int64_t ldy, int acc, cudaStream_t s)
{
    return sf_gemm_wg_run(g, own, x, ldx, w, bias, n, m, k, y, ldy, acc, s);
}

/* The variant for the GLU epilogue at (n, 2f, k): the tuner's fastest own variant for the plain
 * gate/up GEMM of n's bucket (0 when it has none or it does not apply). */
static int glu_variant(sf_k_gemm_ctx *g, int n, int f, int k, int64_t ldx, int64_t ldy)
{
    int nb = sf_k_gemm_bucket(n);
    const tune_entry *t = nb && g->tunes && g->own_glu ? sf_gemm_tune_find(g, 2 * f, k, 0, 0, nb) : NULL;
    return t && t->own_best && wg_ok(g, t->own_best, n, 2 * f, k, ldx, ldy, f) ? t->own_best : 0;
}

extern "C" int sf_k_gemm_glu_ok(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int f, int k, int64_t ldx, int64_t ldy)
{
    return !bias && glu_variant(g, n, f, k, ldx, ldy) > 0;
}

extern "C" int sf_k_gemm_glu(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w, int n, int f, int k,
                             uint16_t *y, int64_t ldy, cudaStream_t s)
{
    int v = glu_variant(g, n, f, k, ldx, ldy);
    return v ? wg_run(g, v, x, ldx, w, NULL, n, 2 * f, k, y, ldy, 0, 1, s) : (int)cudaErrorInvalidValue;
}

extern "C" int sf_k_gemm_own_glu(sf_k_gemm_ctx *g, int own, const uint16_t *x, int64_t ldx, const uint16_t *w,
                                 const uint16_t *bias, int n, int f, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    return wg_run(g, own, x, ldx, w, bias, n, 2 * f, k, y, ldy, 0, 1, s);
}
