/* test_decode_persist.c — the persistent batch-1 decoder layer (decode_persist.cu) against a
 * float64 host reference of the same layer and against the fused kernel sequence it replaces
 * (gemv_norm_rope, attention, gemv_add, gemv_norm glu, gemv_add), for the Llama-3-8B and
 * Qwen2-7B layer shapes (Qwen2: QKV bias, 7 heads per kv head) and a head_dim-64 shape, at
 * 1, 77, 512 and 4096 keys (one warp, a few and many key splits). Fresh random weights, cache
 * and residual every run (the seed is printed); the scratch buffers (qkv, att, act) are poisoned
 * with NaN before each launch, so NaN never passes. Checked: the update of h (h_out - h_in) and
 * the attention output by ||got - ref|| / ||ref||, the k and v rows written to the cache, that
 * a second launch (the barriers and split counters must have reset themselves) gives
 * bit-identical results, and two layers in one launch at 512 keys. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/sf.h"
#include "../test.h"

#ifdef SF_HAVE_CUDA
#include <cuda_runtime.h>

#include "../../kernels/cuda/kernels.h"

static cudaStream_t S;
static uint64_t seed;

static double bf(uint16_t v) { return (double)sf_bf16_to_f32(v); }
static double rbf(double v) { return (double)sf_bf16_to_f32(sf_f32_to_bf16((float)v)); }

static uint16_t *dev_rand(int64_t n, float scale, uint16_t **host)
{
    uint16_t *d = NULL;
    if (cudaMalloc((void **)&d, (size_t)n * 2)) return NULL;
    if (sf_k_fill_random(d, n, seed++, scale, S) || cudaStreamSynchronize(S)) { cudaFree(d); return NULL; }
    *host = malloc((size_t)n * 2);
    if (!*host || cudaMemcpy(*host, d, (size_t)n * 2, cudaMemcpyDeviceToHost)) { cudaFree(d); return NULL; }
    return d;
}

static double rel(const double *got, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) return INFINITY;
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static void host_norm(const uint16_t *x, const uint16_t *nw, int k, float eps, double *xn)
{
    double ss = 0;
    for (int i = 0; i < k; i++) ss += bf(x[i]) * bf(x[i]);
    float inv = 1.0f / sqrtf((float)(ss / k) + eps);
    for (int i = 0; i < k; i++) xn[i] = rbf(rbf((float)bf(x[i]) * inv) * bf(nw[i]));
}

static double dotw(const uint16_t *w, const double *x, int k)
{
    double a = 0;
    for (int i = 0; i < k; i++) a += bf(w[i]) * x[i];
    return a;
}

typedef struct shape { const char *name; int d, H, Hkv, hd, ffn, bias; } shape;

/* Host copies of one layer and its inputs. */
typedef struct layer_h { uint16_t *an, *wqkv, *bqkv, *wo, *fn, *wgu, *wd, *h, *kc, *vc; } layer_h;

/* The reference layer at position pos (keys 0..pos, the token's own k/v at slot): h_out - h
 * into dh [d], attention into att [H hd], the token's k, v (after RoPE) into kv [2 Hkv hd]. */
static void host_layer(const shape *sh, const layer_h *L, const int32_t *bt, int bs, int pos, const float *inv_freq,
                       double *dh, double *att, double *kvrow)
{
    const int d = sh->d, H = sh->H, Hkv = sh->Hkv, hd = sh->hd, ffn = sh->ffn, G = H / Hkv;
    const int rows = (H + 2 * Hkv) * hd;
    double *xn = malloc(sizeof(double) * (size_t)(ffn > d ? ffn : d)), *qkv = malloc(sizeof(double) * rows);
    double *h1 = malloc(sizeof(double) * d), *act = malloc(sizeof(double) * ffn), *s = malloc(sizeof(double) * (pos + 1));
    host_norm(L->h, L->an, d, 1e-5f, xn);
    for (int r = 0; r < rows; r++) qkv[r] = rbf(dotw(L->wqkv + (size_t)r * d, xn, d) + (L->bqkv ? bf(L->bqkv[r]) : 0));
    for (int hh = 0; hh < H + Hkv; hh++) /* RoPE, halves */
        for (int i = 0; i < hd / 2; i++) {
            double a = qkv[hh * hd + i], b = qkv[hh * hd + i + hd / 2], sn, cs;
            float ang = (float)pos * inv_freq[i];
            sn = sinf(ang);
            cs = cosf(ang);
            qkv[hh * hd + i] = rbf(a * cs - b * sn);
            qkv[hh * hd + i + hd / 2] = rbf(b * cs + a * sn);
        }
    for (int i = 0; i < 2 * Hkv * hd; i++) kvrow[i] = qkv[H * hd + i];
    for (int hq = 0; hq < H; hq++) {
        int kvh = hq / G;
        double mx = -INFINITY, sum = 0;
        for (int p = 0; p <= pos; p++) {
            const double *kp = NULL;
            double acc = 0;
            size_t off = ((size_t)bt[p / bs] * Hkv + kvh) * bs * hd + (size_t)(p % bs) * hd;
            if (p == pos) kp = kvrow + kvh * hd;
            for (int e = 0; e < hd; e++) acc += qkv[hq * hd + e] * (kp ? kp[e] : bf(L->kc[off + e]));
            s[p] = acc / sqrt((double)hd);
            if (s[p] > mx) mx = s[p];
        }
        for (int p = 0; p <= pos; p++) { s[p] = exp(s[p] - mx); sum += s[p]; }
        for (int e = 0; e < hd; e++) {
            double o = 0;
            for (int p = 0; p <= pos; p++) {
                size_t off = ((size_t)bt[p / bs] * Hkv + kvh) * bs * hd + (size_t)(p % bs) * hd;
                o += s[p] * (p == pos ? kvrow[(Hkv + kvh) * hd + e] : bf(L->vc[off + e]));
            }
            att[hq * hd + e] = rbf(o / sum);
        }
    }
    for (int r = 0; r < d; r++) h1[r] = rbf(bf(L->h[r]) + rbf(dotw(L->wo + (size_t)r * H * hd, att, H * hd)));
    uint16_t *h1b = calloc((size_t)d, 2);
    for (int r = 0; r < d; r++) h1b[r] = sf_f32_to_bf16((float)h1[r]);
    host_norm(h1b, L->fn, d, 1e-5f, xn);
    for (int j = 0; j < ffn; j++) {
        double g = rbf(dotw(L->wgu + (size_t)j * d, xn, d)), u = rbf(dotw(L->wgu + (size_t)(j + ffn) * d, xn, d));
        act[j] = rbf(rbf(g / (1 + exp(-g))) * u);
    }
    for (int r = 0; r < d; r++) dh[r] = rbf(h1[r] + rbf(dotw(L->wd + (size_t)r * ffn, act, ffn))) - bf(L->h[r]);
    free(xn); free(qkv); free(h1); free(act); free(s); free(h1b);
}

static void read_bf(const uint16_t *d, int64_t n, double *out)
{
    uint16_t *h = malloc((size_t)n * 2);
    cudaMemcpy(h, d, (size_t)n * 2, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; i++) out[i] = bf(h[i]);
    free(h);
}

static void check_shape(const shape *sh)
{
    const int d = sh->d, H = sh->H, Hkv = sh->Hkv, hd = sh->hd, ffn = sh->ffn, bs = 16, max_ctx = 4096;
    const int rows = (H + 2 * Hkv) * hd, nb = max_ctx / bs + 5;
    const int ctxs[] = { 1, 77, 512, 4096 };
    const size_t kv_elems = (size_t)nb * Hkv * bs * hd;
    layer_h L = { 0 };
    uint16_t *an = dev_rand(d, 1.0f, &L.an), *wqkv = dev_rand((int64_t)rows * d, 0.05f, &L.wqkv);
    uint16_t *bq = sh->bias ? dev_rand(rows, 0.5f, &L.bqkv) : NULL, *wo = dev_rand((int64_t)d * H * hd, 0.02f, &L.wo);
    uint16_t *fn = dev_rand(d, 1.0f, &L.fn), *wgu = dev_rand((int64_t)2 * ffn * d, 0.03f, &L.wgu);
    uint16_t *wd = dev_rand((int64_t)d * ffn, 0.02f, &L.wd), *h0 = dev_rand(d, 1.0f, &L.h);
    uint16_t *kc = dev_rand((int64_t)kv_elems, 1.0f, &L.kc), *vc = dev_rand((int64_t)kv_elems, 1.0f, &L.vc);
    uint16_t *h = NULL, *qkv = NULL, *att = NULL, *act = NULL;
    int32_t *meta = NULL, *bt_h = malloc(sizeof(int32_t) * nb);
    sf_k_layer1_w *tab = NULL;
    float *ws = NULL, *ifq = NULL, inv_freq[64];
    unsigned *sync = NULL;
    double *dh_ref = malloc(sizeof(double) * d), *att_ref = malloc(sizeof(double) * H * hd),
           *kv_ref = malloc(sizeof(double) * 2 * Hkv * hd), *got = malloc(sizeof(double) * (size_t)(d + H * hd)),
           *h0d = malloc(sizeof(double) * d);
    REQUIRE(an && wqkv && (bq || !sh->bias) && wo && fn && wgu && wd && h0 && kc && vc, "%s: device allocation", sh->name);
    REQUIRE(!cudaMalloc((void **)&h, 2 * (size_t)d) && !cudaMalloc((void **)&qkv, 2 * (size_t)rows) &&
                !cudaMalloc((void **)&att, 2 * (size_t)H * hd) && !cudaMalloc((void **)&act, 2 * (size_t)ffn) &&
                !cudaMalloc((void **)&meta, sizeof(int32_t) * (nb + 2)) &&
                !cudaMalloc((void **)&ws, sizeof(float) * sf_k_decode_persist_ws_floats(H, hd)) &&
                !cudaMalloc((void **)&ifq, sizeof inv_freq) &&
                !cudaMalloc((void **)&sync, sf_k_decode_persist_sync_bytes()) &&
                !cudaMalloc((void **)&tab, 2 * sizeof(sf_k_layer1_w)),
            "%s: device allocation", sh->name);
    cudaMemset(sync, 0, sf_k_decode_persist_sync_bytes());
    for (int i = 0; i < hd / 2; i++) inv_freq[i] = powf(500000.0f, -2.0f * i / hd);
    cudaMemcpy(ifq, inv_freq, sizeof(float) * hd / 2, cudaMemcpyHostToDevice);
    for (int i = 0; i < nb - 5; i++) bt_h[i] = (i * 7 + 3) % nb; /* scattered */
    for (int i = 0; i < d; i++) h0d[i] = bf(L.h[i]);
    uint16_t *kv_save = NULL;
    REQUIRE(!cudaMalloc((void **)&kv_save, 2 * sizeof(uint16_t) * kv_elems), "%s: device allocation", sh->name);
    cudaMemcpy(kv_save, kc, 2 * kv_elems, cudaMemcpyDeviceToDevice);
    cudaMemcpy(kv_save + kv_elems, vc, 2 * kv_elems, cudaMemcpyDeviceToDevice);

    for (size_t ci = 0; ci < SF_ARRAY_LEN(ctxs); ci++) {
        const int pos = ctxs[ci] - 1, slot = bt_h[pos / bs] * bs + pos % bs;
        int32_t m[2] = { pos, slot };
        cudaMemcpy(meta, m, sizeof m, cudaMemcpyHostToDevice);
        cudaMemcpy(meta + 2, bt_h, sizeof(int32_t) * (nb - 5), cudaMemcpyHostToDevice);
        host_layer(sh, &L, bt_h, bs, pos, inv_freq, dh_ref, att_ref, kv_ref);
        sf_k_kv kv = { .k = kc, .v = vc, .block_size = bs, .n_kv_heads = Hkv, .head_dim = hd };
        sf_k_layer1_w ent = { an, wqkv, bq, wo, fn, wgu, wd, kc, vc }, two[2] = { ent, ent };
        cudaMemcpy(tab, two, sizeof two, cudaMemcpyHostToDevice);
        sf_k_layer1 p = { .lw = tab, .n_layers = 1, .h = h, .qkv = qkv, .att = att, .act = act, .pos = meta,
                          .slot = meta + 1, .block_table = meta + 2, .inv_freq = ifq, .block_size = bs, .d = d, .H = H,
                          .Hkv = Hkv, .hd = hd,
                          .rot = hd, .interleaved = 0, .ffn = ffn, .eps = 1e-5f, .scale = 1.0f / sqrtf((float)hd),
                          .ws = ws, .sync = sync };
        REQUIRE(sf_k_decode_persist_ok(&p), "%s: the persistent kernel declines the shape", sh->name);
        double first[2] = { 0, 0 };
        uint16_t *h_first = malloc(2 * (size_t)d);
        for (int rep = 0; rep < 2; rep++) {
            cudaMemcpy(h, h0, 2 * (size_t)d, cudaMemcpyDeviceToDevice);
            cudaMemset(qkv, 0xff, 2 * (size_t)rows); /* bf16 NaN */
            cudaMemset(att, 0xff, 2 * (size_t)H * hd);
            cudaMemset(act, 0xff, 2 * (size_t)ffn);
            int rc = sf_k_decode_persist(&p, S);
            cudaError_t e = cudaStreamSynchronize(S);
            REQUIRE(!rc && e == cudaSuccess, "%s ctx %d: launch %d: %s", sh->name, ctxs[ci], rc,
                    cudaGetErrorString(rc ? (cudaError_t)rc : e));
            read_bf(h, d, got);
            for (int i = 0; i < d; i++) got[i] -= h0d[i];
            double e_h = rel(got, dh_ref, d);
            read_bf(att, H * hd, got);
            double e_a = rel(got, att_ref, H * hd);
            /* the token's k and v rows in the cache */
            double kvg[2 * 8 * 128], e_kv;
            for (int t = 0; t < 2 * Hkv; t++) {
                const uint16_t *base = t < Hkv ? kc : vc;
                int kvh = t % Hkv;
                read_bf(base + ((size_t)(slot / bs) * Hkv + kvh) * bs * hd + (size_t)(slot % bs) * hd, hd, kvg + t * hd);
            }
            e_kv = rel(kvg, kv_ref, 2 * Hkv * hd);
            if (rep == 0) {
                printf("  %-10s ctx %4d: rel err h update %.2e, attention %.2e, k/v rows %.2e\n", sh->name, ctxs[ci],
                       e_h, e_a, e_kv);
                CHECK_MSG(e_h < 2e-2 && e_a < 1e-2 && e_kv < 1e-2,
                          "%s ctx %d: against the host reference: h %.3g, attention %.3g, k/v %.3g", sh->name,
                          ctxs[ci], e_h, e_a, e_kv);
                first[0] = e_h;
                first[1] = e_a;
                cudaMemcpy(h_first, h, 2 * (size_t)d, cudaMemcpyDeviceToHost);
            } else {
                uint16_t *h2 = malloc(2 * (size_t)d);
                cudaMemcpy(h2, h, 2 * (size_t)d, cudaMemcpyDeviceToHost);
                CHECK_MSG(!memcmp(h2, h_first, 2 * (size_t)d) && e_h == first[0] && e_a == first[1],
                          "%s ctx %d: a second launch differs (barrier or split counters not reset)", sh->name,
                          ctxs[ci]);
                free(h2);
            }
        }
        /* the fused kernel sequence the persistent layer replaces, from the same inputs */
        cudaMemcpy(kc, kv_save, 2 * kv_elems, cudaMemcpyDeviceToDevice);
        cudaMemcpy(vc, kv_save + kv_elems, 2 * kv_elems, cudaMemcpyDeviceToDevice);
        cudaMemcpy(h, h0, 2 * (size_t)d, cudaMemcpyDeviceToDevice);
        sf_k_attn a = { .q = qkv, .ld_q = rows, .out = att, .ld_out = H * hd, .T = 1, .H = H, .Hkv = Hkv, .hd = hd,
                        .scale = p.scale, .pos = meta, .tok_seq = NULL, .block_table = meta + 2, .max_blocks = nb - 5,
                        .kv = kv, .n_split = 1 };
        int32_t *zero = NULL;
        cudaMalloc((void **)&zero, sizeof(int32_t));
        cudaMemset(zero, 0, sizeof(int32_t));
        a.tok_seq = zero;
        int rc = sf_k_gemv_norm_rope(h, an, 1e-5f, wqkv, bq, d, H, Hkv, hd, hd, 0, meta, meta + 1, ifq, kv, qkv, S);
        if (!rc) rc = sf_k_attention(&a, S);
        if (!rc) rc = sf_k_gemv_add(att, wo, NULL, d, H * hd, h, S);
        if (!rc) rc = sf_k_gemv_norm(h, fn, 1e-5f, wgu, NULL, 2 * ffn, d, 1, act, S);
        if (!rc) rc = sf_k_gemv_add(act, wd, NULL, d, ffn, h, S);
        cudaError_t e = cudaStreamSynchronize(S);
        cudaFree(zero);
        CHECK_MSG(!rc && e == cudaSuccess, "%s ctx %d: fused sequence: %d", sh->name, ctxs[ci], rc);
        if (!rc && e == cudaSuccess) {
            double *fused = malloc(sizeof(double) * d), *pers = malloc(sizeof(double) * d);
            read_bf(h, d, fused);
            for (int i = 0; i < d; i++) { fused[i] -= h0d[i]; pers[i] = bf(h_first[i]) - h0d[i]; }
            double e_f = rel(pers, fused, d);
            CHECK_MSG(e_f < 2e-2, "%s ctx %d: persistent against the fused sequence: rel err %.3g", sh->name,
                      ctxs[ci], e_f);
            free(fused);
            free(pers);
        }
        free(h_first);
        cudaMemcpy(kc, kv_save, 2 * kv_elems, cudaMemcpyDeviceToDevice);
        cudaMemcpy(vc, kv_save + kv_elems, 2 * kv_elems, cudaMemcpyDeviceToDevice);
        if (ctxs[ci] != 512) continue;
        /* two layers in one launch (the same weights and cache twice): the stream runs from the
         * first layer's down projection into the second's QKV across a barrier */
        double *dh2 = malloc(sizeof(double) * d), *tot = malloc(sizeof(double) * d);
        uint16_t *h1b = malloc(2 * (size_t)d), *keep = L.h;
        for (int i = 0; i < d; i++) h1b[i] = sf_f32_to_bf16((float)(h0d[i] + dh_ref[i]));
        L.h = h1b;
        host_layer(sh, &L, bt_h, bs, pos, inv_freq, dh2, att_ref, kv_ref);
        L.h = keep;
        for (int i = 0; i < d; i++) tot[i] = bf(h1b[i]) + dh2[i] - h0d[i];
        p.n_layers = 2;
        cudaMemcpy(h, h0, 2 * (size_t)d, cudaMemcpyDeviceToDevice);
        cudaMemset(qkv, 0xff, 2 * (size_t)rows);
        cudaMemset(att, 0xff, 2 * (size_t)H * hd);
        cudaMemset(act, 0xff, 2 * (size_t)ffn);
        rc = sf_k_decode_persist(&p, S);
        e = cudaStreamSynchronize(S);
        CHECK_MSG(!rc && e == cudaSuccess, "%s: two layers: launch %d", sh->name, rc);
        read_bf(h, d, got);
        for (int i = 0; i < d; i++) got[i] -= h0d[i];
        double e2 = rel(got, tot, d);
        printf("  %-10s ctx %4d, two layers in one launch: rel err h update %.2e\n", sh->name, ctxs[ci], e2);
        CHECK_MSG(e2 < 2e-2, "%s: two layers in one launch against the host reference: %.3g", sh->name, e2);
        free(dh2); free(tot); free(h1b);
        cudaMemcpy(kc, kv_save, 2 * kv_elems, cudaMemcpyDeviceToDevice);
        cudaMemcpy(vc, kv_save + kv_elems, 2 * kv_elems, cudaMemcpyDeviceToDevice);
    }
    cudaFree(kv_save);
    uint16_t *devs[] = { an, wqkv, bq, wo, fn, wgu, wd, h0, kc, vc, h, qkv, att, act };
    for (size_t i = 0; i < SF_ARRAY_LEN(devs); i++) cudaFree(devs[i]);
    cudaFree(meta); cudaFree(ws); cudaFree(ifq); cudaFree(sync); cudaFree(tab);
    uint16_t *hs[] = { L.an, L.wqkv, L.bqkv, L.wo, L.fn, L.wgu, L.wd, L.h, L.kc, L.vc };
    for (size_t i = 0; i < SF_ARRAY_LEN(hs); i++) free(hs[i]);
    free(bt_h); free(dh_ref); free(att_ref); free(kv_ref); free(got); free(h0d);
}

TEST(persist_llama3_8b) { shape s = { "llama3-8b", 4096, 32, 8, 128, 14336, 0 }; check_shape(&s); }
TEST(persist_qwen2_7b) { shape s = { "qwen2-7b", 3584, 28, 4, 128, 18944, 1 }; check_shape(&s); }
TEST(persist_hd64) { shape s = { "hd64", 2048, 32, 4, 64, 5632, 0 }; check_shape(&s); }

/* Shapes it must decline rather than run wrongly. */
TEST(persist_declines)
{
    sf_k_layer1 p;
    memset(&p, 0, sizeof p);
    CHECK(!sf_k_decode_persist_ok(&p));
    p.d = 4096; p.H = 32; p.Hkv = 8; p.hd = 96; p.ffn = 14336; p.rot = 96; p.n_layers = 1;
    CHECK(!sf_k_decode_persist_ok(&p)); /* head_dim 96, no buffers */
    CHECK(sf_k_decode_persist(&p, S) == (int)cudaErrorInvalidValue);
}

int main(void)
{
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("test_decode_persist: no CUDA device (cudaGetDeviceCount found none): run it on the GPU host\n");
        return 77;
    }
    if (cudaStreamCreate(&S)) { printf("FAIL: stream: cudaStreamCreate failed\n"); return 1; }
    seed = (uint64_t)sf_now_ns();
    printf("seed %llu\n", (unsigned long long)seed);
    RUN(persist_llama3_8b);
    RUN(persist_qwen2_7b);
    RUN(persist_hd64);
    RUN(persist_declines);
    cudaStreamDestroy(S);
    return test_summary();
}
#else
int main(void)
{
    printf("test_decode_persist: built without CUDA: nothing to check\n");
    return 77;
}
#endif
