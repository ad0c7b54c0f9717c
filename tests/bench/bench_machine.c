/*
 * bench_machine.c - this machine's limits, the yardsticks for decode speed
 * (BENCHMARKS.md, "How close decode is to the machine"):
 *
 *   read_gb_s     memory read bandwidth: T threads each summing its share of
 *                 a 1 GiB buffer (far larger than the caches) in the widest
 *                 vectors the CPU has (AVX-512, AVX2; scalar words
 *                 elsewhere), four independent sums, best of 5. (Summing
 *                 64-bit words one at a time, as before 2026-12-06, read
 *                 ~20% less than the machine gives: 18.9 against 23.6 GB/s
 *                 on a 2-vCPU Sapphire Rapids);
 *   int8_gops     int8 dot-product throughput: T threads of AVX-512 VNNI
 *                 vpdpbusd (64 multiply-adds = 128 ops each) on independent
 *                 register accumulators, best of 5 (0 without VNNI);
 *   f32_gflops    float32 FMA throughput, AVX-512 (or AVX2) the same way;
 *   amx_int8_gops AMX-INT8 tile throughput: T threads each repeating four
 *                 independent TDPBSSD of 16 x 64 by 64 x 16 bytes (16,384
 *                 multiply-adds = 32,768 ops each) on tiles loaded once,
 *                 best of 5 (0 without AMX, or where Linux refuses the
 *                 tile state);
 *   amx_bf16_gflops the same with TDPBF16PS (16 x 32 by 32 x 16 bf16 pairs:
 *                 8,192 multiply-adds each), where AMX-BF16 is present.
 * The AMX figures are the peak of the full tile shape (K = 64 bytes); a
 * kernel whose blocks are 32 values long (GGUF's) issues K = 32 and can
 * reach at most half of it.
 *
 * Usage: bench_machine [threads] (default 2). Prints one JSON object.
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct job {
    const uint64_t *p;
    size_t n;
    int kind; /* 0 read, 1 int8, 2 f32, 3 AMX int8, 4 AMX bf16 */
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

#if defined(__x86_64__) && defined(__linux__) &&                                                  \
    (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define HAVE_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* CPUID leaf 7 EDX bit (22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8), and Linux's
 * permission for the tile state (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
static int amx_feature(int bit) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> bit & 1)) return 0;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

typedef struct tile_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

/* Tiles 0-3 C (16 x 64 bytes), 4-5 A, 6-7 B, all full size. */
__attribute__((target("amx-tile"))) static void amx_setup(void) {
    _Alignas(64) tile_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    /* GCC does not see that ldtilecfg reads the struct: keep its stores. */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
    _Alignas(64) static const uint8_t ones[16 * 64] = {1};
    for (int i = 0; i < 4; i++) { /* constant tile numbers */
        if (i == 0) _tile_loadd(4, ones, 64);
        if (i == 1) _tile_loadd(5, ones, 64);
        if (i == 2) _tile_loadd(6, ones, 64);
        if (i == 3) _tile_loadd(7, ones, 64);
    }
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

/* iters x four independent tile products DP (C 0-3 from A 4-5, B 6-7),
 * then tile 0's first value, as a result the compiler must keep. */
#define AMX_LOOP(NAME, TARGET, DP, CT)                                                             \
    __attribute__((target(TARGET))) static uint64_t NAME(long iters) {                             \
        amx_setup();                                                                               \
        for (long k = 0; k < iters; k++) {                                                         \
            DP(0, 4, 6);                                                                           \
            DP(1, 4, 7);                                                                           \
            DP(2, 5, 6);                                                                           \
            DP(3, 5, 7);                                                                           \
        }                                                                                          \
        _Alignas(64) CT c[16][16];                                                                 \
        _tile_stored(0, c, 64);                                                                    \
        _tile_release();                                                                           \
        return (uint64_t)c[0][0];                                                                  \
    }
AMX_LOOP(amx_int8_loop, "amx-tile,amx-int8", _tile_dpbssd, int32_t)
AMX_LOOP(amx_bf16_loop, "amx-tile,amx-bf16", _tile_dpbf16ps, float)
#endif

/* Sums n 64-bit words at p (n a multiple of 32) in 512-bit vectors. */
__attribute__((target("avx512f"))) static uint64_t read512(const uint64_t *p, size_t n) {
    __m512i s[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    _mm512_setzero_si512()};
    for (size_t i = 0; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            s[k] = _mm512_add_epi64(s[k], _mm512_load_si512((const void *)(p + i + 8 * k)));
    return (uint64_t)_mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(s[0], s[1]), _mm512_add_epi64(s[2], s[3])));
}

/* The same in 256-bit vectors. */
__attribute__((target("avx2"))) static uint64_t read256(const uint64_t *p, size_t n) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                    _mm256_setzero_si256()};
    for (size_t i = 0; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++)
            s[k] = _mm256_add_epi64(s[k], _mm256_load_si256((const __m256i *)(p + i + 4 * k)));
    uint64_t v[4];
    _mm256_storeu_si256((__m256i *)v, _mm256_add_epi64(_mm256_add_epi64(s[0], s[1]),
                                                       _mm256_add_epi64(s[2], s[3])));
    return v[0] + v[1] + v[2] + v[3];
}

static void *run(void *arg) {
    job *j = arg;
    if (j->kind == 0 && __builtin_cpu_supports("avx512f")) {
        j->out = read512(j->p, j->n);
    } else if (j->kind == 0 && __builtin_cpu_supports("avx2")) {
        j->out = read256(j->p, j->n);
    } else if (j->kind == 0) {
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
#if defined(HAVE_AMX)
    } else if (j->kind == 3) {
        j->out = amx_int8_loop(j->iters);
    } else if (j->kind == 4) {
        j->out = amx_bf16_loop(j->iters);
#endif
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
    /* In huge pages, as the CPU backend keeps repacked weights
     * (cpu_backend.c, alloc_weight): with 4 KiB pages the read loop would
     * measure TLB misses, and vary with the kernel's luck in finding huge
     * pages, instead of the memory's bandwidth. */
    uint64_t *buf = aligned_alloc((size_t)2 << 20, bytes);
    if (!buf) {
        fprintf(stderr, "bench_machine: out of memory for a 1 GiB buffer\n");
        return 1;
    }
    (void)madvise(buf, bytes, MADV_HUGEPAGE);
    for (size_t i = 0; i < n; i++) buf[i] = i; /* touch every page */
    double t_read = best_time(T, 0, buf, n, 0);
    long iters = 20000000;
    int vnni = __builtin_cpu_supports("avx512vnni");
    double t_int8 = vnni ? best_time(T, 1, buf, n, iters) : 0;
    double t_f32 = best_time(T, 2, buf, n, iters);
    int w512 = __builtin_cpu_supports("avx512f");
    double int8_ops = (double)T * iters * 12 * 64 * 2; /* 64 MACs per vpdpbusd */
    double f32_ops = (double)T * iters * 12 * (w512 ? 16 : 8) * 2;
    double amx_int8 = 0, amx_bf16 = 0;
#if defined(HAVE_AMX)
    const long amx_iters = 2000000; /* x 4 tile products */
    if (amx_feature(25))
        amx_int8 = (double)T * amx_iters * 4 * 16384 * 2 / best_time(T, 3, buf, n, amx_iters) / 1e9;
    if (amx_feature(22))
        amx_bf16 = (double)T * amx_iters * 4 * 8192 * 2 / best_time(T, 4, buf, n, amx_iters) / 1e9;
#endif
    printf("{\"threads\": %d, \"read_gb_s\": %.2f, \"int8_gops\": %.1f, \"f32_gflops\": %.1f, "
           "\"f32_width\": %d, \"amx_int8_gops\": %.1f, \"amx_bf16_gflops\": %.1f}\n",
           T, (double)bytes / t_read / 1e9, vnni ? int8_ops / t_int8 / 1e9 : 0.0,
           f32_ops / t_f32 / 1e9, w512 ? 512 : 256, amx_int8, amx_bf16);
    free(buf);
    return 0;
}
