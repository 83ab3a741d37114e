/* cpu.h — the CPU kernels behind the CPU backend (hal/hal_cpu.c), one op per file.
 *
 * Activations are fp32, row-major. Weights are read in place in their stored dtype
 * (F32, F16, BF16 and every GGUF block format: Q8_0, Q4_0..Q5_1, Q2_K..Q6_K, IQ4_NL, IQ4_XS) with fp32
 * accumulation. Each kernel is a plain function over one
 * thread's share of the work: `ith` of `nth` threads; sf_cpu_pool_run() calls it on every
 * thread of a pool and returns when all have finished. Kernels allocate nothing and never
 * fail: the backend validates shapes before calling them.
 *
 * SIMD: AVX2+FMA paths are compiled with __attribute__((target("avx2,fma,f16c"))) and
 * chosen at run time (sf_cpu_has_avx2()); every kernel has a scalar fallback. */
#ifndef SF_KERNELS_CPU_H
#define SF_KERNELS_CPU_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../../hal/hal.h"

/* ---- thread pool ------------------------------------------------------------------- */
typedef struct sf_cpu_pool sf_cpu_pool;
typedef void (*sf_cpu_task)(void *arg, int ith, int nth);

/* n_threads >= 1; the calling thread is thread 0, so n_threads - 1 workers are started. */
int sf_cpu_pool_new(int n_threads, sf_cpu_pool **out, sf_error *err);
void sf_cpu_pool_free(sf_cpu_pool *p);
int sf_cpu_pool_size(const sf_cpu_pool *p);
/* Runs fn(arg, i, n) on all n threads; returns when every call has returned.
 * Called by one thread at a time (the backend's owner). */
void sf_cpu_pool_run(sf_cpu_pool *p, sf_cpu_task fn, void *arg);

/* Even split of [0, n) into nth parts: [*lo, *hi) for part ith. */
static inline void sf_cpu_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi)
{
    int64_t per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

/* ---- CPU features -------------------------------------------------------------------- */
int sf_cpu_has_avx2(void);   /* AVX2 + FMA + F16C; SEMFLOW_NO_AVX2=1 forces the scalar path */

/* the sum of v's 8 lanes (call only from functions compiled for avx2,fma) */
__attribute__((target("avx2,fma")))
static inline float sf_cpu_hsum8(__m256 v)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* exp(x) for 8 floats, Cephes' polynomial (about 1 ulp); -inf and x < -88 give 0.
 * Call only from functions compiled for avx2,fma, after sf_cpu_has_avx2(). */
__attribute__((target("avx2,fma")))
static inline __m256 sf_cpu_exp256(__m256 x)
{
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-88.3762626647949f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 z = _mm256_mul_ps(x, x), y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, z, x), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(0x7f)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* ---- rows of any weight dtype ------------------------------------------------------ */
/* dst[0..k) = dequantized row src (k elements; a multiple of 32 for Q8_0). */
void sf_cpu_row_to_f32(sf_dtype t, const void *src, int64_t k, float *dst);
/* Address of row r of a row-major matrix of dtype t with `cols` columns. */
const void *sf_cpu_row_ptr(sf_dtype t, const void *data, int64_t cols, int64_t r);

/* ---- GGUF block formats in place (qdot.c) --------------------------------------------- */
/* x (k a multiple of 32) as the one-token kernels read it: int8 in groups of 32 with their
 * scales, and the sums over 16 and 32 elements: sf_cpu_kq_prep_floats(k) floats. */
int64_t sf_cpu_kq_prep_floats(int64_t k);
void sf_cpu_kq_prep_x(const float *x, int64_t k, float *xp);
/* out[r] = W_r . x for 4 rows of a block format, x as sf_cpu_kq_prep_x left it
 * (AVX2): exact against x rounded to int8, 0.3-1% off the fp32 dot product with x. */
void sf_cpu_dot4_q8_0(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q5_K(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q2_K(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q3_K(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q4_0(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q4_1(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q5_0(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q5_1(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_iq4_nl(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_iq4_xs(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q4_K(const void *const *w, const float *xp, int64_t k, float *out);
void sf_cpu_dot4_q6_K(const void *const *w, const float *xp, int64_t k, float *out);
/* out[t] = W_row . x_t for one row and nt <= SF_CPU_DIRECT_DOTN prepared x rows (pf floats
 * apart): the row's blocks unpacked once for all of them, each out[t] bit for bit what the
 * sf_cpu_dot4_* kernel gives for that token alone (Q8_0 and the K-quants) */
void sf_cpu_dotn_q8_0(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
void sf_cpu_dotn_q4_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
void sf_cpu_dotn_q5_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
void sf_cpu_dotn_q2_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
void sf_cpu_dotn_q3_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
void sf_cpu_dotn_q6_K(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);
/* one row of a block format in place but Q8_0 into fp32 (AVX2; Q8_0's is in rows.c) */
void sf_cpu_kq_row_to_f32(sf_dtype t, const void *src, int64_t k, float *y);

/* ---- matmul: y[n, m] = x[n, k] · W[m, k]^T (+ bias) -------------------------------- */
/* A weight is 1..4 parts stacked along rows; part p covers output columns
 * [row0[p], row0[p] + part[p].rows). bias[p] is NULL or fp32 [part[p].rows]. */
typedef struct sf_cpu_matmul {
    int n_parts;
    sf_view part[4];
    const float *bias[4];
    int64_t m, k;            /* total rows (output features), columns (input features) */
    const float *x;          /* [n, ldx] */
    const float *xq;         /* n <= sf_cpu_direct_tokens: each token's x as sf_cpu_kq_prep_x left it,
                                sf_cpu_kq_prep_floats(k) apart; NULL: block formats take the
                                many-token path (rows into fp32) */
    float *y;                /* [n, ldy] */
    int n, ldx, ldy;
    size_t l2_bytes;         /* cache budget for blocking (per core) */
    float *scratch;          /* per thread: scratch + ith * scratch_floats */
    int64_t scratch_floats;  /* >= sf_cpu_matmul_scratch(k) */
    int64_t next_chunk;      /* work counter shared by the threads: 0 before each run */
} sf_cpu_matmul;
int64_t sf_cpu_matmul_scratch(int64_t k);
/* Steps of up to this many tokens read the weights in their stored dtype, a token at a time;
 * more tokens dequantize rows into fp32 scratch first. A weight all of Q8_0 and K-quants, whose
 * rows the dotn kernels unpack once for every token, reads them so up to SF_CPU_DIRECT_DOTN
 * tokens (sf_cpu_direct_tokens). */
#define SF_CPU_DIRECT_TOKENS 8
#define SF_CPU_DIRECT_DOTN 16
int sf_cpu_direct_tokens(const sf_view *part, int n_parts);
void sf_cpu_matmul_task(void *arg, int ith, int nth);

/* ---- rmsnorm (fused residual add) ---------------------------------------------------- */
/* For each of n rows of width d: if add: x += add; out = x / sqrt(mean(x^2) + eps) * w. */
typedef struct sf_cpu_rmsnorm {
    float *x; const float *add; const float *w; float *out;
    int n, d; float eps;
} sf_cpu_rmsnorm;
void sf_cpu_rmsnorm_task(void *arg, int ith, int nth);

/* ---- INT8 KV rows (the degrade path; layout in hal.h, sf_kv_config) ------------------- */
/* One layer's INT8 view of the cache: block ids >= i8_base are INT8 units u = id - i8_base,
 * rows [Hkv][block_size][hd] int8 at k8 + u * unit_bytes, in the same memory as the fp32 cache
 * (k8 == (int8_t *) k_cache, unit_bytes half a full block), scales [unit][Hkv][block_size]
 * fp32. i8_base = 0 (zero-initialised): no INT8 blocks. */
typedef struct sf_cpu_kv8 {
    int8_t *k8, *v8;
    float *k_scale, *v_scale;
    int64_t unit_bytes;
    int32_t i8_base;
} sf_cpu_kv8;

/* q[i] = round(x[i] / s) with s = max|x| / 127 (0 for a zero row, all q 0); returns s.
 * |x[i] - q[i] * s| <= s / 2. */
static inline float sf_cpu_quant_row(const float *x, int n, int8_t *q)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    if (!(amax > 0.0f)) {
        memset(q, 0, (size_t)n);
        return 0.0f;
    }
    float s = amax / 127.0f, inv = 127.0f / amax;
    for (int i = 0; i < n; i++) {
        float r = nearbyintf(x[i] * inv);
        q[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
    return s;
}

/* ---- rope + KV append -------------------------------------------------------------- */
/* qkv [T, (H + 2*Hkv) * hd]: q heads, then k heads, then v heads. Rotates q and k in place
 * by pos[t] and stores k and v of token t at slot[t] of this layer's paged cache:
 * k_cache/v_cache [n_blocks][Hkv][block_size][hd] fp32, or, when slot[t] / block_size >=
 * kv8.i8_base, quantised into the INT8 unit (sf_cpu_quant_row per token and kv head). */
typedef struct sf_cpu_rope_kv {
    float *qkv; int T;
    const int32_t *pos, *slot;
    int n_heads, n_kv_heads, head_dim, rot_dim, interleaved;
    const float *inv_freq;
    float *k_cache, *v_cache; int block_size;
    sf_cpu_kv8 kv8;
} sf_cpu_rope_kv;
void sf_cpu_rope_kv_task(void *arg, int ith, int nth);
/* The rotation alone, on one head vector (used by tests and by the task above). */
void sf_cpu_rope_apply(float *v, int rot_dim, int interleaved, const float *cos_t, const float *sin_t);

/* ---- attention (paged, causal, GQA, online softmax) -------------------------------- */
/* For every token t of sequence s (t in [seq_start[s], seq_start[s+1])), head h:
 *   out[t, h*hd:] = softmax_j(q_h · k_j * scale) v_j over cache positions j = 0..pos[t]
 * of sequence s, position j living in block block_table[s*max_blocks + j/bs], row j%bs.
 * Decode (one token per sequence) and prefill (many) are the same loop. */
typedef struct sf_cpu_attention {
    const float *qkv; float *out; int T, S;
    const int32_t *pos, *seq_start, *block_table; int max_blocks;
    int n_heads, n_kv_heads, head_dim; float scale;
    const float *k_cache, *v_cache; int block_size;
    sf_cpu_kv8 kv8;          /* blocks with ids >= kv8.i8_base are read as INT8 and dequantised */
    float *scratch;          /* per thread: scratch + ith * scratch_floats */
    int64_t scratch_floats;  /* >= sf_cpu_attention_scratch(...) */
} sf_cpu_attention;
int64_t sf_cpu_attention_scratch(int n_heads, int n_kv_heads, int head_dim, int block_size);
void sf_cpu_attention_task(void *arg, int ith, int nth);

/* ---- silu_mul: out[n, f] = silu(gu[:, :f]) * gu[:, f:] (gu has 2f columns) ------------ */
typedef struct sf_cpu_silu_mul { const float *gu; float *out; int n, f; } sf_cpu_silu_mul;
void sf_cpu_silu_mul_task(void *arg, int ith, int nth);

/* ---- embed: x[t, :] = emb[tokens[t], :] (any weight dtype) --------------------------- */
typedef struct sf_cpu_embed {
    sf_view emb; const int32_t *tokens; int T; float *x;
} sf_cpu_embed;
void sf_cpu_embed_task(void *arg, int ith, int nth);

/* ---- get_rows: out[i, :] = x[rows[i], :] --------------------------------------------- */
void sf_cpu_get_rows(const float *x, int cols, const int32_t *rows, int n, float *out);

/* ---- sample: one token per logit row (the reference of the backend's sample op) ------- */
/* Scratch of one row: x [vocab] floats, key [vocab] and mass [vocab]. */
typedef struct sf_cpu_sample_scratch { float *x; uint32_t *key; uint64_t *mass; } sf_cpu_sample_scratch;
/* Draws one id from logits[0, vocab) by p and its n_pen penalty entries pen (ids in range,
 * distinct), exactly as hal.h's sf_sample_row describes; with p->logprobs > 0 and lp, the row's
 * log-probabilities (sf_sample_lp) into *lp. logits is not modified. */
int32_t sf_cpu_sample_row(const float *logits, int vocab, const sf_sample_row *p, const sf_sample_pen *pen,
                          sf_cpu_sample_scratch *sc, sf_sample_lp *lp);
/* sf_sample_lp of a row x already through step 1 (the host sampler's penalized, masked row):
 * id's log-probability and the n (<= SF_SAMPLE_TOP_MAX) most likely ids. */
void sf_cpu_sample_lp(const float *x, int vocab, int32_t id, int n, sf_sample_lp *lp);
/* Rows [lo, hi) of a batch, for sf_cpu_pool_run. */
typedef struct sf_cpu_sample {
    const float *logits; int64_t ld; int n, vocab;
    const sf_sample_row *rows; const sf_sample_pen *pen; int32_t *ids;
    sf_sample_lp *lp; /* NULL, or [n] (rows with logprobs > 0 written) */
    sf_cpu_sample_scratch *scratch; /* one per thread */
} sf_cpu_sample;
void sf_cpu_sample_task(void *arg, int ith, int nth);

/* ---- score: a row's log-softmax at one token (prompt logprobs; the backend's score op) -- */
float sf_cpu_max(const float *l, int n);
/* sum of exp(scale * l[i] - m); stores the terms in e when e != NULL */
double sf_cpu_sumexp(const float *l, int n, float scale, float m, float *e);
/* The n largest of l (value descending, the lower id first among equals): ids and values;
 * returns how many (min(n, vocab)). */
int sf_cpu_top_n(const float *l, int vocab, int n, int32_t *id, float *v);
/* id's log-probability under the log-softmax of l, its rank (1 + the ids with a larger logit)
 * and the k most likely ids with theirs (entries past the vocabulary: id -1, -inf); returns
 * how many top entries are real. */
int sf_cpu_score_row(const float *l, int vocab, int32_t id, int k, float *logprob, int32_t *rank, int32_t *top_id,
                     float *top_lp);
/* Rows [0, n) of a batch over the pool (rows split by thread). */
typedef struct sf_cpu_score {
    const float *logits; int64_t ld; int n, vocab, k;
    const int32_t *targets; float *lp; int32_t *rank; int32_t *top_id; float *top_lp;
} sf_cpu_score;
void sf_cpu_score_task(void *arg, int ith, int nth);

#endif
