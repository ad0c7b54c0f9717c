/*
 * class_mask.h - the fast path of the grammar mask (grammar.h): for a
 * character class, the tokens of the vocabulary whose bytes are whole
 * UTF-8 characters that the class all takes, computed once per (class,
 * vocabulary) and kept by the vocabulary (zi_grammar_vocab_class_masks).
 *
 * When the stack set of a state maps to itself on every character of a
 * class (inside a JSON string body [^"\\\x00-\x1F]*, say), every such
 * token is allowed at once, and the trie walk visits only the subtrees
 * holding some other token (the `outside` bits): a few thousand tokens
 * instead of the whole vocabulary. In a bounded repetition ([^"]{0,40})
 * the set changes with each character but in the same way for every
 * character of the class for R more characters: the tokens wholly in the
 * class of at most R characters are allowed at once (by_len), and a
 * subtree is skipped when it holds only such tokens (outside, max_len).
 *
 * Limits: at most ZI_CLASS_MASK_MAX classes are kept per vocabulary (the
 * least recently used is replaced); one entry costs about n_vocab * 4.1
 * + n_trie_nodes * 1.1 bytes. Not thread-safe: one worker thread uses a
 * vocabulary's cache (as it uses the grammar states).
 */
#ifndef ZI_CLASS_MASK_H
#define ZI_CLASS_MASK_H

#include <stdint.h>

#include "vocab_trie.h"

#define ZI_CLASS_MASK_MAX 16
#define ZI_CLASS_MASK_LEN 64 /* token lengths (characters) told apart */

typedef struct zi_class_mask {
    int32_t *mask;   /* [ceil(n_vocab/32)] bit set: token wholly in the class */
    int32_t *by_len; /* the tokens wholly in the class, fewest characters first */
    int32_t len_end[ZI_CLASS_MASK_LEN + 1]; /* by_len[0 .. len_end[k]): those of <= k
                                             * characters (the last: all of them) */
    uint8_t *max_len;  /* [n_nodes] the most characters of a token wholly in the class
                        * at or below the node (ZI_CLASS_MASK_LEN: that many or more) */
    uint64_t *outside; /* [ceil(n_nodes/64)] bit set: some token at or below the trie
                        * node is not wholly in the class (its subtree must be walked) */
    int64_t n_allowed; /* bits set in mask */
} zi_class_mask;

/* A class as grammar_impl.h keeps it: the ASCII bitmap and n sorted,
 * disjoint, inclusive code point ranges (ASCII included). */
typedef struct zi_class_key {
    uint64_t ascii[2];
    const uint32_t (*ranges)[2];
    uint32_t n;
} zi_class_key;

typedef struct zi_class_masks zi_class_masks;

/* An empty cache (NULL on allocation failure: the fast path is off). */
zi_class_masks *zi_class_masks_create(void);
void zi_class_masks_free(zi_class_masks *cm);

/* The entry of class k over trie t (n_vocab tokens), computed on first
 * use; valid until the next call. NULL when out of memory (the caller
 * walks the whole trie instead). */
const zi_class_mask *zi_class_masks_get(zi_class_masks *cm, const zi_vocab_trie *t, int32_t n_vocab,
                                        const zi_class_key *k);

#endif
