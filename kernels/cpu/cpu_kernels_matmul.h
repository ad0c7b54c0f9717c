/*
 * cpu_kernels_matmul.h - the matrix products but AMX's: the block dot
 * products of quantized weights (Q4_0, Q4_1, Q8_0) with quantized
 * activations, per row (dot_row, dot_row4, mm_q4_0/mm_q4_1/mm_q8_0) and in
 * the 16-row layout of repack.h (mm_r16_vnni, mm_r16_avx2), and the float
 * products (dot_f32, mm_f32, mm_f16, mm_bf16). One of the units that
 * cpu_kernels_impl.h includes, in its order, once per instruction set; the
 * AMX kernel and the mm_r16 entry of the avx512 table follow in
 * cpu_kernels_amx.h.
 *
 * What each table compiles here:
 *   scalar   dot_row through tail_block alone, the float products' plain
 *            loops; no 16-row kernel (the table's mm_r16 stays NULL).
 *   AVX2     (#if __AVX2__, #elif __AVX2__, #if __AVX2__ && !ZI_HAVE_VNNI)
 *            codes256, dot_u8s8 with vpmaddubsw, hsum256, dot_row's
 *            8-lane loop, mm_r16_avx2 (r16_decode, r16_isum,
 *            r16_avx2_rows), dot_f32, dot_half_avx2 (f16 and bf16) 8 lanes
 *            at a time.
 *   AVX-512  (#if ZI_HAVE_VNNI && __AVX512F__) dot_u8s8 with vpdpbusd,
 *            codes512, isum512, dot_row's 16-block groups, dot_row4
 *            (ZI_HAVE_ROW4: mm_quant takes four tokens at a time),
 *            mm_r16_vnni; dot_f32 16 lanes at a time when n % 16 == 0; and
 *            the AVX2 parts above that are not excluded by
 *            !__AVX512F__ or !ZI_HAVE_VNNI.
 */
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
/* Q8_0's part of r16_decode: the 512 code bytes of a column in the 16-row
 * layout (byte 64c + 4i + e) as int16, in the order r16_isum reads. */
static inline void r16_widen_u8(const uint8_t *G, uint8_t *code) {
    for (int h = 0; h < 2; h++) {
        uint8_t *d = code + h * 512;
        for (int c = 0; c < 8; c++) {
            __m128i lo = _mm_loadu_si128((const __m128i *)(G + 64 * c + 32 * h));
            __m128i hi = _mm_loadu_si128((const __m128i *)(G + 64 * c + 32 * h + 16));
            _mm256_store_si256((__m256i *)(d + 64 * c),
                               _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(lo, hi)));
            _mm256_store_si256((__m256i *)(d + 64 * c + 32),
                               _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(lo, hi)));
        }
    }
}

static inline void r16_decode(int kind, const uint8_t *G, size_t gb, uint8_t *code, float *sc) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (size_t off = 0; off < gb; off += 64) /* the stream ahead */
        _mm_prefetch((const char *)(G + 8 * gb + off), _MM_HINT_T0);
    if (kind == KQ8_0) r16_widen_u8(G, code);
    for (int h = 0; kind != KQ8_0 && h < 2; h++) {
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

/* out[r] = dot_f32(a, b + r * stride, n) for r < 4, each the same bits
 * (the same lanes, order and reduction), with a's loads shared and four
 * independent accumulator chains instead of one (the speech decoder's
 * convolutions: one weight row against four frames). */
static void dot4_f32(const float *a, const float *b, size_t stride, int64_t n, float *out) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
        const float *b0 = b, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
        for (int64_t i = 0; i < n; i += 16) {
            const __m512 va = _mm512_loadu_ps(a + i);
            c0 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b0 + i), c0);
            c1 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b1 + i), c1);
            c2 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b2 + i), c2);
            c3 = _mm512_fmadd_ps(va, _mm512_loadu_ps(b3 + i), c3);
        }
        out[0] = _mm512_reduce_add_ps(c0), out[1] = _mm512_reduce_add_ps(c1);
        out[2] = _mm512_reduce_add_ps(c2), out[3] = _mm512_reduce_add_ps(c3);
        return;
    }
#endif
#if defined(__AVX2__)
    __m256 p0[4], p1[4];
    for (int r = 0; r < 4; r++) p0[r] = p1[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 va0 = _mm256_loadu_ps(a + i), va1 = _mm256_loadu_ps(a + i + 8);
        for (int r = 0; r < 4; r++) {
            p0[r] = _mm256_fmadd_ps(va0, _mm256_loadu_ps(b + r * stride + i), p0[r]);
            p1[r] = _mm256_fmadd_ps(va1, _mm256_loadu_ps(b + r * stride + i + 8), p1[r]);
        }
    }
    for (int r = 0; r < 4; r++) {
        float s = hsum256(_mm256_add_ps(p0[r], p1[r]));
        for (int64_t k = i; k < n; k++) s += a[k] * b[r * stride + k];
        out[r] = s;
    }
#else
    for (int r = 0; r < 4; r++) out[r] = dot_f32(a, b + r * stride, n);
#endif
}

/* One 16-bit weight as a float: IEEE half (bf16 0) or bfloat16 (1). */
static inline float half_to_f32(uint16_t h, int bf16) {
    return bf16 ? zi_bf16_to_f32(h) : zi_f16_to_f32(h);
}

#if defined(__AVX2__)
/* 8 16-bit weights as floats. f16 needs F16C: its callers check. */
static inline __m256 half8_to_f32(const uint16_t *w, int bf16) {
    __m128i h = _mm_loadu_si128((const __m128i *)w);
#if defined(__F16C__)
    if (!bf16) return _mm256_cvtph_ps(h);
#endif
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* dot(w, x) over n 16-bit weights, 8 lanes at a time (bf16 a constant:
 * each caller inlines its own loop). */
static inline float dot_half_avx2(const uint16_t *w, const float *x, int64_t n, int bf16) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc = _mm256_fmadd_ps(half8_to_f32(w + i, bf16), _mm256_loadu_ps(x + i), acc);
    float s = hsum256(acc);
    for (; i < n; i++) s += half_to_f32(w[i], bf16) * x[i];
    return s;
}
#endif

static inline float dot_half_scalar(const uint16_t *w, const float *x, int64_t n, int bf16) {
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) s += half_to_f32(w[i], bf16) * x[i];
    return s;
}

#define ZI_DEFINE_MMF(NAME, ELEM, DOT)                                                             \
    static void NAME(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,  \
                     int64_t n, int n_tokens, float *y, int64_t ldy) {                            \
        for (int64_t r = r0; r < r1; r++) {                                                       \
            const ELEM *row = (const ELEM *)(const void *)(w + (size_t)r * row_bytes);            \
            for (int t = 0; t < n_tokens; t++) y[t * ldy + r] = DOT(row, x + t * n, n);          \
        }                                                                                         \
    }

#if defined(__AVX512F__)
/* mm_f32 for n % 16 == 0: blocks of 4 rows x 2 tokens, so eight dot
 * products' FMA chains run at once instead of one chain waiting on its own
 * latency (a router's product, 128 x 2048 per token, was latency bound).
 * Each product keeps its own accumulator, fed in the same order and reduced
 * the same way as dot_f32's, so the results are bit-identical to it. */
static void mm_f32_blocked(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                           const float *x, int64_t n, int n_tokens, float *y, int64_t ldy) {
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
        const float *w0 = (const float *)(const void *)(w + (size_t)r * row_bytes);
        const float *w1 = (const float *)(const void *)(w + (size_t)(r + 1) * row_bytes);
        const float *w2 = (const float *)(const void *)(w + (size_t)(r + 2) * row_bytes);
        const float *w3 = (const float *)(const void *)(w + (size_t)(r + 3) * row_bytes);
        int t = 0;
        for (; t + 2 <= n_tokens; t += 2) {
            const float *xa = x + (size_t)t * (size_t)n, *xb = xa + n;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int64_t i = 0; i < n; i += 16) {
                __m512 va = _mm512_loadu_ps(xa + i), vb = _mm512_loadu_ps(xb + i);
                __m512 v0 = _mm512_loadu_ps(w0 + i), v1 = _mm512_loadu_ps(w1 + i);
                __m512 v2 = _mm512_loadu_ps(w2 + i), v3 = _mm512_loadu_ps(w3 + i);
                a0 = _mm512_fmadd_ps(v0, va, a0);
                a1 = _mm512_fmadd_ps(v1, va, a1);
                a2 = _mm512_fmadd_ps(v2, va, a2);
                a3 = _mm512_fmadd_ps(v3, va, a3);
                b0 = _mm512_fmadd_ps(v0, vb, b0);
                b1 = _mm512_fmadd_ps(v1, vb, b1);
                b2 = _mm512_fmadd_ps(v2, vb, b2);
                b3 = _mm512_fmadd_ps(v3, vb, b3);
            }
            float *ya = y + (size_t)t * (size_t)ldy + r, *yb = ya + ldy;
            ya[0] = _mm512_reduce_add_ps(a0), ya[1] = _mm512_reduce_add_ps(a1);
            ya[2] = _mm512_reduce_add_ps(a2), ya[3] = _mm512_reduce_add_ps(a3);
            yb[0] = _mm512_reduce_add_ps(b0), yb[1] = _mm512_reduce_add_ps(b1);
            yb[2] = _mm512_reduce_add_ps(b2), yb[3] = _mm512_reduce_add_ps(b3);
        }
        for (; t < n_tokens; t++)
            for (int k = 0; k < 4; k++)
                y[t * ldy + r + k] =
                    dot_f32((const float *)(const void *)(w + (size_t)(r + k) * row_bytes),
                            x + t * n, n);
    }
    for (; r < r1; r++)
        for (int t = 0; t < n_tokens; t++)
            y[t * ldy + r] =
                dot_f32((const float *)(const void *)(w + (size_t)r * row_bytes), x + t * n, n);
}
#endif

ZI_DEFINE_MMF(mm_f32_rows, float, dot_f32)

static void mm_f32(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t n, int n_tokens, float *y, int64_t ldy) {
#if defined(__AVX512F__)
    if (n % 16 == 0) {
        mm_f32_blocked(w, row_bytes, r0, r1, x, n, n_tokens, y, ldy);
        return;
    }
#endif
    mm_f32_rows(w, row_bytes, r0, r1, x, n, n_tokens, y, ldy);
}
#if defined(__AVX2__) && defined(__F16C__)
/* 16-bit weights for batches: MH_R rows x MH_T tokens at a time, each
 * product with its own 8-lane accumulator fed in dot_half_avx2's order and
 * reduced as it reduces (its scalar tail after), so every output is
 * bit-identical to dot_f16_row's / dot_bf16_row's whatever the batch; and
 * the tokens in tiles of about 128 KiB that stay in L2 while every row of
 * the call passes over them (an image tower's 1024 tokens x 768: 16.9 ->
 * 5.3 s a tile). The AVX-512 table has the registers for 4 x 4. */
#if defined(__AVX512F__)
#define MH_T 4
#else
#define MH_T 2
#endif
#define MH_R 4
static inline __attribute__((always_inline)) void
mm_half_blocked(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                int64_t n, int n_tokens, float *y, int64_t ldy, int bf16) {
    int64_t tile = ((int64_t)1 << 15) / (n > 0 ? n : 1); /* tokens of 128 KiB */
    tile = tile < MH_T ? MH_T : tile / MH_T * MH_T;
    const int64_t n8 = n / 8 * 8;
    for (int64_t t0 = 0; t0 < n_tokens; t0 += tile) {
        const int64_t t1 = t0 + tile < n_tokens ? t0 + tile : n_tokens;
        int64_t r = r0;
        for (; r + MH_R <= r1; r += MH_R) {
            const uint16_t *wr[MH_R];
            for (int k = 0; k < MH_R; k++)
                wr[k] = (const uint16_t *)(const void *)(w + (size_t)(r + k) * row_bytes);
            int64_t t = t0;
            for (; t + MH_T <= t1; t += MH_T) {
                __m256 acc[MH_R][MH_T];
                for (int k = 0; k < MH_R; k++)
                    for (int j = 0; j < MH_T; j++) acc[k][j] = _mm256_setzero_ps();
                for (int64_t i = 0; i < n8; i += 8) {
                    __m256 xv[MH_T];
                    for (int j = 0; j < MH_T; j++) xv[j] = _mm256_loadu_ps(x + (t + j) * n + i);
                    for (int k = 0; k < MH_R; k++) {
                        const __m256 wv = half8_to_f32(wr[k] + i, bf16);
                        for (int j = 0; j < MH_T; j++)
                            acc[k][j] = _mm256_fmadd_ps(wv, xv[j], acc[k][j]);
                    }
                }
                for (int k = 0; k < MH_R; k++)
                    for (int j = 0; j < MH_T; j++) {
                        const float *xt = x + (t + j) * n;
                        float sum = hsum256(acc[k][j]);
                        for (int64_t i = n8; i < n; i++) sum += half_to_f32(wr[k][i], bf16) * xt[i];
                        y[(t + j) * ldy + r + k] = sum;
                    }
            }
            for (; t < t1; t++)
                for (int k = 0; k < MH_R; k++)
                    y[t * ldy + r + k] = dot_half_avx2(wr[k], x + t * n, n, bf16);
        }
        for (; r < r1; r++)
            for (int64_t t = t0; t < t1; t++)
                y[t * ldy + r] = dot_half_avx2(
                    (const uint16_t *)(const void *)(w + (size_t)r * row_bytes), x + t * n, n, bf16);
    }
}
#undef MH_T
#undef MH_R

static void mm_f16(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t n, int n_tokens, float *y, int64_t ldy) {
    mm_half_blocked(w, row_bytes, r0, r1, x, n, n_tokens, y, ldy, 0);
}
static void mm_bf16(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                    int64_t n, int n_tokens, float *y, int64_t ldy) {
    mm_half_blocked(w, row_bytes, r0, r1, x, n, n_tokens, y, ldy, 1);
}
#else
static float dot_f16_row(const uint16_t *w, const float *x, int64_t n) {
#if defined(__AVX2__) && defined(__F16C__)
    return dot_half_avx2(w, x, n, 0);
#else
    return dot_half_scalar(w, x, n, 0);
#endif
}

static float dot_bf16_row(const uint16_t *w, const float *x, int64_t n) {
#if defined(__AVX2__)
    return dot_half_avx2(w, x, n, 1);
#else
    return dot_half_scalar(w, x, n, 1);
#endif
}

ZI_DEFINE_MMF(mm_f16, uint16_t, dot_f16_row)
ZI_DEFINE_MMF(mm_bf16, uint16_t, dot_bf16_row)
#endif
