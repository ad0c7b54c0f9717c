/*
 * threadpool.h - a fork-join pool for the CPU backend's parallel loops.
 *
 * zi_pool_run(pool, fn, ctx) runs fn(ctx, i, n) once on each of the pool's
 * n threads (the caller is thread 0) and returns when all have finished.
 * Between runs the workers spin for a short while before sleeping on a
 * condition variable, because a forward pass issues hundreds of small runs
 * back to back and a sleep/wake per run would cost more than the work.
 * One caller at a time: a pool belongs to one backend.
 */
#ifndef ZI_THREADPOOL_H
#define ZI_THREADPOOL_H

typedef struct zi_pool zi_pool;
typedef void (*zi_pool_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1; returns NULL when threads cannot be created. */
zi_pool *zi_pool_create(int n_threads);
void zi_pool_free(zi_pool *pool);
int zi_pool_size(const zi_pool *pool);
void zi_pool_run(zi_pool *pool, zi_pool_fn fn, void *ctx);

#endif
