/*
 * cpu_kernels_impl.h - the body of the CPU kernels, compiled once per
 * instruction set (see cpu_kernels.h). Not a normal header: each of
 * kernels_scalar.c, kernels_avx2.c and kernels_avx512.c defines
 * ZI_KERNELS_TABLE and includes this file once; the compiler flags of that
 * file decide which of the #if branches below are live.
 *
 * Every block dot product computes, in integers, sum(wq[i] * aq[i]) for one
 * 32-value block and scales it by the two block scales in float, so every
 * table returns the same integer partial sums; tables differ only in the
 * order of the float additions.
 */
#include <math.h>

#include "cpu_kernels.h"
#include "gguf.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(__AVX512BW__)
#define ZI_HAVE_VNNI 1
#endif

static inline float load_f16(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    return zi_f16_to_f32(h);
#endif
}

#if defined(__AVX512F__)
/* The codes of one block from its 32 values and 1/d: the same IEEE
 * operations as the scalar loop in quantize_block (products,
 * round-to-nearest-even, a difference that is exact), so the codes are
 * bit-identical to it. Returns the 16 lanes' partial sums of 256*q1 + q2. */
static inline __m512i quantize_codes16(__m512 x0, __m512 x1, __m512 id, int8_t *q, int8_t *q2) {
    const __m512 k256 = _mm512_set1_ps(256.0f);
    const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
    __m512i vi[2], ri[2];
    for (int h = 0; h < 2; h++) {
        __m512 xs = _mm512_mul_ps(h ? x1 : x0, id);
        /* Conversions that round to nearest even, as nearbyintf does. */
        vi[h] = _mm512_cvt_roundps_epi32(xs, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 rr = _mm512_mul_ps(_mm512_sub_ps(xs, _mm512_cvtepi32_ps(vi[h])), k256);
        ri[h] = _mm512_min_epi32(
            _mm512_max_epi32(
                _mm512_cvt_roundps_epi32(rr, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nlim),
            lim);
    }
    /* To bytes (all within [-127, 127], so nothing saturates): the packs
     * leave, per 128-bit lane L, four bytes each of vi[0], vi[1], ri[0],
     * ri[1] from their lane L; one permutation puts them in order. */
    __m512i by =
        _mm512_packs_epi16(_mm512_packs_epi32(vi[0], vi[1]), _mm512_packs_epi32(ri[0], ri[1]));
    by = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), by);
    _mm256_storeu_si256((__m256i *)q, _mm512_castsi512_si256(by));
    _mm256_storeu_si256((__m256i *)q2, _mm512_extracti64x4_epi64(by, 1));
    return _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(vi[0], vi[1]), 8),
                            _mm512_add_epi32(ri[0], ri[1]));
}

/*
 * The reduction tree of 16 vectors to one: lane 4 * (s % 4) + s / 4 of the
 * result combines the 16 lanes of v[s] by op, in the tree order of
 * _mm512_reduce_add_ps (halves, quarters, pairs, then the last two): 15 ops
 * and 30 shuffles for 16 results instead of ~9 ops each. Lanes of different
 * v[s] never meet (so a NaN stays in its own lane). op is a constant once
 * inlined.
 */
static inline __attribute__((always_inline)) __m512 tree16(const __m512 *v,
                                                           __m512 (*op)(__m512, __m512)) {
    __m512 w[8], u[4], z[2];
    for (int m = 0; m < 8; m++) /* lanes i + (i+8) of v[2m] | of v[2m+1] */
        w[m] = op(_mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0xEE),
                  _mm512_shuffle_f32x4(v[2 * m], v[2 * m + 1], 0x44));
    for (int m = 0; m < 4; m++) /* then i + (i+4): one quarter per v */
        u[m] = op(_mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0xDD),
                  _mm512_shuffle_f32x4(w[2 * m], w[2 * m + 1], 0x88));
    for (int m = 0; m < 2; m++) /* then i + (i+2) */
        z[m] = op(_mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0xEE),
                  _mm512_shuffle_ps(u[2 * m], u[2 * m + 1], 0x44));
    return op(_mm512_shuffle_ps(z[0], z[1], 0xDD), _mm512_shuffle_ps(z[0], z[1], 0x88));
}

static inline __m512 op_add_ps(__m512 a, __m512 b) {
    return _mm512_add_ps(a, b);
}
static inline __m512 op_max_ps(__m512 a, __m512 b) {
    return _mm512_max_ps(a, b);
}
static inline __m512 op_add_epi32(__m512 a, __m512 b) { /* int32 lanes, exact in any order */
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

/*
 * 16 blocks of quantize_act at once. One block alone is a chain of
 * dependent steps (the maximum's reduction, two divisions, the codes, the
 * sum's reduction: ~70 cycles); here the maxima and sums of 16 blocks are
 * reduced together and the divisions are one vector division each, with
 * the same IEEE operations per block, so the codes and scales are
 * bit-identical to quantize_block's (16 rows of 576 values: 5.4 -> 3.0 us,
 * of 1536: 14.6 -> 6.5 us; one core).
 * Returns the blocks left to quantize_block (a NaN or inf, or a maximum so
 * small that 1/d overflows), bit b for block b.
 */
static inline unsigned quantize_group16(const float *x, int n, int8_t *q, int8_t *q2, float *dv,
                                        float *sv) {
    __m512 m[16];
    unsigned bad = 0;
    for (int s = 0; s < 16; s++) { /* v[s] of tree16 is block b */
        const int b = 4 * (s & 3) + (s >> 2);
        if (b >= n) {
            m[s] = _mm512_setzero_ps();
            continue;
        }
        __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        m[s] = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
        if (_mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q)) bad |= 1u << b;
    }
    const __m512 amax = tree16(m, op_max_ps);
    bad |= (unsigned)(__mmask16) ~(_mm512_cmp_ps_mask(amax, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ) &
                                   _mm512_cmp_ps_mask(amax, _mm512_set1_ps(INFINITY), _CMP_LT_OQ));
    const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    const __m512 dd = _mm512_div_ps(d, _mm512_set1_ps(256.0f));
    _Alignas(64) float id[16];
    _mm512_store_ps(id, _mm512_div_ps(_mm512_set1_ps(1.0f), d));
    __m512 sums[16]; /* int32 lanes */
    for (int s = 0; s < 16; s++) {
        const int b = 4 * (s & 3) + (s >> 2);
        sums[s] = b >= n || bad >> b & 1
                      ? _mm512_setzero_ps()
                      : _mm512_castsi512_ps(quantize_codes16(
                            _mm512_loadu_ps(x + 32 * b), _mm512_loadu_ps(x + 32 * b + 16),
                            _mm512_set1_ps(id[b]), q + 32 * b, q2 + 32 * b));
    }
    bad &= (1u << n) - 1;
    const __mmask16 ok = (__mmask16)((1u << n) - 1 - bad);
    _mm512_mask_storeu_ps(dv, ok, dd);
    const __m512i sum = _mm512_castps_si512(tree16(sums, op_add_epi32));
    _mm512_mask_storeu_ps(sv, ok, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(sum)));
    return bad;
}
#endif

/* One block of 32 values: x = (256*q1 + q2) * d (quant.h). */
static void quantize_block(const float *xb, int8_t *q, int8_t *q2, float *dv, float *sv) {
    int finite;
#if defined(__AVX2__) && !defined(__AVX512F__)
    /* zi_amax_finite, 8 lanes at a time (a maximum is exact in any order). */
    __m256 m = _mm256_setzero_ps(), fin = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    for (int h = 0; h < 4; h++) {
        __m256 v = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), _mm256_loadu_ps(xb + 8 * h));
        fin = _mm256_and_ps(fin, _mm256_cmp_ps(v, _mm256_set1_ps(0x1.fffffep127f), _CMP_LE_OQ));
        m = _mm256_max_ps(m, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    finite = _mm256_movemask_ps(fin) == 0xff;
#else
    const float amax = zi_amax_finite(xb, ZI_QK, &finite);
#endif
    if (!finite || !(amax >= 0x1p-100f)) {
        /* All zero (or so tiny that 1/d overflows), or not finite (a NaN
         * or inf from a broken model): quantize the block as zeros so
         * every later integer conversion stays defined. */
        memset(q, 0, ZI_QK);
        memset(q2, 0, ZI_QK);
        *dv = *sv = 0.0f;
        return;
    }
    float d = amax / 127.0f;
    float id = 1.0f / d;
#if defined(__AVX512F__)
    __m512i sum16 =
        quantize_codes16(_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16), _mm512_set1_ps(id), q, q2);
    int32_t sum = _mm512_reduce_add_epi32(sum16);
#elif defined(__AVX2__)
    /* The loop below, 8 lanes at a time: conversions round to nearest even
     * as nearbyintf does, so the codes are bit-identical to it. */
    __m256i vi[4], ri[4], acc = _mm256_setzero_si256();
    for (int h = 0; h < 4; h++) {
        __m256 xs = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * h), _mm256_set1_ps(id));
        vi[h] = _mm256_cvtps_epi32(xs);
        __m256 rr =
            _mm256_mul_ps(_mm256_sub_ps(xs, _mm256_cvtepi32_ps(vi[h])), _mm256_set1_ps(256.0f));
        ri[h] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(rr), _mm256_set1_epi32(-127)),
                                 _mm256_set1_epi32(127));
        acc = _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_slli_epi32(vi[h], 8), ri[h]));
    }
    /* The packs interleave 128-bit lanes; one permutation restores order. */
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(
                                          _mm256_packs_epi16(_mm256_packs_epi32(vi[0], vi[1]),
                                                             _mm256_packs_epi32(vi[2], vi[3])),
                                          order));
    _mm256_storeu_si256((__m256i *)q2, _mm256_permutevar8x32_epi32(
                                           _mm256_packs_epi16(_mm256_packs_epi32(ri[0], ri[1]),
                                                              _mm256_packs_epi32(ri[2], ri[3])),
                                           order));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    int32_t sum = _mm_cvtsi128_si32(s4);
#else
    int32_t sum = 0;
    for (int i = 0; i < ZI_QK; i++) {
        float xs = xb[i] * id; /* in [-127, 127] */
        int v = (int)nearbyintf(xs);
        /* The residual xs - v is in [-0.5, 0.5]: its 256ths fit int8
         * (an exact +-0.5 gives +-128, clamped: an error of 1/256). */
        int r = (int)nearbyintf((xs - (float)v) * 256.0f);
        r = r > 127 ? 127 : r < -127 ? -127 : r;
        q[i] = (int8_t)v;
        q2[i] = (int8_t)r;
        sum += 256 * v + r;
    }
#endif
    *dv = d / 256.0f;
    *sv = *dv * (float)sum;
}

static void quantize_act(const float *x, const zi_q8_act *a, int64_t row) {
    int8_t *q = a->q + row * a->nb * 2 * ZI_QK;
    int8_t *q2 = q + a->nb * ZI_QK;
    float *dv = a->d + row * a->nb, *sv = a->s + row * a->nb;
#if defined(__AVX512F__)
    for (int64_t k = 0; k < a->nb; k += 16) {
        const int n = a->nb - k < 16 ? (int)(a->nb - k) : 16;
        for (unsigned bad =
                 quantize_group16(x + k * ZI_QK, n, q + k * ZI_QK, q2 + k * ZI_QK, dv + k, sv + k);
             bad; bad &= bad - 1) {
            int64_t b = k + __builtin_ctz(bad);
            quantize_block(x + b * ZI_QK, q + b * ZI_QK, q2 + b * ZI_QK, dv + b, sv + b);
        }
    }
#else
    for (int64_t k = 0; k < a->nb; k++)
        quantize_block(x + k * ZI_QK, q + k * ZI_QK, q2 + k * ZI_QK, dv + k, sv + k);
#endif
}

/*
 * The quantized products. Activations are held as x = (256*q1 + q2) * da
 * (quant.h), so per block k of a row, with q = 256*q1 + q2:
 *   dot = dw*da * sum(u[i]*q[i]) + cw * s
 * where u are the weight's integer codes as unsigned bytes, q the
 * activation's int8 codes, s = da*sum(q), and cw folds in the zero point:
 *   Q4_1: u = nibble,        cw = m            (value = nibble*d + m)
 *   Q4_0: u = nibble,        cw = -8*dw        (value = (nibble - 8)*d)
 *   Q8_0: u = code XOR 0x80, cw = -128*dw      (value = code*d; u = code + 128)
 * Unsigned-by-signed byte products are what VNNI's vpdpbusd (and AVX2's
 * vpmaddubsw) compute.
 */
enum { KQ4_0, KQ4_1, KQ8_0 };

static inline size_t block_bytes(int kind) {
    return kind == KQ4_0 ? sizeof(zi_block_q4_0)
                         : kind == KQ4_1 ? sizeof(zi_block_q4_1) : sizeof(zi_block_q8_0);
}

/* Scale dw and zero-point coefficient cw of the block at p. */
static inline void block_scales(int kind, const uint8_t *p, float *dw, float *cw) {
    uint16_t h;
    memcpy(&h, p, 2);
    *dw = load_f16(h);
    if (kind == KQ4_1) {
        memcpy(&h, p + 2, 2);
        *cw = load_f16(h);
    } else {
        *cw = (kind == KQ4_0 ? -8.0f : -128.0f) * *dw;
    }
}

static inline const uint8_t *block_qs(int kind, const uint8_t *p) {
    return p + (kind == KQ4_1 ? 4 : 2);
}

#if defined(__AVX2__)
/* The 32 codes of one block as unsigned bytes in element order. */
static inline __m256i codes256(int kind, const uint8_t *qs) {
    if (kind == KQ8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)qs),
                                _mm256_set1_epi8((char)0x80));
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}

/* 8 int32 partial sums of u[i] * s[i] (u unsigned bytes, s signed bytes);
 * `wide` when u may exceed 15. */
static inline __m256i dot_u8s8_1(__m256i u, __m256i s, int wide) {
#if defined(ZI_HAVE_VNNI)
    (void)wide;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    /* u <= 255, |s| <= 127: the pairwise i16 sums cannot overflow for
     * nibbles (<= 15); for Q8_0 codes (<= 255) two products can reach
     * 2*255*127 = 64770 > 32767, so split u into its two nibbles first. */
    __m256i ones = _mm256_set1_epi16(1);
    if (!wide) return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones);
    __m256i lo = _mm256_and_si256(u, _mm256_set1_epi8(0x0f));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(u, 4), _mm256_set1_epi8(0x0f));
    __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, s), ones);
    __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, s), ones);
    return _mm256_add_epi32(plo, _mm256_slli_epi32(phi, 4));
#endif
}

/* sum(u * (256*q1 + q2)) in 8 int32 lanes: both halves of the activation. */
static inline __m256i dot_u8s8(__m256i u, const int8_t *q1, const int8_t *q2, int wide) {
    __m256i hi = dot_u8s8_1(u, _mm256_loadu_si256((const __m256i *)q1), wide);
    __m256i lo = dot_u8s8_1(u, _mm256_loadu_si256((const __m256i *)q2), wide);
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), lo);
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* The codes of two consecutive blocks (64 unsigned bytes, element order). */
static inline __m512i codes512(int kind, const uint8_t *pa, const uint8_t *pb) {
    if (kind == KQ8_0) {
        __m512i x = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)block_qs(kind, pa))),
            _mm256_loadu_si256((const __m256i *)block_qs(kind, pb)), 1);
        return _mm512_xor_si512(x, _mm512_set1_epi8((char)0x80));
    }
    __m256i x = _mm256_set_m128i(_mm_loadu_si128((const __m128i *)block_qs(kind, pb)),
                                 _mm_loadu_si128((const __m128i *)block_qs(kind, pa)));
    __m256i m = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(x, m);                         /* [a lo, b lo] */
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m);   /* [a hi, b hi] */
    __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0)); /* [a lo, a hi, b lo, b hi] */
}

/* sum(u * (256*q1 + q2)) for two blocks, 8 int32 lanes per block. */
static inline __m512i isum512(__m512i u, const int8_t *q1, const int8_t *q2) {
    __m512i hi = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                     _mm512_loadu_si512((const void *)q1));
    __m512i lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                     _mm512_loadu_si512((const void *)q2));
    return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
}
#endif

/* Adds one block's integer dot product (plain C) to *sum and its
 * zero-point term to *off. */
static inline void tail_block(int kind, const uint8_t *p, const int8_t *qa, const int8_t *qb,
                              float da, float sa, float *sum, float *off) {
    float dw, cw;
    block_scales(kind, p, &dw, &cw);
    const uint8_t *qs = block_qs(kind, p);
    int32_t isum = 0;
    if (kind == KQ8_0) {
        for (int i = 0; i < ZI_QK; i++) isum += (qs[i] ^ 0x80) * (256 * qa[i] + qb[i]);
    } else {
        for (int i = 0; i < ZI_QK / 2; i++)
            isum += (qs[i] & 0x0f) * (256 * qa[i] + qb[i]) +
                    (qs[i] >> 4) * (256 * qa[i + 16] + qb[i + 16]);
    }
    *sum += dw * da * (float)isum;
    *off += cw * sa;
}

/* dot(weight row, activation row) for one row of nb blocks. dot_row4 below
 * must produce bit-identical results for each of its tokens (same float
 * operations in the same order), so that a token's logits never depend on
 * what else is in its batch. */
static inline float dot_row(int kind, const uint8_t *w, const int8_t *q, const int8_t *q2,
                            const float *da, const float *sa, int64_t nb) {
    const size_t bb = block_bytes(kind);
    float off = 0.0f;
    int64_t k = 0;
#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
    __m512 acc = _mm512_setzero_ps();
    /* Groups of 16 blocks: one gather fetches the 16 block headers (d, and m
     * for Q4_1, are the first 4 bytes of a block), so the scale and
     * zero-point arithmetic is done 16 lanes at a time instead of per block. */
    const __m512i hdr_off = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)bb));
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 offv = _mm512_setzero_ps();
    for (; k + 16 <= nb; k += 16) {
        const uint8_t *g = w + k * bb;
        __m512i hdr = _mm512_i32gather_epi32(hdr_off, (const void *)g, 1);
        __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(da + k));
        __m512 cw = kind == KQ4_1
                        ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)))
                        : _mm512_mul_ps(dw, _mm512_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
        offv = _mm512_fmadd_ps(cw, _mm512_loadu_ps(sa + k), offv);
        for (int j = 0; j < 16; j += 2) {
            const uint8_t *pa = g + j * bb;
            __m512i u = codes512(kind, pa, pa + bb);
            __m512 p = _mm512_cvtepi32_ps(
                isum512(u, q + (k + j) * ZI_QK, q2 + (k + j) * ZI_QK));
            __m512 sc = _mm512_permutexvar_ps(_mm512_add_epi32(pair_idx, _mm512_set1_epi32(j)),
                                              scale);
            acc = _mm512_fmadd_ps(p, sc, acc);
        }
    }
    off += _mm512_reduce_add_ps(offv);
    for (; k + 2 <= nb; k += 2) {
        const uint8_t *pa = w + k * bb, *pb = pa + bb;
        float dwa, cwa, dwb, cwb;
        block_scales(kind, pa, &dwa, &cwa);
        block_scales(kind, pb, &dwb, &cwb);
        __m512i u = codes512(kind, pa, pb);
        __m512 p = _mm512_cvtepi32_ps(isum512(u, q + k * ZI_QK, q2 + k * ZI_QK));
        __m512 sc = _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castps_pd(_mm512_set1_ps(dwa * da[k])),
            _mm256_castps_pd(_mm256_set1_ps(dwb * da[k + 1])), 1));
        acc = _mm512_fmadd_ps(p, sc, acc);
        off += cwa * sa[k] + cwb * sa[k + 1];
    }
    float sum = _mm512_reduce_add_ps(acc);
#elif defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (; k < nb; k++) {
        const uint8_t *p = w + k * bb;
        float dw, cw;
        block_scales(kind, p, &dw, &cw);
        __m256i u = codes256(kind, block_qs(kind, p));
        __m256 prod =
            _mm256_cvtepi32_ps(dot_u8s8(u, q + k * ZI_QK, q2 + k * ZI_QK, kind == KQ8_0));
        acc = _mm256_fmadd_ps(prod, _mm256_set1_ps(dw * da[k]), acc);
        off += cw * sa[k];
    }
    float sum = hsum256(acc);
#else
    float sum = 0.0f;
#endif
    for (; k < nb; k++) /* scalar: the whole row, or the odd last block */
        tail_block(kind, w + k * bb, q + k * ZI_QK, q2 + k * ZI_QK, da[k], sa[k], &sum, &off);
    return sum + off;
}

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
#define ZI_HAVE_ROW4 1
/* dot(weight row, activation rows t0..t0+3): the weight codes and block
 * headers are decoded once and used for four tokens (prefill, batches). */
static inline void dot_row4(int kind, const uint8_t *w, const zi_q8_act *a, int t0, float *out) {
    const size_t bb = block_bytes(kind);
    const int64_t nb = a->nb;
    const int8_t *q[4], *q2[4];
    const float *da[4], *sa[4];
    __m512 acc[4], offv[4];
    float off[4];
    for (int i = 0; i < 4; i++) {
        q[i] = a->q + (t0 + i) * nb * 2 * ZI_QK;
        q2[i] = q[i] + nb * ZI_QK;
        da[i] = a->d + (t0 + i) * nb;
        sa[i] = a->s + (t0 + i) * nb;
        acc[i] = offv[i] = _mm512_setzero_ps();
        off[i] = 0.0f;
    }
    const __m512i hdr_off = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)bb));
    const __m512i pair_idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    int64_t k = 0;
    for (; k + 16 <= nb; k += 16) {
        const uint8_t *g = w + k * bb;
        __m512i hdr = _mm512_i32gather_epi32(hdr_off, (const void *)g, 1);
        __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hdr));
        __m512 cw = kind == KQ4_1
                        ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16)))
                        : _mm512_mul_ps(dw, _mm512_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
        __m512 scale[4];
        for (int i = 0; i < 4; i++) {
            scale[i] = _mm512_mul_ps(dw, _mm512_loadu_ps(da[i] + k));
            offv[i] = _mm512_fmadd_ps(cw, _mm512_loadu_ps(sa[i] + k), offv[i]);
        }
        for (int j = 0; j < 16; j += 2) {
            const uint8_t *pa = g + j * bb;
            __m512i u = codes512(kind, pa, pa + bb);
            __m512i idx = _mm512_add_epi32(pair_idx, _mm512_set1_epi32(j));
            for (int i = 0; i < 4; i++) {
                __m512 p = _mm512_cvtepi32_ps(
                    isum512(u, q[i] + (k + j) * ZI_QK, q2[i] + (k + j) * ZI_QK));
                acc[i] = _mm512_fmadd_ps(p, _mm512_permutexvar_ps(idx, scale[i]), acc[i]);
            }
        }
    }
    for (int i = 0; i < 4; i++) off[i] += _mm512_reduce_add_ps(offv[i]);
    for (; k + 2 <= nb; k += 2) {
        const uint8_t *pa = w + k * bb, *pb = pa + bb;
        float dwa, cwa, dwb, cwb;
        block_scales(kind, pa, &dwa, &cwa);
        block_scales(kind, pb, &dwb, &cwb);
        __m512i u = codes512(kind, pa, pb);
        for (int i = 0; i < 4; i++) {
            __m512 p = _mm512_cvtepi32_ps(isum512(u, q[i] + k * ZI_QK, q2[i] + k * ZI_QK));
            __m512 sc = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_set1_ps(dwa * da[i][k])),
                _mm256_castps_pd(_mm256_set1_ps(dwb * da[i][k + 1])), 1));
            acc[i] = _mm512_fmadd_ps(p, sc, acc[i]);
            off[i] += cwa * sa[i][k] + cwb * sa[i][k + 1];
        }
    }
    for (int i = 0; i < 4; i++) {
        float sum = _mm512_reduce_add_ps(acc[i]);
        for (int64_t kk = k; kk < nb; kk++) /* an odd last block */
            tail_block(kind, w + kk * bb, q[i] + kk * ZI_QK, q2[i] + kk * ZI_QK, da[i][kk],
                       sa[i][kk], &sum, &off[i]);
        out[i] = sum + off[i];
    }
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* Four bytes of an activation, broadcast to every lane. */
static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/*
 * Products over rows in the 16-row layout (repack.h), r0 and r1 multiples
 * of 16. For each 16 rows and up to 4 tokens at a time, every block column
 * is decoded once (8 code chunks, the 16 scales), then per token 16
 * vpdpbusd (both activation halves, four bytes broadcast) leave each row's
 * integer block sum in its lane; one conversion and one FMA scale them, and
 * the 16 lanes end as the 16 outputs. Each token's float operations are the
 * same whatever else is in the batch.
 */
static void mm_r16_vnni(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                        const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int kind = type == ZI_TYPE_Q4_0 ? KQ4_0 : type == ZI_TYPE_Q4_1 ? KQ4_1 : KQ8_0;
    const int64_t nb = a->nb;
    const size_t gb = 16 * block_bytes(kind);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int t0 = 0; t0 < n_tokens; t0 += 4) {
            const int nt = n_tokens - t0 < 4 ? n_tokens - t0 : 4;
            __m512 acc[4], offv[4];
            for (int i = 0; i < 4; i++) acc[i] = offv[i] = _mm512_setzero_ps();
            for (int64_t k = 0; k < nb; k++) {
                const uint8_t *G = base + (size_t)k * gb;
                /* The 16 rows' next columns: prefetch ahead of the stream. */
                for (size_t off = 0; off < gb; off += 64)
                    _mm_prefetch((const char *)(G + 8 * gb + off), _MM_HINT_T0);
                __m512i c[8];
                if (kind == KQ8_0) {
                    for (int j = 0; j < 8; j++) c[j] = _mm512_loadu_si512((const void *)(G + 64 * j));
                } else {
                    for (int p = 0; p < 4; p++) {
                        __m512i x = _mm512_loadu_si512((const void *)(G + 64 * p));
                        c[2 * p] = _mm512_and_si512(x, m4);
                        c[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
                    }
                }
                const uint8_t *sc = G + (kind == KQ8_0 ? 512 : 256);
                __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sc));
                __m512 cw = kind == KQ4_1
                                ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sc + 32)))
                                : _mm512_mul_ps(dw, _mm512_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
                for (int i = 0; i < nt; i++) {
                    const int64_t t = t0 + i;
                    const int8_t *q1 = a->q + t * nb * 2 * ZI_QK + k * ZI_QK;
                    const int8_t *q2 = q1 + nb * ZI_QK;
                    /* Four independent chains (even/odd chunks of each half);
                     * integer sums, so the split changes no bit. */
                    __m512i hi0 = _mm512_setzero_si512(), hi1 = hi0, lo0 = hi0, lo1 = hi0;
                    for (int j = 0; j < 8; j += 2) {
                        hi0 = _mm512_dpbusd_epi32(hi0, c[j], bcast4(q1 + 4 * j));
                        hi1 = _mm512_dpbusd_epi32(hi1, c[j + 1], bcast4(q1 + 4 * j + 4));
                        lo0 = _mm512_dpbusd_epi32(lo0, c[j], bcast4(q2 + 4 * j));
                        lo1 = _mm512_dpbusd_epi32(lo1, c[j + 1], bcast4(q2 + 4 * j + 4));
                    }
                    __m512i hi = _mm512_add_epi32(hi0, hi1), lo = _mm512_add_epi32(lo0, lo1);
                    __m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
                    acc[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[t * nb + k])),
                                             acc[i]);
                    offv[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(a->s[t * nb + k]), offv[i]);
                }
            }
            for (int i = 0; i < nt; i++)
                _mm512_storeu_ps(y + (t0 + i) * ldy + R * 16, _mm512_add_ps(acc[i], offv[i]));
        }
    }
}
#endif

#if defined(__AVX2__) && !defined(ZI_HAVE_VNNI)
/*
 * Products over rows in the 16-row layout (repack.h) with AVX2 alone (no
 * VNNI). vpmaddubsw multiplies unsigned codes by signed activation bytes
 * and adds pairs into int16; for 4-bit codes (<= 15) a pair is at most
 * 2*15*127 = 3810 in size, so a whole block's 8 code chunks add up in int16
 * (<= 30480) before one vpmaddwd widens them. Q8_0 codes (<= 255) would
 * overflow that: they are widened to int16 and multiplied by the int16
 * activation 256*q1 + q2 with vpmaddwd. Each 64-byte chunk is two vectors
 * of 8 rows (its halves), so one broadcast activation serves 16 rows. On a
 * 2-core Zen 3, 16 streams of the default model: products ~110 -> ~31 ms a
 * decode step against dot_row per row and token.
 *
 * The integer sums are the exact ones of mm_r16_vnni and the float steps
 * after them the same operations in the same order, so the outputs are
 * bit-identical to the AVX-512 table's, and a token's outputs do not depend
 * on the other tokens of its batch.
 *
 * Per 16-row group the block columns are first decoded to bytes (and the
 * scales to floats) in a buffer that stays in L1, chunk by chunk, then each
 * token runs over the chunk; tokens go in passes of ZI_R16_PASS whose float
 * sums wait in a stack array between chunks.
 */
#define ZI_R16_PASS 64
#define ZI_R16_CODE_BYTES 16384

/* Four activation bytes in every lane, as a float broadcast from memory:
 * on Zen 3, vpmaddubsw beside it ran ~2x as fast as beside vpbroadcastd. */
static inline __m256i bcast4_ps(const int8_t *p) {
    return _mm256_castps_si256(_mm256_broadcast_ss((const float *)(const void *)p));
}

/* Block column k's codes and scales, to code[] and sc[]. Q4: per half
 * (rows 0-7, 8-15), the 8 chunks of 4 codes of each row as bytes (chunk j
 * is elements 4j..4j+3). Q8_0: per half and chunk, two vectors of the
 * codes as int16, rows 0, 1, 4, 5 in the first and 2, 3, 6, 7 in the
 * second (vphaddd of the two puts rows 0-7 in order). */
static inline void r16_decode(int kind, const uint8_t *G, size_t gb, uint8_t *code, float *sc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (size_t off = 0; off < gb; off += 64) /* the stream ahead */
        _mm_prefetch((const char *)(G + 8 * gb + off), _MM_HINT_T0);
    for (int h = 0; h < 2; h++) {
        if (kind == KQ8_0) {
            uint8_t *d = code + h * 512;
            for (int c = 0; c < 8; c++) {
                __m128i lo = _mm_loadu_si128((const __m128i *)(G + 64 * c + 32 * h));
                __m128i hi = _mm_loadu_si128((const __m128i *)(G + 64 * c + 32 * h + 16));
                _mm256_store_si256((__m256i *)(d + 64 * c),
                                   _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(lo, hi)));
                _mm256_store_si256((__m256i *)(d + 64 * c + 32),
                                   _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(lo, hi)));
            }
            continue;
        }
        uint8_t *d = code + h * 256;
        for (int p = 0; p < 4; p++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(G + 64 * p + 32 * h));
            _mm256_store_si256((__m256i *)(d + 64 * p), _mm256_and_si256(x, m4));
            _mm256_store_si256((__m256i *)(d + 64 * p + 32),
                               _mm256_and_si256(_mm256_srli_epi16(x, 4), m4));
        }
    }
    const uint8_t *s = G + (kind == KQ8_0 ? 512 : 256);
    for (int h = 0; h < 2; h++) {
        __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16 * h)));
        __m256 cw = kind == KQ4_1
                        ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32 + 16 * h)))
                        : _mm256_mul_ps(dw, _mm256_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
        _mm256_store_ps(sc + 8 * h, dw);
        _mm256_store_ps(sc + 16 + 8 * h, cw);
    }
}

/* The integer block sums sum(u * (256*q1 + q2)) of both halves (rows 0-7,
 * 8-15) for one token, from decoded codes c. res == 0 (int8 activations,
 * zi_q8_act.no_residual: q2 is all zero) skips the q2 products of Q4,
 * half its multiplies; Q8_0's int16 activation holds a zero q2 anyway. */
static inline __attribute__((always_inline)) void r16_isum(int kind, int res, const uint8_t *c,
                                                           const int8_t *q1, const int8_t *q2,
                                                           const int16_t *q16, __m256i *s0,
                                                           __m256i *s1) {
    const __m256i z = _mm256_setzero_si256();
    const __m256i k256 = _mm256_set1_epi16(256), ones = _mm256_set1_epi16(1);
    if (kind != KQ8_0 && !res) {
        __m256i h0 = z, h1 = z;
        for (int j = 0; j < 8; j++) {
            const __m256i b1 = bcast4_ps(q1 + 4 * j);
            h0 = _mm256_add_epi16(
                h0, _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(c + 32 * j)), b1));
            h1 = _mm256_add_epi16(
                h1,
                _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(c + 256 + 32 * j)), b1));
            __asm__("" : "+x"(h0), "+x"(h1));
        }
        *s0 = _mm256_madd_epi16(h0, k256);
        *s1 = _mm256_madd_epi16(h1, k256);
        return;
    }
    if (kind != KQ8_0) {
        __m256i h0 = z, h1 = z, l0 = z, l1 = z; /* q1 and q2 sums of each half */
        for (int j = 0; j < 8; j++) {
            const __m256i b1 = bcast4_ps(q1 + 4 * j), b2 = bcast4_ps(q2 + 4 * j);
            const __m256i c0 = _mm256_load_si256((const __m256i *)(c + 32 * j));
            const __m256i c1 = _mm256_load_si256((const __m256i *)(c + 256 + 32 * j));
            h0 = _mm256_add_epi16(h0, _mm256_maddubs_epi16(c0, b1));
            h1 = _mm256_add_epi16(h1, _mm256_maddubs_epi16(c1, b1));
            l0 = _mm256_add_epi16(l0, _mm256_maddubs_epi16(c0, b2));
            l1 = _mm256_add_epi16(l1, _mm256_maddubs_epi16(c1, b2));
            /* Keeps each sum a chain in a register: GCC otherwise reorders
             * the additions into a tree over all 32 products, which spills. */
            __asm__("" : "+x"(h0), "+x"(h1), "+x"(l0), "+x"(l1));
        }
        *s0 = _mm256_add_epi32(_mm256_madd_epi16(h0, k256), _mm256_madd_epi16(l0, ones));
        *s1 = _mm256_add_epi32(_mm256_madd_epi16(h1, k256), _mm256_madd_epi16(l1, ones));
        return;
    }
    /* Q8_0 (codes up to 255) on the int16 activation q16 = 256*q1 + q2:
     * vpmaddwd pairs are at most 2*255*32639 in size, a block's 16 of them
     * fit int32. Lanes are (row, pair of columns) until the vphaddd. */
    __m256i s[2];
    for (int h = 0; h < 2; h++) {
        __m256i a0 = z, a1 = z;
        for (int j = 0; j < 8; j++) {
            const __m256i b = _mm256_castpd_si256(
                _mm256_broadcast_sd((const double *)(const void *)(q16 + 4 * j)));
            a0 = _mm256_add_epi32(
                a0,
                _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(c + 512 * h + 64 * j)), b));
            a1 = _mm256_add_epi32(
                a1, _mm256_madd_epi16(
                        _mm256_load_si256((const __m256i *)(c + 512 * h + 64 * j + 32)), b));
            __asm__("" : "+x"(a0), "+x"(a1));
        }
        s[h] = _mm256_hadd_epi32(a0, a1);
    }
    *s0 = s[0];
    *s1 = s[1];
}

static inline __attribute__((always_inline)) void
r16_avx2_rows(int kind, int res, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
              const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int64_t nb = a->nb;
    const size_t gb = 16 * block_bytes(kind);
    const size_t cb = kind == KQ8_0 ? 1024 : 512; /* decoded bytes per block column */
    const int64_t kc = ZI_R16_CODE_BYTES / cb;    /* block columns per decoded chunk */
    _Alignas(32) uint8_t code[ZI_R16_CODE_BYTES];
    _Alignas(32) float sc[ZI_R16_CODE_BYTES / 512][32]; /* per column: dw[16], cw[16] */
    _Alignas(32) float sums[ZI_R16_PASS][4][8];         /* per token: acc h0, h1, off h0, h1 */
    _Alignas(32) int16_t q16[ZI_R16_CODE_BYTES / 1024][ZI_QK]; /* Q8_0: a token's activations */
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int t0 = 0; t0 < n_tokens; t0 += ZI_R16_PASS) {
            const int nt = n_tokens - t0 < ZI_R16_PASS ? n_tokens - t0 : ZI_R16_PASS;
            memset(sums, 0, sizeof sums[0] * (size_t)nt);
            for (int64_t k0 = 0; k0 < nb; k0 += kc) {
                const int64_t kn = nb - k0 < kc ? nb - k0 : kc;
                for (int64_t k = 0; k < kn; k++)
                    r16_decode(kind, base + (size_t)(k0 + k) * gb, gb, code + k * cb, sc[k]);
                for (int i = 0; i < nt; i++) {
                    const int64_t t = t0 + i;
                    const int8_t *q1 = a->q + t * nb * 2 * ZI_QK, *q2 = q1 + nb * ZI_QK;
                    __m256 acc0 = _mm256_load_ps(sums[i][0]), acc1 = _mm256_load_ps(sums[i][1]);
                    __m256 off0 = _mm256_load_ps(sums[i][2]), off1 = _mm256_load_ps(sums[i][3]);
                    for (int64_t k = 0; kind == KQ8_0 && k < kn; k++) /* q16 = 256*q1 + q2 */
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
                        __m256i s0, s1;
                        r16_isum(kind, res, code + k * cb, q1 + kk * ZI_QK, q2 + kk * ZI_QK,
                                 q16[kind == KQ8_0 ? k : 0], &s0, &s1); /* q16: Q8_0 only */
                        const __m256 da = _mm256_broadcast_ss(a->d + t * nb + kk);
                        const __m256 sa = _mm256_broadcast_ss(a->s + t * nb + kk);
                        acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0),
                                               _mm256_mul_ps(_mm256_load_ps(sc[k]), da), acc0);
                        acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1),
                                               _mm256_mul_ps(_mm256_load_ps(sc[k] + 8), da), acc1);
                        off0 = _mm256_fmadd_ps(_mm256_load_ps(sc[k] + 16), sa, off0);
                        off1 = _mm256_fmadd_ps(_mm256_load_ps(sc[k] + 24), sa, off1);
                    }
                    _mm256_store_ps(sums[i][0], acc0);
                    _mm256_store_ps(sums[i][1], acc1);
                    _mm256_store_ps(sums[i][2], off0);
                    _mm256_store_ps(sums[i][3], off1);
                }
            }
            for (int i = 0; i < nt; i++)
                for (int h = 0; h < 2; h++)
                    _mm256_storeu_ps(
                        y + (t0 + i) * ldy + R * 16 + 8 * h,
                        _mm256_add_ps(_mm256_load_ps(sums[i][h]), _mm256_load_ps(sums[i][2 + h])));
        }
    }
}

/* One copy of the loops per weight kind and activation kind, so that both
 * are constants. */
static void mm_r16_avx2(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                        const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int res = !a->no_residual;
    if (type == ZI_TYPE_Q4_1 && res)
        r16_avx2_rows(KQ4_1, 1, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
    else if (type == ZI_TYPE_Q4_1)
        r16_avx2_rows(KQ4_1, 0, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
    else if (type == ZI_TYPE_Q4_0 && res)
        r16_avx2_rows(KQ4_0, 1, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
    else if (type == ZI_TYPE_Q4_0)
        r16_avx2_rows(KQ4_0, 0, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
    else
        r16_avx2_rows(KQ8_0, 1, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__) && defined(__x86_64__) &&                       \
    defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ZI_HAVE_AMX 1
#include <cpuid.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ZI_AMX_FN __attribute__((target("amx-tile,amx-int8")))
/* Fewer tokens than this stay on the VNNI kernel: a chunk costs the tile
 * unit about the same for 2 tokens as for 8 (~40 ns per 16 x 32 block), so
 * AMX wins from ~4 tokens (Q4_1 576x3072: 2 tokens 8.3 vs 6.3 ns per row
 * block and token, 4: 4.8 vs 5.4, 16: 3.3 vs 5.4). */
#define ZI_AMX_MIN_TOKENS 4

/*
 * AMX-INT8 (Sapphire Rapids and later) for batched products in the 16-row
 * layout. The chunk of a block column is exactly the B operand's VNNI layout
 * (row r = chunk r: four codes of each of 16 rows), and the activation rows
 * q1, q2 of consecutive tokens lie nb*32 bytes apart, so one tile load
 * stacks [q1 t0, q2 t0, q1 t1, ...] for block k: one TDPBSUD (M = 2 x up to
 * 8 tokens, K = 32, N = 16 rows) leaves in C row 2i the q1 sums and in row
 * 2i+1 the q2 sums of token i, each lane one weight row: the same exact
 * integers as the VNNI kernel, so the float steps after them (the same ones,
 * in the same order) give bit-identical outputs. The vector units are left
 * with the per-token float work: ~6 ops per token and block instead of ~24.
 */

/* Linux keeps the tile state off until a process asks (ARCH_REQ_XCOMP_PERM);
 * asked once. ZINFER_CPU_AMX=0 keeps the VNNI kernel (for comparisons). */
static int amx_usable(void) {
    static int state; /* 0: not asked yet, 1: usable, -1: not */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    const char *env = getenv("ZINFER_CPU_AMX");
    unsigned eax, ebx, ecx, edx;
    int ok = !(env && strcmp(env, "0") == 0) && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
             (edx >> 24 & 1) && (edx >> 25 & 1) && /* AMX-TILE, AMX-INT8 */
             syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    __atomic_store_n(&state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
}

typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Scratch for a ring of 4 blocks in flight: C results (16 x 64 bytes) and
 * unpacked Q4 block columns (8 x 64 bytes). */
typedef struct amx_scratch {
    _Alignas(64) int32_t c[4][16][16];
    _Alignas(64) uint8_t b[4][512];
} amx_scratch;

/* How many blocks the tile unit runs ahead of the float steps that read its
 * results back (a tile store is not forwarded to loads right away). */
#define ZI_AMX_AHEAD 2

/* Q4 codes of block column kk as bytes, into ring slot kk % 4 (one issue
 * ahead of its tile load, so the stores have reached the cache), unless the
 * caller unpacked the whole group (ub). */
#define AMX_UNPACK(kk)                                                                             \
    do {                                                                                           \
        if (kind != KQ8_0 && !ub && (kk) < nb) {                                                   \
            const uint8_t *G_ = base + (size_t)(kk) * gb;                                         \
            uint8_t *d_ = sc->b[(kk) & 3];                                                         \
            for (int p_ = 0; p_ < 4; p_++) {                                                       \
                __m512i x_ = _mm512_loadu_si512((const void *)(G_ + 64 * p_));                     \
                _mm512_store_si512((void *)(d_ + 128 * p_), _mm512_and_si512(x_, m4));             \
                _mm512_store_si512((void *)(d_ + 128 * p_ + 64),                                   \
                                   _mm512_and_si512(_mm512_srli_epi16(x_, 4), m4));                \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Integer sums of block column kk into C ring slot kk % 4. Tiles: 0/1 C, 2/3
 * A (activations), 4/5 B (weights), by the parity of kk. */
#define AMX_ISSUE(CT, AT, BT, kk)                                                                  \
    do {                                                                                           \
        const uint8_t *G_ = base + (size_t)(kk) * gb;                                             \
        for (size_t o_ = 0; o_ < gb; o_ += 64)                                                     \
            _mm_prefetch((const char *)(G_ + 8 * gb + o_), _MM_HINT_T0);                           \
        __asm__ volatile("" ::: "memory"); /* the tile load reads unpacked codes */                \
        _tile_loadd(AT, qa + (size_t)(kk) * ZI_QK, astride);                                      \
        _tile_loadd(BT,                                                                            \
                    kind == KQ8_0 ? (const void *)G_                                               \
                    : ub          ? (const void *)(ub + (size_t)(kk) * 512)                       \
                                  : (const void *)sc->b[(kk) & 3],                                 \
                    64);                                                                           \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
        _tile_stored(CT, sc->c[(kk) & 3], 64);                                                     \
    } while (0)

#define AMX_STEP(kk)                                                                               \
    do {                                                                                           \
        AMX_UNPACK((kk) + 1);                                                                      \
        if ((kk) & 1)                                                                              \
            AMX_ISSUE(1, 3, 5, kk);                                                                \
        else                                                                                       \
            AMX_ISSUE(0, 2, 4, kk);                                                                \
    } while (0)

/* The float steps of mm_r16_vnni for block k of NT tokens, from C rows. */
static inline __attribute__((always_inline)) void amx_finish_block(int kind, const uint8_t *G,
                                                                   const int32_t *c,
                                                                   const zi_q8_act *a, int t0,
                                                                   int NT, int64_t k, __m512 *acc,
                                                                   __m512 *offv) {
    const int64_t nb = a->nb;
    const uint8_t *scp = G + (kind == KQ8_0 ? 512 : 256);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)scp));
    __m512 cw = kind == KQ4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scp + 32)))
                              : _mm512_mul_ps(dw, _mm512_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
    for (int i = 0; i < NT; i++) {
        const int64_t t = t0 + i;
        __m512i hi = _mm512_load_si512((const void *)(c + 32 * i));
        __m512i lo = _mm512_load_si512((const void *)(c + 32 * i + 16));
        __m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
        acc[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[t * nb + k])), acc[i]);
        offv[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(a->s[t * nb + k]), offv[i]);
    }
}

/* Rows 16R..16R+15 for tokens t0..t0+NT-1 (NT <= 8, the tile rows / 2). */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_group(int kind, const uint8_t *base, const uint8_t *ub, const zi_q8_act *a, int t0, int NT,
          float *y, int64_t ldy, int64_t row0, amx_scratch *sc) {
    const int64_t nb = a->nb;
    const size_t gb = 16 * block_bytes(kind);
    const size_t astride = (size_t)nb * ZI_QK; /* q1 t, q2 t, q1 t+1, ... */
    const int8_t *qa = a->q + (size_t)t0 * nb * 2 * ZI_QK;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[8], offv[8];
    for (int i = 0; i < NT; i++) acc[i] = offv[i] = _mm512_setzero_ps();
    /* The tile unit runs ZI_AMX_AHEAD blocks ahead of the float steps. */
    AMX_UNPACK(0);
    for (int64_t k = 0; k < ZI_AMX_AHEAD && k < nb; k++) AMX_STEP(k);
    for (int64_t k = 0; k < nb; k++) {
        if (k + ZI_AMX_AHEAD < nb) AMX_STEP(k + ZI_AMX_AHEAD);
        amx_finish_block(kind, base + (size_t)k * gb, sc->c[k & 3][0], a, t0, NT, k, acc, offv);
    }
    for (int i = 0; i < NT; i++)
        _mm512_storeu_ps(y + (t0 + i) * ldy + row0, _mm512_add_ps(acc[i], offv[i]));
}

/* mm_r16 on AMX. Tokens go in chunks of NT = ceil(n / chunks) <= 8 (the
 * tile shape is fixed per call); the last chunk starts at n - NT and may
 * redo a few tokens of the one before, which rewrites the same values. */
static ZI_AMX_FN void mm_r16_amx(int type, const uint8_t *w, size_t row_bytes, int64_t r0,
                                 int64_t r1, const zi_q8_act *a, int n_tokens, float *y,
                                 int64_t ldy) {
    const int kind = type == ZI_TYPE_Q4_0 ? KQ4_0 : type == ZI_TYPE_Q4_1 ? KQ4_1 : KQ8_0;
    const int chunks = (n_tokens + 7) / 8, NT = (n_tokens + chunks - 1) / chunks;
    _Alignas(64) amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = (uint8_t)(2 * NT), cfg.colsb[i] = 64;     /* C */
        cfg.rows[2 + i] = (uint8_t)(2 * NT), cfg.colsb[2 + i] = 32; /* A */
        cfg.rows[4 + i] = 8, cfg.colsb[4 + i] = 64;             /* B */
    }
    _tile_loadconfig(&cfg);
    amx_scratch sc;
    /* Q4 codes of a whole group as bytes, once for all chunks (most products:
     * up to 2048 columns); wider rows unpack block by block in the ring. */
    _Alignas(64) uint8_t ubuf[64][512];
    const int64_t nb = a->nb;
    const uint8_t *ub = kind != KQ8_0 && nb <= 64 ? ubuf[0] : NULL;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int64_t k = 0; ub && k < nb; k++) {
            const uint8_t *G = base + (size_t)k * 16 * block_bytes(kind);
            for (int p = 0; p < 4; p++) {
                __m512i x = _mm512_loadu_si512((const void *)(G + 64 * p));
                _mm512_store_si512((void *)(ubuf[k] + 128 * p), _mm512_and_si512(x, m4));
                _mm512_store_si512((void *)(ubuf[k] + 128 * p + 64),
                                   _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
            }
        }
        for (int c = 0; c < chunks; c++) {
            int t0 = c == chunks - 1 ? n_tokens - NT : c * NT;
            switch (NT) { /* constant token counts: accumulators stay in registers */
            case 1: amx_group(kind, base, ub, a, t0, 1, y, ldy, R * 16, &sc); break;
            case 2: amx_group(kind, base, ub, a, t0, 2, y, ldy, R * 16, &sc); break;
            case 3: amx_group(kind, base, ub, a, t0, 3, y, ldy, R * 16, &sc); break;
            case 4: amx_group(kind, base, ub, a, t0, 4, y, ldy, R * 16, &sc); break;
            case 5: amx_group(kind, base, ub, a, t0, 5, y, ldy, R * 16, &sc); break;
            case 6: amx_group(kind, base, ub, a, t0, 6, y, ldy, R * 16, &sc); break;
            case 7: amx_group(kind, base, ub, a, t0, 7, y, ldy, R * 16, &sc); break;
            default: amx_group(kind, base, ub, a, t0, 8, y, ldy, R * 16, &sc); break;
            }
        }
    }
    _tile_release();
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* Batches go to the tile unit where there is one; a token or a few (decode)
 * stay on the VNNI kernel, which is bound by reading the weights then. */
static void mm_r16(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                   const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
#if defined(ZI_HAVE_AMX)
    if (n_tokens >= ZI_AMX_MIN_TOKENS && amx_usable()) {
        mm_r16_amx(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
        return;
    }
#endif
    mm_r16_vnni(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
}
#endif

static inline void mm_quant(int kind, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                            const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int64_t nb = a->nb;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = w + (size_t)r * row_bytes;
        int t = 0;
#if defined(ZI_HAVE_ROW4)
        for (; t + 4 <= n_tokens; t += 4) {
            float out[4];
            dot_row4(kind, row, a, t, out);
            for (int i = 0; i < 4; i++) y[(t + i) * ldy + r] = out[i];
        }
#endif
        for (; t < n_tokens; t++) {
            const int8_t *q = a->q + t * nb * 2 * ZI_QK;
            y[t * ldy + r] = dot_row(kind, row, q, q + nb * ZI_QK, a->d + t * nb, a->s + t * nb, nb);
        }
    }
}

#define ZI_DEFINE_MM(NAME, KIND)                                                                   \
    static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,                  \
                     const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {                   \
        mm_quant(KIND, w, row_bytes, r0, r1, a, n_tokens, y, ldy);                                \
    }

ZI_DEFINE_MM(mm_q4_0, KQ4_0)
ZI_DEFINE_MM(mm_q4_1, KQ4_1)
ZI_DEFINE_MM(mm_q8_0, KQ8_0)

static float dot_f32(const float *a, const float *b, int64_t n) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        return _mm512_reduce_add_ps(acc);
    }
#endif
#if defined(__AVX2__)
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
#else
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
#endif
}

static float dot_f16_row(const uint16_t *w, const float *x, int64_t n) {
#if defined(__AVX2__) && defined(__F16C__)
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + i)));
        acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), acc);
    }
    float s = hsum256(acc);
    for (; i < n; i++) s += zi_f16_to_f32(w[i]) * x[i];
    return s;
#else
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += zi_f16_to_f32(w[i]) * x[i];
    return s;
#endif
}

static float dot_bf16_row(const uint16_t *w, const float *x, int64_t n) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i)));
        __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
        acc = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i), acc);
    }
    float s = hsum256(acc);
    for (; i < n; i++) s += zi_bf16_to_f32(w[i]) * x[i];
    return s;
#else
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += zi_bf16_to_f32(w[i]) * x[i];
    return s;
#endif
}

#define ZI_DEFINE_MMF(NAME, ELEM, DOT)                                                             \
    static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,  \
                     int64_t n, int n_tokens, float *y, int64_t ldy) {                            \
        for (int64_t r = r0; r < r1; r++) {                                                       \
            const ELEM *row = (const ELEM *)(const void *)(w + (size_t)r * row_bytes);            \
            for (int t = 0; t < n_tokens; t++) y[t * ldy + r] = DOT(row, x + t * n, n);          \
        }                                                                                         \
    }

ZI_DEFINE_MMF(mm_f32, float, dot_f32)
ZI_DEFINE_MMF(mm_f16, uint16_t, dot_f16_row)
ZI_DEFINE_MMF(mm_bf16, uint16_t, dot_bf16_row)

static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale_f32(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

/* The offset of position j's row (of hd values) in a paged cache whose
 * blocks lie `stride` apart, and of its K scale (cpu_kernels.h). */
#define ZI_KV_ROW(kv, j, stride, hd)                                                               \
    ((size_t)(kv)->blocks[(j) / (kv)->bs] * (kv)->stride + (size_t)((j) % (kv)->bs) * (size_t)(hd))
#define ZI_KV_SCALE(kv, j)                                                                         \
    ((kv)->ks[(size_t)(kv)->blocks[(j) / (kv)->bs] * (kv)->sstride + (j) % (kv)->bs])

#if defined(__AVX2__)
/* glibc's expf table, 2^(i/32) for i < 32 (exp8_core, exp4_avx2). */
static const uint64_t exp2_32[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
/* The rest of glibc's expf constants, for both widths: k = round(x * 32 /
 * ln 2) by adding EXPF_SHIFT, and the cubic in r = x * 32 / ln 2 - k. */
#define EXPF_INV_LN2_32 0x1.71547652b82fep+5
#define EXPF_SHIFT 0x1.8p+52
#define EXPF_C0 0x1.c6af84b912394p-20
#define EXPF_C1 0x1.ebfce50fac4f3p-13
#define EXPF_C2 0x1.62e42ff0c52d6p-6
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)

/* expf of 4 floats in double: exp8_core's operations, 4 lanes at a time,
 * with a gather for the table. */
static inline __m128 exp4_avx2(__m128 x) {
    const __m256d inv_ln2 = _mm256_set1_pd(EXPF_INV_LN2_32);
    const __m256d shift = _mm256_set1_pd(EXPF_SHIFT);
    __m256d xd = _mm256_cvtps_pd(x);
    __m256d kds = _mm256_fmadd_pd(inv_ln2, xd, shift); /* k = round(x * 32/ln2) */
    __m256i ki = _mm256_castpd_si256(kds);
    __m256d kd = _mm256_sub_pd(kds, shift);
    __m256d r = _mm256_fmsub_pd(inv_ln2, xd, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *)(const void *)exp2_32,
                                       _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    __m256d sc = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(EXPF_C0), r, _mm256_set1_pd(EXPF_C1));
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(EXPF_C2), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, _mm256_mul_pd(r, r), y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, sc));
}

/* expf of 8 floats, bit-identical to glibc's (see exp8_core); lanes with
 * |x| >= 88 go to expf itself. */
static inline __m256 exp8_avx2(__m256 x) {
    __m256 e = _mm256_set_m128(exp4_avx2(_mm256_extractf128_ps(x, 1)),
                               exp4_avx2(_mm256_castps256_ps128(x)));
    __m256i top =
        _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    int big =
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    if (big) {
        _Alignas(32) float xs[8], es[8];
        _mm256_store_ps(xs, x);
        _mm256_store_ps(es, e);
        for (int i = 0; i < 8; i++)
            if (big >> i & 1) es[i] = expf(xs[i]);
        e = _mm256_load_ps(es);
    }
    return e;
}
#endif

#if defined(__AVX2__) && !defined(__AVX512F__)
/* The 8 sums of v[0..7]'s lanes, in order (a tree of vhaddps). */
static inline __m256 hsum8x8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

/* out[g] += sum over j of p[g][j] * V row j, for NG heads (p n apart) and
 * the NC vectors of columns c0.. (constants, so the sums stay in registers:
 * each V row is read and converted once for all the heads). */
static inline __attribute__((always_inline)) void attend_pv_avx2(const float *p, int n,
                                                                 const zi_kv_head *kv, int hd,
                                                                 int c0, int NG, int NC,
                                                                 float *out) {
    __m256 o[3][4];
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < NC; c++) o[g][c] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const uint16_t *vj = kv->v + ZI_KV_ROW(kv, j, vstride, hd) + c0;
        __m256 v[4];
        for (int c = 0; c < NC; c++)
            v[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vj + 8 * c)));
        for (int g = 0; g < NG; g++) {
            const __m256 pj = _mm256_broadcast_ss(p + (size_t)g * n + j);
            for (int c = 0; c < NC; c++) o[g][c] = _mm256_fmadd_ps(pj, v[c], o[g][c]);
        }
    }
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < NC; c++) _mm256_storeu_ps(out + (size_t)g * hd + c0 + 8 * c, o[g][c]);
}

/* attend_pv_avx2 over all hd columns: 32 at a time, then 8 at a time. */
static inline __attribute__((always_inline)) void
attend_pv_cols(const float *p, int n, const zi_kv_head *kv, int hd, int NG, float *out) {
    int c0 = 0;
    for (; c0 + 32 <= hd; c0 += 32) attend_pv_avx2(p, n, kv, hd, c0, NG, 4, out);
    for (; c0 < hd; c0 += 8) attend_pv_avx2(p, n, kv, hd, c0, NG, 1, out);
}

/*
 * attend with AVX2, hd a multiple of 8. Scores go 8 positions at a time:
 * their K rows are converted to floats once for all G heads, and each
 * head's 8 dot products end in one reduction tree. The exponentials are
 * exp8_avx2's (glibc's expf). The V rows are added into the heads' outputs
 * in registers, up to 3 heads and 32 columns at a time. Sums run 8 lanes
 * wide, so the results differ from the scalar table's in rounding only.
 */
static void attend_avx2(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                        float *scores, float *out) {
    _Alignas(32) float rows[8][1024]; /* hd <= 1024 (model.c) */
    /* The cache is read from memory: K rows are requested 8 positions
     * ahead, and each V row while its K row is scored, for the last phase. */
    for (int j = 0; j < n && j < 8; j++)
        for (int i = 0; i < hd; i += 32)
            _mm_prefetch((const char *)(kv->k + ZI_KV_ROW(kv, j, kstride, hd) + i), _MM_HINT_T0);
    for (int j0 = 0; j0 < n; j0 += 8) {
        const int jn = n - j0 < 8 ? n - j0 : 8;
        _Alignas(32) float ks[8] = {0};
        for (int p = 0; p < 8; p++) {
            if (p >= jn) { /* past the end: a zero row, its score unused */
                memset(rows[p], 0, sizeof(float) * (size_t)hd);
                continue;
            }
            const int j = j0 + p;
            const int16_t *kj = kv->k + ZI_KV_ROW(kv, j, kstride, hd);
            const uint16_t *vj = kv->v + ZI_KV_ROW(kv, j, vstride, hd);
            const int16_t *kn = j + 8 < n ? kv->k + ZI_KV_ROW(kv, j + 8, kstride, hd) : kj;
            for (int i = 0; i < hd; i += 32) {
                _mm_prefetch((const char *)(kn + i), _MM_HINT_T0);
                _mm_prefetch((const char *)(vj + i), _MM_HINT_T0);
            }
            for (int i = 0; i < hd; i += 8)
                _mm256_store_ps(rows[p] + i, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(
                                                 _mm_loadu_si128((const __m128i *)(kj + i)))));
            ks[p] = ZI_KV_SCALE(kv, j);
        }
        const __m256 ksc = _mm256_mul_ps(_mm256_load_ps(ks), _mm256_set1_ps(scale));
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * hd;
            __m256 acc[8];
            for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
            for (int i = 0; i < hd; i += 8) {
                const __m256 qv = _mm256_loadu_ps(qg + i);
                for (int p = 0; p < 8; p++)
                    acc[p] = _mm256_fmadd_ps(qv, _mm256_load_ps(rows[p] + i), acc[p]);
            }
            _Alignas(32) float sv[8];
            _mm256_store_ps(sv, _mm256_mul_ps(hsum8x8(acc), ksc));
            memcpy(scores + (size_t)g * n + j0, sv, sizeof(float) * (size_t)jn);
        }
    }
    float inv[64]; /* G <= 64, checked by the caller */
    for (int g = 0; g < G; g++) {
        float *sg = scores + (size_t)g * n;
        __m256 m8 = _mm256_set1_ps(-INFINITY);
        int j = 0;
        for (; j + 8 <= n; j += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sg + j));
        _Alignas(32) float mv[8];
        _mm256_store_ps(mv, m8);
        float mx = -INFINITY;
        for (int l = 0; l < 8; l++) mx = mv[l] > mx ? mv[l] : mx;
        for (int l = j; l < n; l++) mx = sg[l] > mx ? sg[l] : mx;
        __m256d s4 = _mm256_setzero_pd();
        for (j = 0; j + 8 <= n; j += 8) {
            __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(sg + j), _mm256_set1_ps(mx)));
            _mm256_storeu_ps(sg + j, e);
            s4 = _mm256_add_pd(s4, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                                 _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
        }
        _Alignas(32) double sv[4];
        _mm256_store_pd(sv, s4);
        double sum = (sv[0] + sv[1]) + (sv[2] + sv[3]);
        for (; j < n; j++) {
            sg[j] = expf(sg[j] - mx);
            sum += sg[j];
        }
        inv[g] = (float)(1.0 / sum);
    }
    for (int g0 = 0; g0 < G; g0 += 3) {
        const float *p = scores + (size_t)g0 * n;
        float *og = out + (size_t)g0 * hd;
        switch (G - g0) {
        case 1:
            attend_pv_cols(p, n, kv, hd, 1, og);
            break;
        case 2:
            attend_pv_cols(p, n, kv, hd, 2, og);
            break;
        default:
            attend_pv_cols(p, n, kv, hd, 3, og);
            break;
        }
    }
    for (int g = 0; g < G; g++) scale_f32(out + (size_t)g * hd, inv[g], hd);
}
#endif

#if defined(__AVX512F__)
/* 16 cached float16 values as floats (exact). */
static inline __m512 ld_f16x16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/*
 * Lane L of the result: the sum of the 16 lanes of v[s], s = 4*(L%4) + L/4,
 * added in tree16's order, which is _mm512_reduce_add_ps's, so each sum is
 * bit-identical to dot_f32's reduction.
 */
static inline __m512 hsum16(const __m512 *v) {
    return tree16(v, op_add_ps);
}

/*
 * expf of 16 floats, bit-identical to glibc's expf (2.27 and later, the
 * variant glibc picks on FMA machines): the same 32-entry table of 2^(i/32),
 * cubic polynomial and fused operations, in double, 8 lanes at a time. Lanes
 * with |x| >= 88 (over/underflow, inf, NaN) go to expf itself. Softmax calls
 * it for every score; a libm call per score, with the vector registers it
 * clobbers, was most of the attention time.
 */
static inline __m256 exp8_core(__m256 x) {
    const uint64_t *tab = exp2_32;
    const __m512d inv_ln2 = _mm512_set1_pd(EXPF_INV_LN2_32);
    const __m512d shift = _mm512_set1_pd(EXPF_SHIFT);
    __m512d xd = _mm512_cvtps_pd(x);
    __m512d kds = _mm512_fmadd_pd(inv_ln2, xd, shift); /* k = round(x * 32/ln2) */
    __m512i ki = _mm512_castpd_si512(kds);
    __m512d kd = _mm512_sub_pd(kds, shift);
    __m512d r = _mm512_fmsub_pd(inv_ln2, xd, kd);
    __m512i lo = _mm512_permutex2var_epi64(_mm512_loadu_si512((const void *)tab), ki,
                                           _mm512_loadu_si512((const void *)(tab + 8)));
    __m512i hi = _mm512_permutex2var_epi64(_mm512_loadu_si512((const void *)(tab + 16)), ki,
                                           _mm512_loadu_si512((const void *)(tab + 24)));
    __m512i t = _mm512_mask_blend_epi64(_mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)), lo, hi);
    __m512d sc = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
    __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_C0), r, _mm512_set1_pd(EXPF_C1));
    __m512d y = _mm512_fmadd_pd(_mm512_set1_pd(EXPF_C2), r, _mm512_set1_pd(1.0));
    y = _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), y);
    return _mm512_cvtpd_ps(_mm512_mul_pd(y, sc));
}

static inline __m512 exp16(__m512 x) {
    __m256 e0 = exp8_core(_mm512_castps512_ps256(x));
    __m256 e1 = exp8_core(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m512 e = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(e0)),
                                                   _mm256_castps_pd(e1), 1));
    __m512i top = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 20),
                                   _mm512_set1_epi32(0x7ff));
    __mmask16 big = _mm512_cmpge_epu32_mask(top, _mm512_set1_epi32(0x42b)); /* |x| >= 88 */
    if (big) {
        _Alignas(64) float xs[16], es[16];
        _mm512_store_ps(xs, x);
        _mm512_store_ps(es, e);
        for (int i = 0; i < 16; i++)
            if (big >> i & 1) es[i] = expf(xs[i]);
        e = _mm512_load_ps(es);
    }
    return e;
}

/* Softmax sums and sum of p*V for NG heads (a constant, so the sums and the
 * output rows stay in registers): p holds their exponentials, n apart. The
 * heads' double sums run side by side, each in position order. Each p*v is
 * added by one fused multiply-add: half the vector operations of a multiply
 * and an add, so more V rows are in flight from memory at once (16 streams
 * of 384-448 positions: 28.5 -> 27.4 ms a step), and one rounding, not two. */
static inline __attribute__((always_inline)) void
attend_pv(const float *p, int n, const zi_kv_head *kv, int nc, int NG, float *out) {
    const int32_t *blocks = kv->blocks;
    const int bs = kv->bs;
    double sum[4] = {0.0, 0.0, 0.0, 0.0};
    for (int j = 0; j < n; j++)
        for (int g = 0; g < NG; g++) sum[g] += p[(size_t)g * n + j];
    __m512 o[4][8];
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < nc; c++) o[g][c] = _mm512_setzero_ps();
    const uint16_t *vj = kv->v + (size_t)blocks[0] * kv->vstride;
    const int last = (n - 1) / bs;
    for (int j = 0, jb = 0, jr = 0; j < n; j++, jr++, vj += 16 * nc) {
        if (jr == bs) /* the next cache block */
            jr = 0, vj = kv->v + (size_t)blocks[++jb] * kv->vstride;
        if (jr == 0 && jb < last) { /* and the one after it, while this one is read */
            const char *nv = (const char *)(kv->v + (size_t)blocks[jb + 1] * kv->vstride);
            for (int i = 0; i < bs * 32 * nc; i += 64) _mm_prefetch(nv + i, _MM_HINT_T0);
        }
        for (int g = 0; g < NG; g++) {
            __m512 pg = _mm512_set1_ps(p[(size_t)g * n + j]);
            for (int c = 0; c < nc; c++)
                o[g][c] = _mm512_fmadd_ps(pg, ld_f16x16(vj + 16 * c), o[g][c]);
        }
    }
    for (int g = 0; g < NG; g++) {
        __m512 iv = _mm512_set1_ps((float)(1.0 / sum[g]));
        for (int c = 0; c < nc; c++)
            _mm512_storeu_ps(out + (size_t)g * 16 * nc + 16 * c, _mm512_mul_ps(o[g][c], iv));
    }
}

/* 16 cached int16 K codes as floats (exact). */
static inline __m512 ld_i16x16(const int16_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p)));
}

/*
 * attend for head sizes of 64 and 128 (nc = hd / 16 constant): the same
 * float operations per head as the generic version below (dot_f32's FMA
 * chain and reduction over the codes as floats, times the row's scale, times
 * `scale`; glibc's expf, a double sum in position order, then the sum of
 * p*v by fused multiply-adds, in position order), so a head's output is
 * identical to it and never depends on G. Faster by doing 16 scores'
 * reductions and exponentials at once, converting 16 K rows once for the G
 * heads, and keeping the output rows in registers instead of memory.
 */
static inline __attribute__((always_inline)) void attend16(const float *q, int G,
                                                           const zi_kv_head *kv, int n, int nc,
                                                           float scale, float *scores, float *out) {
    const int hd = 16 * nc, bs = kv->bs;
    const __m512 vscale = _mm512_set1_ps(scale);
    _Alignas(64) float kf[16 * 128], ksr[16];
    for (int j0 = 0; j0 < n; j0 += 16) {
        const int left = n - j0 < 16 ? n - j0 : 16;
        const __mmask16 live = (__mmask16)((1u << left) - 1);
        /* Usually the 16 rows lie in one cache block, back to back. */
        const int jr0 = j0 % bs;
        __m512 ksv;
        /* The next 16 rows' K, and in attend_pv the next block's V, are
         * asked for while these are read: the cache's runs are short (2 KiB
         * a block and KV head) and scattered, too short for the hardware's
         * prefetchers (16 streams of 384-448 positions: 27.1 -> 24.2 ms a
         * step, both together). */
        if (j0 + 16 < n) {
            const int16_t *nk = kv->k + ZI_KV_ROW(kv, j0 + 16, kstride, hd);
            for (int i = 0; i < 16 * hd * 2; i += 64)
                _mm_prefetch((const char *)nk + i, _MM_HINT_T0);
        }
        /* These rows' V, which attend_pv reads after the softmax: asked for
         * now, it arrives while the scores are computed (16 streams of 64-128
         * positions: attention 3.7 -> 3.3 ms a step on one core). */
        if (jr0 + left <= bs) {
            const uint16_t *vr = kv->v + ZI_KV_ROW(kv, j0, vstride, hd);
            for (int i = 0; i < left * hd * 2; i += 64)
                _mm_prefetch((const char *)vr + i, _MM_HINT_T0);
        }
        if (left == 16 && jr0 + 16 <= bs) {
            const size_t b = (size_t)kv->blocks[j0 / bs];
            const int16_t *kb = kv->k + b * kv->kstride + (size_t)jr0 * hd;
            for (int i = 0; i < 16 * nc; i++) _mm512_store_ps(kf + 16 * i, ld_i16x16(kb + 16 * i));
            ksv = _mm512_loadu_ps(kv->ks + b * kv->sstride + jr0);
        } else {
            for (int j = 0; j < left; j++) {
                const int16_t *kj = kv->k + ZI_KV_ROW(kv, j0 + j, kstride, hd);
                for (int c = 0; c < nc; c++)
                    _mm512_store_ps(kf + (size_t)j * hd + 16 * c, ld_i16x16(kj + 16 * c));
                ksr[j] = ZI_KV_SCALE(kv, j0 + j);
            }
            ksv = _mm512_maskz_loadu_ps(live, ksr);
        }
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * hd;
            __m512 qv[8], acc[16];
            for (int c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(qg + 16 * c);
            for (int s = 0; s < 16; s++) { /* s: hsum16's lane order */
                const int j = 4 * (s & 3) + (s >> 2);
                acc[s] = _mm512_setzero_ps();
                if (j >= left) continue; /* rows past the end: zero sums, not stored */
                const float *kj = kf + (size_t)j * hd;
                acc[s] = _mm512_fmadd_ps(qv[0], _mm512_load_ps(kj), acc[s]);
                for (int c = 1; c < nc; c++)
                    acc[s] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kj + 16 * c), acc[s]);
            }
            _mm512_mask_storeu_ps(scores + (size_t)g * n + j0, live,
                                  _mm512_mul_ps(_mm512_mul_ps(hsum16(acc), ksv), vscale));
        }
    }
    for (int g = 0; g < G; g++) {
        float *sg = scores + (size_t)g * n;
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < n; j += 16) { /* NaN scores are skipped, as in the scalar loop */
            __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            mv = _mm512_mask_max_ps(mv, m, _mm512_maskz_loadu_ps(m, sg + j), mv);
        }
        __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        for (int j = 0; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? 0xffff : (__mmask16)((1u << (n - j)) - 1);
            __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + j), mx);
            _mm512_mask_storeu_ps(sg + j, m, exp16(x));
        }
    }
    const int hg = 16 / nc; /* heads whose output rows fit in 16 registers */
    for (int g0 = 0; g0 < G; g0 += hg) {
        const float *sg = scores + (size_t)g0 * n;
        float *og = out + (size_t)g0 * hd;
        switch (G - g0 < hg ? G - g0 : hg) {
        case 1:
            attend_pv(sg, n, kv, nc, 1, og);
            break;
        case 2:
            attend_pv(sg, n, kv, nc, 2, og);
            break;
        case 3:
            attend_pv(sg, n, kv, nc, 3, og);
            break;
        default:
            attend_pv(sg, n, kv, nc, 4, og);
            break;
        }
    }
}
#endif

static void attend(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                   float *scores, float *out) {
#if defined(__AVX512F__)
    /* The common head sizes with constant trip counts (rows in registers). */
    if (hd == 64) {
        attend16(q, G, kv, n, 4, scale, scores, out);
        return;
    }
    if (hd == 128) {
        attend16(q, G, kv, n, 8, scale, scores, out);
        return;
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    if (hd % 8 == 0) {
        attend_avx2(q, G, kv, n, hd, scale, scores, out);
        return;
    }
#endif
    float row[1024]; /* hd <= 1024 (model.c): a cached K or V row as floats */
    for (int j = 0; j < n; j++) {
        const int16_t *kj = kv->k + ZI_KV_ROW(kv, j, kstride, hd);
        for (int i = 0; i < hd; i++) row[i] = (float)kj[i];
        const float ks = ZI_KV_SCALE(kv, j);
        for (int g = 0; g < G; g++)
            scores[(size_t)g * n + j] = dot_f32(q + g * hd, row, hd) * ks * scale;
    }
    float inv[64]; /* G <= 64, checked by the caller */
    for (int g = 0; g < G; g++) {
        float *sg = scores + (size_t)g * n, mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            sg[j] = expf(sg[j] - mx);
            sum += sg[j];
        }
        inv[g] = (float)(1.0 / sum);
    }
    memset(out, 0, (size_t)G * hd * sizeof(float));
    for (int j = 0; j < n; j++) {
        const uint16_t *vj = kv->v + ZI_KV_ROW(kv, j, vstride, hd);
        for (int i = 0; i < hd; i++) row[i] = load_f16(vj[i]);
        for (int g = 0; g < G; g++) { /* fused, as attend16 */
            float *og = out + g * hd, pj = scores[(size_t)g * n + j];
            for (int i = 0; i < hd; i++) og[i] = fmaf(pj, row[i], og[i]);
        }
    }
    for (int g = 0; g < G; g++) scale_f32(out + g * hd, inv[g], hd);
}

static void to_f16(uint16_t *dst, const float *x, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(
            (__m128i *)(dst + i),
            _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
    for (; i < n; i++) dst[i] = zi_f32_to_f16(x[i]);
}

static void swiglu_f32(float *out, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    /* exp16 is glibc's expf, and the rest is the same IEEE operations: the
     * same values as the loop below, 16 at a time. */
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 e = exp16(_mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(gv), _mm512_set1_epi32((int)0x80000000))));
        __m512 r = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(r, _mm512_loadu_ps(u + i)));
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (; i + 8 <= n; i += 8) { /* the same, 8 at a time */
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp8_avx2(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));
        __m256 r = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) {
        float gi = g[i];
        out[i] = gi / (1.0f + expf(-gi)) * u[i];
    }
}

const zi_cpu_kernels ZI_KERNELS_TABLE = {
    .isa = ZI_KERNELS_ISA,
    .quantize_act = quantize_act,
    .mm_q4_0 = mm_q4_0,
    .mm_q4_1 = mm_q4_1,
    .mm_q8_0 = mm_q8_0,
    .mm_f32 = mm_f32,
    .mm_f16 = mm_f16,
    .mm_bf16 = mm_bf16,
    .attend = attend,
#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
    .mm_r16 = mm_r16,
#elif defined(__AVX2__)
    .mm_r16 = mm_r16_avx2,
#endif
    .dot = dot_f32,
    .axpy = axpy_f32,
    .scale = scale_f32,
    .swiglu = swiglu_f32,
    .to_f16 = to_f16,
};
