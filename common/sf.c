/* sf.c — errors, logging, clocks, threads and signals, file reading, PRNG, half-precision conversions. */
#include "sf.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int sf_log_level = SF_LOG_INFO;

int sf_err(sf_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

int sf_err_wrap(sf_error *err, const char *fmt, ...)
{
    if (!err) return SF_ERROR;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return err->code;
}

const char *sf_status_str(int code)
{
    switch (code) {
    case SF_OK: return "ok";
    case SF_ERROR: return "error";
    case SF_ENOMEM: return "out of memory";
    case SF_EIO: return "I/O error";
    case SF_EFORMAT: return "malformed input";
    case SF_EUNSUPPORTED: return "unsupported";
    case SF_EINVAL: return "invalid argument";
    case SF_ENOTFOUND: return "not found";
    case SF_AGAIN: return "try again";
    case SF_ENODEV: return "no device";
    case SF_ECANCELED: return "cancelled";
    case SF_EPERM: return "permission denied";
    case SF_ENOFIT: return "no token continues the output's form";
    }
    return "unknown status";
}

static void log_init_once(void)
{
    static int done;
    if (done) return;
    done = 1;
    static const char *const names[] = { "error", "warn", "info", "debug" }; /* SF_LOG_* order */
    sf_log_level = sf_env_choice("SEMFLOW_LOG", sf_log_level, names, 4);
}

int sf_log_on(int level)
{
    log_init_once();
    return level <= sf_log_level;
}

void sf_log(int level, const char *fmt, ...)
{
    log_init_once();
    if (level > sf_log_level) return;
    static const char *names[] = { "error", "warn", "info", "debug" };
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "semflow: %s: %s\n", names[level], buf);
}

uint64_t sf_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double sf_now_s(void) { return (double)sf_now_ns() * 1e-9; }

int sf_thread_create(pthread_t *t, void *(*fn)(void *), void *arg)
{
    /* the signals sent to the process; never the synchronous ones (SIGSEGV, SIGBUS, SIGFPE...):
     * the kernel resets a blocked one to its default action when it fires, and a crash would
     * end with no report from the sanitizers' handlers */
    static const int async[] = { SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGPIPE };
    sigset_t set, old;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof async / sizeof async[0]; i++) sigaddset(&set, async[i]);
    pthread_sigmask(SIG_BLOCK, &set, &old); /* the new thread inherits it */
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

void sf_block_stop_signals(sigset_t *set)
{
    sigset_t own, *s = set ? set : &own;
    sigemptyset(s);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGINT);
    pthread_sigmask(SIG_BLOCK, s, NULL);
}

int sf_grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 1;
    int c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return 0;
    *p = q;
    *cap = c;
    return 1;
}

int sf_read_file(const char *path, char **out, size_t *len, sf_error *err)
{
    FILE *f = NULL;
    char *buf = NULL;
    long n;
    *out = NULL;
    f = fopen(path, "rb");
    if (!f) return sf_err(err, errno == ENOENT ? SF_ENOTFOUND : SF_EIO, "open %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        sf_err(err, SF_EIO, "seek %s: %s", path, strerror(errno));
        goto cleanup;
    }
    buf = malloc((size_t)n + 1);
    if (!buf) {
        sf_err(err, SF_ENOMEM, "reading %s: out of memory (%ld bytes)", path, n);
        goto cleanup;
    }
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        sf_err(err, SF_EIO, "read %s: %s", path, ferror(f) ? strerror(errno) : "short read");
        free(buf);
        buf = NULL;
        goto cleanup;
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = (size_t)n;
cleanup:
    fclose(f);
    return buf ? SF_OK : (err ? err->code : SF_ERROR);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = sf_mix64(*x);
    *x += 0x9e3779b97f4a7c15ull;
    return z;
}

void sf_rng_seed(sf_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t sf_rng_next(sf_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float sf_rng_uniform(sf_rng *r) { return (float)(sf_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

float sf_rng_normal(sf_rng *r)
{
    float u1 = sf_rng_uniform(r), u2 = sf_rng_uniform(r);
    if (u1 < 1e-12f) u1 = 1e-12f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530718f * u2);
}

float sf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (exp == 0) {
        if (mant == 0) u = sign;
        else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            u = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) u = sign | 0x7f800000u | (mant << 13);
    else u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    union { uint32_t u; float f; } v = { .u = u };
    return v.f;
}

uint16_t sf_f32_to_f16(float f)
{
    union { uint32_t u; float f; } v = { .f = f };
    uint32_t u = v.u, sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t mant = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        mant |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)half;
}
