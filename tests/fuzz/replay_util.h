/*
 * replay_util.h - what the fuzz replay tests share: seeded random numbers,
 * reading a corpus file, and the byte-level damage that fuzz_replay.c and
 * fuzz_chat_template_replay.c do to each input (cut short at seeded
 * places; bits flipped, a byte set from a table, a run deleted or
 * repeated). A fixed seed gives the same inputs on every run, so a
 * failure found in CI replays the same way on any machine.
 */
#ifndef ZI_REPLAY_UTIL_H
#define ZI_REPLAY_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* xorshift64: the next value of *s (nonzero seed). */
uint64_t zi_replay_xorshift(uint64_t *s);

/* splitmix64: the next value of *s (any seed). */
uint64_t zi_replay_splitmix(uint64_t *s);

/* The whole file at path, malloc'ed (the caller frees it), its size in
 * *len; NULL when it cannot be read. */
uint8_t *zi_replay_slurp(const char *path, size_t *len);

/* How zi_replay_damage damages an input. */
typedef struct zi_replay_plan {
    int truncations;      /* runs of the input cut at a seeded length */
    int mutations;        /* runs with 1-4 seeded edits each */
    const uint8_t *bytes; /* what a "set a byte" edit writes, one of */
    size_t n_bytes;       /* > 0 */
    size_t max_delete;    /* longest run a "delete" edit removes */
    size_t max_repeat;    /* longest run a "repeat" edit doubles */
} zi_replay_plan;

/* The fuzz target's entry point, linked into each replay program. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the entry point on a copy of data in a heap block of exactly size
 * bytes, so that ASan sees any read past its end. Exits on out of memory. */
void zi_replay_run(const uint8_t *data, size_t size);

/* Runs src whole, then plan->truncations prefixes and plan->mutations
 * damaged copies (draws from *seed with zi_replay_xorshift), each with
 * zi_replay_run; returns how many inputs it ran. */
size_t zi_replay_damage(const uint8_t *src, size_t len, uint64_t *seed, const zi_replay_plan *plan);

#endif
