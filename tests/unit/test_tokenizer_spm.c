/*
 * test_tokenizer_spm.c - the SentencePiece-style tokenizer (model "llama")
 * on a tiny hand-made vocabulary: the merge by score and its tie rule, the
 * space prefix on and off, byte fallback, unknown and special tokens,
 * BOS/EOS, decoding (U+2581, byte tokens, the leading-space rule),
 * streaming decode of byte sequences, Phi-3's strip rule, and hostile files
 * (bad scores, missing byte tokens, huge tokens, NaN scores). The real
 * vocabularies are tested end to end (tests/e2e/test_vocab_*.py).
 */
#include <math.h>
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

/* The vocabulary: <unk> <s> </s>, the 256 byte tokens, then these. */
#define BYTE(b) (3 + (b))
enum { T_SP = 259, T_A, T_B, T_C, T_AB, T_BC, T_SPAB, T_AA, T_SPA, T_USER, T_END, T_X, T_N };
static const char *const k_text[] = {"\xe2\x96\x81",
                                     "a",
                                     "b",
                                     "c",
                                     "ab",
                                     "bc",
                                     "\xe2\x96\x81"
                                     "ab",
                                     "aa",
                                     "\xe2\x96\x81"
                                     "a",
                                     "<u>",
                                     "<|end|>",
                                     "x"};
static const float k_score[] = {-1, -1, -1, -1, -3, -2, -0.5f, -4, -5, 0, 0, -1};

typedef struct spm_opts {
    int space_prefix;  /* -1: no key */
    int add_eos;       /* -1: no key */
    int scores;        /* 0 float32, 1 one short, 2 int32, 3 a string array, 4 none, 5 NaN */
    int drop_byte;     /* -1, or a byte whose token is renamed away */
    int huge;          /* token T_X is 20000 bytes */
    const char *name;  /* general.name, or NULL */
    const char *model; /* tokenizer.ggml.model */
} spm_opts;

static const spm_opts k_opts = {-1, -1, 0, -1, 0, NULL, "llama"};

static wbuf make_spm(const spm_opts *o) {
    static char bytes[256][7];
    static char huge[20001];
    const char *toks[T_N];
    int32_t types[T_N];
    float scores[T_N];
    toks[0] = "<unk>";
    toks[1] = "<s>";
    toks[2] = "</s>";
    types[0] = ZI_TOKEN_UNKNOWN;
    types[1] = types[2] = ZI_TOKEN_CONTROL;
    scores[0] = scores[1] = scores[2] = 0;
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        toks[BYTE(b)] = bytes[b];
        types[BYTE(b)] = ZI_TOKEN_BYTE;
        scores[BYTE(b)] = 0;
    }
    if (o->drop_byte >= 0) {
        snprintf(bytes[o->drop_byte], sizeof bytes[0], "gone");
        types[BYTE(o->drop_byte)] = ZI_TOKEN_NORMAL;
    }
    for (int i = T_SP; i < T_N; i++) {
        toks[i] = k_text[i - T_SP];
        types[i] = ZI_TOKEN_NORMAL;
        scores[i] = o->scores == 5 ? NAN : k_score[i - T_SP];
    }
    types[T_USER] = ZI_TOKEN_USER_DEFINED;
    types[T_END] = ZI_TOKEN_CONTROL;
    if (o->huge) {
        memset(huge, 'x', sizeof huge - 1);
        toks[T_X] = huge;
    }

    wbuf b = {0};
    uint64_t n_kv =
        3 + (o->scores != 4) + (o->space_prefix >= 0) + (o->add_eos >= 0) + (o->name != NULL);
    w_header(&b, 3, 0, n_kv);
    kv_str(&b, "tokenizer.ggml.model", o->model);
    kv_strs(&b, "tokenizer.ggml.tokens", toks, T_N);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, T_N);
    if (o->scores == 0 || o->scores == 1 || o->scores == 5) {
        size_t n = T_N - (o->scores == 1);
        w_key(&b, "tokenizer.ggml.scores", ZI_GGUF_ARRAY);
        w_u32(&b, ZI_GGUF_FLOAT32);
        w_u64(&b, n);
        for (size_t i = 0; i < n; i++) w_f32(&b, scores[i]);
    } else if (o->scores == 2) {
        int32_t iv[T_N];
        for (int i = 0; i < T_N; i++) iv[i] = (int32_t)scores[i];
        kv_i32s(&b, "tokenizer.ggml.scores", iv, T_N);
    } else if (o->scores == 3) {
        kv_strs(&b, "tokenizer.ggml.scores", toks, T_N);
    }
    if (o->space_prefix >= 0) kv_bool(&b, "tokenizer.ggml.add_space_prefix", o->space_prefix);
    if (o->add_eos >= 0) kv_bool(&b, "tokenizer.ggml.add_eos_token", o->add_eos);
    if (o->name) kv_str(&b, "general.name", o->name);
    return b;
}

typedef zi_loaded_tokenizer loaded;

static int load(const spm_opts *o, loaded *l, zi_error *err) {
    return zi_load_tokenizer(make_spm(o), l, err);
}

static void unload(loaded *l) {
    zi_unload_tokenizer(l);
}

#define EXPECT(t, s, addsp, parsesp, ...)                                                          \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        zi_expect_ids(t, s, strlen(s), addsp, parsesp, want_, sizeof want_ / sizeof *want_);       \
    } while (0)

static void expect_decode(zi_tokenizer *t, const int32_t *ids, size_t n, int special,
                          const char *want) {
    char *s = NULL;
    size_t len = 0;
    zi_error err = {0};
    assert_int_equal(zi_tokenizer_decode(t, ids, n, special, &s, &len, &err), ZI_OK);
    assert_int_equal(len, strlen(want));
    assert_string_equal(s, want);
    free(s);
}

#define DECODE(t, special, want, ...)                                                              \
    do {                                                                                           \
        static const int32_t ids_[] = {__VA_ARGS__};                                               \
        expect_decode(t, ids_, sizeof ids_ / sizeof *ids_, special, want);                         \
    } while (0)

/* The space prefix is on by default; merges go by score, ties leftmost. */
static void test_spm_encode(void **state) {
    (void)state;
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&k_opts, &l, &err), ZI_OK);
    zi_tokenizer *t = l.t;
    assert_int_equal(zi_tokenizer_bos(t), 1);
    assert_int_equal(zi_tokenizer_eos(t), 2);
    /* "▁ab": "ab" (-3) merges before "▁a" (-5), then "▁ab" (-0.5). */
    EXPECT(t, "ab", 0, 0, T_SPAB);
    /* "bc" (-2) before "ab" (-3); "abc" is no token. */
    EXPECT(t, "abc", 0, 0, T_SPA, T_BC);
    /* Equal scores: the leftmost pair first. */
    EXPECT(t, "aaa", 0, 0, T_SP, T_AA, T_A);
    /* Spaces are U+2581; a character that is no token falls back to bytes. */
    EXPECT(t, "a b", 0, 0, T_SPA, T_SP, T_B);
    EXPECT(t, "\xc3\xa9", 0, 0, T_SP, BYTE(0xC3), BYTE(0xA9));
    /* Raw bytes are not validated: a lone continuation byte is a symbol. */
    EXPECT(t, "\xa9x", 0, 0, T_SP, BYTE(0xA9), T_X);
    /* BOS by default (SPM), EOS only when the file asks. */
    EXPECT(t, "ab", 1, 0, 1, T_SPAB);
    EXPECT(t, "", 1, 0, 1);
    /* Special tokens: control ones only when parsed, user-defined always;
     * the text after one gets the space prefix again. */
    EXPECT(t, "<s>ab", 0, 1, 1, T_SPAB);
    EXPECT(t, "<s>ab", 0, 0, T_SP, BYTE('<'), BYTE('s'), BYTE('>'), T_AB);
    EXPECT(t, "a<u>b", 0, 0, T_SPA, T_USER, T_SP, T_B);
    EXPECT(t, "<unk>", 0, 1, 0);
    EXPECT(t, "<|end|>  \n x", 0, 1, T_END, T_SP, T_SP, T_SP, BYTE('\n'), T_SP, T_X);
    unload(&l);

    spm_opts o = k_opts;
    o.add_eos = 1;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "ab", 1, 0, 1, T_SPAB, 2);
    unload(&l);
}

static void test_spm_no_space_prefix(void **state) {
    (void)state;
    spm_opts o = k_opts;
    o.space_prefix = 0;
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "ab", 0, 0, T_AB);
    EXPECT(l.t, "abc", 0, 0, T_A, T_BC);
    EXPECT(l.t, "aaa", 0, 0, T_AA, T_A);
    EXPECT(l.t, " ab", 0, 0, T_SPAB);
    EXPECT(l.t, "<s>ab", 0, 1, 1, T_AB);
    /* Decoding keeps the first token's space when the file adds none. */
    DECODE(l.t, 0, " ab", T_SPAB);
    unload(&l);

    o.space_prefix = 1; /* the key set explicitly, as the default */
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "ab", 0, 0, T_SPAB);
    unload(&l);
}

static void test_spm_decode(void **state) {
    (void)state;
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&k_opts, &l, &err), ZI_OK);
    zi_tokenizer *t = l.t;
    /* One leading space of the first token goes (llama.cpp's detokenize). */
    DECODE(t, 0, "ab", T_SPAB);
    DECODE(t, 0, "ab ab", T_SPAB, T_SPAB);
    DECODE(t, 0, "a  b", T_SPA, T_SP, T_SP, T_B);
    /* After BOS the first token is BOS: nothing is dropped. */
    DECODE(t, 0, " ab", 1, T_SPAB);
    DECODE(t, 1, "<s> ab", 1, T_SPAB);
    DECODE(t, 0, "\xc3\xa9", BYTE(0xC3), BYTE(0xA9));
    DECODE(t, 0, "", 0);
    DECODE(t, 1, "<unk>", 0);
    DECODE(t, 0, "<u>", T_USER);
    char buf[16];
    assert_int_equal(zi_tokenizer_token_bytes(t, T_SPAB, 0, buf, sizeof buf), 3);
    assert_memory_equal(buf, " ab", 3);
    assert_int_equal(zi_tokenizer_token_bytes(t, BYTE(0x0A), 0, buf, sizeof buf), 1);
    assert_int_equal(buf[0], '\n');

    /* Streaming: a character spelled by byte tokens comes out whole. */
    zi_detok d;
    zi_detok_init(&d);
    char out[ZI_TOKEN_MAX_BYTES + 8];
    assert_int_equal(zi_detok_push(&d, t, T_SPA, 0, out, sizeof out), 2);
    assert_string_equal(out, " a");
    assert_int_equal(zi_detok_push(&d, t, BYTE(0xE2), 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_push(&d, t, BYTE(0x82), 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_push(&d, t, BYTE(0xAC), 0, out, sizeof out), 3);
    assert_string_equal(out, "\xe2\x82\xac");
    assert_int_equal(zi_detok_push(&d, t, BYTE(0xF0), 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_flush(&d, out, sizeof out), 1);
    unload(&l);
}

/* llama.cpp drops whitespace after Phi-3's special tokens (by general.name),
 * except after <unk>, <s> and <|endoftext|>. */
static void test_spm_phi3_rstrip(void **state) {
    (void)state;
    spm_opts o = k_opts;
    o.name = "Phi3-mini";
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "<|end|>  \n x", 0, 1, T_END, T_SP, T_X);
    EXPECT(l.t, "</s> x", 0, 1, 2, T_SP, T_X);
    EXPECT(l.t, "<s> x", 0, 1, 1, T_SP, T_SP, T_X);
    EXPECT(l.t, "<|end|>  \n x", 0, 0, T_SP, BYTE('<'), BYTE('|'), BYTE('e'), BYTE('n'), BYTE('d'),
           BYTE('|'), BYTE('>'), T_SP, T_SP, BYTE('\n'), T_SP, T_X);
    unload(&l);
    o.name = "my-PHI-3.5";
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "<|end|> x", 0, 1, T_END, T_SP, T_X);
    unload(&l);
    o.name = "phi-2";
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "<|end|> x", 0, 1, T_END, T_SP, T_SP, T_X);
    unload(&l);
}

static void expect_load_error(const spm_opts *o, int code, const char *needle) {
    loaded l;
    zi_error err = {0};
    assert_int_equal(load(o, &l, &err), code);
    assert_null(l.t);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message: %s\n", err.msg);
    assert_non_null(strstr(err.msg, needle));
    unload(&l);
}

static void test_spm_hostile(void **state) {
    (void)state;
    spm_opts o = k_opts;
    o.scores = 1;
    expect_load_error(&o, ZI_EFORMAT, "tokenizer.ggml.scores has 270 entries");
    o.scores = 3;
    expect_load_error(&o, ZI_EFORMAT, "tokenizer.ggml.scores has type");
    o = k_opts;
    o.huge = 1;
    expect_load_error(&o, ZI_ERANGE, "tokenizer.ggml.tokens[270]");
    o = k_opts;
    o.model = "t5"; /* UGM: not implemented */
    expect_load_error(&o, ZI_EUNSUPPORTED, "\"t5\"");

    /* int32 scores and no scores load (no scores: all 0, ties leftmost). */
    loaded l;
    zi_error err = {0};
    o = k_opts;
    o.scores = 2;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "ab", 0, 0, T_SPAB);
    unload(&l);
    o.scores = 4;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "abc", 0, 0, T_SPAB, T_C);
    unload(&l);
    /* NaN scores: some order, but a valid encoding in bounded time. */
    o.scores = 5;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(zi_tokenizer_encode(l.t, "aaaabcab cab", 12, 1, 1, &ids, &n, &err), ZI_OK);
    assert_true(n >= 2);
    free(ids);
    unload(&l);

    /* A byte with no token: the load succeeds (llama.cpp's does too), the
     * text that needs the byte is refused by name, other text encodes. */
    o = k_opts;
    o.drop_byte = 0xC3;
    assert_int_equal(load(&o, &l, &err), ZI_OK);
    EXPECT(l.t, "ab", 0, 0, T_SPAB);
    ids = NULL;
    assert_int_equal(zi_tokenizer_encode(l.t, "\xc3\xa9", 2, 0, 0, &ids, &n, &err), ZI_EFORMAT);
    assert_null(ids);
    assert_non_null(strstr(err.msg, "byte 0xC3"));
    unload(&l);
}

/* A cheap fuzz: the hand-made file with random bytes changed, 3000 times
 * (fixed seed). Whatever opens and loads must encode and decode without a
 * crash (run under ASan/UBSan to see more). */
static void test_spm_mutated(void **state) {
    (void)state;
    wbuf base = make_spm(&k_opts);
    uint8_t *buf = malloc(base.n);
    assert_non_null(buf);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    int loaded_ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, base.p, base.n);
        int flips = 1 + iter % 4;
        for (int k = 0; k < flips; k++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = (size_t)(rng >> 33) % base.n;
            buf[at] = (uint8_t)(rng >> 17);
        }
        zi_gguf *g = NULL;
        zi_tokenizer *t = NULL;
        zi_error err = {0};
        if (zi_gguf_open_memory(buf, base.n, &g, &err) != ZI_OK) continue;
        if (zi_tokenizer_load(g, &t, &err) == ZI_OK) {
            loaded_ok++;
            static const char text[] = "ab abc <s>aaa\xc3\xa9 <u>x</s>\xa9 <|end|> \n";
            int32_t *ids = NULL;
            size_t n = 0;
            if (zi_tokenizer_encode(t, text, sizeof text - 1, 1, iter & 1, &ids, &n, &err) ==
                ZI_OK) {
                char *out = NULL;
                size_t len = 0;
                assert_int_equal(zi_tokenizer_decode(t, ids, n, 1, &out, &len, &err), ZI_OK);
                free(out);
            }
            free(ids);
            zi_tokenizer_free(t);
        } else {
            assert_true(err.msg[0] != '\0');
        }
        zi_gguf_close(g);
    }
    assert_true(loaded_ok > 100); /* most single changes hit token text */
    free(buf);
    free(base.p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spm_encode),  cmocka_unit_test(test_spm_no_space_prefix),
        cmocka_unit_test(test_spm_decode),  cmocka_unit_test(test_spm_phi3_rstrip),
        cmocka_unit_test(test_spm_hostile), cmocka_unit_test(test_spm_mutated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
