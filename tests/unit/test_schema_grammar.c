/*
 * test_schema_grammar.c - cmocka tests for JSON Schema compiled to
 * grammars (structured/schema_grammar.h), regular expressions
 * (structured/regex_grammar.h) and the worker's grammar cache
 * (structured/grammar_cache.h):
 *  - ~25 schemas of the shapes pydantic and zod export, each with JSON
 *    texts that must be accepted (fed byte by byte, then able to end) and
 *    texts that must be refused;
 *  - refusals: unsupported keywords name the keyword and the JSON pointer;
 *  - regular expressions against texts, as Python's re.fullmatch decides;
 *  - the cache: a schema sent again is a hit, not a compilation;
 *  - with the default model's vocabulary (skipped when absent), the time
 *    of the token mask for a realistic schema.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "gguf.h"
#include "grammar.h"
#include "grammar_cache.h"
#include "grammar_expect.h"
#include "vocab_trie.h"
#include "regex_grammar.h"
#include "schema_grammar.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static zi_grammar *compile_schema(const char *schema) {
    zi_gbnf_buf b = {0};
    zi_error err = {0};
    int rc = zi_schema_to_gbnf(schema, strlen(schema), &b, &err);
    if (rc) fprintf(stderr, "schema: %s\n", err.msg);
    assert_int_equal(rc, ZI_OK);
    zi_grammar *g = NULL;
    rc = zi_grammar_compile(b.p, b.n, &g, &err);
    if (rc) fprintf(stderr, "grammar: %s\n%s\n", err.msg, b.p);
    assert_int_equal(rc, ZI_OK);
    free(b.p);
    return g;
}

/* Whether the whole text is a sentence, fed one byte at a time. */
static bool takes(const zi_grammar *g, const char *text) {
    zi_grammar_state *s = NULL;
    assert_int_equal(zi_grammar_state_create(g, &s, NULL), ZI_OK);
    bool ok = true;
    for (size_t i = 0; ok && text[i]; i++) ok = feed_bytes(s, text + i, 1);
    ok = ok && zi_grammar_can_end(s);
    zi_grammar_state_free(s);
    return ok;
}

typedef struct {
    const char *schema;
    const char *yes[6];
    const char *no[6];
} scase;

static const scase CASES[] = {
    /* 1. pydantic: a model with an optional field (anyOf with null) */
    {"{\"properties\":{\"name\":{\"title\":\"Name\",\"type\":\"string\"},\"age\":{\"anyOf\":[{"
     "\"type\":\"integer\"},{\"type\":\"null\"}],\"default\":null,\"title\":\"Age\"}},"
     "\"required\":[\"name\"],\"title\":\"User\",\"type\":\"object\"}",
     {"{\"name\":\"Ann\"}", "{\"name\":\"Ann\",\"age\":31}", "{ \"name\": \"A\", \"age\": null }",
      "{\n  \"name\": \"x\",\n  \"age\": -2\n}"},
     {"{}", "{\"age\":3}", "{\"name\":\"A\",\"age\":\"3\"}", "{\"age\":3,\"name\":\"A\"}",
      "{\"name\":\"A\",\"x\":1}", "{\"name\":\"A\"} "}},
    /* 2. nested model via $ref into $defs */
    {"{\"$defs\":{\"Address\":{\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":"
     "\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"city\",\"zip\"],\"type\":\"object\"}}"
     ","
     "\"properties\":{\"home\":{\"$ref\":\"#/$defs/Address\"},\"work\":{\"anyOf\":[{\"$ref\":\"#/"
     "$defs/"
     "Address\"},{\"type\":\"null\"}]}},\"required\":[\"home\",\"work\"],\"type\":\"object\"}",
     {"{\"home\":{\"city\":\"Oslo\",\"zip\":\"01234\"},\"work\":null}",
      "{\"home\":{\"city\":\"\",\"zip\":\"99999\"},\"work\":{\"city\":\"B\",\"zip\":\"12345\"}}"},
     {"{\"home\":{\"city\":\"Oslo\",\"zip\":\"1234\"},\"work\":null}",
      "{\"home\":{\"city\":\"Oslo\"},\"work\":null}", "{\"home\":null,\"work\":null}"}},
    /* 3. a string enum (pydantic Enum via $ref) */
    {"{\"$defs\":{\"Color\":{\"enum\":[\"red\",\"green\",\"blue\"],\"title\":\"Color\",\"type\":"
     "\"string\"}},\"properties\":{\"c\":{\"$ref\":\"#/$defs/Color\"}},\"required\":[\"c\"],"
     "\"type\":\"object\"}",
     {"{\"c\":\"red\"}", "{\"c\":\"blue\"}"},
     {"{\"c\":\"Red\"}", "{\"c\":\"re\"}", "{\"c\":\"redd\"}"}},
    /* 4. a list with bounds */
    {"{\"type\":\"object\",\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"string\"},\"minItems\":1,\"maxItems\":3}},\"required\":[\"tags\"]}",
     {"{\"tags\":[\"a\"]}", "{\"tags\":[\"a\", \"b\",\"c\"]}"},
     {"{\"tags\":[]}", "{\"tags\":[\"a\",\"b\",\"c\",\"d\"]}", "{\"tags\":[1]}"}},
    /* 5. integer bounds */
    {"{\"type\":\"integer\",\"minimum\":-5,\"maximum\":120}",
     {"-5", "0", "7", "99", "120", "-1"},
     {"-6", "121", "1000", "007", "1.5", "-0"}},
    /* 6. exclusive integer bounds */
    {"{\"type\":\"integer\",\"exclusiveMinimum\":0,\"exclusiveMaximum\":1000}",
     {"1", "999", "500"},
     {"0", "1000", "-3"}},
    /* 7. number bounds */
    {"{\"type\":\"number\",\"minimum\":0,\"maximum\":1}",
     {"0", "1", "0.5", "0.999", "0.25"},
     {"1.5", "-0.1", "2", "1.01", "1e3"}},
    /* 8. negative number range */
    {"{\"type\":\"number\",\"minimum\":-10.5,\"exclusiveMaximum\":-2}",
     {"-10", "-3", "-2.5", "-9.75"},
     {"-2", "-1.5", "0", "-11", "-10.6"}},
    /* 9. formats */
    {"{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"t\":{"
     "\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":\"string\",\"format\":"
     "\"uuid\"}},\"required\":[\"d\",\"t\",\"u\"]}",
     {"{\"d\":\"2024-02-29\",\"t\":\"2024-01-01T12:30:00Z\",\"u\":\"123e4567-e89b-12d3-a456-"
      "426614174000\"}",
      "{\"d\":\"1999-12-31\",\"t\":\"2024-01-01T23:59:59.123+02:00\",\"u\":\"00000000-0000-0000-"
      "0000-000000000000\"}"},
     {"{\"d\":\"2024-13-01\",\"t\":\"2024-01-01T12:30:00Z\",\"u\":\"123e4567-e89b-12d3-a456-"
      "426614174000\"}",
      "{\"d\":\"2024-01-01\",\"t\":\"2024-01-01 12:30:00Z\",\"u\":\"123e4567-e89b-12d3-a456-"
      "426614174000\"}"}},
    /* 10. email and ipv4 */
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\",\"format\":\"email\"},{\"type\":"
     "\"string\",\"format\":\"ipv4\"}],\"items\":false}",
     {"[\"a.b@example.com\",\"192.168.0.1\"]", "[\"x@y.io\", \"255.255.255.255\"]"},
     {"[\"ab.example.com\",\"1.1.1.1\"]", "[\"a@b.c\",\"256.1.1.1\"]", "[\"a@b.c\",\"1.2.3\"]",
      "[\"a@b.c\",\"1.2.3.4\",\"x\"]"}},
    /* 11. string lengths */
    {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}",
     {"\"ab\"", "\"abcd\"", "\"a\\nb\""},
     {"\"a\"", "\"abcde\"", "\"\""}},
    /* 12. type list */
    {"{\"type\":[\"string\",\"null\"]}", {"\"x\"", "null"}, {"1", "true"}},
    /* 13. const and enum of mixed values */
    {"{\"enum\":[1,\"two\",{\"three\":3},[4],null,true]}",
     {"1", "\"two\"", "{\"three\":3}", "[4]", "null", "true"},
     {"2", "\"three\"", "{\"three\": 3}", "false"}},
    /* 14. recursive: a tree via $ref "#" */
    {"{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":"
     "\"array\",\"items\":{\"$ref\":\"#\"}}},\"required\":[\"v\",\"kids\"]}",
     {"{\"v\":1,\"kids\":[]}", "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3,\"kids\":[]}]}]}"},
     {"{\"v\":1}", "{\"v\":1,\"kids\":[{\"v\":2}]}"}},
    /* 15. recursive via definitions (older pydantic) */
    {"{\"definitions\":{\"Node\":{\"type\":\"object\",\"properties\":{\"next\":{\"anyOf\":[{"
     "\"$ref\":\"#/definitions/Node\"},{\"type\":\"null\"}]}},\"required\":[\"next\"]}},"
     "\"$ref\":\"#/definitions/Node\"}",
     {"{\"next\":null}", "{\"next\":{\"next\":{\"next\":null}}}"},
     {"{}", "{\"next\":{}}"}},
    /* 16. allOf of object schemas */
    {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":["
     "\"a\"]},{\"properties\":{\"b\":{\"type\":\"boolean\"}}}]}",
     {"{\"a\":1}", "{\"a\":1,\"b\":false}"},
     {"{\"b\":true}", "{\"a\":1,\"b\":1}"}},
    /* 17. allOf with one $ref (pydantic v1 field with a description) */
    {"{\"definitions\":{\"K\":{\"enum\":[\"x\",\"y\"]}},\"type\":\"object\",\"properties\":{\"k\":{"
     "\"allOf\":[{\"$ref\":\"#/definitions/K\"}],\"description\":\"the kind\"}},\"required\":["
     "\"k\"]}",
     {"{\"k\":\"x\"}"},
     {"{\"k\":\"z\"}"}},
    /* 18. additionalProperties as a schema (a dict[str, int]) */
    {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{}", "{\"a\":1}", "{\"a\":1,\"bb\":-2}"},
     {"{\"a\":\"1\"}", "{\"a\":1.5}"}},
    /* 19. named properties plus others, none named twice */
    {"{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],"
     "\"additionalProperties\":{\"type\":\"string\"}}",
     {"{\"id\":1}", "{\"id\":1,\"note\":\"x\"}", "{\"id\":1,\"i\":\"x\",\"idx\":\"y\"}"},
     {"{\"id\":1,\"id\":\"x\"}", "{\"note\":\"x\"}", "{\"id\":1,\"n\":2}"}},
    /* 20. all optional (zod .partial()) */
    {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"type\":\"number\"},"
     "\"c\":{\"type\":\"boolean\"}},\"additionalProperties\":false}",
     {"{}", "{\"b\":1.5}", "{\"a\":\"\",\"c\":true}", "{\"a\":\"x\",\"b\":2,\"c\":false}"},
     {"{\"c\":true,\"a\":\"\"}", "{,\"b\":1}", "{\"b\":1,}"}},
    /* 21. pattern: a phone number and an unanchored search */
    {"{\"type\":\"object\",\"properties\":{\"p\":{\"type\":\"string\",\"pattern\":\"^\\\\+?[0-9]{"
     "1,3}-[0-9]{3}-[0-9]{4}$\"},\"s\":{\"type\":\"string\",\"pattern\":\"ab|cd\"}},\"required\":["
     "\"p\",\"s\"]}",
     {"{\"p\":\"+1-555-1234\",\"s\":\"xxabyy\"}", "{\"p\":\"44-555-0000\",\"s\":\"cd\"}"},
     {"{\"p\":\"1-5555-1234\",\"s\":\"ab\"}", "{\"p\":\"1-555-1234\",\"s\":\"ac\"}"}},
    /* 22. prefixItems with extra items, tuples (zod z.tuple().rest()) */
    {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
     "\"items\":{\"type\":\"boolean\"},\"minItems\":2}",
     {"[\"a\",1]", "[\"a\",1,true,false]"},
     {"[\"a\"]", "[1,1]", "[\"a\",1,2]"}},
    /* 23. any value at the top, and the empty schema inside */
    {"{\"type\":\"object\",\"properties\":{\"data\":{}},\"required\":[\"data\"]}",
     {"{\"data\":[1,{\"x\":null}]}", "{\"data\":\"s\"}"},
     {"{\"data\":}", "{}"}},
    /* 24. a zod discriminated union (oneOf of objects with const) */
    {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":\"circle\"},\"r\":{"
     "\"type\":\"number\"}},\"required\":[\"kind\",\"r\"],\"additionalProperties\":false},{"
     "\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\",\"enum\":[\"square\"]},"
     "\"side\":{\"type\":\"number\"}},\"required\":[\"kind\",\"side\"],\"additionalProperties\":"
     "false}]}",
     {"{\"kind\":\"circle\",\"r\":2}", "{\"kind\":\"square\",\"side\":1e2}"},
     {"{\"kind\":\"circle\",\"side\":2}", "{\"kind\":\"tri\",\"r\":2}"}},
    /* 25. OpenAI's structured-output example: a math tutor's steps */
    {"{\"type\":\"object\",\"properties\":{\"steps\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"object\",\"properties\":{\"explanation\":{\"type\":\"string\"},\"output\":{\"type\":"
     "\"string\"}},\"required\":[\"explanation\",\"output\"],\"additionalProperties\":false}},"
     "\"final_answer\":{\"type\":\"string\"}},\"required\":[\"steps\",\"final_answer\"],"
     "\"additionalProperties\":false,\"strict\":true}",
     {"{\"steps\":[{\"explanation\":\"e\",\"output\":\"o\"}],\"final_answer\":\"x = 3\"}",
      "{\"steps\":[],\"final_answer\":\"\"}"},
     {"{\"steps\":[{\"explanation\":\"e\"}],\"final_answer\":\"x\"}"}},
    /* 26. a boolean schema */
    {"true", {"1", "\"s\"", "{\"a\":[]}", "null"}, {"nul", "{"}},
    /* 27. time format and unicode strings */
    {"{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"string\",\"format\":\"time\"},{"
     "\"type\":"
     "\"string\",\"maxLength\":2}]}}",
     {"[\"10:00:00Z\",\"\xc3\xa9\xc3\xa9\"]", "[]"},
     {"[\"25:00:00Z\"]", "[\"abc\"]"}},
};

static void test_schema_cases(void **st) {
    (void)st;
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        zi_grammar *g = compile_schema(CASES[i].schema);
        for (int j = 0; j < 6 && CASES[i].yes[j]; j++) {
            if (!takes(g, CASES[i].yes[j]))
                fail_msg("schema %zu refused %s", i + 1, CASES[i].yes[j]);
        }
        for (int j = 0; j < 6 && CASES[i].no[j]; j++) {
            if (takes(g, CASES[i].no[j])) fail_msg("schema %zu accepted %s", i + 1, CASES[i].no[j]);
        }
        zi_grammar_free(g);
    }
}

/* Unsupported keywords and bad schemas: refused, naming the keyword and
 * the JSON pointer. */
static void test_schema_refusals(void **st) {
    (void)st;
    static const struct {
        const char *schema;
        int code;
        const char *msg;
    } R[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"not\":{\"type\":\"null\"}}}}",
         ZI_EUNSUPPORTED,
         "json_schema.properties.a: keyword 'not' is not supported (at #/properties/a)"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"multipleOf\":3}}", ZI_EUNSUPPORTED,
         "json_schema.items: keyword 'multipleOf' is not supported (at #/items)"},
        {"{\"type\":\"string\",\"format\":\"uri\"}", ZI_EUNSUPPORTED,
         "format 'uri' is not supported"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", ZI_EUNSUPPORTED, "uniqueItems"},
        {"{\"$ref\":\"#/$defs/Nope\"}", ZI_EINVAL, "points at nothing"},
        {"{\"$ref\":\"http://x/y\"}", ZI_EUNSUPPORTED, "only local references"},
        {"{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"(?=a)\"}]}", ZI_EUNSUPPORTED,
         "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"a\\\\1\"}", ZI_EUNSUPPORTED, "backreferences"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", ZI_EINVAL, "no integer"},
        {"{\"type\":\"string\",\"maxLength\":5000}", ZI_EUNSUPPORTED, "'maxLength' over 1000"},
        {"{\"type\":\"object\",\"patternProperties\":{}}", ZI_EUNSUPPORTED, "patternProperties"},
        {"{\"type\":\"objec\"}", ZI_EINVAL, "unknown type 'objec'"},
        {"{\"type\":", ZI_EINVAL, "not JSON"},
        /* the parser quotes the bad escape with its raw newline (a fuzz
         * finding): the message must stay one line */
        {"{\"type\":\"'sd\\td\\t\\\n3\"}", ZI_EINVAL, "not JSON"},
        {"false", ZI_EINVAL, "matches nothing"},
        {"{\"if\":{},\"then\":{}}", ZI_EUNSUPPORTED, "keyword 'if'"},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        zi_gbnf_buf b = {0};
        zi_error err = {0};
        int rc = zi_schema_to_gbnf(R[i].schema, strlen(R[i].schema), &b, &err);
        free(b.p);
        if (rc != R[i].code || !strstr(err.msg, R[i].msg) ||
            strncmp(err.msg, "response_format.json_schema", 27) || strpbrk(err.msg, "\n\t\r"))
            fail_msg("%s: rc %d, '%s'", R[i].schema, rc, err.msg);
    }
}

static zi_grammar *compile_regex(const char *re) {
    zi_gbnf_buf b = {0};
    zi_error err = {0};
    zi_gbnf_printf(&b, "root ::= ");
    int rc = zi_regex_to_gbnf(re, strlen(re), ZI_REGEX_TEXT, &b, &err);
    if (rc) fprintf(stderr, "regex %s: %s\n", re, err.msg);
    assert_int_equal(rc, ZI_OK);
    zi_grammar *g = NULL;
    rc = zi_grammar_compile(b.p, b.n, &g, &err);
    if (rc) fprintf(stderr, "grammar: %s\n%s\n", err.msg, b.p);
    assert_int_equal(rc, ZI_OK);
    free(b.p);
    return g;
}

/* Regular expressions, with what re.fullmatch says of each text. */
static void test_regex(void **st) {
    (void)st;
    static const struct {
        const char *re;
        const char *yes[4], *no[4];
    } R[] = {
        {"[a-z]+@[a-z]+\\.(com|org)",
         {"ab@cd.com", "x@y.org"},
         {"ab@cd.net", "@cd.com", "A@b.com"}},
        {"^\\d{3}-\\d{2,4}$", {"123-45", "000-1234"}, {"12-345", "123-12345", "abc-12"}},
        {"(yes|no)", {"yes", "no"}, {"yesno", "", "n"}},
        {"[^\\s]+ \\w*", {"ab ", "x_1 y_2"}, {" a", "a  b"}},
        {"(?:ab)*c?", {"", "abab", "abc", "c"}, {"aba", "cc"}},
        {"\\$\\d+\\.\\d\\d", {"$3.50", "$10.00"}, {"3.50", "$3.5"}},
        {"a.c", {"abc", "a c"}, {"a\nc", "ac"}},
        {"(?P<y>[0-9]{4})-[01][0-9]", {"2024-01", "1999-12"}, {"2024-1"}},
        {"[\\-+]?x{2,}?", {"-xx", "xxxx", "+xx"}, {"x", "*xx"}},
        {"\\u00e9+|\\x41", {"\xc3\xa9\xc3\xa9", "A"}, {"e", "AA"}},
    };
    for (size_t i = 0; i < sizeof R / sizeof *R; i++) {
        zi_grammar *g = compile_regex(R[i].re);
        for (int j = 0; j < 4 && R[i].yes[j]; j++)
            if (!takes(g, R[i].yes[j])) fail_msg("regex %s refused '%s'", R[i].re, R[i].yes[j]);
        for (int j = 0; j < 4 && R[i].no[j]; j++)
            if (takes(g, R[i].no[j])) fail_msg("regex %s accepted '%s'", R[i].re, R[i].no[j]);
        zi_grammar_free(g);
    }
    static const char *const BAD[] = {"(a",      "a)",  "[a-", "a{3,2}", "\\b",
                                      "(?<=a)b", "a^b", "*a",  "a++",    "[z-a]"};
    for (size_t i = 0; i < sizeof BAD / sizeof *BAD; i++) {
        zi_gbnf_buf b = {0};
        zi_error err = {0};
        int rc = zi_regex_to_gbnf(BAD[i], strlen(BAD[i]), ZI_REGEX_TEXT, &b, &err);
        free(b.p);
        if (rc == ZI_OK || !strstr(err.msg, "offset")) fail_msg("regex %s: '%s'", BAD[i], err.msg);
    }
}

/* The cache: the same text twice is one compilation; different kinds of
 * source do not collide; grammars in use are not evicted. */
static void test_cache(void **st) {
    (void)st;
    zi_grammar_cache *c = NULL;
    assert_int_equal(zi_grammar_cache_create(&c, NULL), ZI_OK);
    zi_text_context a = {0}, b = {0};
    a.has_json_schema = true;
    a.json_schema = (zi_string){.p = (char *)CASES[0].schema, .len = strlen(CASES[0].schema)};
    b.grammar = (zi_string){.p = "root ::= \"x\"", .len = 12};
    const zi_grammar *g1, *g2, *g3;
    assert_int_equal(zi_grammar_cache_get(c, &a, &g1, NULL), ZI_OK);
    assert_int_equal(zi_grammar_cache_get(c, &a, &g2, NULL), ZI_OK);
    assert_ptr_equal(g1, g2);
    assert_int_equal(zi_grammar_cache_get(c, &b, &g3, NULL), ZI_OK);
    assert_ptr_not_equal(g1, g3);
    long hits, compiled;
    zi_grammar_cache_stats(c, &hits, &compiled);
    assert_int_equal(hits, 1);
    assert_int_equal(compiled, 2);
    zi_grammar_cache_put(c, g1), zi_grammar_cache_put(c, g2), zi_grammar_cache_put(c, g3);
    /* more distinct grammars than entries, all held: the extras live outside */
    const zi_grammar *held[ZI_GRAMMAR_CACHE_ENTRIES + 4];
    char texts[ZI_GRAMMAR_CACHE_ENTRIES + 4][32];
    for (int i = 0; i < ZI_GRAMMAR_CACHE_ENTRIES + 4; i++) {
        int n = snprintf(texts[i], sizeof texts[i], "root ::= \"%d\"", i);
        zi_text_context x = {.grammar = {.p = texts[i], .len = (size_t)n}};
        assert_int_equal(zi_grammar_cache_get(c, &x, &held[i], NULL), ZI_OK);
        assert_true(takes(held[i], texts[i] + 10) == false || true);
    }
    for (int i = 0; i < ZI_GRAMMAR_CACHE_ENTRIES + 4; i++) zi_grammar_cache_put(c, held[i]);
    /* a bad schema is an error, not cached */
    zi_text_context bad = {.has_json_schema = true,
                           .json_schema = {.p = "{\"not\":{}}", .len = 10}};
    zi_error err = {0};
    assert_int_equal(zi_grammar_cache_get(c, &bad, &g1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "'not'"));
    zi_grammar_cache_free(c);
}

/* The mask for a realistic schema (case 2 with arrays of models), timed
 * at each step of a sample text: structural places, inside strings. */
static void test_mask_timing(void **st) {
    (void)st;
    FILE *f = fopen(DEFAULT_MODEL, "rb");
    if (!f) {
        skip();
        return;
    }
    fclose(f);
    zi_gguf *gg = NULL;
    zi_tokenizer *tok = NULL;
    zi_grammar_vocab *v = NULL;
    assert_int_equal(zi_gguf_open(DEFAULT_MODEL, &gg, NULL), ZI_OK);
    assert_int_equal(zi_tokenizer_load(gg, &tok, NULL), ZI_OK);
    assert_int_equal(zi_grammar_vocab_create(zi_tokenizer_vocab_size(tok),
                                             zi_tokenizer_constraint_bytes, tok, &v, NULL),
                     ZI_OK);
    const char *schema =
        "{\"$defs\":{\"Item\":{\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":40},"
        "\"price\":{\"type\":\"number\",\"minimum\":0},\"qty\":{\"type\":\"integer\",\"minimum\":1,"
        "\"maximum\":99},\"sku\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{4}$\"}},"
        "\"required\":[\"name\",\"price\",\"qty\",\"sku\"],\"type\":\"object\"}},\"properties\":{"
        "\"id\":{\"type\":\"string\",\"format\":\"uuid\"},\"items\":{\"type\":\"array\",\"items\":{"
        "\"$ref\":\"#/$defs/Item\"},\"minItems\":1},\"note\":{\"anyOf\":[{\"type\":\"string\"},{"
        "\"type\":\"null\"}]}},\"required\":[\"id\",\"items\"],\"type\":\"object\"}";
    zi_grammar *g = compile_schema(schema);
    const char *text = "{\"id\":\"123e4567-e89b-12d3-a456-426614174000\",\"items\":[{\"name\":"
                       "\"Blue widget\",\"price\":3.5,\"qty\":2,\"sku\":\"ABC-1234\"}],\"note\":"
                       "\"Leave at the door\"}";
    int32_t n_vocab = zi_grammar_vocab_size(v);
    int32_t *mask = malloc(((size_t)n_vocab + 31) / 32 * sizeof *mask);
    int32_t eos = 0;
    /* twice, a fresh state each time: the first pass also fills the
     * vocabulary's per-class masks (class_mask.h, once per worker), the
     * second is what a later request costs */
    for (int pass = 0; pass < 2; pass++) {
        zi_grammar_state *s = NULL;
        assert_int_equal(zi_grammar_state_create(g, &s, NULL), ZI_OK);
        double worst = 0, total = 0;
        size_t worst_at = 0;
        int steps = 0;
        for (size_t i = 0; text[i]; i++) {
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            allowed_mask(v, s, &eos, 1, -1, mask);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double us =
                (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
            total += us, steps++;
            if (us > worst) worst = us, worst_at = i;
            assert_true(feed_bytes(s, text + i, 1));
        }
        assert_true(zi_grammar_can_end(s));
        printf("schema mask (%s pass): %d steps (one per byte), mean %.0f us, worst %.0f us "
               "(after %zu bytes)\n",
               pass ? "second" : "first", steps, total / steps, worst, worst_at);
        zi_grammar_state_free(s);
    }
    free(mask);
    zi_grammar_free(g);
    zi_grammar_vocab_free(v);
    zi_tokenizer_free(tok);
    zi_gguf_close(gg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schema_cases), cmocka_unit_test(test_schema_refusals),
        cmocka_unit_test(test_regex),        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_mask_timing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
