/* comm_nccl.c — the CUDA backend's communicator: NCCL for the activations, TCP for the rest.
 *
 * Bootstrap: rank 0 listens on the bootstrap address ("host:port"), every other rank connects
 * (retrying until the timeout: rank 0 may start later) and says who it is; rank 0 makes the
 * ncclUniqueId and sends it to each, and all call ncclCommInitRank. Nothing assumes one host:
 * the same code joins GPUs of several hosts when the address is reachable from them.
 * The TCP connections stay open (a star around rank 0) and carry the host-side traffic: the
 * step plan's broadcast and barriers. EOF on them is how ranks learn that a peer died.
 *
 * NCCL is loaded with dlopen("libnccl.so.2"), so the binary runs where NCCL is absent (TP then
 * reports SF_ENODEV). NVLink SHARP / multicast stays off: NCCL_NVLS_ENABLE=0 is set before
 * init unless the environment set it, and nothing here calls cuMulticastCreate.
 *
 * Waits: collectives are queued on the backend's stream without a host sync. all_gather (once
 * per step, at its end) waits for the stream with a watchdog: while the stream is busy it
 * checks ncclCommGetAsyncError, the peers' sockets and the timeout, and on failure calls
 * ncclCommAbort (which releases kernels stuck on a dead peer) and reports the rank and call.
 *
 * Small all-reduces (decode: one row per token) take the one-shot peer-memory kernel of
 * comm_custom.c where it is faster: at open, every rank times NCCL and that kernel over message
 * sizes from 2 KiB up (wall time per call, launches included), and rank 0's figures give the
 * crossover (the largest size up to which
 * the custom path wins at every size), which every rank then uses, so the ranks always pick the
 * same path for a message. It is measured at every open (the best of 3 passes) and written to
 * a record file (comm.c) keyed by the ranks' GPUs and the NCCL version; $SEMFLOW_TP_ALLREDUCE=nccl|custom|oneshot|ll forces a
 * path. The own path has two kernels (kernels/cuda/allreduce.h): LL for the sizes where it was
 * measured faster than the one-shot kernel, the one-shot kernel above ($SEMFLOW_TP_LL=0 keeps
 * AUTO off LL). */
#include "comm.h"

#include <stdlib.h>
#include <string.h>

#if defined(SF_HAVE_CUDA) && __has_include(<nccl.h>)
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <nccl.h>

#include "comm_custom.h"

/* largest message the custom path can take: a decode step of 256 rows of 8192 (70B), inside the
 * step graph (an NCCL call ends it) */
#define AR_CUSTOM_BYTES ((size_t)4 << 20)

#define BOOT_MAGIC 0x53464e43u /* "SFNC" */

typedef struct nccl_api {
    void *so;
    __typeof__(ncclGetUniqueId) *GetUniqueId;
    __typeof__(ncclCommInitRank) *CommInitRank;
    __typeof__(ncclAllReduce) *AllReduce;
    __typeof__(ncclAllGather) *AllGather;
    __typeof__(ncclCommGetAsyncError) *CommGetAsyncError;
    __typeof__(ncclCommAbort) *CommAbort;
    __typeof__(ncclCommDestroy) *CommDestroy;
    __typeof__(ncclGetErrorString) *GetErrorString;
    __typeof__(ncclGetVersion) *GetVersion;
} nccl_api;

typedef struct nccl_comm {
    nccl_api api;
    ncclComm_t comm;
    int device;
    int peer[SF_COMM_MAX_RANKS]; /* rank 0: socket to each rank; others: peer[0] to rank 0 */
    int broken;
    char broken_msg[400];
    sf_ar_custom *ar;    /* the peer-memory all-reduce; NULL: NCCL only */
    int captured;        /* an NCCL call was captured into a CUDA graph (see nccl_abort) */
    /* sf_comm_mark's markers: a ring of events, [mark_r, mark_r + n_marks) recorded, unwaited */
    cudaEvent_t marks[SF_COMM_MARKS];
    int mark_r, n_marks;
} nccl_comm;

#define NC(c) ((nccl_comm *)(c)->ctx)

static int load_api(nccl_api *a, sf_error *err)
{
    a->so = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!a->so)
        return sf_err(err, SF_ENODEV, "NCCL: dlopen(libnccl.so.2) failed (%s); install NCCL or add its folder to "
                      "LD_LIBRARY_PATH to use --tensor-parallel-size on GPUs", dlerror());
#define SYM(field, name)                                                                               \
    if (!(a->field = (__typeof__(a->field))dlsym(a->so, name)))                                        \
        return sf_err(err, SF_ENODEV, "NCCL: libnccl.so.2 lacks %s (too old? NCCL 2.12 or newer)", name);
    SYM(GetUniqueId, "ncclGetUniqueId");
    SYM(CommInitRank, "ncclCommInitRank");
    SYM(AllReduce, "ncclAllReduce");
    SYM(AllGather, "ncclAllGather");
    SYM(CommGetAsyncError, "ncclCommGetAsyncError");
    SYM(CommAbort, "ncclCommAbort");
    SYM(CommDestroy, "ncclCommDestroy");
    SYM(GetErrorString, "ncclGetErrorString");
    SYM(GetVersion, "ncclGetVersion");
#undef SYM
    return SF_OK;
}

static void nccl_abort(sf_comm *c, const char *why)
{
    nccl_comm *x = NC(c);
    if (!x->broken) {
        x->broken = SF_ERROR;
        snprintf(x->broken_msg, sizeof x->broken_msg, "%s", why ? why : "aborted");
    }
    /* NCCL's abort (and destroy) wait until every graph that captured its calls is destroyed;
     * after a failure those graphs cannot be torn down safely (a kernel may be stuck on the dead
     * peer), so the communicator is left to the process's exit instead of hanging here. */
    if (x->comm && !x->captured) x->api.CommAbort(x->comm);
    else if (x->comm) SF_LOGW("rank %d: NCCL calls are held by CUDA graphs: NCCL is not aborted, the process must exit",
                              c->rank);
    x->comm = NULL;
    for (int i = 0; i < SF_COMM_MAX_RANKS; i++)
        if (x->peer[i] >= 0) {
            close(x->peer[i]); /* peers see EOF */
            x->peer[i] = -1;
        }
}

static int fail(sf_comm *c, sf_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(sf_comm *c, sf_error *err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    nccl_abort(c, msg);
    return sf_err(err, SF_ERROR, "%s", msg);
}

static int check(sf_comm *c, sf_error *err)
{
    nccl_comm *x = NC(c);
    return x->broken ? sf_err(err, x->broken, "%s", x->broken_msg) : SF_OK;
}

/* ---- TCP --------------------------------------------------------------------------------- */
/* Moves exactly n bytes (send or recv) with a deadline; idle: no deadline. */
static int xfer(sf_comm *c, int fd, void *buf, size_t n, int sending, int idle, int peer, const char *what,
                sf_error *err)
{
    uint64_t t0 = sf_now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull;
    char *p = buf;
    while (n > 0) {
        struct pollfd pf = { .fd = fd, .events = sending ? POLLOUT : POLLIN };
        uint64_t waited = sf_now_ns() - t0;
        if (!idle && waited >= limit)
            return fail(c, err, "rank %d: %s: rank %d did not answer within %d ms (hung? raise SEMFLOW_TP_TIMEOUT_MS "
                        "if it is only slow)", c->rank, what, peer, c->timeout_ms);
        int ms = idle ? 1000 : (int)((limit - waited) / 1000000ull) + 1;
        int pr = poll(&pf, 1, ms);
        if (pr < 0 && errno != EINTR) return fail(c, err, "rank %d: %s: poll: %s", c->rank, what, strerror(errno));
        if (pr <= 0) continue;
        ssize_t k = sending ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k <= 0)
            return fail(c, err, "rank %d: %s: the connection to rank %d closed (%s): that rank exited or gave up; "
                        "see its log", c->rank, what, peer, k == 0 ? "EOF" : strerror(errno));
        p += k;
        n -= (size_t)k;
    }
    return SF_OK;
}

static int parse_addr(const char *s, char *host, size_t hn, char *port, size_t pn)
{
    const char *colon = s ? strrchr(s, ':') : NULL;
    if (!colon || colon == s || !colon[1] || (size_t)(colon - s) >= hn || strlen(colon + 1) >= pn) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = 0;
    snprintf(port, pn, "%s", colon + 1);
    return 0;
}

static int bootstrap(sf_comm *c, const char *addr, ncclUniqueId *id, sf_error *err)
{
    nccl_comm *x = NC(c);
    char host[256], port[16];
    if (parse_addr(addr, host, sizeof host, port, sizeof port))
        return sf_err(err, SF_EINVAL, "rank %d: NCCL bootstrap address '%s' is not host:port", c->rank,
                      addr ? addr : "(none)");
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = c->rank ? 0 : AI_PASSIVE };
    struct addrinfo *ai = NULL;
    int gai = getaddrinfo(host, port, &hints, &ai);
    if (gai) return sf_err(err, SF_EINVAL, "rank %d: NCCL bootstrap address %s: %s", c->rank, addr, gai_strerror(gai));
    int rc = SF_OK, one = 1;
    uint32_t hello[3];
    uint64_t t0 = sf_now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull;
    if (c->rank == 0) {
        int ls = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ls < 0 || bind(ls, ai->ai_addr, ai->ai_addrlen) || listen(ls, SF_COMM_MAX_RANKS)) {
            rc = sf_err(err, SF_EIO, "rank 0: NCCL bootstrap: cannot listen on %s: %s (the port was taken after it "
                        "was chosen? start again)", addr, strerror(errno));
            if (ls >= 0) close(ls);
            goto out;
        }
        if ((rc = x->api.GetUniqueId(id)) != ncclSuccess) {
            rc = sf_err(err, SF_ERROR, "rank 0: ncclGetUniqueId: %s", x->api.GetErrorString((ncclResult_t)rc));
            close(ls);
            goto out;
        }
        for (int joined = 1; joined < c->size;) {
            struct pollfd pf = { .fd = ls, .events = POLLIN };
            uint64_t waited = sf_now_ns() - t0;
            if (waited >= limit || poll(&pf, 1, (int)((limit - waited) / 1000000ull) + 1) == 0) {
                rc = sf_err(err, SF_ERROR, "rank 0: NCCL bootstrap: %d of %d ranks joined within %d ms on %s", joined,
                            c->size, c->timeout_ms, addr);
                break;
            }
            int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
            if (s < 0) continue;
            setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            struct timeval tv = { .tv_sec = 2 }, none = { 0 };
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            /* a stray or wrong connection is dropped, not the group's failure */
            if (recv(s, hello, sizeof hello, MSG_WAITALL) != (ssize_t)sizeof hello || hello[0] != BOOT_MAGIC ||
                (int)hello[2] != c->size || hello[1] < 1 || (int)hello[1] >= c->size || x->peer[hello[1]] >= 0) {
                SF_LOGW("rank 0: NCCL bootstrap: dropped a connection that is not a rank of this group");
                close(s);
                continue;
            }
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
            x->peer[hello[1]] = s;
            joined++;
        }
        close(ls);
        for (int i = 1; i < c->size && !rc; i++)
            rc = xfer(c, x->peer[i], id, sizeof *id, 1, 0, i, "sending the ncclUniqueId", err);
    } else {
        int s = -1;
        while (s < 0) {
            s = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (s >= 0 && connect(s, ai->ai_addr, ai->ai_addrlen) == 0) break;
            if (s >= 0) close(s);
            s = -1;
            if (sf_now_ns() - t0 >= limit) {
                rc = sf_err(err, SF_ERROR, "rank %d: NCCL bootstrap: rank 0 at %s did not accept within %d ms",
                            c->rank, addr, c->timeout_ms);
                goto out;
            }
            usleep(50000);
        }
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        x->peer[0] = s;
        hello[0] = BOOT_MAGIC;
        hello[1] = (uint32_t)c->rank;
        hello[2] = (uint32_t)c->size;
        if (!(rc = xfer(c, s, hello, sizeof hello, 1, 0, 0, "bootstrap hello", err)))
            rc = xfer(c, s, id, sizeof *id, 0, 0, 0, "receiving the ncclUniqueId", err);
    }
out:
    freeaddrinfo(ai);
    return rc;
}

/* ---- collectives ------------------------------------------------------------------------- */
static int nccl_call(sf_comm *c, ncclResult_t r, const char *call, sf_error *err)
{
    if (r == ncclSuccess) return SF_OK;
    return fail(c, err, "rank %d: %s failed: %s", c->rank, call, NC(c)->api.GetErrorString(r));
}

/* Waits for the stream with the watchdog described at the top. */
/* Waits until everything queued on s (ev == NULL), or before ev, has completed. */
static int wait_done(sf_comm *c, cudaStream_t s, cudaEvent_t ev, const char *what, sf_error *err)
{
    nccl_comm *x = NC(c);
    uint64_t t0 = sf_now_ns(), limit = (uint64_t)c->timeout_ms * 1000000ull, next_check = t0 + 200000;
    for (;;) {
        cudaError_t e = ev ? cudaEventQuery(ev) : cudaStreamQuery(s);
        if (e == cudaSuccess) return SF_OK;
        if (e != cudaErrorNotReady)
            return fail(c, err, "rank %d: %s: %s: %s", c->rank, what, ev ? "cudaEventQuery" : "cudaStreamQuery",
                        cudaGetErrorString(e));
        /* a step ends here: spin (a sleep would add its wake-up latency to every step), and look
         * at the peers, NCCL and the clock every 0.2 ms; sleep only once a wait has gone long */
        uint64_t now = sf_now_ns();
        if (now < next_check) continue;
        next_check = now + 200000;
        if (now - t0 > 20000000ull) usleep(50);
        int late = sf_ar_custom_failed(x->ar);
        if (late)
            return fail(c, err, "rank %d: %s: the peer-memory all-reduce waited longer than %d ms for rank %d (hung or "
                        "exited); aborting", c->rank, what, c->timeout_ms, late - 1);
        ncclResult_t ae = ncclSuccess;
        if (x->api.CommGetAsyncError(x->comm, &ae) != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress))
            return fail(c, err, "rank %d: %s: NCCL reports %s", c->rank, what, x->api.GetErrorString(ae));
        for (int i = 0; i < c->size; i++) { /* a peer's socket readable here means EOF: it died */
            if (x->peer[i] < 0) continue;
            struct pollfd pf = { .fd = x->peer[i], .events = POLLIN };
            char b;
            if (poll(&pf, 1, 0) == 1 && recv(x->peer[i], &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
                return fail(c, err, "rank %d: %s: rank %d exited (its connection closed); aborting NCCL", c->rank,
                            what, i);
        }
        if (sf_now_ns() - t0 >= limit)
            return fail(c, err, "rank %d: %s did not complete within %d ms (a peer hung); aborting NCCL", c->rank, what,
                        c->timeout_ms);
    }
}

static int wait_stream(sf_comm *c, cudaStream_t s, const char *what, sf_error *err)
{
    return wait_done(c, s, NULL, what, err);
}

static int nccl_mark(sf_comm *c, void *stream, sf_error *err)
{
    nccl_comm *x = NC(c);
    int rc = check(c, err);
    if (rc) return rc;
    if (x->n_marks == SF_COMM_MARKS)
        return sf_err(err, SF_EINVAL, "rank %d: %d marks not waited for already (sf_comm_wait_mark first)", c->rank,
                      SF_COMM_MARKS);
    int i = (x->mark_r + x->n_marks) % SF_COMM_MARKS;
    cudaError_t e = x->marks[i] ? cudaSuccess : cudaEventCreateWithFlags(&x->marks[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(x->marks[i], (cudaStream_t)stream);
    if (e != cudaSuccess) return fail(c, err, "rank %d: marking the stream: %s", c->rank, cudaGetErrorString(e));
    x->n_marks++;
    return SF_OK;
}

static int nccl_wait_mark(sf_comm *c, const char *what, sf_error *err)
{
    nccl_comm *x = NC(c);
    int rc = check(c, err);
    if (rc) return rc;
    if (!x->n_marks) return sf_err(err, SF_EINVAL, "rank %d: %s: no mark to wait for", c->rank, what);
    rc = wait_done(c, NULL, x->marks[x->mark_r], what, err);
    x->mark_r = (x->mark_r + 1) % SF_COMM_MARKS;
    x->n_marks--;
    return rc;
}

static int nccl_all_reduce(sf_comm *c, void *data, int64_t n, sf_dtype dt, void *stream, sf_error *err)
{
    int rc = check(c, err);
    if (rc) return rc;
    if (dt != SF_DT_BF16 && dt != SF_DT_F32)
        return sf_err(err, SF_EUNSUPPORTED, "rank %d: NCCL all-reduce of %s", c->rank, sf_dtype_name(dt));
    if (NC(c)->ar && sf_comm_takes_custom(c, n, dt)) {
        sf_ar_kernel k = sf_comm_takes_ll(c, n, dt) ? SF_AR_LL : SF_AR_ONESHOT;
        if ((rc = sf_ar_custom_run(NC(c)->ar, data, n, k, stream, err)))
            return fail(c, err, "%s", err->msg);
        return SF_OK;
    }
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing((cudaStream_t)stream, &cs) == cudaSuccess && cs != cudaStreamCaptureStatusNone)
        NC(c)->captured = 1;
    return nccl_call(c, NC(c)->api.AllReduce(data, data, (size_t)n, dt == SF_DT_BF16 ? ncclBfloat16 : ncclFloat32,
                                             ncclSum, NC(c)->comm, (cudaStream_t)stream),
                     "ncclAllReduce", err);
}

static int nccl_all_reduce_norm(sf_comm *c, const sf_coll_norm *a, void *stream, sf_error *err)
{
    int rc = check(c, err);
    if (rc) return rc;
    if (!NC(c)->ar) return sf_err(err, SF_EUNSUPPORTED, "rank %d: all-reduce + rmsnorm without peer memory", c->rank);
    if ((rc = sf_ar_custom_run_norm(NC(c)->ar, a,
                                    (c->norm_pdl ? SF_AR_NORM_PDL : 0) | (c->norm_early ? SF_AR_NORM_EARLY : 0), stream,
                                    err))) return fail(c, err, "%s", err->msg);
    return SF_OK;
}

static int nccl_all_gather(sf_comm *c, const void *send, void *recv, size_t bytes, void *stream, sf_error *err)
{
    int rc = check(c, err);
    if (rc) return rc;
    if ((rc = nccl_call(c, NC(c)->api.AllGather(send, recv, bytes, ncclUint8, NC(c)->comm, (cudaStream_t)stream),
                        "ncclAllGather", err)))
        return rc;
    if (c->gather_nowait) return SF_OK; /* the caller waits (nccl_wait) */
    return wait_stream(c, (cudaStream_t)stream, "the step's all-reduces and logit all-gather", err);
}

static int nccl_wait(sf_comm *c, void *stream, const char *what, sf_error *err)
{
    int rc = check(c, err);
    return rc ? rc : wait_stream(c, (cudaStream_t)stream, what, err);
}

static int nccl_copy_2d(sf_comm *c, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height, void *stream, sf_error *err)
{
    int rc = check(c, err);
    if (rc) return rc;
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToDevice,
                                      (cudaStream_t)stream);
    if (e != cudaSuccess)
        return fail(c, err, "rank %d: laying out the gathered logits: cudaMemcpy2DAsync of %zu rows of %zu bytes: %s",
                    c->rank, height, width, cudaGetErrorString(e));
    return SF_OK;
}

static int nccl_broadcast(sf_comm *c, void *data, size_t bytes, int root, int idle, sf_error *err)
{
    nccl_comm *x = NC(c);
    int rc = check(c, err);
    if (rc) return rc;
    if (root != 0)
        return sf_err(err, SF_EUNSUPPORTED, "rank %d: the NCCL communicator broadcasts host bytes from rank 0 only "
                      "(asked for rank %d)", c->rank, root);
    if (c->rank == 0) {
        for (int i = 1; i < c->size && !rc; i++)
            rc = xfer(c, x->peer[i], data, bytes, 1, 0, i, "broadcast", err);
        return rc;
    }
    return xfer(c, x->peer[0], data, bytes, 0, idle, 0, "broadcast", err);
}

static int nccl_barrier(sf_comm *c, sf_error *err)
{
    nccl_comm *x = NC(c);
    int rc = check(c, err);
    char b = 1;
    if (rc) return rc;
    if (c->rank == 0) {
        for (int i = 1; i < c->size && !rc; i++) rc = xfer(c, x->peer[i], &b, 1, 0, 0, i, "barrier", err);
        for (int i = 1; i < c->size && !rc; i++) rc = xfer(c, x->peer[i], &b, 1, 1, 0, i, "barrier", err);
        return rc;
    }
    if ((rc = xfer(c, x->peer[0], &b, 1, 1, 0, 0, "barrier", err))) return rc;
    return xfer(c, x->peer[0], &b, 1, 0, 0, 0, "barrier", err);
}

static void nccl_destroy(sf_comm *c)
{
    if (!c) return;
    nccl_comm *x = NC(c);
    if (x) {
        if (x->comm) {
            cudaSetDevice(x->device);
            x->api.CommDestroy(x->comm);
        }
        sf_ar_custom_free(x->ar);
        for (int i = 0; i < SF_COMM_MARKS; i++)
            if (x->marks[i]) cudaEventDestroy(x->marks[i]);
        for (int i = 0; i < SF_COMM_MAX_RANKS; i++)
            if (x->peer[i] >= 0) close(x->peer[i]);
        if (x->api.so) dlclose(x->api.so);
        free(x);
    }
    free(c);
}

/* ---- the custom path: setup and crossover ------------------------------------------------- */
/* all[size * bytes] = every rank's mine, over the bootstrap star (sf_ar_exchange_fn). */
static int exchange(void *ctx, const void *mine, size_t bytes, void *all, sf_error *err)
{
    sf_comm *c = ctx;
    nccl_comm *x = NC(c);
    char *a = all;
    int rc = SF_OK;
    memcpy(a + (size_t)c->rank * bytes, mine, bytes);
    if (c->rank == 0) {
        for (int i = 1; i < c->size && !rc; i++)
            rc = xfer(c, x->peer[i], a + (size_t)i * bytes, bytes, 0, 0, i, "peer-memory setup", err);
        for (int i = 1; i < c->size && !rc; i++)
            rc = xfer(c, x->peer[i], a, (size_t)c->size * bytes, 1, 0, i, "peer-memory setup", err);
        return rc;
    }
    if ((rc = xfer(c, x->peer[0], (void *)mine, bytes, 1, 0, 0, "peer-memory setup", err))) return rc;
    return xfer(c, x->peer[0], a, (size_t)c->size * bytes, 0, 0, 0, "peer-memory setup", err);
}

#define XO_SIZES 12 /* 2 KiB .. 4 MiB */
#define XO_PATHS 3  /* NCCL, one-shot, LL */

/* Every rank: µs per all-reduce of each size on each path (us[path][size]; 0: the path cannot
 * take that size), the way a step pays for it: wall time from queueing `iters` calls back to
 * back until they completed (launches included — events on the GPU would hide NCCL's host
 * cost), after a barrier and 5 untimed calls; the best of XO_REPS passes over all sizes and
 * paths, so that one disturbed pass does not decide. */
#define XO_REPS 3
static int measure(sf_comm *c, cudaStream_t s, void *buf, size_t *bytes, double us[XO_PATHS][XO_SIZES], int ll,
                   sf_error *err)
{
    static const sf_comm_path paths[XO_PATHS] = { SF_COMM_PATH_NCCL, SF_COMM_PATH_ONESHOT, SF_COMM_PATH_LL };
    int rc = SF_OK, iters = 20;
    sf_comm_path keep = c->path;
    for (int i = 0; i < XO_SIZES; i++) {
        bytes[i] = (size_t)2048 << i;
        for (int p = 0; p < XO_PATHS; p++) us[p][i] = 0;
    }
    for (int rep = 0; rep < XO_REPS && !rc; rep++)
        for (int i = 0; i < XO_SIZES && !rc; i++)
            for (int p = 0; p < XO_PATHS && !rc; p++) {
                if (paths[p] == SF_COMM_PATH_LL && (!ll || bytes[i] > c->ll_cap_bytes))
                    continue; /* the same on every rank */
                c->path = paths[p];
                double t0 = 0;
                if ((rc = nccl_barrier(c, err))) break;
                for (int k = 0; k < 5 + iters && !rc; k++) {
                    if (k == 5) {
                        if ((rc = wait_stream(c, s, "measuring the all-reduce crossover", err))) break;
                        t0 = sf_now_s();
                    }
                    rc = nccl_all_reduce(c, buf, (int64_t)(bytes[i] / 2), SF_DT_BF16, s, err);
                }
                if (!rc) rc = wait_stream(c, s, "measuring the all-reduce crossover", err);
                double t = (sf_now_s() - t0) * 1e6 / iters;
                if (!rc && (us[p][i] <= 0 || t < us[p][i])) us[p][i] = t;
            }
    c->path = keep;
    return rc;
}

/* Sets c->custom_max_bytes and c->ll_max_bytes the same on every rank, from rank 0's
 * measurement at this open. LL takes the sizes up to which it beats the one-shot kernel at
 * every size (by 5%); the own path (LL there, one-shot above) takes the sizes up to which it
 * beats NCCL at every size. ll: whether AUTO may take LL at all (the same on every rank); when
 * not, LL is not measured and runs only when forced.
 * Measured at every open (about 0.1 s): a figure cached from an earlier, disturbed run once
 * sent every later run's decode all-reduces to NCCL. The measurement is still written to
 * $XDG_CACHE_HOME/semflow/allreduce-<key>.json as a record. */
static int crossover(sf_comm *c, int ll, sf_error *err)
{
    nccl_comm *x = NC(c);
    char key[SF_COMM_MAX_RANKS * 20 + 64], key_ll[sizeof key + 8];
    int ver = 0, rc;
    x->api.GetVersion(&ver);
    snprintf(key, sizeof key, "r%d-nccl%d-w3%s-%s", c->size, ver, ll ? "ll" : "", sf_ar_custom_gpus(x->ar));
    snprintf(key_ll, sizeof key_ll, "%s-ll", key);
    uint64_t have[2] = { 0, 0 }; /* crossover, LL crossover */
    size_t bytes[XO_SIZES];
    double us[XO_PATHS][XO_SIZES], own[XO_SIZES];
    cudaStream_t s = NULL;
    void *buf = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&buf, AR_CUSTOM_BYTES) != cudaSuccess || cudaMemset(buf, 0, AR_CUSTOM_BYTES) != cudaSuccess) {
        cudaGetLastError();
        rc = fail(c, err, "rank %d: all-reduce crossover: no stream or %zu bytes of device memory", c->rank,
                  AR_CUSTOM_BYTES);
    } else {
        rc = measure(c, s, buf, bytes, us, ll, err);
    }
    if (buf) cudaFree(buf);
    if (s) cudaStreamDestroy(s);
    if (rc) return rc;
    if (c->rank == 0) {
        have[1] = sf_comm_pick_crossover(bytes, us[1], us[2], XO_SIZES, 0.05);
        for (int i = 0; i < XO_SIZES; i++) own[i] = bytes[i] <= have[1] ? us[2][i] : us[1][i];
        have[0] = sf_comm_pick_crossover(bytes, us[0], own, XO_SIZES, 0.05);
        sf_comm_crossover_save(key, (size_t)have[0], bytes, us[0], own, XO_SIZES);
        sf_comm_crossover_save(key_ll, (size_t)have[1], bytes, us[1], us[2], XO_SIZES);
        char line[1000] = "";
        for (int i = 0; i < XO_SIZES; i++)
            snprintf(line + strlen(line), sizeof line - strlen(line), " %zuK %.1f/%.1f/%.1f", bytes[i] >> 10,
                     us[0][i], us[1][i], us[2][i]);
        SF_LOGI("all-reduce us per call, NCCL/one-shot/LL (0: not measured):%s", line);
    }
    if ((rc = nccl_broadcast(c, have, sizeof have, 0, 0, err))) return rc;
    c->custom_max_bytes = (size_t)have[0];
    c->ll_max_bytes = SF_MIN((size_t)have[1], c->ll_cap_bytes);
    if (c->rank == 0)
        SF_LOGI("all-reduce: peer memory up to %zu bytes (LL up to %zu, one-shot above), NCCL above", c->custom_max_bytes,
                c->ll_max_bytes);
    return SF_OK;
}

/* The custom path where every rank can map every other's memory; else NCCL alone. */
static int custom_setup(sf_comm *c, sf_error *err)
{
    nccl_comm *x = NC(c);
    static const char *const paths[] = { "auto", "nccl", "custom", "oneshot", "ll" };
    static const sf_comm_path path_of[] = { SF_COMM_PATH_AUTO, SF_COMM_PATH_NCCL, SF_COMM_PATH_CUSTOM,
                                            SF_COMM_PATH_ONESHOT, SF_COMM_PATH_LL };
    c->base_in_graph = sf_env_bool("SEMFLOW_TP_NCCL_GRAPH", 0);
    c->path = path_of[sf_env_choice("SEMFLOW_TP_ALLREDUCE", 0, paths, (int)SF_ARRAY_LEN(paths))];
    if (c->path == SF_COMM_PATH_NCCL || c->size > SF_COMM_MAX_RANKS) return SF_OK;
    sf_error e2 = { 0 };
    int rc = sf_ar_custom_open(c->rank, c->size, x->device, AR_CUSTOM_BYTES, c->timeout_ms, exchange, c, &x->ar, &e2);
    if (rc == SF_EUNSUPPORTED) {
        if (c->rank == 0) SF_LOGI("%s", e2.msg);
        return SF_OK;
    }
    if (rc) return sf_err(err, rc, "%s", e2.msg);
    c->custom_cap_bytes = sf_ar_custom_cap(x->ar);
    c->ll_cap_bytes = sf_ar_custom_ll_cap(x->ar);
    /* the fused all-reduce + rmsnorm: on unless SEMFLOW_TP_ARNORM=0, from
     * $SEMFLOW_TP_ARNORM_MIN_ROWS rows (default 128: below, LL or one-shot then the rmsnorm kernel
     * measured as fast or faster, docs/TP.md) */
    c->norm_max_bytes = sf_env_bool("SEMFLOW_TP_ARNORM", 1) ? c->custom_cap_bytes : 0;
    c->norm_max_cols = SF_AR_NORM_MAX_COLS;
    c->norm_min_rows = (int)sf_env_long("SEMFLOW_TP_ARNORM_MIN_ROWS", 128, 1, 1 << 20);
    /* off until a device call measures them against session 5's kernel (docs/PERFORMANCE.md) */
    c->norm_pdl = sf_env_bool("SEMFLOW_TP_ARNORM_PDL", 0);
    c->norm_early = sf_env_bool("SEMFLOW_TP_ARNORM_EARLY", 0);
    /* LL: on unless SEMFLOW_TP_LL=0 (the launcher passes its environment to every rank); it won
     * at every size up to 512 KiB on the H200 pair (docs/PERFORMANCE.md) */
    return crossover(c, sf_env_bool("SEMFLOW_TP_LL", 1), err);
}

static const struct sf_comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .copy_2d = nccl_copy_2d,
    .wait = nccl_wait,
    .mark = nccl_mark,
    .wait_mark = nccl_wait_mark,
    .all_reduce_norm = nccl_all_reduce_norm,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

int sf_comm_nccl_open(const sf_comm_opts *o, sf_comm **out, sf_error *err)
{
    *out = NULL;
    int rc;
    sf_comm *c = calloc(1, sizeof *c);
    nccl_comm *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return sf_err(err, SF_ENOMEM, "NCCL communicator: out of memory");
    }
    c->ops = &nccl_ops;
    c->ctx = x;
    c->rank = o->rank;
    c->size = o->size;
    c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : sf_comm_default_timeout_ms();
    x->device = o->device;
    for (int i = 0; i < SF_COMM_MAX_RANKS; i++) x->peer[i] = -1;
    setenv("NCCL_NVLS_ENABLE", "0", 0); /* multicast objects stay off (see the header) */
    if ((rc = load_api(&x->api, err))) goto fail;
    cudaError_t ce = cudaSetDevice(o->device);
    if (ce != cudaSuccess) {
        rc = sf_err(err, SF_ENODEV, "rank %d: cudaSetDevice(%d): %s", o->rank, o->device, cudaGetErrorString(ce));
        goto fail;
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if ((rc = bootstrap(c, o->bootstrap, &id, err))) goto fail;
    ncclResult_t r = x->api.CommInitRank(&x->comm, o->size, id, o->rank);
    if (r != ncclSuccess) {
        x->comm = NULL;
        rc = sf_err(err, SF_ERROR, "rank %d: ncclCommInitRank(%d ranks, device %d): %s", o->rank, o->size, o->device,
                    x->api.GetErrorString(r));
        goto fail;
    }
    int ver = 0;
    x->api.GetVersion(&ver);
    SF_LOGD("rank %d: NCCL %d communicator of %d ranks on device %d", o->rank, ver, o->size, o->device);
    if ((rc = custom_setup(c, err))) goto fail;
    *out = c;
    return SF_OK;
fail:
    nccl_abort(c, err ? err->msg : "NCCL communicator setup failed");
    nccl_destroy(c);
    return rc;
}

#else

int sf_comm_nccl_open(const sf_comm_opts *o, sf_comm **out, sf_error *err)
{
    *out = NULL;
    return sf_err(err, SF_ENODEV, "NCCL communicator: built without CUDA/NCCL headers; rebuild on a machine with the "
                  "CUDA toolkit and NCCL, or use --backend cpu for tensor parallelism");
}

#endif
