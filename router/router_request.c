/*
 * router_request.c - how a router request ends (router_impl.h lists the
 * router's files): replies to a request's client, its terminal frame
 * ("final" or "error"), and end_request(), the one function that removes a
 * request from the table. Every path that ends a request sends exactly one
 * terminal frame and then goes through end_request(), which sends nothing
 * to the client itself but undoes the request's claims on backends (queue
 * place, worker slot, tokenizer decode state).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "keypath.h"
#include "router_impl.h"
#include "utf8.h"

/* Sends to a request's client; false when the client is gone. */
bool to_client(router *rt, const rreq *r, const zi_msg *m) {
    if (out_send_msg(rt, ZI_ROUTER_CLIENT, r->client, r->client_len, r->delim, m) == 0) return true;
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu: client unreachable (%s); cancelling",
           (unsigned long long)r->rid, strerror(errno));
    return false;
}

/* An error frame to a client that may have no request record. */
void send_error_raw(router *rt, const unsigned char *client, size_t client_len, bool delim,
                    const char *id, size_t id_len, const char *code, const char *msg,
                    const char *field) {
    bool f = field && field[0];
    /* Messages may quote client bytes: send them as valid UTF-8 only. */
    size_t ml = 0, fl = 0;
    char *mc = zi_utf8_clean(msg, strlen(msg), &ml);
    char *fc = f ? zi_utf8_clean(field, strlen(field), &fl) : NULL;
    zi_im_client_error e = {.id = {id, id_len},
                            .code = {code, strlen(code)},
                            .message = {mc ? mc : "out of memory", mc ? ml : 13}};
    if (f) e.field = (zi_im_str){fc ? fc : "", fc ? fl : 0};
    zi_msg m;
    zi_im_client_error_pack(&e, &m);
    out_send_msg(rt, ZI_ROUTER_CLIENT, client, client_len, delim, &m);
    zi_msg_free(&m);
    free(mc);
    free(fc);
}

/* Removes r from the table and releases what it holds on backends. The
 * terminal frame (if any) has been sent by the caller. */
void end_request(router *rt, rreq *r) {
    model_rec *mr = model_find(rt, r->model, false);
    if (mr) mr->last_used_ms = core_now(rt); /* its idle time counts from here */
    /* What each phase holds (router_core.h): a waiting one its n_waiting
     * count (and, queued, its queue place), a running one its worker slot;
     * what the tokenizer link holds, its tokenizer's count and, with
     * TL_STATE, the decode state the tokenizer keeps. */
    if (r->state == RS_ENCODING || r->state == RS_QUEUED || r->state == RS_UTIL)
        waiting_add(rt, r, -1);
    if (r->state == RS_QUEUED) queue_remove(rt, r);
    if (r->state == RS_RUNNING) {
        backend_rid_msg(rt, r->wrk, ZI_IM_CANCEL, r->rid);
        wrk_release(rt, r);
    }
    if (r->tlink == TL_STATE) backend_rid_msg(rt, r->tok, ZI_IM_RELEASE, r->rid);
    tok_detach(rt, r, false);
    zi_req_table_del(&rt->reqs, r->rid);
    zi_log(&rt->log, ZI_LOG_DEBUG, "request %llu ended", (unsigned long long)r->rid);
    free(r->id);
    free(r->text);
    free(r->start_msg);
    free(r->resume_msg);
    free(r->gen);
    free(r->encode_msg);
    for (size_t i = 0; i < r->n_pend; i++) free(r->pend[i].buf);
    free(r->pend);
    zi_logprobs_free(&r->lp);
    free(r->echo);
    free(r);
}

void fail_request(router *rt, rreq *r, const char *code, const char *msg, const char *field) {
    char id[80], why[200]; /* as one line: the message may quote client text */
    if (r->kind == K_GENERATE) rt->metrics.finished[ZI_IM_FIN_ERROR]++;
    zi_printable(id, sizeof id, r->id, r->id_len);
    zi_printable_max(why, sizeof why, msg, strlen(msg), 180);
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu (id '%s') ended with %s: %s",
           (unsigned long long)r->rid, id, code, why);
    send_error_raw(rt, r->client, r->client_len, r->delim, r->id, r->id_len, code, msg, field);
    end_request(rt, r);
}

bool built_or_fail(router *rt, rreq *r, int rc, zi_msg *m, const zi_error *err) {
    if (rc == ZI_OK) return true;
    zi_msg_free(m);
    fail_request(rt, r, "internal", err && err->msg[0] ? err->msg : "out of memory for a message",
                 NULL);
    return false;
}

void send_final(router *rt, rreq *r, const char *status, zi_im_str stop_string) {
    int64_t now = core_now(rt);
    char id[80]; /* the client's id as one line of ASCII */
    zi_printable(id, sizeof id, r->id, r->id_len);
    zi_log(&rt->log, ZI_LOG_INFO,
           "request %llu (id '%s') %s: %lld prompt + %lld completion tokens, first token "
           "%lld ms, total %lld ms",
           (unsigned long long)r->rid, id, status, (long long)r->prompt_tokens,
           (long long)r->completion_tokens,
           (long long)(r->t_first_ms ? r->t_first_ms - r->t_recv_ms : -1),
           (long long)(now - r->t_recv_ms));
    zi_im_metrics *mt = &rt->metrics;
    for (int k = 0; k < ZI_IM_N_FIN; k++)
        if (!strcmp(status, zi_im_finish_names[k])) mt->finished[k]++;
    mt->prompt_tokens += r->prompt_tokens;
    mt->generation_tokens += r->completion_tokens;
    zi_im_hist_observe(&mt->hist[ZI_IM_HIST_E2E], (double)(now - r->t_recv_ms) / 1e3);
    if (r->t_first_ms)
        zi_im_hist_observe(&mt->hist[ZI_IM_HIST_TTFT],
                           (double)(r->t_first_ms - r->t_recv_ms) / 1e3);
    zi_im_final f = {.id = {r->id, r->id_len},
                     .status = {status, strlen(status)},
                     .index = r->index,
                     .prompt_tokens = r->prompt_tokens,
                     .completion_tokens = r->completion_tokens,
                     .has_text = !r->stream,
                     .text = {r->text ? r->text : "", r->text_len},
                     .logprobs = {.lp = r->has_lp ? &r->lp : NULL},
                     .stop_string = stop_string};
    /* The echoed prompt kept from the first decoded message (a map). */
    msgpack_unpacked eu;
    msgpack_unpacked_init(&eu);
    if (!r->stream && r->echo_len &&
        msgpack_unpack_next(&eu, r->echo, r->echo_len, NULL) == MSGPACK_UNPACK_SUCCESS) {
        f.prompt_token_ids = zi_map_get(&eu.data, "prompt_token_ids");
        f.prompt_logprobs = zi_map_get(&eu.data, "prompt_logprobs");
        f.prompt_text = zi_map_get(&eu.data, "prompt_text");
    }
    zi_msg m;
    zi_error err = {0};
    int rc = zi_im_final_pack(&f, &m, &err);
    msgpack_unpacked_destroy(&eu);
    if (!built_or_fail(rt, r, rc, &m, &err)) return;
    to_client(rt, r, &m);
    zi_msg_free(&m);
    end_request(rt, r);
}
