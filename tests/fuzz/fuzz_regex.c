/*
 * fuzz_regex.c - libFuzzer entry point for the regex translator
 * (structured/regex_grammar.h): the input is a pattern, translated in both
 * modes (ZI_REGEX_TEXT, a request's `regex`; ZI_REGEX_JSON, a schema's
 * `pattern`). A refusal leaves a non-empty one-line message ("offset N:
 * ..." for a fault at a place; "invalid UTF-8" and the length limit are
 * said without one); a translation is a GBNF expression, which
 * "root ::= EXPR" must compile (grammar.h may refuse it only at its
 * limits or for left recursion, e.g. `(a*)*`), and is then matched over a
 * few bytes (fuzz_grammar_probe.h). A broken promise calls
 * __builtin_trap().
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_grammar_probe.h"
#include "regex_grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one(const uint8_t *data, size_t size, int mode) {
    zi_gbnf_buf b = {0};
    zi_gbnf_printf(&b, "root ::= ");
    zi_error err = {0};
    int rc = zi_regex_to_gbnf((const char *)data, size, mode, &b, &err);
    if (rc != ZI_OK) {
        CHECK(rc == ZI_EINVAL || rc == ZI_ENOMEM || rc == ZI_EUNSUPPORTED);
        CHECK(err.msg[0] != '\0' && !strchr(err.msg, '\n'));
        free(b.p);
        return;
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
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    one(data, size, ZI_REGEX_TEXT);
    one(data, size, ZI_REGEX_JSON);
    return 0;
}
