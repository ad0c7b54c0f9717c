/*
 * vocab_trie.h - the vocabulary as structured output sees it: every
 * token's byte string, and one trie of them, so that a constraint
 * (grammar.h: GBNF grammars, JSON schemas, regular expressions) finds the
 * tokens it allows by walking the trie from its current state and
 * dropping a subtree at the first byte it refuses. Built once per worker
 * (zi_json_vocab, from the model's tokenizer); read-only after.
 */
#ifndef ZI_VOCAB_TRIE_H
#define ZI_VOCAB_TRIE_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "zi_error.h"

typedef struct zi_trie_node {
    int32_t child, sibling; /* -1: none */
    int32_t tok;            /* first token whose bytes end here, -1: none */
    uint8_t byte;           /* the byte on the edge into this node */
} zi_trie_node;

typedef struct zi_vocab_trie {
    zi_trie_node *nodes; /* nodes[0] is the root (its byte unused) */
    int32_t n, cap;
    int32_t *tok_next; /* [n_vocab] the next token with the same bytes, -1: none */
} zi_vocab_trie;

typedef struct zi_json_vocab zi_json_vocab;

/* The vocabulary of tok as byte strings (control tokens and tokens of no
 * bytes left out: never allowed). ZI_ENOMEM on allocation failure. */
int zi_json_vocab_create(const zi_tokenizer *tok, zi_json_vocab **out, zi_error *err);
void zi_json_vocab_free(zi_json_vocab *v);
int32_t zi_json_vocab_size(const zi_json_vocab *v);

/* The trie of every token in v. */
const zi_vocab_trie *zi_json_vocab_trie(const zi_json_vocab *v);

/* The cache of per-class token masks the grammar's fast path keeps
 * (class_mask.h; NULL: none). Mutable through a const vocabulary: a
 * cache, used by one worker thread. */
struct zi_class_masks;
struct zi_class_masks *zi_json_vocab_class_masks(const zi_json_vocab *v);

/* Token id's bytes (*n of them; *n = 0 for a control token, a token of no
 * bytes or an id outside the vocabulary). */
const uint8_t *zi_json_vocab_token(const zi_json_vocab *v, int32_t id, size_t *n);

/* A mask (ceil(n_vocab/32) words, bit t%32 of word t/32 set = allowed)
 * allowing only the n_eos ids in eos that lie in the vocabulary. */
void zi_json_eos_only(int32_t n_vocab, const int32_t *eos, size_t n_eos, int32_t *mask);

#endif
