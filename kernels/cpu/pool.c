/* pool.c — a small fork-join thread pool for the CPU kernels.
 *
 * One owner thread calls sf_cpu_pool_run(); it runs share 0 itself and the workers run the
 * others. Workers spin briefly on a generation counter (a decode step issues a few hundred
 * short ops back to back) and then sleep on a condition variable, so an idle engine costs no
 * CPU. */
#include "cpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define SPIN_ITERS 4000

struct sf_cpu_pool {
    int n;
    int n_started;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    sf_cpu_task fn;
    void *arg;
    _Atomic unsigned gen;
    _Atomic int pending;
    _Atomic int stop;
};

struct worker_arg { sf_cpu_pool *p; int ith; };

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *a)
{
    struct worker_arg wa = *(struct worker_arg *)a;
    free(a);
    sf_cpu_pool *p = wa.p;
    unsigned seen = 0;
    for (;;) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        for (int i = 0; g == seen && i < SPIN_ITERS; i++) {
            cpu_relax();
            g = atomic_load_explicit(&p->gen, memory_order_acquire);
        }
        if (g == seen) {
            pthread_mutex_lock(&p->mu);
            while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen)
                pthread_cond_wait(&p->cv_work, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) return NULL;
        p->fn(p->arg, wa.ith, p->n);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

int sf_cpu_pool_new(int n_threads, sf_cpu_pool **out, sf_error *err)
{
    *out = NULL;
    if (n_threads < 1) n_threads = 1;
    sf_cpu_pool *p = calloc(1, sizeof *p);
    if (!p) return sf_err(err, SF_ENOMEM, "cpu thread pool: out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) { sf_cpu_pool_free(p); return sf_err(err, SF_ENOMEM, "cpu thread pool: out of memory"); }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { sf_cpu_pool_free(p); return sf_err(err, SF_ENOMEM, "cpu thread pool: out of memory"); }
        wa->p = p;
        wa->ith = i;
        int rc = sf_thread_create(&p->th[i], worker_main, wa);
        if (rc) {
            free(wa);
            sf_cpu_pool_free(p);
            return sf_err(err, SF_ERROR, "cpu thread pool: pthread_create(worker %d of %d): %s; "
                          "try fewer threads (--threads)", i, n_threads, strerror(rc));
        }
        p->n_started = i;
    }
    *out = p;
    return SF_OK;
}

void sf_cpu_pool_free(sf_cpu_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++) pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    pthread_mutex_destroy(&p->mu);
    free(p->th);
    free(p);
}

int sf_cpu_pool_size(const sf_cpu_pool *p) { return p ? p->n : 1; }

void sf_cpu_pool_run(sf_cpu_pool *p, sf_cpu_task fn, void *arg)
{
    if (!p || p->n == 1) { fn(arg, 0, 1); return; }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    for (int i = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0 && i < SPIN_ITERS; i++)
        cpu_relax();
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
