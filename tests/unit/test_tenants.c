/* test_tenants.c — tenants file parsing, API-key lookup, urgency cap, token bucket and
 * concurrency limits, client prefixes. */
#include "../test.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include "gateway/tenants.h"

static const char *good =
    "{\"tenants\": ["
    " {\"name\": \"acme\", \"api_keys\": [\"sk-acme-0001\", \"sk-acme-0002\"],"
    "  \"default_intent\": \"realtime-chat; urgency=high\", \"max_urgency\": \"normal\","
    "  \"token_rate_limit\": 10, \"token_burst\": 20, \"max_concurrent\": 2,"
    "  \"client_prefixes\": [\"10.1.0.0/16\", \"fd00::/8\", \"192.168.1.7\"]},"
    " {\"name\": \"batchco\", \"api_keys\": [\"sk-batch-0001\"], \"default_intent\": {\"class\": \"batch\"}}"
    "]}";

static sf_tenants *load(const char *s, sf_error *err)
{
    sf_tenants *ts = NULL;
    if (sf_tenants_parse(s, strlen(s), &ts, err)) return NULL;
    return ts;
}

TEST(parse_and_auth)
{
    sf_error err = { 0 };
    sf_tenants *ts = load(good, &err);
    REQUIRE(ts, "%s", err.msg);
    CHECK(ts->n == 2 && !ts->open);
    sf_tenant *a = sf_tenants_auth(ts, "Bearer sk-acme-0002");
    REQUIRE(a && !strcmp(a->name, "acme"), "acme by its second key");
    /* default intent is capped to max_urgency at load */
    CHECK(!strcmp(a->default_intent.cls, "realtime-chat") && a->default_intent.urgency == SF_URGENCY_NORMAL);
    CHECK(a->rate_tps == 10 && a->burst == 20 && a->max_concurrent == 2 && a->n_prefixes == 3);
    sf_tenant *b = sf_tenants_auth(ts, "bearer   sk-batch-0001 ");
    REQUIRE(b && !strcmp(b->name, "batchco"), "case-insensitive scheme, spaces");
    CHECK(b->default_intent.urgency == SF_URGENCY_LOW && b->max_urgency == SF_URGENCY_HIGH);
    CHECK(b->rate_tps == 0 && b->max_concurrent == 0);
    CHECK(sf_tenants_auth(ts, NULL) == NULL);
    CHECK(sf_tenants_auth(ts, "Bearer ") == NULL);
    CHECK(sf_tenants_auth(ts, "Bearer sk-acme-000") == NULL);
    CHECK(sf_tenants_auth(ts, "Bearer sk-acme-00011") == NULL);
    CHECK(sf_tenants_auth(ts, "Basic sk-acme-0001") == NULL);
    sf_tenants_free(ts);
}

TEST(open_server)
{
    sf_error err = { 0 };
    sf_tenants *ts = NULL;
    int rc = sf_tenants_open(&ts, &err); /* REQUIRE evaluates its condition twice */
    REQUIRE(rc == 0, "%s", err.msg);
    sf_tenant *t = sf_tenants_auth(ts, NULL);
    REQUIRE(t && !strcmp(t->name, "default"), "anyone is the default tenant");
    CHECK(sf_tenants_auth(ts, "Bearer whatever") == t);
    double ra;
    const char *why;
    for (int i = 0; i < 1000; i++) CHECK(sf_tenant_admit(t, 0, &ra, &why) == SF_OK);
    sf_tenants_free(ts);
}

TEST(cap)
{
    sf_error err = { 0 };
    sf_tenants *ts = load(good, &err);
    REQUIRE(ts, "%s", err.msg);
    sf_intent in = { .cls = "x", .urgency = SF_URGENCY_HIGH };
    CHECK(sf_tenant_cap(&ts->t[0], &in) == 1 && in.urgency == SF_URGENCY_NORMAL);
    in.urgency = SF_URGENCY_LOW;
    CHECK(sf_tenant_cap(&ts->t[0], &in) == 0 && in.urgency == SF_URGENCY_LOW);
    sf_tenants_free(ts);
}

TEST(concurrency_limit)
{
    sf_error err = { 0 };
    sf_tenants *ts = load(good, &err);
    REQUIRE(ts, "%s", err.msg);
    sf_tenant *a = &ts->t[0];
    double ra = 0, now = a->bucket_t;
    const char *why = NULL;
    CHECK(sf_tenant_admit(a, now, &ra, &why) == SF_OK);
    CHECK(sf_tenant_admit(a, now, &ra, &why) == SF_OK);
    CHECK(sf_tenant_admit(a, now, &ra, &why) == SF_AGAIN && !strcmp(why, "concurrency") && ra >= 1);
    sf_tenant_release(a);
    CHECK(sf_tenant_admit(a, now, &ra, &why) == SF_OK);
    sf_tenants_free(ts);
}

TEST(token_bucket)
{
    sf_error err = { 0 };
    sf_tenants *ts = load(good, &err);
    REQUIRE(ts, "%s", err.msg);
    sf_tenant *a = &ts->t[0];
    double ra = 0, now = a->bucket_t;
    const char *why = NULL;
    REQUIRE(sf_tenant_admit(a, now, &ra, &why) == SF_OK, "first admit");
    sf_tenant_release(a);
    sf_tenant_charge(a, 50, now); /* burst 20 -> debt of 30 tokens at 10 tokens/s */
    CHECK(sf_tenant_admit(a, now, &ra, &why) == SF_AGAIN && !strcmp(why, "rate"));
    CHECK_MSG(ra > 3.0 && ra < 3.2, "retry after %.2f s, want 3.1", ra);
    CHECK(sf_tenant_admit(a, now + 2.0, &ra, &why) == SF_AGAIN);
    CHECK(sf_tenant_admit(a, now + 3.2, &ra, &why) == SF_OK);
    sf_tenant_release(a);
    /* refill stops at the burst */
    CHECK(sf_tenant_admit(a, now + 1000, &ra, &why) == SF_OK);
    CHECK(a->bucket <= a->burst);
    sf_tenants_free(ts);
}

TEST(prefixes)
{
    sf_error err = { 0 };
    sf_prefix p;
    uint8_t a4[4], a6[16];
    REQUIRE(sf_prefix_parse("10.1.0.0/16", &p, &err) == 0, "%s", err.msg);
    inet_pton(AF_INET, "10.1.200.3", a4);
    CHECK(sf_prefix_match(&p, AF_INET, a4));
    inet_pton(AF_INET, "10.2.0.1", a4);
    CHECK(!sf_prefix_match(&p, AF_INET, a4));
    REQUIRE(sf_prefix_parse("fc00::/7", &p, &err) == 0, "%s", err.msg);
    inet_pton(AF_INET6, "fd12::1", a6);
    CHECK(sf_prefix_match(&p, AF_INET6, a6));
    CHECK(!sf_prefix_match(&p, AF_INET, a4));
    REQUIRE(sf_prefix_parse("0.0.0.0/0", &p, &err) == 0, "%s", err.msg);
    CHECK(sf_prefix_match(&p, AF_INET, a4));
    const char *bad[] = { "10.1.0.1/16", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "banana", "/8", "::1/129" };
    for (size_t i = 0; i < SF_ARRAY_LEN(bad); i++) {
        err.msg[0] = 0;
        CHECK_MSG(sf_prefix_parse(bad[i], &p, &err) == SF_EINVAL && err.msg[0], "%s accepted", bad[i]);
    }
}

TEST(bad_files)
{
    static const struct { const char *json, *needle; } cases[] = {
        { "", "line" },
        { "[]", "must be {\"tenants\"" },
        { "{\"tenants\": []}", "1 to 10000" },
        { "{\"tenants\": [], \"x\": 1}", "must be {\"tenants\"" },
        { "{\"tenants\": [5]}", "must be an object" },
        { "{\"tenants\": [{\"api_keys\": [\"sk-12345678\"]}]}", "name must be" },
        { "{\"tenants\": [{\"name\": \"a b\", \"api_keys\": [\"sk-12345678\"]}]}", "name must be" },
        { "{\"tenants\": [{\"name\": \"a\"}]}", "needs \"api_keys\"" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": []}]}", "non-empty array" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"short\"]}]}", "8 to 256" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk 1234567\"]}]}", "printable ASCII" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"rate\": 5}]}", "unknown key 'rate'" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"max_urgency\": \"top\"}]}", "max_urgency" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"token_rate_limit\": -1}]}", "non-negative" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"max_concurrent\": 1.5}]}", "integer" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"default_intent\": \"x;;\"}]}", "default_intent" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"], \"client_prefixes\": [\"1.2.3.4/40\"]}]}", "prefix length" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"]}, {\"name\": \"a\", \"api_keys\": [\"sk-87654321\"]}]}", "also used" },
        { "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"sk-12345678\"]}, {\"name\": \"b\", \"api_keys\": [\"sk-12345678\"]}]}", "API key is also" },
        { "{\"tenants\": [{\"name\": \"a\", \"name\": \"b\", \"api_keys\": [\"sk-12345678\"]}]}", "duplicate" },
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(cases); i++) {
        sf_error err = { 0 };
        sf_tenants *ts = load(cases[i].json, &err);
        CHECK_MSG(ts == NULL, "case %zu accepted", i);
        sf_tenants_free(ts);
        CHECK_MSG(strstr(err.msg, cases[i].needle) != NULL, "case %zu: '%s' (want '%s')", i, err.msg,
                  cases[i].needle);
    }
}

TEST(load_missing_file)
{
    sf_error err = { 0 };
    sf_tenants *ts = NULL;
    CHECK(sf_tenants_load("/nonexistent/tenants.json", &ts, &err) != SF_OK && ts == NULL);
    CHECK_MSG(strstr(err.msg, "/nonexistent/tenants.json") != NULL, "%s", err.msg);
}

int main(void)
{
    RUN(parse_and_auth);
    RUN(open_server);
    RUN(cap);
    RUN(concurrency_limit);
    RUN(token_bucket);
    RUN(prefixes);
    RUN(bad_files);
    RUN(load_missing_file);
    return test_summary();
}
