/* gemm.cu — GEMMs through cuBLASLt and the per-shape dispatcher between cuBLASLt and the
 * skinny GEMV kernel (gemv.cu).
 *
 * Row-major y[n, m] = x[n, k] . W[m, k]^T is, in cuBLAS's column-major terms,
 * Y (m x n, ld ldy) = op_T(W as k x m, ld k) . X (k x n, ld ldx): one cuBLASLt matmul with
 * bf16 inputs and output, fp32 accumulation, and the bias added in the epilogue.
 * A plan (layouts, descriptor, heuristic algorithm) is made once per shape and cached. A
 * server's steps come in many token counts, so the cache is bounded and evicts the plan used
 * least recently when full: a step never fails for want of a slot, it pays one heuristic query.
 * Not thread-safe: one context per backend, driven by the backend's thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_impl.cuh"

extern "C" {
#include "../../common/sf.h"
}

static unsigned plan_hash(int n, int m, int k, int has_bias, int acc, int64_t ldx, int64_t ldy)
{
    uint64_t h = 1469598103934665603ull;
    const int64_t v[7] = { n, m, k, has_bias, acc, ldx, ldy };
    for (int i = 0; i < 7; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
    return (unsigned)(h ^ (h >> 29)) % PLAN_BUCKETS;
}

/* Token counts are tuned in buckets (each timed at its upper end): a server's steps come in
 * every count, the best algorithm changes slowly with n. Up to 8 rows the GEMV/cuBLASLt choice
 * below applies. Above 256 rows the heuristic's first choice measured as fast as the best of
 * every candidate on the H200 (the second device run: 1.00x at every bucket from 384 to 4096
 * for the Llama-3-8B shapes), so those are not tuned: no first-use stall for nothing. */
static const int tune_buckets[] = { 16, 24, 32, 48, 64, 96, 128, 192, 256 };

extern "C" int sf_k_gemm_bucket(int n)
{
    if (n <= 8) return 0;
    for (size_t i = 0; i < sizeof tune_buckets / sizeof tune_buckets[0]; i++)
        if (n <= tune_buckets[i]) return tune_buckets[i];
    return 0;
}

extern "C" const char *sf_k_gemm_error_str(int code)
{
    if (code >= 10000) return cublasLtGetStatusString((cublasStatus_t)(code - 10000));
    return cudaGetErrorString((cudaError_t)code);
}

extern "C" int sf_k_gemm_ctx_new(sf_k_gemm_ctx **out, int *n_mallocs)
{
    sf_k_gemm_ctx *g = (sf_k_gemm_ctx *)calloc(1, sizeof *g);
    if (!g) return (int)cudaErrorMemoryAllocation;
    cublasStatus_t st = cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) { free(g); return LT_ERR(st); }
    cudaError_t e = cudaMalloc(&g->workspace, LT_WORKSPACE);
    if (n_mallocs) (*n_mallocs)++;
    if (e != cudaSuccess) { cublasLtDestroy(g->lt); free(g); return (int)e; }
    for (int i = 0; i < PLAN_BUCKETS; i++) g->bucket[i] = -1;
    g->n_mallocs = n_mallocs;
    *out = g;
    return 0;
}

void sf_gemm_plan_release(plan *p)
{
    sf_gemm_descs_release(&p->op, &p->a, &p->b, &p->c);
    sf_gemm_split_release(p);
}

extern "C" void sf_k_gemm_ctx_free(sf_k_gemm_ctx *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) sf_gemm_plan_release(&g->plans[i]);
    sf_gemm_tune_free(g);
    cudaFree(g->split_ws);
    cudaFree(g->workspace);
    cublasLtDestroy(g->lt);
    free(g);
}

static plan *find_plan(sf_k_gemm_ctx *g, int n, int m, int k, int has_bias, int acc, int64_t ldx, int64_t ldy)
{
    for (int i = g->bucket[plan_hash(n, m, k, has_bias, acc, ldx, ldy)]; i >= 0; i = g->plans[i].next) {
        plan *p = &g->plans[i];
        if (p->n == n && p->m == m && p->k == k && p->has_bias == has_bias && p->acc == acc && p->ldx == ldx &&
            p->ldy == ldy) {
            p->used = ++g->clock;
            return p;
        }
    }
    return NULL;
}

/* Takes plan i out of its hash chain (before its slot is reused). */
static void plan_unlink(sf_k_gemm_ctx *g, int i)
{
    const plan *p = &g->plans[i];
    int *link = &g->bucket[plan_hash(p->n, p->m, p->k, p->has_bias, p->acc, p->ldx, p->ldy)];
    while (*link >= 0 && *link != i) link = &g->plans[*link].next;
    if (*link == i) *link = p->next;
}

/* Makes the cuBLASLt part of a plan: descriptors and the heuristic's first algorithm. */
int sf_gemm_plan_lt(sf_k_gemm_ctx *g, plan *p)
{
    cublasStatus_t st;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    size_t ws = LT_WORKSPACE;
#define LT(call) do { st = (call); if (st != CUBLAS_STATUS_SUCCESS) goto fail; } while (0)
    LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (p->has_bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
    }
    LT(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, p->k, p->m, p->k));
    LT(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, p->k, p->n, p->ldx));
    LT(cublasLtMatrixLayoutCreate(&p->c, CUDA_R_16BF, p->m, p->n, p->ldy));
    LT(cublasLtMatmulPreferenceCreate(&pref));
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    LT(cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->c, p->c, pref, 1, &res, &found));
    if (!found) { st = CUBLAS_STATUS_NOT_SUPPORTED; goto fail; }
    p->algo = res.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return 0;
fail:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return LT_ERR(st);
#undef LT
}

/* Decides p's algorithm: the tuner's winner for its bucket where there is one and it is valid
 * for p's exact layouts, else the heuristic's first; or leaves it pending (settled = 0) when
 * its bucket is still to be tuned. */
static void plan_settle(sf_k_gemm_ctx *g, plan *p)
{
    p->settled = 1;
    int nb = sf_k_gemm_bucket(p->n);
    if (p->lt_rc || !g->tune_on || !nb) return;
    tune_entry *t = sf_gemm_tune_find(g, p->m, p->k, p->has_bias, p->acc, nb);
    if (!t) {
        if (g->spent_s < g->budget_s) p->settled = 0;
        return;
    }
    if (t->n_candidates == 0) return; /* tuning failed for this shape: the heuristic stays */
    if (t->split > 1) {
        if (sf_gemm_split_ok(p->k, t->split) && !sf_gemm_split_make(g, p, t->split) && sf_gemm_split_check(g, p, &t->algo))
            p->salgo = t->algo;
        else {
            sf_gemm_split_release(p);
            SF_LOGD("gemm m=%d k=%d n=%d: the split-%d algorithm tuned at n=%d does not apply; heuristic's first",
                    p->m, p->k, p->n, t->split, nb);
        }
        return;
    }
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (cublasLtMatmulAlgoCheck(g->lt, p->op, p->a, p->b, p->c, p->c, &t->algo, &r) == CUBLAS_STATUS_SUCCESS &&
        r.workspaceSize <= LT_WORKSPACE)
        p->algo = t->algo;
    else
        SF_LOGD("gemm m=%d k=%d n=%d: the algorithm tuned at n=%d does not apply; heuristic's first", p->m, p->k,
                p->n, nb);
}

static int get_plan(sf_k_gemm_ctx *g, int n, int m, int k, int has_bias, int acc, int64_t ldx, int64_t ldy,
                    plan **out)
{
    plan *p = find_plan(g, n, m, k, has_bias, acc, ldx, ldy);
    if (!p) {
        int slot = g->n_plans;
        if (slot == MAX_PLANS) { /* full: reuse the least recently used slot */
            slot = 0;
            for (int i = 1; i < g->n_plans; i++)
                if (g->plans[i].used < g->plans[slot].used) slot = i;
            plan_unlink(g, slot);
            sf_gemm_plan_release(&g->plans[slot]);
        } else {
            g->n_plans++;
        }
        p = &g->plans[slot];
        memset(p, 0, sizeof *p);
        p->used = ++g->clock;
        p->n = n; p->m = m; p->k = k; p->has_bias = has_bias; p->acc = acc; p->ldx = ldx; p->ldy = ldy;
        unsigned h = plan_hash(n, m, k, has_bias, acc, ldx, ldy);
        p->next = g->bucket[h];
        g->bucket[h] = slot;
        p->lt_rc = sf_gemm_plan_lt(g, p);
        if (p->lt_rc) {
            sf_gemm_plan_release(p);
            if (getenv("SF_GEMM_VERBOSE"))
                fprintf(stderr, "gemm n=%d m=%d k=%d: cuBLASLt: %s; using the GEMV kernel\n", n, m, k,
                        sf_k_gemm_error_str(p->lt_rc));
        }
    }
    if (!p->settled) plan_settle(g, p);
    *out = p;
    return 0;
}

/* Tunes p's bucket when it waits for that and s is not capturing (a capture must not
 * synchronise; the op then runs with the heuristic's choice and the bucket is tuned at the next
 * use outside a capture). */
static int maybe_tune(sf_k_gemm_ctx *g, plan *p, cudaStream_t s)
{
    if (p->settled) return 0;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &cs) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (cs != cudaStreamCaptureStatusNone) return 0;
    int rc = sf_gemm_tune_run(g, p, s);
    plan_settle(g, p);
    p->settled = 1; /* whatever happened, this plan is decided now */
    return rc;
}

static int run_lt(sf_k_gemm_ctx *g, plan *p, const uint16_t *x, const uint16_t *w, const uint16_t *bias,
                  uint16_t *y, cudaStream_t s)
{
    const float one = 1.0f, beta = p->acc ? 1.0f : 0.0f;
    cublasStatus_t st;
    if (p->split > 1) return sf_gemm_split_run(g, p, &p->salgo, x, w, bias, y, p->ldy, s);
    if (p->has_bias) {
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (st != CUBLAS_STATUS_SUCCESS) return LT_ERR(st);
    }
    st = cublasLtMatmul(g->lt, p->op, &one, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                        g->workspace, LT_WORKSPACE, s);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : LT_ERR(st);
}

static int lt_call(sf_k_gemm_ctx *g, int acc, const uint16_t *x, int64_t ldx, const uint16_t *w,
                   const uint16_t *bias, int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    plan *p;
    int rc = get_plan(g, n, m, k, bias != NULL, acc, ldx, ldy, &p);
    if (rc || (rc = p->lt_rc) || (rc = maybe_tune(g, p, s))) return rc;
    return run_lt(g, p, x, w, bias, y, s);
}

extern "C" int sf_k_gemm_lt(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w,
                            const uint16_t *bias, int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    return lt_call(g, 0, x, ldx, w, bias, n, m, k, y, ldy, s);
}

extern "C" int sf_k_gemm_lt_acc(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w,
                                const uint16_t *bias, int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    return lt_call(g, 1, x, ldx, w, bias, n, m, k, y, ldy, s);
}

extern "C" int sf_k_gemm_lt_ok(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy)
{
    plan *p; /* the accumulating plan: its one caller asks before sf_k_gemm_lt_acc */
    return !get_plan(g, n, m, k, bias != NULL, 1, ldx, ldy, &p) && !p->lt_rc;
}

extern "C" int sf_k_gemm_prepare(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx,
                                 int64_t ldy, int acc, cudaStream_t s)
{
    plan *p;
    int rc = get_plan(g, n, m, k, bias != NULL, acc != 0, ldx, ldy, &p);
    return rc ? rc : p->lt_rc ? 0 : maybe_tune(g, p, s);
}

/* Median-free but warm: one untimed run of each path, then `reps` timed back to back. */
static float time_path(sf_k_gemm_ctx *g, plan *p, int gemv, const uint16_t *x, const uint16_t *w,
                       const uint16_t *bias, uint16_t *y, cudaStream_t s, int *rc)
{
    const int reps = 5;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 1e30f;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) { *rc = (int)cudaGetLastError(); goto out; }
    for (int i = 0; i <= reps && !*rc; i++) {
        if (i == 1) cudaEventRecord(e0, s);
        *rc = gemv ? sf_k_gemv(x, p->ldx, w, bias, p->n, p->m, p->k, y, p->ldy, s) : run_lt(g, p, x, w, bias, y, s);
    }
    cudaEventRecord(e1, s);
    if (!*rc && cudaEventSynchronize(e1) == cudaSuccess) cudaEventElapsedTime(&ms, e0, e1);
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return ms;
}

extern "C" int sf_k_gemm(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                         int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    if (n <= 0) return 0;
    plan *p;
    int rc = get_plan(g, n, m, k, bias != NULL, 0, ldx, ldy, &p);
    if (rc) return rc;
    if (p->lt_rc) { /* no cuBLASLt algorithm (odd leading dimensions): GEMV, 8 rows at a time */
        for (int r = 0; r < n && !rc; r += 8)
            rc = sf_k_gemv(x + (int64_t)r * ldx, ldx, w, bias, SF_MIN(8, n - r), m, k, y + (int64_t)r * ldy, ldy, s);
        return rc;
    }
    if (n > 8) return (rc = maybe_tune(g, p, s)) ? rc : run_lt(g, p, x, w, bias, y, s);
    if (!p->choice) {
        float t_gemv = time_path(g, p, 1, x, w, bias, y, s, &rc);
        if (rc) return rc;
        float t_lt = time_path(g, p, 0, x, w, bias, y, s, &rc);
        if (rc) return rc;
        p->choice = t_gemv <= t_lt ? 1 : 2;
        if (getenv("SF_GEMM_VERBOSE"))
            fprintf(stderr, "gemm n=%d m=%d k=%d: gemv %.1f us, cublasLt %.1f us -> %s\n", n, m, k,
                    t_gemv * 200.0f, t_lt * 200.0f, p->choice == 1 ? "gemv" : "cublasLt");
    }
    return p->choice == 1 ? sf_k_gemv(x, ldx, w, bias, n, m, k, y, ldy, s) : run_lt(g, p, x, w, bias, y, s);
}

extern "C" int sf_k_gemm_choice(sf_k_gemm_ctx *g, int n, int m, int k)
{
    for (int i = 0; i < g->n_plans; i++)
        if (g->plans[i].n == n && g->plans[i].m == m && g->plans[i].k == k && !g->plans[i].acc)
            return g->plans[i].lt_rc ? 1 : n > 8 ? 2 : g->plans[i].choice;
    return 0;
}

extern "C" int sf_k_gemm_ready(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy)
{
    plan *p = find_plan(g, n, m, k, bias != NULL, 0, ldx, ldy);
    return p && p->settled && (p->lt_rc || n > 8 || p->choice);
}

extern "C" int sf_k_gemm_acc_ready(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx,
                                   int64_t ldy)
{
    plan *p = find_plan(g, n, m, k, bias != NULL, 1, ldx, ldy);
    return p && p->settled;
}
