/*
 * kv_fixed.h - a paged KV cache with fixed block tables, for code that
 * feeds zi_model_forward directly, with no scheduler: `zinfer logits` and
 * `zinfer bench`, the generator's unit test and the GPU tests.
 *
 * The model knows one kind of cache, the paged one, and always reads block
 * tables (model.h). The worker's generator fills them from the block
 * allocator (kv_blocks.h) as sequences come and go; a caller with a fixed
 * set of sequences needs none of that: sequence s owns the run of blocks
 * [s * stride, (s + 1) * stride), enough for ctx positions, for the
 * cache's whole life.
 */
#ifndef ZI_KV_FIXED_H
#define ZI_KV_FIXED_H

#include <stdint.h>

#include "model.h"
#include "zi_error.h"

/* Positions per block of a fixed cache. */
#define ZI_KV_FIXED_BLOCK 16

typedef struct zi_kv_fixed {
    zi_kv_cache *kv;
    int32_t *tables; /* [n_seqs][stride] block ids: row s is s*stride, s*stride+1, ... */
    int32_t n_seqs, stride;
} zi_kv_fixed;

/* A cache of n_seqs sequences of up to ctx positions each (ceil(ctx /
 * ZI_KV_FIXED_BLOCK) blocks apiece) on model m. A batch's seq[i] is then a
 * sequence number, 0..n_seqs-1. ZI_EINVAL for fewer than 1 sequence or
 * position, ZI_ERANGE past 2^30 blocks, else the paged cache's errors. */
int zi_kv_fixed_create(zi_model *m, int32_t n_seqs, int32_t ctx, zi_kv_fixed *out, zi_error *err);
/* Frees the cache (before the model) and the tables; a zeroed one is a no-op. */
void zi_kv_fixed_free(zi_kv_fixed *f);
/* Points b's block tables at f's. */
void zi_kv_fixed_use(const zi_kv_fixed *f, zi_batch *b);

#endif
