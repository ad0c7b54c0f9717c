/*
 * bench_machine.c - this machine's limits, the yardsticks for decode speed
 * (BENCHMARKS.md, "How close decode is to the machine"):
 *
 *   read_gb_s     memory read bandwidth: T threads each summing its share of
 *                 a 1 GiB buffer (far larger than the caches), best of 5;
 *   int8_gops     int8 dot-product throughput: T threads of AVX-512 VNNI
 *                 vpdpbusd (64 multiply-adds = 128 ops each) on independent
 *                 register accumulators, best of 5 (0 without VNNI);
 *   f32_gflops    float32 FMA throughput, AVX-512 (or AVX2) the same way.
 *
 * Usage: bench_machine [threads] (default 2). Prints one JSON object.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct job {
    const uint64_t *p;
    size_t n;
    int kind; /* 0 read, 1 int8, 2 f32 */
    long iters;
    uint64_t out;
} job;

__attribute__((target("avx512f,avx512vnni"))) static uint64_t vnni_loop(long iters) {
    __m512i a[12], b = _mm512_set1_epi8(3), c = _mm512_set1_epi8(5);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], b, c);
    __m512i s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_epi32(s, a[i]);
    return (uint64_t)_mm512_reduce_add_epi32(s);
}

__attribute__((target("avx512f"))) static uint64_t fma512_loop(long iters) {
    __m512 a[12], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    return (uint64_t)_mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static uint64_t fma256_loop(long iters) {
    __m256 a[12], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
        for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    float v[8];
    __m256 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
    _mm256_storeu_ps(v, s);
    return (uint64_t)v[0];
}

static void *run(void *arg) {
    job *j = arg;
    if (j->kind == 0) {
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = 0; i + 4 <= j->n; i += 4) {
            s0 += j->p[i];
            s1 += j->p[i + 1];
            s2 += j->p[i + 2];
            s3 += j->p[i + 3];
        }
        j->out = s0 + s1 + s2 + s3;
    } else if (j->kind == 1) {
        j->out = vnni_loop(j->iters);
    } else if (__builtin_cpu_supports("avx512f")) {
        j->out = fma512_loop(j->iters);
    } else {
        j->out = fma256_loop(j->iters);
    }
    return NULL;
}

/* Best of 5 runs of T threads of `kind`; returns seconds. */
static double best_time(int T, int kind, const uint64_t *buf, size_t n, long iters) {
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64];
        job jobs[64];
        double t0 = now_s();
        for (int t = 0; t < T; t++) {
            jobs[t] = (job){buf + n / T * t, n / T, kind, iters, 0};
            pthread_create(&th[t], NULL, run, &jobs[t]);
        }
        uint64_t sink = 0;
        for (int t = 0; t < T; t++) pthread_join(th[t], NULL), sink += jobs[t].out;
        double dt = now_s() - t0;
        if (sink == 42) fprintf(stderr, " "); /* keep the work */
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int T = argc > 1 ? atoi(argv[1]) : 2;
    if (T < 1 || T > 64) {
        fprintf(stderr, "usage: bench_machine [threads 1..64]\n");
        return 2;
    }
    size_t bytes = (size_t)1 << 30, n = bytes / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, "bench_machine: out of memory for a 1 GiB buffer\n");
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    double t_read = best_time(T, 0, buf, n, 0);
    long iters = 20000000;
    int vnni = __builtin_cpu_supports("avx512vnni");
    double t_int8 = vnni ? best_time(T, 1, buf, n, iters) : 0;
    double t_f32 = best_time(T, 2, buf, n, iters);
    int w512 = __builtin_cpu_supports("avx512f");
    double int8_ops = (double)T * iters * 12 * 64 * 2; /* 64 MACs per vpdpbusd */
    double f32_ops = (double)T * iters * 12 * (w512 ? 16 : 8) * 2;
    printf("{\"threads\": %d, \"read_gb_s\": %.2f, \"int8_gops\": %.1f, \"f32_gflops\": %.1f, "
           "\"f32_width\": %d}\n",
           T, (double)bytes / t_read / 1e9, vnni ? int8_ops / t_int8 / 1e9 : 0.0,
           f32_ops / t_f32 / 1e9, w512 ? 512 : 256);
    free(buf);
    return 0;
}
