/*
 * fuzz_frame.c - libFuzzer entry point for the client frame decoder: what
 * the router does with one client frame (router_client.c's
 * on_client_frame) up to the point where it would touch its own state.
 *
 * The input is the frame's bytes. They are checked and parsed
 * (zi_msgpack_parse with the default limits); a refused frame still has
 * its id peeked (zi_msgpack_peek_str). A parsed map has its "id" and "op"
 * read, and by op: generate decodes the whole request
 * (zi_codec_decode_request) and its response_format
 * (zi_response_format_kind, the JSON schema text included), then encodes
 * it again and decodes the bytes (a decoded request must survive its own
 * encoding); tokenize/detokenize read text / token_ids. The promises
 * checked: a failure leaves a one-line non-empty message, a success frees
 * cleanly (leaks are reported by libFuzzer's LeakSanitizer), and the
 * round trip succeeds. A broken promise calls __builtin_trap().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "response_format.h"
#include "utf8.h"
#include "wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static void check_err(const zi_error *err) {
    CHECK(err->msg[0] != '\0');
    CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL);
}

static void generate(const msgpack_object *o, const zi_codec_limits *lim) {
    zi_request req;
    zi_error err = {0};
    if (zi_codec_decode_request(o, lim, "", &req, &err) != ZI_OK) {
        check_err(&err);
        return;
    }
    int kind = ZI_RF_NONE;
    char *schema = NULL;
    zi_error rerr = {0};
    if (zi_response_format_kind(&req.response_format, &kind, &schema, &rerr) != ZI_OK)
        check_err(&rerr);
    free(schema);
    /* The router re-encodes the request for the tokenizer: it must decode. */
    char *buf = NULL;
    size_t len = 0;
    zi_error eerr = {0};
    if (zi_codec_request_to_bytes(&req, &buf, &len, &eerr) == ZI_OK) {
        zi_request back;
        zi_error berr = {0};
        int rc = zi_codec_request_from_bytes(buf, len, lim, &back, &berr);
        CHECK(rc == ZI_OK);
        zi_request_free(&back);
        free(buf);
    } else {
        check_err(&eerr); /* e.g. a NaN that cannot be written */
    }
    zi_request_free(&req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_codec_limits lim = zi_codec_limits_default();
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(data, size, &lim, &u, &err) != ZI_OK) {
        check_err(&err);
        const char *id;
        size_t n;
        if (zi_msgpack_peek_str(data, size, "id", &id, &n)) {
            CHECK(id >= (const char *)data && id + n <= (const char *)data + size);
            (void)zi_utf8_valid(id, n);
        }
        return 0;
    }
    const msgpack_object *o = &u.data;
    const char *id = NULL, *op = NULL;
    size_t id_len = 0, op_len = 0;
    if (o->type == MSGPACK_OBJECT_MAP && zi_map_str(o, "id", &id, &id_len, &err) == ZI_OK &&
        zi_map_str(o, "op", &op, &op_len, &err) == ZI_OK) {
        (void)zi_utf8_valid(id, id_len);
        if (op_len == 8 && !memcmp(op, "generate", 8)) {
            generate(o, &lim);
        } else if (op_len == 10 && !memcmp(op, "detokenize", 10)) {
            const msgpack_object *v = zi_map_get(o, "token_ids");
            int32_t *ids = NULL;
            size_t n = 0;
            if (v && zi_codec_decode_tokens(v, &lim, "token_ids", &ids, &n, &err) != ZI_OK)
                check_err(&err);
            free(ids);
        } else if (op_len == 8 && !memcmp(op, "tokenize", 8)) {
            const msgpack_object *v = zi_map_get(o, "text");
            if (v && v->type == MSGPACK_OBJECT_STR)
                (void)zi_utf8_valid(v->via.str.ptr, v->via.str.size);
        }
    } else if (o->type == MSGPACK_OBJECT_MAP) {
        check_err(&err);
    }
    msgpack_unpacked_destroy(&u);
    return 0;
}
