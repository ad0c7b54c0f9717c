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

/* The rerank template tmpl with each "{query}" and "{document}" of its
 * own text replaced by q and d (one pass over the template: a value that
 * spells "{query}" or "{document}" is not expanded again, so the result is
 * at most the template plus one value per field it names). *out is malloc'd, *n its
 * length (the values may hold NUL bytes). ZI_ENOMEM. */
static int expand_template(const char *tmpl, const char *q, size_t qn, const char *d, size_t dn,
                           char **out, size_t *n) {
    static const char QP[] = "{query}", DP[] = "{document}";
    size_t tn = strlen(tmpl), cap = tn + 1;
    for (const char *p = tmpl; (p = strchr(p, '{')); p++)
        cap += !strncmp(p, QP, sizeof QP - 1) ? qn : !strncmp(p, DP, sizeof DP - 1) ? dn : 0;
    char *r = malloc(cap);
    if (!r) return ZI_ENOMEM;
    size_t len = 0;
    for (size_t i = 0; i < tn;) {
        if (!strncmp(tmpl + i, QP, sizeof QP - 1)) {
            memcpy(r + len, q, qn), len += qn, i += sizeof QP - 1;
        } else if (!strncmp(tmpl + i, DP, sizeof DP - 1)) {
            memcpy(r + len, d, dn), len += dn, i += sizeof DP - 1;
        } else {
            r[len++] = tmpl[i++];
        }
    }
    *out = r, *n = len;
    return ZI_OK;
}

/* Appends ids[0..n) to the growing list v. */
static int push_ids(int32_t **v, size_t *len, const int32_t *ids, size_t n) {
    int32_t *g = realloc(*v, (*len + n + 1) * sizeof *g);
    if (!g) return ZI_ENOMEM;
    memcpy(g + *len, ids, n * sizeof *g);
    *v = g, *len += n;
    return ZI_OK;
}

/* A reranker's (query, document) pair as ids (embed_encode.h). */
static int encode_pair(zi_tokenizer *tok, const zi_im_embed_encode *m, const char *tmpl,
                       const msgpack_object *doc, int32_t **ids, size_t *n, zi_error *err) {
    const char *d = doc->via.str.ptr;
    size_t dn = doc->via.str.size;
    if (tmpl) {
        char *text;
        size_t tl;
        if (expand_template(tmpl, m->query.p, m->query.n, d, dn, &text, &tl))
            return zi_error_set(err, ZI_ENOMEM, "out of memory");
        int rc = zi_tokenizer_encode(tok, text, tl, 0, 1, ids, n, err);
        free(text);
        return rc;
    }
    int32_t bos, eos, sep, *q = NULL, *dv = NULL, *v = NULL;
    size_t qn = 0, dvn = 0, len = 0;
    zi_tokenizer_pair_markers(tok, &bos, &eos, &sep);
    int rc = zi_tokenizer_encode(tok, m->query.p, m->query.n, 0, 0, &q, &qn, err);
    if (!rc) rc = zi_tokenizer_encode(tok, d, dn, 0, 0, &dv, &dvn, err);
    if (!rc && bos >= 0) rc = push_ids(&v, &len, &bos, 1);
    if (!rc) rc = push_ids(&v, &len, q, qn);
    if (!rc && eos >= 0) rc = push_ids(&v, &len, &eos, 1);
    if (!rc && sep >= 0) rc = push_ids(&v, &len, &sep, 1);
    if (!rc) rc = push_ids(&v, &len, dv, dvn);
    if (!rc && eos >= 0) rc = push_ids(&v, &len, &eos, 1);
    if (rc == ZI_ENOMEM) zi_error_set(err, rc, "out of memory");
    free(q);
    free(dv);
    if (rc) {
        free(v);
        return rc;
    }
    *ids = v, *n = len;
    return ZI_OK;
}

/* One input (a string or token ids) at `path`, limits applied, into out. */
static int one_input(zi_tokenizer *tok, int32_t vocab, const zi_im_embed_encode *m,
                     const char *rerank_tmpl, const msgpack_object *v, const char *path,
                     zi_embeddings_request *out, int64_t *n_truncated, zi_error *err) {
    int32_t *ids = NULL;
    size_t n = 0;
    int rc;
    if (m->query.p && (v->type != MSGPACK_OBJECT_STR || !tok)) {
        rc = zi_error_set(err, tok ? ZI_EINVAL : ZI_EUNSUPPORTED, "%s: %s", path,
                          tok ? "with a query, a document string"
                              : "this model's tokenizer is not supported: cannot pair a query");
    } else if (m->query.p) {
        rc = encode_pair(tok, m, rerank_tmpl, v, &ids, &n, err);
        if (rc) zi_error_prefix(err, "%s", path);
    } else if (v->type == MSGPACK_OBJECT_STR && !tok) {
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
                    const char *rerank_tmpl, zi_embeddings_request *out, int64_t *n_truncated,
                    zi_error *err) {
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
            rc = one_input(tok, vocab, m, rerank_tmpl, &in->via.array.ptr[i], path, out, n_truncated,
                           err);
        }
    } else { /* one string, or one input's ids */
        rc = one_input(tok, vocab, m, rerank_tmpl, in, "input", out, n_truncated, err);
    }
    if (rc) zi_embeddings_request_free(out);
    return rc;
}
