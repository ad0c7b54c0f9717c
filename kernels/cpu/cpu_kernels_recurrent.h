/*
 * cpu_kernels_recurrent.h - the hybrid models' recurrent inner loops:
 * silu_f32 and sigmoid_mul_f32 (the vector expf of the element-wise unit)
 * delta_rule_f32, a run of tokens of one sequence on one value head of
 * the gated delta rule (qwen35's DeltaNet layers), and ssm_run_f32, the
 * same for one head of the Mamba-2 scan (granitehybrid's SSM layers). One
 * of the units that cpu_kernels_impl.h includes, in its order, once per
 * instruction set.
 *
 * Every table computes the same float32 operations in the same order (the
 * scalar table with fmaf where the vector ones fuse), so all three give the
 * same bits; a token's result depends on its own inputs and state only.
 *
 * What each table compiles here:
 *   scalar   the plain loops (expf and fmaf from libm).
 *   AVX2     (#if __AVX2__ && !__AVX512F__) 8 lanes at a time, delta_rule
 *            and ssm_run on column blocks of 16, then 8, the last columns
 *            as scalar.
 *   AVX-512  (#if __AVX512F__) 16 lanes at a time, delta_rule and ssm_run
 *            on column blocks of 64, then 16, the last columns as scalar.
 */

/* x[i] = x[i] / (1 + expf(-x[i])): SwiGLU's operations with an up of 1. */
static void silu_f32(float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m512 gv = _mm512_loadu_ps(x + i);
        __m512 e = exp16(_mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(gv), _mm512_set1_epi32((int)0x80000000))));
        _mm512_storeu_ps(x + i, _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(x + i);
        __m256 e = exp8_avx2(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));
        _mm256_storeu_ps(x + i, _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
#endif
    for (; i < n; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

/* y[i] = y[i] / (1 + expf(-g[i])) (y times sigmoid(g)). */
static void sigmoid_mul_f32(float *y, const float *g, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_castsi512_ps(_mm512_xor_si512(
            _mm512_castps_si512(_mm512_loadu_ps(g + i)), _mm512_set1_epi32((int)0x80000000))));
        _mm512_storeu_ps(
            y + i, _mm512_div_ps(_mm512_loadu_ps(y + i), _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8_avx2(_mm256_xor_ps(_mm256_loadu_ps(g + i), _mm256_set1_ps(-0.0f)));
        _mm256_storeu_ps(
            y + i, _mm256_div_ps(_mm256_loadu_ps(y + i), _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    }
#endif
    for (; i < n; i++) y[i] = y[i] / (1.0f + expf(-g[i]));
}

/*
 * A run of n consecutive tokens of one sequence on one value head
 * (cpu_kernels.h's delta_rule). Column j of S depends only on column j and
 * the tokens' vectors, so the columns go in blocks that stay in L1 for the
 * whole run, and each token takes one pass over the block's rows, which
 * also gathers the next token's S^T k:
 *   u = sum over rows i in order of fma: (S[i][j] * decay_0) k_0[i]
 *   for each token t:
 *     u = beta_t (v_t[j] - u)
 *     rows i in order: s = fma(k_t[i], u, S[i][j] * decay_t), stored;
 *       o = fma(s, q_t[i], o); u' = fma(s * decay_t+1, k_t+1[i], u')
 *     out_t[j] = o; u = u'
 * Per token these are the operations of the token alone (a run of 1).
 */
#define DR_BLOCK(VEC, R, SET1, ZERO, LOAD, STORE, MUL, SUB, FMA, W)                                \
    for (; j0 + (W) <= d; j0 += (W)) {                                                             \
        VEC u[R], o[R], un[R];                                                                     \
        for (int r = 0; r < (R); r++) u[r] = ZERO();                                               \
        {                                                                                          \
            const VEC dec = SET1(decay[0]);                                                        \
            for (int i = 0; i < d; i++) {                                                          \
                const float *row = S + (size_t)i * d + j0;                                         \
                const VEC kb = SET1(k[i]);                                                         \
                for (int r = 0; r < (R); r++)                                                      \
                    u[r] = FMA(MUL(LOAD(row + r * (W) / (R)), dec), kb, u[r]);                     \
            }                                                                                      \
        }                                                                                          \
        for (int t = 0; t < n; t++) {                                                              \
            const float *kt = k + (size_t)t * d, *qt = q + (size_t)t * d;                          \
            const float *vt = v + (size_t)t * vs + j0;                                             \
            const VEC dec = SET1(decay[t]), bv = SET1(beta[t]);                                    \
            for (int r = 0; r < (R); r++) {                                                        \
                u[r] = MUL(bv, SUB(LOAD(vt + r * (W) / (R)), u[r]));                               \
                o[r] = ZERO();                                                                     \
                un[r] = ZERO();                                                                    \
            }                                                                                      \
            if (t + 1 < n) {                                                                       \
                const float *kn = kt + d;                                                          \
                const VEC decn = SET1(decay[t + 1]);                                               \
                for (int i = 0; i < d; i++) {                                                      \
                    float *row = S + (size_t)i * d + j0;                                           \
                    const VEC kb = SET1(kt[i]), qb = SET1(qt[i]), knb = SET1(kn[i]);               \
                    for (int r = 0; r < (R); r++) {                                                \
                        VEC sv = FMA(kb, u[r], MUL(LOAD(row + r * (W) / (R)), dec));               \
                        STORE(row + r * (W) / (R), sv);                                            \
                        o[r] = FMA(sv, qb, o[r]);                                                  \
                        un[r] = FMA(MUL(sv, decn), knb, un[r]);                                    \
                    }                                                                              \
                }                                                                                  \
            } else {                                                                               \
                for (int i = 0; i < d; i++) {                                                      \
                    float *row = S + (size_t)i * d + j0;                                           \
                    const VEC kb = SET1(kt[i]), qb = SET1(qt[i]);                                  \
                    for (int r = 0; r < (R); r++) {                                                \
                        VEC sv = FMA(kb, u[r], MUL(LOAD(row + r * (W) / (R)), dec));               \
                        STORE(row + r * (W) / (R), sv);                                            \
                        o[r] = FMA(sv, qb, o[r]);                                                  \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < (R); r++) STORE(out + (size_t)t * os + j0 + r * (W) / (R), o[r]);  \
            for (int r = 0; r < (R); r++) u[r] = un[r];                                            \
        }                                                                                          \
    }

static void delta_rule_f32(float *S, int d, int n, const float *k, const float *q, const float *v,
                           size_t vs, const float *beta, const float *decay, float *out,
                           size_t os) {
    int j0 = 0;
#if defined(__AVX512F__)
    DR_BLOCK(__m512, 4, _mm512_set1_ps, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
             _mm512_mul_ps, _mm512_sub_ps, _mm512_fmadd_ps, 64)
    DR_BLOCK(__m512, 1, _mm512_set1_ps, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
             _mm512_mul_ps, _mm512_sub_ps, _mm512_fmadd_ps, 16)
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    DR_BLOCK(__m256, 2, _mm256_set1_ps, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
             _mm256_mul_ps, _mm256_sub_ps, _mm256_fmadd_ps, 16)
    DR_BLOCK(__m256, 1, _mm256_set1_ps, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
             _mm256_mul_ps, _mm256_sub_ps, _mm256_fmadd_ps, 8)
#endif
    for (int j = j0; j < d; j++) { /* the same operations, one column at a time */
        float u = 0.0f;
        for (int i = 0; i < d; i++) u = fmaf(S[(size_t)i * d + j] * decay[0], k[i], u);
        for (int t = 0; t < n; t++) {
            const float *kt = k + (size_t)t * d, *qt = q + (size_t)t * d;
            float o = 0.0f, un = 0.0f;
            u = beta[t] * (v[(size_t)t * vs + j] - u);
            for (int i = 0; i < d; i++) {
                const float sv = fmaf(kt[i], u, S[(size_t)i * d + j] * decay[t]);
                S[(size_t)i * d + j] = sv;
                o = fmaf(sv, qt[i], o);
                if (t + 1 < n) un = fmaf(sv * decay[t + 1], kt[d + i], un);
            }
            out[(size_t)t * os + j] = o;
            u = un;
        }
    }
}
#undef DR_BLOCK

/*
 * A run of n consecutive tokens of one sequence on one head of the Mamba-2
 * scan (cpu_kernels.h's ssm_run). The state is [n][p]: column p depends
 * only on column p, so a block of columns stays in L1 over the run and no
 * sum crosses lanes:
 *   for each token t: dx = d_t x_t[p] (one float product)
 *     rows n in order: s = fma(dx, B_t[n], S[n][p] * dA_t), stored;
 *       o = fma(s, C_t[n], o)
 *     out_t[p] = o
 */
#define SSM_BLOCK(VEC, R, SET1, ZERO, LOAD, STORE, MUL, FMA, W)                                    \
    for (; p0 + (W) <= P; p0 += (W)) {                                                             \
        for (int t = 0; t < n; t++) {                                                              \
            const float *xt = x + (size_t)t * xs + p0, *bt = B + (size_t)t * bs,                   \
                        *ct = C + (size_t)t * bs;                                                  \
            const VEC da = SET1(dA[t]), dv = SET1(d[t]);                                           \
            VEC dx[R], o[R];                                                                       \
            for (int r = 0; r < (R); r++) {                                                        \
                dx[r] = MUL(dv, LOAD(xt + r * (W) / (R)));                                         \
                o[r] = ZERO();                                                                     \
            }                                                                                      \
            for (int k = 0; k < N; k++) {                                                          \
                float *row = S + (size_t)k * P + p0;                                               \
                const VEC bk = SET1(bt[k]), ck = SET1(ct[k]);                                      \
                for (int r = 0; r < (R); r++) {                                                    \
                    VEC sv = FMA(dx[r], bk, MUL(LOAD(row + r * (W) / (R)), da));                   \
                    STORE(row + r * (W) / (R), sv);                                                \
                    o[r] = FMA(sv, ck, o[r]);                                                      \
                }                                                                                  \
            }                                                                                      \
            for (int r = 0; r < (R); r++) STORE(out + (size_t)t * os + p0 + r * (W) / (R), o[r]);  \
        }                                                                                          \
    }

static void ssm_run_f32(float *S, int P, int N, int n, const float *x, size_t xs, const float *B,
                        const float *C, size_t bs, const float *d, const float *dA, float *out,
                        size_t os) {
    int p0 = 0;
#if defined(__AVX512F__)
    SSM_BLOCK(__m512, 4, _mm512_set1_ps, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
              _mm512_mul_ps, _mm512_fmadd_ps, 64)
    SSM_BLOCK(__m512, 1, _mm512_set1_ps, _mm512_setzero_ps, _mm512_loadu_ps, _mm512_storeu_ps,
              _mm512_mul_ps, _mm512_fmadd_ps, 16)
#endif
#if defined(__AVX2__) && !defined(__AVX512F__)
    SSM_BLOCK(__m256, 2, _mm256_set1_ps, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
              _mm256_mul_ps, _mm256_fmadd_ps, 16)
    SSM_BLOCK(__m256, 1, _mm256_set1_ps, _mm256_setzero_ps, _mm256_loadu_ps, _mm256_storeu_ps,
              _mm256_mul_ps, _mm256_fmadd_ps, 8)
#endif
    for (int p = p0; p < P; p++) /* the same operations, one column at a time */
        for (int t = 0; t < n; t++) {
            const float *bt = B + (size_t)t * bs, *ct = C + (size_t)t * bs;
            const float dx = d[t] * x[(size_t)t * xs + p];
            float o = 0.0f;
            for (int k = 0; k < N; k++) {
                const float sv = fmaf(dx, bt[k], S[(size_t)k * P + p] * dA[t]);
                S[(size_t)k * P + p] = sv;
                o = fmaf(sv, ct[k], o);
            }
            out[(size_t)t * os + p] = o;
        }
}
#undef SSM_BLOCK
