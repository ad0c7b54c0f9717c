/*
 * router_embed.c - the embed op's messages from backends (router_impl.h
 * lists the router's files; the client half, op_embed, is in
 * router_client.c). An embed request goes ENCODING (its tokenizer turns
 * the inputs into token ids) -> QUEUED (as an "embed" message, waiting for
 * a worker slot like a generate request) -> RUNNING (one slot of a worker)
 * -> the worker's "embedded" becomes the client's result.
 */
#include <stdio.h>
#include <string.h>

#include "imsg_embed.h"
#include "keypath.h"
#include "router_impl.h"

void on_embed_encoded(router *rt, rreq *r, const msgpack_object *o) {
    zi_im_embed e;
    zi_error err = {0};
    if (zi_im_embed_unpack(o, &e, &err) != ZI_OK) {
        fail_request(rt, r, "internal", "the tokenizer sent a malformed embed_encoded message",
                     NULL);
        return;
    }
    r->prompt_tokens = e.prompt_tokens;
    /* The tokenizer's part is done (it keeps no state for an embed): a
     * tokenizer that dies now does not take this request with it. */
    tok_detach(rt, r, false); /* ON -> NONE */
    zi_msg m;
    e.rid = (int64_t)r->rid;
    int rc = zi_im_embed_pack(ZI_IM_EMBED, &e, &m, &err);
    if (!built_or_fail(rt, r, rc, &m, &err)) return;
    r->start_len = m.sb.size; /* the sbuffer's storage becomes the request's */
    r->start_msg = msgpack_sbuffer_release(&m.sb);
    queue_push(rt, r);
    r->state = RS_QUEUED; /* ENCODING -> QUEUED */
    dispatch(rt);
}

void on_embedded(router *rt, rreq *r, const msgpack_object *o) {
    zi_im_embedded em;
    if (zi_im_embedded_unpack(o, &em, NULL) != ZI_OK) {
        fail_request(rt, r, "internal", "the worker sent a malformed embedded message", NULL);
        return;
    }
    wrk_release(rt, r); /* RUNNING -> DECODING: the worker has dropped it */
    zi_msg m;
    int rc = zi_im_embed_result_pack(&(zi_im_embed_result){.id = {r->id, r->id_len},
                                                           .embeddings = em.embeddings,
                                                           .token_counts = em.token_counts,
                                                           .pooling = em.pooling,
                                                           .truncated = em.truncated,
                                                           .prompt_tokens = r->prompt_tokens},
                                     &m);
    if (built_or_fail(rt, r, rc, &m, NULL)) {
        char id[80];
        zi_printable(id, sizeof id, r->id, r->id_len);
        zi_log(&rt->log, ZI_LOG_INFO, "request %llu (id '%s') embedded: %lld tokens, %lld ms",
               (unsigned long long)r->rid, id, (long long)r->prompt_tokens,
               (long long)(core_now(rt) - r->t_recv_ms));
        to_client(rt, r, &m);
        zi_msg_free(&m);
        end_request(rt, r);
    }
    dispatch(rt);
}
