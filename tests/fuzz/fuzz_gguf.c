/*
 * fuzz_gguf.c - libFuzzer entry point for the GGUF reader.
 *
 * Opens the input with zi_gguf_open_memory and, when it opens, walks every
 * metadata entry, tensor and typed getter, checking the promises gguf.h
 * makes: every pointer handed out lies inside the input, counts and shapes
 * are in range, lookups find what iteration found. A broken promise calls
 * __builtin_trap(), which libFuzzer (and the replay test,
 * fuzz_gguf_replay.c, which links this same file) reports as a crash. A
 * failed open must leave a non-empty one-line message and no object.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

struct walk {
    const uint8_t *base;
    size_t size;
    unsigned sum; /* folds in every byte read so reads are not optimized out */
};

/* True when [p, p+n) lies inside the input. */
static int inside(const struct walk *w, const void *p, uint64_t n) {
    const uint8_t *q = p;
    if (q < w->base || q > w->base + w->size) return 0;
    return n <= (uint64_t)(w->size - (size_t)(q - w->base));
}

static void touch(struct walk *w, const void *p, uint64_t n) {
    CHECK(inside(w, p, n));
    const uint8_t *q = p;
    for (uint64_t i = 0; i < n; i++) w->sum += q[i];
}

static uint64_t ld64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t fixed_size(uint32_t t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < 13 ? sz[t] : 0;
}

/* Walks n array elements of type t at p (which the reader validated),
 * checking each lies inside the input; returns the end pointer. */
static const uint8_t *walk_array(struct walk *w, uint32_t t, uint64_t n, const uint8_t *p,
                                 int depth) {
    CHECK(depth <= 8);
    size_t fs = fixed_size(t);
    if (fs) {
        CHECK(n <= w->size / fs);
        touch(w, p, n * fs);
        if (t == 7)
            for (uint64_t i = 0; i < n; i++) CHECK(p[i] <= 1);
        return p + n * fs;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (t == 8) {
            CHECK(inside(w, p, 8));
            uint64_t len = ld64(p);
            touch(w, p + 8, len);
            p += 8 + len;
        } else {
            CHECK(t == 9);
            CHECK(inside(w, p, 12));
            uint32_t et = ld32(p);
            uint64_t en = ld64(p + 4);
            CHECK(et <= 12);
            p = walk_array(w, et, en, p + 12, depth + 1);
        }
    }
    return p;
}

/* A NUL-terminated copy of s, or NULL when s holds a NUL (such a name
 * cannot be looked up by C string). */
static char *cstr(zi_str s) {
    if (memchr(s.ptr, 0, s.len)) return NULL;
    char *c = malloc(s.len + 1);
    if (!c) return NULL;
    memcpy(c, s.ptr, s.len);
    c[s.len] = '\0';
    return c;
}

static void call_getters(struct walk *w, const zi_gguf *g, const zi_gguf_kv *kv, const char *k) {
    zi_error err;
    uint32_t u;
    int64_t i;
    float f;
    int b;
    zi_str s;
    int rc;
    rc = zi_gguf_get_u32(g, k, &u, &err);
    CHECK(rc == ZI_OK || rc == ZI_EFORMAT);
    if (rc == ZI_OK) w->sum += u;
    rc = zi_gguf_get_u32_or(g, k, 7, &u, &err);
    CHECK(rc == ZI_OK || rc == ZI_EFORMAT);
    rc = zi_gguf_get_i64(g, k, &i, &err);
    CHECK(rc == ZI_OK || rc == ZI_EFORMAT);
    if (rc == ZI_OK) w->sum += (unsigned)i;
    rc = zi_gguf_get_f32(g, k, &f, &err);
    CHECK(rc == ZI_OK || rc == ZI_EFORMAT);
    CHECK((rc == ZI_OK) == (kv->type == ZI_GGUF_FLOAT32 || kv->type == ZI_GGUF_FLOAT64));
    rc = zi_gguf_get_f32_or(g, k, 1.0f, &f, &err);
    CHECK(rc == ZI_OK || rc == ZI_EFORMAT);
    rc = zi_gguf_get_bool_or(g, k, 0, &b, &err);
    CHECK((rc == ZI_OK) == (kv->type == ZI_GGUF_BOOL));
    if (rc == ZI_OK) CHECK(b == 0 || b == 1);
    rc = zi_gguf_get_str(g, k, &s, &err);
    CHECK((rc == ZI_OK) == (kv->type == ZI_GGUF_STRING));
    if (rc == ZI_OK) touch(w, s.ptr, s.len);

    zi_str *v;
    uint64_t n;
    rc = zi_gguf_get_str_array(g, k, &v, &n, &err);
    CHECK((rc == ZI_OK) == (kv->type == ZI_GGUF_ARRAY && kv->arr_type == ZI_GGUF_STRING));
    if (rc == ZI_OK) {
        CHECK(n == kv->arr_len);
        for (uint64_t j = 0; j < n; j++) touch(w, v[j].ptr, v[j].len);
        free(v);
    }
    for (uint32_t t = 0; t <= 12; t++) {
        const void *d;
        rc = zi_gguf_get_array(g, k, (zi_gguf_type)t, &d, &n, &err);
        if (!fixed_size(t)) {
            CHECK(rc == ZI_EINVAL);
            continue;
        }
        CHECK((rc == ZI_OK) == (kv->type == ZI_GGUF_ARRAY && kv->arr_type == t));
        if (rc == ZI_OK) touch(w, d, n * fixed_size(t));
    }
}

static void walk_kv(struct walk *w, const zi_gguf *g, const zi_gguf_kv *kv) {
    touch(w, kv->key.ptr, kv->key.len);
    CHECK(kv->key.len > 0);
    CHECK((unsigned)kv->type <= 12);
    CHECK(zi_gguf_type_name(kv->type)[0] != '?');
    switch (kv->type) {
    case ZI_GGUF_STRING:
        touch(w, kv->str.ptr, kv->str.len);
        CHECK(kv->data == (const uint8_t *)kv->str.ptr);
        break;
    case ZI_GGUF_ARRAY:
        CHECK((unsigned)kv->arr_type <= 12);
        walk_array(w, kv->arr_type, kv->arr_len, kv->data, 1);
        break;
    default:
        touch(w, kv->data, fixed_size(kv->type));
        break;
    }
    char *k = cstr(kv->key);
    if (k) {
        CHECK(zi_gguf_find_kv(g, k) == kv); /* keys are unique */
        call_getters(w, g, kv, k);
        free(k);
    }
}

static void walk_tensor(struct walk *w, const zi_gguf *g, const zi_gguf_tensor *t) {
    touch(w, t->name.ptr, t->name.len);
    CHECK(t->name.len > 0);
    CHECK(t->n_dims >= 1 && t->n_dims <= ZI_GGUF_MAX_DIMS);
    uint64_t rows = 1;
    for (uint32_t d = 0; d < ZI_GGUF_MAX_DIMS; d++) {
        CHECK(t->ne[d] >= 0);
        if (d >= t->n_dims) CHECK(t->ne[d] == 1);
        if (d > 0) {
            CHECK(rows == 0 || (uint64_t)t->ne[d] <= UINT64_MAX / rows);
            rows *= (uint64_t)t->ne[d];
        }
    }
    size_t be = zi_ggml_type_block_elems(t->type), bb = zi_ggml_type_block_bytes(t->type);
    CHECK(be > 0 && bb > 0);
    CHECK(zi_ggml_type_name(t->type)[0] != '?');
    CHECK((uint64_t)t->ne[0] % be == 0);
    CHECK(t->nbytes == (uint64_t)t->ne[0] / be * bb * rows);
    CHECK(t->offset % zi_gguf_alignment(g) == 0);
    CHECK(inside(w, t->data, t->nbytes));
    if (t->nbytes) {
        const uint8_t *p = t->data;
        w->sum += p[0] + p[t->nbytes - 1];
    }
    char *n = cstr(t->name);
    if (n) {
        CHECK(zi_gguf_find_tensor(g, n) == t);
        free(n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_gguf *g = NULL;
    zi_error err;
    zi_error_clear(&err);
    int rc = zi_gguf_open_memory(data, size, &g, &err);
    if (rc != ZI_OK) {
        CHECK(g == NULL);
        CHECK(rc < 0 && err.code == rc);
        size_t len = strnlen(err.msg, sizeof err.msg);
        CHECK(len > 0 && len < sizeof err.msg);
        CHECK(!memchr(err.msg, '\n', len));
        return 0;
    }
    CHECK(g != NULL && err.code == ZI_OK);
    struct walk w = {data, size, 0};
    uint32_t v = zi_gguf_version(g), a = zi_gguf_alignment(g);
    CHECK(v == 2 || v == 3);
    CHECK(a != 0 && (a & (a - 1)) == 0);
    CHECK(zi_gguf_file_size(g) == size);
    uint64_t nkv = zi_gguf_kv_count(g), nt = zi_gguf_tensor_count(g);
    CHECK(zi_gguf_kv_at(g, nkv) == NULL && zi_gguf_tensor_at(g, nt) == NULL);
    for (uint64_t i = 0; i < nkv; i++) walk_kv(&w, g, zi_gguf_kv_at(g, i));
    for (uint64_t i = 0; i < nt; i++) walk_tensor(&w, g, zi_gguf_tensor_at(g, i));
    CHECK(zi_gguf_find_kv(g, "") == NULL);
    zi_gguf_close(g);
    volatile unsigned sink = w.sum;
    (void)sink;
    return 0;
}
