/*
 * sampling_ref.c - the GPU sampler's algorithm, sequentially (see
 * sampling_ref.h). Each loop below is one pass of the kernel in
 * sampling.cu, in the same order and with the same shared helpers; a pass
 * there is the same loop split over a thread block with a block-wide
 * reduction or scan. Built in every configuration (no CUDA needed), so the
 * unit tests run it everywhere.
 */
#include "sampling_ref.h"

#include <stdlib.h>

#include "types.h"

int zi_gpu_sample_params_set(zi_gpu_sample_params *out, const struct zi_sampling_params *sp,
                             uint64_t step, zi_error *err) {
    if (!out || !sp) return zi_error_set(err, ZI_EINVAL, "GPU sampler: NULL params");
    memset(out, 0, sizeof *out);
    out->temperature = sp->temperature;
    out->top_p = sp->top_p;
    out->min_p = sp->min_p;
    out->seed = sp->seed;
    out->step = step;
    out->top_k = sp->top_k;
    out->rep = sp->repetition_penalty;
    out->freq = sp->frequency_penalty;
    out->pres = sp->presence_penalty;
    /* the CPU sampler's conditions (sampler.c, prepare_row) */
    if (out->rep != 1.0 && out->rep > 0.0) out->flags |= ZI_GS_REP;
    if (out->freq != 0.0 || out->pres != 0.0) out->flags |= ZI_GS_FP;
    out->mask_row = -1;
    return ZI_OK;
}

int zi_gpu_pen_scratch_init(zi_gpu_pen_scratch *s, int32_t n_vocab, zi_error *err) {
    memset(s, 0, sizeof *s);
    if (n_vocab < 1) return zi_error_set(err, ZI_EINVAL, "GPU sampler: n_vocab %d", (int)n_vocab);
    s->n_vocab = n_vocab;
    s->stamp = calloc((size_t)n_vocab, sizeof *s->stamp);
    s->slot = malloc((size_t)n_vocab * sizeof *s->slot);
    if (!s->stamp || !s->slot) {
        zi_gpu_pen_scratch_free(s);
        return zi_error_set(err, ZI_ENOMEM, "GPU sampler: out of memory for n_vocab %d",
                            (int)n_vocab);
    }
    return ZI_OK;
}

void zi_gpu_pen_scratch_free(zi_gpu_pen_scratch *s) {
    free(s->stamp);
    free(s->slot);
    memset(s, 0, sizeof *s);
}

static int check_ids(const int32_t *ids, size_t n, int32_t n_vocab, const char *field,
                     zi_error *err) {
    if (n && !ids) return zi_error_set(err, ZI_EINVAL, "GPU sampler: %s is NULL", field);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return zi_error_set(err, ZI_EINVAL, "GPU sampler: %s[%zu] = %d outside [0, %d)", field,
                                i, (int)ids[i], (int)n_vocab);
    return ZI_OK;
}

/* The entry of token t in this row, appended on first sight (count 0). */
static zi_gpu_pen *entry(zi_gpu_pen_scratch *s, int32_t t, zi_gpu_pen *out, uint32_t *n) {
    if (s->stamp[t] != s->now) {
        s->stamp[t] = s->now;
        s->slot[t] = *n;
        out[*n] = (zi_gpu_pen){t, 0};
        ++*n;
    }
    return &out[s->slot[t]];
}

int zi_gpu_pen_build(zi_gpu_pen_scratch *s, const zi_gpu_sample_params *p, const int32_t *prompt,
                     size_t n_prompt, const int32_t *generated, size_t n_generated,
                     const int32_t *forbid, size_t n_forbid, zi_gpu_pen *out, uint32_t *n_out,
                     zi_error *err) {
    *n_out = 0;
    int rc;
    if ((rc = check_ids(prompt, n_prompt, s->n_vocab, "prompt_ids", err)) ||
        (rc = check_ids(generated, n_generated, s->n_vocab, "generated_ids", err)) ||
        (rc = check_ids(forbid, n_forbid, s->n_vocab, "eos_forbid", err)))
        return rc;
    /* a fresh stamp; on wrap-around clear so old stamps cannot match */
    if (++s->now == 0) {
        memset(s->stamp, 0, (size_t)s->n_vocab * sizeof *s->stamp);
        s->now = 1;
    }
    uint32_t n = 0;
    if (p->flags & (ZI_GS_REP | ZI_GS_FP)) {
        if (p->flags & ZI_GS_REP)
            for (size_t i = 0; i < n_prompt; i++) entry(s, prompt[i], out, &n);
        for (size_t i = 0; i < n_generated; i++) entry(s, generated[i], out, &n)->count++;
    }
    for (size_t i = 0; i < n_forbid; i++) entry(s, forbid[i], out, &n)->count = ZI_GS_FORBID;
    *n_out = n;
    return ZI_OK;
}

void zi_gpu_prepare_ref(const float *logits, int32_t n, const zi_gpu_sample_params *p,
                        const zi_gpu_pen *ents, uint32_t n_ent, const uint32_t *mask, float *out) {
    /* the kernel's two passes: the masked copy, then the listed tokens */
    for (int32_t t = 0; t < n; t++) out[t] = zi_gs_allowed(mask, t) ? logits[t] : -INFINITY;
    for (uint32_t i = 0; i < n_ent; i++) {
        int32_t t = ents[i].id;
        if (t < 0 || t >= n) continue;
        out[t] = zi_gs_allowed(mask, t) ? zi_gs_penalised(logits[t], p, ents[i].count) : -INFINITY;
    }
}

/* Largest key K with count(candidates in cut, key >= K) >= k (F is
 * non-increasing in K, so a binary search over all 2^32 keys). */
static uint32_t search_count(const float *lg, int32_t n, zi_gpu_cut cut, int64_t k) {
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
        uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
        int64_t c = 0;
        for (int32_t t = 0; t < n; t++) {
            uint32_t key = zi_gs_key(lg[t]);
            c += zi_gs_candidate(lg[t]) && zi_gs_in_cut(key, t, cut) && key >= mid;
        }
        if (c >= k)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Largest key K with mass(candidates in cut, key >= K) >= target. */
static uint32_t search_mass(const float *lg, int32_t n, zi_gpu_cut cut, float vmax, float inv_t,
                            double target) {
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
        uint32_t mid = lo + (uint32_t)(((uint64_t)hi - lo + 1) / 2);
        double s = 0.0;
        for (int32_t t = 0; t < n; t++) {
            uint32_t key = zi_gs_key(lg[t]);
            if (zi_gs_candidate(lg[t]) && zi_gs_in_cut(key, t, cut) && key >= mid)
                s += zi_gs_weight(lg[t], vmax, inv_t);
        }
        if (s >= target)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The id of the m-th (1-based) candidate in id order with key == key and
 * inside cut. */
static int32_t mth_tied(const float *lg, int32_t n, zi_gpu_cut cut, uint32_t key, int64_t m) {
    int64_t c = 0;
    for (int32_t t = 0; t < n; t++)
        if (zi_gs_candidate(lg[t]) && zi_gs_in_cut(zi_gs_key(lg[t]), t, cut) &&
            zi_gs_key(lg[t]) == key && ++c == m)
            return t;
    return n - 1; /* unreachable when m <= the tie count */
}

/* What the draw needs once the filters are known. */
typedef struct ref_state {
    int32_t best; /* the top token, -1 when none is eligible */
    int greedy;   /* 1: the answer is best */
    float vmax, inv_t, thr;
    zi_gpu_cut cut; /* top_k and top_p, as one cut */
} ref_state;

/* Passes 1-3: the best token, the top_k cut, the top_p cut. */
static void ref_prepare(const float *lg, int32_t n, const zi_gpu_sample_params *p, ref_state *st) {
    /* pass 1: the best token and the candidate count */
    int32_t best = -1;
    float vmax = -INFINITY;
    int64_t n_cand = 0;
    for (int32_t t = 0; t < n; t++) {
        if (!zi_gs_candidate(lg[t])) continue;
        n_cand++;
        if (best < 0 || zi_gs_better(lg[t], t, vmax, best)) vmax = lg[t], best = t;
    }
    st->best = best;
    st->vmax = vmax;
    st->greedy = !(p->temperature > 0.0) || p->top_k == 1 || best < 0;
    st->cut = (zi_gpu_cut){0u, INT32_MAX}; /* every candidate */
    if (st->greedy) return;
    const float inv_t = (float)(1.0 / p->temperature);
    zi_gpu_cut cut = st->cut;

    /* top_k: the k-th best key, then the lowest ids among its ties */
    int64_t k = p->top_k >= 1 && p->top_k < n ? p->top_k : 0;
    if (k && n_cand > k) {
        uint32_t kk = search_count(lg, n, cut, k);
        int64_t gt = 0;
        for (int32_t t = 0; t < n; t++) gt += zi_gs_candidate(lg[t]) && zi_gs_key(lg[t]) > kk;
        cut.id = mth_tied(lg, n, cut, kk, k - gt);
        cut.key = kk;
    }

    /* top_p over the renormalised top_k set */
    if (p->top_p < 1.0) {
        double z = 0.0;
        for (int32_t t = 0; t < n; t++)
            if (zi_gs_candidate(lg[t]) && zi_gs_in_cut(zi_gs_key(lg[t]), t, cut))
                z += zi_gs_weight(lg[t], vmax, inv_t);
        double target = p->top_p * z;
        uint32_t kp = search_mass(lg, n, cut, vmax, inv_t, target);
        double s_gt = 0.0;
        int64_t n_eq = 0;
        for (int32_t t = 0; t < n; t++) {
            uint32_t key = zi_gs_key(lg[t]);
            if (!zi_gs_candidate(lg[t]) || !zi_gs_in_cut(key, t, cut)) continue;
            if (key > kp) s_gt += zi_gs_weight(lg[t], vmax, inv_t);
            n_eq += key == kp;
        }
        /* n_eq == 0: rounding left even the whole set short of target; keep all */
        if (n_eq > 0) {
            double w = zi_gs_weight(zi_gs_unkey(kp), vmax, inv_t);
            int64_t m = zi_gs_ties_needed(target, s_gt, w, n_eq);
            cut.id = mth_tied(lg, n, cut, kp, m);
            cut.key = kp;
        }
    }
    st->cut = cut;
    st->inv_t = inv_t;
    /* min_p against the largest weight (the top token's: 1) */
    st->thr = zi_gs_min_p_threshold(p->min_p);
}

/* The draw's weight of token t: 0 unless it survives every filter. */
static float ref_weight(const float *lg, int32_t t, const ref_state *st) {
    if (!zi_gs_candidate(lg[t]) || !zi_gs_in_cut(zi_gs_key(lg[t]), t, st->cut)) return 0.0f;
    float w = zi_gs_weight(lg[t], st->vmax, st->inv_t);
    return w >= st->thr && w > 0.0f ? w : 0.0f;
}

int32_t zi_gpu_sample_ref_survivors(const float *lg, int32_t n, const zi_gpu_sample_params *p,
                                    uint8_t *keep) {
    ref_state st;
    ref_prepare(lg, n, p, &st);
    int32_t count = 0;
    for (int32_t t = 0; t < n; t++) {
        keep[t] = st.greedy ? t == st.best : ref_weight(lg, t, &st) > 0.0f;
        count += keep[t];
    }
    return count;
}

int32_t zi_gpu_sample_ref(const float *lg, int32_t n, const zi_gpu_sample_params *p) {
    ref_state st;
    ref_prepare(lg, n, p, &st);
    if (st.greedy) return st.best;
    /* the draw, walking the survivors in id order */
    double zs = 0.0;
    int32_t last = -1;
    for (int32_t t = 0; t < n; t++) {
        float w = ref_weight(lg, t, &st);
        if (w > 0.0f) zs += w, last = t;
    }
    double target = zi_gs_uniform(p->seed, p->step) * zs, cum = 0.0;
    for (int32_t t = 0; t < n; t++) {
        float w = ref_weight(lg, t, &st);
        if (!(w > 0.0f)) continue;
        cum += w;
        if (cum > target) return t;
    }
    return last; /* rounding left target at the very top */
}
