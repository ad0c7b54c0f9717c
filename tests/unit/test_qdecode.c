/*
 * test_qdecode.c - cmocka tests for kernels/qdecode.h, the sixteen-weight
 * decoders the CUDA backend's kernels are built on, compiled here as C.
 *
 * For every type the header decodes, random blocks (every code, sub-scale
 * and bit plane random; test_rand.h), and rows of bytes all random (scales
 * subnormal, infinite or NaN among them), are decoded half sub-block by
 * half sub-block and must give zi_dequantize_row's bits (which
 * tests/unit/test_dequant.c checks against gguf-py). The two halves of a
 * sub-block must cover its 32 values once. Without a GPU this is what
 * checks the device kernels' arithmetic; tests/gpu checks the kernels.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dequant.h"
#include "gguf.h"
#include "qdecode.h"
#include "test_rand.h"

typedef void (*decode_fn)(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                          int *ob);

static const struct {
    int type;
    decode_fn fn;
} CASES[] = {
    {ZI_TYPE_Q5_0, zi_qd_q5_0},     {ZI_TYPE_Q5_1, zi_qd_q5_1}, {ZI_TYPE_IQ4_NL, zi_qd_iq4_nl},
    {ZI_TYPE_MXFP4, zi_qd_mxfp4},   {ZI_TYPE_Q2_K, zi_qd_q2_k}, {ZI_TYPE_Q3_K, zi_qd_q3_k},
    {ZI_TYPE_Q4_K, zi_qd_q4_k},     {ZI_TYPE_Q5_K, zi_qd_q5_k}, {ZI_TYPE_Q6_K, zi_qd_q6_k},
    {ZI_TYPE_IQ4_XS, zi_qd_iq4_xs},
};

static zi_test_rng rng = {0x0dec0de5u};

/* The same bits, or both NaN (a NaN's payload is the hardware's). */
static int same(float a, float b) {
    return a != a ? b != b : !memcmp(&a, &b, sizeof a);
}

/* Every decoder against zi_dequantize_row on rows of `type`; any_bytes:
 * every byte random, scales too (so some are subnormal, infinite or NaN),
 * else the scales are small and finite. */
static void check_decoders(int any_bytes) {
    const int rows = 5, cols = 1024;
    for (size_t k = 0; k < sizeof CASES / sizeof CASES[0]; k++) {
        const int type = CASES[k].type;
        size_t rb;
        uint8_t *w = zi_test_random_blocks(&rng, type, rows, cols, &rb);
        assert_non_null(w);
        if (any_bytes)
            for (size_t i = 0; i < rb * (size_t)rows; i++)
                w[i] = (uint8_t)(zi_test_urand(&rng) * 256);
        float *want = malloc(sizeof(float) * cols);
        assert_non_null(want);
        for (int r = 0; r < rows; r++) {
            const uint8_t *row = w + rb * (size_t)r;
            assert_int_equal(zi_dequantize_row(type, row, want, cols), 0);
            for (int ib = 0; ib < cols / 32; ib++) {
                int seen[32] = {0};
                for (int h = 0; h < 2; h++) {
                    float wa[8], wb[8];
                    int oa = -1, ob = -1;
                    CASES[k].fn(row, ib, h, wa, wb, &oa, &ob);
                    assert_true(oa >= 0 && oa + 8 <= 32 && ob >= 0 && ob + 8 <= 32);
                    for (int i = 0; i < 8; i++) {
                        seen[oa + i]++;
                        seen[ob + i]++;
                        const float ea = want[32 * ib + oa + i], eb = want[32 * ib + ob + i];
                        if (!same(wa[i], ea) || !same(wb[i], eb))
                            fail_msg("%s row %d sub-block %d half %d value %d: %.9g %.9g, want "
                                     "%.9g %.9g",
                                     zi_ggml_type_name(type), r, ib, h, i, wa[i], wb[i], ea, eb);
                    }
                }
                for (int i = 0; i < 32; i++)
                    if (seen[i] != 1)
                        fail_msg("%s sub-block %d: value %d decoded %d times",
                                 zi_ggml_type_name(type), ib, i, seen[i]);
            }
        }
        free(want);
        free(w);
    }
}

static void test_decoders_match_dequantize_row(void **state) {
    (void)state;
    check_decoders(0);
}

static void test_decoders_match_on_any_bytes(void **state) {
    (void)state;
    check_decoders(1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decoders_match_dequantize_row),
        cmocka_unit_test(test_decoders_match_on_any_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
