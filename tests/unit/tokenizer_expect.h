/*
 * tokenizer_expect.h - the tokenizer unit tests' one assertion: text
 * encodes to exactly these ids (test_tokenizer.c, test_tokenizer_spm.c,
 * test_tokenizer_wpm.c), and the tokenizer of a GGUF written in memory
 * (gguf_writer.h). A header of static functions for cmocka tests: include
 * it after <cmocka.h> and gguf_writer.h.
 */
#ifndef ZI_TOKENIZER_EXPECT_H
#define ZI_TOKENIZER_EXPECT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tokenizer.h"

/* A tokenizer loaded from a GGUF built in memory; the file's bytes and the
 * GGUF handle live as long as it does. */
typedef struct zi_loaded_tokenizer {
    wbuf b;
    zi_gguf *g;
    zi_tokenizer *t;
} zi_loaded_tokenizer;

/* Opens the GGUF in b (taking it) and loads its tokenizer into l; the
 * status of zi_tokenizer_load (l->t NULL on failure). */
static inline int zi_load_tokenizer(wbuf b, zi_loaded_tokenizer *l, zi_error *err) {
    l->b = b;
    l->t = NULL;
    assert_int_equal(zi_gguf_open_memory(l->b.p, l->b.n, &l->g, err), ZI_OK);
    return zi_tokenizer_load(l->g, &l->t, err);
}

static inline void zi_unload_tokenizer(zi_loaded_tokenizer *l) {
    zi_tokenizer_free(l->t);
    zi_gguf_close(l->g);
    free(l->b.p);
}

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
