/* comm_cpu.c — the CPU backend's communicator: the ranks are processes on one host sharing a
 * memfd segment.
 *
 * Segment: a header (per-rank arrival counters and pids, a failure record), then one staging
 * slot per rank and one result slot, each slot_bytes. Messages larger than a slot go in pieces.
 *
 * Barrier: rank r publishes its arrival count, bumps the shared generation word and wakes the
 * futex on it; waiters sleep on that word in slices of WAIT_SLICE_MS. Between slices a waiter
 * checks that every peer is alive (pidfd: readable once the process exited, zombie or not) and
 * that the wait has not run past timeout_ms, so a rank that dies or hangs ends the others'
 * calls with a message that names it instead of a hang.
 *
 * all-reduce: every rank copies its piece into its slot; barrier; rank r sums the r-th share
 * of the piece over the slots in rank order 0..size-1 into the result slot; barrier; every
 * rank copies the result out. The summation order is fixed, so all ranks get the same bits.
 * The result slot is rewritten only after the next piece's first barrier, which every rank
 * reaches after copying the previous result out: two barriers per piece are enough. */
#include "comm.h"

#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x53465450u /* "SFTP" */
#define SHM_VERSION 1u
#define WAIT_SLICE_MS 50
#define SPIN 256

typedef struct shm_rank {
    _Atomic uint32_t seq;  /* barriers this rank has arrived at */
    _Atomic int32_t pid;
    char pad[56];
} shm_rank;

typedef struct shm_hdr {
    uint32_t magic, version;
    int32_t size;
    uint32_t pad0;
    uint64_t slot_bytes;
    _Atomic uint32_t gen;    /* futex word: bumped by every arrival and by abort */
    _Atomic uint32_t failed; /* set once by the first rank that gives up */
    int32_t failed_rank;
    char why[300];
    shm_rank r[SF_COMM_MAX_RANKS];
} shm_hdr;

typedef struct cpu_comm {
    void *base;
    size_t map_len;
    shm_hdr *h;
    char *slots, *result;
    size_t slot_bytes;
    uint32_t seq;
    int pidfd[SF_COMM_MAX_RANKS];
    int broken;              /* sticky: the first error, returned again by every later call */
    char broken_msg[400];
} cpu_comm;

#define CC(c) ((cpu_comm *)(c)->ctx)

static size_t hdr_bytes(void) { return (sizeof(shm_hdr) + 4095) & ~(size_t)4095; }

static long futex(_Atomic uint32_t *uaddr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)uaddr, op, val, ts, NULL, 0);
}

int sf_comm_cpu_create(int size, size_t slot_bytes, int *fd, sf_error *err)
{
    *fd = -1;
    if (size < 1 || size > SF_COMM_MAX_RANKS)
        return sf_err(err, SF_EINVAL, "cpu communicator: %d ranks (1..%d)", size, SF_COMM_MAX_RANKS);
    slot_bytes = (SF_MAX(slot_bytes, (size_t)4096) + 63) & ~(size_t)63;
    size_t len = hdr_bytes() + (size_t)(size + 1) * slot_bytes;
    int f = (int)syscall(SYS_memfd_create, "semflow-tp", 0); /* no CLOEXEC: rank processes inherit it */
    if (f < 0) return sf_err(err, SF_EIO, "cpu communicator: memfd_create: %s", strerror(errno));
    if (ftruncate(f, (off_t)len) != 0) {
        int e = errno;
        close(f);
        return sf_err(err, SF_ENOMEM, "cpu communicator: ftruncate of the %zu-byte segment: %s", len, strerror(e));
    }
    shm_hdr *h = mmap(NULL, hdr_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (h == MAP_FAILED) {
        int e = errno;
        close(f);
        return sf_err(err, SF_EIO, "cpu communicator: mmap: %s", strerror(e));
    }
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->size = size;
    h->slot_bytes = slot_bytes;
    munmap(h, hdr_bytes());
    *fd = f;
    return SF_OK;
}

/* Fails the call and the group: peers waiting on us see `msg` and stop. */
static int fail(sf_comm *c, int code, sf_error *err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int fail(sf_comm *c, int code, sf_error *err, const char *fmt, ...)
{
    cpu_comm *x = CC(c);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->broken_msg, sizeof x->broken_msg, fmt, ap);
    va_end(ap);
    x->broken = code;
    c->ops->abort(c, x->broken_msg);
    return sf_err(err, code, "%s", x->broken_msg);
}

static void cpu_abort(sf_comm *c, const char *why)
{
    shm_hdr *h = CC(c)->h;
    uint32_t expect = 0;
    if (atomic_compare_exchange_strong(&h->failed, &expect, 1u)) {
        h->failed_rank = c->rank;
        snprintf(h->why, sizeof h->why, "%s", why ? why : "aborted");
    }
    atomic_fetch_add(&h->gen, 1);
    futex(&h->gen, FUTEX_WAKE, INT_MAX, NULL);
}

/* 1 if rank i's process has exited. */
static int peer_dead(cpu_comm *x, int i)
{
    int32_t pid = atomic_load(&x->h->r[i].pid);
    if (pid <= 0) return 0; /* not joined yet: covered by the timeout */
    if (x->pidfd[i] < 0) {
        x->pidfd[i] = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (x->pidfd[i] < 0) return errno == ESRCH || (kill(pid, 0) != 0 && errno == ESRCH);
    }
    struct pollfd p = { .fd = x->pidfd[i], .events = POLLIN };
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

/* Waits until every rank arrived at barrier `target`. idle: no timeout (see comm.h). */
static int wait_all(sf_comm *c, uint32_t target, int idle, const char *what, sf_error *err)
{
    cpu_comm *x = CC(c);
    shm_hdr *h = x->h;
    uint64_t t0 = sf_now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull;
    for (int spin = 0;; spin++) {
        uint32_t g = atomic_load(&h->gen);
        if (atomic_load(&h->failed))
            return fail(c, SF_ERROR, err, "rank %d: %s: the tensor-parallel group failed at rank %d: %s", c->rank, what,
                        h->failed_rank, h->why);
        int missing = -1;
        for (int i = 0; i < c->size && missing < 0; i++)
            if ((int32_t)(atomic_load(&h->r[i].seq) - target) < 0) missing = i;
        if (missing < 0) return SF_OK;
        if (spin < SPIN) {
            __builtin_ia32_pause();
            continue;
        }
        for (int i = 0; i < c->size; i++)
            if (i != c->rank && peer_dead(x, i))
                return fail(c, SF_ERROR, err, "rank %d: %s: rank %d (pid %d) has exited; the tensor-parallel group "
                            "cannot continue (that rank's stderr says why)", c->rank, what, i,
                            (int)atomic_load(&h->r[i].pid));
        uint64_t waited = sf_now_ns() - t0;
        if (!idle && waited >= limit) {
            int32_t pid = atomic_load(&h->r[missing].pid);
            if (pid <= 0)
                return fail(c, SF_ERROR, err, "rank %d: %s: rank %d did not join within %d ms (did its process "
                            "start? see its log)", c->rank, what, missing, c->timeout_ms);
            return fail(c, SF_ERROR, err, "rank %d: %s: rank %d (pid %d) is alive but did not arrive within %d ms "
                        "(hung or stopped; raise SEMFLOW_TP_TIMEOUT_MS if it is only slow)", c->rank, what, missing,
                        (int)pid, c->timeout_ms);
        }
        uint64_t slice = (uint64_t)WAIT_SLICE_MS * 1000000ull;
        if (!idle && limit - waited < slice) slice = limit - waited;
        struct timespec ts = { .tv_sec = (time_t)(slice / 1000000000ull), .tv_nsec = (long)(slice % 1000000000ull) };
        futex(&h->gen, FUTEX_WAIT, g, &ts);
    }
}

static int sync_point(sf_comm *c, int idle, const char *what, sf_error *err)
{
    cpu_comm *x = CC(c);
    shm_hdr *h = x->h;
    uint32_t target = ++x->seq;
    atomic_store(&h->r[c->rank].seq, target);
    atomic_fetch_add(&h->gen, 1);
    futex(&h->gen, FUTEX_WAKE, INT_MAX, NULL);
    return wait_all(c, target, idle, what, err);
}

static int check(sf_comm *c, sf_error *err)
{
    cpu_comm *x = CC(c);
    return x->broken ? sf_err(err, x->broken, "%s", x->broken_msg) : SF_OK;
}

static int cpu_barrier(sf_comm *c, sf_error *err)
{
    int rc = check(c, err);
    return rc ? rc : sync_point(c, 0, "barrier", err);
}

static int cpu_all_reduce(sf_comm *c, void *data, int64_t n, sf_dtype dt, void *stream, sf_error *err)
{
    cpu_comm *x = CC(c);
    int rc = check(c, err);
    if (rc) return rc;
    if (dt != SF_DT_F32)
        return sf_err(err, SF_EUNSUPPORTED, "rank %d: cpu all-reduce of %s (the CPU backend's activations are f32)",
                      c->rank, sf_dtype_name(dt));
    float *v = data;
    int64_t piece = (int64_t)(x->slot_bytes / sizeof(float));
    for (int64_t off = 0; off < n; off += piece) {
        int64_t cnt = SF_MIN(piece, n - off);
        memcpy(x->slots + (size_t)c->rank * x->slot_bytes, v + off, (size_t)cnt * sizeof(float));
        if ((rc = sync_point(c, 0, "all-reduce", err))) return rc;
        int64_t lo = cnt * c->rank / c->size, hi = cnt * (c->rank + 1) / c->size;
        float *out = (float *)x->result;
        const float *s0 = (const float *)x->slots;
        for (int64_t j = lo; j < hi; j++) out[j] = s0[j];
        for (int i = 1; i < c->size; i++) {
            const float *si = (const float *)(x->slots + (size_t)i * x->slot_bytes);
            for (int64_t j = lo; j < hi; j++) out[j] += si[j];
        }
        if ((rc = sync_point(c, 0, "all-reduce", err))) return rc;
        memcpy(v + off, out, (size_t)cnt * sizeof(float));
    }
    return SF_OK;
}

static int cpu_all_gather(sf_comm *c, const void *send, void *recv, size_t bytes, void *stream, sf_error *err)
{
    cpu_comm *x = CC(c);
    int rc = check(c, err);
    if (rc) return rc;
    for (size_t off = 0; off < bytes; off += x->slot_bytes) {
        size_t cnt = SF_MIN(x->slot_bytes, bytes - off);
        memcpy(x->slots + (size_t)c->rank * x->slot_bytes, (const char *)send + off, cnt);
        if ((rc = sync_point(c, 0, "all-gather", err))) return rc;
        for (int i = 0; i < c->size; i++)
            memcpy((char *)recv + (size_t)i * bytes + off, x->slots + (size_t)i * x->slot_bytes, cnt);
        if ((rc = sync_point(c, 0, "all-gather", err))) return rc;
    }
    return SF_OK;
}

static int cpu_copy_2d(sf_comm *c, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                       size_t height, void *stream, sf_error *err)
{
    (void)stream;
    int rc = check(c, err);
    if (rc) return rc;
    for (size_t i = 0; i < height; i++) memcpy((char *)dst + i * dpitch, (const char *)src + i * spitch, width);
    return SF_OK;
}

static int cpu_broadcast(sf_comm *c, void *data, size_t bytes, int root, int idle, sf_error *err)
{
    cpu_comm *x = CC(c);
    int rc = check(c, err);
    if (rc) return rc;
    if (root < 0 || root >= c->size)
        return sf_err(err, SF_EINVAL, "rank %d: broadcast from rank %d of %d", c->rank, root, c->size);
    char *slot = x->slots + (size_t)root * x->slot_bytes;
    for (size_t off = 0; off < bytes || (off == 0 && bytes == 0); off += x->slot_bytes) {
        size_t cnt = SF_MIN(x->slot_bytes, bytes - off);
        if (c->rank == root) memcpy(slot, (const char *)data + off, cnt);
        if ((rc = sync_point(c, idle && off == 0 && c->rank != root, "broadcast", err))) return rc;
        if (c->rank != root) memcpy((char *)data + off, slot, cnt);
        if ((rc = sync_point(c, 0, "broadcast", err))) return rc;
        if (bytes == 0) break;
    }
    return SF_OK;
}

static void cpu_destroy(sf_comm *c)
{
    if (!c) return;
    cpu_comm *x = CC(c);
    if (x) {
        for (int i = 0; i < SF_COMM_MAX_RANKS; i++)
            if (x->pidfd[i] >= 0) close(x->pidfd[i]);
        if (x->base) munmap(x->base, x->map_len);
        free(x);
    }
    free(c);
}

static const struct sf_comm_ops cpu_comm_ops = {
    .name = "cpu-shm",
    .all_reduce_sum = cpu_all_reduce,
    .all_gather = cpu_all_gather,
    .copy_2d = cpu_copy_2d,
    .broadcast = cpu_broadcast,
    .barrier = cpu_barrier,
    .abort = cpu_abort,
    .destroy = cpu_destroy,
};

int sf_comm_cpu_open(const sf_comm_opts *o, sf_comm **out, sf_error *err)
{
    *out = NULL;
    int rc = SF_OK;
    sf_comm *c = calloc(1, sizeof *c);
    cpu_comm *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return sf_err(err, SF_ENOMEM, "cpu communicator: out of memory");
    }
    c->ops = &cpu_comm_ops;
    c->ctx = x;
    c->rank = o->rank;
    c->size = o->size;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : sf_comm_default_timeout_ms();
    for (int i = 0; i < SF_COMM_MAX_RANKS; i++) x->pidfd[i] = -1;

    struct stat st;
    if (o->shm_fd < 0 || fstat(o->shm_fd, &st) != 0 || (size_t)st.st_size < hdr_bytes()) {
        rc = sf_err(err, SF_EINVAL, "rank %d: cpu communicator: fd %d is not a tensor-parallel segment (%s)", o->rank,
                    o->shm_fd, o->shm_fd < 0 ? "no fd" : "too small or not open");
        goto fail;
    }
    x->map_len = (size_t)st.st_size;
    x->base = mmap(NULL, x->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, o->shm_fd, 0);
    if (x->base == MAP_FAILED) {
        x->base = NULL;
        rc = sf_err(err, SF_EIO, "rank %d: cpu communicator: mmap of fd %d: %s", o->rank, o->shm_fd, strerror(errno));
        goto fail;
    }
    x->h = x->base;
    if (x->h->magic != SHM_MAGIC || x->h->version != SHM_VERSION || x->h->size != o->size ||
        hdr_bytes() + (size_t)(o->size + 1) * x->h->slot_bytes > x->map_len) {
        rc = sf_err(err, SF_EINVAL, "rank %d: cpu communicator: the segment is for %d ranks (version %u), this rank "
                    "was started for %d (start every rank from the same leader)", o->rank, x->h->size,
                    x->h->version, o->size);
        goto fail;
    }
    x->slot_bytes = x->h->slot_bytes;
    x->slots = (char *)x->base + hdr_bytes();
    x->result = x->slots + (size_t)o->size * x->slot_bytes;
    if (atomic_load(&x->h->r[o->rank].pid) != 0) {
        rc = sf_err(err, SF_EINVAL, "rank %d: cpu communicator: rank %d already joined this group (pid %d)", o->rank,
                    o->rank, (int)atomic_load(&x->h->r[o->rank].pid));
        goto fail;
    }
    atomic_store(&x->h->r[o->rank].pid, (int32_t)getpid());
    if ((rc = sync_point(c, 0, "joining the group", err))) goto fail;
    *out = c;
    return SF_OK;
fail:
    cpu_destroy(c);
    return rc;
}
