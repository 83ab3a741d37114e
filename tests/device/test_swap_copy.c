/* test_swap_copy.c — the batched KV block copy on the CUDA backend (kv_copy_blocks): full and
 * INT8 blocks to scattered host slots and back, byte for byte equal to the per-block copies, bad
 * ids, slots and strides refused (tests/lib/kv_copy_case.h); then, Llama-3-8B shape (32 layers,
 * 8 KV heads of 128, blocks of 16 tokens: 2 MiB a block), 64 blocks swapped out and back in
 * through pinned memory, batched against one kv_copy_out / kv_copy_in per block, in GB/s.
 * GPU host only (exit 77 without one). */
#include "../lib/kv_copy_case.h"
#include "../test.h"

static sf_rng R;
static sf_backend *B;

TEST(batched_copy_equals_per_block)
{
    sf_kv_config kc = { .n_layers = 3, .n_blocks = 12, .block_size = 4, .n_kv_heads = 2, .head_dim = 8 };
    const char *why = kvc_roundtrip(B, &kc, &R);
    CHECK_MSG(!why, "full blocks: %s", why);
}

TEST(batched_copy_int8_blocks)
{
    sf_kv_config kc = { .n_layers = 4, .n_blocks = 16, .block_size = 16, .n_kv_heads = 2, .head_dim = 64, .int8 = 1 };
    const char *why = kvc_roundtrip(B, &kc, &R);
    CHECK_MSG(!why, "full and INT8 blocks: %s", why);
}

/* The swap path's copy time for one batch-summarize sequence (64 blocks, ~1000 tokens). */
TEST(batched_copy_time_llama3_8b)
{
    sf_kv_config kc = { .n_layers = 32, .n_blocks = 160, .block_size = 16, .n_kv_heads = 8, .head_dim = 128, .int8 = 1 };
    sf_error err = { 0 };
    REQUIRE(B->ops->kv_init(B, &kc, &err) == 0, "kv_init: %s", err.msg);
    size_t bb = B->ops->kv_block_bytes(B, &kc);
    enum { N = 64 };
    void *host = NULL;
    REQUIRE(sf_backend_host_alloc(B, bb * N, &host, &err) == SF_OK, "pinned memory: %s", err.msg);
    double us_b, us_p;
    kvc_time(B, bb, N, 1, host, 5, &us_b, &us_p);
    CHECK_MSG(us_b > 0 && us_p > 0, "a copy failed (batched %.0f us, per block %.0f us)", us_b, us_p);
    double gb = 2.0 * N * (double)(bb - (size_t)kc.n_layers * 2 * 2 * 8 * 16 * 4) / 1e9; /* data out and in */
    printf("  swap of %d blocks out and in (%.0f MB each way), Llama-3-8B shape: batched %.0f us (%.1f GB/s), "
           "per block %.0f us (%.1f GB/s): %.1fx\n", N, gb / 2 * 1e3, us_b, gb / (us_b * 1e-6), us_p,
           gb / (us_p * 1e-6), us_p / us_b);
    sf_backend_host_free(B, host);
}

int main(void)
{
    sf_rng_seed(&R, (uint64_t)sf_now_ns());
    printf("seed %llu\n", (unsigned long long)R.s[0]);
    sf_backend_opts o = { .name = "cuda" };
    sf_error err = { 0 };
    if (sf_backend_cuda_new(&o, &B, &err)) {
        printf("test_swap_copy: no CUDA device (%s); skipped\n", err.msg);
        return 77;
    }
    RUN(batched_copy_equals_per_block);
    RUN(batched_copy_int8_blocks);
    RUN(batched_copy_time_llama3_8b);
    B->ops->destroy(B);
    return test_summary();
}
