/* monitor.c — loads bpf/trace.bpf.c, attaches it (tracepoints; uprobes on every libcuda
 * found), and turns its maps into snapshots on a thread of its own (see monitor.h).
 *
 * Threads: the snapshot thread owns the BPF maps' reading, the pid table and the NVML handle;
 * `mu` guards the published snapshot, `attach_mu` the uprobe links (sf_monitor_attach_lib may
 * be called from any thread). */
#include "bpf/monitor.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void sf_monitor_opts_default(sf_monitor_opts *o)
{
    memset(o, 0, sizeof *o);
    o->interval_s = 0.1;
}

void sf_mon_snapshot_free(sf_mon_snapshot *s)
{
    if (!s) return;
    free(s->procs);
    free(s->cgroups);
    memset(s, 0, sizeof *s);
}

#ifdef SF_HAVE_BPF
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include "bpf/bpf_util.h"
#include "bpf/nvml.h"
#include "bpf/trace.h"
#include "bpf/trace.skel.h"

#define NOMINAL_LINK_GBS 32.0
#define PRUNE_AFTER_S 10.0

typedef struct pidinfo {
    int pid;
    char comm[16];
    double dead_since;      /* 0: alive when last checked */
    unsigned gpu_mask;      /* GPUs it has a context on (NVML), else /dev/nvidiaN held open */
    int has_dma;            /* seen copying: worth looking for its GPUs */
    int ppid;               /* parent when first seen (0: unknown) */
} pidinfo;

struct sf_monitor {
    sf_monitor_opts o;
    struct trace_bpf *skel;
    struct bpf_link *tp_send, *tp_recv;
    pthread_mutex_t attach_mu;
    struct bpf_link **links;
    int n_links, cap_links;
    char libs[SF_MON_MAX_LIBS][512];
    int n_libs;

    pthread_t thr;
    int thr_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
    sf_mon_snapshot cur;    /* guarded by mu */

    /* snapshot thread only */
    double t0, t_prev, t_slow, t_discover, t_ldconfig;
    int ncpu;
    pidinfo *pids;
    int n_pids, cap_pids;
    sf_nvml *nvml;
    sf_mon_gpu nvml_last[SF_MON_MAX_GPUS];
    unsigned nvml_pids[SF_MON_MAX_GPUS][64]; /* compute processes per GPU, refreshed every second */
    int n_nvml_pids[SF_MON_MAX_GPUS];        /* -1: NVML cannot say */
    int *scanned, n_scanned, *new_scanned, n_new, cap_new; /* discovery: maps already read */
    sf_mon_cgroup *cgnames; /* id -> path cache */
    int n_cgnames;
    double t_cgwalk;
};

/* ---- uprobes ------------------------------------------------------------------------- */
static int attach_lib_locked(sf_monitor *m, const char *path, sf_error *err)
{
    const char *names[128] = { 0 };
    uint64_t offs[128], done[128];
    int n = 0, n_done = 0, rc;

    for (int i = 0; i < m->n_libs; i++)
        if (!strcmp(m->libs[i], path)) return SF_OK;
    if (m->n_libs >= SF_MON_MAX_LIBS)
        return sf_err(err, SF_EINVAL, "attaching %s: already %d libraries attached", path, SF_MON_MAX_LIBS);
    for (; sf_cuda_syms[n].name && n < 128; n++) names[n] = sf_cuda_syms[n].name;
    if ((rc = sf_elf_sym_offsets(path, names, n, offs, err)) != SF_OK) return rc;
    for (int i = 0; i < n; i++) {
        const sf_cuda_sym *s = &sf_cuda_syms[i];
        int dup = 0;
        if (!offs[i]) continue;  /* symbol absent in this driver version */
        for (int k = 0; k < n_done; k++) dup |= done[k] == offs[i]; /* aliases: count once */
        if (dup) continue;
        if (m->n_links == m->cap_links) {
            int cap = m->cap_links ? 2 * m->cap_links : 64;
            struct bpf_link **nl = realloc(m->links, (size_t)cap * sizeof *nl);
            if (!nl) return sf_err(err, SF_ENOMEM, "attaching %s: out of memory", path);
            m->links = nl;
            m->cap_links = cap;
        }
        LIBBPF_OPTS(bpf_uprobe_opts, uo, .bpf_cookie = SF_TR_COOKIE(s->dir, s->arg, s->kind));
        struct bpf_link *l = bpf_program__attach_uprobe_opts(m->skel->progs.on_copy, -1, path, offs[i], &uo);
        if (!l) {
            SF_LOGW("monitor: uprobe on %s:%s failed: %s", path, s->name, strerror(errno));
            continue;
        }
        m->links[m->n_links++] = l;
        done[n_done++] = offs[i];
    }
    if (!n_done) return sf_err(err, SF_ENOTFOUND, "%s exports none of libcuda's copy functions", path);
    snprintf(m->libs[m->n_libs++], sizeof m->libs[0], "%s", path);
    SF_LOGI("monitor: %d copy entry points of %s traced", n_done, path);
    return SF_OK;
}

int sf_monitor_attach_lib(sf_monitor *m, const char *path, sf_error *err)
{
    if (!m) return sf_err(err, SF_EINVAL, "monitor is off");
    pthread_mutex_lock(&m->attach_mu);
    int rc = attach_lib_locked(m, path, err);
    pthread_mutex_unlock(&m->attach_mu);
    return rc;
}

int sf_monitor_has_lib(sf_monitor *m, const char *path)
{
    int found = 0;
    if (!m) return 0;
    pthread_mutex_lock(&m->attach_mu);
    for (int i = 0; i < m->n_libs && !found; i++) found = !strcmp(m->libs[i], path);
    pthread_mutex_unlock(&m->attach_mu);
    return found;
}

/* Pids whose maps were read since the last full scan (sorted), so that the 5 s scans read only
 * processes started since; a full scan each minute catches libcuda dlopen'd later. */
static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int scanned_before(int pid, void *arg)
{
    sf_monitor *m = arg;
    if (m->scanned && bsearch(&pid, m->scanned, (size_t)m->n_scanned, sizeof *m->scanned, cmp_int)) return 1;
    if (m->n_new == m->cap_new) {
        int cap = m->cap_new ? 2 * m->cap_new : 256;
        int *nn = realloc(m->new_scanned, (size_t)cap * sizeof *nn);
        if (!nn) return 0;
        m->new_scanned = nn;
        m->cap_new = cap;
    }
    m->new_scanned[m->n_new++] = pid;
    return 0;
}

static void discover(sf_monitor *m, int full)
{
    char paths[SF_MON_MAX_LIBS][512];
    if (full) m->n_scanned = 0;
    m->n_new = 0;
    int n = sf_cuda_discover_filtered(paths, SF_MON_MAX_LIBS, full, scanned_before, m);
    int *all = m->n_new ? realloc(m->scanned, (size_t)(m->n_scanned + m->n_new) * sizeof *all) : NULL;
    if (all) {
        memcpy(all + m->n_scanned, m->new_scanned, (size_t)m->n_new * sizeof *all);
        m->n_scanned += m->n_new;
        qsort(all, (size_t)m->n_scanned, sizeof *all, cmp_int);
        m->scanned = all;
    }
    for (int i = 0; i < n; i++) {
        sf_error e = { 0 };
        if (sf_monitor_attach_lib(m, paths[i], &e) != SF_OK) SF_LOGD("monitor: %s", e.msg);
    }
}

/* ---- pid table ------------------------------------------------------------------------ */
static pidinfo *pid_get(sf_monitor *m, int pid)
{
    for (int i = 0; i < m->n_pids; i++)
        if (m->pids[i].pid == pid) return &m->pids[i];
    if (m->n_pids == m->cap_pids) {
        int cap = m->cap_pids ? 2 * m->cap_pids : 64;
        pidinfo *np = realloc(m->pids, (size_t)cap * sizeof *np);
        if (!np) return NULL;
        m->pids = np;
        m->cap_pids = cap;
    }
    pidinfo *p = &m->pids[m->n_pids++];
    memset(p, 0, sizeof *p);
    p->pid = pid;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    FILE *f = fopen(path, "re");
    if (f && fgets(p->comm, sizeof p->comm, f)) p->comm[strcspn(p->comm, "\n")] = 0;
    else snprintf(p->comm, sizeof p->comm, "?");
    if (f) fclose(f);
    /* comm is any bytes a process chose: keep printable ASCII for JSON, labels and terminals */
    for (char *c = p->comm; *c; c++)
        if (*c < 0x20 || *c > 0x7e || *c == '"' || *c == '\\') *c = '?';
    /* the parent: field 4 of /proc/PID/stat, after the ')' that closes comm */
    char st[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if ((f = fopen(path, "re"))) {
        size_t n = fread(st, 1, sizeof st - 1, f);
        st[n] = 0;
        const char *q = strrchr(st, ')');
        if (q) sscanf(q + 1, " %*c %d", &p->ppid);
        fclose(f);
    }
    return p;
}

static unsigned gpu_fds_of(int pid);

/* The GPUs a process copies to: those NVML lists it on (a compute context: what the copies
 * need), else the /dev/nvidiaN it holds open (a CUDA process may open every visible device). */
static unsigned gpu_mask_of(sf_monitor *m, int pid)
{
    unsigned nv = 0;
    int nvml_knows = 0;
    for (int g = 0; g < SF_MON_MAX_GPUS; g++) {
        if (m->n_nvml_pids[g] < 0) continue;
        nvml_knows = 1;
        for (int i = 0; i < m->n_nvml_pids[g]; i++)
            if (m->nvml_pids[g][i] == (unsigned)pid) nv |= 1u << g;
    }
    if (nvml_knows && nv) return nv;
    return gpu_fds_of(pid);
}

static unsigned gpu_fds_of(int pid)
{
    char path[64], target[64];
    unsigned mask = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char fp[128];
        snprintf(fp, sizeof fp, "%s/%s", path, de->d_name);
        ssize_t n = readlink(fp, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        int idx;
        if (sscanf(target, "/dev/nvidia%d", &idx) == 1 && idx >= 0 && idx < 32) mask |= 1u << idx;
    }
    if (d) closedir(d);
    return mask;
}

/* Once a second: mark dead pids, drop their map entries after PRUNE_AFTER_S, refresh GPUs. */
static void pids_maintain(sf_monitor *m, double now)
{
    for (int i = 0; i < m->n_pids; i++) {
        pidinfo *p = &m->pids[i];
        int alive = kill(p->pid, 0) == 0 || errno == EPERM;
        if (alive) {
            p->dead_since = 0;
            if (p->has_dma) p->gpu_mask = gpu_mask_of(m, p->pid);
            continue;
        }
        if (!p->dead_since) p->dead_since = now;
        if (now - p->dead_since < PRUNE_AFTER_S) continue;
        for (unsigned d = 0; d < SF_TR_DIRS; d++) {
            struct sf_tr_dma_key k = { .tgid = (unsigned)p->pid, .dir = d };
            bpf_map_delete_elem(bpf_map__fd(m->skel->maps.dma), &k);
        }
        uint32_t tg = (uint32_t)p->pid;
        bpf_map_delete_elem(bpf_map__fd(m->skel->maps.sock_pid), &tg);
        m->pids[i--] = m->pids[--m->n_pids];
    }
}

/* ---- cgroup names ---------------------------------------------------------------------- */
static void cg_walk(sf_monitor *m, const char *dir, int depth, int *budget)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) && *budget > 0) {
        char p[1024];
        struct stat st;
        if (de->d_type != DT_DIR || de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        if (stat(p, &st)) continue;
        (*budget)--;
        sf_mon_cgroup *nc = realloc(m->cgnames, (size_t)(m->n_cgnames + 1) * sizeof *nc);
        if (!nc) break;
        m->cgnames = nc;
        memset(&nc[m->n_cgnames], 0, sizeof *nc);
        nc[m->n_cgnames].id = st.st_ino;
        snprintf(nc[m->n_cgnames].path, sizeof nc->path, "%s", p + strlen("/sys/fs/cgroup"));
        m->n_cgnames++;
        if (depth < 6) cg_walk(m, p, depth + 1, budget);
    }
    if (d) closedir(d);
}

static const char *cg_name(sf_monitor *m, uint64_t id, double now)
{
    for (int i = 0; i < m->n_cgnames; i++)
        if (m->cgnames[i].id == id) return m->cgnames[i].path;
    if (now - m->t_cgwalk > 5.0) {  /* an unknown cgroup: rescan, at most every 5 s */
        int budget = 4096;
        m->t_cgwalk = now;
        m->n_cgnames = 0;
        cg_walk(m, "/sys/fs/cgroup", 0, &budget);
        struct stat st;
        if (stat("/sys/fs/cgroup", &st) == 0 && st.st_ino == id) return "/";
        for (int i = 0; i < m->n_cgnames; i++)
            if (m->cgnames[i].id == id) return m->cgnames[i].path;
    }
    return "";
}

/* ---- snapshot ------------------------------------------------------------------------- */
static sf_mon_proc *proc_get(sf_mon_proc **procs, int *n, int *cap, int pid)
{
    for (int i = 0; i < *n; i++)
        if ((*procs)[i].pid == pid) return &(*procs)[i];
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 64;
        sf_mon_proc *np = realloc(*procs, (size_t)c * sizeof *np);
        if (!np) return NULL;
        *procs = np;
        *cap = c;
    }
    sf_mon_proc *p = &(*procs)[(*n)++];
    memset(p, 0, sizeof *p);
    p->pid = pid;
    return p;
}

static uint64_t proc_total(const sf_mon_proc *p)
{
    uint64_t t = p->sock_tx_bytes + p->sock_rx_bytes;
    for (int d = 0; d < SF_DIR_COUNT; d++) t += p->bytes[d];
    return t;
}

static int by_total_desc(const void *a, const void *b)
{
    uint64_t x = proc_total(a), y = proc_total(b);
    if (x != y) return x < y ? 1 : -1;
    return ((const sf_mon_proc *)a)->pid - ((const sf_mon_proc *)b)->pid;
}

static double rate(uint64_t cur, uint64_t prev, double dt)
{
    return cur >= prev && dt > 0 ? (double)(cur - prev) / dt : 0;
}

static int take_snapshot(sf_monitor *m, sf_mon_snapshot *s, const sf_mon_snapshot *prev, double now)
{
    int ncpu = m->ncpu, cap = 0, cgcap = 0;
    struct sf_tr_dma_val *dv = calloc((size_t)ncpu, sizeof *dv);
    struct sf_tr_sock_val *sv = calloc((size_t)ncpu, sizeof *sv);
    if (!dv || !sv) goto oom;
    double dt = now - m->t_prev;

    /* copies per (tgid, dir) */
    int fd = bpf_map__fd(m->skel->maps.dma);
    struct sf_tr_dma_key dk, dkeep, *dprev = NULL;
    while (bpf_map_get_next_key(fd, dprev, &dk) == 0) {
        dkeep = dk;
        dprev = &dkeep;
        if (bpf_map_lookup_elem(fd, &dk, dv) || dk.dir >= SF_DIR_COUNT) continue;
        sf_mon_proc *p = proc_get(&s->procs, &s->n_procs, &cap, (int)dk.tgid);
        if (!p) goto oom;
        for (int c = 0; c < ncpu; c++) {
            p->bytes[dk.dir] += dv[c].bytes;
            p->calls[dk.dir] += dv[c].calls;
            for (int h = 0; h < SF_MON_HIST; h++) p->hist[h] += dv[c].hist[h];
        }
    }
    /* sockets per tgid */
    fd = bpf_map__fd(m->skel->maps.sock_pid);
    uint32_t pk, pkeep, *pprev = NULL;
    while (bpf_map_get_next_key(fd, pprev, &pk) == 0) {
        pkeep = pk;
        pprev = &pkeep;
        if (bpf_map_lookup_elem(fd, &pk, sv)) continue;
        sf_mon_proc *p = proc_get(&s->procs, &s->n_procs, &cap, (int)pk);
        if (!p) goto oom;
        for (int c = 0; c < ncpu; c++) {
            p->sock_tx_bytes += sv[c].tx_bytes;
            p->sock_rx_bytes += sv[c].rx_bytes;
            p->sock_tx_calls += sv[c].tx_calls;
            p->sock_rx_calls += sv[c].rx_calls;
        }
    }
    /* sockets per cgroup */
    fd = bpf_map__fd(m->skel->maps.sock_cg);
    uint64_t ck, ckeep, *cprev = NULL;
    while (bpf_map_get_next_key(fd, cprev, &ck) == 0) {
        ckeep = ck;
        cprev = &ckeep;
        if (bpf_map_lookup_elem(fd, &ck, sv)) continue;
        if (s->n_cgroups == cgcap) {
            cgcap = cgcap ? 2 * cgcap : 16;
            sf_mon_cgroup *nc = realloc(s->cgroups, (size_t)cgcap * sizeof *nc);
            if (!nc) goto oom;
            s->cgroups = nc;
        }
        sf_mon_cgroup *g = &s->cgroups[s->n_cgroups++];
        memset(g, 0, sizeof *g);
        g->id = ck;
        snprintf(g->path, sizeof g->path, "%s", cg_name(m, ck, now));
        for (int c = 0; c < ncpu; c++) {
            g->sock_tx_bytes += sv[c].tx_bytes;
            g->sock_rx_bytes += sv[c].rx_bytes;
        }
        for (int i = 0; prev && i < prev->n_cgroups; i++) {
            if (prev->cgroups[i].id != ck) continue;
            g->sock_tx_per_s = rate(g->sock_tx_bytes, prev->cgroups[i].sock_tx_bytes, dt);
            g->sock_rx_per_s = rate(g->sock_rx_bytes, prev->cgroups[i].sock_rx_bytes, dt);
        }
    }

    /* rates, names, GPU attribution */
    s->n_gpus = m->o.n_gpus > 0 ? SF_MIN(m->o.n_gpus, SF_MON_MAX_GPUS) : 1;
    for (int g = 0; g < s->n_gpus; g++) {
        sf_mon_gpu *G = &s->gpus[g];
        *G = m->nvml_last[g];
        G->index = g;
        double bw = m->o.link_gbs_gpu[g] > 0 ? m->o.link_gbs_gpu[g] : m->o.link_gbs;
        G->link_measured = bw > 0;
        G->link_gbs = G->link_measured ? bw : NOMINAL_LINK_GBS;
        G->other_h2d_per_s = G->other_d2h_per_s = G->own_h2d_per_s = G->own_d2h_per_s = 0;
    }
    for (int i = 0; i < s->n_procs; i++) {
        sf_mon_proc *p = &s->procs[i];
        const sf_mon_proc *q = NULL;
        for (int k = 0; prev && k < prev->n_procs && !q; k++)
            if (prev->procs[k].pid == p->pid) q = &prev->procs[k];
        if (q) {
            for (int d = 0; d < SF_DIR_COUNT; d++) p->bytes_per_s[d] = rate(p->bytes[d], q->bytes[d], dt);
            p->sock_tx_per_s = rate(p->sock_tx_bytes, q->sock_tx_bytes, dt);
            p->sock_rx_per_s = rate(p->sock_rx_bytes, q->sock_rx_bytes, dt);
        }
        pidinfo *pi = pid_get(m, p->pid);
        if (!pi) goto oom;
        memcpy(p->comm, pi->comm, sizeof p->comm);
        for (int d = 0; d < SF_DIR_COUNT; d++) pi->has_dma |= p->calls[d] != 0;
        unsigned mask = pi->gpu_mask & ((1u << s->n_gpus) - 1);
        if (!mask) mask = 1;  /* no /dev/nvidiaN open (or not visible): the first GPU's link */
        int share = __builtin_popcount(mask);
        /* ours: the server and the processes it started (tensor-parallel ranks) */
        int own = p->pid == m->o.own_pid || (pi->ppid && pi->ppid == m->o.own_pid);
        for (int g = 0; g < s->n_gpus; g++) {
            if (!(mask & (1u << g))) continue;
            sf_mon_gpu *G = &s->gpus[g];
            *(own ? &G->own_h2d_per_s : &G->other_h2d_per_s) += p->bytes_per_s[SF_DIR_H2D] / share;
            *(own ? &G->own_d2h_per_s : &G->other_d2h_per_s) += p->bytes_per_s[SF_DIR_D2H] / share;
        }
    }
    for (int g = 0; g < s->n_gpus; g++) {
        sf_mon_gpu *G = &s->gpus[g];
        double bw = G->link_gbs * 1e9;
        G->contention = SF_MAX(G->other_h2d_per_s, G->other_d2h_per_s) / bw;
    }
    if (s->n_procs) qsort(s->procs, (size_t)s->n_procs, sizeof *s->procs, by_total_desc);
    s->t = now - m->t0;
    s->interval_s = dt;
    pthread_mutex_lock(&m->attach_mu);
    s->n_uprobes = m->n_links;
    s->n_libs = m->n_libs;
    pthread_mutex_unlock(&m->attach_mu);
    free(dv);
    free(sv);
    return SF_OK;
oom:
    free(dv);
    free(sv);
    sf_mon_snapshot_free(s);
    return SF_ENOMEM;
}

static void *monitor_thread(void *arg)
{
    sf_monitor *m = arg;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(m->o.interval_s * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&m->cv, &m->mu, &ts);
        if (m->stop) break;
        sf_mon_snapshot prev = m->cur; /* only this thread replaces cur: safe to read unlocked */
        pthread_mutex_unlock(&m->mu);

        double now = sf_now_s();
        if (now - m->t_slow >= 1.0) {
            m->t_slow = now;
            for (int g = 0; g < SF_MON_MAX_GPUS; g++)
                m->n_nvml_pids[g] = m->nvml && g < SF_MAX(m->o.n_gpus, 1)
                                        ? sf_nvml_pids(m->nvml, g, m->nvml_pids[g], 64) : -1;
            pids_maintain(m, now);
            for (int g = 0; m->nvml && g < SF_MIN(SF_MAX(m->o.n_gpus, 1), SF_MON_MAX_GPUS); g++) {
                sf_mon_gpu *G = &m->nvml_last[g];
                G->nvml_ok = sf_nvml_pcie(m->nvml, g, &G->nvml_rx_per_s, &G->nvml_tx_per_s, &G->nvml_link_gen,
                                          &G->nvml_link_width) == 0;
            }
        }
        /* new GPU processes (containers bring their own libcuda): new processes' maps every
         * 5 s; every process's maps and the ldconfig cache (which takes running a process)
         * every minute */
        if (!m->o.no_discover && !m->o.no_uprobes && now - m->t_discover >= 5.0) {
            m->t_discover = now;
            int ld = now - m->t_ldconfig >= 60.0;
            if (ld) m->t_ldconfig = now;
            discover(m, ld);
        }
        sf_mon_snapshot s = { 0 };
        int rc = take_snapshot(m, &s, &prev, now);
        pthread_mutex_lock(&m->mu);
        if (rc == SF_OK) {
            s.seq = prev.seq + 1;
            m->cur = s;
            m->t_prev = now;
            sf_mon_snapshot_free(&prev);
            pthread_cond_broadcast(&m->cv);
        }
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

int sf_monitor_open(const sf_monitor_opts *o, sf_monitor **out, sf_error *err)
{
    sf_monitor *m = NULL;
    int rc;

    *out = NULL;
    if ((rc = sf_bpf_check(err)) != SF_OK) return rc;
    if ((rc = sf_bpf_mount_tracefs(err)) != SF_OK) return rc;
    if (!(m = calloc(1, sizeof *m))) return sf_err(err, SF_ENOMEM, "monitor: out of memory");
    if (o) m->o = *o;
    else sf_monitor_opts_default(&m->o);
    if (m->o.interval_s <= 0) m->o.interval_s = 0.1;
    if (!m->o.own_pid) m->o.own_pid = getpid();
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->attach_mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    if ((m->ncpu = libbpf_num_possible_cpus()) <= 0) {
        rc = sf_err(err, SF_ERROR, "monitor: cannot count possible CPUs: %s", strerror(-m->ncpu));
        goto fail;
    }
    if (!(m->skel = trace_bpf__open())) {
        rc = sf_err(err, SF_ERROR, "monitor: opening the BPF object failed: %s", strerror(errno));
        goto fail;
    }
    if (trace_bpf__load(m->skel)) {
        rc = sf_err(err, errno == EPERM ? SF_EPERM : SF_ERROR,
                    "monitor: loading the BPF programs failed: %s (SEMFLOW_LOG=debug shows the verifier log)",
                    strerror(errno));
        goto fail;
    }
    if (!(m->tp_send = bpf_program__attach(m->skel->progs.on_send)) ||
        !(m->tp_recv = bpf_program__attach(m->skel->progs.on_recv))) {
        rc = sf_err(err, errno == EPERM ? SF_EPERM : SF_ERROR,
                    "monitor: attaching to tracepoints sock:sock_send_length/sock_recv_length failed: %s",
                    strerror(errno));
        goto fail;
    }
    if (!m->o.no_uprobes) {
        for (int i = 0; i < m->o.n_cuda_libs; i++)
            if ((rc = sf_monitor_attach_lib(m, m->o.cuda_libs[i], err)) != SF_OK) goto fail;
        if (!m->o.no_discover) discover(m, 1);
    }
    m->nvml = sf_nvml_open();
    m->t0 = m->t_prev = m->t_discover = m->t_ldconfig = sf_now_s();
    if (sf_thread_create(&m->thr, monitor_thread, m)) {
        rc = sf_err(err, SF_ERROR, "monitor: starting the snapshot thread failed");
        goto fail;
    }
    m->thr_started = 1;
    *out = m;
    return SF_OK;
fail:
    sf_monitor_close(m);
    return rc;
}

/* Each uprobe detach waits for the kernel to quiesce (~0.1 s per probe on the loaded dev VM,
 * mostly serialized in the kernel); detaching from several threads overlaps part of it:
 * 22 probes took 3.0 s one by one, 1.95 s this way. A uprobe_multi link (kernel 6.6+,
 * libbpf 1.3+) would detach them with one wait. */
#define DETACH_THREADS 16
typedef struct detach_job { struct bpf_link **links; int n; } detach_job;

static void *detach_thread(void *arg)
{
    detach_job *j = arg;
    for (int i = 0; i < j->n; i++) bpf_link__destroy(j->links[i]);
    return NULL;
}

static void destroy_links(struct bpf_link **links, int n)
{
    pthread_t thr[DETACH_THREADS];
    detach_job jobs[DETACH_THREADS];
    int started[DETACH_THREADS] = { 0 }, per = (n + DETACH_THREADS - 1) / DETACH_THREADS;
    for (int t = 0; t < DETACH_THREADS && per > 0; t++) {
        int lo = t * per, hi = SF_MIN(n, lo + per);
        if (lo >= hi) break;
        jobs[t] = (detach_job){ links + lo, hi - lo };
        started[t] = sf_thread_create(&thr[t], detach_thread, &jobs[t]) == 0;
        if (!started[t]) detach_thread(&jobs[t]); /* no thread: do it here */
    }
    for (int t = 0; t < DETACH_THREADS; t++)
        if (started[t]) pthread_join(thr[t], NULL);
}

void sf_monitor_close(sf_monitor *m)
{
    if (!m) return;
    if (m->thr_started) {
        pthread_mutex_lock(&m->mu);
        m->stop = 1;
        pthread_cond_broadcast(&m->cv);
        pthread_mutex_unlock(&m->mu);
        pthread_join(m->thr, NULL);
    }
    double t0 = sf_now_s();
    destroy_links(m->links, m->n_links);
    double t1 = sf_now_s();
    bpf_link__destroy(m->tp_send);
    bpf_link__destroy(m->tp_recv);
    double t2 = sf_now_s();
    trace_bpf__destroy(m->skel);
    SF_LOGD("monitor: detached %d uprobes in %.3f s, tracepoints in %.3f s, unloaded in %.3f s", m->n_links, t1 - t0,
            t2 - t1, sf_now_s() - t2);
    sf_nvml_close(m->nvml);
    sf_mon_snapshot_free(&m->cur);
    free(m->links);
    free(m->pids);
    free(m->cgnames);
    free(m->scanned);
    free(m->new_scanned);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->attach_mu);
    pthread_cond_destroy(&m->cv);
    free(m);
}

void sf_monitor_snapshot(sf_monitor *m, sf_mon_snapshot *out)
{
    memset(out, 0, sizeof *out);
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    *out = m->cur;
    out->procs = NULL;
    out->cgroups = NULL;
    if (m->cur.n_procs && (out->procs = malloc((size_t)m->cur.n_procs * sizeof *out->procs)))
        memcpy(out->procs, m->cur.procs, (size_t)m->cur.n_procs * sizeof *out->procs);
    else out->n_procs = 0;
    if (m->cur.n_cgroups && (out->cgroups = malloc((size_t)m->cur.n_cgroups * sizeof *out->cgroups)))
        memcpy(out->cgroups, m->cur.cgroups, (size_t)m->cur.n_cgroups * sizeof *out->cgroups);
    else out->n_cgroups = 0;
    pthread_mutex_unlock(&m->mu);
}

double sf_monitor_contention(sf_monitor *m, int gpu)
{
    double c = 0;
    if (!m) return 0;
    pthread_mutex_lock(&m->mu);
    if (gpu >= 0 && gpu < m->cur.n_gpus) c = m->cur.gpus[gpu].contention;
    pthread_mutex_unlock(&m->mu);
    return c;
}

uint64_t sf_monitor_wait(sf_monitor *m, uint64_t seq, double timeout_s)
{
    if (!m) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((timeout_s - (long)timeout_s) * 1e9);
    ts.tv_sec += (long)timeout_s + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_mutex_lock(&m->mu);
    while (m->cur.seq <= seq && !m->stop)
        if (pthread_cond_timedwait(&m->cv, &m->mu, &ts) == ETIMEDOUT) break;
    uint64_t r = m->cur.seq;
    pthread_mutex_unlock(&m->mu);
    return r;
}

#else /* !SF_HAVE_BPF */

int sf_monitor_open(const sf_monitor_opts *o, sf_monitor **out, sf_error *err)
{
    *out = NULL;
    return sf_err(err, SF_EUNSUPPORTED, "BPF is off in this build (clang, bpftool and libbpf.a were missing "
                                        "at build time: run make deps, then rebuild)");
}
void sf_monitor_close(sf_monitor *m) { (void)m; }
void sf_monitor_snapshot(sf_monitor *m, sf_mon_snapshot *out) { memset(out, 0, sizeof *out); }
double sf_monitor_contention(sf_monitor *m, int gpu) { return 0; }
uint64_t sf_monitor_wait(sf_monitor *m, uint64_t seq, double timeout_s) { return 0; }
int sf_monitor_attach_lib(sf_monitor *m, const char *path, sf_error *err)
{
    return sf_err(err, SF_EUNSUPPORTED, "BPF is off in this build");
}
int sf_monitor_has_lib(sf_monitor *m, const char *path) { return 0; }

#endif
