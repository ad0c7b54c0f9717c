/*
 * fuzz_gbnf.c - libFuzzer entry point for the GBNF grammar parser and
 * compiler (structured/grammar.h, grammar_parse.c) alone: the input is
 * grammar text. A refused grammar leaves no grammar and a one-line
 * message "grammar: ..."; a compiled one is matched over a few bytes
 * (fuzz_grammar_probe.h) and freed. A broken promise calls
 * __builtin_trap(); a hang or an out-of-memory report is a bug too (the
 * compile limits bound both).
 */
#include <stdint.h>
#include <string.h>

#include "fuzz_grammar_probe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_grammar *g = (zi_grammar *)1;
    zi_error err = {0};
    int rc = zi_grammar_compile((const char *)data, size, &g, &err);
    if (rc != ZI_OK) {
        CHECK(rc == ZI_EINVAL || rc == ZI_ENOMEM);
        CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        if (rc == ZI_EINVAL) CHECK(strncmp(err.msg, "grammar", 7) == 0);
        return 0;
    }
    CHECK(g != NULL);
    fuzz_probe(g, data, size);
    zi_grammar_free(g);
    return 0;
}
