/* test_bpf_dma — the DMA scheduler on the CPU with memcpy-backed copies: chunk sizes per
 * urgency (defaults and from a measured curve), data integrity, error reporting, and pacing of
 * low-urgency copies under contention. */
#include "engine/dma.h"
#include "tests/test.h"

typedef struct counter { int chunks; size_t max_chunk; int fail_at; } counter;

static int copy_memcpy(void *arg, void *dst, const void *src, size_t n, int dir, sf_error *err)
{
    counter *c = arg;
    if (c->fail_at && c->chunks + 1 == c->fail_at) return sf_err(err, SF_EIO, "injected copy failure");
    memcpy(dst, src, n);
    c->chunks++;
    if (n > c->max_chunk) c->max_chunk = n;
    return SF_OK;
}

static double contention_value;
static double contention(void *arg) { return contention_value; }

static sf_dma *make(counter *c, const sf_hw_info *hw, double link_gbs)
{
    sf_dma_opts o = { .copy = copy_memcpy, .copy_arg = c, .hw = hw, .contention = contention, .link_gbs = link_gbs };
    sf_dma *d = NULL;
    sf_error e = { 0 };
    if (sf_dma_new(&o, &d, &e) != SF_OK) printf("      sf_dma_new: %s\n", e.msg);
    return d;
}

TEST(default_chunks)
{
    counter c = { 0 };
    sf_dma *d = make(&c, NULL, 0);
    REQUIRE(d, "sf_dma_new failed");
    CHECK(sf_dma_chunk(d, SF_URGENCY_LOW, SF_DMA_H2D) == 64 * 1024);
    CHECK(sf_dma_chunk(d, SF_URGENCY_NORMAL, SF_DMA_H2D) == 128 * 1024);
    CHECK(sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_D2H) == 512 * 1024);
    sf_dma_free(d);
}

TEST(chunks_follow_the_measured_curve)
{
    /* H200 over PCIe Gen5 x16, pinned H2D (ARCHITECTURE.md); D2H made flatter */
    sf_hw_info hw = { 0 };
    static const double h2d[SF_HAL_CHUNKS] = { 17.5, 26.5, 35.0, 43.5, 48.0, 51.0, 53.0, 54.3 };
    static const double d2h[SF_HAL_CHUNKS] = { 30.0, 44.0, 50.0, 52.0, 53.0, 53.5, 54.0, 54.0 };
    strcpy(hw.backend, "cuda");
    for (int i = 0; i < SF_HAL_CHUNKS; i++) {
        hw.chunk_bytes[i] = (size_t)64 * 1024 << i;
        hw.h2d_pinned_gbs[i] = h2d[i];
        hw.d2h_pinned_gbs[i] = d2h[i];
    }
    counter c = { 0 };
    sf_dma *d = make(&c, &hw, 0);
    REQUIRE(d, "sf_dma_new failed");
    CHECK_MSG(sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_H2D) == 512 * 1024, "high H2D %zu",
              sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_H2D));
    CHECK_MSG(sf_dma_chunk(d, SF_URGENCY_NORMAL, SF_DMA_H2D) == 128 * 1024, "normal H2D %zu",
              sf_dma_chunk(d, SF_URGENCY_NORMAL, SF_DMA_H2D));
    CHECK_MSG(sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_D2H) == 128 * 1024, "high D2H %zu (44 >= 0.8 * 54)",
              sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_D2H));
    CHECK(sf_dma_chunk(d, SF_URGENCY_LOW, SF_DMA_D2H) == 64 * 1024);
    sf_dma_free(d);
    /* a CPU backend's info has no curve: defaults */
    strcpy(hw.backend, "cpu");
    d = make(&c, &hw, 0);
    REQUIRE(d, "sf_dma_new failed");
    CHECK(sf_dma_chunk(d, SF_URGENCY_HIGH, SF_DMA_D2H) == 512 * 1024);
    sf_dma_free(d);
}

TEST(copies_arrive_whole_in_chunks)
{
    size_t n = 1024 * 1024 + 3;
    unsigned char *src = malloc(n), *dst = calloc(1, n);
    REQUIRE(src && dst, "malloc");
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 131 + 7);
    const int want_chunks[SF_URGENCY_COUNT] = { 17, 9, 3 }; /* ceil(n / 64K), ceil(n / 128K), ceil(n / 512K) */
    for (int u = 0; u < SF_URGENCY_COUNT; u++) {
        counter c = { 0 };
        sf_dma *d = make(&c, NULL, 0);
        sf_error e = { 0 };
        memset(dst, 0, n);
        contention_value = 0;
        CHECK_MSG(sf_dma_copy(d, dst, src, n, SF_DMA_H2D, u, &e) == SF_OK, "%s", e.msg);
        CHECK(memcmp(src, dst, n) == 0);
        CHECK_MSG(c.chunks == want_chunks[u], "urgency %d: %d chunks, want %d", u, c.chunks, want_chunks[u]);
        CHECK(c.max_chunk == sf_dma_chunk(d, u, SF_DMA_H2D));
        sf_dma_stats st;
        sf_dma_get_stats(d, &st);
        CHECK(st.bytes[u][SF_DMA_H2D] == n && st.chunks[u] == (uint64_t)want_chunks[u]);
        CHECK(sf_dma_copy(d, dst, src, 0, SF_DMA_D2H, u, &e) == SF_OK);
        sf_dma_free(d);
    }
    free(src);
    free(dst);
}

TEST(errors_are_reported)
{
    static char a[300000], b[300000];
    counter c = { .fail_at = 2 };
    sf_dma *d = make(&c, NULL, 0);
    sf_error e = { 0 };
    CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_H2D, SF_URGENCY_NORMAL, &e) == SF_EIO);
    CHECK_MSG(strstr(e.msg, "injected") && strstr(e.msg, "131072"), "message: %s", e.msg);
    CHECK(sf_dma_copy(d, a, b, 10, 7, SF_URGENCY_NORMAL, &e) == SF_EINVAL);
    CHECK(sf_dma_copy(d, NULL, b, 10, SF_DMA_D2H, SF_URGENCY_NORMAL, &e) == SF_EINVAL);
    CHECK(sf_dma_copy(NULL, a, b, 10, SF_DMA_D2H, SF_URGENCY_NORMAL, &e) == SF_EINVAL);
    sf_dma_opts none = { 0 };
    sf_dma *d2 = NULL;
    CHECK(sf_dma_new(&none, &d2, &e) == SF_EINVAL && d2 == NULL);
    sf_dma_free(d);
    sf_dma_free(NULL);
}

TEST(low_class_is_paced_under_contention)
{
    static char a[256 * 1024], b[256 * 1024];
    counter c = { 0 };
    sf_dma *d = make(&c, NULL, 0.01); /* a 10 MB/s link */
    sf_error e = { 0 };
    REQUIRE(d, "sf_dma_new failed");

    /* others use 90%: low copies keep 10% = 1 MB/s -> 256 KiB take >= 0.26 s; unpaced copies of
     * the same size take microseconds (0.15 s allows for a loaded machine) */
    contention_value = 0.9;
    double t0 = sf_now_s();
    CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_H2D, SF_URGENCY_LOW, &e) == SF_OK);
    double paced = sf_now_s() - t0;
    CHECK_MSG(paced >= 0.25, "low copy under contention 0.9 took %.3f s, want >= 0.25", paced);
    CHECK_MSG(paced < 2.0, "low copy took %.3f s", paced);

    t0 = sf_now_s(); /* the high class is never paced */
    CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_H2D, SF_URGENCY_HIGH, &e) == SF_OK);
    CHECK_MSG(sf_now_s() - t0 < 0.15, "high copy took %.3f s", sf_now_s() - t0);

    contention_value = 0.2; /* under the threshold: not paced */
    t0 = sf_now_s();
    CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_D2H, SF_URGENCY_LOW, &e) == SF_OK);
    CHECK_MSG(sf_now_s() - t0 < 0.15, "low copy without contention took %.3f s", sf_now_s() - t0);

    sf_dma_stats st;
    sf_dma_get_stats(d, &st);
    CHECK(st.paced_copies >= 3 && st.paced_s >= 0.2);
    sf_dma_free(d);
}

TEST(defer_mode_books_low_copies_instead_of_sleeping)
{
    static char a[256 * 1024], b[256 * 1024];
    counter c = { 0 };
    sf_dma_opts o = { .copy = copy_memcpy, .copy_arg = &c, .contention = contention, .link_gbs = 0.01, .defer = 1 };
    sf_dma *d = NULL;
    sf_error e = { 0 };
    REQUIRE(sf_dma_new(&o, &d, &e) == SF_OK, "sf_dma_new: %s", e.msg);
    contention_value = 0.9;
    CHECK(sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_H2D)); /* nothing booked yet */
    double t0 = sf_now_s();
    CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_H2D, SF_URGENCY_LOW, &e) == SF_OK);
    CHECK_MSG(sf_now_s() - t0 < 0.15, "defer mode slept %.3f s", sf_now_s() - t0);
    /* 256 KiB booked at 10% of 10 MB/s: the next low H2D copy waits ~0.26 s; D2H, high and
     * normal urgency are free to go */
    CHECK(!sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_H2D));
    CHECK(sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_D2H));
    CHECK(sf_dma_may_start(d, SF_URGENCY_HIGH, SF_DMA_H2D) && sf_dma_may_start(d, SF_URGENCY_NORMAL, SF_DMA_H2D));
    contention_value = 0.2; /* the link cleared: go */
    CHECK(sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_H2D));
    contention_value = 0.9;
    int waited = 0;
    while (!sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_H2D) && waited < 300) usleep(10000), waited++;
    double drained = sf_now_s() - t0;
    CHECK_MSG(drained >= 0.2 && drained < 2.0, "the booking drained after %.3f s, want ~0.26", drained);
    sf_dma_stats st;
    sf_dma_get_stats(d, &st);
    CHECK_MSG(st.deferred >= 2 && st.booked_bytes == sizeof a && st.paced_copies == 0,
              "%llu deferred, %llu booked, %llu paced", (unsigned long long)st.deferred,
              (unsigned long long)st.booked_bytes, (unsigned long long)st.paced_copies);
    sf_dma_free(d);
}

TEST(untuned_copies_in_one_piece_never_held)
{
    static char a[3 << 20], b[3 << 20];
    counter c = { 0 };
    sf_dma_opts o = { .copy = copy_memcpy, .copy_arg = &c, .contention = contention, .link_gbs = 0.01, .untuned = 1 };
    sf_dma *d = NULL;
    sf_error e = { 0 };
    REQUIRE(sf_dma_new(&o, &d, &e) == SF_OK, "sf_dma_new: %s", e.msg);
    contention_value = 0.95;
    double t0 = sf_now_s();
    for (int u = 0; u < SF_URGENCY_COUNT; u++)
        CHECK(sf_dma_copy(d, a, b, sizeof a, SF_DMA_H2D, u, &e) == SF_OK);
    CHECK_MSG(c.chunks == 3 && c.max_chunk == sizeof a, "%d chunks, largest %zu", c.chunks, c.max_chunk);
    CHECK_MSG(sf_now_s() - t0 < 0.5, "untuned copies took %.3f s", sf_now_s() - t0);
    CHECK(sf_dma_may_start(d, SF_URGENCY_LOW, SF_DMA_H2D));
    sf_dma_free(d);
}

int main(void)
{
    RUN(default_chunks);
    RUN(chunks_follow_the_measured_curve);
    RUN(copies_arrive_whole_in_chunks);
    RUN(errors_are_reported);
    RUN(low_class_is_paced_under_contention);
    RUN(defer_mode_books_low_copies_instead_of_sleeping);
    RUN(untuned_copies_in_one_piece_never_held);
    return test_summary();
}
