/*
 * quant.c - scalar dequantization of GGUF rows (see quant.h). Used for
 * embedding lookups and by tests as the ground truth for the SIMD kernels.
 */
#include "quant.h"

#include "gguf.h"

void zi_dequantize_row(int type, const void *row, float *y, int64_t n) {
    switch (type) {
    case ZI_TYPE_F32: memcpy(y, row, (size_t)n * sizeof(float)); break;
    case ZI_TYPE_F16: {
        const uint8_t *p = row;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            y[i] = zi_f16_to_f32(h);
        }
        break;
    }
    case ZI_TYPE_BF16: {
        const uint8_t *p = row;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            y[i] = zi_bf16_to_f32(h);
        }
        break;
    }
    case ZI_TYPE_Q4_0: {
        const zi_block_q4_0 *b = row;
        for (int64_t k = 0; k < n / ZI_QK; k++) {
            float d = zi_f16_to_f32(b[k].d);
            for (int i = 0; i < ZI_QK / 2; i++) {
                y[k * ZI_QK + i] = ((b[k].qs[i] & 0x0f) - 8) * d;
                y[k * ZI_QK + i + 16] = ((b[k].qs[i] >> 4) - 8) * d;
            }
        }
        break;
    }
    case ZI_TYPE_Q4_1: {
        const zi_block_q4_1 *b = row;
        for (int64_t k = 0; k < n / ZI_QK; k++) {
            float d = zi_f16_to_f32(b[k].d), m = zi_f16_to_f32(b[k].m);
            for (int i = 0; i < ZI_QK / 2; i++) {
                y[k * ZI_QK + i] = (b[k].qs[i] & 0x0f) * d + m;
                y[k * ZI_QK + i + 16] = (b[k].qs[i] >> 4) * d + m;
            }
        }
        break;
    }
    case ZI_TYPE_Q8_0: {
        const zi_block_q8_0 *b = row;
        for (int64_t k = 0; k < n / ZI_QK; k++) {
            float d = zi_f16_to_f32(b[k].d);
            for (int i = 0; i < ZI_QK; i++) y[k * ZI_QK + i] = b[k].qs[i] * d;
        }
        break;
    }
    default: memset(y, 0, (size_t)n * sizeof(float)); break;
    }
}
