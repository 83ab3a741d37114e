/* test_cpu_ops.c — every CPU backend op against a naive double-precision reference written
 * here, on fresh random inputs over many shapes, through the backend table (as the forward
 * pass calls it). Outputs are poisoned with NaN before each op; a NaN never passes.
 * Tolerance: ||out - ref|| / ||ref|| < 1e-5, the reference using the dequantized weights.
 * The binary runs itself a second time with SEMFLOW_NO_AVX2=1 to cover the scalar path. */
#include <sys/wait.h>

#include "common/sf.h"
#include "hal/hal.h"
#include "kernels/cpu/cpu.h"
#include "tests/lib/quant_ref.h"
#include "tests/test.h"

#define TOL 1e-5

static sf_backend *B;
static sf_rng R;

typedef struct { uint16_t d; int8_t qs[32]; } q8_block;

static double rel_err(const float *out, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (out[i] != out[i]) return INFINITY; /* NaN never passes */
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void fill_rand(float *p, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++) p[i] = sf_rng_normal(&R) * scale;
}

static sf_buf *buf(int64_t rows, int64_t cols)
{
    sf_buf *b = NULL;
    B->ops->buf_new(B, rows, cols, &b, NULL);
    return b;
}

static void poison(sf_buf *b, int64_t rows, int64_t cols)
{
    float *nan = malloc(sizeof(float) * rows * cols);
    for (int64_t i = 0; i < rows * cols; i++) nan[i] = NAN;
    B->ops->write_f32(B, b, (int)rows, nan);
    free(nan);
}

/* Store src (rows x cols fp32) as dtype t; deq gets the exact values the kernel will see. */
static void *quantize(sf_dtype t, const float *src, int64_t rows, int64_t cols, double *deq)
{
    int64_t n = rows * cols;
    void *out = malloc(sf_dtype_bytes(t, n) + 64);
    for (int64_t i = 0; t != SF_DT_Q8_0 && i < n; i++) {
        if (t == SF_DT_F32) { ((float *)out)[i] = src[i]; deq[i] = src[i]; }
        else if (t == SF_DT_BF16) { uint16_t h = sf_f32_to_bf16(src[i]); ((uint16_t *)out)[i] = h; deq[i] = sf_bf16_to_f32(h); }
        else { uint16_t h = sf_f32_to_f16(src[i]); ((uint16_t *)out)[i] = h; deq[i] = sf_f16_to_f32(h); }
    }
    if (t == SF_DT_Q8_0) {
        q8_block *b = out;
        for (int64_t j = 0; j < n / 32; j++) {
            float amax = 0;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(src[j * 32 + i]));
            b[j].d = sf_f32_to_f16(amax / 127.0f);
            float d = sf_f16_to_f32(b[j].d);
            for (int i = 0; i < 32; i++) {
                int q = d > 0 ? (int)lrintf(src[j * 32 + i] / d) : 0;
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                b[j].qs[i] = (int8_t)q;
                deq[j * 32 + i] = (double)d * q;
            }
        }
    }
    return out;
}

/* ---- matmul ------------------------------------------------------------------------------ */
/* A step of up to SF_CPU_DIRECT_TOKENS tokens (SF_CPU_DIRECT_DOTN for Q8_0 and the K-quants)
 * against a block format read in place meets x rounded to int8 in groups of 32
 * (kernels/cpu/qdot.c) on the AVX2 path: the kernel is exact against x so rounded, which is
 * what this gives (n elements, a multiple of 32). */
static int x_rounded(sf_dtype t, int n_tokens)
{
    const sf_view part = { .dtype = t };
    return n_tokens <= sf_cpu_direct_tokens(&part, 1) && sf_dtype_block(t) > 1 && sf_weight_dtype("cpu", t) == t &&
           !getenv("SEMFLOW_NO_AVX2");
}

static int check_matmul(sf_dtype t, int n, int k, int n_parts, const int *rows, int with_bias, double *worst)
{
    int64_t m = 0;
    for (int p = 0; p < n_parts; p++) m += rows[p];
    sf_weight_desc d = { .n_parts = n_parts };
    double *wref = malloc(sizeof(double) * m * k), *bref = calloc((size_t)m, sizeof(double));
    void *wdata[4] = { 0 };
    float *bdata[4] = { 0 };
    int64_t r0 = 0;
    for (int p = 0; p < n_parts; p++) {
        float *w = malloc(sizeof(float) * rows[p] * k);
        fill_rand(w, (int64_t)rows[p] * k, 0.5f);
        wdata[p] = quantize(t, w, rows[p], k, wref + r0 * k);
        free(w);
        d.part[p] = (sf_view){ wdata[p], t, rows[p], k };
        if (with_bias && p != 1) { /* part 1 without bias: mixed presence */
            bdata[p] = malloc(sizeof(float) * rows[p]);
            fill_rand(bdata[p], rows[p], 1.0f);
            for (int i = 0; i < rows[p]; i++) bref[r0 + i] = bdata[p][i];
            d.bias[p] = (sf_view){ bdata[p], SF_DT_F32, 1, rows[p] };
        }
        r0 += rows[p];
    }
    sf_weight *w = NULL;
    sf_error err = { 0 };
    int ok = 0;
    if (B->ops->weight_new(B, &d, &w, &err) != SF_OK) { printf("  weight_new: %s\n", err.msg); goto out; }
    float *x = malloc(sizeof(float) * n * k), *y = malloc(sizeof(float) * n * m), *xr = malloc(sizeof(float) * n * k);
    double *ref = malloc(sizeof(double) * n * m);
    fill_rand(x, (int64_t)n * k, 1.0f);
    memcpy(xr, x, sizeof(float) * n * k);
    if (x_rounded(t, n)) qr_round_x8(xr, (int64_t)n * k);
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = bref[j];
            for (int l = 0; l < k; l++) s += (double)xr[(int64_t)i * k + l] * wref[j * k + l];
            ref[(int64_t)i * m + j] = s;
        }
    sf_buf *bx = buf(n, k), *by = buf(n, m);
    B->ops->write_f32(B, bx, n, x);
    poison(by, n, m);
    int rc = B->ops->matmul(B, bx, w, n, by);
    B->ops->read_f32(B, by, n, y);
    double e = rel_err(y, ref, (int64_t)n * m);
    if (e > *worst) *worst = e;
    ok = rc == SF_OK && e < (t == SF_DT_Q8_0 ? 2 * TOL : TOL);
    if (!ok) printf("  matmul %s n=%d m=%lld k=%d parts=%d bias=%d: rc %d rel err %g\n", sf_dtype_name(t), n,
                    (long long)m, k, n_parts, with_bias, rc, e);
    B->ops->buf_free(B, bx);
    B->ops->buf_free(B, by);
    B->ops->weight_free(B, w);
    free(x); free(y); free(xr); free(ref);
out:
    for (int p = 0; p < 4; p++) { free(wdata[p]); free(bdata[p]); }
    free(wref); free(bref);
    return ok;
}

TEST(matmul_shapes_dtypes)
{
    static const struct { int n, k, np, rows[4], bias; } cases[] = {
        { 1, 1, 1, { 1 }, 0 },      { 1, 13, 1, { 7 }, 0 },         { 3, 9, 1, { 5 }, 1 },
        { 2, 96, 3, { 12, 5, 5 }, 1 }, { 7, 65, 2, { 33, 33 }, 0 }, { 1, 2048, 1, { 300 }, 0 },
        { 40, 2048, 1, { 21 }, 1 }, /* more tokens than one L2 block: token blocking */
        { 17, 256, 4, { 3, 1, 8, 6 }, 1 }, { 64, 64, 1, { 64 }, 0 },  { 5, 1000, 2, { 9, 10 }, 0 },
    };
    sf_dtype types[] = { SF_DT_F32, SF_DT_BF16, SF_DT_F16, SF_DT_Q8_0 };
    double worst[4] = { 0 };
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t c = 0; c < SF_ARRAY_LEN(cases); c++) {
            int k = cases[c].k;
            if (types[ti] == SF_DT_Q8_0) k = (k + 31) / 32 * 32; /* q8_0 rows are whole blocks */
            CHECK(check_matmul(types[ti], cases[c].n, k, cases[c].np, cases[c].rows, cases[c].bias, &worst[ti]));
        }
    printf("  worst rel err: f32 %.2e bf16 %.2e f16 %.2e q8_0 %.2e\n", worst[0], worst[1], worst[2], worst[3]);
}

/* GGUF's block formats: fused two-part weights whose parts are column slices (a row stride of
 * two rows' worth, as tensor parallelism cuts them). The CPU reads them in place: they meet x in
 * int8 in integer kernels for up to SF_CPU_DIRECT_TOKENS tokens and are dequantized row by row
 * into fp32 for more. The reference takes each element from tests/lib/quant_ref.h. */
static void check_block_format(sf_dtype t, int n, int K, const int rows[2], double *worst_x8)
{
    const int stride = 2 * K, m = rows[0] + rows[1];
    size_t bb = sf_dtype_bytes(t, sf_dtype_block(t));
    int blk = sf_dtype_block(t);
    sf_weight_desc d = { .n_parts = 2 };
    uint8_t *mem[2];
    double *wref = malloc(sizeof(double) * m * K), *ref = malloc(sizeof(double) * n * m);
    for (int p = 0, r0 = 0; p < 2; r0 += rows[p], p++) {
        mem[p] = malloc(sf_dtype_bytes(t, (int64_t)rows[p] * stride));
        for (int64_t b = 0; b < (int64_t)rows[p] * stride / blk; b++) sf_quant_random_block(t, mem[p] + b * bb, &R);
        const uint8_t *c0 = mem[p] + sf_dtype_bytes(t, K); /* the second half of each row */
        d.part[p] = (sf_view){ c0, t, rows[p], K, stride };
        for (int r = 0; r < rows[p]; r++)
            for (int i = 0; i < K; i++) {
                const uint8_t *b = c0 + sf_dtype_bytes(t, (int64_t)r * stride + i / blk * blk);
                wref[(int64_t)(r0 + r) * K + i] = qr_value(t, b, i % blk);
            }
    }
    sf_weight *w = NULL;
    sf_error err = { 0 };
    int rc = B->ops->weight_new(B, &d, &w, &err);
    CHECK_MSG(rc == SF_OK, "%s: %s", sf_dtype_name(t), err.msg);
    int x8 = x_rounded(t, n);
    if (rc == SF_OK) {
        float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * m), *xr = malloc(sizeof(float) * n * K);
        double *ref_x = malloc(sizeof(double) * n * m);
        fill_rand(x, (int64_t)n * K, 1.0f);
        memcpy(xr, x, sizeof(float) * n * K);
        if (x8) qr_round_x8(xr, (int64_t)n * K);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                double s = 0, sr = 0;
                for (int l = 0; l < K; l++) {
                    s += (double)x[(int64_t)i * K + l] * wref[(int64_t)j * K + l];
                    sr += (double)xr[(int64_t)i * K + l] * wref[(int64_t)j * K + l];
                }
                ref_x[i * m + j] = s;
                ref[i * m + j] = sr;
            }
        sf_buf *bx = buf(n, K), *by = buf(n, m);
        B->ops->write_f32(B, bx, n, x);
        poison(by, n, m);
        rc = B->ops->matmul(B, bx, w, n, by);
        B->ops->read_f32(B, by, n, y);
        double e = rel_err(y, ref, (int64_t)n * m), ex = rel_err(y, ref_x, (int64_t)n * m);
        if (x8 && ex > *worst_x8) *worst_x8 = ex;
        CHECK_MSG(rc == SF_OK && e < TOL && (!x8 || ex < 3e-2), "%s n=%d k=%d rows %d+%d: rc %d, rel err %g (%g against x "
                  "before its rounding)", sf_dtype_name(t), n, K, rows[0], rows[1], rc, e, ex);
        B->ops->buf_free(B, bx);
        B->ops->buf_free(B, by);
        B->ops->weight_free(B, w);
        free(x);
        free(y);
        free(xr);
        free(ref_x);
    }
    /* rows that are not whole blocks, and a stride that cuts one, are refused */
    sf_weight_desc bad = { .n_parts = 1, .part = { { mem[0], t, 1, blk / 2 + 8 } } };
    CHECK(B->ops->weight_new(B, &bad, &w, &err) == SF_EFORMAT && strstr(err.msg, "blocks"));
    bad.part[0] = (sf_view){ mem[0], t, 1, blk, blk + blk / 2 };
    CHECK(B->ops->weight_new(B, &bad, &w, &err) == SF_EFORMAT);
    free(mem[0]);
    free(mem[1]);
    free(wref);
    free(ref);
}

TEST(matmul_block_formats)
{
    static const struct { int n, k, rows[2]; } cases[] = {
        { 3, 256, { 3, 5 } }, { 1, 256, { 3, 5 } }, { 1, 1024, { 7, 2 } }, { 2, 512, { 4, 9 } }, { 5, 768, { 1, 6 } },
        { 8, 256, { 5, 3 } }, /* the most tokens a token at a time, then the rows into fp32 (K-quants: */
        { 9, 512, { 4, 9 } }, { 12, 256, { 3, 5 } }, /* the rows unpacked once for up to 16 tokens) */
        { 16, 256, { 5, 3 } }, { 17, 256, { 3, 5 } },
    };
    double worst_x8 = 0;
    for (size_t ti = 0; ti < SF_ARRAY_LEN(qr_types); ti++)
        for (size_t c = 0; c < SF_ARRAY_LEN(cases); c++)
            check_block_format(qr_types[ti], cases[c].n, cases[c].k, cases[c].rows, &worst_x8);
    if (!getenv("SEMFLOW_NO_AVX2")) printf("  a few tokens of a block format read in place, against x before its int8 rounding: worst rel err %.2e\n",
                                           worst_x8);
}

/* A token's outputs do not depend on the tokens beside it in a step: for every block format, a
 * step of 2-8 tokens (2-16 for Q8_0 and the K-quants, whose rows the dotn kernels of qdot.c
 * unpack once for all of them) gives each token the same bits as a step of that token alone. */
TEST(matmul_token_alone_or_not)
{
    const int K = 512, M = 13;
    for (size_t ti = 0; ti < SF_ARRAY_LEN(qr_types); ti++) {
        sf_dtype t = qr_types[ti];
        const int blk = sf_dtype_block(t);
        const size_t bb = sf_dtype_bytes(t, blk);
        uint8_t *mem = malloc(sf_dtype_bytes(t, (int64_t)M * K));
        for (int64_t b = 0; b < (int64_t)M * K / blk; b++) sf_quant_random_block(t, mem + b * bb, &R);
        sf_weight_desc d = { .n_parts = 1, .part = { { mem, t, M, K } } };
        sf_weight *w = NULL;
        sf_error err = { 0 };
        int rc = B->ops->weight_new(B, &d, &w, &err);
        CHECK_MSG(rc == SF_OK, "%s: %s", sf_dtype_name(t), err.msg);
        for (int n = 2; rc == SF_OK && n <= sf_cpu_direct_tokens(&d.part[0], 1); n += 3) {
            float *x = malloc(sizeof(float) * n * K), *y = malloc(sizeof(float) * n * M), *y1 = malloc(sizeof(float) * M);
            fill_rand(x, (int64_t)n * K, 1.0f);
            sf_buf *bx = buf(n, K), *by = buf(n, M), *bx1 = buf(1, K), *by1 = buf(1, M);
            B->ops->write_f32(B, bx, n, x);
            CHECK(B->ops->matmul(B, bx, w, n, by) == SF_OK);
            B->ops->read_f32(B, by, n, y);
            int differ = 0;
            for (int i = 0; i < n; i++) {
                B->ops->write_f32(B, bx1, 1, x + (int64_t)i * K);
                CHECK(B->ops->matmul(B, bx1, w, 1, by1) == SF_OK);
                B->ops->read_f32(B, by1, 1, y1);
                differ += memcmp(y1, y + (int64_t)i * M, sizeof(float) * M) != 0;
            }
            CHECK_MSG(!differ, "%s: %d of %d tokens of a step of %d differ from the same token alone", sf_dtype_name(t),
                      differ, n, n);
            B->ops->buf_free(B, bx); B->ops->buf_free(B, by); B->ops->buf_free(B, bx1); B->ops->buf_free(B, by1);
            free(x); free(y); free(y1);
        }
        if (w) B->ops->weight_free(B, w);
        free(mem);
    }
}

TEST(matmul_rejects_bad_shapes)
{
    float w[6] = { 0 };
    sf_weight_desc d = { .n_parts = 1, .part = { { w, SF_DT_F32, 2, 3 } } };
    sf_weight *wt = NULL;
    sf_error err = { 0 };
    int rc = B->ops->weight_new(B, &d, &wt, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    sf_buf *x = buf(2, 4), *y = buf(2, 2);
    CHECK(B->ops->matmul(B, x, wt, 2, y) == SF_EINVAL); /* k mismatch */
    CHECK(B->ops->matmul(B, y, wt, 3, y) == SF_EINVAL); /* too many rows */
    B->ops->buf_free(B, x);
    B->ops->buf_free(B, y);
    B->ops->weight_free(B, wt);
    /* q8_0 rows must be whole blocks; parts must agree on columns; dtype must be readable */
    sf_weight_desc q = { .n_parts = 1, .part = { { w, SF_DT_Q8_0, 1, 20 } } };
    CHECK(B->ops->weight_new(B, &q, &wt, &err) == SF_EFORMAT);
    sf_weight_desc two = { .n_parts = 2, .part = { { w, SF_DT_F32, 1, 3 }, { w, SF_DT_F32, 1, 2 } } };
    CHECK(B->ops->weight_new(B, &two, &wt, &err) == SF_EINVAL);
    CHECK(strstr(err.msg, "columns") != NULL);
    sf_weight_desc i8 = { .n_parts = 1, .part = { { w, SF_DT_I8, 1, 3 } } };
    CHECK(B->ops->weight_new(B, &i8, &wt, &err) == SF_EUNSUPPORTED);
}

/* ---- rmsnorm, silu_mul, embed -------------------------------------------------------- */
TEST(rmsnorm_fused_add)
{
    int shapes[][2] = { { 1, 1 }, { 1, 64 }, { 3, 17 }, { 9, 2048 }, { 2, 4097 }, { 40, 2048 } };
    for (size_t s = 0; s < SF_ARRAY_LEN(shapes); s++) {
        int n = shapes[s][0], dd = shapes[s][1];
        for (int with_add = 0; with_add < 2; with_add++) {
            float *x = malloc(4 * n * dd), *a = malloc(4 * n * dd), *w = malloc(4 * dd), *o = malloc(4 * n * dd),
                  *xo = malloc(4 * n * dd);
            double *ref = malloc(8 * n * dd), *xref = malloc(8 * n * dd);
            fill_rand(x, n * dd, 2.0f);
            fill_rand(a, n * dd, 1.0f);
            fill_rand(w, dd, 1.0f);
            float eps = 1e-5f;
            for (int r = 0; r < n; r++) {
                double ss = 0;
                for (int i = 0; i < dd; i++) {
                    xref[r * dd + i] = (double)x[r * dd + i] + (with_add ? (double)a[r * dd + i] : 0);
                    ss += xref[r * dd + i] * xref[r * dd + i];
                }
                double inv = 1.0 / sqrt(ss / dd + eps);
                for (int i = 0; i < dd; i++) ref[r * dd + i] = xref[r * dd + i] * inv * w[i];
            }
            sf_weight_desc d = { .n_parts = 1, .part = { { w, SF_DT_F32, 1, dd } } };
            sf_weight *wt = NULL;
            B->ops->weight_new(B, &d, &wt, NULL);
            sf_buf *bx = buf(n, dd), *ba = buf(n, dd), *bo = buf(n, dd);
            B->ops->write_f32(B, bx, n, x);
            B->ops->write_f32(B, ba, n, a);
            poison(bo, n, dd);
            CHECK(B->ops->rmsnorm(B, bx, with_add ? ba : NULL, wt, eps, n, bo) == SF_OK);
            B->ops->read_f32(B, bo, n, o);
            B->ops->read_f32(B, bx, n, xo);
            double e1 = rel_err(o, ref, n * dd), e2 = rel_err(xo, xref, n * dd);
            CHECK_MSG(e1 < TOL && e2 < TOL, "n=%d d=%d add=%d: out err %g, residual err %g", n, dd, with_add, e1, e2);
            B->ops->buf_free(B, bx); B->ops->buf_free(B, ba); B->ops->buf_free(B, bo);
            B->ops->weight_free(B, wt);
            free(x); free(a); free(w); free(o); free(xo); free(ref); free(xref);
        }
    }
}

TEST(silu_mul)
{
    int shapes[][2] = { { 1, 1 }, { 1, 172 }, { 5, 33 }, { 8, 5632 } };
    for (size_t s = 0; s < SF_ARRAY_LEN(shapes); s++) {
        int n = shapes[s][0], f = shapes[s][1];
        float *gu = malloc(4 * n * 2 * f), *o = malloc(4 * n * f);
        double *ref = malloc(8 * n * f);
        fill_rand(gu, n * 2 * f, 3.0f);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < f; i++) {
                double g = gu[r * 2 * f + i], u = gu[r * 2 * f + f + i];
                ref[r * f + i] = g / (1 + exp(-g)) * u;
            }
        sf_buf *bg = buf(n, 2 * f), *bo = buf(n, f);
        B->ops->write_f32(B, bg, n, gu);
        poison(bo, n, f);
        CHECK(B->ops->silu_mul(B, bg, n, f, bo) == SF_OK);
        B->ops->read_f32(B, bo, n, o);
        double e = rel_err(o, ref, n * f);
        CHECK_MSG(e < TOL, "n=%d f=%d: rel err %g", n, f, e);
        CHECK(B->ops->silu_mul(B, bg, n, f + 1, bo) == SF_EINVAL);
        B->ops->buf_free(B, bg); B->ops->buf_free(B, bo);
        free(gu); free(o); free(ref);
    }
}

/* A batch of one sequence of T tokens at positions 0..T-1 in blocks 0.. (for embed/get_rows). */
typedef struct simple_batch { int32_t tok[64], pos[64], slot[64], ss[2], ctx[1], bt[64], rows[64]; sf_batch b; } simple_batch;
static void simple_batch_init(simple_batch *s, int T, int bs)
{
    for (int t = 0; t < T; t++) { s->pos[t] = t; s->slot[t] = t; }
    for (int i = 0; i < 64; i++) s->bt[i] = i;
    s->ss[0] = 0; s->ss[1] = T; s->ctx[0] = T;
    s->b = (sf_batch){ .n_tokens = T, .n_seqs = 1, .tokens = s->tok, .pos = s->pos, .slot = s->slot, .seq_start = s->ss,
                       .seq_ctx = s->ctx, .block_table = s->bt, .max_blocks = 64 / bs, .logit_rows = s->rows, .n_logits = 0 };
}

TEST(embed_get_rows_all_dtypes)
{
    sf_kv_config kc = { .n_layers = 1, .n_blocks = 64, .block_size = 1, .n_kv_heads = 1, .head_dim = 2, .dtype = SF_DT_F32 };
    int rc = B->ops->kv_init(B, &kc, NULL);
    REQUIRE(rc == SF_OK, "kv_init");
    sf_dtype types[] = { SF_DT_F32, SF_DT_BF16, SF_DT_F16, SF_DT_Q8_0 };
    for (size_t ti = 0; ti < 4; ti++) {
        int V = 50, dd = 64, T = 7;
        float *e = malloc(4 * V * dd), *x = malloc(4 * T * dd), *g = malloc(4 * 3 * dd);
        double *deq = malloc(8 * V * dd), *ref = malloc(8 * T * dd), *gref = malloc(8 * 3 * dd);
        fill_rand(e, V * dd, 1.0f);
        void *q = quantize(types[ti], e, V, dd, deq);
        sf_weight_desc d = { .n_parts = 1, .part = { { q, types[ti], V, dd } } };
        sf_weight *wt = NULL;
        B->ops->weight_new(B, &d, &wt, NULL);
        simple_batch sb;
        simple_batch_init(&sb, T, 1);
        for (int t = 0; t < T; t++) sb.tok[t] = (t * 17 + 3) % V;
        sb.b.n_logits = 3;
        sb.rows[0] = 6; sb.rows[1] = 0; sb.rows[2] = 3;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < dd; i++) ref[t * dd + i] = deq[sb.tok[t] * dd + i];
        for (int r = 0; r < 3; r++)
            for (int i = 0; i < dd; i++) gref[r * dd + i] = ref[sb.rows[r] * dd + i];
        sf_buf *bx = buf(T, dd), *bg = buf(3, dd);
        poison(bx, T, dd);
        poison(bg, 3, dd);
        CHECK(B->ops->batch_begin(B, &sb.b) == SF_OK);
        CHECK(B->ops->embed(B, wt, bx) == SF_OK);
        CHECK(B->ops->get_rows(B, bx, bg) == SF_OK);
        B->ops->read_f32(B, bx, T, x);
        B->ops->read_f32(B, bg, 3, g);
        double e1 = rel_err(x, ref, T * dd), e2 = rel_err(g, gref, 3 * dd);
        CHECK_MSG(e1 < TOL && e2 < TOL, "%s: embed err %g, get_rows err %g", sf_dtype_name(types[ti]), e1, e2);
        sb.tok[2] = V; /* out of the vocabulary */
        CHECK(B->ops->batch_begin(B, &sb.b) == SF_OK);
        CHECK(B->ops->embed(B, wt, bx) == SF_EINVAL);
        B->ops->buf_free(B, bx); B->ops->buf_free(B, bg);
        B->ops->weight_free(B, wt);
        free(q); free(e); free(x); free(g); free(deq); free(ref); free(gref);
    }
}

/* ---- rope_kv + attention over a paged cache ------------------------------------------ */
#define MAXS 4
#define MAXSTEP 6
typedef struct attn_case {
    int S, H, Hkv, hd, rot, bs, inter;
    int chunks[MAXS][MAXSTEP]; /* tokens of sequence s in step i (0: not in that step) */
} attn_case;

static int run_attn_case(const attn_case *ac, double *worst)
{
    int S = ac->S, H = ac->H, Hkv = ac->Hkv, hd = ac->hd, bs = ac->bs, g = H / Hkv;
    int len[MAXS] = { 0 }, maxlen = 0, nsteps = 0;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < MAXSTEP; i++) { len[s] += ac->chunks[s][i]; if (ac->chunks[s][i]) nsteps = SF_MAX(nsteps, i + 1); }
        maxlen = SF_MAX(maxlen, len[s]);
    }
    int max_blocks = (maxlen + bs - 1) / bs, n_blocks = S * max_blocks + 3;
    sf_kv_config kc = { .n_layers = 2, .n_blocks = n_blocks, .block_size = bs, .n_kv_heads = Hkv, .head_dim = hd, .dtype = SF_DT_F32 };
    if (B->ops->kv_init(B, &kc, NULL) != SF_OK) return 0;
    /* a shuffled block assignment, so that logical order differs from memory order */
    int32_t *perm = malloc(4 * n_blocks), *bt_all = malloc(4 * S * max_blocks);
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) { int j = (int)(sf_rng_next(&R) % (uint64_t)(i + 1)); int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    for (int i = 0; i < S * max_blocks; i++) bt_all[i] = perm[i];
    float inv_freq[512];
    for (int i = 0; i < ac->rot / 2; i++) inv_freq[i] = (float)pow(10000.0, -2.0 * i / ac->rot);
    sf_rope rope = { .head_dim = hd, .rot_dim = ac->rot, .interleaved = ac->inter, .inv_freq = inv_freq,
                     .attn_scale = 1.0f / sqrtf((float)hd) };
    int64_t W = (int64_t)(H + 2 * Hkv) * hd;
    double *kref = calloc((size_t)S * maxlen * Hkv * hd, 8), *vref = calloc((size_t)S * maxlen * Hkv * hd, 8);
    int cur[MAXS] = { 0 }, ok = 1, layer = 1;
    for (int step = 0; step < nsteps && ok; step++) {
        int T = 0, n = 0;
        int32_t tok[256], pos[256], slot[256], ss[MAXS + 1], ctx[MAXS], sid[MAXS], bt[MAXS * 64];
        ss[0] = 0;
        for (int s = 0; s < S; s++) {
            int c = ac->chunks[s][step];
            if (!c) continue;
            sid[n] = s;
            for (int j = 0; j < c; j++, T++) {
                int p = cur[s] + j;
                tok[T] = 0;
                pos[T] = p;
                slot[T] = bt_all[s * max_blocks + p / bs] * bs + p % bs;
            }
            memcpy(bt + n * max_blocks, bt_all + s * max_blocks, 4 * max_blocks);
            ctx[n] = cur[s] + c;
            ss[++n] = T;
        }
        if (!T) continue;
        sf_batch b = { .n_tokens = T, .n_seqs = n, .tokens = tok, .pos = pos, .slot = slot, .seq_start = ss,
                       .seq_ctx = ctx, .block_table = bt, .max_blocks = max_blocks, .logit_rows = tok, .n_logits = 0 };
        float *qkv = malloc(4 * T * W), *qkv_out = malloc(4 * T * W), *out = malloc(4 * T * H * hd);
        double *qref = malloc(8 * T * W), *oref = calloc((size_t)T * H * hd, 8);
        fill_rand(qkv, T * W, 1.0f);
        /* reference rotation (double) and the reference cache */
        for (int t = 0; t < T; t++) {
            for (int64_t i = 0; i < W; i++) qref[t * W + i] = qkv[t * W + i];
            for (int h = 0; h < H + Hkv; h++) {
                double *v = qref + t * W + (int64_t)h * hd;
                for (int i = 0; i < ac->rot / 2; i++) {
                    double a = (double)pos[t] * inv_freq[i], c = cos(a), sn = sin(a);
                    int i0 = ac->inter ? 2 * i : i, i1 = ac->inter ? 2 * i + 1 : i + ac->rot / 2;
                    double x0 = v[i0], x1 = v[i1];
                    v[i0] = x0 * c - x1 * sn;
                    v[i1] = x0 * sn + x1 * c;
                }
            }
        }
        for (int q = 0; q < n; q++) {
            int s = sid[q];
            for (int t = ss[q]; t < ss[q + 1]; t++)
                for (int h = 0; h < Hkv; h++)
                    for (int d = 0; d < hd; d++) {
                        int64_t at = (((int64_t)s * maxlen + pos[t]) * Hkv + h) * hd + d;
                        kref[at] = qref[t * W + (int64_t)(H + h) * hd + d];
                        vref[at] = qref[t * W + (int64_t)(H + Hkv + h) * hd + d];
                    }
        }
        for (int q = 0; q < n; q++) {
            int s = sid[q];
            for (int t = ss[q]; t < ss[q + 1]; t++)
                for (int h = 0; h < H; h++) {
                    int kvh = h / g;
                    double *sc = malloc(8 * (pos[t] + 1)), mx = -INFINITY, z = 0;
                    for (int j = 0; j <= pos[t]; j++) {
                        double dd = 0;
                        for (int d = 0; d < hd; d++)
                            dd += qref[t * W + (int64_t)h * hd + d] * kref[(((int64_t)s * maxlen + j) * Hkv + kvh) * hd + d];
                        sc[j] = dd * rope.attn_scale;
                        mx = fmax(mx, sc[j]);
                    }
                    for (int j = 0; j <= pos[t]; j++) { sc[j] = exp(sc[j] - mx); z += sc[j]; }
                    for (int j = 0; j <= pos[t]; j++)
                        for (int d = 0; d < hd; d++)
                            oref[((int64_t)t * H + h) * hd + d] += sc[j] / z * vref[(((int64_t)s * maxlen + j) * Hkv + kvh) * hd + d];
                    free(sc);
                }
        }
        sf_buf *bq = buf(T, W), *bo = buf(T, (int64_t)H * hd);
        B->ops->write_f32(B, bq, T, qkv);
        poison(bo, T, (int64_t)H * hd);
        int rc1 = B->ops->batch_begin(B, &b);
        int rc2 = B->ops->rope_kv(B, bq, layer, H, Hkv, &rope);
        int rc3 = B->ops->attention(B, bq, layer, H, Hkv, &rope, bo);
        B->ops->read_f32(B, bq, T, qkv_out);
        B->ops->read_f32(B, bo, T, out);
        double e1 = rel_err(qkv_out, qref, T * W), e2 = rel_err(out, oref, (int64_t)T * H * hd);
        *worst = fmax(*worst, fmax(e1, e2));
        if (rc1 || rc2 || rc3 || !(e1 < TOL) || !(e2 < TOL)) {
            printf("  attn S=%d H=%d Hkv=%d hd=%d rot=%d bs=%d inter=%d step %d (T=%d): rc %d/%d/%d rope err %g attn err %g\n",
                   S, H, Hkv, hd, ac->rot, bs, ac->inter, step, T, rc1, rc2, rc3, e1, e2);
            ok = 0;
        }
        for (int q = 0; q < n; q++) cur[sid[q]] += ss[q + 1] - ss[q];
        B->ops->buf_free(B, bq); B->ops->buf_free(B, bo);
        free(qkv); free(qkv_out); free(out); free(qref); free(oref);
    }
    free(kref); free(vref); free(perm); free(bt_all);
    return ok;
}

TEST(rope_kv_attention_paged)
{
    static const attn_case cases[] = {
        /* one sequence: prefill, then decode steps */
        { 1, 4, 4, 8, 8, 4, 0, { { 5, 1, 1, 1 } } },
        /* GQA 2, interleaved pairs, chunked prefill continuing a cached prefix */
        { 2, 4, 2, 16, 16, 4, 1, { { 7, 6, 1 }, { 1, 1, 1 } } },
        /* GQA 4, block size 1, three sequences of different lengths, mixed prefill + decode */
        { 3, 8, 2, 6, 6, 1, 0, { { 3, 1, 1 }, { 9, 0, 2 }, { 1, 4, 1 } } },
        /* GQA 8, block size 16, longer contexts crossing block boundaries */
        { 2, 8, 1, 64, 64, 16, 0, { { 40, 1, 1 }, { 17, 15, 1 } } },
        /* partial rotary (rot < head_dim), odd head dim, GQA 1, four sequences */
        { 4, 2, 2, 10, 4, 4, 1, { { 1, 1 }, { 2, 1 }, { 5, 3 }, { 0, 6 } } },
        /* realistic head size, GQA 4 */
        { 1, 8, 2, 128, 128, 16, 0, { { 33, 1, 1, 1 } } },
    };
    double worst = 0;
    for (size_t c = 0; c < SF_ARRAY_LEN(cases); c++) CHECK(run_attn_case(&cases[c], &worst));
    printf("  worst rel err (rope, attention): %.2e\n", worst);
}

TEST(batch_rejects_bad_metadata)
{
    sf_kv_config kc = { .n_layers = 1, .n_blocks = 4, .block_size = 4, .n_kv_heads = 1, .head_dim = 2, .dtype = SF_DT_F32 };
    int rc = B->ops->kv_init(B, &kc, NULL);
    REQUIRE(rc == SF_OK, "kv_init");
    simple_batch sb;
    simple_batch_init(&sb, 3, 4);
    sb.b.max_blocks = 4;
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_OK);
    sb.slot[1] = 7;                       /* slot disagrees with the block table */
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_EINVAL);
    sb.slot[1] = 1;
    sb.bt[0] = 9;                         /* block id outside the pool */
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_EINVAL);
    sb.bt[0] = 0;
    sb.pos[2] = 16;                       /* position beyond max_blocks * block_size */
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_EINVAL);
    sb.pos[2] = 2;
    sb.ss[1] = 2;                         /* seq_start does not end at n_tokens */
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_EINVAL);
    sb.ss[1] = 3;
    sb.b.n_logits = 1;
    sb.rows[0] = 3;                       /* logit row outside the batch */
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_EINVAL);
    sb.rows[0] = 2;
    CHECK(B->ops->batch_begin(B, &sb.b) == SF_OK);
    /* attention with heads that do not match the cache */
    sf_buf *q = buf(3, 8), *o = buf(3, 4);
    float f[1] = { 1 };
    sf_rope rope = { .head_dim = 2, .rot_dim = 2, .inv_freq = f, .attn_scale = 1 };
    CHECK(B->ops->attention(B, q, 0, 2, 2, &rope, o) == SF_EINVAL);
    CHECK(B->ops->rope_kv(B, q, 5, 2, 1, &rope) == SF_EINVAL); /* layer out of range */
    B->ops->buf_free(B, q);
    B->ops->buf_free(B, o);
}


int main(int argc, char **argv)
{
    sf_error err = { 0 };
    sf_rng_seed(&R, 1234);
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    if (sf_backend_open(&o, &B, &err) != SF_OK) {
        printf("FAIL: backend: %s\n", err.msg);
        return 1;
    }
    int scalar = getenv("SEMFLOW_NO_AVX2") != NULL;
    if (scalar) printf("-- scalar path (SEMFLOW_NO_AVX2=1)\n");
    RUN(matmul_shapes_dtypes);
    RUN(matmul_block_formats);
    RUN(matmul_token_alone_or_not);
    RUN(matmul_rejects_bad_shapes);
    RUN(rmsnorm_fused_add);
    RUN(silu_mul);
    RUN(embed_get_rows_all_dtypes);
    RUN(rope_kv_attention_paged);
    RUN(batch_rejects_bad_metadata);
    sf_backend_close(B);
    int rc = test_summary();
    if (!scalar) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("SEMFLOW_NO_AVX2", "1", 1);
            execv("/proc/self/exe", argv);
            _exit(127);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st)) rc = 1;
    }
    (void)argc;
    return rc;
}
