/* test_comm_crossover.c — the all-reduce path choice that runs on any machine: the crossover
 * picked from measured latencies (hal/comm.c), its cache, and the setup of the peer-memory
 * path where there is no GPU (it must refuse cleanly, so NCCL takes every message), which
 * all-reduce + rmsnorm calls take the fused kernel, and that op's fallback on the CPU. */
#include <stdlib.h>
#include <sys/stat.h>

#include "../../hal/comm.h"
#include "../../hal/comm_custom.h"
#include "../test.h"

static const size_t sizes[6] = { 2048, 4096, 8192, 16384, 32768, 65536 };

TEST(crossover_pick)
{
    double nccl[6] = { 7.0, 7.1, 7.2, 7.5, 8.0, 9.0 };
    double all_win[6] = { 3.0, 3.1, 3.3, 3.6, 4.0, 5.0 };
    CHECK(sf_comm_pick_crossover(sizes, nccl, all_win, 6, 0.05) == 65536);
    /* wins up to 16 KiB, then loses: the crossover is 16 KiB even if it wins again later */
    double mixed[6] = { 3.0, 3.1, 3.3, 3.6, 9.0, 5.0 };
    CHECK(sf_comm_pick_crossover(sizes, nccl, mixed, 6, 0.05) == 16384);
    /* loses at the smallest: never */
    double lose[6] = { 8.0, 3.1, 3.3, 3.6, 4.0, 5.0 };
    CHECK(sf_comm_pick_crossover(sizes, nccl, lose, 6, 0.05) == 0);
    /* a win smaller than the margin is not a win */
    double close[6] = { 6.9, 6.9, 3.3, 3.6, 4.0, 5.0 };
    CHECK(sf_comm_pick_crossover(sizes, nccl, close, 6, 0.05) == 0);
    CHECK(sf_comm_pick_crossover(sizes, nccl, close, 6, 0.0) == 65536);
    /* a size without a measurement ends the run */
    double missing[6] = { 3.0, 3.1, 0, 3.6, 4.0, 5.0 };
    CHECK(sf_comm_pick_crossover(sizes, nccl, missing, 6, 0.05) == 4096);
    CHECK(sf_comm_pick_crossover(sizes, nccl, all_win, 0, 0.05) == 0);
}

TEST(crossover_cache)
{
    char dir[] = "/tmp/sf_xo_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    setenv("XDG_CACHE_HOME", dir, 1);
    double nccl[6] = { 7, 7, 7, 8, 9, 10 }, own[6] = { 3, 3, 4, 5, 9, 12 };
    size_t v = 123;
    const char *key = "r2-nccl22703-0000:1B:00.0-0000:2C:00.0";
    CHECK(sf_comm_crossover_load(key, &v) == -1 && v == 123); /* nothing cached yet */
    sf_comm_crossover_save(key, 16384, sizes, nccl, own, 6);
    CHECK(sf_comm_crossover_load(key, &v) == 0 && v == 16384);
    /* another group of GPUs (or ranks, or NCCL version) is measured anew */
    CHECK(sf_comm_crossover_load("r2-nccl22703-0000:1B:00.0-0000:3D:00.0", &v) == -1);
    CHECK(sf_comm_crossover_load("r4-nccl22703-0000:1B:00.0-0000:2C:00.0", &v) == -1);
    /* a damaged file reads as no cache */
    char path[512];
    snprintf(path, sizeof path, "%s/semflow/allreduce-r2-nccl22703-0000_1B_00_0-0000_2C_00_0.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs("{\"key\": 5, \"crossover_bytes\": \"x\"", f);
        fclose(f);
    }
    CHECK(sf_comm_crossover_load(key, &v) == -1);
    /* no cache folder at all: nothing loads, saving only warns */
    unsetenv("XDG_CACHE_HOME");
    char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    unsetenv("HOME");
    CHECK(sf_comm_crossover_load(key, &v) == -1);
    sf_comm_crossover_save(key, 1, sizes, nccl, own, 6);
    if (home) setenv("HOME", home, 1);
    free(home);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

/* The per-message choice: same answer on every rank from (path, cap, crossover, size, dtype). */
TEST(path_choice)
{
    sf_comm c = { 0 };
    c.size = 2;
    CHECK(!sf_comm_takes_custom(&c, 4096, SF_DT_BF16)); /* no own path */
    c.custom_cap_bytes = 1 << 20;
    c.custom_max_bytes = 256 << 10;
    CHECK(sf_comm_takes_custom(&c, 4096, SF_DT_BF16));        /* 8 KiB: below the crossover */
    CHECK(sf_comm_takes_custom(&c, 128 << 10, SF_DT_BF16));   /* 256 KiB: at it */
    CHECK(!sf_comm_takes_custom(&c, 129 << 10, SF_DT_BF16));  /* above */
    CHECK(!sf_comm_takes_custom(&c, 4096, SF_DT_F32));        /* bf16 only */
    c.path = SF_COMM_PATH_CUSTOM;
    CHECK(sf_comm_takes_custom(&c, 512 << 10, SF_DT_BF16));   /* forced: up to the cap */
    CHECK(!sf_comm_takes_custom(&c, (512 << 10) + 1, SF_DT_BF16));
    c.path = SF_COMM_PATH_NCCL;
    CHECK(!sf_comm_takes_custom(&c, 4096, SF_DT_BF16));
    c.path = SF_COMM_PATH_AUTO;
    /* the LL kernel: up to its crossover, within the own path's */
    c.ll_cap_bytes = 512 << 10;
    c.ll_max_bytes = 16 << 10;
    CHECK(sf_comm_takes_ll(&c, 8 << 10, SF_DT_BF16));         /* 16 KiB: at the LL crossover */
    CHECK(!sf_comm_takes_ll(&c, (8 << 10) + 1, SF_DT_BF16));  /* above: one-shot */
    CHECK(sf_comm_takes_custom(&c, (8 << 10) + 1, SF_DT_BF16));
    c.path = SF_COMM_PATH_ONESHOT;
    CHECK(!sf_comm_takes_ll(&c, 4096, SF_DT_BF16) && sf_comm_takes_custom(&c, 4096, SF_DT_BF16));
    c.path = SF_COMM_PATH_LL;                                 /* forced: up to the LL cap */
    CHECK(sf_comm_takes_ll(&c, 256 << 10, SF_DT_BF16));
    CHECK(!sf_comm_takes_custom(&c, (256 << 10) + 1, SF_DT_BF16));
    c.path = SF_COMM_PATH_NCCL;
    CHECK(!sf_comm_takes_ll(&c, 4096, SF_DT_BF16));
    c.path = SF_COMM_PATH_AUTO;
    c.custom_max_bytes = 0; /* the own path never won */
    CHECK(!sf_comm_takes_custom(&c, 1, SF_DT_BF16) && !sf_comm_takes_ll(&c, 1, SF_DT_BF16));
}

static int fake_ar_norm(sf_comm *c, const sf_coll_norm *a, void *stream, sf_error *err)
{
    return sf_err(err, SF_ERROR, "not called here");
}
static int fake_coll_norm(sf_backend *b, sf_buf *x, sf_buf *res, const sf_weight *w, float eps, int rows, sf_buf *out,
                          sf_coll_norm_fn fn, void *arg)
{
    return SF_ERROR;
}

/* Which all-reduce + rmsnorm calls take the fused kernel: the same answer on every rank. */
TEST(norm_choice)
{
    static const struct sf_comm_ops with = { .name = "fake", .all_reduce_norm = fake_ar_norm }, without = { .name = "x" };
    static const struct sf_backend_ops bwith = { .name = "fake", .collective_norm = fake_coll_norm }, bwithout = { 0 };
    sf_backend b = { .ops = &bwith }, b0 = { .ops = &bwithout };
    sf_comm c = { .ops = &with, .size = 2, .norm_max_bytes = 4 << 20, .norm_max_cols = 16384, .norm_min_rows = 2 };
    CHECK(sf_comm_takes_norm(&c, &b, 256, 4096));       /* 2 MiB */
    CHECK(sf_comm_takes_norm(&c, &b, 256, 8192));       /* 4 MiB: at the cap */
    CHECK(!sf_comm_takes_norm(&c, &b, 257, 8192));      /* above */
    CHECK(!sf_comm_takes_norm(&c, &b, 1, 4096));        /* one row: the GEMV's own norm */
    CHECK(!sf_comm_takes_norm(&c, &b, 16, 1004));       /* not a multiple of 8 */
    CHECK(!sf_comm_takes_norm(&c, &b, 2, 16392));       /* wider than the kernel */
    CHECK(!sf_comm_takes_norm(&c, &b0, 16, 4096));      /* the backend has no such op */
    CHECK(!sf_comm_takes_norm(NULL, &b, 16, 4096));
    c.path = SF_COMM_PATH_NCCL;                         /* NCCL forced */
    CHECK(!sf_comm_takes_norm(&c, &b, 16, 4096));
    c.path = SF_COMM_PATH_AUTO;
    c.norm_max_bytes = 0;                               /* $SEMFLOW_TP_ARNORM=0 */
    CHECK(!sf_comm_takes_norm(&c, &b, 16, 4096));
    c.norm_max_bytes = 4 << 20;
    c.size = 1;
    CHECK(!sf_comm_takes_norm(&c, &b, 16, 4096));
    c.size = 2;
    c.ops = &without;
    CHECK(!sf_comm_takes_norm(&c, &b, 16, 4096));
}

/* Without a communicator the op is the residual add and the rmsnorm (CPU backend). */
TEST(norm_fallback_cpu)
{
    sf_backend *b = NULL;
    sf_backend_opts bo = { .name = "cpu", .n_threads = 1 };
    sf_error err = { 0 };
    REQUIRE(sf_backend_open(&bo, &b, &err) == SF_OK, "%s", err.msg);
    enum { R = 3, C = 16 };
    float x[R * C], res[R * C], wv[C], got[R * C], h[R * C], want[R * C];
    for (int i = 0; i < R * C; i++) {
        x[i] = (float)(i % 5) - 2.0f;
        res[i] = (float)(i % 3) * 0.5f;
    }
    for (int i = 0; i < C; i++) wv[i] = 1.0f + 0.125f * (float)i;
    sf_weight_desc d = { .n_parts = 1 };
    d.part[0] = (sf_view){ .data = wv, .dtype = SF_DT_F32, .rows = 1, .cols = C };
    sf_weight *w = NULL;
    sf_buf *bx = NULL, *br = NULL, *bo2 = NULL;
    int rc = b->ops->weight_new(b, &d, &w, &err);
    if (!rc) rc = b->ops->buf_new(b, R, C, &bx, &err);
    if (!rc) rc = b->ops->buf_new(b, R, C, &br, &err);
    if (!rc) rc = b->ops->buf_new(b, R, C, &bo2, &err);
    if (!rc) rc = b->ops->write_f32(b, bx, R, x) || b->ops->write_f32(b, br, R, res);
    if (!rc) rc = sf_comm_all_reduce_norm_buf(NULL, b, bx, br, w, 1e-6f, R, C, bo2, &err);
    if (!rc) rc = b->ops->read_f32(b, bo2, R, got) || b->ops->read_f32(b, br, R, h);
    CHECK_MSG(rc == SF_OK, "%s", err.msg);
    for (int r = 0; r < R && !rc; r++) {
        double ss = 0;
        for (int i = 0; i < C; i++) ss += (double)(res[r * C + i] + x[r * C + i]) * (res[r * C + i] + x[r * C + i]);
        for (int i = 0; i < C; i++)
            want[r * C + i] = (float)((res[r * C + i] + x[r * C + i]) / sqrt(ss / C + 1e-6) * wv[i]);
    }
    for (int i = 0; i < R * C && !rc; i++) {
        CHECK_MSG(h[i] == res[i] + x[i], "residual %d: %g, want %g", i, h[i], res[i] + x[i]);
        CHECK_MSG(fabsf(got[i] - want[i]) <= 1e-5f * (1 + fabsf(want[i])), "normed %d: %g, want %g", i, got[i], want[i]);
    }
    if (bx) b->ops->buf_free(b, bx);
    if (br) b->ops->buf_free(b, br);
    if (bo2) b->ops->buf_free(b, bo2);
    if (w) b->ops->weight_free(b, w);
    sf_backend_close(b);
}

static int no_exchange(void *ctx, const void *mine, size_t bytes, void *all, sf_error *err)
{
    (*(int *)ctx)++;
    memcpy(all, mine, bytes);
    return SF_OK;
}

TEST(custom_path_refuses_cleanly)
{
    sf_ar_custom *a = (sf_ar_custom *)1;
    sf_error err = { 0 };
    int calls = 0;
    /* one rank, or more ranks than the kernel takes: refused before any exchange */
    CHECK(sf_ar_custom_open(0, 1, 0, 1 << 20, 1000, no_exchange, &calls, &a, &err) != SF_OK && a == NULL);
    CHECK(strstr(err.msg, "peer-memory all-reduce") != NULL);
    CHECK(sf_ar_custom_open(0, 64, 0, 1 << 20, 1000, no_exchange, &calls, &a, &err) != SF_OK && a == NULL);
    CHECK(calls == 0);
    CHECK(sf_ar_custom_cap(NULL) == 0 && sf_ar_custom_failed(NULL) == 0);
    sf_ar_custom_free(NULL);
}

int main(void)
{
    RUN(crossover_pick);
    RUN(crossover_cache);
    RUN(path_choice);
    RUN(custom_path_refuses_cleanly);
    RUN(norm_choice);
    RUN(norm_fallback_cpu);
    return test_summary();
}
