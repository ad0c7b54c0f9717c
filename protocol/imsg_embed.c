/*
 * imsg_embed.c - see imsg_embed.h.
 */
#include "imsg_embed.h"

#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* A message map begun with its type and rid. */
static void begin(zi_imap *b, zi_im_type t, int64_t rid) {
    zi_imap_init(b);
    zi_imap_str(b, "type", zi_im_type_name(t));
    zi_imap_int(b, "rid", rid);
}

static int64_t int_or(const msgpack_object *o, const char *key, int64_t dflt) {
    int64_t v;
    return zi_map_int(o, key, &v, NULL) == ZI_OK ? v : dflt;
}

static bool bool_or(const msgpack_object *o, const char *key, bool dflt) {
    const msgpack_object *v = zi_map_get(o, key);
    return v && v->type == MSGPACK_OBJECT_BOOLEAN ? v->via.boolean : dflt;
}

int zi_im_embed_encode_pack(const zi_im_embed_encode *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_EMBED_ENCODE, m->rid);
    zi_imap_int(&b, "max_length", m->max_length);
    zi_imap_int(&b, "max_tokens", m->max_tokens);
    zi_imap_bool(&b, "truncate", m->truncate);
    if (m->pooling.p) zi_imap_strn(&b, "pooling", m->pooling.p, m->pooling.n);
    if (m->query.p) zi_imap_strn(&b, "query", m->query.p, m->query.n);
    zi_imap_bool(&b, "normalize", m->normalize);
    zi_imap_object(&b, "input", m->input);
    if (!m->input) zi_imap_fail(&b);
    return zi_imap_close_msg(&b, out);
}

int zi_im_embed_encode_unpack(const msgpack_object *o, zi_im_embed_encode *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = int_or(o, "rid", 0);
    m->max_length = int_or(o, "max_length", 0);
    m->max_tokens = int_or(o, "max_tokens", 0);
    m->truncate = bool_or(o, "truncate", false);
    m->normalize = bool_or(o, "normalize", false);
    m->pooling = zi_im_str_at(o, "pooling");
    m->query = zi_im_str_at(o, "query");
    m->input = zi_map_get(o, "input");
    if (!m->input) return zi_error_set(err, ZI_EINVAL, "input: missing");
    if (m->max_length < 1 || m->max_tokens < 1)
        return zi_error_set(err, ZI_EINVAL, "max_length, max_tokens: not positive integers");
    return ZI_OK;
}

int zi_im_embed_pack(zi_im_type type, const zi_im_embed *m, zi_msg *out, zi_error *err) {
    zi_imap b;
    begin(&b, type, m->rid);
    zi_imap_int(&b, "prompt_tokens", m->prompt_tokens);
    zi_imap_int(&b, "truncated", m->truncated);
    if (m->pooling.p) zi_imap_strn(&b, "pooling", m->pooling.p, m->pooling.n);
    zi_imap_bool(&b, "normalize", m->normalize);
    int rc = ZI_OK;
    if (m->req) {
        msgpack_packer *pk = zi_imap_key(&b, "inputs");
        if (msgpack_pack_array(pk, m->req->n_inputs)) zi_imap_fail(&b);
        for (size_t i = 0; !rc && i < m->req->n_inputs; i++) {
            size_t s = m->req->start[i], e = m->req->start[i + 1];
            rc = zi_codec_pack_tokens(pk, m->req->ids + s, e - s, err);
        }
        if (rc) zi_imap_fail(&b);
    } else {
        zi_imap_object(&b, "inputs", m->inputs);
        if (!m->inputs) zi_imap_fail(&b);
    }
    int crc = zi_imap_close_msg(&b, out);
    return rc ? rc : crc;
}

int zi_im_embed_unpack(const msgpack_object *o, zi_im_embed *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = int_or(o, "rid", 0);
    m->prompt_tokens = int_or(o, "prompt_tokens", 0);
    m->truncated = int_or(o, "truncated", 0);
    m->pooling = zi_im_str_at(o, "pooling");
    m->normalize = bool_or(o, "normalize", false);
    m->inputs = zi_map_get(o, "inputs");
    if (!m->inputs) return zi_error_set(err, ZI_EINVAL, "inputs: missing");
    if (m->inputs->type != MSGPACK_OBJECT_ARRAY)
        return zi_error_set(err, ZI_EINVAL, "inputs: not an array");
    return ZI_OK;
}

int zi_im_embed_inputs_decode(const msgpack_object *inputs, size_t max_inputs, size_t max_tokens,
                              zi_embeddings_request *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    if (!inputs || inputs->type != MSGPACK_OBJECT_ARRAY || inputs->via.array.size == 0)
        return zi_error_set(err, ZI_EINVAL, "input: not a non-empty array of inputs");
    if (inputs->via.array.size > max_inputs)
        return zi_error_set(err, ZI_EINVAL, "input: %u inputs exceed the limit of %zu",
                            inputs->via.array.size, max_inputs);
    zi_codec_limits lim = zi_codec_limits_default();
    lim.max_tokens = max_tokens;
    size_t total = 0;
    for (uint32_t i = 0; i < inputs->via.array.size; i++) {
        char path[32];
        snprintf(path, sizeof path, "input[%u]", i);
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = zi_codec_decode_tokens(&inputs->via.array.ptr[i], &lim, path, &ids, &n, err);
        if (!rc && n == 0) rc = zi_error_set(err, ZI_EINVAL, "%s: no tokens", path);
        if (!rc && (total += n) > max_tokens)
            rc = zi_error_set(err, ZI_EINVAL, "input: more than %zu tokens in all", max_tokens);
        if (!rc) rc = zi_embeddings_request_add(out, ids, n, err);
        free(ids);
        if (rc) {
            zi_embeddings_request_free(out);
            return rc;
        }
    }
    return ZI_OK;
}

int zi_im_pack_f32_matrix(msgpack_packer *pk, const float *v, int64_t rows, int64_t dim,
                          zi_error *err) {
    if (rows < 0 || dim < 1 || (uint64_t)rows * (uint64_t)dim > UINT32_MAX / 4)
        return zi_error_set(err, ZI_ERANGE, "embeddings: %lld x %lld is too many to encode",
                            (long long)rows, (long long)dim);
    size_t n = (size_t)rows * (size_t)dim;
    if (msgpack_pack_map(pk, 4) || msgpack_pack_str_with_body(pk, "__np__", 6) ||
        msgpack_pack_true(pk) || msgpack_pack_str_with_body(pk, "dtype", 5) ||
        msgpack_pack_str_with_body(pk, "float32", 7) ||
        msgpack_pack_str_with_body(pk, "shape", 5) || msgpack_pack_array(pk, 2) ||
        msgpack_pack_int64(pk, rows) || msgpack_pack_int64(pk, dim) ||
        msgpack_pack_str_with_body(pk, "data", 4) || msgpack_pack_bin(pk, n * 4))
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    uint8_t buf[512];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, v + i, 4);
        for (int b = 0; b < 4; b++) buf[k++] = (uint8_t)(x >> (8 * b)); /* little-endian */
        if (k == sizeof buf || i + 1 == n) {
            if (msgpack_pack_bin_body(pk, buf, k))
                return zi_error_set(err, ZI_ENOMEM, "out of memory");
            k = 0;
        }
    }
    return ZI_OK;
}

int zi_im_embedded_pack(const zi_im_embedded *m, zi_msg *out, zi_error *err) {
    const zi_embeddings_response *r = m->resp;
    zi_imap b;
    begin(&b, ZI_IM_EMBEDDED, m->rid);
    int rc =
        zi_im_pack_f32_matrix(zi_imap_key(&b, "embeddings"), r->embeddings, r->rows, r->dim, err);
    if (rc) zi_imap_fail(&b);
    msgpack_packer *pk = zi_imap_key(&b, "token_counts");
    if (msgpack_pack_array(pk, r->n_inputs)) zi_imap_fail(&b);
    for (size_t i = 0; i < r->n_inputs; i++)
        if (msgpack_pack_int64(pk, r->token_counts[i])) zi_imap_fail(&b);
    zi_imap_str(&b, "pooling", zi_pooling_name(r->pooling));
    zi_imap_int(&b, "truncated", m->truncated);
    int crc = zi_imap_close_msg(&b, out);
    return rc ? rc : crc;
}

int zi_im_embedded_unpack(const msgpack_object *o, zi_im_embedded *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = int_or(o, "rid", 0);
    m->truncated = int_or(o, "truncated", 0);
    m->embeddings = zi_map_get(o, "embeddings");
    m->token_counts = zi_map_get(o, "token_counts");
    m->pooling = zi_map_get(o, "pooling");
    if (!m->embeddings || !m->token_counts)
        return zi_error_set(err, ZI_EINVAL, "embedded: embeddings or token_counts missing");
    return ZI_OK;
}

int zi_im_embed_result_pack(const zi_im_embed_result *m, zi_msg *out) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_strn(&b, "id", m->id.p, m->id.n);
    zi_imap_str(&b, "event", "result");
    zi_imap_object(&b, "embeddings", m->embeddings);
    zi_imap_object(&b, "token_counts", m->token_counts);
    zi_imap_object(&b, "pooling", m->pooling);
    zi_imap_int(&b, "truncated", m->truncated);
    zi_imap u;
    zi_imap_init(&u);
    zi_imap_int(&u, "prompt_tokens", m->prompt_tokens);
    zi_imap_int(&u, "total_tokens", m->prompt_tokens);
    zi_imap_map(&b, "usage", &u);
    return zi_imap_close_msg(&b, out);
}
