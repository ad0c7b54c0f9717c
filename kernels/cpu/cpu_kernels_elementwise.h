/*
 * cpu_kernels_elementwise.h - the element-wise kernels: axpy_f32,
 * lora_down and lora_up (a LoRA term's two products), scale_f32, to_f16,
 * swiglu_f32, geglu_f32, and the vector expf (glibc's algorithm,
 * bit-identical to expf) that SwiGLU, GeGLU and attention's softmax use.
 * One of the units that cpu_kernels_impl.h includes, in its order, once
 * per instruction set.
 *
 * What each table compiles here:
 *   scalar   the plain loops (expf from libm, zi_f32_to_f16).
 *   AVX2     (#if __AVX2__) the expf table and constants; (#if __AVX2__ &&
 *            !__AVX512F__) exp4_avx2, exp8_avx2, SwiGLU 8 lanes at a
 *            time, GeGLU likewise; (#if __F16C__) to_f16 8 values at a time;
 *            (#if __AVX2__ && __F16C__ && __FMA__) lora_down and lora_up
 *            8 lanes at a time (the AVX-512 table too).
 *   AVX-512  the expf table and constants, exp8_core and exp16 (#if
 *            __AVX512F__), SwiGLU and GeGLU 16 lanes at a time, to_f16 as AVX2.
 */
static void axpy_f32(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void lora_down(float *c, const void *a, const float *x, int rank, int64_t n, int f16) {
    const uint16_t *ah = a;
    const float *af = a;
    for (int k0 = 0; k0 < rank; k0 += 8) {
        const int m = rank - k0 < 8 ? rank - k0 : 8;
        int64_t i = 0;
        float s[8] = {0};
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
        __m256 acc[8];
        for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
        for (; i + 8 <= n; i += 8) {
            const __m256 xv = _mm256_loadu_ps(x + i);
            for (int j = 0; j < m; j++) {
                const size_t o = (size_t)(k0 + j) * (size_t)n + (size_t)i;
                const __m256 av = f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ah + o)))
                                      : _mm256_loadu_ps(af + o);
                acc[j] = _mm256_fmadd_ps(av, xv, acc[j]);
            }
        }
        for (int j = 0; j < m; j++) s[j] = hsum256(acc[j]);
#endif
        for (; i < n; i++)
            for (int j = 0; j < m; j++) {
                const size_t o = (size_t)(k0 + j) * (size_t)n + (size_t)i;
                s[j] = fmaf(f16 ? load_f16(ah[o]) : af[o], x[i], s[j]);
            }
        for (int j = 0; j < m; j++) c[k0 + j] = s[j];
    }
}

static void lora_up(float *y, const float *c, const void *bt, int rank, int64_t rows, int f16) {
    const uint16_t *bh = bt;
    const float *bf = bt;
    int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    for (; i + 8 <= rows; i += 8) {
        __m256 acc = _mm256_loadu_ps(y + i);
        for (int k = 0; k < rank; k++) {
            const size_t o = (size_t)k * (size_t)rows + (size_t)i;
            const __m256 b = f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(bh + o)))
                                 : _mm256_loadu_ps(bf + o);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(c[k]), b, acc);
        }
        _mm256_storeu_ps(y + i, acc);
    }
#endif
    for (; i < rows; i++) {
        float acc = y[i];
        for (int k = 0; k < rank; k++) {
            const size_t o = (size_t)k * (size_t)rows + (size_t)i;
            acc = fmaf(c[k], f16 ? load_f16(bh[o]) : bf[o], acc);
        }
        y[i] = acc;
    }
}

static void scale_f32(float *y, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

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

#if defined(__AVX512F__)
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

#endif

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

/* GELU's tanh approximation, 0.5 g (1 + tanh(y)) with y = sqrt(2/pi) (g +
 * 0.044715 g^3), written as g / (1 + exp(-2y)) (the same function: 1 +
 * tanh(y) = 2 / (1 + exp(-2y))), so that it shares SwiGLU's expf; times u
 * (GeGLU). The constants are 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715. */
#define GELU_K1 1.5957691216057308f
#define GELU_K3 0.0713548162726009f

static void geglu_f32(float *out, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) { /* the loop below's operations, 16 at a time */
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(gv, gv), gv);
        __m512 z = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(GELU_K1), gv),
                                 _mm512_mul_ps(_mm512_set1_ps(GELU_K3), g3));
        __m512 e = exp16(_mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(z), _mm512_set1_epi32((int)0x80000000))));
        __m512 r = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(out + i, _mm512_mul_ps(r, _mm512_loadu_ps(u + i)));
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (; i + 8 <= n; i += 8) { /* the same, 8 at a time */
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
        __m256 z = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(GELU_K1), gv),
                                 _mm256_mul_ps(_mm256_set1_ps(GELU_K3), g3));
        __m256 e = exp8_avx2(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)));
        __m256 r = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(r, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) {
        float gi = g[i];
        float z = GELU_K1 * gi + GELU_K3 * (gi * gi * gi);
        out[i] = gi / (1.0f + expf(-z)) * u[i];
    }
}
