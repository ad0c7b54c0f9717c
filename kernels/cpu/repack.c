/*
 * repack.c - see repack.h. Plain C: runs once per weight at load.
 */
#include "repack.h"

#include <string.h>

#include "gguf.h"

size_t zi_r16_group_bytes(int type) {
    switch (type) {
    case ZI_TYPE_Q4_0: return ZI_R16 * sizeof(zi_block_q4_0);
    case ZI_TYPE_Q4_1: return ZI_R16 * sizeof(zi_block_q4_1);
    case ZI_TYPE_Q8_0: return ZI_R16 * sizeof(zi_block_q8_0);
    default: return 0;
    }
}

/* Code of element j of a Q4 block's nibbles. */
static inline uint8_t q4_code(const uint8_t *qs, int j) {
    return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
}

/* One block column of 16 rows: blocks[i] is row i's block. */
static void repack_group(int type, const uint8_t *const blocks[ZI_R16], uint8_t *dst) {
    if (type == ZI_TYPE_Q8_0) {
        for (int i = 0; i < ZI_R16; i++) {
            const zi_block_q8_0 *b = (const zi_block_q8_0 *)(const void *)blocks[i];
            for (int c = 0; c < 8; c++)
                for (int e = 0; e < 4; e++)
                    dst[64 * c + 4 * i + e] = (uint8_t)b->qs[4 * c + e] ^ 0x80;
            memcpy(dst + 512 + 2 * i, &b->d, 2);
        }
        return;
    }
    int has_m = type == ZI_TYPE_Q4_1;
    for (int i = 0; i < ZI_R16; i++) {
        const uint8_t *b = blocks[i];
        const uint8_t *qs = b + (has_m ? 4 : 2);
        for (int p = 0; p < 4; p++)
            for (int e = 0; e < 4; e++)
                dst[64 * p + 4 * i + e] =
                    (uint8_t)(q4_code(qs, 8 * p + e) | (q4_code(qs, 8 * p + 4 + e) << 4));
        memcpy(dst + 256 + 2 * i, b, 2);                /* d */
        if (has_m) memcpy(dst + 288 + 2 * i, b + 2, 2); /* m */
    }
}

void zi_r16_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                   size_t row_bytes) {
    const size_t gb = zi_r16_group_bytes(type), bb = gb / ZI_R16;
    for (int64_t R = 0; R < rows / ZI_R16; R++) {
        for (int64_t k = 0; k < nb; k++) {
            const uint8_t *blocks[ZI_R16];
            for (int i = 0; i < ZI_R16; i++)
                blocks[i] = src + (size_t)(R * ZI_R16 + i) * row_bytes + (size_t)k * bb;
            repack_group(type, blocks, dst + (size_t)(R * nb + k) * gb);
        }
    }
}
