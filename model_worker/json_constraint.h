/*
 * json_constraint.h - structured output: which tokens keep a completion a
 * valid JSON object (a request's response_format {"type": "json_object"}),
 * or one of a JSON schema (response_format json_schema).
 *
 * The generator keeps a zi_json_state per constrained sequence, fed with the
 * bytes of every token it generates, and before each draw asks for the
 * tokens allowed next (zi_json_allowed): the sampler's bitmask (sampler.h
 * step 4). So the completion is, token by token, a prefix of a JSON text
 * (RFC 8259) whose top-level value is an object, in valid UTF-8; once the
 * object closes only an end-of-sequence id is allowed. Control tokens
 * (chat markers) are never allowed inside it.
 *
 * The state is a byte-level pushdown automaton: a lexer mode plus a stack
 * of open containers. With a schema, each open container also holds its
 * schema node (and an object the properties it has had), a key is matched
 * against the properties not given yet, and a value's first byte must fit
 * its type (an enum value is matched whole). Limits keep a model from looping inside the grammar
 * for ever: at most ZI_JSON_MAX_DEPTH nested containers, ZI_JSON_MAX_WS
 * whitespace bytes in a row and ZI_JSON_MAX_NUMBER bytes in a number
 * (max_new_tokens still bounds strings).
 *
 * The allowed set is found by walking a trie of the vocabulary's byte
 * strings (zi_json_vocab, built once per worker) from the current state,
 * dropping a subtree at its first byte that the grammar refuses. Inside a
 * string, the many tokens that are plain string text (no quote, backslash,
 * control byte or partial UTF-8 character) are allowed by one precomputed
 * mask, and only the others are walked.
 */
#ifndef ZI_JSON_CONSTRAINT_H
#define ZI_JSON_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"
#include "vocab_trie.h"
#include "zi_error.h"

#define ZI_JSON_MAX_DEPTH 16
#define ZI_JSON_MAX_WS 32
#define ZI_JSON_MAX_NUMBER 64

/*
 * A JSON schema the completion must also satisfy (response_format
 * json_schema), compiled from its JSON text. The subset that can be held
 * to token by token: "type" (one of object, array, string, number,
 * integer, boolean, null), "properties" with "required" (an object with
 * properties gets no others: additionalProperties is taken as false, which
 * only narrows what is valid), "items", "enum" and "const" of strings
 * without escapes, integers, booleans and null; annotations (title,
 * description, default, examples, $schema, $id, $comment) are ignored.
 * Anything else (pattern, minimum, anyOf, $ref, ...) is refused with
 * ZI_EUNSUPPORTED naming the keyword and its path, never ignored; a schema
 * that is not JSON or not a schema is ZI_EINVAL. Messages start with
 * "response_format.json_schema".
 */
typedef struct zi_json_schema zi_json_schema;
int zi_json_schema_compile(const char *text, size_t len, zi_json_schema **out, zi_error *err);
void zi_json_schema_free(zi_json_schema *s);

/* The automaton's state; plain data, copied by assignment (the schema is
 * shared, not copied). */
typedef struct zi_json_state {
    const zi_json_schema *sc;         /* NULL: any JSON object */
    uint64_t cand;                    /* J_KEY / J_ENUM: members still matching */
    uint64_t seen[ZI_JSON_MAX_DEPTH]; /* per open object: its properties given */
    uint16_t node[ZI_JSON_MAX_DEPTH]; /* per open container: its schema node */
    uint16_t vnode;                   /* the node of the value to come (after a key) */
    uint16_t mpos;                    /* J_KEY / J_ENUM: bytes matched */
    uint8_t int_only;                 /* the number being read is an integer */
    uint8_t mode;                     /* lexer mode (json_constraint.c) */
    uint8_t depth;                    /* open containers */
    uint8_t key;                      /* the string being read is an object key */
    uint8_t lit;                      /* true / false / null: which, and how far */
    uint8_t lit_pos;
    uint8_t hex_left; /* \uXXXX digits still to come */
    uint8_t hex_hi;   /* in \uXXXX: its first digit, then 1 (plain) or 2 (high surrogate) */
    uint8_t need_low; /* a high surrogate escape needs its low half next */
    uint8_t u8_left;  /* UTF-8 continuation bytes still to come, in [u8_lo, u8_hi] */
    uint8_t u8_lo, u8_hi;
    uint8_t run;                      /* whitespace bytes in a row, or number bytes */
    uint8_t stack[ZI_JSON_MAX_DEPTH]; /* 1: object, 0: array */
} zi_json_state;

/* The start: nothing yet, a JSON object to come (whitespace may lead),
 * or with a schema the value it describes (which must be an object too).
 * The schema must outlive the state. */
void zi_json_state_init(zi_json_state *s, const zi_json_schema *schema);

/* Feeds bytes p[0..n); false (and s undefined) when they cannot continue
 * a valid text. */
bool zi_json_feed(zi_json_state *s, const uint8_t *p, size_t n);

/* True once the top-level object is closed. */
bool zi_json_complete(const zi_json_state *s);

typedef struct zi_json_vocab zi_json_vocab;

/* The vocabulary of tok as byte strings (control tokens and tokens of no
 * bytes left out). ZI_ENOMEM on allocation failure. */
int zi_json_vocab_create(const zi_tokenizer *tok, zi_json_vocab **out, zi_error *err);
void zi_json_vocab_free(zi_json_vocab *v);
int32_t zi_json_vocab_size(const zi_json_vocab *v);

/* The trie of every token in v (for other constraints, grammar.h). */
const zi_vocab_trie *zi_json_vocab_trie(const zi_json_vocab *v);

/* Token id's bytes (*n of them; *n = 0 for a control token, a token of no
 * bytes or an id outside the vocabulary). */
const uint8_t *zi_json_vocab_token(const zi_json_vocab *v, int32_t id, size_t *n);

/* Writes the tokens allowed after s into mask (ceil(n_vocab/32) words, bit
 * t%32 of word t/32 set = allowed; every word is written). After a
 * complete object only the n_eos ids in eos are allowed (those within the
 * vocabulary). */
void zi_json_allowed(const zi_json_vocab *v, const zi_json_state *s, const int32_t *eos,
                     size_t n_eos, int32_t *mask);

/* A mask (as zi_json_allowed writes it, for n_vocab tokens) allowing only
 * the n_eos ids in eos that lie in the vocabulary. */
void zi_json_eos_only(int32_t n_vocab, const int32_t *eos, size_t n_eos, int32_t *mask);

/* Feeds token id's bytes to s (false when not allowed, or id unknown). */
bool zi_json_feed_token(const zi_json_vocab *v, zi_json_state *s, int32_t id);

#endif
