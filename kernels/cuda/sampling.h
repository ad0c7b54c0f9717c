/*
 * sampling.h - the fused sampling processor on the GPU: one kernel turns a
 * batch of device logit rows into one token per row (greedy, or
 * temperature / top_k / top_p / min_p and the seeded draw), and the tokens
 * come back to pinned host memory by an asynchronous copy that an event
 * marks complete. The worker can so queue sampling right behind the
 * forward pass on the backend's stream and pick the tokens up later,
 * without a device-wide synchronization.
 *
 * Semantics, including the counter-based draw u = zi_sampler_uniform(seed,
 * step), are those of model_worker/sampler.h steps 1-9; the algorithm (no
 * sort: binary searches over order-preserving keys) and what "same" means
 * draw for draw are in sampling_ref.h, whose C reference the CPU tests
 * check against the CPU sampler.
 *
 * Steps 1-4 (penalties, EOS mask, allowed-token bitmask): the host reduces
 * each row's history to a list of distinct (token, count) entries and
 * packs them, the parameters and the bitmasks of the rows that have one
 * into one pinned buffer, copied to the device in one transfer per call.
 * A first kernel rewrites each such row into the sampler's own buffer
 * (the model's logits are never written); rows without any read the
 * model's logits directly.
 *
 * One thread block per row; the kernels allocate nothing. The host side
 * grows its staging buffers (and allocates the rewrite buffer on the first
 * row that needs it) to the largest call seen.
 */
#ifndef ZI_CUDA_SAMPLING_H
#define ZI_CUDA_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "zi_error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zi_sampling_params;

typedef struct zi_cuda_sampler zi_cuda_sampler;

/* One row of plain sampling (steps 5-9 only): no history, no masks. */
typedef struct zi_cuda_sample_row {
    const struct zi_sampling_params *params; /* required; borrowed for the call */
    uint64_t step;                           /* draw counter: tokens generated so far */
} zi_cuda_sample_row;

/* One row with everything the CPU sampler takes (steps 1-9); mirrors
 * zi_sampler_row (model_worker/sampler.h). Host pointers are borrowed for
 * the call only (their contents are packed into pinned memory there). */
typedef struct zi_cuda_sample_row_full {
    const struct zi_sampling_params *params; /* required */
    uint64_t step;                           /* draw counter: tokens generated so far */
    const float *logits;                     /* the row in device memory; NULL: d_logits + r * ld */
    const int32_t *prompt_ids;               /* for the repetition penalty */
    size_t n_prompt;
    const int32_t *generated_ids; /* for all three penalties */
    size_t n_generated;
    const int32_t *bitmask;    /* host; NULL = all allowed; else ceil(n_vocab/32) words */
    const int32_t *eos_forbid; /* ids forbidden this step (min_new_tokens) */
    size_t n_eos_forbid;
} zi_cuda_sample_row_full;

/* A sampler for rows of n_vocab logits, up to max_rows per call, queuing on
 * the stream of CUDA backend be (zi_cuda_backend_create). */
int zi_cuda_sampler_create(zi_backend *be, int32_t n_vocab, int max_rows, zi_cuda_sampler **out,
                           zi_error *err);
void zi_cuda_sampler_free(zi_cuda_sampler *s);

/*
 * Queues the sampling of n_rows rows, row r at rows[r].logits or else
 * d_logits + r * ld (device floats), behind the work already on the
 * backend's stream, and the copy of the tokens to pinned host memory.
 * Returns at once. ZI_EINVAL for bad arguments (a token id outside
 * [0, n_vocab) in a row's lists, as zi_sampler_sample); ZI_EUNSUPPORTED for
 * a row asking for penalties whose prompt_ids and generated_ids are both
 * NULL (without the history they cannot be applied; empty lists are
 * fine). Nothing is queued on an error. A previous call's tokens must
 * have been collected (wait) first, else this waits for them.
 */
int zi_cuda_sampler_sample_full_async(zi_cuda_sampler *s, const float *d_logits, size_t ld,
                                      const zi_cuda_sample_row_full *rows, int n_rows,
                                      zi_error *err);

/* The same for plain rows (row r at d_logits + r * ld): a row asking for
 * penalties gets ZI_EUNSUPPORTED, as it carries no history. */
int zi_cuda_sampler_sample_async(zi_cuda_sampler *s, const float *d_logits, size_t ld,
                                 const zi_cuda_sample_row *rows, int n_rows, zi_error *err);

/* 1 when the last call's tokens have arrived (does not block). */
int zi_cuda_sampler_ready(zi_cuda_sampler *s);

/* Waits for the last call's tokens; *tokens points into pinned memory,
 * valid until the next sample_async. ZI_ERANGE naming the first row that
 * had no eligible token (its token is -1; the others are valid), ZI_EIO
 * for a CUDA error. */
int zi_cuda_sampler_wait(zi_cuda_sampler *s, const int32_t **tokens, zi_error *err);

#ifdef __cplusplus
}
#endif

#endif
