/*
 * test_tool_stream.c - cmocka tests for the incremental tool-call parser
 * (http/tool_stream.c): real-shaped model outputs (Hermes/Qwen, Mistral,
 * Llama 3, the JSON constraint's bare call, plain text) fed whole, split at
 * every byte, and byte by byte, must report the same content, calls and
 * arguments, each call started once, in order, before its arguments; and
 * the whole-text result must be the expected one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tool_stream.h"
#include "tool_transcript.h"

static json_t *names(void) {
    return json_pack("[s,s]", "get_weather", "get_time");
}

static void test_real_outputs(void **state) {
    (void)state;
    json_t *nm = names();
    static const struct {
        const char *text, *content;
        int n;
        const char *name[2], *args[2];
    } cases[] = {
        /* Qwen2.5 / Hermes, with words first */
        {"I'll check the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
         "{\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
         "I'll check the weather.",
         1,
         {"get_weather"},
         {"{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
        /* two Hermes calls */
        {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
         "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
         "",
         2,
         {"get_weather", "get_time"},
         {"{\"city\": \"Oslo\"}", "{}"}},
        /* Mistral, an array of two */
        {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
         "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
         "",
         2,
         {"get_weather", "get_time"},
         {"{\"city\": \"Rome\"}", "{\"tz\": \"CET\"}"}},
        /* Llama 3 */
        {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}",
         "",
         1,
         {"get_weather"},
         {"{\"city\": \"Lima\"}"}},
        {"<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
         "",
         1,
         {"get_time"},
         {"{\"tz\": \"UTC\"}"}},
        /* the JSON constraint's call: nesting, escapes, brackets in strings, UTF-8 */
        {"{\"name\":\"get_weather\",\"arguments\":{\"q\":\"a}b{c \\\"x\\\" \xc3\xa9\xe2\x82\xac\","
         "\"l\":[1,{\"x\":[2]}],\"n\":-1.5e3,\"t\":true,\"z\":null}}",
         "",
         1,
         {"get_weather"},
         {"{\"q\":\"a}b{c \\\"x\\\" \xc3\xa9\xe2\x82\xac\",\"l\":[1,{\"x\":[2]}],\"n\":-1.5e3,"
          "\"t\":true,\"z\":null}"}},
        /* arguments before the name: sent once the name is known */
        {"  {\"arguments\": {\"city\": \"Bern\"}, \"id\": 7, \"name\": \"get_weather\"}  ",
         "",
         1,
         {"get_weather"},
         {"{\"city\": \"Bern\"}"}},
        /* an unclosed last Hermes call (the text ended) */
        {"Sure <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n",
         "Sure",
         1,
         {"get_time"},
         {"{}"}},
        /* text around and between calls */
        {"A <tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> B\n",
         "A B",
         1,
         {"get_time"},
         {"{}"}},
        /* no calls: the text unchanged */
        {"  The answer is <b>4</b>. {x} [y] <tool_cal\n",
         "  The answer is <b>4</b>. {x} [y] <tool_cal\n",
         0,
         {NULL},
         {NULL}},
        {"<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call> ok",
         "<tool_call>{\"name\": \"nope\", \"arguments\": {}}</tool_call> ok",
         0,
         {NULL},
         {NULL}},
        {"  {\"a\": 1}  ", "  {\"a\": 1}  ", 0, {NULL}, {NULL}},
        {"{\"name\": \"get_time\"}", "{\"name\": \"get_time\"}", 0, {NULL}, {NULL}},
        {"[TOOL_CALLS] hello", "[TOOL_CALLS] hello", 0, {NULL}, {NULL}},
        {"<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", 0, {NULL}, {NULL}},
        {"[1, 2]", "[1, 2]", 0, {NULL}, {NULL}},
        {"", "", 0, {NULL}, {NULL}},
        {" \n ", " \n ", 0, {NULL}, {NULL}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        transcript w;
        all_splits(&(setup){ZI_TF_AUTO, nm, NULL}, cases[i].text, &w);
        assert_string_equal(w.content, cases[i].content);
        assert_int_equal(w.n_calls, cases[i].n);
        assert_int_equal(w.ok, cases[i].n > 0);
        for (int k = 0; k < cases[i].n; k++) {
            assert_string_equal(w.name[k], cases[i].name[k]);
            assert_string_equal(w.args[k], cases[i].args[k]);
        }
        /* the whole-text parser says the same, ids apart */
        json_t *calls;
        char *content;
        assert_int_equal(zi_tool_stream_parse_all(nm, ZI_TF_AUTO, NULL, cases[i].text,
                                                  strlen(cases[i].text), &calls, &content),
                         0);
        if (!cases[i].n) {
            assert_null(calls);
            assert_null(content);
            continue;
        }
        assert_int_equal(json_array_size(calls), cases[i].n);
        for (int k = 0; k < cases[i].n; k++) {
            json_t *c = json_array_get(calls, k), *fn = json_object_get(c, "function");
            assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
            assert_true(is_call_id(json_string_value(json_object_get(c, "id"))));
            assert_string_equal(json_string_value(json_object_get(fn, "name")), cases[i].name[k]);
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")),
                                cases[i].args[k]);
        }
        if (cases[i].content[0])
            assert_string_equal(content, cases[i].content);
        else
            assert_null(content);
        free(content);
        json_decref(calls);
    }
    json_decref(nm);
}

/* A call cut short or malformed after it was sent: the stream says so, the
 * same at every split; the whole-text parser then gives no calls. */
static void test_truncated_and_broken(void **state) {
    (void)state;
    json_t *nm = names();
    static const struct {
        const char *text, *content, *args;
        int truncated;
    } cases[] = {
        {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", "",
         "{\"city\": \"Pa", 1},
        {"{\"name\": \"get_weather\", \"arguments\": {\"city\": tru}} then", "} then",
         "{\"city\": tru}", 0},
        {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}} junk</tool_call> x",
         "} junk</tool_call> x", "{}", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        transcript w;
        all_splits(&(setup){ZI_TF_AUTO, nm, NULL}, cases[i].text, &w);
        assert_int_equal(w.ok, 0);
        assert_int_equal(w.n_calls, 1);
        assert_string_equal(w.args[0], cases[i].args);
        assert_string_equal(w.content, cases[i].content);
        json_t *calls;
        char *content;
        assert_int_equal(zi_tool_stream_parse_all(nm, ZI_TF_AUTO, NULL, cases[i].text,
                                                  strlen(cases[i].text), &calls, &content),
                         0);
        assert_null(calls);
        assert_null(content);
    }
    json_decref(nm);
}

/* Held text is released as soon as it is decided, not at the end. */
static void test_sent_early(void **state) {
    (void)state;
    json_t *nm = names();
    zi_tool_stream ts;
    transcript t;
    memset(&t, 0, sizeof t);
    zi_tool_stream_init(&ts, nm, ZI_TF_AUTO);
    const char *a = "Hello <tool", *b = "_call>{\"name\": \"get_weather\", ";
    assert_int_equal(zi_tool_stream_feed(&ts, a, strlen(a), record, &t), 0);
    assert_string_equal(t.content, "Hello"); /* " <tool" held */
    assert_int_equal(zi_tool_stream_feed(&ts, b, strlen(b), record, &t), 0);
    assert_int_equal(t.n_calls, 0); /* arguments not begun */
    const char *c = "\"arguments\": {\"ci";
    assert_int_equal(zi_tool_stream_feed(&ts, c, strlen(c), record, &t), 0);
    assert_int_equal(t.n_calls, 1);
    assert_string_equal(t.name[0], "get_weather");
    assert_string_equal(t.args[0], "{\"ci");
    /* a UTF-8 character cut in two is held whole */
    const char *d = "ty\": \"Z\xc3";
    assert_int_equal(zi_tool_stream_feed(&ts, d, strlen(d), record, &t), 0);
    assert_string_equal(t.args[0], "{\"city\": \"Z");
    const char *e = "\xbcrich\"}}</tool_call>";
    assert_int_equal(zi_tool_stream_feed(&ts, e, strlen(e), record, &t), 0);
    assert_string_equal(t.args[0], "{\"city\": \"Z\xc3\xbcrich\"}");
    assert_int_equal(zi_tool_stream_finish(&ts, record, &t), 0);
    assert_true(zi_tool_stream_calls_ok(&ts));
    assert_string_equal(t.content, "Hello");
    zi_tool_stream_free(&ts);
    json_decref(nm);
}

/* Ids: 9 letters and digits every time, every character in use, distinct
 * (62^9 of them: a repeat in 2000 would mean a broken generator). */
static void test_call_ids(void **state) {
    (void)state;
    enum { N = 2000 };
    static char ids[N][ZI_TS_ID_LEN + 1];
    int seen[128] = {0};
    for (int i = 0; i < N; i++) {
        zi_tool_call_id(ids[i], (unsigned)i);
        assert_true(is_call_id(ids[i]));
        for (int k = 0; k < ZI_TS_ID_LEN; k++) seen[(unsigned char)ids[i][k]] = 1;
        for (int j = 0; j < i; j++) assert_string_not_equal(ids[i], ids[j]);
    }
    int distinct = 0;
    for (int c = 0; c < 128; c++) distinct += seen[c];
    assert_int_equal(distinct, 62);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_outputs),
        cmocka_unit_test(test_truncated_and_broken),
        cmocka_unit_test(test_sent_early),
        cmocka_unit_test(test_call_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
