/*
 * cpu_audio.c - the speech codec decoder's CPU ops (see cpu_audio.h).
 */
#include "cpu_audio.h"

#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

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

/* The inverse DFT y[k] = sum over m of x[m] e^(2 pi i k m / N), k < N, of
 * the N complex values at x + m * stride (re, im): split by the smallest of
 * the factors 2, 3, 5 of N (a mixed-radix FFT, decimation in time), else
 * summed directly. cs / sn: cos / sin of 2 pi j / NT (N divides NT); t: N
 * values of scratch (re, im), free again on return. */
static void idft(const double *xr, const double *xi, size_t stride, int N, int NT, const double *cs,
                 const double *sn, double *yr, double *yi, double *tr, double *ti) {
    const int p = N % 2 == 0 ? 2 : N % 3 == 0 ? 3 : N % 5 == 0 ? 5 : N, step = NT / N;
    if (p == N) {
        for (int k = 0; k < N; k++) {
            double ar = 0.0, ai = 0.0;
            for (int m = 0; m < N; m++) {
                const size_t j = (size_t)k * m % (size_t)N * step;
                const double r = xr[m * stride], im = xi[m * stride];
                ar += r * cs[j] - im * sn[j];
                ai += r * sn[j] + im * cs[j];
            }
            yr[k] = ar, yi[k] = ai;
        }
        return;
    }
    const int M = N / p;
    for (int q = 0; q < p; q++) /* the p interleaved sub-sequences, into y's quarters */
        idft(xr + q * stride, xi + q * stride, stride * p, M, NT, cs, sn, yr + q * M, yi + q * M,
             tr, ti);
    for (int k = 0; k < M; k++)
        for (int s = 0; s < p; s++) {
            const int kk = k + M * s;
            double ar = 0.0, ai = 0.0;
            for (int q = 0; q < p; q++) {
                const size_t j = (size_t)q * kk % (size_t)N * step;
                const double r = yr[q * M + k], im = yi[q * M + k];
                ar += r * cs[j] - im * sn[j];
                ai += r * sn[j] + im * cs[j];
            }
            tr[kk] = ar, ti[kk] = ai;
        }
    memcpy(yr, tr, (size_t)N * sizeof *yr);
    memcpy(yi, ti, (size_t)N * sizeof *yi);
}

/* Frames [f0, f1): the head (magnitude and phase to a complex spectrum),
 * its Hermitian extension, the inverse DFT (idft, in double), times the
 * window. */
static void irfft_worker(void *p, int ith, int nth) {
    const istft_args *a = p;
    int64_t f0, f1;
    part(a->n, ith, nth, 1, &f0, &f1);
    if (f0 >= f1) return;
    const int N = a->n_fft, H = N / 2 + 1;
    enum { MX = ZI_ISTFT_MAX_FFT };
    double cs[MX], sn[MX], xr[MX], xi[MX], yr[MX], yi[MX], tr[MX], ti[MX];
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
            xr[m] = mag * cos(ph), xi[m] = mag * sin(ph);
        }
        xi[0] = xi[H - 1] = 0.0; /* irfft ignores them */
        for (int m = H; m < N; m++) xr[m] = xr[N - m], xi[m] = -xi[N - m];
        idft(xr, xi, 1, N, N, cs, sn, yr, yi, tr, ti);
        float *fr = a->frames + (size_t)f * N;
        for (int k = 0; k < N; k++) fr[k] = (float)(yr[k] / N * (0.5 - 0.5 * cs[k]));
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
