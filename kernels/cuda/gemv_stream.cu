/* gemv_stream.cu — the batch-1 fused GEMVs (gemv_fused.cu's modes: norm, norm + glu, norm + RoPE
 * + K/V append, residual add) on persistent warps (SEMFLOW_CUDA_GEMV_RING=3, the default).
 *
 * gemv_fused.cu gives every unit of two rows its own warp, so a layer's big GEMV runs in several
 * waves of blocks, each warp filling its ring from empty, and reads x through L1 in the add
 * mode (down: 28 KB of x per warp, 2048 warps). Here the grid is what fits at once (2 or 3
 * blocks of FS_WARPS warps per SM), each warp takes the units u = w, w + warps, ... (w = its
 * warp index x grid + block: the units go round the blocks first, see plan()) and
 * streams their rows through one ring that runs on from unit to unit: the stages of the next
 * unit are in flight while the warp finishes the current one, so the weight stream of a warp
 * never drains until its last unit. The ring is as deep as shared memory allows (ST stages of
 * 2 rows x FG_RING_V 16-byte loads per lane; ST - 1 in flight, all issued before the
 * programmatic-launch wait), and x (normalised, or copied for the add mode) is held in shared
 * memory, read once per block. Measured per op on the H200 (docs/PERFORMANCE.md): down 36.9 ->
 * 30.4 us (91% of the copy bandwidth), O 13.0 -> 11.2, QKV best at 3 blocks per SM. Rounding and
 * the epilogues are gemv_fused.cu's (gemv_ring.cuh).
 * The prologue after the wait is one round of memory latency: x comes in by cp.async, all of a
 * thread's vectors at once, and the norm weight was copied before the wait into the ring slot
 * the loop fills first (loads waited on one by one had taken a round trip per 256 vectors of x,
 * then one more for the norm weight, while the ring's stages sat landed: session 13, the 8B
 * layer chain 110.9 -> 107.8 us, Llama-3-8B batch 1 -1.8%, docs/PERFORMANCE.md).
 * Tried and removed (docs/PERFORMANCE.md): a batched prologue in registers (all of a thread's
 * x loads in flight at once, the norm weight in registers from before the wait) took the kernel
 * to 64 registers and the 8B layer chain from 110.8 to 119.1 us. */
#include <climits>
#include <stdlib.h>
#include <string.h>

#include "../sample_draw.h"
#include "b1trace.cuh"
#include "gemv_ring.cuh"
#include "gemv_stream.h"

extern "C" {
#include "../../common/sf.h"
}

#define FS_WARPS 8
#define FS_STAGE_BYTES (FS_WARPS * 2 * FG_RING_V * 32 * 16) /* one ring stage of a block */
#define FS_MAX_X (64 * 1024)   /* largest x (bytes) held in shared memory */

/* 4 bytes global -> shared without registers (cp.async's L1 form: sizes under 16). */
static __device__ __forceinline__ void fs_cp4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}

/* The draw of the FG_BEST instance's row (below): 1 / temperature, and the Gumbel-max stream
 * when it is not greedy. */
struct fs_draw {
    float inv_t;
    bool draw;
    unsigned long long stream;
};
/* What the epilogues read, copied into shared memory in the prologue so that a warp's last
 * unit ends with its stores rather than with a round trip for their inputs: the token's
 * position and slot and the RoPE frequencies (step metadata and constants: before the wait),
 * and, in the add mode, the residual pair of every warp's first unit (after it). */
#define FS_MAX_FREQ 128 /* rot / 2 for head sizes up to 256 */
struct fs_pre {
    int pos, slot;
    float inv_freq[FS_MAX_FREQ];
    uint32_t res[FS_WARPS];
    uint32_t bias[FS_WARPS][2]; /* FG_BIAS: the 4-byte words holding the first unit's bias pair */
    fs_draw draw;               /* FG_BEST: the row's draw */
};

/* FG_BIAS (this file's instances only): norm + RoPE with a bias (4-byte aligned), whose pair for
 * each warp's first unit is copied in the prologue with the weights, so that the first unit's
 * epilogue does not wait an L2 round trip for it after the dot product (Qwen2-7B's QKV
 * projection, traced: its last block ends 0.5 us sooner, 10.30 -> 9.76 us after the kernel
 * before it). An instance of its own: the copy takes the kernel to 46 registers at 3, 5 and 6
 * stages, and the bias-free instance stays at 40, where one of Llama-3-8B's attention blocks
 * still fits beside three of its blocks (qkv_top_stages). */
enum { FG_BIAS = 32 };
/* FG_BEST (with FG_NORM alone: the lm_head of a batch-1 step whose row is drawn greedily or at a
 * temperature alone): the kernel also does sample.cu's one pass over that row as its outputs are
 * made. Lane 0 of each warp keeps, packed sf_sample_key(v) << 32 | ~i so that ties go to the
 * smaller i, the largest x = y[i] * inv_t that is not NaN (the greedy id, and a drawn row's
 * fallback) and, with rp.draw, the largest Gumbel-max value x - log(-log1p(-u)) over the x that
 * are neither NaN nor -inf, i < rp.best_n, y the value the epilogue stores; one atomicMax a warp
 * into rp.best[0] and [1] at its end (sf_k_gemv_norm_best). The draw's own pass over the row
 * (10-12 us after the lm_head at batch 1, traced in session 19) becomes sf_k_sample_best_put's
 * read of two words. */
enum { FG_BEST = 64 };
struct fs_best {
    float v = -INFINITY; /* the largest x and its id (sample.cu best_combine's order) */
    int i = INT_MAX;
    unsigned long long drawn = 0;
    /* the unit whose outputs are still to be added (rows ra, rb; a, b with their bias) */
    float pa, pb;
    int ra = -1, rb;
    __device__ __forceinline__ void add(const fs_draw &d, float val, int id, int n)
    {
        if (id >= n) return;
        const float x = __fmul_rn(bf2f(f2bf(val)), d.inv_t);
        if (x != x) return;
        if (x > v || (x == v && id < i)) { v = x; i = id; }
        if (d.draw && x != -INFINITY) {
            const unsigned long long q = sf_sample_pack(sf_sample_gumbel(x, sf_sample_uniform(d.stream, (uint32_t)id)), id);
            if (q > drawn) drawn = q;
        }
    }
    /* the pending unit, if any: called where the warp would wait for memory anyway */
    __device__ __forceinline__ void flush(const fs_draw &d, int n)
    {
        if (ra < 0) return;
        add(d, pa, ra, n);
        if (rb != ra) add(d, pb, rb, n);
        ra = -1;
    }
    __device__ __forceinline__ unsigned long long first() const
    {
        return i == INT_MAX ? 0 : sf_sample_pack(v, i);
    }
};
static __device__ __forceinline__ float fs_half(uint32_t w, int odd)
{
    return __uint_as_float((odd ? w & 0xffff0000u : w << 16));
}

/* fg_epilogue, with the RoPE inputs from pre (rope_pre) and, for res >= 0, the residual pair
 * from pre.res[res]. */
template <int MODE>
static __device__ __forceinline__ void fs_epilogue(const fg_unit &r, int u, float a, float b,
                                                   const bf16 *__restrict__ bias, bf16 *__restrict__ y,
                                                   const fg_rope &rp, const fs_pre &pre, bool rope_pre, int res)
{
    if ((MODE & FG_ROPE) && rope_pre) {
        if ((MODE & FG_BIAS) && res >= 0) { a += fs_half(pre.bias[res][0], r.ra & 1); b += fs_half(pre.bias[res][1], r.rb & 1); }
        else if (bias) { a += bf2f(bias[r.ra]); b += bf2f(bias[r.rb]); }
        fg_rope_out(r, a, b, &pre.pos, pre.slot, pre.inv_freq, rp, y);
    } else if ((MODE & FG_ADD) && res >= 0) { /* rows ra, ra + 1 */
        if (bias) { a += bf2f(bias[r.ra]); b += bf2f(bias[r.rb]); }
        const bf162 yr = *(const bf162 *)&pre.res[res];
        *(bf162 *)(y + r.ra) = __floats2bfloat162_rn(fg_add_res(__low2float(yr), a), fg_add_res(__high2float(yr), b));
    } else {
        fg_epilogue<MODE>(r, u, a, b, bias, y, rp);
    }
}

/* MODE: FG_NORM (| FG_GLU | FG_ROPE), FG_ADD or 0 (plain); ST ring stages per warp; TR: with the
 * timeline marks (b1trace.cuh; a separate instance, so that the default kernel keeps its 40
 * registers: a runtime switch in it had cost 17% of the 8B layer chain). Dynamic shared memory:
 * x (k bf16, 16-byte rounded), then FS_WARPS rings of ST stages. */
template <int MODE, int ST, bool TR>
__global__ void __launch_bounds__(FS_WARPS * 32) k_gemv_stream(const bf16 *__restrict__ x, const bf16 *__restrict__ nw,
                                                               float eps, const bf16 *__restrict__ w,
                                                               const bf16 *__restrict__ bias, int m, int k,
                                                               bf16 *__restrict__ y, fg_rope rp)
{
    /* 128-byte aligned: the ring's cp.async stores run slower into a base that is not (static
     * shared memory, pre and the tracer's record, comes first) */
    extern __shared__ __align__(128) unsigned char fs_smem[];
    __shared__ float red[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k8 = k / 8;
    const int units = fg_units(MODE, m), nwarps = gridDim.x * FS_WARPS;
    const int n_st = (k8 + 32 * FG_RING_V - 1) / (32 * FG_RING_V); /* ring stages per unit */
    bf16x8 *xs = (bf16x8 *)fs_smem;
    uint4 *ring = (uint4 *)(fs_smem + ((size_t)k * 2 + 15) / 16 * 16) + (size_t)warp * ST * 2 * FG_RING_V * 32 + lane;
    __shared__ sf_tr tr;
    __shared__ fs_pre pre;
    fs_best best; /* FG_BEST: lane 0's */
    if (TR) tr_begin(tr);
    sf_pdl_trigger();

    /* The issue cursor: unit iu, its stage it, the ring slot islot; rows ia, ib. */
    int iu = warp * gridDim.x + blockIdx.x, it = 0, islot = 0;
    const uint4 *ia = NULL, *ib = NULL;
    auto rows_of = [&](int u) {
        const fg_unit r = fg_unit_rows<MODE>(u, m, rp);
        ia = (const uint4 *)(w + (int64_t)r.ra * k);
        ib = (const uint4 *)(w + (int64_t)r.rb * k);
    };
    if (iu < units) rows_of(iu);
    auto issue = [&]() { /* the cursor's stage into its slot, then one group (empty past the end) */
        gr_issue<ST>(iu, it, islot, n_st, nwarps, units, [&](int st, int sl) {
            gr_stage_copy<2>(ring + (size_t)sl * 2 * FG_RING_V * 32, ia, ib, st, k8, lane);
        }, rows_of);
    };
#pragma unroll
    for (int t = 0; t < ST - 1; t++) issue(); /* weights only: before the wait */
    /* The norm weight (a weight too) into the ring slot the loop fills first, which is free
     * until then: slot ST - 1 of every warp's ring holds RING_SLOT 16-byte vectors, so k up to
     * FS_WARPS * RING_SLOT * 8 fits; thread i copies, and later reads, the vectors i + n * 256. */
    constexpr int RING_SLOT = 2 * FG_RING_V * 32, NT = FS_WARPS * 32;
    uint4 *nw_slot = (uint4 *)(fs_smem + ((size_t)k * 2 + 15) / 16 * 16) + (ST - 1) * RING_SLOT;
    auto nw_at = [&](int i) { return (bf16x8 *)(nw_slot + (i / RING_SLOT) * (ST * RING_SLOT) + i % RING_SLOT); };
    const bool nw_pre = (MODE & FG_NORM) && k8 <= FS_WARPS * RING_SLOT;
    if (nw_pre) for (int i = threadIdx.x; i < k8; i += NT) sf_cp_async16(nw_at(i), (const uint4 *)nw + i, 16);
    const bool rope_pre = (MODE & FG_ROPE) && rp.rot / 2 <= FS_MAX_FREQ;
    if (rope_pre) {
        if (threadIdx.x < rp.rot / 2) fs_cp4(&pre.inv_freq[threadIdx.x], rp.inv_freq + threadIdx.x);
        if (threadIdx.x == NT - 1) { fs_cp4(&pre.pos, rp.pos); fs_cp4(&pre.slot, rp.slot); }
    }
    if ((MODE & FG_BIAS) && lane == 0 && blockIdx.x + warp * gridDim.x < units) {
        const fg_unit r = fg_unit_rows<MODE>(warp * gridDim.x + blockIdx.x, m, rp);
        fs_cp4(&pre.bias[warp][0], bias + (r.ra & ~1));
        fs_cp4(&pre.bias[warp][1], bias + (r.rb & ~1));
    }
    gr_commit();
    if ((MODE & FG_BEST) && threadIdx.x == 0) { /* the row, written by the host before the step */
        fs_draw d = { 1.0f, false, 0 };
        if (rp.draw) {
            const sf_k_sample_row p = *rp.draw;
            d.draw = !sf_sample_greedy(p.temperature, p.top_k);
            if (d.draw) {
                d.inv_t = __fdiv_rn(1.0f, p.temperature);
                d.stream = sf_sample_stream(p.seed, p.step);
            }
        }
        pre.draw = d;
    }
    sf_pdl_wait(); /* x, y and the cache may be written by the kernels before */
    if (TR) tr_waited(tr);
    const int u0 = warp * gridDim.x + blockIdx.x; /* the warp's first unit */
    /* add mode: the residual pair (rows 2 u0, 2 u0 + 1, 4-byte aligned) of the first unit */
    const bool res_pre = (MODE & FG_ADD) && u0 < units && 2 * u0 + 1 < m && (uintptr_t)y % 4 == 0;
    if (res_pre && lane == 0) fs_cp4(&pre.res[warp], y + 2 * u0);

    /* x into shared memory in one round of copies (a load per vector, each waited on in turn,
     * took one L2 round trip per 256 vectors); each thread then works on the vectors it copied */
    const bf16x8 *x8 = (const bf16x8 *)x;
    for (int i = threadIdx.x; i < k8; i += NT) sf_cp_async16(&xs[i], x8 + i, 16);
    gr_commit();
    gr_wait<0>(); /* x, the norm weight, and the ring's first stages */
    if (MODE & FG_NORM) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < k8; i += NT) {
            const bf16x8 v = xs[i];
            ss = gr_sumsq8(v, ss);
        }
        const float inv = rsqrtf(block_sum(ss, red) / (float)k + eps);
        if (nw_pre)
            for (int i = threadIdx.x; i < k8; i += NT) xs[i] = gr_scale8(xs[i], *nw_at(i), inv);
        else
            gr_row_scale(xs, (const bf16x8 *)nw, inv, k8, NT);
    }
    __syncthreads(); /* xs complete, and the norm weight read before the loop refills its slot */
    if (TR) tr_ready(tr);

    int cslot = 0;
    for (int u = warp * gridDim.x + blockIdx.x; u < units; u += nwarps) {
        float acc_a = 0.0f, acc_b = 0.0f;
        for (int t = 0; t < n_st; t++) {
            issue();              /* into the slot consumed last */
            /* FG_BEST: the unit before, once this one's next stage is on its way (in the
             * epilogue, lane 0's work would hold back the warp's next issue) */
            if ((MODE & FG_BEST) && t == 0 && lane == 0) best.flush(pre.draw, rp.best_n);
            gr_wait<ST - 1>();    /* this stage has landed */
            gr_stage_dot<2>(ring + (size_t)cslot * 2 * FG_RING_V * 32, xs, t, k8, lane, acc_a, acc_b);
            if (++cslot == ST) cslot = 0;
        }
        acc_a = warp_sum(acc_a);
        acc_b = warp_sum(acc_b);
        if (lane == 0) {
            const fg_unit r = fg_unit_rows<MODE>(u, m, rp);
            fs_epilogue<MODE>(r, u, acc_a, acc_b, bias, y, rp, pre, rope_pre,
                              (res_pre || (MODE & FG_BIAS)) && u == u0 ? warp : -1);
            if (MODE & FG_BEST) {
                best.pa = acc_a + (bias ? bf2f(bias[r.ra]) : 0.0f);
                best.pb = acc_b + (bias ? bf2f(bias[r.rb]) : 0.0f);
                best.ra = r.ra;
                best.rb = r.rb;
            }
        }
    }
    if ((MODE & FG_BEST) && lane == 0) { /* the warp's two bests, an atomic each */
        best.flush(pre.draw, rp.best_n);
        const unsigned long long first = best.first();
        if (first) atomicMax(rp.best, first);
        if (best.drawn) atomicMax(rp.best + 1, best.drawn);
    }
    gr_wait<0>();
    if (TR) tr_end(tr, SF_TR_GEMV + (MODE & ~FG_BEST), m, k);
}

SF_TR_SETTER(sf_k_gemv_stream_trace)

/* A forced configuration: blocks per SM x 10 + ring stages (13..16, 23..26, 33..36); 0: none. */
static bool cfg_valid(int cfg) { return cfg / 10 >= 1 && cfg / 10 <= 3 && cfg % 10 >= 3 && cfg % 10 <= 6; }

/* SEMFLOW_CUDA_GEMV_CFG forces one for every launch (benchmarks); 0: planned. */
static int forced_cfg(void)
{
    static const int cfg =
        gr_env_cfg("SEMFLOW_CUDA_GEMV_CFG", 36, cfg_valid, "blocks per SM (1..3) x 10 + ring stages (3..6), e.g. 25");
    return cfg;
}

/* SEMFLOW_CUDA_GEMV_PLAN="qkv=33,o=25,gu=26,down=25,head=26" forces a configuration per op
 * (comparisons in one device call; any subset, SEMFLOW_CUDA_GEMV_CFG still wins): qkv is the
 * norm (+ RoPE) GEMV, gu the norm + glu one, o and down the residual-add and plain ones with
 * k <= m and k > m, head the norm GEMV of more than HEAD_ROWS rows (the lm_head of a batch-1
 * step, the output norm in its prologue). Read once. */
enum { OP_QKV, OP_O, OP_GU, OP_DOWN, OP_HEAD, OP_N };
/* A norm GEMV of more rows than this is an lm_head, not a QKV projection (Llama-3-405B's QKV is
 * 18432 rows, the smallest vocabularies 32000): no attention block runs beside it. */
#define HEAD_ROWS 32768
/* Which op a launch is: the class SEMFLOW_CUDA_GEMV_PLAN names and plan() sizes. */
static int op_class(int mode, int m, int k)
{
    mode &= ~FG_BEST;
    return mode & FG_GLU                       ? OP_GU
           : mode & FG_ADD || !mode            ? (k <= m ? OP_O : OP_DOWN)
           : mode == FG_NORM && m > HEAD_ROWS ? OP_HEAD
                                              : OP_QKV;
}

static int op_cfg(int op)
{
    static int cfg[OP_N] = { -1 };
    if (cfg[0] < 0) {
        static const char *names[OP_N] = { "qkv", "o", "gu", "down", "head" };
        memset(cfg, 0, sizeof cfg);
        const char *e = getenv("SEMFLOW_CUDA_GEMV_PLAN");
        for (const char *p = e; p && *p;) {
            const char *eq = strchr(p, '='), *end = strchr(p, ',');
            if (!end) end = p + strlen(p);
            char *num_end = NULL;
            int op = -1, c = eq && eq < end ? (int)strtol(eq + 1, &num_end, 10) : 0;
            if (num_end != end) c = 0; /* "o=25x", "o=": not a configuration */
            for (int i = 0; i < OP_N && eq && eq < end; i++)
                if ((size_t)(eq - p) == strlen(names[i]) && !strncmp(p, names[i], eq - p)) op = i;
            if (op < 0 || !cfg_valid(c))
                SF_LOGW("SEMFLOW_CUDA_GEMV_PLAN: '%.*s' is not OP=CFG with OP one of qkv, o, gu, down and CFG blocks "
                        "per SM (1..3) x 10 + ring stages (3..6), e.g. o=25; ignored",
                        (int)(end - p), p);
            else cfg[op] = c;
            p = *end ? end + 1 : end;
        }
    }
    return cfg[op];
}

/* Registers a block of the untraced QKV (norm + RoPE, with FG_BIAS when bias) instance of st
 * stages takes; 0 if unknown. */
template <int M> static cudaError_t qkv_attr(cudaFuncAttributes *a, int st)
{
    return st == 3   ? cudaFuncGetAttributes(a, k_gemv_stream<M, 3, false>)
           : st == 4 ? cudaFuncGetAttributes(a, k_gemv_stream<M, 4, false>)
           : st == 5 ? cudaFuncGetAttributes(a, k_gemv_stream<M, 5, false>)
                     : cudaFuncGetAttributes(a, k_gemv_stream<M, 6, false>);
}
static int qkv_block_regs(int st, bool bias)
{
    cudaFuncAttributes a;
    const cudaError_t e = bias ? qkv_attr<FG_NORM | FG_ROPE | FG_BIAS>(&a, st) : qkv_attr<FG_NORM | FG_ROPE>(&a, st);
    if (e) cudaGetLastError();
    return e ? 0 : sf_k_block_regs(a, FS_WARPS * 32);
}

/* The deepest ring (3..6 stages) at three blocks per SM of the QKV projection (norm + RoPE, its
 * bias instance where mode has FG_BIAS) that leaves room on the SM for one block of the step's
 * attention (sf_k_attention_decode_block: its registers and shared memory), which then starts
 * beside the projection's last blocks rather than after them. When even 3 stages leave no room,
 * the deepest that fits: that attention waits for the SM whatever the ring. Qwen2-7B is such a
 * case: its bias instance takes 46 registers at 3 stages (48 allotted), 3 x 12288 beside the
 * attention block's 32768 is past the 65536 of the file, and at 4 stages (40 registers) the shared memory
 * is short, so it runs 4 stages as it did when its attention was the 8-head instance
 * (~220 registers, beside nothing). Measured so: Qwen2-7B with the bias-free instance at 3
 * stages beside the attention 3.677-3.721 ms at 512 keys, the bias instance at 4 stages
 * 3.650-3.705 (docs/PERFORMANCE.md, session 15). Without the attention's shape (the norm mode
 * alone), 3. Cached per device, bias and (head size, group). Beside the tensor-core one-token
 * attention, whose block fits beside no such ring, plan() makes none. */
static int qkv_top_stages(int mode, const fg_rope &rp, long fixed, int per_sm)
{
    static int cache[SF_K_MAX_DEVICES][2][2][9];
    const int g = rp.Hkv > 0 ? rp.H / rp.Hkv : 0, d = sf_k_dev(), h = rp.hd == 128, bi = (mode & FG_BIAS) != 0;
    int a_regs = 0, a_smem = 0, regfile = 0, dev = -1;
    if (!(mode & FG_ROPE) || g < 1 || g > 8 || (rp.hd != 64 && rp.hd != 128)) return 3;
    if (d >= 0 && cache[d][bi][h][g]) return cache[d][bi][h][g];
    int top = 3;
    if (!sf_k_attention_decode_block(rp.hd, g, &a_regs, &a_smem) && !cudaGetDevice(&dev) &&
        !cudaDeviceGetAttribute(&regfile, cudaDevAttrMaxRegistersPerMultiprocessor, dev)) {
        top = 0;
        for (int st = 6; st >= 3 && !top; st--) {
            const int regs = qkv_block_regs(st, bi);
            if ((st * (long)FS_STAGE_BYTES + fixed) * 3 + a_smem <= per_sm && 3 * regs + a_regs <= regfile) top = st;
        }
        if (!top) top = 6; /* no room at any depth */
    } else {
        cudaGetLastError();
    }
    if (d >= 0) cache[d][bi][h][g] = top;
    return top;
}

/* Ring depth and blocks for a shape. Planned (want 0): the deepest ring (3..6 stages) with which
 * per_sm blocks fit an SM (3 for the plain norm mode, the QKV projection, but 2 for an lm_head
 * past HEAD_ROWS: Llama-3-8B batch 1 at 512 keys 3.8515-3.8531 ms against 3.8546 at 3 x 3 and
 * 3.8556 at 2 x 5, session 18; 2 otherwise; fewer when even 3 stages do not fit), as measured
 * best per op in test_gemv --perf; at three blocks the QKV projection's ring stops where an
 * attention block still fits beside it (qkv_top_stages: 3 stages for Llama-3-8B, whose batch 1
 * at 512 keys was faster so than at 4 in 13 of 14 comparisons over six device calls, 0.1-0.9%,
 * docs/PERFORMANCE.md session 10; 4 for Qwen2-7B, whose attention block fits beside none:
 * 3.77-3.78 against 3.84-3.88 ms at 512 keys, 4.17 against 4.27-4.31 at 4096, session 14).
 * Forced (want = blocks per SM x 10 + stages): that, if it fits. Returns the stages, 0 when
 * nothing fits.
 * The grid is the resident capacity (blocks per SM x SMs, fewer only when there are fewer units),
 * and the kernel deals the units round the blocks first, so every block, and so every SM, gets
 * the same number of units plus or minus one: the SM with the most bytes sets the kernel's time.
 * The grid was the fewest blocks that give every warp the same number of units, filled warp by
 * warp: Qwen2-7B's down projection (1792 units of 76 KB, one a warp) then ran 224 blocks, two
 * on 92 SMs and one on 40, and took 35.4 us (90% of the copy rate), as long as the busiest SMs
 * (16 units, 1.21 MB) take at 34 GB/s, one SM's share of the ~4.6 TB/s a read-only stream gets
 * (bench/device/readbw.cu); dealt round the blocks (13-14 units an SM) 32.5 us (98%), the layer
 * chain 119.4 -> 111.8 us (session 14, docs/PERFORMANCE.md). */
static int plan(int mode, int op, int units, int k, int want, const fg_rope &rp, int attn, int *grid)
{
    int per_sm, reserved, sms;
    gr_smem_limits(&per_sm, &reserved, &sms);
    if (!sms || (size_t)k * 2 > FS_MAX_X) return 0;
    const long x_bytes = ((long)k * 2 + 15) / 16 * 16;
    const long fixed = x_bytes + reserved + 32 * 4 /* red */ + sizeof(fs_pre) + 128 /* the ring's alignment */;
    int st = 0, blocks_per_sm = 0;
    if (want) {
        if ((want % 10 * (long)FS_STAGE_BYTES + fixed) * (want / 10) <= per_sm) { st = want % 10; blocks_per_sm = want / 10; }
    } else {
        const bool qkv = op == OP_QKV;
        /* Beside the one-token tensor-core attention no plan: that block (128 KiB; the 8-warp
         * one 192) fits beside no ring of the QKV projection's three blocks, and gemv_fused.cu's
         * per-warp ring kernel (4 stages a warp) then takes the projection. Measured against these persistent warps
         * (session 23, five device calls): Llama-3-8B 0.4-0.7% faster a step at 4096 keys, 0.5%
         * at 512 and 2048, Qwen2-7B 0.8% at 4096 keys, 0.1% at 2048; persistent warps at 1 block
         * x 3-5 or 2 blocks x 4-6 stages slower (docs/PERFORMANCE.md, sessions 22-23). */
        if (qkv && (attn == SF_K_ATTN_DEC_B1 || attn == SF_K_ATTN_DEC_B1_8W)) return 0;
        const int top = qkv ? qkv_top_stages(mode, rp, fixed, per_sm) : 6;
        for (int b = qkv ? 3 : 2; b >= 1 && !st; b--)
            for (int s = qkv && b == 3 ? top : 6; s >= 3 && !st; s--)
                if ((s * (long)FS_STAGE_BYTES + fixed) * b <= per_sm) { st = s; blocks_per_sm = b; }
    }
    if (!st) return 0;
    *grid = (int)SF_MIN((long)blocks_per_sm * sms, (long)units);
    return st;
}

template <int MODE, int ST, bool TR>
static int launch_v(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias, int m,
                    int k, uint16_t *y, const fg_rope &rp, int grid, cudaStream_t s)
{
    const size_t smem = ((size_t)k * 2 + 15) / 16 * 16 + (size_t)ST * FS_STAGE_BYTES;
    static sf_k_smem smem_set; /* per instance */
    int e = sf_k_smem_attr(&smem_set, k_gemv_stream<MODE, ST, TR>, smem);
    if (e) return e;
    int rc = sf_launch_pdl(k_gemv_stream<MODE, ST, TR>, dim3(grid), dim3(FS_WARPS * 32), smem, s, (const bf16 *)x,
                           (const bf16 *)nw, eps, (const bf16 *)w, (const bf16 *)bias, m, k, (bf16 *)y, rp);
    return rc ? rc : sf_launch_status();
}

template <int MODE, int ST>
static int launch(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias, int m,
                  int k, uint16_t *y, const fg_rope &rp, int grid, cudaStream_t s)
{
    static const bool traced = tr_wanted(); /* SEMFLOW_CUDA_TRACE: the marked instances */
    return traced ? launch_v<MODE, ST, true>(x, nw, eps, w, bias, m, k, y, rp, grid, s)
                  : launch_v<MODE, ST, false>(x, nw, eps, w, bias, m, k, y, rp, grid, s);
}

template <int MODE>
static int launch_st(int st, const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                     const uint16_t *bias, int m, int k, uint16_t *y, const fg_rope &rp, int grid, cudaStream_t s)
{
    switch (st) {
    case 3: return launch<MODE, 3>(x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case 4: return launch<MODE, 4>(x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case 5: return launch<MODE, 5>(x, nw, eps, w, bias, m, k, y, rp, grid, s);
    default: return launch<MODE, 6>(x, nw, eps, w, bias, m, k, y, rp, grid, s);
    }
}

/* want 0: planned (or SEMFLOW_CUDA_GEMV_CFG); else blocks per SM x 10 + stages (benchmarks). */
/* plan() for a launch of mode (want 0: SEMFLOW_CUDA_GEMV_CFG, else _PLAN, else planned). */
static int stream_plan(int mode, int want, int m, int k, const fg_rope &rp, int attn, int *grid)
{
    const int op = op_class(mode, m, k);
    return plan(mode, op, fg_units(mode, m), k, want ? want : forced_cfg() ? forced_cfg() : op_cfg(op), rp, attn, grid);
}

static int stream(int mode, int want, const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                  const uint16_t *bias, int m, int k, uint16_t *y, const fg_rope &rp, cudaStream_t s, int attn = 0)
{
    int grid = 0;
    if (mode == (FG_NORM | FG_ROPE) && bias && (uintptr_t)bias % 4 == 0) mode |= FG_BIAS;
    const int st = stream_plan(mode, want, m, k, rp, attn, &grid);
    if (!st || fg_units(mode, m) < 1) return -1;
    switch (mode) {
    case 0: return launch_st<0>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_NORM: return launch_st<FG_NORM>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_NORM | FG_BEST: return launch_st<FG_NORM | FG_BEST>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_NORM | FG_GLU: return launch_st<FG_NORM | FG_GLU>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_NORM | FG_ROPE: return launch_st<FG_NORM | FG_ROPE>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_NORM | FG_ROPE | FG_BIAS:
        return launch_st<FG_NORM | FG_ROPE | FG_BIAS>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    case FG_ADD: return launch_st<FG_ADD>(st, x, nw, eps, w, bias, m, k, y, rp, grid, s);
    default: return -1;
    }
}

int sf_gemv_stream(int mode, const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                   const uint16_t *bias, int m, int k, uint16_t *y, const fg_rope &rp, cudaStream_t s, int attn_kernel)
{
    return stream(mode, 0, x, nw, eps, w, bias, m, k, y, rp, s, attn_kernel);
}

/* SEMFLOW_CUDA_GEMV_RING, as gemv_fused.cu reads it: 3 (the default) is this file's kernels */
static long ring_env(void)
{
    static const long ring = sf_env_long("SEMFLOW_CUDA_GEMV_RING", 3, 0, 3);
    return ring;
}

extern "C" int sf_k_gemv_stream_plain(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k,
                                      uint16_t *y, cudaStream_t s)
{
    fg_rope rp = {};
    if (!y || m < 1) return (int)cudaErrorInvalidValue;
    if (sf_k_gemv_fused_ok(x, w, k) && ring_env() == 3) {
        const int rc = stream(0, 0, x, NULL, 0.0f, w, bias, m, k, y, rp, s);
        if (rc >= 0) return rc;
    }
    return sf_k_gemv(x, k, w, bias, 1, m, k, y, m, s);
}

extern "C" int sf_k_gemv_norm_best_ok(const void *x, const void *nw, const void *w, int m, int k)
{
    fg_rope rp = {};
    int grid = 0;
    return ring_env() == 3 && sf_k_gemv_fused_ok(x, w, k) && k <= SF_K_GEMV_NORM_MAX_K && nw &&
           (uintptr_t)nw % 16 == 0 && m >= 1 && stream_plan(FG_NORM | FG_BEST, 0, m, k, rp, 0, &grid) > 0;
}

extern "C" int sf_k_gemv_norm_best(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w,
                                   const uint16_t *bias, int m, int k, uint16_t *y, unsigned long long *best,
                                   int best_n, const sf_k_sample_row *draw, cudaStream_t s)
{
    if (!best || best_n < 0 || best_n > m || !y) return (int)cudaErrorInvalidValue;
    if (!sf_k_gemv_norm_best_ok(x, nw, w, m, k)) return (int)cudaErrorNotSupported;
    fg_rope rp = {};
    rp.best = best;
    rp.best_n = best_n;
    rp.draw = draw;
    const int rc = stream(FG_NORM | FG_BEST, 0, x, nw, eps, w, bias, m, k, y, rp, s);
    return rc < 0 ? (int)cudaErrorNotSupported : rc;
}

/* Benchmarks: kind 0 norm, 1 norm + glu, 2 add, 3 plain (gemv_stream.h), with cfg = blocks per
 * SM x 10 + ring stages; no bias. */
extern "C" int sf_k_gemv_stream_tune(int kind, int cfg, const uint16_t *x, const uint16_t *nw, const uint16_t *w,
                                     int m, int k, uint16_t *y, cudaStream_t s)
{
    fg_rope rp = {};
    if (!sf_k_gemv_fused_ok(x, w, k) || m < 2 || m % 2 || !cfg_valid(cfg) || kind < 0 || kind > 3)
        return (int)cudaErrorInvalidValue;
    const int mode = kind == 0 ? FG_NORM : kind == 1 ? FG_NORM | FG_GLU : kind == 2 ? FG_ADD : 0;
    const int rc = stream(mode, cfg, x, nw, 1e-5f, w, NULL, m, k, y, rp, s);
    return rc < 0 ? (int)cudaErrorInvalidValue : rc;
}
