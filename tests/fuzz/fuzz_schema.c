/*
 * fuzz_schema.c - libFuzzer entry point for the JSON Schema compiler
 * (structured/schema_grammar.h) and the grammar compiler behind it:
 * the input is a schema's JSON text. It is written as GBNF
 * (zi_schema_to_gbnf); a refusal leaves a one-line message starting with
 * "response_format.json_schema" and the code ZI_EINVAL or
 * ZI_EUNSUPPORTED. The GBNF of a schema that was taken is compiled
 * (zi_grammar_compile, which may still refuse it at its limits or for
 * left recursion from a `pattern`), then matched over a few bytes
 * (fuzz_grammar_probe.h). A broken promise calls __builtin_trap().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_grammar_probe.h"
#include "schema_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    zi_gbnf_buf b = {0};
    zi_error err = {0};
    int rc = zi_schema_to_gbnf((const char *)data, size, &b, &err);
    if (rc != ZI_OK) {
        CHECK(rc == ZI_EINVAL || rc == ZI_EUNSUPPORTED || rc == ZI_ENOMEM || rc == ZI_ERANGE);
        CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        if (rc != ZI_ENOMEM) CHECK(strncmp(err.msg, "response_format.json_schema", 27) == 0);
        free(b.p);
        return 0;
    }
    CHECK(b.p != NULL && !b.oom && strlen(b.p) == b.n);
    zi_grammar *g = NULL;
    zi_error gerr = {0};
    if (zi_grammar_compile(b.p, b.n, &g, &gerr) == ZI_OK) {
        fuzz_probe(g, data, size);
        zi_grammar_free(g);
    } else {
        CHECK(gerr.msg[0] != '\0');
    }
    free(b.p);
    return 0;
}
