/*
 * test_codec_malformed.c - cmocka tests for what the codec (protocol/codec.h)
 * and response_format.c must refuse, and how.
 *
 * A table of malformed messages, each of which must be refused with the
 * expected status and a message naming the field; the raw-bytes pre-scan
 * (truncation, trailing bytes, lying counts, deep nesting); under
 * -fsanitize=address,undefined, every truncation and many random mutations
 * of valid messages, which must fail cleanly or decode, never crash; the
 * id peek of a refused frame; the key paths the messages start with; and
 * response_format's kinds and refusals. The round trips are in
 * test_codec.c; the helpers both use in test_codec_util.h.
 */
#include "test_codec_util.h"

#include <stdio.h>

#include "keypath.h"
#include "response_format.h"

/* ---- malformed messages ---------------------------------------------------- */

static int n_bad_cases;

/* Builds a message, decodes it as `what` says ('r' request, 'c' context,
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
    char long_id[300];
    memset(long_id, 'a', sizeof long_id); /* 44 bytes past the id limit */
    bad_case('r', NULL, I, "id: string of 300 bytes exceeds the limit of 256", "M s S s s", 2, "id",
             long_id, sizeof long_id, "prompt", "hi");
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
                 "int64", "shape", 1, 2ll, "data", "0123456789abcdef");
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
    bad_case('r', NULL, I, "messages[0].speaker: unknown field", "M s s s A M s s s s s s", 2, "id",
             "a", "messages", 1, 3, "role", "user", "content", "x", "speaker", "bob");
    bad_case('r', NULL, I, "messages[0].name: only a tool message names its function",
             "M s s s A M s s s s s s", 2, "id", "a", "messages", 1, 3, "role", "user", "content",
             "x", "name", "bob");
    bad_case('r', NULL, ZI_EUNSUPPORTED,
             "messages[0].content[1].type: part type \"image_url\" is not supported",
             "M s s s A M s s s A M s s s s M s s", 2, "id", "a", "messages", 1, 2, "role", "user",
             "content", 2, 2, "type", "text", "text", "look", 1, "type", "image_url");
    bad_case('r', NULL, I,
             "messages[0].content: expected a string or an array of parts, got an integer",
             "M s s s A M s s s i", 2, "id", "a", "messages", 1, 2, "role", "user", "content", 3ll);
    /* tool and assistant tool-call messages */
    bad_case('r', NULL, I, "messages[0].tool_calls: only an assistant message makes tool calls",
             "M s s s A M s s s s s A", 2, "id", "a", "messages", 1, 3, "role", "user", "content",
             "x", "tool_calls", 0);
    bad_case('r', NULL, I, "messages[0].tool_call_id: only a tool message answers a tool call",
             "M s s s A M s s s s s s", 2, "id", "a", "messages", 1, 3, "role", "assistant",
             "content", "x", "tool_call_id", "c1");
    bad_case('r', NULL, I,
             "messages[0].content: may be null only in an assistant message with tool_calls",
             "M s s s A M s s s n", 2, "id", "a", "messages", 1, 2, "role", "assistant", "content");
    bad_case('r', NULL, I, "messages[0].content: missing required field", "M s s s A M s s s s", 2,
             "id", "a", "messages", 1, 2, "role", "tool", "tool_call_id", "c1");
    bad_case('r', NULL, I, "messages[0].tool_calls: must not be empty", "M s s s A M s s s A", 2,
             "id", "a", "messages", 1, 2, "role", "assistant", "tool_calls", 0);
    bad_case('r', NULL, I, "messages[0].tool_calls: expected an array of calls, got a string",
             "M s s s A M s s s s", 2, "id", "a", "messages", 1, 2, "role", "assistant",
             "tool_calls", "f()");
#define CALL1 "M s s s A M s s s A "
#define CALL1_ARGS 2, "id", "a", "messages", 1, 2, "role", "assistant", "tool_calls", 1
    bad_case('r', NULL, I, "messages[0].tool_calls[0].type: must be \"function\"",
             CALL1 "M s s s M s s s M", CALL1_ARGS, 2, "type", "other", "function", 2, "name", "f",
             "arguments", 0);
    bad_case('r', NULL, I, "messages[0].tool_calls[0].function: missing required field",
             CALL1 "M s s", CALL1_ARGS, 1, "id", "c1");
    bad_case('r', NULL, I, "messages[0].tool_calls[0].function.name: must not be empty",
             CALL1 "M s M s s s M", CALL1_ARGS, 1, "function", 2, "name", "", "arguments", 0);
    bad_case('r', NULL, I,
             "messages[0].tool_calls[0].function.arguments: expected a map or a JSON string, got "
             "an integer",
             CALL1 "M s M s s s i", CALL1_ARGS, 1, "function", 2, "name", "f", "arguments", 3ll);
    bad_case('r', NULL, I, "messages[0].tool_calls[0].function.arguments: missing required field",
             CALL1 "M s M s s", CALL1_ARGS, 1, "function", 1, "name", "f");
    bad_case('r', NULL, I, "messages[0].tool_calls[0].idx: unknown field",
             CALL1 "M s s s M s s s M", CALL1_ARGS, 2, "idx", "c", "function", 2, "name", "f",
             "arguments", 0);
    bad_case('r', NULL, I, "messages[0].tool_calls[0].id: expected a string, got an integer",
             CALL1 "M s i s M s s s M", CALL1_ARGS, 2, "id", 7ll, "function", 2, "name", "f",
             "arguments", 0);
#undef CALL1
#undef CALL1_ARGS
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
    /* images: bin values, one <__media__> marker each in the text */
    bad_case('r', NULL, I, "images: expected an array of bytes (msgpack bin), got a string",
             "M s s s s s s", 3, "id", "a", "prompt", "<__media__>", "images", "\x89PNG");
    bad_case('r', NULL, I, "images[1]: expected bytes (msgpack bin), got a string",
             "M s s s s s A b s", 3, "id", "a", "prompt", "<__media__><__media__>", "images", 2,
             "\x89PNG", (size_t)4, "\x89PNG");
    bad_case('r', NULL, I, "images[0]: an empty image", "M s s s s s A b", 3, "id", "a", "prompt",
             "<__media__>", "images", 1, "", (size_t)0);
    bad_case('r', NULL, I,
             "images: 1 image, but the prompt holds 0 <__media__> markers (one marks where each "
             "image goes)",
             "M s s s s s A b", 3, "id", "a", "prompt", "hi", "images", 1, "\x89PNG", (size_t)4);
    bad_case('r', NULL, I, "images: 1 image, but the prompt holds 2 <__media__> markers",
             "M s s s s s A b", 3, "id", "a", "prompt", "<__media__> and <__media__>", "images", 1,
             "\x89PNG", (size_t)4);
    bad_case('r', NULL, I, "images: 2 images, but the messages' contents hold 1 <__media__> marker",
             "M s s s A M s s s s s A b b", 3, "id", "a", "messages", 1, 2, "role", "user",
             "content", "look: <__media__ ><__media__>", "images", 2, "\x89PNG", (size_t)4, "GIF8",
             (size_t)4);
    bad_case('r', NULL, I, "images: a prompt of token ids cannot place images", "M s s s A i s A b",
             3, "id", "a", "prompt", 1, 5ll, "images", 1, "\x89PNG", (size_t)4);
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
    small = zi_codec_limits_default();
    small.max_images = 1;
    small.max_image_bytes = 3;
    bad_case('r', &small, I, "images: 2 images exceed the limit of 1", "M s s s s s A b b", 3, "id",
             "a", "prompt", "<__media__><__media__>", "images", 2, "abc", (size_t)3, "abc",
             (size_t)3);
    bad_case('r', &small, I, "images[0]: 4 bytes exceed the limit of 3 bytes per image",
             "M s s s s s A b", 3, "id", "a", "prompt", "<__media__>", "images", 1, "\x89PNG",
             (size_t)4);
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
    zi_text_context c;
    const int32_t prompt[4] = {1, 2, 3, 4};
    odd_context(&c, prompt, 4, 512);
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
