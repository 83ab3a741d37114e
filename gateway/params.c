/* params.c — OpenAI request bodies -> sf_gw_params, with OpenAI-shaped rejections. */
#include "params.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/gbnf.h"
#include "../engine/json_mask.h"
#include "intent.h"

int sf_gw_fail(sf_gw_err *e, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return SF_EINVAL;
}

#define BAD(param, ...) sf_gw_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

static int get_number(json_t *o, const char *k, double lo, double hi, int lo_open, double *out, sf_gw_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_number(v)) return BAD(k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
        return BAD(k, "'%s' is %g; it must be %s %g and <= %g", k, d, lo_open ? ">" : ">=", lo, hi);
    *out = d;
    return 0;
}

static int get_int(json_t *o, const char *k, long long lo, long long hi, long long *out, sf_gw_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_integer(v)) return BAD(k, "'%s' must be an integer", k);
    long long x = json_integer_value(v);
    if (x < lo || x > hi) return BAD(k, "'%s' is %lld; it must be between %lld and %lld", k, x, lo, hi);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *k, int *out, sf_gw_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return BAD(k, "'%s' must be true or false", k);
    *out = json_is_true(v);
    return 0;
}

static int parse_stop(json_t *o, sf_sampling *s, sf_gw_err *e)
{
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 0;
    json_t *one[1] = { v };
    size_t n = 1;
    if (json_is_array(v)) n = json_array_size(v);
    else if (!json_is_string(v)) return BAD("stop", "'stop' must be a string or an array of strings");
    if (n > SF_MAX_STOP) return BAD("stop", "'stop' holds %zu strings; at most %d are allowed", n, SF_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(x)) return BAD("stop", "'stop[%zu]' must be a string", i);
        size_t len = json_string_length(x);
        if (len == 0 || len > 256) return BAD("stop", "'stop[%zu]' must be 1 to 256 bytes long", i);
        if (strlen(json_string_value(x)) != len) return BAD("stop", "'stop[%zu]' contains a NUL character", i);
        s->stop[s->n_stop++] = (char *)json_string_value(x);
    }
    return 0;
}

/* stop_token_ids (vLLM): token ids that end the output, shown unless special; the engine checks
 * them against the model's vocabulary */
static int parse_stop_token_ids(json_t *o, sf_sampling *s, sf_gw_err *e)
{
    json_t *v = json_object_get(o, "stop_token_ids"), *x;
    size_t i;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_array(v)) return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids");
    if (json_array_size(v) > SF_MAX_STOP)
        return BAD("stop_token_ids", "'stop_token_ids' holds %zu ids; at most %d are allowed", json_array_size(v),
                   SF_MAX_STOP);
    json_array_foreach(v, i, x) {
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return BAD("stop_token_ids", "'stop_token_ids[%zu]' must be a token id (an integer >= 0)", i);
        s->stop_ids[s->n_stop_ids++] = (int32_t)json_integer_value(x);
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...} (OpenAI); the engine checks the ids against
 * the model's vocabulary and that no id comes twice ("5" and "05") */
static int parse_logit_bias(json_t *o, sf_gw_params *p, sf_gw_err *e)
{
    json_t *v = json_object_get(o, "logit_bias"), *x;
    const char *k;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return BAD("logit_bias", "'logit_bias' must be an object of token ids to biases");
    size_t n = json_object_size(v);
    if (n == 0) return 0;
    if (n > SF_MAX_LOGIT_BIAS)
        return BAD("logit_bias", "'logit_bias' holds %zu entries; at most %d are allowed", n, SF_MAX_LOGIT_BIAS);
    if (!(p->bias = malloc(n * sizeof *p->bias)))
        return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    int i = 0;
    json_object_foreach(v, k, x) {
        char *end = NULL;
        errno = 0;
        long id = *k >= '0' && *k <= '9' ? strtol(k, &end, 10) : -1;
        if (id < 0 || *end || errno || id > INT32_MAX)
            return BAD("logit_bias", "'logit_bias' key '%.32s' is not a token id (a decimal integer, as \"50256\")", k);
        if (!json_is_number(x) || !(json_number_value(x) >= -100 && json_number_value(x) <= 100))
            return BAD("logit_bias", "'logit_bias[\"%ld\"]' must be a number from -100 to 100", id);
        p->bias[i++] = (sf_logit_bias){ (int32_t)id, (float)json_number_value(x) };
    }
    p->sampling.n_bias = i;
    p->sampling.bias = p->bias;
    return 0;
}

/* One prompt: a string or an array of token ids (`where` names it in messages). */
static int parse_one_prompt(json_t *v, const char *where, sf_gw_prompt *out, sf_gw_err *e)
{
    if (json_is_string(v)) {
        out->text = json_string_value(v);
        out->len = json_string_length(v);
        return 0;
    }
    if (!json_is_array(v))
        return BAD("prompt", "'%s' must be a string or an array of token ids", where);
    size_t n = json_array_size(v);
    if (n == 0) return BAD("prompt", "'%s' is empty", where);
    if (n > 10000000) return BAD("prompt", "'%s' holds too many token ids", where);
    if (!(out->ids = malloc(n * sizeof *out->ids))) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > INT32_MAX)
            return BAD("prompt", "'%s[%zu]' must be a non-negative token id", where, i);
        out->ids[i] = (int32_t)json_integer_value(x);
    }
    out->n_ids = (int)n;
    return 0;
}

/* prompt: "text", [ids], or a batch of them (["a", "b"], [[1, 2], [3]]), OpenAI's forms */
static int parse_prompt(json_t *o, sf_gw_params *p, sf_gw_err *e)
{
    json_t *v = json_object_get(o, "prompt");
    if (!v || json_is_null(v)) return BAD("prompt", "'prompt' is required (a string, an array of token ids, or an array of those)");
    size_t n = 1;
    int batch = json_is_array(v) && json_array_size(v) > 0 &&
                (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0)));
    if (batch) n = json_array_size(v);
    if (n > SF_GW_MAX_PROMPTS)
        return BAD("prompt", "'prompt' holds %zu prompts; at most %d in one request", n, SF_GW_MAX_PROMPTS);
    if (!(p->prompts = calloc(n, sizeof *p->prompts))) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->n_prompts = (int)n;
    for (size_t i = 0; i < n; i++) {
        char where[32];
        if (batch) snprintf(where, sizeof where, "prompt[%zu]", i);
        else snprintf(where, sizeof where, "prompt");
        int rc = parse_one_prompt(batch ? json_array_get(v, i) : v, where, &p->prompts[i], e);
        if (rc) return rc;
    }
    return 0;
}

/* content: a string, null (assistant turns), or [{"type":"text","text":"..."}, ...]. */
static int parse_content(json_t *c, size_t i, sf_gw_params *p, sf_gw_err *e)
{
    if (json_is_string(c)) {
        if (strlen(json_string_value(c)) != json_string_length(c))
            return BAD("messages", "'messages[%zu].content' contains a NUL character", i);
        p->msgs[i].content = json_string_value(c);
        return 0;
    }
    if (!c || json_is_null(c)) {
        p->msgs[i].content = "";
        return 0;
    }
    if (!json_is_array(c))
        return BAD("messages", "'messages[%zu].content' must be a string or an array of text parts", i);
    size_t total = 1, k;
    json_t *part;
    json_array_foreach(c, k, part) {
        json_t *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text"))
            return BAD("messages", "'messages[%zu].content[%zu]' must be {\"type\": \"text\", \"text\": ...}; "
                                   "this server reads text only", i, k);
        if (!json_is_string(text) || strlen(json_string_value(text)) != json_string_length(text))
            return BAD("messages", "'messages[%zu].content[%zu].text' must be a string", i, k);
        total += json_string_length(text);
    }
    char *buf = malloc(total);
    if (!buf) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t off = 0;
    json_array_foreach(c, k, part) {
        json_t *text = json_object_get(part, "text");
        memcpy(buf + off, json_string_value(text), json_string_length(text));
        off += json_string_length(text);
    }
    buf[off] = 0;
    p->msg_text[i] = buf;
    p->msgs[i].content = buf;
    return 0;
}

static int parse_messages(json_t *o, sf_gw_params *p, sf_gw_err *e)
{
    static const char *roles[] = { "system", "user", "assistant", "tool", "developer" };
    json_t *v = json_object_get(o, "messages");
    if (!json_is_array(v) || json_array_size(v) == 0)
        return BAD("messages", "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    size_t n = json_array_size(v);
    if (n > 100000) return BAD("messages", "'messages' holds too many messages");
    p->msgs = calloc(n, sizeof *p->msgs);
    p->msg_text = calloc(n, sizeof *p->msg_text);
    p->msg_calls = calloc(n, sizeof *p->msg_calls);
    if (!p->msgs || !p->msg_text || !p->msg_calls) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->n_msgs = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) return BAD("messages", "'messages[%zu]' must be an object", i);
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) return BAD("messages", "'messages[%zu].role' must be a string", i);
        size_t r = 0;
        while (r < SF_ARRAY_LEN(roles) && strcmp(roles[r], json_string_value(role))) r++;
        if (r == SF_ARRAY_LEN(roles))
            return BAD("messages", "'messages[%zu].role' is '%.32s'; use system, user, assistant, tool or "
                                   "developer", i, json_string_value(role));
        p->msgs[i].role = r == 4 ? "system" : json_string_value(role);
        int rc = parse_content(json_object_get(m, "content"), i, p, e);
        if (rc) return rc;
        json_t *calls = json_object_get(m, "tool_calls");
        if (calls && !json_is_null(calls) && !(json_is_array(calls) && json_array_size(calls) == 0)) {
            if (r != 2 || !json_is_array(calls))
                return BAD("messages", "'messages[%zu].tool_calls' must be an array, in an assistant message", i);
            size_t k;
            json_t *c;
            json_array_foreach(calls, k, c) {
                json_t *f = json_object_get(c, "function");
                if (!json_is_string(json_object_get(f, "name")) || !json_is_string(json_object_get(f, "arguments")))
                    return BAD("messages", "'messages[%zu].tool_calls[%zu]' must be {\"type\": \"function\", "
                                           "\"function\": {\"name\": ..., \"arguments\": \"...\"}}", i, k);
            }
            if (!(p->msg_calls[i] = json_dumps(calls, 0))) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            p->msgs[i].tool_calls = p->msg_calls[i];
        }
    }
    return 0;
}

static int reject_unsupported(json_t *o, sf_gw_err *e)
{
    /* vLLM's constraints this server does not have: refused, never dropped (the output would not hold to them) */
    static const char *keys[] = { "functions", "function_call", "suffix", "allowed_token_ids", "bad_words",
                                  "logits_processors" };
    for (size_t i = 0; i < SF_ARRAY_LEN(keys); i++) {
        json_t *v = json_object_get(o, keys[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0) &&
            !(json_is_object(v) && json_object_size(v) == 0))
            return BAD(keys[i], "'%s' is not supported by this server", keys[i]);
    }
    long long best_of = 1;
    if (get_int(o, "best_of", 1, 1, &best_of, e)) return BAD("best_of", "'best_of' other than 1 is not supported");
    return 0;
}

/* the schema sc (given as `param`) compiled once to check it, kept as text for the engine */
static int take_schema(json_t *sc, const char *param, sf_gw_params *p, sf_gw_err *e)
{
    if (!(p->schema = json_dumps(sc, JSON_COMPACT))) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    sf_jschema *c = NULL;
    sf_error ce = { 0 };
    if (sf_jschema_compile(p->schema, strlen(p->schema), &c, &ce)) return BAD(param, "'%s': %s", param, ce.msg);
    sf_jschema_free(c);
    p->sampling.json = 1;
    p->sampling.schema = p->schema;
    p->sampling.schema_len = strlen(p->schema);
    return 0;
}

/* what holds the output to a form, as the request named it, and what it ends with */
static const char *form_name(const sf_gw_params *p)
{
    static __thread char b[64];
    if (!p->form) return "a JSON 'response_format'";
    snprintf(b, sizeof b, "'%s'", p->form);
    return b;
}
static const char *form_end(const sf_sampling *s) { return s->choice ? "choice" : s->regex ? "match" : "object"; }

/* a pattern (guided_regex) or a grammar written out as one (guided_grammar) held as the output's form */
static int take_pattern(char *rx, const char *name, const char *what, sf_gw_params *p, sf_gw_err *e)
{
    p->schema = rx;
    sf_jschema *c = NULL;
    sf_error ce = { 0 };
    if (sf_jschema_regex(p->schema, strlen(p->schema), &c, &ce)) return BAD(name, "'%s': %s%s", name, ce.msg, what);
    sf_jschema_free(c);
    p->sampling.json = p->sampling.regex = 1;
    p->sampling.schema = p->schema;
    p->sampling.schema_len = strlen(p->schema);
    p->form = name;
    return 0;
}

/* response_format: text, json_object (any object; with llama.cpp's "schema" beside it, that
 * schema) or json_schema (the subset engine/json_mask.h lists; a schema using more is refused,
 * not weakened); vLLM's guided_json (a schema, or its JSON text) is json_schema by another name,
 * its guided_choice (a list of strings the output is exactly one of) a choice, its guided_regex
 * (a pattern the whole output matches, engine/regex.h) a pattern and its guided_grammar (a GBNF
 * grammar without recursion, engine/gbnf.h; llama.cpp's `grammar`) that grammar written out as a
 * pattern; vLLM's newer structured_outputs {"json"|"choice"|"regex"|"grammar": ...} are the same */
static int parse_response_format(json_t *o, sf_gw_params *p, sf_gw_err *e)
{
    sf_sampling *s = &p->sampling;
    json_t *rf = json_object_get(o, "response_format"), *gj = json_object_get(o, "guided_json");
    json_t *gc = json_object_get(o, "guided_choice"), *gr = json_object_get(o, "guided_regex");
    json_t *gg = json_object_get(o, "guided_grammar"), *so = json_object_get(o, "structured_outputs");
    const char *gj_name = "guided_json", *gc_name = "guided_choice", *gr_name = "guided_regex", *gg_name = "guided_grammar";
    json_t *lg = json_object_get(o, "grammar"); /* llama.cpp's server; "" there means none */
    if (lg && !json_is_null(lg) && !(json_is_string(lg) && !json_string_length(lg))) {
        if (gg && !json_is_null(gg)) return BAD("grammar", "give 'grammar' or 'guided_grammar', not both");
        gg = lg, gg_name = "grammar";
    }
    if (so && !json_is_null(so)) {
        const char *k;
        json_t *v;
        if (!json_is_object(so)) return BAD("structured_outputs", "'structured_outputs' must be an object");
        json_object_foreach(so, k, v) if (!json_is_null(v) && strcmp(k, "json") && strcmp(k, "choice") && strcmp(k, "regex") &&
                                          strcmp(k, "grammar"))
            return BAD("structured_outputs", "'structured_outputs.%.32s' is not supported (supported: json, choice, regex, "
                                             "grammar)", k);
        if ((gj && !json_is_null(gj)) || (gc && !json_is_null(gc)) || (gr && !json_is_null(gr)) || (gg && !json_is_null(gg)))
            return BAD("structured_outputs", "give 'structured_outputs' or 'guided_json' / 'guided_choice' / "
                                             "'guided_regex' / 'guided_grammar', not both");
        gj = json_object_get(so, "json"), gc = json_object_get(so, "choice"), gr = json_object_get(so, "regex");
        gg = json_object_get(so, "grammar");
        gj_name = "structured_outputs.json", gc_name = "structured_outputs.choice", gr_name = "structured_outputs.regex";
        gg_name = "structured_outputs.grammar";
    }
    int has_gj = gj && !json_is_null(gj), has_gc = gc && !json_is_null(gc), has_gr = gr && !json_is_null(gr);
    int has_gg = gg && !json_is_null(gg);
    if (has_gj + has_gc + has_gr + has_gg + (rf && !json_is_null(rf)) > 1)
        return BAD(has_gg ? gg_name : has_gr ? gr_name : has_gc ? gc_name : gj_name,
                   "give one of '%s', '%s', '%s', '%s' and 'response_format'", gj_name, gc_name, gr_name, gg_name);
    if (has_gc) {
        if (!(p->schema = json_dumps(gc, JSON_COMPACT | JSON_ENCODE_ANY)))
            return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        sf_jschema *c = NULL;
        sf_error ce = { 0 };
        if (sf_jschema_choice(p->schema, strlen(p->schema), &c, &ce)) return BAD(gc_name, "'%s': %s", gc_name, ce.msg);
        sf_jschema_free(c);
        s->json = s->choice = 1;
        s->schema = p->schema;
        s->schema_len = strlen(p->schema);
        p->form = gc_name;
    }
    if (has_gr) {
        if (!json_is_string(gr) || strlen(json_string_value(gr)) != json_string_length(gr))
            return BAD(gr_name, "'%s' must be a string (a regular expression) without NUL", gr_name);
        char *rx = strdup(json_string_value(gr));
        if (!rx) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        if (take_pattern(rx, gr_name, "", p, e)) return -1;
    }
    if (has_gg) {
        if (!json_is_string(gg) || strlen(json_string_value(gg)) != json_string_length(gg))
            return BAD(gg_name, "'%s' must be a string (a GBNF grammar) without NUL", gg_name);
        char *rx = NULL;
        sf_error ge = { 0 };
        if (sf_gbnf_to_regex(json_string_value(gg), json_string_length(gg), &rx, &ge))
            return ge.code == SF_ENOMEM ? sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory")
                                        : BAD(gg_name, "'%s': %s", gg_name, ge.msg);
        if (take_pattern(rx, gg_name, " (the grammar written out as one pattern)", p, e)) return -1;
    }
    if (has_gj) {
        json_t *sc = json_is_string(gj) ? json_loads(json_string_value(gj), 0, NULL) : json_incref(gj);
        int rc = json_is_object(sc) ? take_schema(sc, gj_name, p, e)
                                    : BAD(gj_name, "'%s' must be a JSON Schema (an object, or its text)", gj_name);
        json_decref(sc);
        if (rc) return rc;
    }
    if (rf && !json_is_null(rf)) {
        json_t *t = json_object_get(rf, "type");
        const char *ty = json_is_string(t) ? json_string_value(t) : NULL;
        if (!json_is_object(rf) || !ty || (strcmp(ty, "text") && strcmp(ty, "json_object") && strcmp(ty, "json_schema")))
            return BAD("response_format", "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                                          "or {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {...}}}");
        s->json = strcmp(ty, "text") != 0;
        json_t *sc = !strcmp(ty, "json_schema") ? json_object_get(json_object_get(rf, "json_schema"), "schema")
                                                : json_object_get(rf, "schema");
        if (!strcmp(ty, "json_schema") && !json_is_object(sc))
            return BAD("response_format", "'response_format.json_schema.schema' must be an object (a JSON Schema)");
        if (s->json && sc && !json_is_null(sc)) {
            if (!json_is_object(sc)) return BAD("response_format", "'response_format.schema' must be an object (a JSON Schema)");
            int rc = take_schema(sc, "response_format", p, e);
            if (rc) return rc;
        }
    }
    if (s->json && s->ignore_eos)
        return BAD("ignore_eos", "'ignore_eos' cannot be used with %s (the output ends when its %s does)", form_name(p),
                   form_end(s));
    if (s->json && s->min_tokens > 0)
        return BAD("min_tokens", "'min_tokens' cannot be used with %s (the output ends when its %s does)", form_name(p),
                   form_end(s));
    return 0;
}

/* tools: [{"type": "function", "function": {"name", "description"?, "parameters"?}}, ...] and
 * tool_choice ("none", "auto", "required" or {"type": "function", "function": {"name"}}) */
static int parse_tools(json_t *o, sf_gw_params *p, sf_gw_err *e)
{
    json_t *tools = json_object_get(o, "tools"), *choice = json_object_get(o, "tool_choice");
    int have = tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0);
    if (choice && !json_is_null(choice) && !have) {
        if (json_is_string(choice) && !strcmp(json_string_value(choice), "none")) return 0;
        return BAD("tool_choice", "'tool_choice' needs 'tools'");
    }
    if (!have) return 0;
    if (p->kind != SF_GW_CHAT) return BAD("tools", "'tools' are for /v1/chat/completions");
    if (!json_is_array(tools) || json_array_size(tools) > SF_GW_MAX_TOOLS)
        return BAD("tools", "'tools' must be an array of at most %d functions", SF_GW_MAX_TOOLS);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function"), *name = json_object_get(f, "name"), *par = json_object_get(f, "parameters");
        json_t *ty = json_object_get(t, "type");
        if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(f))
            return BAD("tools", "'tools[%zu]' must be {\"type\": \"function\", \"function\": {...}}", i);
        const char *nm = json_string_value(name);
        size_t nl = nm ? strlen(nm) : 0;
        int ok = nl > 0 && nl <= 64;
        for (size_t k = 0; ok && k < nl; k++)
            ok = isalnum((unsigned char)nm[k]) || nm[k] == '_' || nm[k] == '-' || nm[k] == '.';
        if (!ok) return BAD("tools", "'tools[%zu].function.name' must be 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.'", i);
        if (par && !json_is_null(par) && !json_is_object(par))
            return BAD("tools", "'tools[%zu].function.parameters' must be an object (a JSON Schema)", i);
    }
    if (!(p->tools = json_dumps(tools, 0))) return sf_gw_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    p->tool_choice = SF_GW_TOOLS_AUTO;
    if (!choice || json_is_null(choice)) return 0;
    const char *cs = json_string_value(choice);
    if (cs && !strcmp(cs, "none")) p->tool_choice = SF_GW_TOOLS_NONE;
    else if (cs && !strcmp(cs, "auto")) p->tool_choice = SF_GW_TOOLS_AUTO;
    else if (cs && !strcmp(cs, "required")) p->tool_choice = SF_GW_TOOLS_REQUIRED;
    else {
        const char *nm = json_string_value(json_object_get(json_object_get(choice, "function"), "name"));
        json_array_foreach(tools, i, t) if (nm && !strcmp(nm, json_string_value(json_object_get(json_object_get(t, "function"), "name")))) break;
        if (!nm || i == json_array_size(tools))
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                      "\"function\": {\"name\": ...}} naming one of the tools");
        p->tool_choice = SF_GW_TOOLS_NAMED;
        p->tool_name = nm;
    }
    if (p->tool_choice >= SF_GW_TOOLS_REQUIRED && p->sampling.json)
        return BAD("tool_choice", "a 'tool_choice' that forces a call cannot be combined with %s", form_name(p));
    if (p->tool_choice >= SF_GW_TOOLS_REQUIRED && (p->sampling.ignore_eos || p->sampling.min_tokens > 0))
        return BAD("tool_choice", "a 'tool_choice' that forces a call cannot be combined with 'ignore_eos' or "
                                  "'min_tokens' (the output ends when its call does)");
    return 0;
}

int sf_gw_params_parse(int kind, const char *body, size_t len, sf_gw_params *p, sf_gw_err *e)
{
    json_error_t je;
    int rc;
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->n = 1;
    p->add_generation_prompt = 1;
    /* OpenAI defaults; the engine's own defaults are not assumed */
    p->sampling.temperature = 1.0f;
    p->sampling.top_p = 1.0f;
    p->sampling.repetition_penalty = 1.0f;
    if (len == 0) return BAD(NULL, "the request body is empty; send a JSON object");
    p->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!p->root) return BAD(NULL, "the body is not valid JSON (line %d, column %d): %s", je.line, je.column, je.text);
    json_t *o = p->root;
    if (!json_is_object(o)) {
        rc = BAD(NULL, "the body must be a JSON object");
        goto fail;
    }
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) { rc = BAD("model", "'model' must be a string"); goto fail; }
        p->model = json_string_value(model);
    }
    if ((rc = reject_unsupported(o, e))) goto fail;
    if ((rc = kind == SF_GW_CHAT ? parse_messages(o, p, e) : parse_prompt(o, p, e))) goto fail;

    sf_sampling *s = &p->sampling;
    double d;
    long long x;
    d = s->temperature;
    if ((rc = get_number(o, "temperature", 0, 2, 0, &d, e))) goto fail;
    s->temperature = (float)d;
    d = s->top_p;
    if ((rc = get_number(o, "top_p", 0, 1, 1, &d, e))) goto fail;
    s->top_p = (float)d;
    x = s->top_k;
    if ((rc = get_int(o, "top_k", -1, 1000000, &x, e))) goto fail;
    s->top_k = x < 0 ? 0 : (int)x;
    d = s->min_p;
    if ((rc = get_number(o, "min_p", 0, 1, 0, &d, e))) goto fail;
    s->min_p = (float)d;
    d = s->presence_penalty;
    if ((rc = get_number(o, "presence_penalty", -2, 2, 0, &d, e))) goto fail;
    s->presence_penalty = (float)d;
    d = s->frequency_penalty;
    if ((rc = get_number(o, "frequency_penalty", -2, 2, 0, &d, e))) goto fail;
    s->frequency_penalty = (float)d;
    d = s->repetition_penalty;
    if ((rc = get_number(o, "repetition_penalty", 0, 10, 1, &d, e))) goto fail;
    s->repetition_penalty = (float)d;
    json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) { rc = BAD("seed", "'seed' must be an integer"); goto fail; }
        s->seed = (uint64_t)json_integer_value(seed);
        s->has_seed = 1;
    }
    if ((rc = get_bool(o, "echo", &p->echo, e))) goto fail;
    if (p->echo && kind == SF_GW_CHAT) {
        rc = BAD("echo", "'echo' is for completions; chat completions do not echo their messages");
        goto fail;
    }
    long long mt = -1, mct = -1;
    if ((rc = get_int(o, "max_tokens", 0, SF_GW_MAX_TOKENS_LIMIT, &mt, e))) goto fail;
    if ((rc = get_int(o, "max_completion_tokens", 0, SF_GW_MAX_TOKENS_LIMIT, &mct, e))) goto fail;
    if (mct >= 0) mt = mct;
    if (mt == 0 && !p->echo) {
        rc = BAD(mct == 0 ? "max_completion_tokens" : "max_tokens",
                 "'%s' must be at least 1 (0 only with 'echo': true, which returns the prompt alone)",
                 mct == 0 ? "max_completion_tokens" : "max_tokens");
        goto fail;
    }
    if (mt >= 0) {
        s->max_tokens = (int)mt;
        s->prompt_only = mt == 0;
        p->max_tokens_given = 1;
    }
    x = 0;
    if ((rc = get_int(o, "min_tokens", 0, SF_GW_MAX_TOKENS_LIMIT, &x, e))) goto fail;
    if (mt >= 0 && x > mt) {
        rc = BAD("min_tokens", "'min_tokens' (%lld) is more than 'max_tokens' (%lld)", x, mt);
        goto fail;
    }
    s->min_tokens = (int)x;
    if ((rc = get_bool(o, "ignore_eos", &s->ignore_eos, e))) goto fail;
    if ((rc = get_bool(o, "include_stop_str_in_output", &s->include_stop_str, e))) goto fail;
    int skip_special = 1;
    if ((rc = get_bool(o, "skip_special_tokens", &skip_special, e))) goto fail;
    s->keep_special = !skip_special;
    if ((rc = parse_stop(o, s, e))) goto fail;
    if ((rc = parse_logit_bias(o, p, e))) goto fail;
    if ((rc = parse_stop_token_ids(o, s, e))) goto fail;
    if ((rc = parse_response_format(o, p, e))) goto fail;
    if ((rc = parse_tools(o, p, e))) goto fail;
    x = 1;
    if ((rc = get_int(o, "n", 1, SF_GW_MAX_N, &x, e))) goto fail;
    p->n = (int)x;
    x = 0;
    if ((rc = get_int(o, "truncate_prompt_tokens", -1, SF_GW_MAX_TOKENS_LIMIT, &x, e))) goto fail;
    if (x == 0 && json_is_integer(json_object_get(o, "truncate_prompt_tokens"))) {
        rc = BAD("truncate_prompt_tokens", "'truncate_prompt_tokens' must be at least 1, or -1 for the context's length");
        goto fail;
    }
    p->truncate = (int)x;
    if (p->n_prompts * p->n > SF_GW_MAX_CHOICES) {
        rc = BAD("n", "%d prompts x n = %d choices; at most %d in one request", p->n_prompts, p->n_prompts * p->n,
                 SF_GW_MAX_CHOICES);
        goto fail;
    }
    if ((rc = get_bool(o, "stream", &p->stream, e))) goto fail;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) { rc = BAD("stream_options", "'stream_options' must be an object"); goto fail; }
        if (!p->stream) { rc = BAD("stream_options", "'stream_options' is only allowed when 'stream' is true"); goto fail; }
        if ((rc = get_bool(so, "include_usage", &p->include_usage, e))) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            goto fail;
        }
    }
    if (kind == SF_GW_CHAT) {
        x = 0;
        if ((rc = get_bool(o, "logprobs", &p->logprobs, e))) goto fail;
        if ((rc = get_int(o, "top_logprobs", 0, SF_MAX_LOGPROBS, &x, e))) goto fail;
        if (x > 0 && !p->logprobs) { rc = BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true"); goto fail; }
        p->top_logprobs = (int)x;
        if ((rc = get_bool(o, "add_generation_prompt", &p->add_generation_prompt, e))) goto fail;
        if ((rc = get_bool(o, "continue_final_message", &p->continue_final, e))) goto fail;
        if (p->continue_final && p->add_generation_prompt) {
            rc = BAD("continue_final_message", "'continue_final_message' needs 'add_generation_prompt': false (the final "
                                               "message goes on; no new turn is started)");
            goto fail;
        }
    } else {
        x = -1;
        if ((rc = get_int(o, "logprobs", 0, SF_MAX_LOGPROBS, &x, e))) goto fail;
        if (x >= 0) p->logprobs = 1, p->top_logprobs = (int)x;
    }
    if (p->logprobs) s->logprobs = p->top_logprobs > 0 ? p->top_logprobs : -1;
    /* the prompt's own logprobs: OpenAI's echo with logprobs, vLLM's prompt_logprobs (0: each
     * prompt token's alone); the engine scores the most either asks for */
    if ((rc = get_bool(o, "return_tokens_as_token_ids", &p->tokens_as_ids, e))) goto fail;
    x = -1;
    if ((rc = get_int(o, "prompt_logprobs", 0, SF_MAX_LOGPROBS, &x, e))) goto fail;
    p->prompt_logprobs = (int)x;
    int want = SF_MAX(p->echo && p->logprobs ? p->top_logprobs : -1, p->prompt_logprobs);
    if (want >= 0) s->prompt_logprobs = want > 0 ? want : -1;
    json_t *salt = json_object_get(o, "cache_salt"); /* vLLM's: prefix-cache sharing only under the same salt */
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt) || json_string_length(salt) < 1 || json_string_length(salt) > 256 ||
            strlen(json_string_value(salt)) != json_string_length(salt)) {
            rc = BAD("cache_salt", "'cache_salt' must be a non-empty string of at most 256 bytes");
            goto fail;
        }
        p->cache_salt = json_string_value(salt);
    }
    json_t *user = json_object_get(o, "user");
    if (user && !json_is_null(user)) {
        if (!json_is_string(user) || json_string_length(user) > 256) {
            rc = BAD("user", "'user' must be a string of at most 256 bytes");
            goto fail;
        }
        p->user = json_string_value(user);
    }
    json_t *intent = json_object_get(o, "intent");
    if (intent && !json_is_null(intent)) {
        sf_error ie = { 0 };
        if (sf_intent_from_json(intent, &p->intent, &ie)) { rc = BAD("intent", "%s", ie.msg); goto fail; }
        p->has_intent = 1;
    }
    return 0;
fail:
    sf_gw_params_free(p);
    return rc ? rc : SF_EINVAL;
}

void sf_gw_params_free(sf_gw_params *p)
{
    if (!p) return;
    for (int i = 0; p->msg_text && i < p->n_msgs; i++) free(p->msg_text[i]);
    free(p->msg_text);
    for (int i = 0; p->msg_calls && i < p->n_msgs; i++) free(p->msg_calls[i]);
    free(p->msg_calls);
    free(p->tools);
    free(p->msgs);
    for (int i = 0; p->prompts && i < p->n_prompts; i++) free(p->prompts[i].ids);
    free(p->prompts);
    free(p->bias);
    free(p->schema);
    json_decref(p->root);
    memset(p, 0, sizeof *p);
}
