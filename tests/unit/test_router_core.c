/*
 * test_router_core.c - cmocka tests for the router core (router/
 * router_core.h): the request state machine driven by scripted events,
 * with no sockets. The outbox records every frame the core sends, the
 * clock is the test's, and every frame a backend or client "sends" is
 * built with the real encoders (protocol/imsg.h, codec.h).
 *
 * Scripted paths: generate (streamed and not), tokenize, detokenize,
 * embed, cancel while running and while decoding, a deadline, a client
 * disconnect, a backend error, a worker death with a resume on another
 * worker, a worker death with none left (--failover-timeout), a tokenizer
 * death with its decode state replayed on another, prefix affinity's
 * block size and its disk tiers (a worker sharing the disk tier of the
 * one that took a prefix is preferred, the one holding it in memory more
 * so), and the counter check itself. Then randomized
 * interleavings (seeded, thousands of runs) of requests, backends that
 * answer in their own order, worker and tokenizer deaths (connection
 * closed or silent), cancels, deadlines and client disconnects, checking
 * the promise: every admitted request gets exactly one terminal frame
 * ("final", "error" or "result"; none when its client is gone) and no
 * frame after it, and once everything has ended the table is empty and
 * every counter is back to zero.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "codec.h"
#include "imsg.h"
#include "imsg_embed.h"
#include "router_core.h"
#include "router_impl.h"
#include "router_sim.h"

/* ---- the simulated outbox (router_sim.h) ---------------------------------- */

/* A frame sent, parsed: its "type" (backend) or "event" (client), its
 * rid, id, and for a final its status. */
typedef struct parsed {
    char kind[24];
    int64_t rid;
    char id[32];
    char status[32];
    bool resumed, replay;
    char text[64];
} parsed;

static void copy_str(const msgpack_object *o, const char *key, char *dst, size_t cap) {
    const msgpack_object *v = zi_map_get(o, key);
    dst[0] = '\0';
    if (v && v->type == MSGPACK_OBJECT_STR)
        snprintf(dst, cap, "%.*s", (int)(v->via.str.size < cap - 1 ? v->via.str.size : cap - 1),
                 v->via.str.ptr);
}

static parsed parse_sent(const sent *f) {
    parsed p;
    memset(&p, 0, sizeof p);
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(f->data, f->len, NULL, &u, &err), ZI_OK);
    const msgpack_object *o = &u.data;
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    copy_str(o, f->side == ZI_ROUTER_CLIENT ? "event" : "type", p.kind, sizeof p.kind);
    copy_str(o, "id", p.id, sizeof p.id);
    copy_str(o, "status", p.status, sizeof p.status);
    copy_str(o, "text", p.text, sizeof p.text);
    if (f->side == ZI_ROUTER_CLIENT && !strcmp(p.kind, "error")) copy_str(o, "code", p.status, sizeof p.status);
    const msgpack_object *v = zi_map_get(o, "rid");
    if (v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) p.rid = (int64_t)v->via.u64;
    v = zi_map_get(o, "resumed");
    p.resumed = v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean;
    p.replay = zi_map_get(o, "replay") != NULL;
    msgpack_unpacked_destroy(&u);
    return p;
}

/* The index of the first frame sent from `from` on to ident of kind (NULL:
 * any), or -1. */
static int find_sent(const sim *s, size_t from, const char *ident, const char *kind) {
    for (size_t i = from; i < s->n_out; i++) {
        if (ident && strcmp(s->out[i].ident, ident)) continue;
        parsed p = parse_sent(&s->out[i]);
        if (!kind || !strcmp(p.kind, kind)) return (int)i;
    }
    return -1;
}

static int count_sent(const sim *s, const char *ident, const char *kind) {
    int n = 0;
    for (size_t i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].ident, ident) && !strcmp(parse_sent(&s->out[i]).kind, kind)) n++;
    return n;
}

/* ---- frames from peers ----------------------------------------------------- */

/* A backend of model `model` registers with context max_length. */
static void reg_model_ctx(sim *s, const char *ident, bool worker, int slots, const char *model,
                          int64_t max_length) {
    sim_register(s, ident, worker, slots, model, max_length, NULL, 0);
}

/* A backend of model `model` registers (reg: every one as "m"). */
static void reg_model(sim *s, const char *ident, bool worker, int slots, const char *model) {
    reg_model_ctx(s, ident, worker, slots, model, 2048);
}

static void reg(sim *s, const char *ident, bool worker, int slots) {
    reg_model(s, ident, worker, slots, "m");
}

/* A worker of model "m" (4 slots) registers with a disk tier of sharing
 * id disk in dir. */
static void reg_disk(sim *s, const char *ident, uint64_t disk, const char *dir) {
    zi_msg m;
    zi_im_register r = {.worker = true,
                        .slots = 4,
                        .max_length = 2048,
                        .vocab = 1000,
                        .model = {"m", 1},
                        .kv_disk_dir = {dir, strlen(dir)},
                        .kv_disk_id = disk};
    assert_int_equal(zi_im_register_pack(&r, &m), ZI_OK);
    from_backend(s, ident, &m);
}

static void heartbeat(sim *s, const char *ident, int64_t block_size) {
    zi_msg m;
    zi_im_heartbeat hb = {.load = 0, .has_kv = block_size > 0};
    hb.kv[ZI_KV_BLOCK_SIZE] = block_size;
    assert_int_equal(zi_im_heartbeat_pack(&hb, &m), ZI_OK);
    from_backend(s, ident, &m);
}

typedef struct gen_opts {
    bool no_stream;
    int64_t timeout_ms;
    const char *model; /* model_name, or NULL: none */
    /* keep_alive: the string when keep_alive_str, else keep_alive_s
     * seconds when has_keep_alive */
    const char *keep_alive_str;
    int64_t keep_alive_s;
    bool has_keep_alive;
} gen_opts;

static void generate(sim *s, const char *client, const char *id, gen_opts o) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "generate");
    zi_imap_str(&b, "id", id);
    zi_imap_str(&b, "prompt", "hello");
    zi_imap_bool(&b, "stream", !o.no_stream);
    if (o.timeout_ms) zi_imap_int(&b, "timeout_ms", o.timeout_ms);
    if (o.model) zi_imap_str(&b, "model_name", o.model);
    if (o.keep_alive_str)
        zi_imap_str(&b, "keep_alive", o.keep_alive_str);
    else if (o.has_keep_alive)
        zi_imap_int(&b, "keep_alive", o.keep_alive_s);
    from_client_imap(s, client, &b);
}

static void client_op(sim *s, const char *client, const char *id, const char *op) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", op);
    zi_imap_str(&b, "id", id);
    if (!strcmp(op, "tokenize")) zi_imap_str(&b, "text", "hi there");
    if (!strcmp(op, "embed")) zi_imap_str(&b, "input", "hi there");
    if (!strcmp(op, "detokenize")) {
        msgpack_packer *pk = zi_imap_key(&b, "token_ids");
        msgpack_pack_array(pk, 2);
        msgpack_pack_int32(pk, 5);
        msgpack_pack_int32(pk, 6);
    }
    from_client_imap(s, client, &b);
}

/* tokenizer -> router: encoded, the prompt being ids 1..n. */
static void encoded(sim *s, const char *tok, int64_t rid, size_t n) {
    int32_t prompt[128];
    for (size_t i = 0; i < n; i++) prompt[i] = (int32_t)(i + 1);
    zi_text_context c;
    zi_error err = {0};
    assert_int_equal(zi_text_context_init(&c, prompt, n, 2048, NULL, &err), ZI_OK);
    zi_msg m;
    zi_im_encoded e = {.rid = rid, .has_prompt_tokens = true, .prompt_tokens = (int64_t)n,
                       .context = &c};
    assert_int_equal(zi_im_encoded_pack(&e, &m, &err), ZI_OK);
    zi_text_context_free(&c);
    from_backend(s, tok, &m);
}

static void tokens(sim *s, const char *wrk, int64_t rid, const int32_t *ids, size_t n,
                   const char *status) {
    zi_msg m;
    zi_error err = {0};
    zi_im_tokens t = {.rid = rid, .token_ids = {.set = true, .v = ids, .n = n},
                      .status = {status, strlen(status)}};
    assert_int_equal(zi_im_tokens_pack(&t, &m, &err), ZI_OK);
    from_backend(s, wrk, &m);
}

static void decoded(sim *s, const char *tok, int64_t rid, const char *text, const int32_t *ids,
                    size_t n, const char *status) {
    zi_msg m;
    zi_error err = {0};
    zi_im_decoded d = {.rid = rid, .text = {text, strlen(text)},
                       .token_ids = {.set = true, .v = ids, .n = n},
                       .status = {status, strlen(status)}};
    assert_int_equal(zi_im_decoded_pack(&d, &m, &err), ZI_OK);
    from_backend(s, tok, &m);
}

static void backend_error(sim *s, const char *ident, int64_t rid, const char *code) {
    zi_msg m;
    zi_im_error e = {.rid = rid, .code = code, .message = "it broke", .field = ""};
    assert_int_equal(zi_im_error_pack(&e, &m), ZI_OK);
    from_backend(s, ident, &m);
}

/* The rid of the last message of kind sent to ident. */
static int64_t last_rid(const sim *s, const char *ident, const char *kind) {
    int64_t rid = -1;
    for (size_t i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].ident, ident)) {
            parsed p = parse_sent(&s->out[i]);
            if (!strcmp(p.kind, kind)) rid = p.rid;
        }
    assert_true(rid > 0);
    return rid;
}

static void check_ok(const sim *s) {
    zi_error err = {0};
    int rc = zi_router_check(&s->rt, &err);
    if (rc) fprintf(stderr, "zi_router_check: %s\n", err.msg);
    assert_int_equal(rc, ZI_OK);
}

/* Nothing in flight, every counter back to zero. */
static void check_idle(const sim *s) {
    check_ok(s);
    assert_int_equal(zi_req_table_count(&s->rt.reqs), 0);
    assert_int_equal(s->rt.n_waiting, 0);
    assert_int_equal(s->rt.q_len, 0);
    for (size_t i = 0; i < s->rt.n_be; i++) assert_int_equal(s->rt.be[i].assigned, 0);
}

/* One tokenizer, one worker (2 slots). */
static void sim_up(sim *s) {
    sim_init(s);
    reg(s, "tok0", false, 1);
    reg(s, "wrk0", true, 2);
    check_ok(s);
}

/* A streamed request up to RUNNING on wrk0, its rid returned. */
static int64_t run_one(sim *s, const char *client, const char *id, gen_opts o) {
    generate(s, client, id, o);
    int64_t rid = last_rid(s, "tok0", "encode");
    encoded(s, "tok0", rid, 20);
    assert_int_equal(last_rid(s, "wrk0", "start"), rid);
    return rid;
}

/* ---- scripted paths --------------------------------------------------------- */

static void test_generate_streamed(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5, 6}, b[] = {7};
    tokens(&s, "wrk0", rid, a, 2, "active");
    assert_int_equal(last_rid(&s, "tok0", "decode"), rid);
    decoded(&s, "tok0", rid, "ab", a, 2, "active");
    assert_int_equal(count_sent(&s, "c1", "chunk"), 1);
    tokens(&s, "wrk0", rid, b, 1, "end_of_sequence");
    assert_int_equal(s.rt.be[1].assigned, 0); /* the worker's slot is free at once */
    assert_int_equal(s.rt.be[0].assigned, 1); /* the tokenizer still decodes */
    decoded(&s, "tok0", rid, "c", b, 1, "end_of_sequence");
    assert_int_equal(count_sent(&s, "c1", "chunk"), 2);
    int f = find_sent(&s, 0, "c1", "final");
    assert_true(f >= 0);
    assert_string_equal(parse_sent(&s.out[f]).status, "end_of_sequence");
    assert_int_equal(f, (int)s.n_out - 1); /* nothing after it */
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 0);
    assert_int_equal(count_sent(&s, "tok0", "release"), 0);
    check_idle(&s);
    sim_free(&s);
}

static void test_generate_not_streamed(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){.no_stream = true});
    const int32_t a[] = {5, 6};
    tokens(&s, "wrk0", rid, a, 2, "maximum_length");
    decoded(&s, "tok0", rid, "xy", a, 2, "maximum_length");
    assert_int_equal(count_sent(&s, "c1", "chunk"), 0);
    int f = find_sent(&s, 0, "c1", "final");
    parsed p = parse_sent(&s.out[f]);
    assert_string_equal(p.status, "maximum_length");
    assert_string_equal(p.text, "xy");
    check_idle(&s);
    sim_free(&s);
}

static void test_stop_string_cancels_worker(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "active");
    decoded(&s, "tok0", rid, "x", a, 1, "stop"); /* the tokenizer matched a stop string */
    assert_string_equal(parse_sent(&s.out[find_sent(&s, 0, "c1", "final")]).status, "stop");
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1);
    assert_int_equal(count_sent(&s, "tok0", "release"), 0); /* it dropped its state */
    check_idle(&s);
    sim_free(&s);
}

static void test_tokenize_detokenize(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    client_op(&s, "c1", "t", "tokenize");
    int64_t rid = last_rid(&s, "tok0", "tokenize");
    assert_int_equal(s.rt.n_waiting, 1);
    const int32_t ids[] = {3, 4};
    zi_msg m;
    assert_int_equal(zi_im_tokenized_pack(&(zi_im_util_reply){.rid = rid,
                                                              .token_ids = {.set = true, .v = ids, .n = 2}},
                                          &m),
                     ZI_OK);
    from_backend(&s, "tok0", &m);
    assert_int_equal(count_sent(&s, "c1", "result"), 1);
    client_op(&s, "c1", "d", "detokenize");
    rid = last_rid(&s, "tok0", "detokenize");
    assert_int_equal(
        zi_im_detokenized_pack(&(zi_im_util_reply){.rid = rid, .text = {"ab", 2}}, &m), ZI_OK);
    from_backend(&s, "tok0", &m);
    assert_int_equal(count_sent(&s, "c1", "result"), 2);
    check_idle(&s);
    sim_free(&s);
}

/* tokenizer -> router: an embed request's inputs as ids. */
static void embed_encoded(sim *s, const char *tok, int64_t rid) {
    zi_msg in, m;
    zi_error err = {0};
    zi_msg_init(&in);
    msgpack_pack_array(&in.pk, 1);
    msgpack_pack_array(&in.pk, 2);
    msgpack_pack_int64(&in.pk, 1);
    msgpack_pack_int64(&in.pk, 2);
    msgpack_unpacked u;
    assert_int_equal(zi_msgpack_parse(in.sb.data, in.sb.size, NULL, &u, &err), ZI_OK);
    zi_im_embed e = {.rid = rid, .prompt_tokens = 2, .inputs = &u.data};
    assert_int_equal(zi_im_embed_pack(ZI_IM_EMBED_ENCODED, &e, &m, &err), ZI_OK);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&in);
    from_backend(s, tok, &m);
}

static void embedded(sim *s, const char *wrk, int64_t rid) {
    float v[2] = {0.5f, 0.25f};
    int64_t counts[1] = {2};
    zi_embeddings_response resp = {.embeddings = v, .rows = 1, .dim = 2, .token_counts = counts,
                                   .n_inputs = 1, .pooling = ZI_POOLING_MEAN};
    zi_msg m;
    zi_error err = {0};
    assert_int_equal(zi_im_embedded_pack(&(zi_im_embedded){.rid = rid, .resp = &resp}, &m, &err),
                     ZI_OK);
    from_backend(s, wrk, &m);
}

static void test_embed(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    client_op(&s, "c1", "e", "embed");
    int64_t rid = last_rid(&s, "tok0", "embed_encode");
    embed_encoded(&s, "tok0", rid);
    assert_int_equal(s.rt.be[0].assigned, 0); /* the tokenizer's part is done */
    assert_int_equal(last_rid(&s, "wrk0", "embed"), rid);
    embedded(&s, "wrk0", rid);
    assert_int_equal(count_sent(&s, "c1", "result"), 1);
    check_idle(&s);
    sim_free(&s);
}

static void test_cancel_running(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    client_op(&s, "c1", "a", "cancel");
    int f = find_sent(&s, 0, "c1", "final");
    assert_string_equal(parse_sent(&s.out[f]).status, "cancelled");
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1);
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    /* The worker's tokens already on their way are dropped. */
    size_t before = s.n_out;
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "active");
    assert_int_equal(s.n_out, before);
    check_idle(&s);
    sim_free(&s);
}

static void test_cancel_decoding(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "end_of_sequence"); /* RUNNING -> DECODING */
    client_op(&s, "c1", "a", "cancel");
    assert_int_equal(count_sent(&s, "c1", "final"), 1);
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 0); /* the worker is done with it */
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    size_t before = s.n_out;
    decoded(&s, "tok0", rid, "x", a, 1, "end_of_sequence"); /* late: dropped */
    assert_int_equal(s.n_out, before);
    sim_free(&s);
}

static void test_cancel_queued(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    reg(&s, "tok0", false, 1);
    reg(&s, "wrk0", true, 1);
    run_one(&s, "c1", "a", (gen_opts){0});
    generate(&s, "c1", "b", (gen_opts){0});
    encoded(&s, "tok0", last_rid(&s, "tok0", "encode"), 20);
    assert_int_equal(s.rt.q_len, 1); /* no free slot */
    client_op(&s, "c1", "b", "cancel");
    assert_int_equal(s.rt.q_len, 0);
    assert_int_equal(count_sent(&s, "c1", "final"), 1);
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 0);
    client_op(&s, "c1", "a", "cancel");
    check_idle(&s);
    sim_free(&s);
}

static void test_deadline(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    run_one(&s, "c1", "a", (gen_opts){.timeout_ms = 1000}); /* running */
    int64_t rid = run_one(&s, "c1", "c", (gen_opts){.timeout_ms = 1000});
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "end_of_sequence");        /* decoding */
    generate(&s, "c1", "b", (gen_opts){.timeout_ms = 1000}); /* still encoding */
    s.now += 999;
    heartbeat(&s, "tok0", 0);
    heartbeat(&s, "wrk0", 16);
    zi_router_tick(&s.rt);
    assert_int_equal(count_sent(&s, "c1", "final"), 0);
    s.now += 1;
    zi_router_tick(&s.rt);
    assert_int_equal(count_sent(&s, "c1", "final"), 3);
    for (int f = find_sent(&s, 0, "c1", "final"); f >= 0; f = find_sent(&s, (size_t)f + 1, "c1", "final"))
        assert_string_equal(parse_sent(&s.out[f]).status, "deadline_exceeded");
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1); /* the decoding one's worker is done */
    assert_int_equal(count_sent(&s, "tok0", "release"), 3);
    check_idle(&s);
    sim_free(&s);
}

static void test_client_disconnect(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    run_one(&s, "c1", "a", (gen_opts){0});
    generate(&s, "c1", "b", (gen_opts){0});
    run_one(&s, "c2", "a", (gen_opts){0});
    size_t before = s.n_out;
    zi_router_client_gone(&s.rt, conn_of("c1"));
    assert_int_equal(find_sent(&s, before, "c1", NULL), -1); /* no one to read it */
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1);
    assert_int_equal(count_sent(&s, "tok0", "release"), 2);
    assert_int_equal(s.rt.metrics.finished[ZI_IM_FIN_CANCELLED], 2);
    assert_int_equal(zi_req_table_count(&s.rt.reqs), 1); /* c2's goes on */
    client_op(&s, "c2", "a", "cancel");
    check_idle(&s);
    sim_free(&s);
}

static void test_client_unreachable(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    snprintf(s.gone[s.n_gone++], 32, "c1"); /* gone without a monitor event */
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "active");
    decoded(&s, "tok0", rid, "x", a, 1, "active"); /* the chunk cannot be sent */
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1);
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    sim_free(&s);
}

static void test_backend_error(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    backend_error(&s, "wrk0", rid, "internal");
    int f = find_sent(&s, 0, "c1", "error");
    assert_true(f >= 0);
    assert_string_equal(parse_sent(&s.out[f]).status, "internal");
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 0); /* it dropped it itself */
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    /* A tokenizer's refusal while encoding. */
    generate(&s, "c1", "b", (gen_opts){0});
    backend_error(&s, "tok0", last_rid(&s, "tok0", "encode"), "invalid_request");
    assert_int_equal(count_sent(&s, "c1", "error"), 2);
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    sim_free(&s);
}

/* A streamed generate naming model (NULL: none). */
static void generate_model(sim *s, const char *client, const char *id, const char *model) {
    generate(s, client, id, (gen_opts){.model = model});
}

/* The message of the last error frame sent to client. */
/* The last frame sent to client (of kind, NULL: any), its key's string
 * value into out. */
static void last_frame_str(const sim *s, const char *client, const char *kind, const char *key,
                           char *out, size_t cap) {
    int at = -1;
    for (size_t i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].ident, client) &&
            (!kind || !strcmp(parse_sent(&s->out[i]).kind, kind)))
            at = (int)i;
    assert_true(at >= 0);
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(s->out[at].data, s->out[at].len, NULL, &u, &err), ZI_OK);
    copy_str(&u.data, key, out, cap);
    msgpack_unpacked_destroy(&u);
}

static void last_error(const sim *s, const char *client, char *msg, size_t cap) {
    last_frame_str(s, client, "error", "message", msg, cap);
}

/* Two models: each request goes to a tokenizer and a worker of its own
 * model (the first configured one when it names none), a model whose
 * worker is busy does not hold up the other's queue, a dead worker's
 * request resumes on a worker of the same model only, and an unknown or
 * loading model is refused naming the models. */
static void test_model_routing(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    zi_error err = {0};
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "c", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_EINVAL); /* twice */
    reg_model(&s, "tokA", false, 1, "a");
    reg_model(&s, "tokB", false, 1, "b");
    reg_model(&s, "wrkB0", true, 1, "b");
    reg_model(&s, "wrkA", true, 1, "a");
    reg_model(&s, "wrkB1", true, 1, "b");
    check_ok(&s);
    char msg[400];
    /* unknown: refused with the known names */
    generate_model(&s, "c1", "x", "zz");
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "'zz'"));
    assert_non_null(strstr(msg, "'a', 'b', 'c'"));
    /* configured, no process of it yet: unavailable, "loading" */
    generate_model(&s, "c1", "y", "c");
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "'c' is loading"));
    /* no model: the default, a */
    generate_model(&s, "c1", "r1", NULL);
    int64_t r1 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r1, 20);
    assert_int_equal(last_rid(&s, "wrkA", "start"), r1);
    /* a again: wrkA is full, it waits; b behind it goes at once */
    generate_model(&s, "c1", "r2", "a");
    int64_t r2 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r2, 20);
    generate_model(&s, "c1", "r3", "b");
    int64_t r3 = last_rid(&s, "tokB", "encode");
    assert_int_equal(count_sent(&s, "tokA", "encode"), 2);
    encoded(&s, "tokB", r3, 20);
    assert_int_equal(count_sent(&s, "wrkA", "start"), 1);
    int on_b0 = find_sent(&s, 0, "wrkB0", "start") >= 0;
    assert_int_equal(last_rid(&s, on_b0 ? "wrkB0" : "wrkB1", "start"), r3);
    assert_int_equal(s.rt.q_len, 1); /* r2, for a */
    check_ok(&s);
    /* r3's worker dies mid-stream: it resumes on the other b worker, not
     * on a (whose slot frees later) */
    const int32_t ids[] = {5, 6};
    tokens(&s, on_b0 ? "wrkB0" : "wrkB1", r3, ids, 2, "active");
    decoded(&s, "tokB", r3, "ab", ids, 2, "active");
    zi_router_backend_gone(&s.rt, conn_of(on_b0 ? "wrkB0" : "wrkB1"));
    check_ok(&s);
    assert_int_equal(last_rid(&s, on_b0 ? "wrkB1" : "wrkB0", "start"), r3);
    assert_int_equal(count_sent(&s, "wrkA", "start"), 1);
    /* r1 ends: r2 takes wrkA */
    tokens(&s, "wrkA", r1, ids, 1, "end_of_sequence");
    decoded(&s, "tokA", r1, "a", ids, 1, "end_of_sequence");
    assert_int_equal(last_rid(&s, "wrkA", "start"), r2);
    check_ok(&s);
    sim_free(&s);
}

/* --load-on-demand: a request for a configured model with no process up
 * waits (no error), is encoded once its tokenizer registers and runs once
 * its worker does; one whose model never comes ends "unavailable" after
 * --failover-timeout. */
static void test_load_on_demand(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    zi_error err = {0};
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    zi_router_set_on_demand(&s.rt, true);
    generate_model(&s, "c1", "r1", "b");
    generate_model(&s, "c1", "r2", NULL); /* a */
    check_ok(&s);
    assert_int_equal(count_sent(&s, "c1", "error"), 0);
    assert_int_equal(s.rt.n_waiting, 2);
    reg_model(&s, "tokB", false, 1, "b");
    check_ok(&s);
    /* not encoded before a worker of b is up (its context is not known) */
    assert_int_equal(find_sent(&s, 0, "tokB", "encode"), -1);
    reg_model(&s, "wrkB", true, 1, "b");
    int64_t r1 = last_rid(&s, "tokB", "encode");
    check_ok(&s);
    encoded(&s, "tokB", r1, 20);
    assert_int_equal(last_rid(&s, "wrkB", "start"), r1);
    check_ok(&s);
    /* a never comes: r2 ends unavailable */
    s.now += s.rt.failover_timeout + 1;
    zi_router_tick(&s.rt);
    char msg[400];
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "did not load"));
    assert_int_equal(count_sent(&s, "c1", "error"), 1);
    check_ok(&s);
    sim_free(&s);
}

/* The integer value of key in the last frame of kind sent to ident (-1:
 * none there). */
static int64_t last_frame_int(const sim *s, const char *ident, const char *kind, const char *key) {
    int at = -1;
    for (size_t i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].ident, ident) && !strcmp(parse_sent(&s->out[i]).kind, kind))
            at = (int)i;
    assert_true(at >= 0);
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(s->out[at].data, s->out[at].len, NULL, &u, &err), ZI_OK);
    const msgpack_object *v = zi_map_get(&u.data, key);
    int64_t x = v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)v->via.u64 : -1;
    msgpack_unpacked_destroy(&u);
    return x;
}

/* --load-on-demand: a request that arrives while its model loads is
 * encoded against the context the model's worker reports once it is up
 * (its --ctx-size), whichever of tokenizer and worker registers first; a
 * tokenizer failover afterwards encodes it the same way; one whose
 * model's tokenizer came but no worker ends "unavailable" after
 * --failover-timeout. */
static void test_load_on_demand_context(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    zi_error err = {0};
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "c", &err), ZI_OK);
    zi_router_set_on_demand(&s.rt, true);
    /* the tokenizer first: the encode waits for the worker's 512 */
    generate_model(&s, "c1", "r1", "b");
    reg_model_ctx(&s, "tokB", false, 1, "b", 0);
    assert_int_equal(find_sent(&s, 0, "tokB", "encode"), -1);
    reg_model_ctx(&s, "wrkB", true, 1, "b", 512);
    int64_t r1 = last_rid(&s, "tokB", "encode");
    assert_int_equal(last_frame_int(&s, "tokB", "encode", "max_length"), 512);
    check_ok(&s);
    /* its tokenizer dies before answering: encoded again with 512 */
    reg_model_ctx(&s, "tokB2", false, 1, "b", 0);
    zi_router_backend_gone(&s.rt, conn_of("tokB"));
    assert_int_equal(last_rid(&s, "tokB2", "encode"), r1);
    assert_int_equal(last_frame_int(&s, "tokB2", "encode", "max_length"), 512);
    encoded(&s, "tokB2", r1, 20);
    assert_int_equal(last_rid(&s, "wrkB", "start"), r1);
    /* the worker first: 256 */
    generate_model(&s, "c1", "r2", "c");
    reg_model_ctx(&s, "wrkC", true, 1, "c", 256);
    reg_model_ctx(&s, "tokC", false, 1, "c", 0);
    last_rid(&s, "tokC", "encode");
    assert_int_equal(last_frame_int(&s, "tokC", "encode", "max_length"), 256);
    check_ok(&s);
    /* a's tokenizer comes, its worker never does: unavailable in time */
    generate_model(&s, "c1", "r3", "a");
    reg_model_ctx(&s, "tokA", false, 1, "a", 0);
    assert_int_equal(find_sent(&s, 0, "tokA", "encode"), -1);
    s.now += s.rt.failover_timeout + 1;
    zi_router_tick(&s.rt);
    char msg[400];
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "did not load"));
    assert_int_equal(count_sent(&s, "c1", "error"), 1);
    check_ok(&s);
    sim_free(&s);
}

/* A client op about a model: load_model / unload_model. */
static void model_op(sim *s, const char *client, const char *op, const char *model) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", op);
    zi_imap_str(&b, "id", "w");
    zi_imap_str(&b, "model_name", model);
    from_client_imap(s, client, &b);
}

/* A streamed generate of model with keep_alive (ka: a string when kas,
 * else the number of seconds kn). */
static void generate_ka(sim *s, const char *client, const char *id, const char *model,
                        const char *kas, int64_t kn) {
    generate(
        s, client, id,
        (gen_opts){
            .model = model, .keep_alive_str = kas, .keep_alive_s = kn, .has_keep_alive = true});
}

/* The last frame sent to client, its key's string value into out. */
static void last_str(const sim *s, const char *client, const char *key, char *out, size_t cap) {
    last_frame_str(s, client, NULL, key, out, cap);
}

/* The models op's entry for model: its state, want and keep_alive_ms. */
static void model_entry(sim *s, const char *model, char *state, char *want, int64_t *ka,
                        int64_t *active) {
    client_op(s, "srv", "m", "models");
    int at = -1;
    for (size_t i = 0; i < s->n_out; i++)
        if (!strcmp(s->out[i].ident, "srv")) at = (int)i;
    assert_true(at >= 0);
    msgpack_unpacked u;
    zi_error err = {0};
    zi_im_models ms;
    assert_int_equal(zi_msgpack_parse(s->out[at].data, s->out[at].len, NULL, &u, &err), ZI_OK);
    assert_int_equal(zi_im_models_unpack(&u.data, &ms, &err), ZI_OK);
    bool found = false;
    for (size_t k = 0; k < ms.n; k++) {
        if (ms.v[k].name.n != strlen(model) || memcmp(ms.v[k].name.p, model, ms.v[k].name.n))
            continue;
        found = true;
        assert_true(ms.v[k].has_usage);
        snprintf(state, 16, "%.*s", (int)ms.v[k].state.n, ms.v[k].state.p);
        snprintf(want, 16, "%.*s", (int)ms.v[k].want.n, ms.v[k].want.p);
        *ka = ms.v[k].keep_alive_ms;
        *active = ms.v[k].active;
    }
    msgpack_unpacked_destroy(&u);
    assert_true(found);
}

/* Ends request rid of tok / wrk with end_of_sequence. */
static void finish(sim *s, const char *tok, const char *wrk, int64_t rid) {
    const int32_t ids[] = {5};
    tokens(s, wrk, rid, ids, 1, "end_of_sequence");
    decoded(s, tok, rid, "a", ids, 1, "end_of_sequence");
}

/* load_model / unload_model keep a wish the models op reports until it is
 * met: an unload waits for the model's requests and ends when its
 * processes are gone (a request for it after that loads it back), a load
 * ends when a worker of it registers; an unknown model is refused with the
 * known names, and a router not loading on demand refuses both.
 * keep_alive: the latest request's holds (seconds, or a string), 0 wants
 * an unload as soon as the model is idle, the router's --keep-alive
 * otherwise; a bad one is refused naming the field. */
static void test_load_unload_wishes(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    zi_error err = {0};
    char st[16], want[16], msg[400];
    int64_t ka, active;
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    model_op(&s, "c1", "load_model", "b");
    last_str(&s, "c1", "code", st, sizeof st);
    assert_string_equal(st, "unsupported"); /* not --load-on-demand */
    zi_router_set_on_demand(&s.rt, true);
    reg_model(&s, "tokA", false, 1, "a");
    reg_model(&s, "wrkA", true, 2, "a");
    reg_model(&s, "tokB", false, 1, "b");
    reg_model(&s, "wrkB", true, 2, "b");
    model_op(&s, "c1", "load_model", "zz");
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "'a', 'b'"));
    model_op(&s, "c1", "load_model", "a");
    last_str(&s, "c1", "status", st, sizeof st);
    assert_string_equal(st, "loaded");
    model_entry(&s, "a", st, want, &ka, &active);
    assert_string_equal(want, "none");
    assert_int_equal(ka, -1); /* forever: no --keep-alive */
    /* unload b while a request of it runs: "unloading", wished until its
     * processes are gone */
    generate_model(&s, "c1", "r1", "b");
    int64_t r1 = last_rid(&s, "tokB", "encode");
    encoded(&s, "tokB", r1, 20);
    model_op(&s, "c2", "unload_model", "b");
    last_str(&s, "c2", "status", st, sizeof st);
    assert_string_equal(st, "unloading");
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(want, "unload");
    assert_int_equal(active, 1);
    finish(&s, "tokB", "wrkB", r1);
    assert_int_equal(count_sent(&s, "c1", "final"), 1); /* nothing lost */
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(want, "unload");
    assert_int_equal(active, 0);
    zi_router_backend_gone(&s.rt, conn_of("wrkB"));
    zi_router_backend_gone(&s.rt, conn_of("tokB"));
    check_ok(&s);
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(st, "unloaded");
    assert_string_equal(want, "none");
    model_op(&s, "c2", "unload_model", "b");
    last_str(&s, "c2", "status", st, sizeof st);
    assert_string_equal(st, "unloaded");
    /* a request for b now waits and clears the stale wish */
    generate_model(&s, "c1", "r2", "b");
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(st, "loading");
    assert_string_equal(want, "none");
    /* an explicit load is wished until a worker of b registers */
    model_op(&s, "c2", "load_model", "b");
    last_str(&s, "c2", "status", st, sizeof st);
    assert_string_equal(st, "loading");
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(want, "load");
    check_ok(&s);
    reg_model(&s, "tokB2", false, 1, "b");
    reg_model(&s, "wrkB2", true, 2, "b");
    check_ok(&s);
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(st, "loaded");
    assert_string_equal(want, "none");
    int64_t r2 = last_rid(&s, "tokB2", "encode");
    encoded(&s, "tokB2", r2, 20);
    finish(&s, "tokB2", "wrkB2", r2);
    /* keep_alive 0: an unload is wanted as soon as a is idle */
    generate_ka(&s, "c1", "r3", "a", "0", 0);
    int64_t r3 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r3, 20);
    model_entry(&s, "a", st, want, &ka, &active);
    assert_string_equal(want, "none"); /* busy */
    assert_int_equal(ka, 0);
    finish(&s, "tokA", "wrkA", r3);
    model_entry(&s, "a", st, want, &ka, &active);
    assert_string_equal(want, "unload");
    /* 60 (seconds): kept a minute */
    generate_ka(&s, "c1", "r4", "a", NULL, 60);
    int64_t r4 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r4, 20);
    finish(&s, "tokA", "wrkA", r4);
    model_entry(&s, "a", st, want, &ka, &active);
    assert_int_equal(ka, 60000);
    assert_string_equal(want, "none");
    s.now += 60000;
    model_entry(&s, "a", st, want, &ka, &active);
    assert_string_equal(want, "unload");
    /* none given: the router's --keep-alive (5m) */
    zi_router_set_keep_alive(&s.rt, 300000);
    generate_model(&s, "c1", "r5", "a");
    int64_t r5 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r5, 20);
    finish(&s, "tokA", "wrkA", r5);
    model_entry(&s, "a", st, want, &ka, &active);
    assert_int_equal(ka, 300000);
    assert_string_equal(want, "none");
    /* a bad keep_alive names the field */
    generate_ka(&s, "c1", "r6", "a", "5 parsecs", 0);
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "keep_alive"));
    last_str(&s, "c1", "field", st, sizeof st);
    assert_string_equal(st, "keep_alive");
    generate_ka(&s, "c1", "r7", "a", "-1", 0); /* forever */
    int64_t r7 = last_rid(&s, "tokA", "encode");
    encoded(&s, "tokA", r7, 20);
    finish(&s, "tokA", "wrkA", r7);
    s.now += 10LL * 86400000;
    model_entry(&s, "a", st, want, &ka, &active);
    assert_int_equal(ka, -1);
    assert_string_equal(want, "none");
    check_idle(&s);
    sim_free(&s);
}

/* One model's requests cannot take the queue the models share: with two
 * models each may have half of --max-queue waiting (or
 * --max-queue-per-model), the next is "overloaded" naming the bound. A
 * model whose processes could not load (model_failed, from zinfer serve)
 * ends its waiting requests at once with the reason, "unavailable", and
 * refuses new ones and load_model with it until a worker of it
 * registers; the models op lists it "failed". */
static void test_model_queue_bound_and_failed_load(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    zi_error err = {0};
    char msg[400], st[16], want[16];
    int64_t ka, active;
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    zi_router_set_on_demand(&s.rt, true);
    s.rt.max_queue = 8;
    reg_model(&s, "tokA", false, 1, "a");
    reg_model(&s, "wrkA", true, 1, "a");
    /* b loads: 4 of its requests wait, the 5th is refused */
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "b%d", i);
        generate_model(&s, "c1", id, "b");
    }
    assert_int_equal(count_sent(&s, "c1", "error"), 0);
    generate_model(&s, "c1", "b4", "b");
    last_str(&s, "c1", "code", st, sizeof st);
    assert_string_equal(st, "overloaded");
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "model 'b'"));
    assert_non_null(strstr(msg, "--max-queue-per-model 4"));
    /* a still has its half */
    generate_model(&s, "c2", "a0", "a");
    encoded(&s, "tokA", last_rid(&s, "tokA", "encode"), 20);
    for (int i = 1; i <= 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "a%d", i);
        generate_model(&s, "c2", id, "a");
        encoded(&s, "tokA", last_rid(&s, "tokA", "encode"), 20);
    }
    assert_int_equal(count_sent(&s, "c2", "error"), 0);
    assert_int_equal(s.rt.q_len, 4); /* a1..a4 behind a0 */
    check_ok(&s);
    /* b cannot be loaded: its 4 end now, with the reason */
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "model_failed");
    zi_imap_str(&b, "id", "f");
    zi_imap_str(&b, "model_name", "b");
    zi_imap_str(&b, "message", "b.gguf: tensor 'blk.1.ffn_down.weight' is missing");
    from_client_imap(&s, "srv", &b);
    last_str(&s, "srv", "status", st, sizeof st);
    assert_string_equal(st, "failed");
    assert_int_equal(count_sent(&s, "c1", "error"), 5);
    last_str(&s, "c1", "code", st, sizeof st);
    assert_string_equal(st, "unavailable");
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "model 'b' could not be loaded: b.gguf: tensor"));
    check_ok(&s);
    model_entry(&s, "b", st, want, &ka, &active);
    assert_string_equal(st, "failed");
    assert_int_equal(active, 0);
    /* new ones, and load_model, are refused with it */
    generate_model(&s, "c1", "b5", "b");
    assert_int_equal(count_sent(&s, "c1", "error"), 6);
    last_error(&s, "c1", msg, sizeof msg);
    assert_non_null(strstr(msg, "ffn_down"));
    model_op(&s, "c1", "load_model", "b");
    last_str(&s, "c1", "code", st, sizeof st);
    assert_string_equal(st, "unavailable");
    /* an explicit --max-queue-per-model: a has 4 waiting, 3 is the bound */
    s.rt.max_model_queue = 3;
    generate_model(&s, "c2", "a5", "a");
    last_str(&s, "c2", "code", st, sizeof st);
    assert_string_equal(st, "overloaded");
    last_error(&s, "c2", msg, sizeof msg);
    assert_non_null(strstr(msg, "--max-queue-per-model 3"));
    /* a worker of b registers after all: b serves again */
    reg_model(&s, "tokB", false, 1, "b");
    reg_model(&s, "wrkB", true, 1, "b");
    generate_model(&s, "c1", "b6", "b");
    assert_int_equal(count_sent(&s, "c1", "error"), 7); /* (the load_model's) */
    assert_int_equal(last_rid(&s, "tokB", "encode"), (int64_t)s.rt.next_rid);
    check_ok(&s);
    sim_free(&s);
}

static void test_worker_failover(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    reg(&s, "wrk1", true, 2);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5, 6}, b[] = {7};
    tokens(&s, "wrk0", rid, a, 2, "active");
    decoded(&s, "tok0", rid, "ab", a, 2, "active");
    zi_router_backend_gone(&s.rt, conn_of("wrk0"));
    check_ok(&s);
    assert_int_equal(last_rid(&s, "wrk1", "start"), rid); /* resumed on the other */
    assert_int_equal(s.rt.be[2].assigned, 1);
    assert_int_equal(count_sent(&s, "c1", "final"), 0);
    /* The resume message's context holds prompt + the ids generated. */
    int st = find_sent(&s, 0, "wrk1", "start");
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(s.out[st].data, s.out[st].len, NULL, &u, &err), ZI_OK);
    zi_text_context c;
    zi_codec_limits lim = zi_codec_limits_default();
    assert_int_equal(
        zi_codec_decode_text_context(zi_map_get(&u.data, "context"), &lim, "context", &c, &err),
        ZI_OK);
    assert_int_equal(c.end_idx, 22);
    assert_int_equal(c.prompt_len, 20);
    assert_int_equal(c.tokens[20], 5);
    assert_int_equal(c.tokens[21], 6);
    zi_text_context_free(&c);
    msgpack_unpacked_destroy(&u);
    tokens(&s, "wrk1", rid, b, 1, "end_of_sequence");
    decoded(&s, "tok0", rid, "c", b, 1, "end_of_sequence");
    int ch = find_sent(&s, (size_t)find_sent(&s, 0, "c1", "chunk") + 1, "c1", "chunk");
    assert_true(parse_sent(&s.out[ch]).resumed); /* the first chunk after says so */
    assert_int_equal(count_sent(&s, "c1", "final"), 1);
    check_idle(&s);
    sim_free(&s);
}

static void test_worker_lost(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    s.rt.failover_timeout = 2000;
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5};
    tokens(&s, "wrk0", rid, a, 1, "active");
    zi_router_backend_gone(&s.rt, conn_of("wrk0"));
    assert_int_equal(s.rt.q_len, 1); /* waiting for a worker */
    s.now += 1999;
    heartbeat(&s, "tok0", 0);
    zi_router_tick(&s.rt);
    assert_int_equal(count_sent(&s, "c1", "error"), 0);
    s.now += 1;
    zi_router_tick(&s.rt);
    int f = find_sent(&s, 0, "c1", "error");
    assert_string_equal(parse_sent(&s.out[f]).status, "worker_lost");
    assert_int_equal(count_sent(&s, "tok0", "release"), 1);
    check_idle(&s);
    sim_free(&s);
}

static void test_heartbeat_timeout(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    reg(&s, "wrk1", true, 2);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    s.now += s.rt.hb_timeout + 1; /* wrk0 went silent, the others did not */
    heartbeat(&s, "tok0", 0);
    heartbeat(&s, "wrk1", 16);
    zi_router_tick(&s.rt);
    assert_false(s.rt.be[1].alive);
    assert_int_equal(last_rid(&s, "wrk1", "start"), rid);
    check_ok(&s);
    sim_free(&s);
}

/* A worker declared dead whose network comes back sends what it had
 * queued: the router asks it to register again once, not once per
 * message (tests/e2e/test_multihost.py saw ~190 registrations), and again
 * a second later if it still has not. */
static void test_reregister_once(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    s.now += s.rt.hb_timeout + 1;
    heartbeat(&s, "tok0", 0);
    zi_router_tick(&s.rt);
    assert_false(s.rt.be[1].alive);
    for (int i = 0; i < 50; i++) heartbeat(&s, "wrk0", 16);
    assert_int_equal(count_sent(&s, "wrk0", "reregister"), 1);
    heartbeat(&s, "wrkX", 16); /* another backend is asked at once */
    assert_int_equal(count_sent(&s, "wrkX", "reregister"), 1);
    s.now += 1000;
    heartbeat(&s, "wrk0", 16);
    assert_int_equal(count_sent(&s, "wrk0", "reregister"), 2);
    reg(&s, "wrk0", true, 2);
    assert_true(s.rt.be[1].alive);
    heartbeat(&s, "wrk0", 16);
    assert_int_equal(count_sent(&s, "wrk0", "reregister"), 2);
    check_idle(&s);
    sim_free(&s);
}

static void test_tokenizer_failover(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    int64_t rid = run_one(&s, "c1", "a", (gen_opts){0});
    const int32_t a[] = {5, 6}, b[] = {7};
    tokens(&s, "wrk0", rid, a, 2, "active");
    decoded(&s, "tok0", rid, "ab", a, 2, "active");
    tokens(&s, "wrk0", rid, b, 1, "active"); /* a decode tok0 never answers */
    zi_router_backend_gone(&s.rt, conn_of("tok0"));
    check_ok(&s);
    assert_int_equal(s.rt.be[0].assigned, 0);
    reg(&s, "tok1", false, 1);
    /* tok1 gets the encode with replay (ids 5, 6), then the decode of 7. */
    int e = find_sent(&s, 0, "tok1", "encode");
    assert_true(e >= 0);
    assert_true(parse_sent(&s.out[e]).replay);
    assert_true(find_sent(&s, (size_t)e, "tok1", "decode") > e);
    decoded(&s, "tok1", rid, "c", b, 1, "active");
    int ch = find_sent(&s, (size_t)find_sent(&s, 0, "c1", "chunk") + 1, "c1", "chunk");
    assert_true(parse_sent(&s.out[ch]).resumed);
    tokens(&s, "wrk0", rid, b, 1, "end_of_sequence");
    decoded(&s, "tok1", rid, "c", b, 1, "end_of_sequence");
    assert_int_equal(count_sent(&s, "c1", "final"), 1);
    check_idle(&s);
    sim_free(&s);
}

static void test_util_tokenizer_dies(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    client_op(&s, "c1", "t", "tokenize");
    zi_router_backend_gone(&s.rt, conn_of("tok0"));
    int f = find_sent(&s, 0, "c1", "error");
    assert_string_equal(parse_sent(&s.out[f]).status, "worker_lost");
    check_idle(&s);
    sim_free(&s);
}

static void test_shutdown_ends_all(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    run_one(&s, "c1", "a", (gen_opts){0});
    generate(&s, "c1", "b", (gen_opts){0});
    zi_router_shutdown(&s.rt);
    assert_int_equal(count_sent(&s, "c1", "error"), 2);
    assert_int_equal(count_sent(&s, "wrk0", "cancel"), 1);
    sim_clear(&s);
    free(s.out);
}

/* A context of n tokens: ids 1..n, then id x at position at (0: none). */
static uint64_t key_of(const router *rt, size_t n, size_t at, int32_t x) {
    int32_t p[128];
    for (size_t i = 0; i < n; i++) p[i] = (int32_t)(i + 1);
    if (at) p[at] = x;
    zi_text_context c;
    zi_error err = {0};
    assert_int_equal(zi_text_context_init(&c, p, n, 2048, NULL, &err), ZI_OK);
    char *buf = NULL;
    size_t len = 0;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &err), ZI_OK);
    msgpack_unpacked u;
    assert_int_equal(zi_msgpack_parse(buf, len, NULL, &u, &err), ZI_OK);
    uint64_t k = prefix_key(rt, &u.data, "m");
    msgpack_unpacked_destroy(&u);
    free(buf);
    zi_text_context_free(&c);
    return k;
}

static void test_prefix_block_size(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    assert_int_equal(worker_block_size(&s.rt), 16); /* before any heartbeat */
    /* 50 tokens: whole 16-blocks short of the last token = 48 tokens. */
    assert_int_not_equal(key_of(&s.rt, 50, 0, 0), 0);
    assert_int_not_equal(key_of(&s.rt, 50, 0, 0), key_of(&s.rt, 50, 40, 999));
    assert_int_equal(key_of(&s.rt, 16, 0, 0), 0); /* no whole block before the last token */
    assert_int_not_equal(key_of(&s.rt, 17, 0, 0), 0);
    heartbeat(&s, "wrk0", 32);
    assert_int_equal(worker_block_size(&s.rt), 32);
    /* With 32-token blocks the key covers 32 tokens: token 40 is past it. */
    assert_int_equal(key_of(&s.rt, 50, 0, 0), key_of(&s.rt, 50, 40, 999));
    assert_int_not_equal(key_of(&s.rt, 50, 0, 0), key_of(&s.rt, 50, 20, 999));
    assert_int_equal(key_of(&s.rt, 32, 0, 0), 0);
    heartbeat(&s, "wrk0", 1 << 30); /* not a block size: ignored */
    assert_int_equal(worker_block_size(&s.rt), 16);
    sim_free(&s);
}

/* A generate request with an n-token prompt (ids 1..n) encoded: the
 * worker it starts on (its name, in *wrk) and its rid. */
static int64_t start_on(sim *s, const char *client, const char *id, size_t n, char *wrk) {
    size_t from = s->n_out;
    generate(s, client, id, (gen_opts){0});
    int64_t rid = last_rid(s, "tok0", "encode");
    encoded(s, "tok0", rid, n);
    int f = -1;
    for (size_t i = from; i < s->n_out && f < 0; i++)
        if (s->out[i].side == ZI_ROUTER_BACKEND && !strcmp(parse_sent(&s->out[i]).kind, "start"))
            f = (int)i;
    assert_true(f >= 0);
    assert_int_equal(parse_sent(&s->out[f]).rid, rid);
    strcpy(wrk, s->out[f].ident);
    return rid;
}

/* Prefix affinity with disk tiers: wA and wB share directory tier 0xA
 * (one id), wC has its own. A prefix wA took is warm on wB once wA is
 * gone (its files outlive it): wB gets it over wC, which the load alone
 * would pick (it registered first). Then the prefix is in wB's memory,
 * and wB beats wD, a new worker on tier 0xA that comes first among the
 * least loaded. A memory-warm worker more than two requests busier than
 * the least loaded one is passed over for a disk-warm one within two. */
static void test_affinity_disk_tier(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    reg(&s, "tok0", false, 8);
    reg_disk(&s, "wA", 0xA, "/kv/shared");
    reg_disk(&s, "wC", 0xC, "/kv/own");
    reg_disk(&s, "wB", 0xA, "/mnt/kv-shared");
    char w[32];
    int64_t rid = start_on(&s, "c1", "a", 50, w);
    assert_string_equal(w, "wA"); /* all idle: the first */
    finish(&s, "tok0", "wA", rid);
    /* a short prompt has no prefix key: it goes by load alone */
    rid = start_on(&s, "c1", "b", 10, w);
    assert_string_equal(w, "wA");
    finish(&s, "tok0", "wA", rid);
    zi_router_backend_gone(&s.rt, conn_of("wA"));
    check_idle(&s);

    rid = start_on(&s, "c1", "c", 50, w);
    assert_string_equal(w, "wB"); /* disk-warm beats cold */
    finish(&s, "tok0", "wB", rid);
    rid = start_on(&s, "c1", "d", 40, w); /* another prefix: cold everywhere */
    assert_string_equal(w, "wC");
    finish(&s, "tok0", "wC", rid);

    reg_disk(&s, "wD", 0xA, "/kv/shared"); /* takes wA's place, first in the table */
    assert_int_equal(s.rt.be[1].disk, 0xA);
    rid = start_on(&s, "c1", "e", 50, w);
    assert_string_equal(w, "wB"); /* memory-warm beats disk-warm */
    finish(&s, "tok0", "wB", rid);

    /* wB busy with 3 requests of the prefix (memory affinity keeps them
     * there: each is within two of the idle ones), wD with a cold one */
    int64_t busy[3];
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "f%d", i);
        busy[i] = start_on(&s, "c1", id, 50, w);
        assert_string_equal(w, "wB");
    }
    int64_t cold = start_on(&s, "c1", "h", 10, w);
    assert_string_equal(w, "wD");
    /* wB is more than two busier than the idle wC: the prefix goes to
     * the disk-warm wD (one running), not to the cold, idle wC */
    rid = start_on(&s, "c1", "g", 50, w);
    assert_string_equal(w, "wD");
    finish(&s, "tok0", "wD", rid);
    finish(&s, "tok0", "wD", cold);
    for (int i = 0; i < 3; i++) finish(&s, "tok0", "wB", busy[i]);
    check_idle(&s);
    sim_free(&s);
}

/* Prefix affinity after a router restart: the new router's table is
 * empty, and the workers' registers refill it ("prefix_keys"). wA took a
 * prefix before the restart; after it wB registers first (the load alone
 * would pick it), then wA with the key: the prefix goes to wA, another one
 * to wB. Keys that are not keys (even, 0) are passed over. */
static void test_affinity_after_restart(void **state) {
    (void)state;
    sim s;
    sim_init(&s);
    reg(&s, "tok0", false, 8);
    reg(&s, "wA", true, 4);
    reg(&s, "wB", true, 4);
    char w[32];
    int64_t rid = start_on(&s, "c1", "a", 50, w);
    assert_string_equal(w, "wA");
    const rreq *r = zi_req_table_get(&s.rt.reqs, (uint64_t)rid);
    assert_non_null(r);
    const uint64_t key = r->prefix_key;
    assert_true(key & 1);
    finish(&s, "tok0", "wA", rid);
    sim_free(&s);

    sim_init(&s); /* the restarted router */
    reg(&s, "tok0", false, 8);
    reg(&s, "wB", true, 4);
    zi_msg m;
    const uint64_t keys[] = {0, 42, key};
    zi_im_register ra = {.worker = true,
                         .slots = 4,
                         .max_length = 2048,
                         .vocab = 1000,
                         .model = {"m", 1},
                         .prefix_keys = keys,
                         .n_prefix_keys = 3};
    assert_int_equal(zi_im_register_pack(&ra, &m), ZI_OK);
    from_backend(&s, "wA", &m);
    rid = start_on(&s, "c1", "a2", 50, w);
    assert_string_equal(w, "wA"); /* warm, though wB comes first */
    finish(&s, "tok0", "wA", rid);
    rid = start_on(&s, "c1", "d", 40, w); /* another prefix: by load */
    assert_string_equal(w, "wB");
    finish(&s, "tok0", "wB", rid);
    check_idle(&s);
    sim_free(&s);
}

/* A register's disk tier survives the wire, and one that names no
 * valid id is no disk tier. */
static void test_register_disk_tier(void **state) {
    (void)state;
    zi_msg m;
    zi_im_register r = {.worker = true,
                        .slots = 2,
                        .max_length = 512,
                        .model = {"m", 1},
                        .kv_disk_dir = {"/d", 2},
                        .kv_disk_id = 0x8000000000000001ULL,
                        .prefix_keys = (const uint64_t[]){0x11, 0xF000000000000001ULL},
                        .n_prefix_keys = 2};
    assert_int_equal(zi_im_register_pack(&r, &m), ZI_OK);
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(m.sb.data, m.sb.size, NULL, &u, &err), ZI_OK);
    zi_im_register got;
    zi_im_register_unpack(&u.data, &got);
    assert_true(got.kv_disk_id == 0x8000000000000001ULL);
    assert_int_equal(got.kv_disk_dir.n, 2);
    assert_memory_equal(got.kv_disk_dir.p, "/d", 2);
    /* the prefix keys, oldest first */
    assert_non_null(got.prefix_keys_obj);
    assert_int_equal(got.prefix_keys_obj->via.array.size, 2);
    assert_true(got.prefix_keys_obj->via.array.ptr[0].via.u64 == 0x11);
    assert_true(got.prefix_keys_obj->via.array.ptr[1].via.u64 == 0xF000000000000001ULL);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* a bad id: none */
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "type", "register");
    zi_imap_str(&b, "role", "worker");
    zi_imap kd;
    zi_imap_init(&kd);
    zi_imap_str(&kd, "dir", "/d");
    zi_imap_str(&kd, "id", "00000000000000xz");
    zi_imap_map(&b, "kv_disk", &kd);
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(&b, &m.pk), ZI_OK);
    assert_int_equal(zi_msgpack_parse(m.sb.data, m.sb.size, NULL, &u, &err), ZI_OK);
    zi_im_register_unpack(&u.data, &got);
    assert_true(got.kv_disk_id == 0);
    assert_null(got.kv_disk_dir.p);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

/* ---- router restart (router_restart.c) ------------------------------------ */

/* The bytes of the last "start" message sent to ident for rid (malloc'd). */
static char *start_bytes(const sim *s, const char *ident, int64_t rid, size_t *len) {
    for (size_t i = s->n_out; i-- > 0;) {
        if (strcmp(s->out[i].ident, ident)) continue;
        parsed p = parse_sent(&s->out[i]);
        if (strcmp(p.kind, "start") || p.rid != rid) continue;
        char *b = malloc(s->out[i].len);
        assert_non_null(b);
        memcpy(b, s->out[i].data, s->out[i].len);
        *len = s->out[i].len;
        return b;
    }
    fail_msg("no start for rid %lld", (long long)rid);
    return NULL;
}

/* A worker registers again with the sequences it holds. */
static void reg_live(sim *s, const char *ident, const zi_im_live *live, size_t n) {
    zi_msg m;
    zi_im_register r = {.worker = true,
                        .slots = 4,
                        .max_length = 2048,
                        .vocab = 1000,
                        .model = {"m", 1},
                        .live = live,
                        .n_live = n};
    assert_int_equal(zi_im_register_pack(&r, &m), ZI_OK);
    from_backend(s, ident, &m);
}

static void resume(sim *s, const char *client, const char *id, int64_t held) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "resume");
    zi_imap_str(&b, "id", id);
    zi_imap_int(&b, "tokens", held);
    from_client_imap(s, client, &b);
}

/* The token ids of frame i (a decode's "token_ids", an encode's "replay";
 * -1 when absent). */
static int ids_of(const sim *s, int i, const char *key, int32_t *out, size_t cap) {
    msgpack_unpacked u;
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(s->out[i].data, s->out[i].len, NULL, &u, &err), ZI_OK);
    const msgpack_object *v = zi_map_get(&u.data, key);
    int n = -1;
    if (v) {
        zi_codec_limits lim = zi_codec_limits_default();
        int32_t *ids = NULL;
        size_t k = 0;
        assert_int_equal(zi_codec_decode_tokens(v, &lim, key, &ids, &k, &err), ZI_OK);
        for (size_t j = 0; j < k && j < cap; j++) out[j] = ids[j];
        n = (int)k;
        free(ids);
    }
    msgpack_unpacked_destroy(&u);
    return n;
}

static void test_router_restart(void **state) {
    (void)state;
    /* The old router: a streamed request whose client got 2 tokens, a
     * non-streamed one, one with log probabilities (no note: not taken
     * over), one never resumed. */
    sim *old = malloc(sizeof *old);
    assert_non_null(old);
    sim_up(old);
    reg(old, "wrk0", true, 4);
    int64_t ra = run_one(old, "c1", "a", (gen_opts){0});
    int64_t rb = run_one(old, "c1", "b", (gen_opts){.no_stream = true});
    int64_t rc = run_one(old, "c2", "c", (gen_opts){0});
    const int32_t a1[] = {5, 6};
    tokens(old, "wrk0", ra, a1, 2, "active");
    decoded(old, "tok0", ra, "ab", a1, 2, "active");
    assert_int_equal(count_sent(old, "c1", "chunk"), 1);
    size_t la, lb, lc;
    char *sa = start_bytes(old, "wrk0", ra, &la), *sb = start_bytes(old, "wrk0", rb, &lb);
    char *sc = start_bytes(old, "wrk0", rc, &lc);
    /* the old router's own sequence, handed back after it declared the
     * worker dead, is cancelled (it ran on elsewhere) */
    const int32_t g[] = {5, 6, 7, 8}, gb[] = {9};
    zi_im_live mine = {.rid = ra,
                       .start = sa,
                       .start_len = la,
                       .token_ids = {.set = true, .v = g, .n = 4},
                       .status = {"active", 6}};
    sim_clear(old);
    reg_live(old, "wrk9", &mine, 1);
    assert_int_equal(count_sent(old, "wrk9", "cancel"), 1);

    /* The new router (another epoch): the workers hand back what they
     * hold. */
    sim *s = malloc(sizeof *s);
    assert_non_null(s);
    sim_init(s);
    assert_true(s->rt.epoch != old->rt.epoch);
    sim_free(old);
    free(old);
    reg(s, "tok0", false, 1);
    resume(s, "c1", "b", 0); /* before its worker's register: it waits */
    assert_int_equal(count_sent(s, "c1", "error"), 0);
    zi_im_live la_[] = {{.rid = rb,
                         .start = sb,
                         .start_len = lb,
                         .token_ids = {.set = true, .v = gb, .n = 1},
                         .status = {"maximum_length", 14}},
                        {.rid = ra,
                         .start = sa,
                         .start_len = la,
                         .token_ids = {.set = true, .v = g, .n = 4},
                         .status = {"active", 6}},
                        {.rid = rc,
                         .start = sc,
                         .start_len = lc,
                         .token_ids = {.set = true, .v = g, .n = 1},
                         .status = {"active", 6}},
                        {.rid = 424242,
                         .start = sa,
                         .start_len = la, /* rid mismatch */
                         .token_ids = {.set = true, .v = g, .n = 0},
                         .status = {"active", 6}}};
    reg_live(s, "wrk0", la_, 4);
    assert_int_equal(count_sent(s, "wrk0", "cancel"), 1); /* 424242: not its start */
    /* a second register (reregisters to several queued messages) changes
     * nothing: what it took over stays, nothing more is cancelled */
    reg_live(s, "wrk0", la_, 3);
    assert_int_equal(count_sent(s, "wrk0", "cancel"), 1);
    assert_int_equal(zi_req_table_count(&s->rt.reqs), 3);
    assert_true(s->rt.next_rid >= (uint64_t)rc); /* new ids never meet the ones taken over */
    assert_int_equal(s->rt.be[1].assigned, 2);   /* a and c run on wrk0; b had ended */
    check_ok(s);
    /* b's resume (it came first): replay nothing, decode [9], final */
    int e = find_sent(s, 0, "tok0", "encode");
    assert_true(e >= 0);
    int32_t ids[8];
    assert_int_equal(ids_of(s, e, "replay", ids, 8), 0);
    int d = find_sent(s, (size_t)e, "tok0", "decode");
    assert_int_equal(ids_of(s, d, "token_ids", ids, 8), 1);
    assert_int_equal(ids[0], 9);
    assert_string_equal(parse_sent(&s->out[d]).status, "maximum_length");
    decoded(s, "tok0", rb, "xyz", gb, 1, "maximum_length");
    int f = find_sent(s, 0, "c1", "final");
    assert_true(f >= 0);
    assert_string_equal(parse_sent(&s->out[f]).text, "xyz");
    /* a: the client holds 2 of the 4; a token arrives before its resume */
    const int32_t a3[] = {10};
    tokens(s, "wrk0", ra, a3, 1, "active");
    assert_int_equal(count_sent(s, "c1", "chunk"), 0);
    sim_clear(s);
    resume(s, "c1", "a", 2);
    e = find_sent(s, 0, "tok0", "encode");
    assert_int_equal(ids_of(s, e, "replay", ids, 8), 2);
    assert_int_equal(ids[0], 5);
    assert_int_equal(ids[1], 6);
    d = find_sent(s, (size_t)e, "tok0", "decode");
    assert_int_equal(ids_of(s, d, "token_ids", ids, 8), 2);
    assert_int_equal(ids[0], 7);
    assert_int_equal(ids[1], 8);
    int d2 = find_sent(s, (size_t)d + 1, "tok0", "decode");
    assert_int_equal(ids_of(s, d2, "token_ids", ids, 8), 1);
    assert_int_equal(ids[0], 10);
    const int32_t a2[] = {7, 8};
    decoded(s, "tok0", ra, "cd", a2, 2, "active");
    f = find_sent(s, 0, "c1", "chunk");
    assert_true(parse_sent(&s->out[f]).resumed);
    decoded(s, "tok0", ra, "e", a3, 1, "active");
    const int32_t a4[] = {11};
    tokens(s, "wrk0", ra, a4, 0, "end_of_sequence");
    decoded(s, "tok0", ra, "", a4, 0, "end_of_sequence");
    assert_int_equal(count_sent(s, "c1", "chunk"), 2);
    assert_string_equal(parse_sent(&s->out[find_sent(s, 0, "c1", "final")]).status,
                        "end_of_sequence");
    /* an id no worker reported: answered once the workers had their time */
    resume(s, "c1", "zz", 0);
    assert_int_equal(count_sent(s, "c1", "error"), 0);
    s->now += s->rt.hb_timeout;
    heartbeat(s, "tok0", 0);
    heartbeat(s, "wrk0", 16);
    zi_router_tick(&s->rt);
    assert_int_equal(count_sent(s, "c1", "error"), 1);
    resume(s, "c1", "zz2", 0); /* later: at once */
    assert_int_equal(count_sent(s, "c1", "error"), 2);
    /* c's client never comes back: dropped after the grace, its slot freed */
    s->now += s->rt.resume_grace;
    heartbeat(s, "tok0", 0);
    heartbeat(s, "wrk0", 16);
    zi_router_tick(&s->rt);
    assert_int_equal(count_sent(s, "wrk0", "cancel"), 1); /* (the earlier one was cleared) */
    assert_int_equal(count_sent(s, "c2", "final") + count_sent(s, "c2", "error"), 0);
    check_idle(s);
    sim_free(s);
    free(s);
    free(sa);
    free(sb);
    free(sc);
}

static void test_check_catches_drift(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    run_one(&s, "c1", "a", (gen_opts){0});
    check_ok(&s);
    zi_error err = {0};
    s.rt.be[1].assigned++;
    assert_int_equal(zi_router_check(&s.rt, &err), ZI_EINVAL);
    s.rt.be[1].assigned--;
    s.rt.n_waiting++;
    assert_int_equal(zi_router_check(&s.rt, &err), ZI_EINVAL);
    s.rt.n_waiting--;
    check_ok(&s);
    sim_free(&s);
}

/* ---- randomized interleavings ------------------------------------------------ */

static uint64_t rng_next(uint64_t *st) { /* splitmix64 */
    uint64_t z = (*st += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static int rnd(uint64_t *st, int n) {
    return (int)(rng_next(st) % (uint64_t)n);
}

#define MAX_BE 16
#define MAX_CL 16
#define MAX_REQ 512
#define MAX_INBOX 256

/* A message the router sent a simulated backend, kept in its inbox. */
typedef struct job {
    char type[16];
    int64_t rid;
    int32_t ids[8];
    size_t n_ids;
    char status[24];
    bool replay;
} job;

typedef struct live {
    int64_t rid;
    int made, limit; /* tokens made, and after how many it ends */
    bool embed;
} live;

typedef struct be_sim {
    char ident[16];
    bool worker, alive; /* alive: in the simulation (not necessarily to the router) */
    bool silent;        /* hung: no heartbeats, answers nothing */
    job inbox[MAX_INBOX];
    int n_in;
    live lv[MAX_INBOX];
    int n_lv;
} be_sim;

typedef struct req_rec {
    int client;
    bool terminal_seen, after_terminal;
    int terminals;
} req_rec;

typedef struct world {
    sim s;
    uint64_t rng;
    be_sim be[MAX_BE];
    int n_be, n_made_be;
    char client[MAX_CL][16];
    bool client_gone[MAX_CL], client_evented[MAX_CL];
    int n_cl;
    req_rec req[MAX_REQ];
    int n_req;
    size_t seen; /* frames of s.out handled */
    int violations;
    char why[160];
} world;

static void violation(world *w, const char *what, int r) {
    if (!w->violations++) snprintf(w->why, sizeof w->why, "%s (request r%d)", what, r);
}

static be_sim *be_named(world *w, const char *ident) {
    for (int i = 0; i < w->n_be; i++)
        if (!strcmp(w->be[i].ident, ident)) return &w->be[i];
    return NULL;
}

/* Reads the token ids of a decode message. */
static void read_ids(const msgpack_object *o, job *j) {
    zi_codec_limits lim = zi_codec_limits_default();
    const msgpack_object *t = zi_map_get(o, "token_ids");
    int32_t *v = NULL;
    size_t n = 0;
    j->n_ids = 0;
    if (t && zi_codec_decode_tokens(t, &lim, "token_ids", &v, &n, NULL) == ZI_OK)
        for (size_t i = 0; i < n && i < 8; i++) j->ids[j->n_ids++] = v[i];
    free(v);
}

/* Hands every new frame of the outbox to its simulated peer. */
static void route(world *w) {
    for (; w->seen < w->s.n_out; w->seen++) {
        sent *f = &w->s.out[w->seen];
        if (f->side == ZI_ROUTER_BACKEND) {
            be_sim *b = be_named(w, f->ident);
            if (!b || !b->alive || b->silent) continue; /* lost on the way */
            if (b->n_in == MAX_INBOX) continue;
            msgpack_unpacked u;
            zi_error err = {0};
            assert_int_equal(zi_msgpack_parse(f->data, f->len, NULL, &u, &err), ZI_OK);
            job *j = &b->inbox[b->n_in++];
            memset(j, 0, sizeof *j);
            copy_str(&u.data, "type", j->type, sizeof j->type);
            copy_str(&u.data, "status", j->status, sizeof j->status);
            const msgpack_object *v = zi_map_get(&u.data, "rid");
            j->rid = v && v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)v->via.u64 : 0;
            j->replay = zi_map_get(&u.data, "replay") != NULL;
            if (!strcmp(j->type, "decode")) read_ids(&u.data, j);
            msgpack_unpacked_destroy(&u);
            continue;
        }
        parsed p = parse_sent(f);
        if (p.id[0] != 'r') continue; /* health and the like */
        int r = atoi(p.id + 1);
        assert_true(r >= 0 && r < w->n_req);
        req_rec *q = &w->req[r];
        int cl = -1;
        for (int i = 0; i < w->n_cl; i++)
            if (!strcmp(w->client[i], f->ident)) cl = i;
        assert_int_equal(cl, q->client);
        if (w->client_evented[cl]) violation(w, "a frame to a client after its disconnect", r);
        if (q->terminal_seen) violation(w, "a frame after the terminal frame", r);
        if (!strcmp(p.kind, "final") || !strcmp(p.kind, "error") || !strcmp(p.kind, "result")) {
            q->terminal_seen = true;
            q->terminals++;
        }
    }
}

static void be_add(world *w, bool worker) {
    if (w->n_be == MAX_BE) return;
    be_sim *b = &w->be[w->n_be++];
    memset(b, 0, sizeof *b);
    snprintf(b->ident, sizeof b->ident, "%s%d", worker ? "w" : "t", w->n_made_be++);
    b->worker = worker;
    b->alive = true;
    reg(&w->s, b->ident, worker, 1 + rnd(&w->rng, 3));
}

static int count_be(const world *w, bool worker) {
    int n = 0;
    for (int i = 0; i < w->n_be; i++) n += w->be[i].alive && w->be[i].worker == worker;
    return n;
}

static void be_remove(world *w, int i) {
    w->be[i] = w->be[--w->n_be];
}

/* A simulated backend handles the oldest message in its inbox, or (a
 * worker) makes tokens for one of its live requests. */
static void be_act(world *w, be_sim *b) {
    sim *s = &w->s;
    bool from_inbox = b->n_in > 0 && (!b->worker || b->n_lv == 0 || rnd(&w->rng, 2));
    if (from_inbox) {
        job j = b->inbox[0];
        memmove(b->inbox, b->inbox + 1, (size_t)(b->n_in - 1) * sizeof *b->inbox);
        b->n_in--;
        bool fail = rnd(&w->rng, 40) == 0;
        if (!strcmp(j.type, "start") || !strcmp(j.type, "embed")) {
            if (fail) {
                backend_error(s, b->ident, j.rid, "internal");
            } else if (b->n_lv < MAX_INBOX) {
                b->lv[b->n_lv++] = (live){j.rid, 0, 1 + rnd(&w->rng, 5), j.type[1] == 'm'};
            }
        } else if (!strcmp(j.type, "cancel")) {
            for (int i = 0; i < b->n_lv; i++)
                if (b->lv[i].rid == j.rid) b->lv[i--] = b->lv[--b->n_lv];
        } else if (!strcmp(j.type, "encode")) {
            if (j.replay) return; /* the decode state is rebuilt, nothing is sent */
            if (fail)
                backend_error(s, b->ident, j.rid, "invalid_request");
            else
                encoded(s, b->ident, j.rid, 1 + (size_t)rnd(&w->rng, 40));
        } else if (!strcmp(j.type, "decode")) {
            /* Now and then a stop string ends it early. */
            const char *st = !strcmp(j.status, "active") && rnd(&w->rng, 10) == 0 ? "stop" : j.status;
            decoded(s, b->ident, j.rid, j.n_ids ? "x" : "", j.ids, j.n_ids, st);
        } else if (!strcmp(j.type, "tokenize")) {
            const int32_t ids[] = {1};
            zi_msg m;
            zi_im_tokenized_pack(
                &(zi_im_util_reply){.rid = j.rid, .token_ids = {.set = true, .v = ids, .n = 1}}, &m);
            from_backend(s, b->ident, &m);
        } else if (!strcmp(j.type, "detokenize")) {
            zi_msg m;
            zi_im_detokenized_pack(&(zi_im_util_reply){.rid = j.rid, .text = {"a", 1}}, &m);
            from_backend(s, b->ident, &m);
        } else if (!strcmp(j.type, "embed_encode")) {
            if (fail)
                backend_error(s, b->ident, j.rid, "invalid_request");
            else
                embed_encoded(s, b->ident, j.rid);
        }
        return;
    }
    if (!b->worker || b->n_lv == 0) return;
    int i = rnd(&w->rng, b->n_lv);
    live *l = &b->lv[i];
    int64_t rid = l->rid;
    if (l->embed) {
        b->lv[i] = b->lv[--b->n_lv];
        embedded(s, b->ident, rid);
        return;
    }
    int32_t ids[2] = {10 + l->made, 11 + l->made};
    int n = 1 + rnd(&w->rng, 2);
    l->made += n;
    bool done = l->made >= l->limit;
    if (done) b->lv[i] = b->lv[--b->n_lv];
    tokens(s, b->ident, rid, ids, (size_t)n, done ? (rnd(&w->rng, 2) ? "end_of_sequence" : "maximum_length") : "active");
}

static void new_request(world *w) {
    if (w->n_req == MAX_REQ) return;
    int cl = rnd(&w->rng, w->n_cl);
    if (w->client_gone[cl]) return;
    int r = w->n_req++;
    w->req[r] = (req_rec){.client = cl};
    char id[16];
    snprintf(id, sizeof id, "r%d", r);
    int k = rnd(&w->rng, 10);
    if (k < 6)
        generate(&w->s, w->client[cl], id,
                 (gen_opts){.no_stream = rnd(&w->rng, 3) == 0,
                            .timeout_ms = rnd(&w->rng, 3) == 0 ? 200 + rnd(&w->rng, 3000) : 0});
    else if (k == 6)
        client_op(&w->s, w->client[cl], id, "tokenize");
    else if (k == 7)
        client_op(&w->s, w->client[cl], id, "detokenize");
    else
        client_op(&w->s, w->client[cl], id, "embed");
}

/* Heartbeats from every backend that is not silent, then the tick. */
static void tick(world *w, int64_t dt) {
    w->s.now += dt;
    for (int i = 0; i < w->n_be; i++)
        if (w->be[i].alive && !w->be[i].silent)
            heartbeat(&w->s, w->be[i].ident, w->be[i].worker ? 16 : 0);
    zi_router_tick(&w->s.rt);
}

static void step(world *w) {
    sim *s = &w->s;
    int a = rnd(&w->rng, 100);
    if (a < 20) {
        new_request(w);
    } else if (a < 70) {
        if (w->n_be) {
            be_sim *b = &w->be[rnd(&w->rng, w->n_be)];
            if (b->alive && !b->silent) be_act(w, b);
        }
    } else if (a < 76) {
        if (w->n_req) { /* a client cancels one of its requests (maybe long over) */
            int r = rnd(&w->rng, w->n_req);
            char id[16];
            snprintf(id, sizeof id, "r%d", r);
            if (!w->client_gone[w->req[r].client]) client_op(s, w->client[w->req[r].client], id, "cancel");
        }
    } else if (a < 86) {
        tick(w, rnd(&w->rng, 400));
    } else if (a < 89) { /* a backend's connection closes */
        if (w->n_be) {
            int i = rnd(&w->rng, w->n_be);
            zi_router_backend_gone(&s->rt, conn_of(w->be[i].ident));
            be_remove(w, i);
        }
    } else if (a < 91) { /* a backend hangs: only missed heartbeats tell */
        if (w->n_be) w->be[rnd(&w->rng, w->n_be)].silent = true;
    } else if (a < 96) { /* a new backend */
        be_add(w, rnd(&w->rng, 2));
    } else if (a < 98) { /* a client's connection closes: the monitor says so, or not */
        int cl = rnd(&w->rng, w->n_cl);
        if (!w->client_gone[cl]) {
            w->client_gone[cl] = true;
            memcpy(s->gone[s->n_gone++], w->client[cl], sizeof w->client[cl]);
            if (rnd(&w->rng, 4)) {
                w->client_evented[cl] = true;
                zi_router_client_gone(&s->rt, conn_of(w->client[cl]));
            }
        }
        if (w->n_cl < MAX_CL && s->n_gone < MAX_GONE) { /* someone else connects */
            snprintf(w->client[w->n_cl], 16, "c%d", w->n_cl);
            w->n_cl++;
        }
    } else {
        zi_imap b;
        zi_imap_init(&b);
        zi_imap_str(&b, "op", rnd(&w->rng, 2) ? "health" : "metrics");
        zi_imap_str(&b, "id", "h");
        from_client_imap(s, w->client[0], &b);
    }
    route(w);
}

/* ---- dispatch cost with a long queue ------------------------------------ */

/* Seconds on the monotonic clock. */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* nq requests of model a queued behind a's one full worker, then n_ev
 * heartbeats from b's worker (each event runs dispatch): the seconds the
 * heartbeats took. */
static double queued_events_s(size_t nq, int n_ev) {
    sim s;
    sim_init(&s);
    zi_error err = {0};
    assert_int_equal(zi_router_add_model(&s.rt, "a", &err), ZI_OK);
    assert_int_equal(zi_router_add_model(&s.rt, "b", &err), ZI_OK);
    s.rt.max_queue = 1 << 20;
    reg_model(&s, "tokA", false, 1, "a");
    reg_model(&s, "wrkA", true, 1, "a");
    reg_model(&s, "tokB", false, 1, "b");
    reg_model(&s, "wrkB", true, 1, "b");
    for (size_t i = 0; i <= nq; i++) { /* the first one takes wrkA's slot */
        char id[32];
        snprintf(id, sizeof id, "q%zu", i);
        generate_model(&s, "c1", id, "a");
        encoded(&s, "tokA", (int64_t)s.rt.next_rid, 20);
        if (s.n_out > 4096) sim_clear(&s);
    }
    assert_int_equal(s.rt.q_len, nq);
    double t0 = mono_s();
    for (int i = 0; i < n_ev; i++) heartbeat(&s, "wrkB", 16);
    double t = mono_s() - t0;
    assert_int_equal(s.rt.q_len, nq);
    check_ok(&s);
    sim_free(&s);
    return t;
}

/* With every worker of a model full, an event costs the same whatever
 * the length of that model's queue: dispatch looks at each model's oldest
 * request only (before, it walked the whole queue on every event). */
static void test_dispatch_long_queue(void **state) {
    (void)state;
#ifndef NDEBUG
    skip(); /* a timing: release build only (debug builds check every counter after each event) */
#endif
    if (getenv("ZINFER_SANITIZED")) skip();
    const int n_ev = 10000;
    double small = queued_events_s(10, n_ev), large = queued_events_s(10000, n_ev);
    fprintf(stderr, "dispatch: %d events with 10 queued %.2f us each, with 10000 queued %.2f us\n",
            n_ev, small / n_ev * 1e6, large / n_ev * 1e6);
    /* O(queue) per event made it ~100x (6 us -> 534 us an event, walking
     * 10,000 queued requests each time); 5x leaves room for a loaded host */
    assert_true(large < 5 * small + 0.05);
}

/* Lets everything finish: live backends of both kinds, every inbox
 * answered, time past every deadline and failover timeout. */
static void drain(world *w) {
    for (int i = 0; i < w->n_be; i++)
        if (w->be[i].silent) { /* the silent ones die by heartbeat */
            be_remove(w, i--);
        }
    tick(w, w->s.rt.hb_timeout + 1);
    route(w);
    if (!count_be(w, true)) be_add(w, true);
    if (!count_be(w, false)) be_add(w, false);
    route(w);
    for (int round = 0; round < 100000; round++) {
        bool busy = false;
        for (int i = 0; i < w->n_be; i++) {
            be_sim *b = &w->be[i];
            if (b->n_in || b->n_lv) {
                busy = true;
                be_act(w, b);
                route(w);
            }
        }
        if (!busy) {
            if (!zi_req_table_count(&w->s.rt.reqs)) break;
            tick(w, 1000); /* what waits on time: deadlines, failover */
            route(w);
        }
    }
}

static void run_world(uint64_t seed, int steps) {
    world *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->rng = seed;
    sim_init(&w->s);
    w->s.rt.hb_timeout = 1000;
    w->s.rt.failover_timeout = 3000;
    w->s.rt.max_queue = 64;
    w->n_cl = 3;
    for (int i = 0; i < w->n_cl; i++) snprintf(w->client[i], 16, "c%d", i);
    be_add(w, false);
    be_add(w, true);
    route(w);
    for (int k = 0; k < steps; k++) step(w);
    drain(w);
    zi_error err = {0};
    int rc = zi_router_check(&w->s.rt, &err);
    if (rc) fprintf(stderr, "seed %llu: %s\n", (unsigned long long)seed, err.msg);
    assert_int_equal(rc, ZI_OK);
    if (w->violations) fprintf(stderr, "seed %llu: %s\n", (unsigned long long)seed, w->why);
    assert_int_equal(w->violations, 0);
    for (size_t i = 0; i < w->s.rt.reqs.cap; i++) {
        const rreq *r = w->s.rt.reqs.slots[i].key ? w->s.rt.reqs.slots[i].val : NULL;
        if (r)
            fprintf(stderr, "seed %llu: request %s (rid %llu) left: kind %d phase %d link %d "
                            "tok %d wrk %d\n",
                    (unsigned long long)seed, r->id, (unsigned long long)r->rid, r->kind,
                    r->state, r->tlink, r->tok, r->wrk);
    }
    if (zi_req_table_count(&w->s.rt.reqs))
        for (size_t i = 0; i < w->s.rt.n_be; i++)
            fprintf(stderr, "  backend %zu %s: role %d alive %d slots %d assigned %d\n", i,
                    w->s.rt.be[i].ident, w->s.rt.be[i].role, w->s.rt.be[i].alive,
                    w->s.rt.be[i].slots, w->s.rt.be[i].assigned);
    assert_int_equal(zi_req_table_count(&w->s.rt.reqs), 0);
    assert_int_equal(w->s.rt.n_waiting, 0);
    assert_int_equal(w->s.rt.q_len, 0);
    for (size_t i = 0; i < w->s.rt.n_be; i++) assert_int_equal(w->s.rt.be[i].assigned, 0);
    /* Every request ended with one terminal frame, or none when its client
     * left (then at most one, sent before it left). */
    for (int r = 0; r < w->n_req; r++) {
        const req_rec *q = &w->req[r];
        if (q->terminals != 1 && !(w->client_gone[q->client] && q->terminals == 0)) {
            fprintf(stderr, "seed %llu: request r%d got %d terminal frames\n",
                    (unsigned long long)seed, r, q->terminals);
            fail();
        }
    }
    if (getenv("ZI_ROUTER_CORE_STATS")) {
        const zi_im_metrics *m = &w->s.rt.metrics;
        int resumed = 0;
        for (size_t i = 0; i < w->s.n_out; i++)
            if (w->s.out[i].side == ZI_ROUTER_CLIENT && parse_sent(&w->s.out[i]).resumed) resumed++;
        fprintf(stderr, "seed %llu: %d requests, %d backends; finished eos %lld len %lld stop %lld "
                "cancelled %lld deadline %lld error %lld; %d resumed chunks\n",
                (unsigned long long)seed, w->n_req, w->n_made_be,
                (long long)m->finished[ZI_IM_FIN_EOS], (long long)m->finished[ZI_IM_FIN_LENGTH],
                (long long)m->finished[ZI_IM_FIN_STOP], (long long)m->finished[ZI_IM_FIN_CANCELLED],
                (long long)m->finished[ZI_IM_FIN_DEADLINE], (long long)m->finished[ZI_IM_FIN_ERROR],
                resumed);
    }
    sim_free(&w->s);
    free(w);
}

static void test_random_interleavings(void **state) {
    (void)state;
    const char *env = getenv("ZI_ROUTER_CORE_RUNS");
    int runs = env ? atoi(env) : 4000;
    for (int i = 0; i < runs; i++) run_world(0x5eed0000ULL + (uint64_t)i, 150 + (i % 7) * 50);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_generate_streamed),
        cmocka_unit_test(test_generate_not_streamed),
        cmocka_unit_test(test_stop_string_cancels_worker),
        cmocka_unit_test(test_tokenize_detokenize),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_cancel_running),
        cmocka_unit_test(test_cancel_decoding),
        cmocka_unit_test(test_cancel_queued),
        cmocka_unit_test(test_deadline),
        cmocka_unit_test(test_client_disconnect),
        cmocka_unit_test(test_client_unreachable),
        cmocka_unit_test(test_backend_error),
        cmocka_unit_test(test_worker_failover),
        cmocka_unit_test(test_model_routing),
        cmocka_unit_test(test_load_on_demand),
        cmocka_unit_test(test_load_on_demand_context),
        cmocka_unit_test(test_load_unload_wishes),
        cmocka_unit_test(test_model_queue_bound_and_failed_load),
        cmocka_unit_test(test_worker_lost),
        cmocka_unit_test(test_heartbeat_timeout),
        cmocka_unit_test(test_reregister_once),
        cmocka_unit_test(test_tokenizer_failover),
        cmocka_unit_test(test_util_tokenizer_dies),
        cmocka_unit_test(test_shutdown_ends_all),
        cmocka_unit_test(test_prefix_block_size),
        cmocka_unit_test(test_affinity_disk_tier),
        cmocka_unit_test(test_register_disk_tier),
        cmocka_unit_test(test_affinity_after_restart),
        cmocka_unit_test(test_router_restart),
        cmocka_unit_test(test_check_catches_drift),
        cmocka_unit_test(test_dispatch_long_queue),
        cmocka_unit_test(test_random_interleavings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
