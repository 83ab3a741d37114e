/* regex.h — a regular expression compiled to a byte-level DFA, for output held to a pattern
 * (vLLM's guided_regex, engine/json_mask.h's regex mode): the whole output must match, as
 * Python's re.fullmatch(pattern, output) would. Internal to engine/.
 *
 * The syntax is Python's (what vLLM's users write), less what a finite automaton cannot hold:
 * literals (UTF-8), `.` (any character but a newline), classes `[a-z]`, `[^...]`, the escapes
 * \d \w \s \D \W \S (ASCII, as with re.ASCII), \n \t \r \f \v \a \0 \xHH \uHHHH \UHHHHHHHH and
 * any punctuation escaped; groups `(...)`, `(?:...)`, `(?P<name>...)`; `|`; the quantifiers
 * `*` `+` `?` `{n}` `{n,}` `{,m}` `{n,m}` (each also lazy, which matches the same texts); `^` /
 * `\A` at the beginning and `$` / `\Z` at the end of the pattern or of one of its top-level
 * alternatives. Refused by name: back-references, lookarounds, \b \B, inline flags, possessive
 * quantifiers, anchors elsewhere. `{` that does not begin a quantifier is a literal, as in Python.
 *
 * SF_REGEX_SEARCH reads the pattern as JSON Schema's `pattern` does (ECMA-262's search): a text
 * matches when some part of it does, so a top-level alternative not anchored with `^` may have
 * any text before it and one not anchored with `$` any text after it.
 *
 * Compiled once (Glushkov's construction over bytes, then the subset construction over classes
 * of bytes that no part of the pattern tells apart): feeding a byte is one table lookup, so a
 * state is an int and the token mask's trie walk costs what it costs for a choice. A compiled
 * pattern holds a table of states x byte classes (4 bytes each): kilobytes for the patterns
 * people write, 8 MiB at the caps (8192 states x 256 classes). */
#ifndef SF_REGEX_H
#define SF_REGEX_H

#include <stddef.h>

#include "../common/sf.h"

#define SF_REGEX_MAX_LEN 16384   /* pattern bytes */
#define SF_REGEX_MAX_POS 4096    /* bytes of the pattern once repeats are written out */
#define SF_REGEX_MAX_NODES 65536 /* its parts (groups, repeats, empty ones too) once written out */
#define SF_REGEX_MAX_STATES 8192 /* states of its automaton */
#define SF_REGEX_MAX_REPEAT 1000 /* n and m of {n,m} */
#define SF_REGEX_MAX_NEST 100    /* groups within groups */

typedef struct sf_regex sf_regex;
enum { SF_REGEX_SEARCH = 1 };
/* Compile (flags: 0, a whole match; SF_REGEX_SEARCH); SF_EINVAL says what is wrong or not
 * supported, and at which byte of the pattern. */
int sf_regex_compile(const char *pat, size_t len, int flags, sf_regex **out, sf_error *err);
void sf_regex_free(sf_regex *re);

/* States: 0 before any byte, -1 dead (nothing that begins this way matches). */
int sf_regex_next(const sf_regex *re, int state, unsigned char c);
/* The text fed so far matches as a whole. */
int sf_regex_accepts(const sf_regex *re, int state);
/* Some byte can follow (a match can be longer). */
int sf_regex_more(const sf_regex *re, int state);
/* Whole-text match (tests; Python's re.fullmatch). */
int sf_regex_match(const sf_regex *re, const char *s, size_t n);
int sf_regex_states(const sf_regex *re);

#endif
