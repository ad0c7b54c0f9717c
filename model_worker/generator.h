/*
 * generator.h - the worker's token generator: the seeds' TokenGenerator /
 * TextGenerationPipeline, next_token(batch, num_steps) and release(context).
 *
 * A zi_generator owns one KV cache of n_slots sequences over one model. Each
 * step is ONE batched forward pass over every active context in the batch:
 * decode steps (one token each) and prompt windows together, which is what
 * lets requests join and leave the running batch between steps (continuous
 * batching). A step carries at most max_batch_tokens tokens; prompt windows
 * that do not fit are cut (zi_text_context_limit_active: chunked prefill)
 * and continue in the next step, so long prompts never stall the decodes
 * running beside them.
 *
 * Each context's token is chosen by the fused sampling processor
 * (sampler.h) with the context's own sampling parameters, penalties over
 * its prompt and generated tokens, the min_new_tokens EOS mask, and a draw
 * seeded by (sampling_params.seed, tokens generated so far). Outputs do not
 * depend on batch composition: the kernels give a token the same bits alone
 * or batched, and the draw is counter based, so a seeded request repeats
 * exactly whatever runs beside it.
 *
 * Log probabilities (ctx->log_probabilities > 0) come from the raw logits
 * and are recorded with each token (zi_text_context_update); with
 * log_probabilities_echo the prompt's tokens 1..prompt_len-1 get theirs too
 * (zi_text_context_set_prompt_logprobs), which keeps the logits of every
 * prompt position for those windows.
 */
#ifndef ZI_GENERATOR_H
#define ZI_GENERATOR_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "types.h"
#include "zi_error.h"

typedef struct zi_generator_config {
    int n_slots;          /* sequences held at once (KV-cache slots) */
    int ctx;              /* positions per slot */
    int max_batch_tokens; /* tokens per forward pass (the step's budget) */
} zi_generator_config;

typedef struct zi_generator zi_generator;

/* m must outlive the generator. */
int zi_generator_create(zi_model *m, const zi_generator_config *cfg, zi_generator **out,
                        zi_error *err);
void zi_generator_free(zi_generator *g);

/*
 * Runs up to num_steps steps over the n contexts of batch. A context without
 * a cache slot gets one (ZI_ENOMEM "no free KV-cache slot" when all are in
 * use; nothing has run then). Each step feeds every context that is not done
 * its active window (cut to the step's remaining budget; a context that gets
 * no budget waits for the next step), samples the next token from the
 * window's last position and records it with zi_text_context_update. The
 * loop ends early when every context is done; a context that finishes
 * (EOS, a stop token id, maximum length) is not fed again, so num_steps > 1
 * checks the stop conditions after every token. On error the contexts are
 * left as the last completed step left them.
 */
int zi_generator_next_token(zi_generator *g, zi_text_context *const *batch, size_t n,
                            int num_steps, zi_error *err);

/* Frees ctx's cache slot (the seeds' release); a no-op for a context
 * without one. */
void zi_generator_release(zi_generator *g, zi_text_context *ctx);

/* Slots in use, for load reporting. */
int zi_generator_slots_used(const zi_generator *g);

#endif
