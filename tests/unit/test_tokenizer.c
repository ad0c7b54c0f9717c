/*
 * test_tokenizer.c - cmocka tests for the BPE tokenizer (tokenizer_proc/).
 *
 * Three layers:
 *  - unicode.c on its own: codepoint flags (including codepoints new in
 *    Unicode 15, which llama.cpp's tables know) and the llama.cpp-compatible
 *    UTF-8 decoder on valid, invalid, overlong and truncated input;
 *  - a tiny synthetic vocabulary written as a GGUF file in memory, whose
 *    merge order, tie-breaking, virtual merges, special-token handling,
 *    BOS/EOS and load errors have hand-computed expectations;
 *  - the real model (ZINFER_MODEL or the default path; these tests are
 *    skipped when it is absent): ids llama.cpp produces for chosen strings,
 *    decoding and incremental decoding, bad ids, and the whole committed
 *    corpus tests/fixtures/tokenizer_corpus.jsonl (llama.cpp's ids, made by
 *    scripts/ref/make_tokenizer_fixture.py), checked in both modes together
 *    with decode round trips. Run from the repository root.
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
#include "gguf_writer.h"
#include "gpt2_bytes.h"
#include "tokenizer.h"
#include "tokenizer_expect.h"
#include "unicode.h"
#include "vendor_dir.h"

#define DEFAULT_MODEL "/root/.cache/zinfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define CORPUS "tests/fixtures/tokenizer_corpus.jsonl"

/* ---- unicode ---------------------------------------------------------- */

static void test_unicode_flags(void **state) {
    (void)state;
    assert_int_equal(zi_unicode_flags('A'), ZI_UC_LETTER);
    assert_int_equal(zi_unicode_flags('7'), ZI_UC_NUMBER);
    assert_int_equal(zi_unicode_flags(' '), ZI_UC_SEPARATOR | ZI_UC_WHITESPACE);
    assert_int_equal(zi_unicode_flags('\n'), ZI_UC_CONTROL | ZI_UC_WHITESPACE);
    assert_int_equal(zi_unicode_flags('$'), ZI_UC_SYMBOL);
    assert_int_equal(zi_unicode_flags('!'), ZI_UC_PUNCT);
    assert_int_equal(zi_unicode_flags(0x00B2), ZI_UC_NUMBER); /* superscript two */
    assert_int_equal(zi_unicode_flags(0x00BD), ZI_UC_NUMBER); /* one half */
    assert_int_equal(zi_unicode_flags(0x0663), ZI_UC_NUMBER); /* Arabic-Indic three */
    assert_int_equal(zi_unicode_flags(0x0301), ZI_UC_MARK);
    assert_int_equal(zi_unicode_flags(0x00E9), ZI_UC_LETTER);
    assert_int_equal(zi_unicode_flags(0x4E2D), ZI_UC_LETTER);
    assert_int_equal(zi_unicode_flags(0x00A0), ZI_UC_SEPARATOR | ZI_UC_WHITESPACE);
    assert_int_equal(zi_unicode_flags(0x3000), ZI_UC_SEPARATOR | ZI_UC_WHITESPACE);
    assert_int_equal(zi_unicode_flags(0x0085), ZI_UC_CONTROL | ZI_UC_WHITESPACE);
    assert_int_equal(zi_unicode_flags(0x200B), ZI_UC_CONTROL); /* Cf, not White_Space */
    assert_int_equal(zi_unicode_flags(0x1F600), ZI_UC_SYMBOL);
    assert_int_equal(zi_unicode_flags(0x1FAE8), ZI_UC_SYMBOL); /* new in Unicode 15.0 */
    assert_int_equal(zi_unicode_flags(0x31350), ZI_UC_LETTER); /* new in Unicode 15.0 */
    assert_int_equal(zi_unicode_flags(0x2EBF0), ZI_UC_LETTER); /* new in Unicode 15.1 */
    assert_int_equal(zi_unicode_flags(0x0378), ZI_UC_UNDEFINED);
    assert_int_equal(zi_unicode_flags(0xE000), ZI_UC_CONTROL);     /* private use */
    assert_int_equal(zi_unicode_flags(0xD800), ZI_UC_CONTROL);     /* surrogate */
    assert_int_equal(zi_unicode_flags(0x10FFFD), ZI_UC_CONTROL);   /* private use */
    assert_int_equal(zi_unicode_flags(0x10FFFF), ZI_UC_UNDEFINED); /* noncharacter */
    assert_int_equal(zi_unicode_flags(0x110000), ZI_UC_UNDEFINED);
    assert_int_equal(zi_unicode_flags(0xFFFFFFFFu), ZI_UC_UNDEFINED);
}

static void check_decode(const char *s, size_t n, uint32_t want_cp, size_t want_len) {
    uint32_t cp = 0;
    size_t l = zi_utf8_decode((const unsigned char *)s, n, &cp);
    assert_int_equal(cp, want_cp);
    assert_int_equal(l, want_len);
}

static void test_utf8_decode(void **state) {
    (void)state;
    check_decode("A", 1, 'A', 1);
    check_decode("\xc3\xa9", 2, 0xE9, 2);
    check_decode("\xe4\xb8\xad", 3, 0x4E2D, 3);
    check_decode("\xf0\x9f\xa6\x99", 4, 0x1F999, 4);
    check_decode("\xf4\x8f\xbf\xbf", 4, 0x10FFFF, 4);
    check_decode("\x80", 1, 0xFFFD, 1);                 /* stray continuation */
    check_decode("\xc3", 1, 0xFFFD, 1);                 /* truncated */
    check_decode("\xe4\xb8", 2, 0xFFFD, 1);             /* truncated */
    check_decode("\xc3\x41", 2, 0xFFFD, 1);             /* bad continuation */
    check_decode("\xc0\x80", 2, 0x0000, 2);             /* overlong: accepted */
    check_decode("\xe0\x80\xaf", 3, 0x002F, 3);         /* overlong: accepted */
    check_decode("\xed\xa0\x80", 3, 0xD800, 3);         /* surrogate: accepted */
    check_decode("\xf4\x90\x80\x80", 4, 0xFFFD, 1);     /* above U+10FFFF */
    check_decode("\xf8\x88\x80\x80\x80", 5, 0xFFFD, 1); /* 5-byte form */
    check_decode("\xff", 1, 0xFFFD, 1);
}

static void test_utf8_encode(void **state) {
    (void)state;
    unsigned char u[4];
    static const uint32_t cps[] = {0,      0x7F,   0x80,    0x7FF,   0x800,   0xD800,
                                   0xFFFD, 0xFFFF, 0x10000, 0x1F999, 0x10FFFF};
    for (size_t i = 0; i < sizeof cps / sizeof *cps; i++) {
        size_t l = zi_utf8_encode(cps[i], u);
        assert_true(l >= 1 && l <= 4);
        uint32_t back;
        assert_int_equal(zi_utf8_decode(u, l, &back), l);
        assert_int_equal(back, cps[i]);
    }
    assert_int_equal(zi_utf8_encode(0x110000, u), 0);
    assert_int_equal(zi_utf8_lead_len('a'), 1);
    assert_int_equal(zi_utf8_lead_len(0x80), 0);
    assert_int_equal(zi_utf8_lead_len(0xC3), 2);
    assert_int_equal(zi_utf8_lead_len(0xE4), 3);
    assert_int_equal(zi_utf8_lead_len(0xF0), 4);
    assert_int_equal(zi_utf8_lead_len(0xFF), 0);
}

/* Synthetic vocabulary: ids 0..255 are the byte characters (id == byte),
 * then the tokens below. */
enum {
    T_AB = 256,
    T_BC,
    T_ABC,
    T_AA,
    T_AAAA,
    T_XYZ,
    T_SPA,
    T_12,
    T_CTRL,
    T_USER,
    T_EOS,
    T_BOS,
    T_EXTRA_END
};
static const char *const k_extra[] = {"ab",
                                      "bc",
                                      "abc",
                                      "aa",
                                      "aaaa",
                                      "xyz",
                                      ("\xc4\xa0" /* the escape ends here */
                                       "a"),
                                      "12",
                                      "<s>",
                                      "<u>",
                                      "</end>",
                                      "<bos>"};
/* "x y" makes a string that is no token; "xy z" then reaches one. */
static const char *const k_merges[] = {"a b", "b c",  "ab c",       "a a", "aa aa",
                                       "x y", "xy z", "\xc4\xa0 a", "1 2"};

typedef struct synth_opts {
    const char *model, *pre;
    const char *bad_merge; /* appended to the merges when set */
    int drop_type;         /* token_type one entry short */
    uint32_t bos;          /* UINT32_MAX: no key */
    int add_bos, add_eos;
} synth_opts;

static const synth_opts k_default_opts = {"gpt2", "smollm", NULL, 0, T_BOS, 0, 0};

static wbuf make_synth(const synth_opts *o) {
    static char chars[256][4];
    const char *toks[T_EXTRA_END];
    int32_t types[T_EXTRA_END];
    for (unsigned b = 0; b < 256; b++) {
        zi_test_gpt2_byte_char(b, chars[b]);
        toks[b] = chars[b];
        types[b] = ZI_TOKEN_NORMAL;
    }
    for (int i = T_AB; i < T_EXTRA_END; i++) {
        toks[i] = k_extra[i - T_AB];
        types[i] = ZI_TOKEN_NORMAL;
    }
    types[T_CTRL] = ZI_TOKEN_CONTROL;
    types[T_USER] = ZI_TOKEN_USER_DEFINED;
    types[T_EOS] = ZI_TOKEN_CONTROL;
    types[T_BOS] = ZI_TOKEN_CONTROL;
    const char *merges[16];
    size_t nm = sizeof k_merges / sizeof *k_merges;
    memcpy(merges, k_merges, sizeof k_merges);
    if (o->bad_merge) merges[nm++] = o->bad_merge;

    wbuf b = {0};
    uint64_t n_kv = 6 + (o->bos != UINT32_MAX);
    w_bytes(&b, "GGUF", 4);
    w_u32(&b, 3);
    w_u64(&b, 0);
    w_u64(&b, n_kv);
    kv_str(&b, "tokenizer.ggml.model", o->model);
    kv_str(&b, "tokenizer.ggml.pre", o->pre);
    kv_strs(&b, "tokenizer.ggml.tokens", toks, T_EXTRA_END);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, T_EXTRA_END - (o->drop_type ? 1 : 0));
    kv_strs(&b, "tokenizer.ggml.merges", merges, nm);
    if (o->bos != UINT32_MAX) kv_u32(&b, "tokenizer.ggml.bos_token_id", o->bos);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", T_EOS);
    return b;
}

/* make_synth plus add_bos/add_eos keys (needs a rebuilt header count). */
static wbuf make_synth_add(const synth_opts *o) {
    wbuf b = make_synth(o);
    uint64_t n_kv;
    memcpy(&n_kv, b.p + 16, 8);
    n_kv += 2;
    memcpy(b.p + 16, &n_kv, 8);
    kv_bool(&b, "tokenizer.ggml.add_bos_token", o->add_bos);
    kv_bool(&b, "tokenizer.ggml.add_eos_token", o->add_eos);
    return b;
}

static int load_synth(wbuf *b, zi_gguf **g, zi_tokenizer **t, zi_error *err) {
    int rc = zi_gguf_open_memory(b->p, b->n, g, err);
    assert_int_equal(rc, ZI_OK);
    return zi_tokenizer_load(*g, t, err);
}

#define EXPECT(t, s, addsp, parsesp, ...)                                                          \
    do {                                                                                           \
        static const int32_t want_[] = {__VA_ARGS__};                                              \
        zi_expect_ids(t, s, sizeof(s) - 1, addsp, parsesp, want_, sizeof want_ / sizeof *want_);   \
    } while (0)

static void test_synth_bpe(void **state) {
    (void)state;
    wbuf b = make_synth(&k_default_opts);
    zi_gguf *g;
    zi_tokenizer *t;
    zi_error err = {0};
    assert_int_equal(load_synth(&b, &g, &t, &err), ZI_OK);
    assert_int_equal(zi_tokenizer_vocab_size(t), T_EXTRA_END);
    assert_int_equal(zi_tokenizer_bos(t), T_BOS);
    assert_int_equal(zi_tokenizer_eos(t), T_EOS);

    EXPECT(t, "abc", 0, 0, T_ABC);     /* a+b (rank 0), then ab+c (rank 2) */
    EXPECT(t, "bcd", 0, 0, T_BC, 'd'); /* nothing merges with "d" */
    EXPECT(t, "aaa", 0, 0, T_AA, 'a'); /* equal ranks: leftmost first */
    EXPECT(t, "aaaa", 0, 0, T_AAAA);   /* aa+aa */
    EXPECT(t, "aaaaa", 0, 0, T_AAAA, 'a');
    EXPECT(t, "xyz", 0, 0, T_XYZ);         /* through the non-token "xy" */
    EXPECT(t, "xy", 0, 0, 'x', 'y');       /* "xy" is no token: byte fallback */
    EXPECT(t, " a", 0, 0, T_SPA);          /* space maps to U+0120 */
    EXPECT(t, "a b", 0, 0, 'a', ' ', 'b'); /* no merge for space + b */
    /* digits are split one by one ("smollm"), so "1 2" never merges */
    EXPECT(t, "a12", 0, 0, 'a', '1', '2');
    /* user-defined tokens always match; control ones only with parse_special */
    EXPECT(t, "ab<u>c", 0, 0, T_AB, T_USER, 'c');
    EXPECT(t, "ab<s>c", 0, 0, T_AB, '<', 's', '>', 'c');
    EXPECT(t, "ab<s>c", 0, 1, T_AB, T_CTRL, 'c');
    EXPECT(t, "<s><s>", 0, 1, T_CTRL, T_CTRL);
    /* add_special without add_bos/add_eos in the file adds nothing */
    EXPECT(t, "ab", 1, 0, T_AB);

    int32_t *ids;
    size_t n;
    assert_int_equal(zi_tokenizer_encode(t, "", 0, 1, 1, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, 0);
    free(ids);

    /* decoding: control tokens only with special; user-defined always */
    char *out;
    size_t len;
    const int32_t seq[] = {T_AB, T_CTRL, T_USER, T_SPA, ' '};
    assert_int_equal(zi_tokenizer_decode(t, seq, 5, 0, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "ab<u> a ");
    free(out);
    assert_int_equal(zi_tokenizer_decode(t, seq, 5, 1, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "ab<s><u> a ");
    assert_int_equal(len, 11);
    free(out);
    assert_int_equal(zi_tokenizer_token_type(t, T_CTRL), ZI_TOKEN_CONTROL);
    assert_int_equal(zi_tokenizer_token_type(t, T_USER), ZI_TOKEN_USER_DEFINED);
    assert_int_equal(zi_tokenizer_token_type(t, 'a'), ZI_TOKEN_NORMAL);
    assert_int_equal(zi_tokenizer_token_type(t, T_EXTRA_END), -1);
    assert_true(zi_tokenizer_is_eog(t, T_EOS));
    assert_false(zi_tokenizer_is_eog(t, T_BOS));
    assert_false(zi_tokenizer_is_eog(t, -1));

    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(b.p);
}

static void test_synth_add_special(void **state) {
    (void)state;
    synth_opts o = k_default_opts;
    o.add_bos = 1;
    o.add_eos = 1;
    wbuf b = make_synth_add(&o);
    zi_gguf *g;
    zi_tokenizer *t;
    zi_error err = {0};
    assert_int_equal(load_synth(&b, &g, &t, &err), ZI_OK);
    EXPECT(t, "ab", 1, 0, T_BOS, T_AB, T_EOS);
    EXPECT(t, "ab", 0, 0, T_AB);
    EXPECT(t, "", 1, 0, T_BOS, T_EOS);
    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(b.p);

    /* add_bos_token without a bos id is inconsistent */
    o.bos = UINT32_MAX;
    b = make_synth_add(&o);
    assert_int_equal(load_synth(&b, &g, &t, &err), ZI_EFORMAT);
    assert_non_null(strstr(err.msg, "add_bos_token"));
    zi_gguf_close(g);
    free(b.p);
}

static void expect_load_error(const synth_opts *o, int code, const char *needle) {
    wbuf b = make_synth(o);
    zi_gguf *g;
    zi_tokenizer *t = (zi_tokenizer *)&b; /* must be reset to NULL */
    zi_error err = {0};
    assert_int_equal(load_synth(&b, &g, &t, &err), code);
    assert_null(t);
    if (!strstr(err.msg, needle)) fprintf(stderr, "message: %s\n", err.msg);
    assert_non_null(strstr(err.msg, needle));
    zi_gguf_close(g);
    free(b.p);
}

static void test_synth_load_errors(void **state) {
    (void)state;
    synth_opts o = k_default_opts;
    o.model = "t5"; /* llama.cpp's UGM: not implemented */
    expect_load_error(&o, ZI_EUNSUPPORTED, "\"t5\"");
    o = k_default_opts;
    o.pre = "tekken";
    expect_load_error(&o, ZI_EUNSUPPORTED, "\"tekken\"");
    o.pre = "no-such-pre";
    expect_load_error(&o, ZI_EUNSUPPORTED, "\"no-such-pre\"");
    o = k_default_opts;
    o.bad_merge = "abc";
    expect_load_error(&o, ZI_EFORMAT, "merges[9]");
    o = k_default_opts;
    o.drop_type = 1;
    expect_load_error(&o, ZI_EFORMAT, "token_type");
    o = k_default_opts;
    o.bos = 100000;
    expect_load_error(&o, ZI_EFORMAT, "bos_token_id");

    /* the plain GPT-2 pre-tokenizer keeps digit runs together */
    o = k_default_opts;
    o.pre = "gpt2";
    wbuf b = make_synth(&o);
    zi_gguf *g;
    zi_tokenizer *t;
    zi_error err = {0};
    assert_int_equal(load_synth(&b, &g, &t, &err), ZI_OK);
    EXPECT(t, "a12", 0, 0, 'a', T_12);
    EXPECT(t, "a 12", 0, 0, 'a', ' ', T_12); /* " 12" is one piece; no merge with space */
    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(b.p);
}

/* ---- the real model ------------------------------------------------------ */

typedef struct real_state {
    zi_gguf *g;
    zi_tokenizer *t;
} real_state;

static int real_setup(void **state) {
    static real_state rs;
    const char *path = getenv("ZINFER_MODEL");
    if (!path || !*path) path = DEFAULT_MODEL;
    zi_error err = {0};
    rs.g = NULL;
    rs.t = NULL;
    if (zi_gguf_open(path, &rs.g, &err) == ZI_OK) {
        if (zi_tokenizer_load(rs.g, &rs.t, &err) != ZI_OK) {
            fprintf(stderr, "loading the tokenizer of %s: %s\n", path, err.msg);
            return -1;
        }
    } else {
        fprintf(stderr, "model %s not available (%s): real-model tests skipped\n", path, err.msg);
    }
    *state = &rs;
    return 0;
}

static int real_teardown(void **state) {
    real_state *rs = *state;
    zi_tokenizer_free(rs->t);
    zi_gguf_close(rs->g);
    return 0;
}

static zi_tokenizer *real_tok(void **state) {
    real_state *rs = *state;
    if (!rs->t) skip();
    return rs->t;
}

/* Expected ids below were produced by llama.cpp (llama-cpp-python,
 * vocab_only, add_bos=False) for the default model. */
static void test_real_known_ids(void **state) {
    zi_tokenizer *t = real_tok(state);
    assert_int_equal(zi_tokenizer_vocab_size(t), 49152);
    assert_int_equal(zi_tokenizer_bos(t), 1);
    assert_int_equal(zi_tokenizer_eos(t), 2);
    EXPECT(t, "Hello world", 0, 0, 19556, 905);
    EXPECT(t, "Hello world", 1, 0, 19556, 905); /* add_bos_token is false */
    EXPECT(t, "I'm 12345 years' old", 0, 0, 57, 5248, 216, 33, 34, 35, 36, 37, 929, 23, 1573);
    EXPECT(t, "<|im_start|>user\nhi<|im_end|>", 0, 0, 44, 108, 306, 79, 3738, 108, 46, 4093, 198,
           6004, 44, 108, 306, 79, 486, 108, 46);
    EXPECT(t, "<|im_start|>user\nhi<|im_end|>", 0, 1, 1, 4093, 198, 6004, 2);
    EXPECT(t, "<|im_", 0, 1, 44, 108, 306, 79);
    EXPECT(t, "na\xc3\xafve caf\xc3\xa9 \xe5\x8c\x97\xe4\xba\xac \xc2\xbd \xc2\xb2", 0, 0, 3546,
           46494, 37366, 13223, 230, 241, 16736, 122, 216, 16738, 216, 19133);
    EXPECT(t, "\xf0\x9f\xa6\x99", 0, 0, 10813, 116, 243);
    EXPECT(t, "  a  1\n\n b", 0, 0, 216, 253, 256, 33, 1116, 278);
    EXPECT(t, "\xc2\xa0\xe3\x80\x80", 0, 0, 15442, 12109, 218);
    EXPECT(t, "e\xcc\x81", 0, 0, 85, 151, 219);
    EXPECT(t, "\xf0\x9f\xab\xa8", 0, 0, 10813, 121, 118); /* Unicode 15.0 symbol */
}

static void test_real_invalid_utf8(void **state) {
    zi_tokenizer *t = real_tok(state);
    /* invalid bytes become U+FFFD (24211 is its token), as in llama.cpp */
    EXPECT(t,
           "\xff\xfe"
           "ab",
           0, 0, 24211, 24211, 369);
    EXPECT(t, "\xe4\xb8", 0, 0, 24211, 24211);
    /* an overlong NUL is re-encoded as a real NUL (190) */
    EXPECT(t,
           "a\xc0\x80"
           "b",
           0, 0, 81, 190, 82);
    EXPECT(t, "a\0b", 0, 0, 81, 190, 82);
    /* bytes whose GPT-2 character is not in this vocabulary (0x04, 0x16, ...)
     * have no token at all: llama.cpp drops them, and so must we */
    EXPECT(t,
           "a\x16"
           "b",
           0, 0, 81, 82);
    int32_t *ids;
    size_t n;
    zi_error err = {0};
    assert_int_equal(zi_tokenizer_encode(t, "\x04\x04", 2, 0, 0, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, 0);
    free(ids);
    /* a surrogate's bytes pass through */
    EXPECT(t, "x\xed\xa0\x80y", 0, 0, 104, 184, 250, 218, 105);
}

static void test_real_decode(void **state) {
    zi_tokenizer *t = real_tok(state);
    char buf[64];
    assert_int_equal(zi_tokenizer_token_bytes(t, 19556, 0, buf, sizeof buf), 5);
    assert_memory_equal(buf, "Hello", 5);
    assert_int_equal(zi_tokenizer_token_bytes(t, 216, 0, buf, sizeof buf), 1);
    assert_int_equal(buf[0], ' ');
    assert_int_equal(zi_tokenizer_token_bytes(t, 2, 0, buf, sizeof buf), 0);
    assert_int_equal(zi_tokenizer_token_bytes(t, 2, 1, buf, sizeof buf), 10);
    assert_memory_equal(buf, "<|im_end|>", 10);
    /* too small a buffer: the full length is still returned */
    assert_int_equal(zi_tokenizer_token_bytes(t, 2, 1, buf, 3), 10);
    assert_int_equal(zi_tokenizer_token_bytes(t, 2, 1, NULL, 0), 10);
    assert_int_equal(zi_tokenizer_token_bytes(t, 10813, 0, buf, sizeof buf), 2);
    assert_memory_equal(buf, "\xf0\x9f", 2);
    /* bad ids */
    assert_int_equal(zi_tokenizer_token_bytes(t, -1, 1, buf, sizeof buf), -1);
    assert_int_equal(zi_tokenizer_token_bytes(t, 49152, 1, buf, sizeof buf), -1);
    char *out;
    size_t len;
    zi_error err = {0};
    const int32_t bad[] = {19556, 905, 49152};
    assert_int_equal(zi_tokenizer_decode(t, bad, 3, 0, &out, &len, &err), ZI_EINVAL);
    assert_null(out);
    assert_non_null(strstr(err.msg, "ids[2]"));
    const int32_t good[] = {1, 4093, 198, 6004, 2};
    assert_int_equal(zi_tokenizer_decode(t, good, 5, 1, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "<|im_start|>user\nhi<|im_end|>");
    free(out);
    assert_int_equal(zi_tokenizer_decode(t, good, 5, 0, &out, &len, &err), ZI_OK);
    assert_string_equal(out, "user\nhi");
    free(out);
    assert_int_equal(zi_tokenizer_decode(t, good, 0, 0, &out, &len, &err), ZI_OK);
    assert_int_equal(len, 0);
    assert_string_equal(out, "");
    free(out);

    assert_int_equal(zi_tokenizer_token_type(t, 0), ZI_TOKEN_CONTROL);
    assert_int_equal(zi_tokenizer_token_type(t, 19556), ZI_TOKEN_NORMAL);
    /* llama.cpp's end-of-generation set for this file is exactly {0, 2, 4}:
     * <|endoftext|>, <|im_end|> (the eos) and <reponame> (a FIM token) */
    int32_t n_eog = 0;
    for (int32_t id = 0; id < zi_tokenizer_vocab_size(t); id++) n_eog += zi_tokenizer_is_eog(t, id);
    assert_int_equal(n_eog, 3);
    assert_true(zi_tokenizer_is_eog(t, 0));
    assert_true(zi_tokenizer_is_eog(t, 2));
    assert_true(zi_tokenizer_is_eog(t, 4));
    assert_false(zi_tokenizer_is_eog(t, 49152));
}

static void test_real_detok_stream(void **state) {
    zi_tokenizer *t = real_tok(state);
    zi_detok d;
    char out[1024];
    zi_detok_init(&d);
    /* U+1F999 arrives as three tokens: F0 9F | A6 | 99 */
    assert_int_equal(zi_detok_push(&d, t, 10813, 0, out, sizeof out), 0);
    assert_string_equal(out, "");
    assert_int_equal(zi_detok_push(&d, t, 116, 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_push(&d, t, 243, 0, out, sizeof out), 4);
    assert_string_equal(out, "\xf0\x9f\xa6\x99");
    /* "北京 café": E5 8C | 97 | E4 BA | AC | " café" */
    const int32_t ids[] = {30158, 241, 16736, 122, 37366};
    const int want[] = {0, 3, 0, 3, 6};
    for (int i = 0; i < 5; i++)
        assert_int_equal(zi_detok_push(&d, t, ids[i], 0, out, 1024), want[i]);
    assert_string_equal(out, " caf\xc3\xa9");
    /* an unfinished character is released raw by flush */
    assert_int_equal(zi_detok_push(&d, t, 10813, 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_flush(&d, out, sizeof out), 2);
    assert_memory_equal(out, "\xf0\x9f", 2);
    assert_int_equal(zi_detok_flush(&d, out, sizeof out), 0);
    /* a stray continuation byte is not held back */
    assert_int_equal(zi_detok_push(&d, t, 116, 0, out, sizeof out), 1);
    /* control tokens follow `special` */
    assert_int_equal(zi_detok_push(&d, t, 2, 0, out, sizeof out), 0);
    assert_int_equal(zi_detok_push(&d, t, 2, 1, out, sizeof out), 10);
    assert_string_equal(out, "<|im_end|>");
    /* bad id, too small a buffer */
    assert_int_equal(zi_detok_push(&d, t, 49152, 0, out, sizeof out), -1);
    assert_int_equal(zi_detok_push(&d, t, 19556, 0, out, 5), -1);
    assert_int_equal(zi_detok_push(&d, t, 19556, 0, out, 6), 5);
}

/* ---- the llama.cpp corpus ------------------------------------------------ */

/* A minimal reader for the fixture's lines: one object with string and
 * integer-array members. Returns 0 on success. */
typedef struct jrec {
    char *text;
    size_t text_len;
    int32_t *ids[2]; /* plain, special */
    size_t n_ids[2];
} jrec;

static const char *j_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static int j_hex4(const char *p, uint32_t *v) {
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Parses a JSON string at p (at the opening quote) into a malloc'd buffer. */
static const char *j_string(const char *p, char **out, size_t *len) {
    if (*p != '"') return NULL;
    p++;
    size_t cap = strlen(p) + 1, n = 0;
    char *s = malloc(cap);
    if (!s) return NULL;
    while (*p && *p != '"') {
        if (*p != '\\') {
            s[n++] = *p++;
            continue;
        }
        p++;
        char c = *p++;
        uint32_t cp;
        switch (c) {
        case 'n':
            s[n++] = '\n';
            break;
        case 't':
            s[n++] = '\t';
            break;
        case 'r':
            s[n++] = '\r';
            break;
        case 'b':
            s[n++] = '\b';
            break;
        case 'f':
            s[n++] = '\f';
            break;
        case '"':
        case '\\':
        case '/':
            s[n++] = c;
            break;
        case 'u':
            if (j_hex4(p, &cp)) goto bad;
            p += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && p[0] == '\\' && p[1] == 'u') {
                uint32_t lo;
                if (j_hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            n += zi_utf8_encode(cp, (unsigned char *)s + n);
            break;
        default:
            goto bad;
        }
    }
    if (*p != '"') goto bad;
    s[n] = '\0';
    *out = s;
    *len = n;
    return p + 1;
bad:
    free(s);
    return NULL;
}

static const char *j_int_array(const char *p, int32_t **out, size_t *n) {
    if (*p != '[') return NULL;
    p = j_ws(p + 1);
    size_t cap = 16;
    *n = 0;
    *out = malloc(cap * sizeof **out);
    if (!*out) return NULL;
    while (*p != ']') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return NULL;
        if (*n == cap) {
            cap *= 2;
            *out = realloc(*out, cap * sizeof **out);
            if (!*out) return NULL;
        }
        (*out)[(*n)++] = (int32_t)v;
        p = j_ws(end);
        if (*p == ',')
            p = j_ws(p + 1);
        else if (*p != ']')
            return NULL;
    }
    return p + 1;
}

static int j_record(const char *p, jrec *r) {
    memset(r, 0, sizeof *r);
    p = j_ws(p);
    if (*p++ != '{') return -1;
    for (;;) {
        p = j_ws(p);
        char *key;
        size_t kl;
        p = j_string(p, &key, &kl);
        if (!p) return -1;
        p = j_ws(p);
        if (*p++ != ':') {
            free(key);
            return -1;
        }
        p = j_ws(p);
        if (strcmp(key, "text") == 0)
            p = j_string(p, &r->text, &r->text_len);
        else if (strcmp(key, "plain") == 0)
            p = j_int_array(p, &r->ids[0], &r->n_ids[0]);
        else if (strcmp(key, "special") == 0)
            p = j_int_array(p, &r->ids[1], &r->n_ids[1]);
        else
            p = NULL;
        free(key);
        if (!p) return -1;
        p = j_ws(p);
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '}') break;
        return -1;
    }
    return r->text && r->ids[0] && r->ids[1] ? 0 : -1;
}

static void j_free(jrec *r) {
    free(r->text);
    free(r->ids[0]);
    free(r->ids[1]);
}

/* Feeds ids through zi_detok one at a time; checks that every chunk ends on
 * a UTF-8 character boundary when the text is valid and that the chunks add
 * up to want. Returns 0 when all holds. */
static int stream_matches(zi_tokenizer *t, const int32_t *ids, size_t n, int special,
                          const char *want, size_t want_len) {
    zi_detok d;
    zi_detok_init(&d);
    char chunk[2048];
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        int k = i < n ? zi_detok_push(&d, t, ids[i], special, chunk, sizeof chunk)
                      : zi_detok_flush(&d, chunk, sizeof chunk);
        if (k < 0 || at + (size_t)k > want_len || memcmp(want + at, chunk, (size_t)k) != 0)
            return -1;
        at += (size_t)k;
        /* the next byte of the text must start a character */
        if (k > 0 && at < want_len && (want[at] & 0xC0) == 0x80) return -1;
    }
    return at == want_len ? 0 : -1;
}

static void test_real_corpus(void **state) {
    zi_tokenizer *t = real_tok(state);
    FILE *f = fopen(CORPUS, "r");
    if (!f) fail_msg("cannot open %s (run the tests from the repository root)", CORPUS);
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    assert_non_null(line);
    size_t n_rec = 0, mismatch[2] = {0, 0}, roundtrip_fail = 0, stream_fail = 0;
    size_t n_tokens = 0;
    while (fgets(line, (int)cap, f)) {
        size_t ll = strlen(line);
        while (ll == cap - 1 && line[ll - 1] != '\n') {
            cap *= 2;
            line = realloc(line, cap);
            assert_non_null(line);
            if (!fgets(line + ll, (int)(cap - ll), f)) break;
            ll += strlen(line + ll);
        }
        if (j_ws(line)[0] == '\0') continue;
        jrec r;
        if (j_record(line, &r) != 0)
            fail_msg("%s: line %zu is not a fixture record", CORPUS, n_rec + 1);
        n_rec++;
        for (int mode = 0; mode < 2; mode++) {
            int32_t *ids;
            size_t n;
            zi_error err = {0};
            assert_int_equal(zi_tokenizer_encode(t, r.text, r.text_len, 0, mode, &ids, &n, &err),
                             ZI_OK);
            n_tokens += n;
            if (n != r.n_ids[mode] || memcmp(ids, r.ids[mode], n * sizeof *ids) != 0) {
                if (mismatch[0] + mismatch[1] < 10)
                    fprintf(stderr, "corpus line %zu (%s): ids differ from llama.cpp for %s\n",
                            n_rec, mode ? "special" : "plain", r.text);
                mismatch[mode]++;
            }
            /* decoding gives the text back: in plain mode control-token
             * text was encoded as ordinary text, so special=0 suffices */
            char *out;
            size_t len;
            assert_int_equal(zi_tokenizer_decode(t, ids, n, mode, &out, &len, &err), ZI_OK);
            if (len != r.text_len || memcmp(out, r.text, len) != 0) {
                if (roundtrip_fail < 10)
                    fprintf(stderr, "corpus line %zu: decode round trip failed for %s\n", n_rec,
                            r.text);
                roundtrip_fail++;
            }
            free(out);
            if (stream_matches(t, ids, n, mode, r.text, r.text_len) != 0) {
                if (stream_fail < 10)
                    fprintf(stderr, "corpus line %zu: streaming decode failed for %s\n", n_rec,
                            r.text);
                stream_fail++;
            }
            free(ids);
        }
        j_free(&r);
    }
    fclose(f);
    free(line);
    fprintf(stderr,
            "tokenizer corpus: %zu strings, %zu tokens; mismatches plain=%zu special=%zu, "
            "round-trip failures=%zu, streaming failures=%zu\n",
            n_rec, n_tokens, mismatch[0], mismatch[1], roundtrip_fail, stream_fail);
    assert_true(n_rec >= 2000);
    assert_int_equal(mismatch[0], 0);
    assert_int_equal(mismatch[1], 0);
    assert_int_equal(roundtrip_fail, 0);
    assert_int_equal(stream_fail, 0);
}

/* The vocabulary-only load (the worker's, which links no regex engine)
 * gives every token the same type and bytes as the full load, and the
 * same special ids; it refuses to encode. Checked on the default model and
 * on llama.cpp's vendored vocabularies when present (SentencePiece and
 * WordPiece among them). */
static void check_vocab_only(const char *path) {
    zi_error err = {0};
    zi_gguf *g = NULL;
    if (zi_gguf_open(path, &g, &err) != ZI_OK) return;
    zi_tokenizer *full = NULL, *voc = NULL;
    if (zi_tokenizer_load(g, &full, &err) != ZI_OK) { /* a family zinfer refuses */
        zi_gguf_close(g);
        return;
    }
    assert_int_equal(zi_tokenizer_load_vocab(g, &voc, &err), ZI_OK);
    int32_t V = zi_tokenizer_vocab_size(full);
    assert_int_equal(zi_tokenizer_vocab_size(voc), V);
    assert_int_equal(zi_tokenizer_bos(voc), zi_tokenizer_bos(full));
    assert_int_equal(zi_tokenizer_eos(voc), zi_tokenizer_eos(full));
    static char a[ZI_TOKEN_MAX_BYTES + 16], b[ZI_TOKEN_MAX_BYTES + 16];
    for (int32_t id = 0; id < V; id++) {
        assert_int_equal(zi_tokenizer_token_type(voc, id), zi_tokenizer_token_type(full, id));
        assert_int_equal(zi_tokenizer_is_eog(voc, id), zi_tokenizer_is_eog(full, id));
        for (int special = 0; special < 2; special++) {
            int na = zi_tokenizer_token_bytes(full, id, special, a, sizeof a);
            int nb = zi_tokenizer_token_bytes(voc, id, special, b, sizeof b);
            assert_int_equal(na, nb);
            if (na > 0) assert_memory_equal(a, b, (size_t)na);
        }
        assert_int_equal(zi_tokenizer_constraint_bytes(voc, id, b, sizeof b),
                         zi_tokenizer_token_type(full, id) == ZI_TOKEN_CONTROL
                             ? 0
                             : zi_tokenizer_token_bytes(full, id, 0, a, sizeof a));
    }
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(zi_tokenizer_encode(voc, "hi", 2, 0, 0, &ids, &n, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "vocabulary only"));
    assert_null(ids);
    zi_tokenizer_free(voc);
    zi_tokenizer_free(full);
    zi_gguf_close(g);
}

static void test_real_vocab_only(void **state) {
    real_tok(state);
    const char *path = getenv("ZINFER_MODEL");
    check_vocab_only(path && *path ? path : DEFAULT_MODEL);
    char dir[512];
    zi_test_vendor_dir(dir, sizeof dir, "");
    static const char *const names[] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-bert-bge.gguf",
                                        "ggml-vocab-falcon.gguf", "ggml-vocab-qwen2.gguf"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        check_vocab_only(p);
    }
}

int main(void) {
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_unicode_flags),     cmocka_unit_test(test_utf8_decode),
        cmocka_unit_test(test_utf8_encode),       cmocka_unit_test(test_synth_bpe),
        cmocka_unit_test(test_synth_add_special), cmocka_unit_test(test_synth_load_errors),
    };
    const struct CMUnitTest real[] = {
        cmocka_unit_test(test_real_known_ids), cmocka_unit_test(test_real_invalid_utf8),
        cmocka_unit_test(test_real_decode),    cmocka_unit_test(test_real_detok_stream),
        cmocka_unit_test(test_real_corpus),    cmocka_unit_test(test_real_vocab_only),
    };
    int rc = cmocka_run_group_tests_name("tokenizer", unit, NULL, NULL);
    rc |= cmocka_run_group_tests_name("tokenizer_real_model", real, real_setup, real_teardown);
    return rc;
}
