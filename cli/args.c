/* args.c — argument parsing the subcommands share (cli.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

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
