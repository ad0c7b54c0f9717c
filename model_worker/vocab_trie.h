/*
 * vocab_trie.h - the vocabulary trie that structured output walks: every
 * token's byte string in one trie, so that a constraint finds the tokens
 * it allows by walking it from its current state and dropping a subtree
 * at the first byte it refuses (json_constraint.h builds it once per
 * worker inside zi_json_vocab; grammar.h walks the same one).
 *
 * Plain data, read-only once built.
 */
#ifndef ZI_VOCAB_TRIE_H
#define ZI_VOCAB_TRIE_H

#include <stdint.h>

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

#endif
