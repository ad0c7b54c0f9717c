/*
 * grammar_expect.h - the grammar matcher's calls (grammar.h) for tests
 * that expect memory to be there: each returns the answer and fails the
 * test when the call reports an error (test_grammar.c,
 * test_grammar_hostile.c, test_schema_grammar.c). A header of static
 * functions for cmocka tests: include it after <cmocka.h>.
 */
#ifndef ZI_GRAMMAR_EXPECT_H
#define ZI_GRAMMAR_EXPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* zi_grammar_feed: whether p[0..n) was taken. */
static inline bool feed_bytes(zi_grammar_state *s, const void *p, size_t n) {
    bool taken = false;
    zi_error err = {0};
    if (zi_grammar_feed(s, p, n, &taken, &err)) fail_msg("zi_grammar_feed: %s", err.msg);
    return taken;
}

/* zi_grammar_accepts: whether p[0..n) would be taken. */
static inline bool accepts_bytes(zi_grammar_state *s, const void *p, size_t n) {
    bool taken = false;
    zi_error err = {0};
    if (zi_grammar_accepts(s, p, n, &taken, &err)) fail_msg("zi_grammar_accepts: %s", err.msg);
    return taken;
}

/* zi_grammar_feed_token: whether token id was taken. */
static inline bool feed_tok(const zi_grammar_vocab *v, zi_grammar_state *s, int32_t id) {
    bool taken = false;
    zi_error err = {0};
    if (zi_grammar_feed_token(v, s, id, &taken, &err))
        fail_msg("zi_grammar_feed_token: %s", err.msg);
    return taken;
}

/* zi_grammar_allowed_within (budget < 0: zi_grammar_allowed). */
static inline void allowed_mask(const zi_grammar_vocab *v, zi_grammar_state *s, const int32_t *eos,
                                size_t n_eos, int64_t budget, int32_t *mask) {
    zi_error err = {0};
    if (zi_grammar_allowed_within(v, s, eos, n_eos, budget, mask, &err))
        fail_msg("zi_grammar_allowed_within: %s", err.msg);
}

#endif
