/*
 * tokenizer_expect.h - the tokenizer unit tests' one assertion: text
 * encodes to exactly these ids (test_tokenizer.c, test_tokenizer_spm.c).
 * A header of static functions for cmocka tests: include it after
 * <cmocka.h>.
 */
#ifndef ZI_TOKENIZER_EXPECT_H
#define ZI_TOKENIZER_EXPECT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* Encodes text[0..len) and asserts the ids are want[0..n_want); prints
 * both lists first when they differ. */
static inline void zi_expect_ids(zi_tokenizer *t, const char *text, size_t len, int add_special,
                                 int parse_special, const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    zi_error err = {0};
    assert_int_equal(zi_tokenizer_encode(t, text, len, add_special, parse_special, &ids, &n, &err),
                     ZI_OK);
    if (n != n_want || memcmp(ids, want, n * sizeof *ids) != 0) {
        fprintf(stderr, "text %.*s: got", (int)len, text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", want");
        for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, n_want);
    assert_memory_equal(ids, want, n * sizeof *ids);
    free(ids);
}

#endif
