/*
 * http_rerank.c - see http_rerank.h.
 */
#include "http_rerank.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <stdio.h>

#include "codec.h"

int zi_http_rerank_request(json_t *o, zi_msg *m, zi_http_rerank *rr, zi_http_error *e) {
    static const char *const keys[] = {
        "query", "documents", "top_n", "model", "return_documents", "truncate", "user"};
    memset(rr, 0, sizeof *rr);
    if (zi_http_known_keys(o, keys, sizeof keys / sizeof *keys, e)) return -1;
    json_t *v;
    json_t *q = json_object_get(o, "query"), *docs = json_object_get(o, "documents");
    json_t *tn = json_object_get(o, "top_n"), *rd = json_object_get(o, "return_documents");
    json_t *tr = json_object_get(o, "truncate");
    if (!q) return zi_http_fail(e, 400, "missing", "query", "query is missing");
    if (!json_is_string(q))
        return zi_http_fail(e, 400, "invalid_type", "query", "query: expected a string");
    if (json_string_length(q) == 0)
        return zi_http_fail(e, 400, "invalid_value", "query", "query: empty");
    if (!docs) return zi_http_fail(e, 400, "missing", "documents", "documents is missing");
    if (!json_is_array(docs))
        return zi_http_fail(e, 400, "invalid_type", "documents",
                            "documents: expected an array of strings");
    if (json_array_size(docs) == 0)
        return zi_http_fail(e, 400, "invalid_value", "documents", "documents: empty");
    if (tn && !json_is_null(tn) && (!json_is_integer(tn) || json_integer_value(tn) < 1))
        return zi_http_fail(e, 400, "invalid_value", "top_n", "top_n: expected a positive integer");
    if (rd && !json_is_boolean(rd))
        return zi_http_fail(e, 400, "invalid_type", "return_documents",
                            "return_documents: expected a boolean");
    if (tr && !json_is_boolean(tr))
        return zi_http_fail(e, 400, "invalid_type", "truncate", "truncate: expected a boolean");
    if (!(rr->docs = json_array())) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    size_t i;
    json_array_foreach(docs, i, v) {
        char param[40];
        snprintf(param, sizeof param, "documents[%zu]", i);
        json_t *text = json_is_object(v) ? json_object_get(v, "text") : v;
        if (!json_is_string(text)) {
            zi_http_rerank_free(rr);
            return zi_http_fail(e, 400, "invalid_type", param,
                                "%s: expected a string or {\"text\": string}", param);
        }
        json_array_append(rr->docs, text);
    }
    rr->top_n = tn && json_is_integer(tn) ? (size_t)json_integer_value(tn) : json_array_size(docs);
    rr->return_documents = rd && json_is_true(rd);
    json_t *mo = json_object_get(o, "model"); /* the router routes by it */
    int named = mo && json_is_string(mo);
    zi_msg_init(m);
    msgpack_pack_map(&m->pk, 5 + named);
    zi_pack_kv_str(&m->pk, "op", "embed");
    zi_pack_kv_str(&m->pk, "id", "e");
    if (named) zi_pack_kv_str(&m->pk, "model_name", json_string_value(mo));
    zi_pack_kv_bool(&m->pk, "truncate", tr && json_is_true(tr));
    zi_pack_str(&m->pk, "query");
    zi_pack_strn(&m->pk, json_string_value(q), json_string_length(q));
    zi_pack_str(&m->pk, "input");
    msgpack_pack_array(&m->pk, json_array_size(rr->docs));
    json_array_foreach(rr->docs, i, v)
        zi_pack_strn(&m->pk, json_string_value(v), json_string_length(v));
    return 0;
}

void zi_http_rerank_free(zi_http_rerank *rr) {
    json_decref(rr->docs);
    rr->docs = NULL;
}

void zi_http_rerank_error_fields(zi_http_error *e) {
    char buf[ZI_HTTP_MSG_MAX];
    if (!strncmp(e->param, "input", 5)) {
        char p[sizeof e->param];
        snprintf(p, sizeof p, "%s", e->param + 5);
        snprintf(e->param, sizeof e->param, "documents%.100s", p);
    }
    if (!strncmp(e->message, "input", 5)) {
        snprintf(buf, sizeof buf, "documents%s", e->message + 5);
        snprintf(e->message, sizeof e->message, "%s", buf);
    }
}

typedef struct scored {
    size_t index;
    float score;
} scored;

/* Best first; equal scores in document order (qsort is not stable). */
static int by_score(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

json_t *zi_http_rerank_answer(const msgpack_object *r, const char *model, const zi_http_rerank *rr,
                              zi_http_error *e) {
    const msgpack_object *em = zi_map_get(r, "embeddings");
    const msgpack_object *shape = em ? zi_map_get(em, "shape") : NULL;
    const msgpack_object *data = em ? zi_map_get(em, "data") : NULL;
    int64_t pt = 0;
    const msgpack_object *usage = zi_map_get(r, "usage");
    if (usage) zi_map_int(usage, "prompt_tokens", &pt, NULL);
    size_t n = json_array_size(rr->docs);
    if (!shape || shape->type != MSGPACK_OBJECT_ARRAY || shape->via.array.size != 2 || !data ||
        data->type != MSGPACK_OBJECT_BIN || shape->via.array.ptr[0].via.u64 != n ||
        shape->via.array.ptr[1].via.u64 == 0 ||
        n * shape->via.array.ptr[1].via.u64 * 4 != data->via.bin.size) {
        zi_http_fail(e, 500, "internal", NULL, "the router sent a malformed rerank result");
        return NULL;
    }
    uint64_t dim = shape->via.array.ptr[1].via.u64;
    scored *s = malloc(n * sizeof *s + 1);
    if (!s) {
        zi_http_fail(e, 500, "internal", NULL, "out of memory");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)data->via.bin.ptr;
    for (size_t i = 0; i < n; i++) { /* the score: each row's first output */
        const uint8_t *b = p + i * dim * 4;
        uint32_t bits =
            (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        s[i].index = i;
        memcpy(&s[i].score, &bits, 4);
    }
    qsort(s, n, sizeof *s, by_score);
    json_t *res = json_array();
    for (size_t i = 0; i < n && i < rr->top_n; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "index", json_integer((json_int_t)s[i].index));
        json_object_set_new(x, "relevance_score", json_real(s[i].score));
        if (rr->return_documents)
            json_object_set_new(x, "document",
                                json_pack("{s:O}", "text", json_array_get(rr->docs, s[i].index)));
        json_array_append_new(res, x);
    }
    free(s);
    json_t *o = json_object(), *u = json_object();
    json_object_set_new(o, "model", json_string(model));
    json_object_set_new(o, "object", json_string("list"));
    json_object_set_new(u, "prompt_tokens", json_integer(pt));
    json_object_set_new(u, "total_tokens", json_integer(pt));
    json_object_set_new(o, "usage", u);
    json_object_set_new(o, "results", res);
    return o;
}
