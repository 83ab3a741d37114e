/* kernels.h — the C-callable launch API of the CUDA kernels (kernels/cuda/NAME.cu), used by
 * hal/hal_cuda.c and the device tests. Kernels know hal types only, nothing of the engine.
 *
 * Conventions: every pointer is device memory unless named host_*; bf16 tensors are passed as
 * uint16_t; matrices are row-major with a leading dimension (ld, in elements). Every function
 * enqueues on `s` and returns the cudaError_t of the launch (0 = cudaSuccess); nothing here
 * synchronises or allocates, except where a comment says so.
 */
#ifndef SF_KERNELS_CUDA_H
#define SF_KERNELS_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- conversions (convert.cu) -------------------------------------------------------- */
/* dst[r, c] (bf16, ld_dst) = src[r, c] for src in SF_DT_F32 / F16 / BF16 / Q8_0 (sf_dtype
 * values), src rows tightly packed (Q8_0: cols/32 blocks of 34 bytes per row). */
int sf_k_to_bf16(const void *src, int src_dtype, int64_t rows, int64_t cols, uint16_t *dst,
                 int64_t ld_dst, cudaStream_t s);
/* dst[r, c] (fp32, tight) = src[r, c] (bf16, ld_src). */
int sf_k_bf16_to_f32(const uint16_t *src, int64_t ld_src, int64_t rows, int64_t cols, float *dst,
                     cudaStream_t s);
/* n bf16 values, uniform in [-scale, scale), a pure function of (seed, index). */
int sf_k_fill_random(uint16_t *dst, int64_t n, uint64_t seed, float scale, cudaStream_t s);
/* Keeps the stream busy for ns nanoseconds: work queued behind it meanwhile starts without the
 * host's launch cost in front of it (the op profile times ops that way). */
int sf_k_hold(uint64_t ns, cudaStream_t s);

/* ---- embedding and row gather (embed.cu) -------------------------------------------- */
/* x[t, :] = emb[tokens[t], :] for t < T; ids outside [0, vocab) give a zero row (the host
 * checks ids before launching). */
int sf_k_embed(const uint16_t *emb, int64_t vocab, int64_t d, const int32_t *tokens, int T,
               uint16_t *x, int64_t ldx, cudaStream_t s);
/* out[i, :] = x[rows[i], :] for i < n, d columns. */
int sf_k_get_rows(const uint16_t *x, int64_t ldx, const int32_t *rows, int n, int64_t d,
                  uint16_t *out, int64_t ldo, cudaStream_t s);

/* ---- RMSNorm with fused residual add (rmsnorm.cu) ----------------------------------- */
/* For each of n rows: if add: x += add (rounded to bf16, written back to x);
 * out = bf16(x * rsqrt(mean(x^2) + eps)) * w. out may equal x. */
int sf_k_rmsnorm(uint16_t *x, int64_t ldx, const uint16_t *add, int64_t ld_add, const uint16_t *w,
                 float eps, int n, int d, uint16_t *out, int64_t ldo, cudaStream_t s);

/* Benchmarks only: the one-pass kernel with `vpt` 16-byte vectors per thread (1, 2, 4, 8; the
 * block is d / 8 / vpt threads rounded to warps, <= 512), the weights loaded with the row
 * (prefetch_w) or after the reduction, rows_per_block 1 or 2 (loads of both rows in flight) or
 * more: a block per rows_per_block rows in a software-pipelined loop (the next row's loads before
 * the current row's reduction and stores; weights always held). cudaErrorInvalidValue for shapes
 * that kernel does not take. */
int sf_k_rmsnorm_tune(int vpt, int prefetch_w, int rows_per_block, uint16_t *x, int64_t ldx, const uint16_t *add,
                      int64_t ld_add, const uint16_t *w, float eps, int n, int d, uint16_t *out, int64_t ldo,
                      cudaStream_t s);

/* ---- SiLU * mul (silu_mul.cu) --------------------------------------------------------- */
/* out[i, j] = silu(gu[i, j]) * gu[i, f + j], i < n, j < f. */
int sf_k_silu_mul(const uint16_t *gu, int64_t ld_gu, int n, int f, uint16_t *out, int64_t ldo,
                  cudaStream_t s);

/* ---- paged KV layout ------------------------------------------------------------------ */
/* One layer's K (and V) cache: [n_blocks][n_kv_heads][block_size][head_dim] bf16.
 * Token slot = block * block_size + offset.
 * INT8 blocks (hal.h, sf_kv_config.int8): block ids >= i8_base (0: none) are half-block units
 * u = id - i8_base of the same memory: rows (token, kv head h) of head_dim int8 at
 * (int8_t *)k + ((u * n_kv_heads + h) * block_size + offset) * head_dim, each with an fp32
 * scale (max|x| / 127) at k_scale[(u * n_kv_heads + h) * block_size + offset]; V alike. */
typedef struct sf_k_kv {
    uint16_t *k, *v;
    int block_size, n_kv_heads, head_dim;
    float *k_scale, *v_scale;
    int i8_base;
} sf_k_kv;

/* ---- RoPE + KV append (rope_kv.cu) ----------------------------------------------------- */
/* qkv[T, (H + 2*Hkv) * hd] (ld): rotate q and k heads of token t by pos[t] in place (the first
 * rot_dim dims; interleaved: pairs (2i, 2i+1), else halves (i, i + rot/2)), angle =
 * pos * inv_freq[i] (inv_freq: device, rot/2 floats); then write k and v of token t into the
 * cache at slot[t] (slot < 0: not written), quantised per (token, kv head) when the slot is in
 * an INT8 block: scale = max|x| / 127 of the bf16 values, q = round(x / scale). */
int sf_k_rope_kv(uint16_t *qkv, int64_t ld, int T, const int32_t *pos, const int32_t *slot,
                 int H, int Hkv, int hd, int rot_dim, int interleaved, const float *inv_freq,
                 sf_k_kv kv, cudaStream_t s);

/* Benchmarks only: the 16-byte path with `threads` per block (64, 128, 256) and head groups
 * sized for about target_blocks blocks; cudaErrorInvalidValue for shapes it does not take. */
int sf_k_rope_kv_tune(int threads, int target_blocks, uint16_t *qkv, int64_t ld, int T, const int32_t *pos,
                      const int32_t *slot, int H, int Hkv, int hd, int rot_dim, int interleaved,
                      const float *inv_freq, sf_k_kv kv, cudaStream_t s);

/* ---- GGUF block formats read in place (qgemv.cu) -------------------------------------- */
/* Weights of dtype Q8_0, Q4_K, Q5_K or Q6_K (sf_dtype values) in hal.h's sf_qdev layout, rows
 * `pitch` bytes apart (a multiple of 16), k columns (whole blocks). */
/* Up to SF_K_QGEMV_MAX_N rows of x: a launch takes 8 of them (x in int8 in shared memory, the
 * sums in registers), more are taken 8 at a time, each launch reading the weights again. */
#define SF_K_QGEMV_MAX_N 64
/* y[t, r] = W[r, :] . x'[t, :] (+ bias[r]) for t < n <= SF_K_QGEMV_MAX_N, r < m; add: y +=
 * instead. x' is x, or with nw (k bf16, 16-byte aligned) RMSNorm(x) * nw with eps, rounded to
 * bf16 as sf_k_rmsnorm rounds it. glu (m even, no add): W is gate rows then up rows (bias
 * likewise, m values) and y[t, r] = silu(gate_r) * up_r for r < m / 2, rounded as
 * sf_k_silu_mul rounds it. x' is rounded to int8 per 32 elements (the result exact against
 * x' so rounded); x 16-byte aligned, ldx a multiple of 8. */
int sf_k_qgemv(int dtype, const void *w, int64_t pitch, int m, int k, const uint16_t *x, int64_t ldx, int n,
               const uint16_t *nw, float eps, const uint16_t *bias, int glu, uint16_t *y, int64_t ldy, int add,
               cudaStream_t s);
/* The same GEMV (x' as above) over rows [row0, row0 + m) of a QKV weight of (H + 2 Hkv) heads of
 * hd rows (row0 and m whole heads; w that part's rows, bias and qkv the whole weight's, qkv rows
 * ldq apart), each output pair then rotated and stored as sf_k_rope_kv does: row t at position
 * pos[t], its k and v heads written to the cache at slot[t] (slot < 0: not written). A cache
 * with INT8 blocks is refused: such steps take sf_k_rope_kv. */
int sf_k_qgemv_rope(int dtype, const void *w, int64_t pitch, int m, int row0, int k, const uint16_t *x, int64_t ldx,
                    int n, const uint16_t *nw, float eps, const uint16_t *bias, int H, int Hkv, int hd, int rot_dim,
                    int interleaved, const int32_t *pos, const int32_t *slot, const float *inv_freq, sf_k_kv kv,
                    uint16_t *qkv, int64_t ldq, cudaStream_t s);
/* out[i, :] = W[rows ? rows[i] : row0 + i, :] as bf16 for i < n (rows are checked by the
 * caller); out 16-byte aligned, ldo a multiple of 8. */
int sf_k_qdequant(int dtype, const void *w, int64_t pitch, int k, const int32_t *rows, int64_t row0, int n,
                  uint16_t *out, int64_t ldo, cudaStream_t s);

/* ---- attention over the paged cache (attention.cu) ------------------------------------ */
typedef struct sf_k_attn {
    const uint16_t *q;       /* [T, ld_q]: head h of token t at q + t*ld_q + h*hd */
    int64_t ld_q;
    uint16_t *out;           /* [T, ld_out]: head h at out + t*ld_out + h*hd */
    int64_t ld_out;
    int T, H, Hkv, hd;
    float scale;
    const int32_t *pos;      /* [T] the token attends keys at positions 0..pos[t] of its sequence */
    const int32_t *tok_seq;  /* [T] sequence index of token t */
    const int32_t *block_table; /* [S, max_blocks] */
    int max_blocks;
    sf_k_kv kv;
    float *ws;               /* split workspace: T * H * n_split * (hd + 2) floats */
    int n_split;             /* 1: no split; else keys split into n_split ranges + a combine */
    unsigned *counters;      /* split: [T * Hkv * SF_K_ATTN_CNT_PER_KVH] zeros; the last block of
                              * each (t, kv head), or of each part where the lanes kernel cuts a
                              * group, combines and resets its counter (NULL: a second kernel combines) */
    const int32_t *tiles;    /* prefill: [n_tiles][2] = first token, rows (<= 64 consecutive
                              * tokens of one sequence, consecutive positions) */
    int n_tiles;             /* > 0: the tensor-core prefill kernel (when head_dim % 16 == 0) */
    const int32_t *rows;     /* decode, stream kernel only: query i < T is token rows[i] (its q, out,
                              * pos, tok_seq and counter); NULL: token i. Lets the single-token
                              * sequences of a step with prefill tiles take the decode kernel */
    int kernel;              /* decode: the kernel planned with the split (sf_k_attention_decode_plan:
                              * 1 lanes, 2 mma, 3 stream, 4 (SF_K_ATTN_DEC_B1) mma in its one-token
                              * configuration, 5 (SF_K_ATTN_DEC_B1_8W) in its 8-warp one);
                              * 0: sf_k_attention_decode decides by T and SEMFLOW_CUDA_DECODE_ATTN
                              * alone */
} sf_k_attn;
#define SF_K_ATTN_DEC_B1 4 /* sf_k_attn.kernel: the tensor-core kernel's one-token configuration */
#define SF_K_ATTN_DEC_B1_8W 5 /* sf_k_attn.kernel: its 8-warp one-token configuration (long contexts) */
/* Largest group H/Hkv and head_dim the attention kernel takes. */
#define SF_K_ATTN_MAX_GROUP 16
/* Split counters per (token, kv head): one per part of a cut group (sf_k_attn.counters). */
#define SF_K_ATTN_CNT_PER_KVH 2
#define SF_K_ATTN_MAX_HD 256
/* Dispatcher: the tensor-core prefill kernel when a->n_tiles > 0 and the head size allows it,
 * else the CUDA-core kernel (GQA-grouped, split-K for decode). */
int sf_k_attention(const sf_k_attn *a, cudaStream_t s);
/* The two paths (attention.cu, attention_prefill.cu). */
int sf_k_attention_prefill(const sf_k_attn *a, cudaStream_t s);
int sf_k_attention_prefill_ok(int head_dim);
/* The WMMA prefill kernels alone (attention_prefill.cu): register-resident O for head sizes 64
 * and 128, O in shared memory for the other head sizes _ok takes. */
int sf_k_attention_prefill_wmma(const sf_k_attn *a, cudaStream_t s);
/* The FlashAttention-2-style prefill kernel (attention_prefill_fa2.cu: mma.sync, cp.async from
 * the paged cache): head_dim 64 or 128, scale > 0, a tile list. block_rows: query rows per block,
 * 64 (16 per warp) or 128 (32 per warp: pairs of consecutive tiles of one sequence), 0: 128 when
 * the pairs make >= 2 blocks per SM, else 64. sf_k_attention_prefill takes it whenever _ok says
 * so, unless SEMFLOW_ATTN_PREFILL=wmma selects the WMMA kernels; SEMFLOW_ATTN_PREFILL=fa2-64 /
 * fa2-128 fix the rows; SEMFLOW_ATTN_FA2_BK=32 takes 32-key tiles (instead of 64) for 128 rows of
 * head size 128. Both switches are read once per process (a malformed value warns and keeps the
 * default). _keys: key_rows 32 or 64 fixes the key tile (128 rows of head size 128), 0 follows
 * SEMFLOW_ATTN_FA2_BK. */
int sf_k_attention_prefill_fa2(const sf_k_attn *a, int block_rows, cudaStream_t s);
int sf_k_attention_prefill_fa2_keys(const sf_k_attn *a, int block_rows, int key_rows, cudaStream_t s);
int sf_k_attention_prefill_fa2_ok(const sf_k_attn *a);
#define SF_K_PREFILL_TILE 64

/* ---- GEMM: y[n, m] = x[n, k] . W[m, k]^T (+ bias[m]) (gemm.cu, gemv.cu) --------------- */
typedef struct sf_k_gemm_ctx sf_k_gemm_ctx; /* cuBLASLt handle, workspace, per-shape plan cache */
/* Allocates the cuBLASLt workspace (cudaMalloc, counted into *n_mallocs). */
int sf_k_gemm_ctx_new(sf_k_gemm_ctx **out, int *n_mallocs);
void sf_k_gemm_ctx_free(sf_k_gemm_ctx *g);
/* Dispatcher: for n <= 8 it times the GEMV kernel and cuBLASLt once per shape (first call;
 * that call synchronises the stream) and keeps the faster; larger n go to cuBLASLt with a
 * heuristic chosen once per shape. Returns 0 or a cudaError_t / cublasStatus_t + 10000. */
int sf_k_gemm(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
              int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s);
/* The two paths, callable directly (tests, benchmarks). */
int sf_k_gemm_lt(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                 int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s);
int sf_k_gemv(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
              int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s);
/* y += x . W^T (+ bias) through cuBLASLt (beta = 1, in place; one rounding of the sum), and
 * whether cuBLASLt has an algorithm for the shape (makes its plan: no launch, no sync). */
int sf_k_gemm_lt_acc(sf_k_gemm_ctx *g, const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
                     int n, int m, int k, uint16_t *y, int64_t ldy, cudaStream_t s);
int sf_k_gemm_lt_ok(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy);
/* 1 when sf_k_gemm on this shape will neither synchronise nor allocate (its plan and, for
 * n <= 8, its path are already chosen): safe inside a CUDA graph capture. */
int sf_k_gemm_ready(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy);
/* Which path the dispatcher chose for a shape: 0 unknown yet, 1 GEMV, 2 cuBLASLt. */
int sf_k_gemm_choice(sf_k_gemm_ctx *g, int n, int m, int k);
const char *sf_k_gemm_error_str(int code);

/* ---- measured cuBLASLt algorithm choice (gemm_tune.cu) ------------------------------------- */
/* Turns the tuner on: from then on the first use of each (m, k, bias, accumulate, n bucket) with
 * n > 8, outside a graph capture, times cuBLASLt's candidates on scratch buffers of its own
 * (allocated and freed there; it synchronises the stream) and keeps the fastest correct one for
 * every n of the bucket. Winners are read from and written to cache_path (JSON, per GPU; NULL:
 * none). budget_s bounds the context's total tuning time; later shapes keep the heuristic's first
 * choice. Until called (and for n <= 8 or n > 256) plans use the heuristic's first choice. */
int sf_k_gemm_tune_enable(sf_k_gemm_ctx *g, const char *cache_path, double budget_s);
/* The tuning bucket of n (the largest n it was timed at), 0 when n is not tuned. */
int sf_k_gemm_bucket(int n);
/* Makes the plan of a GEMM (acc: the sf_k_gemm_lt_acc flavour) and tunes its bucket when that
 * is due and s is not capturing: called before an op is recorded, so a capture only ever sees
 * decided plans. Returns 0 or an error as sf_k_gemm does. */
int sf_k_gemm_prepare(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy, int acc,
                      cudaStream_t s);
/* sf_k_gemm_ready for sf_k_gemm_lt_acc. */
int sf_k_gemm_acc_ready(sf_k_gemm_ctx *g, const uint16_t *bias, int n, int m, int k, int64_t ldx, int64_t ldy);
/* What the tuner decided for a shape's bucket: 1 and *out filled when it has an entry (us,
 * heuristic_us: mean µs at n = nb of the winner and of the heuristic's first; n_candidates 0:
 * tuning failed, the heuristic stays), else 0. */
typedef struct sf_k_gemm_tune_stat {
    int nb, n_candidates, from_cache;
    float us, heuristic_us, tune_ms;
} sf_k_gemm_tune_stat;
int sf_k_gemm_tune_info(sf_k_gemm_ctx *g, int n, int m, int k, int has_bias, int acc, sf_k_gemm_tune_stat *out);
/* Seconds this context has spent tuning. */
double sf_k_gemm_tune_spent(sf_k_gemm_ctx *g);

/* ---- batch-1 GEMVs with fused neighbours (gemv_fused.cu) ----------------------------------- */
/* One activation row x[k] (bf16, 16-byte aligned, k % 8 == 0), W[m, k] row-major, 16-byte aligned:
 * sf_k_gemv_fused_ok says whether a shape and its pointers qualify. x and y must not overlap. */
#define SF_K_GEMV_NORM_MAX_K 16384 /* the normalised row is held in shared memory */
int sf_k_gemv_fused_ok(const void *x, const void *w, int k);
/* z = bf16(rmsnorm(x) * nw) . W^T (+ bias); glu == 0: y[m] = z; glu == 1: W is gate rows then
 * up rows (m even) and y[m / 2] = silu(z[j]) * z[m/2 + j]. */
int sf_k_gemv_norm(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias,
                   int m, int k, int glu, uint16_t *y, cudaStream_t s);
/* y[m] += x . W^T (+ bias): the residual add in the epilogue (the product is rounded to bf16
 * first, as the unfused GEMV-then-add does). */
int sf_k_gemv_add(const uint16_t *x, const uint16_t *w, const uint16_t *bias, int m, int k, uint16_t *y,
                  cudaStream_t s);
/* qkv[(H + 2 Hkv) * hd] = bf16(rmsnorm(x) * nw) . Wqkv^T (+ bias), then what sf_k_rope_kv does
 * for one token at pos[0] / slot[0] (device pointers): q and k heads rotated, k and v heads
 * written to the cache (bf16 blocks only: kv.i8_base must be 0). attn_kernel: the step's planned
 * decode attention (sf_k_attn.kernel; 0 unknown), whose blocks start beside this projection's
 * last ones, so it picks the projection's kernel. */
int sf_k_gemv_norm_rope(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias,
                        int k, int H, int Hkv, int hd, int rot_dim, int interleaved, const int32_t *pos,
                        const int32_t *slot, const float *inv_freq, sf_k_kv kv, int attn_kernel, uint16_t *qkv,
                        cudaStream_t s);

/* Benchmarks only: kind 0 norm, 1 norm + glu, 2 add, with `warps` per block (4, 8, 16) and
 * `unroll` 16-byte loads per row in flight per lane (4, 8; 100 + n: one row per warp, n loads;
 * not glu; 201: two rows per warp through the cp.async ring, 200: one, not glu); no bias. */
int sf_k_gemv_fused_tune(int kind, int warps, int unroll, const uint16_t *x, const uint16_t *nw, const uint16_t *w,
                         int m, int k, uint16_t *y, cudaStream_t s);
/* Benchmarks only: the same kinds on persistent warps (gemv_stream.cu) with cfg = blocks per SM
 * (1..3) x 10 + ring stages per warp (3..6); cudaErrorInvalidValue where that does not fit. */
int sf_k_gemv_stream_tune(int kind, int cfg, const uint16_t *x, const uint16_t *nw, const uint16_t *w, int m, int k,
                          uint16_t *y, cudaStream_t s);

/* ---- the same fused GEMVs for 2-8 rows, on tensor cores (gemv_rows.cu) ---------------------- */
/* n rows of x (ldx elements apart, 16-byte aligned) against W[m, k] (16-byte aligned, k % 32 ==
 * 0), each output row ldy elements apart: what the batch-1 ops above compute, row by row (RoPE
 * with pos[i], slot[i] for row i). x and y must not overlap. sf_k_gemv_rows_ok says whether a
 * shape takes the kernel (x fits its shared memory: n * k up to ~100k; SEMFLOW_CUDA_GEMV_ROWS=0
 * turns it off); kind one of these. */
#define SF_K_GEMV_ROWS_MAX 8
enum { SF_K_ROWS_NORM = 1, SF_K_ROWS_GLU, SF_K_ROWS_ADD, SF_K_ROWS_ROPE, SF_K_ROWS_PLAIN };
int sf_k_gemv_rows_ok(int kind, int n, const void *x, int64_t ldx, const void *w, int m, int k, int64_t ldy);
int sf_k_gemv_rows_norm(const uint16_t *x, int64_t ldx, const uint16_t *nw, float eps, const uint16_t *w,
                        const uint16_t *bias, int n, int m, int k, int glu, uint16_t *y, int64_t ldy, cudaStream_t s);
int sf_k_gemv_rows_add(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias, int n, int m, int k,
                       uint16_t *y, int64_t ldy, cudaStream_t s);
int sf_k_gemv_rows_plain(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias, int n, int m, int k,
                         uint16_t *y, int64_t ldy, cudaStream_t s);
int sf_k_gemv_rows_rope(const uint16_t *x, int64_t ldx, const uint16_t *nw, float eps, const uint16_t *w,
                        const uint16_t *bias, int n, int k, int H, int Hkv, int hd, int rot_dim, int interleaved,
                        const int32_t *pos, const int32_t *slot, const float *inv_freq, sf_k_kv kv, uint16_t *qkv,
                        int64_t ldq, cudaStream_t s);
/* Benchmarks only: kind (not RoPE) with cfg a configuration as SEMFLOW_CUDA_GEMV_ROWS_CFG takes
 * ([1000: 8 warps a block] + ring 1 or 3 x 100 + blocks per SM (1, 2) x 10 + stages (3, 4, 6,
 * 8)); x rows k apart, y rows m (glu: m / 2) apart. */
int sf_k_gemv_rows_tune(int kind, int cfg, int n, const uint16_t *x, const uint16_t *nw, const uint16_t *w, int m,
                        int k, uint16_t *y, cudaStream_t s);

/* ---- residual add (add.cu) ------------------------------------------------------------------ */
/* y[i, :d] = bf16(y[i, :d] + a[i, :d]) for i < n. */
int sf_k_add(uint16_t *y, int64_t ldy, const uint16_t *a, int64_t lda, int n, int d, cudaStream_t s);

/* ---- decode attention (attention_decode.cu) -------------------------------------------------- */
/* Single-query attention (a->n_tiles == 0) over a bf16 cache for head_dim 64 or 128 and GQA
 * groups up to SF_K_ATTN_DECODE_MAX_GROUP, split over a->n_split (<= 64) key ranges combined by
 * the last block (needs a->ws and a->counters when n_split > 1). Same contract as sf_k_attention
 * otherwise. sf_k_attention_decode_ok says whether it takes `a`. */
#define SF_K_ATTN_DECODE_MAX_GROUP 8
int sf_k_attention_decode_ok(const sf_k_attn *a);
int sf_k_attention_decode(const sf_k_attn *a, cudaStream_t s);
/* What one block of a one-token step of head size hd and GQA group takes of an SM: registers
 * and shared memory (bytes, the per-block reservation included); 0 on success. */
int sf_k_attention_decode_block(int hd, int group, int *regs, int *smem);
/* Groups of 5..8 heads run as two blocks of the 4-head instance per (token, kv head, split),
 * each with its part of the group's heads, rather than one block of the 8-head instance: on = 1,
 * 0, or -1 as SEMFLOW_CUDA_ATTN_HEAD_SPLIT says (default on). Tests run both. */
void sf_k_attention_decode_head_split(int on);
/* Its bf16 steps of 2..16 splits combine them in a thread-block cluster (distributed shared
 * memory) rather than through a->ws, and so do one-token plans of the tensor-core kernel
 * (sf_k_attention_decode_mma_cluster): on = 1 always where the device fits the clusters, 0
 * never, -1 as SEMFLOW_CUDA_ATTN_CLUSTER says (default on). Tests run both. */
void sf_k_attention_decode_cluster(int on);
/* The batch path (attention_decode_mma.cu): tensor cores, a cp.async ring of 16-key-per-warp
 * tiles, bf16 and INT8 blocks (block size a power of 2, >= 16). cfg = warps per block x 10 + ring
 * depth: 42 (the default; 0 means it), 43, 23, 24; or 100 + 4 warps x 10 + depth 3..5 (143, 144,
 * 145) and 183 (8 warps, 3 stages; bf16, INT8 takes 144): the one-token instances, whose split
 * combine loads every output's pieces in one round; one-token steps take SF_K_DEC_MMA_B1_CFG, or
 * SF_K_DEC_MMA_B1_8W_CFG at long contexts (attention_decode.cu's plan). sf_k_attention_decode
 * chooses it by shape (and SEMFLOW_CUDA_DECODE_ATTN=lanes|mma|auto); callable directly for tests. */
#define SF_K_DEC_MMA_B1_CFG 144
#define SF_K_DEC_MMA_B1_8W_CFG 183
int sf_k_attention_decode_mma_ok(const sf_k_attn *a);
int sf_k_attention_decode_mma(const sf_k_attn *a, int cfg, cudaStream_t s);
/* Its one-token instance SF_K_DEC_MMA_B1_CFG (head size 128, bf16 blocks) with the 2..16 splits
 * of each (token, kv head) combined in a thread-block cluster's shared memory rather than through
 * a->ws, where the device holds all T x Hkv clusters at once: 0 or a cudaError_t, or -1 where it
 * does not apply (the caller then takes sf_k_attention_decode_mma). sf_k_attention_decode takes
 * it for one-token plans while sf_k_attention_decode_cluster allows. */
int sf_k_attention_decode_mma_cluster(const sf_k_attn *a, int cfg, cudaStream_t s);
/* Blocks of that kernel (head size, INT8 instance, cfg) resident per SM on the current device. */
int sf_k_attention_decode_mma_per_sm(int hd, int int8, int cfg);
/* The persistent batch path (attention_decode_stream.cu): the same tiles as one stream of 64-key
 * tiles cut evenly over the resident blocks (at most max_blocks when > 0), the pieces of items cut
 * by block boundaries combined by the last one. Needs what the mma path needs plus a->n_split >= 2
 * with a->ws and a->counters: the grid is at most T * Hkv * n_split / 2 blocks (two workspace
 * slots each). cfg: 42 (default; 0 means it) or 43 (ring depth 3). SEMFLOW_CUDA_DECODE_ATTN=stream
 * makes sf_k_attention_decode choose it for batches. */
int sf_k_attention_decode_stream_ok(const sf_k_attn *a);
int sf_k_attention_decode_stream(const sf_k_attn *a, int cfg, int max_blocks, cudaStream_t s);
int sf_k_attention_decode_stream_per_sm(int hd, int int8, int cfg);
/* The key split the decode dispatcher wants for a decode step of T tokens (contexts up to
 * max_ctx) on `sms` SMs, for the kernel sf_k_attention_decode will pick (kernel 0), or for the
 * lanes (1), mma (2) or stream (3: the workspace's slots, see above) kernel; int8: the step has
 * INT8 blocks. 1..64. Host only; cheap after its first call. */
int sf_k_attention_decode_split(int T, int Hkv, int hd, int max_ctx, int block_size, int int8, int sms, int kernel);
/* The same for the kernel the dispatcher would choose by itself (SEMFLOW_CUDA_DECODE_ATTN, else
 * auto: by tokens, max_ctx and the GQA group, 0 if unknown), which it returns in *kernel (1
 * lanes, 2 mma, 3 stream, 4 mma for one token) for
 * sf_k_attn.kernel: batch_begin plans once per step, the launches (and graph replays) follow. */
int sf_k_attention_decode_plan(int T, int Hkv, int group, int hd, int max_ctx, int block_size, int int8, int sms,
                               int *kernel);

/* ---- sampling (sample.cu) --------------------------------------------------------------- */
/* The layouts of hal.h's sf_sample_row / sf_sample_pen (hal_cuda.c asserts they agree). */
typedef struct sf_k_sample_row {
    float temperature, top_p, min_p;
    int top_k;
    float repetition_penalty, presence_penalty, frequency_penalty;
    uint64_t seed, step;
    int pen_off, n_pen;
    const uint32_t *allow; /* device memory here (the backend's copy), or NULL */
    int logprobs;
} sf_k_sample_row;
typedef struct sf_k_sample_pen { int32_t id, count, in_prompt; float bias; } sf_k_sample_pen;
#define SF_K_SAMPLE_TOP_MAX 20
typedef struct sf_k_sample_lp { float lp; int32_t n_top; int32_t top_id[SF_K_SAMPLE_TOP_MAX]; float top_lp[SF_K_SAMPLE_TOP_MAX]; } sf_k_sample_lp;
/* Largest vocabulary the penalty bitmap (shared memory) takes. */
#define SF_K_SAMPLE_MAX_VOCAB (36 * 1024 * 8) /* 36 KiB of bits: with the kernel's own 11 KiB, within 48 KiB */
/* Device scratch of the op (scratch below): counters for up to SF_K_SAMPLE_SPLIT_ROWS rows, then
 * the parts of rows split over blocks (24 KiB per row: calls of up to ~84 rows split); zero when
 * first given, the op leaves it so. */
#define SF_K_SAMPLE_SCRATCH ((size_t)2 << 20)
#define SF_K_SAMPLE_SPLIT_ROWS 1024
/* ids[i] = the token drawn from row i of logits (bf16, ld) by rows[i], i < n: one block per
 * row, or, for a few rows (greedy, temperature alone, top-k, top-p, min-p), a row over several
 * blocks (scratch, NULL: never); the semantics of hal.h's sf_sample_row. pen_val: n_pen floats
 * of scratch (the penalized logits). vocab <= SF_K_SAMPLE_MAX_VOCAB; penalty ids in [0,
 * vocab), distinct per row (the host checks both). The ids are also written, where given (NULL:
 * not), into pinned host memory (ids_host, its device address; there once the launch is seen to
 * end) and into ids_next (the next step's token slots); rows may be pinned host memory too (each
 * block reads its row once). Launches on s one after another (the counters are shared). */
int sf_k_sample(const uint16_t *logits, int64_t ld, int n, int vocab, const sf_k_sample_row *rows,
                const sf_k_sample_pen *pen, int n_pen, float *pen_val, int32_t *ids, int32_t *ids_host,
                int32_t *ids_next, void *scratch, cudaStream_t s);
/* A row drawn with its lm_head (the graph's last two launches of a batch-1 step whose one row is
 * greedy, or at a temperature alone, with nothing else): sf_k_gemv_norm_best is sf_k_gemv_norm
 * (glu 0) that also does sf_k_sample's pass over the outputs it makes, y[i] for i < best_n:
 * best[0] gets the largest y[i] * inv_t that is not NaN, best[1] (only when draw, a row in host
 * memory mapped for the device or device memory, written before the step, is not greedy) the
 * largest Gumbel-max value over those that are not -inf either, each packed sf_sample_key(v) << 32
 * | ~i, so ties go to the smaller i (both 0 before). sf_k_sample_best_put (a programmatic
 * dependent) then writes the id (best[1]'s, else best[0]'s, else 0: sf_k_sample's choice) where
 * sf_k_sample writes a row's id (ids, ids_host, ids_next: row 0; the last two may be NULL) and
 * sets both words back to 0. */
int sf_k_gemv_norm_best(const uint16_t *x, const uint16_t *nw, float eps, const uint16_t *w, const uint16_t *bias,
                        int m, int k, uint16_t *y, unsigned long long *best, int best_n, const sf_k_sample_row *draw,
                        cudaStream_t s);
int sf_k_sample_best_put(unsigned long long *best, int32_t *ids, int32_t *ids_host, int32_t *ids_next,
                         cudaStream_t s);
/* Whether sf_k_gemv_norm_best takes a shape (the persistent-warp GEMV, SEMFLOW_CUDA_GEMV_RING=3,
 * the default, plans it); else it answers cudaErrorNotSupported and launches nothing. */
int sf_k_gemv_norm_best_ok(const void *x, const void *nw, const void *w, int m, int k);
/* After sf_k_sample on the same arguments (its penalized values in pen_val, its ids in ids,
 * both device memory): out[i] = row i's log-probabilities (hal.h's sf_sample_lp) for the rows
 * with logprobs > 0 (the others' untouched); one block a row. */
int sf_k_sample_logprobs(const uint16_t *logits, int64_t ld, int n, int vocab, const sf_k_sample_row *rows,
                         const sf_k_sample_pen *pen, int n_pen, float *pen_val, const int32_t *ids,
                         sf_k_sample_lp *out, cudaStream_t s);

/* Prompt scoring (score.cu): for rows [0, n) of logits (bf16, ld elements apart), the
 * log-softmax at targets[i] (device), its rank, and the k most likely ids (hal.h's score op). */
int sf_k_score(const uint16_t *logits, int64_t ld, int n, int vocab, const int32_t *targets, int k, float *lp,
               int32_t *rank, int32_t *top_id, float *top_lp, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
