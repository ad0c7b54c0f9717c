/*
 * test_tokenizer_wpm.c - the WordPiece tokenizer (model "bert") on a tiny
 * hand-made vocabulary: the normaliser (lowercase, accents, NFD's first
 * codepoint, dropped control characters, punctuation and CJK split off),
 * greedy longest-token words and the [UNK] fallback, [CLS]/[SEP] with
 * add_special, special-token parsing, decoding with llama.cpp's space
 * clean-up, the normaliser keys, and hostile files (no [UNK], ids outside
 * the vocabulary, a huge token). The real vocabulary (bert-bge) is tested
 * end to end against llama.cpp (tests/e2e/test_vocab_*.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "tokenizer.h"
#include "tokenizer_expect.h"

#define SP "\xe2\x96\x81"
enum {
    T_PAD,
    T_UNK,
    T_CLS,
    T_SEP,
    T_HELLO,
    T_HE,
    T_LLO,
    T_L,
    T_O,
    T_E,
    T_BANG,
    T_ZHONG,
    T_APOS,
    T_S,
    T_CAFE,
    T_HELLO_UP,
    T_N
};
static const char *const k_text[T_N] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]",           SP "hello", SP "he", "llo",     "l",
    "o",     SP "e",  SP "!",  SP "\xe4\xb8\xad", SP "'",     SP "s",  SP "cafe", SP "Hello"};

typedef struct wpm_opts {
    int lower; /* -1: no key */
    int strip; /* -1: no key */
    int ids;   /* set unknown/bos/sep ids (else llama.cpp's defaults) */
    int unk;   /* unknown_token_id when ids is set, -1: key absent */
    int huge;  /* token T_S is 16000 bytes (the limit is 16384) */
} wpm_opts;

static const wpm_opts k_opts = {-1, -1, 1, T_UNK, 0};

static wbuf make_wpm(const wpm_opts *o) {
    static char huge[16001];
    const char *toks[T_N];
    int32_t types[T_N];
    for (int i = 0; i < T_N; i++) {
        toks[i] = k_text[i];
        types[i] = i <= T_SEP ? ZI_TOKEN_CONTROL : ZI_TOKEN_NORMAL;
    }
    types[T_UNK] = ZI_TOKEN_UNKNOWN;
    if (o->huge) {
        memset(huge, 's', sizeof huge - 1);
        toks[T_S] = huge;
    }
    wbuf b = {0};
    uint64_t n_kv = 3 + (o->lower >= 0) + (o->strip >= 0) + (o->ids ? 2 + (o->unk >= 0) : 0);
    w_header(&b, 3, 0, n_kv);
    kv_str(&b, "tokenizer.ggml.model", "bert");
    kv_strs(&b, "tokenizer.ggml.tokens", toks, T_N);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, T_N);
    if (o->lower >= 0) kv_bool(&b, "tokenizer.ggml.normalizer.lowercase", o->lower);
    if (o->strip >= 0) kv_bool(&b, "tokenizer.ggml.normalizer.strip_accents", o->strip);
    if (o->ids) {
        kv_u32(&b, "tokenizer.ggml.bos_token_id", T_CLS);
        kv_u32(&b, "tokenizer.ggml.seperator_token_id", T_SEP);
        if (o->unk >= 0) kv_u32(&b, "tokenizer.ggml.unknown_token_id", (uint32_t)o->unk);
    }
    return b;
}

typedef zi_loaded_tokenizer loaded;

static int load(const wpm_opts *o, loaded *l, zi_error *err) {
    return zi_load_tokenizer(make_wpm(o), l, err);
}

static void unload(loaded *l) {
    zi_unload_tokenizer(l);
}

#define EXPECT(t, s, addsp, parsesp, ...)                                                          \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        zi_expect_ids(t, s, sizeof(s) - 1, addsp, parsesp, want_, sizeof want_ / sizeof *want_);   \
    } while (0)

static void expect_decode(zi_tokenizer *t, const int32_t *ids, size_t n, const char *want) {
    char *s = NULL;
    size_t len = 0;
    zi_error err = {0};
    assert_int_equal(zi_tokenizer_decode(t, ids, n, 0, &s, &len, &err), ZI_OK);
    assert_string_equal(s, want);
    assert_int_equal(len, strlen(want));
    free(s);
}

#define DECODE(t, want, ...)                                                                       \
    do {                                                                                           \
        static const int32_t ids_[] = {__VA_ARGS__};                                               \
        expect_decode(t, ids_, sizeof ids_ / sizeof *ids_, want);                                  \
    } while (0)

static void test_wpm_encode(void **state) {
    (void)state;
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&k_opts, &l, &err), ZI_OK);
    zi_tokenizer *t = l.t;
    assert_int_equal(zi_tokenizer_bos(t), T_CLS);
    /* Longest token first, from the left; lowercased by default. */
    EXPECT(t, "hello HELLO", 0, 0, T_HELLO, T_HELLO);
    EXPECT(t, "hellollo", 0, 0, T_HELLO, T_LLO);
    /* A position without a token: the whole word is [UNK]. */
    EXPECT(t, "hellox he", 0, 0, T_UNK, T_HE);
    EXPECT(t, "", 0, 0);
    EXPECT(t, " \t\n ", 0, 0);
    /* Punctuation, ASCII symbols and CJK stand alone; control characters,
     * NUL and U+FFFD (from invalid UTF-8) are dropped. */
    EXPECT(t,
           "he!!\xe4\xb8\xad"
           "e",
           0, 0, T_HE, T_BANG, T_BANG, T_ZHONG, T_E);
    EXPECT(t,
           "h\x00"
           "e\xe2\x80\x8bl\xfflo",
           0, 0, T_HELLO);
    EXPECT(t, "he's", 0, 0, T_HE, T_APOS, T_S);
    /* Accents: precomposed (NFD's first codepoint) and combining marks. */
    EXPECT(t, "caf\xc3\xa9 CAFE\xcc\x81 h\xc3\xa9llo", 0, 0, T_CAFE, T_CAFE, T_HELLO);
    /* add_special: [CLS] ... [SEP]; special tokens only when parsed. */
    EXPECT(t, "he", 1, 0, T_CLS, T_HE, T_SEP);
    EXPECT(t, "", 1, 0, T_CLS, T_SEP);
    EXPECT(t, "[SEP]he", 0, 1, T_SEP, T_HE);
    unload(&l);

    /* lowercase off: strip_accents follows it unless set. */
    wpm_opts o = k_opts;
    o.lower = 0;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "Hello hello caf\xc3\xa9", 0, 0, T_HELLO_UP, T_HELLO, T_UNK);
    unload(&l);
    o.strip = 1;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "caf\xc3\xa9", 0, 0, T_CAFE);
    unload(&l);
}

static void test_wpm_decode(void **state) {
    (void)state;
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&k_opts, &l, &err), ZI_OK);
    zi_tokenizer *t = l.t;
    /* U+2581 is a space (the first stays); control tokens are hidden. */
    DECODE(t, " hello", T_CLS, T_HELLO, T_SEP);
    DECODE(t, " hello", T_HE, T_LLO);
    /* llama.cpp's clean-up: no space before ! and 's. */
    DECODE(t, " he!!", T_HE, T_BANG, T_BANG);
    DECODE(t, " he's", T_HE, T_APOS, T_S);
    DECODE(t, " he'e", T_HE, T_APOS, T_E);
    unload(&l);
}

static void test_wpm_hostile(void **state) {
    (void)state;
    loaded l;
    zi_error err = {0};
    /* Without the keys, llama.cpp's defaults (bos 101, sep 102) are
     * outside this vocabulary. */
    wpm_opts o = k_opts;
    o.ids = 0;
    assert_int_equal(load(&o, &l, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "seperator_token_id"));
    assert_null(l.t);
    unload(&l);
    /* No unknown token (default 100 is outside): a word without tokens is
     * an error, not a bogus id. */
    o = k_opts;
    o.unk = -1;
    err = (zi_error){0};
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(zi_tokenizer_encode(l.t, "xyz", 3, 0, 0, &ids, &n, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "unknown_token_id"));
    free(ids);
    unload(&l);
    /* A huge token and a long word: bounded work, still exact. */
    o = k_opts;
    o.huge = 1;
    err = (zi_error){0};
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    size_t big = 100000;
    char *text = malloc(big);
    assert_non_null(text);
    memset(text, 'l', big);
    assert_int_equal(zi_tokenizer_encode(l.t, text, big, 0, 0, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], T_UNK); /* "▁l" is no token */
    free(ids);
    free(text);
    unload(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wpm_encode),
        cmocka_unit_test(test_wpm_decode),
        cmocka_unit_test(test_wpm_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
