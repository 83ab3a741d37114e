/* hal.h — the hardware abstraction layer: what the machine is, and the backend table the
 * engine's forward pass is written against.
 *
 * A backend is a table of function pointers (struct sf_backend_ops) plus a context, chosen at
 * run time: hal_cpu.c fills it with the C reference kernels in kernels/cpu, hal_cuda.c with
 * the CUDA kernels and cuBLASLt calls in kernels/cuda. The forward pass (engine/forward.c)
 * calls only the table. Kernels know the types in this header and nothing of the engine.
 *
 * Threading: a backend is driven by one thread (the engine thread). None of its ops are
 * thread-safe; the backend may use worker threads of its own inside an op.
 */
#ifndef SF_HAL_H
#define SF_HAL_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"

/* ---- element types ----------------------------------------------------------------- */
typedef enum sf_dtype {
    SF_DT_F32 = 0,
    SF_DT_F16,
    SF_DT_BF16,
    SF_DT_Q8_0, /* GGUF Q8_0: blocks of 32: fp16 scale + 32 int8; rows are whole blocks */
    SF_DT_I32,
    SF_DT_I8,   /* KV cache in 8 bits with per-block scales (degrade path) */
    /* GGUF's other block formats (hal/quant.c): weights only; the CPU reads Q4_0, the K-quants,
     * IQ4_NL and IQ4_XS in place and keeps the rest as f16, CUDA converts them to bf16 at load; rows are whole
     * blocks of 32 (Q4_0..Q5_1, IQ4_NL) or 256 (K-quants, IQ4_XS) */
    SF_DT_Q4_0,
    SF_DT_Q4_1,
    SF_DT_Q5_0,
    SF_DT_Q5_1,
    SF_DT_Q2_K,
    SF_DT_Q3_K,
    SF_DT_Q4_K,
    SF_DT_Q5_K,
    SF_DT_Q6_K,
    SF_DT_IQ4_NL,
    SF_DT_IQ4_XS,
    SF_DT_COUNT
} sf_dtype;

const char *sf_dtype_name(sf_dtype t);
/* Bytes for n elements of t (n a multiple of sf_dtype_block(t)). */
size_t sf_dtype_bytes(sf_dtype t, int64_t n);
/* Elements per block: 1 for plain types, 32 or 256 for the GGUF block formats. */
int sf_dtype_block(sf_dtype t);
/* n elements (whole blocks) of a GGUF block format (Q8_0 and the SF_DT_Q*_* types above)
 * into fp32, the values ggml's own dequantization gives. */
void sf_dequant_row(sf_dtype t, const void *src, int64_t n, float *dst);
/* rows x cols of a block format (rows `pitch` bytes apart) into out (rows x cols, packed) as
 * SF_DT_F16 or SF_DT_BF16; SF_ENOMEM when its row buffer cannot be had. */
int sf_dequant_rows(sf_dtype t, const void *src, size_t pitch, int64_t rows, int64_t cols, sf_dtype out_t,
                    uint16_t *out);
/* One block of a GGUF block format of random quants and scales, the weights' standard deviation
 * about 0.02 (dummy weights, the tests' random blocks); other types are left alone. */
void sf_quant_random_block(sf_dtype t, uint8_t *b, sf_rng *r);
/* The CUDA backend keeps Q8_0, Q4_K, Q5_K and Q6_K weights in their own bytes (sf_qdev_ok),
 * each row repacked so that a 32-group's quants are one aligned load (kernels/cuda/qgemv.cu
 * reads them). A row of k elements (whole blocks) becomes planes, back to back, G = k / 32
 * groups, S = k / 256 super-blocks, the row padded to 16 bytes (sf_qdev_row_bytes):
 *   Q8_0: qs[G][32] int8 | d[G] f16
 *   Q4_K: meta[S][16] (d, dmin f16 and the 12 scale bytes, as in the block) | qs[G][16]
 *   Q5_K: meta[S][16] | qs[G][16] | qh[G] u32
 *   Q6_K: qs[G][16] | qh[G][2] u32 | sc[S][16] int8 | d[S] f16
 * qs: byte i holds element i of the group in its low nibble and element 16 + i in its high one.
 * Q5_K's qh: bit j of byte b is the fifth bit of element 4j + b, bit 4 + j that of 16 + 4j + b.
 * Q6_K's qh: word h, bits 2j..2j+1 of byte b, the top two bits of element 16h + 4j + b. The
 * values are the file's: nothing is rounded. */
int sf_qdev_ok(sf_dtype t);
size_t sf_qdev_row_bytes(sf_dtype t, int64_t k); /* 0: not a device format, or k not whole blocks */
void sf_qdev_pack_row(sf_dtype t, const void *src, int64_t k, void *dst);
/* The dtype backend ("cpu", "cuda") keeps a weight matrix of dtype t in: the CPU reads f32,
 * f16, bf16 and every GGUF block format in place; CUDA keeps Q8_0, Q4_K, Q5_K and Q6_K (unless
 * SEMFLOW_CUDA_QUANT=0) and converts the rest to bf16 at upload; a fused CUDA weight (QKV,
 * gate/up) keeps its parts' formats only if it keeps every part's (sf_model_weight_bytes
 * counts it so). */
sf_dtype sf_weight_dtype(const char *backend, sf_dtype t);

/* A host view of a weight: row-major rows x cols (1-D tensors have rows = 1). The data is
 * not owned: it usually points into a memory-mapped model file. stride: elements between the
 * starts of consecutive rows, 0 meaning cols (contiguous). A strided view is a column slice of
 * a larger matrix (tensor parallelism's row-parallel O and down projections); backends that
 * cannot read one in place copy just that slice at weight_new (Q8_0: stride and the slice's
 * first column are whole 32-blocks). */
typedef struct sf_view {
    const void *data;
    sf_dtype dtype;
    int64_t rows, cols;
    int64_t stride;
} sf_view;

/* ---- hardware description (filled by hal_cpu_probe / hal_cuda_probe) -------------- */
#define SF_HAL_CHUNKS 8 /* 64 KiB .. 8 MiB, powers of two */

typedef struct sf_hw_info {
    char backend[16];         /* "cpu" | "cuda" */
    char name[128];           /* CPU model / GPU name (for display only, never for tuning) */
    int n_cores;              /* CPU: usable cores; GPU: SM count */
    int n_threads;            /* CPU threads the backend will use */
    size_t l1d_bytes, l2_bytes, l3_bytes; /* per-core L1d/L2 on CPU; GPU: L2 in l2_bytes */
    size_t smem_per_block;    /* GPU: opt-in shared memory per block */
    int cc_major, cc_minor;   /* GPU compute capability */
    size_t mem_total, mem_free; /* bytes (host RAM for cpu, HBM for cuda) */
    double mem_bw_gbs;        /* measured: bytes read + written per second / 1e9 */
    double gemm_tflops;       /* measured bf16 (GPU) / fp32 (CPU) GEMM rate */
    /* GPU: the same GEMM's rate after ~0.4 s of back-to-back calls, when the clocks have settled
     * under the tensor cores' power (a saturated run's GEMMs run at it); CPU: gemm_tflops */
    double gemm_tflops_sustained;
    /* PCIe (GPU only): measured copy bandwidth by chunk size 64 KiB << i */
    size_t chunk_bytes[SF_HAL_CHUNKS];
    double h2d_pinned_gbs[SF_HAL_CHUNKS], d2h_pinned_gbs[SF_HAL_CHUNKS];
    double h2d_pageable_gbs[SF_HAL_CHUNKS], d2h_pageable_gbs[SF_HAL_CHUNKS];
    int pcie_gen, pcie_width; /* from NVML where available, else 0 */
    double calib_seconds;     /* how long calibration took (0 when read from cache) */
    int from_cache;
    /* CPU: measured read-only bandwidth (all threads summing a 256 MiB buffer) / 1e9: the
     * ceiling for streaming weights during decode. */
    double mem_read_gbs;
} sf_hw_info;

/* ---- batch metadata for one forward step ------------------------------------------ */
/* Tokens of one sequence are contiguous in the batch. Built by the scheduler on the host;
 * the backend copies what it needs in batch_begin(). All pointers are host memory. */
typedef struct sf_batch {
    int n_tokens;              /* T */
    int n_seqs;                /* S */
    const int32_t *tokens;     /* [T] token ids */
    const int32_t *pos;        /* [T] position of each token within its sequence */
    const int32_t *slot;       /* [T] KV slot: block_id * block_size + offset */
    const int32_t *seq_start;  /* [S+1] token range of sequence s: [seq_start[s], seq_start[s+1]) */
    const int32_t *seq_ctx;    /* [S] context length of s after this step (cached + new) */
    const int32_t *block_table;/* [S * max_blocks] block ids of each sequence, in order */
    int max_blocks;            /* row stride of block_table */
    const int32_t *logit_rows; /* [L] batch token indices whose logits are wanted */
    int n_logits;              /* L */
    int n_scored;              /* the last n_scored of the L rows are for the score op (prompt
                                * logprobs: sf_forward_score), not drawn or read to the host */
    /* Async scheduling: NULL, or [T]: token t with src_row[t] >= 0 is the id that the last draw
     * (sample / sample_start) gave its row src_row[t], taken on the backend, so the host need
     * not have it yet; tokens[t] is then only a stand-in (a valid id). Only for backends with
     * sample_take; SF_EINVAL for a row the last draw did not have. */
    const int32_t *src_row;
    /* A hint, NULL or the row (host memory) by which the step's one logit row will be drawn in
     * sample / sample_start right after it: greedy (temperature 0 or top_k 1) or at a temperature
     * alone (no top-k, top-p or min-p), without penalty entries, an allow mask or logprobs; the
     * step's lm_head is its norm_matmul with glu 0 (rows: the vocabulary). A backend may draw
     * with that lm_head and skip the draw's pass over the row (CUDA, batch 1); the logits are
     * written all the same. */
    const struct sf_sample_row *draw_row;
} sf_batch;

/* RoPE parameters; inv_freq is precomputed by the engine (scaling applied), head_dim/2 floats. */
typedef struct sf_rope {
    int head_dim;
    int rot_dim;             /* dims rotated (== head_dim for Llama) */
    int interleaved;         /* 1: rotate adjacent pairs (GGUF), 0: rotate halves (HF) */
    const float *inv_freq;   /* [rot_dim/2], host memory */
    float attn_scale;        /* usually 1/sqrt(head_dim) */
} sf_rope;

/* KV cache. Per layer, K and V alike, the pool is n_blocks full-precision blocks (bf16 on CUDA,
 * f32 on the CPU) of [n_kv_heads][block_size][head_dim]. With int8 set it may also hold INT8
 * blocks, carved in half-block units: block id n_blocks + u (u in [0, 2 * n_blocks)) is unit u,
 * [n_kv_heads][block_size][head_dim] int8 at byte u * (full block bytes / 2), inside full block
 * u / 2 (the allocator, engine/kvcache.h, never hands out both). Each INT8 row (token, kv head)
 * has an fp32 scale, max|x| / 127, in side arrays indexed like the rows: (u * n_kv_heads + h) *
 * block_size + offset. So a block id alone says its kind: ids in block tables and slots (slot =
 * id * block_size + offset) may be of either kind, per sequence or even per block, and the
 * kernels read each block as its id says. kv_copy_out/in move the right bytes for either kind:
 * host block i at host + i * kv_block_bytes; an INT8 block there is, per layer, K then V int8
 * rows, then K then V scales. */
typedef struct sf_kv_config {
    int n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    sf_dtype dtype;          /* backend's choice for F32/BF16; I8 for the degrade path */
    int int8;                /* 1: INT8 blocks may be used beside full ones (scales are allocated;
                              * kv_block_bytes then includes a full block's share of them) */
    int group;               /* query heads per kv head (0: not given); backends may choose their
                              * attention kernels by it */
} sf_kv_config;

/* Opaque backend-owned objects. */
typedef struct sf_backend sf_backend;
typedef struct sf_buf sf_buf;       /* activation buffer: rows x cols in the backend's act dtype */
typedef struct sf_weight sf_weight; /* an uploaded (or referenced) weight, possibly fused */

/* A weight is made of 1..4 parts stacked along rows (out features): fused QKV, gate/up.
 * bias[i] may have data == NULL. The CPU backend keeps pointers (no copy); the CUDA backend
 * converts and concatenates into one device buffer. */
typedef struct sf_weight_desc {
    int n_parts;
    sf_view part[4];
    sf_view bias[4];
} sf_weight_desc;

/* A collective queued by a communicator (hal/comm.h) as one op of a step: it queues its work
 * for n elements of dt at data (the backend's memory) on stream and returns SF_OK or an SF_*
 * code (the communicator keeps the message). It must not synchronise with the host, so that a
 * backend recording the step into a CUDA graph records it too; a replay of that graph runs the
 * recorded work again without calling fn. */
typedef int (*sf_coll_fn)(void *arg, void *data, int64_t n, sf_dtype dt, void *stream);

/* The all-reduce fused with the residual add and the RMSNorm after it (collective_norm): x is
 * summed over the ranks; with res, res += the sum (x is then scratch); out = rmsnorm(res or x)
 * * w, rounded as the backend's rmsnorm op. Every buffer is [rows, cols] contiguous, w [cols];
 * addresses are the backend's memory. */
typedef struct sf_coll_norm {
    void *x, *res, *out;
    const void *w;
    int64_t rows, cols;
    float eps;
    sf_dtype dt;
} sf_coll_norm;
typedef int (*sf_coll_norm_fn)(void *arg, const sf_coll_norm *a, void *stream);

/* ---- sampling on the backend ------------------------------------------------------ */
/* What the sample op needs of one logit row. The op draws one token id per row so that only
 * ids cross to the host. Semantics (identical on every backend; kernels/cpu/sample.c is the
 * reference the CUDA kernel is tested against):
 *   1. l = the row (fp32; bf16 widened); for each of the row's entries: l += bias (logit_bias),
 *      then the penalties: repetition (count > 0 or in_prompt): l = l > 0 ? l / rep : l * rep;
 *      then, count > 0: l -= frequency * count + presence.
 *   2. temperature <= 0 or top_k == 1: the smallest id of the largest l (greedy).
 *   3. x = l * (1 / temperature); tokens with l = -inf or NaN are never drawn. In the order
 *      (x descending, id ascending) the kept set is the shortest of: the first top_k (0: all);
 *      the shortest prefix whose mass exp(x - max) reaches top_p times the mass of the top-k
 *      set (masses summed in 2^-40 fixed point, so any summation order gives the same sum);
 *      every token with x >= max + log(min_p).
 *   4. The token is the kept argmax of x - log(E), E = -log1p(-u), u uniform from a hash of
 *      (seed, step, id): the Gumbel-max trick, so the draw is a pure function of (seed, step,
 *      logits) and needs no sort and no sequential RNG state.
 * Entries (id, count, in_prompt, bias) of one row have distinct ids; count is the id's
 * occurrences in the output so far. allow (NULL: every token) holds the row's allowed ids, bit
 * id % 32 of word id / 32 ((vocab + 31) / 32 words of host memory, at least one id of [0, vocab)
 * set): the others read as -inf in step 1 (a request held to a pattern, grammar or schema;
 * engine/step.c). logprobs > 0 asks for the row's log-probabilities too (sf_sample_lp). */
typedef struct sf_sample_row {
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed, step;     /* the draw of `step` in the stream of `seed` */
    int pen_off, n_pen;      /* the row's penalty entries: pen[pen_off .. pen_off + n_pen) */
    const uint32_t *allow;   /* the allowed ids, or NULL */
    int logprobs;            /* 0: none; 1 + n: the drawn id's log-probability and the n most likely
                              * ids (n <= SF_SAMPLE_TOP_MAX) into the op's lp[i] */
} sf_sample_row;

/* Whether a row's allow mask (vocab bits, or NULL) lets at least one id of [0, vocab) through. */
static inline int sf_sample_allow_ok(const uint32_t *allow, int vocab)
{
    if (!allow) return 1;
    for (int w = 0; w < vocab / 32; w++)
        if (allow[w]) return 1;
    return vocab % 32 && (allow[vocab / 32] & ((1u << (vocab % 32)) - 1));
}

typedef struct sf_sample_pen {
    int32_t id, count, in_prompt;
    float bias;
} sf_sample_pen;

/* A row's log-probabilities (sf_sample_row.logprobs), as OpenAI reports them: of l after step 1
 * (logit_bias, penalties, the allow mask), before temperature and truncation: l - logsumexp(l)
 * over the ids whose l is not -inf. A row with no such id: lp -inf, no top entries. */
#define SF_SAMPLE_TOP_MAX 20
typedef struct sf_sample_lp {
    float lp;                          /* the drawn id's */
    int32_t n_top;                     /* min(logprobs - 1, the ids whose l is not -inf) */
    int32_t top_id[SF_SAMPLE_TOP_MAX]; /* the most likely ids: l descending, the lower id first */
    float top_lp[SF_SAMPLE_TOP_MAX];
} sf_sample_lp;

struct sf_backend_ops {
    const char *name;
    void (*destroy)(sf_backend *b);
    const sf_hw_info *(*hw)(sf_backend *b);

    /* memory */
    int (*weight_new)(sf_backend *b, const sf_weight_desc *d, sf_weight **out, sf_error *err);
    void (*weight_free)(sf_backend *b, sf_weight *w);
    int (*buf_new)(sf_backend *b, int64_t rows, int64_t cols, sf_buf **out, sf_error *err);
    void (*buf_free)(sf_backend *b, sf_buf *buf);
    int (*kv_init)(sf_backend *b, const sf_kv_config *c, sf_error *err);
    /* Bytes one KV block takes across all layers (K and V), for sizing pools. */
    size_t (*kv_block_bytes)(sf_backend *b, const sf_kv_config *c);

    /* one step */
    int (*batch_begin)(sf_backend *b, const sf_batch *batch);
    /* x[T, d] = emb[tokens] */
    int (*embed)(sf_backend *b, const sf_weight *emb, sf_buf *x);
    /* If add != NULL: x += add (x is the residual stream). Then out = rmsnorm(x) * w. n rows. */
    int (*rmsnorm)(sf_backend *b, sf_buf *x, const sf_buf *add, const sf_weight *w, float eps, int n, sf_buf *out);
    /* y[n, m] = x[n, k] · W[m, k]^T (+ bias) */
    int (*matmul)(sf_backend *b, const sf_buf *x, const sf_weight *w, int n, sf_buf *y);
    /* qkv[T, (H + 2*Hkv) * hd]: rotate q and k in place by batch pos, append k and v to the
     * cache of `layer` at batch slots. */
    int (*rope_kv)(sf_backend *b, sf_buf *qkv, int layer, int n_heads, int n_kv_heads, const sf_rope *rope);
    /* out[T, H * hd] = causal attention of q (in qkv) over the paged cache of `layer`. */
    int (*attention)(sf_backend *b, const sf_buf *qkv, int layer, int n_heads, int n_kv_heads,
                     const sf_rope *rope, sf_buf *out);
    /* out[n, f] = silu(gu[:, :f]) * gu[:, f:] */
    int (*silu_mul)(sf_backend *b, const sf_buf *gu, int n, int f, sf_buf *out);
    /* out[L, d] = x[batch->logit_rows, :] */
    int (*get_rows)(sf_backend *b, const sf_buf *x, sf_buf *out);
    /* Copy n rows of logits to host fp32 memory (row-major, cols of buf). */
    int (*read_f32)(sf_backend *b, const sf_buf *buf, int n, float *host);
    int (*sync)(sf_backend *b);
    /* Starts the step's work queued so far (a graph being recorded is launched) and returns
     * without waiting, so that host work done next overlaps it. May be NULL: ops run as called. */
    int (*flush)(sf_backend *b);

    /* KV block copies for preemption by swap and prefix reuse (may be NULL). */
    int (*kv_copy_out)(sf_backend *b, const int32_t *blocks, int n, void *host);
    int (*kv_copy_in)(sf_backend *b, const int32_t *blocks, int n, const void *host);
    /* Batched KV block copies (may be NULL: kv_copy_out/in then): block blocks[i] goes to
     * (out = 1) or comes from (out = 0) host + slots[i] * stride, for i in [0, n), all layers,
     * in one call that waits once. stride >= kv_block_bytes; each block's host layout is
     * kv_copy_out's. SF_EINVAL (nothing copied) for an id out of range or a negative slot. The
     * CUDA backend moves a full block with one pitched copy (every layer's K and V) and an INT8
     * block with four, instead of one copy per layer and K/V (64 for Llama-3-8B). */
    int (*kv_copy_blocks)(sf_backend *b, const int32_t *blocks, const int32_t *slots, int n, void *host,
                          size_t stride, int out);

    /* Copy n rows of host fp32 memory (row-major, cols of buf) into buf: test inputs,
     * device-vs-CPU comparisons. */
    int (*write_f32)(sf_backend *b, sf_buf *buf, int n, const float *host);

    /* For the communicator (hal/comm.h): the address of buf's data (host memory for the CPU,
     * device memory for CUDA), its element type, and the stream the backend's ops run on
     * (cudaStream_t, NULL for the CPU). Work queued so far is ordered before anything the
     * caller queues on that stream. A backend that records or captures a step's ops (CUDA
     * graphs) ends the capture first, so collectives run eagerly. May be NULL: no tensor
     * parallelism on that backend. */
    int (*buf_raw)(sf_backend *b, sf_buf *buf, void **data, sf_dtype *dt, void **stream);

    /* Host memory the device copies from and to at full link speed (page-locked: CUDA's
     * cudaHostAlloc), for swap space and staging. May be NULL: sf_backend_host_alloc then gives
     * plain 4 KiB-aligned memory (what the CPU backend needs). */
    int (*host_alloc)(sf_backend *b, size_t bytes, void **out, sf_error *err);
    void (*host_free)(sf_backend *b, void *p);

    /* Queue fn(arg, buf's data, n, dtype, stream) as one op of the step, in order with the
     * ops around it, without ending a graph capture or replay: the step's graph then spans its
     * collectives. An op equal to the recorded one (same fn, arg, buffer and n) is replayed
     * from the graph without calling fn. May be NULL: the communicator uses buf_raw. */
    int (*collective)(sf_backend *b, sf_buf *buf, int64_t n, sf_coll_fn fn, void *arg);
    /* Queue fn(arg, {x, res, out, w, ...}, stream) as one op of the step, as collective does:
     * the all-reduce + residual add + RMSNorm of sf_coll_norm over `rows` rows of x (res may be
     * NULL; x, res and out as wide as w). May be NULL: the communicator then runs the
     * all-reduce and the backend's rmsnorm. */
    int (*collective_norm)(sf_backend *b, sf_buf *x, sf_buf *res, const sf_weight *w, float eps, int rows,
                           sf_buf *out, sf_coll_norm_fn fn, void *arg);
    /* Drops the recorded step graphs (later steps capture them again). Called before a
     * communicator whose calls a graph may hold is destroyed or aborted: NCCL waits for every
     * graph that captured its calls to be destroyed first. May be NULL. */
    void (*graphs_release)(sf_backend *b);

    /* Optional fused ops (NULL: the forward pass runs the plain ops instead). Each gives the
     * result of the plain sequence it replaces, up to the order of fp32 sums; a backend fuses
     * the shapes it can (CUDA: one row, i.e. batch-1 decode) and runs the plain ops for the
     * others, using the scratch buffers the caller passes (contents afterwards unspecified). */
    /* y[n, :] = rmsnorm(x[n, :]) * norm . W^T (+ bias), x unchanged (no residual add). glu: W is
     * gate rows then up rows (2f rows) and y[n, f] = silu(gate) * up. Scratch: tmp_x [n, cols of
     * x]; tmp_y [n, 2f] (glu only, else may be NULL). */
    int (*norm_matmul)(sf_backend *b, const sf_buf *x, const sf_weight *norm, float eps, const sf_weight *w, int n,
                       int glu, sf_buf *tmp_x, sf_buf *tmp_y, sf_buf *y);
    /* y[n, :] += x[n, :] . W^T (+ bias): a projection with the residual add in its epilogue; the
     * product is rounded to the activation type before the add, as matmul then rmsnorm's add
     * would. x and y are distinct; scratch: tmp [n, rows of w]. */
    int (*matmul_add)(sf_backend *b, const sf_buf *x, const sf_weight *w, int n, sf_buf *tmp, sf_buf *y);
    /* norm_matmul of the fused QKV weight ((H + 2*Hkv) * head_dim rows) over the batch's tokens
     * into qkv, then rope_kv on it: q and k rotated in place, k and v appended to the cache of
     * `layer`. Scratch: tmp_x [T, cols of x]. */
    int (*norm_qkv_rope)(sf_backend *b, const sf_buf *x, const sf_weight *norm, float eps, const sf_weight *wqkv,
                         int layer, int n_heads, int n_kv_heads, const sf_rope *rope, sf_buf *tmp_x, sf_buf *qkv);

    /* ids[i] = a token drawn from row i of logits (columns [0, vocab)) by rows[i], for i < n;
     * pen holds n_pen penalty entries (host memory, as are rows, their allow masks, ids and lp).
     * lp[i]: row i's log-probabilities where rows[i].logprobs > 0 (lp may be NULL when no row
     * asks). Ends the step: it waits for the ids. SF_EUNSUPPORTED when this call's sizes exceed
     * what the backend can do (the caller reads the logits and samples on the host instead);
     * SF_EINVAL on bad ids in pen, an allow mask with no id of the vocabulary, or logprobs
     * outside 0..1 + SF_SAMPLE_TOP_MAX (or asked for with lp NULL). May be NULL: the backend
     * has no sampler. */
    int (*sample)(sf_backend *b, const sf_buf *logits, int n, int vocab, const sf_sample_row *rows,
                  const sf_sample_pen *pen, int n_pen, int32_t *ids, sf_sample_lp *lp);
    /* The sample op in two halves, so that the host can work while the device runs the step:
     * sample_start takes sample's arguments, makes its checks and answers as it does (SF_OK,
     * SF_EUNSUPPORTED, SF_EINVAL) but returns once the draw and the copy of the ids are queued;
     * sample_wait waits for them and writes the ids (and lp) to the `ids` (and `lp`) given to
     * sample_start (which must stay valid until then). After a successful sample_start the next
     * call into the backend must be sample_wait. Both NULL: only sample exists. */
    int (*sample_start)(sf_backend *b, const sf_buf *logits, int n, int vocab, const sf_sample_row *rows,
                        const sf_sample_pen *pen, int n_pen, int32_t *ids, sf_sample_lp *lp);
    int (*sample_wait)(sf_backend *b);

    /* Async scheduling (optional; both or neither). sample_defer(b, 1): from then on sample_wait
     * returns at once and leaves its draw queued, and the ids of a queued draw reach the `ids`
     * (and lp) given to sample_start only at sample_take, which waits for the oldest queued draw
     * alone.
     * So the next step — its tokens taken from the last draw on the backend (sf_batch.src_row)
     * — can be queued before the ids of the step before it reach the host. Two draws may be
     * queued at once (SF_EINVAL for a third). sample_take with none queued: SF_OK (the backend
     * drew synchronously: sample wrote the ids). sample_defer(b, 0) takes effect with nothing
     * queued. */
    int (*sample_defer)(sf_backend *b, int on);
    int (*sample_take)(sf_backend *b);

    /* Prompt scoring: for rows [row0, row0 + n) of logits (columns [0, vocab)), the log-softmax
     * at targets[i]: lp[i], rank[i] (1 + the ids with a larger logit) and, with k > 0, the k most
     * likely ids (value descending, the lower id first among equals) in top_id / top_lp [n * k]
     * (past the vocabulary: -1, -inf); k <= 20. Host arrays; returns with the results there. Not
     * between sample_start and sample_wait. May be NULL: the caller reads the rows and scores
     * them on the host (kernels/cpu/score.c, which is this op's reference). */
    int (*score)(sf_backend *b, const sf_buf *logits, int row0, int n, int vocab, const int32_t *targets, int k,
                 float *lp, int32_t *rank, int32_t *top_id, float *top_lp);
};

struct sf_backend {
    const struct sf_backend_ops *ops;
    void *ctx;
};

/* Backend selection. name: "auto" (CUDA when a GPU is present, else CPU), "cpu", "cuda".
 * n_threads <= 0: all cores. */
typedef struct sf_backend_opts {
    const char *name;
    int n_threads;
    int device;            /* CUDA device ordinal */
    size_t mem_budget;     /* bytes the backend may take for weights + KV + activations (0: default) */
} sf_backend_opts;

int sf_backend_open(const sf_backend_opts *o, sf_backend **out, sf_error *err);
void sf_backend_close(sf_backend *b);

/* Probes, used by sf_backend_open and `semflow hal`. Measured numbers are cached on disk
 * ($XDG_CACHE_HOME/semflow/hal-*.json) unless force is set. */
int sf_hal_cpu_probe(sf_hw_info *hw, int force, sf_error *err);
int sf_hal_cuda_probe(int device, sf_hw_info *hw, int force, sf_error *err); /* SF_ENODEV without a GPU */
int sf_hal_cuda_available(void);  /* 1 if a CUDA device can be used */
/* Print hw as JSON (jansson) or as a human-readable table. */
char *sf_hw_info_json(const sf_hw_info *hw); /* malloc'd */
void sf_hw_info_print(FILE *f, const sf_hw_info *hw);

/* Host memory for copies to and from b's device: the backend's host_alloc (pinned on CUDA), or
 * 4 KiB-aligned memory (also when b is NULL). *out is NULL on failure (SF_ENOMEM with the size and what to do in err).
 * Free with sf_backend_host_free on the same backend. Any thread that may use b. */
int sf_backend_host_alloc(sf_backend *b, size_t bytes, void **out, sf_error *err);
void sf_backend_host_free(sf_backend *b, void *p);

/* Backend constructors (each file provides its own; CUDA one returns SF_ENODEV when built without CUDA). */
int sf_backend_cpu_new(const sf_backend_opts *o, sf_backend **out, sf_error *err);
int sf_backend_cuda_new(const sf_backend_opts *o, sf_backend **out, sf_error *err);

/* Device-memory counters of the CUDA backend: allocations made since open (all happen while
 * the model is set up; a step makes none) and bytes held. SF_ENODEV for other backends and
 * in builds without CUDA. */
typedef struct sf_backend_stats {
    int n_device_allocs;
    size_t device_bytes;
    long graphs_captured, graph_replays, graph_fallbacks; /* decode-step CUDA graphs */
    double last_step_host_us; /* host time of the last step: batch_begin to all work enqueued */
    /* the same step on the sf_now_s clock: its batch_begin, and when its work was all enqueued
     * (0 until a step has run) */
    double last_step_begin_s, last_step_enqueued_s;
    /* the device's own clock (events): its idle time between a draw (its ids written back) and
     * the next step's first work, summed over the steps that followed a draw, and how many */
    double idle_after_draw_us;
    long idle_after_draw_n;
    long head_draws; /* draws done with the step's lm_head (sf_batch.draw_row) */
} sf_backend_stats;
int sf_backend_cuda_stats(sf_backend *b, sf_backend_stats *s);

#endif
