/*
 * repack_x.h - the "16-row extended" weight layout: how the CPU backend
 * runs the GGUF types that have no block kernel of their own (Q5_0, Q5_1,
 * IQ4_NL, the K-quants Q2_K..Q6_K, IQ4_XS and MXFP4) on integer kernels.
 *
 * Every one of those types can be written exactly, per half block of 16
 * values (h = 0 for values 0-15 of a 32-value block, 1 for 16-31), as
 *   value = dw[h] * u + cw[h]
 * with u an integer in 0..255 and dw, cw float32 numbers that are exact
 * products of the file's f16 scales and small integers (an f16 has 11
 * significant bits, a sub-scale at most 8: the product fits float32's 24),
 * or for MXFP4 a power of two from the file's E8M0 byte and its multiple
 * by the zero point.
 * So a product with an activation block is one integer dot product per half
 * (the kernels' vpdpbusd of unsigned codes by signed activation bytes) and
 * two float steps, with no rounding of the weights at all: the kernels keep
 * the dequantizing path's accuracy (~1e-7 KL from float64 on the default
 * model) at integer speed.
 *
 * The codes are stored as in the 16-row layout of repack.h (16 rows' block
 * column k together), as a nibble plus 0, 1 or 2 bit planes, and for the
 * IQ4 types the nibble indexes the code book (u = kvalues[nibble] + 128),
 * for MXFP4 its own (u = kvalues_mxfp4[nibble] + 12: the doubled e2m1
 * values -12..12 as 0..24; the smallest zero point keeps the kernels'
 * sums and offsets, which cancel, as small as the values allow).
 * The 16 rows of group R take zi_r16x_row_bytes(type, nb) * 16 bytes, from
 * offset R * 16 * zi_r16x_row_bytes(type, nb): first the nb block columns,
 * each of zi_r16x_group_bytes(type) bytes, then (fmt.sub) the super-scales.
 * Block column k:
 *   nib[256]  byte 64p + 4i + e: low nibble = code of element 8p + e of
 *             row i, high nibble = code of element 8p + 4 + e (as Q4_0's
 *             16-row layout); so the nibbles split into 8 vectors v of 64
 *             bytes, lane 4i + e = element 4v + e of row i.
 *   planes    fmt.planes x 64 bytes: plane b's uint64 v (at 8v) has bit
 *             4i + e set when bit 4 + b of element 4v + e of row i's code is.
 *   dw        [1 + fmt.halves][16]: half h's scale of row i: the file's f16
 *             (Q5_0, Q5_1, IQ4_NL), or (fmt.sub: the K-quants and IQ4_XS)
 *             the file's integer sub-scale as an int8, dw = d * sub-scale,
 *             or (fmt.e8m0: MXFP4) the file's E8M0 byte e, dw = 2^(e - 128)
 *             (zi_e8m0_half_to_f32: E8M0 halved, for the doubled book).
 *   cw        the same, only if fmt.cw_stored (the file's f16 m of Q5_1;
 *             the K-quants' integer mins, cw = dneg * min); else cw =
 *             fmt.zp * dw (zp a power of two, or for MXFP4 dw one: exact).
 * Super-scales (fmt.sub), per 8 block columns j (a 256-value super-block):
 *   d[16]     row i's f16 d, then, if fmt.cw_stored, dneg[16]: its f16
 *             dmin negated; 32 * (1 + cw_stored) bytes at offset nb *
 *             group_bytes + j * zi_r16x_super_bytes(type).
 * Every dw and cw is an exact float32 (an f16 times an integer of at most 8
 * bits, or a power of two times one of at most 4), computed by the kernels
 * as it was at repacking. Types whose scales
 * cover 32 values (fmt.halves == 0) store one dw (and cw) per block: both
 * halves share it.
 *
 * MXFP4's dw is a power of two, so dw * da is exact in the kernels and
 * cw = -12 * dw is too, as long as both stay within float32's range: an
 * E8M0 byte of 253 and more (values of 2^125 and up, whose largest codes
 * dequantize to inf) makes cw infinite, and a scale near 2^-128 times a
 * small activation scale leaves the normal range. Trained weights' scales
 * lie far from both ends.
 *
 * Bits per weight against the file's: Q5_0, Q5_1, IQ4_NL and MXFP4 the
 * file's (5.5, 6, 4.5, 4.25: the same bytes, regrouped), IQ4_XS 4.31
 * (4.25), Q4_K 4.63 (4.5), Q5_K 5.63 (5.5), Q6_K 6.56 (6.56), Q3_K 4.56
 * (3.44), Q2_K 5.13 (2.63): the codes take 4, 5 or 6 bits whatever the
 * file's width.
 */
#ifndef ZI_REPACK_X_H
#define ZI_REPACK_X_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

/* How one type is stored in the extended layout (see above). */
typedef struct zi_r16x_format {
    int planes;    /* bit planes above the nibble: 0, 1 or 2 */
    int lut;       /* code book: 0 none (u = code), 1 IQ4 (IQ4_NL, IQ4_XS), 2 MXFP4 */
    int halves;    /* 1: a dw (and cw) per 16 values; 0: per 32 */
    int cw_stored; /* 1: cw stored; 0: cw = zp * dw */
    int sub;       /* 1: int8 sub-scales and f16 super-scales; 0: f16 scales */
    int e8m0;      /* 1: one E8M0 byte per row and block instead (sub is 0) */
    float zp;
} zi_r16x_format;

/* The IQ4 code book plus 128: u of each nibble. */
static const uint8_t zi_r16x_iq4_u[16] = {1,   24,  45,  63,  79,  93,  106, 118,
                                          129, 141, 153, 166, 181, 197, 217, 241};
/* MXFP4's code book (the doubled e2m1 values 0, 1, 2, 3, 4, 6, 8, 12, then
 * 0, -1, ..., -12) plus 12: u of each nibble. */
static const uint8_t zi_r16x_mxfp4_u[16] = {12, 13, 14, 15, 16, 18, 20, 24,
                                            12, 11, 10, 9,  8,  6,  4,  0};

/* The code book of a format's lut field (NULL for 0: u is the code). */
static inline const uint8_t *zi_r16x_book(int lut) {
    return lut == 2 ? zi_r16x_mxfp4_u : lut ? zi_r16x_iq4_u : NULL;
}

/* Each type's format, as X(type, planes, lut, halves, cw_stored, sub, e8m0,
 * zp): the one list that both the repacking and the kernels' per-type
 * copies (cpu_kernels_r16x.h, cpu_kernels_amx.h) are made from. */
#define ZI_R16X_TYPES(X)                                                                           \
    X(ZI_TYPE_Q5_0, 1, 0, 0, 0, 0, 0, -16.0f)                                                      \
    X(ZI_TYPE_Q5_1, 1, 0, 0, 1, 0, 0, 0.0f)                                                        \
    X(ZI_TYPE_IQ4_NL, 0, 1, 0, 0, 0, 0, -128.0f)                                                   \
    X(ZI_TYPE_IQ4_XS, 0, 1, 0, 0, 1, 0, -128.0f)                                                   \
    X(ZI_TYPE_Q4_K, 0, 0, 0, 1, 1, 0, 0.0f)                                                        \
    X(ZI_TYPE_Q5_K, 1, 0, 0, 1, 1, 0, 0.0f)                                                        \
    X(ZI_TYPE_Q6_K, 2, 0, 1, 0, 1, 0, -32.0f)                                                      \
    X(ZI_TYPE_Q3_K, 0, 0, 1, 0, 1, 0, -4.0f)                                                       \
    X(ZI_TYPE_Q2_K, 0, 0, 1, 1, 1, 0, 0.0f)                                                        \
    X(ZI_TYPE_MXFP4, 0, 2, 0, 0, 0, 1, -12.0f)

/* The format of `type`; returns 0 (and leaves *f alone) for a type that is
 * not stored this way. */
static inline int zi_r16x_format_of(int type, zi_r16x_format *f) {
#define ZI_R16X_FORMAT_CASE(T, P, L, H, C, F, E, Z)                                                \
    case T:                                                                                        \
        *f = (zi_r16x_format){P, L, H, C, F, E, Z};                                                \
        return 1;
    switch (type) {
        ZI_R16X_TYPES(ZI_R16X_FORMAT_CASE)
    default:
        return 0;
    }
#undef ZI_R16X_FORMAT_CASE
}

/* Bytes of one block column of 16 rows in the format's layout: the scales
 * take a byte per row (int8 sub-scales, E8M0) or two (f16). */
static inline size_t zi_r16x_format_bytes(const zi_r16x_format *f) {
    return 256 + 64 * (size_t)f->planes +
           (f->sub || f->e8m0 ? 16 : 32) * (size_t)(1 + f->halves) * (size_t)(1 + f->cw_stored);
}

/* Bytes of one 8-column run's super-scales of 16 rows (0 without them). */
static inline size_t zi_r16x_format_super_bytes(const zi_r16x_format *f) {
    return f->sub ? 32 * (size_t)(1 + f->cw_stored) : 0;
}

/* Bytes of one block column of 16 rows of `type` (0 if it is not stored
 * this way). A multiple of 16. */
size_t zi_r16x_group_bytes(int type);

/* Bytes of a row of nb blocks of `type` in the layout: a sixteenth of its
 * group of 16 rows, super-scales included (0 if it is not stored this way,
 * or nb is not a whole number of super-blocks where it has them). */
size_t zi_r16x_row_bytes(int type, int64_t nb);

/*
 * One 32-value block of a GGUF row as codes and scales: block k (values
 * 32k..32k+31) of the row at `row` of `type`. code[i] is what the layout
 * stores (the nibble in bits 0-3, the planes in bits 4-5); u is code[i], or
 * zi_r16x_book(fmt.lut)[code[i]] for the IQ4 types and MXFP4. dw[1], cw[1]
 * equal dw[0], cw[0] for types with 32-value scales; cw is filled whether
 * stored or not.
 * Returns 0 for a type that is not stored this way.
 */
int zi_r16x_decompose(int type, const uint8_t *row, int64_t k, uint8_t code[32], float dw[2],
                      float cw[2]);

/* Repacks rows (a multiple of 16) x nb blocks of 32 of `type` from GGUF
 * layout (src, row_bytes apart) into dst (rows * zi_r16x_row_bytes(type,
 * nb) bytes). */
void zi_r16x_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                    size_t row_bytes);

#endif
