/*
 * tokenizer_wpm.c - WordPiece vocabularies (tokenizer.ggml.model "bert":
 * BERT, BGE, nomic-embed and the other bert-family encoders), encoded and
 * decoded as llama.cpp's WPM tokenizer does.
 *
 * What llama.cpp does, and so what this file reproduces, for each raw
 * fragment the special-token partition leaves:
 *  - Normalise codepoint by codepoint (invalid UTF-8 has become U+FFFD):
 *    with strip_accents, each codepoint first becomes the first codepoint
 *    of its NFD form (zi_unicode_nfd_first). Whitespace ends a word; NUL,
 *    U+FFFD and control/format characters (\p{C} but unassigned) are
 *    dropped; with strip_accents, marks (\p{M}) are dropped; with
 *    lowercase, the rest is lowercased. A punctuation character, an ASCII
 *    symbol (\p{S} below U+007F) or a CJK ideograph (the ranges below) is a
 *    word of its own.
 *    tokenizer.ggml.normalizer.lowercase defaults to true, and
 *    .strip_accents to the lowercase value.
 *  - Each word, with U+2581 put in front, is cut greedily from the left
 *    into the longest byte strings that are tokens (any token; byte
 *    offsets, not characters, as llama.cpp compares substrings). When some
 *    position has no token, the whole word becomes the unknown token.
 *    There is no word-length limit (Hugging Face's 100 characters is not
 *    applied by llama.cpp either).
 *  - add_special puts BOS ([CLS]) before and SEP after the ids, whatever
 *    add_bos_token / add_eos_token say (tokenizer_encode.c).
 *  - Decoding: a normal token's U+2581 is a space (so the text starts with
 *    one), then llama.cpp's clean_up_tokenization_spaces
 *    (tok_wpm_clean_spaces).
 *
 * Cost: each word position tries at most max_token_len lengths, with the
 * prefix hashes computed once per position, so O(word bytes x longest
 * token) per word.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

int tok_wpm_load(zi_tokenizer *t, const zi_gguf *g, zi_error *err) {
    int rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.normalizer.lowercase", 1, &t->wpm_lower, err);
    if (!rc)
        rc = zi_gguf_get_bool_or(g, "tokenizer.ggml.normalizer.strip_accents", t->wpm_lower,
                                 &t->wpm_strip, err);
    if (rc) return rc;
    t->max_token_len = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->str_len[id] > t->max_token_len) t->max_token_len = t->str_len[id];
    t->wpm_hash = malloc(sizeof *t->wpm_hash * ((size_t)t->max_token_len + 1));
    if (!t->wpm_hash) return zi_error_set(err, ZI_ENOMEM, "out of memory for the WordPiece table");
    return ZI_OK;
}

/* CJK ideographs, each a word of its own (llama.cpp's ranges, which follow
 * Hugging Face's, 0x2B920 included). */
static int is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

#define WPM_PREFIX "\xe2\x96\x81" /* U+2581, put before every word */
#define WPM_PREFIX_LEN 3

/* Cuts the word w[0..m) (U+2581 included, m > 3) into tokens; ZI_EFORMAT
 * when it needs the unknown token and the file has none. */
static int encode_word(zi_tokenizer *t, const unsigned char *w, size_t m, tok_idvec *out) {
    size_t start = out->n;
    for (size_t i = 0; i < m;) {
        size_t L = m - i < t->max_token_len ? m - i : t->max_token_len;
        uint32_t h = 2166136261u; /* tok_hash_bytes, one prefix at a time */
        for (size_t k = 0; k < L; k++) t->wpm_hash[k + 1] = h = (h ^ w[i + k]) * 16777619u;
        int32_t id = -1;
        size_t k = L;
        for (; k > 0; k--) {
            id = tok_str_find_hashed(t, (const char *)w + i, k, t->wpm_hash[k]);
            if (id >= 0 && id < t->n_vocab) break;
        }
        if (k == 0) {
            out->n = start; /* no token here: the whole word is unknown */
            break;
        }
        if (tok_idvec_push(out, id)) return ZI_ENOMEM;
        i += k;
    }
    if (out->n > start) return ZI_OK;
    if (t->unk < 0) return ZI_EFORMAT;
    return tok_idvec_push(out, t->unk);
}

/* Appends n bytes to the word being built. */
static int word_put(zi_tokenizer *t, size_t *len, const void *p, size_t n) {
    if (tok_reserve_bytes(&t->wpm_word, &t->wpm_word_cap, *len + n)) return ZI_ENOMEM;
    memcpy(t->wpm_word + *len, p, n);
    *len += n;
    return ZI_OK;
}

/* Encodes the word built so far, if any, and starts a new one. */
static int word_end(zi_tokenizer *t, size_t *len, tok_idvec *out) {
    int rc = ZI_OK;
    if (*len > WPM_PREFIX_LEN) rc = encode_word(t, (unsigned char *)t->wpm_word, *len, out);
    *len = WPM_PREFIX_LEN;
    return rc;
}

int tok_wpm_encode(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out) {
    size_t len = 0;
    int rc = word_put(t, &len, WPM_PREFIX, WPM_PREFIX_LEN);
    for (size_t i = 0; !rc && i < n;) {
        uint32_t cp;
        i += zi_utf8_decode(s + i, n - i, &cp);
        if (t->wpm_strip) cp = zi_unicode_nfd_first(cp);
        uint16_t f = zi_unicode_flags(cp);
        if (f & ZI_UC_WHITESPACE) {
            rc = word_end(t, &len, out);
            continue;
        }
        if (cp == 0 || cp == ZI_UNICODE_REPLACEMENT || (f & ZI_UC_CONTROL)) continue;
        if (t->wpm_strip && (f & ZI_UC_MARK)) continue;
        unsigned char u[4];
        size_t ul = zi_utf8_encode(t->wpm_lower ? zi_unicode_tolower(cp) : cp, u);
        int alone = (f & ZI_UC_PUNCT) || (cp < 0x7F && (f & ZI_UC_SYMBOL)) || is_cjk(cp);
        if (alone && (rc = word_end(t, &len, out))) break;
        if ((rc = word_put(t, &len, u, ul))) break;
        if (alone) rc = word_end(t, &len, out);
    }
    if (!rc) rc = word_end(t, &len, out);
    return rc;
}

size_t tok_wpm_clean_spaces(char *s, size_t n) {
    /* 1: no space before ? ! . , */
    size_t total = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ','))
            total--; /* the space goes */
        s[total++] = x;
    }
    /* 2: " ' " becomes "'" (the next space is blanked out and skipped) */
    size_t n2 = total;
    total = n2 ? 1 : 0;
    for (size_t i = 1; i < n2; i++) {
        char x = s[i];
        if (x == '\'' && i + 1 < n2 && s[i - 1] == ' ' && s[i + 1] == ' ') {
            total--;
            s[++i] = '\0';
        }
        s[total++] = x;
    }
    /* 3: no space before 's 'm 're 've (but before 't 'd 'll) */
    size_t n3 = total;
    total = n3 ? 1 : 0;
    for (size_t i = 1; i < n3; i++) {
        char x = s[i];
        if (s[i - 1] == ' ' && x == '\'' && i + 1 < n3) {
            char x1 = s[i + 1];
            if (x1 == 's' || x1 == 'm')
                total--;
            else if (i + 2 < n3 &&
                     ((x1 == 'r' && s[i + 2] == 'e') || (x1 == 'v' && s[i + 2] == 'e')))
                total--;
        }
        s[total++] = x;
    }
    return total;
}
