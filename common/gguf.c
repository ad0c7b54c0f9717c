/*
 * gguf.c - the GGUF reader declared in gguf.h.
 *
 * The whole file is parsed and validated once, in zi_gguf_open*, by a
 * bounds-checked cursor (struct rd) over the bytes. Every read asks the
 * cursor for N bytes first, so a truncated or hostile file fails with a
 * message instead of reading past the end. Counts from the header and from
 * arrays are compared with the bytes left *before* anything is allocated or
 * iterated, so allocation and work are bounded by a small multiple of the
 * file size whatever the counts say. After open, the records (zi_gguf_kv,
 * zi_gguf_tensor) only hold pointers into already-validated ranges, which
 * is what lets the accessors be simple.
 *
 * Names are looked up through small open-addressing hash indexes built
 * while parsing; the same insertion detects duplicate keys and tensor names.
 * See docs/gguf.md for the list of checks and why each exists.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_ARRAY_DEPTH 8 /* arrays nested deeper than this are rejected */
#define GGUF_HEADER_BYTES 24u  /* magic, version, tensor count, kv count */
/* Smallest possible encodings, used to reject counts that cannot fit. */
#define GGUF_MIN_KV_BYTES 13u     /* key length (8) + type (4) + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 32u /* name len 8 + n_dims 4 + ne 8 + type 4 + offset 8 */
#define GGUF_NAME_SHOW 80         /* longest name quoted in full in a message */

struct zi_gguf {
    const uint8_t *base;
    size_t size;
    int mapped;     /* base came from mmap and must be unmapped */
    unsigned flags; /* ZI_GGUF_* open options */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* start of the data section, from base */
    uint64_t n_kv;
    zi_gguf_kv *kvs;
    uint64_t n_tensors;
    zi_gguf_tensor *tensors;
    /* Hash indexes: slot holds index+1, 0 is empty; capacity a power of two. */
    uint64_t *kv_index;
    uint64_t kv_cap;
    uint64_t *t_index;
    uint64_t t_cap;
};

/* ---- names and sizes ---------------------------------------------------- */

const char *zi_gguf_type_name(zi_gguf_type t) {
    static const char *const names[] = {
        "uint8", "int8",   "uint16", "int16",  "uint32", "int32",   "float32",
        "bool",  "string", "array",  "uint64", "int64",  "float64",
    };
    if ((unsigned)t < sizeof names / sizeof names[0]) return names[t];
    return "?";
}

/* Every tensor type ggml defines, by its number: name, values and bytes per
 * block (ggml.c's type_traits, gguf-py's GGML_QUANT_SIZES), and whether
 * zinfer reads it. The gaps (4, 5, 31..33) are types ggml removed. Block
 * sizes are facts of the format even where zinfer has no kernel, so the
 * reader checks a tensor of any of these types the same way; the layouts of
 * the supported ones are in docs/gguf.md and kernels/cpu/dequant.c. */
static const struct ggml_type_info {
    const char *name; /* NULL: not a type ggml defines */
    uint16_t elems, bytes;
    uint8_t supported;
} ggml_types[] = {
    [0] = {"F32", 1, 4, 1},
    [1] = {"F16", 1, 2, 1},
    [2] = {"Q4_0", 32, 18, 1}, /* f16 scale + 32 4-bit values */
    [3] = {"Q4_1", 32, 20, 1}, /* f16 scale + f16 min + 32 4-bit values */
    [6] = {"Q5_0", 32, 22, 1}, /* Q4_0 + 32 high bits */
    [7] = {"Q5_1", 32, 24, 1}, /* Q4_1 + 32 high bits */
    [8] = {"Q8_0", 32, 34, 1}, /* f16 scale + 32 int8 values */
    [9] = {"Q8_1", 32, 40, 0},
    [10] = {"Q2_K", 256, 84, 1},  /* 16 4+4-bit scales/mins, 256 2-bit values, 2 f16 */
    [11] = {"Q3_K", 256, 110, 1}, /* 256 high bits, 256 2-bit values, 16 6-bit scales, f16 */
    [12] = {"Q4_K", 256, 144, 1}, /* 2 f16, 8 6-bit scales and mins, 256 4-bit values */
    [13] = {"Q5_K", 256, 176, 1}, /* Q4_K + 256 high bits */
    [14] = {"Q6_K", 256, 210, 1}, /* 256 4-bit + 2-bit values, 16 int8 scales, f16 */
    [15] = {"Q8_K", 256, 292, 0},
    [16] = {"IQ2_XXS", 256, 66, 0},
    [17] = {"IQ2_XS", 256, 74, 0},
    [18] = {"IQ3_XXS", 256, 98, 0},
    [19] = {"IQ1_S", 256, 50, 0},
    [20] = {"IQ4_NL", 32, 18, 1}, /* f16 scale + 32 4-bit codes */
    [21] = {"IQ3_S", 256, 110, 0},
    [22] = {"IQ2_S", 256, 82, 0},
    [23] = {"IQ4_XS", 256, 136, 1}, /* f16, 8 6-bit scales, 256 4-bit codes */
    [24] = {"I8", 1, 1, 0},
    [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},
    [27] = {"I64", 1, 8, 0},
    [28] = {"F64", 1, 8, 0},
    [29] = {"IQ1_M", 256, 56, 0},
    [30] = {"BF16", 1, 2, 1},
    [34] = {"TQ1_0", 256, 54, 0},
    [35] = {"TQ2_0", 256, 66, 0},
    [39] = {"MXFP4", 32, 17, 1}, /* E8M0 scale + 32 4-bit e2m1 codes */
    [40] = {"NVFP4", 64, 36, 0},
    [41] = {"Q1_0", 128, 18, 0},
};

/* The entry for type t, NULL for a number ggml does not define. */
static const struct ggml_type_info *ggml_type(int t) {
    if (t < 0 || (size_t)t >= sizeof ggml_types / sizeof ggml_types[0] || !ggml_types[t].name)
        return NULL;
    return &ggml_types[t];
}

const char *zi_ggml_type_name(int t) {
    const struct ggml_type_info *ti = ggml_type(t);
    return ti ? ti->name : "?";
}

int zi_ggml_type_supported(int t) {
    const struct ggml_type_info *ti = ggml_type(t);
    return ti && ti->supported;
}

int zi_ggml_type_block(int t, size_t *elems, size_t *bytes) {
    const struct ggml_type_info *ti = ggml_type(t);
    if (elems) *elems = ti ? ti->elems : 0;
    if (bytes) *bytes = ti ? ti->bytes : 0;
    return ti != NULL;
}

size_t zi_ggml_type_block_bytes(int t) {
    return zi_ggml_type_supported(t) ? ggml_types[t].bytes : 0;
}

size_t zi_ggml_type_block_elems(int t) {
    return zi_ggml_type_supported(t) ? ggml_types[t].elems : 0;
}

/* Size of a fixed-size metadata value, 0 for string/array/invalid tags. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case ZI_GGUF_UINT8:
    case ZI_GGUF_INT8:
    case ZI_GGUF_BOOL:
        return 1;
    case ZI_GGUF_UINT16:
    case ZI_GGUF_INT16:
        return 2;
    case ZI_GGUF_UINT32:
    case ZI_GGUF_INT32:
    case ZI_GGUF_FLOAT32:
        return 4;
    case ZI_GGUF_UINT64:
    case ZI_GGUF_INT64:
    case ZI_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

/* Fewest bytes one value of type t can occupy (for count plausibility). */
static uint64_t min_value_size(uint32_t t) {
    if (t == ZI_GGUF_STRING) return 8; /* length only */
    if (t == ZI_GGUF_ARRAY) return 12; /* element type + count */
    return scalar_size(t);
}

int zi_str_eq(zi_str s, const char *c) {
    if (!c) return 0;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

/* Little-endian loads; the mapping gives no alignment guarantee. */
static uint32_t ld32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t ld64(const uint8_t *p) {
    return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

/* Copies a name into buf for a message: at most GGUF_NAME_SHOW bytes,
 * non-printable bytes shown as '?', so a hostile name keeps the message on
 * one readable line. */
static const char *show(char *buf, size_t cap, const char *p, uint64_t len) {
    size_t n = len > GGUF_NAME_SHOW ? GGUF_NAME_SHOW : (size_t)len;
    if (n + 4 > cap) n = cap > 4 ? cap - 4 : 0;
    size_t i;
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        buf[i] = (ch >= 0x20 && ch < 0x7f) || ch >= 0x80 ? (char)ch : '?';
    }
    if (n < len) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

/* ---- hash index ----------------------------------------------------------- */

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* Capacity for n entries at most half full; 0 when it cannot be allocated. */
static uint64_t index_cap(uint64_t n) {
    uint64_t cap = 8;
    while (cap < n * 2) {
        if (cap > (SIZE_MAX / sizeof(uint64_t)) / 2) return 0;
        cap *= 2;
    }
    return cap;
}

/* Finds name (p, n) in an index over records `stride` bytes apart whose
 * first record's name is at `names`. Returns the slot holding it, or the
 * empty slot where it would go (*found says which). */
static uint64_t index_probe(const uint64_t *slots, uint64_t cap, const zi_str *names, size_t stride,
                            const char *p, uint64_t n, int *found) {
    uint64_t mask = cap - 1;
    uint64_t s = hash_bytes(p, n) & mask;
    for (;;) {
        uint64_t v = slots[s];
        if (v == 0) {
            *found = 0;
            return s;
        }
        const zi_str *nm = (const zi_str *)((const char *)names + (v - 1) * stride);
        if (nm->len == n && (n == 0 || memcmp(nm->ptr, p, n) == 0)) {
            *found = 1;
            return s;
        }
        s = (s + 1) & mask;
    }
}

/* ---- parsing ---------------------------------------------------------------- */

/* Where the parser is, for messages: "metadata key 'name'" once the name is
 * read, "metadata key #5" before; likewise "tensor 'x'" / "tensor #3". */
enum where { W_HEADER, W_KV, W_TENSOR };

struct rd {
    const uint8_t *base;
    size_t size;
    size_t pos;
    zi_error *err;
    enum where where;
    uint64_t index;   /* entry number within W_KV / W_TENSOR */
    const char *name; /* entry's name once read, else NULL */
    uint64_t name_len;
    uint64_t work; /* values visited, bounded by the file size */
};

/* The parser's position as words, for the start of messages. */
static const char *where_str(const struct rd *r, char *buf, size_t cap) {
    char nm[GGUF_NAME_SHOW + 8];
    const char *kind = r->where == W_KV ? "metadata key" : "tensor";
    if (r->where == W_HEADER) {
        snprintf(buf, cap, "header");
    } else if (r->name && r->name_len) {
        snprintf(buf, cap, "%s '%s'", kind, show(nm, sizeof nm, r->name, r->name_len));
    } else {
        snprintf(buf, cap, "%s #%llu", kind, (unsigned long long)r->index);
    }
    return buf;
}

/* Fails with "truncated: <where> <what> at byte X needs N bytes, file has M
 * left" unless n bytes remain. */
static int need(struct rd *r, uint64_t n, const char *what) {
    if (n <= r->size - r->pos) return ZI_OK;
    char w[GGUF_NAME_SHOW + 64];
    return zi_error_set(
        r->err, ZI_EFORMAT, "truncated: %s %s at byte %zu needs %llu bytes, file has %zu left",
        where_str(r, w, sizeof w), what, r->pos, (unsigned long long)n, r->size - r->pos);
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what) {
    int rc = need(r, 4, what);
    if (rc) return rc;
    *v = ld32(r->base + r->pos);
    r->pos += 4;
    return ZI_OK;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what) {
    int rc = need(r, 8, what);
    if (rc) return rc;
    *v = ld64(r->base + r->pos);
    r->pos += 8;
    return ZI_OK;
}

/* A GGUF string: u64 length then bytes, all within the file. */
static int rd_str(struct rd *r, zi_str *s, const char *what) {
    char buf[64];
    uint64_t len;
    snprintf(buf, sizeof buf, "%s length", what);
    int rc = rd_u64(r, &len, buf);
    if (rc) return rc;
    if (len > r->size - r->pos) {
        char w[GGUF_NAME_SHOW + 64];
        return zi_error_set(r->err, ZI_EFORMAT,
                            "%s: %s at byte %zu has length %llu, past end of file (%zu bytes left)",
                            where_str(r, w, sizeof w), what, r->pos - 8, (unsigned long long)len,
                            r->size - r->pos);
    }
    s->ptr = (const char *)(r->base + r->pos);
    s->len = len;
    r->pos += (size_t)len;
    return ZI_OK;
}

/* printf-style failure prefixed with where the parser is. */
static int fail(struct rd *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(struct rd *r, int code, const char *fmt, ...) {
    char w[GGUF_NAME_SHOW + 64];
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return zi_error_set(r->err, code, "%s: %s", where_str(r, w, sizeof w), msg);
}

/* Skips over one value of type t (already read), validating it. depth is
 * the array nesting level of the value (0 for a top-level value). */
static int skip_value(struct rd *r, uint32_t t, int depth) {
    /* Each visit consumes at least one byte, so work <= file size; the
     * counter is a second guard should that reasoning ever break. */
    if (++r->work > (uint64_t)r->size + 1)
        return fail(r, ZI_EFORMAT, "too much work parsing metadata (corrupt file?)");
    size_t sz = scalar_size(t);
    if (sz) {
        int rc = need(r, sz, "value");
        if (rc) return rc;
        if (t == ZI_GGUF_BOOL && r->base[r->pos] > 1)
            return fail(r, ZI_EFORMAT, "bool at byte %zu has value %u, expected 0 or 1", r->pos,
                        r->base[r->pos]);
        r->pos += sz;
        return ZI_OK;
    }
    if (t == ZI_GGUF_STRING) {
        zi_str s;
        return rd_str(r, &s, "string");
    }
    if (t != ZI_GGUF_ARRAY) return fail(r, ZI_EFORMAT, "invalid value type %u", t);

    if (depth >= GGUF_MAX_ARRAY_DEPTH)
        return fail(r, ZI_EFORMAT, "arrays nested more than %d deep at byte %zu",
                    GGUF_MAX_ARRAY_DEPTH, r->pos);
    uint32_t et;
    uint64_t n;
    int rc = rd_u32(r, &et, "array element type");
    if (rc) return rc;
    rc = rd_u64(r, &n, "array length");
    if (rc) return rc;
    uint64_t esz = min_value_size(et);
    if (esz == 0) return fail(r, ZI_EFORMAT, "invalid array element type %u", et);
    if (n > (r->size - r->pos) / esz)
        return fail(r, ZI_EFORMAT,
                    "array of %llu %s at byte %zu needs at least %llu bytes each, file has %zu "
                    "left",
                    (unsigned long long)n, zi_gguf_type_name((zi_gguf_type)et), r->pos,
                    (unsigned long long)esz, r->size - r->pos);
    if (scalar_size(et) && et != ZI_GGUF_BOOL) {
        r->pos += (size_t)(n * esz); /* fits: checked just above */
        r->work += 1;
        return ZI_OK;
    }
    for (uint64_t i = 0; i < n; i++) {
        rc = skip_value(r, et, depth + 1);
        if (rc) return rc;
    }
    return ZI_OK;
}

static int parse_kv(zi_gguf *g, struct rd *r, uint64_t i) {
    zi_gguf_kv *kv = &g->kvs[i];
    r->where = W_KV;
    r->index = i;
    r->name = NULL;
    int rc = rd_str(r, &kv->key, "name");
    if (rc) return rc;
    r->name = kv->key.ptr;
    r->name_len = kv->key.len;
    if (kv->key.len == 0) return fail(r, ZI_EFORMAT, "empty key name");

    int found;
    uint64_t slot = index_probe(g->kv_index, g->kv_cap, &g->kvs[0].key, sizeof(zi_gguf_kv),
                                kv->key.ptr, kv->key.len, &found);
    if (found)
        return fail(r, ZI_EFORMAT, "duplicate key (first defined as metadata key #%llu)",
                    (unsigned long long)(g->kv_index[slot] - 1));
    g->kv_index[slot] = i + 1;

    uint32_t t;
    rc = rd_u32(r, &t, "value type");
    if (rc) return rc;
    if (t > ZI_GGUF_FLOAT64) return fail(r, ZI_EFORMAT, "invalid value type %u", t);
    kv->type = (zi_gguf_type)t;
    size_t start = r->pos;
    if (t == ZI_GGUF_STRING) {
        rc = rd_str(r, &kv->str, "string value");
        if (rc) return rc;
        kv->data = (const uint8_t *)kv->str.ptr;
        return ZI_OK;
    }
    rc = skip_value(r, t, 0);
    if (rc) return rc;
    if (t == ZI_GGUF_ARRAY) {
        /* skip_value validated the header and the elements. */
        kv->arr_type = (zi_gguf_type)ld32(r->base + start);
        kv->arr_len = ld64(r->base + start + 4);
        kv->data = r->base + start + 12;
    } else {
        kv->data = r->base + start;
    }
    return ZI_OK;
}

/* a * b into *out; 0 on overflow. */
static int mul_u64(uint64_t a, uint64_t b, uint64_t *out) {
    if (a != 0 && b > UINT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

static int parse_tensor_info(zi_gguf *g, struct rd *r, uint64_t i) {
    zi_gguf_tensor *t = &g->tensors[i];
    r->where = W_TENSOR;
    r->index = i;
    r->name = NULL;
    int rc = rd_str(r, &t->name, "name");
    if (rc) return rc;
    r->name = t->name.ptr;
    r->name_len = t->name.len;
    if (t->name.len == 0) return fail(r, ZI_EFORMAT, "empty tensor name");

    int found;
    uint64_t slot = index_probe(g->t_index, g->t_cap, &g->tensors[0].name, sizeof(zi_gguf_tensor),
                                t->name.ptr, t->name.len, &found);
    if (found)
        return fail(r, ZI_EFORMAT, "duplicate tensor name (first defined as tensor #%llu)",
                    (unsigned long long)(g->t_index[slot] - 1));
    g->t_index[slot] = i + 1;

    rc = rd_u32(r, &t->n_dims, "n_dims");
    if (rc) return rc;
    if (t->n_dims < 1 || t->n_dims > ZI_GGUF_MAX_DIMS)
        return fail(r, ZI_EFORMAT, "n_dims is %u, expected 1..%d", t->n_dims, ZI_GGUF_MAX_DIMS);
    for (int d = 0; d < ZI_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        char what[16];
        snprintf(what, sizeof what, "ne[%u]", d);
        rc = rd_u64(r, &v, what);
        if (rc) return rc;
        if (v > (uint64_t)INT64_MAX)
            return fail(r, ZI_EFORMAT, "ne[%u] is negative (%lld)", d, (long long)(int64_t)v);
        t->ne[d] = (int64_t)v;
    }
    uint32_t type;
    rc = rd_u32(r, &type, "type");
    if (rc) return rc;
    rc = rd_u64(r, &t->offset, "offset");
    if (rc) return rc;

    /* A type number beyond INT32_MAX is no type ggml defines: as int it
     * reads negative, which every lookup below rejects. */
    size_t be, bb;
    int known = zi_ggml_type_block((int)type, &be, &bb);
    if (!zi_ggml_type_supported((int)type) && !(g->flags & ZI_GGUF_ANY_TYPE)) {
        char w[GGUF_NAME_SHOW + 64];
        const char *tn = zi_ggml_type_name((int)type);
        where_str(r, w, sizeof w);
        if (tn[0] == '?')
            return zi_error_set(r->err, ZI_EUNSUPPORTED,
                                "%s has unknown type %u, which zinfer does not support", w, type);
        return zi_error_set(r->err, ZI_EUNSUPPORTED,
                            "%s has type %s (%u), which zinfer does not support", w, tn, type);
    }
    t->type = (zi_ggml_type)type;

    /* Element and row counts must fit int64 (kernels index with them);
     * rows is checked on its own because ne[0] == 0 makes nelem 0. */
    uint64_t nelem = 1, rows = 1, nbytes;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (!mul_u64(nelem, (uint64_t)t->ne[d], &nelem) || nelem > (uint64_t)INT64_MAX ||
            (d > 0 && (!mul_u64(rows, (uint64_t)t->ne[d], &rows) || rows > (uint64_t)INT64_MAX)))
            return fail(r, ZI_EFORMAT, "element count overflows (shape %lld x %lld x %lld x %lld)",
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3]);
    }
    if (!known) {
        /* ZI_GGUF_ANY_TYPE, a number ggml does not define: no block size,
         * so no byte size and no data range to check (gguf.h). */
        t->size_unknown = 1;
        t->nbytes = 0;
        return ZI_OK;
    }
    if ((uint64_t)t->ne[0] % be != 0)
        return fail(r, ZI_EFORMAT, "ne[0] = %lld is not a multiple of %s's block size %zu",
                    (long long)t->ne[0], zi_ggml_type_name((int)type), be);
    uint64_t row_bytes;
    if (!mul_u64((uint64_t)t->ne[0] / be, bb, &row_bytes) || !mul_u64(row_bytes, rows, &nbytes))
        return fail(r, ZI_EFORMAT, "byte size overflows");
    t->nbytes = nbytes;
    return ZI_OK;
}

/* Looks up general.alignment: absent gives the default; otherwise it must be
 * a uint32 and a nonzero power of two. */
static int read_alignment(zi_gguf *g, zi_error *err) {
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, "general.alignment");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (!kv) return ZI_OK;
    if (kv->type != ZI_GGUF_UINT32)
        return zi_error_set(err, ZI_EFORMAT,
                            "metadata key 'general.alignment' has type %s, "
                            "expected uint32",
                            zi_gguf_type_name(kv->type));
    uint32_t a = ld32(kv->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return zi_error_set(err, ZI_EFORMAT,
                            "metadata key 'general.alignment' is %u, expected a nonzero power "
                            "of two",
                            a);
    g->alignment = a;
    return ZI_OK;
}

/* Checks each tensor's offset and data range now that the data section's
 * start is known, and sets the data pointers. */
static int place_tensors(zi_gguf *g, zi_error *err) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        zi_gguf_tensor *t = &g->tensors[i];
        char nm[GGUF_NAME_SHOW + 8];
        show(nm, sizeof nm, t->name.ptr, t->name.len);
        if (t->offset % g->alignment != 0)
            return zi_error_set(err, ZI_EFORMAT,
                                "tensor '%s': offset %llu is not a multiple of the alignment %u",
                                nm, (unsigned long long)t->offset, g->alignment);
        if (t->size_unknown) continue; /* data stays NULL: its extent is unknown */
        uint64_t start = g->data_offset + t->offset;
        if (start < t->offset || start > g->size || t->nbytes > g->size - start)
            return zi_error_set(err, ZI_EFORMAT,
                                "tensor '%s': data [offset %llu, %llu bytes] extends past end of "
                                "file (size %zu)",
                                nm, (unsigned long long)start, (unsigned long long)t->nbytes,
                                g->size);
        t->data = g->base + start;
    }
    return ZI_OK;
}

/* Parses and validates buf; `path` (may be NULL) only shapes messages. */
static int parse(zi_gguf *g, const char *path, int *named, zi_error *err) {
    struct rd r = {.base = g->base, .size = g->size, .err = err, .where = W_HEADER};
    const uint8_t *p = g->base;

    if (g->size < 4 || memcmp(p, "GGUF", 4) != 0) {
        char got[32] = "";
        if (g->size < 4)
            snprintf(got, sizeof got, "only %zu bytes", g->size);
        else
            snprintf(got, sizeof got, "bad magic %02x %02x %02x %02x", p[0], p[1], p[2], p[3]);
        *named = 1;
        return zi_error_set(err, ZI_EFORMAT, "%s%s (%s, expected \"GGUF\")", path ? path : "",
                            path ? " is not a GGUF file" : "not a GGUF file", got);
    }
    r.pos = 4;
    int rc = rd_u32(&r, &g->version, "version");
    if (rc) return rc;
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0 && g->version != 0)
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "big-endian GGUF files are not supported (version field reads "
                                "%u byte-swapped)",
                                __builtin_bswap32(g->version));
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "GGUF version %u is not supported (zinfer reads versions 2 and 3)",
                            g->version);
    }
    rc = rd_u64(&r, &g->n_tensors, "tensor count");
    if (rc) return rc;
    rc = rd_u64(&r, &g->n_kv, "metadata key count");
    if (rc) return rc;

    /* Reject counts that cannot fit before allocating for them. */
    size_t left = g->size - r.pos;
    if (g->n_kv > left / GGUF_MIN_KV_BYTES || g->n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        g->n_kv * GGUF_MIN_KV_BYTES + g->n_tensors * GGUF_MIN_TENSOR_BYTES > left)
        return zi_error_set(err, ZI_EFORMAT,
                            "truncated or corrupt: header claims %llu metadata keys and %llu "
                            "tensors, which need at "
                            "least %u and %u bytes each, but the file has %zu bytes after the "
                            "header",
                            (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors,
                            GGUF_MIN_KV_BYTES, GGUF_MIN_TENSOR_BYTES, left);

    g->kv_cap = index_cap(g->n_kv);
    g->t_cap = index_cap(g->n_tensors);
    if (!g->kv_cap || !g->t_cap) return zi_error_set(err, ZI_ENOMEM, "too many entries");
    g->kvs = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(g->n_tensors ? (size_t)g->n_tensors : 1, sizeof *g->tensors);
    g->kv_index = calloc((size_t)g->kv_cap, sizeof *g->kv_index);
    g->t_index = calloc((size_t)g->t_cap, sizeof *g->t_index);
    if (!g->kvs || !g->tensors || !g->kv_index || !g->t_index)
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %llu metadata keys and %llu tensors",
                            (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);

    for (uint64_t i = 0; i < g->n_kv; i++) {
        rc = parse_kv(g, &r, i);
        if (rc) return rc;
    }
    rc = read_alignment(g, err);
    if (rc) return rc;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        rc = parse_tensor_info(g, &r, i);
        if (rc) return rc;
    }
    /* The data section starts at the next multiple of the alignment; with no
     * tensors the padding may be absent, which is harmless. */
    g->data_offset = ((uint64_t)r.pos + g->alignment - 1) / g->alignment * g->alignment;
    return place_tensors(g, err);
}

/* Stands in for a zero-length input so base is never NULL. */
static const uint8_t empty_buf[1];

static int open_common(zi_gguf *g, const char *path, zi_gguf **out, zi_error *err) {
    int named = 0; /* the message already starts with the path */
    int rc = parse(g, path, &named, err);
    if (rc) {
        if (path && !named) zi_error_prefix(err, "%s", path);
        zi_gguf_close(g);
        return rc;
    }
    *out = g;
    return ZI_OK;
}

int zi_gguf_open_memory_flags(const void *buf, size_t len, unsigned flags, zi_gguf **out,
                              zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "zi_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!buf && len) return zi_error_set(err, ZI_EINVAL, "zi_gguf_open_memory: buffer is NULL");
    if (flags & ~ZI_GGUF_ANY_TYPE)
        return zi_error_set(err, ZI_EINVAL, "zi_gguf_open_memory: unknown flags %#x", flags);
    zi_gguf *g = calloc(1, sizeof *g);
    if (!g) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    g->base = buf ? buf : empty_buf;
    g->size = len;
    g->flags = flags;
    return open_common(g, NULL, out, err);
}

int zi_gguf_open_memory(const void *buf, size_t len, zi_gguf **out, zi_error *err) {
    return zi_gguf_open_memory_flags(buf, len, 0, out, err);
}

int zi_gguf_open_flags(const char *path, unsigned flags, zi_gguf **out, zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "zi_gguf_open: out is NULL");
    *out = NULL;
    if (!path) return zi_error_set(err, ZI_EINVAL, "zi_gguf_open: path is NULL");
    if (flags & ~ZI_GGUF_ANY_TYPE)
        return zi_error_set(err, ZI_EINVAL, "zi_gguf_open: unknown flags %#x", flags);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zi_error_set(err, ZI_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return zi_error_set(err, ZI_EIO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zi_error_set(err, ZI_EIO, "cannot open %s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return zi_error_set(err, ZI_EIO, "cannot map %s: file too large", path);
    }
    size_t size = (size_t)st.st_size;
    const void *map = NULL;
    if (size > 0) {
        void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return zi_error_set(err, ZI_EIO, "cannot map %s: %s", path, strerror(e));
        }
        map = m;
    }
    close(fd); /* the mapping keeps the file alive */

    zi_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap((void *)map, size);
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    g->base = map ? map : empty_buf;
    g->size = size;
    g->mapped = map != NULL;
    g->flags = flags;
    return open_common(g, path, out, err);
}

int zi_gguf_open(const char *path, zi_gguf **out, zi_error *err) {
    return zi_gguf_open_flags(path, 0, out, err);
}

void zi_gguf_close(zi_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_index);
    free(g->t_index);
    free(g);
}

/* ---- accessors -------------------------------------------------------------- */

uint32_t zi_gguf_version(const zi_gguf *g) {
    return g ? g->version : 0;
}
uint32_t zi_gguf_alignment(const zi_gguf *g) {
    return g ? g->alignment : 0;
}
size_t zi_gguf_file_size(const zi_gguf *g) {
    return g ? g->size : 0;
}
uint64_t zi_gguf_kv_count(const zi_gguf *g) {
    return g ? g->n_kv : 0;
}
uint64_t zi_gguf_tensor_count(const zi_gguf *g) {
    return g ? g->n_tensors : 0;
}

const zi_gguf_kv *zi_gguf_kv_at(const zi_gguf *g, uint64_t i) {
    return g && i < g->n_kv ? &g->kvs[i] : NULL;
}

const zi_gguf_tensor *zi_gguf_tensor_at(const zi_gguf *g, uint64_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const zi_gguf_kv *zi_gguf_find_kv(const zi_gguf *g, const char *key) {
    if (!g || !key || !g->n_kv) return NULL;
    int found;
    uint64_t s = index_probe(g->kv_index, g->kv_cap, &g->kvs[0].key, sizeof(zi_gguf_kv), key,
                             strlen(key), &found);
    return found ? &g->kvs[g->kv_index[s] - 1] : NULL;
}

const zi_gguf_tensor *zi_gguf_find_tensor(const zi_gguf *g, const char *name) {
    if (!g || !name || !g->n_tensors) return NULL;
    int found;
    uint64_t s = index_probe(g->t_index, g->t_cap, &g->tensors[0].name, sizeof(zi_gguf_tensor),
                             name, strlen(name), &found);
    return found ? &g->tensors[g->t_index[s] - 1] : NULL;
}

/* Shared start of every typed getter: the entry, or NULL with *rc set
 * (ZI_EINVAL for a missing key unless missing_ok, which leaves *rc ZI_OK). */
static const zi_gguf_kv *getter_kv(const zi_gguf *g, const char *key, int missing_ok, int *rc,
                                   zi_error *err) {
    *rc = ZI_OK;
    if (!g || !key) {
        *rc = zi_error_set(err, ZI_EINVAL, "NULL gguf or key");
        return NULL;
    }
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, key);
    if (!kv && !missing_ok) *rc = zi_error_set(err, ZI_EINVAL, "missing key %s", key);
    return kv;
}

static int wrong_type(const zi_gguf_kv *kv, const char *key, const char *expected, zi_error *err) {
    if (kv->type == ZI_GGUF_ARRAY)
        return zi_error_set(err, ZI_EFORMAT, "key %s has type array of %s, expected %s", key,
                            zi_gguf_type_name(kv->arr_type), expected);
    return zi_error_set(err, ZI_EFORMAT, "key %s has type %s, expected %s", key,
                        zi_gguf_type_name(kv->type), expected);
}

/* Reads any integer-typed value as signed/unsigned parts: *neg set for a
 * negative value (then *mag holds it as int64 in *sv). Returns 0 when the
 * value is not an integer type. */
static int read_int(const zi_gguf_kv *kv, int *neg, uint64_t *uv, int64_t *sv) {
    const uint8_t *p = kv->data;
    *neg = 0;
    switch (kv->type) {
    case ZI_GGUF_UINT8:
        *uv = p[0];
        break;
    case ZI_GGUF_UINT16:
        *uv = (uint64_t)p[0] | (uint64_t)p[1] << 8;
        break;
    case ZI_GGUF_UINT32:
        *uv = ld32(p);
        break;
    case ZI_GGUF_UINT64:
        *uv = ld64(p);
        break;
    case ZI_GGUF_INT8:
        *sv = (int8_t)p[0];
        goto sign;
    case ZI_GGUF_INT16:
        *sv = (int16_t)(uint16_t)((uint16_t)p[0] | (uint16_t)p[1] << 8);
        goto sign;
    case ZI_GGUF_INT32:
        *sv = (int32_t)ld32(p);
        goto sign;
    case ZI_GGUF_INT64:
        *sv = (int64_t)ld64(p);
        goto sign;
    default:
        return 0;
    }
    *sv = *uv > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)*uv;
    return 1;
sign:
    *neg = *sv < 0;
    *uv = *neg ? 0 : (uint64_t)*sv;
    return 1;
}

int zi_gguf_get_u32_or(const zi_gguf *g, const char *key, uint32_t dflt, uint32_t *out,
                       zi_error *err) {
    int rc;
    const zi_gguf_kv *kv = getter_kv(g, key, 1, &rc, err);
    if (rc) return rc;
    if (!kv) {
        if (out) *out = dflt;
        return ZI_OK;
    }
    int neg;
    uint64_t uv;
    int64_t sv;
    if (!read_int(kv, &neg, &uv, &sv)) return wrong_type(kv, key, "an integer", err);
    if (neg || uv > UINT32_MAX)
        return zi_error_set(err, ZI_EFORMAT, "key %s has value %s%llu, which does not fit uint32",
                            key, neg ? "-" : "",
                            neg ? (unsigned long long)(-(sv + 1)) + 1 : (unsigned long long)uv);
    if (out) *out = (uint32_t)uv;
    return ZI_OK;
}

int zi_gguf_get_u32(const zi_gguf *g, const char *key, uint32_t *out, zi_error *err) {
    int rc;
    if (!getter_kv(g, key, 0, &rc, err)) return rc;
    return zi_gguf_get_u32_or(g, key, 0, out, err);
}

int zi_gguf_get_i64(const zi_gguf *g, const char *key, int64_t *out, zi_error *err) {
    int rc;
    const zi_gguf_kv *kv = getter_kv(g, key, 0, &rc, err);
    if (!kv) return rc;
    int neg;
    uint64_t uv;
    int64_t sv;
    if (!read_int(kv, &neg, &uv, &sv)) return wrong_type(kv, key, "an integer", err);
    if (!neg && uv > (uint64_t)INT64_MAX)
        return zi_error_set(err, ZI_EFORMAT, "key %s has value %llu, which does not fit int64", key,
                            (unsigned long long)uv);
    if (out) *out = sv;
    return ZI_OK;
}

int zi_gguf_get_f32_or(const zi_gguf *g, const char *key, float dflt, float *out, zi_error *err) {
    int rc;
    const zi_gguf_kv *kv = getter_kv(g, key, 1, &rc, err);
    if (rc) return rc;
    float v = dflt;
    if (kv) {
        if (kv->type == ZI_GGUF_FLOAT32) {
            uint32_t b = ld32(kv->data);
            memcpy(&v, &b, 4);
        } else if (kv->type == ZI_GGUF_FLOAT64) {
            uint64_t b = ld64(kv->data);
            double d;
            memcpy(&d, &b, 8);
            v = (float)d;
        } else {
            return wrong_type(kv, key, "float32 or float64", err);
        }
    }
    if (out) *out = v;
    return ZI_OK;
}

int zi_gguf_get_f32(const zi_gguf *g, const char *key, float *out, zi_error *err) {
    int rc;
    if (!getter_kv(g, key, 0, &rc, err)) return rc;
    return zi_gguf_get_f32_or(g, key, 0.0f, out, err);
}

int zi_gguf_get_bool_or(const zi_gguf *g, const char *key, int dflt, int *out, zi_error *err) {
    int rc;
    const zi_gguf_kv *kv = getter_kv(g, key, 1, &rc, err);
    if (rc) return rc;
    int v = dflt;
    if (kv) {
        if (kv->type != ZI_GGUF_BOOL) return wrong_type(kv, key, "bool", err);
        v = kv->data[0] != 0;
    }
    if (out) *out = v;
    return ZI_OK;
}

int zi_gguf_get_str(const zi_gguf *g, const char *key, zi_str *out, zi_error *err) {
    int rc;
    const zi_gguf_kv *kv = getter_kv(g, key, 0, &rc, err);
    if (!kv) return rc;
    if (kv->type != ZI_GGUF_STRING) return wrong_type(kv, key, "string", err);
    if (out) *out = kv->str;
    return ZI_OK;
}

int zi_gguf_get_str_array(const zi_gguf *g, const char *key, zi_str **out, uint64_t *n,
                          zi_error *err) {
    int rc;
    if (out) *out = NULL;
    if (n) *n = 0;
    const zi_gguf_kv *kv = getter_kv(g, key, 0, &rc, err);
    if (!kv) return rc;
    if (kv->type != ZI_GGUF_ARRAY || kv->arr_type != ZI_GGUF_STRING)
        return wrong_type(kv, key, "array of string", err);
    if (!out || !n) return zi_error_set(err, ZI_EINVAL, "zi_gguf_get_str_array: NULL out");
    /* arr_len strings of >= 8 bytes each fit in the file, so this is bounded. */
    if (kv->arr_len > SIZE_MAX / sizeof(zi_str))
        return zi_error_set(err, ZI_ENOMEM, "key %s: array too large", key);
    zi_str *v = malloc(kv->arr_len ? (size_t)kv->arr_len * sizeof *v : 1);
    if (!v)
        return zi_error_set(err, ZI_ENOMEM, "key %s: out of memory for %llu strings", key,
                            (unsigned long long)kv->arr_len);
    const uint8_t *p = kv->data; /* validated at open: every length is in bounds */
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        v[i].len = ld64(p);
        v[i].ptr = (const char *)p + 8;
        p += 8 + v[i].len;
    }
    *out = v;
    *n = kv->arr_len;
    return ZI_OK;
}

int zi_gguf_get_array(const zi_gguf *g, const char *key, zi_gguf_type want, const void **data,
                      uint64_t *n, zi_error *err) {
    int rc;
    if (scalar_size(want) == 0)
        return zi_error_set(err, ZI_EINVAL,
                            "zi_gguf_get_array: element type %s is not a fixed-size type",
                            zi_gguf_type_name(want));
    const zi_gguf_kv *kv = getter_kv(g, key, 0, &rc, err);
    if (!kv) return rc;
    if (kv->type != ZI_GGUF_ARRAY || kv->arr_type != want) {
        char exp[32];
        snprintf(exp, sizeof exp, "array of %s", zi_gguf_type_name(want));
        return wrong_type(kv, key, exp, err);
    }
    if (data) *data = kv->data;
    if (n) *n = kv->arr_len;
    return ZI_OK;
}

void zi_gguf_drop_pages(const zi_gguf *g, const zi_gguf_tensor *t) {
    if (!g->mapped || !t->nbytes) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)t->data + page - 1) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)t->data + t->nbytes) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
