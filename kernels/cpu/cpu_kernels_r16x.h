/*
 * cpu_kernels_r16x.h - the products of weights in the extended 16-row
 * layout (repack_x.h: Q5_0, Q5_1, IQ4_NL, IQ4_XS, the K-quants and MXFP4)
 * on the vector units, and mm_r16_any, the 16-row entry of the avx2
 * table, which sends those types here and the others to mm_r16_avx2 (the
 * avx512 table's entry follows in cpu_kernels_amx.h, which adds the AMX
 * tiles). One of the units that cpu_kernels_impl.h includes, in its order,
 * once per instruction set.
 *
 * What each table compiles here:
 *   scalar   nothing (it has no 16-row entry: these types run on the
 *            dequantizing path, cpu_backend.c's mm_rows_dequant).
 *   AVX2     (#if __AVX2__ && !ZI_HAVE_VNNI) r16x_avx2_rows: each block
 *            column decoded to bytes, widened to int16 and multiplied by
 *            the int16 activation 256*q1 + q2 with vpmaddwd (Q8_0's path
 *            of mm_r16_avx2, whose pieces it shares).
 *   AVX-512  (#if ZI_HAVE_VNNI && __AVX512F__) r16x_vnni_rows: the codes
 *            of a column decoded in registers (r16x_decode512: nibbles,
 *            code book by vpshufb, bit planes by masked byte adds), then
 *            vpdpbusd as in mm_r16_vnni, for 4 tokens a decoding, or 8 in
 *            batches of more than 4 (r16x_vnni_pass8); MXFP4's E8M0 scales
 *            become floats by integer shifts (r16x_e8m0x16).
 *
 * Per block column k and token t, with u the codes, q = 256*q1 + q2 the
 * activation and da its scale (quant.h):
 *   32-value scales: acc += (sum u*q) * (dw * da);  off += cw * s[k]
 *   16-value scales: acc += (sum_0 u*q) * (dw0 * da) + (sum_1 u*q) * (dw1 * da);
 *                    off += cw0 * (da * sum_0 q) + cw1 * (da * sum_1 q)
 * (sum_h over values 16h..16h+15), and y = acc + off. The integer sums are
 * exact, so both tables do the same float operations in the same order on
 * the same numbers: their outputs are bit-identical, and a token's never
 * depend on the rest of its batch.
 */
#if defined(__AVX2__)
#include "repack_x.h"

/* zi_r16x_format_bytes and _super_bytes of a format given by its fields
 * (constants in the kernels' per-type copies). */
static inline size_t r16x_col_bytes(int planes, int halves, int cws, int sub, int e8m0) {
    const zi_r16x_format f = {planes, 0, halves, cws, sub, e8m0, 0.0f};
    return zi_r16x_format_bytes(&f);
}
static inline size_t r16x_super_bytes(int cws, int sub) {
    const zi_r16x_format f = {0, 0, 0, cws, sub, 0, 0.0f};
    return zi_r16x_format_super_bytes(&f);
}

/* sum_{e < 16} (256*q1[e] + q2[e]) of one half block, exactly. */
static inline int32_t r16x_half_sum(const int8_t *q1, const int8_t *q2) {
    const __m128i flip = _mm_set1_epi8((char)0x80), z = _mm_setzero_si128();
    /* vpsadbw sums unsigned bytes: flip the sign bit, subtract 16 * 128. */
    __m128i s1 = _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)q1), flip), z);
    __m128i s2 = _mm_sad_epu8(_mm_xor_si128(_mm_loadu_si128((const __m128i *)q2), flip), z);
    const int32_t a1 = _mm_cvtsi128_si32(s1) + _mm_extract_epi32(s1, 2) - 2048;
    const int32_t a2 = _mm_cvtsi128_si32(s2) + _mm_extract_epi32(s2, 2) - 2048;
    return 256 * a1 + a2;
}

/* da * each half's sum of token t's block k: zi_q8_act.s16 where the caller
 * filled it, else summed here (the same integers, the same float product). */
static inline void r16x_half_sums(const zi_q8_act *a, int64_t t, int64_t k, float *sa0,
                                  float *sa1) {
    const int64_t nb = a->nb;
    if (a->s16) {
        *sa0 = a->s16[(t * nb + k) * 2];
        *sa1 = a->s16[(t * nb + k) * 2 + 1];
        return;
    }
    const int8_t *q1 = a->q + t * nb * 2 * ZI_QK + k * ZI_QK, *q2 = q1 + nb * ZI_QK;
    const float da = a->d[t * nb + k];
    *sa0 = da * (float)r16x_half_sum(q1, q2);
    *sa1 = da * (float)r16x_half_sum(q1 + 16, q2 + 16);
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* 16 int8 sub-scales at p as floats (exact). */
static inline __m512 r16x_i8x16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 E8M0 bytes e at p as 2^(e - 128), the bits zi_e8m0_half_to_f32 builds:
 * the exponent field e - 1, or for e < 2 the subnormal 2^-128 << e. */
static inline __m512 r16x_e8m0x16(const uint8_t *p) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 small = _mm512_cmplt_epi32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal));
}

/* The 16 rows' dw and cw of each half of block column k (at G) of the
 * group at base (repack_x.h): the file's f16 scales, or d * sub-scale and
 * dneg * min from the column's int8 and its run's f16 super-scales (exact
 * float32 products: the values the repacking decomposed), or the powers of
 * two of the file's E8M0 bytes. Format fields constants once inlined. */
static inline __attribute__((always_inline)) void
r16x_col_scales(const int planes, const int halves, const int cws, const int sub, const int e8m0,
                const float zp, const uint8_t *base, size_t gb, int64_t nb, int64_t k,
                __m512 *dw0, __m512 *dw1, __m512 *cw0, __m512 *cw1) {
    const uint8_t *sc = base + (size_t)k * gb + 256 + 64 * planes;
    const size_t nh = 1 + (size_t)halves;
    if (sub) {
        const uint8_t *sup = base + (size_t)nb * gb + (size_t)(k / 8) * r16x_super_bytes(cws, sub);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sup));
        *dw0 = _mm512_mul_ps(d, r16x_i8x16(sc));
        *dw1 = halves ? _mm512_mul_ps(d, r16x_i8x16(sc + 16)) : *dw0;
        if (cws) {
            const __m512 dn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sup + 32)));
            *cw0 = _mm512_mul_ps(dn, r16x_i8x16(sc + 16 * nh));
            *cw1 = halves ? _mm512_mul_ps(dn, r16x_i8x16(sc + 16 * nh + 16)) : *cw0;
            return;
        }
    } else if (e8m0) { /* halves and cws are 0 (MXFP4) */
        *dw0 = *dw1 = r16x_e8m0x16(sc);
    } else {
        *dw0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
        *dw1 = halves ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32))) : *dw0;
        if (cws) {
            *cw0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32 * nh)));
            *cw1 = halves ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32 * nh + 32)))
                          : *cw0;
            return;
        }
    }
    *cw0 = _mm512_mul_ps(*dw0, _mm512_set1_ps(zp));
    *cw1 = halves ? _mm512_mul_ps(*dw1, _mm512_set1_ps(zp)) : *cw0;
}

/* The codes of block column G as 8 vectors of unsigned bytes, c[v] lane 4i
 * + e = u of element 4v + e of row i (the nibbles, through the code book
 * zi_r16x_book(lut) where lut, plus the bit planes): the order vpdpbusd
 * and the AMX B tile both take. */
static inline __attribute__((always_inline)) void r16x_decode512(const int planes, const int lut,
                                                                 const uint8_t *G, __m512i c[8]) {
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int p = 0; p < 4; p++) {
        __m512i x = _mm512_loadu_si512((const void *)(G + 64 * p));
        c[2 * p] = _mm512_and_si512(x, m4);
        c[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
    }
    if (lut) {
        const __m512i book =
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)zi_r16x_book(lut)));
        for (int v = 0; v < 8; v++) c[v] = _mm512_shuffle_epi8(book, c[v]);
    }
    for (int b = 0; b < planes; b++)
        for (int v = 0; v < 8; v++) {
            /* straight from memory into a mask register (kmovq k, m64: a
             * load, where a move through a general register is two uops
             * and one on port 5, which vpdpbusd and the shuffles need) */
            const __mmask64 m = _load_mask64((__mmask64 *)(uintptr_t)(G + 256 + 64 * b + 8 * v));
            c[v] = _mm512_mask_add_epi8(c[v], m, c[v], _mm512_set1_epi8((char)(16 << b)));
        }
}

/* Block columns whose scales r16x_vnni_rows keeps for a batch (64 KiB). */
#define R16X_XS_COLS 256

/* One token's exact integer sums against a column's decoded codes c
 * (activation 256*q1 + q2; q2 all zero when !res): values 0-15 (vectors
 * 0-3) in *s0, 16-31 (4-7) in *s1. */
static inline __attribute__((always_inline)) void r16x_col_sums(const __m512i c[8],
                                                                const int8_t *q1, const int8_t *q2,
                                                                const int res, __m512i *s0,
                                                                __m512i *s1) {
    __m512i h0 = _mm512_setzero_si512(), h1 = h0, l0 = h0, l1 = h0;
    for (int j = 0; j < 4; j++) {
        h0 = _mm512_dpbusd_epi32(h0, c[j], bcast4(q1 + 4 * j));
        h1 = _mm512_dpbusd_epi32(h1, c[j + 4], bcast4(q1 + 16 + 4 * j));
        if (!res) continue; /* int8 activations: q2 is all zero */
        l0 = _mm512_dpbusd_epi32(l0, c[j], bcast4(q2 + 4 * j));
        l1 = _mm512_dpbusd_epi32(l1, c[j + 4], bcast4(q2 + 16 + 4 * j));
    }
    *s0 = _mm512_add_epi32(_mm512_slli_epi32(h0, 8), l0);
    *s1 = _mm512_add_epi32(_mm512_slli_epi32(h1, 8), l1);
}

/* acc plus a column's sums scaled: (s0 + s1) * (dw0 * da) for 32-value
 * scales, else s0 * (dw0 * da) then s1 * (dw1 * da) (the header's formula,
 * in the one order every table uses). */
static inline __attribute__((always_inline)) __m512
r16x_acc(__m512 acc, __m512i s0, __m512i s1, __m512 dw0, __m512 dw1, float da, const int halves) {
    if (!halves)
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                               _mm512_mul_ps(dw0, _mm512_set1_ps(da)), acc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, _mm512_set1_ps(da)), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, _mm512_set1_ps(da)), acc);
}

/* off plus the offset terms of token t's block k: cw0 * s (the block's
 * da * sum q) for 32-value scales, else cw0 and cw1 times each half's. */
static inline __attribute__((always_inline)) __m512 r16x_off(__m512 off, __m512 cw0, __m512 cw1,
                                                             const zi_q8_act *a, int64_t t,
                                                             int64_t k, const int halves) {
    if (!halves) return _mm512_fmadd_ps(cw0, _mm512_set1_ps(a->s[t * a->nb + k]), off);
    float sa0, sa1;
    r16x_half_sums(a, t, k, &sa0, &sa1);
    off = _mm512_fmadd_ps(cw0, _mm512_set1_ps(sa0), off);
    return _mm512_fmadd_ps(cw1, _mm512_set1_ps(sa1), off);
}

/* Tokens a pass of r16x_vnni_pass8 takes: its 8 accumulators, the 8 code
 * vectors of a column and the integer sums fit the 32 registers. */
#define R16X_PASS 8

/* Tokens t0 .. t0 + nt - 1 (nt <= R16X_PASS) of the 16-row group at base,
 * its columns' scales made once in xs: each column's codes are decoded
 * once for 8 tokens, not 4 (a Q6_K column takes 48 decoding instructions
 * beside a token's 16 vpdpbusd: one thread's Q6_K 2048 x 768 over 32
 * tokens 235 -> 275 Gop/s on the AMD EPYC, Q4_K 768 x 2048 360 -> 370).
 * The acc terms in a first loop over the columns, the off terms in a
 * second (they need no codes, and beside acc they would not fit the
 * registers): each sum takes the same float operations in the same order
 * as the 4-token loop of r16x_vnni_rows, so the results are bit-identical
 * to it, and a token's never depend on its pass. */
static inline __attribute__((always_inline)) void
r16x_vnni_pass8(const int res, const int planes, const int lut, const int halves,
                const uint8_t *base, size_t gb, const float (*xs)[4][16], const zi_q8_act *a,
                int64_t t0, int nt, float *y, int64_t ldy) {
    const int64_t nb = a->nb;
    const int8_t *qt[R16X_PASS];
    const float *dt[R16X_PASS];
    __m512 acc[R16X_PASS], offv[R16X_PASS];
#pragma GCC unroll 8
    for (int i = 0; i < R16X_PASS; i++) {
        const int64_t t = t0 + (i < nt ? i : 0);
        qt[i] = a->q + t * nb * 2 * ZI_QK;
        dt[i] = a->d + t * nb;
        acc[i] = offv[i] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < nb; k++) {
        const uint8_t *G = base + (size_t)k * gb;
        for (size_t off = 0; off < gb; off += 64) /* as in r16x_vnni_rows */
            _mm_prefetch((const char *)(G + 16 * gb + off), _MM_HINT_T1);
        __m512i c[8];
        r16x_decode512(planes, lut, G, c);
        const __m512 dw0 = _mm512_load_ps(xs[k][0]);
        const __m512 dw1 = _mm512_load_ps(xs[k][1]);
#pragma GCC unroll 8
        for (int i = 0; i < R16X_PASS; i++) {
            if (i >= nt) break;
            const int8_t *q1 = qt[i] + k * ZI_QK, *q2 = q1 + nb * ZI_QK;
            __m512i s0, s1;
            r16x_col_sums(c, q1, q2, res, &s0, &s1);
            acc[i] = r16x_acc(acc[i], s0, s1, dw0, dw1, dt[i][k], halves);
        }
    }
    for (int64_t k = 0; k < nb; k++) {
        const __m512 cw0 = _mm512_load_ps(xs[k][2]), cw1 = _mm512_load_ps(xs[k][3]);
#pragma GCC unroll 8
        for (int i = 0; i < R16X_PASS; i++) {
            if (i >= nt) break;
            offv[i] = r16x_off(offv[i], cw0, cw1, a, t0 + i, k, halves);
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < R16X_PASS; i++)
        if (i < nt) _mm512_storeu_ps(y + (t0 + i) * ldy, _mm512_add_ps(acc[i], offv[i]));
}

/* Rows [r0, r1) (multiples of 16) of one type in the extended layout; the
 * format's fields are constants once inlined into r16x_vnni. */
static inline __attribute__((always_inline)) void
r16x_vnni_rows(const int res, const int planes, const int lut, const int halves, const int cws,
               const int sub, const int e8m0, const float zp, const uint8_t *w, size_t row_bytes,
               int64_t r0, int64_t r1, const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int64_t nb = a->nb;
    const size_t gb = r16x_col_bytes(planes, halves, cws, sub, e8m0);
    /* With more than one pass of 4 tokens over a group, its columns' scales
     * are made once (the sub-scale types' are products) and kept here, and
     * the tokens go in passes of 8 (r16x_vnni_pass8). */
    _Alignas(64) float xs[R16X_XS_COLS][4][16];
    const int pre = n_tokens > 4 && nb <= R16X_XS_COLS;
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int64_t k = 0; pre && k < nb; k++) {
            __m512 v[4];
            r16x_col_scales(planes, halves, cws, sub, e8m0, zp, base, gb, nb, k, &v[0], &v[1],
                            &v[2], &v[3]);
            for (int j = 0; j < 4; j++) _mm512_store_ps(xs[k][j], v[j]);
        }
        for (int t0 = 0; pre && t0 < n_tokens; t0 += R16X_PASS) {
            const int nt = n_tokens - t0 < R16X_PASS ? n_tokens - t0 : R16X_PASS;
            r16x_vnni_pass8(res, planes, lut, halves, base, gb, (const float(*)[4][16])xs, a, t0,
                            nt, y + R * 16, ldy);
        }
        for (int t0 = 0; !pre && t0 < n_tokens; t0 += 4) {
            const int nt = n_tokens - t0 < 4 ? n_tokens - t0 : 4;
            __m512 acc[4], offv[4];
            for (int i = 0; i < 4; i++) acc[i] = offv[i] = _mm512_setzero_ps();
            for (int64_t k = 0; k < nb; k++) {
                const uint8_t *G = base + (size_t)k * gb;
                /* Into L2, 16 block columns ahead: an L1 prefetch holds
                 * one of the core's few line-fill buffers until its line
                 * arrives, which capped one thread's stream of Q6_K at ~10
                 * GB/s; L2 takes more misses in flight (one token's Q6_K
                 * 151936 x 2048: 24.7 -> 22.5 ms, Q4_K unchanged). */
                for (size_t off = 0; off < gb; off += 64)
                    _mm_prefetch((const char *)(G + 16 * gb + off), _MM_HINT_T1);
                __m512i c[8];
                r16x_decode512(planes, lut, G, c);
                __m512 dw0, dw1, cw0, cw1;
                r16x_col_scales(planes, halves, cws, sub, e8m0, zp, base, gb, nb, k, &dw0, &dw1,
                                &cw0, &cw1);
                for (int i = 0; i < nt; i++) {
                    const int64_t t = t0 + i;
                    const int8_t *q1 = a->q + t * nb * 2 * ZI_QK + k * ZI_QK;
                    const int8_t *q2 = q1 + nb * ZI_QK;
                    __m512i s0, s1;
                    r16x_col_sums(c, q1, q2, res, &s0, &s1);
                    acc[i] = r16x_acc(acc[i], s0, s1, dw0, dw1, a->d[t * nb + k], halves);
                    offv[i] = r16x_off(offv[i], cw0, cw1, a, t, k, halves);
                }
            }
            for (int i = 0; i < nt; i++)
                _mm512_storeu_ps(y + (t0 + i) * ldy + R * 16, _mm512_add_ps(acc[i], offv[i]));
        }
    }
}
#define R16X_ROWS r16x_vnni_rows
#endif

#if defined(__AVX2__) && !defined(ZI_HAVE_VNNI)
/* Scale i of a column's scales at s: an f16, or (sub) the int8 sub-scale
 * times the f16 super-scale i at sup (exact), or (e8m0) the power of two
 * of an E8M0 byte. */
static inline float r16x_scale(const uint8_t *s, int i, int sub, int e8m0, const uint8_t *sup) {
    uint16_t h;
    if (e8m0) return zi_e8m0_half_to_f32(s[i]);
    if (sub) {
        memcpy(&h, sup + 2 * (i % 16), 2);
        return load_f16(h) * (float)(int8_t)s[i];
    }
    memcpy(&h, s + 2 * i, 2);
    return load_f16(h);
}

/* 32 bytes, 0xff where bit i of m is set. */
static inline __m256i r16x_bits_to_bytes(uint32_t m) {
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)m), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* Block column G's codes as bytes in Q8_0's 16-row order (byte 64v + 4i +
 * e = u of element 4v + e of row i), to u8[512]. */
static inline __attribute__((always_inline)) void r16x_decode_avx2(const int planes, const int lut,
                                                                   const uint8_t *G, uint8_t *u8) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i book =
        lut ? _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)zi_r16x_book(lut)))
            : _mm256_setzero_si256();
    for (int p = 0; p < 4; p++)
        for (int hh = 0; hh < 2; hh++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(G + 64 * p + 32 * hh));
            __m256i c[2] = {_mm256_and_si256(x, m4), _mm256_and_si256(_mm256_srli_epi16(x, 4), m4)};
            for (int n = 0; n < 2; n++) {
                const int v = 2 * p + n;
                if (lut) c[n] = _mm256_shuffle_epi8(book, c[n]);
                for (int b = 0; b < planes; b++) {
                    uint32_t m;
                    memcpy(&m, G + 256 + 64 * b + 8 * v + 4 * hh, 4);
                    c[n] =
                        _mm256_add_epi8(c[n], _mm256_and_si256(r16x_bits_to_bytes(m),
                                                               _mm256_set1_epi8((char)(16 << b))));
                }
                _mm256_store_si256((__m256i *)(u8 + 64 * v + 32 * hh), c[n]);
            }
        }
}

/* The integer sums of one token over one decoded column (int16 codes c, in
 * r16_widen_u8's order, and the token's int16 activation q16): s[h][g] is
 * rows 8g..8g+7's sum over values 16h..16h+15. */
static inline __attribute__((always_inline)) void
r16x_isum_avx2(const uint8_t *c, const int16_t *q16, __m256i s[2][2]) {
    const __m256i z = _mm256_setzero_si256();
    for (int g = 0; g < 2; g++)
        for (int h = 0; h < 2; h++) {
            __m256i a0 = z, a1 = z;
            for (int j = 4 * h; j < 4 * h + 4; j++) {
                const __m256i b = _mm256_castpd_si256(
                    _mm256_broadcast_sd((const double *)(const void *)(q16 + 4 * j)));
                a0 = _mm256_add_epi32(
                    a0, _mm256_madd_epi16(
                            _mm256_load_si256((const __m256i *)(c + 512 * g + 64 * j)), b));
                a1 = _mm256_add_epi32(
                    a1, _mm256_madd_epi16(
                            _mm256_load_si256((const __m256i *)(c + 512 * g + 64 * j + 32)), b));
            }
            s[h][g] = _mm256_hadd_epi32(a0, a1);
        }
}

/* mm_r16_avx2's loop structure (columns decoded chunk by chunk into L1,
 * tokens in passes) for the extended layout. */
static inline __attribute__((always_inline)) void
r16x_avx2_rows(const int res, const int planes, const int lut, const int halves, const int cws,
               const int sub, const int e8m0, const float zp, const uint8_t *w, size_t row_bytes,
               int64_t r0, int64_t r1, const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    (void)res; /* the int16 activation holds a zero q2 anyway */
    enum { KC = ZI_R16_CODE_BYTES / 1024 }; /* columns per decoded chunk */
    const int64_t nb = a->nb;
    const size_t gb = r16x_col_bytes(planes, halves, cws, sub, e8m0);
    _Alignas(32) uint8_t u8[512];
    _Alignas(32) uint8_t code[KC][1024];
    _Alignas(32) float sc[KC][4][16];           /* per column: dw0, dw1, cw0, cw1 of the 16 rows */
    _Alignas(32) float sums[ZI_R16_PASS][4][8]; /* per token: acc rows 0-7, 8-15, off 0-7, 8-15 */
    _Alignas(32) int16_t q16[KC][ZI_QK];
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int t0 = 0; t0 < n_tokens; t0 += ZI_R16_PASS) {
            const int nt = n_tokens - t0 < ZI_R16_PASS ? n_tokens - t0 : ZI_R16_PASS;
            memset(sums, 0, sizeof sums[0] * (size_t)nt);
            for (int64_t k0 = 0; k0 < nb; k0 += KC) {
                const int64_t kn = nb - k0 < KC ? nb - k0 : KC;
                for (int64_t k = 0; k < kn; k++) {
                    const uint8_t *G = base + (size_t)(k0 + k) * gb;
                    for (size_t off = 0; off < gb; off += 64)
                        _mm_prefetch((const char *)(G + 8 * gb + off), _MM_HINT_T0);
                    r16x_decode_avx2(planes, lut, G, u8);
                    r16_widen_u8(u8, code[k]);
                    const uint8_t *s = G + 256 + 64 * planes;
                    const uint8_t *sup =
                        base + (size_t)nb * gb + (size_t)((k0 + k) / 8) * r16x_super_bytes(cws, sub);
                    for (int i = 0; i < 16; i++) {
                        const float d0 = r16x_scale(s, i, sub, e8m0, sup);
                        const float d1 = halves ? r16x_scale(s, 16 + i, sub, e8m0, sup) : d0;
                        sc[k][0][i] = d0;
                        sc[k][1][i] = d1;
                        sc[k][2][i] =
                            cws ? r16x_scale(s, 16 * (1 + halves) + i, sub, e8m0, sup + 32)
                                : zp * d0;
                        sc[k][3][i] = !halves ? sc[k][2][i]
                                      : cws   ? r16x_scale(s, 48 + i, sub, e8m0, sup + 32)
                                              : zp * d1;
                    }
                }
                for (int i = 0; i < nt; i++) {
                    const int64_t t = t0 + i;
                    const int8_t *q1 = a->q + t * nb * 2 * ZI_QK, *q2 = q1 + nb * ZI_QK;
                    __m256 acc[2] = {_mm256_load_ps(sums[i][0]), _mm256_load_ps(sums[i][1])};
                    __m256 off[2] = {_mm256_load_ps(sums[i][2]), _mm256_load_ps(sums[i][3])};
                    for (int64_t k = 0; k < kn; k++) /* q16 = 256*q1 + q2 */
                        for (int e = 0; e < ZI_QK; e += 16) {
                            const int64_t o = (k0 + k) * ZI_QK + e;
                            __m256i v1 =
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q1 + o)));
                            __m256i v2 =
                                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q2 + o)));
                            _mm256_store_si256((__m256i *)(q16[k] + e),
                                               _mm256_add_epi16(_mm256_slli_epi16(v1, 8), v2));
                        }
                    for (int64_t k = 0; k < kn; k++) {
                        const int64_t kk = k0 + k;
                        const float daf = a->d[t * nb + kk];
                        const __m256 da = _mm256_set1_ps(daf);
                        __m256i s[2][2];
                        r16x_isum_avx2(code[k], q16[k], s);
                        if (!halves) {
                            const __m256 sa = _mm256_set1_ps(a->s[t * nb + kk]);
                            for (int g = 0; g < 2; g++) {
                                acc[g] = _mm256_fmadd_ps(
                                    _mm256_cvtepi32_ps(_mm256_add_epi32(s[0][g], s[1][g])),
                                    _mm256_mul_ps(_mm256_load_ps(sc[k][0] + 8 * g), da), acc[g]);
                                off[g] =
                                    _mm256_fmadd_ps(_mm256_load_ps(sc[k][2] + 8 * g), sa, off[g]);
                            }
                            continue;
                        }
                        float h0, h1;
                        r16x_half_sums(a, t, kk, &h0, &h1);
                        const __m256 sa0 = _mm256_set1_ps(h0), sa1 = _mm256_set1_ps(h1);
                        for (int g = 0; g < 2; g++) {
                            acc[g] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(s[0][g]),
                                _mm256_mul_ps(_mm256_load_ps(sc[k][0] + 8 * g), da), acc[g]);
                            acc[g] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(s[1][g]),
                                _mm256_mul_ps(_mm256_load_ps(sc[k][1] + 8 * g), da), acc[g]);
                            off[g] = _mm256_fmadd_ps(_mm256_load_ps(sc[k][2] + 8 * g), sa0, off[g]);
                            off[g] = _mm256_fmadd_ps(_mm256_load_ps(sc[k][3] + 8 * g), sa1, off[g]);
                        }
                    }
                    for (int g = 0; g < 2; g++) {
                        _mm256_store_ps(sums[i][g], acc[g]);
                        _mm256_store_ps(sums[i][2 + g], off[g]);
                    }
                }
            }
            for (int i = 0; i < nt; i++)
                for (int g = 0; g < 2; g++)
                    _mm256_storeu_ps(
                        y + (t0 + i) * ldy + R * 16 + 8 * g,
                        _mm256_add_ps(_mm256_load_ps(sums[i][g]), _mm256_load_ps(sums[i][2 + g])));
        }
    }
}
#define R16X_ROWS r16x_avx2_rows
#endif

#if defined(R16X_ROWS)
/* One copy of the loops per type and activation kind (with or without the
 * residual q2), its format's fields constants. Returns 0
 * for a type not in the extended layout. */
static int mm_r16x(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                   const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
#define R16X_CASE(T, P, L, H, C, F, E, Z)                                                          \
    case T:                                                                                        \
        if (a->no_residual)                                                                        \
            R16X_ROWS(0, P, L, H, C, F, E, Z, w, row_bytes, r0, r1, a, n_tokens, y, ldy);          \
        else                                                                                       \
            R16X_ROWS(1, P, L, H, C, F, E, Z, w, row_bytes, r0, r1, a, n_tokens, y, ldy);          \
        return 1;
    switch (type) {
        ZI_R16X_TYPES(R16X_CASE)
    default:
        return 0;
    }
#undef R16X_CASE
}
#endif

#if defined(__AVX2__) && !defined(ZI_HAVE_VNNI)
/* The avx2 table's 16-row entry: the extended layout here, the rest to
 * mm_r16_avx2. (The avx512 table's, mm_r16_any, is in cpu_kernels_amx.h.) */
static void mm_r16_any(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                       const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    if (!mm_r16x(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy))
        mm_r16_avx2(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
}
#endif
