/* test.h — the unit-test harness. Each test binary prints one line per check group:
 *   PASS: name            or   FAIL: name: file:line: what
 * and ends with "N passed, N failed". tests/run.sh sums the lines of all binaries.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_MSG(ok, "got %d", v); }
 *   int main(void) { RUN(name); return test_summary(); }
 *
 * Test data: test_data_dir() is ../shared/testdata next to the checkout, or $SF_TESTDATA. */
#ifndef SF_TEST_H
#define SF_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int test_passed_, test_failed_, test_cur_failed_;
static const char *test_cur_name_;

#define TEST(name) static void test_##name(void)
#define RUN(name)                                                                            \
    do {                                                                                     \
        test_cur_name_ = #name;                                                              \
        test_cur_failed_ = 0;                                                                \
        test_##name();                                                                       \
        if (test_cur_failed_) test_failed_++;                                                \
        else { test_passed_++; printf("PASS: %s\n", #name); }                                \
        fflush(stdout);                                                                      \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                 \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            if (!test_cur_failed_) printf("FAIL: %s: %s:%d: ", test_cur_name_, __FILE__, __LINE__); \
            else printf("      ...also %s:%d: ", __FILE__, __LINE__);                       \
            printf(__VA_ARGS__);                                                             \
            printf(" [%s]\n", #cond);                                                        \
            test_cur_failed_ = 1;                                                            \
        }                                                                                    \
    } while (0)
#define CHECK(cond) CHECK_MSG(cond, "check failed")
/* Stop the current test on failure (use for preconditions). */
#define REQUIRE(cond, ...)                                                                   \
    do { int req_ok_ = !!(cond); CHECK_MSG(req_ok_, __VA_ARGS__); if (!req_ok_) return; } while (0)

static inline int test_summary(void)
{
    printf("%d passed, %d failed\n", test_passed_, test_failed_);
    return test_failed_ ? 1 : 0;
}

static inline const char *test_data_dir(void)
{
    static char buf[4096];
    const char *e = getenv("SF_TESTDATA");
    if (e) return e;
    if (access("../shared/testdata", R_OK) == 0) { realpath("../shared/testdata", buf); return buf; }
    return "../shared/testdata";
}

static inline const char *test_data(const char *rel)
{
    static char bufs[8][4096];
    static int i;
    char *b = bufs[i++ & 7];
    snprintf(b, 4096, "%s/%s", test_data_dir(), rel);
    return b;
}

/* A fresh temp dir for the test (removed by the OS; tests clean up what they can). */
static inline const char *test_tmpdir(void)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "/tmp/semflow-test-XXXXXX");
    return mkdtemp(buf);
}

#endif
