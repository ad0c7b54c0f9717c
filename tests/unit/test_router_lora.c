/*
 * test_router_lora.c - cmocka tests for the router core's LoRA adapter ops
 * (router/router_lora.c), driven by scripted events with no sockets, as
 * test_router_core.c drives the rest: load_lora_adapter sent to every
 * worker of the model and answered once all have (a failure on one gives
 * the adapter back on the others), a worker that dies during the op, an
 * unload refused while a request in flight names the adapter, the table
 * (lora_adapters) and its replay to a worker that registers without a
 * runtime adapter, before any request reaches it; global scales
 * (set_lora_scales) added to requests that name no adapter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "imsg.h"
#include "imsg_lora.h"
#include "router_core.h"
#include "router_impl.h"
#include "router_sim.h"

static void from_client(sim *s, zi_imap *b) {
    from_client_imap(s, "cli", b);
}

/* A backend of model "m" registers; a worker with the adapter names
 * names[0..n). */
static void reg(sim *s, const char *ident, bool worker, const char *const *names, size_t n) {
    sim_register(s, ident, worker, 2, "m", 2048, names, n);
}

static void sim_up(sim *s) {
    sim_init(s);
    assert_int_equal(zi_router_add_model(&s->rt, "m", NULL), ZI_OK);
    reg(s, "tok0", false, NULL, 0);
    reg(s, "wrk0", true, NULL, 0);
    reg(s, "wrk1", true, NULL, 0);
}

/* A frame sent, parsed into u (the caller destroys it). */
static const msgpack_object *frame_at(const sim *s, size_t i, msgpack_unpacked *u) {
    zi_error err = {0};
    assert_int_equal(zi_msgpack_parse(s->out[i].data, s->out[i].len, NULL, u, &err), ZI_OK);
    return &u->data;
}

/* The last "lora" message sent to ident from index `from` on: its rid and
 * action (false when none). */
static bool last_lora(const sim *s, size_t from, const char *ident, int64_t *rid, bool *load) {
    bool found = false;
    for (size_t i = from; i < s->n_out; i++) {
        if (strcmp(s->out[i].ident, ident)) continue;
        msgpack_unpacked u;
        const msgpack_object *o = frame_at(s, i, &u);
        if (zi_im_type_of(o) == ZI_IM_LORA) {
            zi_im_lora lm;
            zi_error err = {0};
            assert_int_equal(zi_im_lora_unpack(o, &lm, &err), ZI_OK);
            *rid = lm.rid, *load = lm.load, found = true;
        }
        msgpack_unpacked_destroy(&u);
    }
    return found;
}

/* The last client frame: its event, and code (an error's) or status. */
static void last_reply(const sim *s, char *event, char *what, size_t cap) {
    for (size_t i = s->n_out; i-- > 0;) {
        if (s->out[i].side != ZI_ROUTER_CLIENT) continue;
        msgpack_unpacked u;
        const msgpack_object *o = frame_at(s, i, &u);
        const char *p;
        size_t n;
        event[0] = what[0] = '\0';
        if (zi_map_str(o, "event", &p, &n, NULL) == ZI_OK) snprintf(event, cap, "%.*s", (int)n, p);
        const char *key = !strcmp(event, "error") ? "code" : "status";
        if (zi_map_str(o, key, &p, &n, NULL) == ZI_OK) snprintf(what, cap, "%.*s", (int)n, p);
        msgpack_unpacked_destroy(&u);
        return;
    }
    fail_msg("no client frame");
}

/* The last client frame is event with code (an error's) or status what. */
static void expect_reply(const sim *s, const char *event, const char *what) {
    char ev[32], wh[32];
    last_reply(s, ev, wh, sizeof ev);
    assert_string_equal(ev, event);
    assert_string_equal(wh, what);
}

static void lora_op(sim *s, const char *op, const char *name, const char *path) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", op);
    zi_imap_str(&b, "id", "x");
    zi_imap_str(&b, "lora_name", name);
    if (path) zi_imap_str(&b, "lora_path", path);
    from_client(s, &b);
}

static void lora_done(sim *s, const char *ident, int64_t rid, const char *code, int64_t id,
                      const char *const *names, size_t n) {
    zi_msg m;
    zi_im_lora_done d = {.rid = rid,
                         .ok = code == NULL,
                         .code = {code, code ? strlen(code) : 0},
                         .message = {code ? "it failed" : NULL, code ? 9 : 0},
                         .id = id,
                         .names = names,
                         .n_names = n};
    assert_int_equal(zi_im_lora_done_pack(&d, &m), ZI_OK);
    from_backend(s, ident, &m);
}

/* How many adapters lora_adapters lists. */
static uint32_t n_listed(sim *s) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "lora_adapters");
    zi_imap_str(&b, "id", "l");
    from_client(s, &b);
    msgpack_unpacked u;
    const msgpack_object *o = frame_at(s, s->n_out - 1, &u);
    const msgpack_object *a = zi_map_get(o, "adapters");
    assert_non_null(a);
    uint32_t n = a->via.array.size;
    msgpack_unpacked_destroy(&u);
    return n;
}

/* A client asks to generate from "hello" as id, naming model (NULL:
 * none). */
static void gen(sim *s, const char *id, const char *model) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "generate");
    zi_imap_str(&b, "id", id);
    zi_imap_str(&b, "prompt", "hello");
    if (model) zi_imap_str(&b, "model_name", model);
    from_client(s, &b);
}

static const char *const AD[] = {"ad"};

/* A load answered by both workers; a failure on one gives it back on the
 * other and the client gets that error. */
static void test_load_fans_out(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    size_t mark = s.n_out;
    lora_op(&s, "load_lora_adapter", "ad", "/a.gguf");
    int64_t r0, r1;
    bool load;
    assert_true(last_lora(&s, mark, "wrk0", &r0, &load) && load);
    assert_true(last_lora(&s, mark, "wrk1", &r1, &load) && load);
    assert_int_equal(r0, r1);
    lora_done(&s, "wrk0", r0, NULL, 0, AD, 1);
    assert_int_equal(s.n_out, mark + 2); /* no reply before wrk1's answer */
    mark = s.n_out;
    lora_done(&s, "wrk1", r1, "invalid_request", -1, NULL, 0);
    expect_reply(&s, "error", "invalid_request");
    int64_t back;
    assert_true(last_lora(&s, mark, "wrk0", &back, &load)); /* given back */
    assert_false(load);
    assert_int_equal(back, 0);
    assert_false(last_lora(&s, mark, "wrk1", &back, &load));
    assert_int_equal(n_listed(&s), 0);
    /* again, both take it */
    mark = s.n_out;
    lora_op(&s, "load_lora_adapter", "ad", "/a.gguf");
    assert_true(last_lora(&s, mark, "wrk0", &r0, &load));
    lora_done(&s, "wrk0", r0, NULL, 0, AD, 1);
    lora_done(&s, "wrk1", r0, NULL, 0, AD, 1);
    expect_reply(&s, "result", "loaded");
    assert_int_equal(n_listed(&s), 1);
    sim_free(&s);
}

/* A worker that dies during the op no longer counts; one that registers
 * later without the adapter is sent it before any request. */
static void test_dead_worker_and_replay(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    size_t mark = s.n_out;
    lora_op(&s, "load_lora_adapter", "ad", "/a.gguf");
    int64_t rid;
    bool load;
    assert_true(last_lora(&s, mark, "wrk0", &rid, &load));
    lora_done(&s, "wrk0", rid, NULL, 0, AD, 1);
    assert_int_equal(zi_router_backend_gone(&s.rt, conn_of("wrk1")), ZI_OK);
    expect_reply(&s, "result", "loaded");
    mark = s.n_out;
    reg(&s, "wrk2", true, NULL, 0); /* restarted: no adapter */
    assert_true(last_lora(&s, mark, "wrk2", &rid, &load) && load);
    assert_int_equal(rid, 0);
    mark = s.n_out;
    reg(&s, "wrk3", true, AD, 1); /* started with it: nothing to send */
    assert_false(last_lora(&s, mark, "wrk3", &rid, &load));
    sim_free(&s);
}

/* An unload is refused while a request in flight names the adapter (here
 * as MODEL:ADAPTER, still waiting for its tokenizer); once it ended the
 * unload goes to the workers. An unknown adapter is not_found. */
static void test_unload_refused_in_use(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    char ev[32], what[32];
    reg(&s, "wrk0", true, AD, 1); /* again, now with a start-time adapter */
    reg(&s, "wrk1", true, AD, 1);
    gen(&s, "g", "m:ad");
    size_t mark = s.n_out;
    lora_op(&s, "unload_lora_adapter", "ad", NULL);
    expect_reply(&s, "error", "in_use");
    int64_t rid;
    bool load;
    assert_false(last_lora(&s, mark, "wrk0", &rid, &load));
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "cancel");
    zi_imap_str(&b, "id", "g");
    from_client(&s, &b);
    assert_int_equal(zi_req_table_count(&s.rt.reqs), 0);
    mark = s.n_out;
    lora_op(&s, "unload_lora_adapter", "ad", NULL);
    assert_true(last_lora(&s, mark, "wrk0", &rid, &load) && !load);
    lora_done(&s, "wrk0", rid, NULL, -1, NULL, 0);
    lora_done(&s, "wrk1", rid, NULL, -1, NULL, 0);
    expect_reply(&s, "result", "unloaded");
    assert_int_equal(n_listed(&s), 0);
    lora_op(&s, "unload_lora_adapter", "ad", NULL);
    last_reply(&s, ev, what, sizeof ev);
    assert_string_equal(what, "not_found");
    lora_op(&s, "load_lora_adapter", "a:b", "/x"); /* a name holds no ':' */
    last_reply(&s, ev, what, sizeof ev);
    assert_string_equal(what, "invalid_request");
    sim_free(&s);
}

/* The number of adapters in the last "encode" sent to tok0 and the first
 * one's name and scale. */
static size_t encoded_lora(const sim *s, char *name, size_t cap, double *scale) {
    for (size_t i = s->n_out; i-- > 0;) {
        if (strcmp(s->out[i].ident, "tok0")) continue;
        msgpack_unpacked u;
        const msgpack_object *o = frame_at(s, i, &u);
        if (zi_im_type_of(o) != ZI_IM_ENCODE) {
            msgpack_unpacked_destroy(&u);
            continue;
        }
        const msgpack_object *l = zi_map_get(zi_map_get(o, "request"), "lora");
        size_t n = l && l->type == MSGPACK_OBJECT_ARRAY ? l->via.array.size : 0;
        name[0] = '\0';
        if (n) {
            const char *p;
            size_t len;
            assert_int_equal(zi_map_str(&l->via.array.ptr[0], "name", &p, &len, NULL), ZI_OK);
            snprintf(name, cap, "%.*s", (int)len, p);
            *scale = zi_map_get(&l->via.array.ptr[0], "scale")->via.f64;
        }
        msgpack_unpacked_destroy(&u);
        return n;
    }
    fail_msg("no encode");
    return 0;
}

/* set_lora_scales: requests naming no adapter run the applied ones; an
 * adapter named in the model wins; [] clears them; an unknown one is
 * refused. */
static void test_global_scales(void **state) {
    (void)state;
    sim s;
    sim_up(&s);
    static const char *const two[] = {"ad", "bd"};
    reg(&s, "wrk0", true, two, 2);
    char ev[32], what[32], name[64];
    double scale = 0;
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "set_lora_scales");
    zi_imap_str(&b, "id", "s");
    msgpack_packer *pk = zi_imap_key(&b, "adapters");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 2);
    msgpack_pack_str(pk, 2);
    msgpack_pack_str_body(pk, "id", 2);
    msgpack_pack_int(pk, 1);
    msgpack_pack_str(pk, 5);
    msgpack_pack_str_body(pk, "scale", 5);
    msgpack_pack_double(pk, 0.5);
    from_client(&s, &b);
    last_reply(&s, ev, what, sizeof ev);
    assert_string_equal(ev, "result");
    gen(&s, "g1", NULL);
    assert_int_equal(encoded_lora(&s, name, sizeof name, &scale), 1);
    assert_string_equal(name, "bd");
    assert_true(scale == 0.5);
    gen(&s, "g2", "m:ad"); /* its own adapter, alone */
    assert_int_equal(encoded_lora(&s, name, sizeof name, &scale), 1);
    assert_string_equal(name, "ad");
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "set_lora_scales");
    zi_imap_str(&b, "id", "s2");
    pk = zi_imap_key(&b, "adapters");
    msgpack_pack_array(pk, 0);
    from_client(&s, &b);
    gen(&s, "g3", NULL);
    assert_int_equal(encoded_lora(&s, name, sizeof name, &scale), 0);
    zi_imap_init(&b);
    zi_imap_str(&b, "op", "set_lora_scales");
    zi_imap_str(&b, "id", "s3");
    pk = zi_imap_key(&b, "adapters");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    msgpack_pack_str(pk, 2);
    msgpack_pack_str_body(pk, "id", 2);
    msgpack_pack_int(pk, 7);
    from_client(&s, &b);
    expect_reply(&s, "error", "invalid_request");
    sim_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_fans_out),
        cmocka_unit_test(test_dead_worker_and_replay),
        cmocka_unit_test(test_unload_refused_in_use),
        cmocka_unit_test(test_global_scales),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
