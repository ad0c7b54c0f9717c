/*
 * test_codec.c - cmocka tests for the codec (protocol/codec.h: codec_scan.c,
 * codec_fields.c, codec_decode.c, codec_encode.c): what it must accept.
 *
 * Round trips of every type with non-default values; what the encoders
 * refuse; the exact bytes of the numpy-style arrays; decoding of what a
 * Python peer sends (int32 arrays, plain lists, a minimal TextContext whose
 * indices are derived). What the codec must refuse is in
 * test_codec_malformed.c; the helpers both use in test_codec_util.h.
 */
#include "test_codec_util.h"

#include <stdio.h>

static void assert_sampling_equal(const zi_sampling_params *a, const zi_sampling_params *b) {
    assert_int_equal(a->top_k, b->top_k);
    assert_true(a->top_p == b->top_p);
    assert_true(a->min_p == b->min_p);
    assert_true(a->temperature == b->temperature);
    assert_true(a->frequency_penalty == b->frequency_penalty);
    assert_true(a->presence_penalty == b->presence_penalty);
    assert_true(a->repetition_penalty == b->repetition_penalty);
    assert_int_equal(a->max_new_tokens, b->max_new_tokens);
    assert_int_equal(a->min_new_tokens, b->min_new_tokens);
    assert_int_equal(a->ignore_eos, b->ignore_eos);
    assert_int_equal(a->stop.n, b->stop.n);
    for (size_t i = 0; i < a->stop.n; i++) {
        assert_int_equal(a->stop.v[i].len, b->stop.v[i].len);
        assert_memory_equal(a->stop.v[i].p, b->stop.v[i].p, a->stop.v[i].len);
    }
    assert_int_equal(a->stop_token_ids.n, b->stop_token_ids.n);
    for (size_t i = 0; i < a->stop_token_ids.n; i++)
        assert_int_equal(a->stop_token_ids.v[i], b->stop_token_ids.v[i]);
    assert_int_equal(a->detokenize, b->detokenize);
    assert_true(a->seed == b->seed);
    assert_int_equal(a->logit_bias.n, b->logit_bias.n);
    for (size_t i = 0; i < a->logit_bias.n; i++) {
        assert_int_equal(a->logit_bias.v[i].id, b->logit_bias.v[i].id);
        assert_true(a->logit_bias.v[i].bias == b->logit_bias.v[i].bias);
    }
}

/* ---- round trips ----------------------------------------------------------- */

/* Decodes sampling parameters built from fmt; returns the status. */
static int decode_sp(zi_sampling_params *out, zi_error *e, const char *fmt, ...) {
    msgpack_sbuffer sb = sb_new();
    va_list ap;
    va_start(ap, fmt);
    vbuild(&sb, fmt, ap);
    va_end(ap);
    msgpack_unpacked u;
    parse_ok(&sb, &u);
    int rc = zi_codec_decode_sampling_params(&u.data, NULL, "sampling_params", out, e);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* logit_bias: integer and decimal-string keys, numbers in [-100, 100], each
 * id once, at most ZI_LOGIT_BIAS_MAX entries; nil and {} are none. */
static void test_logit_bias(void **state) {
    (void)state;
    zi_sampling_params sp;
    zi_error e = {0};
    assert_int_equal(decode_sp(&sp, &e, "M s M i d s i s f", 1, "logit_bias", 3, 5ll, -100.0, "17",
                               3ll, "0", 0.5),
                     ZI_OK);
    assert_int_equal(sp.logit_bias.n, 3);
    assert_int_equal(sp.logit_bias.v[0].id, 5);
    assert_true(sp.logit_bias.v[0].bias == -100.0f);
    assert_int_equal(sp.logit_bias.v[1].id, 17);
    assert_true(sp.logit_bias.v[1].bias == 3.0f);
    assert_int_equal(sp.logit_bias.v[2].id, 0);
    assert_true(sp.logit_bias.v[2].bias == 0.5f);
    zi_sampling_params cp;
    assert_int_equal(zi_sampling_params_copy(&cp, &sp, &e), ZI_OK);
    assert_int_equal(cp.logit_bias.n, 3);
    assert_int_equal(cp.logit_bias.v[1].id, 17);
    zi_sampling_params_free(&cp);
    zi_sampling_params_free(&sp);
    assert_int_equal(decode_sp(&sp, &e, "M s n", 1, "logit_bias"), ZI_OK);
    assert_int_equal(sp.logit_bias.n, 0);
    assert_int_equal(decode_sp(&sp, &e, "M s M", 1, "logit_bias", 0), ZI_OK);
    assert_int_equal(sp.logit_bias.n, 0);

    static const struct {
        const char *key; /* NULL: the integer below */
        long long ikey;
        double bias;
        const char *want;
    } bad[] = {
        {NULL, -3, 1.0, "sampling_params.logit_bias: key -3 is not a token id"},
        {NULL, 3000000000ll, 1.0, "sampling_params.logit_bias: key 3000000000 is not a token id"},
        {"abc", 0, 1.0, "sampling_params.logit_bias: key \"abc\" is not a token id"},
        {"-1", 0, 1.0, "sampling_params.logit_bias: key \"-1\" is not a token id"},
        {"", 0, 1.0, "sampling_params.logit_bias: key \"\" is not a token id"},
        {"12345678901", 0, 1.0, "key \"12345678901\" is not a token id"},
        {"9", 0, 100.5, "sampling_params.logit_bias.9: bias 100.5 is outside [-100, 100]"},
        {NULL, 9, -101.0, "sampling_params.logit_bias.9: bias -101 is outside [-100, 100]"},
        {NULL, 9, NAN, "sampling_params.logit_bias.9: bias nan is outside [-100, 100]"},
        {NULL, 9, -INFINITY, "sampling_params.logit_bias.9: bias -inf is outside [-100, 100]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc =
            bad[i].key
                ? decode_sp(&sp, &e, "M s M s d", 1, "logit_bias", 1, bad[i].key, bad[i].bias)
                : decode_sp(&sp, &e, "M s M i d", 1, "logit_bias", 1, bad[i].ikey, bad[i].bias);
        assert_int_equal(rc, ZI_EINVAL);
        ERR_HAS(e, bad[i].want);
        assert_null(sp.logit_bias.v);
    }
    assert_int_equal(decode_sp(&sp, &e, "M s M i s", 1, "logit_bias", 1, 4ll, "x"), ZI_EINVAL);
    ERR_HAS(e, "sampling_params.logit_bias.4: expected a number, got a string");
    assert_int_equal(decode_sp(&sp, &e, "M s A", 1, "logit_bias", 0), ZI_EINVAL);
    ERR_HAS(e, "sampling_params.logit_bias: expected a map of token id to bias, got an array");
    assert_int_equal(decode_sp(&sp, &e, "M s M d d", 1, "logit_bias", 1, 1.0, 1.0), ZI_EINVAL);
    ERR_HAS(e, "sampling_params.logit_bias: key #0 is a float, not a token id");
    /* the same id as an integer and as a string */
    assert_int_equal(decode_sp(&sp, &e, "M s M i d s d", 1, "logit_bias", 2, 5ll, 1.0, "5", 2.0),
                     ZI_EINVAL);
    ERR_HAS(e, "sampling_params.logit_bias: token id 5 is given twice");

    /* the limit: 1024 entries pass, 1025 do not */
    for (int n = ZI_LOGIT_BIAS_MAX; n <= ZI_LOGIT_BIAS_MAX + 1; n++) {
        msgpack_sbuffer sb = sb_new();
        build(&sb, "M s M", 1, "logit_bias", n);
        for (int i = 0; i < n; i++) build(&sb, "i d", (long long)i, 1.0);
        msgpack_unpacked u;
        parse_ok(&sb, &u);
        int rc = zi_codec_decode_sampling_params(&u.data, NULL, "sampling_params", &sp, &e);
        if (n == ZI_LOGIT_BIAS_MAX) {
            assert_int_equal(rc, ZI_OK);
            assert_int_equal(sp.logit_bias.n, ZI_LOGIT_BIAS_MAX);
            zi_sampling_params_free(&sp);
        } else {
            assert_int_equal(rc, ZI_EINVAL);
            ERR_HAS(e, "sampling_params.logit_bias: 1025 entries exceed the limit of 1024");
        }
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void test_roundtrip_sampling(void **state) {
    (void)state;
    zi_sampling_params sp = odd_sampling(), back;
    msgpack_sbuffer sb = sb_new();
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    zi_error e = {0};
    assert_int_equal(zi_codec_pack_sampling_params(&pk, &sp, &e), ZI_OK);
    msgpack_unpacked u;
    parse_ok(&sb, &u);
    assert_int_equal(u.data.type, MSGPACK_OBJECT_MAP);
    assert_int_equal(u.data.via.map.size, 15); /* logit_bias only when set */
    assert_int_equal(zi_codec_decode_sampling_params(&u.data, NULL, NULL, &back, &e), ZI_OK);
    assert_sampling_equal(&sp, &back);
    msgpack_unpacked_destroy(&u);
    zi_sampling_params_free(&back);
    msgpack_sbuffer_destroy(&sb);

    /* Defaults: None fields go out as nil and come back as defaults; an
     * empty map decodes to the defaults. */
    zi_sampling_params def;
    zi_sampling_params_init(&def);
    sb = sb_new();
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_sampling_params(&pk, &def, &e), ZI_OK);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_sampling_params(&u.data, NULL, NULL, &back, &e), ZI_OK);
    assert_sampling_equal(&def, &back);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M", 0);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_sampling_params(&u.data, NULL, NULL, &back, &e), ZI_OK);
    assert_sampling_equal(&def, &back);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    /* An invalid struct is not encoded. */
    sp.top_p = 3;
    sb = sb_new();
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_sampling_params(&pk, &sp, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "sampling_params.top_p: 3 is outside (0, 1]");
    msgpack_sbuffer_destroy(&sb);
    zi_sampling_params_free(&sp);
}

static void test_roundtrip_request(void **state) {
    (void)state;
    zi_error e = {0};
    /* Text prompt, with every optional field set. */
    zi_request r, back;
    zi_request_init(&r);
    zi_string_set(&r.id, "req-7", 5, NULL);
    r.index = 3;
    zi_string_set(&r.model_name, "smollm2", 7, NULL);
    r.prompt_kind = ZI_PROMPT_TEXT;
    zi_string_set(&r.prompt_text, "Hello\0world", 11, NULL); /* NUL is text too */
    zi_sampling_params_free(&r.sampling_params);
    r.sampling_params = odd_sampling();
    r.logprobs = 5;
    r.echo = true;
    zi_str_list_push(&r.stop, "###", 3, NULL);
    r.stream = false;
    r.timestamp_ns = 1700000000123456789ll;
    zi_string_set(&r.request_path, "/v1/completions", 15, NULL);
    /* opaque fields: {"type": "json_object"},
     * [{"type": "function", "function": {"name": "f"}}], {"x": 1} */
    msgpack_sbuffer o1 = sb_new(), o2 = sb_new(), o3 = sb_new();
    build(&o1, "M s s", 1, "type", "json_object");
    build(&o2, "A M s s s M s s", 1, 2, "type", "function", "function", 1, "name", "f");
    build(&o3, "M s i", 1, "add_generation_prompt", 1ll);
    zi_bytes_set(&r.response_format, o1.data, o1.size, NULL);
    char *buf;
    size_t len;
    /* tools and chat_template_options need messages (the chat template). */
    zi_bytes_set(&r.tools, o2.data, o2.size, NULL);
    zi_bytes_set(&r.chat_template_options, o3.data, o3.size, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "tools: only used with messages (the chat template renders "
                               "them); this request has a prompt");
    free(buf);
    zi_request r2;
    zi_request_init(&r2);
    zi_string_set(&r2.id, "req-8", 5, NULL);
    zi_request_add_message(&r2, "user", "hi", 2, NULL);
    zi_bytes_set(&r2.tools, o2.data, o2.size, NULL);
    zi_bytes_set(&r2.chat_template_options, o3.data, o3.size, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r2, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.tools.len, o2.size);
    assert_memory_equal(back.tools.p, o2.data, o2.size);
    assert_int_equal(back.chat_template_options.len, o3.size);
    assert_memory_equal(back.chat_template_options.p, o3.data, o3.size);
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r2);
    zi_bytes_free(&r.tools);
    zi_bytes_free(&r.chat_template_options);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_string_equal(back.id.p, "req-7");
    assert_int_equal(back.index, 3);
    assert_string_equal(back.model_name.p, "smollm2");
    assert_int_equal(back.prompt_kind, ZI_PROMPT_TEXT);
    assert_int_equal(back.prompt_text.len, 11);
    assert_memory_equal(back.prompt_text.p, "Hello\0world", 11);
    assert_sampling_equal(&r.sampling_params, &back.sampling_params);
    assert_int_equal(back.logprobs, 5);
    assert_true(back.echo);
    assert_int_equal(back.stop.n, 1);
    assert_string_equal(back.stop.v[0].p, "###");
    assert_false(back.stream);
    assert_int_equal(back.timestamp_ns, 1700000000123456789ll);
    assert_string_equal(back.request_path.p, "/v1/completions");
    assert_int_equal(back.response_format.len, o1.size);
    assert_memory_equal(back.response_format.p, o1.data, o1.size);
    assert_int_equal(back.tools.len, 0);
    free(buf);
    zi_request_free(&back);
    msgpack_sbuffer_destroy(&o1);
    msgpack_sbuffer_destroy(&o2);
    msgpack_sbuffer_destroy(&o3);

    /* Token prompt. */
    zi_string_free(&r.prompt_text);
    r.prompt_kind = ZI_PROMPT_TOKENS;
    int32_t ids[4] = {1, 0, 49151, 2147483647};
    zi_i32_list_set(&r.prompt_tokens, ids, 4, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.prompt_kind, ZI_PROMPT_TOKENS);
    assert_int_equal(back.prompt_tokens.n, 4);
    assert_memory_equal(back.prompt_tokens.v, ids, sizeof ids);
    free(buf);
    zi_request_free(&back);

    /* Messages instead of a prompt; defaults elsewhere. */
    zi_request_free(&r);
    zi_string_set(&r.id, "m", 1, NULL);
    zi_request_add_message(&r, "system", "Be brief.", 9, NULL);
    zi_request_add_message(&r, "user", "Hi \xf0\x9f\x98\x80", 7, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.prompt_kind, ZI_PROMPT_NONE);
    assert_int_equal(back.n_messages, 2);
    assert_string_equal(back.messages[0].role.p, "system");
    assert_string_equal(back.messages[1].content.p, "Hi \xf0\x9f\x98\x80");
    assert_true(back.stream);
    assert_string_equal(back.request_path.p, "/");
    assert_int_equal(back.sampling_params.top_k, 1);
    free(buf);
    zi_request_free(&back);
    /* Neither prompt nor messages: refused on the way out too. */
    zi_request_free(&r);
    zi_string_set(&r.id, "m", 1, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    ERR_HAS(e, "exactly one of prompt and messages");
    zi_request_free(&r);
}
/* A tool-call round trip: an assistant message with tool_calls and no
 * content, then the tool's result, decoded, encoded and decoded again. */
/* The thinking budget travels in the request and the context; an
 * assistant's reasoning_content in its message, refused on other roles. */
/* images: bin values through encode and decode, byte for byte, with
 * messages and with a text prompt; the encoder's refusals. */
static void test_roundtrip_images(void **state) {
    (void)state;
    zi_error e = {0};
    static const uint8_t png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0xff};
    uint8_t big[70000];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7 + (i >> 8));
    zi_request r, back;
    zi_request_init(&r);
    zi_string_set(&r.id, "img-1", 5, NULL);
    zi_request_add_message(&r, "system", "You see images.", 15, NULL);
    const char *u = "first " ZI_MEDIA_MARKER "\nthen\n" ZI_MEDIA_MARKER;
    zi_request_add_message(&r, "user", u, strlen(u), NULL);
    assert_int_equal(zi_request_add_image(&r, png, sizeof png, &e), ZI_OK);
    assert_int_equal(zi_request_add_image(&r, big, sizeof big, &e), ZI_OK);
    assert_int_equal(zi_request_add_image(&r, png, 0, &e), ZI_EINVAL);
    assert_int_equal(r.n_images, 2);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.n_images, 2);
    assert_int_equal(back.images[0].len, sizeof png);
    assert_memory_equal(back.images[0].p, png, sizeof png);
    assert_int_equal(back.images[1].len, sizeof big);
    assert_memory_equal(back.images[1].p, big, sizeof big);
    /* encoded again: the same bytes (nothing lost or reordered) */
    char *buf2;
    size_t len2;
    assert_int_equal(zi_codec_request_to_bytes(&back, &buf2, &len2, &e), ZI_OK);
    assert_int_equal(len2, len);
    assert_memory_equal(buf2, buf, len);
    free(buf);
    free(buf2);
    zi_request_free(&back);
    zi_request_free(&r);
    assert_null(r.images);
    assert_int_equal(r.n_images, 0);
    /* a text prompt holds its markers itself */
    zi_request_init(&r);
    zi_string_set(&r.id, "img-2", 5, NULL);
    r.prompt_kind = ZI_PROMPT_TEXT;
    zi_string_set(&r.prompt_text, ZI_MEDIA_MARKER " what is this?", 25, NULL);
    zi_request_add_image(&r, png, sizeof png, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.n_images, 1);
    assert_memory_equal(back.images[0].p, png, sizeof png);
    free(buf);
    zi_request_free(&back);
    /* the decoder's limits, passed in */
    zi_codec_limits lim = zi_codec_limits_default();
    assert_int_equal(lim.max_images, ZI_REQUEST_MAX_IMAGES);
    assert_int_equal(lim.max_image_bytes, ZI_REQUEST_MAX_IMAGE_BYTES);
    lim.max_image_bytes = sizeof png - 1;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, &lim, &back, &e), ZI_EINVAL);
    ERR_HAS(e, "images[0]: 10 bytes exceed the limit of 9 bytes per image");
    free(buf);
    /* no images: a marker is plain text */
    zi_request_free(&r);
    zi_request_init(&r);
    zi_string_set(&r.id, "img-3", 5, NULL);
    r.prompt_kind = ZI_PROMPT_TEXT;
    zi_string_set(&r.prompt_text, ZI_MEDIA_MARKER, 11, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.n_images, 0);
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    /* the encoder refuses images with token ids */
    zi_request_init(&r);
    zi_string_set(&r.id, "img-4", 5, NULL);
    r.prompt_kind = ZI_PROMPT_TOKENS;
    zi_i32_list_push(&r.prompt_tokens, 5, NULL);
    zi_request_add_image(&r, png, sizeof png, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    ERR_HAS(e, "images: a prompt of token ids cannot place images");
    zi_request_free(&r);
    /* the marker counter */
    assert_int_equal(zi_media_marker_count("", 0), 0);
    assert_int_equal(zi_media_marker_count("<__media__<__media__>>", 22), 1);
    assert_int_equal(zi_media_marker_count("<<__media__><__media__", 22), 1);
    assert_int_equal(zi_media_marker_count("<__media__><__media__>", 22), 2);
}

static void test_roundtrip_thinking(void **state) {
    (void)state;
    zi_error e = {0};
    zi_request r, back;
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s s s A M s s s s M s s s s s s s i", 3, "id", "t", "messages", 2, 2, "role",
          "user", "content", "2+2?", 3, "role", "assistant", "content", "4", "reasoning_content",
          "I add.", "max_thinking_tokens", 7LL);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_int_equal(r.max_thinking_tokens, 7);
    assert_string_equal(r.messages[1].reasoning_content.p, "I add.");
    assert_int_equal(r.messages[0].reasoning_content.len, 0);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.max_thinking_tokens, 7);
    assert_string_equal(back.messages[1].reasoning_content.p, "I add.");
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s A M s s s s s s", 2, "id", "t", "messages", 1, 3, "role", "user", "content",
          "hi", "reasoning_content", "x");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, "messages[0].reasoning_content: only an assistant message has reasoning");
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s s s i", 3, "id", "t", "prompt", "hi", "max_thinking_tokens", 0LL);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, "max_thinking_tokens");
    msgpack_sbuffer_destroy(&sb);

    /* skip_special_tokens: true when absent, false kept through a round trip */
    sb = sb_new();
    build(&sb, "M s s s s", 2, "id", "t", "prompt", "hi");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_true(r.skip_special_tokens);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s s s F", 3, "id", "t", "prompt", "hi", "skip_special_tokens");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_false(r.skip_special_tokens);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_false(back.skip_special_tokens);
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s s s i", 3, "id", "t", "prompt", "hi", "skip_special_tokens", 1LL);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, "skip_special_tokens");
    msgpack_sbuffer_destroy(&sb);

    zi_text_context c, back_c;
    const int32_t prompt[3] = {1, 2, 3}, end[3] = {9, 8, 7};
    odd_context(&c, prompt, 3, 4096);
    zi_string_set(&c.request_id, "ctx-t", 5, NULL);
    c.thinking_budget = 12;
    c.thinking_open = true;
    c.thinking_harmony = true;
    zi_i32_list_set(&c.thinking_end, end, 3, NULL);
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
    assert_int_equal(back_c.thinking_budget, 12);
    assert_true(back_c.thinking_open);
    assert_true(back_c.thinking_harmony);
    assert_int_equal(back_c.thinking_end.n, 3);
    assert_memory_equal(back_c.thinking_end.v, end, sizeof end);
    free(buf);
    zi_text_context_free(&back_c);
    /* without a budget none of the four is sent */
    c.thinking_budget = 0;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
    assert_int_equal(back_c.thinking_budget, 0);
    assert_int_equal(back_c.thinking_end.n, 0);
    free(buf);
    zi_text_context_free(&back_c);
    zi_text_context_free(&c);
}

/* "lora": {"id"} or {"name"} with a scale (default 1), through a request
 * and a context; the shape's refusals name the entry. */
static void test_roundtrip_lora(void **state) {
    (void)state;
    zi_error e = {0};
    zi_request r, back;
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s s s s s A M s i s d M s s", 3, "id", "t", "prompt", "hi", "lora", 2, 2, "id",
          3LL, "scale", 0.5, 1, "name", "style");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_int_equal(r.n_lora, 2);
    assert_int_equal(r.lora[0].id, 3);
    assert_true(r.lora[0].scale == 0.5f);
    assert_int_equal(r.lora[1].id, -1);
    assert_string_equal(r.lora[1].name, "style");
    assert_true(r.lora[1].scale == 1.0f);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.n_lora, 2);
    assert_int_equal(back.lora[0].id, 3);
    assert_string_equal(back.lora[1].name, "style");
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    static const struct {
        const char *fmt, *err;
    } bad[] = {
        {"M s s s s s A M s i s s", "lora[0]: give one of \"id\" and \"name\""},
        {"M s s s s s A M s d", "lora[0]: give one of \"id\" and \"name\""},
        {"M s s s s s A M s i", "lora[0].id"},
    };
    sb = sb_new();
    build(&sb, bad[0].fmt, 3, "id", "t", "prompt", "hi", "lora", 1, 2, "id", 1LL, "name", "x");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, bad[0].err);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, bad[1].fmt, 3, "id", "t", "prompt", "hi", "lora", 1, 1, "scale", 1.0);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, bad[1].err);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, bad[2].fmt, 3, "id", "t", "prompt", "hi", "lora", 1, 1, "id", -1LL);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, bad[2].err);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s s s A M s i M s i M s i M s i M s i", 3, "id", "t", "prompt", "hi", "lora",
          5, 1, "id", 0LL, 1, "id", 1LL, 1, "id", 2LL, 1, "id", 3LL, 1, "id", 4LL);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, "lora");
    msgpack_sbuffer_destroy(&sb);

    zi_text_context c, back_c;
    const int32_t prompt[3] = {1, 2, 3};
    odd_context(&c, prompt, 3, 4096);
    zi_string_set(&c.request_id, "ctx-l", 5, NULL);
    c.lora[0] = (zi_lora_ref){.id = 1, .scale = -0.25f};
    c.n_lora = 1;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
    assert_int_equal(back_c.n_lora, 1);
    assert_int_equal(back_c.lora[0].id, 1);
    assert_true(back_c.lora[0].scale == -0.25f);
    free(buf);
    zi_text_context_free(&back_c);
    zi_text_context_free(&c);
}

/* A speech request (op "speech": input, voice, format) and a context with
 * the codec plan's inputs (tts) survive a round trip; what a speech
 * request does not take is refused naming it. */
static void test_roundtrip_speech(void **state) {
    (void)state;
    zi_error e = {0};
    zi_request r, back;
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s s s s s s s s s s", 5, "op", "speech", "id", "t", "input", "hello world",
          "voice", "alice", "format", "s16");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_true(r.speech);
    assert_int_equal(r.speech_format, 1);
    assert_int_equal(r.prompt_kind, ZI_PROMPT_TEXT);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_true(back.speech);
    assert_int_equal(back.speech_format, 1);
    assert_int_equal(back.voice.len, 5);
    assert_memory_equal(back.voice.p, "alice", 5);
    assert_int_equal(back.prompt_text.len, 11);
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    static const struct {
        const char *k1, *v1, *k2, *v2, *err;
    } bad[] = {
        {"op", "speech", "prompt", "hi", "prompt: not taken by a speech request"},
        {"op", "speech", "input", "", "input: the text is empty"},
        {"op", "generate", "input", "hi", "input: only taken by a speech request"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sb = sb_new();
        build(&sb, "M s s s s s s", 3, "id", "t", bad[i].k1, bad[i].v1, bad[i].k2, bad[i].v2);
        assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
        ERR_HAS(e, bad[i].err);
        msgpack_sbuffer_destroy(&sb);
    }

    zi_text_context c, back_c;
    const int32_t prompt[3] = {1, 2, 3};
    odd_context(&c, prompt, 3, 4096);
    zi_string_set(&c.request_id, "ctx-s", 5, NULL);
    for (int i = 0; i < 8; i++) c.tts_ids[i] = 100 + i;
    c.tts_ids[4] = -1; /* OuteTTS 0.3: no <|code_start|> */
    c.tts_words = calloc(2, sizeof *c.tts_words);
    assert_non_null(c.tts_words);
    c.n_tts_words = 2;
    const int32_t w0[2] = {7, 8}, w1[1] = {9};
    assert_int_equal(zi_i32_list_set(&c.tts_words[0], w0, 2, &e), ZI_OK);
    assert_int_equal(zi_i32_list_set(&c.tts_words[1], w1, 1, &e), ZI_OK);
    c.tts_format = 1;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
    assert_memory_equal(back_c.tts_ids, c.tts_ids, sizeof c.tts_ids);
    assert_int_equal(back_c.n_tts_words, 2);
    assert_int_equal(back_c.tts_words[0].n, 2);
    assert_int_equal(back_c.tts_words[0].v[1], 8);
    assert_int_equal(back_c.tts_words[1].v[0], 9);
    assert_int_equal(back_c.tts_format, 1);
    free(buf);
    zi_text_context_free(&back_c);
    zi_text_context_free(&c);
}

/* keep_alive (Ollama's): seconds as a number, or a duration string;
 * negative is forever; kept in ms through a round trip; a bad one is
 * refused naming the field. */
static void test_keep_alive(void **state) {
    (void)state;
    static const struct {
        const char *s; /* NULL: the number n, in seconds */
        double n;
        int64_t ms;
    } ok[] = {{NULL, 30, 30000}, {NULL, 1.5, 1500}, {NULL, -1, -1},    {NULL, 0, 0},
              {"0", 0, 0},       {"5m", 0, 300000}, {"30s", 0, 30000}, {"300ms", 0, 300},
              {"1h30m", 0, 5400000}, {"-1", 0, -1}, {"-5m", 0, -1},    {"2.5s", 0, 2500},
              {"90", 0, 90000}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        zi_error e = {0};
        zi_request r, back;
        msgpack_sbuffer sb = sb_new();
        if (ok[i].s)
            build(&sb, "M s s s s s s", 3, "id", "t", "prompt", "hi", "keep_alive", ok[i].s);
        else
            build(&sb, "M s s s s s d", 3, "id", "t", "prompt", "hi", "keep_alive", ok[i].n);
        assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
        assert_true(r.has_keep_alive);
        assert_int_equal(r.keep_alive_ms, ok[i].ms);
        char *buf;
        size_t len;
        assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
        assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
        assert_true(back.has_keep_alive);
        assert_int_equal(back.keep_alive_ms, ok[i].ms);
        free(buf);
        zi_request_free(&back);
        zi_request_free(&r);
        msgpack_sbuffer_destroy(&sb);
    }
    static const char *const bad[] = {"", "5x", "m", "5 m", "1h30", "99999999h", "s5"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        zi_error e = {0};
        zi_request r;
        msgpack_sbuffer sb = sb_new();
        build(&sb, "M s s s s s s", 3, "id", "t", "prompt", "hi", "keep_alive", bad[i]);
        assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
        ERR_HAS(e, "keep_alive");
        msgpack_sbuffer_destroy(&sb);
    }
    zi_error e = {0};
    zi_request r;
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s s s s s t", 3, "id", "t", "prompt", "hi", "keep_alive");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_EINVAL);
    ERR_HAS(e, "keep_alive");
    msgpack_sbuffer_destroy(&sb);
    /* absent: none */
    sb = sb_new();
    build(&sb, "M s s s s", 2, "id", "t", "prompt", "hi");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_false(r.has_keep_alive);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
}

static void test_tool_messages(void **state) {
    (void)state;
    msgpack_sbuffer sb = sb_new();
    build(&sb,
          "M s s s A M s s s s  M s s s n s A M s s s s s M s s s M s s"
          "  M s s s s s s s s",
          2, "id", "t", "messages", 3, 2, "role", "user", "content", "Weather in Paris?", 3, "role",
          "assistant", "content", "tool_calls", 1, 3, "id", "call_1", "type", "function",
          "function", 2, "name", "get_weather", "arguments", 1, "city", "Paris", 4, "role", "tool",
          "tool_call_id", "call_1", "content", "21 C", "name", "get_weather");
    zi_request r, back;
    zi_error e = {0};
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_int_equal(r.n_messages, 3);
    assert_false(r.messages[0].content_null);
    assert_int_equal(r.messages[0].tool_calls.len, 0);
    assert_true(r.messages[1].content_null);
    assert_string_equal(r.messages[1].content.p, "");
    assert_true(r.messages[1].tool_calls.len > 0);
    assert_string_equal(r.messages[2].role.p, "tool");
    assert_string_equal(r.messages[2].tool_call_id.p, "call_1");
    assert_string_equal(r.messages[2].name.p, "get_weather");
    assert_string_equal(r.messages[2].content.p, "21 C");
    /* tool_calls are kept as the msgpack the client sent */
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, (const char *)r.messages[1].tool_calls.p,
                                         r.messages[1].tool_calls.len, NULL),
                     MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(u.data.type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(u.data.via.array.size, 1);
    msgpack_unpacked_destroy(&u);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.n_messages, 3);
    assert_true(back.messages[1].content_null);
    assert_int_equal(back.messages[1].tool_calls.len, r.messages[1].tool_calls.len);
    assert_memory_equal(back.messages[1].tool_calls.p, r.messages[1].tool_calls.p,
                        r.messages[1].tool_calls.len);
    assert_string_equal(back.messages[2].tool_call_id.p, "call_1");
    assert_string_equal(back.messages[2].name.p, "get_weather");
    assert_false(back.messages[2].content_null);
    free(buf);
    zi_request_free(&back);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);

    /* String arguments (OpenAI's JSON text) and content given alongside. */
    sb = sb_new();
    build(&sb, "M s s s A M s s s s s A M s M s s s s", 2, "id", "t", "messages", 1, 3, "role",
          "assistant", "content", "Checking.", "tool_calls", 1, 1, "function", 2, "name", "f",
          "arguments", "{\"x\": 1}");
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_false(r.messages[0].content_null);
    assert_string_equal(r.messages[0].content.p, "Checking.");
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
}

static void assert_lp_equal(const zi_logprobs *a, const zi_logprobs *b) {
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        assert_memory_equal(&a->token_logprobs[i], &b->token_logprobs[i], sizeof(float));
        assert_int_equal(a->top[i].n, b->top[i].n);
        for (size_t j = 0; j < a->top[i].n; j++) {
            assert_int_equal(a->top[i].ids[j], b->top[i].ids[j]);
            assert_memory_equal(&a->top[i].logprobs[j], &b->top[i].logprobs[j], sizeof(float));
        }
    }
}

static void test_roundtrip_context(void **state) {
    (void)state;
    zi_error e = {0};
    zi_text_context c, back;
    const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    odd_context(&c, prompt, 6, 4096);
    zi_string_set(&c.request_id, "ctx-1", 5, NULL);
    zi_string_set(&c.prompt, "one two", 7, NULL);
    int32_t eos[2] = {0, 49152 - 1};
    zi_text_context_set_eos(&c, eos, 2, NULL);
    int32_t seq[2] = {10, 11};
    zi_text_context_add_eos_sequence(&c, seq, 2, NULL);
    c.log_probabilities = 3;
    c.log_probabilities_echo = true;
    c.has_json_schema = true;
    zi_string_set(&c.json_schema, "{\"type\":\"object\"}", 17, NULL);
    assert_int_equal(zi_text_context_update(&c, 20, make_lp(-0.25f), &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 21, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_jump_ahead(&c, 22, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 23, make_lp(-2.0f), &e), ZI_OK);
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 4, &e), ZI_OK);
    assert_int_equal(zi_text_context_assign_to_cache(&c, 12, &e), ZI_OK);
    int64_t first, count;
    zi_text_context_take_outstanding(&c, &first, &count);
    assert_int_equal(zi_text_context_set_draft_offset(&c, 2, &e), ZI_OK);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_string_equal(back.request_id.p, "ctx-1");
    assert_string_equal(back.prompt.p, "one two");
    assert_int_equal(back.max_length, 106);
    assert_int_equal(back.start_idx, c.start_idx);
    assert_int_equal(back.active_idx, c.active_idx);
    assert_int_equal(back.end_idx, 10);
    assert_int_equal(back.committed_idx, 4);
    assert_int_equal(back.prompt_len, 6);
    assert_int_equal(back.completion_start_idx, 10);
    assert_int_equal(back.completion_end_idx, 10);
    assert_int_equal(back.size, 128);
    assert_memory_equal(back.tokens, c.tokens, 10 * sizeof(int32_t));
    assert_int_equal(back.eos_token_ids.n, 2);
    assert_int_equal(back.eos_token_ids.v[1], 49151);
    assert_int_equal(back.n_eos_sequences, 1);
    assert_int_equal(back.eos_sequences[0].v[1], 11);
    assert_int_equal(back.log_probabilities, 3);
    assert_true(back.log_probabilities_echo);
    assert_true(back.ignore_eos);
    assert_true(back.has_json_schema);
    assert_string_equal(back.json_schema.p, "{\"type\":\"object\"}");
    assert_sampling_equal(&c.sampling_params, &back.sampling_params);
    assert_int_equal(back.status, ZI_GEN_ACTIVE);
    assert_int_equal(back.cache_seq_id, 12);
    assert_false(back.is_initial_prompt);
    assert_int_equal(back.draft_offset, 2);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(back.lp_data[i] != NULL, c.lp_data[i] != NULL);
        if (c.lp_data[i]) assert_lp_equal(c.lp_data[i], back.lp_data[i]);
    }
    assert_non_null(back.lp_data[6]);
    assert_non_null(back.lp_data[9]);
    /* The decoded context keeps working. */
    assert_int_equal(zi_text_context_update(&back, 30, NULL, &e), ZI_OK);
    assert_int_equal(back.end_idx, 11);
    free(buf);
    zi_text_context_free(&back);

    /* A finished context keeps its status; no cache slot goes out as nil. */
    assert_int_equal(zi_text_context_update_status(&c, ZI_GEN_STOP, &e), ZI_OK);
    assert_int_equal(zi_text_context_unassign_from_cache(&c, &e), ZI_OK);
    c.has_json_schema = false;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_int_equal(back.status, ZI_GEN_STOP);
    assert_int_equal(back.cache_seq_id, -1);
    assert_false(back.has_json_schema);
    free(buf);
    zi_text_context_free(&back);
    zi_text_context_free(&c);
}

/* The grammar key (GBNF text): on a request, alone or refused by name
 * beside response_format; on a context, written only when set. */
static void test_roundtrip_grammar(void **state) {
    (void)state;
    zi_error e = {0};
    zi_request r, back;
    zi_request_init(&r);
    zi_string_set(&r.id, "g", 1, NULL);
    r.prompt_kind = ZI_PROMPT_TEXT;
    zi_string_set(&r.prompt_text, "Hi", 2, NULL);
    const char *gr = "root ::= \"yes\" | \"no\"\n";
    zi_string_set(&r.grammar, gr, strlen(gr), NULL);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_OK);
    assert_string_equal(back.grammar.p, gr);
    free(buf);
    zi_request_free(&back);
    msgpack_sbuffer o1 = sb_new();
    build(&o1, "M s s", 1, "type", "json_object");
    zi_bytes_set(&r.response_format, o1.data, o1.size, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_request_from_bytes(buf, len, NULL, &back, &e), ZI_EINVAL);
    ERR_HAS(e, "grammar: cannot be combined with response_format");
    free(buf);
    msgpack_sbuffer_destroy(&o1);
    zi_request_free(&r);

    zi_text_context c;
    const int32_t prompt[3] = {1, 2, 3};
    odd_context(&c, prompt, 3, 4096);
    zi_string_set(&c.request_id, "ctx-g", 5, NULL);
    zi_text_context back_c;
    for (int with = 1; with >= 0; with--) {
        if (with)
            zi_string_set(&c.grammar, gr, strlen(gr), NULL);
        else
            zi_string_free(&c.grammar);
        assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
        assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
        assert_int_equal(back_c.grammar.len, with ? strlen(gr) : 0);
        if (with) assert_string_equal(back_c.grammar.p, gr);
        free(buf);
        zi_text_context_free(&back_c);
    }
    /* A regex travels in the context as it came (the worker compiles it);
     * a context with a regex and a grammar is refused naming regex. */
    zi_string_free(&c.grammar);
    const char *rx = "[0-9]{3}-[a-z]+";
    zi_string_set(&c.regex, rx, strlen(rx), NULL);
    assert_true(zi_text_context_constrained(&c));
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_OK);
    assert_string_equal(back_c.regex.p, rx);
    assert_int_equal(back_c.grammar.len, 0);
    free(buf);
    zi_text_context_free(&back_c);
    zi_string_set(&c.grammar, gr, strlen(gr), NULL);
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    assert_int_equal(zi_codec_text_context_from_bytes(buf, len, NULL, &back_c, &e), ZI_EINVAL);
    ERR_HAS(e, "regex: cannot be combined with json_schema or grammar");
    free(buf);
    zi_text_context_free(&c);
}

static void test_roundtrip_responses(void **state) {
    (void)state;
    zi_error e = {0};
    zi_text_generation_response r, back;
    zi_text_generation_response_init(&r);
    zi_text_response t;
    zi_text_response_init(&t);
    t.token = 49151;
    t.logprobs = make_lp(-0.125f);
    zi_text_generation_response_append(&r, &t, NULL);
    zi_text_response_free(&t);
    t.is_text = true;
    zi_string_set(&t.text, "caf\xc3\xa9", 5, NULL);
    zi_text_generation_response_append(&r, &t, NULL);
    zi_text_response_free(&t);
    r.final_status = ZI_GEN_MAXIMUM_LENGTH;
    msgpack_sbuffer sb = sb_new();
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_text_generation_response(&pk, &r, &e), ZI_OK);
    msgpack_unpacked u;
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_text_generation_response(&u.data, NULL, NULL, &back, &e),
                     ZI_OK);
    assert_int_equal(back.n, 2);
    assert_int_equal(back.final_status, ZI_GEN_MAXIMUM_LENGTH);
    assert_false(back.tokens[0].is_text);
    assert_int_equal(back.tokens[0].token, 49151);
    assert_lp_equal(r.tokens[0].logprobs, back.tokens[0].logprobs);
    assert_true(back.tokens[1].is_text);
    assert_string_equal(back.tokens[1].text.p, "caf\xc3\xa9");
    assert_null(back.tokens[1].logprobs);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    zi_text_generation_response_free(&back);
    zi_text_generation_response_free(&r);

    /* LogProbabilities on its own, and an empty one. */
    zi_logprobs *lp = make_lp(-3.0f), lback;
    sb = sb_new();
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_logprobs(&pk, lp, &e), ZI_OK);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_logprobs(&u.data, NULL, NULL, &lback, &e), ZI_OK);
    assert_lp_equal(lp, &lback);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    zi_logprobs_free(&lback);
    zi_logprobs_free(lp);
    free(lp);
    zi_logprobs empty;
    zi_logprobs_init(&empty);
    sb = sb_new();
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_logprobs(&pk, &empty, &e), ZI_OK);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_logprobs(&u.data, NULL, NULL, &lback, &e), ZI_OK);
    assert_int_equal(lback.n, 0);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* Encoders refuse what the decoder would refuse. */
static void test_encode_refusals(void **state) {
    (void)state;
    zi_error e = {0};
    char *buf = NULL;
    size_t len = 0;
    zi_request r;
    zi_request_init(&r);
    zi_string_set(&r.id, "a", 1, NULL);
    r.prompt_kind = ZI_PROMPT_TEXT;
    zi_string_set(&r.prompt_text, "hi", 2, NULL);
    zi_str_list_push(&r.sampling_params.stop, "ok", 2, NULL);
    zi_str_list_push(&r.sampling_params.stop, "\xfe", 1, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "sampling_params.stop[1]: not valid UTF-8");
    zi_str_list_free(&r.sampling_params.stop);
    zi_string_set(&r.model_name, "a\0b", 3, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "model_name: contains a NUL byte");
    zi_string_free(&r.model_name);
    zi_request_add_message(&r, "user", "x", 1, NULL); /* both prompt and messages */
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    ERR_HAS(e, "exactly one of prompt and messages");
    r.prompt_kind = ZI_PROMPT_NONE;
    zi_string_set(&r.messages[0].content, "\xc3", 1, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "messages.content[0]: not valid UTF-8");
    zi_string_set(&r.messages[0].content, "fine", 4, NULL);
    uint8_t junk[3] = {0x92, 0x01, 0x02}; /* fine */
    zi_bytes_set(&r.tools, junk, 3, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    free(buf);
    zi_bytes_set(&r.tools, junk, 2, NULL); /* not one whole object */
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_EFORMAT);
    ERR_HAS(e, "tools: message: array at byte 0 claims 2 entries but only 1 bytes remain");
    zi_request_free(&r);

    zi_text_response t;
    zi_text_response_init(&t);
    t.token = -1;
    msgpack_sbuffer sb = sb_new();
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_text_response(&pk, &t, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "next_token: -1 is not a token id");
    zi_logprobs lp;
    zi_logprobs_init(&lp);
    zi_logprobs_push(&lp, -1.0f, NULL, NULL, 0, NULL);
    lp.token_logprobs[0] = NAN;
    assert_int_equal(zi_codec_pack_logprobs(&pk, &lp, &e), ZI_EINVAL);
    ERR_HAS(e, "token_log_probabilities[0]");
    zi_logprobs_free(&lp);
    zi_text_generation_response g;
    zi_text_generation_response_init(&g);
    g.final_status = (zi_gen_status)9;
    assert_int_equal(zi_codec_pack_text_generation_response(&pk, &g, &e), ZI_EINVAL);
    ERR_HAS(e, "final_status: 9");
    msgpack_sbuffer_destroy(&sb);

    zi_text_context c;
    const int32_t p[2] = {1, 2};
    assert_int_equal(zi_text_context_init(&c, p, 2, 10, NULL, &e), ZI_OK);
    zi_string_set(&c.request_id, "r\0", 2, NULL);
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "request_id: contains a NUL byte");
    zi_string_free(&c.request_id);
    c.active_idx = 3; /* broken by hand: refused, not encoded */
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_EINVAL);
    ERR_HAS(e, "active_idx: 3 is beyond end_idx 2");
    zi_text_context_free(&c);
}

/* ---- numpy-style arrays ---------------------------------------------------- */

/* The exact bytes: a 4-entry map, data little-endian int64. */
static void test_numpy_layout(void **state) {
    (void)state;
    zi_error e = {0};
    const int32_t ids[3] = {1, 256, 49151};
    msgpack_sbuffer sb = sb_new();
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_tokens(&pk, ids, 3, &e), ZI_OK);
    msgpack_unpacked u;
    parse_ok(&sb, &u);
    const msgpack_object *o = &u.data;
    assert_int_equal(o->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(o->via.map.size, 4);
    int seen = 0;
    for (uint32_t i = 0; i < 4; i++) {
        const msgpack_object_kv *kv = &o->via.map.ptr[i];
        char k[16] = {0};
        memcpy(k, kv->key.via.str.ptr, kv->key.via.str.size);
        if (!strcmp(k, "__np__")) {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_BOOLEAN);
            assert_true(kv->val.via.boolean);
            seen |= 1;
        } else if (!strcmp(k, "dtype")) {
            assert_int_equal(kv->val.via.str.size, 5);
            assert_memory_equal(kv->val.via.str.ptr, "int64", 5);
            seen |= 2;
        } else if (!strcmp(k, "shape")) {
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_ARRAY);
            assert_int_equal(kv->val.via.array.size, 1);
            assert_int_equal(kv->val.via.array.ptr[0].via.u64, 3);
            seen |= 4;
        } else if (!strcmp(k, "data")) {
            const uint8_t want[24] = {1, 0, 0, 0, 0,    0,    0, 0, 0, 1, 0, 0,
                                      0, 0, 0, 0, 0xff, 0xbf, 0, 0, 0, 0, 0, 0};
            assert_int_equal(kv->val.type, MSGPACK_OBJECT_BIN);
            assert_int_equal(kv->val.via.bin.size, 24);
            assert_memory_equal(kv->val.via.bin.ptr, want, 24);
            seen |= 8;
        }
    }
    assert_int_equal(seen, 15);
    int32_t *back;
    size_t n;
    assert_int_equal(zi_codec_decode_tokens(o, NULL, "ids", &back, &n, &e), ZI_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(back, ids, sizeof ids);
    free(back);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);

    /* float32: -1.5f is 0xbfc00000 */
    const float f[2] = {-1.5f, 0.0f};
    sb = sb_new();
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    assert_int_equal(zi_codec_pack_f32(&pk, f, 2, &e), ZI_OK);
    const uint8_t fdata[8] = {0, 0, 0xc0, 0xbf, 0, 0, 0, 0};
    assert_non_null(memmem(sb.data, sb.size, fdata, 8));
    assert_non_null(memmem(sb.data, sb.size, "float32", 7));
    msgpack_sbuffer_destroy(&sb);
}

/* What a Python peer may send: int32 arrays, plain lists. */
static void test_numpy_variants(void **state) {
    (void)state;
    zi_error e = {0};
    int32_t v32[3] = {5, 6, 7};
    uint8_t d32[12];
    le32(d32, v32, 3);
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s t s s s A i s b", 4, "__np__", "dtype", "int32", "shape", 1, 3ll, "data", d32,
          (size_t)12);
    msgpack_unpacked u;
    parse_ok(&sb, &u);
    int32_t *ids;
    size_t n;
    assert_int_equal(zi_codec_decode_tokens(&u.data, NULL, NULL, &ids, &n, &e), ZI_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(ids, v32, sizeof v32);
    free(ids);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "A i i u", 3, 5ll, 6ll, 7ull);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_tokens(&u.data, NULL, NULL, &ids, &n, &e), ZI_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(ids, v32, sizeof v32);
    free(ids);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    /* empty arrays, both forms */
    sb = sb_new();
    build(&sb, "A", 0);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_tokens(&u.data, NULL, NULL, &ids, &n, &e), ZI_OK);
    assert_int_equal(n, 0);
    assert_null(ids);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s t s s s A i s b", 4, "__np__", "dtype", "int64", "shape", 1, 0ll, "data", "",
          (size_t)0);
    parse_ok(&sb, &u);
    assert_int_equal(zi_codec_decode_tokens(&u.data, NULL, NULL, &ids, &n, &e), ZI_OK);
    assert_int_equal(n, 0);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    /* logprobs from plain float lists and float64 values */
    sb = sb_new();
    build(&sb, "M s A d i s A M i f M", 2, "token_log_probabilities", 2, -0.5, -1ll,
          "top_log_probabilities", 2, 1, 3ll, -0.5, 0);
    parse_ok(&sb, &u);
    zi_logprobs lp;
    assert_int_equal(zi_codec_decode_logprobs(&u.data, NULL, NULL, &lp, &e), ZI_OK);
    assert_int_equal(lp.n, 2);
    assert_true(lp.token_logprobs[1] == -1.0f);
    assert_int_equal(lp.top[0].ids[0], 3);
    assert_int_equal(lp.top[1].n, 0);
    zi_logprobs_free(&lp);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* A TextContext as the seed's Python dataclass would minimally send it:
 * indices left at -1 (or out) are derived from the tokens. */
static void test_context_derived(void **state) {
    (void)state;
    zi_error e = {0};
    int64_t t[5] = {9, 8, 7, 6, 5};
    uint8_t d[40];
    le64(d, t, 5);
    msgpack_sbuffer sb = sb_new();
    build(&sb, "M s M s t s s s A i s b s i s i s i", 4, "tokens", 4, "__np__", "dtype", "int64",
          "shape", 1, 5ll, "data", d, (size_t)40, "max_length", 64ll, "_active_idx", -1ll,
          "_end_idx", -1ll);
    zi_text_context c;
    assert_int_equal(zi_codec_text_context_from_bytes(sb.data, sb.size, NULL, &c, &e), ZI_OK);
    assert_int_equal(c.start_idx, 0);
    assert_int_equal(c.active_idx, 5);
    assert_int_equal(c.end_idx, 5);
    assert_int_equal(c.prompt_len, 5);
    assert_int_equal(c.completion_start_idx, 5);
    assert_int_equal(c.completion_end_idx, 5);
    assert_int_equal(c.committed_idx, 0);
    assert_int_equal(c.size, 128);
    assert_int_equal(c.cache_seq_id, -1);
    assert_true(c.is_initial_prompt);
    assert_int_equal(c.tokens[4], 5);
    assert_int_equal(c.sampling_params.top_k, 1);
    assert_int_equal(zi_text_context_update(&c, 3, NULL, &e), ZI_OK);
    assert_int_equal(c.end_idx, 6);
    zi_text_context_free(&c);
    msgpack_sbuffer_destroy(&sb);
    /* Padded tokens (Python keeps _size slots): only [0, _end_idx) is kept. */
    int64_t p[8] = {9, 8, 7, 0, 0, 0, 0, 0};
    uint8_t pd[64];
    le64(pd, p, 8);
    sb = sb_new();
    build(&sb, "M s M s t s s s A i s b s i s i s i s i", 5, "tokens", 4, "__np__", "dtype",
          "int64", "shape", 1, 8ll, "data", pd, (size_t)64, "max_length", 64ll, "_end_idx", 3ll,
          "_active_idx", 3ll, "_size", 8ll);
    assert_int_equal(zi_codec_text_context_from_bytes(sb.data, sb.size, NULL, &c, &e), ZI_OK);
    assert_int_equal(c.end_idx, 3);
    assert_int_equal(c.prompt_len, 3);
    zi_text_context_free(&c);
    msgpack_sbuffer_destroy(&sb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* round trips, and what the encoders refuse */
        cmocka_unit_test(test_roundtrip_sampling),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_roundtrip_request),
        cmocka_unit_test(test_tool_messages),
        cmocka_unit_test(test_roundtrip_images),
        cmocka_unit_test(test_roundtrip_thinking),
        cmocka_unit_test(test_roundtrip_lora),
        cmocka_unit_test(test_roundtrip_speech),
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test(test_roundtrip_context),
        cmocka_unit_test(test_roundtrip_grammar),
        cmocka_unit_test(test_roundtrip_responses),
        cmocka_unit_test(test_encode_refusals),
        /* numpy arrays, and what a Python peer sends */
        cmocka_unit_test(test_numpy_layout),
        cmocka_unit_test(test_numpy_variants),
        cmocka_unit_test(test_context_derived),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
