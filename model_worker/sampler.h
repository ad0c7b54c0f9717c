/*
 * sampler.h - the fused sampling processor (the seed's FusedSamplingProcessor)
 * on the CPU: turns a batch of logit rows into one chosen token per row,
 * applying each row's zi_sampling_params, penalties and masks in one pass.
 *
 * The generator hands the sampler the last-position logits of every context
 * in a step (model_worker/generator.c). Each row is processed in this fixed
 * order:
 *
 *   0. the logit bias (params->logit_bias, OpenAI's logit_bias): each
 *      listed id's logit += its bias, before everything else, so the
 *      penalties, masks, greedy argmax and temperature all see the biased
 *      logit (vLLM's order). Ids outside [0, n_vocab) are skipped (the
 *      worker refuses them before a request gets here).
 *   1. repetition penalty (CTRL form): for every distinct token seen in the
 *      prompt or the generated tokens, logit > 0 ? logit / r : logit * r.
 *   2. frequency and presence penalties (OpenAI form), over GENERATED tokens
 *      only (the prompt is the user's, not the model's repetition):
 *      logit -= frequency * count + presence * (count > 0).
 *   3. the EOS mask: the ids in eos_forbid (min_new_tokens not reached yet)
 *      become -inf.
 *   4. the allowed-token bitmask (structured output): packed int32 words,
 *      ceil(V/32) per row; bit j of word i set = token 32*i + j allowed.
 *   5. temperature: temperature == 0 or top_k == 1 means greedy: the argmax
 *      of the penalised, masked logits (ties: lowest id); steps 6-9 are
 *      skipped. Otherwise probabilities are softmax(logit / temperature).
 *   6. top_k: keep the k most probable (k <= 0: off; -1 and 0 both mean off).
 *   7. top_p: of what is left, renormalised, keep the smallest prefix in
 *      descending order whose mass reaches top_p (the token that crosses is
 *      kept). 1 = off.
 *   8. min_p: keep tokens whose probability is >= min_p * the largest one.
 *   9. a seeded draw from the renormalised survivors.
 *
 * Ties in ordering (top_k, top_p) are broken by the lower token id, so the
 * result is a pure function of the inputs.
 *
 * Reproducibility: the uniform number behind a row's draw is
 * zi_sampler_uniform(seed, step), a counter-based generator (splitmix64 of
 * the seed, xor the step, splitmix64 again). It depends only on the row's
 * own seed and step, never on the batch around it or on earlier calls, so a
 * row gives the same token alone or batched, and replaying a step (rollback)
 * replays the token. Callers should pass as step the number of tokens the
 * row has generated so far.
 *
 * Odd logits (the module never crashes on them): NaN counts as -inf (never
 * chosen). +inf logits share all the probability evenly. A row where no
 * token is eligible (every logit -inf or NaN, or everything masked) gets
 * token -1 and the call returns ZI_ERANGE naming the first such row; the
 * other rows are still sampled. Parameter ranges are not checked here beyond
 * what is needed for memory safety: run zi_sampling_params_validate first.
 *
 * Cost: one pass over the vocabulary per row; top_k uses a k-entry heap.
 * Without top_k the weights of the whole vocabulary go into a flat array (a
 * vectorised polynomial exponential of float precision; weights below e^-87
 * of the largest count as 0) and top_p is found by a histogram of the mass
 * over weight buckets (over the tokens of weight >= 2^-12 of the largest
 * only, when their mass already reaches top_p), then a quickselect guided
 * by mass inside the one bucket where the cut falls (expected O(V), never a full sort; the cut is
 * exact up to the order of floating-point summation). Sums are in double.
 * All scratch is sized at create; sampling never allocates. One zi_sampler
 * must not be used by two threads at once (it holds the scratch).
 */
#ifndef ZI_SAMPLER_H
#define ZI_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "types.h"
#include "zi_error.h"

typedef struct zi_sampler zi_sampler;

/* One row of a sampling batch. Pointers are borrowed for the call. */
typedef struct zi_sampler_row {
    const float *logits;              /* n_vocab values */
    const zi_sampling_params *params; /* required */
    const int32_t *prompt_ids;        /* for the repetition penalty; may be NULL if n is 0 */
    size_t n_prompt;
    const int32_t *generated_ids; /* for all three penalties */
    size_t n_generated;
    uint64_t step;             /* draw counter: tokens generated so far */
    const int32_t *bitmask;    /* NULL = all allowed; else ceil(n_vocab/32) words */
    const int32_t *eos_forbid; /* ids forbidden this step (min_new_tokens) */
    size_t n_eos_forbid;
    /* Tokens generated after generated_ids, counted with them by the
     * penalties (speculation: the drafts before a verification row, which
     * is processed as if they had been generated). May be NULL if n is 0. */
    const int32_t *more_generated_ids;
    size_t n_more_generated;
} zi_sampler_row;

/* Creates a sampler for vocabularies of n_vocab tokens (1 .. 2^28). */
int zi_sampler_create(zi_sampler **out, int32_t n_vocab, zi_error *err);
void zi_sampler_free(zi_sampler *s);

/*
 * Chooses out_tokens[r] for each of n_rows rows. ZI_EINVAL (nothing written)
 * for a NULL row field that is needed or a token id in prompt_ids,
 * generated_ids, more_generated_ids or eos_forbid outside [0, n_vocab); the message names the row
 * and field. ZI_ERANGE when some row had no eligible token (see above).
 */
int zi_sampler_sample(zi_sampler *s, const zi_sampler_row *rows, size_t n_rows, int32_t *out_tokens,
                      zi_error *err);

/* Writes into out (n_vocab floats) the row's logits after steps 0-4 (bias,
 * penalties, EOS mask, bitmask; masked tokens are -inf), i.e. what the
 * greedy argmax and the temperature see. For tests and debugging; the same
 * ZI_EINVAL checks as zi_sampler_sample (the message says row 0). */
int zi_sampler_processed_logits(zi_sampler *s, const zi_sampler_row *row, float *out,
                                zi_error *err);

/* The uniform number in [0, 1) used for the draw of (seed, step). */
double zi_sampler_uniform(uint64_t seed, uint64_t step);

/*
 * Log probabilities for the response: log-softmax of the RAW logits (before
 * the logit bias, penalties, masks and temperature - what the model
 * predicted; vLLM's default "raw_logprobs" does the same), computed in
 * double. *token_lp gets the chosen token's value; top_ids/top_lps (top_n
 * entries each, may be NULL when top_n is 0) the top_n tokens in descending
 * order, ties by lower id. NaN logits count as -inf. ZI_EINVAL for a token
 * outside [0, n_vocab), top_n outside [0, n_vocab], or a row with no finite
 * logit and no +inf. Allocates nothing.
 */
int zi_sampler_logprobs(const float *logits, int32_t n_vocab, int32_t token, int32_t top_n,
                        float *token_lp, int32_t *top_ids, float *top_lps, zi_error *err);

#endif
