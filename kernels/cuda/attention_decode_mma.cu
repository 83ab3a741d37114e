/* attention_decode_mma.cu — single-query attention of many sequences over the paged KV cache
 * (bf16 blocks, INT8 blocks, or both in one sequence), on tensor cores, for head sizes 64 and 128
 * and GQA groups up to 8. attention_decode.cu's dispatcher chooses it for batches; its 8-warp
 * CUDA-core kernel keeps the batch-1 latency shapes.
 *
 * At batch (256 sequences x 192 keys, 128 x 1500) decode attention reads 200-800 MB of K and V
 * per layer and nothing else matters: every byte must come from HBM once, at full rate. One block
 * of NW warps (4 by default) per (token, kv head, key split) reads its keys in tiles of 16 x NW
 * (16 per warp) with 16-byte cp.async into an NS-stage shared-memory ring (NS - 1 tiles in flight
 * while one is computed; NS = 2 by default, which leaves room for 3 blocks per SM: more blocks beat
 * deeper rings in the first measurements); the block-table entries of the next tile to fetch are
 * loaded while the current one is computed. The G query heads of the kv head share each K/V load: a warp computes
 * S^T[16 keys][8 heads] = K[16][hd] . Q^T with mma.m16n8k16 (keys as M, the group padded to 8 as
 * N), keeps an online softmax per head in base 2, turns P into the B operand with movmatrix, and
 * accumulates O^T[hd][8] += V^T[hd][16 keys] . P^T[16][8].
 *
 * The fragments are read from shared memory with 16-byte (INT8 V: 8-byte) loads in a layout that
 * no bank conflict slows: the dims of a K row are permuted (the dot product does not care, q is
 * read in the same order) so that a lane's K fragments are one contiguous run of the row, and the
 * output dims of the PV product likewise, so that a lane's V fragments are a contiguous run of 4
 * key rows (bf16 pairs are interleaved with one byte permute). The same permutations serve INT8
 * rows, widened to fp16 in registers (exact: |q| <= 127; one permute and one half2 subtract per
 * pair) for fp16 mma with q in fp16; the K scale multiplies the score, the V scale the softmax
 * weight. Rows are stored with their 16-byte chunk index XOR-swizzled by the row.
 *
 * Block sizes are powers of 2 from 16 up (a warp's 16 keys are then of one kind, and a key's block
 * and offset are a shift and a mask).
 * Splits (n_split > 1) write partials in attention.cu's workspace layout; the last block of each
 * (token, kv head) combines them; or, in one-token steps whose clusters all fit at once (CL
 * below), the splits of a (token, kv head) are a thread-block cluster and combine in its shared
 * memory. Launched as a programmatic dependent (common.cuh): the
 * metadata and the first tiles' block-table entries are read before the wait, and in one-token
 * steps the first tiles' keys themselves where they precede the step's own. */
#include "attention_decode_mma.cuh"
#include "b1trace.cuh"


/* The split combine (sf_attn_pieces_finish): pieces per round of loads and pairs of outputs per
 * thread. The batch configurations, whose steps split into few pieces and whose registers set
 * the blocks per SM, take 4 pieces of one pair at a time; the one-token instances (B1:
 * configurations 143-145, SF_K_DEC_MMA_B1_CFG the one planned), 16 pieces of two pairs: their 4
 * heads x 128 outputs from up to 16 pieces in one round of loads (two rounds before: 3.1 us of
 * the ~5 from the last piece to the combine's end at 4096 keys, traced). */
#define DM_CH 4
#define DM_CH_B1 16

/* CL (bf16 one-token instances): the n_split blocks of a (token, kv head) are one thread-block
 * cluster and combine their pieces in its shared memory (attention_decode.cuh, sf_cl_push), in
 * an area after the ring (DM_CL_RECV bytes: any group up to 8 heads), rather than through the
 * workspace. */
#define DM_CL_RECV ((size_t)sf_cl_recv_max(8, 128) * 4)
template <int HD, bool I8, int NW, int NS, bool B1, bool CL = false>
__global__ void __launch_bounds__(32 * NW) k_attn_dec_mma(sf_k_attn a)
{
    using Lo = dm_layout<HD, I8, NW>;
    static_assert(!CL || (B1 && !I8 && HD <= 128), "the cluster combine: bf16 one-token instances");
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int last;
    __shared__ sf_tr tr;

    tr_begin(tr);
    sf_pdl_trigger();
    if (CL) cluster_arrive_relaxed(); /* waited for before the first write to a peer */
    const int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
    const int G = a.H / a.Hkv, ns = a.n_split, lbs = __ffs(a.kv.block_size) - 1; /* a power of 2 */
    const int ctx = a.pos[t] + 1, seq = a.tok_seq[t];
    const int per = ((ctx + ns - 1) / ns + Lo::TK - 1) / Lo::TK * Lo::TK;
    const int k0 = min(ctx, split * per), k1 = min(ctx, k0 + per);
    const int ntile = (k1 - k0 + Lo::TK - 1) / Lo::TK;
    const int32_t *bt = a.block_table + (int64_t)seq * a.max_blocks;
    const int ck = tid % Lo::CH, j0 = tid / Lo::CH;

    /* block-table entries of the first NS - 1 tiles (metadata: readable before the wait) */
    int ids[NS][Lo::NR];
#pragma unroll
    for (int st = 0; st < NS; st++) dm_ids<HD, I8, NW>(ids[st], bt, lbs, k0 + st * Lo::TK, k1, j0);
    /* One-token steps (B1): a ring tile whose keys all precede the newest (position ctx - 1,
     * which the QKV kernel appends) holds keys of earlier steps, which no kernel of this step
     * writes, so its loads are issued before the wait; the blocks start beside the QKV
     * projection's last ones and would otherwise idle until it ends. The tiles from the newest
     * key's on are issued after the wait, in the same order (one commit group per tile). */
    const int npre = B1 && a.T == 1 ? max(0, min(min(NS - 1, ntile), (ctx - 1 - k0) / Lo::TK)) : 0;
#pragma unroll
    for (int st = 0; st < NS - 1; st++)
        if (st < npre) {
            dm_issue<HD, I8, NW>(smem + st * Lo::STB, a, kh, k0 + st * Lo::TK, k1, ids[st], ck, j0);
            sf_cp_async_commit();
        }
    sf_pdl_wait(); /* q and the newest keys come from the kernel before */
    tr_waited(tr);

#pragma unroll
    for (int st = 0; st < NS - 1; st++)
        if (st >= npre) {
            if (st < ntile) dm_issue<HD, I8, NW>(smem + st * Lo::STB, a, kh, k0 + st * Lo::TK, k1, ids[st], ck, j0);
            sf_cp_async_commit();
        }
    int blk[Lo::NR];
#pragma unroll
    for (int r = 0; r < Lo::NR; r++) blk[r] = ids[NS - 1][r];

    /* q of head g of the group as B fragments (dims in the K rows' permuted order) */
    uint32_t qb[HD / 16][2], qh[I8 ? HD / 16 : 1][2];
    dm_q_frags<HD, I8>(a.q + (int64_t)t * a.ld_q + (int64_t)(kh * G + g) * HD + c * (HD / 4), g < G, qb, qh);
    const float qs = a.scale * 1.4426950408889634f;
    float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f }, o[HD / 16][4];
#pragma unroll
    for (int j = 0; j < HD / 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    for (int i = 0; i < ntile; i++) {
        sf_cp_async_wait<NS - 2>();
        __syncthreads(); /* tile i is in; every warp is done with the stage tile i + NS - 1 reuses */
        const int nx = i + NS - 1;
        if (nx < ntile) {
            dm_issue<HD, I8, NW>(smem + (nx % NS) * Lo::STB, a, kh, k0 + nx * Lo::TK, k1, blk, ck, j0);
            if (nx + 1 < ntile) dm_ids<HD, I8, NW>(blk, bt, lbs, k0 + (nx + 1) * Lo::TK, k1, j0);
        }
        sf_cp_async_commit();
        const int kb = k0 + i * Lo::TK + 16 * w;
        if (kb < k1) dm_compute<HD, I8, NW>(smem + (i % NS) * Lo::STB, w, kb, k1, qs, qb, qh, m, l, o);
    }
    sf_cp_async_wait<0>();
    __syncthreads(); /* the ring is free: it holds the warps' partial results now */

    /* merge the warps; write the output (one split) or this split's partial (CL: into the peers'
     * shared memory, once every block of the cluster has started) */
    float *wsm, *recv = (float *)(smem + NS * Lo::STB);
    if (CL) cluster_wait();
    dm_merge_warps<HD, NW>(smem, G, m, l, o, &wsm, [&](int hg, int d, float O, float M, float L) {
        if (CL) sf_cl_push<HD>(recv, G, ns, split, hg, d, O, M, L);
        else sf_attn_split_store<HD>(a, t, kh * G + hg, split, d, O, M, L);
    });
    tr_ready(tr);

    /* the last block of this (token, kv head) to finish combines the splits (CL: every block its
     * share, after one cluster barrier) */
    __shared__ uint64_t mk[3];
    if (CL) {
        cluster_sync();
        if (tr_buf && tid == 0) mk[0] = mk[1] = global_ns();
        sf_cl_combine<HD>(recv, G, ns, split, Lo::NT, (bf16 *)a.out + (int64_t)t * a.ld_out + (int64_t)kh * G * HD);
        if (tr_buf) {
            __syncthreads();
            if (tid == 0) {
                mk[2] = global_ns();
                tr_combine(tr, mk, ns, ctx);
            }
        }
    } else if (ns > 1) {
        sf_attn_split_finish<HD, B1 ? DM_CH_B1 : DM_CH, B1 ? 2 : 1>(a, t, kh, G, 0, G, NW, wsm, &last, 0, 1,
                                                               tr_buf ? mk : nullptr);
        if (tr_buf && last && tid == 0) tr_combine(tr, mk, ns, ctx);
    }
    tr_end(tr, SF_TR_ATTN, ns, ctx);
}

SF_TR_SETTER(sf_k_attn_decode_mma_trace)

/* ---- host side ----------------------------------------------------------------------------- */
extern "C" int sf_k_attention_decode_mma_ok(const sf_k_attn *a)
{
    const int G = a->Hkv > 0 ? a->H / a->Hkv : 0;
    return a->n_tiles == 0 && !a->rows && (a->hd == 64 || a->hd == 128) && a->Hkv > 0 && a->H % a->Hkv == 0 && G >= 1 &&
           G <= 8 && a->n_split >= 1 && a->n_split <= DM_MAX_SPLIT && (a->n_split == 1 || (a->ws && a->counters)) &&
           a->ld_q % 8 == 0 && (uintptr_t)a->q % 16 == 0 && (uintptr_t)a->kv.k % 16 == 0 &&
           (uintptr_t)a->kv.v % 16 == 0 && a->kv.head_dim == a->hd && a->kv.block_size >= 16 &&
           (a->kv.block_size & (a->kv.block_size - 1)) == 0;
}

/* One configuration's kernel attributes on the current device (once per device), shared by its
 * launch and its occupancy query: all of L1 as shared memory, since the blocks per SM are what
 * keeps the ring's bytes in flight. 0 or a cudaError_t. */
template <int HD, bool I8, int NW, int NS, bool B1>
static int attrs(void)
{
    static sf_k_smem attr_set;
    return sf_k_smem_attr(&attr_set, k_attn_dec_mma<HD, I8, NW, NS, B1>, (size_t)NS * dm_layout<HD, I8, NW>::STB, true);
}

template <int HD, bool I8, int NW, int NS, bool B1>
static int launch(const sf_k_attn *a, cudaStream_t s)
{
    using Lo = dm_layout<HD, I8, NW>;
    const size_t smem = (size_t)NS * Lo::STB;
    static_assert((size_t)NS * Lo::STB >= dm_scratch<HD, NW>::BYTES, "merge area");
    int e = attrs<HD, I8, NW, NS, B1>();
    if (e) return e;
    int rc = sf_launch_pdl(k_attn_dec_mma<HD, I8, NW, NS, B1>, dim3(a->T, a->Hkv, a->n_split), dim3(Lo::NT), smem, s,
                           *a);
    return rc ? rc : sf_launch_status();
}

/* The one-token instance with the cluster combine (kernels.h): -1 where it does not apply. The
 * dynamic shared memory is the ring and the largest receive area, one size for every group and
 * split (one attribute record). Measured on the H200 (docs/PERFORMANCE.md, session 25): with
 * 132 KiB blocks (one an SM) it holds 15 clusters of 8 but only 7 of 9..16 (one of its GPCs has
 * fewer SMs than that), so Llama-3-8B's 8 kv heads take it up to 8 splits (512 keys: 0.8% faster
 * a token, the combine's store, count and loads gone) and not at 16 (1024 keys and more). The
 * 3-stage ring (101 KiB: 14 clusters of 16) at 4096 keys combined 2.0 us after the last piece
 * rather than 6.0, but its clusters started only after the QKV projection's last blocks (no
 * room for 16 blocks in a GPC beside them) and put two blocks on an SM, so the last piece came
 * 3.8 us later: 0.8% slower a token. */
template <int HD, int NW, int NS>
static int launch_cl(const sf_k_attn *a, cudaStream_t s)
{
    constexpr size_t smem = (size_t)NS * dm_layout<HD, false, NW>::STB + DM_CL_RECV;
    static int fits[SF_K_MAX_DEVICES][SF_AD_CL_MAX + 1]; /* per device (common.cuh) */
    const int dev = sf_k_dev();
    int own[SF_AD_CL_MAX + 1] = { 0 }, *fc = dev >= 0 ? fits[dev] : own;
    /* every cluster of the step resident at once, else the workspace: a second wave of clusters
     * waits for whole free GPCs */
    const int n = sf_cl_fits<k_attn_dec_mma<HD, false, NW, NS, true, true>>(a->n_split, 32 * NW, smem, fc);
    if (n < a->T * a->Hkv) return -1;
    cudaLaunchAttribute at[2];
    const cudaLaunchConfig_t cfg = sf_cl_config(at, dim3(a->T, a->Hkv, a->n_split), 32 * NW, smem, s, sf_pdl_enabled());
    const int rc = (int)cudaLaunchKernelEx(&cfg, k_attn_dec_mma<HD, false, NW, NS, true, true>, *a);
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_attention_decode_mma_cluster(const sf_k_attn *a, int cfg, cudaStream_t s)
{
    if (a->T <= 0 || a->hd != 128 || a->kv.i8_base || cfg != SF_K_DEC_MMA_B1_CFG || a->n_split < 2 ||
        a->n_split > SF_AD_CL_MAX || !sf_k_attention_decode_mma_ok(a))
        return -1;
    static_assert(SF_K_DEC_MMA_B1_CFG == 144, "the instance below");
    return launch_cl<128, 4, 4>(a, s);
}

/* Blocks of one configuration resident per SM (the occupancy calculator, after the attributes
 * launch() sets), 0 on error. */
template <int HD, bool I8, int NW, int NS, bool B1>
static int per_sm(void)
{
    using Lo = dm_layout<HD, I8, NW>;
    const size_t smem = (size_t)NS * Lo::STB;
    int n = 0;
    if (attrs<HD, I8, NW, NS, B1>() ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_attn_dec_mma<HD, I8, NW, NS, B1>, Lo::NT, smem)) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int sf_k_attention_decode_mma_per_sm(int hd, int int8, int cfg)
{
    if (hd == 64) return int8 ? per_sm<64, true, 4, 2, false>() : per_sm<64, false, 4, 2, false>();
    if (hd != 128) return 0;
    switch (cfg) {
    case 143: return int8 ? per_sm<128, true, 4, 3, true>() : per_sm<128, false, 4, 3, true>();
    case 144: return int8 ? per_sm<128, true, 4, 4, true>() : per_sm<128, false, 4, 4, true>();
    case 145: return int8 ? per_sm<128, true, 4, 5, true>() : per_sm<128, false, 4, 5, true>();
    /* the 8-warp one-token blocks (tiles of 128 keys), bf16 only: INT8 caches keep 144 */
    case 183: return int8 ? per_sm<128, true, 4, 4, true>() : per_sm<128, false, 8, 3, true>();
    case 43: return int8 ? per_sm<128, true, 4, 3, false>() : per_sm<128, false, 4, 3, false>();
    case 23: return int8 ? per_sm<128, true, 2, 3, false>() : per_sm<128, false, 2, 3, false>();
    case 24: return int8 ? per_sm<128, true, 2, 4, false>() : per_sm<128, false, 2, 4, false>();
    default: return int8 ? per_sm<128, true, 4, 2, false>() : per_sm<128, false, 4, 2, false>();
    }
}

/* cfg: warps per block x 10 + ring depth, or 100 + that for the one-token instances (kernels.h); head size 64 has
 * the default only */
template <int HD, bool I8>
static int launch_cfg(const sf_k_attn *a, int cfg, cudaStream_t s)
{
    if (HD == 64) return launch<HD, I8, 4, 2, false>(a, s);
    switch (cfg) {
    case 143: return launch<HD, I8, 4, 3, true>(a, s);
    case 144: return launch<HD, I8, 4, 4, true>(a, s);
    case 145: return launch<HD, I8, 4, 5, true>(a, s);
    case 183: return I8 ? launch<HD, I8, 4, 4, true>(a, s) : launch<HD, false, 8, 3, true>(a, s);
    case 43: return launch<HD, I8, 4, 3, false>(a, s);
    case 23: return launch<HD, I8, 2, 3, false>(a, s);
    case 24: return launch<HD, I8, 2, 4, false>(a, s);
    default: return launch<HD, I8, 4, 2, false>(a, s);
    }
}

extern "C" int sf_k_attention_decode_mma(const sf_k_attn *a, int cfg, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (!sf_k_attention_decode_mma_ok(a)) return (int)cudaErrorInvalidValue;
    const bool i8 = a->kv.i8_base != 0;
    if (a->hd == 128) return i8 ? launch_cfg<128, true>(a, cfg, s) : launch_cfg<128, false>(a, cfg, s);
    return i8 ? launch_cfg<64, true>(a, cfg, s) : launch_cfg<64, false>(a, cfg, s);
}
