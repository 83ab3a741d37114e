/* sample.cu — one token per logit row on the GPU, so only ids cross PCIe.
 *
 * One block of 1024 threads per row (a call of a few rows: each row over several blocks, see
 * split_row and split_top_p); the step-by-step mirror of kernels/cpu/sample.c (read
 * that first: the boundaries (t, c), the radix selection, the Gumbel-max draw). Each pass
 * streams the row (bf16) from L2/HBM, 8 ids per thread and 16-byte load (every pass is an
 * order-free reduction: integer sums, histograms, a total order on (value, id)), so the order in
 * which a thread visits its ids changes no result; the number of passes depends on the request:
 *   greedy 1; temperature only 1; top-k (k <= TOPK_CAP) 3, top-p without it 4 (the max, bins
 *   of m - x, a gather; the draw), + 4-8 where a bin is too crowded and the radix digits decide
 *   (the reference's way); min-p 0.
 * Bins and radix histograms are in shared memory; masses are 2^-40 fixed point, so the integer
 * atomics give the same sums in any order and the same seed gives the same token every run.
 * Penalized tokens are marked in a shared-memory bitmap (vocab bits) and visited from the
 * row's entry list with their penalized value instead of from the row. A row's allow mask
 * (global memory, vocab bits; a request held to a form) keeps the ids it does not allow out of
 * every pass, as the reference's -inf does. */
#include <climits>

#include "../sample_draw.h"
#include "b1trace.cuh"
#include "common.cuh"

#define NT 1024
#define FULL 0xffffffffu

typedef unsigned long long u64;

struct Row {
    const bf16 *l;
    int vocab, lo, hi;          /* the row's length; the ids a pass visits (a part of a split row) */
    const uint32_t *bits;       /* penalized ids (shared memory), NULL when the row has none */
    const uint32_t *allow;      /* allowed ids (global memory), NULL: all; the others are never visited */
    const sf_k_sample_pen *e;   /* the row's entries and their penalized values */
    const float *ev;
    int n_e;
    float inv_t, m;
    float bs; /* bins per unit of m - x (bin_scale) */
};

#define TOPK_CAP NT /* top-k sets up to this size are gathered into shared memory and sorted */

struct Shared {
    u64 h[256];
    u64 red[32];
    float redf[32];
    int redi[32];
    int sel, n, kp;
    u64 acc, want, on_key;
    u64 top[TOPK_CAP];  /* the gathered top-k set: key << 32 | ~id, sorted descending */
};

#define VW 8 /* ids per thread and 16-byte load */

/* The 8 logits from id i on; those from hi on read as 0 (visit passes them as out). */
static __device__ __forceinline__ uint4 ld8(const Row &r, int i, int hi)
{
    if (i + VW <= hi) return __ldg((const uint4 *)(r.l + i));
    uint4 v = make_uint4(0, 0, 0, 0);
    bf16 *h = (bf16 *)&v;
    for (int j = 0; j < VW && i + j < hi; j++) h[j] = r.l[i + j];
    return v;
}

static __device__ __forceinline__ bool allowed(const Row &r, int id)
{
    return !r.allow || ((__ldg(&r.allow[id >> 5]) >> (id & 31)) & 1u);
}

/* f over the row's ids [lo, hi) (penalized ones passed as out: visit adds them from the list;
 * ids the row's mask does not allow as out, and not visited at all). */
template <class F>
static __device__ __forceinline__ void visit_ids(const Row &r, int lo, int hi, F &f)
{
    if (((uintptr_t)(r.l + lo) & 15) == 0) {
        /* 8 consecutive ids per thread from one 16-byte load, the next load in flight while
         * these are visited: a 128256-token row is 16 dependent round trips, not 126 */
        uint4 next = ld8(r, lo + threadIdx.x * VW, hi);
        for (int base = lo; base < hi; base += NT * VW) {
            const int i = base + threadIdx.x * VW;
            const uint4 cur = next;
            if (base + NT * VW < hi) next = ld8(r, i + NT * VW, hi);
            const bf16 *h = (const bf16 *)&cur;
            /* i is a multiple of 8 (parts start on 16-byte loads): its 8 ids share a mask word */
            const uint32_t aw = r.allow && i < hi ? __ldg(&r.allow[i >> 5]) : FULL;
#pragma unroll
            for (int j = 0; j < VW; j++) {
                const int id = i + j;
                bool in = id < hi && ((aw >> (id & 31)) & 1u);
                if (in && r.bits && ((r.bits[id >> 5] >> (id & 31)) & 1u)) in = false;
                f(id, in ? bf2f(h[j]) : 0.0f, in);
            }
        }
    } else { /* a row that is not 16-byte aligned (odd vocabulary sizes): one id per load */
        for (int base = lo; base < hi; base += NT) {
            int i = base + threadIdx.x;
            bool in = i < hi && allowed(r, i);
            if (in && r.bits && ((r.bits[i >> 5] >> (i & 31)) & 1u)) in = false;
            f(i, in ? bf2f(r.l[i]) : 0.0f, in);
        }
    }
}

/* f(id, logit, in) for every token of the row, each once: penalized ones with their new value.
 * Every thread makes the same number of calls (in = 0 on the ragged end), so a warp arrives
 * whole at each call and f may use warp-wide intrinsics. */
template <class F>
static __device__ __forceinline__ void visit(const Row &r, F &f)
{
    visit_ids(r, r.lo, r.hi, f);
    for (int base = 0; base < r.n_e; base += NT) {
        int j = base + threadIdx.x;
        bool in = j < r.n_e;
        const int id = in ? r.e[j].id : 0;
        in = in && id >= r.lo && id < r.hi && allowed(r, id); /* a part of a split row: its own ids */
        f(id, in ? r.ev[j] : 0.0f, in);
    }
}

static __device__ __forceinline__ bool valid(float x) { return x == x && x != -INFINITY; }

static __device__ __forceinline__ u64 mass_of(float x, float m)
{
    return (u64)(expf(x - m) * SF_SAMPLE_MASS_ONE);
}

/* (value descending, id ascending); identity (-inf, INT_MAX). */
static __device__ __forceinline__ void best_combine(float &v, int &i, float v2, int i2)
{
    if (v2 > v || (v2 == v && i2 < i)) { v = v2; i = i2; }
}

static __device__ void block_best(float &v, int &i, Shared &sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best_combine(v, i, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, i, o));
    __syncthreads();
    if (lane == 0) { sh.redf[w] = v; sh.redi[w] = i; }
    __syncthreads();
    v = sh.redf[lane];
    i = sh.redi[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best_combine(v, i, __shfl_xor_sync(FULL, v, o), __shfl_xor_sync(FULL, i, o));
}

static __device__ u64 block_sum_u64(u64 x, Shared &sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    __syncthreads();
    if (lane == 0) sh.red[w] = x;
    __syncthreads();
    x = sh.red[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(FULL, x, o);
    return x;
}

static __device__ u64 block_max_u64(u64 x, Shared &sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { u64 y = __shfl_xor_sync(FULL, x, o); x = y > x ? y : x; }
    __syncthreads();
    if (lane == 0) sh.red[w] = x;
    __syncthreads();
    x = sh.red[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) { u64 y = __shfl_xor_sync(FULL, x, o); x = y > x ? y : x; }
    return x;
}

/* Inclusive prefix sum over the block (thread order). */
static __device__ u64 block_scan_u64(u64 x, Shared &sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(FULL, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh.red[w] = x;
    __syncthreads();
    u64 before = 0;
    for (int k = 0; k < w; k++) before += sh.red[k];
    return x + before;
}

/* The inverse of sf_sample_key. */
static __device__ __forceinline__ float key_float(uint32_t k)
{
    return __uint_as_float(k & 0x80000000u ? k & 0x7fffffffu : ~k);
}

/* ---- passes ---------------------------------------------------------------------------- */
struct FirstPass { /* argmax of x, the count of candidates and the smallest of them */
    float inv_t, v; int i, n;
    float lo = INFINITY;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        float x = __fmul_rn(l, inv_t);
        if (x == x) best_combine(v, i, x, id);
        if (valid(x)) {
            n++;
            lo = fminf(lo, x);
        }
    }
};

struct TiePass { /* about key t: tokens on it, the mass of one, the mass above it */
    float inv_t, m; uint32_t t; int n; u64 one, above;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        float x = __fmul_rn(l, inv_t);
        if (!valid(x)) return;
        uint32_t k = sf_sample_key(x);
        if (k == t) { n++; one = mass_of(x, m); }
        else if (k > t) above += mass_of(x, m);
    }
};

/* MODE 0: count by key; 1: mass by key; 2: count by ~id among the tokens with key t.
 * Most tokens of a row fall in a few bins of the top digits, so the lanes of a warp that hit
 * the same bin add up first (__match_any_sync, __reduce_add_sync) and one of them adds for all:
 * a warp's 32 tokens cost as many shared-memory atomics as they have distinct bins. */
template <int MODE>
struct HistPass {
    float inv_t, m; uint32_t prefix, mask, t; int shift; u64 *h;
    __device__ void operator()(int id, float l, bool in) {
        float x = __fmul_rn(l, inv_t);
        bool take = in && valid(x);
        uint32_t k = take ? sf_sample_key(x) : 0;
        if (MODE == 2) {
            take = take && k == t;
            k = ~(uint32_t)id;
        }
        take = take && (k & mask) == prefix;
        if (!__any_sync(FULL, take)) return; /* past the first digit most warps hold no token of the prefix */
        unsigned bin = take ? (k >> shift) & 255u : 0xffffffffu;
        unsigned grp = __match_any_sync(FULL, bin);
        u64 w;
        if (MODE == 1) { /* masses < 2^41: two 21-bit halves keep the 32-lane sums within 32 bits */
            u64 v = take ? mass_of(x, m) : 0;
            unsigned lo = __reduce_add_sync(grp, (unsigned)(v & 0x1fffffu));
            unsigned hi = __reduce_add_sync(grp, (unsigned)(v >> 21));
            w = ((u64)hi << 21) + lo;
        } else {
            w = (u64)__popc(grp);
        }
        if (take && (threadIdx.x & 31) == __ffs(grp) - 1) atomicAdd(&h[bin], w);
    }
};

/* Whether token id (logit l, in: inside the row) survives the cut: its temperature-scaled
 * logit x has a key above the threshold t, or equal to it with an id at most c. */
static __device__ __forceinline__ bool kept(int id, float l, bool in, float inv_t, uint32_t t, int c, float *x,
                                            uint32_t *k)
{
    if (!in) return false;
    *x = __fmul_rn(l, inv_t);
    if (!valid(*x)) return false;
    *k = sf_sample_key(*x);
    return *k > t || (*k == t && id <= c);
}

/* Token (key k, id) into sh.top's next slot, while there is one (sh.n counts them all). */
static __device__ __forceinline__ void push_top(Shared &sh, uint32_t k, int id)
{
    const int slot = atomicAdd(&sh.n, 1);
    if (slot < TOPK_CAP) sh.top[slot] = (u64)k << 32 | (uint32_t)~(uint32_t)id;
}

struct GatherPass { /* the kept tokens (at most TOPK_CAP) into sh.top */
    float inv_t; uint32_t t; int c; Shared *sh;
    __device__ void operator()(int id, float l, bool in) {
        float x;
        uint32_t k;
        if (!kept(id, l, in, inv_t, t, c, &x, &k)) return;
        push_top(*sh, k, id);
    }
};

struct DrawPass { /* Gumbel-max over the kept tokens */
    float inv_t; uint32_t t; int c; uint64_t stream; float v; int i;
    __device__ void operator()(int id, float l, bool in) {
        float x;
        uint32_t k;
        if (!kept(id, l, in, inv_t, t, c, &x, &k)) return;
        float g = sf_sample_gumbel(x, sf_sample_uniform(stream, (uint32_t)id));
        best_combine(v, i, g, id);
    }
};

struct PlainPass { /* temperature alone: FirstPass and DrawPass (every candidate kept) at once */
    FirstPass f; DrawPass d;
    __device__ void operator()(int id, float l, bool in) { f(id, l, in); d(id, l, in); }
};

/* ---- a row's parts working as one (split_top_p) -------------------------------------------
 * The parts of a row are resident together (a cooperative launch), so they can meet at a
 * barrier of their own: every reduction of the one-block path becomes the part's block
 * reduction, an atomic into the row's slot in global memory, the barrier, and a read of the
 * slot; radix selection merges the parts' histograms the same way. Each reduction and each
 * histogram takes a fresh slot (every part takes the same path, so the same one), and the last
 * part of the row to finish zeroes what the row used. */
struct RowCtx {
    unsigned *bar;  /* arrivals, generation */
    u64 *slot;      /* reductions, in order of use */
    u64 *hist;      /* radix histograms, 256 bins each, in order of use */
    int P, n_slot, n_hist;
    u64 *cand;      /* TOPK_CAP entries the parts gather into */
};
#define ROW_SLOTS 32
#define ROW_HISTS 8

static __device__ void row_sync(RowCtx &rc)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        /* release / acquire by one thread over the block's barrier (common.cuh): the arrival
         * publishes the block's slot and histogram atomics, the last arrival acquires every
         * part's and releases the next generation, the others acquire it */
        const unsigned g = sf_ld_relaxed_gpu(rc.bar + 1);
        if (sf_atom_add_acq_rel_gpu(rc.bar, 1u) == (unsigned)rc.P - 1) {
            sf_st_relaxed_gpu(rc.bar, 0u);
            sf_red_add_release_gpu(rc.bar + 1, 1u);
        } else {
            while (sf_ld_acquire_gpu(rc.bar + 1) == g) __nanosleep(64);
        }
    }
    __syncthreads();
}

/* The block's x (summed, or MAX: the largest) into the row's next slot; the slot holds the
 * row's once every part has passed the next row_sync. */
template <bool MAX>
static __device__ u64 *row_put(u64 x, RowCtx &rc, Shared &sh)
{
    x = MAX ? block_max_u64(x, sh) : block_sum_u64(x, sh);
    u64 *slot = rc.slot + rc.n_slot++;
    if (threadIdx.x == 0 && x) MAX ? atomicMax((unsigned long long *)slot, x) : atomicAdd((unsigned long long *)slot, x);
    return slot;
}

/* x summed (MAX: the largest) over the block, and with rc over the row's parts; every thread
 * gets it. */
template <bool MAX>
static __device__ u64 reduce_u64(u64 x, RowCtx *rc, Shared &sh)
{
    if (!rc) return MAX ? block_max_u64(x, sh) : block_sum_u64(x, sh);
    u64 *slot = row_put<MAX>(x, *rc, sh);
    row_sync(*rc);
    return __ldcg(slot);
}

/* (value descending, id ascending) as one integer: the key above the inverted id; 0 none. */
static __device__ __forceinline__ u64 best_pack(float v, int i)
{
    return i == INT_MAX ? 0 : sf_sample_pack(v, i);
}

/* The best (v, i) of the block, and with rc of the row's parts. */
static __device__ void best_of(float &v, int &i, RowCtx *rc, Shared &sh)
{
    block_best(v, i, sh);
    if (!rc) return;
    const u64 b = reduce_u64<true>(best_pack(v, i), rc, sh);
    v = b ? key_float((uint32_t)(b >> 32)) : -INFINITY;
    i = b ? (int)~(uint32_t)b : INT_MAX;
}

/* The key of the prefix that reaches `want` (see radix_select in kernels/cpu/sample.c); *above:
 * the weight above that key. want 0 (masses only): frac of the first histogram's total, which is
 * the row's mass, so no pass of its own sums it; *want_out then says the value taken. *on_key:
 * the weight on the key itself (the last histogram's bin). */
template <int MODE>
static __device__ uint32_t radix_select(const Row &r, u64 want, uint32_t t, u64 *above, Shared &sh,
                                     RowCtx *rc = nullptr, float frac = 0, u64 *want_out = nullptr,
                                     u64 *on_key = nullptr)
{
    uint32_t prefix = 0, mask = 0;
    u64 acc = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += NT) sh.h[b] = 0;
        __syncthreads();
        HistPass<MODE> f = { r.inv_t, r.m, prefix, mask, t, shift, sh.h };
        visit(r, f);
        __syncthreads();
        if (rc) { /* the row's histogram: the parts' merged */
            u64 *h = rc->hist + 256 * rc->n_hist++;
            for (int b = threadIdx.x; b < 256; b += NT)
                if (sh.h[b]) atomicAdd((unsigned long long *)&h[b], (unsigned long long)sh.h[b]);
            row_sync(*rc);
            for (int b = threadIdx.x; b < 256; b += NT) sh.h[b] = __ldcg(&h[b]);
            __syncthreads();
        }
        if (threadIdx.x < 32) { /* walk the bins from the top: 8 per lane, a warp scan across lanes */
            int lane = threadIdx.x, top = 255 - 8 * lane;
            u64 s = 0;
            for (int j = 0; j < 8; j++) s += sh.h[top - j];
            u64 inc = s;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                u64 y = __shfl_up_sync(FULL, inc, o);
                if (lane >= o) inc += y;
            }
            if (!want) { /* the first digit's bins hold every token once: their sum is the total */
                want = (u64)((double)frac * (double)__shfl_sync(FULL, inc, 31));
                if (want < 1) want = 1;
            }
            unsigned hit = __ballot_sync(FULL, acc + inc >= want);
            int L = hit ? __ffs(hit) - 1 : 31;
            if (lane == L) {
                u64 a = acc + inc - s;
                int b = top;
                for (; b > top - 7; b--) {
                    if (a + sh.h[b] >= want) break;
                    a += sh.h[b];
                }
                sh.sel = b;
                sh.acc = a;
                sh.want = want;
                sh.on_key = sh.h[b];
            }
        }
        __syncthreads();
        prefix |= (uint32_t)sh.sel << shift;
        mask |= 255u << shift;
        acc = sh.acc;
        __syncthreads();
    }
    *above = acc;
    if (want_out) *want_out = sh.want;
    if (on_key) *on_key = sh.on_key;
    __syncthreads(); /* sh.want and sh.on_key read before the next selection writes them */
    return prefix;
}

/* The boundary (t, c) keeping the r first (by id) of the n tokens on key t. */
static __device__ int cut_ties(const Row &r, uint32_t t, u64 rr, int n, Shared &sh, RowCtx *rc = nullptr)
{
    if (rr >= (u64)n) return INT_MAX;
    u64 above;
    return (int)~radix_select<2>(r, rr, t, &above, sh, rc);
}

static __device__ __forceinline__ bool shorter(uint32_t ta, int ca, uint32_t tb, int cb)
{
    return ta > tb || (ta == tb && ca < cb);
}

/* Top-k sets of at most TOPK_CAP tokens: gather them, sort them by (x descending, id
 * ascending) in shared memory, and finish top-p, min-p and the draw there, without further
 * passes over the row. The same choices as the row-wide path (and the CPU reference): top-p
 * keeps the shortest prefix whose mass reaches top_p of the set's mass, min-p the tokens with a
 * key at least the threshold's. Returns the drawn id (every thread). */
static __device__ int finish_set(const Row &r, const sf_k_sample_row &p, int n, Shared &sh);

/* sh.top sorted descending (key << 32 | ~id: key descending, id ascending; 0 last). */
static __device__ void sort_top(Shared &sh)
{
    const int tid = threadIdx.x;
    for (int size = 2; size <= TOPK_CAP; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            int j = tid ^ stride;
            if (j > tid) {
                u64 a = sh.top[tid], b = sh.top[j];
                if ((a < b) == ((tid & size) == 0)) { sh.top[tid] = b; sh.top[j] = a; }
            }
        }
    __syncthreads();
}

/* The tokens the boundary (t, c) keeps into sh.top (unsorted; the rest of its TOPK_CAP slots
 * 0); returns how many (at most TOPK_CAP). */
static __device__ int gather_kept(const Row &r, uint32_t t, int c, Shared &sh)
{
    const int tid = threadIdx.x;
    if (tid == 0) sh.n = 0;
    sh.top[tid] = 0; /* sorts last */
    __syncthreads();
    GatherPass gp = { r.inv_t, t, c, &sh };
    visit(r, gp);
    __syncthreads();
    return SF_MIN(sh.n, TOPK_CAP);
}

static __device__ int small_top_k(const Row &r, const sf_k_sample_row &p, uint32_t t, int c, Shared &sh)
{
    return finish_set(r, p, gather_kept(r, t, c, sh), sh);
}

/* The draw from the set in sh.top (key << 32 | ~id; unused slots 0), of which the first n in
 * the order (key descending, id ascending) are kept before top-p and min-p. */
static __device__ int finish_set(const Row &r, const sf_k_sample_row &p, int n, Shared &sh)
{
    const int tid = threadIdx.x;
    sort_top(sh);
    u64 e = sh.top[tid];
    uint32_t k = (uint32_t)(e >> 32);
    int id = (int)~(uint32_t)e;
    float x = key_float(k);
    int kept = n;
    if (p.top_p < 1.0f) {
        u64 mass = tid < n ? mass_of(x, r.m) : 0;
        u64 zk = block_sum_u64(mass, sh), cum = block_scan_u64(mass, sh);
        u64 want = (u64)((double)p.top_p * (double)zk);
        if (want < 1) want = 1;
        /* the token at which the mass reaches want ends the set: the tokens before it are those
         * whose running mass is still below want (a count, so no thread writes a shared word
         * another may write: compute-sanitizer's racecheck reported the single writer that
         * was here, sh.kp, written by two threads of a block) */
        kept = SF_MIN(kept, 1 + (int)block_sum_u64(tid < n && cum < want, sh));
    }
    if (p.min_p > 0) {
        uint32_t thr = sf_sample_key(r.m + logf(p.min_p));
        kept = SF_MIN(kept, (int)block_sum_u64(tid < n && k >= thr, sh));
    }
    float g = -INFINITY;
    int gi = INT_MAX;
    if (tid < kept) {
        g = sf_sample_gumbel(x, sf_sample_uniform(sf_sample_stream(p.seed, p.step), (uint32_t)id));
        gi = id;
    }
    block_best(g, gi, sh);
    return gi;
}

/* ---- top-k and top-p boundaries from bins of m - x ----------------------------------------
 * The row's masses summed in PB_BINS bins of m - x over the row's range of x, at most PB_RANGE
 * (a token 27.8 or more below the max has no mass in 2^-40 fixed point, so every token with
 * mass has a bin; a narrow row gets finer bins), scanned from the top for the bin where the
 * mass reaches want; that bin's tokens, gathered and sorted by (key descending, id ascending)
 * with their masses summed in that order, give the boundary:
 * the token at which the mass reaches want, the same (t, c) as the radix digits and tie cut
 * (bins are ranges of x, and the key order is x's). Three passes fewer than the radix path
 * where the boundary's bin holds at most TOPK_CAP tokens; otherwise (or if the bins' mass never
 * reaches want) the caller takes the radix path. A top-k set is found the same way with counts:
 * the bins down to the one where the count reaches k hold the top k and the rest of that bin;
 * gathered (at most TOPK_CAP) and sorted, their first k are the set. Bin atomics collide little
 * (a bin is at most 1/36 of a logit), where the radix digits' first bins hold most of the row. */
#define PB_BINS 1024 /* sh.top's u64 slots: the bins first, then the gathered tokens */
#define PB_RANGE 28.0f /* m - x beyond which no token has mass */

/* Bins per unit of m - x for a row whose candidates lie in [lo, m]: PB_BINS over that range,
 * capped at PB_RANGE, so that a narrow row (random weights, a high temperature) gets bins as
 * fine as its spread and its boundary bin stays small. */
static __device__ __forceinline__ float bin_scale(float m, float lo)
{
    const float d = fminf(__fsub_rn(m, lo), PB_RANGE);
    return d > 0 ? __fdiv_rn((float)PB_BINS, d) : 1.0f;
}

static __device__ __forceinline__ int mass_bin(float x, float m, float bs)
{
    return min(PB_BINS - 1, (int)__fmul_rn(__fsub_rn(m, x), bs));
}

/* The smallest candidate as one integer for a max-reduction (0: none), and back. */
static __device__ __forceinline__ u64 lo_pack(float lo)
{
    return lo == INFINITY ? 0 : (u64)(uint32_t)~sf_sample_key(lo);
}

static __device__ __forceinline__ float lo_unpack(u64 p, float m)
{
    return p ? key_float(~(uint32_t)p) : m;
}

struct BinPass { /* mass by bin */
    float inv_t, m, bs; u64 *h;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        const float x = __fmul_rn(l, inv_t);
        if (!valid(x)) return;
        const u64 w = mass_of(x, m);
        if (w) atomicAdd((unsigned long long *)&h[mass_bin(x, m, bs)], (unsigned long long)w);
    }
};

struct CountBinPass { /* tokens by bin (those past the last bin are not counted) */
    float inv_t, m, bs; u64 *h;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        const float x = __fmul_rn(l, inv_t);
        if (!valid(x)) return;
        const int b = mass_bin(x, m, bs);
        if (b < PB_BINS - 1) atomicAdd((unsigned long long *)&h[b], 1ull);
    }
};

struct BinsGatherPass { /* the counted tokens of bins 0..b into sh.top (at most TOPK_CAP) */
    float inv_t, m, bs; int b; Shared *sh;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        const float x = __fmul_rn(l, inv_t);
        if (!valid(x)) return;
        const int bx = mass_bin(x, m, bs);
        if (bx > b || bx == PB_BINS - 1) return;
        push_top(*sh, sf_sample_key(x), id);
    }
};

/* sh.top's PB_BINS slots zeroed, then filled by the pass f (BinPass or CountBinPass). */
template <class F>
static __device__ u64 *bins_of(const Row &r, F f, Shared &sh)
{
    for (int b = threadIdx.x; b < PB_BINS; b += NT) sh.top[b] = 0;
    __syncthreads();
    f.h = sh.top;
    visit(r, f);
    __syncthreads();
    return sh.top;
}

/* The first bin from the top at which the bins' running sum reaches want (0: frac of their
 * total, at least 1) into sh.sel (-1: never), the sum before it into sh.acc, want into sh.want;
 * sh.n zeroed. Every thread returns after them. */
static __device__ void scan_bins(const u64 *h, u64 want, float frac, Shared &sh)
{
    if (threadIdx.x < 32) { /* 32 bins a lane, a warp scan across lanes */
        const int lane = threadIdx.x, lo = 32 * lane;
        u64 sum = 0;
        for (int j = 0; j < 32; j++) sum += h[lo + j];
        u64 inc = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(FULL, inc, o);
            if (lane >= o) inc += y;
        }
        if (!want) {
            want = (u64)((double)frac * (double)__shfl_sync(FULL, inc, 31));
            if (want < 1) want = 1;
        }
        const unsigned hit = __ballot_sync(FULL, inc >= want);
        if (lane == 0) {
            sh.sel = -1;
            sh.n = 0;
        }
        __syncwarp();
        if (hit && lane == __ffs(hit) - 1) {
            u64 a = inc - sum;
            int b = lo;
            for (; b < lo + 31 && a + h[b] < want; b++) a += h[b];
            sh.sel = b;
            sh.acc = a;
            sh.want = want;
        }
    }
    __syncthreads();
}

/* A row's top k (k <= TOPK_CAP) in sh.top, sorted (key descending, id ascending), with the
 * tokens of the rest of the boundary's bin after them and zeros last: the bins of m - x counted,
 * the bins down to the one where the count reaches k gathered. False (nothing gathered) when
 * those bins hold more than TOPK_CAP tokens, or the counted bins fewer than k: then the radix
 * digits decide. */
static __device__ bool top_k_bins(const Row &r, int k, Shared &sh)
{
    const int tid = threadIdx.x;
    const u64 *h = bins_of(r, CountBinPass{ r.inv_t, r.m, r.bs, nullptr }, sh);
    scan_bins(h, (u64)k, 0, sh);
    const int b = sh.sel;
    const u64 n = sh.acc + (b >= 0 ? h[b] : 0);
    __syncthreads(); /* the bins read: sh.top takes the tokens */
    if (b < 0 || n > TOPK_CAP) return false;
    BinsGatherPass gp = { r.inv_t, r.m, r.bs, b, &sh };
    visit(r, gp);
    __syncthreads();
    if (tid >= sh.n) sh.top[tid] = 0;
    sort_top(sh);
    return true;
}

struct BinGatherPass { /* the tokens with mass in bin b into sh.top (at most TOPK_CAP) */
    float inv_t, m, bs; int b; Shared *sh;
    __device__ void operator()(int id, float l, bool in) {
        if (!in) return;
        const float x = __fmul_rn(l, inv_t);
        if (!valid(x) || mass_bin(x, m, bs) != b || !mass_of(x, m)) return;
        push_top(*sh, sf_sample_key(x), id);
    }
};

/* The top-p boundary (*t, *c) of a row (with rc: of the row's parts together); want 0: top_p of
 * the row's mass. False when the caller must take the radix path (rc's histograms then free). */
static __device__ bool top_p_bins(const Row &r, float top_p, u64 want, uint32_t *t, int *c, Shared &sh, RowCtx *rc)
{
    const int tid = threadIdx.x;
    u64 *h = bins_of(r, BinPass{ r.inv_t, r.m, r.bs, nullptr }, sh);
    u64 *rh = NULL;
    if (rc) { /* the row's bins: the parts' merged */
        rh = rc->hist + 256 * rc->n_hist;
        rc->n_hist += PB_BINS / 256;
        for (int b = tid; b < PB_BINS; b += NT)
            if (h[b]) atomicAdd((unsigned long long *)&rh[b], (unsigned long long)h[b]);
        row_sync(*rc);
        for (int b = tid; b < PB_BINS; b += NT) h[b] = __ldcg(&rh[b]);
        __syncthreads();
    }
    scan_bins(h, want, top_p, sh);
    const int b = sh.sel;
    const u64 above = sh.acc;
    want = sh.want;
    __syncthreads(); /* the bins read: sh.top takes the tokens */
    int n = 0;
    if (b >= 0) {
        BinGatherPass gp = { r.inv_t, r.m, r.bs, b, &sh };
        visit(r, gp);
        __syncthreads();
        n = sh.n;
        if (rc) { /* the parts' tokens of the bin, together in the row's candidates */
            u64 *cursor = rc->slot + rc->n_slot++;
            if (tid == 0) sh.kp = n ? (int)atomicAdd((unsigned long long *)cursor, (unsigned long long)n) : 0;
            __syncthreads();
            for (int i = tid; i < n && sh.kp + i < TOPK_CAP; i += NT) rc->cand[sh.kp + i] = sh.top[i];
            row_sync(*rc);
            n = (int)min(__ldcg(cursor), (u64)(TOPK_CAP + 1));
            sh.top[tid] = tid < n ? __ldcg(&rc->cand[tid]) : 0; /* TOPK_CAP == NT */
            __syncthreads();
        } else if (tid >= n) {
            sh.top[tid] = 0;
        }
    }
    bool found = false;
    if (b >= 0 && n <= TOPK_CAP) {
        sort_top(sh);
        const u64 e = sh.top[tid];
        const u64 w = tid < n ? mass_of(key_float((uint32_t)(e >> 32)), r.m) : 0, cum = block_scan_u64(w, sh);
        if (tid == 0) sh.acc = 0;
        __syncthreads();
        if (tid < n && above + cum >= want && above + cum - w < want) sh.acc = e; /* one token */
        __syncthreads();
        found = sh.acc != 0;
        *t = (uint32_t)(sh.acc >> 32);
        *c = (int)~(uint32_t)sh.acc;
        __syncthreads();
    }
    if (!found && rc) { /* every part has read the bins: zeroed for the radix path's use */
        row_sync(*rc);
        if (blockIdx.y == 0)
            for (int i = tid; i < PB_BINS; i += NT) rh[i] = 0;
        rc->n_hist = 0;
        row_sync(*rc);
    }
    return found;
}

/* ---- a row split over several blocks ------------------------------------------------------
 * For a few rows the row's ids are cut into parts, one block each, so a row runs on many SMs
 * instead of one (the Gumbel noise's two logarithms and hash per token made a 128256-token row
 * on one SM 55-59 us slower than a greedy one; top-k 50 + top-p is ~7 passes). The parts of a
 * row meet through its RowCtx (the launch is cooperative). Greedy and temperature-only rows are
 * one argmax pass (of x, and of x + noise): the parts' bests meet in the row's slots. A top-k
 * row (k x parts <= TOPK_CAP) takes each part's own top k by the same selection as the whole
 * row (the radix passes see only the part), whose union holds the row's top k; part 0 sorts
 * the union in shared memory and finishes it as small_top_k finishes a gathered set. Every
 * result is the whole row's, whatever the order. */
#define SPLIT_MAX_PARTS 32
#define SPLIT_CAND_BYTES (TOPK_CAP * sizeof(u64)) /* the parts' top-k candidates */
#define SPLIT_ROW_BYTES (SPLIT_CAND_BYTES + 64 + (ROW_SLOTS + 256 * ROW_HISTS) * sizeof(u64)) /* + RowCtx's */

/* The row narrowed to part blockIdx.y of P: whole 16-byte loads per part. */
static __device__ __forceinline__ void take_part(Row &r, int P)
{
    const int chunk = ((r.vocab + P - 1) / P + VW - 1) / VW * VW;
    r.lo = min(r.vocab, (int)blockIdx.y * chunk);
    r.hi = min(r.vocab, r.lo + chunk);
}

/* The row's RowCtx in the scratch (after its candidates), and the part's own ids. */
static __device__ RowCtx split_ctx(Row &r, int P, char *rows_ws)
{
    char *ctx = rows_ws + (size_t)blockIdx.x * SPLIT_ROW_BYTES + SPLIT_CAND_BYTES;
    take_part(r, P);
    return RowCtx{ (unsigned *)ctx, (u64 *)(ctx + 64), (u64 *)(ctx + 64) + ROW_SLOTS, P, 0, 0, (u64 *)(ctx - SPLIT_CAND_BYTES) };
}

/* Where a row's id goes: the device's ids (a later step may take its token from there); when
 * given, the host's pinned ids (h, mapped), whose writes reach the host before the launch is
 * seen to end, and the next step's token slots (next: a decode step whose rows follow the
 * draw's row for row finds its tokens there). The copies they replace stood in the stream around
 * the draw (traced on the H200: 1.5 us before it, 9 between it and the next step's metadata). */
struct IdsOut {
    int32_t *d, *h, *next;
};
static __device__ __forceinline__ void put_id(const IdsOut &o, int row, int id)
{
    o.d[row] = id;
    if (o.next) o.next[row] = id;
    if (o.h) {
        o.h[row] = id;
        __threadfence_system();
    }
}

/* Part 0 writes the id; the last part of the row to get here (every part has read every slot
 * by then) leaves the row's slots, histograms and counter at zero for the next launch. */
static __device__ void split_done(RowCtx &rc, unsigned *cnt, IdsOut ids, int id, Shared &sh)
{
    const int row = blockIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) {
        if (blockIdx.y == 0) put_id(ids, row, id);
        sh.sel = atomicAdd(&cnt[row], 1u) == (unsigned)rc.P - 1;
    }
    __syncthreads();
    if (!sh.sel) return;
    for (int i = threadIdx.x; i < rc.n_slot; i += NT) rc.slot[i] = 0;
    for (int i = threadIdx.x; i < 256 * rc.n_hist; i += NT) rc.hist[i] = 0;
    if (threadIdx.x == 0) cnt[row] = 0;
}

static __device__ __noinline__ void split_row(Row r, int kind, const sf_k_sample_row p, int P, unsigned *cnt, char *rows_ws,
                                 IdsOut ids, Shared &sh)
{
    const int tid = threadIdx.x, slot = TOPK_CAP / P;
    RowCtx rc = split_ctx(r, P, rows_ws);
    int id;
    if (kind == 2) { /* top-k: this part's own top k (all its valid tokens when it has no more) */
        FirstPass f1 = { r.inv_t, -INFINITY, INT_MAX, 0 };
        visit(r, f1);
        block_best(f1.v, f1.i, sh);
        const int nv = (int)block_sum_u64((u64)f1.n, sh);
        r.m = f1.v; /* TiePass's masses are not used here */
        r.bs = bin_scale(r.m, lo_unpack(block_max_u64(lo_pack(f1.lo), sh), r.m)); /* the part's own range */
        int n;
        if (p.top_k < nv && top_k_bins(r, p.top_k, sh)) { /* the part's top k first in sh.top */
            n = p.top_k;
        } else {
            uint32_t t = 0;
            int c = -1;
            if (p.top_k < nv) {
                u64 above;
                t = radix_select<0>(r, (u64)p.top_k, 0, &above, sh);
                TiePass tp = { r.inv_t, r.m, t, 0, 0, 0 };
                visit(r, tp);
                const int n_t = (int)block_sum_u64((u64)tp.n, sh);
                c = cut_ties(r, t, (u64)p.top_k - above, n_t, sh);
            }
            if (tid == 0) sh.n = 0;
            __syncthreads();
            GatherPass gp = { r.inv_t, t, c, &sh };
            visit(r, gp);
            __syncthreads();
            n = min(sh.n, slot);
        }
        u64 *cand = (u64 *)(rows_ws + (size_t)blockIdx.x * SPLIT_ROW_BYTES) + blockIdx.y * slot;
        for (int i = tid; i < slot; i += NT) cand[i] = i < n ? sh.top[i] : 0; /* 0 sorts last */
        /* the row's best, valid count and candidate count, all behind one barrier */
        u64 *best = row_put<true>(best_pack(f1.v, f1.i), rc, sh), *n_valid = row_put<false>((u64)nv, rc, sh),
            *total = row_put<false>((u64)n, rc, sh);
        row_sync(rc);
        const u64 b = __ldcg(best);
        const int first = b ? (int)~(uint32_t)b : 0;
        id = first;
        if (blockIdx.y == 0 && __ldcg(n_valid) > 0) {
            const u64 *all = (const u64 *)(rows_ws + (size_t)blockIdx.x * SPLIT_ROW_BYTES);
            sh.top[tid] = tid < rc.P * slot ? __ldcg(&all[tid]) : 0; /* TOPK_CAP == NT slots */
            __syncthreads();
            r.m = key_float((uint32_t)(b >> 32));
            const int gi = finish_set(r, p, min((int)__ldcg(total), p.top_k), sh);
            id = gi == INT_MAX ? first : gi;
        }
    } else if (kind == 0) { /* greedy */
        FirstPass f = { r.inv_t, -INFINITY, INT_MAX, 0 };
        visit(r, f);
        best_of(f.v, f.i, &rc, sh);
        id = f.i == INT_MAX ? 0 : f.i;
    } else { /* temperature alone */
        PlainPass pp = { { r.inv_t, -INFINITY, INT_MAX, 0 },
                         { r.inv_t, 0, -1, sf_sample_stream(p.seed, p.step), -INFINITY, INT_MAX } };
        visit(r, pp);
        block_best(pp.f.v, pp.f.i, sh);
        block_best(pp.d.v, pp.d.i, sh);
        u64 *fb = row_put<true>(best_pack(pp.f.v, pp.f.i), rc, sh), *db = row_put<true>(best_pack(pp.d.v, pp.d.i), rc, sh);
        row_sync(rc);
        const u64 f = __ldcg(fb), d = __ldcg(db);
        id = d ? (int)~(uint32_t)d : f ? (int)~(uint32_t)f : 0;
    }
    split_done(rc, cnt, ids, id, sh);
}

/* The end of a drawn row: the top-p and min-p boundaries on top of (t, c) (zk: the kept set's
 * mass when have_zk, else the row's is summed here), then the Gumbel-max draw over what is
 * kept; first when nothing is. One block's, or with rc a split row's parts' together. */
static __device__ int draw_truncated(const Row &r, const sf_k_sample_row &p, uint32_t t, int c, u64 zk, bool have_zk,
                                     int first, Shared &sh, RowCtx *rc)
{
    if (p.top_p < 1.0f) {
        u64 want = 0, above, on_t;
        if (have_zk) {
            want = (u64)((double)p.top_p * (double)zk);
            if (want < 1) want = 1;
        }
        uint32_t tp_key;
        int cp;
        if (!top_p_bins(r, p.top_p, want, &tp_key, &cp, sh, rc)) {
            /* the radix path: the row's mass (without a top-k) comes with the first histogram;
             * the tokens on the boundary key all have its mass, so the last histogram's bin
             * counts them */
            tp_key = radix_select<1>(r, want, 0, &above, sh, rc, p.top_p, &want, &on_t);
            const u64 one = mass_of(key_float(tp_key), r.m);
            u64 n_t = one ? on_t / one : 0;
            if (!one) { /* a selected bin holds mass, so this is not reached; counted if it were */
                TiePass tp = { r.inv_t, r.m, tp_key, 0, 0, 0 };
                visit(r, tp);
                n_t = reduce_u64<false>((u64)tp.n, rc, sh);
            }
            u64 rr = one ? (want - above + one - 1) / one : n_t;
            if (rr < 1) rr = 1;
            if (rr > n_t) rr = n_t;
            cp = cut_ties(r, tp_key, rr, (int)n_t, sh, rc);
        }
        if (shorter(tp_key, cp, t, c)) { t = tp_key; c = cp; }
    }
    if (p.min_p > 0) {
        uint32_t tm = sf_sample_key(r.m + logf(p.min_p));
        if (shorter(tm, INT_MAX, t, c)) { t = tm; c = INT_MAX; }
    }
    DrawPass d = { r.inv_t, t, c, sf_sample_stream(p.seed, p.step), -INFINITY, INT_MAX };
    visit(r, d);
    best_of(d.v, d.i, rc, sh);
    return d.i == INT_MAX ? first : d.i;
}

/* A top-p (or min-p) row without a top-k: its kept set can be most of the row, so the parts
 * cannot gather it; they run the one-block path's passes together instead (RowCtx), each over
 * its ids, every reduction and histogram the row's. */
static __device__ __noinline__ void split_top_p(Row r, const sf_k_sample_row p, int P, unsigned *cnt, char *rows_ws,
                                                IdsOut ids, Shared &sh)
{
    RowCtx rc = split_ctx(r, P, rows_ws);
    FirstPass f1 = { r.inv_t, -INFINITY, INT_MAX, 0 };
    visit(r, f1);
    block_best(f1.v, f1.i, sh);
    /* the row's best, count and smallest candidate behind one barrier */
    u64 *best = row_put<true>(best_pack(f1.v, f1.i), rc, sh), *nv = row_put<false>((u64)f1.n, rc, sh),
        *lo = row_put<true>(lo_pack(f1.lo), rc, sh);
    row_sync(rc);
    const u64 b = __ldcg(best);
    const int first = b ? (int)~(uint32_t)b : 0;
    int id = first;
    if (__ldcg(nv) > 0) {
        r.m = key_float((uint32_t)(b >> 32));
        r.bs = bin_scale(r.m, lo_unpack(__ldcg(lo), r.m));
        id = draw_truncated(r, p, 0, -1, 0, false, first, sh, &rc);
    }
    split_done(rc, cnt, ids, id, sh);
}

/* Row blockIdx.x of logits as p gives it to the passes (inv_t 1), its penalized ids marked in
 * bits (shared memory, vocab bits) when it has entries; vals: their values (logit_bias and
 * penalties on the raw logits, as on the CPU: no fused multiply-add) written to pen_val first
 * (the draw), else read from there (written by the draw before). The parts of a split row all
 * write the same values. */
static __device__ Row row_of(const bf16 *logits, int64_t ld, int vocab, const sf_k_sample_row &p,
                             const sf_k_sample_pen *pen, float *pen_val, uint32_t *bits, bool vals)
{
    Row r;
    r.l = logits + blockIdx.x * ld;
    r.vocab = r.hi = vocab;
    r.lo = 0;
    r.e = pen + p.pen_off;
    r.ev = pen_val + p.pen_off;
    r.n_e = p.n_pen;
    r.bits = NULL;
    r.allow = p.allow;
    r.inv_t = 1.0f;
    r.m = 0;
    r.bs = 1;
    if (p.n_pen > 0) {
        for (int w = threadIdx.x; w < (vocab + 31) / 32; w += NT) bits[w] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < p.n_pen; j += NT) {
            const sf_k_sample_pen e = r.e[j];
            if (vals) {
                float v = __fadd_rn(bf2f(r.l[e.id]), e.bias);
                if (p.repetition_penalty != 1.0f && (e.count > 0 || e.in_prompt))
                    v = v > 0 ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
                if (e.count > 0)
                    v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.frequency_penalty, (float)e.count), p.presence_penalty));
                pen_val[p.pen_off + j] = v;
            }
            atomicOr(&bits[e.id >> 5], 1u << (e.id & 31));
        }
        __syncthreads();
        r.bits = bits;
    }
    return r;
}

/* SPLIT: the instance for launches of P > 1 parts per row (the one-part instance carries none of
 * split_row's registers) */
template <bool SPLIT>
static __device__ __forceinline__ void sample_rows(const bf16 *logits, int64_t ld, int vocab,
                                                   const sf_k_sample_row *rows, const sf_k_sample_pen *pen,
                                                   float *pen_val, IdsOut ids, int P,
                                                   unsigned *cnt, char *rows_ws, uint32_t *bits, Shared &sh)
{
    const sf_k_sample_row p = rows[blockIdx.x];
    const bool greedy = sf_sample_greedy(p.temperature, p.top_k);
    /* a row split over the launch's P parts: greedy, temperature alone, top-k (k x P <= TOPK_CAP),
     * top-p or min-p without a top-k */
    const int kind = !SPLIT || P < 2 ? -1 : greedy ? 0 : p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0 ? 1
                   : p.top_k <= 0 ? 3 : p.top_k * P <= TOPK_CAP ? 2 : -1;
    if (kind < 0 && blockIdx.y) return; /* the other rows: the first part's block alone */
    Row r = row_of(logits, ld, vocab, p, pen, pen_val, bits, true);
    r.inv_t = greedy ? 1.0f : __fdiv_rn(1.0f, p.temperature);
    if (SPLIT && kind == 3) {
        split_top_p(r, p, P, cnt, rows_ws, ids, sh);
        return;
    }
    if (SPLIT && kind >= 0) {
        split_row(r, kind, p, P, cnt, rows_ws, ids, sh);
        return;
    }
    if (!greedy && p.top_k <= 0 && p.top_p >= 1.0f && p.min_p <= 0) { /* one pass: nothing is truncated */
        PlainPass pp = { { r.inv_t, -INFINITY, INT_MAX, 0 },
                         { r.inv_t, 0, -1, sf_sample_stream(p.seed, p.step), -INFINITY, INT_MAX } };
        visit(r, pp);
        block_best(pp.f.v, pp.f.i, sh);
        block_best(pp.d.v, pp.d.i, sh);
        if (threadIdx.x == 0) {
            int first = pp.f.i == INT_MAX ? 0 : pp.f.i;
            put_id(ids, blockIdx.x, pp.d.i == INT_MAX ? first : pp.d.i);
        }
        return;
    }
    FirstPass f1 = { r.inv_t, -INFINITY, INT_MAX, 0 };
    visit(r, f1);
    block_best(f1.v, f1.i, sh);
    int n_valid = (int)block_sum_u64((u64)f1.n, sh);
    int first = f1.i == INT_MAX ? 0 : f1.i;
    if (greedy || n_valid == 0) {
        if (threadIdx.x == 0) put_id(ids, blockIdx.x, first);
        return;
    }
    r.m = f1.v;
    r.bs = bin_scale(r.m, lo_unpack(block_max_u64(lo_pack(f1.lo), sh), r.m));
    uint32_t t = 0; /* kept: key > t, or key == t and id <= c */
    int c = -1;
    u64 zk = 0, above;
    bool have_zk = false;
    if (p.top_k > 0 && p.top_k < n_valid) {
        if (p.top_k <= TOPK_CAP && top_k_bins(r, p.top_k, sh)) { /* the set gathered by bins */
            const int id = finish_set(r, p, p.top_k, sh);
            if (threadIdx.x == 0) put_id(ids, blockIdx.x, id == INT_MAX ? first : id);
            return;
        }
        uint32_t tk = radix_select<0>(r, (u64)p.top_k, 0, &above, sh);
        TiePass tp = { r.inv_t, r.m, tk, 0, 0, 0 };
        visit(r, tp);
        int n_t = (int)block_sum_u64((u64)tp.n, sh);
        u64 one = block_max_u64(tp.one, sh), m_above = block_sum_u64(tp.above, sh);
        u64 rr = (u64)p.top_k - above;
        t = tk;
        c = cut_ties(r, tk, rr, n_t, sh);
        zk = m_above + rr * one;
        have_zk = true;
        if (p.top_k <= TOPK_CAP) {
            int id = small_top_k(r, p, t, c, sh);
            if (threadIdx.x == 0) put_id(ids, blockIdx.x, id == INT_MAX ? first : id);
            return;
        }
    }
    const int id = draw_truncated(r, p, t, c, zk, have_zk, first, sh, nullptr);
    if (threadIdx.x == 0) put_id(ids, blockIdx.x, id);
}

template <bool SPLIT>
__global__ void __launch_bounds__(NT) k_sample(const bf16 *logits, int64_t ld, int vocab, const sf_k_sample_row *rows,
                                               const sf_k_sample_pen *pen, float *pen_val, IdsOut ids, int P,
                                               unsigned *cnt, char *rows_ws)
{
    extern __shared__ uint32_t bits[];
    __shared__ Shared sh;
    __shared__ sf_tr tr;
    tr_begin(tr);
    sample_rows<SPLIT>(logits, ld, vocab, rows, pen, pen_val, ids, P, cnt, rows_ws, bits, sh);
    tr_end(tr, SF_TR_SAMPLE, vocab, P);
}

SF_TR_SETTER(sf_k_sample_trace)

/* ---- log-probabilities (sf_sample_row.logprobs; kernels/cpu/sample.c lse_top) ------------------
 * After the draw, one block per row that asks, over the row's values after step 1 (inv_t 1):
 * the max and the count of candidates, the sum of exp(l - max) (floats, as the reference) with
 * the drawn id's value, and for n > 0 the top n found as a top-k set is (bins of m - l, else
 * the radix digits and the tie cut), gathered and sorted: (value descending, id ascending). */
struct SumPass {
    float m, s;
    __device__ void operator()(int id, float l, bool in) {
        if (in && valid(l)) s += expf(l - m);
    }
};

__global__ void __launch_bounds__(NT) k_sample_lp(const bf16 *logits, int64_t ld, int vocab, const sf_k_sample_row *rows,
                                                  const sf_k_sample_pen *pen, float *pen_val, const int32_t *ids,
                                                  sf_k_sample_lp *out)
{
    extern __shared__ uint32_t bits[];
    __shared__ Shared sh;
    __shared__ float xid;
    const sf_k_sample_row p = rows[blockIdx.x];
    if (p.logprobs <= 0) return;
    const int tid = threadIdx.x, id = ids[blockIdx.x], n = min(p.logprobs - 1, SF_K_SAMPLE_TOP_MAX);
    Row r = row_of(logits, ld, vocab, p, pen, pen_val, bits, false);
    sf_k_sample_lp *o = out + blockIdx.x;
    FirstPass f1 = { 1.0f, -INFINITY, INT_MAX, 0 };
    visit(r, f1);
    block_best(f1.v, f1.i, sh);
    const int nv = (int)block_sum_u64((u64)f1.n, sh);
    if (nv == 0) {
        if (tid == 0) { o->lp = -INFINITY; o->n_top = 0; }
        return;
    }
    r.m = f1.v;
    r.bs = bin_scale(r.m, lo_unpack(block_max_u64(lo_pack(f1.lo), sh), r.m));
    /* the drawn id's value: its entry's, its logit, or -inf where the mask leaves it out */
    const bool ok = allowed(r, id);
    if (tid == 0) xid = ok ? bf2f(r.l[id]) : -INFINITY;
    __syncthreads();
    for (int j = tid; j < r.n_e; j += NT)
        if (ok && r.e[j].id == id) xid = r.ev[j]; /* ids are distinct: one thread at most */
    SumPass sp = { r.m, 0.0f };
    visit(r, sp);
    const float lse = r.m + logf(block_sum(sp.s, sh.redf)); /* block_sum's barriers order xid too */
    int got = 0;
    if (n > 0) {
        if (n >= nv) {
            got = gather_kept(r, 0, -1, sh); /* every candidate */
            sort_top(sh);
        } else if (top_k_bins(r, n, sh)) {
            got = n;
        } else {
            u64 above;
            const uint32_t t = radix_select<0>(r, (u64)n, 0, &above, sh);
            TiePass tp = { 1.0f, r.m, t, 0, 0, 0 };
            visit(r, tp);
            const int n_t = (int)block_sum_u64((u64)tp.n, sh);
            gather_kept(r, t, cut_ties(r, t, (u64)n - above, n_t, sh), sh);
            sort_top(sh);
            got = n;
        }
    }
    if (tid < got) {
        const u64 e = sh.top[tid];
        o->top_id[tid] = (int)~(uint32_t)e;
        o->top_lp[tid] = key_float((uint32_t)(e >> 32)) - lse;
    }
    if (tid == 0) {
        o->lp = xid - lse;
        o->n_top = got;
    }
}

extern "C" int sf_k_sample_logprobs(const uint16_t *logits, int64_t ld, int n, int vocab, const sf_k_sample_row *rows,
                                     const sf_k_sample_pen *pen, int n_pen, float *pen_val, const int32_t *ids,
                                     sf_k_sample_lp *out, cudaStream_t s)
{
    if (n <= 0) return 0;
    if (vocab <= 0 || vocab > SF_K_SAMPLE_MAX_VOCAB) return (int)cudaErrorInvalidValue;
    const size_t smem = n_pen > 0 ? (size_t)(vocab + 31) / 32 * 4 : 0;
    k_sample_lp<<<n, NT, smem, s>>>((const bf16 *)logits, ld, vocab, rows, pen, pen_val, ids, out);
    return sf_launch_status();
}

/* Blocks of the split instance an SM holds with smem bytes of bitmap (0 when it cannot be read),
 * asked once per device and size: a step calls the op with one of two sizes (no penalties, or
 * the model's vocabulary's bitmap), so the occupancy query stays off the per-step path. */
static int split_blocks_per_sm(size_t smem)
{
    static struct {
        size_t smem[2];
        int per_sm[2]; /* 0: not asked yet */
    } cache[SF_K_MAX_DEVICES];
    const int d = sf_k_dev();
    if (d >= 0)
        for (int i = 0; i < 2; i++)
            if (cache[d].per_sm[i] && cache[d].smem[i] == smem) return cache[d].per_sm[i];
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_sample<true>, NT, smem) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (d >= 0 && per_sm > 0) {
        const int i = cache[d].per_sm[0] && cache[d].smem[0] != smem; /* the second slot, else the first */
        cache[d].smem[i] = smem;
        cache[d].per_sm[i] = per_sm;
    }
    return per_sm;
}

/* sf_k_sample_best_put (kernels.h): one thread, after the lm_head that filled best[0..1]. */
__global__ void k_sample_best_put(u64 *best, IdsOut ids)
{
    __shared__ sf_tr tr;
    tr_begin(tr);
    sf_pdl_wait();
    tr_waited(tr);
    const u64 f = ((volatile u64 *)best)[0], d = ((volatile u64 *)best)[1];
    put_id(ids, 0, d ? (int)~(uint32_t)d : f ? (int)~(uint32_t)f : 0);
    best[0] = best[1] = 0;
    tr_end(tr, SF_TR_SAMPLE, 1, 0); /* k 0: this put, not a draw (b1trace.py) */
}

extern "C" int sf_k_sample_best_put(unsigned long long *best, int32_t *ids, int32_t *ids_host, int32_t *ids_next,
                                    cudaStream_t s)
{
    if (!best || !ids) return (int)cudaErrorInvalidValue;
    const IdsOut o = { ids, ids_host, ids_next };
    const int rc = sf_launch_pdl(k_sample_best_put, dim3(1), dim3(1), 0, s, (u64 *)best, o);
    return rc ? rc : sf_launch_status();
}

extern "C" int sf_k_sample(const uint16_t *logits, int64_t ld, int n, int vocab, const sf_k_sample_row *rows,
                           const sf_k_sample_pen *pen, int n_pen, float *pen_val, int32_t *ids_d, int32_t *ids_host,
                           int32_t *ids_next, void *scratch, cudaStream_t s)
{
    if (n <= 0) return 0;
    const IdsOut ids = { ids_d, ids_host, ids_next };
    if (vocab <= 0 || vocab > SF_K_SAMPLE_MAX_VOCAB) return (int)cudaErrorInvalidValue;
    size_t smem = n_pen > 0 ? (size_t)(vocab + 31) / 32 * 4 : 0;
    /* parts per row: at least one sweep of the block's loads each (NT * VW ids), no more blocks
     * than the SMs hold at once (1024 threads each), the rows' parts within the scratch */
    const size_t head_bytes = SF_K_SAMPLE_SPLIT_ROWS * sizeof(unsigned);
    int P = 1;
    if (scratch && (size_t)n * SPLIT_ROW_BYTES <= SF_K_SAMPLE_SCRATCH - head_bytes) {
        /* the parts of a top-p row wait for each other: the launch is cooperative (all resident) */
        const int sweeps = vocab / (NT * VW), slots = split_blocks_per_sm(smem) * sf_k_sm_count(0) / n;
        P = SF_MIN(SF_MIN(sweeps, slots), SPLIT_MAX_PARTS);
    }
    if (P > 1) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = dim3(n, P);
        cfg.blockDim = dim3(NT);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = s;
        at[0].id = cudaLaunchAttributeCooperative;
        at[0].val.cooperative = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        const cudaError_t e = cudaLaunchKernelEx(&cfg, k_sample<true>, (const bf16 *)logits, ld, vocab, rows, pen,
                                                 pen_val, ids, P, (unsigned *)scratch,
                                                 (char *)scratch + head_bytes);
        if (e == cudaSuccess) return 0;
        cudaGetLastError(); /* refused (not all resident, or no cooperative launch here): one block per row */
    }
    k_sample<false><<<n, NT, smem, s>>>((const bf16 *)logits, ld, vocab, rows, pen, pen_val, ids, 1, NULL, NULL);
    return sf_launch_status();
}
