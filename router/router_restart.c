/*
 * router_restart.c - requests that outlive the router (router_impl.h
 * lists the router's files; docs/protocol.md, "Router restart").
 *
 * What the router must know to go on with a request is held elsewhere
 * while it runs: the worker holds the sequence (its "start" message and
 * the ids generated), the client holds what it received. So the router
 * writes its own record of the request into the "start" message (the
 * note: this router's epoch, the client's routing id and request id,
 * stream, model, index, prompt length, deadline, and the "encode"
 * message a tokenizer rebuilds the decode state from), and the worker
 * keeps the message whole.
 *
 * When a router starts, each worker's next message is answered
 * "reregister"; the worker registers again with "live", every sequence it
 * holds (and those that ended in the last seconds, whose last "tokens"
 * may have died with the old router). restart_adopt turns each one whose
 * note is another epoch's into an orphan request: running on that worker
 * (or done), its ids kept as failover keeps them, no tokenizer yet. The
 * worker's further "tokens" are kept as "decode" messages to come.
 *
 * The client (which sets its own routing id, so the new router knows it)
 * notices the restart and sends "resume" with the number of token ids it
 * holds, K. restart_resume then rebuilds the decode state on a tokenizer
 * as a tokenizer failover does: "encode" with "replay" of the first K ids
 * (the tokenizer answers nothing), then one "decode" of the ids the
 * client lacks and the kept ones, so the client gets every token once.
 * A resume that arrives before its worker's register waits for it until
 * the workers have had --heartbeat-timeout to register again; after that
 * an unknown request is answered "unavailable" (it had not reached a
 * worker, or it ended and its record is gone: send it again). An orphan
 * whose client never resumes ends after resume_grace, freeing its slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "router_impl.h"

/* The note of r (a packed map, into m): ZI_EINVAL when r cannot have
 * one (no encode message kept). */
static int note_pack(router *rt, const rreq *r, zi_msg *m) {
    if (!r->encode_msg) return ZI_EINVAL;
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_int(&b, "epoch", (int64_t)rt->epoch);
    msgpack_packer *pk = zi_imap_key(&b, "client");
    if (msgpack_pack_bin(pk, r->client_len) || msgpack_pack_bin_body(pk, r->client, r->client_len))
        zi_imap_fail(&b);
    zi_imap_strn(&b, "id", r->id, r->id_len);
    zi_imap_bool(&b, "stream", r->stream);
    zi_imap_str(&b, "model", r->model);
    zi_imap_int(&b, "index", r->index);
    zi_imap_int(&b, "prompt_tokens", r->prompt_tokens);
    /* The deadline in wall-clock time: the next router's clock differs. */
    int64_t wall = rt->io.wall_ns(rt->io.ctx);
    zi_imap_int(&b, "deadline_ns",
                r->deadline_ms ? wall + (r->deadline_ms - core_now(rt)) * 1000000 : 0);
    pk = zi_imap_key(&b, "encode");
    if (msgpack_pack_bin(pk, r->encode_len) ||
        msgpack_pack_bin_body(pk, r->encode_msg, r->encode_len))
        zi_imap_fail(&b);
    zi_msg_init(m);
    int rc = zi_imap_close(&b, &m->pk);
    if (rc) zi_msg_free(m);
    return rc;
}

int restart_start_pack(router *rt, const rreq *r, const msgpack_object *ctx,
                       const msgpack_object *note, zi_msg *m) {
    zi_msg nm;
    msgpack_unpacked nu;
    bool packed = false, made = false;
    if (!note && !r->no_restart) {
        packed = note_pack(rt, r, &nm) == ZI_OK;
        zi_error err = {0};
        if (packed && zi_msgpack_parse(nm.sb.data, nm.sb.size, NULL, &nu, &err) == ZI_OK) {
            note = &nu.data;
            made = true;
        }
    }
    /* Without a note (out of memory) it runs on; only a restart loses it. */
    int rc = zi_im_start_pack(
        &(zi_im_start){
            .rid = (int64_t)r->rid, .context = ctx, .note = note, .prefix_key = r->prefix_key},
        m);
    if (made) msgpack_unpacked_destroy(&nu);
    if (packed) zi_msg_free(&nm);
    return rc;
}

/* ---- adoption ------------------------------------------------------------ */

/* A note's fields (pointing into the note). */
typedef struct note_view {
    uint64_t epoch;
    const char *client, *id, *model, *encode;
    size_t client_len, id_len, model_len, encode_len;
    bool stream;
    int64_t index, prompt_tokens, deadline_ns;
} note_view;

static bool bin_of(const msgpack_object *o, const char *key, const char **p, size_t *n) {
    const msgpack_object *v = zi_map_get(o, key);
    if (!v || v->type != MSGPACK_OBJECT_BIN) return false;
    *p = v->via.bin.ptr, *n = v->via.bin.size;
    return true;
}

static bool note_read(const msgpack_object *o, note_view *v) {
    memset(v, 0, sizeof *v);
    if (!o || o->type != MSGPACK_OBJECT_MAP) return false;
    int64_t e = 0;
    const msgpack_object *st = zi_map_get(o, "stream");
    if (zi_map_int(o, "epoch", &e, NULL) || !bin_of(o, "client", &v->client, &v->client_len) ||
        !bin_of(o, "encode", &v->encode, &v->encode_len) ||
        zi_map_str(o, "id", &v->id, &v->id_len, NULL) ||
        zi_map_str(o, "model", &v->model, &v->model_len, NULL) || !st ||
        st->type != MSGPACK_OBJECT_BOOLEAN)
        return false;
    v->epoch = (uint64_t)e;
    v->stream = st->via.boolean;
    zi_map_int(o, "index", &v->index, NULL);
    zi_map_int(o, "prompt_tokens", &v->prompt_tokens, NULL);
    zi_map_int(o, "deadline_ns", &v->deadline_ns, NULL);
    return v->client_len > 0 && v->client_len <= IDENT_MAX && v->id_len > 0 &&
           v->model_len < ZI_ROUTER_MODEL_NAME;
}

/* A copy of n bytes (NULL when out of memory). */
static char *dup_bytes(const void *p, size_t n) {
    char *c = malloc(n ? n : 1);
    if (c && n) memcpy(c, p, n);
    return c;
}

static void free_req(rreq *r) {
    free(r->id);
    free(r->start_msg);
    free(r->encode_msg);
    free(r->gen);
    free(r);
}

/* Whether the request r is client's request id (a match for a resume). */
typedef struct client_key {
    const unsigned char *client;
    size_t client_len;
    const char *id;
    size_t id_len;
} client_key;

static bool is_keyed(const void *val, const void *arg) {
    const rreq *r = val;
    const client_key *k = arg;
    return r->kind == K_GENERATE && r->client_len == k->client_len &&
           !memcmp(r->client, k->client, k->client_len) && r->id_len == k->id_len &&
           !memcmp(r->id, k->id, k->id_len);
}

static rreq *find_keyed(router *rt, const client_key *k) {
    size_t pos = 0;
    return zi_req_table_find(&rt->reqs, &pos, is_keyed, k);
}

static void attach(router *rt, rreq *r, int64_t tokens, bool delim, zi_router_conn conn);

/* One sequence of worker b's report: adopted (true) or not. */
static bool adopt_one(router *rt, int b, const zi_im_live *l) {
    msgpack_unpacked u;
    zi_error err = {0};
    if (zi_msgpack_parse(l->start, l->start_len, NULL, &u, &err)) return false;
    zi_im_start sm;
    note_view v;
    bool ok = zi_im_start_unpack(&u.data, &sm, NULL) == ZI_OK && sm.rid == l->rid &&
              note_read(sm.note, &v) &&
              v.epoch != rt->epoch /* this router's own: it moved it on already */
              && !zi_req_table_get(&rt->reqs, (uint64_t)l->rid);
    client_key key = {ok ? (const unsigned char *)v.client : NULL, v.client_len, v.id, v.id_len};
    if (ok && find_keyed(rt, &key)) ok = false; /* a new request of that id came first */
    rreq *r = ok ? calloc(1, sizeof *r) : NULL;
    if (r) {
        r->rid = (uint64_t)l->rid;
        r->prefix_key = sm.prefix_key;
        r->id = dup_bytes(v.id, v.id_len + 1);
        r->start_msg = dup_bytes(l->start, l->start_len);
        r->encode_msg = dup_bytes(v.encode, v.encode_len);
        r->gen = malloc((l->token_ids.n ? l->token_ids.n : 1) * sizeof *r->gen);
    }
    if (!r || !r->id || !r->start_msg || !r->encode_msg || !r->gen ||
        zi_req_table_put(&rt->reqs, r->rid, r, NULL) != ZI_OK) {
        if (r) free_req(r);
        msgpack_unpacked_destroy(&u);
        return false;
    }
    r->id[v.id_len] = '\0';
    r->id_len = v.id_len;
    memcpy(r->client, v.client, v.client_len);
    r->client_len = v.client_len;
    r->start_len = l->start_len;
    r->encode_len = v.encode_len;
    if (l->token_ids.n) memcpy(r->gen, l->token_ids.v, l->token_ids.n * sizeof *r->gen);
    r->n_gen = r->gen_cap = l->token_ids.n;
    r->kind = K_GENERATE;
    r->stream = v.stream;
    snprintf(r->model, sizeof r->model, "%.*s", (int)v.model_len, v.model);
    r->index = v.index;
    r->prompt_tokens = v.prompt_tokens;
    r->completion_tokens = (int64_t)l->token_ids.n;
    r->echo_seen = true;
    r->tok = -1;
    r->tlink = TL_WAITING;
    r->client_conn = (zi_router_conn){-1, 0};
    r->t_recv_ms = core_now(rt);
    if (v.deadline_ns > 0) {
        int64_t left = (v.deadline_ns - rt->io.wall_ns(rt->io.ctx)) / 1000000;
        r->deadline_ms = r->t_recv_ms + (left > 1 ? left : 1);
    }
    zi_logprobs_init(&r->lp);
    r->orphan = true;
    r->orphan_ms = r->t_recv_ms;
    r->wrk = b;
    if (zi_gen_status_is_done(l->gstatus)) {
        r->state = RS_DECODING; /* the worker is done with it */
        r->adopted_done = true;
        r->adopted_status = (int)l->gstatus;
    } else {
        r->state = RS_RUNNING;
        rt->be[b].assigned++;
    }
    if (r->rid > rt->next_rid) rt->next_rid = r->rid;
    msgpack_unpacked_destroy(&u);
    zi_log(&rt->log, ZI_LOG_INFO,
           "request %llu: taken over from worker %d after a restart (%zu "
           "tokens, %s); waiting for its client",
           (unsigned long long)r->rid, b, r->n_gen, r->adopted_done ? "done" : "running");
    /* A resume that came first. */
    for (size_t i = 0; i < rt->n_presume; i++) {
        pending_resume *p = &rt->presume[i];
        client_key k = {p->client, p->client_len, p->id, p->id_len};
        if (!is_keyed(r, &k)) continue;
        pending_resume pr = *p;
        rt->presume[i] = rt->presume[--rt->n_presume];
        attach(rt, r, pr.tokens, pr.delim, pr.conn);
        free(pr.id);
        break;
    }
    return true;
}

void restart_adopt(router *rt, int b, const msgpack_object *live) {
    size_t taken = 0;
    for (uint32_t i = 0; i < live->via.array.size; i++) {
        zi_im_live l;
        zi_error err = {0};
        if (zi_im_live_unpack(&live->via.array.ptr[i], &l, &err) != ZI_OK) {
            zi_log(&rt->log, ZI_LOG_WARN, "worker %d: a live sequence is malformed: %s", b,
                   err.msg);
            if (l.rid > 0) backend_rid_msg(rt, b, ZI_IM_CANCEL, (uint64_t)l.rid);
            zi_im_ids_free(&l.token_ids);
            continue;
        }
        const rreq *had = zi_req_table_get(&rt->reqs, (uint64_t)l.rid);
        if (had && had->wrk == b) {
            /* taken over already: a worker asked twice (reregisters to
             * several backends' queued messages) registers twice */
        } else if (adopt_one(rt, b, &l)) {
            taken++;
        } else if (!zi_gen_status_is_done(l.gstatus)) {
            backend_rid_msg(rt, b, ZI_IM_CANCEL, (uint64_t)l.rid); /* nobody to go on for */
        }
        zi_im_ids_free(&l.token_ids);
    }
    if (taken && count_alive(rt, ROLE_TOKENIZER, NULL) == 0 && !rt->no_tok_since)
        rt->no_tok_since = core_now(rt); /* a tokenizer must come within --failover-timeout */
    zi_log(&rt->log, ZI_LOG_INFO, "worker %d handed back %u sequences; %zu taken over", b,
           live->via.array.size, taken);
}

/* ---- resume -------------------------------------------------------------- */

/* The ids the kept "decode" messages carry. */
static size_t pending_ids(const rreq *r) {
    size_t n = 0;
    for (size_t i = 0; i < r->n_pend; i++) n += r->pend[i].n_ids;
    return n;
}

/* Orphan r's client holds its first `tokens` ids: a "decode" of the ids
 * it lacks goes before the kept ones, and the tokenizer gets the first
 * `tokens` as a replay (failover_attach). */
static void attach(router *rt, rreq *r, int64_t tokens, bool delim, zi_router_conn conn) {
    r->orphan = false;
    r->delim = delim;
    r->client_conn = conn;
    size_t kept = pending_ids(r);
    size_t before = r->n_gen - kept; /* the ids the worker reported */
    if (r->gen_broken || r->pend_broken || tokens < 0 || (uint64_t)tokens > before) {
        char msg[160];
        snprintf(msg, sizeof msg, "tokens: %lld, but the request had generated %zu tokens",
                 (long long)tokens, before);
        fail_request(rt, r, r->gen_broken ? "internal" : "invalid_request",
                     r->gen_broken ? "out of memory" : msg, r->gen_broken ? NULL : "tokens");
        return;
    }
    bool final = r->adopted_done && r->n_pend == 0;
    if ((size_t)tokens < before || final) {
        const char *st = final ? zi_gen_status_name((zi_gen_status)r->adopted_status) : "active";
        zi_im_tokens tm = {
            .rid = (int64_t)r->rid,
            .token_ids = {.set = true, .v = r->gen + tokens, .n = before - (size_t)tokens},
            .status = {st, strlen(st)}};
        zi_msg m;
        pend_msg pm = {0};
        if (zi_im_decode_pack(&tm, &m, NULL) == ZI_OK)
            pm = (pend_msg){dup_bytes(m.sb.data, m.sb.size), m.sb.size, before - (size_t)tokens};
        zi_msg_free(&m);
        pend_msg *p = pm.buf ? realloc(r->pend, (r->n_pend + 1) * sizeof *p) : NULL;
        if (!p) {
            free(pm.buf);
            fail_request(rt, r, "internal", "out of memory", NULL);
            return;
        }
        memmove(p + 1, p, r->n_pend * sizeof *p);
        p[0] = pm;
        r->pend = p;
        r->n_pend++;
        r->pend_cap = r->n_pend;
    }
    r->note_resume = r->stream;
    r->told_prompt = tokens > 0;
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu: its client resumed at %lld of %zu tokens",
           (unsigned long long)r->rid, (long long)tokens, r->n_gen);
    failover_attach(rt); /* the replay and the decodes, once a tokenizer is up */
}

void restart_resume(router *rt, const unsigned char *ident, size_t ident_len, bool delim,
                    const char *id, size_t id_len, const msgpack_object *o) {
    int64_t tokens = 0;
    const msgpack_object *t = zi_map_get(o, "tokens");
    if (t && (zi_map_int(o, "tokens", &tokens, NULL) != ZI_OK || tokens < 0)) {
        send_error_raw(rt, ident, ident_len, delim, id, id_len, "invalid_request",
                       "tokens: must be a non-negative integer", "tokens");
        return;
    }
    client_key k = {ident, ident_len, id, id_len};
    rreq *r = find_keyed(rt, &k);
    if (r) {
        /* Not an orphan: its stream never stopped here (nothing to do). */
        if (r->orphan) attach(rt, r, tokens, delim, rt->cur_conn);
        return;
    }
    if (core_now(rt) - rt->t_start_ms < rt->hb_timeout) {
        /* The workers may not have registered again yet. */
        for (size_t i = 0; i < rt->n_presume; i++) {
            const pending_resume *q = &rt->presume[i];
            if (q->client_len == ident_len && !memcmp(q->client, ident, ident_len) &&
                q->id_len == id_len && !memcmp(q->id, id, id_len))
                return; /* already waiting */
        }
        if (rt->n_presume >= (size_t)rt->max_queue) { /* a client's flood must not grow it */
            send_error_raw(rt, ident, ident_len, delim, id, id_len, "overloaded",
                           "--max-queue resumes are already waiting for their workers to "
                           "register again; retry later",
                           NULL);
            return;
        }
        pending_resume *p = realloc(rt->presume, (rt->n_presume + 1) * sizeof *p);
        char *idc = dup_bytes(id, id_len);
        if (p) rt->presume = p;
        if (p && idc) {
            pending_resume *n = &rt->presume[rt->n_presume++];
            memcpy(n->client, ident, ident_len);
            n->client_len = ident_len;
            n->delim = delim;
            n->id = idc;
            n->id_len = id_len;
            n->tokens = tokens;
            n->conn = rt->cur_conn;
            return;
        }
        free(idc);
    }
    send_error_raw(rt, ident, ident_len, delim, id, id_len, "unavailable",
                   "no worker holds this request (it had not reached a worker when the router "
                   "restarted, or it ended meanwhile); send it again",
                   NULL);
}

static bool is_orphan(const void *val, const void *arg) {
    const rreq *r = val;
    return r->orphan && *(const int64_t *)arg - r->orphan_ms >= 0;
}

void restart_check(router *rt, int64_t now) {
    if (rt->n_presume && now - rt->t_start_ms >= rt->hb_timeout) {
        for (size_t i = 0; i < rt->n_presume; i++) {
            pending_resume *p = &rt->presume[i];
            send_error_raw(rt, p->client, p->client_len, p->delim, p->id, p->id_len, "unavailable",
                           "no worker holds this request (it had not reached a worker when the "
                           "router restarted, or it ended meanwhile); send it again",
                           NULL);
            free(p->id);
        }
        rt->n_presume = 0;
    }
    int64_t before = now - rt->resume_grace;
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, is_orphan, &before));) {
        zi_log(&rt->log, ZI_LOG_INFO,
               "request %llu: its client did not resume within %lld ms; dropped",
               (unsigned long long)r->rid, rt->resume_grace);
        rt->metrics.finished[ZI_IM_FIN_CANCELLED]++;
        end_request(rt, r); /* "cancel" to its worker; it leaves the match */
    }
}

void restart_free(router *rt) {
    for (size_t i = 0; i < rt->n_presume; i++) { /* each still gets its one answer */
        pending_resume *p = &rt->presume[i];
        send_error_raw(rt, p->client, p->client_len, p->delim, p->id, p->id_len, "unavailable",
                       "the server is shutting down", NULL);
        free(p->id);
    }
    free(rt->presume);
    rt->presume = NULL;
    rt->n_presume = 0;
}
