/*
 * repack.h - the "16-block group" weight layout of the AVX-512 VNNI kernels.
 *
 * In GGUF order a block's 32 codes sit together, so a SIMD dot product of
 * one block yields lanes of partial sums that must be converted and scaled
 * per block. Regrouping 16 blocks so that each 64-byte chunk holds 4 codes
 * of every block (lane i = block i) lets vpdpbusd accumulate a whole block
 * in lane i over 8 chunks, all in integers: one conversion and one scale
 * multiply then serve 16 blocks. Rows keep their byte size: per group the
 * codes, then the 16 f16 scales (and, for Q4_1, the 16 f16 offsets); blocks
 * after the last full group stay in GGUF format.
 *
 *   Q4_0 / Q4_1 group: codes[256] with byte 64p + 4i + e holding, low
 *     nibble, element 8p + e of block i and, high nibble, element 8p + 4 + e;
 *     then d[16] (f16), then for Q4_1 m[16] (f16).
 *   Q8_0 group: codes[512] with byte 64c + 4i + e = element 4c + e of block
 *     i, XOR 0x80 (unsigned); then d[16] (f16).
 *
 * Activations are interleaved to match: per token and group, two 512-byte
 * runs (the q1 and q2 halves of quant.h), byte 64c + 4i + e = element
 * 4c + e of block i.
 */
#ifndef ZI_REPACK_H
#define ZI_REPACK_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

#define ZI_G16 16

/* Bytes of a group of 16 blocks of type (0 if not a type that repacks). */
size_t zi_g16_group_bytes(int type);

/* Repacks rows x nb blocks of `type` from GGUF layout (src) into dst (same
 * size, row_bytes apart). */
void zi_g16_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                   size_t row_bytes);

/* Interleaved activations of token row `row` of a: the full groups of both
 * halves, into dst (nb / 16 * 1024 bytes). */
void zi_g16_interleave_act(const zi_q8_act *a, int64_t row, int8_t *dst);

#endif
