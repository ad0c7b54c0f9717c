/*
 * msg.c - msgpack frame building and reading, the monotonic clock and the
 * KV counter names (see msg.h). No ZeroMQ here.
 */
#include "msg.h"

#include <string.h>
#include <time.h>

void zi_msg_init(zi_msg *m) {
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}

void zi_msg_free(zi_msg *m) {
    msgpack_sbuffer_destroy(&m->sb);
}

void zi_pack_strn(msgpack_packer *pk, const char *s, size_t n) {
    msgpack_pack_str(pk, n);
    if (n) msgpack_pack_str_body(pk, s, n);
}

void zi_pack_str(msgpack_packer *pk, const char *s) {
    zi_pack_strn(pk, s, s ? strlen(s) : 0);
}

void zi_pack_kv_str(msgpack_packer *pk, const char *key, const char *val) {
    zi_pack_str(pk, key);
    zi_pack_str(pk, val);
}

void zi_pack_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t n) {
    zi_pack_str(pk, key);
    zi_pack_strn(pk, val, n);
}

void zi_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val) {
    zi_pack_str(pk, key);
    msgpack_pack_int64(pk, val);
}

void zi_pack_kv_bool(msgpack_packer *pk, const char *key, bool val) {
    zi_pack_str(pk, key);
    if (val)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
}

int zi_map_str(const msgpack_object *o, const char *key, const char **s, size_t *n, zi_error *err) {
    const msgpack_object *v = zi_map_get(o, key);
    if (!v) return zi_error_set(err, ZI_EINVAL, "%s: missing", key);
    if (v->type != MSGPACK_OBJECT_STR) return zi_error_set(err, ZI_EINVAL, "%s: not a string", key);
    *s = v->via.str.ptr;
    *n = v->via.str.size;
    return ZI_OK;
}

int zi_map_int(const msgpack_object *o, const char *key, int64_t *out, zi_error *err) {
    const msgpack_object *v = zi_map_get(o, key);
    if (!v) return zi_error_set(err, ZI_EINVAL, "%s: missing", key);
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (v->via.u64 > (uint64_t)INT64_MAX)
            return zi_error_set(err, ZI_EINVAL, "%s: out of range", key);
        *out = (int64_t)v->via.u64;
    } else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = v->via.i64;
    } else {
        return zi_error_set(err, ZI_EINVAL, "%s: not an integer", key);
    }
    return ZI_OK;
}

bool zi_map_str_is(const msgpack_object *o, const char *key, const char *s) {
    const msgpack_object *v = zi_map_get(o, key);
    size_t n = strlen(s);
    return v && v->type == MSGPACK_OBJECT_STR && v->via.str.size == n &&
           memcmp(v->via.str.ptr, s, n) == 0;
}

int64_t zi_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void zi_error_field(const char *msg, char *out, size_t cap) {
    size_t i = 0;
    if (cap == 0) return;
    out[0] = '\0';
    while (msg[i] && msg[i] != ':') {
        char c = msg[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '.' || c == '[' || c == ']';
        if (!ok) return;
        i++;
    }
    if (msg[i] != ':' || i == 0 || i >= cap) return;
    memcpy(out, msg, i);
    out[i] = '\0';
}

const char *const zi_kv_stat_names[ZI_N_KV_STATS] = {"blocks",
                                                     "block_size",
                                                     "used",
                                                     "cached",
                                                     "free",
                                                     "prefix_query_tokens",
                                                     "prefix_hit_tokens",
                                                     "preemptions",
                                                     "evictions",
                                                     "spec_steps",
                                                     "spec_drafted",
                                                     "spec_accepted",
                                                     "image_tiles",
                                                     "image_encode_us",
                                                     "mem_hit_blocks",
                                                     "mem_miss_blocks",
                                                     "disk_hit_blocks",
                                                     "disk_miss_blocks",
                                                     "disk_bytes",
                                                     "disk_written",
                                                     "disk_dropped",
                                                     "disk_rejected",
                                                     "disk_read_us",
                                                     "disk_write_us",
                                                     "orphans_dropped"};
