/* chat.c — chat templates without a Jinja engine: the four prompt formats Llama-family chat
 * models use, rendered exactly as transformers' apply_chat_template renders their official
 * templates (trim_blocks/lstrip_blocks), and recognised from tokenizer_config.json's
 * chat_template by distinctive substrings.
 *
 * The rendered prompt already holds the BOS text where the format wants one, so encode it with
 * add_special = 0 (as apply_chat_template(tokenize=True) does). Pure functions; any thread. */
#include <ctype.h>
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

static int render_llama3(tok_buf *b, const char *bos, const sf_chat_msg *m, int n, int gen)
{
    int rc = n > 0 ? put(b, bos) : SF_OK; /* the template prepends bos_token to the first message */
    for (int i = 0; i < n && !rc; i++)
        rc = put(b, "<|start_header_id|>") || put(b, m[i].role) || put(b, "<|end_header_id|>\n\n") ||
             put_trimmed(b, m[i].content) || put(b, "<|eot_id|>");
    if (!rc && gen) rc = put(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return rc;
}

static int render_chatml(tok_buf *b, const sf_tokenizer *t, const sf_chat_msg *m, int n, int gen)
{
    int rc = SF_OK;
    /* Qwen2's template adds this system turn when the conversation has none */
    if (t && t->chat_template && strstr(t->chat_template, "You are a helpful assistant.") && n > 0 && strcmp(m[0].role, "system"))
        rc = put(b, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
    for (int i = 0; i < n && !rc; i++)
        rc = put(b, "<|im_start|>") || put(b, m[i].role) || put(b, "\n") || put(b, m[i].content) || put(b, "<|im_end|>\n");
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

int sf_chat_render(const sf_tokenizer *t, int format, const sf_chat_msg *msgs, int n, int add_generation_prompt,
                   char **out, sf_error *err)
{
    tok_buf b = { 0 };
    int rc = SF_OK;
    *out = NULL;
    if (n < 0 || (n > 0 && !msgs)) return sf_err(err, SF_EINVAL, "sf_chat_render: no messages given");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content || !*msgs[i].role)
            return sf_err(err, SF_EINVAL, "chat message %d has no %s", i, msgs[i].content ? "role" : "content");
    if (format == SF_CHAT_AUTO) format = sf_tok_chat_format(t);
    const char *bos = t && t->bos_str ? t->bos_str : NULL, *eos = t && t->eos_str ? t->eos_str : NULL;
    switch (format) {
    case SF_CHAT_LLAMA3:
        rc = render_llama3(&b, bos ? bos : "<|begin_of_text|>", msgs, n, add_generation_prompt);
        break;
    case SF_CHAT_CHATML:
        rc = render_chatml(&b, t, msgs, n, add_generation_prompt);
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
    if (!rc) rc = tok_buf_put(&b, "", 0);
    if (rc) {
        free(b.p);
        return sf_err(err, SF_ENOMEM, "rendering a chat of %d messages: out of memory", n);
    }
    *out = b.p;
    return SF_OK;
}
