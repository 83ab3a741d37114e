/* rope_kv.cu — RoPE on q and k fused with the write of k and v into the paged cache.
 * One block per token: rotate in place (fp32 math on bf16 values), barrier, then copy the
 * token's k and v heads into its slot. */
#include "common.cuh"

__global__ void k_rope_kv(bf16 *qkv, int64_t ld, const int32_t *pos, const int32_t *slot, int H, int Hkv,
                          int hd, int rot, int interleaved, const float *inv_freq, sf_k_kv kv)
{
    int t = blockIdx.x;
    bf16 *row = qkv + (int64_t)t * ld;
    float p = (float)pos[t];
    int half = rot / 2;
    int n_pairs = (H + Hkv) * half;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        int h = i / half, j = i - h * half;
        bf16 *hp = row + (int64_t)h * hd;
        int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        float x0 = bf2f(hp[a]), x1 = bf2f(hp[b]);
        hp[a] = f2bf(x0 * c - x1 * s);
        hp[b] = f2bf(x1 * c + x0 * s);
    }
    int sl = slot[t];
    if (sl < 0) return;
    __syncthreads();
    int64_t blk = sl / kv.block_size, off = sl % kv.block_size;
    const bf16 *k = row + (int64_t)H * hd, *v = k + (int64_t)Hkv * hd;
    int n = Hkv * hd;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int h = i / hd, d = i - h * hd;
        int64_t dst = ((blk * Hkv + h) * kv.block_size + off) * hd + d;
        ((bf16 *)kv.k)[dst] = k[i];
        ((bf16 *)kv.v)[dst] = v[i];
    }
}

extern "C" int sf_k_rope_kv(uint16_t *qkv, int64_t ld, int T, const int32_t *pos, const int32_t *slot,
                            int H, int Hkv, int hd, int rot_dim, int interleaved, const float *inv_freq,
                            sf_k_kv kv, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv || kv.head_dim != hd) return (int)cudaErrorInvalidValue;
    k_rope_kv<<<T, 128, 0, s>>>((bf16 *)qkv, ld, pos, slot, H, Hkv, hd, rot_dim, interleaved, inv_freq, kv);
    return sf_launch_status();
}
