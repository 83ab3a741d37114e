/* sf.h — status codes, errors and small helpers shared by every semflow module.
 *
 * Errors are reported where they happen into a caller-supplied sf_error, with the failing
 * call and errno where there is one, in words a user can act on. Functions return SF_OK (0)
 * or a negative SF_E* code; the message says the rest. */
#ifndef SF_H
#define SF_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
    SF_OK = 0,
    SF_ERROR = -1,      /* generic failure; message says why */
    SF_ENOMEM = -2,     /* host or device allocation failed */
    SF_EIO = -3,        /* read/write/mmap failed */
    SF_EFORMAT = -4,    /* file content malformed (JSON, safetensors, GGUF, ...) */
    SF_EUNSUPPORTED = -5, /* valid but unsupported (dtype, architecture, ...) */
    SF_EINVAL = -6,     /* bad argument from the caller / user */
    SF_ENOTFOUND = -7,  /* file, tensor, model, route missing */
    SF_AGAIN = -8,      /* try later: queue or KV pool full */
    SF_ENODEV = -9,     /* no GPU / backend not available */
    SF_ECANCELED = -10, /* request cancelled */
    SF_EPERM = -11,     /* no rights (BPF, ...) */
    SF_ENOFIT = -12,    /* no token of the model's vocabulary continues the form a request's
                         * output is held to (a pattern, grammar, choice or JSON) */
};

typedef struct sf_error {
    int code;
    char msg[512];
} sf_error;

/* Set err (if not NULL) and return code. printf-style. */
int sf_err(sf_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefix an existing message: "loading model: <old msg>". */
int sf_err_wrap(sf_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *sf_status_str(int code);

/* Logging to stderr. Level from SEMFLOW_LOG (error|warn|info|debug), default info. */
enum { SF_LOG_ERROR = 0, SF_LOG_WARN, SF_LOG_INFO, SF_LOG_DEBUG };
extern int sf_log_level;
void sf_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define SF_LOGE(...) sf_log(SF_LOG_ERROR, __VA_ARGS__)
#define SF_LOGW(...) sf_log(SF_LOG_WARN, __VA_ARGS__)
#define SF_LOGI(...) sf_log(SF_LOG_INFO, __VA_ARGS__)
/* whether a message of this level is written (SEMFLOW_LOG read on the first call) */
int sf_log_on(int level);
#define SF_LOGD(...) do { if (sf_log_on(SF_LOG_DEBUG)) sf_log(SF_LOG_DEBUG, __VA_ARGS__); } while (0)

/* Threads. semflow's own threads (engine, CPU pool, monitor) start with the signals sent to the
 * process blocked (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1/2, SIGALRM, SIGPIPE), so
 * a process-directed signal such as SIGTERM never lands on one of them and takes its default
 * action (the whole process gone, no drain); it goes to the thread that waits for it.
 * sf_block_stop_signals blocks SIGTERM and SIGINT in the calling thread and so in every thread
 * it starts afterwards, libraries' own included (libcuda's, libbpf's); call it before any. The
 * set, for sigtimedwait, in *set where not NULL. */
int sf_thread_create(pthread_t *t, void *(*fn)(void *), void *arg);
void sf_block_stop_signals(sigset_t *set);

/* Monotonic clock. */
double sf_now_s(void);
uint64_t sf_now_ns(void);

/* An array *p of *cap elements of elem bytes made room for need (doubling, from 16): 1, or 0
 * when out of memory (*p and *cap unchanged). */
int sf_grow(void **p, int *cap, int need, size_t elem);

/* Whole-file read (NUL-terminated, *len excludes the NUL). Caller frees. */
int sf_read_file(const char *path, char **out, size_t *len, sf_error *err);

/* Deterministic PRNG (splitmix64 seeded xoshiro256**): same seed, same stream everywhere. */
typedef struct sf_rng { uint64_t s[4]; } sf_rng;
void sf_rng_seed(sf_rng *r, uint64_t seed);
uint64_t sf_rng_next(sf_rng *r);
float sf_rng_uniform(sf_rng *r);   /* [0,1) */
float sf_rng_normal(sf_rng *r);    /* N(0,1) */

/* Environment switches (SEMFLOW_*), read once where their module starts. A value that is not
 * one the switch takes is never taken for something else: the call logs a warning that names
 * the variable, the value and what it takes, and returns the default (the documented fallback).
 * Unset or empty: the default, silently.
 *   sf_env_bool:   0/1, off/on, false/true, no/yes (any case).
 *   sf_env_long:   a decimal integer in [lo, hi].
 *   sf_env_choice: the index of the value in choices (n of them); def when unset or unknown. */
int sf_env_bool(const char *name, int def);
long sf_env_long(const char *name, long def, long lo, long hi);
int sf_env_choice(const char *name, int def, const char *const *choices, int n);

/* bf16/fp16 <-> fp32 on the host. */
static inline float sf_bf16_to_f32(uint16_t h) {
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
static inline uint16_t sf_f32_to_bf16(float f) {
    union { uint32_t u; float f; } v = { .f = f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    uint32_t rounding = 0x7fffu + ((v.u >> 16) & 1u);                             /* round to nearest even */
    return (uint16_t)((v.u + rounding) >> 16);
}
float sf_f16_to_f32(uint16_t h);
uint16_t sf_f32_to_f16(float f);

/* splitmix64's step as a function: a bijection on 64 bits with full avalanche (the rng's seeding,
 * the prefix cache's keys). kernels/sample_draw.h has the same for device code. */
/* a hexadecimal digit's value, -1 for any other character */
static inline int sf_hexval(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static inline uint64_t sf_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a over s and its terminating NUL, continuing from h: chained calls keep their strings'
 * boundaries ("ab", "c" and "a", "bc" differ). Not for anything an attacker must not steer. */
static inline uint64_t sf_hash_str(uint64_t h, const char *s) {
    h ^= 0xcbf29ce484222325ull;
    do h = (h ^ (unsigned char)*s) * 0x100000001b3ull; while (*s++);
    return h;
}

#define SF_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SF_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SF_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
