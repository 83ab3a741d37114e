/* kv8_case.h — one check of a backend's INT8 KV path (RoPE + KV write, paged attention),
 * shared by the CPU unit test (tests/unit/test_kv8.c) and the CUDA device test
 * (tests/device/test_ops.c). Header-only: each test binary includes it once.
 *
 * Sequences of both kinds run in the same batches over several steps (a prefill chunk, then
 * more chunks or single decode tokens); their blocks come from the real allocator
 * (engine/kvcache.h). After each step the test reads the INT8 blocks back through kv_copy_out
 * and checks, against a float64 reference of the rotated keys and the values:
 *   - the write: every stored value within the quantisation bound |x - q s| <= s/2 (plus the
 *     rounding of x the backend stores, `x_round` relative), and s = max|x| / 127;
 *   - the read: rotated q and the attention output against a float64 attention over exactly the
 *     stored (dequantised) INT8 rows and the exact full-precision rows, within `tol` (relative L2).
 * It also reports how far the INT8 output is from attention over the exact K/V (the
 * quantisation's own effect), for information. */
#ifndef SF_TESTS_KV8_CASE_H
#define SF_TESTS_KV8_CASE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../engine/kvcache.h"
#include "../../hal/hal.h"

typedef struct kv8_case {
    int S, H, Hkv, hd, bs, interleaved;
    int n_steps;
    int len[4][6];      /* tokens of sequence s in step i */
    int i8[4];          /* 1: sequence s keeps INT8 blocks */
} kv8_case;

typedef struct kv8_result {
    double worst_q, worst_out; /* rel L2 of rotated q and attention vs the stored-KV reference */
    double worst_write;        /* max (|x - q s| / (s/2)) over stored INT8 values: <= 1 passes */
    double worst_scale;        /* max |s - max|x|/127| / (max|x|/127) */
    double quant_effect;       /* max rel L2 of attention (INT8 sequences) vs attention over exact K/V */
    int tokens_checked;
    char why[256];             /* first failure, empty when none */
} kv8_result;

static double kv8_rel(const float *a, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (a[i] != a[i]) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void kv8_rope(double *v, int hd, int interleaved, int pos, const float *inv_freq)
{
    for (int j = 0; j < hd / 2; j++) {
        int a = interleaved ? 2 * j : j, b = interleaved ? 2 * j + 1 : j + hd / 2;
        double ang = (double)pos * inv_freq[j], c = cos(ang), s = sin(ang);
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x1 * c + x0 * s;
    }
}

/* attention of one query row (H heads, rotated, double) over ctx positions of K/V [pos][Hkv*hd] */
static void kv8_attend(const double *q, const double *K, const double *V, int ctx, int H, int Hkv, int hd, double *out)
{
    double *sc = malloc((size_t)ctx * sizeof *sc);
    for (int h = 0; h < H; h++) {
        int kh = h / (H / Hkv);
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < ctx; j++) {
            double d = 0;
            for (int c = 0; c < hd; c++) d += q[h * hd + c] * K[(size_t)j * Hkv * hd + kh * hd + c];
            sc[j] = d / sqrt((double)hd);
            mx = fmax(mx, sc[j]);
        }
        for (int j = 0; j < ctx; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int c = 0; c < hd; c++) {
            double o = 0;
            for (int j = 0; j < ctx; j++) o += sc[j] * V[(size_t)j * Hkv * hd + kh * hd + c];
            out[h * hd + c] = o / sum;
        }
    }
    free(sc);
}

/* rng: a function returning a normal sample (the caller's generator); x_round: relative rounding
 * of stored full-precision values (0 for fp32, 2^-8 for bf16); tol: relative L2 bound. Returns 1
 * when every check held. */
static int kv8_run(sf_backend *B, const kv8_case *c, float (*normal)(void), double x_round, double tol, kv8_result *r)
{
    const int S = c->S, H = c->H, Hkv = c->Hkv, hd = c->hd, bs = c->bs, W = (H + 2 * Hkv) * hd, layer = 1;
    memset(r, 0, sizeof *r);
    int max_ctx = 0;
    for (int s = 0; s < S; s++) {
        int n = 0;
        for (int i = 0; i < c->n_steps; i++) n += c->len[s][i];
        max_ctx = n > max_ctx ? n : max_ctx;
    }
    int max_blocks = (max_ctx + bs - 1) / bs, n_blocks = S * max_blocks + 2;
    sf_kv_config kc = { .n_layers = 2, .n_blocks = n_blocks, .block_size = bs, .n_kv_heads = Hkv, .head_dim = hd,
                        .dtype = strcmp(B->ops->name, "cpu") ? SF_DT_BF16 : SF_DT_F32, .int8 = 1 };
    sf_error err = { 0 };
    sf_kv_pool pool;
    if (B->ops->kv_init(B, &kc, &err) || sf_kv_pool_init(&pool, n_blocks, bs, &err)) {
        snprintf(r->why, sizeof r->why, "setup: %s", err.msg);
        return 0;
    }
    sf_kv_pool_enable_i8(&pool);
    /* a few blocks of both kinds taken first, so the sequences' ids are not 0, 1, 2, ... */
    int32_t junk[3];
    sf_kv_alloc_as(&pool, 1, 1, junk);
    sf_kv_alloc_as(&pool, 0, 1, junk + 1);
    sf_kv_alloc_as(&pool, 1, 1, junk + 2);
    size_t bb = B->ops->kv_block_bytes(B, &kc), blk = (size_t)Hkv * bs * hd, rows = (size_t)Hkv * bs;
    float inv_freq[256];
    for (int j = 0; j < hd / 2; j++) inv_freq[j] = (float)pow(10000.0, -2.0 * j / hd);
    sf_rope rope = { .head_dim = hd, .rot_dim = hd, .interleaved = c->interleaved, .inv_freq = inv_freq,
                     .attn_scale = 1.0f / sqrtf((float)hd) };
    int32_t *bt = calloc((size_t)S * max_blocks, 4);
    int len[4] = { 0 }, nb[4] = { 0 }, ok = 1;
    double *Kx[4], *Vx[4], *Ks[4], *Vs[4]; /* exact rotated, and as stored, [pos][Hkv*hd] */
    for (int s = 0; s < S; s++) {
        Kx[s] = calloc((size_t)max_ctx * Hkv * hd, 8); Vx[s] = calloc((size_t)max_ctx * Hkv * hd, 8);
        Ks[s] = calloc((size_t)max_ctx * Hkv * hd, 8); Vs[s] = calloc((size_t)max_ctx * Hkv * hd, 8);
    }
    unsigned char *host = malloc(bb);
    for (int st = 0; st < c->n_steps && ok; st++) {
        int T = 0;
        for (int s = 0; s < S; s++) T += c->len[s][st];
        int32_t *tok = malloc(4 * (size_t)T), *pos = malloc(4 * (size_t)T), *slot = malloc(4 * (size_t)T), ss[5], ctx[4];
        int t = 0;
        for (int s = 0; s < S; s++) {
            ss[s] = t;
            int need = (len[s] + c->len[s][st] + bs - 1) / bs;
            if (need > nb[s] && sf_kv_alloc_as(&pool, c->i8[s], need - nb[s], bt + (size_t)s * max_blocks + nb[s])) {
                snprintf(r->why, sizeof r->why, "pool exhausted");
                ok = 0;
            }
            nb[s] = need > nb[s] ? need : nb[s];
            for (int i = 0; i < c->len[s][st]; i++, t++) {
                int p = len[s] + i;
                tok[t] = t;
                pos[t] = p;
                slot[t] = bt[(size_t)s * max_blocks + p / bs] * bs + p % bs;
            }
            ctx[s] = len[s] + c->len[s][st];
        }
        ss[S] = T;
        float *qkv = malloc(4 * (size_t)T * W), *gq = malloc(4 * (size_t)T * W), *go = malloc(4 * (size_t)T * H * hd);
        for (int64_t i = 0; i < (int64_t)T * W; i++) qkv[i] = sf_bf16_to_f32(sf_f32_to_bf16(normal()));
        sf_batch b = { .n_tokens = T, .n_seqs = S, .tokens = tok, .pos = pos, .slot = slot, .seq_start = ss,
                       .seq_ctx = ctx, .block_table = bt, .max_blocks = max_blocks, .logit_rows = tok, .n_logits = 0 };
        sf_weight_desc wd = { .n_parts = 1 };
        wd.part[0] = (sf_view){ qkv, SF_DT_F32, T, W };
        sf_weight *w = NULL;
        sf_buf *bq = NULL, *bo = NULL;
        int rc = B->ops->weight_new(B, &wd, &w, &err);
        if (!rc) rc = B->ops->buf_new(B, T, W, &bq, &err);
        if (!rc) rc = B->ops->buf_new(B, T, (int64_t)H * hd, &bo, &err);
        if (!rc) rc = B->ops->batch_begin(B, &b);
        if (!rc) rc = B->ops->embed(B, w, bq);
        if (!rc) rc = B->ops->rope_kv(B, bq, layer, H, Hkv, &rope);
        if (!rc) rc = B->ops->attention(B, bq, layer, H, Hkv, &rope, bo);
        if (!rc) rc = B->ops->read_f32(B, bq, T, gq);
        if (!rc) rc = B->ops->read_f32(B, bo, T, go);
        if (rc) {
            snprintf(r->why, sizeof r->why, "step %d: backend op failed (%d) %s", st, rc, err.msg);
            ok = 0;
        }
        /* the reference rows of this step's tokens: exact, and as stored */
        for (int s = 0; s < S && ok; s++)
            for (int i = 0; i < c->len[s][st]; i++) {
                int p = len[s] + i, ti = ss[s] + i;
                double *kx = Kx[s] + (size_t)p * Hkv * hd, *vx = Vx[s] + (size_t)p * Hkv * hd;
                for (int k = 0; k < Hkv * hd; k++) {
                    kx[k] = qkv[(size_t)ti * W + H * hd + k];
                    vx[k] = qkv[(size_t)ti * W + (H + Hkv) * hd + k];
                }
                for (int h = 0; h < Hkv; h++) kv8_rope(kx + h * hd, hd, c->interleaved, p, inv_freq);
                memcpy(Ks[s] + (size_t)p * Hkv * hd, kx, 8 * (size_t)Hkv * hd);
                memcpy(Vs[s] + (size_t)p * Hkv * hd, vx, 8 * (size_t)Hkv * hd);
                if (!c->i8[s]) continue;
                int32_t id = bt[(size_t)s * max_blocks + p / bs];
                if (B->ops->kv_copy_out(B, &id, 1, host)) {
                    snprintf(r->why, sizeof r->why, "kv_copy_out of INT8 block %d failed", id);
                    ok = 0;
                    break;
                }
                /* layer 1 of the host image: K int8, V int8, K scales, V scales */
                const unsigned char *L1 = host + 2 * blk + 2 * rows * 4;
                const int8_t *k8 = (const int8_t *)L1, *v8 = k8 + blk;
                const float *ksc = (const float *)(L1 + 2 * blk), *vsc = ksc + rows;
                for (int h = 0; h < Hkv; h++) {
                    size_t row = (size_t)h * bs + p % bs;
                    for (int kv = 0; kv < 2; kv++) {
                        const double *x = (kv ? vx : kx) + h * hd;
                        const int8_t *q = (kv ? v8 : k8) + row * hd;
                        double sc = (kv ? vsc : ksc)[row], amax = 0;
                        for (int d = 0; d < hd; d++) amax = fmax(amax, fabs(x[d]));
                        double e = amax > 0 ? fabs(sc - amax / 127) / (amax / 127) : fabs(sc);
                        r->worst_scale = fmax(r->worst_scale, e);
                        double *st_row = (kv ? Vs[s] : Ks[s]) + (size_t)p * Hkv * hd + h * hd;
                        for (int d = 0; d < hd; d++) {
                            double y = q[d] * sc, bound = sc / 2 + fabs(x[d]) * x_round + 1e-6 * amax + 1e-30;
                            r->worst_write = fmax(r->worst_write, fabs(x[d] - y) / bound);
                            st_row[d] = y;
                        }
                    }
                }
            }
        /* q and attention of every token of the step */
        double *qd = malloc(8 * (size_t)H * hd), *ref = malloc(8 * (size_t)H * hd), *ex = malloc(8 * (size_t)H * hd);
        for (int s = 0; s < S && ok; s++)
            for (int i = 0; i < c->len[s][st]; i++) {
                int p = len[s] + i, ti = ss[s] + i;
                for (int k = 0; k < H * hd; k++) qd[k] = qkv[(size_t)ti * W + k];
                for (int h = 0; h < H; h++) kv8_rope(qd + h * hd, hd, c->interleaved, p, inv_freq);
                kv8_attend(qd, Ks[s], Vs[s], p + 1, H, Hkv, hd, ref);
                r->worst_q = fmax(r->worst_q, kv8_rel(gq + (size_t)ti * W, qd, (int64_t)H * hd));
                r->worst_out = fmax(r->worst_out, kv8_rel(go + (size_t)ti * H * hd, ref, (int64_t)H * hd));
                if (c->i8[s]) {
                    kv8_attend(qd, Kx[s], Vx[s], p + 1, H, Hkv, hd, ex);
                    r->quant_effect = fmax(r->quant_effect, kv8_rel(go + (size_t)ti * H * hd, ex, (int64_t)H * hd));
                }
                r->tokens_checked++;
            }
        for (int s = 0; s < S; s++) len[s] += c->len[s][st];
        free(qd); free(ref); free(ex);
        if (bq) B->ops->buf_free(B, bq);
        if (bo) B->ops->buf_free(B, bo);
        if (w) B->ops->weight_free(B, w);
        free(qkv); free(gq); free(go); free(tok); free(pos); free(slot);
    }
    if (ok && !(r->worst_write <= 1.0 && r->worst_scale < 1e-2 + x_round * 2 && r->worst_q < tol && r->worst_out < tol))
        snprintf(r->why, sizeof r->why, "write %.3g of the bound, scale err %.3g, rope %.3g, attention %.3g (tol %.1g)",
                 r->worst_write, r->worst_scale, r->worst_q, r->worst_out, tol);
    /* everything back to the pool */
    for (int s = 0; s < S; s++) sf_kv_release(&pool, bt + (size_t)s * max_blocks, nb[s]);
    sf_kv_release(&pool, junk, 3);
    if (!r->why[0] && (pool.n_free != n_blocks || pool.n_free_units != 2 * n_blocks))
        snprintf(r->why, sizeof r->why, "pool leak: %d of %d blocks free", pool.n_free, n_blocks);
    sf_kv_pool_free(&pool);
    for (int s = 0; s < S; s++) { free(Kx[s]); free(Vx[s]); free(Ks[s]); free(Vs[s]); }
    free(bt);
    free(host);
    return r->why[0] == 0;
}

#endif
