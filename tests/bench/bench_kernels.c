/*
 * bench_kernels.c - the 16-row quantized product alone, one thread, per
 * weight type: how many int8 operations a second the kernel achieves (each
 * weight counts 2 products, q1 and q2, of 2 ops), to set beside
 * bench_machine's VNNI and AMX peaks. Random weights and activations; the
 * avx512 table (AMX for batches of 4 tokens and more where the CPU has it;
 * ZINFER_CPU_AMX=0 keeps them on VNNI) or the one ZINFER_CPU_ISA names.
 *
 * Usage: bench_kernels [rows cols tokens [type ...]]
 *   default 2048 2048 64, every type of the 16-row layouts.
 * Prints one JSON object per type: {"type", "rows", "cols", "tokens",
 * "ms", "gops", "amx"}.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cpu_kernels.h"
#include "gguf.h"
#include "quant.h"
#include "repack.h"
#include "repack_x.h"
#include "../unit/test_rand.h"

/* The GGUF type called `name`, or -1. */
static int type_from_name(const char *name) {
    for (int t = 0; t < 64; t++) {
        const char *n = zi_ggml_type_name(t);
        if (n && strcmp(n, name) == 0) return t;
    }
    return -1;
}

/* The thread's CPU time: on a machine shared with other jobs, the time the
 * kernel ran rather than the time it waited for a core (the wall clock
 * gave 170-370 Gop/s for the same Q4_K product under a load of 5 on 2
 * cores; CPU time 345-375). */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Best of 5 timings of a whole product, in seconds. */
static double time_product(const zi_cpu_kernels *k, int type, const uint8_t *p, size_t prb,
                           int64_t rows, const zi_q8_act *qa, int T, float *y) {
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        k->mm_r16(type, p, prb, 0, rows, qa, T, y, rows);
        double dt = now_s() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int64_t rows = 2048, cols = 2048;
    int T = 64;
    if (argc > 1 && argc < 4) {
        fprintf(stderr, "usage: bench_kernels [rows cols tokens [type ...]]\n");
        return 2;
    }
    if (argc >= 4) rows = atoll(argv[1]), cols = atoll(argv[2]), T = atoi(argv[3]);
    if (rows < 16 || rows % 16 || cols < 256 || cols % 256 || T < 1 || T > 4096) {
        fprintf(stderr, "bench_kernels: rows a multiple of 16, cols of 256, 1 <= tokens <= 4096\n");
        return 2;
    }
    const char *isa = getenv("ZINFER_CPU_ISA");
    const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isa && *isa ? isa : "avx512");
    if (!k || !k->mm_r16) {
        fprintf(stderr, "bench_kernels: no 16-row kernels in this table on this CPU\n");
        return 1;
    }
    const int amx = T >= 4 && k->amx && k->amx();
    static const char *all[] = {"Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "IQ4_NL", "IQ4_XS",
                                "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4"};
    const char **names = argc > 4 ? (const char **)argv + 4 : all;
    const int n_names = argc > 4 ? argc - 4 : (int)(sizeof all / sizeof all[0]);
    zi_test_rng rng = {0x51ed270bu};
    const int64_t nb = cols / 32;
    zi_q8_act qa = {malloc((size_t)T * cols * 2), malloc(sizeof(float) * T * nb),
                    malloc(sizeof(float) * T * nb), nb, 0, malloc(sizeof(float) * T * nb * 2)};
    float *x = malloc(sizeof(float) * cols), *y = malloc(sizeof(float) * T * rows);
    for (int t = 0; t < T; t++) {
        for (int64_t i = 0; i < cols; i++) x[i] = zi_test_frand(&rng, -2, 2);
        k->quantize_act(x, &qa, t);
        zi_act_half_sums(&qa, t);
    }
    for (int i = 0; i < n_names; i++) {
        int type = type_from_name(names[i]);
        const size_t xrb = type < 0 ? 0 : zi_r16x_row_bytes(type, nb);
        if (!xrb && (type < 0 || !zi_r16_group_bytes(type))) {
            fprintf(stderr, "bench_kernels: %s has no 16-row layout\n", names[i]);
            return 2;
        }
        size_t rb;
        uint8_t *w = zi_test_random_blocks(&rng, type, rows, cols, &rb);
        const size_t prb = xrb ? xrb : rb; /* the 16-row layout keeps the file's size */
        /* In huge pages, as the CPU backend keeps repacked weights
         * (cpu_backend.c, alloc_weight): 4 KiB pages would measure TLB
         * misses, and vary with the kernel's luck in finding huge pages. */
        uint8_t *p = NULL;
        if (posix_memalign((void **)&p, (size_t)2 << 20, prb * (size_t)rows) != 0) return 2;
        (void)madvise(p, prb * (size_t)rows, MADV_HUGEPAGE);
        if (xrb)
            zi_r16x_repack(type, w, p, rows, nb, rb);
        else
            zi_r16_repack(type, w, p, rows, nb, rb);
        const double s = time_product(k, type, p, prb, rows, &qa, T, y);
        printf("{\"type\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"tokens\": %d, \"ms\": %.3f, "
               "\"gops\": %.1f, \"amx\": %s}\n",
               names[i], (long long)rows, (long long)cols, T, s * 1e3,
               4.0 * (double)rows * (double)cols * T / s / 1e9, amx ? "true" : "false");
        free(p);
        free(w);
    }
    free(x);
    free(y);
    free(qa.q);
    free(qa.d);
    free(qa.s);
    free(qa.s16);
    return 0;
}
