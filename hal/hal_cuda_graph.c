/* hal_cuda_graph.c — recorded ops and per-shape CUDA graphs for the CUDA backend's steps.
 *
 * A decode step launches a few hundred small kernels; launched one by one the gaps between
 * them cost as much as the work. Steps are keyed by their batch shape (tokens, sequences,
 * logit rows, block-table width, attention split): the first step with a key runs directly
 * (GEMM paths are timed and workspaces sized then), the second is captured into a graph, and
 * later ones replay it after checking that every op matches the recorded one exactly.
 *
 * Collectives (SF_OP_COLL: NCCL calls, the peer-memory all-reduce) are ops like the others, so
 * one graph spans a whole tensor-parallel step. That holds across ranks because every rank
 * replays its own graph of the same step plan: the keys (batch shapes) come in the same order
 * on every rank, and a rank that falls back to running a step directly still queues the same
 * collectives in the same order, so the ranks' collectives always pair up. NCCL (2.9 and
 * newer) supports capture of its calls on the capturing stream; the first step of a key runs
 * directly, which also makes NCCL set up its connections outside any capture. */
#include <stdlib.h>
#include <string.h>

#include "hal_cuda_impl.h"
#ifdef SF_HAVE_CUDA
#include "../kernels/cuda/gemv_stream.h"
#endif

#ifdef SF_HAVE_CUDA

enum { MODE_DIRECT = 0, MODE_CAPTURE = 1, MODE_REPLAY = 2 };

int sf_cuda_op_exec(sf_k_gemm_ctx *g, cudaStream_t s, const sf_op_rec *r)
{
    const int64_t *n = r->n;
    switch (r->kind) {
    case SF_OP_EMBED:
        return sf_k_embed(r->p[0], n[0], n[1], r->p[1], (int)n[2], (uint16_t *)r->p[2], n[3], s);
    case SF_OP_RMSNORM:
        return sf_k_rmsnorm((uint16_t *)r->p[0], n[0], r->p[1], n[1], r->p[2], r->f, (int)n[2], (int)n[3],
                            (uint16_t *)r->p[3], n[4], s);
    case SF_OP_GEMM:
        return sf_k_gemm(g, r->p[0], n[0], r->p[1], r->p[2], (int)n[1], (int)n[2], (int)n[3], (uint16_t *)r->p[3], n[4], s);
    case SF_OP_ROPE_KV:
        return sf_k_rope_kv((uint16_t *)r->p[0], n[0], (int)n[1], r->p[1], r->p[2], (int)n[2], (int)n[3], (int)n[4],
                            (int)n[5], (int)n[6], r->p[3], r->kv, s);
    case SF_OP_ATTN:
        return sf_k_attention(&r->attn, s);
    case SF_OP_SILU:
        return sf_k_silu_mul(r->p[0], n[0], (int)n[1], (int)n[2], (uint16_t *)r->p[1], n[3], s);
    case SF_OP_ROWS:
        return sf_k_get_rows(r->p[0], n[0], r->p[1], (int)n[1], n[2], (uint16_t *)r->p[2], n[3], s);
    case SF_OP_COLL:
        return r->coll(r->coll_arg, (void *)r->p[0], n[0], SF_DT_BF16, s) ? SF_K_COLL_FAILED : 0;
    case SF_OP_COLL_NORM: {
        sf_coll_norm a = { .x = (void *)r->p[0], .res = (void *)r->p[1], .w = r->p[2], .out = (void *)r->p[3],
                           .rows = n[0], .cols = n[1], .eps = r->f, .dt = SF_DT_BF16 };
        return r->coll_norm(r->coll_arg, &a, s) ? SF_K_COLL_FAILED : 0;
    }
    case SF_OP_GEMV_NORM:
        if (r->p[5]) /* the lm_head that draws its row: best words p[5], ids below n[3], the row p[6] */
            return sf_k_gemv_norm_best(r->p[0], r->p[1], r->f, r->p[2], r->p[3], (int)n[0], (int)n[1],
                                       (uint16_t *)r->p[4], (unsigned long long *)r->p[5], (int)n[3],
                                       (const sf_k_sample_row *)r->p[6], s);
        if (n[8] > 1) /* 2-6 rows (gemv_rows.cu): rows n[8], x and y strides n[9], n[10] */
            return sf_k_gemv_rows_norm(r->p[0], n[9], r->p[1], r->f, r->p[2], r->p[3], (int)n[8], (int)n[0], (int)n[1],
                                       (int)n[2], (uint16_t *)r->p[4], n[10], s);
        return sf_k_gemv_norm(r->p[0], r->p[1], r->f, r->p[2], r->p[3], (int)n[0], (int)n[1], (int)n[2],
                              (uint16_t *)r->p[4], s);
    case SF_OP_GEMV_ADD:
        if (n[8] > 1)
            return sf_k_gemv_rows_add(r->p[0], n[9], r->p[2], r->p[3], (int)n[8], (int)n[0], (int)n[1], (uint16_t *)r->p[4],
                                      n[10], s);
        return sf_k_gemv_add(r->p[0], r->p[2], r->p[3], (int)n[0], (int)n[1], (uint16_t *)r->p[4], s);
    case SF_OP_ADD:
        return sf_k_add((uint16_t *)r->p[0], n[0], r->p[1], n[1], (int)n[2], (int)n[3], s);
    case SF_OP_BEST_PUT:
        return sf_k_sample_best_put((unsigned long long *)r->p[0], (int32_t *)r->p[1], (int32_t *)r->p[2],
                                    (int32_t *)r->p[3], s);
    case SF_OP_ATTN_DEC:
        return sf_k_attention_decode(&r->attn, s);
    case SF_OP_GEMM_ACC:
        return sf_k_gemm_lt_acc(g, r->p[0], n[0], r->p[1], r->p[2], (int)n[1], (int)n[2], (int)n[3], (uint16_t *)r->p[3],
                                n[4], s);
    case SF_OP_GEMV_ROPE:
        if (n[8] > 1)
            return sf_k_gemv_rows_rope(r->p[0], n[9], r->p[1], r->f, r->p[2], r->p[3], (int)n[8], (int)n[1], (int)n[2],
                                       (int)n[3], (int)n[4], (int)n[5], (int)n[6], r->p[5], r->p[6], r->p[7], r->kv,
                                       (uint16_t *)r->p[4], n[10], s);
        return sf_k_gemv_norm_rope(r->p[0], r->p[1], r->f, r->p[2], r->p[3], (int)n[1], (int)n[2], (int)n[3],
                                   (int)n[4], (int)n[5], (int)n[6], r->p[5], r->p[6], r->p[7], r->kv,
                                   (int)n[7], (uint16_t *)r->p[4], s);
    case SF_OP_GEMV_PLAIN:
        return sf_k_gemv_stream_plain(r->p[0], r->p[2], r->p[3], (int)n[0], (int)n[1], (uint16_t *)r->p[4], s);
    case SF_OP_QGEMV:
        if (n[8] == 2) /* RoPE: the part's first row n[9], heads n[10..12], rotation n[13..14], pos, slot, inv_freq p[5..7] */
            return sf_k_qgemv_rope((int)n[0], r->p[1], n[1], (int)n[2], (int)n[9], (int)n[3], r->p[0], n[4], (int)n[5],
                                   r->p[4], r->f, r->p[2], (int)n[10], (int)n[11], (int)n[12], (int)n[13], (int)n[14],
                                   r->p[5], r->p[6], r->p[7], r->kv, (uint16_t *)r->p[3], n[6], s);
        return sf_k_qgemv((int)n[0], r->p[1], n[1], (int)n[2], (int)n[3], r->p[0], n[4], (int)n[5], r->p[4], r->f,
                          r->p[2], (int)n[8], (uint16_t *)r->p[3], n[6], (int)n[7], s);
    case SF_OP_QDEQ:
        return sf_k_qdequant((int)n[0], r->p[0], n[1], (int)n[2], r->p[1], n[3], (int)n[4], (uint16_t *)r->p[2], n[5], s);
    default:
        return (int)cudaErrorInvalidValue;
    }
}

void sf_cuda_graphs_init(sf_cuda_graphs *G, int enabled, int max_tokens)
{
    memset(G, 0, sizeof *G);
    G->enabled = enabled;
    G->max_tokens = max_tokens;
}

static void slot_clear(sf_graph_slot *sl)
{
    if (sl->exec) cudaGraphExecDestroy(sl->exec);
    free(sl->trace);
    memset(sl, 0, sizeof *sl);
}

void sf_cuda_graphs_free(sf_cuda_graphs *G)
{
    for (int i = 0; i < SF_GRAPH_SLOTS; i++) slot_clear(&G->slots[i]);
}

void sf_cuda_graphs_drop(sf_cuda_graphs *G, cudaStream_t s)
{
    if (G->mode == MODE_CAPTURE) { /* abandoned, not launched: its peers may be gone */
        cudaGraph_t graph = NULL;
        cudaStreamEndCapture(s, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
    }
    for (int i = 0; i < SF_GRAPH_SLOTS; i++) slot_clear(&G->slots[i]);
    G->mode = MODE_DIRECT;
    G->cur = NULL;
}

static int run_trace(sf_k_gemm_ctx *g, cudaStream_t s, const sf_op_rec *t, int n)
{
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = sf_cuda_op_exec(g, s, &t[i]);
    return rc;
}

void sf_cuda_graph_begin(sf_cuda_graphs *G, cudaStream_t s, const int64_t key[SF_GRAPH_KEY])
{
    G->mode = MODE_DIRECT;
    G->cur = NULL;
    if (!G->enabled || key[0] > G->max_tokens) return;
    sf_graph_slot *sl = NULL, *lru = &G->slots[0];
    for (int i = 0; i < SF_GRAPH_SLOTS; i++) {
        sf_graph_slot *x = &G->slots[i];
        if (x->seen && !memcmp(x->key, key, sizeof x->key)) { sl = x; break; }
        if (x->last_use < lru->last_use) lru = x;
    }
    if (!sl) {
        sl = lru;
        slot_clear(sl);
        memcpy(sl->key, key, sizeof sl->key);
    }
    sl->last_use = ++G->tick;
    sl->seen++;
    if (sl->failures >= 2 || sl->seen < 2) return; /* unstable key, or first sight: run directly */
    G->cur = sl;
    G->pos = 0;
    if (sl->exec) {
        G->mode = MODE_REPLAY;
        return;
    }
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
        cudaGetLastError();
        sl->failures++;
        G->cur = NULL;
        return;
    }
    sl->n_trace = 0;
    G->mode = MODE_CAPTURE;
}

int sf_cuda_graph_bail(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s)
{
    sf_graph_slot *sl = G->cur;
    int mode = G->mode, n = 0;
    G->mode = MODE_DIRECT;
    G->cur = NULL;
    if (mode == MODE_DIRECT || !sl) return 0;
    G->n_fallbacks++;
    sl->failures++;
    if (mode == MODE_CAPTURE) {
        cudaGraph_t graph = NULL;
        cudaStreamEndCapture(s, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        n = sl->n_trace;
    } else {
        n = G->pos;
        if (sl->exec) cudaGraphExecDestroy(sl->exec);
        sl->exec = NULL;
    }
    return run_trace(g, s, sl->trace, n);
}

int sf_cuda_graph_submit(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s, const sf_op_rec *r, int capturable)
{
    sf_graph_slot *sl = G->cur;
    if (G->mode == MODE_REPLAY) {
        if (G->pos < sl->n_trace && !memcmp(&sl->trace[G->pos], r, sizeof *r)) {
            G->pos++;
            return 0;
        }
        int rc = sf_cuda_graph_bail(G, g, s);
        return rc ? rc : sf_cuda_op_exec(g, s, r);
    }
    if (G->mode == MODE_CAPTURE) {
        if (!capturable) {
            int rc = sf_cuda_graph_bail(G, g, s);
            return rc ? rc : sf_cuda_op_exec(g, s, r);
        }
        if (sl->n_trace == sl->cap_trace) {
            int cap = sl->cap_trace ? 2 * sl->cap_trace : 256;
            sf_op_rec *t = realloc(sl->trace, (size_t)cap * sizeof *t);
            if (!t) {
                int rc = sf_cuda_graph_bail(G, g, s);
                return rc ? rc : sf_cuda_op_exec(g, s, r);
            }
            sl->trace = t;
            sl->cap_trace = cap;
        }
        int rc = sf_cuda_op_exec(g, s, r);
        if (rc) { /* not capturable after all: run what came before, then this op, directly */
            cudaGetLastError();
            rc = sf_cuda_graph_bail(G, g, s);
            return rc ? rc : sf_cuda_op_exec(g, s, r);
        }
        sl->trace[sl->n_trace++] = *r;
        return 0;
    }
    return sf_cuda_op_exec(g, s, r);
}

int sf_cuda_graph_end(sf_cuda_graphs *G, sf_k_gemm_ctx *g, cudaStream_t s)
{
    sf_graph_slot *sl = G->cur;
    if (G->mode == MODE_DIRECT || !sl) return 0;
    if (G->mode == MODE_REPLAY) {
        if (G->pos != sl->n_trace) return sf_cuda_graph_bail(G, g, s);
        G->mode = MODE_DIRECT;
        G->cur = NULL;
        G->n_replayed++;
        return (int)cudaGraphLaunch(sl->exec, s);
    }
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&sl->exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    G->mode = MODE_DIRECT;
    G->cur = NULL;
    if (e != cudaSuccess) {
        cudaGetLastError();
        sl->exec = NULL;
        sl->failures++;
        G->n_fallbacks++;
        return run_trace(g, s, sl->trace, sl->n_trace);
    }
    G->n_captured++;
    return (int)cudaGraphLaunch(sl->exec, s);
}

#endif
