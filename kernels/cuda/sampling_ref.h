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
 * Steps 1-4 (penalties, EOS mask, allowed-token bitmask) come first, as a
 * rewrite of the row into the sampler's own buffer: the host reduces a
 * row's history to a compact list of distinct tokens (zi_gpu_pen_build:
 * each with its count among the generated tokens, or "forbidden" for the
 * EOS mask), and the rewrite copies the row with masked tokens at -inf
 * and then sets each listed token to zi_gs_penalised of its raw logit
 * (the CPU sampler's double expression, bit for bit) unless the mask
 * forbids it. zi_gpu_prepare_ref is that rewrite run sequentially.
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

/* zi_gpu_sample_params.flags */
#define ZI_GS_REP 1u  /* repetition penalty on (r != 1 and r > 0, as the CPU sampler) */
#define ZI_GS_FP 2u   /* frequency/presence penalties on (either != 0) */
#define ZI_GS_PREP 4u /* steps 1-4 rewrite the row (entries or a bitmask): read the copy */

/* One row's parameters, flat, as the kernel reads them. */
typedef struct zi_gpu_sample_params {
    double temperature;
    double top_p;
    double min_p;
    double rep, freq, pres; /* repetition, frequency, presence penalties */
    uint64_t seed;
    uint64_t step;    /* draw counter: tokens the row has generated */
    const float *src; /* the row's logits (device); NULL: d_logits + r * ld. Not
                         read by the reference. */
    int32_t top_k;
    uint32_t flags;   /* ZI_GS_* */
    uint32_t ent_off; /* the row's entries: ents[ent_off .. ent_off + n_ent) */
    uint32_t n_ent;
    int32_t mask_row; /* its bitmask: masks + mask_row * ceil(n_vocab / 32); -1: none */
    int32_t reserved;
} zi_gpu_sample_params;

/* A token the penalties or the EOS mask touch in one row (distinct ids). */
typedef struct zi_gpu_pen {
    int32_t id;
    int32_t count; /* occurrences among the generated tokens; ZI_GS_FORBID: -inf */
} zi_gpu_pen;
#define ZI_GS_FORBID (-1)

/* Host scratch for zi_gpu_pen_build: a stamp per token, as in sampler.c. */
typedef struct zi_gpu_pen_scratch {
    int32_t n_vocab;
    uint32_t now;
    uint32_t *stamp; /* [n_vocab] stamp[t] == now: t has an entry this row */
    uint32_t *slot;  /* [n_vocab] its index in the row's entries */
} zi_gpu_pen_scratch;

int zi_gpu_pen_scratch_init(zi_gpu_pen_scratch *s, int32_t n_vocab, zi_error *err);
void zi_gpu_pen_scratch_free(zi_gpu_pen_scratch *s);

/* The entries of one row (sampler.h steps 1-3) into out, which has room
 * for n_prompt + n_generated + n_forbid: the distinct prompt tokens when
 * p asks for the repetition penalty, the distinct generated tokens with
 * their counts when it asks for any penalty, the forbidden ids last
 * (overriding). *n_out gets how many. ZI_EINVAL naming the field for an id
 * outside [0, n_vocab) or a NULL list of nonzero length (nothing usable
 * is written then). */
int zi_gpu_pen_build(zi_gpu_pen_scratch *s, const zi_gpu_sample_params *p, const int32_t *prompt,
                     size_t n_prompt, const int32_t *generated, size_t n_generated,
                     const int32_t *forbid, size_t n_forbid, zi_gpu_pen *out, uint32_t *n_out,
                     zi_error *err);

/* Steps 1-4 on one row, sequentially, as the kernel's rewrite pass: out
 * (n_vocab floats) gets the row with bitmask-forbidden tokens at -inf and
 * each entry's token at zi_gs_penalised (or -inf). mask may be NULL. */
void zi_gpu_prepare_ref(const float *logits, int32_t n_vocab, const zi_gpu_sample_params *p,
                        const zi_gpu_pen *ents, uint32_t n_ent, const uint32_t *mask, float *out);

/* A cut in the total order: tokens with key > key, or key == key and
 * id <= id, survive. */
typedef struct zi_gpu_cut {
    uint32_t key;
    int32_t id;
} zi_gpu_cut;

/* Fills *out from sp and step: the sampling parameters and the penalties
 * (flags ZI_GS_REP / ZI_GS_FP); src, the entries and the mask are the
 * caller's to set (none: 0 entries, mask_row -1). */
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

/* Steps 1-2 for one listed token: the CPU sampler's prepare_row, in
 * double, the penalty's product and sum rounded one by one (no fused
 * multiply-add on the device, which would round once). */
static inline ZI_HD float zi_gs_penalised(float raw, const zi_gpu_sample_params *p, int32_t count) {
    if (count < 0) return -INFINITY; /* ZI_GS_FORBID */
    double v = raw;
    if (p->flags & ZI_GS_REP) v = v > 0 ? v / p->rep : v * p->rep;
    if ((p->flags & ZI_GS_FP) && count > 0) {
#ifdef __CUDA_ARCH__
        v = __dsub_rn(v, __dadd_rn(__dmul_rn(p->freq, (double)count), p->pres));
#else
        v -= p->freq * count + p->pres;
#endif
    }
    return (float)v;
}

/* Step 4: is token t allowed by the packed bitmask (NULL: all are)? */
static inline ZI_HD int zi_gs_allowed(const uint32_t *mask, int32_t t) {
    return !mask || ((mask[t >> 5] >> (t & 31)) & 1u);
}

#ifdef __cplusplus
}
#endif

#endif
