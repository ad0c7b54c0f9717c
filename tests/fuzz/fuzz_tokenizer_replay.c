/*
 * fuzz_tokenizer_replay.c - runs the tokenizer fuzz entry point
 * (fuzz_tokenizer.c, linked in) without libFuzzer, as a test (meson test
 * 'fuzz_tokenizer_replay'), on:
 *  - small hand-made vocabularies, one per pre-tokenizer family (byte-level
 *    BPE: gpt-2, smollm, llama-bpe, dbrx, qwen2, qwen35, falcon, default,
 *    deepseek-llm, deepseek-coder, gpt-4o) and two SentencePiece ones (plain and
 *    named Phi-3, whose specials strip spaces): the 256 byte tokens, a few
 *    dozen merged words and digits, control and user-defined tokens;
 *  - each of them whole, truncated at seeded places, with seeded byte-level
 *    mutations (as fuzz_gguf_replay.c makes them), and with every metadata
 *    key in turn missing, of a wrong type, of a wrong element type, one
 *    element short or long, or holding a hostile value (ids out of range or
 *    negative, NaN and infinite scores, token types 0 and 255, merges
 *    without a space or naming no token, empty and over-long token texts,
 *    invalid UTF-8, duplicated tokens, a 70,000-token vocabulary);
 *  - the files in tests/fuzz/corpus_tokenizer/ (regression inputs);
 *  - llama.cpp's vendored vocabularies ($ZINFER_HOME/llama.cpp-vendor/
 *    models/ggml-vocab-*.gguf, ZINFER_HOME defaulting to ~/.cache/zinfer)
 *    when present: whole, cut short at a few places, and with bytes
 *    overwritten inside the token table (lengths kept, texts damaged).
 * The entry point traps on any broken promise; under
 * -fsanitize=address,undefined any bad access is reported too. Each input
 * is copied into an exact-size heap buffer so ASan sees overreads.
 *
 * `fuzz_tokenizer_replay --write-seeds DIR` writes the unmutated
 * hand-made vocabularies: seeds for the libFuzzer binary.
 */
#include <dirent.h>
#include <math.h>
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
#include "gguf_writer.h"
#include "gpt2_bytes.h"
#include "replay_util.h"
#include "tokenizer.h"
#include "vendor_dir.h"

#define CORPUS_DIR "tests/fuzz/corpus_tokenizer"
#define N_TRUNC 24
#define N_BYTE_MUT 300

/* ---- the hand-made vocabularies ---------------------------------------- */

/* Metadata keys, in the order they are written. */
enum {
    K_MODEL,
    K_PRE,
    K_TOKENS,
    K_TYPES,
    K_SCORES,
    K_MERGES,
    K_BOS,
    K_EOS,
    K_UNK,
    K_PAD,
    K_ADD_BOS,
    K_ADD_EOS,
    K_SPACE,
    K_NAME,
    K_N
};
static const char *const k_keys[K_N] = {
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "general.name",
};

/* How a key is written: as the family says, or damaged. */
enum {
    M_OK,
    M_MISSING,
    M_SCALAR,   /* a string key as u32, a number as a string */
    M_ELEM,     /* an array of the wrong element type (or a u64 id) */
    M_SHORT,    /* an array one element short (or an id of -1) */
    M_LONG,     /* an array one element long (or an id = the vocabulary size) */
    M_HOSTILE,  /* a hostile value of the right type (see write_key) */
    M_HOSTILE2, /* another one */
    M_N
};

#define MAX_TOK 400

typedef struct vocab {
    const char *model, *pre, *name; /* pre, name: NULL for no key */
    int spm;
    size_t n;
    const char *tok[MAX_TOK];
    int32_t type[MAX_TOK];
    float score[MAX_TOK];
    size_t n_merges;
    const char *merge[64];
    int64_t bos, eos, unk, pad;      /* -1: no key */
    int add_bos, add_eos, add_space; /* -1: no key */
} vocab;

static char g_bytes[256][8]; /* the GPT-2 characters or <0xXX> names */

static void add_tok(vocab *v, const char *s, int32_t type, float score) {
    assert_true(v->n < MAX_TOK);
    v->tok[v->n] = s, v->type[v->n] = type, v->score[v->n] = score;
    v->n++;
}

/* Byte-level BPE: the 256 byte characters, merges building a few words,
 * numbers and spaces, and special tokens. */
static void make_bpe(vocab *v, const char *pre) {
    memset(v, 0, sizeof *v);
    v->model = "gpt2", v->pre = pre;
    for (unsigned b = 0; b < 256; b++) {
        zi_test_gpt2_byte_char(b, g_bytes[b]);
        add_tok(v, g_bytes[b], ZI_TOKEN_NORMAL, 0);
    }
    /* merge "x y" makes token "xy"; U+0120 (\xc4\xa0) is the space's
     * character, U+010A (\xc4\x8a) the newline's. */
    static const char *const merges[][2] = {
        {"h", "e"},
        {"l", "l"},
        {"he", "ll"},
        {"hell", "o"},
        {"\xc4\xa0", "w"},
        {"o", "r"},
        {"\xc4\xa0w", "or"},
        {"l", "d"},
        {"\xc4\xa0wor", "ld"},
        {"1", "2"},
        {"12", "3"},
        {"\xc4\xa0", "\xc4\xa0"},
        {"\xc4\xa0\xc4\xa0", "\xc4\xa0"},
        {"\xc4\x8a", "\xc4\x8a"},
        {"i", "t"},
        {"\xc4\xa0", "it"},
        {"'", "s"},
        {"\xc3\xa4", "\xc2\xb8"},
        {"d", "e"},
        {"de", "f"},
        {"r", "e"},
        {"re", "t"},
        {"ret", "u"},
        {"retu", "rn"},
        {"r", "n"},
        {"\xc4\xa0", "H"},
        {"\xc4\xa0H", "ello"},
        {"e", "l"},
        {"el", "lo"},
        {"l", "o"},
        {"0", "0"},
        {"00", "0"},
        {",", "000"},
    };
    static char merge_txt[64][32], tok_txt[64][32];
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++) {
        snprintf(merge_txt[i], sizeof merge_txt[i], "%s %s", merges[i][0], merges[i][1]);
        snprintf(tok_txt[i], sizeof tok_txt[i], "%s%s", merges[i][0], merges[i][1]);
        v->merge[v->n_merges++] = merge_txt[i];
        add_tok(v, tok_txt[i], ZI_TOKEN_NORMAL, 0);
    }
    v->bos = (int64_t)v->n;
    add_tok(v, "<|endoftext|>", ZI_TOKEN_CONTROL, 0);
    add_tok(v, "<|im_start|>", ZI_TOKEN_CONTROL, 0);
    v->eos = (int64_t)v->n;
    add_tok(v, "<|im_end|>", ZI_TOKEN_CONTROL, 0);
    add_tok(v, "<|eot_id|>", ZI_TOKEN_CONTROL, 0);
    add_tok(v, "<tool>", ZI_TOKEN_USER_DEFINED, 0);
    add_tok(v, "<unused>", ZI_TOKEN_UNUSED, 0);
    v->pad = v->eos;
    v->unk = -1;
    v->add_bos = 0, v->add_eos = -1, v->add_space = -1;
}

/* SentencePiece: <unk> <s> </s>, the 256 byte tokens, pieces with scores. */
static void make_spm(vocab *v, const char *name) {
    memset(v, 0, sizeof *v);
    v->model = "llama", v->spm = 1, v->name = name;
    add_tok(v, "<unk>", ZI_TOKEN_UNKNOWN, 0);
    add_tok(v, "<s>", ZI_TOKEN_CONTROL, 0);
    add_tok(v, "</s>", ZI_TOKEN_CONTROL, 0);
    for (unsigned b = 0; b < 256; b++) {
        snprintf(g_bytes[b], sizeof g_bytes[b], "<0x%02X>", b);
        add_tok(v, g_bytes[b], ZI_TOKEN_BYTE, 0);
    }
    static const char *const pieces[] = {
        "\xe2\x96\x81",
        "a",
        "b",
        "c",
        "d",
        "e",
        "h",
        "l",
        "o",
        "r",
        "w",
        "1",
        "2",
        "\xe2\x96\x81"
        "a",
        "\xe2\x96\x81"
        "h",
        "he",
        "ll",
        "hell",
        "hello",
        "\xe2\x96\x81"
        "hello",
        "\xe2\x96\x81"
        "w",
        "or",
        "wor",
        "world",
        "\xe2\x96\x81"
        "world",
        "12",
        "\xe2\x96\x81\xe2\x96\x81",
        "\xe4\xb8\xad",
        "\xe2\x96\x81"
        "H",
        "ello",
        "\xe2\x96\x81"
        "Hello",
    };
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++)
        add_tok(v, pieces[i], ZI_TOKEN_NORMAL, -(float)(i % 7) - 0.5f * (float)(i % 3));
    add_tok(v, "<|end|>", ZI_TOKEN_CONTROL, 0);
    add_tok(v, "<|user|>", ZI_TOKEN_USER_DEFINED, 0);
    add_tok(v, "<tool>", ZI_TOKEN_USER_DEFINED, 0);
    v->bos = 1, v->eos = 2, v->unk = 0, v->pad = -1;
    v->add_bos = 1, v->add_eos = 0, v->add_space = 1;
}

static size_t n_elems(size_t n, int mode) {
    return mode == M_SHORT ? n - 1 : mode == M_LONG ? n + 1 : n;
}
static void w_count(wbuf *b, size_t n, int mode) {
    w_u64(b, n_elems(n, mode));
}

static char g_huge[ZI_TOKEN_MAX_BYTES + 2];

/* Writes key k in the given mode; returns 0 when it wrote nothing. */
static int write_key(wbuf *b, const vocab *v, int k, int mode) {
    const char *key = k_keys[k];
    if (mode == M_MISSING) return 0;
    switch (k) {
    case K_MODEL:
    case K_PRE:
    case K_NAME: {
        const char *s = k == K_MODEL ? v->model : k == K_PRE ? v->pre : v->name;
        if (!s && mode == M_OK) return 0;
        if (mode == M_SCALAR || mode == M_ELEM) return kv_u32(b, key, 7), 1;
        if (mode == M_SHORT) return kv_str(b, key, ""), 1;
        if (mode == M_LONG) return kv_str(b, key, k == K_NAME ? "Phi-3 mini" : "bert"), 1;
        if (mode == M_HOSTILE) return kv_str(b, key, k == K_MODEL ? "gpt2\xff" : "qwen2\n"), 1;
        if (mode == M_HOSTILE2) {
            const char *alt[] = {v->spm ? "gpt2" : "llama", "gpt-4o", "gemma-3"};
            return kv_str(b, key, alt[k == K_MODEL ? 0 : k == K_PRE ? 1 : 2]), 1;
        }
        return kv_str(b, key, s ? s : ""), 1;
    }
    case K_TOKENS: {
        if (mode == M_SCALAR) return kv_str(b, key, "a"), 1;
        size_t n = n_elems(v->n, mode);
        if (mode == M_ELEM) {
            int32_t z[MAX_TOK + 1] = {0};
            return kv_i32s(b, key, z, n), 1;
        }
        w_key(b, key, ZI_GGUF_ARRAY), w_u32(b, ZI_GGUF_STRING), w_count(b, v->n, mode);
        for (size_t i = 0; i < n; i++) {
            const char *s = i < v->n ? v->tok[i] : "extra";
            /* hostile: empty texts, duplicates, invalid UTF-8, a token over
             * the length limit; hostile2: a 70,000-token vocabulary */
            if (mode == M_HOSTILE) {
                if (i % 17 == 3)
                    s = "";
                else if (i % 17 == 5)
                    s = v->tok[i / 2];
                else if (i % 17 == 7)
                    s = "\xff\xc0\x80\xed\xa0\x80";
                else if (i == v->n - 1)
                    s = g_huge;
            }
            w_str(b, s);
        }
        return 1;
    }
    case K_TYPES:
    case K_SCORES: {
        int scores = k == K_SCORES;
        if (scores && !v->spm && mode == M_OK) return 0;
        if (mode == M_SCALAR) return kv_u32(b, key, 1), 1;
        size_t n = n_elems(v->n, mode);
        if (mode == M_ELEM) {
            const char *z[MAX_TOK + 1];
            for (size_t i = 0; i < n; i++) z[i] = "1";
            return kv_strs(b, key, z, n), 1;
        }
        w_key(b, key, ZI_GGUF_ARRAY);
        /* hostile2 stores scores as int32 and types as uint8 */
        w_u32(b, scores ? (mode == M_HOSTILE2 ? ZI_GGUF_INT32 : ZI_GGUF_FLOAT32)
                        : (mode == M_HOSTILE2 ? ZI_GGUF_UINT8 : ZI_GGUF_INT32));
        w_count(b, v->n, mode);
        for (size_t i = 0; i < n; i++) {
            if (scores) {
                float s = i < v->n ? v->score[i] : -1;
                static const float bad[] = {NAN, INFINITY, -INFINITY, 3e38f, -3e38f, -0.0f};
                if (mode == M_HOSTILE && i % 3 == 0) s = bad[(i / 3) % 6];
                if (mode == M_HOSTILE2)
                    w_u32(b, (uint32_t)(int32_t)(i % 5 ? -(int32_t)i : INT32_MIN));
                else
                    w_f32(b, s);
            } else {
                int32_t t = i < v->n ? v->type[i] : ZI_TOKEN_NORMAL;
                static const int32_t bad[] = {0, 7, -1, 255, ZI_TOKEN_CONTROL, ZI_TOKEN_BYTE};
                if (mode == M_HOSTILE && i % 4 == 1) t = bad[(i / 4) % 6];
                if (mode == M_HOSTILE2)
                    w_u8(b, (uint8_t)t);
                else
                    w_u32(b, (uint32_t)t);
            }
        }
        return 1;
    }
    case K_MERGES: {
        if (v->spm && mode == M_OK) return 0;
        if (mode == M_SCALAR) return kv_str(b, key, "a b"), 1;
        if (mode == M_ELEM) return kv_i32s(b, key, (const int32_t[]){1, 2, 3}, 3), 1;
        const char *m[80];
        size_t n = 0;
        for (size_t i = 0; i < v->n_merges; i++) m[n++] = v->merge[i];
        if (mode == M_SHORT) n = 0; /* an empty merge list */
        if (mode == M_LONG) m[n++] = "zz yy";
        if (mode == M_HOSTILE) {
            static const char *const bad[] = {
                "ab",        "",           " ",     "a  b",
                " a b",      "a b ",       "a b c", "<|im_end|> <|im_end|>",
                "\xff \xfe", "hello hello"};
            for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) m[n++] = bad[i];
        }
        if (mode == M_HOSTILE2) /* the merges reversed: ranks backwards */
            for (size_t i = 0; i < n / 2; i++) {
                const char *x = m[i];
                m[i] = m[n - 1 - i], m[n - 1 - i] = x;
            }
        return kv_strs(b, key, m, n), 1;
    }
    case K_BOS:
    case K_EOS:
    case K_UNK:
    case K_PAD: {
        int64_t id = k == K_BOS ? v->bos : k == K_EOS ? v->eos : k == K_UNK ? v->unk : v->pad;
        if (id < 0 && mode == M_OK) return 0;
        if (mode == M_SCALAR) return kv_str(b, key, "1"), 1;
        if (mode == M_ELEM) return w_key(b, key, ZI_GGUF_UINT64), w_u64(b, 1), 1;
        if (mode == M_SHORT) return w_key(b, key, ZI_GGUF_INT32), w_u32(b, 0xffffffffu), 1;
        if (mode == M_LONG) return kv_u32(b, key, (uint32_t)v->n), 1;
        if (mode == M_HOSTILE) return kv_u32(b, key, 0xffffffffu), 1;
        if (mode == M_HOSTILE2) return kv_u32(b, key, 3), 1; /* a byte token */
        return kv_u32(b, key, (uint32_t)id), 1;
    }
    default: { /* the booleans */
        int val = k == K_ADD_BOS ? v->add_bos : k == K_ADD_EOS ? v->add_eos : v->add_space;
        if (val < 0 && mode == M_OK) return 0;
        if (mode == M_SCALAR) return kv_str(b, key, "true"), 1;
        if (mode == M_ELEM) return kv_u32(b, key, 1), 1;
        if (mode == M_SHORT || mode == M_LONG) return kv_bool(b, key, mode == M_LONG), 1;
        if (mode == M_HOSTILE) return w_key(b, key, ZI_GGUF_BOOL), w_u8(b, 2), 1;
        if (mode == M_HOSTILE2) return kv_bool(b, key, !val), 1;
        return kv_bool(b, key, val), 1;
    }
    }
}

/* The file for v with key `bad` written in mode `mode` (bad = -1: none). */
static wbuf build(const vocab *v, int bad, int mode) {
    wbuf kv = {0};
    uint64_t n = 0;
    for (int k = 0; k < K_N; k++) n += (uint64_t)write_key(&kv, v, k, k == bad ? mode : M_OK);
    wbuf b = {0};
    w_header(&b, 3, 0, n);
    w_bytes(&b, kv.p, kv.n);
    free(kv.p);
    return b;
}

/* A 70,000-token BPE vocabulary (more than 16 bits of ids). */
static wbuf build_big(void) {
    wbuf kv = {0};
    const size_t n = 70000;
    kv_str(&kv, "tokenizer.ggml.model", "gpt2");
    kv_str(&kv, "tokenizer.ggml.pre", "qwen2");
    w_key(&kv, "tokenizer.ggml.tokens", ZI_GGUF_ARRAY), w_u32(&kv, ZI_GGUF_STRING), w_u64(&kv, n);
    for (size_t i = 0; i < n; i++) {
        char s[16];
        if (i < 256)
            zi_test_gpt2_byte_char((unsigned)i, s);
        else
            snprintf(s, sizeof s, "t%zu", i);
        w_str(&kv, s);
    }
    static const char *const m[] = {"t 1", "t1 2", "h e"};
    kv_strs(&kv, "tokenizer.ggml.merges", m, 3);
    kv_u32(&kv, "tokenizer.ggml.eos_token_id", (uint32_t)(n - 1));
    wbuf b = {0};
    w_header(&b, 3, 0, 5);
    w_bytes(&b, kv.p, kv.n);
    free(kv.p);
    return b;
}

/* ---- running inputs ----------------------------------------------------- */

/* Runs the entry point over an exact-size copy of the bytes; returns 1 when
 * the tokenizer loaded (so the test can check both paths are exercised). */
static int run_one(const uint8_t *d, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n) memcpy(copy, d, n);
    LLVMFuzzerTestOneInput(copy, n);
    zi_gguf *g = NULL;
    zi_tokenizer *t = NULL;
    int ok =
        zi_gguf_open_memory(copy, n, &g, NULL) == ZI_OK && zi_tokenizer_load(g, &t, NULL) == ZI_OK;
    zi_tokenizer_free(t);
    zi_gguf_close(g);
    free(copy);
    return ok;
}

/* The mutations' random numbers (replay_util.h: splitmix64, so a fixed seed
 * gives the same mutations on every run). */
static uint64_t next(uint64_t *s) {
    return zi_replay_splitmix(s);
}

/* Byte-level damage, as fuzz_gguf_replay.c does it, plus token-text-minded
 * bytes ('<', '|', ' ', U+0120's lead byte). */
static void mutate(wbuf *m, uint64_t *rng) {
    static const uint64_t edges[] = {0,
                                     1,
                                     2,
                                     3,
                                     7,
                                     8,
                                     9,
                                     0x20,
                                     0x7f,
                                     0x80,
                                     0xff,
                                     0xffff,
                                     0x7fffffff,
                                     0x80000000u,
                                     0xffffffffu,
                                     1ull << 32,
                                     0x7fffffffffffffffull,
                                     0xffffffffffffffffull};
    static const uint8_t chars[] = {'<', '>', '|', ' ', 0xc4, 0xe2, 0x96, 0x81, 0, '\n'};
    const size_t ne = sizeof edges / sizeof edges[0];
    int ops = 1 + (int)(next(rng) % 4);
    for (int k = 0; k < ops && m->n; k++) {
        size_t pos = (size_t)(next(rng) % m->n);
        switch (next(rng) % 6) {
        case 0:
            m->p[pos] ^= (uint8_t)(1u << (next(rng) % 8));
            break;
        case 1:
            m->p[pos] = chars[next(rng) % sizeof chars];
            break;
        case 2: {
            int w = next(rng) % 2 ? 8 : 4;
            uint64_t v = edges[next(rng) % ne];
            for (int i = 0; i < w && pos + (size_t)i < m->n; i++)
                m->p[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
            break;
        }
        case 3:
            m->n = (size_t)(next(rng) % m->n);
            break;
        case 4: { /* delete a range */
            size_t len = 1 + (size_t)(next(rng) % 16);
            if (len > m->n - pos) len = m->n - pos;
            memmove(m->p + pos, m->p + pos + len, m->n - pos - len);
            m->n -= len;
            break;
        }
        default: { /* copy a range over another place */
            size_t src = (size_t)(next(rng) % m->n), len = 1 + (size_t)(next(rng) % 24);
            if (len > m->n - src) len = m->n - src;
            if (len > m->n - pos) len = m->n - pos;
            memmove(m->p + pos, m->p + src, len);
        }
        }
    }
}

typedef struct family {
    const char *label;
    int spm;
    const char *arg; /* pre (BPE, NULL: no key) or general.name (SPM) */
} family;

static const family k_families[] = {
    {"bpe-gpt-2", 0, "gpt-2"},
    {"bpe-smollm", 0, "smollm"},
    {"bpe-llama-bpe", 0, "llama-bpe"},
    {"bpe-dbrx", 0, "dbrx"},
    {"bpe-qwen2", 0, "qwen2"},
    {"bpe-qwen35", 0, "qwen35"},
    {"bpe-falcon", 0, "falcon"},
    {"bpe-default", 0, NULL},
    {"bpe-deepseek-llm", 0, "deepseek-llm"},
    {"bpe-deepseek-coder", 0, "deepseek-coder"},
    {"bpe-gpt-4o", 0, "gpt-4o"},
    {"spm", 1, NULL},
    {"spm-phi-3", 1, "Phi-3 mini"},
};
#define N_FAMILIES (sizeof k_families / sizeof k_families[0])

static void make_family(vocab *v, const family *f) {
    if (f->spm)
        make_spm(v, f->arg);
    else
        make_bpe(v, f->arg);
}

static void test_families(void **state) {
    (void)state;
    memset(g_huge, 'x', sizeof g_huge - 1);
    uint64_t rng = 0x70c3f022;
    size_t runs = 0, loaded = 0;
    for (size_t fi = 0; fi < N_FAMILIES; fi++) {
        vocab v;
        make_family(&v, &k_families[fi]);
        wbuf seed = build(&v, -1, M_OK);
        if (!run_one(seed.p, seed.n))
            fail_msg("%s: the unmutated vocabulary must load", k_families[fi].label);
        runs++, loaded++;
        /* every key in every damaged form */
        for (int k = 0; k < K_N; k++)
            for (int mode = M_MISSING; mode < M_N; mode++) {
                wbuf b = build(&v, k, mode);
                loaded += (size_t)run_one(b.p, b.n), runs++;
                free(b.p);
            }
        for (int i = 0; i < N_TRUNC; i++)
            loaded += (size_t)run_one(seed.p, (size_t)(next(&rng) % seed.n)), runs++;
        wbuf m = {0};
        for (int i = 0; i < N_BYTE_MUT; i++) {
            m.n = 0;
            w_bytes(&m, seed.p, seed.n);
            mutate(&m, &rng);
            loaded += (size_t)run_one(m.p, m.n), runs++;
        }
        free(m.p);
        free(seed.p);
    }
    wbuf big = build_big();
    loaded += (size_t)run_one(big.p, big.n), runs++;
    free(big.p);
    print_message("families: %zu inputs, %zu loaded\n", runs, loaded);
    /* both paths exercised */
    assert_true(loaded > runs / 10);
    assert_true(loaded < runs * 9 / 10);
}

static void test_corpus(void **state) {
    (void)state;
    DIR *dir = opendir(CORPUS_DIR);
    if (!dir) fail_msg("cannot open %s (run from the source root)", CORPUS_DIR);
    size_t files = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 3 && strcmp(e->d_name + len - 3, ".md") == 0)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, e->d_name);
        size_t n = 0;
        uint8_t *d = zi_replay_slurp(path, &n);
        if (!d) fail_msg("cannot read %s", path);
        run_one(d, n);
        free(d);
        files++;
    }
    closedir(dir);
    print_message("corpus: %zu files\n", files);
}

/* llama.cpp's vocabularies: whole, truncated, and with bytes of the token
 * table overwritten (the file stays well-formed GGUF; texts change). */
static void test_vendored(void **state) {
    (void)state;
    char dir[2048];
    zi_test_vendor_dir(dir, sizeof dir, "");
    DIR *d = opendir(dir);
    if (!d) {
        print_message("vendored vocabularies: %s not found, skipped\n", dir);
        skip();
    }
    uint64_t rng = 0xc0ffee;
    size_t files = 0, runs = 0, loaded = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) != 0 || nl < 5 ||
            strcmp(e->d_name + nl - 5, ".gguf") != 0)
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t n = 0;
        uint8_t *p = zi_replay_slurp(path, &n);
        if (!p) fail_msg("cannot read %s", path);
        clock_t t0 = clock();
        loaded += (size_t)run_one(p, n), runs++;
        for (int i = 0; i < 3; i++) run_one(p, (size_t)(next(&rng) % n)), runs++;
        /* Damage bytes after the first 5%: mostly token texts, some their
         * lengths, types or scores. One input per file, 64 bytes changed. */
        for (int i = 0; i < 64; i++) {
            size_t at = n / 20 + (size_t)(next(&rng) % (n - n / 20));
            p[at] = (uint8_t)next(&rng);
        }
        loaded += (size_t)run_one(p, n), runs++;
        free(p);
        files++;
        print_message("  %s: %.2f s\n", e->d_name, (double)(clock() - t0) / CLOCKS_PER_SEC);
    }
    closedir(d);
    print_message("vendored vocabularies: %zu files, %zu inputs, %zu loaded\n", files, runs,
                  loaded);
    assert_true(files > 0);
}

static int write_seeds(const char *dir) {
    for (size_t fi = 0; fi < N_FAMILIES; fi++) {
        vocab v;
        make_family(&v, &k_families[fi]);
        wbuf b = build(&v, -1, M_OK);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.gguf", dir, k_families[fi].label);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(b.p, 1, b.n, f) != b.n || fclose(f) != 0) return 1;
        free(b.p);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0) return write_seeds(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_families),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_vendored),
    };
    return cmocka_run_group_tests_name("fuzz_tokenizer_replay", tests, NULL, NULL);
}
