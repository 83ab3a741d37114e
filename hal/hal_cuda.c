/* hal_cuda.c — the CUDA backend: fills struct sf_backend_ops with the kernels of kernels/cuda
 * and cuBLASLt GEMMs.
 *
 * Data: activations and weights are bf16 on the device (fp32 accumulation inside every
 * kernel); weights are converted at upload from F32 / F16 / BF16 / Q8_0 and multi-part weights
 * (QKV, gate/up) concatenated into one matrix. The KV cache is bf16, per layer
 * [n_blocks][n_kv_heads][block_size][head_dim] for K and the same for V.
 *
 * Memory: every device allocation happens while the model is set up (weights, activation
 * buffers, KV pool, staging and workspaces) and is counted; a decode or prefill step allocates
 * nothing (sf_backend_cuda_stats reports the count, a device test asserts it stays flat).
 *
 * Threading: one thread drives the backend (the engine thread); all work goes to one
 * non-blocking stream, and only read_f32, sync and kv_copy_* wait for it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hal_cuda_impl.h"
#ifdef SF_HAVE_CUDA
#include "../kernels/cuda/b1trace.h"
#endif

#ifndef SF_HAVE_CUDA

int sf_backend_cuda_new(const sf_backend_opts *o, sf_backend **out, sf_error *err)
{
    *out = NULL;
    return sf_err(err, SF_ENODEV, "CUDA backend: built without CUDA (no nvcc/cuBLASLt at build time); "
                                  "rebuild on a machine with the CUDA toolkit, or use --backend cpu");
}

int sf_backend_cuda_stats(sf_backend *b, sf_backend_stats *s)
{
    memset(s, 0, sizeof *s);
    return SF_ENODEV;
}

#else

#include "../kernels/cuda/kernels.h"
#include "../kernels/sample_draw.h"

#define STAGE_BYTES ((size_t)32 << 20) /* per half of the double-buffered weight upload */
#define META_INTS ((size_t)1 << 20)    /* batch metadata capacity (ints), pinned + device */
#define MAX_SPLIT 64
#define SAMPLE_BYTES ((size_t)8 << 20) /* sampler arguments and ids, pinned + device (+ the op's scratch) */
#define SCORE_BYTES ((size_t)1 << 20)  /* the score op's targets and results, pinned + device (rows in pieces) */

_Static_assert(sizeof(sf_k_sample_row) == sizeof(sf_sample_row) &&
               offsetof(sf_k_sample_row, seed) == offsetof(sf_sample_row, seed) &&
               offsetof(sf_k_sample_row, n_pen) == offsetof(sf_sample_row, n_pen) &&
               offsetof(sf_k_sample_row, allow) == offsetof(sf_sample_row, allow) &&
               offsetof(sf_k_sample_row, logprobs) == offsetof(sf_sample_row, logprobs) &&
               sizeof(sf_k_sample_lp) == sizeof(sf_sample_lp) && SF_K_SAMPLE_TOP_MAX == SF_SAMPLE_TOP_MAX &&
               offsetof(sf_k_sample_lp, top_lp) == offsetof(sf_sample_lp, top_lp) &&
               sizeof(sf_k_sample_pen) == sizeof(sf_sample_pen) &&
               offsetof(sf_k_sample_pen, bias) == offsetof(sf_sample_pen, bias),
               "kernels.h and hal.h disagree on the sampler rows");

struct sf_buf {
    uint16_t *d;
    int64_t rows, cols;
};

struct sf_weight {
    uint16_t *d, *bias;
    int64_t rows, cols;
    /* Q8_0, Q4_K, Q5_K, Q6_K kept in their own bytes (d NULL): each part (a fused weight's parts
     * may differ, as Q4_K_M's Q6_K attn_v beside Q4_K q and k) rows of `pitch` bytes in hal.h's
     * sf_qdev layout, read by qgemv.cu; longer steps' GEMMs take `chunk` rows at a time
     * dequantized into the context's qscratch. With qfuse, consecutive parts of one format are
     * one qpart (Q4_K_M's gate and up: one matrix of both) */
    int n_q;
    struct qpart { uint8_t *q; sf_dtype t; int64_t pitch, rows, r0, chunk; } qp[4];
};

typedef struct cuda_ctx {
    int dev;
    cudaStream_t s;
    sf_hw_info hw;
    sf_k_gemm_ctx *gemm;
    int n_mallocs, steady_mallocs;
    size_t dev_bytes;
    /* weight upload: two halves of pinned host memory and device staging */
    void *pin[2], *stage[2];
    cudaEvent_t stage_done[2];
    /* batch metadata: host (pinned) and device copies of one step's arrays */
    int32_t *meta_h, *meta_d;
    cudaEvent_t meta_done;
    int T, S, L, max_blocks, max_ctx;
    int32_t *tokens_h; /* into meta_h */
    int32_t *tokens_d, *pos_d, *slot_d, *tok_seq_d, *block_table_d, *logit_rows_d, *tiles_d;
    int n_tiles; /* prefill query tiles of this step (0: none) */
    int n_dec, dec_split; /* steps with tiles: single-token sequences left out of the tiles, whose */
    int32_t *dec_rows_d;  /* token rows (after the tiles) take the decode kernel with this split */
    int mixed_decode;     /* do so (the default: +1.4 and +0.9 points of 1000/1000's bound in session 5
                           * calls 1 and 2); SEMFLOW_CUDA_MIXED_DECODE=0: 1-row prefill tiles */
    int dec_kernel;       /* decode steps: the kernel planned with n_split (sf_k_attn.kernel) */
    /* KV pool */
    sf_kv_config kvc;
    uint16_t *kv;
    size_t kv_layer_elems; /* elements of K (or V) of one layer */
    float *kv_scale;       /* INT8 blocks (kvc.int8): per layer K then V scales, kv_layer_rows each */
    size_t kv_layer_rows;  /* INT8 rows (token, kv head) of one layer: 2 * n_blocks * Hkv * bs */
    int kv_ids;            /* block ids in use: n_blocks, or 3 * n_blocks with INT8 blocks */
    int step_i8;           /* this step reads or writes INT8 blocks: the bf16-only GEMV + RoPE +
                            * KV-write epilogue (gemv_fused.cu) is skipped for the plain rope_kv */
    /* RoPE frequencies (device copy of the last sf_rope's inv_freq) */
    float *inv_freq_d;
    float inv_freq_h[SF_K_ATTN_MAX_HD / 2];
    int inv_freq_n;
    /* attention split workspace and download staging */
    float *attn_ws;          /* split partials, then attn_cnt zeroed counters */
    size_t attn_ws_floats, attn_cnt;
    int64_t max_rows;
    int n_split; /* attention split of this step (from T, kv heads and max_ctx) */
    int attn_decode; /* 1: single-query attention through attention_decode.cu where it applies */
    int gemv_plain;  /* 1 (default; SEMFLOW_CUDA_GEMV_PLAIN=0: the register GEMV): one-row plain
                      * matmuls of up to 32768 rows on the persistent-warp GEMV (with the fused ops only) */
    uint64_t t_step0;    /* host clock at the step's batch_begin */
    uint64_t t_raw;      /* host clock at the step's last buf_raw (a collective queued outside the
                          * graph: its wait for the peers is not host work) */
    double last_host_us; /* batch_begin until the step's work was all enqueued */
    uint64_t last_begin_ns, last_enq_ns; /* the same two moments of the last step */
    sf_cuda_graphs graphs;
    /* sampler: rows, penalty entries, their scratch and the ids; pinned and device */
    char *samp_h, *samp_d;
    char *score_h, *score_d; /* the score op's targets and results (SCORE_BYTES each) */
    int samp_pending; /* the last sample_start's draw awaits sample_wait */
    /* draws queued by sample_start, oldest first (two with sample_defer, else one): where their
     * ids go, how many, where they land in pinned memory, and (deferred) when they are there */
    struct cuda_draw {
        int32_t *out;
        int n;
        const int32_t *h_ids;
        sf_sample_lp *lp_out;      /* the caller's, NULL: the draw has no log-probabilities */
        const sf_sample_lp *h_lp;
        cudaEvent_t done;
    } draw[2];
    int n_draws, draw_head;
    int samp_defer;     /* sample_defer: draws stay queued until sample_take */
    char *samp_h2;      /* deferred: the pinned memory of every other draw (the one before may
                         * still be on its way to the device) */
    /* samp_h's and samp_h2's device addresses (NULL: copies instead): the draw reads its rows
     * from there when it has no penalties and writes its ids there, where two copies in the
     * stream cost ~10 us a step (SEMFLOW_CUDA_DRAW_MAPPED=0: the copies) */
    char *samp_hd, *samp_h2d;
    int samp_flip;
    /* A batch-1 step whose row is drawn greedily or at a temperature alone with nothing else
     * (sf_batch.draw_row) draws it with its lm_head into best_d (gemv_stream.cu FG_BEST) and
     * writes the id as the draw would with one more launch in the step's graph
     * (sf_k_sample_best_put), so sample_start queues no draw. head_arm, set at batch_begin
     * (the graph key holds it): 0, or 1 + which pinned half the row and the id use (the draw
     * flips them when deferred) + 2 for a drawn row, which batch_begin writes into that half
     * for the lm_head to read (mapped); head_put, once the lm_head recorded it, with its rows
     * in head_vocab. SEMFLOW_CUDA_HEAD_DRAW=0: the draw as for any row (comparisons). */
    unsigned long long *best_d;
    int head_draw, head_arm, head_put, head_vocab;
    long head_draws;
    /* The last draw's ids are in the token slots at meta_d's start too (draw_in_tokens of them):
     * a next step whose tokens are those rows, in order, copies its metadata past them and no
     * tokens (a copy in the stream each, ~5 us a step). With as many tokens as the draw had
     * rows that copy runs on s_meta (NULL: on s) once the forward pass before it, which reads
     * the metadata, is done (fwd_done, recorded by the draw after it: fwd_ready), beside the
     * draw rather than after it (SEMFLOW_CUDA_META_SIDE=0: on s). */
    int draw_in_tokens, fwd_ready;
    cudaStream_t s_meta;
    cudaEvent_t fwd_done;
    const int32_t *last_ids_d; /* the last draw's ids on the device (sf_batch.src_row), n_last */
    int n_last;
    /* the device's idle gap after each draw (sf_backend_stats.idle_after_draw_*): event pairs
     * (ids copied back, next step's first work), recorded in a ring and read once complete */
    cudaEvent_t gap_ev[4][2];
    int gap_w, gap_r, gap_open; /* pairs [gap_r, gap_w) await reading; gap_open: pair gap_w has its first */
    double gap_us;
    long gap_n;
    /* SEMFLOW_CUDA_PROFILE=1: each op timed on its own (graphs off), queued behind a 200 us hold
     * of the stream so that its host call is not timed, summed by kind and shape, printed when
     * the backend closes */
    int prof;
    cudaEvent_t prof_ev[2];
    struct prof_row { int kind; int64_t m, k, n; double ms; long count; } prof_rows[1024];
    int n_prof;
    long prof_dropped; /* ops of shapes past the table's end (counted, not shown) */
    sf_k_trace *trace; /* SEMFLOW_CUDA_TRACE=FILE: the batch-1 kernels' timeline (b1trace.h) */
    /* block-format weights in place (SEMFLOW_CUDA_QUANT, default on; off: bf16 copies), and the
     * bf16 rows of one chunk of such a weight for a GEMM of more than qgemv_rows rows */
    int quant;
    /* SEMFLOW_CUDA_QFUSE (default off until measured on a GPU): a decode step's RMSNorm,
     * SiLU-gated product and RoPE + K/V write inside the quantized GEMVs (qgemv.cu), and a fused
     * weight's consecutive parts of one format stacked into one matrix, so that one launch
     * takes them */
    int qfuse;
    /* steps of up to this many rows take qgemv.cu's GEMV (8 rows a launch, each launch reading
     * the weights), longer ones the dequantized chunks and cuBLASLt: SEMFLOW_CUDA_QGEMV_ROWS,
     * 8 until steps of 9-64 rows are measured both ways */
    int qgemv_rows;
    uint16_t *qscratch;
    size_t qscratch_bytes;
} cuda_ctx;

static cuda_ctx *CTX(sf_backend *b) { return (cuda_ctx *)b->ctx; }

/* Counted device allocation. */
static int dmalloc(cuda_ctx *c, void **p, size_t bytes, const char *what, sf_error *err)
{
    cudaError_t e = cudaMalloc(p, bytes ? bytes : 16);
    c->n_mallocs++;
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        *p = NULL;
        return sf_err(err, e == cudaErrorMemoryAllocation ? SF_ENOMEM : SF_ERROR,
                      "CUDA: cannot allocate %.1f MiB for %s (%s; %.1f of %.1f GiB free): lower "
                      "--gpu-memory-utilization, --max-num-seqs or --max-batched-tokens, or use a smaller model",
                      bytes / 1048576.0, what, cudaGetErrorString(e), fr / 1073741824.0, tot / 1073741824.0);
    }
    c->dev_bytes += bytes;
    return SF_OK;
}

static void dfree(cuda_ctx *c, void *p, size_t bytes)
{
    if (!p) return;
    cudaFree(p);
    c->dev_bytes -= bytes;
}

/* Ops have no sf_error: they log the failing call with its place and return a status. */
static int op_fail(int code, const char *op, const char *what)
{
    SF_LOGE("cuda backend: %s: %s", op, what);
    return code;
}

static int kcheck(int krc, const char *op)
{
    if (!krc) return SF_OK;
    if (krc == SF_K_COLL_FAILED) return SF_ERROR; /* the communicator logged and keeps the message */
    SF_LOGE("cuda backend: %s: %s", op, krc >= 10000 ? sf_k_gemm_error_str(krc) : cudaGetErrorString((cudaError_t)krc));
    return krc == cudaErrorMemoryAllocation ? SF_ENOMEM : SF_ERROR;
}

/* Ends a graph capture or replay in progress: called before anything reads results, frees or
 * allocates memory, or synchronises. */
static int step_end(cuda_ctx *c)
{
    return kcheck(sf_cuda_graph_end(&c->graphs, c->gemm, c->s), "launching the step's graph");
}

/* The step's work is all queued: record its host time (to the last collective queued outside
 * the graph when use_raw, whose wait for the peers is not host work) and close the step. */
static void step_enqueued(cuda_ctx *c, int use_raw)
{
    if (!c->t_step0) return;
    uint64_t end = use_raw && c->t_raw > c->t_step0 ? c->t_raw : sf_now_ns();
    c->last_host_us = (double)(end - c->t_step0) / 1e3;
    c->last_begin_ns = c->t_step0;
    c->last_enq_ns = end;
    c->t_step0 = 0;
}

static void prof_add(cuda_ctx *c, const sf_op_rec *r, double ms)
{
    int gemv = r->kind == SF_OP_GEMV_NORM || r->kind == SF_OP_GEMV_ADD || r->kind == SF_OP_GEMV_ROPE ||
               r->kind == SF_OP_GEMV_PLAIN;
    int gemm = r->kind == SF_OP_GEMM || r->kind == SF_OP_GEMM_ACC, q = r->kind == SF_OP_QGEMV;
    int64_t m = gemm || q ? r->n[2] : gemv ? r->n[0] : 0, k = gemm || q ? r->n[3] : gemv ? r->n[1] : 0;
    /* rows of the op (tokens; for attention, the split count when it splits; fused GEMVs: 1,
     * or 2 for the SiLU-gated one) */
    int64_t n = q ? r->n[5] : gemm || r->kind == SF_OP_ROPE_KV || r->kind == SF_OP_SILU || r->kind == SF_OP_ROWS
                    ? r->n[1] : r->kind == SF_OP_COLL_NORM ? r->n[0] : r->kind == SF_OP_EMBED || r->kind == SF_OP_RMSNORM || r->kind == SF_OP_ADD ? r->n[2]
                    : gemv ? (r->n[8] > 1 ? r->n[8] : 1) * (1 + (r->kind == SF_OP_GEMV_NORM && r->n[2]))
                    : r->attn.n_split > 1 ? r->attn.n_split : r->attn.T;
    for (int i = 0; i < c->n_prof; i++) {
        struct prof_row *p = &c->prof_rows[i];
        if (p->kind == r->kind && p->m == m && p->k == k && p->n == n) { p->ms += ms; p->count++; return; }
    }
    if (c->n_prof < (int)SF_ARRAY_LEN(c->prof_rows))
        c->prof_rows[c->n_prof++] = (struct prof_row){ r->kind, m, k, n, ms, 1 };
    else
        c->prof_dropped++;
}

static void prof_print(cuda_ctx *c)
{
    static const char *names[] = { "", "embed", "rmsnorm", "gemm", "rope_kv", "attention", "silu_mul", "get_rows",
                                   "collective", "norm_gemv", "gemv_add", "add", "attn_dec", "gemv_rope", "gemm_acc",
                                   "coll_norm", "gemv", "head_put", "qgemv", "qdequant" };
    _Static_assert(SF_ARRAY_LEN(names) == SF_OP_QDEQ + 1, "a name for every op kind");
    double total = 0;
    for (int i = 0; i < c->n_prof; i++) total += c->prof_rows[i].ms;
    fprintf(stderr, "cuda profile (each op timed alone with events; %.1f ms in all):\n", total);
    fprintf(stderr, "  %-10s %7s %7s %5s %9s %9s %6s\n", "op", "m", "k", "n|spl", "calls", "us/call", "share");
    for (int i = 0; i < c->n_prof; i++) {
        struct prof_row *p = &c->prof_rows[i];
        fprintf(stderr, "  %-10s %7lld %7lld %5lld %9ld %9.1f %5.1f%%\n", names[p->kind], (long long)p->m,
                (long long)p->k, (long long)p->n, p->count, 1e3 * p->ms / p->count, 100 * p->ms / total);
    }
    if (c->prof_dropped)
        fprintf(stderr, "  (%ld more ops of further shapes, past the table's %d rows, not timed above)\n", c->prof_dropped,
                (int)SF_ARRAY_LEN(c->prof_rows));
}

static int submit(cuda_ctx *c, const sf_op_rec *r, int capturable, const char *op)
{
    if (!c->prof) return kcheck(sf_cuda_graph_submit(&c->graphs, c->gemm, c->s, r, capturable), op);
    float ms = 0;
    /* the stream held while the op is queued behind the start event, so that the event pair
     * times the op's device work and not its host call (cuBLASLt's is 10-25 us) */
    sf_k_hold(200000, c->s);
    cudaEventRecord(c->prof_ev[0], c->s);
    int rc = kcheck(sf_cuda_graph_submit(&c->graphs, c->gemm, c->s, r, capturable), op);
    cudaEventRecord(c->prof_ev[1], c->s);
    if (!rc && cudaEventSynchronize(c->prof_ev[1]) == cudaSuccess &&
        cudaEventElapsedTime(&ms, c->prof_ev[0], c->prof_ev[1]) == cudaSuccess)
        prof_add(c, r, ms);
    return rc;
}

/* ---- lifecycle ------------------------------------------------------------------------ */
static void cuda_destroy(sf_backend *b)
{
    if (!b) return;
    cuda_ctx *c = CTX(b);
    if (c) {
        cudaSetDevice(c->dev);
        if (c->gemm && c->s) step_end(c);
        if (c->s) cudaStreamSynchronize(c->s);
        sf_cuda_graphs_free(&c->graphs);
        if (sf_k_trace_close(c->trace) > 0) cudaGetLastError();
        if (c->prof) {
            prof_print(c);
            cudaEventDestroy(c->prof_ev[0]);
            cudaEventDestroy(c->prof_ev[1]);
        }
        sf_k_gemm_ctx_free(c->gemm);
        for (int i = 0; i < 2; i++) {
            if (c->pin[i]) cudaFreeHost(c->pin[i]);
            cudaFree(c->stage[i]);
            if (c->stage_done[i]) cudaEventDestroy(c->stage_done[i]);
        }
        if (c->meta_h) cudaFreeHost(c->meta_h);
        cudaFree(c->meta_d);
        if (c->meta_done) cudaEventDestroy(c->meta_done);
        cudaFree(c->kv);
        cudaFree(c->kv_scale);
        cudaFree(c->inv_freq_d);
        cudaFree(c->qscratch);
        cudaFree(c->attn_ws);
        if (c->samp_h) cudaFreeHost(c->samp_h);
        if (c->samp_h2) cudaFreeHost(c->samp_h2);
        for (int i = 0; i < 2; i++)
            if (c->draw[i].done) cudaEventDestroy(c->draw[i].done);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2 && c->gap_ev[0][0]; j++) cudaEventDestroy(c->gap_ev[i][j]);
        cudaFree(c->samp_d);
        cudaFree(c->best_d);
        if (c->score_h) cudaFreeHost(c->score_h);
        cudaFree(c->score_d);
        if (c->fwd_done) cudaEventDestroy(c->fwd_done);
        if (c->s_meta) cudaStreamDestroy(c->s_meta);
        if (c->s) cudaStreamDestroy(c->s);
        free(c);
    }
    free(b);
}

static const sf_hw_info *cuda_hw(sf_backend *b) { return &CTX(b)->hw; }

/* ---- weights ---------------------------------------------------------------------------- */
/* What the device converts (sf_k_to_bf16): the float types and Q8_0. The other GGUF block
 * formats are dequantized on the host while they are staged (host_dequant). */
static int device_converts(sf_dtype t) { return t == SF_DT_F32 || t == SF_DT_F16 || t == SF_DT_BF16 || t == SF_DT_Q8_0; }

/* Rows [r0, r0 + nr) of a block-format view (source pitch sb bytes) into bf16 rows at out. */
typedef struct dq_job {
    const sf_view *v;
    int64_t r0, nr;
    size_t sb;
    uint16_t *out;
    int rc;
} dq_job;

static void *dq_run(void *arg)
{
    dq_job *j = arg;
    j->rc = sf_dequant_rows(j->v->dtype, (const char *)j->v->data + (size_t)j->r0 * j->sb, j->sb, j->nr, j->v->cols,
                            SF_DT_BF16, j->out);
    return NULL;
}

/* The same over up to 16 host threads (a K-quant dequantizes at ~0.3-0.5 G elements/s a core,
 * docs/MODELS.md): rows split evenly, the first share on the calling thread. */
static int host_dequant(const sf_view *v, int64_t r0, int64_t nr, size_t sb, uint16_t *out)
{
    enum { MAX_T = 16 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = (int)SF_MAX(1, SF_MIN(SF_MIN(cores, MAX_T), nr));
    dq_job jobs[MAX_T];
    pthread_t th[MAX_T];
    int started[MAX_T] = { 0 }, rc = SF_OK;
    for (int i = 0; i < n; i++) {
        int64_t a = nr * i / n, b = nr * (i + 1) / n;
        jobs[i] = (dq_job){ v, r0 + a, b - a, sb, out + (size_t)a * (size_t)v->cols, SF_OK };
        if (i > 0) started[i] = !sf_thread_create(&th[i], dq_run, &jobs[i]);
    }
    dq_run(&jobs[0]);
    for (int i = 1; i < n; i++) {
        if (started[i]) pthread_join(th[i], NULL);
        else dq_run(&jobs[i]); /* no thread: do its share here */
    }
    for (int i = 0; i < n; i++)
        if (jobs[i].rc) rc = jobs[i].rc;
    return rc;
}

/* Converts rows x cols of a host view into dst (bf16, ld cols) through the double-buffered
 * staging: copy a chunk of whole rows into pinned memory, send it, convert it on the device
 * (float types, Q8_0), or dequantize it into the stage on the host and send bf16 (the other
 * block formats: a one-time cost at load, docs/MODELS.md). */
static int upload_view(cuda_ctx *c, const sf_view *v, uint16_t *dst, int *slot, const char *what, sf_error *err)
{
    int rc = SF_OK, blk = sf_dtype_block(v->dtype), dev = device_converts(v->dtype);
    size_t rb = sf_dtype_bytes(v->dtype, v->cols);
    if ((!dev && blk == 1) || v->cols % blk || !rb)
        return sf_err(err, SF_EUNSUPPORTED, "CUDA backend: weight %s has dtype %s with %lld columns, which cannot be "
                      "uploaded (F32, F16, BF16 and the GGUF block formats in whole blocks are supported)",
                      what, sf_dtype_name(v->dtype), (long long)v->cols);
    if (!v->data) return sf_err(err, SF_EINVAL, "CUDA backend: weight %s has no data", what);
    size_t sb = v->stride ? sf_dtype_bytes(v->dtype, v->stride) : rb; /* source row pitch */
    if (sb < rb || (v->stride && v->stride % blk))
        return sf_err(err, SF_EINVAL, "CUDA backend: weight %s has row stride %lld for %lld columns", what,
                      (long long)v->stride, (long long)v->cols);
    size_t stage_row = dev ? rb : (size_t)v->cols * 2; /* bytes a row takes in the stage */
    if (stage_row > STAGE_BYTES)
        return sf_err(err, SF_EUNSUPPORTED, "CUDA backend: weight %s has rows of %zu bytes, more than the %zu-byte "
                      "upload stage", what, stage_row, STAGE_BYTES);
    int64_t rows_per = (int64_t)(STAGE_BYTES / stage_row);
    for (int64_t r0 = 0; r0 < v->rows; r0 += rows_per) {
        int64_t nr = SF_MIN(rows_per, v->rows - r0);
        int i = (*slot)++ & 1;
        SF_CUDA_GOTO(cudaEventSynchronize(c->stage_done[i]), err, rc); /* this half is free again */
        if (!dev) {
            if ((rc = host_dequant(v, r0, nr, sb, c->pin[i])))
                return sf_err(err, rc, "CUDA backend: out of host memory dequantizing weight %s", what);
            SF_CUDA_GOTO(cudaMemcpyAsync(dst + r0 * v->cols, c->pin[i], (size_t)nr * stage_row, cudaMemcpyHostToDevice,
                                         c->s), err, rc);
        } else {
            if (sb == rb) memcpy(c->pin[i], (const char *)v->data + (size_t)r0 * rb, (size_t)nr * rb);
            else /* a column slice (tensor parallelism): gather its rows into the stage */
                for (int64_t r = 0; r < nr; r++)
                    memcpy((char *)c->pin[i] + (size_t)r * rb, (const char *)v->data + (size_t)(r0 + r) * sb, rb);
            SF_CUDA_GOTO(cudaMemcpyAsync(c->stage[i], c->pin[i], (size_t)nr * rb, cudaMemcpyHostToDevice, c->s), err, rc);
            SF_CUDA_GOTO((cudaError_t)sf_k_to_bf16(c->stage[i], v->dtype, nr, v->cols, dst + r0 * v->cols, v->cols, c->s),
                         err, rc);
        }
        SF_CUDA_GOTO(cudaEventRecord(c->stage_done[i], c->s), err, rc);
    }
cleanup:
    return rc;
}

/* Rows of a block-format view into the device layout (sf_qdev_pack_row) at dst, pitch bytes a
 * row, through the same double-buffered stage. */
static int upload_qdev(cuda_ctx *c, const sf_view *v, uint8_t *dst, int64_t pitch, int *slot, sf_error *err)
{
    int rc = SF_OK;
    size_t sb = sf_dtype_bytes(v->dtype, v->stride ? v->stride : v->cols);
    int64_t rows_per = (int64_t)(STAGE_BYTES / (size_t)pitch);
    for (int64_t r0 = 0; r0 < v->rows; r0 += rows_per) {
        int64_t nr = SF_MIN(rows_per, v->rows - r0);
        int i = (*slot)++ & 1;
        SF_CUDA_GOTO(cudaEventSynchronize(c->stage_done[i]), err, rc);
        for (int64_t r = 0; r < nr; r++)
            sf_qdev_pack_row(v->dtype, (const char *)v->data + (size_t)(r0 + r) * sb, v->cols,
                             (char *)c->pin[i] + (size_t)r * (size_t)pitch);
        SF_CUDA_GOTO(cudaMemcpyAsync(dst + r0 * pitch, c->pin[i], (size_t)nr * (size_t)pitch, cudaMemcpyHostToDevice,
                                     c->s), err, rc);
        SF_CUDA_GOTO(cudaEventRecord(c->stage_done[i], c->s), err, rc);
    }
cleanup:
    return rc;
}

/* Rows of a quantized weight a GEMM takes at a time: ~64 MiB of bf16, whole 64-row tiles */
#define QCHUNK_BYTES ((size_t)64 << 20)

/* Whether a weight stays in its block formats on the device: every part in a format qgemv.cu
 * reads (not necessarily the same one), a matrix (not a norm's vector), rows that fit the
 * stage, x 16-byte aligned for the GEMV. */
static int keeps_blocks(const cuda_ctx *c, const sf_weight_desc *d, int64_t rows)
{
    if (!c->quant || rows < 2 || d->part[0].cols % 8) return 0;
    for (int i = 0; i < d->n_parts; i++) {
        size_t rb = sf_qdev_row_bytes(d->part[i].dtype, d->part[i].cols); /* 0: not a format qgemv.cu reads */
        if (!rb || rb > STAGE_BYTES) return 0;
    }
    return 1;
}

static void free_qparts(cuda_ctx *c, sf_weight *w)
{
    for (int i = 0; i < w->n_q; i++) dfree(c, w->qp[i].q, (size_t)w->qp[i].rows * (size_t)w->qp[i].pitch);
    w->n_q = 0;
}

static int cuda_weight_new(sf_backend *b, const sf_weight_desc *d, sf_weight **out, sf_error *err)
{
    cuda_ctx *c = CTX(b);
    sf_weight *w = NULL;
    int rc = SF_OK, slot = 0, has_bias = 0;
    *out = NULL;
    if (d->n_parts < 1 || d->n_parts > 4)
        return sf_err(err, SF_EINVAL, "CUDA backend: a weight has %d parts (1..4 allowed)", d->n_parts);
    int64_t rows = 0, cols = d->part[0].cols;
    for (int i = 0; i < d->n_parts; i++) {
        if (d->part[i].cols != cols)
            return sf_err(err, SF_EINVAL, "CUDA backend: fused weight part %d has %lld columns, part 0 has %lld "
                          "(parts are stacked along rows and must agree)", i, (long long)d->part[i].cols, (long long)cols);
        rows += d->part[i].rows;
        if (d->bias[i].data) has_bias = 1;
    }
    if ((rc = step_end(c))) return sf_err(err, rc, "CUDA backend: a step's graph failed (logged above)");
    if (!(w = calloc(1, sizeof *w))) return sf_err(err, SF_ENOMEM, "CUDA backend: out of host memory");
    w->rows = rows;
    w->cols = cols;
    SF_CUDA_GOTO(cudaSetDevice(c->dev), err, rc);
    if (keeps_blocks(c, d, rows)) {
        const int64_t chunk = SF_MAX(64, (int64_t)(QCHUNK_BYTES / ((size_t)cols * 2)) / 64 * 64);
        for (int64_t i = 0, r0 = 0; i < d->n_parts; r0 += d->part[i].rows, i++) {
            if (c->qfuse && i && d->part[i].dtype == d->part[i - 1].dtype) { /* stacked on the part before */
                w->qp[w->n_q - 1].rows += d->part[i].rows;
                continue;
            }
            w->qp[w->n_q++] = (struct qpart){ NULL, d->part[i].dtype, (int64_t)sf_qdev_row_bytes(d->part[i].dtype, cols),
                                              d->part[i].rows, r0, 0 };
        }
        for (int j = 0; j < w->n_q; j++) {
            struct qpart *q = &w->qp[j];
            q->chunk = SF_MIN(q->rows, chunk);
            if ((rc = dmalloc(c, (void **)&q->q, (size_t)q->rows * (size_t)q->pitch, "a weight", err))) goto cleanup;
            size_t need = (size_t)q->chunk * (size_t)cols * 2;
            if (need > c->qscratch_bytes) { /* at load, never in a step */
                dfree(c, c->qscratch, c->qscratch_bytes);
                c->qscratch = NULL;
                c->qscratch_bytes = 0;
                if ((rc = dmalloc(c, (void **)&c->qscratch, need, "the rows of a quantized weight's GEMM", err)))
                    goto cleanup;
                c->qscratch_bytes = need;
            }
        }
    } else if ((rc = dmalloc(c, (void **)&w->d, (size_t)rows * cols * 2, "a weight", err))) goto cleanup;
    if (has_bias) {
        if ((rc = dmalloc(c, (void **)&w->bias, (size_t)rows * 2, "a bias", err))) goto cleanup;
        SF_CUDA_GOTO(cudaMemsetAsync(w->bias, 0, (size_t)rows * 2, c->s), err, rc);
    }
    int64_t r0 = 0;
    for (int i = 0; i < d->n_parts; i++) {
        char what[48];
        snprintf(what, sizeof what, "part %d", i);
        if (w->n_q) {
            if (d->part[i].stride && d->part[i].stride < d->part[i].cols) {
                rc = sf_err(err, SF_EINVAL, "CUDA backend: weight %s has row stride %lld for %lld columns", what,
                            (long long)d->part[i].stride, (long long)d->part[i].cols);
                goto cleanup;
            }
            int j = w->n_q - 1; /* the qpart that holds this part's rows */
            while (w->qp[j].r0 > r0) j--;
            const struct qpart *q = &w->qp[j];
            if ((rc = upload_qdev(c, &d->part[i], q->q + (r0 - q->r0) * q->pitch, q->pitch, &slot, err))) goto cleanup;
        } else if ((rc = upload_view(c, &d->part[i], w->d + r0 * cols, &slot, what, err))) goto cleanup;
        const sf_view *bv = &d->bias[i];
        if (bv->data) {
            if (bv->rows * bv->cols != d->part[i].rows) {
                rc = sf_err(err, SF_EINVAL, "CUDA backend: bias of part %d has %lld values for %lld rows", i,
                            (long long)(bv->rows * bv->cols), (long long)d->part[i].rows);
                goto cleanup;
            }
            sf_view flat = *bv;
            flat.rows = 1;
            flat.cols = bv->rows * bv->cols;
            if ((rc = upload_view(c, &flat, w->bias + r0, &slot, "bias", err))) goto cleanup;
        }
        r0 += d->part[i].rows;
    }
    SF_CUDA_GOTO(cudaStreamSynchronize(c->s), err, rc); /* the host views may go away after return */
    *out = w;
    return SF_OK;
cleanup:
    cudaStreamSynchronize(c->s);
    if (w) {
        dfree(c, w->d, (size_t)rows * cols * 2);
        free_qparts(c, w);
        dfree(c, w->bias, (size_t)rows * 2);
        free(w);
    }
    return rc;
}

static void cuda_weight_free(sf_backend *b, sf_weight *w)
{
    if (!w) return;
    cuda_ctx *c = CTX(b);
    step_end(c);
    cudaStreamSynchronize(c->s);
    dfree(c, w->d, (size_t)w->rows * w->cols * 2);
    free_qparts(c, w);
    dfree(c, w->bias, (size_t)w->rows * 2);
    free(w);
}

/* ---- activations -------------------------------------------------------------------------- */
static int cuda_buf_new(sf_backend *b, int64_t rows, int64_t cols, sf_buf **out, sf_error *err)
{
    cuda_ctx *c = CTX(b);
    *out = NULL;
    if (rows <= 0 || cols <= 0)
        return sf_err(err, SF_EINVAL, "CUDA backend: activation buffer of %lld x %lld", (long long)rows, (long long)cols);
    if (step_end(c)) return sf_err(err, SF_ERROR, "CUDA backend: a step's graph failed (logged above)");
    sf_buf *buf = calloc(1, sizeof *buf);
    if (!buf) return sf_err(err, SF_ENOMEM, "CUDA backend: out of host memory");
    int rc = dmalloc(c, (void **)&buf->d, (size_t)rows * cols * 2, "an activation buffer", err);
    if (rc) { free(buf); return rc; }
    buf->rows = rows;
    buf->cols = cols;
    c->max_rows = SF_MAX(c->max_rows, rows);
    *out = buf;
    return SF_OK;
}

static void cuda_buf_free(sf_backend *b, sf_buf *buf)
{
    if (!buf) return;
    step_end(CTX(b));
    cudaStreamSynchronize(CTX(b)->s);
    dfree(CTX(b), buf->d, (size_t)buf->rows * buf->cols * 2);
    free(buf);
}

/* ---- KV pool ------------------------------------------------------------------------------- */
/* fp32 scales of two INT8 units (one full block's worth) across layers, K and V. */
static size_t kv_block_scale_bytes(const sf_kv_config *k)
{
    return k->int8 ? (size_t)k->n_layers * 2 * 2 * k->n_kv_heads * k->block_size * 4 : 0;
}

static size_t cuda_kv_block_bytes(sf_backend *b, const sf_kv_config *k)
{
    return (size_t)k->n_layers * 2 * k->n_kv_heads * k->block_size * k->head_dim * 2 + kv_block_scale_bytes(k);
}

static int cuda_kv_init(sf_backend *b, const sf_kv_config *k, sf_error *err)
{
    cuda_ctx *c = CTX(b);
    if (k->dtype == SF_DT_I8)
        return sf_err(err, SF_EUNSUPPORTED, "CUDA backend: an all-INT8 KV cache is not a mode; set int8 = 1 for INT8 "
                      "blocks beside bf16 ones (chosen per sequence)");
    if (k->n_layers <= 0 || k->n_blocks <= 0 || k->block_size <= 0 || k->n_kv_heads <= 0 || k->head_dim <= 0 ||
        k->head_dim > SF_K_ATTN_MAX_HD || k->head_dim % 2)
        return sf_err(err, SF_EINVAL, "CUDA backend: KV config layers=%d blocks=%d block_size=%d kv_heads=%d "
                      "head_dim=%d is not valid (head_dim must be even and <= %d)", k->n_layers, k->n_blocks,
                      k->block_size, k->n_kv_heads, k->head_dim, SF_K_ATTN_MAX_HD);
    if (step_end(c) || cudaStreamSynchronize(c->s))
        return sf_err(err, SF_ERROR, "CUDA backend: the previous step failed (logged above)");
    if ((int64_t)k->n_blocks * (k->int8 ? 3 : 1) > INT32_MAX / k->block_size)
        return sf_err(err, SF_EINVAL, "CUDA backend: %d KV blocks of %d tokens overflow the 32-bit slot numbers; "
                      "lower --num-kv-blocks", k->n_blocks, k->block_size);
    if (c->kv) {
        dfree(c, c->kv, c->kv_layer_elems * 2 * 2 * c->kvc.n_layers);
        c->kv = NULL;
    }
    if (c->kv_scale) {
        dfree(c, c->kv_scale, c->kv_layer_rows * 2 * 4 * c->kvc.n_layers);
        c->kv_scale = NULL;
    }
    c->kvc = *k;
    c->kvc.dtype = SF_DT_BF16;
    c->kvc.int8 = 0;
    c->kv_ids = k->n_blocks;
    c->kv_layer_elems = (size_t)k->n_blocks * k->n_kv_heads * k->block_size * k->head_dim;
    c->kv_layer_rows = 2 * (size_t)k->n_blocks * k->n_kv_heads * k->block_size;
    int rc = dmalloc(c, (void **)&c->kv, c->kv_layer_elems * 2 * 2 * k->n_layers, "the KV cache", err);
    if (rc || !k->int8) return rc;
    if ((rc = dmalloc(c, (void **)&c->kv_scale, c->kv_layer_rows * 2 * 4 * k->n_layers, "the INT8 KV scales", err)))
        return rc;
    c->kvc.int8 = 1;
    c->kv_ids = 3 * k->n_blocks;
    return SF_OK;
}

static sf_k_kv layer_kv(cuda_ctx *c, int layer)
{
    sf_k_kv kv;
    memset(&kv, 0, sizeof kv); /* padding too: op records are compared bytewise for graph replays */
    kv.k = c->kv + (size_t)layer * 2 * c->kv_layer_elems;
    kv.v = c->kv + ((size_t)layer * 2 + 1) * c->kv_layer_elems;
    kv.block_size = c->kvc.block_size;
    kv.n_kv_heads = c->kvc.n_kv_heads;
    kv.head_dim = c->kvc.head_dim;
    /* INT8 fields only for steps that touch INT8 blocks: the kernels then take their bf16-only
     * paths (attention_decode.cu: an instance with fewer registers) for every other step */
    if (c->kvc.int8 && c->step_i8) {
        kv.k_scale = c->kv_scale + (size_t)layer * 2 * c->kv_layer_rows;
        kv.v_scale = kv.k_scale + c->kv_layer_rows;
        kv.i8_base = c->kvc.n_blocks;
    }
    return kv;
}

/* Host layout of a swapped-out block (stride kv_block_bytes): a bf16 block is, for each layer, K
 * then V, each [n_kv_heads][block_size][head_dim]; an INT8 block, for each layer, K then V int8
 * rows (half as many bytes), then K then V scales [n_kv_heads][block_size] fp32. */
static int kv_copy(sf_backend *b, const int32_t *blocks, int n, void *host, const void *src_host)
{
    cuda_ctx *c = CTX(b);
    if (!c->kv) return op_fail(SF_EINVAL, "kv_copy", "KV cache not initialised (kv_init first)");
    int rc = step_end(c);
    if (rc) return rc;
    size_t blk = (size_t)c->kvc.n_kv_heads * c->kvc.block_size * c->kvc.head_dim;
    size_t rows = (size_t)c->kvc.n_kv_heads * c->kvc.block_size, stride = cuda_kv_block_bytes(b, &c->kvc);
    for (int i = 0; i < n; i++) {
        int32_t id = blocks[i];
        if (id < 0 || id >= c->kv_ids) return op_fail(SF_EINVAL, "kv_copy", "block id out of range");
        char *h = (host ? (char *)host : (char *)src_host) + (size_t)i * stride;
        for (int l = 0; l < c->kvc.n_layers; l++)
            for (int part = 0; part < (id < c->kvc.n_blocks ? 2 : 4); part++) {
                /* bf16: K, V data; INT8: K, V int8 rows, then K, V scales */
                char *d;
                size_t len;
                if (id < c->kvc.n_blocks) {
                    d = (char *)(c->kv + ((size_t)l * 2 + part) * c->kv_layer_elems + (size_t)id * blk);
                    len = blk * 2;
                } else if (part < 2) {
                    d = (char *)(c->kv + ((size_t)l * 2 + part) * c->kv_layer_elems) + (size_t)(id - c->kvc.n_blocks) * blk;
                    len = blk;
                } else {
                    d = (char *)(c->kv_scale + ((size_t)l * 2 + part - 2) * c->kv_layer_rows +
                                 (size_t)(id - c->kvc.n_blocks) * rows);
                    len = rows * 4;
                }
                cudaError_t e = host ? cudaMemcpyAsync(h, d, len, cudaMemcpyDeviceToHost, c->s)
                                     : cudaMemcpyAsync(d, h, len, cudaMemcpyHostToDevice, c->s);
                if (e != cudaSuccess) return kcheck(e, "kv_copy");
                h += len;
            }
    }
    return kcheck(cudaStreamSynchronize(c->s), "kv_copy");
}

/* kv_copy_blocks: each block with pitched copies. The device side of one block is a column
 * through the layer planes (K and V of every layer at a constant pitch), the host side kv_copy's
 * layout, so a full block is one copy of 2 x n_layers rows and an INT8 block four copies (K rows,
 * V rows, K scales, V scales) of n_layers rows each. Falls back to kv_copy per block when a pitch
 * is past what the device allows (a very large pool). */
static int cuda_kv_copy_blocks(sf_backend *b, const int32_t *blocks, const int32_t *slots, int n, void *host,
                               size_t stride, int out)
{
    cuda_ctx *c = CTX(b);
    if (!c->kv) return op_fail(SF_EINVAL, "kv_copy_blocks", "KV cache not initialised (kv_init first)");
    size_t bb = cuda_kv_block_bytes(b, &c->kvc);
    if (stride < bb) return op_fail(SF_EINVAL, "kv_copy_blocks", "host stride below a block's bytes");
    for (int i = 0; i < n; i++)
        if (blocks[i] < 0 || blocks[i] >= c->kv_ids || slots[i] < 0)
            return op_fail(SF_EINVAL, "kv_copy_blocks", "block id out of range or negative slot");
    int rc = step_end(c);
    if (rc) return rc;
    size_t blk = (size_t)c->kvc.n_kv_heads * c->kvc.block_size * c->kvc.head_dim;
    size_t rows = (size_t)c->kvc.n_kv_heads * c->kvc.block_size, L = (size_t)c->kvc.n_layers;
    size_t plane = c->kv_layer_elems * 2; /* bytes from one layer's K (or V) plane to the next plane */
    int max_pitch = 0;
    if (cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, c->dev) != cudaSuccess) max_pitch = 0;
    int pitched = max_pitch > 0 && 2 * plane <= (size_t)max_pitch && 2 * c->kv_layer_rows * 4 <= (size_t)max_pitch;
    enum cudaMemcpyKind kind = out ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    for (int i = 0; i < n; i++) {
        int32_t id = blocks[i];
        char *h = (char *)host + (size_t)slots[i] * stride;
        if (!pitched) {
            rc = out ? kv_copy(b, &id, 1, h, NULL) : kv_copy(b, &id, 1, NULL, h);
            if (rc) return rc;
            continue;
        }
        cudaError_t e;
        if (id < c->kvc.n_blocks) { /* rows (l, part) at plane pitch; host: 2 x blk bf16 per layer, K then V */
            char *d = (char *)(c->kv + (size_t)id * blk);
            size_t w = blk * 2;
            e = out ? cudaMemcpy2DAsync(h, w, d, plane, w, 2 * L, kind, c->s)
                    : cudaMemcpy2DAsync(d, plane, h, w, w, 2 * L, kind, c->s);
        } else { /* per layer on the host: K rows, V rows (blk bytes each), K scales, V scales (rows x 4) */
            size_t u = (size_t)(id - c->kvc.n_blocks), hp = 2 * blk + 2 * rows * 4;
            e = cudaSuccess;
            for (int part = 0; part < 4 && e == cudaSuccess; part++) {
                char *d;
                size_t w, dp, ho;
                if (part < 2) {
                    d = (char *)(c->kv + (size_t)part * c->kv_layer_elems) + u * blk;
                    w = blk, dp = 2 * plane, ho = (size_t)part * blk;
                } else {
                    d = (char *)(c->kv_scale + (size_t)(part - 2) * c->kv_layer_rows + u * rows);
                    w = rows * 4, dp = 2 * c->kv_layer_rows * 4, ho = 2 * blk + (size_t)(part - 2) * rows * 4;
                }
                e = out ? cudaMemcpy2DAsync(h + ho, hp, d, dp, w, L, kind, c->s)
                        : cudaMemcpy2DAsync(d, dp, h + ho, hp, w, L, kind, c->s);
            }
        }
        if (e != cudaSuccess) return kcheck(e, "kv_copy_blocks");
    }
    return kcheck(cudaStreamSynchronize(c->s), "kv_copy_blocks");
}

static int cuda_kv_copy_out(sf_backend *b, const int32_t *blocks, int n, void *host)
{
    return kv_copy(b, blocks, n, host, NULL);
}

static int cuda_kv_copy_in(sf_backend *b, const int32_t *blocks, int n, const void *host)
{
    return kv_copy(b, blocks, n, NULL, host);
}

/* Page-locked host memory, portable across devices: copies from it are real DMA at link speed
 * and can be asynchronous. */
static int cuda_host_alloc(sf_backend *b, size_t bytes, void **out, sf_error *err)
{
    *out = NULL;
    cudaError_t e = cudaSetDevice(CTX(b)->dev);
    if (e == cudaSuccess) e = cudaHostAlloc(out, bytes ? bytes : 16, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        *out = NULL;
        return sf_err(err, SF_ENOMEM, "CUDA: cannot pin %.1f MiB of host memory (%s); ask for less (e.g. a smaller "
                      "--swap-space) or raise the locked-memory limit (ulimit -l)", bytes / 1048576.0, cudaGetErrorString(e));
    }
    return SF_OK;
}

static void cuda_host_free(sf_backend *b, void *p)
{
    if (p) cudaFreeHost(p);
}

/* ---- one step ------------------------------------------------------------------------------ */
/* Lays out bt's metadata at h (pinned; its device copy will be at d, cap ints at most) and points
 * the ctx's step fields (T ... n_split, cuda_meta) at it; *used: the ints it takes. bt has
 * been checked (batch_begin). */
static int plan_meta(cuda_ctx *c, const sf_batch *bt, int32_t *h, int32_t *d, size_t cap, size_t *used);

/* The device's idle gap after a draw: its first event after the draw and its ids' way back
 * (end 0), its second before the next step's metadata copy (end 1); read when both have run.
 * The events are made at the first draw; a full ring skips measuring until a pair is read. */
static void gap_mark(cuda_ctx *c, int end)
{
    if (!c->gap_ev[0][0]) {
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 2; j++)
                if (cudaEventCreate(&c->gap_ev[i][j]) != cudaSuccess) {
                    cudaGetLastError();
                    return; /* no measurement, nothing else changes */
                }
    }
    if (end == 0 && !c->gap_open && (c->gap_w + 1) % 4 != c->gap_r) {
        c->gap_open = cudaEventRecord(c->gap_ev[c->gap_w][0], c->s) == cudaSuccess;
    } else if (end == 1 && c->gap_open) {
        c->gap_open = 0;
        if (cudaEventRecord(c->gap_ev[c->gap_w][1], c->s) == cudaSuccess) c->gap_w = (c->gap_w + 1) % 4;
    }
}

static void gap_read(cuda_ctx *c)
{
    while (c->gap_r != c->gap_w && cudaEventQuery(c->gap_ev[c->gap_r][1]) == cudaSuccess) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, c->gap_ev[c->gap_r][0], c->gap_ev[c->gap_r][1]) == cudaSuccess) {
            c->gap_us += ms * 1e3;
            c->gap_n++;
        }
        c->gap_r = (c->gap_r + 1) % 4;
    }
    cudaGetLastError(); /* cudaErrorNotReady of the query */
}

/* Async scheduling: the batch's tokens that the last draw gives (bt->src_row) are copied on the
 * device from its ids, in runs of consecutive rows: one copy for a decode step whose rows follow
 * the step before it row for row. After the metadata's copy, before the step's graph. */
static int tokens_from_draw(cuda_ctx *c, const sf_batch *bt)
{
    for (int t = 0; t < bt->n_tokens; t++) {
        int r = bt->src_row[t], n = 1;
        if (r < 0) continue;
        if (r >= c->n_last || !c->last_ids_d)
            return op_fail(SF_EINVAL, "batch_begin", "a token taken from a row the last draw did not have");
        while (t + n < bt->n_tokens && bt->src_row[t + n] == r + n && r + n < c->n_last) n++;
        cudaError_t e = cudaMemcpyAsync(c->tokens_d + t, c->last_ids_d + r, (size_t)n * 4, cudaMemcpyDeviceToDevice, c->s);
        if (e != cudaSuccess) return kcheck(e, "batch_begin (tokens from the last draw)");
        t += n - 1;
    }
    return SF_OK;
}

static int cuda_batch_begin(sf_backend *b, const sf_batch *bt)
{
    cuda_ctx *c = CTX(b);
    int T = bt->n_tokens, S = bt->n_seqs, L = bt->n_logits, rc;
    if ((rc = step_end(c))) return rc;
    c->t_step0 = sf_now_ns();
    if (T <= 0 || S <= 0 || L < 0 || (S > 0 && bt->max_blocks <= 0))
        return op_fail(SF_EINVAL, "batch_begin", "empty batch or no block table");
    c->step_i8 = 0;
    if (c->kv) {
        /* checks here keep bad ids from turning into wild device reads */
        for (int s = 0; s < S; s++)
            for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t++) {
                int p = bt->pos[t];
                if (t < 0 || t >= T || p < 0 || p >= bt->seq_ctx[s] || p / c->kvc.block_size >= bt->max_blocks)
                    return op_fail(SF_EINVAL, "batch_begin", "token position outside its sequence's context or block table");
            }
        for (int s = 0; s < S; s++) {
            int nb = (bt->seq_ctx[s] + c->kvc.block_size - 1) / c->kvc.block_size;
            if (nb > bt->max_blocks) return op_fail(SF_EINVAL, "batch_begin", "sequence context longer than its block table");
            for (int i = 0; i < nb; i++) {
                int32_t id = bt->block_table[(size_t)s * bt->max_blocks + i];
                if (id < 0 || id >= c->kv_ids) return op_fail(SF_EINVAL, "batch_begin", "block id out of range");
                c->step_i8 |= id >= c->kvc.n_blocks;
            }
        }
        for (int t = 0; t < T; t++)
            if (bt->slot[t] >= c->kv_ids * c->kvc.block_size)
                return op_fail(SF_EINVAL, "batch_begin", "KV slot beyond the pool");
            else c->step_i8 |= bt->slot[t] >= c->kvc.n_blocks * c->kvc.block_size;
    }
    for (int i = 0; i < L; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= T) return op_fail(SF_EINVAL, "batch_begin", "logit row outside the batch");
    if (cudaEventSynchronize(c->meta_done) != cudaSuccess) return kcheck(cudaGetLastError(), "batch_begin");
    size_t used = 0;
    if ((rc = plan_meta(c, bt, c->meta_h, c->meta_d, META_INTS, &used))) return rc;
    if (c->gap_open) gap_mark(c, 1); /* the device's first work of the step comes next */
    int drawn = bt->src_row && c->draw_in_tokens >= T;
    for (int t = 0; t < T && drawn; t++) drawn = bt->src_row[t] == t;
    const size_t skip = drawn ? (size_t)T : 0; /* the token slots the draw filled */
    /* beside the draw only when it wrote no more ids than the step has tokens: past them the
     * copy writes the positions */
    const int side = drawn && c->draw_in_tokens == T && c->s_meta && c->fwd_ready;
    cudaStream_t ms = side ? c->s_meta : c->s;
    cudaError_t e = side ? cudaStreamWaitEvent(ms, c->fwd_done, 0) : cudaSuccess;
    c->draw_in_tokens = c->fwd_ready = 0;
    if (e == cudaSuccess && used > skip)
        e = cudaMemcpyAsync(c->meta_d + skip, c->meta_h + skip, (used - skip) * 4, cudaMemcpyHostToDevice, ms);
    if (e == cudaSuccess) e = cudaEventRecord(c->meta_done, ms);
    if (e == cudaSuccess && side) e = cudaStreamWaitEvent(c->s, c->meta_done, 0);
    if (e != cudaSuccess) return kcheck(e, "batch_begin");
    if (bt->src_row && !drawn && (rc = tokens_from_draw(c, bt))) return rc;
    /* the half sample_start will take (it flips them per draw when deferred), free unless two
     * draws are queued (then sample_start refuses this one) */
    const sf_sample_row *dr = bt->draw_row;
    const int half = c->samp_defer && c->samp_flip, hot = dr && !sf_sample_greedy(dr->temperature, dr->top_k);
    c->head_arm = c->head_put = 0;
    if (c->head_draw && dr && T == 1 && L == 1 && !bt->n_scored && (!c->samp_defer || c->n_draws < 2) &&
        (!hot || (half ? c->samp_h2d : c->samp_hd))) {
        if (hot) memcpy(half ? c->samp_h2 : c->samp_h, dr, sizeof *dr);
        c->head_arm = 1 + half + 2 * hot;
    }
    /* INT8 blocks change which kernels the step records (step_i8), so they are part of the key */
    int64_t key[SF_GRAPH_KEY] = { T, S, L + ((int64_t)c->head_arm << 32), bt->max_blocks,
                                  c->n_split + ((int64_t)c->dec_kernel << 16),
                                  2 * (int64_t)c->n_tiles + c->step_i8 + ((int64_t)c->n_dec << 32) };
    sf_cuda_graph_begin(&c->graphs, c->s, key);
    return SF_OK;
}

static int plan_meta(cuda_ctx *c, const sf_batch *bt, int32_t *h, int32_t *d, size_t cap, size_t *used)
{
    int T = bt->n_tokens, S = bt->n_seqs, L = bt->n_logits;
    size_t need = (size_t)T * 4 + (size_t)S * bt->max_blocks + (size_t)L + 2 * ((size_t)S + T / SF_K_PREFILL_TILE + 1) +
                  (size_t)S;
    if (need > cap)
        return op_fail(SF_EINVAL, "batch_begin", "batch metadata exceeds 4 MiB: fewer sequences or shorter block tables");
    memcpy(h, bt->tokens, (size_t)T * 4);
    memcpy(h + T, bt->pos, (size_t)T * 4);
    memcpy(h + 2 * T, bt->slot, (size_t)T * 4);
    int32_t *ts = h + 3 * T;
    int max_ctx = 1;
    for (int s = 0; s < S; s++)
        for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1] && t < T; t++) ts[t] = s;
    for (int t = 0; t < T; t++) max_ctx = SF_MAX(max_ctx, bt->pos[t] + 1);
    memcpy(h + 4 * T, bt->block_table, (size_t)S * bt->max_blocks * 4);
    if (L) memcpy(h + 4 * T + (size_t)S * bt->max_blocks, bt->logit_rows, (size_t)L * 4);
    /* Prefill tiles when some sequence brings >= 16 tokens: runs of <= 64 consecutive tokens of
     * one sequence with consecutive positions (anything else keeps the CUDA-core kernel). */
    int32_t *tiles = h + 4 * T + (size_t)S * bt->max_blocks + L;
    int n_tiles = 0, longest = 0, consecutive = 1, n_dec = 0;
    for (int s = 0; s < S; s++) {
        longest = SF_MAX(longest, bt->seq_start[s + 1] - bt->seq_start[s]);
        for (int t = bt->seq_start[s] + 1; t < bt->seq_start[s + 1]; t++) consecutive &= bt->pos[t] == bt->pos[t - 1] + 1;
    }
    /* The single-token sequences of such a step (decodes beside a prefill) go to the decode
     * kernel over their rows (attention_decode_stream.cu, sf_k_attn.rows), not to 1-row query tiles
     * of the prefill kernel (64 rows of tensor work per token and head): their rows are collected
     * past the largest tile list, then moved behind the tiles. */
    const int kbs = c->kvc.block_size, dec_ok = c->mixed_decode && c->attn_decode && c->kvc.dtype == SF_DT_BF16 &&
                    (c->kvc.head_dim == 64 || c->kvc.head_dim == 128) && kbs >= 16 && (kbs & (kbs - 1)) == 0;
    int32_t *dec_rows = tiles + 2 * ((size_t)S + T / SF_K_PREFILL_TILE + 1);
    if (longest >= 16 && consecutive)
        for (int s = 0; s < S; s++)
            for (int t = bt->seq_start[s]; t < bt->seq_start[s + 1]; t += SF_K_PREFILL_TILE) {
                if (dec_ok && bt->seq_start[s + 1] - bt->seq_start[s] == 1) {
                    dec_rows[n_dec++] = t;
                    continue;
                }
                tiles[2 * n_tiles] = t;
                tiles[2 * n_tiles + 1] = SF_MIN(SF_K_PREFILL_TILE, bt->seq_start[s + 1] - t);
                n_tiles++;
            }
    if (n_dec) memmove(tiles + 2 * n_tiles, dec_rows, (size_t)n_dec * 4);
    *used = 4 * (size_t)T + (size_t)S * bt->max_blocks + L + 2 * (size_t)n_tiles + n_dec;
    c->T = T; c->S = S; c->L = L; c->max_blocks = bt->max_blocks; c->max_ctx = max_ctx;
    c->tokens_h = h;
    c->tokens_d = d;
    c->pos_d = d + T;
    c->slot_d = d + 2 * T;
    c->tok_seq_d = d + 3 * T;
    c->block_table_d = d + 4 * T;
    c->logit_rows_d = c->block_table_d + (size_t)S * bt->max_blocks;
    c->tiles_d = c->logit_rows_d + L;
    c->n_tiles = n_tiles;
    c->n_dec = n_dec;
    c->dec_rows_d = c->tiles_d + 2 * n_tiles;
    /* Split the keys of decode steps: when (tokens x kv heads) blocks cannot fill the SMs, or (the
     * batch kernel) to make the blocks come out in whole waves. */
    int sms = c->hw.n_cores > 0 ? c->hw.n_cores : 1, work = T * SF_MAX(1, c->kvc.n_kv_heads);
    c->n_split = 1;
    c->dec_kernel = 0;
    if (c->attn_decode && (c->kvc.head_dim == 64 || c->kvc.head_dim == 128)) {
        /* the decode dispatcher's own choice for the kernel it will run (attention_decode.cu) */
        if (!n_tiles)
            c->n_split = sf_k_attention_decode_plan(T, c->kvc.n_kv_heads, c->kvc.group, c->kvc.head_dim, max_ctx,
                                                    c->kvc.block_size, c->step_i8, sms, &c->dec_kernel);
    } else if (work < sms && max_ctx > 64 && !n_tiles) { /* one 64-key tile per block, up to 4 blocks per SM */
        c->n_split = SF_MIN((max_ctx + 63) / 64, (4 * sms + work - 1) / work);
        c->n_split = SF_MAX(1, SF_MIN(c->n_split, MAX_SPLIT));
    }
    c->dec_split = n_dec ? sf_k_attention_decode_split(n_dec, c->kvc.n_kv_heads, c->kvc.head_dim, max_ctx,
                                                       c->kvc.block_size, c->step_i8, sms, 3)
                         : 0;
    return SF_OK;
}

static int cuda_embed(sf_backend *b, const sf_weight *emb, sf_buf *x)
{
    cuda_ctx *c = CTX(b);
    if (x->rows < c->T || x->cols != emb->cols) return op_fail(SF_EINVAL, "embed", "output buffer shape does not match");
    for (int t = 0; t < c->T; t++)
        if (c->tokens_h[t] < 0 || c->tokens_h[t] >= emb->rows) {
            SF_LOGE("cuda backend: embed: token id %d at batch index %d outside the vocabulary (0..%lld)",
                    c->tokens_h[t], t, (long long)emb->rows - 1);
            return SF_EINVAL;
        }
    sf_op_rec r = { 0 };
    if (emb->n_q == 1) { /* the rows of a table kept in its block format */
        r.kind = SF_OP_QDEQ;
        r.p[0] = emb->qp[0].q; r.p[1] = c->tokens_d; r.p[2] = x->d;
        r.n[0] = emb->qp[0].t; r.n[1] = emb->qp[0].pitch; r.n[2] = emb->cols; r.n[4] = c->T; r.n[5] = x->cols;
        return submit(c, &r, 1, "embed");
    }
    if (emb->n_q) return op_fail(SF_EINVAL, "embed", "an embedding table of several parts");
    r.kind = SF_OP_EMBED;
    r.p[0] = emb->d; r.p[1] = c->tokens_d; r.p[2] = x->d;
    r.n[0] = emb->rows; r.n[1] = emb->cols; r.n[2] = c->T; r.n[3] = x->cols;
    return submit(c, &r, 1, "embed");
}

static int cuda_rmsnorm(sf_backend *b, sf_buf *x, const sf_buf *add, const sf_weight *w, float eps, int n, sf_buf *out)
{
    cuda_ctx *c = CTX(b);
    if (w->rows * w->cols > x->cols || n > x->rows || n > out->rows || out->cols < w->rows * w->cols ||
        (add && (add->rows < n || add->cols < w->rows * w->cols)))
        return op_fail(SF_EINVAL, "rmsnorm", "buffer shapes do not match the norm weight");
    int d = (int)(w->rows * w->cols);
    sf_op_rec r = { 0 };
    r.kind = SF_OP_RMSNORM;
    r.p[0] = x->d; r.p[1] = add ? add->d : NULL; r.p[2] = w->d; r.p[3] = out->d;
    r.n[0] = x->cols; r.n[1] = add ? add->cols : 0; r.n[2] = n; r.n[3] = d; r.n[4] = out->cols;
    r.f = eps;
    return submit(c, &r, 1, "rmsnorm");
}

/* The record of qgemv.cu's GEMV over part q of a weight of `cols` columns: n rows of x (with
 * norm, x's RMSNorm times it) into y rows ldy apart; bias and y as the mode wants them (the
 * part's own, or the whole weight's for RoPE, whose fields the caller adds). */
static sf_op_rec qgemv_rec(const sf_buf *x, const struct qpart *q, int64_t cols, int n, const sf_weight *norm, float eps,
                           const uint16_t *bias, uint16_t *y, int64_t ldy)
{
    sf_op_rec r;
    memset(&r, 0, sizeof r); /* padding too: graphs compare records whole */
    r.kind = SF_OP_QGEMV;
    r.p[0] = x->d; r.p[1] = q->q; r.p[2] = bias; r.p[3] = y; r.p[4] = norm ? norm->d : NULL;
    r.n[0] = q->t; r.n[1] = q->pitch; r.n[2] = q->rows; r.n[3] = cols; r.n[4] = x->cols; r.n[5] = n; r.n[6] = ldy;
    r.f = eps;
    return r;
}

/* y (+)= x' W^T over a weight kept in its block formats, a launch a part into its columns of y:
 * up to c->qgemv_rows rows in qgemv.cu, more through cuBLASLt over a part's `chunk` rows at
 * a time, dequantized into qscratch (add: the caller's scratch buffer and an add). The GEMV
 * also takes x' = RMSNorm(x) * norm (norm given) and the SiLU-gated product of a
 * gate/up weight of one part (glu). */
static int qmatmul(cuda_ctx *c, const sf_buf *x, const sf_weight *w, int n, const sf_weight *norm, float eps, int glu,
                   sf_buf *y, int add, const char *op)
{
    if (n > c->qgemv_rows && (add || norm || glu))
        return op_fail(SF_EINVAL, op, "a quantized weight adds into y, normalises x or gates only in the GEMV's steps");
    if (glu && (w->n_q != 1 || add)) return op_fail(SF_EINVAL, op, "a gated quantized GEMV takes one part and no add");
    for (int i = 0; i < w->n_q; i++) { /* each part into its columns of y */
        const struct qpart *q = &w->qp[i];
        const uint16_t *bias = w->bias ? w->bias + q->r0 : NULL;
        sf_op_rec r = { 0 };
        int rc;
        if (n <= c->qgemv_rows) {
            r = qgemv_rec(x, q, w->cols, n, norm, eps, bias, y->d + q->r0, y->cols);
            r.n[7] = add; r.n[8] = glu;
            if ((rc = submit(c, &r, 1, op))) return rc;
            continue;
        }
        for (int64_t r0 = 0; r0 < q->rows; r0 += q->chunk) {
            int cr = (int)SF_MIN(q->chunk, q->rows - r0);
            const uint16_t *b = bias ? bias + r0 : NULL;
            sf_op_rec d = { 0 };
            d.kind = SF_OP_QDEQ;
            d.p[0] = q->q; d.p[2] = c->qscratch;
            d.n[0] = q->t; d.n[1] = q->pitch; d.n[2] = w->cols; d.n[3] = r0; d.n[4] = cr; d.n[5] = w->cols;
            if ((rc = submit(c, &d, 1, op))) return rc;
            if ((rc = kcheck(sf_k_gemm_prepare(c->gemm, b, n, cr, (int)w->cols, x->cols, y->cols, 0, c->s), op))) return rc;
            memset(&r, 0, sizeof r);
            r.kind = SF_OP_GEMM;
            r.p[0] = x->d; r.p[1] = c->qscratch; r.p[2] = b; r.p[3] = y->d + q->r0 + r0;
            r.n[0] = x->cols; r.n[1] = n; r.n[2] = cr; r.n[3] = w->cols; r.n[4] = y->cols;
            if ((rc = submit(c, &r, sf_k_gemm_ready(c->gemm, b, n, cr, (int)w->cols, x->cols, y->cols), op))) return rc;
        }
    }
    return SF_OK;
}

static int cuda_matmul(sf_backend *b, const sf_buf *x, const sf_weight *w, int n, sf_buf *y)
{
    cuda_ctx *c = CTX(b);
    if (x->cols < w->cols || y->cols < w->rows || n > x->rows || n > y->rows)
        return op_fail(SF_EINVAL, "matmul", "buffer shapes do not match the weight");
    if (w->n_q) return qmatmul(c, x, w, n, NULL, 0, 0, y, 0, "matmul");
    sf_op_rec r = { 0 };
    if (n == 1 && c->gemv_plain && w->rows <= 32768 && x->d != y->d && sf_k_gemv_fused_ok(x->d, w->d, (int)w->cols)) {
        /* one row (the O and down projections of the TP ranks that do not add the residual):
         * the persistent-warp GEMV, a programmatic dependent like its fused neighbours */
        r.kind = SF_OP_GEMV_PLAIN;
        r.p[0] = x->d; r.p[2] = w->d; r.p[3] = w->bias; r.p[4] = y->d;
        r.n[0] = w->rows; r.n[1] = w->cols;
        return submit(c, &r, 1, "matmul");
    }
    r.kind = SF_OP_GEMM;
    r.p[0] = x->d; r.p[1] = w->d; r.p[2] = w->bias; r.p[3] = y->d;
    r.n[0] = x->cols; r.n[1] = n; r.n[2] = w->rows; r.n[3] = w->cols; r.n[4] = y->cols;
    /* the shape's first use outside a capture tunes its algorithm here, not inside the op */
    int rc = n > 8 ? kcheck(sf_k_gemm_prepare(c->gemm, w->bias, n, (int)w->rows, (int)w->cols, x->cols, y->cols, 0, c->s),
                            "matmul (tuning)") : SF_OK;
    if (rc) return rc;
    return submit(c, &r, sf_k_gemm_ready(c->gemm, w->bias, n, (int)w->rows, (int)w->cols, x->cols, y->cols), "matmul");
}

static int ensure_rope(cuda_ctx *c, const sf_rope *r)
{
    int n = r->rot_dim / 2;
    if (r->rot_dim <= 0 || r->rot_dim > r->head_dim || r->rot_dim % 2 || n > (int)SF_ARRAY_LEN(c->inv_freq_h))
        return op_fail(SF_EINVAL, "rope", "rot_dim must be even, positive and <= head_dim");
    if (n == c->inv_freq_n && !memcmp(c->inv_freq_h, r->inv_freq, (size_t)n * 4)) return SF_OK;
    int rc = kcheck(sf_cuda_graph_bail(&c->graphs, c->gemm, c->s), "rope");
    if (rc) return rc;
    memcpy(c->inv_freq_h, r->inv_freq, (size_t)n * 4);
    c->inv_freq_n = n;
    /* rare (once per model): a synchronous copy keeps the host array free to change */
    return kcheck(cudaMemcpy(c->inv_freq_d, c->inv_freq_h, (size_t)n * 4, cudaMemcpyHostToDevice), "rope");
}

static int cuda_rope_kv(sf_backend *b, sf_buf *qkv, int layer, int H, int Hkv, const sf_rope *r)
{
    cuda_ctx *c = CTX(b);
    int rc;
    if (!c->kv) return op_fail(SF_EINVAL, "rope_kv", "KV cache not initialised (kv_init first)");
    if (layer < 0 || layer >= c->kvc.n_layers || Hkv != c->kvc.n_kv_heads || r->head_dim != c->kvc.head_dim ||
        qkv->cols < (int64_t)(H + 2 * Hkv) * r->head_dim || qkv->rows < c->T)
        return op_fail(SF_EINVAL, "rope_kv", "layer, heads or qkv shape do not match the KV cache");
    if ((rc = ensure_rope(c, r))) return rc;
    sf_op_rec rec = { 0 };
    rec.kind = SF_OP_ROPE_KV;
    rec.p[0] = qkv->d; rec.p[1] = c->pos_d; rec.p[2] = c->slot_d; rec.p[3] = c->inv_freq_d;
    rec.n[0] = qkv->cols; rec.n[1] = c->T; rec.n[2] = H; rec.n[3] = Hkv; rec.n[4] = r->head_dim; rec.n[5] = r->rot_dim;
    rec.n[6] = r->interleaved;
    rec.kv = layer_kv(c, layer);
    return submit(c, &rec, 1, "rope_kv");
}

static int cuda_attention(sf_backend *b, const sf_buf *qkv, int layer, int H, int Hkv, const sf_rope *r, sf_buf *out)
{
    cuda_ctx *c = CTX(b);
    int hd = r->head_dim;
    if (!c->kv) return op_fail(SF_EINVAL, "attention", "KV cache not initialised (kv_init first)");
    if (layer < 0 || layer >= c->kvc.n_layers || Hkv != c->kvc.n_kv_heads || hd != c->kvc.head_dim || H % Hkv ||
        H / Hkv > SF_K_ATTN_MAX_GROUP || out->cols < (int64_t)H * hd || out->rows < c->T ||
        qkv->cols < (int64_t)(H + 2 * Hkv) * hd)
        return op_fail(SF_EINVAL, "attention", "heads or shapes do not match the KV cache (group size <= 16)");
    int sms = c->hw.n_cores > 0 ? c->hw.n_cores : 1, n_split = c->n_split, capturable = 1;
    if (n_split > 1 || c->n_dec) {
        size_t need = SF_MAX((size_t)c->T * H * n_split * (hd + 2), (size_t)c->n_dec * H * c->dec_split * (hd + 2));
        if (need > c->attn_ws_floats || (size_t)c->T * Hkv * SF_K_ATTN_CNT_PER_KVH > c->attn_cnt) {
            /* sized once for the worst split case this model can hit (work < sms), at warm-up */
            size_t cap = (size_t)SF_MIN(c->max_rows, sms) * H * MAX_SPLIT * (hd + 2);
            sf_error err;
            int rc = kcheck(sf_cuda_graph_bail(&c->graphs, c->gemm, c->s), "attention");
            if (rc) return rc;
            capturable = 0;
            cap = SF_MAX(cap, need);
            size_t n_cnt = (size_t)SF_MAX(c->max_rows, c->T) * Hkv * SF_K_ATTN_CNT_PER_KVH;
            dfree(c, c->attn_ws, c->attn_ws_floats * 4 + c->attn_cnt * 4);
            c->attn_ws = NULL;
            c->attn_ws_floats = c->attn_cnt = 0;
            if (dmalloc(c, (void **)&c->attn_ws, cap * 4 + n_cnt * 4, "the attention workspace", &err)) {
                SF_LOGE("cuda backend: %s", err.msg);
                return err.code;
            }
            if ((rc = kcheck(cudaMemsetAsync(c->attn_ws + cap, 0, n_cnt * 4, c->s), "attention"))) return rc;
            c->attn_cnt = n_cnt;
            c->attn_ws_floats = cap;
        }
    }
    sf_op_rec rec = { 0 };
    rec.kind = SF_OP_ATTN;
    rec.attn = (sf_k_attn){
        .q = qkv->d, .ld_q = qkv->cols, .out = out->d, .ld_out = out->cols, .T = c->T, .H = H, .Hkv = Hkv, .hd = hd,
        .scale = r->attn_scale, .pos = c->pos_d, .tok_seq = c->tok_seq_d, .block_table = c->block_table_d,
        .max_blocks = c->max_blocks, .kv = layer_kv(c, layer), .ws = c->attn_ws,
        .n_split = n_split, .counters = n_split > 1 ? (unsigned *)(c->attn_ws + c->attn_ws_floats) : NULL, .tiles = c->tiles_d, .n_tiles = c->n_tiles,
        .kernel = c->dec_kernel,
    };
    if (c->attn_decode && c->kvc.dtype == SF_DT_BF16 && sf_k_attention_decode_ok(&rec.attn)) rec.kind = SF_OP_ATTN_DEC;
    int rc = submit(c, &rec, capturable, "attention");
    if (rc || !c->n_dec) return rc;
    /* the step's single-token sequences (batch_begin left them out of the tiles) */
    rec.kind = SF_OP_ATTN_DEC;
    rec.attn.T = c->n_dec;
    rec.attn.rows = c->dec_rows_d;
    rec.attn.n_split = c->dec_split;
    rec.attn.counters = (unsigned *)(c->attn_ws + c->attn_ws_floats);
    rec.attn.tiles = NULL;
    rec.attn.n_tiles = 0;
    rec.attn.kernel = 3; /* the stream kernel: the only one that takes rows */
    if (!sf_k_attention_decode_stream_ok(&rec.attn))
        return op_fail(SF_EINVAL, "attention", "the decode kernel refuses the step's single-token sequences");
    return submit(c, &rec, capturable, "attention (decodes)");
}

static int cuda_silu_mul(sf_backend *b, const sf_buf *gu, int n, int f, sf_buf *out)
{
    if (gu->cols < 2 * (int64_t)f || out->cols < f || n > gu->rows || n > out->rows)
        return op_fail(SF_EINVAL, "silu_mul", "buffer shapes do not match 2*f / f columns");
    sf_op_rec r = { 0 };
    r.kind = SF_OP_SILU;
    r.p[0] = gu->d; r.p[1] = out->d;
    r.n[0] = gu->cols; r.n[1] = n; r.n[2] = f; r.n[3] = out->cols;
    return submit(CTX(b), &r, 1, "silu_mul");
}

/* ---- fused ops (batch 1 through gemv_fused.cu, 2-6 rows through gemv_rows.cu; other batches
 * run the plain ops) ------------------------------------------------------------------------ */
/* Steps of up to this many rows take gemv_rows.cu where their shapes fit it. Not 7 or 8 (H200,
 * docs/PERFORMANCE.md): Llama-3-8B's decode at batch 8 was slower so in session 32 (5.07 against
 * 4.95 ms a step) and no faster in session 34 with the 5-stage rings (batch 7 4.97 both ways,
 * batch 8 4.86 against 4.89): x's 7-8 rows (56-64 KiB) leave QKV's ring at 63-64% of the copy
 * bandwidth, and the down projection's x (201-229 KiB) leaves it 3 stages of 4 loads (65% at 7
 * rows) or does not fit (8 rows: the plain ops). */
#define ROWS_MAX 6
static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

static int cuda_norm_matmul(sf_backend *b, const sf_buf *x, const sf_weight *norm, float eps, const sf_weight *w, int n,
                            int glu, sf_buf *tmp_x, sf_buf *tmp_y, sf_buf *y)
{
    cuda_ctx *c = CTX(b);
    int64_t k = w->cols, out_cols = glu ? w->rows / 2 : w->rows;
    if (norm->rows * norm->cols != k || x->cols < k || n > x->rows || n > y->rows || y->cols < out_cols ||
        (glu && w->rows % 2))
        return op_fail(SF_EINVAL, "norm_matmul", "buffer shapes do not match the norm and weight (glu: even rows)");
    if (!w->n_q && n == 1 && k <= SF_K_GEMV_NORM_MAX_K && sf_k_gemv_fused_ok(x->d, w->d, (int)k)) {
        sf_op_rec r = { 0 };
        r.kind = SF_OP_GEMV_NORM;
        r.p[0] = x->d; r.p[1] = norm->d; r.p[2] = w->d; r.p[3] = w->bias; r.p[4] = y->d;
        r.n[0] = w->rows; r.n[1] = k; r.n[2] = glu;
        r.f = eps;
        const int best = c->head_arm && !c->head_put && !glu &&
                         sf_k_gemv_norm_best_ok(x->d, norm->d, w->d, (int)w->rows, (int)k);
        char *hd = (c->head_arm - 1) & 1 ? c->samp_h2d : c->samp_hd; /* the half's device address */
        if (best) {
            r.p[5] = c->best_d;
            r.p[6] = c->head_arm > 2 ? hd : NULL; /* a drawn row: where batch_begin wrote it */
            r.n[3] = w->rows;
        }
        int rc = submit(c, &r, 1, "norm_matmul");
        if (rc || !best) return rc;
        /* the id, where sample_start's draw of one row without penalties or masks puts it */
        const size_t o_ids = align16(sizeof(sf_sample_row));
        sf_op_rec p = { 0 };
        p.kind = SF_OP_BEST_PUT;
        p.p[0] = c->best_d; p.p[1] = c->samp_d + o_ids; p.p[2] = hd ? hd + o_ids : NULL; p.p[3] = c->meta_d;
        if ((rc = submit(c, &p, 1, "norm_matmul (the drawn id)"))) return rc;
        c->head_put = 1;
        c->head_vocab = (int)w->rows;
        return SF_OK;
    }
    if (!w->n_q && n > 1 && n <= ROWS_MAX && (uintptr_t)norm->d % 16 == 0 &&
        sf_k_gemv_rows_ok(glu ? SF_K_ROWS_GLU : SF_K_ROWS_NORM, n, x->d, x->cols, w->d, (int)w->rows, (int)k, y->cols)) {
        /* 2-6 rows: the same fusion on tensor cores (gemv_rows.cu) */
        sf_op_rec r = { 0 };
        r.kind = SF_OP_GEMV_NORM;
        r.p[0] = x->d; r.p[1] = norm->d; r.p[2] = w->d; r.p[3] = w->bias; r.p[4] = y->d;
        r.n[0] = w->rows; r.n[1] = k; r.n[2] = glu; r.n[8] = n; r.n[9] = x->cols; r.n[10] = y->cols;
        r.f = eps;
        return submit(c, &r, 1, "norm_matmul");
    }
    if (w->n_q && c->qfuse && n <= c->qgemv_rows && (uintptr_t)norm->d % 16 == 0 && (uintptr_t)x->d % 16 == 0 &&
        x->cols % 8 == 0 && (!glu || w->n_q == 1))
        /* block formats: the norm (and the gate) inside each part's GEMV */
        return qmatmul(c, x, w, n, norm, eps, glu, y, 0, "norm_matmul");
    if (!tmp_x || tmp_x->rows < n || tmp_x->cols < k || (glu && (!tmp_y || tmp_y->rows < n || tmp_y->cols < w->rows)))
        return op_fail(SF_EINVAL, "norm_matmul", "scratch buffers missing or too small for this batch");
    int rc = cuda_rmsnorm(b, (sf_buf *)x, NULL, norm, eps, n, tmp_x); /* add == NULL: x is only read */
    if (!rc) rc = cuda_matmul(b, tmp_x, w, n, glu ? tmp_y : y);
    if (!rc && glu) rc = cuda_silu_mul(b, tmp_y, n, (int)out_cols, y);
    return rc;
}

static int cuda_norm_qkv_rope(sf_backend *b, const sf_buf *x, const sf_weight *norm, float eps, const sf_weight *w,
                              int layer, int H, int Hkv, const sf_rope *r, sf_buf *tmp_x, sf_buf *qkv)
{
    cuda_ctx *c = CTX(b);
    int rc;
    int64_t k = w->cols;
    if (!c->kv) return op_fail(SF_EINVAL, "norm_qkv_rope", "KV cache not initialised (kv_init first)");
    if (layer < 0 || layer >= c->kvc.n_layers || Hkv != c->kvc.n_kv_heads || r->head_dim != c->kvc.head_dim ||
        w->rows != (int64_t)(H + 2 * Hkv) * r->head_dim || qkv->cols < w->rows || qkv->rows < c->T ||
        norm->rows * norm->cols != k || x->cols < k || x->rows < c->T)
        return op_fail(SF_EINVAL, "norm_qkv_rope", "layer, heads or shapes do not match the weight and the KV cache");
    if ((rc = ensure_rope(c, r))) return rc;
    if (!w->n_q && c->T == 1 && !c->step_i8 && k <= SF_K_GEMV_NORM_MAX_K && sf_k_gemv_fused_ok(x->d, w->d, (int)k)) {
        sf_op_rec rec = { 0 };
        rec.kind = SF_OP_GEMV_ROPE;
        rec.p[0] = x->d; rec.p[1] = norm->d; rec.p[2] = w->d; rec.p[3] = w->bias; rec.p[4] = qkv->d;
        rec.p[5] = c->pos_d; rec.p[6] = c->slot_d; rec.p[7] = c->inv_freq_d;
        rec.n[0] = w->rows; rec.n[1] = k; rec.n[2] = H; rec.n[3] = Hkv; rec.n[4] = r->head_dim; rec.n[5] = r->rot_dim;
        rec.n[6] = r->interleaved;
        rec.n[7] = c->dec_kernel; /* the step's attention, which starts beside the projection's tail */
        rec.f = eps;
        rec.kv = layer_kv(c, layer);
        return submit(c, &rec, 1, "norm_qkv_rope");
    }
    if (!w->n_q && c->T > 1 && c->T <= ROWS_MAX && !c->step_i8 && (uintptr_t)norm->d % 16 == 0 &&
        sf_k_gemv_rows_ok(SF_K_ROWS_ROPE, c->T, x->d, x->cols, w->d, (int)w->rows, (int)k, qkv->cols)) {
        sf_op_rec rec = { 0 };
        rec.kind = SF_OP_GEMV_ROPE;
        rec.p[0] = x->d; rec.p[1] = norm->d; rec.p[2] = w->d; rec.p[3] = w->bias; rec.p[4] = qkv->d;
        rec.p[5] = c->pos_d; rec.p[6] = c->slot_d; rec.p[7] = c->inv_freq_d;
        rec.n[0] = w->rows; rec.n[1] = k; rec.n[2] = H; rec.n[3] = Hkv; rec.n[4] = r->head_dim; rec.n[5] = r->rot_dim;
        rec.n[6] = r->interleaved; rec.n[8] = c->T; rec.n[9] = x->cols; rec.n[10] = qkv->cols;
        rec.f = eps;
        rec.kv = layer_kv(c, layer);
        return submit(c, &rec, 1, "norm_qkv_rope");
    }
    if (w->n_q && c->qfuse && c->T <= c->qgemv_rows && !c->step_i8 && (uintptr_t)norm->d % 16 == 0 &&
        (uintptr_t)x->d % 16 == 0 && x->cols % 8 == 0 && r->head_dim % 2 == 0 && r->rot_dim % 2 == 0) {
        /* block formats: the norm, RoPE and the K/V write inside each part's GEMV (parts of
         * whole heads, as a QKV's q, k and v are) */
        int whole = 1;
        for (int i = 0; i < w->n_q; i++) whole &= w->qp[i].r0 % r->head_dim == 0 && w->qp[i].rows % r->head_dim == 0;
        for (int i = 0; whole && i < w->n_q; i++) {
            const struct qpart *q = &w->qp[i];
            sf_op_rec rec = qgemv_rec(x, q, k, c->T, norm, eps, w->bias, qkv->d, qkv->cols);
            rec.p[5] = c->pos_d; rec.p[6] = c->slot_d; rec.p[7] = c->inv_freq_d;
            rec.n[8] = 2; rec.n[9] = q->r0; rec.n[10] = H; rec.n[11] = Hkv; rec.n[12] = r->head_dim;
            rec.n[13] = r->rot_dim; rec.n[14] = r->interleaved;
            rec.kv = layer_kv(c, layer);
            if ((rc = submit(c, &rec, 1, "norm_qkv_rope"))) return rc;
        }
        if (whole) return SF_OK;
    }
    if ((rc = cuda_norm_matmul(b, x, norm, eps, w, c->T, 0, tmp_x, NULL, qkv))) return rc;
    return cuda_rope_kv(b, qkv, layer, H, Hkv, r);
}

static int cuda_matmul_add(sf_backend *b, const sf_buf *x, const sf_weight *w, int n, sf_buf *tmp, sf_buf *y)
{
    cuda_ctx *c = CTX(b);
    if (x->cols < w->cols || y->cols < w->rows || n > x->rows || n > y->rows || x == y)
        return op_fail(SF_EINVAL, "matmul_add", "buffer shapes do not match the weight (or x is y)");
    sf_op_rec r = { 0 };
    if (w->n_q && n <= c->qgemv_rows) return qmatmul(c, x, w, n, NULL, 0, 0, y, 1, "matmul_add");
    if (w->n_q) goto through_tmp;
    if (n == 1 && sf_k_gemv_fused_ok(x->d, w->d, (int)w->cols)) {
        r.kind = SF_OP_GEMV_ADD;
        r.p[0] = x->d; r.p[2] = w->d; r.p[3] = w->bias; r.p[4] = y->d;
        r.n[0] = w->rows; r.n[1] = w->cols;
        return submit(c, &r, 1, "matmul_add");
    }
    if (n > 1 && n <= ROWS_MAX &&
        sf_k_gemv_rows_ok(SF_K_ROWS_ADD, n, x->d, x->cols, w->d, (int)w->rows, (int)w->cols, y->cols)) {
        r.kind = SF_OP_GEMV_ADD;
        r.p[0] = x->d; r.p[2] = w->d; r.p[3] = w->bias; r.p[4] = y->d;
        r.n[0] = w->rows; r.n[1] = w->cols; r.n[8] = n; r.n[9] = x->cols; r.n[10] = y->cols;
        return submit(c, &r, 1, "matmul_add");
    }
    if (n > 8 && sf_k_gemm_lt_ok(c->gemm, w->bias, n, (int)w->rows, (int)w->cols, x->cols, y->cols)) {
        /* prefill: cuBLASLt accumulates into y itself (beta = 1) */
        r.kind = SF_OP_GEMM_ACC;
        r.p[0] = x->d; r.p[1] = w->d; r.p[2] = w->bias; r.p[3] = y->d;
        r.n[0] = x->cols; r.n[1] = n; r.n[2] = w->rows; r.n[3] = w->cols; r.n[4] = y->cols;
        int rc = kcheck(sf_k_gemm_prepare(c->gemm, w->bias, n, (int)w->rows, (int)w->cols, x->cols, y->cols, 1, c->s),
                        "matmul_add (tuning)");
        if (rc) return rc;
        return submit(c, &r, sf_k_gemm_acc_ready(c->gemm, w->bias, n, (int)w->rows, (int)w->cols, x->cols, y->cols),
                      "matmul_add");
    }
through_tmp:
    if (!tmp || tmp->rows < n || tmp->cols < w->rows)
        return op_fail(SF_EINVAL, "matmul_add", "scratch buffer missing or too small for this batch");
    int rc = cuda_matmul(b, x, w, n, tmp);
    if (rc) return rc;
    r.kind = SF_OP_ADD;
    r.p[0] = y->d; r.p[1] = tmp->d;
    r.n[0] = y->cols; r.n[1] = tmp->cols; r.n[2] = n; r.n[3] = w->rows;
    return submit(c, &r, 1, "matmul_add");
}

static int cuda_get_rows(sf_backend *b, const sf_buf *x, sf_buf *out)
{
    cuda_ctx *c = CTX(b);
    if (out->rows < c->L || out->cols < x->cols) return op_fail(SF_EINVAL, "get_rows", "output buffer too small");
    sf_op_rec r = { 0 };
    r.kind = SF_OP_ROWS;
    r.p[0] = x->d; r.p[1] = c->logit_rows_d; r.p[2] = out->d;
    r.n[0] = x->cols; r.n[1] = c->L; r.n[2] = x->cols; r.n[3] = out->cols;
    return submit(c, &r, 1, "get_rows");
}

/* Downloads bf16 rows through the pinned stage and widens them on the host (half the PCIe
 * bytes of a device-side conversion, and no fp32 scratch on the device). */
static int cuda_read_f32(sf_backend *b, const sf_buf *buf, int n, float *host)
{
    cuda_ctx *c = CTX(b);
    if (n > buf->rows) return op_fail(SF_EINVAL, "read_f32", "more rows than the buffer has");
    int rc = step_end(c);
    if (rc) return rc;
    step_enqueued(c, 1);
    size_t total = (size_t)n * buf->cols, per = STAGE_BYTES / 2;
    for (size_t off = 0; off < total; off += per) {
        size_t cnt = SF_MIN(per, total - off);
        cudaError_t e = cudaEventSynchronize(c->stage_done[0]);
        if (e == cudaSuccess) e = cudaMemcpyAsync(c->pin[0], buf->d + off, cnt * 2, cudaMemcpyDeviceToHost, c->s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) return kcheck(e, "read_f32");
        const uint16_t *p = c->pin[0];
        for (size_t i = 0; i < cnt; i++) host[off + i] = sf_bf16_to_f32(p[i]);
    }
    return SF_OK;
}

/* Rounds host fp32 rows to bf16 through the pinned stage and sends them (tests, comparisons). */
static int cuda_write_f32(sf_backend *b, sf_buf *buf, int n, const float *host)
{
    cuda_ctx *c = CTX(b);
    if (n < 0 || n > buf->rows) return op_fail(SF_EINVAL, "write_f32", "more rows than the buffer has");
    int rc = step_end(c);
    if (rc) return rc;
    size_t total = (size_t)n * buf->cols, per = STAGE_BYTES / 2;
    for (size_t off = 0; off < total; off += per) {
        size_t cnt = SF_MIN(per, total - off);
        cudaError_t e = cudaEventSynchronize(c->stage_done[0]);
        if (e != cudaSuccess) return kcheck(e, "write_f32");
        uint16_t *p = c->pin[0];
        for (size_t i = 0; i < cnt; i++) p[i] = sf_f32_to_bf16(host[off + i]);
        e = cudaMemcpyAsync(buf->d + off, c->pin[0], cnt * 2, cudaMemcpyHostToDevice, c->s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) return kcheck(e, "write_f32");
    }
    return SF_OK;
}

/* Sends the rows and penalty entries (one copy), queues the draw and the copy of the n ids back
 * (sample_start); cuda_sample_wait (or, deferred, cuda_sample_take) waits for them. */
static int cuda_sample_start(sf_backend *b, const sf_buf *logits, int n, int vocab, const sf_sample_row *rows,
                             const sf_sample_pen *pen, int n_pen, int32_t *ids, sf_sample_lp *lp)
{
    cuda_ctx *c = CTX(b);
    int n_mask = 0, n_lp = 0; /* rows with an allow mask, rows asking for logprobs */
    c->samp_pending = 0;
    if (n < 0 || n > logits->rows || vocab < 1 || vocab > logits->cols || n_pen < 0)
        return op_fail(SF_EINVAL, "sample", "more rows or tokens than the logits buffer has");
    for (int i = 0; i < n; i++) {
        const sf_sample_row *r = &rows[i];
        if (r->n_pen < 0 || r->pen_off < 0 || (int64_t)r->pen_off + r->n_pen > n_pen)
            return op_fail(SF_EINVAL, "sample", "a row's penalty entries lie outside the list");
        for (int j = 0; j < r->n_pen; j++)
            if (pen[r->pen_off + j].id < 0 || pen[r->pen_off + j].id >= vocab)
                return op_fail(SF_EINVAL, "sample", "a penalized token id is outside the vocabulary");
        if (!sf_sample_allow_ok(r->allow, vocab))
            return op_fail(SF_EINVAL, "sample", "a row's allow mask lets no token of the vocabulary through");
        if (r->logprobs < 0 || r->logprobs > 1 + SF_SAMPLE_TOP_MAX || (r->logprobs && !lp))
            return op_fail(SF_EINVAL, "sample", "a row's logprobs is outside 0..21, or it has nowhere to go");
        n_mask += r->allow != NULL;
        n_lp += r->logprobs > 0;
    }
    /* rows, penalty entries, allow masks (sent), the penalized values (device), the ids and the
     * log-probabilities (back) */
    const size_t mask_bytes = (size_t)(vocab + 31) / 32 * 4;
    size_t o_pen = align16((size_t)n * sizeof *rows), o_mask = align16(o_pen + (size_t)n_pen * sizeof *pen),
           o_val = align16(o_mask + (size_t)n_mask * mask_bytes), o_ids = align16(o_val + (size_t)n_pen * 4),
           o_lp = align16(o_ids + (size_t)n * 4), total = n_lp ? o_lp + (size_t)n * sizeof *lp : o_ids + (size_t)n * 4;
    if (vocab > SF_K_SAMPLE_MAX_VOCAB || total > SAMPLE_BYTES - SF_K_SAMPLE_SCRATCH) {
        SF_LOGD("cuda backend: sample: %d rows, %d penalty entries, %d allow masks, vocabulary %d exceed the device "
                "sampler; sampling on the host", n, n_pen, n_mask, vocab);
        return SF_EUNSUPPORTED;
    }
    int rc = step_end(c);
    if (rc) return rc;
    if (c->s_meta && (rc = kcheck(cudaEventRecord(c->fwd_done, c->s), "sample"))) return rc;
    c->fwd_ready = c->s_meta != NULL;
    if (!c->samp_defer) c->n_draws = 0; /* a draw never waited for is dropped */
    if (c->n_draws == 2) return op_fail(SF_EINVAL, "sample", "two draws are queued already: sample_take one first");
    char *h = c->samp_defer && c->samp_flip ? c->samp_h2 : c->samp_h;
    struct cuda_draw *d = &c->draw[(c->draw_head + c->n_draws) % 2];
    d->out = ids;
    d->n = n;
    d->h_ids = (const int32_t *)(h + o_ids);
    d->lp_out = n_lp ? lp : NULL;
    d->h_lp = (const sf_sample_lp *)(h + o_lp);
    c->n_draws++;
    c->samp_pending = 1;
    c->samp_flip ^= c->samp_defer;
    c->last_ids_d = (const int32_t *)(c->samp_d + o_ids);
    c->n_last = n;
    if (n == 0) return SF_OK;
    char *hd = h == c->samp_h ? c->samp_hd : c->samp_h2d;
    /* the step's graph drew this row with its lm_head (head_put) and wrote its id here */
    const int put = c->head_put && n == 1 && !n_pen && !n_mask && !n_lp && vocab == c->head_vocab &&
                    o_ids == align16(sizeof *rows) && ((c->head_arm - 1) & 1) == (h == c->samp_h2) &&
                    (c->head_arm > 2 ? !memcmp(h, rows, sizeof *rows)
                                     : sf_sample_greedy(rows[0].temperature, rows[0].top_k));
    c->head_put = 0;
    /* mapped: the rows read where the host wrote them (penalty entries and masks, read in every
     * pass, are copied) and the ids written straight back */
    const char *rows_at = hd && !n_pen && !n_mask ? hd : c->samp_d;
    cudaError_t e = cudaSuccess;
    if (put) {
        c->head_draws++;
    } else {
        memcpy(h, rows, (size_t)n * sizeof *rows);
        if (n_pen) memcpy(h + o_pen, pen, (size_t)n_pen * sizeof *pen);
        for (int i = 0, m = 0; i < n && n_mask; i++) /* each mask after the entries; its row points at the copy */
            if (rows[i].allow) {
                memcpy(h + o_mask + m * mask_bytes, rows[i].allow, mask_bytes);
                ((sf_sample_row *)h)[i].allow = (const uint32_t *)(c->samp_d + o_mask + m++ * mask_bytes);
            }
        if (!hd || n_pen || n_mask) e = cudaMemcpyAsync(c->samp_d, h, o_val, cudaMemcpyHostToDevice, c->s);
        if (e != cudaSuccess) return kcheck(e, "sample");
        rc = kcheck(sf_k_sample(logits->d, logits->cols, n, vocab, (const sf_k_sample_row *)rows_at,
                                (const sf_k_sample_pen *)(c->samp_d + o_pen), n_pen, (float *)(c->samp_d + o_val),
                                (int32_t *)(c->samp_d + o_ids), hd ? (int32_t *)(hd + o_ids) : NULL, c->meta_d,
                                c->samp_d + SAMPLE_BYTES - SF_K_SAMPLE_SCRATCH, c->s),
                    "sample");
        if (rc) return rc;
    }
    c->draw_in_tokens = n;
    if (n_lp) { /* after the draw: its ids and penalized values */
        rc = kcheck(sf_k_sample_logprobs(logits->d, logits->cols, n, vocab, (const sf_k_sample_row *)rows_at,
                                         (const sf_k_sample_pen *)(c->samp_d + o_pen), n_pen,
                                         (float *)(c->samp_d + o_val), (const int32_t *)(c->samp_d + o_ids),
                                         (sf_k_sample_lp *)(c->samp_d + o_lp), c->s),
                    "sample");
        if (rc) return rc;
        e = cudaMemcpyAsync(h + o_lp, c->samp_d + o_lp, (size_t)n * sizeof *lp, cudaMemcpyDeviceToHost, c->s);
    }
    if (!hd && e == cudaSuccess) e = cudaMemcpyAsync(h + o_ids, c->samp_d + o_ids, (size_t)n * 4, cudaMemcpyDeviceToHost, c->s);
    if (e == cudaSuccess && c->samp_defer) e = cudaEventRecord(d->done, c->s);
    if (e == cudaSuccess) gap_mark(c, 0);
    step_enqueued(c, 1);
    return kcheck(e, "sample");
}

/* Scores rows [row0, row0 + n) of logits (hal.h): the targets go over and the results come back
 * through SCORE_BYTES of pinned memory, as many rows at a time as fit. */
static int cuda_score(sf_backend *b, const sf_buf *logits, int row0, int n, int vocab, const int32_t *targets, int k,
                      float *lp, int32_t *rank, int32_t *top_id, float *top_lp)
{
    cuda_ctx *c = CTX(b);
    if (row0 < 0 || n < 0 || (int64_t)row0 + n > logits->rows || vocab < 1 || vocab > logits->cols || k < 0 || k > 20)
        return op_fail(SF_EINVAL, "score", "rows, tokens or top entries outside the logits buffer or 0..20");
    for (int i = 0; i < n; i++)
        if (targets[i] < 0 || targets[i] >= vocab) return op_fail(SF_EINVAL, "score", "a token id is outside the vocabulary");
    if (c->samp_pending) return op_fail(SF_EINVAL, "score", "called between sample_start and sample_wait");
    int rc = step_end(c);
    if (rc) return rc;
    const int chunk = (int)((SCORE_BYTES - 64) / (12 + 8 * (size_t)k));
    for (int r0 = 0; r0 < n; r0 += chunk) {
        const int m = SF_MIN(chunk, n - r0);
        const size_t o_lp = align16((size_t)m * 4), o_rank = align16(o_lp + (size_t)m * 4),
                     o_tid = align16(o_rank + (size_t)m * 4), o_tlp = align16(o_tid + (size_t)m * k * 4),
                     end = o_tlp + (size_t)m * k * 4;
        char *h = c->score_h, *d = c->score_d;
        memcpy(h, targets + r0, (size_t)m * 4);
        cudaError_t e = cudaMemcpyAsync(d, h, (size_t)m * 4, cudaMemcpyHostToDevice, c->s);
        if (e != cudaSuccess) return kcheck(e, "score");
        rc = kcheck(sf_k_score(logits->d + ((int64_t)row0 + r0) * logits->cols, logits->cols, m, vocab, (const int32_t *)d,
                               k, (float *)(d + o_lp), (int32_t *)(d + o_rank), (int32_t *)(d + o_tid),
                               (float *)(d + o_tlp), c->s),
                    "score");
        if (rc) return rc;
        e = cudaMemcpyAsync(h + o_lp, d + o_lp, end - o_lp, cudaMemcpyDeviceToHost, c->s);
        if (e == cudaSuccess) e = cudaStreamSynchronize(c->s);
        if (e != cudaSuccess) return kcheck(e, "score");
        memcpy(lp + r0, h + o_lp, (size_t)m * 4);
        memcpy(rank + r0, h + o_rank, (size_t)m * 4);
        if (k) {
            memcpy(top_id + (size_t)r0 * k, h + o_tid, (size_t)m * k * 4);
            memcpy(top_lp + (size_t)r0 * k, h + o_tlp, (size_t)m * k * 4);
        }
    }
    return SF_OK;
}

/* Takes the oldest queued draw's ids: after its event (deferred: later steps may be queued
 * behind it), else after everything queued. */
static int draw_take(cuda_ctx *c)
{
    struct cuda_draw *d = &c->draw[c->draw_head];
    c->draw_head = (c->draw_head + 1) % 2;
    c->n_draws--;
    if (d->n == 0) return SF_OK;
    int rc = kcheck(c->samp_defer ? cudaEventSynchronize(d->done) : cudaStreamSynchronize(c->s), "sample");
    if (rc) return rc;
    memcpy(d->out, d->h_ids, (size_t)d->n * 4);
    if (d->lp_out) memcpy(d->lp_out, d->h_lp, (size_t)d->n * sizeof *d->lp_out);
    gap_read(c);
    return SF_OK;
}

static int cuda_sample_wait(sf_backend *b)
{
    cuda_ctx *c = CTX(b);
    if (!c->samp_pending) return op_fail(SF_EINVAL, "sample_wait", "no draw was queued by sample_start");
    c->samp_pending = 0;
    return c->samp_defer ? SF_OK : draw_take(c); /* deferred: the draw stays queued for sample_take */
}

static int cuda_sample(sf_backend *b, const sf_buf *logits, int n, int vocab, const sf_sample_row *rows,
                       const sf_sample_pen *pen, int n_pen, int32_t *ids, sf_sample_lp *lp)
{
    cuda_ctx *c = CTX(b);
    if (c->samp_defer) return op_fail(SF_EINVAL, "sample", "draws are deferred (sample_defer): use sample_start");
    int rc = cuda_sample_start(b, logits, n, vocab, rows, pen, n_pen, ids, lp);
    return rc ? rc : cuda_sample_wait(b);
}

/* The device address of pinned host memory, NULL where the device cannot map it. */
static char *host_mapped(char *h)
{
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, h, 0) != cudaSuccess) {
        cudaGetLastError();
        SF_LOGD("cuda backend: pinned memory not mapped into the device: the draw copies its rows and ids");
        return NULL;
    }
    return (char *)d;
}

/* Async scheduling (hal.h): the second pinned half and the draws' events, made on first use. */
static int cuda_sample_defer(sf_backend *b, int on)
{
    cuda_ctx *c = CTX(b);
    if (c->n_draws) return op_fail(SF_EINVAL, "sample_defer", "draws are queued: take them first");
    if (on && !c->samp_h2) {
        cudaError_t e = cudaHostAlloc((void **)&c->samp_h2, SAMPLE_BYTES, cudaHostAllocMapped);
        if (e == cudaSuccess && c->samp_hd) c->samp_h2d = host_mapped(c->samp_h2);
        if (e == cudaSuccess && c->samp_hd && !c->samp_h2d) c->samp_hd = NULL; /* both or neither */
        for (int i = 0; i < 2 && e == cudaSuccess; i++)
            if (!c->draw[i].done) e = cudaEventCreateWithFlags(&c->draw[i].done, cudaEventDisableTiming);
        if (e != cudaSuccess) return kcheck(e, "sample_defer");
    }
    c->samp_defer = on != 0;
    c->samp_flip = 0;
    return SF_OK;
}

static int cuda_sample_take(sf_backend *b)
{
    cuda_ctx *c = CTX(b);
    return c->n_draws ? draw_take(c) : SF_OK;
}

static int cuda_flush(sf_backend *b) { return step_end(CTX(b)); }

static int cuda_sync(sf_backend *b)
{
    cuda_ctx *c = CTX(b);
    int rc = step_end(c);
    step_enqueued(c, 1);
    return rc ? rc : kcheck(cudaStreamSynchronize(CTX(b)->s), "sync");
}

/* For the communicator: bf16 device memory on the backend's stream (NCCL queues behind it).
 * A step's graph capture or replay ends here, so the collective runs eagerly after the ops
 * before it; the ops after it run directly (or start nothing new: graphs begin at batch_begin). */
static int cuda_buf_raw(sf_backend *b, sf_buf *buf, void **data, sf_dtype *dt, void **stream)
{
    int rc = step_end(CTX(b));
    if (rc) return rc;
    if (CTX(b)->t_step0) CTX(b)->t_raw = sf_now_ns();
    *data = buf->d;
    *dt = SF_DT_BF16;
    *stream = CTX(b)->s;
    return SF_OK;
}

/* For the communicator: a collective as an op of the step (recorded into its graph). */
static int cuda_collective(sf_backend *b, sf_buf *buf, int64_t n, sf_coll_fn fn, void *arg)
{
    if (n > buf->rows * buf->cols) return op_fail(SF_EINVAL, "collective", "more elements than the buffer holds");
    sf_op_rec r = { 0 };
    r.kind = SF_OP_COLL;
    r.p[0] = buf->d;
    r.n[0] = n;
    r.coll = fn;
    r.coll_arg = arg;
    return submit(CTX(b), &r, 1, "collective");
}

/* For the communicator: the all-reduce + residual add + RMSNorm as one op of the step. */
static int cuda_collective_norm(sf_backend *b, sf_buf *x, sf_buf *res, const sf_weight *w, float eps, int rows,
                                sf_buf *out, sf_coll_norm_fn fn, void *arg)
{
    int64_t d = w->rows * w->cols;
    if (rows < 1 || x->cols != d || out->cols != d || rows > x->rows || rows > out->rows ||
        (res && (res->cols != d || rows > res->rows)))
        return op_fail(SF_EINVAL, "collective_norm", "buffers must be as wide as the norm weight, with the rows");
    sf_op_rec r = { 0 };
    r.kind = SF_OP_COLL_NORM;
    r.p[0] = x->d; r.p[1] = res ? res->d : NULL; r.p[2] = w->d; r.p[3] = out->d;
    r.n[0] = rows; r.n[1] = d;
    r.f = eps;
    r.coll_norm = fn;
    r.coll_arg = arg;
    return submit(CTX(b), &r, 1, "collective_norm");
}

/* Before a communicator whose calls the graphs may hold goes away. */
static void cuda_graphs_release(sf_backend *b)
{
    cuda_ctx *c = CTX(b);
    cudaSetDevice(c->dev);
    sf_cuda_graphs_drop(&c->graphs, c->s);
}

static const struct sf_backend_ops cuda_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .hw = cuda_hw,
    .weight_new = cuda_weight_new,
    .weight_free = cuda_weight_free,
    .buf_new = cuda_buf_new,
    .buf_free = cuda_buf_free,
    .kv_init = cuda_kv_init,
    .kv_block_bytes = cuda_kv_block_bytes,
    .batch_begin = cuda_batch_begin,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .matmul = cuda_matmul,
    .rope_kv = cuda_rope_kv,
    .attention = cuda_attention,
    .silu_mul = cuda_silu_mul,
    .get_rows = cuda_get_rows,
    .read_f32 = cuda_read_f32,
    .sync = cuda_sync,
    .flush = cuda_flush,
    .kv_copy_out = cuda_kv_copy_out,
    .kv_copy_in = cuda_kv_copy_in,
    .kv_copy_blocks = cuda_kv_copy_blocks,
    .buf_raw = cuda_buf_raw,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .collective = cuda_collective,
    .collective_norm = cuda_collective_norm,
    .graphs_release = cuda_graphs_release,
    .norm_matmul = cuda_norm_matmul,
    .matmul_add = cuda_matmul_add,
    .norm_qkv_rope = cuda_norm_qkv_rope,
    .sample = cuda_sample,
    .score = cuda_score,
    .sample_start = cuda_sample_start,
    .sample_wait = cuda_sample_wait,
    .write_f32 = cuda_write_f32,
    .sample_defer = cuda_sample_defer,
    .sample_take = cuda_sample_take,
};

/* A cuBLASLt context (its workspace counted) with the GEMM tuner on, as configured:
 * SEMFLOW_CUDA_GEMM_TUNE=0: cuBLASLt's heuristic choice only (for comparison);
 * SEMFLOW_CUDA_GEMM_TUNE_S: the tuning budget in seconds (default 20). */
static int gemm_make(cuda_ctx *c, sf_k_gemm_ctx **out, sf_error *err)
{
    sf_k_gemm_ctx *g = NULL;
    int krc = sf_k_gemm_ctx_new(&g, &c->n_mallocs);
    *out = NULL;
    if (krc) return sf_err(err, SF_ERROR, "CUDA backend: cuBLASLt: %s", sf_k_gemm_error_str(krc));
    c->dev_bytes += 32u << 20;
    char bus[64] = "", path[1024] = "";
    double budget = (double)sf_env_long("SEMFLOW_CUDA_GEMM_TUNE_S", 20, 1, 3600);
    if (sf_env_bool("SEMFLOW_CUDA_GEMM_TUNE", 1)) {
        if (cudaDeviceGetPCIBusId(bus, sizeof bus, c->dev) != cudaSuccess ||
            sf_hal_cuda_cache_path(bus, "gemm-cuda", path, sizeof path) != 0) {
            cudaGetLastError();
            path[0] = 0;
            SF_LOGW("CUDA backend: no cache folder for GEMM tuning (set HOME or XDG_CACHE_HOME); tuning is "
                    "repeated by every process");
        }
        if ((krc = sf_k_gemm_tune_enable(g, path[0] ? path : NULL, budget))) {
            sf_k_gemm_ctx_free(g);
            c->dev_bytes -= 32u << 20;
            return sf_err(err, SF_ERROR, "CUDA backend: GEMM tuner: %s", sf_k_gemm_error_str(krc));
        }
    }
    *out = g;
    return SF_OK;
}

/* SEMFLOW_CUDA_FUSED=0: the same backend without the fused ops (the forward pass then runs the
 * plain sequence), for comparisons. */
static struct sf_backend_ops cuda_ops_plain;

int sf_backend_cuda_new(const sf_backend_opts *o, sf_backend **out, sf_error *err)
{
    sf_backend *b = NULL;
    cuda_ctx *c = NULL;
    int rc = SF_OK, dev = o ? o->device : 0;
    *out = NULL;
    if (!(b = calloc(1, sizeof *b)) || !(c = calloc(1, sizeof *c))) {
        rc = sf_err(err, SF_ENOMEM, "CUDA backend: out of host memory");
        goto cleanup;
    }
    {
        b->ops = &cuda_ops;
        if (!sf_env_bool("SEMFLOW_CUDA_FUSED", 1)) {
            cuda_ops_plain = cuda_ops;
            cuda_ops_plain.norm_matmul = NULL;
            cuda_ops_plain.matmul_add = NULL;
            cuda_ops_plain.norm_qkv_rope = NULL;
            b->ops = &cuda_ops_plain;
        }
        c->attn_decode = sf_env_bool("SEMFLOW_CUDA_ATTN_DECODE", 1);
        c->gemv_plain = b->ops == &cuda_ops && sf_env_bool("SEMFLOW_CUDA_GEMV_PLAIN", 1);
        c->mixed_decode = sf_env_bool("SEMFLOW_CUDA_MIXED_DECODE", 1);
        c->head_draw = b->ops == &cuda_ops && sf_env_bool("SEMFLOW_CUDA_HEAD_DRAW", 1);
        c->quant = sf_env_bool("SEMFLOW_CUDA_QUANT", 1);
        c->qfuse = b->ops == &cuda_ops && sf_env_bool("SEMFLOW_CUDA_QFUSE", 0);
        c->qgemv_rows = (int)sf_env_long("SEMFLOW_CUDA_QGEMV_ROWS", 8, 1, SF_K_QGEMV_MAX_N);
    }
    b->ctx = c;
    c->dev = dev;
    if ((rc = sf_hal_cuda_probe(dev, &c->hw, 0, err))) goto cleanup;
    SF_CUDA_GOTO(cudaSetDevice(dev), err, rc);
    SF_CUDA_GOTO(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking), err, rc);
    if ((rc = gemm_make(c, &c->gemm, err))) goto cleanup;
    for (int i = 0; i < 2; i++) {
        SF_CUDA_GOTO(cudaHostAlloc(&c->pin[i], STAGE_BYTES, cudaHostAllocDefault), err, rc);
        if ((rc = dmalloc(c, &c->stage[i], STAGE_BYTES, "the upload stage", err))) goto cleanup;
        SF_CUDA_GOTO(cudaEventCreateWithFlags(&c->stage_done[i], cudaEventDisableTiming), err, rc);
    }
    SF_CUDA_GOTO(cudaHostAlloc((void **)&c->meta_h, META_INTS * 4, cudaHostAllocDefault), err, rc);
    if ((rc = dmalloc(c, (void **)&c->meta_d, META_INTS * 4, "batch metadata", err))) goto cleanup;
    SF_CUDA_GOTO(cudaEventCreateWithFlags(&c->meta_done, cudaEventDisableTiming), err, rc);
    if (sf_env_bool("SEMFLOW_CUDA_META_SIDE", 1)) {
        SF_CUDA_GOTO(cudaStreamCreateWithFlags(&c->s_meta, cudaStreamNonBlocking), err, rc);
        SF_CUDA_GOTO(cudaEventCreateWithFlags(&c->fwd_done, cudaEventDisableTiming), err, rc);
    }
    if ((rc = dmalloc(c, (void **)&c->inv_freq_d, sizeof c->inv_freq_h, "RoPE frequencies", err))) goto cleanup;
    SF_CUDA_GOTO(cudaHostAlloc((void **)&c->samp_h, SAMPLE_BYTES, cudaHostAllocMapped), err, rc);
    if (sf_env_bool("SEMFLOW_CUDA_DRAW_MAPPED", 1)) c->samp_hd = host_mapped(c->samp_h);
    if ((rc = dmalloc(c, (void **)&c->samp_d, SAMPLE_BYTES, "the sampler's arguments", err))) goto cleanup;
    SF_CUDA_GOTO(cudaHostAlloc((void **)&c->score_h, SCORE_BYTES, cudaHostAllocDefault), err, rc);
    if ((rc = dmalloc(c, (void **)&c->score_d, SCORE_BYTES, "the score op's rows", err))) goto cleanup;
    if ((rc = dmalloc(c, (void **)&c->best_d, 16, "the lm_head draw's words", err))) goto cleanup;
    SF_CUDA_GOTO(cudaMemset(c->best_d, 0, 16), err, rc);
    /* the op's scratch at the end: its counters start (and stay) at zero */
    SF_CUDA_GOTO(cudaMemset(c->samp_d + SAMPLE_BYTES - SF_K_SAMPLE_SCRATCH, 0, SF_K_SAMPLE_SCRATCH), err, rc);
    {
        c->prof = sf_env_bool("SEMFLOW_CUDA_PROFILE", 0);
        if (c->prof) {
            SF_CUDA_GOTO(cudaEventCreate(&c->prof_ev[0]), err, rc);
            SF_CUDA_GOTO(cudaEventCreate(&c->prof_ev[1]), err, rc);
        }
        /* SEMFLOW_CUDA_GRAPH_TOKENS=N: steps of up to N tokens use graphs (default 512: the decode
         * steps of up to 512 sequences of a saturated engine; docs/CUDA.md has what one costs) */
        int gmax = (int)sf_env_long("SEMFLOW_CUDA_GRAPH_TOKENS", 512, 1, 1 << 20);
        sf_cuda_graphs_init(&c->graphs, sf_env_bool("SEMFLOW_CUDA_GRAPHS", 1) && !c->prof, gmax);
    }
    {
        int trc = sf_k_trace_open(&c->trace);
        if (trc)
            SF_LOGW("cuda backend: SEMFLOW_CUDA_TRACE: the trace buffer could not be set up (%s); running untraced",
                    cudaGetErrorString((cudaError_t)trc));
    }
    *out = b;
    return SF_OK;
cleanup:
    if (b) cuda_destroy(b);
    return rc;
}

int sf_backend_cuda_stats(sf_backend *b, sf_backend_stats *s)
{
    memset(s, 0, sizeof *s);
    if (!b || (b->ops != &cuda_ops && b->ops != &cuda_ops_plain)) return SF_ENODEV;
    cuda_ctx *c = CTX(b);
    s->n_device_allocs = c->n_mallocs;
    s->device_bytes = c->dev_bytes;
    s->graphs_captured = c->graphs.n_captured;
    s->graph_replays = c->graphs.n_replayed;
    s->graph_fallbacks = c->graphs.n_fallbacks;
    s->last_step_host_us = c->last_host_us;
    s->last_step_begin_s = (double)c->last_begin_ns * 1e-9;
    s->last_step_enqueued_s = (double)c->last_enq_ns * 1e-9;
    if (c->gap_r != c->gap_w) {
        cudaSetDevice(c->dev);
        gap_read(c);
    }
    s->idle_after_draw_us = c->gap_us;
    s->idle_after_draw_n = c->gap_n;
    s->head_draws = c->head_draws;
    return SF_OK;
}

#endif
