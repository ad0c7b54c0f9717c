/*
 * test_gpu_sampling_ref.c - cmocka tests of the GPU sampler's algorithm on
 * the CPU (kernels/cuda/sampling_ref.h): the sequential reference of the
 * kernel's passes against an independent oracle (full sort, double
 * softmax) and against the CPU sampler (model_worker/sampler.h).
 *
 *   - the draw's uniform is zi_sampler_uniform bit for bit;
 *   - the order-preserving key orders floats as the comparisons do;
 *   - survivor sets (top_k, top_p, min_p and their combinations, ties)
 *     equal the oracle's on random rows, skipping the rare rows where a
 *     mass or threshold falls within rounding of a boundary (counted);
 *   - draw frequencies pass a chi-square test at p = 0.001 against the
 *     oracle's distribution, and a wrong distribution fails it;
 *   - with top_k and top_p off (temperature, min_p) the tokens equal the
 *     CPU sampler's draw for draw, up to a handful of rounding ties;
 *   - greedy, ties, NaN, -inf and +inf rows, the parameters' flags;
 *   - steps 1-4 (penalties, EOS mask, bitmask): the entry list, and the
 *     reference's rewritten row equal to the CPU sampler's processed
 *     logits bit for bit on random rows, with greedy tokens equal and
 *     seeded draws equal up to a handful of rounding ties.
 *
 * The GPU kernel itself runs the same passes in parallel; tests/gpu holds
 * it against this reference and the CPU sampler on a real device.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "chi2.h"
#include "sampler.h"
#include "sampling_ref.h"
#include "test_rand.h"
#include "types.h"

static zi_test_rng rng = {0x2545f4914f6cdd1dull};
static double urand(void) {
    return zi_test_urand(&rng);
}

static zi_gpu_sample_params gparams(double t, int k, double p, double m, uint64_t seed,
                                    uint64_t step) {
    zi_gpu_sample_params g;
    memset(&g, 0, sizeof g);
    g.temperature = t;
    g.top_k = k;
    g.top_p = p;
    g.min_p = m;
    g.seed = seed;
    g.step = step;
    return g;
}

/* ---- the oracle: full sort, double weights, the filters in order ---- */

static const float *cmp_lg;
static int cmp_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float u = cmp_lg[x], v = cmp_lg[y];
    if (u > v) return -1;
    if (u < v) return 1;
    return x < y ? -1 : (x > y);
}

/* p[t] = the probability of token t; returns the number of tokens with
 * p > 0. *margin gets the smallest relative distance of a top_p mass or a
 * min_p weight from its threshold (rows below ~1e-5 are rounding-close). */
static int oracle(const float *lg, int n, double T, int top_k, double top_p, double min_p,
                  double *p, double *margin) {
    static int32_t ord[65536];
    static double w[65536];
    int nc = 0;
    for (int t = 0; t < n; t++) {
        p[t] = 0.0;
        if (lg[t] > -INFINITY) ord[nc++] = t;
    }
    *margin = 1.0;
    if (!nc) return 0;
    cmp_lg = lg;
    qsort(ord, (size_t)nc, sizeof ord[0], cmp_desc);
    if (!(T > 0.0) || top_k == 1) {
        p[ord[0]] = 1.0;
        return 1;
    }
    double vmax = lg[ord[0]];
    for (int i = 0; i < nc; i++) {
        double a = ((double)lg[ord[i]] - vmax) / T;
        if (isinf(vmax)) {
            w[i] = lg[ord[i]] == vmax ? 1.0 : 0.0;
        } else {
            w[i] = a < -87.0 ? 0.0 : exp(a);
            if (fabs(a + 87.0) < 1e-3) *margin = 0.0; /* at the e^-87 cut-off */
        }
    }
    int keep = top_k > 0 && top_k < nc ? top_k : nc;
    double z = 0;
    for (int i = 0; i < keep; i++) z += w[i];
    if (top_p < 1.0) {
        double cum = 0, target = top_p * z;
        for (int i = 0; i < keep; i++) {
            double before = cum;
            cum += w[i];
            if (cum >= target) {
                double m1 = fabs(cum - target) / z, m0 = fabs(target - before) / z;
                if (m1 < *margin) *margin = m1;
                if (i > 0 && m0 < *margin) *margin = m0;
                keep = i + 1;
                break;
            }
        }
    }
    double thr = min_p > 0 ? (min_p < 1 ? min_p : 1.0) : 0.0, s = 0;
    int kept = 0;
    for (int i = 0; i < keep; i++) {
        if (thr > 0 && fabs(w[i] - thr) < 1e-5 * thr) *margin = 0.0;
        if (w[i] >= thr && w[i] > 0) s += w[i];
    }
    for (int i = 0; i < keep; i++)
        if (w[i] >= thr && w[i] > 0) p[ord[i]] = w[i] / s, kept++;
    return kept;
}

/* ---- tests ---- */

static void test_uniform_matches_cpu(void **state) {
    (void)state;
    for (int i = 0; i < 20000; i++) {
        uint64_t seed = (uint64_t)(urand() * 0x1p64), step = (uint64_t)(urand() * 1e6);
        if (i % 7 == 0) seed = (uint64_t)i;
        double a = zi_gs_uniform(seed, step), b = zi_sampler_uniform(seed, step);
        if (memcmp(&a, &b, sizeof a) != 0)
            fail_msg("seed %llu step %llu: %.17g != %.17g", (unsigned long long)seed,
                     (unsigned long long)step, a, b);
        assert_true(a >= 0.0 && a < 1.0);
    }
}

static float special(int i) {
    static const float s[] = {0.0f,   -0.0f,   1.0f,    -1.0f,    INFINITY,        -INFINITY,
                              1e-45f, -1e-45f, 3.4e38f, -3.4e38f, 1.17549435e-38f, 0.5f,
                              -0.5f,  100.0f};
    return s[i % (int)(sizeof s / sizeof s[0])];
}

static void test_key_order(void **state) {
    (void)state;
    for (int i = 0; i < 200000; i++) {
        float a, b;
        if (i < 196) {
            a = special(i / 14), b = special(i % 14);
        } else {
            uint32_t ua = (uint32_t)(urand() * 4294967296.0),
                     ub = (uint32_t)(urand() * 4294967296.0);
            if (i % 3 == 0) ub = ua + (uint32_t)(urand() * 8) - 4; /* neighbours */
            memcpy(&a, &ua, 4);
            memcpy(&b, &ub, 4);
            if (a != a || b != b) continue; /* NaN is never a candidate */
        }
        uint32_t ka = zi_gs_key(a), kb = zi_gs_key(b);
        if ((a > b) != (ka > kb) || (a == b) != (ka == kb))
            fail_msg("key order: %a vs %a -> %08x vs %08x", (double)a, (double)b, ka, kb);
        float back = zi_gs_unkey(ka);
        if (!(back == a) || (a != 0.0f && memcmp(&back, &a, 4) != 0))
            fail_msg("unkey(key(%a)) = %a", (double)a, (double)back);
    }
    assert_false(zi_gs_candidate(NAN));
    assert_false(zi_gs_candidate(-INFINITY));
    assert_true(zi_gs_candidate(INFINITY));
}

static void test_weight(void **state) {
    (void)state;
    float inv_t = (float)(1.0 / 0.7);
    assert_true(zi_gs_weight(3.0f, 3.0f, inv_t) == 1.0f);
    assert_true(zi_gs_weight(-100.0f, 3.0f, 1.0f) == 0.0f); /* below e^-87 */
    for (int i = 0; i < 10000; i++) {
        /* the argument is the CPU sampler's float expression; exp of it
         * must be right to float precision */
        float v = (float)(urand() * 40.0 - 38.0), vmax = 2.0f, a = (v - vmax) * inv_t;
        double want = exp((double)a);
        float got = zi_gs_weight(v, vmax, inv_t);
        if (a > -86.0f && fabs(got - want) > 3e-7 * want)
            fail_msg("weight(%g): %g vs %g", (double)v, (double)got, want);
    }
    assert_true(zi_gs_weight(INFINITY, INFINITY, 1.0f) == 1.0f);
    assert_true(zi_gs_weight(5.0f, INFINITY, 1.0f) == 0.0f);
    assert_true(zi_gs_min_p_threshold(0.0) == 0.0f);
    assert_true(zi_gs_min_p_threshold(2.0) == 1.0f);
    assert_true(zi_gs_min_p_threshold(0.25) == 0.25f);
}

static void random_row(float *lg, int n, double scale, int ties) {
    for (int t = 0; t < n; t++) {
        double u = urand();
        lg[t] = ties ? (float)floor(u * 12.0) * 0.5f : (float)((u * 2.0 - 1.0) * scale);
    }
}

/* Survivor sets against the oracle over a grid of parameters. */
static void test_survivors_vs_oracle(void **state) {
    (void)state;
    static float lg[3000];
    static double p[3000];
    static uint8_t keep[3000];
    const double temps[] = {0.0, 0.3, 1.0, 2.5};
    const int ks[] = {0, 1, 2, 7, 50, 2999};
    const double ps[] = {1.0, 0.95, 0.5, 0.1};
    const double ms[] = {0.0, 0.05, 0.5};
    const int sizes[] = {50, 700, 3000};
    int rows = 0, skipped = 0;
    for (int si = 0; si < 3; si++)
        for (int ties = 0; ties < 2; ties++) {
            int n = sizes[si];
            random_row(lg, n, si == 0 ? 3.0 : 8.0, ties);
            if (ties && n >= 700) lg[n / 2] = NAN, lg[n / 3] = -INFINITY;
            for (size_t a = 0; a < 4; a++)
                for (size_t b = 0; b < 6; b++)
                    for (size_t c = 0; c < 4; c++)
                        for (size_t d = 0; d < 3; d++) {
                            zi_gpu_sample_params g = gparams(temps[a], ks[b], ps[c], ms[d], 1, 0);
                            double margin;
                            int want = oracle(lg, n, temps[a], ks[b], ps[c], ms[d], p, &margin);
                            rows++;
                            if (margin > 0 && margin < 1e-6) { /* 0: exact ties, compared */
                                skipped++;
                                if (getenv("ZI_DEBUG_SKIPS"))
                                    print_message("skip n %d ties %d T %g k %d p %g m %g: %g\n", n,
                                                  ties, temps[a], ks[b], ps[c], ms[d], margin);
                                continue;
                            }
                            int got = zi_gpu_sample_ref_survivors(lg, n, &g, keep);
                            for (int t = 0; t < n; t++)
                                if ((p[t] > 0) != (keep[t] != 0))
                                    fail_msg("n %d ties %d T %g k %d p %g min_p %g: token %d "
                                             "oracle %g ref %d",
                                             n, ties, temps[a], ks[b], ps[c], ms[d], t, p[t],
                                             keep[t]);
                            assert_int_equal(got, want);
                        }
        }
    print_message("%d parameter sets, %d skipped as rounding-close\n", rows, skipped);
    assert_true(skipped * 20 < rows);
}

#define NV 50
#define NSAMP 8000

static double draw_chi2(const float *lg, zi_gpu_sample_params g, const double *p) {
    long counts[NV] = {0};
    for (int s = 0; s < NSAMP; s++) {
        g.step = (uint64_t)s;
        int32_t t = zi_gpu_sample_ref(lg, NV, &g);
        assert_true(t >= 0 && t < NV);
        if (p[t] == 0) fail_msg("token %d has p = 0 but was drawn", t);
        counts[t]++;
    }
    int df;
    double stat = chi2(counts, p, NV, NSAMP, &df);
    assert_true(df >= 1 && df <= 60);
    print_message("chi2 = %.2f, df = %d, critical(0.001) = %.3f\n", stat, df, CHI2_999[df - 1]);
    return stat - CHI2_999[df - 1]; /* < 0: passes */
}

static void test_distribution(void **state) {
    (void)state;
    float lg[NV];
    for (int i = 0; i < NV; i++)
        lg[i] = (float)(2.0 * sin(1.3 * i + 0.5) + 1.5 * cos(0.37 * i) - 0.01 * i);
    struct {
        double t, p, m;
        int k;
    } cfg[] = {{1.0, 1.0, 0.0, 0}, {0.7, 1.0, 0.0, 0}, {1.0, 1.0, 0.0, 5},
               {1.0, 0.8, 0.0, 0}, {1.0, 1.0, 0.1, 0}, {1.3, 0.9, 0.02, 20}};
    double p[NV], margin;
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++) {
        oracle(lg, NV, cfg[i].t, cfg[i].k, cfg[i].p, cfg[i].m, p, &margin);
        double over = draw_chi2(lg, gparams(cfg[i].t, cfg[i].k, cfg[i].p, cfg[i].m, 77, 0), p);
        if (!(over < 0)) fail_msg("config %zu fails the chi-square test", i);
    }
    /* the same test rejects a wrong distribution (top_p forgotten) */
    oracle(lg, NV, 1.0, 0, 1.0, 0.0, p, &margin);
    assert_true(draw_chi2(lg, gparams(1.0, 0, 0.8, 0.0, 77, 0), p) > 0);
}

/* With top_k and top_p off the walk is the CPU sampler's: same tokens. */
static void test_plain_draws_match_cpu(void **state) {
    (void)state;
    enum { V = 49152, STEPS = 3000 };
    static float lg[V];
    random_row(lg, V, 6.0, 0);
    zi_sampler *cpu = NULL;
    zi_error err = {0};
    assert_int_equal(zi_sampler_create(&cpu, V, &err), ZI_OK);
    const double temps[] = {1.0, 0.6, 1.7};
    const double mins[] = {0.0, 0.0, 0.05};
    int mismatches = 0, total = 0;
    for (int c = 0; c < 3; c++) {
        zi_sampling_params sp;
        zi_sampling_params_init(&sp);
        sp.temperature = temps[c];
        sp.top_k = 0;
        sp.top_p = 1.0;
        sp.min_p = mins[c];
        sp.seed = 4242 + (uint64_t)c;
        for (int s = 0; s < STEPS; s++) {
            zi_sampler_row row = {.logits = lg, .params = &sp, .step = (uint64_t)s};
            int32_t want;
            assert_int_equal(zi_sampler_sample(cpu, &row, 1, &want, &err), ZI_OK);
            zi_gpu_sample_params g;
            assert_int_equal(zi_gpu_sample_params_set(&g, &sp, (uint64_t)s, &err), ZI_OK);
            int32_t got = zi_gpu_sample_ref(lg, V, &g);
            total++;
            if (got != want) mismatches++;
        }
        zi_sampling_params_free(&sp);
    }
    zi_sampler_free(cpu);
    print_message("%d of %d draws differ from the CPU sampler\n", mismatches, total);
    assert_true(mismatches <= 3); /* only rounding ties at a boundary may differ */
}

static void test_greedy_and_odd_rows(void **state) {
    (void)state;
    float lg[8] = {1, 5, 5, NAN, -INFINITY, 2, 5, 0};
    zi_gpu_sample_params g = gparams(0.0, 0, 1.0, 0.0, 1, 0);
    assert_int_equal(zi_gpu_sample_ref(lg, 8, &g), 1); /* ties: the lower id */
    g = gparams(1.0, 1, 1.0, 0.0, 1, 0);               /* top_k 1 is greedy */
    assert_int_equal(zi_gpu_sample_ref(lg, 8, &g), 1);
    /* top_k 2 within a tie of three: ids 1 and 2 */
    uint8_t keep[8];
    g = gparams(1.0, 2, 1.0, 0.0, 1, 0);
    assert_int_equal(zi_gpu_sample_ref_survivors(lg, 8, &g, keep), 2);
    assert_true(keep[1] && keep[2] && !keep[6]);
    /* top_p crossing inside a tie: each of the three 5s holds ~0.32 of the
     * mass; 0.5 needs two of them, the lower ids */
    g = gparams(1.0, 0, 0.5, 0.0, 1, 0);
    assert_int_equal(zi_gpu_sample_ref_survivors(lg, 8, &g, keep), 2);
    assert_true(keep[1] && keep[2] && !keep[6]);
    for (int s = 0; s < 200; s++) {
        g = gparams(1.0, 0, 1.0, 0.0, 9, (uint64_t)s);
        int32_t t = zi_gpu_sample_ref(lg, 8, &g);
        assert_true(t != 3 && t != 4); /* NaN and -inf never drawn */
    }
    /* nothing eligible */
    float none[3] = {NAN, -INFINITY, NAN};
    g = gparams(1.0, 0, 0.9, 0.1, 1, 0);
    assert_int_equal(zi_gpu_sample_ref(none, 3, &g), -1);
    g.temperature = 0.0;
    assert_int_equal(zi_gpu_sample_ref(none, 3, &g), -1);
    /* +inf values share the mass; the others get none */
    float inf[5] = {1, INFINITY, 3, INFINITY, NAN};
    long c[5] = {0};
    for (int s = 0; s < 2000; s++) {
        g = gparams(1.0, 0, 1.0, 0.0, 5, (uint64_t)s);
        c[zi_gpu_sample_ref(inf, 5, &g)]++;
    }
    assert_true(c[0] == 0 && c[2] == 0 && c[1] > 850 && c[3] > 850);
    /* the CPU tests' top_p boundary: 0.79 keeps {0, 1}, 0.81 keeps {0, 1, 2},
     * and top_k 2 then top_p 0.6 keeps {0} */
    float lg4[4] = {(float)log(0.5), (float)log(0.3), (float)log(0.15), (float)log(0.05)};
    g = gparams(1.0, 0, 0.79, 0.0, 1, 0);
    assert_int_equal(zi_gpu_sample_ref_survivors(lg4, 4, &g, keep), 2);
    g.top_p = 0.81;
    assert_int_equal(zi_gpu_sample_ref_survivors(lg4, 4, &g, keep), 3);
    g.top_k = 2;
    g.top_p = 0.6;
    assert_int_equal(zi_gpu_sample_ref_survivors(lg4, 4, &g, keep), 1);
    assert_true(keep[0]);
}

static void test_params_set(void **state) {
    (void)state;
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    zi_gpu_sample_params g;
    zi_error err = {0};
    sp.temperature = 0.8;
    sp.top_k = 40;
    sp.top_p = 0.9;
    sp.min_p = 0.05;
    sp.seed = 99;
    assert_int_equal(zi_gpu_sample_params_set(&g, &sp, 17, &err), ZI_OK);
    assert_true(g.temperature == 0.8 && g.top_k == 40 && g.top_p == 0.9 && g.min_p == 0.05);
    assert_true(g.seed == 99 && g.step == 17);
    assert_int_equal(g.flags, 0u);
    assert_int_equal(g.mask_row, -1);
    assert_int_equal(g.n_ent, 0u);
    /* penalties are carried, with the CPU sampler's on/off conditions */
    sp.repetition_penalty = 1.2;
    assert_int_equal(zi_gpu_sample_params_set(&g, &sp, 0, &err), ZI_OK);
    assert_true(g.flags == ZI_GS_REP && g.rep == 1.2);
    sp.repetition_penalty = 0.0; /* <= 0: off, as on the CPU */
    sp.presence_penalty = 0.5;
    assert_int_equal(zi_gpu_sample_params_set(&g, &sp, 0, &err), ZI_OK);
    assert_true(g.flags == ZI_GS_FP && g.pres == 0.5 && g.freq == 0.0);
    assert_int_equal(zi_gpu_sample_params_set(&g, NULL, 0, &err), ZI_EINVAL);
    zi_sampling_params_free(&sp);
}

/* The entry list: distinct tokens, generated counts, forbidden ids last
 * and overriding, prompt tokens only with the repetition penalty. */
static void test_pen_build(void **state) {
    (void)state;
    zi_gpu_pen_scratch sc;
    zi_error err = {0};
    assert_int_equal(zi_gpu_pen_scratch_init(&sc, 100, &err), ZI_OK);
    zi_gpu_sample_params p;
    memset(&p, 0, sizeof p);
    p.flags = ZI_GS_REP | ZI_GS_FP;
    const int32_t prompt[] = {5, 7, 5, 9}, gen[] = {7, 3, 7, 7}, forbid[] = {9, 2, 2};
    zi_gpu_pen e[11];
    uint32_t n = 0;
    assert_int_equal(zi_gpu_pen_build(&sc, &p, prompt, 4, gen, 4, forbid, 3, e, &n, &err), ZI_OK);
    assert_int_equal(n, 5u); /* 5 7 9 3 2 */
    const zi_gpu_pen want[] = {{5, 0}, {7, 3}, {9, ZI_GS_FORBID}, {3, 1}, {2, ZI_GS_FORBID}};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(e[i].id, want[i].id);
        assert_int_equal(e[i].count, want[i].count);
    }
    p.flags = ZI_GS_FP; /* no repetition penalty: the prompt is not listed */
    assert_int_equal(zi_gpu_pen_build(&sc, &p, prompt, 4, gen, 4, NULL, 0, e, &n, &err), ZI_OK);
    assert_int_equal(n, 2u);
    assert_true(e[0].id == 7 && e[0].count == 3 && e[1].id == 3 && e[1].count == 1);
    p.flags = 0; /* no penalty: only the forbidden ids */
    assert_int_equal(zi_gpu_pen_build(&sc, &p, prompt, 4, gen, 4, forbid, 3, e, &n, &err), ZI_OK);
    assert_int_equal(n, 2u);
    const int32_t bad[] = {1, 100};
    assert_int_equal(zi_gpu_pen_build(&sc, &p, NULL, 0, NULL, 0, bad, 2, e, &n, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "eos_forbid[1]"));
    assert_int_equal(zi_gpu_pen_build(&sc, &p, NULL, 3, NULL, 0, NULL, 0, e, &n, &err), ZI_EINVAL);
    /* the stamp wraps around without stale matches */
    sc.now = UINT32_MAX;
    p.flags = ZI_GS_REP;
    assert_int_equal(zi_gpu_pen_build(&sc, &p, prompt, 4, NULL, 0, NULL, 0, e, &n, &err), ZI_OK);
    assert_int_equal(n, 3u);
    zi_gpu_pen_scratch_free(&sc);
}

/* Steps 1-4 against the CPU sampler on many random rows: the processed
 * logits bit for bit, greedy tokens equal, seeded draws (top_k, top_p
 * off) equal up to a handful of rounding ties. */
static void test_penalties_vs_cpu(void **state) {
    (void)state;
    enum { V = 3001, W = (V + 31) / 32, ROWS = 4000, HIST = 300 };
    static float lg[V], a[V], b[V];
    static int32_t hist[HIST], forbid[4], mask[W];
    static zi_gpu_pen ents[HIST + 4];
    zi_sampler *cpu = NULL;
    zi_error err = {0};
    zi_gpu_pen_scratch sc;
    assert_int_equal(zi_sampler_create(&cpu, V, &err), ZI_OK);
    assert_int_equal(zi_gpu_pen_scratch_init(&sc, V, &err), ZI_OK);
    const double reps[] = {1.0, 1.3, 0.8, 0.0, 2.0};
    const double freqs[] = {0.0, 0.5, -0.3, 1.7};
    const double press[] = {0.0, 0.7, -1.1};
    int draws = 0, differ = 0, greedy = 0, empty = 0;
    for (int r = 0; r < ROWS; r++) {
        random_row(lg, V, r % 3 ? 6.0 : 2.0, r % 5 == 0);
        if (r % 7 == 0) lg[(r * 13) % V] = NAN, lg[(r * 31) % V] = -INFINITY;
        if (r % 11 == 0) lg[(r * 17) % V] = 0.0f, lg[(r * 19) % V] = -0.0f;
        zi_sampling_params sp;
        zi_sampling_params_init(&sp);
        sp.repetition_penalty = reps[r % 5];
        sp.frequency_penalty = freqs[(r / 5) % 4];
        sp.presence_penalty = press[(r / 20) % 3];
        sp.temperature = r % 4 == 0 ? 0.0 : (r % 4 == 1 ? 1.0 : 0.7);
        sp.top_k = 0;
        sp.top_p = 1.0;
        sp.min_p = r % 8 == 3 ? 0.05 : 0.0;
        sp.seed = 1000 + (uint64_t)r;
        /* history over a narrow id range (repeats) or the whole vocabulary */
        size_t np = (size_t)(urand() * 120), ng = (size_t)(urand() * 120),
               nf = (size_t)(urand() * 4);
        int32_t span = r % 2 ? 40 : V;
        for (size_t i = 0; i < np + ng; i++) hist[i] = (int32_t)(urand() * span);
        for (size_t i = 0; i < nf; i++)
            forbid[i] = i == 0 && ng ? hist[np] : (int32_t)(urand() * V);
        int with_mask = r % 3 == 1;
        for (int w = 0; w < W; w++) {
            uint32_t bits = (uint32_t)(urand() * 4294967296.0);
            if (r % 6 == 4) bits &= (uint32_t)(urand() * 4294967296.0); /* sparser */
            mask[w] = (int32_t)bits;
        }
        if (with_mask && r % 50 == 1) memset(mask, 0, sizeof mask); /* nothing allowed */
        zi_sampler_row row = {.logits = lg,
                              .params = &sp,
                              .prompt_ids = hist,
                              .n_prompt = np,
                              .generated_ids = hist + np,
                              .n_generated = ng,
                              .step = (uint64_t)r,
                              .bitmask = with_mask ? mask : NULL,
                              .eos_forbid = forbid,
                              .n_eos_forbid = nf};
        assert_int_equal(zi_sampler_processed_logits(cpu, &row, a, &err), ZI_OK);
        zi_gpu_sample_params g;
        uint32_t n_ent = 0;
        assert_int_equal(zi_gpu_sample_params_set(&g, &sp, (uint64_t)r, &err), ZI_OK);
        assert_int_equal(
            zi_gpu_pen_build(&sc, &g, hist, np, hist + np, ng, forbid, nf, ents, &n_ent, &err),
            ZI_OK);
        zi_gpu_prepare_ref(lg, V, &g, ents, n_ent, with_mask ? (const uint32_t *)mask : NULL, b);
        for (int t = 0; t < V; t++)
            if (memcmp(&a[t], &b[t], sizeof a[t]) != 0 && !(isnan(a[t]) && isnan(b[t])))
                fail_msg("row %d token %d: CPU %a, GPU reference %a (rep %g freq %g pres %g)", r, t,
                         (double)a[t], (double)b[t], sp.repetition_penalty, sp.frequency_penalty,
                         sp.presence_penalty);
        int32_t want = -2;
        int rc = zi_sampler_sample(cpu, &row, 1, &want, &err);
        int32_t got = zi_gpu_sample_ref(b, V, &g);
        if (rc == ZI_ERANGE) {
            assert_int_equal(want, -1);
            assert_int_equal(got, -1);
            empty++;
        } else {
            assert_int_equal(rc, ZI_OK);
            if (!(sp.temperature > 0.0)) {
                greedy++;
                if (got != want) fail_msg("row %d greedy: CPU %d, GPU reference %d", r, want, got);
            } else {
                draws++;
                differ += got != want;
            }
        }
        zi_sampling_params_free(&sp);
    }
    zi_gpu_pen_scratch_free(&sc);
    zi_sampler_free(cpu);
    print_message("%d rows: %d greedy equal, %d draws of which %d differ, %d with nothing "
                  "eligible\n",
                  ROWS, greedy, draws, differ, empty);
    assert_true(empty > 0 && greedy > 500 && draws > 2000);
    assert_true(differ <= 3); /* only rounding ties at a boundary may differ */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_matches_cpu),
        cmocka_unit_test(test_key_order),
        cmocka_unit_test(test_weight),
        cmocka_unit_test(test_survivors_vs_oracle),
        cmocka_unit_test(test_distribution),
        cmocka_unit_test(test_plain_draws_match_cpu),
        cmocka_unit_test(test_greedy_and_odd_rows),
        cmocka_unit_test(test_params_set),
        cmocka_unit_test(test_pen_build),
        cmocka_unit_test(test_penalties_vs_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
