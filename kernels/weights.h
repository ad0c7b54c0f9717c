/*
 * weights.h - what every backend does first with a GGUF tensor.
 *
 * A backend prepares weights its own way (kernels/backend.h: weight_init,
 * vector_init), but the checks on the file's tensor and the description of
 * the matrix are the same for all: they live here, so a model file is
 * refused with the same message whichever backend loads it.
 */
#ifndef ZI_WEIGHTS_H
#define ZI_WEIGHTS_H

#include "backend.h"
#include "gguf.h"
#include "zi_error.h"

/* Checks that t can be a matrix (2-D; F32, F16, BF16, Q4_0, Q4_1 or Q8_0;
 * rows of whole 32-value blocks for the block types) and fills w's type,
 * rows, cols and row_bytes, the rest zeroed; data and file_data point at
 * the file's bytes. ZI_EFORMAT / ZI_EUNSUPPORTED naming the tensor. */
int zi_weight_describe(const zi_gguf_tensor *t, zi_weight *w, zi_error *err);

/* A 1-D float weight (a norm's), F32, F16 or BF16, as a malloc'd float32
 * array of all its values; NULL with the error set otherwise. */
float *zi_vector_dequantize(const zi_gguf_tensor *t, zi_error *err);

#endif
