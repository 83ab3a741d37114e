/* intent.h — semantic intents: the X-Semantic-Intent header and the "intent" JSON field.
 *
 *   X-Semantic-Intent: realtime-chat; urgency=high; max-latency=400ms; min-throughput=50tokens/sec
 *
 * Grammar (strict; optional spaces/tabs around ';' and '='):
 *   intent  = class *( ";" param )
 *   class   = 1*47( ALPHA / DIGIT / "-" / "_" / "." )
 *   param   = "urgency=" ("high" | "normal" | "low")
 *           / "max-latency=" number ("ms" | "s")                 (0 < value <= 1 hour)
 *           / "min-throughput=" number ("tokens/sec" | "tokens/s")  (0 < value <= 1e6)
 * Keys may appear once each; empty segments, unknown keys and missing units are errors.
 * Without an explicit urgency the class picks the lane (sf_intent_class_urgency).
 * Pure functions, any thread. */
#ifndef SF_GW_INTENT_H
#define SF_GW_INTENT_H

#include <stddef.h>

#include <jansson.h>

#include "../common/sf.h"
#include "../engine/engine.h"

/* The server default: class "default", normal urgency, no targets. */
void sf_intent_default(sf_intent *in);

/* Lane of a class when no urgency is given: classes starting with "realtime" or "interactive"
 * are high, "batch", "background", "offline" or "bulk" low, anything else normal. */
int sf_intent_class_urgency(const char *cls);

/* "high"/"normal"/"low" -> SF_URGENCY_*, -1 when unknown. */
int sf_urgency_from_name(const char *s, size_t n);
const char *sf_urgency_name(int urgency);

/* Parse the header form (s need not be NUL-terminated). SF_EINVAL with a message naming the
 * offending part on any error; *out is only written on success. */
int sf_intent_parse(const char *s, size_t len, sf_intent *out, sf_error *err);

/* Parse the JSON form: a string (the header grammar) or an object
 *   {"class": "...", "urgency": "high", "max_latency": "400ms" | "max_latency_ms": 400,
 *    "min_throughput": "50tokens/s" | "min_tps": 50}
 * Unknown keys and wrong types are SF_EINVAL. */
int sf_intent_from_json(const json_t *v, sf_intent *out, sf_error *err);

/* Canonical header form ("cls; urgency=high; max-latency=400ms; min-throughput=50tokens/s"). */
void sf_intent_format(const sf_intent *in, char *buf, size_t n);

#endif
