/*
 * regex_grammar.h - regular expressions translated to GBNF (the grammar
 * text structured/grammar.h compiles), for a request's `regex`
 * constraint and a JSON schema's `pattern`; and the small text buffer the
 * grammar writers share.
 *
 * The subset (the one JSON Schema users and structured-output requests
 * write): literals; `.`; classes `[...]`, `[^...]` with ranges; the
 * escapes \d \w \s \D \W \S (ASCII, inside and outside classes), \t \n \r
 * \f \v \0, \xHH, \uHHHH, and a backslash before any punctuation; groups
 * `( )`, `(?: )`, `(?P<name> )`, `(?<name> )`; alternation `|`;
 * quantifiers * + ? {m} {m,} {m,n} (m, n up to 1000), a lazy `?` after
 * one taken as the greedy form (same language); `^` first and `$` last.
 * Refused by name, with the byte offset: backreferences, lookaround,
 * word boundaries and other anchors, possessive quantifiers, inline flags,
 * `^`/`$` elsewhere, unbalanced parentheses or brackets, a class that
 * matches nothing, more than ZI_REGEX_MAX_NESTING groups inside each other
 * and patterns over ZI_REGEX_MAX_LEN bytes.
 *
 * A quantified group that can match the empty text (`(a*)*`) becomes left
 * recursion, which grammar.h refuses when it compiles the result.
 */
#ifndef ZI_REGEX_GRAMMAR_H
#define ZI_REGEX_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>

#include "zi_error.h"

#define ZI_REGEX_MAX_LEN 4096   /* bytes of one pattern */
#define ZI_REGEX_MAX_NESTING 12 /* groups inside each other */
#define ZI_REGEX_MAX_CLASS 256  /* ranges in one class */

/* A growing NUL-terminated text; oom set (and further appends ignored)
 * once an allocation failed. Zero-initialise; free p. */
typedef struct zi_gbnf_buf {
    char *p;
    size_t n, cap;
    bool oom;
} zi_gbnf_buf;

void zi_gbnf_printf(zi_gbnf_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void zi_gbnf_append(zi_gbnf_buf *b, const char *s, size_t n);
/* Appends code point cp as it may stand inside a GBNF class [...]. */
void zi_gbnf_class_cp(zi_gbnf_buf *b, unsigned cp);
/* Appends code point cp as a GBNF literal ("a", "\x22", ...). */
void zi_gbnf_literal_cp(zi_gbnf_buf *b, unsigned cp);
/* Appends the bytes s[0..n) (UTF-8) as one GBNF string literal. */
void zi_gbnf_literal(zi_gbnf_buf *b, const char *s, size_t n);

/* How the pattern's text is written. */
enum {
    ZI_REGEX_TEXT = 0, /* the whole text matches it (Python's re.fullmatch) */
    ZI_REGEX_JSON = 1, /* the characters of a JSON string (between its quotes)
                        * contain a match (JSON Schema's `pattern`: anchors
                        * hold it to the ends); characters a JSON string
                        * must escape are written escaped, and classes
                        * leave out '"', '\' and control characters */
};

/* Appends to out one GBNF expression (parenthesized, no rule names) for
 * the pattern re[0..len). ZI_EINVAL "offset N: what" for a bad or
 * unsupported pattern (the caller prefixes the field). */
int zi_regex_to_gbnf(const char *re, size_t len, int mode, zi_gbnf_buf *out, zi_error *err);

#endif
