/*
 * cpu_kernels_quantize.h - activation quantization: quantize_act, which
 * turns a row of floats into the int8 pairs x = (256*q1 + q2) * d of
 * quant.h, one 32-value block at a time. Every table's codes and scales
 * are bit-identical to the scalar loop's. One of the units that
 * cpu_kernels_impl.h includes, in its order, once per instruction set.
 *
 * What each table compiles here:
 *   scalar   quantize_block's plain loop (zi_amax_finite, nearbyintf), one
 *            block at a time.
 *   AVX2     quantize_block's maximum and codes 8 lanes at a time
 *            (#if __AVX2__ && !__AVX512F__, then #elif __AVX2__).
 *   AVX-512  quantize_codes16 and quantize_group16 (#if __AVX512F__):
 *            quantize_act takes 16 blocks at once and leaves to
 *            quantize_block (zi_amax_finite, then quantize_codes16) only
 *            the blocks that are not finite or too small.
 */
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
