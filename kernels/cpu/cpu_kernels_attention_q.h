/*
 * cpu_kernels_attention_q.h - attention over a paged KV cache of the
 * --kv-type formats other than the default (zi_kv_type: float16, or
 * llama.cpp's Q8_0 and Q4_0 blocks, K and V alike): attend_q and
 * attend_q_block, which attend and attend_block (cpu_kernels_attention.h)
 * hand such a cache to (attend_kv, attend_block_kv). The cache is read in
 * place: each position's K row, then its V row, is turned into floats one
 * 32-value block at a time (kvq_row into a small scratch, kvq_ld16 into
 * registers), never a copy of the whole cache. Scores are float32 dot
 * products of the float query with those values (the query is not
 * quantized, unlike llama.cpp's flash attention, which turns it into the K
 * type's vector-dot partner), then softmax (glibc's expf or its vector
 * twin, a double sum) and the sum of p*v by fused multiply-adds, as the
 * default path. Q8_0 and Q4_0 rows are stored rotated (zi_kv_rotate,
 * cpu_kernels.h): the query rows are rotated before the scores and the
 * output rows back after the sums. One of the units that
 * cpu_kernels_impl.h includes, in its order, once per instruction set; it
 * uses dot_f32, load_f16, softcap_scores, scale_f32, exp16 / exp8_avx2
 * and hsum16 / hsum8x8.
 *
 * What each table compiles here:
 *   scalar   the plain loops.
 *   AVX2     (#if __AVX2__ && !__AVX512F__) kvq_row 8 values at a time
 *            (F16C, sign/zero extension), scores 8 positions at a time
 *            (hsum8x8) for head sizes that are multiples of 8, exp8_avx2,
 *            p*v 8 lanes wide through a scratch row.
 *   AVX-512  (#if __AVX512F__) kvq_row 16 values at a time, scores 16
 *            positions at a time (hsum16) for head sizes that are
 *            multiples of 16 up to 256, exp16, and p*v of up to 4 rows
 *            in registers (kvq_ld16, kvq_pv16).
 */

/* Position j's row (of a K or V pool: base, blocks `stride` bytes apart,
 * rows `row` bytes) in a cache of a --kv-type format (cpu_kernels.h). */
static inline const uint8_t *kvq_at(const zi_kv_head *kv, const uint8_t *base, size_t stride,
                                    size_t row, int j) {
    const int p = kv->first + j;
    return base + (size_t)kv->blocks[p / kv->bs] * stride + (size_t)(p % kv->bs) * row;
}

/* One cached row of hd values as floats (exact: a float16 value, or a
 * block's float16 scale times its code). Q8_0 and Q4_0 rows are hd / 32
 * blocks (hd a multiple of 32, model.c); a float16 row any length. */
static inline void kvq_row(int type, const uint8_t *src, float *dst, int hd) {
    if (type == ZI_KV_F16) {
        const uint16_t *h = (const uint16_t *)(const void *)src;
        int i = 0;
#if defined(__AVX512F__)
        for (; i + 16 <= hd; i += 16)
            _mm512_storeu_ps(dst + i,
                             _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
#elif defined(__AVX2__)
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
#endif
        for (; i < hd; i++) {
            uint16_t v;
            memcpy(&v, h + i, sizeof v); /* rows need not be 2-aligned in general */
            dst[i] = load_f16(v);
        }
        return;
    }
    if (type == ZI_KV_Q8_0) {
        for (int b = 0; b < hd / ZI_QK; b++, src += sizeof(zi_block_q8_0), dst += ZI_QK) {
            uint16_t dh;
            memcpy(&dh, src, sizeof dh);
            const float d = load_f16(dh);
            const int8_t *qs = (const int8_t *)(src + 2);
#if defined(__AVX512F__)
            const __m512 dv = _mm512_set1_ps(d);
            for (int h = 0; h < 2; h++)
                _mm512_storeu_ps(
                    dst + 16 * h,
                    _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                      _mm_loadu_si128((const __m128i *)(qs + 16 * h)))),
                                  dv));
#elif defined(__AVX2__)
            const __m256 dv = _mm256_set1_ps(d);
            for (int h = 0; h < 4; h++)
                _mm256_storeu_ps(dst + 8 * h,
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                                                   _mm_loadl_epi64((const __m128i *)(qs + 8 * h)))),
                                               dv));
#else
            for (int i = 0; i < ZI_QK; i++) dst[i] = (float)qs[i] * d;
#endif
        }
        return;
    }
    /* Q4_0: byte i holds value i (low nibble) and value i + 16 (high), each
     * minus 8. */
    for (int b = 0; b < hd / ZI_QK; b++, src += sizeof(zi_block_q4_0), dst += ZI_QK) {
        uint16_t dh;
        memcpy(&dh, src, sizeof dh);
        const float d = load_f16(dh);
        const uint8_t *qs = src + 2;
#if defined(__AVX512F__)
        const __m512 dv = _mm512_set1_ps(d);
        const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)qs)),
                      eight = _mm512_set1_epi32(8);
        const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(x, _mm512_set1_epi32(15)), eight),
                      hi = _mm512_sub_epi32(_mm512_srli_epi32(x, 4), eight);
        _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), dv));
        _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), dv));
#elif defined(__AVX2__)
        const __m256 dv = _mm256_set1_ps(d);
        const __m256i eight = _mm256_set1_epi32(8), fifteen = _mm256_set1_epi32(15);
        for (int h = 0; h < 2; h++) {
            const __m256i x = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * h)));
            const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(x, fifteen), eight),
                          hi = _mm256_sub_epi32(_mm256_srli_epi32(x, 4), eight);
            _mm256_storeu_ps(dst + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), dv));
            _mm256_storeu_ps(dst + 16 + 8 * h, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), dv));
        }
#else
        for (int i = 0; i < ZI_QK / 2; i++) {
            dst[i] = (float)((qs[i] & 15) - 8) * d;
            dst[i + ZI_QK / 2] = (float)((qs[i] >> 4) - 8) * d;
        }
#endif
    }
}

/* o[i] = fma(p, x[i], o[i]) for i < n. */
static inline void kvq_fma_row(float *o, float p, const float *x, int n) {
    int i = 0;
#if defined(__AVX512F__)
    const __m512 pv = _mm512_set1_ps(p);
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i,
                         _mm512_fmadd_ps(pv, _mm512_loadu_ps(x + i), _mm512_loadu_ps(o + i)));
#elif defined(__AVX2__) && defined(__FMA__)
    const __m256 pv = _mm256_set1_ps(p);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(o + i,
                         _mm256_fmadd_ps(pv, _mm256_loadu_ps(x + i), _mm256_loadu_ps(o + i)));
#endif
    for (; i < n; i++) o[i] = fmaf(p, x[i], o[i]);
}

/* s[j] = expf(s[j] - mx) for j < n: the vector expf where the table has
 * one (bit-identical to glibc's), else expf. */
static inline void kvq_exp(float *s, int n, float mx) {
    int j = 0;
#if defined(__AVX512F__)
    const __m512 m = _mm512_set1_ps(mx);
    for (; j + 16 <= n; j += 16)
        _mm512_storeu_ps(s + j, exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), m)));
#elif defined(__AVX2__)
    const __m256 m = _mm256_set1_ps(mx);
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(s + j, exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + j), m)));
#endif
    for (; j < n; j++) s[j] = expf(s[j] - mx);
}

#if defined(__AVX512F__)
/* Values 16c..16c+15 of a cached row as floats (kvq_row's values). */
static inline __m512 kvq_ld16(int type, const uint8_t *row, int c) {
    if (type == ZI_KV_F16)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 32 * c)));
    const size_t bb = type == ZI_KV_Q8_0 ? sizeof(zi_block_q8_0) : sizeof(zi_block_q4_0);
    const uint8_t *b = row + bb * (size_t)(c >> 1);
    uint16_t dh;
    memcpy(&dh, b, sizeof dh);
    const __m512 d = _mm512_set1_ps(load_f16(dh));
    if (type == ZI_KV_Q8_0)
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                                 _mm_loadu_si128((const __m128i *)(b + 2 + 16 * (c & 1))))),
                             d);
    const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    const __m512i nib =
        c & 1 ? _mm512_srli_epi32(x, 4) : _mm512_and_si512(x, _mm512_set1_epi32(15));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(nib, _mm512_set1_epi32(8))), d);
}

/* The sum of p*V for NG rows (a constant: the sums stay in registers) of
 * hd = 16 * nc columns: row g's exponentials at p + g * ps over its nr[g]
 * positions, its output (times inv[g]) at outs[g]. Each V row is decoded
 * once for the NG rows; the same fused multiply-adds, in position order,
 * as kvq_fma_row. */
static inline __attribute__((always_inline)) void kvq_pv16(const float *p, size_t ps, const int *nr,
                                                           const float *inv, const zi_kv_head *kv,
                                                           int nc, int NG, float *const *outs) {
    int nmax = 0;
    for (int g = 0; g < NG; g++) nmax = nr[g] > nmax ? nr[g] : nmax;
    __m512 o[4][16]; /* NG * nc <= 16 */
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < nc; c++) o[g][c] = _mm512_setzero_ps();
    for (int j = 0; j < nmax; j++) {
        const uint8_t *row = kvq_at(kv, kv->vq, kv->vstride, kv->vrow, j);
        __m512 v[16];
        for (int c = 0; c < nc; c++) v[c] = kvq_ld16(kv->type, row, c);
        for (int g = 0; g < NG; g++) {
            if (j >= nr[g]) continue;
            const __m512 pg = _mm512_set1_ps(p[(size_t)g * ps + j]);
            for (int c = 0; c < nc; c++) o[g][c] = _mm512_fmadd_ps(pg, v[c], o[g][c]);
        }
    }
    for (int g = 0; g < NG; g++) {
        const __m512 iv = _mm512_set1_ps(inv[g]);
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(outs[g] + 16 * c, _mm512_mul_ps(o[g][c], iv));
    }
}

/* Rows r0 .. r0 + NG - 1 (a constant) of kvq_pv_wide's sums, over the
 * decoded V rows vf (hd floats apart) of positions j0 .. j0 + left - 1:
 * 64 columns at a time, their sums loaded from and stored back to outs. */
static inline __attribute__((always_inline)) void kvq_pv_rows(const float *p, size_t ps,
                                                              const int *nr, const float *vf,
                                                              int hd, int j0, int left, int NG,
                                                              float *const *outs) {
    for (int c0 = 0; c0 < hd; c0 += 64) {
        __m512 o[4][4];
        for (int g = 0; g < NG; g++)
            for (int c = 0; c < 4; c++) o[g][c] = _mm512_loadu_ps(outs[g] + c0 + 16 * c);
        for (int j = 0; j < left; j++) {
            const float *vj = vf + (size_t)j * hd + c0;
            for (int g = 0; g < NG; g++) {
                if (j0 + j >= nr[g]) continue;
                const __m512 pg = _mm512_set1_ps(p[(size_t)g * ps + (size_t)(j0 + j)]);
                for (int c = 0; c < 4; c++)
                    o[g][c] = _mm512_fmadd_ps(pg, _mm512_load_ps(vj + 16 * c), o[g][c]);
            }
        }
        for (int g = 0; g < NG; g++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(outs[g] + c0 + 16 * c, o[g][c]);
    }
}

/* kvq_pv16's sums for R rows of hd values, hd a multiple of 64 up to 256
 * (where a row's sums alone fill the registers, so kvq_pv16 would decode
 * each V row once per query row: 64 times in a 16-token block of a GQA
 * group of 4): each 16 positions' V rows are decoded once into a scratch
 * for all the rows, whose sums live in outs between those runs. The same
 * fused multiply-adds, in position order, from zero, as kvq_pv16: the
 * same bits. */
static void kvq_pv_wide(const float *p, size_t ps, int R, const int *nr, const float *inv,
                        const zi_kv_head *kv, int hd, float *const *outs) {
    _Alignas(64) float vf[16 * 256];
    int nmax = 0;
    for (int r = 0; r < R; r++) {
        nmax = nr[r] > nmax ? nr[r] : nmax;
        memset(outs[r], 0, (size_t)hd * sizeof(float));
    }
    for (int j0 = 0; j0 < nmax; j0 += 16) {
        const int left = nmax - j0 < 16 ? nmax - j0 : 16;
        for (int j = 0; j < left; j++)
            kvq_row(kv->type, kvq_at(kv, kv->vq, kv->vstride, kv->vrow, j0 + j),
                    vf + (size_t)j * hd, hd);
        int r0 = 0;
        for (; r0 + 4 <= R; r0 += 4)
            kvq_pv_rows(p + (size_t)r0 * ps, ps, nr + r0, vf, hd, j0, left, 4, outs + r0);
        switch (R - r0) {
        case 3:
            kvq_pv_rows(p + (size_t)r0 * ps, ps, nr + r0, vf, hd, j0, left, 3, outs + r0);
            break;
        case 2:
            kvq_pv_rows(p + (size_t)r0 * ps, ps, nr + r0, vf, hd, j0, left, 2, outs + r0);
            break;
        case 1:
            kvq_pv_rows(p + (size_t)r0 * ps, ps, nr + r0, vf, hd, j0, left, 1, outs + r0);
            break;
        default:
            break;
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 iv = _mm512_set1_ps(inv[r]);
        for (int c = 0; c < hd; c += 16)
            _mm512_storeu_ps(outs[r] + c, _mm512_mul_ps(_mm512_loadu_ps(outs[r] + c), iv));
    }
}
#endif

/*
 * The scores of R = G * B query rows: row r = b * G + g is query head g of
 * token b (at q + b * qs + g * hd), over its nr = n + b first positions:
 * scores[r * nmax + j] = dot(row, K row j) * scale, nmax = n + B - 1. Each
 * K row is decoded once for all the rows. A score's float operations
 * depend on its row and position only (in the SIMD tables, 16 or 8
 * positions' sums side by side, the lanes of rows past a row's end zero
 * and not stored), so a token's scores are the same bits in a block of
 * any size.
 */
static void kvq_scores(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n, int hd,
                       float scale, float *scores) {
    const int R = G * B, nmax = n + B - 1;
#if defined(__AVX512F__)
    if (hd % 16 == 0 && hd <= 256) {
        _Alignas(64) float kf[16 * 256];
        const int nc = hd / 16;
        const __m512 vscale = _mm512_set1_ps(scale);
        for (int j0 = 0; j0 < nmax; j0 += 16) {
            const int left = nmax - j0 < 16 ? nmax - j0 : 16;
            for (int p = 0; p < left; p++)
                kvq_row(kv->type, kvq_at(kv, kv->kq, kv->kstride, kv->krow, j0 + p),
                        kf + (size_t)p * hd, hd);
            for (int r = 0; r < R; r++) {
                const int nr = n + r / G, lr = nr - j0 < 16 ? nr - j0 : 16;
                if (lr <= 0) continue;
                const float *qg = q + (size_t)(r / G) * qs + (size_t)(r % G) * hd;
                __m512 qv[16], acc[16]; /* nc = 16: q is partly reloaded from L1 */
                for (int c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(qg + 16 * c);
                for (int s = 0; s < 16; s++) { /* s: hsum16's lane order */
                    const int j = 4 * (s & 3) + (s >> 2);
                    acc[s] = _mm512_setzero_ps();
                    if (j >= lr) continue;
                    const float *kj = kf + (size_t)j * hd;
                    for (int c = 0; c < nc; c++)
                        acc[s] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kj + 16 * c), acc[s]);
                }
                _mm512_mask_storeu_ps(scores + (size_t)r * nmax + j0, (__mmask16)((1u << lr) - 1),
                                      _mm512_mul_ps(hsum16(acc), vscale));
            }
        }
        return;
    }
#elif defined(__AVX2__)
    if (hd % 8 == 0) {
        _Alignas(32) float kf[8][1024]; /* hd <= 1024 (model.c) */
        const __m256 vscale = _mm256_set1_ps(scale);
        for (int j0 = 0; j0 < nmax; j0 += 8) {
            const int left = nmax - j0 < 8 ? nmax - j0 : 8;
            for (int p = 0; p < left; p++)
                kvq_row(kv->type, kvq_at(kv, kv->kq, kv->kstride, kv->krow, j0 + p), kf[p], hd);
            for (int r = 0; r < R; r++) {
                const int nr = n + r / G, lr = nr - j0 < 8 ? nr - j0 : 8;
                if (lr <= 0) continue;
                const float *qg = q + (size_t)(r / G) * qs + (size_t)(r % G) * hd;
                __m256 acc[8];
                for (int p = 0; p < 8; p++) acc[p] = _mm256_setzero_ps();
                for (int i = 0; i < hd; i += 8) {
                    const __m256 qv = _mm256_loadu_ps(qg + i);
                    for (int p = 0; p < lr; p++)
                        acc[p] = _mm256_fmadd_ps(qv, _mm256_load_ps(kf[p] + i), acc[p]);
                }
                _Alignas(32) float sv[8];
                _mm256_store_ps(sv, _mm256_mul_ps(hsum8x8(acc), vscale));
                memcpy(scores + (size_t)r * nmax + j0, sv, sizeof(float) * (size_t)lr);
            }
        }
        return;
    }
#endif
    float row[1024]; /* hd <= 1024 (model.c) */
    for (int j = 0; j < nmax; j++) {
        kvq_row(kv->type, kvq_at(kv, kv->kq, kv->kstride, kv->krow, j), row, hd);
        for (int r = 0; r < R; r++)
            if (j < n + r / G)
                scores[(size_t)r * nmax + j] =
                    dot_f32(q + (size_t)(r / G) * qs + (size_t)(r % G) * hd, row, hd) * scale;
    }
}

/*
 * attend_block (cpu_kernels.h; B = 1: attend) over a cache of a --kv-type
 * format: kvq_scores, each row's softmax (glibc's expf, a double sum in
 * position order), then the sum of p*v by fused multiply-adds in position
 * order, each V row decoded once for all the rows. A token's output is
 * the same bits in a block as alone.
 */
static void attend_q_block(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n,
                           int hd, float scale, float softcap, float *scores, float *out,
                           size_t os) {
    const int R = G * B, nmax = n + B - 1;
    assert(R <= 64); /* attend's and attend_block's contracts */
    const int rot = zi_kv_rotated(kv->type, hd);
    if (rot) { /* the rows are stored rotated (cpu_kernels.h): so is the query */
        _Alignas(64) float qr[64 * 256];
        for (int r = 0; r < R; r++) {
            memcpy(qr + (size_t)r * hd, q + (size_t)(r / G) * qs + (size_t)(r % G) * hd,
                   (size_t)hd * sizeof(float));
            zi_kv_rotate(qr + (size_t)r * hd, hd);
        }
        kvq_scores(qr, (size_t)G * hd, G, B, kv, n, hd, scale, scores);
    } else {
        kvq_scores(q, qs, G, B, kv, n, hd, scale, scores);
    }
    float inv[64];
    for (int r = 0; r < R; r++) {
        float *sg = scores + (size_t)r * nmax, mx = -INFINITY;
        const int nr = n + r / G;
        if (softcap > 0.0f) softcap_scores(sg, (size_t)nr, softcap);
        for (int j = 0; j < nr; j++) mx = sg[j] > mx ? sg[j] : mx;
        kvq_exp(sg, nr, mx);
        double sum = 0.0;
        for (int j = 0; j < nr; j++) sum += sg[j];
        if (kv->sinks) sum += exp((double)kv->sinks[r % G] - mx);
        inv[r] = (float)(1.0 / sum);
    }
#if defined(__AVX512F__)
    if (hd % 16 == 0 && hd <= 256) {
        /* rows whose sums fit in 16 registers, at most kvq_pv16's 4 */
        const int nc = hd / 16, hg = 16 / nc < 4 ? 16 / nc : 4;
        int nrow[64];
        float *orow[64];
        for (int r = 0; r < R; r++) {
            nrow[r] = n + r / G;
            orow[r] = out + (size_t)(r / G) * os + (size_t)(r % G) * hd;
        }
        if (hd % 64 == 0 && R > 1 && nc > 4) {
            kvq_pv_wide(scores, (size_t)nmax, R, nrow, inv, kv, hd, orow);
            if (rot)
                for (int r = 0; r < R; r++) zi_kv_rotate(orow[r], hd);
            return;
        }
        for (int r0 = 0; r0 < R; r0 += hg) {
            const float *sg = scores + (size_t)r0 * nmax;
            const int ng = R - r0 < hg ? R - r0 : hg;
#define KVQ_PV(NC)                                                                                 \
    switch (ng) {                                                                                  \
    case 1:                                                                                        \
        kvq_pv16(sg, (size_t)nmax, nrow + r0, inv + r0, kv, NC, 1, orow + r0);                     \
        break;                                                                                     \
    case 2:                                                                                        \
        kvq_pv16(sg, (size_t)nmax, nrow + r0, inv + r0, kv, NC, 2, orow + r0);                     \
        break;                                                                                     \
    case 3:                                                                                        \
        kvq_pv16(sg, (size_t)nmax, nrow + r0, inv + r0, kv, NC, 3, orow + r0);                     \
        break;                                                                                     \
    default:                                                                                       \
        kvq_pv16(sg, (size_t)nmax, nrow + r0, inv + r0, kv, NC, 4, orow + r0);                     \
        break;                                                                                     \
    }
            switch (nc) { /* constant trip counts for the common head sizes */
            case 4:
                KVQ_PV(4);
                break;
            case 8:
                KVQ_PV(8);
                break;
            case 16:
                KVQ_PV(16);
                break;
            default:
                KVQ_PV(nc);
                break;
            }
#undef KVQ_PV
        }
        if (rot)
            for (int r = 0; r < R; r++) zi_kv_rotate(orow[r], hd);
        return;
    }
#endif
    for (int r = 0; r < R; r++)
        memset(out + (size_t)(r / G) * os + (size_t)(r % G) * hd, 0, (size_t)hd * sizeof(float));
    float row[1024]; /* hd <= 1024 (model.c) */
    for (int j = 0; j < nmax; j++) {
        kvq_row(kv->type, kvq_at(kv, kv->vq, kv->vstride, kv->vrow, j), row, hd);
        for (int r = 0; r < R; r++)
            if (j < n + r / G)
                kvq_fma_row(out + (size_t)(r / G) * os + (size_t)(r % G) * hd,
                            scores[(size_t)r * nmax + j], row, hd);
    }
    for (int r = 0; r < R; r++) {
        float *o = out + (size_t)(r / G) * os + (size_t)(r % G) * hd;
        scale_f32(o, inv[r], hd);
        if (rot) zi_kv_rotate(o, hd);
    }
}

static void attend_q(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                     float softcap, float *scores, float *out) {
    attend_q_block(q, 0, G, 1, kv, n, hd, scale, softcap, scores, out, 0);
}

/* The table's attend and attend_block: the default layout's kernels
 * (cpu_kernels_attention.h), or the ones above for the other types. */
static void attend_kv(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                      float softcap, float *scores, float *out) {
    if (kv->type != ZI_KV_DEFAULT)
        attend_q(q, G, kv, n, hd, scale, softcap, scores, out);
    else
        attend(q, G, kv, n, hd, scale, softcap, scores, out);
}

static void attend_block_kv(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n,
                            int hd, float scale, float softcap, float *scores, float *out,
                            size_t os) {
    if (kv->type != ZI_KV_DEFAULT)
        attend_q_block(q, qs, G, B, kv, n, hd, scale, softcap, scores, out, os);
    else
        attend_block(q, qs, G, B, kv, n, hd, scale, softcap, scores, out, os);
}
