/*
 * http_embed.c - see http_embed.h.
 */
#include "http_embed.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static int is_id(json_t *x) {
    return json_is_integer(x) && json_integer_value(x) >= 0 && json_integer_value(x) <= INT32_MAX;
}

/* Packs the token-id array a (its items checked) at param. */
static int pack_ids(msgpack_packer *pk, json_t *a, const char *param, zi_http_error *e) {
    size_t i;
    json_t *x;
    if (json_array_size(a) == 0)
        return zi_http_fail(e, 400, "invalid_value", param, "%s: empty", param);
    json_array_foreach(a, i, x) if (!is_id(x)) return zi_http_fail(
        e, 400, "invalid_value", param, "%s[%zu]: expected a token id", param, i);
    msgpack_pack_array(pk, json_array_size(a));
    json_array_foreach(a, i, x) msgpack_pack_int64(pk, json_integer_value(x));
    return 0;
}

static int pack_input(msgpack_packer *pk, json_t *in, zi_http_error *e) {
    if (json_is_string(in)) {
        zi_pack_strn(pk, json_string_value(in), json_string_length(in));
        return 0;
    }
    if (!json_is_array(in) || json_array_size(in) == 0)
        return zi_http_fail(e, 400, "invalid_type", "input",
                            "input: expected a string, an array of strings, an array of token "
                            "ids or an array of arrays of token ids");
    if (json_is_integer(json_array_get(in, 0))) return pack_ids(pk, in, "input", e);
    msgpack_pack_array(pk, json_array_size(in));
    size_t i;
    json_t *x;
    json_array_foreach(in, i, x) {
        char param[32];
        snprintf(param, sizeof param, "input[%zu]", i);
        if (json_is_string(x))
            zi_pack_strn(pk, json_string_value(x), json_string_length(x));
        else if (json_is_array(x)) {
            if (pack_ids(pk, x, param, e)) return -1;
        } else
            return zi_http_fail(e, 400, "invalid_type", param,
                                "%s: expected a string or an array of token ids", param);
    }
    return 0;
}

int zi_http_embed_request(json_t *o, zi_msg *m, int *base64, zi_http_error *e) {
    static const char *const keys[] = {"input", "model",     "encoding_format", "dimensions",
                                       "user",  "normalize", "truncate",        "pooling"};
    if (zi_http_known_keys(o, keys, sizeof keys / sizeof *keys, e)) return -1;
    json_t *in = json_object_get(o, "input"), *ef = json_object_get(o, "encoding_format");
    json_t *no = json_object_get(o, "normalize"), *tr = json_object_get(o, "truncate");
    json_t *po = json_object_get(o, "pooling");
    if (!in) return zi_http_fail(e, 400, "missing", "input", "input is missing");
    *base64 = 0;
    if (ef && !json_is_null(ef)) {
        const char *s = json_is_string(ef) ? json_string_value(ef) : "";
        if (!strcmp(s, "base64"))
            *base64 = 1;
        else if (strcmp(s, "float"))
            return zi_http_fail(e, 400, "invalid_value", "encoding_format",
                                "encoding_format: \"float\" or \"base64\"");
    }
    if (json_object_get(o, "dimensions") && !json_is_null(json_object_get(o, "dimensions")))
        return zi_http_fail(e, 400, "unsupported_value", "dimensions",
                            "dimensions: not supported (the model's own size only)");
    if (no && !json_is_boolean(no))
        return zi_http_fail(e, 400, "invalid_type", "normalize", "normalize: expected a boolean");
    if (tr && !json_is_boolean(tr))
        return zi_http_fail(e, 400, "invalid_type", "truncate", "truncate: expected a boolean");
    if (po && (!json_is_string(po) ||
               (strcmp(json_string_value(po), "mean") && strcmp(json_string_value(po), "cls") &&
                strcmp(json_string_value(po), "last"))))
        return zi_http_fail(e, 400, "invalid_value", "pooling",
                            "pooling: \"mean\", \"cls\" or \"last\"");
    json_t *mo = json_object_get(o, "model"); /* the router routes by it */
    int named = mo && json_is_string(mo);
    zi_msg_init(m);
    msgpack_pack_map(&m->pk, 5 + (po != NULL) + named);
    zi_pack_kv_str(&m->pk, "op", "embed");
    zi_pack_kv_str(&m->pk, "id", "e");
    if (named) zi_pack_kv_str(&m->pk, "model_name", json_string_value(mo));
    zi_pack_kv_bool(&m->pk, "normalize", !no || json_is_true(no));
    zi_pack_kv_bool(&m->pk, "truncate", tr && json_is_true(tr));
    if (po) zi_pack_kv_str(&m->pk, "pooling", json_string_value(po));
    zi_pack_str(&m->pk, "input");
    if (pack_input(&m->pk, in, e)) {
        zi_msg_free(m);
        return -1;
    }
    return 0;
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The bytes p[0..n) in base64 (a new JSON string; NULL: out of memory). */
static json_t *base64_json(const uint8_t *p, size_t n) {
    char *s = malloc((n + 2) / 3 * 4 + 1);
    if (!s) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        s[k++] = B64[v >> 18 & 63];
        s[k++] = B64[v >> 12 & 63];
        s[k++] = i + 1 < n ? B64[v >> 6 & 63] : '=';
        s[k++] = i + 2 < n ? B64[v & 63] : '=';
    }
    json_t *j = json_stringn(s, k);
    free(s);
    return j;
}

json_t *zi_http_embed_answer(const msgpack_object *r, const char *model, int base64,
                             zi_http_error *e) {
    const msgpack_object *em = zi_map_get(r, "embeddings"), *tc = zi_map_get(r, "token_counts");
    const msgpack_object *shape = em ? zi_map_get(em, "shape") : NULL;
    const msgpack_object *data = em ? zi_map_get(em, "data") : NULL;
    int64_t pt = 0;
    const msgpack_object *usage = zi_map_get(r, "usage");
    if (usage) zi_map_int(usage, "prompt_tokens", &pt, NULL);
    if (!shape || shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size != 2 || !data ||
        data->type != MSGPACK_OBJECT_BIN || !tc || tc->type != MSGPACK_OBJECT_ARRAY) {
        zi_http_fail(e, 500, "internal", NULL, "the router sent a malformed embed result");
        return NULL;
    }
    uint64_t rows = shape->via.array.ptr[0].via.u64, dim = shape->via.array.ptr[1].via.u64;
    if (rows != tc->via.array.size || dim == 0 || rows * dim * 4 != data->via.bin.size) {
        zi_http_fail(e, 400, "unsupported_value", "pooling",
                     "the model's pooling gives one vector per token, which /v1/embeddings "
                     "cannot return; send pooling: \"mean\", \"cls\" or \"last\"");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)data->via.bin.ptr;
    json_t *arr = json_array();
    for (uint64_t i = 0; i < rows; i++) {
        const uint8_t *row = p + i * dim * 4;
        json_t *vec;
        if (base64) { /* OpenAI's: the little-endian float32 bytes */
            vec = base64_json(row, dim * 4);
        } else {
            vec = json_array();
            for (uint64_t j = 0; j < dim; j++) {
                uint32_t bits = (uint32_t)row[4 * j] | (uint32_t)row[4 * j + 1] << 8 |
                                (uint32_t)row[4 * j + 2] << 16 | (uint32_t)row[4 * j + 3] << 24;
                float f;
                memcpy(&f, &bits, 4);
                json_array_append_new(vec, json_real(f));
            }
        }
        json_t *d = json_object();
        json_object_set_new(d, "object", json_string("embedding"));
        json_object_set_new(d, "index", json_integer((json_int_t)i));
        json_object_set_new(d, "embedding", vec ? vec : json_null());
        json_array_append_new(arr, d);
    }
    json_t *o = json_object(), *u = json_object();
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(o, "data", arr);
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "total_tokens", json_integer(pt));
    json_object_set_new(o, "usage", u);
    return o;
}
