/* score.cu — prompt scoring on the GPU: for each logit row, the log-softmax at a target token,
 * the token's rank and the k most likely tokens, so that a scored prompt position sends 8 bytes
 * (and 8 a top entry) over PCIe instead of its whole row, and the host does no work per row.
 * The mirror of kernels/cpu/score.c: one block per row; passes over the row (bf16): the max; the
 * sum of exponentials and the count of larger logits; then one pass per top entry, each taking
 * the largest (value, id) in the order (value descending, lower id first) after the last one
 * taken, so ties come out as the reference orders them. */
#include <climits>

#include "common.cuh"
#include "kernels.h"

#define NT 256

static __device__ __forceinline__ float block_max(float v, float *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return warp_max(lane < NT / 32 ? red[lane] : -INFINITY);
}

static __device__ __forceinline__ int block_sum_int(int v, int *red)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < NT / 32 ? red[lane] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* (v, id) before (w, jd) in the top order: larger value, or the same value and a lower id */
static __device__ __forceinline__ bool first(float v, int id, float w, int jd) { return v > w || (v == w && id < jd); }

static __device__ __forceinline__ void block_best(float &v, int &id, float *redv, int *redi)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        int jd = __shfl_xor_sync(0xffffffffu, id, o);
        if (first(w, jd, v, id)) v = w, id = jd;
    }
    __syncthreads();
    if (lane == 0) redv[warp] = v, redi[warp] = id;
    __syncthreads();
    v = lane < NT / 32 ? redv[lane] : -INFINITY;
    id = lane < NT / 32 ? redi[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(0xffffffffu, v, o);
        int jd = __shfl_xor_sync(0xffffffffu, id, o);
        if (first(w, jd, v, id)) v = w, id = jd;
    }
}

__global__ void __launch_bounds__(NT) k_score(const uint16_t *logits, int64_t ld, int vocab, const int32_t *targets,
                                              int k, float *lp, int32_t *rank, int32_t *top_id, float *top_lp)
{
    __shared__ float redv[32];
    __shared__ int redi[32];
    const int r = blockIdx.x;
    const bf16 *l = (const bf16 *)logits + (int64_t)r * ld;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < vocab; i += NT) m = fmaxf(m, bf2f(l[i]));
    m = block_max(m, redv);
    const float x = bf2f(l[targets[r]]);
    float s = 0.0f;
    int above = 0;
    for (int i = threadIdx.x; i < vocab; i += NT) {
        const float v = bf2f(l[i]);
        s += expf(v - m);
        above += v > x;
    }
    s = block_sum(s, redv);
    above = block_sum_int(above, redi);
    const float lse = m + logf(s);
    if (threadIdx.x == 0) {
        lp[r] = x - lse;
        rank[r] = above + 1;
    }
    float pv = INFINITY;
    int pid = -1;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bid = INT_MAX;
        for (int i = threadIdx.x; i < vocab; i += NT) {
            const float v = bf2f(l[i]);
            if (first(pv, pid, v, i) && first(v, i, bv, bid)) bv = v, bid = i;
        }
        block_best(bv, bid, redv, redi);
        if (threadIdx.x == 0) {
            top_id[(int64_t)r * k + j] = bid == INT_MAX ? -1 : bid;
            top_lp[(int64_t)r * k + j] = bid == INT_MAX ? -INFINITY : bv - lse;
        }
        pv = bv;
        pid = bid;
    }
}

extern "C" int sf_k_score(const uint16_t *logits, int64_t ld, int n, int vocab, const int32_t *targets, int k, float *lp,
                          int32_t *rank, int32_t *top_id, float *top_lp, cudaStream_t s)
{
    if (n <= 0) return 0;
    k_score<<<n, NT, 0, s>>>(logits, ld, vocab, targets, k, lp, rank, top_id, top_lp);
    return (int)cudaGetLastError();
}
