/* attention_decode.cuh — what the decode-attention kernels (attention_decode.cu, the lanes kernel;
 * attention_decode_mma.cu and attention_decode_stream.cu, the batch kernels) share: the end of a
 * key split (a block's piece of the keys, and the combine of the pieces, through the workspace or
 * a thread-block cluster's shared memory) and the cluster launch's host side. */
#ifndef SF_KERNELS_ATTENTION_DECODE_CUH
#define SF_KERNELS_ATTENTION_DECODE_CUH

#include "common.cuh"

#define SF_AD_MAX_SPLIT 64
#define SF_AD_CL_MAX 16 /* splits combined in a thread-block cluster (a non-portable size past 8) */

/* The block's cluster: a barrier with release/acquire (writes to a peer's shared memory before it
 * are seen by that peer after it), and a peer's address of a shared-memory variable. */
static __device__ __forceinline__ void cluster_sync(void)
{
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
/* The same barrier split in two: arrive (no ordering) as the block starts, wait before its first
 * write to a peer's shared memory, which is only safe once every block of the cluster has started
 * (compute-sanitizer racecheck: "a block that might not have entered yet"). By the time a block
 * has done its keys the others have long arrived, so the wait is not a stall. */
static __device__ __forceinline__ void cluster_arrive_relaxed(void)
{
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}
static __device__ __forceinline__ void cluster_wait(void)
{
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}
static __device__ __forceinline__ float *cluster_peer(float *p, int rank)
{
    uint64_t out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((uint64_t)p), "r"(rank));
    return (float *)out;
}

/* The cluster combine, pushed (session 12, docs/PERFORMANCE.md): the ns splits of a (token, kv
 * head, part) are one cluster, split i its block of rank i, and the Gb x HD outputs are cut into
 * ns shares of sf_cl_share; split i combines share i. What its peers send it, in its shared
 * memory (sf_cl_recv_max floats at the most): each split's m and l per head ([ns][Gb] float2), then each
 * split's o for the share ([ns][share]). */
static __device__ __host__ __forceinline__ int sf_cl_share(int Gb, int HD, int ns) { return (Gb * HD + ns - 1) / ns; }
/* The receive area's floats for any part of up to MAXG heads and any split up to SF_AD_CL_MAX:
 * ns x share <= Gb x HD + ns - 1. */
static constexpr int sf_cl_recv_max(int MAXG, int HD) { return 2 * SF_AD_CL_MAX * MAXG + MAXG * HD + SF_AD_CL_MAX; }

/* A block's (O unnormalised, M in base 2, L) for head g < Gb of its part and dimension d, sent to
 * the peer that combines output g * HD + d; M and L also to every peer whose share holds one of
 * head g's outputs (by the thread of d = 0). recv: the receive area (the same address in every
 * block). Only after cluster_wait() (every peer has started). */
template <int HD>
static __device__ __forceinline__ void sf_cl_push(float *recv, int Gb, int ns, int split, int g, int d, float O, float M,
                                                  float L)
{
    const int share = sf_cl_share(Gb, HD, ns), idx = g * HD + d, j = idx / share;
    float *ro = recv + 2 * ns * Gb;
    *cluster_peer(&ro[split * share + idx - j * share], j) = O;
    if (d == 0)
        for (int jj = g * HD / share; jj <= ((g + 1) * HD - 1) / share && jj < ns; jj++)
            *(float2 *)cluster_peer(&recv[2 * (split * Gb + g)], jj) = make_float2(M, L);
}

/* After cluster_sync(): this block's share of the outputs (out: the part's Gb x HD), combined from
 * its own shared memory (nothing reads a peer's after the barrier, so every block may leave when
 * done). nt threads. */
template <int HD>
static __device__ __forceinline__ void sf_cl_combine(const float *recv, int Gb, int ns, int split, int nt, bf16 *out)
{
    const int share = sf_cl_share(Gb, HD, ns), i1 = min(Gb * HD, (split + 1) * share);
    const float2 *ml = (const float2 *)recv;
    const float *ro = recv + 2 * ns * Gb;
    for (int idx = split * share + (int)threadIdx.x; idx < i1; idx += nt) {
        const int g = idx / HD, i = idx - split * share;
        float M = -INFINITY;
        for (int r = 0; r < ns; r++) M = fmaxf(M, ml[r * Gb + g].x);
        float L = 0.0f, O = 0.0f;
        if (M != -INFINITY)
            for (int r = 0; r < ns; r++) {
                const float2 x = ml[r * Gb + g];
                if (x.x == -INFINITY) continue;
                const float e = exp2f(x.x - M);
                L = fmaf(x.y, e, L);
                O = fmaf(ro[r * share + i], e, O);
            }
        out[idx] = f2bf(L > 0.0f ? O / L : 0.0f);
    }
}

/* Host: the launch of `grid` (blocks of `threads`) whose grid.z blocks of each (token, kv head)
 * are one cluster; at holds its attributes, pdl adds programmatic dependent launch as
 * sf_launch_pdl gives it. */
static inline cudaLaunchConfig_t sf_cl_config(cudaLaunchAttribute (&at)[2], dim3 grid, int threads, size_t smem,
                                              cudaStream_t s, bool pdl)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = 1;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = grid.z;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 2 : 1;
    return cfg;
}

/* Host: how many clusters of n blocks (2..SF_AD_CL_MAX) of `kernel` with `smem` bytes of dynamic
 * shared memory the device holds at once beside nothing else (cudaOccupancyMaxActiveClusters;
 * sizes past 8 need the non-portable attribute, which the H100/H200 allow up to 16); 0 where
 * none. cache[n]: the answer per size (0: not asked yet), which the caller keeps per device and
 * kernel instance, as the shared-memory attribute record is here (per template argument). */
template <void (*kernel)(sf_k_attn)>
static int sf_cl_fits(int n, int threads, size_t smem, int *cache)
{
    if (n < 2 || n > SF_AD_CL_MAX) return 0;
    if (!cache[n]) {
        cudaLaunchAttribute at[2];
        const cudaLaunchConfig_t cfg = sf_cl_config(at, dim3(1, 1, n), threads, smem, 0, false);
        int clusters = 0;
        static sf_k_smem ss; /* per kernel instance */
        bool ok = !sf_k_smem_attr(&ss, kernel, smem, true); /* all of L1 as shared, as measured */
        if (ok && n > 8) ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
        ok = ok && cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters > 0;
        if (!ok) cudaGetLastError();
        cache[n] = ok ? clusters : -1;
    }
    return cache[n] > 0 ? cache[n] : 0;
}

/* A block's result for query head h, dimension d of token t: the output itself when there is one
 * split, else its partial (o unnormalised, m in base 2, l) in the workspace for
 * sf_attn_split_finish. */
template <int HD>
static __device__ __forceinline__ void sf_attn_split_store(const sf_k_attn &a, int t, int h, int split, int d, float O,
                                                           float M, float L)
{
    const int ns = a.n_split;
    if (ns == 1) {
        ((bf16 *)a.out)[(int64_t)t * a.ld_out + (int64_t)h * HD + d] = f2bf(L > 0.0f ? O / L : 0.0f);
    } else {
        float *wp = a.ws + (((int64_t)t * a.H + h) * ns + split) * (HD + 2);
        wp[d] = O;
        if (d == 0) { wp[HD] = M; wp[HD + 1] = L; }
    }
}

/* After a block has written its piece of the keys for G query heads (o unnormalised, m in base
 * 2, l: hd + 2 floats per head) to the workspace, the last of the np blocks to finish (*cnt
 * counts the `arrivals` blocks that write pieces of them, and is reset for the next launch: graph
 * replays reuse it) combines the pieces into out (G x HD outputs). piece(g, p) is where piece p
 * (0..np-1, np <= SF_AD_MAX_SPLIT) of head g is. Called by every thread of the block (nwarps
 * warps); wsm: [G][SF_AD_MAX_SPLIT] floats and `last` one int of shared memory.
 *
 * Every load here is an L2 round trip while the next kernel streams its weights, so they are
 * issued together: a piece's m and l at once (one 8-byte load), then CH pieces of each of a
 * thread's NP pairs of outputs (8-byte loads). A round of these loads costs ~1-1.5 us at batch 1
 * whatever it holds, so every output of the block should come in one: the lanes kernel's 256
 * threads cover 4 heads x 128 dims with one pair each and CH = 33 (four pieces at a time before:
 * Llama-3-8B batch 1 at 4096 keys, 33 splits, 0.6-1.2% faster a token, session 12), the mma
 * kernel's one-token instance (128 threads) with NP = 2 and CH = 16 (it had taken two rounds of
 * a thread's two outputs: 3.1 us of outputs after the count and m and l, now 1.15; Llama-3-8B and
 * Qwen2-7B at 4096 keys 1.5% / 1.4% faster a token with the 8-byte loads, docs/PERFORMANCE.md
 * session 21). The batch kernels, whose steps split into few pieces, keep CH small and NP = 1
 * (registers: blocks per SM). mk (timeline, b1trace.cuh): NULL, or 3 words of shared memory for
 * the times the count came back, m and l were in, and the outputs were stored. */
template <int HD, int CH, int NP = 1, class Piece>
static __device__ void sf_attn_pieces_finish(unsigned *cnt, bf16 *out, int G, int np, int arrivals, int nwarps,
                                             float *wsm, int *last, const Piece &piece, uint64_t *mk = nullptr)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nt = nwarps * 32;
    /* the block's pieces published and, for the last block, every other block's acquired by one
     * acq_rel count (common.cuh); no fence.sc before or after it */
    __syncthreads();
    if (tid == 0) *last = sf_atom_add_acq_rel_gpu(cnt, 1u) == (unsigned)arrivals - 1;
    __syncthreads();
    if (!*last) return;
    if (mk && tid == 0) mk[0] = global_ns(); /* timeline (b1trace.cuh): the count is back */
    for (int g = warp; g < G; g += nwarps) {
        const float *p0 = lane < np ? piece(g, lane) : NULL, *p1 = lane + 32 < np ? piece(g, lane + 32) : NULL;
        const float2 ml0 = p0 ? __ldcg((const float2 *)(p0 + HD)) : make_float2(-INFINITY, 0.0f);
        const float2 ml1 = p1 ? __ldcg((const float2 *)(p1 + HD)) : make_float2(-INFINITY, 0.0f);
        const float m0 = ml0.x, l0 = ml0.y, m1 = ml1.x, l1 = ml1.y;
        const float M = warp_max(fmaxf(m0, m1));
        float e0 = 0.0f, e1 = 0.0f;
        if (M != -INFINITY) {
            if (m0 != -INFINITY) e0 = exp2f(m0 - M);
            if (m1 != -INFINITY) e1 = exp2f(m1 - M);
        }
        const float L = warp_sum(e0 * l0 + e1 * l1);
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        wsm[g * SF_AD_MAX_SPLIT + lane] = e0 * inv;
        wsm[g * SF_AD_MAX_SPLIT + lane + 32] = e1 * inv;
    }
    __syncthreads();
    if (mk && tid == 0) mk[1] = global_ns(); /* the pieces' m and l are in */
    /* the outputs in pairs of neighbouring dims (8-byte loads: a piece is HD + 2 floats, so pairs
     * stay aligned), NP pairs a thread: every load of a thread's outputs in one round when np <= CH */
    const int P = G * HD / 2;
    for (int q0 = tid; q0 < P; q0 += NP * nt) {
        const float *ew[NP]; /* the pieces' weights for the pair's head */
#pragma unroll
        for (int r = 0; r < NP; r++) ew[r] = wsm + (2 * min(q0 + r * nt, P - 1) / HD) * SF_AD_MAX_SPLIT;
        float2 o[NP];
#pragma unroll
        for (int r = 0; r < NP; r++) o[r] = make_float2(0.0f, 0.0f);
        for (int c = 0; c < np; c += CH) {
            float2 x[NP][CH];
#pragma unroll
            for (int j = 0; j < CH; j++)
#pragma unroll
                for (int r = 0; r < NP; r++) {
                    const int q = q0 + r * nt, g = 2 * q / HD;
                    x[r][j] = q < P && c + j < np ? __ldcg((const float2 *)(piece(g, c + j) + (2 * q - g * HD)))
                                                  : make_float2(0.0f, 0.0f);
                }
#pragma unroll
            for (int j = 0; j < CH; j++)
                if (c + j < np)
#pragma unroll
                    for (int r = 0; r < NP; r++) {
                        o[r].x = fmaf(x[r][j].x, ew[r][c + j], o[r].x);
                        o[r].y = fmaf(x[r][j].y, ew[r][c + j], o[r].y);
                    }
        }
#pragma unroll
        for (int r = 0; r < NP; r++)
            if (q0 + r * nt < P) ((__nv_bfloat162 *)out)[q0 + r * nt] = __floats2bfloat162_rn(o[r].x, o[r].y);
    }
    if (mk) {
        __syncthreads();
        if (tid == 0) mk[2] = global_ns(); /* every output stored */
    }
    if (tid == 0) *cnt = 0;
}

/* sf_attn_pieces_finish over the n_split pieces of a split launch (a block per (t, kv head,
 * split), or per (t, kv head, part, split) where a group's G heads are cut into parts: g0 ..
 * g0 + Gb - 1 are the block's), in the layout sf_attn_split_store writes. Each part has its own
 * counter ((t * Hkv + kh) * parts + part, parts <= SF_K_ATTN_CNT_PER_KVH) and the last of its
 * n_split blocks combines its heads alone: with Qwen2-7B's groups of 7 as parts of 4 and 3 heads
 * (attention_decode.cu) one block had combined all 7 (two rounds of a thread's two outputs), and
 * its attention ended 3.3 us later (22.4 against 19.1 us after QKV at 4096 keys, traced; 4.05
 * against 3.93-3.97 ms a token, docs/PERFORMANCE.md session 17). */
template <int HD, int CH, int NP = 1>
static __device__ void sf_attn_split_finish(const sf_k_attn &a, int t, int kh, int G, int g0, int Gb, int nwarps,
                                            float *wsm, int *last, int part = 0, int parts = 1,
                                            uint64_t *mk = nullptr)
{
    const int ns = a.n_split;
    bf16 *out = (bf16 *)a.out + (int64_t)t * a.ld_out + (int64_t)(kh * G + g0) * HD;
    sf_attn_pieces_finish<HD, CH, NP>(&a.counters[(t * a.Hkv + kh) * parts + part], out, Gb, ns, ns, nwarps, wsm, last,
                                  [&](int g, int p) {
                                      return (const float *)a.ws + (((int64_t)t * a.H + kh * G + g0 + g) * ns + p) * (HD + 2);
                                  },
                                  mk);
}

#endif
