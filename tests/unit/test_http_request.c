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
#include "http_error.h"
#include "http_request.h"

/* Choice i's request, unpacked (the caller destroys u). */
static const msgpack_object *unpack(const zi_http_gen *g, int i, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    assert_int_equal(msgpack_unpack_next(u, g->req[i].sb.data, g->req[i].sb.size, NULL),
                     MSGPACK_UNPACK_SUCCESS);
    return &u->data;
}

static int parse(const char *body, zi_http_kind kind, zi_http_gen *g, zi_http_error *e) {
    return zi_http_parse_generate(body, strlen(body), kind, g, e);
}

static void assert_str(const msgpack_object *o, const char *want) {
    assert_non_null(o);
    assert_int_equal(o->type, MSGPACK_OBJECT_STR);
    assert_int_equal(o->via.str.size, strlen(want));
    assert_memory_equal(o->via.str.ptr, want, strlen(want));
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
        {ZI_HTTP_CHAT, "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}",
         "messages[0].role"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}",
         "messages[0].content[0].type"},
        {ZI_HTTP_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logit_bias\": {\"1\": 1}}",
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults_and_choices),
        cmocka_unit_test(test_completion_fields),
        cmocka_unit_test(test_refusals_name_the_field),
        cmocka_unit_test(test_router_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
