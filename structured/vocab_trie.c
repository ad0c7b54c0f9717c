/*
 * vocab_trie.c - the vocabulary as byte strings and one trie of them, for
 * structured output (see vocab_trie.h): built once per worker through a
 * token-bytes callback, read-only after.
 */
#include "vocab_trie.h"

#include "class_mask.h"

#include <stdlib.h>
#include <string.h>

typedef zi_trie_node jnode; /* vocab_trie.h, shared with grammar.c */
typedef zi_vocab_trie jtrie;

struct zi_grammar_vocab {
    int32_t n_vocab;
    uint8_t *bytes;          /* every token's bytes back to back */
    int64_t *offset;         /* [n_vocab + 1]; a control token has none */
    jtrie all;               /* every token */
    zi_class_masks *classes; /* the grammar fast path's masks (NULL: off) */
};

static int32_t trie_node(jtrie *t, uint8_t byte) {
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 4096;
        jnode *p = realloc(t->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        t->nodes = p, t->cap = cap;
    }
    t->nodes[t->n] = (jnode){.child = -1, .sibling = -1, .tok = -1, .byte = byte};
    return t->n++;
}

static int trie_add(jtrie *t, const uint8_t *p, size_t n, int32_t id) {
    int32_t at = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = t->nodes[at].child;
        while (c >= 0 && t->nodes[c].byte != p[i]) c = t->nodes[c].sibling;
        if (c < 0) {
            if ((c = trie_node(t, p[i])) < 0) return ZI_ENOMEM;
            t->nodes[c].sibling = t->nodes[at].child;
            t->nodes[at].child = c;
        }
        at = c;
    }
    t->tok_next[id] = t->nodes[at].tok;
    t->nodes[at].tok = id;
    return ZI_OK;
}

void zi_grammar_vocab_free(zi_grammar_vocab *v) {
    if (!v) return;
    free(v->bytes);
    free(v->offset);
    free(v->all.nodes);
    free(v->all.tok_next);
    zi_class_masks_free(v->classes);
    free(v);
}

int zi_grammar_vocab_create(int32_t n_vocab, zi_token_bytes_fn bytes, const void *ctx,
                            zi_grammar_vocab **out, zi_error *err) {
    *out = NULL;
    if (n_vocab < 1) return zi_error_set(err, ZI_EINVAL, "a vocabulary of %d tokens", n_vocab);
    zi_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    int32_t V = n_vocab;
    v->n_vocab = V;
    size_t cap = (size_t)V * 8 + 64, used = 0;
    v->bytes = malloc(cap);
    v->offset = malloc(((size_t)V + 1) * sizeof *v->offset);
    v->all.tok_next = malloc((size_t)V * sizeof(int32_t));
    int rc =
        v->bytes && v->offset && v->all.tok_next && trie_node(&v->all, 0) == 0 ? ZI_OK : ZI_ENOMEM;
    char buf[ZI_GRAMMAR_TOKEN_MAX + 16];
    for (int32_t id = 0; !rc && id < V; id++) {
        v->offset[id] = (int64_t)used;
        int n = bytes(ctx, id, buf, sizeof buf);
        if (n <= 0 || (size_t)n > sizeof buf) continue; /* no bytes: never allowed */
        if (used + (size_t)n > cap) {
            uint8_t *p = realloc(v->bytes, cap * 2 + (size_t)n);
            if (!p) {
                rc = ZI_ENOMEM;
                break;
            }
            v->bytes = p, cap = cap * 2 + (size_t)n;
        }
        memcpy(v->bytes + used, buf, (size_t)n);
        const uint8_t *p = v->bytes + used;
        used += (size_t)n;
        rc = trie_add(&v->all, p, (size_t)n, id);
    }
    if (!rc) v->offset[V] = (int64_t)used;
    v->classes = zi_class_masks_create(); /* NULL only turns the fast path off */
    if (rc) {
        zi_grammar_vocab_free(v);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the structured-output vocabulary");
    }
    *out = v;
    return ZI_OK;
}

int32_t zi_grammar_vocab_size(const zi_grammar_vocab *v) {
    return v->n_vocab;
}

const zi_vocab_trie *zi_grammar_vocab_trie(const zi_grammar_vocab *v) {
    return &v->all;
}

zi_class_masks *zi_grammar_vocab_class_masks(const zi_grammar_vocab *v) {
    return v->classes;
}

const uint8_t *zi_grammar_vocab_token(const zi_grammar_vocab *v, int32_t id, size_t *n) {
    *n = 0;
    if (id < 0 || id >= v->n_vocab) return NULL;
    *n = (size_t)(v->offset[id + 1] - v->offset[id]);
    return v->bytes + v->offset[id];
}

void zi_grammar_eos_only(int32_t n_vocab, const int32_t *eos, size_t n_eos, int32_t *mask) {
    memset(mask, 0, ((size_t)n_vocab + 31) / 32 * sizeof *mask);
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < n_vocab) mask[eos[i] >> 5] |= (int32_t)(1u << (eos[i] & 31));
}
