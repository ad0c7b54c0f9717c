/*
 * embed_encode.c - see embed_encode.h.
 */
#include "embed_encode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

static bool is_int(const msgpack_object *o) {
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

/* One input (a string or token ids) at `path`, limits applied, into out. */
static int one_input(zi_tokenizer *tok, int32_t vocab, const zi_im_embed_encode *m,
                     const msgpack_object *v, const char *path, zi_embeddings_request *out,
                     int64_t *n_truncated, zi_error *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc;
    if (v->type == MSGPACK_OBJECT_STR && !tok) {
        rc = zi_error_set(err, ZI_EUNSUPPORTED,
                          "%s: this model's tokenizer is not supported: send token ids", path);
    } else if (v->type == MSGPACK_OBJECT_STR) {
        rc = zi_tokenizer_encode(tok, v->via.str.ptr, v->via.str.size, 1, 1, &ids, &n, err);
        if (rc) zi_error_prefix(err, "%s", path);
    } else if (v->type == MSGPACK_OBJECT_ARRAY || v->type == MSGPACK_OBJECT_MAP) {
        zi_codec_limits lim = zi_codec_limits_default();
        rc = zi_codec_decode_tokens(v, &lim, path, &ids, &n, err);
        for (size_t i = 0; !rc && i < n; i++)
            if (ids[i] >= vocab)
                rc = zi_error_set(err, ZI_EINVAL,
                                  "%s: token id %d is outside the vocabulary (0..%d)", path, ids[i],
                                  vocab - 1);
    } else {
        rc = zi_error_set(err, ZI_EINVAL, "%s: not a string or token ids", path);
    }
    if (!rc && n == 0) rc = zi_error_set(err, ZI_EINVAL, "%s: empty (no tokens)", path);
    if (!rc && (int64_t)n > m->max_length) {
        if (m->truncate) {
            n = (size_t)m->max_length;
            (*n_truncated)++;
        } else {
            rc = zi_error_set(err, ZI_EINVAL,
                              "%s: %zu tokens exceed the context of %lld tokens (send truncate: "
                              "true to cut it)",
                              path, n, (long long)m->max_length);
        }
    }
    size_t have = out->n_inputs ? out->start[out->n_inputs] : 0;
    if (!rc && (int64_t)(have + n) > m->max_tokens)
        rc =
            zi_error_set(err, ZI_EINVAL, "input: more than %lld tokens in all (--max-embed-tokens)",
                         (long long)m->max_tokens);
    if (!rc) rc = zi_embeddings_request_add(out, ids, n, err);
    free(ids);
    return rc;
}

int zi_embed_encode(zi_tokenizer *tok, int32_t vocab, const zi_im_embed_encode *m,
                    zi_embeddings_request *out, int64_t *n_truncated, zi_error *err) {
    memset(out, 0, sizeof *out);
    *n_truncated = 0;
    const msgpack_object *in = m->input;
    int rc = ZI_OK;
    if (in->type == MSGPACK_OBJECT_ARRAY && in->via.array.size == 0) {
        rc = zi_error_set(err, ZI_EINVAL, "input: an empty list");
    } else if (in->type == MSGPACK_OBJECT_ARRAY && !is_int(&in->via.array.ptr[0])) {
        for (uint32_t i = 0; !rc && i < in->via.array.size; i++) {
            char path[32];
            snprintf(path, sizeof path, "input[%u]", i);
            rc = one_input(tok, vocab, m, &in->via.array.ptr[i], path, out, n_truncated, err);
        }
    } else { /* one string, or one input's ids */
        rc = one_input(tok, vocab, m, in, "input", out, n_truncated, err);
    }
    if (rc) zi_embeddings_request_free(out);
    return rc;
}
