/* attention_decode_stream.cu — single-query attention of many sequences over the paged KV cache
 * as one stream of key tiles cut evenly over persistent blocks ("stream-K" for decode). Same
 * tiles, loads and tensor-core compute as attention_decode_mma.cu (attention_decode_mma.cuh);
 * what differs is who does which tile.
 *
 * The per-(token, kv head, split) kernel launches a block per item, and at batch the blocks come
 * out in uneven waves and each block starts cold: at 256 sequences x 192 keys its 2048 blocks of
 * 3 tiles fill 396 resident slots 5.17 times (6 waves: the last one 17% full), and every block
 * waits for its first tile. Here the grid is the resident slots (blocks per SM x SMs), the items
 * (token, kv head) are laid end to end as one sequence of 64-key tiles (token-major, then kv
 * head), and block b takes tiles [b * per, (b + 1) * per) of it, per = ceil(total / blocks): every
 * block does the same number of tiles (+- 1), and its cp.async ring runs on across item boundaries
 * (the next item's first tile and its q are in flight while the last tile of the current one is
 * computed). Each block finds its first item by a block-wide prefix sum over the tokens' tile
 * counts (the contexts are only on the device: the grid is captured once into a graph).
 *
 * An item wholly inside one block is written out directly. An item cut by block boundaries is
 * computed in pieces by consecutive blocks; each piece goes to the workspace (o unnormalised, m in
 * base 2, l: the split layout of attention_decode.cuh), slot 0 of the block if the item holds the
 * block's first tile, else slot 1 (a block cuts at most two items: its first and its last), and
 * the last piece to finish (a counter per (token, kv head), reset after use) combines them.
 * Workspace: 2 slots x blocks x group x (hd + 2) floats, which a->n_split (>= 2) bounds: the grid
 * is at most T * Hkv * n_split / 2 blocks (attention_decode.cu's dispatcher picks n_split so that
 * it is the resident slots). Pieces per item stay <= DM_MAX_SPLIT (per is raised for long items).
 *
 * a.rows (kernels.h) makes the queries a subset of the step's tokens: the single-token sequences
 * of a step whose other sequences take the prefill kernel.
 *
 * Launched as a programmatic dependent: the prefix sum, the first tile's block-table entries
 * (metadata) come before the wait; q and the cache (the new token's K/V) after it. */
#include "attention_decode_mma.cuh"

/* Stage layout: the tile (dm_layout), then q of the group's heads (8 x hd bf16) for tiles that
 * start an item in this block. */
template <int HD, bool I8, int NW>
struct ds_layout {
    using Lo = dm_layout<HD, I8, NW>;
    static constexpr int QB = 8 * HD * 2;
    static constexpr int STB = Lo::STB + QB;
};

/* Token row of query i (a.rows: a subset of the step's tokens). */
static __device__ __forceinline__ int ds_row(const sf_k_attn &a, int i)
{
    return a.rows ? __ldg(a.rows + i) : i;
}

/* Where a block is in the tile stream: query t (token row, sequence seq, ctx keys, nt tiles per
 * item), kv head kh, tile i of the item, f the stream index of the item's first tile. Uniform
 * over the block. */
struct ds_cur {
    int t, row, seq, ctx, nt, kh, i, f;
};

template <int TK>
static __device__ __forceinline__ void ds_token(ds_cur &c, const sf_k_attn &a, int t)
{
    c.t = t;
    if (t < a.T) {
        c.row = ds_row(a, t);
        c.ctx = __ldg(a.pos + c.row) + 1;
        c.seq = __ldg(a.tok_seq + c.row);
        c.nt = (c.ctx + TK - 1) / TK;
    }
}

template <int TK>
static __device__ __forceinline__ void ds_next(ds_cur &c, const sf_k_attn &a)
{
    if (++c.i < c.nt) return;
    c.i = 0;
    c.f += c.nt;
    if (++c.kh < a.Hkv) return;
    c.kh = 0;
    ds_token<TK>(c, a, c.t + 1);
}

template <int HD, bool I8, int NW, int NS>
__global__ void __launch_bounds__(32 * NW) k_attn_dec_stream(sf_k_attn a)
{
    using Lo = dm_layout<HD, I8, NW>;
    using SL = ds_layout<HD, I8, NW>;
    constexpr int NT = Lo::NT, TK = Lo::TK;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ int red[3][NW];
    __shared__ int start[5];
    __shared__ int last;

    sf_pdl_trigger();
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, c = lane & 3;
    const int T = a.T, Hkv = a.Hkv, G = a.H / Hkv, lbs = __ffs(a.kv.block_size) - 1; /* a power of 2 */
    const int ck = tid % Lo::CH, j0 = tid / Lo::CH;

    /* ---- this block's tiles: prefix sum of Hkv * tiles(t) over the tokens ---- */
    const int chunk = (T + NT - 1) / NT, t_lo = min(T, tid * chunk), t_hi = min(T, t_lo + chunk);
    int mine = 0, mx = 0;
    for (int t = t_lo; t < t_hi; t++) {
        const int nt = (__ldg(a.pos + ds_row(a, t)) + TK) / TK; /* (pos + 1 + TK - 1) / TK */
        mine += Hkv * nt;
        mx = max(mx, nt);
    }
    int incl = mine;
#pragma unroll
    for (int x = 1; x < 32; x <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, x);
        if (lane >= x) incl += y;
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    if (lane == 31) { red[0][w] = incl; red[1][w] = mx; }
    __syncthreads();
    int before = 0, total = 0, max_nt = 0;
#pragma unroll
    for (int v = 0; v < NW; v++) {
        if (v < w) before += red[0][v];
        total += red[0][v];
        max_nt = max(max_nt, red[1][v]);
    }
    const int excl = before + incl - mine;
    /* even cut; pieces per item <= ceil((nt - 1) / per) + 1 <= DM_MAX_SPLIT */
    const int per = max((total + (int)gridDim.x - 1) / (int)gridDim.x, (max_nt - 1 + DM_MAX_SPLIT - 2) / (DM_MAX_SPLIT - 1));
    const int c0 = blockIdx.x * per, c1 = min(total, c0 + per);
    if (c0 >= total) return;
    if (c0 >= excl && c0 < excl + mine) { /* the thread whose tokens hold tile c0 */
        int acc = excl;
        for (int t = t_lo; t < t_hi; t++) {
            const int nt = (__ldg(a.pos + ds_row(a, t)) + TK) / TK;
            if (c0 < acc + Hkv * nt) {
                const int kh = (c0 - acc) / nt;
                start[0] = t; start[1] = kh; start[2] = c0 - acc - kh * nt; start[3] = acc + kh * nt;
                break;
            }
            acc += Hkv * nt;
        }
    }
    __syncthreads();
    ds_cur fc; /* the next tile to load */
    ds_token<TK>(fc, a, start[0]);
    fc.kh = start[1]; fc.i = start[2]; fc.f = start[3];
    ds_cur cc = fc; /* the tile to compute */

    int blk[Lo::NR];
    dm_ids<HD, I8, NW>(blk, a.block_table + (int64_t)fc.seq * a.max_blocks, lbs, fc.i * TK, fc.ctx, j0);
    sf_pdl_wait(); /* q and the newest keys come from the kernel before */

    /* Loads tile x = the fetch cursor into its stage, then moves the cursor on. */
    int xf = c0;
    auto issue = [&]() {
        unsigned char *st = smem + ((xf - c0) % NS) * SL::STB;
        dm_issue<HD, I8, NW>(st, a, fc.kh, fc.i * TK, fc.ctx, blk, ck, j0);
        if ((fc.i == 0 || xf == c0) && tid < G * (HD / 8)) { /* the item starts here: its q too */
            const int hg = tid / (HD / 8), k = tid % (HD / 8);
            sf_cp_async16(st + Lo::STB + (hg * HD + k * 8) * 2,
                          a.q + (int64_t)fc.row * a.ld_q + (int64_t)(fc.kh * G + hg) * HD + k * 8, 16);
        }
        ds_next<TK>(fc, a);
        if (++xf < c1) dm_ids<HD, I8, NW>(blk, a.block_table + (int64_t)fc.seq * a.max_blocks, lbs, fc.i * TK, fc.ctx, j0);
    };
#pragma unroll
    for (int s = 0; s < NS - 1; s++) {
        if (xf < c1) issue();
        sf_cp_async_commit();
    }

    /* the combine of an item cut by block boundaries (first tile f, nt tiles): blocks cf .. cl
     * hold its pieces; block cf's piece is in its slot 1 unless the item starts exactly at cf's
     * first tile */
    auto finish = [&](int row, int kh, int f0, int nt, float *wsm) {
        const int cf = f0 / per, np = (f0 + nt - 1) / per - cf + 1;
        sf_attn_pieces_finish<HD, 4>(&a.counters[row * a.Hkv + kh], (bf16 *)a.out + (int64_t)row * a.ld_out + (int64_t)kh * G * HD,
                                     G, np, np, NW, wsm, &last, [&](int hg, int p) {
            const int slot_p = p == 0 && f0 != cf * per ? 1 : 0;
            return (const float *)a.ws + (((int64_t)(cf + p) * 2 + slot_p) * G + hg) * (HD + 2);
        });
    };

    const float qs = a.scale * 1.4426950408889634f;
    uint32_t qb[HD / 16][2], qh[I8 ? HD / 16 : 1][2];
    float m[2], l[2], o[HD / 16][4];
    for (int x = c0; x < c1; x++) {
        sf_cp_async_wait<NS - 2>();
        __syncthreads(); /* tile x is in; every warp is done with the stage tile x + NS - 1 reuses */
        if (xf < c1) issue();
        sf_cp_async_commit();
        unsigned char *st = smem + ((x - c0) % NS) * SL::STB;
        if (cc.i == 0 || x == c0) { /* a new item: its q (B fragments, permuted dims), a fresh state */
            dm_q_frags<HD, I8>((const uint16_t *)(st + Lo::STB) + g * HD + c * (HD / 4), g < G, qb, qh);
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.0f;
#pragma unroll
            for (int j = 0; j < HD / 16; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
        }
        const int kb = cc.i * TK + 16 * w;
        if (kb < cc.ctx) dm_compute<HD, I8, NW>(st, w, kb, cc.ctx, qs, qb, qh, m, l, o);

        if (cc.i == cc.nt - 1 || x == c1 - 1) { /* the item ends here (or this block's share of it) */
            __syncthreads(); /* every warp is done with this stage: it is the merge's scratch now */
            const bool whole = cc.f >= c0 && cc.f + cc.nt <= c1;
            const int slot = cc.f <= c0 ? 0 : 1, t = cc.row, kh = cc.kh;
            float *wsm;
            dm_merge_warps<HD, NW>(st, G, m, l, o, &wsm, [&](int hg, int d, float O, float M, float L) {
                if (whole) {
                    ((bf16 *)a.out)[(int64_t)t * a.ld_out + (int64_t)(kh * G + hg) * HD + d] = f2bf(L > 0.0f ? O / L : 0.0f);
                } else {
                    float *wp = a.ws + (((int64_t)blockIdx.x * 2 + slot) * G + hg) * (HD + 2);
                    wp[d] = O;
                    if (d == 0) { wp[HD] = M; wp[HD + 1] = L; }
                }
            });
            /* at once: deferring the combines to the block's last tile (measured as cfg 44,
             * docs/PERFORMANCE.md) was slower at every shape */
            if (!whole) finish(t, kh, cc.f, cc.nt, wsm);
        }
        ds_next<TK>(cc, a);
    }
}

/* ---- host side ----------------------------------------------------------------------------- */
extern "C" int sf_k_attention_decode_stream_ok(const sf_k_attn *a)
{
    sf_k_attn b = *a;
    b.rows = NULL; /* the tiles' own conditions; rows is this kernel's alone */
    return sf_k_attention_decode_mma_ok(&b) && a->n_split >= 2 && a->ws && a->counters;
}

template <int HD, bool I8, int NS>
static int ds_smem(void)
{
    static_assert(ds_layout<HD, I8, 4>::Lo::STB >= dm_scratch<HD, 4>::BYTES, "merge area");
    return NS * ds_layout<HD, I8, 4>::STB;
}

/* Sets the kernel's attributes (once per device) and returns its resident blocks per SM (kept
 * per device, +1: 0 is "not asked yet"), 0 on error. */
template <int HD, bool I8, int NS>
static int ds_per_sm(void)
{
    static int n1[SF_K_MAX_DEVICES];
    static sf_k_smem attr_set;
    const int d = sf_k_dev();
    if (d >= 0 && n1[d]) return n1[d] - 1;
    const int smem = ds_smem<HD, I8, NS>();
    int k = 0;
    if (sf_k_smem_attr(&attr_set, k_attn_dec_stream<HD, I8, 4, NS>, (size_t)smem, true) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, k_attn_dec_stream<HD, I8, 4, NS>, 128, smem)) {
        cudaGetLastError();
        return 0;
    }
    if (d >= 0) n1[d] = k + 1;
    return k;
}

template <int HD, bool I8, int NS>
static int ds_launch(const sf_k_attn *a, int max_blocks, cudaStream_t s)
{
    const int per_sm = ds_per_sm<HD, I8, NS>();
    if (per_sm <= 0) return (int)cudaErrorInvalidConfiguration;
    int64_t grid = (int64_t)per_sm * sf_k_sm_count(1);
    grid = SF_MIN(grid, (int64_t)a->T * a->Hkv * a->n_split / 2); /* the workspace's slots */
    if (max_blocks > 0) grid = SF_MIN(grid, (int64_t)max_blocks);
    if (grid < 1) grid = 1;
    int rc = sf_launch_pdl(k_attn_dec_stream<HD, I8, 4, NS>, dim3((unsigned)grid), dim3(128),
                           (size_t)ds_smem<HD, I8, NS>(), s, *a);
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_attention_decode_stream_per_sm(int hd, int int8, int cfg)
{
    if (hd == 64) return int8 ? ds_per_sm<64, true, 2>() : ds_per_sm<64, false, 2>();
    if (hd != 128) return 0;
    if (cfg == 43) return int8 ? ds_per_sm<128, true, 3>() : ds_per_sm<128, false, 3>();
    return int8 ? ds_per_sm<128, true, 2>() : ds_per_sm<128, false, 2>();
}

extern "C" int sf_k_attention_decode_stream(const sf_k_attn *a, int cfg, int max_blocks, cudaStream_t s)
{
    if (a->T <= 0) return 0;
    if (!sf_k_attention_decode_stream_ok(a)) return (int)cudaErrorInvalidValue;
    const bool i8 = a->kv.i8_base != 0;
    if (a->hd == 64) return i8 ? ds_launch<64, true, 2>(a, max_blocks, s) : ds_launch<64, false, 2>(a, max_blocks, s);
    if (cfg == 43) return i8 ? ds_launch<128, true, 3>(a, max_blocks, s) : ds_launch<128, false, 3>(a, max_blocks, s);
    return i8 ? ds_launch<128, true, 2>(a, max_blocks, s) : ds_launch<128, false, 2>(a, max_blocks, s);
}
