/* test_env_switches.c — the CUDA backend's SEMFLOW_* switches on a GPU: each one set to a
 * malformed value must be refused with a warning naming it (common/env.c), the backend then
 * opening with its default; set to a value the switch takes, it must open without a word. And
 * the attention kernels' and the GEMV's switches, read once at their first call. Run by
 * bench/device/throughput.sh. */
#include "common/sf.h"
#include "hal/hal.h"
#include "tests/lib/capture.h"
#include "tests/test.h"

#include <cuda_runtime.h>

#include "kernels/cuda/gemv_stream.h"
#include "kernels/cuda/kernels.h"

/* Opens and closes the CUDA backend with name=value set; returns what it logged, or NULL when
 * it did not open (the message is printed). */
static const char *open_with(const char *name, const char *value)
{
    setenv(name, value, 1);
    capture_begin();
    sf_backend_opts o = { .name = "cuda" };
    sf_backend *b = NULL;
    sf_error err = { 0 };
    int rc = sf_backend_open(&o, &b, &err);
    if (b) sf_backend_close(b);
    const char *log = capture_end();
    unsetenv(name);
    if (rc) {
        printf("      %s=%s: the backend did not open: %s\n", name, value, err.msg);
        return NULL;
    }
    return log;
}

static const struct { const char *name, *bad, *good; } switches[] = {
    { "SEMFLOW_CUDA_FUSED", "maybe", "0" },
    { "SEMFLOW_CUDA_ATTN_DECODE", "yes please", "on" },
    { "SEMFLOW_CUDA_MIXED_DECODE", "2", "0" },
    { "SEMFLOW_CUDA_GEMM_TUNE", "auto", "1" },
    { "SEMFLOW_CUDA_GEMM_TUNE_S", "abc", "5" },
    { "SEMFLOW_CUDA_GRAPHS", "sometimes", "1" },
    { "SEMFLOW_CUDA_GRAPH_TOKENS", "512k", "256" },
    { "SEMFLOW_CUDA_PROFILE", "true!", "0" },
    { "SEMFLOW_CUDA_GEMV_PLAIN", "yes please", "1" },
    { "SEMFLOW_CUDA_DRAW_MAPPED", "maybe", "0" },
    { "SEMFLOW_CUDA_META_SIDE", "sideways", "0" },
    { "SEMFLOW_CUDA_HEAD_DRAW", "greedy", "0" },
    { "SEMFLOW_CUDA_QUANT", "q4", "0" },
    { "SEMFLOW_CUDA_QFUSE", "fused", "1" },
    { "SEMFLOW_CUDA_QGEMV_ROWS", "65", "32" },
};

TEST(malformed_values_are_refused_by_name)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(switches); i++) {
        const char *log = open_with(switches[i].name, switches[i].bad);
        CHECK_MSG(log, "%s=%s: the backend must still open (with the default)", switches[i].name, switches[i].bad);
        if (!log) continue;
        char want[128];
        snprintf(want, sizeof want, "%s=%s", switches[i].name, switches[i].bad);
        CHECK_MSG(strstr(log, want) && strstr(log, "warn"), "%s: no warning naming it (log: %.300s)", want, log);
    }
}

TEST(accepted_values_are_silent)
{
    for (size_t i = 0; i < SF_ARRAY_LEN(switches); i++) {
        const char *log = open_with(switches[i].name, switches[i].good);
        CHECK_MSG(log && !strstr(log, switches[i].name), "%s=%s: %.300s", switches[i].name, switches[i].good,
                  log ? log : "(did not open)");
    }
}

/* The attention kernels' switches are read once per process, at the first call (not per
 * launch): malformed values warn by name and keep the defaults. This process runs no attention
 * before this test; empty steps launch nothing. */
TEST(attention_switches_read_once)
{
    setenv("SEMFLOW_ATTN_PREFILL", "FA2-128", 1);
    setenv("SEMFLOW_ATTN_FA2_BK", "48", 1);
    setenv("SEMFLOW_CUDA_DECODE_ATTN", "Stream", 1);
    setenv("SEMFLOW_CUDA_DECODE_ATTN_CFG", "43x", 1);
    setenv("SEMFLOW_CUDA_ATTN_HEAD_SPLIT", "both", 1);
    sf_k_attn a;
    memset(&a, 0, sizeof a);
    capture_begin();
    int r1 = sf_k_attention_prefill(&a, 0), r2 = sf_k_attention_prefill_fa2(&a, 0, 0);
    int r3 = sf_k_attention_decode_split(0, 8, 128, 512, 16, 0, 132, 0); /* no tokens: no split */
    int regs = 0, smem = 0, r4 = sf_k_attention_decode_block(128, 7, &regs, &smem); /* reads the head split */
    const char *log = capture_end();
    CHECK(r1 == 0 && r2 == 0 && r3 == 1 && r4 == 0);
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_ATTN_HEAD_SPLIT=both") && strstr(log, "default, 1"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_ATTN_PREFILL=FA2-128") && strstr(log, "fa2, fa2-64, fa2-128, wmma") &&
              strstr(log, "default, fa2"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_ATTN_FA2_BK=48") && strstr(log, "64, 32"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_DECODE_ATTN=Stream") && strstr(log, "default, auto"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_DECODE_ATTN_CFG=43x") && strstr(log, "default, 42"), "log: %.400s", log);
    unsetenv("SEMFLOW_CUDA_DECODE_ATTN");
    unsetenv("SEMFLOW_CUDA_DECODE_ATTN_CFG");
    unsetenv("SEMFLOW_CUDA_ATTN_HEAD_SPLIT");
    setenv("SEMFLOW_ATTN_PREFILL", "wmma", 1); /* read already: no second look, no second word */
    capture_begin();
    sf_k_attention_prefill(&a, 0);
    log = capture_end();
    CHECK_MSG(!strstr(log, "SEMFLOW_ATTN_PREFILL"), "log: %.400s", log);
    unsetenv("SEMFLOW_ATTN_PREFILL");
    unsetenv("SEMFLOW_ATTN_FA2_BK");
}

/* The persistent-warp GEMV's forced configurations, read once at its first launch: a malformed
 * SEMFLOW_CUDA_GEMV_CFG and a malformed entry of SEMFLOW_CUDA_GEMV_PLAN ("o=25x": trailing
 * characters; "lm=26": no such op) warn by name; the well-formed entries beside them are taken
 * without a word, and the GEMV still runs. */
TEST(gemv_plan_refuses_junk)
{
    enum { M = 64, K = 64 };
    uint16_t *x = NULL, *w = NULL, *y = NULL;
    REQUIRE(cudaMalloc((void **)&x, K * 2) == cudaSuccess && cudaMalloc((void **)&w, M * K * 2) == cudaSuccess &&
                cudaMalloc((void **)&y, M * 2) == cudaSuccess,
            "cudaMalloc failed");
    cudaMemset(x, 0, K * 2);
    cudaMemset(w, 0, M * K * 2);
    setenv("SEMFLOW_CUDA_GEMV_CFG", "99", 1);
    setenv("SEMFLOW_CUDA_GEMV_PLAN", "qkv=33,head=26,lm=26,o=25x", 1);
    capture_begin();
    int rc = sf_k_gemv_stream_plain(x, w, NULL, M, K, y, 0);
    if (!rc) rc = (int)cudaDeviceSynchronize();
    const char *log = capture_end();
    CHECK_MSG(rc == 0, "the GEMV failed: %s", cudaGetErrorString((cudaError_t)rc));
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_GEMV_CFG=99"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_GEMV_PLAN: 'o=25x'") && !strstr(log, "'qkv=33'"), "log: %.400s", log);
    /* the lm_head's class is named head; an op of no class is refused by name */
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_GEMV_PLAN: 'lm=26'") && !strstr(log, "'head=26'"), "log: %.400s", log);
    unsetenv("SEMFLOW_CUDA_GEMV_CFG");
    unsetenv("SEMFLOW_CUDA_GEMV_PLAN");
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
}

/* The 2-6 row GEMV's switches, read once at its first launch: a malformed SEMFLOW_CUDA_GEMV_ROWS
 * and SEMFLOW_CUDA_GEMV_ROWS_CFG warn by name, and the kernel still runs with its defaults (on,
 * planned). */
TEST(gemv_rows_switches_refuse_junk)
{
    enum { N = 2, M = 64, K = 64 };
    uint16_t *x = NULL, *w = NULL, *y = NULL;
    REQUIRE(cudaMalloc((void **)&x, N * K * 2) == cudaSuccess && cudaMalloc((void **)&w, M * K * 2) == cudaSuccess &&
                cudaMalloc((void **)&y, N * M * 2) == cudaSuccess,
            "cudaMalloc failed");
    cudaMemset(x, 0, N * K * 2);
    cudaMemset(w, 0, M * K * 2);
    setenv("SEMFLOW_CUDA_GEMV_ROWS", "maybe", 1);
    setenv("SEMFLOW_CUDA_GEMV_ROWS_CFG", "99", 1);
    capture_begin();
    const int ok = sf_k_gemv_rows_ok(SF_K_ROWS_PLAIN, N, x, K, w, M, K, M);
    int rc = sf_k_gemv_rows_plain(x, K, w, NULL, N, M, K, y, M, 0);
    if (!rc) rc = (int)cudaDeviceSynchronize();
    const char *log = capture_end();
    CHECK_MSG(ok && rc == 0, "the kernel did not run (ok %d): %s", ok, cudaGetErrorString((cudaError_t)rc));
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_GEMV_ROWS=maybe"), "log: %.400s", log);
    CHECK_MSG(strstr(log, "SEMFLOW_CUDA_GEMV_ROWS_CFG=99"), "log: %.400s", log);
    unsetenv("SEMFLOW_CUDA_GEMV_ROWS");
    unsetenv("SEMFLOW_CUDA_GEMV_ROWS_CFG");
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
}

/* The planner's kernel for one-token steps: the tensor-core kernel (4) for bf16 steps of GQA
 * groups of 4 from 512 keys and of 5 to 8 from 2048 (the measured cases: 4 and 7), in its 8-warp
 * configuration (5) at head size 128 for groups of 4 from 4096 keys and for the wider groups, the
 * lanes kernel (1) otherwise; batches keep theirs. Here because this process leaves
 * SEMFLOW_CUDA_DECODE_ATTN at auto (test_decode_attn forces the lanes kernel); after
 * attention_switches_read_once, whose malformed values kept the defaults. */
TEST(decode_attention_one_token_plan)
{
    int sms = 0, dev = 0;
    CHECK(cudaGetDevice(&dev) == cudaSuccess &&
          cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess);
    static const struct { int T, group, ctx, i8, want; } cases[] = {
        { 1, 4, 4096, 0, 5 }, { 1, 4, 1024, 0, 4 }, { 1, 4, 8000, 0, 5 }, { 1, 1, 8000, 0, 1 }, { 1, 4, 4095, 0, 4 },
        { 1, 4, 1000, 0, 4 }, { 1, 4, 512, 0, 4 },   { 1, 4, 511, 0, 1 },  { 1, 7, 4096, 0, 5 }, { 1, 8, 4096, 0, 5 },
        { 1, 7, 2048, 0, 5 }, { 1, 7, 1024, 0, 1 },  { 1, 2, 4096, 0, 1 }, { 1, 9, 4096, 0, 1 },
        { 1, 0, 4096, 0, 1 }, { 1, 4, 4096, 1, 1 },  { 2, 4, 4096, 0, 1 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        int kernel = -1;
        const int ns = sf_k_attention_decode_plan(cases[i].T, 8, cases[i].group, 128, cases[i].ctx, 16, cases[i].i8, sms,
                                                  &kernel);
        CHECK_MSG(kernel == cases[i].want && ns >= 1 && ns <= 64,
                  "T %d group %d ctx %d int8 %d: kernel %d (want %d), split %d", cases[i].T, cases[i].group,
                  cases[i].ctx, cases[i].i8, kernel, cases[i].want, ns);
    }
    int kernel = -1;
    CHECK(sf_k_attention_decode_plan(64, 8, 4, 128, 4096, 16, 0, sms, &kernel) >= 1 && kernel == 3); /* a batch: stream */
    /* head size 64 keeps the 4-warp configuration at any length */
    CHECK(sf_k_attention_decode_plan(1, 4, 8, 64, 8000, 16, 0, sms, &kernel) >= 1 && kernel == SF_K_ATTN_DEC_B1);
    /* the one-token split is one wave of the planned configuration's blocks, at most 32 (8 warps:
     * 24): 16 for 8 kv heads on the H200's 132 SMs (one block an SM), 24 for 4 (docs/PERFORMANCE.md
     * sessions 22 and 27) */
    const int per_sm = sf_k_attention_decode_mma_per_sm(128, 0, SF_K_DEC_MMA_B1_CFG);
    const int per_sm8 = sf_k_attention_decode_mma_per_sm(128, 0, SF_K_DEC_MMA_B1_8W_CFG);
    CHECK_MSG(per_sm >= 1 && per_sm8 >= 1, "blocks per SM %d, 8 warps %d", per_sm, per_sm8);
    int ns = sf_k_attention_decode_plan(1, 8, 4, 128, 4097, 16, 0, sms, &kernel);
    CHECK_MSG(ns == SF_MIN(per_sm8 * sms / 8, 32) && kernel == SF_K_ATTN_DEC_B1_8W, "split %d kernel %d (%d a SM)", ns,
              kernel, per_sm8);
    ns = sf_k_attention_decode_plan(1, 4, 7, 128, 4097, 16, 0, sms, &kernel);
    CHECK_MSG(ns == SF_MIN(per_sm8 * sms / 4, 24) && kernel == SF_K_ATTN_DEC_B1_8W, "4 kv heads: split %d kernel %d", ns,
              kernel);
    ns = sf_k_attention_decode_plan(1, 8, 4, 128, 3000, 16, 0, sms, &kernel);
    CHECK_MSG(ns == SF_MIN(per_sm * sms / 8, 32) && kernel == SF_K_ATTN_DEC_B1, "3000 keys: split %d kernel %d", ns,
              kernel);
    /* never more splits than tiles: 64 keys (4 warps), 128 (8 warps) */
    ns = sf_k_attention_decode_plan(1, 8, 4, 128, 1025, 16, 0, sms, &kernel);
    CHECK_MSG(ns >= 1 && ns <= 17 && kernel == SF_K_ATTN_DEC_B1, "1025 keys: split %d kernel %d", ns, kernel);
    ns = sf_k_attention_decode_split(1, 8, 128, 1025, 16, 0, sms, SF_K_ATTN_DEC_B1_8W);
    CHECK_MSG(ns >= 1 && ns <= 9, "1025 keys in 8-warp blocks: split %d", ns);
}

int main(void)
{
    sf_backend_opts o = { .name = "cuda" };
    sf_backend *b = NULL;
    sf_error err = { 0 };
    if (sf_backend_open(&o, &b, &err)) {
        printf("SKIP: no CUDA backend here: %s\n", err.msg);
        return 77;
    }
    sf_backend_close(b);
    RUN(attention_switches_read_once);
    RUN(decode_attention_one_token_plan);
    RUN(gemv_plan_refuses_junk);
    RUN(gemv_rows_switches_refuse_junk);
    RUN(malformed_values_are_refused_by_name);
    RUN(accepted_values_are_silent);
    return test_summary();
}
