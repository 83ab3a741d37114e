/* test_bpf_steer — the SK_REUSEPORT program on a listener group of four sockets in two lanes
 * (workers 0,1: lane 0; workers 2,3: lane 1): connections from 127.0.0.2 land in lane 0 and
 * from 127.0.0.3 in lane 1 every time; the least-loaded worker of a lane wins; clients without
 * a prefix fall back to the kernel hash. Needs root (CI is). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "bpf/monitor.h"
#include "tests/test.h"

#define NW 4
static int lfd[NW];
static const int lane_of[NW] = { 0, 0, 1, 1 };
static struct sockaddr_in addr;
static sf_steer *st;
static sf_error st_err;

static int open_group(void)
{
    int one = 1;
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < NW; i++) {
        lfd[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (lfd[i] < 0 || setsockopt(lfd[i], SOL_SOCKET, SO_REUSEPORT, &one, sizeof one)) return -1;
        if (bind(lfd[i], (struct sockaddr *)&addr, sizeof addr) || listen(lfd[i], 64)) return -1;
        if (i == 0) {
            socklen_t l = sizeof addr;
            getsockname(lfd[0], (struct sockaddr *)&addr, &l); /* the others join its port */
        }
    }
    return 0;
}

/* Connect from src, return the index of the listener that got the connection (-1: none). */
static int connect_from(const char *src)
{
    struct sockaddr_in s = { .sin_family = AF_INET };
    inet_pton(AF_INET, src, &s.sin_addr);
    int c = socket(AF_INET, SOCK_STREAM, 0), got = -1;
    if (c < 0 || bind(c, (struct sockaddr *)&s, sizeof s) || connect(c, (struct sockaddr *)&addr, sizeof addr)) {
        if (c >= 0) close(c);
        return -2;
    }
    struct pollfd p[NW];
    for (int i = 0; i < NW; i++) p[i] = (struct pollfd){ .fd = lfd[i], .events = POLLIN };
    if (poll(p, NW, 2000) > 0)
        for (int i = 0; i < NW; i++) {
            if (!(p[i].revents & POLLIN)) continue;
            int a = accept(lfd[i], NULL, NULL);
            if (a >= 0) { close(a); if (got < 0) got = i; }
        }
    close(c);
    return got;
}

TEST(attach_group)
{
    REQUIRE(st, "sf_steer_attach failed: %s", st_err.msg);
    sf_error e = { 0 };
    CHECK_MSG(sf_steer_set_prefix(st, "127.0.0.2/32", 0, &e) == SF_OK, "%s", e.msg);
    CHECK_MSG(sf_steer_set_prefix(st, "127.0.0.3", 1, &e) == SF_OK, "%s", e.msg);
    CHECK_MSG(sf_steer_set_prefix(st, "fd00::/8", 1, &e) == SF_OK, "%s", e.msg);
}

TEST(tenants_land_in_their_lane)
{
    REQUIRE(st, "steering is off: %s", st_err.msg);
    int lane_hits[2][NW] = { { 0 } };
    for (int round = 0; round < 40; round++) {
        int w2 = connect_from("127.0.0.2"), w3 = connect_from("127.0.0.3");
        REQUIRE(w2 >= 0 && w3 >= 0, "connection not accepted (127.0.0.2 -> %d, 127.0.0.3 -> %d)", w2, w3);
        lane_hits[0][w2]++;
        lane_hits[1][w3]++;
        CHECK_MSG(lane_of[w2] == 0, "round %d: 127.0.0.2 landed on worker %d (lane %d)", round, w2, lane_of[w2]);
        CHECK_MSG(lane_of[w3] == 1, "round %d: 127.0.0.3 landed on worker %d (lane %d)", round, w3, lane_of[w3]);
    }
    /* equal load: the hash rotation spreads connections over both workers of a lane */
    CHECK_MSG(lane_hits[0][0] && lane_hits[0][1], "lane 0 split %d/%d", lane_hits[0][0], lane_hits[0][1]);
    CHECK_MSG(lane_hits[1][2] && lane_hits[1][3], "lane 1 split %d/%d", lane_hits[1][2], lane_hits[1][3]);
}

TEST(least_loaded_worker_wins)
{
    REQUIRE(st, "steering is off: %s", st_err.msg);
    sf_steer_set_load(st, 0, 7);
    sf_steer_set_load(st, 1, 2);
    sf_steer_set_load(st, 2, 0);
    sf_steer_set_load(st, 3, 9);
    for (int i = 0; i < 10; i++) {
        int w2 = connect_from("127.0.0.2"), w3 = connect_from("127.0.0.3");
        CHECK_MSG(w2 == 1, "127.0.0.2 went to worker %d, least loaded in lane 0 is 1", w2);
        CHECK_MSG(w3 == 2, "127.0.0.3 went to worker %d, least loaded in lane 1 is 2", w3);
    }
    for (int w = 0; w < NW; w++) sf_steer_set_load(st, w, 0);
}

TEST(unknown_clients_use_kernel_hash)
{
    REQUIRE(st, "steering is off: %s", st_err.msg);
    uint64_t before = 0, after = 0, per[NW];
    sf_steer_counts(st, per, NW, &before);
    for (int i = 0; i < 8; i++) CHECK(connect_from("127.0.0.4") >= 0);
    CHECK(sf_steer_counts(st, per, NW, &after) == SF_OK);
    CHECK_MSG(after - before == 8, "fallback count went %llu -> %llu", (unsigned long long)before,
              (unsigned long long)after);
    CHECK_MSG(per[0] + per[1] >= 50 && per[2] + per[3] >= 50, "steered counts %llu %llu %llu %llu",
              (unsigned long long)per[0], (unsigned long long)per[1], (unsigned long long)per[2],
              (unsigned long long)per[3]);
    /* removing a prefix sends its clients to the hash too */
    sf_error e = { 0 };
    CHECK_MSG(sf_steer_del_prefix(st, "127.0.0.3/32", &e) == SF_OK, "%s", e.msg);
    sf_steer_counts(st, NULL, 0, &before);
    CHECK(connect_from("127.0.0.3") >= 0);
    sf_steer_counts(st, NULL, 0, &after);
    CHECK(after == before + 1);
}

TEST(bad_prefixes_are_rejected)
{
    REQUIRE(st, "steering is off: %s", st_err.msg);
    sf_error e = { 0 };
    CHECK(sf_steer_set_prefix(st, "10.0.0.0/33", 0, &e) == SF_EINVAL && strstr(e.msg, "10.0.0.0/33"));
    CHECK(sf_steer_set_prefix(st, "not-an-ip", 0, &e) == SF_EINVAL && strstr(e.msg, "not-an-ip"));
    CHECK(sf_steer_set_prefix(st, "10.0.0.0/x", 0, &e) == SF_EINVAL);
    CHECK(sf_steer_set_prefix(st, "::1/129", 0, &e) == SF_EINVAL);
    CHECK(sf_steer_set_prefix(st, "10.0.0.0/8", SF_STEER_MAX_LANES, &e) == SF_EINVAL);
    CHECK(sf_steer_del_prefix(st, "192.0.2.0/24", &e) == SF_ENOTFOUND);
    int bad_lane[1] = { 99 }, fd0[1] = { lfd[0] };
    sf_steer *s2 = NULL;
    CHECK(sf_steer_attach(fd0, bad_lane, 1, &s2, &e) == SF_EINVAL && s2 == NULL);
    CHECK(sf_steer_attach(fd0, lane_of, 0, &s2, &e) == SF_EINVAL);
    int notsock[1] = { 0 }, l0[1] = { 0 };
    if (geteuid() == 0) CHECK(sf_steer_attach(notsock, l0, 1, &s2, &e) != SF_OK && s2 == NULL);
    /* NULL handles are harmless */
    sf_steer_set_load(NULL, 0, 1);
    sf_steer_free(NULL);
    CHECK(sf_steer_set_prefix(NULL, "10.0.0.0/8", 0, &e) == SF_EINVAL);
}

int main(void)
{
    if (open_group()) {
        printf("FAIL: setup: listener group on 127.0.0.1: %s\n", strerror(errno));
        return 1;
    }
    if (sf_steer_attach(lfd, lane_of, NW, &st, &st_err) != SF_OK) st = NULL;
    RUN(attach_group);
    RUN(tenants_land_in_their_lane);
    RUN(least_loaded_worker_wins);
    RUN(unknown_clients_use_kernel_hash);
    RUN(bad_prefixes_are_rejected);
    sf_steer_free(st);
    for (int i = 0; i < NW; i++) close(lfd[i]);
    return test_summary();
}
