/* monitor.h — the eBPF observation and steering API: the only bpf/ header the gateway, the
 * engine and the cli may include.
 *
 * Monitor: loads bpf/trace.bpf.c (uprobes on libcuda's copy entry points, tracepoints
 * sock:sock_send_length / sock:sock_recv_length), aggregates in kernel maps, and reads them
 * every interval on a thread of its own into a snapshot: per process H2D/D2H bytes, calls,
 * rates and copy-size histogram, socket bytes and rates; per cgroup socket bytes; per GPU the
 * PCIe contention index (DMA rate of processes other than ours / link bandwidth).
 * Byte counts are cumulative since sf_monitor_open.
 *
 * Steering: loads bpf/steer.bpf.c, an SK_REUSEPORT program, onto a listener group. Client
 * address prefixes map to lanes; within a lane the least-loaded worker (by the load the
 * caller reports) gets the connection; no matching prefix: the kernel's hash decides.
 *
 * Without BPF (not root, no BTF, built without SF_HAVE_BPF) the open calls fail with a
 * one-line reason in err and callers carry on without them. Every function accepts NULL
 * where it takes a handle, so callers need not branch.
 */
#ifndef SF_MONITOR_H
#define SF_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "../common/sf.h"

/* ---- monitor ------------------------------------------------------------------------ */
#define SF_MON_HIST 32     /* copy-size histogram: bucket i counts copies with floor(log2(bytes)) == i */
#define SF_MON_MAX_GPUS 16
#define SF_MON_MAX_LIBS 16

enum { SF_DIR_H2D = 0, SF_DIR_D2H = 1, SF_DIR_D2D = 2, SF_DIR_OTHER = 3, SF_DIR_COUNT = 4 };
/* SF_DIR_OTHER: cuMemcpy/cuMemcpyAsync/batch copies over unified addresses, whose direction
 * only the driver knows. */

typedef struct sf_monitor sf_monitor;

typedef struct sf_monitor_opts {
    double interval_s;        /* snapshot period; <= 0: 0.1 s */
    /* libcuda copies to attach to besides those discovered (ldconfig -p, /proc/<pid>/maps);
     * tests pass a library exporting the same symbols. */
    const char *cuda_libs[SF_MON_MAX_LIBS];
    int n_cuda_libs;
    int no_discover;          /* 1: attach only to cuda_libs */
    int no_uprobes;           /* 1: socket accounting only */
    /* PCIe link bandwidth per direction in GB/s, for the contention index: hal's measured
     * h2d_pinned_gbs at its largest chunk when there is a GPU. <= 0: nominal 32 GB/s (Gen4
     * x16) and the index is marked "nominal". */
    double link_gbs;
    /* > 0: the measured link of GPU g (hal's probe of that GPU), overriding link_gbs for it.
     * GPUs are numbered as NVML and /dev/nvidiaN number them (PCI bus order). */
    double link_gbs_gpu[SF_MON_MAX_GPUS];
    int n_gpus;               /* GPUs to report (0: 1, the host link) */
    int own_pid;              /* "our" process for the contention index, with its children (the
                               * tensor-parallel ranks); 0: getpid() */
} sf_monitor_opts;

void sf_monitor_opts_default(sf_monitor_opts *o);

typedef struct sf_mon_proc {
    int pid;
    char comm[16];
    uint64_t bytes[SF_DIR_COUNT], calls[SF_DIR_COUNT];   /* cumulative since open */
    double bytes_per_s[SF_DIR_COUNT];                    /* over the last interval */
    uint64_t hist[SF_MON_HIST];                          /* all directions */
    uint64_t sock_tx_bytes, sock_rx_bytes, sock_tx_calls, sock_rx_calls;
    double sock_tx_per_s, sock_rx_per_s;
} sf_mon_proc;

typedef struct sf_mon_cgroup {
    uint64_t id;              /* cgroup v2 inode id */
    char path[128];           /* relative to /sys/fs/cgroup where found, else "" */
    uint64_t sock_tx_bytes, sock_rx_bytes;
    double sock_tx_per_s, sock_rx_per_s;
} sf_mon_cgroup;

typedef struct sf_mon_gpu {
    int index;
    double link_gbs;          /* per direction */
    int link_measured;        /* 0: nominal bandwidth (no GPU measurement given) */
    double other_h2d_per_s, other_d2h_per_s; /* DMA bytes/s of processes other than ours */
    double own_h2d_per_s, own_d2h_per_s;
    double contention;        /* max over directions of other rate / link bandwidth, >= 0 */
    int nvml_ok;              /* NVML counters read this interval */
    double nvml_rx_per_s, nvml_tx_per_s; /* NVML PCIe throughput (RX = to the GPU), bytes/s */
    int nvml_link_gen, nvml_link_width;
} sf_mon_gpu;

/* A consistent copy of the latest interval. Owned by the caller: sf_mon_snapshot_free. */
typedef struct sf_mon_snapshot {
    uint64_t seq;             /* increments every interval */
    double t;                 /* seconds since open */
    double interval_s;        /* length of the interval the rates cover */
    int n_procs;
    sf_mon_proc *procs;       /* sorted by total PCIe + socket bytes, descending */
    int n_cgroups;
    sf_mon_cgroup *cgroups;
    int n_gpus;
    sf_mon_gpu gpus[SF_MON_MAX_GPUS];
    int n_uprobes;            /* uprobe attachments live */
    int n_libs;               /* libcuda copies attached */
} sf_mon_snapshot;

/* Load + attach + start the snapshot thread. On failure returns SF_EPERM (not root),
 * SF_EUNSUPPORTED (no BTF, BPF off in this build) or SF_ERROR with one line in err. */
int sf_monitor_open(const sf_monitor_opts *o, sf_monitor **out, sf_error *err);
void sf_monitor_close(sf_monitor *m);

/* Any thread. Copies the latest snapshot (zeroed when m is NULL or none taken yet). */
void sf_monitor_snapshot(sf_monitor *m, sf_mon_snapshot *out);
void sf_mon_snapshot_free(sf_mon_snapshot *s);
/* Blocks until a snapshot newer than seq exists or timeout_s passes; returns the latest seq. */
uint64_t sf_monitor_wait(sf_monitor *m, uint64_t seq, double timeout_s);
/* Latest contention index of GPU gpu (0 when m is NULL or gpu is out of range). Any thread,
 * cheap: the DMA scheduler calls it per chunk. */
double sf_monitor_contention(sf_monitor *m, int gpu);
/* Attach to another library exporting libcuda's copy symbols (any thread). */
int sf_monitor_attach_lib(sf_monitor *m, const char *path, sf_error *err);
/* 1 when the copies of the library at path (as discovered or given) are attached. Any thread. */
int sf_monitor_has_lib(sf_monitor *m, const char *path);

/* The latest snapshot as one JSON object (malloc'd, one line):
 *   {"t":..,"processes":[{"pid","comm","h2d_bytes","d2h_bytes","d2d_bytes","other_bytes",
 *    "h2d_calls",..,"h2d_bytes_per_s",..,"sock_tx_bytes","sock_rx_bytes",..,"copy_size_log2":[..]}],
 *    "cgroups":[..],"gpus":[{"index","contention","link_gbs","link":"measured"|"nominal",..}]}
 * m == NULL: {"bpf":false,...}. */
char *sf_monitor_json(sf_monitor *m);
/* Prometheus text exposition of the latest snapshot (malloc'd), for /metrics; metric names
 * start with semflow_bpf_ / semflow_pcie_ / semflow_socket_. m == NULL: semflow_bpf_up 0. */
char *sf_monitor_metrics(sf_monitor *m);

/* ---- steering ----------------------------------------------------------------------- */
#define SF_STEER_MAX_WORKERS 64
#define SF_STEER_MAX_LANES 8

typedef struct sf_steer sf_steer;

/* fds: listening sockets of one SO_REUSEPORT group (same address and port, all listening),
 * worker i owns fds[i]; lane_of[i] is the lane of worker i (0 .. SF_STEER_MAX_LANES-1).
 * Attaches the program to the group. Any thread. */
int sf_steer_attach(const int *fds, const int *lane_of, int n, sf_steer **out, sf_error *err);
void sf_steer_free(sf_steer *s);  /* detaches */
/* Clients whose address is in cidr ("10.1.0.0/16", "127.0.0.2", "fd00::/8") go to lane. */
int sf_steer_set_prefix(sf_steer *s, const char *cidr, int lane, sf_error *err);
int sf_steer_del_prefix(sf_steer *s, const char *cidr, sf_error *err);
/* Worker's in-flight requests; any thread, cheap (one map update). */
void sf_steer_set_load(sf_steer *s, int worker, uint32_t inflight);
/* Connections steered to each worker (n entries) and those left to the kernel's hash. */
int sf_steer_counts(sf_steer *s, uint64_t *per_worker, int n, uint64_t *fallback);

#endif
