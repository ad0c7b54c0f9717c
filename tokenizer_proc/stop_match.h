/*
 * stop_match.h - stop strings applied to a stream of decoded text.
 *
 * The tokenizer process decodes a request's tokens incrementally and feeds
 * the text here. A stop string may span several tokens, so text that could
 * still turn out to be the start of a stop string is held back until the
 * next piece decides it. When a stop string appears, the text before its
 * earliest occurrence is released and the rest (the stop string included)
 * is dropped: the client never sees the stop text.
 *
 * Held-back text is always a suffix that equals a prefix of a stop string;
 * stop strings and the decoded text are whole UTF-8 characters, so what is
 * released never ends inside a character.
 */
#ifndef ZI_STOP_MATCH_H
#define ZI_STOP_MATCH_H

#include <stdbool.h>
#include <stddef.h>

#include "zi_error.h"

typedef struct zi_stop_matcher {
    char **stops; /* owned copies */
    size_t *lens;
    size_t n;
    char *held; /* text not yet released */
    size_t held_len, held_cap;
    bool stopped;
    int matched; /* the stop string found (an index of stops), -1 before */
} zi_stop_matcher;

/* Copies the n stop strings (empty ones are ignored). n may be 0: then
 * every piece is released at once. */
int zi_stop_init(zi_stop_matcher *m, const char *const *stops, const size_t *lens, size_t n,
                 zi_error *err);
void zi_stop_free(zi_stop_matcher *m);

/*
 * Feeds text[0..len) and appends the text that may now be released to
 * *out (a malloc'd buffer of *out_len bytes, grown with realloc; start with
 * NULL/0). Returns ZI_OK; sets *stopped when a stop string was found (after
 * which further feeds release nothing). ZI_ENOMEM on allocation failure.
 */
int zi_stop_feed(zi_stop_matcher *m, const char *text, size_t len, char **out, size_t *out_len,
                 bool *stopped, zi_error *err);
/* End of stream: releases whatever is held (unless stopped). */
int zi_stop_flush(zi_stop_matcher *m, char **out, size_t *out_len, zi_error *err);
/* Releases what is held, then text[0..len) as it is, without looking for
 * stop strings in it (the text of a request's first min_new_tokens tokens:
 * a stop string must lie wholly after it, docs/sampling.md). Nothing after
 * a stop. */
int zi_stop_pass(zi_stop_matcher *m, const char *text, size_t len, char **out, size_t *out_len,
                 zi_error *err);

#endif
