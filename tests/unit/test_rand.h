/*
 * test_rand.h - deterministic random numbers and random weight rows for the
 * kernel and sampling tests (test_kernels.c, test_gpu_sampling_ref.c and
 * tests/gpu/test_cuda_backend.c). Each test file keeps its own generator
 * state, with its own seed, so its cases see the same values on every run.
 * A header of static functions: test code only.
 */
#ifndef ZI_TEST_RAND_H
#define ZI_TEST_RAND_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

/* xorshift64; the state must not be 0. */
typedef struct zi_test_rng {
    uint64_t s;
} zi_test_rng;

/* Uniform in [0, 1), 53 bits. */
static inline double zi_test_urand(zi_test_rng *r) {
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) * 0x1p-53;
}

static inline float zi_test_frand(zi_test_rng *r, float lo, float hi) {
    return lo + (hi - lo) * (float)zi_test_urand(r);
}

/* rows x cols random values of GGUF type `type` (Q4_0, Q4_1, Q8_0, F32, F16
 * or BF16), row after row, malloc'd; *row_bytes gets a row's size. Quantized
 * blocks get scales typical of a small model's weights; float types get
 * values in [-fmax, fmax]. cols must be a multiple of 32. */
static inline void *zi_test_make_rows(zi_test_rng *r, int type, int rows, int cols, float fmax,
                                      size_t *row_bytes) {
    size_t rb = (size_t)cols / zi_ggml_type_block_elems(type) * zi_ggml_type_block_bytes(type);
    uint8_t *w = malloc(rb * (size_t)rows);
    *row_bytes = rb;
    if (!w) return NULL;
    for (int i = 0; i < rows; i++) {
        uint8_t *row = w + rb * (size_t)i;
        switch (type) {
        case ZI_TYPE_Q4_0:
            for (int k = 0; k < cols / 32; k++) {
                zi_block_q4_0 *b = (zi_block_q4_0 *)(void *)(row + k * sizeof *b);
                b->d = zi_f32_to_f16(zi_test_frand(r, 0.001f, 0.05f));
                for (int j = 0; j < 16; j++) b->qs[j] = (uint8_t)(zi_test_urand(r) * 256);
            }
            break;
        case ZI_TYPE_Q4_1:
            for (int k = 0; k < cols / 32; k++) {
                zi_block_q4_1 *b = (zi_block_q4_1 *)(void *)(row + k * sizeof *b);
                b->d = zi_f32_to_f16(zi_test_frand(r, 0.001f, 0.05f));
                b->m = zi_f32_to_f16(zi_test_frand(r, -0.3f, 0.0f));
                for (int j = 0; j < 16; j++) b->qs[j] = (uint8_t)(zi_test_urand(r) * 256);
            }
            break;
        case ZI_TYPE_Q8_0:
            for (int k = 0; k < cols / 32; k++) {
                zi_block_q8_0 *b = (zi_block_q8_0 *)(void *)(row + k * sizeof *b);
                b->d = zi_f32_to_f16(zi_test_frand(r, 0.0005f, 0.01f));
                for (int j = 0; j < 32; j++) b->qs[j] = (int8_t)(zi_test_urand(r) * 255 - 127);
            }
            break;
        case ZI_TYPE_F32:
            for (int j = 0; j < cols; j++)
                ((float *)(void *)row)[j] = zi_test_frand(r, -fmax, fmax);
            break;
        case ZI_TYPE_F16:
            for (int j = 0; j < cols; j++) {
                uint16_t h = zi_f32_to_f16(zi_test_frand(r, -fmax, fmax));
                memcpy(row + 2 * j, &h, 2);
            }
            break;
        case ZI_TYPE_BF16:
            for (int j = 0; j < cols; j++) {
                float f = zi_test_frand(r, -fmax, fmax);
                uint32_t bits;
                memcpy(&bits, &f, 4);
                uint16_t h = (uint16_t)(bits >> 16); /* truncated: exact in bfloat16 */
                memcpy(row + 2 * j, &h, 2);
            }
            break;
        }
    }
    return w;
}

/* Byte offsets of each block type's f16 fields (its scale, and its min). */
static inline void zi_test_f16_fields(int type, int off[2], int *n) {
    *n = 1;
    switch (type) {
    case ZI_TYPE_Q5_1:
    case ZI_TYPE_Q4_K:
    case ZI_TYPE_Q5_K:
        off[0] = 0, off[1] = 2, *n = 2;
        break;
    case ZI_TYPE_Q2_K:
        off[0] = 80, off[1] = 82, *n = 2;
        break;
    case ZI_TYPE_Q3_K:
        off[0] = 108;
        break;
    case ZI_TYPE_Q6_K:
        off[0] = 208;
        break;
    default:
        off[0] = 0;
        break;
    }
}

/* rows x cols values of any quantized GGUF type as random bytes, but for
 * the f16 scales (in [0.0005, 0.01]) and mins (in [-0.01, 0.01]), and
 * MXFP4's E8M0 scale bytes (117..124: half-scales 2^-11..2^-4), so that
 * every value is finite and every code, sub-scale and bit plane takes
 * random values; malloc'd (NULL when out of memory). */
static inline uint8_t *zi_test_random_blocks(zi_test_rng *r, int type, int64_t rows, int64_t cols,
                                             size_t *row_bytes) {
    size_t be = zi_ggml_type_block_elems(type), bb = zi_ggml_type_block_bytes(type);
    size_t rb = (size_t)cols / be * bb, nb = (size_t)rows * (size_t)cols / be;
    *row_bytes = rb;
    uint8_t *w = malloc(rb * (size_t)rows);
    if (!w) return NULL;
    for (size_t i = 0; i < rb * (size_t)rows; i++) w[i] = (uint8_t)(zi_test_urand(r) * 256);
    if (type == ZI_TYPE_MXFP4) {
        for (size_t k = 0; k < nb; k++) w[k * bb] = (uint8_t)(117 + zi_test_urand(r) * 8);
        return w;
    }
    int off[2], n;
    zi_test_f16_fields(type, off, &n);
    for (size_t k = 0; k < nb; k++)
        for (int f = 0; f < n; f++) {
            uint16_t h = zi_f32_to_f16(zi_test_frand(r, f ? -0.01f : 0.0005f, 0.01f));
            memcpy(w + k * bb + off[f], &h, 2);
        }
    return w;
}

#endif
