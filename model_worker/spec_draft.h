/*
 * spec_draft.h - draft-model speculation: a second, smaller model with the
 * target's vocabulary proposes the next tokens of the speculating
 * sequences greedily, and the target verifies them in its normal step
 * (generator.c, with the rows and the accept rule of prompt lookup:
 * spec_lookup.h, docs/speculative.md).
 *
 * The draft model has its own paged KV cache and block pool (no prefix
 * sharing), per generator slot. For each slot it remembers the tokens
 * whose K/V it holds; before proposing, a sequence's cache is caught up
 * with the tokens it has now (the accepted drafts and the target's tokens
 * since the last run), starting at the first position whose token differs
 * from the one fed there, so rejected drafts are rolled back by being
 * overwritten. Then k one-token passes, every proposing sequence batched
 * together, give k tokens each (argmax of the draft's logits).
 */
#ifndef ZI_SPEC_DRAFT_H
#define ZI_SPEC_DRAFT_H

#include <stdint.h>

#include "model.h"
#include "zi_error.h"

typedef struct zi_spec_draft zi_spec_draft;

/* Can draft (at draft_path) propose for target (at target_path)? The
 * output rows (vocabulary size) must be equal, and so must the tokenizers:
 * tokenizer.ggml.model and the token strings (tokenizer.ggml.tokens,
 * compared by count and a hash of every string), where either file has
 * them. ZI_EINVAL naming both files and what differs otherwise. */
int zi_spec_draft_check_vocab(const zi_model *target, const char *target_path,
                              const zi_model *draft, const char *draft_path, zi_error *err);

/* A proposer over draft model m (which must outlive it) for n_slots
 * sequences of up to ctx positions: a KV pool of n_blocks blocks of
 * block_size positions, passes of at most max_batch_tokens tokens, and
 * proposals among ids 0..sample_vocab-1. */
int zi_spec_draft_create(zi_model *m, int n_slots, int ctx, int n_blocks, int block_size,
                         int max_batch_tokens, int sample_vocab, zi_spec_draft **out,
                         zi_error *err);
void zi_spec_draft_free(zi_spec_draft *d);

/* Forgets slot's tokens and gives its blocks back (a slot released or
 * preempted: its next proposal catches up from position 0). */
void zi_spec_draft_reset(zi_spec_draft *d, int slot);

/* Makes room in slot's cache for a proposal of k tokens after n_tokens
 * tokens (positions 0 .. n_tokens + k - 2 are fed); returns the k that
 * fits (0 .. k; less when the pool or the positions run out). */
int zi_spec_draft_reserve(zi_spec_draft *d, int slot, int64_t n_tokens, int k);

/* One proposal: slot's sequence is tokens[0..n_tokens); k (reserved with
 * zi_spec_draft_reserve) tokens go to out. */
typedef struct zi_spec_draft_req {
    int slot;
    const int32_t *tokens;
    int64_t n_tokens;
    int k;
    int32_t *out;
} zi_spec_draft_req;

/* Runs the draft model for the n requests (each slot at most once):
 * catch-up passes, then max(k) - 1 one-token passes. */
int zi_spec_draft_propose(zi_spec_draft *d, const zi_spec_draft_req *reqs, int n, zi_error *err);

/* Forward passes run, and tokens fed, since creation (for logs). */
void zi_spec_draft_counts(const zi_spec_draft *d, uint64_t *passes, uint64_t *tokens);

#endif
