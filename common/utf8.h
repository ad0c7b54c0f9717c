/*
 * utf8.h - the one strict UTF-8 validator every zinfer process shares.
 *
 * "Well-formed" is Unicode's definition (Table 3-7 of the standard): no
 * overlong forms, no surrogates (U+D800..U+DFFF), nothing above U+10FFFF,
 * no stray continuation bytes and no sequence cut short. The message codec
 * checks every string a peer sends with it, the router checks request ids
 * and cleans error text with it, and the chat template checks its inputs
 * with it. (The tokenizer's own decoder in common/unicode.h is
 * lenient on purpose, as llama.cpp is, and is not this one.)
 */
#ifndef ZI_UTF8_H
#define ZI_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Length (1..4) of the well-formed character at s[0..n), with its code
 * point in *cp (cp may be NULL); 0 when the bytes there do not start one
 * or n is 0. */
size_t zi_utf8_next(const unsigned char *s, size_t n, uint32_t *cp);

/* Offset of the first byte that does not start or continue a well-formed
 * character (the start of the bad sequence); n when s[0..n) is valid. */
size_t zi_utf8_bad_at(const char *s, size_t n);

/* True when s[0..n) is well-formed UTF-8. */
bool zi_utf8_valid(const char *s, size_t n);

/* A malloc'd, NUL-terminated copy of s[0..n) in which every byte that does
 * not start a well-formed UTF-8 sequence is replaced by U+FFFD, so it can
 * travel as a msgpack str; *out_len gets its length. NULL when out of
 * memory. */
char *zi_utf8_clean(const char *s, size_t n, size_t *out_len);

#endif
