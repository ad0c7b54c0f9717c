/*
 * router_backend.c - the router's backend side (router_impl.h lists the
 * router's files): tokenizers and workers register, send heartbeats, and
 * answer with encoded contexts, tokens, decoded text, tokenize and
 * detokenize results, and errors; each is matched to its request and moved
 * on (to the queue, the tokenizer, or the client). A backend the router
 * does not know is asked to register again. A backend that misses
 * heartbeats is dead: the requests a dead worker ran resume on another
 * worker, those a dead tokenizer held move to another tokenizer
 * (router_failover.c).
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "router_impl.h"

void to_backend(router *rt, int b, const zi_msg *m) {
    if (b < 0 || !rt->be[b].alive) return;
    if (out_send_msg(rt, ZI_ROUTER_BACKEND, rt->be[b].ident, rt->be[b].ident_len, false, m) != 0)
        zi_log(&rt->log, ZI_LOG_WARN, "backend %d unreachable: %s", b, strerror(errno));
}

/* "cancel" to a worker, or "release" to a tokenizer, for request rid. */
void backend_rid_msg(router *rt, int b, zi_im_type type, uint64_t rid) {
    zi_msg m;
    if (type == ZI_IM_CANCEL)
        zi_im_cancel_pack((int64_t)rid, &m);
    else
        zi_im_release_pack((int64_t)rid, &m);
    to_backend(rt, b, &m);
    zi_msg_free(&m);
}

static int find_backend(const router *rt, const unsigned char *ident, size_t len) {
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].ident_len == len && !memcmp(rt->be[i].ident, ident, len))
            return (int)i;
    return -1;
}

static void on_register(router *rt, const unsigned char *ident, size_t len,
                        const msgpack_object *o) {
    int b = find_backend(rt, ident, len);
    if (b < 0) {
        /* Reuse a dead slot: its requests were all ended when it died. */
        for (size_t i = 0; i < rt->n_be && b < 0; i++)
            if (!rt->be[i].alive) b = (int)i;
        if (b < 0) {
            backend *p = realloc(rt->be, (rt->n_be + 1) * sizeof *p);
            if (!p) return;
            rt->be = p;
            b = (int)rt->n_be++;
        }
        memset(&rt->be[b], 0, sizeof rt->be[b]);
    }
    backend *be = &rt->be[b];
    memcpy(be->ident, ident, len);
    be->ident_len = len;
    zi_im_register reg;
    zi_im_register_unpack(o, &reg);
    be->role = reg.worker ? ROLE_WORKER : ROLE_TOKENIZER;
    be->slots = (int)reg.slots;
    be->max_length = reg.max_length;
    be->vocab = reg.vocab;
    be->disk = reg.worker ? reg.kv_disk_id : 0;
    be->model[0] = '\0';
    if (reg.model.p)
        snprintf(be->model, sizeof be->model, "%.*s",
                 (int)(reg.model.n >= sizeof be->model ? sizeof be->model - 1 : reg.model.n),
                 reg.model.p);
    be->alive = true;
    be->conn = rt->cur_conn;
    be->last_seen = core_now(rt);
    /* A model known by its backends only (no --served-models, or one
     * started by hand) is known from its first register on. */
    model_rec *mr = model_find(rt, be->model, true);
    if (be->model[0] && !mr) {
        /* The model table is full (ZI_ROUTER_MAX_MODELS names): a backend
         * of a model the router cannot track is refused, else requests of
         * that model would wait on no per-model timeout. */
        zi_log(&rt->log, ZI_LOG_WARN,
               "%s of model '%s' refused: the router already knows %d models",
               be->role == ROLE_WORKER ? "worker" : "tokenizer", be->model, ZI_ROUTER_MAX_MODELS);
        memset(be, 0, sizeof *be); /* a dead, nameless slot: reused by the next register */
        return;
    }
    if (be->role == ROLE_WORKER) {
        rt->no_worker_since = 0;
        if (mr) mr->no_worker_since = 0, mr->failed = false; /* it loaded after all */
        /* A wished load is done (a worker of no model serves every one);
         * its idle time counts from its loading, so that a short
         * keep_alive does not unload it at once. */
        for (size_t k = 0; k < rt->n_models; k++) {
            model_rec *m = &rt->models[k];
            if (m->want == MW_LOAD && serves(be, m->name))
                m->want = MW_NONE, m->last_used_ms = core_now(rt);
        }
    }
    /* A worker back from a router restart hands back its sequences. */
    if (be->role == ROLE_WORKER && reg.live_obj) restart_adopt(rt, b, reg.live_obj);
    /* ... and the prefixes it holds (prefix affinity) */
    if (be->role == ROLE_WORKER) affinity_adopt(rt, b, reg.prefix_keys_obj);
    if (be->role == ROLE_TOKENIZER) {
        rt->no_tok_since = 0;
        if (mr) mr->no_tok_since = 0;
    }
    /* Requests whose tokenizer died, and those that waited for their model
     * to load: they are encoded once its tokenizer and a worker are up. */
    failover_attach(rt);
    if (be->role == ROLE_WORKER) {
        /* the workers it shares its disk tier with: a prefix one of them
         * took is warm on this one too (prefix affinity) */
        int shared = 0;
        for (size_t i = 0; be->disk && i < rt->n_be; i++)
            shared += (int)i != b && rt->be[i].alive && rt->be[i].disk == be->disk;
        char disk[320] = "";
        if (be->disk)
            snprintf(disk, sizeof disk, ", disk tier %.*s (%016llx, shared with %d live workers)",
                     (int)(reg.kv_disk_dir.n < 200 ? reg.kv_disk_dir.n : 200),
                     reg.kv_disk_dir.p ? reg.kv_disk_dir.p : "", (unsigned long long)be->disk,
                     shared);
        char held[64] = "";
        if (reg.prefix_keys_obj && reg.prefix_keys_obj->via.array.size)
            snprintf(held, sizeof held, ", %u prefixes taken lately",
                     (unsigned)reg.prefix_keys_obj->via.array.size);
        zi_log(&rt->log, ZI_LOG_INFO, "worker %d registered: model %s, %d slots, context %lld%s%s",
               b, be->model, be->slots, (long long)be->max_length, disk, held);
    } else
        zi_log(&rt->log, ZI_LOG_INFO, "tokenizer %d registered: model %s", b,
               be->model[0] ? be->model : "(any)");
    lora_on_register(rt, b, reg.loras_obj); /* before dispatch sends it requests */
    dispatch(rt);
}

/* Looks up the request a backend message is about (rid: the message's,
 * 0 when it had none); it must belong to that backend. A request past its
 * deadline ends here with "deadline_exceeded" (NULL): deadline_check runs
 * every 100 ms, and without this a short request finishing inside that
 * gap was answered after its deadline. */
static rreq *backend_req(router *rt, int b, int64_t rid) {
    if (rid <= 0) return NULL;
    rreq *r = zi_req_table_get(&rt->reqs, (uint64_t)rid);
    if (!r || (r->tok != b && r->wrk != b)) return NULL;
    if (r->deadline_ms && r->deadline_ms <= core_now(rt)) {
        send_final(rt, r, "deadline_exceeded", (zi_im_str){0});
        return NULL;
    }
    return r;
}

static void on_encoded(router *rt, int b, const msgpack_object *o) {
    zi_im_encoded em;
    zi_im_encoded_unpack(o, &em);
    int64_t rid = em.rid;
    rreq *r = backend_req(rt, b, rid);
    if (!r || r->state != RS_ENCODING) {
        if (rid > 0) backend_rid_msg(rt, b, ZI_IM_RELEASE, (uint64_t)rid); /* ended meanwhile */
        return;
    }
    const msgpack_object *ctx = em.context_obj;
    if (em.has_prompt_tokens) r->prompt_tokens = em.prompt_tokens;
    if (!ctx) {
        fail_request(rt, r, "internal", "the tokenizer sent no context", NULL);
        return;
    }
    if (r->prompt_tokens > rt->max_prompt) {
        char msg[160];
        snprintf(msg, sizeof msg, "prompt: %lld tokens exceed this server's limit of %lld",
                 (long long)r->prompt_tokens, rt->max_prompt);
        fail_request(rt, r, "invalid_request", msg, "prompt");
        return;
    }
    r->prefix_key = prefix_key(rt, ctx, r->model);
    zi_msg m;
    int rc = restart_start_pack(rt, r, ctx, NULL, &m); /* with the note, for a router restart */
    if (!built_or_fail(rt, r, rc, &m, NULL)) return;
    /* Keep the bytes: the sbuffer's storage becomes the request's. */
    r->start_len = m.sb.size;
    r->start_msg = msgpack_sbuffer_release(&m.sb);
    queue_push(rt, r);
    r->state = RS_QUEUED; /* ENCODING -> QUEUED: still counted in n_waiting */
    dispatch(rt);
}

static void on_tokens(router *rt, int b, const msgpack_object *o) {
    zi_im_tokens tm;
    int bad = zi_im_tokens_unpack(o, &tm, NULL);
    rreq *r = backend_req(rt, b, tm.rid);
    if (!r || r->wrk != b || r->state != RS_RUNNING) return; /* stale: ignored */
    zi_gen_status status = tm.gstatus;
    if (bad) {
        fail_request(rt, r, "internal", "the worker sent a malformed tokens message", NULL);
        return;
    }
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *v = NULL;
    size_t n = 0;
    if (zi_codec_decode_tokens(tm.token_ids.raw, &lim, "token_ids", &v, &n, NULL) == ZI_OK) {
        r->completion_tokens += (int64_t)n;
        failover_keep(r, v, n);
    } else {
        r->gen_broken = true; /* the ids are not known: no resume */
    }
    free(v);
    r->echo_seen = true;
    size_t n_ids = n;
    bool done = zi_gen_status_is_done(status);
    if (done) wrk_release(rt, r); /* RUNNING -> DECODING: the worker dropped it */
    /* Log probabilities and the echoed prompt ride along through the
     * tokenizer, so they reach the client in the same frame as their text:
     * the decode message carries the tokens message's fields as they came. */
    zi_msg m;
    tm.rid = (int64_t)r->rid;
    if (!built_or_fail(rt, r, zi_im_decode_pack(&tm, &m, NULL), &m, NULL)) return;
    failover_decode(rt, r, &m, n_ids); /* kept until decoded, for a tokenizer failover */
    zi_msg_free(&m);
    if (done) dispatch(rt);
}

/* Not streamed: appends a decoded message's log probabilities to the
 * request's and keeps its echoed prompt (ids, their log probabilities,
 * text: a packed map) for the final frame. */
static int keep_extras(rreq *r, const zi_im_decoded *d) {
    zi_codec_limits lim = zi_codec_limits_default();
    if (d->logprobs.raw) {
        zi_logprobs lp;
        int rc = zi_codec_decode_logprobs(d->logprobs.raw, &lim, "logprobs", &lp, NULL);
        if (rc) return rc; /* the final frame would carry fewer than the tokens */
        for (size_t i = 0; i < lp.n && !rc; i++)
            rc = zi_logprobs_push(&r->lp, lp.token_logprobs[i], lp.top[i].ids, lp.top[i].logprobs,
                                  lp.top[i].n, NULL);
        zi_logprobs_free(&lp);
        if (rc) return rc;
        r->has_lp = true;
    }
    const msgpack_object *pids = d->prompt_token_ids.raw;
    if ((pids || d->prompt_logprobs.raw || d->prompt_text_obj) && !r->echo) {
        zi_imap e;
        zi_imap_init(&e);
        zi_imap_object(&e, "prompt_token_ids", pids);
        zi_imap_object(&e, "prompt_logprobs", d->prompt_logprobs.raw);
        zi_imap_object(&e, "prompt_text", d->prompt_text_obj);
        zi_msg m;
        zi_msg_init(&m);
        int rc = zi_imap_close(&e, &m.pk);
        r->echo_len = m.sb.size;
        r->echo = msgpack_sbuffer_release(&m.sb);
        if (rc || !r->echo) return ZI_ENOMEM;
    }
    return ZI_OK;
}

static void on_decoded(router *rt, int b, const msgpack_object *o) {
    zi_im_decoded d;
    int bad = zi_im_decoded_unpack(o, &d, NULL);
    rreq *r = backend_req(rt, b, d.rid);
    if (!r || r->tok != b || r->kind != K_GENERATE) return;
    failover_decoded(r);
    const msgpack_object *ids = d.token_ids.raw;
    zi_gen_status status = d.gstatus;
    if (bad) {
        fail_request(rt, r, "internal", "the tokenizer sent a malformed decoded message", NULL);
        return;
    }
    bool has_ids = (ids->type == MSGPACK_OBJECT_ARRAY && ids->via.array.size > 0) ||
                   (ids->type == MSGPACK_OBJECT_MAP && zi_map_get(ids, "data") &&
                    zi_map_get(ids, "data")->type == MSGPACK_OBJECT_BIN &&
                    zi_map_get(ids, "data")->via.bin.size > 0);
    if (has_ids) {
        /* Inter-token latency: the time since the last tokens, shared by
         * this message's tokens. */
        int64_t now = core_now(rt), n = 1;
        if (ids->type == MSGPACK_OBJECT_ARRAY)
            n = ids->via.array.size;
        else if (zi_map_get(ids, "dtype") && zi_map_get(ids, "dtype")->type == MSGPACK_OBJECT_STR)
            n = zi_map_get(ids, "data")->via.bin.size /
                (zi_map_get(ids, "dtype")->via.str.size == 5 &&
                         !memcmp(zi_map_get(ids, "dtype")->via.str.ptr, "int32", 5)
                     ? 4
                     : 8);
        if (n < 1) n = 1;
        if (r->t_last_ms)
            for (int64_t k = 0; k < n && k < 256; k++)
                zi_im_hist_observe(&rt->metrics.hist[ZI_IM_HIST_ITL],
                                   (double)(now - r->t_last_ms) / 1e3 / (double)n);
        if (!r->t_first_ms) r->t_first_ms = now;
        r->t_last_ms = now;
    }
    /* What rides along to the client: the tokens' log probabilities, and
     * the echoed prompt (its ids, their log probabilities, its text). */
    zi_im_chunk ch = {.id = {r->id, r->id_len},
                      .text = d.text,
                      .token_ids = ids,
                      .logprobs = d.logprobs.raw,
                      .prompt_token_ids = d.prompt_token_ids.raw,
                      .prompt_logprobs = d.prompt_logprobs.raw,
                      .prompt_text = d.prompt_text_obj,
                      .resumed = r->note_resume,
                      .reasoning_open = d.reasoning_open,
                      .reasoning_harmony = d.reasoning_harmony,
                      /* the first chunk tells the prompt's length, so a
                       * stream can report it before the end (Anthropic's
                       * message_start) */
                      .prompt_tokens = r->told_prompt ? 0 : r->prompt_tokens,
                      .audio = d.audio.raw};
    bool extras = ch.logprobs || ch.prompt_token_ids || ch.prompt_logprobs || ch.prompt_text ||
                  ch.reasoning_open || ch.audio;
    if (r->stream && (d.text.n > 0 || has_ids || extras)) {
        zi_msg m;
        if (!built_or_fail(rt, r, zi_im_chunk_pack(&ch, &m), &m, NULL)) return;
        bool ok = to_client(rt, r, &m);
        zi_msg_free(&m);
        r->note_resume = false;
        r->told_prompt = true;
        if (!ok) {
            end_request(rt, r);
            return;
        }
    } else if (!r->stream && extras && keep_extras(r, &d) != ZI_OK) {
        fail_request(rt, r, "internal", "cannot keep the log probabilities", NULL);
        return;
    }
    if (!r->stream && d.text.n > 0) {
        char *p = realloc(r->text, r->text_len + d.text.n + 1);
        if (!p) {
            fail_request(rt, r, "internal", "out of memory for the completion text", NULL);
            return;
        }
        memcpy(p + r->text_len, d.text.p, d.text.n);
        r->text_len += d.text.n;
        p[r->text_len] = '\0';
        r->text = p;
    }
    if (zi_gen_status_is_done(status)) {
        tok_dropped(r);                                /* the tokenizer dropped its state */
        /* (cancels the worker on a stop string, which the final names) */
        send_final(rt, r, zi_gen_status_name(status), d.stop_string);
    }
}

static void on_util_result(router *rt, int b, const msgpack_object *o, const char *key) {
    zi_im_util_reply u;
    int bad = zi_im_util_reply_unpack(o, key, &u, NULL);
    rreq *r = backend_req(rt, b, u.rid);
    if (!r || r->state != RS_UTIL) return;
    if (bad) {
        fail_request(rt, r, "internal", "the tokenizer sent a malformed reply", NULL);
        return;
    }
    zi_msg m;
    int rc = zi_im_result_pack(
        &(zi_im_result){.id = {r->id, r->id_len}, .key = key, .value = u.value_obj}, &m);
    if (!built_or_fail(rt, r, rc, &m, NULL)) return;
    to_client(rt, r, &m);
    zi_msg_free(&m);
    end_request(rt, r);
}

/* embed_encoded from r's tokenizer, embedded from r's worker
 * (router_embed.c); anything else is stale and dropped. */
static void on_embed_msg(router *rt, int b, const msgpack_object *o, zi_im_type type) {
    int64_t rid = 0;
    zi_im_rid(o, &rid, NULL);
    rreq *r = backend_req(rt, b, rid);
    if (!r || r->kind != K_EMBED) return;
    if (type == ZI_IM_EMBED_ENCODED && r->tok == b && r->state == RS_ENCODING)
        on_embed_encoded(rt, r, o);
    else if (type == ZI_IM_EMBEDDED && r->wrk == b && r->state == RS_RUNNING)
        on_embedded(rt, r, o);
}

static void on_heartbeat(router *rt, int b, const msgpack_object *o) {
    zi_im_heartbeat hb;
    zi_im_heartbeat_unpack(o, &hb);
    for (int i = 0; i < ZI_N_KV_STATS; i++)
        if (hb.kv_set[i]) rt->be[b].kv[i] = hb.kv[i];
}

static void on_backend_error(router *rt, int b, const msgpack_object *o) {
    zi_im_error e;
    zi_im_error_unpack(o, &e);
    rreq *r = backend_req(rt, b, e.rid);
    if (!r) return;
    const char *code = e.code ? e.code : "internal";
    const char *msg = e.message ? e.message : "backend error";
    if (b == r->tok) tok_dropped(r); /* a tokenizer error drops its state */
    if (b == r->wrk && r->state == RS_RUNNING) wrk_release(rt, r); /* so does a worker's */
    fail_request(rt, r, code, msg, e.field);
    dispatch(rt);
}

void on_backend_frame(router *rt, const unsigned char *ident, size_t ident_len, const void *buf,
                      size_t len) {
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(buf, len, NULL, &u, &err) != ZI_OK) {
        zi_log(&rt->log, ZI_LOG_WARN, "malformed backend message: %s", err.msg);
        return;
    }
    const msgpack_object *o = &u.data;
    int b = find_backend(rt, ident, ident_len);
    zi_im_type type = zi_im_type_of(o);
    if (type == ZI_IM_REGISTER) {
        on_register(rt, ident, ident_len, o);
    } else if (b < 0) {
        /* Unknown (e.g. this router restarted, or declared it dead and its
         * network came back): ask it to register again. Once a second at
         * most for the same backend: a worker back from an outage had
         * hundreds of messages queued, each answered with a reregister, so
         * it registered (and both logged) hundreds of times
         * (tests/e2e/test_multihost.py); messages on one connection keep
         * their order, so the first reregister is enough. */
        int64_t now = core_now(rt);
        if (ident_len != rt->rereg_len || memcmp(ident, rt->rereg_ident, ident_len) ||
            now - rt->rereg_ms >= 1000) {
            zi_msg m;
            zi_im_reregister_pack(&m);
            out_send_msg(rt, ZI_ROUTER_BACKEND, ident, ident_len, false, &m);
            zi_msg_free(&m);
            memcpy(rt->rereg_ident, ident, ident_len);
            rt->rereg_len = ident_len;
            rt->rereg_ms = now;
        }
    } else {
        rt->be[b].last_seen = core_now(rt);
        if (type == ZI_IM_HEARTBEAT)
            on_heartbeat(rt, b, o);
        else if (type == ZI_IM_ENCODED)
            on_encoded(rt, b, o);
        else if (type == ZI_IM_TOKENS)
            on_tokens(rt, b, o);
        else if (type == ZI_IM_DECODED)
            on_decoded(rt, b, o);
        else if (type == ZI_IM_TOKENIZED)
            on_util_result(rt, b, o, "token_ids");
        else if (type == ZI_IM_DETOKENIZED)
            on_util_result(rt, b, o, "text");
        else if (type == ZI_IM_ERROR)
            on_backend_error(rt, b, o);
        else if (type == ZI_IM_EMBED_ENCODED || type == ZI_IM_EMBEDDED)
            on_embed_msg(rt, b, o, type);
        else if (type == ZI_IM_LORA_DONE)
            lora_on_done(rt, b, o);
        else
            zi_log(&rt->log, ZI_LOG_WARN, "backend %d: unknown message type", b);
    }
    msgpack_unpacked_destroy(&u);
}

/* A request that backend *arg (an int) holds: its tokenizer, or the
 * worker still running it. */
static bool held_by(const void *val, const void *arg) {
    const rreq *r = val;
    int b = *(const int *)arg;
    return r->tok == b || (r->wrk == b && r->state == RS_RUNNING);
}

/* Every request a dead worker ran resumes elsewhere; every generate
 * request a dead tokenizer held waits for another, its tokenize and
 * detokenize requests end with worker_lost (found in one walk of the table:
 * a request leaves the walk's match as it is handled, so none is missed
 * or handled twice). */
void backend_died(router *rt, int b, const char *why) {
    backend *be = &rt->be[b];
    rreq *r;
    size_t pos = 0;
    zi_log(&rt->log, ZI_LOG_WARN, "%s %d %s: declared dead",
           be->role == ROLE_WORKER ? "worker" : "tokenizer", b, why);
    be->alive = false;
    /* Its cache is gone, and a new worker may register in its place. */
    affinity_forget(rt, b);
    while ((r = zi_req_table_find(&rt->reqs, &pos, held_by, &b))) {
        if (r->wrk == b && r->state == RS_RUNNING) {
            wrk_release(rt, r);     /* RUNNING -> DECODING, the slot given back */
            failover_resume(rt, r); /* -> QUEUED, r->wrk -1: it leaves the match */
            continue;
        }
        /* Its tokenizer's state died with it: no "release" to send. */
        tok_dropped(r);
        if (r->kind == K_GENERATE) {
            failover_tokenizer(rt, r); /* r->tok is -1 after */
            continue;
        }
        fail_request(rt, r, "worker_lost",
                     "the tokenizer process handling this request stopped responding; the "
                     "request was not retried",
                     NULL);
    }
    if (be->role == ROLE_WORKER) lora_backend_died(rt, b);
    assert(be->assigned == 0); /* every request on it has left it */
    be->assigned = 0;
    if (be->role == ROLE_WORKER && count_alive(rt, ROLE_WORKER, NULL) == 0)
        rt->no_worker_since = core_now(rt);
    if (be->role == ROLE_TOKENIZER && count_alive(rt, ROLE_TOKENIZER, NULL) == 0)
        rt->no_tok_since = core_now(rt);
    /* The same per model: its requests wait for one of its own. */
    model_rec *mr = model_find(rt, be->model, false);
    if (mr && be->role == ROLE_WORKER && count_alive(rt, ROLE_WORKER, be->model) == 0)
        mr->no_worker_since = core_now(rt);
    if (mr && be->role == ROLE_TOKENIZER && count_alive(rt, ROLE_TOKENIZER, be->model) == 0)
        mr->no_tok_since = core_now(rt);
    /* A wished unload is done once none of its processes is left. */
    if (mr && mr->want == MW_UNLOAD && count_alive(rt, ROLE_WORKER, be->model) == 0 &&
        count_alive(rt, ROLE_TOKENIZER, be->model) == 0)
        mr->want = MW_NONE;
    failover_attach(rt); /* to another tokenizer, if one is alive */
    dispatch(rt);
}
