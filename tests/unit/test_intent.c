/* test_intent.c — the X-Semantic-Intent parser: valid forms, defaults, and precise errors. */
#include "../test.h"

#include "gateway/intent.h"

static int parse(const char *s, sf_intent *in, sf_error *err)
{
    return sf_intent_parse(s, strlen(s), in, err);
}

TEST(full_header)
{
    sf_intent in;
    sf_error err = { 0 };
    REQUIRE(parse("realtime-chat; urgency=high; max-latency=400ms; min-throughput=50tokens/sec", &in, &err) == 0,
            "%s", err.msg);
    CHECK(!strcmp(in.cls, "realtime-chat"));
    CHECK(in.urgency == SF_URGENCY_HIGH);
    CHECK(in.max_latency_ms == 400);
    CHECK(fabs(in.min_tps - 50) < 1e-9);
}

TEST(units_and_spacing)
{
    sf_intent in;
    sf_error err = { 0 };
    REQUIRE(parse("  summarize ;urgency = low;max-latency=1.5s ; min-throughput=12.5tokens/s  ", &in, &err) == 0,
            "%s", err.msg);
    CHECK(!strcmp(in.cls, "summarize"));
    CHECK(in.urgency == SF_URGENCY_LOW);
    CHECK(in.max_latency_ms == 1500);
    CHECK(fabs(in.min_tps - 12.5) < 1e-9);
}

TEST(class_picks_lane)
{
    sf_intent in;
    sf_error err = { 0 };
    REQUIRE(parse("realtime-voice", &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_HIGH && in.max_latency_ms == 0 && in.min_tps == 0);
    REQUIRE(parse("batch-summarize", &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_LOW);
    REQUIRE(parse("chat", &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_NORMAL);
    /* an explicit urgency beats the class */
    REQUIRE(parse("batch-x; urgency=high", &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_HIGH);
}

TEST(errors_are_precise)
{
    static const struct { const char *in, *needle; } cases[] = {
        { "", "class is empty" },
        { "   ", "class is empty" },
        { "; urgency=high", "class is empty" },
        { "chat!", "character '!'" },
        { "chat; urgency=urgent", "urgency='urgent'" },
        { "chat; urgency=high; urgency=low", "given twice" },
        { "chat; max-latency=400", "needs a unit" },
        { "chat; max-latency=400 ms", "needs a unit" },
        { "chat; max-latency=ms", "must start with a number" },
        { "chat; max-latency=-5ms", "must start with a number" },
        { "chat; max-latency=0ms", "between 1ms" },
        { "chat; max-latency=1e3ms", "needs a unit" },
        { "chat; min-throughput=50", "needs a unit" },
        { "chat; min-throughput=50tok/s", "needs a unit" },
        { "chat; min-throughput=0tokens/s", "at least 0.001" },
        { "chat; min-throughput=0.0005tokens/s", "at least 0.001" },
        { "chat; min-throughput=1000001tokens/s", "at most 1000000" },
        { "chat;", "empty parameter" },
        { "chat;; urgency=low", "empty parameter" },
        { "chat; urgency", "not key=value" },
        { "chat; urgency=", "empty value" },
        { "chat; deadline=5s", "unknown parameter 'deadline'" },
        { "chat\x01", "control character" },
        { "a-very-long-class-name-that-goes-on-and-on-and-on-forever", "longer than 47" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_intent in;
        sf_error err = { 0 };
        int rc = parse(cases[i].in, &in, &err);
        CHECK_MSG(rc == SF_EINVAL, "'%s' was accepted", cases[i].in);
        CHECK_MSG(strstr(err.msg, cases[i].needle) != NULL, "'%s' -> '%s' (want '%s')", cases[i].in,
                  err.msg, cases[i].needle);
    }
}

TEST(not_nul_terminated)
{
    const char buf[] = "chat; urgency=lowXYZ";
    sf_intent in;
    sf_error err = { 0 };
    REQUIRE(sf_intent_parse(buf, strlen("chat; urgency=low"), &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_LOW);
}

TEST(json_forms)
{
    sf_intent in;
    sf_error err = { 0 };
    json_t *s = json_string("interactive; max-latency=2s");
    REQUIRE(sf_intent_from_json(s, &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_HIGH && in.max_latency_ms == 2000);
    json_decref(s);
    json_t *o = json_pack("{s:s, s:s, s:i, s:f}", "class", "bulk", "urgency", "normal", "max_latency_ms", 250,
                          "min_tps", 20.0);
    REQUIRE(sf_intent_from_json(o, &in, &err) == 0, "%s", err.msg);
    CHECK(!strcmp(in.cls, "bulk") && in.urgency == SF_URGENCY_NORMAL && in.max_latency_ms == 250);
    CHECK(fabs(in.min_tps - 20) < 1e-9);
    json_decref(o);
    o = json_pack("{s:s, s:s}", "class", "bulk", "max_latency", "3s");
    REQUIRE(sf_intent_from_json(o, &in, &err) == 0, "%s", err.msg);
    CHECK(in.urgency == SF_URGENCY_LOW && in.max_latency_ms == 3000);
    json_decref(o);
}

TEST(json_errors)
{
    const char *bad[] = {
        "42", "null", "[]", "{}", "{\"class\": 5}", "{\"class\": \"a b\"}", "{\"class\": \"x\", \"prio\": 1}",
        "{\"class\": \"x\", \"urgency\": \"max\"}", "{\"class\": \"x\", \"max_latency_ms\": -1}",
        "{\"class\": \"x\", \"max_latency_ms\": 1.5}", "{\"class\": \"x\", \"min_tps\": \"fast\"}",
        "{\"class\": \"x\", \"max_latency\": \"3\"}",
        "{\"class\": \"x\", \"max_latency\": \"3s\", \"max_latency_ms\": 4}",
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        json_t *v = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        REQUIRE(v, "test JSON %s", bad[i]);
        sf_intent in;
        sf_error err = { 0 };
        CHECK_MSG(sf_intent_from_json(v, &in, &err) == SF_EINVAL, "%s accepted", bad[i]);
        CHECK_MSG(err.msg[0] != 0, "%s: no message", bad[i]);
        json_decref(v);
    }
}

TEST(format_roundtrip)
{
    sf_intent a, b;
    sf_error err = { 0 };
    REQUIRE(parse("x.y_z; urgency=low; max-latency=75ms; min-throughput=33tokens/s", &a, &err) == 0, "%s", err.msg);
    char buf[256];
    sf_intent_format(&a, buf, sizeof buf);
    REQUIRE(parse(buf, &b, &err) == 0, "%s: %s", buf, err.msg);
    CHECK(!memcmp(&a, &b, sizeof a));
    /* the ends of the range, and a fraction, come back as written (%g wrote 1e+06, which the
     * parser refuses: found by make fuzz) */
    static const char *const tps[] = { "1000000", "0.001", "12.5", "333.333" };
    for (size_t i = 0; i < SF_ARRAY_LEN(tps); i++) {
        char in[96];
        snprintf(in, sizeof in, "c; min-throughput=%stokens/s", tps[i]);
        REQUIRE(parse(in, &a, &err) == 0, "%s: %s", in, err.msg);
        sf_intent_format(&a, buf, sizeof buf);
        CHECK_MSG(parse(buf, &b, &err) == 0 && b.min_tps == a.min_tps && strstr(buf, tps[i]), "%s -> %s", in, buf);
    }
}

int main(void)
{
    RUN(full_header);
    RUN(units_and_spacing);
    RUN(class_picks_lane);
    RUN(errors_are_precise);
    RUN(not_nul_terminated);
    RUN(json_forms);
    RUN(json_errors);
    RUN(format_roundtrip);
    return test_summary();
}
