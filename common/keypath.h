/*
 * keypath.h - the place in a nested value that an error message names,
 * e.g. "tools[0].function.name": pushed as a walk goes down a tree and
 * popped as it comes back up. Used where client data is checked field by
 * field (protocol/codec_fields.c, chat_template/chat_vars.c,
 * chat_template/chat_template.c).
 *
 * The text is always NUL-terminated; one that would not fit is cut short
 * and ends in "...", so a message stays readable whatever the input.
 */
#ifndef ZI_KEYPATH_H
#define ZI_KEYPATH_H

#include <stddef.h>

typedef struct zi_keypath {
    char s[192];
    size_t n;
} zi_keypath; /* zero-initialise: the empty path */

/* Appends printf-formatted text; returns the old length, for pop. */
size_t zi_keypath_push(zi_keypath *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends prefix and then key[0..n) (a map key or a name from the client,
 * as zi_printable shows it). Returns the old length. */
size_t zi_keypath_push_key(zi_keypath *p, const char *prefix, const char *key, size_t n);

/* Back to the length push returned. */
void zi_keypath_pop(zi_keypath *p, size_t old);

/* s[0..n) (client text) as a message may quote it: printable ASCII kept,
 * every other byte shown as '?' (so the message is valid UTF-8 and one
 * line), at most max bytes of it, then "..."; cut to fit cap (> 4). */
void zi_printable_max(char *out, size_t cap, const char *s, size_t n, size_t max);

/* zi_printable_max with max 64: a name or key. */
void zi_printable(char *out, size_t cap, const char *s, size_t n);

#endif
