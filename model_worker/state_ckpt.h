/*
 * state_ckpt.h - the table of a hybrid's recurrent-state checkpoints, for
 * prefix reuse (docs/hybrids.md, generator.c).
 *
 * A hybrid's recurrent state covers its sequence from the start, so cached
 * KV blocks alone cannot resume a sequence: the state at the end of the
 * cached prefix is needed too. A checkpoint is a copy of a sequence's
 * state taken when it covered exactly a whole number of blocks, kept in
 * one of n extra state rows of the KV cache (zi_kv_cache_add_states); this
 * table says which prefix each row holds: its length, the chained block
 * hash of that prefix (kv_blocks.h) and its tokens, so that a match is
 * exact, never a hash's guess.
 *
 * Each sequence (owner) keeps at most two: the one at its prompt's last
 * whole block (ZI_CKPT_PROMPT) and its latest one while it decodes
 * (ZI_CKPT_LATEST), which each newer one replaces; released sequences'
 * checkpoints stay for later ones to find, and when every row is taken
 * the least recently used gives way. A checkpoint whose blocks were
 * evicted is never found again (the blocks' match fails first) and ages
 * out.
 *
 * Not thread-safe: one generator owns one table.
 */
#ifndef ZI_STATE_CKPT_H
#define ZI_STATE_CKPT_H

#include <stdint.h>

#include "zi_error.h"

enum { ZI_CKPT_PROMPT = 1, ZI_CKPT_LATEST = 2 };

/* Checkpoint rows a generator keeps per sequence slot (the memory plan
 * counts them: mem_plan.h). */
#define ZI_STATE_CKPT_PER_SLOT 2

typedef struct zi_state_ckpts zi_state_ckpts;

int zi_state_ckpts_create(int n, zi_state_ckpts **out, zi_error *err);
void zi_state_ckpts_free(zi_state_ckpts *t);
int zi_state_ckpts_count(const zi_state_ckpts *t);

/* The row holding the prefix tokens[0..len) with chained hash `hash`, or
 * -1; a row found counts as used now. */
int zi_state_ckpts_find(zi_state_ckpts *t, uint64_t hash, const int32_t *tokens, int64_t len);

/* The row to copy owner's state into as a checkpoint of kind (ZI_CKPT_*)
 * of tokens[0..len) with hash `hash`: the row already holding that prefix,
 * else owner's previous checkpoint of the same kind, else a free row, else
 * the least recently used. The row's record is set; -1 when out of memory
 * for the tokens (nothing changed). */
int zi_state_ckpts_take(zi_state_ckpts *t, int owner, int kind, uint64_t hash,
                        const int32_t *tokens, int64_t len);

/* Row `row` holds nothing any more (its state could not be copied). */
void zi_state_ckpts_drop(zi_state_ckpts *t, int row);

/* The owner's checkpoints stay, no longer its (a released sequence). */
void zi_state_ckpts_disown(zi_state_ckpts *t, int owner);

#endif
