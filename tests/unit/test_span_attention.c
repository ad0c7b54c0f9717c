/*
 * test_span_attention.c - the CPU backend's span_attention (the encoders'
 * exact bidirectional attention, kernels/cpu/span_attention.h) against a
 * naive float64 softmax(Q K^T * scale) V per span:
 *   - spans of 1 to 70 rows, interleaved in the batch (grouped by
 *     zi_encoder_groups, as model.c does), GQA groups of 1, 2 and 4, head
 *     sizes 32, 40 and 37 (a tail past the kernel's four partial sums);
 *   - scores that rise along the span (each key a new maximum: the online
 *     softmax rescales every step) and scores large enough that a float
 *     exp would overflow without the maximum subtracted;
 *   - within one float rounding of the float64 result, bidirectional and
 *     causal (a row sees its span's rows up to itself);
 *   - a span's rows bit for bit the same alone as beside other spans, and
 *     on 1 or 3 threads.
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
#include "encoder_span.h"
#include "test_rand.h"

static zi_backend *make_backend(int threads) {
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    assert_non_null(be->ops->span_attention);
    return be;
}

/* The float64 reference for row t: every row u with seq[u] == seq[t] (and
 * u <= t when s->causal: a span's rows are in batch order). */
static void reference(double *out, const float *q, const float *k, const float *v,
                      const int32_t *seq, int T, int t, const zi_attn_shape *s) {
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const size_t qs = (size_t)s->n_heads * hd, ks = (size_t)s->n_kv_heads * hd;
    double *sc = malloc((size_t)T * sizeof *sc);
    assert_non_null(sc);
    for (int h = 0; h < s->n_heads; h++) {
        const float *qh = q + t * qs + (size_t)h * hd;
        const size_t ko = (size_t)(h / group) * hd;
        double mx = -INFINITY, sum = 0.0;
        for (int u = 0; u < T; u++) {
            if (seq[u] != seq[t] || (s->causal && u > t)) continue;
            double d = 0.0;
            for (int i = 0; i < hd; i++) d += (double)qh[i] * (double)k[u * ks + ko + i];
            sc[u] = d * (double)s->scale;
            if (sc[u] > mx) mx = sc[u];
        }
        for (int u = 0; u < T; u++)
            if (seq[u] == seq[t] && !(s->causal && u > t)) sum += sc[u] = exp(sc[u] - mx);
        for (int i = 0; i < hd; i++) {
            double o = 0.0;
            for (int u = 0; u < T; u++)
                if (seq[u] == seq[t] && !(s->causal && u > t))
                    o += sc[u] / sum * (double)v[u * ks + ko + i];
            out[(size_t)h * hd + i] = o;
        }
    }
    free(sc);
}

typedef struct fixture {
    int T, n_rows;
    float *q, *k, *v;
    int32_t *seq, *order, *starts;
    int n_spans;
    zi_attn_shape s;
} fixture;

/* T rows in n_rows sequences dealt round-robin with uneven lengths;
 * `rising`: key rows grow along the batch so each score beats the last. */
static void make_fixture(fixture *f, zi_test_rng *rng, int T, int n_rows, int H, int KV, int hd,
                         float qmax, bool rising) {
    memset(f, 0, sizeof *f);
    f->T = T, f->n_rows = n_rows;
    f->s = (zi_attn_shape){
        .n_heads = H, .n_kv_heads = KV, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd)};
    size_t qn = (size_t)T * H * hd, kn = (size_t)T * KV * hd;
    f->q = malloc(qn * sizeof(float)), f->k = malloc(kn * sizeof(float));
    f->v = malloc(kn * sizeof(float));
    f->seq = malloc((size_t)T * sizeof(int32_t)), f->order = malloc((size_t)T * sizeof(int32_t));
    f->starts = malloc(((size_t)n_rows + 1) * sizeof(int32_t));
    assert_true(f->q && f->k && f->v && f->seq && f->order && f->starts);
    for (size_t i = 0; i < qn; i++) f->q[i] = zi_test_frand(rng, -qmax, qmax);
    for (size_t i = 0; i < kn; i++) f->v[i] = zi_test_frand(rng, -2.0f, 2.0f);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < KV * hd; i++)
            f->k[(size_t)t * KV * hd + i] =
                rising ? (float)(t + 1) * 0.05f : zi_test_frand(rng, -qmax, qmax);
    if (rising) /* q all positive: q.k rises with t */
        for (size_t i = 0; i < qn; i++) f->q[i] = fabsf(f->q[i]);
    /* Sequence of row t: mostly t % n_rows, some runs of one sequence. */
    for (int t = 0; t < T; t++) f->seq[t] = (t / 3 + t) % n_rows;
    int32_t *scratch = malloc((size_t)n_rows * sizeof(int32_t));
    zi_encoder_groups(f->seq, T, n_rows, f->order, f->starts, &f->n_spans, scratch);
    free(scratch);
}

static void free_fixture(fixture *f) {
    free(f->q), free(f->k), free(f->v), free(f->seq), free(f->order), free(f->starts);
}

/* Runs the op and checks every row against the float64 reference; the
 * output is returned for bitwise comparisons (caller frees). */
static float *run_and_check(zi_backend *be, const fixture *f) {
    const size_t qs = (size_t)f->s.n_heads * f->s.head_dim;
    float *out = calloc((size_t)f->T * qs, sizeof(float));
    double *ref = malloc(qs * sizeof(double));
    assert_true(out && ref);
    be->ops->span_attention(be, out, f->q, f->k, f->v, f->order, f->starts, f->n_spans, &f->s);
    zi_error err = {0};
    assert_int_equal(be->ops->sync(be, &err), ZI_OK);
    double worst = 0.0;
    for (int t = 0; t < f->T; t++) {
        reference(ref, f->q, f->k, f->v, f->seq, f->T, t, &f->s);
        for (size_t i = 0; i < qs; i++) {
            double o = out[t * qs + i], e = fabs(o - ref[i]);
            /* one float rounding of the exact value, plus double-level slack */
            double bound = ldexp(fabs(ref[i]), -24) + 1e-12;
            if (e > bound) fail_msg("row %d [%zu]: %.17g vs float64 %.17g", t, i, o, ref[i]);
            if (fabs(ref[i]) > 1e-3 && e / fabs(ref[i]) > worst) worst = e / fabs(ref[i]);
        }
    }
    assert_true(worst <= 0x1p-24);
    free(ref);
    return out;
}

static void test_against_float64(void **state) {
    (void)state;
    static const int shapes[][3] = {{4, 4, 32}, {8, 2, 40}, {8, 4, 37}, {4, 1, 32}};
    zi_backend *be1 = make_backend(1), *be3 = make_backend(3);
    zi_test_rng rng = {0x5eed5a11ull};
    for (size_t c = 0; c < sizeof shapes / sizeof *shapes; c++) {
        for (int rising = 0; rising < 4; rising++) {
            fixture f;
            /* 5 sequences over 150 rows (spans ~30 each), and one of 70 rows
             * next to single-row spans in the second; then the same causal
             * (a decoder's embedding inputs, zi_batch.f32_attn). */
            make_fixture(&f, &rng, c % 2 ? 150 : 73, c % 2 ? 5 : 4, shapes[c][0], shapes[c][1],
                         shapes[c][2], rising % 2 ? 1.0f : 3.0f, rising % 2);
            f.s.causal = rising >= 2;
            float *a = run_and_check(be1, &f), *b = run_and_check(be3, &f);
            size_t n = (size_t)f.T * f.s.n_heads * f.s.head_dim;
            assert_memory_equal(a, b, n * sizeof(float)); /* threads change nothing */
            free(a), free(b);
            free_fixture(&f);
        }
    }
    zi_backend_free(be1);
    zi_backend_free(be3);
}

/* Large scores (q.k * scale up to ~300): exp without the maximum would
 * overflow a float; single-row spans give exactly their own V row. */
static void test_large_scores_and_single_rows(void **state) {
    (void)state;
    zi_backend *be = make_backend(2);
    zi_test_rng rng = {0xabcdefull};
    fixture f;
    make_fixture(&f, &rng, 40, 3, 4, 2, 64, 20.0f, false);
    float *out = run_and_check(be, &f);
    free(out);
    free_fixture(&f);
    /* Each row its own span: out = v of its KV head. */
    make_fixture(&f, &rng, 6, 6, 4, 2, 32, 3.0f, false);
    for (int t = 0; t < 6; t++) f.seq[t] = t;
    int32_t scratch[6];
    zi_encoder_groups(f.seq, 6, 6, f.order, f.starts, &f.n_spans, scratch);
    assert_int_equal(f.n_spans, 6);
    out = run_and_check(be, &f);
    for (int t = 0; t < 6; t++)
        for (int h = 0; h < 4; h++)
            assert_memory_equal(out + (t * 4 + h) * 32, f.v + (t * 2 + h / 2) * 32,
                                32 * sizeof(float));
    free(out);
    free_fixture(&f);
    zi_backend_free(be);
}

/* A span's rows are the same bits alone as beside other spans. */
static void test_span_alone_is_identical(void **state) {
    (void)state;
    zi_backend *be = make_backend(2);
    zi_test_rng rng = {0x1234567ull};
    fixture f;
    make_fixture(&f, &rng, 90, 4, 8, 2, 40, 2.0f, false);
    float *all = run_and_check(be, &f);
    /* Sequence 1's rows alone, in their batch order. */
    fixture g = f;
    const size_t qs = (size_t)f.s.n_heads * f.s.head_dim,
                 ks = (size_t)f.s.n_kv_heads * f.s.head_dim;
    int n = 0;
    g.q = malloc((size_t)f.T * qs * sizeof(float)), g.k = malloc((size_t)f.T * ks * sizeof(float));
    g.v = malloc((size_t)f.T * ks * sizeof(float));
    g.seq = malloc((size_t)f.T * sizeof(int32_t)), g.order = malloc((size_t)f.T * sizeof(int32_t));
    g.starts = malloc(2 * sizeof(int32_t));
    int32_t *rows = malloc((size_t)f.T * sizeof(int32_t));
    for (int t = 0; t < f.T; t++) {
        if (f.seq[t] != 1) continue;
        memcpy(g.q + n * qs, f.q + t * qs, qs * sizeof(float));
        memcpy(g.k + n * ks, f.k + t * ks, ks * sizeof(float));
        memcpy(g.v + n * ks, f.v + t * ks, ks * sizeof(float));
        g.seq[n] = 0, rows[n++] = t;
    }
    g.T = n, g.n_rows = 1;
    int32_t scratch[1];
    zi_encoder_groups(g.seq, n, 1, g.order, g.starts, &g.n_spans, scratch);
    float *alone = run_and_check(be, &g);
    for (int i = 0; i < n; i++)
        assert_memory_equal(alone + i * qs, all + rows[i] * qs, qs * sizeof(float));
    free(alone), free(all), free(rows);
    free_fixture(&g);
    free_fixture(&f);
    zi_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_float64),
        cmocka_unit_test(test_large_scores_and_single_rows),
        cmocka_unit_test(test_span_alone_is_identical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
