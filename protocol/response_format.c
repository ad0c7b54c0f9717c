/*
 * response_format.c - what a request's response_format asks for (see
 * response_format.h): its type, and a JSON schema's text for the worker's
 * constraint. The request decoder (codec_decode.c) only checks that the
 * value is a clean map; the meaning is read here, by the router (to refuse
 * what cannot be held to at admission) and the tokenizer (to put the
 * schema on the context).
 */
#include "response_format.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codec.h"

/* True when o is the string s. */
static bool str_is(const msgpack_object *o, const char *s) {
    size_t n = strlen(s);
    return o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
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
        if (str_is(type, "json_object")) {
            *kind = ZI_RF_JSON_OBJECT;
        } else if (str_is(type, "json_schema")) {
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
                    if (rc)
                        msgpack_sbuffer_destroy(&b);
                    else
                        *schema = msgpack_sbuffer_release(&b);
                }
            }
        } else if (!str_is(type, "text")) {
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
