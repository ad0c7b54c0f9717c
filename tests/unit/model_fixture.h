/*
 * model_fixture.h - the default model on the CPU backend with its
 * tokenizer, for the cmocka tests that run the real model (test_generator,
 * test_spec_lookup, test_spec_draft, test_embedder). A test whose model
 * file is absent skips its cases (setup leaves the state NULL).
 */
#ifndef ZI_TEST_MODEL_FIXTURE_H
#define ZI_TEST_MODEL_FIXTURE_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "cpu_backend.h"
#include "generator.h"
#include "model.h"
#include "tokenizer.h"

/* Loads the default model (its path into path[cap]) on a 2-thread CPU
 * backend, and its tokenizer. Returns 1 when loaded, 0 when the file is
 * absent, -1 on an error (printed). */
static inline int zi_test_model_open(zi_backend **be, zi_model **model, zi_tokenizer **tok,
                                     char *path, size_t cap) {
    zi_default_model_path(path, cap);
    if (access(path, R_OK) != 0) return 0;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = 2};
    if (zi_cpu_backend_create(&o, be, &err) || zi_model_load(path, *be, model, &err) ||
        zi_tokenizer_load(zi_model_gguf(*model), tok, &err)) {
        fprintf(stderr, "setup: %s\n", err.msg);
        return -1;
    }
    return 1;
}

/* Frees what zi_test_model_open loaded. */
static inline void zi_test_model_close(zi_backend *be, zi_model *model, zi_tokenizer *tok) {
    zi_tokenizer_free(tok);
    zi_model_free(model);
    zi_backend_free(be);
}

/* Encodes texts[0..n) with BOS and special tokens into ids[i] / n_ids[i]. */
static inline int zi_test_encode_all(zi_tokenizer *tok, const char *const *texts, int n,
                                     int32_t **ids, size_t *n_ids) {
    zi_error err = {0};
    for (int i = 0; i < n; i++)
        if (zi_tokenizer_encode(tok, texts[i], strlen(texts[i]), 1, 1, &ids[i], &n_ids[i], &err)) {
            fprintf(stderr, "setup: %s\n", err.msg);
            return -1;
        }
    return 0;
}

/* Releases the finished contexts among live[0..n) from g and keeps the
 * others, in order, at the front; returns how many are left (the loop
 * every generator test runs after a step). */
static inline size_t zi_test_drop_done(zi_generator *g, zi_text_context **live, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (zi_text_context_is_done(live[i]))
            zi_generator_release(g, live[i]);
        else
            live[k++] = live[i];
    }
    return k;
}

#endif
