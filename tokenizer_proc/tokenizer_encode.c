/*
 * tokenizer_encode.c - zi_tokenizer_encode: text to token ids, driving the
 * stages in llama.cpp's order.
 *
 *  1. Special-token partition. Control/unknown tokens (only when
 *     parse_special is set) and user-defined tokens (always) are searched
 *     for in the raw text, longest text first; every occurrence in the
 *     still-raw fragments becomes that token, splitting the fragment.
 *  2. Normalisation of each raw fragment: bytes that are not valid UTF-8
 *     become U+FFFD and odd-but-structurally-valid sequences (overlong forms)
 *     are re-encoded, because llama.cpp decodes to codepoints and re-encodes
 *     before BPE. Ordinary valid text is left untouched (and not copied).
 *  3. Pre-tokenization of the clean text (tokenizer_pretok.c), and
 *  4. BPE on each piece (tokenizer_bpe.c).
 * SentencePiece-style vocabularies skip 2-4: each raw fragment goes, as it
 * is, to tokenizer_spm.c; WordPiece ones to tokenizer_wpm.c, which
 * normalises and splits it itself.
 *
 * BOS/EOS are added around the result as the file says (WordPiece: BOS
 * and SEP).
 */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* A stretch of the input text: raw text still to encode, or the text of one
 * special token found by the partition. */
typedef struct tok_fragment {
    size_t off, len;
    int32_t token; /* -1: raw text */
} fragment;

/* Encodes one raw fragment: normalises it first when it holds bytes that
 * do not survive llama.cpp's decode/re-encode round trip unchanged. */
static int encode_raw(zi_tokenizer *t, const unsigned char *s, size_t n, tok_idvec *out) {
    size_t i = 0;
    int clean = 1;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        unsigned char u[4];
        /* Same length means same bytes; an invalid byte decodes to U+FFFD
         * from one byte and an overlong form to a shorter encoding. */
        if (zi_utf8_encode(cp, u) != l) {
            clean = 0;
            break;
        }
        i += l;
    }
    if (clean) return tok_pretok_encode(t, s, n, out);

    /* Every input byte yields at most 3 output bytes (U+FFFD). */
    if (n > (SIZE_MAX - 16) / 3) return ZI_ERANGE;
    if (3 * n > t->norm_cap) {
        unsigned char *b = realloc(t->norm, 3 * n);
        if (!b) return ZI_ENOMEM;
        t->norm = b;
        t->norm_cap = 3 * n;
    }
    size_t m = 0;
    for (i = 0; i < n;) {
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        m += zi_utf8_encode(cp, t->norm + m);
        i += l;
    }
    return tok_pretok_encode(t, t->norm, m, out);
}

static int frag_reserve(zi_tokenizer *t, size_t need) {
    if (need <= t->frag_cap) return ZI_OK;
    size_t cap = t->frag_cap ? t->frag_cap : 16;
    while (cap < need) cap *= 2;
    fragment *a = realloc(t->frag_a, sizeof *a * cap);
    if (!a) return ZI_ENOMEM;
    t->frag_a = a;
    fragment *b = realloc(t->frag_b, sizeof *b * cap);
    if (!b) return ZI_ENOMEM;
    t->frag_b = b;
    t->frag_cap = cap;
    return ZI_OK;
}

/* isspace() in the C locale, as llama.cpp strips around LSTRIP/RSTRIP
 * tokens. */
static int c_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Marks in map (65536 bits) each pair of adjacent bytes of s[0..n). A
 * special token with a byte pair (among its first 32) that is not in the
 * map cannot occur, so the partition skips its pass: vocabularies with
 * hundreds or thousands of special tokens ("[PAD123]",
 * "<|reserved_special_token_12|>") would otherwise spend most of encode in
 * memmem. */
static void byte_pairs(uint64_t *map, const char *s, size_t n) {
    memset(map, 0, 65536 / 8);
    for (size_t i = 0; i + 1 < n; i++) {
        unsigned k = (unsigned char)s[i] << 8 | (unsigned char)s[i + 1];
        map[k >> 6] |= 1ull << (k & 63);
    }
}

static int may_occur(const uint64_t *map, const char *s, size_t n) {
    for (size_t i = 0; i + 1 < n && i < 32; i++) {
        unsigned k = (unsigned char)s[i] << 8 | (unsigned char)s[i + 1];
        if (!(map[k >> 6] >> (k & 63) & 1)) return 0;
    }
    return 1;
}

/* Special-token partition; returns the fragment count (in t->frag_a) or a
 * negative status. */
static long partition(zi_tokenizer *t, const char *text, size_t len, int parse_special) {
    uint64_t pairs[65536 / 64];
    byte_pairs(pairs, text, len);
    if (frag_reserve(t, 1)) return ZI_ENOMEM;
    t->frag_a[0] = (fragment){0, len, -1};
    size_t nf = 1;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) continue;
        const char *tt = t->arena + t->str_off[id];
        size_t tl = t->str_len[id];
        if (!may_occur(pairs, tt, tl)) continue;
        size_t nb = 0;
        for (size_t f = 0; f < nf; f++) {
            fragment fr = t->frag_a[f];
            if (fr.token >= 0 || fr.len < tl) {
                if (frag_reserve(t, nb + 1)) return ZI_ENOMEM;
                t->frag_b[nb++] = fr;
                continue;
            }
            size_t pos = fr.off, end = fr.off + fr.len;
            for (;;) {
                const char *hit = memmem(text + pos, end - pos, tt, tl);
                if (!hit) break;
                size_t at = (size_t)(hit - text), left = at;
                if (t->attr[id] & TOK_ATTR_LSTRIP)
                    while (left > pos && c_space(text[left - 1])) left--;
                if (frag_reserve(t, nb + 2)) return ZI_ENOMEM;
                if (left > pos) t->frag_b[nb++] = (fragment){pos, left - pos, -1};
                t->frag_b[nb++] = (fragment){at, tl, id};
                pos = at + tl;
                if (t->attr[id] & TOK_ATTR_RSTRIP)
                    while (pos < end && c_space(text[pos])) pos++;
            }
            if (pos < end) {
                if (frag_reserve(t, nb + 1)) return ZI_ENOMEM;
                t->frag_b[nb++] = (fragment){pos, end - pos, -1};
            }
        }
        fragment *tmp = t->frag_a;
        t->frag_a = t->frag_b;
        t->frag_b = tmp;
        nf = nb;
    }
    return (long)nf;
}

/* The pre-tokenizer a full load wires in (see tok_pretok_ops). */
static const tok_pretok_ops k_pretok_ops = {tok_pretok_lookup, tok_pretok_init, tok_pretok_free};

int zi_tokenizer_load(const zi_gguf *g, zi_tokenizer **out, zi_error *err) {
    return tok_load(g, &k_pretok_ops, out, err);
}

int zi_tokenizer_encode(zi_tokenizer *t, const char *text, size_t len, int add_special,
                        int parse_special, int32_t **ids, size_t *n, zi_error *err) {
    *ids = NULL;
    *n = 0;
    if (!t->pretok_ops)
        return zi_error_set(err, ZI_EINVAL,
                            "encode: this tokenizer was loaded for its vocabulary only "
                            "(zi_tokenizer_load_vocab)");
    if (!text && len > 0) return zi_error_set(err, ZI_EINVAL, "encode: text is NULL");
    if (len > ((size_t)1 << 31))
        return zi_error_set(err, ZI_ERANGE, "encode: text of %zu bytes exceeds 2 GiB", len);
    tok_idvec out = {NULL, 0, 0};
    int rc = ZI_OK;
    /* WPM: llama.cpp adds [CLS] and [SEP] whatever add_bos/eos say. */
    int wpm = t->model == TOK_MODEL_WPM;
    if (add_special && (t->add_bos || wpm)) rc = tok_idvec_push(&out, t->bos);
    if (!rc && len > 0) {
        long nf = partition(t, text, len, parse_special);
        if (nf < 0) rc = (int)nf;
        int after_special = 1; /* SPM: the text start counts as one */
        for (long f = 0; !rc && f < nf; f++) {
            fragment fr = t->frag_a[f];
            if (fr.token >= 0) {
                rc = tok_idvec_push(&out, fr.token);
                after_special = 1;
            } else if (wpm) {
                rc = tok_wpm_encode(t, (const unsigned char *)text + fr.off, fr.len, &out);
            } else if (t->model == TOK_MODEL_SPM) {
                rc = tok_spm_encode(t, text + fr.off, fr.len, t->add_space_prefix && after_special,
                                    &out);
                after_special = 0;
            } else {
                rc = encode_raw(t, (const unsigned char *)text + fr.off, fr.len, &out);
            }
        }
    }
    if (!rc && add_special && wpm) rc = tok_idvec_push(&out, t->sep);
    if (!rc && add_special && t->add_eos && !wpm) rc = tok_idvec_push(&out, t->eos);
    if (rc == ZI_EFORMAT && wpm) {
        free(out.v);
        return zi_error_set(err, rc,
                            "encode: a word has no WordPiece tokens and the vocabulary has no "
                            "unknown token (tokenizer.ggml.unknown_token_id)");
    }
    if (rc == ZI_EFORMAT) {
        free(out.v);
        return zi_error_set(err, rc,
                            "encode: the vocabulary has no token for byte 0x%02X (no "
                            "<0x%02X> token)",
                            t->spm_missing_byte, t->spm_missing_byte);
    }
    if (rc) {
        free(out.v);
        return zi_error_set(err, rc, "encode: %s while encoding %zu bytes", zi_status_name(rc),
                            len);
    }
    if (!out.v) { /* an empty result is still a valid allocation */
        out.v = malloc(sizeof(int32_t));
        if (!out.v) return zi_error_set(err, ZI_ENOMEM, "encode: out of memory");
    }
    *ids = out.v;
    *n = out.n;
    return ZI_OK;
}

int32_t zi_tokenizer_single_id(void *tok, const char *text) {
    int32_t *ids = NULL;
    size_t n = 0;
    zi_error e = {0};
    if (zi_tokenizer_encode(tok, text, strlen(text), 0, 1, &ids, &n, &e)) return -1;
    int32_t id = n == 1 ? ids[0] : -1;
    free(ids);
    return id;
}
