/*
 * quant.h - the quantized block formats of GGUF tensors, and zinfer's own
 * block format for quantized activations.
 *
 * A quantized weight row is a run of blocks of 32 values. Layouts (the facts
 * of the GGUF format):
 *   Q4_0: f16 d; u8 qs[16]            value[i] = (nibble_i - 8) * d
 *   Q4_1: f16 d; f16 m; u8 qs[16]     value[i] = nibble_i * d + m
 *   Q8_0: f16 d; i8 qs[32]            value[i] = qs[i] * d
 * where nibble_i for i < 16 is the low nibble of qs[i] and for i >= 16 the
 * high nibble of qs[i - 16].
 *
 * Matrix products quantize the activation vector to zi_q8_act blocks (int8 with
 * one float scale per 32 values, plus the integer sum, which the Q4_1 offset
 * and the Q4_0/Q8_0 sign tricks need), so the inner loops are integer dot
 * products. This is also what llama.cpp does, so the rounding error is of
 * the same kind and size.
 */
#ifndef ZI_QUANT_H
#define ZI_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dequant.h" /* zi_dequantize_row, for the users of the kernels */

#define ZI_QK 32

typedef struct {
    uint16_t d;
    uint8_t qs[ZI_QK / 2];
} zi_block_q4_0;

typedef struct {
    uint16_t d;
    uint16_t m;
    uint8_t qs[ZI_QK / 2];
} zi_block_q4_1;

typedef struct {
    uint16_t d;
    int8_t qs[ZI_QK];
} zi_block_q8_0;

/*
 * Quantized activations, in two int8 halves: each value is
 *   x[32k + i] ~= (256 * q1[32k + i] + q2[32k + i]) * d[k]
 * where q1 is the usual int8 quantization (block max -> 127) and q2 the
 * rounding residual in 256ths. Products then cost two int8 dot products per
 * block instead of one, but activations keep ~15 bits instead of ~7: int8
 * activations alone (llama.cpp's way) move this model's logits by a mean KL
 * of ~3e-3 from a float64 reference and flip near-tied argmaxes, while the
 * residual brings it to float32 accuracy.
 * Layout: row t holds q1 for all nb blocks (nb*32 bytes) then q2 (nb*32
 * bytes), at q + t*nb*64; d + t*nb; s + t*nb, where s[k] = d[k] * sum of the
 * block's (256*q1 + q2): the Q4_1 offset and the Q4_0/Q8_0 zero-point
 * corrections need it. q1 and q2 are contiguous across blocks, so one SIMD
 * load spans two blocks.
 *
 * With no_residual set (the CPU backend's act_bits 8), every q2 is 0 and s
 * sums 256*q1 alone: llama.cpp's int8 activations. Every kernel is right
 * either way; the flag only lets a kernel skip the q2 products.
 */
typedef struct zi_q8_act {
    int8_t *q;
    float *d;
    float *s;
    int64_t nb;
    int no_residual;
    /* Optional (NULL: the kernels sum for themselves): s16[row * nb * 2 +
     * 2k + h] = d[k] * the integer sum of half h (values 16h..16h+15) of
     * block k's 256*q1 + q2, which the types with 16-value scales (Q2_K,
     * Q3_K, Q6_K) need per token and block (zi_act_half_sums). */
    float *s16;
} zi_q8_act;

_Static_assert(sizeof(zi_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(zi_block_q4_1) == 20, "Q4_1 block is 20 bytes");
_Static_assert(sizeof(zi_block_q8_0) == 34, "Q8_0 block is 34 bytes");

/* The largest |x[i]|, i < n; *finite is 0 if some x[i] is inf or NaN
 * (NaN does not win a comparison, so it would otherwise go unseen). */
static inline float zi_amax_finite(const float *x, size_t n, int *finite) {
    float amax = 0.0f;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        float v = x[i] < 0 ? -x[i] : x[i];
        ok &= v <= 0x1.fffffep127f; /* false for inf and NaN */
        amax = v > amax ? v : amax;
    }
    *finite = ok;
    return amax;
}

/* IEEE half -> float, exact for every input including subnormals, inf, NaN. */
static inline float zi_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float -> IEEE half, round to nearest even. */
static inline uint16_t zi_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exp: correct */
    return (uint16_t)h;
}

/* The IEEE half at p (any alignment, little-endian as GGUF stores it), as
 * a float. */
static inline float zi_f16_at(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return zi_f16_to_f32(h);
}

static inline float zi_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* An E8M0 byte e (MXFP4's block scale, 2^(e - 127)) halved: 2^(e - 128),
 * the scale of MXFP4's code book, which holds the e2m1 values doubled to
 * make them integers. Exact for every byte, as ggml's
 * ggml_e8m0_to_fp32_half builds it: 0 and 1 give the subnormals 2^-128 and
 * 2^-127, 255 gives 2^127 (E8M0's NaN pattern is not special there, nor
 * here). */
static inline float zi_e8m0_half_to_f32(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Row `row` of a, as quantize_act left it, to int8 activations: q2 := 0
 * and s recomputed from q1 (exactly, as an integer sum). */
void zi_act_drop_residual(const zi_q8_act *a, int64_t row);

/* Fills row `row` of a->s16 (non-NULL) from q1, q2 and d as they are now:
 * after quantize_act, and after zi_act_drop_residual where that is used. */
void zi_act_half_sums(const zi_q8_act *a, int64_t row);

#endif
