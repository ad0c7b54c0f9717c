/*
 * tokenizer_bpe.c - the BPE stage: the merge table, built from
 * tokenizer.ggml.merges, and BPE over one pre-token piece with it.
 *
 * Every byte of a piece starts as the token for its GPT-2 byte-to-unicode
 * character, then the adjacent pair with the lowest merge rank (leftmost on
 * ties) is merged until none is left. A binary heap of candidate pairs with
 * stale-entry checks keeps long pieces at O(n log n). Merges are a hash map
 * from the pair of sids (see tokenizer.c) to (rank, result sid), so no
 * strings are touched while encoding. A merge part or result that is not a
 * token still takes part; if such a symbol is left at the end it falls back
 * to single-byte tokens exactly as llama.cpp does. (The cache in front of
 * this, for short pieces, is in tokenizer_pretok.c, with the loop over the
 * pieces.)
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

typedef struct tok_merge_entry {
    uint64_t key; /* sid_left << 32 | sid_right; MERGE_EMPTY when free */
    int32_t rank;
    int32_t result;
} merge_entry;

#define MERGE_EMPTY UINT64_MAX

typedef struct tok_bpe_sym {
    int32_t sid; /* -1 once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct tok_bpe_cand {
    int32_t rank;
    int32_t left, right;
    int32_t lsid, rsid, result;
} bpe_cand;

/* Multiplicative (Fibonacci) hash of a sid pair into the table's bits. */
static uint64_t hash_pair(uint64_t key, int shift) {
    return (key * 0x9E3779B97F4A7C15ull) >> shift;
}

/* ------------------------------------------------------------------------ */
/* the merge table */

static merge_entry *merge_slot(const zi_tokenizer *t, uint64_t key) {
    uint64_t i = hash_pair(key, t->merge_shift);
    for (;;) {
        merge_entry *e = &t->merges[i];
        if (e->key == key || e->key == MERGE_EMPTY) return e;
        i = (i + 1) & t->merge_mask;
    }
}

static const merge_entry *merge_find(const zi_tokenizer *t, int32_t l, int32_t r) {
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    const merge_entry *e = merge_slot(t, key);
    return e->key == key ? e : NULL;
}

int tok_load_merges(zi_tokenizer *t, const zi_gguf *g, zi_error *err) {
    zi_str *merges = NULL;
    uint64_t n_merges = 0;
    int rc = zi_gguf_get_str_array(g, "tokenizer.ggml.merges", &merges, &n_merges, err);
    if (rc) return rc;
    if (n_merges > TOK_MAX_MERGES) {
        free(merges);
        return zi_error_set(err, ZI_ERANGE, "tokenizer.ggml.merges has %llu entries (limit %u)",
                            (unsigned long long)n_merges, TOK_MAX_MERGES);
    }
    uint64_t cap = 1024;
    while (cap < n_merges * 2) cap *= 2;
    t->merges = malloc(sizeof *t->merges * cap);
    if (!t->merges) {
        free(merges);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %llu merges",
                            (unsigned long long)n_merges);
    }
    for (uint64_t i = 0; i < cap; i++) t->merges[i].key = MERGE_EMPTY;
    t->merge_mask = cap - 1;
    t->merge_shift = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) t->merge_shift--;

    char *cat = NULL;
    size_t cat_cap = 0;
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *s = merges[i].ptr;
        size_t n = (size_t)merges[i].len;
        /* The separator is the first space after the first byte. */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp) {
            free(cat);
            free(merges);
            return zi_error_set(err, ZI_EFORMAT,
                                "tokenizer.ggml.merges[%llu] has no space separating two parts",
                                (unsigned long long)i);
        }
        size_t la = (size_t)(sp - s), lb = n - la - 1;
        if (lb == 0 || n > 2 * TOK_MAX_TOKEN_BYTES) {
            free(cat);
            free(merges);
            return zi_error_set(err, ZI_EFORMAT, "tokenizer.ggml.merges[%llu] is malformed",
                                (unsigned long long)i);
        }
        if (la + lb > cat_cap) {
            cat_cap = (la + lb) * 2;
            char *c = realloc(cat, cat_cap);
            if (!c) {
                free(cat);
                free(merges);
                return zi_error_set(err, ZI_ENOMEM, "out of memory for merges");
            }
            cat = c;
        }
        memcpy(cat, s, la);
        memcpy(cat + la, sp + 1, lb);
        int32_t a, b, r;
        if ((rc = tok_str_find_or_add(t, s, la, &a)) ||
            (rc = tok_str_find_or_add(t, sp + 1, lb, &b)) ||
            (rc = tok_str_find_or_add(t, cat, la + lb, &r))) {
            free(cat);
            free(merges);
            return zi_error_set(err, rc, "out of memory for merges");
        }
        uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
        merge_entry *e = merge_slot(t, key);
        if (e->key == MERGE_EMPTY) { /* the first (lowest) rank of a pair wins */
            e->key = key;
            e->rank = (int32_t)i;
            e->result = r;
        }
    }
    free(cat);
    free(merges);
    return ZI_OK;
}

/* ------------------------------------------------------------------------ */
/* applying the merges */

static void heap_push(bpe_cand *h, size_t *n, bpe_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p].rank < c.rank || (h[p].rank == c.rank && h[p].left < c.left)) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static bpe_cand heap_pop(bpe_cand *h, size_t *n) {
    bpe_cand top = h[0];
    bpe_cand last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= *n) break;
        size_t m = l;
        if (l + 1 < *n && (h[l + 1].rank < h[l].rank ||
                           (h[l + 1].rank == h[l].rank && h[l + 1].left < h[l].left)))
            m = l + 1;
        if (last.rank < h[m].rank || (last.rank == h[m].rank && last.left < h[m].left)) break;
        h[i] = h[m];
        i = m;
    }
    h[i] = last;
    return top;
}

static void try_pair(const zi_tokenizer *t, bpe_cand *h, size_t *nh, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const merge_entry *e = merge_find(t, t->syms[l].sid, t->syms[r].sid);
    if (!e) return;
    bpe_cand c = {e->rank, l, r, t->syms[l].sid, t->syms[r].sid, e->result};
    heap_push(h, nh, c);
}

int tok_bpe_piece(zi_tokenizer *t, const unsigned char *p, size_t n, tok_idvec *out) {
    if (n == 1) {
        int32_t sid = t->byte_sid[p[0]];
        if (sid < t->n_vocab) return tok_idvec_push(out, sid);
    }
    if (n > t->sym_cap) {
        size_t cap = t->sym_cap ? t->sym_cap : 256;
        while (cap < n) cap *= 2;
        bpe_sym *s = realloc(t->syms, sizeof *s * cap);
        if (!s) return ZI_ENOMEM;
        t->syms = s;
        t->sym_cap = cap;
    }
    /* Each merge adds at most two candidates; n-1 initial ones. */
    if (3 * n > t->heap_cap) {
        size_t cap = t->heap_cap ? t->heap_cap : 768;
        while (cap < 3 * n) cap *= 2;
        bpe_cand *h = realloc(t->heap, sizeof *h * cap);
        if (!h) return ZI_ENOMEM;
        t->heap = h;
        t->heap_cap = cap;
    }
    bpe_sym *sym = t->syms;
    for (size_t i = 0; i < n; i++) {
        sym[i].sid = t->byte_sid[p[i]];
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) try_pair(t, t->heap, &nh, (int32_t)i, (int32_t)i + 1);
    while (nh > 0) {
        bpe_cand c = heap_pop(t->heap, &nh);
        bpe_sym *l = &sym[c.left], *r = &sym[c.right];
        /* Stale when either side has been merged since it was queued. */
        if (l->sid != c.lsid || r->sid != c.rsid || l->next != c.right) continue;
        l->sid = c.result;
        r->sid = -1;
        l->next = r->next;
        if (r->next >= 0) sym[r->next].prev = c.left;
        try_pair(t, t->heap, &nh, l->prev, c.left);
        try_pair(t, t->heap, &nh, c.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next) {
        int32_t sid = sym[i].sid;
        if (sid < t->n_vocab) {
            if (tok_idvec_push(out, sid)) return ZI_ENOMEM;
            continue;
        }
        /* Not a token: llama.cpp falls back to single-byte tokens over the
         * mapped text, dropping bytes that have none. */
        const unsigned char *s = (const unsigned char *)t->arena + t->str_off[sid];
        for (uint32_t k = 0; k < t->str_len[sid]; k++) {
            int32_t tok = t->single_byte_tok[s[k]];
            if (tok >= 0 && tok_idvec_push(out, tok)) return ZI_ENOMEM;
        }
    }
    return ZI_OK;
}
