/*
 * device_sampler.h - the generator's bridge to the GPU sampler
 * (kernels/cuda/sampling.h): when the model runs on the CUDA backend, a
 * step queues its forward pass without downloading the logits
 * (zi_model_forward_async), queues the sampling of its rows right behind
 * it on the same stream (steps 1-9 of sampler.h: penalties, the EOS mask
 * and the structured-output bitmask included), and waits only for the
 * token ids, which come back by an asynchronous copy into pinned memory.
 * The logits never reach the host.
 *
 * Built in every configuration; without CUDA (no ZI_HAVE_CUDA) create
 * always gives NULL, and the generator samples on the host as before.
 * The generator uses this path only for steps whose contexts need no host
 * logits (no log probabilities, so no echo either). Decode passes of a
 * shape seen before are replayed from CUDA graphs (device_sampler.c).
 */
#ifndef ZI_DEVICE_SAMPLER_H
#define ZI_DEVICE_SAMPLER_H

#include <stdint.h>

#include "model.h"
#include "sampler.h"
#include "zi_error.h"

typedef struct zi_device_sampler zi_device_sampler;

/* 1 when the GPU sampler is compiled in (ZI_HAVE_CUDA). */
int zi_device_sampler_compiled(void);

/* A bridge for model m, drawing from ids 0..n_vocab-1 (the generator's
 * sample vocabulary), up to max_rows rows a step. *out = NULL and ZI_OK
 * when m's backend is not CUDA or CUDA is not compiled in, or when
 * ZINFER_GPU_SAMPLER=0 is set (host sampling on a GPU, for comparisons).
 * An error only when the backend is CUDA and the sampler cannot be made. */
int zi_device_sampler_create(zi_model *m, int32_t n_vocab, int max_rows, zi_device_sampler **out,
                             zi_error *err);
void zi_device_sampler_free(zi_device_sampler *d);

/* Queues the forward pass of b (nothing is waited for). */
int zi_device_sampler_forward(zi_device_sampler *d, zi_kv_cache *kv, const zi_batch *b,
                              zi_error *err);

/* Samples rows[k] (the same fields as for zi_sampler_sample, .logits
 * ignored) from row src_row[k] of the last pass's logits, on the device;
 * waits for the tokens and writes them to out[k]. ZI_ERANGE, as
 * zi_sampler_sample: out[k] = -1 for the rows with nothing eligible, the
 * others are valid; the logits stay valid for another call until the next
 * forward. */
int zi_device_sampler_sample(zi_device_sampler *d, const zi_sampler_row *rows, const int *src_row,
                             int n_rows, int32_t *out, zi_error *err);

/* Waits for the pass (the backend's sync): errors of the queued ops are
 * seen here. Tokens are only trusted after this returned ZI_OK. */
int zi_device_sampler_finish(zi_device_sampler *d, zi_error *err);

/* Tokens sampled on the device so far. */
uint64_t zi_device_sampler_count(const zi_device_sampler *d);

/* The decode passes captured in CUDA graphs and the passes replayed from
 * them so far (device_sampler.c says which passes qualify;
 * ZINFER_CUDA_GRAPHS=0 turns graphs off). */
void zi_device_sampler_graph_stats(const zi_device_sampler *d, uint64_t *captures,
                                   uint64_t *replays);

#endif
