/*
 * test_chat_template.c - cmocka tests for the chat-template engine
 * (chat_template/chat_template.h): the language, its errors and limits.
 *
 * Four layers:
 *  - the committed fixture tests/fixtures/chat_templates/expected.json
 *    (made by scripts/ref/make_chat_template_fixtures.py with jinja2 in the
 *    environment Hugging Face's apply_chat_template uses): every template
 *    in that directory rendered for every message set, byte for byte, and
 *    the expected failures (raise_exception with its exact message), plus
 *    the short snippets that pin down one behaviour each;
 *  - the default model's own template read from its GGUF file (skipped
 *    when the model is absent): same text as the fixture, known rendering;
 *  - errors: syntax errors with their line and column, unsupported tags,
 *    run-time errors, raise_exception, bad arguments and bad UTF-8;
 *  - limits against hostile templates: output size, loop iterations,
 *    evaluation steps, memory, nesting depth (parser and evaluator), and a
 *    seeded mutation run over the fixture templates that must never crash
 *    (run this binary under -fsanitize=address,undefined).
 * The extra variables (tools, chat_template_options) are test_chat_vars.c;
 * what both share is chat_template_fixture.h. Run from the repository root.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>

#include "chat_template.h"
#include "chat_template_fixture.h"
#include "gguf.h"
#include "vendor_dir.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---- helpers ----------------------------------------------------------- */

static void expect_render(const char *src, const char *want) {
    zi_error err = {0};
    char *out;
    int rc = render_str(src, NULL, &out, &err);
    if (rc) fail_msg("%s: unexpected error %d: %s", src, rc, err.msg);
    assert_string_equal(out, want);
    free(out);
}

static void expect_error(const char *src, const zi_chat_render_opts *opts, int code,
                         const char *msg_part) {
    zi_error err = {0};
    char *out = NULL;
    int rc = render_str(src, opts, &out, &err);
    if (rc != code)
        fail_msg("%s: got %d (%s), want %d", src, rc, rc ? err.msg : out ? out : "", code);
    assert_null(out);
    if (msg_part && !strstr(err.msg, msg_part))
        fail_msg("%s: message \"%s\" lacks \"%s\"", src, err.msg, msg_part);
}

static int check_case(const zi_chat_template *t, const char *label, json_t *c, json_t *messages,
                      const char *bos, const char *eos, int agp) {
    return check_case_vars(t, label, c, messages, bos, eos, agp, NULL, 0);
}

/* ---- fixture ---------------------------------------------------------- */

static void test_fixture_templates(void **state) {
    (void)state;
    json_t *j = load_fixture();
    json_t *templates = json_object_get(j, "templates");
    json_t *sets = json_object_get(j, "message_sets");
    assert_true(json_array_size(templates) >= 10);
    assert_true(json_object_size(sets) >= 6);
    size_t total = 0, passed = 0, renders = 0, errors = 0;
    for (size_t ti = 0; ti < json_array_size(templates); ti++) {
        json_t *tj = json_array_get(templates, ti);
        const char *file = json_string_value(json_object_get(tj, "file"));
        char path[512];
        snprintf(path, sizeof path, FIXTURE_DIR "%s", file);
        size_t len;
        char *src = read_file(path, &len);
        if (!src) fail_msg("cannot read %s", path);
        zi_chat_template *t = NULL;
        zi_error err = {0};
        int rc = zi_chat_template_compile(src, len, &t, &err);
        if (rc) fail_msg("%s: %s", file, err.msg);
        json_t *cases = json_object_get(tj, "cases");
        assert_true(json_array_size(cases) >= 6);
        for (size_t ci = 0; ci < json_array_size(cases); ci++) {
            json_t *c = json_array_get(cases, ci);
            char label[256];
            snprintf(label, sizeof label, "%s / %s / agp=%d", file,
                     json_string_value(json_object_get(c, "set")),
                     json_is_true(json_object_get(c, "add_generation_prompt")));
            total++;
            json_t *messages = json_object_get(sets, json_string_value(json_object_get(c, "set")));
            assert_non_null(messages);
            passed += check_case(t, label, c, messages,
                                 json_string_value(json_object_get(tj, "bos_token")),
                                 json_string_value(json_object_get(tj, "eos_token")),
                                 json_is_true(json_object_get(c, "add_generation_prompt")));
            if (json_object_get(c, "expected"))
                renders++;
            else
                errors++;
        }
        zi_chat_template_free(t);
        free(src);
    }
    print_message("chat templates: %zu/%zu fixture cases match jinja2 (%zu templates, %zu "
                  "renderings, %zu expected errors)\n",
                  passed, total, json_array_size(templates), renders, errors);
    json_decref(j);
    assert_int_equal(passed, total);
}

static void test_fixture_snippets(void **state) {
    (void)state;
    json_t *j = load_fixture();
    json_t *snippets = json_object_get(j, "snippets");
    json_t *messages = json_object_get(j, "snippet_messages");
    assert_true(json_array_size(snippets) >= 50);
    size_t passed = 0, n = json_array_size(snippets);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(snippets, i);
        json_t *src = json_object_get(c, "template");
        zi_chat_template *t = NULL;
        zi_error err = {0};
        int rc =
            zi_chat_template_compile(json_string_value(src), json_string_length(src), &t, &err);
        if (rc) {
            /* Only snippets jinja2 rejects as syntax errors may fail to compile. */
            const char *kind = json_string_value(json_object_get(c, "error"));
            if (kind && strcmp(kind, "syntax") == 0)
                passed++;
            else
                print_error("snippet %zu %s: compile error %s\n", i, json_string_value(src),
                            err.msg);
            continue;
        }
        char label[96];
        snprintf(label, sizeof label, "snippet %zu", i);
        passed += check_case(t, label, c, messages, "<s>", "</s>", 1);
        zi_chat_template_free(t);
    }
    print_message("chat templates: %zu/%zu snippets match jinja2\n", passed, n);
    json_decref(j);
    assert_int_equal(passed, n);
}

/* ---- the model's own template ------------------------------------------- */

static void test_gguf_template(void **state) {
    (void)state;
    const char *path = getenv("ZINFER_MODEL") ? getenv("ZINFER_MODEL") : DEFAULT_MODEL;
    zi_gguf *g = NULL;
    zi_error err = {0};
    if (zi_gguf_open(path, &g, &err) != ZI_OK) {
        print_message("skipping: %s\n", err.msg);
        skip();
    }
    zi_str s;
    assert_int_equal(zi_gguf_get_str(g, "tokenizer.chat_template", &s, &err), ZI_OK);
    size_t flen;
    char *fixture = read_file(FIXTURE_DIR "smollm2.jinja", &flen);
    assert_non_null(fixture);
    assert_int_equal(s.len, flen);
    assert_memory_equal(s.ptr, fixture, flen);
    free(fixture);

    zi_chat_template *t = NULL;
    assert_int_equal(zi_chat_template_compile(s.ptr, s.len, &t, &err), ZI_OK);
    zi_chat_message m[3] = {
        {"user", "Hello", 0, 0}, {"assistant", "Hi! {{ not a tag }}", 0, 0}, {"user", "Bye", 0, 0}};
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    char *out;
    size_t out_len;
    assert_int_equal(zi_chat_template_render(t, m, 3, &o, &out, &out_len, &err), ZI_OK);
    const char *want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                       "by Hugging Face<|im_end|>\n"
                       "<|im_start|>user\nHello<|im_end|>\n"
                       "<|im_start|>assistant\nHi! {{ not a tag }}<|im_end|>\n"
                       "<|im_start|>user\nBye<|im_end|>\n"
                       "<|im_start|>assistant\n";
    assert_string_equal(out, want);
    assert_int_equal(out_len, strlen(want));
    free(out);
    /* With a system message, no default one; no generation prompt. */
    zi_chat_message m2[2] = {{"system", "Be terse.", 0, 0}, {"user", "Q", 0, 0}};
    o.add_generation_prompt = 0;
    assert_int_equal(zi_chat_template_render(t, m2, 2, &o, &out, NULL, &err), ZI_OK);
    assert_string_equal(out,
                        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n");
    free(out);
    zi_chat_template_free(t);
    zi_gguf_close(g);
}

/* ---- behaviour with hand-computed results ------------------------------ */

static void test_basics(void **state) {
    (void)state;
    expect_render("", "");
    expect_render("plain text\n", "plain text");
    expect_render("{% for m in messages %}{{ m.role }}={{ m['content'] }};{% endfor %}",
                  "user=hi;assistant=yo;");
    expect_render("{{ messages | length }} {{ add_generation_prompt }} [{{ bos_token }}]",
                  "2 False []");
    expect_render("{{ '{{ x }}' }}{% raw %}{% if %}{% endraw %}", "{{ x }}{% if %}");
    expect_render("  {% if true %}\n  yes\n  {% endif %}\n", "  yes\n");
    /* strftime_now reads the clock, so only its shape can be checked. */
    expect_render("{{ strftime_now('%Y') | length }} {{ strftime_now('%Y') | int > 2000 }}",
                  "4 True");
    expect_render("{%- set ns = namespace(n=0) -%}{% for m in messages %}{% set ns.n = ns.n + "
                  "m.content | length %}{% endfor %}{{ ns.n }}",
                  "4");
}

static void test_none_content_and_lengths(void **state) {
    (void)state;
    zi_chat_template *t = NULL;
    zi_error err = {0};
    const char *src = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}:{{ "
                      "m.content is none }}]{% endfor %}{% if add_generation_prompt %}>{% endif "
                      "%}{{ eos_token }}";
    assert_int_equal(compile_str(src, &t, &err), ZI_OK);
    zi_chat_message m[2] = {{"userX", "a\0b", 4, 3}, {"assistant", NULL, 0, 0}};
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    o.bos_token = "<s>";
    o.eos_token = "</s>";
    char *out;
    size_t len;
    assert_int_equal(zi_chat_template_render(t, m, 2, &o, &out, &len, &err), ZI_OK);
    const char want[] = "<s>[user:a\0b:False][assistant:None:True]></s>";
    assert_int_equal(len, sizeof want - 1);
    assert_memory_equal(out, want, len);
    assert_int_equal(out[len], '\0');
    free(out);
    /* A NULL opts: no bos/eos (undefined prints as nothing), no prompt. */
    assert_int_equal(zi_chat_template_render(t, m, 1, NULL, &out, &len, &err), ZI_OK);
    assert_int_equal(len, 16);
    assert_memory_equal(out, "[user:a\0b:False]", 16);
    free(out);
    /* No messages at all. */
    assert_int_equal(zi_chat_template_render(t, NULL, 0, &o, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "<s>></s>");
    free(out);
    zi_chat_template_free(t);
}

/* ---- errors ------------------------------------------------------------ */

static void expect_compile_error(const char *src, int code, const char *msg_part) {
    zi_chat_template *t = (zi_chat_template *)1;
    zi_error err = {0};
    int rc = compile_str(src, &t, &err);
    if (rc != code) fail_msg("%s: got %d (%s), want %d", src, rc, err.msg, code);
    assert_null(t);
    if (!strstr(err.msg, msg_part))
        fail_msg("%s: message \"%s\" lacks \"%s\"", src, err.msg, msg_part);
}

static void test_syntax_errors(void **state) {
    (void)state;
    expect_compile_error("abc\n{% if x %}\nbody", ZI_EFORMAT,
                         "line 2 col 1: 'if' block is never closed");
    expect_compile_error("{% for m in messages %}{% if x %}{% endfor %}", ZI_EFORMAT,
                         "line 1 col 37: unknown or misplaced tag 'endfor'");
    expect_compile_error("a\nb {{ x", ZI_EFORMAT, "line 2 col 3: unclosed '{{' tag");
    expect_compile_error("x {% if true", ZI_EFORMAT, "line 1 col 3: unclosed '{%' tag");
    expect_compile_error("  {# never closed", ZI_EFORMAT, "line 1 col 3: missing end of comment");
    expect_compile_error("{% raw %} x", ZI_EFORMAT, "missing end of raw directive");
    expect_compile_error("{{ 1 + }}", ZI_EFORMAT,
                         "line 1 col 8: unexpected end of print statement");
    expect_compile_error("\n\n   {{ a b }}", ZI_EFORMAT,
                         "line 3 col 9: expected end of print statement, got 'b'");
    expect_compile_error("{{ 'abc }}", ZI_EFORMAT, "line 1 col 4: unterminated string literal");
    expect_compile_error("{{ (1 ]] }}", ZI_EFORMAT, "unexpected ']', expected ')'");
    expect_compile_error("{{ x @ y }}", ZI_EFORMAT, "unexpected character '@'");
    expect_compile_error("{% endif %}", ZI_EFORMAT, "unknown or misplaced tag 'endif'");
    expect_compile_error("{% frobnicate %}", ZI_EFORMAT, "unknown or misplaced tag 'frobnicate'");
    expect_compile_error("{% set 1 = 2 %}", ZI_EFORMAT, "cannot assign");
    expect_compile_error("{% break %}", ZI_EFORMAT, "'break' outside a for loop");
    expect_compile_error("{% macro m(a=1, b) %}{% endmacro %}", ZI_EFORMAT, "non-default argument");
    expect_compile_error("{{ '\\x4' }}", ZI_EFORMAT, "truncated \\x escape");
    expect_compile_error("{% include 'other.jinja' %}", ZI_EUNSUPPORTED,
                         "'include' tag is not supported");
    expect_compile_error("{% extends 'base' %}", ZI_EUNSUPPORTED, "'extends' tag is not supported");
    expect_compile_error("{% for x in y recursive %}{% endfor %}", ZI_EUNSUPPORTED, "recursive");
    expect_compile_error("{{ f(*args) }}", ZI_EUNSUPPORTED, "*args");
    expect_compile_error("{{ 99999999999999999999 }}", ZI_EUNSUPPORTED, "64 bits");
    expect_compile_error("{{ 'a' }}\xff", ZI_EINVAL, "line 1 col 10: not valid UTF-8");
    expect_compile_error("\xe9t\xe9", ZI_EINVAL, "not valid UTF-8");
    /* Columns count characters, not bytes. */
    expect_compile_error("é€😀 {{ + }}", ZI_EFORMAT, "line 1 col 10:");
    /* Every message names the template. */
    expect_compile_error("{% if %}", ZI_EFORMAT, "chat template line 1 col 7:");

    zi_error err = {0};
    zi_chat_template *t;
    assert_int_equal(zi_chat_template_compile(NULL, 3, &t, &err), ZI_EINVAL);
    assert_int_equal(zi_chat_template_compile("x", 1, NULL, &err), ZI_EINVAL);
    size_t big = ZI_CHAT_TEMPLATE_MAX_SOURCE + 1;
    char *huge = malloc(big);
    memset(huge, 'a', big);
    assert_int_equal(zi_chat_template_compile(huge, big, &t, &err), ZI_ERANGE);
    free(huge);
}

static void test_runtime_errors(void **state) {
    (void)state;
    /* raise_exception: ZI_EINVAL with exactly the template's message. */
    zi_error err = {0};
    char *out;
    int rc =
        render_str("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception("
                   "'Assistant turn ' ~ loop.index ~ ' is not allowed') }}{% endif %}{% endfor %}",
                   NULL, &out, &err);
    assert_int_equal(rc, ZI_EINVAL);
    assert_string_equal(err.msg, "Assistant turn 2 is not allowed");
    assert_null(out);

    /* A long message is cut to fit, at a character boundary. */
    rc = render_str("{{ raise_exception('\xc3\xa9' * 600) }}", NULL, &out, &err);
    assert_int_equal(rc, ZI_EINVAL);
    assert_int_equal(strlen(err.msg), 510);
    assert_memory_equal(err.msg, "\xc3\xa9\xc3\xa9", 4);

    expect_error("{{ nope + 1 }}", NULL, ZI_EINVAL, "line 1 col 9: 'nope' is undefined");
    expect_error("\n{{ messages[0].tool_calls.x }}", NULL, ZI_EINVAL,
                 "line 2 col 26: 'dict object' has no attribute 'tool_calls'");
    expect_error("{{ messages[5]['role'] }}", NULL, ZI_EINVAL, "undefined");
    expect_error("{{ 'a' + 1 }}", NULL, ZI_EINVAL, "can only concatenate str (not \"int\") to str");
    expect_error("{{ 1 // 0 }}", NULL, ZI_EINVAL, "division or modulo by zero");
    expect_error("{{ [1] < 'a' }}", NULL, ZI_EINVAL, "'<' not supported");
    expect_error("{% set x = 1 %}{% set x.y = 2 %}", NULL, ZI_EINVAL, "non-namespace");
    expect_error("{% for a, b, c in messages %}{% endfor %}", NULL, ZI_EINVAL,
                 "not enough values to unpack (expected 3, got 2)");
    expect_render("{% for a, b in messages %}{{ a }}{{ b }}{% endfor %}", "rolecontentrolecontent");
    /* Unknown filters and tests are refused at load, as jinja2's compiler
     * refuses them, except inside an if statement or a conditional
     * expression (not in a loop or macro nested there), where they fail
     * only when reached. */
    expect_compile_error("{{ 'x' | frobnicate }}", ZI_EUNSUPPORTED,
                         "line 1 col 10: filter 'frobnicate' is not supported");
    expect_render("{% if false %}\n  {{ x | wordwrap(3) }}{% endif %}ok", "ok");
    expect_error("{% if true %}\n  {{ x | wordwrap(3) }}{% endif %}ok", NULL, ZI_EUNSUPPORTED,
                 "line 2 col 10: no filter named 'wordwrap'");
    expect_render("{{ x | frob if false else 1 }}", "1");
    expect_render("{% macro m() %}{% if 0 %}{{ 1 | frob }}{% endif %}{% endmacro %}ok", "ok");
    expect_compile_error("{% if true %}{% for m in [1] %}{{ m | frob }}{% endfor %}{% endif %}",
                         ZI_EUNSUPPORTED, "line 1 col 39: filter 'frob' is not supported");
    expect_compile_error("{% if x %}{% set y | frob %}{% endset %}{% endif %}", ZI_EUNSUPPORTED,
                         "filter 'frob' is not supported");
    /* Argument errors name the filter, not the source text after it. */
    expect_error("{{ 'a' | upper(1) }}", NULL, ZI_EINVAL,
                 "upper() takes at most 0 arguments (1 given)");
    expect_error("{{ ['a'] | map('first', 2) | list }}", NULL, ZI_EINVAL,
                 "first() takes at most 0 arguments (1 given)");
    expect_compile_error("{{ 1 is frobnicated }}", ZI_EUNSUPPORTED,
                         "line 1 col 6: test 'frobnicated' is not supported");
    expect_error("{{ '%s' % 1 }}", NULL, ZI_EUNSUPPORTED, "formatting");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, ZI_EUNSUPPORTED, "64 bits");
    expect_error("{{ undefined_fn() }}", NULL, ZI_EINVAL, "'undefined_fn' is undefined");
    expect_error("{{ 'abc'() }}", NULL, ZI_EINVAL, "not callable");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, ZI_EINVAL,
                 "takes not more than 1");
    expect_error("{{ messages | tojson }}{{ nope | tojson }}", NULL, ZI_EINVAL,
                 "not JSON serializable");
    /* An unknown method is only known at render: it fails there. */
    expect_render("{% for m in [] %}{{ x.frobnicate() }}{% endfor %}ok", "ok");
    expect_error("{{ 'x'.frobnicate() }}", NULL, ZI_EINVAL, "has no attribute 'frobnicate'");

    /* Bad arguments and bad message text. */
    zi_chat_template *t;
    assert_int_equal(compile_str("{{ messages[0].content }}", &t, &err), ZI_OK);
    assert_int_equal(zi_chat_template_render(NULL, NULL, 0, NULL, &out, NULL, &err), ZI_EINVAL);
    assert_int_equal(zi_chat_template_render(t, NULL, 1, NULL, &out, NULL, &err), ZI_EINVAL);
    assert_int_equal(zi_chat_template_render(t, NULL, 0, NULL, NULL, NULL, &err), ZI_EINVAL);
    zi_chat_message bad[2] = {{"user", "ok", 0, 0}, {"user", "caf\xc3", 0, 0}};
    assert_int_equal(zi_chat_template_render(t, bad, 2, NULL, &out, NULL, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "chat message 1: content is not valid UTF-8 at byte 3"));
    assert_null(out);
    zi_chat_message overlong[1] = {{"user", "\xc0\xaf", 0, 0}};
    assert_int_equal(zi_chat_template_render(t, overlong, 1, NULL, &out, NULL, &err), ZI_EINVAL);
    zi_chat_message norole[1] = {{NULL, "x", 0, 0}};
    assert_int_equal(zi_chat_template_render(t, norole, 1, NULL, &out, NULL, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "role is NULL"));
    zi_chat_render_opts o = {0};
    o.bos_token = "\xff";
    zi_chat_message ok[1] = {{"user", "fine", 0, 0}};
    assert_int_equal(zi_chat_template_render(t, ok, 1, &o, &out, NULL, &err), ZI_EINVAL);
    assert_int_equal(zi_chat_template_render(t, ok, 1, NULL, &out, NULL, &err), ZI_OK);
    assert_string_equal(out, "fine");
    free(out);
    zi_chat_template_free(t);
    zi_chat_template_free(NULL);
}

/* ---- limits --------------------------------------------------------------- */

static void test_limits(void **state) {
    (void)state;
    zi_chat_render_opts o = {0};

    o.max_iterations = 5000;
    expect_error("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", &o,
                 ZI_ERANGE, "limit of 5000 loop iterations");
    expect_render("{% for i in range(100) %}{% for j in range(40) %}{% endfor %}{% endfor %}ok",
                  "ok");
    expect_error("{{ range(200000) | length }}", NULL, ZI_ERANGE, "range too big");
    /* An endless loop is impossible (loops only walk finite sequences), but a
     * long one is bounded by the iteration limit: 100000^2 iterations. */
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                 NULL, ZI_ERANGE, "loop iterations");

    memset(&o, 0, sizeof o);
    o.max_output = 100;
    expect_error("{% for i in range(1000) %}0123456789{% endfor %}", &o, ZI_ERANGE,
                 "exceeds the limit of 100 bytes");
    /* Text captured by {% set %} blocks and macros counts too. */
    expect_error("{% set x %}{% for i in range(1000) %}0123456789{% endfor %}{% endset %}", &o,
                 ZI_ERANGE, "exceeds the limit");

    memset(&o, 0, sizeof o);
    o.max_memory = 1 << 20;
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s "
                 "%}{% endfor %}{{ ns.s | length }}",
                 &o, ZI_ENOMEM, "limit of 1048576 bytes of memory");
    expect_error("{{ 'x' * 100000000 }}", &o, ZI_ENOMEM, NULL);
    expect_error("{{ [1, 2, 3] * 100000000 }}", &o, ZI_ENOMEM, NULL);
    expect_error("{{ 'x' * 9000000000000000000 }}", NULL, ZI_ENOMEM, "limit of");
    /* Repeating nothing is instant, however many times. */
    expect_render("[{{ '' * 9000000000000000000 }}{{ [] * 9000000000000000000 }}]", "[[]]");

    memset(&o, 0, sizeof o);
    o.max_steps = 1000;
    expect_error("{% for i in range(100000) %}{{ i }}{% endfor %}", &o, ZI_ERANGE,
                 "limit of 1000 evaluation steps");

    /* Recursion: a macro calling itself forever stops at the depth limit. */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, ZI_ERANGE,
                 "deeper than 500 levels");
    expect_render(
        "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(9) }}",
        "987654321");
    /* A value that contains itself cannot be printed forever. */
    expect_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", NULL, ZI_ERANGE,
                 "deeper");
}

static char *repeat_str(const char *head, const char *unit, size_t n, const char *tail) {
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1);
    memcpy(s, head, hl);
    for (size_t i = 0; i < n; i++) memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + n * ul, tail, tl + 1);
    return s;
}

static void test_nesting_limits(void **state) {
    (void)state;
    zi_chat_template *t = NULL;
    zi_error err = {0};
    /* The parser refuses deep nesting instead of recursing without bound. */
    char *parens = repeat_str("{{ ", "(", 100000, "1");
    assert_int_equal(compile_str(parens, &t, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "nested more than 100 levels"));
    free(parens);
    char *nots = repeat_str("{{ ", "not ", 100000, "x }}");
    assert_int_equal(compile_str(nots, &t, &err), ZI_EFORMAT);
    free(nots);
    char *ifs = repeat_str("", "{% if true %}", 10000, "");
    assert_int_equal(compile_str(ifs, &t, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "nested more than"));
    free(ifs);
    char *brackets = repeat_str("{{ ", "[", 100000, "");
    assert_int_equal(compile_str(brackets, &t, &err), ZI_EFORMAT);
    free(brackets);
    /* Chains build deep trees without deep parsing; the evaluator stops. */
    char *chain = repeat_str("{{ messages", "[0]", 100000, " }}");
    assert_int_equal(compile_str(chain, &t, &err), ZI_OK);
    char *out;
    zi_chat_message m[1] = {{"user", "x", 0, 0}};
    assert_int_equal(zi_chat_template_render(t, m, 1, NULL, &out, NULL, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "deeper than 500"));
    zi_chat_template_free(t);
    free(chain);
    char *sum = repeat_str("{{ 0", " + 1", 100000, " }}");
    assert_int_equal(compile_str(sum, &t, &err), ZI_OK);
    assert_int_equal(zi_chat_template_render(t, m, 1, NULL, &out, NULL, &err), ZI_ERANGE);
    zi_chat_template_free(t);
    free(sum);
    /* 50 nested loops and ifs are fine. */
    char *a = repeat_str("", "{% for x in [1] %}{% if x %}", 45, "deep");
    char *b = repeat_str(a, "{% endif %}{% endfor %}", 45, "");
    expect_render(b, "deep");
    free(a);
    free(b);
}

/* A seeded mutation run: each fixture template with random edits (bytes
 * that matter to Jinja spliced in, runs deleted or duplicated) must either
 * compile and render or fail cleanly - never crash, leak or hang. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static const char *const mutation_pieces[] = {
    "{{", "}}", "{%", "%}", "{#", "#}", "-",    "+",          "(",       ")",      "[",
    "]",  "'",  "\"", "\\", "|",  "~",  " if ", " for x in ", " endfor", " endif", "loop.",
    ".",  ",",  "\n", " ",  "é",  "0",  "9",    "raw",        "set ",    "*",      "%"};

typedef struct mutation_stats {
    size_t runs, compiled, rendered;
} mutation_stats;

/* `count` seeded mutations of src[0..len) (pieces inserted, runs deleted or
 * duplicated): each must compile and render within the limits of o, or
 * fail cleanly with a located message. */
static void mutate_and_run(const char *src, size_t len, int count, uint64_t *seed,
                           const zi_chat_message *m, size_t nm, const zi_chat_render_opts *o,
                           mutation_stats *st) {
    const size_t npieces = sizeof mutation_pieces / sizeof mutation_pieces[0];
    for (int k = 0; k < count; k++) {
        char *buf = malloc(len * 2 + 64);
        assert_non_null(buf);
        memcpy(buf, src, len);
        size_t n = len;
        int edits = 1 + (int)(rng_next(seed) % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = n ? rng_next(seed) % n : 0;
            uint64_t op = rng_next(seed) % 3;
            if (op == 0) { /* insert a piece */
                const char *p = mutation_pieces[rng_next(seed) % npieces];
                size_t pl = strlen(p);
                if (n + pl > len * 2 + 60) continue;
                memmove(buf + at + pl, buf + at, n - at);
                memcpy(buf + at, p, pl);
                n += pl;
            } else if (op == 1) { /* delete a run */
                size_t dl = 1 + rng_next(seed) % 8;
                if (at + dl > n) dl = n - at;
                memmove(buf + at, buf + at + dl, n - at - dl);
                n -= dl;
            } else { /* duplicate a run */
                size_t dl = 1 + rng_next(seed) % 16;
                if (at + dl > n) dl = n - at;
                if (n + dl > len * 2 + 60) continue;
                memmove(buf + at + dl, buf + at, n - at);
                n += dl;
            }
        }
        zi_chat_template *t = NULL;
        zi_error err = {0};
        st->runs++;
        int rc = zi_chat_template_compile(buf, n, &t, &err);
        if (rc == ZI_OK) {
            st->compiled++;
            char *out = NULL;
            size_t out_len;
            rc = zi_chat_template_render(t, m, nm, o, &out, &out_len, &err);
            if (rc == ZI_OK) {
                st->rendered++;
                assert_non_null(out);
                assert_int_equal(strlen(out) <= out_len, 1);
                free(out);
            } else {
                assert_null(out);
                assert_true(rc == ZI_EINVAL || rc == ZI_EUNSUPPORTED || rc == ZI_ERANGE ||
                            rc == ZI_ENOMEM || rc == ZI_EFORMAT);
                assert_true(err.msg[0] != '\0');
            }
            zi_chat_template_free(t);
        } else {
            assert_null(t);
            assert_true(rc == ZI_EFORMAT || rc == ZI_EUNSUPPORTED || rc == ZI_EINVAL);
            assert_non_null(strstr(err.msg, "chat template line "));
        }
        free(buf);
    }
}

static zi_chat_render_opts mutation_opts(void) {
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    o.bos_token = "<s>";
    o.max_output = 1 << 16;
    o.max_memory = 8 << 20;
    o.max_iterations = 20000;
    o.max_steps = 200000;
    return o;
}

static void test_mutations(void **state) {
    (void)state;
    json_t *j = load_fixture();
    json_t *templates = json_object_get(j, "templates");
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    mutation_stats st = {0, 0, 0};
    zi_chat_message m[3] = {
        {"system", "s", 0, 0}, {"user", "u {{ x }}", 0, 0}, {"assistant", "a", 0, 0}};
    zi_chat_render_opts o = mutation_opts();
    for (size_t ti = 0; ti < json_array_size(templates); ti++) {
        char path[512];
        snprintf(path, sizeof path, FIXTURE_DIR "%s",
                 json_string_value(json_object_get(json_array_get(templates, ti), "file")));
        size_t len;
        char *src = read_file(path, &len);
        assert_non_null(src);
        mutate_and_run(src, len, 150, &seed, m, 3, &o, &st);
        free(src);
    }
    print_message("chat templates: %zu mutated templates, %zu compiled, %zu rendered\n", st.runs,
                  st.compiled, st.rendered);
    json_decref(j);
    assert_true(st.compiled > st.runs / 10);
}

/* The same on llama.cpp's 70 vendored templates ($ZINFER_HOME/llama.cpp-
 * vendor/models/templates; skipped when absent), rendered with tools and
 * a tool-call round trip, the shapes that reach their largest branches. */
static void test_mutations_vendored(void **state) {
    (void)state;
    char dir[1024];
    zi_test_vendor_dir(dir, sizeof dir, "templates");
    DIR *d = opendir(dir);
    if (!d) {
        print_message("chat templates: %s absent, vendored mutations skipped\n", dir);
        skip();
    }
    /* [{"role": "user", ...}, {"role": "assistant", "content": "", "tool_calls": [...]},
     *  {"role": "tool", "tool_call_id": ..., "content": ...}] and one tool. */
    static const zi_chat_pair args[] = {{"city", 4, {ZI_CHAT_STR, {.s = {"Oslo", 4}}}}};
    static const zi_chat_pair fn[] = {{"name", 4, {ZI_CHAT_STR, {.s = {"get_weather", 11}}}},
                                      {"arguments", 9, {ZI_CHAT_DICT, {.dict = {args, 1}}}}};
    static const zi_chat_pair call[] = {{"id", 2, {ZI_CHAT_STR, {.s = {"c1", 2}}}},
                                        {"type", 4, {ZI_CHAT_STR, {.s = {"function", 8}}}},
                                        {"function", 8, {ZI_CHAT_DICT, {.dict = {fn, 2}}}}};
    static const zi_chat_value calls[] = {{ZI_CHAT_DICT, {.dict = {call, 3}}}};
    static const zi_chat_pair m0[] = {{"role", 4, {ZI_CHAT_STR, {.s = {"user", 4}}}},
                                      {"content", 7, {ZI_CHAT_STR, {.s = {"Weather?", 8}}}}};
    static const zi_chat_pair m1[] = {{"role", 4, {ZI_CHAT_STR, {.s = {"assistant", 9}}}},
                                      {"content", 7, {ZI_CHAT_STR, {.s = {"", 0}}}},
                                      {"tool_calls", 10, {ZI_CHAT_LIST, {.list = {calls, 1}}}}};
    static const zi_chat_pair m2[] = {{"role", 4, {ZI_CHAT_STR, {.s = {"tool", 4}}}},
                                      {"tool_call_id", 12, {ZI_CHAT_STR, {.s = {"c1", 2}}}},
                                      {"content", 7, {ZI_CHAT_STR, {.s = {"{\"t\": 3}", 8}}}}};
    static const zi_chat_value msgs[] = {{ZI_CHAT_DICT, {.dict = {m0, 2}}},
                                         {ZI_CHAT_DICT, {.dict = {m1, 3}}},
                                         {ZI_CHAT_DICT, {.dict = {m2, 3}}}};
    static const zi_chat_value messages = {ZI_CHAT_LIST, {.list = {msgs, 3}}};
    static const zi_chat_pair tfn[] = {{"name", 4, {ZI_CHAT_STR, {.s = {"get_weather", 11}}}},
                                       {"description", 11, {ZI_CHAT_STR, {.s = {"Weather.", 8}}}}};
    static const zi_chat_pair tool[] = {{"type", 4, {ZI_CHAT_STR, {.s = {"function", 8}}}},
                                        {"function", 8, {ZI_CHAT_DICT, {.dict = {tfn, 2}}}}};
    static const zi_chat_value tools[] = {{ZI_CHAT_DICT, {.dict = {tool, 2}}}};
    zi_chat_var var = {"tools", 5, {ZI_CHAT_LIST, {.list = {tools, 1}}}};
    zi_chat_render_opts o = mutation_opts();
    o.messages = &messages;
    o.vars = &var;
    o.n_vars = 1;
    uint64_t seed = 0x2545F4914F6CDD1Dull;
    mutation_stats st = {0, 0, 0};
    size_t files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 7 || strcmp(e->d_name + nl - 6, ".jinja")) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        char *src = read_file(path, &len);
        assert_non_null(src);
        /* the unmutated template renders */
        zi_chat_template *t = NULL;
        zi_error err = {0};
        if (zi_chat_template_compile(src, len, &t, &err)) fail_msg("%s: %s", path, err.msg);
        zi_chat_template_free(t);
        mutate_and_run(src, len, 30, &seed, NULL, 0, &o, &st);
        free(src);
        files++;
    }
    closedir(d);
    print_message("chat templates: %zu vendored templates, %zu mutations, %zu compiled, "
                  "%zu rendered\n",
                  files, st.runs, st.compiled, st.rendered);
    assert_true(files > 0);
    assert_true(st.compiled > st.runs / 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_templates),
        cmocka_unit_test(test_fixture_snippets),
        cmocka_unit_test(test_gguf_template),
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_none_content_and_lengths),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_runtime_errors),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_nesting_limits),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_mutations_vendored),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
