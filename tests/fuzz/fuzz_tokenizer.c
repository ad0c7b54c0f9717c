/*
 * fuzz_tokenizer.c - libFuzzer entry point for the tokenizer
 * (tokenizer_proc/tokenizer.h) loaded from a hostile vocabulary file.
 *
 * The input is a GGUF file (zi_gguf_open_memory). When it opens,
 * zi_tokenizer_load must either fail cleanly (no object, a documented code,
 * a non-empty one-line message) or succeed. A loaded tokenizer then encodes
 * fixed strings (ASCII, digits, whitespace runs, CJK, emoji, combining
 * marks, invalid UTF-8, NUL, the usual special-token spellings), the texts
 * of some of its own tokens, and the input's last bytes, each with and
 * without add_special and parse_special, and checks what tokenizer.h
 * promises for ANY file:
 *  - encode succeeds, or fails with ZI_EFORMAT (a "llama" vocabulary with
 *    no token for a byte) and a message; every id is inside the vocabulary;
 *    the count is bounded by the text's length; encoding the same text
 *    again gives the same ids (the piece cache must not change results);
 *  - decode never fails on ids encode produced, with and without special;
 *    its output is NUL-terminated and bounded by ZI_TOKEN_MAX_BYTES a token;
 *  - streaming (zi_detok_push / flush, buffer ZI_TOKEN_MAX_BYTES + 8, which
 *    the header says always suffices) emits exactly decode's bytes, save
 *    the one leading space decode drops for add_space_prefix files and
 *    the spaces a WordPiece ("bert") decode cleans up (only spaces: the
 *    two agree with every ' ' removed);
 *  - per-token queries agree with each other and reject ids outside the
 *    vocabulary; the end-of-generation ids are ascending and in range.
 * A broken promise calls __builtin_trap(), which libFuzzer (and
 * fuzz_tokenizer_replay.c, which links this same file) reports as a crash.
 * Time and memory per input are bounded by the input's size: at most
 * TEXT_MAX bytes of it are encoded, and at most TOKENS_WALKED tokens are
 * queried one by one.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"
#include "tokenizer_impl.h" /* white-box: the model kind (check_decode) */
#include "zi_error.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Says which promise broke (the replay test has no symbols to show). */
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_tokenizer.c:%d: check failed: %s\n", __LINE__, #c);              \
            __builtin_trap();                                                                      \
        }                                                                                          \
    } while (0)

#define TEXT_MAX 1024     /* bytes of the input encoded as text */
#define TOKENS_WALKED 160 /* tokens queried one by one (first and last) */

static const struct {
    const char *s;
    size_t n;
} k_texts[] = {
#define T(lit)                                                                                     \
    { lit, sizeof(lit) - 1 }
    T(""),
    T(" "),
    T("Hello world"),
    T(" Hello  World!\n\n\tit's 12345 3.14159 and 1,000,000"),
    T("   leading and trailing   \r\n"),
    T("a\0b\0\0c"),
    T("\xe4\xb8\xad\xe6\x96\x87 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xed\x95\x9c"),
    T("\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbb e\xcc\x81 \xd9\xa3\xd9\xa4 \xe2\x85\xa7"),
    T("\xff\xfe\x80 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82"),
    T("<s></s><unk><|endoftext|><|im_start|>user\nhi<|im_end|>"),
    T("<|begin_of_text|><|eot_id|><start_of_turn><end_of_turn><|end|>"),
    T("\xe2\x96\x81\xe2\x96\x81x <0x41><0xFF>"),
    T("def f(x):\n    return x**2  # ok\n"),
#undef T
};

static void check_err(int rc, const zi_error *err) {
    CHECK(rc < 0);
    size_t len = strnlen(err->msg, sizeof err->msg);
    CHECK(len > 0 && len < sizeof err->msg);
    CHECK(!memchr(err->msg, '\n', len));
}

/* Decodes ids both at once and streamed; checks they agree. */
static void check_decode(const zi_tokenizer *t, const int32_t *ids, size_t n, int special,
                         char *buf) {
    char *out = (char *)1;
    size_t len = 12345;
    zi_error err = {0};
    int rc = zi_tokenizer_decode(t, ids, n, special, &out, &len, &err);
    CHECK(rc == ZI_OK);
    CHECK(out != NULL && out[len] == '\0');
    CHECK(len <= n * (size_t)ZI_TOKEN_MAX_BYTES);

    /* Streaming: the concatenation of what push and flush emit (WordPiece
     * decode removes spaces, so it may be longer: up to every piece). */
    int wpm = t->model == TOK_MODEL_WPM; /* white-box: tokenizer_impl.h */
    size_t cap = len + 2, got = 0;
    for (size_t i = 0; wpm && i < n; i++) {
        int l = zi_tokenizer_token_bytes(t, ids[i], special, NULL, 0);
        CHECK(l >= 0);
        cap += (size_t)l;
    }
    char *cat = malloc(cap);
    CHECK(cat != NULL);
    zi_detok d;
    zi_detok_init(&d);
    for (size_t i = 0; i < n; i++) {
        int k = zi_detok_push(&d, t, ids[i], special, buf, ZI_TOKEN_MAX_BYTES + 8);
        CHECK(k >= 0 && buf[k] == '\0');
        CHECK(got + (size_t)k <= cap);
        memcpy(cat + got, buf, (size_t)k);
        got += (size_t)k;
    }
    int k = zi_detok_flush(&d, buf, ZI_TOKEN_MAX_BYTES + 8);
    CHECK(k >= 0 && k <= 8 && got + (size_t)k <= cap);
    memcpy(cat + got, buf, (size_t)k);
    got += (size_t)k;
    CHECK(d.n_pending == 0);
    /* decode drops one leading space of the first token (add_space_prefix
     * files); streaming never does. */
    if (wpm) {
        CHECK(got >= len);
        size_t a = 0, b = 0;
        for (;; a++, b++) {
            while (a < got && cat[a] == ' ') a++;
            while (b < len && out[b] == ' ') b++;
            if (a == got || b == len) break;
            CHECK(cat[a] == out[b]);
        }
        CHECK(a == got && b == len);
    } else if (got == len)
        CHECK(memcmp(cat, out, len) == 0);
    else
        CHECK(got == len + 1 && cat[0] == ' ' && memcmp(cat + 1, out, len) == 0);
    free(cat);
    free(out);
}

static void encode_one(zi_tokenizer *t, const char *s, size_t len, int add, int parse, char *buf) {
    int32_t *ids = (int32_t *)1;
    size_t n = 12345;
    zi_error err = {0};
    int rc = zi_tokenizer_encode(t, s, len, add, parse, &ids, &n, &err);
    if (rc != ZI_OK) {
        CHECK(rc == ZI_EFORMAT); /* a byte a "llama" vocabulary cannot spell */
        check_err(rc, &err);
        return;
    }
    CHECK(ids != NULL);
    /* At most one id per byte of the text as it reaches BPE (invalid UTF-8
     * becomes U+FFFD, 3 bytes), plus a space prefix per special fragment
     * (SPM: up to 3 byte tokens for U+2581) and BOS/EOS. */
    CHECK(n <= 4 * len + 16);
    int32_t nv = zi_tokenizer_vocab_size(t);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] >= 0 && ids[i] < nv);

    /* The same text again: the same ids (the piece cache is now warm). */
    int32_t *again = NULL;
    size_t n2 = 0;
    CHECK(zi_tokenizer_encode(t, s, len, add, parse, &again, &n2, &err) == ZI_OK);
    CHECK(n2 == n && (n == 0 || memcmp(ids, again, n * sizeof *ids) == 0));
    free(again);

    check_decode(t, ids, n, 0, buf);
    check_decode(t, ids, n, 1, buf);
    free(ids);
}

/* Per-token queries on token id (in range or not). */
static void query_token(const zi_tokenizer *t, int32_t id, char *buf) {
    int32_t nv = zi_tokenizer_vocab_size(t);
    int in = id >= 0 && id < nv;
    int ty = zi_tokenizer_token_type(t, id);
    CHECK(in ? ty >= 0 : ty == -1);
    for (int special = 0; special <= 1; special++) {
        int n = zi_tokenizer_token_bytes(t, id, special, buf, ZI_TOKEN_MAX_BYTES + 8);
        if (!in) {
            CHECK(n == -1);
            continue;
        }
        CHECK(n >= 0 && n <= ZI_TOKEN_MAX_BYTES);
        /* a short buffer gets the same length back */
        CHECK(zi_tokenizer_token_bytes(t, id, special, buf, 1) == n);
    }
    (void)zi_tokenizer_is_eog(t, id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_gguf *g = NULL;
    zi_error err = {0};
    if (zi_gguf_open_memory(data, size, &g, &err) != ZI_OK) return 0;
    zi_tokenizer *t = (zi_tokenizer *)1;
    int rc = zi_tokenizer_load(g, &t, &err);
    if (rc != ZI_OK) {
        CHECK(t == NULL);
        /* (ZI_EINVAL: a required key is missing, as gguf.h's getters say) */
        CHECK(rc == ZI_EFORMAT || rc == ZI_EUNSUPPORTED || rc == ZI_ERANGE || rc == ZI_ENOMEM ||
              rc == ZI_EINVAL);
        check_err(rc, &err);
        zi_gguf_close(g);
        return 0;
    }
    CHECK(t != NULL);
    /* The tokenizer keeps no reference to the file. */
    zi_gguf_close(g);

    int32_t nv = zi_tokenizer_vocab_size(t);
    CHECK(nv > 0);
    int32_t bos = zi_tokenizer_bos(t), eos = zi_tokenizer_eos(t);
    CHECK(bos >= -1 && bos < nv);
    CHECK(eos >= -1 && eos < nv);
    char *buf = malloc(ZI_TOKEN_MAX_BYTES + 8);
    CHECK(buf != NULL);

    zi_i32_list eog = {0};
    CHECK(zi_tokenizer_eog_ids(t, &eog, &err) == ZI_OK);
    for (size_t i = 0; i < eog.n; i++) {
        CHECK(eog.v[i] >= 0 && eog.v[i] < nv && zi_tokenizer_is_eog(t, eog.v[i]));
        if (i) CHECK(eog.v[i] > eog.v[i - 1]);
    }
    if (eos >= 0) CHECK(zi_tokenizer_is_eog(t, eos));
    zi_i32_list_free(&eog);

    static const int32_t bad[] = {-1, INT32_MIN, INT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) query_token(t, bad[i], buf);
    query_token(t, nv, buf);
    int32_t walk = nv < TOKENS_WALKED ? nv : TOKENS_WALKED;
    for (int32_t i = 0; i < walk / 2; i++) query_token(t, i, buf);
    for (int32_t i = nv - (walk - walk / 2); i < nv; i++) query_token(t, i, buf);
    int32_t oob[] = {0, nv};
    char *o = (char *)1;
    size_t ol = 1;
    CHECK(zi_tokenizer_decode(t, oob, 2, 0, &o, &ol, &err) == ZI_EINVAL && o == NULL);

    for (int flags = 0; flags < 4; flags++) {
        int add = flags & 1, parse = flags >> 1;
        for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++)
            encode_one(t, k_texts[i].s, k_texts[i].n, add, parse, buf);
        /* The input's tail: in a vocabulary file, token texts. */
        size_t tail = size < TEXT_MAX ? size : TEXT_MAX;
        encode_one(t, (const char *)data + size - tail, tail, add, parse, buf);
    }
    /* The special (control) tokens' own texts, parsed as special. */
    for (int32_t i = 0; i < walk / 2; i++) {
        int n = zi_tokenizer_token_bytes(t, i, 1, buf, ZI_TOKEN_MAX_BYTES + 8);
        if (n <= 0 || n > 256) continue;
        char text[520];
        memcpy(text, buf, (size_t)n);
        memcpy(text + n, text, (size_t)n); /* twice, back to back */
        encode_one(t, text, 2 * (size_t)n, 1, 1, buf);
        encode_one(t, text, (size_t)n, 0, 0, buf);
    }
    free(buf);
    zi_tokenizer_free(t);
    return 0;
}
