/*
 * cpu_kernels_common.h - the part of the CPU kernels every other unit uses:
 * the includes, the feature macro ZI_HAVE_VNNI, load_f16, and the AVX-512
 * reduction tree shared by activation quantization and attention. One of
 * the units that cpu_kernels_impl.h includes, in its order, once per
 * instruction set; not a header of its own.
 *
 * What each table compiles here:
 *   scalar   load_f16 through zi_f16_to_f32.
 *   AVX2     <immintrin.h>; load_f16 with F16C's _cvtsh_ss.
 *   AVX-512  the above, ZI_HAVE_VNNI (AVX-512 VNNI + VL + BW: the avx512
 *            table's flags always give it), and tree16 with its ops
 *            (op_add_ps, op_max_ps, op_add_epi32).
 */
#include <assert.h>
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
#endif
