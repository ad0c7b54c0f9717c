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

/* Checks that t can be a matrix (2-D; any type the GGUF reader accepts,
 * gguf.h; rows of whole blocks: 32 values for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
 * and IQ4_NL, 256 for the K-quants and IQ4_XS) and fills w's type,
 * rows, cols and row_bytes, the rest zeroed; data and file_data point at
 * the file's bytes. ZI_EFORMAT / ZI_EUNSUPPORTED naming the tensor. */
int zi_weight_describe(const zi_gguf_tensor *t, zi_weight *w, zi_error *err);

/* A 1-D weight (a norm's; in practice F32) of any type the reader accepts,
 * as a malloc'd float32 array of all its values (zi_dequantize_row); NULL
 * with the error set otherwise. */
float *zi_vector_dequantize(const zi_gguf_tensor *t, zi_error *err);

#endif
