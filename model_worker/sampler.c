/*
 * sampler.c - the fused sampling processor; see sampler.h for the order of
 * operations and the guarantees.
 *
 * Penalties touch only the tokens named in a row's lists, so they are kept
 * sparse: a stamp per token says whether adj[t] holds this row's adjusted
 * logit, which avoids clearing vocabulary-sized arrays for every row. The
 * main pass then reads adj[] or the raw logit, applies the bitmask, and
 * feeds the greedy argmax, a top_k heap or the full candidate list.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ZI_SAMPLER_BLOCK 64
#define ZI_SAMPLER_BUCKETS 512

typedef struct zi_cand {
    double w; /* unnormalised probability exp((v - vmax) / T) */
    float v;  /* penalised logit */
    int32_t id;
} zi_cand;

struct zi_sampler {
    int32_t n_vocab;
    uint32_t stamp_now; /* current row's stamp; stamp[t] == stamp_now => adj[t] valid */
    uint32_t *stamp;
    float *adj;
    int32_t *count;
    int32_t *touched;
    zi_cand *cand;
    /* the whole-vocabulary path (sample_full) */
    float *w;                        /* [V] weights */
    float *rowbuf;                   /* [V] a row with penalties and masks applied */
    int32_t *ids;                    /* [V] tokens surely in the nucleus */
    double *blk;                     /* [V / ZI_SAMPLER_BLOCK + 1] block sums of w */
    double hist[ZI_SAMPLER_BUCKETS]; /* mass per weight bucket (top_p) */
};

int zi_sampler_create(zi_sampler **out, int32_t n_vocab, zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "sampler: out is NULL");
    *out = NULL;
    if (n_vocab < 1 || n_vocab > (1 << 28))
        return zi_error_set(err, ZI_EINVAL, "sampler: n_vocab %d outside [1, 2^28]", (int)n_vocab);
    zi_sampler *s = calloc(1, sizeof *s);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "sampler: out of memory");
    size_t n = (size_t)n_vocab;
    s->n_vocab = n_vocab;
    s->stamp = calloc(n, sizeof *s->stamp);
    s->adj = malloc(n * sizeof *s->adj);
    s->count = malloc(n * sizeof *s->count);
    s->touched = malloc(n * sizeof *s->touched);
    s->cand = malloc(n * sizeof *s->cand);
    s->w = malloc(n * sizeof *s->w);
    s->rowbuf = malloc(n * sizeof *s->rowbuf);
    s->ids = malloc(n * sizeof *s->ids);
    s->blk = malloc((n / ZI_SAMPLER_BLOCK + 1) * sizeof *s->blk);
    if (!s->stamp || !s->adj || !s->count || !s->touched || !s->cand || !s->w || !s->rowbuf ||
        !s->ids || !s->blk) {
        zi_sampler_free(s);
        return zi_error_set(err, ZI_ENOMEM, "sampler: out of memory for n_vocab %d", (int)n_vocab);
    }
    *out = s;
    return ZI_OK;
}

void zi_sampler_free(zi_sampler *s) {
    if (!s) return;
    free(s->stamp);
    free(s->adj);
    free(s->count);
    free(s->touched);
    free(s->cand);
    free(s->w);
    free(s->rowbuf);
    free(s->ids);
    free(s->blk);
    free(s);
}

/* splitmix64's finaliser: a bijective 64-bit mix. */
static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double zi_sampler_uniform(uint64_t seed, uint64_t step) {
    uint64_t x = mix64(mix64(seed) ^ step);
    return (double)(x >> 11) * 0x1p-53;
}

/* The total order used everywhere: higher logit first, then lower id. */
static inline int better(const zi_cand *a, const zi_cand *b) {
    return a->v > b->v || (a->v == b->v && a->id < b->id);
}

static inline void swap_cand(zi_cand *a, zi_cand *b) {
    zi_cand t = *a;
    *a = *b;
    *b = t;
}

/* Min-heap on `better` (the worst kept candidate at the root). */
static void heap_sift_down(zi_cand *h, size_t n, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && better(&h[m], &h[l])) m = l;
        if (r < n && better(&h[m], &h[r])) m = r;
        if (m == i) return;
        swap_cand(&h[i], &h[m]);
        i = m;
    }
}

static void heap_sift_up(zi_cand *h, size_t i) {
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(&h[p], &h[i])) return;
        swap_cand(&h[p], &h[i]);
        i = p;
    }
}

/* Quickselect partition of c[lo..hi) (hi - lo >= 2) around a median-of-three
 * pivot: returns st with c[lo..st) better than c[st], c[st+1..hi) worse. Keys
 * are distinct (the id breaks ties), so every step makes progress. */
static size_t partition(zi_cand *c, size_t lo, size_t hi) {
    size_t mid = lo + (hi - lo) / 2, last = hi - 1;
    if (better(&c[mid], &c[lo])) swap_cand(&c[mid], &c[lo]);
    if (better(&c[last], &c[lo])) swap_cand(&c[last], &c[lo]);
    if (better(&c[last], &c[mid])) swap_cand(&c[last], &c[mid]);
    swap_cand(&c[mid], &c[last]); /* the median is the pivot, parked at the end */
    const zi_cand pv = c[last];
    size_t st = lo;
    for (size_t i = lo; i < last; i++)
        if (better(&c[i], &pv)) swap_cand(&c[i], &c[st++]);
    swap_cand(&c[st], &c[last]);
    return st;
}

/*
 * top_p without sorting: the nucleus is the shortest prefix, in descending
 * order, whose mass reaches target. Quickselect guided by mass finds the
 * crossing element in expected O(n): after each partition, if the better
 * side alone reaches what is still needed the crossing lies there, else it
 * is the pivot or beyond. Returns the cut; c[0..cut) is the nucleus (in no
 * particular but deterministic order).
 */
static size_t top_p_cut(zi_cand *c, size_t n, double target) {
    size_t lo = 0, hi = n;
    double need = target;
    while (hi - lo > 1) {
        size_t st = partition(c, lo, hi);
        double mass = 0.0;
        for (size_t i = lo; i < st; i++) mass += c[i].w;
        if (mass >= need && st > lo) {
            hi = st;
        } else if (mass + c[st].w >= need) {
            return st + 1;
        } else {
            need -= mass + c[st].w;
            lo = st + 1;
            if (lo >= hi) return n; /* rounding: everything is needed */
        }
    }
    return lo + 1;
}

/* Adds a candidate: appended when there is no top_k, else through a k-entry
 * min-heap. Tokens arrive in id order, so a later token with an equal logit
 * is worse and only a strictly greater one replaces the root. */
static inline void offer(zi_cand *c, size_t *n, size_t k, float v, int32_t t) {
    zi_cand x = {0.0, v, t};
    if (!k) {
        c[(*n)++] = x;
    } else if (*n < k) {
        c[*n] = x;
        heap_sift_up(c, (*n)++);
    } else if (v > c[0].v) {
        c[0] = x;
        heap_sift_down(c, *n, 0);
    }
}

/* The end of the block of ZI_SAMPLER_BLOCK tokens that starts at t0 < V. */
static inline int32_t block_end(int32_t t0, int32_t V) {
    return V - t0 < ZI_SAMPLER_BLOCK ? V : t0 + ZI_SAMPLER_BLOCK;
}

/* Largest of x[a..b), NaN ignored; -inf for an all -inf/NaN block. Written
 * as a select so the compiler can use vector max instructions. */
static inline float block_max(const float *x, int32_t a, int32_t b) {
    /* eight independent lanes: the compiler may not reorder one max chain
     * (NaN rules), but it can run these side by side in one vector */
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                  -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int32_t t = a;
    for (; t + 8 <= b; t += 8)
        for (int j = 0; j < 8; j++) m[j] = x[t + j] > m[j] ? x[t + j] : m[j];
    for (; t < b; t++) m[0] = x[t] > m[0] ? x[t] : m[0];
    float r = m[0];
    for (int j = 1; j < 8; j++) r = m[j] > r ? m[j] : r;
    return r;
}

/* Marks t as touched for this row (adj = raw logit, count = -1: not in
 * the history the penalties look at). */
static inline void touch(zi_sampler *s, const float *logits, int32_t t, size_t *n_touched) {
    if (s->stamp[t] != s->stamp_now) {
        s->stamp[t] = s->stamp_now;
        s->adj[t] = logits[t];
        s->count[t] = -1;
        s->touched[(*n_touched)++] = t;
    }
}

static int check_ids(const int32_t *ids, size_t n, int32_t n_vocab, size_t row, const char *field,
                     zi_error *err) {
    if (n && !ids) return zi_error_set(err, ZI_EINVAL, "sampler: row %zu: %s is NULL", row, field);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return zi_error_set(err, ZI_EINVAL, "sampler: row %zu: %s[%zu] = %d outside [0, %d)",
                                row, field, i, (int)ids[i], (int)n_vocab);
    return ZI_OK;
}

/* Steps 0-3 for one row: fills adj[] for the touched tokens under a fresh
 * stamp. Returns how many tokens were touched (0: read raw logits only). */
static size_t prepare_row(zi_sampler *s, const zi_sampler_row *row) {
    const zi_sampling_params *sp = row->params;
    const float *lg = row->logits;
    const int32_t V = s->n_vocab;

    /* New stamp for this row; on wrap-around clear so old stamps cannot match. */
    if (++s->stamp_now == 0) {
        memset(s->stamp, 0, (size_t)V * sizeof *s->stamp);
        s->stamp_now = 1;
    }
    size_t nt = 0;
    /* Step 0, the logit bias (ids the sampler cannot draw are skipped:
     * their logits are never read). */
    for (size_t i = 0; i < sp->logit_bias.n; i++) {
        int32_t t = sp->logit_bias.v[i].id;
        if (t < 0 || t >= V) continue;
        touch(s, lg, t, &nt);
        s->adj[t] += sp->logit_bias.v[i].bias;
    }
    double rep = sp->repetition_penalty, fq = sp->frequency_penalty, pr = sp->presence_penalty;
    int use_rep = rep != 1.0 && rep > 0.0, use_fp = fq != 0.0 || pr != 0.0;
    if (use_rep || use_fp) {
        if (use_rep)
            for (size_t i = 0; i < row->n_prompt; i++) {
                int32_t t = row->prompt_ids[i];
                touch(s, lg, t, &nt);
                if (s->count[t] < 0) s->count[t] = 0;
            }
        size_t n_all = row->n_generated + row->n_more_generated;
        for (size_t i = 0; i < n_all; i++) {
            int32_t t = i < row->n_generated ? row->generated_ids[i]
                                             : row->more_generated_ids[i - row->n_generated];
            touch(s, lg, t, &nt);
            s->count[t] = s->count[t] < 0 ? 1 : s->count[t] + 1;
        }
        for (size_t i = 0; i < nt; i++) {
            int32_t t = s->touched[i];
            if (s->count[t] < 0) continue; /* biased only */
            double v = s->adj[t];
            if (use_rep) v = v > 0 ? v / rep : v * rep;
            int32_t c = s->count[t];
            if (use_fp && c > 0) v -= fq * c + pr;
            s->adj[t] = (float)v;
        }
    }
    for (size_t i = 0; i < row->n_eos_forbid; i++) {
        int32_t t = row->eos_forbid[i];
        touch(s, lg, t, &nt);
        s->adj[t] = -INFINITY;
    }
    return nt;
}

/*
 * e^x for x in [-87, 0] to about float precision, with no libm call so that
 * the loop over a vocabulary vectorises: e^x = 2^n e^g with n = round(x /
 * ln 2) and |g| <= ln(2) / 2 (ln 2 split in two for an exact reduction),
 * e^g by its degree-7 Taylor polynomial (truncation error below 1e-8).
 */
static inline float exp_neg(float x) {
    int n = (int)(x * 1.44269504f - 0.5f); /* x <= 0: round to nearest */
    float g = (x - (float)n * 0.693145751953125f) - (float)n * 1.42860677e-06f;
    float p = 1.0f / 5040;
    p = p * g + 1.0f / 720;
    p = p * g + 1.0f / 120;
    p = p * g + 1.0f / 24;
    p = p * g + 1.0f / 6;
    p = p * g + 0.5f;
    p = p * g + 1.0f;
    p = p * g + 1.0f;
    union {
        uint32_t u;
        float f;
    } scale = {.u = (uint32_t)(n + 127) << 23};
    return p * scale.f;
}

/* e^d for d = x - max <= 0: 0 below e^-87 and for -inf or NaN (a NaN
 * compares false), branch-free so that a loop over a vocabulary vectorises. */
static inline float exp_weight(float d) {
    const float w = exp_neg(d >= -87.0f ? d : -87.0f);
    return d >= -87.0f ? w : 0.0f;
}

/* Weight bucket for top_p: the exponent and two mantissa bits of w in
 * (0, 1], so each bucket spans a factor 2^(1/4) and a lower bucket holds
 * strictly larger weights (hence larger logits: the same order as better()). */
static inline int bucket_of(float w) {
    union {
        float f;
        uint32_t u;
    } b = {.f = w};
    int k = 508 - (int)(b.u >> 21); /* 1.0f >> 21 == 508; w == 0 gives 508 too */
    return k < 0 ? 0 : k;
}

/*
 * Steps 5-9 over the whole vocabulary (no top_k) for a row of values x
 * (penalties and masks already applied), without building a candidate per
 * token:
 *   1. w[t] = exp((x[t] - max) / T) for every token, with 64-token block sums;
 *      weights below e^-87 of the largest count as 0 (their total is under
 *      1e-33 of the mass).
 *   2. top_p: a histogram of the mass by weight bucket finds the bucket where
 *      the descending cumulative mass crosses top_p; tokens in higher
 *      buckets are in the nucleus, and the crossing bucket alone goes
 *      through the mass-guided quickselect (top_p_cut).
 *   3. min_p drops weights below min_p (the largest weight is 1), and the
 *      draw walks the block sums, then one block.
 * Returns -1 when no token is eligible, -2 for a row with +inf values (the
 * general path handles those).
 */
static int32_t sample_full(zi_sampler *s, const zi_sampling_params *sp, const float *x,
                           uint64_t step) {
    const int32_t V = s->n_vocab;
    const float vmax = block_max(x, 0, V);
    if (vmax == -INFINITY) return -1;
    if (vmax == INFINITY) return -2;
    const float inv_t = (float)(1.0 / sp->temperature);
    const float thr = sp->min_p > 0.0 ? (float)(sp->min_p < 1.0 ? sp->min_p : 1.0) : 0.0f;
    const int full_p = !(sp->top_p < 1.0);
    /* With top_p off, min_p can drop weights right away. */
    const float keep = full_p ? thr : 0.0f;
    float *w = s->w;
    double z = 0.0;
    int32_t nb = 0;
    /* Branch-free so that it vectorises: the exponential of a clamped
     * argument, then selects (a NaN value compares false: weight 0). */
    for (int32_t t = 0; t < V; t++) {
        float d = x[t] - vmax, a = d * inv_t;
        float ac = a >= -87.0f ? a : -87.0f;
        float wt = exp_neg(ac);
        wt = a >= -87.0f ? wt : 0.0f;
        wt = d == 0.0f ? 1.0f : wt;
        w[t] = wt >= keep ? wt : 0.0f;
    }
    for (int32_t t0 = 0; t0 < V; t0 += ZI_SAMPLER_BLOCK, nb++) {
        int32_t e = block_end(t0, V);
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int32_t t = t0;
        for (t = t0; t + 8 <= e; t += 8)
            for (int j = 0; j < 8; j++) acc[j] += w[t + j];
        for (; t < e; t++) acc[0] += w[t];
        double bs = 0.0;
        for (int j = 0; j < 8; j++) bs += acc[j];
        s->blk[nb] = bs;
        z += bs;
    }
    if (full_p) { /* draw over every kept weight, in id order */
        double target = zi_sampler_uniform(sp->seed, step) * z, cum = 0.0;
        int32_t b = 0;
        while (b < nb - 1 && cum + s->blk[b] <= target) cum += s->blk[b++];
        int32_t last = -1, e = block_end(b * ZI_SAMPLER_BLOCK, V);
        for (int32_t t = b * ZI_SAMPLER_BLOCK; t < e; t++) {
            if (w[t] <= 0.0f) continue;
            cum += w[t];
            last = t;
            if (cum > target) return t;
        }
        if (last >= 0) return last; /* rounding left target at the block's top */
        for (int32_t t = V - 1; t >= 0; t--)
            if (w[t] > 0.0f) return t;
        return -1;
    }
    /* top_p. Usually the nucleus lies among the few tokens with weights of
     * at least 2^-12 (of the largest): when their mass alone reaches
     * top_p * z, only they are looked at below; else every token is. */
    const double target = sp->top_p * z;
    const float tau = 1.0f / 4096;
    float big[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int32_t t2 = 0;
    for (; t2 + 8 <= V; t2 += 8)
        for (int j = 0; j < 8; j++) big[j] += w[t2 + j] >= tau ? w[t2 + j] : 0.0f;
    for (; t2 < V; t2++) big[0] += w[t2] >= tau ? w[t2] : 0.0f;
    double big_mass = 0.0;
    for (int j = 0; j < 8; j++) big_mass += big[j];
    const float floor_w = big_mass >= target ? tau : 0x1p-126f;
    int32_t *sel = s->touched, n_sel = 0; /* prepare_row is done with it */
    for (int32_t t = 0; t < V; t++)
        if (w[t] >= floor_w) sel[n_sel++] = t;
    /* Which bucket does the descending mass cross top_p * z in? */
    double *hist = s->hist;
    memset(hist, 0, sizeof s->hist);
    for (int32_t i = 0; i < n_sel; i++) hist[bucket_of(w[sel[i]])] += w[sel[i]];
    double before = 0.0;
    int B = 0;
    while (B < ZI_SAMPLER_BUCKETS && before + hist[B] < target) before += hist[B++];
    size_t n_sure = 0, n_edge = 0;
    for (int32_t i = 0; i < n_sel; i++) {
        int32_t t = sel[i];
        int b = bucket_of(w[t]);
        if (b < B)
            s->ids[n_sure++] = t;
        else if (b == B)
            s->cand[n_edge++] = (zi_cand){w[t], x[t], t};
    }
    size_t cut = n_edge ? top_p_cut(s->cand, n_edge, target - before) : 0;
    /* min_p over the nucleus, then the draw: sure tokens in id order, then
     * the crossing bucket's part. */
    double zs = 0.0;
    for (size_t i = 0; i < n_sure; i++)
        if (w[s->ids[i]] >= thr) zs += w[s->ids[i]];
    for (size_t i = 0; i < cut; i++)
        if (s->cand[i].w >= thr) zs += s->cand[i].w;
    double goal = zi_sampler_uniform(sp->seed, step) * zs, cum = 0.0;
    int32_t last = -1;
    for (size_t i = 0; i < n_sure; i++) {
        float wt = w[s->ids[i]];
        if (wt < thr) continue;
        cum += wt;
        last = s->ids[i];
        if (cum > goal) return last;
    }
    for (size_t i = 0; i < cut; i++) {
        if (s->cand[i].w < thr) continue;
        cum += s->cand[i].w;
        last = s->cand[i].id;
        if (cum > goal) return last;
    }
    return last;
}

/* Writes row (penalties from prepare_row, which touched nt tokens, and the
 * bitmask) out whole into s->rowbuf: a copy, the touched tokens, then the
 * masked words. Every later pass then reads one flat array. */
static const float *materialize(zi_sampler *s, const zi_sampler_row *row, size_t nt) {
    const int32_t V = s->n_vocab;
    memcpy(s->rowbuf, row->logits, (size_t)V * sizeof *s->rowbuf);
    for (size_t i = 0; i < nt; i++) s->rowbuf[s->touched[i]] = s->adj[s->touched[i]];
    if (row->bitmask)
        for (int32_t w = 0; w * 32 < V; w++) {
            uint32_t bits = (uint32_t)row->bitmask[w];
            if (bits == 0xffffffffu) continue;
            for (int32_t j = 0; j < 32 && w * 32 + j < V; j++)
                if (!((bits >> j) & 1u)) s->rowbuf[w * 32 + j] = -INFINITY;
        }
    return s->rowbuf;
}

/* Samples one row; returns the token or -1 when none is eligible. */
static int32_t sample_row(zi_sampler *s, const zi_sampler_row *row) {
    const zi_sampling_params *sp = row->params;
    const int32_t V = s->n_vocab;
    size_t nt = prepare_row(s, row);
    /* Penalties or a bitmask: the processed row once, then the same passes. */
    const float *lg = nt > 0 || row->bitmask ? materialize(s, row, nt) : row->logits;
    double T = sp->temperature;
    int greedy = !(T > 0.0) || sp->top_k == 1;

    if (greedy) {
        int32_t best = -1;
        float bv = -INFINITY;
        /* Block maxima (a vectorisable reduction) skip blocks that cannot win. */
        for (int32_t t0 = 0; t0 < V; t0 += ZI_SAMPLER_BLOCK) {
            int32_t e = block_end(t0, V);
            if (!(block_max(lg, t0, e) > bv)) continue;
            for (int32_t t = t0; t < e; t++)
                if (lg[t] > bv) bv = lg[t], best = t; /* NaN and -inf never win */
        }
        return best;
    }

    size_t k = sp->top_k >= 1 && sp->top_k < V ? (size_t)sp->top_k : 0;
    if (!k) { /* the whole vocabulary: weights in a flat array, no candidates */
        int32_t tok = sample_full(s, sp, lg, row->step);
        if (tok != -2) return tok;
    }

    /* Collect candidates: a k-heap when top_k limits, else every eligible
     * token (only rows with +inf values get here without top_k). */
    zi_cand *c = s->cand;
    size_t n = 0;
    for (int32_t t0 = 0; t0 < V; t0 += ZI_SAMPLER_BLOCK) {
        int32_t e = block_end(t0, V);
        /* a full heap only takes values above its root: skip whole blocks */
        if (k && n == k && !(block_max(lg, t0, e) > c[0].v)) continue;
        for (int32_t t = t0; t < e; t++)
            if (lg[t] > -INFINITY) offer(c, &n, k, lg[t], t);
    }
    if (n == 0) return -1;

    float vmax = -INFINITY;
    for (size_t i = 0; i < n; i++)
        if (c[i].v > vmax) vmax = c[i].v;
    double z = 0.0;
    if (isinf(vmax)) { /* +inf logits share the mass evenly (inf - inf would be NaN) */
        for (size_t i = 0; i < n; i++) z += c[i].w = c[i].v == vmax ? 1.0 : 0.0;
    } else {
        /* expf: float precision is ample for a draw and much cheaper over 49k */
        const double inv_t = 1.0 / T;
        for (size_t i = 0; i < n; i++) {
            double d = (double)c[i].v - vmax; /* d == 0 stays 1 even if inv_t is inf */
            z += c[i].w = d == 0.0 ? 1.0 : expf((float)(d * inv_t));
        }
    }

    if (sp->top_p < 1.0) n = top_p_cut(c, n, sp->top_p * z);

    if (sp->min_p > 0.0) {
        double wmax = 0.0;
        for (size_t i = 0; i < n; i++)
            if (c[i].w > wmax) wmax = c[i].w;
        double thr = (sp->min_p < 1.0 ? sp->min_p : 1.0) * wmax; /* the top always survives */
        size_t j = 0;
        for (size_t i = 0; i < n; i++)
            if (c[i].w >= thr) c[j++] = c[i];
        n = j;
    }

    double zs = 0.0;
    for (size_t i = 0; i < n; i++) zs += c[i].w;
    double target = zi_sampler_uniform(sp->seed, row->step) * zs, cum = 0.0;
    int32_t last = -1;
    for (size_t i = 0; i < n; i++) {
        if (c[i].w <= 0.0) continue;
        cum += c[i].w;
        last = c[i].id;
        if (cum > target) return c[i].id;
    }
    return last; /* rounding left target at the very top */
}

static int check_row(const zi_sampler *s, const zi_sampler_row *row, size_t r, zi_error *err) {
    if (!row->logits || !row->params)
        return zi_error_set(err, ZI_EINVAL, "sampler: row %zu: logits or params is NULL", r);
    int rc;
    if ((rc = check_ids(row->prompt_ids, row->n_prompt, s->n_vocab, r, "prompt_ids", err)) ||
        (rc = check_ids(row->generated_ids, row->n_generated, s->n_vocab, r, "generated_ids",
                        err)) ||
        (rc = check_ids(row->more_generated_ids, row->n_more_generated, s->n_vocab, r,
                        "more_generated_ids", err)) ||
        (rc = check_ids(row->eos_forbid, row->n_eos_forbid, s->n_vocab, r, "eos_forbid", err)))
        return rc;
    return ZI_OK;
}

int zi_sampler_processed_logits(zi_sampler *s, const zi_sampler_row *row, float *out,
                                zi_error *err) {
    if (!s || !row || !out)
        return zi_error_set(err, ZI_EINVAL, "sampler: NULL sampler, row or out");
    int rc = check_row(s, row, 0, err);
    if (rc) return rc;
    size_t nt = prepare_row(s, row);
    memcpy(out, nt > 0 || row->bitmask ? materialize(s, row, nt) : row->logits,
           (size_t)s->n_vocab * sizeof *out);
    return ZI_OK;
}

int zi_sampler_sample(zi_sampler *s, const zi_sampler_row *rows, size_t n_rows, int32_t *out_tokens,
                      zi_error *err) {
    if (!s || (n_rows && (!rows || !out_tokens)))
        return zi_error_set(err, ZI_EINVAL, "sampler: NULL sampler, rows or out_tokens");
    for (size_t r = 0; r < n_rows; r++) {
        int rc = check_row(s, &rows[r], r, err);
        if (rc) return rc;
    }
    int rc = ZI_OK;
    for (size_t r = 0; r < n_rows; r++) {
        out_tokens[r] = sample_row(s, &rows[r]);
        if (out_tokens[r] < 0 && rc == ZI_OK)
            rc = zi_error_set(err, ZI_ERANGE,
                              "sampler: row %zu: no eligible token (all logits -inf/NaN or masked)",
                              r);
    }
    return rc;
}

int zi_sampler_logprobs(const float *logits, int32_t n_vocab, int32_t token, int32_t top_n,
                        float *token_lp, int32_t *top_ids, float *top_lps, zi_error *err) {
    if (!logits || !token_lp || n_vocab < 1)
        return zi_error_set(err, ZI_EINVAL, "logprobs: NULL logits/token_lp or n_vocab < 1");
    if (token < 0 || token >= n_vocab)
        return zi_error_set(err, ZI_EINVAL, "logprobs: token %d outside [0, %d)", (int)token,
                            (int)n_vocab);
    if (top_n < 0 || top_n > n_vocab || (top_n > 0 && (!top_ids || !top_lps)))
        return zi_error_set(err, ZI_EINVAL, "logprobs: top_n %d outside [0, %d] or NULL outputs",
                            (int)top_n, (int)n_vocab);
    const float mx = block_max(logits, 0, n_vocab); /* NaN is skipped */
    if (!(mx > -INFINITY))
        return zi_error_set(err, ZI_EINVAL, "logprobs: every logit is -inf or NaN");
    double lse = 0.0, inf_lp = 0.0;
    if (isinf(mx)) {
        /* +inf present: those tokens share probability 1, the rest get -inf. */
        size_t ninf = 0;
        for (int32_t t = 0; t < n_vocab; t++) ninf += logits[t] == mx;
        inf_lp = -log((double)ninf);
    } else {
        /* exp_neg, which vectorises, in 8 float lanes per 64-token block and
         * the blocks' sums in double: a relative error near 1e-7 in z (a
         * libm exp per token cost 175 us a row of 49152, now 50 us). Terms
         * below e^-87 of the largest, under 1e-33 of the mass, count as 0. */
        double z = 0.0;
        for (int32_t t0 = 0; t0 < n_vocab; t0 += ZI_SAMPLER_BLOCK) {
            const int32_t e = block_end(t0, n_vocab);
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int32_t t = t0;
            for (; t + 8 <= e; t += 8)
                for (int j = 0; j < 8; j++) acc[j] += exp_weight(logits[t + j] - mx);
            for (; t < e; t++) acc[0] += exp_weight(logits[t] - mx);
            for (int j = 0; j < 8; j++) z += acc[j];
        }
        lse = mx + log(z);
    }
#define LOGP(x)                                                                                    \
    (isinf(mx) ? ((x) == mx ? inf_lp : -INFINITY) : ((x) > -INFINITY ? (double)(x)-lse : -INFINITY))
    *token_lp = (float)LOGP(logits[token]);
    if (top_n > 0) {
        /* Insertion into a sorted top_n list; most tokens fail the first
         * test, and once the list is full, whole blocks whose maximum
         * cannot enter it are skipped. */
        int32_t have = 0;
        for (int32_t t0 = 0; t0 < n_vocab; t0 += ZI_SAMPLER_BLOCK) {
            const int32_t e = block_end(t0, n_vocab);
            if (have == top_n && !(block_max(logits, t0, e) > top_lps[have - 1])) continue;
            for (int32_t t = t0; t < e; t++) {
                float v = logits[t];
                if (v != v) v = -INFINITY; /* NaN ranks as -inf */
                if (have == top_n && !(v > top_lps[have - 1])) continue;
                int32_t i = have < top_n ? have++ : top_n - 1;
                while (i > 0 && v > top_lps[i - 1]) {
                    top_lps[i] = top_lps[i - 1];
                    top_ids[i] = top_ids[i - 1];
                    i--;
                }
                top_lps[i] = v;
                top_ids[i] = t;
            }
        }
        for (int32_t i = 0; i < top_n; i++) top_lps[i] = (float)LOGP(top_lps[i]);
    }
#undef LOGP
    return ZI_OK;
}
