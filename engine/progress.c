/* progress.c — a one-line progress bar on stderr for long loads. Shown only when asked for,
 * stderr is a terminal and the work is over 256 MiB; redrawn at most 10 times a second. */
#include <stdio.h>
#include <unistd.h>

#include "model-impl.h"

#define PROGRESS_MIN_BYTES (256ull << 20)

static void draw(sf_progress *p, int final)
{
    double t = sf_now_s() - p->t0, frac = p->total ? (double)p->done / (double)p->total : 1.0;
    int w = 30, fill = (int)(frac * w + 0.5);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    double gib = (double)(1ull << 30);
    fprintf(stderr, "\r%s [%s] %5.1f%% %.2f/%.2f GiB %.1f GiB/s%s", p->label, bar, frac * 100,
            (double)p->done / gib, (double)p->total / gib, t > 0 ? (double)p->done / gib / t : 0.0,
            final ? "\n" : "");
    fflush(stderr);
}

void sf_progress_begin(sf_progress *p, const char *label, uint64_t total, int enabled)
{
    p->on = enabled && total > PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
    p->label = label;
    p->total = total;
    p->done = 0;
    p->t0 = p->last = sf_now_s();
}

void sf_progress_add(sf_progress *p, uint64_t n)
{
    p->done += n;
    if (!p->on) return;
    double now = sf_now_s();
    if (now - p->last < 0.1) return;
    p->last = now;
    draw(p, 0);
}

void sf_progress_end(sf_progress *p)
{
    if (p->on) draw(p, 1);
    p->on = 0;
}

void sf_progress_touch(sf_progress *p, const void *addr, size_t len)
{
    const volatile unsigned char *b = addr;
    size_t page = 4096, step = 16u << 20;
    unsigned sum = 0;
    for (size_t off = 0; off < len; off += step) {
        size_t end = off + step < len ? off + step : len;
        for (size_t i = off; i < end; i += page) sum += b[i];
        sf_progress_add(p, end - off);
    }
    (void)sum;
}
