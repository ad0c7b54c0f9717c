/*
 * threadpool.c - see threadpool.h.
 *
 * Protocol: the caller publishes (fn, ctx), sets `pending` to the number of
 * workers and bumps `gen`. A worker that sees a new gen runs its share and
 * decrements `pending`; the caller runs share 0 and spins until pending is 0.
 * A worker that has spun long enough without a new gen sleeps on `cv`; the
 * caller always broadcasts under the mutex after bumping gen, and a worker
 * re-checks gen under the same mutex before waiting, so no wake-up is lost.
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define zi_cpu_relax() _mm_pause()
#else
#define zi_cpu_relax() ((void)0)
#endif

/* Waiting goes through three stages: pause-spin (the next op usually comes
 * within microseconds), then spin with sched_yield (so that on a machine
 * with more runnable threads than cores the thread we wait for can run),
 * then - for a worker - sleep on the condition variable. */
#define ZI_SPIN_PAUSE 2000
#define ZI_SPIN_YIELD 20000

typedef struct worker_arg {
    zi_pool *pool;
    int index;
} worker_arg;

struct zi_pool {
    int n;
    pthread_t *threads;
    worker_arg *args;
    zi_pool_fn fn;
    void *ctx;
    atomic_uint gen;
    atomic_int pending;
    atomic_int stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *worker_main(void *p) {
    worker_arg *arg = p;
    zi_pool *pool = arg->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_relaxed)) {
            if (++spins < ZI_SPIN_PAUSE) {
                zi_cpu_relax();
                continue;
            }
            if (spins < ZI_SPIN_YIELD) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->gen) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->ctx, arg->index, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

zi_pool *zi_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    zi_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->n = n_threads;
    atomic_init(&pool->gen, 0);
    atomic_init(&pool->pending, 0);
    atomic_init(&pool->stop, 0);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    pool->args = calloc((size_t)n_threads, sizeof *pool->args);
    if (!pool->threads || !pool->args) {
        free(pool->threads);
        free(pool->args);
        free(pool);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        pool->args[i].pool = pool;
        pool->args[i].index = i;
        if (pthread_create(&pool->threads[i], NULL, worker_main, &pool->args[i]) != 0) {
            pool->n = i; /* shut down the ones that did start */
            zi_pool_free(pool);
            return NULL;
        }
    }
    return pool;
}

void zi_pool_free(zi_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool->args);
    free(pool);
}

int zi_pool_size(const zi_pool *pool) { return pool->n; }

void zi_pool_run(zi_pool *pool, zi_pool_fn fn, void *ctx) {
    if (pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n);
    for (int spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < ZI_SPIN_PAUSE)
            zi_cpu_relax();
        else
            sched_yield();
    }
}
