/*
 * test_sampler.c - cmocka tests for model_worker/sampler.c, the fused
 * sampling processor: sampled frequencies against the exactly computed
 * filtered distributions (chi-square at p = 0.001, and a deliberately wrong
 * reference that must fail), penalties against hand-computed values, greedy,
 * bitmask and EOS masks, seeded repeatability independent of the batch,
 * log probabilities against a double-precision log-softmax, odd logits
 * (NaN, -inf, +inf), bad ids, and a timing print for 32 x 49,152.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "chi2.h"
#include "sampler.h"

#define NV 50
#define NSAMP 8000
#define SEED 20261123u

/* A fixed, irregular 50-token logit vector with distinct values. */
static void fixed_logits(float *lg) {
    for (int i = 0; i < NV; i++)
        lg[i] = (float)(2.0 * sin(1.3 * i + 0.5) + 1.5 * cos(0.37 * i) - 0.01 * i);
}

/* Deterministic pseudo-random logits in [-scale, scale]. */
static void random_logits(float *lg, int n, uint64_t seed, double scale) {
    uint64_t x = seed * 2862933555777941757ULL + 3037000493ULL;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        lg[i] = (float)(((double)(x >> 11) * 0x1p-53 * 2.0 - 1.0) * scale);
    }
}

static zi_sampling_params params(double temp, int top_k, double top_p, double min_p) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = SEED;
    return sp;
}

/* The exact filtered distribution, written independently of the sampler:
 * full sort, softmax at temperature, top_k, top_p, min_p, renormalise. */
static void ref_dist(const float *lg, int n, double temp, int top_k, double top_p, double min_p,
                     double *p) {
    int ord[4096];
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = 1; i < n; i++) /* insertion sort: higher logit, then lower id */
        for (int j = i; j > 0 && lg[ord[j]] > lg[ord[j - 1]]; j--) {
            int t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    double w[4096], z = 0;
    for (int i = 0; i < n; i++) w[i] = exp(((double)lg[ord[i]] - lg[ord[0]]) / temp);
    int keep = (top_k > 0 && top_k < n) ? top_k : n;
    for (int i = 0; i < keep; i++) z += w[i];
    double cum = 0;
    for (int i = 0; i < keep; i++) {
        cum += w[i];
        if (cum >= top_p * z) {
            keep = i + 1;
            break;
        }
    }
    for (int i = 0; i < n; i++) p[i] = 0;
    double s = 0;
    for (int i = 0; i < keep; i++)
        if (w[i] >= min_p * w[0]) s += w[i];
    for (int i = 0; i < keep; i++)
        if (w[i] >= min_p * w[0]) p[ord[i]] = w[i] / s;
}

/* Draws NSAMP tokens (steps 0..NSAMP-1, batches of 100 rows) into counts. */
static void draw_counts(const float *lg, int n, const zi_sampling_params *sp, long *counts) {
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, n, &e), ZI_OK);
    zi_sampler_row rows[100];
    int32_t out[100];
    for (int i = 0; i < n; i++) counts[i] = 0;
    for (int b = 0; b < NSAMP; b += 100) {
        for (int r = 0; r < 100; r++) {
            memset(&rows[r], 0, sizeof rows[r]);
            rows[r].logits = lg;
            rows[r].params = sp;
            rows[r].step = (uint64_t)(b + r);
        }
        assert_int_equal(zi_sampler_sample(s, rows, 100, out, &e), ZI_OK);
        for (int r = 0; r < 100; r++) {
            assert_true(out[r] >= 0 && out[r] < n);
            counts[out[r]]++;
        }
    }
    zi_sampler_free(s);
}

/* Samples with sp and checks against the reference built from ref_*; returns
 * the statistic. pass: assert below the critical value (and zero-probability
 * tokens never drawn) or, when !pass, above it. */
static double check_dist(const float *lg, int n, const zi_sampling_params *sp, double rt, int rk,
                         double rp, double rm, int pass) {
    static long counts[4096];
    static double p[4096];
    draw_counts(lg, n, sp, counts);
    ref_dist(lg, n, rt, rk, rp, rm, p);
    int df;
    double stat = chi2(counts, p, n, NSAMP, &df);
    assert_true(df >= 1 && df <= 60);
    double crit = CHI2_999[df - 1];
    print_message("chi2 = %.2f, df = %d, critical(0.001) = %.3f\n", stat, df, crit);
    if (pass) {
        for (int i = 0; i < n; i++)
            if (p[i] == 0 && counts[i] != 0) fail_msg("token %d has p = 0 but was drawn", i);
        if (!(stat < crit)) fail_msg("chi2 %.2f >= %.3f (df %d)", stat, crit, df);
    } else if (!(stat > crit)) {
        fail_msg("wrong reference not rejected: chi2 %.2f <= %.3f", stat, crit);
    }
    return stat;
}

static void test_dist_temperature(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params a = params(0.7, 0, 1.0, 0.0), b = params(1.5, -1, 1.0, 0.0);
    check_dist(lg, NV, &a, 0.7, 0, 1.0, 0.0, 1);
    check_dist(lg, NV, &b, 1.5, 0, 1.0, 0.0, 1);
}

static void test_dist_top_k(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params sp = params(1.0, 5, 1.0, 0.0);
    check_dist(lg, NV, &sp, 1.0, 5, 1.0, 0.0, 1);
}

static void test_dist_top_p(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params sp = params(1.0, 0, 0.8, 0.0);
    check_dist(lg, NV, &sp, 1.0, 0, 0.8, 0.0, 1);
}

static void test_dist_min_p(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params sp = params(1.0, 0, 1.0, 0.1);
    check_dist(lg, NV, &sp, 1.0, 0, 1.0, 0.1, 1);
}

static void test_dist_combined(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params sp = params(1.3, 20, 0.9, 0.05);
    check_dist(lg, NV, &sp, 1.3, 20, 0.9, 0.05, 1);
}

/* top_p over a 3,000-token vocabulary without top_k: the partial selection
 * must grow past its first 64 and 256 candidates and still be exact. */
static void test_dist_top_p_large(void **state) {
    (void)state;
    static float lg[3000];
    random_logits(lg, 3000, 7, 3.0);
    lg[17] = 10.0f; /* dominant tokens keep their own cells; the long tail merges */
    lg[2500] = 9.5f;
    lg[999] = 9.0f;
    zi_sampling_params sp = params(1.0, 0, 0.9, 0.0);
    check_dist(lg, 3000, &sp, 1.0, 0, 0.9, 0.0, 1);
}

/* Draws n tokens (steps 0..n-1) from one row; counts per token. */
static void draw_row(const float *lg, int V, const zi_sampling_params *sp, int n, long *counts) {
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    for (int i = 0; i < V; i++) counts[i] = 0;
    for (int st = 0; st < n; st++) {
        zi_sampler_row r = {.logits = lg, .params = sp, .step = (uint64_t)st};
        int32_t tok;
        assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
        counts[tok]++;
    }
    zi_sampler_free(s);
}

/* The top_p cut on either side of a boundary: the crossing token is kept,
 * the next one is not. Small vocabulary, then 3,000 tokens (quickselect). */
static void test_top_p_boundary(void **state) {
    (void)state;
    float lg4[4] = {(float)log(0.5), (float)log(0.3), (float)log(0.15), (float)log(0.05)};
    long c4[4];
    zi_sampling_params sp = params(1.0, 0, 0.79, 0.0); /* keeps {0, 1} */
    draw_row(lg4, 4, &sp, 2000, c4);
    assert_true(c4[0] > 0 && c4[1] > 0 && c4[2] == 0 && c4[3] == 0);
    sp.top_p = 0.81; /* crosses at token 2: keeps {0, 1, 2} */
    draw_row(lg4, 4, &sp, 2000, c4);
    assert_true(c4[0] > 0 && c4[1] > 0 && c4[2] > 100 && c4[3] == 0);
    sp.top_k = 2;   /* top_k first, then top_p over the renormalised two */
    sp.top_p = 0.6; /* 0.5/0.8 = 0.625 >= 0.6: token 0 alone */
    draw_row(lg4, 4, &sp, 500, c4);
    assert_true(c4[0] == 500);

    enum { V = 3000 };
    static float lg[V];
    static long c[V];
    for (int i = 0; i < V; i++) lg[i] = -0.0001f * (float)i; /* tail: w ~ 1, rank = id */
    lg[1500] = (float)log(3000.0);                           /* A */
    lg[2999] = (float)log(2000.0);                           /* B, the crossing one */
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(lg[i]);
    sp = params(1.0, 0, 4900.0 / z, 0.0); /* A < target <= A + B */
    draw_row(lg, V, &sp, 3000, c);
    assert_true(c[1500] > 0 && c[2999] > 0);
    assert_int_equal(c[1500] + c[2999], 3000);
    sp.top_p = (5000.0 + 50.5) / z; /* A + B + about 50.5 tail weights: 51 tail tokens */
    draw_row(lg, V, &sp, 8000, c);
    long tail = 0;
    for (int i = 0; i < V; i++) {
        if (i == 1500 || i == 2999) continue;
        int rank = i < 1500 ? i : i - 1;
        if (c[i] && rank >= 51) fail_msg("tail token %d (rank %d) drawn", i, rank);
        tail += c[i];
    }
    assert_true(tail > 20); /* about 8000 * 51 / 5051 = 81 expected */
}

/* The same test must reject a wrong filter: top_p or top_k forgotten. */
static void test_dist_wrong_reference_fails(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    zi_sampling_params sp = params(1.0, 0, 0.8, 0.0);
    double s1 = check_dist(lg, NV, &sp, 1.0, 0, 1.0, 0.0, 0); /* without top_p */
    zi_sampling_params sk = params(1.0, 5, 1.0, 0.0);
    double s2 = check_dist(lg, NV, &sk, 1.0, 6, 1.0, 0.0, 0); /* top_k off by one */
    zi_sampling_params st = params(0.7, 0, 1.0, 0.0);
    double s3 = check_dist(lg, NV, &st, 1.0, 0, 1.0, 0.0, 0); /* temperature ignored */
    assert_true(s1 > 100 && s2 > 50 && s3 > 50);
}

/* ---- penalties ------------------------------------------------------------- */

static const float PL[6] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
static const int32_t PPROMPT[2] = {0, 1};
static const int32_t PGEN[4] = {3, 3, 4, 1};

static void processed(const zi_sampling_params *sp, float *out) {
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, 6, &e), ZI_OK);
    zi_sampler_row row = {.logits = PL,
                          .params = sp,
                          .prompt_ids = PPROMPT,
                          .n_prompt = 2,
                          .generated_ids = PGEN,
                          .n_generated = 4};
    assert_int_equal(zi_sampler_processed_logits(s, &row, out, &e), ZI_OK);
    int32_t tok;
    assert_int_equal(zi_sampler_sample(s, &row, 1, &tok, &e), ZI_OK);
    int best = 0; /* greedy default picks the argmax of the processed logits */
    for (int i = 1; i < 6; i++)
        if (out[i] > out[best]) best = i;
    assert_int_equal(tok, best);
    zi_sampler_free(s);
}

static void expect6(const float *got, const double *want) {
    for (int i = 0; i < 6; i++)
        if (fabs(got[i] - want[i]) > 1e-6)
            fail_msg("token %d: got %.7f want %.7f", i, (double)got[i], want[i]);
}

static void test_penalty_repetition(void **state) {
    (void)state;
    zi_sampling_params sp = params(1.0, 1, 1.0, 0.0);
    sp.repetition_penalty = 1.5; /* seen = prompt {0,1} + generated {3,4,1} */
    float out[6];
    processed(&sp, out);
    const double want[6] = {2.0 / 1.5, -1.0 * 1.5, 0.5, 3.0 / 1.5, -2.0 * 1.5, 1.0};
    expect6(out, want);
    sp.repetition_penalty = 0.5; /* < 1 encourages repetition */
    processed(&sp, out);
    const double want2[6] = {4.0, -0.5, 0.5, 6.0, -1.0, 1.0};
    expect6(out, want2);
}

static void test_penalty_frequency_presence(void **state) {
    (void)state;
    zi_sampling_params sp = params(1.0, 1, 1.0, 0.0);
    sp.frequency_penalty = 0.5; /* counts over generated only: 3->2, 4->1, 1->1 */
    sp.presence_penalty = 0.25;
    float out[6];
    processed(&sp, out);
    const double want[6] = {2.0, -1.0 - 0.75, 0.5, 3.0 - 1.25, -2.0 - 0.75, 1.0};
    expect6(out, want);
    sp.frequency_penalty = -0.5; /* negative values reward repetition */
    sp.presence_penalty = 0.0;
    processed(&sp, out);
    const double want2[6] = {2.0, -0.5, 0.5, 4.0, -1.5, 1.0};
    expect6(out, want2);
    sp.frequency_penalty = 0.0;
    sp.presence_penalty = 2.0;
    processed(&sp, out);
    const double want3[6] = {2.0, -3.0, 0.5, 1.0, -4.0, 1.0};
    expect6(out, want3);
}

static void test_penalty_combined_order(void **state) {
    (void)state;
    zi_sampling_params sp = params(1.0, 1, 1.0, 0.0);
    sp.repetition_penalty = 1.5; /* first */
    sp.frequency_penalty = 0.5;  /* then */
    sp.presence_penalty = 0.25;
    float out[6];
    processed(&sp, out);
    const double want[6] = {2.0 / 1.5, -1.5 - 0.75, 0.5, 2.0 - 1.25, -3.0 - 0.75, 1.0};
    expect6(out, want);
}

/* ---- greedy, masks, reproducibility -------------------------------------- */

static int argmax(const float *lg, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (lg[i] > lg[b]) b = i;
    return b;
}

static void test_greedy(void **state) {
    (void)state;
    enum { V = 1000 };
    static float lg[V];
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    zi_sampling_params def;
    zi_sampling_params_init(&def); /* top_k = 1: greedy */
    zi_sampling_params t0 = params(0.0, 50, 0.9, 0.0);
    for (int k = 0; k < 20; k++) {
        random_logits(lg, V, 100 + k, 5.0);
        zi_sampler_row rows[2] = {{.logits = lg, .params = &def, .step = (uint64_t)k},
                                  {.logits = lg, .params = &t0, .step = (uint64_t)k}};
        int32_t out[2];
        assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_OK);
        assert_int_equal(out[0], argmax(lg, V));
        assert_int_equal(out[1], argmax(lg, V));
    }
    float tie[4] = {1.0f, 3.0f, 3.0f, 2.0f}; /* ties go to the lower id */
    zi_sampler_row r = {.logits = tie, .params = &def};
    int32_t tok;
    zi_sampler *s4 = NULL;
    assert_int_equal(zi_sampler_create(&s4, 4, &e), ZI_OK);
    assert_int_equal(zi_sampler_sample(s4, &r, 1, &tok, &e), ZI_OK);
    assert_int_equal(tok, 1);
    zi_sampler_free(s4);
    zi_sampler_free(s);
}

/* logit_bias: added first, so the penalties see the biased logit; a token
 * with only a bias gets no penalty. */
static void test_logit_bias(void **state) {
    (void)state;
    zi_token_bias b[3] = {{2, 3.0f}, {4, -100.0f}, {5, 0.5f}};
    zi_sampling_params sp = params(1.0, 1, 1.0, 0.0);
    sp.logit_bias = (zi_logit_bias){b, 3};
    float out[6];
    processed(&sp, out); /* and greedy picks token 2 now, not 3 */
    const double want[6] = {2.0, -1.0, 3.5, 3.0, -102.0, 1.5};
    expect6(out, want);
    zi_token_bias b2[4] = {{0, 1.0f}, {2, 1.0f}, {4, 1.0f}, {60, 5.0f}}; /* 60: past V, skipped */
    sp.logit_bias = (zi_logit_bias){b2, 4};
    sp.repetition_penalty = 1.5; /* seen: 0, 1, 3, 4; token 2 only biased */
    processed(&sp, out);
    const double want2[6] = {3.0 / 1.5, -1.0 * 1.5, 1.5, 3.0 / 1.5, -1.0 * 1.5, 1.0};
    expect6(out, want2);
}

/* -100 on the argmax: greedy takes the runner-up, and sampling at
 * temperature 1 never draws the banned token (its weight is below e^-87). */
static void test_logit_bias_ban(void **state) {
    (void)state;
    enum { V = 1000 };
    static float lg[V];
    random_logits(lg, V, 77, 5.0);
    int top = argmax(lg, V);
    float keep = lg[top];
    lg[top] = -INFINITY;
    int second = argmax(lg, V);
    lg[top] = keep;
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    zi_token_bias ban = {top, -100.0f}, boost = {second, 100.0f};
    zi_sampling_params g;
    zi_sampling_params_init(&g);
    g.logit_bias = (zi_logit_bias){&ban, 1};
    zi_sampling_params t1 = params(1.0, 0, 1.0, 0.0), t2 = params(1.0, 40, 0.95, 0.0);
    t1.logit_bias = t2.logit_bias = g.logit_bias;
    int32_t tok;
    zi_sampler_row row = {.logits = lg, .params = &g};
    assert_int_equal(zi_sampler_sample(s, &row, 1, &tok, &e), ZI_OK);
    assert_int_equal(tok, second);
    for (int k = 0; k < 2000; k++) {
        zi_sampler_row rows[2] = {{.logits = lg, .params = &t1, .step = (uint64_t)k},
                                  {.logits = lg, .params = &t2, .step = (uint64_t)k}};
        int32_t out[2];
        assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_OK);
        assert_int_not_equal(out[0], top);
        assert_int_not_equal(out[1], top);
    }
    /* +100 on a token makes it all but certain, sampled too */
    t1.logit_bias = (zi_logit_bias){&boost, 1};
    for (int k = 0; k < 200; k++) {
        row = (zi_sampler_row){.logits = lg, .params = &t1, .step = (uint64_t)k};
        assert_int_equal(zi_sampler_sample(s, &row, 1, &tok, &e), ZI_OK);
        assert_int_equal(tok, second);
    }
    zi_sampler_free(s);
}

static void test_bitmask(void **state) {
    (void)state;
    enum { V = 100, W = 4 }; /* ceil(100 / 32) = 4 words */
    float lg[V];
    random_logits(lg, V, 5, 3.0);
    int32_t mask[W] = {0};
    /* allow only multiples of 7 */
    for (int t = 0; t < V; t += 7) mask[t >> 5] |= (int32_t)(1u << (t & 31));
    int best = -1;
    for (int t = 0; t < V; t += 7)
        if (best < 0 || lg[t] > lg[best]) best = t;
    lg[3] = 50.0f; /* the global argmax is masked out */
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    zi_sampling_params g = params(1.0, 1, 1.0, 0.0), smp = params(2.0, 0, 1.0, 0.0);
    zi_sampler_row r = {.logits = lg, .params = &g, .bitmask = mask};
    int32_t tok;
    assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
    assert_int_equal(tok, best);
    r.params = &smp;
    int seen_other = 0;
    for (uint64_t st = 0; st < 500; st++) {
        r.step = st;
        assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
        assert_int_equal(tok % 7, 0);
        seen_other += tok != best;
    }
    assert_true(seen_other > 0); /* really sampling, not greedy */
    /* the top bit of a word (token 31 and 63) works despite int32 sign */
    memset(mask, 0, sizeof mask);
    mask[1] = (int32_t)(1u << 31); /* token 63 only */
    r.params = &g;
    assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
    assert_int_equal(tok, 63);
    /* nothing allowed: -1 and ZI_ERANGE */
    memset(mask, 0, sizeof mask);
    assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_ERANGE);
    assert_int_equal(tok, -1);
    assert_non_null(strstr(e.msg, "row 0"));
    zi_sampler_free(s);
}

static void test_eos_mask(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    int top = argmax(lg, NV);
    float tmp[NV];
    memcpy(tmp, lg, sizeof tmp);
    tmp[top] = -INFINITY;
    int second = argmax(tmp, NV);
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, NV, &e), ZI_OK);
    int32_t eos[2] = {top, 0};
    zi_sampling_params g = params(1.0, 1, 1.0, 0.0), smp = params(1.0, 3, 1.0, 0.0);
    zi_sampler_row r = {.logits = lg, .params = &g, .eos_forbid = eos, .n_eos_forbid = 1};
    int32_t tok;
    assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
    assert_int_equal(tok, second);
    r.params = &smp;
    r.n_eos_forbid = 2;
    for (uint64_t st = 0; st < 300; st++) {
        r.step = st;
        assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
        assert_true(tok != top && tok != 0);
    }
    zi_sampler_free(s);
}

static void test_repeatable_and_batch_independent(void **state) {
    (void)state;
    enum { V = 2000 };
    static float lg[V], other[V];
    random_logits(lg, V, 11, 2.0);
    random_logits(other, V, 12, 6.0);
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    zi_sampling_params sp = params(1.2, 0, 0.95, 0.0), sq = params(0.9, 40, 0.9, 0.02);
    sq.seed = 99;
    sq.repetition_penalty = 1.3;
    int32_t gen[3] = {5, 6, 7};
    int differ_seed = 0, distinct = 0;
    int32_t prev = -1;
    for (uint64_t st = 0; st < 200; st++) {
        zi_sampler_row alone = {.logits = lg, .params = &sp, .step = st};
        int32_t a, b;
        assert_int_equal(zi_sampler_sample(s, &alone, 1, &a, &e), ZI_OK);
        assert_int_equal(zi_sampler_sample(s, &alone, 1, &b, &e), ZI_OK);
        assert_int_equal(a, b); /* same seed + step: same token */
        zi_sampler_row batch[5];
        for (int i = 0; i < 5; i++) {
            zi_sampler_row nb = {.logits = other,
                                 .params = &sq,
                                 .step = st * 3 + (uint64_t)i,
                                 .generated_ids = gen,
                                 .n_generated = 3};
            batch[i] = nb;
        }
        batch[3] = alone; /* the row among different neighbours */
        int32_t out[5];
        assert_int_equal(zi_sampler_sample(s, batch, 5, out, &e), ZI_OK);
        assert_int_equal(out[3], a);
        zi_sampling_params sp2 = sp;
        sp2.seed = sp.seed + 1;
        zi_sampler_row alt = {.logits = lg, .params = &sp2, .step = st};
        int32_t c;
        assert_int_equal(zi_sampler_sample(s, &alt, 1, &c, &e), ZI_OK);
        differ_seed += c != a;
        distinct += a != prev;
        prev = a;
    }
    assert_true(differ_seed > 150); /* a broad distribution: seeds matter */
    assert_true(distinct > 150);    /* and steps matter */
    /* the generator is a pure function of (seed, step) */
    assert_true(zi_sampler_uniform(1, 2) == zi_sampler_uniform(1, 2));
    assert_true(zi_sampler_uniform(1, 2) != zi_sampler_uniform(1, 3));
    assert_true(zi_sampler_uniform(1, 2) != zi_sampler_uniform(2, 2));
    zi_sampler_free(s);
}

/* ---- log probabilities ----------------------------------------------------- */

static void test_logprobs(void **state) {
    (void)state;
    enum { V = 1000, TOPN = 10 };
    static float lg[V];
    random_logits(lg, V, 21, 10.0);
    lg[400] = lg[401] = 15.0f; /* a tie at the top: lower id first */
    double m = -INFINITY, z = 0;
    for (int i = 0; i < V; i++) m = fmax(m, lg[i]);
    for (int i = 0; i < V; i++) z += exp((double)lg[i] - m);
    double lse = m + log(z);
    zi_error e = {0};
    int32_t ids[TOPN];
    float lps[TOPN];
    for (int t = 0; t < V; t++) {
        float lp;
        assert_int_equal(zi_sampler_logprobs(lg, V, t, t == 0 ? TOPN : 0, &lp, ids, lps, &e),
                         ZI_OK);
        if (fabs(lp - ((double)lg[t] - lse)) > 1e-5)
            fail_msg("token %d: %.8f vs %.8f", t, (double)lp, (double)lg[t] - lse);
    }
    assert_int_equal(ids[0], 400);
    assert_int_equal(ids[1], 401);
    /* the top list equals a full sort */
    int ord[V];
    for (int i = 0; i < V; i++) ord[i] = i;
    for (int i = 1; i < V; i++)
        for (int j = i; j > 0 && lg[ord[j]] > lg[ord[j - 1]]; j--) {
            int t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    for (int i = 0; i < TOPN; i++) {
        assert_int_equal(ids[i], ord[i]);
        assert_true(fabs(lps[i] - ((double)lg[ord[i]] - lse)) <= 1e-5);
        if (i) assert_true(lps[i] <= lps[i - 1]);
    }
    /* NaN counts as -inf; an all -inf row is an error; bad arguments */
    float odd[4] = {NAN, 0.0f, -INFINITY, 0.0f};
    float lp;
    assert_int_equal(zi_sampler_logprobs(odd, 4, 1, 4, &lp, ids, lps, &e), ZI_OK);
    assert_true(fabs(lp - log(0.5)) < 1e-6);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 3);
    assert_true(isinf(lps[2]) && lps[2] < 0 && isinf(lps[3]));
    assert_int_equal(zi_sampler_logprobs(odd, 4, 0, 0, &lp, NULL, NULL, &e), ZI_OK);
    assert_true(isinf(lp) && lp < 0);
    float dead[3] = {-INFINITY, NAN, -INFINITY};
    assert_int_equal(zi_sampler_logprobs(dead, 3, 0, 0, &lp, NULL, NULL, &e), ZI_EINVAL);
    assert_int_equal(zi_sampler_logprobs(odd, 4, 4, 0, &lp, NULL, NULL, &e), ZI_EINVAL);
    assert_int_equal(zi_sampler_logprobs(odd, 4, 0, 5, &lp, ids, lps, &e), ZI_EINVAL);
    float pinf[3] = {INFINITY, 1.0f, INFINITY};
    assert_int_equal(zi_sampler_logprobs(pinf, 3, 2, 0, &lp, NULL, NULL, &e), ZI_OK);
    assert_true(fabs(lp - log(0.5)) < 1e-6);
    /* Far below the top (terms under e^-87 of it count as 0 in the sum):
     * each token's own log-probability is still its distance from the top,
     * and the top list past the first block (70 tokens) is still exact. */
    float far[70];
    for (int i = 0; i < 70; i++) far[i] = -100.0f - (float)i;
    far[66] = 3.0f, far[67] = 1.0f;
    assert_int_equal(zi_sampler_logprobs(far, 70, 5, 3, &lp, ids, lps, &e), ZI_OK);
    const double top = log(exp(3.0) + exp(1.0)); /* + e^-103 and below: nothing in double */
    assert_true(fabs(lp - (-105.0 - top)) < 1e-4);
    assert_int_equal(ids[0], 66);
    assert_int_equal(ids[1], 67);
    assert_int_equal(ids[2], 0);
    assert_true(fabs(lps[0] - (3.0 - top)) < 1e-6 && fabs(lps[2] - (-100.0 - top)) < 1e-4);
}

/* ---- odd logits and bad input -------------------------------------------- */

static void test_nan_and_inf_rows(void **state) {
    (void)state;
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, 8, &e), ZI_OK);
    float nanrow[8] = {NAN, 1.0f, NAN, 2.0f, NAN, 0.5f, NAN, NAN};
    float dead[8];
    for (int i = 0; i < 8; i++) dead[i] = (i & 1) ? -INFINITY : NAN;
    float pinf[8] = {0, INFINITY, 0, 0, INFINITY, 0, 0, 0};
    zi_sampling_params g = params(1.0, 1, 1.0, 0.0), smp = params(1.0, 0, 0.9, 0.1);
    for (uint64_t st = 0; st < 200; st++) {
        zi_sampler_row rows[5] = {{.logits = nanrow, .params = &g, .step = st},
                                  {.logits = nanrow, .params = &smp, .step = st},
                                  {.logits = dead, .params = &smp, .step = st},
                                  {.logits = pinf, .params = &smp, .step = st},
                                  {.logits = dead, .params = &g, .step = st}};
        int32_t out[5];
        assert_int_equal(zi_sampler_sample(s, rows, 5, out, &e), ZI_ERANGE);
        assert_non_null(strstr(e.msg, "row 2"));
        assert_int_equal(out[0], 3);
        assert_true(out[1] == 1 || out[1] == 3 || out[1] == 5);
        assert_int_equal(out[2], -1);
        assert_true(out[3] == 1 || out[3] == 4);
        assert_int_equal(out[4], -1);
    }
    /* penalties on non-finite logits keep them non-finite, no crash */
    int32_t gen[3] = {0, 1, 2};
    zi_sampling_params pen = smp;
    pen.repetition_penalty = 2.0;
    pen.frequency_penalty = 1.0;
    zi_sampler_row r = {.logits = nanrow, .params = &pen, .generated_ids = gen, .n_generated = 3};
    int32_t tok;
    assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
    assert_true(tok == 1 || tok == 3 || tok == 5);
    zi_sampler_free(s);
}

static void test_bad_input(void **state) {
    (void)state;
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, 0, &e), ZI_EINVAL);
    assert_null(s);
    assert_int_equal(zi_sampler_create(NULL, 5, &e), ZI_EINVAL);
    assert_int_equal(zi_sampler_create(&s, 5, &e), ZI_OK);
    float lg[5] = {1, 2, 3, 4, 5};
    zi_sampling_params g = params(1.0, 1, 1.0, 0.0);
    int32_t bad[2] = {1, 5};
    int32_t neg[1] = {-1};
    int32_t out[2] = {77, 77};
    zi_sampler_row rows[2] = {{.logits = lg, .params = &g},
                              {.logits = lg, .params = &g, .generated_ids = bad, .n_generated = 2}};
    assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "row 1: generated_ids[1] = 5"));
    assert_int_equal(out[0], 77); /* nothing written */
    rows[1].n_generated = 0;
    rows[1].eos_forbid = neg;
    rows[1].n_eos_forbid = 1;
    assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "eos_forbid[0] = -1"));
    rows[1].n_eos_forbid = 0;
    rows[1].n_prompt = 3; /* NULL list with a count */
    assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "prompt_ids is NULL"));
    rows[1].n_prompt = 0;
    rows[1].params = NULL;
    assert_int_equal(zi_sampler_sample(s, rows, 2, out, &e), ZI_EINVAL);
    assert_int_equal(zi_sampler_sample(s, rows, 0, NULL, &e), ZI_OK);
    assert_int_equal(zi_sampler_sample(NULL, rows, 1, out, &e), ZI_EINVAL);
    zi_sampler_free(s);
    zi_sampler_free(NULL);
}

/* Limits of the valid ranges behave as their limits: a denormal
 * temperature, top_p near 0 and min_p = 1 all leave only the argmax. */
static void test_extreme_params(void **state) {
    (void)state;
    float lg[NV];
    fixed_logits(lg);
    int top = argmax(lg, NV);
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, NV, &e), ZI_OK);
    zi_sampling_params ps[3] = {params(5e-324, 0, 1.0, 0.0), params(1.0, 0, 1e-9, 0.0),
                                params(1.0, 0, 1.0, 1.0)};
    for (int i = 0; i < 3; i++)
        for (uint64_t st = 0; st < 50; st++) {
            zi_sampler_row r = {.logits = lg, .params = &ps[i], .step = st};
            int32_t tok;
            assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
            assert_int_equal(tok, top);
        }
    /* a huge temperature is close to uniform: many distinct tokens */
    zi_sampling_params hot = params(1e6, 0, 1.0, 0.0);
    int seen[NV] = {0}, distinct = 0;
    for (uint64_t st = 0; st < 2000; st++) {
        zi_sampler_row r = {.logits = lg, .params = &hot, .step = st};
        int32_t tok;
        assert_int_equal(zi_sampler_sample(s, &r, 1, &tok, &e), ZI_OK);
        distinct += !seen[tok]++;
    }
    assert_int_equal(distinct, NV);
    zi_sampler_free(s);
}

/* ---- timing (printed, not asserted) -------------------------------------- */

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void time_config(zi_sampler *s, float *lg, int V, int R, const zi_sampling_params *sp,
                        const char *name) {
    zi_sampler_row rows[32];
    int32_t out[32];
    zi_error e = {0};
    for (int r = 0; r < R; r++) {
        zi_sampler_row row = {.logits = lg + (size_t)r * V, .params = sp, .step = (uint64_t)r};
        rows[r] = row;
    }
    assert_int_equal(zi_sampler_sample(s, rows, R, out, &e), ZI_OK); /* warm-up */
    int reps = 20;
    double t0 = now_us();
    for (int k = 0; k < reps; k++) {
        for (int r = 0; r < R; r++) rows[r].step += 1000;
        assert_int_equal(zi_sampler_sample(s, rows, R, out, &e), ZI_OK);
    }
    double us = (now_us() - t0) / (reps * R);
    for (int r = 0; r < R; r++) assert_true(out[r] >= 0 && out[r] < V);
    print_message("timing: %d rows x %d vocab, %s: %.1f us/row\n", R, V, name, us);
}

static void test_timing(void **state) {
    (void)state;
    enum { V = 49152, R = 32 };
    float *lg = malloc(sizeof(float) * V * R);
    assert_non_null(lg);
    for (int r = 0; r < R; r++) random_logits(lg + (size_t)r * V, V, 1000 + r, 12.0);
    zi_sampler *s = NULL;
    zi_error e = {0};
    assert_int_equal(zi_sampler_create(&s, V, &e), ZI_OK);
    zi_sampling_params a = params(0.8, 40, 0.9, 0.0), b = params(1.0, 0, 0.9, 0.0),
                       c = params(1.0, 1, 1.0, 0.0), d = params(1.0, 0, 1.0, 0.0);
    time_config(s, lg, V, R, &a, "top_k=40 top_p=0.9 T=0.8");
    time_config(s, lg, V, R, &b, "top_k off top_p=0.9");
    time_config(s, lg, V, R, &d, "top_k off top_p=1");
    time_config(s, lg, V, R, &c, "greedy");
    zi_sampler_free(s);
    free(lg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dist_temperature),
        cmocka_unit_test(test_dist_top_k),
        cmocka_unit_test(test_dist_top_p),
        cmocka_unit_test(test_dist_min_p),
        cmocka_unit_test(test_dist_combined),
        cmocka_unit_test(test_dist_top_p_large),
        cmocka_unit_test(test_top_p_boundary),
        cmocka_unit_test(test_dist_wrong_reference_fails),
        cmocka_unit_test(test_penalty_repetition),
        cmocka_unit_test(test_penalty_frequency_presence),
        cmocka_unit_test(test_penalty_combined_order),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_logit_bias),
        cmocka_unit_test(test_logit_bias_ban),
        cmocka_unit_test(test_bitmask),
        cmocka_unit_test(test_eos_mask),
        cmocka_unit_test(test_repeatable_and_batch_independent),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_nan_and_inf_rows),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_extreme_params),
        cmocka_unit_test(test_timing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
