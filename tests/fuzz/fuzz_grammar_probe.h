/*
 * fuzz_grammar_probe.h - shared by the grammar fuzz targets
 * (fuzz_gbnf.c, fuzz_schema.c, fuzz_regex.c): runs a compiled grammar's
 * matcher (grammar.h) over a few bytes so that the state code (stack
 * expansion, partial UTF-8 characters, pruning at the limits) is
 * exercised as well as the compiler. The bytes are the input's own (its
 * first 48 bytes, whatever they are) and some fixed probes in JSON and
 * text. Promises checked: a refused feed leaves the state as it was (the
 * same accepts/can_end answers), a state never holds more than
 * ZI_GRAMMAR_MAX_STACKS stacks, and (memory being there) no call reports
 * an error. A broken promise calls __builtin_trap().
 */
#ifndef FUZZ_GRAMMAR_PROBE_H
#define FUZZ_GRAMMAR_PROBE_H

#include <stdint.h>
#include <string.h>

#include "grammar.h"

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) __builtin_trap();                                                                \
    } while (0)

static inline void fuzz_probe_bytes(const zi_grammar *g, const uint8_t *p, size_t n) {
    zi_grammar_state *s = NULL;
    zi_error err = {0};
    if (zi_grammar_state_create(g, &s, &err) != ZI_OK) {
        CHECK(err.msg[0] != '\0');
        return;
    }
    for (size_t i = 0; i < n; i++) {
        bool end_before = zi_grammar_can_end(s);
        int stacks_before = zi_grammar_state_stacks(s);
        bool acc = false, fed = false;
        CHECK(zi_grammar_accepts(s, p + i, 1, &acc, &err) == ZI_OK);
        CHECK(zi_grammar_feed(s, p + i, 1, &fed, &err) == ZI_OK);
        CHECK(acc == fed);
        CHECK(zi_grammar_state_stacks(s) <= ZI_GRAMMAR_MAX_STACKS);
        if (!fed) { /* unchanged: try the next byte from the same place */
            CHECK(zi_grammar_can_end(s) == end_before);
            CHECK(zi_grammar_state_stacks(s) == stacks_before);
        }
    }
    (void)zi_grammar_can_end(s);
    zi_grammar_state_free(s);
}

static inline void fuzz_probe(const zi_grammar *g, const uint8_t *data, size_t size) {
    static const char *const probes[] = {
        "{\"a\": 1, \"b\": [true, null, \"x\\u00e9\"]}",
        "[1, -2.5e3, \"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]",
        "abc123 xyz\n",
        "\"2024-01-31T12:00:00Z\"",
        "\xff\xc3(\xe2\x82",
    };
    fuzz_probe_bytes(g, data, size < 48 ? size : 48);
    for (size_t k = 0; k < sizeof probes / sizeof *probes; k++)
        fuzz_probe_bytes(g, (const uint8_t *)probes[k], strlen(probes[k]));
}

#endif
