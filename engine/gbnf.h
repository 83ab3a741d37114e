/* gbnf.h — llama.cpp's grammar format (GBNF), for output held to a grammar (llama.cpp's server
 * `grammar`, vLLM's `guided_grammar`): a grammar without recursion describes a regular
 * language, so it is written out as one pattern (engine/regex.h, whole match) and held by the
 * same automaton and token mask as guided_regex. Internal to engine/.
 *
 * The syntax is llama.cpp's: rules `name ::= ...` (names of letters, digits, '-' and '_'; `root`
 * is the output), literals "..." , classes [...] and [^...] with ranges, `.` (any character),
 * groups, `|`, rule references, the quantifiers ? * + {m} {m,} {m,n}, comments from '#' to the
 * end of the line; escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH. A newline ends a rule
 * except inside a group or after '|'. Refused, with the line and column: a rule that refers back
 * to itself, directly or through others (recursion: a context-free language no finite automaton
 * holds; write repetition with * + {m,n} instead), an undefined rule, a rule defined twice, no
 * `root`, and what the pattern's own caps refuse (engine/regex.h). */
#ifndef SF_GBNF_H
#define SF_GBNF_H

#include <stddef.h>

#include "../common/sf.h"

/* The grammar's root written out as a pattern for sf_regex_compile (a whole match; *out is
 * NUL-terminated, the caller frees it). SF_EINVAL says what is wrong and where. */
int sf_gbnf_to_regex(const char *text, size_t len, char **out, sf_error *err);

#endif
