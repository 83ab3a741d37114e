/* args.c — argument parsing the subcommands share (cli.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"

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
