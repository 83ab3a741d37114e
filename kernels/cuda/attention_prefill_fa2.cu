/* attention_prefill_fa2.cu — causal prefill attention over the paged KV cache in the style of
 * FlashAttention-2: bf16 mma.sync.m16n8k16 with fp32 accumulation, operands fetched with ldmatrix
 * from XOR-swizzled shared memory, K/V tiles copied with cp.async (double-buffered) straight from
 * the paged blocks, the online softmax kept in registers (exp2 with the scale folded in).
 *
 * Work split: one block (4 warps) per (query tile, head); a query tile is up to 64 consecutive
 * tokens of one sequence at consecutive positions p0 .. p0 + rows - 1 (the host's tile list,
 * kernels.h), so chunked prefill (p0 > 0) and prefix reuse read the earlier keys from the cache.
 * Each warp owns 16 query rows: S = Q K^T for 64 keys (8 n-tiles of m16n8 accumulators), the
 * softmax of its rows, O += P V with P taken directly from the S accumulators (the m16n8k16
 * C layout of two n-tiles is the A layout of one k-step). Key tiles run from the last (the
 * diagonal, where the causal mask and the context end are applied) to the first; the tiles
 * strictly below the diagonal take no mask. Blocks are ordered longest query tile first.
 *
 * Shared memory (head size HD = 64 or 128): Q [64][HD], K [2][64][HD], V [2][64][HD] bf16, rows
 * of HD/8 16-byte chunks stored at chunk ^ (row & 7), so the 8 row addresses of every ldmatrix
 * phase fall in distinct banks. 80 KB for HD = 128: two blocks per SM.
 *
 * INT8 KV blocks (kernels.h) are dequantised by plain loads and shared-memory stores in the same
 * tile loader; bf16 rows go through cp.async. Requires scale > 0 (the max runs on raw scores). */
#include "common.cuh"

#define FA_BQ 64
#define FA_BK 64
#define FA_NT 128

static __device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronous; src_bytes 0 writes zeros (src must still be a valid
 * address). */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

static __device__ __forceinline__ void ldsm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}
static __device__ __forceinline__ void ldsm_x4_t(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_u32(p)));
}

/* d (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col) */
static __device__ __forceinline__ void mma_bf16(float *d, const unsigned *a, unsigned b0, unsigned b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

static __device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

static __device__ __forceinline__ unsigned pack_bf16(float lo, float hi)
{
    bf162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

/* Element offset of 16-byte chunk c of row r in a [rows][HD] swizzled tile. */
template <int HD>
static __device__ __forceinline__ int swz(int r, int c)
{
    return r * HD + ((c ^ (r & 7)) << 3);
}

/* Issues the copies of keys kb .. kb + 63 of kv head kh into K and V (swizzled); keys at or past
 * ctx become zero rows. Thread tid copies chunk tid % (HD/8) of rows tid / (HD/8) + i * FA_NT /
 * (HD/8): 8 (HD 128) or 4 (HD 64) rows of K and of V. */
template <int HD>
static __device__ __forceinline__ void load_kv(const sf_k_kv &kv, const int32_t *bt, int kh, int kb, int ctx, bf16 *K,
                                               bf16 *V)
{
    constexpr int CH = HD / 8, RSTEP = FA_NT / CH;
    const int c = threadIdx.x % CH, r0 = threadIdx.x / CH;
#pragma unroll
    for (int i = 0; i < FA_BK / RSTEP; i++) {
        const int r = r0 + i * RSTEP, p = kb + r, so = swz<HD>(r, c);
        if (p < ctx) {
            int64_t o = sf_kv_row(kv, bt, kh, p);
            if (o & 1) { /* INT8 block: dequantise through registers */
                int64_t row = o >> 1;
                *(bf16x8 *)(K + so) = sf_dequant8((const int8_t *)kv.k + row * HD + c * 8, kv.k_scale[row]);
                *(bf16x8 *)(V + so) = sf_dequant8((const int8_t *)kv.v + row * HD + c * 8, kv.v_scale[row]);
            } else {
                cp_async16(K + so, kv.k + (o >> 1) + c * 8, 16);
                cp_async16(V + so, kv.v + (o >> 1) + c * 8, 16);
            }
        } else {
            cp_async16(K + so, kv.k, 0);
            cp_async16(V + so, kv.v, 0);
        }
    }
}

template <int HD>
__global__ void __launch_bounds__(FA_NT, 2) k_attn_prefill_fa2(sf_k_attn a)
{
    constexpr int CH = HD / 8, KD = HD / 16, ND = HD / 8, NS = FA_BK / 8;
    extern __shared__ __align__(128) unsigned char sm[];
    bf16 *Qs = (bf16 *)sm, *Ks = Qs + FA_BQ * HD, *Vs = Ks + 2 * FA_BK * HD;

    const int h = blockIdx.x, tile = a.n_tiles - 1 - (int)blockIdx.y; /* longest tiles first */
    const int kh = h / (a.H / a.Hkv), tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int t0 = a.tiles[2 * tile], nrows = a.tiles[2 * tile + 1];
    const int seq = a.tok_seq[t0], pos0 = a.pos[t0], ctx = a.pos[t0 + nrows - 1] + 1;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int n_kt = (ctx + FA_BK - 1) / FA_BK;
    const float sl2 = a.scale * 1.4426950408889634f; /* scores in log2 units */

    /* Q tile (rows past the tile zero) and the last key tile: group 0 */
    {
        const int c = tid % CH;
        for (int r = tid / CH; r < FA_BQ; r += FA_NT / CH) {
            const bf16 *src = (const bf16 *)a.q + (int64_t)(t0 + (r < nrows ? r : 0)) * a.ld_q + (int64_t)h * HD + c * 8;
            cp_async16(Qs + swz<HD>(r, c), src, r < nrows ? 16 : 0);
        }
    }
    load_kv<HD>(a.kv, bt, kh, (n_kt - 1) * FA_BK, ctx, Ks, Vs);
    cp_async_commit();

    const int g = lane >> 2, tq = lane & 3, r0 = warp * 16;
    const int qposA = pos0 + r0 + g, qposB = qposA + 8;
    unsigned qf[KD][4];
    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.0f, lB = 0.0f;

    for (int it = 0; it < n_kt; it++) {
        const int kb = (n_kt - 1 - it) * FA_BK, buf = it & 1;
        const bf16 *K = Ks + buf * FA_BK * HD, *V = Vs + buf * FA_BK * HD;
        if (it + 1 < n_kt) load_kv<HD>(a.kv, bt, kh, kb - FA_BK, ctx, Ks + (buf ^ 1) * FA_BK * HD, Vs + (buf ^ 1) * FA_BK * HD);
        cp_async_commit();
        cp_async_wait<1>(); /* everything but the tile just issued has landed */
        __syncthreads();
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KD; kk++)
                ldsm_x4(qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3],
                        Qs + swz<HD>(r0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kk + (lane >> 4)));
        }

        /* S = Q K^T: 16 rows x 64 keys per warp */
        float s[NS][4];
#pragma unroll
        for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KD; kk++) {
#pragma unroll
            for (int np = 0; np < NS / 2; np++) {
                unsigned b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3, K + swz<HD>(np * 16 + (lane & 7) + (lane >> 4) * 8, 2 * kk + ((lane >> 3) & 1)));
                mma_bf16(s[2 * np], qf[kk], b0, b1);
                mma_bf16(s[2 * np + 1], qf[kk], b2, b3);
            }
        }

        /* causal mask (and the context end) only where a key can pass the first query */
        if (kb + FA_BK - 1 > pos0) {
#pragma unroll
            for (int n = 0; n < NS; n++) {
                const int key = kb + n * 8 + 2 * tq;
                if (key > qposA) s[n][0] = -INFINITY;
                if (key + 1 > qposA) s[n][1] = -INFINITY;
                if (key > qposB) s[n][2] = -INFINITY;
                if (key + 1 > qposB) s[n][3] = -INFINITY;
            }
        }

        /* online softmax: rows g (A) and g + 8 (B) of the warp's 16, four lanes per row */
        float mxA = mA, mxB = mB;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            mxA = fmaxf(mxA, fmaxf(s[n][0], s[n][1]));
            mxB = fmaxf(mxB, fmaxf(s[n][2], s[n][3]));
        }
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
        mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
        mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
        /* a row with no key yet keeps max -inf: subtract 0 instead so exp2 gives 0, not NaN */
        const float bA = mxA == -INFINITY ? 0.0f : mxA * sl2, bB = mxB == -INFINITY ? 0.0f : mxB * sl2;
        const float alA = fast_exp2(mA * sl2 - bA), alB = fast_exp2(mB * sl2 - bB);
        mA = mxA;
        mB = mxB;
        float sumA = 0.0f, sumB = 0.0f;
#pragma unroll
        for (int n = 0; n < NS; n++) {
            s[n][0] = fast_exp2(fmaf(s[n][0], sl2, -bA));
            s[n][1] = fast_exp2(fmaf(s[n][1], sl2, -bA));
            s[n][2] = fast_exp2(fmaf(s[n][2], sl2, -bB));
            s[n][3] = fast_exp2(fmaf(s[n][3], sl2, -bB));
            sumA += s[n][0] + s[n][1];
            sumB += s[n][2] + s[n][3];
        }
        lA = lA * alA + sumA;
        lB = lB * alB + sumB;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= alA;
            o[n][1] *= alA;
            o[n][2] *= alB;
            o[n][3] *= alB;
        }

        /* O += P V: P's k-step kk is S n-tiles 2kk, 2kk + 1 */
#pragma unroll
        for (int kk = 0; kk < FA_BK / 16; kk++) {
            unsigned pa[4] = { pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                               pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]) };
#pragma unroll
            for (int dp = 0; dp < ND / 2; dp++) {
                unsigned b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3, V + swz<HD>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * dp + (lane >> 4)));
                mma_bf16(o[2 * dp], pa, b0, b1);
                mma_bf16(o[2 * dp + 1], pa, b2, b3);
            }
        }
        __syncthreads(); /* this buffer is refilled by the next iteration's copies */
    }

    /* out = O / l, staged through this warp's own rows of Q for 16-byte stores */
    lA += __shfl_xor_sync(0xffffffffu, lA, 1);
    lA += __shfl_xor_sync(0xffffffffu, lA, 2);
    lB += __shfl_xor_sync(0xffffffffu, lB, 1);
    lB += __shfl_xor_sync(0xffffffffu, lB, 2);
    const float iA = lA > 0.0f ? 1.0f / lA : 0.0f, iB = lB > 0.0f ? 1.0f / lB : 0.0f;
    const int rA = r0 + g, rB = rA + 8;
#pragma unroll
    for (int n = 0; n < ND; n++) {
        *(unsigned *)(Qs + swz<HD>(rA, n) + 2 * tq) = pack_bf16(o[n][0] * iA, o[n][1] * iA);
        *(unsigned *)(Qs + swz<HD>(rB, n) + 2 * tq) = pack_bf16(o[n][2] * iB, o[n][3] * iB);
    }
    __syncwarp();
#pragma unroll
    for (int i = lane; i < 16 * CH; i += 32) {
        const int r = r0 + i / CH, c = i % CH;
        if (r < nrows)
            *(bf16x8 *)((bf16 *)a.out + (int64_t)(t0 + r) * a.ld_out + (int64_t)h * HD + c * 8) =
                *(const bf16x8 *)(Qs + swz<HD>(r, c));
    }
}

template <int HD>
static int launch_fa2(const sf_k_attn *a, cudaStream_t s)
{
    static int smem_set; /* the launch thread is the backend's only thread */
    const int smem = 5 * FA_BQ * HD * 2;
    if (!smem_set) {
        cudaError_t e = cudaFuncSetAttribute(k_attn_prefill_fa2<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return (int)e;
        smem_set = 1;
    }
    dim3 grid(a->H, a->n_tiles);
    k_attn_prefill_fa2<HD><<<grid, FA_NT, smem, s>>>(*a);
    return sf_launch_status();
}

extern "C" int sf_k_attention_prefill_fa2_ok(const sf_k_attn *a)
{
    return (a->hd == 64 || a->hd == 128) && a->scale > 0.0f && a->Hkv > 0 && a->H % a->Hkv == 0 && a->tiles &&
           a->n_tiles <= 65535 && a->ld_q % 8 == 0 && a->ld_out % 8 == 0 && a->kv.head_dim == a->hd;
}

extern "C" int sf_k_attention_prefill_fa2(const sf_k_attn *a, cudaStream_t s)
{
    if (a->n_tiles <= 0) return 0;
    if (!sf_k_attention_prefill_fa2_ok(a)) return (int)cudaErrorInvalidValue;
    return a->hd == 128 ? launch_fa2<128>(a, s) : launch_fa2<64>(a, s);
}
