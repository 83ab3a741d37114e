/* gemm_impl.cuh — internals shared by gemm.cu (plans, dispatch) and gemm_tune.cu (measured
 * algorithm choice, its disk cache). Not part of the kernels API. */
#ifndef SF_KERNELS_GEMM_IMPL_CUH
#define SF_KERNELS_GEMM_IMPL_CUH

#include <cublasLt.h>

#include "common.cuh"

#define LT_WORKSPACE (32u << 20)
#define SPLIT_WS_BYTES ((size_t)64 << 20) /* fp32 partials of a split GEMM: split x n x m x 4 */
#define LT_ERR(st) (10000 + (int)(st))

/* One shape's cuBLASLt plan: y[n, m] (ld ldy) = x[n, k] (ld ldx) . W[m, k]^T (+ bias), plain
 * (beta = 0) or accumulating (acc: beta = 1). */
typedef struct plan {
    int n, m, k, has_bias, acc;
    int64_t ldx, ldy;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int lt_rc;  /* 0, or why cuBLASLt has no algorithm for this shape (GEMV in chunks of 8 then) */
    int choice; /* n <= 8: 0 not measured, 1 GEMV, 2 cuBLASLt */
    int split;   /* > 1: run as `split` k-slices into fp32 partials plus a reduction (gemm_split.cu),
                  * with sop/sa/sb/sc and salgo instead of op/a/b/c and algo */
    cublasLtMatmulDesc_t sop;
    cublasLtMatrixLayout_t sa, sb, sc;
    cublasLtMatmulAlgo_t salgo;
    int settled; /* 1: algo is final (tuned, from the cache, or the heuristic's first when there is
                  * nothing to tune); 0: its n bucket waits for the tuner (first use outside a capture) */
    uint64_t used; /* the context's use clock at the last lookup (for eviction) */
    int next;      /* next plan in the same hash chain, -1 at the end */
} plan;

/* The tuner's winner for one (m, k, bias, acc, n bucket); timed at n = nb. */
typedef struct tune_entry {
    int m, k, has_bias, acc, nb;
    int split; /* 0: algo is a plain cuBLASLt algorithm; > 1: algo is for the split batch */
    cublasLtMatmulAlgo_t algo;
    float us, heuristic_us, tune_ms; /* winner's and heuristic-first's time at nb; time spent tuning */
    int n_candidates, from_cache;
} tune_entry;

#define MAX_PLANS 512
#define PLAN_BUCKETS 256
#define MAX_TUNES 1024

struct sf_k_gemm_ctx {
    cublasLtHandle_t lt;
    void *workspace;
    int *n_mallocs;      /* the owner's allocation counter (may be NULL) */
    float *split_ws;     /* fp32 partials of split GEMMs (gemm_split.cu), split_bytes long */
    size_t split_bytes;
    plan plans[MAX_PLANS];
    int n_plans;
    uint64_t clock;
    int bucket[PLAN_BUCKETS]; /* first plan of each hash chain, -1 when empty */
    /* tuner (off until sf_k_gemm_tune_enable) */
    int tune_on;
    double budget_s, spent_s;
    int budget_warned;
    size_t l2_bytes;
    char cache_path[1024];    /* "" = no disk cache */
    char gpu[256];            /* what the cache is valid for: GPU name, driver, cuBLASLt */
    int driver;
    size_t lt_version;
    tune_entry *tunes;
    int n_tunes;
};

/* Destroys one descriptor set (plain or split) and clears its handles. */
static inline void sf_gemm_descs_release(cublasLtMatmulDesc_t *op, cublasLtMatrixLayout_t *a, cublasLtMatrixLayout_t *b,
                                         cublasLtMatrixLayout_t *c)
{
    if (*op) cublasLtMatmulDescDestroy(*op);
    if (*a) cublasLtMatrixLayoutDestroy(*a);
    if (*b) cublasLtMatrixLayoutDestroy(*b);
    if (*c) cublasLtMatrixLayoutDestroy(*c);
    *op = NULL;
    *a = *b = *c = NULL;
}

/* Descriptors and the heuristic's first algorithm for p's shape. Returns 0 or LT_ERR. */
int sf_gemm_plan_lt(sf_k_gemm_ctx *g, plan *p);
void sf_gemm_plan_release(plan *p);
/* The tuner's entry for a shape and bucket, or NULL. */
tune_entry *sf_gemm_tune_find(sf_k_gemm_ctx *g, int m, int k, int has_bias, int acc, int nb);
/* Times cuBLASLt's candidates for p's (m, k, bias, acc) at n = its bucket on scratch buffers,
 * keeps the fastest correct one in the table and the disk cache. Synchronises s (which must not
 * be capturing); allocates and frees its scratch. A shape that cannot be tuned (no scratch
 * memory, budget spent) gets no entry and a warning. Returns a cudaError_t only for sticky
 * device errors (0 otherwise). */
int sf_gemm_tune_run(sf_k_gemm_ctx *g, const plan *p, cudaStream_t s);
void sf_gemm_tune_free(sf_k_gemm_ctx *g);

/* Split along k (gemm_split.cu): whether k splits into `split` aligned slices; descriptors for
 * p's shape split so (replacing p's split ones); up to max heuristic algorithms for them; whether
 * algorithm a applies to p's split descriptors and the partials fit; the partials buffer made
 * (once; outside captures only); one run (the batch, then the
 * reduction into y, ld ldy). */
int sf_gemm_split_ok(int k, int split);
int sf_gemm_split_make(sf_k_gemm_ctx *g, plan *p, int split);
void sf_gemm_split_release(plan *p);
int sf_gemm_split_heuristic(sf_k_gemm_ctx *g, const plan *p, cublasLtMatmulAlgo_t *out, int max);
int sf_gemm_split_check(sf_k_gemm_ctx *g, const plan *p, const cublasLtMatmulAlgo_t *a);
int sf_gemm_split_ws(sf_k_gemm_ctx *g);
int sf_gemm_split_run(sf_k_gemm_ctx *g, const plan *p, const cublasLtMatmulAlgo_t *a, const uint16_t *x,
                      const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t ldy, cudaStream_t s);

#endif
