/*
 * test_dequant.c - cmocka tests for the dequantization of every GGUF tensor
 * type (kernels/cpu/dequant.c) and for the CPU backend's products of the
 * types that have no kernel of their own (they dequantize each row).
 *
 * The ground truth is tests/fixtures/dequant.bin, written by
 * scripts/ref/make_dequant_fixture.py with the Python package gguf: random,
 * edge and sub-block-pattern blocks of every type with the float32 values
 * gguf.quants.dequantize gives. zi_dequantize_row must give the same bits
 * (NaN compares equal to NaN: its sign and payload are the hardware's).
 * The products are checked against a float64 sum over the dequantized rows,
 * for every kernel table this CPU runs, with 1 and 2 threads, one token and
 * a batch, and mixed with a type that has a kernel in one matmul_n job.
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

#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "dequant.h"
#include "gguf.h"
#include "quant.h"
#include "test_rand.h"
#include "weights.h"

#define FIXTURE "tests/fixtures/dequant.bin"

/* Every type the reader accepts, the fixture's types. */
static const int ALL_TYPES[] = {ZI_TYPE_F32,  ZI_TYPE_F16,    ZI_TYPE_BF16,   ZI_TYPE_Q4_0,
                                ZI_TYPE_Q4_1, ZI_TYPE_Q5_0,   ZI_TYPE_Q5_1,   ZI_TYPE_Q8_0,
                                ZI_TYPE_Q2_K, ZI_TYPE_Q3_K,   ZI_TYPE_Q4_K,   ZI_TYPE_Q5_K,
                                ZI_TYPE_Q6_K, ZI_TYPE_IQ4_NL, ZI_TYPE_IQ4_XS, ZI_TYPE_MXFP4};
#define N_ALL (sizeof ALL_TYPES / sizeof ALL_TYPES[0])

/* The types without a matrix kernel of their own (cpu_backend.c). */
static const int SLOW_TYPES[] = {ZI_TYPE_Q5_0,   ZI_TYPE_Q5_1, ZI_TYPE_Q2_K, ZI_TYPE_Q3_K,
                                 ZI_TYPE_Q4_K,   ZI_TYPE_Q5_K, ZI_TYPE_Q6_K, ZI_TYPE_IQ4_NL,
                                 ZI_TYPE_IQ4_XS, ZI_TYPE_MXFP4};
#define N_SLOW (sizeof SLOW_TYPES / sizeof SLOW_TYPES[0])

static zi_test_rng rng = {0x5eed2020u};

/* ---- the fixture ---- */

typedef struct reader {
    const uint8_t *p, *end;
} reader;

static uint32_t rd_u32(reader *r) {
    assert_true(r->end - r->p >= 4);
    uint32_t v = (uint32_t)r->p[0] | (uint32_t)r->p[1] << 8 | (uint32_t)r->p[2] << 16 |
                 (uint32_t)r->p[3] << 24;
    r->p += 4;
    return v;
}

static const uint8_t *rd_bytes(reader *r, size_t n) {
    assert_true((size_t)(r->end - r->p) >= n);
    const uint8_t *q = r->p;
    r->p += n;
    return q;
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static int type_index(int type) {
    for (size_t i = 0; i < N_ALL; i++)
        if (ALL_TYPES[i] == type) return (int)i;
    return -1;
}

/* Every case of the fixture, bit for bit; every type has cases. */
static void test_fixture_bit_exact(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = read_file(FIXTURE, &len);
    reader r = {buf, buf + len};
    assert_memory_equal(rd_bytes(&r, 8), "ZIDQFIX1", 8);
    uint32_t n_cases = rd_u32(&r);
    int cases[N_ALL] = {0};
    long values = 0;
    for (uint32_t c = 0; c < n_cases; c++) {
        int type = (int)rd_u32(&r);
        uint32_t n = rd_u32(&r), nbytes = rd_u32(&r), llen = rd_u32(&r);
        const char *label = (const char *)rd_bytes(&r, llen);
        const uint8_t *data = rd_bytes(&r, nbytes);
        const uint8_t *want = rd_bytes(&r, (size_t)n * 4);
        int ti = type_index(type);
        if (ti < 0) fail_msg("case %.*s: type %d is not one zinfer reads", (int)llen, label, type);
        size_t be = zi_ggml_type_block_elems(type), bb = zi_ggml_type_block_bytes(type);
        assert_int_equal(n % be, 0);
        assert_int_equal(nbytes, n / be * bb);
        /* a copy of exactly the case's bytes, at an odd address: rows need
         * no alignment, and ASan sees any read past them */
        uint8_t *src = malloc(nbytes + 1);
        memcpy(src + 1, data, nbytes);
        float *got = malloc(((size_t)n + 1) * sizeof(float));
        got[n] = 12345.0f; /* canary: nothing past n is written */
        assert_int_equal(zi_dequantize_row(type, src + 1, got, n), ZI_OK);
        assert_true(got[n] == 12345.0f);
        for (uint32_t i = 0; i < n; i++) {
            float w;
            memcpy(&w, want + 4 * (size_t)i, 4); /* the fixture is little-endian, as x86 */
            uint32_t gb, wb;
            memcpy(&gb, &got[i], 4);
            memcpy(&wb, &w, 4);
            if (gb != wb && !(isnan(got[i]) && isnan(w)))
                fail_msg("%.*s: value %u is %.9g (0x%08x), gguf-py gives %.9g (0x%08x)", (int)llen,
                         label, i, got[i], gb, w, wb);
        }
        cases[ti]++;
        values += n;
        free(src);
        free(got);
    }
    assert_true(r.p == r.end);
    for (size_t i = 0; i < N_ALL; i++)
        if (cases[i] < 1)
            fail_msg("the fixture has no case of %s", zi_ggml_type_name(ALL_TYPES[i]));
    print_message("%u cases, %ld values, bit-exact\n", n_cases, values);
    free(buf);
}

/* Every type the reader accepts dequantizes; no other does, and a refused
 * type leaves the output alone. */
static void test_types_known(void **state) {
    (void)state;
    uint8_t zeros[256] = {0};
    float y[256];
    for (int t = -1; t < 64; t++) {
        size_t be = zi_ggml_type_block_elems(t);
        y[0] = 7.0f;
        int rc = zi_dequantize_row(t, zeros, y, be ? (int64_t)be : 1);
        if (be) {
            assert_int_equal(rc, ZI_OK);
            assert_true(type_index(t) >= 0);
            for (size_t i = 0; i < be; i++) assert_true(y[i] == 0.0f);
        } else {
            assert_int_equal(rc, ZI_EUNSUPPORTED);
            assert_true(y[0] == 7.0f);
        }
    }
}

/* ---- weights ---- */

static zi_gguf_tensor tensor(const char *name, int type, int64_t rows, int64_t cols,
                             const void *data) {
    size_t be = zi_ggml_type_block_elems(type), bb = zi_ggml_type_block_bytes(type);
    zi_gguf_tensor t = {
        .n_dims = 2, .ne = {cols, rows, 1, 1}, .type = (zi_ggml_type)type, .data = data};
    t.nbytes = be ? (uint64_t)(cols / (int64_t)be) * bb * (uint64_t)rows : 0;
    t.name.ptr = name;
    t.name.len = strlen(name);
    return t;
}

static uint8_t *random_rows(int type, int64_t rows, int64_t cols, size_t *row_bytes) {
    uint8_t *w = zi_test_random_blocks(&rng, type, rows, cols, row_bytes);
    assert_non_null(w);
    return w;
}

/* zi_weight_describe takes every type with whole blocks, and names the
 * tensor when it refuses one. */
static void test_weight_describe(void **state) {
    (void)state;
    static uint8_t data[4096];
    zi_error err = {0};
    zi_weight w;
    for (size_t i = 0; i < N_ALL; i++) {
        int type = ALL_TYPES[i];
        zi_gguf_tensor t = tensor("w", type, 3, 512, data);
        assert_int_equal(zi_weight_describe(&t, &w, &err), ZI_OK);
        assert_int_equal(w.type, type);
        assert_int_equal(w.rows, 3);
        assert_int_equal(w.cols, 512);
        assert_int_equal(w.row_bytes,
                         512 / zi_ggml_type_block_elems(type) * zi_ggml_type_block_bytes(type));
        assert_ptr_equal(w.data, data);
        assert_ptr_equal(w.file_data, data);
    }
    zi_gguf_tensor t = tensor("blk.0.ffn_down.weight", ZI_TYPE_Q4_K, 4, 384, data);
    assert_int_equal(zi_weight_describe(&t, &w, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "tensor 'blk.0.ffn_down.weight': row length 384 is not a "
                                 "multiple of Q4_K's block of 256");
    t = tensor("blk.1.attn_q.weight", ZI_TYPE_IQ4_NL, 4, 48, data);
    assert_int_equal(zi_weight_describe(&t, &w, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "tensor 'blk.1.attn_q.weight': row length 48 is not a "
                                 "multiple of IQ4_NL's block of 32");
    t = tensor("blk.2.ffn_up.weight", 16, 4, 256, data);
    assert_int_equal(zi_weight_describe(&t, &w, &err), ZI_EUNSUPPORTED);
    assert_string_equal(
        err.msg, "tensor 'blk.2.ffn_up.weight' has type IQ2_XXS (16), not usable as a matrix");
}

/* A 1-D weight of a block type dequantizes as a row does. */
static void test_vector_dequantize(void **state) {
    (void)state;
    size_t rb;
    uint8_t *d = random_rows(ZI_TYPE_Q6_K, 1, 512, &rb);
    zi_gguf_tensor t = tensor("output_norm.weight", ZI_TYPE_Q6_K, 1, 512, d);
    t.n_dims = 1;
    zi_error err = {0};
    float *v = zi_vector_dequantize(&t, &err), want[512];
    assert_non_null(v);
    zi_dequantize_row(ZI_TYPE_Q6_K, d, want, 512);
    assert_memory_equal(v, want, sizeof want);
    free(v);
    t.type = (zi_ggml_type)16;
    assert_null(zi_vector_dequantize(&t, &err));
    assert_int_equal(err.code, ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "tensor 'output_norm.weight' has type IQ2_XXS"));
    free(d);
}

/* ---- products through the CPU backend ---- */

/* y[t][r] against sum_i w[r][i] x[t][i] in float64 over the dequantized
 * rows: a float32 dot product of `cols` terms is within cols * 2^-24 of the
 * sum of the terms' magnitudes, and in practice far closer; 1e-5 of it
 * leaves room for the summation orders of the three kernel tables, while
 * a single misdecoded weight moves a product by ~1e-3 of it. */
static void check_product(const char *what, int type, const uint8_t *w, size_t rb, int64_t rows,
                          int64_t cols, const float *x, int T, const float *y) {
    float *row = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        zi_dequantize_row(type, w + (size_t)r * rb, row, cols);
        for (int t = 0; t < T; t++) {
            double s = 0, mag = 0;
            for (int64_t i = 0; i < cols; i++) {
                s += (double)row[i] * x[(size_t)t * cols + i];
                mag += fabs((double)row[i] * x[(size_t)t * cols + i]);
            }
            double got = y[(size_t)t * rows + r];
            if (!(fabs(got - s) <= 1e-5 * mag + 1e-30))
                fail_msg("%s %s row %lld token %d: %.9g, float64 gives %.9g (terms %.3g)", what,
                         zi_ggml_type_name(type), (long long)r, t, got, s, mag);
        }
    }
    free(row);
}

/* Every slow type, every kernel table this CPU runs, 1 and 2 threads, one
 * token and a batch of 6 (the chunked schedule): each product is the
 * dequantized rows' float64 product to float32 accuracy, and the same bits
 * for any thread count. */
static void test_backend_products(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    const int64_t rows = 40, cols = 512; /* rows not a multiple of 16 */
    const int T = 6;
    float *x = malloc(sizeof(float) * T * cols);
    for (int i = 0; i < T * cols; i++) x[i] = zi_test_frand(&rng, -1, 1);
    float *y1 = malloc(sizeof(float) * T * rows), *y2 = malloc(sizeof(float) * T * rows);
    int tables = 0;
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        if (!zi_cpu_kernels_by_name(isas[k])) continue;
        tables++;
        for (size_t ti = 0; ti < N_SLOW; ti++) {
            int type = SLOW_TYPES[ti];
            size_t rb;
            uint8_t *w = random_rows(type, rows, cols, &rb);
            zi_gguf_tensor t = tensor("blk.0.ffn_gate.weight", type, rows, cols, w);
            for (int n_tok = 1; n_tok <= T; n_tok += T - 1) {
                float *ys[2] = {y1, y2};
                for (int th = 1; th <= 2; th++) {
                    zi_cpu_options o = {.n_threads = th, .isa = isas[k]};
                    zi_backend *be;
                    zi_error err = {0};
                    zi_weight wt;
                    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
                    assert_int_equal(be->ops->weight_init(be, &wt, &t, &err), ZI_OK);
                    assert_int_equal(wt.layout, 0); /* kept as in the file */
                    assert_ptr_equal(wt.data, w);
                    assert_int_equal(be->ops->reserve(be, n_tok, cols, 16, &err), ZI_OK);
                    be->ops->matmul(be, ys[th - 1], &wt, x, n_tok);
                    be->ops->weight_free(be, &wt);
                    zi_backend_free(be);
                }
                check_product(isas[k], type, w, rb, rows, cols, x, n_tok, y1);
                assert_memory_equal(y1, y2, sizeof(float) * (size_t)n_tok * (size_t)rows);
            }
            free(w);
        }
    }
    assert_true(tables >= 1);
    free(x);
    free(y1);
    free(y2);
}

/* One matmul_n job over a Q4_K, a Q4_1 (its own kernel, quantized
 * activations) and a Q6_K weight: each output equals its own matmul's
 * bits. A narrower slow weight loaded first checks that the scratch rows
 * grow with the widest weight. */
static void test_backend_mixed_job(void **state) {
    (void)state;
    const int64_t cols = 768, T = 5;
    const int types[3] = {ZI_TYPE_Q4_K, ZI_TYPE_Q4_1, ZI_TYPE_Q6_K};
    const int64_t rows[3] = {48, 32, 20};
    zi_cpu_options o = {.n_threads = 2};
    zi_backend *be;
    zi_error err = {0};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    /* a narrower slow weight first: the scratch must grow for the next */
    size_t rb_small;
    uint8_t *small = random_rows(ZI_TYPE_Q5_0, 8, 256, &rb_small);
    zi_gguf_tensor ts = tensor("small", ZI_TYPE_Q5_0, 8, 256, small);
    zi_weight wsmall;
    assert_int_equal(be->ops->weight_init(be, &wsmall, &ts, &err), ZI_OK);
    uint8_t *data[3];
    zi_weight w[3];
    float *y[3], *ysep[3];
    size_t rb[3];
    for (int i = 0; i < 3; i++) {
        data[i] = types[i] == ZI_TYPE_Q4_1
                      ? zi_test_make_rows(&rng, types[i], (int)rows[i], (int)cols, 1.0f, &rb[i])
                      : random_rows(types[i], rows[i], cols, &rb[i]);
        zi_gguf_tensor t = tensor("w", types[i], rows[i], cols, data[i]);
        assert_int_equal(be->ops->weight_init(be, &w[i], &t, &err), ZI_OK);
        y[i] = malloc(sizeof(float) * T * rows[i]);
        ysep[i] = malloc(sizeof(float) * T * rows[i]);
    }
    assert_int_equal(be->ops->reserve(be, (int)T, cols, 16, &err), ZI_OK);
    float *x = malloc(sizeof(float) * T * cols);
    for (int i = 0; i < T * cols; i++) x[i] = zi_test_frand(&rng, -1, 1);
    const zi_weight *ws[3] = {&w[0], &w[1], &w[2]};
    be->ops->matmul_n(be, 3, y, ws, x, (int)T);
    for (int i = 0; i < 3; i++) {
        be->ops->matmul(be, ysep[i], &w[i], x, (int)T);
        assert_memory_equal(y[i], ysep[i], sizeof(float) * T * rows[i]);
        if (types[i] != ZI_TYPE_Q4_1)
            check_product("mixed", types[i], data[i], rb[i], rows[i], cols, x, (int)T, y[i]);
    }
    float xs[256], ys1[8];
    for (int i = 0; i < 256; i++) xs[i] = x[i];
    be->ops->matmul(be, ys1, &wsmall, xs, 1);
    check_product("small", ZI_TYPE_Q5_0, small, rb_small, 8, 256, xs, 1, ys1);
    for (int i = 0; i < 3; i++) {
        be->ops->weight_free(be, &w[i]);
        free(data[i]);
        free(y[i]);
        free(ysep[i]);
    }
    be->ops->weight_free(be, &wsmall);
    zi_backend_free(be);
    free(small);
    free(x);
}

/* Embedding rows of a slow type come out of get_rows dequantized exactly. */
static void test_backend_get_rows(void **state) {
    (void)state;
    const int64_t rows = 10, cols = 512;
    size_t rb;
    uint8_t *w = random_rows(ZI_TYPE_Q5_K, rows, cols, &rb);
    zi_gguf_tensor t = tensor("token_embd.weight", ZI_TYPE_Q5_K, rows, cols, w);
    zi_cpu_options o = {.n_threads = 1};
    zi_backend *be;
    zi_error err = {0};
    zi_weight wt;
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    assert_int_equal(be->ops->weight_init(be, &wt, &t, &err), ZI_OK);
    int32_t ids[3] = {9, 0, 4};
    float y[3 * 512], want[512];
    be->ops->get_rows(be, y, &wt, ids, 3);
    for (int i = 0; i < 3; i++) {
        zi_dequantize_row(ZI_TYPE_Q5_K, w + (size_t)ids[i] * rb, want, cols);
        assert_memory_equal(y + i * cols, want, sizeof want);
    }
    be->ops->weight_free(be, &wt);
    zi_backend_free(be);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_bit_exact), cmocka_unit_test(test_types_known),
        cmocka_unit_test(test_weight_describe),   cmocka_unit_test(test_vector_dequantize),
        cmocka_unit_test(test_backend_products),  cmocka_unit_test(test_backend_mixed_job),
        cmocka_unit_test(test_backend_get_rows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
