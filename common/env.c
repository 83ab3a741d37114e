/* env.c — the SEMFLOW_* environment switches: one parser for all of them, so that a malformed
 * value is refused the same way everywhere (a warning naming it, then the documented default)
 * instead of being read as whatever a strcmp or atoi makes of it. See sf.h for the contract. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "sf.h"

int sf_env_bool(const char *name, int def)
{
    static const char *const off[] = { "0", "off", "false", "no" }, *const on[] = { "1", "on", "true", "yes" };
    const char *v = getenv(name);
    if (!v || !*v) return def;
    for (size_t i = 0; i < SF_ARRAY_LEN(off); i++) {
        if (!strcasecmp(v, off[i])) return 0;
        if (!strcasecmp(v, on[i])) return 1;
    }
    SF_LOGW("%s=%s: not a switch value (it takes 0 or 1); using the default, %d", name, v, def);
    return def;
}

long sf_env_long(const char *name, long def, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < lo || x > hi) {
        SF_LOGW("%s=%s: not an integer in [%ld, %ld]; using the default, %ld", name, v, lo, hi, def);
        return def;
    }
    return x;
}

int sf_env_choice(const char *name, int def, const char *const *choices, int n)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, choices[i])) return i;
    char list[256] = "";
    for (int i = 0, o = 0; i < n && o < (int)sizeof list; i++)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%s", i ? ", " : "", choices[i]);
    SF_LOGW("%s=%s: not one of %s; using the default, %s", name, v, list, def >= 0 && def < n ? choices[def] : "none");
    return def;
}
