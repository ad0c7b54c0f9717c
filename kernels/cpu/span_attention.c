/*
 * span_attention.c - see span_attention.h.
 */
#include "span_attention.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>

typedef struct span_args {
    float *out;
    const float *q, *k, *v;
    const int32_t *order, *starts;
    int n_spans;
    const zi_attn_shape *s;
} span_args;

/* The span holding index i of order: the last r with starts[r] <= i. */
static int span_of(const int32_t *starts, int n_spans, int64_t i) {
    int lo = 0, hi = n_spans - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (starts[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* One query head of one row over its span, with an online softmax (one
 * pass, no score buffer): the running maximum m, the sum l of exp(s - m)
 * and acc = sum exp(s - m) v, rescaled when m grows. */
static void attend_one(const span_args *a, int64_t i, int h) {
    const zi_attn_shape *s = a->s;
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const size_t qstride = (size_t)s->n_heads * hd, kvstride = (size_t)s->n_kv_heads * hd;
    const int r = span_of(a->starts, a->n_spans, i);
    const size_t t = (size_t)a->order[i];
    const float *qh = a->q + t * qstride + (size_t)h * hd;
    const size_t kvoff = (size_t)(h / group) * hd;
    const double scale = s->scale;
    double acc[ZI_SPAN_ATTN_MAX_HEAD_DIM];
    double m = -INFINITY, l = 0.0;
    for (int d = 0; d < hd; d++) acc[d] = 0.0;
    const int32_t end = s->causal ? (int32_t)i + 1 : a->starts[r + 1];
    for (int32_t j = a->starts[r]; j < end; j++) {
        const size_t u = (size_t)a->order[j];
        const float *kh = a->k + u * kvstride + kvoff, *vh = a->v + u * kvstride + kvoff;
        /* Four partial sums: independent chains (the latency of one would
         * bound the loop), in a fixed order whatever the batch. */
        double d4[4] = {0.0, 0.0, 0.0, 0.0};
        int d = 0;
        for (; d + 4 <= hd; d += 4)
            for (int e = 0; e < 4; e++) d4[e] += (double)qh[d + e] * (double)kh[d + e];
        for (; d < hd; d++) d4[0] += (double)qh[d] * (double)kh[d];
        double sc = ((d4[0] + d4[1]) + (d4[2] + d4[3])) * scale, p;
        if (sc > m) { /* the new maximum: earlier terms shrink by exp(m - sc) */
            double c = exp(m - sc);
            l *= c;
            for (int d = 0; d < hd; d++) acc[d] *= c;
            m = sc;
            p = 1.0;
        } else {
            p = exp(sc - m);
        }
        l += p;
        for (int d = 0; d < hd; d++) acc[d] += p * (double)vh[d];
    }
    float *oh = a->out + t * qstride + (size_t)h * hd;
    for (int d = 0; d < hd; d++) oh[d] = (float)(acc[d] / l);
}

/* Tasks (index of order, head) in nth nearly equal contiguous ranges. */
static void span_worker(void *p, int ith, int nth) {
    const span_args *a = p;
    const int H = a->s->n_heads;
    const int64_t total = (int64_t)a->starts[a->n_spans] * H;
    const int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
    for (int64_t task = lo; task < hi; task++) attend_one(a, task / H, (int)(task % H));
}

void zi_cpu_span_attention(zi_pool *pool, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts, int n_spans,
                           const zi_attn_shape *s) {
    assert(s->head_dim > 0 && s->head_dim <= ZI_SPAN_ATTN_MAX_HEAD_DIM);
    assert(s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0);
    assert(s->window == 0 && s->softcap == 0.0f);
    assert(n_spans >= 0 && (n_spans == 0 || starts[0] == 0));
    for (int r = 0; r < n_spans; r++) assert(starts[r] < starts[r + 1]); /* no empty span */
    if (n_spans == 0) return;
    span_args a = {out, q, k, v, order, starts, n_spans, s};
    if ((int64_t)starts[n_spans] * s->n_heads == 1)
        span_worker(&a, 0, 1);
    else
        zi_pool_run(pool, span_worker, &a);
}
