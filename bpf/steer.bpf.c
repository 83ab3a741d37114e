// SPDX-License-Identifier: GPL-2.0
/* steer.bpf.c — SK_REUSEPORT connection steering for the gateway's listener group.
 *
 * A new connection's client address is looked up in an LPM trie (prefix -> lane). Within
 * the lane the worker with the fewest in-flight requests (the load map, written by the
 * gateway) gets it; ties go to the first in an order rotated by the connection's hash so
 * that equal workers share. No prefix, no worker in the lane, or a select error: SK_PASS
 * without selecting, and the kernel's reuseport hash decides. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "steer.h"

char LICENSE[] SEC("license") = "GPL";

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD

struct {
    __uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
    __uint(max_entries, SF_STEER_WORKERS);
    __type(key, __u32);
    __type(value, __u64);
} socks SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LPM_TRIE);
    __uint(max_entries, 4096);
    __uint(map_flags, BPF_F_NO_PREALLOC);
    __type(key, struct sf_steer_key);
    __type(value, __u32);
} lanes SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SF_STEER_WORKERS);
    __type(key, __u32);
    __type(value, __u32);
} load SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, SF_STEER_WORKERS + 1);
    __type(key, __u32);
    __type(value, __u64);
} counts SEC(".maps");

/* Set before load. */
const volatile __u32 n_workers = 0;
const volatile __u8 lane_of[SF_STEER_WORKERS] = {};

static __always_inline void count(__u32 slot)
{
    __u64 *c = bpf_map_lookup_elem(&counts, &slot);
    if (c) *c += 1;
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *ctx)
{
    struct sf_steer_key k = { .prefixlen = 128 };
    __u32 *lane, best = SF_STEER_WORKERS, best_load = 0xffffffff, start, n = n_workers;

    if (ctx->eth_protocol == bpf_htons(ETH_P_IP)) {
        k.addr[10] = 0xff;
        k.addr[11] = 0xff;
        if (bpf_skb_load_bytes_relative(ctx, 12, &k.addr[12], 4, BPF_HDR_START_NET)) goto pass;
    } else if (ctx->eth_protocol == bpf_htons(ETH_P_IPV6)) {
        if (bpf_skb_load_bytes_relative(ctx, 8, k.addr, 16, BPF_HDR_START_NET)) goto pass;
    } else {
        goto pass;
    }
    lane = bpf_map_lookup_elem(&lanes, &k);
    if (!lane || n == 0 || n > SF_STEER_WORKERS) goto pass;

    start = ctx->hash % n;
    for (__u32 i = 0; i < SF_STEER_WORKERS; i++) {
        if (i >= n) break;
        __u32 w = start + i;
        if (w >= n) w -= n;
        if (w >= SF_STEER_WORKERS) break;
        if (lane_of[w] != *lane) continue;
        __u32 *l = bpf_map_lookup_elem(&load, &w);
        __u32 lv = l ? *l : 0;
        if (lv < best_load) { best_load = lv; best = w; }
    }
    if (best >= SF_STEER_WORKERS) goto pass;
    if (bpf_sk_select_reuseport(ctx, &socks, &best, 0)) goto pass;
    count(best);
    return SK_PASS;
pass:
    count(SF_STEER_FALLBACK);
    return SK_PASS;
}
