/*
 * router_core.c - the router core's events, outbox and clock
 * (router_core.h), the transitions of a request's tokenizer link and
 * worker slot that the other core files share, the counter check, request
 * deadlines, and connections that close (router_impl.h lists the router's
 * files).
 *
 * Deadlines: a generate request with a timeout_ms (or, without one, the
 * router's --request-timeout) that is still in flight at its deadline,
 * wherever it is (encoding, queued, running, decoding, waiting for a
 * failover), ends with a "final" of status "deadline_exceeded"; its claims
 * on backends go as for a client cancel (end_request). Checked on the
 * tick.
 *
 * Disconnects: the shell reports a connection that closed by its
 * (fd, number) pair (router_watch.c says how it tells connections on a
 * reused fd apart). A client's requests in flight from it end without a
 * reply (nobody is there to read it); a backend on it dies at once
 * (failover starts without waiting for --heartbeat-timeout, which stays
 * the fallback for a peer that hangs without closing its connection).
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embeddings.h"
#include "options.h"
#include "router_impl.h"

int64_t core_now(const router *rt) {
    return rt->io.now_ms(rt->io.ctx);
}

int out_send(router *rt, zi_router_side side, const unsigned char *ident, size_t ident_len,
             bool delim, const void *data, size_t len) {
    return rt->io.send(rt->io.ctx, side, ident, ident_len, delim, data, len);
}

int out_send_msg(router *rt, zi_router_side side, const unsigned char *ident, size_t ident_len,
                 bool delim, const zi_msg *m) {
    if (!m->sb.data || m->sb.size == 0) { /* a failed encoder's: nothing to send */
        errno = EINVAL;
        return -1;
    }
    return out_send(rt, side, ident, ident_len, delim, m->sb.data, m->sb.size);
}

/* ---- transitions ------------------------------------------------------- */

void tok_attach(router *rt, rreq *r, int t, bool keeps_state) {
    assert(r->tlink == TL_NONE || r->tlink == TL_WAITING);
    r->tok = t;
    r->tlink = keeps_state ? TL_STATE : TL_ON;
    rt->be[t].assigned++;
}

void tok_dropped(rreq *r) {
    if (r->tlink == TL_STATE) r->tlink = TL_ON;
}

void tok_detach(router *rt, rreq *r, bool wait) {
    if (r->tok >= 0) {
        assert(r->tlink == TL_ON || r->tlink == TL_STATE);
        rt->be[r->tok].assigned--;
        assert(rt->be[r->tok].assigned >= 0);
    }
    r->tok = -1;
    r->tlink = wait ? TL_WAITING : TL_NONE;
}

void wrk_release(router *rt, rreq *r) {
    assert(r->state == RS_RUNNING && r->wrk >= 0);
    rt->be[r->wrk].assigned--;
    assert(rt->be[r->wrk].assigned >= 0);
    r->state = RS_DECODING;
}

/* ---- the counter check ------------------------------------------------- */

/* The request at slot i of the table, or NULL. */
static const rreq *slot_req(const router *rt, size_t i) {
    return rt->reqs.slots[i].key ? rt->reqs.slots[i].val : NULL;
}

int zi_router_check(const zi_router *rt, zi_error *err) {
    size_t waiting = 0, queued = 0;
    for (size_t i = 0; i < rt->reqs.cap; i++) {
        const rreq *r = slot_req(rt, i);
        if (!r) continue;
        bool on_tok = r->tlink == TL_ON || r->tlink == TL_STATE;
        if (on_tok != (r->tok >= 0) || (r->tok >= 0 && (size_t)r->tok >= rt->n_be))
            return zi_error_set(err, ZI_EINVAL, "request %llu: tokenizer %d with link %d",
                                (unsigned long long)r->rid, r->tok, r->tlink);
        if (r->tlink == TL_WAITING && r->kind != K_GENERATE)
            return zi_error_set(err, ZI_EINVAL, "request %llu: kind %d waits for a tokenizer",
                                (unsigned long long)r->rid, r->kind);
        if (r->state == RS_RUNNING &&
            (r->wrk < 0 || (size_t)r->wrk >= rt->n_be || !rt->be[r->wrk].alive))
            return zi_error_set(err, ZI_EINVAL, "request %llu: running on worker %d",
                                (unsigned long long)r->rid, r->wrk);
        if ((r->state == RS_UTIL) != (r->kind == K_TOKENIZE || r->kind == K_DETOKENIZE))
            return zi_error_set(err, ZI_EINVAL, "request %llu: kind %d in phase %d",
                                (unsigned long long)r->rid, r->kind, r->state);
        waiting += r->state == RS_ENCODING || r->state == RS_QUEUED || r->state == RS_UTIL;
        queued += r->state == RS_QUEUED;
    }
    if (waiting != rt->n_waiting)
        return zi_error_set(err, ZI_EINVAL, "n_waiting %zu, but %zu requests wait", rt->n_waiting,
                            waiting);
    if (queued != rt->q_len)
        return zi_error_set(err, ZI_EINVAL, "%zu requests in the queue, %zu queued", rt->q_len,
                            queued);
    /* Each queue: linked both ways, of queued requests of its model only,
     * as long as its count; the counts add up to q_len, so no queued
     * request is missing from the queues or in one twice. */
    size_t in_queues = 0;
    for (size_t k = 0; k <= rt->n_models; k++) {
        const rqueue *q = k < rt->n_models ? &rt->models[k].q : &rt->any_q;
        const char *name = k < rt->n_models ? rt->models[k].name : "";
        size_t n = 0;
        const rreq *prev = NULL;
        for (const rreq *r = q->head; r; prev = r, r = r->q_next) {
            if (++n > q->n || r->q_prev != prev || r->q_in != q || r->state != RS_QUEUED ||
                zi_req_table_get(&rt->reqs, r->rid) != r ||
                (k < rt->n_models && strcmp(r->model, name)) || (prev && prev->q_seq >= r->q_seq))
                return zi_error_set(err, ZI_EINVAL, "queue of model '%s': entry %zu (rid %llu)",
                                    name, n, (unsigned long long)r->rid);
        }
        if (n != q->n || q->tail != prev)
            return zi_error_set(err, ZI_EINVAL, "queue of model '%s': %zu entries, counted %zu",
                                name, n, q->n);
        in_queues += n;
    }
    if (in_queues != rt->q_len)
        return zi_error_set(err, ZI_EINVAL, "%zu requests in the queues, %zu queued", in_queues,
                            rt->q_len);
    /* Each model's waiting count: its requests that are counted in n_waiting. */
    for (size_t k = 0; k < rt->n_models; k++) {
        size_t n = 0;
        for (size_t i = 0; i < rt->reqs.cap; i++) {
            const rreq *r = slot_req(rt, i);
            n += r && !strcmp(r->model, rt->models[k].name) &&
                 (r->state == RS_ENCODING || r->state == RS_QUEUED || r->state == RS_UTIL);
        }
        if (n != rt->models[k].waiting)
            return zi_error_set(err, ZI_EINVAL, "model %s: waiting %zu, but %zu requests wait",
                                rt->models[k].name, rt->models[k].waiting, n);
    }
    for (size_t b = 0; b < rt->n_be; b++) {
        int n = 0;
        for (size_t i = 0; i < rt->reqs.cap; i++) {
            const rreq *r = slot_req(rt, i);
            if (r) n += r->tok == (int)b || (r->wrk == (int)b && r->state == RS_RUNNING);
        }
        if (rt->be[b].assigned != n || (n > 0 && !rt->be[b].alive))
            return zi_error_set(err, ZI_EINVAL, "backend %zu (%s): assigned %d, %d requests on it",
                                b, rt->be[b].alive ? "alive" : "dead", rt->be[b].assigned, n);
    }
    /* A model's wish: a load is wished only of a model no live worker
     * serves (a worker's register ends it). */
    for (size_t k = 0; k < rt->n_models; k++) {
        const model_rec *m = &rt->models[k];
        if (m->want != MW_NONE && m->want != MW_LOAD && m->want != MW_UNLOAD)
            return zi_error_set(err, ZI_EINVAL, "model %s: want %d", m->name, m->want);
        if (m->want == MW_LOAD && count_alive(rt, ROLE_WORKER, m->name) > 0)
            return zi_error_set(err, ZI_EINVAL, "model %s: a load is wished, but a worker is up",
                                m->name);
        if (m->has_keep_alive && m->keep_alive_ms < -1)
            return zi_error_set(err, ZI_EINVAL, "model %s: keep_alive %lld ms", m->name,
                                (long long)m->keep_alive_ms);
    }
    return ZI_OK;
}

/* After every event: queued requests start on the worker slots it freed
 * (a cancel, a deadline or a disconnect frees one as a final status does;
 * without this a queued request waited for some later event), and in
 * debug builds the counters must agree with the table (a broken
 * transition shows where it happens, not much later). */
static void after_event(router *rt) {
    dispatch(rt);
#ifndef NDEBUG
    zi_error err = {0};
    if (zi_router_check(rt, &err) != ZI_OK) {
        zi_log(&rt->log, ZI_LOG_ERROR, "router state inconsistent: %s", err.msg);
        assert(!"router counters inconsistent");
    }
#endif
}

/* ---- deadlines and disconnects ------------------------------------------ */

static bool past_deadline(const void *val, const void *arg) {
    const rreq *r = val;
    return r->deadline_ms && r->deadline_ms <= *(const int64_t *)arg;
}

void deadline_check(router *rt, int64_t now) {
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, past_deadline, &now));)
        send_final(rt, r, "deadline_exceeded", (zi_im_str){0}); /* ends it: it leaves the match */
}

static bool on_conn(const void *val, const void *arg) {
    const rreq *r = val;
    const zi_router_conn *k = arg;
    return r->client_conn.fd == k->fd && r->client_conn.epoch == k->epoch;
}

int zi_router_client_gone(zi_router *rt, zi_router_conn conn) {
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, on_conn, &conn));) {
        zi_log(&rt->log, ZI_LOG_INFO,
               "request %llu: its client disconnected; cancelled (worker slot freed)",
               (unsigned long long)r->rid);
        if (r->kind == K_GENERATE) rt->metrics.finished[ZI_IM_FIN_CANCELLED]++;
        end_request(rt, r); /* it leaves the walk's match */
    }
    after_event(rt);
    return ZI_OK;
}

int zi_router_backend_gone(zi_router *rt, zi_router_conn conn) {
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].conn.fd == conn.fd && rt->be[i].conn.epoch == conn.epoch)
            backend_died(rt, (int)i, "its connection closed");
    after_event(rt);
    return ZI_OK;
}

/* ---- the events ---------------------------------------------------------- */

int zi_router_init(zi_router *rt, const zi_router_io *io, zi_logger log) {
    memset(rt, 0, sizeof *rt);
    if (!io || !io->send || !io->now_ms || !io->wall_ns) return ZI_EINVAL;
    rt->io = *io;
    rt->log = log;
    /* The option table's defaults (common/options.h), which --help shows. */
    rt->max_queue = zi_option_def(ZI_O_MAX_QUEUE);
    rt->max_model_queue = zi_option_def(ZI_O_MAX_QUEUE_PER_MODEL);
    rt->max_prompt = zi_option_def(ZI_O_MAX_PROMPT_TOKENS);
    rt->max_new = zi_option_def(ZI_O_MAX_NEW_TOKENS);
    rt->max_thinking = zi_option_def(ZI_O_MAX_THINKING_TOKENS);
    rt->max_embed_inputs = zi_option_def(ZI_O_MAX_EMBED_INPUTS);
    rt->max_embed_tokens = zi_option_def(ZI_O_MAX_EMBED_TOKENS);
    rt->hb_timeout = zi_option_def(ZI_O_HEARTBEAT_TIMEOUT);
    rt->failover_timeout = zi_option_def(ZI_O_FAILOVER_TIMEOUT);
    rt->req_timeout = zi_option_def(ZI_O_REQUEST_TIMEOUT);
    rt->max_frame = zi_option_def(ZI_O_MAX_FRAME_BYTES);
    rt->client_hb = zi_option_def(ZI_O_CLIENT_HEARTBEAT);
    rt->cur_conn = (zi_router_conn){-1, 0};
    rt->keep_alive_ms = -1; /* forever, unless --keep-alive */
    rt->starting = ZI_ROUTER_MAX_MODELS;
    /* Router restart (router_restart.c): this start's epoch, and request
     * ids above those of an earlier start (wall-clock milliseconds times
     * 65536: a router would have to admit 65536 requests a millisecond to
     * catch up with its successor's), so that the requests workers hand
     * back keep theirs. */
    int64_t wall = io->wall_ns(io->ctx), mono = io->now_ms(io->ctx);
    uint64_t e = (uint64_t)wall ^ ((uint64_t)mono << 32) ^ (uint64_t)(uintptr_t)rt;
    e += 0x9e3779b97f4a7c15ull; /* splitmix64: distinct starts, distinct epochs */
    e = (e ^ (e >> 30)) * 0xbf58476d1ce4e5b9ull;
    e = (e ^ (e >> 27)) * 0x94d049bb133111ebull;
    rt->epoch = (e ^ (e >> 31)) & INT64_MAX;
    rt->next_rid = wall > 0 ? (uint64_t)(wall / 1000000) << 16 : 0;
    rt->t_start_ms = mono;
    rt->resume_grace = zi_option_def(ZI_O_RESUME_GRACE);
    zi_req_table_init(&rt->reqs);
    return ZI_OK;
}

int zi_router_add_model(zi_router *rt, const char *name, zi_error *err) {
    if (!name[0] || strlen(name) >= ZI_ROUTER_MODEL_NAME)
        return zi_error_set(err, ZI_EINVAL,
                            "--served-models: '%.64s' is not a model name (1 to %d bytes)", name,
                            ZI_ROUTER_MODEL_NAME - 1);
    if (model_find(rt, name, false))
        return zi_error_set(err, ZI_EINVAL, "--served-models: '%s' is named twice", name);
    model_rec *m = model_find(rt, name, true);
    if (!m)
        return zi_error_set(err, ZI_EINVAL, "--served-models: more than %d models",
                            ZI_ROUTER_MAX_MODELS);
    m->configured = true;
    m->want = (size_t)(m - rt->models) < rt->starting ? MW_LOAD : MW_NONE;
    return ZI_OK;
}

void zi_router_set_on_demand(zi_router *rt, bool on) {
    rt->on_demand = on;
}

void zi_router_set_starting(zi_router *rt, size_t n) {
    rt->starting = n;
    for (size_t k = 0; k < rt->n_models; k++)
        if (rt->models[k].configured && rt->models[k].want != MW_UNLOAD)
            rt->models[k].want = k < n ? MW_LOAD : MW_NONE;
}

void zi_router_set_keep_alive(zi_router *rt, int64_t ms) {
    rt->keep_alive_ms = ms < 0 ? -1 : ms;
}

int zi_router_client_frame(zi_router *rt, zi_router_conn conn, const unsigned char *ident,
                           size_t ident_len, bool delim, const void *buf, size_t len) {
    if (ident_len > IDENT_MAX) return ZI_EINVAL;
    rt->cur_conn = conn;
    on_client_frame(rt, ident, ident_len, delim, buf, len);
    after_event(rt);
    return ZI_OK;
}

int zi_router_backend_frame(zi_router *rt, zi_router_conn conn, const unsigned char *ident,
                            size_t ident_len, const void *buf, size_t len) {
    if (ident_len > IDENT_MAX) return ZI_EINVAL;
    rt->cur_conn = conn;
    on_backend_frame(rt, ident, ident_len, buf, len);
    after_event(rt);
    return ZI_OK;
}

int zi_router_tick(zi_router *rt) {
    int64_t now = core_now(rt);
    char why[64];
    snprintf(why, sizeof why, "missed heartbeats for %lld ms", rt->hb_timeout);
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && now - rt->be[i].last_seen > rt->hb_timeout)
            backend_died(rt, (int)i, why);
    failover_check(rt, now);
    restart_check(rt, now);
    deadline_check(rt, now);
    after_event(rt);
    return ZI_OK;
}

/* Matches every request (the shutdown walk). */
static bool any_req(const void *val, const void *arg) {
    (void)val;
    (void)arg;
    return true;
}

int zi_router_shutdown(zi_router *rt) {
    /* Every request still in flight gets its terminal frame (one walk of
     * the table, allocating nothing). */
    size_t pos = 0;
    for (void *one; (one = zi_req_table_find(&rt->reqs, &pos, any_req, NULL));)
        fail_request(rt, one, "unavailable", "the server is shutting down", NULL);
    restart_free(rt);
    after_event(rt);
    zi_req_table_free(&rt->reqs);
    lora_free(rt);
    free(rt->be);
    rt->be = NULL;
    rt->n_be = 0;
    rt->any_q = (rqueue){0};
    for (size_t k = 0; k < rt->n_models; k++) rt->models[k].q = (rqueue){0};
    rt->q_len = 0;
    return ZI_OK;
}
