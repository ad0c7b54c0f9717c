/*
 * chat_template_fixture.h - what the two chat-template test binaries
 * share (test_chat_template.c: the language, errors and limits;
 * test_chat_vars.c: the extra variables tools and chat_template_options):
 * reading the committed fixture tests/fixtures/chat_templates/expected.json
 * (made with jinja2 by scripts/ref/make_chat_template_fixtures.py),
 * compiling and rendering a template given as a string, and checking one
 * fixture case byte for byte. A header of static functions: test code only,
 * included after <cmocka.h>; run the binaries from the repository root.
 */
#ifndef ZI_CHAT_TEMPLATE_FIXTURE_H
#define ZI_CHAT_TEMPLATE_FIXTURE_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chat_template.h"

#define FIXTURE_DIR "tests/fixtures/chat_templates/"
#define FIXTURE FIXTURE_DIR "expected.json"

/* The whole file at path, NUL-terminated, in *len bytes (malloc'd); NULL
 * when it cannot be opened. */
static inline char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    *len = 0;
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

/* The fixture's JSON (the caller json_decref's it); fails the test when
 * it cannot be read. */
static inline json_t *load_fixture(void) {
    json_error_t je;
    json_t *j = json_load_file(FIXTURE, JSON_ALLOW_NUL, &je);
    if (!j) fail_msg("cannot read %s: %s (run from the repository root)", FIXTURE, je.text);
    return j;
}

/* Messages of a fixture case; the strings stay owned by the JSON. */
static inline zi_chat_message *fixture_messages(json_t *arr, size_t *n) {
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

static inline int compile_str(const char *src, zi_chat_template **t, zi_error *err) {
    return zi_chat_template_compile(src, strlen(src), t, err);
}

/* Renders src with messages user "hi" / assistant "yo" and opts; returns
 * the status, *out (malloc'd) on success. */
static inline int render_str(const char *src, const zi_chat_render_opts *opts, char **out,
                             zi_error *err) {
    zi_chat_template *t = NULL;
    *out = NULL;
    int rc = compile_str(src, &t, err);
    if (rc) return rc;
    zi_chat_message m[2] = {{"user", "hi", 0, 0}, {"assistant", "yo", 0, 0}};
    rc = zi_chat_template_render(t, m, 2, opts, out, NULL, err);
    zi_chat_template_free(t);
    return rc;
}

/* Checks a fixture outcome, rendering with the extra variables
 * vars[0..n_vars); returns 1 when it matched. */
static inline int check_case_vars(const zi_chat_template *t, const char *label, json_t *c,
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

#endif
