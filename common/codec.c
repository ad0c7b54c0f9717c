/*
 * codec.c - see codec.h. Three parts: a non-allocating pre-scan of raw
 * msgpack bytes (zi_msgpack_check), typed decoders over msgpack-c objects
 * that carry the field path for error messages, and encoders.
 */
#include "codec.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "keypath.h"

zi_codec_limits zi_codec_limits_default(void) {
    zi_codec_limits l = {
        .max_tokens = (size_t)1 << 20,
        .max_string_bytes = (size_t)4 << 20,
        .max_depth = 16,
        .max_items = 4096,
        .max_logprobs = 20,
    };
    return l;
}

/* Identifiers (ids, model names, roles) are echoed in logs and replies;
 * keep them short. */
#define ID_MAX_BYTES 256

static const zi_codec_limits *limits_or_default(const zi_codec_limits *lim, zi_codec_limits *tmp) {
    if (lim) return lim;
    *tmp = zi_codec_limits_default();
    return tmp;
}

static size_t depth_cap(const zi_codec_limits *lim) {
    return lim->max_depth > ZI_CODEC_DEPTH_CAP ? ZI_CODEC_DEPTH_CAP : lim->max_depth;
}

/* Index of the first byte that does not start or continue a well-formed
 * UTF-8 sequence (no overlong forms, no surrogates, at most U+10FFFF);
 * n when the whole string is valid. */
static size_t utf8_bad_at(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        uint8_t lo = 0x80, hi = 0xbf;
        if (c >= 0xc2 && c <= 0xdf)
            need = 1;
        else if (c == 0xe0)
            need = 2, lo = 0xa0;
        else if (c >= 0xe1 && c <= 0xec)
            need = 2;
        else if (c == 0xed)
            need = 2, hi = 0x9f;
        else if (c >= 0xee && c <= 0xef)
            need = 2;
        else if (c == 0xf0)
            need = 3, lo = 0x90;
        else if (c >= 0xf1 && c <= 0xf3)
            need = 3;
        else if (c == 0xf4)
            need = 3, hi = 0x8f;
        else
            return i;
        if (n - i <= need) return i;
        if (s[i + 1] < lo || s[i + 1] > hi) return i;
        for (size_t k = 2; k <= need; k++)
            if ((s[i + k] & 0xc0) != 0x80) return i;
        i += need + 1;
    }
    return n;
}

/* ---- pre-scan -------------------------------------------------------------- */

typedef struct scan_frame {
    uint64_t total; /* items (a map has 2 per entry) */
    uint64_t left;
    int is_map;
    const char *key; /* last string key read in this map, for the path */
    uint32_t klen;
} scan_frame;

static void scan_path(char *out, size_t cap, const scan_frame *st, size_t depth) {
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; i < depth && k + 1 < cap; i++) {
        uint64_t pos = st[i].total - st[i].left;
        int n;
        if (st[i].is_map) {
            if (!(pos & 1) || !st[i].key) continue; /* at a key: no name yet */
            char nm[80];
            zi_printable(nm, sizeof nm, st[i].key, st[i].klen);
            n = snprintf(out + k, cap - k, "%s%s", k ? "." : "", nm);
        } else {
            n = snprintf(out + k, cap - k, "[%llu]", (unsigned long long)pos);
        }
        if (n < 0) break;
        k += (size_t)n;
        if (k >= cap) k = cap - 1;
    }
}

static uint64_t be(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

/* One msgpack item's header at p[*off] (past it on return): a container
 * (1 array, 2 map) with count entries, or payload raw bytes after the
 * header (is_str for strings). Returns 0, 1 for a byte that starts no
 * msgpack item (0xc1), 2 for a header cut short. */
typedef struct scan_item {
    uint64_t payload, count;
    int container, is_str;
} scan_item;

static int scan_header(const uint8_t *p, size_t len, size_t *off, scan_item *it) {
    uint8_t b = p[(*off)++];
    size_t hdr = 0; /* bytes of length/value after the tag */
    memset(it, 0, sizeof *it);
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
    } else if (b >= 0x80 && b <= 0x8f) {
        it->container = 2, it->count = b & 0x0f;
    } else if (b >= 0x90 && b <= 0x9f) {
        it->container = 1, it->count = b & 0x0f;
    } else if (b >= 0xa0 && b <= 0xbf) {
        it->is_str = 1, it->payload = b & 0x1f;
    } else {
        switch (b) {
        case 0xc1:
            return 1;
        case 0xc4:
        case 0xc5:
        case 0xc6:
            hdr = (size_t)1 << (b - 0xc4);
            break;
        case 0xc7:
        case 0xc8:
        case 0xc9:
            hdr = (size_t)1 << (b - 0xc7);
            break;
        case 0xca:
            it->payload = 4;
            break;
        case 0xcb:
            it->payload = 8;
            break;
        case 0xcc:
        case 0xcd:
        case 0xce:
        case 0xcf:
            it->payload = (uint64_t)1 << (b - 0xcc);
            break;
        case 0xd0:
        case 0xd1:
        case 0xd2:
        case 0xd3:
            it->payload = (uint64_t)1 << (b - 0xd0);
            break;
        case 0xd4:
        case 0xd5:
        case 0xd6:
        case 0xd7:
        case 0xd8:
            it->payload = 1 + ((uint64_t)1 << (b - 0xd4));
            break;
        case 0xd9:
        case 0xda:
        case 0xdb:
            hdr = (size_t)1 << (b - 0xd9), it->is_str = 1;
            break;
        case 0xdc:
        case 0xdd:
            hdr = (size_t)2 << (b - 0xdc), it->container = 1;
            break;
        case 0xde:
        case 0xdf:
            hdr = (size_t)2 << (b - 0xde), it->container = 2;
            break;
        default:
            break;
        }
        if (hdr) {
            if (len - *off < hdr) return 2;
            uint64_t v = be(p + *off, hdr);
            *off += hdr;
            if (it->container)
                it->count = v;
            else
                it->payload = v + ((b >= 0xc7 && b <= 0xc9) ? 1 : 0); /* ext: + type byte */
        }
    }
    return 0;
}

/* Steps over one whole item at p[*off], nested ones included, by counting
 * the items still owed (no recursion: any depth is fine). Its first
 * header goes to *first. False when the bytes end or are not msgpack. */
static bool skip_item(const uint8_t *p, size_t len, size_t *off, scan_item *first) {
    uint64_t owed = 1;
    for (bool top = true; owed > 0; top = false) {
        scan_item v;
        if (*off >= len || scan_header(p, len, off, &v) || v.payload > len - *off) return false;
        if (top) *first = v;
        *off += (size_t)v.payload;
        owed--;
        if (v.container) { /* every entry takes a byte: a larger count is a lie */
            uint64_t items = v.container == 2 ? v.count * 2 : v.count;
            if (v.count > len || items > len - *off) return false;
            owed += items;
        }
    }
    return true;
}

bool zi_msgpack_peek_str(const void *buf, size_t len, const char *key, const char **out,
                         size_t *out_len) {
    const uint8_t *p = buf;
    size_t off = 0, klen = strlen(key);
    scan_item it;
    if (!p || len == 0 || scan_header(p, len, &off, &it) || it.container != 2) return false;
    for (uint64_t e = 0; e < it.count; e++) { /* the top map's entries */
        scan_item k, v;
        if (!skip_item(p, len, &off, &k)) return false;
        bool match = k.is_str && k.payload == klen && memcmp(p + off - klen, key, klen) == 0;
        if (!skip_item(p, len, &off, &v)) return false;
        if (match) {
            if (!v.is_str) return false;
            *out_len = (size_t)v.payload;
            *out = (const char *)p + off - *out_len; /* a string ends where its item does */
            return true;
        }
    }
    return false;
}

int zi_msgpack_check(const void *buf, size_t len, const zi_codec_limits *lim_in, zi_error *err) {
    zi_codec_limits tmp;
    const zi_codec_limits *lim = limits_or_default(lim_in, &tmp);
    const uint8_t *p = buf;
    if (!p && len) return zi_error_set(err, ZI_EINVAL, "message: NULL buffer");
    scan_frame st[ZI_CODEC_DEPTH_CAP + 1];
    size_t depth = 0, maxd = depth_cap(lim);
    uint64_t max_count = lim->max_tokens > lim->max_items ? lim->max_tokens : lim->max_items;
    size_t off = 0;
    char path[256];
    for (;;) {
        if (off >= len) {
            scan_path(path, sizeof path, st, depth);
            return zi_error_set(err, ZI_EFORMAT, "message: truncated at byte %zu%s%s", off,
                                *path ? " in " : "", path);
        }
        size_t at = off;
        scan_item it;
        int hr = scan_header(p, len, &off, &it);
        if (hr == 1)
            return zi_error_set(err, ZI_EFORMAT, "message: byte 0x%02x at %zu is not msgpack",
                                p[at], at);
        if (hr == 2) {
            scan_path(path, sizeof path, st, depth);
            return zi_error_set(err, ZI_EFORMAT, "message: truncated header at byte %zu%s%s", at,
                                *path ? " in " : "", path);
        }
        uint64_t payload = it.payload, count = it.count;
        int container = it.container, is_str = it.is_str;
        if (payload > len - off) {
            scan_path(path, sizeof path, st, depth);
            return zi_error_set(
                err, ZI_EFORMAT, "message: %llu bytes at byte %zu run past the end (%zu left)%s%s",
                (unsigned long long)payload, at, len - off, *path ? " in " : "", path);
        }
        /* Remember string keys so later errors can name the field. */
        if (depth && st[depth - 1].is_map && !((st[depth - 1].total - st[depth - 1].left) & 1)) {
            st[depth - 1].key = is_str ? (const char *)p + off : NULL;
            st[depth - 1].klen = (uint32_t)payload;
        }
        off += (size_t)payload;
        if (container && count > 0) {
            uint64_t items = container == 2 ? count * 2 : count;
            scan_path(path, sizeof path, st, depth);
            if (count > max_count)
                return zi_error_set(err, ZI_EINVAL,
                                    "%s: %s of %llu entries exceeds the limit of %llu",
                                    *path ? path : "message", container == 2 ? "map" : "array",
                                    (unsigned long long)count, (unsigned long long)max_count);
            /* Every item takes at least one byte: a count larger than the
             * bytes left is a lie, refused before anything is allocated. */
            if (items > len - off)
                return zi_error_set(
                    err, ZI_EFORMAT,
                    "%s: %s at byte %zu claims %llu entries but only %zu bytes remain",
                    *path ? path : "message", container == 2 ? "map" : "array", at,
                    (unsigned long long)count, len - off);
            if (depth + 1 > maxd)
                return zi_error_set(err, ZI_EINVAL, "%s: nested deeper than %zu levels",
                                    *path ? path : "message", maxd);
            st[depth].total = st[depth].left = items;
            st[depth].is_map = container == 2;
            st[depth].key = NULL;
            st[depth].klen = 0;
            depth++;
            continue;
        }
        /* One item complete: close every container it completes. */
        for (;;) {
            if (depth == 0) {
                if (off != len)
                    return zi_error_set(err, ZI_EFORMAT,
                                        "message: %zu trailing bytes after the object", len - off);
                return ZI_OK;
            }
            if (--st[depth - 1].left > 0) break;
            depth--;
        }
    }
}

int zi_msgpack_parse(const void *buf, size_t len, const zi_codec_limits *lim, msgpack_unpacked *out,
                     zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "message: NULL output");
    msgpack_unpacked_init(out);
    int rc = zi_msgpack_check(buf, len, lim, err);
    if (rc) return rc;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(out, buf, len, &off);
    if (r == MSGPACK_UNPACK_SUCCESS && off == len) return ZI_OK;
    msgpack_unpacked_destroy(out);
    msgpack_unpacked_init(out);
    if (r == MSGPACK_UNPACK_NOMEM_ERROR)
        return zi_error_set(err, ZI_ENOMEM, "message: out of memory while unpacking");
    return zi_error_set(err, ZI_EFORMAT, "message: msgpack parser refused it (%d)", (int)r);
}

/* ---- decoding helpers ------------------------------------------------------ */

typedef struct dec {
    const zi_codec_limits *lim;
    zi_error *err;
    const char *root; /* names the object in messages while path is empty */
    zi_keypath path;
} dec;

static void dec_init(dec *d, const zi_codec_limits *lim, const char *path, const char *root,
                     zi_error *err) {
    d->lim = lim;
    d->err = err;
    d->root = root;
    memset(&d->path, 0, sizeof d->path);
    if (path && *path) zi_keypath_push(&d->path, "%s", path);
}

static size_t push_key(dec *d, const char *k) {
    return zi_keypath_push(&d->path, "%s%s", d->path.n ? "." : "", k);
}

/* A key from the client (quoted as zi_printable does). */
static size_t push_client_key(dec *d, const msgpack_object *k) {
    return zi_keypath_push_key(&d->path, d->path.n ? "." : "", k->via.str.ptr, k->via.str.size);
}

static size_t push_idx(dec *d, size_t i) {
    return zi_keypath_push(&d->path, "[%zu]", i);
}

static void pop(dec *d, size_t old) {
    zi_keypath_pop(&d->path, old);
}

__attribute__((format(printf, 3, 4))) static int fail(dec *d, int code, const char *fmt, ...) {
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zi_error_set(d->err, code, "%s: %s", d->path.n ? d->path.s : d->root, msg);
}

const char *zi_msgpack_type_name(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return "nil";
    case MSGPACK_OBJECT_BOOLEAN:
        return "a boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return "an integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return "a float";
    case MSGPACK_OBJECT_STR:
        return "a string";
    case MSGPACK_OBJECT_ARRAY:
        return "an array";
    case MSGPACK_OBJECT_MAP:
        return "a map";
    case MSGPACK_OBJECT_BIN:
        return "binary data";
    case MSGPACK_OBJECT_EXT:
        return "an extension type";
    }
    return "an unknown type";
}

static int wrong_type(dec *d, const msgpack_object *o, const char *want) {
    return fail(d, ZI_EINVAL, "expected %s, got %s", want, zi_msgpack_type_name(o));
}

static bool is_nil(const msgpack_object *o) {
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

static bool is_key(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

/* Matches the keys of map o against names[0..nf): vals[i] is the value of
 * names[i] or NULL. Refuses non-string keys, unknown keys (naming them) and
 * repeated keys. */
static int read_map(dec *d, const msgpack_object *o, const char *const *names, size_t nf,
                    const msgpack_object **vals) {
    if (o->type != MSGPACK_OBJECT_MAP) return wrong_type(d, o, "a map");
    for (size_t i = 0; i < nf; i++) vals[i] = NULL;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return fail(d, ZI_EINVAL, "map key #%u is %s, not a string", i,
                        zi_msgpack_type_name(k));
        size_t f = 0;
        while (f < nf && !is_key(k, names[f])) f++;
        if (f == nf) {
            size_t old = push_client_key(d, k);
            int rc = fail(d, ZI_EINVAL, "unknown field");
            pop(d, old);
            return rc;
        }
        if (vals[f]) {
            size_t old = push_key(d, names[f]);
            int rc = fail(d, ZI_EINVAL, "duplicate field");
            pop(d, old);
            return rc;
        }
        vals[f] = &o->via.map.ptr[i].val;
    }
    return ZI_OK;
}

static int missing(dec *d, const char *name) {
    size_t old = push_key(d, name);
    int rc = fail(d, ZI_EINVAL, "missing required field");
    pop(d, old);
    return rc;
}

static int get_bool(dec *d, const msgpack_object *o, bool *out) {
    if (o->type != MSGPACK_OBJECT_BOOLEAN) return wrong_type(d, o, "a boolean");
    *out = o->via.boolean;
    return ZI_OK;
}

static int get_i64(dec *d, const msgpack_object *o, int64_t lo, int64_t hi, int64_t *out) {
    int64_t v;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)hi)
            return fail(d, ZI_EINVAL, "%llu is outside [%lld, %lld]",
                        (unsigned long long)o->via.u64, (long long)lo, (long long)hi);
        v = (int64_t)o->via.u64;
    } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        v = o->via.i64;
    } else {
        return wrong_type(d, o, "an integer");
    }
    if (v < lo || v > hi)
        return fail(d, ZI_EINVAL, "%lld is outside [%lld, %lld]", (long long)v, (long long)lo,
                    (long long)hi);
    *out = v;
    return ZI_OK;
}

/* A number (integers are accepted where floats are meant, as Python does);
 * NaN and infinities pass here and are judged by the type's validator. */
static int get_f64(dec *d, const msgpack_object *o, double *out) {
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
        return wrong_type(d, o, "a number");
    }
}

enum { STR_NO_NUL = 1, STR_NONEMPTY = 2, STR_ID = 4 /* short: ID_MAX_BYTES */ };

/* Checks a msgpack str: length limit, UTF-8, flags. */
static int check_str(dec *d, const msgpack_object *o, int flags) {
    if (o->type != MSGPACK_OBJECT_STR) return wrong_type(d, o, "a string");
    size_t n = o->via.str.size;
    size_t max = (flags & STR_ID) ? ID_MAX_BYTES : d->lim->max_string_bytes;
    if (n > max) return fail(d, ZI_EINVAL, "string of %zu bytes exceeds the limit of %zu", n, max);
    if ((flags & STR_NONEMPTY) && n == 0) return fail(d, ZI_EINVAL, "must not be empty");
    size_t bad = utf8_bad_at((const uint8_t *)o->via.str.ptr, n);
    if (bad < n) return fail(d, ZI_EINVAL, "invalid UTF-8 at byte %zu", bad);
    if ((flags & STR_NO_NUL) && n && memchr(o->via.str.ptr, 0, n))
        return fail(d, ZI_EINVAL, "contains a NUL byte");
    return ZI_OK;
}

static int get_str(dec *d, const msgpack_object *o, int flags, zi_string *out) {
    int rc = check_str(d, o, flags);
    if (rc) return rc;
    if (zi_string_set(out, o->via.str.ptr, o->via.str.size, NULL))
        return fail(d, ZI_ENOMEM, "out of memory");
    return ZI_OK;
}

/* A list of strings; `single` also accepts one string (the request's stop). */
static int get_str_list(dec *d, const msgpack_object *o, int flags, bool single, zi_str_list *out) {
    if (single && o->type == MSGPACK_OBJECT_STR) {
        int rc = check_str(d, o, flags);
        if (rc) return rc;
        if (zi_str_list_push(out, o->via.str.ptr, o->via.str.size, NULL))
            return fail(d, ZI_ENOMEM, "out of memory");
        return ZI_OK;
    }
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return wrong_type(d, o, single ? "a string or an array of strings" : "an array of strings");
    if (o->via.array.size > d->lim->max_items)
        return fail(d, ZI_EINVAL, "%u entries exceed the limit of %zu", o->via.array.size,
                    d->lim->max_items);
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        size_t old = push_idx(d, i);
        const msgpack_object *e = &o->via.array.ptr[i];
        int rc = check_str(d, e, flags);
        if (!rc && zi_str_list_push(out, e->via.str.ptr, e->via.str.size, NULL))
            rc = fail(d, ZI_ENOMEM, "out of memory");
        pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

/* numpy-style array header: returns the data pointer, count and dtype. */
enum { DT_INT64 = 1, DT_INT32 = 2, DT_FLOAT32 = 4 };

static int get_np(dec *d, const msgpack_object *o, int allowed, size_t limit, int *dtype,
                  const uint8_t **data, size_t *n) {
    static const char *const names[] = {"__np__", "dtype", "shape", "data"};
    const msgpack_object *v[4];
    int rc = read_map(d, o, names, 4, v);
    if (rc) return rc;
    for (int i = 0; i < 4; i++)
        if (!v[i]) return missing(d, names[i]);
    size_t old = push_key(d, "__np__");
    if (v[0]->type != MSGPACK_OBJECT_BOOLEAN || !v[0]->via.boolean)
        rc = fail(d, ZI_EINVAL, "must be true");
    pop(d, old);
    if (rc) return rc;
    old = push_key(d, "dtype");
    size_t item = 0;
    if (!(rc = check_str(d, v[1], STR_ID))) {
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
            rc = fail(d, ZI_EINVAL, "\"%s\" is not accepted here (expected %s)", nm,
                      allowed & DT_FLOAT32 ? "float32" : "int64 or int32");
        }
    }
    pop(d, old);
    if (rc) return rc;
    old = push_key(d, "shape");
    int64_t count = 0;
    if (v[2]->type != MSGPACK_OBJECT_ARRAY || v[2]->via.array.size != 1) {
        rc = v[2]->type != MSGPACK_OBJECT_ARRAY
                 ? wrong_type(d, v[2], "an array")
                 : fail(d, ZI_EINVAL, "must have one dimension, got %u", v[2]->via.array.size);
    } else {
        size_t o2 = push_idx(d, 0);
        rc = get_i64(d, &v[2]->via.array.ptr[0], 0, INT64_MAX, &count);
        if (!rc && (uint64_t)count > limit)
            rc = fail(d, ZI_EINVAL, "%lld elements exceed the limit of %zu", (long long)count,
                      limit);
        /* A bin holds at most 2^32-1 bytes; refusing larger shapes here also
         * keeps count * itemsize from wrapping below. */
        if (!rc && (uint64_t)count > UINT32_MAX / 8)
            rc =
                fail(d, ZI_EINVAL, "%lld elements cannot fit in one msgpack bin", (long long)count);
        pop(d, o2);
    }
    pop(d, old);
    if (rc) return rc;
    old = push_key(d, "data");
    if (v[3]->type != MSGPACK_OBJECT_BIN)
        rc = wrong_type(d, v[3], "binary data");
    else if (v[3]->via.bin.size != (uint64_t)count * item)
        rc = fail(d, ZI_EINVAL, "%u bytes do not match shape [%lld] of %zu-byte elements",
                  v[3]->via.bin.size, (long long)count, item);
    pop(d, old);
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

static bool is_np(const msgpack_object *o) {
    return o->type == MSGPACK_OBJECT_MAP;
}

static int decode_tokens(dec *d, const msgpack_object *o, int32_t **ids_out, size_t *n_out) {
    *ids_out = NULL;
    *n_out = 0;
    size_t n;
    int dtype = 0;
    const uint8_t *data = NULL;
    int rc;
    if (is_np(o)) {
        if ((rc = get_np(d, o, DT_INT64 | DT_INT32, d->lim->max_tokens, &dtype, &data, &n)))
            return rc;
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        n = o->via.array.size;
        if (n > d->lim->max_tokens)
            return fail(d, ZI_EINVAL, "%zu tokens exceed the limit of %zu", n, d->lim->max_tokens);
    } else {
        return wrong_type(d, o, "an array of token ids");
    }
    if (n == 0) return ZI_OK;
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return fail(d, ZI_ENOMEM, "out of memory (%zu tokens)", n);
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (dtype == DT_INT64)
            v = (int64_t)le(data + 8 * i, 8);
        else if (dtype == DT_INT32)
            v = (int32_t)(uint32_t)le(data + 4 * i, 4);
        else {
            size_t old = push_idx(d, i);
            rc = get_i64(d, &o->via.array.ptr[i], 0, INT32_MAX, &v);
            pop(d, old);
            if (rc) {
                free(ids);
                return rc;
            }
        }
        if (v < 0 || v > INT32_MAX) {
            size_t old = push_idx(d, i);
            rc = fail(d, ZI_EINVAL, "token id %lld is outside [0, %d]", (long long)v, INT32_MAX);
            pop(d, old);
            free(ids);
            return rc;
        }
        ids[i] = (int32_t)v;
    }
    *ids_out = ids;
    *n_out = n;
    return ZI_OK;
}

int zi_codec_decode_tokens(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                           int32_t **ids, size_t *n, zi_error *err) {
    if (!o || !ids || !n) return zi_error_set(err, ZI_EINVAL, "tokens: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "tokens", err);
    return decode_tokens(&d, o, ids, n);
}

static int get_i32_list(dec *d, const msgpack_object *o, zi_i32_list *out) {
    int32_t *ids;
    size_t n;
    int rc = decode_tokens(d, o, &ids, &n);
    if (rc) return rc;
    zi_i32_list_free(out);
    out->v = ids;
    out->n = n;
    return ZI_OK;
}

/* Floats from numpy float32 or a plain array of numbers. */
static int decode_f32(dec *d, const msgpack_object *o, float **out, size_t *n_out) {
    *out = NULL;
    *n_out = 0;
    size_t n;
    int dtype = 0;
    const uint8_t *data = NULL;
    int rc;
    if (is_np(o)) {
        if ((rc = get_np(d, o, DT_FLOAT32, d->lim->max_tokens, &dtype, &data, &n))) return rc;
    } else if (o->type == MSGPACK_OBJECT_ARRAY) {
        n = o->via.array.size;
        if (n > d->lim->max_tokens)
            return fail(d, ZI_EINVAL, "%zu values exceed the limit of %zu", n, d->lim->max_tokens);
    } else {
        return wrong_type(d, o, "an array of numbers");
    }
    if (n == 0) return ZI_OK;
    float *v = malloc(n * sizeof *v);
    if (!v) return fail(d, ZI_ENOMEM, "out of memory (%zu values)", n);
    for (size_t i = 0; i < n; i++) {
        if (dtype) {
            uint32_t bits = (uint32_t)le(data + 4 * i, 4);
            memcpy(&v[i], &bits, 4);
        } else {
            double x = 0.0;
            size_t old = push_idx(d, i);
            rc = get_f64(d, &o->via.array.ptr[i], &x);
            pop(d, old);
            if (rc) {
                free(v);
                return rc;
            }
            v[i] = (float)x;
        }
    }
    *out = v;
    *n_out = n;
    return ZI_OK;
}

/* Checks everything inside an opaque value (tools, response_format, ...):
 * valid strings within limits, no extension types. Depth is already bounded
 * by the pre-scan or, for objects built elsewhere, checked here. */
static int check_opaque(dec *d, const msgpack_object *o, size_t depth) {
    if (depth > depth_cap(d->lim))
        return fail(d, ZI_EINVAL, "nested deeper than %zu levels", depth_cap(d->lim));
    int rc = ZI_OK;
    switch (o->type) {
    case MSGPACK_OBJECT_STR:
        return check_str(d, o, 0);
    case MSGPACK_OBJECT_EXT:
        return fail(d, ZI_EINVAL, "extension types are not accepted");
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isnan(o->via.f64)) return fail(d, ZI_EINVAL, "NaN is not allowed");
        return ZI_OK;
    case MSGPACK_OBJECT_ARRAY:
        if (o->via.array.size > d->lim->max_items)
            return fail(d, ZI_EINVAL, "%u entries exceed the limit of %zu", o->via.array.size,
                        d->lim->max_items);
        for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
            size_t old = push_idx(d, i);
            rc = check_opaque(d, &o->via.array.ptr[i], depth + 1);
            pop(d, old);
        }
        return rc;
    case MSGPACK_OBJECT_MAP:
        if (o->via.map.size > d->lim->max_items)
            return fail(d, ZI_EINVAL, "%u entries exceed the limit of %zu", o->via.map.size,
                        d->lim->max_items);
        for (uint32_t i = 0; i < o->via.map.size && !rc; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                return fail(d, ZI_EINVAL, "map key #%u is %s, not a string", i,
                            zi_msgpack_type_name(k));
            if ((rc = check_str(d, k, 0))) return rc;
            size_t old = push_client_key(d, k);
            rc = check_opaque(d, &o->via.map.ptr[i].val, depth + 1);
            pop(d, old);
        }
        return rc;
    default:
        return ZI_OK;
    }
}

/* Re-encodes an opaque value as msgpack bytes. */
static int get_opaque(dec *d, const msgpack_object *o, msgpack_object_type want, const char *what,
                      size_t depth, zi_bytes *out) {
    if (o->type != want) return wrong_type(d, o, what);
    int rc = check_opaque(d, o, depth);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    if (msgpack_pack_object(&pk, *o) != 0) {
        msgpack_sbuffer_destroy(&sb);
        return fail(d, ZI_ENOMEM, "out of memory");
    }
    rc = zi_bytes_set(out, sb.data, sb.size, NULL);
    msgpack_sbuffer_destroy(&sb);
    return rc ? fail(d, ZI_ENOMEM, "out of memory") : ZI_OK;
}

/* ---- decoders -------------------------------------------------------------- */

/* A present value of the wanted type at d's path + "." + name, or an
 * error; optional ones may be absent. */
static int need_field(dec *d, const msgpack_object *o, const char *name, msgpack_object_type t,
                      const char *what, bool optional) {
    if (!o) return optional ? ZI_OK : missing(d, name);
    if (o->type == t) return ZI_OK;
    size_t old = push_key(d, name);
    int rc = wrong_type(d, o, what);
    pop(d, old);
    return rc;
}

/* The seed's TokenGeneratorRequestTool list: [{"type": str, "function":
 * {"name": non-empty str, "description": str, "parameters": map}}], no
 * other keys. Checked here, at admission, so that the tokenizer turns a
 * list it can trust into the template's `tools`. */
static int dec_tools(dec *d, const msgpack_object *o) {
    static const char *const tool_keys[] = {"type", "function"};
    static const char *const fn_keys[] = {"name", "description", "parameters"};
    if (o->type != MSGPACK_OBJECT_ARRAY) return wrong_type(d, o, "an array");
    int rc = ZI_OK;
    for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
        size_t old = push_idx(d, i);
        const msgpack_object *tv[2], *fv[3];
        rc = read_map(d, &o->via.array.ptr[i], tool_keys, 2, tv);
        if (!rc) rc = need_field(d, tv[0], "type", MSGPACK_OBJECT_STR, "a string", false);
        if (!rc) rc = need_field(d, tv[1], "function", MSGPACK_OBJECT_MAP, "a map", false);
        if (!rc) {
            size_t fold = push_key(d, "function");
            rc = read_map(d, tv[1], fn_keys, 3, fv);
            if (!rc) rc = need_field(d, fv[0], "name", MSGPACK_OBJECT_STR, "a string", false);
            if (!rc && fv[0]->via.str.size == 0) {
                size_t nold = push_key(d, "name");
                rc = fail(d, ZI_EINVAL, "must not be empty");
                pop(d, nold);
            }
            if (!rc) rc = need_field(d, fv[1], "description", MSGPACK_OBJECT_STR, "a string", true);
            if (!rc) rc = need_field(d, fv[2], "parameters", MSGPACK_OBJECT_MAP, "a map", true);
            pop(d, fold);
        }
        pop(d, old);
    }
    return rc;
}

/* Runs a getter with the field name pushed onto the path. */
#define AT(d, name, expr)                                                                          \
    do {                                                                                           \
        size_t at_old_ = push_key((d), (name));                                                    \
        rc = (expr);                                                                               \
        pop((d), at_old_);                                                                         \
        if (rc) goto fail;                                                                         \
    } while (0)

static int dec_sampling(dec *d, const msgpack_object *o, zi_sampling_params *sp) {
    static const char *const names[] = {"top_k",
                                        "top_p",
                                        "min_p",
                                        "temperature",
                                        "frequency_penalty",
                                        "presence_penalty",
                                        "repetition_penalty",
                                        "max_new_tokens",
                                        "min_new_tokens",
                                        "ignore_eos",
                                        "stop",
                                        "stop_token_ids",
                                        "detokenize",
                                        "seed"};
    enum { N = sizeof names / sizeof names[0] };
    const msgpack_object *v[N];
    zi_sampling_params_init(sp);
    int rc = read_map(d, o, names, N, v);
    if (rc) return rc;
    int64_t i;
    if (v[0]) {
        AT(d, "top_k", get_i64(d, v[0], INT32_MIN, INT32_MAX, &i));
        sp->top_k = (int32_t)i;
    }
    if (v[1]) AT(d, "top_p", get_f64(d, v[1], &sp->top_p));
    if (v[2]) AT(d, "min_p", get_f64(d, v[2], &sp->min_p));
    if (v[3]) AT(d, "temperature", get_f64(d, v[3], &sp->temperature));
    if (v[4]) AT(d, "frequency_penalty", get_f64(d, v[4], &sp->frequency_penalty));
    if (v[5]) AT(d, "presence_penalty", get_f64(d, v[5], &sp->presence_penalty));
    if (v[6]) AT(d, "repetition_penalty", get_f64(d, v[6], &sp->repetition_penalty));
    if (!is_nil(v[7]))
        AT(d, "max_new_tokens", get_i64(d, v[7], -1, INT32_MAX, &sp->max_new_tokens));
    if (v[8]) AT(d, "min_new_tokens", get_i64(d, v[8], 0, INT32_MAX, &sp->min_new_tokens));
    if (v[9]) AT(d, "ignore_eos", get_bool(d, v[9], &sp->ignore_eos));
    if (!is_nil(v[10])) AT(d, "stop", get_str_list(d, v[10], STR_NONEMPTY, false, &sp->stop));
    if (!is_nil(v[11])) AT(d, "stop_token_ids", get_i32_list(d, v[11], &sp->stop_token_ids));
    if (v[12]) AT(d, "detokenize", get_bool(d, v[12], &sp->detokenize));
    if (v[13]) {
        size_t old = push_key(d, "seed");
        if (v[13]->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            sp->seed = v[13]->via.u64;
        else if (v[13]->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            rc = fail(d, ZI_EINVAL, "%lld is negative", (long long)v[13]->via.i64);
        else
            rc = wrong_type(d, v[13], "an integer");
        pop(d, old);
        if (rc) goto fail;
    }
    if ((rc = zi_sampling_params_validate(sp, d->path.s, d->err))) goto fail;
    return ZI_OK;
fail:
    zi_sampling_params_free(sp);
    return rc;
}

int zi_codec_decode_sampling_params(const msgpack_object *o, const zi_codec_limits *lim,
                                    const char *path, zi_sampling_params *out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "sampling_params: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "sampling_params", err);
    return dec_sampling(&d, o, out);
}

/* Appends text to s (joining message parts). */
static int str_append(zi_string *s, const char *p, size_t n, const char *sep) {
    size_t sl = (s->len && sep) ? strlen(sep) : 0;
    char *q = realloc(s->p, s->len + sl + n + 1);
    if (!q) return ZI_ENOMEM;
    memcpy(q + s->len, sep ? sep : "", sl);
    if (n) memcpy(q + s->len + sl, p, n);
    s->len += sl + n;
    q[s->len] = '\0';
    s->p = q;
    return ZI_OK;
}

/* A message's content: a string, or a list of text parts
 * {"type": "text", "text" | "content": str}, joined with "\n". */
static int dec_content(dec *d, const msgpack_object *o, zi_string *out) {
    if (o->type == MSGPACK_OBJECT_STR) return get_str(d, o, 0, out);
    if (o->type != MSGPACK_OBJECT_ARRAY) return wrong_type(d, o, "a string or an array of parts");
    if (o->via.array.size > d->lim->max_items)
        return fail(d, ZI_EINVAL, "%u parts exceed the limit of %zu", o->via.array.size,
                    d->lim->max_items);
    if (zi_string_set(out, "", 0, NULL)) return fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        static const char *const names[] = {"type", "text", "content"};
        const msgpack_object *v[3];
        size_t old = push_idx(d, i);
        int rc = read_map(d, &o->via.array.ptr[i], names, 3, v);
        if (!rc && !v[0]) rc = missing(d, "type");
        if (!rc) {
            size_t o2 = push_key(d, "type");
            rc = check_str(d, v[0], STR_ID);
            if (!rc && !is_key(v[0], "text")) {
                char nm[80];
                zi_printable(nm, sizeof nm, v[0]->via.str.ptr, v[0]->via.str.size);
                rc = fail(d, ZI_EUNSUPPORTED, "part type \"%s\" is not supported (text only)", nm);
            }
            pop(d, o2);
        }
        if (!rc && !!v[1] == !!v[2])
            rc = fail(d, ZI_EINVAL, "a text part needs exactly one of text or content");
        if (!rc) {
            const msgpack_object *t = v[1] ? v[1] : v[2];
            size_t o2 = push_key(d, v[1] ? "text" : "content");
            rc = check_str(d, t, 0);
            if (!rc && str_append(out, t->via.str.ptr, t->via.str.size, "\n"))
                rc = fail(d, ZI_ENOMEM, "out of memory");
            if (!rc && out->len > d->lim->max_string_bytes)
                rc = fail(d, ZI_EINVAL, "content exceeds the limit of %zu bytes",
                          d->lim->max_string_bytes);
            pop(d, o2);
        }
        pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

static int dec_messages(dec *d, const msgpack_object *o, zi_request *r) {
    if (o->type != MSGPACK_OBJECT_ARRAY) return wrong_type(d, o, "an array of messages");
    uint32_t n = o->via.array.size;
    if (n == 0) return fail(d, ZI_EINVAL, "must not be empty");
    if (n > d->lim->max_items)
        return fail(d, ZI_EINVAL, "%u messages exceed the limit of %zu", n, d->lim->max_items);
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        static const char *const names[] = {"role", "content"};
        const msgpack_object *v[2];
        zi_message *m = &r->messages[i];
        r->n_messages = i + 1; /* so a failure frees what was filled */
        size_t old = push_idx(d, i);
        int rc = read_map(d, &o->via.array.ptr[i], names, 2, v);
        if (!rc && !v[0]) rc = missing(d, "role");
        if (!rc && !v[1]) rc = missing(d, "content");
        if (!rc) {
            size_t o2 = push_key(d, "role");
            rc = get_str(d, v[0], STR_ID, &m->role);
            if (!rc && strcmp(m->role.p, "system") && strcmp(m->role.p, "user") &&
                strcmp(m->role.p, "assistant")) {
                char nm[80];
                zi_printable(nm, sizeof nm, m->role.p, m->role.len);
                rc = fail(d, ZI_EINVAL, "\"%s\" is not a role (system, user or assistant)", nm);
            }
            pop(d, o2);
        }
        if (!rc) {
            size_t o2 = push_key(d, "content");
            rc = dec_content(d, v[1], &m->content);
            pop(d, o2);
        }
        pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

static int dec_request(dec *d, const msgpack_object *o, zi_request *r) {
    static const char *const names[] = {"op",
                                        "id",
                                        "index",
                                        "model_name",
                                        "prompt",
                                        "messages",
                                        "images",
                                        "tools",
                                        "response_format",
                                        "timestamp_ns",
                                        "request_path",
                                        "logprobs",
                                        "echo",
                                        "stop",
                                        "chat_template_options",
                                        "sampling_params",
                                        "stream"};
    enum { N = sizeof names / sizeof names[0] };
    enum {
        OP,
        ID,
        INDEX,
        MODEL,
        PROMPT,
        MESSAGES,
        IMAGES,
        TOOLS,
        RFMT,
        TS,
        PATH,
        LOGPROBS,
        ECHO,
        STOP,
        CTO,
        SP,
        STREAM
    };
    const msgpack_object *v[N];
    zi_request_init(r);
    int rc = read_map(d, o, names, N, v);
    if (rc) return rc;
    if (v[OP]) {
        size_t old = push_key(d, "op");
        rc = check_str(d, v[OP], STR_ID);
        if (!rc && !is_key(v[OP], "generate"))
            rc = fail(d, ZI_EINVAL, "a request's op must be \"generate\"");
        pop(d, old);
        if (rc) goto fail;
    }
    if (!v[ID]) {
        rc = missing(d, "id");
        goto fail;
    }
    AT(d, "id", get_str(d, v[ID], STR_ID | STR_NO_NUL | STR_NONEMPTY, &r->id));
    if (v[INDEX]) AT(d, "index", get_i64(d, v[INDEX], 0, INT64_MAX, &r->index));
    if (!is_nil(v[MODEL]))
        AT(d, "model_name", get_str(d, v[MODEL], STR_ID | STR_NO_NUL, &r->model_name));
    if (!is_nil(v[PROMPT])) {
        if (v[PROMPT]->type == MSGPACK_OBJECT_STR) {
            AT(d, "prompt", get_str(d, v[PROMPT], STR_NONEMPTY, &r->prompt_text));
            r->prompt_kind = ZI_PROMPT_TEXT;
        } else {
            AT(d, "prompt", get_i32_list(d, v[PROMPT], &r->prompt_tokens));
            r->prompt_kind = ZI_PROMPT_TOKENS;
            if (r->prompt_tokens.n == 0) {
                size_t old = push_key(d, "prompt");
                rc = fail(d, ZI_EINVAL, "must not be empty");
                pop(d, old);
                goto fail;
            }
        }
    }
    if (!is_nil(v[MESSAGES])) AT(d, "messages", dec_messages(d, v[MESSAGES], r));
    if (!is_nil(v[IMAGES])) {
        size_t old = push_key(d, "images");
        rc = fail(d, ZI_EUNSUPPORTED, "image inputs are not supported");
        pop(d, old);
        goto fail;
    }
    if ((r->prompt_kind != ZI_PROMPT_NONE) == (r->n_messages > 0)) {
        size_t old = push_key(d, "prompt");
        rc = fail(d, ZI_EINVAL, "exactly one of prompt and messages is required");
        pop(d, old);
        goto fail;
    }
    if (!is_nil(v[TOOLS])) {
        AT(d, "tools", dec_tools(d, v[TOOLS]));
        AT(d, "tools", get_opaque(d, v[TOOLS], MSGPACK_OBJECT_ARRAY, "an array", 2, &r->tools));
    }
    if (!is_nil(v[RFMT]))
        AT(d, "response_format",
           get_opaque(d, v[RFMT], MSGPACK_OBJECT_MAP, "a map", 2, &r->response_format));
    if (v[TS]) AT(d, "timestamp_ns", get_i64(d, v[TS], 0, INT64_MAX, &r->timestamp_ns));
    if (v[PATH]) AT(d, "request_path", get_str(d, v[PATH], STR_ID | STR_NO_NUL, &r->request_path));
    if (v[LOGPROBS])
        AT(d, "logprobs", get_i64(d, v[LOGPROBS], 0, d->lim->max_logprobs, &r->logprobs));
    if (v[ECHO]) AT(d, "echo", get_bool(d, v[ECHO], &r->echo));
    if (!is_nil(v[STOP])) AT(d, "stop", get_str_list(d, v[STOP], STR_NONEMPTY, true, &r->stop));
    if (!is_nil(v[CTO]))
        AT(d, "chat_template_options",
           get_opaque(d, v[CTO], MSGPACK_OBJECT_MAP, "a map", 2, &r->chat_template_options));
    if (!is_nil(v[SP])) AT(d, "sampling_params", dec_sampling(d, v[SP], &r->sampling_params));
    if (v[STREAM]) AT(d, "stream", get_bool(d, v[STREAM], &r->stream));
    /* Only the chat template reads tools and options: with a prompt they
     * would be ignored, so they are refused (empty ones are nothing). */
    if (r->prompt_kind != ZI_PROMPT_NONE) {
        const char *which = !is_nil(v[TOOLS]) && v[TOOLS]->via.array.size ? "tools"
                            : !is_nil(v[CTO]) && v[CTO]->via.map.size     ? "chat_template_options"
                                                                          : NULL;
        if (which) {
            size_t old = push_key(d, which);
            rc = fail(d, ZI_EINVAL,
                      "only used with messages (the chat template renders them); this request "
                      "has a prompt");
            pop(d, old);
            goto fail;
        }
    }
    return ZI_OK;
fail:
    zi_request_free(r);
    return rc;
}

int zi_codec_decode_request(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                            zi_request *out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "request: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "request", err);
    return dec_request(&d, o, out);
}

static int dec_logprobs(dec *d, const msgpack_object *o, zi_logprobs *lp) {
    static const char *const names[] = {"token_log_probabilities", "top_log_probabilities"};
    const msgpack_object *v[2];
    zi_logprobs_init(lp);
    float *tl = NULL;
    size_t n = 0;
    int rc = read_map(d, o, names, 2, v);
    if (rc) return rc;
    if (!v[0]) return missing(d, names[0]);
    if (!v[1]) return missing(d, names[1]);
    AT(d, names[0], decode_f32(d, v[0], &tl, &n));
    for (size_t i = 0; i < n; i++) {
        if (isnan(tl[i]) || (isinf(tl[i]) && tl[i] > 0)) {
            size_t old = push_key(d, names[0]);
            size_t o2 = push_idx(d, i);
            rc = fail(d, ZI_EINVAL, "%g is not a log probability", (double)tl[i]);
            pop(d, o2);
            pop(d, old);
            goto fail;
        }
    }
    {
        size_t old = push_key(d, names[1]);
        const msgpack_object *t = v[1];
        if (t->type != MSGPACK_OBJECT_ARRAY)
            rc = wrong_type(d, t, "an array of maps");
        else if (t->via.array.size != n)
            rc = fail(d, ZI_EINVAL, "%u entries, but token_log_probabilities has %zu",
                      t->via.array.size, n);
        for (size_t i = 0; i < n && !rc; i++) {
            size_t o2 = push_idx(d, i);
            const msgpack_object *m = &t->via.array.ptr[i];
            int32_t *ids = NULL;
            float *lps = NULL;
            uint32_t k = 0;
            if (m->type != MSGPACK_OBJECT_MAP)
                rc = wrong_type(d, m, "a map of token id to log probability");
            else if (m->via.map.size > d->lim->max_items)
                rc = fail(d, ZI_EINVAL, "%u entries exceed the limit of %zu", m->via.map.size,
                          d->lim->max_items);
            else if (m->via.map.size) {
                ids = malloc(m->via.map.size * sizeof *ids);
                lps = malloc(m->via.map.size * sizeof *lps);
                if (!ids || !lps) rc = fail(d, ZI_ENOMEM, "out of memory");
            }
            for (; !rc && k < m->via.map.size; k++) {
                int64_t id;
                double x = 0;
                if ((rc = get_i64(d, &m->via.map.ptr[k].key, 0, INT32_MAX, &id))) break;
                for (uint32_t j = 0; j < k && !rc; j++)
                    if (ids[j] == (int32_t)id)
                        rc = fail(d, ZI_EINVAL, "token id %lld appears twice", (long long)id);
                if (rc) break;
                char key[32];
                snprintf(key, sizeof key, "%lld", (long long)id);
                size_t o3 = push_key(d, key);
                rc = get_f64(d, &m->via.map.ptr[k].val, &x);
                if (!rc && (isnan(x) || (isinf(x) && x > 0)))
                    rc = fail(d, ZI_EINVAL, "%g is not a log probability", x);
                pop(d, o3);
                ids[k] = (int32_t)id;
                lps[k] = (float)x;
            }
            if (!rc && zi_logprobs_push(lp, tl[i], ids, lps, k, NULL))
                rc = fail(d, ZI_ENOMEM, "out of memory");
            pop(d, o2);
            free(ids);
            free(lps);
        }
        pop(d, old);
        if (rc) goto fail;
    }
    free(tl);
    return ZI_OK;
fail:
    free(tl);
    zi_logprobs_free(lp);
    return rc;
}

int zi_codec_decode_logprobs(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                             zi_logprobs *out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "log_probabilities: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "log_probabilities", err);
    return dec_logprobs(&d, o, out);
}

/* A LogProbabilities map or nil into a fresh heap object (*out NULL for nil). */
static int dec_logprobs_opt(dec *d, const msgpack_object *o, zi_logprobs **out) {
    *out = NULL;
    if (is_nil(o)) return ZI_OK;
    zi_logprobs *lp = malloc(sizeof *lp);
    if (!lp) return fail(d, ZI_ENOMEM, "out of memory");
    int rc = dec_logprobs(d, o, lp);
    if (rc) {
        free(lp);
        return rc;
    }
    *out = lp;
    return ZI_OK;
}

static int dec_text_response(dec *d, const msgpack_object *o, zi_text_response *r) {
    static const char *const names[] = {"next_token", "log_probabilities"};
    const msgpack_object *v[2];
    zi_text_response_init(r);
    int rc = read_map(d, o, names, 2, v);
    if (rc) return rc;
    if (!v[0]) return missing(d, "next_token");
    if (v[0]->type == MSGPACK_OBJECT_STR) {
        AT(d, "next_token", get_str(d, v[0], 0, &r->text));
        r->is_text = true;
    } else {
        int64_t t = 0;
        size_t old = push_key(d, "next_token");
        if (v[0]->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
            v[0]->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
            rc = wrong_type(d, v[0], "a token id or a string");
        else
            rc = get_i64(d, v[0], 0, INT32_MAX, &t);
        pop(d, old);
        if (rc) goto fail;
        r->token = (int32_t)t;
    }
    if (v[1]) AT(d, "log_probabilities", dec_logprobs_opt(d, v[1], &r->logprobs));
    return ZI_OK;
fail:
    zi_text_response_free(r);
    return rc;
}

int zi_codec_decode_text_response(const msgpack_object *o, const zi_codec_limits *lim,
                                  const char *path, zi_text_response *out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "text_response: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "text_response", err);
    return dec_text_response(&d, o, out);
}

static int get_status(dec *d, const msgpack_object *o, zi_gen_status *out) {
    int rc = check_str(d, o, STR_ID);
    if (rc) return rc;
    if (zi_gen_status_parse(o->via.str.ptr, o->via.str.size, out, NULL)) {
        char nm[80];
        zi_printable(nm, sizeof nm, o->via.str.ptr, o->via.str.size);
        return fail(
            d, ZI_EINVAL,
            "\"%s\" is not a status (active, end_of_sequence, maximum_length, stop, cancelled)",
            nm);
    }
    return ZI_OK;
}

static int dec_tgr(dec *d, const msgpack_object *o, zi_text_generation_response *r) {
    static const char *const names[] = {"tokens", "final_status"};
    const msgpack_object *v[2];
    zi_text_generation_response_init(r);
    int rc = read_map(d, o, names, 2, v);
    if (rc) return rc;
    if (!v[0]) return missing(d, "tokens");
    if (!v[1]) return missing(d, "final_status");
    AT(d, "final_status", get_status(d, v[1], &r->final_status));
    {
        size_t old = push_key(d, "tokens");
        const msgpack_object *t = v[0];
        if (t->type != MSGPACK_OBJECT_ARRAY)
            rc = wrong_type(d, t, "an array");
        else if (t->via.array.size > d->lim->max_tokens)
            rc = fail(d, ZI_EINVAL, "%u responses exceed the limit of %zu", t->via.array.size,
                      d->lim->max_tokens);
        else if (t->via.array.size && !(r->tokens = calloc(t->via.array.size, sizeof *r->tokens)))
            rc = fail(d, ZI_ENOMEM, "out of memory");
        for (uint32_t i = 0; !rc && i < t->via.array.size; i++) {
            size_t o2 = push_idx(d, i);
            rc = dec_text_response(d, &t->via.array.ptr[i], &r->tokens[i]);
            if (!rc) r->n = i + 1;
            pop(d, o2);
        }
        pop(d, old);
        if (rc) goto fail;
    }
    return ZI_OK;
fail:
    zi_text_generation_response_free(r);
    return rc;
}

int zi_codec_decode_text_generation_response(const msgpack_object *o, const zi_codec_limits *lim,
                                             const char *path, zi_text_generation_response *out,
                                             zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "text_generation_response: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "text_generation_response", err);
    return dec_tgr(&d, o, out);
}

/* The TextContext keys: the seed dataclass's field names (private ones keep
 * their underscore), plus request_id. */
static const char *const ctx_names[] = {"request_id",
                                        "prompt",
                                        "max_length",
                                        "tokens",
                                        "eos_token_ids",
                                        "eos_sequences",
                                        "log_probabilities",
                                        "log_probabilities_echo",
                                        "ignore_eos",
                                        "json_schema",
                                        "sampling_params",
                                        "_matcher",
                                        "_status",
                                        "_cache_seq_id",
                                        "_size",
                                        "_start_idx",
                                        "_active_idx",
                                        "_end_idx",
                                        "_completion_start_idx",
                                        "_completion_end_idx",
                                        "_prompt_len",
                                        "_committed_idx",
                                        "_log_probabilities_data",
                                        "_is_initial_prompt",
                                        "_draft_offset"};
enum {
    C_RID,
    C_PROMPT,
    C_MAXLEN,
    C_TOKENS,
    C_EOS,
    C_EOSSEQ,
    C_LP,
    C_LPECHO,
    C_IGNEOS,
    C_SCHEMA,
    C_SP,
    C_MATCHER,
    C_STATUS,
    C_CACHE,
    C_SIZE,
    C_START,
    C_ACTIVE,
    C_END,
    C_CSTART,
    C_CEND,
    C_PLEN,
    C_COMMIT,
    C_LPDATA,
    C_INIT,
    C_DRAFT,
    C_N
};

/* An index field: absent or -1 means "derive" (returned as -1). */
static int get_idx(dec *d, const msgpack_object *o, const char *name, int64_t *out) {
    *out = -1;
    if (!o) return ZI_OK;
    size_t old = push_key(d, name);
    int rc = get_i64(d, o, -1, INT32_MAX, out);
    pop(d, old);
    return rc;
}

static int dec_context(dec *d, const msgpack_object *o, zi_text_context *c) {
    const msgpack_object *v[C_N];
    zi_text_context_zero(c);
    int32_t *toks = NULL;
    size_t ntok = 0;
    int rc = read_map(d, o, ctx_names, C_N, v);
    if (rc) return rc;
    if (!v[C_TOKENS]) return missing(d, "tokens");
    if (!v[C_MAXLEN]) return missing(d, "max_length");
    if (!is_nil(v[C_RID]))
        AT(d, "request_id", get_str(d, v[C_RID], STR_ID | STR_NO_NUL, &c->request_id));
    if (!is_nil(v[C_PROMPT])) {
        /* The original prompt: text is kept; token ids are already the
         * start of `tokens`, so they are only checked. */
        if (v[C_PROMPT]->type == MSGPACK_OBJECT_STR)
            AT(d, "prompt", get_str(d, v[C_PROMPT], 0, &c->prompt));
        else {
            int32_t *p = NULL;
            size_t pn = 0;
            AT(d, "prompt", decode_tokens(d, v[C_PROMPT], &p, &pn));
            free(p);
        }
    }
    AT(d, "max_length", get_i64(d, v[C_MAXLEN], 1, INT32_MAX, &c->max_length));
    AT(d, "tokens", decode_tokens(d, v[C_TOKENS], &toks, &ntok));
    if (!is_nil(v[C_EOS])) {
        zi_i32_list l = {NULL, 0};
        AT(d, "eos_token_ids", get_i32_list(d, v[C_EOS], &l));
        rc = zi_text_context_set_eos(c, l.v, l.n, NULL);
        zi_i32_list_free(&l);
        if (rc) {
            size_t old = push_key(d, "eos_token_ids");
            rc = fail(d, rc, "out of memory");
            pop(d, old);
            goto fail;
        }
    }
    if (!is_nil(v[C_EOSSEQ])) {
        size_t old = push_key(d, "eos_sequences");
        const msgpack_object *s = v[C_EOSSEQ];
        if (s->type != MSGPACK_OBJECT_ARRAY)
            rc = wrong_type(d, s, "an array of token id arrays");
        else if (s->via.array.size > d->lim->max_items)
            rc = fail(d, ZI_EINVAL, "%u sequences exceed the limit of %zu", s->via.array.size,
                      d->lim->max_items);
        for (uint32_t i = 0; !rc && i < s->via.array.size; i++) {
            size_t o2 = push_idx(d, i);
            int32_t *q = NULL;
            size_t qn = 0;
            rc = decode_tokens(d, &s->via.array.ptr[i], &q, &qn);
            if (!rc && qn == 0) rc = fail(d, ZI_EINVAL, "empty sequence");
            if (!rc && zi_text_context_add_eos_sequence(c, q, qn, NULL))
                rc = fail(d, ZI_ENOMEM, "out of memory");
            free(q);
            pop(d, o2);
        }
        pop(d, old);
        if (rc) goto fail;
    }
    if (!is_nil(v[C_LP]))
        AT(d, "log_probabilities",
           get_i64(d, v[C_LP], 0, d->lim->max_logprobs, &c->log_probabilities));
    if (v[C_LPECHO])
        AT(d, "log_probabilities_echo", get_bool(d, v[C_LPECHO], &c->log_probabilities_echo));
    if (v[C_IGNEOS]) AT(d, "ignore_eos", get_bool(d, v[C_IGNEOS], &c->ignore_eos));
    if (!is_nil(v[C_SCHEMA])) {
        AT(d, "json_schema", get_str(d, v[C_SCHEMA], 0, &c->json_schema));
        c->has_json_schema = true;
    }
    if (!is_nil(v[C_SP])) AT(d, "sampling_params", dec_sampling(d, v[C_SP], &c->sampling_params));
    if (!is_nil(v[C_MATCHER])) {
        size_t old = push_key(d, "_matcher");
        rc = fail(d, ZI_EINVAL, "a grammar matcher cannot travel (must be nil)");
        pop(d, old);
        goto fail;
    }
    if (v[C_STATUS]) AT(d, "_status", get_status(d, v[C_STATUS], &c->status));
    if (!is_nil(v[C_CACHE]))
        AT(d, "_cache_seq_id", get_i64(d, v[C_CACHE], 0, INT64_MAX, &c->cache_seq_id));
    int64_t size = -1, start, active, end, cstart, cend, plen, commit;
    if ((rc = get_idx(d, v[C_SIZE], "_size", &size))) goto fail;
    if ((rc = get_idx(d, v[C_START], "_start_idx", &start))) goto fail;
    if ((rc = get_idx(d, v[C_ACTIVE], "_active_idx", &active))) goto fail;
    if ((rc = get_idx(d, v[C_END], "_end_idx", &end))) goto fail;
    if ((rc = get_idx(d, v[C_CSTART], "_completion_start_idx", &cstart))) goto fail;
    if ((rc = get_idx(d, v[C_CEND], "_completion_end_idx", &cend))) goto fail;
    if ((rc = get_idx(d, v[C_PLEN], "_prompt_len", &plen))) goto fail;
    if ((rc = get_idx(d, v[C_COMMIT], "_committed_idx", &commit))) goto fail;
    /* Derive as the seed's __post_init__ does. */
    if (start < 0) start = 0;
    if (commit < 0) commit = 0;
    if (active < 0) active = (int64_t)ntok;
    if (end < 0) end = active;
    if (cstart < 0) cstart = active;
    if (cend < 0) cend = active;
    if (plen < 0) plen = active;
    if (end > (int64_t)ntok) {
        size_t old = push_key(d, "_end_idx");
        rc = fail(d, ZI_EINVAL, "%lld is beyond the %zu tokens sent", (long long)end, ntok);
        pop(d, old);
        goto fail;
    }
    if (size >= 0 && size < end) {
        size_t old = push_key(d, "_size");
        rc = fail(d, ZI_EINVAL, "%lld is below _end_idx %lld", (long long)size, (long long)end);
        pop(d, old);
        goto fail;
    }
    if (end < 1) {
        size_t old = push_key(d, "tokens");
        rc = fail(d, ZI_EINVAL, "a context needs at least one token");
        pop(d, old);
        goto fail;
    }
    {
        /* Room for the valid tokens, in whole chunks; padding beyond
         * _end_idx is dropped. */
        int64_t cap = (end + ZI_CTX_CHUNK - 1) / ZI_CTX_CHUNK * ZI_CTX_CHUNK;
        c->tokens = calloc((size_t)cap, sizeof *c->tokens);
        c->lp_data = calloc((size_t)cap, sizeof *c->lp_data);
        if (!c->tokens || !c->lp_data) {
            rc = fail(d, ZI_ENOMEM, "out of memory");
            goto fail;
        }
        c->size = cap;
        memcpy(c->tokens, toks, (size_t)end * sizeof *toks);
    }
    c->start_idx = start;
    c->active_idx = active;
    c->end_idx = end;
    c->completion_start_idx = cstart;
    c->completion_end_idx = cend;
    c->prompt_len = plen;
    c->committed_idx = commit;
    if (!is_nil(v[C_LPDATA])) {
        size_t old = push_key(d, "_log_probabilities_data");
        const msgpack_object *m = v[C_LPDATA];
        if (m->type != MSGPACK_OBJECT_MAP)
            rc = wrong_type(d, m, "a map of token index to log probabilities");
        for (uint32_t i = 0; !rc && i < m->via.map.size; i++) {
            int64_t idx;
            rc = get_i64(d, &m->via.map.ptr[i].key, 0, end - 1, &idx);
            if (rc) break;
            char key[32];
            snprintf(key, sizeof key, "%lld", (long long)idx);
            size_t o2 = push_key(d, key);
            if (c->lp_data[idx])
                rc = fail(d, ZI_EINVAL, "index appears twice");
            else
                rc = dec_logprobs_opt(d, &m->via.map.ptr[i].val, &c->lp_data[idx]);
            pop(d, o2);
        }
        pop(d, old);
        if (rc) goto fail;
    }
    if (v[C_INIT]) AT(d, "_is_initial_prompt", get_bool(d, v[C_INIT], &c->is_initial_prompt));
    if (v[C_DRAFT]) AT(d, "_draft_offset", get_i64(d, v[C_DRAFT], 0, INT32_MAX, &c->draft_offset));
    if ((rc = zi_text_context_check(c, d->err))) {
        if (d->path.n) zi_error_prefix(d->err, "%s", d->path.s);
        goto fail;
    }
    free(toks);
    return ZI_OK;
fail:
    free(toks);
    zi_text_context_free(c);
    return rc;
}

int zi_codec_decode_text_context(const msgpack_object *o, const zi_codec_limits *lim,
                                 const char *path, zi_text_context *out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "context: NULL pointer");
    zi_codec_limits tmp;
    dec d;
    dec_init(&d, limits_or_default(lim, &tmp), path, "context", err);
    return dec_context(&d, o, out);
}

/* ---- encoders -------------------------------------------------------------- */

/* Encoders refuse strings their own decoder would refuse, so a bad string
 * fails where it was made rather than at the peer. */
static int enc_str_ok(const zi_string *s, const char *name, size_t i, zi_error *err) {
    if (!s->p || utf8_bad_at((const uint8_t *)s->p, s->len) == s->len) return ZI_OK;
    if (i == SIZE_MAX) return zi_error_set(err, ZI_EINVAL, "%s: not valid UTF-8", name);
    return zi_error_set(err, ZI_EINVAL, "%s[%zu]: not valid UTF-8", name, i);
}

/* Identifiers: also short and free of NUL bytes, as the decoder wants. */
static int enc_id_ok(const zi_string *s, const char *name, zi_error *err) {
    if (s->len > ID_MAX_BYTES)
        return zi_error_set(err, ZI_EINVAL, "%s: %zu bytes exceed the limit of %d", name, s->len,
                            ID_MAX_BYTES);
    if (s->len && memchr(s->p, 0, s->len))
        return zi_error_set(err, ZI_EINVAL, "%s: contains a NUL byte", name);
    return enc_str_ok(s, name, SIZE_MAX, err);
}

static int enc_list_ok(const zi_str_list *l, const char *name, zi_error *err) {
    for (size_t i = 0; i < l->n; i++) {
        int rc = enc_str_ok(&l->v[i], name, i, err);
        if (rc) return rc;
    }
    return ZI_OK;
}

#define P(expr)                                                                                    \
    do {                                                                                           \
        if ((expr) != 0) return zi_error_set(err, ZI_ENOMEM, "encode: out of memory");             \
    } while (0)

static int pack_key(msgpack_packer *pk, const char *k) {
    return msgpack_pack_str_with_body(pk, k, strlen(k));
}

/* Never hands msgpack a NULL source, even for zero bytes. */
static int pack_str(msgpack_packer *pk, const char *p, size_t n) {
    return msgpack_pack_str_with_body(pk, p ? p : "", p ? n : 0);
}

static int pack_np_header(msgpack_packer *pk, const char *dtype, size_t n, size_t bytes) {
    if (msgpack_pack_map(pk, 4) || pack_key(pk, "__np__") || msgpack_pack_true(pk) ||
        pack_key(pk, "dtype") || pack_key(pk, dtype) || pack_key(pk, "shape") ||
        msgpack_pack_array(pk, 1) || msgpack_pack_uint64(pk, n) || pack_key(pk, "data") ||
        msgpack_pack_bin(pk, bytes))
        return -1;
    return 0;
}

int zi_codec_pack_tokens(msgpack_packer *pk, const int32_t *ids, size_t n, zi_error *err) {
    if (!pk || (!ids && n)) return zi_error_set(err, ZI_EINVAL, "tokens: NULL pointer");
    if (n > UINT32_MAX / 8)
        return zi_error_set(err, ZI_ERANGE, "tokens: %zu is too many to encode", n);
    P(pack_np_header(pk, "int64", n, n * 8));
    uint8_t buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t v = (uint64_t)(int64_t)ids[i];
        for (int b = 0; b < 8; b++) buf[k++] = (uint8_t)(v >> (8 * b));
        if (k == sizeof buf) {
            P(msgpack_pack_bin_body(pk, buf, k));
            k = 0;
        }
    }
    if (k) P(msgpack_pack_bin_body(pk, buf, k));
    return ZI_OK;
}

int zi_codec_pack_f32(msgpack_packer *pk, const float *v, size_t n, zi_error *err) {
    if (!pk || (!v && n)) return zi_error_set(err, ZI_EINVAL, "values: NULL pointer");
    if (n > UINT32_MAX / 4)
        return zi_error_set(err, ZI_ERANGE, "values: %zu is too many to encode", n);
    P(pack_np_header(pk, "float32", n, n * 4));
    uint8_t buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], 4);
        for (int b = 0; b < 4; b++) buf[k++] = (uint8_t)(bits >> (8 * b));
        if (k == sizeof buf) {
            P(msgpack_pack_bin_body(pk, buf, k));
            k = 0;
        }
    }
    if (k) P(msgpack_pack_bin_body(pk, buf, k));
    return ZI_OK;
}

static int pack_i32_array(msgpack_packer *pk, const zi_i32_list *l) {
    if (msgpack_pack_array(pk, l->n)) return -1;
    for (size_t i = 0; i < l->n; i++)
        if (msgpack_pack_int32(pk, l->v[i])) return -1;
    return 0;
}

static int pack_str_list(msgpack_packer *pk, const zi_str_list *l) {
    if (msgpack_pack_array(pk, l->n)) return -1;
    for (size_t i = 0; i < l->n; i++)
        if (pack_str(pk, l->v[i].p, l->v[i].len)) return -1;
    return 0;
}

int zi_codec_pack_sampling_params(msgpack_packer *pk, const zi_sampling_params *sp, zi_error *err) {
    if (!pk || !sp) return zi_error_set(err, ZI_EINVAL, "sampling_params: NULL pointer");
    int rc = zi_sampling_params_validate(sp, "sampling_params", err);
    if (!rc) rc = enc_list_ok(&sp->stop, "sampling_params.stop", err);
    if (rc) return rc;
    P(msgpack_pack_map(pk, 14));
    P(pack_key(pk, "top_k") || msgpack_pack_int32(pk, sp->top_k));
    P(pack_key(pk, "top_p") || msgpack_pack_double(pk, sp->top_p));
    P(pack_key(pk, "min_p") || msgpack_pack_double(pk, sp->min_p));
    P(pack_key(pk, "temperature") || msgpack_pack_double(pk, sp->temperature));
    P(pack_key(pk, "frequency_penalty") || msgpack_pack_double(pk, sp->frequency_penalty));
    P(pack_key(pk, "presence_penalty") || msgpack_pack_double(pk, sp->presence_penalty));
    P(pack_key(pk, "repetition_penalty") || msgpack_pack_double(pk, sp->repetition_penalty));
    P(pack_key(pk, "max_new_tokens") ||
      (sp->max_new_tokens < 0 ? msgpack_pack_nil(pk) : msgpack_pack_int64(pk, sp->max_new_tokens)));
    P(pack_key(pk, "min_new_tokens") || msgpack_pack_int64(pk, sp->min_new_tokens));
    P(pack_key(pk, "ignore_eos") ||
      (sp->ignore_eos ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "stop") || (sp->stop.n ? pack_str_list(pk, &sp->stop) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "stop_token_ids") ||
      (sp->stop_token_ids.n ? pack_i32_array(pk, &sp->stop_token_ids) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "detokenize") ||
      (sp->detokenize ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "seed") || msgpack_pack_uint64(pk, sp->seed));
    return ZI_OK;
}

/* Writes pre-encoded msgpack bytes, after checking they hold one object. */
static int pack_raw(msgpack_packer *pk, const zi_bytes *b, const char *name, zi_error *err) {
    int rc = zi_msgpack_check(b->p, b->len, NULL, err);
    if (rc) return zi_error_prefix(err, "%s", name);
    P(pk->callback(pk->data, (const char *)b->p, b->len));
    return ZI_OK;
}

int zi_codec_pack_request(msgpack_packer *pk, const zi_request *r, zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "request: NULL pointer");
    if (!r->id.len) return zi_error_set(err, ZI_EINVAL, "id: must not be empty");
    bool has_prompt = r->prompt_kind == ZI_PROMPT_TEXT || r->prompt_kind == ZI_PROMPT_TOKENS;
    if (has_prompt == (r->n_messages > 0))
        return zi_error_set(err, ZI_EINVAL,
                            "prompt: exactly one of prompt and messages is required");
    int rc;
    if ((rc = enc_id_ok(&r->id, "id", err)) ||
        (rc = enc_id_ok(&r->model_name, "model_name", err)) ||
        (rc = enc_str_ok(&r->prompt_text, "prompt", SIZE_MAX, err)) ||
        (rc = enc_id_ok(&r->request_path, "request_path", err)) ||
        (rc = enc_list_ok(&r->stop, "stop", err)))
        return rc;
    for (size_t i = 0; i < r->n_messages; i++) {
        if ((rc = enc_str_ok(&r->messages[i].role, "messages.role", i, err)) ||
            (rc = enc_str_ok(&r->messages[i].content, "messages.content", i, err)))
            return rc;
    }
    if ((rc = zi_sampling_params_validate(&r->sampling_params, "sampling_params", err))) return rc;
    /* Nine keys always, the rest when set. */
    size_t n = 9 + (has_prompt ? 1 : 0) + (r->n_messages ? 1 : 0) + (r->stop.n ? 1 : 0) +
               (r->response_format.len ? 1 : 0) + (r->tools.len ? 1 : 0) +
               (r->chat_template_options.len ? 1 : 0);
    P(msgpack_pack_map(pk, n));
    P(pack_key(pk, "id") || pack_str(pk, r->id.p, r->id.len));
    P(pack_key(pk, "index") || msgpack_pack_int64(pk, r->index));
    P(pack_key(pk, "model_name") || pack_str(pk, r->model_name.p, r->model_name.len));
    if (r->prompt_kind == ZI_PROMPT_TEXT)
        P(pack_key(pk, "prompt") || pack_str(pk, r->prompt_text.p, r->prompt_text.len));
    if (r->prompt_kind == ZI_PROMPT_TOKENS) {
        P(pack_key(pk, "prompt"));
        if ((rc = zi_codec_pack_tokens(pk, r->prompt_tokens.v, r->prompt_tokens.n, err))) return rc;
    }
    if (r->n_messages) {
        P(pack_key(pk, "messages") || msgpack_pack_array(pk, r->n_messages));
        for (size_t i = 0; i < r->n_messages; i++) {
            const zi_message *m = &r->messages[i];
            P(msgpack_pack_map(pk, 2) || pack_key(pk, "role") ||
              pack_str(pk, m->role.p, m->role.len) || pack_key(pk, "content") ||
              pack_str(pk, m->content.p, m->content.len));
        }
    }
    if (r->tools.len) {
        P(pack_key(pk, "tools"));
        if ((rc = pack_raw(pk, &r->tools, "tools", err))) return rc;
    }
    if (r->response_format.len) {
        P(pack_key(pk, "response_format"));
        if ((rc = pack_raw(pk, &r->response_format, "response_format", err))) return rc;
    }
    P(pack_key(pk, "timestamp_ns") || msgpack_pack_int64(pk, r->timestamp_ns));
    P(pack_key(pk, "request_path") ||
      (r->request_path.len ? pack_str(pk, r->request_path.p, r->request_path.len)
                           : pack_str(pk, "/", 1)));
    P(pack_key(pk, "logprobs") || msgpack_pack_int64(pk, r->logprobs));
    P(pack_key(pk, "echo") || (r->echo ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    if (r->stop.n) P(pack_key(pk, "stop") || pack_str_list(pk, &r->stop));
    if (r->chat_template_options.len) {
        P(pack_key(pk, "chat_template_options"));
        if ((rc = pack_raw(pk, &r->chat_template_options, "chat_template_options", err))) return rc;
    }
    P(pack_key(pk, "sampling_params"));
    if ((rc = zi_codec_pack_sampling_params(pk, &r->sampling_params, err))) return rc;
    P(pack_key(pk, "stream") || (r->stream ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    return ZI_OK;
}

int zi_codec_pack_logprobs(msgpack_packer *pk, const zi_logprobs *lp, zi_error *err) {
    if (!pk || !lp) return zi_error_set(err, ZI_EINVAL, "log_probabilities: NULL pointer");
    for (size_t i = 0; i < lp->n; i++) {
        float t = lp->token_logprobs[i];
        if (isnan(t) || (isinf(t) && t > 0))
            return zi_error_set(err, ZI_EINVAL,
                                "token_log_probabilities[%zu]: %g is not a log probability", i,
                                (double)t);
        for (size_t j = 0; j < lp->top[i].n; j++) {
            float x = lp->top[i].logprobs[j];
            if (lp->top[i].ids[j] < 0 || isnan(x) || (isinf(x) && x > 0))
                return zi_error_set(err, ZI_EINVAL,
                                    "top_log_probabilities[%zu]: entry %zu is invalid", i, j);
        }
    }
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "token_log_probabilities"));
    int rc = zi_codec_pack_f32(pk, lp->token_logprobs, lp->n, err);
    if (rc) return rc;
    P(pack_key(pk, "top_log_probabilities") || msgpack_pack_array(pk, lp->n));
    for (size_t i = 0; i < lp->n; i++) {
        P(msgpack_pack_map(pk, lp->top[i].n));
        for (size_t j = 0; j < lp->top[i].n; j++)
            P(msgpack_pack_int32(pk, lp->top[i].ids[j]) ||
              msgpack_pack_float(pk, lp->top[i].logprobs[j]));
    }
    return ZI_OK;
}

int zi_codec_pack_text_response(msgpack_packer *pk, const zi_text_response *r, zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "text_response: NULL pointer");
    if (r->is_text) {
        int rc = enc_str_ok(&r->text, "next_token", SIZE_MAX, err);
        if (rc) return rc;
    } else if (r->token < 0) {
        return zi_error_set(err, ZI_EINVAL, "next_token: %d is not a token id", (int)r->token);
    }
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "next_token"));
    P(r->is_text ? pack_str(pk, r->text.p, r->text.len) : msgpack_pack_int32(pk, r->token));
    P(pack_key(pk, "log_probabilities"));
    if (!r->logprobs)
        P(msgpack_pack_nil(pk));
    else
        return zi_codec_pack_logprobs(pk, r->logprobs, err);
    return ZI_OK;
}

int zi_codec_pack_text_generation_response(msgpack_packer *pk, const zi_text_generation_response *r,
                                           zi_error *err) {
    if (!pk || !r) return zi_error_set(err, ZI_EINVAL, "text_generation_response: NULL pointer");
    const char *st = zi_gen_status_name(r->final_status);
    if (!st)
        return zi_error_set(err, ZI_EINVAL, "final_status: %d is not a status",
                            (int)r->final_status);
    P(msgpack_pack_map(pk, 2) || pack_key(pk, "tokens") || msgpack_pack_array(pk, r->n));
    for (size_t i = 0; i < r->n; i++) {
        int rc = zi_codec_pack_text_response(pk, &r->tokens[i], err);
        if (rc) return rc;
    }
    P(pack_key(pk, "final_status") || pack_key(pk, st));
    return ZI_OK;
}

int zi_codec_pack_text_context(msgpack_packer *pk, const zi_text_context *c, zi_error *err) {
    if (!pk || !c) return zi_error_set(err, ZI_EINVAL, "context: NULL pointer");
    int rc = zi_text_context_check(c, err);
    if (!rc) rc = enc_id_ok(&c->request_id, "request_id", err);
    if (!rc) rc = enc_str_ok(&c->prompt, "prompt", SIZE_MAX, err);
    if (!rc) rc = enc_str_ok(&c->json_schema, "json_schema", SIZE_MAX, err);
    if (rc) return rc;
    size_t n_lp = 0;
    for (int64_t i = 0; i < c->end_idx; i++) n_lp += c->lp_data[i] != NULL;
    P(msgpack_pack_map(pk, C_N));
    P(pack_key(pk, "request_id") || pack_str(pk, c->request_id.p, c->request_id.len));
    P(pack_key(pk, "prompt") ||
      (c->prompt.len ? pack_str(pk, c->prompt.p, c->prompt.len) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "max_length") || msgpack_pack_int64(pk, c->max_length));
    P(pack_key(pk, "tokens"));
    if ((rc = zi_codec_pack_tokens(pk, c->tokens, (size_t)c->end_idx, err))) return rc;
    P(pack_key(pk, "eos_token_ids") || pack_i32_array(pk, &c->eos_token_ids));
    P(pack_key(pk, "eos_sequences") || msgpack_pack_array(pk, c->n_eos_sequences));
    for (size_t i = 0; i < c->n_eos_sequences; i++) P(pack_i32_array(pk, &c->eos_sequences[i]));
    P(pack_key(pk, "log_probabilities") ||
      (c->log_probabilities ? msgpack_pack_int64(pk, c->log_probabilities) : msgpack_pack_nil(pk)));
    P(pack_key(pk, "log_probabilities_echo") ||
      (c->log_probabilities_echo ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "ignore_eos") ||
      (c->ignore_eos ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "json_schema") ||
      (c->has_json_schema ? pack_str(pk, c->json_schema.p, c->json_schema.len)
                          : msgpack_pack_nil(pk)));
    P(pack_key(pk, "sampling_params"));
    if ((rc = zi_codec_pack_sampling_params(pk, &c->sampling_params, err))) return rc;
    P(pack_key(pk, "_matcher") || msgpack_pack_nil(pk));
    P(pack_key(pk, "_status") || pack_key(pk, zi_gen_status_name(c->status)));
    P(pack_key(pk, "_cache_seq_id") ||
      (c->cache_seq_id >= 0 ? msgpack_pack_int64(pk, c->cache_seq_id) : msgpack_pack_nil(pk)));
    /* Only [0, end_idx) is sent, so the receiver's array is that long. */
    P(pack_key(pk, "_size") || msgpack_pack_int64(pk, c->end_idx));
    P(pack_key(pk, "_start_idx") || msgpack_pack_int64(pk, c->start_idx));
    P(pack_key(pk, "_active_idx") || msgpack_pack_int64(pk, c->active_idx));
    P(pack_key(pk, "_end_idx") || msgpack_pack_int64(pk, c->end_idx));
    P(pack_key(pk, "_completion_start_idx") || msgpack_pack_int64(pk, c->completion_start_idx));
    P(pack_key(pk, "_completion_end_idx") || msgpack_pack_int64(pk, c->completion_end_idx));
    P(pack_key(pk, "_prompt_len") || msgpack_pack_int64(pk, c->prompt_len));
    P(pack_key(pk, "_committed_idx") || msgpack_pack_int64(pk, c->committed_idx));
    P(pack_key(pk, "_log_probabilities_data") || msgpack_pack_map(pk, n_lp));
    for (int64_t i = 0; i < c->end_idx; i++) {
        if (!c->lp_data[i]) continue;
        P(msgpack_pack_int64(pk, i));
        if ((rc = zi_codec_pack_logprobs(pk, c->lp_data[i], err))) return rc;
    }
    P(pack_key(pk, "_is_initial_prompt") ||
      (c->is_initial_prompt ? msgpack_pack_true(pk) : msgpack_pack_false(pk)));
    P(pack_key(pk, "_draft_offset") || msgpack_pack_int64(pk, c->draft_offset));
    return ZI_OK;
}

/* ---- to and from bytes ----------------------------------------------------- */

static int finish_bytes(msgpack_sbuffer *sb, int rc, char **buf, size_t *len) {
    if (rc) {
        msgpack_sbuffer_destroy(sb);
        return rc;
    }
    *len = sb->size;
    *buf = msgpack_sbuffer_release(sb);
    return ZI_OK;
}

int zi_codec_request_to_bytes(const zi_request *r, char **buf, size_t *len, zi_error *err) {
    if (!buf || !len) return zi_error_set(err, ZI_EINVAL, "request: NULL output");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    return finish_bytes(&sb, zi_codec_pack_request(&pk, r, err), buf, len);
}

int zi_codec_text_context_to_bytes(const zi_text_context *ctx, char **buf, size_t *len,
                                   zi_error *err) {
    if (!buf || !len) return zi_error_set(err, ZI_EINVAL, "context: NULL output");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    return finish_bytes(&sb, zi_codec_pack_text_context(&pk, ctx, err), buf, len);
}

int zi_codec_request_from_bytes(const void *buf, size_t len, const zi_codec_limits *lim,
                                zi_request *out, zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "request: NULL output");
    zi_request_init(out);
    msgpack_unpacked u;
    int rc = zi_msgpack_parse(buf, len, lim, &u, err);
    if (rc) return rc;
    rc = zi_codec_decode_request(&u.data, lim, NULL, out, err);
    msgpack_unpacked_destroy(&u);
    return rc;
}

int zi_codec_text_context_from_bytes(const void *buf, size_t len, const zi_codec_limits *lim,
                                     zi_text_context *out, zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "context: NULL output");
    zi_text_context_zero(out);
    msgpack_unpacked u;
    int rc = zi_msgpack_parse(buf, len, lim, &u, err);
    if (rc) return rc;
    rc = zi_codec_decode_text_context(&u.data, lim, NULL, out, err);
    msgpack_unpacked_destroy(&u);
    return rc;
}

const msgpack_object *zi_map_get(const msgpack_object *o, const char *key) {
    if (!o || o->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            memcmp(k->via.str.ptr, key, kl) == 0)
            return &o->via.map.ptr[i].val;
    }
    return NULL;
}

/* JSON text of a msgpack object, appended to a msgpack_sbuffer. */
typedef msgpack_sbuffer jbuf;

static int jb_add(jbuf *b, const char *s, size_t n) {
    return msgpack_sbuffer_write(b, s, n) ? ZI_ENOMEM : ZI_OK;
}

static int jb_str(jbuf *b, const char *s, size_t n) {
    int rc = jb_add(b, "\"", 1);
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\')
            esc[0] = '\\', esc[1] = (char)c, rc = jb_add(b, esc, 2);
        else if (c < 0x20)
            snprintf(esc, sizeof esc, "\\u%04x", c), rc = jb_add(b, esc, 6);
        else
            rc = jb_add(b, (const char *)&s[i], 1);
    }
    return rc ? rc : jb_add(b, "\"", 1);
}

static int to_json(jbuf *b, const msgpack_object *o, zi_error *err) {
    char num[40];
    int rc = ZI_OK;
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return jb_add(b, "null", 4);
    case MSGPACK_OBJECT_BOOLEAN:
        return o->via.boolean ? jb_add(b, "true", 4) : jb_add(b, "false", 5);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return jb_add(b, num,
                      (size_t)snprintf(num, sizeof num, "%llu", (unsigned long long)o->via.u64));
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return jb_add(b, num, (size_t)snprintf(num, sizeof num, "%lld", (long long)o->via.i64));
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64))
            return zi_error_set(err, ZI_EINVAL, "response_format.json_schema: NaN or infinity");
        return jb_add(b, num, (size_t)snprintf(num, sizeof num, "%.17g", o->via.f64));
    case MSGPACK_OBJECT_STR:
        return jb_str(b, o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY:
        rc = jb_add(b, "[", 1);
        for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
            if (i) rc = jb_add(b, ",", 1);
            if (!rc) rc = to_json(b, &o->via.array.ptr[i], err);
        }
        return rc ? rc : jb_add(b, "]", 1);
    case MSGPACK_OBJECT_MAP:
        rc = jb_add(b, "{", 1);
        for (uint32_t i = 0; i < o->via.map.size && !rc; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                return zi_error_set(err, ZI_EINVAL,
                                    "response_format.json_schema: map keys must be strings");
            if (i) rc = jb_add(b, ",", 1);
            if (!rc) rc = jb_str(b, k->via.str.ptr, k->via.str.size);
            if (!rc) rc = jb_add(b, ":", 1);
            if (!rc) rc = to_json(b, &o->via.map.ptr[i].val, err);
        }
        return rc ? rc : jb_add(b, "}", 1);
    default:
        return zi_error_set(err, ZI_EINVAL, "response_format.json_schema: %s has no JSON form",
                            zi_msgpack_type_name(o));
    }
}

int zi_response_format_kind(const zi_bytes *rf, int *kind, char **schema, zi_error *err) {
    *kind = ZI_RF_NONE;
    if (schema) *schema = NULL;
    if (!rf->len) return ZI_OK;
    msgpack_unpacked u;
    int rc = zi_msgpack_parse(rf->p, rf->len, NULL, &u, err);
    if (rc) return zi_error_prefix(err, "response_format");
    const msgpack_object *type = zi_map_get(&u.data, "type");
    if (!type || type->type != MSGPACK_OBJECT_STR) {
        rc = zi_error_set(err, ZI_EINVAL, "response_format.type: missing or not a string");
    } else {
        if (is_key(type, "json_object")) {
            *kind = ZI_RF_JSON_OBJECT;
        } else if (is_key(type, "json_schema")) {
            /* The schema itself, or OpenAI's {"name", "schema", "strict"}. */
            const msgpack_object *js = zi_map_get(&u.data, "json_schema");
            const char *where = "response_format.json_schema";
            if (js && zi_map_get(js, "schema")) /* no schema keyword: OpenAI's wrapper */
                js = zi_map_get(js, "schema"), where = "response_format.json_schema.schema";
            if (!js || js->type != MSGPACK_OBJECT_MAP) {
                rc = zi_error_set(err, ZI_EINVAL, "%s: missing or not a map", where);
            } else {
                *kind = ZI_RF_JSON_SCHEMA;
                if (schema) { /* NUL-terminated text */
                    jbuf b;
                    msgpack_sbuffer_init(&b);
                    rc = to_json(&b, js, err);
                    if (!rc) rc = jb_add(&b, "", 1);
                    if (rc == ZI_ENOMEM) zi_error_set(err, ZI_ENOMEM, "out of memory");
                    size_t len;
                    rc = finish_bytes(&b, rc, schema, &len);
                }
            }
        } else if (!is_key(type, "text")) {
            uint32_t n = type->via.str.size;
            rc = zi_error_set(err, ZI_EUNSUPPORTED,
                              "response_format: type '%.*s' is not supported (text, json_object or "
                              "json_schema)",
                              (int)(n < 64 ? n : 64), type->via.str.ptr);
        }
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}
