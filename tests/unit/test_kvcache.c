/* test_kvcache.c — the KV block pool: allocation, exhaustion, sharing by reference count,
 * release order, misuse that must not corrupt the free list; full-precision and INT8 blocks
 * in one pool (units, pairing, fragmentation, a random run that must leak nothing); and the
 * CPU backend's block copies out of and back into the cache, for both kinds. */
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
    CHECK(sf_kv_refs(&p, b[0]) == 2 && sf_kv_refs(&p, b[1]) == 2);
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

/* Full and INT8 blocks: units, exhaustion, pairing of INT8 halves, ids by kind. */
TEST(mixed_kinds)
{
    sf_kv_pool p;
    REQUIRE(sf_kv_pool_init(&p, 4, 16, NULL) == SF_OK, "init");
    int32_t a[8], b[8];
    CHECK_MSG(sf_kv_alloc_as(&p, 1, 1, a) == SF_EUNSUPPORTED, "INT8 blocks are off until enabled");
    sf_kv_pool_enable_i8(&p);
    CHECK(sf_kv_alloc_as(&p, 0, 2, a) == SF_OK && a[0] == 0 && a[1] == 1);
    CHECK(p.n_free == 2 && p.n_free_units == 4);
    CHECK(sf_kv_alloc_as(&p, 1, 1, b) == SF_OK);
    CHECK_MSG(sf_kv_is_i8(&p, b[0]) && b[0] == 4 + 2 * 2, "first INT8 block is the first half of pair 2 (id %d)", b[0]);
    CHECK(p.n_free == 1 && p.n_free_units == 3 && p.n_half == 1);
    CHECK(sf_kv_alloc_as(&p, 1, 1, b + 1) == SF_OK);
    CHECK_MSG(b[1] == 4 + 5, "the second INT8 block completes pair 2 (id %d)", b[1]);
    CHECK(p.n_free == 1 && p.n_free_units == 2 && p.n_half == 0);
    CHECK(sf_kv_alloc_as(&p, 1, 3, b + 2) == SF_AGAIN && p.n_free_units == 2);
    CHECK(sf_kv_alloc_as(&p, 1, 2, b + 2) == SF_OK && p.n_free_units == 0 && p.n_free == 0);
    CHECK(sf_kv_alloc_as(&p, 0, 1, a + 2) == SF_AGAIN && sf_kv_alloc_as(&p, 1, 1, b + 4) == SF_AGAIN);
    CHECK(sf_kv_usage(&p) == 1.0);
    /* one INT8 half back: one unit free but no full block */
    sf_kv_release(&p, b, 1);
    CHECK(p.n_free_units == 1 && p.n_free == 0 && !sf_kv_can_alloc(&p, 0, 1) && sf_kv_can_alloc(&p, 1, 1));
    /* its partner back: pair 2 whole again */
    sf_kv_release(&p, b + 1, 1);
    CHECK(p.n_free == 1 && p.n_free_units == 2 && p.n_half == 0);
    CHECK(sf_kv_alloc_as(&p, 0, 1, a + 2) == SF_OK && a[2] == 2);
    sf_kv_release(&p, a, 3);
    sf_kv_release(&p, b + 2, 2);
    CHECK(p.n_free == 4 && p.n_free_units == 8 && p.n_half == 0 && sf_kv_usage(&p) == 0.0);
    /* misuse: a full id released as INT8 and the reverse are not held */
    CHECK(sf_kv_alloc_as(&p, 0, 1, a) == SF_OK && sf_kv_alloc_as(&p, 1, 1, b) == SF_OK);
    int32_t wrong[3] = { 4 + 2 * a[0], b[0] - 4, 3 * 4 };
    sf_kv_release(&p, wrong, 3);
    CHECK_MSG(sf_kv_refs(&p, a[0]) == 1 && sf_kv_refs(&p, b[0]) == 1 && p.n_free_units == 5,
              "ids of the other kind or past the pool change nothing (free units %d)", p.n_free_units);
    sf_kv_retain(&p, b, 1);
    sf_kv_release(&p, b, 1);
    CHECK(sf_kv_refs(&p, b[0]) == 1);
    sf_kv_release(&p, b, 1);
    sf_kv_release(&p, a, 1);
    CHECK(p.n_free == 4 && p.n_free_units == 8);
    sf_kv_pool_free(&p);
}

/* Lone halves are used before pairs are split: INT8 blocks freed all over the pool leave
 * room that the next INT8 allocations fill, so full blocks stay available. */
TEST(fragmentation_pairs_halves)
{
    sf_kv_pool p;
    REQUIRE(sf_kv_pool_init(&p, 8, 16, NULL) == SF_OK, "init");
    sf_kv_pool_enable_i8(&p);
    int32_t b[16];
    CHECK(sf_kv_alloc_as(&p, 1, 16, b) == SF_OK && p.n_free == 0);
    /* free every other INT8 block: 8 lone halves, no whole pair */
    for (int i = 0; i < 16; i += 2) sf_kv_release(&p, b + i, 1);
    CHECK(p.n_half == 8 && p.n_free == 0 && p.n_free_units == 8);
    /* 8 new INT8 blocks take exactly those halves */
    int32_t c[8];
    CHECK(sf_kv_alloc_as(&p, 1, 8, c) == SF_OK && p.n_half == 0 && p.n_free_units == 0);
    /* free both halves of pairs 0..3: four whole pairs come back for full blocks */
    for (int i = 0; i < 16; i++) {
        int32_t id = i % 2 ? b[i] : -1;
        for (int j = 0; j < 8 && id < 0; j++)
            if (c[j] - 8 == i) id = c[j];
        if (i < 8) sf_kv_release(&p, &id, 1);
    }
    CHECK_MSG(p.n_free == 4 && p.n_half == 0, "whole pairs %d, lone halves %d", p.n_free, p.n_half);
    int32_t f[4];
    CHECK(sf_kv_alloc_as(&p, 0, 4, f) == SF_OK);
    sf_kv_pool_free(&p);
}

/* A random mix of allocations, shares and releases of both kinds: the free counts always
 * match what is held, nothing is handed out twice, and all comes back. */
TEST(random_mixed_no_leak)
{
    enum { N = 32, MAXH = 200 };
    sf_kv_pool p;
    REQUIRE(sf_kv_pool_init(&p, N, 16, NULL) == SF_OK, "init");
    sf_kv_pool_enable_i8(&p);
    int32_t held[MAXH];
    int n_held = 0, bad = 0;
    uint64_t x = 12345;
    for (int it = 0; it < 20000 && !bad; it++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        int r = (int)(x >> 33) % 10;
        if (r < 5 && n_held < MAXH - 4) {
            int i8 = r & 1, n = 1 + (int)((x >> 20) % 3);
            if (sf_kv_alloc_as(&p, i8, n, held + n_held) == SF_OK) n_held += n;
        } else if (r < 6 && n_held && n_held < MAXH) {
            int j = (int)((x >> 13) % (uint64_t)n_held);
            sf_kv_retain(&p, held + j, 1);
            held[n_held++] = held[j];
        } else if (n_held) {
            int j = (int)((x >> 13) % (uint64_t)n_held);
            sf_kv_release(&p, held + j, 1);
            held[j] = held[--n_held];
        }
        /* units held, from the ids: each distinct id counts once, by its kind */
        int units = 0;
        unsigned char seen[3 * N] = { 0 }, unit_used[2 * N] = { 0 };
        for (int i = 0; i < n_held; i++) {
            int32_t id = held[i];
            if (seen[id]++) continue;
            int u0 = id < N ? 2 * id : id - N, nu = id < N ? 2 : 1;
            for (int k = 0; k < nu; k++) bad |= unit_used[u0 + k]++ != 0;
            units += nu;
        }
        bad |= units + p.n_free_units != 2 * N;
    }
    CHECK_MSG(!bad, "a unit handed out twice or the free count drifted");
    for (int i = 0; i < n_held; i++) sf_kv_release(&p, held + i, 1);
    CHECK_MSG(p.n_free == N && p.n_free_units == 2 * N && p.n_half == 0, "leak: %d pairs, %d units free", p.n_free,
              p.n_free_units);
    sf_kv_pool_free(&p);
}

/* INT8 blocks through the CPU backend's copies: the right bytes (rows and scales) move, full
 * blocks beside them stay intact, and ids past the INT8 range are refused. */
TEST(backend_copy_int8)
{
    sf_backend *b = NULL;
    sf_error err = { 0 };
    sf_backend_opts o = { .name = "cpu", .n_threads = 1 };
    REQUIRE(sf_backend_open(&o, &b, &err) == SF_OK, "%s", err.msg);
    sf_kv_config kc = { .n_layers = 2, .n_blocks = 4, .block_size = 4, .n_kv_heads = 2, .head_dim = 8,
                        .dtype = SF_DT_F32, .int8 = 1 };
    REQUIRE(b->ops->kv_init(b, &kc, &err) == SF_OK, "%s", err.msg);
    size_t bb = b->ops->kv_block_bytes(b, &kc), data = 2 * 2 * 2 * 4 * 8 * sizeof(float);
    CHECK_MSG(bb == data + 2 * 2 * 2 * 2 * 4 * sizeof(float), "block bytes %zu include the scales of two units", bb);
    unsigned char *src = malloc(2 * bb), *dst = calloc(2, bb), *full = malloc(bb), *full2 = malloc(bb);
    for (size_t i = 0; i < 2 * bb; i++) src[i] = (unsigned char)(i * 7 + 3);
    for (size_t i = 0; i < bb; i++) full[i] = (unsigned char)(i * 13 + 1);
    int32_t f[1] = { 0 }, q[2] = { 4 + 2, 4 + 7 }; /* units 2 (pair 1) and 7 (pair 3) */
    CHECK(b->ops->kv_copy_in(b, f, 1, full) == SF_OK);
    CHECK(b->ops->kv_copy_in(b, q, 2, src) == SF_OK);
    CHECK(b->ops->kv_copy_out(b, q, 2, dst) == SF_OK);
    /* an INT8 block's host image: per layer K, V rows (64 bytes each) and K, V scales (8 floats) */
    size_t used = 2 * (2 * 64 + 2 * 8 * sizeof(float));
    CHECK(memcmp(src, dst, used) == 0 && memcmp(src + bb, dst + bb, used) == 0);
    CHECK(b->ops->kv_copy_out(b, f, 1, full2) == SF_OK);
    CHECK_MSG(memcmp(full, full2, data) == 0, "full block 0 untouched by INT8 copies into pairs 1 and 3");
    int32_t bad[1] = { 12 };
    CHECK(b->ops->kv_copy_out(b, bad, 1, dst) == SF_EINVAL);
    free(src); free(dst); free(full); free(full2);
    sf_backend_close(b);
}

/* The prefix cache's index: registered blocks are found by key, parent and tokens (never by
 * the key alone), stay free-but-kept when released, are taken last and least recently freed
 * first (forgotten then), are shared when found while held, and are forgotten by a reset. INT8
 * blocks take a kept pair only when no plain pair is left. */
TEST(prefix_index)
{
    sf_kv_pool p;
    sf_error err = { 0 };
    int rc = sf_kv_pool_init(&p, 4, 4, &err);
    REQUIRE(rc == SF_OK && sf_kv_prefix_enable(&p, &err) == SF_OK, "%s", err.msg);
    sf_kv_pool_enable_i8(&p);
    int32_t toks[3][4] = { { 1, 2, 3, 4 }, { 5, 6, 7, 8 }, { 9, 10, 11, 12 } }, other[4] = { 1, 2, 3, 5 };
    uint64_t k0 = sf_kv_prefix_key(&p, 7, toks[0]), k1 = sf_kv_prefix_key(&p, k0, toks[1]);
    uint64_t k2 = sf_kv_prefix_key(&p, k1, toks[2]);
    CHECK(k0 != sf_kv_prefix_key(&p, 8, toks[0]) && k0 != sf_kv_prefix_key(&p, 7, other) && k0 != k1);
    int32_t b[4];
    REQUIRE(sf_kv_alloc(&p, 3, b) == SF_OK, "alloc");
    CHECK(sf_kv_prefix_find(&p, k0, 7, toks[0]) == -1);
    sf_kv_prefix_register(&p, b[0], k0, 7, toks[0]);
    sf_kv_prefix_register(&p, b[1], k1, k0, toks[1]);
    sf_kv_prefix_register(&p, b[2], k1, k0, toks[1]); /* the same key again: kept by b[1] */
    CHECK_MSG(p.n_registered == 2, "registered %d", p.n_registered);
    CHECK(sf_kv_prefix_find(&p, k0, 7, toks[0]) == b[0] && sf_kv_prefix_find(&p, k1, k0, toks[1]) == b[1]);
    CHECK_MSG(sf_kv_prefix_find(&p, k0, 7, other) == -1 && sf_kv_prefix_find(&p, k0, 8, toks[0]) == -1,
              "a lookup compares the tokens and the parent, not the key alone");
    /* found while held: shared */
    CHECK(sf_kv_prefix_take(&p, b[0]) == 0 && sf_kv_refs(&p, b[0]) == 2);
    sf_kv_release(&p, b, 1);
    /* released: free but kept, then forgotten least recently freed first */
    sf_kv_release(&p, &b[1], 1);
    sf_kv_release(&p, &b[0], 1);
    sf_kv_release(&p, &b[2], 1);
    CHECK_MSG(p.n_free == 4 && p.n_evictable == 2 && p.n_stack == 2, "free %d, kept %d, plain %d", p.n_free,
              p.n_evictable, p.n_stack);
    CHECK(sf_kv_prefix_find(&p, k0, 7, toks[0]) == b[0] && sf_kv_refs(&p, b[0]) == 0);
    int32_t c[2];
    REQUIRE(sf_kv_alloc(&p, 2, c) == SF_OK, "alloc 2");
    CHECK_MSG(c[0] != b[0] && c[0] != b[1] && c[1] != b[0] && c[1] != b[1], "plain pairs go first");
    CHECK(p.n_registered == 2 && p.n_free == 2);
    /* an INT8 block takes a whole pair: the least recently freed kept one, b[1] */
    int32_t u;
    REQUIRE(sf_kv_alloc_as(&p, 1, 1, &u) == SF_OK, "alloc int8");
    CHECK_MSG((u - p.n_blocks) / 2 == b[1] && p.pc_evictions == 1, "evicted pair %d (want %d)", (u - p.n_blocks) / 2,
              b[1]);
    CHECK(sf_kv_prefix_find(&p, k1, k0, toks[1]) == -1 && sf_kv_prefix_find(&p, k0, 7, toks[0]) == b[0]);
    /* found while kept: taken off the kept list */
    CHECK(sf_kv_prefix_take(&p, b[0]) == 1 && sf_kv_refs(&p, b[0]) == 1 && p.n_free == 0 && p.n_evictable == 0);
    CHECK_MSG(sf_kv_alloc(&p, 1, c) == SF_AGAIN, "the pool is full");
    /* an INT8 block's pair is never registered */
    sf_kv_prefix_register(&p, u, k2, k1, toks[2]);
    CHECK(p.n_registered == 1);
    /* reset: what is kept becomes plain free, what is held stays held, unregistered */
    sf_kv_release(&p, &b[0], 1);
    CHECK(p.n_evictable == 1);
    sf_kv_prefix_reset(&p);
    CHECK(p.n_evictable == 0 && p.n_registered == 0 && p.n_free == 1 && sf_kv_prefix_find(&p, k0, 7, toks[0]) == -1);
    sf_kv_release(&p, c, 2);
    sf_kv_release(&p, &u, 1);
    CHECK(p.n_free == 4 && p.n_stack == 4);
    sf_kv_pool_free(&p);
}

/* Many keys through a small table: deletions (by eviction) keep every other key findable. */
TEST(prefix_index_churn)
{
    sf_kv_pool p;
    int rc = sf_kv_pool_init(&p, 64, 2, NULL);
    REQUIRE(rc == SF_OK && sf_kv_prefix_enable(&p, NULL) == SF_OK, "init");
    sf_rng rng;
    sf_rng_seed(&rng, 5);
    int32_t tok[64][2];
    uint64_t key[64];
    int bad = 0;
    for (int round = 0; round < 200 && !bad; round++) {
        int32_t b[64];
        int n = 1 + (int)(sf_rng_next(&rng) % 64);
        REQUIRE(sf_kv_alloc(&p, n, b) == SF_OK, "alloc %d", n);
        for (int i = 0; i < n; i++) {
            tok[b[i]][0] = (int32_t)(sf_rng_next(&rng) % 50);
            tok[b[i]][1] = round;
            key[b[i]] = sf_kv_prefix_key(&p, 0, tok[b[i]]);
            sf_kv_prefix_register(&p, b[i], key[b[i]], 0, tok[b[i]]);
        }
        sf_kv_release(&p, b, n);
        for (int x = 0; x < 64; x++)
            if (p.pc_reg[x] && sf_kv_prefix_find(&p, key[x], 0, tok[x]) != x) bad++;
        int reg = 0;
        for (int x = 0; x < 64; x++) reg += p.pc_reg[x];
        if (reg != p.n_registered || p.n_evictable != p.n_registered || p.n_free != 64) bad++;
    }
    CHECK_MSG(!bad, "%d registered blocks lost from the index", bad);
    CHECK(p.pc_evictions > 0);
    sf_kv_pool_free(&p);
}

int main(void)
{
    RUN(alloc_all_then_again);
    RUN(refcount_sharing);
    RUN(bad_config);
    RUN(backend_copy_out_in);
    RUN(mixed_kinds);
    RUN(fragmentation_pairs_halves);
    RUN(random_mixed_no_leak);
    RUN(backend_copy_int8);
    RUN(prefix_index);
    RUN(prefix_index_churn);
    return test_summary();
}
