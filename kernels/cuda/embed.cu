/* embed.cu — embedding gather and row gather (logit rows): one block per output row,
 * 16-byte copies when the row allows them. */
#include "common.cuh"

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
    bool vec = (d % 8 == 0) && (ld_src % 8 == 0) && (ld_dst % 8 == 0) &&
               ((uintptr_t)src % 16 == 0) && ((uintptr_t)dst % 16 == 0);
    if (vec) {
        const bf16x8 *i8 = (const bf16x8 *)in;
        bf16x8 *o8 = (bf16x8 *)o;
        for (int64_t c = threadIdx.x; c < d / 8; c += blockDim.x) o8[c] = i8[c];
    } else {
        for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = in[c];
    }
}

extern "C" int sf_k_embed(const uint16_t *emb, int64_t vocab, int64_t d, const int32_t *tokens, int T,
                          uint16_t *x, int64_t ldx, cudaStream_t s)
{
    if (T <= 0) return 0;
    k_gather_rows<<<T, 128, 0, s>>>((const bf16 *)emb, d, vocab, tokens, d, (bf16 *)x, ldx);
    return sf_launch_status();
}

extern "C" int sf_k_get_rows(const uint16_t *x, int64_t ldx, const int32_t *rows, int n, int64_t d,
                             uint16_t *out, int64_t ldo, cudaStream_t s)
{
    if (n <= 0) return 0;
    k_gather_rows<<<n, 128, 0, s>>>((const bf16 *)x, ldx, INT64_MAX, rows, d, (bf16 *)out, ldo);
    return sf_launch_status();
}
