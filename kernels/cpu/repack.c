/*
 * repack.c - see repack.h. Plain C: runs once per weight at load and once
 * per activation row per product, both cheap next to the products.
 */
#include "repack.h"

#include <string.h>

#include "gguf.h"

size_t zi_g16_group_bytes(int type) {
    switch (type) {
    case ZI_TYPE_Q4_0: return ZI_G16 * sizeof(zi_block_q4_0);
    case ZI_TYPE_Q4_1: return ZI_G16 * sizeof(zi_block_q4_1);
    case ZI_TYPE_Q8_0: return ZI_G16 * sizeof(zi_block_q8_0);
    default: return 0;
    }
}

/* Code of element j of a Q4 block's nibbles. */
static inline uint8_t q4_code(const uint8_t *qs, int j) {
    return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4;
}

static void repack_group(int type, const uint8_t *src, uint8_t *dst) {
    const size_t bb = zi_g16_group_bytes(type) / ZI_G16;
    if (type == ZI_TYPE_Q8_0) {
        for (int i = 0; i < ZI_G16; i++) {
            const zi_block_q8_0 *b = (const zi_block_q8_0 *)(const void *)(src + i * bb);
            for (int c = 0; c < 8; c++)
                for (int e = 0; e < 4; e++)
                    dst[64 * c + 4 * i + e] = (uint8_t)b->qs[4 * c + e] ^ 0x80;
            memcpy(dst + 512 + 2 * i, &b->d, 2);
        }
        return;
    }
    int has_m = type == ZI_TYPE_Q4_1;
    for (int i = 0; i < ZI_G16; i++) {
        const uint8_t *b = src + i * bb;
        const uint8_t *qs = b + (has_m ? 4 : 2);
        for (int p = 0; p < 4; p++)
            for (int e = 0; e < 4; e++)
                dst[64 * p + 4 * i + e] =
                    (uint8_t)(q4_code(qs, 8 * p + e) | (q4_code(qs, 8 * p + 4 + e) << 4));
        memcpy(dst + 256 + 2 * i, b, 2);                     /* d */
        if (has_m) memcpy(dst + 288 + 2 * i, b + 2, 2);      /* m */
    }
}

void zi_g16_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                   size_t row_bytes) {
    const size_t gb = zi_g16_group_bytes(type);
    const int64_t groups = nb / ZI_G16;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *s = src + (size_t)r * row_bytes;
        uint8_t *d = dst + (size_t)r * row_bytes;
        for (int64_t g = 0; g < groups; g++) repack_group(type, s + g * gb, d + g * gb);
        memcpy(d + groups * gb, s + groups * gb, row_bytes - (size_t)groups * gb); /* tail */
    }
}

void zi_g16_interleave_act(const zi_q8_act *a, int64_t row, int8_t *dst) {
    const int64_t groups = a->nb / ZI_G16;
    const int8_t *q1 = a->q + row * a->nb * 2 * ZI_QK;
    const int8_t *q2 = q1 + a->nb * ZI_QK;
    for (int64_t g = 0; g < groups; g++) {
        for (int h = 0; h < 2; h++) {
            const int8_t *src = (h ? q2 : q1) + g * ZI_G16 * ZI_QK;
            int8_t *out = dst + (g * 2 + h) * 512;
            for (int i = 0; i < ZI_G16; i++)
                for (int c = 0; c < 8; c++) memcpy(out + 64 * c + 4 * i, src + i * ZI_QK + 4 * c, 4);
        }
    }
}
