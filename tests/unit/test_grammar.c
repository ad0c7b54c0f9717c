/*
 * test_grammar.c - cmocka tests for structured/grammar.h (GBNF grammars):
 *  - refusals: bad grammars are ZI_EINVAL naming line:column and the fault;
 *  - matching: whole strings taken or refused by ten grammars (JSON-like,
 *    arithmetic, bounded repetitions, classes, Unicode, partial UTF-8);
 *  - with the default model's vocabulary (skipped when absent): the mask
 *    at every prefix of sample texts equals feeding each token's bytes one
 *    by one (a brute force over the whole vocabulary), and a timing of the
 *    mask for the JSON-like grammar;
 *  - bounds: deep nesting and very ambiguous grammars stay within the
 *    stack limits and a time limit;
 *  - budgets: a completion that never takes end-of-sequence by choice, and
 *    prefers the longest tokens, still ends a whole sentence within the
 *    budget the budgeted mask is given;
 *  - out of memory (zi_grammar_state_fail_after): a feed, a lookahead or a
 *    mask that cannot grow its work list or arena reports ZI_ENOMEM and
 *    leaves the state as it was, never a narrower answer.
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
#include "grammar_expect.h"
#include "vocab_trie.h"
#include "tokenizer.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const char JSON_G[] =
    "# JSON, in the shape of llama.cpp's grammars/json.gbnf\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "           \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws\n"
    "ws     ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char ARITH_G[] = "root ::= expr\n"
                              "expr ::= term ((\"+\" | \"-\") term)*\n"
                              "term ::= factor ((\"*\" | \"/\") factor)*\n"
                              "factor ::= [0-9]+ | \"(\" expr \")\" | \"-\" factor\n";

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static zi_grammar *compile_ok(const char *text) {
    zi_grammar *g = NULL;
    zi_error err = {0};
    int rc = zi_grammar_compile(text, strlen(text), &g, &err);
    if (rc != ZI_OK) fail_msg("compiling %s: %s", text, err.msg);
    return g;
}

/* 1: s is a whole sentence; 0: a prefix only; -1: refused. */
static int run(const zi_grammar *g, const char *s) {
    zi_grammar_state *st;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &st, &err), ZI_OK);
    int r = -1;
    if (feed_bytes(st, s, strlen(s))) r = zi_grammar_can_end(st) ? 1 : 0;
    zi_grammar_state_free(st);
    return r;
}

/* ---- refusals ------------------------------------------------------------ */

static void test_bad_grammars(void **state) {
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"", "line 1:1: empty grammar"},
        {"  # only a comment\n\n", "line 1:1: empty grammar"},
        {"root ::= foo\n", "line 1:10: undefined rule 'foo'"},
        {"root ::= \"a\"\nx ::= \"b\"\nroot ::= \"c\"\n",
         "line 3:1: rule 'root' defined twice (first at 1:1)"},
        {"root ::= (\"a\" | \"b\"\n", "line 1:10: unbalanced parentheses: this '(' is not closed"},
        {"root ::= \"a\" )\n", "line 1:14: unbalanced parentheses: ')' without '('"},
        {"root ::= \"a\\q\"\n", "line 1:12: bad escape '\\q'"},
        {"root ::= \"\\x4\"\n", "line 1:11: bad escape: expected 2 hex digits"},
        {"root ::= \"\\uD800\"\n", "line 1:11: bad escape: U+D800 is not a Unicode scalar value"},
        {"root ::= \"abc\n", "line 1:10: unterminated string literal"},
        {"root ::= [a-z\n", "line 1:10: unterminated character class"},
        {"root ::= [z-a]\n", "line 1:11: bad range in character class"},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n",
         "line 2:1: left recursion: rule 'expr'"},
        {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"\n",
         "line 2:1: left recursion: rule 'a'"},
        {"root ::= x\nx ::= y? x \"c\" | \"d\"\ny ::= \"a\"*\n",
         "line 2:1: left recursion: rule 'x'"},
        {"start ::= \"a\"\n", "line 1:1: no rule named 'root'"},
        {"root ::= a\na ::= a | b\nb ::= \"x\"? a\n", "line 1:1: rule 'root' matches no text"},
        {"root = \"a\"\n", "line 1:6: expected '::=' after rule name 'root'"},
        {"root ::= * \"a\"\n", "line 1:10: repetition '*' with nothing before it"},
        {"root ::= \"a\"{3,2}\n", "line 1:13: bad repetition: {3,2} has max < min"},
        {"root ::= \"a\"{2\n", "line 1:13: expected '}' to close '{'"},
        {"root ::= \"a\"{5000}\n", "line 1:14: repetition count over 1000"},
        {"root ::= <[1000]>\n", "line 1:10: token references (<...>) are not supported"},
        {"root ::= \"a\" ; \"b\"\n", "line 1:14: unexpected ';'"},
        {"root ::= \"x\"\n  \"y\"\n", "line 2:3: expected a rule name"},
        {"root ::= \"caf\xc3\xa9\" [\n", "line 1:17: unterminated character class"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        zi_grammar *g = NULL;
        zi_error err = {0};
        int rc = zi_grammar_compile(cases[k].text, strlen(cases[k].text), &g, &err);
        if (rc != ZI_EINVAL || !strstr(err.msg, cases[k].want))
            fail_msg("case %zu (%s): rc %d, \"%s\", want \"%s\"", k, cases[k].text, rc, err.msg,
                     cases[k].want);
        assert_null(g);
    }
    /* a deep nest of parentheses is refused, not a deep recursion */
    char deep[400];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "root ::= ");
    for (int k = 0; k < 100; k++) deep[n++] = '(';
    deep[n] = 0;
    zi_grammar *g = NULL;
    zi_error err = {0};
    assert_int_equal(zi_grammar_compile(deep, n, &g, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "parentheses nested deeper than 64"));
    /* repetitions that expand past the element limit */
    char big[2000];
    n = (size_t)snprintf(big, sizeof big, "root ::=");
    for (int k = 0; k < 70; k++) n += (size_t)snprintf(big + n, sizeof big - n, " \"ab\"{1000}");
    big[n++] = '\n';
    assert_int_equal(zi_grammar_compile(big, n, &g, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "more than 65536 elements after expanding repetitions"));
}

/* ---- matching ------------------------------------------------------------ */

typedef struct mcase {
    const char *text;
    int want; /* as run() */
} mcase;

static void check(const char *grammar, const mcase *cases, size_t n) {
    zi_grammar *g = compile_ok(grammar);
    for (size_t k = 0; k < n; k++) {
        int got = run(g, cases[k].text);
        if (got != cases[k].want)
            fail_msg("grammar %s, text \"%s\": %d, want %d", grammar, cases[k].text, got,
                     cases[k].want);
    }
    zi_grammar_free(g);
}
#define CHECK(gr, ...)                                                                             \
    do {                                                                                           \
        static const mcase c_[] = {__VA_ARGS__};                                                   \
        check(gr, c_, sizeof c_ / sizeof *c_);                                                     \
    } while (0)

static void test_matching(void **state) {
    (void)state;
    CHECK("root ::= \"yes\" | \"no\"\n", {"yes", 1}, {"no", 1}, {"y", 0}, {"", 0}, {"yess", -1},
          {"maybe", -1});
    CHECK("root ::= [0-9]{4} \"-\" [0-9]{2} \"-\" [0-9]{2}\n", {"2024-01-31", 1}, {"2024-01-3", 0},
          {"202-01-31", -1}, {"2024-01-311", -1}, {"2024/01/31", -1});
    CHECK(ARITH_G, {"1+2*3", 1}, {"(1+2)*-3", 1}, {"((7))", 1}, {"1+", 0}, {"(1", 0}, {"1)", -1},
          {"+1", -1}, {"1**2", -1});
    CHECK(JSON_G, {"{}", 1}, {"{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\"]}", 1},
          {"{\"a\":{\"b\":[]}}\n", 1}, {"{\"a\": 01}", -1}, {"{\"a\" 1}", -1},
          {"{\"a\": \"\x01\"}", -1}, {"{\"a\": \"caf\xc3\xa9\"", 0}, {"[1]", -1},
          {"{\"k\": \"\\q\"}", -1});
    /* bounded lists with separators */
    /* a repetition of something that can be empty: a cycle of tail calls,
     * taken (not left recursion) */
    CHECK("root ::= (\"a\"?)* \"b\"\n", {"b", 1}, {"aab", 1}, {"ac", -1}, {"aa", 0});
    CHECK("root ::= ((\"a\"* | \"c\")* \"x\"?)+ \".\"\n", {".", 1}, {"aacxa.", 1}, {"xx.", 1},
          {"ab", -1});
    CHECK("root ::= \"[\" item (\", \" item){1,2} \"]\"\nitem ::= [a-z]+\n", {"[a, b]", 1},
          {"[a, bc, d]", 1}, {"[a]", -1}, {"[a, b, c, d]", -1}, {"[a, b, c", 0});
    CHECK("root ::= \"x\"{3}\n", {"xxx", 1}, {"xx", 0}, {"xxxx", -1});
    CHECK("root ::= \"ab\"{2,}\n", {"abab", 1}, {"ababab", 1}, {"ab", 0}, {"aba", 0}, {"abb", -1});
    CHECK("root ::= [^a-c\\n]* \"\\n\"\n", {"xyz\n", 1}, {"\n", 1}, {"xay\n", -1}, {"dd", 0});
    /* classes of non-ASCII characters, escapes, partial UTF-8 */
    CHECK("root ::= [α-ω]+ \"\\u00e9\" [\\U0001F600-\\U0001F64F]?\n", {"αβγé", 1},
          {"ωé\xf0\x9f\x98\x80", 1}, {"αé\xf0\x9f\x98", 0}, {"α\xc3", 0}, {"α\xc3\xa8", -1},
          {"Aé", -1}, {"α\xc3\x28", -1}, {"\xce", 0}, {"\xcf\xbf", -1});
    /* '.', comments, newlines inside parentheses, nullable rules */
    CHECK(
        "root ::= ( # a comment\n  \"a\" |\n  \"b\"\n) . opt \"!\"  # trailing\nopt ::= \"?\" | \n",
        {"aZ!", 1}, {"b\xe2\x82\xac?!", 1}, {"a!", 0}, {"c!!", -1}, {"a\xff!", -1});
    /* an ambiguous grammar: still exact */
    CHECK("root ::= a+ \"c\"\na ::= \"x\" | \"xx\" | \"x\" \"x\"?\n", {"xxxc", 1}, {"c", -1},
          {"xc", 1}, {"xxxx", 0});
    /* overlong and surrogate encodings are refused even by '.' */
    CHECK("root ::= .*\n", {"a\xc3\xa9", 1}, {"\xc0\x80", -1}, {"\xed\xa0\x80", -1},
          {"\xe0\x80\xaf", -1}, {"\xf4\x90\x80\x80", -1});
}

/* ---- bounds -------------------------------------------------------------- */

static void test_pathological(void **state) {
    (void)state;
    double t0 = now_s();
    /* nesting deeper than the stack limit: the text is refused there */
    zi_grammar *g = compile_ok("root ::= \"(\" root \")\" | \"x\"\n");
    zi_grammar_state *st;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &st, &err), ZI_OK);
    int taken = 0;
    for (int k = 0; k < 5000; k++, taken++)
        if (!feed_bytes(st, "(", 1)) break;
    assert_true(taken > 100 && taken < ZI_GRAMMAR_MAX_DEPTH);
    zi_grammar_state_free(st);
    zi_grammar_free(g);
    /* very ambiguous: many ways to split a run of x; stacks stay bounded */
    g = compile_ok("root ::= (a | b | c)* \"!\"\na ::= \"x\" | \"xx\"\nb ::= \"x\"+ | \"xxx\"\n"
                   "c ::= (\"x\" | \"x\" \"x\"?)+\n");
    assert_int_equal(zi_grammar_state_create(g, &st, &err), ZI_OK);
    for (int k = 0; k < 2000; k++) {
        assert_true(feed_bytes(st, "x", 1));
        assert_true(zi_grammar_state_stacks(st) <= ZI_GRAMMAR_MAX_STACKS);
    }
    assert_true(feed_bytes(st, "!", 1));
    assert_true(zi_grammar_can_end(st));
    zi_grammar_state_free(st);
    zi_grammar_free(g);
    /* chains of nullable, doubly ambiguous rules: r_k ::= | "a" | r_k+1 r_k+1
     * makes 2^k distinct stacks; at depth 12 all are kept, at depth 2000
     * the expansion budget cuts them (the text stays valid, some parses
     * are lost) in bounded time */
    char *text = malloc(128 * 1024);
    for (int depth = 12; depth <= 2000; depth += 1988) {
        size_t n = 0;
        for (int k = 0; k < depth; k++)
            n += (size_t)sprintf(text + n, "r%d ::= | \"a\" | r%d r%d\n", k, k + 1, k + 1);
        n += (size_t)sprintf(text + n, "r%d ::= \"b\"\nroot ::= r0 \"c\"\n", depth);
        if (zi_grammar_compile(text, n, &g, &err) != ZI_OK) fail_msg("%s", err.msg);
        assert_int_equal(run(g, "c"), 1);
        assert_int_equal(run(g, "ac"), 1);
        if (depth == 12) assert_int_equal(run(g, "aaab"), 0);
        if (depth == 12) assert_int_equal(run(g, "aaaac"), 1);
        zi_grammar_free(g);
    }
    free(text);
    double dt = now_s() - t0;
    print_message("pathological grammars: %.3f s\n", dt);
    assert_true(dt < 20.0);
}

/* ---- with the model's vocabulary ----------------------------------------- */

typedef struct vocab_fixture {
    zi_gguf *g;
    zi_tokenizer *tok;
    zi_grammar_vocab *v;
} vocab_fixture;

static int setup_vocab(void **state) {
    static vocab_fixture f;
    memset(&f, 0, sizeof f);
    const char *path = getenv("ZINFER_MODEL") ? getenv("ZINFER_MODEL") : DEFAULT_MODEL;
    zi_error err = {0};
    if (zi_gguf_open(path, &f.g, &err) == ZI_OK && zi_tokenizer_load(f.g, &f.tok, &err) == ZI_OK)
        assert_int_equal(zi_grammar_vocab_create(zi_tokenizer_vocab_size(f.tok),
                                                 zi_tokenizer_constraint_bytes, f.tok, &f.v, &err),
                         ZI_OK);
    *state = &f;
    return 0;
}

static int teardown_vocab(void **state) {
    vocab_fixture *f = *state;
    zi_grammar_vocab_free(f->v);
    zi_tokenizer_free(f->tok);
    zi_gguf_close(f->g);
    return 0;
}

/* At every byte prefix of text (a sentence of grammar), the mask equals
 * the tokens whose bytes the state takes, token by token. */
static void mask_is_exact(vocab_fixture *f, const char *grammar, const char *text) {
    zi_grammar *g = compile_ok(grammar);
    int32_t V = zi_tokenizer_vocab_size(f->tok), eos = zi_tokenizer_eos(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask);
    char buf[ZI_TOKEN_MAX_BYTES + 16];
    zi_grammar_state *s;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    size_t len = strlen(text);
    long allowed = 0;
    for (size_t i = 0; i <= len; i++) {
        allowed_mask(f->v, s, &eos, 1, -1, mask);
        for (int32_t id = 0; id < V; id++) {
            int bit = (int)((uint32_t)mask[id >> 5] >> (id & 31) & 1u), want;
            if (zi_tokenizer_token_type(f->tok, id) == ZI_TOKEN_CONTROL) {
                want = id == eos && zi_grammar_can_end(s);
            } else {
                int nb = zi_tokenizer_token_bytes(f->tok, id, 0, buf, sizeof buf);
                want = nb > 0 && accepts_bytes(s, buf, (size_t)nb);
            }
            if (bit != want)
                fail_msg("prefix %zu of %s, token %d: mask %d, want %d", i, text, id, bit, want);
            allowed += bit;
        }
        if (i < len && !feed_bytes(s, text + i, 1)) fail_msg("byte %zu of %s refused", i, text);
    }
    assert_true(zi_grammar_can_end(s));
    assert_true(allowed > 0);
    zi_grammar_state_free(s);
    zi_grammar_free(g);
    free(mask);
}

static void test_mask_is_exact(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    mask_is_exact(f, JSON_G, "{\"name\": \"Caf\xc3\xa9 \\\"x\\\"\", \"n\": [-1.5e3, 0, true]}");
    mask_is_exact(f, ARITH_G, "(12+3)*-45");
    mask_is_exact(f, "root ::= [α-ω]+ \"\\u00e9\" [\\U0001F600-\\U0001F64F]?\n",
                  "αβé\xf0\x9f\x98\x80");
    mask_is_exact(f, "root ::= \"yes\" | \"no\"\n", "yes");
    /* states inside repeated classes, where the mask takes the tokens of
     * the class at once (class_mask.h) and walks only the rest: a string
     * body with multi-byte characters, a class with holes above ASCII, a
     * class that another top overlaps (that top steps back into the set,
     * or does not), a class that can end the text, a bounded repetition */
    mask_is_exact(f, JSON_G,
                  "{\"k\": \"a b\\n\\u00e9 caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80 \\\"q\\\" \", "
                  "\"long key with spaces\": \"\"}");
    mask_is_exact(f, "root ::= \"<\" [^>\\u00e9\\u4e00-\\u4e0f\\n]* \">\"\n",
                  "<ab c\xc3\xa8\xe4\xb8\x90 \xe4\xb8\xad>");
    mask_is_exact(f, "root ::= ([a-z] | \"q\" | \" \")* \".\"\n", "the quick fox.");
    mask_is_exact(f, "root ::= [a-z ]* \"x\" [0-9]\n", "ab xa x1");
    mask_is_exact(f, "root ::= [a-zA-Z ]*\n", "Hello world");
    mask_is_exact(f, "root ::= [0-9]{0,12} \";\" [^;]+\n", "123;abc def");
    mask_is_exact(f, "root ::= ([a-z ]* | \"-\")* \".\"\n", "ab -cd.");
    /* bounded repetitions of a large class: tokens of at most the
     * characters left */
    mask_is_exact(f, "root ::= \"'\" [^']{0,6} \"'\" [^']{2,3} \"'\"\n",
                  "'ab c\xc3\xa9"
                  "d'xyz'");
    mask_is_exact(f, "root ::= \"\\\"\" c{0,9} \"\\\"\"\nc ::= [^\"\\\\] | \"\\\\\" [nt]\n",
                  "\"the cat\\n\"");
}

/* Feeding a token through the vocabulary equals feeding its bytes; a
 * control token is never taken; the mask's cost for the JSON grammar. */
static void test_feed_token_and_cost(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    zi_grammar *g = compile_ok(JSON_G);
    int32_t V = zi_tokenizer_vocab_size(f->tok), eos = zi_tokenizer_eos(f->tok);
    int32_t *mask = malloc(((size_t)V + 31) / 32 * sizeof *mask);
    zi_grammar_state *s;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    assert_false(feed_tok(f->v, s, eos));
    /* generate greedily-by-id: the lowest allowed token each step, timing
     * the mask at a few kinds of states */
    const char *pre[] = {"", "{\"key", "{\"key\": ", "{\"key\": 12", "{\"k\": [true, "};
    for (size_t k = 0; k < sizeof pre / sizeof *pre; k++) {
        zi_grammar_state *t;
        assert_int_equal(zi_grammar_state_create(g, &t, &err), ZI_OK);
        assert_true(feed_bytes(t, pre[k], strlen(pre[k])));
        double t0 = now_s();
        allowed_mask(f->v, t, &eos, 1, -1, mask);
        double us = (now_s() - t0) * 1e6, t1 = now_s();
        allowed_mask(f->v, t, &eos, 1, -1, mask); /* again: from the cache */
        double us_cached = (now_s() - t1) * 1e6;
        int n = 0;
        for (int32_t id = 0; id < V; id++) n += (int)((uint32_t)mask[id >> 5] >> (id & 31) & 1u);
        print_message(
            "JSON grammar mask after \"%s\": %.0f us, cached %.0f us (%d tokens allowed)\n", pre[k],
            us, us_cached, n);
        assert_true(n > 0);
        zi_grammar_state_free(t);
    }
    /* walk 40 tokens, each the first allowed one, through feed_token */
    for (int step = 0; step < 40; step++) {
        allowed_mask(f->v, s, &eos, 1, -1, mask);
        int32_t pick = -1;
        for (int32_t id = V - 1; id >= 0; id--)
            if ((uint32_t)mask[id >> 5] >> (id & 31) & 1u) pick = id;
        assert_true(pick >= 0);
        if (pick == eos) break;
        assert_true(feed_tok(f->v, s, pick));
    }
    zi_grammar_state_free(s);
    zi_grammar_free(g);
    free(mask);
}

/* Drives a completion of grammar with at most budget tokens through
 * zi_grammar_allowed_within: at each step a token of the mask, never EOS
 * unless it is all the mask holds, and half the time the longest one (the
 * tokens that open most); the text must end whole within the budget. */
static void budget_closes(vocab_fixture *f, const char *grammar, int64_t budget, uint64_t seed) {
    zi_grammar *g = compile_ok(grammar);
    int32_t V = zi_tokenizer_vocab_size(f->tok), eos = zi_tokenizer_eos(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask), *ids = malloc((size_t)V * sizeof *ids);
    char buf[ZI_TOKEN_MAX_BYTES + 16];
    zi_grammar_state *s;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    bool ended = false;
    int64_t used = 0;
    while (used < budget && !ended) {
        allowed_mask(f->v, s, &eos, 1, budget - used, mask);
        int32_t n = 0, longest = -1, longest_len = 0;
        bool eos_ok = (uint32_t)mask[eos >> 5] >> (eos & 31) & 1u;
        for (int32_t id = 0; id < V; id++)
            if (id != eos && (uint32_t)mask[id >> 5] >> (id & 31) & 1u) {
                ids[n++] = id;
                int nb = zi_tokenizer_token_bytes(f->tok, id, 0, buf, sizeof buf);
                if (nb > longest_len) longest = id, longest_len = nb;
            }
        used++;
        if (n == 0) {
            if (!eos_ok)
                fail_msg("%s, budget %lld: empty mask at token %lld", grammar, (long long)budget,
                         (long long)used);
            ended = true;
            break;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t pick = (seed >> 33) & 1 ? longest : ids[(seed >> 34) % (uint64_t)n];
        assert_true(feed_tok(f->v, s, pick));
    }
    if (!zi_grammar_can_end(s))
        fail_msg("%s, budget %lld: the text is not whole after %lld tokens", grammar,
                 (long long)budget, (long long)used);
    zi_grammar_state_free(s);
    zi_grammar_free(g);
    free(mask);
    free(ids);
}

static void test_budget_closes(void **state) {
    vocab_fixture *f = *state;
    if (!f->v) skip();
    /* an object with required keys, nested lists of them, recursion */
    const char *tree = "root ::= node\n"
                       "node ::= \"{\\\"name\\\": \\\"\" [a-z ]* \"\\\", \\\"kids\\\": [\" "
                       "(node (\", \" node)*)? \"]}\"\n";
    const char *grammars[] = {JSON_G, ARITH_G, tree,
                              "root ::= \"<\" [^>]{3,} \">\" [0-9]{4} \"!\"\n"};
    const int64_t budgets[] = {3, 6, 13, 40};
    double t0 = now_s();
    for (size_t k = 0; k < sizeof grammars / sizeof *grammars; k++)
        for (size_t b = 0; b < sizeof budgets / sizeof *budgets; b++)
            for (uint64_t seed = 1; seed <= 3; seed++) {
                /* the tree's shortest text is 24 bytes, the last one's 9 */
                if ((k == 2 && budgets[b] < 26) || (k == 3 && budgets[b] < 11)) continue;
                budget_closes(f, grammars[k], budgets[b], seed);
            }
    print_message("budgeted completions: %.2f s\n", now_s() - t0);
}

/* ---- out of memory -------------------------------------------------------- */

/* "root ::= <first> x" with x of 300 alternatives "k0" .. "k299": taking the
 * first character puts 300 stacks on the work list, more than its first
 * 256 entries, so it must grow there. */
static zi_grammar *wide_grammar(const char *first) {
    char *text = malloc(8192);
    size_t n = (size_t)sprintf(text, "root ::= %s x\nx ::= \"k0\"", first);
    for (int k = 1; k < 300; k++) n += (size_t)sprintf(text + n, " | \"k%d\"", k);
    text[n++] = '\n';
    zi_grammar *g = NULL;
    zi_error err = {0};
    if (zi_grammar_compile(text, n, &g, &err) != ZI_OK) fail_msg("%s", err.msg);
    free(text);
    return g;
}

/* Feeds text byte by byte into a fresh state of g whose growths fail after
 * `after` of them: each byte is taken as the reference says, or reported
 * ZI_ENOMEM with the state unchanged (and then taken after the hook is
 * lifted). Returns how many calls reported ZI_ENOMEM. */
static int feed_failing(const zi_grammar *g, const char *text, int64_t after) {
    zi_grammar_state *s, *ref;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    assert_int_equal(zi_grammar_state_create(g, &ref, &err), ZI_OK);
    zi_grammar_state_fail_after(s, after);
    int ooms = 0;
    for (size_t i = 0; text[i]; i++) {
        bool want = feed_bytes(ref, text + i, 1), acc = true, taken = true;
        int stacks = zi_grammar_state_stacks(s);
        bool end = zi_grammar_can_end(s);
        int rc = zi_grammar_accepts(s, (const uint8_t *)text + i, 1, &acc, &err);
        if (rc == ZI_OK) assert_true(acc == want);
        rc = zi_grammar_feed(s, (const uint8_t *)text + i, 1, &taken, &err);
        if (rc == ZI_OK) {
            assert_true(taken == want);
        } else {
            assert_int_equal(rc, ZI_ENOMEM);
            assert_false(taken);
            assert_non_null(strstr(err.msg, "out of memory"));
            assert_int_equal(zi_grammar_state_stacks(s), stacks); /* as it was */
            assert_true(zi_grammar_can_end(s) == end);
            ooms++;
            zi_grammar_state_fail_after(s, -1);
            assert_true(feed_bytes(s, text + i, 1) == want);
        }
        assert_int_equal(zi_grammar_state_stacks(s), zi_grammar_state_stacks(ref));
        if (!want) break;
    }
    zi_grammar_state_free(s);
    zi_grammar_state_free(ref);
    return ooms;
}

static void test_out_of_memory(void **state) {
    vocab_fixture *f = *state;
    /* the work list cannot grow: the feed is refused as out of memory, not
     * taken with some of x's alternatives missing */
    zi_grammar *g = wide_grammar("\"a\"");
    zi_grammar_state *s;
    zi_error err = {0};
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    zi_grammar_state_fail_after(s, 0);
    bool taken = true;
    assert_int_equal(zi_grammar_accepts(s, (const uint8_t *)"a", 1, &taken, &err), ZI_ENOMEM);
    assert_false(taken);
    taken = true;
    assert_int_equal(zi_grammar_feed(s, (const uint8_t *)"a", 1, &taken, &err), ZI_ENOMEM);
    assert_false(taken);
    assert_string_equal(err.msg, "grammar: out of memory matching the text");
    assert_int_equal(zi_grammar_state_stacks(s), 1); /* unchanged */
    zi_grammar_state_fail_after(s, -1);
    assert_true(feed_bytes(s, "a", 1));
    assert_int_equal(zi_grammar_state_stacks(s), 300);
    assert_true(feed_bytes(s, "k299", 4)); /* the last alternative is there */
    assert_true(zi_grammar_can_end(s));
    zi_grammar_state_free(s);
    assert_int_equal(feed_failing(g, "ak299", 0), 1);
    zi_grammar_free(g);
    /* the arena too, at each of its growths in turn: nested parentheses
     * keep a few nodes per level alive */
    g = compile_ok(ARITH_G);
    char text[1024];
    memset(text, '(', 300);
    text[300] = '1';
    memset(text + 301, ')', 300);
    text[601] = 0;
    int64_t after = 0;
    while (feed_failing(g, text, after) > 0) after++;
    print_message("out of memory met at each of %lld growths\n", (long long)after);
    assert_true(after >= 3); /* the work list's and the arena's */
    zi_grammar_free(g);
    if (!f->v) return;
    /* masks: each first character leads to x's 300 alternatives */
    g = wide_grammar("[a-z]");
    int32_t V = zi_tokenizer_vocab_size(f->tok), eos = zi_tokenizer_eos(f->tok);
    size_t words = ((size_t)V + 31) / 32;
    int32_t *mask = malloc(words * sizeof *mask), *want = malloc(words * sizeof *want);
    assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
    allowed_mask(f->v, s, &eos, 1, -1, want);
    zi_grammar_state_free(s);
    for (int64_t budget = -1; budget <= 4; budget += 5) {
        assert_int_equal(zi_grammar_state_create(g, &s, &err), ZI_OK);
        zi_grammar_state_fail_after(s, 0);
        err.msg[0] = 0;
        assert_int_equal(zi_grammar_allowed_within(f->v, s, &eos, 1, budget, mask, &err),
                         ZI_ENOMEM);
        assert_non_null(strstr(err.msg, "out of memory"));
        zi_grammar_state_fail_after(s, -1); /* nothing cached by the failed call */
        allowed_mask(f->v, s, &eos, 1, -1, mask);
        assert_memory_equal(mask, want, words * sizeof *mask);
        zi_grammar_state_free(s);
    }
    free(mask);
    free(want);
    zi_grammar_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_grammars),        cmocka_unit_test(test_matching),
        cmocka_unit_test(test_pathological),        cmocka_unit_test(test_mask_is_exact),
        cmocka_unit_test(test_feed_token_and_cost), cmocka_unit_test(test_budget_closes),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, setup_vocab, teardown_vocab);
}
