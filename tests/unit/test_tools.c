/* test_tools.c — chat tools in the gateway (gateway/tools.c): the calls read back out of
 * replies in Qwen's <tool_call> form and Llama 3.1's bare object, what is not calls, and the
 * schema a forced tool_choice constrains the output to. */
#include <jansson.h>

#include "engine/json_mask.h"
#include "gateway/params.h"
#include "tests/test.h"

static json_t *parse(const char *s, char **said) { return sf_gw_parse_tool_calls(s, strlen(s), "req", said); }

static int call_is(json_t *calls, size_t k, const char *name, const char *args)
{
    json_t *c = json_array_get(calls, k), *f = json_object_get(c, "function");
    char id[32];
    snprintf(id, sizeof id, "call_req_%zu", k);
    return c && !strcmp(json_string_value(json_object_get(c, "type")), "function") &&
           !strcmp(json_string_value(json_object_get(c, "id")), id) &&
           !strcmp(json_string_value(json_object_get(f, "name")), name) &&
           !strcmp(json_string_value(json_object_get(f, "arguments")), args);
}

TEST(replies)
{
    char *said = NULL;
    json_t *c = parse("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", &said);
    CHECK(json_array_size(c) == 1 && call_is(c, 0, "get_weather", "{\"city\":\"Paris\"}") && !said);
    json_decref(c);
    c = parse("Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
              "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"x\": [1, 2]}}\n</tool_call>", &said);
    CHECK(json_array_size(c) == 2 && call_is(c, 0, "a", "{}") && call_is(c, 1, "b", "{\"x\":[1,2]}") && said &&
          !strcmp(said, "Let me check both."));
    json_decref(c);
    free(said);
    c = parse("<tool_call>\n{\"name\": \"a\", \"arguments\": {\"k\": 1}}", &said); /* the end tag never came */
    CHECK(json_array_size(c) == 1 && call_is(c, 0, "a", "{\"k\":1}"));
    json_decref(c);
    c = parse("  {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}\n", &said); /* Llama 3.1 */
    CHECK(json_array_size(c) == 1 && call_is(c, 0, "get_weather", "{\"city\":\"Oslo\"}") && !said);
    json_decref(c);
    static const char *const plain[] = {
        "The weather is fine.", "", "{\"name\": \"a\"}", "{\"name\": 3, \"arguments\": {}}", "{\"a\": 1}",
        "<tool_call>\n{not json}\n</tool_call>", "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call> and more",
        "{\"name\": \"a\", \"arguments\": \"{}\"}",
    };
    for (size_t i = 0; i < SF_ARRAY_LEN(plain); i++) {
        said = NULL;
        c = parse(plain[i], &said);
        CHECK_MSG(!c && !said, "read as calls: %s", plain[i]);
        json_decref(c);
    }
}

static int forced(const char *tools, int choice, const char *name, int llama3, const char *doc)
{
    sf_gw_params p;
    memset(&p, 0, sizeof p);
    p.tools = strdup(tools);
    p.tool_choice = choice;
    p.tool_name = name;
    sf_gw_err e = { 0 };
    int ok = sf_gw_force_call(&p, llama3, &e) == 0 && p.sampling.json && p.sampling.schema;
    sf_jschema *sc = NULL;
    if (ok) ok = sf_jschema_compile(p.sampling.schema, p.sampling.schema_len, &sc, NULL) == SF_OK;
    if (ok) {
        sf_json j;
        sf_json_init(&j, sc);
        ok = sf_json_feed(&j, doc, strlen(doc)) && sf_json_done(&j);
    }
    sf_jschema_free(sc);
    free(p.tools);
    free(p.schema);
    return ok;
}

TEST(forced_schema)
{
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"type\": \"object\", "
                        "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}},"
                        "{\"type\": \"function\", \"function\": {\"name\": \"add\", \"parameters\": {\"type\": \"object\", "
                        "\"properties\": {\"a\": {\"type\": \"number\", \"minimum\": 0}}}}}]";
    /* named: that tool's parameters hold */
    CHECK(forced(tools, SF_GW_TOOLS_NAMED, "w", 0, "{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}"));
    CHECK(!forced(tools, SF_GW_TOOLS_NAMED, "w", 0, "{\"name\": \"w\", \"arguments\": {}}"));
    CHECK(!forced(tools, SF_GW_TOOLS_NAMED, "w", 0, "{\"name\": \"add\", \"arguments\": {\"city\": \"Oslo\"}}"));
    CHECK(forced(tools, SF_GW_TOOLS_NAMED, "w", 1, "{\"name\": \"w\", \"parameters\": {\"city\": \"Oslo\"}}"));
    CHECK(!forced(tools, SF_GW_TOOLS_NAMED, "w", 1, "{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}"));
    /* a schema outside the subset ("minimum"): any object */
    CHECK(forced(tools, SF_GW_TOOLS_NAMED, "add", 0, "{\"name\": \"add\", \"arguments\": {\"b\": [true]}}"));
    /* required: any of the names, any object */
    CHECK(forced(tools, SF_GW_TOOLS_REQUIRED, NULL, 0, "{\"name\": \"add\", \"arguments\": {\"a\": -1}}"));
    CHECK(forced(tools, SF_GW_TOOLS_REQUIRED, NULL, 0, "{\"name\": \"w\", \"arguments\": {}}"));
    CHECK(!forced(tools, SF_GW_TOOLS_REQUIRED, NULL, 0, "{\"name\": \"x\", \"arguments\": {}}"));
    CHECK(!forced(tools, SF_GW_TOOLS_REQUIRED, NULL, 0, "{\"arguments\": {}, \"name\": \"w\"}"));
}

int main(void)
{
    RUN(replies);
    RUN(forced_schema);
    return test_summary();
}
