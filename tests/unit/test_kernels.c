/*
 * test_kernels.c - the CPU kernels against plain float arithmetic.
 *
 * Every kernel table this CPU can run (scalar, avx2, avx512) must give the
 * same products as dequantize-then-multiply in double, up to the error of
 * quantizing the activations; and the SIMD tables must agree with the scalar
 * table to float rounding, because their integer partial sums are identical.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "gguf.h"
#include "quant.h"
#include "repack.h"
#include "threadpool.h"
#include "test_rand.h"

static zi_test_rng rng = {88172645463325252ull};
static float frand(float lo, float hi) {
    return zi_test_frand(&rng, lo, hi);
}

/* Random rows of `type` (test_rand.h), float types in [-1, 1]. */
static void *make_rows(int type, int rows, int cols, size_t *row_bytes) {
    void *w = zi_test_make_rows(&rng, type, rows, cols, 1.0f, row_bytes);
    assert_non_null(w);
    return w;
}

static void test_f16_roundtrip_all(void **state) {
    (void)state;
    /* Every half that is not NaN must survive half -> float -> half. */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = zi_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        assert_int_equal(zi_f32_to_f16(f), h);
    }
    assert_true(zi_f16_to_f32(0x3c00) == 1.0f);
    assert_true(zi_f16_to_f32(0xc000) == -2.0f);
    assert_true(zi_f16_to_f32(0x0001) == 5.9604644775390625e-08f); /* smallest subnormal */
    assert_int_equal(zi_f32_to_f16(65520.0f), 0x7c00);             /* rounds to +inf */
}

static void test_quantize_act(void **state) {
    (void)state;
    const zi_cpu_kernels *k = &zi_cpu_kernels_scalar;
    float x[64];
    for (int i = 0; i < 64; i++) x[i] = frand(-3, 3);
    x[5] = 4.0f; /* the block maximum maps to exactly 127 */
    int8_t qv[128];
    float dv[2], sv[2];
    zi_q8_act q = {qv, dv, sv, 2, 0, NULL};
    k->quantize_act(x, &q, 0);
    assert_int_equal(qv[5], 127);  /* the block maximum: q1 = 127, residual 0 */
    assert_int_equal(qv[64 + 5], 0);
    assert_true(fabsf(dv[0] - 4.0f / 127.0f / 256.0f) < 1e-12f);
    for (int b = 0; b < 2; b++) {
        int32_t s = 0;
        for (int i = 0; i < 32; i++) {
            int v = 256 * qv[b * 32 + i] + qv[64 + b * 32 + i];
            s += v;
            /* two int8 halves: the error is at most half of d/256 (plus float rounding) */
            assert_true(fabsf(v * dv[b] - x[b * 32 + i]) <= dv[b] * 0.5f + 1e-6f);
        }
        assert_true(fabsf(sv[b] - dv[b] * (float)s) <= 1e-6f * fabsf(sv[b]) + 1e-9f);
    }
    float zero[64] = {0}; /* all-zero block: d = 0, and no division by zero */
    k->quantize_act(zero, &q, 0);
    assert_true(dv[0] == 0.0f && sv[0] == 0.0f);
    /* A subnormal block (1/d would overflow) and a non-finite one quantize
     * to zeros instead of undefined float-to-int conversions. */
    float odd[64];
    for (int i = 0; i < 32; i++) odd[i] = i == 3 ? 1e-39f : 0.0f;
    for (int i = 32; i < 64; i++) odd[i] = i == 40 ? INFINITY : 1.0f;
    k->quantize_act(odd, &q, 0);
    assert_true(dv[0] == 0.0f && dv[1] == 0.0f && sv[1] == 0.0f);
    for (int i = 0; i < 128; i++) assert_int_equal(qv[i], 0);
}

/* Every table quantizes to the same bits as the scalar one: codes, scales
 * and sums. The AVX-512 table does 16 blocks at a time (its maxima, scales
 * and sums reduced together), so rows of 1 to 49 blocks put special blocks
 * at every place in a group and in the partial group at the end. */
static void test_quantize_act_tables_agree(void **state) {
    (void)state;
    const char *isas[] = {"avx2", "avx512"};
    const zi_cpu_kernels *ref = &zi_cpu_kernels_scalar;
    enum { NB = 49, COLS = NB * 32 };
    float *x = malloc(sizeof(float) * COLS);
    int8_t *q[2] = {malloc(2 * COLS), malloc(2 * COLS)};
    float *d[2] = {malloc(sizeof(float) * NB), malloc(sizeof(float) * NB)};
    float *sv[2] = {malloc(sizeof(float) * NB), malloc(sizeof(float) * NB)};
    int ran = 0;
    for (size_t i = 0; i < 2; i++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[i]);
        if (!k) continue;
        ran++;
        for (int trial = 0; trial < 200; trial++) {
            int nb = 1 + trial % NB;
            for (int b = 0; b < nb; b++) { /* scales from 1e-30 to 1e30 */
                float scale = powf(10.0f, frand(-30, 30));
                for (int j = 0; j < 32; j++) x[b * 32 + j] = frand(-1, 1) * scale;
            }
            /* Values whose residual is exactly half a step (the clamp),
             * and special blocks at random places. */
            int sb = (int)frand(0, (float)nb - 0.01f);
            for (int j = 0; j < 32; j++) x[sb * 32 + j] = (float)(j - 16) * 0.5f;
            x[sb * 32] = 127.0f;
            int kind = trial % 5, at = (int)frand(0, (float)nb - 0.01f);
            float *xb = x + at * 32;
            if (kind == 0) memset(xb, 0, 32 * sizeof(float));
            if (kind == 1) xb[7] = NAN;
            if (kind == 2) xb[31] = -INFINITY;
            if (kind == 3) memset(xb, 0, 32 * sizeof(float)), xb[3] = 1e-39f;
            zi_q8_act qa[2];
            for (int r = 0; r < 2; r++) {
                qa[r] = (zi_q8_act){q[r], d[r], sv[r], nb, 0, NULL};
                memset(q[r], 0x55, 2 * COLS);
                (r ? k : ref)->quantize_act(x, &qa[r], 0);
            }
            assert_memory_equal(q[0], q[1], (size_t)nb * 64);
            assert_memory_equal(d[0], d[1], (size_t)nb * sizeof(float));
            assert_memory_equal(sv[0], sv[1], (size_t)nb * sizeof(float));
            if (kind >= 1 && kind <= 3) { /* NaN, inf, subnormal: zeros */
                assert_true(d[1][at] == 0.0f && sv[1][at] == 0.0f);
                for (int j = 0; j < 32; j++)
                    assert_true(q[1][at * 32 + j] == 0 && q[1][nb * 32 + at * 32 + j] == 0);
            }
        }
    }
    assert_true(ran >= 1 || !zi_cpu_kernels_by_name("avx2"));
    free(x);
    for (int r = 0; r < 2; r++) free(q[r]), free(d[r]), free(sv[r]);
}

/* Checks one table's product for one weight type against a double-precision
 * reference computed from dequantized weights and dequantized activations
 * (so the only difference allowed is float summation order). int8: the
 * activations without their residual (act_bits 8: zi_act_drop_residual). */
static void check_type(const zi_cpu_kernels *k, int type, int cols, int T, int int8) {
    const int rows = 37;
    size_t rb;
    uint8_t *w = make_rows(type, rows, cols, &rb);
    float *x = malloc(sizeof(float) * T * cols), *y = malloc(sizeof(float) * T * rows);
    float *xd = malloc(sizeof(float) * T * cols), *wd = malloc(sizeof(float) * cols);
    for (int i = 0; i < T * cols; i++) x[i] = frand(-2, 2);
    int quantized = type == ZI_TYPE_Q4_0 || type == ZI_TYPE_Q4_1 || type == ZI_TYPE_Q8_0;
    const int nb = cols / 32;
    zi_q8_act qa = {malloc((size_t)T * cols * 2 + 64), malloc(sizeof(float) * T * nb),
                    malloc(sizeof(float) * T * nb), nb, int8, NULL};
    zi_q8_act *q = &qa;
    if (quantized) {
        for (int t = 0; t < T; t++) {
            k->quantize_act(x + t * cols, q, t);
            if (int8) {
                zi_act_drop_residual(q, t);
                for (int i = 0; i < cols; i++) assert_int_equal(qa.q[t * cols * 2 + cols + i], 0);
            }
        }
        for (int t = 0; t < T; t++)
            for (int i = 0; i < cols; i++)
                xd[t * cols + i] = (256 * qa.q[t * cols * 2 + i] + qa.q[t * cols * 2 + cols + i]) *
                                   qa.d[t * nb + i / 32];
    } else {
        memcpy(xd, x, sizeof(float) * T * cols);
    }
    /* Split the rows in two ranges to exercise r0/r1. */
    switch (type) {
    case ZI_TYPE_Q4_0:
        k->mm_q4_0(w, rb, 0, 20, q, T, y, rows);
        k->mm_q4_0(w, rb, 20, rows, q, T, y, rows);
        break;
    case ZI_TYPE_Q4_1:
        k->mm_q4_1(w, rb, 0, 20, q, T, y, rows);
        k->mm_q4_1(w, rb, 20, rows, q, T, y, rows);
        break;
    case ZI_TYPE_Q8_0:
        k->mm_q8_0(w, rb, 0, 20, q, T, y, rows);
        k->mm_q8_0(w, rb, 20, rows, q, T, y, rows);
        break;
    case ZI_TYPE_F32: k->mm_f32(w, rb, 0, rows, x, cols, T, y, rows); break;
    case ZI_TYPE_F16: k->mm_f16(w, rb, 0, rows, x, cols, T, y, rows); break;
    case ZI_TYPE_BF16: k->mm_bf16(w, rb, 0, rows, x, cols, T, y, rows); break;
    }
    for (int r = 0; r < rows; r++) {
        zi_dequantize_row(type, w + rb * r, wd, cols);
        for (int t = 0; t < T; t++) {
            double ref = 0, mag = 0;
            for (int i = 0; i < cols; i++) {
                ref += (double)wd[i] * xd[t * cols + i];
                mag += fabs((double)wd[i] * xd[t * cols + i]);
            }
            double got = y[t * rows + r];
            if (fabs(got - ref) > 1e-5 * mag + 1e-6)
                fail_msg("%s type %s row %d token %d: got %.9g want %.9g", k->isa,
                         zi_ggml_type_name(type), r, t, got, ref);
        }
    }
    if (quantized && k->mm_r16) {
        /* The 16-row layout: the first 32 rows repacked give the same
         * products, batched and one token at a time. */
        const int rr = 32;
        uint8_t *w2 = malloc(rb * rr);
        zi_r16_repack(type, w, w2, rr, nb, rb);
        float *y2 = malloc(sizeof(float) * T * rr), *y1 = malloc(sizeof(float) * T * rr);
        k->mm_r16(type, w2, rb, 0, 16, &qa, T, y2, rr); /* in two row ranges */
        k->mm_r16(type, w2, rb, 16, rr, &qa, T, y2, rr);
        for (int t = 0; t < T; t++) {
            zi_q8_act one = qa;
            one.q = qa.q + (size_t)t * cols * 2;
            one.d = qa.d + t * nb;
            one.s = qa.s + t * nb;
            k->mm_r16(type, w2, rb, 0, rr, &one, 1, y1 + t * rr, rr);
        }
        assert_memory_equal(y1, y2, sizeof(float) * T * rr);
        for (int t = 0; t < T; t++)
            for (int r = 0; r < rr; r++)
                if (fabsf(y2[t * rr + r] - y[t * rows + r]) > 1e-4f * (fabsf(y[t * rows + r]) + 1.0f))
                    fail_msg("%s r16 %s: token %d row %d: %.9g vs %.9g", k->isa,
                             zi_ggml_type_name(type), t, r, y2[t * rr + r], y[t * rows + r]);
        free(w2);
        free(y1);
        free(y2);
    }
    if (quantized) {
        /* Each token alone must give bit-identical results to the batch
         * (a token's logits never depend on its batch neighbours). */
        float *y1 = malloc(sizeof(float) * rows);
        for (int t = 0; t < T; t++) {
            zi_q8_act one = qa;
            one.q = qa.q + (size_t)t * cols * 2;
            one.d = qa.d + t * nb;
            one.s = qa.s + t * nb;
            if (type == ZI_TYPE_Q4_0) k->mm_q4_0(w, rb, 0, rows, &one, 1, y1, rows);
            if (type == ZI_TYPE_Q4_1) k->mm_q4_1(w, rb, 0, rows, &one, 1, y1, rows);
            if (type == ZI_TYPE_Q8_0) k->mm_q8_0(w, rb, 0, rows, &one, 1, y1, rows);
            if (memcmp(y1, y + t * rows, sizeof(float) * rows) != 0)
                fail_msg("%s type %s token %d: alone differs from batched", k->isa,
                         zi_ggml_type_name(type), t);
        }
        free(y1);
    }
    free(w);
    free(x);
    free(y);
    free(xd);
    free(wd);
    free(qa.q);
    free(qa.d);
    free(qa.s);
}

static void test_tables_match_reference(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    int types[] = {ZI_TYPE_Q4_0, ZI_TYPE_Q4_1, ZI_TYPE_Q8_0,
                   ZI_TYPE_F32,  ZI_TYPE_F16,  ZI_TYPE_BF16};
    int ran = 0;
    for (size_t i = 0; i < 3; i++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[i]);
        if (!k) continue; /* this CPU lacks the instruction set */
        ran++;
        for (size_t j = 0; j < sizeof types / sizeof types[0]; j++) {
            /* 6 tokens = 4 + 2: the four-token path and the remainder */
            check_type(k, types[j], 576, 6, 0); /* even block count */
            check_type(k, types[j], 608, 6, 0); /* odd: exercises the one-block tail */
            /* The AVX2 16-row kernel decodes 32 Q4 (16 Q8_0) block columns
             * at a time and runs tokens in passes of 64: cross both. */
            if (j < 3) check_type(k, types[j], 1088, 67, 0);
            /* int8 activations (act_bits 8), which the AVX2 16-row kernel
             * runs without the residual's products */
            if (j < 3) check_type(k, types[j], 608, 6, 1);
            if (j < 3) check_type(k, types[j], 1088, 67, 1);
            /* The AMX driver: block columns in windows of 64 (73 = 64 + 9)
             * and tokens in passes of 32 chunks of 8 (260 = 32 x 8 + 4, the
             * last chunk overlapping the one before). */
            if (j < 3 && k->amx && k->amx()) check_type(k, types[j], 2336, 260, 0);
        }
    }
    assert_true(ran >= 1);
}

static void test_dot_axpy(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    float a[67], b[67], y[67];
    for (int i = 0; i < 67; i++) a[i] = frand(-1, 1), b[i] = frand(-1, 1);
    double ref = 0;
    for (int i = 0; i < 67; i++) ref += (double)a[i] * b[i];
    for (size_t i = 0; i < 3; i++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[i]);
        if (!k) continue;
        assert_true(fabs(k->dot(a, b, 67) - ref) < 1e-5);
        memcpy(y, b, sizeof y);
        k->axpy(y, 0.5f, a, 67);
        k->scale(y, 2.0f, 67);
        for (int j = 0; j < 67; j++) assert_true(fabsf(y[j] - (2 * b[j] + a[j])) < 1e-6f);
    }
}

static void count_worker(void *ctx, int ith, int nth) {
    int *hits = ctx;
    assert_true(ith >= 0 && ith < nth);
    __atomic_add_fetch(&hits[ith], 1, __ATOMIC_RELAXED);
}

static void test_threadpool(void **state) {
    (void)state;
    zi_pool *p = zi_pool_create(3);
    assert_non_null(p);
    int hits[3] = {0};
    for (int i = 0; i < 1000; i++) zi_pool_run(p, count_worker, hits);
    for (int i = 0; i < 3; i++) assert_int_equal(hits[i], 1000);
    zi_pool_free(p);
}

/* The backend's threaded matmul must equal a single-threaded one exactly
 * (rows are split, never the sum within a row). */
static void test_backend_threads_agree(void **state) {
    (void)state;
    const int rows = 301, cols = 1536, T = 5;
    size_t rb;
    uint8_t *w = make_rows(ZI_TYPE_Q4_1, rows, cols, &rb);
    zi_gguf_tensor t = {.n_dims = 2, .ne = {cols, rows, 1, 1}, .type = ZI_TYPE_Q4_1,
                        .nbytes = rb * rows, .data = w};
    t.name.ptr = "w";
    t.name.len = 1;
    float *x = malloc(sizeof(float) * T * cols), *y1 = malloc(sizeof(float) * T * rows),
          *y3 = malloc(sizeof(float) * T * rows);
    for (int i = 0; i < T * cols; i++) x[i] = frand(-1, 1);
    zi_error err = {0};
    zi_backend *b1, *b3;
    zi_cpu_options o1 = {.n_threads = 1}, o3 = {.n_threads = 3};
    assert_int_equal(zi_cpu_backend_create(&o1, &b1, &err), ZI_OK);
    assert_int_equal(zi_cpu_backend_create(&o3, &b3, &err), ZI_OK);
    zi_weight w1, w3;
    assert_int_equal(b1->ops->weight_init(b1, &w1, &t, &err), ZI_OK);
    assert_int_equal(b3->ops->weight_init(b3, &w3, &t, &err), ZI_OK);
    assert_int_equal(b1->ops->reserve(b1, T, cols, 16, &err), ZI_OK);
    assert_int_equal(b3->ops->reserve(b3, T, cols, 16, &err), ZI_OK);
    b1->ops->matmul(b1, y1, &w1, x, T);
    b3->ops->matmul(b3, y3, &w3, x, T);
    assert_memory_equal(y1, y3, sizeof(float) * T * rows);
    /* matmul_n: two products of one input in one job equal two matmuls. */
    float *ya = malloc(sizeof(float) * T * rows), *yb = malloc(sizeof(float) * T * rows);
    float *ys[2] = {ya, yb};
    const zi_weight *ws[2] = {&w3, &w3};
    b3->ops->matmul_n(b3, 2, ys, ws, x, T);
    assert_memory_equal(y1, ya, sizeof(float) * T * rows);
    assert_memory_equal(y1, yb, sizeof(float) * T * rows);
    free(ya);
    free(yb);
    b1->ops->weight_free(b1, &w1); /* the repacked copy, on VNNI machines */
    b3->ops->weight_free(b3, &w3);
    zi_backend_free(b1);
    zi_backend_free(b3);
    free(w);
    free(x);
    free(y1);
    free(y3);
}

/* act_bits 8 through the backend: the same products with 1 and 3 threads,
 * and not those of act_bits 16 (the residual was dropped); other values
 * are refused by name. */
static void test_backend_act_bits(void **state) {
    (void)state;
    const int rows = 301, cols = 1536, T = 5;
    size_t rb;
    uint8_t *w = make_rows(ZI_TYPE_Q4_1, rows, cols, &rb);
    zi_gguf_tensor t = {.n_dims = 2,
                        .ne = {cols, rows, 1, 1},
                        .type = ZI_TYPE_Q4_1,
                        .nbytes = rb * rows,
                        .data = w};
    t.name.ptr = "w";
    t.name.len = 1;
    float *x = malloc(sizeof(float) * T * cols), *y[3];
    for (int i = 0; i < T * cols; i++) x[i] = frand(-1, 1);
    zi_error err = {0};
    zi_cpu_options o[3] = {{.n_threads = 1, .act_bits = 8},
                           {.n_threads = 3, .act_bits = 8},
                           {.n_threads = 1, .act_bits = 16}};
    for (int b = 0; b < 3; b++) {
        zi_backend *be;
        zi_weight wt;
        assert_int_equal(zi_cpu_backend_create(&o[b], &be, &err), ZI_OK);
        assert_int_equal(zi_cpu_backend_act_bits(be), o[b].act_bits);
        assert_int_equal(be->ops->weight_init(be, &wt, &t, &err), ZI_OK);
        assert_int_equal(be->ops->reserve(be, T, cols, 16, &err), ZI_OK);
        y[b] = malloc(sizeof(float) * T * rows);
        be->ops->matmul(be, y[b], &wt, x, T);
        be->ops->weight_free(be, &wt);
        zi_backend_free(be);
    }
    assert_memory_equal(y[0], y[1], sizeof(float) * T * rows);
    double diff = 0, mag = 0;
    for (int i = 0; i < T * rows; i++) {
        diff += fabs((double)y[0][i] - y[2][i]);
        mag += fabs((double)y[2][i]);
    }
    /* int8 codes move a product by ~1/254 of its terms' size at most, so
     * the mean change is small beside the values but not zero */
    assert_true(diff > 0 && diff < 0.05 * mag);
    zi_backend *be;
    zi_cpu_options bad = {.act_bits = 12};
    assert_int_equal(zi_cpu_backend_create(&bad, &be, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "--act-bits 12"));
    for (int b = 0; b < 3; b++) free(y[b]);
    free(x);
    free(w);
}

/* Attention through the backend: kv_store writes float K and V rows into a
 * paged cache (int16 K rows with a scale, float16 V: cpu_backend.c), and
 * attention reads them back, for every table, head size 64 (the AVX-512
 * fast path) and 32 (the generic loop), GQA groups of 3, block sizes 16 and
 * 5 with the blocks out of order, and 1-70 positions. The result must agree
 * with softmax(q . K * scale) V in double on the unrounded K and V within
 * the cache's rounding, and with 1 and 2 threads bit for bit. */
static void test_attention_paged_cache(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    const int heads = 6, kvh = 2, npos = 70;
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zi_cpu_kernels_by_name(isas[ii])) continue;
        for (int hd = 32; hd <= 64; hd += hd == 32 ? 8 : 24) /* 32, 40, 64 */
            for (int bs = 5; bs <= 16; bs += 11) {
                const int nblk = (npos + bs - 1) / bs + 1, kvd = kvh * hd;
                float *k = malloc(sizeof(float) * npos * kvd),
                      *v = malloc(sizeof(float) * npos * kvd);
                float *q = malloc(sizeof(float) * heads * hd);
                float *out[2] = {malloc(sizeof(float) * heads * hd),
                                 malloc(sizeof(float) * heads * hd)};
                for (int i = 0; i < npos * kvd; i++) k[i] = frand(-2, 2), v[i] = frand(-1, 1);
                for (int i = 0; i < heads * hd; i++) q[i] = frand(-1, 1);
                int32_t table[32], pos[70], seq[70];
                for (int b = 0; b < nblk; b++) table[b] = nblk - 1 - b; /* reversed */
                for (int t = 0; t < npos; t++) pos[t] = t, seq[t] = 0;
                for (int nt = 1; nt <= 2; nt++) {
                    zi_backend *be = NULL;
                    zi_error err = {0};
                    zi_cpu_options o = {.n_threads = nt, .isa = isas[ii]};
                    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
                    assert_int_equal(be->ops->reserve(be, npos, kvd, npos, &err), ZI_OK);
                    size_t rows = (size_t)nblk * bs * kvh;
                    void *kc = calloc(1, rows * ((size_t)hd * be->kv_k_bytes + be->kv_k_row_extra));
                    void *vc = calloc(1, rows * (size_t)hd * be->kv_v_bytes);
                    zi_attn_shape sh = {heads, kvh, hd, bs, npos, 1.0f / sqrtf((float)hd), 0, 0, NULL, 0, 0};
                    zi_batch_view all = {npos, pos, seq, table, 32, NULL};
                    be->ops->kv_store(be, kc, vc, k, v, &all, &sh);
                    for (int n = 1; n <= npos; n += 23) { /* the token at n - 1 */
                        zi_batch_view one = {1, &pos[n - 1], seq, table, 32, NULL};
                        be->ops->attention(be, out[nt - 1], q, kc, vc, &one, &sh);
                        for (int h = 0; h < heads; h++) {
                            const int g = h / (heads / kvh);
                            double w[70], sum = 0, mx = -1e300;
                            for (int j = 0; j < n; j++) {
                                double d = 0;
                                for (int i = 0; i < hd; i++)
                                    d += (double)q[h * hd + i] * k[j * kvd + g * hd + i];
                                w[j] = d * sh.scale;
                                mx = w[j] > mx ? w[j] : mx;
                            }
                            for (int j = 0; j < n; j++) sum += w[j] = exp(w[j] - mx);
                            for (int i = 0; i < hd; i++) {
                                double r = 0;
                                for (int j = 0; j < n; j++)
                                    r += w[j] / sum * v[j * kvd + g * hd + i];
                                assert_true(fabs(out[nt - 1][h * hd + i] - r) < 2e-3);
                            }
                        }
                    }
                    zi_backend_free(be);
                    free(kc);
                    free(vc);
                }
                /* the last n of both thread counts */
                assert_memory_equal(out[0], out[1], sizeof(float) * heads * hd);
                free(k), free(v), free(q), free(out[0]), free(out[1]);
            }
    }
}

/* A prompt's tokens attend in blocks (attend_block): each token's output
 * must be bit for bit what it gets alone, for every table, head sizes 64,
 * 128 and 256 (the AVX-512 block kernel) and 40 (token by token), GQA
 * groups of 1, 3 and 8, cache blocks of 16 and 5 (out of order), two
 * sequences whose tokens alternate in runs, with and without soft-capping
 * and a sliding window, on 1 and 2 threads. */
static void test_attention_blocks(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    const int npos = 77, kvh = 2;
    const int hds[] = {64, 128, 256, 40}, groups[] = {1, 3, 8};
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zi_cpu_kernels_by_name(isas[ii])) continue;
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t gi = 0; gi < 3; gi++)
                for (int variant = 0; variant < 3; variant++) {
                    const int hd = hds[hi], heads = kvh * groups[gi], bs = variant == 1 ? 5 : 16;
                    const int kvd = kvh * hd, nblk = (npos + bs - 1) / bs + 1;
                    const int n_tok = 2 * npos; /* two sequences */
                    float *k = malloc(sizeof(float) * n_tok * kvd),
                          *v = malloc(sizeof(float) * n_tok * kvd);
                    float *q = malloc(sizeof(float) * n_tok * heads * hd);
                    float *out = malloc(sizeof(float) * n_tok * heads * hd);
                    float *one = malloc(sizeof(float) * heads * hd);
                    for (int i = 0; i < n_tok * kvd; i++) k[i] = frand(-2, 2), v[i] = frand(-1, 1);
                    for (int i = 0; i < n_tok * heads * hd; i++) q[i] = frand(-1, 1);
                    int32_t table[2 * 32], pos[2 * 77], seq[2 * 77];
                    for (int b = 0; b < nblk; b++) table[b] = 2 * nblk - 1 - b, table[32 + b] = b;
                    /* runs of 1-20 tokens of each sequence in turn */
                    for (int t = 0, p0 = 0, p1 = 0, r = 0; t < n_tok; r++)
                        for (int len = 1 + (r * 7) % 20; len > 0 && t < n_tok; len--, t++) {
                            int sq = (r % 2 == 0 && p0 < npos) || p1 >= npos ? 0 : 1;
                            seq[t] = sq, pos[t] = sq ? p1++ : p0++;
                        }
                    for (int nt = 1; nt <= 2; nt++) {
                        zi_backend *be = NULL;
                        zi_error err = {0};
                        zi_cpu_options o = {.n_threads = nt, .isa = isas[ii]};
                        assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
                        assert_int_equal(be->ops->reserve(be, n_tok, kvd, npos, &err), ZI_OK);
                        size_t rows = (size_t)2 * nblk * bs * kvh;
                        void *kc =
                            calloc(1, rows * ((size_t)hd * be->kv_k_bytes + be->kv_k_row_extra));
                        void *vc = calloc(1, rows * (size_t)hd * be->kv_v_bytes);
                        zi_attn_shape sh = {.n_heads = heads,
                                            .n_kv_heads = kvh,
                                            .head_dim = hd,
                                            .block_size = bs,
                                            .max_ctx = npos,
                                            .scale = 1.0f / sqrtf((float)hd),
                                            .window = variant == 2 ? 40 : 0,
                                            .softcap = variant == 2 ? 3.0f : 0.0f};
                        zi_batch_view all = {n_tok, pos, seq, table, 32, NULL};
                        be->ops->kv_store(be, kc, vc, k, v, &all, &sh);
                        be->ops->attention(be, out, q, kc, vc, &all, &sh);
                        for (int t = 0; t < n_tok; t++) {
                            zi_batch_view bt = {1, &pos[t], &seq[t], table, 32, NULL};
                            be->ops->attention(be, one, q + (size_t)t * heads * hd, kc, vc, &bt,
                                               &sh);
                            if (memcmp(one, out + (size_t)t * heads * hd,
                                       sizeof(float) * heads * hd) != 0)
                                fail_msg("%s hd %d G %d variant %d threads %d: token %d (seq %d "
                                         "pos %d) differs from alone",
                                         isas[ii], hd, groups[gi], variant, nt, t, seq[t], pos[t]);
                        }
                        zi_backend_free(be);
                        free(kc);
                        free(vc);
                    }
                    free(k), free(v), free(q), free(out), free(one);
                }
    }
}

/* SwiGLU in every table gives the scalar loop's bits (the vector tables
 * reimplement glibc's expf): values across expf's range, its overflow and
 * underflow edges, infinities and a NaN, with a tail shorter than a vector. */
static void test_swiglu_tables_agree(void **state) {
    (void)state;
    enum { N = 4099 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        g[i] = i < 4000 ? frand(-30, 30) * (i % 7 == 0 ? 4.0f : 1.0f) : frand(-120, 120);
        u[i] = frand(-3, 3);
    }
    g[0] = INFINITY, g[1] = -INFINITY, g[2] = NAN, g[3] = 88.72f, g[4] = -88.73f, g[5] = -103.9f;
    for (int i = 0; i < N; i++) want[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    const char *isas[] = {"scalar", "avx2", "avx512"};
    for (int t = 0; t < 3; t++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
        if (!k) continue;
        k->swiglu(got, g, u, N);
        for (int i = 0; i < N; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s swiglu(%.9g, %.9g) = %.9g, want %.9g", isas[t], g[i], u[i], got[i],
                         want[i]);
    }
    free(g);
    free(u);
    free(want);
    free(got);
}

/* lora_down and lora_up (a LoRA term, backend.h's lora) in every table,
 * float32 and float16 A and B, against double: ranks 1, 8 and 11 (a
 * second group of rows) over lengths with and without an 8-lane tail. */
static void test_lora_tables_match_reference(void **state) {
    (void)state;
    enum { N = 203, R = 11 };
    float *a = malloc(sizeof(float) * R * N), *x = malloc(sizeof(float) * N);
    uint16_t *ah = malloc(sizeof(uint16_t) * R * N);
    for (int i = 0; i < R * N; i++) {
        ah[i] = zi_f32_to_f16(frand(-1, 1));
        a[i] = zi_f16_to_f32(ah[i]); /* the same values in both types */
    }
    for (int i = 0; i < N; i++) x[i] = frand(-2, 2);
    const char *isas[] = {"scalar", "avx2", "avx512"};
    const int ranks[] = {1, 8, 11}, lens[] = {8, 203};
    for (int t = 0; t < 3; t++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
        if (!k) continue;
        for (int ri = 0; ri < 3; ri++)
            for (int li = 0; li < 2; li++)
                for (int f16 = 0; f16 < 2; f16++) {
                    const int rank = ranks[ri], n = lens[li];
                    float c[R], y[N], y0[N];
                    /* A as rank rows of n (the first rank * n values) */
                    k->lora_down(c, f16 ? (const void *)ah : (const void *)a, x, rank, n, f16);
                    for (int r = 0; r < rank; r++) {
                        double want = 0, mag = 0;
                        for (int i = 0; i < n; i++)
                            want += (double)a[r * n + i] * x[i], mag += fabs(a[r * n + i] * x[i]);
                        if (fabs(c[r] - want) > 1e-6 * mag + 1e-7)
                            fail_msg("%s lora_down rank %d n %d f16 %d row %d: %.9g, want %.9g",
                                     isas[t], rank, n, f16, r, c[r], want);
                    }
                    /* B transposed as rank rows of n outputs */
                    for (int i = 0; i < n; i++) y[i] = y0[i] = frand(-1, 1);
                    k->lora_up(y, c, f16 ? (const void *)ah : (const void *)a, rank, n, f16);
                    for (int i = 0; i < n; i++) {
                        double want = y0[i], mag = fabs(y0[i]);
                        for (int r = 0; r < rank; r++)
                            want += (double)c[r] * a[r * n + i], mag += fabs(c[r] * a[r * n + i]);
                        if (fabs(y[i] - want) > 1e-6 * mag + 1e-7)
                            fail_msg("%s lora_up rank %d n %d f16 %d out %d: %.9g, want %.9g",
                                     isas[t], rank, n, f16, i, y[i], want);
                    }
                }
    }
    free(a);
    free(ah);
    free(x);
}

/* silu, sigmoid_mul, delta_rule and ssm_run give the same bits in every table
 * (the scalar one with fmaf): silu and sigmoid_mul against the scalar
 * loop; delta_rule's outputs and state after 5 tokens, one a call or all
 * in one run, for head sizes that take every column block and tail (16,
 * 40, 72, 136). */
static void test_recurrent_tables_agree(void **state) {
    (void)state;
    enum { N = 1029, T = 5 };
    float g[N], y0[N], want[N], got[N];
    for (int i = 0; i < N; i++) g[i] = frand(-30, 30), y0[i] = frand(-3, 3);
    g[0] = INFINITY, g[1] = -INFINITY, g[2] = -103.9f;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < N; i++) want[i] = g[i] / (1.0f + expf(-g[i]));
    for (int t = 0; t < 3; t++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
        if (!k) continue;
        memcpy(got, g, sizeof got);
        k->silu(got, N);
        for (int i = 2; i < N; i++) /* silu(+-inf) is NaN in both */
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s silu(%.9g) = %.9g, want %.9g", isas[t], g[i], got[i], want[i]);
        memcpy(got, y0, sizeof got);
        k->sigmoid_mul(got, g, N);
        for (int i = 0; i < N; i++) {
            const float w = y0[i] / (1.0f + expf(-g[i]));
            if (memcmp(&got[i], &w, sizeof(float)) != 0)
                fail_msg("%s sigmoid_mul(%.9g, %.9g) = %.9g, want %.9g", isas[t], y0[i], g[i],
                         got[i], w);
        }
    }
    const int ds[] = {16, 40, 72, 136};
    for (int di = 0; di < 4; di++) {
        const int d = ds[di];
        float *kq = malloc(sizeof(float) * T * 2 * d), *v = malloc(sizeof(float) * T * 3 * d);
        float *S0 = malloc(sizeof(float) * d * d), *S = malloc(sizeof(float) * d * d);
        float *Sw = malloc(sizeof(float) * d * d), *o = malloc(sizeof(float) * T * d);
        float *ow = malloc(sizeof(float) * T * d), beta[T], decay[T];
        for (int i = 0; i < T * 2 * d; i++) kq[i] = frand(-1, 1) / sqrtf((float)d);
        for (int i = 0; i < T * 3 * d; i++) v[i] = frand(-1, 1);
        for (int i = 0; i < d * d; i++) S0[i] = frand(-1, 1);
        for (int t = 0; t < T; t++) beta[t] = frand(0.05f, 0.95f), decay[t] = frand(0.3f, 1.0f);
        const float *kk = kq, *qq = kq + T * d; /* rows t of each; v rows 3d apart */
        int have_want = 0;
        for (int t = 0; t < 3; t++) {
            const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
            if (!k) continue;
            for (int run = 1; run <= T; run += T - 1) { /* one token a call, then all at once */
                float *Sd = have_want ? S : Sw, *od = have_want ? o : ow;
                memcpy(Sd, S0, sizeof(float) * d * d);
                for (int t0 = 0; t0 < T; t0 += run)
                    k->delta_rule(Sd, d, run, kk + t0 * d, qq + t0 * d, v + t0 * 3 * d, 3 * d,
                                  beta + t0, decay + t0, od + t0 * d, d);
                if (have_want &&
                    (memcmp(o, ow, sizeof(float) * T * d) || memcmp(S, Sw, sizeof(float) * d * d)))
                    fail_msg("%s delta_rule d=%d, runs of %d, differs from the scalar table's "
                             "runs of 1",
                             isas[t], d, run);
                have_want = 1;
            }
        }
        free(kq), free(v), free(S0), free(S), free(Sw), free(o), free(ow);
    }
    /* ssm_run: the same, for column counts that take every block and tail */
    const int ps[] = {8, 24, 72, 136};
    enum { NS = 19 };
    for (int pi = 0; pi < 4; pi++) {
        const int P = ps[pi];
        float *x = malloc(sizeof(float) * T * 2 * P), *bc = malloc(sizeof(float) * T * 3 * NS);
        float *S0 = malloc(sizeof(float) * NS * P), *S = malloc(sizeof(float) * NS * P);
        float *Sw = malloc(sizeof(float) * NS * P), *o = malloc(sizeof(float) * T * P);
        float *ow = malloc(sizeof(float) * T * P), dt[T], dA[T];
        for (int i = 0; i < T * 2 * P; i++) x[i] = frand(-1, 1);
        for (int i = 0; i < T * 3 * NS; i++) bc[i] = frand(-1, 1);
        for (int i = 0; i < NS * P; i++) S0[i] = frand(-1, 1);
        for (int t = 0; t < T; t++) dt[t] = frand(0.01f, 3.0f), dA[t] = frand(0.1f, 1.0f);
        int have_want = 0;
        for (int t = 0; t < 3; t++) {
            const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
            if (!k) continue;
            for (int run = 1; run <= T; run += T - 1) {
                float *Sd = have_want ? S : Sw, *od = have_want ? o : ow;
                memcpy(Sd, S0, sizeof(float) * NS * P);
                for (int t0 = 0; t0 < T; t0 += run) /* x rows 2P apart, B and C 3 NS */
                    k->ssm_run(Sd, P, NS, run, x + t0 * 2 * P, 2 * P, bc + t0 * 3 * NS,
                               bc + t0 * 3 * NS + NS, 3 * NS, dt + t0, dA + t0, od + t0 * P, P);
                if (have_want &&
                    (memcmp(o, ow, sizeof(float) * T * P) || memcmp(S, Sw, sizeof(float) * NS * P)))
                    fail_msg("%s ssm_run P=%d, runs of %d, differs from the scalar table's "
                             "runs of 1",
                             isas[t], P, run);
                have_want = 1;
            }
        }
        free(x), free(bc), free(S0), free(S), free(Sw), free(o), free(ow);
    }
}

/* mm_f32 over a block of rows and tokens gives, bit for bit, what it gives
 * one row and one token at a time (the AVX-512 table blocks 4 rows x 2
 * tokens but keeps every product's accumulator and its order). */
static void test_mm_f32_blocks_bit_identical(void **state) {
    (void)state;
    const int shapes[][3] = {{7, 64, 5}, {16, 2048, 4}, {9, 48, 1}, {4, 32, 2}, {5, 40, 3}};
    const char *isas[] = {"scalar", "avx2", "avx512"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], cols = shapes[s][1], T = shapes[s][2];
        size_t rb;
        uint8_t *w = make_rows(ZI_TYPE_F32, rows, cols, &rb);
        float *x = malloc(sizeof(float) * (size_t)cols * T);
        float *y = malloc(sizeof(float) * (size_t)rows * T);
        float *alone = malloc(sizeof(float) * (size_t)rows);
        for (int i = 0; i < cols * T; i++) x[i] = frand(-2, 2);
        for (int t = 0; t < 3; t++) {
            const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
            if (!k) continue;
            k->mm_f32(w, rb, 0, rows, x, cols, T, y, rows);
            for (int tok = 0; tok < T; tok++)
                for (int r = 0; r < rows; r++) {
                    k->mm_f32(w, rb, r, r + 1, x + (size_t)tok * cols, cols, 1, alone, rows);
                    if (memcmp(&alone[r], &y[tok * rows + r], sizeof(float)))
                        fail_msg("%s mm_f32 %dx%dx%d: row %d token %d %.9g, alone %.9g", isas[t],
                                 rows, cols, T, r, tok, y[tok * rows + r], alone[r]);
                }
        }
        free(w);
        free(x);
        free(y);
        free(alone);
    }
}

static void test_unknown_isa_refused(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *be = NULL;
    zi_cpu_options o = {.n_threads = 1, .isa = "sse9"};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "sse9"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_roundtrip_all),
        cmocka_unit_test(test_quantize_act),
        cmocka_unit_test(test_quantize_act_tables_agree),
        cmocka_unit_test(test_tables_match_reference),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_threadpool),
        cmocka_unit_test(test_backend_threads_agree),
        cmocka_unit_test(test_backend_act_bits),
        cmocka_unit_test(test_attention_paged_cache),
        cmocka_unit_test(test_attention_blocks),
        cmocka_unit_test(test_swiglu_tables_agree),
        cmocka_unit_test(test_lora_tables_match_reference),
        cmocka_unit_test(test_recurrent_tables_agree),
        cmocka_unit_test(test_mm_f32_blocks_bit_identical),
        cmocka_unit_test(test_unknown_isa_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
