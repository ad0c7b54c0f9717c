/*
 * test_codec.c - cmocka tests for the codec (common/codec.h: codec_scan.c,
 * codec_fields.c, codec_decode.c, codec_encode.c) and response_format.c.
 *
 * Round trips of every type with non-default values; the exact bytes of the
 * numpy-style arrays; decoding of what a Python peer sends (int32 arrays,
 * plain lists, a minimal TextContext whose indices are derived); a table of
 * malformed messages, each of which must be refused with the expected status
 * and a message naming the field; the raw-bytes pre-scan (truncation,
 * trailing bytes, lying counts, deep nesting); and, under
 * -fsanitize=address,undefined, every truncation and many random mutations
 * of valid messages, which must fail cleanly or decode, never crash.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "keypath.h"
#include "response_format.h"

#define ERR_HAS(e, s)                                                                              \
    do {                                                                                           \
        if (!strstr((e).msg, (s)))                                                                 \
            fail_msg("message \"%s\" does not contain \"%s\"", (e).msg, (s));                      \
    } while (0)

/* ---- a message builder ----------------------------------------------------- */

/*
 * build(sb, fmt, ...) packs values described by fmt, one letter each
 * (spaces ignored):
 *   M map (int n)    A array (int n)   s str (const char *)
 *   S str (const char *, size_t)       i int (long long)
 *   u uint (unsigned long long)        d float64 (double)
 *   f float32 (double)                 t true   F false   n nil
 *   b bin (const void *, size_t)       x ext (int type, const void *, size_t)
 */
static void vbuild(msgpack_sbuffer *sb, const char *fmt, va_list ap) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    for (const char *f = fmt; *f; f++) {
        int rc = 0;
        switch (*f) {
        case ' ':
            break;
        case 'M':
            rc = msgpack_pack_map(&pk, (size_t)va_arg(ap, int));
            break;
        case 'A':
            rc = msgpack_pack_array(&pk, (size_t)va_arg(ap, int));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            rc = msgpack_pack_str_with_body(&pk, s, strlen(s));
            break;
        }
        case 'S': {
            const char *s = va_arg(ap, const char *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_str_with_body(&pk, s, n);
            break;
        }
        case 'i':
            rc = msgpack_pack_int64(&pk, va_arg(ap, long long));
            break;
        case 'u':
            rc = msgpack_pack_uint64(&pk, va_arg(ap, unsigned long long));
            break;
        case 'd':
            rc = msgpack_pack_double(&pk, va_arg(ap, double));
            break;
        case 'f':
            rc = msgpack_pack_float(&pk, (float)va_arg(ap, double));
            break;
        case 't':
            rc = msgpack_pack_true(&pk);
            break;
        case 'F':
            rc = msgpack_pack_false(&pk);
            break;
        case 'n':
            rc = msgpack_pack_nil(&pk);
            break;
        case 'b': {
            const void *p = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_bin_with_body(&pk, p, n);
            break;
        }
        case 'x': {
            int type = va_arg(ap, int);
            const void *p = va_arg(ap, const void *);
            size_t n = va_arg(ap, size_t);
            rc = msgpack_pack_ext_with_body(&pk, p, n, (int8_t)type);
            break;
        }
        default:
            fail_msg("bad build letter %c", *f);
        }
        assert_int_equal(rc, 0);
    }
}

static void build(msgpack_sbuffer *sb, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vbuild(sb, fmt, ap);
    va_end(ap);
}

/* Little-endian bytes of int64/int32/float32 arrays, as numpy writes them. */
static void le64(uint8_t *out, const int64_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 8; b++) out[8 * i + b] = (uint8_t)((uint64_t)v[i] >> (8 * b));
}
static void le32(uint8_t *out, const int32_t *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (int b = 0; b < 4; b++) out[4 * i + b] = (uint8_t)((uint32_t)v[i] >> (8 * b));
}

/* ---- helpers for round trips ----------------------------------------------- */

static msgpack_sbuffer sb_new(void) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    return sb;
}

typedef int (*pack_fn)(msgpack_packer *, const void *, zi_error *);

/* Parses a whole buffer (pre-scan included), failing the test on error. */
static void parse_ok(const msgpack_sbuffer *sb, msgpack_unpacked *u) {
    zi_error e = {0};
    int rc = zi_msgpack_parse(sb->data, sb->size, NULL, u, &e);
    if (rc) fail_msg("parse: %s", e.msg);
}

static zi_sampling_params odd_sampling(void) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.top_k = 40;
    sp.top_p = 0.9;
    sp.min_p = 0.05;
    sp.temperature = 0.7;
    sp.frequency_penalty = 0.5;
    sp.presence_penalty = -0.25;
    sp.repetition_penalty = 1.1;
    sp.max_new_tokens = 64;
    sp.min_new_tokens = 3;
    sp.ignore_eos = true;
    zi_str_list_push(&sp.stop, "\n\n", 2, NULL);
    zi_str_list_push(&sp.stop, "END\xc3\xa9", 5, NULL);
    zi_i32_list_push(&sp.stop_token_ids, 2, NULL);
    zi_i32_list_push(&sp.stop_token_ids, 49151, NULL);
    sp.detokenize = false;
    sp.seed = 0xfedcba9876543210ull;
    return sp;
}

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
}

/* ---- round trips ----------------------------------------------------------- */

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
    assert_int_equal(u.data.via.map.size, 14);
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

static zi_logprobs *make_lp(float base) {
    zi_logprobs *lp = malloc(sizeof *lp);
    zi_logprobs_init(lp);
    int32_t ids[3] = {7, 100, 49000};
    float v[3] = {base, base - 1.0f, -INFINITY};
    zi_logprobs_push(lp, base, ids, v, 3, NULL);
    zi_logprobs_push(lp, base - 0.5f, ids, v, 1, NULL);
    return lp;
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
    zi_sampling_params sp = odd_sampling();
    sp.max_new_tokens = 100;
    sp.min_new_tokens = 0;
    zi_text_context c, back;
    const int32_t prompt[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(zi_text_context_init(&c, prompt, 6, 4096, &sp, &e), ZI_OK);
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
    zi_sampling_params_free(&sp);
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

/* ---- malformed messages ---------------------------------------------------- */

static int n_bad_cases;

/* Builds a message, decodes it with decode_what ('r' request, 'c' context,
 * 'l' logprobs, 't' text_generation_response) and checks the status and
 * that the message contains `field`. */
static void bad_case(char what, const zi_codec_limits *lim, int want_rc, const char *field,
                     const char *fmt, ...) {
    msgpack_sbuffer sb = sb_new();
    va_list ap;
    va_start(ap, fmt);
    vbuild(&sb, fmt, ap);
    va_end(ap);
    zi_error e = {0};
    int rc;
    if (what == 'r') {
        zi_request r;
        rc = zi_codec_request_from_bytes(sb.data, sb.size, lim, &r, &e);
        assert_null(r.id.p); /* left in its init state */
        if (!rc) zi_request_free(&r);
    } else if (what == 'c') {
        zi_text_context c;
        rc = zi_codec_text_context_from_bytes(sb.data, sb.size, lim, &c, &e);
        assert_null(c.tokens);
        if (!rc) zi_text_context_free(&c);
    } else {
        msgpack_unpacked u;
        rc = zi_msgpack_parse(sb.data, sb.size, lim, &u, &e);
        if (!rc) {
            if (what == 'l') {
                zi_logprobs lp;
                rc = zi_codec_decode_logprobs(&u.data, lim, "lp", &lp, &e);
                assert_null(lp.top);
                if (!rc) zi_logprobs_free(&lp);
            } else {
                zi_text_generation_response t;
                rc = zi_codec_decode_text_generation_response(&u.data, lim, NULL, &t, &e);
                assert_null(t.tokens);
                if (!rc) zi_text_generation_response_free(&t);
            }
            msgpack_unpacked_destroy(&u);
        }
    }
    msgpack_sbuffer_destroy(&sb);
    if (rc != want_rc)
        fail_msg("case %d (%s): status %d, want %d; message \"%s\"", n_bad_cases + 1, field, rc,
                 want_rc, e.msg);
    if (!strstr(e.msg, field))
        fail_msg("case %d: message \"%s\" does not name \"%s\"", n_bad_cases + 1, e.msg, field);
    n_bad_cases++;
}

static void test_malformed_requests(void **state) {
    (void)state;
    const int I = ZI_EINVAL;
    n_bad_cases = 0;
    bad_case('r', NULL, I, "request: expected a map, got an array", "A s", 1, "x");
    bad_case('r', NULL, I, "id: missing required field", "M s s", 1, "prompt", "hi");
    bad_case('r', NULL, I, "id: expected a string, got an integer", "M s i s s", 2, "id", 5ll,
             "prompt", "hi");
    bad_case('r', NULL, I, "id: must not be empty", "M s s s s", 2, "id", "", "prompt", "hi");
    bad_case('r', NULL, I, "id: string of 300 bytes exceeds the limit of 256", "M s S s s", 2, "id",
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxx",
             (size_t)300, "prompt", "hi");
    bad_case('r', NULL, I, "foo: unknown field", "M s s s s s i", 3, "id", "a", "prompt", "hi",
             "foo", 1ll);
    bad_case('r', NULL, I, "id: duplicate field", "M s s s s s s", 3, "id", "a", "prompt", "hi",
             "id", "b");
    bad_case('r', NULL, I, "request: map key #0 is an integer, not a string", "M i s", 1, 1ll, "x");
    bad_case('r', NULL, I, "prompt: exactly one of prompt and messages", "M s s", 1, "id", "a");
    bad_case('r', NULL, I, "prompt: exactly one of prompt and messages", "M s s s s s A M s s s s",
             3, "id", "a", "prompt", "hi", "messages", 1, 2, "role", "user", "content", "x");
    bad_case('r', NULL, I, "prompt: expected an array of token ids, got a float", "M s s s d", 2,
             "id", "a", "prompt", 1.5);
    bad_case('r', NULL, I, "prompt: must not be empty", "M s s s s", 2, "id", "a", "prompt", "");
    bad_case('r', NULL, I, "prompt: must not be empty", "M s s s A", 2, "id", "a", "prompt", 0);
    bad_case('r', NULL, I, "prompt[1]: -4 is outside [0, 2147483647]", "M s s s A i i", 2, "id",
             "a", "prompt", 2, 1ll, -4ll);
    bad_case('r', NULL, I, "prompt[0]: 2147483648 is outside", "M s s s A i", 2, "id", "a",
             "prompt", 1, 2147483648ll);
    bad_case('r', NULL, I, "prompt[0]: expected an integer, got a string", "M s s s A s", 2, "id",
             "a", "prompt", 1, "7");
    bad_case('r', NULL, I, "prompt: invalid UTF-8 at byte 2", "M s s s S", 2, "id", "a", "prompt",
             "ab\xc3(", (size_t)4);
    bad_case('r', NULL, I, "prompt: invalid UTF-8 at byte 0", "M s s s S", 2, "id", "a", "prompt",
             "\xed\xa0\x80", (size_t)3); /* a UTF-16 surrogate */
    bad_case('r', NULL, I, "prompt: invalid UTF-8 at byte 0", "M s s s S", 2, "id", "a", "prompt",
             "\xc0\xaf", (size_t)2); /* overlong '/' */
    {
        int64_t neg[2] = {5, -1};
        uint8_t d[16];
        le64(d, neg, 2);
        bad_case('r', NULL, I, "prompt[1]: token id -1 is outside", "M s s s M s t s s s A i s b",
                 2, "id", "a", "prompt", 4, "__np__", "dtype", "int64", "shape", 1, 2ll, "data", d,
                 (size_t)16);
        bad_case('r', NULL, I, "prompt.dtype: \"float32\" is not accepted here",
                 "M s s s M s t s s s A i s b", 2, "id", "a", "prompt", 4, "__np__", "dtype",
                 "float32", "shape", 1, 2ll, "data", d, (size_t)8);
        bad_case('r', NULL, I, "prompt.shape: must have one dimension, got 2",
                 "M s s s M s t s s s A i i s b", 2, "id", "a", "prompt", 4, "__np__", "dtype",
                 "int64", "shape", 2, 1ll, 2ll, "data", d, (size_t)16);
        bad_case('r', NULL, I, "prompt.data: 15 bytes do not match shape [2]",
                 "M s s s M s t s s s A i s b", 2, "id", "a", "prompt", 4, "__np__", "dtype",
                 "int64", "shape", 1, 2ll, "data", d, (size_t)15);
        bad_case('r', NULL, I, "prompt.__np__: missing required field", "M s s s M s s s A i s b",
                 2, "id", "a", "prompt", 3, "dtype", "int64", "shape", 1, 2ll, "data", d,
                 (size_t)16);
        bad_case('r', NULL, I, "prompt.__np__: must be true", "M s s s M s F s s s A i s b", 2,
                 "id", "a", "prompt", 4, "__np__", "dtype", "int64", "shape", 1, 2ll, "data", d,
                 (size_t)16);
        bad_case('r', NULL, I, "prompt.data: expected binary data, got a string",
                 "M s s s M s t s s s A i s s", 2, "id", "a", "prompt", 4, "__np__", "dtype",
                 "int64", "shape", 1, 2ll, "data", "xxxxxxxxxxxxxxxx");
        bad_case('r', NULL, I, "prompt.shape[0]: -2 is outside", "M s s s M s t s s s A i s b", 2,
                 "id", "a", "prompt", 4, "__np__", "dtype", "int64", "shape", 1, -2ll, "data", d,
                 (size_t)16);
    }
    bad_case('r', NULL, I, "messages: must not be empty", "M s s s A", 2, "id", "a", "messages", 0);
    bad_case('r', NULL, I, "messages[1].role: \"robot\" is not a role",
             "M s s s A M s s s s M s s s s", 2, "id", "a", "messages", 2, 2, "role", "user",
             "content", "x", 2, "role", "robot", "content", "y");
    bad_case('r', NULL, I, "messages[0].content: missing required field", "M s s s A M s s", 2,
             "id", "a", "messages", 1, 1, "role", "user");
    bad_case('r', NULL, I, "messages[0].name: unknown field", "M s s s A M s s s s s s", 2, "id",
             "a", "messages", 1, 3, "role", "user", "content", "x", "name", "bob");
    bad_case('r', NULL, ZI_EUNSUPPORTED,
             "messages[0].content[1].type: part type \"image_url\" is not supported",
             "M s s s A M s s s A M s s s s M s s", 2, "id", "a", "messages", 1, 2, "role", "user",
             "content", 2, 2, "type", "text", "text", "look", 1, "type", "image_url");
    bad_case('r', NULL, I,
             "messages[0].content: expected a string or an array of parts, got an integer",
             "M s s s A M s s s i", 2, "id", "a", "messages", 1, 2, "role", "user", "content", 3ll);
    bad_case('r', NULL, I, "sampling_params.top_p: 1.5 is outside (0, 1]", "M s s s s s M s d", 3,
             "id", "a", "prompt", "hi", "sampling_params", 1, "top_p", 1.5);
    bad_case('r', NULL, I, "sampling_params.temperature: NaN is not allowed", "M s s s s s M s d",
             3, "id", "a", "prompt", "hi", "sampling_params", 1, "temperature", (double)NAN);
    bad_case('r', NULL, I, "sampling_params.top_p: NaN is not allowed", "M s s s s s M s f", 3,
             "id", "a", "prompt", "hi", "sampling_params", 1, "top_p", (double)NAN);
    bad_case('r', NULL, I, "sampling_params.top_k: -2 is invalid", "M s s s s s M s i", 3, "id",
             "a", "prompt", "hi", "sampling_params", 1, "top_k", -2ll);
    bad_case('r', NULL, I, "sampling_params.top_k: expected an integer, got a float",
             "M s s s s s M s d", 3, "id", "a", "prompt", "hi", "sampling_params", 1, "top_k", 5.0);
    bad_case('r', NULL, I, "sampling_params.top_k: 4294967296 is outside", "M s s s s s M s i", 3,
             "id", "a", "prompt", "hi", "sampling_params", 1, "top_k", 4294967296ll);
    bad_case('r', NULL, I, "sampling_params.min_p: 1.5 is outside [0, 1]", "M s s s s s M s d", 3,
             "id", "a", "prompt", "hi", "sampling_params", 1, "min_p", 1.5);
    bad_case('r', NULL, I, "sampling_params.bogus: unknown field", "M s s s s s M s i", 3, "id",
             "a", "prompt", "hi", "sampling_params", 1, "bogus", 1ll);
    bad_case('r', NULL, I, "sampling_params.stop[1]: expected a string, got an integer",
             "M s s s s s M s A s i", 3, "id", "a", "prompt", "hi", "sampling_params", 1, "stop", 2,
             "ok", 4ll);
    bad_case('r', NULL, I, "sampling_params.stop: expected an array of strings, got a string",
             "M s s s s s M s s", 3, "id", "a", "prompt", "hi", "sampling_params", 1, "stop", "x");
    bad_case('r', NULL, I, "sampling_params.stop_token_ids[0]: -3 is outside",
             "M s s s s s M s A i", 3, "id", "a", "prompt", "hi", "sampling_params", 1,
             "stop_token_ids", 1, -3ll);
    bad_case('r', NULL, I, "sampling_params.max_new_tokens: 0 is invalid", "M s s s s s M s i", 3,
             "id", "a", "prompt", "hi", "sampling_params", 1, "max_new_tokens", 0ll);
    bad_case('r', NULL, I, "sampling_params.min_new_tokens: 9 exceeds max_new_tokens 4",
             "M s s s s s M s i s i", 3, "id", "a", "prompt", "hi", "sampling_params", 2,
             "max_new_tokens", 4ll, "min_new_tokens", 9ll);
    bad_case('r', NULL, I, "sampling_params.seed: -1 is negative", "M s s s s s M s i", 3, "id",
             "a", "prompt", "hi", "sampling_params", 1, "seed", -1ll);
    bad_case('r', NULL, I, "sampling_params.repetition_penalty: 0 is outside (0, 1e+06]",
             "M s s s s s M s d", 3, "id", "a", "prompt", "hi", "sampling_params", 1,
             "repetition_penalty", 0.0);
    bad_case('r', NULL, I, "sampling_params.frequency_penalty: inf is outside [-2, 2]",
             "M s s s s s M s d", 3, "id", "a", "prompt", "hi", "sampling_params", 1,
             "frequency_penalty", (double)INFINITY);
    bad_case('r', NULL, I, "sampling_params.detokenize: expected a boolean, got nil",
             "M s s s s s M s n", 3, "id", "a", "prompt", "hi", "sampling_params", 1, "detokenize");
    bad_case('r', NULL, I, "sampling_params: expected a map, got a string", "M s s s s s s", 3,
             "id", "a", "prompt", "hi", "sampling_params", "greedy");
    bad_case('r', NULL, I, "logprobs: 21 is outside [0, 20]", "M s s s s s i", 3, "id", "a",
             "prompt", "hi", "logprobs", 21ll);
    bad_case('r', NULL, I, "echo: expected a boolean, got a string", "M s s s s s s", 3, "id", "a",
             "prompt", "hi", "echo", "yes");
    bad_case('r', NULL, I, "stop[0]: must not be empty", "M s s s s s A s", 3, "id", "a", "prompt",
             "hi", "stop", 1, "");
    bad_case('r', NULL, I, "stream: expected a boolean, got nil", "M s s s s s n", 3, "id", "a",
             "prompt", "hi", "stream");
    bad_case('r', NULL, I, "tools: expected an array, got a map", "M s s s s s M", 3, "id", "a",
             "prompt", "hi", "tools", 0);
    bad_case('r', NULL, I, "response_format.schema.x: extension types are not accepted",
             "M s s s s s M s M s x", 3, "id", "a", "prompt", "hi", "response_format", 1, "schema",
             1, "x", 1, "ab", (size_t)2);
    bad_case('r', NULL, I, "chat_template_options.k: invalid UTF-8", "M s s s s s M s S", 3, "id",
             "a", "prompt", "hi", "chat_template_options", 1, "k", "\xff", (size_t)1);
    bad_case('r', NULL, ZI_EUNSUPPORTED, "images: image inputs are not supported",
             "M s s s s s A b", 3, "id", "a", "prompt", "hi", "images", 1, "\x89PNG", (size_t)4);
    bad_case('r', NULL, I, "op: a request's op must be \"generate\"", "M s s s s s s", 3, "op",
             "cancel", "id", "a", "prompt", "hi");
    bad_case('r', NULL, I, "model_name: contains a NUL byte", "M s s s s s S", 3, "id", "a",
             "prompt", "hi", "model_name", "a\0b", (size_t)3);
    bad_case('r', NULL, I, "index: -1 is outside [0, 9223372036854775807]", "M s s s s s i", 3,
             "id", "a", "prompt", "hi", "index", -1ll);
    bad_case('r', NULL, I, "timestamp_ns: expected an integer, got a float", "M s s s s s d", 3,
             "id", "a", "prompt", "hi", "timestamp_ns", 1.0);
    /* limits passed in */
    zi_codec_limits small = zi_codec_limits_default();
    small.max_tokens = 4;
    small.max_string_bytes = 8;
    bad_case('r', &small, I, "prompt: 5 tokens exceed the limit of 4", "M s s s A i i i i i", 2,
             "id", "a", "prompt", 5, 1ll, 2ll, 3ll, 4ll, 5ll);
    bad_case('r', &small, I, "prompt: string of 9 bytes exceeds the limit of 8", "M s s s s", 2,
             "id", "a", "prompt", "123456789");
    bad_case('r', &small, I, "messages[0].content[1].content: content exceeds the limit of 8 bytes",
             "M s s s A M s s s A M s s s s M s s s s", 2, "id", "a", "messages", 1, 2, "role",
             "user", "content", 2, 2, "type", "text", "text", "12345", 2, "type", "text", "content",
             "6789");
    small = zi_codec_limits_default();
    small.max_items = 2;
    bad_case('r', &small, I, "stop: 3 entries exceed the limit of 2", "M s s s s s A s s s", 3,
             "id", "a", "prompt", "hi", "stop", 3, "a", "b", "c");
    print_message("%d malformed requests refused\n", n_bad_cases);
    assert_true(n_bad_cases >= 60);
}

/* The seed's TokenGeneratorRequestTool shape, checked when a request is
 * decoded: {"id": "a", "messages": [...], "tools": [<good tool>, <case>]}. */
#define TOOLS_REQ "M s s s A M s s s s s A M s s s M s s "
#define TOOLS_ARGS                                                                                 \
    3, "id", "a", "messages", 1, 2, "role", "user", "content", "hi", "tools", 2, 2, "type",        \
        "function", "function", 1, "name", "f"
static void test_request_tools(void **state) {
    (void)state;
    const int I = ZI_EINVAL;
    n_bad_cases = 0;
    bad_case('r', NULL, I, "tools[1]: expected a map, got an integer", TOOLS_REQ "i", TOOLS_ARGS,
             1ll);
    bad_case('r', NULL, I, "tools[1].type: missing required field", TOOLS_REQ "M s M", TOOLS_ARGS,
             1, "function", 0);
    bad_case('r', NULL, I, "tools[1].type: expected a string, got an integer",
             TOOLS_REQ "M s i s M", TOOLS_ARGS, 2, "type", 1ll, "function", 0);
    bad_case('r', NULL, I, "tools[1].function: missing required field", TOOLS_REQ "M s s",
             TOOLS_ARGS, 1, "type", "function");
    bad_case('r', NULL, I, "tools[1].function: expected a map, got an array", TOOLS_REQ "M s s s A",
             TOOLS_ARGS, 2, "type", "function", "function", 0);
    bad_case('r', NULL, I, "tools[1].function.name: missing required field",
             TOOLS_REQ "M s s s M s s", TOOLS_ARGS, 2, "type", "function", "function", 1,
             "description", "d");
    bad_case('r', NULL, I, "tools[1].function.name: expected a string, got an integer",
             TOOLS_REQ "M s s s M s i", TOOLS_ARGS, 2, "type", "function", "function", 1, "name",
             3ll);
    bad_case('r', NULL, I, "tools[1].function.name: must not be empty", TOOLS_REQ "M s s s M s s",
             TOOLS_ARGS, 2, "type", "function", "function", 1, "name", "");
    bad_case('r', NULL, I, "tools[1].function.description: expected a string, got nil",
             TOOLS_REQ "M s s s M s s s n", TOOLS_ARGS, 2, "type", "function", "function", 2,
             "name", "g", "description");
    bad_case('r', NULL, I, "tools[1].function.parameters: expected a map, got an array",
             TOOLS_REQ "M s s s M s s s A", TOOLS_ARGS, 2, "type", "function", "function", 2,
             "name", "g", "parameters", 0);
    bad_case('r', NULL, I, "tools[1].strict: unknown field", TOOLS_REQ "M s s s M s s s t",
             TOOLS_ARGS, 3, "type", "function", "function", 1, "name", "g", "strict");
    bad_case('r', NULL, I, "tools[1].function.strict: unknown field", TOOLS_REQ "M s s s M s s s t",
             TOOLS_ARGS, 2, "type", "function", "function", 2, "name", "g", "strict");
    bad_case('r', NULL, I, "tools[1].type: duplicate field", TOOLS_REQ "M s s s s s M", TOOLS_ARGS,
             3, "type", "function", "type", "function", "function", 0);
    bad_case('r', NULL, I, "tools[1]: map key #0 is an integer, not a string", TOOLS_REQ "M i s",
             TOOLS_ARGS, 1, 0ll, "x");
    bad_case('r', NULL, I, "tools: expected an array, got a map", "M s s s s s M s s s M s s", 3,
             "id", "a", "prompt", "hi", "tools", 2, "type", "function", "function", 1, "name", "f");
    bad_case('r', NULL, I, "tools: only used with messages", "M s s s s s A M s s s M s s", 3, "id",
             "a", "prompt", "hi", "tools", 1, 2, "type", "function", "function", 1, "name", "f");
    bad_case('r', NULL, I, "chat_template_options: only used with messages", "M s s s s s M s i", 3,
             "id", "a", "prompt", "hi", "chat_template_options", 1, "x", 1ll);
    assert_int_equal(n_bad_cases, 17);
    /* Accepted: the full shape, and an empty list. */
    msgpack_sbuffer sb = sb_new();
    build(&sb, TOOLS_REQ "M s s s M s s s s s M", TOOLS_ARGS, 2, "type", "function", "function", 3,
          "name", "g", "description", "d", "parameters", 0);
    zi_request r;
    zi_error e = {0};
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    assert_true(r.tools.len > 0);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s s s s s A", 3, "id", "a", "prompt", "hi", "tools", 0);
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &e), ZI_OK);
    zi_request_free(&r);
    msgpack_sbuffer_destroy(&sb);
}

static void test_malformed_other(void **state) {
    (void)state;
    const int I = ZI_EINVAL;
    n_bad_cases = 0;
    int64_t t[3] = {4, 5, 6};
    uint8_t d[24];
    le64(d, t, 3);
#define NP3 "M s t s s s A i s b"
#define NP3ARGS 4, "__np__", "dtype", "int64", "shape", 1, 3ll, "data", d, (size_t)24
    bad_case('c', NULL, I, "tokens: missing required field", "M s i", 1, "max_length", 10ll);
    bad_case('c', NULL, I, "max_length: missing required field", "M s " NP3, 1, "tokens", NP3ARGS);
    bad_case('c', NULL, I, "max_length: 3 leaves no room after prompt_len 3", "M s " NP3 " s i", 2,
             "tokens", NP3ARGS, "max_length", 3ll);
    bad_case('c', NULL, I, "active_idx: 3 is beyond end_idx 2", "M s " NP3 " s i s i s i s i", 5,
             "tokens", NP3ARGS, "max_length", 10ll, "_active_idx", 3ll, "_end_idx", 2ll,
             "_prompt_len", 2ll);
    bad_case('c', NULL, I, "_end_idx: 4 is beyond the 3 tokens sent", "M s " NP3 " s i s i", 3,
             "tokens", NP3ARGS, "max_length", 10ll, "_end_idx", 4ll);
    bad_case('c', NULL, I, "_start_idx: -2 is outside [-1, 2147483647]", "M s " NP3 " s i s i", 3,
             "tokens", NP3ARGS, "max_length", 10ll, "_start_idx", -2ll);
    bad_case('c', NULL, I, "_status: \"done\" is not a status", "M s " NP3 " s i s s", 3, "tokens",
             NP3ARGS, "max_length", 10ll, "_status", "done");
    bad_case('c', NULL, I, "_matcher: a grammar matcher cannot travel", "M s " NP3 " s i s M", 3,
             "tokens", NP3ARGS, "max_length", 10ll, "_matcher", 0);
    bad_case('c', NULL, I, "_log_probabilities_data: 3 is outside [0, 2]",
             "M s " NP3 " s i s M i n", 3, "tokens", NP3ARGS, "max_length", 10ll,
             "_log_probabilities_data", 1, 3ll);
    bad_case('c', NULL, I,
             "_log_probabilities_data.1.token_log_probabilities: missing required field",
             "M s " NP3 " s i s M i M", 3, "tokens", NP3ARGS, "max_length", 10ll,
             "_log_probabilities_data", 1, 1ll, 0);
    bad_case('c', NULL, I, "sampling_params.top_p: 1.5 is outside (0, 1]",
             "M s " NP3 " s i s M s d", 3, "tokens", NP3ARGS, "max_length", 10ll, "sampling_params",
             1, "top_p", 1.5);
    bad_case('c', NULL, I, "eos_sequences[0]: empty sequence", "M s " NP3 " s i s A A", 3, "tokens",
             NP3ARGS, "max_length", 10ll, "eos_sequences", 1, 0);
    bad_case('c', NULL, I, "eos_token_ids[1]: -7 is outside", "M s " NP3 " s i s A i i", 3,
             "tokens", NP3ARGS, "max_length", 10ll, "eos_token_ids", 2, 1ll, -7ll);
    bad_case('c', NULL, I, "committed_idx: 2 is beyond start_idx 1", "M s " NP3 " s i s i s i", 4,
             "tokens", NP3ARGS, "max_length", 10ll, "_start_idx", 1ll, "_committed_idx", 2ll);
    bad_case('c', NULL, I, "_size: 2 is below _end_idx 3", "M s " NP3 " s i s i", 3, "tokens",
             NP3ARGS, "max_length", 10ll, "_size", 2ll);
    bad_case('c', NULL, I, "tokens: a context needs at least one token", "M s A s i", 2, "tokens",
             0, "max_length", 10ll);
    bad_case('l', NULL, I, "lp.top_log_probabilities: 1 entries, but token_log_probabilities has 2",
             "M s A d d s A M", 2, "token_log_probabilities", 2, -1.0, -2.0,
             "top_log_probabilities", 1, 0);
    bad_case('l', NULL, I, "lp.token_log_probabilities[1]: nan is not a log probability",
             "M s A d d s A M M", 2, "token_log_probabilities", 2, -1.0, (double)NAN,
             "top_log_probabilities", 2, 0, 0);
    bad_case('l', NULL, I, "lp.top_log_probabilities[0]: expected an integer, got a string",
             "M s A d s A M s d", 2, "token_log_probabilities", 1, -1.0, "top_log_probabilities", 1,
             1, "5", -1.0);
    bad_case('l', NULL, I, "lp.top_log_probabilities[0].5: inf is not a log probability",
             "M s A d s A M i d", 2, "token_log_probabilities", 1, -1.0, "top_log_probabilities", 1,
             1, 5ll, (double)INFINITY);
    bad_case('l', NULL, I, "lp.top_log_probabilities[0]: token id 5 appears twice",
             "M s A d s A M i d i d", 2, "token_log_probabilities", 1, -1.0,
             "top_log_probabilities", 1, 2, 5ll, -1.0, 5ll, -2.0);
    bad_case('l', NULL, I,
             "lp.token_log_probabilities.dtype: \"int64\" is not accepted here (expected float32)",
             "M s " NP3 " s A", 2, "token_log_probabilities", NP3ARGS, "top_log_probabilities", 0);
    bad_case('t', NULL, I, "final_status: \"finished\" is not a status", "M s A s s", 2, "tokens",
             0, "final_status", "finished");
    bad_case('t', NULL, I, "tokens[1].next_token: missing required field", "M s A M s i M s s", 2,
             "tokens", 2, 1, "next_token", 3ll, 0, "final_status", "stop");
    bad_case('t', NULL, I, "tokens[0].next_token: expected a token id or a string, got a float",
             "M s A M s d s s", 2, "tokens", 1, 1, "next_token", 3.0, "final_status", "stop");
    bad_case('t', NULL, I, "tokens[0].next_token: -3 is outside", "M s A M s i s s", 2, "tokens", 1,
             1, "next_token", -3ll, "final_status", "active");
    bad_case('t', NULL, I, "tokens[0].log_probabilities: expected a map, got an array",
             "M s A M s i s A s s", 2, "tokens", 1, 2, "next_token", 3ll, "log_probabilities", 0,
             "final_status", "active");
#undef NP3
#undef NP3ARGS
    print_message("%d malformed contexts / log probabilities / responses refused\n", n_bad_cases);
    assert_true(n_bad_cases >= 25);
}

/* ---- the raw-bytes pre-scan ------------------------------------------------ */

static void test_prescan(void **state) {
    (void)state;
    zi_error e = {0};
    msgpack_unpacked u;
    /* An array header that claims 2^32-1 entries in 5 bytes: refused before
     * msgpack-c could size an allocation from it. */
    const uint8_t huge[] = {0x81, 0xa1, 'x', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_int_equal(zi_msgpack_parse(huge, sizeof huge, NULL, &u, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "x: array of 4294967295 entries exceeds the limit of 1048576");
    const uint8_t lie[] = {0x81, 0xa1, 'x', 0xdc, 0x01, 0x00, 0x01, 0x02};
    assert_int_equal(zi_msgpack_parse(lie, sizeof lie, NULL, &u, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "x: array at byte 3 claims 256 entries but only 2 bytes remain");
    const uint8_t map_lie[] = {0xdf, 0x00, 0x00, 0x10, 0x00, 0xc0};
    assert_int_equal(zi_msgpack_parse(map_lie, sizeof map_lie, NULL, &u, &e), ZI_EFORMAT);
    ERR_HAS(e, "claims 4096 entries");
    /* truncated string, truncated header, trailing bytes, 0xc1, empty */
    const uint8_t trunc[] = {0x81, 0xa2, 'i', 'd', 0xa5, 'a', 'b'};
    assert_int_equal(zi_msgpack_parse(trunc, sizeof trunc, NULL, &u, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "message: 5 bytes at byte 4 run past the end (2 left) in id");
    const uint8_t trunc_hdr[] = {0x91, 0xcd, 0x01};
    assert_int_equal(zi_msgpack_parse(trunc_hdr, sizeof trunc_hdr, NULL, &u, &e), ZI_EFORMAT);
    ERR_HAS(e, "run past the end");
    const uint8_t trunc_str32[] = {0xdb, 0xff, 0xff};
    assert_int_equal(zi_msgpack_parse(trunc_str32, sizeof trunc_str32, NULL, &u, &e), ZI_EFORMAT);
    ERR_HAS(e, "truncated header at byte 0");
    const uint8_t trail[] = {0x80, 0x00};
    assert_int_equal(zi_msgpack_parse(trail, sizeof trail, NULL, &u, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "message: 1 trailing bytes after the object");
    const uint8_t never[] = {0x91, 0xc1};
    assert_int_equal(zi_msgpack_parse(never, sizeof never, NULL, &u, &e), ZI_EFORMAT);
    ERR_HAS(e, "0xc1 at 1 is not msgpack");
    assert_int_equal(zi_msgpack_parse("", 0, NULL, &u, &e), ZI_EFORMAT);
    ERR_HAS(e, "truncated at byte 0");
    assert_int_equal(zi_msgpack_parse(NULL, 5, NULL, &u, &e), ZI_EINVAL);
    /* Nesting: 40 maps deep, beyond the default 16 and msgpack-c's 32;
     * the message gives the key path reached. */
    msgpack_sbuffer sb = sb_new();
    for (int i = 0; i < 40; i++) build(&sb, "M s", 1, "a");
    build(&sb, "n");
    assert_int_equal(zi_msgpack_parse(sb.data, sb.size, NULL, &u, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "a.a.a.a.a.a.a.a.a.a.a.a.a.a.a.a: nested deeper than 16 levels");
    zi_codec_limits deep = zi_codec_limits_default();
    deep.max_depth = 1000; /* capped */
    assert_int_equal(zi_msgpack_parse(sb.data, sb.size, &deep, &u, &e), ZI_EINVAL);
    ERR_HAS(e, "nested deeper than 30 levels");
    msgpack_sbuffer_destroy(&sb);
    /* Nested arrays show indices in the path. */
    sb = sb_new();
    build(&sb, "M s A i A", 1, "tools", 2, 1ll, 1);
    for (int i = 0; i < 20; i++) build(&sb, "A", 1);
    build(&sb, "n");
    assert_int_equal(zi_msgpack_parse(sb.data, sb.size, NULL, &u, &e), ZI_EINVAL);
    ERR_HAS(e, "tools[1][0][0]");
    msgpack_sbuffer_destroy(&sb);
    /* Exactly at the limit is fine. */
    sb = sb_new();
    for (int i = 0; i < 16; i++) build(&sb, "M s", 1, "a");
    build(&sb, "n");
    assert_int_equal(zi_msgpack_parse(sb.data, sb.size, NULL, &u, &e), ZI_OK);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    /* Every msgpack type the scanner must step over. */
    sb = sb_new();
    build(&sb, "A i i i i i u u d f t F n S b x x", 16, 1ll, -1ll, -200ll, -40000ll, -3000000000ll,
          200ull, 70000ull, 1.5, 2.5, "s", (size_t)1, "b", (size_t)1, 5, "12345678", (size_t)8, 6,
          "abc", (size_t)3);
    assert_int_equal(zi_msgpack_check(sb.data, sb.size, NULL, &e), ZI_OK);
    msgpack_sbuffer_destroy(&sb);
}

/* Every proper prefix of a valid message fails; random byte mutations fail
 * or decode, never crash or leak (run under ASan/UBSan). */
static void test_truncation_and_mutation(void **state) {
    (void)state;
    zi_error e = {0};
    zi_sampling_params sp = odd_sampling();
    sp.max_new_tokens = 100;
    sp.min_new_tokens = 0;
    zi_text_context c;
    const int32_t prompt[4] = {1, 2, 3, 4};
    assert_int_equal(zi_text_context_init(&c, prompt, 4, 512, &sp, &e), ZI_OK);
    zi_sampling_params_free(&sp);
    assert_int_equal(zi_text_context_update(&c, 9, make_lp(-1.0f), &e), ZI_OK);
    char *buf;
    size_t len;
    assert_int_equal(zi_codec_text_context_to_bytes(&c, &buf, &len, &e), ZI_OK);
    zi_text_context_free(&c);
    for (size_t n = 0; n < len; n++) {
        zi_text_context d;
        int rc = zi_codec_text_context_from_bytes(buf, n, NULL, &d, &e);
        if (rc == ZI_OK) fail_msg("prefix of %zu/%zu bytes decoded", n, len);
        assert_int_equal(rc, ZI_EFORMAT);
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char *m = malloc(len);
    int ok = 0, refused = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(m, buf, len);
        int flips = 1 + (int)(it % 4);
        for (int f = 0; f < flips; f++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            m[(x >> 8) % len] = (char)(x >> 40);
        }
        zi_text_context d;
        int rc = zi_codec_text_context_from_bytes(m, len, NULL, &d, &e);
        if (rc == ZI_OK) {
            ok++;
            assert_int_equal(zi_text_context_check(&d, &e), ZI_OK);
            zi_text_context_free(&d);
        } else {
            refused++;
            assert_true(strlen(e.msg) > 0);
        }
    }
    print_message("mutations: %d decoded, %d refused\n", ok, refused);
    assert_true(refused > 0);
    free(m);
    free(buf);

    /* Same for a request. */
    zi_request r;
    zi_request_init(&r);
    zi_string_set(&r.id, "abc", 3, NULL);
    zi_request_add_message(&r, "user", "hello there", 11, NULL);
    zi_str_list_push(&r.stop, "x", 1, NULL);
    assert_int_equal(zi_codec_request_to_bytes(&r, &buf, &len, &e), ZI_OK);
    zi_request_free(&r);
    m = malloc(len);
    for (int it = 0; it < 20000; it++) {
        memcpy(m, buf, len);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        m[(x >> 8) % len] = (char)(x >> 40);
        zi_request q;
        if (zi_codec_request_from_bytes(m, len, NULL, &q, &e) == ZI_OK) zi_request_free(&q);
        /* The id peek stays inside the bytes, whatever they hold. */
        const char *pid;
        size_t pn;
        size_t cut = (size_t)(x >> 20) % (len + 1);
        if (zi_msgpack_peek_str(m, cut, "id", &pid, &pn))
            assert_true(pid >= m && pid + pn <= m + cut);
    }
    free(m);
    free(buf);
}

/* zi_msgpack_peek_str: a refused frame's id, read without recursion. */
static bool peek(const msgpack_sbuffer *sb, size_t len, const char *want) {
    const char *v = NULL;
    size_t n = 0;
    bool got = zi_msgpack_peek_str(sb->data, len, "id", &v, &n);
    if (want && (!got || n != strlen(want) || memcmp(v, want, n) != 0))
        fail_msg("want id \"%s\", got %s \"%.*s\"", want, got ? "" : "nothing", (int)n, v ? v : "");
    return got;
}

static void test_peek_str(void **state) {
    (void)state;
    msgpack_sbuffer sb = sb_new();
    /* After 300 levels of nesting (zi_msgpack_check refuses 17) and a bin. */
    build(&sb, "M s", 3, "deep");
    for (int i = 0; i < 300; i++) build(&sb, "A", 1);
    build(&sb, "i s b s s", 1ll, "blob", "\0\xc1\xa2id", (size_t)4, "id", "r-1");
    zi_error e = {0};
    assert_int_equal(zi_msgpack_check(sb.data, sb.size, NULL, &e), ZI_EINVAL);
    peek(&sb, sb.size, "r-1");
    assert_false(peek(&sb, sb.size - 2, NULL)); /* the id cut short */
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s i s s", 2, "id", 7ll, "x", "y"); /* an id that is no string */
    assert_false(peek(&sb, sb.size, NULL));
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "A s s", 2, "id", "z"); /* no map */
    assert_false(peek(&sb, sb.size, NULL));
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s A", 2, "a", 1); /* a count that lies: 2^32-1 entries */
    sb.data[sb.size - 1] = (char)0xdd;
    msgpack_sbuffer_write(&sb, "\xff\xff\xff\xff\xa2id\xa1q", 8);
    assert_false(peek(&sb, sb.size, NULL));
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    /* A key that is an array holding "id": stepped over whole, not read. */
    build(&sb, "M A s s s s s s", 3, 1, "x", "id", "abc", "zzz", "id", "real");
    peek(&sb, sb.size, "real");
    msgpack_sbuffer_destroy(&sb);
    sb = sb_new();
    build(&sb, "M s i s s", 2, "op", 1ll, "id", "last"); /* id as the last entry */
    peek(&sb, sb.size, "last");
    assert_false(zi_msgpack_peek_str(sb.data, 0, "id", &(const char *){NULL}, &(size_t){0}));
    msgpack_sbuffer_destroy(&sb);
}

/* keypath.h: the paths in every decoder's messages. */
static void test_keypath(void **state) {
    (void)state;
    zi_keypath p = {{0}, 0};
    size_t a = zi_keypath_push(&p, "tools");
    zi_keypath_push(&p, "[%d]", 3);
    size_t b = zi_keypath_push_key(&p, ".", "a\nb\xc3\xa9", 5); /* a newline, then U+00E9 */
    assert_string_equal(p.s, "tools[3].a?b??");
    zi_keypath_pop(&p, b); /* back to where that push began */
    assert_string_equal(p.s, "tools[3]");
    char long_key[100];
    memset(long_key, 'k', sizeof long_key);
    zi_keypath_push_key(&p, ".", long_key, sizeof long_key);
    assert_int_equal(p.n, 8 + 1 + 64 + 3); /* 64 bytes of the key, then "..." */
    assert_string_equal(p.s + p.n - 3, "...");
    zi_keypath_pop(&p, a); /* a: the length before "tools" */
    assert_string_equal(p.s, "");
    for (int i = 0; i < 40; i++) zi_keypath_push(&p, ".field%d", i); /* past 192 bytes */
    assert_int_equal(p.n, sizeof p.s - 1);
    assert_string_equal(p.s + p.n - 3, "...");
    size_t full = zi_keypath_push(&p, ".more");
    assert_int_equal(full, p.n); /* a full path takes nothing more */
    char out[8];
    zi_printable(out, sizeof out, "abcdefghij", 10);
    assert_string_equal(out, "abcd"); /* cut to fit the buffer */
}

/* rf_case: packs what build writes into a zi_bytes and asks
 * zi_response_format_kind about it. */
static int rf_case(void (*build)(msgpack_packer *), int *kind, char **schema, zi_error *err) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    build(&pk);
    zi_bytes b = {(uint8_t *)sb.data, sb.size};
    int rc = zi_response_format_kind(&b, kind, schema, err);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

static void pk_str(msgpack_packer *pk, const char *s) {
    msgpack_pack_str_with_body(pk, s, strlen(s));
}
static void rf_text(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1), pk_str(pk, "type"), pk_str(pk, "text");
}
static void rf_object(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1), pk_str(pk, "type"), pk_str(pk, "json_object");
}
/* OpenAI's wrapper, with a string that needs escaping and numbers. */
static void rf_wrapped(msgpack_packer *pk) {
    msgpack_pack_map(pk, 2), pk_str(pk, "type"), pk_str(pk, "json_schema");
    pk_str(pk, "json_schema"), msgpack_pack_map(pk, 3);
    pk_str(pk, "name"), pk_str(pk, "n"), pk_str(pk, "strict"), msgpack_pack_true(pk);
    pk_str(pk, "schema"), msgpack_pack_map(pk, 3);
    pk_str(pk, "type"), pk_str(pk, "object");
    pk_str(pk, "enum"), msgpack_pack_array(pk, 4), pk_str(pk, "a\"\\\n"),
        msgpack_pack_int64(pk, -3), msgpack_pack_double(pk, 0.5), msgpack_pack_nil(pk);
    pk_str(pk, "required"), msgpack_pack_array(pk, 0);
}
static void rf_bare(msgpack_packer *pk) {
    msgpack_pack_map(pk, 2), pk_str(pk, "type"), pk_str(pk, "json_schema");
    pk_str(pk, "json_schema"), msgpack_pack_map(pk, 1), pk_str(pk, "type"), pk_str(pk, "string");
}
static void rf_no_schema(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1), pk_str(pk, "type"), pk_str(pk, "json_schema");
}
static void rf_nan(msgpack_packer *pk) {
    msgpack_pack_map(pk, 2), pk_str(pk, "type"), pk_str(pk, "json_schema");
    pk_str(pk, "json_schema"), msgpack_pack_map(pk, 1), pk_str(pk, "maximum"),
        msgpack_pack_double(pk, NAN);
}
static void rf_other(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1), pk_str(pk, "type"), pk_str(pk, "grammar");
}
static void rf_no_type(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1), pk_str(pk, "kind"), pk_str(pk, "text");
}

static void test_response_format(void **state) {
    (void)state;
    zi_error err = {0};
    int kind = -1;
    char *schema = NULL;
    zi_bytes none = {NULL, 0};
    assert_int_equal(zi_response_format_kind(&none, &kind, &schema, &err), ZI_OK);
    assert_int_equal(kind, ZI_RF_NONE);
    assert_null(schema);
    assert_int_equal(rf_case(rf_text, &kind, &schema, &err), ZI_OK);
    assert_int_equal(kind, ZI_RF_NONE);
    assert_int_equal(rf_case(rf_object, &kind, &schema, &err), ZI_OK);
    assert_int_equal(kind, ZI_RF_JSON_OBJECT);
    assert_null(schema);
    assert_int_equal(rf_case(rf_wrapped, &kind, &schema, &err), ZI_OK);
    assert_int_equal(kind, ZI_RF_JSON_SCHEMA);
    assert_string_equal(schema, "{\"type\":\"object\",\"enum\":[\"a\\\"\\\\\\u000a\",-3,0.5,null],"
                                "\"required\":[]}");
    free(schema);
    assert_int_equal(rf_case(rf_bare, &kind, NULL, &err), ZI_OK);
    assert_int_equal(kind, ZI_RF_JSON_SCHEMA);
    assert_int_equal(rf_case(rf_bare, &kind, &schema, &err), ZI_OK);
    assert_string_equal(schema, "{\"type\":\"string\"}");
    free(schema);
    assert_int_equal(rf_case(rf_no_schema, &kind, &schema, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "response_format.json_schema: missing or not a map");
    assert_int_equal(rf_case(rf_nan, &kind, &schema, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "response_format.json_schema: NaN or infinity");
    assert_null(schema);
    assert_int_equal(rf_case(rf_other, &kind, &schema, &err), ZI_EUNSUPPORTED);
    assert_string_equal(err.msg, "response_format: type 'grammar' is not supported (text, "
                                 "json_object or json_schema)");
    assert_int_equal(rf_case(rf_no_type, &kind, &schema, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "response_format.type: missing or not a string");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_sampling),
        cmocka_unit_test(test_roundtrip_request),
        cmocka_unit_test(test_roundtrip_context),
        cmocka_unit_test(test_roundtrip_responses),
        cmocka_unit_test(test_encode_refusals),
        cmocka_unit_test(test_numpy_layout),
        cmocka_unit_test(test_numpy_variants),
        cmocka_unit_test(test_context_derived),
        cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_request_tools),
        cmocka_unit_test(test_malformed_other),
        cmocka_unit_test(test_prescan),
        cmocka_unit_test(test_truncation_and_mutation),
        cmocka_unit_test(test_keypath),
        cmocka_unit_test(test_peek_str),
        cmocka_unit_test(test_response_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
