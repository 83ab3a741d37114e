/* test_prefill_attn.c — the prefill attention kernels called directly (kernels.h): the
 * FlashAttention-2-style kernel (attention_prefill_fa2.cu) and the WMMA kernels it replaces,
 * against a float64 host reference over the same bf16 inputs, on fresh random inputs (the seed is
 * printed) over many shapes: one token to 4096 keys, several sequences of different lengths in
 * one launch, chunked prefill (queries at p0 > 0 over keys cached before), GQA 32/8, 28/4 and 8/2,
 * head sizes 128 and 64, block sizes 16 and 32, shuffled block tables, INT8 KV blocks mixed in.
 * Outputs are poisoned with NaN before each launch; a padding column block beside the output must
 * stay untouched; the check is ||out - ref|| / ||ref|| <= 1e-2 per case and <= 3e-2 per row, NaN
 * never passing. On failure the worst rows are printed with their tile row and head.
 *
 *   test_prefill_attn            the checks (GPU host only)
 *   test_prefill_attn --quick    fewer, smaller cases (for compute-sanitizer)
 *   test_prefill_attn --perf     also time each kernel (fa2 at 64 and 128 rows per block, 128 with
 *                                32-key tiles, the dispatcher's default, WMMA), causal, one
 *                                sequence of 512 / 2048 / 4096 tokens, 32/8 and 28/4 heads of 128:
 *                                us and TFLOP/s */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/sf.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cuda/kernels.h"

static sf_rng R;
static int quick, perf;

enum { PATH_FA2, PATH_FA2_128, PATH_FA2_128_K32, PATH_WMMA, PATH_DISPATCH, N_PATHS };
static const char *path_name[N_PATHS] = { "fa2-64", "fa2-128", "fa2-128 k32", "wmma", "dispatch" };

/* One launch's inputs on host and device. */
typedef struct pcase {
    int H, Hkv, hd, bs, S, T, max_blocks, n_tiles, ld_q, ld_out, i8_every;
    int p0[8], len[8];
    /* host */
    uint16_t *q, *k, *v;  /* q [T][ld_q]; k, v: the whole pool (bf16 blocks, then INT8 units) */
    float *ks, *vs;       /* INT8 scales */
    int32_t *meta;        /* pos [T], tok_seq [T], block_table [S][max_blocks], tiles [n][2] */
    int64_t pool_elems, n_scales;
    int i8_base;
    /* device */
    uint16_t *dq, *dk, *dv, *dout;
    float *dks, *dvs;
    int32_t *dmeta;
} pcase;

static float bfr(float x) { return sf_bf16_to_f32(sf_f32_to_bf16(x)); }

/* Key p of sequence s, kv head h, dim d, as the kernels see it (INT8 blocks dequantised to bf16). */
static float key_val(const pcase *c, const uint16_t *pool, const float *scales, int s, int h, int p, int d)
{
    const int32_t *bt = c->meta + 2 * c->T + s * c->max_blocks;
    int64_t id = bt[p / c->bs];
    if (c->i8_base && id >= c->i8_base) {
        int64_t row = ((id - c->i8_base) * c->Hkv + h) * c->bs + p % c->bs;
        return bfr((float)((const int8_t *)pool)[row * c->hd + d] * scales[row]);
    }
    return sf_bf16_to_f32(pool[((id * c->Hkv + h) * c->bs + p % c->bs) * c->hd + d]);
}

static void pcase_free(pcase *c)
{
    free(c->q); free(c->k); free(c->v); free(c->ks); free(c->vs); free(c->meta);
    cudaFree(c->dq); cudaFree(c->dk); cudaFree(c->dv); cudaFree(c->dout); cudaFree(c->dks); cudaFree(c->dvs);
    cudaFree(c->dmeta);
    memset(c, 0, sizeof *c);
}

/* Builds the inputs of S sequences (p0[s] keys cached, len[s] new tokens each) and uploads them.
 * Every i8_every-th block (0: none) of the tables is an INT8 block. Returns 0 or -1. */
static int pcase_init(pcase *c, int H, int Hkv, int hd, int bs, int S, const int *p0, const int *len, int i8_every)
{
    memset(c, 0, sizeof *c);
    c->H = H; c->Hkv = Hkv; c->hd = hd; c->bs = bs; c->S = S; c->i8_every = i8_every;
    int n_blocks = 0;
    for (int s = 0; s < S; s++) {
        c->p0[s] = p0[s];
        c->len[s] = len[s];
        c->T += len[s];
        int nb = (p0[s] + len[s] + bs - 1) / bs;
        c->max_blocks = SF_MAX(c->max_blocks, nb);
        n_blocks += nb;
        c->n_tiles += (len[s] + SF_K_PREFILL_TILE - 1) / SF_K_PREFILL_TILE;
    }
    c->ld_q = (H + 2 * Hkv) * hd;
    c->ld_out = H * hd + 8; /* 8 padding columns that must stay untouched */
    /* ids: a shuffled permutation; bf16 blocks use ids < n_pool, INT8 ones are half-block units
     * placed past the bf16 blocks (unit u at byte u * block_bytes / 2): ids i8_base + 2 * n_pool + j */
    const int n_pool = n_blocks + 3;
    const int64_t blk = (int64_t)Hkv * bs * hd;
    c->i8_base = i8_every ? n_pool : 0;
    c->pool_elems = (int64_t)(n_pool + n_blocks / 2 + 2) * blk;
    c->n_scales = i8_every ? (int64_t)(2 * n_pool + n_blocks) * Hkv * bs : 1;
    size_t n_meta = 2 * (size_t)c->T + (size_t)S * c->max_blocks + 2 * (size_t)c->n_tiles;
    c->q = malloc((size_t)c->T * c->ld_q * 2);
    c->k = calloc((size_t)c->pool_elems, 2);
    c->v = calloc((size_t)c->pool_elems, 2);
    c->ks = calloc((size_t)c->n_scales, 4);
    c->vs = calloc((size_t)c->n_scales, 4);
    c->meta = calloc(n_meta, 4);
    int *perm = malloc(sizeof(int) * n_pool);
    if (!c->q || !c->k || !c->v || !c->ks || !c->vs || !c->meta || !perm) { free(perm); return -1; }
    for (int i = 0; i < n_pool; i++) perm[i] = i;
    for (int i = n_pool - 1; i > 0; i--) {
        int j = (int)(sf_rng_next(&R) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *pos = c->meta, *ts = pos + c->T, *bt = ts + c->T, *tiles = bt + (size_t)S * c->max_blocks;
    int t = 0, b = 0, n8 = 0, nt = 0;
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < len[s]; i++, t++) { pos[t] = p0[s] + i; ts[t] = s; }
        for (int i = 0; i < len[s]; i += SF_K_PREFILL_TILE, nt++) {
            tiles[2 * nt] = t - len[s] + i;
            tiles[2 * nt + 1] = SF_MIN(SF_K_PREFILL_TILE, len[s] - i);
        }
        int nb = (p0[s] + len[s] + bs - 1) / bs;
        for (int i = 0; i < nb; i++, b++)
            bt[s * c->max_blocks + i] = (i8_every && b % i8_every == i8_every - 1) ? c->i8_base + 2 * n_pool + n8++ : perm[b];
    }
    free(perm);
    /* q with a wider spread than k so some rows have peaked softmaxes */
    for (int64_t i = 0; i < (int64_t)c->T * c->ld_q; i++) c->q[i] = sf_f32_to_bf16(sf_rng_normal(&R) * 1.5f);
    /* keys and values of every position of every sequence, through the block table */
    for (int s = 0; s < S; s++)
        for (int p = 0; p < p0[s] + len[s]; p++)
            for (int h = 0; h < Hkv; h++) {
                int64_t id = bt[s * c->max_blocks + p / bs];
                if (c->i8_base && id >= c->i8_base) {
                    int64_t row = ((id - c->i8_base) * Hkv + h) * bs + p % bs;
                    c->ks[row] = 0.02f + 0.01f * sf_rng_uniform(&R);
                    c->vs[row] = 0.02f + 0.01f * sf_rng_uniform(&R);
                    for (int d = 0; d < hd; d++) {
                        ((int8_t *)c->k)[row * hd + d] = (int8_t)((int)(sf_rng_next(&R) % 255) - 127);
                        ((int8_t *)c->v)[row * hd + d] = (int8_t)((int)(sf_rng_next(&R) % 255) - 127);
                    }
                } else {
                    uint16_t *kr = c->k + ((id * Hkv + h) * bs + p % bs) * hd, *vr = c->v + (kr - c->k);
                    for (int d = 0; d < hd; d++) {
                        kr[d] = sf_f32_to_bf16(sf_rng_normal(&R));
                        vr[d] = sf_f32_to_bf16(sf_rng_normal(&R));
                    }
                }
            }
    if (cudaMalloc((void **)&c->dq, (size_t)c->T * c->ld_q * 2) ||
        cudaMalloc((void **)&c->dk, (size_t)c->pool_elems * 2) || cudaMalloc((void **)&c->dv, (size_t)c->pool_elems * 2) ||
        cudaMalloc((void **)&c->dout, (size_t)c->T * c->ld_out * 2) || cudaMalloc((void **)&c->dks, (size_t)c->n_scales * 4) ||
        cudaMalloc((void **)&c->dvs, (size_t)c->n_scales * 4) || cudaMalloc((void **)&c->dmeta, n_meta * 4))
        return -1;
    if (cudaMemcpy(c->dq, c->q, (size_t)c->T * c->ld_q * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dk, c->k, (size_t)c->pool_elems * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dv, c->v, (size_t)c->pool_elems * 2, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dks, c->ks, (size_t)c->n_scales * 4, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dvs, c->vs, (size_t)c->n_scales * 4, cudaMemcpyHostToDevice) ||
        cudaMemcpy(c->dmeta, c->meta, n_meta * 4, cudaMemcpyHostToDevice))
        return -1;
    return 0;
}

static sf_k_attn pcase_args(const pcase *c)
{
    const int32_t *m = c->dmeta;
    return (sf_k_attn){ .q = c->dq, .ld_q = c->ld_q, .out = c->dout, .ld_out = c->ld_out, .T = c->T, .H = c->H,
                        .Hkv = c->Hkv, .hd = c->hd, .scale = 1.0f / sqrtf((float)c->hd), .pos = m,
                        .tok_seq = m + c->T, .block_table = m + 2 * c->T, .max_blocks = c->max_blocks,
                        .kv = { c->dk, c->dv, c->bs, c->Hkv, c->hd, c->dks, c->dvs, c->i8_base }, .n_split = 1,
                        .tiles = m + 2 * c->T + (size_t)c->S * c->max_blocks, .n_tiles = c->n_tiles };
}

static int launch(int path, const sf_k_attn *a, cudaStream_t s)
{
    if (path == PATH_FA2) return sf_k_attention_prefill_fa2(a, 64, s);
    if (path == PATH_FA2_128) return sf_k_attention_prefill_fa2(a, 128, s);
    if (path == PATH_FA2_128_K32) return sf_k_attention_prefill_fa2_keys(a, 128, 32, s);
    if (path == PATH_WMMA) return sf_k_attention_prefill_wmma(a, s);
    return sf_k_attention(a, s); /* dispatch: the default */
}

/* The float64 reference of the checked rows: every stride-th token, the first and last token of
 * every sequence, and tile rows 0, 15, 16 (a warp boundary) and 63 of every tile (of every 4th
 * tile when `sparse`). K and V are first gathered densely per (sequence, kv head). */
typedef struct pref {
    int n;          /* checked tokens */
    int *tok;       /* [n] */
    double *out;    /* [n][H][hd] */
} pref;

static int tile_row_of(const pcase *c, int t)
{
    const int32_t *ts = c->meta + c->T;
    int r = 0;
    for (int u = t; u > 0 && ts[u - 1] == ts[t]; u--) r++;
    return r;
}

static int pref_build(pref *rf, const pcase *c, int stride, int sparse)
{
    const int32_t *pos = c->meta, *ts = pos + c->T;
    const int G = c->H / c->Hkv, hd = c->hd;
    const double scale = 1.0 / sqrt((double)hd);
    memset(rf, 0, sizeof *rf);
    rf->tok = malloc(sizeof(int) * c->T);
    if (!rf->tok) return -1;
    for (int t = 0; t < c->T; t++) {
        int r = tile_row_of(c, t), tr = r % SF_K_PREFILL_TILE;
        int first = r == 0, last = t == c->T - 1 || ts[t + 1] != ts[t];
        int edge = (tr == 0 || tr == 15 || tr == 16 || tr == SF_K_PREFILL_TILE - 1) && (!sparse || (r / SF_K_PREFILL_TILE) % 4 == 0);
        if (t % stride == 0 || first || last || edge) rf->tok[rf->n++] = t;
    }
    rf->out = malloc(sizeof(double) * rf->n * c->H * hd);
    int ctx_max = 0;
    for (int t = 0; t < c->T; t++) ctx_max = SF_MAX(ctx_max, pos[t] + 1);
    float *kd = malloc(sizeof(float) * (size_t)ctx_max * hd), *vd = malloc(sizeof(float) * (size_t)ctx_max * hd);
    double *sc = malloc(sizeof(double) * ctx_max), *acc = malloc(sizeof(double) * hd);
    if (!rf->out || !kd || !vd || !sc || !acc) { free(kd); free(vd); free(sc); free(acc); return -1; }
    for (int s = 0; s < c->S; s++)
        for (int kh = 0; kh < c->Hkv; kh++) {
            int ctx_s = c->p0[s] + c->len[s];
            for (int p = 0; p < ctx_s; p++)
                for (int d = 0; d < hd; d++) {
                    kd[(size_t)p * hd + d] = key_val(c, c->k, c->ks, s, kh, p, d);
                    vd[(size_t)p * hd + d] = key_val(c, c->v, c->vs, s, kh, p, d);
                }
            for (int i = 0; i < rf->n; i++) {
                int t = rf->tok[i], ctx = pos[t] + 1;
                if (ts[t] != s) continue;
                for (int h = kh * G; h < kh * G + G; h++) {
                    const uint16_t *qr = c->q + (size_t)t * c->ld_q + (size_t)h * hd;
                    double mx = -INFINITY, l = 0;
                    for (int p = 0; p < ctx; p++) {
                        double dsum = 0;
                        const float *kr = kd + (size_t)p * hd;
                        for (int d = 0; d < hd; d++) dsum += (double)sf_bf16_to_f32(qr[d]) * kr[d];
                        sc[p] = dsum * scale;
                        mx = fmax(mx, sc[p]);
                    }
                    for (int d = 0; d < hd; d++) acc[d] = 0;
                    for (int p = 0; p < ctx; p++) {
                        double w = exp(sc[p] - mx);
                        const float *vr = vd + (size_t)p * hd;
                        l += w;
                        for (int d = 0; d < hd; d++) acc[d] += w * vr[d];
                    }
                    double *o = rf->out + ((size_t)i * c->H + h) * hd;
                    for (int d = 0; d < hd; d++) o[d] = acc[d] / l;
                }
            }
        }
    free(kd); free(vd); free(sc); free(acc);
    return 0;
}

static void pref_free(pref *rf) { free(rf->tok); free(rf->out); memset(rf, 0, sizeof *rf); }

/* Runs one path on the case and compares the checked rows with the reference. */
static void check_path(const char *name, pcase *c, const pref *rf, int path)
{
    const size_t out_bytes = (size_t)c->T * c->ld_out * 2;
    uint16_t *out = malloc(out_bytes);
    REQUIRE(out, "out of host memory");
    REQUIRE(cudaMemset(c->dout, 0xff, out_bytes) == cudaSuccess, "cudaMemset"); /* bf16 0xffff: NaN */
    sf_k_attn a = pcase_args(c);
    int rc = launch(path, &a, 0);
    cudaError_t se = cudaDeviceSynchronize();
    if (rc || se != cudaSuccess) {
        free(out);
        CHECK_MSG(0, "%s [%s]: launch %d (%s), sync %s", name, path_name[path], rc, cudaGetErrorString((cudaError_t)rc),
                  cudaGetErrorString(se));
        return;
    }
    if (cudaMemcpy(out, c->dout, out_bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(out);
        CHECK_MSG(0, "%s [%s]: cudaMemcpy of the output failed", name, path_name[path]);
        return;
    }
    const int32_t *pos = c->meta, *ts = pos + c->T;
    int n_nan = 0, n_bad_rows = 0, pad_touched = 0, worst_t = -1, worst_h = -1;
    double e2 = 0, r2 = 0, worst = 0;
    for (int t = 0; t < c->T; t++)
        for (int j = 0; j < 8; j++) pad_touched |= out[(size_t)t * c->ld_out + c->H * c->hd + j] != 0xffff;
    for (int i = 0; i < rf->n; i++) {
        int t = rf->tok[i];
        for (int h = 0; h < c->H; h++) {
            const double *want = rf->out + ((size_t)i * c->H + h) * c->hd;
            double re2 = 0, rr2 = 0;
            for (int d = 0; d < c->hd; d++) {
                float got = sf_bf16_to_f32(out[(size_t)t * c->ld_out + (size_t)h * c->hd + d]);
                if (isnan(got)) n_nan++;
                re2 += (got - want[d]) * (got - want[d]);
                rr2 += want[d] * want[d];
            }
            e2 += re2;
            r2 += rr2;
            double rel = sqrt(re2 / (rr2 > 0 ? rr2 : 1e-30));
            if (!(rel <= 3e-2)) {
                if (n_bad_rows < 6)
                    printf("  %s [%s]: token %d (seq %d, pos %d, tile row %d) head %d: rel err %.3g\n", name,
                           path_name[path], t, ts[t], pos[t], tile_row_of(c, t) % SF_K_PREFILL_TILE, h, rel);
                n_bad_rows++;
            }
            if (!(rel <= worst)) { worst = rel; worst_t = t; worst_h = h; }
        }
    }
    double rel = sqrt(e2 / (r2 > 0 ? r2 : 1e-30));
    printf("  %-28s %-13s T=%-5d tiles=%-4d rows %-4d rel err %.2e, worst row %.2e (token %d head %d)\n", name,
           path_name[path], c->T, c->n_tiles, rf->n, rel, worst, worst_t, worst_h);
    CHECK_MSG(n_nan == 0, "%s [%s]: %d NaN outputs (poisoned rows left unwritten?)", name, path_name[path], n_nan);
    CHECK_MSG(rel <= 1e-2 && n_bad_rows == 0, "%s [%s]: rel err %.3g, %d rows above 3e-2", name, path_name[path], rel,
              n_bad_rows);
    CHECK_MSG(!pad_touched, "%s [%s]: wrote into the padding columns past H * head_dim", name, path_name[path]);
    free(out);
}

typedef struct shape {
    const char *name;
    int H, Hkv, hd, bs, S, i8_every, stride, big;
    int p0[8], len[8];
} shape;

static const shape SHAPES[] = {
    { "one token", 32, 8, 128, 16, 1, 0, 1, 0, { 0 }, { 1 } },
    { "one token at p0 1000", 32, 8, 128, 16, 1, 0, 1, 0, { 1000 }, { 1 } },
    { "17 tokens", 32, 8, 128, 16, 1, 0, 1, 0, { 0 }, { 17 } },
    { "64 tokens", 32, 8, 128, 16, 1, 0, 1, 0, { 0 }, { 64 } },
    { "65 tokens", 32, 8, 128, 16, 1, 0, 3, 0, { 0 }, { 65 } },
    { "chunk p0 64 T 64", 32, 8, 128, 16, 1, 0, 3, 0, { 64 }, { 64 } },
    { "chunk p0 100 T 77", 32, 8, 128, 16, 1, 0, 3, 0, { 100 }, { 77 } },
    { "chunk p0 37 T 300 bs 32", 32, 8, 128, 32, 1, 0, 7, 0, { 37 }, { 300 } },
    { "4 seqs mixed lengths", 32, 8, 128, 16, 4, 0, 5, 0, { 0, 50, 7, 0 }, { 1, 130, 64, 300 } },
    { "qwen 28/4 p0 21 T 333", 28, 4, 128, 16, 1, 0, 7, 0, { 21 }, { 333 } },
    { "qwen 28/4 3 seqs", 28, 4, 128, 16, 3, 0, 5, 0, { 5, 0, 200 }, { 90, 16, 129 } },
    { "hd 64 8/2 p0 30 T 150", 8, 2, 64, 16, 1, 0, 3, 0, { 30 }, { 150 } },
    { "hd 64 32/8 2 seqs", 32, 8, 64, 16, 2, 0, 5, 0, { 0, 64 }, { 200, 70 } },
    { "int8 blocks mixed 32/8", 32, 8, 128, 16, 2, 3, 5, 0, { 40, 0 }, { 300, 77 } },
    { "int8 blocks hd 64", 8, 2, 64, 16, 1, 2, 3, 0, { 17 }, { 200 } },
    { "2048 tokens", 32, 8, 128, 16, 1, 0, 61, 1, { 0 }, { 2048 } },
    { "chunk p0 1600 T 2500 8/2", 8, 2, 128, 16, 1, 0, 43, 1, { 1600 }, { 2500 } },
};

TEST(prefill_attention)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(SHAPES); i++) {
        const shape *sh = &SHAPES[i];
        if (quick && (sh->big || i % 3)) continue;
        pcase c;
        if (pcase_init(&c, sh->H, sh->Hkv, sh->hd, sh->bs, sh->S, sh->p0, sh->len, sh->i8_every)) {
            CHECK_MSG(0, "%s: could not allocate the case (host or device memory)", sh->name);
            pcase_free(&c);
            continue;
        }
        pref rf;
        if (pref_build(&rf, &c, sh->stride, sh->big)) {
            CHECK_MSG(0, "%s: could not allocate the reference (host memory)", sh->name);
        } else {
            check_path(sh->name, &c, &rf, PATH_FA2);
            check_path(sh->name, &c, &rf, PATH_FA2_128);
            check_path(sh->name, &c, &rf, PATH_FA2_128_K32);
            if (!quick) check_path(sh->name, &c, &rf, PATH_WMMA);
            if (i == 8 || sh->big) check_path(sh->name, &c, &rf, PATH_DISPATCH);
        }
        pref_free(&rf);
        pcase_free(&c);
    }
}

/* Bad arguments are refused with cudaErrorInvalidValue, not launched. */
TEST(prefill_attention_refuses)
{
    sf_k_attn a = { .T = 4, .H = 32, .Hkv = 8, .hd = 96, .scale = 0.1f, .n_tiles = 1, .ld_q = 8, .ld_out = 8 };
    int32_t *tiles = NULL;
    REQUIRE(cudaMalloc((void **)&tiles, 8) == cudaSuccess, "cudaMalloc");
    a.tiles = tiles;
    a.kv.head_dim = 96;
    CHECK(!sf_k_attention_prefill_fa2_ok(&a));
    CHECK(sf_k_attention_prefill_fa2(&a, 0, 0) == (int)cudaErrorInvalidValue);
    a.hd = a.kv.head_dim = 128;
    a.Hkv = 5;
    CHECK(!sf_k_attention_prefill_fa2_ok(&a));
    a.Hkv = 8;
    a.scale = -1.0f;
    CHECK(!sf_k_attention_prefill_fa2_ok(&a));
    a.scale = 0.1f;
    CHECK(sf_k_attention_prefill_fa2_ok(&a));
    CHECK(sf_k_attention_prefill_fa2(&a, 96, 0) == (int)cudaErrorInvalidValue); /* rows 64 or 128 */
    a.n_tiles = 0;
    CHECK(sf_k_attention_prefill_fa2(&a, 0, 0) == 0); /* nothing to do */
    cudaFree(tiles);
    cudaGetLastError();
}

/* Causal prefill of one sequence: us per launch and TFLOP/s (4 * H * hd * sum of context lengths:
 * QK^T and PV, the causal half only), each kernel. */
static void perf_prefill(void)
{
    static const int cases[][3] = { { 32, 8, 512 }, { 32, 8, 2048 }, { 32, 8, 4096 }, { 28, 4, 2048 }, { 28, 4, 4096 } };
    static const int paths[] = { PATH_FA2, PATH_FA2_128, PATH_FA2_128_K32, PATH_DISPATCH, PATH_WMMA };
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) || cudaEventCreate(&e1)) return;
    printf("perf: causal prefill attention, one sequence, head_dim 128, block 16: us (TFLOP/s)\n");
    printf("perf: %3s %3s %5s | %16s | %16s | %16s | %16s | %16s\n", "H", "Hkv", "T", "fa2-64", "fa2-128",
           "fa2-128 k32", "default", "wmma");
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        int H = cases[i][0], Hkv = cases[i][1], T = cases[i][2], p0 = 0;
        pcase c;
        if (pcase_init(&c, H, Hkv, 128, 16, 1, &p0, &T, 0)) { pcase_free(&c); continue; }
        sf_k_attn a = pcase_args(&c);
        double flops = 4.0 * H * 128 * ((double)T * (T + 1) / 2);
        printf("perf: %3d %3d %5d", H, Hkv, T);
        for (size_t k = 0; k < SF_ARRAY_LEN(paths); k++) {
            const int reps = T >= 4096 ? 10 : 20;
            int rc = 0;
            for (int r = 0; r < 3; r++) rc |= launch(paths[k], &a, 0);
            cudaEventRecord(e0, 0);
            for (int r = 0; r < reps; r++) rc |= launch(paths[k], &a, 0);
            cudaEventRecord(e1, 0);
            cudaEventSynchronize(e1);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            float us = rc ? NAN : ms * 1000.0f / reps;
            printf(" | %8.1f (%5.1f)", us, flops / us / 1e6);
        }
        printf("\n");
        pcase_free(&c);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}
#endif

int main(int argc, char **argv)
{
#ifdef SF_HAVE_CUDA
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--perf")) perf = 1;
        else {
            fprintf(stderr, "test_prefill_attn: unknown argument '%s' (use --quick or --perf)\n", argv[i]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev < 1) {
        printf("FAIL: cuda_device: no CUDA device visible (run on the GPU host; check CUDA_VISIBLE_DEVICES)\n");
        return 1;
    }
    sf_rng_seed(&R, (uint64_t)sf_now_ns()); /* fresh inputs every run; the seed is printed */
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    RUN(prefill_attention);
    RUN(prefill_attention_refuses);
    if (perf) perf_prefill();
    return test_summary();
#else
    (void)argc; (void)argv;
    printf("FAIL: cuda: built without CUDA (no nvcc at build time)\n");
    return 1;
#endif
}
