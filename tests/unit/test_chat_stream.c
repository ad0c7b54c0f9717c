/*
 * test_chat_stream.c - cmocka tests for the reasoning splitter
 * (http/chat_stream.c): thinking-model outputs (a section at the start,
 * one the prompt opened, none, one never closed, markers split anywhere,
 * a tool call after the reasoning, format none, gpt-oss's harmony
 * channels) fed whole, split at every byte, and byte by byte, must report
 * exactly the expected reasoning, content and calls, each byte once and no
 * empty event; the whole-text split must give the same.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chat_stream.h"

#define MAXC 4

/* What a stream reported, concatenated. */
typedef struct transcript {
    char reasoning[1024], content[1024];
    size_t rlen, clen;
    int n_calls;
    char name[MAXC][64];
    char args[MAXC][256];
    int ok;
    int content_before_reasoning; /* content came, then reasoning: out of order */
} transcript;

static void cat(char *dst, size_t cap, size_t *len, const char *s, size_t n) {
    assert_true(*len + n < cap);
    memcpy(dst + *len, s, n);
    dst[ *len += n] = '\0';
}

static int record(void *arg, const zi_ts_event *ev) {
    transcript *t = arg;
    assert_true(ev->len > 0 || ev->kind == ZI_TS_CALL);
    switch (ev->kind) {
    case ZI_TS_REASONING:
        if (t->clen || t->n_calls) t->content_before_reasoning = 1;
        cat(t->reasoning, sizeof t->reasoning, &t->rlen, ev->text, ev->len);
        break;
    case ZI_TS_CONTENT:
        cat(t->content, sizeof t->content, &t->clen, ev->text, ev->len);
        break;
    case ZI_TS_CALL: {
        assert_int_equal(ev->index, t->n_calls);
        assert_true(t->n_calls < MAXC);
        size_t n = 0;
        cat(t->name[t->n_calls++], sizeof t->name[0], &n, ev->text, ev->len);
        break;
    }
    case ZI_TS_ARGS: {
        assert_true(ev->index < t->n_calls);
        size_t n = strlen(t->args[ev->index]);
        cat(t->args[ev->index], sizeof t->args[0], &n, ev->text, ev->len);
        break;
    }
    }
    return 0;
}

/* Feeds text cut at cuts[0..ncuts) (ascending). */
static void run(const zi_http_gen *g, const char *text, const size_t *cuts, int ncuts,
                transcript *t) {
    memset(t, 0, sizeof *t);
    zi_chat_stream *cs = zi_chat_stream_new(g);
    assert_non_null(cs);
    size_t from = 0, n = strlen(text);
    for (int i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : n;
        assert_int_equal(zi_chat_stream_feed(cs, text + from, to - from, record, t), 0);
        from = to;
    }
    assert_int_equal(zi_chat_stream_finish(cs, record, t), 0);
    t->ok = zi_chat_stream_calls_ok(cs);
    zi_chat_stream_free(cs);
    assert_false(t->content_before_reasoning);
}

static void assert_same(const transcript *a, const transcript *b) {
    assert_string_equal(a->reasoning, b->reasoning);
    assert_string_equal(a->content, b->content);
    assert_int_equal(a->n_calls, b->n_calls);
    for (int i = 0; i < a->n_calls; i++) {
        assert_string_equal(a->name[i], b->name[i]);
        assert_string_equal(a->args[i], b->args[i]);
    }
    assert_int_equal(a->ok, b->ok);
}

/* Whole, every split into two, byte by byte: all the same. */
static void all_splits(const zi_http_gen *g, const char *text, transcript *whole) {
    run(g, text, NULL, 0, whole);
    size_t n = strlen(text);
    transcript t;
    for (size_t c = 0; c <= n; c++) {
        run(g, text, &c, 1, &t);
        assert_same(whole, &t);
    }
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    assert_non_null(cuts);
    for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
    run(g, text, cuts, (int)n, &t);
    free(cuts);
    assert_same(whole, &t);
}

typedef struct sample {
    const char *text;
    int open;
    const char *reasoning, *content;
} sample;

static void test_reasoning_split(void **state) {
    (void)state;
    static const sample S[] = {
        /* Qwen 3 / SmolLM3 with the section in the text */
        {"<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4.", 0, "Let me add 2 and 2.",
         "The answer is 4."},
        /* DeepSeek R1 / Qwen 3: the prompt ended with "<think>\n" */
        {"I think so.\nReally.\n</think>\n\nYes.", 1, "I think so.\nReally.", "Yes."},
        /* ... and a model that writes the opening marker again */
        {"\n<think>\nhm\n</think>ok", 1, "hm", "ok"},
        /* no section: content byte for byte, a later marker is text */
        {"  Hello <think> there </think> x ", 0, "", "  Hello <think> there </think> x "},
        {"<thinking>x</thinking>", 0, "", "<thinking>x</thinking>"},
        {"<thin", 0, "", "<thin"},
        {"", 0, "", ""},
        {"\n\n", 0, "", "\n\n"},
        /* never closed: all reasoning, trimmed */
        {"<think> still going  \n", 0, "still going", ""},
        {"still going </thi", 1, "still going </thi", ""},
        /* a split marker inside, an empty section, whitespace inside */
        {"<think>a</thin</think>b", 0, "a</thin", "b"},
        {"<think>\n\n</think>\n\nHi", 0, "", "Hi"},
        {"<think> a \n b </think>  c  d ", 0, "a \n b", "c  d "},
        {"<think>x</think></think>", 0, "x", "</think>"},
        {"<think>\xc3\xa9t\xc3\xa9</think>\xe2\x82\xac", 0, "\xc3\xa9t\xc3\xa9", "\xe2\x82\xac"},
        {"</think>only content", 1, "", "only content"},
    };
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        g.reasoning.open = S[i].open;
        transcript t;
        all_splits(&g, S[i].text, &t);
        if (strcmp(t.reasoning, S[i].reasoning) || strcmp(t.content, S[i].content))
            fail_msg("sample %zu: reasoning \"%s\" content \"%s\"", i, t.reasoning, t.content);
        assert_int_equal(t.n_calls, 0);
        assert_false(t.ok);
    }
}

/* Format none: the text as it is, also a section at the start. */
static void test_format_none(void **state) {
    (void)state;
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    g.reasoning.format = ZI_REASONING_NONE;
    g.reasoning.open = 1;
    const char *text = "<think>\nx\n</think>\n\nanswer";
    transcript t;
    all_splits(&g, text, &t);
    assert_string_equal(t.reasoning, "");
    assert_string_equal(t.content, text);
}

/* With tools: a call after the reasoning is a call, one inside it is
 * reasoning text; the calls go through tool_stream. */
static void test_tools(void **state) {
    (void)state;
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    g.tools.choice = ZI_TOOLS_AUTO;
    g.tools.names = json_pack("[s, s]", "get_weather", "get_time");
    const char *text =
        "<think>\nI should call <tool_call>{\"name\": \"get_time\", \"arguments\": {}}"
        "</tool_call> maybe.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    transcript t;
    all_splits(&g, text, &t);
    assert_string_equal(t.reasoning, "I should call <tool_call>{\"name\": \"get_time\", "
                                     "\"arguments\": {}}</tool_call> maybe.");
    assert_string_equal(t.content, "");
    assert_int_equal(t.n_calls, 1);
    assert_string_equal(t.name[0], "get_weather");
    assert_string_equal(t.args[0], "{\"city\": \"Paris\"}");
    assert_true(t.ok);
    /* the prompt opened the section; text, then a call */
    g.reasoning.open = 1;
    text = "plan</think>Calling.\n<tool_call>{\"name\": \"get_time\", \"arguments\": {\"tz\": "
           "\"UTC\"}}</tool_call>";
    all_splits(&g, text, &t);
    assert_string_equal(t.reasoning, "plan");
    assert_string_equal(t.content, "Calling.");
    assert_int_equal(t.n_calls, 1);
    assert_string_equal(t.name[0], "get_time");
    assert_string_equal(t.args[0], "{\"tz\": \"UTC\"}");
    assert_true(t.ok);
    /* format none: tool_stream sees the raw text; the leading section is
     * content, the call still a call */
    g.reasoning.format = ZI_REASONING_NONE;
    g.reasoning.open = 0;
    text = "<think>x</think>\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>";
    all_splits(&g, text, &t);
    assert_string_equal(t.reasoning, "");
    assert_string_equal(t.content, "<think>x</think>");
    assert_int_equal(t.n_calls, 1);
    assert_true(t.ok);
    json_decref(g.tools.names);
}

/* gpt-oss: analysis is reasoning, final is content, a commentary message
 * to functions.NAME is a call of a known tool. */
static void test_harmony(void **state) {
    (void)state;
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    transcript t;
    const char *text = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|><|start|>"
                       "assistant<|channel|>final<|message|>It is 4.";
    all_splits(&g, text, &t);
    assert_string_equal(t.reasoning, "User asks 2+2. Easy.");
    assert_string_equal(t.content, "It is 4.");
    all_splits(&g, "<|start|>assistant<|channel|>final<|message|> hi <|end|>", &t);
    assert_string_equal(t.content, " hi ");
    all_splits(&g, "<|channel|>analys", &t); /* a header cut short */
    assert_string_equal(t.reasoning, "");
    assert_string_equal(t.content, "");
    all_splits(&g, "<|channel|>analysis<|message|>a <|en", &t);
    assert_string_equal(t.reasoning, "a <|en");
    const char *call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
                       "<|channel|>commentary to=functions.get_weather <|constrain|>json"
                       "<|message|>{\"city\": \"Paris\"}";
    /* without tools the call's body is content */
    all_splits(&g, call, &t);
    assert_string_equal(t.reasoning, "Need the weather.");
    assert_string_equal(t.content, "{\"city\": \"Paris\"}");
    assert_int_equal(t.n_calls, 0);
    g.tools.choice = ZI_TOOLS_AUTO;
    g.tools.names = json_pack("[s]", "get_weather");
    all_splits(&g, call, &t);
    assert_string_equal(t.reasoning, "Need the weather.");
    assert_string_equal(t.content, "");
    assert_int_equal(t.n_calls, 1);
    assert_string_equal(t.name[0], "get_weather");
    assert_string_equal(t.args[0], "{\"city\": \"Paris\"}");
    assert_true(t.ok);
    /* cut short: a call, not a whole one */
    all_splits(&g, "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": ", &t);
    assert_int_equal(t.n_calls, 1);
    assert_false(t.ok);
    /* an unknown tool's message is content */
    all_splits(&g, "<|channel|>commentary to=functions.nope<|message|>{}", &t);
    assert_int_equal(t.n_calls, 0);
    assert_string_equal(t.content, "{}");
    /* format none: the raw text */
    g.reasoning.format = ZI_REASONING_NONE;
    all_splits(&g, call, &t);
    assert_string_equal(t.content, call);
    json_decref(g.tools.names);
}

/* The whole-text split: reasoning, content and calls as streamed; broken
 * or no calls leave the text (but the reasoning) as content. */
static void test_split(void **state) {
    (void)state;
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    g.tools.choice = ZI_TOOLS_AUTO;
    g.tools.names = json_pack("[s]", "f");
    static const struct {
        const char *text, *reasoning, *content, *args;
    } S[] = {
        {"<think> r </think> <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
         "r", NULL, "{\"a\": 1}"},
        {"<think>r</think>Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1", "r",
         "Hi <tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1", NULL},
        {"<think>r</think>\n\nplain", "r", "plain", NULL},
        {"<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>commentary "
         "to=functions.f<|message|>{}",
         "r", NULL, "{}"},
    };
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
        char *r, *c;
        size_t rn, cn;
        json_t *calls;
        assert_int_equal(
            zi_chat_stream_split(&g, S[i].text, strlen(S[i].text), &r, &rn, &c, &cn, &calls), 0);
        assert_string_equal(r, S[i].reasoning);
        assert_int_equal(rn, strlen(r));
        if (S[i].content) assert_string_equal(c, S[i].content);
        if (!S[i].content) assert_string_equal(c, "");
        if (S[i].args) {
            assert_int_equal(json_array_size(calls), 1);
            json_t *fn = json_object_get(json_array_get(calls, 0), "function");
            assert_string_equal(json_string_value(json_object_get(fn, "name")), "f");
            assert_string_equal(json_string_value(json_object_get(fn, "arguments")), S[i].args);
        } else {
            assert_null(calls);
        }
        json_decref(calls);
        free(r);
        free(c);
    }
    json_decref(g.tools.names);
}

/* An emit that fails stops the stream with its return. */
static int refuse(void *arg, const zi_ts_event *ev) {
    (void)arg, (void)ev;
    return 7;
}

static void test_emit_error(void **state) {
    (void)state;
    zi_http_gen g;
    memset(&g, 0, sizeof g);
    zi_chat_stream *cs = zi_chat_stream_new(&g);
    assert_non_null(cs);
    assert_int_equal(zi_chat_stream_feed(cs, "<think>abc", 10, refuse, NULL), 7);
    zi_chat_stream_free(cs);
    cs = zi_chat_stream_new(&g);
    assert_int_equal(zi_chat_stream_feed(cs, "<think>ab</thi", 14, record, &(transcript){0}), 0);
    assert_int_equal(zi_chat_stream_finish(cs, refuse, NULL), 7);
    zi_chat_stream_free(cs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reasoning_split), cmocka_unit_test(test_format_none),
        cmocka_unit_test(test_tools),           cmocka_unit_test(test_harmony),
        cmocka_unit_test(test_split),           cmocka_unit_test(test_emit_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
