/*
 * tokenizer_decode.c - token ids back to bytes: what each token decodes to,
 * precomputed once at load, then zi_tokenizer_token_bytes,
 * zi_tokenizer_decode and the incremental zi_detok for streaming.
 *
 * A normal token's text is in the GPT-2 byte-to-unicode mapping, so each of
 * its characters maps back to one byte (a character outside the mapping is
 * spelled out as llama.cpp does), or, for SentencePiece-style vocabularies,
 * its text with U+2581 turned back into ' ' (WordPiece too, whose decode
 * then cleans up spaces as llama.cpp does); a byte token "<0xAB>" is that byte;
 * control, unknown and user-defined tokens are their raw text, and control
 * and unknown ones are hidden at lookup time unless `special` is set.
 */
#include "tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

/* ------------------------------------------------------------------------ */
/* the decoded bytes of each token */

/* A growable byte buffer for building the decoded pieces. */
typedef struct bytebuf {
    char *p;
    size_t len, cap;
} bytebuf;

static int bb_put(bytebuf *b, const void *src, size_t n) {
    if (tok_reserve_bytes(&b->p, &b->cap, b->len + n)) return ZI_ENOMEM;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return ZI_OK;
}

/* Decoded bytes of a normal token: each character mapped back to its byte;
 * a character outside the mapping is spelled out as llama.cpp does. */
static int build_normal_piece(const zi_tokenizer *t, int32_t id, bytebuf *b) {
    const unsigned char *s = (const unsigned char *)t->arena + t->str_off[id];
    size_t n = t->str_len[id], start = b->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = zi_utf8_decode(s + i, n - i, &cp);
        int byte = tok_cp_to_byte(cp);
        if (byte >= 0) {
            char c = (char)byte;
            if (bb_put(b, &c, 1)) return ZI_ENOMEM;
        } else {
            static const char hex[] = "0123456789abcdef";
            unsigned char u[4];
            size_t ul = zi_utf8_encode(cp, u);
            char h[8];
            for (size_t k = 0; k < ul; k++) {
                h[2 * k] = hex[u[k] >> 4];
                h[2 * k + 1] = hex[u[k] & 15];
            }
            if (bb_put(b, "[UNK_BYTE_0x", 12) || bb_put(b, h, 2 * ul) || bb_put(b, s, n) ||
                bb_put(b, "]", 1))
                return ZI_ENOMEM;
        }
        i += l;
        if (b->len - start > TOK_MAX_PIECE_BYTES) return ZI_EFORMAT; /* stop a blow-up early */
    }
    return ZI_OK;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Precomputes what each token decodes to (for special = 1; control and
 * unknown tokens are hidden at lookup time when special = 0). */
int tok_build_pieces(zi_tokenizer *t, zi_error *err) {
    size_t n = (size_t)t->n_vocab;
    t->piece_off = malloc(sizeof *t->piece_off * n);
    t->piece_len = malloc(sizeof *t->piece_len * n);
    if (!t->piece_off || !t->piece_len)
        return zi_error_set(err, ZI_ENOMEM, "out of memory for token pieces");
    bytebuf b = {NULL, 0, 0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint8_t a = t->attr[id];
        const char *txt = t->arena + t->str_off[id];
        uint32_t tl = t->str_len[id];
        size_t start = b.len;
        int rc = ZI_OK;
        if (a & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN | TOK_ATTR_USER)) {
            rc = bb_put(&b, txt, tl); /* the raw text */
        } else if ((a & TOK_ATTR_NORMAL) &&
                   (t->model == TOK_MODEL_SPM || t->model == TOK_MODEL_WPM)) {
            rc = tok_reserve_bytes(&b.p, &b.cap, b.len + tl);
            if (!rc) b.len += tok_spm_unescape(txt, tl, b.p + b.len);
        } else if (a & TOK_ATTR_NORMAL) {
            rc = build_normal_piece(t, id, &b);
        } else if ((a & TOK_ATTR_BYTE) && tl == 6 && memcmp(txt, "<0x", 3) == 0 && txt[5] == '>' &&
                   hexval(txt[3]) >= 0 && hexval(txt[4]) >= 0) {
            char c = (char)(hexval(txt[3]) * 16 + hexval(txt[4]));
            rc = bb_put(&b, &c, 1);
        } /* unused / undefined types decode to nothing */
        if (rc == ZI_ENOMEM) {
            free(b.p);
            return zi_error_set(err, ZI_ENOMEM, "out of memory for token pieces");
        }
        if (rc || b.len - start > TOK_MAX_PIECE_BYTES) {
            free(b.p);
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.tokens[%d] does not decode to bytes: too many "
                                "characters outside the byte-level alphabet",
                                (int)id);
        }
        t->piece_off[id] = start;
        t->piece_len[id] = (uint32_t)(b.len - start);
    }
    t->piece_arena = b.p;
    return ZI_OK;
}

/* ------------------------------------------------------------------------ */
/* decoding and streaming */

static int piece_of(const zi_tokenizer *t, int32_t id, int special, const char **p, size_t *n) {
    if (id < 0 || id >= t->n_vocab) return -1;
    if (!special && (t->attr[id] & (TOK_ATTR_CONTROL | TOK_ATTR_UNKNOWN))) {
        *p = "";
        *n = 0;
        return 0;
    }
    *p = t->piece_arena ? t->piece_arena + t->piece_off[id] : "";
    *n = t->piece_len[id];
    return 0;
}

int zi_tokenizer_token_bytes(const zi_tokenizer *t, int32_t id, int special, char *buf,
                             size_t cap) {
    const char *p;
    size_t n;
    if (piece_of(t, id, special, &p, &n)) return -1;
    if (cap > 0 && n > 0) memcpy(buf, p, n < cap ? n : cap);
    return (int)n;
}

int zi_tokenizer_constraint_bytes(const void *tok, int32_t id, char *buf, size_t cap) {
    const zi_tokenizer *t = tok;
    if (zi_tokenizer_token_type(t, id) == ZI_TOKEN_CONTROL) return 0;
    int n = zi_tokenizer_token_bytes(t, id, 0, buf, cap);
    return n < 0 ? 0 : n;
}

int zi_tokenizer_decode(const zi_tokenizer *t, const int32_t *ids, size_t n, int special,
                        char **out, size_t *len, zi_error *err) {
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p;
        size_t l;
        if (piece_of(t, ids[i], special, &p, &l))
            return zi_error_set(err, ZI_EINVAL, "decode: ids[%zu] = %d is outside the vocabulary",
                                i, (int)ids[i]);
        total += l;
    }
    char *s = malloc(total + 1);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "decode: out of memory for %zu bytes", total);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = "";
        size_t l = 0;
        piece_of(t, ids[i], special, &p, &l);
        /* llama.cpp's detokenize drops one leading space of the first
         * token when the file adds a space prefix (even when that token is
         * BOS, whose text has none, so then nothing is dropped). */
        if (i == 0 && t->add_space_prefix && l > 0 && p[0] == ' ') {
            p++;
            l--;
        }
        memcpy(s + k, p, l);
        k += l;
    }
    /* WordPiece: llama.cpp's clean-up of spaces before punctuation. */
    if (t->model == TOK_MODEL_WPM) k = tok_wpm_clean_spaces(s, k);
    s[k] = '\0';
    *out = s;
    *len = k;
    return ZI_OK;
}

void zi_detok_init(zi_detok *d) {
    memset(d, 0, sizeof *d);
}

/* Bytes at the end of s[0..n) that begin a UTF-8 character still missing
 * continuation bytes (0 when the text ends on a character boundary). */
static size_t incomplete_tail(const unsigned char *s, size_t n) {
    size_t k = 0;
    while (k < n && k < 3 && (s[n - 1 - k] & 0xC0) == 0x80) k++;
    if (k == n) return 0; /* only continuation bytes: nothing to wait for */
    unsigned char lead = s[n - 1 - k];
    size_t want = zi_utf8_lead_len(lead);
    if (want >= 2 && want > k + 1) return k + 1;
    return 0;
}

int zi_detok_push(zi_detok *d, const zi_tokenizer *t, int32_t id, int special, char *out,
                  size_t cap) {
    const char *p;
    size_t n;
    if (piece_of(t, id, special, &p, &n)) return -1;
    size_t total = d->n_pending + n;
    if (cap == 0) return -1;
    /* Decide what to hold back by looking at the last few bytes of the
     * concatenation pending + piece. */
    unsigned char tail[8];
    size_t tn = total < 4 ? total : 4;
    for (size_t i = 0; i < tn; i++) {
        size_t at = total - tn + i;
        tail[i] = at < d->n_pending ? d->pending[at] : (unsigned char)p[at - d->n_pending];
    }
    size_t hold = incomplete_tail(tail, tn);
    size_t emit = total - hold;
    if (emit + 1 > cap) return -1;
    size_t from_pending = emit < d->n_pending ? emit : d->n_pending;
    memcpy(out, d->pending, from_pending);
    memcpy(out + from_pending, p, emit - from_pending);
    out[emit] = '\0';
    /* Keep the held bytes (they come from the piece and maybe pending). */
    unsigned char keep[8];
    for (size_t i = 0; i < hold; i++) {
        size_t at = emit + i;
        keep[i] = at < d->n_pending ? d->pending[at] : (unsigned char)p[at - d->n_pending];
    }
    memcpy(d->pending, keep, hold);
    d->n_pending = hold;
    return (int)emit;
}

int zi_detok_flush(zi_detok *d, char *out, size_t cap) {
    if (d->n_pending + 1 > cap) return -1;
    memcpy(out, d->pending, d->n_pending);
    out[d->n_pending] = '\0';
    int n = (int)d->n_pending;
    d->n_pending = 0;
    return n;
}
