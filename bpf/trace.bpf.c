// SPDX-License-Identifier: GPL-2.0
/* trace.bpf.c — per-process PCIe copy accounting (uprobes on libcuda's copy entry points) and
 * per-process / per-cgroup socket bytes (tracepoints sock:sock_send_length and
 * sock:sock_recv_length). Everything is aggregated here in per-CPU hash maps; userspace
 * (bpf/monitor.c) sums the CPUs every snapshot. No per-event output. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "trace.h"

char LICENSE[] SEC("license") = "GPL";

#define AF_INET 2
#define AF_INET6 10

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, 8192);
    __type(key, struct sf_tr_dma_key);
    __type(value, struct sf_tr_dma_val);
} dma SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, 16384);
    __type(key, __u32);                 /* tgid */
    __type(value, struct sf_tr_sock_val);
} sock_pid SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_HASH);
    __uint(max_entries, 4096);
    __type(key, __u64);                 /* cgroup v2 id */
    __type(value, struct sf_tr_sock_val);
} sock_cg SEC(".maps");

/* Set by userspace before load: 1 counts every socket family, 0 only AF_INET/AF_INET6. */
const volatile int all_families = 0;

static __always_inline __u32 log2_u64(__u64 v)
{
    __u32 r = 0;
    if (v >> 32) { v >>= 32; r += 32; }
    if (v >> 16) { v >>= 16; r += 16; }
    if (v >> 8) { v >>= 8; r += 8; }
    if (v >> 4) { v >>= 4; r += 4; }
    if (v >> 2) { v >>= 2; r += 2; }
    if (v >> 1) { r += 1; }
    return r;
}

static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero)
{
    void *v = bpf_map_lookup_elem(map, key);
    if (v) return v;
    bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
    return bpf_map_lookup_elem(map, key);
}

static const struct sf_tr_dma_val dma_zero;
static const struct sf_tr_sock_val sock_zero;

static __always_inline void account_copy(__u32 dir, __u64 bytes)
{
    struct sf_tr_dma_key k = { .tgid = bpf_get_current_pid_tgid() >> 32, .dir = dir };
    struct sf_tr_dma_val *v = lookup_or_init(&dma, &k, &dma_zero);
    if (!v) return;
    __u32 b = log2_u64(bytes);
    v->bytes += bytes;
    v->calls += 1;
    if (b < SF_TR_HIST) v->hist[b] += 1;
}

/* Arguments 1..5 of the probed call. All five are loaded before choosing: a switch over the
 * registers compiles to arithmetic on the ctx pointer, which the verifier rejects. */
struct args5 { __u64 a[6]; };

static __always_inline void load_args(struct pt_regs *ctx, struct args5 *r)
{
    r->a[0] = 0;
    r->a[1] = PT_REGS_PARM1(ctx);
    r->a[2] = PT_REGS_PARM2(ctx);
    r->a[3] = PT_REGS_PARM3(ctx);
    r->a[4] = PT_REGS_PARM4(ctx);
    r->a[5] = PT_REGS_PARM5(ctx);
    asm volatile("" ::: "memory");
}

static __always_inline __u64 arg_n(const struct args5 *r, __u32 n)
{
    return n >= 1 && n <= 5 ? r->a[n] : 0;
}

static __always_inline __u32 dir_of(__u32 src, __u32 dst)
{
    int sh = src == SF_CU_MEM_HOST, dh = dst == SF_CU_MEM_HOST;
    int sd = src == SF_CU_MEM_DEVICE || src == SF_CU_MEM_ARRAY;
    int dd = dst == SF_CU_MEM_DEVICE || dst == SF_CU_MEM_ARRAY;
    if (sh && dd) return 0;
    if (sd && dh) return 1;
    if (sd && dd) return 2;
    return 3;
}

SEC("uprobe")
int BPF_KPROBE(on_copy)
{
    __u64 cookie = bpf_get_attach_cookie(ctx);
    __u32 dir = cookie & 0xff, argi = (cookie >> 8) & 0xff, kind = (cookie >> 16) & 0xff;
    struct args5 r;
    load_args(ctx, &r);
    __u64 a = arg_n(&r, argi);

    if (kind == SF_TR_KIND_SCALAR) {
        account_copy(dir < SF_TR_DIRS ? dir : 3, a);
        return 0;
    }
    if (kind == SF_TR_KIND_2D || kind == SF_TR_KIND_3D) {
        const char *d = (const char *)a;
        __u32 st = 0, dt = 0;
        __u64 dims[3] = { 0, 0, 1 };
        int rc;
        if (kind == SF_TR_KIND_2D) {
            rc = bpf_probe_read_user(dims, 2 * sizeof(__u64), d + SF_CU2D_WIDTH);
            bpf_probe_read_user(&st, sizeof st, d + SF_CU2D_SRC_MEMTYPE);
            bpf_probe_read_user(&dt, sizeof dt, d + SF_CU2D_DST_MEMTYPE);
        } else {
            rc = bpf_probe_read_user(dims, 3 * sizeof(__u64), d + SF_CU3D_WIDTH);
            bpf_probe_read_user(&st, sizeof st, d + SF_CU3D_SRC_MEMTYPE);
            bpf_probe_read_user(&dt, sizeof dt, d + SF_CU3D_DST_MEMTYPE);
        }
        if (rc) return 0;   /* unreadable descriptor: the call will fail in the driver too */
        if (dir == SF_TR_DIR_DESC) dir = dir_of(st, dt);
        account_copy(dir < SF_TR_DIRS ? dir : 3, dims[0] * dims[1] * dims[2]);
        return 0;
    }
    if (kind == SF_TR_KIND_BATCH) {
        const __u64 *sizes = (const __u64 *)a;
        __u64 count = arg_n(&r, argi + 1), total = 0;
        for (int i = 0; i < SF_TR_BATCH_MAX; i++) {
            __u64 s = 0;
            if (i >= count) break;
            if (bpf_probe_read_user(&s, sizeof s, &sizes[i])) break;
            total += s;
        }
        account_copy(dir < SF_TR_DIRS ? dir : 3, total);
    }
    return 0;
}

static __always_inline int account_sock(struct trace_event_raw_sock_msg_length *tp, int tx)
{
    if (tp->ret <= 0) return 0;
    if (!all_families && tp->family != AF_INET && tp->family != AF_INET6) return 0;
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    __u64 cg = bpf_get_current_cgroup_id();
    __u64 n = (__u64)tp->ret;
    struct sf_tr_sock_val *v = lookup_or_init(&sock_pid, &tgid, &sock_zero);
    if (v) {
        if (tx) { v->tx_bytes += n; v->tx_calls += 1; }
        else { v->rx_bytes += n; v->rx_calls += 1; }
    }
    v = lookup_or_init(&sock_cg, &cg, &sock_zero);
    if (v) {
        if (tx) { v->tx_bytes += n; v->tx_calls += 1; }
        else { v->rx_bytes += n; v->rx_calls += 1; }
    }
    return 0;
}

SEC("tp/sock/sock_send_length")
int on_send(struct trace_event_raw_sock_msg_length *tp) { return account_sock(tp, 1); }

SEC("tp/sock/sock_recv_length")
int on_recv(struct trace_event_raw_sock_msg_length *tp) { return account_sock(tp, 0); }
