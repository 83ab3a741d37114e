/* json_mask.h — JSON mode (OpenAI's response_format {"type": "json_object"}): the output is
 * held to one JSON object (RFC 8259, UTF-8, surrogate escapes paired) by taking from every
 * draw the tokens whose text cannot continue it. Internal to engine/.
 *
 * sf_json is a byte-level pushdown recognizer small enough to copy per candidate token: the
 * mask copies it, feeds a token's text and keeps the token when every byte fits. End-of-
 * generation tokens fit only once the object is complete, and then only they do, so the
 * output ends there (finish_reason "stop") unless max_tokens cuts it first. */
#ifndef SF_JSON_MASK_H
#define SF_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"
#include "tokenizer.h"

#define SF_JSON_MAX_DEPTH 128 /* nesting of objects and arrays (deeper is not drawn) */
/* Whitespace between a value's parts: at most this many bytes in a row (an indented line of
 * pretty-printed JSON fits; a model that would pad for ever is made to go on), as llama.cpp's
 * JSON grammar bounds it. */
#define SF_JSON_MAX_WS 48

typedef struct sf_json {
    uint8_t mode, sub;        /* where in the grammar; a number's part or a literal's */
    uint8_t lit, pos;         /* true/false/null: which, and bytes matched */
    uint8_t key, low;         /* in a key string; in the low half of a surrogate pair's escape */
    uint8_t need, lo, hi;     /* UTF-8: continuation bytes still due, range of the next one */
    uint8_t hex;              /* \u digits seen */
    uint8_t ws;               /* whitespace bytes in a row */
    uint16_t cp;              /* their value */
    uint16_t depth;
    uint8_t stack[SF_JSON_MAX_DEPTH / 8]; /* bit per level: 1 object, 0 array */
} sf_json;

void sf_json_init(sf_json *j);
/* Feed n bytes: 1 when all of them continue the object (j advanced), 0 when one cannot (j is
 * then undefined: feed a copy). */
int sf_json_feed(sf_json *j, const char *p, size_t n);
/* 1 once the object is complete (only whitespace may follow). */
int sf_json_done(const sf_json *j);

/* Every token's text as it reads in the middle of an output, for one tokenizer and a logits
 * row of n_logits; built once (decoding each token), read by the engine thread. */
typedef struct sf_json_vocab sf_json_vocab;
int sf_json_vocab_new(const sf_tokenizer *t, int n_logits, sf_json_vocab **out, sf_error *err);
void sf_json_vocab_free(sf_json_vocab *v);
/* Set to -inf the logits of the tokens that cannot come next; returns how many remain. */
int sf_json_mask(const sf_json *j, const sf_json_vocab *v, float *logits);
/* Advance j past token id (an end-of-generation token leaves it as it is); 0 when the token
 * does not fit (j unchanged). */
int sf_json_accept(sf_json *j, const sf_json_vocab *v, int32_t id);

#endif
