/* monitor_fmt.c — the monitor's snapshot as JSON (jansson) and as Prometheus text. */
#include "bpf/monitor.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const dir_name[SF_DIR_COUNT] = { "h2d", "d2h", "d2d", "other" };

static json_t *proc_json(const sf_mon_proc *p)
{
    json_t *o = json_object(), *h = json_array();
    char k[64];
    json_object_set_new(o, "pid", json_integer(p->pid));
    json_object_set_new(o, "comm", json_string(p->comm));
    for (int d = 0; d < SF_DIR_COUNT; d++) {
        snprintf(k, sizeof k, "%s_bytes", dir_name[d]);
        json_object_set_new(o, k, json_integer((json_int_t)p->bytes[d]));
        snprintf(k, sizeof k, "%s_calls", dir_name[d]);
        json_object_set_new(o, k, json_integer((json_int_t)p->calls[d]));
        snprintf(k, sizeof k, "%s_bytes_per_s", dir_name[d]);
        json_object_set_new(o, k, json_real(p->bytes_per_s[d]));
    }
    json_object_set_new(o, "sock_tx_bytes", json_integer((json_int_t)p->sock_tx_bytes));
    json_object_set_new(o, "sock_rx_bytes", json_integer((json_int_t)p->sock_rx_bytes));
    json_object_set_new(o, "sock_tx_calls", json_integer((json_int_t)p->sock_tx_calls));
    json_object_set_new(o, "sock_rx_calls", json_integer((json_int_t)p->sock_rx_calls));
    json_object_set_new(o, "sock_tx_bytes_per_s", json_real(p->sock_tx_per_s));
    json_object_set_new(o, "sock_rx_bytes_per_s", json_real(p->sock_rx_per_s));
    int last = -1;
    for (int i = 0; i < SF_MON_HIST; i++) if (p->hist[i]) last = i;
    for (int i = 0; i <= last; i++) json_array_append_new(h, json_integer((json_int_t)p->hist[i]));
    json_object_set_new(o, "copy_size_log2", h);
    return o;
}

static json_t *gpu_json(const sf_mon_gpu *g)
{
    json_t *o = json_object();
    json_object_set_new(o, "index", json_integer(g->index));
    json_object_set_new(o, "contention", json_real(g->contention));
    json_object_set_new(o, "link_gbs", json_real(g->link_gbs));
    json_object_set_new(o, "link", json_string(g->link_measured ? "measured" : "nominal"));
    json_object_set_new(o, "other_h2d_bytes_per_s", json_real(g->other_h2d_per_s));
    json_object_set_new(o, "other_d2h_bytes_per_s", json_real(g->other_d2h_per_s));
    json_object_set_new(o, "own_h2d_bytes_per_s", json_real(g->own_h2d_per_s));
    json_object_set_new(o, "own_d2h_bytes_per_s", json_real(g->own_d2h_per_s));
    if (g->nvml_ok) {
        json_object_set_new(o, "nvml_rx_bytes_per_s", json_real(g->nvml_rx_per_s));
        json_object_set_new(o, "nvml_tx_bytes_per_s", json_real(g->nvml_tx_per_s));
        json_object_set_new(o, "nvml_link_gen", json_integer(g->nvml_link_gen));
        json_object_set_new(o, "nvml_link_width", json_integer(g->nvml_link_width));
    }
    return o;
}

char *sf_monitor_json(sf_monitor *m)
{
    sf_mon_snapshot s;
    json_t *root = json_object(), *procs = json_array(), *cgs = json_array(), *gpus = json_array();
    char *out;

    sf_monitor_snapshot(m, &s);
    json_object_set_new(root, "bpf", json_boolean(m != NULL));
    json_object_set_new(root, "seq", json_integer((json_int_t)s.seq));
    json_object_set_new(root, "t", json_real(s.t));
    json_object_set_new(root, "interval_s", json_real(s.interval_s));
    json_object_set_new(root, "uprobes", json_integer(s.n_uprobes));
    json_object_set_new(root, "cuda_libs", json_integer(s.n_libs));
    for (int i = 0; i < s.n_procs; i++) json_array_append_new(procs, proc_json(&s.procs[i]));
    for (int i = 0; i < s.n_cgroups; i++) {
        const sf_mon_cgroup *c = &s.cgroups[i];
        json_t *o = json_object();
        json_object_set_new(o, "id", json_integer((json_int_t)c->id));
        json_object_set_new(o, "path", json_string(c->path));
        json_object_set_new(o, "sock_tx_bytes", json_integer((json_int_t)c->sock_tx_bytes));
        json_object_set_new(o, "sock_rx_bytes", json_integer((json_int_t)c->sock_rx_bytes));
        json_object_set_new(o, "sock_tx_bytes_per_s", json_real(c->sock_tx_per_s));
        json_object_set_new(o, "sock_rx_bytes_per_s", json_real(c->sock_rx_per_s));
        json_array_append_new(cgs, o);
    }
    for (int i = 0; i < s.n_gpus; i++) json_array_append_new(gpus, gpu_json(&s.gpus[i]));
    json_object_set_new(root, "processes", procs);
    json_object_set_new(root, "cgroups", cgs);
    json_object_set_new(root, "gpus", gpus);
    out = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    sf_mon_snapshot_free(&s);
    return out;
}

/* ---- Prometheus text ----------------------------------------------------------------- */
typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (b->p && b->n + (size_t)k < b->cap) { b->n += (size_t)k; return; }
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->n + (size_t)k + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = cap;
    }
}

/* Label values: comm may hold any byte but quote, backslash and newline are escaped. */
static void esc(char *dst, size_t cap, const char *s)
{
    size_t j = 0;
    for (; *s && j + 2 < cap; s++) {
        if (*s == '"' || *s == '\\') dst[j++] = '\\';
        if (*s == '\n') { dst[j++] = '\\'; dst[j++] = 'n'; continue; }
        dst[j++] = *s;
    }
    dst[j] = 0;
}

char *sf_monitor_metrics(sf_monitor *m)
{
    sbuf b = { 0 };
    sf_mon_snapshot s;
    uint64_t hist[SF_MON_HIST] = { 0 }, hsum = 0, hcount = 0;

    sb_printf(&b, "# HELP semflow_bpf_up 1 when the eBPF monitor is loaded and attached.\n"
                  "# TYPE semflow_bpf_up gauge\nsemflow_bpf_up %d\n", m != NULL);
    if (!m) return b.p;
    sf_monitor_snapshot(m, &s);
    sb_printf(&b, "# TYPE semflow_bpf_uprobes gauge\nsemflow_bpf_uprobes %d\n", s.n_uprobes);
    sb_printf(&b, "# HELP semflow_pcie_bytes_total Bytes copied through libcuda per process and direction.\n"
                  "# TYPE semflow_pcie_bytes_total counter\n");
    for (int i = 0; i < s.n_procs; i++) {
        char c[40];
        esc(c, sizeof c, s.procs[i].comm);
        for (int d = 0; d < SF_DIR_COUNT; d++)
            if (s.procs[i].calls[d])
                sb_printf(&b, "semflow_pcie_bytes_total{pid=\"%d\",comm=\"%s\",dir=\"%s\"} %llu\n", s.procs[i].pid, c,
                          dir_name[d], (unsigned long long)s.procs[i].bytes[d]);
    }
    sb_printf(&b, "# TYPE semflow_pcie_copies_total counter\n");
    for (int i = 0; i < s.n_procs; i++) {
        char c[40];
        esc(c, sizeof c, s.procs[i].comm);
        for (int d = 0; d < SF_DIR_COUNT; d++)
            if (s.procs[i].calls[d])
                sb_printf(&b, "semflow_pcie_copies_total{pid=\"%d\",comm=\"%s\",dir=\"%s\"} %llu\n", s.procs[i].pid,
                          c, dir_name[d], (unsigned long long)s.procs[i].calls[d]);
        for (int h = 0; h < SF_MON_HIST; h++) {
            hist[h] += s.procs[i].hist[h];
            hcount += s.procs[i].hist[h];
        }
        for (int d = 0; d < SF_DIR_COUNT; d++) hsum += s.procs[i].bytes[d];
    }
    sb_printf(&b, "# HELP semflow_pcie_copy_size_bytes Sizes of libcuda copies, all processes.\n"
                  "# TYPE semflow_pcie_copy_size_bytes histogram\n");
    uint64_t cum = 0;
    for (int h = 0; h < SF_MON_HIST; h++) {
        cum += hist[h];
        sb_printf(&b, "semflow_pcie_copy_size_bytes_bucket{le=\"%llu\"} %llu\n", (2ULL << h) - 1,
                  (unsigned long long)cum);
    }
    sb_printf(&b, "semflow_pcie_copy_size_bytes_bucket{le=\"+Inf\"} %llu\n"
                  "semflow_pcie_copy_size_bytes_sum %llu\nsemflow_pcie_copy_size_bytes_count %llu\n",
              (unsigned long long)hcount, (unsigned long long)hsum, (unsigned long long)hcount);
    sb_printf(&b, "# HELP semflow_socket_bytes_total TCP/UDP bytes per process (sock_send_length/sock_recv_length).\n"
                  "# TYPE semflow_socket_bytes_total counter\n");
    for (int i = 0; i < s.n_procs; i++) {
        char c[40];
        if (!s.procs[i].sock_tx_calls && !s.procs[i].sock_rx_calls) continue;
        esc(c, sizeof c, s.procs[i].comm);
        sb_printf(&b, "semflow_socket_bytes_total{pid=\"%d\",comm=\"%s\",dir=\"tx\"} %llu\n", s.procs[i].pid, c,
                  (unsigned long long)s.procs[i].sock_tx_bytes);
        sb_printf(&b, "semflow_socket_bytes_total{pid=\"%d\",comm=\"%s\",dir=\"rx\"} %llu\n", s.procs[i].pid, c,
                  (unsigned long long)s.procs[i].sock_rx_bytes);
    }
    sb_printf(&b, "# TYPE semflow_cgroup_socket_bytes_total counter\n");
    for (int i = 0; i < s.n_cgroups; i++) {
        char p[300];
        esc(p, sizeof p, s.cgroups[i].path);
        sb_printf(&b, "semflow_cgroup_socket_bytes_total{cgroup_id=\"%llu\",cgroup=\"%s\",dir=\"tx\"} %llu\n",
                  (unsigned long long)s.cgroups[i].id, p, (unsigned long long)s.cgroups[i].sock_tx_bytes);
        sb_printf(&b, "semflow_cgroup_socket_bytes_total{cgroup_id=\"%llu\",cgroup=\"%s\",dir=\"rx\"} %llu\n",
                  (unsigned long long)s.cgroups[i].id, p, (unsigned long long)s.cgroups[i].sock_rx_bytes);
    }
    sb_printf(&b, "# HELP semflow_pcie_contention_index DMA rate of other processes / link bandwidth (max over directions).\n"
                  "# TYPE semflow_pcie_contention_index gauge\n");
    for (int g = 0; g < s.n_gpus; g++)
        sb_printf(&b, "semflow_pcie_contention_index{gpu=\"%d\",link=\"%s\"} %.6f\n", g,
                  s.gpus[g].link_measured ? "measured" : "nominal", s.gpus[g].contention);
    sb_printf(&b, "# TYPE semflow_pcie_link_bytes_per_second gauge\n");
    for (int g = 0; g < s.n_gpus; g++)
        sb_printf(&b, "semflow_pcie_link_bytes_per_second{gpu=\"%d\"} %.0f\n", g, s.gpus[g].link_gbs * 1e9);
    sb_printf(&b, "# TYPE semflow_pcie_nvml_bytes_per_second gauge\n");
    for (int g = 0; g < s.n_gpus; g++) {
        if (!s.gpus[g].nvml_ok) continue;
        sb_printf(&b, "semflow_pcie_nvml_bytes_per_second{gpu=\"%d\",dir=\"rx\"} %.0f\n", g, s.gpus[g].nvml_rx_per_s);
        sb_printf(&b, "semflow_pcie_nvml_bytes_per_second{gpu=\"%d\",dir=\"tx\"} %.0f\n", g, s.gpus[g].nvml_tx_per_s);
    }
    sf_mon_snapshot_free(&s);
    if (b.oom) { free(b.p); return NULL; }
    return b.p;
}
