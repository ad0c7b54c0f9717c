/*
 * span_attention.c - see span_attention.h.
 */
#include "span_attention.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct span_args {
    float *out;
    const float *q, *k, *v;
    /* K and V row u of kv head g start at k + g * head_stride + u *
     * row_stride (the caller's interleaved rows, or a copy with each head's
     * rows together) */
    size_t row_stride, head_stride;
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
/* Keys per chunk of scores: the softmax's running maximum is updated once
 * a chunk, the chunk's scores kept on the stack. */
#define SPAN_CHUNK 256

/* Row i's head h over its span (or, causal, the span up to itself): the
 * scores of a chunk of keys (double dot products, eight partial sums side
 * by side, added in a fixed tree), their exponentials against the running
 * maximum, and the weighted sum of V in double; the earlier chunks'
 * terms shrink by exp(old max - new max) when a chunk raises it. Every
 * step is in a fixed order that depends on the span alone, never on the
 * thread or the other rows. Compiled for AVX-512 and AVX2 too (the loops
 * over 8 lanes and over head_dim are vector code there). */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void
attend_one(const span_args *a, int64_t i, int h) {
    const zi_attn_shape *s = a->s;
    const int hd = s->head_dim, group = s->n_heads / s->n_kv_heads;
    const size_t qstride = (size_t)s->n_heads * hd, kvstride = a->row_stride;
    const int r = span_of(a->starts, a->n_spans, i);
    const size_t t = (size_t)a->order[i];
    const float *qh = a->q + t * qstride + (size_t)h * hd;
    const size_t kvoff = (size_t)(h / group) * a->head_stride;
    const double scale = s->scale;
    double acc[ZI_SPAN_ATTN_MAX_HEAD_DIM], qd[ZI_SPAN_ATTN_MAX_HEAD_DIM], sc[SPAN_CHUNK];
    double m = -INFINITY, l = 0.0;
    for (int d = 0; d < hd; d++) acc[d] = 0.0, qd[d] = (double)qh[d];
    const int hd8 = hd / 8 * 8;
    const int32_t end = s->causal ? (int32_t)i + 1 : a->starts[r + 1];
    for (int32_t j0 = a->starts[r]; j0 < end; j0 += SPAN_CHUNK) {
        const int n = end - j0 < SPAN_CHUNK ? (int)(end - j0) : SPAN_CHUNK;
        double cm = -INFINITY;
        for (int jj = 0; jj < n; jj++) {
            const float *kh = a->k + (size_t)a->order[j0 + jj] * kvstride + kvoff;
            double p8[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
            for (int d = 0; d < hd8; d += 8)
                for (int e = 0; e < 8; e++) p8[e] += qd[d + e] * (double)kh[d + e];
            for (int d = hd8; d < hd; d++) p8[d - hd8] += qd[d] * (double)kh[d];
            const double x = (((p8[0] + p8[1]) + (p8[2] + p8[3])) +
                              ((p8[4] + p8[5]) + (p8[6] + p8[7]))) *
                             scale;
            sc[jj] = x;
            cm = x > cm ? x : cm;
        }
        if (cm > m) { /* the new maximum: earlier terms shrink by exp(m - cm) */
            const double c = exp(m - cm);
            l *= c;
            for (int d = 0; d < hd; d++) acc[d] *= c;
            m = cm;
        }
        for (int jj = 0; jj < n; jj++) {
            const float *vh = a->v + (size_t)a->order[j0 + jj] * kvstride + kvoff;
            const double p = exp(sc[jj] - m);
            l += p;
            for (int d = 0; d < hd; d++) acc[d] += p * (double)vh[d];
        }
    }
    float *oh = a->out + t * qstride + (size_t)h * hd;
    for (int d = 0; d < hd; d++) oh[d] = (float)(acc[d] / l);
}

static void span_worker(void *p, int ith, int nth) {
    const span_args *a = p;
    const int H = a->s->n_heads;
    const int64_t total = (int64_t)a->starts[a->n_spans] * H;
    const int64_t lo = total * ith / nth, hi = total * (ith + 1) / nth;
    /* Head-major: consecutive rows of one head read the same K/V columns,
     * which stay in cache (row-major cycled through every head's, all of
     * K and V: an image tower's 1024 rows x 768 went from memory). */
    const int64_t rows = a->starts[a->n_spans];
    for (int64_t task = lo; task < hi; task++) attend_one(a, task % rows, (int)(task / rows));
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
    const size_t rows = (size_t)starts[n_spans], hd = (size_t)s->head_dim;
    const size_t kvdim = (size_t)s->n_kv_heads * hd;
    span_args a = {out, q, k, v, kvdim, hd, order, starts, n_spans, s};
    /* Each head's K and V rows together, when there are many: rows
     * n_kv_heads * head_dim apart put a head's columns of a long span in
     * few cache sets (an image tower's 1024 x 768: a head's K and V filled
     * every way of a quarter of L2's sets and were read from memory). */
    float *kc = NULL, *vc = NULL;
    if (rows >= 64 && s->n_kv_heads > 1) {
        kc = malloc(rows * kvdim * sizeof(float));
        vc = malloc(rows * kvdim * sizeof(float));
    }
    if (kc && vc) {
        for (size_t u = 0; u < rows; u++)
            for (size_t g = 0; g < (size_t)s->n_kv_heads; g++) {
                memcpy(kc + (g * rows + u) * hd, k + u * kvdim + g * hd, hd * sizeof(float));
                memcpy(vc + (g * rows + u) * hd, v + u * kvdim + g * hd, hd * sizeof(float));
            }
        a.k = kc, a.v = vc, a.row_stride = hd, a.head_stride = rows * hd;
    }
    if ((int64_t)rows * s->n_heads == 1)
        span_worker(&a, 0, 1);
    else
        zi_pool_run(pool, span_worker, &a);
    free(kc);
    free(vc);
}
