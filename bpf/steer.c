/* steer.c — userspace side of bpf/steer.bpf.c: load, fill the socket array, attach to the
 * listener group, and the prefix / load / counts accessors declared in monitor.h. */
#include "bpf/monitor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef SF_HAVE_BPF
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/socket.h>

#include "bpf/steer.h"
#include "bpf/steer.skel.h"
#include "bpf/bpf_util.h"

#ifndef SO_DETACH_REUSEPORT_BPF
#define SO_DETACH_REUSEPORT_BPF 68
#endif

struct sf_steer {
    struct steer_bpf *skel;
    int fds[SF_STEER_MAX_WORKERS];
    int n;
};

int sf_steer_attach(const int *fds, const int *lane_of, int n, sf_steer **out, sf_error *err)
{
    sf_steer *s = NULL;
    int rc;

    *out = NULL;
    if (n <= 0 || n > SF_STEER_MAX_WORKERS)
        return sf_err(err, SF_EINVAL, "steering: %d worker sockets given; 1 to %d are supported", n,
                      SF_STEER_MAX_WORKERS);
    for (int i = 0; i < n; i++)
        if (lane_of[i] < 0 || lane_of[i] >= SF_STEER_MAX_LANES)
            return sf_err(err, SF_EINVAL, "steering: worker %d has lane %d; lanes are 0 to %d", i, lane_of[i],
                          SF_STEER_MAX_LANES - 1);
    if ((rc = sf_bpf_check(err)) != SF_OK) return rc;

    s = calloc(1, sizeof *s);
    if (!s) return sf_err(err, SF_ENOMEM, "steering: out of memory");
    s->n = n;
    memcpy(s->fds, fds, (size_t)n * sizeof *fds);
    s->skel = steer_bpf__open();
    if (!s->skel) {
        rc = sf_err(err, SF_ERROR, "steering: opening the BPF object failed: %s", strerror(errno));
        goto fail;
    }
    s->skel->rodata->n_workers = (unsigned)n;
    for (int i = 0; i < n; i++) s->skel->rodata->lane_of[i] = (unsigned char)lane_of[i];
    if (steer_bpf__load(s->skel)) {
        rc = sf_err(err, errno == EPERM ? SF_EPERM : SF_ERROR,
                    "steering: loading the SK_REUSEPORT program failed: %s", strerror(errno));
        goto fail;
    }
    for (int i = 0; i < n; i++) {
        uint32_t k = (uint32_t)i;
        uint64_t fd = (uint64_t)fds[i];
        if (bpf_map_update_elem(bpf_map__fd(s->skel->maps.socks), &k, &fd, BPF_ANY)) {
            rc = sf_err(err, SF_EINVAL,
                        "steering: worker %d's socket (fd %d) cannot join the socket array: %s "
                        "(it must be a bound TCP/UDP socket with SO_REUSEPORT)", i, fds[i], strerror(errno));
            goto fail;
        }
    }
    int pfd = bpf_program__fd(s->skel->progs.steer);
    if (setsockopt(fds[0], SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &pfd, sizeof pfd)) {
        rc = sf_err(err, SF_ERROR, "steering: setsockopt(SO_ATTACH_REUSEPORT_EBPF) on fd %d: %s", fds[0],
                    strerror(errno));
        goto fail;
    }
    *out = s;
    return SF_OK;
fail:
    if (s) steer_bpf__destroy(s->skel);
    free(s);
    return rc;
}

void sf_steer_free(sf_steer *s)
{
    if (!s) return;
    int zero = 0;
    /* The program stays attached to the group until detached or every socket closes. */
    setsockopt(s->fds[0], SOL_SOCKET, SO_DETACH_REUSEPORT_BPF, &zero, sizeof zero);
    steer_bpf__destroy(s->skel);
    free(s);
}

/* "a.b.c.d[/n]" or "v6[/n]" -> key (IPv4 mapped into ::ffff:0:0/96). */
static int parse_cidr(const char *cidr, struct sf_steer_key *k, sf_error *err)
{
    char buf[INET6_ADDRSTRLEN + 8];
    char *slash, *end;
    long len = -1;

    if (!cidr || strlen(cidr) >= sizeof buf)
        return sf_err(err, SF_EINVAL, "steering: address prefix '%s' is not an IPv4/IPv6 address or CIDR",
                      cidr ? cidr : "(null)");
    strcpy(buf, cidr);
    if ((slash = strchr(buf, '/'))) {
        *slash = 0;
        errno = 0;
        len = strtol(slash + 1, &end, 10);
        if (errno || *end || end == slash + 1)
            return sf_err(err, SF_EINVAL, "steering: prefix length in '%s' is not a number", cidr);
    }
    memset(k, 0, sizeof *k);
    if (inet_pton(AF_INET, buf, &k->addr[12]) == 1) {
        if (len < 0) len = 32;
        if (len > 32) return sf_err(err, SF_EINVAL, "steering: IPv4 prefix length in '%s' is over 32", cidr);
        k->addr[10] = k->addr[11] = 0xff;
        k->prefixlen = 96 + (unsigned)len;
    } else if (inet_pton(AF_INET6, buf, k->addr) == 1) {
        if (len < 0) len = 128;
        if (len > 128) return sf_err(err, SF_EINVAL, "steering: IPv6 prefix length in '%s' is over 128", cidr);
        k->prefixlen = (unsigned)len;
    } else {
        return sf_err(err, SF_EINVAL, "steering: '%s' is not an IPv4/IPv6 address or CIDR (e.g. 10.0.0.0/8)", cidr);
    }
    return SF_OK;
}

int sf_steer_set_prefix(sf_steer *s, const char *cidr, int lane, sf_error *err)
{
    struct sf_steer_key k;
    uint32_t v = (uint32_t)lane;
    int rc;

    if (!s) return sf_err(err, SF_EINVAL, "steering is not attached");
    if (lane < 0 || lane >= SF_STEER_MAX_LANES)
        return sf_err(err, SF_EINVAL, "steering: lane %d for '%s' is out of range 0..%d", lane, cidr,
                      SF_STEER_MAX_LANES - 1);
    if ((rc = parse_cidr(cidr, &k, err)) != SF_OK) return rc;
    if (bpf_map_update_elem(bpf_map__fd(s->skel->maps.lanes), &k, &v, BPF_ANY))
        return sf_err(err, SF_ERROR, "steering: adding prefix '%s': %s", cidr, strerror(errno));
    return SF_OK;
}

int sf_steer_del_prefix(sf_steer *s, const char *cidr, sf_error *err)
{
    struct sf_steer_key k;
    int rc;

    if (!s) return sf_err(err, SF_EINVAL, "steering is not attached");
    if ((rc = parse_cidr(cidr, &k, err)) != SF_OK) return rc;
    if (bpf_map_delete_elem(bpf_map__fd(s->skel->maps.lanes), &k))
        return sf_err(err, SF_ENOTFOUND, "steering: prefix '%s' is not in the table: %s", cidr, strerror(errno));
    return SF_OK;
}

void sf_steer_set_load(sf_steer *s, int worker, uint32_t inflight)
{
    if (!s || worker < 0 || worker >= s->n) return;
    uint32_t k = (uint32_t)worker;
    bpf_map_update_elem(bpf_map__fd(s->skel->maps.load), &k, &inflight, BPF_ANY);
}

int sf_steer_counts(sf_steer *s, uint64_t *per_worker, int n, uint64_t *fallback)
{
    int ncpu = libbpf_num_possible_cpus();
    uint64_t *v;

    if (!s || ncpu <= 0) return SF_EINVAL;
    v = calloc((size_t)ncpu, sizeof *v);
    if (!v) return SF_ENOMEM;
    for (uint32_t k = 0; k <= SF_STEER_FALLBACK; k++) {
        uint64_t sum = 0;
        if (bpf_map_lookup_elem(bpf_map__fd(s->skel->maps.counts), &k, v) == 0)
            for (int c = 0; c < ncpu; c++) sum += v[c];
        if (k == SF_STEER_FALLBACK) { if (fallback) *fallback = sum; }
        else if ((int)k < n && per_worker) per_worker[k] = sum;
    }
    free(v);
    return SF_OK;
}

#else /* !SF_HAVE_BPF */

int sf_steer_attach(const int *fds, const int *lane_of, int n, sf_steer **out, sf_error *err)
{
    *out = NULL;
    return sf_err(err, SF_EUNSUPPORTED,
                  "steering: BPF is off in this build (clang, bpftool and libbpf.a were missing at build "
                  "time: make deps, then rebuild); connections use the kernel's reuseport hash");
}
void sf_steer_free(sf_steer *s) { (void)s; }
int sf_steer_set_prefix(sf_steer *s, const char *cidr, int lane, sf_error *err)
{
    return sf_err(err, SF_EUNSUPPORTED, "steering: BPF is off in this build");
}
int sf_steer_del_prefix(sf_steer *s, const char *cidr, sf_error *err)
{
    return sf_err(err, SF_EUNSUPPORTED, "steering: BPF is off in this build");
}
void sf_steer_set_load(sf_steer *s, int worker, uint32_t inflight) { (void)s; }
int sf_steer_counts(sf_steer *s, uint64_t *per_worker, int n, uint64_t *fallback) { return SF_EUNSUPPORTED; }

#endif
