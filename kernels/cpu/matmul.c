/* matmul.c — y[n, m] = x[n, k] · W[m, k]^T (+ bias), weights read in place.
 *
 * Work split: output rows (weight rows) are dealt to the pool's threads in chunks, so each
 * thread streams runs of the weights once per token block. Rows are taken four at
 * a time (four independent weight streams against one x row).
 * Cache blocking: tokens are taken in blocks whose x rows fill at most half of the per-core
 * L2 (from hal's probe), so a group of four weight rows, once loaded, serves every token of
 * the block. Up to SF_CPU_DIRECT_TOKENS tokens meet the weights in their stored dtype, a
 * token at a time (the four rows stay in L1 after the first; a block format meets x rounded
 * to int8 in integer kernels, qdot.c), or for Q8_0 and the K-quants a row at a time against all
 * the tokens, its blocks unpacked once; for more, the four rows are dequantized once per
 * block into the thread's scratch and the fp32 kernel runs over the block.
 * Accumulation is fp32 in 8-lane partial sums (AVX2+FMA), reduced at the end of a row. */
#include "cpu.h"

#include <immintrin.h>
#include <string.h>

int64_t sf_cpu_matmul_scratch(int64_t k) { return 4 * k + 16; }

/* ---- AVX2 dot products of 4 weight rows with one x row ------------------------------ */
__attribute__((target("avx2,fma,f16c")))
static inline __m256 load8_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

__attribute__((target("avx2,fma,f16c")))
static inline __m256 load8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

#define DOT4_BODY(LOAD, T)                                                                  \
    const T *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];                                 \
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                              \
    int64_t i = 0;                                                                           \
    for (; i + 8 <= k; i += 8) {                                                             \
        __m256 xv = _mm256_loadu_ps(x + i);                                                  \
        a0 = _mm256_fmadd_ps(LOAD(w0 + i), xv, a0);                                          \
        a1 = _mm256_fmadd_ps(LOAD(w1 + i), xv, a1);                                          \
        a2 = _mm256_fmadd_ps(LOAD(w2 + i), xv, a2);                                          \
        a3 = _mm256_fmadd_ps(LOAD(w3 + i), xv, a3);                                          \
    }                                                                                        \
    out[0] = sf_cpu_hsum8(a0); out[1] = sf_cpu_hsum8(a1); out[2] = sf_cpu_hsum8(a2); out[3] = sf_cpu_hsum8(a3);

__attribute__((target("avx2,fma,f16c")))
static void dot4_f32(const void *const *w, const float *x, int64_t k, float *out)
{
    DOT4_BODY(_mm256_loadu_ps, float)
    for (; i < k; i++) {
        out[0] += w0[i] * x[i]; out[1] += w1[i] * x[i];
        out[2] += w2[i] * x[i]; out[3] += w3[i] * x[i];
    }
}

__attribute__((target("avx2,fma,f16c")))
static void dot4_bf16(const void *const *w, const float *x, int64_t k, float *out)
{
    DOT4_BODY(load8_bf16, uint16_t)
    for (; i < k; i++) {
        out[0] += sf_bf16_to_f32(w0[i]) * x[i]; out[1] += sf_bf16_to_f32(w1[i]) * x[i];
        out[2] += sf_bf16_to_f32(w2[i]) * x[i]; out[3] += sf_bf16_to_f32(w3[i]) * x[i];
    }
}

__attribute__((target("avx2,fma,f16c")))
static void dot4_f16(const void *const *w, const float *x, int64_t k, float *out)
{
    DOT4_BODY(load8_f16, uint16_t)
    for (; i < k; i++) {
        out[0] += sf_f16_to_f32(w0[i]) * x[i]; out[1] += sf_f16_to_f32(w1[i]) * x[i];
        out[2] += sf_f16_to_f32(w2[i]) * x[i]; out[3] += sf_f16_to_f32(w3[i]) * x[i];
    }
}

/* 4 fp32 weight rows x 3 tokens: twelve independent FMA chains, 7 loads per 12 FMAs — the
 * prefill kernel (rows already fp32, from the weights or dequantized into scratch). */
__attribute__((target("avx2,fma,f16c")))
static void dot4x3_f32(const void *const *w, const float *x0, const float *x1, const float *x2, int64_t k,
                       float out[3][4])
{
    const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 y0 = _mm256_loadu_ps(x0 + i), y1 = _mm256_loadu_ps(x1 + i), y2 = _mm256_loadu_ps(x2 + i), v;
        v = _mm256_loadu_ps(w0 + i);
        a00 = _mm256_fmadd_ps(v, y0, a00); a01 = _mm256_fmadd_ps(v, y1, a01); a02 = _mm256_fmadd_ps(v, y2, a02);
        v = _mm256_loadu_ps(w1 + i);
        a10 = _mm256_fmadd_ps(v, y0, a10); a11 = _mm256_fmadd_ps(v, y1, a11); a12 = _mm256_fmadd_ps(v, y2, a12);
        v = _mm256_loadu_ps(w2 + i);
        a20 = _mm256_fmadd_ps(v, y0, a20); a21 = _mm256_fmadd_ps(v, y1, a21); a22 = _mm256_fmadd_ps(v, y2, a22);
        v = _mm256_loadu_ps(w3 + i);
        a30 = _mm256_fmadd_ps(v, y0, a30); a31 = _mm256_fmadd_ps(v, y1, a31); a32 = _mm256_fmadd_ps(v, y2, a32);
    }
    out[0][0] = sf_cpu_hsum8(a00); out[1][0] = sf_cpu_hsum8(a01); out[2][0] = sf_cpu_hsum8(a02);
    out[0][1] = sf_cpu_hsum8(a10); out[1][1] = sf_cpu_hsum8(a11); out[2][1] = sf_cpu_hsum8(a12);
    out[0][2] = sf_cpu_hsum8(a20); out[1][2] = sf_cpu_hsum8(a21); out[2][2] = sf_cpu_hsum8(a22);
    out[0][3] = sf_cpu_hsum8(a30); out[1][3] = sf_cpu_hsum8(a31); out[2][3] = sf_cpu_hsum8(a32);
    for (; i < k; i++)
        for (int r = 0; r < 4; r++) {
            float wv = ((const float *)w[r])[i];
            out[0][r] += wv * x0[i]; out[1][r] += wv * x1[i]; out[2][r] += wv * x2[i];
        }
}

typedef void (*dot4_fn)(const void *const *w, const float *x, int64_t k, float *out);

static dot4_fn dot4_for(sf_dtype t)
{
    switch (t) {
    case SF_DT_F32: return dot4_f32;
    case SF_DT_BF16: return dot4_bf16;
    case SF_DT_F16: return dot4_f16;
    case SF_DT_Q8_0: return sf_cpu_dot4_q8_0;
    case SF_DT_Q4_K: return sf_cpu_dot4_q4_K;
    case SF_DT_Q5_K: return sf_cpu_dot4_q5_K;
    case SF_DT_Q2_K: return sf_cpu_dot4_q2_K;
    case SF_DT_Q3_K: return sf_cpu_dot4_q3_K;
    case SF_DT_Q4_0: return sf_cpu_dot4_q4_0;
    case SF_DT_Q4_1: return sf_cpu_dot4_q4_1;
    case SF_DT_Q5_0: return sf_cpu_dot4_q5_0;
    case SF_DT_Q5_1: return sf_cpu_dot4_q5_1;
    case SF_DT_IQ4_NL: return sf_cpu_dot4_iq4_nl;
    case SF_DT_IQ4_XS: return sf_cpu_dot4_iq4_xs;
    case SF_DT_Q6_K: return sf_cpu_dot4_q6_K;
    default: return NULL;
    }
}

typedef void (*dotn_fn)(const void *w, const float *xq, int64_t pf, int nt, int64_t k, float *out);

/* The kernels of one row against several tokens (qdot.c): Q8_0 and the K-quants */
static dotn_fn dotn_for(sf_dtype t);

int sf_cpu_direct_tokens(const sf_view *part, int n_parts)
{
    for (int p = 0; p < n_parts; p++)
        if (!dotn_for(part[p].dtype)) return SF_CPU_DIRECT_TOKENS;
    return SF_CPU_DIRECT_DOTN;
}

static dotn_fn dotn_for(sf_dtype t)
{
    switch (t) {
    case SF_DT_Q8_0: return sf_cpu_dotn_q8_0;
    case SF_DT_Q4_K: return sf_cpu_dotn_q4_K;
    case SF_DT_Q5_K: return sf_cpu_dotn_q5_K;
    case SF_DT_Q2_K: return sf_cpu_dotn_q2_K;
    case SF_DT_Q3_K: return sf_cpu_dotn_q3_K;
    case SF_DT_Q6_K: return sf_cpu_dotn_q6_K;
    default: return NULL;
    }
}

/* Scalar fallback: fp32 rows only (others are dequantized into scratch first). */
static void dot4_f32_scalar(const void *const *w, const float *x, int64_t k, float *out)
{
    for (int r = 0; r < 4; r++) {
        const float *wr = w[r];
        float s[8] = { 0 };
        int64_t i = 0;
        for (; i + 8 <= k; i += 8)
            for (int l = 0; l < 8; l++) s[l] += wr[i + l] * x[i + l];
        float acc = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        for (; i < k; i++) acc += wr[i] * x[i];
        out[r] = acc;
    }
}

/* ---- the task ------------------------------------------------------------------------- */
/* Rows [lo, hi) of one part, tokens [t0, t1). */
static void matmul_part_rows(const sf_cpu_matmul *mm, int p, int64_t lo, int64_t hi, int64_t col0,
                             int t0, int t1, float *scratch, int avx2)
{
    const sf_view *v = &mm->part[p];
    const float *bias = mm->bias[p];
    int64_t k = mm->k;
    /* a block format's kernels read x as the caller prepared it (mm->xq, present when the step
     * is short enough for them; qdot.c) */
    const float *xq = sf_dtype_block(v->dtype) > 1 ? mm->xq : NULL;
    int64_t pf = sf_cpu_kq_prep_floats(k);
    int direct = avx2 && (v->dtype == SF_DT_F32 || xq || (mm->n <= SF_CPU_DIRECT_TOKENS && sf_dtype_block(v->dtype) == 1));
    dot4_fn dot = avx2 ? (direct ? dot4_for(v->dtype) : dot4_f32) : dot4_f32_scalar;
    if (!direct) xq = NULL;
    dotn_fn dotn = xq && t1 - t0 > 1 ? dotn_for(v->dtype) : NULL;
    if (dotn) { /* a row unpacked once for the block's tokens */
        for (int64_t r = lo; r < hi; r++) {
            float out[SF_CPU_DIRECT_DOTN];
            dotn(sf_cpu_row_ptr(v->dtype, v->data, k, r), xq + t0 * pf, pf, t1 - t0, k, out);
            for (int t = t0; t < t1; t++) mm->y[(int64_t)t * mm->ldy + col0 + r] = out[t - t0] + (bias ? bias[r] : 0.0f);
        }
        return;
    }
    for (int64_t r = lo; r < hi; r += 4) {
        int nr = (int)SF_MIN(4, hi - r);
        const void *w[4];
        for (int j = 0; j < 4; j++) {
            int64_t rr = r + (j < nr ? j : nr - 1);
            w[j] = sf_cpu_row_ptr(v->dtype, v->data, k, rr);
        }
        if (!direct && v->dtype != SF_DT_F32) {
            for (int j = 0; j < nr; j++) sf_cpu_row_to_f32(v->dtype, w[j], k, scratch + j * k);
            for (int j = 0; j < 4; j++) w[j] = scratch + (j < nr ? j : nr - 1) * k;
        }
        int t = t0;
        if (avx2 && (v->dtype == SF_DT_F32 || !direct))
            for (; t + 3 <= t1; t += 3) {
                float out[3][4];
                const float *x = mm->x + (int64_t)t * mm->ldx;
                dot4x3_f32(w, x, x + mm->ldx, x + 2 * (int64_t)mm->ldx, k, out);
                for (int u = 0; u < 3; u++) {
                    float *y = mm->y + (int64_t)(t + u) * mm->ldy + col0 + r;
                    for (int j = 0; j < nr; j++) y[j] = out[u][j] + (bias ? bias[r + j] : 0.0f);
                }
            }
        for (; t < t1; t++) {
            float out[4];
            dot(w, xq ? xq + t * pf : mm->x + (int64_t)t * mm->ldx, k, out);
            float *y = mm->y + (int64_t)t * mm->ldy + col0 + r;
            for (int j = 0; j < nr; j++) y[j] = out[j] + (bias ? bias[r + j] : 0.0f);
        }
    }
}

/* Rows [g_lo, g_hi) of 4-row groups counted across all parts, tokens [t0, t1). */
static void matmul_groups(const sf_cpu_matmul *mm, int64_t g_lo, int64_t g_hi, int t0, int t1, float *scratch, int avx2)
{
    int64_t g0 = 0, col0 = 0;
    for (int p = 0; p < mm->n_parts; p++) {
        int64_t pg = (mm->part[p].rows + 3) / 4;
        int64_t a = SF_MAX(g_lo, g0), b = SF_MIN(g_hi, g0 + pg);
        if (a < b) {
            int64_t lo = (a - g0) * 4, hi = SF_MIN(mm->part[p].rows, (b - g0) * 4);
            matmul_part_rows(mm, p, lo, hi, col0, t0, t1, scratch, avx2);
        }
        g0 += pg;
        col0 += mm->part[p].rows;
    }
}

/* Work is handed out in chunks (a token block x a run of row groups) from a shared counter,
 * about eight per thread: a thread that was descheduled (a busy machine) or runs slower
 * takes fewer, instead of holding up the others at the end of the op. Each chunk still
 * streams its weight rows front to back. */
void sf_cpu_matmul_task(void *arg, int ith, int nth)
{
    sf_cpu_matmul *mm = arg;
    int avx2 = sf_cpu_has_avx2();
    float *scratch = mm->scratch + ith * mm->scratch_floats;
    int64_t groups = 0;
    for (int p = 0; p < mm->n_parts; p++) groups += (mm->part[p].rows + 3) / 4;
    size_t budget = mm->l2_bytes ? mm->l2_bytes / 2 : 256 * 1024;
    /* a token's x: fp32, or as the block formats' kernels read it (int8 and its sums) */
    size_t xrow = (size_t)(mm->xq ? sf_cpu_kq_prep_floats(mm->k) : mm->k) * sizeof(float);
    int nb = (int)SF_MAX(1, (int64_t)(budget / xrow));
    int64_t n_tb = (mm->n + nb - 1) / nb;
    int64_t per = SF_MAX(1, groups * n_tb / ((int64_t)nth * 8));
    per = SF_MIN(per, groups);
    int64_t n_rc = (groups + per - 1) / per, total = n_tb * n_rc;
    for (;;) {
        int64_t c = __atomic_fetch_add(&mm->next_chunk, 1, __ATOMIC_RELAXED);
        if (c >= total) break;
        int64_t tb = c / n_rc, rc = c % n_rc;
        int t0 = (int)(tb * nb), t1 = SF_MIN(mm->n, t0 + nb);
        matmul_groups(mm, rc * per, SF_MIN(groups, (rc + 1) * per), t0, t1, scratch, avx2);
    }
}
