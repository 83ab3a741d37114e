/* args.c — argument parsing the subcommands share (cli.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "engine/engine.h"

int sf_cli_long(const char *cmd, const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "semflow %s: %s '%s' is not an integer in [%ld, %ld]\n", cmd, flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int sf_cli_spec_config(const char *cmd, const char *text, struct sf_engine_config *c)
{
    json_error_t je;
    json_t *o = json_loads(text, 0, &je), *v;
    const char *k, *bad = NULL;
    if (!json_is_object(o)) {
        fprintf(stderr, "semflow %s: --speculative-config: not a JSON object (%s)\n", cmd, o ? "" : je.text);
        json_decref(o);
        return -1;
    }
    json_t *m = json_object_get(o, "method");
    if (!json_is_string(m) || (strcmp(json_string_value(m), "ngram") && strcmp(json_string_value(m), "prompt_lookup")))
        bad = "\"method\" must be \"ngram\" (the only one here)";
    json_object_foreach(o, k, v) {
        if (bad) break;
        int *dst = !strcmp(k, "num_speculative_tokens")  ? &c->spec_tokens
                   : !strcmp(k, "prompt_lookup_max")     ? &c->spec_ngram_max
                   : !strcmp(k, "prompt_lookup_min")     ? &c->spec_ngram_min
                   : !strcmp(k, "disable_by_batch_size") ? &c->spec_max_batch
                                                         : NULL;
        if (!strcmp(k, "method")) continue;
        if (!dst) bad = "keys: method, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, disable_by_batch_size";
        else if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65536) bad = "values are integers";
        else *dst = (int)json_integer_value(v);
    }
    if (!bad && c->spec_tokens < 1) bad = "\"num_speculative_tokens\" (1 to 16) is required";
    json_decref(o);
    if (bad) {
        fprintf(stderr, "semflow %s: --speculative-config: %s\n", cmd, bad);
        return -1;
    }
    return 0;
}

int sf_cli_engine_flag(const char *cmd, const char *flag, const char *v, struct sf_engine_config *c)
{
    long l;
    if (!strcmp(flag, "--backend")) {
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strcmp(v, "cuda")) {
            fprintf(stderr, "semflow %s: --backend '%s': use auto, cpu or cuda\n", cmd, v);
            return -1;
        }
        c->backend = v;
    } else if (!strcmp(flag, "--threads")) {
        if (sf_cli_long(cmd, flag, v, 1, 4096, &l)) return -1;
        c->n_threads = (int)l;
    } else if (!strcmp(flag, "--speculative-config")) {
        if (sf_cli_spec_config(cmd, v, c)) return -1;
    } else if (!strcmp(flag, "--load-format")) {
        if (strcmp(v, "dummy") && strcmp(v, "auto")) {
            fprintf(stderr, "semflow %s: --load-format '%s': use auto or dummy\n", cmd, v);
            return -1;
        }
        c->load_dummy = !strcmp(v, "dummy");
    } else {
        return 0;
    }
    return 1;
}
