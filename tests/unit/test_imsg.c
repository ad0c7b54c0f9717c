/*
 * test_imsg.c - cmocka tests for common/imsg.c: the map builder counts its
 * own entries (nested maps, skipped NULL objects, the smallest header), and
 * every message type round-trips (encode -> msgpack unpack -> decode ->
 * compare every field, optional fields present and absent). A few frames
 * are also compared byte for byte with the hand-counted maps the processes
 * wrote before this module, so the wire stays the same.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "imsg.h"

/* Parses a built message (one msgpack map) into *u. */
static const msgpack_object *parse(const zi_msg *m, msgpack_unpacked *u) {
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(m->sb.data, m->sb.size, NULL, u, &err), ZI_OK);
    assert_int_equal(u->data.type, MSGPACK_OBJECT_MAP);
    return &u->data;
}

static void assert_str(zi_im_str s, const char *want) {
    assert_non_null(s.p);
    assert_int_equal(s.n, strlen(want));
    assert_memory_equal(s.p, want, s.n);
}

static void assert_same_bytes(const zi_msg *a, const zi_msg *b) {
    assert_int_equal(a->sb.size, b->sb.size);
    assert_memory_equal(a->sb.data, b->sb.data, a->sb.size);
}

/* The ids of a token-array object. */
static void assert_ids(const msgpack_object *o, const int32_t *want, size_t n) {
    zi_codec_limits lim = zi_codec_limits_default();
    int32_t *v = NULL;
    size_t got = 0;
    assert_non_null(o);
    assert_int_equal(zi_codec_decode_tokens(o, &lim, "ids", &v, &got, NULL), ZI_OK);
    assert_int_equal(got, n);
    if (n) assert_memory_equal(v, want, n * sizeof *v);
    free(v);
}

static void make_lp(zi_logprobs *lp) {
    zi_logprobs_init(lp);
    int32_t ids[2] = {5, 9};
    float lps[2] = {-0.5f, -1.5f};
    assert_int_equal(zi_logprobs_push(lp, -0.25f, ids, lps, 2, NULL), ZI_OK);
    assert_int_equal(zi_logprobs_push(lp, -0.75f, ids, lps, 1, NULL), ZI_OK);
}

static void assert_lp(const msgpack_object *o) {
    zi_codec_limits lim = zi_codec_limits_default();
    zi_logprobs lp;
    assert_non_null(o);
    assert_int_equal(zi_codec_decode_logprobs(o, &lim, "lp", &lp, NULL), ZI_OK);
    assert_int_equal(lp.n, 2);
    assert_true(lp.token_logprobs[1] == -0.75f);
    assert_int_equal(lp.top[0].n, 2);
    assert_int_equal(lp.top[0].ids[1], 9);
    zi_logprobs_free(&lp);
}

/* ---- the builder --------------------------------------------------------- */

static void test_builder_counts(void **state) {
    (void)state;
    zi_imap b, inner;
    zi_imap_init(&b);
    zi_imap_str(&b, "a", "x");
    zi_imap_int(&b, "b", -3);
    zi_imap_object(&b, "skipped", NULL); /* absent: not counted */
    zi_imap_init(&inner);
    zi_imap_bool(&inner, "t", true);
    zi_imap_double(&inner, "d", 0.5);
    assert_int_equal(zi_imap_count(&inner), 2);
    zi_imap_map(&b, "m", &inner);
    assert_int_equal(zi_imap_count(&b), 3);
    zi_msg m;
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(&b, &m.pk), ZI_OK);
    /* The same map counted by hand: the same bytes. */
    zi_msg h;
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 3);
    zi_pack_kv_str(&h.pk, "a", "x");
    zi_pack_kv_int(&h.pk, "b", -3);
    zi_pack_str(&h.pk, "m");
    msgpack_pack_map(&h.pk, 2);
    zi_pack_kv_bool(&h.pk, "t", true);
    zi_pack_str(&h.pk, "d");
    msgpack_pack_double(&h.pk, 0.5);
    assert_same_bytes(&m, &h);
    zi_msg_free(&m);
    zi_msg_free(&h);

    /* 20 entries: past fixmap (15), a map16 header. */
    zi_imap_init(&b);
    char key[8];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "k%d", i);
        zi_imap_int(&b, key, i);
    }
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(&b, &m.pk), ZI_OK);
    assert_int_equal((unsigned char)m.sb.data[0], 0xde);
    msgpack_unpacked u;
    assert_int_equal(parse(&m, &u)->via.map.size, 20);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);

    /* Empty map; and a map freed without closing leaks nothing. */
    zi_imap_init(&b);
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(&b, &m.pk), ZI_OK);
    assert_int_equal(m.sb.size, 1);
    assert_int_equal((unsigned char)m.sb.data[0], 0x80);
    zi_msg_free(&m);
    zi_imap_init(&b);
    zi_imap_str(&b, "a", "b");
    zi_imap_free(&b);
}

static void test_types(void **state) {
    (void)state;
    for (int t = ZI_IM_UNKNOWN + 1; t < ZI_IM_N_TYPES; t++) {
        zi_msg m;
        zi_msg_init(&m);
        msgpack_pack_map(&m.pk, 1);
        zi_pack_kv_str(&m.pk, "type", zi_im_type_name((zi_im_type)t));
        msgpack_unpacked u;
        assert_int_equal(zi_im_type_of(parse(&m, &u)), t);
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
    zi_msg m;
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_kv_str(&m.pk, "type", "nope");
    zi_pack_kv_str(&m.pk, "rid", "7");
    msgpack_unpacked u;
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(zi_im_type_of(o), ZI_IM_UNKNOWN);
    int64_t rid;
    zi_error err = {0};
    assert_int_equal(zi_im_rid(o, &rid, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "rid: not an integer");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

/* ---- registration and liveness ------------------------------------------- */

static void test_register(void **state) {
    (void)state;
    zi_msg m;
    msgpack_unpacked u;
    zi_im_register r;
    /* A worker: every key. */
    zi_im_register w = {
        .worker = true, .slots = 8, .max_length = 4096, .vocab = 151936, .model = {"qwen", 4}};
    assert_int_equal(zi_im_register_pack(&w, &m), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 6);
    assert_int_equal(zi_im_type_of(o), ZI_IM_REGISTER);
    zi_im_register_unpack(o, &r);
    assert_true(r.worker);
    assert_int_equal(r.slots, 8);
    assert_int_equal(r.max_length, 4096);
    assert_int_equal(r.vocab, 151936);
    assert_str(r.model, "qwen");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* A tokenizer: role and vocab only; the defaults fill the rest. */
    assert_int_equal(zi_im_register_pack(&(zi_im_register){.vocab = 10}, &m), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    zi_im_register_unpack(o, &r);
    assert_false(r.worker);
    assert_int_equal(r.slots, 1);
    assert_int_equal(r.max_length, 2048);
    assert_int_equal(r.vocab, 10);
    assert_null(r.model.p);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* reregister: the type alone. */
    assert_int_equal(zi_im_reregister_pack(&m), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 1);
    assert_int_equal(zi_im_type_of(o), ZI_IM_REREGISTER);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_heartbeat(void **state) {
    (void)state;
    zi_msg m, h;
    msgpack_unpacked u;
    zi_im_heartbeat hb = {.load = 3, .has_kv = true}, d;
    for (int i = 0; i < ZI_N_KV_STATS; i++) hb.kv[i] = 100 + i;
    assert_int_equal(zi_im_heartbeat_pack(&hb, &m), ZI_OK);
    /* The frame the hand-counted heartbeat sender (wire.c, before imsg) wrote. */
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 3);
    zi_pack_kv_str(&h.pk, "type", "heartbeat");
    zi_pack_kv_int(&h.pk, "load", 3);
    zi_pack_str(&h.pk, "kv");
    msgpack_pack_map(&h.pk, ZI_N_KV_STATS);
    for (int i = 0; i < ZI_N_KV_STATS; i++) zi_pack_kv_int(&h.pk, zi_kv_stat_names[i], 100 + i);
    assert_same_bytes(&m, &h);
    zi_msg_free(&h);
    zi_im_heartbeat_unpack(parse(&m, &u), &d);
    assert_int_equal(d.load, 3);
    assert_true(d.has_kv);
    for (int i = 0; i < ZI_N_KV_STATS; i++) {
        assert_true(d.kv_set[i]);
        assert_int_equal(d.kv[i], 100 + i);
    }
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* A tokenizer's: no kv. */
    assert_int_equal(zi_im_heartbeat_pack(&(zi_im_heartbeat){.load = 0}, &m), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 2);
    zi_im_heartbeat_unpack(o, &d);
    assert_false(d.has_kv);
    assert_false(d.kv_set[0]);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_backend_error(void **state) {
    (void)state;
    zi_msg m, h;
    msgpack_unpacked u;
    zi_im_error e;
    /* The field taken from the message, as the old hand-counted error sender did. */
    const char *msg = "sampling_params.top_p: 1.5 is outside (0, 1]";
    assert_int_equal(
        zi_im_error_pack(&(zi_im_error){.rid = 7, .code = "invalid_request", .message = msg}, &m),
        ZI_OK);
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 5);
    zi_pack_kv_str(&h.pk, "type", "error");
    zi_pack_kv_int(&h.pk, "rid", 7);
    zi_pack_kv_str(&h.pk, "code", "invalid_request");
    zi_pack_kv_str(&h.pk, "message", msg);
    zi_pack_kv_str(&h.pk, "field", "sampling_params.top_p");
    assert_same_bytes(&m, &h);
    zi_msg_free(&h);
    zi_im_error_unpack(parse(&m, &u), &e);
    assert_int_equal(e.rid, 7);
    assert_string_equal(e.code, "invalid_request");
    assert_string_equal(e.message, msg);
    assert_string_equal(e.field, "sampling_params.top_p");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* No field. */
    assert_int_equal(
        zi_im_error_pack(&(zi_im_error){.rid = 8, .code = "internal", .message = "no path here"},
                         &m),
        ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 4);
    zi_im_error_unpack(o, &e);
    assert_int_equal(e.rid, 8);
    assert_null(e.field);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* A code too long to keep is left unset (the router's "internal"). */
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_kv_str(&m.pk, "type", "error");
    zi_pack_kv_str(&m.pk, "code",
                   "0123456789012345678901234567890123456789012345678901234567890123456789");
    zi_im_error_unpack(parse(&m, &u), &e);
    assert_int_equal(e.rid, 0);
    assert_null(e.code);
    assert_null(e.message);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

/* ---- router <-> tokenizer ------------------------------------------------- */

static void test_encode_encoded(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m;
    msgpack_unpacked u;
    zi_request req;
    zi_request_init(&req);
    assert_int_equal(zi_string_set(&req.id, "abc", 3, &err), ZI_OK);
    req.prompt_kind = ZI_PROMPT_TEXT;
    assert_int_equal(zi_string_set(&req.prompt_text, "hello", 5, &err), ZI_OK);
    zi_im_encode e = {.rid = 5, .has_max_length = true, .max_length = 512, .request = &req}, d;
    assert_int_equal(zi_im_encode_pack(&e, &m, &err), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 4);
    assert_int_equal(zi_im_type_of(o), ZI_IM_ENCODE);
    assert_int_equal(zi_im_encode_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 5);
    assert_true(d.has_max_length);
    assert_int_equal(d.max_length, 512);
    zi_request back;
    zi_codec_limits lim = zi_codec_limits_default();
    assert_int_equal(zi_codec_decode_request(d.request_obj, &lim, "", &back, &err), ZI_OK);
    assert_string_equal(back.prompt_text.p, "hello");
    zi_request_free(&back);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_request_free(&req);
    /* Without request and max_length. */
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 3);
    zi_pack_kv_str(&m.pk, "type", "encode");
    zi_pack_kv_int(&m.pk, "rid", 6);
    zi_pack_kv_str(&m.pk, "max_length", "x");
    assert_int_equal(zi_im_encode_unpack(parse(&m, &u), &d, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "request: missing");
    assert_false(d.has_max_length);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);

    /* encoded */
    zi_text_context ctx;
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    int32_t prompt[3] = {1, 2, 3};
    assert_int_equal(zi_text_context_init(&ctx, prompt, 3, 64, &sp, &err), ZI_OK);
    zi_im_encoded en = {.rid = 5, .has_prompt_tokens = true, .prompt_tokens = 3, .context = &ctx},
                  ed;
    assert_int_equal(zi_im_encoded_pack(&en, &m, &err), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 4);
    zi_im_encoded_unpack(o, &ed);
    assert_int_equal(ed.rid, 5);
    assert_true(ed.has_prompt_tokens);
    assert_int_equal(ed.prompt_tokens, 3);
    zi_text_context c2;
    assert_int_equal(zi_codec_decode_text_context(ed.context_obj, &lim, "context", &c2, &err),
                     ZI_OK);
    assert_int_equal(c2.prompt_len, 3);
    assert_int_equal(c2.max_length, 64);
    zi_text_context_free(&c2);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_text_context_free(&ctx);
    zi_sampling_params_free(&sp);
    /* Neither prompt_tokens nor context. */
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_kv_str(&m.pk, "type", "encoded");
    zi_pack_kv_int(&m.pk, "rid", 9);
    zi_im_encoded_unpack(parse(&m, &u), &ed);
    assert_int_equal(ed.rid, 9);
    assert_false(ed.has_prompt_tokens);
    assert_null(ed.context_obj);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

/* tokens (typed, from a worker) -> router unpack -> decode (passed through)
 * -> tokenizer unpack. */
static void test_tokens_decode(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m, h, dm;
    msgpack_unpacked u, du;
    int32_t ids[3] = {11, 12, 13}, pids[2] = {1, 2};
    zi_logprobs lp, plp;
    make_lp(&lp);
    make_lp(&plp);
    zi_im_tokens t = {.rid = 4,
                      .token_ids = {.set = true, .v = ids, .n = 3},
                      .status = {"active", 6},
                      .logprobs = {.lp = &lp},
                      .prompt_token_ids = {.set = true, .v = pids, .n = 2},
                      .prompt_logprobs = {.lp = &plp}},
                 r, d;
    assert_int_equal(zi_im_tokens_pack(&t, &m, &err), ZI_OK);
    /* The worker's hand-counted frame. */
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 7);
    zi_pack_kv_str(&h.pk, "type", "tokens");
    zi_pack_kv_int(&h.pk, "rid", 4);
    zi_pack_str(&h.pk, "token_ids");
    zi_codec_pack_tokens(&h.pk, ids, 3, NULL);
    zi_pack_kv_str(&h.pk, "status", "active");
    zi_pack_str(&h.pk, "logprobs");
    zi_codec_pack_logprobs(&h.pk, &lp, NULL);
    zi_pack_str(&h.pk, "prompt_token_ids");
    zi_codec_pack_tokens(&h.pk, pids, 2, NULL);
    zi_pack_str(&h.pk, "prompt_logprobs");
    zi_codec_pack_logprobs(&h.pk, &plp, NULL);
    assert_same_bytes(&m, &h);
    zi_msg_free(&h);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(zi_im_type_of(o), ZI_IM_TOKENS);
    assert_int_equal(zi_im_tokens_unpack(o, &r, &err), ZI_OK);
    assert_int_equal(r.rid, 4);
    assert_int_equal(r.gstatus, ZI_GEN_ACTIVE);
    assert_str(r.status, "active");
    assert_ids(r.token_ids.raw, ids, 3);
    assert_ids(r.prompt_token_ids.raw, pids, 2);
    assert_lp(r.logprobs.raw);
    assert_lp(r.prompt_logprobs.raw);
    /* The router forwards it as decode. */
    assert_int_equal(zi_im_decode_pack(&r, &dm, &err), ZI_OK);
    const msgpack_object *dobj = parse(&dm, &du);
    assert_int_equal(dobj->via.map.size, 7);
    assert_int_equal(zi_im_type_of(dobj), ZI_IM_DECODE);
    assert_int_equal(zi_im_decode_unpack(dobj, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 4);
    assert_int_equal(d.token_ids.n, 3);
    assert_memory_equal(d.token_ids.v, ids, sizeof ids);
    assert_int_equal(d.gstatus, ZI_GEN_ACTIVE);
    assert_ids(d.prompt_token_ids.raw, pids, 2);
    assert_lp(d.logprobs.raw);
    assert_lp(d.prompt_logprobs.raw);
    zi_im_tokens_free(&d);
    msgpack_unpacked_destroy(&du);
    zi_msg_free(&dm);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_logprobs_free(&lp);
    zi_logprobs_free(&plp);

    /* Optional fields absent, no tokens, a final status. */
    zi_im_tokens t2 = {.rid = 5, .token_ids = {.n = 0}, .status = {"maximum_length", 14}};
    assert_int_equal(zi_im_tokens_pack(&t2, &m, &err), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 4);
    assert_int_equal(zi_im_tokens_unpack(o, &r, &err), ZI_OK);
    assert_int_equal(r.gstatus, ZI_GEN_MAXIMUM_LENGTH);
    assert_null(r.logprobs.raw);
    assert_false(r.prompt_token_ids.set);
    assert_null(r.prompt_logprobs.raw);
    assert_int_equal(zi_im_decode_pack(&r, &dm, &err), ZI_OK);
    dobj = parse(&dm, &du);
    assert_int_equal(dobj->via.map.size, 4);
    assert_int_equal(zi_im_decode_unpack(dobj, &d, &err), ZI_OK);
    assert_int_equal(d.token_ids.n, 0);
    assert_null(d.logprobs.raw);
    zi_im_tokens_free(&d);
    msgpack_unpacked_destroy(&du);
    zi_msg_free(&dm);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);

    /* Refusals: the router's malformed tokens, the tokenizer's messages. */
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 3);
    zi_pack_kv_str(&m.pk, "type", "decode");
    zi_pack_kv_int(&m.pk, "rid", 5);
    zi_pack_kv_str(&m.pk, "status", "bogus");
    o = parse(&m, &u);
    assert_int_equal(zi_im_tokens_unpack(o, &r, NULL), ZI_EINVAL);
    assert_int_equal(r.rid, 5); /* read first */
    assert_int_equal(zi_im_decode_unpack(o, &d, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "token_ids: missing");
    zi_im_tokens_free(&d);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 2);
    zi_pack_str(&m.pk, "token_ids");
    zi_codec_pack_tokens(&m.pk, ids, 1, NULL);
    zi_pack_kv_int(&m.pk, "status", 1);
    assert_int_equal(zi_im_decode_unpack(parse(&m, &u), &d, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "status: not a string");
    zi_im_tokens_free(&d);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_decoded(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m, h;
    msgpack_unpacked u;
    int32_t ids[2] = {7, 8}, pids[2] = {1, 2};
    zi_logprobs lp;
    make_lp(&lp);
    zi_im_decoded t = {.rid = 3,
                       .text = {"hi", 2},
                       .token_ids = {.v = ids, .n = 2},
                       .status = {"stop", 4},
                       .logprobs = {.lp = &lp},
                       .prompt_token_ids = {.set = true, .v = pids, .n = 2},
                       .prompt_text = {"ab", 2},
                       .prompt_logprobs = {.lp = &lp}},
                  d;
    assert_int_equal(zi_im_decoded_pack(&t, &m, &err), ZI_OK);
    /* The tokenizer's hand-counted frame: what rides along first. */
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 9);
    zi_pack_str(&h.pk, "logprobs");
    zi_codec_pack_logprobs(&h.pk, &lp, NULL);
    zi_pack_str(&h.pk, "prompt_token_ids");
    zi_codec_pack_tokens(&h.pk, pids, 2, NULL);
    zi_pack_kv_str(&h.pk, "prompt_text", "ab");
    zi_pack_str(&h.pk, "prompt_logprobs");
    zi_codec_pack_logprobs(&h.pk, &lp, NULL);
    zi_pack_kv_str(&h.pk, "type", "decoded");
    zi_pack_kv_int(&h.pk, "rid", 3);
    zi_pack_kv_str(&h.pk, "text", "hi");
    zi_pack_str(&h.pk, "token_ids");
    zi_codec_pack_tokens(&h.pk, ids, 2, NULL);
    zi_pack_kv_str(&h.pk, "status", "stop");
    assert_same_bytes(&m, &h);
    zi_msg_free(&h);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(zi_im_type_of(o), ZI_IM_DECODED);
    assert_int_equal(zi_im_decoded_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 3);
    assert_str(d.text, "hi");
    assert_ids(d.token_ids.raw, ids, 2);
    assert_int_equal(d.gstatus, ZI_GEN_STOP);
    assert_lp(d.logprobs.raw);
    assert_lp(d.prompt_logprobs.raw);
    assert_ids(d.prompt_token_ids.raw, pids, 2);
    assert_non_null(d.prompt_text_obj);
    assert_int_equal(d.prompt_text_obj->type, MSGPACK_OBJECT_STR);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_logprobs_free(&lp);
    /* The plain one: five keys; then a text that is not a string. */
    zi_im_decoded t2 = {.rid = 3, .text = {"", 0}, .status = {"active", 6}};
    assert_int_equal(zi_im_decoded_pack(&t2, &m, &err), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 5);
    assert_int_equal(zi_im_decoded_unpack(o, &d, &err), ZI_OK);
    assert_str(d.text, "");
    assert_null(d.logprobs.raw);
    assert_false(d.prompt_token_ids.set);
    assert_null(d.prompt_text_obj);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 4);
    zi_pack_kv_int(&m.pk, "rid", 3);
    zi_pack_kv_int(&m.pk, "text", 1);
    zi_pack_kv_int(&m.pk, "token_ids", 1);
    zi_pack_kv_str(&m.pk, "status", "active");
    assert_int_equal(zi_im_decoded_unpack(parse(&m, &u), &d, NULL), ZI_EINVAL);
    assert_int_equal(d.rid, 3);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_rid_only(void **state) {
    (void)state;
    zi_msg m;
    msgpack_unpacked u;
    int64_t rid = 0;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(k ? zi_im_release_pack(77, &m) : zi_im_cancel_pack(77, &m), ZI_OK);
        const msgpack_object *o = parse(&m, &u);
        assert_int_equal(o->via.map.size, 2);
        assert_int_equal(zi_im_type_of(o), k ? ZI_IM_RELEASE : ZI_IM_CANCEL);
        assert_int_equal(zi_im_rid(o, &rid, NULL), ZI_OK);
        assert_int_equal(rid, 77);
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
}

static void test_util_ops(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m;
    msgpack_unpacked u;
    /* tokenize, with and without add_special */
    for (int k = 0; k < 2; k++) {
        zi_im_tokenize t = {.rid = 2, .text = {"xy", 2}, .has_add_special = k, .add_special = 0}, d;
        assert_int_equal(zi_im_tokenize_pack(&t, &m), ZI_OK);
        const msgpack_object *o = parse(&m, &u);
        assert_int_equal(o->via.map.size, 3 + k);
        assert_int_equal(zi_im_tokenize_unpack(o, &d, &err), ZI_OK);
        assert_int_equal(d.rid, 2);
        assert_str(d.text, "xy");
        assert_int_equal(d.has_add_special, k);
        assert_int_equal(d.add_special, !k); /* absent: true */
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 1);
    zi_pack_kv_int(&m.pk, "text", 1);
    zi_im_tokenize td;
    assert_int_equal(zi_im_tokenize_unpack(parse(&m, &u), &td, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "text: not a string");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);

    /* detokenize */
    int32_t ids[3] = {4, 5, 6};
    zi_im_detokenize dt = {.rid = 2, .token_ids = {.v = ids, .n = 3}}, dd;
    assert_int_equal(zi_im_detokenize_pack(&dt, &m), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    assert_int_equal(zi_im_detokenize_unpack(o, &dd, &err), ZI_OK);
    assert_int_equal(dd.rid, 2);
    assert_int_equal(dd.token_ids.n, 3);
    assert_memory_equal(dd.token_ids.v, ids, sizeof ids);
    zi_im_ids_free(&dd.token_ids);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 1);
    zi_pack_kv_int(&m.pk, "rid", 1);
    assert_int_equal(zi_im_detokenize_unpack(parse(&m, &u), &dd, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "token_ids: missing");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);

    /* tokenized / detokenized */
    zi_im_util_reply r;
    assert_int_equal(
        zi_im_tokenized_pack(&(zi_im_util_reply){.rid = 9, .token_ids = {.v = ids, .n = 3}}, &m),
        ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    assert_int_equal(zi_im_type_of(o), ZI_IM_TOKENIZED);
    assert_int_equal(zi_im_util_reply_unpack(o, "token_ids", &r, &err), ZI_OK);
    assert_int_equal(r.rid, 9);
    assert_ids(r.value_obj, ids, 3);
    assert_ids(r.token_ids.raw, ids, 3);
    assert_int_equal(zi_im_util_reply_unpack(o, "text", &r, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "text: missing");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    assert_int_equal(zi_im_detokenized_pack(&(zi_im_util_reply){.rid = 9, .text = {"abc", 3}}, &m),
                     ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    assert_int_equal(zi_im_type_of(o), ZI_IM_DETOKENIZED);
    assert_int_equal(zi_im_util_reply_unpack(o, "text", &r, &err), ZI_OK);
    assert_str(r.text, "abc");
    assert_int_equal(r.value_obj->type, MSGPACK_OBJECT_STR);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_start(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg ctx, m;
    msgpack_unpacked cu, u;
    zi_msg_init(&ctx);
    msgpack_pack_map(&ctx.pk, 1);
    zi_pack_kv_int(&ctx.pk, "max_length", 9);
    const msgpack_object *co = parse(&ctx, &cu);
    zi_im_start s = {.rid = 12, .context = co}, d;
    assert_int_equal(zi_im_start_pack(&s, &m), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    assert_int_equal(zi_im_type_of(o), ZI_IM_START);
    assert_int_equal(zi_im_start_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 12);
    int64_t v;
    assert_int_equal(zi_map_int(d.context, "max_length", &v, NULL), ZI_OK);
    assert_int_equal(v, 9);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* No context, no rid. */
    assert_int_equal(zi_im_start_pack(&(zi_im_start){.rid = 1}, &m), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 2);
    assert_int_equal(zi_im_start_unpack(o, &d, &err), ZI_OK);
    assert_null(d.context);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 0);
    assert_int_equal(zi_im_start_unpack(parse(&m, &u), &d, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "rid: missing");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    msgpack_unpacked_destroy(&cu);
    zi_msg_free(&ctx);
}

/* ---- router -> client ----------------------------------------------------- */

static void test_chunk(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg src, m;
    msgpack_unpacked su, u;
    int32_t ids[2] = {3, 4};
    zi_logprobs lp;
    make_lp(&lp);
    /* The decoded message whose fields the chunk carries. */
    zi_im_decoded dd = {.rid = 1,
                        .text = {"t", 1},
                        .token_ids = {.v = ids, .n = 2},
                        .status = {"active", 6},
                        .logprobs = {.lp = &lp},
                        .prompt_token_ids = {.set = true, .v = ids, .n = 2},
                        .prompt_text = {"p", 1},
                        .prompt_logprobs = {.lp = &lp}},
                  d;
    assert_int_equal(zi_im_decoded_pack(&dd, &src, &err), ZI_OK);
    assert_int_equal(zi_im_decoded_unpack(parse(&src, &su), &d, &err), ZI_OK);
    for (int full = 0; full < 2; full++) {
        zi_im_chunk c = {.id = {"req-1", 5}, .text = d.text, .token_ids = d.token_ids.raw}, back;
        if (full) {
            c.logprobs = d.logprobs.raw;
            c.prompt_token_ids = d.prompt_token_ids.raw;
            c.prompt_logprobs = d.prompt_logprobs.raw;
            c.prompt_text = d.prompt_text_obj;
        }
        assert_int_equal(zi_im_chunk_pack(&c, &m), ZI_OK);
        const msgpack_object *o = parse(&m, &u);
        assert_int_equal(o->via.map.size, full ? 8 : 4);
        assert_int_equal(zi_im_chunk_unpack(o, &back, &err), ZI_OK);
        assert_str(back.id, "req-1");
        assert_str(back.text, "t");
        assert_ids(back.token_ids, ids, 2);
        if (full) {
            assert_lp(back.logprobs);
            assert_lp(back.prompt_logprobs);
            assert_ids(back.prompt_token_ids, ids, 2);
            assert_int_equal(back.prompt_text->type, MSGPACK_OBJECT_STR);
        } else {
            assert_null(back.logprobs);
            assert_null(back.prompt_token_ids);
            assert_null(back.prompt_logprobs);
            assert_null(back.prompt_text);
        }
        zi_im_final wrong;
        assert_int_equal(zi_im_final_unpack(o, &wrong, &err), ZI_EINVAL);
        assert_string_equal(err.msg, "event: not \"final\"");
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
    msgpack_unpacked_destroy(&su);
    zi_msg_free(&src);
    zi_logprobs_free(&lp);
}

static void test_final(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m, h, echo;
    msgpack_unpacked u, eu;
    zi_logprobs lp;
    make_lp(&lp);
    int32_t pids[2] = {1, 2};
    /* The echoed prompt, as the router keeps it. */
    zi_msg_init(&echo);
    msgpack_pack_map(&echo.pk, 2);
    zi_pack_str(&echo.pk, "prompt_token_ids");
    zi_codec_pack_tokens(&echo.pk, pids, 2, NULL);
    zi_pack_kv_str(&echo.pk, "prompt_text", "ab");
    const msgpack_object *eo = parse(&echo, &eu);
    zi_im_final f = {.id = {"x", 1},
                     .status = "stop",
                     .status_len = 4,
                     .index = 2,
                     .prompt_tokens = 5,
                     .completion_tokens = 6,
                     .has_text = true,
                     .text = {"done", 4},
                     .logprobs = {.lp = &lp},
                     .prompt_token_ids = zi_map_get(eo, "prompt_token_ids"),
                     .prompt_text = zi_map_get(eo, "prompt_text")},
                d;
    assert_int_equal(zi_im_final_pack(&f, &m, &err), ZI_OK);
    /* The router's hand-counted frame (6 + has_lp + echo_keys). */
    zi_msg_init(&h);
    msgpack_pack_map(&h.pk, 9);
    zi_pack_kv_str(&h.pk, "id", "x");
    zi_pack_kv_str(&h.pk, "event", "final");
    zi_pack_kv_str(&h.pk, "status", "stop");
    zi_pack_kv_int(&h.pk, "index", 2);
    zi_pack_str(&h.pk, "usage");
    msgpack_pack_map(&h.pk, 2);
    zi_pack_kv_int(&h.pk, "prompt_tokens", 5);
    zi_pack_kv_int(&h.pk, "completion_tokens", 6);
    zi_pack_kv_str(&h.pk, "text", "done");
    zi_pack_str(&h.pk, "logprobs");
    zi_codec_pack_logprobs(&h.pk, &lp, NULL);
    zi_pack_str(&h.pk, "prompt_token_ids");
    zi_codec_pack_tokens(&h.pk, pids, 2, NULL);
    zi_pack_kv_str(&h.pk, "prompt_text", "ab");
    assert_same_bytes(&m, &h);
    zi_msg_free(&h);
    assert_int_equal(zi_im_final_unpack(parse(&m, &u), &d, &err), ZI_OK);
    assert_str(d.id, "x");
    assert_int_equal(d.status_len, 4);
    assert_memory_equal(d.status, "stop", 4);
    assert_int_equal(d.index, 2);
    assert_int_equal(d.prompt_tokens, 5);
    assert_int_equal(d.completion_tokens, 6);
    assert_true(d.has_text);
    assert_str(d.text, "done");
    assert_lp(d.logprobs.raw);
    assert_ids(d.prompt_token_ids, pids, 2);
    assert_int_equal(d.prompt_text->type, MSGPACK_OBJECT_STR);
    assert_null(d.prompt_logprobs);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* Streamed: five keys, whatever else is set. */
    f.has_text = false;
    assert_int_equal(zi_im_final_pack(&f, &m, &err), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 5);
    assert_int_equal(zi_im_final_unpack(o, &d, &err), ZI_OK);
    assert_false(d.has_text);
    assert_null(d.logprobs.raw);
    assert_null(d.prompt_token_ids);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    msgpack_unpacked_destroy(&eu);
    zi_msg_free(&echo);
    zi_logprobs_free(&lp);
}

static void test_client_error(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m;
    msgpack_unpacked u;
    zi_im_client_error d;
    for (int k = 0; k < 2; k++) {
        zi_im_client_error e = {.id = {"", 0}, .code = {"overloaded", 10}, .message = {"busy", 4}};
        if (k) e.field = (zi_im_str){"id", 2};
        assert_int_equal(zi_im_client_error_pack(&e, &m), ZI_OK);
        const msgpack_object *o = parse(&m, &u);
        assert_int_equal(o->via.map.size, 4 + k);
        assert_int_equal(zi_im_client_error_unpack(o, &d, &err), ZI_OK);
        assert_str(d.id, "");
        assert_str(d.code, "overloaded");
        assert_str(d.message, "busy");
        if (k)
            assert_str(d.field, "id");
        else
            assert_null(d.field.p);
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
}

static void test_results(void **state) {
    (void)state;
    zi_error err = {0};
    zi_msg m;
    msgpack_unpacked u;
    /* health */
    zi_im_health h = {.id = {"h", 1},
                      .status = "ok",
                      .status_len = 2,
                      .workers = 1,
                      .tokenizers = 2,
                      .waiting = 3,
                      .running = 4,
                      .prefix_hit_rate = 0.25},
                 hd;
    for (int i = 0; i < ZI_N_KV_STATS; i++) h.kv[i] = 10 * i;
    assert_int_equal(zi_im_health_pack(&h, &m), ZI_OK);
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 8);
    assert_int_equal(zi_map_get(o, "kv")->via.map.size, ZI_N_KV_STATS + 1);
    assert_int_equal(zi_im_health_unpack(o, &hd, &err), ZI_OK);
    assert_str(hd.id, "h");
    assert_memory_equal(hd.status, "ok", 2);
    assert_int_equal(hd.workers, 1);
    assert_int_equal(hd.tokenizers, 2);
    assert_int_equal(hd.waiting, 3);
    assert_int_equal(hd.running, 4);
    for (int i = 0; i < ZI_N_KV_STATS; i++) assert_int_equal(hd.kv[i], 10 * i);
    assert_true(hd.prefix_hit_rate == 0.25);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    /* models: none, then two */
    zi_im_models ms = {.id = {"m", 1}}, md;
    for (int k = 0; k < 2; k++) {
        if (k) {
            ms.n = 2;
            ms.v[0] = (zi_im_model_entry){{"a", 1}, 100, 10};
            ms.v[1] = (zi_im_model_entry){{"bb", 2}, 200, 20};
        }
        assert_int_equal(zi_im_models_pack(&ms, &m), ZI_OK);
        o = parse(&m, &u);
        assert_int_equal(o->via.map.size, 3);
        assert_int_equal(zi_im_models_unpack(o, &md, &err), ZI_OK);
        assert_str(md.id, "m");
        assert_int_equal(md.n, ms.n);
        for (size_t i = 0; i < md.n; i++) {
            assert_int_equal(md.v[i].name.n, ms.v[i].name.n);
            assert_memory_equal(md.v[i].name.p, ms.v[i].name.p, ms.v[i].name.n);
            assert_int_equal(md.v[i].max_length, ms.v[i].max_length);
            assert_int_equal(md.v[i].vocab, ms.v[i].vocab);
        }
        msgpack_unpacked_destroy(&u);
        zi_msg_free(&m);
    }
    /* tokenize's result: the tokenizer's answer passed on. */
    zi_msg src;
    msgpack_unpacked su;
    int32_t ids[2] = {1, 2};
    assert_int_equal(
        zi_im_tokenized_pack(&(zi_im_util_reply){.rid = 1, .token_ids = {.v = ids, .n = 2}}, &src),
        ZI_OK);
    zi_im_util_reply ur;
    assert_int_equal(zi_im_util_reply_unpack(parse(&src, &su), "token_ids", &ur, &err), ZI_OK);
    zi_im_result r = {.id = {"t", 1}, .key = "token_ids", .value = ur.value_obj},
                 rd = {.key = "token_ids"};
    assert_int_equal(zi_im_result_pack(&r, &m), ZI_OK);
    o = parse(&m, &u);
    assert_int_equal(o->via.map.size, 3);
    assert_int_equal(zi_im_result_unpack(o, &rd, &err), ZI_OK);
    assert_str(rd.id, "t");
    assert_ids(rd.value, ids, 2);
    zi_im_result wrong = {.key = "text"};
    assert_int_equal(zi_im_result_unpack(o, &wrong, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "text: missing");
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    msgpack_unpacked_destroy(&su);
    zi_msg_free(&src);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_counts), cmocka_unit_test(test_types),
        cmocka_unit_test(test_register),       cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_backend_error),  cmocka_unit_test(test_encode_encoded),
        cmocka_unit_test(test_tokens_decode),  cmocka_unit_test(test_decoded),
        cmocka_unit_test(test_rid_only),       cmocka_unit_test(test_util_ops),
        cmocka_unit_test(test_start),          cmocka_unit_test(test_chunk),
        cmocka_unit_test(test_final),          cmocka_unit_test(test_client_error),
        cmocka_unit_test(test_results),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
