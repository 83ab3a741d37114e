/* test_env_switches.c — the CUDA backend's SEMFLOW_* switches on a GPU: each one set to a
 * malformed value must be refused with a warning naming it (common/env.c), the backend then
 * opening with its default; set to a value the switch takes, it must open without a word. Run
 * by bench/device/throughput.sh. */
#include "common/sf.h"
#include "hal/hal.h"
#include "tests/lib/capture.h"
#include "tests/test.h"

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
    RUN(malformed_values_are_refused_by_name);
    RUN(accepted_values_are_silent);
    return test_summary();
}
