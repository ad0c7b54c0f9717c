/*
 * test_chat_template.c - cmocka tests for the chat-template engine
 * (tokenizer_proc/chat_template.h).
 *
 * Five layers:
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
 *    (run this binary under -fsanitize=address,undefined);
 *  - extra variables (tools, chat_template_options): the fixture's
 *    var_cases rendered with trees built from the JSON and again with the
 *    same values packed as msgpack through chat_vars.h; values of every
 *    kind; the names, strings, nesting and tool shapes that are refused.
 * Run from the repository root.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <msgpack.h>

#include "chat_template.h"
#include "chat_vars.h"
#include "codec.h"
#include "gguf.h"

#define FIXTURE_DIR "tests/fixtures/chat_templates/"
#define FIXTURE FIXTURE_DIR "expected.json"
#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* ---- helpers ----------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n == cap) buf = realloc(buf, cap *= 2);
        size_t k = fread(buf + n, 1, cap - n, f);
        if (k == 0) break;
        n += k;
    }
    fclose(f);
    buf = realloc(buf, n + 1);
    buf[n] = '\0';
    *len = n;
    return buf;
}

static json_t *load_fixture(void) {
    json_error_t je;
    json_t *j = json_load_file(FIXTURE, JSON_ALLOW_NUL, &je);
    if (!j) fail_msg("cannot read %s: %s (run from the repository root)", FIXTURE, je.text);
    return j;
}

/* Messages of a fixture case; the strings stay owned by the JSON. */
static zi_chat_message *fixture_messages(json_t *arr, size_t *n) {
    *n = json_array_size(arr);
    zi_chat_message *m = calloc(*n + 1, sizeof *m);
    for (size_t i = 0; i < *n; i++) {
        json_t *o = json_array_get(arr, i);
        json_t *content = json_object_get(o, "content");
        m[i].role = json_string_value(json_object_get(o, "role"));
        m[i].role_len = json_string_length(json_object_get(o, "role"));
        m[i].content = json_string_value(content);
        m[i].content_len = json_string_length(content);
    }
    return m;
}

static int compile_str(const char *src, zi_chat_template **t, zi_error *err) {
    return zi_chat_template_compile(src, strlen(src), t, err);
}

/* Renders src with messages user "hi" / assistant "yo" and opts; returns
 * the status, *out (malloc'd) on success. */
static int render_str(const char *src, const zi_chat_render_opts *opts, char **out, zi_error *err) {
    zi_chat_template *t = NULL;
    *out = NULL;
    int rc = compile_str(src, &t, err);
    if (rc) return rc;
    zi_chat_message m[2] = {{"user", "hi", 0, 0}, {"assistant", "yo", 0, 0}};
    rc = zi_chat_template_render(t, m, 2, opts, out, NULL, err);
    zi_chat_template_free(t);
    return rc;
}

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

/* Checks a fixture outcome, rendering with the extra variables
 * vars[0..n_vars); returns 1 when it matched. */
static int check_case_vars(const zi_chat_template *t, const char *label, json_t *c,
                           json_t *messages, const char *bos, const char *eos, int agp,
                           const zi_chat_var *vars, size_t n_vars) {
    size_t n;
    zi_chat_message *m = fixture_messages(messages, &n);
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = agp;
    o.bos_token = bos;
    o.eos_token = eos;
    o.vars = vars;
    o.n_vars = n_vars;
    zi_error err = {0};
    char *out = NULL;
    size_t out_len = 0;
    int rc = zi_chat_template_render(t, m, n, &o, &out, &out_len, &err);
    free(m);
    json_t *expected = json_object_get(c, "expected");
    int ok;
    if (expected) {
        ok = rc == ZI_OK && out_len == json_string_length(expected) &&
             memcmp(out, json_string_value(expected), out_len) == 0;
        if (!ok)
            print_error("%s: rc %d (%s)\n  want: %s\n  got:  %s\n", label, rc, err.msg,
                        json_string_value(expected), out ? out : "(none)");
    } else {
        const char *kind = json_string_value(json_object_get(c, "error"));
        const char *msg = json_string_value(json_object_get(c, "message"));
        ok = rc != ZI_OK && out == NULL;
        if (ok && strcmp(kind, "raise_exception") == 0)
            ok = rc == ZI_EINVAL && strcmp(err.msg, msg) == 0;
        if (!ok)
            print_error("%s: want error %s (%s), got rc %d (%s)\n", label, kind, msg, rc,
                        rc ? err.msg : out);
    }
    free(out);
    return ok;
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
    expect_error("{{ 'x' | frobnicate }}", NULL, ZI_EUNSUPPORTED,
                 "line 1 col 10: no filter named 'frobnicate'");
    /* Argument errors name the filter, not the source text after it. */
    expect_error("{{ 'a' | upper(1) }}", NULL, ZI_EINVAL,
                 "upper() takes at most 0 arguments (1 given)");
    expect_error("{{ ['a'] | map('first', 2) | list }}", NULL, ZI_EINVAL,
                 "first() takes at most 0 arguments (1 given)");
    expect_error("{{ 1 is frobnicated }}", NULL, ZI_EUNSUPPORTED, "no test named 'frobnicated'");
    expect_error("{{ '%s' % 1 }}", NULL, ZI_EUNSUPPORTED, "formatting");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, ZI_EUNSUPPORTED, "64 bits");
    expect_error("{{ undefined_fn() }}", NULL, ZI_EINVAL, "'undefined_fn' is undefined");
    expect_error("{{ 'abc'() }}", NULL, ZI_EINVAL, "not callable");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", NULL, ZI_EINVAL,
                 "takes not more than 1");
    expect_error("{{ messages | tojson }}{{ nope | tojson }}", NULL, ZI_EINVAL,
                 "not JSON serializable");
    /* An unknown filter in a branch never taken is not an error. */
    expect_render("{% if false %}{{ x | frobnicate }}{% endif %}ok", "ok");

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

static void test_mutations(void **state) {
    (void)state;
    static const char *const pieces[] = {
        "{{", "}}", "{%", "%}", "{#", "#}", "-",    "+",          "(",       ")",      "[",
        "]",  "'",  "\"", "\\", "|",  "~",  " if ", " for x in ", " endfor", " endif", "loop.",
        ".",  ",",  "\n", " ",  "é",  "0",  "9",    "raw",        "set ",    "*",      "%"};
    json_t *j = load_fixture();
    json_t *templates = json_object_get(j, "templates");
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t runs = 0, compiled = 0, rendered = 0;
    zi_chat_message m[3] = {
        {"system", "s", 0, 0}, {"user", "u {{ x }}", 0, 0}, {"assistant", "a", 0, 0}};
    zi_chat_render_opts o = {0};
    o.add_generation_prompt = 1;
    o.bos_token = "<s>";
    o.max_output = 1 << 16;
    o.max_memory = 8 << 20;
    o.max_iterations = 20000;
    o.max_steps = 200000;
    for (size_t ti = 0; ti < json_array_size(templates); ti++) {
        char path[512];
        snprintf(path, sizeof path, FIXTURE_DIR "%s",
                 json_string_value(json_object_get(json_array_get(templates, ti), "file")));
        size_t len;
        char *src = read_file(path, &len);
        assert_non_null(src);
        for (int k = 0; k < 150; k++) {
            char *buf = malloc(len * 2 + 64);
            memcpy(buf, src, len);
            size_t n = len;
            int edits = 1 + (int)(rng_next(&seed) % 4);
            for (int e = 0; e < edits; e++) {
                size_t at = n ? rng_next(&seed) % n : 0;
                uint64_t op = rng_next(&seed) % 3;
                if (op == 0) { /* insert a piece */
                    const char *p = pieces[rng_next(&seed) % (sizeof pieces / sizeof pieces[0])];
                    size_t pl = strlen(p);
                    if (n + pl > len * 2 + 60) continue;
                    memmove(buf + at + pl, buf + at, n - at);
                    memcpy(buf + at, p, pl);
                    n += pl;
                } else if (op == 1) { /* delete a run */
                    size_t dl = 1 + rng_next(&seed) % 8;
                    if (at + dl > n) dl = n - at;
                    memmove(buf + at, buf + at + dl, n - at - dl);
                    n -= dl;
                } else { /* duplicate a run */
                    size_t dl = 1 + rng_next(&seed) % 16;
                    if (at + dl > n) dl = n - at;
                    if (n + dl > len * 2 + 60) continue;
                    memmove(buf + at + dl, buf + at, n - at);
                    n += dl;
                }
            }
            zi_chat_template *t = NULL;
            zi_error err = {0};
            runs++;
            int rc = zi_chat_template_compile(buf, n, &t, &err);
            if (rc == ZI_OK) {
                compiled++;
                char *out = NULL;
                size_t out_len;
                rc = zi_chat_template_render(t, m, 3, &o, &out, &out_len, &err);
                if (rc == ZI_OK) {
                    rendered++;
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
        free(src);
    }
    print_message("chat templates: %zu mutated templates, %zu compiled, %zu rendered\n", runs,
                  compiled, rendered);
    json_decref(j);
    assert_true(compiled > runs / 10);
}

/* ---- extra variables: tools and chat_template_options ------------------ */

/* A zi_chat_value tree for a JSON value; strings stay owned by the JSON. */
static void json_to_value(json_t *j, zi_chat_value *out) {
    memset(out, 0, sizeof *out);
    switch (json_typeof(j)) {
    case JSON_NULL:
        out->kind = ZI_CHAT_NONE;
        break;
    case JSON_TRUE:
    case JSON_FALSE:
        out->kind = ZI_CHAT_BOOL;
        out->u.b = json_is_true(j);
        break;
    case JSON_INTEGER:
        out->kind = ZI_CHAT_INT;
        out->u.i = json_integer_value(j);
        break;
    case JSON_REAL:
        out->kind = ZI_CHAT_FLOAT;
        out->u.f = json_real_value(j);
        break;
    case JSON_STRING:
        out->kind = ZI_CHAT_STR;
        out->u.s.p = json_string_value(j);
        out->u.s.len = json_string_length(j);
        break;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        zi_chat_value *v = calloc(n + 1, sizeof *v);
        for (size_t i = 0; i < n; i++) json_to_value(json_array_get(j, i), &v[i]);
        out->kind = ZI_CHAT_LIST;
        out->u.list.v = v;
        out->u.list.n = n;
        break;
    }
    case JSON_OBJECT: {
        zi_chat_pair *p = calloc(json_object_size(j) + 1, sizeof *p);
        const char *key;
        json_t *val;
        size_t i = 0;
        json_object_foreach(j, key, val) {
            p[i].key = key;
            p[i].key_len = strlen(key);
            json_to_value(val, &p[i].value);
            i++;
        }
        out->kind = ZI_CHAT_DICT;
        out->u.dict.v = p;
        out->u.dict.n = i;
        break;
    }
    }
}

static void value_free(zi_chat_value *v) {
    if (v->kind == ZI_CHAT_LIST) {
        for (size_t i = 0; i < v->u.list.n; i++) value_free((zi_chat_value *)&v->u.list.v[i]);
        free((void *)v->u.list.v);
    } else if (v->kind == ZI_CHAT_DICT) {
        for (size_t i = 0; i < v->u.dict.n; i++) value_free((zi_chat_value *)&v->u.dict.v[i].value);
        free((void *)v->u.dict.v);
    }
}

/* Packs a JSON value as msgpack (integers as int64, reals as float64). */
static void pack_json(msgpack_packer *pk, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_NULL:
        msgpack_pack_nil(pk);
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(j));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(j));
        break;
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(j));
        msgpack_pack_str_body(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(j));
        for (size_t i = 0; i < json_array_size(j); i++) pack_json(pk, json_array_get(j, i));
        break;
    case JSON_OBJECT: {
        const char *key;
        json_t *val;
        msgpack_pack_map(pk, json_object_size(j));
        json_object_foreach(j, key, val) {
            msgpack_pack_str(pk, strlen(key));
            msgpack_pack_str_body(pk, key, strlen(key));
            pack_json(pk, val);
        }
        break;
    }
    }
}

/* j as msgpack bytes in *b (malloc'd, as the codec keeps them). */
static void json_to_bytes(json_t *j, zi_bytes *b) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_json(&pk, j);
    b->p = malloc(sb.size);
    memcpy(b->p, sb.data, sb.size);
    b->len = sb.size;
    msgpack_sbuffer_destroy(&sb);
}

/* Every fixture case with tools and options, twice: with the variables as
 * trees built from the JSON, and as msgpack through chat_vars.h. */
/* zi_chat_vars_from_msgpack over msgpack bytes (absent when NULL or
 * empty), as the tokenizer process has them. */
static int vars_from_bytes(const zi_bytes *tools, const zi_bytes *options, zi_chat_vars *cv,
                           zi_error *err) {
    msgpack_unpacked ut, uo;
    int have_t = tools && tools->len, have_o = options && options->len;
    if (have_t) assert_int_equal(zi_msgpack_parse(tools->p, tools->len, NULL, &ut, err), ZI_OK);
    if (have_o) assert_int_equal(zi_msgpack_parse(options->p, options->len, NULL, &uo, err), ZI_OK);
    int rc = zi_chat_vars_from_msgpack(have_t ? &ut.data : NULL, have_o ? &uo.data : NULL, cv, err);
    if (have_t) msgpack_unpacked_destroy(&ut);
    if (have_o) msgpack_unpacked_destroy(&uo);
    return rc;
}

static void test_fixture_vars(void **state) {
    (void)state;
    json_t *j = load_fixture();
    json_t *cases = json_object_get(j, "var_cases");
    assert_true(json_array_size(cases) >= 20);
    size_t total = 0, passed = 0;
    for (size_t ci = 0; ci < json_array_size(cases); ci++) {
        json_t *c = json_array_get(cases, ci);
        const char *name = json_string_value(json_object_get(c, "name"));
        json_t *file = json_object_get(c, "file");
        char *src;
        size_t len;
        if (file) {
            char path[512];
            snprintf(path, sizeof path, FIXTURE_DIR "%s", json_string_value(file));
            src = read_file(path, &len);
            if (!src) fail_msg("cannot read %s", path);
        } else {
            json_t *tj = json_object_get(c, "template");
            len = json_string_length(tj);
            src = malloc(len + 1);
            memcpy(src, json_string_value(tj), len + 1);
        }
        zi_chat_template *t = NULL;
        zi_error err = {0};
        if (zi_chat_template_compile(src, len, &t, &err)) fail_msg("%s: %s", name, err.msg);
        json_t *tools = json_object_get(c, "tools"), *options = json_object_get(c, "options");
        json_t *messages = json_object_get(c, "messages");
        const char *bos = json_string_value(json_object_get(c, "bos_token"));
        const char *eos = json_string_value(json_object_get(c, "eos_token"));
        int agp = json_is_true(json_object_get(c, "add_generation_prompt"));

        /* 1: trees made by hand; tools only when there are some. */
        size_t nv = 0;
        zi_chat_var *vars = calloc(1 + json_object_size(options), sizeof *vars);
        if (json_array_size(tools)) {
            vars[nv].name = "tools";
            vars[nv].name_len = 5;
            json_to_value(tools, &vars[nv++].value);
        }
        const char *key;
        json_t *val;
        json_object_foreach(options, key, val) {
            vars[nv].name = key;
            vars[nv].name_len = strlen(key);
            json_to_value(val, &vars[nv++].value);
        }
        char label[160];
        snprintf(label, sizeof label, "var case %s (trees)", name);
        total++;
        passed += check_case_vars(t, label, c, messages, bos, eos, agp, vars, nv);
        for (size_t i = 0; i < nv; i++) value_free(&vars[i].value);
        free(vars);

        /* 2: msgpack bytes, as the codec keeps a request's fields (an empty
         * tools array included: it must leave `tools` undefined). */
        zi_bytes tb = {0}, ob = {0};
        json_to_bytes(tools, &tb);
        json_to_bytes(options, &ob);
        zi_chat_vars cv;
        int rc = vars_from_bytes(&tb, &ob, &cv, &err);
        if (rc) fail_msg("%s: chat_vars: %s", name, err.msg);
        assert_int_equal(cv.n, (json_array_size(tools) ? 1 : 0) + json_object_size(options));
        snprintf(label, sizeof label, "var case %s (msgpack)", name);
        total++;
        passed += check_case_vars(t, label, c, messages, bos, eos, agp, cv.v, cv.n);
        zi_chat_vars_free(&cv);
        free(tb.p);
        free(ob.p);
        zi_chat_template_free(t);
        free(src);
    }
    print_message("chat templates: %zu/%zu renderings with tools and options match jinja2\n",
                  passed, total);
    json_decref(j);
    assert_int_equal(passed, total);
}

static zi_chat_value vstr(const char *s) {
    zi_chat_value v = {0};
    v.kind = ZI_CHAT_STR;
    v.u.s.p = s;
    v.u.s.len = strlen(s);
    return v;
}

static zi_chat_value vint(int64_t i) {
    zi_chat_value v = {0};
    v.kind = ZI_CHAT_INT;
    v.u.i = i;
    return v;
}

/* Renders src (messages user "hi" / assistant "yo") with vars; returns the
 * status and *out. */
static int render_vars(const char *src, const zi_chat_var *vars, size_t n, char **out,
                       zi_error *err) {
    zi_chat_render_opts o = {0};
    o.vars = vars;
    o.n_vars = n;
    return render_str(src, &o, out, err);
}

static void expect_vars_error(const zi_chat_var *vars, size_t n, int code, const char *msg_part) {
    zi_error err = {0};
    char *out = NULL;
    int rc = render_vars("{{ 1 }}", vars, n, &out, &err);
    if (rc != code) fail_msg("want %d (%s), got %d (%s)", code, msg_part, rc, rc ? err.msg : out);
    assert_null(out);
    if (!strstr(err.msg, msg_part)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, msg_part);
}

static void test_vars_render(void **state) {
    (void)state;
    /* Every kind, a dict key given twice (first place, last value, as
     * Python's dict), embedded NUL, empty strings with NULL pointers. */
    zi_chat_value items[4] = {vstr("a"), vint(-7), {0}, {0}};
    items[2].kind = ZI_CHAT_FLOAT;
    items[2].u.f = 0.5;
    items[3].kind = ZI_CHAT_STR; /* p NULL, len 0: "" */
    zi_chat_pair pairs[4] = {{"k", 1, {0}}, {"b", 1, {0}}, {"k", 1, {0}}, {NULL, 0, {0}}};
    pairs[0].value = vint(1);
    pairs[1].value.kind = ZI_CHAT_BOOL;
    pairs[1].value.u.b = 7;
    pairs[2].value.kind = ZI_CHAT_LIST;
    pairs[2].value.u.list.v = items;
    pairs[2].value.u.list.n = 4;
    pairs[3].value.kind = ZI_CHAT_NONE;
    zi_chat_var vars[3] = {{"d", 1, {0}}, {"nul", 3, {0}}, {"empty_list", 10, {0}}};
    vars[0].value.kind = ZI_CHAT_DICT;
    vars[0].value.u.dict.v = pairs;
    vars[0].value.u.dict.n = 4;
    vars[1].value.kind = ZI_CHAT_STR;
    vars[1].value.u.s.p = "a\0b";
    vars[1].value.u.s.len = 3;
    vars[2].value.kind = ZI_CHAT_LIST;
    zi_error err = {0};
    char *out;
    size_t len;
    zi_chat_template *t;
    assert_int_equal(compile_str("{{ d }}|{{ d | tojson }}|{{ d.k[1] + 1 }}|{{ d[''] is none }}|"
                                 "{{ nul | length }}{{ nul }}|{{ empty_list }}{{ empty_list is "
                                 "sequence }}|{{ messages | length }}",
                                 &t, &err),
                     ZI_OK);
    zi_chat_render_opts o = {0};
    o.vars = vars;
    o.n_vars = 3;
    assert_int_equal(zi_chat_template_render(t, NULL, 0, &o, &out, &len, &err), ZI_OK);
    const char want[] = "{'k': ['a', -7, 0.5, ''], 'b': True, '': None}|"
                        "{\"k\": [\"a\", -7, 0.5, \"\"], \"b\": true, \"\": null}|-6|True|"
                        "3a\0b|[]True|0";
    assert_int_equal(len, sizeof want - 1);
    assert_memory_equal(out, want, len);
    free(out);
    zi_chat_template_free(t);

    /* Conversion is charged to the render's memory limit. */
    zi_chat_value *many = calloc(100000, sizeof *many);
    for (size_t i = 0; i < 100000; i++) many[i] = vstr("xyz");
    zi_chat_var big = {"big", 3, {0}};
    big.value.kind = ZI_CHAT_LIST;
    big.value.u.list.v = many;
    big.value.u.list.n = 100000;
    o.vars = &big;
    o.n_vars = 1;
    o.max_memory = 1 << 20;
    assert_int_equal(render_str("{{ big | length }}", &o, &out, &err), ZI_ENOMEM);
    o.max_memory = 0;
    assert_int_equal(render_str("{{ big | length }}", &o, &out, &err), ZI_OK);
    assert_string_equal(out, "100000");
    free(out);
    free(many);
}

static void test_vars_refused(void **state) {
    (void)state;
    static const char *const reserved[] = {"messages",
                                           "add_generation_prompt",
                                           "bos_token",
                                           "eos_token",
                                           "raise_exception",
                                           "strftime_now",
                                           "namespace",
                                           "range",
                                           "dict"};
    for (size_t i = 0; i < sizeof reserved / sizeof reserved[0]; i++) {
        zi_chat_var v = {reserved[i], strlen(reserved[i]), {0}};
        char want[96] = "chat template: ";
        strcat(want, reserved[i]);
        strcat(want, ": a name the renderer sets itself");
        expect_vars_error(&v, 1, ZI_EINVAL, want);
        assert_true(zi_chat_var_reserved(reserved[i], strlen(reserved[i])));
    }
    assert_false(zi_chat_var_reserved("tools", 5));
    assert_false(zi_chat_var_reserved("message", 7));
    assert_false(zi_chat_var_reserved(NULL, 0));
    /* A name given twice; a name, a string, a key that is not UTF-8. */
    zi_chat_var two[2] = {{"x", 1, {0}}, {"x", 1, {0}}};
    expect_vars_error(two, 2, ZI_EINVAL, "chat template: x: given twice");
    zi_chat_var badname = {"caf\xc3", 4, {0}};
    expect_vars_error(&badname, 1, ZI_EINVAL, "name not valid UTF-8 at byte 3");
    zi_chat_value items[2] = {vstr("ok"), vstr("\xed\xa0\x80")}; /* a surrogate */
    zi_chat_pair pairs[2] = {{"k", 1, {0}}, {"\xff", 1, {0}}};
    pairs[0].value.kind = ZI_CHAT_LIST;
    pairs[0].value.u.list.v = items;
    pairs[0].value.u.list.n = 2;
    zi_chat_var deep = {"opts", 4, {0}};
    deep.value.kind = ZI_CHAT_DICT;
    deep.value.u.dict.v = pairs;
    deep.value.u.dict.n = 1;
    expect_vars_error(&deep, 1, ZI_EINVAL, "chat template: opts.k[1]: not valid UTF-8 at byte 0");
    items[1] = vstr("fine");
    deep.value.u.dict.n = 2;
    expect_vars_error(&deep, 1, ZI_EINVAL, "opts: key #1 is not valid UTF-8 at byte 0");
    deep.value.u.dict.n = 1;
    char *out;
    zi_error err = {0};
    assert_int_equal(render_vars("{{ opts.k }}", &deep, 1, &out, &err), ZI_OK);
    assert_string_equal(out, "['ok', 'fine']");
    free(out);
    /* NULL pointers with lengths, unknown kinds, NULL vars. */
    zi_chat_var nul = {NULL, 2, {0}};
    expect_vars_error(&nul, 1, ZI_EINVAL, "NULL name");
    zi_chat_var nulstr = {"s", 1, {0}};
    nulstr.value.kind = ZI_CHAT_STR;
    nulstr.value.u.s.len = 2;
    expect_vars_error(&nulstr, 1, ZI_EINVAL, "s: NULL string");
    nulstr.value.kind = ZI_CHAT_LIST;
    expect_vars_error(&nulstr, 1, ZI_EINVAL, "s: NULL list items");
    nulstr.value.kind = 42;
    expect_vars_error(&nulstr, 1, ZI_EINVAL, "s: unknown value kind 42");
    expect_vars_error(NULL, 1, ZI_EINVAL, "NULL vars");
    /* Nesting: ZI_CHAT_VALUE_MAX_DEPTH levels are fine, one more is not. */
    zi_chat_value chain[ZI_CHAT_VALUE_MAX_DEPTH + 1];
    for (int i = 0; i <= ZI_CHAT_VALUE_MAX_DEPTH; i++) {
        memset(&chain[i], 0, sizeof chain[i]);
        chain[i].kind = ZI_CHAT_LIST;
        if (i < ZI_CHAT_VALUE_MAX_DEPTH) {
            chain[i].u.list.v = &chain[i + 1];
            chain[i].u.list.n = 1;
        }
    }
    zi_chat_var nest = {"n", 1, chain[1]};
    assert_int_equal(render_vars("{{ n | tojson }}", &nest, 1, &out, &err), ZI_OK);
    free(out);
    nest.value = chain[0];
    expect_vars_error(&nest, 1, ZI_EINVAL, "nested deeper than 32 levels");
    assert_int_equal(zi_chat_value_check(&chain[0], "v", &err), ZI_EINVAL);
    assert_int_equal(zi_chat_value_check(&chain[1], "v", &err), ZI_OK);
}

/* Unpacks sb into *u and returns its object. */
static const msgpack_object *unpack(const msgpack_sbuffer *sb, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(u, sb->data, sb->size, &off), MSGPACK_UNPACK_SUCCESS);
    return &u->data;
}

static void pack_s(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

/* A tool list packed by hand with msgpack_pack_*, through
 * zi_chat_value_from_msgpack, renders as jinja2 renders it. */
static void test_vars_msgpack(void **state) {
    (void)state;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    /* [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
     *   "properties": {"x": {"type": "number", "default": 0.25 (float32), "minimum": -3,
     *   "enum": [null, true, 18446744073709551 (uint), "é"]}}, "required": []}}}] */
    msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, 2);
    pack_s(&pk, "type");
    pack_s(&pk, "function");
    pack_s(&pk, "function");
    msgpack_pack_map(&pk, 2);
    pack_s(&pk, "name");
    pack_s(&pk, "f");
    pack_s(&pk, "parameters");
    msgpack_pack_map(&pk, 3);
    pack_s(&pk, "type");
    pack_s(&pk, "object");
    pack_s(&pk, "properties");
    msgpack_pack_map(&pk, 1);
    pack_s(&pk, "x");
    msgpack_pack_map(&pk, 4);
    pack_s(&pk, "type");
    pack_s(&pk, "number");
    pack_s(&pk, "default");
    msgpack_pack_float(&pk, 0.25f);
    pack_s(&pk, "minimum");
    msgpack_pack_int8(&pk, -3);
    pack_s(&pk, "enum");
    msgpack_pack_array(&pk, 4);
    msgpack_pack_nil(&pk);
    msgpack_pack_true(&pk);
    msgpack_pack_uint64(&pk, 18446744073709551ull);
    pack_s(&pk, "\xc3\xa9");
    pack_s(&pk, "required");
    msgpack_pack_array(&pk, 0);
    msgpack_unpacked u;
    const msgpack_object *o = unpack(&sb, &u);
    zi_chat_arena arena = {0};
    zi_chat_value v;
    zi_error err = {0};
    assert_int_equal(zi_chat_value_from_msgpack(o, "tools", &arena, &v, &err), ZI_OK);
    msgpack_unpacked_destroy(&u); /* the tree owns copies of its strings */
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(v.kind, ZI_CHAT_LIST);
    assert_int_equal(v.u.list.n, 1);
    const zi_chat_value *tool = &v.u.list.v[0];
    assert_int_equal(tool->kind, ZI_CHAT_DICT);
    assert_int_equal(tool->u.dict.n, 2);
    assert_memory_equal(tool->u.dict.v[1].key, "function", 8);
    zi_chat_var var = {"tools", 5, v};
    char *out;
    /* jinja2: json.dumps / repr of the same Python value. */
    assert_int_equal(render_vars("{{ tools | tojson }}\n{{ tools[0].function.parameters.properties"
                                 ".x }}",
                                 &var, 1, &out, &err),
                     ZI_OK);
    assert_string_equal(out, "[{\"type\": \"function\", \"function\": {\"name\": \"f\", "
                             "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": "
                             "{\"type\": \"number\", \"default\": 0.25, \"minimum\": -3, \"enum\": "
                             "[null, true, 18446744073709551, \"\xc3\xa9\"]}}, \"required\": "
                             "[]}}}]\n{'type': 'number', 'default': 0.25, 'minimum': -3, 'enum': "
                             "[None, True, 18446744073709551, '\xc3\xa9']}");
    free(out);
    zi_chat_arena_free(&arena);
    zi_chat_arena_free(&arena); /* empty: fine */

    /* Map pairs with a key given twice keep Python's dict() meaning. */
    msgpack_sbuffer_init(&sb);
    msgpack_pack_map(&pk, 3);
    pack_s(&pk, "a");
    msgpack_pack_int(&pk, 1);
    pack_s(&pk, "b");
    msgpack_pack_int(&pk, 2);
    pack_s(&pk, "a");
    msgpack_pack_int(&pk, 3);
    o = unpack(&sb, &u);
    assert_int_equal(zi_chat_value_from_msgpack(o, "d", &arena, &var.value, &err), ZI_OK);
    var.name = "d";
    var.name_len = 1;
    assert_int_equal(render_vars("{{ d }}", &var, 1, &out, &err), ZI_OK);
    assert_string_equal(out, "{'a': 3, 'b': 2}");
    free(out);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    zi_chat_arena_free(&arena);
}

/* Packs with f and expects zi_chat_value_from_msgpack to refuse it. */
static void expect_msgpack_refused(void (*f)(msgpack_packer *), int code, const char *msg_part) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    f(&pk);
    msgpack_unpacked u;
    const msgpack_object *o = unpack(&sb, &u);
    zi_chat_arena arena = {0};
    zi_chat_value v;
    zi_error err = {0};
    int rc = zi_chat_value_from_msgpack(o, "tools", &arena, &v, &err);
    if (rc != code) fail_msg("want %d (%s), got %d (%s)", code, msg_part, rc, err.msg);
    if (!strstr(err.msg, msg_part)) fail_msg("message \"%s\" lacks \"%s\"", err.msg, msg_part);
    assert_int_equal(v.kind, ZI_CHAT_NONE);
    assert_null(arena.blocks);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

static void pk_int_key(msgpack_packer *pk) {
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 1);
    pack_s(pk, "function");
    msgpack_pack_map(pk, 1);
    msgpack_pack_int(pk, 7);
    msgpack_pack_nil(pk);
}
static void pk_bin(msgpack_packer *pk) {
    msgpack_pack_array(pk, 2);
    msgpack_pack_nil(pk);
    msgpack_pack_bin(pk, 2);
    msgpack_pack_bin_body(pk, "ab", 2);
}
static void pk_ext(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1);
    pack_s(pk, "e");
    msgpack_pack_ext(pk, 1, 5);
    msgpack_pack_ext_body(pk, "x", 1);
}
static void pk_deep(msgpack_packer *pk) {
    for (int i = 0; i < ZI_CHAT_VARS_MAX_DEPTH; i++) msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
}
static void pk_deep_ok(msgpack_packer *pk) {
    for (int i = 0; i < ZI_CHAT_VARS_MAX_DEPTH - 1; i++) msgpack_pack_array(pk, 1);
    msgpack_pack_int(pk, 1);
}
static void pk_big_uint(msgpack_packer *pk) {
    msgpack_pack_array(pk, 1);
    msgpack_pack_uint64(pk, 9223372036854775808ull);
}
static void pk_bad_utf8(msgpack_packer *pk) {
    msgpack_pack_map(pk, 1);
    pack_s(pk, "k");
    msgpack_pack_str(pk, 2);
    msgpack_pack_str_body(pk, "a\x80", 2);
}

/* chat_vars.h: what the request's fields may not hold. */
static void test_vars_msgpack_refused(void **state) {
    (void)state;
    expect_msgpack_refused(pk_int_key, ZI_EINVAL,
                           "tools[0].function: map keys must be strings (key #0 is an integer)");
    expect_msgpack_refused(pk_bin, ZI_EINVAL, "tools[1]: binary data is not accepted");
    expect_msgpack_refused(pk_ext, ZI_EINVAL, "tools.e: extension types are not accepted");
    expect_msgpack_refused(pk_deep, ZI_EINVAL, "nested deeper than 16 levels");
    {
        /* 16 levels are fine */
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        pk_deep_ok(&pk);
        msgpack_unpacked u;
        zi_chat_arena arena = {0};
        zi_chat_value v;
        zi_error err = {0};
        assert_int_equal(zi_chat_value_from_msgpack(unpack(&sb, &u), "v", &arena, &v, &err), ZI_OK);
        assert_int_equal(v.kind, ZI_CHAT_LIST);
        zi_chat_arena_free(&arena);
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
    expect_msgpack_refused(pk_big_uint, ZI_EUNSUPPORTED,
                           "tools[0]: 9223372036854775808 does not fit in 64 bits");
    expect_msgpack_refused(pk_bad_utf8, ZI_EINVAL, "tools.k: not valid UTF-8 at byte 1");
}

/* zi_chat_vars_from_msgpack: which variables a request
 * makes, and what its chat_template_options may not hold. */
static int vars_from_json(const char *tools, const char *options, zi_chat_vars *cv, zi_error *err) {
    json_error_t je;
    json_t *tj = tools ? json_loads(tools, 0, &je) : NULL;
    json_t *oj = options ? json_loads(options, 0, &je) : NULL;
    if ((tools && !tj) || (options && !oj)) fail_msg("bad JSON: %s", je.text);
    zi_bytes tb = {0}, ob = {0};
    if (tj) json_to_bytes(tj, &tb);
    if (oj) json_to_bytes(oj, &ob);
    int rc = vars_from_bytes(&tb, &ob, cv, err);
    free(tb.p);
    free(ob.p);
    json_decref(tj);
    json_decref(oj);
    return rc;
}

static void expect_vars_json_error(const char *tools, const char *options, const char *msg) {
    zi_chat_vars cv;
    zi_error err = {0};
    int rc = vars_from_json(tools, options, &cv, &err);
    if (rc != ZI_EINVAL)
        fail_msg("%s / %s: want ZI_EINVAL, got %d (%s)", tools, options, rc, err.msg);
    if (strcmp(err.msg, msg) != 0) fail_msg("message \"%s\", want \"%s\"", err.msg, msg);
    assert_null(cv.v);
    assert_int_equal(cv.n, 0);
    zi_chat_vars_free(&cv);
}

static void test_vars_request(void **state) {
    (void)state;
    zi_chat_vars cv;
    zi_error err = {0};
    /* Nothing: no variables. */
    assert_int_equal(zi_chat_vars_from_msgpack(NULL, NULL, &cv, &err), ZI_OK);
    assert_int_equal(cv.n, 0);
    zi_chat_vars_free(&cv);
    assert_int_equal(vars_from_json("[]", "{}", &cv, &err), ZI_OK);
    assert_int_equal(cv.n, 0);
    zi_chat_vars_free(&cv);
    /* tools first, then the options in order; null stays None. */
    assert_int_equal(vars_from_json("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
                                    "{\"enable_thinking\": false, \"z\": null, \"a\": [1.5]}", &cv,
                                    &err),
                     ZI_OK);
    assert_int_equal(cv.n, 4);
    assert_memory_equal(cv.v[0].name, "tools", 5);
    assert_memory_equal(cv.v[1].name, "enable_thinking", 15);
    assert_int_equal(cv.v[1].value.kind, ZI_CHAT_BOOL);
    assert_int_equal(cv.v[2].value.kind, ZI_CHAT_NONE);
    assert_int_equal(cv.v[3].value.u.list.v[0].kind, ZI_CHAT_FLOAT);
    char *out;
    assert_int_equal(
        render_vars("{{ tools[0].function.name }} {{ enable_thinking }} {{ z }} {{ a }}", cv.v,
                    cv.n, &out, &err),
        ZI_OK);
    assert_string_equal(out, "f False None [1.5]");
    free(out);
    zi_chat_vars_free(&cv);
    zi_chat_vars_free(&cv);

    expect_vars_json_error(NULL, "{\"messages\": []}",
                           "chat_template_options.messages: a name the renderer sets itself");
    expect_vars_json_error(NULL, "{\"ok\": 1, \"bos_token\": \"<s>\"}",
                           "chat_template_options.bos_token: a name the renderer sets itself");
    expect_vars_json_error(NULL, "{\"range\": 1}",
                           "chat_template_options.range: a name the renderer sets itself");
    expect_vars_json_error("[]", "{\"tools\": []}",
                           "chat_template_options.tools: send tools in the request's tools field");
    expect_vars_json_error(NULL, "[1]", "chat_template_options: must be a map, not an array");
    expect_vars_json_error("{}", NULL, "tools: must be an array, not a map");
    /* (the tools' entries are the request decoder's to check: test_codec) */
    /* A failure after some variables were made frees them (ASan checks). */
    expect_vars_json_error("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
                           "{\"a\": \"x\", \"messages\": 1}",
                           "chat_template_options.messages: a name the renderer sets itself");

    /* What JSON cannot say: non-string keys, bad UTF-8 in a key, a key given
     * twice, options nested too deep (the map is level 1), bad bytes. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_int(&pk, 1);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_map(&pk, 1);
    msgpack_pack_str(&pk, 2);
    msgpack_pack_str_body(&pk, "\xc3(", 2);
    msgpack_pack_int(&pk, 2);
    msgpack_pack_map(&pk, 2);
    pack_s(&pk, "x");
    msgpack_pack_int(&pk, 1);
    pack_s(&pk, "x");
    msgpack_pack_int(&pk, 2);
    msgpack_pack_map(&pk, 1);
    pack_s(&pk, "deep");
    for (int i = 0; i < ZI_CHAT_VARS_MAX_DEPTH - 1; i++) msgpack_pack_array(&pk, 1);
    msgpack_pack_nil(&pk);
    msgpack_pack_map(&pk, 1); /* {"x": {"y": ["a", {"k": a surrogate}]}} */
    pack_s(&pk, "x");
    msgpack_pack_map(&pk, 1);
    pack_s(&pk, "y");
    msgpack_pack_array(&pk, 2);
    pack_s(&pk, "a");
    msgpack_pack_map(&pk, 1);
    pack_s(&pk, "k");
    pack_s(&pk, "\xed\xa0\x80");
    const char *want[] = {
        "chat_template_options: map keys must be strings (key #0 is an integer)",
        "chat_template_options key #0: not valid UTF-8 at byte 0",
        "chat_template_options.x: given twice",
        "chat_template_options.deep[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested deeper "
        "than 16 levels",
        "chat_template_options.x.y[1].k: not valid UTF-8 at byte 0",
    };
    msgpack_unpacker *up = msgpack_unpacker_new(64);
    msgpack_unpacker_reserve_buffer(up, sb.size);
    memcpy(msgpack_unpacker_buffer(up), sb.data, sb.size);
    msgpack_unpacker_buffer_consumed(up, sb.size);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(msgpack_unpacker_next(up, &u), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(zi_chat_vars_from_msgpack(NULL, &u.data, &cv, &err), ZI_EINVAL);
        assert_string_equal(err.msg, want[i]);
        assert_int_equal(cv.n, 0);
    }
    msgpack_unpacked_destroy(&u);
    msgpack_unpacker_free(up);
    msgpack_sbuffer_destroy(&sb);
    assert_int_equal(zi_chat_vars_from_msgpack(NULL, NULL, NULL, &err), ZI_EINVAL);
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
        cmocka_unit_test(test_fixture_vars),
        cmocka_unit_test(test_vars_render),
        cmocka_unit_test(test_vars_refused),
        cmocka_unit_test(test_vars_msgpack),
        cmocka_unit_test(test_vars_msgpack_refused),
        cmocka_unit_test(test_vars_request),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
