/*
 * repack.h - the "16-row" weight layout of the AVX-512 VNNI kernels.
 *
 * In GGUF order each row's blocks sit together, so a SIMD dot product
 * yields lanes of partial sums that must be reduced per row and scaled per
 * block. Regrouping 16 consecutive rows so that, for each block column k,
 * every 64-byte chunk holds four codes of block k of each of the 16 rows
 * (lane i = row i) lets vpdpbusd, with the activation's four bytes
 * broadcast, accumulate row i's whole block in lane i, all in integers: one
 * conversion and one scaled FMA finish block k for 16 rows, and the lanes
 * at the end are the 16 outputs, with no horizontal sums at all. The bytes
 * per 16 rows do not change. Matrices whose row count is not a multiple of
 * 16 stay in GGUF layout.
 *
 * For rows 16R..16R+15 and block column k, at offset (R * nb + k) * 16 *
 * block_bytes:
 *   Q4_0 / Q4_1: codes[256] with byte 64p + 4i + e holding, low nibble,
 *     element 8p + e of row i's block and, high nibble, element 8p + 4 + e;
 *     then d[16] (f16), then for Q4_1 m[16] (f16).
 *   Q8_0: codes[512] with byte 64c + 4i + e = element 4c + e of row i's
 *     block, XOR 0x80 (unsigned); then d[16] (f16).
 */
#ifndef ZI_REPACK_H
#define ZI_REPACK_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"

#define ZI_R16 16

/* Bytes of one block column of 16 rows of `type` (0 if it does not repack). */
size_t zi_r16_group_bytes(int type);

/* Repacks rows (a multiple of 16) x nb blocks of `type` from GGUF layout
 * (src, row_bytes apart) into dst (same total size). */
void zi_r16_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                   size_t row_bytes);

#endif
