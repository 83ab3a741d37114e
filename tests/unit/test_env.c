/* test_env.c — the SEMFLOW_* environment switches (common/env.c): every accepted spelling, and
 * every malformed value refused with a warning that names the variable, the value and what it
 * takes, the default then in force; and the engine's own switches read through them
 * (SEMFLOW_ENGINE_OVERLAP, SEMFLOW_ENGINE_WARMUP, SEMFLOW_ENGINE_ASYNC, SEMFLOW_SCHED_RT_ALONE, SEMFLOW_LOG,
 * SEMFLOW_TP_TIMEOUT_MS, SEMFLOW_TP_FUSED) on the CPU backend with stories260K. */
#include "common/sf.h"
#include "engine/engine.h"
#include "engine/kvcache.h"
#include "engine/scheduler.h"
#include "hal/comm.h"
#include "tests/lib/capture.h"
#include "tests/lib/engine_collect.h"
#include "tests/lib/engine_wait.h"
#include "tests/test.h"

TEST(bool_values)
{
    static const char *on[] = { "1", "on", "ON", "true", "Yes" }, *off[] = { "0", "off", "False", "no" };
    for (size_t i = 0; i < SF_ARRAY_LEN(on); i++) {
        setenv("SEMFLOW_TEST_SWITCH", on[i], 1);
        CHECK_MSG(sf_env_bool("SEMFLOW_TEST_SWITCH", 0) == 1, "'%s' is on", on[i]);
    }
    for (size_t i = 0; i < SF_ARRAY_LEN(off); i++) {
        setenv("SEMFLOW_TEST_SWITCH", off[i], 1);
        CHECK_MSG(sf_env_bool("SEMFLOW_TEST_SWITCH", 1) == 0, "'%s' is off", off[i]);
    }
    unsetenv("SEMFLOW_TEST_SWITCH");
    capture_begin();
    int a = sf_env_bool("SEMFLOW_TEST_SWITCH", 1), b;
    setenv("SEMFLOW_TEST_SWITCH", "", 1);
    b = sf_env_bool("SEMFLOW_TEST_SWITCH", 0);
    const char *log = capture_end();
    CHECK(a == 1 && b == 0);
    CHECK_MSG(!log[0], "unset and empty are silent, got '%s'", log);
}

TEST(bool_malformed_warns_and_keeps_default)
{
    static const char *bad[] = { "2", "01", "yes please", "enable", " 1", "-1" };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        setenv("SEMFLOW_TEST_SWITCH", bad[i], 1);
        capture_begin();
        int v0 = sf_env_bool("SEMFLOW_TEST_SWITCH", 0), v1 = sf_env_bool("SEMFLOW_TEST_SWITCH", 1);
        const char *log = capture_end();
        CHECK_MSG(v0 == 0 && v1 == 1, "'%s' keeps the default", bad[i]);
        CHECK_MSG(strstr(log, "warn") && strstr(log, "SEMFLOW_TEST_SWITCH") && strstr(log, bad[i]) &&
                  strstr(log, "0 or 1"), "'%s': %s", bad[i], log);
    }
    unsetenv("SEMFLOW_TEST_SWITCH");
}

TEST(long_values)
{
    setenv("SEMFLOW_TEST_N", "4096", 1);
    CHECK(sf_env_long("SEMFLOW_TEST_N", 7, 0, 1 << 20) == 4096);
    setenv("SEMFLOW_TEST_N", "-3", 1);
    CHECK(sf_env_long("SEMFLOW_TEST_N", 7, -5, 5) == -3);
    static const char *bad[] = { "12k", "1e3", "abc", "99999999999999999999", "2000000", "-1" };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        setenv("SEMFLOW_TEST_N", bad[i], 1);
        capture_begin();
        long v = sf_env_long("SEMFLOW_TEST_N", 7, 0, 1 << 20);
        const char *log = capture_end();
        CHECK_MSG(v == 7, "'%s' keeps the default, got %ld", bad[i], v);
        CHECK_MSG(strstr(log, "SEMFLOW_TEST_N") && strstr(log, "[0, 1048576]"), "'%s': %s", bad[i], log);
    }
    unsetenv("SEMFLOW_TEST_N");
    CHECK(sf_env_long("SEMFLOW_TEST_N", 7, 0, 10) == 7);
}

TEST(choice_values)
{
    static const char *const ch[] = { "nccl", "custom", "ll" };
    setenv("SEMFLOW_TEST_PATH", "ll", 1);
    CHECK(sf_env_choice("SEMFLOW_TEST_PATH", -1, ch, 3) == 2);
    setenv("SEMFLOW_TEST_PATH", "LL", 1);
    capture_begin();
    int v = sf_env_choice("SEMFLOW_TEST_PATH", 0, ch, 3);
    const char *log = capture_end();
    CHECK(v == 0);
    CHECK_MSG(strstr(log, "SEMFLOW_TEST_PATH=LL") && strstr(log, "nccl, custom, ll") && strstr(log, "default, nccl"),
              "%s", log);
    unsetenv("SEMFLOW_TEST_PATH");
}

TEST(sched_rt_alone)
{
    static const struct { const char *v; int want; } cases[] = { { NULL, 1 }, { "0", 0 }, { "off", 0 }, { "1", 1 },
                                                                 { "0x", 1 }, { "nope", 1 } };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_error err = { 0 };
        sf_kv_pool pool;
        sf_sched s;
        REQUIRE(sf_kv_pool_init(&pool, 64, 16, &err) == SF_OK, "%s", err.msg);
        sf_sched_config c = { .max_num_seqs = 4, .max_batched_tokens = 64, .max_model_len = 256 };
        if (cases[i].v) setenv("SEMFLOW_SCHED_RT_ALONE", cases[i].v, 1);
        else unsetenv("SEMFLOW_SCHED_RT_ALONE");
        capture_begin();
        int rc = sf_sched_init(&s, &c, &pool, &err);
        const char *log = capture_end();
        CHECK_MSG(rc == SF_OK, "%s", err.msg);
        CHECK_MSG(rc || s.rt_alone == cases[i].want, "SEMFLOW_SCHED_RT_ALONE=%s: rt_alone %d", cases[i].v ? cases[i].v : "(unset)",
                  s.rt_alone);
        int malformed = i >= 4;
        CHECK_MSG(!malformed == !strstr(log, "SEMFLOW_SCHED_RT_ALONE"), "%s: log '%s'", cases[i].v ? cases[i].v : "(unset)", log);
        if (!rc) sf_sched_free(&s);
        sf_kv_pool_free(&pool);
    }
    unsetenv("SEMFLOW_SCHED_RT_ALONE");
}

/* SEMFLOW_TP_TIMEOUT_MS: milliseconds as a plain integer; a unit ("5s", once a 5 ms timeout that
 * failed every collective of a real step) or junk warns and keeps 60 s. */
TEST(tp_timeout)
{
    static const struct { const char *v; int want, warns; } cases[] = {
        { NULL, 60000, 0 }, { "5000", 5000, 0 }, { "1", 1, 0 }, { "5s", 60000, 1 }, { "abc", 60000, 1 },
        { "0", 60000, 1 }, { "-5", 60000, 1 }, { "90000000", 60000, 1 }, { "5000 ", 60000, 1 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        if (cases[i].v) setenv("SEMFLOW_TP_TIMEOUT_MS", cases[i].v, 1);
        else unsetenv("SEMFLOW_TP_TIMEOUT_MS");
        capture_begin();
        int ms = sf_comm_default_timeout_ms();
        const char *log = capture_end();
        const char *v = cases[i].v ? cases[i].v : "(unset)";
        CHECK_MSG(ms == cases[i].want, "SEMFLOW_TP_TIMEOUT_MS=%s: %d ms, want %d", v, ms, cases[i].want);
        CHECK_MSG(!cases[i].warns == !(strstr(log, "SEMFLOW_TP_TIMEOUT_MS") && strstr(log, "[1, 86400000]")),
                  "SEMFLOW_TP_TIMEOUT_MS=%s: log '%s'", v, log);
    }
    unsetenv("SEMFLOW_TP_TIMEOUT_MS");
}

/* An engine on the CPU with the environment as set; one request of 3 tokens through it.
 * *overlapped: the loop it ran; returns what the engine logged while starting. */
static const char *engine_run(int *overlapped, int *tokens, int *async)
{
    sf_error err = { 0 };
    sf_engine_config c;
    sf_engine_config_default(&c);
    c.model = test_data("stories260K/stories260K.gguf");
    c.backend = "cpu";
    c.n_threads = 1;
    c.max_num_seqs = 4;
    c.max_batched_tokens = 64;
    sf_engine *e = NULL;
    *overlapped = *async = -1;
    *tokens = 0;
    capture_begin();
    int rc = sf_engine_new(&c, &e, &err);
    const char *log = capture_end();
    if (rc) {
        printf("      engine: %s\n", err.msg);
        return log;
    }
    collect o;
    collect_init(&o);
    int32_t prompt[3] = { 1, 2, 3 };
    sf_submit s = { .prompt = prompt, .n_prompt = 3, .cb = on_event, .user = &o };
    sf_sampling_default(&s.sampling);
    s.sampling.max_tokens = 3;
    s.sampling.ignore_eos = 1;
    if (sf_engine_submit(e, &s, NULL, NULL, &err) == SF_OK) collect_wait(&o);
    sf_engine_stats st;
    wait_idle(e, &st);
    *overlapped = st.overlapped;
    *async = st.async;
    *tokens = o.n_tokens;
    sf_engine_free(e);
    return log;
}

TEST(engine_overlap_and_warmup)
{
    static const struct { const char *ov, *warm; int overlapped, warmed, warns; } cases[] = {
        { NULL, NULL, 1, 0, 0 },        { "0", NULL, 0, 0, 0 },        { "off", "1", 0, 1, 0 },
        { "serial", NULL, 1, 0, 1 },    { "1", "sometimes", 1, 0, 1 }, { NULL, "0", 1, 0, 0 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        if (cases[i].ov) setenv("SEMFLOW_ENGINE_OVERLAP", cases[i].ov, 1);
        else unsetenv("SEMFLOW_ENGINE_OVERLAP");
        if (cases[i].warm) setenv("SEMFLOW_ENGINE_WARMUP", cases[i].warm, 1);
        else unsetenv("SEMFLOW_ENGINE_WARMUP");
        int ov, tok, as;
        const char *log = engine_run(&ov, &tok, &as);
        CHECK_MSG(ov == cases[i].overlapped && tok == 3, "case %zu: overlapped %d, %d tokens", i, ov, tok);
        CHECK_MSG(!strstr(log, "warm-up of") == !cases[i].warmed, "case %zu: %s", i, log);
        CHECK_MSG(!strstr(log, "warn:") == !cases[i].warns, "case %zu: %s", i, log);
        if (cases[i].warns)
            CHECK_MSG(strstr(log, cases[i].ov && strcmp(cases[i].ov, "1") ? "SEMFLOW_ENGINE_OVERLAP=serial"
                                                                            : "SEMFLOW_ENGINE_WARMUP=sometimes"),
                      "case %zu names the variable: %s", i, log);
    }
    unsetenv("SEMFLOW_ENGINE_OVERLAP");
    unsetenv("SEMFLOW_ENGINE_WARMUP");
}

/* SEMFLOW_ENGINE_ASYNC: on (the default), the CPU backend's steps queue behind each other with
 * the same tokens; 0 gives the overlapped loop; a malformed value is named in a warning and the
 * default (on) kept. */
TEST(engine_async)
{
    static const struct { const char *v; int async, warns; } cases[] = {
        { NULL, 1, 0 }, { "1", 1, 0 }, { "on", 1, 0 }, { "0", 0, 0 }, { "off", 0, 0 }, { "maybe", 1, 1 }, { "2", 1, 1 },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        if (cases[i].v) setenv("SEMFLOW_ENGINE_ASYNC", cases[i].v, 1);
        else unsetenv("SEMFLOW_ENGINE_ASYNC");
        int ov, tok, as;
        const char *log = engine_run(&ov, &tok, &as);
        CHECK_MSG(as == cases[i].async && tok == 3, "case %zu (%s): async %d, %d tokens", i,
                  cases[i].v ? cases[i].v : "unset", as, tok);
        CHECK_MSG(!strstr(log, "warn:") == !cases[i].warns, "case %zu: %s", i, log);
        if (cases[i].warns) {
            char want[64];
            snprintf(want, sizeof want, "SEMFLOW_ENGINE_ASYNC=%s", cases[i].v);
            CHECK_MSG(strstr(log, want), "case %zu names the variable: %s", i, log);
        }
    }
    unsetenv("SEMFLOW_ENGINE_ASYNC");
}

/* SEMFLOW_TP_FUSED (read where every forward pass is built, TP or not): on/off spellings taken
 * silently, anything else warns by name; the engine runs either way. */
TEST(tp_fused_switch)
{
    static const struct { const char *v; int warns; } cases[] = { { "off", 0 }, { "1", 0 }, { "maybe", 1 },
                                                                  { "00", 1 } };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        int overlapped, tokens, async;
        setenv("SEMFLOW_TP_FUSED", cases[i].v, 1);
        const char *log = engine_run(&overlapped, &tokens, &async);
        char want[64];
        snprintf(want, sizeof want, "SEMFLOW_TP_FUSED=%s", cases[i].v);
        CHECK_MSG(tokens == 3, "SEMFLOW_TP_FUSED=%s: %d tokens", cases[i].v, tokens);
        CHECK_MSG(!cases[i].warns == !(strstr(log, want) && strstr(log, "0 or 1")), "%s: log '%s'", want, log);
    }
    unsetenv("SEMFLOW_TP_FUSED");
}

TEST(log_level)
{
    int saved = sf_log_level;
    setenv("SEMFLOW_LOG", "loud", 1);
    capture_begin();
    int v = sf_env_choice("SEMFLOW_LOG", SF_LOG_INFO, (const char *const[]){ "error", "warn", "info", "debug" }, 4);
    const char *log = capture_end();
    CHECK(v == SF_LOG_INFO);
    CHECK_MSG(strstr(log, "SEMFLOW_LOG=loud") && strstr(log, "error, warn, info, debug"), "%s", log);
    unsetenv("SEMFLOW_LOG");
    sf_log_level = saved;
}

int main(void)
{
    RUN(bool_values);
    RUN(bool_malformed_warns_and_keeps_default);
    RUN(long_values);
    RUN(choice_values);
    RUN(sched_rt_alone);
    RUN(engine_overlap_and_warmup);
    RUN(engine_async);
    RUN(tp_timeout);
    RUN(tp_fused_switch);
    RUN(log_level);
    return test_summary();
}
