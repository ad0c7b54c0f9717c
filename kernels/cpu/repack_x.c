/*
 * repack_x.c - see repack_x.h. Plain C: runs once per weight at load.
 *
 * The bit positions of each type's values are the ones dequant.c reads
 * (its comments say where each bit lives); tests/unit/test_repack_x.c
 * checks dw * u + cw against zi_dequantize_row for every type.
 */
#include "repack_x.h"

#include <string.h>

#include "dequant.h"
#include "quant.h"

size_t zi_r16x_group_bytes(int type) {
    zi_r16x_format f;
    return zi_r16x_format_of(type, &f) ? zi_r16x_format_bytes(&f) : 0;
}

size_t zi_r16x_row_bytes(int type, int64_t nb) {
    zi_r16x_format f;
    if (!zi_r16x_format_of(type, &f) || nb < 1 || (f.sub && nb % 8)) return 0;
    return (zi_r16x_format_bytes(&f) * (size_t)nb + zi_r16x_format_super_bytes(&f) * (size_t)(nb / 8)) /
           16;
}

/* What the sub-scale types store of one row's block (repack_x.h): the f16
 * super-scale d and negated super-min dneg, and each half's integer
 * sub-scale and min, so that dw = d * sc and cw = dneg * m exactly; and
 * MXFP4's E8M0 byte e, dw = 2^(e - 128). */
typedef struct r16x_sub {
    uint16_t d, dneg;
    int sc[2], m[2];
    uint8_t e;
} r16x_sub;

static uint16_t f16_bits(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* Nibble i (< 32) of a run of 16 bytes: low nibbles first. */
static inline uint8_t nib(const uint8_t *qs, int i) {
    return i < 16 ? qs[i] & 0x0f : qs[i - 16] >> 4;
}

/* The 6-bit scale and min of sub-block s of Q4_K and Q5_K (12 bytes p). */
static void scale_min_k4(const uint8_t *p, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = p[s] & 63;
        *mn = p[s + 4] & 63;
    } else {
        *sc = (p[s + 4] & 0x0f) | ((p[s - 4] >> 2) & 0x30);
        *mn = (p[s + 4] >> 4) | ((p[s] >> 2) & 0x30);
    }
}

/* Sub-block s's biased 6-bit scale of Q3_K (12 bytes sc). */
static int scale_q3_k(const uint8_t *sc, int s) {
    const int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
    const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
    return lo | hi << 4;
}

/* zi_r16x_decompose, and for the sub-scale types what the layout stores
 * of the scales (*sub). */
static int decompose(int type, const uint8_t *row, int64_t k, uint8_t code[32], float dw[2],
                     float cw[2], r16x_sub *sub) {
    zi_r16x_format f;
    if (!zi_r16x_format_of(type, &f)) return 0;
    *sub = (r16x_sub){0, 0, {0, 0}, {0, 0}, 0};
    const size_t bb = zi_ggml_type_block_bytes(type);
    const int per = (int)(zi_ggml_type_block_elems(type) / 32); /* 32-blocks per GGUF block */
    const uint8_t *b = row + (size_t)(k / per) * bb;
    const int j = (int)(k % per); /* this 32-block within a super-block */
    switch (type) {
    case ZI_TYPE_Q5_0:
    case ZI_TYPE_Q5_1: {
        const int m = type == ZI_TYPE_Q5_1;
        uint32_t qh;
        memcpy(&qh, b + 2 + 2 * m, 4);
        for (int i = 0; i < 32; i++)
            code[i] = (uint8_t)(nib(b + 6 + 2 * m, i) | ((qh >> i) & 1) << 4);
        dw[0] = zi_f16_at(b);
        cw[0] = m ? zi_f16_at(b + 2) : f.zp * dw[0];
        break;
    }
    case ZI_TYPE_IQ4_NL:
        for (int i = 0; i < 32; i++) code[i] = nib(b + 2, i);
        dw[0] = zi_f16_at(b);
        cw[0] = f.zp * dw[0];
        break;
    case ZI_TYPE_IQ4_XS: {
        uint16_t sh;
        memcpy(&sh, b + 2, 2);
        const int ls = ((b[4 + j / 2] >> (4 * (j % 2))) & 0x0f) | ((sh >> (2 * j)) & 3) << 4;
        for (int i = 0; i < 32; i++) code[i] = nib(b + 8 + 16 * j, i);
        dw[0] = zi_f16_at(b) * (float)(ls - 32);
        cw[0] = f.zp * dw[0];
        *sub = (r16x_sub){f16_bits(b), 0, {ls - 32, ls - 32}, {0, 0}, 0};
        break;
    }
    case ZI_TYPE_MXFP4: /* u8 e @0, qs[16] @1 */
        for (int i = 0; i < 32; i++) code[i] = nib(b + 1, i);
        dw[0] = zi_e8m0_half_to_f32(b[0]);
        cw[0] = f.zp * dw[0];
        sub->e = b[0];
        break;
    case ZI_TYPE_Q4_K:
    case ZI_TYPE_Q5_K: {
        const int five = type == ZI_TYPE_Q5_K;
        const uint8_t *qs = b + (five ? 48 : 16), *qh = b + 16;
        int sc, mn;
        scale_min_k4(b + 4, j, &sc, &mn);
        for (int l = 0; l < 32; l++) {
            int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0f;
            if (five) q |= ((qh[l] >> j) & 1) << 4;
            code[l] = (uint8_t)q;
        }
        dw[0] = zi_f16_at(b) * (float)sc;
        cw[0] = -(zi_f16_at(b + 2) * (float)mn);
        *sub = (r16x_sub){f16_bits(b), (uint16_t)(f16_bits(b + 2) ^ 0x8000), {sc, sc}, {mn, mn}, 0};
        break;
    }
    case ZI_TYPE_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *scales = (const int8_t *)(b + 192);
        const int h = j / 4, k4 = j % 4; /* values 128 h + 32 k4 + l */
        for (int l = 0; l < 32; l++) {
            const int r = 32 * k4 + l;
            const int lo = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0f;
            const int hi = (qh[32 * h + l] >> (2 * k4)) & 3;
            code[l] = (uint8_t)(lo | hi << 4);
        }
        for (int s = 0; s < 2; s++) {
            dw[s] = zi_f16_at(b + 208) * (float)scales[2 * j + s];
            cw[s] = f.zp * dw[s];
            sub->sc[s] = scales[2 * j + s];
        }
        sub->d = f16_bits(b + 208);
        break;
    }
    case ZI_TYPE_Q3_K: {
        const uint8_t *hmask = b, *qs = b + 32;
        const int h = j / 4, k4 = j % 4;
        for (int l = 0; l < 32; l++) {
            const int lo = (qs[32 * h + l] >> (2 * k4)) & 3;
            const int high = (hmask[l] >> j) & 1;
            code[l] = (uint8_t)(lo - ((high ^ 1) << 2) + 4); /* q + 4, in 0..7 */
        }
        for (int s = 0; s < 2; s++) {
            sub->sc[s] = scale_q3_k(b + 96, 2 * j + s) - 32;
            dw[s] = zi_f16_at(b + 108) * (float)sub->sc[s];
            cw[s] = f.zp * dw[s];
        }
        sub->d = f16_bits(b + 108);
        break;
    }
    case ZI_TYPE_Q2_K: {
        const uint8_t *scales = b, *qs = b + 16;
        const int h = j / 4, k4 = j % 4;
        for (int l = 0; l < 32; l++) code[l] = (qs[32 * h + l] >> (2 * k4)) & 3;
        for (int s = 0; s < 2; s++) {
            dw[s] = zi_f16_at(b + 80) * (float)(scales[2 * j + s] & 0x0f);
            cw[s] = -(zi_f16_at(b + 82) * (float)(scales[2 * j + s] >> 4));
            sub->sc[s] = scales[2 * j + s] & 0x0f;
            sub->m[s] = scales[2 * j + s] >> 4;
        }
        sub->d = f16_bits(b + 80);
        sub->dneg = (uint16_t)(f16_bits(b + 82) ^ 0x8000);
        break;
    }
    }
    if (!f.halves) {
        dw[1] = dw[0];
        cw[1] = cw[0];
    }
    return 1;
}

int zi_r16x_decompose(int type, const uint8_t *row, int64_t k, uint8_t code[32], float dw[2],
                      float cw[2]) {
    r16x_sub sub;
    return decompose(type, row, k, code, dw, cw, &sub);
}

/* One block column of 16 rows: row i's block k starts at rows[i]. The
 * sub-scale types' super-scales go to sup (the column's 8-column run). */
static void repack_group(int type, const zi_r16x_format *f, const uint8_t *const rows[16],
                         int64_t k, uint8_t *dst, uint8_t *sup) {
    const int nh = 1 + f->halves;
    uint8_t *dws = dst + 256 + 64 * f->planes; /* then cw, if stored */
    const size_t es = f->sub || f->e8m0 ? 1 : 2;
    memset(dst, 0, 256 + 64 * (size_t)f->planes);
    for (int i = 0; i < 16; i++) {
        uint8_t code[32];
        float dw[2], cw[2];
        r16x_sub sb;
        decompose(type, rows[i], k, code, dw, cw, &sb);
        for (int v = 0; v < 8; v++)
            for (int e = 0; e < 4; e++) {
                const uint8_t c = code[4 * v + e];
                /* vector v = 2p (+1 for the high nibbles) */
                dst[64 * (v / 2) + 4 * i + e] |= (uint8_t)((c & 0x0f) << (4 * (v % 2)));
                for (int p = 0; p < f->planes; p++)
                    if (c >> (4 + p) & 1) {
                        uint64_t m;
                        uint8_t *at = dst + 256 + 64 * p + 8 * v;
                        memcpy(&m, at, 8);
                        m |= 1ull << (4 * i + e);
                        memcpy(at, &m, 8);
                    }
            }
        for (int h = 0; h < nh; h++)
            for (int s = 0; s < 1 + f->cw_stored; s++) {
                uint8_t *at = dws + es * (size_t)(16 * nh * s + 16 * h + i);
                if (f->e8m0) { /* the file's byte: no f16 holds 2^-128..2^127 */
                    *at = sb.e;
                } else if (f->sub) { /* -32..63: an int8 */
                    const int8_t x = (int8_t)(s ? sb.m[h] : sb.sc[h]);
                    memcpy(at, &x, 1);
                } else {
                    const uint16_t x = zi_f32_to_f16(s ? cw[h] : dw[h]); /* exact: an f16 */
                    memcpy(at, &x, 2);
                }
            }
        if (f->sub) {
            memcpy(sup + 2 * i, &sb.d, 2);
            if (f->cw_stored) memcpy(sup + 32 + 2 * i, &sb.dneg, 2);
        }
    }
}

void zi_r16x_repack(int type, const uint8_t *src, uint8_t *dst, int64_t rows, int64_t nb,
                    size_t row_bytes) {
    zi_r16x_format f;
    const size_t rb = zi_r16x_row_bytes(type, nb);
    if (!zi_r16x_format_of(type, &f) || !rb) return;
    const size_t gb = zi_r16x_format_bytes(&f), sb = zi_r16x_format_super_bytes(&f);
    for (int64_t R = 0; R < rows / 16; R++) {
        const uint8_t *r[16];
        uint8_t *g = dst + (size_t)R * 16 * rb;
        for (int i = 0; i < 16; i++) r[i] = src + (size_t)(R * 16 + i) * row_bytes;
        for (int64_t k = 0; k < nb; k++)
            repack_group(type, &f, r, k, g + (size_t)k * gb, g + (size_t)nb * gb + (size_t)(k / 8) * sb);
    }
}
