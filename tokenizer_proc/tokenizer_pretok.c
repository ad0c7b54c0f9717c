/*
 * tokenizer_pretok.c - the pre-tokenizers: which tokenizer.ggml.pre names
 * zinfer implements, the scanner that splits clean text into pieces, and
 * the loop that encodes the pieces one by one (BPE in tokenizer_bpe.c)
 * through a direct-mapped cache of the results for short pieces. The loop
 * and the cache live beside the scanner so that the compiler can inline
 * the whole per-piece path, as it did when this was one file.
 *
 * The scanner is hand-written (no regex engine) and reproduces the GPT-2
 * pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
 * ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+, optionally preceded by a split that
 * isolates every \p{N} codepoint (the "smollm"/"starcoder" family); then
 * each span between two numbers is scanned on its own, as llama.cpp does.
 *
 * To add a pre-tokenizer: a tok_pretok_kind (tokenizer_impl.h), its
 * scanning in tok_pretok_encode(), and its names in k_pretoks.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* The tokenizer.ggml.pre names each pre-tokenizer answers to, as llama.cpp
 * defines them. */
static const struct {
    const char *name;
    tok_pretok_kind kind;
} k_pretoks[] = {
    {"gpt-2", TOK_PRETOK_GPT2},
    {"gpt2", TOK_PRETOK_GPT2},
    {"smollm", TOK_PRETOK_DIGITS_GPT2},
    {"starcoder", TOK_PRETOK_DIGITS_GPT2},
    {"refact", TOK_PRETOK_DIGITS_GPT2},
    {"command-r", TOK_PRETOK_DIGITS_GPT2},
    {"codeshell", TOK_PRETOK_DIGITS_GPT2},
    {"exaone", TOK_PRETOK_DIGITS_GPT2},
    {"minerva-7b", TOK_PRETOK_DIGITS_GPT2},
};

int tok_pretok_lookup(zi_str name) {
    int kind = -1;
    for (size_t i = 0; i < sizeof k_pretoks / sizeof *k_pretoks; i++) {
        if (zi_str_eq(name, k_pretoks[i].name)) kind = (int)k_pretoks[i].kind;
    }
    return kind;
}

/* ------------------------------------------------------------------------ */
/* the scanner */

#define OUT_OF_RANGE UINT32_MAX

typedef struct scanner {
    const unsigned char *s;
    size_t n;
    int digits_split; /* \p{N} codepoints end the current range */
} scanner;

/* The codepoint at byte pos as the current range sees it: flags 0 and
 * *cp = OUT_OF_RANGE past the end of the text or, when digits are split
 * off, at a number (which starts a range of its own). */
static uint16_t look(const scanner *sc, size_t pos, uint32_t *cp, size_t *len) {
    if (pos >= sc->n) {
        *cp = OUT_OF_RANGE;
        *len = 0;
        return 0;
    }
    *len = zi_utf8_decode(sc->s + pos, sc->n - pos, cp);
    uint16_t f = zi_unicode_flags(*cp);
    if (sc->digits_split && (f & ZI_UC_NUMBER)) {
        *cp = OUT_OF_RANGE;
        return 0;
    }
    return f;
}

enum { RUN_LETTER, RUN_NUMBER, RUN_OTHER };

static int run_match(uint16_t f, int what) {
    switch (what) {
    case RUN_LETTER:
        return (f & ZI_UC_LETTER) != 0;
    case RUN_NUMBER:
        return (f & ZI_UC_NUMBER) != 0;
    default:
        return f != 0 && !(f & (ZI_UC_WHITESPACE | ZI_UC_LETTER | ZI_UC_NUMBER));
    }
}

/* One match of the GPT-2 pattern starting at pos (a codepoint of the current
 * range with flags f); returns where it ends. */
static size_t gpt2_match(const scanner *sc, size_t pos, uint32_t cp, size_t len, uint16_t f) {
    uint32_t c1, c2;
    size_t l1, l2;
    if (cp == '\'') {
        look(sc, pos + 1, &c1, &l1);
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (c1 == 'r' || c1 == 'v' || c1 == 'l') {
            look(sc, pos + 2, &c2, &l2);
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return pos + 3;
        }
    }
    /* " ?X+" where X is letters, numbers or "other": the optional space
     * joins a following run. */
    size_t p = pos;
    uint16_t f2 = f;
    size_t l = len;
    if (cp == ' ') {
        p = pos + 1;
        f2 = look(sc, p, &c1, &l);
    }
    int what = -1;
    if (f2 & ZI_UC_LETTER)
        what = RUN_LETTER;
    else if (f2 & ZI_UC_NUMBER)
        what = RUN_NUMBER;
    else if (run_match(f2, RUN_OTHER))
        what = RUN_OTHER;
    if (what >= 0) {
        while (run_match(f2, what)) {
            p += l;
            f2 = look(sc, p, &c1, &l);
        }
        return p;
    }
    /* \s+(?!\S) then \s+: a whitespace run followed by more text leaves its
     * last whitespace character for the next piece. */
    size_t q = pos, last = pos, nws = 0;
    for (;;) {
        uint16_t fw = look(sc, q, &c1, &l);
        if (!(fw & ZI_UC_WHITESPACE)) break;
        last = q;
        q += l;
        nws++;
    }
    if (nws > 1) {
        look(sc, q, &c1, &l);
        if (c1 != OUT_OF_RANGE) return last;
    }
    if (nws > 0) return q;
    return pos + len;
}

/* ------------------------------------------------------------------------ */
/* the piece loop and its cache */

/* Encodes one piece through the cache: a short piece seen before costs a
 * hash and a compare instead of a BPE run. */
static int encode_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out) {
    if (n > TOK_CACHE_KEY_MAX) return tok_bpe_piece(t, p, n, out);
    uint32_t h = tok_hash_bytes(p, n);
    tok_cache_slot *slot = &t->cache[h & (TOK_CACHE_SLOTS - 1)];
    if (slot->klen == n && slot->hash == h && memcmp(slot->key, p, n) == 0) {
        for (size_t i = 0; i < slot->nids; i++) {
            if (tok_idvec_push(out, slot->ids[i])) return ZI_ENOMEM;
        }
        return ZI_OK;
    }
    size_t before = out->n;
    int rc = tok_bpe_piece(t, p, n, out);
    if (rc) return rc;
    size_t nids = out->n - before;
    if (nids <= TOK_CACHE_IDS_MAX) {
        slot->hash = h;
        slot->klen = (uint8_t)n;
        slot->nids = (uint8_t)nids;
        memcpy(slot->key, p, n);
        if (nids) memcpy(slot->ids, out->v + before, nids * sizeof(int32_t));
    }
    return ZI_OK;
}

int tok_pretok_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out) {
    scanner sc = {s, n, t->pretok == TOK_PRETOK_DIGITS_GPT2};
    size_t pos = 0;
    while (pos < n) {
        uint32_t cp;
        size_t len = zi_utf8_decode(s + pos, n - pos, &cp);
        uint16_t f = zi_unicode_flags(cp);
        size_t end;
        if (sc.digits_split && (f & ZI_UC_NUMBER))
            end = pos + len;
        else
            end = gpt2_match(&sc, pos, cp, len, f);
        int rc = encode_piece(t, s + pos, end - pos, out);
        if (rc) return rc;
        pos = end;
    }
    return ZI_OK;
}
