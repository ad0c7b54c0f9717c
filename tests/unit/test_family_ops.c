/*
 * test_family_ops.c - the backend ops that model families beyond llama use
 * (model_worker/family.h), against plain double arithmetic, on every CPU
 * kernel table this machine runs (scalar, avx2, avx512):
 *   - GeGLU with GELU's tanh approximation (the kernel tables' geglu, and
 *     the backend op), the tables bit-identical to the scalar one;
 *   - per-head RMSNorm (rmsnorm over n_tokens * n_heads rows of head_dim,
 *     as model.c calls it for attn_q_norm / attn_k_norm);
 *   - NEOX RoPE (pairs i, i + rope_dim/2), two bases alternating;
 *   - RoPE with frequency factors, a linear scale and an attention factor
 *     (Llama 3's rope_freqs, phi3's long/short factors), both layouts,
 *     parameter sets alternating and a factor vector rewritten in place;
 *   - sliding-window attention over a paged cache: a token at position p
 *     sees positions p - window + 1..p only, windows that start inside a
 *     block and on a block edge, head sizes 256 (gemma3), 64 and 40;
 *   - the same attention with attention logit soft-capping (gemma2:
 *     scores s -> cap * tanh(s / cap) before the softmax);
 *   - scale and logit soft-capping; a bias vector added to every row;
 *   - conv_state (lfm2's short convolution, its window carried in a
 *     state per sequence) and mul; delta_net (qwen35's gated delta rule,
 *     its matrix state per sequence and head), silu and sigmoid_mul;
 *   - ssm_scan (granitehybrid's Mamba-2 selective scan, a P x N state per
 *     sequence and head, groups of B and C) and rmsnorm_groups;
 *   - a backend without these ops refuses gemma3 / gemma2 / biased / hybrid
 *     files by name.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "family.h"
#include "test_rand.h"

static zi_test_rng rng = {0x9e3779b97f4a7c15ull};
static float frand(float lo, float hi) {
    return zi_test_frand(&rng, lo, hi);
}

static const char *isas[] = {"scalar", "avx2", "avx512"};

static zi_backend *make_backend(const char *isa, int threads) {
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads, .isa = isa};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    return be;
}

static double gelu_tanh(double g) {
    return 0.5 * g * (1.0 + tanh(sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

/* GeGLU in every table: within float rounding of the double formula, and
 * the same bits as the scalar table (including infinities, NaN, and a
 * tail shorter than a vector). */
static void test_geglu(void **state) {
    (void)state;
    enum { N = 4099 };
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        g[i] = i < 4000 ? frand(-8, 8) * (i % 7 == 0 ? 4.0f : 1.0f) : frand(-60, 60);
        u[i] = frand(-3, 3);
    }
    g[0] = INFINITY, g[1] = -INFINITY, g[2] = NAN, g[3] = 0.0f, g[4] = -0.0f, g[5] = 1e20f;
    zi_cpu_kernels_scalar.geglu(want, g, u, N);
    for (int i = 3; i < N; i++) {
        double r = gelu_tanh(g[i]) * u[i];
        if (!(fabs(want[i] - r) <= 2e-6 * fabs(g[i] * u[i]) + 1e-30))
            fail_msg("scalar geglu(%.9g, %.9g) = %.9g, want %.9g", g[i], u[i], want[i], r);
    }
    assert_true(isinf(want[0]) && isnan(want[2])); /* gelu(-inf) is NaN, as in double */
    for (int t = 0; t < 3; t++) {
        const zi_cpu_kernels *k = zi_cpu_kernels_by_name(isas[t]);
        if (!k) continue;
        k->geglu(got, g, u, N);
        for (int i = 0; i < N; i++)
            if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
                fail_msg("%s geglu(%.9g, %.9g) = %.9g, want %.9g", isas[t], g[i], u[i], got[i],
                         want[i]);
        /* the backend op, large enough to run on the pool, in place */
        zi_backend *be = make_backend(isas[t], 2);
        memcpy(got, g, sizeof(float) * N);
        be->ops->geglu(be, got, got, u, N);
        assert_memory_equal(got, want, sizeof(float) * N);
        zi_backend_free(be);
    }
    free(g), free(u), free(want), free(got);
}

/* rmsnorm over T * H rows of hd: each head normalized on its own with the
 * one hd-long weight (attn_q_norm), in place. */
static void test_per_head_norm(void **state) {
    (void)state;
    const int T = 37, H = 4, hd = 256;
    const float eps = 1e-6f;
    float *x = malloc(sizeof(float) * T * H * hd), *y = malloc(sizeof(float) * T * H * hd);
    float w[256];
    for (int i = 0; i < T * H * hd; i++) x[i] = frand(-3, 3) * (i % 256 < 8 ? 20.0f : 1.0f);
    for (int i = 0; i < hd; i++) w[i] = frand(-2, 4);
    for (int t = 0; t < 3; t++) {
        if (!zi_cpu_kernels_by_name(isas[t])) continue;
        zi_backend *be = make_backend(isas[t], 2);
        memcpy(y, x, sizeof(float) * T * H * hd);
        be->ops->rmsnorm(be, y, y, w, T * H, hd, eps);
        for (int r = 0; r < T * H; r++) {
            double ss = 0;
            for (int i = 0; i < hd; i++) ss += (double)x[r * hd + i] * x[r * hd + i];
            double inv = 1.0 / sqrt(ss / hd + eps);
            for (int i = 0; i < hd; i++) {
                double want = x[r * hd + i] * inv * w[i];
                if (fabs(y[r * hd + i] - want) > 1e-5 * (1 + fabs(want)))
                    fail_msg("%s: row %d [%d] = %.9g, want %.9g", isas[t], r, i, y[r * hd + i],
                             want);
            }
        }
        zi_backend_free(be);
    }
    free(x), free(y);
}

/* NEOX RoPE: pair i is (x[i], x[i + rope_dim/2]), turned by pos *
 * base^(-2i/rope_dim); dims past rope_dim untouched. Bases alternate as a
 * gemma3 model's local and global layers do (the backend caches both). */
static void test_rope_neox(void **state) {
    (void)state;
    const int T = 9, H = 3, hd = 64;
    const int rope_dims[2] = {64, 32};
    const float bases[3] = {10000.0f, 1e6f, 10000.0f};
    int32_t pos[9] = {0, 1, 2, 511, 512, 513, 4000, 7, 30000};
    float *x = malloc(sizeof(float) * T * H * hd), *y = malloc(sizeof(float) * T * H * hd);
    for (int i = 0; i < T * H * hd; i++) x[i] = frand(-2, 2);
    zi_backend *be = make_backend(NULL, 1);
    for (int rd = 0; rd < 2; rd++)
        for (int b = 0; b < 3; b++) {
            const int rope_dim = rope_dims[rd];
            memcpy(y, x, sizeof(float) * T * H * hd);
            const zi_rope_freqs rf = {bases[b], 1.0f, 1.0f, NULL, 0, 0, 0};
            be->ops->rope_neox(be, y, pos, T, H, hd, rope_dim, &rf);
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    const float *xr = x + ((size_t)t * H + h) * hd;
                    const float *yr = y + ((size_t)t * H + h) * hd;
                    const int half = rope_dim / 2;
                    for (int i = 0; i < half; i++) {
                        double th = pos[t] * pow(bases[b], -2.0 * i / rope_dim);
                        double a = xr[i] * cos(th) - xr[i + half] * sin(th);
                        double c = xr[i] * sin(th) + xr[i + half] * cos(th);
                        assert_true(fabs(yr[i] - a) < 2e-5);
                        assert_true(fabs(yr[i + half] - c) < 2e-5);
                    }
                    for (int i = rope_dim; i < hd; i++) assert_true(yr[i] == xr[i]);
                }
        }
    zi_backend_free(be);
    free(x), free(y);
}

/* RoPE with llama.cpp's rope_ext parameters (no YaRN): pair i turns by
 * pos * freq_scale * base^(-2i/rope_dim) / factors[i], cos and sin times
 * mscale. Calls with the same positions and different parameters, and a
 * factor vector changed in place between calls, must not reuse the CPU
 * backend's cos/sin table. */
/* One backend, passes of different shapes in a row: fewer tokens of a
 * wider rope_dim fit the cached cos/sin table but not its positions (the
 * table and the positions must grow apart; ASan sees an overflow else). */
static void test_rope_table_shapes(void **state) {
    (void)state;
    struct {
        int T, hd, rope_dim;
    } shapes[] = {/* the two cached tables (used in turn) both get 1 x 256 */
                  {1, 256, 256}, {1, 256, 256}, {7, 64, 32}, {6, 64, 32},
                  {9, 64, 64},   {2, 256, 128}, {40, 16, 16}};
    zi_backend *be = make_backend(NULL, 1);
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int T = shapes[k].T, hd = shapes[k].hd, rope_dim = shapes[k].rope_dim;
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
        float *x = malloc(sizeof(float) * (size_t)T * hd),
              *y = malloc(sizeof(float) * (size_t)T * hd);
        for (int t = 0; t < T; t++) pos[t] = 3 * t + (int)k;
        for (int i = 0; i < T * hd; i++) x[i] = frand(-2, 2);
        memcpy(y, x, sizeof(float) * (size_t)T * hd);
        const zi_rope_freqs rf = {10000.0f, 1.0f, 1.0f, NULL, 0, 0, 0};
        be->ops->rope_neox(be, y, pos, T, 1, hd, rope_dim, &rf);
        const int half = rope_dim / 2;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                const float *xr = x + (size_t)t * hd, *yr = y + (size_t)t * hd;
                double th = pos[t] * pow(10000.0, -2.0 * i / rope_dim);
                assert_true(fabs(yr[i] - (xr[i] * cos(th) - xr[i + half] * sin(th))) < 2e-5);
                assert_true(fabs(yr[i + half] - (xr[i] * sin(th) + xr[i + half] * cos(th))) < 2e-5);
            }
        free(pos), free(x), free(y);
    }
    zi_backend_free(be);
}

static void test_rope_factors(void **state) {
    (void)state;
    enum { T = 7, H = 2, HD = 48 };
    int32_t pos[T] = {0, 1, 5, 100, 4097, 8191, 131071};
    float *x = malloc(sizeof(float) * T * H * HD), *y = malloc(sizeof(float) * T * H * HD);
    for (int i = 0; i < T * H * HD; i++) x[i] = frand(-2, 2);
    float fac_a[HD / 2], fac_b[HD / 2];
    for (int i = 0; i < HD / 2; i++) fac_a[i] = 1.0f + (float)i * 1.7f, fac_b[i] = frand(0.5f, 40);
    const zi_rope_freqs sets[] = {
        {500000.0f, 1.0f, 1.0f, fac_a, 0, 0, 0}, {500000.0f, 1.0f, 1.0f, NULL, 0, 0, 0},
        {10000.0f, 0.25f, 1.0f, NULL, 0, 0, 0},  {10000.0f, 1.0f, 1.19f, fac_b, 0, 0, 0},
        {500000.0f, 1.0f, 1.0f, fac_a, 0, 0, 0}, {10000.0f, 0.5f, 0.9f, fac_b, 0, 0, 0}};
    const int rope_dims[2] = {HD, 32};
    for (int threads = 1; threads <= 2; threads++) {
        zi_backend *be = make_backend(NULL, threads);
        for (int neox = 0; neox < 2; neox++)
            for (int rd = 0; rd < 2; rd++)
                for (size_t k = 0; k < sizeof sets / sizeof sets[0] + 1; k++) {
                    const int rope_dim = rope_dims[rd], half = rope_dim / 2;
                    zi_rope_freqs rf = sets[k % (sizeof sets / sizeof sets[0])];
                    if (k == sizeof sets / sizeof sets[0]) fac_a[3] *= 3.0f; /* in place */
                    memcpy(y, x, sizeof(float) * T * H * HD);
                    (neox ? be->ops->rope_neox : be->ops->rope)(be, y, pos, T, H, HD, rope_dim,
                                                                &rf);
                    for (int t = 0; t < T; t++)
                        for (int h = 0; h < H; h++) {
                            const float *xr = x + ((size_t)t * H + h) * HD;
                            const float *yr = y + ((size_t)t * H + h) * HD;
                            for (int i = 0; i < half; i++) {
                                double th = pos[t] * (double)rf.freq_scale *
                                            pow(rf.base, -2.0 * i / rope_dim) /
                                            (rf.factors ? rf.factors[i] : 1.0);
                                int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                                double c = cos(th) * rf.mscale, s = sin(th) * rf.mscale;
                                double a = xr[i0] * c - xr[i1] * s, b = xr[i0] * s + xr[i1] * c;
                                if (fabs(yr[i0] - a) > 3e-5 || fabs(yr[i1] - b) > 3e-5)
                                    fail_msg("neox %d set %zu t %d pair %d: %g %g, want %g %g",
                                             neox, k, t, i, yr[i0], yr[i1], a, b);
                            }
                            for (int i = rope_dim; i < HD; i++) assert_true(yr[i] == xr[i]);
                        }
                    if (k == sizeof sets / sizeof sets[0]) fac_a[3] /= 3.0f;
                }
        zi_backend_free(be);
    }
    free(x), free(y);
}

/* Windowed attention through the backend, for a batch of every position at
 * once and for single decode tokens, against softmax(q.K * scale) V in
 * double over the window only (on the unrounded K and V: within the
 * cache's rounding). Windows of 1, 7 and the block size (edges on block
 * boundaries), 33, and one longer than the sequence (= no window); blocks
 * out of order; 1 and 3 threads must agree bit for bit. */
static void test_window_attention(void **state) {
    (void)state;
    const int heads = 4, kvh = 1, npos = 70;
    const int hds[3] = {256, 64, 40};
    for (int ii = 0; ii < 3; ii++) {
        if (!zi_cpu_kernels_by_name(isas[ii])) continue;
        for (int hi = 0; hi < 3; hi++)
            for (int bs = 5; bs <= 16; bs += 11) {
                const int hd = hds[hi], kvd = kvh * hd, nblk = (npos + bs - 1) / bs + 1;
                const int windows[5] = {1, 7, bs, 33, 1000};
                float *k = malloc(sizeof(float) * npos * kvd);
                float *v = malloc(sizeof(float) * npos * kvd);
                float *q = malloc(sizeof(float) * npos * heads * hd);
                float *out[2] = {malloc(sizeof(float) * npos * heads * hd),
                                 malloc(sizeof(float) * npos * heads * hd)};
                for (int i = 0; i < npos * kvd; i++) k[i] = frand(-2, 2), v[i] = frand(-1, 1);
                for (int i = 0; i < npos * heads * hd; i++) q[i] = frand(-0.5f, 0.5f);
                int32_t table[32], pos[70], seq[70];
                for (int b = 0; b < nblk; b++) table[b] = nblk - 1 - b; /* reversed */
                for (int t = 0; t < npos; t++) pos[t] = t, seq[t] = 0;
                for (int wc = 0; wc < 7; wc++) {
                    /* 0..4: the windows; 5, 6: soft-capped scores (no window
                     * and window 7) with a cap that bends most of them */
                    const int wi = wc < 5 ? wc : (wc == 5 ? 4 : 1);
                    const int window = windows[wi];
                    const float cap = wc < 5 ? 0.0f : 0.15f;
                    for (int nt = 1; nt <= 3; nt += 2) {
                        zi_backend *be = make_backend(isas[ii], nt);
                        zi_error err = {0};
                        assert_true(be->attn_window);
                        assert_int_equal(be->ops->reserve(be, npos, heads * hd, npos, &err), ZI_OK);
                        size_t rows = (size_t)nblk * bs * kvh;
                        void *kc =
                            calloc(1, rows * ((size_t)hd * be->kv_k_bytes + be->kv_k_row_extra));
                        void *vc = calloc(1, rows * (size_t)hd * be->kv_v_bytes);
                        zi_attn_shape sh = {heads,  kvh, hd, bs, npos, 1.0f / sqrtf((float)hd),
                                            window, cap, NULL, 0, 0};
                        zi_batch_view all = {npos, pos, seq, table, 32, NULL};
                        be->ops->kv_store(be, kc, vc, k, v, &all, &sh);
                        float *o = out[nt / 2];
                        be->ops->attention(be, o, q, kc, vc, &all, &sh);
                        /* a decode token alone gives the same as in the batch */
                        float one_out[4 * 256];
                        for (int p = 3; p < npos; p += 29) {
                            zi_batch_view one = {1, &pos[p], seq, table, 32, NULL};
                            be->ops->attention(be, one_out, q + (size_t)p * heads * hd, kc, vc,
                                               &one, &sh);
                            assert_memory_equal(one_out, o + (size_t)p * heads * hd,
                                                sizeof(float) * heads * hd);
                        }
                        for (int p = 0; p < npos; p++) {
                            const int start = p - window + 1 > 0 ? p - window + 1 : 0;
                            for (int h = 0; h < heads; h++) {
                                const int g = h / (heads / kvh);
                                const float *qh = q + ((size_t)p * heads + h) * hd;
                                double w[70], sum = 0, mx = -1e300;
                                for (int j = start; j <= p; j++) {
                                    double d = 0;
                                    for (int i = 0; i < hd; i++)
                                        d += (double)qh[i] * k[j * kvd + g * hd + i];
                                    w[j] = d * sh.scale;
                                    if (cap > 0) w[j] = cap * tanh(w[j] / cap);
                                    mx = w[j] > mx ? w[j] : mx;
                                }
                                for (int j = start; j <= p; j++) sum += w[j] = exp(w[j] - mx);
                                for (int i = 0; i < hd; i++) {
                                    double r = 0;
                                    for (int j = start; j <= p; j++)
                                        r += w[j] / sum * v[j * kvd + g * hd + i];
                                    double got = o[((size_t)p * heads + h) * hd + i];
                                    if (fabs(got - r) > 2e-3)
                                        fail_msg("%s hd %d bs %d window %d cap %g pos %d head %d "
                                                 "[%d]: %.6f, want %.6f",
                                                 isas[ii], hd, bs, window, cap, p, h, i, got, r);
                                }
                            }
                        }
                        zi_backend_free(be);
                        free(kc), free(vc);
                    }
                    assert_memory_equal(out[0], out[1], sizeof(float) * npos * heads * hd);
                }
                free(k), free(v), free(q), free(out[0]), free(out[1]);
            }
    }
}

/* scale and softcap: x * s, and cap * tanh(x / cap) in double. */
static void test_scale_softcap(void **state) {
    (void)state;
    enum { N = 70000 }; /* enough to run on the pool */
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) x[i] = frand(-100, 100);
    zi_backend *be = make_backend(NULL, 2);
    memcpy(y, x, sizeof(float) * N);
    be->ops->scale(be, y, sqrtf(640.0f), N);
    for (int i = 0; i < N; i++) assert_true(y[i] == x[i] * sqrtf(640.0f));
    memcpy(y, x, sizeof(float) * N);
    be->ops->softcap(be, y, 30.0f, N);
    for (int i = 0; i < N; i++) {
        double want = 30.0 * tanh(x[i] / 30.0);
        assert_true(fabs(y[i] - want) <= 4e-6 * fabs(want) + 1e-30);
    }
    zi_backend_free(be);
    free(x), free(y);
}

/* add_bias: every row plus the vector, exactly (one float add), on 1 and
 * 2 threads; rows of 1, 40 and 896 (a qwen2 Q width), 1 and 300 rows. */
static void test_add_bias(void **state) {
    (void)state;
    const int dims[3] = {1, 40, 896}, rows[2] = {1, 300};
    for (int di = 0; di < 3; di++)
        for (int ri = 0; ri < 2; ri++)
            for (int nt = 1; nt <= 2; nt++) {
                const int dim = dims[di], n = rows[ri];
                float *x = malloc(sizeof(float) * n * dim), *y = malloc(sizeof(float) * n * dim);
                float *b = malloc(sizeof(float) * dim);
                for (int i = 0; i < n * dim; i++) x[i] = frand(-10, 10);
                for (int i = 0; i < dim; i++) b[i] = frand(-3, 3);
                zi_backend *be = make_backend(NULL, nt);
                memcpy(y, x, sizeof(float) * n * dim);
                be->ops->add_bias(be, y, b, n, dim);
                for (int r = 0; r < n; r++)
                    for (int i = 0; i < dim; i++)
                        assert_true(y[r * dim + i] == x[r * dim + i] + b[i]);
                zi_backend_free(be);
                free(x), free(y), free(b);
            }
}

/* conv_state (lfm2's short convolution): three sequences of different
 * lengths interleaved token by token in one call, one of them restarted at
 * position 0 part-way, against a double reference that runs each sequence
 * alone; widths K 2, 3, 4; channels 1, 70 and 1024 (two threads split
 * them); the outputs of a sequence are the same bits when its tokens come
 * in one call or one call per token. And mul, exactly. */
static void test_conv_state(void **state) {
    (void)state;
    const int Ks[3] = {2, 3, 4}, Cs[3] = {1, 70, 1024};
    enum { N = 30, S = 3 };
    for (int ki = 0; ki < 3; ki++)
        for (int ci = 0; ci < 3; ci++)
            for (int nt = 1; nt <= 2; nt++) {
                const int K = Ks[ki], C = Cs[ci];
                zi_backend *be = make_backend(NULL, nt);
                float *w = malloc(sizeof(float) * C * K), *x = malloc(sizeof(float) * N * C);
                float *y = malloc(sizeof(float) * N * C), *y1 = malloc(sizeof(float) * N * C);
                float *st = calloc((size_t)S * (K - 1) * C, sizeof(float));
                float *st1 = calloc((size_t)S * (K - 1) * C, sizeof(float));
                int32_t slot[N], pos[N], len[S] = {0, 0, 0};
                for (int i = 0; i < C * K; i++) w[i] = frand(-1, 1);
                for (int i = 0; i < N * C; i++) x[i] = frand(-2, 2);
                for (int i = 0; i < N; i++) { /* slots 0,1,2,0,1,2,...; slot 1 restarts at 15 */
                    slot[i] = i % S;
                    if (i == 16) len[1] = 0;
                    pos[i] = len[slot[i]]++;
                }
                be->ops->conv_state(be, y, x, w, K, C, st, slot, pos, N);
                for (int i = 0; i < N; i++) /* the same, one token per call */
                    be->ops->conv_state(be, y1 + (size_t)i * C, x + (size_t)i * C, w, K, C, st1,
                                        slot + i, pos + i, 1);
                assert_memory_equal(y, y1, sizeof(float) * N * C);
                assert_memory_equal(st, st1, sizeof(float) * S * (K - 1) * C);
                for (int i = 0; i < N; i++)
                    for (int c = 0; c < C; c++) {
                        double want = 0.0;
                        for (int j = 0; j < K; j++) { /* input at position pos - (K-1) + j */
                            int back = K - 1 - j, k = i;
                            for (int b = 0; b < back && k >= 0; b++) /* that token of the slot */
                                do k--;
                                while (k >= 0 && slot[k] != slot[i]);
                            if (pos[i] - back < 0 || k < 0) continue;
                            want += (double)w[c * K + j] * x[(size_t)k * C + c];
                        }
                        assert_true(fabs(y[(size_t)i * C + c] - want) <= 1e-5 * (1 + fabs(want)));
                    }
                float *a = malloc(sizeof(float) * N * C);
                memcpy(a, x, sizeof(float) * N * C);
                be->ops->mul(be, a, y, (size_t)N * C);
                for (int i = 0; i < N * C; i++) assert_true(a[i] == x[i] * y[i]);
                zi_backend_free(be);
                free(w), free(x), free(y), free(y1), free(st), free(st1), free(a);
            }
}

/* delta_net (qwen35's gated delta rule): two sequences interleaved token
 * by token in one call, one restarted at position 0 part-way, against a
 * double reference of the recurrence run on each sequence alone; 2 key
 * heads read by 4 value heads (h % nk); the same bits in one call or one
 * call per token, on 1 and 2 threads. And silu, sigmoid_mul. */
static void test_delta_net(void **state) {
    (void)state;
    enum { N = 12, NK = 2, NV = 4, D = 16, S = 2 };
    const int row = (2 * NK + NV) * D;
    for (int nt = 1; nt <= 2; nt++) {
        zi_backend *be = make_backend(NULL, nt);
        float qkv[N * (2 * NK + NV) * D], bl[N * NV], al[N * NV], dtb[NV], av[NV];
        float out[N * NV * D], out1[N * NV * D];
        float *st = calloc(S * NV * D * D, sizeof(float)), *st1 = calloc(S * NV * D * D, 4);
        int32_t slot[N], pos[N], len[S] = {0, 0};
        for (int i = 0; i < N * row; i++) qkv[i] = frand(-1, 1);
        for (int i = 0; i < N * NV; i++) bl[i] = frand(-3, 3), al[i] = frand(-4, 2);
        for (int h = 0; h < NV; h++) dtb[h] = frand(-1, 1), av[h] = frand(-2, -0.1f);
        for (int i = 0; i < N; i++) {
            slot[i] = i % S;
            if (i == 7) len[1] = 0; /* slot 1 starts over */
            pos[i] = len[slot[i]]++;
        }
        be->ops->delta_net(be, out, qkv, bl, al, dtb, av, st, slot, pos, N, NK, NV, D, 1e-6f);
        for (int i = 0; i < N; i++)
            be->ops->delta_net(be, out1 + i * NV * D, qkv + i * row, bl + i * NV, al + i * NV, dtb,
                               av, st1, slot + i, pos + i, 1, NK, NV, D, 1e-6f);
        assert_memory_equal(out, out1, sizeof out);
        assert_memory_equal(st, st1, sizeof(float) * S * NV * D * D);
        static double Sr[S][NV][D][D];
        memset(Sr, 0, sizeof Sr);
        for (int t = 0; t < N; t++) {
            const int sl = slot[t];
            if (pos[t] == 0) memset(Sr[sl], 0, sizeof Sr[sl]);
            for (int h = 0; h < NV; h++) {
                const float *q = qkv + t * row + (h % NK) * D, *k = q + NK * D;
                const float *v = qkv + t * row + 2 * NK * D + h * D;
                double sq = 0, sk = 0, qn[D], kn[D], u[D];
                for (int i = 0; i < D; i++) sq += (double)q[i] * q[i], sk += (double)k[i] * k[i];
                for (int i = 0; i < D; i++)
                    qn[i] = q[i] / sqrt(sq + 1e-6) / sqrt((double)D),
                    kn[i] = k[i] / sqrt(sk + 1e-6);
                const double beta = 1 / (1 + exp(-(double)bl[t * NV + h]));
                const double x = (double)al[t * NV + h] + dtb[h];
                const double g = exp((x > 20 ? x : log1p(exp(x))) * av[h]);
                for (int j = 0; j < D; j++) {
                    double kv = 0;
                    for (int i = 0; i < D; i++) kv += g * Sr[sl][h][i][j] * kn[i];
                    u[j] = beta * (v[j] - kv);
                }
                for (int i = 0; i < D; i++)
                    for (int j = 0; j < D; j++)
                        Sr[sl][h][i][j] = g * Sr[sl][h][i][j] + kn[i] * u[j];
                for (int j = 0; j < D; j++) {
                    double o = 0;
                    for (int i = 0; i < D; i++) o += Sr[sl][h][i][j] * qn[i];
                    assert_true(fabs(out[(t * NV + h) * D + j] - o) <= 1e-5 * (1 + fabs(o)));
                }
            }
        }
        float x[64], y[64], g[64];
        for (int i = 0; i < 64; i++) x[i] = y[i] = frand(-30, 30), g[i] = frand(-30, 30);
        be->ops->silu(be, y, 64);
        for (int i = 0; i < 64; i++)
            assert_true(fabs(y[i] - x[i] / (1 + exp(-(double)x[i]))) <= 1e-6 * (1 + fabs(x[i])));
        memcpy(y, x, sizeof x);
        be->ops->sigmoid_mul(be, y, g, 64);
        for (int i = 0; i < 64; i++)
            assert_true(fabs(y[i] - x[i] / (1 + exp(-(double)g[i]))) <= 1e-6 * (1 + fabs(x[i])));
        zi_backend_free(be);
        free(st), free(st1);
    }
}

/* ssm_scan (granitehybrid's Mamba-2 scan): three sequences interleaved
 * token by token in one call, one restarted at position 0 part-way,
 * against a double reference run on each sequence alone; 6 heads reading
 * 2 groups of B and C (h / 3); the same bits in one call or one call per
 * token, on 1 and 2 threads; dt above softplus's threshold of 20 too.
 * And rmsnorm_groups with one weight per column. */
static void test_ssm_scan(void **state) {
    (void)state;
    enum { N = 17, H = 6, P = 8, G = 2, NS = 16, S = 3 };
    const int row = H * P + 2 * G * NS;
    for (int nt = 1; nt <= 2; nt++) {
        zi_backend *be = make_backend(NULL, nt);
        float xbc[N * (H * P + 2 * G * NS)], dt[N * H], dtb[H], av[H], dd[H];
        float out[N * H * P], out1[N * H * P];
        float *st = calloc(S * H * P * NS, sizeof(float)), *st1 = calloc(S * H * P * NS, 4);
        int32_t slot[N], pos[N], len[S] = {0, 0, 0};
        for (int i = 0; i < N * row; i++) xbc[i] = frand(-1, 1);
        for (int i = 0; i < N * H; i++) dt[i] = frand(-4, 2);
        dt[5 * H + 1] = 25.0f; /* softplus(x) = x past 20 */
        for (int h = 0; h < H; h++)
            dtb[h] = frand(-1, 1), av[h] = frand(-4, -0.5f), dd[h] = frand(0.5f, 1.5f);
        for (int i = 0; i < N; i++) {
            slot[i] = i % S;
            if (i == 10) len[1] = 0; /* slot 1 starts over */
            pos[i] = len[slot[i]]++;
        }
        be->ops->ssm_scan(be, out, xbc, dt, dtb, av, dd, st, slot, pos, N, H, P, G, NS);
        for (int i = 0; i < N; i++)
            be->ops->ssm_scan(be, out1 + i * H * P, xbc + i * row, dt + i * H, dtb, av, dd, st1,
                              slot + i, pos + i, 1, H, P, G, NS);
        assert_memory_equal(out, out1, sizeof out);
        assert_memory_equal(st, st1, sizeof(float) * S * H * P * NS);
        static double Sr[S][H][P][NS];
        memset(Sr, 0, sizeof Sr);
        double worst = 0.0;
        for (int t = 0; t < N; t++) {
            const int sl = slot[t];
            if (pos[t] == 0) memset(Sr[sl], 0, sizeof Sr[sl]);
            for (int h = 0; h < H; h++) {
                const float *x = xbc + t * row + h * P;
                const float *B = xbc + t * row + H * P + (h / (H / G)) * NS, *C = B + G * NS;
                const double v = (double)dt[t * H + h] + dtb[h];
                const double d = v > 20 ? v : log1p(exp(v)), dA = exp(d * av[h]);
                for (int p = 0; p < P; p++) {
                    double o = 0;
                    for (int k = 0; k < NS; k++) {
                        Sr[sl][h][p][k] = dA * Sr[sl][h][p][k] + d * x[p] * B[k];
                        o += Sr[sl][h][p][k] * C[k];
                    }
                    o += (double)dd[h] * x[p];
                    const double e = fabs(out[(t * H + h) * P + p] - o) / (1 + fabs(o));
                    worst = e > worst ? e : worst;
                }
            }
        }
        assert_true(worst <= 1e-5);
        /* rmsnorm_groups: 3 tokens of 2 groups of 24, in place */
        enum { T = 3, DIM = 48, GR = 2 };
        float x[T * DIM], y[T * DIM], w[DIM];
        for (int i = 0; i < T * DIM; i++) x[i] = y[i] = frand(-3, 3);
        for (int i = 0; i < DIM; i++) w[i] = frand(0.5f, 1.5f);
        be->ops->rmsnorm_groups(be, y, y, w, T, DIM, GR, 1e-5f);
        for (int t = 0; t < T; t++)
            for (int g = 0; g < GR; g++) {
                const float *xg = x + t * DIM + g * (DIM / GR);
                double ss = 0;
                for (int i = 0; i < DIM / GR; i++) ss += (double)xg[i] * xg[i];
                const double r = 1 / sqrt(ss / (DIM / GR) + 1e-5);
                for (int i = 0; i < DIM / GR; i++) {
                    const double want = xg[i] * r * w[g * (DIM / GR) + i];
                    assert_true(fabs(y[t * DIM + g * (DIM / GR) + i] - want) <=
                                1e-6 * (1 + fabs(want)));
                }
            }
        zi_backend_free(be);
        free(st), free(st1);
    }
}

/* The qwen2 / qwen3 / gemma2 rows: what llama.cpp's loaders set. */
static void test_family_rows(void **state) {
    (void)state;
    const zi_family *q2 = zi_family_find("qwen2", 5), *q3 = zi_family_find("qwen3", 5);
    const zi_family *g2 = zi_family_find("gemma2", 6);
    assert_non_null(q2), assert_non_null(q3), assert_non_null(g2);
    assert_true(q2->rope_neox && !q2->qk_norm && !q2->post_norms && !q2->geglu);
    assert_true(q3->rope_neox && q3->qk_norm && !q3->post_norms && !q3->geglu);
    assert_true(g2->rope_neox && !g2->qk_norm && g2->post_norms && g2->geglu && g2->embd_scale);
    assert_int_equal(g2->swa_pattern, 2);
    assert_int_equal(g2->swa_default, 4096);
    assert_true(g2->attn_softcap == 50.0f && g2->final_softcap == 30.0f);
    assert_true(zi_family_find("gemma3", 6)->attn_softcap == 0.0f);
    assert_non_null(strstr(zi_family_names(), "qwen2"));
    assert_non_null(strstr(zi_family_names(), "gemma2"));
}

/* A backend without the new ops (the CUDA backend today) refuses gemma3 by
 * name and still runs llama; the CPU backend runs both. */
static void test_backend_without_ops_refuses(void **state) {
    (void)state;
    zi_backend *cpu = make_backend(NULL, 1);
    const zi_family *llama = zi_family_find("llama", 5), *g3 = zi_family_find("gemma3", 6);
    assert_non_null(llama);
    assert_non_null(g3);
    assert_null(zi_family_find("gemma", 5));
    zi_error err = {0};
    assert_int_equal(zi_family_check_backend(g3, cpu, 1, 1, 0, 0, 0, &err), ZI_OK);
    zi_backend_ops ops = *cpu->ops;
    ops.name = "cuda";
    ops.rope_neox = NULL, ops.geglu = NULL, ops.scale = NULL, ops.softcap = NULL;
    zi_backend bare = *cpu;
    bare.ops = &ops;
    bare.attn_window = false;
    assert_int_equal(zi_family_check_backend(llama, &bare, 0, 0, 0, 0, 0, &err), ZI_OK);
    assert_int_equal(zi_family_check_backend(g3, &bare, 1, 0, 0, 0, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "gemma3"));
    assert_non_null(strstr(err.msg, "cuda"));
    ops.rope_neox = cpu->ops->rope_neox, ops.geglu = cpu->ops->geglu, ops.scale = cpu->ops->scale;
    err = (zi_error){0};
    assert_int_equal(zi_family_check_backend(g3, &bare, 1, 0, 0, 0, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "sliding-window"));
    assert_int_equal(zi_family_check_backend(g3, &bare, 0, 0, 0, 0, 0, &err), ZI_OK);
    /* attention soft-capping (gemma2) and biases (qwen2) are named */
    const zi_family *g2 = zi_family_find("gemma2", 6), *q2 = zi_family_find("qwen2", 5);
    ops.softcap = cpu->ops->softcap;
    bare.attn_window = true;
    bare.attn_softcap = false;
    assert_int_equal(zi_family_check_backend(g2, &bare, 1, 1, 1, 0, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "attention logit soft-capping"));
    assert_non_null(strstr(err.msg, "gemma2"));
    bare.attn_softcap = true;
    assert_int_equal(zi_family_check_backend(g2, &bare, 1, 1, 1, 0, 0, &err), ZI_OK);
    ops.add_bias = NULL;
    assert_int_equal(zi_family_check_backend(q2, &bare, 0, 0, 0, 1, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "bias add"));
    assert_non_null(strstr(err.msg, "qwen2"));
    assert_int_equal(zi_family_check_backend(q2, &bare, 0, 0, 0, 0, 0, &err), ZI_OK);
    /* experts (the CUDA backend has no row ops yet), gpt-oss's sinks, its
     * clamped SwiGLU and YaRN are named */
    const zi_family *q3m = zi_family_find("qwen3moe", 8), *oss = zi_family_find("gpt-oss", 7);
    assert_non_null(q3m);
    assert_non_null(oss);
    ops.add_bias = cpu->ops->add_bias;
    assert_int_equal(zi_family_check_backend(q3m, &bare, 0, 0, 0, 0, 1, &err), ZI_OK);
    ops.gather_rows = NULL;
    assert_int_equal(zi_family_check_backend(q3m, &bare, 0, 0, 0, 0, 1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "expert routing"));
    assert_non_null(strstr(err.msg, "qwen3moe"));
    ops.gather_rows = cpu->ops->gather_rows;
    ops.matmul_groups = NULL;
    assert_int_equal(zi_family_check_backend(q3m, &bare, 0, 0, 0, 0, 1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "expert routing"));
    ops.matmul_groups = cpu->ops->matmul_groups;
    bare.attn_sinks = false;
    assert_int_equal(zi_family_check_backend(oss, &bare, 1, 0, 0, 1, 1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "attention sinks"));
    bare.attn_sinks = true;
    ops.swiglu_oai = NULL;
    assert_int_equal(zi_family_check_backend(oss, &bare, 1, 0, 0, 1, 1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "clamped SwiGLU"));
    ops.swiglu_oai = cpu->ops->swiglu_oai;
    assert_int_equal(zi_family_check_backend(oss, &bare, 1, 0, 0, 1, 1, &err), ZI_OK);
    bare.rope_yarn = false;
    assert_int_equal(zi_family_check_rope(oss, &bare, 1, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "YaRN"));
    assert_int_equal(zi_family_check_rope(oss, &bare, 0, &err), ZI_OK);
    /* a hybrid's recurrent layers (lfm2) */
    const zi_family *lfm2 = zi_family_find("lfm2", 4);
    assert_non_null(lfm2);
    assert_int_equal(zi_family_check_backend(lfm2, &bare, 0, 0, 0, 0, 0, &err), ZI_OK);
    ops.conv_state = NULL;
    assert_int_equal(zi_family_check_backend(lfm2, &bare, 0, 0, 0, 0, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "recurrent layers"));
    assert_non_null(strstr(err.msg, "lfm2"));
    ops.conv_state = cpu->ops->conv_state;
    /* granitehybrid's Mamba-2 layers */
    const zi_family *gh = zi_family_find("granitehybrid", 13);
    assert_non_null(gh);
    assert_int_equal(gh->recurrent, ZI_REC_MAMBA2);
    assert_int_equal(zi_family_check_backend(gh, &bare, 0, 0, 0, 0, 0, &err), ZI_OK);
    ops.ssm_scan = NULL;
    assert_int_equal(zi_family_check_backend(gh, &bare, 0, 0, 0, 0, 0, &err), ZI_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "Mamba-2"));
    assert_non_null(strstr(err.msg, "granitehybrid"));
    ops.ssm_scan = cpu->ops->ssm_scan;
    assert_non_null(strstr(zi_family_names(), "granitehybrid"));
    assert_true(cpu->attn_sinks && cpu->rope_yarn);
    assert_true(cpu->attn_softcap);
    assert_non_null(cpu->ops->add_bias);
    zi_backend_free(cpu);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geglu),
        cmocka_unit_test(test_per_head_norm),
        cmocka_unit_test(test_rope_neox),
        cmocka_unit_test(test_rope_factors),
        cmocka_unit_test(test_rope_table_shapes),
        cmocka_unit_test(test_window_attention),
        cmocka_unit_test(test_scale_softcap),
        cmocka_unit_test(test_backend_without_ops_refuses),
        cmocka_unit_test(test_add_bias),
        cmocka_unit_test(test_family_rows),
        cmocka_unit_test(test_conv_state),
        cmocka_unit_test(test_delta_net),
        cmocka_unit_test(test_ssm_scan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
