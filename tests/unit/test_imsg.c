/*
 * test_imsg.c - cmocka tests for protocol/imsg.c: the map builder counts its
 * own entries (nested maps, skipped NULL objects, the smallest header), and
 * every message type round-trips (encode -> msgpack unpack -> decode ->
 * compare every field, optional fields present and absent). A few frames
 * are also compared byte for byte with the hand-counted maps the processes
 * wrote before this module, so the wire stays the same.
 *
 * Every check goes through one frame: what an encoder (or the test, by
 * hand) wrote, parsed. packed() takes an encoder's result and checks the
 * frame's entry count and type, so a test reads as "pack, decode, compare".
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "imsg.h"
#include "imsg_lora.h"
#include "wire.h"

/* ---- frames and comparisons ---------------------------------------------- */

/* A message under test: its bytes and, once parsed, the map. */
typedef struct frame {
    zi_msg m;
    msgpack_unpacked u;
    const msgpack_object *o; /* NULL until parsed */
} frame;

/* Parses f's bytes: one msgpack map. */
static const msgpack_object *parsed(frame *f) {
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(f->m.sb.data, f->m.sb.size, NULL, &f->u, &err), ZI_OK);
    assert_int_equal(f->u.data.type, MSGPACK_OBJECT_MAP);
    f->o = &f->u.data;
    return f->o;
}

/* An encoder's result rc and the frame it wrote into f->m: a map of n
 * entries and, for an internal message (t not ZI_IM_UNKNOWN), of type t. */
static const msgpack_object *packed(frame *f, int rc, uint32_t n, zi_im_type t) {
    assert_int_equal(rc, ZI_OK);
    f->o = NULL;
    parsed(f);
    assert_int_equal(f->o->via.map.size, n);
    if (t != ZI_IM_UNKNOWN) assert_int_equal(zi_im_type_of(f->o), t);
    return f->o;
}

/* Begins a map of n entries written by hand: a frame as the processes
 * counted it before imsg, or a message no encoder writes. */
static msgpack_packer *by_hand(frame *f, uint32_t n) {
    zi_msg_init(&f->m);
    f->o = NULL;
    msgpack_pack_map(&f->m.pk, n);
    return &f->m.pk;
}

/* Begins an internal message written by hand: type and rid, then n more
 * entries. */
static msgpack_packer *by_hand_msg(frame *f, const char *type, int64_t rid, uint32_t n) {
    msgpack_packer *pk = by_hand(f, 2 + n);
    zi_pack_kv_str(pk, "type", type);
    zi_pack_kv_int(pk, "rid", rid);
    return pk;
}

/* Closes a builder into a fresh frame. */
static void closed(frame *f, zi_imap *b) {
    zi_msg_init(&f->m);
    f->o = NULL;
    assert_int_equal(zi_imap_close(b, &f->m.pk), ZI_OK);
}

static void frame_free(frame *f) {
    if (f->o) msgpack_unpacked_destroy(&f->u);
    zi_msg_free(&f->m);
    f->o = NULL;
}

/* f holds the bytes of the hand-counted frame old (freed here). */
static void assert_wrote(const frame *f, frame *old) {
    assert_int_equal(f->m.sb.size, old->m.sb.size);
    assert_memory_equal(f->m.sb.data, old->m.sb.data, f->m.sb.size);
    frame_free(old);
}

/* The rid of a message is want. */
static void assert_rid(const msgpack_object *o, int64_t want) {
    int64_t rid = 0;
    assert_int_equal(zi_im_rid(o, &rid, NULL), ZI_OK);
    assert_int_equal(rid, want);
}

/* A decoder refused with ZI_EINVAL and this message. */
static void assert_refused(int rc, const zi_error *err, const char *msg) {
    assert_int_equal(rc, ZI_EINVAL);
    assert_string_equal(err->msg, msg);
}

static void assert_str(zi_im_str s, const char *want) {
    assert_non_null(s.p);
    assert_int_equal(s.n, strlen(want));
    assert_memory_equal(s.p, want, s.n);
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

/* Ids a decoder decoded into own. */
static void assert_own_ids(const zi_im_ids *ids, const int32_t *want, size_t n) {
    assert_int_equal(ids->n, n);
    if (n) assert_memory_equal(ids->v, want, n * sizeof *want);
}

static void make_lp(zi_logprobs *lp) {
    zi_logprobs_init(lp);
    int32_t ids[2] = {5, 9};
    float lps[2] = {-0.5f, -1.5f};
    assert_int_equal(zi_logprobs_push(lp, -0.25f, ids, lps, 2, NULL), ZI_OK);
    assert_int_equal(zi_logprobs_push(lp, -0.75f, ids, lps, 1, NULL), ZI_OK);
}

/* The log probabilities make_lp made. */
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
    frame f, h;
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
    closed(&f, &b);
    /* The same map counted by hand: the same bytes. */
    msgpack_packer *pk = by_hand(&h, 3);
    zi_pack_kv_str(pk, "a", "x");
    zi_pack_kv_int(pk, "b", -3);
    zi_pack_str(pk, "m");
    msgpack_pack_map(pk, 2);
    zi_pack_kv_bool(pk, "t", true);
    zi_pack_str(pk, "d");
    msgpack_pack_double(pk, 0.5);
    assert_wrote(&f, &h);
    frame_free(&f);

    /* 20 entries: past fixmap (15), a map16 header. */
    zi_imap_init(&b);
    char key[8];
    for (int i = 0; i < 20; i++) {
        snprintf(key, sizeof key, "k%d", i);
        zi_imap_int(&b, key, i);
    }
    closed(&f, &b);
    assert_int_equal((unsigned char)f.m.sb.data[0], 0xde);
    assert_int_equal(parsed(&f)->via.map.size, 20);
    frame_free(&f);

    /* Empty map; and a map freed without closing leaks nothing. */
    zi_imap_init(&b);
    closed(&f, &b);
    assert_int_equal(f.m.sb.size, 1);
    assert_int_equal((unsigned char)f.m.sb.data[0], 0x80);
    frame_free(&f);
    zi_imap_init(&b);
    zi_imap_str(&b, "a", "b");
    zi_imap_free(&b);
}

/* A map of 2^16 entries takes the map32 header; its entries follow it
 * exactly as written. */
static void test_builder_map32(void **state) {
    (void)state;
    frame f;
    zi_imap b;
    zi_imap_init(&b);
    for (int i = 0; i < 65536; i++) zi_imap_int(&b, "k", i & 127);
    closed(&f, &b);
    const unsigned char want[5] = {0xdf, 0x00, 0x01, 0x00, 0x00};
    assert_memory_equal(f.m.sb.data, want, 5);
    assert_int_equal(f.m.sb.size, 5 + 65536 * 3); /* fixstr "k", positive fixint */
    frame_free(&f);
}

/* A map whose value could not be packed never leaves the builder: close
 * fails and writes nothing; an encoder given a NaN log probability fails
 * with the codec's error and an empty message, which zi_im_send refuses. */
static void test_failed_message(void **state) {
    (void)state;
    zi_imap b;
    zi_msg m;
    zi_imap_init(&b);
    zi_imap_int(&b, "a", 1);
    zi_imap_key(&b, "b"); /* a key whose value could not be packed */
    zi_imap_fail(&b);
    zi_msg_init(&m);
    assert_int_equal(zi_imap_close(&b, &m.pk), ZI_ENOMEM);
    assert_int_equal(m.sb.size, 0);
    zi_msg_free(&m);

    zi_logprobs lp;
    make_lp(&lp);
    lp.token_logprobs[1] = NAN;
    int32_t ids[2] = {7, 8};
    zi_im_tokens t = {.rid = 4,
                      .token_ids = {.set = true, .v = ids, .n = 2},
                      .status = {"active", 6},
                      .logprobs = {.lp = &lp}};
    zi_error err = {0};
    assert_int_equal(zi_im_tokens_pack(&t, &m, &err), ZI_EINVAL);
    assert_true(err.msg[0] != 0);
    assert_int_equal(m.sb.size, 0);
    assert_int_equal(zi_im_send(NULL, &m), -1); /* frees m */
    zi_logprobs_free(&lp);
}

static void test_types(void **state) {
    (void)state;
    frame f;
    for (int t = ZI_IM_UNKNOWN + 1; t < ZI_IM_N_TYPES; t++) {
        zi_pack_kv_str(by_hand(&f, 1), "type", zi_im_type_name((zi_im_type)t));
        assert_int_equal(zi_im_type_of(parsed(&f)), t);
        frame_free(&f);
    }
    msgpack_packer *pk = by_hand(&f, 2);
    zi_pack_kv_str(pk, "type", "nope");
    zi_pack_kv_str(pk, "rid", "7");
    const msgpack_object *o = parsed(&f);
    assert_int_equal(zi_im_type_of(o), ZI_IM_UNKNOWN);
    int64_t rid;
    zi_error err = {0};
    assert_refused(zi_im_rid(o, &rid, &err), &err, "rid: not an integer");
    frame_free(&f);
}

/* ---- registration and liveness ------------------------------------------- */

static void test_register(void **state) {
    (void)state;
    frame f;
    zi_im_register r;
    /* A worker: every key. */
    zi_im_register w = {
        .worker = true, .slots = 8, .max_length = 4096, .vocab = 151936, .model = {"qwen", 4}};
    zi_im_register_unpack(packed(&f, zi_im_register_pack(&w, &f.m), 6, ZI_IM_REGISTER), &r);
    assert_true(r.worker);
    assert_int_equal(r.slots, 8);
    assert_int_equal(r.max_length, 4096);
    assert_int_equal(r.vocab, 151936);
    assert_str(r.model, "qwen");
    frame_free(&f);
    /* A tokenizer: role and vocab only; the defaults fill the rest. */
    zi_im_register tk = {.vocab = 10};
    zi_im_register_unpack(packed(&f, zi_im_register_pack(&tk, &f.m), 3, ZI_IM_REGISTER), &r);
    assert_false(r.worker);
    assert_int_equal(r.slots, 1);
    assert_int_equal(r.max_length, 2048);
    assert_int_equal(r.vocab, 10);
    assert_null(r.model.p);
    frame_free(&f);
    /* A tokenizer of a named model: its model too. */
    zi_im_register tm = {.vocab = 10, .model = {"gemma", 5}};
    zi_im_register_unpack(packed(&f, zi_im_register_pack(&tm, &f.m), 4, ZI_IM_REGISTER), &r);
    assert_false(r.worker);
    assert_str(r.model, "gemma");
    frame_free(&f);
    /* reregister: the type alone. */
    packed(&f, zi_im_reregister_pack(&f.m), 1, ZI_IM_REREGISTER);
    frame_free(&f);
}

/* A worker's adapters in register, and the lora / lora_done messages
 * (imsg_lora.h): each key round-trips; a bad lora is refused naming the
 * key. */
static void test_lora(void **state) {
    (void)state;
    frame f;
    zi_error err = {0};
    const char *names[] = {"style", "", "code"};
    zi_im_register w = {.worker = true,
                        .slots = 2,
                        .max_length = 64,
                        .model = {"m", 1},
                        .loras = names,
                        .n_loras = 3};
    zi_im_register r;
    zi_im_register_unpack(packed(&f, zi_im_register_pack(&w, &f.m), 7, ZI_IM_REGISTER), &r);
    assert_non_null(r.loras_obj);
    assert_int_equal(r.loras_obj->via.array.size, 3);
    assert_memory_equal(r.loras_obj->via.array.ptr[2].via.str.ptr, "code", 4);
    assert_int_equal(r.loras_obj->via.array.ptr[1].via.str.size, 0);
    frame_free(&f);

    zi_im_lora lm = {
        .rid = 9, .load = true, .name = {"style", 5}, .path = {"/a.gguf", 7}, .scale = 0.5};
    zi_im_lora back;
    assert_int_equal(
        zi_im_lora_unpack(packed(&f, zi_im_lora_pack(&lm, &f.m), 6, ZI_IM_LORA), &back, &err),
        ZI_OK);
    assert_true(back.load);
    assert_int_equal(back.rid, 9);
    assert_str(back.name, "style");
    assert_str(back.path, "/a.gguf");
    assert_true(back.scale == 0.5);
    frame_free(&f);
    lm.load = false; /* an unload: no path, no scale */
    assert_int_equal(
        zi_im_lora_unpack(packed(&f, zi_im_lora_pack(&lm, &f.m), 4, ZI_IM_LORA), &back, &err),
        ZI_OK);
    assert_false(back.load);
    assert_null(back.path.p);
    frame_free(&f);
    lm.load = true;
    lm.path = (zi_im_str){"", 0};
    assert_refused(
        zi_im_lora_unpack(packed(&f, zi_im_lora_pack(&lm, &f.m), 6, ZI_IM_LORA), &back, &err), &err,
        "path: missing or empty");
    frame_free(&f);

    zi_im_lora_done d = {.rid = 9,
                         .code = {"in_use", 6},
                         .message = {"busy", 4},
                         .id = -1,
                         .names = names,
                         .n_names = 3};
    zi_im_lora_done db;
    zi_im_lora_done_unpack(packed(&f, zi_im_lora_done_pack(&d, &f.m), 7, ZI_IM_LORA_DONE), &db);
    assert_int_equal(db.rid, 9);
    assert_false(db.ok);
    assert_str(db.code, "in_use");
    assert_str(db.message, "busy");
    assert_int_equal(db.id, -1);
    assert_int_equal(db.loras->via.array.size, 3);
    frame_free(&f);
    zi_im_lora_done ok = {.rid = 3, .ok = true, .id = 2};
    zi_im_lora_done_unpack(packed(&f, zi_im_lora_done_pack(&ok, &f.m), 5, ZI_IM_LORA_DONE), &db);
    assert_true(db.ok);
    assert_int_equal(db.id, 2);
    assert_null(db.code.p);
    assert_int_equal(db.loras->via.array.size, 0);
    frame_free(&f);
}

static void test_heartbeat(void **state) {
    (void)state;
    frame f, h;
    zi_im_heartbeat hb = {.load = 3, .has_kv = true}, d;
    for (int i = 0; i < ZI_N_KV_STATS; i++) hb.kv[i] = 100 + i;
    zi_im_heartbeat_unpack(packed(&f, zi_im_heartbeat_pack(&hb, &f.m), 3, ZI_IM_HEARTBEAT), &d);
    /* The frame the hand-counted heartbeat sender (wire.c, before imsg) wrote. */
    msgpack_packer *pk = by_hand(&h, 3);
    zi_pack_kv_str(pk, "type", "heartbeat");
    zi_pack_kv_int(pk, "load", 3);
    zi_pack_str(pk, "kv");
    msgpack_pack_map(pk, ZI_N_KV_STATS);
    for (int i = 0; i < ZI_N_KV_STATS; i++) zi_pack_kv_int(pk, zi_kv_stat_names[i], 100 + i);
    assert_wrote(&f, &h);
    assert_int_equal(d.load, 3);
    assert_true(d.has_kv);
    for (int i = 0; i < ZI_N_KV_STATS; i++) {
        assert_true(d.kv_set[i]);
        assert_int_equal(d.kv[i], 100 + i);
    }
    frame_free(&f);
    /* A tokenizer's: no kv. */
    zi_im_heartbeat idle = {.load = 0};
    zi_im_heartbeat_unpack(packed(&f, zi_im_heartbeat_pack(&idle, &f.m), 2, ZI_IM_HEARTBEAT), &d);
    assert_false(d.has_kv);
    assert_false(d.kv_set[0]);
    frame_free(&f);
}

static void test_backend_error(void **state) {
    (void)state;
    frame f, h;
    zi_im_error e;
    /* The field taken from the message, as the old hand-counted error sender did. */
    const char *msg = "sampling_params.top_p: 1.5 is outside (0, 1]";
    zi_im_error bad = {.rid = 7, .code = "invalid_request", .message = msg};
    zi_im_error_unpack(packed(&f, zi_im_error_pack(&bad, &f.m), 5, ZI_IM_ERROR), &e);
    msgpack_packer *pk = by_hand(&h, 5);
    zi_pack_kv_str(pk, "type", "error");
    zi_pack_kv_int(pk, "rid", 7);
    zi_pack_kv_str(pk, "code", "invalid_request");
    zi_pack_kv_str(pk, "message", msg);
    zi_pack_kv_str(pk, "field", "sampling_params.top_p");
    assert_wrote(&f, &h);
    assert_int_equal(e.rid, 7);
    assert_string_equal(e.code, "invalid_request");
    assert_string_equal(e.message, msg);
    assert_string_equal(e.field, "sampling_params.top_p");
    frame_free(&f);
    /* No field. */
    zi_im_error plain = {.rid = 8, .code = "internal", .message = "no path here"};
    zi_im_error_unpack(packed(&f, zi_im_error_pack(&plain, &f.m), 4, ZI_IM_ERROR), &e);
    assert_int_equal(e.rid, 8);
    assert_null(e.field);
    frame_free(&f);
    /* A code too long to keep is left unset (the router's "internal"). */
    pk = by_hand(&f, 2);
    zi_pack_kv_str(pk, "type", "error");
    zi_pack_kv_str(pk, "code",
                   "0123456789012345678901234567890123456789012345678901234567890123456789");
    zi_im_error_unpack(parsed(&f), &e);
    assert_int_equal(e.rid, 0);
    assert_null(e.code);
    assert_null(e.message);
    frame_free(&f);
}

/* ---- router <-> tokenizer ------------------------------------------------- */

/* encode -> the tokenizer, which reads the request and answers with
 * encoded -> the router; then both bare (a count that is not an integer,
 * no value). */
static void test_encode_encoded(void **state) {
    (void)state;
    zi_error err = {0};
    zi_codec_limits lim = zi_codec_limits_default();
    frame f, g;
    zi_request req, got;
    zi_request_init(&req);
    assert_int_equal(zi_string_set(&req.id, "abc", 3, &err), ZI_OK);
    req.prompt_kind = ZI_PROMPT_TEXT;
    assert_int_equal(zi_string_set(&req.prompt_text, "hello", 5, &err), ZI_OK);
    zi_im_encode e = {.rid = 5, .has_max_length = true, .max_length = 512, .request = &req}, ed;
    const msgpack_object *o = packed(&f, zi_im_encode_pack(&e, &f.m, &err), 4, ZI_IM_ENCODE);
    assert_int_equal(zi_im_encode_unpack(o, &ed, &err), ZI_OK);
    assert_int_equal(ed.rid, 5);
    assert_true(ed.has_max_length);
    assert_int_equal(ed.max_length, 512);
    assert_int_equal(zi_codec_decode_request(ed.request_obj, &lim, "", &got, &err), ZI_OK);
    assert_string_equal(got.prompt_text.p, "hello");
    /* The tokenizer's answer: the prompt's tokens in a context. */
    zi_text_context ctx, back;
    int32_t prompt[3] = {1, 2, 3};
    assert_int_equal(
        zi_text_context_init(&ctx, prompt, 3, ed.max_length, &got.sampling_params, &err), ZI_OK);
    zi_im_encoded en = {.rid = ed.rid,
                        .has_prompt_tokens = true,
                        .prompt_tokens = 3,
                        .context = &ctx},
                  d;
    zi_im_encoded_unpack(packed(&g, zi_im_encoded_pack(&en, &g.m, &err), 4, ZI_IM_ENCODED), &d);
    assert_int_equal(d.rid, 5);
    assert_true(d.has_prompt_tokens);
    assert_int_equal(d.prompt_tokens, 3);
    assert_int_equal(zi_codec_decode_text_context(d.context_obj, &lim, "context", &back, &err),
                     ZI_OK);
    assert_int_equal(back.prompt_len, 3);
    assert_int_equal(back.max_length, 512);
    zi_text_context_free(&back);
    zi_text_context_free(&ctx);
    zi_request_free(&got);
    zi_request_free(&req);
    frame_free(&g);
    frame_free(&f);

    zi_pack_kv_str(by_hand_msg(&f, "encode", 6, 1), "max_length", "x");
    assert_refused(zi_im_encode_unpack(parsed(&f), &ed, &err), &err, "request: missing");
    assert_false(ed.has_max_length);
    frame_free(&f);
    zi_pack_kv_str(by_hand_msg(&f, "encoded", 9, 1), "prompt_tokens", "x");
    zi_im_encoded_unpack(parsed(&f), &d);
    assert_int_equal(d.rid, 9);
    assert_false(d.has_prompt_tokens);
    assert_null(d.context_obj);
    frame_free(&f);
}

/* A worker's tokens t (n entries) through the router: tokens_unpack into
 * *r, decode_pack of *r (the same n entries), the tokenizer's decode_unpack
 * into *d. The caller frees f, g and *d. */
static void relay_tokens(const zi_im_tokens *t, uint32_t n, frame *f, zi_im_tokens *r, frame *g,
                         zi_im_tokens *d) {
    zi_error err = {0};
    const msgpack_object *o = packed(f, zi_im_tokens_pack(t, &f->m, &err), n, ZI_IM_TOKENS);
    assert_int_equal(zi_im_tokens_unpack(o, r, &err), ZI_OK);
    o = packed(g, zi_im_decode_pack(r, &g->m, &err), n, ZI_IM_DECODE);
    assert_int_equal(zi_im_decode_unpack(o, d, &err), ZI_OK);
}

static void test_tokens_decode(void **state) {
    (void)state;
    zi_error err = {0};
    frame f, g, h;
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
    relay_tokens(&t, 7, &f, &r, &g, &d);
    /* The worker's hand-counted frame. */
    msgpack_packer *pk = by_hand(&h, 7);
    zi_pack_kv_str(pk, "type", "tokens");
    zi_pack_kv_int(pk, "rid", 4);
    zi_pack_str(pk, "token_ids");
    zi_codec_pack_tokens(pk, ids, 3, NULL);
    zi_pack_kv_str(pk, "status", "active");
    zi_pack_str(pk, "logprobs");
    zi_codec_pack_logprobs(pk, &lp, NULL);
    zi_pack_str(pk, "prompt_token_ids");
    zi_codec_pack_tokens(pk, pids, 2, NULL);
    zi_pack_str(pk, "prompt_logprobs");
    zi_codec_pack_logprobs(pk, &plp, NULL);
    assert_wrote(&f, &h);
    /* What the router read, passed through. */
    assert_int_equal(r.rid, 4);
    assert_int_equal(r.gstatus, ZI_GEN_ACTIVE);
    assert_str(r.status, "active");
    assert_ids(r.token_ids.raw, ids, 3);
    assert_ids(r.prompt_token_ids.raw, pids, 2);
    assert_lp(r.logprobs.raw);
    assert_lp(r.prompt_logprobs.raw);
    /* What the tokenizer read from the router's decode. */
    assert_int_equal(d.rid, 4);
    assert_own_ids(&d.token_ids, ids, 3);
    assert_int_equal(d.gstatus, ZI_GEN_ACTIVE);
    assert_ids(d.prompt_token_ids.raw, pids, 2);
    assert_lp(d.logprobs.raw);
    assert_lp(d.prompt_logprobs.raw);
    zi_im_tokens_free(&d);
    frame_free(&g);
    frame_free(&f);
    zi_logprobs_free(&lp);
    zi_logprobs_free(&plp);

    /* Optional fields absent, no tokens, a final status. */
    zi_im_tokens t2 = {.rid = 5, .token_ids = {.n = 0}, .status = {"maximum_length", 14}};
    relay_tokens(&t2, 4, &f, &r, &g, &d);
    assert_int_equal(r.gstatus, ZI_GEN_MAXIMUM_LENGTH);
    assert_null(r.logprobs.raw);
    assert_false(r.prompt_token_ids.set);
    assert_null(r.prompt_logprobs.raw);
    assert_own_ids(&d.token_ids, NULL, 0);
    assert_null(d.logprobs.raw);
    zi_im_tokens_free(&d);
    frame_free(&g);
    frame_free(&f);

    /* Refusals: the router's malformed tokens, the tokenizer's messages. */
    zi_pack_kv_str(by_hand_msg(&f, "decode", 5, 1), "status", "bogus");
    const msgpack_object *o = parsed(&f);
    assert_int_equal(zi_im_tokens_unpack(o, &r, NULL), ZI_EINVAL);
    assert_int_equal(r.rid, 5); /* read first */
    assert_refused(zi_im_decode_unpack(o, &d, &err), &err, "token_ids: missing");
    zi_im_tokens_free(&d);
    frame_free(&f);
    pk = by_hand(&f, 2);
    zi_pack_str(pk, "token_ids");
    zi_codec_pack_tokens(pk, ids, 1, NULL);
    zi_pack_kv_int(pk, "status", 1);
    assert_refused(zi_im_decode_unpack(parsed(&f), &d, &err), &err, "status: not a string");
    zi_im_tokens_free(&d);
    frame_free(&f);
}

/* The token ids and the echoed prompt's ids of full_decoded. */
static const int32_t DEC_IDS[2] = {7, 8}, DEC_PIDS[2] = {1, 2};

/* A decoded message with every field set (lp: make_lp's) packed into f
 * and read back, as the router reads it, into *d. */
static void full_decoded(frame *f, const zi_logprobs *lp, zi_im_decoded *d) {
    zi_error err = {0};
    zi_im_decoded t = {.rid = 3,
                       .text = {"hi", 2},
                       .token_ids = {.v = DEC_IDS, .n = 2},
                       .status = {"stop", 4},
                       .logprobs = {.lp = lp},
                       .prompt_token_ids = {.set = true, .v = DEC_PIDS, .n = 2},
                       .prompt_text = {"ab", 2},
                       .prompt_logprobs = {.lp = lp}};
    const msgpack_object *o = packed(f, zi_im_decoded_pack(&t, &f->m, &err), 9, ZI_IM_DECODED);
    assert_int_equal(zi_im_decoded_unpack(o, d, &err), ZI_OK);
}

static void test_decoded(void **state) {
    (void)state;
    zi_error err = {0};
    frame f, h;
    const int32_t *ids = DEC_IDS, *pids = DEC_PIDS;
    zi_logprobs lp;
    make_lp(&lp);
    zi_im_decoded d;
    full_decoded(&f, &lp, &d);
    /* The tokenizer's hand-counted frame: what rides along first. */
    msgpack_packer *pk = by_hand(&h, 9);
    zi_pack_str(pk, "logprobs");
    zi_codec_pack_logprobs(pk, &lp, NULL);
    zi_pack_str(pk, "prompt_token_ids");
    zi_codec_pack_tokens(pk, pids, 2, NULL);
    zi_pack_kv_str(pk, "prompt_text", "ab");
    zi_pack_str(pk, "prompt_logprobs");
    zi_codec_pack_logprobs(pk, &lp, NULL);
    zi_pack_kv_str(pk, "type", "decoded");
    zi_pack_kv_int(pk, "rid", 3);
    zi_pack_kv_str(pk, "text", "hi");
    zi_pack_str(pk, "token_ids");
    zi_codec_pack_tokens(pk, ids, 2, NULL);
    zi_pack_kv_str(pk, "status", "stop");
    assert_wrote(&f, &h);
    assert_int_equal(d.rid, 3);
    assert_str(d.text, "hi");
    assert_ids(d.token_ids.raw, ids, 2);
    assert_int_equal(d.gstatus, ZI_GEN_STOP);
    assert_lp(d.logprobs.raw);
    assert_lp(d.prompt_logprobs.raw);
    assert_ids(d.prompt_token_ids.raw, pids, 2);
    assert_non_null(d.prompt_text_obj);
    assert_int_equal(d.prompt_text_obj->type, MSGPACK_OBJECT_STR);
    frame_free(&f);
    zi_logprobs_free(&lp);
    /* The plain one: five keys; then a text that is not a string. */
    zi_im_decoded t2 = {.rid = 3, .text = {"", 0}, .status = {"active", 6}};
    const msgpack_object *o = packed(&f, zi_im_decoded_pack(&t2, &f.m, &err), 5, ZI_IM_DECODED);
    assert_int_equal(zi_im_decoded_unpack(o, &d, &err), ZI_OK);
    assert_str(d.text, "");
    assert_null(d.logprobs.raw);
    assert_false(d.prompt_token_ids.set);
    assert_null(d.prompt_text_obj);
    frame_free(&f);
    pk = by_hand(&f, 4);
    zi_pack_kv_int(pk, "rid", 3);
    zi_pack_kv_int(pk, "text", 1);
    zi_pack_kv_int(pk, "token_ids", 1);
    zi_pack_kv_str(pk, "status", "active");
    assert_int_equal(zi_im_decoded_unpack(parsed(&f), &d, NULL), ZI_EINVAL);
    assert_int_equal(d.rid, 3);
    frame_free(&f);
}

static void test_rid_only(void **state) {
    (void)state;
    frame c, r;
    assert_rid(packed(&c, zi_im_cancel_pack(77, &c.m), 2, ZI_IM_CANCEL), 77);
    assert_rid(packed(&r, zi_im_release_pack(78, &r.m), 2, ZI_IM_RELEASE), 78);
    frame_free(&c);
    frame_free(&r);
}

/* tokenize, with and without add_special. */
static void test_tokenize(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_tokenize d;
    for (int k = 0; k < 2; k++) {
        zi_im_tokenize t = {.rid = 2, .text = {"xy", 2}, .has_add_special = k, .add_special = 0};
        const msgpack_object *o = packed(&f, zi_im_tokenize_pack(&t, &f.m), 3 + k, ZI_IM_TOKENIZE);
        assert_int_equal(zi_im_tokenize_unpack(o, &d, &err), ZI_OK);
        assert_int_equal(d.rid, 2);
        assert_str(d.text, "xy");
        assert_int_equal(d.has_add_special, k);
        assert_int_equal(d.add_special, !k); /* absent: true */
        frame_free(&f);
    }
    zi_pack_kv_int(by_hand(&f, 1), "text", 1);
    assert_refused(zi_im_tokenize_unpack(parsed(&f), &d, &err), &err, "text: not a string");
    frame_free(&f);
}

static void test_detokenize(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    int32_t ids[3] = {4, 5, 6};
    zi_im_detokenize t = {.rid = 2, .token_ids = {.v = ids, .n = 3}}, d;
    const msgpack_object *o = packed(&f, zi_im_detokenize_pack(&t, &f.m), 3, ZI_IM_DETOKENIZE);
    assert_int_equal(zi_im_detokenize_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 2);
    assert_own_ids(&d.token_ids, ids, 3);
    zi_im_ids_free(&d.token_ids);
    frame_free(&f);
    zi_pack_kv_int(by_hand(&f, 1), "rid", 1);
    assert_refused(zi_im_detokenize_unpack(parsed(&f), &d, &err), &err, "token_ids: missing");
    frame_free(&f);
}

/* A tokenizer's answer o (tokenized / detokenized, under key) as the
 * router reads it into *r and passes it on to the client in a result (in
 * f): returns the value the client reads. Neither has the other key. */
static const msgpack_object *pass_on(const msgpack_object *o, const char *key, zi_im_util_reply *r,
                                     frame *f) {
    zi_error err = {0};
    const char *other = strcmp(key, "text") ? "text" : "token_ids";
    char missing[32];
    snprintf(missing, sizeof missing, "%s: missing", other);
    assert_refused(zi_im_util_reply_unpack(o, other, r, &err), &err, missing);
    assert_int_equal(zi_im_util_reply_unpack(o, key, r, &err), ZI_OK);
    zi_im_result t = {.id = {"t", 1}, .key = key, .value = r->value_obj}, d, wrong;
    o = packed(f, zi_im_result_pack(&t, &f->m), 3, ZI_IM_UNKNOWN);
    assert_int_equal(zi_im_result_unpack(o, key, &d, &err), ZI_OK);
    assert_str(d.id, "t");
    assert_refused(zi_im_result_unpack(o, other, &wrong, &err), &err, missing);
    return d.value;
}

/* tokenized / detokenized, and the results of tokenize / detokenize that
 * pass their answers on. */
static void test_util_replies(void **state) {
    (void)state;
    frame src, f;
    zi_im_util_reply r;
    int32_t ids[3] = {4, 5, 6};
    zi_im_util_reply tk = {.rid = 9, .token_ids = {.v = ids, .n = 3}};
    const msgpack_object *o = packed(&src, zi_im_tokenized_pack(&tk, &src.m), 3, ZI_IM_TOKENIZED);
    assert_ids(pass_on(o, "token_ids", &r, &f), ids, 3);
    assert_int_equal(r.rid, 9);
    assert_ids(r.token_ids.raw, ids, 3);
    frame_free(&f);
    frame_free(&src);
    zi_im_util_reply dt = {.rid = 8, .text = {"abc", 3}};
    o = packed(&src, zi_im_detokenized_pack(&dt, &src.m), 3, ZI_IM_DETOKENIZED);
    assert_int_equal(pass_on(o, "text", &r, &f)->type, MSGPACK_OBJECT_STR);
    assert_int_equal(r.rid, 8);
    assert_str(r.text, "abc");
    assert_int_equal(r.value_obj->type, MSGPACK_OBJECT_STR);
    frame_free(&f);
    frame_free(&src);
}

static void test_start(void **state) {
    (void)state;
    zi_error err = {0};
    frame ctx, f;
    zi_pack_kv_int(by_hand(&ctx, 1), "max_length", 9);
    zi_im_start s = {.rid = 12, .context = parsed(&ctx)}, d;
    const msgpack_object *o = packed(&f, zi_im_start_pack(&s, &f.m), 3, ZI_IM_START);
    assert_int_equal(zi_im_start_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 12);
    int64_t v;
    assert_int_equal(zi_map_int(d.context, "max_length", &v, NULL), ZI_OK);
    assert_int_equal(v, 9);
    assert_true(d.prefix_key == 0); /* none sent */
    frame_free(&f);
    /* The prefix key, all 64 bits of it. */
    zi_im_start k = {.rid = 13, .context = ctx.o, .prefix_key = 0xF00000000000000BULL};
    o = packed(&f, zi_im_start_pack(&k, &f.m), 4, ZI_IM_START);
    assert_int_equal(zi_im_start_unpack(o, &d, &err), ZI_OK);
    assert_true(d.prefix_key == 0xF00000000000000BULL);
    frame_free(&f);
    /* No context, no rid. */
    zi_im_start bare = {.rid = 1};
    o = packed(&f, zi_im_start_pack(&bare, &f.m), 2, ZI_IM_START);
    assert_int_equal(zi_im_start_unpack(o, &d, &err), ZI_OK);
    assert_null(d.context);
    assert_true(d.prefix_key == 0);
    frame_free(&f);
    by_hand(&f, 0);
    assert_refused(zi_im_start_unpack(parsed(&f), &d, &err), &err, "rid: missing");
    frame_free(&f);
    frame_free(&ctx);
}

/* ---- router -> client ----------------------------------------------------- */

static void test_chunk(void **state) {
    (void)state;
    zi_error err = {0};
    frame src, f;
    zi_logprobs lp;
    make_lp(&lp);
    /* The decoded message whose fields the chunk carries. */
    zi_im_decoded d;
    full_decoded(&src, &lp, &d);
    for (int full = 0; full < 2; full++) {
        zi_im_chunk c = {.id = {"req-1", 5}, .text = d.text, .token_ids = d.token_ids.raw}, back;
        if (full) {
            c.logprobs = d.logprobs.raw;
            c.prompt_token_ids = d.prompt_token_ids.raw;
            c.prompt_logprobs = d.prompt_logprobs.raw;
            c.prompt_text = d.prompt_text_obj;
            c.resumed = true; /* the first chunk after a failover */
        }
        const msgpack_object *o =
            packed(&f, zi_im_chunk_pack(&c, &f.m), full ? 9 : 4, ZI_IM_UNKNOWN);
        assert_int_equal(zi_im_chunk_unpack(o, &back, &err), ZI_OK);
        assert_str(back.id, "req-1");
        assert_str(back.text, "hi");
        assert_ids(back.token_ids, DEC_IDS, 2);
        if (full) {
            assert_lp(back.logprobs);
            assert_lp(back.prompt_logprobs);
            assert_ids(back.prompt_token_ids, DEC_PIDS, 2);
            assert_int_equal(back.prompt_text->type, MSGPACK_OBJECT_STR);
            assert_true(back.resumed);
        } else {
            assert_false(back.resumed); /* absent unless true */
            assert_null(back.logprobs);
            assert_null(back.prompt_token_ids);
            assert_null(back.prompt_logprobs);
            assert_null(back.prompt_text);
        }
        zi_im_final wrong;
        assert_refused(zi_im_final_unpack(o, &wrong, &err), &err, "event: not \"final\"");
        frame_free(&f);
    }
    frame_free(&src);
    zi_logprobs_free(&lp);
}

static void test_final(void **state) {
    (void)state;
    zi_error err = {0};
    frame f, h, echo;
    zi_logprobs lp;
    make_lp(&lp);
    int32_t pids[2] = {1, 2};
    /* The echoed prompt, as the router keeps it. */
    msgpack_packer *pk = by_hand(&echo, 2);
    zi_pack_str(pk, "prompt_token_ids");
    zi_codec_pack_tokens(pk, pids, 2, NULL);
    zi_pack_kv_str(pk, "prompt_text", "ab");
    const msgpack_object *eo = parsed(&echo);
    zi_im_final t = {.id = {"x", 1},
                     .status = {"stop", 4},
                     .index = 2,
                     .prompt_tokens = 5,
                     .completion_tokens = 6,
                     .has_text = true,
                     .text = {"done", 4},
                     .logprobs = {.lp = &lp},
                     .prompt_token_ids = zi_map_get(eo, "prompt_token_ids"),
                     .prompt_text = zi_map_get(eo, "prompt_text")},
                d;
    const msgpack_object *o = packed(&f, zi_im_final_pack(&t, &f.m, &err), 9, ZI_IM_UNKNOWN);
    /* The final frame the router counted by hand before imsg: 6 entries,
     * plus logprobs, plus the echoed prompt's keys. */
    pk = by_hand(&h, 9);
    zi_pack_kv_str(pk, "id", "x");
    zi_pack_kv_str(pk, "event", "final");
    zi_pack_kv_str(pk, "status", "stop");
    zi_pack_kv_int(pk, "index", 2);
    zi_pack_str(pk, "usage");
    msgpack_pack_map(pk, 2);
    zi_pack_kv_int(pk, "prompt_tokens", 5);
    zi_pack_kv_int(pk, "completion_tokens", 6);
    zi_pack_kv_str(pk, "text", "done");
    zi_pack_str(pk, "logprobs");
    zi_codec_pack_logprobs(pk, &lp, NULL);
    zi_pack_str(pk, "prompt_token_ids");
    zi_codec_pack_tokens(pk, pids, 2, NULL);
    zi_pack_kv_str(pk, "prompt_text", "ab");
    assert_wrote(&f, &h);
    assert_int_equal(zi_im_final_unpack(o, &d, &err), ZI_OK);
    assert_str(d.id, "x");
    assert_str(d.status, "stop");
    assert_int_equal(d.index, 2);
    assert_int_equal(d.prompt_tokens, 5);
    assert_int_equal(d.completion_tokens, 6);
    assert_true(d.has_text);
    assert_str(d.text, "done");
    assert_lp(d.logprobs.raw);
    assert_ids(d.prompt_token_ids, pids, 2);
    assert_int_equal(d.prompt_text->type, MSGPACK_OBJECT_STR);
    assert_null(d.prompt_logprobs);
    frame_free(&f);
    /* Streamed: five keys, whatever else is set. */
    t.has_text = false;
    o = packed(&f, zi_im_final_pack(&t, &f.m, &err), 5, ZI_IM_UNKNOWN);
    assert_int_equal(zi_im_final_unpack(o, &d, &err), ZI_OK);
    assert_false(d.has_text);
    assert_null(d.logprobs.raw);
    assert_null(d.prompt_token_ids);
    frame_free(&f);
    frame_free(&echo);
    zi_logprobs_free(&lp);
}

static void test_client_error(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_client_error d;
    for (int k = 0; k < 2; k++) {
        zi_im_client_error e = {.id = {"", 0}, .code = {"overloaded", 10}, .message = {"busy", 4}};
        if (k) e.field = (zi_im_str){"id", 2};
        const msgpack_object *o =
            packed(&f, zi_im_client_error_pack(&e, &f.m), 4 + k, ZI_IM_UNKNOWN);
        assert_int_equal(zi_im_client_error_unpack(o, &d, &err), ZI_OK);
        assert_str(d.id, "");
        assert_str(d.code, "overloaded");
        assert_str(d.message, "busy");
        if (k)
            assert_str(d.field, "id");
        else
            assert_null(d.field.p);
        frame_free(&f);
    }
}

static void test_health(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_health t = {.id = {"h", 1}, .status = {"ok", 2}, .prefix_hit_rate = 0.25}, d;
    /* The counts 1, 2, 3, 4: a swapped key shows. */
    int64_t *counts[4] = {&t.workers, &t.tokenizers, &t.waiting, &t.running};
    for (int i = 0; i < 4; i++) *counts[i] = i + 1;
    for (int i = 0; i < ZI_N_KV_STATS; i++) t.kv[i] = 10 * i;
    const msgpack_object *o = packed(&f, zi_im_health_pack(&t, &f.m), 8, ZI_IM_UNKNOWN);
    assert_int_equal(zi_map_get(o, "kv")->via.map.size, ZI_N_KV_STATS + 1);
    assert_int_equal(zi_im_health_unpack(o, &d, &err), ZI_OK);
    assert_str(d.id, "h");
    assert_str(d.status, "ok");
    const int64_t got[4] = {d.workers, d.tokenizers, d.waiting, d.running};
    for (int i = 0; i < 4; i++) assert_int_equal(got[i], i + 1);
    for (int i = 0; i < ZI_N_KV_STATS; i++) assert_int_equal(d.kv[i], 10 * i);
    assert_true(d.prefix_hit_rate == 0.25);
    frame_free(&f);
}

/* metrics: every counter, histogram and worker comes back; observations
 * land in the first bucket whose bound is not below them. */
static void test_metrics(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_metrics t, d;
    memset(&t, 0, sizeof t);
    t.id = (zi_im_str){"x", 1};
    t.running = 1, t.waiting = 2, t.prompt_tokens = 30, t.generation_tokens = 40;
    for (int k = 0; k < ZI_IM_N_FIN; k++) t.finished[k] = 100 + k;
    zi_im_hist_observe(&t.hist[ZI_IM_HIST_TTFT], 0.001);  /* on the first bound */
    zi_im_hist_observe(&t.hist[ZI_IM_HIST_TTFT], 0.0011); /* just above it */
    zi_im_hist_observe(&t.hist[ZI_IM_HIST_E2E], 1e9);     /* above every bound */
    t.n_workers = 2;
    for (int w = 0; w < 2; w++)
        for (int k = 0; k < ZI_N_KV_STATS; k++) t.worker_kv[w][k] = 1000 * w + k;
    const msgpack_object *o = packed(&f, zi_im_metrics_pack(&t, &f.m), 10, ZI_IM_UNKNOWN);
    assert_int_equal(zi_im_metrics_unpack(o, &d, &err), ZI_OK);
    assert_str(d.id, "x");
    assert_int_equal(d.running, 1);
    assert_int_equal(d.waiting, 2);
    assert_int_equal(d.prompt_tokens, 30);
    assert_int_equal(d.generation_tokens, 40);
    for (int k = 0; k < ZI_IM_N_FIN; k++) assert_int_equal(d.finished[k], 100 + k);
    assert_int_equal(d.hist[ZI_IM_HIST_TTFT].count[0], 1);
    assert_int_equal(d.hist[ZI_IM_HIST_TTFT].count[1], 1);
    assert_int_equal(d.hist[ZI_IM_HIST_E2E].count[ZI_IM_HIST_BUCKETS], 1);
    assert_true(d.hist[ZI_IM_HIST_TTFT].sum == 0.001 + 0.0011);
    assert_int_equal(d.n_workers, 2);
    assert_int_equal(d.worker_kv[1][ZI_KV_USED], 1000 + ZI_KV_USED);
    frame_free(&f);
}

/* models: none, then two (one with its state, one from an older router
 * without). */
static void test_models(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_models t = {.id = {"m", 1}}, d;
    for (int k = 0; k < 2; k++) {
        if (k) {
            t.n = 2;
            t.v[0] = (zi_im_model_entry){{"a", 1}, 100, 10, {"loaded", 6}, true,
                                         1,        2,   3,  {"unload", 6}, 5000};
            t.v[1] =
                (zi_im_model_entry){{"bb", 2}, 200, 20, {NULL, 0}, false, 0, 0, 0, {NULL, 0}, -1};
        }
        const msgpack_object *o = packed(&f, zi_im_models_pack(&t, &f.m), 3, ZI_IM_UNKNOWN);
        assert_int_equal(zi_im_models_unpack(o, &d, &err), ZI_OK);
        assert_str(d.id, "m");
        assert_int_equal(d.n, t.n);
        for (size_t i = 0; i < d.n; i++) {
            assert_int_equal(d.v[i].name.n, t.v[i].name.n);
            assert_memory_equal(d.v[i].name.p, t.v[i].name.p, t.v[i].name.n);
            assert_int_equal(d.v[i].max_length, t.v[i].max_length);
            assert_int_equal(d.v[i].vocab, t.v[i].vocab);
            assert_int_equal(d.v[i].state.n, t.v[i].state.n);
            assert_true((d.v[i].state.p == NULL) == (t.v[i].state.p == NULL));
            assert_int_equal(d.v[i].has_usage, t.v[i].has_usage);
            assert_int_equal(d.v[i].waiting + d.v[i].active + d.v[i].idle_ms,
                             t.v[i].waiting + t.v[i].active + t.v[i].idle_ms);
            assert_int_equal(d.v[i].want.n, t.v[i].want.n);
            assert_int_equal(d.v[i].keep_alive_ms, t.v[i].keep_alive_ms);
        }
        frame_free(&f);
    }
}

/* load_model / unload_model's result: the model and its status. */
static void test_model_status(void **state) {
    (void)state;
    zi_error err = {0};
    frame f;
    zi_im_model_status t = {{"x", 1}, {"b", 1}, {"unloading", 9}}, d;
    const msgpack_object *o = packed(&f, zi_im_model_status_pack(&t, &f.m), 4, ZI_IM_UNKNOWN);
    assert_int_equal(zi_im_model_status_unpack(o, &d, &err), ZI_OK);
    assert_str(d.id, "x");
    assert_str(d.model, "b");
    assert_str(d.status, "unloading");
    frame_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder_counts), cmocka_unit_test(test_builder_map32),
        cmocka_unit_test(test_failed_message), cmocka_unit_test(test_types),
        cmocka_unit_test(test_register),       cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_lora),           cmocka_unit_test(test_backend_error),
        cmocka_unit_test(test_encode_encoded), cmocka_unit_test(test_tokens_decode),
        cmocka_unit_test(test_decoded),        cmocka_unit_test(test_rid_only),
        cmocka_unit_test(test_tokenize),       cmocka_unit_test(test_detokenize),
        cmocka_unit_test(test_util_replies),   cmocka_unit_test(test_start),
        cmocka_unit_test(test_chunk),          cmocka_unit_test(test_final),
        cmocka_unit_test(test_client_error),   cmocka_unit_test(test_health),
        cmocka_unit_test(test_models),         cmocka_unit_test(test_model_status),
        cmocka_unit_test(test_metrics),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
