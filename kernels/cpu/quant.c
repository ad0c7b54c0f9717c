/*
 * quant.c - see quant.h: the step from 16-bit to int8 activations
 * (zi_act_drop_residual) and the per-half sums (zi_act_half_sums). Row
 * dequantization is dequant.c's.
 */
#include "quant.h"

void zi_act_drop_residual(const zi_q8_act *a, int64_t row) {
    const int8_t *q1 = a->q + row * a->nb * 2 * ZI_QK;
    memset(a->q + row * a->nb * 2 * ZI_QK + a->nb * ZI_QK, 0, (size_t)a->nb * ZI_QK);
    for (int64_t k = 0; k < a->nb; k++) {
        int32_t sum = 0;
        for (int i = 0; i < ZI_QK; i++) sum += q1[k * ZI_QK + i];
        a->s[row * a->nb + k] = a->d[row * a->nb + k] * (float)(256 * sum);
    }
}

void zi_act_half_sums(const zi_q8_act *a, int64_t row) {
    const int8_t *q1 = a->q + row * a->nb * 2 * ZI_QK, *q2 = q1 + a->nb * ZI_QK;
    for (int64_t k = 0; k < a->nb; k++)
        for (int h = 0; h < 2; h++) {
            int32_t sum = 0; /* exact: |sum| <= 16 * (256 * 128 + 128) */
            for (int i = 16 * h; i < 16 * h + 16; i++)
                sum += 256 * q1[k * ZI_QK + i] + q2[k * ZI_QK + i];
            a->s16[(row * a->nb + k) * 2 + h] = a->d[row * a->nb + k] * (float)sum;
        }
}
