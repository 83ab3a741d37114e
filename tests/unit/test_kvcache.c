/* test_kvcache.c — the KV block pool: allocation, exhaustion, sharing by reference count,
 * release order, misuse that must not corrupt the free list; and the CPU backend's block
 * copies out of and back into the cache. */
#include "engine/kvcache.h"
#include "hal/hal.h"
#include "tests/test.h"

TEST(alloc_all_then_again)
{
    sf_kv_pool p;
    sf_error err = { 0 };
    int rc = sf_kv_pool_init(&p, 8, 16, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    int32_t b[8];
    CHECK(sf_kv_alloc(&p, 5, b) == SF_OK);
    CHECK(p.n_free == 3);
    for (int i = 0; i < 5; i++) CHECK_MSG(b[i] == i, "fresh pool hands out ids in order: b[%d] = %d", i, b[i]);
    int32_t c[8];
    CHECK(sf_kv_alloc(&p, 4, c) == SF_AGAIN);
    CHECK_MSG(p.n_free == 3, "a failed alloc takes nothing (n_free %d)", p.n_free);
    CHECK(sf_kv_alloc(&p, 3, c) == SF_OK);
    CHECK(p.n_free == 0);
    /* all 8 ids distinct */
    int seen[8] = { 0 };
    for (int i = 0; i < 5; i++) seen[b[i]]++;
    for (int i = 0; i < 3; i++) seen[c[i]]++;
    for (int i = 0; i < 8; i++) CHECK_MSG(seen[i] == 1, "block %d handed out %d times", i, seen[i]);
    sf_kv_release(&p, b, 5);
    CHECK(p.n_free == 5);
    CHECK(sf_kv_blocks_for(&p, 0) == 0 && sf_kv_blocks_for(&p, 1) == 1 && sf_kv_blocks_for(&p, 16) == 1 &&
          sf_kv_blocks_for(&p, 17) == 2);
    sf_kv_pool_free(&p);
}

TEST(refcount_sharing)
{
    sf_kv_pool p;
    int rc = sf_kv_pool_init(&p, 4, 16, NULL);
    REQUIRE(rc == SF_OK, "init");
    int32_t b[2];
    rc = sf_kv_alloc(&p, 2, b);
    REQUIRE(rc == SF_OK, "alloc");
    sf_kv_retain(&p, b, 2);          /* a second sequence shares the prefix */
    CHECK(p.refcnt[b[0]] == 2 && p.refcnt[b[1]] == 2);
    sf_kv_release(&p, b, 2);         /* first owner leaves: still held */
    CHECK_MSG(p.n_free == 2, "shared blocks stay out of the free list (n_free %d)", p.n_free);
    sf_kv_release(&p, b, 2);         /* last owner leaves */
    CHECK(p.n_free == 4);
    /* double release and junk ids are ignored, not pushed twice */
    sf_kv_release(&p, b, 2);
    int32_t junk[2] = { -1, 99 };
    sf_kv_release(&p, junk, 2);
    sf_kv_retain(&p, junk, 2);
    CHECK_MSG(p.n_free == 4, "misuse must not grow the free list (n_free %d)", p.n_free);
    int32_t all[4];
    CHECK(sf_kv_alloc(&p, 4, all) == SF_OK);
    sf_kv_pool_free(&p);
}

TEST(bad_config)
{
    sf_kv_pool p;
    sf_error err = { 0 };
    CHECK(sf_kv_pool_init(&p, 0, 16, &err) == SF_EINVAL);
    CHECK(strstr(err.msg, "blocks") != NULL);
    CHECK(sf_kv_pool_init(&p, 4, 0, &err) == SF_EINVAL);
    sf_kv_pool_free(&p);
    sf_kv_pool_free(NULL);
}

TEST(backend_copy_out_in)
{
    sf_backend *b = NULL;
    sf_error err = { 0 };
    sf_backend_opts o = { .name = "cpu", .n_threads = 2 };
    int rc = sf_backend_open(&o, &b, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    sf_kv_config kc = { .n_layers = 2, .n_blocks = 4, .block_size = 4, .n_kv_heads = 2, .head_dim = 8, .dtype = SF_DT_F32 };
    rc = b->ops->kv_init(b, &kc, &err);
    REQUIRE(rc == SF_OK, "%s", err.msg);
    size_t bb = b->ops->kv_block_bytes(b, &kc);
    CHECK(bb == 2 * 2 * 2 * 4 * 8 * sizeof(float));
    /* write a pattern into block 1 and 3 through copy_in, read back through copy_out */
    int32_t ids[2] = { 1, 3 };
    float *src = malloc(2 * bb), *dst = malloc(2 * bb), *zero = malloc(bb);
    for (size_t i = 0; i < 2 * bb / 4; i++) src[i] = (float)i * 0.5f;
    CHECK(b->ops->kv_copy_in(b, ids, 2, src) == SF_OK);
    CHECK(b->ops->kv_copy_out(b, ids, 2, dst) == SF_OK);
    CHECK(memcmp(src, dst, 2 * bb) == 0);
    int32_t z[1] = { 0 };
    CHECK(b->ops->kv_copy_out(b, z, 1, zero) == SF_OK);
    int clean = 1;
    for (size_t i = 0; i < bb / 4; i++) clean &= zero[i] == 0.0f;
    CHECK_MSG(clean, "block 0 untouched by copies into blocks 1 and 3");
    int32_t bad[1] = { 4 };
    CHECK(b->ops->kv_copy_out(b, bad, 1, dst) == SF_EINVAL);
    free(src); free(dst); free(zero);
    sf_backend_close(b);
}

int main(void)
{
    RUN(alloc_all_then_again);
    RUN(refcount_sharing);
    RUN(bad_config);
    RUN(backend_copy_out_in);
    return test_summary();
}
