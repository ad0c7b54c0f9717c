/*
 * gguf_writer.h - a small GGUF writer for tests: test_gguf.c builds valid
 * and broken files with it, test_tokenizer.c synthetic vocabularies, and
 * tests/fuzz/fuzz_gguf_replay.c its seed file. Bytes go to a growing
 * buffer, little-endian as the format says; the caller frees b.p. A header
 * of static functions (test code only; needs cmocka.h included first).
 */
#ifndef ZI_TEST_GGUF_WRITER_H
#define ZI_TEST_GGUF_WRITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static inline void w_bytes(wbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
/* The low `bytes` bytes of v, least significant first. */
static inline void w_le(wbuf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        uint8_t x = (uint8_t)(v >> (8 * i));
        w_bytes(b, &x, 1);
    }
}
static inline void w_u8(wbuf *b, uint8_t v) {
    w_le(b, v, 1);
}
static inline void w_u16(wbuf *b, uint16_t v) {
    w_le(b, v, 2);
}
static inline void w_u32(wbuf *b, uint32_t v) {
    w_le(b, v, 4);
}
static inline void w_u64(wbuf *b, uint64_t v) {
    w_le(b, v, 8);
}
static inline void w_f32(wbuf *b, float f) {
    uint32_t v;
    memcpy(&v, &f, 4);
    w_u32(b, v);
}
static inline void w_f64(wbuf *b, double f) {
    uint64_t v;
    memcpy(&v, &f, 8);
    w_u64(b, v);
}
static inline void w_str(wbuf *b, const char *s) {
    w_u64(b, strlen(s));
    w_bytes(b, s, strlen(s));
}
static inline void w_key(wbuf *b, const char *key, uint32_t type) {
    w_str(b, key);
    w_u32(b, type);
}
static inline void w_header(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    w_bytes(b, "GGUF", 4);
    w_u32(b, version);
    w_u64(b, n_tensors);
    w_u64(b, n_kv);
}
/* A tensor info: name, dimensions, type, offset in the data section. */
static inline void w_tinfo(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                           uint32_t type, uint64_t offset) {
    w_str(b, name);
    w_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++) w_u64(b, ne[i]);
    w_u32(b, type);
    w_u64(b, offset);
}
static inline void w_pad(wbuf *b, size_t align) {
    while (b->n % align) w_u8(b, 0);
}
static inline void w_zeros(wbuf *b, size_t n) {
    for (size_t i = 0; i < n; i++) w_u8(b, 0);
}

/* Whole key-value pairs of the common kinds. */
static inline void kv_str(wbuf *b, const char *k, const char *v) {
    w_key(b, k, ZI_GGUF_STRING);
    w_str(b, v);
}
static inline void kv_u32(wbuf *b, const char *k, uint32_t v) {
    w_key(b, k, ZI_GGUF_UINT32);
    w_u32(b, v);
}
static inline void kv_bool(wbuf *b, const char *k, int v) {
    w_key(b, k, ZI_GGUF_BOOL);
    w_u8(b, (uint8_t)(v != 0));
}
static inline void kv_strs(wbuf *b, const char *k, const char *const *v, size_t n) {
    w_key(b, k, ZI_GGUF_ARRAY);
    w_u32(b, ZI_GGUF_STRING);
    w_u64(b, n);
    for (size_t i = 0; i < n; i++) w_str(b, v[i]);
}
static inline void kv_i32s(wbuf *b, const char *k, const int32_t *v, size_t n) {
    w_key(b, k, ZI_GGUF_ARRAY);
    w_u32(b, ZI_GGUF_INT32);
    w_u64(b, n);
    for (size_t i = 0; i < n; i++) w_u32(b, (uint32_t)v[i]);
}

/* A version-3 file of one tensor with the given shape, type and offset,
 * its data padded to cover data_bytes. */
static inline void one_tensor(wbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne,
                              uint32_t type, uint64_t offset, size_t data_bytes) {
    w_header(b, 3, 1, 0);
    w_tinfo(b, name, n_dims, ne, type, offset);
    w_pad(b, 32);
    w_zeros(b, data_bytes);
}

#endif
