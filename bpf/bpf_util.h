/* bpf_util.h — what the BPF loaders (monitor.c, steer.c, uprobes.c) share: the preflight
 * check that turns "cannot load" into one actionable line, and tracefs mounting. */
#ifndef SF_BPF_UTIL_H
#define SF_BPF_UTIL_H

#include "../common/sf.h"

/* Root (or CAP_BPF + CAP_PERFMON), kernel BTF present; routes libbpf's messages to the
 * debug log. SF_OK, or SF_EPERM / SF_EUNSUPPORTED with the reason in err. */
int sf_bpf_check(sf_error *err);
/* Mounts tracefs at /sys/kernel/tracing when nothing is there (tracepoint attach needs it). */
int sf_bpf_mount_tracefs(sf_error *err);

/* The attach points in libcuda: name, direction (SF_DIR_* or SF_TR_DIR_DESC), size argument,
 * SF_TR_KIND_*. Terminated by a NULL name. */
typedef struct sf_cuda_sym {
    const char *name;
    int dir, arg, kind;
} sf_cuda_sym;
extern const sf_cuda_sym sf_cuda_syms[];

/* File offsets of the named dynamic/static symbols of an ELF shared object (0 where absent). */
int sf_elf_sym_offsets(const char *path, const char *const *names, int n, uint64_t *offsets, sf_error *err);
/* Paths of libcuda copies on this machine: ldconfig's cache (when with_ldconfig: it runs a
 * process), then /proc/<pid>/maps of every process. Fills up to max realpaths
 * (deduplicated), returns how many. */
int sf_cuda_discover(char paths[][512], int max, int with_ldconfig);
/* The same, reading only the maps of processes for which skip(pid, arg) returns 0. */
int sf_cuda_discover_filtered(char paths[][512], int max, int with_ldconfig, int (*skip)(int pid, void *arg),
                              void *arg);

#endif
