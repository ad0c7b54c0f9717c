/*
 * cpu_kernels_attention.h - attention over the paged KV cache (attend):
 * scores of a query group against int16 K rows, softmax, the sum of p*V
 * over float16 V rows (cpu_kernels.h describes the cache). One of the
 * units that cpu_kernels_impl.h includes, in its order, once per
 * instruction set; it uses dot_f32 (cpu_kernels_matmul.h), tree16
 * (cpu_kernels_common.h), scale_f32 and the vector expf
 * (cpu_kernels_elementwise.h).
 *
 * What each table compiles here:
 *   scalar   attend's plain loop, for any head size.
 *   AVX2     (#if __AVX2__ && !__AVX512F__) attend_avx2, 8 positions at a
 *            time, for head sizes that are multiples of 8; the plain loop
 *            for the rest.
 *   AVX-512  (#if __AVX512F__) attend16 for head sizes 64, 128 and 256, 16
 *            positions at a time; the plain loop for the rest.
 */
/* The offset of position j's row (of hd values) in a paged cache whose
 * blocks lie `stride` apart, and of its K scale (cpu_kernels.h; j counts
 * from kv->first). */
#define ZI_KV_ROW(kv, j, stride, hd)                                                               \
    ((size_t)(kv)->blocks[((kv)->first + (j)) / (kv)->bs] * (kv)->stride +                         \
     (size_t)(((kv)->first + (j)) % (kv)->bs) * (size_t)(hd))
#define ZI_KV_SCALE(kv, j)                                                                         \
    ((kv)->ks[(size_t)(kv)->blocks[((kv)->first + (j)) / (kv)->bs] * (kv)->sstride +               \
              ((kv)->first + (j)) % (kv)->bs])

/* Attention logit soft-capping of m scores in place: s = cap * tanh(s /
 * cap), in double (tanhf's error would be multiplied by the cap), the same
 * loop in every table. Soft-capped scores lie in (-cap, cap), so the
 * softmax's max and exponentials that follow need no change. */
static void softcap_scores(float *s, size_t m, float cap) {
    const double c = cap;
    for (size_t i = 0; i < m; i++) s[i] = (float)(c * tanh(s[i] / c));
}

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
                        float softcap, float *scores, float *out) {
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
    if (softcap > 0.0f) softcap_scores(scores, (size_t)G * n, softcap);
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
        if (kv->sinks) sum += exp((double)kv->sinks[g] - mx);
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

/* Softmax sums and sum of p*V for NG query rows (a constant, so the sums
 * and the output rows stay in registers): row g's exponentials at p + g *
 * ps, over its nr[g] positions, its output row at outs[g]. The rows' double
 * sums run side by side, each in position order. Each p*v is added by one
 * fused multiply-add: half the vector operations of a multiply and an add,
 * so more V rows are in flight from memory at once (16 streams of 384-448
 * positions: 28.5 -> 27.4 ms a step), and one rounding, not two. Rows of
 * one token (the heads of a GQA group) share nr; a block of tokens
 * (attend_block) has rows whose nr differ, each stopping at its own. */
static inline __attribute__((always_inline)) void attend_pv(const float *p, size_t ps,
                                                            const int *nr, const zi_kv_head *kv,
                                                            int nc, int NG, float *const *outs,
                                                            const double *sink_terms) {
    const int32_t *blocks = kv->blocks;
    const int bs = kv->bs;
    int nmin = nr[0], nmax = nr[0];
    for (int g = 1; g < NG; g++) {
        nmin = nr[g] < nmin ? nr[g] : nmin;
        nmax = nr[g] > nmax ? nr[g] : nmax;
    }
    double sum[4] = {0.0, 0.0, 0.0, 0.0};
    for (int g = 0; g < NG; g++)
        for (int j = 0; j < nr[g]; j++) sum[g] += p[(size_t)g * ps + j];
    __m512 o[4][16]; /* NG * nc <= 16 used (attend16's hg) */
    for (int g = 0; g < NG; g++)
        for (int c = 0; c < nc; c++) o[g][c] = _mm512_setzero_ps();
    const int f = kv->first; /* the window's first row, in block 0 */
    const uint16_t *vj = kv->v + (size_t)blocks[0] * kv->vstride + (size_t)f * 16 * nc;
    const int last = (f + nmax - 1) / bs;
    int j = 0, jb = 0, jr = f;
    /* Rows j < nmin are every row's; past it, each row's own. */
#define ATTEND_PV_ROW(CHECK)                                                                       \
    do {                                                                                           \
        if (jr == bs) /* the next cache block */                                                   \
            jr = 0, vj = kv->v + (size_t)blocks[++jb] * kv->vstride;                               \
        if (jr == 0 && jb < last) { /* and the one after it, while this one is read */             \
            const char *nv = (const char *)(kv->v + (size_t)blocks[jb + 1] * kv->vstride);         \
            for (int i = 0; i < bs * 32 * nc; i += 64) _mm_prefetch(nv + i, _MM_HINT_T0);         \
        }                                                                                          \
        for (int g = 0; g < NG; g++) {                                                             \
            if (CHECK && j >= nr[g]) continue;                                                     \
            __m512 pg = _mm512_set1_ps(p[(size_t)g * ps + j]);                                     \
            for (int c = 0; c < nc; c++)                                                           \
                o[g][c] = _mm512_fmadd_ps(pg, ld_f16x16(vj + 16 * c), o[g][c]);                    \
        }                                                                                          \
    } while (0)
    for (; j < nmin; j++, jr++, vj += 16 * nc) ATTEND_PV_ROW(0);
    for (; j < nmax; j++, jr++, vj += 16 * nc) ATTEND_PV_ROW(1);
#undef ATTEND_PV_ROW
    for (int g = 0; g < NG; g++) {
        if (sink_terms) sum[g] += sink_terms[g]; /* after the positions, as ggml */
        __m512 iv = _mm512_set1_ps((float)(1.0 / sum[g]));
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(outs[g] + 16 * c, _mm512_mul_ps(o[g][c], iv));
    }
}

/* 16 cached int16 K codes as floats (exact). */
static inline __m512 ld_i16x16(const int16_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)p)));
}

/*
 * attend for head sizes of 64, 128 and 256 (nc = hd / 16 constant), for a
 * block of B consecutive tokens of one sequence (B = 1: one token): row r
 * = b * G + g is query head g of token b, at q + b * qs + g * hd, over the
 * first n + b positions (causal), its output at out + b * os + g * hd, its
 * scores at scores + r * (n + B - 1). Per row, the same float operations as
 * the generic version below (dot_f32's FMA chain and reduction over the
 * codes as floats, times the row's scale, times `scale`; glibc's expf, a
 * double sum in position order, then the sum of p*v by fused
 * multiply-adds, in position order), so a row's output is identical to it
 * and never depends on G or B. Faster by doing 16 scores' reductions and
 * exponentials at once, converting 16 K rows once for all the rows, and
 * keeping the output rows in registers instead of memory; a block of tokens
 * reads each K and V row once for all its tokens (prefill of long prompts:
 * the cache's rows come from memory once per block, not once per token).
 */
static inline __attribute__((always_inline)) void
attend16(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n, int nc, float scale,
         float softcap, float *scores, float *out, size_t os) {
    const int hd = 16 * nc, bs = kv->bs, R = G * B, nmax = n + B - 1;
    const __m512 vscale = _mm512_set1_ps(scale);
    _Alignas(64) float kf[16 * 256], ksr[16];
    for (int j0 = 0; j0 < nmax; j0 += 16) {
        const int left = nmax - j0 < 16 ? nmax - j0 : 16;
        const __mmask16 live = (__mmask16)((1u << left) - 1);
        /* Usually the 16 rows lie in one cache block, back to back. */
        const int jr0 = (kv->first + j0) % bs;
        __m512 ksv;
        /* The next 16 rows' K, and in attend_pv the next block's V, are
         * asked for while these are read: the cache's runs are short (2 KiB
         * a block and KV head) and scattered, too short for the hardware's
         * prefetchers (16 streams of 384-448 positions: 27.1 -> 24.2 ms a
         * step, both together). */
        if (j0 + 16 < nmax) {
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
            const size_t b = (size_t)kv->blocks[(kv->first + j0) / bs];
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
        for (int r = 0; r < R; r++) {
            /* This row's positions in the 16: as if it were alone (B = 1). */
            const int nr = n + r / G, lr = nr - j0 < 16 ? nr - j0 : 16;
            if (lr <= 0) continue;
            const float *qg = q + (size_t)(r / G) * qs + (size_t)(r % G) * hd;
            __m512 qv[16], acc[16]; /* nc = 16: q is partly reloaded from L1 */
            for (int c = 0; c < nc; c++) qv[c] = _mm512_loadu_ps(qg + 16 * c);
            for (int s = 0; s < 16; s++) { /* s: hsum16's lane order */
                const int j = 4 * (s & 3) + (s >> 2);
                acc[s] = _mm512_setzero_ps();
                if (j >= lr) continue; /* rows past the end: zero sums, not stored */
                const float *kj = kf + (size_t)j * hd;
                acc[s] = _mm512_fmadd_ps(qv[0], _mm512_load_ps(kj), acc[s]);
                for (int c = 1; c < nc; c++)
                    acc[s] = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kj + 16 * c), acc[s]);
            }
            _mm512_mask_storeu_ps(scores + (size_t)r * nmax + j0, (__mmask16)((1u << lr) - 1),
                                  _mm512_mul_ps(_mm512_mul_ps(hsum16(acc), ksv), vscale));
        }
    }
    assert(R <= 64); /* attend_block's contract (the backend passes at most 32) */
    int nrow[64];
    float *orow[64];
    for (int r = 0; r < R; r++) {
        nrow[r] = n + r / G;
        orow[r] = out + (size_t)(r / G) * os + (size_t)(r % G) * hd;
    }
    double sink_terms[64]; /* exp(sink - max) per row, when kv has sinks */
    for (int r = 0; r < R; r++) {
        float *sg = scores + (size_t)r * nmax;
        const int nr = nrow[r];
        if (softcap > 0.0f) softcap_scores(sg, (size_t)nr, softcap);
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int j = 0; j < nr; j += 16) { /* NaN scores are skipped, as in the scalar loop */
            __mmask16 m = nr - j >= 16 ? 0xffff : (__mmask16)((1u << (nr - j)) - 1);
            mv = _mm512_mask_max_ps(mv, m, _mm512_maskz_loadu_ps(m, sg + j), mv);
        }
        const float mxs = _mm512_reduce_max_ps(mv);
        __m512 mx = _mm512_set1_ps(mxs);
        if (kv->sinks) sink_terms[r] = exp((double)kv->sinks[r % G] - mxs);
        for (int j = 0; j < nr; j += 16) {
            __mmask16 m = nr - j >= 16 ? 0xffff : (__mmask16)((1u << (nr - j)) - 1);
            __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + j), mx);
            _mm512_mask_storeu_ps(sg + j, m, exp16(x));
        }
    }
    const int hg = 16 / nc; /* rows whose output fits in 16 registers */
    for (int r0 = 0; r0 < R; r0 += hg) {
        const float *sg = scores + (size_t)r0 * nmax;
        switch (R - r0 < hg ? R - r0 : hg) {
        case 1:
            attend_pv(sg, (size_t)nmax, nrow + r0, kv, nc, 1, orow + r0,
                      kv->sinks ? sink_terms + r0 : NULL);
            break;
        case 2:
            attend_pv(sg, (size_t)nmax, nrow + r0, kv, nc, 2, orow + r0,
                      kv->sinks ? sink_terms + r0 : NULL);
            break;
        case 3:
            attend_pv(sg, (size_t)nmax, nrow + r0, kv, nc, 3, orow + r0,
                      kv->sinks ? sink_terms + r0 : NULL);
            break;
        default:
            attend_pv(sg, (size_t)nmax, nrow + r0, kv, nc, 4, orow + r0,
                      kv->sinks ? sink_terms + r0 : NULL);
            break;
        }
    }
}
#endif

static void attend(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                   float softcap, float *scores, float *out) {
#if defined(__AVX512F__)
    /* The common head sizes with constant trip counts (rows in registers). */
    if (hd == 64) {
        attend16(q, 0, G, 1, kv, n, 4, scale, softcap, scores, out, 0);
        return;
    }
    if (hd == 128) {
        attend16(q, 0, G, 1, kv, n, 8, scale, softcap, scores, out, 0);
        return;
    }
    if (hd == 256) { /* gemma3 */
        attend16(q, 0, G, 1, kv, n, 16, scale, softcap, scores, out, 0);
        return;
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    if (hd % 8 == 0) {
        attend_avx2(q, G, kv, n, hd, scale, softcap, scores, out);
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
    if (softcap > 0.0f) softcap_scores(scores, (size_t)G * n, softcap);
    float inv[64]; /* G <= 64, checked by the caller */
    for (int g = 0; g < G; g++) {
        float *sg = scores + (size_t)g * n, mx = -INFINITY;
        for (int j = 0; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < n; j++) {
            sg[j] = expf(sg[j] - mx);
            sum += sg[j];
        }
        if (kv->sinks) sum += exp((double)kv->sinks[g] - mx);
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

/* attend for B consecutive tokens of one sequence at once (cpu_kernels.h);
 * a token's output is bit-identical to attend's for it alone. The AVX-512
 * table reads the cache once for the block (attend16); the others, and
 * other head sizes, run attend token by token. */
static void attend_block(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n,
                         int hd, float scale, float softcap, float *scores, float *out,
                         size_t os) {
#if defined(__AVX512F__)
    if (hd == 64 || hd == 128 || hd == 256) {
        switch (hd) { /* constant trip counts */
        case 64: attend16(q, qs, G, B, kv, n, 4, scale, softcap, scores, out, os); break;
        case 128: attend16(q, qs, G, B, kv, n, 8, scale, softcap, scores, out, os); break;
        default: attend16(q, qs, G, B, kv, n, 16, scale, softcap, scores, out, os); break;
        }
        return;
    }
#endif
    for (int b = 0; b < B; b++)
        attend(q + (size_t)b * qs, G, kv, n + b, hd, scale, softcap, scores, out + (size_t)b * os);
}
