/* gemm_split.cu — GEMM split along k into a strided batch of cuBLASLt GEMMs plus a reduction.
 *
 * At decode-batch sizes a flat GEMM (m = 4096, n = 128..256) has too few output tiles to keep
 * 132 SMs busy while its weight streams in: 4096 x 256 is 64 tiles of 128 x 128. Splitting k into
 * s slices gives s times the tiles: slice i of W (k/s columns of every row, ld k) times slice i of
 * x goes to fp32 partials P[i] (m x n, tight), one cuBLASLt call with batch count s and batch
 * stride k/s over the inputs; a second kernel sums the s partials, adds the bias and (for the
 * accumulating flavour) y, and rounds once to bf16. The partials live in one per-context
 * buffer of SPLIT_WS_BYTES, allocated at the first split candidate or cached split entry (never
 * inside a capture) and never moved: graphs hold its address.
 * One of the tuner's candidate families (gemm_tune.cu); used only where it measured fastest and
 * matched the reference. Not thread-safe: the context's one thread. */
#include <string.h>

#include "gemm_impl.cuh"

int sf_gemm_split_ok(int k, int split)
{
    /* every slice's start 256-byte aligned, as cuBLASLt's default alignment preference assumes */
    return split > 1 && k % split == 0 && (k / split) % 128 == 0;
}

void sf_gemm_split_release(plan *p)
{
    sf_gemm_descs_release(&p->sop, &p->sa, &p->sb, &p->sc);
    p->split = 0;
}

int sf_gemm_split_make(sf_k_gemm_ctx *g, plan *p, int split)
{
    cublasStatus_t st;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    const int64_t ks = p->k / split, sw = ks, sx = ks, sp = (int64_t)p->m * p->n;
    const int32_t cnt = split;
    sf_gemm_split_release(p);
#define LT(call) do { st = (call); if (st != CUBLAS_STATUS_SUCCESS) goto fail; } while (0)
    LT(cublasLtMatmulDescCreate(&p->sop, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT(cublasLtMatmulDescSetAttribute(p->sop, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(p->sop, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT(cublasLtMatrixLayoutCreate(&p->sa, CUDA_R_16BF, ks, p->m, p->k));
    LT(cublasLtMatrixLayoutSetAttribute(p->sa, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
    LT(cublasLtMatrixLayoutSetAttribute(p->sa, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sw, sizeof sw));
    LT(cublasLtMatrixLayoutCreate(&p->sb, CUDA_R_16BF, ks, p->n, p->ldx));
    LT(cublasLtMatrixLayoutSetAttribute(p->sb, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
    LT(cublasLtMatrixLayoutSetAttribute(p->sb, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sx, sizeof sx));
    LT(cublasLtMatrixLayoutCreate(&p->sc, CUDA_R_32F, p->m, p->n, p->m));
    LT(cublasLtMatrixLayoutSetAttribute(p->sc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &cnt, sizeof cnt));
    LT(cublasLtMatrixLayoutSetAttribute(p->sc, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &sp, sizeof sp));
#undef LT
    p->split = split;
    return 0;
fail:
    sf_gemm_split_release(p);
    return LT_ERR(st);
}

int sf_gemm_split_heuristic(sf_k_gemm_ctx *g, const plan *p, cublasLtMatmulAlgo_t *out, int max)
{
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[8];
    size_t ws = LT_WORKSPACE;
    int found = 0, n = 0;
    if (max > 8) max = 8;
    if (cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ==
            CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(g->lt, p->sop, p->sa, p->sb, p->sc, p->sc, pref, max, res, &found) ==
            CUBLAS_STATUS_SUCCESS)
        for (int i = 0; i < found; i++)
            if (res[i].state == CUBLAS_STATUS_SUCCESS && res[i].workspaceSize <= LT_WORKSPACE) out[n++] = res[i].algo;
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return n;
}

int sf_gemm_split_check(sf_k_gemm_ctx *g, const plan *p, const cublasLtMatmulAlgo_t *a)
{
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    return p->split > 1 && cublasLtMatmulAlgoCheck(g->lt, p->sop, p->sa, p->sb, p->sc, p->sc, a, &r) == CUBLAS_STATUS_SUCCESS &&
           r.workspaceSize <= LT_WORKSPACE && (size_t)p->split * p->n * p->m * 4 <= g->split_bytes;
}

int sf_gemm_split_ws(sf_k_gemm_ctx *g)
{
    if (g->split_ws) return 0;
    cudaError_t e = cudaMalloc((void **)&g->split_ws, SPLIT_WS_BYTES);
    if (g->n_mallocs) (*g->n_mallocs)++;
    if (e != cudaSuccess) {
        cudaGetLastError();
        g->split_ws = NULL;
        return (int)e;
    }
    g->split_bytes = SPLIT_WS_BYTES;
    return 0;
}

/* y[i, j] = sum over s of P[s][i, j] (+ bias[j]) (+ y[i, j] when acc), one rounding to bf16;
 * a thread per output, consecutive threads along j (coalesced partial reads and bf16 writes). */
static __global__ void k_split_reduce(const float *__restrict__ P, int split, int n, int m, const bf16 *__restrict__ bias,
                                      bf16 *y, int64_t ldy, int acc)
{
    const int64_t total = (int64_t)n * m, plane = total;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = t / m, j = t - i * m;
        float v = 0.0f;
        for (int s = 0; s < split; s++) v += P[s * plane + t];
        if (bias) v += bf2f(bias[j]);
        bf16 *o = y + i * ldy + j;
        if (acc) v += bf2f(*o);
        *o = f2bf(v);
    }
}

int sf_gemm_split_run(sf_k_gemm_ctx *g, const plan *p, const cublasLtMatmulAlgo_t *a, const uint16_t *x,
                      const uint16_t *w, const uint16_t *bias, uint16_t *y, int64_t ldy, cudaStream_t s)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = cublasLtMatmul(g->lt, p->sop, &one, w, p->sa, x, p->sb, &zero, g->split_ws, p->sc, g->split_ws,
                                       p->sc, a, g->workspace, LT_WORKSPACE, s);
    if (st != CUBLAS_STATUS_SUCCESS) return LT_ERR(st);
    int64_t total = (int64_t)p->n * p->m;
    unsigned grid = (unsigned)SF_MIN(sf_div_up((long)total, 256), 132u * 16);
    k_split_reduce<<<grid, 256, 0, s>>>(g->split_ws, p->split, p->n, p->m, (const bf16 *)bias, (bf16 *)y, ldy, p->acc);
    return sf_launch_status();
}
