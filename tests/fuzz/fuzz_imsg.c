/*
 * fuzz_imsg.c - libFuzzer entry point for the internal message decoders
 * (protocol/imsg.h): every zi_im_*_unpack, as the router, tokenizer and
 * worker run them on a frame from a backend or the router.
 *
 * The input is one frame. It is parsed as the processes do
 * (zi_msgpack_parse with the default limits), its type read
 * (zi_im_type_of) and its rid (zi_im_rid); then, whatever its type, every
 * decoder is run on it (a hostile peer chooses the type, so each decoder
 * must stand any map), and what the receivers decode further is decoded
 * too: encode's request (zi_codec_decode_request), encoded's and start's
 * context (zi_codec_decode_text_context), the token ids of tokens and
 * decoded (zi_codec_decode_tokens), their log probabilities
 * (zi_codec_decode_logprobs). Promises checked: a failing decoder leaves
 * a non-empty message; strings it returns point into the frame or its
 * own buffers; what it allocates is freed by its free function (leaks
 * are LeakSanitizer's findings). A broken promise calls __builtin_trap().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "imsg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

typedef struct span {
    const uint8_t *p;
    size_t n;
} span;

/* A string a decoder returned: absent, empty (a static "" then), or
 * inside the frame. */
static void check_str(span f, zi_im_str s) {
    if (!s.p || s.n == 0) return;
    CHECK((const uint8_t *)s.p >= f.p && (const uint8_t *)s.p + s.n <= f.p + f.n);
}

static void check_fail(int rc, const zi_error *err) {
    if (rc != ZI_OK) CHECK(err->msg[0] != '\0');
}

static void tokens_deep(const zi_im_ids *ids, const zi_im_lps *lps, const zi_codec_limits *lim) {
    zi_error err = {0};
    if (ids->raw) {
        int32_t *v = NULL;
        size_t n = 0;
        check_fail(zi_codec_decode_tokens(ids->raw, lim, "token_ids", &v, &n, &err), &err);
        free(v);
    }
    if (lps->raw) {
        zi_logprobs lp;
        zi_error lerr = {0};
        int rc = zi_codec_decode_logprobs(lps->raw, lim, "logprobs", &lp, &lerr);
        check_fail(rc, &lerr);
        if (rc == ZI_OK) zi_logprobs_free(&lp);
    }
}

static void context_deep(const msgpack_object *c, const zi_codec_limits *lim) {
    if (!c) return;
    zi_text_context ctx;
    zi_error err = {0};
    int rc = zi_codec_decode_text_context(c, lim, "context", &ctx, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) zi_text_context_free(&ctx);
}

static void all_decoders(span f, const msgpack_object *o, const zi_codec_limits *lim) {
    zi_error err = {0};
    int rc;
    int64_t rid;
    check_fail(zi_im_rid(o, &rid, &err), &err);

    zi_im_register reg;
    zi_im_register_unpack(o, &reg);
    check_str(f, reg.model);
    CHECK(reg.slots >= 1 && reg.slots <= 65535 && reg.max_length >= 2);
    /* a worker's live sequences, as a restarted router reads them */
    for (uint32_t i = 0; reg.live_obj && i < reg.live_obj->via.array.size; i++) {
        zi_im_live lv;
        zi_error lerr = {0};
        int lrc = zi_im_live_unpack(&reg.live_obj->via.array.ptr[i], &lv, &lerr);
        check_fail(lrc, &lerr);
        if (lrc == ZI_OK)
            CHECK(lv.rid > 0 && (const uint8_t *)lv.start >= f.p &&
                  (const uint8_t *)lv.start + lv.start_len <= f.p + f.n);
        zi_im_ids_free(&lv.token_ids);
    }

    zi_im_heartbeat hb;
    zi_im_heartbeat_unpack(o, &hb);

    zi_im_error ie;
    zi_im_error_unpack(o, &ie);
    if (ie.code) CHECK(ie.code == ie.code_buf && strlen(ie.code) < sizeof ie.code_buf);
    if (ie.message) CHECK(strlen(ie.message) < sizeof ie.message_buf);

    zi_im_encode enc;
    memset(&err, 0, sizeof err);
    rc = zi_im_encode_unpack(o, &enc, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK && enc.request_obj) {
        zi_request req;
        zi_error rerr = {0};
        rc = zi_codec_decode_request(enc.request_obj, lim, "request", &req, &rerr);
        check_fail(rc, &rerr);
        if (rc == ZI_OK) zi_request_free(&req);
    }

    zi_im_encoded ed;
    zi_im_encoded_unpack(o, &ed);
    context_deep(ed.context_obj, lim);

    zi_im_tokens tm;
    memset(&err, 0, sizeof err);
    rc = zi_im_tokens_unpack(o, &tm, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) {
        check_str(f, tm.status);
        tokens_deep(&tm.token_ids, &tm.logprobs, lim);
        tokens_deep(&tm.prompt_token_ids, &tm.prompt_logprobs, lim);
    }
    zi_im_tokens_free(&tm);

    memset(&err, 0, sizeof err);
    rc = zi_im_decode_unpack(o, &tm, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) CHECK(tm.token_ids.n == 0 || tm.token_ids.v != NULL);
    zi_im_tokens_free(&tm);

    zi_im_decoded dd;
    memset(&err, 0, sizeof err);
    rc = zi_im_decoded_unpack(o, &dd, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) {
        check_str(f, dd.text);
        tokens_deep(&dd.token_ids, &dd.logprobs, lim);
    }

    zi_im_tokenize tz;
    memset(&err, 0, sizeof err);
    rc = zi_im_tokenize_unpack(o, &tz, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) check_str(f, tz.text);

    zi_im_detokenize dz;
    memset(&err, 0, sizeof err);
    rc = zi_im_detokenize_unpack(o, &dz, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) zi_im_ids_free(&dz.token_ids);

    zi_im_util_reply ur;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_util_reply_unpack(o, "token_ids", &ur, &err), &err);
    memset(&err, 0, sizeof err);
    check_fail(zi_im_util_reply_unpack(o, "text", &ur, &err), &err);

    zi_im_start st;
    memset(&err, 0, sizeof err);
    rc = zi_im_start_unpack(o, &st, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) context_deep(st.context, lim);

    /* the router's replies, as clients (zinfer-http, the C client) read them */
    zi_im_chunk ch;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_chunk_unpack(o, &ch, &err), &err);
    zi_im_final fi;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_final_unpack(o, &fi, &err), &err);
    zi_im_client_error ce;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_client_error_unpack(o, &ce, &err), &err);
    zi_im_health he;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_health_unpack(o, &he, &err), &err);
    static zi_im_metrics me; /* large; one input at a time */
    memset(&err, 0, sizeof err);
    rc = zi_im_metrics_unpack(o, &me, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) CHECK(me.n_workers <= ZI_IM_MAX_WORKERS);
    zi_im_models ms;
    memset(&err, 0, sizeof err);
    rc = zi_im_models_unpack(o, &ms, &err);
    check_fail(rc, &err);
    if (rc == ZI_OK) CHECK(ms.n <= ZI_IM_MAX_MODELS);
    zi_im_result re;
    memset(&err, 0, sizeof err);
    check_fail(zi_im_result_unpack(o, "text", &re, &err), &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_codec_limits lim = zi_codec_limits_default();
    zi_error err = {0};
    msgpack_unpacked u;
    if (zi_msgpack_parse(data, size, &lim, &u, &err) != ZI_OK) {
        CHECK(err.msg[0] != '\0');
        return 0;
    }
    zi_im_type t = zi_im_type_of(&u.data);
    CHECK(t >= ZI_IM_UNKNOWN && t < ZI_IM_N_TYPES);
    if (t != ZI_IM_UNKNOWN) CHECK(zi_im_type_name(t) != NULL);
    all_decoders((span){data, size}, &u.data, &lim);
    msgpack_unpacked_destroy(&u);
    return 0;
}
