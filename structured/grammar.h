/*
 * grammar.h - structured output by a context-free grammar: llama.cpp's GBNF
 * format compiled to rules over Unicode code points, matched byte by byte
 * with a set of parse stacks, and the tokens a completion may take next
 * found by walking the vocabulary trie (vocab_trie.h) from that set.
 *
 * The format (docs/structured_output.md has the whole page): rules
 * `name ::= alternatives`, the start rule named `root`; names of letters,
 * digits, '-' and '_'; string literals "..." and character classes [a-z],
 * [^...] with the escapes \x.. \u.... \U........ \t \r \n \\ \" \[ \] \-;
 * `.` for any character; grouping ( ... ); alternation |; repetition
 * * + ? {m} {m,} {m,n}; comments from # to the end of the line; a rule ends
 * at a newline except inside parentheses or after |. Left recursion (a
 * rule that can reach itself before taking a character) is refused, as
 * llama.cpp does; so are token references <...>.
 *
 * Matching: the state is a set of parse stacks, each a chain of grammar
 * positions (its top a character class), shared and hash-consed in an
 * arena so equal stacks are one; a byte that completes a UTF-8 character
 * advances every stack whose class holds it and expands rule references
 * until each top is a class again (or a stack empties: the grammar can
 * end there). A partial UTF-8 character keeps the stacks and prunes by the
 * range of characters it can still become.
 *
 * The mask walk memoizes, for each distinct stack set it meets, the set
 * each byte leads to (a trie node reached again from a set already seen
 * costs a lookup), and each state keeps its last four masks keyed by its
 * stack set, which repeats at every step inside a long string or list.
 * Inside a repeated character class (a string body) the tokens the class
 * takes whole are allowed from a per-class mask and only the rest are
 * walked (class_mask.h).
 *
 * Limits (all explicit, so a hostile grammar or a looping model costs
 * bounded time and memory): the text, rules, elements after expanding
 * repetitions, repetition counts and parenthesis nesting are refused
 * beyond the ZI_GRAMMAR_MAX_* bounds below at compile time. At run time a
 * state keeps at most ZI_GRAMMAR_MAX_STACKS stacks, each at most
 * ZI_GRAMMAR_MAX_DEPTH deep, and one character expands at most
 * ZI_GRAMMAR_MAX_EXPAND stack nodes: what lies beyond is dropped, which
 * only narrows what is allowed (every kept stack is a valid parse).
 *
 * Out of memory is never such a drop: a call whose answer would miss a
 * stack for want of memory returns ZI_ENOMEM and leaves the state as it
 * was (a later call may try again).
 */
#ifndef ZI_GRAMMAR_H
#define ZI_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vocab_trie.h"
#include "zi_error.h"

#define ZI_GRAMMAR_MAX_TEXT (256 * 1024) /* bytes of grammar text */
#define ZI_GRAMMAR_MAX_RULES 4096        /* rules, groups and repetitions included */
#define ZI_GRAMMAR_MAX_ELEMS 65536       /* elements after expanding repetitions */
#define ZI_GRAMMAR_MAX_REPEAT 1000       /* m and n in {m,n} */
#define ZI_GRAMMAR_MAX_NESTING 64        /* parentheses inside each other */
#define ZI_GRAMMAR_MAX_STACKS 512        /* live parse stacks in a state */
#define ZI_GRAMMAR_MAX_DEPTH 1024        /* rule references open in one stack */
#define ZI_GRAMMAR_MAX_EXPAND 65536      /* stack nodes visited for one character */

/* A compiled grammar: read-only, shared by any number of states. */
typedef struct zi_grammar zi_grammar;

/* Compiles GBNF text (len bytes, not NUL-terminated). ZI_EINVAL with
 * "grammar: line L:C: what" for a bad grammar (syntax, bad escape,
 * unbalanced parentheses, undefined or duplicate rule, no root, empty
 * grammar, left recursion, a limit exceeded); ZI_ENOMEM on allocation
 * failure. */
int zi_grammar_compile(const char *text, size_t len, zi_grammar **out, zi_error *err);
void zi_grammar_free(zi_grammar *g);

/* Where a completion stands: opaque, one per constrained sequence. The
 * grammar must outlive it. */
typedef struct zi_grammar_state zi_grammar_state;

/* A state at the start (nothing taken yet). ZI_ENOMEM on failure. */
int zi_grammar_state_create(const zi_grammar *g, zi_grammar_state **out, zi_error *err);
void zi_grammar_state_free(zi_grammar_state *s);

/* Feeds bytes p[0..n): *taken true and s advanced when they continue a
 * valid text; false and s unchanged otherwise. ZI_OK, or ZI_ENOMEM (*taken
 * false, s unchanged). */
int zi_grammar_feed(zi_grammar_state *s, const uint8_t *p, size_t n, bool *taken, zi_error *err);

/* Whether p[0..n) would be taken, into *taken (s unchanged either way).
 * ZI_OK, or ZI_ENOMEM (*taken false). */
int zi_grammar_accepts(zi_grammar_state *s, const uint8_t *p, size_t n, bool *taken, zi_error *err);

/* True when the text so far is a whole sentence of the grammar (and no
 * UTF-8 character is left open): end-of-sequence may come now. */
bool zi_grammar_can_end(const zi_grammar_state *s);

/* The number of live parse stacks (for tests and limits). */
int zi_grammar_state_stacks(const zi_grammar_state *s);

/* For tests of the out-of-memory path: from now on s's work list and
 * stack arena grow n more times, then fail as if memory were short (n < 0,
 * the default: never). */
void zi_grammar_state_fail_after(zi_grammar_state *s, int64_t n);

/* Writes the tokens of v allowed after s into mask (ceil(n_vocab/32)
 * words, bit t%32 of word t/32 set = allowed; every word written): each
 * token whose bytes s takes, and the n_eos ids in eos exactly when the
 * grammar can end (an eos id with bytes of its own is not allowed as text).
 * s is used as scratch and left as it was. ZI_OK, or ZI_ENOMEM (the mask
 * is then not to be used). */
int zi_grammar_allowed(const zi_grammar_vocab *v, zi_grammar_state *s, const int32_t *eos,
                       size_t n_eos, int32_t *mask, zi_error *err);

/* zi_grammar_allowed for a completion that may take at most budget more
 * tokens, this one included (< 0: no limit). A token is allowed only when
 * the text can still be finished after it, end-of-sequence included,
 * within the budget, counting the fewest bytes that finish it as tokens
 * (every vocabulary zinfer runs has a token for each byte: the count is
 * never short). So a completion that would be cut by its length limit
 * closes its brackets and strings instead, and ends validating. A text
 * whose shortest end no longer fits the budget gets the plain mask (it
 * will be cut whatever it takes). End-of-sequence and errors as above. */
int zi_grammar_allowed_within(const zi_grammar_vocab *v, zi_grammar_state *s, const int32_t *eos,
                              size_t n_eos, int64_t budget, int32_t *mask, zi_error *err);

/* Feeds token id's bytes as zi_grammar_feed (*taken false and s unchanged
 * when not allowed, or id is unknown or a control token). */
int zi_grammar_feed_token(const zi_grammar_vocab *v, zi_grammar_state *s, int32_t id, bool *taken,
                          zi_error *err);

#endif
