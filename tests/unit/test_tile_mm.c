/*
 * test_tile_mm.c - the CPU backend's tile products (kernels/cpu/tile_mm.h)
 * against float64 references on random data:
 *   - matmul_tile with F32 and F16 weights, odd sizes (rows, inputs and
 *     tokens not multiples of 16 or 32, one of each), packed ahead by
 *     weight_prepare_tile or on the first call: every output within 2e-5
 *     of the sum of its terms' magnitudes (the bf16 hi/lo split leaves
 *     ~2^-17 per term), and the whole within 1e-5 relative (rms);
 *   - span_attention with tile_precision: spans of 1 to 300 rows side by
 *     side, GQA groups of 1 and 2, head sizes 16, 37, 64 and 72, scores
 *     large enough that an exp without the running maximum would
 *     overflow and scores that rise along the span (the online softmax
 *     rescales at every key block): within 2e-5 of the largest |v| (v is
 *     in [-1, 1]), times |score| / 8 where the row's largest |score| is
 *     over 8 (a score's error is relative to it, and exp turns it into a
 *     relative error of the row's weights).
 * meson runs it twice: as the CPU has it (AMX tiles where there are) and
 * with ZINFER_CPU_AMX=0 (the AVX-512 FMA kernels); without AVX-512 (or
 * with ZINFER_CPU_ISA below avx512) the ops fall back to matmul and the
 * exact attention, which pass too.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "cpu_backend.h"
#include "test_rand.h"
#include "tile_mm.h"

static zi_test_rng rng = {0x9e3779b97f4a7c15ull};

static float frand(void) { return (float)(2.0 * zi_test_urand(&rng) - 1.0); }

static zi_backend *make_backend(int threads) {
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    assert_non_null(be->ops->matmul_tile);
    assert_non_null(be->ops->weight_prepare_tile);
    return be;
}

static void check_matmul(zi_backend *be, int type, int rows, int cols, int n, int prepare) {
    float *wf = malloc((size_t)rows * cols * sizeof(float));
    _Float16 *wh = malloc((size_t)rows * cols * sizeof(_Float16));
    float *x = malloc((size_t)n * cols * sizeof(float));
    float *y = malloc((size_t)n * rows * sizeof(float));
    assert_true(wf && wh && x && y);
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        wf[i] = frand() * 0.3f;
        wh[i] = (_Float16)wf[i];
        if (type == ZI_TYPE_F16) wf[i] = (float)wh[i]; /* the reference's weights */
    }
    /* activations over several binades, as a tower's are */
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = frand() * exp2f((float)(i % 7) - 3.0f);
    zi_gguf_tensor t = {.type = type, .n_dims = 2, .ne = {cols, rows, 1, 1}};
    t.data = type == ZI_TYPE_F16 ? (const void *)wh : (const void *)wf;
    t.nbytes = (uint64_t)rows * cols * (type == ZI_TYPE_F16 ? 2 : 4);
    zi_weight w = {0};
    zi_error err = {0};
    assert_int_equal(be->ops->weight_init(be, &w, &t, &err), ZI_OK);
    if (prepare) assert_int_equal(be->ops->weight_prepare_tile(be, &w, &err), ZI_OK);
    be->ops->matmul_tile(be, y, &w, x, n);
    double se = 0.0, sr = 0.0;
    for (int i = 0; i < n; i++)
        for (int r = 0; r < rows; r++) {
            double ref = 0.0, mag = 0.0;
            for (int c = 0; c < cols; c++) {
                const double p = (double)wf[(size_t)r * cols + c] * (double)x[(size_t)i * cols + c];
                ref += p;
                mag += fabs(p);
            }
            const double got = y[(size_t)i * rows + r], e = fabs(got - ref);
            if (!(e <= 2e-5 * mag + 1e-30))
                fail_msg("type %d %dx%d n=%d: y[%d][%d] = %.9g, reference %.9g (terms %.3g)", type,
                         rows, cols, n, i, r, got, ref, mag);
            se += e * e, sr += ref * ref;
        }
    if (sr > 0.0 && !(sqrt(se / sr) < 1e-5))
        fail_msg("type %d %dx%d n=%d: relative rms error %.3g", type, rows, cols, n, sqrt(se / sr));
    be->ops->weight_free(be, &w);
    assert_null(w.aux);
    free(wf), free(wh), free(x), free(y);
}

static void test_matmul_tile(void **state) {
    (void)state;
    static const int shapes[][3] = {{1, 1, 1},    {17, 37, 5},   {33, 64, 33},  {70, 100, 17},
                                    {128, 96, 64}, {48, 300, 130}, {64, 32, 16}, {40, 1152, 48}};
    for (int th = 1; th <= 3; th += 2) {
        zi_backend *be = make_backend(th);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int f16 = 0; f16 < 2; f16++)
                check_matmul(be, f16 ? ZI_TYPE_F16 : ZI_TYPE_F32, shapes[s][0], shapes[s][1],
                             shapes[s][2], (int)(s % 2));
        zi_backend_free(be);
    }
    fprintf(stderr, "tile kind %d (0 none, 1 FMA, 2 AMX)\n", zi_tile_kind());
}

/* softmax(q K^T * scale) V for row t's span, in double. */
static void reference(double *out, const float *q, const float *k, const float *v, int lo, int hi,
                      int t, const zi_attn_shape *s, double *max_score) {
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const size_t qs = (size_t)s->n_heads * hd, ks = (size_t)s->n_kv_heads * hd;
    double *sc = malloc((size_t)(hi - lo) * sizeof *sc);
    assert_non_null(sc);
    for (int h = 0; h < s->n_heads; h++) {
        const float *qh = q + (size_t)t * qs + (size_t)h * hd;
        const size_t ko = (size_t)(h / group) * hd;
        double mx = -INFINITY, sum = 0.0;
        for (int u = lo; u < hi; u++) {
            double d = 0.0;
            for (int i = 0; i < hd; i++) d += (double)qh[i] * (double)k[(size_t)u * ks + ko + i];
            sc[u - lo] = d * (double)s->scale;
            mx = sc[u - lo] > mx ? sc[u - lo] : mx;
            if (fabs(sc[u - lo]) > *max_score) *max_score = fabs(sc[u - lo]);
        }
        for (int u = lo; u < hi; u++) sum += sc[u - lo] = exp(sc[u - lo] - mx);
        for (int i = 0; i < hd; i++) {
            double acc = 0.0;
            for (int u = lo; u < hi; u++) acc += sc[u - lo] * (double)v[(size_t)u * ks + ko + i];
            out[(size_t)h * hd + i] = acc / sum;
        }
    }
    free(sc);
}

static void check_attention(zi_backend *be, int heads, int kv_heads, int hd, const int *lens,
                            int n_spans, float qscale, int rising) {
    int32_t starts[8];
    starts[0] = 0;
    for (int r = 0; r < n_spans; r++) starts[r + 1] = starts[r] + lens[r];
    const int T = starts[n_spans];
    const size_t qs = (size_t)heads * hd, ks = (size_t)kv_heads * hd;
    float *q = malloc((size_t)T * qs * sizeof(float)), *out = malloc((size_t)T * qs * sizeof(float));
    float *k = malloc((size_t)T * ks * sizeof(float)), *v = malloc((size_t)T * ks * sizeof(float));
    double *ref = malloc(qs * sizeof(double));
    int32_t *order = malloc((size_t)T * sizeof(int32_t));
    assert_true(q && out && k && v && ref && order);
    for (size_t i = 0; i < (size_t)T * qs; i++) q[i] = frand() * qscale;
    for (size_t i = 0; i < (size_t)T * ks; i++) k[i] = frand(), v[i] = frand();
    if (rising) /* each key's first value grows: scores rise along the span */
        for (int u = 0; u < T; u++)
            for (int g = 0; g < kv_heads; g++) k[(size_t)u * ks + (size_t)g * hd] = 0.05f * (float)u;
    if (rising)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++) q[(size_t)t * qs + (size_t)h * hd] = 4.0f;
    /* the spans' rows interleaved in the batch: order lists each span's */
    for (int i = 0; i < T; i++) order[i] = (int32_t)((i * 7 + 3) % T);
    int coprime = 1;
    for (int d = 2; d <= 7; d++)
        if (T % d == 0 && 7 % d == 0) coprime = 0;
    if (!coprime)
        for (int i = 0; i < T; i++) order[i] = i;
    zi_attn_shape sh = {.n_heads = heads, .n_kv_heads = kv_heads, .head_dim = hd,
                        .block_size = 1, .max_ctx = T, .scale = 1.0f / sqrtf((float)hd),
                        .tile_precision = 1};
    be->ops->span_attention(be, out, q, k, v, order, starts, n_spans, &sh);
    /* the reference on the same rows: span r's rows gathered in order */
    float *qg = malloc((size_t)T * qs * sizeof(float)), *kg = malloc((size_t)T * ks * sizeof(float));
    float *vg = malloc((size_t)T * ks * sizeof(float));
    assert_true(qg && kg && vg);
    for (int i = 0; i < T; i++) {
        memcpy(qg + (size_t)i * qs, q + (size_t)order[i] * qs, qs * sizeof(float));
        memcpy(kg + (size_t)i * ks, k + (size_t)order[i] * ks, ks * sizeof(float));
        memcpy(vg + (size_t)i * ks, v + (size_t)order[i] * ks, ks * sizeof(float));
    }
    for (int r = 0; r < n_spans; r++)
        for (int i = starts[r]; i < starts[r + 1]; i++) {
            double ms = 0.0;
            reference(ref, qg, kg, vg, starts[r], starts[r + 1], i, &sh, &ms);
            /* a score's error is relative to its size, and exp makes it a
             * relative error of its weight: the bound grows with |score| */
            const double tol = 2e-5 * (ms > 8.0 ? ms / 8.0 : 1.0);
            const float *o = out + (size_t)order[i] * qs;
            for (size_t d = 0; d < qs; d++)
                if (!(fabs(o[d] - ref[d]) <= tol))
                    fail_msg("heads %d/%d hd %d span %d (%d rows) row %d value %zu: %.9g, "
                             "reference %.9g",
                             heads, kv_heads, hd, r, lens[r], i, d, o[d], ref[d]);
        }
    free(q), free(out), free(k), free(v), free(ref), free(order), free(qg), free(kg), free(vg);
}

static void test_span_attention_tile(void **state) {
    (void)state;
    static const int lens_a[] = {1, 5, 40, 300}, lens_b[] = {257}, lens_c[] = {16, 33};
    for (int th = 1; th <= 3; th += 2) {
        zi_backend *be = make_backend(th);
        check_attention(be, 2, 2, 72, lens_a, 4, 1.0f, 0);
        check_attention(be, 4, 2, 37, lens_c, 2, 1.0f, 0);
        check_attention(be, 2, 1, 64, lens_b, 1, 1.0f, 1);
        check_attention(be, 3, 3, 16, lens_c, 2, 60.0f, 0); /* scores up to ~hundreds */
        check_attention(be, 1, 1, 72, lens_b, 1, 1.0f, 1);
        zi_backend_free(be);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_tile),
        cmocka_unit_test(test_span_attention_tile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
