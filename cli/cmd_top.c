/* cmd_top.c — `semflow top`: live per-process PCIe and socket traffic from the eBPF monitor,
 * the PCIe contention index per GPU, and (with --url) a running server's queue, latency and
 * scheduler metrics read from its /metrics. --json prints one snapshot per line instead. */
#include <errno.h>
#include <getopt.h>
#include <locale.h>
#include <math.h>
#include <ncurses.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "bpf/monitor.h"
#include "cli/cli.h"
#include "gateway/dashboard.h"

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { (void)sig; stop_flag = 1; }

static void usage(FILE *f)
{
    fprintf(f,
            "usage: semflow top [--json] [--once] [--interval S] [--url http://HOST:PORT] [--listen HOST:PORT]\n"
            "                   [--lib PATH]... [--no-discover] [--link-gbs G] [--gpus N]\n"
            "  Per-process PCIe copies (uprobes on libcuda) and socket bytes (tracepoints), per GPU\n"
            "  contention index. Needs root and a kernel with BTF.\n"
            "  --json         one JSON snapshot per line (byte counts cumulative since start)\n"
            "  --once         print one snapshot and exit (with --json)\n"
            "  --interval S   seconds between updates (default 1)\n"
            "  --url URL      also show a running server's queues, latency and scheduler metrics\n"
            "  --listen H:P   serve the live dashboard (/dashboard, /dashboard/events, /metrics) instead\n"
            "  --lib PATH     also trace this library's libcuda copy symbols (repeatable)\n"
            "  --no-discover  trace only --lib libraries\n"
            "  --link-gbs G   PCIe bandwidth per direction for the contention index (default nominal)\n"
            "  --gpus N       GPUs to report (default 1)\n");
}

/* ---- a server's /metrics over plain HTTP/1.0 ------------------------------------------- */
static char *http_get(const char *url, const char *path, char *errbuf, size_t errlen)
{
    char host[256], port[16] = "80";
    const char *p = url;
    if (!strncmp(p, "http://", 7)) p += 7;
    size_t hl = strcspn(p, ":/");
    if (hl == 0 || hl >= sizeof host) { snprintf(errbuf, errlen, "bad --url '%s' (want http://HOST:PORT)", url); return NULL; }
    memcpy(host, p, hl);
    host[hl] = 0;
    if (p[hl] == ':') snprintf(port, sizeof port, "%.*s", (int)strcspn(p + hl + 1, "/"), p + hl + 1);

    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai = NULL;
    int rc = getaddrinfo(host, port, &hints, &ai), fd = -1;
    if (rc) { snprintf(errbuf, errlen, "%s: %s", host, gai_strerror(rc)); return NULL; }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = { .tv_sec = 2 };
    if (fd >= 0) {
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen)) {
        snprintf(errbuf, errlen, "connecting to %s:%s: %s", host, port, strerror(errno));
        freeaddrinfo(ai);
        if (fd >= 0) close(fd);
        return NULL;
    }
    freeaddrinfo(ai);
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, host);
    if (write(fd, req, (size_t)n) != n) { snprintf(errbuf, errlen, "sending to %s: %s", url, strerror(errno)); close(fd); return NULL; }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)k;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
    }
    close(fd);
    if (!buf) { snprintf(errbuf, errlen, "out of memory"); return NULL; }
    buf[len] = 0;
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) || !body || atoi(buf + 9) != 200) {
        snprintf(errbuf, errlen, "%s%s answered: %.60s", url, path, buf);
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* ---- the server panel: queues, latency quantiles, scheduler decisions per minute ------------ */
typedef struct prom_sample {
    char name[96], labels[192]; /* labels without le, as written: a="x",b="y" */
    double le;                  /* histogram buckets: upper bound (+Inf as HUGE_VAL) */
    double v;
} prom_sample;

/* Parses Prometheus text exposition ("name{labels} value" lines); comments skipped. */
static int prom_parse(char *body, prom_sample **out)
{
    int n = 0, cap = 0;
    prom_sample *v = NULL;
    for (char *save = NULL, *l = strtok_r(body, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        if (l[0] == '#' || !l[0]) continue;
        prom_sample x = { .le = 0 };
        size_t nl = strcspn(l, "{ ");
        if (nl == 0 || nl >= sizeof x.name) continue;
        memcpy(x.name, l, nl);
        char *p = l + nl;
        if (*p == '{') {
            char *close = strchr(p, '}');
            if (!close) continue;
            *close = 0;
            for (char *sv = NULL, *kv = strtok_r(p + 1, ",", &sv); kv; kv = strtok_r(NULL, ",", &sv)) {
                if (!strncmp(kv, "le=\"", 4)) {
                    x.le = !strncmp(kv + 4, "+Inf", 4) ? HUGE_VAL : strtod(kv + 4, NULL);
                    continue;
                }
                size_t used = strlen(x.labels);
                snprintf(x.labels + used, sizeof x.labels - used, "%s%s", used ? "," : "", kv);
            }
            p = close + 1;
        }
        char *end = NULL;
        x.v = strtod(p, &end);
        if (end == p) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 128;
            prom_sample *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) break;
            v = nv;
        }
        v[n++] = x;
    }
    *out = v;
    return n;
}

static double prom_sum(const prom_sample *v, int n, const char *name)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name)) s += v[i].v;
    return s;
}

/* Quantile q of the histogram `name` (the _bucket series) with exactly these labels, by linear
 * interpolation inside the bucket; NAN when empty. Buckets come in ascending le. */
static double prom_quantile(const prom_sample *v, int n, const char *bucket_name, const char *labels, double q)
{
    double total = 0, prev_le = 0, prev_c = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, bucket_name) && !strcmp(v[i].labels, labels) && isinf(v[i].le)) total = v[i].v;
    if (total <= 0) return NAN;
    for (int i = 0; i < n; i++) {
        if (strcmp(v[i].name, bucket_name) || strcmp(v[i].labels, labels)) continue;
        if (v[i].v >= q * total) {
            if (isinf(v[i].le)) return prev_le;
            double span = v[i].v - prev_c;
            return prev_le + (span > 0 ? (q * total - prev_c) / span : 0) * (v[i].le - prev_le);
        }
        prev_le = v[i].le;
        prev_c = v[i].v;
    }
    return prev_le;
}

#define MAX_DECISIONS 8
typedef struct server_rates {
    double t, steps, preempt, rejected, requests, dma_held;
    char dec_label[MAX_DECISIONS][48]; /* semflow_sched_decisions_total{decision="..."}: the policy's */
    double dec[MAX_DECISIONS];
    int n_dec, have;
} server_rates;

/* The scheduler policy's decisions per minute (semflow_sched_decisions_total by decision), whether
 * it degrades now, and the DMA tuner's swap-ins held back and the contention it sees. */
static int draw_decisions(int y, const prom_sample *v, int n, server_rates *r, const server_rates *prev, double k)
{
    char line[512];
    int o = 0;
    r->n_dec = 0;
    for (int i = 0; i < n && r->n_dec < MAX_DECISIONS; i++) {
        if (strcmp(v[i].name, "semflow_sched_decisions_total")) continue;
        const char *q = strchr(v[i].labels, '"'), *e = q ? strchr(q + 1, '"') : NULL;
        snprintf(r->dec_label[r->n_dec], sizeof r->dec_label[0], "%.*s", q && e ? (int)(e - q - 1) : 0, q ? q + 1 : "");
        r->dec[r->n_dec] = v[i].v;
        for (int j = 0; prev->have && j < prev->n_dec && o < (int)sizeof line - 64; j++)
            if (!strcmp(prev->dec_label[j], r->dec_label[r->n_dec]))
                o += snprintf(line + o, sizeof line - (size_t)o, " %s %.0f,", r->dec_label[r->n_dec],
                              (v[i].v - prev->dec[j]) * k);
        r->n_dec++;
    }
    if (o) {
        line[o - 1] = 0;
        mvprintw(y++, 0, "  decisions per minute:%s%s", line,
                 prom_sum(v, n, "semflow_sched_degraded") > 0 ? "   DEGRADED (low urgency relaxed)" : "");
    }
    if (prev->have)
        mvprintw(y++, 0, "  DMA tuner: %.0f low-class swap-ins held back per minute, contention index %.2f",
                 (r->dma_held - prev->dma_held) * k, prom_sum(v, n, "semflow_dma_contention_index"));
    return y;
}

static int draw_server(int y, int rows, int cols, const char *url, server_rates *r)
{
    char err[256];
    char *body = http_get(url, "/metrics", err, sizeof err);
    attron(A_REVERSE);
    mvprintw(y++, 0, "server %s%*s", url, cols > (int)strlen(url) + 7 ? cols - (int)strlen(url) - 7 : 0, "");
    attroff(A_REVERSE);
    if (!body) {
        mvprintw(y++, 0, "  %s", err);
        return y;
    }
    prom_sample *v = NULL;
    int n = prom_parse(body, &v);
    /* queues */
    move(y, 0);
    printw("  queued:");
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, "semflow_queue_depth")) printw("  %s %.0f", v[i].labels, v[i].v);
    printw("   running %.0f   in flight %.0f   %.1f tok/s", prom_sum(v, n, "semflow_running_sequences"),
           prom_sum(v, n, "semflow_gateway_active_requests"), prom_sum(v, n, "semflow_tokens_per_second"));
    y++;
    /* KV pool and prefix cache: blocks held, blocks kept for later prompts, the share of prompt tokens found */
    double kq = prom_sum(v, n, "semflow_prefix_cache_queries_total"), kh = prom_sum(v, n, "semflow_prefix_cache_hits_total");
    mvprintw(y++, 0, "  KV blocks: %.0f of %.0f held; prefix cache: %.0f blocks (%.0f of them free), %.1f%% of %.0f prompt "
             "tokens found", prom_sum(v, n, "semflow_kv_blocks_used"), prom_sum(v, n, "semflow_kv_blocks_total"),
             prom_sum(v, n, "semflow_prefix_cache_blocks"), prom_sum(v, n, "semflow_prefix_cache_blocks_free"),
             kq > 0 ? 100 * kh / kq : 0.0, kq);
    /* latency quantiles of every *_seconds histogram, per label set (e.g. per class) */
    for (int i = 0; i < n && y < rows - 2; i++) {
        size_t nl = strlen(v[i].name);
        if (nl < 15 || strcmp(v[i].name + nl - 15, "_seconds_bucket") || !isinf(v[i].le)) continue;
        char base[96];
        snprintf(base, sizeof base, "%.*s", (int)(nl - 15), v[i].name);
        double p50 = prom_quantile(v, n, v[i].name, v[i].labels, 0.5), p99 = prom_quantile(v, n, v[i].name, v[i].labels, 0.99);
        mvprintw(y++, 0, "  %-40.40s %-24.24s p50 %8.1f ms  p99 %8.1f ms  (%.0f)", base + (strncmp(base, "semflow_", 8) ? 0 : 8),
                 v[i].labels, p50 * 1e3, p99 * 1e3, v[i].v);
    }
    /* scheduler decisions per minute */
    double now = sf_now_s(), steps = prom_sum(v, n, "semflow_engine_steps_total"),
           pre = prom_sum(v, n, "semflow_preemptions_total"), rej = prom_sum(v, n, "semflow_rejected_total"),
           req = prom_sum(v, n, "semflow_requests_total");
    server_rates cur = { .t = now, .steps = steps, .preempt = pre, .rejected = rej, .requests = req,
                         .dma_held = prom_sum(v, n, "semflow_dma_deferred_total"), .have = 1 };
    double k = r->have && now > r->t ? 60.0 / (now - r->t) : 0;
    if (k > 0)
        mvprintw(y++, 0, "  per minute: %.0f scheduler steps, %.0f preemptions, %.0f rejections (429), %.0f requests",
                 (steps - r->steps) * k, (pre - r->preempt) * k, (rej - r->rejected) * k, (req - r->requests) * k);
    y = draw_decisions(y, v, n, &cur, k > 0 ? r : &(server_rates){ 0 }, k);
    *r = cur;
    free(v);
    free(body);
    return y;
}

/* ---- --listen: the dashboard and /metrics without a model server --------------------------- */
static void metrics_cb(struct evhttp_request *req, void *arg)
{
    char *text = sf_monitor_metrics(arg);
    struct evbuffer *b = evbuffer_new();
    if (!text || !b) {
        evhttp_send_error(req, 500, "out of memory");
    } else {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
        evbuffer_add(b, text, strlen(text));
        evhttp_send_reply(req, 200, "OK", b);
    }
    if (b) evbuffer_free(b);
    free(text);
}

static void break_loop(evutil_socket_t sig, short what, void *arg) { event_base_loopbreak(arg); }

static int serve_dashboard(sf_monitor *m, const char *off_reason, const char *listen_at)
{
    char host[256];
    const char *colon = strrchr(listen_at, ':');
    char *end = NULL;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == listen_at || (size_t)(colon - listen_at) >= sizeof host || !end || *end || port < 0 ||
        port > 65535) {
        fprintf(stderr, "semflow top: --listen '%s': give HOST:PORT, e.g. 127.0.0.1:9100 (port 0: any)\n", listen_at);
        return 2;
    }
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen_at), listen_at);
    struct event_base *base = event_base_new();
    struct evhttp *http = base ? evhttp_new(base) : NULL;
    struct evhttp_bound_socket *bs = http ? evhttp_bind_socket_with_handle(http, host, (uint16_t)port) : NULL;
    struct event *sigint = NULL, *sigterm = NULL;
    sf_dashboard *dash = NULL;
    sf_error err = { 0 };
    int rc = 1;
    if (!bs) {
        fprintf(stderr, "semflow top: cannot listen on %s: %s\n", listen_at, strerror(errno));
        goto cleanup;
    }
    sf_dashboard_opts o = { .monitor = m, .monitor_off = off_reason };
    if (sf_dashboard_register(http, base, &o, &dash, &err) != SF_OK) {
        fprintf(stderr, "semflow top: %s\n", err.msg);
        goto cleanup;
    }
    evhttp_set_cb(http, "/metrics", metrics_cb, m);
    sigint = evsignal_new(base, SIGINT, break_loop, base);
    sigterm = evsignal_new(base, SIGTERM, break_loop, base);
    if (sigint) event_add(sigint, NULL);
    if (sigterm) event_add(sigterm, NULL);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char addr[INET6_ADDRSTRLEN] = "?";
    int bport = 0;
    if (getsockname(evhttp_bound_socket_get_fd(bs), (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, addr, sizeof addr);
            bport = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        } else {
            inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, addr, sizeof addr);
            bport = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        }
    }
    fprintf(stderr, "semflow top: dashboard on http://%s:%d/dashboard%s\n", addr, bport,
            sf_dashboard_available() ? "" : " (page not bundled in this build: events and /metrics only)");
    event_base_dispatch(base);
    rc = 0;
cleanup:
    sf_dashboard_free(dash);
    if (sigint) event_free(sigint);
    if (sigterm) event_free(sigterm);
    if (http) evhttp_free(http);
    if (base) event_base_free(base);
    return rc;
}

/* ---- ncurses view ------------------------------------------------------------------------- */
static void bar(int y, int x, int w, double v, double max)
{
    int n = max > 0 ? (int)(v / max * w + 0.5) : 0;
    if (n > w) n = w;
    mvhline(y, x, ACS_CKBOARD, n);
    mvhline(y, x + n, ' ', w - n);
}

static void draw(sf_monitor *m, const char *url, int interval_ms)
{
    sf_mon_snapshot s;
    int rows, cols, y = 0;
    sf_monitor_snapshot(m, &s);
    getmaxyx(stdscr, rows, cols);
    erase();
    attron(A_BOLD);
    mvprintw(y++, 0, "semflow top — PCIe copies and sockets per process (eBPF)   t=%.0fs  %d uprobes on %d libcuda",
             s.t, s.n_uprobes, s.n_libs);
    attroff(A_BOLD);
    for (int g = 0; g < s.n_gpus && y < rows; g++, y++) {
        const sf_mon_gpu *G = &s.gpus[g];
        mvprintw(y, 0, "GPU %d contention %5.2f ", g, G->contention);
        bar(y, 23, 20, G->contention, 1.0);
        mvprintw(y, 44, " link %.1f GB/s %s  others H2D %.0f D2H %.0f MB/s", G->link_gbs,
                 G->link_measured ? "measured" : "nominal", G->other_h2d_per_s / 1e6, G->other_d2h_per_s / 1e6);
        if (G->nvml_ok) printw("  NVML rx %.0f tx %.0f MB/s", G->nvml_rx_per_s / 1e6, G->nvml_tx_per_s / 1e6);
    }
    y++;
    double max_pcie = 1e6, max_sock = 1e6;
    for (int i = 0; i < s.n_procs; i++) {
        max_pcie = SF_MAX(max_pcie, SF_MAX(s.procs[i].bytes_per_s[SF_DIR_H2D], s.procs[i].bytes_per_s[SF_DIR_D2H]));
        max_sock = SF_MAX(max_sock, SF_MAX(s.procs[i].sock_tx_per_s, s.procs[i].sock_rx_per_s));
    }
    int bw = cols > 120 ? 12 : 6;
    attron(A_REVERSE);
    mvprintw(y++, 0, "%7s %-15s %9s %-*s %9s %-*s %9s %-*s %9s %-*s", "PID", "COMM", "H2D MB/s", bw, "", "D2H MB/s", bw,
             "", "TX MB/s", bw, "", "RX MB/s", bw, "");
    attroff(A_REVERSE);
    int server_rows = url ? 12 : 0; /* queues, 4 latency lines, per minute, decisions, DMA tuner */
    for (int i = 0; i < s.n_procs && y < rows - server_rows - 1; i++, y++) {
        const sf_mon_proc *p = &s.procs[i];
        int x = 0;
        mvprintw(y, x, "%7d %-15.15s", p->pid, p->comm);
        x += 24;
        const double v[4] = { p->bytes_per_s[SF_DIR_H2D], p->bytes_per_s[SF_DIR_D2H], p->sock_tx_per_s, p->sock_rx_per_s };
        for (int k = 0; k < 4; k++) {
            mvprintw(y, x, "%9.1f ", v[k] / 1e6);
            bar(y, x + 10, bw, v[k], k < 2 ? max_pcie : max_sock);
            x += 11 + bw;
        }
    }
    if (url && y < rows - 2) {
        static server_rates rates;
        y = draw_server(y + 1, rows, cols, url, &rates);
    }
    mvprintw(rows - 1, 0, "q: quit   every %.1f s", interval_ms / 1000.0);
    refresh();
    sf_mon_snapshot_free(&s);
}

int sf_cmd_top(int argc, char **argv)
{
    static const struct option lo[] = {
        { "json", no_argument, 0, 'j' }, { "once", no_argument, 0, 'o' }, { "interval", required_argument, 0, 'i' },
        { "url", required_argument, 0, 'u' }, { "lib", required_argument, 0, 'l' },
        { "no-discover", no_argument, 0, 'n' }, { "link-gbs", required_argument, 0, 'b' },
        { "gpus", required_argument, 0, 'g' }, { "listen", required_argument, 0, 'L' },
        { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    int json = 0, once = 0, c;
    double interval = 1.0;
    const char *url = NULL, *listen_at = NULL;
    sf_monitor_opts o;
    sf_monitor_opts_default(&o);
    optind = 1;
    while ((c = getopt_long(argc, argv, "joi:u:l:nb:g:h", lo, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'j': json = 1; break;
        case 'o': once = 1; break;
        case 'i':
            interval = strtod(optarg, &end);
            if (!end || *end || interval < 0.05 || interval > 3600) {
                fprintf(stderr, "semflow top: --interval '%s': give seconds between 0.05 and 3600\n", optarg);
                return 2;
            }
            break;
        case 'u': url = optarg; break;
        case 'l':
            if (o.n_cuda_libs >= SF_MON_MAX_LIBS) { fprintf(stderr, "semflow top: at most %d --lib\n", SF_MON_MAX_LIBS); return 2; }
            o.cuda_libs[o.n_cuda_libs++] = optarg;
            break;
        case 'n': o.no_discover = 1; break;
        case 'b':
            o.link_gbs = strtod(optarg, &end);
            if (!end || *end || o.link_gbs <= 0) { fprintf(stderr, "semflow top: --link-gbs '%s': give GB/s > 0\n", optarg); return 2; }
            break;
        case 'g':
            o.n_gpus = (int)strtol(optarg, &end, 10);
            if (!*optarg || *end || o.n_gpus < 1 || o.n_gpus > SF_MON_MAX_GPUS) {
                fprintf(stderr, "semflow top: --gpus '%s': give a count from 1 to %d\n", optarg, SF_MON_MAX_GPUS);
                return 2;
            }
            break;
        case 'L': listen_at = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) { fprintf(stderr, "semflow top: unexpected argument '%s'\n", argv[optind]); usage(stderr); return 2; }
    if (once && !json) { fprintf(stderr, "semflow top: --once goes with --json\n"); return 2; }

    /* snapshots at least as often as we print, and no slower than 0.1 s */
    o.interval_s = SF_MIN(0.1, interval);
    sf_monitor *m = NULL;
    sf_error err = { 0 };
    if (sf_monitor_open(&o, &m, &err) != SF_OK) {
        fprintf(stderr, "semflow top: %s\n", err.msg);
        if (!listen_at) return 1;
        m = NULL; /* the dashboard still serves, saying why the monitor is off */
    }
    if (listen_at) {
        int rc = serve_dashboard(m, m ? NULL : err.msg, listen_at);
        sf_monitor_close(m);
        return rc;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    if (json) {
        uint64_t seq = sf_monitor_wait(m, 0, 2.0);
        seq = sf_monitor_wait(m, seq, 2.0); /* two snapshots: rates cover a whole interval */
        double next = sf_now_s();
        while (!stop_flag) {
            if (!once) {
                next += interval;
                double d = next - sf_now_s();
                if (d > 0) usleep((useconds_t)(d * 1e6));
            }
            char *js = sf_monitor_json(m);
            if (!js || printf("%s\n", js) < 0 || fflush(stdout)) { free(js); break; }
            free(js);
            if (once) break;
        }
        sf_monitor_close(m);
        return 0;
    }

    setlocale(LC_ALL, "");
    if (!initscr()) { fprintf(stderr, "semflow top: cannot start the terminal UI (TERM=%s); try --json\n", getenv("TERM")); sf_monitor_close(m); return 1; }
    cbreak();
    noecho();
    curs_set(0);
    int ms = (int)(interval * 1000);
    timeout(ms);
    sf_monitor_wait(m, 0, 1.0);
    while (!stop_flag) {
        draw(m, url, ms);
        int ch = getch();
        if (ch == 'q' || ch == 'Q') break;
    }
    endwin();
    sf_monitor_close(m);
    return 0;
}
