/* test_bpf_monitor — the monitor's programs load and attach, and what they count equals what
 * test processes did: socket bytes over loopback TCP per pid, and copies through a library
 * exporting libcuda's copy symbols (build/tests/fixtures/libcuda.so.1) per direction.
 * Needs root on a kernel with BTF (CI is); otherwise each test FAILs saying so. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "bpf/monitor.h"
#include "tests/test.h"

static char fake_lib[1024];
static sf_monitor *mon;
static sf_error mon_err;

/* A child that blocks until the parent writes a byte to `go`, runs fn, reports on `done`,
 * then waits for the parent to close `go` before exiting (so its pid stays in the snapshot). */
typedef struct child { pid_t pid; int go, done; } child;

static int child_start(child *c, int (*fn)(void *), void *arg)
{
    int g[2], d[2];
    if (pipe(g) || pipe(d)) return -1;
    c->pid = fork();
    if (c->pid < 0) return -1;
    if (c->pid == 0) {
        char b;
        close(g[1]);
        close(d[0]);
        if (read(g[0], &b, 1) != 1) _exit(1);
        int rc = fn(arg);
        if (write(d[1], &rc, sizeof rc) != sizeof rc) _exit(1);
        while (read(g[0], &b, 1) > 0) {}
        _exit(rc);
    }
    close(g[0]);
    close(d[1]);
    c->go = g[1];
    c->done = d[0];
    return 0;
}

static void child_go(child *c) { if (write(c->go, "g", 1) != 1) perror("write"); }

static int child_done(child *c)
{
    int rc = -1;
    if (read(c->done, &rc, sizeof rc) != sizeof rc) rc = -1;
    return rc;
}

static void child_end(child *c)
{
    int st;
    close(c->go);
    close(c->done);
    waitpid(c->pid, &st, 0);
}

static const sf_mon_proc *find_proc(const sf_mon_snapshot *s, int pid)
{
    for (int i = 0; i < s->n_procs; i++)
        if (s->procs[i].pid == pid) return &s->procs[i];
    return NULL;
}

/* Two snapshots after now: the later one covers everything done before this call. */
static void settle(sf_mon_snapshot *s)
{
    sf_mon_snapshot cur;
    sf_monitor_snapshot(mon, &cur);
    uint64_t seq = sf_monitor_wait(mon, cur.seq, 2.0);
    sf_monitor_wait(mon, seq, 2.0);
    sf_mon_snapshot_free(&cur);
    sf_monitor_snapshot(mon, s);
}

/* ---- sockets ---------------------------------------------------------------------------- */
#define TX_BYTES 1234567
#define RX_BYTES 765432
static int listen_fd;
static struct sockaddr_in listen_addr;

static int send_all(int fd, size_t n)
{
    static char buf[65536];
    while (n) {
        ssize_t k = send(fd, buf, SF_MIN(n, sizeof buf), 0);
        if (k <= 0) return -1;
        n -= (size_t)k;
    }
    return 0;
}

static long recv_all(int fd, size_t want)
{
    static char buf[65536];
    size_t got = 0;
    while (got < want) {
        ssize_t k = recv(fd, buf, SF_MIN(want - got, sizeof buf), 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    return (long)got;
}

static int server_fn(void *arg)
{
    int c = accept(listen_fd, NULL, NULL);
    if (c < 0) return 1;
    long got = recv_all(c, TX_BYTES);
    int rc = got == TX_BYTES && send_all(c, RX_BYTES) == 0 ? 0 : 2;
    close(c);
    return rc;
}

static int client_fn(void *arg)
{
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&listen_addr, sizeof listen_addr)) return 1;
    int rc = send_all(c, TX_BYTES) == 0 && recv_all(c, RX_BYTES) == RX_BYTES ? 0 : 2;
    close(c);
    return rc;
}

/* ---- copies through the fake libcuda ---------------------------------------------------- */
typedef int (*cp3)(uint64_t, uint64_t, size_t);
typedef int (*cp4)(uint64_t, uint64_t, size_t, void *);
typedef int (*cpd)(const void *);
typedef int (*cppeer)(uint64_t, void *, uint64_t, void *, size_t);
typedef int (*cpbatch)(uint64_t *, uint64_t *, size_t *, size_t, void *, size_t *, size_t, void *);

static int copies_fn(void *arg)
{
    static char a[1 << 20], b[1 << 20];
    uint64_t A = (uint64_t)(uintptr_t)a, B = (uint64_t)(uintptr_t)b;
    void *h = dlopen(fake_lib, RTLD_NOW);
    if (!h) return 1;
#define SYM(t, n) t n = (t)dlsym(h, #n); if (!n) return 2
    SYM(cp3, cuMemcpyHtoD_v2); SYM(cp4, cuMemcpyHtoDAsync_v2); SYM(cp3, cuMemcpyHtoD_v2_ptds);
    SYM(cp3, cuMemcpyDtoH_v2); SYM(cp4, cuMemcpyDtoHAsync_v2_ptsz); SYM(cp3, cuMemcpyDtoD_v2);
    SYM(cppeer, cuMemcpyPeer); SYM(cp3, cuMemcpy); SYM(cpbatch, cuMemcpyBatchAsync_v2);
    SYM(cpd, cuMemcpy2D_v2); SYM(cpd, cuMemcpy3D_v2);
    typedef int (*hta)(void *, size_t, const void *, size_t);
    typedef int (*ath)(void *, void *, size_t, size_t);
    SYM(hta, cuMemcpyHtoA_v2); SYM(ath, cuMemcpyAtoH_v2);
    int bad = 0;
    for (int i = 0; i < 5; i++) bad |= cuMemcpyHtoD_v2(A, B, 1000);
    for (int i = 0; i < 3; i++) bad |= cuMemcpyHtoDAsync_v2(A, B, 65536, NULL);
    bad |= cuMemcpyHtoD_v2_ptds(A, B, 7);
    for (int i = 0; i < 4; i++) bad |= cuMemcpyDtoH_v2(A, B, 4096);
    for (int i = 0; i < 2; i++) bad |= cuMemcpyDtoHAsync_v2_ptsz(A, B, 100000, NULL);
    for (int i = 0; i < 2; i++) bad |= cuMemcpyDtoD_v2(A, B, 300);
    bad |= cuMemcpyPeer(A, NULL, B, NULL, 500);
    bad |= cuMemcpy(A, B, 123);
    uint64_t dsts[3] = { A, A + 100, A + 200 }, srcs[3] = { B, B + 100, B + 200 };
    size_t sizes[3] = { 10, 20, 30 };
    bad |= cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 3, NULL, NULL, 0, NULL);
    /* CUDA_MEMCPY2D / 3D laid out as in cuda.h (offsets checked in fakecuda.c) */
    uint64_t d2[16] = { 0 };
    d2[2] = 1; d2[3] = (uintptr_t)b; d2[6] = 64;            /* src host, pitch 64 */
    d2[9] = 2; d2[11] = A; d2[13] = 64;                      /* dst device, pitch 64 */
    d2[14] = 64; d2[15] = 10;                                /* 64 x 10 = 640 bytes H2D */
    bad |= cuMemcpy2D_v2(d2);
    uint64_t d3[25] = { 0 };
    d3[4] = 2; d3[6] = B; d3[9] = 16; d3[10] = 4;           /* src device, pitch 16, height 4 */
    d3[15] = 1; d3[16] = (uintptr_t)a; d3[20] = 16; d3[21] = 4; /* dst host */
    d3[22] = 16; d3[23] = 4; d3[24] = 2;                     /* 16 x 4 x 2 = 128 bytes D2H */
    bad |= cuMemcpy3D_v2(d3);
    bad |= cuMemcpyHtoA_v2(a, 0, b, 256);
    bad |= cuMemcpyAtoH_v2(a, b, 0, 256);
    dlclose(h);
    return bad ? 3 : 0;
}

/* ---- tests ------------------------------------------------------------------------------ */
TEST(monitor_loads_and_attaches)
{
    REQUIRE(mon, "sf_monitor_open failed: %s", mon_err.msg);
    sf_mon_snapshot s;
    settle(&s);
    CHECK_MSG(s.seq >= 2, "no snapshots taken (seq %llu)", (unsigned long long)s.seq);
    CHECK_MSG(s.n_libs == 1, "libraries attached: %d", s.n_libs);
    CHECK_MSG(s.n_uprobes >= 15, "uprobes attached to %s: %d", fake_lib, s.n_uprobes);
    CHECK_MSG(s.n_gpus == 1 && !s.gpus[0].link_measured, "gpus %d", s.n_gpus);
    sf_mon_snapshot_free(&s);
}

TEST(socket_bytes_per_pid)
{
    REQUIRE(mon, "monitor is off: %s", mon_err.msg);
    child srv, cli;
    int rs = child_start(&srv, server_fn, NULL), rcl = rs ? -1 : child_start(&cli, client_fn, NULL);
    REQUIRE(rs == 0 && rcl == 0, "fork: %s", strerror(errno));
    child_go(&srv);
    child_go(&cli);
    int rc_c = child_done(&cli), rc_s = child_done(&srv);
    CHECK_MSG(rc_c == 0 && rc_s == 0, "traffic children failed: client %d server %d", rc_c, rc_s);
    sf_mon_snapshot s;
    settle(&s);
    const sf_mon_proc *c = find_proc(&s, cli.pid), *v = find_proc(&s, srv.pid);
    CHECK_MSG(c != NULL, "client pid %d not in the snapshot", cli.pid);
    CHECK_MSG(v != NULL, "server pid %d not in the snapshot", srv.pid);
    if (c) {
        CHECK_MSG(c->sock_tx_bytes == TX_BYTES, "client sent %d, counted %llu", TX_BYTES,
                  (unsigned long long)c->sock_tx_bytes);
        CHECK_MSG(c->sock_rx_bytes == RX_BYTES, "client received %d, counted %llu", RX_BYTES,
                  (unsigned long long)c->sock_rx_bytes);
    }
    if (v) {
        CHECK_MSG(v->sock_rx_bytes == TX_BYTES, "server received %d, counted %llu", TX_BYTES,
                  (unsigned long long)v->sock_rx_bytes);
        CHECK_MSG(v->sock_tx_bytes == RX_BYTES, "server sent %d, counted %llu", RX_BYTES,
                  (unsigned long long)v->sock_tx_bytes);
    }
    uint64_t cg_tx = 0;
    for (int i = 0; i < s.n_cgroups; i++) cg_tx += s.cgroups[i].sock_tx_bytes;
    CHECK_MSG(cg_tx >= (uint64_t)TX_BYTES + RX_BYTES, "cgroup tx total %llu below the test's own traffic",
              (unsigned long long)cg_tx);
    sf_mon_snapshot_free(&s);
    child_end(&cli);
    child_end(&srv);
}

TEST(uprobe_copies_per_direction)
{
    REQUIRE(mon, "monitor is off: %s", mon_err.msg);
    child k;
    int rk = child_start(&k, copies_fn, NULL);
    REQUIRE(rk == 0, "fork: %s", strerror(errno));
    child_go(&k);
    int rc = child_done(&k);
    CHECK_MSG(rc == 0, "copy child failed with %d (dlopen %s)", rc, fake_lib);
    sf_mon_snapshot s;
    settle(&s);
    const sf_mon_proc *p = find_proc(&s, k.pid);
    REQUIRE(p != NULL, "copy child pid %d not in the snapshot", k.pid);
    const uint64_t want_b[SF_DIR_COUNT] = { 5 * 1000 + 3 * 65536 + 7 + 640 + 256, 4 * 4096 + 2 * 100000 + 128 + 256,
                                            2 * 300 + 500, 123 + 60 };
    const uint64_t want_c[SF_DIR_COUNT] = { 11, 8, 3, 2 };
    for (int d = 0; d < SF_DIR_COUNT; d++) {
        CHECK_MSG(p->bytes[d] == want_b[d], "dir %d: bytes %llu, want %llu", d, (unsigned long long)p->bytes[d],
                  (unsigned long long)want_b[d]);
        CHECK_MSG(p->calls[d] == want_c[d], "dir %d: calls %llu, want %llu", d, (unsigned long long)p->calls[d],
                  (unsigned long long)want_c[d]);
    }
    CHECK_MSG(p->hist[9] == 6, "copies of 512..1023 bytes: %llu, want 6", (unsigned long long)p->hist[9]);
    CHECK_MSG(p->hist[16] == 5, "copies of 64..128 KiB: %llu, want 5", (unsigned long long)p->hist[16]);
    CHECK_MSG(p->hist[12] == 4, "copies of 4..8 KiB: %llu, want 4", (unsigned long long)p->hist[12]);
    sf_mon_snapshot_free(&s);

    /* the same numbers in JSON and Prometheus text */
    char *js = sf_monitor_json(mon), *prom = sf_monitor_metrics(mon), line[160];
    json_error_t je;
    json_t *root = js ? json_loads(js, 0, &je) : NULL;
    REQUIRE(root != NULL, "sf_monitor_json is not JSON: %s", js ? je.text : "NULL");
    json_t *procs = json_object_get(root, "processes"), *v;
    size_t i;
    int found = 0;
    json_array_foreach(procs, i, v) {
        if (json_integer_value(json_object_get(v, "pid")) != k.pid) continue;
        found = 1;
        CHECK(json_integer_value(json_object_get(v, "h2d_bytes")) == (json_int_t)want_b[0]);
        CHECK(json_integer_value(json_object_get(v, "d2h_bytes")) == (json_int_t)want_b[1]);
    }
    CHECK_MSG(found, "pid %d missing from JSON", k.pid);
    CHECK(json_array_size(json_object_get(root, "gpus")) == 1);
    snprintf(line, sizeof line, "semflow_pcie_bytes_total{pid=\"%d\",comm=\"test_bpf_monito\",dir=\"h2d\"} %llu\n",
             k.pid, (unsigned long long)want_b[0]);
    CHECK_MSG(prom && strstr(prom, line), "metrics lack: %s", line);
    CHECK(prom && strstr(prom, "semflow_bpf_up 1\n"));
    json_decref(root);
    free(js);
    free(prom);
    child_end(&k);
}

/* A process that maps a libcuda after the monitor started is found by the 5 s rescan of new
 * processes, and its copies are counted from then on. */
TEST(discovery_finds_new_gpu_processes)
{
    sf_monitor_opts o;
    sf_monitor_opts_default(&o);
    sf_monitor *m2 = NULL;
    sf_error e = { 0 };
    int rc = sf_monitor_open(&o, &m2, &e);
    REQUIRE(rc == SF_OK, "sf_monitor_open with discovery: %s", e.msg);
    int ready[2], go[2];
    REQUIRE(pipe(ready) == 0 && pipe(go) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        char b;
        close(go[1]);
        close(ready[0]);
        void *h = dlopen(fake_lib, RTLD_NOW);
        cp3 htod = h ? (cp3)dlsym(h, "cuMemcpyHtoD_v2") : NULL;
        if (write(ready[1], "r", 1) != 1 || read(go[0], &b, 1) != 1) _exit(1);
        static char a[4096];
        for (int i = 0; htod && i < 3; i++) htod((uint64_t)(uintptr_t)a, (uint64_t)(uintptr_t)a, 1000);
        if (write(ready[1], "d", 1) != 1) _exit(1);
        while (read(go[0], &b, 1) > 0) {}
        _exit(htod ? 0 : 2);
    }
    close(go[0]);
    close(ready[1]);
    char b;
    CHECK(read(ready[0], &b, 1) == 1);
    sf_mon_snapshot s = { 0 };
    double end = sf_now_s() + 20; /* the rescan comes every 5 s; attaching takes seconds on a loaded host */
    while (sf_now_s() < end) {
        sf_mon_snapshot_free(&s);
        sf_monitor_wait(m2, 0, 0);
        usleep(200 * 1000);
        sf_monitor_snapshot(m2, &s);
        if (sf_monitor_has_lib(m2, fake_lib)) break; /* other processes' libcuda copies may come first */
    }
    CHECK_MSG(sf_monitor_has_lib(m2, fake_lib), "the child's %s was not discovered within 20 s", fake_lib);
    sf_mon_snapshot_free(&s);
    CHECK(write(go[1], "g", 1) == 1 && read(ready[0], &b, 1) == 1);
    sf_monitor_wait(m2, sf_monitor_wait(m2, 0, 0), 2.0);
    uint64_t seq = sf_monitor_wait(m2, 0, 0);
    sf_monitor_wait(m2, seq, 2.0);
    sf_monitor_snapshot(m2, &s);
    const sf_mon_proc *p = find_proc(&s, pid);
    CHECK_MSG(p && p->bytes[SF_DIR_H2D] == 3000 && p->calls[SF_DIR_H2D] == 3, "child %d: %llu bytes in %llu calls",
              pid, p ? (unsigned long long)p->bytes[SF_DIR_H2D] : 0ULL, p ? (unsigned long long)p->calls[SF_DIR_H2D] : 0ULL);
    sf_mon_snapshot_free(&s);
    close(go[1]);
    int st;
    waitpid(pid, &st, 0);
    close(ready[0]);
    sf_monitor_close(m2);
}

/* The contention index counts processes other than ours: the server's own copies and those of
 * the processes it started (tensor-parallel ranks: its children) are "own", a grandchild's are
 * another tenant's. The link is the measured bandwidth given for the GPU. */
static int stream_fn(void *arg)
{
    void *h = dlopen(fake_lib, RTLD_NOW);
    cp3 htod = h ? (cp3)dlsym(h, "cuMemcpyHtoD_v2") : NULL;
    if (!htod) return 2;
    static char a[1 << 20], b[1 << 20];
    double t0 = sf_now_s();
    while (sf_now_s() - t0 < *(double *)arg) htod((uintptr_t)a, (uintptr_t)b, sizeof a);
    dlclose(h);
    return 0;
}

static int grandchild_fn(void *arg)
{
    child g;
    if (child_start(&g, stream_fn, arg)) return 4;
    child_go(&g);
    int rc = child_done(&g);
    child_end(&g);
    return rc;
}

TEST(contention_counts_others_not_our_children)
{
    sf_monitor_opts o;
    sf_monitor_opts_default(&o);
    o.cuda_libs[0] = fake_lib;
    o.n_cuda_libs = 1;
    o.no_discover = 1;
    o.link_gbs_gpu[0] = 40.0;
    sf_monitor *m2 = NULL;
    sf_error e = { 0 };
    REQUIRE(sf_monitor_open(&o, &m2, &e) == SF_OK, "monitor: %s", e.msg);
    double secs = 1.2;
    child kid, old;
    REQUIRE(child_start(&kid, stream_fn, &secs) == 0 && child_start(&old, grandchild_fn, &secs) == 0, "fork: %s",
            strerror(errno));
    child_go(&kid);
    child_go(&old);
    double own = 0, other = 0, link = 0;
    int measured = 0;
    for (double t0 = sf_now_s(); sf_now_s() - t0 < 1.0;) {
        sf_mon_snapshot s;
        sf_monitor_wait(m2, 0, 0.3);
        sf_monitor_snapshot(m2, &s);
        if (s.n_gpus >= 1) {
            own = SF_MAX(own, s.gpus[0].own_h2d_per_s);
            other = SF_MAX(other, s.gpus[0].other_h2d_per_s);
            link = s.gpus[0].link_gbs;
            measured = s.gpus[0].link_measured;
        }
        sf_mon_snapshot_free(&s);
        usleep(100000);
    }
    CHECK_MSG(child_done(&kid) == 0 && child_done(&old) == 0, "streaming children failed");
    CHECK_MSG(measured && link == 40.0, "link %.1f GB/s (%s), want the 40 given", link, measured ? "measured" : "nominal");
    CHECK_MSG(own > 1e6, "our child's stream: %.0f B/s counted as own", own);
    CHECK_MSG(other > 1e6, "the grandchild's stream: %.0f B/s counted as another's", other);
    child_end(&old); /* first: it holds a copy of kid's pipe, which kid waits to see closed */
    child_end(&kid);
    sf_monitor_close(m2);
}

TEST(off_monitor_is_harmless)
{
    char *js = sf_monitor_json(NULL), *prom = sf_monitor_metrics(NULL);
    CHECK(js && strstr(js, "\"bpf\":false"));
    CHECK(prom && strstr(prom, "semflow_bpf_up 0"));
    sf_mon_snapshot s;
    sf_monitor_snapshot(NULL, &s);
    CHECK(s.n_procs == 0 && s.procs == NULL);
    sf_error e = { 0 };
    CHECK(sf_monitor_attach_lib(NULL, "/nonexistent", &e) != SF_OK && e.msg[0]);
    free(js);
    free(prom);
}

TEST(attach_rejects_non_libcuda)
{
    REQUIRE(mon, "monitor is off: %s", mon_err.msg);
    sf_error e = { 0 };
    CHECK(sf_monitor_attach_lib(mon, "/nonexistent/libcuda.so.1", &e) == SF_ENOTFOUND);
    CHECK_MSG(strstr(e.msg, "/nonexistent/libcuda.so.1") != NULL, "message: %s", e.msg);
    CHECK(sf_monitor_attach_lib(mon, "/etc/hostname", &e) != SF_OK);
}

int main(void)
{
    const char *b = getenv("SF_BUILD");
    snprintf(fake_lib, sizeof fake_lib, "%s/tests/fixtures/libcuda.so.1", b ? b : "build");
    char *rp = realpath(fake_lib, NULL);
    if (rp) { snprintf(fake_lib, sizeof fake_lib, "%s", rp); free(rp); }
    signal(SIGPIPE, SIG_IGN);

    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    listen_addr.sin_family = AF_INET;
    listen_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof listen_addr;
    if (bind(listen_fd, (struct sockaddr *)&listen_addr, sizeof listen_addr) || listen(listen_fd, 4) ||
        getsockname(listen_fd, (struct sockaddr *)&listen_addr, &al))
        perror("listen");

    sf_monitor_opts o;
    sf_monitor_opts_default(&o);
    o.cuda_libs[0] = fake_lib;
    o.n_cuda_libs = 1;
    o.no_discover = 1;
    if (sf_monitor_open(&o, &mon, &mon_err) != SF_OK) mon = NULL;

    RUN(monitor_loads_and_attaches);
    RUN(socket_bytes_per_pid);
    RUN(uprobe_copies_per_direction);
    RUN(discovery_finds_new_gpu_processes);
    RUN(contention_counts_others_not_our_children);
    RUN(off_monitor_is_harmless);
    RUN(attach_rejects_non_libcuda);
    sf_monitor_close(mon);
    close(listen_fd);
    return test_summary();
}
