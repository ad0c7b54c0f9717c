/*
 * codec_scan.c - the codec's first line against hostile bytes (codec.h):
 * zi_msgpack_check walks a frame's raw msgpack without allocating
 * (well-formedness, every declared count against the bytes left, nesting
 * depth), so msgpack-c never sizes an allocation from an unchecked count;
 * zi_msgpack_parse runs it before msgpack-c. Also the small lookups every
 * reader of a parsed message uses (zi_map_get, zi_msgpack_type_name).
 */
#include <stdio.h>
#include <string.h>

#include "codec_internal.h"

zi_codec_limits zi_codec_limits_default(void) {
    zi_codec_limits l = {
        .max_tokens = (size_t)1 << 20,
        .max_string_bytes = (size_t)4 << 20,
        .max_depth = 16,
        .max_items = 4096,
        .max_logprobs = 20,
        .max_images = ZI_CODEC_MAX_IMAGES,
        .max_image_bytes = ZI_CODEC_MAX_IMAGE_BYTES,
    };
    return l;
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
        case 0xcc: /* uint 8, 16, 32, 64 */
        case 0xcd:
        case 0xce:
        case 0xcf:
        case 0xd0: /* int 8, 16, 32, 64: the same widths, in the same low bits */
        case 0xd1:
        case 0xd2:
        case 0xd3:
            it->payload = (uint64_t)1 << (b & 3);
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
    const zi_codec_limits *lim = zi_codec_limits_or_default(lim_in, &tmp);
    const uint8_t *p = buf;
    if (!p && len) return zi_error_set(err, ZI_EINVAL, "message: NULL buffer");
    scan_frame st[ZI_CODEC_DEPTH_CAP + 1];
    size_t depth = 0, maxd = zi_codec_depth_cap(lim);
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
