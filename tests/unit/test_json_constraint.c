/*
 * test_json_constraint.c - cmocka tests for model_worker/json_constraint.h
 * (structured output, response_format json_object):
 *  - the automaton accepts JSON objects (RFC 8259: nesting, escapes,
 *    numbers, literals, UTF-8, whitespace) and refuses what is not one
 *    (another top-level value, bad syntax, leading zeros, trailing bytes,
 *    control bytes and invalid UTF-8 in strings), with its limits;
 *  - with the default model's vocabulary (skipped when absent): at states
 *    along a JSON text, the allowed mask is exactly the set of tokens whose
 *    bytes the automaton takes (checked token by token), control tokens are
 *    never allowed, and a closed object allows only the end-of-sequence ids.
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

#include "gguf.h"
#include "json_constraint.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* Feeds the whole text: 1 when taken and complete, 0 when taken but not
 * complete, -1 when refused. */
static int run(const char *text, size_t n) {
    zi_json_state s;
    zi_json_state_init(&s, NULL);
    if (!zi_json_feed(&s, (const uint8_t *)text, n)) return -1;
    return zi_json_complete(&s) ? 1 : 0;
}
#define RUN(lit) run(lit, sizeof(lit) - 1)

static void test_accepts_objects(void **state) {
    (void)state;
    assert_int_equal(RUN("{}"), 1);
    assert_int_equal(RUN(" \n\t{ }"), 1);
    assert_int_equal(RUN("{\"a\": 1}"), 1);
    assert_int_equal(RUN("{\"a\":[1,2.5e-3,-0,0.5,1E+9,-12.75e2,true,false,null,{\"b\":\"x\"}]}"),
                     1);
    assert_int_equal(RUN("{\"s\": \"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u00e9\\uD83D\\ude00\"}"), 1);
    assert_int_equal(RUN("{\"caf\xc3\xa9\": \"\xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf\"}"), 1);
    assert_int_equal(RUN("{\n  \"list\": [\n    [],\n    {}\n  ],\n  \"n\": 0\n}"), 1);
    /* prefixes are taken but are not complete */
    assert_int_equal(RUN("{\"a\": [1, {\"b\": tr"), 0);
    assert_int_equal(RUN("{\"a\": 12"), 0);
    assert_int_equal(RUN("{\"a\": \"\xe2\x82"), 0);
}

static void test_refuses_non_objects(void **state) {
    (void)state;
    const char *bad[] = {
        "[]",
        "\"s\"",
        "1",
        "true",
        "{a:1}",
        "{\"a\" 1}",
        "{\"a\":}",
        "{\"a\":01}",
        "{\"a\":1,}",
        "{,}",
        "{\"a\":1}}",
        "{\"a\":1} ",
        "{\"a\":1}x",
        "{\"a\":trux}",
        "{\"a\":.5}",
        "{\"a\":1.}",
        "{\"a\":1e}",
        "{\"a\":-}",
        "{\"a\":+1}",
        "{\"a\":[1,]}",
        "{\"a\":[,1]}",
        "{\"a\":\"\\x\"}",
        "{\"a\":\"\\u12g4\"}",
        "{\"a\":'x'}",
        "{\"a\" : NaN}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (run(bad[i], strlen(bad[i])) != -1) fail_msg("taken: %s", bad[i]);
    }
    /* control bytes and invalid UTF-8 inside strings */
    assert_int_equal(RUN("{\"a\":\"\x01\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\n\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\xc0\xaf\"}"), -1);         /* overlong */
    assert_int_equal(RUN("{\"a\":\"\xed\xa0\x80\"}"), -1);     /* surrogate */
    assert_int_equal(RUN("{\"a\":\"\xf4\x90\x80\x80\"}"), -1); /* past U+10FFFF */
    assert_int_equal(RUN("{\"a\":\"\x80\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\xe2\x82\"}"), -1); /* cut character */
    /* surrogate escapes come in pairs */
    assert_int_equal(RUN("{\"a\":\"\\ud800\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\\udc00\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\\ud800\\n\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\\ud800\\u0041\"}"), -1);
    assert_int_equal(RUN("{\"a\":\"\\uDBFF\\uDFFF\"}"), 1);
    assert_int_equal(RUN("{\"a\":\"\\uD83D\\uF"), -1); /* a low half starts with d */
}

static void test_limits(void **state) {
    (void)state;
    char buf[256];
    /* nesting: ZI_JSON_MAX_DEPTH containers, not one more */
    size_t n = 0;
    buf[n++] = '{', buf[n++] = '"', buf[n++] = 'a', buf[n++] = '"', buf[n++] = ':';
    for (int i = 1; i < ZI_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    for (int i = 1; i < ZI_JSON_MAX_DEPTH; i++) buf[n++] = ']';
    buf[n++] = '}';
    assert_int_equal(run(buf, n), 1);
    n = 0;
    buf[n++] = '{', buf[n++] = '"', buf[n++] = 'a', buf[n++] = '"', buf[n++] = ':';
    for (int i = 0; i < ZI_JSON_MAX_DEPTH; i++) buf[n++] = '[';
    assert_int_equal(run(buf, n), -1);
    /* whitespace runs */
    n = 0;
    buf[n++] = '{';
    for (int i = 0; i < ZI_JSON_MAX_WS; i++) buf[n++] = ' ';
    buf[n++] = '}';
    assert_int_equal(run(buf, n), 1);
    n = 0;
    buf[n++] = '{';
    for (int i = 0; i <= ZI_JSON_MAX_WS; i++) buf[n++] = ' ';
    assert_int_equal(run(buf, n), -1);
    /* number length */
    n = 0;
    memcpy(buf, "{\"a\":", 5), n = 5;
    for (int i = 0; i < ZI_JSON_MAX_NUMBER; i++) buf[n++] = '7';
    buf[n++] = '}';
    assert_int_equal(run(buf, n), 1);
    n = 5;
    for (int i = 0; i <= ZI_JSON_MAX_NUMBER; i++) buf[n++] = '7';
    assert_int_equal(run(buf, n), -1);
    /* '.', 'e' and an exponent sign need room for a digit after them: a
     * prefix the automaton takes can always be finished */
    const char *tails[] = {".", "e", "E", "e+"};
    for (size_t t = 0; t < 4; t++) {
        size_t room = ZI_JSON_MAX_NUMBER - strlen(tails[t]); /* digits, tail, one digit */
        n = 5;
        for (size_t i = 0; i < room; i++) buf[n++] = '7';
        memcpy(buf + n, tails[t], strlen(tails[t])), n += strlen(tails[t]);
        assert_int_equal(run(buf, n), -1);
        n = 5;
        for (size_t i = 0; i + 1 < room; i++) buf[n++] = '7';
        memcpy(buf + n, tails[t], strlen(tails[t])), n += strlen(tails[t]);
        buf[n++] = '1', buf[n++] = '}';
        assert_int_equal(run(buf, n), 1);
    }
}

/* ---- schemas ------------------------------------------------------------ */

static const char PERSON[] =
    "{\"type\": \"object\", \"title\": \"person\", \"properties\": {"
    "\"name\": {\"type\": \"string\", \"description\": \"given name\"},"
    "\"age\": {\"type\": \"integer\"},"
    "\"score\": {\"type\": \"number\"},"
    "\"color\": {\"enum\": [\"red\", \"green\", 7, null]},"
    "\"ok\": {\"type\": \"boolean\"}, \"none\": {\"type\": \"null\"},"
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}},"
    "\"pet\": {\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"cat\"}},"
    "          \"required\": [\"kind\"]},"
    "\"any\": {}},"
    "\"required\": [\"name\", \"age\", \"id\"]}";

/* Like run(), under a compiled schema. */
static int run_schema(const zi_json_schema *sc, const char *text) {
    zi_json_state s;
    zi_json_state_init(&s, sc);
    if (!zi_json_feed(&s, (const uint8_t *)text, strlen(text))) return -1;
    return zi_json_complete(&s) ? 1 : 0;
}

static zi_json_schema *compile_ok(const char *text) {
    zi_json_schema *sc = NULL;
    zi_error err = {0};
    if (zi_json_schema_compile(text, strlen(text), &sc, &err)) fail_msg("compile: %s", err.msg);
    return sc;
}

static void test_schema_holds(void **state) {
    (void)state;
    zi_json_schema *sc = compile_ok(PERSON);
    const char *good[] = {
        "{\"name\": \"Al\", \"age\": 3, \"id\": 1}",
        "{\"id\": [1, {\"x\": null}], \"age\": -12, \"name\": \"\"}", /* any order; id: any */
        "{\"name\": \"A\", \"age\": 0, \"id\": \"z\", \"score\": -1.5e3, \"color\": \"green\","
        " \"ok\": false, \"none\": null, \"tags\": [\"a\", \"b\"], \"pet\": {\"kind\": \"cat\"},"
        " \"any\": {\"deep\": [true]}}",
        "{\"name\": \"A\", \"age\": 1, \"id\": 0, \"color\": 7, \"tags\": []}",
        "{\"name\": \"A\", \"age\": 1, \"id\": 0, \"color\": null}",
    };
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        if (run_schema(sc, good[i]) != 1) fail_msg("refused: %s", good[i]);
    const char *bad[] = {
        "{\"name\": \"Al\", \"age\": 3}",                          /* required id missing */
        "{\"name\": \"Al\", \"age\": 3, \"id\": 1, \"extra\": 1}", /* unknown key */
        "{\"name\": \"Al\", \"name\": \"B\"}",                     /* a key twice */
        "{\"age\": \"3\"}",                                        /* integer as a string */
        "{\"age\": 3.5}",                                          /* not an integer */
        "{\"age\": 3e2}",                                          /* not an integer */
        "{\"name\": 5}",                                           /* not a string */
        "{\"color\": \"blue\"}",                                   /* not in the enum */
        "{\"color\": \"re\"}",                                     /* a prefix of one */
        "{\"color\": 77}",                                         /* 7 and more */
        "{\"ok\": null}",                                          /* not a boolean */
        "{\"tags\": [\"a\", 1]}",                                  /* item not a string */
        "{\"pet\": {}}",                                           /* pet.kind required */
        "{\"pet\": {\"kind\": \"dog\"}}",                          /* const */
        "[]",                                                      /* not an object */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (run_schema(sc, bad[i]) != -1) fail_msg("taken: %s", bad[i]);
    zi_json_schema_free(sc);
    /* additionalProperties false and no properties: only {} */
    sc = compile_ok("{\"type\": \"object\", \"additionalProperties\": false}");
    assert_int_equal(run_schema(sc, "{ }"), 1);
    assert_int_equal(run_schema(sc, "{\"a\": 1}"), -1);
    zi_json_schema_free(sc);
    /* type beside enum/const: only the values of that type */
    sc = compile_ok("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", "
                    "\"enum\": [\"x\", 1]}}}");
    assert_int_equal(run_schema(sc, "{\"a\": \"x\"}"), 1);
    assert_int_equal(run_schema(sc, "{\"a\": 1}"), -1);
    zi_json_schema_free(sc);
    /* additionalProperties {} (annotations only) is true; required alone infers an object */
    sc =
        compile_ok("{\"additionalProperties\": {\"description\": \"any\"}, \"required\": [\"k\"]}");
    assert_int_equal(run_schema(sc, "{\"k\": [true]}"), 1);
    zi_json_schema_free(sc);
    /* 16 nested objects with a scalar leaf; 63 properties + one required twice */
    char deep[512] = "";
    for (int i = 0; i < 15; i++) strcat(deep, "{\"properties\": {\"a\": ");
    strcat(deep, "{\"properties\": {\"a\": {\"type\": \"integer\"}}}");
    for (int i = 0; i < 15; i++) strcat(deep, "}}");
    sc = compile_ok(deep);
    zi_json_schema_free(sc);
    char wide[4096] = "{\"properties\": {";
    for (int i = 0; i < 63; i++) sprintf(wide + strlen(wide), "%s\"p%d\": {}", i ? ", " : "", i);
    strcat(wide, "}, \"required\": [\"x\", \"x\"]}");
    sc = compile_ok(wide);
    zi_json_schema_free(sc);
    /* a name required twice, with no schema of its own: one property */
    sc = compile_ok("{\"type\": \"object\", \"required\": [\"x\", \"x\"]}");
    assert_int_equal(run_schema(sc, "{\"x\": [1]}"), 1);
    assert_int_equal(run_schema(sc, "{\"x\": 1, \"\": 2}"), -1);
    assert_int_equal(run_schema(sc, "{}"), -1);
    zi_json_schema_free(sc);
    /* {"type": "object"} alone: any object, as with no schema */
    sc = compile_ok("{\"type\": \"object\"}");
    assert_int_equal(run_schema(sc, "{\"a\": [1, {\"b\": null}]}"), 1);
    zi_json_schema_free(sc);
}

static void test_schema_refused(void **state) {
    (void)state;
    static const struct {
        const char *schema;
        int code;
        const char *msg;
    } cases[] = {
        {"{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\", \"pattern\": "
         "\"a\"}}}",
         ZI_EUNSUPPORTED, "response_format.json_schema.properties.x: keyword 'pattern'"},
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\", \"minimum\": 0}}}",
         ZI_EUNSUPPORTED, "keyword 'minimum'"},
        {"{\"anyOf\": [{\"type\": \"object\"}]}", ZI_EUNSUPPORTED, "keyword 'anyOf'"},
        {"{\"type\": [\"object\", \"null\"]}", ZI_EUNSUPPORTED, "one type name"},
        {"{\"type\": \"array\"}", ZI_EUNSUPPORTED, "top level must be an object"},
        {"{\"type\": \"thing\"}", ZI_EINVAL, "unknown type"},
        {"{\"type\": \"object\", \"properties\": {\"e\": {\"enum\": [{\"a\": 1}]}}}",
         ZI_EUNSUPPORTED, "enum/const"},
        {"{\"type\": \"object\", \"properties\": {\"e\": {\"enum\": [\"a\\\"b\"]}}}",
         ZI_EUNSUPPORTED, "without escapes"},
        {"{\"type\": \"object\", \"properties\": {\"e\": {\"enum\": []}}}", ZI_EUNSUPPORTED,
         "1 to 64 values"},
        {"{\"type\": \"object\", \"properties\": {\"a\\\"b\": {}}}", ZI_EUNSUPPORTED,
         "names with quotes"},
        {"{\"type\": \"object\", \"properties\": {\"t\": {\"type\": \"array\", \"items\": [{}]}}}",
         ZI_EUNSUPPORTED, "items: one schema"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"properties\": "
         "{}}}}",
         ZI_EUNSUPPORTED, "beside a type other than object"},
        {"{\"type\": \"object\"", ZI_EINVAL, "not JSON"},
        {"[1]", ZI_EINVAL, "must be an object"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"const\": 5}}}",
         ZI_EINVAL, "no value has the schema's type"},
        {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}",
         ZI_EUNSUPPORTED, "only true, false or {}"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"], "
         "\"additionalProperties\": false}",
         ZI_EINVAL, "no object can satisfy it"},
        {"{\"type\": \"object\", \"properties\": {\"a\": true}}", ZI_EUNSUPPORTED,
         "boolean schemas"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zi_json_schema *sc = NULL;
        zi_error err = {0};
        int rc = zi_json_schema_compile(cases[i].schema, strlen(cases[i].schema), &sc, &err);
        if (rc != cases[i].code || !strstr(err.msg, cases[i].msg) ||
            strncmp(err.msg, "response_format.json_schema", 27) != 0)
            fail_msg("%s: rc %d, '%s'", cases[i].schema, rc, err.msg);
        assert_null(sc);
    }
    /* 65 distinct names required, then 40,000 more (and one repeated at the
     * end): refused for the count, the rest only checked in passing; and
     * 64 names, each required 500 times, are 64 properties. */
    enum { MANY = 40000 };
    char *big = malloc(16 * (MANY + 100) + 64);
    strcpy(big, "{\"type\": \"object\", \"required\": [");
    for (int i = 0; i < MANY + 65; i++) sprintf(big + strlen(big), "\"n%d\", ", i);
    strcat(big, "\"n0\"]}");
    zi_json_schema *sc = NULL;
    zi_error err = {0};
    assert_int_equal(zi_json_schema_compile(big, strlen(big), &sc, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "more than 64 properties"));
    strcpy(big, "{\"type\": \"object\", \"required\": [");
    for (int i = 0; i < 64 * 500; i++)
        sprintf(big + strlen(big), "%s\"n%d\"", i ? ", " : "", i % 64);
    strcat(big, "]}");
    assert_int_equal(zi_json_schema_compile(big, strlen(big), &sc, &err), ZI_OK);
    assert_int_equal(run_schema(sc, "{\"n3\": 1}"), -1); /* all 64 are required */
    zi_json_schema_free(sc);
    free(big);
}

/* ---- with the model's vocabulary ---------------------------------------- */

typedef struct vocab_fixture {
    zi_gguf *g;
    zi_tokenizer *tok;
    zi_json_vocab *v;
} vocab_fixture;

static int setup_vocab(void **state) {
    static vocab_fixture f;
    memset(&f, 0, sizeof f);
    const char *path = getenv("ZINFER_MODEL") ? getenv("ZINFER_MODEL") : DEFAULT_MODEL;
    zi_error err = {0};
    if (zi_gguf_open(path, &f.g, &err) == ZI_OK && zi_tokenizer_load(f.g, &f.tok, &err) == ZI_OK)
        assert_int_equal(zi_json_vocab_create(f.tok, &f.v, &err), ZI_OK);
    *state = &f;
    return 0;
}

static int teardown_vocab(void **state) {
    vocab_fixture *f = *state;
    zi_json_vocab_free(f->v);
    zi_tokenizer_free(f->tok);
    zi_gguf_close(f->g);
    return 0;
}

/* At every byte prefix of text (valid under sc), the mask equals the
 * tokens the automaton takes, one by one. */
static void mask_is_exact(vocab_fixture *f, const zi_json_schema *sc, const char *text) {
    int32_t V = zi_tokenizer_vocab_size(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask);
    int32_t eos = zi_tokenizer_eos(f->tok);
    char buf[ZI_TOKEN_MAX_BYTES + 16];
    size_t len = strlen(text);
    long allowed_total = 0;
    zi_json_state s;
    zi_json_state_init(&s, sc);
    for (size_t i = 0; i <= len; i++) {
        zi_json_allowed(f->v, &s, &eos, 1, mask);
        for (int32_t id = 0; id < V; id++) {
            int bit = (int)((uint32_t)mask[id >> 5] >> (id & 31) & 1u);
            int want;
            if (zi_tokenizer_token_type(f->tok, id) == ZI_TOKEN_CONTROL) {
                want = id == eos && zi_json_complete(&s);
            } else {
                int nb = zi_tokenizer_token_bytes(f->tok, id, 0, buf, sizeof buf);
                zi_json_state t = s, u = s;
                want = nb > 0 && zi_json_feed(&t, (const uint8_t *)buf, (size_t)nb);
                assert_int_equal(zi_json_feed_token(f->v, &u, id), want);
            }
            if (bit != want)
                fail_msg("prefix %zu, token %d: mask %d, automaton %d", i, id, bit, want);
            allowed_total += bit;
        }
        if (i < len && !zi_json_feed(&s, (const uint8_t *)text + i, 1))
            fail_msg("byte %zu of %s refused", i, text);
    }
    assert_true(zi_json_complete(&s));
    assert_true(allowed_total > 0);
    free(mask);
}

static void test_mask_is_exact(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    mask_is_exact(
        f, NULL,
        "{\"name\": \"Caf\xc3\xa9 \\\"x\\\" \\ud83d\\ude00\", \"n\": [-1.5e3, 0, true, null],\n"
        "  \"o\": {\"k\": \"\xe2\x82\xac\"}}");
    zi_json_schema *sc = compile_ok(PERSON);
    mask_is_exact(f, sc,
                  "{\"age\": 41, \"name\": \"Bo\", \"color\": 7, \"tags\": [\"x\"],"
                  " \"pet\": {\"kind\": \"cat\"}, \"id\": {\"k\": [1]}}");
    zi_json_schema_free(sc);
}

/* Random walks over the allowed tokens never reach a state that allows
 * nothing: every prefix the mask lets through can be finished. */
static void test_no_dead_ends(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    int32_t V = zi_tokenizer_vocab_size(f->tok), eos = zi_tokenizer_eos(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask), *ids = malloc((size_t)V * sizeof *ids);
    uint64_t rng = 0x853c49e6748fea9bull;
    long steps = 0, finished = 0;
    zi_json_schema *sc = compile_ok(PERSON);
    for (int walk = 0; walk < 300; walk++) {
        zi_json_state s;
        zi_json_state_init(&s, walk % 2 ? sc : NULL); /* half under the schema */
        for (int step = 0; step < 80 && !zi_json_complete(&s); step++, steps++) {
            zi_json_allowed(f->v, &s, &eos, 1, mask);
            size_t n = 0;
            for (int32_t id = 0; id < V; id++)
                if ((uint32_t)mask[id >> 5] >> (id & 31) & 1u) ids[n++] = id;
            if (n == 0) fail_msg("walk %d step %d: no token allowed", walk, step);
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            /* mostly short tokens (structure), sometimes any */
            int32_t pick = ids[rng % n];
            if (rng >> 60 < 12) {
                char buf[ZI_TOKEN_MAX_BYTES + 16];
                for (int tries = 0; tries < 8; tries++) {
                    int32_t c = ids[(rng >> 8 ^ (uint64_t)tries * 2654435761u) % n];
                    if (zi_tokenizer_token_bytes(f->tok, c, 0, buf, sizeof buf) <= 2) {
                        pick = c;
                        break;
                    }
                }
            }
            assert_true(zi_json_feed_token(f->v, &s, pick));
        }
        finished += zi_json_complete(&s);
    }
    assert_true(steps > 10000);
    print_message("%ld steps, %ld of 300 walks closed their object\n", steps, finished);
    zi_json_schema_free(sc);
    free(mask);
    free(ids);
}

static void test_closed_object_allows_only_eos(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    int32_t V = zi_tokenizer_vocab_size(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask);
    zi_json_state s;
    zi_json_state_init(&s, NULL);
    assert_true(zi_json_feed(&s, (const uint8_t *)"{}", 2));
    int32_t eos[2] = {zi_tokenizer_eos(f->tok), V + 5 /* outside: ignored */};
    zi_json_allowed(f->v, &s, eos, 2, mask);
    for (int32_t id = 0; id < V; id++)
        assert_int_equal((uint32_t)mask[id >> 5] >> (id & 31) & 1u, id == eos[0]);
    /* at the start, a token of plain text is not allowed, "{" is */
    zi_json_state_init(&s, NULL);
    zi_json_allowed(f->v, &s, eos, 1, mask);
    zi_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(zi_tokenizer_encode(f->tok, "{", 1, 0, 0, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, 1);
    assert_true((uint32_t)mask[ids[0] >> 5] >> (ids[0] & 31) & 1u);
    free(ids);
    assert_int_equal(zi_tokenizer_encode(f->tok, "Hello", 5, 0, 0, &ids, &n, &err), ZI_OK);
    assert_false((uint32_t)mask[ids[0] >> 5] >> (ids[0] & 31) & 1u);
    assert_false(zi_json_feed_token(f->v, &s, ids[0]));
    free(ids);
    free(mask);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts_objects),
        cmocka_unit_test(test_refuses_non_objects),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_schema_holds),
        cmocka_unit_test(test_schema_refused),
        cmocka_unit_test(test_mask_is_exact),
        cmocka_unit_test(test_no_dead_ends),
        cmocka_unit_test(test_closed_object_allows_only_eos),
    };
    return cmocka_run_group_tests(tests, setup_vocab, teardown_vocab);
}
