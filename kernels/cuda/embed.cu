/* embed.cu — embedding gather and row gather (logit rows).
 * Grid (output row, chunk of EM_THREADS x EM_UNROLL 16-byte vectors): each thread issues its
 * EM_UNROLL loads before its stores, so a 4096-wide row is one block with every load in flight
 * at once. Rows that do not allow 16-byte copies take the element-wise kernel. */
#include "b1trace.cuh"
#include "common.cuh"

#define EM_THREADS 128
#define EM_UNROLL 4

__global__ void k_gather_rows(const bf16 *src, int64_t ld_src, int64_t n_src, const int32_t *idx, int64_t d,
                              bf16 *dst, int64_t ld_dst)
{
    int i = blockIdx.x;
    int64_t r = idx[i];
    bf16 *o = dst + i * ld_dst;
    if (r < 0 || r >= n_src) { /* the host validates ids; a zero row keeps a bad one contained */
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = f2bf(0.0f);
        return;
    }
    const bf16 *in = src + r * ld_src;
    for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = in[c];
}

/* d % 8 == 0, ld_src and ld_dst multiples of 8, 16-byte aligned bases; dv = d / 8. */
__global__ void __launch_bounds__(EM_THREADS) k_gather_rows_vec(const bf16 *__restrict__ src, int64_t ld_src,
                                                                int64_t n_src, const int32_t *__restrict__ idx,
                                                                int64_t dv, bf16 *__restrict__ dst, int64_t ld_dst)
{
    __shared__ sf_tr tr;
    tr_begin(tr);
    /* the kernel after it (a batch-1 step's QKV projection) may start and stream its weights:
     * it reads the row only after its programmatic wait (1.7-2.6 us a step, traced) */
    sf_pdl_trigger();
    const int64_t r = idx[blockIdx.x];
    bf16x8 *o = (bf16x8 *)(dst + blockIdx.x * ld_dst);
    const int64_t c0 = (int64_t)blockIdx.y * EM_THREADS * EM_UNROLL + threadIdx.x;
    bf16x8 v[EM_UNROLL];
    const bool ok = r >= 0 && r < n_src; /* the host validates ids; a zero row keeps a bad one contained */
    const bf16x8 *in = (const bf16x8 *)(src + (ok ? r : 0) * ld_src);
#pragma unroll
    for (int u = 0; u < EM_UNROLL; u++) {
        int64_t c = c0 + u * EM_THREADS;
        if (ok && c < dv) v[u] = in[c];
        else memset(&v[u], 0, sizeof v[u]);
    }
#pragma unroll
    for (int u = 0; u < EM_UNROLL; u++) {
        int64_t c = c0 + u * EM_THREADS;
        if (c < dv) o[c] = v[u];
    }
    tr_end(tr, SF_TR_EMBED, (int)(dv * 8), gridDim.x);
}

SF_TR_SETTER(sf_k_embed_trace)

static int gather(const bf16 *src, int64_t ld_src, int64_t n_src, const int32_t *idx, int n, int64_t d, bf16 *dst,
                  int64_t ld_dst, cudaStream_t s)
{
    if (n <= 0) return 0;
    if (d % 8 == 0 && ld_src % 8 == 0 && ld_dst % 8 == 0 && (uintptr_t)src % 16 == 0 && (uintptr_t)dst % 16 == 0) {
        int64_t dv = d / 8;
        dim3 grid((unsigned)n, sf_div_up(dv, EM_THREADS * EM_UNROLL));
        k_gather_rows_vec<<<grid, EM_THREADS, 0, s>>>(src, ld_src, n_src, idx, dv, dst, ld_dst);
    } else {
        k_gather_rows<<<n, EM_THREADS, 0, s>>>(src, ld_src, n_src, idx, d, dst, ld_dst);
    }
    return sf_launch_status();
}

extern "C" int sf_k_embed(const uint16_t *emb, int64_t vocab, int64_t d, const int32_t *tokens, int T,
                          uint16_t *x, int64_t ldx, cudaStream_t s)
{
    return gather((const bf16 *)emb, d, vocab, tokens, T, d, (bf16 *)x, ldx, s);
}

extern "C" int sf_k_get_rows(const uint16_t *x, int64_t ldx, const int32_t *rows, int n, int64_t d,
                             uint16_t *out, int64_t ldo, cudaStream_t s)
{
    return gather((const bf16 *)x, ldx, INT64_MAX, rows, n, d, (bf16 *)out, ldo, s);
}
