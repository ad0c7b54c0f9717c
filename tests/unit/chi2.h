/*
 * chi2.h - Pearson's chi-square test for the sampling tests
 * (test_sampler.c, test_gpu_sampling_ref.c and tests/gpu): the statistic
 * of observed draws against exact probabilities, and the critical values
 * at p = 0.001. A header of static functions: test code only.
 */
#ifndef ZI_TEST_CHI2_H
#define ZI_TEST_CHI2_H

/* chi-square critical values for p = 0.001, df = 1..60 (index df - 1). */
static const double CHI2_999[60] = {
    10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264, 32.909,
    34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820, 45.315, 46.797, 48.268, 49.728, 51.179,
    52.620, 54.052, 55.476, 56.892, 58.301, 59.703, 61.098, 62.487, 63.870, 65.247, 66.619, 67.985,
    69.346, 70.703, 72.055, 73.402, 74.745, 76.084, 77.419, 78.750, 80.077, 81.400, 82.720, 84.037,
    85.351, 86.661, 87.968, 89.272, 90.573, 91.872, 93.168, 94.461, 95.751, 97.039, 98.324, 99.607};

/* Pearson's statistic with cells of expected < 5 merged into one; *df gets
 * cells - 1. Tokens of probability 0 must never be drawn (checked apart). */
static inline double chi2(const long *obs, const double *p, int n, long total, int *df) {
    double stat = 0, small_e = 0;
    long small_o = 0;
    int cells = 0;
    double min_e = 1e300;
    int min_i = -1;
    for (int i = 0; i < n; i++) {
        double e = p[i] * total;
        if (e >= 5) {
            cells++;
            if (e < min_e) min_e = e, min_i = i;
        } else {
            small_e += e;
            small_o += obs[i];
        }
    }
    for (int i = 0; i < n; i++) {
        double e = p[i] * total;
        if (e < 5) continue;
        double o = (double)obs[i];
        if (i == min_i && small_e > 0 && small_e < 5) { /* too small alone: fold in */
            e += small_e;
            o += (double)small_o;
        }
        stat += (o - e) * (o - e) / e;
    }
    if (small_e >= 5) {
        cells++;
        stat += ((double)small_o - small_e) * ((double)small_o - small_e) / small_e;
    }
    *df = cells - 1;
    return stat;
}

#endif
