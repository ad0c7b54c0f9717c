/*
 * test_gguf.c - cmocka tests for the GGUF reader (common/gguf.c).
 *
 * A small GGUF writer below builds files in memory: valid v2 and v3 files
 * with every metadata value type (nested and string arrays included) and a
 * tensor of each supported type, whose every field is then read back through
 * the accessors; and crafted bad files, each of which must fail with the
 * right status and a message naming the fault. Tensor types (the tables,
 * unsupported types, ZI_GGUF_ANY_TYPE) are tested in test_gguf_types.c. Inputs are copied into
 * exact-size heap buffers so that, under -fsanitize=address, any read past
 * the end is caught. The real model file, when present (ZINFER_MODEL or the
 * default path), is opened and checked against facts known about it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* The tensors of the valid file: one of each supported type, 1 to 4 dims. */
struct tspec {
    const char *name;
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type;
    uint64_t nbytes;
};
static const struct tspec TENSORS[] = {
    {"f32.weight", 2, {4, 3, 1, 1}, ZI_TYPE_F32, 48},
    {"f16.weight", 1, {8, 1, 1, 1}, ZI_TYPE_F16, 16},
    {"bf16.weight", 3, {2, 2, 2, 1}, ZI_TYPE_BF16, 16},
    {"q4_0.weight", 2, {64, 2, 1, 1}, ZI_TYPE_Q4_0, 72},
    {"q4_1.weight", 4, {32, 1, 2, 1}, ZI_TYPE_Q4_1, 40},
    {"q8_0.weight", 2, {32, 3, 1, 1}, ZI_TYPE_Q8_0, 102},
    {"q5_0.weight", 2, {32, 2, 1, 1}, ZI_TYPE_Q5_0, 44},
    {"q5_1.weight", 1, {64, 1, 1, 1}, ZI_TYPE_Q5_1, 48},
    {"q2_k.weight", 2, {256, 1, 1, 1}, ZI_TYPE_Q2_K, 84},
    {"q3_k.weight", 2, {256, 2, 1, 1}, ZI_TYPE_Q3_K, 220},
    {"q4_k.weight", 2, {512, 1, 1, 1}, ZI_TYPE_Q4_K, 288},
    {"q5_k.weight", 4, {256, 1, 1, 2}, ZI_TYPE_Q5_K, 352},
    {"q6_k.weight", 2, {256, 1, 1, 1}, ZI_TYPE_Q6_K, 210},
    {"iq4_nl.weight", 2, {32, 3, 1, 1}, ZI_TYPE_IQ4_NL, 54},
    {"mxfp4.weight", 2, {64, 3, 1, 1}, ZI_TYPE_MXFP4, 102},
    {"iq4_xs.weight", 3, {256, 1, 2, 1}, ZI_TYPE_IQ4_XS, 272},
};
#define N_TENSORS (sizeof TENSORS / sizeof TENSORS[0])

static uint8_t tensor_byte(size_t k, size_t i) {
    return (uint8_t)(k * 37 + i * 11 + 5);
}

/* Metadata of the valid file, one key per value type and array shape. */
static size_t write_kvs(wbuf *b, uint32_t alignment) {
    size_t n = 0;
    w_key(b, "t.u8", ZI_GGUF_UINT8), w_u8(b, 200), n++;
    w_key(b, "t.i8", ZI_GGUF_INT8), w_u8(b, (uint8_t)-100), n++;
    w_key(b, "t.u16", ZI_GGUF_UINT16), w_u16(b, 60000), n++;
    w_key(b, "t.i16", ZI_GGUF_INT16), w_u16(b, (uint16_t)-30000), n++;
    w_key(b, "t.u32", ZI_GGUF_UINT32), w_u32(b, 4000000000u), n++;
    w_key(b, "t.i32", ZI_GGUF_INT32), w_u32(b, (uint32_t)-2000000000), n++;
    w_key(b, "t.f32", ZI_GGUF_FLOAT32), w_f32(b, 1.5f), n++;
    w_key(b, "t.bool", ZI_GGUF_BOOL), w_u8(b, 1), n++;
    w_key(b, "t.str", ZI_GGUF_STRING), w_str(b, "hello, gguf"), n++;
    w_key(b, "t.u64", ZI_GGUF_UINT64), w_u64(b, 0xFFFFFFFFFFFFFFF0ull), n++;
    w_key(b, "t.i64", ZI_GGUF_INT64), w_u64(b, (uint64_t)-5000000000ll), n++;
    w_key(b, "t.f64", ZI_GGUF_FLOAT64), w_f64(b, 2.25), n++;
    w_key(b, "t.empty_str", ZI_GGUF_STRING), w_str(b, ""), n++;
    w_key(b, "t.bool_false", ZI_GGUF_BOOL), w_u8(b, 0), n++;
    w_key(b, "t.small_u64", ZI_GGUF_UINT64), w_u64(b, 77), n++;
    w_key(b, "t.neg_i8", ZI_GGUF_INT8), w_u8(b, (uint8_t)-1), n++;

    w_key(b, "a.u8", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_UINT8), w_u64(b, 3);
    w_u8(b, 1), w_u8(b, 2), w_u8(b, 3), n++;
    w_key(b, "a.i8", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_INT8), w_u64(b, 2);
    w_u8(b, (uint8_t)-1), w_u8(b, 1), n++;
    w_key(b, "a.u16", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_UINT16), w_u64(b, 1), w_u16(b, 65535), n++;
    w_key(b, "a.i16", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_INT16), w_u64(b, 1);
    w_u16(b, (uint16_t)-2), n++;
    w_key(b, "a.u32", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_UINT32), w_u64(b, 2);
    w_u32(b, 7), w_u32(b, 8), n++;
    w_key(b, "a.i32", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_INT32), w_u64(b, 3);
    w_u32(b, (uint32_t)-1), w_u32(b, 7), w_u32(b, 100000), n++;
    w_key(b, "a.f32", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_FLOAT32), w_u64(b, 2);
    w_f32(b, 0.5f), w_f32(b, -2.0f), n++;
    w_key(b, "a.bool", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_BOOL), w_u64(b, 3);
    w_u8(b, 1), w_u8(b, 0), w_u8(b, 1), n++;
    w_key(b, "a.u64", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_UINT64), w_u64(b, 1);
    w_u64(b, 1ull << 40), n++;
    w_key(b, "a.i64", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_INT64), w_u64(b, 1);
    w_u64(b, (uint64_t) - (1ll << 40)), n++;
    w_key(b, "a.f64", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_FLOAT64), w_u64(b, 1), w_f64(b, 1e300), n++;
    w_key(b, "a.str", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_STRING), w_u64(b, 4);
    w_str(b, "a"), w_str(b, ""), w_str(b, "h\xc3\xa9llo"), w_str(b, "xyz"), n++;
    /* [[1, 2], [], [-3]] as int16 */
    w_key(b, "a.arr", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_ARRAY), w_u64(b, 3);
    w_u32(b, ZI_GGUF_INT16), w_u64(b, 2), w_u16(b, 1), w_u16(b, 2);
    w_u32(b, ZI_GGUF_INT16), w_u64(b, 0);
    w_u32(b, ZI_GGUF_INT16), w_u64(b, 1), w_u16(b, (uint16_t)-3), n++;
    /* [["x", "yy"], ["zzz"]] */
    w_key(b, "a.arr.str", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_ARRAY), w_u64(b, 2);
    w_u32(b, ZI_GGUF_STRING), w_u64(b, 2), w_str(b, "x"), w_str(b, "yy");
    w_u32(b, ZI_GGUF_STRING), w_u64(b, 1), w_str(b, "zzz"), n++;
    w_key(b, "a.empty", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_UINT64), w_u64(b, 0), n++;
    w_key(b, "a.str.empty", ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_STRING), w_u64(b, 0), n++;

    w_key(b, "general.architecture", ZI_GGUF_STRING), w_str(b, "llama"), n++;
    if (alignment) w_key(b, "general.alignment", ZI_GGUF_UINT32), w_u32(b, alignment), n++;
    return n;
}

/* A complete valid file. The last tensor ends exactly at the end of the
 * file, so cutting any byte off makes the file invalid. */
static void build_valid(wbuf *b, uint32_t version, uint32_t alignment) {
    uint32_t align = alignment ? alignment : 32;
    wbuf kv = {0};
    size_t n_kv = write_kvs(&kv, alignment);
    w_header(b, version, N_TENSORS, n_kv);
    w_bytes(b, kv.p, kv.n);
    free(kv.p);
    uint64_t off = 0;
    for (size_t k = 0; k < N_TENSORS; k++) {
        uint64_t ne[4];
        for (int d = 0; d < 4; d++) ne[d] = (uint64_t)TENSORS[k].ne[d];
        w_tinfo(b, TENSORS[k].name, TENSORS[k].n_dims, ne, TENSORS[k].type, off);
        off += TENSORS[k].nbytes;
        off = (off + align - 1) / align * align;
    }
    w_pad(b, align);
    size_t data_start = b->n;
    for (size_t k = 0; k < N_TENSORS; k++) {
        w_pad(b, align);
        assert_int_equal((b->n - data_start) % align, 0);
        for (size_t i = 0; i < TENSORS[k].nbytes; i++) w_u8(b, tensor_byte(k, i));
    }
}

/* ---- helpers ---------------------------------------------------------------- */

/* Opens a copy of bytes in an exact-size heap buffer (so ASan sees any
 * overread). *keep receives the buffer, to free after zi_gguf_close. */
static int open_copy(const uint8_t *bytes, size_t len, uint8_t **keep, zi_gguf **g, zi_error *err) {
    *keep = malloc(len ? len : 1);
    assert_non_null(*keep);
    if (len) memcpy(*keep, bytes, len);
    zi_error_clear(err);
    return zi_gguf_open_memory(*keep, len, g, err);
}

/* The bytes must fail to open with `code` and a message containing want. */
static void expect_fail_n(const uint8_t *bytes, size_t len, int code, const char *want) {
    uint8_t *keep;
    zi_gguf *g = (zi_gguf *)1;
    zi_error err;
    int rc = open_copy(bytes, len, &keep, &g, &err);
    if (rc != code || !strstr(err.msg, want))
        fail_msg("expected %s containing \"%s\", got %s: \"%s\"", zi_status_name(code), want,
                 zi_status_name(rc), err.msg);
    assert_null(g);
    assert_int_equal(err.code, code);
    free(keep);
}
static void expect_fail(wbuf *b, int code, const char *want) {
    expect_fail_n(b->p, b->n, code, want);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static float rd_f32(const void *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static uint64_t rd_u64(const void *p) {
    const uint8_t *q = p;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | q[i];
    return v;
}
static uint32_t rd_u32(const void *p) {
    const uint8_t *q = p;
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static void assert_str(zi_str s, const char *want) {
    if (!zi_str_eq(s, want))
        fail_msg("expected \"%s\", got \"%.*s\"", want, (int)s.len, s.ptr ? s.ptr : "");
}

/* ---- checks of the valid file -------------------------------------------- */

static void check_valid(const zi_gguf *g, const uint8_t *base, uint32_t version, uint32_t alignment,
                        size_t size) {
    zi_error err;
    assert_int_equal(zi_gguf_version(g), version);
    assert_int_equal(zi_gguf_alignment(g), alignment ? alignment : 32);
    assert_int_equal(zi_gguf_file_size(g), size);
    assert_int_equal(zi_gguf_kv_count(g), alignment ? 34 : 33);
    assert_int_equal(zi_gguf_tensor_count(g), N_TENSORS);
    assert_null(zi_gguf_kv_at(g, zi_gguf_kv_count(g)));
    assert_null(zi_gguf_tensor_at(g, N_TENSORS));
    assert_null(zi_gguf_find_kv(g, "no.such.key"));
    assert_null(zi_gguf_find_kv(g, "t.u"));   /* a prefix of a key */
    assert_null(zi_gguf_find_kv(g, "t.u8x")); /* a key plus a byte */
    assert_null(zi_gguf_find_tensor(g, "f32"));

    /* Every kv in file order, found by name too. */
    const char *order[] = {"t.u8",  "t.i8",   "t.u16", "t.i16", "t.u32", "t.i32",
                           "t.f32", "t.bool", "t.str", "t.u64", "t.i64", "t.f64"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++) {
        const zi_gguf_kv *kv = zi_gguf_kv_at(g, i);
        assert_non_null(kv);
        assert_str(kv->key, order[i]);
        assert_ptr_equal(zi_gguf_find_kv(g, order[i]), kv);
    }
    for (uint64_t i = 0; i < zi_gguf_kv_count(g); i++) {
        const zi_gguf_kv *kv = zi_gguf_kv_at(g, i);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)kv->key.len, kv->key.ptr);
        assert_ptr_equal(zi_gguf_find_kv(g, key), kv);
    }

    const zi_gguf_kv *kv;
    kv = zi_gguf_find_kv(g, "t.u8");
    assert_int_equal(kv->type, ZI_GGUF_UINT8);
    assert_int_equal(kv->data[0], 200);
    kv = zi_gguf_find_kv(g, "t.i8");
    assert_int_equal(kv->type, ZI_GGUF_INT8);
    assert_int_equal((int8_t)kv->data[0], -100);
    kv = zi_gguf_find_kv(g, "t.u16");
    assert_int_equal(kv->type, ZI_GGUF_UINT16);
    assert_int_equal(kv->data[0] | kv->data[1] << 8, 60000);
    kv = zi_gguf_find_kv(g, "t.i16");
    assert_int_equal(kv->type, ZI_GGUF_INT16);
    assert_int_equal((int16_t)(uint16_t)(kv->data[0] | kv->data[1] << 8), -30000);
    kv = zi_gguf_find_kv(g, "t.u32");
    assert_int_equal(kv->type, ZI_GGUF_UINT32);
    assert_int_equal(rd_u32(kv->data), 4000000000u);
    kv = zi_gguf_find_kv(g, "t.i32");
    assert_int_equal(kv->type, ZI_GGUF_INT32);
    assert_int_equal((int32_t)rd_u32(kv->data), -2000000000);
    kv = zi_gguf_find_kv(g, "t.f32");
    assert_int_equal(kv->type, ZI_GGUF_FLOAT32);
    assert_true(rd_f32(kv->data) == 1.5f);
    kv = zi_gguf_find_kv(g, "t.bool");
    assert_int_equal(kv->type, ZI_GGUF_BOOL);
    assert_int_equal(kv->data[0], 1);
    kv = zi_gguf_find_kv(g, "t.str");
    assert_int_equal(kv->type, ZI_GGUF_STRING);
    assert_str(kv->str, "hello, gguf");
    assert_ptr_equal(kv->data, kv->str.ptr);
    kv = zi_gguf_find_kv(g, "t.u64");
    assert_int_equal(kv->type, ZI_GGUF_UINT64);
    assert_true(rd_u64(kv->data) == 0xFFFFFFFFFFFFFFF0ull);
    kv = zi_gguf_find_kv(g, "t.i64");
    assert_int_equal(kv->type, ZI_GGUF_INT64);
    assert_true((int64_t)rd_u64(kv->data) == -5000000000ll);
    kv = zi_gguf_find_kv(g, "t.f64");
    assert_int_equal(kv->type, ZI_GGUF_FLOAT64);
    double d;
    memcpy(&d, kv->data, 8);
    assert_true(d == 2.25);
    kv = zi_gguf_find_kv(g, "t.empty_str");
    assert_int_equal(kv->type, ZI_GGUF_STRING);
    assert_int_equal(kv->str.len, 0);

    /* Arrays: element type, length and raw little-endian elements. */
    const void *data;
    uint64_t n;
    assert_int_equal(zi_gguf_get_array(g, "a.u8", ZI_GGUF_UINT8, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(data, "\x01\x02\x03", 3);
    assert_int_equal(zi_gguf_get_array(g, "a.i8", ZI_GGUF_INT8, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(data, "\xff\x01", 2);
    assert_int_equal(zi_gguf_get_array(g, "a.u16", ZI_GGUF_UINT16, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(data, "\xff\xff", 2);
    assert_int_equal(zi_gguf_get_array(g, "a.i16", ZI_GGUF_INT16, &data, &n, &err), ZI_OK);
    assert_memory_equal(data, "\xfe\xff", 2);
    assert_int_equal(zi_gguf_get_array(g, "a.u32", ZI_GGUF_UINT32, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 2);
    assert_int_equal(rd_u32((const uint8_t *)data + 4), 8);
    assert_int_equal(zi_gguf_get_array(g, "a.i32", ZI_GGUF_INT32, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 3);
    assert_int_equal((int32_t)rd_u32(data), -1);
    assert_int_equal((int32_t)rd_u32((const uint8_t *)data + 8), 100000);
    assert_int_equal(zi_gguf_get_array(g, "a.f32", ZI_GGUF_FLOAT32, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 2);
    assert_true(rd_f32(data) == 0.5f && rd_f32((const uint8_t *)data + 4) == -2.0f);
    assert_int_equal(zi_gguf_get_array(g, "a.bool", ZI_GGUF_BOOL, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(data, "\x01\x00\x01", 3);
    assert_int_equal(zi_gguf_get_array(g, "a.u64", ZI_GGUF_UINT64, &data, &n, &err), ZI_OK);
    assert_true(n == 1 && rd_u64(data) == 1ull << 40);
    assert_int_equal(zi_gguf_get_array(g, "a.i64", ZI_GGUF_INT64, &data, &n, &err), ZI_OK);
    assert_true(n == 1 && (int64_t)rd_u64(data) == -(1ll << 40));
    assert_int_equal(zi_gguf_get_array(g, "a.f64", ZI_GGUF_FLOAT64, &data, &n, &err), ZI_OK);
    memcpy(&d, data, 8);
    assert_true(n == 1 && d == 1e300);
    assert_int_equal(zi_gguf_get_array(g, "a.empty", ZI_GGUF_UINT64, &data, &n, &err), ZI_OK);
    assert_int_equal(n, 0);

    zi_str *strs;
    assert_int_equal(zi_gguf_get_str_array(g, "a.str", &strs, &n, &err), ZI_OK);
    assert_int_equal(n, 4);
    assert_str(strs[0], "a");
    assert_str(strs[1], "");
    assert_str(strs[2], "h\xc3\xa9llo");
    assert_str(strs[3], "xyz");
    free(strs);
    assert_int_equal(zi_gguf_get_str_array(g, "a.str.empty", &strs, &n, &err), ZI_OK);
    assert_int_equal(n, 0);
    free(strs);

    /* Nested arrays: data points at the first inner array's header. */
    kv = zi_gguf_find_kv(g, "a.arr");
    assert_int_equal(kv->type, ZI_GGUF_ARRAY);
    assert_int_equal(kv->arr_type, ZI_GGUF_ARRAY);
    assert_int_equal(kv->arr_len, 3);
    const uint8_t *p = kv->data;
    assert_int_equal(rd_u32(p), ZI_GGUF_INT16);
    assert_int_equal(rd_u64(p + 4), 2);
    assert_memory_equal(p + 12, "\x01\x00\x02\x00", 4);
    p += 16;
    assert_int_equal(rd_u32(p), ZI_GGUF_INT16);
    assert_int_equal(rd_u64(p + 4), 0);
    p += 12;
    assert_int_equal(rd_u64(p + 4), 1);
    assert_memory_equal(p + 12, "\xfd\xff", 2);
    kv = zi_gguf_find_kv(g, "a.arr.str");
    assert_int_equal(kv->arr_type, ZI_GGUF_ARRAY);
    assert_int_equal(kv->arr_len, 2);
    p = kv->data;
    assert_int_equal(rd_u32(p), ZI_GGUF_STRING);
    assert_int_equal(rd_u64(p + 4), 2);
    assert_int_equal(rd_u64(p + 12), 1);
    assert_memory_equal(p + 20, "x", 1);
    assert_int_equal(rd_u64(p + 21), 2);
    assert_memory_equal(p + 29, "yy", 2);
    p += 31;
    assert_int_equal(rd_u32(p), ZI_GGUF_STRING);
    assert_int_equal(rd_u64(p + 4), 1);
    assert_int_equal(rd_u64(p + 12), 3);
    assert_memory_equal(p + 20, "zzz", 3);
    zi_str arch;
    assert_int_equal(zi_gguf_get_str(g, "general.architecture", &arch, &err), ZI_OK);
    assert_str(arch, "llama");

    /* Tensors: every field, and the data bytes the writer put there. */
    uint64_t align = alignment ? alignment : 32, off = 0;
    const uint8_t *first_data = NULL;
    for (size_t k = 0; k < N_TENSORS; k++) {
        const zi_gguf_tensor *t = zi_gguf_tensor_at(g, k);
        assert_non_null(t);
        assert_ptr_equal(zi_gguf_find_tensor(g, TENSORS[k].name), t);
        assert_str(t->name, TENSORS[k].name);
        assert_int_equal(t->n_dims, TENSORS[k].n_dims);
        for (int dd = 0; dd < 4; dd++) assert_int_equal(t->ne[dd], TENSORS[k].ne[dd]);
        assert_int_equal(t->type, TENSORS[k].type);
        assert_int_equal(t->offset, off);
        assert_int_equal(t->nbytes, TENSORS[k].nbytes);
        const uint8_t *td = t->data;
        if (k == 0) first_data = td;
        assert_ptr_equal(td, first_data + off);
        for (size_t i = 0; i < t->nbytes; i++) assert_int_equal(td[i], tensor_byte(k, i));
        off = (off + t->nbytes + align - 1) / align * align;
    }
    /* The last tensor ends exactly at the end of the file. */
    const zi_gguf_tensor *last = zi_gguf_tensor_at(g, N_TENSORS - 1);
    if (base) assert_ptr_equal((const uint8_t *)last->data + last->nbytes, base + size);
}

static void test_valid(uint32_t version, uint32_t alignment) {
    wbuf b = {0};
    build_valid(&b, version, alignment);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    int rc = open_copy(b.p, b.n, &keep, &g, &err);
    if (rc) fail_msg("open failed: %s", err.msg);
    check_valid(g, keep, version, alignment, b.n);
    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

static void test_valid_v3(void **state) {
    (void)state;
    test_valid(3, 0);
}
static void test_valid_v2(void **state) {
    (void)state;
    test_valid(2, 0);
}
static void test_valid_v3_align64(void **state) {
    (void)state;
    test_valid(3, 64);
}
static void test_valid_v2_align1(void **state) {
    (void)state;
    test_valid(2, 1);
}

/* ---- files on disk -------------------------------------------------------- */

static void write_file(const char *path, const void *d, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(d, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void test_open_file(void **state) {
    (void)state;
    char path[] = "/tmp/zi_test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    wbuf b = {0};
    build_valid(&b, 3, 128);
    write_file(path, b.p, b.n);
    zi_gguf *g;
    zi_error err;
    int rc = zi_gguf_open(path, &g, &err);
    if (rc) fail_msg("open failed: %s", err.msg);
    check_valid(g, NULL, 3, 128, b.n);
    /* The mapping is page-aligned, so tensor data meets the file's alignment. */
    for (uint64_t i = 0; i < zi_gguf_tensor_count(g); i++)
        assert_int_equal((uintptr_t)zi_gguf_tensor_at(g, i)->data % 128, 0);
    zi_gguf_close(g);

    /* A truncated file: message prefixed with the path. */
    write_file(path, b.p, b.n - 1);
    g = (zi_gguf *)1;
    assert_int_equal(zi_gguf_open(path, &g, &err), ZI_EFORMAT);
    assert_null(g);
    char want[128];
    snprintf(want, sizeof want, "%s: tensor 'iq4_xs.weight': data [offset ", path);
    if (strncmp(err.msg, want, strlen(want)) != 0) fail_msg("got \"%s\"", err.msg);
    assert_non_null(strstr(err.msg, "extends past end of file"));

    /* Not a GGUF file. */
    write_file(path,
               "\x7f"
               "ELF and more bytes",
               19);
    assert_int_equal(zi_gguf_open(path, &g, &err), ZI_EFORMAT);
    snprintf(want, sizeof want, "%s is not a GGUF file (bad magic 7f 45 4c 46", path);
    if (strncmp(err.msg, want, strlen(want)) != 0) fail_msg("got \"%s\"", err.msg);

    /* Empty file. */
    write_file(path, "", 0);
    assert_int_equal(zi_gguf_open(path, &g, &err), ZI_EFORMAT);
    snprintf(want, sizeof want, "%s is not a GGUF file (only 0 bytes", path);
    if (strncmp(err.msg, want, strlen(want)) != 0) fail_msg("got \"%s\"", err.msg);

    /* Version 1 through a file: prefixed, unsupported. */
    wbuf v1 = {0};
    w_header(&v1, 1, 0, 0);
    write_file(path, v1.p, v1.n);
    free(v1.p);
    assert_int_equal(zi_gguf_open(path, &g, &err), ZI_EUNSUPPORTED);
    snprintf(want, sizeof want, "%s: GGUF version 1 is not supported", path);
    if (strncmp(err.msg, want, strlen(want)) != 0) fail_msg("got \"%s\"", err.msg);

    unlink(path);
    free(b.p);

    /* Missing path. */
    assert_int_equal(zi_gguf_open("/nonexistent/dir/model.gguf", &g, &err), ZI_EIO);
    assert_string_equal(err.msg,
                        "cannot open /nonexistent/dir/model.gguf: No such file or directory");
    assert_null(g);
    /* A directory. */
    assert_int_equal(zi_gguf_open("/tmp", &g, &err), ZI_EIO);
    assert_string_equal(err.msg, "cannot open /tmp: not a regular file");
    /* Bad arguments. */
    assert_int_equal(zi_gguf_open(NULL, &g, &err), ZI_EINVAL);
    assert_int_equal(zi_gguf_open_memory(NULL, 5, &g, &err), ZI_EINVAL);
    assert_int_equal(zi_gguf_open_memory(NULL, 0, &g, &err), ZI_EFORMAT);
    zi_gguf_close(NULL);
}

/* ---- truncation at every byte ---------------------------------------------- */

static void truncate_everywhere(uint32_t version, uint32_t alignment) {
    wbuf b = {0};
    build_valid(&b, version, alignment);
    /* Each prefix must fail cleanly with one of these explanations. */
    static const char *const why[] = {"not a GGUF file", "truncated: ", "past end of file",
                                      "header claims", "needs at least"};
    size_t seen[5] = {0};
    for (size_t len = 0; len < b.n; len++) {
        uint8_t *keep;
        zi_gguf *g = (zi_gguf *)1;
        zi_error err;
        int rc = open_copy(b.p, len, &keep, &g, &err);
        if (rc != ZI_EFORMAT || g != NULL || err.msg[0] == '\0')
            fail_msg("truncated at %zu of %zu: rc %d, msg \"%s\"", len, b.n, rc, err.msg);
        size_t k = 0;
        while (k < 5 && !strstr(err.msg, why[k])) k++;
        if (k == 5) fail_msg("truncated at %zu: unexpected message \"%s\"", len, err.msg);
        seen[k]++;
        free(keep);
    }
    assert_int_equal(seen[0], 4); /* 0..3 bytes */
    assert_true(seen[1] > 100 && seen[2] > 100 && seen[3] > 100);
    free(b.p);
}

static void test_truncation_v3(void **state) {
    (void)state;
    truncate_everywhere(3, 0);
}
static void test_truncation_v2_align16(void **state) {
    (void)state;
    truncate_everywhere(2, 16);
}

/* A known message for a truncation inside a key's value. */
static void test_truncation_message(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 3, 0, 2);
    w_key(&b, "k0", ZI_GGUF_UINT8), w_u8(&b, 1);
    w_key(&b, "k1", ZI_GGUF_UINT64), w_u32(&b, 5);
    expect_fail(&b, ZI_EFORMAT,
                "truncated: metadata key 'k1' value at byte 53 needs 8 bytes, file has 4 left");
    w_header(&b, 3, 0, 2);
    w_key(&b, "k0", ZI_GGUF_STRING), w_str(&b, "0123456789ab");
    w_u32(&b, 9);
    expect_fail(&b, ZI_EFORMAT,
                "truncated: metadata key #1 name length at byte 58 needs 8 bytes, file has 4 left");
    w_header(&b, 3, 1, 0);
    w_str(&b, "w"), w_u32(&b, 4), w_u64(&b, 4), w_u64(&b, 1), w_u32(&b, 0);
    expect_fail(&b, ZI_EFORMAT,
                "truncated: tensor 'w' ne[2] at byte 53 needs 8 bytes, file has 4 left");
}

/* ---- crafted bad files ------------------------------------------------------ */

static void test_bad_magic(void **state) {
    (void)state;
    expect_fail_n((const uint8_t *)"GGU", 3, ZI_EFORMAT, "not a GGUF file (only 3 bytes");
    expect_fail_n((const uint8_t *)"", 0, ZI_EFORMAT, "not a GGUF file (only 0 bytes");
    wbuf b = {0};
    build_valid(&b, 3, 0);
    b.p[0] = 'F';
    expect_fail(&b, ZI_EFORMAT, "not a GGUF file (bad magic 46 47 55 46, expected \"GGUF\")");
    build_valid(&b, 3, 0);
    b.p[3] = 'f';
    expect_fail(&b, ZI_EFORMAT, "bad magic 47 47 55 66");
}

static void test_bad_version(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 1, 0, 0);
    expect_fail(&b, ZI_EUNSUPPORTED, "GGUF version 1 is not supported");
    w_header(&b, 99, 0, 0);
    expect_fail(&b, ZI_EUNSUPPORTED, "GGUF version 99 is not supported");
    w_header(&b, 0, 0, 0);
    expect_fail(&b, ZI_EUNSUPPORTED, "GGUF version 0 is not supported");
    w_header(&b, 0x03000000u, 0, 0);
    expect_fail(&b, ZI_EUNSUPPORTED, "big-endian GGUF files are not supported");
    /* A v3 header alone, no counts. */
    w_bytes(&b, "GGUF\x03\x00\x00\x00", 8);
    expect_fail(&b, ZI_EFORMAT, "truncated: header tensor count at byte 8 needs 8 bytes");
    /* The smallest valid file: no keys, no tensors. */
    w_header(&b, 3, 0, 0);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    assert_int_equal(open_copy(b.p, b.n, &keep, &g, &err), ZI_OK);
    assert_int_equal(zi_gguf_kv_count(g), 0);
    assert_int_equal(zi_gguf_tensor_count(g), 0);
    assert_null(zi_gguf_find_kv(g, "x"));
    assert_null(zi_gguf_find_tensor(g, "x"));
    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

static void test_huge_counts(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 3, 0, UINT64_MAX);
    expect_fail(&b, ZI_EFORMAT, "header claims 18446744073709551615 metadata keys");
    w_header(&b, 3, 1ull << 62, 0);
    expect_fail(&b, ZI_EFORMAT, "and 4611686018427387904 tensors");
    w_header(&b, 3, 1ull << 59, 1ull << 60); /* products would overflow */
    expect_fail(&b, ZI_EFORMAT, "header claims");
    /* Just one key too many for the bytes there. */
    w_header(&b, 3, 0, 2);
    w_key(&b, "a", ZI_GGUF_UINT8), w_u8(&b, 0);
    expect_fail(&b, ZI_EFORMAT, "file has 14 bytes after the header");
    /* A huge array count. */
    w_header(&b, 3, 0, 1);
    w_key(&b, "big", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_UINT32), w_u64(&b, 1ull << 62);
    w_zeros(&b, 16);
    expect_fail(&b, ZI_EFORMAT, "metadata key 'big': array of 4611686018427387904 uint32");
    w_header(&b, 3, 0, 1);
    w_key(&b, "big", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_STRING), w_u64(&b, UINT64_MAX);
    w_zeros(&b, 16);
    expect_fail(&b, ZI_EFORMAT, "needs at least 8 bytes each");
    w_header(&b, 3, 0, 1);
    w_key(&b, "big", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_ARRAY), w_u64(&b, 1ull << 40);
    w_zeros(&b, 24);
    expect_fail(&b, ZI_EFORMAT, "needs at least 12 bytes each");
}

static void test_string_past_eof(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 3, 0, 1);
    w_u64(&b, UINT64_MAX), w_zeros(&b, 8);
    expect_fail(&b, ZI_EFORMAT,
                "metadata key #0: name at byte 24 has length 18446744073709551615, past end of "
                "file (8 bytes left)");
    w_header(&b, 3, 0, 1);
    w_key(&b, "s", ZI_GGUF_STRING), w_u64(&b, 10), w_bytes(&b, "abc", 3);
    expect_fail(&b, ZI_EFORMAT, "metadata key 's': string value at byte 37 has length 10");
    w_header(&b, 3, 0, 1);
    w_key(&b, "s", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_STRING), w_u64(&b, 2);
    w_str(&b, "ok"), w_u64(&b, 3), w_bytes(&b, "ab", 2);
    expect_fail(&b, ZI_EFORMAT, "metadata key 's': string at byte");
    w_header(&b, 3, 1, 0);
    w_u64(&b, 1ull << 63), w_zeros(&b, 40);
    expect_fail(&b, ZI_EFORMAT, "tensor #0: name at byte 24 has length 9223372036854775808");
}

static void test_invalid_type_tag(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 3, 0, 1);
    w_key(&b, "bad", 13), w_zeros(&b, 8);
    expect_fail(&b, ZI_EFORMAT, "metadata key 'bad': invalid value type 13");
    w_header(&b, 3, 0, 1);
    w_key(&b, "bad", 0xFFFFFFFFu), w_zeros(&b, 8);
    expect_fail(&b, ZI_EFORMAT, "invalid value type 4294967295");
    w_header(&b, 3, 0, 1);
    w_key(&b, "bad", ZI_GGUF_ARRAY), w_u32(&b, 13), w_u64(&b, 1), w_zeros(&b, 8);
    expect_fail(&b, ZI_EFORMAT, "metadata key 'bad': invalid array element type 13");
    w_header(&b, 3, 0, 1);
    w_key(&b, "bad", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_ARRAY), w_u64(&b, 1);
    w_u32(&b, 200), w_u64(&b, 0);
    expect_fail(&b, ZI_EFORMAT, "invalid array element type 200");
    /* Bools other than 0 and 1. */
    w_header(&b, 3, 0, 1);
    w_key(&b, "b", ZI_GGUF_BOOL), w_u8(&b, 2);
    expect_fail(&b, ZI_EFORMAT, "metadata key 'b': bool at byte 37 has value 2, expected 0 or 1");
    w_header(&b, 3, 0, 1);
    w_key(&b, "b", ZI_GGUF_ARRAY), w_u32(&b, ZI_GGUF_BOOL), w_u64(&b, 2), w_u8(&b, 1);
    w_u8(&b, 255);
    expect_fail(&b, ZI_EFORMAT, "has value 255, expected 0 or 1");
    /* An empty key. */
    w_header(&b, 3, 0, 1);
    w_key(&b, "", ZI_GGUF_UINT8), w_u8(&b, 1);
    expect_fail(&b, ZI_EFORMAT, "metadata key #0: empty key name");
}

/* depth arrays nested inside each other around one uint8. */
static void nested(wbuf *b, int depth) {
    w_header(b, 3, 0, 1);
    w_key(b, "deep", ZI_GGUF_ARRAY);
    for (int i = 1; i < depth; i++) w_u32(b, ZI_GGUF_ARRAY), w_u64(b, 1);
    w_u32(b, ZI_GGUF_UINT8), w_u64(b, 1), w_u8(b, 42);
}

static void test_deep_arrays(void **state) {
    (void)state;
    wbuf b = {0};
    nested(&b, 8);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    int rc = open_copy(b.p, b.n, &keep, &g, &err);
    if (rc) fail_msg("depth 8 should open: %s", err.msg);
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, "deep");
    assert_int_equal(kv->arr_type, ZI_GGUF_ARRAY);
    assert_int_equal(kv->arr_len, 1);
    assert_int_equal(b.p[b.n - 1], 42);
    zi_gguf_close(g);
    free(keep);
    free(b.p);
    memset(&b, 0, sizeof b);
    nested(&b, 9);
    expect_fail(&b, ZI_EFORMAT, "metadata key 'deep': arrays nested more than 8 deep");
    nested(&b, 1000);
    expect_fail(&b, ZI_EFORMAT, "arrays nested more than 8 deep");
}

static void test_tensor_shapes(void **state) {
    (void)state;
    wbuf b = {0};
    uint64_t ne[5] = {32, 2, 1, 1, 1};
    one_tensor(&b, "t", 0, ne, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': n_dims is 0, expected 1..4");
    one_tensor(&b, "t", 5, ne, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': n_dims is 5, expected 1..4");
    uint64_t neg[2] = {32, (uint64_t)-1};
    one_tensor(&b, "t", 2, neg, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': ne[1] is negative (-1)");
    uint64_t big[2] = {1ull << 40, 1ull << 40};
    one_tensor(&b, "t", 2, big, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': element count overflows");
    uint64_t big2[2] = {1ull << 62, 2}; /* 2^63 elements: past int64 */
    one_tensor(&b, "t", 2, big2, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "element count overflows");
    uint64_t zero_big[4] = {0, 1ull << 40, 1ull << 40, 2}; /* zero elements, rows overflow */
    one_tensor(&b, "t", 4, zero_big, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "element count overflows");
    uint64_t bytes_big[1] = {1ull << 62}; /* 2^64 bytes of F32 */
    one_tensor(&b, "t", 1, bytes_big, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': byte size overflows");
    uint64_t huge[1] = {1ull << 60}; /* fits, but not in the file */
    one_tensor(&b, "t", 1, huge, ZI_TYPE_F16, 0, 256);
    expect_fail(&b, ZI_EFORMAT,
                "tensor 't': data [offset 64, 2305843009213693952 bytes] extends past end of file "
                "(size 320)");
    uint64_t q[2] = {48, 2};
    one_tensor(&b, "t", 2, q, ZI_TYPE_Q4_0, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': ne[0] = 48 is not a multiple of Q4_0's block size 32");
    one_tensor(&b, "t", 2, q, ZI_TYPE_Q8_0, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "Q8_0's block size 32");
    uint64_t q1[1] = {16};
    one_tensor(&b, "t", 1, q1, ZI_TYPE_Q4_1, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "ne[0] = 16 is not a multiple of Q4_1's block size 32");
    /* The newer block types: 32 values for Q5_0, Q5_1, IQ4_NL and MXFP4,
     * 256 for the K-quants and IQ4_XS, whatever the row's other factors. */
    const struct {
        uint32_t type;
        uint64_t ne0;
        const char *msg;
    } rows[] = {
        {ZI_TYPE_Q5_0, 48, "tensor 't': ne[0] = 48 is not a multiple of Q5_0's block size 32"},
        {ZI_TYPE_Q5_1, 16, "ne[0] = 16 is not a multiple of Q5_1's block size 32"},
        {ZI_TYPE_IQ4_NL, 40, "ne[0] = 40 is not a multiple of IQ4_NL's block size 32"},
        {ZI_TYPE_Q2_K, 128, "ne[0] = 128 is not a multiple of Q2_K's block size 256"},
        {ZI_TYPE_Q3_K, 288, "ne[0] = 288 is not a multiple of Q3_K's block size 256"},
        {ZI_TYPE_Q4_K, 384, "tensor 't': ne[0] = 384 is not a multiple of Q4_K's block size 256"},
        {ZI_TYPE_Q5_K, 32, "ne[0] = 32 is not a multiple of Q5_K's block size 256"},
        {ZI_TYPE_Q6_K, 576, "ne[0] = 576 is not a multiple of Q6_K's block size 256"},
        {ZI_TYPE_IQ4_XS, 64, "ne[0] = 64 is not a multiple of IQ4_XS's block size 256"},
        {ZI_TYPE_MXFP4, 48, "ne[0] = 48 is not a multiple of MXFP4's block size 32"},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
        uint64_t shape[2] = {rows[k].ne0, 2};
        one_tensor(&b, "t", 2, shape, rows[k].type, 0, 4096);
        expect_fail(&b, ZI_EFORMAT, rows[k].msg);
    }
    /* A whole number of blocks, but fewer bytes than they need. */
    uint64_t q4k[2] = {512, 2}; /* 4 blocks of 144 bytes */
    one_tensor(&b, "blk.0.ffn_down.weight", 2, q4k, ZI_TYPE_Q4_K, 0, 575);
    expect_fail(&b, ZI_EFORMAT,
                "tensor 'blk.0.ffn_down.weight': data [offset 96, 576 bytes] extends past end of "
                "file (size 671)");

    /* A zero-sized dimension is allowed: no bytes. */
    uint64_t z[2] = {0, 5};
    one_tensor(&b, "empty", 2, z, ZI_TYPE_Q4_0, 0, 0);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    int rc = open_copy(b.p, b.n, &keep, &g, &err);
    if (rc) fail_msg("zero-size tensor should open: %s", err.msg);
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, "empty");
    assert_int_equal(t->nbytes, 0);
    assert_int_equal(t->ne[0], 0);
    assert_int_equal(t->ne[1], 5);
    assert_int_equal(t->ne[2], 1);
    zi_gguf_close(g);
    free(keep);
    free(b.p);
    memset(&b, 0, sizeof b);

    /* Empty tensor name. */
    one_tensor(&b, "", 2, ne, ZI_TYPE_F32, 0, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor #0: empty tensor name");
}

static void test_tensor_placement(void **state) {
    (void)state;
    wbuf b = {0};
    uint64_t ne[2] = {32, 2}; /* 256 bytes of F32 */
    one_tensor(&b, "blk.0.attn_q.weight", 2, ne, ZI_TYPE_F32, 0, 255);
    expect_fail(&b, ZI_EFORMAT,
                "tensor 'blk.0.attn_q.weight': data [offset 96, 256 bytes] extends past end of "
                "file (size 351)");
    one_tensor(&b, "t", 2, ne, ZI_TYPE_F32, 64, 256);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': data [offset 160, 256 bytes] extends past end");
    one_tensor(&b, "t", 2, ne, ZI_TYPE_F32, UINT64_MAX - 31, 256); /* wraps */
    expect_fail(&b, ZI_EFORMAT, "extends past end of file");
    one_tensor(&b, "t", 2, ne, ZI_TYPE_F32, 16, 512);
    expect_fail(&b, ZI_EFORMAT, "tensor 't': offset 16 is not a multiple of the alignment 32");
    one_tensor(&b, "t", 2, ne, ZI_TYPE_F32, 1, 512);
    expect_fail(&b, ZI_EFORMAT, "offset 1 is not a multiple of the alignment 32");
    /* Exactly fitting works. */
    one_tensor(&b, "t", 2, ne, ZI_TYPE_F32, 32, 288);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    assert_int_equal(open_copy(b.p, b.n, &keep, &g, &err), ZI_OK);
    assert_int_equal(zi_gguf_find_tensor(g, "t")->offset, 32);
    assert_ptr_equal(zi_gguf_find_tensor(g, "t")->data, keep + 96 + 32);
    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

static void with_alignment_kv(wbuf *b, uint32_t type, uint64_t value) {
    uint64_t ne[1] = {8};
    w_header(b, 3, 1, 1);
    w_key(b, "general.alignment", type);
    if (type == ZI_GGUF_UINT64)
        w_u64(b, value);
    else if (type == ZI_GGUF_STRING)
        w_str(b, "32");
    else
        w_u32(b, (uint32_t)value);
    w_tinfo(b, "t", 1, ne, ZI_TYPE_F32, 0);
    w_pad(b, 32);
    w_zeros(b, 32);
}

static void test_bad_alignment(void **state) {
    (void)state;
    wbuf b = {0};
    with_alignment_kv(&b, ZI_GGUF_UINT32, 0);
    expect_fail(&b, ZI_EFORMAT,
                "metadata key 'general.alignment' is 0, expected a nonzero power of two");
    with_alignment_kv(&b, ZI_GGUF_UINT32, 3);
    expect_fail(&b, ZI_EFORMAT, "'general.alignment' is 3, expected a nonzero power of two");
    with_alignment_kv(&b, ZI_GGUF_UINT32, 0x80000001u);
    expect_fail(&b, ZI_EFORMAT, "is 2147483649, expected");
    with_alignment_kv(&b, ZI_GGUF_UINT64, 32);
    expect_fail(&b, ZI_EFORMAT, "'general.alignment' has type uint64, expected uint32");
    with_alignment_kv(&b, ZI_GGUF_INT32, 32);
    expect_fail(&b, ZI_EFORMAT, "has type int32, expected uint32");
    with_alignment_kv(&b, ZI_GGUF_STRING, 0);
    expect_fail(&b, ZI_EFORMAT, "has type string, expected uint32");
    /* A huge power of two is valid; the data section then lies past the end. */
    with_alignment_kv(&b, ZI_GGUF_UINT32, 1u << 31);
    expect_fail(&b, ZI_EFORMAT, "data [offset 2147483648, 32 bytes] extends past end of file");
}

static void test_duplicates(void **state) {
    (void)state;
    wbuf b = {0};
    w_header(&b, 3, 0, 3);
    w_key(&b, "a", ZI_GGUF_UINT8), w_u8(&b, 1);
    w_key(&b, "b", ZI_GGUF_UINT8), w_u8(&b, 1);
    w_key(&b, "a", ZI_GGUF_STRING), w_str(&b, "x");
    expect_fail(&b, ZI_EFORMAT,
                "metadata key 'a': duplicate key (first defined as metadata key #0)");
    uint64_t ne[1] = {8};
    w_header(&b, 3, 3, 0);
    w_tinfo(&b, "x", 1, ne, ZI_TYPE_F32, 0);
    w_tinfo(&b, "y", 1, ne, ZI_TYPE_F32, 32);
    w_tinfo(&b, "y", 1, ne, ZI_TYPE_F32, 64);
    w_pad(&b, 32);
    w_zeros(&b, 96);
    expect_fail(&b, ZI_EFORMAT, "tensor 'y': duplicate tensor name (first defined as tensor #1)");
    /* Names that differ only in length are distinct. */
    w_header(&b, 3, 2, 2);
    w_key(&b, "ab", ZI_GGUF_UINT8), w_u8(&b, 1);
    w_key(&b, "a", ZI_GGUF_UINT8), w_u8(&b, 2);
    w_tinfo(&b, "x", 1, ne, ZI_TYPE_F32, 0);
    w_tinfo(&b, "xx", 1, ne, ZI_TYPE_F32, 32);
    w_pad(&b, 32);
    w_zeros(&b, 64);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    assert_int_equal(open_copy(b.p, b.n, &keep, &g, &err), ZI_OK);
    assert_int_equal(zi_gguf_find_kv(g, "a")->data[0], 2);
    assert_int_equal(zi_gguf_find_tensor(g, "xx")->offset, 32);
    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

/* Long or binary names are shortened and made printable in messages. */
static void test_message_names(void **state) {
    (void)state;
    char name[200];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    name[3] = '\n';
    wbuf b = {0};
    w_header(&b, 3, 0, 1);
    w_key(&b, name, 13);
    zi_error err;
    uint8_t *keep;
    zi_gguf *g;
    assert_int_equal(open_copy(b.p, b.n, &keep, &g, &err), ZI_EFORMAT);
    assert_null(strchr(err.msg, '\n'));
    assert_non_null(strstr(err.msg, "metadata key 'nnn?nnnn"));
    assert_non_null(strstr(err.msg, "n...': invalid value type 13"));
    assert_true(strlen(err.msg) < 200);
    free(keep);
    free(b.p);
}

/* ---- typed getters ----------------------------------------------------------- */

static void test_getters(void **state) {
    (void)state;
    wbuf b = {0};
    build_valid(&b, 3, 0);
    uint8_t *keep;
    zi_gguf *g;
    zi_error err;
    assert_int_equal(open_copy(b.p, b.n, &keep, &g, &err), ZI_OK);

    uint32_t u;
    assert_int_equal(zi_gguf_get_u32(g, "t.u8", &u, &err), ZI_OK);
    assert_int_equal(u, 200);
    assert_int_equal(zi_gguf_get_u32(g, "t.u16", &u, &err), ZI_OK);
    assert_int_equal(u, 60000);
    assert_int_equal(zi_gguf_get_u32(g, "t.u32", &u, &err), ZI_OK);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(zi_gguf_get_u32(g, "t.small_u64", &u, &err), ZI_OK);
    assert_int_equal(u, 77);
    u = 123;
    assert_int_equal(zi_gguf_get_u32(g, "t.i32", &u, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.i32 has value -2000000000, which does not fit uint32");
    assert_int_equal(u, 123);
    assert_int_equal(zi_gguf_get_u32(g, "t.neg_i8", &u, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.neg_i8 has value -1, which does not fit uint32");
    assert_int_equal(zi_gguf_get_u32(g, "t.u64", &u, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "18446744073709551600, which does not fit uint32"));
    assert_int_equal(zi_gguf_get_u32(g, "t.str", &u, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.str has type string, expected an integer");
    assert_int_equal(zi_gguf_get_u32(g, "t.f32", &u, &err), ZI_EFORMAT);
    assert_int_equal(zi_gguf_get_u32(g, "t.bool", &u, &err), ZI_EFORMAT);
    assert_int_equal(zi_gguf_get_u32(g, "a.u32", &u, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key a.u32 has type array of uint32, expected an integer");
    assert_int_equal(zi_gguf_get_u32(g, "nope", &u, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "missing key nope");
    assert_int_equal(zi_gguf_get_u32_or(g, "nope", 9, &u, &err), ZI_OK);
    assert_int_equal(u, 9);
    assert_int_equal(zi_gguf_get_u32_or(g, "t.u8", 9, &u, &err), ZI_OK);
    assert_int_equal(u, 200);
    assert_int_equal(zi_gguf_get_u32_or(g, "t.str", 9, &u, &err), ZI_EFORMAT);

    int64_t i;
    assert_int_equal(zi_gguf_get_i64(g, "t.i8", &i, &err), ZI_OK);
    assert_int_equal(i, -100);
    assert_int_equal(zi_gguf_get_i64(g, "t.i16", &i, &err), ZI_OK);
    assert_int_equal(i, -30000);
    assert_int_equal(zi_gguf_get_i64(g, "t.i32", &i, &err), ZI_OK);
    assert_int_equal(i, -2000000000);
    assert_int_equal(zi_gguf_get_i64(g, "t.i64", &i, &err), ZI_OK);
    assert_true(i == -5000000000ll);
    assert_int_equal(zi_gguf_get_i64(g, "t.u32", &i, &err), ZI_OK);
    assert_int_equal(i, 4000000000ll);
    assert_int_equal(zi_gguf_get_i64(g, "t.u64", &i, &err), ZI_EFORMAT);
    assert_string_equal(err.msg,
                        "key t.u64 has value 18446744073709551600, which does not fit int64");
    assert_int_equal(zi_gguf_get_i64(g, "t.f64", &i, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.f64 has type float64, expected an integer");
    assert_int_equal(zi_gguf_get_i64(g, "nope", &i, &err), ZI_EINVAL);

    float f;
    assert_int_equal(zi_gguf_get_f32(g, "t.f32", &f, &err), ZI_OK);
    assert_true(f == 1.5f);
    assert_int_equal(zi_gguf_get_f32(g, "t.f64", &f, &err), ZI_OK);
    assert_true(f == 2.25f);
    assert_int_equal(zi_gguf_get_f32(g, "t.u32", &f, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.u32 has type uint32, expected float32 or float64");
    assert_int_equal(zi_gguf_get_f32(g, "nope", &f, &err), ZI_EINVAL);
    assert_int_equal(zi_gguf_get_f32_or(g, "nope", 0.25f, &f, &err), ZI_OK);
    assert_true(f == 0.25f);
    assert_int_equal(zi_gguf_get_f32_or(g, "t.f32", 0.25f, &f, &err), ZI_OK);
    assert_true(f == 1.5f);
    assert_int_equal(zi_gguf_get_f32_or(g, "t.i8", 0.25f, &f, &err), ZI_EFORMAT);

    int bv;
    assert_int_equal(zi_gguf_get_bool_or(g, "t.bool", 0, &bv, &err), ZI_OK);
    assert_int_equal(bv, 1);
    assert_int_equal(zi_gguf_get_bool_or(g, "t.bool_false", 1, &bv, &err), ZI_OK);
    assert_int_equal(bv, 0);
    assert_int_equal(zi_gguf_get_bool_or(g, "nope", 1, &bv, &err), ZI_OK);
    assert_int_equal(bv, 1);
    assert_int_equal(zi_gguf_get_bool_or(g, "t.u8", 0, &bv, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key t.u8 has type uint8, expected bool");

    zi_str s;
    assert_int_equal(zi_gguf_get_str(g, "t.str", &s, &err), ZI_OK);
    assert_str(s, "hello, gguf");
    assert_int_equal(zi_gguf_get_str(g, "a.str", &s, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key a.str has type array of string, expected string");
    assert_int_equal(zi_gguf_get_str(g, "nope", &s, &err), ZI_EINVAL);

    zi_str *sv = (zi_str *)1;
    uint64_t n = 5;
    assert_int_equal(zi_gguf_get_str_array(g, "a.i32", &sv, &n, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key a.i32 has type array of int32, expected array of string");
    assert_null(sv);
    assert_int_equal(n, 0);
    assert_int_equal(zi_gguf_get_str_array(g, "t.str", &sv, &n, &err), ZI_EFORMAT);
    assert_int_equal(zi_gguf_get_str_array(g, "nope", &sv, &n, &err), ZI_EINVAL);

    const void *data;
    assert_int_equal(zi_gguf_get_array(g, "a.i32", ZI_GGUF_UINT32, &data, &n, &err), ZI_EFORMAT);
    assert_string_equal(err.msg, "key a.i32 has type array of int32, expected array of uint32");
    assert_int_equal(zi_gguf_get_array(g, "t.u32", ZI_GGUF_UINT32, &data, &n, &err), ZI_EFORMAT);
    assert_int_equal(zi_gguf_get_array(g, "a.str", ZI_GGUF_STRING, &data, &n, &err), ZI_EINVAL);
    assert_int_equal(zi_gguf_get_array(g, "a.arr", ZI_GGUF_ARRAY, &data, &n, &err), ZI_EINVAL);
    assert_int_equal(zi_gguf_get_array(g, "nope", ZI_GGUF_UINT8, &data, &n, &err), ZI_EINVAL);

    zi_gguf_close(g);
    free(keep);
    free(b.p);
}

/* ---- the real model ------------------------------------------------------------ */

static void test_real_model(void **state) {
    (void)state;
    const char *path = getenv("ZINFER_MODEL");
    if (!path || !*path) path = DEFAULT_MODEL;
    struct stat st;
    if (stat(path, &st) != 0) {
        print_message("model %s absent; skipping\n", path);
        skip();
    }
    zi_gguf *g;
    zi_error err;
    int rc = zi_gguf_open(path, &g, &err);
    if (rc) fail_msg("open %s: %s", path, err.msg);
    assert_int_equal(zi_gguf_version(g), 3);
    assert_int_equal(zi_gguf_alignment(g), 32);
    assert_int_equal(zi_gguf_tensor_count(g), 272);
    uint32_t u;
    assert_int_equal(zi_gguf_get_u32(g, "llama.block_count", &u, &err), ZI_OK);
    assert_int_equal(u, 30);
    assert_int_equal(zi_gguf_get_u32(g, "llama.embedding_length", &u, &err), ZI_OK);
    assert_int_equal(u, 576);
    zi_str s;
    assert_int_equal(zi_gguf_get_str(g, "general.architecture", &s, &err), ZI_OK);
    assert_str(s, "llama");
    assert_int_equal(zi_gguf_get_str(g, "tokenizer.ggml.model", &s, &err), ZI_OK);
    assert_str(s, "gpt2");
    assert_int_equal(zi_gguf_get_str(g, "tokenizer.ggml.pre", &s, &err), ZI_OK);
    assert_str(s, "smollm");
    zi_str *toks;
    uint64_t n;
    assert_int_equal(zi_gguf_get_str_array(g, "tokenizer.ggml.tokens", &toks, &n, &err), ZI_OK);
    assert_int_equal(n, 49152);
    free(toks);
    assert_int_equal(zi_gguf_get_str_array(g, "tokenizer.ggml.merges", &toks, &n, &err), ZI_OK);
    assert_int_equal(n, 48900);
    free(toks);
    const void *tt;
    assert_int_equal(
        zi_gguf_get_array(g, "tokenizer.ggml.token_type", ZI_GGUF_INT32, &tt, &n, &err), ZI_OK);
    assert_int_equal(n, 49152);

    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, "token_embd.weight");
    assert_non_null(t);
    assert_int_equal(t->type, ZI_TYPE_Q8_0);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 576);
    assert_int_equal(t->ne[1], 49152);
    assert_int_equal(t->nbytes, 576 / 32 * 34 * 49152);
    t = zi_gguf_find_tensor(g, "blk.0.attn_q.weight");
    assert_non_null(t);
    assert_int_equal(t->type, ZI_TYPE_Q4_1);
    assert_int_equal(t->ne[0], 576);
    assert_int_equal(t->ne[1], 576);
    assert_int_equal(t->nbytes, 576 / 32 * 20 * 576);
    t = zi_gguf_find_tensor(g, "blk.0.attn_norm.weight");
    assert_non_null(t);
    assert_int_equal(t->type, ZI_TYPE_F32);
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->nbytes, 576 * 4);
    size_t counts[31] = {0};
    for (uint64_t k = 0; k < zi_gguf_tensor_count(g); k++) {
        t = zi_gguf_tensor_at(g, k);
        counts[t->type]++;
        assert_int_equal((uintptr_t)t->data % 32, 0);
    }
    assert_int_equal(counts[ZI_TYPE_Q4_1], 210);
    assert_int_equal(counts[ZI_TYPE_F32], 61);
    assert_int_equal(counts[ZI_TYPE_Q8_0], 1);
    zi_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_v3),
        cmocka_unit_test(test_valid_v2),
        cmocka_unit_test(test_valid_v3_align64),
        cmocka_unit_test(test_valid_v2_align1),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_truncation_v3),
        cmocka_unit_test(test_truncation_v2_align16),
        cmocka_unit_test(test_truncation_message),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_string_past_eof),
        cmocka_unit_test(test_invalid_type_tag),
        cmocka_unit_test(test_deep_arrays),
        cmocka_unit_test(test_tensor_shapes),
        cmocka_unit_test(test_tensor_placement),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_message_names),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests_name("gguf", tests, NULL, NULL);
}
