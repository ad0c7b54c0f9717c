/*
 * test_grammar_hostile.c - cmocka tests that hostile constraints cost
 * bounded time and memory: each schema, regular expression or GBNF grammar
 * below is refused at compile time (admission, in the worker) with an
 * error naming the problem, or compiles and then takes a hostile text and
 * a token mask (with the default model's vocabulary, skipped when absent)
 * well inside a time bound, with the process's peak memory bounded.
 *
 * Cases: 100k-value enums, deep nesting (schemas, arrays, parentheses),
 * $ref cycles (pure, through anyOf, left-recursive), exponential regular
 * expressions ((a|a)*b, nested quantifiers, (a|aa)*c), huge repetition
 * bounds (maxLength, {m,n}, nested repetitions multiplying), left recursion
 * (direct and indirect), a grammar of many rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <cmocka.h>

#include "gguf.h"
#include "grammar.h"
#include "grammar_expect.h"
#include "regex_grammar.h"
#include "schema_grammar.h"
#include "tokenizer.h"
#include "vocab_trie.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define TIME_BOUND_S 2.0              /* compile + feed + masks of one case */
#define PEAK_BOUND_KIB (1024L * 1024) /* the process's peak resident memory */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static long peak_kib(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

typedef struct fixture {
    zi_gguf *g;
    zi_tokenizer *tok;
    zi_grammar_vocab *v;
    int32_t *mask;
} fixture;

static int setup(void **state) {
    static fixture f;
    memset(&f, 0, sizeof f);
    const char *path = getenv("ZINFER_MODEL") ? getenv("ZINFER_MODEL") : DEFAULT_MODEL;
    if (zi_gguf_open(path, &f.g, NULL) == ZI_OK && zi_tokenizer_load(f.g, &f.tok, NULL) == ZI_OK &&
        zi_grammar_vocab_create(zi_tokenizer_vocab_size(f.tok), zi_tokenizer_constraint_bytes,
                                f.tok, &f.v, NULL) == ZI_OK)
        f.mask = malloc(((size_t)zi_grammar_vocab_size(f.v) + 31) / 32 * sizeof *f.mask);
    *state = &f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    free(f->mask);
    zi_grammar_vocab_free(f->v);
    zi_tokenizer_free(f->tok);
    zi_gguf_close(f->g);
    return 0;
}

enum { SCHEMA, REGEX, GBNF };

/* Compiles text as kind; when it compiles, feeds `feed` (may be refused
 * part way) taking a mask after every 64 bytes. Asserts the time bound,
 * the memory bound, and: refused (want_refused, the message holding
 * `why`) or compiled. */
static void hostile(fixture *f, int kind, const char *text, size_t len, const char *feed,
                    bool want_refused, const char *why) {
    double t0 = now_s();
    zi_gbnf_buf b = {0};
    zi_error err = {0};
    zi_grammar *g = NULL;
    int rc = ZI_OK;
    if (kind == SCHEMA) {
        rc = zi_schema_to_gbnf(text, len, &b, &err);
    } else if (kind == REGEX) {
        zi_gbnf_printf(&b, "root ::= ");
        rc = zi_regex_to_gbnf(text, len, ZI_REGEX_TEXT, &b, &err);
    } else {
        zi_gbnf_append(&b, text, len);
    }
    if (rc == ZI_OK) rc = zi_grammar_compile(b.p, b.n, &g, &err);
    free(b.p);
    double t_compile = now_s() - t0;
    if (want_refused) {
        if (rc == ZI_OK) fail_msg("accepted, expected refused (%s): %.60s", why, text);
        if (!strstr(err.msg, why)) fail_msg("refused with '%s', expected '%s'", err.msg, why);
    } else if (rc != ZI_OK) {
        fail_msg("refused: %s: %.60s", err.msg, text);
    }
    long fed = 0;
    if (g) {
        zi_grammar_state *s = NULL;
        assert_int_equal(zi_grammar_state_create(g, &s, NULL), ZI_OK);
        int32_t eos = f->tok ? zi_tokenizer_eos(f->tok) : 0;
        for (size_t i = 0; feed && feed[i]; i++) {
            if (f->v && i % 64 == 0) allowed_mask(f->v, s, &eos, 1, -1, f->mask);
            if (!feed_bytes(s, feed + i, 1)) break;
            fed++;
            assert_true(zi_grammar_state_stacks(s) <= ZI_GRAMMAR_MAX_STACKS);
        }
        if (f->v) allowed_mask(f->v, s, &eos, 1, -1, f->mask);
        zi_grammar_state_free(s);
        zi_grammar_free(g);
    }
    double dt = now_s() - t0;
    print_message("%-8s %-44.44s %s in %.3f s (compile %.3f s, %ld bytes fed), peak %ld MiB\n",
                  kind == SCHEMA  ? "schema"
                  : kind == REGEX ? "regex"
                                  : "gbnf",
                  text, rc ? "refused" : "bounded", dt, t_compile, fed, peak_kib() / 1024);
    if (dt > TIME_BOUND_S) fail_msg("took %.3f s: %.60s", dt, text);
    assert_true(peak_kib() < PEAK_BOUND_KIB);
}

static void hostile_str(fixture *f, int kind, const char *text, const char *feed, bool refused,
                        const char *why) {
    hostile(f, kind, text, strlen(text), feed, refused, why);
}

/* A text of n copies of unit, NUL-terminated (caller frees). */
static char *repeat(const char *head, const char *unit, int n, const char *tail) {
    size_t hu = strlen(head), uu = strlen(unit), tu = strlen(tail);
    char *p = malloc(hu + uu * (size_t)n + tu + 1), *q = p;
    memcpy(q, head, hu), q += hu;
    for (int i = 0; i < n; i++) memcpy(q, unit, uu), q += uu;
    memcpy(q, tail, tu + 1);
    return p;
}

static void test_hostile_schemas(void **state) {
    fixture *f = *state;
    /* a 100,000-value enum: refused by its size, unread; 5000 short
     * values: refused by count */
    char *t = malloc(100000 * 12 + 64);
    size_t n = (size_t)sprintf(t, "{\"enum\":[");
    for (int i = 0; i < 100000; i++) n += (size_t)sprintf(t + n, "%s\"v%d\"", i ? "," : "", i);
    n += (size_t)sprintf(t + n, "]}");
    hostile(f, SCHEMA, t, n, NULL, true, "longer than");
    n = (size_t)sprintf(t, "{\"enum\":[");
    for (int i = 0; i < 5000; i++) n += (size_t)sprintf(t + n, "%s%d", i ? "," : "", i);
    n += (size_t)sprintf(t + n, "]}");
    hostile(f, SCHEMA, t, n, NULL, true, "enum");
    /* 1024 long values sharing prefixes: at the limit, compiled as a trie
     * (a few stacks per byte, not one per value), every value taken */
    n = (size_t)sprintf(t, "{\"enum\":[");
    for (int i = 0; i < 1024; i++)
        n += (size_t)sprintf(t + n, "%s\"value-number-%d-of-many\"", i ? "," : "", i);
    n += (size_t)sprintf(t + n, "]}");
    hostile(f, SCHEMA, t, n, "\"value-number-1000-of-many\"", false, NULL);
    zi_gbnf_buf b = {0};
    zi_grammar *g = NULL;
    assert_int_equal(zi_schema_to_gbnf(t, n, &b, NULL), ZI_OK);
    assert_int_equal(zi_grammar_compile(b.p, b.n, &g, NULL), ZI_OK);
    for (int i = 0; i < 1024; i += 7) {
        char val[64];
        int len = sprintf(val, "\"value-number-%d-of-many\"", i);
        zi_grammar_state *s = NULL;
        assert_int_equal(zi_grammar_state_create(g, &s, NULL), ZI_OK);
        assert_true(feed_bytes(s, val, (size_t)len));
        assert_true(zi_grammar_can_end(s));
        assert_false(feed_bytes(s, "x", 1));
        zi_grammar_state_free(s);
    }
    zi_grammar_free(g);
    free(b.p);
    free(t);
    /* nesting: 5000 arrays inside each other (refused by depth), 60
     * (accepted) fed 2000 brackets deep */
    char *deep = repeat("", "{\"type\":\"array\",\"items\":", 5000, "{}");
    char *tail = repeat(deep, "}", 5000, "");
    hostile_str(f, SCHEMA, tail, NULL, true, "depth");
    free(deep), free(tail);
    deep = repeat("", "{\"items\":", 60, "{\"type\":\"integer\"}");
    tail = repeat(deep, "}", 60, "");
    char *brackets = repeat("", "[", 2000, "");
    hostile_str(f, SCHEMA, tail, brackets, false, NULL);
    free(deep), free(tail);
    /* $ref cycles: to itself with no way out (refused: matches nothing),
     * through anyOf beside null (taken: only null), and a legal
     * recursive list fed 2000 levels deep */
    hostile_str(f, SCHEMA, "{\"$defs\":{\"A\":{\"$ref\":\"#/$defs/A\"}},\"$ref\":\"#/$defs/A\"}",
                NULL, true, "matches no text");
    hostile_str(f, SCHEMA,
                "{\"$defs\":{\"A\":{\"anyOf\":[{\"$ref\":\"#/$defs/B\"},{\"type\":\"null\"}]},"
                "\"B\":{\"$ref\":\"#/$defs/A\"}},\"$ref\":\"#/$defs/A\"}",
                "null", false, NULL); /* a cycle of tail calls: the language is {null} */
    hostile_str(f, SCHEMA,
                "{\"$defs\":{\"L\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/L\"}}},"
                "\"$ref\":\"#/$defs/L\"}",
                brackets, false, NULL);
    free(brackets);
    /* huge bounds: refused over the limit, bounded at it */
    hostile_str(f, SCHEMA, "{\"type\":\"string\",\"maxLength\":1000000000}", NULL, true,
                "maxLength");
    hostile_str(f, SCHEMA, "{\"type\":\"array\",\"minItems\":1000000,\"items\":{}}", NULL, true,
                "minItems");
    hostile_str(f, SCHEMA,
                "{\"type\":\"array\",\"maxItems\":1000,\"items\":{\"type\":\"string\","
                "\"maxLength\":1000}}",
                "[\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\", \"b\"", false,
                NULL);
    hostile_str(f, SCHEMA, "{\"type\":\"integer\",\"minimum\":-1e300,\"maximum\":1e300}", NULL,
                false, NULL);
}

static void test_hostile_regexes(void **state) {
    fixture *f = *state;
    char *as = repeat("", "a", 3000, "");
    /* exponential for a backtracking matcher, linear here: the stack sets
     * are deduplicated */
    hostile_str(f, REGEX, "(a|a)*b", as, false, NULL);
    hostile_str(f, REGEX, "(a*)*b", as, false, NULL);
    hostile_str(f, REGEX, "((a+)+)+b", as, false, NULL);
    hostile_str(f, REGEX, "(a|aa)*c", as, false, NULL);
    hostile_str(f, REGEX, "(.*a){20}", as, false, NULL);
    free(as);
    /* repetition bounds that multiply: a group repeated is references to
     * one rule, so 10^9 a's cost 3000 elements (bounded); one count over
     * the limit is refused */
    char *as2 = repeat("", "a", 3000, "");
    hostile_str(f, REGEX, "((a{1000}){1000}){1000}", as2, false, NULL);
    hostile_str(f, REGEX, "a{1000000}", as2, false, NULL);
    /* groups nested past the limit */
    char *p = repeat("", "(", 5000, "a");
    char *q = repeat(p, ")", 5000, "");
    hostile_str(f, REGEX, q, NULL, true, "");
    free(p), free(q), free(as2);
}

static void test_hostile_gbnf(void **state) {
    fixture *f = *state;
    /* left recursion, direct and through other rules */
    hostile_str(f, GBNF, "root ::= root \"a\" | \"b\"\n", NULL, true, "left recursion");
    hostile_str(f, GBNF, "root ::= x\nx ::= y? \"c\"\ny ::= z\nz ::= x \"d\"\n", NULL, true,
                "left recursion");
    /* huge and multiplying repetition counts */
    hostile_str(f, GBNF, "root ::= \"a\"{100000}\n", NULL, true, "");
    char *as = repeat("", "a", 3000, "");
    hostile_str(f, GBNF, "root ::= ((\"a\"{1000}){1000}){1000}\n", as, false, NULL);
    hostile_str(f, GBNF, "root ::= (\"a\" \"b\"? \"c\"?){1000}\n", as, false, NULL);
    free(as);
    /* parentheses nested past the limit */
    char *p = repeat("root ::= ", "(", 100000, "\"a\"");
    char *q = repeat(p, ")", 100000, "\n");
    hostile_str(f, GBNF, q, NULL, true, "");
    free(p), free(q);
    /* 4000 rules in a chain: compiled, fed, masked */
    size_t cap = 4000 * 40, n = 0;
    char *g = malloc(cap);
    n += (size_t)sprintf(g + n, "root ::= r0\n");
    for (int k = 0; k < 3990; k++)
        n += (size_t)sprintf(g + n, "r%d ::= \"x\" r%d | \"y\"\n", k, k + 1);
    n += (size_t)sprintf(g + n, "r3990 ::= \"z\"\n");
    char *xs = repeat("", "x", 3000, "y");
    hostile(f, GBNF, g, n, xs, false, NULL);
    free(g), free(xs);
    /* ambiguity that doubles the parses at every byte */
    char *xs2 = repeat("", "x", 3000, "");
    hostile_str(f, GBNF, "root ::= (a | b)*\na ::= \"x\" | \"xx\"\nb ::= \"x\"+\n", xs2, false,
                NULL);
    free(xs2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_schemas),
        cmocka_unit_test(test_hostile_regexes),
        cmocka_unit_test(test_hostile_gbnf),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
