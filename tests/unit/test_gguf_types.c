/*
 * test_gguf_types.c - cmocka tests for the GGUF reader's tensor types
 * (common/gguf.c): the table of every type ggml defines (names, block
 * geometry, which zinfer supports), the refusal of unsupported types by
 * default, and the ZI_GGUF_ANY_TYPE open option, under which such tensors
 * are kept and still checked (whole blocks, data inside the file), and a
 * type number ggml does not define is kept with its size unknown. Files are
 * built in memory with gguf_writer.h and opened from exact-size heap
 * copies, so that ASan catches any overread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"

/* ---- helpers ---------------------------------------------------------------- */

/* Opens a copy of bytes, with flags, in an exact-size heap buffer. *keep
 * receives the buffer, to free after zi_gguf_close. */
static int open_copy(const uint8_t *bytes, size_t len, unsigned flags, uint8_t **keep, zi_gguf **g,
                     zi_error *err) {
    *keep = malloc(len ? len : 1);
    assert_non_null(*keep);
    if (len) memcpy(*keep, bytes, len);
    zi_error_clear(err);
    return zi_gguf_open_memory_flags(*keep, len, flags, g, err);
}

/* b must fail to open with flags, `code` and a message containing want. */
static void expect_fail_flags(wbuf *b, unsigned flags, int code, const char *want) {
    uint8_t *keep;
    zi_gguf *g = (zi_gguf *)1;
    zi_error err;
    int rc = open_copy(b->p, b->n, flags, &keep, &g, &err);
    if (rc != code || !strstr(err.msg, want))
        fail_msg("expected %s containing \"%s\", got %s: \"%s\"", zi_status_name(code), want,
                 zi_status_name(rc), err.msg);
    assert_null(g);
    free(keep);
}

static void expect_fail(wbuf *b, int code, const char *want) {
    expect_fail_flags(b, 0, code, want);
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- the tables ------------------------------------------------------------- */

static void test_type_tables(void **state) {
    (void)state;
    assert_string_equal(zi_gguf_type_name(ZI_GGUF_UINT8), "uint8");
    assert_string_equal(zi_gguf_type_name(ZI_GGUF_FLOAT64), "float64");
    assert_string_equal(zi_gguf_type_name(ZI_GGUF_ARRAY), "array");
    assert_string_equal(zi_gguf_type_name((zi_gguf_type)13), "?");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_F32), "F32");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q4_1), "Q4_1");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q8_0), "Q8_0");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_BF16), "BF16");
    assert_string_equal(zi_ggml_type_name(6), "Q5_0");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q5_1), "Q5_1");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q2_K), "Q2_K");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q3_K), "Q3_K");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q4_K), "Q4_K");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q5_K), "Q5_K");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_Q6_K), "Q6_K");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_IQ4_NL), "IQ4_NL");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_IQ4_XS), "IQ4_XS");
    assert_string_equal(zi_ggml_type_name(ZI_TYPE_MXFP4), "MXFP4");
    assert_string_equal(zi_ggml_type_name(15), "Q8_K");
    assert_string_equal(zi_ggml_type_name(27), "I64");
    assert_string_equal(zi_ggml_type_name(4), "?");
    assert_string_equal(zi_ggml_type_name(-1), "?");
    assert_string_equal(zi_ggml_type_name(1000), "?");
    const struct {
        int t;
        size_t elems, bytes;
    } sizes[] = {{ZI_TYPE_F32, 1, 4},
                 {ZI_TYPE_F16, 1, 2},
                 {ZI_TYPE_BF16, 1, 2},
                 {ZI_TYPE_Q4_0, 32, 18},
                 {ZI_TYPE_Q4_1, 32, 20},
                 {ZI_TYPE_Q8_0, 32, 34},
                 {ZI_TYPE_Q5_0, 32, 22},
                 {ZI_TYPE_Q5_1, 32, 24},
                 {ZI_TYPE_Q2_K, 256, 84},
                 {ZI_TYPE_Q3_K, 256, 110},
                 {ZI_TYPE_Q4_K, 256, 144},
                 {ZI_TYPE_Q5_K, 256, 176},
                 {ZI_TYPE_Q6_K, 256, 210},
                 {ZI_TYPE_IQ4_NL, 32, 18},
                 {ZI_TYPE_IQ4_XS, 256, 136},
                 {ZI_TYPE_MXFP4, 32, 17},
                 {9, 0, 0},  /* Q8_1 */
                 {15, 0, 0}, /* Q8_K */
                 {16, 0, 0}, /* IQ2_XXS */
                 {4, 0, 0},
                 {-3, 0, 0}};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        assert_int_equal(zi_ggml_type_block_elems(sizes[k].t), sizes[k].elems);
        assert_int_equal(zi_ggml_type_block_bytes(sizes[k].t), sizes[k].bytes);
    }
    zi_str s = {"abc", 3};
    assert_true(zi_str_eq(s, "abc"));
    assert_false(zi_str_eq(s, "ab"));
    assert_false(zi_str_eq(s, "abcd"));
    assert_false(zi_str_eq(s, NULL));
    zi_str e = {NULL, 0};
    assert_true(zi_str_eq(e, ""));
}

static void test_unsupported_type(void **state) {
    (void)state;
    wbuf b = {0};
    uint64_t ne[1] = {256};
    one_tensor(&b, "x", 1, ne, 16, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED,
                "tensor 'x' has type IQ2_XXS (16), which zinfer does not support");
    one_tensor(&b, "blk.3.ffn_up.weight", 1, ne, 15, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED,
                "tensor 'blk.3.ffn_up.weight' has type Q8_K (15), which zinfer does not support");
    one_tensor(&b, "x", 1, ne, 19, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED, "tensor 'x' has type IQ1_S (19)");
    one_tensor(&b, "x", 1, ne, 40, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED, "tensor 'x' has type NVFP4 (40)");
    one_tensor(&b, "x", 1, ne, 24, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED, "tensor 'x' has type I8 (24)");
    one_tensor(&b, "x", 1, ne, 28, 0, 2048);
    expect_fail(&b, ZI_EUNSUPPORTED, "has type F64 (28)");
    one_tensor(&b, "x", 1, ne, 4, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED, "tensor 'x' has unknown type 4, which zinfer does not");
    one_tensor(&b, "x", 1, ne, 9999, 0, 1024);
    expect_fail(&b, ZI_EUNSUPPORTED, "has unknown type 9999");
}

/* Every type gguf-py's GGML_QUANT_SIZES lists: the full geometry for all,
 * and the reader's own (block_bytes/elems, supported) only for the types
 * zinfer computes with. */
static void test_ggml_block_table(void **state) {
    (void)state;
    static const struct {
        int t;
        const char *name;
        size_t elems, bytes;
        int supported;
    } all[] = {
        {0, "F32", 1, 4, 1},         {1, "F16", 1, 2, 1},         {2, "Q4_0", 32, 18, 1},
        {3, "Q4_1", 32, 20, 1},      {6, "Q5_0", 32, 22, 1},      {7, "Q5_1", 32, 24, 1},
        {8, "Q8_0", 32, 34, 1},      {9, "Q8_1", 32, 40, 0},      {10, "Q2_K", 256, 84, 1},
        {11, "Q3_K", 256, 110, 1},   {12, "Q4_K", 256, 144, 1},   {13, "Q5_K", 256, 176, 1},
        {14, "Q6_K", 256, 210, 1},   {15, "Q8_K", 256, 292, 0},   {16, "IQ2_XXS", 256, 66, 0},
        {17, "IQ2_XS", 256, 74, 0},  {18, "IQ3_XXS", 256, 98, 0}, {19, "IQ1_S", 256, 50, 0},
        {20, "IQ4_NL", 32, 18, 1},   {21, "IQ3_S", 256, 110, 0},  {22, "IQ2_S", 256, 82, 0},
        {23, "IQ4_XS", 256, 136, 1}, {24, "I8", 1, 1, 0},         {25, "I16", 1, 2, 0},
        {26, "I32", 1, 4, 0},        {27, "I64", 1, 8, 0},        {28, "F64", 1, 8, 0},
        {29, "IQ1_M", 256, 56, 0},   {30, "BF16", 1, 2, 1},       {34, "TQ1_0", 256, 54, 0},
        {35, "TQ2_0", 256, 66, 0},   {39, "MXFP4", 32, 17, 1},    {40, "NVFP4", 64, 36, 0},
        {41, "Q1_0", 128, 18, 0},
    };
    int n_supported = 0;
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        size_t e = 99, b = 99;
        assert_int_equal(zi_ggml_type_block(all[k].t, &e, &b), 1);
        assert_int_equal(e, all[k].elems);
        assert_int_equal(b, all[k].bytes);
        assert_string_equal(zi_ggml_type_name(all[k].t), all[k].name);
        assert_int_equal(zi_ggml_type_supported(all[k].t), all[k].supported);
        assert_int_equal(zi_ggml_type_block_elems(all[k].t), all[k].supported ? e : 0);
        assert_int_equal(zi_ggml_type_block_bytes(all[k].t), all[k].supported ? b : 0);
        n_supported += all[k].supported;
    }
    assert_int_equal(n_supported, 16); /* the zi_ggml_type enum */
    static const int none[] = {4, 5, 31, 32, 33, 36, 37, 38, 42, 200, -1, -3, 1 << 30};
    for (size_t k = 0; k < sizeof none / sizeof none[0]; k++) {
        size_t e = 99, b = 99;
        assert_int_equal(zi_ggml_type_block(none[k], &e, &b), 0);
        assert_int_equal(e, 0);
        assert_int_equal(b, 0);
        assert_int_equal(zi_ggml_type_supported(none[k]), 0);
    }
    assert_int_equal(zi_ggml_type_block(16, NULL, NULL), 1);
}

/* ---- ZI_GGUF_ANY_TYPE ---------------------------------------------------------- */

/* An F32 vector, 2 rows of 512 IQ2_XXS (4 blocks of 66 bytes), and a tensor
 * of type number 200 (3 x 7), whose offset points far past the end. */
static void build_mixed(wbuf *b, uint64_t odd_offset) {
    uint64_t ne_f[1] = {8}, ne_iq[2] = {512, 2}, ne_odd[2] = {7, 3};
    w_header(b, 3, 3, 0);
    w_tinfo(b, "norm", 1, ne_f, ZI_TYPE_F32, 0);
    w_tinfo(b, "embd", 2, ne_iq, 16, 32);
    w_tinfo(b, "odd", 2, ne_odd, 200, odd_offset);
    w_pad(b, 32);
    for (int i = 0; i < 32 + 4 * 66; i++) w_u8(b, (uint8_t)i);
}

static void test_any_type_keeps_tensors(void **state) {
    (void)state;
    wbuf b = {0};
    build_mixed(&b, 1u << 20);
    /* Without the flag: refused, naming the first unsupported tensor. */
    expect_fail_flags(&b, 0, ZI_EUNSUPPORTED,
                      "tensor 'embd' has type IQ2_XXS (16), which zinfer does not support");
    uint8_t *keep;
    zi_gguf *g = NULL;
    zi_error err;
    assert_int_equal(open_copy(b.p, b.n, ZI_GGUF_ANY_TYPE, &keep, &g, &err), ZI_OK);
    assert_int_equal(zi_gguf_tensor_count(g), 3);
    const zi_gguf_tensor *f = zi_gguf_find_tensor(g, "norm");
    const zi_gguf_tensor *iq = zi_gguf_find_tensor(g, "embd");
    const zi_gguf_tensor *odd = zi_gguf_find_tensor(g, "odd");
    assert_non_null(f);
    assert_non_null(iq);
    assert_non_null(odd);
    assert_int_equal(f->nbytes, 32);
    assert_int_equal(f->size_unknown, 0);
    assert_int_equal((uint32_t)iq->type, 16);
    assert_int_equal(iq->nbytes, 4 * 66);
    assert_int_equal(iq->size_unknown, 0);
    assert_ptr_equal(iq->data, (const uint8_t *)f->data + 32);
    assert_int_equal(((const uint8_t *)iq->data)[0], 32); /* the bytes written there */
    assert_int_equal((uint32_t)odd->type, 200);
    assert_int_equal(odd->ne[0], 7);
    assert_int_equal(odd->ne[1], 3);
    assert_int_equal(odd->size_unknown, 1);
    assert_int_equal(odd->nbytes, 0);
    assert_null(odd->data);
    zi_gguf_drop_pages(g, odd); /* nothing to drop; must not touch memory */
    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

/* Under the flag, the checks that hold for supported types hold for every
 * type ggml defines; a type it does not define keeps the shape and
 * alignment checks. Every message is the one without the flag. */
static void test_any_type_still_checks(void **state) {
    (void)state;
    wbuf b = {0};
    uint64_t ne[1] = {100};
    one_tensor(&b, "x", 1, ne, 16, 0, 1024);
    expect_fail_flags(&b, ZI_GGUF_ANY_TYPE, ZI_EFORMAT,
                      "tensor 'x': ne[0] = 100 is not a multiple of IQ2_XXS's block size 256");
    free(b.p);
    memset(&b, 0, sizeof b);
    ne[0] = 512; /* 2 blocks of IQ3_S: 220 bytes, 219 present */
    one_tensor(&b, "x", 1, ne, 21, 0, 219);
    expect_fail_flags(&b, ZI_GGUF_ANY_TYPE, ZI_EFORMAT,
                      "tensor 'x': data [offset 64, 220 bytes] extends past end of file");
    free(b.p);
    memset(&b, 0, sizeof b);
    one_tensor(&b, "x", 1, ne, 200, 16, 0);
    expect_fail_flags(&b, ZI_GGUF_ANY_TYPE, ZI_EFORMAT,
                      "tensor 'x': offset 16 is not a multiple of the alignment 32");
    free(b.p);
    memset(&b, 0, sizeof b);
    uint64_t big[2] = {1ull << 40, 1ull << 40};
    one_tensor(&b, "x", 2, big, 4000000000u, 0, 0);
    expect_fail_flags(&b, ZI_GGUF_ANY_TYPE, ZI_EFORMAT, "tensor 'x': element count overflows");
    free(b.p);
    memset(&b, 0, sizeof b);
    /* Unknown flags are refused. */
    one_tensor(&b, "x", 1, ne, ZI_TYPE_F32, 0, 2048);
    expect_fail_flags(&b, 2, ZI_EINVAL, "unknown flags");
    free(b.p);
    zi_gguf *g = (zi_gguf *)1;
    zi_error err;
    assert_int_equal(zi_gguf_open_flags("/nonexistent", 4, &g, &err), ZI_EINVAL);
    assert_null(g);
}

/* Every prefix of the mixed file fails cleanly under the flag (ASan checks
 * that nothing reads past the copy). */
static void test_any_type_truncation(void **state) {
    (void)state;
    wbuf b = {0};
    build_mixed(&b, 0);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *keep;
        zi_gguf *g = (zi_gguf *)1;
        zi_error err;
        int rc = open_copy(b.p, n, ZI_GGUF_ANY_TYPE, &keep, &g, &err);
        if (rc != ZI_EFORMAT) fail_msg("prefix %zu: %s: %s", n, zi_status_name(rc), err.msg);
        assert_null(g);
        free(keep);
    }
    free(b.p);
}

/* Through a file: the flag opens it, and without it the message carries
 * the path as before. */
static void test_any_type_file(void **state) {
    (void)state;
    wbuf b = {0};
    build_mixed(&b, 64);
    char path[] = "/tmp/zinfer_gguf_types_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b.p, b.n), (ssize_t)b.n);
    close(fd);
    zi_gguf *g = NULL;
    zi_error err;
    assert_int_equal(zi_gguf_open(path, &g, &err), ZI_EUNSUPPORTED);
    assert_null(g);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "tensor 'embd' has type IQ2_XXS (16)"));
    assert_int_equal(zi_gguf_open_flags(path, ZI_GGUF_ANY_TYPE, &g, &err), ZI_OK);
    assert_int_equal(zi_gguf_tensor_at(g, 2)->size_unknown, 1);
    assert_int_equal(zi_gguf_tensor_at(g, 1)->nbytes, 4 * 66);
    zi_gguf_close(g);
    unlink(path);
    free(b.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_tables),           cmocka_unit_test(test_ggml_block_table),
        cmocka_unit_test(test_unsupported_type),      cmocka_unit_test(test_any_type_keeps_tensors),
        cmocka_unit_test(test_any_type_still_checks), cmocka_unit_test(test_any_type_truncation),
        cmocka_unit_test(test_any_type_file),
    };
    return cmocka_run_group_tests_name("gguf_types", tests, NULL, NULL);
}
