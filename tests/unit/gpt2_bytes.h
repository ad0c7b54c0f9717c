/*
 * gpt2_bytes.h - the GPT-2 byte-to-character mapping that byte-level BPE
 * vocabularies spell their tokens in, for the tests that write such
 * vocabularies by hand (test_tokenizer.c, test_pretok.c,
 * tests/fuzz/fuzz_tokenizer_replay.c). The tokenizer's own table is in
 * tokenizer_proc/tokenizer.c; this copy stays independent of it on
 * purpose, so the tests check it. A header of one static function.
 */
#ifndef ZI_GPT2_BYTES_H
#define ZI_GPT2_BYTES_H

#include <stdint.h>

/* The character standing for byte b, as NUL-terminated UTF-8 (at most 2
 * bytes: every code point is below 0x800) into out[3]. Printable Latin-1
 * bytes stand for themselves; the others are numbered from U+0100 up in
 * byte order. */
static inline void zi_test_gpt2_byte_char(unsigned b, char out[3]) {
#define ZI_GPT2_PRINTABLE(c)                                                                       \
    (((c) >= 0x21 && (c) <= 0x7E) || ((c) >= 0xA1 && (c) <= 0xAC) || (c) >= 0xAE)
    uint32_t cp = b;
    if (!ZI_GPT2_PRINTABLE(b)) {
        cp = 256;
        for (unsigned c = 0; c < b; c++)
            if (!ZI_GPT2_PRINTABLE(c)) cp++;
    }
#undef ZI_GPT2_PRINTABLE
    if (cp < 0x80) {
        out[0] = (char)cp, out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
    }
}

#endif
