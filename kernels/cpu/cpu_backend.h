/*
 * cpu_backend.h - the CPU implementation of the backend interface.
 *
 * Weights stay in the file mapping (no copy): the kernels read GGUF blocks
 * in place. Work is split across a thread pool: matrix products by output
 * rows, attention by (token, head), element-wise ops by tokens once a batch
 * is large enough to pay for the fork-join.
 */
#ifndef ZI_CPU_BACKEND_H
#define ZI_CPU_BACKEND_H

#include <stdint.h>

#include "backend.h"

typedef struct zi_cpu_options {
    int n_threads; /* <= 0: one per online CPU */
    const char *isa; /* NULL: best available; else "scalar", "avx2", "avx512" */
    /* Activation precision of the quantized products: 0 or 16 (the
     * default: an int8 code and its rounding residual, float32-level
     * logits), or 8 (the code alone, as llama.cpp: half the multiplies in
     * batched products, logits ~1e4 times further from float64 in KL). */
    int act_bits;
} zi_cpu_options;

int zi_cpu_backend_create(const zi_cpu_options *opt, zi_backend **out, zi_error *err);

/* The kernel table in use ("avx512", ...), the thread count, and the
 * activation bits (8 or 16). */
const char *zi_cpu_backend_isa(const zi_backend *be);
int zi_cpu_backend_threads(const zi_backend *be);
int zi_cpu_backend_act_bits(const zi_backend *be);

/* Bytes a CPU backend `be` holds for a rows x cols matrix of GGUF `type`
 * (file_bytes in the file) once weight_init has it: its repacked layout's
 * size where it repacks that matrix, else the file's. The same decision
 * as weight_init's, for sizing a model from its file's header. */
uint64_t zi_cpu_backend_held_bytes(const zi_backend *be, int type, int64_t rows, int64_t cols,
                                   uint64_t file_bytes);

#endif
