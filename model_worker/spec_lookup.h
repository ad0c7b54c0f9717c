/*
 * spec_lookup.h - prompt-lookup (n-gram) speculation: the draft proposer,
 * the greedy acceptance rule and the per-request adaptive draft length.
 *
 * A sequence whose text repeats what it has seen (code edited from the
 * prompt, quotes from a passage, fields copied from a document) can be
 * guessed ahead from its own tokens: the longest recent suffix of prompt +
 * output (up to ZI_SPEC_MAX_NGRAM tokens) that occurred earlier is looked
 * up, and the tokens that followed that occurrence are the draft. The
 * generator (generator.c) feeds the draft behind the sequence's last token
 * in the same forward pass and keeps what the model itself would have
 * chosen (zi_spec_accept), so the output is the non-speculative output.
 *
 * Pure functions over token arrays and a small state struct: no memory is
 * allocated, nothing depends on other sequences.
 */
#ifndef ZI_SPEC_LOOKUP_H
#define ZI_SPEC_LOOKUP_H

#include <stdint.h>

/* Draft tokens per step at most (the verification rows are 1 + this). */
#define ZI_SPEC_MAX_DRAFT 8
/* Longest suffix looked up; shorter ones down to ZI_SPEC_MIN_NGRAM tokens
 * are tried too. A single recurring token (a space, "the") predicts little:
 * on free-form text its drafts are mostly rejected, and a rejected row
 * costs a CPU step a good part of a token's compute. */
#define ZI_SPEC_MAX_NGRAM 4
#define ZI_SPEC_MIN_NGRAM 2
/* Draft length a sequence starts with, and returns to after a pause. */
#define ZI_SPEC_START_DRAFT 2
/* Failed verifications in a row (less than half the drafts kept) before
 * drafting pauses. */
#define ZI_SPEC_MAX_FAILS 2
/* The pause, in steps: doubles on each failed re-probe up to the maximum. */
#define ZI_SPEC_MIN_PAUSE 8
#define ZI_SPEC_MAX_PAUSE 256

/*
 * Proposes up to k (<= ZI_SPEC_MAX_DRAFT) tokens to follow tokens[0..n):
 * finds the longest suffix of ZI_SPEC_MIN_NGRAM..ZI_SPEC_MAX_NGRAM tokens
 * that occurs
 * earlier (its most recent occurrence wins among equally long ones) and
 * copies the tokens that followed it into out. Returns how many (0: no
 * suffix recurs, or k <= 0). Cost: one backward scan, O(n * ngram) at
 * worst, stopping at the first full-length match.
 */
int zi_spec_propose(const int32_t *tokens, int64_t n, int k, int32_t *out);

/*
 * Greedy acceptance: target[j] (j = 0..n_draft) is the model's token after
 * the row that fed the sequence's last token (j = 0) or draft[j - 1].
 * Returns a, the drafts accepted: draft[j] == target[j] for j < a, and
 * a == n_draft or draft[a] != target[a]. The tokens emitted are
 * target[0..a] (a + 1 of them): the accepted drafts, then the model's own
 * token after the last one.
 */
int zi_spec_accept(const int32_t *draft, int n_draft, const int32_t *target);

/* The adaptive draft length of one sequence. */
typedef struct zi_spec_state {
    int32_t k;     /* drafts to propose next time */
    int32_t fails; /* verifications in a row with no draft accepted */
    int32_t pause; /* steps left without drafting */
    int32_t next_pause;
} zi_spec_state;

void zi_spec_state_init(zi_spec_state *s);
/* The draft length for this step, at most cap (0: do not draft this step;
 * counts a pause down). */
int zi_spec_draft_len(zi_spec_state *s, int cap);
/* After a verification of `proposed` drafts of which `accepted` were kept:
 * all kept grows k by 2 (to ZI_SPEC_MAX_DRAFT), some kept sets it to
 * accepted + 1, none halves it. A verification that kept less than half
 * its drafts is a failure; ZI_SPEC_MAX_FAILS failures in a row pause
 * drafting (8 steps, doubling to 256 on each failed re-probe; a
 * verification that kept half or more resets the pause). */
void zi_spec_record(zi_spec_state *s, int proposed, int accepted);

#endif
