/* tokenizer.h — Hugging Face tokenizer.json (BPE: ByteLevel/Split with PCRE2 regexes,
 * SentencePiece-style Metaspace with byte fallback), GGUF vocabularies, added/special tokens,
 * decoding, streaming detokenization and chat templates.
 *
 * Token ids equal Hugging Face `tokenizers` output exactly (tests/unit/test_tokenizer.c runs
 * ../shared/testdata/tokenizer-conformance). A tokenizer is immutable after loading and may be
 * used from any thread. */
#ifndef SF_TOKENIZER_H
#define SF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"

typedef struct sf_tokenizer sf_tokenizer;

/* dir holds tokenizer.json and (optionally) tokenizer_config.json. */
int sf_tok_load_dir(const char *dir, sf_tokenizer **out, sf_error *err);
/* json: tokenizer.json text; config_json: tokenizer_config.json text or NULL. */
int sf_tok_load_json(const char *json, const char *config_json, sf_tokenizer **out, sf_error *err);

/* A vocabulary as GGUF stores it (tokenizer.ggml.*). Strings are NUL-terminated. */
typedef struct sf_tok_vocab {
    const char *model;        /* "llama" (SentencePiece, scores) | "gpt2" (BPE, merges) */
    const char *pre;          /* tokenizer.ggml.pre ("llama-bpe", "qwen2", "gpt-2", ...) or NULL */
    int n_tokens;
    const char *const *tokens;
    const float *scores;      /* [n_tokens] or NULL */
    const int32_t *types;     /* [n_tokens] GGUF token types (1 normal, 2 unknown, 3 control, 4 user, 5 unused, 6 byte) or NULL */
    int n_merges;
    const char *const *merges;/* "a b" */
    int bos_id, eos_id, unk_id, pad_id; /* -1 if absent */
    int add_bos, add_eos;     /* -1: default for the model type */
    const char *chat_template;/* or NULL */
} sf_tok_vocab;
int sf_tok_from_vocab(const sf_tok_vocab *v, sf_tokenizer **out, sf_error *err);

void sf_tok_free(sf_tokenizer *t);

int sf_tok_vocab_size(const sf_tokenizer *t);
int sf_tok_bos(const sf_tokenizer *t);   /* -1 if none */
int sf_tok_eos(const sf_tokenizer *t);   /* -1 if none */
/* 1 if id ends generation (eos, <|eot_id|>, <|im_end|>, ...). */
int sf_tok_is_eog(const sf_tokenizer *t, int32_t id);
/* Id of an exact token string (added or vocab), -1 if none. */
int32_t sf_tok_lookup(const sf_tokenizer *t, const char *piece);
/* Raw piece string of id as stored in the vocab (not decoded), NULL if out of range. */
const char *sf_tok_piece(const sf_tokenizer *t, int32_t id);

/* Encode UTF-8 text. add_special: add BOS/EOS as the tokenizer's post-processor does
 * (Hugging Face encode() default). Special tokens written in the text are matched.
 * Returns SF_EINVAL for invalid UTF-8. *ids is malloc'd. */
int sf_tok_encode(const sf_tokenizer *t, const char *text, size_t len, int add_special,
                  int32_t **ids, size_t *n_ids, sf_error *err);
/* Decode ids to UTF-8 (malloc'd, NUL-terminated). skip_special: drop special tokens. */
int sf_tok_decode(const sf_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                  char **text, sf_error *err);

/* Streaming detokenizer: feed ids one at a time, get text that is always whole UTF-8
 * sequences. What is held back is released by later tokens or by finish. */
typedef struct sf_detok {
    const sf_tokenizer *t;
    int32_t *ids;             /* tokens decoded so far (for context-sensitive decoders) */
    size_t n, cap;
    size_t emitted;           /* bytes of the full decode already returned */
    int skip_special;
    size_t prefix_off, read_off; /* window ids[prefix_off..read_off) already decoded and returned */
} sf_detok;
void sf_detok_init(sf_detok *d, const sf_tokenizer *t, int skip_special);
/* Appends newly completed text to out (a growing malloc'd buffer: *out, *out_len). */
int sf_detok_push(sf_detok *d, int32_t id, char **out, size_t *out_len);
int sf_detok_finish(sf_detok *d, char **out, size_t *out_len);
void sf_detok_free(sf_detok *d);

/* Chat templates. */
typedef struct sf_chat_msg {
    const char *role;         /* system | user | assistant | tool */
    const char *content;
    const char *tool_calls;   /* assistant: JSON text of OpenAI's tool_calls array, NULL: none */
} sf_chat_msg;
enum { SF_CHAT_AUTO = 0, SF_CHAT_LLAMA3, SF_CHAT_CHATML, SF_CHAT_INST, SF_CHAT_ZEPHYR, SF_CHAT_RAW };
/* Name -> SF_CHAT_* ("llama3", "chatml", "inst", "zephyr", "raw"); -1 unknown. */
int sf_chat_format_from_name(const char *name);
/* Which format the tokenizer's chat_template corresponds to (SF_CHAT_CHATML when unknown). */
int sf_tok_chat_format(const sf_tokenizer *t);
/* Render messages to a prompt string (malloc'd). format SF_CHAT_AUTO: from the template. */
int sf_chat_render(const sf_tokenizer *t, int format, const sf_chat_msg *msgs, int n,
                   int add_generation_prompt, char **out, sf_error *err);
/* The same with tools offered: tools is the JSON text of OpenAI's tools array (each
 * {"type": "function", "function": {...}}), NULL: none. Tools, assistant tool calls and tool
 * results render as Qwen2.5's template does them (chatml) or Llama 3.1's (llama3, the tools in
 * the first user message); the other formats have no such convention (SF_EUNSUPPORTED). */
int sf_chat_render_tools(const sf_tokenizer *t, int format, const sf_chat_msg *msgs, int n,
                         int add_generation_prompt, const char *tools, char **out, sf_error *err);
/* vLLM's (and transformers') continue_final_message: a chat rendered without a generation
 * prompt is cut right after the last occurrence of its final message's content (of the content
 * trimmed, for templates that trim it), so the model goes on writing that message rather than
 * starting a turn of its own. SF_EINVAL when the content is empty or does not appear. */
int sf_chat_continue_final(char *rendered, const char *final_content, sf_error *err);

#endif
