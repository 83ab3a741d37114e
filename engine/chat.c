/* chat.c — chat templates without a Jinja engine: the four prompt formats Llama-family chat
 * models use, rendered exactly as transformers' apply_chat_template renders their official
 * templates (trim_blocks/lstrip_blocks), and recognised from tokenizer_config.json's
 * chat_template by distinctive substrings.
 *
 * The rendered prompt already holds the BOS text where the format wants one, so encode it with
 * add_special = 0 (as apply_chat_template(tokenize=True) does). Pure functions; any thread. */
#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tok_impl.h"

static const struct {
    const char *name;
    int fmt;
} formats[] = {
    { "llama3", SF_CHAT_LLAMA3 }, { "llama-3", SF_CHAT_LLAMA3 }, { "chatml", SF_CHAT_CHATML }, { "qwen", SF_CHAT_CHATML },
    { "inst", SF_CHAT_INST },     { "llama2", SF_CHAT_INST },    { "llama-2", SF_CHAT_INST },   { "mistral", SF_CHAT_INST },
    { "zephyr", SF_CHAT_ZEPHYR }, { "tinyllama", SF_CHAT_ZEPHYR }, { "raw", SF_CHAT_RAW },     { "auto", SF_CHAT_AUTO },
};

int sf_chat_format_from_name(const char *name)
{
    if (!name) return -1;
    for (size_t i = 0; i < SF_ARRAY_LEN(formats); i++)
        if (!strcasecmp(name, formats[i].name)) return formats[i].fmt;
    return -1;
}

int sf_tok_chat_format(const sf_tokenizer *t)
{
    const char *tpl = t ? t->chat_template : NULL;
    if (!tpl) return SF_CHAT_CHATML;
    if (strstr(tpl, "<|start_header_id|>")) return SF_CHAT_LLAMA3;
    if (strstr(tpl, "<|im_start|>")) return SF_CHAT_CHATML;
    if (strstr(tpl, "[INST]")) return SF_CHAT_INST;
    if (strstr(tpl, "<|user|>")) return SF_CHAT_ZEPHYR;
    return SF_CHAT_CHATML;
}

static int put(tok_buf *b, const char *s) { return tok_buf_puts(b, s); }

/* Jinja's `| trim` / Python's str.strip(): ASCII and common whitespace at both ends. */
static int put_trimmed(tok_buf *b, const char *s)
{
    size_t n = strlen(s), st = 0;
    while (st < n && isspace((unsigned char)s[st])) st++;
    while (n > st && isspace((unsigned char)s[n - 1])) n--;
    return tok_buf_put(b, s + st, n - st);
}

/* JSON as the templates' `tojson` writes it (json.dumps: ", " and ": ", key order kept, UTF-8) */
static int put_json(tok_buf *b, json_t *v, size_t flags)
{
    char *s = json_dumps(v, flags | JSON_ENCODE_ANY);
    int rc = s ? put(b, s) : SF_ENOMEM;
    free(s);
    return rc;
}

/* A tool call's arguments: OpenAI sends a JSON string; the templates want the object (as vLLM
 * parses it before rendering), or the string itself when it is not JSON. */
static int put_arguments(tok_buf *b, json_t *call)
{
    json_t *a = json_object_get(json_object_get(call, "function"), "arguments");
    json_t *v = json_is_string(a) ? json_loads(json_string_value(a), JSON_DECODE_ANY, NULL) : NULL;
    int rc = put_json(b, v ? v : a ? a : json_object(), 0);
    json_decref(v);
    return rc;
}

static const char *call_name(json_t *call)
{
    const char *s = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
    return s ? s : "";
}

/* Llama 3 (3.0 template); with tools or tool turns, Llama 3.1's: a system turn with the
 * environment and dates, the tools in the first user message, calls as {"name", "parameters"},
 * results as ipython turns (their text as a JSON string, as the template's tojson writes it). */
static int render_llama3(tok_buf *b, const char *bos, const sf_chat_msg *m, int n, int gen, json_t *tools,
                         sf_error *err)
{
    int rc = n > 0 ? put(b, bos) : SF_OK; /* the template prepends bos_token to the first message */
    int i = 0;
    if (tools) {
        const char *sys = "";
        if (n > 0 && !strcmp(m[0].role, "system")) sys = m[i++].content;
        if (i >= n || strcmp(m[i].role, "user"))
            return sf_err(err, SF_EINVAL, "chat format llama3: tools go in the first user message, and there is none");
        rc = rc || put(b, "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: "
                          "December 2023\nToday Date: 26 Jul 2024\n\n") || put_trimmed(b, sys) || put(b, "<|eot_id|>") ||
             put(b, "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a "
                    "JSON for a function call with its proper arguments that best answers the given prompt.\n\nRespond "
                    "in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}."
                    "Do not use variables.\n\n");
        size_t k;
        json_t *tool;
        json_array_foreach(tools, k, tool) rc = rc || put_json(b, tool, JSON_INDENT(4)) || put(b, "\n\n");
        rc = rc || put_trimmed(b, m[i++].content) || put(b, "<|eot_id|>");
    }
    for (; i < n && !rc; i++) {
        if (m[i].tool_calls) { /* one call a turn, as the template allows */
            json_t *calls = json_loads(m[i].tool_calls, 0, NULL), *c = json_array_get(calls, 0);
            if (json_array_size(calls) != 1) {
                json_decref(calls);
                return sf_err(err, SF_EINVAL, "chat format llama3: message %d has %zu tool calls; Llama 3.1 takes one "
                              "call a turn", i, json_array_size(calls));
            }
            rc = put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"") || put(b, call_name(c)) ||
                 put(b, "\", \"parameters\": ") || put_arguments(b, c) || put(b, "}<|eot_id|>");
            json_decref(calls);
        } else if (!strcmp(m[i].role, "tool")) {
            json_t *s = json_string(m[i].content);
            rc = put(b, "<|start_header_id|>ipython<|end_header_id|>\n\n") || put_json(b, s, 0) || put(b, "<|eot_id|>");
            json_decref(s);
        } else {
            rc = put(b, "<|start_header_id|>") || put(b, m[i].role) || put(b, "<|end_header_id|>\n\n") ||
                 put_trimmed(b, m[i].content) || put(b, "<|eot_id|>");
        }
    }
    if (!rc && gen) rc = put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return rc;
}

/* ChatML; tools, calls and results as Qwen2.5's template writes them. */
static int render_chatml(tok_buf *b, const sf_tokenizer *t, const sf_chat_msg *m, int n, int gen, json_t *tools)
{
    static const char qwen25[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    const char *tpl = t ? t->chat_template : NULL;
    /* the system turn Qwen's templates add when the conversation has none (Qwen2.5's, Qwen2's) */
    const char *dflt = tpl && strstr(tpl, qwen25) ? qwen25 : tpl && strstr(tpl, "You are a helpful assistant.")
                                                                  ? "You are a helpful assistant." : NULL;
    int rc = SF_OK, i = 0;
    if (tools) {
        rc = put(b, "<|im_start|>system\n");
        if (n > 0 && !strcmp(m[0].role, "system")) rc = rc || put(b, m[i++].content);
        else if (dflt) rc = rc || put(b, dflt);
        rc = rc || put(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                          "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        size_t k;
        json_t *tool;
        json_array_foreach(tools, k, tool) rc = rc || put(b, "\n") || put_json(b, tool, 0);
        rc = rc || put(b, "\n</tools>\n\nFor each function call, return a json object with function name and "
                          "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
                          "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (dflt && n > 0 && strcmp(m[0].role, "system")) {
        rc = put(b, "<|im_start|>system\n") || put(b, dflt) || put(b, "<|im_end|>\n");
    }
    for (; i < n && !rc; i++) {
        if (m[i].tool_calls) {
            json_t *calls = json_loads(m[i].tool_calls, 0, NULL), *c;
            size_t k;
            rc = put(b, "<|im_start|>assistant");
            if (*m[i].content) rc = rc || put(b, "\n") || put(b, m[i].content);
            json_array_foreach(calls, k, c) rc = rc || put(b, "\n<tool_call>\n{\"name\": \"") || put(b, call_name(c)) ||
                                                 put(b, "\", \"arguments\": ") || put_arguments(b, c) ||
                                                 put(b, "}\n</tool_call>");
            rc = rc || put(b, "<|im_end|>\n");
            json_decref(calls);
        } else if (!strcmp(m[i].role, "tool")) { /* a run of results is one user turn */
            if (i == 0 || strcmp(m[i - 1].role, "tool")) rc = put(b, "<|im_start|>user");
            rc = rc || put(b, "\n<tool_response>\n") || put(b, m[i].content) || put(b, "\n</tool_response>");
            if (!rc && (i == n - 1 || strcmp(m[i + 1].role, "tool"))) rc = put(b, "<|im_end|>\n");
        } else {
            rc = put(b, "<|im_start|>") || put(b, m[i].role) || put(b, "\n") || put(b, m[i].content) ||
                 put(b, "<|im_end|>\n");
        }
    }
    if (!rc && gen) rc = put(b, "<|im_start|>assistant\n");
    return rc;
}

/* Llama-2-chat's template: the system prompt folds into the first user turn; user and assistant
 * turns must alternate. */
static int render_inst(tok_buf *b, const char *bos, const char *eos, const sf_chat_msg *m, int n, sf_error *err)
{
    const char *sys = NULL;
    int first = 0, rc = SF_OK;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        sys = m[0].content;
        first = 1;
    }
    for (int i = first; i < n && !rc; i++) {
        const char *want = (i - first) % 2 == 0 ? "user" : "assistant";
        if (strcmp(m[i].role, want))
            return sf_err(err, SF_EINVAL, "chat format [INST]: message %d has role \"%s\" where \"%s\" is expected "
                          "(after an optional system message, user and assistant turns must alternate)", i, m[i].role, want);
        if (!strcmp(want, "user")) {
            rc = put(b, bos) || put(b, "[INST] ");
            if (!rc && i == first && sys) {
                /* content = '<<SYS>>\n' + system + '\n<</SYS>>\n\n' + user, then .strip() */
                tok_buf c = { 0 };
                rc = put(&c, "<<SYS>>\n") || put(&c, sys) || put(&c, "\n<</SYS>>\n\n") || put(&c, m[i].content) ||
                     put_trimmed(b, c.p);
                free(c.p);
            } else if (!rc) {
                rc = put_trimmed(b, m[i].content);
            }
            if (!rc) rc = put(b, " [/INST]");
        } else {
            rc = put(b, " ") || put_trimmed(b, m[i].content) || put(b, " ") || put(b, eos);
        }
    }
    return rc ? sf_err(err, SF_ENOMEM, "out of memory") : SF_OK;
}

/* TinyLlama / Zephyr: '<|role|>\n' + content + eos_token + '\n' per message; '<|assistant|>\n'
 * when a reply is wanted. Roles other than user/system/assistant render nothing. */
static int render_zephyr(tok_buf *b, const char *eos, const sf_chat_msg *m, int n, int gen)
{
    int rc = SF_OK;
    for (int i = 0; i < n && !rc; i++) {
        const char *r = m[i].role;
        if (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "assistant")) continue;
        rc = put(b, "<|") || put(b, r) || put(b, "|>\n") || put(b, m[i].content) || put(b, eos) || put(b, "\n");
    }
    if (!rc && gen && n > 0) rc = put(b, "<|assistant|>\n");
    return rc;
}

/* the last occurrence of needle[0..n) in hay, or NULL */
static char *last_of(char *hay, const char *needle, size_t n)
{
    char *found = NULL, *end = hay + strlen(hay);
    for (char *p = hay; n && (p = memmem(p, (size_t)(end - p), needle, n)); p++) found = p;
    return found;
}

int sf_chat_continue_final(char *rendered, const char *final_content, sf_error *err)
{
    const char *c = final_content;
    size_t n = strlen(c);
    char *at = last_of(rendered, c, n);
    if (!at) { /* the template trimmed it (Llama 3's does) */
        while (n && isspace((unsigned char)c[n - 1])) n--;
        while (n && isspace((unsigned char)*c)) c++, n--;
        at = last_of(rendered, c, n);
    }
    if (!n) return sf_err(err, SF_EINVAL, "continue_final_message: the final message is empty");
    if (!at) return sf_err(err, SF_EINVAL, "continue_final_message: the final message does not appear in the chat as "
                           "this model's template renders it");
    at[n] = 0;
    return SF_OK;
}

int sf_chat_render(const sf_tokenizer *t, int format, const sf_chat_msg *msgs, int n, int add_generation_prompt,
                   char **out, sf_error *err)
{
    return sf_chat_render_tools(t, format, msgs, n, add_generation_prompt, NULL, out, err);
}

int sf_chat_render_tools(const sf_tokenizer *t, int format, const sf_chat_msg *msgs, int n, int add_generation_prompt,
                         const char *tools_json, char **out, sf_error *err)
{
    tok_buf b = { 0 };
    int rc = SF_OK;
    *out = NULL;
    if (n < 0 || (n > 0 && !msgs)) return sf_err(err, SF_EINVAL, "sf_chat_render: no messages given");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content || !*msgs[i].role)
            return sf_err(err, SF_EINVAL, "chat message %d has no %s", i, msgs[i].content ? "role" : "content");
    if (format == SF_CHAT_AUTO) format = sf_tok_chat_format(t);
    json_t *tools = NULL;
    int tool_turns = 0;
    for (int i = 0; i < n; i++) tool_turns |= msgs[i].tool_calls || !strcmp(msgs[i].role, "tool");
    if (tools_json && !(tools = json_loads(tools_json, 0, NULL)))
        return sf_err(err, SF_EINVAL, "the tools are not a JSON array");
    if ((tools || tool_turns) && format != SF_CHAT_LLAMA3 && format != SF_CHAT_CHATML) {
        json_decref(tools);
        return sf_err(err, SF_EUNSUPPORTED, "this model's chat format (%s) has no convention for tools and tool "
                      "calls here (llama3 and chatml do)", format == SF_CHAT_INST ? "[INST]" : format == SF_CHAT_ZEPHYR
                                                                                     ? "zephyr" : "raw");
    }
    const char *bos = t && t->bos_str ? t->bos_str : NULL, *eos = t && t->eos_str ? t->eos_str : NULL;
    switch (format) {
    case SF_CHAT_LLAMA3:
        rc = render_llama3(&b, bos ? bos : "<|begin_of_text|>", msgs, n, add_generation_prompt, tools, err);
        if (rc == SF_EINVAL) {
            json_decref(tools);
            free(b.p);
            return rc;
        }
        break;
    case SF_CHAT_CHATML:
        rc = render_chatml(&b, t, msgs, n, add_generation_prompt, tools);
        break;
    case SF_CHAT_INST:
        if ((rc = render_inst(&b, bos ? bos : "<s>", eos ? eos : "</s>", msgs, n, err))) {
            free(b.p);
            return rc;
        }
        break;
    case SF_CHAT_ZEPHYR:
        rc = render_zephyr(&b, eos ? eos : "</s>", msgs, n, add_generation_prompt);
        break;
    case SF_CHAT_RAW:
        for (int i = 0; i < n && !rc; i++) rc = (i && put(&b, "\n")) || put(&b, msgs[i].content);
        break;
    default:
        return sf_err(err, SF_EINVAL, "unknown chat format %d (use llama3, chatml, inst, zephyr or raw)", format);
    }
    json_decref(tools);
    if (!rc) rc = tok_buf_put(&b, "", 0);
    if (rc) {
        free(b.p);
        return sf_err(err, SF_ENOMEM, "rendering a chat of %d messages: out of memory", n);
    }
    *out = b.p;
    return SF_OK;
}
