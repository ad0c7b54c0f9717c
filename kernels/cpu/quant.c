/*
 * quant.c - scalar dequantization of GGUF rows (see quant.h). Used for
 * embedding lookups and by tests as the ground truth for the SIMD kernels.
 * Also the step from 16-bit to int8 activations (zi_act_drop_residual).
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

void zi_act_drop_residual(const zi_q8_act *a, int64_t row) {
    const int8_t *q1 = a->q + row * a->nb * 2 * ZI_QK;
    memset(a->q + row * a->nb * 2 * ZI_QK + a->nb * ZI_QK, 0, (size_t)a->nb * ZI_QK);
    for (int64_t k = 0; k < a->nb; k++) {
        int32_t sum = 0;
        for (int i = 0; i < ZI_QK; i++) sum += q1[k * ZI_QK + i];
        a->s[row * a->nb + k] = a->d[row * a->nb + k] * (float)(256 * sum);
    }
}
