/*
 * unicode.h - the small amount of Unicode the tokenizer needs: UTF-8
 * decoding/encoding, per-codepoint property flags, and the NFD and lowercase
 * mappings of the WordPiece normaliser.
 *
 * The flags are the general-category classes the pre-tokenizer patterns use
 * (\p{L}, \p{N}, ...) plus the White_Space property (\s). They come from the
 * generated range tables in unicode_data.c (scripts/gen-unicode-data), built
 * from the same Unicode version llama.cpp uses so that token ids match it.
 *
 * Decoding follows llama.cpp's rules rather than strict UTF-8, because the
 * tokenizer must reproduce its ids: a sequence is accepted when its lead
 * byte and continuation bytes have the right bit patterns, so overlong forms
 * and surrogates decode to their (possibly odd) value; anything else counts
 * as one invalid byte, which becomes U+FFFD.
 */
#ifndef ZI_UNICODE_H
#define ZI_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Codepoint property flags. Exactly one of the category flags is set for
 * every codepoint up to U+10FFFF; WHITESPACE is added on top. */
enum {
    ZI_UC_UNDEFINED = 0x0001,  /* unassigned (Cn) */
    ZI_UC_NUMBER = 0x0002,     /* \p{N} */
    ZI_UC_LETTER = 0x0004,     /* \p{L} */
    ZI_UC_SEPARATOR = 0x0008,  /* \p{Z} */
    ZI_UC_MARK = 0x0010,       /* \p{M} */
    ZI_UC_PUNCT = 0x0020,      /* \p{P} */
    ZI_UC_SYMBOL = 0x0040,     /* \p{S} */
    ZI_UC_CONTROL = 0x0080,    /* \p{C} except Cn: Cc, Cf, Cs, Co */
    ZI_UC_CATEGORIES = 0x00FF, /* mask of the category flags */
    ZI_UC_WHITESPACE = 0x0100, /* White_Space property (\s) */
};

#define ZI_UNICODE_MAX 0x10FFFFu
#define ZI_UNICODE_REPLACEMENT 0xFFFDu

/* Flags of a codepoint; ZI_UC_UNDEFINED for values above U+10FFFF. */
uint16_t zi_unicode_flags(uint32_t cp);

/*
 * Decodes one codepoint from s[0..n) (n >= 1) into *cp and returns the number
 * of bytes it used (1..4). An invalid or truncated sequence, or one whose
 * value is above U+10FFFF, yields *cp = U+FFFD and uses exactly one byte.
 * Overlong forms and surrogates are accepted (see the file comment).
 */
size_t zi_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Writes the UTF-8 form of cp (<= U+10FFFF; surrogates are encoded like any
 * other value) into out and returns its length 1..4; 0 for cp > U+10FFFF. */
size_t zi_utf8_encode(uint32_t cp, unsigned char out[4]);

/* The length a UTF-8 sequence starting with lead byte b claims (2..4), 1 for
 * an ASCII byte, 0 for a continuation byte or a byte that never starts one. */
size_t zi_utf8_lead_len(unsigned char b);

/* The first codepoint of cp's canonical decomposition (NFD), cp itself
 * when it has none: llama.cpp's one-to-one "NFD", which drops the marks a
 * precomposed character decomposes into (so "\u00e9" gives 'e' and a Hangul
 * syllable its leading jamo). The WordPiece normaliser uses it. */
uint32_t zi_unicode_nfd_first(uint32_t cp);

/* The first codepoint of cp's lowercase form (Python's str.lower), cp
 * itself when it has none. */
uint32_t zi_unicode_tolower(uint32_t cp);

/* Generated tables (unicode_data.c); use the functions above instead. */
extern const uint16_t zi_unicode_ascii_flags[128];
extern const size_t zi_unicode_range_count;
extern const uint32_t zi_unicode_range_start[];
extern const uint16_t zi_unicode_range_flags[];
extern const size_t zi_unicode_nfd_count;
extern const uint32_t zi_unicode_nfd_start[], zi_unicode_nfd_last[], zi_unicode_nfd_value[];
extern const size_t zi_unicode_lower_count;
extern const uint32_t zi_unicode_lower_from[], zi_unicode_lower_to[];

#endif
