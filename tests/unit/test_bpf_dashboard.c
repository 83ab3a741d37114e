/* test_bpf_dashboard — /dashboard and /dashboard/events on a real evhttp, registered through
 * the gateway glue (sf_dashboard_worker_init), torn down in the gateway's order (evhttp and
 * base first, then sf_dashboard_set_free; ASan builds catch a use after free). The browser
 * view is tests/integration/test_dashboard.sh. */
#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "bpf/monitor.h"
#include "gateway/dashboard.h"
#include "tests/test.h"

static int engine_asked, stats_asked;
static struct sf_engine *no_engine(void *arg) { engine_asked++; return NULL; }
static char *server_stats(void *arg)
{
    stats_asked++;
    return strdup("{\"queue\":{\"high\":2},\"decisions_per_min\":17}");
}

/* Sends req to port, runs the loop for secs, returns what arrived (malloc'd). */
static char *exchange(struct event_base *base, int port, const char *req, double secs)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) || write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    size_t cap = 1 << 20, len = 0;
    char *buf = calloc(1, cap);
    double end = sf_now_s() + secs;
    while (buf && sf_now_s() < end) {
        struct timeval tv = { 0, 50000 };
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
        ssize_t k;
        while (len + 1 < cap && (k = read(fd, buf + len, cap - len - 1)) > 0) len += (size_t)k;
    }
    close(fd);
    struct timeval tv = { 0, 50000 }; /* let the server see the close */
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    return buf;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

TEST(page_and_event_stream)
{
    struct event_base *base = event_base_new();
    struct evhttp *http = evhttp_new(base);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, "127.0.0.1", 0);
    REQUIRE(bs, "bind: %s", strerror(errno));
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&sa, &sl);
    int port = ntohs(sa.sin_port);

    sf_dashboard_opts o = { .monitor_off = "test: monitor not started", .engine_fn = no_engine,
                            .stats = server_stats };
    sf_dashboard_set *set = sf_dashboard_set_new(&o);
    sf_error e = { 0 };
    int rc = set ? sf_dashboard_worker_init(set, 0, http, base, &e) : SF_ENOMEM;
    REQUIRE(rc == SF_OK, "worker_init: %s", e.msg);
    /* a second registration on the same server is refused with a message */
    CHECK(sf_dashboard_worker_init(set, 1, http, base, &e) != SF_OK && strstr(e.msg, "already"));

    char *page = exchange(base, port, "GET /dashboard HTTP/1.0\r\n\r\n", 0.3);
    REQUIRE(page, "GET /dashboard failed");
    if (sf_dashboard_available()) {
        CHECK_MSG(!strncmp(page, "HTTP/1.1 200", 12) || !strncmp(page, "HTTP/1.0 200", 12), "%.40s", page);
        CHECK(strstr(page, "text/html") && strstr(page, "uPlot") && strstr(page, "/dashboard/events"));
    } else {
        CHECK_MSG(strstr(page, " 503 ") && strstr(page, "npm"), "%.200s", page);
    }
    free(page);

    char *ev = exchange(base, port, "GET /dashboard/events HTTP/1.1\r\nHost: x\r\n\r\n", 2.3);
    REQUIRE(ev, "GET /dashboard/events failed");
    CHECK(strstr(ev, "text/event-stream") != NULL);
    int n = count(ev, "data: {");
    CHECK_MSG(n >= 2, "%d events in 2.3 s (one at connect, then one a second)", n);
    CHECK(strstr(ev, "\"monitor\":null") && strstr(ev, "\"monitor_off\":\"test: monitor not started\""));
    CHECK(strstr(ev, "\"server\":{") && strstr(ev, "\"decisions_per_min\":17"));
    CHECK(engine_asked >= n && stats_asked >= n);
    free(ev);

    char *bad = exchange(base, port, "POST /dashboard HTTP/1.0\r\nContent-Length: 0\r\n\r\n", 0.2);
    CHECK_MSG(bad && strstr(bad, " 405 "), "%.60s", bad ? bad : "");
    free(bad);

    /* the gateway's order: evhttp and base first, then the set */
    evhttp_free(http);
    event_base_free(base);
    sf_dashboard_set_free(set);
}

TEST(free_while_streaming)
{
    struct event_base *base = event_base_new();
    struct evhttp *http = evhttp_new(base);
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(http, "127.0.0.1", 0);
    REQUIRE(bs, "bind: %s", strerror(errno));
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&sa, &sl);
    sf_dashboard *d = NULL;
    sf_error e = { 0 };
    sf_dashboard_opts o = { 0 };
    int rc = sf_dashboard_register(http, base, &o, &d, &e);
    REQUIRE(rc == SF_OK, "%s", e.msg);
    /* a client that stays connected while the dashboard goes away */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    REQUIRE(rc == 0, "connect: %s", strerror(errno));
    const char *req = "GET /dashboard/events HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
    struct timeval tv = { 0, 200000 };
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    sf_dashboard_free(d); /* ends the stream: the chunked encoding's last chunk goes out */
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
    char buf[65536];
    ssize_t k = recv(fd, buf, sizeof buf - 1, MSG_DONTWAIT);
    buf[k > 0 ? k : 0] = 0;
    CHECK_MSG(k > 5 && strstr(buf, "data: {") && !strcmp(buf + k - 5, "0\r\n\r\n"), "stream: %.80s", buf);
    close(fd);
    evhttp_free(http);
    event_base_free(base);
}

TEST(metrics_glue)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    REQUIRE(f, "open_memstream");
    sf_monitor_metrics_write(NULL, f);
    fclose(f);
    CHECK_MSG(buf && strstr(buf, "semflow_bpf_up 0"), "%s", buf ? buf : "");
    free(buf);
    sf_error e = { 0 };
    CHECK(sf_dashboard_worker_init(NULL, 3, NULL, NULL, &e) == SF_EINVAL && strstr(e.msg, "worker 3"));
    sf_dashboard *d = NULL;
    CHECK(sf_dashboard_register(NULL, NULL, NULL, &d, &e) == SF_EINVAL && d == NULL);
    sf_dashboard_free(NULL);
    sf_dashboard_set_free(NULL);
}

int main(void)
{
    RUN(page_and_event_stream);
    RUN(free_while_streaming);
    RUN(metrics_glue);
    return test_summary();
}
