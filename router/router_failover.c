/*
 * router_failover.c - requests that outlive their worker (router_impl.h
 * lists the router's files; docs/protocol.md, "Failover").
 *
 * The router sees every token id a worker generates pass on its way to
 * the tokenizer, and keeps them (failover_keep). When the worker dies, each
 * request it ran is started again on another worker from exactly where it
 * was (failover_resume): the context the tokenizer made, with the ids
 * generated so far appended after the prompt and `_prompt_len` still the
 * prompt's, so that the new worker
 *
 *   - prefills prompt + generated (its prefix cache may hold most of it),
 *   - counts those ids as generated: max_length (prompt + max_new_tokens)
 *     leaves exactly the tokens still due, min_new_tokens and the
 *     presence / frequency / repetition penalties see them, a JSON schema
 *     or grammar replays them, and the seeded draw of the next token is
 *     number n_gen (zi_sampler_uniform(seed, step) is counter based),
 *   - returns none of them again (the completion window starts after
 *     them), and sends no second echo.
 *
 * The tokenizer keeps its decode state (incremental decoder, stop-string
 * matcher) meanwhile: the new worker's ids follow the old one's into it,
 * so the client sees each token once. Requests without a seed use seed 0
 * (the default), so every request's draws are reproducible and a resumed
 * output equals an uninterrupted one.
 *
 * A tokenizer that dies is replaced the same way (failover_tokenizer,
 * failover_attach): the router keeps each request's "encode" and the
 * "decode" messages its tokenizer has not answered yet. A request still
 * being encoded is encoded again elsewhere; one that was encoded gets, on
 * another tokenizer, its "encode" with "replay" (the ids the dead one had
 * answered for: the new one rebuilds the incremental decoder and the
 * stop-string matcher from them, sending nothing) and then the unanswered
 * "decode" messages again, so no text is lost or repeated.
 *
 * A request resumes on a worker (and a tokenizer) of its own model only.
 * A resumed request waits at the front of the queue. While no worker of
 * its model is alive for --failover-timeout, the waiting requests end
 * (failover_check): those that had run with "worker_lost", the others with
 * "unavailable".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "router_impl.h"

void failover_keep(rreq *r, const int32_t *ids, size_t n) {
    if (r->gen_broken || n == 0) return;
    if (r->n_gen + n > r->gen_cap) {
        size_t cap = r->gen_cap ? r->gen_cap : 64;
        while (cap < r->n_gen + n) cap *= 2;
        int32_t *p = realloc(r->gen, cap * sizeof *p);
        if (!p) {
            r->gen_broken = true; /* it runs on; only a resume is off */
            return;
        }
        r->gen = p;
        r->gen_cap = cap;
    }
    memcpy(r->gen + r->n_gen, ids, n * sizeof *ids);
    r->n_gen += n;
}

/* c (a fresh context: the prompt, or a resumed one: the prompt and ids
 * after it, as a worker hands back a resumed sequence after a router
 * restart) continues after the n ids gen: they replace whatever followed
 * the prompt and are counted as generated, not returned again. */
static int extend_context(zi_text_context *c, const int32_t *gen, size_t n, bool no_echo,
                          zi_error *err) {
    if (c->end_idx < c->prompt_len || c->start_idx != 0)
        return zi_error_set(err, ZI_EINVAL, "context: not a fresh prompt");
    c->end_idx = c->prompt_len;
    int64_t end = c->end_idx + (int64_t)n;
    if (end >= c->max_length)
        return zi_error_set(err, ZI_ERANGE, "context: no room left after %zu generated tokens", n);
    int64_t cap = (end + ZI_CTX_CHUNK - 1) / ZI_CTX_CHUNK * ZI_CTX_CHUNK;
    if (cap > c->size) {
        int32_t *t = realloc(c->tokens, (size_t)cap * sizeof *t);
        if (!t) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        c->tokens = t;
        zi_logprobs **l = realloc(c->lp_data, (size_t)cap * sizeof *l);
        if (!l) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        c->lp_data = l;
        memset(l + c->size, 0, (size_t)(cap - c->size) * sizeof *l);
        c->size = cap;
    }
    if (n) memcpy(c->tokens + c->end_idx, gen, n * sizeof *gen); /* gen is NULL when n = 0 */
    c->active_idx = c->end_idx = c->completion_start_idx = c->completion_end_idx = end;
    c->committed_idx = 0;
    c->is_initial_prompt = true;
    if (no_echo) c->log_probabilities_echo = false; /* the client has it already */
    return zi_text_context_check(c, err);
}

/* The "start" message that resumes r (into *out, malloc'd). */
static int build_resume(const rreq *r, char **out, size_t *out_len, zi_error *err) {
    if (!r->start_msg) return zi_error_set(err, ZI_EINVAL, "no start message kept");
    if (r->gen_broken) return zi_error_set(err, ZI_ENOMEM, "the generated ids were not kept");
    msgpack_unpacked u;
    int rc = zi_msgpack_parse(r->start_msg, r->start_len, NULL, &u, err);
    if (rc) return rc;
    zi_im_start sm;
    zi_text_context c;
    zi_text_context_zero(&c);
    zi_codec_limits lim = zi_codec_limits_default();
    char *bytes = NULL;
    size_t len = 0;
    rc = zi_im_start_unpack(&u.data, &sm, err);
    if (!rc && !sm.context) rc = zi_error_set(err, ZI_EINVAL, "start: no context");
    if (!rc) rc = zi_codec_decode_text_context(sm.context, &lim, "context", &c, err);
    if (!rc) rc = extend_context(&c, r->gen, r->n_gen, r->echo_seen, err);
    if (!rc) rc = zi_codec_text_context_to_bytes(&c, &bytes, &len, err);
    zi_text_context_free(&c);
    msgpack_unpacked cu;
    if (!rc) rc = zi_msgpack_parse(bytes, len, NULL, &cu, err); /* cu points into bytes */
    if (rc) {
        msgpack_unpacked_destroy(&u);
        free(bytes);
        return rc;
    }
    zi_msg m;
    /* the kept start's note goes on (u holds it) */
    rc = zi_im_start_pack(&(zi_im_start){.rid = (int64_t)r->rid,
                                         .context = &cu.data,
                                         .note = sm.note,
                                         .prefix_key = r->prefix_key},
                          &m);
    msgpack_unpacked_destroy(&cu);
    msgpack_unpacked_destroy(&u);
    free(bytes);
    if (rc) {
        zi_msg_free(&m);
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    *out_len = m.sb.size;
    *out = msgpack_sbuffer_release(&m.sb);
    return *out ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
}

void failover_resume(router *rt, rreq *r) {
    zi_error err = {0};
    r->wrk = -1;
    free(r->resume_msg);
    r->resume_msg = NULL;
    /* An embed request keeps no state on its worker: its kept "embed"
     * message goes again as it is (dispatch sends start_msg). */
    int rc = r->kind == K_EMBED ? ZI_OK : build_resume(r, &r->resume_msg, &r->resume_len, &err);
    if (rc) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "the model worker running this request stopped responding and the request "
                 "could not be resumed (%.100s)",
                 err.msg[0] ? err.msg : "out of memory");
        fail_request(rt, r, "worker_lost", msg, NULL); /* from DECODING: no slot to give back */
        return;
    }
    queue_push_front(rt, r);
    r->state = RS_QUEUED; /* DECODING -> QUEUED: waiting again */
    waiting_add(rt, r, 1);
    r->resumes++;
    r->note_resume = r->kind == K_GENERATE;
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu: its worker died after %zu tokens; resuming",
           (unsigned long long)r->rid, r->n_gen);
}

static bool is_queued(const void *val, const void *arg) {
    (void)arg;
    return ((const rreq *)val)->state == RS_QUEUED;
}

/* Waiting for a tokenizer; an orphan of a router restart waits for its
 * client first (router_restart.c). */
static bool needs_tok(const void *val, const void *arg) {
    (void)arg;
    return ((const rreq *)val)->tlink == TL_WAITING && !((const rreq *)val)->orphan;
}

/* Whether since (a no_*_since time, 0: none) is --failover-timeout ago. */
static bool past(const router *rt, int64_t since, int64_t now) {
    return since && now - since >= rt->failover_timeout;
}

/* When r's wait for since's processes began: since, or for a request
 * waiting for its model to load, its own arrival if later (it waits the
 * whole timeout, not what is left since an unload or an earlier request). */
static int64_t wait_start(const rreq *r, int64_t since) {
    return r->loading && since && since < r->t_recv_ms ? r->t_recv_ms : since;
}

/* r has waited for a worker (tok: a tokenizer) of its model too long: no
 * live one at all, or none of its model, for --failover-timeout. */
static bool waited_out(router *rt, const rreq *r, bool tok, int64_t now) {
    if (past(rt, wait_start(r, tok ? rt->no_tok_since : rt->no_worker_since), now)) return true;
    const model_rec *m = model_find(rt, r->model, false);
    return m && past(rt, wait_start(r, tok ? m->no_tok_since : m->no_worker_since), now) &&
           count_alive(rt, tok ? ROLE_TOKENIZER : ROLE_WORKER, r->model) == 0;
}

/* r's model could not be loaded (model_failed) and no worker of it is
 * up: its record, else NULL. */
static const model_rec *failed_model(router *rt, const rreq *r) {
    const model_rec *m = model_find(rt, r->model, false);
    return m && m->failed && count_alive(rt, ROLE_WORKER, r->model) == 0 ? m : NULL;
}

/* Ends r, which waits for model m that could not be loaded, saying why. */
static void fail_unloadable(router *rt, rreq *r, const model_rec *m) {
    char msg[sizeof m->fail_msg + ZI_ROUTER_MODEL_NAME + 64];
    snprintf(msg, sizeof msg, "model '%s' could not be loaded: %s", m->name, m->fail_msg);
    fail_request(rt, r, "unavailable", msg, NULL);
}

void failover_check(router *rt, int64_t now) {
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, needs_tok, NULL));) {
        /* (one waiting for its model to load waits for its workers too) */
        bool loading = r->loading && r->state == RS_ENCODING;
        const model_rec *fm = loading ? failed_model(rt, r) : NULL;
        if (fm) { /* its model will not come: no use waiting */
            fail_unloadable(rt, r, fm);
            continue;
        }
        if (!waited_out(rt, r, true, now) && !(loading && waited_out(rt, r, false, now))) {
            pos++; /* it stays in the walk's match: step over it */
            continue;
        }
        if (loading) { /* never encoded: its model never came */
            fail_request(rt, r, "unavailable",
                         "the model of this request did not load within --failover-timeout; "
                         "retry shortly",
                         NULL);
            continue;
        }
        fail_request(rt, r, "worker_lost",
                     "the tokenizer process handling this request stopped responding and no "
                     "tokenizer came back within --failover-timeout",
                     NULL);
    }
    if (rt->q_len == 0) return;
    pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, is_queued, NULL));) {
        const model_rec *fm = failed_model(rt, r);
        if (fm) {
            fail_unloadable(rt, r, fm);
            continue;
        }
        if (!waited_out(rt, r, false, now)) {
            pos++;
            continue;
        }
        if (r->resumes)
            fail_request(rt, r, "worker_lost",
                         "the model worker running this request stopped responding and no "
                         "worker of its model came back within --failover-timeout",
                         NULL);
        else
            fail_request(rt, r, "unavailable",
                         "no model worker of this request's model has been connected for "
                         "--failover-timeout; retry shortly",
                         NULL);
    }
}

/* ---- tokenizer failover ------------------------------------------------- */

void failover_decode(router *rt, rreq *r, const zi_msg *m, size_t n_ids) {
    if (!r->pend_broken && r->n_pend == r->pend_cap) {
        size_t cap = r->pend_cap ? r->pend_cap * 2 : 4;
        pend_msg *p = realloc(r->pend, cap * sizeof *p);
        if (p)
            r->pend = p, r->pend_cap = cap;
        else
            r->pend_broken = true;
    }
    char *copy = r->pend_broken ? NULL : malloc(m->sb.size ? m->sb.size : 1);
    if (copy) {
        memcpy(copy, m->sb.data, m->sb.size);
        r->pend[r->n_pend++] = (pend_msg){copy, m->sb.size, n_ids};
    } else {
        r->pend_broken = true; /* it decodes on; only a tokenizer failover is off */
    }
    to_backend(rt, r->tok, m);
}

void failover_decoded(rreq *r) {
    if (r->pend_broken || r->n_pend == 0) return;
    free(r->pend[0].buf);
    memmove(r->pend, r->pend + 1, (r->n_pend - 1) * sizeof *r->pend);
    r->n_pend--;
}

void failover_tokenizer(router *rt, rreq *r) {
    tok_detach(rt, r, true); /* ON | STATE -> WAITING */
    if (!r->encode_msg || r->pend_broken || (r->state != RS_ENCODING && r->gen_broken)) {
        fail_request(rt, r, "worker_lost",
                     "the tokenizer process handling this request stopped responding and the "
                     "request could not be moved (out of memory)",
                     NULL);
        return;
    }
    if (r->state != RS_ENCODING) r->note_resume = true;
    zi_log(&rt->log, ZI_LOG_INFO, "request %llu: its tokenizer died; moving it",
           (unsigned long long)r->rid);
}

/* Whether map key k is the string s. */
static bool key_is(const msgpack_object *k, const char *s) {
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(s) &&
           !memcmp(k->via.str.ptr, s, k->via.str.size);
}

/* r's kept "encode" into *m, with "max_length" ml when ml > 0 (in place
 * of the kept one) and with "replay" (the ids the dead tokenizer had
 * answered for, rebuilding the decode state) when replay. */
static int build_encode(const rreq *r, int64_t ml, bool replay, zi_msg *m) {
    size_t pending = 0;
    for (size_t i = 0; replay && i < r->n_pend; i++) pending += r->pend[i].n_ids;
    if (pending > r->n_gen) return ZI_EINVAL;
    msgpack_unpacked u;
    zi_error err = {0};
    if (zi_msgpack_parse(r->encode_msg, r->encode_len, NULL, &u, &err)) return ZI_EINVAL;
    const msgpack_object *o = &u.data;
    int rc = o->type == MSGPACK_OBJECT_MAP ? ZI_OK : ZI_EINVAL;
    if (!rc) {
        uint32_t n_keys = 0;
        for (uint32_t i = 0; i < o->via.map.size; i++)
            n_keys += !(ml > 0 && key_is(&o->via.map.ptr[i].key, "max_length"));
        zi_msg_init(m);
        msgpack_pack_map(&m->pk, n_keys + (ml > 0) + replay);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            if (ml > 0 && key_is(&o->via.map.ptr[i].key, "max_length")) continue;
            msgpack_pack_object(&m->pk, o->via.map.ptr[i].key);
            msgpack_pack_object(&m->pk, o->via.map.ptr[i].val);
        }
        if (ml > 0) {
            zi_pack_str(&m->pk, "max_length");
            msgpack_pack_int64(&m->pk, ml);
        }
        if (replay) {
            zi_pack_str(&m->pk, "replay");
            size_t n = r->n_gen - pending;
            msgpack_pack_array(&m->pk, (uint32_t)n);
            for (size_t i = 0; i < n; i++) msgpack_pack_int32(&m->pk, r->gen[i]);
        }
        if (!m->sb.data) rc = ZI_ENOMEM;
    }
    msgpack_unpacked_destroy(&u);
    return rc;
}

/* A request that waited for its model to load is encoded against the
 * context its workers report now (--ctx-size, or what fits), not the
 * model's training context: the kept "encode" takes that max_length, so a
 * tokenizer failover later encodes it the same way. */
static int encode_for_workers(router *rt, rreq *r) {
    zi_msg m;
    int rc = build_encode(r, worker_max_length(rt, r->model), false, &m);
    if (rc) return rc;
    free(r->encode_msg);
    r->encode_len = m.sb.size;
    r->encode_msg = msgpack_sbuffer_release(&m.sb);
    return r->encode_msg ? ZI_OK : ZI_ENOMEM;
}

void failover_attach(router *rt) {
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, needs_tok, NULL));) {
        int t = pick_backend(rt, ROLE_TOKENIZER, r->model); /* one of its model */
        /* One waiting for its model to load waits for a worker too: the
         * context the tokenizer checks and truncates to is the workers'. */
        bool loading = r->loading && r->state == RS_ENCODING;
        if (t < 0 || (loading && count_alive(rt, ROLE_WORKER, r->model) == 0)) {
            pos++; /* it waits on: step over it */
            continue;
        }
        int rc = loading ? encode_for_workers(rt, r) : ZI_OK;
        if (!rc && r->state == RS_ENCODING) {
            rc = out_send(rt, ZI_ROUTER_BACKEND, rt->be[t].ident, rt->be[t].ident_len, false,
                          r->encode_msg, r->encode_len);
        } else if (!rc) {
            zi_msg m;
            rc = build_encode(r, 0, true, &m);
            if (!rc) {
                rc = out_send_msg(rt, ZI_ROUTER_BACKEND, rt->be[t].ident, rt->be[t].ident_len,
                                  false, &m);
                zi_msg_free(&m);
            }
            for (size_t i = 0; !rc && i < r->n_pend; i++)
                rc = out_send(rt, ZI_ROUTER_BACKEND, rt->be[t].ident, rt->be[t].ident_len, false,
                              r->pend[i].buf, r->pend[i].len);
        }
        tok_attach(rt, r, t, true); /* WAITING -> STATE (it leaves the walk's match) */
        r->loading = false;
        if (rc) {
            fail_request(rt, r, loading ? "internal" : "worker_lost",
                         loading ? "out of memory"
                                 : "the tokenizer process handling this request stopped "
                                   "responding and the request could not be moved to another",
                         NULL);
            continue;
        }
        zi_log(&rt->log, ZI_LOG_INFO, "request %llu: %s tokenizer %d (%s)",
               (unsigned long long)r->rid, loading ? "its model is up: to" : "moved to", t,
               loading                   ? "encoded for its workers' context"
               : r->state == RS_ENCODING ? "encoded again"
                                         : "decode state replayed");
    }
}
