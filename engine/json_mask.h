/* json_mask.h — JSON output (OpenAI's response_format): the output is held to one JSON object
 * (json_object), or to one that a JSON Schema describes (json_schema, the subset below), by
 * taking from every draw the tokens whose text cannot continue it. Internal to engine/.
 *
 * sf_json is a byte-level pushdown recognizer small enough to copy per candidate token: the
 * mask copies it, feeds a token's text and keeps the token when every byte fits. End-of-
 * generation tokens fit only once the object is complete, and then only they do, so the
 * output ends there (finish_reason "stop") unless max_tokens cuts it first.
 *
 * The schema subset (what OpenAI's strict structured outputs use, less $ref and anyOf):
 * `type` (a name or a list of them: object, array, string, number, integer, boolean, null),
 * `properties` with `required`, `additionalProperties` absent or false (only the listed
 * properties, in the order listed, the required ones present), an object without
 * `properties` taking any members, `items`, `minItems`/`maxItems`, `enum`/`const` of strings,
 * booleans and null (written as the schema writes them), and the annotations `title`,
 * `description`, `default`, `examples`, `$schema`, `$comment`, and strings' `pattern` (read as
 * ECMA-262 reads it, a search: engine/regex.h's SF_REGEX_SEARCH, on the string's text with its
 * escapes decoded; such a string writes its characters as themselves, never as \u escapes, whose
 * four digits could lead where the pattern cannot go on). The root is an object. Any other keyword is refused by name rather than
 * ignored.
 *
 * A choice (vLLM's guided_choice, sf_jschema_choice) is the same machinery without JSON: the
 * output is exactly one of up to SF_JSON_MAX_PROPS strings, byte for byte; it is done as soon
 * as it equals one, and may go on while it is also the beginning of a longer one. A pattern
 * (vLLM's guided_regex, sf_jschema_regex) likewise: the output is a whole match of it
 * (engine/regex.h), done once it matches, going on while a longer text can. */
#ifndef SF_JSON_MASK_H
#define SF_JSON_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"
#include "regex.h"
#include "tokenizer.h"

#define SF_JSON_MAX_DEPTH 128 /* nesting of objects and arrays (deeper is not drawn) */
/* Whitespace between a value's parts: at most this many bytes in a row (an indented line of
 * pretty-printed JSON fits; a model that would pad for ever is made to go on), as llama.cpp's
 * JSON grammar bounds it. */
#define SF_JSON_MAX_WS 48
#define SF_JSON_MAX_FRAMES 16 /* a schema's nesting of constrained objects and arrays */
#define SF_JSON_MAX_PROPS 64  /* properties of one object, values of one enum */

typedef struct sf_jschema sf_jschema;
/* Compile a schema (JSON text). SF_EINVAL names what is not supported and where. */
int sf_jschema_compile(const char *text, size_t len, sf_jschema **out, sf_error *err);
/* A choice from its list as JSON text (an array of 1 to SF_JSON_MAX_PROPS distinct strings of 1
 * to 255 bytes); SF_EINVAL says what is wrong with it. sf_json_init with it starts a choice. */
int sf_jschema_choice(const char *text, size_t len, sf_jschema **out, sf_error *err);
/* A pattern (its text, len bytes) the whole output matches; SF_EINVAL says what is wrong with it
 * or not supported. sf_json_init with it starts a pattern's output. */
int sf_jschema_regex(const char *pattern, size_t len, sf_jschema **out, sf_error *err);
void sf_jschema_free(sf_jschema *s);

/* A schema-constrained container being written: which node, at which nesting, and how far. */
typedef struct sf_json_frame {
    uint64_t cand;            /* a key being written: the properties it can still be */
    uint16_t node, depth;
    uint16_t next;            /* objects: first property not yet passed */
    uint16_t cur;             /* objects: the property whose value is being written */
    uint16_t count;           /* arrays: items begun */
    uint8_t kpos;             /* a key being written: bytes matched */
} sf_json_frame;

typedef struct sf_json {
    const sf_jschema *sc;     /* NULL: any object */
    uint64_t ecand;           /* an enum value being written: the values it can still be */
    uint8_t mode, sub;        /* where in the grammar; a number's part */
    uint8_t lit, pos;         /* true/false/null: which, and bytes matched; enums: bytes matched */
    uint8_t key, low;         /* in a key string; in the low half of a surrogate pair's escape */
    uint8_t need, lo, hi;     /* UTF-8: continuation bytes still due, range of the next one */
    uint8_t hex;              /* \u digits seen */
    uint8_t ws;               /* whitespace bytes in a row */
    uint8_t intonly;          /* the number being written is an integer */
    uint8_t nf;               /* frames in use */
    uint16_t cp;              /* \u digits' value */
    uint16_t depth;
    uint16_t enode;           /* the enum's node */
    int32_t rs;               /* a pattern's output, or a pattern-held string: its automaton's state */
    uint8_t pat;              /* in a string its node's `pattern` holds (pnode) */
    uint16_t pnode;
    uint8_t stack[SF_JSON_MAX_DEPTH / 8]; /* bit per level: 1 object, 0 array */
    sf_json_frame f[SF_JSON_MAX_FRAMES];  /* last: copies take only the frames in use */
} sf_json;

/* sc NULL: any object (json_object); else the schema's (kept by the caller while j is used). */
void sf_json_init(sf_json *j, const sf_jschema *sc);
/* Feed n bytes: 1 when all of them continue the object (j advanced), 0 when one cannot (j is
 * then undefined: feed a copy). */
int sf_json_feed(sf_json *j, const char *p, size_t n);
/* 1 once the object is complete (only whitespace may follow); a choice: once it equals one. */
int sf_json_done(const sf_json *j);
/* Copy src's state into dst (the frames in use only). */
void sf_json_copy(sf_json *dst, const sf_json *src);

/* Every token's text as it reads in the middle of an output, for one tokenizer and a logits
 * row of n_logits; built once (decoding each token), read by the engine thread. */
typedef struct sf_json_vocab sf_json_vocab;
int sf_json_vocab_new(const sf_tokenizer *t, int n_logits, sf_json_vocab **out, sf_error *err);
void sf_json_vocab_free(sf_json_vocab *v);
/* The text token id reads as mid-output (n bytes; empty for end-of-generation and special ones). */
const char *sf_json_vocab_text(const sf_json_vocab *v, int32_t id, size_t *n);
/* Set to -inf the logits of the tokens that cannot come next; returns how many remain. */
int sf_json_mask(const sf_json *j, const sf_json_vocab *v, float *logits);
/* The same as bits: allow[id / 32] bit id % 32 set for each token that can come next, clear for
 * the others ((n_logits + 31) / 32 words, all written); returns how many are set. */
int sf_json_mask_bits(const sf_json *j, const sf_json_vocab *v, uint32_t *allow);
/* Advance j past token id (an end-of-generation token leaves it as it is); 0 when the token
 * does not fit (j unchanged). */
int sf_json_accept(sf_json *j, const sf_json_vocab *v, int32_t id);

#endif
