/*
 * vocab_trie.h - the vocabulary as structured output sees it: every
 * token's byte string, and one trie of them, so that a constraint
 * (grammar.h: GBNF grammars, JSON schemas, regular expressions) finds the
 * tokens it allows by walking the trie from its current state and
 * dropping a subtree at the first byte it refuses. Built once per worker
 * (zi_grammar_vocab) from a callback that gives each token's bytes, so
 * this library links no tokenizer (the worker's callback is
 * zi_tokenizer_constraint_bytes, tokenizer.h); read-only after.
 */
#ifndef ZI_VOCAB_TRIE_H
#define ZI_VOCAB_TRIE_H

#include <stddef.h>
#include <stdint.h>

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

typedef struct zi_grammar_vocab zi_grammar_vocab;

/* The longest token, in bytes, a vocabulary may hold (the tokenizer
 * refuses longer ones: ZI_TOKEN_MAX_BYTES in tokenizer.h). */
#define ZI_GRAMMAR_TOKEN_MAX 16384

/* The bytes of token `id` as a constraint must match them: written to buf
 * (capacity cap), the count returned; 0 for a token a constraint never
 * allows (control tokens, tokens of no bytes); a count over cap means the
 * token did not fit, and it is left out. ctx is the callback's own. */
typedef int (*zi_token_bytes_fn)(const void *ctx, int32_t id, char *buf, size_t cap);

/* The vocabulary of n_vocab tokens as byte strings, each read once through
 * bytes(ctx, ...) (tokens of no bytes left out: never allowed). ZI_ENOMEM
 * on allocation failure, ZI_EINVAL for n_vocab < 1. */
int zi_grammar_vocab_create(int32_t n_vocab, zi_token_bytes_fn bytes, const void *ctx,
                            zi_grammar_vocab **out, zi_error *err);
void zi_grammar_vocab_free(zi_grammar_vocab *v);
int32_t zi_grammar_vocab_size(const zi_grammar_vocab *v);

/* The trie of every token in v. */
const zi_vocab_trie *zi_grammar_vocab_trie(const zi_grammar_vocab *v);

/* The cache of per-class token masks the grammar's fast path keeps
 * (class_mask.h; NULL: none). Mutable through a const vocabulary: a
 * cache, used by one worker thread. */
struct zi_class_masks;
struct zi_class_masks *zi_grammar_vocab_class_masks(const zi_grammar_vocab *v);

/* Token id's bytes (*n of them; *n = 0 for a control token, a token of no
 * bytes or an id outside the vocabulary). */
const uint8_t *zi_grammar_vocab_token(const zi_grammar_vocab *v, int32_t id, size_t *n);

/* A mask (ceil(n_vocab/32) words, bit t%32 of word t/32 set = allowed)
 * allowing only the n_eos ids in eos that lie in the vocabulary. */
void zi_grammar_eos_only(int32_t n_vocab, const int32_t *eos, size_t n_eos, int32_t *mask);

#endif
