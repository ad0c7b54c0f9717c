/*
 * mem_plan.h - the memory a worker needs, and the default memory budget.
 *
 * A worker holds its weights, the working buffers of one forward pass and
 * a KV cache. By default (no --memory-budget, --kv-cache-tokens or
 * --kv-cache-bytes) the budget is exactly what the configuration asks for:
 * the weights, the working buffers, and a KV cache that holds every
 * slot's full context (--slots x --ctx-size positions, the context first
 * cut to the model's trained length), so that the model the user named
 * serves the context the user asked for, whatever the file's size. It
 * must fit in ZI_MEM_SHARE_PCT percent of MemAvailable (the rest is left
 * to the router, tokenizers, HTTP front end and the system); when it does
 * not, the error gives the numbers and the flags to change, instead of a
 * worker that starts with a cache too small to serve anything.
 *
 * One formula for the three places that size a worker: zinfer-worker at
 * start, `zinfer serve` before it starts its workers (for all of them
 * together, from the file's header, so that a configuration that cannot
 * fit stops at once), and `zinfer info` (what a file needs).
 */
#ifndef ZI_MEM_PLAN_H
#define ZI_MEM_PLAN_H

#include <stdint.h>

#include "backend.h"
#include "gguf.h"
#include "model.h"
#include "zi_error.h"

/* The share of MemAvailable the default budget may take, in percent. */
#define ZI_MEM_SHARE_PCT 90

/* What one model costs, whatever the slots and context. */
typedef struct zi_mem_model {
    uint64_t weight_bytes;       /* the weights as held in memory */
    uint64_t kv_bytes_per_token; /* K and V of every layer, in the backend's layout */
    uint64_t work_bytes;         /* activations and logits (zi_model_config_work_bytes) */
    uint64_t state_bytes_per_slot; /* a hybrid's recurrent states, per sequence (0: none) */
    int state_ckpts_per_slot;      /* checkpoint rows of those states per sequence: kept only
                                    * with the prefix cache (generator.c), so 0 with
                                    * --no-prefix-cache */
} zi_mem_model;

/* A loaded model, with the working buffers of a pass of max_batch_tokens
 * tokens and max_logit_rows rows of logits. state_ckpts_per_slot is the
 * prefix cache's (ZI_STATE_CKPT_PER_SLOT): a caller that runs without it
 * sets it to 0. */
void zi_mem_model_of(const zi_model *m, int max_batch_tokens, int max_logit_rows,
                     zi_mem_model *out);

/* A file's model from its header alone (nothing loaded), with the prefix
 * cache's state checkpoints as zi_mem_model_of: the weights are
 * its tensors' bytes as backend be holds them (the CPU backend's repacked
 * layout of the K-quants and IQ4 types is a little larger than the file), the KV
 * cache's layout is be's. cfg gets the
 * hyper-parameters (zi_model_read_config, with n_vocab from the
 * token_embd tensor). Errors: the file's hyper-parameters cannot be read,
 * or a tensor's size is unknown (ZI_EUNSUPPORTED). */
int zi_mem_model_of_file(const zi_gguf *g, const zi_backend *be, int max_batch_tokens,
                         int max_logit_rows, zi_model_config *cfg, zi_mem_model *out,
                         zi_error *err);

/* A worker's memory at one configuration. */
typedef struct zi_mem_plan {
    int slots, ctx, block_size;  /* ctx: positions per sequence */
    uint64_t kv_tokens;          /* slots x ctx, each sequence in whole blocks */
    uint64_t weight_bytes;       /* the model's, plus the draft model's */
    uint64_t kv_bytes_per_token; /* the model's, plus the draft model's */
    uint64_t kv_bytes;           /* the KV cache (and the draft model's: a block per slot more);
                                  * of a hybrid, with its slots' recurrent states */
    uint64_t work_bytes;         /* working buffers, the model's and the draft model's */
    uint64_t total_bytes;        /* weights + KV cache + working buffers: the default budget */
} zi_mem_plan;

/* The plan for model (and draft, NULL when none) at slots sequences of up
 * to ctx positions in blocks of block_size; a hybrid's KV cache has
 * 1 + model->state_ckpts_per_slot state rows per slot. ZI_EINVAL for a value below 1,
 * ZI_ERANGE when a size overflows. */
int zi_mem_plan_make(const zi_mem_model *model, const zi_mem_model *draft, int slots, int ctx,
                     int block_size, zi_mem_plan *out, zi_error *err);

/* MemAvailable from /proc/meminfo, in bytes; 0 when it cannot be read. */
uint64_t zi_mem_available(void);

/* What the default budget may take of `available` bytes:
 * ZI_MEM_SHARE_PCT percent. */
uint64_t zi_mem_usable(uint64_t available);

/* ZI_OK when `workers` workers of plan p fit in zi_mem_usable(available)
 * (or when available is 0: unknown, nothing to check against), else
 * ZI_ENOMEM with the numbers (weights, KV cache per token, needed,
 * available) and the flags that change them. */
int zi_mem_plan_check(const zi_mem_plan *p, int workers, uint64_t available, zi_error *err);

#endif
