/*
 * fuzz_frame.c - libFuzzer entry point for the router's client side: the
 * input is one client frame, handed to the real router core
 * (router/router_core.h, zi_router_client_frame) with a tokenizer and a
 * worker registered; the outbox records what the core sends.
 *
 * The promises checked: the core takes the frame (ZI_OK) and its
 * counters stay consistent (zi_router_check); the client gets at most
 * one frame, and none only when the frame started a request (the
 * tokenizer got its message), was a cancel, or was a resume that a router
 * just started keeps for its workers' registers; an "error" frame decodes
 * as one and has a one-line non-empty message; a generate request's
 * "encode" message decodes on the tokenizer's side, its request included
 * (zi_codec_decode_request: a request the router admitted must survive
 * its own encoding); at shutdown every request still in flight, and every
 * resume kept, gets exactly one "error" frame. Leaks are reported by libFuzzer's
 * LeakSanitizer. A broken promise calls __builtin_trap().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "imsg.h"
#include "router_core.h"
#include "router_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

/* What the core sent: counts per side, and the last frame to each. */
typedef struct outbox {
    int n_client, n_backend;
    char *last[2];
    size_t last_len[2];
} outbox;

static int fz_send(void *ctx, zi_router_side side, const unsigned char *ident, size_t ident_len,
                   bool delim, const void *buf, size_t len) {
    outbox *o = ctx;
    (void)ident, (void)ident_len, (void)delim;
    CHECK(len > 0);
    if (side == ZI_ROUTER_CLIENT)
        o->n_client++;
    else
        o->n_backend++;
    free(o->last[side]);
    o->last[side] = malloc(len);
    CHECK(o->last[side] != NULL);
    memcpy(o->last[side], buf, len);
    o->last_len[side] = len;
    return 0;
}

static int64_t fz_now(void *ctx) {
    (void)ctx;
    return 1000000;
}

static int64_t fz_wall(void *ctx) {
    (void)ctx;
    return 1;
}

static void add_backend(router *rt, const char *ident, bool worker) {
    zi_msg m;
    zi_im_register r = {.worker = worker, .slots = 2, .max_length = 4096, .vocab = 1000,
                        .model = {"m", 1}};
    CHECK(zi_im_register_pack(&r, &m) == ZI_OK);
    CHECK(zi_router_backend_frame(rt, (zi_router_conn){worker ? 2 : 1, 1},
                                  (const unsigned char *)ident, strlen(ident), m.sb.data,
                                  m.sb.size) == ZI_OK);
    zi_msg_free(&m);
}

/* An error frame the client got: it decodes, with a one-line message. */
static void check_client_frame(const char *buf, size_t len) {
    msgpack_unpacked u;
    zi_error err = {0};
    CHECK(zi_msgpack_parse(buf, len, NULL, &u, &err) == ZI_OK);
    if (zi_map_str_is(&u.data, "event", "error")) {
        zi_im_client_error e;
        CHECK(zi_im_client_error_unpack(&u.data, &e, &err) == ZI_OK);
        CHECK(e.message.n > 0 && !memchr(e.message.p, '\n', e.message.n));
    }
    msgpack_unpacked_destroy(&u);
}

/* The tokenizer's side of an "encode": it decodes, request and all. */
static void check_encode(const char *buf, size_t len) {
    msgpack_unpacked u;
    zi_error err = {0};
    CHECK(zi_msgpack_parse(buf, len, NULL, &u, &err) == ZI_OK);
    if (zi_map_str_is(&u.data, "type", "encode")) {
        zi_im_encode em;
        CHECK(zi_im_encode_unpack(&u.data, &em, &err) == ZI_OK);
        zi_codec_limits lim = zi_codec_limits_default();
        zi_request req;
        CHECK(zi_codec_decode_request(em.request_obj, &lim, "request", &req, &err) == ZI_OK);
        zi_request_free(&req);
    }
    msgpack_unpacked_destroy(&u);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    outbox o = {0};
    router rt;
    zi_router_io io = {.ctx = &o, .send = fz_send, .now_ms = fz_now, .wall_ns = fz_wall};
    CHECK(zi_router_init(&rt, &io, (zi_logger){.level = ZI_LOG_OFF}) == ZI_OK);
    add_backend(&rt, "t", false);
    add_backend(&rt, "w", true);
    int to_backends = o.n_backend;
    CHECK(zi_router_client_frame(&rt, (zi_router_conn){3, 1}, (const unsigned char *)"c", 1,
                                 size & 1, data, size) == ZI_OK);
    zi_error err = {0};
    CHECK(zi_router_check(&rt, &err) == ZI_OK);
    size_t in_flight = zi_req_table_count(&rt.reqs);
    CHECK(in_flight <= 1);
    CHECK(o.n_client <= 1);
    if (o.n_client == 1) {
        CHECK(in_flight == 0); /* a reply means nothing was started */
        check_client_frame(o.last[ZI_ROUTER_CLIENT], o.last_len[ZI_ROUTER_CLIENT]);
    }
    if (in_flight) { /* started: its tokenizer has its message */
        CHECK(o.n_backend == to_backends + 1);
        check_encode(o.last[ZI_ROUTER_BACKEND], o.last_len[ZI_ROUTER_BACKEND]);
    }
    /* only a cancel goes unanswered, and a resume, which a router that
     * has just started keeps until the workers register again */
    size_t waiting = rt.n_presume;
    CHECK(waiting <= 1);
    if (o.n_client == 0 && in_flight == 0) {
        zi_codec_limits lim = zi_codec_limits_default();
        msgpack_unpacked u;
        CHECK(zi_msgpack_parse(data, size, &lim, &u, &err) == ZI_OK);
        CHECK(zi_map_str_is(&u.data, "op", "cancel") ||
              (zi_map_str_is(&u.data, "op", "resume") && waiting == 1));
        msgpack_unpacked_destroy(&u);
    }
    int before = o.n_client;
    CHECK(zi_router_shutdown(&rt) == ZI_OK);
    CHECK(o.n_client == before + (int)in_flight + (int)waiting); /* each gets its answer */
    free(o.last[0]);
    free(o.last[1]);
    return 0;
}
