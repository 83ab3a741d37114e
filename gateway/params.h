/* params.h — an OpenAI request body (chat or completions) turned into engine parameters.
 *
 * Pure: no tokenizer, no engine, no I/O, so it can be fuzzed on its own (tests/fuzz). Every
 * rejection carries the HTTP status, OpenAI's error type and the offending parameter name.
 * Ranges follow OpenAI where it defines them (temperature 0..2, top_p (0,1], penalties -2..2,
 * top_logprobs 0..20) and vLLM for its extensions (top_k, min_p, repetition_penalty,
 * ignore_eos). null means "not given" for every optional field. Any thread. */
#ifndef SF_GW_PARAMS_H
#define SF_GW_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "../engine/engine.h"
#include "../engine/tokenizer.h"

/* An error as the client will see it: {"error": {"message", "type", "param", "code"}}. */
typedef struct sf_gw_err {
    int status;               /* HTTP status */
    const char *type;         /* "invalid_request_error", "authentication_error", ... */
    const char *code;         /* or NULL */
    char param[64];           /* "" when not about one parameter */
    char msg[512];
} sf_gw_err;
int sf_gw_fail(sf_gw_err *e, int status, const char *type, const char *code, const char *param,
               const char *fmt, ...) __attribute__((format(printf, 6, 7)));

enum { SF_GW_COMPLETIONS = 0, SF_GW_CHAT = 1 };
/* tool_choice: no tools or "none" (no calls parsed), "auto", "required", a named function */
enum { SF_GW_TOOLS_NONE = 0, SF_GW_TOOLS_AUTO, SF_GW_TOOLS_REQUIRED, SF_GW_TOOLS_NAMED };
#define SF_GW_MAX_TOOLS 128
#define SF_GW_MAX_N 16
#define SF_GW_MAX_PROMPTS 256      /* completions: prompts in one request (OpenAI's batch form) */
#define SF_GW_MAX_CHOICES 1024     /* prompts x n */
#define SF_GW_MAX_TOKENS_LIMIT 1000000

/* One completions prompt: text (into the parsed body) or token ids (malloc'd). */
typedef struct sf_gw_prompt {
    const char *text;
    size_t len;
    int32_t *ids;
    int n_ids;
} sf_gw_prompt;

typedef struct sf_gw_params {
    int kind;                 /* SF_GW_* */
    json_t *root;             /* the parsed body; strings below point into it */
    const char *model;        /* NULL: not given */
    /* completions: the prompts (a string, token ids, or an array of either: each gets n choices,
     * indexed prompt * n + choice as OpenAI indexes them); malloc'd */
    sf_gw_prompt *prompts;
    int n_prompts;
    /* chat */
    sf_chat_msg *msgs;        /* malloc'd array; strings point into root or into msg_text */
    char **msg_text;          /* joined content parts, malloc'd per message (or NULL) */
    int n_msgs;
    int add_generation_prompt;
    int continue_final;       /* chat: vLLM's continue_final_message (the last message left open) */
    sf_sampling sampling;     /* stop strings point into root, logit_bias entries into bias */
    sf_logit_bias *bias;      /* malloc'd */
    char *schema;             /* malloc'd: response_format's json_schema.schema as text (sampling.schema) */
    const char *form;         /* the parameter that holds the output to a form, as the request named it
                               * ("guided_choice", "grammar", ...); NULL: none or JSON */
    /* chat tools: the tools array as JSON text (malloc'd), what tool_choice asks, and for a named
     * choice the tool; messages' tool_calls as JSON text in msg_calls (malloc'd per message) */
    char *tools;
    int tool_choice;          /* SF_GW_TOOLS_* */
    const char *tool_name;
    char **msg_calls;
    int max_tokens_given;
    int stream, include_usage;
    int n;
    int truncate;             /* vLLM's truncate_prompt_tokens: keep each prompt's last `truncate` tokens
                               * (0: off; -1: as many as the context holds with one token out) */
    int logprobs;             /* chat: logprobs true; completions: logprobs given */
    int top_logprobs;         /* alternatives per token (0..20) */
    int echo;                 /* completions: the prompt comes back before the output (with logprobs:
                               * its tokens' logprobs too; with max_tokens 0: the prompt alone) */
    int prompt_logprobs;      /* vLLM's prompt_logprobs: -1 not given, else alternatives per prompt token */
    int tokens_as_ids;        /* vLLM's return_tokens_as_token_ids: logprobs name tokens "token_id:<id>" */
    int has_intent;
    sf_intent intent;
    const char *user;
    const char *cache_salt;   /* vLLM's cache_salt: NULL or 1-256 bytes (points into the body's JSON) */
} sf_gw_params;

/* Parses body (len bytes, any content) into p. On failure fills e (status 400 or 404) and
 * leaves nothing to free; on success free with sf_gw_params_free. */
int sf_gw_params_parse(int kind, const char *body, size_t len, sf_gw_params *p, sf_gw_err *e);
void sf_gw_params_free(sf_gw_params *p);

/* A tool_choice of "required" or a named function: the output is constrained to a call, as a
 * JSON Schema set in p->sampling (the called tool's parameters where engine/json_mask.h's subset
 * holds them, else any object; "parameters" for llama3's calls, "arguments" otherwise). */
int sf_gw_force_call(sf_gw_params *p, int llama3, sf_gw_err *e);
/* The tool calls in a reply: <tool_call>{"name", "arguments"}</tool_call> blocks (Qwen, Hermes;
 * text before them goes to *content, malloc'd) or a reply that is one {"name", "parameters" |
 * "arguments"} object (Llama 3.1, forced calls). A JSON array of OpenAI tool_calls (ids
 * "call_<id>_<k>"), or NULL when the reply is not calls. */
json_t *sf_gw_parse_tool_calls(const char *text, size_t len, const char *id, char **content);

#endif
