/*
 * tokenizer_spm.c - SentencePiece-style vocabularies (tokenizer.ggml.model
 * "llama": Llama 2, Mistral, Gemma, Phi-3), encoded and decoded as
 * llama.cpp's SPM tokenizer does.
 *
 * What llama.cpp does, and so what this file reproduces:
 *  - Each raw fragment left by the special-token partition is encoded on
 *    its own, with no pre-tokenizer. A space is put in front of it when the
 *    file's add_space_prefix is set (default true) and the fragment is the
 *    first or follows a special token; then every ' ' becomes U+2581.
 *  - The text is cut into symbols, one per UTF-8 character as its lead
 *    byte's length says (the bytes are not validated: a stray continuation
 *    byte is a symbol of its own, and the last symbol is clipped at the end).
 *  - Every pair of neighbouring symbols whose joined text is a token (any
 *    token, whatever its type) is a candidate; the candidate whose token has
 *    the highest score is merged first, ties going to the leftmost. Merging
 *    creates new candidates with the merged symbol's neighbours; candidates
 *    whose symbols have changed since are dropped when they come up.
 *  - Each final symbol is its token, or, when its text is no token (only a
 *    single unmerged character can be that), one token per byte: "<0xXX>"
 *    (upper-case hex), else the token whose text is that one byte. A byte
 *    with neither has no encoding: ZI_EFORMAT (llama.cpp throws there).
 *  - Decoding turns U+2581 back into ' ' (tokenizer_decode.c calls
 *    tok_spm_unescape for normal tokens).
 */
#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "tokenizer_impl.h"

/* One symbol: a stretch of the escaped text; n == 0 once merged away. */
typedef struct tok_spm_sym {
    uint32_t off, n;
    int32_t prev, next;
} spm_sym;

/* One merge candidate: the symbols left and right (neighbours when it was
 * made) whose joined text, size bytes long, is a token of this score. */
typedef struct tok_spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_bigram;

/* ------------------------------------------------------------------------ */
/* loading */

int tok_spm_load(zi_tokenizer *t, const zi_gguf *g, zi_error *err) {
    size_t n = (size_t)t->n_vocab;
    t->score = calloc(n, sizeof *t->score); /* no scores: all 0, as llama.cpp */
    if (!t->score) return zi_error_set(err, ZI_ENOMEM, "out of memory for %zu scores", n);

    const zi_gguf_kv *kv = zi_gguf_find_kv(g, "tokenizer.ggml.scores");
    if (kv) {
        if (kv->type != ZI_GGUF_ARRAY ||
            (kv->arr_type != ZI_GGUF_FLOAT32 && kv->arr_type != ZI_GGUF_INT32))
            return zi_error_set(
                err, ZI_EFORMAT,
                "tokenizer.ggml.scores has type %s, expected an array of float32 "
                "or int32",
                zi_gguf_type_name(kv->type == ZI_GGUF_ARRAY ? kv->arr_type : kv->type));
        const void *data;
        uint64_t n_scores;
        int rc = zi_gguf_get_array(g, "tokenizer.ggml.scores", kv->arr_type, &data, &n_scores, err);
        if (rc) return rc;
        /* More scores than tokens are ignored, as llama.cpp ignores them. */
        if (n_scores < n)
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.scores has %llu entries, tokens has %zu",
                                (unsigned long long)n_scores, n);
        for (size_t i = 0; i < n; i++) {
            if (kv->arr_type == ZI_GGUF_FLOAT32) {
                memcpy(&t->score[i], (const char *)data + 4 * i, 4);
            } else {
                int32_t v;
                memcpy(&v, (const char *)data + 4 * i, 4);
                t->score[i] = (float)v;
            }
        }
    }

    t->max_token_len = 0;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->str_len[id] > t->max_token_len) t->max_token_len = t->str_len[id];

    /* The token each byte falls back to, as llama.cpp looks it up. */
    static const char hex[] = "0123456789ABCDEF";
    for (unsigned b = 0; b < 256; b++) {
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        int32_t id = tok_str_find(t, name, sizeof name);
        if (id < 0 || id >= t->n_vocab) {
            char c = (char)b;
            id = tok_str_find(t, &c, 1);
        }
        t->spm_byte_tok[b] = id >= 0 && id < t->n_vocab ? id : -1;
    }
    return ZI_OK;
}

/* ------------------------------------------------------------------------ */
/* the merge queue: a binary max-heap, best candidate on top */

/* True when a is merged before b: higher score, then further left. */
static int bigram_before(const spm_bigram *a, const spm_bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void heap_push(spm_bigram *h, size_t *n, spm_bigram v) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(&v, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static spm_bigram heap_pop(spm_bigram *h, size_t *n) {
    spm_bigram top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && bigram_before(&h[c + 1], &h[c])) c++;
        if (!bigram_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (m > 0) h[i] = last;
    return top;
}

/* ------------------------------------------------------------------------ */
/* encoding */

/* Grows a scratch array *p of *cap elements of size sz to hold need
 * (grow.h). */
static int reserve(void **p, size_t *cap, size_t need, size_t sz) {
    return zi_grow_to(p, cap, sz, need, 256);
}

/* Adds the candidate (left, right) when their joined text is a token. */
static void try_bigram(zi_tokenizer *t, const char *text, spm_sym *sy, spm_bigram *h, size_t *nh,
                       int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    uint32_t size = sy[left].n + sy[right].n;
    if (size > t->max_token_len) return; /* no token is that long */
    int32_t id = tok_str_find(t, text + sy[left].off, size);
    if (id < 0 || id >= t->n_vocab) return;
    heap_push(h, nh, (spm_bigram){t->score[id], left, right, size});
}

int tok_spm_encode(zi_tokenizer *t, const char *s, size_t n, int prefix_space, tok_idvec *out) {
    /* Escape: ' ' becomes U+2581 (3 bytes), so at most 3 bytes per byte. */
    size_t need = 3 * (n + 1);
    if (n > (size_t)INT32_MAX / 3 - 1) return ZI_ERANGE; /* 32-bit offsets */
    if (reserve((void **)&t->spm_text, &t->spm_text_cap, need, 1)) return ZI_ENOMEM;
    char *text = t->spm_text;
    size_t len = 0;
    if (prefix_space) {
        memcpy(text, "\xe2\x96\x81", 3);
        len = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(text + len, "\xe2\x96\x81", 3);
            len += 3;
        } else {
            text[len++] = s[i];
        }
    }
    if (len == 0) return ZI_OK;

    /* Symbols: one per character by its lead byte; at most len of them. */
    if (reserve((void **)&t->spm_syms, &t->spm_sym_cap, len, sizeof(spm_sym))) return ZI_ENOMEM;
    spm_sym *sy = t->spm_syms;
    int32_t ns = 0;
    for (size_t off = 0; off < len;) {
        static const uint8_t lead_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
        size_t l = lead_len[(unsigned char)text[off] >> 4];
        if (l > len - off) l = len - off;
        sy[ns] = (spm_sym){(uint32_t)off, (uint32_t)l, ns - 1, -1};
        if (ns > 0) sy[ns - 1].next = ns;
        ns++;
        off += l;
    }

    /* Each merge adds at most two candidates to the ns - 1 initial ones,
     * and there are at most ns - 1 merges. */
    size_t heap_need = 3 * (size_t)ns;
    if (reserve((void **)&t->spm_heap, &t->spm_heap_cap, heap_need, sizeof(spm_bigram)))
        return ZI_ENOMEM;
    spm_bigram *h = t->spm_heap;
    size_t nh = 0;
    for (int32_t i = 1; i < ns; i++) try_bigram(t, text, sy, h, &nh, i - 1, i);
    while (nh > 0) {
        spm_bigram b = heap_pop(h, &nh);
        spm_sym *l = &sy[b.left], *r = &sy[b.right];
        /* Stale: one side was merged into something else since. */
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = b.left;
        try_bigram(t, text, sy, h, &nh, l->prev, b.left);
        try_bigram(t, text, sy, h, &nh, b.left, l->next);
    }

    for (int32_t i = 0; i >= 0; i = sy[i].next) {
        int32_t id = tok_str_find(t, text + sy[i].off, sy[i].n);
        if (id >= 0 && id < t->n_vocab) {
            if (tok_idvec_push(out, id)) return ZI_ENOMEM;
            continue;
        }
        for (uint32_t k = 0; k < sy[i].n; k++) {
            unsigned char c = (unsigned char)text[sy[i].off + k];
            if (t->spm_byte_tok[c] < 0) {
                t->spm_missing_byte = c;
                return ZI_EFORMAT;
            }
            if (tok_idvec_push(out, t->spm_byte_tok[c])) return ZI_ENOMEM;
        }
    }
    return ZI_OK;
}

/* ------------------------------------------------------------------------ */
/* decoding */

size_t tok_spm_unescape(const char *s, size_t n, char *out) {
    size_t m = 0;
    for (size_t i = 0; i < n;) {
        if (i + 3 <= n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
            out[m++] = ' ';
            i += 3;
        } else {
            out[m++] = s[i++];
        }
    }
    return m;
}
