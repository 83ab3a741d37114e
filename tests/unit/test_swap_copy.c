/* test_swap_copy.c — the batched KV block copy of the CPU backend (kv_copy_blocks): full and INT8
 * blocks to scattered host slots and back, equal to the per-block copies; bad ids, slots and
 * strides refused (tests/lib/kv_copy_case.h; tests/device/test_swap_copy.c runs the same on CUDA);
 * the swap space using it, and falling back to per-block copies when it fails. */
#include "../../engine/swap.h"
#include "../lib/kv_copy_case.h"
#include "../test.h"

static sf_rng R;

static sf_backend *open_cpu(void)
{
    sf_backend_opts o = { .name = "cpu", .n_threads = 1 };
    sf_backend *b = NULL;
    sf_error err = { 0 };
    if (sf_backend_cpu_new(&o, &b, &err)) printf("cpu backend: %s\n", err.msg);
    return b;
}

/* Round trip on a fresh CPU backend with this cache shape; NULL when it all matched. */
static const char *roundtrip_cpu(int int8)
{
    sf_backend *b = open_cpu();
    if (!b) return "no cpu backend";
    sf_kv_config kc = { .n_layers = 3, .n_blocks = 12, .block_size = 4, .n_kv_heads = 2, .head_dim = 8, .int8 = int8 };
    const char *why = kvc_roundtrip(b, &kc, &R);
    b->ops->destroy(b);
    return why;
}

TEST(batched_copy_equals_per_block)
{
    const char *why = roundtrip_cpu(0);
    CHECK_MSG(!why, "full blocks: %s", why);
}

TEST(batched_copy_int8_blocks)
{
    const char *why = roundtrip_cpu(1);
    CHECK_MSG(!why, "full and INT8 blocks: %s", why);
}

TEST(batched_copy_before_kv_init_refused)
{
    sf_backend *b = open_cpu();
    REQUIRE(b, "cpu backend");
    int32_t id = 0, slot = 0;
    char host[64];
    CHECK(b->ops->kv_copy_blocks(b, &id, &slot, 1, host, sizeof host, 1) == SF_EINVAL);
    b->ops->destroy(b);
}

static int batched_calls;
static int failing_copy_blocks(sf_backend *b, const int32_t *blocks, const int32_t *slots, int n, void *host,
                               size_t stride, int out)
{
    batched_calls++;
    return SF_ERROR; /* what a backend returns when the device fails the copy (SF_EINVAL: refused arguments) */
}
static int counting_calls;
static int (*real_copy_blocks)(sf_backend *, const int32_t *, const int32_t *, int, void *, size_t, int);
static int counting_copy_blocks(sf_backend *b, const int32_t *blocks, const int32_t *slots, int n, void *host,
                                size_t stride, int out)
{
    counting_calls++;
    return real_copy_blocks(b, blocks, slots, n, host, stride, out);
}

/* A CPU backend with a KV cache of 16 blocks of 2 layers; *bb: a block's bytes. */
static sf_backend *open_cpu_kv(size_t *bb)
{
    sf_backend *cpu = open_cpu();
    sf_kv_config kc = { .n_layers = 2, .n_blocks = 16, .block_size = 4, .n_kv_heads = 2, .head_dim = 8 };
    sf_error err = { 0 };
    if (cpu && cpu->ops->kv_init(cpu, &kc, &err)) {
        printf("      kv_init: %s\n", err.msg);
        cpu->ops->destroy(cpu);
        return NULL;
    }
    if (cpu) *bb = cpu->ops->kv_block_bytes(cpu, &kc);
    return cpu;
}

/* The swap space moves a sequence's blocks out and back in through kv_copy_blocks, one call per
 * DMA piece; when the backend's batched copy fails it logs, switches to per-block copies, and the
 * bytes still arrive. */
TEST(swap_uses_batched_copy_and_falls_back)
{
    size_t bb = 0;
    sf_backend *cpu = open_cpu_kv(&bb);
    REQUIRE(cpu, "cpu backend with a KV cache");
    sf_error err = { 0 };
    for (int mode = 0; mode < 2; mode++) {
        static struct sf_backend_ops ops;
        ops = *cpu->ops;
        real_copy_blocks = cpu->ops->kv_copy_blocks;
        ops.kv_copy_blocks = mode ? failing_copy_blocks : counting_copy_blocks;
        sf_backend be = { .ops = &ops, .ctx = cpu->ctx };
        sf_swap w;
        sf_swap_opts so = { .untuned = 1 };
        REQUIRE(sf_swap_init_opts(&w, &be, bb, 64.0 * bb / (1u << 30), &so, &err) == SF_OK, "swap: %s", err.msg);
        unsigned char *img = malloc(4 * bb), *back = malloc(bb);
        for (size_t i = 0; i < 4 * bb; i++) img[i] = (unsigned char)(sf_rng_next(&R) >> 11);
        int32_t blocks[4] = { 2, 9, 5, 11 }, slots[4] = { 30, 3, 17, 8 }, again[4] = { 0, 1, 14, 15 };
        for (int i = 0; i < 4; i++) cpu->ops->kv_copy_in(cpu, &blocks[i], 1, img + (size_t)i * bb);
        sf_swap_op out = { .seq = NULL, .urgency = 0, .n = 4, .blocks = blocks, .slots = slots };
        sf_swap_op in = { .seq = NULL, .urgency = 0, .n = 4, .blocks = again, .slots = slots };
        counting_calls = batched_calls = 0;
        CHECK(sf_swap_run(&w, &out, SF_DMA_D2H, &err) == SF_OK && sf_swap_run(&w, &in, SF_DMA_H2D, &err) == SF_OK);
        int same = 0;
        for (int i = 0; i < 4; i++)
            same += cpu->ops->kv_copy_out(cpu, &again[i], 1, back) == SF_OK && !memcmp(back, img + (size_t)i * bb, bb);
        CHECK_MSG(same == 4, "%s: %d of 4 blocks came back", mode ? "fallback" : "batched", same);
        if (mode) CHECK_MSG(batched_calls == 1 && w.batched_off, "batched tried %d times, off %d", batched_calls, w.batched_off);
        else CHECK_MSG(counting_calls == 2 && !w.batched_off, "%d batched calls for one swap out and in", counting_calls);
        free(img);
        free(back);
        sf_swap_free(&w);
    }
    cpu->ops->destroy(cpu);
}

/* A block id outside the pool is refused by the batched copy (SF_EINVAL): the swap reports it as
 * an error naming the backend, and keeps using batched copies (the per-block ones would refuse it
 * too). */
TEST(refused_block_is_an_error_not_a_fallback)
{
    size_t bb = 0;
    sf_backend *cpu = open_cpu_kv(&bb);
    REQUIRE(cpu, "cpu backend with a KV cache");
    sf_error err = { 0 };
    sf_swap w;
    sf_swap_opts so = { .untuned = 1 };
    REQUIRE(sf_swap_init_opts(&w, cpu, bb, 8.0 * bb / (1u << 30), &so, &err) == SF_OK, "swap: %s", err.msg);
    int32_t blocks[2] = { 3, 16 }, slots[2] = { 0, 1 };
    sf_swap_op out = { .seq = NULL, .urgency = 0, .n = 2, .blocks = blocks, .slots = slots };
    int rc = sf_swap_run(&w, &out, SF_DMA_D2H, &err);
    CHECK_MSG(rc == SF_EINVAL && strstr(err.msg, "refused") && strstr(err.msg, "cpu"), "%d %s", rc, err.msg);
    CHECK_MSG(!w.batched_off, "a refused copy switched batched copies off");
    blocks[1] = 4;
    CHECK_MSG(sf_swap_run(&w, &out, SF_DMA_D2H, &err) == SF_OK, "the same copy with good blocks: %s", err.msg);
    sf_swap_free(&w);
    cpu->ops->destroy(cpu);
}

int main(void)
{
    sf_rng_seed(&R, 42);
    RUN(batched_copy_equals_per_block);
    RUN(batched_copy_int8_blocks);
    RUN(batched_copy_before_kv_init_refused);
    RUN(swap_uses_batched_copy_and_falls_back);
    RUN(refused_block_is_an_error_not_a_fallback);
    return test_summary();
}
