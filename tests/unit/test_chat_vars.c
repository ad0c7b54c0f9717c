/*
 * test_chat_vars.c - cmocka tests for the extra variables a chat template
 * sees beside messages: tools and chat_template_options
 * (chat_template/chat_template.h's zi_chat_var, chat_template/chat_vars.h).
 *
 *  - the fixture's var_cases (tests/fixtures/chat_templates/expected.json,
 *    made with jinja2) rendered with trees built from the JSON and again
 *    with the same values packed as msgpack through chat_vars.h;
 *  - values of every kind, and the names, strings and nesting that a
 *    template's variables may not hold;
 *  - msgpack trees (zi_chat_value_from_msgpack) and what they refuse;
 *  - which variables a request makes (zi_chat_vars_from_msgpack) and the
 *    chat_template_options it refuses.
 * The language itself is test_chat_template.c; what both share is
 * chat_template_fixture.h. Run from the repository root.
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
#include "chat_template_fixture.h"
#include "chat_tools.h"
#include "chat_vars.h"
#include "codec.h"
#include "test_codec_util.h"

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

/* Every fixture case with tools and options, twice: with the variables as
 * trees built from the JSON, and as msgpack through chat_vars.h. */
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

/* A decoded request's tool-call messages reach the template as sent. */
static void test_request_messages(void **state) {
    (void)state;
    msgpack_sbuffer sb = sb_new();
    build(&sb,
          "M s s s A M s s s s  M s s s n s A M s s s s s M s s s M s s"
          "  M s s s s s s",
          2, "id", "t", "messages", 3, 2, "role", "user", "content", "Weather in Paris?", 3, "role",
          "assistant", "content", "tool_calls", 1, 3, "id", "call_1", "type", "function",
          "function", 2, "name", "get_weather", "arguments", 1, "city", "Paris", 3, "role", "tool",
          "tool_call_id", "call_1", "content", "21 C");
    zi_request r;
    zi_error err = {0};
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &err), ZI_OK);
    msgpack_sbuffer_destroy(&sb);
    zi_chat_arena a = {0};
    zi_chat_value mv;
    assert_int_equal(zi_chat_messages_from_request(&r, 1, &a, &mv, &err), ZI_OK);
    assert_int_equal(zi_chat_value_check(&mv, "messages", &err), ZI_OK);
    zi_chat_template *t;
    const char *src = "{% for m in messages %}{{ m.role }}|{{ m.content is none }}|{{ m.content }}|"
                      "{% if m.tool_calls %}{{ m.tool_calls | tojson }}"
                      "{{ m.tool_calls[0].function.arguments.city }}{% endif %}|"
                      "{{ m.tool_call_id }}|{{ m | length }}\n{% endfor %}";
    assert_int_equal(zi_chat_template_compile(src, strlen(src), &t, &err), ZI_OK);
    zi_chat_render_opts o = {.messages = &mv};
    char *out = NULL;
    assert_int_equal(zi_chat_template_render(t, NULL, 0, &o, &out, NULL, &err), ZI_OK);
    assert_string_equal(out, "user|False|Weather in Paris?|||2\n"
                             "assistant|True|None|[{\"id\": \"call_1\", \"type\": \"function\", "
                             "\"function\": {\"name\": \"get_weather\", \"arguments\": "
                             "{\"city\": \"Paris\"}}}]Paris||3\n"
                             "tool|False|21 C||call_1|3\n");
    free(out);
    /* msgs and opts.messages exclude each other; a message must have a role */
    zi_chat_message one = {"user", "x", 0, 0};
    assert_int_equal(zi_chat_template_render(t, &one, 1, &o, &out, NULL, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "both msgs and opts.messages"));
    zi_chat_value bad_items[] = {{.kind = ZI_CHAT_INT}};
    zi_chat_value bad = {.kind = ZI_CHAT_LIST, .u.list = {bad_items, 1}};
    o.messages = &bad;
    assert_int_equal(zi_chat_template_render(t, NULL, 0, &o, &out, NULL, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "chat template: messages[0]: not a dict with a string role");
    zi_chat_template_free(t);
    zi_chat_arena_free(&a);

    /* All of it as the tokenizer process renders a request. */
    msgpack_sbuffer tb = sb_new();
    build(&tb, "A M s s s M s s", 1, 2, "type", "function", "function", 1, "name", "get_weather");
    msgpack_unpacked tu;
    msgpack_unpacked_init(&tu);
    assert_int_equal(msgpack_unpack_next(&tu, tb.data, tb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    const char *src2 =
        "{{ bos_token }}{{ tools[0].function.name }}|{{ messages[1].tool_calls[0].id }}|"
        "{{ messages[1].content }}|{{ messages[2].tool_call_id }}|"
        "{{ add_generation_prompt }}|{{ enable_thinking is defined }}";
    assert_int_equal(zi_chat_template_compile(src2, strlen(src2), &t, &err), ZI_OK);
    size_t len = 0;
    assert_int_equal(
        zi_chat_render_request(t, 1, &r, &tu.data, NULL, "<s>", NULL, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "<s>get_weather|call_1|None|call_1|True|False");
    assert_int_equal(len, strlen(out));
    free(out);
    /* a refused option fails the render, nothing leaks (ASan) */
    msgpack_sbuffer ob = sb_new();
    build(&ob, "M s i", 1, "messages", 1ll);
    msgpack_unpacked ou;
    msgpack_unpacked_init(&ou);
    assert_int_equal(msgpack_unpack_next(&ou, ob.data, ob.size, NULL), MSGPACK_UNPACK_SUCCESS);
    out = (char *)1;
    assert_int_equal(
        zi_chat_render_request(t, 1, &r, &tu.data, &ou.data, "<s>", NULL, &out, &len, &err),
        ZI_EINVAL);
    assert_null(out);
    assert_string_equal(err.msg, "chat_template_options.messages: a name the renderer sets itself");
    msgpack_unpacked_destroy(&ou);
    msgpack_sbuffer_destroy(&ob);
    msgpack_unpacked_destroy(&tu);
    msgpack_sbuffer_destroy(&tb);
    zi_chat_template_free(t);
    zi_request_free(&r);
}

/* A template that does not render tools gets the Hermes text turns; the
 * probe tells the two kinds of template apart. */
static void test_tool_fallback(void **state) {
    (void)state;
    msgpack_sbuffer sb = sb_new();
    build(&sb,
          "M s s s A M s s s s  M s s s n s A M s s s s s M s s s M s s"
          "  M s s s s s s s s  M s s s s s A M s M s s s s",
          2, "id", "t", "messages", 4, 2, "role", "user", "content", "Weather in Paris?", 3, "role",
          "assistant", "content", "tool_calls", 1, 3, "id", "call_1", "type", "function",
          "function", 2, "name", "get_weather", "arguments", 1, "city", "Paris", 4, "role", "tool",
          "tool_call_id", "call_1", "content", "21 C", "name", "get_weather", 3, "role",
          "assistant", "content", "Let me look.", "tool_calls", 1, 1, "function", 2, "name", "f",
          "arguments", "{\"a\": [1, \"\\u00e9\\n\"]}");
    zi_request r;
    zi_error err = {0};
    assert_int_equal(zi_codec_request_from_bytes(sb.data, sb.size, NULL, &r, &err), ZI_OK);
    msgpack_sbuffer_destroy(&sb);
    zi_chat_template *t;
    const char *src = "{% for m in messages %}{{ m.role }}|{{ m.content }}|{{ m | length }}\n"
                      "{% endfor %}";
    assert_int_equal(zi_chat_template_compile(src, strlen(src), &t, &err), ZI_OK);
    char *out = NULL;
    assert_int_equal(zi_chat_render_request(t, 0, &r, NULL, NULL, NULL, NULL, &out, NULL, &err),
                     ZI_OK);
    assert_string_equal(out,
                        "user|Weather in Paris?|2\n"
                        "assistant|<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\"}}\n</tool_call>|2\n"
                        "user|<tool_response>\n21 C\n</tool_response>|2\n"
                        "assistant|Let me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": "
                        "{\"a\": [1, \"\\u00e9\\n\"]}}\n</tool_call>|2\n");
    free(out);
    /* natively, the tool message keeps its name */
    assert_int_equal(zi_chat_render_request(t, 1, &r, NULL, NULL, NULL, NULL, &out, NULL, &err),
                     ZI_OK);
    assert_non_null(strstr(out, "tool|21 C|4\n"));
    assert_non_null(strstr(out, "assistant|None|3\n"));
    free(out);
    assert_int_equal(zi_chat_render_request(t, ZI_CHAT_TOOLS_NATIVE | ZI_CHAT_TOOLS_EMPTY_CONTENT,
                                            &r, NULL, NULL, NULL, NULL, &out, NULL, &err),
                     ZI_OK);
    assert_non_null(strstr(out, "assistant||3\n"));
    free(out);
    assert_int_equal(zi_chat_tools_native(t, NULL, NULL), 0); /* shows neither marker */
    zi_chat_template_free(t);
    static const struct {
        const char *src;
        int native;
    } probes[] = {
        {"{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls[0].function.arguments | "
         "tojson }}{% endif %}{% if m.role == 'tool' %}{{ m.content }}{% endif %}{% endfor %}",
         1},
        /* calls but no results, results but no calls */
        {"{% for m in messages %}{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}"
         "{% endfor %}",
         0},
        {"{% for m in messages %}{{ m.content }}{% endfor %}", 0},
        /* one that fails on a None content gets "" (Qwen 3's '</think>' in content) */
        {"{% for m in messages %}{{ m.content + '|' }}{% if m.tool_calls %}{{ m.tool_calls[0]."
         "function.arguments | tojson }}{% endif %}{% endfor %}",
         ZI_CHAT_TOOLS_NATIVE | ZI_CHAT_TOOLS_EMPTY_CONTENT},
        /* a template that refuses the tool role */
        {"{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
         "{% endif %}{{ m.tool_calls | tojson }}{{ m.content }}{% endfor %}",
         0},
    };
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        assert_int_equal(zi_chat_template_compile(probes[i].src, strlen(probes[i].src), &t, &err),
                         ZI_OK);
        assert_int_equal(zi_chat_tools_native(t, "<s>", "</s>"), probes[i].native);
        zi_chat_template_free(t);
    }
    zi_request_free(&r);
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
    /* (the tools' entries are the request decoder's to check: test_codec_malformed) */
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
        ("chat_template_options.deep[0][0][0][0][0][0][0][0][0][0][0][0][0][0][0]: nested deeper "
         "than 16 levels"),
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
        cmocka_unit_test(test_fixture_vars),         cmocka_unit_test(test_vars_render),
        cmocka_unit_test(test_vars_refused),         cmocka_unit_test(test_vars_msgpack),
        cmocka_unit_test(test_vars_msgpack_refused), cmocka_unit_test(test_vars_request),
        cmocka_unit_test(test_request_messages),     cmocka_unit_test(test_tool_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
