/*
 * test_audio_ops.c - the speech codec decoder's backend ops
 * (kernels/backend.h conv1d, conv1d_dw, group_norm, istft; the CPU's in
 * kernels/cpu/cpu_audio.c) against plain double arithmetic, on every CPU
 * kernel table this machine runs, with 1 and 3 threads (the results must
 * be the same bits: every value is one thread's, in a fixed order), the
 * kernel tables' dot4 (the same bits as dot); and a
 * backend without them refusing the decoder by op name.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "test_rand.h"
#include "wavtokenizer.h"

static zi_test_rng rng = {0x2545f4914f6cdd1dull};
static const char *isas[] = {"scalar", "avx2", "avx512"};

static zi_backend *make_backend(const char *isa, int threads) {
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads, .isa = isa};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    return be;
}

static float *rand_vec(size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof *v);
    assert_non_null(v);
    for (size_t i = 0; i < n; i++) v[i] = zi_test_frand(&rng, lo, hi);
    return v;
}

/* max |a - b| / max |b| */
static double rel_max(const float *a, const double *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return d / m;
}

static void test_conv1d(void **state) {
    (void)state;
    const int shapes[][4] = {{7, 40, 19, 7}, {1, 33, 48, 1}, {5, 64, 16, 3}, {2, 17, 5, 7}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], cin = shapes[s][1], cout = shapes[s][2], K = shapes[s][3];
        float *x = rand_vec((size_t)n * cin, -1, 1), *w = rand_vec((size_t)K * cout * cin, -1, 1);
        float *b = rand_vec((size_t)cout, -1, 1);
        double *want = calloc((size_t)n * cout, sizeof *want);
        for (int t = 0; t < n; t++)
            for (int o = 0; o < cout; o++) {
                double acc = b[o];
                for (int j = 0; j < K; j++) {
                    const int src = t + j - K / 2;
                    if (src < 0 || src >= n) continue;
                    for (int i = 0; i < cin; i++)
                        acc +=
                            (double)w[((size_t)j * cout + o) * cin + i] * x[(size_t)src * cin + i];
                }
                want[(size_t)t * cout + o] = acc;
            }
        for (int ii = 0; ii < 3; ii++) {
            if (!zi_cpu_kernels_by_name(isas[ii])) continue;
            float *y1 = malloc((size_t)n * cout * sizeof *y1),
                  *y3 = malloc((size_t)n * cout * sizeof *y3);
            zi_backend *be1 = make_backend(isas[ii], 1), *be3 = make_backend(isas[ii], 3);
            be1->ops->conv1d(be1, y1, x, w, b, n, cin, cout, K);
            be3->ops->conv1d(be3, y3, x, w, b, n, cin, cout, K);
            assert_memory_equal(y1, y3, (size_t)n * cout * sizeof *y1);
            assert_true(rel_max(y1, want, (size_t)n * cout) < 2e-6);
            be1->ops->conv1d(be1, y3, x, w, NULL, n, cin, cout, K); /* no bias */
            for (int t = 0; t < n; t++)
                for (int o = 0; o < cout; o++) y3[(size_t)t * cout + o] += b[o];
            assert_true(rel_max(y3, want, (size_t)n * cout) < 2e-6);
            zi_backend_free(be1);
            zi_backend_free(be3);
            free(y1);
            free(y3);
        }
        free(x), free(w), free(b), free(want);
    }
}

/* The kernel tables' dot4 gives the same bits as four dot calls. */
static void test_dot4(void **state) {
    (void)state;
    const int64_t lens[] = {768, 40, 16, 7, 2304};
    for (int ii = 0; ii < 3; ii++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[ii]);
        if (!k) continue;
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            const int64_t n = lens[l];
            const size_t stride = (size_t)n + 3;
            float *a = rand_vec((size_t)n, -1, 1), *b = rand_vec(4 * stride, -1, 1), d[4];
            k->dot4(a, b, stride, n, d);
            for (int r = 0; r < 4; r++) {
                const float want = k->dot(a, b + r * stride, n);
                assert_memory_equal(&d[r], &want, sizeof want);
            }
            free(a), free(b);
        }
    }
}

static void test_conv1d_dw(void **state) {
    (void)state;
    const int n = 9, C = 37, K = 7;
    float *x = rand_vec((size_t)n * C, -2, 2), *w = rand_vec((size_t)C * K, -1, 1);
    float *b = rand_vec((size_t)C, -1, 1), *y = malloc((size_t)n * C * sizeof *y);
    double *want = calloc((size_t)n * C, sizeof *want);
    for (int t = 0; t < n; t++)
        for (int c = 0; c < C; c++) {
            double acc = b[c];
            for (int j = 0; j < K; j++) {
                const int src = t + j - K / 2;
                if (src >= 0 && src < n) acc += (double)w[c * K + j] * x[(size_t)src * C + c];
            }
            want[(size_t)t * C + c] = acc;
        }
    zi_backend *be = make_backend(NULL, 2);
    be->ops->conv1d_dw(be, y, x, w, b, n, C, K);
    assert_true(rel_max(y, want, (size_t)n * C) < 1e-6);
    zi_backend_free(be);
    free(x), free(w), free(b), free(y), free(want);
}

static void test_group_norm(void **state) {
    (void)state;
    const int n = 6, C = 48, G = 8, dg = C / G;
    const float eps = 1e-6f;
    float *x = rand_vec((size_t)n * C, -3, 5), *w = rand_vec((size_t)C, 0.5f, 1.5f);
    float *b = rand_vec((size_t)C, -1, 1), *y = malloc((size_t)n * C * sizeof *y);
    double *want = calloc((size_t)n * C, sizeof *want);
    for (int g = 0; g < G; g++) {
        double m = 0, v = 0;
        for (int t = 0; t < n; t++)
            for (int c = g * dg; c < (g + 1) * dg; c++) m += x[(size_t)t * C + c];
        m /= n * dg;
        for (int t = 0; t < n; t++)
            for (int c = g * dg; c < (g + 1) * dg; c++)
                v += (x[(size_t)t * C + c] - m) * (x[(size_t)t * C + c] - m);
        v /= n * dg;
        for (int t = 0; t < n; t++)
            for (int c = g * dg; c < (g + 1) * dg; c++)
                want[(size_t)t * C + c] = (x[(size_t)t * C + c] - m) / sqrt(v + eps) * w[c] + b[c];
    }
    zi_backend *be = make_backend(NULL, 3);
    be->ops->group_norm(be, y, x, w, b, n, C, G, eps);
    assert_true(rel_max(y, want, (size_t)n * C) < 1e-6);
    be->ops->group_norm(be, x, x, w, b, n, C, G, eps); /* in place */
    assert_memory_equal(x, y, (size_t)n * C * sizeof *y);
    zi_backend_free(be);
    free(x), free(w), free(b), free(y), free(want);
}

/* The inverse STFT by its definition: the full complex inverse DFT of the
 * Hermitian-extended spectrum, window, overlap-add, envelope, cut. */
static void test_istft(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 16, 4},  {5, 16, 4}, {4, 32, 8}, {3, 12, 6},
                             {6, 40, 10}, {3, 14, 7}, {2, 90, 30}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int n = shapes[s][0], N = shapes[s][1], hop = shapes[s][2], H = N / 2 + 1;
        float *spec = rand_vec((size_t)n * (N + 2), -2, 3),
              *frames = malloc((size_t)n * N * sizeof(float));
        float *out = malloc((size_t)n * hop * sizeof(float));
        spec[3] = 5.2f; /* one magnitude over the clamp (e^5.2 > 100) */
        const int total = (n - 1) * hop + N, pad = (N - hop) / 2;
        double *y = calloc((size_t)total, sizeof *y), *env = calloc((size_t)total, sizeof *env);
        double *want = malloc((size_t)n * hop * sizeof *want);
        for (int f = 0; f < n; f++) {
            const float *sp = spec + (size_t)f * (N + 2);
            for (int k = 0; k < N; k++) {
                double acc = 0;
                for (int m = 0; m < N; m++) { /* bin m, or the conjugate of N - m */
                    const int src = m < H ? m : N - m;
                    double mag = fmin(exp((double)sp[src]), 100.0), ph = sp[H + src];
                    double re = mag * cos(ph), im = mag * sin(ph);
                    if (m >= H) im = -im;
                    if (m == 0 || m == N / 2) im = 0; /* irfft ignores them */
                    acc += re * cos(2 * M_PI * k * m / N) - im * sin(2 * M_PI * k * m / N);
                }
                const double win = 0.5 - 0.5 * cos(2 * M_PI * k / N);
                y[f * hop + k] += acc / N * win;
                env[f * hop + k] += win * win;
            }
        }
        for (int i = 0; i < n * hop; i++) want[i] = y[i + pad] / env[i + pad];
        zi_backend *be = make_backend(NULL, 2);
        be->ops->istft(be, out, spec, frames, n, N, hop);
        assert_true(rel_max(out, want, (size_t)n * hop) < 1e-6);
        zi_backend_free(be);
        free(spec), free(frames), free(out), free(y), free(env), free(want);
    }
}

static void test_backend_without_ops_refuses(void **state) {
    (void)state;
    zi_backend *cpu = make_backend(NULL, 1);
    zi_backend_ops ops = *cpu->ops;
    ops.name = "lacking";
    ops.group_norm = NULL;
    zi_backend fake = *cpu;
    fake.ops = &ops;
    zi_wavtok *w = NULL;
    zi_error err = {0};
    assert_int_equal(zi_wavtok_load("/nonexistent.gguf", &fake, &w, &err), ZI_EUNSUPPORTED);
    assert_null(w);
    assert_non_null(strstr(err.msg, "the lacking backend has no group_norm op"));
    zi_backend_free(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv1d),    cmocka_unit_test(test_dot4),
        cmocka_unit_test(test_conv1d_dw), cmocka_unit_test(test_group_norm),
        cmocka_unit_test(test_istft),     cmocka_unit_test(test_backend_without_ops_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
