/*
 * codec_fields.c - the decoder's field readers (codec_internal.h): the key
 * path that every error message starts with, map matching, and the typed
 * reads of integers, floats, strings, token and float arrays and opaque
 * values, each refusing what its field may not hold.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "utf8.h"

void zi_dec_init(zi_dec *d, const zi_codec_limits *lim, const char *path, const char *root,
                 zi_error *err) {
    d->lim = lim;
    d->err = err;
    d->root = root;
    memset(&d->path, 0, sizeof d->path);
    if (path && *path) zi_keypath_push(&d->path, "%s", path);
}

size_t zi_dec_push_key(zi_dec *d, const char *k) {
    return zi_keypath_push(&d->path, "%s%s", d->path.n ? "." : "", k);
}

/* A key from the client (quoted as zi_printable does). */
static size_t push_client_key(zi_dec *d, const msgpack_object *k) {
    return zi_keypath_push_key(&d->path, d->path.n ? "." : "", k->via.str.ptr, k->via.str.size);
}

size_t zi_dec_push_idx(zi_dec *d, size_t i) {
    return zi_keypath_push(&d->path, "[%zu]", i);
}

void zi_dec_pop(zi_dec *d, size_t old) {
    zi_keypath_pop(&d->path, old);
}

static int vfail(zi_dec *d, int code, const char *fmt, va_list ap) {
    char msg[ZI_ERROR_MSG_MAX];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return zi_error_set(d->err, code, "%s: %s", d->path.n ? d->path.s : d->root, msg);
}

int zi_dec_fail(zi_dec *d, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(d, code, fmt, ap);
    va_end(ap);
    return rc;
}

int zi_dec_fail_at(zi_dec *d, const char *name, int code, const char *fmt, ...) {
    size_t old = zi_dec_push_key(d, name);
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(d, code, fmt, ap);
    va_end(ap);
    zi_dec_pop(d, old);
    return rc;
}

int zi_dec_wrong_type(zi_dec *d, const msgpack_object *o, const char *want) {
    return zi_dec_fail(d, ZI_EINVAL, "expected %s, got %s", want, zi_msgpack_type_name(o));
}

int zi_dec_read_map(zi_dec *d, const msgpack_object *o, const char *const *names, size_t nf,
                    size_t nreq, const msgpack_object **vals) {
    if (o->type != MSGPACK_OBJECT_MAP) return zi_dec_wrong_type(d, o, "a map");
    for (size_t i = 0; i < nf; i++) vals[i] = NULL;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return zi_dec_fail(d, ZI_EINVAL, "map key #%u is %s, not a string", i,
                               zi_msgpack_type_name(k));
        size_t f = 0;
        while (f < nf && !zi_dec_is_key(k, names[f])) f++;
        if (f == nf) {
            size_t old = push_client_key(d, k);
            int rc = zi_dec_fail(d, ZI_EINVAL, "unknown field");
            zi_dec_pop(d, old);
            return rc;
        }
        if (vals[f]) return zi_dec_fail_at(d, names[f], ZI_EINVAL, "duplicate field");
        vals[f] = &o->via.map.ptr[i].val;
    }
    for (size_t i = 0; i < nreq; i++)
        if (!vals[i]) return zi_dec_missing(d, names[i]);
    return ZI_OK;
}

int zi_dec_missing(zi_dec *d, const char *name) {
    return zi_dec_fail_at(d, name, ZI_EINVAL, "missing required field");
}

int zi_dec_sized(zi_dec *d, const msgpack_object *o, msgpack_object_type t, const char *want,
                 const char *noun, size_t max) {
    if (o->type != t) return zi_dec_wrong_type(d, o, want);
    uint32_t n = t == MSGPACK_OBJECT_MAP ? o->via.map.size : o->via.array.size;
    if (n > max) return zi_dec_fail(d, ZI_EINVAL, "%u %s exceed the limit of %zu", n, noun, max);
    return ZI_OK;
}

int zi_dec_bool(zi_dec *d, const msgpack_object *o, bool *out) {
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return zi_dec_wrong_type(d, o, "a boolean");
    *out = o->via.boolean;
    return ZI_OK;
}

int zi_dec_i64(zi_dec *d, const msgpack_object *o, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)hi)
            return zi_dec_fail(d, ZI_EINVAL, "%llu is outside [%lld, %lld]",
                               (unsigned long long)o->via.u64, (long long)lo, (long long)hi);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return zi_dec_wrong_type(d, o, "an integer");
    }
    if (v < lo || v > hi)
        return zi_dec_fail(d, ZI_EINVAL, "%lld is outside [%lld, %lld]", (long long)v,
                           (long long)lo, (long long)hi);
    *out = v;
    return ZI_OK;
}

/* A number (integers are accepted where floats are meant, as Python does);
 * NaN and infinities pass here and are judged by the type's validator. */
int zi_dec_f64(zi_dec *d, const msgpack_object *o, double *out) {
    switch (o->type) {
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        *out = o->via.f64;
        return ZI_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        *out = (double)o->via.u64;
        return ZI_OK;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        *out = (double)o->via.i64;
        return ZI_OK;
    default:
        return zi_dec_wrong_type(d, o, "a number");
    }
}

/* Checks a msgpack str: length limit, UTF-8, flags. */
int zi_dec_check_str(zi_dec *d, const msgpack_object *o, int flags) {
    if (o->type != MSGPACK_OBJECT_STR) return zi_dec_wrong_type(d, o, "a string");
    size_t n = o->via.str.size;
    size_t max = (flags & ZI_STR_ID) ? ZI_CODEC_ID_MAX_BYTES : d->lim->max_string_bytes;
    if (n > max)
        return zi_dec_fail(d, ZI_EINVAL, "string of %zu bytes exceeds the limit of %zu", n, max);
    if ((flags & ZI_STR_NONEMPTY) && n == 0) return zi_dec_fail(d, ZI_EINVAL, "must not be empty");
    size_t bad = zi_utf8_bad_at(o->via.str.ptr, n);
    if (bad < n) return zi_dec_fail(d, ZI_EINVAL, "invalid UTF-8 at byte %zu", bad);
    if ((flags & ZI_STR_NO_NUL) && n && memchr(o->via.str.ptr, 0, n))
        return zi_dec_fail(d, ZI_EINVAL, "contains a NUL byte");
    return ZI_OK;
}

int zi_dec_str(zi_dec *d, const msgpack_object *o, int flags, zi_string *out) {
    int rc = zi_dec_check_str(d, o, flags);
    if (rc) return rc;
    if (zi_string_set(out, o->via.str.ptr, o->via.str.size, NULL))
        return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    return ZI_OK;
}

/* A list of strings; `single` also accepts one string (the request's stop). */
int zi_dec_str_list(zi_dec *d, const msgpack_object *o, int flags, bool single, zi_str_list *out) {
    if (single && o->type == MSGPACK_OBJECT_STR) {
        int rc = zi_dec_check_str(d, o, flags);
        if (rc) return rc;
        if (zi_str_list_push(out, o->via.str.ptr, o->via.str.size, NULL))
            return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
        return ZI_OK;
    }
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY,
                          single ? "a string or an array of strings" : "an array of strings",
                          "entries", d->lim->max_items);
    if (rc) return rc;
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        size_t old = zi_dec_push_idx(d, i);
        const msgpack_object *e = &o->via.array.ptr[i];
        rc = zi_dec_check_str(d, e, flags);
        if (!rc && zi_str_list_push(out, e->via.str.ptr, e->via.str.size, NULL))
            rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
        zi_dec_pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

/* numpy-style array header: returns the data pointer, count and dtype. */
enum { DT_INT64 = 1, DT_INT32 = 2, DT_FLOAT32 = 4 };

static int get_np(zi_dec *d, const msgpack_object *o, int allowed, size_t limit, int *dtype,
                  const uint8_t **data, size_t *n) {
    static const char *const names[] = {"__np__", "dtype", "shape", "data"};
    const msgpack_object *v[4];
    int rc = zi_dec_read_map(d, o, names, 4, 4, v);
    if (rc) return rc;
    if (v[0]->type != MSGPACK_OBJECT_BOOLEAN || !v[0]->via.boolean)
        return zi_dec_fail_at(d, "__np__", ZI_EINVAL, "must be true");
    size_t old = zi_dec_push_key(d, "dtype");
    size_t item = 0;
    if (!(rc = zi_dec_check_str(d, v[1], ZI_STR_ID))) {
        const char *s = v[1]->via.str.ptr;
        size_t sl = v[1]->via.str.size;
        if ((allowed & DT_INT64) && sl == 5 && !memcmp(s, "int64", 5))
            *dtype = DT_INT64, item = 8;
        else if ((allowed & DT_INT32) && sl == 5 && !memcmp(s, "int32", 5))
            *dtype = DT_INT32, item = 4;
        else if ((allowed & DT_FLOAT32) && sl == 7 && !memcmp(s, "float32", 7))
            *dtype = DT_FLOAT32, item = 4;
        else {
            char nm[80];
            zi_printable(nm, sizeof nm, s, sl);
            rc = zi_dec_fail(d, ZI_EINVAL, "\"%s\" is not accepted here (expected %s)", nm,
                             allowed & DT_FLOAT32 ? "float32" : "int64 or int32");
        }
    }
    zi_dec_pop(d, old);
    if (rc) return rc;
    old = zi_dec_push_key(d, "shape");
    int64_t count = 0;
    if (v[2]->type != MSGPACK_OBJECT_ARRAY || v[2]->via.array.size != 1) {
        rc = v[2]->type != MSGPACK_OBJECT_ARRAY
                 ? zi_dec_wrong_type(d, v[2], "an array")
                 : zi_dec_fail(d, ZI_EINVAL, "must have one dimension, got %u",
                               v[2]->via.array.size);
    } else {
        size_t o2 = zi_dec_push_idx(d, 0);
        rc = zi_dec_i64(d, &v[2]->via.array.ptr[0], 0, INT64_MAX, &count);
        if (!rc && (uint64_t)count > limit)
            rc = zi_dec_fail(d, ZI_EINVAL, "%lld elements exceed the limit of %zu",
                             (long long)count, limit);
        /* A bin holds at most 2^32-1 bytes; refusing larger shapes here also
         * keeps count * itemsize from wrapping below. */
        if (!rc && (uint64_t)count > UINT32_MAX / 8)
            rc = zi_dec_fail(d, ZI_EINVAL, "%lld elements cannot fit in one msgpack bin",
                             (long long)count);
        zi_dec_pop(d, o2);
    }
    zi_dec_pop(d, old);
    if (rc) return rc;
    old = zi_dec_push_key(d, "data");
    if (v[3]->type != MSGPACK_OBJECT_BIN)
        rc = zi_dec_wrong_type(d, v[3], "binary data");
    else if (v[3]->via.bin.size != (uint64_t)count * item)
        rc = zi_dec_fail(d, ZI_EINVAL, "%u bytes do not match shape [%lld] of %zu-byte elements",
                         v[3]->via.bin.size, (long long)count, item);
    zi_dec_pop(d, old);
    if (rc) return rc;
    *data = (const uint8_t *)v[3]->via.bin.ptr;
    *n = (size_t)count;
    return ZI_OK;
}

static uint64_t le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | p[i];
    return v;
}

/* A number array's head, numpy or plain, and room for its results. */
typedef struct numbers {
    int dtype;           /* DT_*, or 0 for a plain msgpack array */
    const uint8_t *data; /* numpy's little-endian bytes (dtype != 0) */
    size_t n;
    void *buf; /* room for the n results, malloc'd; NULL when n is 0 */
} numbers;

/* A number array, numpy (a map; dtypes in `allowed`) or plain, of at
 * most max_tokens entries, with room for n results of `size` bytes each.
 * noun names the entries in the messages, want the expected type. */
static int get_numbers(zi_dec *d, const msgpack_object *o, int allowed, const char *noun,
                       const char *want, size_t size, numbers *a) {
    memset(a, 0, sizeof *a);
    int rc;
    if (o->type == MSGPACK_OBJECT_MAP)
        rc = get_np(d, o, allowed, d->lim->max_tokens, &a->dtype, &a->data, &a->n);
    else if (!(rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY, want, noun, d->lim->max_tokens)))
        a->n = o->via.array.size;
    if (rc || a->n == 0) return rc;
    if (!(a->buf = malloc(a->n * size)))
        return zi_dec_fail(d, ZI_ENOMEM, "out of memory (%zu %s)", a->n, noun);
    return ZI_OK;
}

static int dec_ids(zi_dec *d, const msgpack_object *o, int64_t lo, int32_t **ids_out,
                   size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    numbers a;
    int rc = get_numbers(d, o, DT_INT64 | DT_INT32, "tokens", "an array of token ids",
                         sizeof(int32_t), &a);
    if (rc) return rc;
    int32_t *ids = a.buf;
    for (size_t i = 0; i < a.n; i++) {
        int64_t v;
        if (a.dtype == DT_INT64)
            v = (int64_t)le(a.data + 8 * i, 8);
        else if (a.dtype == DT_INT32)
            v = (int32_t)(uint32_t)le(a.data + 4 * i, 4);
        else {
            size_t old = zi_dec_push_idx(d, i);
            rc = zi_dec_i64(d, &o->via.array.ptr[i], lo, INT32_MAX, &v);
            zi_dec_pop(d, old);
            if (rc) {
                free(ids);
                return rc;
            }
        }
        if (v < lo || v > INT32_MAX) {
            size_t old = zi_dec_push_idx(d, i);
            rc = zi_dec_fail(d, ZI_EINVAL, "token id %lld is outside [%lld, %d]", (long long)v,
                             (long long)lo, INT32_MAX);
            zi_dec_pop(d, old);
            free(ids);
            return rc;
        }
        ids[i] = (int32_t)v;
    }
    *ids_out = ids;
    *n_out = a.n;
    return ZI_OK;
}

int zi_dec_tokens(zi_dec *d, const msgpack_object *o, int32_t **ids_out, size_t *n_out) {
    return dec_ids(d, o, 0, ids_out, n_out);
}

int zi_dec_tokens_any(zi_dec *d, const msgpack_object *o, int32_t **ids_out, size_t *n_out) {
    return dec_ids(d, o, INT32_MIN, ids_out, n_out);
}

int zi_codec_decode_tokens(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                           int32_t **ids, size_t *n, zi_error *err) {
    if (!o || !ids || !n) return zi_error_set(err, ZI_EINVAL, "tokens: NULL pointer");
    zi_codec_limits tmp;
    zi_dec d;
    zi_dec_init(&d, zi_codec_limits_or_default(lim, &tmp), path, "tokens", err);
    return zi_dec_tokens(&d, o, ids, n);
}

int zi_dec_i32_list(zi_dec *d, const msgpack_object *o, zi_i32_list *out) {
    int32_t *ids;
    size_t n;
    int rc = zi_dec_tokens(d, o, &ids, &n);
    if (rc) return rc;
    zi_i32_list_free(out);
    out->v = ids;
    out->n = n;
    return ZI_OK;
}

/* Floats from numpy float32 or a plain array of numbers. */
int zi_dec_f32(zi_dec *d, const msgpack_object *o, float **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    numbers a;
    int rc = get_numbers(d, o, DT_FLOAT32, "values", "an array of numbers", sizeof(float), &a);
    if (rc) return rc;
    float *v = a.buf;
    for (size_t i = 0; i < a.n; i++) {
        if (a.dtype) {
            uint32_t bits = (uint32_t)le(a.data + 4 * i, 4);
            memcpy(&v[i], &bits, 4);
        } else {
            double x = 0.0;
            size_t old = zi_dec_push_idx(d, i);
            rc = zi_dec_f64(d, &o->via.array.ptr[i], &x);
            zi_dec_pop(d, old);
            if (rc) {
                free(v);
                return rc;
            }
            v[i] = (float)x;
        }
    }
    *out = v;
    *n_out = a.n;
    return ZI_OK;
}

/* Checks everything inside an opaque value (tools, response_format, ...):
 * valid strings within limits, no extension types. Depth is already bounded
 * by the pre-scan or, for objects built elsewhere, checked here. */
static int check_opaque(zi_dec *d, const msgpack_object *o, size_t depth) {
    if (depth > zi_codec_depth_cap(d->lim))
        return zi_dec_fail(d, ZI_EINVAL, "nested deeper than %zu levels",
                           zi_codec_depth_cap(d->lim));
    int rc = ZI_OK;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        return zi_dec_check_str(d, o, 0);
    case MSGPACK_OBJECT_EXT:
        return zi_dec_fail(d, ZI_EINVAL, "extension types are not accepted");
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isnan(o->via.f64)) return zi_dec_fail(d, ZI_EINVAL, "NaN is not allowed");
        return ZI_OK;
    case MSGPACK_OBJECT_ARRAY:
        if ((rc = zi_dec_sized(d, o, o->type, "", "entries", d->lim->max_items))) /* type: ok */
            return rc;
        for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
            size_t old = zi_dec_push_idx(d, i);
            rc = check_opaque(d, &o->via.array.ptr[i], depth + 1);
            zi_dec_pop(d, old);
        }
        return rc;
    case MSGPACK_OBJECT_MAP:
        if ((rc = zi_dec_sized(d, o, o->type, "", "entries", d->lim->max_items))) /* type: ok */
            return rc;
        for (uint32_t i = 0; i < o->via.map.size && !rc; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                return zi_dec_fail(d, ZI_EINVAL, "map key #%u is %s, not a string", i,
                                   zi_msgpack_type_name(k));
            if ((rc = zi_dec_check_str(d, k, 0))) return rc;
            size_t old = push_client_key(d, k);
            rc = check_opaque(d, &o->via.map.ptr[i].val, depth + 1);
            zi_dec_pop(d, old);
        }
        return rc;
    default:
        return ZI_OK;
    }
}

/* Re-encodes an opaque value as msgpack bytes. */
int zi_dec_opaque(zi_dec *d, const msgpack_object *o, msgpack_object_type want, const char *what,
                  size_t depth, zi_bytes *out) {
    if (o->type != want) return zi_dec_wrong_type(d, o, what);
    int rc = check_opaque(d, o, depth);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (msgpack_pack_object(&pk, *o) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    }
    rc = zi_bytes_set(out, sb.data, sb.size, NULL);
    msgpack_sbuffer_destroy(&sb);
    return rc ? zi_dec_fail(d, ZI_ENOMEM, "out of memory") : ZI_OK;
}
