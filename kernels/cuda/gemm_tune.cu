/* gemm_tune.cu — measured cuBLASLt algorithm choice and its per-GPU disk cache.
 *
 * cuBLASLt's heuristic picks one algorithm per shape from a model of the GPU; at the engine's
 * decode-batch shapes (n = 128..256 rows against 4096-28672 x 4096-14336 weights) its first
 * choice runs at a third to a half of the bound. For each (m, k, bias, accumulate, n bucket) the
 * tuner asks the heuristic for up to 32 candidates, adds split-K variants of the first few and
 * k-split batches (gemm_split.cu), and on scratch buffers of its own (so the caller's data is
 * never touched):
 *   1. runs each candidate once into a NaN-poisoned output (zeroed for the accumulating flavour)
 *      and compares it with the heuristic's first choice; a candidate that differs anywhere by
 *      more than 3% of (1 + |ref|), or leaves a NaN, is dropped;
 *   2. times each survivor over `reps` calls that rotate over copies of the weight which
 *      together exceed the L2 cache, so every call streams its weight from HBM as in a real
 *      step (a layer's weight is never in L2 when its GEMM starts);
 *   3. times the best three and the heuristic's first again, interleaved, and keeps the fastest.
 * Winners are kept per context and written to a JSON file per GPU beside hal's calibration
 * (keyed by GPU name, driver and cuBLASLt version; a cache made for anything else, unreadable,
 * or with a malformed entry is ignored with a warning, and each loaded algorithm is checked
 * against the shape with cublasLtMatmulAlgoCheck before use). Tuning time is bounded per context
 * (budget_s); shapes beyond it keep the heuristic's first choice.
 * Not thread-safe: driven by the context's one thread. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gemm_impl.cuh"

extern "C" {
#include "../../common/sf.h"
}

#define HEUR_REQ 32
#define MAX_CAND 48
/* 2: buckets up to 256 rows, optional "split". Version 3 (own-kernel fields "own", "own_us",
 * "lt_us", from builds with the own GEMM kernel as a tuner candidate) is read as not ours: its
 * shapes are tuned again and the file rewritten as version 2. */
#define CACHE_VERSION 2
#define MAX_SCRATCH ((size_t)3 << 30)
#define SF_MAX(a, b) ((a) > (b) ? (a) : (b))

tune_entry *sf_gemm_tune_find(sf_k_gemm_ctx *g, int m, int k, int has_bias, int acc, int nb)
{
    for (int i = 0; i < g->n_tunes; i++) {
        tune_entry *t = &g->tunes[i];
        if (t->m == m && t->k == k && t->has_bias == has_bias && t->acc == acc && t->nb == nb) return t;
    }
    return NULL;
}

void sf_gemm_tune_free(sf_k_gemm_ctx *g)
{
    free(g->tunes);
    g->tunes = NULL;
    g->n_tunes = 0;
}

/* ---- disk cache --------------------------------------------------------------------------- */
static void hex_algo(const cublasLtMatmulAlgo_t *a, char out[129])
{
    for (int i = 0; i < 8; i++) snprintf(out + 16 * i, 17, "%016llx", (unsigned long long)a->data[i]);
}

static int unhex_algo(const char *s, cublasLtMatmulAlgo_t *a)
{
    if (!s || strlen(s) != 128) return -1;
    for (int i = 0; i < 8; i++) {
        char part[17], *end;
        memcpy(part, s + 16 * i, 16);
        part[16] = 0;
        a->data[i] = strtoull(part, &end, 16);
        if (*end) return -1;
    }
    return 0;
}

static void cache_save(sf_k_gemm_ctx *g)
{
    if (!g->cache_path[0]) return;
    json_t *o = json_object(), *arr = json_array();
    json_object_set_new(o, "version", json_integer(CACHE_VERSION));
    json_object_set_new(o, "gpu", json_string(g->gpu));
    json_object_set_new(o, "driver", json_integer(g->driver));
    json_object_set_new(o, "cublaslt", json_integer((json_int_t)g->lt_version));
    for (int i = 0; i < g->n_tunes; i++) {
        const tune_entry *t = &g->tunes[i];
        if (!t->n_candidates) continue; /* failed: try again in the next process */
        char hex[129];
        hex_algo(&t->algo, hex);
        json_array_append_new(arr, json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:i}", "m", t->m, "k",
                                             t->k, "bias", t->has_bias, "acc", t->acc, "n", t->nb, "split", t->split,
                                             "algo", hex, "us", (double)t->us, "heuristic_us",
                                             (double)t->heuristic_us, "candidates", t->n_candidates));
    }
    json_object_set_new(o, "entries", arr);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", g->cache_path, (int)getpid());
    if (json_dump_file(o, tmp, JSON_INDENT(1)) != 0 || rename(tmp, g->cache_path) != 0) {
        SF_LOGW("gemm tuner: cannot write its cache %s (winners are kept for this process only; check that the "
                "folder is writable or set XDG_CACHE_HOME)", g->cache_path);
        unlink(tmp);
    }
    json_decref(o);
}

/* Reads the winners of an earlier process on this GPU; anything doubtful is skipped with a
 * warning (the shape is then tuned again). */
static void cache_load(sf_k_gemm_ctx *g)
{
    json_error_t je;
    if (access(g->cache_path, F_OK) != 0) return; /* first run on this GPU */
    json_t *o = json_load_file(g->cache_path, 0, &je);
    if (!o) {
        SF_LOGW("gemm tuner: cache %s unreadable (%s, line %d); ignored, shapes are tuned again and it is rewritten",
                g->cache_path, je.text, je.line);
        return;
    }
    json_t *ver = json_object_get(o, "version"), *gpu = json_object_get(o, "gpu"), *drv = json_object_get(o, "driver"),
           *ltv = json_object_get(o, "cublaslt"), *arr = json_object_get(o, "entries");
    int bad = 0;
    if (json_is_integer(ver) && json_integer_value(ver) != CACHE_VERSION) {
        SF_LOGW("gemm tuner: cache %s is format version %lld, this build reads version %d%s; ignored, shapes are "
                "tuned again and the file is rewritten", g->cache_path, (long long)json_integer_value(ver),
                CACHE_VERSION, json_integer_value(ver) == 3 ? " (version 3 came from builds with the own GEMM kernel)" : "");
        goto out;
    }
    if (!json_is_integer(ver) || !json_is_string(gpu) || !json_is_integer(drv) || !json_is_integer(ltv) ||
        !json_is_array(arr)) {
        SF_LOGW("gemm tuner: cache %s is not a version-%d tuning cache; ignored, shapes are tuned again",
                g->cache_path, CACHE_VERSION);
        goto out;
    }
    if (strcmp(json_string_value(gpu), g->gpu) || json_integer_value(drv) != g->driver ||
        (size_t)json_integer_value(ltv) != g->lt_version) {
        SF_LOGW("gemm tuner: cache %s was made for %s, driver %lld, cuBLASLt %lld (this is %s, driver %d, cuBLASLt "
                "%zu); ignored, shapes are tuned again", g->cache_path, json_string_value(gpu),
                (long long)json_integer_value(drv), (long long)json_integer_value(ltv), g->gpu, g->driver,
                g->lt_version);
        goto out;
    }
    for (size_t i = 0; i < json_array_size(arr) && g->n_tunes < MAX_TUNES; i++) {
        json_t *e = json_array_get(arr, i);
        json_int_t m = 0, k = 0, bias = 0, acc = 0, nb = 0, nc = 0, split = 0;
        const char *hex = NULL;
        double us = 0, hus = 0;
        tune_entry t;
        memset(&t, 0, sizeof t);
        if (json_unpack(e, "{s:I, s:I, s:I, s:I, s:I, s?I, s:s, s:F, s:F, s:I}", "m", &m, "k", &k, "bias", &bias,
                        "acc", &acc, "n", &nb, "split", &split, "algo", &hex, "us", &us, "heuristic_us", &hus,
                        "candidates", &nc) ||
            m <= 0 || k <= 0 || m > (1 << 24) || k > (1 << 24) || (bias | acc) & ~1 || sf_k_gemm_bucket((int)nb) != nb ||
            nc <= 0 || !(us > 0) || unhex_algo(hex, &t.algo) ||
            (split != 0 && (split < 0 || split > 64 || !sf_gemm_split_ok((int)k, (int)split) ||
                            (size_t)split * nb * m * 4 > SPLIT_WS_BYTES || sf_gemm_split_ws(g))) ||
            sf_gemm_tune_find(g, (int)m, (int)k, (int)bias, (int)acc, (int)nb)) {
            bad++;
            continue;
        }
        t.m = (int)m; t.k = (int)k; t.has_bias = (int)bias; t.acc = (int)acc; t.nb = (int)nb; t.split = (int)split;
        t.us = (float)us; t.heuristic_us = (float)hus; t.n_candidates = (int)nc; t.from_cache = 1;
        g->tunes[g->n_tunes++] = t;
    }
    if (bad)
        SF_LOGW("gemm tuner: %d malformed entr%s in %s skipped (those shapes are tuned again)", bad,
                bad == 1 ? "y" : "ies", g->cache_path);
    SF_LOGD("gemm tuner: %d shapes from %s", g->n_tunes, g->cache_path);
out:
    json_decref(o);
}

extern "C" int sf_k_gemm_tune_enable(sf_k_gemm_ctx *g, const char *cache_path, double budget_s)
{
    int dev = 0;
    struct cudaDeviceProp prop;
    cudaError_t e;
    if (!g->tunes && !(g->tunes = (tune_entry *)calloc(MAX_TUNES, sizeof *g->tunes)))
        return (int)cudaErrorMemoryAllocation;
    if ((e = cudaGetDevice(&dev)) != cudaSuccess || (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess ||
        (e = cudaDriverGetVersion(&g->driver)) != cudaSuccess)
        return (int)e;
    snprintf(g->gpu, sizeof g->gpu, "%s", prop.name);
    g->l2_bytes = (size_t)prop.l2CacheSize;
    g->lt_version = cublasLtGetVersion();
    g->budget_s = budget_s;
    g->tune_on = 1;
    snprintf(g->cache_path, sizeof g->cache_path, "%s", cache_path ? cache_path : "");
    if (g->cache_path[0]) cache_load(g);
    for (int i = 0; i < g->n_plans; i++) g->plans[i].settled = 0; /* decide again with the tuner */
    return 0;
}

extern "C" int sf_k_gemm_tune_info(sf_k_gemm_ctx *g, int n, int m, int k, int has_bias, int acc,
                                   sf_k_gemm_tune_stat *out)
{
    int nb = sf_k_gemm_bucket(n);
    const tune_entry *t = nb && g->tunes ? sf_gemm_tune_find(g, m, k, has_bias != 0, acc != 0, nb) : NULL;
    memset(out, 0, sizeof *out);
    if (!t) return 0;
    out->nb = t->nb;
    out->n_candidates = t->n_candidates;
    out->from_cache = t->from_cache;
    out->us = t->us;
    out->heuristic_us = t->heuristic_us;
    out->tune_ms = t->tune_ms;
    return 1;
}

extern "C" double sf_k_gemm_tune_spent(sf_k_gemm_ctx *g) { return g->spent_s; }

/* ---- measuring ---------------------------------------------------------------------------- */
/* Counts elements of a that differ from b by more than 3% of (1 + |b|) (NaN counts). The
 * scratch inputs are scaled so outputs are O(1): a bf16 rounding is 0.4%, a wrong tile O(1). */
static __global__ void k_count_bad(const bf16 *a, const bf16 *b, int64_t n, unsigned *bad)
{
    unsigned local = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = bf2f(a[i]), y = bf2f(b[i]);
        if (!(fabsf(x - y) <= 0.03f * (1.0f + fabsf(y)))) local++;
    }
    if (local) atomicAdd(bad, local);
}

typedef struct scratch {
    uint16_t *x, *w, *bias, *y, *yref;
    unsigned *bad;
    int copies;
    size_t w_elems, y_elems;
    cudaEvent_t e0, e1;
} scratch;

/* One call of a candidate: t is the tuning plan, or one of its split plans (t->split > 1). */
static int run_algo(sf_k_gemm_ctx *g, const plan *t, const cublasLtMatmulAlgo_t *a, const scratch *S, int copy,
                    cudaStream_t s)
{
    if (t->split > 1)
        return sf_gemm_split_run(g, t, a, S->x, S->w + (size_t)copy * S->w_elems, S->bias, S->y, t->m, s);
    const float one = 1.0f, beta = t->acc ? 1.0f : 0.0f;
    cublasStatus_t st = cublasLtMatmul(g->lt, t->op, &one, S->w + (size_t)copy * S->w_elems, t->a, S->x, t->b, &beta,
                                       S->y, t->c, S->y, t->c, a, g->workspace, LT_WORKSPACE, s);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : LT_ERR(st);
}

/* Runs a once into a poisoned (or, accumulating, zeroed) output and counts where it differs
 * from the reference; ref = 1 makes this run the reference (then only NaNs count). Returns
 * the count, UINT_MAX when cuBLASLt refused the algorithm, or sets *hard on a device error. */
static unsigned check_algo(sf_k_gemm_ctx *g, const plan *t, const cublasLtMatmulAlgo_t *a, const scratch *S, int ref,
                           cudaStream_t s, int *hard)
{
    unsigned bad = 0;
    cudaError_t e;
    cudaMemsetAsync(S->y, t->acc ? 0 : 0xff, S->y_elems * 2, s);
    if (run_algo(g, t, a, S, 0, s)) {
        cudaGetLastError();
        return ~0u;
    }
    if (ref) cudaMemcpyAsync(S->yref, S->y, S->y_elems * 2, cudaMemcpyDeviceToDevice, s);
    cudaMemsetAsync(S->bad, 0, sizeof(unsigned), s);
    k_count_bad<<<(unsigned)SF_MIN(sf_div_up((long)S->y_elems, 256), 4096u), 256, 0, s>>>(
        (const bf16 *)S->y, (const bf16 *)S->yref, (int64_t)S->y_elems, S->bad);
    cudaMemcpyAsync(&bad, S->bad, sizeof bad, cudaMemcpyDeviceToHost, s);
    if ((e = cudaStreamSynchronize(s)) != cudaSuccess) {
        *hard = (int)e;
        return ~0u;
    }
    return bad;
}

/* Mean µs of one call over `reps` calls that rotate over the weight copies (starting past
 * copy 0, which the check just left in L2). */
static float time_algo(sf_k_gemm_ctx *g, const plan *t, const cublasLtMatmulAlgo_t *a, const scratch *S, int reps,
                       cudaStream_t s, int *hard)
{
    float ms = 0;
    cudaError_t e;
    cudaEventRecord(S->e0, s);
    for (int r = 0; r < reps; r++)
        if (run_algo(g, t, a, S, (r + 1) % S->copies, s)) {
            cudaGetLastError();
            cudaStreamSynchronize(s);
            return INFINITY;
        }
    cudaEventRecord(S->e1, s);
    if ((e = cudaEventSynchronize(S->e1)) != cudaSuccess || (e = cudaEventElapsedTime(&ms, S->e0, S->e1)) != cudaSuccess) {
        *hard = (int)e;
        return INFINITY;
    }
    return 1e3f * ms / reps;
}

/* Split-K variants of a (2, 3, 4, 6 parts) where it supports them and has none yet. */
static void add_splitk(sf_k_gemm_ctx *g, const plan *t, const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgo_t *c, int *n)
{
    static const int32_t parts[] = { 2, 3, 4, 6 };
    int32_t support = 0, cur = 1;
    uint32_t mask = 0, scheme;
    size_t wr = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(a, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &support, sizeof support, &wr) ||
        !support ||
        cublasLtMatmulAlgoCapGetAttribute(a, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &mask, sizeof mask, &wr) ||
        cublasLtMatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &cur, sizeof cur, &wr) || cur > 1)
        return;
    /* fp32 partials reduced in a separate step where offered: one rounding, as without split */
    scheme = mask & CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE
             : mask & CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE ? CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE
             : mask & CUBLASLT_REDUCTION_SCHEME_INPLACE      ? CUBLASLT_REDUCTION_SCHEME_INPLACE
                                                             : 0;
    if (!scheme) return;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0] && *n < MAX_CAND; i++) {
        cublasLtMatmulAlgo_t v = *a;
        cublasLtMatmulHeuristicResult_t r;
        memset(&r, 0, sizeof r);
        if (cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts[i], sizeof parts[i]) ||
            cublasLtMatmulAlgoConfigSetAttribute(&v, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) ||
            cublasLtMatmulAlgoCheck(g->lt, t->op, t->a, t->b, t->c, t->c, &v, &r) != CUBLAS_STATUS_SUCCESS ||
            r.workspaceSize > LT_WORKSPACE)
            continue;
        int dup = 0;
        for (int j = 0; j < *n && !dup; j++) dup = !memcmp(&c[j], &v, sizeof v);
        if (!dup) c[(*n)++] = v;
    }
}

/* Candidates for t's shape: the heuristic's first (index 0, the reference), its other
 * results, and split-K variants of the first four. */
static int candidates(sf_k_gemm_ctx *g, const plan *t, cublasLtMatmulAlgo_t *c, int *n_split)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[HEUR_REQ];
    int found = 0, n = 0;
    size_t ws = LT_WORKSPACE;
    c[n++] = t->algo;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(g->lt, t->op, t->a, t->b, t->c, t->c, pref, HEUR_REQ, res, &found) ==
            CUBLAS_STATUS_SUCCESS) {
        for (int i = 0; i < found && n < MAX_CAND; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > LT_WORKSPACE) continue;
            int dup = 0;
            for (int j = 0; j < n && !dup; j++) dup = !memcmp(&c[j], &res[i].algo, sizeof res[i].algo);
            if (!dup) c[n++] = res[i].algo;
        }
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    int base = n;
    for (int i = 0; i < base && i < 4; i++) add_splitk(g, t, &c[i], c, &n);
    *n_split = n - base;
    return n;
}

static void scratch_free(scratch *S)
{
    cudaFree(S->x); cudaFree(S->w); cudaFree(S->bias); cudaFree(S->y); cudaFree(S->yref); cudaFree(S->bad);
    if (S->e0) cudaEventDestroy(S->e0);
    if (S->e1) cudaEventDestroy(S->e1);
}

/* Scratch for t: weight copies that together exceed 3x L2 unless one alone is 2x L2, inputs
 * scaled for O(1) outputs. Returns 0, or -1 (with a warning) when memory is short. */
static int scratch_new(sf_k_gemm_ctx *g, const plan *t, scratch *S, cudaStream_t s)
{
    size_t wb = (size_t)t->m * t->k * 2, xb = (size_t)t->n * t->k * 2, yb = (size_t)t->n * t->m * 2;
    size_t free_b = 0, total_b = 0;
    S->w_elems = (size_t)t->m * t->k;
    S->y_elems = (size_t)t->n * t->m;
    S->copies = wb >= 2 * g->l2_bytes ? 1 : (int)SF_MIN((3 * g->l2_bytes + wb - 1) / wb, (size_t)16);
    cudaMemGetInfo(&free_b, &total_b);
    while (S->copies > 1 && (size_t)S->copies * wb + xb + 2 * yb + ((size_t)256 << 20) > free_b) S->copies--;
    size_t need = (size_t)S->copies * wb + xb + 2 * yb;
    if (need > MAX_SCRATCH || need + ((size_t)256 << 20) > free_b) {
        SF_LOGW("gemm tuner: m=%d k=%d n=%d would need %.0f MiB of scratch (%.0f MiB free); not tuned, the "
                "heuristic's first choice stays", t->m, t->k, t->n, need / 1048576.0, free_b / 1048576.0);
        return -1;
    }
    if (cudaMalloc((void **)&S->w, (size_t)S->copies * wb) || cudaMalloc((void **)&S->x, xb) ||
        cudaMalloc((void **)&S->y, yb) || cudaMalloc((void **)&S->yref, yb) ||
        cudaMalloc((void **)&S->bad, sizeof(unsigned)) || (t->has_bias && cudaMalloc((void **)&S->bias, (size_t)t->m * 2)) ||
        cudaEventCreate(&S->e0) || cudaEventCreate(&S->e1)) {
        cudaGetLastError();
        SF_LOGW("gemm tuner: m=%d k=%d n=%d: cannot allocate %.0f MiB of scratch; not tuned", t->m, t->k, t->n,
                need / 1048576.0);
        return -1;
    }
    float ws = 3.0f / sqrtf((float)t->k); /* x in [-1, 1), W in [-ws, ws): outputs of std ~1 */
    for (int i = 0; i < S->copies; i++) sf_k_fill_random(S->w + (size_t)i * S->w_elems, (int64_t)S->w_elems, 101 + i, ws, s);
    sf_k_fill_random(S->x, (int64_t)t->n * t->k, 99, 1.0f, s);
    if (S->bias) sf_k_fill_random(S->bias, t->m, 98, 1.0f, s);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

int sf_gemm_tune_run(sf_k_gemm_ctx *g, const plan *p, cudaStream_t s)
{
    int nb = sf_k_gemm_bucket(p->n), hard = 0, n_c = 0, n_ok = 0, n_split = 0, reps = 3, winner = 0;
    if (!g->tune_on || !nb || g->n_tunes >= MAX_TUNES || sf_gemm_tune_find(g, p->m, p->k, p->has_bias, p->acc, nb))
        return 0;
    if (g->spent_s >= g->budget_s) {
        if (!g->budget_warned++)
            SF_LOGW("gemm tuner: budget of %.1f s spent; further shapes keep the heuristic's first choice "
                    "(SEMFLOW_CUDA_GEMM_TUNE_S raises it)", g->budget_s);
        return 0;
    }
    double t0 = sf_now_s();
    tune_entry e;
    memset(&e, 0, sizeof e);
    e.m = p->m; e.k = p->k; e.has_bias = p->has_bias; e.acc = p->acc; e.nb = nb;
    plan t;
    memset(&t, 0, sizeof t);
    t.n = nb; t.m = p->m; t.k = p->k; t.has_bias = p->has_bias; t.acc = p->acc; t.ldx = p->k; t.ldy = p->m;
    scratch S;
    memset(&S, 0, sizeof S);
    plan ts[3]; /* the split variants' descriptors */
    memset(ts, 0, sizeof ts);
    const plan *cp[MAX_CAND]; /* each candidate's plan: &t or one of ts */
    int n_plain = 0;
    cublasLtMatmulAlgo_t *c = (cublasLtMatmulAlgo_t *)calloc(MAX_CAND, sizeof *c);
    float *us = (float *)calloc(MAX_CAND, sizeof *us);
    if ((hard = (int)cudaStreamSynchronize(s))) goto done;
    if (!c || !us || sf_gemm_plan_lt(g, &t)) {
        SF_LOGW("gemm tuner: m=%d k=%d n=%d: no host memory or no cuBLASLt plan; not tuned", t.m, t.k, nb);
        goto done;
    }
    if (scratch_new(g, &t, &S, s)) goto done;
    if (t.has_bias &&
        cublasLtMatmulDescSetAttribute(t.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &S.bias, sizeof S.bias) != CUBLAS_STATUS_SUCCESS)
        goto done;
    n_c = candidates(g, &t, c, &n_split);
    for (int i = 0; i < n_c; i++) cp[i] = &t;
    n_plain = n_c;
    /* split along k into 2, 4, 8 slices where the slices stay aligned and the partials fit */
    for (int j = 0; j < 3 && n_c < MAX_CAND; j++) {
        static const int parts[3] = { 2, 4, 8 };
        ts[j].n = nb; ts[j].m = t.m; ts[j].k = t.k; ts[j].has_bias = t.has_bias; ts[j].acc = t.acc;
        ts[j].ldx = t.k; ts[j].ldy = t.m;
        if (!sf_gemm_split_ok(t.k, parts[j]) || (size_t)parts[j] * nb * t.m * 4 > SPLIT_WS_BYTES ||
            sf_gemm_split_ws(g) || sf_gemm_split_make(g, &ts[j], parts[j]))
            continue;
        cublasLtMatmulAlgo_t sa[4];
        int ns = sf_gemm_split_heuristic(g, &ts[j], sa, 4);
        for (int i = 0; i < ns && n_c < MAX_CAND; i++)
            if (sf_gemm_split_check(g, &ts[j], &sa[i])) {
                c[n_c] = sa[i];
                cp[n_c++] = &ts[j];
            }
    }
    for (int i = 0; i < n_c; i++) us[i] = INFINITY; /* untimed (refused, wrong, over budget) */
    /* reference: the heuristic's first; its time sets the repetitions (about 1 ms of calls each,
     * 2 ms for the final comparison) */
    if (check_algo(g, cp[0], &c[0], &S, 1, s, &hard) != 0) {
        if (!hard) SF_LOGW("gemm tuner: m=%d k=%d n=%d: the heuristic's first algorithm failed or left NaNs; not tuned", t.m, t.k, nb);
        goto done;
    }
    us[0] = time_algo(g, cp[0], &c[0], &S, 3, s, &hard);
    if (hard || !(us[0] < INFINITY)) goto done;
    reps = (int)SF_MIN(SF_MAX(1000.0f / us[0], 2.0f), 10.0f);
    us[0] = time_algo(g, cp[0], &c[0], &S, reps, s, &hard);
    n_ok = 1;
    for (int i = 1; i < n_c && !hard; i++) {
        if (g->spent_s + (sf_now_s() - t0) > g->budget_s) break;
        unsigned bad = check_algo(g, cp[i], &c[i], &S, 0, s, &hard);
        if (bad) {
            if (bad != ~0u) SF_LOGD("gemm tuner: m=%d k=%d n=%d: candidate %d differs in %u outputs; dropped", t.m, t.k, nb, i, bad);
            continue;
        }
        us[i] = time_algo(g, cp[i], &c[i], &S, reps, s, &hard);
        n_ok += us[i] < INFINITY;
    }
    if (hard) goto done;
    {
        /* the best three and the reference again, interleaved twice with twice the calls; each
         * keeps the better of its two means */
        int top[4] = { 0, -1, -1, -1 }, nt = 1;
        for (int r = 0; r < 3; r++) {
            int b = -1;
            for (int i = 1; i < n_c; i++) {
                int taken = 0;
                for (int j = 1; j < nt; j++) taken |= top[j] == i;
                if (!taken && us[i] < INFINITY && (b < 0 || us[i] < us[b])) b = i;
            }
            if (b >= 0) top[nt++] = b;
        }
        float fin[4] = { INFINITY, INFINITY, INFINITY, INFINITY };
        for (int round = 0; round < 2 && !hard; round++)
            for (int j = 0; j < nt && !hard; j++) {
                float u = time_algo(g, cp[top[j]], &c[top[j]], &S, 2 * reps, s, &hard);
                if (u < fin[j]) fin[j] = u;
            }
        if (hard) goto done;
        int best = 0; /* the heuristic's first unless another is more than 3% faster (noise) */
        for (int j = 1; j < nt; j++)
            if (fin[j] < 0.97f * fin[0] && fin[j] < fin[best]) best = j;
        winner = top[best];
        e.algo = c[winner];
        e.split = cp[winner]->split;
        e.us = fin[best];
        e.heuristic_us = fin[0];
        e.n_candidates = n_ok;
    }
done:
    if (hard) SF_LOGE("gemm tuner: m=%d k=%d n=%d: device error: %s", p->m, p->k, nb, cudaGetErrorString((cudaError_t)hard));
    scratch_free(&S);
    sf_gemm_plan_release(&t);
    for (int j = 0; j < 3; j++) sf_gemm_plan_release(&ts[j]);
    free(c);
    free(us);
    cudaGetLastError();
    e.tune_ms = (float)((sf_now_s() - t0) * 1e3);
    g->spent_s += e.tune_ms * 1e-3;
    g->tunes[g->n_tunes++] = e; /* a failed shape too (n_candidates = 0): not tried again here */
    if (e.n_candidates) {
        SF_LOGI("gemm tuner: m=%d k=%d n<=%d%s%s: %.1f us (heuristic's first %.1f us, %.2fx; candidate %d%s), %d of "
                "%d candidates (%d split-K variants, %d split batches) in %.0f ms (%.1f s of %.0f s budget spent)", e.m, e.k, nb,
                e.has_bias ? " +bias" : "", e.acc ? " accumulate" : "", e.us, e.heuristic_us, e.heuristic_us / e.us,
                winner, e.split > 1 ? ", split batch" : winner >= n_plain - n_split ? ", split-K variant" : "", n_ok, n_c,
                n_split, n_c - n_plain, e.tune_ms, g->spent_s, g->budget_s);
        if (e.split > 1) SF_LOGI("gemm tuner: m=%d k=%d n<=%d: k split into %d slices", e.m, e.k, nb, e.split);
        cache_save(g);
    }
    return hard;
}
