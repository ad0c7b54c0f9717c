/*
 * dequant.c - see dequant.h.
 *
 * One function per block type, each writing one block's values. The float
 * operations are written one per statement, in gguf-py's order, and the
 * file is compiled with -ffp-contract=off (kernels/meson.build): a fused
 * multiply-add of d * q - m rounds once instead of twice and would not be
 * bit-exact with the reference.
 *
 * Layouts, byte offsets within a block (all little-endian; "f16" an IEEE
 * half; "nibble i" of a run of 16 bytes qs is the low nibble of qs[i] for
 * i < 16 and the high nibble of qs[i - 16] otherwise):
 *   Q5_0   22 B / 32:  f16 d @0, u32 qh @2, qs[16] @6;
 *                      q_i = nibble i | bit i of qh << 4;   x = d * (q - 16)
 *   Q5_1   24 B / 32:  f16 d @0, f16 m @2, u32 qh @4, qs[16] @8;  x = d * q + m
 *   IQ4_NL 18 B / 32:  f16 d @0, qs[16] @2;  x = d * kvalues[nibble i]
 *   Q2_K   84 B / 256: scales[16] @0, qs[64] @16, f16 d @80, f16 dmin @82
 *   Q3_K  110 B / 256: hmask[32] @0, qs[64] @32, scales[12] @96, f16 d @108
 *   Q4_K  144 B / 256: f16 d @0, f16 dmin @2, scales[12] @4, qs[128] @16
 *   Q5_K  176 B / 256: f16 d @0, f16 dmin @2, scales[12] @4, qh[32] @16,
 *                      qs[128] @48
 *   Q6_K  210 B / 256: ql[128] @0, qh[64] @128, i8 scales[16] @192, f16 d @208
 *   IQ4_XS 136 B / 256: f16 d @0, u16 scales_h @2, scales_l[4] @4, qs[128] @8
 *   MXFP4  17 B / 32:  u8 e (E8M0) @0, qs[16] @1;
 *                      x = kvalues_mxfp4[nibble i] * 2^(e - 128)
 * The K-quant functions below say how each value's bits are found.
 */
#include "dequant.h"

#include <assert.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"
#include "zi_error.h"

/* The 4-bit quant of value i (< 32) of a block whose 16 bytes are qs. */
static inline int nibble(const uint8_t *qs, int i) {
    return i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4;
}

/* IQ4_NL's and IQ4_XS's non-linear 4-bit code book. */
static const int8_t kvalues_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                       1,    13,   25,  38,  53,  69,  89,  113};

/* MXFP4's code book: the 16 e2m1 (FP4) values 0, 0.5, 1, 1.5, 2, 3, 4, 6
 * and their negatives, doubled so that they are integers (ggml's
 * kvalues_mxfp4; code 8 is e2m1's -0, here 0). The block's E8M0 scale is
 * halved to match (zi_e8m0_half_to_f32). */
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static void block_q4_0(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(nibble(b + 2, i) - 8);
}

static void block_q4_1(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b), m = zi_f16_at(b + 2);
    for (int i = 0; i < 32; i++) {
        const float dq = d * (float)nibble(b + 4, i);
        y[i] = dq + m;
    }
}

static void block_q5_0(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    for (int i = 0; i < 32; i++) {
        const int q = nibble(b + 6, i) | (int)((qh >> i) & 1) << 4;
        y[i] = d * (float)(q - 16);
    }
}

static void block_q5_1(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b), m = zi_f16_at(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    for (int i = 0; i < 32; i++) {
        const int q = nibble(b + 8, i) | (int)((qh >> i) & 1) << 4;
        const float dq = d * (float)q;
        y[i] = dq + m;
    }
}

static void block_q8_0(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b);
    for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
}

static void block_iq4_nl(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)kvalues_iq4[nibble(b + 2, i)];
}

/* MXFP4: every product is exact (a small integer times a power of two)
 * unless it overflows (e >= 253 with a large code: inf, as in gguf-py) or
 * lands below 2^-149 (never: the smallest is 2^-128). */
static void block_mxfp4(const uint8_t *b, float *y) {
    const float d = zi_e8m0_half_to_f32(b[0]);
    for (int i = 0; i < 32; i++) y[i] = d * (float)kvalues_mxfp4[nibble(b + 1, i)];
}

/* Q2_K: 16 sub-blocks of 16 values. scales[s] holds sub-block s's scale
 * (low nibble) and min (high nibble). Value j = 128 h + 32 k + l (h < 2,
 * k < 4, l < 32) is bits 2k..2k+1 of qs[32 h + l]; x = (d * sc) * q -
 * (dmin * mn). */
static void block_q2_k(const uint8_t *b, float *y) {
    const uint8_t *scales = b, *qs = b + 16;
    const float d = zi_f16_at(b + 80), dmin = zi_f16_at(b + 82);
    for (int j = 0; j < ZI_QK_K; j++) {
        const int h = j / 128, k = (j % 128) / 32, l = j % 32, s = j / 16;
        const float dl = d * (float)(scales[s] & 0x0f);
        const float ml = dmin * (float)(scales[s] >> 4);
        const float dq = dl * (float)((qs[32 * h + l] >> (2 * k)) & 3);
        y[j] = dq - ml;
    }
}

/* Q3_K: 16 sub-blocks of 16 values with 6-bit scales, stored biased by 32:
 * the low 4 bits of scale s are the low (s < 8) or high (s >= 8) nibble of
 * scales[s % 8], its high 2 bits are bits 2(s/4)..2(s/4)+1 of
 * scales[8 + s % 4]. Value j = 128 h + 32 k + l takes its low 2 bits from
 * bits 2k.. of qs[32 h + l] and subtracts 4 unless bit j/32 of hmask[j % 32]
 * is set: q in -4..3; x = (d * (scale - 32)) * q. */
static void block_q3_k(const uint8_t *b, float *y) {
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    const float d = zi_f16_at(b + 108);
    float dl[16];
    for (int s = 0; s < 16; s++) {
        const int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
        const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        dl[s] = d * (float)((lo | hi << 4) - 32);
    }
    for (int j = 0; j < ZI_QK_K; j++) {
        const int h = j / 128, k = (j % 128) / 32, l = j % 32;
        const int ql = (qs[32 * h + l] >> (2 * k)) & 3;
        const int high = (hmask[l] >> (j / 32)) & 1;
        y[j] = dl[j / 16] * (float)(ql - ((high ^ 1) << 2));
    }
}

/* The 6-bit scales and mins of Q4_K and Q5_K's 8 sub-blocks, from the 12
 * bytes p: for s < 4, sc = p[s] & 63 and mn = p[s + 4] & 63; for s >= 4,
 * sc = (p[s + 4] & 15) | (p[s - 4] >> 6) << 4 and
 * mn = (p[s + 4] >> 4) | (p[s] >> 6) << 4. */
static void scale_min_k4(const uint8_t *p, int sc[8], int mn[8]) {
    for (int s = 0; s < 4; s++) {
        sc[s] = p[s] & 63;
        mn[s] = p[s + 4] & 63;
        sc[s + 4] = (p[s + 8] & 0x0f) | ((p[s] >> 2) & 0x30);
        mn[s + 4] = (p[s + 8] >> 4) | ((p[s + 4] >> 2) & 0x30);
    }
}

/* Q4_K and Q5_K: 8 sub-blocks of 32. Value j = 64 c + 32 h + l (sub-block
 * s = 2c + h) is nibble h of qs[32 c + l], and for Q5_K (qh not NULL) has
 * as its fifth bit bit s of qh[l]; x = (d * sc) * q - (dmin * mn). */
static void block_q45_k(const uint8_t *b, const uint8_t *qs, const uint8_t *qh, float *y) {
    const float d = zi_f16_at(b), dmin = zi_f16_at(b + 2);
    int sc[8], mn[8];
    scale_min_k4(b + 4, sc, mn);
    for (int s = 0; s < 8; s++) {
        const float dl = d * (float)sc[s], ml = dmin * (float)mn[s];
        const int c = s / 2, h = s % 2;
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * c + l] >> (4 * h)) & 0x0f;
            if (qh) q |= ((qh[l] >> s) & 1) << 4;
            const float dq = dl * (float)q;
            y[32 * s + l] = dq - ml;
        }
    }
}

static void block_q4_k(const uint8_t *b, float *y) {
    block_q45_k(b, b + 16, NULL, y);
}

static void block_q5_k(const uint8_t *b, float *y) {
    block_q45_k(b, b + 48, b + 16, y);
}

/* Q6_K: 16 sub-blocks of 16 with int8 scales. Value j = 128 h + r
 * (h < 2, r < 128) has as low 4 bits nibble r / 64 of ql[64 h + r % 64] and
 * as high 2 bits bits 2k.. of qh[32 h + l], where r = 32 k + l;
 * x = (d * scale) * (q - 32). */
static void block_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *scales = (const int8_t *)(b + 192);
    const float d = zi_f16_at(b + 208);
    float dl[16];
    for (int s = 0; s < 16; s++) dl[s] = d * (float)scales[s];
    for (int j = 0; j < ZI_QK_K; j++) {
        const int h = j / 128, r = j % 128;
        const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
        const int hi = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
        y[j] = dl[j / 16] * (float)((lo | hi << 4) - 32);
    }
}

/* IQ4_XS: 8 sub-blocks of 32 with 6-bit scales biased by 32: the low 4
 * bits of scale s are nibble s % 2 of scales_l[s / 2], the high 2 bits are
 * bits 2s.. of scales_h. Sub-block s's 32 values are IQ4_NL's nibbles of
 * qs[16 s .. 16 s + 16); x = (d * (scale - 32)) * kvalues[nibble]. */
static void block_iq4_xs(const uint8_t *b, float *y) {
    const float d = zi_f16_at(b);
    uint16_t sh;
    memcpy(&sh, b + 2, 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        const int lo = (sl[s / 2] >> (4 * (s % 2))) & 0x0f;
        const int hi = (sh >> (2 * s)) & 3;
        const float dl = d * (float)((lo | hi << 4) - 32);
        for (int l = 0; l < 32; l++)
            y[32 * s + l] = dl * (float)kvalues_iq4[nibble(qs + 16 * s, l)];
    }
}

int zi_dequantize_row(int type, const void *row, float *y, int64_t n) {
    const uint8_t *p = row;
    void (*block)(const uint8_t *, float *) = NULL;
    switch (type) {
    case ZI_TYPE_F32:
        memcpy(y, row, (size_t)n * sizeof(float));
        return ZI_OK;
    case ZI_TYPE_F16:
    case ZI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            y[i] = type == ZI_TYPE_F16 ? zi_f16_to_f32(h) : zi_bf16_to_f32(h);
        }
        return ZI_OK;
    case ZI_TYPE_Q4_0:
        block = block_q4_0;
        break;
    case ZI_TYPE_Q4_1:
        block = block_q4_1;
        break;
    case ZI_TYPE_Q5_0:
        block = block_q5_0;
        break;
    case ZI_TYPE_Q5_1:
        block = block_q5_1;
        break;
    case ZI_TYPE_Q8_0:
        block = block_q8_0;
        break;
    case ZI_TYPE_Q2_K:
        block = block_q2_k;
        break;
    case ZI_TYPE_Q3_K:
        block = block_q3_k;
        break;
    case ZI_TYPE_Q4_K:
        block = block_q4_k;
        break;
    case ZI_TYPE_Q5_K:
        block = block_q5_k;
        break;
    case ZI_TYPE_Q6_K:
        block = block_q6_k;
        break;
    case ZI_TYPE_IQ4_NL:
        block = block_iq4_nl;
        break;
    case ZI_TYPE_IQ4_XS:
        block = block_iq4_xs;
        break;
    case ZI_TYPE_MXFP4:
        block = block_mxfp4;
        break;
    default:
        return ZI_EUNSUPPORTED;
    }
    const int64_t be = (int64_t)zi_ggml_type_block_elems(type);
    const size_t bb = zi_ggml_type_block_bytes(type);
    assert(be > 0 && n % be == 0);
    for (int64_t k = 0; k < n / be; k++) block(p + (size_t)k * bb, y + k * be);
    return ZI_OK;
}
