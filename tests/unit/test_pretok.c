/*
 * test_pretok.c - cmocka tests for the pre-tokenizers (tokenizer_pretok.c,
 * tokenizer_regex.c), white-box: through tok_pretok_split, the hook that
 * returns the pieces instead of encoding them.
 *
 * A synthetic byte-level vocabulary is written as a GGUF file in memory
 * with each tokenizer.ggml.pre value under test; the pieces do not depend
 * on the vocabulary. The expected splits are worked out by hand from the
 * regexes llama.cpp lists for each name (src/llama-vocab.cpp) and its rules
 * for running them (unicode.cpp), including its quirks: non-ASCII
 * whitespace is U+000B to its regexes, so U+3000 leaves the deepseek-llm
 * punctuation class that names it. Also: names refused with a one-line
 * error, hostile text (long runs of one class, invalid UTF-8) that must
 * split in linear time without a crash, and gpt-oss's marker tokens, whose
 * attributes llama.cpp sets by their text.
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

#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "gpt2_bytes.h"
#include "tokenizer.h"
#include "tokenizer_impl.h"
#include "unicode.h"

/* gpt-oss's marker tokens (ids 257.., all CONTROL in the file), for
 * make_vocab_full's with_markers; <|return|> is the EOS. */
static const char *const k_markers[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>",
                                        "<|end|>",   "<|return|>",  "<|call|>"};
enum { N_MARKERS = 7, T_START = 257, T_CHANNEL, T_MESSAGE, T_CONSTRAIN, T_END, T_RETURN, T_CALL };

/* 256 byte tokens and "ab" (id 256, also the BOS id when with_bos), then
 * the k_markers when with_markers; pre NULL leaves the key out. */
static wbuf make_vocab_full(const char *pre, int with_bos, int with_markers) {
    static char chars[256][4];
    const char *toks[257 + N_MARKERS];
    int32_t types[257 + N_MARKERS];
    for (unsigned b = 0; b < 256; b++) {
        zi_test_gpt2_byte_char(b, chars[b]);
        toks[b] = chars[b];
        types[b] = ZI_TOKEN_NORMAL;
    }
    toks[256] = "ab";
    types[256] = ZI_TOKEN_NORMAL;
    size_t n_toks = 257;
    for (size_t i = 0; with_markers && i < N_MARKERS; i++) {
        toks[n_toks] = k_markers[i];
        types[n_toks++] = ZI_TOKEN_CONTROL;
    }
    static const char *const merges[] = {"a b"};
    wbuf b = {0};
    w_bytes(&b, "GGUF", 4);
    w_u32(&b, 3);
    w_u64(&b, 0);
    w_u64(&b, 4 + (pre != NULL) + (with_bos != 0) + (with_markers != 0));
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(&b, "tokenizer.ggml.pre", pre);
    kv_strs(&b, "tokenizer.ggml.tokens", toks, n_toks);
    kv_i32s(&b, "tokenizer.ggml.token_type", types, n_toks);
    kv_strs(&b, "tokenizer.ggml.merges", merges, 1);
    if (with_bos) kv_u32(&b, "tokenizer.ggml.bos_token_id", 256);
    if (with_markers) kv_u32(&b, "tokenizer.ggml.eos_token_id", T_RETURN);
    return b;
}

static wbuf make_vocab_bos(const char *pre, int with_bos) {
    return make_vocab_full(pre, with_bos, 0);
}

static wbuf make_vocab(const char *pre) {
    return make_vocab_bos(pre, 0);
}

typedef struct loaded {
    wbuf b;
    zi_gguf *g;
    zi_tokenizer *t;
} loaded;

static loaded load(const char *pre) {
    loaded l = {make_vocab(pre), NULL, NULL};
    zi_error err = {0};
    assert_int_equal(zi_gguf_open_memory(l.b.p, l.b.n, &l.g, &err), ZI_OK);
    int rc = zi_tokenizer_load(l.g, &l.t, &err);
    if (rc) fprintf(stderr, "pre %s: %s\n", pre ? pre : "(none)", err.msg);
    assert_int_equal(rc, ZI_OK);
    return l;
}

static void unload(loaded *l) {
    zi_tokenizer_free(l->t);
    zi_gguf_close(l->g);
    free(l->b.p);
}

/* Splits text and compares with the NULL-terminated list of pieces. */
static void expect_split(zi_tokenizer *t, const char *pre, const char *text,
                         const char *const *want) {
    tok_idvec lens = {NULL, 0, 0};
    size_t n = strlen(text);
    assert_int_equal(tok_pretok_split(t, (const unsigned char *)text, n, &lens), ZI_OK);
    size_t nw = 0, off = 0;
    int ok = 1;
    for (; want[nw]; nw++) {
        size_t wl = strlen(want[nw]);
        if (nw >= lens.n || (size_t)lens.v[nw] != wl || memcmp(text + off, want[nw], wl) != 0)
            ok = 0;
        off += wl;
    }
    if (!ok || nw != lens.n) {
        fprintf(stderr, "%s: split of \"%s\":", pre, text);
        off = 0;
        for (size_t i = 0; i < lens.n; i++) {
            fprintf(stderr, " [%.*s]", (int)lens.v[i], text + off);
            off += (size_t)lens.v[i];
        }
        fprintf(stderr, "\n");
    }
    assert_true(ok);
    assert_int_equal(nw, lens.n);
    free(lens.v);
}

#define SPLIT(t, pre, text, ...)                                                                   \
    do {                                                                                           \
        static const char *const want_[] = {__VA_ARGS__, NULL};                                    \
        expect_split(t, pre, text, want_);                                                         \
    } while (0)

static void test_gpt2(void **state) {
    (void)state;
    loaded l = load("gpt-2");
    SPLIT(l.t, "gpt-2", "Hello world's  end\n\n x", "Hello", " world", "'s", " ", " end", "\n\n",
          " x");
    SPLIT(l.t, "gpt-2", "a 12345!? ", "a", " 12345", "!?", " ");
    unload(&l);
    l = load("starcoder");
    SPLIT(l.t, "starcoder", "a 123b", "a", " ", "1", "2", "3", "b");
    unload(&l);
}

static void test_llama3(void **state) {
    (void)state;
    loaded l = load("llama-bpe");
    SPLIT(l.t, "llama-bpe", "I'M 12345 ok!!\n\nx", "I", "'M", " ", "123", "45", " ok", "!!\n\n",
          "x");
    SPLIT(l.t, "llama-bpe", "  \n  hi", "  \n", " ", " hi");
    SPLIT(l.t, "llama-bpe", "(foo) \xe4\xb8\xad\xe6\x96\x87", "(foo", ")",
          " \xe4\xb8\xad\xe6\x96\x87");
    SPLIT(l.t, "llama-bpe", "x  ", "x", "  ");
    SPLIT(l.t, "llama-bpe", "don'T", "don", "'T");
    unload(&l);
}

static void test_qwen(void **state) {
    (void)state;
    loaded l = load("qwen2");
    SPLIT(l.t, "qwen2", "abc123", "abc", "1", "2", "3");
    /* a combining mark ends a qwen2 letter run, and starts the next */
    SPLIT(l.t, "qwen2", "e\xcc\x81x", "e", "\xcc\x81x");
    unload(&l);
    l = load("qwen35");
    SPLIT(l.t, "qwen35", "e\xcc\x81x", "e\xcc\x81x");
    SPLIT(l.t, "qwen35", "a 12", "a", " ", "1", "2");
    unload(&l);
}

/* The GPT-4o pattern as llama.cpp runs it (tokenizer_pretok.c's comment
 * above gpt4o_case): ASCII letters have a case, other letters count as
 * both; the ids these splits give equal llama.cpp's on a copy of a real
 * vocabulary (tests/e2e/test_pretok_gpt4o.py). */
static void test_gpt4o(void **state) {
    (void)state;
    loaded l = load("gpt-4o");
    SPLIT(l.t, "gpt-4o", "HELLOworld helloWORLD camelCase", "HELLOworld", " hello", "WORLD",
          " camel", "Case");
    SPLIT(l.t, "gpt-4o", "I'M don't WE'LL x'y", "I'M", " don't", " WE'LL", " x", "'y");
    /* no contraction alternative of its own: one follows letters only */
    SPLIT(l.t, "gpt-4o", "'s 's", "'s", " '", "s");
    SPLIT(l.t, "gpt-4o", "1234567 12", "123", "456", "7", " ", "12");
    SPLIT(l.t, "gpt-4o", "x!\n/y a/b", "x", "!\n/", "y", " a", "/b");
    SPLIT(l.t, "gpt-4o", "  \n  hi", "  \n", " ", " hi");
    SPLIT(l.t, "gpt-4o", "x  ", "x", "  ");
    /* non-ASCII letters are upper and lower: \u00c9AB is split where
     * o200k proper would keep it whole, as llama.cpp splits it */
    SPLIT(l.t, "gpt-4o", "\xc3\x89\x41\x42 a\xc3\x89\x42 \xc3\xa9t\xc3\xa9", "\xc3\x89", "AB",
          " a\xc3\x89", "B", " \xc3\xa9t\xc3\xa9");
    SPLIT(l.t, "gpt-4o", "\xe4\xb8\xad\xe6\x96\x87\x41\x42\x63",
          "\xe4\xb8\xad\xe6\x96\x87\x41\x42\x63"); /* CJK then ABc */
    /* a combining mark is no letter: it leads the next run */
    SPLIT(l.t, "gpt-4o", "e\xcc\x81x", "e", "\xcc\x81x");
    /* U+3000 is whitespace, and may lead a letter run */
    SPLIT(l.t, "gpt-4o", "\xe3\x80\x80\xe3\x80\x80x", "\xe3\x80\x80", "\xe3\x80\x80x");
    SPLIT(l.t, "gpt-4o", "\n\nAb", "\n\n", "Ab");
    unload(&l);
    static const char *const aliases[] = {"llama4", "kanana2", "talkie", "minimax-m2"};
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++) {
        l = load(aliases[i]);
        SPLIT(l.t, aliases[i], "helloWORLD 1234", "hello", "WORLD", " ", "123", "4");
        unload(&l);
    }
}

/* llama.cpp's GPT4O regex as std::regex gets it: \p{L} and \p{N} rewritten
 * for the collapsed text (tokenizer_regex.c), which collapsed_unit makes. */
static const char k_gpt4o_collapsed[] =
    "[^\\r\\n\\x{D2}A-Za-z\\x{D1}0-9]?((?=[\\x{D2}A-Za-z])([^a-z]))*((?=[\\x{D2}A-Za-z])([^A-Z]))+"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|[^\\r\\n\\x{D2}A-Za-z\\x{D1}0-9]?((?=[\\x{D2}A-Za-z])([^a-z]))+((?=[\\x{D2}A-Za-z])([^A-Z]))*"
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    "|[\\x{D1}0-9]{1,3}| ?[^\\s\\x{D2}A-Za-z\\x{D1}0-9]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static uint32_t collapsed_unit(uint32_t cp) {
    if (cp < 0x80) return cp;
    uint16_t f = zi_unicode_flags(cp);
    if (f & ZI_UC_WHITESPACE) return 0x0B;
    switch (f & ZI_UC_CATEGORIES) {
    case ZI_UC_NUMBER:
        return 0xD1;
    case ZI_UC_LETTER:
        return 0xD2;
    case ZI_UC_PUNCT:
        return 0xD3;
    case ZI_UC_MARK:
        return 0xD4;
    case ZI_UC_SYMBOL:
        return 0xD5;
    default:
        return 0xD0;
    }
}

/* The gpt-4o scanner against that regex itself, run by PCRE2's
 * interpreter (backtracking in the leftmost-alternative order std::regex
 * uses), on seeded random strings of the codepoints its branches turn on:
 * every split must be the regex's. (PCRE2 only checks: its JIT runs out
 * of stack on a 1,000-letter word.) */
static void test_gpt4o_against_regex(void **state) {
    (void)state;
    loaded l = load("gpt-4o");
    size_t pl = strlen(k_gpt4o_collapsed);
    PCRE2_UCHAR32 pat[sizeof k_gpt4o_collapsed];
    for (size_t i = 0; i < pl; i++) pat[i] = (unsigned char)k_gpt4o_collapsed[i];
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile(pat, pl, 0, &ec, &eo, NULL);
    assert_non_null(re);
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    assert_non_null(md);
    static const char *const atoms[] = {"A",
                                        "B",
                                        "Z",
                                        "a",
                                        "s",
                                        "t",
                                        "m",
                                        "d",
                                        "r",
                                        "e",
                                        "v",
                                        "l",
                                        "S",
                                        "T",
                                        "R",
                                        "E",
                                        "L",
                                        "\xc3\x89",
                                        "\xc3\xa9",
                                        "\xe4\xb8\xad",
                                        "\xc7\x85",
                                        "1",
                                        "2",
                                        "\xd9\xa3",
                                        "\xe2\x85\xa0",
                                        " ",
                                        " ",
                                        "\n",
                                        "\r",
                                        "\t",
                                        "\x0b",
                                        "\xe3\x80\x80",
                                        "\xc2\x85",
                                        "\xc2\xa0",
                                        "!",
                                        "/",
                                        "'",
                                        "'",
                                        ".",
                                        "\xcc\x81",
                                        "\xe2\x82\xac",
                                        "\xef\xbf\xbd",
                                        "\xf0\x9f\x98\x80"};
    const size_t na = sizeof atoms / sizeof *atoms;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    unsigned char text[24 * 4];
    uint32_t units[sizeof text];
    size_t boff[sizeof text + 1], want[sizeof text];
    tok_idvec lens = {NULL, 0, 0};
    long bad = 0;
    for (long it = 0; it < 200000; it++) {
        size_t tn = 0, nu = 0, nw = 0;
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        for (int k = 1 + (int)(rng % 24); k > 0; k--) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            const char *a = atoms[rng % na];
            memcpy(text + tn, a, strlen(a));
            tn += strlen(a);
        }
        for (size_t p = 0; p < tn;) {
            uint32_t cp;
            size_t cl = zi_utf8_decode(text + p, tn - p, &cp);
            boff[nu] = p;
            units[nu++] = collapsed_unit(cp);
            p += cl;
        }
        boff[nu] = tn;
        lens.n = 0;
        assert_int_equal(tok_pretok_split(l.t, text, tn, &lens), ZI_OK);
        size_t start = 0;
        while (start < nu && pcre2_match(re, units, nu, start, 0, md, NULL) > 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            assert_true(ov[0] == start && ov[1] > start); /* every codepoint starts a match */
            want[nw++] = boff[ov[1]] - boff[start];
            start = ov[1];
        }
        assert_int_equal(start, nu);
        int same = nw == lens.n;
        for (size_t i = 0; same && i < nw; i++) same = (size_t)lens.v[i] == want[i];
        if (!same && bad++ < 5) {
            fprintf(stderr, "gpt-4o differs from the regex on \"%.*s\":", (int)tn, text);
            for (size_t i = 0; i < lens.n; i++) fprintf(stderr, " %d", lens.v[i]);
            fprintf(stderr, " (regex:");
            for (size_t i = 0; i < nw; i++) fprintf(stderr, " %zu", want[i]);
            fprintf(stderr, ")\n");
        }
    }
    assert_int_equal(bad, 0);
    free(lens.v);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    unload(&l);
}

/* gpt-oss's markers, as llama.cpp's load treats them whatever their type
 * in the file: <|start|>, <|channel|>, <|message|> and <|constrain|> are
 * user-defined (matched without parse_special, decoded without special);
 * with <|return|> and <|call|> ending generation, <|end|> does not, and is
 * user-defined too. */
static void test_gpt_oss_markers(void **state) {
    (void)state;
    wbuf b = make_vocab_full("gpt-4o", 0, 1);
    zi_gguf *g;
    zi_tokenizer *t;
    zi_error err = {0};
    assert_int_equal(zi_gguf_open_memory(b.p, b.n, &g, &err), ZI_OK);
    assert_int_equal(zi_tokenizer_load(g, &t, &err), ZI_OK);
    assert_true(zi_tokenizer_is_eog(t, T_RETURN));
    assert_true(zi_tokenizer_is_eog(t, T_CALL));
    assert_false(zi_tokenizer_is_eog(t, T_END));
    assert_false(zi_tokenizer_is_eog(t, T_START));

    static const char text[] = "<|start|>a<|channel|>b<|constrain|><|message|>c<|end|><|return|>";
    int32_t *ids;
    size_t n;
    assert_int_equal(zi_tokenizer_encode(t, text, strlen(text), 0, 0, &ids, &n, &err), ZI_OK);
    /* <|return|> stays text without parse_special: 10 bytes */
    assert_int_equal(n, 8 + 10);
    static const int32_t head[] = {T_START,     'a',       T_CHANNEL, 'b',
                                   T_CONSTRAIN, T_MESSAGE, 'c',       T_END};
    for (size_t i = 0; i < 8; i++) assert_int_equal(ids[i], head[i]); /* byte b is id b */
    free(ids);
    assert_int_equal(zi_tokenizer_encode(t, text, strlen(text), 0, 1, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, 9);
    assert_int_equal(ids[8], T_RETURN);

    /* decoding without special shows the markers and <|end|>, not
     * <|return|> */
    char *out;
    size_t len;
    assert_int_equal(zi_tokenizer_decode(t, ids, n, 0, &out, &len, &err), ZI_OK);
    static const char shown[] = "<|start|>a<|channel|>b<|constrain|><|message|>c<|end|>";
    assert_int_equal(len, strlen(shown));
    assert_memory_equal(out, shown, len);
    free(out);
    free(ids);
    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(b.p);
}

static void test_deepseek(void **state) {
    (void)state;
    loaded l = load("deepseek-coder");
    SPLIT(l.t, "deepseek-coder", "ab 12!!\xe4\xb8\xad\xe6\x96\x87\nx", "ab", " ", "1", "2", "!!",
          "\xe4\xb8\xad\xe6\x96\x87", "\n", "x");
    unload(&l);
    l = load("deepseek-llm");
    /* U+3000 is whitespace (U+000B) to the regex, so the class that names
     * it does not take it */
    SPLIT(l.t, "deepseek-llm", "x\xe3\x80\x82\xe3\x80\x80\xe3\x80\x80", "x", "\xe3\x80\x82",
          "\xe3\x80\x80\xe3\x80\x80");
    SPLIT(l.t, "deepseek-llm", "1  ", "1", "  ");       /* \s+$ */
    SPLIT(l.t, "deepseek-llm", "1  2", "1", "  ", "2"); /* no trailing run */
    SPLIT(l.t, "deepseek-llm", "Hi there, 2024", "Hi", " there", ",", " ", "2024");
    unload(&l);
}

static void test_falcon_default(void **state) {
    (void)state;
    loaded l = load("falcon");
    SPLIT(l.t, "falcon", "a+=b 1234!!", "a", "+=", "b", " ", "123", "4", "!!");
    unload(&l);
    l = load(NULL); /* no tokenizer.ggml.pre: llama.cpp's default list */
    SPLIT(l.t, "default", "a  12345", "a", " ", " ", "123", "45");
    SPLIT(l.t, "default", "x.y", "x", ".", "y");
    unload(&l);
    l = load("default");
    SPLIT(l.t, "default", "a  12345", "a", " ", " ", "123", "45");
    unload(&l);
}

static void expect_refused(const char *pre) {
    wbuf b = make_vocab(pre);
    zi_gguf *g;
    zi_tokenizer *t = (zi_tokenizer *)&b;
    zi_error err = {0};
    assert_int_equal(zi_gguf_open_memory(b.p, b.n, &g, &err), ZI_OK);
    assert_int_equal(zi_tokenizer_load(g, &t, &err), ZI_EUNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.pre"));
    assert_null(strchr(err.msg, '\n'));
    char head[80];
    snprintf(head, sizeof head, "\"%.20s", pre);
    assert_non_null(strstr(err.msg, head));
    zi_gguf_close(g);
    free(b.p);
}

static void test_refused(void **state) {
    (void)state;
    expect_refused("tekken");      /* a llama.cpp name zinfer does not implement */
    expect_refused("gpt4o");       /* llama.cpp's name is "gpt-4o" only */
    expect_refused("no-such-pre"); /* not a name at all */
    expect_refused("Gpt-2");       /* names are case-sensitive, as in llama.cpp */
    char longname[300];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    expect_refused(longname);
}

/* Without an add_bos_token key, llama.cpp adds BOS for the Llama 3 names
 * that ignore merges, and not for the others (dbrx, qwen2, ...). */
static void check_default_bos(const char *pre, int want_bos) {
    wbuf b = make_vocab_bos(pre, 1);
    zi_gguf *g;
    zi_tokenizer *t;
    zi_error err = {0};
    assert_int_equal(zi_gguf_open_memory(b.p, b.n, &g, &err), ZI_OK);
    assert_int_equal(zi_tokenizer_load(g, &t, &err), ZI_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(zi_tokenizer_encode(t, "x", 1, 1, 0, &ids, &n, &err), ZI_OK);
    assert_int_equal(n, want_bos ? 2 : 1);
    if (want_bos) assert_int_equal(ids[0], 256);
    free(ids);
    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(b.p);
}

static void test_default_bos(void **state) {
    (void)state;
    check_default_bos("llama-bpe", 1);
    check_default_bos("llama3", 1);
    check_default_bos("dbrx", 0);
    check_default_bos("qwen2", 0);
    check_default_bos("gpt-2", 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Hostile text: 1 MiB runs of one class, and invalid UTF-8 (which encode
 * replaces with U+FFFD), through every kind; each must take well under the
 * bound (a quadratic split would take minutes) and encode must succeed. */
static void test_hostile(void **state) {
    (void)state;
    static const char *const pres[] = {"gpt-2",        "smollm",         "llama-bpe", "qwen2",
                                       "qwen35",       "falcon",         "default",   "mpt",
                                       "deepseek-llm", "deepseek-coder", "command-r", "gpt-4o"};
    static const char *const units[] = {
        " ",        "\n", "1",    "a",        "!",  "\xe3\x80\x80", " \n", "\xe4\xb8\xad",
        "\xcc\x81", "'",  "\xff", "\xc0\x80", "aB", "\xc3\x89",     "!\n"};
#if defined(__SANITIZE_ADDRESS__)
    /* a quarter under AddressSanitizer: the same runs through the same
     * paths; the release build's 1 MiB holds the time bound */
    const size_t size = 1 << 18;
#else
    const size_t size = 1 << 20;
#endif
    char *text = malloc(size + 8);
    assert_non_null(text);
    for (size_t p = 0; p < sizeof pres / sizeof *pres; p++) {
        loaded l = load(pres[p]);
        for (size_t u = 0; u < sizeof units / sizeof *units; u++) {
            size_t ul = strlen(units[u]), n = 0;
            while (n + ul <= size) {
                memcpy(text + n, units[u], ul);
                n += ul;
            }
            text[n++] = 'z'; /* so that a whitespace run is not at the end */
            double t0 = now_s();
            int32_t *ids = NULL;
            size_t nids = 0;
            zi_error err = {0};
            int rc = zi_tokenizer_encode(l.t, text, n, 0, 1, &ids, &nids, &err);
            double dt = now_s() - t0;
            if (rc || dt > 10.0)
                fprintf(stderr, "%s, run of \"%s\": rc %d, %.2f s\n", pres[p], units[u], rc, dt);
            assert_int_equal(rc, ZI_OK);
            assert_true(nids > 0);
            assert_true(dt < 10.0);
            free(ids);
        }
        unload(&l);
    }
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_qwen),
        cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_falcon_default),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_default_bos),
        cmocka_unit_test(test_hostile),
        cmocka_unit_test(test_gpt4o),
        cmocka_unit_test(test_gpt_oss_markers),
        cmocka_unit_test(test_gpt4o_against_regex),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
