/* steer.h — structs and constants shared by bpf/steer.bpf.c and bpf/steer.c.
 *
 * Client addresses are keyed as IPv6; IPv4 clients as IPv4-mapped (::ffff:a.b.c.d), so one
 * LPM trie holds both (an IPv4 /n prefix is stored as /96+n). */
#ifndef SF_STEER_H
#define SF_STEER_H

#define SF_STEER_WORKERS 64   /* == SF_STEER_MAX_WORKERS in monitor.h */
#define SF_STEER_FALLBACK SF_STEER_WORKERS  /* counts slot: connections left to the kernel hash */

struct sf_steer_key {
    unsigned int prefixlen;
    unsigned char addr[16];
};

#endif
