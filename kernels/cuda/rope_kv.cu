/* rope_kv.cu — RoPE on q and k fused with the write of k and v into the paged cache.
 * One block per (token, head): q heads are rotated in place, k heads rotated in place and
 * written to the token's slot, v heads copied to it (fp32 math on bf16 values). A slot in an
 * INT8 block gets the head quantised: the block's threads find max|x| together, then each
 * writes its share of int8 values; thread 0 writes the scale. */
#include "common.cuh"

/* q[d] = round(x[d] / s), s = max|x| / 127 (0 for a zero row), over hd values; all threads of
 * the block call it (it synchronises). x is global memory written by this block before. */
static __device__ void quant_store(const bf16 *x, int hd, int8_t *q, float *scale)
{
    __shared__ float red[32];
    __syncthreads(); /* x fully written by every thread */
    float m = 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) m = fmaxf(m, fabsf(bf2f(x[d])));
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) amax = fmaxf(amax, red[w]);
    float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x)
        q[d] = (int8_t)max(-127, min(127, __float2int_rn(bf2f(x[d]) * inv)));
    if (threadIdx.x == 0) *scale = amax / 127.0f;
}

__global__ void k_rope_kv(bf16 *qkv, int64_t ld, const int32_t *pos, const int32_t *slot, int H, int Hkv,
                          int hd, int rot, int interleaved, const float *inv_freq, sf_k_kv kv)
{
    /* block (token t, head h) of the H q heads, Hkv k heads and Hkv v heads: rotate q, rotate k
     * and write it to the cache, copy v to the cache */
    const int t = blockIdx.x, h = blockIdx.y, half = rot / 2;
    bf16 *hp = qkv + (int64_t)t * ld + (int64_t)h * hd;
    const int sl = slot[t];
    const bool is_q = h < H, is_v = h >= H + Hkv;
    bf16 *cache = NULL;
    int8_t *c8 = NULL;
    float *sc = NULL;
    if (!is_q && sl >= 0) {
        int64_t blk = sl / kv.block_size, off = sl % kv.block_size;
        int kh = is_v ? h - H - Hkv : h - H;
        if (kv.i8_base && blk >= kv.i8_base) {
            int64_t row = ((blk - kv.i8_base) * Hkv + kh) * kv.block_size + off;
            c8 = (int8_t *)(is_v ? kv.v : kv.k) + row * hd;
            sc = (is_v ? kv.v_scale : kv.k_scale) + row;
        } else {
            cache = (is_v ? (bf16 *)kv.v : (bf16 *)kv.k) + ((blk * Hkv + kh) * kv.block_size + off) * hd;
        }
    }
    if (is_v) {
        if (cache)
            for (int d = threadIdx.x; d < hd; d += blockDim.x) cache[d] = hp[d];
        if (c8) quant_store(hp, hd, c8, sc);
        return;
    }
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + half;
        float s, c;
        sincosf(p * inv_freq[j], &s, &c);
        float x0 = bf2f(hp[a]), x1 = bf2f(hp[b]);
        bf16 y0 = f2bf(x0 * c - x1 * s), y1 = f2bf(x1 * c + x0 * s);
        hp[a] = y0;
        hp[b] = y1;
        if (cache) { cache[a] = y0; cache[b] = y1; }
    }
    if (cache)
        for (int d = rot + threadIdx.x; d < hd; d += blockDim.x) cache[d] = hp[d];
    if (c8) quant_store(hp, hd, c8, sc); /* c8 is uniform over the block */
}

extern "C" int sf_k_rope_kv(uint16_t *qkv, int64_t ld, int T, const int32_t *pos, const int32_t *slot,
                            int H, int Hkv, int hd, int rot_dim, int interleaved, const float *inv_freq,
                            sf_k_kv kv, cudaStream_t s)
{
    if (T <= 0) return 0;
    if (rot_dim % 2 || rot_dim > hd || kv.n_kv_heads != Hkv || kv.head_dim != hd) return (int)cudaErrorInvalidValue;
    dim3 grid(T, H + 2 * Hkv);
    int threads = hd / 2 >= 64 ? 64 : 32;
    k_rope_kv<<<grid, threads, 0, s>>>((bf16 *)qkv, ld, pos, slot, H, Hkv, hd, rot_dim, interleaved, inv_freq, kv);
    return sf_launch_status();
}
