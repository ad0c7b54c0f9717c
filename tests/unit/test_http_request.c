/*
 * test_http_request.c - cmocka tests for zinfer-http's request translation
 * (http/http_request.c) and error mapping (http/http_error.c): the router
 * requests an OpenAI body becomes (OpenAI's sampling defaults, one request
 * per choice with seed + i, text parts joined, completions' default
 * max_tokens), the field each bad body is refused for, and the router's
 * errors mapped to statuses with the request's field names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "http_ctx.h"
#include "http_error.h"
#include "http_request.h"
#include "tool_stream.h"

/* Choice i's request, unpacked (the caller destroys u). */
static const msgpack_object *unpack(const zi_http_gen *g, int i, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    assert_int_equal(msgpack_unpack_next(u, g->req[i].sb.data, g->req[i].sb.size, NULL),
                     MSGPACK_UNPACK_SUCCESS);
    return &u->data;
}

static int parse(const char *body, zi_http_kind kind, zi_http_gen *g, zi_http_error *e) {
    return zi_http_parse_generate(body, strlen(body), kind, NULL, g, e);
}

static void assert_str(const msgpack_object *o, const char *want) {
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(want));
    assert_memory_equal(o->via.str.ptr, want, strlen(want));
}

/* base64 as RFC 4648 has it: its test vectors, padding optional,
 * whitespace skipped, and what is refused where. */
static void test_base64(void **state) {
    (void)state;
    static const char *const vec[][2] = {{"", ""},
                                         {"Zg==", "f"},
                                         {"Zm8=", "fo"},
                                         {"Zm9v", "foo"},
                                         {"Zm9vYg", "foob"},
                                         {"Zm9vYmE", "fooba"},
                                         {"Zm9vYmFy", "foobar"},
                                         {"Zm9v\r\nYmFy", "foobar"}};
    uint8_t out[32];
    size_t bad = 0;
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        long long n = zi_base64_decode(vec[i][0], strlen(vec[i][0]), out, &bad);
        assert_int_equal(n, (long long)strlen(vec[i][1]));
        assert_memory_equal(out, vec[i][1], (size_t)n);
    }
    assert_int_equal(zi_base64_decode("+/-_", 4, out, &bad), 3);
    assert_int_equal(out[0], 0xfb);
    assert_int_equal(out[1], 0xff);
    assert_int_equal(out[2], 0xbf);
    static const struct {
        const char *s;
        size_t bad;
    } refused[] = {{"Zm9v!", 4}, {"Z===", 1}, {"Zm=v", 3}, {"Zg===", 4}, {"Zm9vY", 5}, {"=", 0}};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        assert_int_equal(zi_base64_decode(refused[i].s, strlen(refused[i].s), out, &bad), -1);
        assert_int_equal(bad, refused[i].bad);
    }
}

/* image_url parts: the data URL's bytes in the request's images, the
 * marker in the message's text; each bad URL refused naming the part. */
static void test_chat_images(void **state) {
    (void)state;
    zi_http_gen g;
    zi_http_error e;
    assert_int_equal(
        parse("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", "
              "\"text\": \"a\"}, {\"type\": \"image_url\", \"image_url\": {\"url\": "
              "\"data:image/png;base64,Zm9v\", \"detail\": \"low\"}}, {\"type\": "
              "\"image_url\", \"image_url\": \"DATA:;BASE64,YmFy\"}]}], \"n\": 2}",
              ZI_HTTP_CHAT, &g, &e),
        0);
    for (int i = 0; i < 2; i++) {
        msgpack_unpacked u;
        const msgpack_object *r = unpack(&g, i, &u);
        const msgpack_object *ms = zi_map_get(r, "messages");
        assert_str(zi_map_get(&ms->via.array.ptr[0], "content"), "a\n<__media__>\n<__media__>");
        const msgpack_object *im = zi_map_get(r, "images");
        assert_non_null(im);
        assert_int_equal(im->via.array.size, 2);
        assert_int_equal(im->via.array.ptr[0].type, MSGPACK_OBJECT_BIN);
        assert_int_equal(im->via.array.ptr[0].via.bin.size, 3);
        assert_memory_equal(im->via.array.ptr[0].via.bin.ptr, "foo", 3);
        assert_memory_equal(im->via.array.ptr[1].via.bin.ptr, "bar", 3);
        /* the router's decoder takes it as it is */
        zi_request rq;
        zi_error ze = {0};
        assert_int_equal(zi_codec_decode_request(r, NULL, "", &rq, &ze), ZI_OK);
        assert_int_equal(rq.n_images, 2);
        zi_request_free(&rq);
        msgpack_unpacked_destroy(&u);
    }
    zi_http_gen_free(&g);
    /* no image: no images key */
    assert_int_equal(
        parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", ZI_HTTP_CHAT, &g, &e),
        0);
    msgpack_unpacked u;
    assert_null(zi_map_get(unpack(&g, 0, &u), "images"));
    msgpack_unpacked_destroy(&u);
    zi_http_gen_free(&g);
    static const struct {
        const char *url;
        int status;
        const char *says;
    } bad[] = {
        {"https://example.com/cat.png", 400, "remote image URLs are not fetched"},
        {"http://x", 400, "send the image itself as a data: URL"},
        {"file:///etc/passwd", 400, "not a data: URL"},
        {"data:image/png,abc", 400, "is not base64"},
        {"data:image/png;base64", 400, "no ','"},
        {"data:image/png;base64,Zm9v!", 400, "not valid base64 ('!' at character 4)"},
        {"data:image/png;base64,Zm9vY", 400, "cut short"},
        {"data:image/png;base64,", 400, "the image is empty"},
        {"data:text/plain;base64,Zm9v", 400, "'text/plain' is not an image type"},
        {"data:image/png;base64,Zm9vYmFyYmF6", 413, "9 bytes, more than the limit of 8"},
    };
    zi_http_image_limits lim = {2, 8};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[256];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": "
                 "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": "
                 "\"image_url\", \"image_url\": {\"url\": \"%s\"}}]}]}",
                 bad[i].url);
        int rc = zi_http_parse_generate(body, strlen(body), ZI_HTTP_CHAT, &lim, &g, &e);
        if (rc != -1 || e.status != bad[i].status || !strstr(e.message, bad[i].says) ||
            strcmp(e.param, "messages[1].content[1].image_url.url"))
            fail_msg("%s: rc %d, status %d, param %s, message %s", bad[i].url, rc, e.status,
                     e.param, e.message);
    }
    /* more images than --max-images */
    const char *three = "{\"messages\": [{\"role\": \"user\", \"content\": ["
                        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:;base64,YQ\"}},"
                        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:;base64,YQ\"}},"
                        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:;base64,YQ\"}}"
                        "]}]}";
    assert_int_equal(zi_http_parse_generate(three, strlen(three), ZI_HTTP_CHAT, &lim, &g, &e), -1);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "messages[0].content[2].image_url.url");
    assert_non_null(strstr(e.message, "more than 2 images in one request"));
    assert_non_null(strstr(e.message, "--max-images"));
    lim.max_images = 0;
    assert_int_equal(zi_http_parse_generate(three, strlen(three), ZI_HTTP_CHAT, &lim, &g, &e), -1);
    assert_non_null(strstr(e.message, "accepts no images"));
    /* detail is auto, low or high */
    const char *det = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
                      "\"image_url\", \"image_url\": {\"url\": \"data:;base64,YQ\", \"detail\": "
                      "\"max\"}}]}]}";
    assert_int_equal(parse(det, ZI_HTTP_CHAT, &g, &e), -1);
    assert_string_equal(e.param, "messages[0].content[0].image_url.detail");
}

static void test_chat_defaults_and_choices(void **state) {
    (void)state;
    zi_http_gen g;
    zi_http_error e;
    assert_int_equal(parse("{\"model\": \"m\", \"n\": 3, \"seed\": 7, \"stop\": \"x\","
                           "\"messages\": [{\"role\": \"developer\", \"content\": \"s\"},"
                           "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                           "\"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}], \"unknown\": 1}",
                           ZI_HTTP_CHAT, &g, &e),
                     0);
    assert_int_equal(g.n, 3);
    assert_string_equal(g.model, "m");
    assert_int_equal(g.logprobs, -1);
    for (int i = 0; i < 3; i++) {
        msgpack_unpacked u;
        const msgpack_object *r = unpack(&g, i, &u);
        char id[8];
        snprintf(id, sizeof id, "g%d", i);
        assert_str(zi_map_get(r, "id"), id);
        assert_str(zi_map_get(r, "op"), "generate");
        assert_str(zi_map_get(r, "model_name"), "m");
        assert_str(zi_map_get(r, "stop"), "x");
        const msgpack_object *ms = zi_map_get(r, "messages");
        assert_int_equal(ms->via.array.size, 2);
        assert_str(zi_map_get(&ms->via.array.ptr[0], "role"), "system");
        assert_str(zi_map_get(&ms->via.array.ptr[1], "content"), "a\nb");
        const msgpack_object *sp = zi_map_get(r, "sampling_params");
        /* OpenAI samples: temperature 1, no top-k (the router's default is greedy) */
        assert_int_equal(zi_map_get(sp, "top_k")->via.i64, 0);
        assert_true(zi_map_get(sp, "temperature")->via.f64 == 1.0);
        assert_int_equal(zi_map_get(sp, "seed")->via.u64, 7 + i);
        assert_null(zi_map_get(sp, "max_new_tokens")); /* chat: the router's default */
        assert_null(zi_map_get(r, "logprobs"));
        msgpack_unpacked_destroy(&u);
    }
    zi_http_gen_free(&g);
}

static void test_completion_fields(void **state) {
    (void)state;
    zi_http_gen g;
    zi_http_error e;
    assert_int_equal(parse("{\"prompt\": [[1, 2, 3]], \"logprobs\": 0, \"echo\": true, "
                           "\"top_k\": 5, \"min_tokens\": 2, \"ignore_eos\": true, "
                           "\"timeout_ms\": 250, "
                           "\"response_format\": {\"type\": \"json_object\"}}",
                           ZI_HTTP_COMPLETION, &g, &e),
                     0);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.logprobs, 0);
    assert_true(g.echo);
    msgpack_unpacked u;
    const msgpack_object *r = unpack(&g, 0, &u);
    const msgpack_object *p = zi_map_get(r, "prompt");
    assert_int_equal(p->type, MSGPACK_OBJECT_ARRAY);
    assert_int_equal(p->via.array.size, 3);
    /* logprobs 0 still asks the router for 1: the token's own log probability */
    assert_int_equal(zi_map_get(r, "logprobs")->via.i64, 1);
    const msgpack_object *sp = zi_map_get(r, "sampling_params");
    assert_int_equal(zi_map_get(sp, "max_new_tokens")->via.i64, 16); /* OpenAI's default */
    assert_int_equal(zi_map_get(sp, "top_k")->via.i64, 5);
    assert_int_equal(zi_map_get(sp, "min_new_tokens")->via.i64, 2);
    assert_true(zi_map_get(sp, "ignore_eos")->via.boolean);
    assert_str(zi_map_get(zi_map_get(r, "response_format"), "type"), "json_object");
    assert_null(zi_map_get(sp, "logit_bias"));
    /* zinfer's extension: the router's per-request deadline, as given */
    assert_int_equal(zi_map_get(r, "timeout_ms")->via.i64, 250);
    assert_int_equal(g.timeout_ms, 250);
    msgpack_unpacked_destroy(&u);
    zi_http_gen_free(&g);
    /* Ollama's keep_alive: passed on in ms, which the router reads exactly */
    static const struct {
        const char *v, *want;
    } ka[] = {{"\"5m\"", "300000ms"}, {"30", "30000ms"}, {"0", "0ms"}, {"-1", "-1"}};
    for (size_t i = 0; i < sizeof ka / sizeof *ka; i++) {
        char body[80];
        snprintf(body, sizeof body, "{\"prompt\": \"x\", \"keep_alive\": %s}", ka[i].v);
        assert_int_equal(parse(body, ZI_HTTP_COMPLETION, &g, &e), 0);
        r = unpack(&g, 0, &u);
        assert_str(zi_map_get(r, "keep_alive"), ka[i].want);
        msgpack_unpacked_destroy(&u);
        zi_http_gen_free(&g);
    }
    /* logit_bias: OpenAI's string keys become the router's integer keys */
    assert_int_equal(parse("{\"prompt\": \"x\", \"logit_bias\": {\"5\": -100, \"17\": 2.5}}",
                           ZI_HTTP_COMPLETION, &g, &e),
                     0);
    r = unpack(&g, 0, &u);
    const msgpack_object *lb = zi_map_get(zi_map_get(r, "sampling_params"), "logit_bias");
    assert_non_null(lb);
    assert_int_equal(lb->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(lb->via.map.size, 2);
    for (uint32_t i = 0; i < 2; i++) {
        const msgpack_object_kv *kv = &lb->via.map.ptr[i];
        assert_int_equal(kv->key.type, MSGPACK_OBJECT_POSITIVE_INTEGER);
        assert_true(kv->key.via.u64 == 5 ? kv->val.via.f64 == -100.0
                                         : kv->key.via.u64 == 17 && kv->val.via.f64 == 2.5);
    }
    msgpack_unpacked_destroy(&u);
    zi_http_gen_free(&g);
    /* an empty object asks for nothing */
    assert_int_equal(parse("{\"prompt\": \"x\", \"logit_bias\": {}}", ZI_HTTP_COMPLETION, &g, &e),
                     0);
    r = unpack(&g, 0, &u);
    assert_null(zi_map_get(zi_map_get(r, "sampling_params"), "logit_bias"));
    msgpack_unpacked_destroy(&u);
    zi_http_gen_free(&g);
}

static void test_refusals_name_the_field(void **state) {
    (void)state;
    static const struct {
        zi_http_kind kind;
        const char *body, *param;
    } cases[] = {
        {ZI_HTTP_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 0}", "n"},
        {ZI_HTTP_CHAT, "{\"messages\": [{\"role\": \"function\", \"content\": \"x\"}]}",
         "messages[0].role"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content[0].image_url"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}]}]}",
         "messages[0].content[0].type"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logit_bias\": {\"x1\": 1}}",
         "logit_bias"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logit_bias\": {\"-1\": 1}}",
         "logit_bias"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"3\": 100.5}}", "logit_bias"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"3\": \"ban\"}}", "logit_bias"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [1]}", "logit_bias"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"99999999999\": 1}}",
         "logit_bias"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"top_logprobs\": 3}",
         "top_logprobs"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_completion_tokens\": 0}",
         "max_completion_tokens"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"temperature\": \"hot\"}",
         "temperature"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": [1, -2]}", "prompt[1]"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"a\", 3]}", "stop[1]"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 2}", "best_of"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"timeout_ms\": 0}", "timeout_ms"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"timeout_ms\": 86400001}", "timeout_ms"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"timeout_ms\": 1.5}", "timeout_ms"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"keep_alive\": \"5 parsecs\"}", "keep_alive"},
        {ZI_HTTP_COMPLETION, "{\"prompt\": \"x\", \"keep_alive\": true}", "keep_alive"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zi_http_gen g;
        zi_http_error e;
        assert_int_equal(parse(cases[i].body, cases[i].kind, &g, &e), -1);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, cases[i].param);
        assert_non_null(strstr(e.message, cases[i].param));
    }
    zi_http_gen g;
    zi_http_error e;
    assert_int_equal(parse("{\"prompt\": ", ZI_HTTP_COMPLETION, &g, &e), -1);
    assert_string_equal(e.code, "invalid_json");
    assert_int_equal(parse("[1]", ZI_HTTP_COMPLETION, &g, &e), -1);
    assert_non_null(strstr(e.message, "JSON object"));
}

static void test_router_errors(void **state) {
    (void)state;
    zi_http_gen g;
    zi_http_error e;
    assert_int_equal(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"max_completion_tokens\": 9}",
                           ZI_HTTP_CHAT, &g, &e),
                     0);
    zi_http_router_error(&e, "invalid_request", "sampling_params.max_new_tokens: 9 is too many",
                         "sampling_params.max_new_tokens", g.field_map);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "max_completion_tokens");
    assert_string_equal(e.message, "max_completion_tokens: 9 is too many");
    zi_http_router_error(&e, "invalid_request", "sampling_params.top_p: 2 is outside (0, 1]",
                         "sampling_params.top_p", g.field_map);
    assert_string_equal(e.param, "top_p");
    zi_http_router_error(&e, "invalid_request",
                         "sampling_params.logit_bias: token id 99999 is outside the vocabulary",
                         "sampling_params.logit_bias", g.field_map);
    assert_string_equal(e.param, "logit_bias");
    assert_string_equal(e.message, "logit_bias: token id 99999 is outside the vocabulary");
    zi_http_router_error(&e, "unsupported", "response_format.json_schema.properties.a: pattern",
                         "response_format.json_schema.properties.a", g.field_map);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.param, "response_format.json_schema.properties.a");
    zi_http_router_error(&e, "invalid_request", "no such model", "model_name", g.field_map);
    assert_int_equal(e.status, 404);
    assert_string_equal(e.param, "model");
    zi_http_router_error(&e, "overloaded", "queue full", NULL, g.field_map);
    assert_int_equal(e.status, 429);
    assert_string_equal(e.type, "rate_limit_error");
    zi_http_router_error(&e, "unavailable", "starting", NULL, g.field_map);
    assert_int_equal(e.status, 503);
    zi_http_router_error(&e, "worker_lost", "gone", NULL, g.field_map);
    assert_int_equal(e.status, 500);
    assert_string_equal(e.code, "worker_lost");
    zi_http_gen_free(&g);
}

static json_t *calls_of(const zi_http_tools *t, const char *text, char **rest) {
    return zi_http_tools_extract(t, text, strlen(text), rest);
}

/* The formats of the families zinfer runs, parsed into OpenAI tool calls
 * (arguments: the model's own text); text that is not a call (or calls an
 * unknown function) stays text. tests/unit/test_tool_stream.c has more. */
static void test_tool_call_parsing(void **state) {
    (void)state;
    zi_http_error e;
    zi_http_tools t;
    json_t *root = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                              "\"f\", \"strict\": true}}, {\"type\": \"function\", "
                              "\"function\": {\"name\": \"g\"}}]}",
                              0, NULL);
    assert_int_equal(zi_http_tools_parse(root, &t, &e), 0);
    assert_int_equal(t.choice, ZI_TOOLS_AUTO);
    /* the router's shape: no "strict" */
    assert_null(json_object_get(json_object_get(json_array_get(t.tools, 0), "function"), "strict"));
    static const struct {
        const char *text;
        int n;
        const char *first_args, *rest;
    } cases[] = {
        {"Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 1,
         "{\"a\": 1}", "Sure."},
        {"<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>{\"name\": "
         "\"g\", \"arguments\": {\"b\": \"x\"}}</tool_call>",
         2, "{}", NULL},
        {"[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {\"c\": true}}]", 1, "{\"c\": true}", NULL},
        {"{\"name\": \"f\", \"parameters\": {\"d\": 2}}", 1, "{\"d\": 2}", NULL}, /* Llama 3 */
        {"  {\"name\": \"g\", \"arguments\": {}}  ", 1, "{}", NULL},
        {"The answer is 4.", 0, NULL, NULL},
        {"{\"name\": \"unknown\", \"arguments\": {}}", 0, NULL, NULL},
        {"<tool_call>not json</tool_call>", 0, NULL, NULL},
        {"{\"name\": \"f\"}", 0, NULL, NULL}, /* no arguments */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *rest = NULL;
        json_t *calls = calls_of(&t, cases[i].text, &rest);
        if (!cases[i].n) {
            assert_null(calls);
            continue;
        }
        assert_non_null(calls);
        assert_int_equal(json_array_size(calls), cases[i].n);
        json_t *c0 = json_array_get(calls, 0);
        assert_string_equal(json_string_value(json_object_get(c0, "type")), "function");
        assert_int_equal(strlen(json_string_value(json_object_get(c0, "id"))), ZI_TS_ID_LEN);
        json_t *fn = json_object_get(c0, "function");
        assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                            cases[i].first_args);
        if (cases[i].rest)
            assert_string_equal(rest, cases[i].rest);
        else
            assert_null(rest);
        free(rest);
        json_decref(calls);
    }
    zi_http_tools_free(&t);
    /* a named choice must name a tool; required gets the one tool's schema */
    json_object_set_new(root, "tool_choice",
                        json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", "h"));
    assert_int_equal(zi_http_tools_parse(root, &t, &e), -1);
    assert_string_equal(e.param, "tool_choice");
    json_object_set_new(root, "tool_choice", json_string("none"));
    assert_int_equal(zi_http_tools_parse(root, &t, &e), 0);
    assert_int_equal(t.choice, ZI_TOOLS_OFF);
    assert_null(calls_of(&t, "{\"name\": \"f\", \"arguments\": {}}", &(char *){NULL}));
    zi_http_tools_free(&t);
    json_decref(root);
    root = json_loads("{\"tool_choice\": \"required\", \"tools\": [{\"type\": \"function\", "
                      "\"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
                      "\"object\"}}}]}",
                      0, NULL);
    assert_int_equal(zi_http_tools_parse(root, &t, &e), 0);
    json_t *rf = zi_http_tools_response_format(&t);
    json_t *props = json_object_get(json_object_get(json_object_get(rf, "json_schema"), "schema"),
                                    "properties");
    assert_string_equal(json_string_value(json_object_get(json_object_get(props, "name"), "const")),
                        "f");
    json_decref(rf);
    zi_http_tools_free(&t);
    json_decref(root);
}

/* --model-tool-call-format: each model's format, by its name or the
 * MODEL of "MODEL:ADAPTER"; a model not listed takes --tool-call-format's;
 * a bad entry is refused naming the flag. */
static void test_model_tool_formats(void **state) {
    (void)state;
    zi_http_config cfg = {.tool_format = ZI_TF_GENERIC};
    zi_error err = {0};
    assert_int_equal(zi_http_model_tool_formats_add(&cfg, "smol=generic,glm=glm-4.5", &err), 0);
    assert_int_equal(zi_http_model_tool_formats_add(&cfg, "a=b=qwen3-coder", &err), 0);
    assert_int_equal(zi_http_tool_format(&cfg, "glm"), ZI_TF_GLM_45);
    assert_int_equal(zi_http_tool_format(&cfg, "glm:my-adapter"), ZI_TF_GLM_45);
    assert_int_equal(zi_http_tool_format(&cfg, "a=b"), ZI_TF_QWEN3_CODER); /* the last '=' */
    assert_int_equal(zi_http_tool_format(&cfg, "smol"), ZI_TF_GENERIC);
    assert_int_equal(zi_http_tool_format(&cfg, "other"), ZI_TF_GENERIC);
    assert_int_equal(zi_http_tool_format(&cfg, "gl"), ZI_TF_GENERIC);
    cfg.tool_format = ZI_TF_GRANITE;
    assert_int_equal(zi_http_tool_format(&cfg, "other"), ZI_TF_GRANITE);
    assert_int_equal(zi_http_model_tool_formats_add(&cfg, "glm=kimi-k2", &err), 0); /* again */
    assert_int_equal(zi_http_tool_format(&cfg, "glm"), ZI_TF_KIMI_K2);
    assert_int_equal(cfg.n_model_tool_format, 3);
    const char *bad[] = {"glm", "=generic", "glm=", "glm=auto", "glm=bogus", "a=generic,,b=hermes"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        err.msg[0] = '\0';
        assert_int_equal(zi_http_model_tool_formats_add(&cfg, bad[i], &err), -1);
        assert_non_null(strstr(err.msg, "--model-tool-call-format"));
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults_and_choices),
        cmocka_unit_test(test_model_tool_formats),
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_refusals_name_the_field),
        cmocka_unit_test(test_router_errors),
        cmocka_unit_test(test_tool_call_parsing),
        cmocka_unit_test(test_base64),
        cmocka_unit_test(test_chat_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
