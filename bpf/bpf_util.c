/* bpf_util.c — BPF preflight checks and tracefs mounting. */
#include "bpf/bpf_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#ifdef SF_HAVE_BPF
#include <bpf/libbpf.h>

static int libbpf_log(enum libbpf_print_level level, const char *fmt, va_list ap)
{
    char *text = NULL, *line, *save = NULL;
    if (vasprintf(&text, fmt, ap) < 0) return 0;
    /* the verifier log comes as one message of many lines */
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        sf_log(level == LIBBPF_WARN ? SF_LOG_WARN : SF_LOG_DEBUG, "libbpf: %s", line);
    free(text);
    return 0;
}
#endif

int sf_bpf_check(sf_error *err)
{
#ifdef SF_HAVE_BPF
    libbpf_set_print(libbpf_log);
    if (geteuid() != 0)
        return sf_err(err, SF_EPERM, "BPF needs root (or CAP_BPF and CAP_PERFMON): run as root to see "
                                     "per-process PCIe and socket traffic");
    if (access("/sys/kernel/btf/vmlinux", R_OK) != 0)
        return sf_err(err, SF_EUNSUPPORTED, "kernel has no BTF (/sys/kernel/btf/vmlinux: %s): BPF needs a "
                                            "kernel built with CONFIG_DEBUG_INFO_BTF=y", strerror(errno));
    return SF_OK;
#else
    return sf_err(err, SF_EUNSUPPORTED, "BPF is off in this build (clang, bpftool and libbpf.a were missing "
                                        "at build time: run make deps, then rebuild)");
#endif
}

#define TRACEFS_MAGIC_ 0x74726163

int sf_bpf_mount_tracefs(sf_error *err)
{
    struct statfs fs;
    if (access("/sys/kernel/tracing/events/sock", F_OK) == 0) return SF_OK;
    if (statfs("/sys/kernel/tracing", &fs) == 0 && fs.f_type == TRACEFS_MAGIC_) return SF_OK;
    if (mount("nodev", "/sys/kernel/tracing", "tracefs", 0, NULL) != 0 && errno != EBUSY)
        return sf_err(err, errno == EPERM ? SF_EPERM : SF_ERROR,
                      "mounting tracefs at /sys/kernel/tracing failed: %s (tracepoints need it: "
                      "mount -t tracefs nodev /sys/kernel/tracing)", strerror(errno));
    return SF_OK;
}
