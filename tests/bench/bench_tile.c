/*
 * bench_tile.c - speed of the CPU backend's tile products (kernels/cpu/
 * tile_mm.h) at an image tower's sizes: matmul_tile for the gemma3 tower's
 * products (4096 patches, 1152 wide, ffn 4304) and span_attention with
 * tile_precision (16 heads of 72 over 4096 rows). Prints one JSON object:
 * milliseconds and GMAC/s (the products' multiply-adds, not the three bf16
 * tile products each costs) per shape.
 *
 *   build/tests/bench/bench_tile [threads] [patches] [mm|attn|all]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_backend.h"
#include "tile_mm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of the process (all threads): on a shared machine, the
 * time it ran, not the time others took. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    const int T = argc > 2 ? atoi(argv[2]) : 4096;
    const char *what = argc > 3 ? argv[3] : "all";
    const int do_mm = strcmp(what, "attn") != 0, do_attn = strcmp(what, "mm") != 0;
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads};
    if (zi_cpu_backend_create(&o, &be, &err)) {
        fprintf(stderr, "bench_tile: %s\n", err.msg);
        return 1;
    }
    const int shapes[][2] = {{1152, 1152}, {4304, 1152}, {1152, 4304}};
    unsigned seed = 1;
    float *x = malloc((size_t)T * 4304 * sizeof(float));
    float *y = malloc((size_t)T * 4304 * sizeof(float));
    for (size_t i = 0; i < (size_t)T * 4304; i++) x[i] = frand(&seed);
    printf("{\"threads\": %d, \"kind\": %d, \"patches\": %d", threads, zi_tile_kind(), T);
    for (int s = 0; s < (do_mm ? 3 : 0); s++) {
        const int rows = shapes[s][0], cols = shapes[s][1];
        float *wf = malloc((size_t)rows * cols * sizeof(float));
        for (size_t i = 0; i < (size_t)rows * cols; i++) wf[i] = frand(&seed) * 0.05f;
        zi_gguf_tensor t = {.type = ZI_TYPE_F32, .n_dims = 2, .ne = {cols, rows, 1, 1},
                            .nbytes = (uint64_t)rows * cols * 4, .data = wf};
        zi_weight w = {0};
        if (be->ops->weight_init(be, &w, &t, &err) ||
            be->ops->weight_prepare_tile(be, &w, &err)) {
            fprintf(stderr, "bench_tile: %s\n", err.msg);
            return 1;
        }
        be->ops->matmul_tile(be, y, &w, x, T);
        double best = 1e9, best_cpu = 1e9;
        for (int r = 0; r < 5; r++) {
            double t0 = now(), c0 = cpu_now();
            be->ops->matmul_tile(be, y, &w, x, T);
            double dt = now() - t0, dc = cpu_now() - c0;
            best = dt < best ? dt : best;
            best_cpu = dc < best_cpu ? dc : best_cpu;
        }
        printf(", \"mm_%dx%d_ms\": %.1f, \"mm_%dx%d_cpu_ms\": %.1f, \"mm_%dx%d_gmacs\": %.1f", rows,
               cols, best * 1e3, rows, cols, best_cpu * 1e3, rows, cols,
               (double)T * rows * cols / best * 1e-9);
        be->ops->weight_free(be, &w);
        free(wf);
    }
    if (!do_attn) {
        printf("}\n");
        zi_backend_free(be);
        return 0;
    }
    /* attention: 16 heads of 72 */
    const int H = 16, hd = 72, E = H * hd;
    float *q = malloc((size_t)T * E * 4), *k = malloc((size_t)T * E * 4), *v = malloc((size_t)T * E * 4);
    for (size_t i = 0; i < (size_t)T * E; i++) q[i] = frand(&seed), k[i] = frand(&seed), v[i] = frand(&seed);
    int32_t *order = malloc((size_t)T * sizeof(int32_t)), starts[2] = {0, T};
    for (int i = 0; i < T; i++) order[i] = i;
    zi_attn_shape sh = {.n_heads = H, .n_kv_heads = H, .head_dim = hd, .block_size = 1,
                        .max_ctx = T, .scale = 1.0f / sqrtf((float)hd), .tile_precision = 1};
    be->ops->span_attention(be, y, q, k, v, order, starts, 1, &sh);
    double best = 1e9, best_cpu = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now(), c0 = cpu_now();
        be->ops->span_attention(be, y, q, k, v, order, starts, 1, &sh);
        double dt = now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        best_cpu = dc < best_cpu ? dc : best_cpu;
    }
    printf(", \"attn_ms\": %.1f, \"attn_cpu_ms\": %.1f, \"attn_gmacs\": %.1f}\n", best * 1e3,
           best_cpu * 1e3, 2.0 * H * (double)T * T * hd / best * 1e-9);
    zi_backend_free(be);
    return 0;
}
