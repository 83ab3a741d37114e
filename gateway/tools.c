/* tools.c — chat tools: the call a forced tool_choice constrains the output to (a JSON Schema
 * for engine/json_mask.c), and the calls read back out of a model's reply. */
#include "params.h"

#include <stdlib.h>
#include <string.h>

#include "../engine/json_mask.h"

int sf_gw_force_call(sf_gw_params *p, int llama3, sf_gw_err *e)
{
    if (p->tool_choice < SF_GW_TOOLS_REQUIRED) return 0;
    const char *key = llama3 ? "parameters" : "arguments"; /* what the format's calls name them */
    json_t *tools = json_loads(p->tools, 0, NULL), *names = json_array(), *args = NULL, *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(f, "name"));
        if (p->tool_choice == SF_GW_TOOLS_NAMED && strcmp(nm, p->tool_name)) continue;
        json_array_append_new(names, json_string(nm));
        args = json_object_get(f, "parameters");
    }
    /* one tool: its parameters' schema where the subset holds it; else any object */
    for (int any = json_array_size(names) != 1 || !json_is_object(args); any < 2; any++) {
        json_t *a = any ? json_pack("{s:s}", "type", "object") : json_incref(args);
        json_t *sc = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type", "object", "properties", "name", "enum",
                               names, key, a, "required", "name", key, "additionalProperties", 0);
        free(p->schema);
        p->schema = sc ? json_dumps(sc, JSON_COMPACT) : NULL;
        json_decref(sc);
        sf_jschema *c = NULL;
        if (p->schema && sf_jschema_compile(p->schema, strlen(p->schema), &c, NULL) == SF_OK) {
            sf_jschema_free(c);
            break;
        }
    }
    json_decref(names);
    json_decref(tools);
    if (!p->schema) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->sampling.json = 1;
    p->sampling.schema = p->schema;
    p->sampling.schema_len = strlen(p->schema);
    return 0;
}

/* {"name": "...", "arguments" | "parameters": {...}} as an OpenAI tool call, or NULL */
static json_t *one_call(json_t *o, const char *id, int k)
{
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!args) args = json_object_get(o, "parameters");
    if (!json_is_object(o) || !json_is_string(name) || !json_is_object(args)) return NULL;
    char *a = json_dumps(args, JSON_COMPACT), cid[96];
    snprintf(cid, sizeof cid, "call_%s_%d", id, k);
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", cid, "type", "function", "function", "name", name,
                              "arguments", a)
                  : NULL;
    free(a);
    return c;
}

static void trim(const char **s, size_t *n)
{
    while (*n && strchr(" \t\r\n", **s)) (*s)++, (*n)--;
    while (*n && strchr(" \t\r\n", (*s)[*n - 1])) (*n)--;
}

json_t *sf_gw_parse_tool_calls(const char *text, size_t len, const char *id, char **content)
{
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    *content = NULL;
    const char *s = text;
    size_t n = len;
    trim(&s, &n);
    json_t *calls = json_array();
    const char *first = memmem(s, n, open, sizeof open - 1);
    if (first) { /* Qwen / Hermes: <tool_call>{...}</tool_call>, as many as there are, text before */
        const char *p = first, *end = s + n;
        while (p && p < end) {
            const char *b = p + sizeof open - 1, *q = memmem(b, (size_t)(end - b), close, sizeof close - 1);
            const char *stop = q ? q : end;
            json_t *o = json_loadb(b, (size_t)(stop - b), 0, NULL), *c = one_call(o, id, (int)json_array_size(calls));
            json_decref(o);
            if (!c) {
                json_decref(calls);
                return NULL;
            }
            json_array_append_new(calls, c);
            if (!q) break;
            const char *next = q + sizeof close - 1;
            p = memmem(next, (size_t)(end - next), open, sizeof open - 1);
            size_t gap = p ? (size_t)(p - next) : (size_t)(end - next);
            const char *g = next;
            trim(&g, &gap);
            if (gap) { /* text between or after the calls: not a reply of calls */
                json_decref(calls);
                return NULL;
            }
        }
        size_t before = (size_t)(first - s);
        const char *b = s;
        trim(&b, &before);
        if (before && (*content = malloc(before + 1))) {
            memcpy(*content, b, before);
            (*content)[before] = 0;
        }
        return calls;
    }
    /* Llama 3.1, and any forced call: the reply is the one JSON object */
    json_t *o = n && *s == '{' ? json_loadb(s, n, 0, NULL) : NULL, *c = one_call(o, id, 0);
    json_decref(o);
    if (!c) {
        json_decref(calls);
        return NULL;
    }
    json_array_append_new(calls, c);
    return calls;
}
