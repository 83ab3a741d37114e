/* dma.c — chunking and pacing of host<->device copies (see dma.h). */
#include "engine/dma.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KIB ((size_t)1024)
#define DEF_HIGH (512 * KIB)
#define DEF_NORMAL (128 * KIB)
#define LOW_MAX (64 * KIB)
#define DEF_LINK_GBS 32.0 /* PCIe Gen4 x16 per direction, when nothing was measured */

struct sf_dma {
    sf_dma_opts o;
    size_t chunk[SF_URGENCY_COUNT][2];
    double low_gbs[2];          /* link bandwidth at the low-class chunk size, GB/s */
    pthread_mutex_t mu;
    sf_dma_stats st;
    double booked_until[2];     /* defer mode: low-class bookings drain at this time (sf_now_s) */
};

/* Smallest measured chunk whose bandwidth reaches frac of the curve's peak; 0 without a curve. */
static size_t chunk_reaching(const sf_hw_info *hw, const double *gbs, double frac)
{
    double peak = 0;
    if (!hw) return 0;
    for (int i = 0; i < SF_HAL_CHUNKS; i++)
        if (hw->chunk_bytes[i] && gbs[i] > peak) peak = gbs[i];
    if (peak <= 0) return 0;
    for (int i = 0; i < SF_HAL_CHUNKS; i++)
        if (hw->chunk_bytes[i] && gbs[i] >= frac * peak) return hw->chunk_bytes[i];
    return 0;
}

/* Bandwidth at the largest measured chunk <= bytes (the curve's first point if none). */
static double gbs_at(const sf_hw_info *hw, const double *gbs, size_t bytes)
{
    double r = 0;
    if (!hw) return 0;
    for (int i = 0; i < SF_HAL_CHUNKS; i++) {
        if (!hw->chunk_bytes[i] || gbs[i] <= 0) continue;
        if (r == 0 || hw->chunk_bytes[i] <= bytes) r = gbs[i];
    }
    return r;
}

int sf_dma_new(const sf_dma_opts *o, sf_dma **out, sf_error *err)
{
    *out = NULL;
    if (!o || !o->copy) return sf_err(err, SF_EINVAL, "dma: no copy function given");
    sf_dma *d = calloc(1, sizeof *d);
    if (!d) return sf_err(err, SF_ENOMEM, "dma: out of memory");
    d->o = *o;
    if (d->o.pace_threshold <= 0) d->o.pace_threshold = 0.5;
    if (d->o.pace_floor <= 0 || d->o.pace_floor > 1) d->o.pace_floor = 0.05;
    const sf_hw_info *hw = o->hw && !strcmp(o->hw->backend, "cuda") ? o->hw : NULL;
    for (int dir = 0; dir < 2; dir++) {
        const double *curve = hw ? (dir == SF_DMA_H2D ? hw->h2d_pinned_gbs : hw->d2h_pinned_gbs) : NULL;
        size_t hi = curve ? chunk_reaching(hw, curve, 0.80) : 0, no = curve ? chunk_reaching(hw, curve, 0.45) : 0;
        d->chunk[SF_URGENCY_HIGH][dir] = hi ? SF_MAX(hi, DEF_NORMAL) : DEF_HIGH;
        d->chunk[SF_URGENCY_NORMAL][dir] = no ? SF_MIN(SF_MAX(no, LOW_MAX), d->chunk[SF_URGENCY_HIGH][dir]) : DEF_NORMAL;
        d->chunk[SF_URGENCY_LOW][dir] = LOW_MAX;
        double g = o->link_gbs > 0 ? o->link_gbs : curve ? gbs_at(hw, curve, LOW_MAX) : 0;
        d->low_gbs[dir] = g > 0 ? g : DEF_LINK_GBS;
        if (o->untuned)
            for (int u = 0; u < SF_URGENCY_COUNT; u++) d->chunk[u][dir] = SIZE_MAX / 2;
    }
    pthread_mutex_init(&d->mu, NULL);
    *out = d;
    return SF_OK;
}

void sf_dma_free(sf_dma *d)
{
    if (!d) return;
    pthread_mutex_destroy(&d->mu);
    free(d);
}

size_t sf_dma_chunk(const sf_dma *d, int urgency, int dir)
{
    if (urgency < 0) urgency = 0;
    if (urgency >= SF_URGENCY_COUNT) urgency = SF_URGENCY_COUNT - 1;
    return d->chunk[urgency][dir == SF_DMA_D2H];
}

static void sleep_s(double s)
{
    struct timespec ts = { .tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9) };
    while (nanosleep(&ts, &ts) != 0) {}
}

/* Low urgency under contention: sleep until `through` bytes of a call started at t_start are due
 * at the share of the link the other processes leave. */
static void pace(sf_dma *d, int urgency, int dir, double t_start, size_t through, double *waited, uint64_t *paced)
{
    if (urgency != SF_URGENCY_LOW || !d->o.contention || d->o.untuned || d->o.defer) return;
    double c = d->o.contention(d->o.contention_arg);
    if (c < d->o.pace_threshold) return;
    double share = SF_MAX(d->o.pace_floor, 1.0 - c);
    double due = t_start + (double)through / (share * d->low_gbs[dir] * 1e9);
    double now = sf_now_s();
    if (due > now) {
        sleep_s(due - now);
        *waited += due - now;
        (*paced)++;
    }
}

double sf_dma_contention(sf_dma *d)
{
    return d && d->o.contention ? d->o.contention(d->o.contention_arg) : 0;
}

int sf_dma_contended(sf_dma *d)
{
    return d && sf_dma_contention(d) >= d->o.pace_threshold;
}

int sf_dma_tuned(const sf_dma *d)
{
    return d && !d->o.untuned;
}

void sf_dma_count_deferred(sf_dma *d)
{
    pthread_mutex_lock(&d->mu);
    d->st.deferred++;
    pthread_mutex_unlock(&d->mu);
}

/* Defer mode: a low-class copy under contention books its bytes at the link share left to it. */
static void book(sf_dma *d, int urgency, int dir, size_t bytes)
{
    if (!d->o.defer || d->o.untuned || urgency != SF_URGENCY_LOW || !bytes) return;
    double c = sf_dma_contention(d);
    if (c < d->o.pace_threshold) return;
    double share = SF_MAX(d->o.pace_floor, 1.0 - c), now = sf_now_s();
    pthread_mutex_lock(&d->mu);
    d->booked_until[dir] = SF_MAX(d->booked_until[dir], now) + (double)bytes / (share * d->low_gbs[dir] * 1e9);
    d->st.booked_bytes += bytes;
    pthread_mutex_unlock(&d->mu);
}

int sf_dma_may_start(sf_dma *d, int urgency, int dir)
{
    if (!d || d->o.untuned || urgency != SF_URGENCY_LOW || (dir != SF_DMA_H2D && dir != SF_DMA_D2H)) return 1;
    if (sf_dma_contention(d) < d->o.pace_threshold) return 1;
    pthread_mutex_lock(&d->mu);
    int ok = sf_now_s() >= d->booked_until[dir];
    if (!ok) d->st.deferred++;
    pthread_mutex_unlock(&d->mu);
    return ok;
}

static void account(sf_dma *d, int urgency, int dir, size_t bytes, uint64_t chunks, uint64_t paced, double waited)
{
    book(d, urgency, dir, bytes);
    pthread_mutex_lock(&d->mu);
    d->st.bytes[urgency][dir] += bytes;
    d->st.chunks[urgency] += chunks;
    d->st.paced_copies += paced;
    d->st.paced_s += waited;
    pthread_mutex_unlock(&d->mu);
}

int sf_dma_copy(sf_dma *d, void *dst, const void *src, size_t n, int dir, int urgency, sf_error *err)
{
    if (!d) return sf_err(err, SF_EINVAL, "dma: not initialised");
    if (dir != SF_DMA_H2D && dir != SF_DMA_D2H) return sf_err(err, SF_EINVAL, "dma: direction %d is not H2D/D2H", dir);
    if (n && (!dst || !src)) return sf_err(err, SF_EINVAL, "dma: NULL buffer for a %zu-byte copy", n);
    if (urgency < 0 || urgency >= SF_URGENCY_COUNT) urgency = SF_URGENCY_NORMAL;
    size_t chunk = d->chunk[urgency][dir], done = 0;
    uint64_t chunks = 0, paced = 0;
    double waited = 0, t_start = sf_now_s();
    int rc = SF_OK;

    while (done < n) {
        size_t k = SF_MIN(chunk, n - done);
        pace(d, urgency, dir, t_start, done + k, &waited, &paced);
        rc = d->o.copy(d->o.copy_arg, (char *)dst + done, (const char *)src + done, k, dir, err);
        if (rc != SF_OK) {
            sf_err_wrap(err, "dma: chunk at byte %zu of %zu", done, n);
            break;
        }
        done += k;
        chunks++;
    }
    account(d, urgency, dir, done, chunks, paced, waited);
    return rc;
}

int sf_dma_copy_units(sf_dma *d, int n_units, size_t unit_bytes, int dir, int urgency, sf_dma_unit_fn fn, void *arg,
                      sf_error *err)
{
    if (!d || !fn) return sf_err(err, SF_EINVAL, "dma: not initialised or no unit copy function");
    if (dir != SF_DMA_H2D && dir != SF_DMA_D2H) return sf_err(err, SF_EINVAL, "dma: direction %d is not H2D/D2H", dir);
    if (n_units < 0 || (n_units && !unit_bytes))
        return sf_err(err, SF_EINVAL, "dma: %d units of %zu bytes is not a copy", n_units, unit_bytes);
    if (urgency < 0 || urgency >= SF_URGENCY_COUNT) urgency = SF_URGENCY_NORMAL;
    size_t per_z = SF_MAX((size_t)1, d->chunk[urgency][dir] / (unit_bytes ? unit_bytes : 1));
    int per = per_z > (size_t)INT32_MAX ? INT32_MAX : (int)per_z, done = 0;
    uint64_t chunks = 0, paced = 0;
    double waited = 0, t_start = sf_now_s();
    int rc = SF_OK;
    while (done < n_units) {
        int k = SF_MIN(per, n_units - done);
        pace(d, urgency, dir, t_start, (size_t)(done + k) * unit_bytes, &waited, &paced);
        if ((rc = fn(arg, done, k, err)) != SF_OK) {
            sf_err_wrap(err, "dma: units %d..%d of %d", done, done + k - 1, n_units);
            break;
        }
        done += k;
        chunks++;
    }
    account(d, urgency, dir, (size_t)done * unit_bytes, chunks, paced, waited);
    return rc;
}

void sf_dma_get_stats(sf_dma *d, sf_dma_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    *st = d->st;
    pthread_mutex_unlock(&d->mu);
}
