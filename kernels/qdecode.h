/*
 * qdecode.h - sixteen weights of a quantized GGUF row at a time, for
 * kernels that decode in registers: the CUDA backend's products and
 * embedding lookups for the types beyond Q4_0, Q4_1 and Q8_0 (Q5_0, Q5_1,
 * Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4).
 *
 * Header only, compiled twice: as CUDA device code (under __CUDACC__) and
 * as C, where tests/unit/test_qdecode.c checks every function against
 * kernels/cpu/dequant.c's zi_dequantize_row bit for bit. The float
 * operations are dequant.c's, in its order; a product followed by a sum is
 * written with ZI_QD_MUL so that nvcc does not fuse it into one rounding
 * (dequant.c is compiled with -ffp-contract=off for the same reason). So
 * the GPU's weights are the CPU backend's exactly.
 *
 * A row of any of these types is seen as 32-value sub-blocks ib = 0 ..
 * cols / 32 - 1 (a 256-value K-quant block holds eight). Each decoder
 *
 *     zi_qd_<type>(row, ib, h, wa, wb, &oa, &ob)
 *
 * gives half h (0 or 1) of sub-block ib: sixteen weights as two runs of
 * eight, wa[i] the value at oa + i of the sub-block and wb[i] at ob + i
 * (the runs are where the type keeps the bytes of one half together, so
 * two lanes of a warp read one sub-block's bytes without overlap). The
 * layouts are dequant.c's (its top comment), restated per function only
 * where the sub-block view needs it.
 */
#ifndef ZI_QDECODE_H
#define ZI_QDECODE_H

#include <stdint.h>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define ZI_QD_FN static __device__ __forceinline__
#define ZI_QD_TABLE static __device__ const
#define ZI_QD_MUL(a, b) __fmul_rn((a), (b))
/* The IEEE half at p (2-byte aligned in every type here). */
ZI_QD_FN float zi_qd_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(p)));
}
ZI_QD_FN float zi_qd_e8m0_half(uint8_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}
#else
#include <string.h>

#include "quant.h"
#define ZI_QD_FN static inline
#define ZI_QD_TABLE static const
#define ZI_QD_MUL(a, b) ((a) * (b))
static inline float zi_qd_f16(const uint8_t *p) {
    return zi_f16_at(p);
}
static inline float zi_qd_e8m0_half(uint8_t e) {
    return zi_e8m0_half_to_f32(e);
}
#endif

/* IQ4_NL's and IQ4_XS's code book, and MXFP4's doubled e2m1 values
 * (dequant.c says why doubled). */
ZI_QD_TABLE int8_t zi_qd_kvalues_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};
ZI_QD_TABLE int8_t zi_qd_kvalues_mxfp4[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                              0, -1, -2, -3, -4, -6, -8, -12};

/* n bytes (4, 8 or 16) at p into q. The GPU's loads must be aligned and a
 * byte at a time costs four times the instructions of 32-bit loads, so
 * these are 32-bit where p allows, else 16-bit (every field here is at an
 * even offset of a block of even size but MXFP4's), else bytes; q, indexed
 * by constants once the loops are unrolled, stays in registers. */
ZI_QD_FN void zi_qd_load(const uint8_t *p, uint8_t *q, int n) {
#ifdef __CUDACC__
    if (!(reinterpret_cast<uintptr_t>(p) & 3)) {
#pragma unroll
        for (int i = 0; i < n / 4; i++) {
            const uint32_t v = reinterpret_cast<const uint32_t *>(p)[i];
            q[4 * i] = v & 255u;
            q[4 * i + 1] = (v >> 8) & 255u;
            q[4 * i + 2] = (v >> 16) & 255u;
            q[4 * i + 3] = v >> 24;
        }
    } else if (!(reinterpret_cast<uintptr_t>(p) & 1)) {
#pragma unroll
        for (int i = 0; i < n / 2; i++) {
            const uint32_t v = reinterpret_cast<const uint16_t *>(p)[i];
            q[2 * i] = v & 255u;
            q[2 * i + 1] = v >> 8;
        }
    } else {
#pragma unroll
        for (int i = 0; i < n; i++) q[i] = p[i];
    }
#else
    memcpy(q, p, (size_t)n);
#endif
}

ZI_QD_FN uint32_t zi_qd_u32(const uint8_t *p) {
    uint8_t q[4];
    zi_qd_load(p, q, 4);
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

/*
 * The 32-value types keep value i in the low nibble of byte i and value
 * i + 16 in the high one, so half h is bytes 8h .. 8h + 7: values 8h ..
 * (low nibbles, wa) and 16 + 8h .. (high nibbles, wb).
 */
ZI_QD_FN void zi_qd_halves32(int h, int *oa, int *ob) {
    *oa = 8 * h;
    *ob = 16 + 8 * h;
}

/* Q5_0, 22 bytes: x = d * (q - 16), q's fifth bit bit i of the u32 qh. */
ZI_QD_FN void zi_qd_q5_0(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + ib * 22;
    const float d = zi_qd_f16(b);
    const uint32_t qh = zi_qd_u32(b + 2);
    uint8_t qs[8];
    zi_qd_load(b + 6 + 8 * h, qs, 8);
    zi_qd_halves32(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        const int qa = (qs[i] & 15) | (int)((qh >> (*oa + i)) & 1) << 4;
        const int qb = (qs[i] >> 4) | (int)((qh >> (*ob + i)) & 1) << 4;
        wa[i] = d * (float)(qa - 16);
        wb[i] = d * (float)(qb - 16);
    }
}

/* Q5_1, 24 bytes: x = d * q + m. */
ZI_QD_FN void zi_qd_q5_1(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + ib * 24;
    const float d = zi_qd_f16(b), m = zi_qd_f16(b + 2);
    const uint32_t qh = zi_qd_u32(b + 4);
    uint8_t qs[8];
    zi_qd_load(b + 8 + 8 * h, qs, 8);
    zi_qd_halves32(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        const int qa = (qs[i] & 15) | (int)((qh >> (*oa + i)) & 1) << 4;
        const int qb = (qs[i] >> 4) | (int)((qh >> (*ob + i)) & 1) << 4;
        wa[i] = ZI_QD_MUL(d, (float)qa) + m;
        wb[i] = ZI_QD_MUL(d, (float)qb) + m;
    }
}

/* IQ4_NL, 18 bytes: x = d * kvalues[nibble]. */
ZI_QD_FN void zi_qd_iq4_nl(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                           int *ob) {
    const uint8_t *b = row + ib * 18;
    const float d = zi_qd_f16(b);
    uint8_t qs[8];
    zi_qd_load(b + 2 + 8 * h, qs, 8);
    zi_qd_halves32(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        wa[i] = d * (float)zi_qd_kvalues_iq4[qs[i] & 15];
        wb[i] = d * (float)zi_qd_kvalues_iq4[qs[i] >> 4];
    }
}

/* MXFP4, 17 bytes: x = 2^(e - 128) * kvalues_mxfp4[nibble] (exact). */
ZI_QD_FN void zi_qd_mxfp4(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                          int *ob) {
    const uint8_t *b = row + ib * 17;
    const float d = zi_qd_e8m0_half(b[0]);
    uint8_t qs[8];
    zi_qd_load(b + 1 + 8 * h, qs, 8);
    zi_qd_halves32(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        wa[i] = d * (float)zi_qd_kvalues_mxfp4[qs[i] & 15];
        wb[i] = d * (float)zi_qd_kvalues_mxfp4[qs[i] >> 4];
    }
}

/*
 * The K-quants and IQ4_XS: sub-block ib is sub-block m = ib % 8 of the
 * 256-value block ib / 8, and half h is its values 16h .. 16h + 15 (wa the
 * first eight, wb the next), except IQ4_XS whose sub-blocks are laid out
 * as IQ4_NL's.
 */
ZI_QD_FN void zi_qd_halves256(int h, int *oa, int *ob) {
    *oa = 16 * h;
    *ob = 16 * h + 8;
}

/* Q2_K, 84 bytes: value l of sub-block m is bits 2(m % 4) of
 * qs[32 (m / 4) + l]; scale and min of its 16 (index 2m + h) in
 * scales[2m + h]; x = (d * sc) * q - dmin * mn. */
ZI_QD_FN void zi_qd_q2_k(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + (ib / 8) * 84;
    const int m = (int)(ib % 8), s = 2 * m + h, shift = 2 * (m % 4);
    const float d = zi_qd_f16(b + 80), dmin = zi_qd_f16(b + 82);
    const float dl = d * (float)(b[s] & 15), ml = dmin * (float)(b[s] >> 4);
    uint8_t qs[16];
    zi_qd_load(b + 16 + 32 * (m / 4) + 16 * h, qs, 16);
    zi_qd_halves256(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        wa[i] = ZI_QD_MUL(dl, (float)((qs[i] >> shift) & 3)) - ml;
        wb[i] = ZI_QD_MUL(dl, (float)((qs[8 + i] >> shift) & 3)) - ml;
    }
}

/* Q3_K, 110 bytes: the low two bits as Q2_K's, minus 4 unless bit m of
 * hmask[l] is set; the 6-bit scale s = 2m + h biased by 32 (dequant.c's
 * block_q3_k says where its bits are); x = (d * (sc - 32)) * q. */
ZI_QD_FN void zi_qd_q3_k(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + (ib / 8) * 110, *sc = b + 96;
    const int m = (int)(ib % 8), s = 2 * m + h, shift = 2 * (m % 4);
    const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    const float dl = zi_qd_f16(b + 108) * (float)((lo | hi << 4) - 32);
    uint8_t hmask[16], qs[16];
    zi_qd_load(b + 16 * h, hmask, 16);
    zi_qd_load(b + 32 + 32 * (m / 4) + 16 * h, qs, 16);
    zi_qd_halves256(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        const int qa = ((qs[i] >> shift) & 3) - ((((hmask[i] >> m) & 1) ^ 1) << 2);
        const int qb = ((qs[8 + i] >> shift) & 3) - ((((hmask[8 + i] >> m) & 1) ^ 1) << 2);
        wa[i] = dl * (float)qa;
        wb[i] = dl * (float)qb;
    }
}

/* The 6-bit scale and min of sub-block m of Q4_K and Q5_K (dequant.c's
 * scale_min_k4 for one m). */
ZI_QD_FN void zi_qd_scale_min_k4(const uint8_t *p, int m, int *sc, int *mn) {
    if (m < 4) {
        *sc = p[m] & 63;
        *mn = p[m + 4] & 63;
    } else {
        *sc = (p[m + 4] & 15) | (p[m - 4] >> 6) << 4;
        *mn = (p[m + 4] >> 4) | (p[m] >> 6) << 4;
    }
}

/* Q4_K (qh NULL) and Q5_K: value l of sub-block m is nibble m % 2 of
 * qs[32 (m / 2) + l], Q5_K's fifth bit bit m of qh[l];
 * x = (d * sc) * q - dmin * mn. */
ZI_QD_FN void zi_qd_q45_k(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, int m, int h,
                          float *wa, float *wb, int *oa, int *ob) {
    int sc, mn;
    zi_qd_scale_min_k4(b + 4, m, &sc, &mn);
    const float dl = zi_qd_f16(b) * (float)sc, ml = zi_qd_f16(b + 2) * (float)mn;
    const int shift = 4 * (m % 2);
    uint8_t q[16], hb[16];
    zi_qd_load(qs + 32 * (m / 2) + 16 * h, q, 16);
    if (qh) zi_qd_load(qh + 16 * h, hb, 16);
    zi_qd_halves256(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        int qa = (q[i] >> shift) & 15, qb = (q[8 + i] >> shift) & 15;
        if (qh) {
            qa |= ((hb[i] >> m) & 1) << 4;
            qb |= ((hb[8 + i] >> m) & 1) << 4;
        }
        wa[i] = ZI_QD_MUL(dl, (float)qa) - ml;
        wb[i] = ZI_QD_MUL(dl, (float)qb) - ml;
    }
}

/* Q4_K, 144 bytes. */
ZI_QD_FN void zi_qd_q4_k(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + (ib / 8) * 144;
    zi_qd_q45_k(b, b + 16, (const uint8_t *)0, (int)(ib % 8), h, wa, wb, oa, ob);
}

/* Q5_K, 176 bytes. */
ZI_QD_FN void zi_qd_q5_k(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + (ib / 8) * 176;
    zi_qd_q45_k(b, b + 48, b + 16, (int)(ib % 8), h, wa, wb, oa, ob);
}

/* Q6_K, 210 bytes: value l of sub-block m (j = 32m + l of the block) has
 * as low four bits nibble (m % 4) / 2 of ql[64 (m / 4) + 32 (m % 2) + l]
 * and as high two bits bits 2 (m % 4) of qh[32 (m / 4) + l]; the int8
 * scale s = 2m + h; x = (d * sc) * (q - 32). */
ZI_QD_FN void zi_qd_q6_k(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                         int *ob) {
    const uint8_t *b = row + (ib / 8) * 210;
    const int m = (int)(ib % 8), k = m % 4;
    const float dl = zi_qd_f16(b + 208) * (float)(int8_t)b[192 + 2 * m + h];
    uint8_t ql[16], qh[16];
    zi_qd_load(b + 64 * (m / 4) + 32 * (k % 2) + 16 * h, ql, 16);
    zi_qd_load(b + 128 + 32 * (m / 4) + 16 * h, qh, 16);
    const int lshift = 4 * (k / 2), hshift = 2 * k;
    zi_qd_halves256(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        const int qa = ((ql[i] >> lshift) & 15) | ((qh[i] >> hshift) & 3) << 4;
        const int qb = ((ql[8 + i] >> lshift) & 15) | ((qh[8 + i] >> hshift) & 3) << 4;
        wa[i] = dl * (float)(qa - 32);
        wb[i] = dl * (float)(qb - 32);
    }
}

/* IQ4_XS, 136 bytes: sub-block m's scale biased by 32, low four bits
 * nibble m % 2 of scales_l[m / 2], high two bits 2m of the u16 scales_h;
 * its values IQ4_NL's nibbles of qs[16m .. 16m + 16). */
ZI_QD_FN void zi_qd_iq4_xs(const uint8_t *row, int64_t ib, int h, float *wa, float *wb, int *oa,
                           int *ob) {
    const uint8_t *b = row + (ib / 8) * 136;
    const int m = (int)(ib % 8);
    const int sh = b[2] | b[3] << 8;
    const int lo = (b[4 + m / 2] >> (4 * (m % 2))) & 15, hi = (sh >> (2 * m)) & 3;
    const float dl = zi_qd_f16(b) * (float)((lo | hi << 4) - 32);
    uint8_t qs[8];
    zi_qd_load(b + 8 + 16 * m + 8 * h, qs, 8);
    zi_qd_halves32(h, oa, ob);
    for (int i = 0; i < 8; i++) {
        wa[i] = dl * (float)zi_qd_kvalues_iq4[qs[i] & 15];
        wb[i] = dl * (float)zi_qd_kvalues_iq4[qs[i] >> 4];
    }
}

#endif
