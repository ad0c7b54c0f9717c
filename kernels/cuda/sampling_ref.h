/*
 * sampling_ref.h - the GPU sampling algorithm, written once: the per-token
 * functions shared by the CUDA kernel (sampling.cu) and a sequential C
 * reference of the kernel's passes (sampling_ref.c), which the CPU unit
 * tests hold against model_worker/sampler.c. So the selection logic of the
 * GPU sampler is verified on any machine; a GPU only adds the question of
 * whether the kernel runs the same passes (tests/gpu).
 *
 * Semantics are the CPU sampler's (sampler.h, steps 5-9): greedy when
 * temperature <= 0 or top_k == 1 (argmax, ties to the lower id; NaN and
 * -inf never chosen); otherwise weights w = exp((v - vmax) / T) (the CPU's
 * float expression, zi_gs_weight; +inf logits share the mass evenly), then top_k, top_p
 * over the renormalised top_k set (the crossing token kept), min_p against
 * the largest weight, and a draw with u = zi_sampler_uniform(seed, step)
 * (the same splitmix64 counter; reproduced bit for bit here).
 *
 * Without sorting: each filter keeps a prefix of the total order "higher
 * logit first, then lower id", so it is a cut (key, id) found by binary
 * search over the 32-bit order-preserving key of the logit (a count or a
 * mass per probe; 32 probes), ties at the cut resolved by id. The draw then
 * walks the survivors in token-id order. When top_k and top_p are off that
 * is the CPU sampler's order, so both give the same token for the same
 * (seed, step) except when u falls within float rounding of a boundary
 * between two tokens (the two sum their weights in different orders, and
 * expf is not the CPU's polynomial to the last bit); with top_k or top_p
 * the CPU walks its heap/partition order, so the tokens are identically
 * distributed but not equal draw for draw.
 *
 * Penalties, EOS masks and the allowed-token bitmask (sampler.h steps 1-4)
 * are not part of the GPU sampler: zi_gpu_sample_params_set refuses
 * parameters that need them.
 */
#ifndef ZI_SAMPLING_REF_H
#define ZI_SAMPLING_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "zi_error.h"

#ifdef __CUDACC__
#define ZI_HD __host__ __device__
#else
#define ZI_HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

struct zi_sampling_params;

/* One row's parameters, flat, as the kernel reads them. */
typedef struct zi_gpu_sample_params {
    double temperature;
    double top_p;
    double min_p;
    uint64_t seed;
    uint64_t step; /* draw counter: tokens the row has generated */
    int32_t top_k;
    int32_t reserved;
} zi_gpu_sample_params;

/* A cut in the total order: tokens with key > key, or key == key and
 * id <= id, survive. */
typedef struct zi_gpu_cut {
    uint32_t key;
    int32_t id;
} zi_gpu_cut;

/* Fills *out from sp and step. ZI_EUNSUPPORTED naming the field when sp
 * asks for a penalty (the GPU sampler does not apply them). */
int zi_gpu_sample_params_set(zi_gpu_sample_params *out, const struct zi_sampling_params *sp,
                             uint64_t step, zi_error *err);

/* The kernel's algorithm run sequentially: the token for one row of n_vocab
 * logits, or -1 when no token is eligible. */
int32_t zi_gpu_sample_ref(const float *logits, int32_t n_vocab, const zi_gpu_sample_params *p);

/* keep[t] = 1 for the tokens the draw can return (weight > 0 after every
 * filter; the argmax alone when greedy); returns how many. For tests. */
int32_t zi_gpu_sample_ref_survivors(const float *logits, int32_t n_vocab,
                                    const zi_gpu_sample_params *p, uint8_t *keep);

/* ---- shared by the kernel and the reference ---- */

static inline ZI_HD uint64_t zi_gs_mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* zi_sampler_uniform(seed, step), bit for bit. */
static inline ZI_HD double zi_gs_uniform(uint64_t seed, uint64_t step) {
    uint64_t x = zi_gs_mix64(zi_gs_mix64(seed) ^ step);
    return (double)(x >> 11) * 0x1p-53;
}

/* A token can be chosen when its logit is > -inf (NaN is not). */
static inline ZI_HD int zi_gs_candidate(float v) {
    return v > -INFINITY;
}

/* Order-preserving key: a > b (as floats, -0 == +0) iff key(a) > key(b). */
static inline ZI_HD uint32_t zi_gs_key(float v) {
    if (v == 0.0f) v = 0.0f; /* -0 and +0 compare equal: one key */
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

static inline ZI_HD float zi_gs_unkey(uint32_t k) {
    uint32_t b = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* The CPU sampler's weight (sampler.c, sample_full): exp((v - vmax) / T)
 * in float, exactly 1 at the top, 0 below e^-87; inv_t = (float)(1 / T).
 * With +inf logits (vmax = +inf) those share the mass and others get 0. */
static inline ZI_HD float zi_gs_weight(float v, float vmax, float inv_t) {
    if (isinf(vmax)) return v == vmax ? 1.0f : 0.0f;
    float d = v - vmax, a = d * inv_t;
    if (d == 0.0f) return 1.0f;
    return a >= -87.0f ? expf(a) : 0.0f;
}

static inline ZI_HD int zi_gs_in_cut(uint32_t key, int32_t id, zi_gpu_cut c) {
    return key > c.key || (key == c.key && id <= c.id);
}

/* The larger of two (value, id) pairs in the total order. */
static inline ZI_HD int zi_gs_better(float a, int32_t ia, float b, int32_t ib) {
    return a > b || (a == b && ia < ib);
}

/* min_p's threshold on the weights: min(min_p, 1) times the largest
 * weight, which is the top token's, exactly 1 (0: no filter). A float, as
 * the CPU sampler compares. */
static inline ZI_HD float zi_gs_min_p_threshold(double min_p) {
    return min_p > 0.0 ? (float)(min_p < 1.0 ? min_p : 1.0) : 0.0f;
}

/* The number of tied tokens (of weight w each, after mass s_gt above them)
 * that the top_p nucleus takes to reach target: the smallest m in
 * [1, n_eq] with s_gt + m * w >= target. */
static inline ZI_HD int64_t zi_gs_ties_needed(double target, double s_gt, double w, int64_t n_eq) {
    double need = (target - s_gt) / w;
    int64_t m = need <= 1.0 ? 1 : (need >= (double)n_eq ? n_eq : (int64_t)ceil(need));
    while (m > 1 && s_gt + (double)(m - 1) * w >= target) m--;
    while (m < n_eq && s_gt + (double)m * w < target) m++;
    return m;
}

#ifdef __cplusplus
}
#endif

#endif
