/*
 * cpu_audio.c - the speech codec decoder's CPU ops (see cpu_audio.h).
 */
#include "cpu_audio.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>

/* [lo, hi) of n items for thread ith of nth, in whole chunks of align. */
static void part(int64_t n, int ith, int nth, int64_t align, int64_t *lo, int64_t *hi) {
    const int64_t chunks = (n + align - 1) / align;
    const int64_t per = chunks / nth, rem = chunks % nth;
    const int64_t c0 = ith * per + (ith < rem ? ith : rem), c1 = c0 + per + (ith < rem ? 1 : 0);
    *lo = c0 * align < n ? c0 * align : n;
    *hi = c1 * align < n ? c1 * align : n;
}

/* ---- convolutions ---- */

typedef struct conv_args {
    const zi_cpu_kernels *k;
    float *y;
    const float *x, *w, *b;
    int n, cin, cout, K;
} conv_args;

/* Output channels [o0, o1): per tap, one weight row against every frame it
 * reaches, four frames at a time (the row stays in cache across the
 * frames; dot4 gives the same bits as dot). */
static void conv_worker(void *p, int ith, int nth) {
    const conv_args *a = p;
    int64_t o0, o1;
    part(a->cout, ith, nth, 16, &o0, &o1);
    const int n = a->n, cin = a->cin, cout = a->cout, K = a->K, pad = K / 2;
    float *y = a->y;
    for (int t = 0; t < n; t++)
        for (int64_t o = o0; o < o1; o++) y[(size_t)t * cout + o] = a->b ? a->b[o] : 0.0f;
    for (int j = 0; j < K; j++) {
        const int t0 = pad - j > 0 ? pad - j : 0, t1 = n + pad - j < n ? n + pad - j : n;
        for (int64_t o = o0; o < o1; o++) {
            const float *wr = a->w + ((size_t)j * cout + o) * cin;
            int t = t0;
            for (float d[4]; t + 4 <= t1; t += 4) {
                a->k->dot4(wr, a->x + (size_t)(t + j - pad) * cin, (size_t)cin, cin, d);
                for (int r = 0; r < 4; r++) y[(size_t)(t + r) * cout + o] += d[r];
            }
            for (; t < t1; t++)
                y[(size_t)t * cout + o] += a->k->dot(wr, a->x + (size_t)(t + j - pad) * cin, cin);
        }
    }
}

void zi_cpu_conv1d(zi_pool *pool, const zi_cpu_kernels *k, float *y, const float *x, const float *w,
                   const float *b, int n, int cin, int cout, int K) {
    assert(x != y && n >= 1 && K >= 1);
    conv_args a = {k, y, x, w, b, n, cin, cout, K};
    zi_pool_run(pool, conv_worker, &a);
}

/* Frames [t0, t1): each channel's taps summed in order. */
static void dw_worker(void *p, int ith, int nth) {
    const conv_args *a = p;
    int64_t t0, t1;
    part(a->n, ith, nth, 1, &t0, &t1);
    const int n = a->n, C = a->cout, K = a->K, pad = K / 2;
    for (int64_t t = t0; t < t1; t++) {
        float *restrict y = a->y + (size_t)t * C;
        for (int c = 0; c < C; c++) y[c] = a->b ? a->b[c] : 0.0f;
        for (int j = 0; j < K; j++) {
            const int64_t s = t + j - pad;
            if (s < 0 || s >= n) continue;
            const float *restrict xr = a->x + (size_t)s * C;
            const float *restrict w = a->w;
            for (int c = 0; c < C; c++) y[c] += w[(size_t)c * K + j] * xr[c];
        }
    }
}

void zi_cpu_conv1d_dw(zi_pool *pool, float *y, const float *x, const float *w, const float *b,
                      int n, int channels, int K) {
    assert(x != y && n >= 1 && K >= 1);
    conv_args a = {NULL, y, x, w, b, n, channels, channels, K};
    zi_pool_run(pool, dw_worker, &a);
}

/* ---- group norm ---- */

typedef struct gn_args {
    float *y;
    const float *x, *w, *b;
    int n, C, G;
    float eps;
} gn_args;

/* Groups [g0, g1): the statistics over the group's frames and channels in
 * double, frame by frame, then the normalized values. */
static void gn_worker(void *p, int ith, int nth) {
    const gn_args *a = p;
    int64_t g0, g1;
    part(a->G, ith, nth, 1, &g0, &g1);
    const int C = a->C, dg = a->C / a->G;
    for (int64_t g = g0; g < g1; g++) {
        const int c0 = (int)g * dg;
        double mean = 0.0, var = 0.0;
        for (int t = 0; t < a->n; t++)
            for (int c = c0; c < c0 + dg; c++) mean += a->x[(size_t)t * C + c];
        mean /= (double)a->n * dg;
        for (int t = 0; t < a->n; t++)
            for (int c = c0; c < c0 + dg; c++) {
                const double d = a->x[(size_t)t * C + c] - mean;
                var += d * d;
            }
        const double r = 1.0 / sqrt(var / ((double)a->n * dg) + (double)a->eps);
        for (int t = 0; t < a->n; t++)
            for (int c = c0; c < c0 + dg; c++) {
                const size_t i = (size_t)t * C + c;
                a->y[i] = (float)((a->x[i] - mean) * r) * a->w[c] + a->b[c];
            }
    }
}

void zi_cpu_group_norm(zi_pool *pool, float *y, const float *x, const float *w, const float *b,
                       int n, int channels, int groups, float eps) {
    assert(groups >= 1 && channels % groups == 0 && n >= 1);
    gn_args a = {y, x, w, b, n, channels, groups, eps};
    zi_pool_run(pool, gn_worker, &a);
}

/* ---- inverse STFT ---- */

typedef struct istft_args {
    float *out, *frames;
    const float *spec;
    int n, n_fft, hop;
} istft_args;

/* Frames [f0, f1): the head (magnitude and phase to a complex spectrum)
 * and the real inverse DFT, as sums over the table of cos / sin of
 * 2 pi i / n_fft, times the window. */
static void irfft_worker(void *p, int ith, int nth) {
    const istft_args *a = p;
    int64_t f0, f1;
    part(a->n, ith, nth, 1, &f0, &f1);
    if (f0 >= f1) return;
    const int N = a->n_fft, H = N / 2 + 1;
    double cs[ZI_ISTFT_MAX_FFT], sn[ZI_ISTFT_MAX_FFT], re[ZI_ISTFT_MAX_FFT / 2 + 1],
        im[ZI_ISTFT_MAX_FFT / 2 + 1];
    for (int i = 0; i < N; i++) {
        const double ang = 2.0 * M_PI * i / N;
        cs[i] = cos(ang), sn[i] = sin(ang);
    }
    for (int64_t f = f0; f < f1; f++) {
        const float *s = a->spec + (size_t)f * (N + 2);
        for (int m = 0; m < H; m++) {
            double mag = exp((double)s[m]);
            if (mag > 100.0) mag = 100.0;
            const double ph = s[H + m];
            re[m] = mag * cos(ph), im[m] = mag * sin(ph);
        }
        float *fr = a->frames + (size_t)f * N;
        for (int k = 0; k < N; k++) {
            double acc = 0.0;
            int idx = 0;
            for (int m = 1; m < H - 1; m++) {
                idx += k;
                if (idx >= N) idx -= N;
                acc += re[m] * cs[idx] - im[m] * sn[idx];
            }
            const double v = (re[0] + ((k & 1) ? -re[H - 1] : re[H - 1]) + 2.0 * acc) / N;
            fr[k] = (float)(v * (0.5 - 0.5 * cs[k]));
        }
    }
}

/* Output samples [s0, s1): the frames covering each, summed in frame order,
 * over the squared windows' sum. */
static void ola_worker(void *p, int ith, int nth) {
    const istft_args *a = p;
    const int64_t total = (int64_t)a->n * a->hop;
    int64_t s0, s1;
    part(total, ith, nth, 64, &s0, &s1);
    const int N = a->n_fft, hop = a->hop, pad = (N - hop) / 2;
    for (int64_t s = s0; s < s1; s++) {
        const int64_t g = s + pad; /* position in the uncut signal */
        int64_t fa = g - N + 1 <= 0 ? 0 : (g - N + 1 + hop - 1) / hop, fb = g / hop;
        if (fb > a->n - 1) fb = a->n - 1;
        double y = 0.0, env = 0.0;
        for (int64_t f = fa; f <= fb; f++) {
            const int64_t i = g - f * hop;
            const double w = 0.5 - 0.5 * cos(2.0 * M_PI * (double)i / N);
            y += a->frames[(size_t)f * N + i];
            env += w * w;
        }
        a->out[s] = (float)(y / env);
    }
}

void zi_cpu_istft(zi_pool *pool, float *out, const float *spec, float *frames, int n, int n_fft,
                  int hop) {
    assert(n >= 1 && n_fft >= 4 && n_fft % 2 == 0 && n_fft <= ZI_ISTFT_MAX_FFT && hop >= 1 &&
           hop <= n_fft);
    istft_args a = {out, frames, spec, n, n_fft, hop};
    zi_pool_run(pool, irfft_worker, &a);
    zi_pool_run(pool, ola_worker, &a);
}
