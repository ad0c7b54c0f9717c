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

static void quantize_act(const float *x, zi_q8a *q, int64_t n) {
    for (int64_t k = 0; k < n / ZI_QK; k++) {
        const float *xb = x + k * ZI_QK;
        float amax = 0.0f;
        for (int i = 0; i < ZI_QK; i++) {
            float v = fabsf(xb[i]);
            amax = v > amax ? v : amax;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < ZI_QK; i++) {
            int v = (int)nearbyintf(xb[i] * id);
            q[k].q[i] = (int8_t)v;
            sum += v;
        }
        q[k].d = d;
        q[k].isum = sum;
    }
}

#if defined(__AVX2__)
/* The 32 nibbles of a Q4 block as 32 unsigned bytes in element order. */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    __m128i x = _mm_loadu_si128((const __m128i *)qs);
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(x, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    return _mm256_set_m128i(hi, lo);
}

/* 8 int32 partial sums of u[i] * s[i] (u unsigned bytes, s signed bytes). */
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if defined(ZI_HAVE_VNNI)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
#endif
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#endif

static inline float dot_q4_0_row(const zi_block_q4_0 *w, const zi_q8a *a, int64_t nb) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        __m256i u = unpack_nibbles(w[k].qs);
        __m256i s = _mm256_loadu_si256((const __m256i *)a[k].q);
        float dw = load_f16(w[k].d);
        float da = a[k].d;
        __m256 p = _mm256_cvtepi32_ps(dot_u8s8(u, s));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * da), acc);
        off += dw * da * (float)a[k].isum;
    }
    return hsum256(acc) - 8.0f * off;
#else
    float sum = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        int32_t isum = 0;
        for (int i = 0; i < ZI_QK / 2; i++) {
            isum += (w[k].qs[i] & 0x0f) * a[k].q[i];
            isum += (w[k].qs[i] >> 4) * a[k].q[i + 16];
        }
        sum += load_f16(w[k].d) * a[k].d * (float)(isum - 8 * a[k].isum);
    }
    return sum;
#endif
}

static inline float dot_q4_1_row(const zi_block_q4_1 *w, const zi_q8a *a, int64_t nb) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        __m256i u = unpack_nibbles(w[k].qs);
        __m256i s = _mm256_loadu_si256((const __m256i *)a[k].q);
        float da = a[k].d;
        __m256 p = _mm256_cvtepi32_ps(dot_u8s8(u, s));
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(load_f16(w[k].d) * da), acc);
        off += load_f16(w[k].m) * da * (float)a[k].isum;
    }
    return hsum256(acc) + off;
#else
    float sum = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        int32_t isum = 0;
        for (int i = 0; i < ZI_QK / 2; i++) {
            isum += (w[k].qs[i] & 0x0f) * a[k].q[i];
            isum += (w[k].qs[i] >> 4) * a[k].q[i + 16];
        }
        sum += load_f16(w[k].d) * a[k].d * (float)isum +
               load_f16(w[k].m) * a[k].d * (float)a[k].isum;
    }
    return sum;
#endif
}

static inline float dot_q8_0_row(const zi_block_q8_0 *w, const zi_q8a *a, int64_t nb) {
#if defined(__AVX2__)
    __m256 acc = _mm256_setzero_ps();
    for (int64_t k = 0; k < nb; k++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)w[k].qs);
        __m256i s = _mm256_loadu_si256((const __m256i *)a[k].q);
#if defined(ZI_HAVE_VNNI)
        /* w ^ 0x80 = w + 128 as unsigned: sum((w+128)*a) - 128*sum(a). */
        __m256i u = _mm256_xor_si256(wq, _mm256_set1_epi8((char)0x80));
        __m256i isum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(16 * a[k].isum)); /* 8 lanes * 16 = 128 */
#else
        /* |w| * (a with w's sign): maddubs needs an unsigned operand. */
        __m256i u = _mm256_sign_epi8(wq, wq);
        __m256i sv = _mm256_sign_epi8(s, wq);
        __m256i isum = dot_u8s8(u, sv);
#endif
        __m256 p = _mm256_cvtepi32_ps(isum);
        acc = _mm256_fmadd_ps(p, _mm256_set1_ps(load_f16(w[k].d) * a[k].d), acc);
    }
    return hsum256(acc);
#else
    float sum = 0.0f;
    for (int64_t k = 0; k < nb; k++) {
        int32_t isum = 0;
        for (int i = 0; i < ZI_QK; i++) isum += w[k].qs[i] * a[k].q[i];
        sum += load_f16(w[k].d) * a[k].d * (float)isum;
    }
    return sum;
#endif
}

#define ZI_DEFINE_MM(NAME, BLOCK, DOT)                                                             \
    static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,                  \
                     const zi_q8a *a, int64_t nb, int n_tokens, float *y, int64_t ldy) {          \
        for (int64_t r = r0; r < r1; r++) {                                                       \
            const BLOCK *row = (const BLOCK *)(const void *)(w + (size_t)r * row_bytes);          \
            for (int t = 0; t < n_tokens; t++) y[t * ldy + r] = DOT(row, a + t * nb, nb);        \
        }                                                                                         \
    }

ZI_DEFINE_MM(mm_q4_0, zi_block_q4_0, dot_q4_0_row)
ZI_DEFINE_MM(mm_q4_1, zi_block_q4_1, dot_q4_1_row)
ZI_DEFINE_MM(mm_q8_0, zi_block_q8_0, dot_q8_0_row)

static float dot_f32(const float *a, const float *b, int64_t n) {
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

const zi_cpu_kernels ZI_KERNELS_TABLE = {
    .isa = ZI_KERNELS_ISA,
    .quantize_act = quantize_act,
    .mm_q4_0 = mm_q4_0,
    .mm_q4_1 = mm_q4_1,
    .mm_q8_0 = mm_q8_0,
    .mm_f32 = mm_f32,
    .mm_f16 = mm_f16,
    .mm_bf16 = mm_bf16,
    .dot = dot_f32,
    .axpy = axpy_f32,
    .scale = scale_f32,
};
