/*
 * test_repack_x.c - the extended 16-row layout (kernels/cpu/repack_x.h) and
 * its kernels: the decomposition of every type into codes and per-half
 * scales is exact, and the 16-row products of the avx2 and avx512 tables
 * equal the float64 product of the dequantized weights and activations to
 * float32 accuracy, bit-identical between the two tables (and the AMX
 * tiles, where the CPU has them), for one token and for batches, with and
 * without the activations' residual. MXFP4, whose scales are powers of two
 * from an E8M0 byte, is also checked at every byte and with scales that
 * span most of float32's range.
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
#include "repack_x.h"
#include "test_rand.h"

static zi_test_rng rng = {0x7e9ac4a1u};

#define LIST_TYPE(T, P, L, H, C, F, E, Z) T,
static const int TYPES[] = {ZI_R16X_TYPES(LIST_TYPE)};
#undef LIST_TYPE
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* Checks that dw * u + cw, exactly, rounds to what zi_dequantize_row gives
 * for every value of rows x cols of w. */
static void check_decomposition(int type, const uint8_t *w, size_t rb, int rows, int cols) {
    zi_r16x_format f = {0, 0, 0, 0, 0, 0, 0.0f};
    assert_true(zi_r16x_format_of(type, &f));
    float *y = malloc(sizeof(float) * (size_t)cols);
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = w + rb * (size_t)r;
        assert_int_equal(zi_dequantize_row(type, row, y, cols), ZI_OK);
        for (int k = 0; k < cols / 32; k++) {
            uint8_t code[32];
            float dw[2], cw[2];
            assert_true(zi_r16x_decompose(type, row, k, code, dw, cw));
            if (!f.halves) assert_true(dw[0] == dw[1] && cw[0] == cw[1]);
            for (int i = 0; i < 32; i++) {
                assert_true(code[i] < (f.lut ? 16 : 16 << f.planes));
                const int u = f.lut ? zi_r16x_book(f.lut)[code[i]] : code[i];
                const double v = (double)dw[i / 16] * u + cw[i / 16];
                const float want = y[32 * k + i];
                /* The dequantizer rounds the same real number once (or,
                 * where its product rounds too, within an ulp). */
                if ((float)v != want && nextafterf((float)v, INFINITY) != want &&
                    nextafterf((float)v, -INFINITY) != want)
                    fail_msg("%s row %d value %d: %.9g * %d + %.9g = %.9g, dequantized %.9g",
                             zi_ggml_type_name(type), r, 32 * k + i, dw[i / 16], u, cw[i / 16], v,
                             want);
            }
        }
    }
    free(y);
}

/* Random blocks, then the edge cases: zero scales, and the largest f16
 * scales with every other bit set (MXFP4's: test_decompose_mxfp4). */
static void test_decompose_exact(void **state) {
    (void)state;
    const int rows = 4, cols = 1024;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int type = TYPES[ti];
        size_t rb;
        uint8_t *w = zi_test_random_blocks(&rng, type, rows, cols, &rb);
        assert_non_null(w);
        check_decomposition(type, w, rb, rows, cols);
        const size_t bb = zi_ggml_type_block_bytes(type);
        if (type == ZI_TYPE_MXFP4) {
            free(w);
            continue;
        }
        int off[2], n;
        zi_test_f16_fields(type, off, &n);
        for (int edge = 0; edge < 2; edge++) {
            memset(w, edge ? 0xff : 0x5a, rb * (size_t)rows);
            for (size_t b = 0; b < rb * (size_t)rows / bb; b++)
                for (int fi = 0; fi < n; fi++) {
                    const uint16_t h = edge ? (fi ? 0xfbff : 0x7bff) : 0; /* -+65504, or 0 */
                    memcpy(w + b * bb + off[fi], &h, 2);
                }
            check_decomposition(type, w, rb, rows, cols);
        }
        uint8_t code[32];
        float dw[2], cw[2];
        assert_int_equal(zi_r16x_decompose(ZI_TYPE_Q4_0, w, 0, code, dw, cw), 0);
        free(w);
    }
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_Q8_0), 0);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_Q4_K), 288);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_Q6_K), 416);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_IQ4_XS), 272);
    /* with the super-scales: 16 rows of 8 columns (one super-block) */
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_Q4_K, 8) * 16, 8 * 288 + 64);
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_Q6_K, 8) * 16, 8 * 416 + 32);
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_Q2_K, 16) * 16, 16 * 320 + 2 * 64);
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_Q4_K, 12), 0); /* not whole super-blocks */
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_Q5_0, 3) * 16, 3 * 16 * 22);
    /* The types with f16 scales keep the file's size. */
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_Q5_0), 16 * 22);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_Q5_1), 16 * 24);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_IQ4_NL), 16 * 18);
    assert_int_equal(zi_r16x_group_bytes(ZI_TYPE_MXFP4), 16 * 17);
    assert_int_equal(zi_r16x_row_bytes(ZI_TYPE_MXFP4, 3) * 16, 3 * 16 * 17);
}

/* MXFP4 at every E8M0 byte e, each block holding every code in both nibble
 * positions: the codes are the file's nibbles, dw is 2^(e - 128) exactly
 * (the bits ggml's ggml_e8m0_to_fp32_half gives, subnormal for e < 2), and
 * dw * u + cw is the dequantized value for every e whose cw = -12 * dw is
 * finite (e <= 252; above, the largest codes' values are infinite, and so
 * is cw: repack_x.h). */
static void test_decompose_mxfp4(void **state) {
    (void)state;
    enum { NE = 256 };
    uint8_t w[NE][17];
    for (int e = 0; e < NE; e++) {
        w[e][0] = (uint8_t)e;
        for (int j = 0; j < 16; j++) /* low nibble j + e, high j + e + 7 (mod 16) */
            w[e][1 + j] = (uint8_t)((j + e) % 16 | ((j + e + 7) % 16) << 4);
    }
    for (int e = 0; e < NE; e++) {
        uint8_t code[32];
        float dw[2], cw[2];
        assert_true(zi_r16x_decompose(ZI_TYPE_MXFP4, w[e], 0, code, dw, cw));
        for (int i = 0; i < 32; i++)
            assert_int_equal(code[i], i < 16 ? w[e][1 + i] & 15 : w[e][1 + i - 16] >> 4);
        const uint32_t want = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
        uint32_t got;
        memcpy(&got, &dw[0], 4);
        assert_int_equal(got, want);
        assert_true(dw[0] == ldexpf(1.0f, e - 128) && dw[1] == dw[0]);
        assert_true(cw[0] == -12.0f * dw[0] && cw[1] == cw[0]);
        if (e <= 252) check_decomposition(ZI_TYPE_MXFP4, w[e], 17, 1, 32);
    }
    /* The repacked column keeps each row's byte (16 rows of one block). */
    uint8_t p[16 * 17];
    zi_r16x_repack(ZI_TYPE_MXFP4, w[240], p, 16, 1, 17);
    for (int i = 0; i < 16; i++) assert_int_equal(p[256 + i], 240 + i);
}

/* One table's 16-row product of every type against float64, one token at
 * a time equal to the batch; returns the batch's outputs (T x rows). */
static float *check_products(const zi_cpu_kernels *k, int type, const uint8_t *w, size_t rb,
                             int rows, int cols, const float *x, int T, int int8) {
    const int nb = cols / 32;
    /* The batch with the half sums filled in (as the backend does), each
     * token alone without them (the kernels sum for themselves). */
    zi_q8_act qa = {malloc((size_t)T * cols * 2 + 64), malloc(sizeof(float) * T * nb),
                    malloc(sizeof(float) * T * nb), nb, int8, malloc(sizeof(float) * T * nb * 2)};
    for (int t = 0; t < T; t++) {
        k->quantize_act(x + (size_t)t * cols, &qa, t);
        if (int8) zi_act_drop_residual(&qa, t);
        zi_act_half_sums(&qa, t);
    }
    const size_t prb = zi_r16x_row_bytes(type, nb);
    uint8_t *p = malloc(prb * (size_t)rows);
    zi_r16x_repack(type, w, p, rows, nb, rb);
    float *y = malloc(sizeof(float) * (size_t)T * rows), *y1 = malloc(sizeof(float) * rows);
    k->mm_r16(type, p, prb, 0, 16, &qa, T, y, rows); /* in two row ranges */
    k->mm_r16(type, p, prb, 16, rows, &qa, T, y, rows);
    float *wd = malloc(sizeof(float) * (size_t)cols);
    for (int r = 0; r < rows; r++) {
        zi_dequantize_row(type, w + rb * (size_t)r, wd, cols);
        for (int t = 0; t < T; t++) {
            const int8_t *q1 = qa.q + (size_t)t * cols * 2, *q2 = q1 + cols;
            double ref = 0, mag = 0;
            for (int i = 0; i < cols; i++) {
                const double xv = (256.0 * q1[i] + q2[i]) * qa.d[t * nb + i / 32];
                ref += (double)wd[i] * xv;
                mag += fabs((double)wd[i] * xv);
            }
            const double got = y[t * rows + r];
            if (!(fabs(got - ref) <= 1e-5 * mag + 1e-30))
                fail_msg("%s %s%s row %d token %d: %.9g, float64 gives %.9g (terms %.3g)", k->isa,
                         zi_ggml_type_name(type), int8 ? " int8" : "", r, t, got, ref, mag);
        }
    }
    for (int t = 0; t < T; t++) {
        zi_q8_act one = qa;
        one.q = qa.q + (size_t)t * cols * 2;
        one.d = qa.d + t * nb;
        one.s = qa.s + t * nb;
        one.s16 = NULL;
        k->mm_r16(type, p, prb, 0, rows, &one, 1, y1, rows);
        if (memcmp(y1, y + (size_t)t * rows, sizeof(float) * rows) != 0)
            fail_msg("%s %s token %d: alone differs from batched", k->isa, zi_ggml_type_name(type),
                     t);
    }
    free(wd);
    free(y1);
    free(p);
    free(qa.q);
    free(qa.d);
    free(qa.s);
    free(qa.s16);
    return y;
}

/* check_products on the avx2 table and, where this CPU has it, the avx512
 * table, which must give the same bits (the same integers, the same float
 * steps). */
static void check_tables(const zi_cpu_kernels *avx2, const zi_cpu_kernels *avx512, int type,
                         const uint8_t *w, size_t rb, int rows, int cols, const float *x, int T,
                         int int8) {
    float *a = check_products(avx2, type, w, rb, rows, cols, x, T, int8);
    if (avx512) {
        float *b = check_products(avx512, type, w, rb, rows, cols, x, T, int8);
        assert_memory_equal(a, b, sizeof(float) * (size_t)T * rows);
        free(b);
    }
    free(a);
}

static void test_products(void **state) {
    (void)state;
    /* 3 super-blocks; 3 tokens (one pass of 4), 6 (one part pass of 8) and
     * 21 (passes of 8, 8 and 5): the avx512 table's loops for few and for
     * many tokens, each against the avx2 table bit for bit. */
    const int rows = 48, cols = 768, Ts[] = {3, 6, 21};
    const zi_cpu_kernels *avx2 = zi_cpu_kernels_by_name("avx2");
    const zi_cpu_kernels *avx512 = zi_cpu_kernels_by_name("avx512");
    if (!avx2) skip(); /* no 16-row kernels on this CPU */
    for (size_t ni = 0; ni < sizeof Ts / sizeof Ts[0]; ni++) {
        const int T = Ts[ni];
        float *x = malloc(sizeof(float) * T * cols);
        for (int i = 0; i < T * cols; i++) x[i] = zi_test_frand(&rng, -2, 2);
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (int int8 = 0; int8 < 2; int8++) {
                const int type = TYPES[ti];
                size_t rb;
                uint8_t *w = zi_test_random_blocks(&rng, type, rows, cols, &rb);
                check_tables(avx2, avx512, type, w, rb, rows, cols, x, T, int8);
                free(w);
            }
        free(x);
    }
}

/* On the AMX tiles (batches of 4 tokens and more on the avx512 table, where
 * the CPU has AMX): shapes that cross the driver's loops, block columns in
 * windows of 64 (72 = 64 + 8) and tokens in passes of 32 chunks of 8 (260),
 * with chunks whose last overlaps the one before (13 = 7 + 6). Each checked
 * against float64, against each token alone (on VNNI) and bit for bit
 * against the avx2 table. */
static void test_products_amx(void **state) {
    (void)state;
    const zi_cpu_kernels *avx2 = zi_cpu_kernels_by_name("avx2");
    const zi_cpu_kernels *avx512 = zi_cpu_kernels_by_name("avx512");
    if (!avx512 || !avx512->amx || !avx512->amx()) {
        print_message("no AMX-INT8 on this CPU (or not granted by the kernel): "
                      "the tile kernels are not compared here\n");
        skip();
    }
    const struct {
        int cols, T;
    } shapes[] = {{2304, 13}, {768, 260}};
    const int rows = 32;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int cols = shapes[si].cols, T = shapes[si].T;
        float *x = malloc(sizeof(float) * (size_t)T * cols);
        for (int i = 0; i < T * cols; i++) x[i] = zi_test_frand(&rng, -2, 2);
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (int int8 = 0; int8 < 2; int8++) {
                size_t rb;
                uint8_t *w = zi_test_random_blocks(&rng, TYPES[ti], rows, cols, &rb);
                float *a = check_products(avx2, TYPES[ti], w, rb, rows, cols, x, T, int8);
                float *b = check_products(avx512, TYPES[ti], w, rb, rows, cols, x, T, int8);
                assert_memory_equal(a, b, sizeof(float) * (size_t)T * rows);
                free(a);
                free(b);
                free(w);
            }
        free(x);
    }
}

/* MXFP4 with scales across most of the E8M0 range: row r >= 4's blocks
 * take bytes 40 + 4r .. 42 + 4r (2^-88 .. 2^62 times the doubled codes),
 * so each row is checked against float64 at its own magnitude; dw * da
 * stays a normal float32 there, so every product keeps float32 accuracy.
 * Rows 0-3 take bytes 0..3, whose scales are subnormal or nearly (their
 * products are as accurate as float32's subnormals allow, which the
 * float64 check's absolute 1e-30 admits): there the avx512 table's
 * vector conversion of the bytes must still give the scalar one's bits.
 * The batch runs on the AMX tiles where the CPU has them (each token alone
 * on VNNI, bit-identical), and the avx2 and avx512 tables agree bit for
 * bit. */
static void test_products_mxfp4_scales(void **state) {
    (void)state;
    const int rows = 48, cols = 768, T = 6;
    const zi_cpu_kernels *avx2 = zi_cpu_kernels_by_name("avx2");
    const zi_cpu_kernels *avx512 = zi_cpu_kernels_by_name("avx512");
    if (!avx2) skip(); /* no 16-row kernels on this CPU */
    float *x = malloc(sizeof(float) * T * cols);
    for (int i = 0; i < T * cols; i++) x[i] = zi_test_frand(&rng, -2, 2);
    size_t rb;
    uint8_t *w = zi_test_random_blocks(&rng, ZI_TYPE_MXFP4, rows, cols, &rb);
    assert_non_null(w);
    for (int r = 0; r < rows; r++)
        for (int k = 0; k < cols / 32; k++)
            w[rb * (size_t)r + 17 * (size_t)k] =
                (uint8_t)(r < 4 ? (r + k) % 4 : 40 + 4 * r + k % 3);
    for (int int8 = 0; int8 < 2; int8++) {
        check_tables(avx2, avx512, ZI_TYPE_MXFP4, w, rb, rows, cols, x, T, int8);
    }
    free(w);
    free(x);
}

/* The backend repacks these types when it has 16-row kernels and the row
 * count allows, and leaves them in the file's layout otherwise. */
static void test_backend_layout(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    size_t rb;
    uint8_t *w = zi_test_random_blocks(&rng, ZI_TYPE_Q6_K, 48, 256, &rb);
    for (size_t i = 0; i < 3; i++) {
        if (!zi_cpu_kernels_by_name(isas[i])) continue;
        for (int rows = 40; rows <= 48; rows += 8) {
            zi_cpu_options o = {.n_threads = 1, .isa = isas[i]};
            zi_backend *be;
            zi_error err = {0};
            zi_weight wt;
            zi_gguf_tensor t = {.n_dims = 2,
                                .ne = {256, rows, 1, 1},
                                .type = ZI_TYPE_Q6_K,
                                .nbytes = rb * (uint64_t)rows,
                                .data = w};
            t.name.ptr = "blk.0.ffn_down.weight";
            t.name.len = strlen(t.name.ptr);
            assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
            assert_int_equal(be->ops->weight_init(be, &wt, &t, &err), ZI_OK);
            assert_int_equal(wt.layout, i > 0 && rows % 16 == 0 ? 2 : 0);
            be->ops->weight_free(be, &wt);
            zi_backend_free(be);
        }
    }
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decompose_exact),
        cmocka_unit_test(test_decompose_mxfp4),
        cmocka_unit_test(test_products),
        cmocka_unit_test(test_products_amx),
        cmocka_unit_test(test_products_mxfp4_scales),
        cmocka_unit_test(test_backend_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
