/*
 * cpu_backend.c - see cpu_backend.h.
 *
 * Each parallel op packs its arguments into a small struct and hands a
 * worker function to the pool; the worker computes its own share from
 * (ith, nth). Element-wise ops, attention and activation quantization on
 * tiny inputs (a single decode token) run on the calling thread, since
 * waking the pool would cost more than the work; matrix products always
 * use the pool.
 */
#include "cpu_backend.h"

#include <assert.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_kernels.h"
#include "quant.h"
#include "repack.h"
#include "repack_x.h"
#include "span_attention.h"
#include "cpu_audio.h"
#include "threadpool.h"
#include "tile_mm.h"
#include "weights.h"

typedef struct cpu_backend {
    zi_backend base;
    const zi_cpu_kernels *k;
    zi_pool *pool;
    zi_tile_ctx *tile; /* matmul_tile's and tile_precision attention's scratch */
    zi_q8_act act; /* quantized activations for the current matmul */
    float *act_s16; /* act.s16's room, lent to act when a product needs it */
    size_t act_cap; /* blocks */
    float *scratch; /* attention scores: ZI_ATTN_ROWS ctx-sized rows per thread */
    size_t scratch_per_thread;
    /* The batch's blocks of tokens for attention (cpu_attention): block i
     * is tokens attn_blocks[i] .. attn_blocks[i + 1] - 1; room for
     * attn_blocks_cap + 1 entries. */
    int32_t *attn_blocks;
    int attn_blocks_cap;
    /* cos and sin of the last rope calls' angles (n tokens at pos), for two
     * bases: the two calls of every layer in a forward pass have the same
     * ones, and a model with local and global layers (gemma3) alternates
     * between two bases. */
    struct rope_cache {
        float *cs;
        int32_t *pos;
        int cap, n, dim;
        int pos_cap; /* entries of pos (cap counts cs's floats) */
        zi_rope_freqs rf; /* the angles' parameters; factors: fac or NULL */
        /* A copy of the factors: compared by value, as a later model's
         * vector may reuse a freed one's address. rope_dim <= 1024. */
        float fac[512];
        unsigned long long used; /* when last used (rope_clock) */
    } rope[2];
    unsigned long long rope_clock;
    struct zi_counter *mm_next; /* per thread: the next chunk of its slice (mm_worker) */
    /* Per thread, one weight row dequantized to float32 for the products of
     * types without a fast kernel (mm_rows_dequant): deq_stride floats each,
     * sized by weight_init for the longest such row. */
    float *deq_rows;
    int64_t deq_stride;
} cpu_backend;

static cpu_backend *cb(zi_backend *be) { return (cpu_backend *)be; }

/* A counter on its own cache line. */
typedef struct zi_counter {
    _Alignas(64) atomic_llong v;
} zi_counter;

/* Query heads per kernel call in grouped-query attention (the kernel's
 * limit is 64; 8 covers common models in one call). */
#define ZI_ATTN_GROUP_MAX 8
/* Query rows (heads x tokens) of one attend_block call: consecutive tokens
 * of a prompt attend together, reading each cached K and V row once for
 * all of them; each row needs a ctx-sized row of scores in the scratch. */
#define ZI_ATTN_ROWS 32

/* Splits [0, n) into nth nearly equal ranges, each a multiple of `align`. */
static void split_range(int64_t n, int ith, int nth, int64_t align, int64_t *lo, int64_t *hi) {
    int64_t chunks = (n + align - 1) / align;
    int64_t per = chunks / nth, rem = chunks % nth;
    int64_t c0 = ith * per + (ith < rem ? ith : rem);
    int64_t c1 = c0 + per + (ith < rem ? 1 : 0);
    *lo = c0 * align < n ? c0 * align : n;
    *hi = c1 * align < n ? c1 * align : n;
}

/* ---- weights ---- */

/* Types with their own matrix-product kernels (the table's mm_*); every
 * other type the reader accepts goes through mm_rows_dequant. */
static int has_fast_kernel(int type) {
    switch (type) {
    case ZI_TYPE_Q4_0:
    case ZI_TYPE_Q4_1:
    case ZI_TYPE_Q8_0:
    case ZI_TYPE_F32:
    case ZI_TYPE_F16:
    case ZI_TYPE_BF16:
        return 1;
    default:
        return 0;
    }
}

/* Bytes of one row of w as the kernels read it: the file's, or in the
 * extended layout (layout 2) a sixteenth of a group of 16 rows. */
static size_t layout_row_bytes(const zi_weight *w) {
    return w->layout == 2 ? zi_r16x_row_bytes(w->type, w->cols / ZI_QK) : w->row_bytes;
}

/* One thread's share of a weight's repacking: whole groups of 16 rows. */
typedef struct repack_args {
    const zi_weight *w;
    const uint8_t *src;
    uint8_t *dst;
    int layout;
} repack_args;

static void repack_worker(void *p, int ith, int nth) {
    const repack_args *a = p;
    const zi_weight *w = a->w;
    const int64_t nb = w->cols / ZI_QK;
    int64_t lo, hi;
    split_range(w->rows, ith, nth, ZI_R16, &lo, &hi);
    if (lo >= hi) return;
    const uint8_t *src = a->src + (size_t)lo * w->row_bytes;
    if (a->layout == 1)
        zi_r16_repack(w->type, src, a->dst + (size_t)lo * w->row_bytes, hi - lo, nb, w->row_bytes);
    else
        zi_r16x_repack(w->type, src, a->dst + (size_t)lo * zi_r16x_row_bytes(w->type, nb), hi - lo,
                       nb, w->row_bytes);
}

/* The layout the backend keeps a rows x cols matrix of `type` in: 0 the
 * file's, 1 the 16-row layout (repack.h), 2 the extended one (repack_x.h).
 * Quantized matrices with a multiple of 16 rows are repacked, a copy made
 * once at load (the model then lets the file's pages go:
 * zi_gguf_drop_pages): Q4_0, Q4_1 and Q8_0 into the 16-row layout (same
 * size), the other quantized types into its extended layout (a little
 * larger than the file), where the table has 16-row kernels. */
static int weight_layout(const cpu_backend *c, int type, int64_t rows, int64_t cols) {
    if (!c->k->mm_r16 || rows % ZI_R16 || cols % ZI_QK) return 0;
    return zi_r16_group_bytes(type) ? 1 : zi_r16x_row_bytes(type, cols / ZI_QK) ? 2 : 0;
}

/* Bytes of the matrix in `layout`; file_bytes in the file's. */
static uint64_t layout_bytes(int layout, int type, int64_t rows, int64_t cols,
                             uint64_t file_bytes) {
    return layout == 2 ? (uint64_t)zi_r16x_row_bytes(type, cols / ZI_QK) * (uint64_t)rows
                       : file_bytes;
}

uint64_t zi_cpu_backend_held_bytes(const zi_backend *be, int type, int64_t rows, int64_t cols,
                                   uint64_t file_bytes) {
    const cpu_backend *c = (const cpu_backend *)be;
    return layout_bytes(weight_layout(c, type, rows, cols), type, rows, cols, file_bytes);
}

/* Memory for a repacked weight: 64-byte aligned, and a large one in
 * transparent huge pages (2 MiB aligned, MADV_HUGEPAGE), so that a decode
 * step, which streams every weight once, is not slowed by TLB misses and
 * by prefetchers that stop at each 4 KiB page (a kernel whose
 * transparent_hugepage "defrag" is "madvise" only compacts memory for
 * regions that ask). NULL when out of memory. */
static void *alloc_weight(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes >= huge) {
        if (posix_memalign(&p, huge, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: without it, 4 KiB pages */
#endif
        return p;
    }
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

static int cpu_weight_init(zi_backend *be, zi_weight *w, const zi_gguf_tensor *t, zi_error *err) {
    cpu_backend *c = cb(be);
    int rc = zi_weight_describe(t, w, err);
    if (rc) return rc;
    const int layout = weight_layout(c, w->type, w->rows, w->cols);
    if (layout) {
        size_t bytes = (size_t)layout_bytes(layout, w->type, w->rows, w->cols,
                                            (uint64_t)w->row_bytes * (uint64_t)w->rows);
        void *dst = alloc_weight(bytes);
        if (!dst)
            return zi_error_set(err, ZI_ENOMEM, "out of memory repacking tensor '%.*s'",
                                (int)t->name.len, t->name.ptr);
        /* On every thread: the extended layout's decomposition is the bulk
         * of a large file's load time (1B Q4_K_M: 6 s on one core). */
        repack_args ra = {.w = w, .src = t->data, .dst = dst, .layout = layout};
        zi_pool_run(c->pool, repack_worker, &ra);
        w->owned = dst;
        w->data = dst;
        w->data_bytes = bytes;
        w->layout = layout;
        return ZI_OK;
    }
    if (!has_fast_kernel(w->type) && w->cols > c->deq_stride) {
        /* Grown here, at load, so that products never allocate; rows 64
         * bytes apart so that no two threads write one cache line. */
        int64_t stride = (w->cols + 15) / 16 * 16;
        size_t bytes = (size_t)stride * (size_t)zi_pool_size(c->pool) * sizeof(float);
        void *rows = NULL;
        if (posix_memalign(&rows, 64, bytes) != 0)
            return zi_error_set(err, ZI_ENOMEM,
                                "out of memory for dequantizing rows of tensor '%.*s'",
                                (int)t->name.len, t->name.ptr);
        free(c->deq_rows);
        c->deq_rows = rows;
        c->deq_stride = stride;
    }
    return ZI_OK;
}

static void cpu_weight_free(zi_backend *be, zi_weight *w) {
    (void)be;
    free(w->owned);
    w->owned = NULL;
    zi_tile_b_free(w->aux); /* matmul_tile's pack (tile_mm.h), if any */
    w->aux = NULL;
}

static int cpu_weight_view(zi_backend *be, const zi_weight *w, int64_t r0, int64_t n,
                           zi_weight *out, zi_error *err) {
    (void)be;
    if (r0 < 0 || n < 1 || r0 + n > w->rows || (w->layout && (r0 % ZI_R16 || n % ZI_R16)))
        return zi_error_set(err, ZI_EINVAL,
                            "rows %lld..%lld of a %lld-row weight (layout %d) are not a view",
                            (long long)r0, (long long)(r0 + n), (long long)w->rows, w->layout);
    const size_t rb = layout_row_bytes(w); /* 16-row groups are contiguous: a row's share */
    *out = *w;
    out->rows = n;
    out->data = (const uint8_t *)w->data + (size_t)r0 * rb;
    out->data_bytes = (size_t)n * rb;
    out->file_data = w->file_data ? (const uint8_t *)w->file_data + (size_t)r0 * w->row_bytes
                                  : NULL;
    out->owned = NULL;
    out->aux = NULL;
    return ZI_OK;
}

static float *cpu_vector_init(zi_backend *be, const zi_gguf_tensor *t, zi_error *err) {
    (void)be;
    return zi_vector_dequantize(t, err); /* freed by the backend's free (= free) */
}

/* ---- memory ---- */

static int cpu_reserve(zi_backend *be, int n_tokens, int64_t max_cols, int ctx, zi_error *err) {
    cpu_backend *c = cb(be);
    size_t need = (size_t)n_tokens * (size_t)((max_cols + ZI_QK - 1) / ZI_QK);
    if (need > c->act_cap) {
        /* 64 bytes of slack, defensively: SIMD loads are 32/64 bytes wide. */
        int8_t *q = realloc(c->act.q, need * 2 * ZI_QK + 64);
        if (q) c->act.q = q;
        float *d = realloc(c->act.d, need * sizeof(float));
        if (d) c->act.d = d;
        float *s = realloc(c->act.s, need * sizeof(float));
        if (s) c->act.s = s;
        float *s16 = realloc(c->act_s16, need * 2 * sizeof(float));
        if (s16) c->act_s16 = s16;
        if (!q || !d || !s || !s16)
            return zi_error_set(err, ZI_ENOMEM, "out of memory for the activations of %d tokens",
                                n_tokens);
        c->act_cap = need;
    }
    if (n_tokens > c->attn_blocks_cap) {
        int32_t *ab = realloc(c->attn_blocks, ((size_t)n_tokens + 1) * sizeof *ab);
        if (!ab)
            return zi_error_set(err, ZI_ENOMEM, "out of memory for the attention of %d tokens",
                                n_tokens);
        c->attn_blocks = ab;
        c->attn_blocks_cap = n_tokens;
    }
    /* Scores for up to ZI_ATTN_ROWS query rows at a time. */
    size_t per_thread = (size_t)ctx * ZI_ATTN_ROWS;
    if (per_thread > c->scratch_per_thread) {
        float *ns = realloc(c->scratch, per_thread * (size_t)zi_pool_size(c->pool) * sizeof(float));
        if (!ns)
            return zi_error_set(err, ZI_ENOMEM, "out of memory for attention over %d positions",
                                ctx);
        c->scratch = ns;
        c->scratch_per_thread = per_thread;
    }
    return ZI_OK;
}

static void *cpu_alloc(zi_backend *be, size_t bytes) {
    (void)be;
    return calloc(1, bytes ? bytes : 1);
}
static void cpu_free(zi_backend *be, void *p) {
    (void)be;
    free(p);
}
static void cpu_copy(zi_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    memcpy(dst, src, bytes);
}
static int cpu_sync(zi_backend *be, zi_error *err) {
    (void)be;
    (void)err;
    return ZI_OK; /* the ops ran to the end, and cannot fail */
}

/* ---- matmul ---- */

typedef struct mm_args {
    const zi_cpu_kernels *k;
    int n;                      /* products sharing the input */
    float *const *ys;
    const zi_weight *const *ws;
    const float *x;
    const zi_q8_act *q;
    int n_tokens;
    /* Per thread, a row for mm_rows_dequant: deq_stride floats apart. */
    float *deq_rows;
    int64_t deq_stride;
    int64_t total_rows;         /* sum of the products' rows */
    int64_t chunk;              /* rows per chunk (batches); 0: one slice per thread */
    zi_counter *next;           /* per thread: its next chunk (batches) */
    /* matmul_groups: product i reads rows first[i] .. first[i] + count[i]
     * - 1 of x (and of q) as its tokens; NULL: every product reads x */
    const int32_t *first, *count;
} mm_args;

/* Rows [r0, r1) of a product whose weight type has no kernel of its own
 * (the K-quants, Q5_0, Q5_1, IQ4_NL, IQ4_XS) where it is not repacked (the
 * scalar table, or a row count not a multiple of 16): each row is dequantized
 * exactly (dequant.h) into this thread's scratch row, then multiplied with
 * the float32 activations by the table's mm_f32, so every kernel table
 * serves these types. Correct, but it dequantizes every row again for every
 * pass: the memory traffic is the quantized row's, the arithmetic is not. */
static void mm_rows_dequant(const mm_args *a, const zi_weight *w, float *y, int64_t r0, int64_t r1,
                            int ith) {
    assert(a->deq_rows && w->cols <= a->deq_stride);
    float *row = a->deq_rows + (size_t)ith * (size_t)a->deq_stride;
    const uint8_t *wd = w->data;
    for (int64_t r = r0; r < r1; r++) {
        zi_dequantize_row(w->type, wd + (size_t)r * w->row_bytes, row, w->cols);
        a->k->mm_f32((const uint8_t *)row, 0, 0, 1, a->x, w->cols, a->n_tokens, y + r, w->rows);
    }
}

/* Rows [r0, r1) of one product, on thread ith. */
static void mm_rows(const mm_args *a, const zi_weight *w, float *y, int64_t r0, int64_t r1,
                    int ith) {
    const uint8_t *wd = w->data;
    if (w->layout) {
        a->k->mm_r16(w->type, wd, layout_row_bytes(w), r0, r1, a->q, a->n_tokens, y, w->rows);
        return;
    }
    switch (w->type) {
    case ZI_TYPE_Q4_0: a->k->mm_q4_0(wd, w->row_bytes, r0, r1, a->q, a->n_tokens, y, w->rows); break;
    case ZI_TYPE_Q4_1: a->k->mm_q4_1(wd, w->row_bytes, r0, r1, a->q, a->n_tokens, y, w->rows); break;
    case ZI_TYPE_Q8_0: a->k->mm_q8_0(wd, w->row_bytes, r0, r1, a->q, a->n_tokens, y, w->rows); break;
    case ZI_TYPE_F32:
        a->k->mm_f32(wd, w->row_bytes, r0, r1, a->x, w->cols, a->n_tokens, y, w->rows);
        break;
    case ZI_TYPE_F16:
        a->k->mm_f16(wd, w->row_bytes, r0, r1, a->x, w->cols, a->n_tokens, y, w->rows);
        break;
    case ZI_TYPE_BF16:
        a->k->mm_bf16(wd, w->row_bytes, r0, r1, a->x, w->cols, a->n_tokens, y, w->rows);
        break;
    default:
        mm_rows_dequant(a, w, y, r0, r1, ith);
        break;
    }
}

/* Rows [lo, hi) of the products laid end to end, on thread ith. */
static void mm_span(const mm_args *a, int64_t lo, int64_t hi, int ith) {
    int64_t base = 0;
    for (int i = 0; i < a->n && lo < hi; i++) {
        int64_t rows = a->ws[i]->rows;
        int64_t r0 = lo - base, r1 = hi - base;
        if (r0 < rows && r1 > 0 && a->first) { /* its own rows of x and q */
            mm_args b = *a;
            zi_q8_act qi;
            const int64_t cols = a->ws[i]->cols, nb = cols / ZI_QK;
            const size_t t0 = (size_t)a->first[i];
            b.x = a->x + t0 * (size_t)cols;
            b.n_tokens = a->count[i];
            if (a->q) {
                qi = *a->q;
                qi.q += t0 * (size_t)nb * 2 * ZI_QK;
                qi.d += t0 * (size_t)nb;
                qi.s += t0 * (size_t)nb;
                if (qi.s16) qi.s16 += t0 * (size_t)nb * 2;
                b.q = &qi;
            }
            mm_rows(&b, a->ws[i], a->ys[i], r0 < 0 ? 0 : r0, r1 > rows ? rows : r1, ith);
        } else if (r0 < rows && r1 > 0) {
            mm_rows(a, a->ws[i], a->ys[i], r0 < 0 ? 0 : r0, r1 > rows ? rows : r1, ith);
        }
        base += rows;
    }
}

/* The row (of the products laid end to end, a multiple of 16) where the
 * first `part` of `whole` shares of the products' bytes end. */
static int64_t row_at_bytes(const mm_args *a, int part, int whole) {
    uint64_t total = 0;
    for (int i = 0; i < a->n; i++)
        total += (uint64_t)a->ws[i]->rows * layout_row_bytes(a->ws[i]);
    uint64_t want = total / (uint64_t)whole * (uint64_t)part +
                    total % (uint64_t)whole * (uint64_t)part / (uint64_t)whole;
    int64_t base = 0;
    for (int i = 0; i < a->n; i++) {
        const uint64_t rb = layout_row_bytes(a->ws[i]), bytes = (uint64_t)a->ws[i]->rows * rb;
        if (want < bytes || i == a->n - 1) {
            int64_t r = (int64_t)((want + rb / 2) / rb);
            r = (r + 8) / 16 * 16;
            return base + (r < a->ws[i]->rows ? r : a->ws[i]->rows);
        }
        want -= bytes;
        base += a->ws[i]->rows;
    }
    return base;
}

/* One token's slices: equal bytes, not rows, for each thread, since its
 * products stream their weights once and the types in one job differ (a
 * Q6_K V beside Q4_K Q and K: 0.82 against 0.56 bytes a weight), so
 * equal rows left one thread waiting for the other. */
static void split_bytes(const mm_args *a, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = ith == 0 ? 0 : row_at_bytes(a, ith, nth);
    *hi = ith == nth - 1 ? a->total_rows : row_at_bytes(a, ith + 1, nth);
}

/* Each thread takes one slice of the rows. For batches the slice is cut in
 * chunks that its thread takes in order from its counter, and a thread done
 * with its own then takes the other slices' remaining chunks: one that runs
 * late (the cores are shared with other programs, or its rows come slower
 * from memory) then does less, instead of the other waiting for it, while
 * each thread still streams one run of weights (interleaved chunks cost 5%
 * on 16 sequences). Which thread computes a row never changes its result.
 * One token's products are too short for the counters to pay. */
static void mm_worker(void *p, int ith, int nth) {
    mm_args *a = p;
    if (!a->chunk) {
        int64_t lo, hi;
        split_bytes(a, ith, nth, &lo, &hi);
        mm_span(a, lo, hi, ith);
        return;
    }
    const int64_t chunks = (a->total_rows + a->chunk - 1) / a->chunk;
    for (int j = 0; j < nth; j++) {
        int owner = (ith + j) % nth;
        int64_t c0, c1;
        split_range(chunks, owner, nth, 1, &c0, &c1);
        for (int64_t c; (c = c0 + atomic_fetch_add_explicit(&a->next[owner].v, 1,
                                                            memory_order_relaxed)) < c1;) {
            int64_t lo = c * a->chunk;
            mm_span(a, lo, lo + a->chunk < a->total_rows ? lo + a->chunk : a->total_rows, ith);
        }
    }
}

typedef struct quant_args {
    const zi_cpu_kernels *k;
    const float *x;
    const zi_q8_act *q;
    int n_tokens;
    int64_t cols;
} quant_args;

static void quant_worker(void *p, int ith, int nth) {
    quant_args *a = p;
    int64_t t0, t1;
    split_range(a->n_tokens, ith, nth, 1, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        a->k->quantize_act(a->x + t * a->cols, a->q, t);
        if (a->q->no_residual) zi_act_drop_residual(a->q, t);
        if (a->q->s16) zi_act_half_sums(a->q, t);
    }
}

static int is_quantized(int type) {
    return type == ZI_TYPE_Q4_0 || type == ZI_TYPE_Q4_1 || type == ZI_TYPE_Q8_0;
}

/* matmul_n (first NULL: every product reads x's n_tokens rows), and
 * matmul_groups (x's n_tokens rows, each a token of its own, product i
 * reading count[i] of them from first[i]): one quantization of x, one
 * job. */
static void matmul_job(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                       const float *x, int n_tokens, const int32_t *first,
                       const int32_t *count) {
    cpu_backend *c = cb(be);
    mm_args a = {.k = c->k,
                 .n = n,
                 .ys = ys,
                 .ws = ws,
                 .x = x,
                 .n_tokens = n_tokens,
                 .deq_rows = c->deq_rows,
                 .deq_stride = c->deq_stride,
                 .first = first,
                 .count = count};
    int most = n_tokens; /* the most tokens any product has */
    if (first) {
        most = 0;
        for (int i = 0; i < n; i++) most = count[i] > most ? count[i] : most;
    }
    int any_quant = 0, half_sums = 0;
    for (int i = 0; i < n; i++) {
        a.total_rows += ws[i]->rows;
        any_quant |= is_quantized(ws[i]->type) || ws[i]->layout;
        zi_r16x_format f;
        half_sums |= ws[i]->layout && zi_r16x_format_of(ws[i]->type, &f) && f.halves;
    }
    /* The per-half sums, only for the types with 16-value scales. */
    c->act.s16 = half_sums ? c->act_s16 : NULL;
    if (any_quant) { /* one quantization of x serves every product */
        /* reserve() sized act for this product (the model's contract). */
        c->act.nb = ws[0]->cols / ZI_QK;
        quant_args qa = {
            .k = c->k, .x = x, .q = &c->act, .n_tokens = n_tokens, .cols = ws[0]->cols};
        if (n_tokens >= 4)
            zi_pool_run(c->pool, quant_worker, &qa);
        else
            quant_worker(&qa, 0, 1);
        a.q = &c->act;
    }
    int nth = zi_pool_size(c->pool);
    if (most >= 4 && nth > 1) { /* about 8 chunks per thread, whole 16-row groups */
        int64_t per = (a.total_rows / 16) / (8 * (int64_t)nth);
        a.chunk = 16 * (per > 0 ? per : 1);
        a.next = c->mm_next;
        for (int i = 0; i < nth; i++) atomic_store_explicit(&c->mm_next[i].v, 0, memory_order_relaxed);
    }
    zi_pool_run(c->pool, mm_worker, &a);
}

static void cpu_matmul_n(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                         const float *x, int n_tokens) {
    matmul_job(be, n, ys, ws, x, n_tokens, NULL, NULL);
}

static void cpu_matmul_groups(zi_backend *be, int n, float *const *ys,
                              const zi_weight *const *ws, const float *x, int n_rows,
                              const int32_t *first, const int32_t *count) {
    matmul_job(be, n, ys, ws, x, n_rows, first, count);
}

static void cpu_matmul(zi_backend *be, float *y, const zi_weight *w, const float *x, int n_tokens) {
    cpu_matmul_n(be, 1, &y, &w, x, n_tokens);
}

/* ---- element-wise ---- */

static void cpu_get_rows(zi_backend *be, float *y, const zi_weight *table, const int32_t *ids,
                         int n) {
    (void)be;
    const uint8_t *d = table->file_data;
    for (int i = 0; i < n; i++)
        zi_dequantize_row(table->type, d + (size_t)ids[i] * table->row_bytes, y + (size_t)i * table->cols,
                          table->cols);
}

/* Element-wise ops share one parallel job: each thread takes a slice of
 * the tokens (or elements) when the batch is big enough to split. */
enum {
    EW_RMSNORM,
    EW_ROPE,
    EW_SWIGLU,
    EW_GEGLU,
    EW_ADD,
    EW_SCALE,
    EW_SOFTCAP,
    EW_BIAS,
    EW_LAYERNORM,
    EW_GELU,
    EW_GATHER,
    EW_WSUM,
    EW_SWIGLU_OAI,
    EW_MUL,
    EW_CONV,
    EW_SILU,
    EW_SIGMUL,
    EW_DELTA,
    EW_SSM,
    EW_GNORM
};

typedef struct ew_args {
    int op;
    const zi_cpu_kernels *k;
    float *y;
    const float *x, *w; /* rmsnorm: x, w; swiglu, geglu: x = gate, w = up; add: x */
    const float *b;     /* layernorm: the bias */
    const int32_t *pos; /* rope: positions; gather, weighted sum: row indices */
    const float *cs; /* rope: cos, sin per token and pair, or NULL */
    const zi_rope_freqs *rf; /* rope: the angles (when cs is NULL) */
    int64_t n; /* tokens (rmsnorm, rope), rows (gather, weighted sum) or elements */
    int dim, n_heads, head_dim, rope_dim;
    int k_rows; /* weighted sum: rows summed into each output row */
    int neox;        /* rope: pairs (i, i + rope_dim/2) instead of (2i, 2i+1) */
    float eps, base; /* scale, softcap: base is the factor or the cap */
    /* conv_state: the states, each token's slot, the kernel width, the
     * tokens (n counts channels) */
    float *st;
    const int32_t *slot;
    int K, n_tok;
    /* delta_net: beta and alpha logits, dt bias, a; key heads (K is d) */
    const float *beta, *alpha, *dtb, *av;
    int nk;
    /* ssm_scan: the D skip per head; head width P, groups G, state N
     * (rmsnorm_groups: G groups) */
    const float *dd;
    int sp, sg, sn;
} ew_args;

/* The element-wise loops read the arguments into locals first: the build
 * has -fno-strict-aliasing, so a store through y would otherwise make the
 * compiler reload a->y, a->w, ... every iteration and keep the loop scalar
 * (an add of 16 x 576 floats took 7 us). */
static void rmsnorm_rows(const ew_args *a, int64_t t0, int64_t t1) {
    const int dim = a->dim;
    const float *x = a->x, *w = a->w;
    float *y = a->y;
    const double eps = a->eps;
    /* Up to four tokens at a time: each sum of squares is still one sequence
     * of double additions (double: costs nothing at this size and removes one
     * error source), but four of them side by side hide the add latency. */
    for (int64_t t = t0; t < t1; t += 4) {
        const int nt = t1 - t < 4 ? (int)(t1 - t) : 4;
        const float *xr[4];
        double ss[4] = {0.0, 0.0, 0.0, 0.0};
        for (int j = 0; j < nt; j++) xr[j] = x + (t + j) * dim;
        if (nt == 4) {
            for (int i = 0; i < dim; i++)
                for (int j = 0; j < 4; j++) ss[j] += (double)xr[j][i] * xr[j][i];
        } else {
            for (int j = 0; j < nt; j++)
                for (int i = 0; i < dim; i++) ss[j] += (double)xr[j][i] * xr[j][i];
        }
        for (int j = 0; j < nt; j++) {
            float *yr = y + (t + j) * dim;
            const float *xj = xr[j];
            float r = (float)(1.0 / sqrt(ss[j] / dim + eps));
            for (int i = 0; i < dim; i++) yr[i] = xj[i] * r * w[i];
        }
    }
}

/* LayerNorm: the mean and the variance of each row summed in double (as
 * ggml_norm does), then (x - mean) / sqrt(var + eps) * w + b. */
static void layernorm_rows(const ew_args *a, int64_t t0, int64_t t1) {
    const int dim = a->dim;
    const float *w = a->w, *b = a->b;
    for (int64_t t = t0; t < t1; t++) {
        const float *x = a->x + t * dim;
        float *y = a->y + t * dim;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < dim; i++) mean += x[i];
        mean /= dim;
        for (int i = 0; i < dim; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
        const double r = 1.0 / sqrt(var / dim + (double)a->eps);
        for (int i = 0; i < dim; i++) y[i] = (float)(((double)x[i] - mean) * r) * w[i] + b[i];
    }
}

/* GELU as the kernels' GeGLU with an up of ones (the same vector code and
 * accuracy), in slices of a stack buffer of ones. */
static void gelu_range(const ew_args *a, int64_t lo, int64_t hi) {
    float ones[256];
    for (int i = 0; i < 256; i++) ones[i] = 1.0f;
    for (int64_t i = lo; i < hi; i += 256) {
        int64_t n = hi - i < 256 ? hi - i : 256;
        a->k->geglu(a->y + i, a->y + i, ones, n);
    }
}

/* cos and sin of position pos's angle for the pair starting at dim i
 * (backend.h's zi_rope_freqs), times mscale. The angle in double:
 * positions reach thousands and cos/sin of a float angle would lose digits. */
static void rope_angle(int32_t pos, int i, int rope_dim, const zi_rope_freqs *rf, float *c,
                       float *s) {
    double e = (double)pos * pow((double)rf->base, -(double)i / rope_dim);
    if (rf->factors) e /= (double)rf->factors[i / 2];
    double theta = e * (double)rf->freq_scale;
    if (rf->ext_factor != 0.0f) { /* YaRN: backend.h's zi_rope_freqs */
        const double lo = rf->corr_lo, hi = rf->corr_hi;
        double y = ((double)(i / 2) - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
        y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
        const double mix = (1.0 - y) * (double)rf->ext_factor;
        theta = theta * (1.0 - mix) + e * mix;
    }
    *c = (float)(cos(theta) * (double)rf->mscale);
    *s = (float)(sin(theta) * (double)rf->mscale);
}

static void rope_rows(const ew_args *a, int64_t t0, int64_t t1) {
    const int rope_dim = a->rope_dim, n_heads = a->n_heads, head_dim = a->head_dim;
    float angles[1024]; /* cos, sin per pair; rope_dim <= head_dim <= 1024 (model.c) */
    for (int64_t t = t0; t < t1; t++) {
        const float *cs = a->cs ? a->cs + t * rope_dim : angles;
        if (!a->cs)
            for (int i = 0; i < rope_dim; i += 2)
                rope_angle(a->pos[t], i, rope_dim, a->rf, &angles[i], &angles[i + 1]);
        float *row = a->y + t * n_heads * head_dim;
        for (int h = 0; h < n_heads; h++) { /* each head's row in order */
            float *v = row + (size_t)h * head_dim;
            if (a->neox) { /* pair i: (v[i], v[i + half]), angle of table entry 2i */
                const int half = rope_dim / 2;
                for (int i = 0; i < half; i++) {
                    float c = cs[2 * i], s = cs[2 * i + 1], x0 = v[i], x1 = v[i + half];
                    v[i] = x0 * c - x1 * s;
                    v[i + half] = x0 * s + x1 * c;
                }
                continue;
            }
            for (int i = 0; i < rope_dim; i += 2) {
                float c = cs[i], s = cs[i + 1], x0 = v[i], x1 = v[i + 1];
                v[i] = x0 * c - x1 * s;
                v[i + 1] = x0 * s + x1 * c;
            }
        }
    }
}

/* conv_state (backend.h) for channels [c0, c1): in blocks of 64 channels
 * (the block's kernel taps transposed once, so that the channel loops are
 * plain vector loops), each token in order, its window's products summed
 * oldest first, then the state shifted. Every channel's operations and
 * their order are those of one channel alone. */
static void conv_channels(const ew_args *a, int64_t c0, int64_t c1) {
    enum { CB = 64, KMAX = 64 }; /* model.c reads kernels up to 64 wide */
    const int K = a->K, C = a->dim;
    const float *w = a->w;
    assert(K <= KMAX); /* cpu_conv_state */
    float wt[KMAX][CB], acc[CB];
    for (int64_t b0 = c0; b0 < c1; b0 += CB) {
        const int nc = c1 - b0 < CB ? (int)(c1 - b0) : CB;
        for (int c = 0; c < nc; c++)
            for (int j = 0; j < K; j++) wt[j][c] = w[(b0 + c) * K + j];
        for (int i = 0; i < a->n_tok; i++) {
            float *restrict s = a->st + (size_t)a->slot[i] * (size_t)(K - 1) * C + b0;
            const float *restrict x = a->x + (size_t)i * C + b0;
            float *restrict y = a->y + (size_t)i * C + b0;
            if (a->pos[i] == 0)
                for (int j = 0; j < K - 1; j++)
                    memset(s + (size_t)j * C, 0, (size_t)nc * sizeof *s);
            for (int c = 0; c < nc; c++) acc[c] = 0.0f;
            for (int j = 0; j < K - 1; j++) {
                const float *restrict sj = s + (size_t)j * C;
                for (int c = 0; c < nc; c++) acc[c] += wt[j][c] * sj[c];
            }
            for (int c = 0; c < nc; c++) y[c] = acc[c] + wt[K - 1][c] * x[c];
            for (int j = 0; j + 1 < K - 1; j++) {
                float *restrict sj = s + (size_t)j * C;
                const float *restrict sn = s + (size_t)(j + 1) * C;
                for (int c = 0; c < nc; c++) sj[c] = sn[c];
            }
            float *restrict sl = s + (size_t)(K - 2) * C;
            for (int c = 0; c < nc; c++) sl[c] = x[c];
        }
    }
}

/* delta_net (backend.h) for value heads [h0, h1): head by head, each
 * head's tokens in order, in runs of consecutive tokens of one sequence
 * (the kernel keeps a block of the state in cache over a run); the
 * normalizations and gates in double, the recurrence in the kernels'
 * delta_rule (float32: a token's bits do not depend on the run it is in,
 * nor on the table). */
static void delta_heads(const ew_args *a, int64_t h0, int64_t h1) {
    enum { RUN_FLOATS = 8192 }; /* the run's q and k rows: 64 tokens of 128 */
    const int d = a->K, nk = a->nk, nv = a->dim;
    const size_t row = (size_t)(2 * nk + nv) * d, sz = (size_t)d * d;
    /* d <= 1024 (model.c): at least 8 tokens */
    const int max_run = RUN_FLOATS / d < RUN_FLOATS / 8 ? RUN_FLOATS / d : RUN_FLOATS / 8;
    float qn[RUN_FLOATS], kn[RUN_FLOATS], beta[RUN_FLOATS / 8], decay[RUN_FLOATS / 8];
    for (int64_t h = h0; h < h1; h++) {
        for (int t0 = 0, n = 0; t0 < a->n_tok; t0 += n) {
            float *S = a->st + ((size_t)a->slot[t0] * nv + (size_t)h) * sz;
            if (a->pos[t0] == 0) memset(S, 0, sz * sizeof *S);
            n = 1; /* the run: the tokens that continue t0's sequence */
            while (t0 + n < a->n_tok && n < max_run && a->slot[t0 + n] == a->slot[t0] &&
                   a->pos[t0 + n] == a->pos[t0] + n)
                n++;
            for (int r = 0; r < n; r++) {
                const int t = t0 + r;
                const float *q = a->x + (size_t)t * row + (size_t)(h % nk) * d;
                const float *k = q + (size_t)nk * d;
                double sq = 0.0, sk = 0.0;
                for (int i = 0; i < d; i++) sq += (double)q[i] * q[i], sk += (double)k[i] * k[i];
                const double rq = 1.0 / (sqrt(sq + a->eps) * sqrt((double)d)),
                             rk = 1.0 / sqrt(sk + a->eps);
                float *qr = qn + (size_t)r * d, *kr = kn + (size_t)r * d;
                for (int i = 0; i < d; i++) qr[i] = (float)(q[i] * rq), kr[i] = (float)(k[i] * rk);
                beta[r] = (float)(1.0 / (1.0 + exp(-(double)a->beta[(size_t)t * nv + h])));
                const double x = (double)a->alpha[(size_t)t * nv + h] + a->dtb[h];
                decay[r] = (float)exp((x > 20.0 ? x : log1p(exp(x))) * a->av[h]);
            }
            a->k->delta_rule(S, d, n, kn, qn, a->x + (size_t)t0 * row + (size_t)(2 * nk + h) * d,
                             row, beta, decay, a->y + (size_t)t0 * nv * d + (size_t)h * d,
                             (size_t)nv * d);
        }
    }
}

/* ssm_scan (backend.h) for heads [h0, h1): head by head, each head's
 * tokens in order, in runs of consecutive tokens of one sequence (the
 * kernel keeps a block of the state in cache over a run); the step and
 * its decay in double, the recurrence in the kernels' ssm_run (float32:
 * a token's bits do not depend on the run it is in, nor on the table),
 * the D skip in double. */
static void ssm_heads(const ew_args *a, int64_t h0, int64_t h1) {
    enum { MAX_RUN = 64 };
    const int H = a->dim, P = a->sp, G = a->sg, N = a->sn, per_group = H / G;
    const size_t row = (size_t)H * P + (size_t)2 * G * N, sz = (size_t)P * N;
    float d[MAX_RUN], dA[MAX_RUN];
    for (int64_t h = h0; h < h1; h++) {
        const float *B0 = a->x + (size_t)H * P + (size_t)(h / per_group) * N;
        for (int t0 = 0, n = 0; t0 < a->n_tok; t0 += n) {
            float *S = a->st + ((size_t)a->slot[t0] * H + (size_t)h) * sz;
            if (a->pos[t0] == 0) memset(S, 0, sz * sizeof *S);
            n = 1; /* the run: the tokens that continue t0's sequence */
            while (t0 + n < a->n_tok && n < MAX_RUN && a->slot[t0 + n] == a->slot[t0] &&
                   a->pos[t0 + n] == a->pos[t0] + n)
                n++;
            for (int r = 0; r < n; r++) {
                const double v = (double)a->alpha[(size_t)(t0 + r) * H + h] + a->dtb[h];
                const double dt = v > 20.0 ? v : log1p(exp(v));
                d[r] = (float)dt, dA[r] = (float)exp(dt * a->av[h]);
            }
            const float *x = a->x + (size_t)t0 * row + (size_t)h * P;
            float *o = a->y + (size_t)t0 * H * P + (size_t)h * P;
            a->k->ssm_run(S, P, N, n, x, row, B0 + (size_t)t0 * row,
                          B0 + (size_t)t0 * row + (size_t)G * N, row, d, dA, o, (size_t)H * P);
            const double skip = a->dd[h];
            for (int r = 0; r < n; r++)
                for (int p = 0; p < P; p++) {
                    float *op = o + (size_t)r * H * P + p;
                    *op = (float)(*op + skip * x[(size_t)r * row + p]);
                }
        }
    }
}

/* rmsnorm_groups (backend.h) for group rows [r0, r1) (row r is group r % G
 * of token r / G), each sum of squares in double as rmsnorm_rows. */
static void group_norm_rows(const ew_args *a, int64_t r0, int64_t r1) {
    const int G = a->sg, dg = a->dim / G;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = a->x + (size_t)r * dg, *w = a->w + (size_t)(r % G) * dg;
        float *y = a->y + (size_t)r * dg;
        double ss = 0.0;
        for (int i = 0; i < dg; i++) ss += (double)x[i] * x[i];
        const float rr = (float)(1.0 / sqrt(ss / dg + a->eps));
        for (int i = 0; i < dg; i++) y[i] = x[i] * rr * w[i];
    }
}

static void ew_worker(void *p, int ith, int nth) {
    const ew_args *a = p;
    int64_t lo, hi;
    split_range(a->n, ith, nth,
                a->op == EW_RMSNORM || a->op == EW_ROPE || a->op == EW_BIAS ||
                        a->op == EW_LAYERNORM || a->op == EW_GATHER || a->op == EW_WSUM ||
                        a->op == EW_DELTA || a->op == EW_SSM || a->op == EW_GNORM
                    ? 1
                    : 64,
                &lo, &hi);
    switch (a->op) {
    case EW_RMSNORM: rmsnorm_rows(a, lo, hi); break;
    case EW_LAYERNORM:
        layernorm_rows(a, lo, hi);
        break;
    case EW_GELU:
        gelu_range(a, lo, hi);
        break;
    case EW_ROPE: rope_rows(a, lo, hi); break;
    case EW_SWIGLU: a->k->swiglu(a->y + lo, a->x + lo, a->w + lo, hi - lo); break;
    case EW_GEGLU:
        a->k->geglu(a->y + lo, a->x + lo, a->w + lo, hi - lo);
        break;
    case EW_SCALE: {
        float *y = a->y;
        const float f = a->base;
        for (int64_t i = lo; i < hi; i++) y[i] *= f;
        break;
    }
    case EW_SOFTCAP: { /* in double: tanhf's error would be scaled by the cap */
        float *y = a->y;
        const double cap = a->base;
        for (int64_t i = lo; i < hi; i++) y[i] = (float)(cap * tanh(y[i] / cap));
        break;
    }
    case EW_ADD: {
        float *y = a->y;
        const float *x = a->x;
        for (int64_t i = lo; i < hi; i++) y[i] += x[i];
        break;
    }
    case EW_MUL: {
        float *y = a->y;
        const float *x = a->x;
        for (int64_t i = lo; i < hi; i++) y[i] *= x[i];
        break;
    }
    case EW_SILU:
        a->k->silu(a->y + lo, hi - lo);
        break;
    case EW_SIGMUL:
        a->k->sigmoid_mul(a->y + lo, a->x + lo, hi - lo);
        break;
    case EW_DELTA:
        delta_heads(a, lo, hi);
        break;
    case EW_SSM:
        ssm_heads(a, lo, hi);
        break;
    case EW_GNORM:
        group_norm_rows(a, lo, hi);
        break;
    case EW_CONV:
        conv_channels(a, lo, hi);
        break;
    case EW_BIAS: { /* rows lo..hi of dim, each plus the vector w */
        const int dim = a->dim;
        const float *w = a->w;
        for (int64_t t = lo; t < hi; t++) {
            float *y = a->y + t * dim;
            for (int i = 0; i < dim; i++) y[i] += w[i];
        }
        break;
    }
    case EW_SWIGLU_OAI: { /* backend.h's swiglu_oai; eps: alpha, base: limit */
        float *y = a->y;
        const float *g = a->x, *u = a->w, alpha = a->eps, limit = a->base;
        for (int64_t i = lo; i < hi; i++) {
            const float x = g[i] < limit ? g[i] : limit;
            const float v = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
            y[i] = x / (1.0f + expf(-alpha * x)) * (v + 1.0f);
        }
        break;
    }
    case EW_GATHER: { /* rows lo..hi: y[t] = x[idx[t]] */
        const size_t row = (size_t)a->dim * sizeof(float);
        for (int64_t t = lo; t < hi; t++)
            memcpy(a->y + t * a->dim, a->x + (size_t)a->pos[t] * a->dim, row);
        break;
    }
    case EW_WSUM: { /* output rows lo..hi: the weighted sum of k rows of x, in order */
        const int dim = a->dim, k = a->k_rows;
        for (int64_t t = lo; t < hi; t++) {
            float *y = a->y + t * dim;
            const float w0 = a->w[t * k];
            const float *x0 = a->x + (size_t)a->pos[t * k] * dim;
            for (int i = 0; i < dim; i++) y[i] = w0 * x0[i];
            for (int j = 1; j < k; j++) {
                const float wj = a->w[t * k + j];
                const float *xj = a->x + (size_t)a->pos[t * k + j] * dim;
                for (int i = 0; i < dim; i++) y[i] += wj * xj[i];
            }
        }
        break;
    }
    }
}

/* Runs an element-wise job, on the pool only when there is enough work. */
static void ew_run(zi_backend *be, ew_args *a, int64_t work) {
    if (work >= 16384)
        zi_pool_run(cb(be)->pool, ew_worker, a);
    else
        ew_worker(a, 0, 1);
}

static void cpu_rmsnorm(zi_backend *be, float *y, const float *x, const float *w, int n_tokens,
                        int dim, float eps) {
    ew_args a = {.op = EW_RMSNORM, .y = y, .x = x, .w = w, .n = n_tokens, .dim = dim, .eps = eps};
    /* Weighted as 4 per element: the sums of squares are chains of double
     * adds, so 16 tokens of 576 are worth splitting (7 -> 5.5 us). */
    ew_run(be, &a, (int64_t)n_tokens * dim * 4);
}

/* The cos/sin table for these positions: kept from an earlier call with
 * the same ones (60 calls per forward pass of a 30-layer model share one
 * table; a model with two RoPE bases keeps one per base); NULL if it
 * cannot be allocated (rope_rows then computes). */
static const float *rope_table(cpu_backend *c, const int32_t *pos, int n_tokens, int rope_dim,
                               const zi_rope_freqs *rf) {
    c->rope_clock++;
    for (int e = 0; e < 2; e++) {
        struct rope_cache *r = &c->rope[e];
        if (r->n == n_tokens && r->dim == rope_dim && r->rf.base == rf->base &&
            r->rf.freq_scale == rf->freq_scale && r->rf.mscale == rf->mscale &&
            r->rf.ext_factor == rf->ext_factor && r->rf.corr_lo == rf->corr_lo &&
            r->rf.corr_hi == rf->corr_hi &&
            !r->rf.factors == !rf->factors &&
            (!rf->factors ||
             memcmp(r->fac, rf->factors, (size_t)rope_dim / 2 * sizeof *r->fac) == 0) &&
            memcmp(r->pos, pos, (size_t)n_tokens * sizeof *pos) == 0) {
            r->used = c->rope_clock;
            return r->cs;
        }
    }
    struct rope_cache *r = &c->rope[c->rope[0].used <= c->rope[1].used ? 0 : 1];
    r->used = c->rope_clock;
    /* cs and pos grow apart: fewer tokens of a wider rope_dim fit the
     * table but not the positions */
    if ((int64_t)n_tokens * rope_dim > r->cap) {
        r->n = 0;
        float *cs = realloc(r->cs, (size_t)n_tokens * rope_dim * sizeof *cs);
        if (!cs) return NULL;
        r->cs = cs;
        r->cap = n_tokens * rope_dim;
    }
    if (n_tokens > r->pos_cap) {
        r->n = 0;
        int32_t *p = realloc(r->pos, (size_t)n_tokens * sizeof *p);
        if (!p) return NULL;
        r->pos = p;
        r->pos_cap = n_tokens;
    }
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < rope_dim; i += 2)
            rope_angle(pos[t], i, rope_dim, rf, &r->cs[t * rope_dim + i],
                       &r->cs[t * rope_dim + i + 1]);
    memcpy(r->pos, pos, (size_t)n_tokens * sizeof *pos);
    r->n = n_tokens;
    r->dim = rope_dim;
    r->rf = *rf;
    if (rf->factors) {
        memcpy(r->fac, rf->factors, (size_t)rope_dim / 2 * sizeof *r->fac);
        r->rf.factors = r->fac;
    }
    return r->cs;
}

static void rope_run(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                     int head_dim, int rope_dim, const zi_rope_freqs *rf, int neox) {
    ew_args a = {.op = EW_ROPE,
                 .y = x,
                 .pos = pos,
                 .n = n_tokens,
                 .n_heads = n_heads,
                 .head_dim = head_dim,
                 .rope_dim = rope_dim,
                 .rf = rf,
                 .neox = neox,
                 .cs = rope_table(cb(be), pos, n_tokens, rope_dim, rf)};
    ew_run(be, &a, (int64_t)n_tokens * n_heads * rope_dim * 4);
}

static void cpu_rope(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                     int head_dim, int rope_dim, const zi_rope_freqs *rf) {
    rope_run(be, x, pos, n_tokens, n_heads, head_dim, rope_dim, rf, 0);
}

static void cpu_rope_neox(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                          int head_dim, int rope_dim, const zi_rope_freqs *rf) {
    rope_run(be, x, pos, n_tokens, n_heads, head_dim, rope_dim, rf, 1);
}

/*
 * The CPU cache layout. A K block holds, per KV head, its block_size rows of
 * head_dim int16 codes back to back, [n_kv_heads][block_size][head_dim],
 * then one float scale per row, [n_kv_heads][block_size]; a V block holds
 * [n_kv_heads][block_size][head_dim] float16 values. So attention reads one
 * KV head's rows of a block as one run of memory (attention over a batch of
 * sequences is bound by reading the cache: 2 + 4/head_dim bytes a K value
 * instead of float32's 4 is a third fewer bytes a position).
 *
 * A K row is stored as round(k * 32767 / max|k|) with the scale
 * max|k| / 32767: its error is at most 1/65534 of the row's largest value.
 * That matters because a K rounding error moves a score by q . dk, which
 * the softmax passes straight into the log-probabilities: float16 K (an
 * error of 1/2048 of each value) moved them by up to 0.022 from the float64
 * reference, int16 rows by 0.0045, float32 by 0.0038. A V rounding error is
 * averaged by the attention weights, so V is float16 (up to 0.006). The
 * model sees only the block count, kv_k_bytes, kv_k_row_extra and
 * kv_v_bytes.
 */
typedef struct kv_args {
    const zi_cpu_kernels *k;
    const zi_backend *be;
    uint8_t *kc;
    uint16_t *vc;
    const float *kx, *vx;
    const zi_batch_view *b;
    const zi_attn_shape *s;
} kv_args;

/* The K layout above in bytes for one shape: a block's size, and where its
 * scales start. The same sizes as kv_k_bytes and kv_k_row_extra give the
 * model's pools; head_dim is even (model.c), so every scale is aligned. */
typedef struct k_layout {
    size_t block, scales;
} k_layout;

static k_layout k_layout_of(const zi_attn_shape *s) {
    size_t rows = (size_t)s->n_kv_heads * (size_t)s->block_size;
    size_t codes = rows * (size_t)s->head_dim * sizeof(int16_t);
    return (k_layout){codes + rows * sizeof(float), codes};
}

/*
 * The other --kv-type formats (zi_kv_type; backend.h): a K block and a V
 * block are each [n_kv_heads][block_size] rows of the type, one row the
 * head_dim values of one position and KV head: float16 values, or head_dim
 * / 32 of llama.cpp's Q8_0 or Q4_0 blocks (quant.h), quantized here as
 * llama.cpp's reference quantizers do (so its KL and ours compare the same
 * storage). The sizes are zi_backend_kv_row_bytes's.
 */
typedef struct q_layout {
    size_t krow, vrow;     /* bytes of a row */
    size_t kblock, vblock; /* bytes of a cache block */
} q_layout;

static q_layout q_layout_of(const zi_backend *be, const zi_attn_shape *s) {
    q_layout q;
    q.krow = (size_t)zi_backend_kv_row_bytes(be, s->head_dim, 0);
    q.vrow = (size_t)zi_backend_kv_row_bytes(be, s->head_dim, 1);
    const size_t rows = (size_t)s->n_kv_heads * (size_t)s->block_size;
    q.kblock = rows * q.krow, q.vblock = rows * q.vrow;
    return q;
}

/* n values (a multiple of 32) as Q8_0 blocks: quantize_row_q8_0_ref's
 * steps (d = max|x| / 127, codes round(x / d)); a block that is not finite
 * gets a NaN scale and zero codes (its scores NaN, as they would have
 * been). */
static void store_q8_0_row(uint8_t *dst, const float *x, size_t n) {
    for (size_t b = 0; b < n / ZI_QK; b++, x += ZI_QK, dst += sizeof(zi_block_q8_0)) {
        zi_block_q8_0 blk;
        int finite;
        const float amax = zi_amax_finite(x, ZI_QK, &finite);
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = zi_f32_to_f16(finite ? d : NAN);
        for (int i = 0; i < ZI_QK; i++) {
            const float v = finite ? roundf(x[i] * id) : 0.0f;
            blk.qs[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
        memcpy(dst, &blk, sizeof blk);
    }
}

/* n values (a multiple of 32) as Q4_0 blocks: quantize_row_q4_0_ref's
 * steps (d = the value of largest magnitude / -8, codes min(15, (int)(x /
 * d + 8.5))); non-finite blocks as store_q8_0_row. */
static void store_q4_0_row(uint8_t *dst, const float *x, size_t n) {
    for (size_t b = 0; b < n / ZI_QK; b++, x += ZI_QK, dst += sizeof(zi_block_q4_0)) {
        zi_block_q4_0 blk;
        float amax = 0.0f, max = 0.0f;
        int finite = 1;
        for (int i = 0; i < ZI_QK; i++) {
            finite &= isfinite(x[i]) != 0;
            if (amax < fabsf(x[i])) amax = fabsf(x[i]), max = x[i];
        }
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        blk.d = zi_f32_to_f16(finite ? d : NAN);
        for (int i = 0; i < ZI_QK / 2; i++) {
            float v0 = finite ? x[i] * id + 8.5f : 8.0f, v1 = finite ? x[i + 16] * id + 8.5f : 8.0f;
            v0 = v0 < 0.0f ? 0.0f : v0 > 15.0f ? 15.0f : v0; /* the ref's MIN(15, ...) */
            v1 = v1 < 0.0f ? 0.0f : v1 > 15.0f ? 15.0f : v1;
            blk.qs[i] = (uint8_t)((uint8_t)v0 | ((uint8_t)v1 << 4));
        }
        memcpy(dst, &blk, sizeof blk);
    }
}

/* One row of n values in --kv-type t's format (q_layout_of), rotated
 * first where zi_kv_rotated says so. */
static void store_q_row(const zi_cpu_kernels *k, int t, uint8_t *dst, const float *x, size_t n) {
    float xr[256];
    if (zi_kv_rotated(t, (int)n)) {
        memcpy(xr, x, n * sizeof *x);
        zi_kv_rotate(xr, (int)n);
        x = xr;
    }
    if (t == ZI_KV_F16) {
        uint16_t h[1024]; /* n <= 1024 (model.c); rows may sit at any even offset */
        k->to_f16(h, x, (int64_t)n);
        memcpy(dst, h, n * sizeof *h);
    } else if (t == ZI_KV_Q8_0) {
        store_q8_0_row(dst, x, n);
    } else {
        store_q4_0_row(dst, x, n);
    }
}

/* One K row of n values as int16 codes and their scale (the layout above).
 * A row that is not finite (a broken model) gets a NaN scale, so its scores
 * are NaN as they would have been; a row of zeros, or so small that the
 * codes would overflow, gets zeros. */
static void store_k_row(int16_t *codes, float *scale, const float *x, size_t n) {
    int finite;
    const float amax = zi_amax_finite(x, n, &finite);
    if (!finite || !(amax >= 0x1p-100f)) {
        memset(codes, 0, n * sizeof *codes);
        *scale = finite ? 0.0f : NAN;
        return;
    }
    const float inv = 32767.0f / amax;
    /* Adding and taking away 1.5 * 2^23 rounds |v| < 2^22 to the nearest
     * integer, ties to even, as nearbyintf does, in plain float arithmetic
     * the compiler vectorizes (this file is built for any x86-64, where
     * nearbyintf is a library call: kv_store went from 1.3% to 0.65% of a
     * 16-stream step's samples). */
    for (size_t i = 0; i < n; i++) {
        float c = (x[i] * inv + 0x1.8p23f) - 0x1.8p23f; /* |c| <= 32767 up to rounding */
        codes[i] = (int16_t)(c > 32767.0f ? 32767.0f : c < -32767.0f ? -32767.0f : c);
    }
    *scale = amax / 32767.0f;
}

/* A slice of the tokens: each row written is a cache miss or two, so a
 * batch's rows are shared between the threads (16 tokens: 16 -> 10 us). */
static void kv_worker(void *p, int ith, int nth) {
    const kv_args *a = p;
    const zi_batch_view *b = a->b;
    const zi_attn_shape *s = a->s;
    size_t hd = (size_t)s->head_dim, bs = (size_t)s->block_size, kvd = s->n_kv_heads * hd;
    const k_layout kl = k_layout_of(s);
    int64_t t0, t1;
    split_range(b->n_tokens, ith, nth, 1, &t0, &t1);
    const int type = a->be->kv_type;
    if (type != ZI_KV_DEFAULT) {
        const q_layout ql = q_layout_of(a->be, s);
        for (int64_t t = t0; t < t1; t++) {
            int p = b->pos[t];
            int32_t blk = b->block_tables[(size_t)b->seq[t] * b->table_stride + p / s->block_size];
            size_t r = (size_t)(p % s->block_size);
            uint8_t *kb = a->kc + (size_t)blk * ql.kblock,
                    *vb = (uint8_t *)a->vc + (size_t)blk * ql.vblock;
            for (int h = 0; h < s->n_kv_heads; h++) {
                store_q_row(a->k, type, kb + (h * bs + r) * ql.krow, a->kx + t * kvd + h * hd, hd);
                store_q_row(a->k, type, vb + (h * bs + r) * ql.vrow, a->vx + t * kvd + h * hd, hd);
            }
        }
        return;
    }
    for (int64_t t = t0; t < t1; t++) {
        int p = b->pos[t];
        int32_t blk = b->block_tables[(size_t)b->seq[t] * b->table_stride + p / s->block_size];
        size_t r = (size_t)(p % s->block_size);
        int16_t *codes = (int16_t *)(a->kc + (size_t)blk * kl.block);
        float *scales = (float *)(a->kc + (size_t)blk * kl.block + kl.scales);
        uint16_t *v = a->vc + (size_t)blk * bs * kvd;
        for (int h = 0; h < s->n_kv_heads; h++) {
            store_k_row(codes + (h * bs + r) * hd, scales + h * bs + r, a->kx + t * kvd + h * hd,
                        hd);
            a->k->to_f16(v + (h * bs + r) * hd, a->vx + t * kvd + h * hd, (int64_t)hd);
        }
    }
}

static void cpu_kv_store(zi_backend *be, void *kcache, void *vcache, const float *k, const float *v,
                         const zi_batch_view *b, const zi_attn_shape *s) {
    kv_args a = {
        .k = cb(be)->k, .be = be, .kc = kcache, .vc = vcache, .kx = k, .vx = v, .b = b, .s = s};
    if (b->n_tokens >= 4)
        zi_pool_run(cb(be)->pool, kv_worker, &a);
    else
        kv_worker(&a, 0, 1);
}

typedef struct attn_args {
    cpu_backend *c;
    float *out;
    const float *q;
    const uint8_t *kc;
    const uint16_t *vc;
    const zi_batch_view *b;
    const zi_attn_shape *s;
    int heads_per_task; /* the GQA group, or 1 when that leaves threads idle */
    /* Blocks of tokens that attend together: block i is tokens blocks[i] ..
     * blocks[i + 1] - 1 (consecutive positions of one sequence); NULL: a
     * block per token. */
    const int32_t *blocks;
    int n_blocks;
    atomic_llong next; /* the next block to take (attn_worker) */
} attn_args;

/* The first token of block i, and the block's token count in *B. */
static int block_tokens(const attn_args *a, int64_t i, int *B) {
    if (!a->blocks) {
        *B = 1;
        return (int)i;
    }
    *B = a->blocks[i + 1] - a->blocks[i];
    return a->blocks[i];
}

/* Task `task`'s part of the cache (the layout above kv_args): block task /
 * tasks_per_token (from its first token), KV head kvh, over n positions
 * (the first token's). */
static zi_kv_head task_view(const attn_args *a, const k_layout *kl, int64_t task, int *n) {
    const zi_attn_shape *s = a->s;
    const size_t bs = (size_t)s->block_size, hd = (size_t)s->head_dim;
    const int tasks_per_token = s->n_heads / a->heads_per_task;
    int B;
    const int t = block_tokens(a, task / tasks_per_token, &B);
    const int kvh =
        (int)(task % tasks_per_token) * a->heads_per_task / (s->n_heads / s->n_kv_heads);
    const size_t head = (size_t)kvh * bs * hd; /* its part of block 0 */
    /* A sliding window starts at position p - window + 1: whole blocks
     * before it are skipped through the table, the rest by `first`. */
    const int p = a->b->pos[t], pw = a->b->win_pos ? a->b->win_pos[t] : p;
    const int start = s->window > 0 && pw >= s->window ? pw - s->window + 1 : 0;
    *n = p + 1 - start;
    const int32_t *blocks =
        a->b->block_tables + (size_t)a->b->seq[t] * a->b->table_stride + start / s->block_size;
    if (a->c->base.kv_type != ZI_KV_DEFAULT) {
        const q_layout ql = q_layout_of(&a->c->base, s);
        return (zi_kv_head){
            .type = a->c->base.kv_type,
            .kq = a->kc + (size_t)kvh * bs * ql.krow,
            .vq = (const uint8_t *)a->vc + (size_t)kvh * bs * ql.vrow,
            .krow = ql.krow,
            .vrow = ql.vrow,
            .kstride = ql.kblock,
            .vstride = ql.vblock,
            .blocks = blocks,
            .first = start % s->block_size,
            .bs = s->block_size,
        };
    }
    return (zi_kv_head){
        .k = (const int16_t *)a->kc + head,
        .ks = (const float *)(a->kc + kl->scales) + (size_t)kvh * bs,
        .v = a->vc + head,
        .blocks =
            a->b->block_tables + (size_t)a->b->seq[t] * a->b->table_stride + start / s->block_size,
        .first = start % s->block_size,
        .bs = s->block_size,
        .kstride = kl->block / sizeof(int16_t),
        .sstride = kl->block / sizeof(float),
        .vstride = (size_t)s->n_kv_heads * hd * bs,
    };
}

/* Asks for the first K rows of a task's cache part before the task before
 * it runs: the kernel reads ahead within a task, but each task's first rows
 * would otherwise come from memory while the core waits (16 streams of
 * 64-128 positions: attention 3.3 -> 3.1 ms a step on one core). */
static void prefetch_task_start(const zi_kv_head *kv, int n, int hd) {
    if (kv->type != ZI_KV_DEFAULT) return; /* the default layout's rows only */
    int rows = n < kv->bs - kv->first ? n : kv->bs - kv->first;
    rows = rows < 16 ? rows : 16;
    const char *p = (const char *)(kv->k + (size_t)kv->blocks[0] * kv->kstride +
                                   (size_t)kv->first * (size_t)hd);
    for (size_t i = 0; i < (size_t)rows * (size_t)hd * sizeof(int16_t); i += 64)
        __builtin_prefetch(p + i, 0, 3);
}

/* One task per (block of tokens, KV head): the query heads that share a KV
 * head are done together, and the tokens of a block too, so each cached
 * K/V row is read once for them all. */
static void attn_worker(void *p, int ith, int nth) {
    attn_args *a = p;
    const zi_attn_shape *s = a->s;
    const zi_cpu_kernels *k = a->c->k;
    float *scores = a->c->scratch + (size_t)ith * a->c->scratch_per_thread;
    int hd = s->head_dim;
    const k_layout kl = k_layout_of(s);
    int hpt = a->heads_per_task;
    int tasks_per_token = s->n_heads / hpt;
    int64_t total = (int64_t)a->n_blocks * tasks_per_token;
    const size_t ts = (size_t)s->n_heads * (size_t)hd; /* floats from a token's q to the next's */
    /* With a token or more per thread, a thread takes whole tokens (all its
     * tasks), in turn from a shared counter (a late thread takes fewer): each
     * cached row then comes from memory to one core, the KV heads' parts back
     * to back, rather than a part to each core at once (attention over a
     * 16-sequence, 30-layer cache: 21 -> 16 ns per score on one core). With
     * fewer tokens, single tasks alternate. */
    const int64_t run = a->n_blocks >= nth ? tasks_per_token : 1; /* tasks taken together */
    int64_t r = run > 1 ? atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed) : ith;
    while (r * run < total) {
        int n;
        zi_kv_head kv = task_view(a, &kl, r * run, &n);
        for (int64_t task = r * run; task < (r + 1) * run; task++) {
            int B;
            const int t = block_tokens(a, task / tasks_per_token, &B);
            /* its first token's first query head */
            size_t row = (size_t)t * ts + (size_t)(task % tasks_per_token * hpt) * (size_t)hd;
            int n_next = 0;
            zi_kv_head next = {0};
            if (task + 1 < (r + 1) * run) {
                next = task_view(a, &kl, task + 1, &n_next);
                prefetch_task_start(&next, n_next, hd);
            }
            const int head0 = (int)(task % tasks_per_token * hpt);
            kv.sinks = s->sinks ? s->sinks + head0 : NULL;
            if (B > 1) { /* hpt <= ZI_ATTN_GROUP_MAX, hpt * B <= ZI_ATTN_ROWS */
                k->attend_block(a->q + row, ts, hpt, B, &kv, n, hd, s->scale, s->softcap, scores,
                                a->out + row, ts);
            } else {
                for (int g0 = 0; g0 < hpt; g0 += ZI_ATTN_GROUP_MAX) {
                    int G = hpt - g0 < ZI_ATTN_GROUP_MAX ? hpt - g0 : ZI_ATTN_GROUP_MAX;
                    kv.sinks = s->sinks ? s->sinks + head0 + g0 : NULL;
                    k->attend(a->q + row + (size_t)g0 * hd, G, &kv, n, hd, s->scale, s->softcap,
                              scores, a->out + row + (size_t)g0 * hd);
                }
            }
            kv = next, n = n_next;
        }
        r = run > 1 ? atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed) : r + nth;
    }
}

static void cpu_attention(zi_backend *be, float *out, const float *q, const void *kcache,
                          const void *vcache, const zi_batch_view *b, const zi_attn_shape *s) {
    cpu_backend *c = cb(be);
    /* Whole GQA groups per task read each K/V row once for the group; with
     * too few tasks for the threads (decode), one head per task instead.
     * Each head's float operations are the same either way. */
    int group = s->n_heads / s->n_kv_heads;
    int hpt = (int64_t)b->n_tokens * s->n_kv_heads >= 4 * (int64_t)zi_pool_size(c->pool) ? group : 1;
    /* The --kv-type formats decode each K and V row once per task, which
     * costs more than one head's products over it: rather than a head per
     * task, the largest part of a group that still gives every thread a
     * task (Gemma 3 270M's decode at 4k positions in q8_0 on 2 threads:
     * a global layer's attention 0.89 -> 0.63 ms of CPU time). */
    if (hpt == 1 && c->base.kv_type != ZI_KV_DEFAULT)
        for (int d = group; d > 1; d--)
            if (group % d == 0 && (int64_t)b->n_tokens * s->n_kv_heads * (group / d) >=
                                      (int64_t)zi_pool_size(c->pool)) {
                hpt = d;
                break;
            }
    attn_args a = {.c = c, .out = out, .q = q, .kc = kcache, .vc = vcache, .b = b, .s = s,
                   .heads_per_task = hpt, .n_blocks = b->n_tokens};
    /* A prompt's consecutive tokens attend in blocks (each token's result
     * is the same as alone): up to ZI_ATTN_ROWS query rows, whole blocks
     * per thread while there are enough of them. Not within a sliding
     * window's reach, where each token's first position differs. */
    const int bmax = ZI_ATTN_ROWS / hpt;
    if (hpt == group && hpt <= ZI_ATTN_GROUP_MAX && bmax > 1 && b->n_tokens > 1 &&
        b->n_tokens <= c->attn_blocks_cap) {
        int nb = 0;
        for (int t = 0; t < b->n_tokens;) {
            int B = 1;
            /* (a token attending past itself, win_pos, runs alone) */
            while (t + B < b->n_tokens && B < bmax && b->seq[t + B] == b->seq[t] &&
                   b->pos[t + B] == b->pos[t] + B && (s->window <= 0 || b->pos[t + B] < s->window) &&
                   (!b->win_pos || (b->win_pos[t] == b->pos[t] && b->win_pos[t + B] == b->pos[t + B])))
                B++;
            c->attn_blocks[nb++] = t;
            t += B;
        }
        c->attn_blocks[nb] = b->n_tokens;
        if (nb < b->n_tokens) a.blocks = c->attn_blocks, a.n_blocks = nb;
    }
    atomic_init(&a.next, 0);
    if ((int64_t)a.n_blocks * (s->n_heads / hpt) == 1)
        attn_worker(&a, 0, 1);
    else
        zi_pool_run(c->pool, attn_worker, &a);
}

/* The tile products (tile_mm.h) where the CPU has them and the backend
 * runs its AVX-512 table (a forced --isa scalar/avx2 keeps them off too). */
static int tile_ok(zi_backend *be) {
    return zi_tile_kind() != ZI_TILE_NONE && strcmp(cb(be)->k->isa, "avx512") == 0;
}

static void cpu_span_attention(zi_backend *be, float *out, const float *q, const float *k,
                               const float *v, const int32_t *order, const int32_t *starts,
                               int n_spans, const zi_attn_shape *s) {
    /* The float32 path where asked for and it applies; the exact double
     * one otherwise, or when its scratch cannot grow. */
    if (s->tile_precision && !s->causal && s->window == 0 && s->softcap == 0.0f && !s->sinks &&
        s->scale > 0.0f && tile_ok(be) &&
        zi_tile_span_attention(cb(be)->tile, out, q, k, v, order, starts, n_spans, s) == ZI_OK)
        return;
    zi_cpu_span_attention(cb(be)->pool, out, q, k, v, order, starts, n_spans, s);
}

static int cpu_weight_prepare_tile(zi_backend *be, zi_weight *w, zi_error *err) {
    if (w->aux || !tile_ok(be)) return ZI_OK;
    w->aux = zi_tile_pack_weight(cb(be)->tile, w, err);
    return w->aux ? ZI_OK : err->code;
}

static void cpu_matmul_tile(zi_backend *be, float *y, const zi_weight *w, const float *x,
                            int n_tokens) {
    if (tile_ok(be) && !w->aux) {
        /* Packed on first use when the caller did not prepare it; the
         * pack is part of the weight (weight_free releases it). */
        zi_error e = {0};
        cpu_weight_prepare_tile(be, (zi_weight *)w, &e);
    }
    if (w->aux && tile_ok(be) && zi_tile_matmul(cb(be)->tile, y, w->aux, x, n_tokens) == ZI_OK) return;
    cpu_matmul(be, y, w, x, n_tokens);
}

static void cpu_swiglu(zi_backend *be, float *out, const float *gate, const float *up, size_t n) {
    ew_args a = {.op = EW_SWIGLU, .k = cb(be)->k, .y = out, .x = gate, .w = up, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_geglu(zi_backend *be, float *out, const float *gate, const float *up, size_t n) {
    ew_args a = {.op = EW_GEGLU, .k = cb(be)->k, .y = out, .x = gate, .w = up, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_scale(zi_backend *be, float *x, float s, size_t n) {
    ew_args a = {.op = EW_SCALE, .y = x, .base = s, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n);
}

static void cpu_softcap(zi_backend *be, float *x, float cap, size_t n) {
    ew_args a = {.op = EW_SOFTCAP, .y = x, .base = cap, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 16);
}

static void cpu_add(zi_backend *be, float *x, const float *y, size_t n) {
    ew_args a = {.op = EW_ADD, .y = x, .x = y, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n);
}

static void cpu_add_bias(zi_backend *be, float *x, const float *bias, int n_rows, int dim) {
    ew_args a = {.op = EW_BIAS, .y = x, .w = bias, .n = n_rows, .dim = dim};
    ew_run(be, &a, (int64_t)n_rows * dim);
}

static void cpu_swiglu_oai(zi_backend *be, float *out, const float *gate, const float *up,
                           size_t n, float alpha, float limit) {
    ew_args a = {.op = EW_SWIGLU_OAI, .y = out, .x = gate, .w = up, .n = (int64_t)n,
                 .eps = alpha, .base = limit};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_gather_rows(zi_backend *be, float *y, const float *x, const int32_t *idx, int n,
                            int dim) {
    ew_args a = {.op = EW_GATHER, .y = y, .x = x, .pos = idx, .n = n, .dim = dim};
    ew_run(be, &a, (int64_t)n * dim);
}

static void cpu_weighted_sum_rows(zi_backend *be, float *out, const float *y, const int32_t *idx,
                                  const float *w, int n_out, int k, int dim) {
    assert(k >= 1);
    ew_args a = {.op = EW_WSUM, .y = out, .x = y, .w = w, .pos = idx, .n = n_out, .dim = dim, .k_rows = k};
    ew_run(be, &a, (int64_t)n_out * k * dim);
}

static void cpu_layernorm(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                          int n_tokens, int dim, float eps) {
    ew_args a = {
        .op = EW_LAYERNORM, .y = y, .x = x, .w = w, .b = b, .n = n_tokens, .dim = dim, .eps = eps};
    ew_run(be, &a, (int64_t)n_tokens * dim * 8);
}

static void cpu_gelu(zi_backend *be, float *x, size_t n) {
    ew_args a = {.op = EW_GELU, .k = cb(be)->k, .y = x, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_mul(zi_backend *be, float *x, const float *y, size_t n) {
    ew_args a = {.op = EW_MUL, .y = x, .x = y, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n);
}

static void cpu_conv_state(zi_backend *be, float *y, const float *x, const float *w, int K,
                           int channels, float *states, const int32_t *slot, const int32_t *pos,
                           int n) {
    assert(K >= 2 && K <= 64 && x != y); /* conv_channels' KMAX */
    ew_args a = {.op = EW_CONV,
                 .y = y,
                 .x = x,
                 .w = w,
                 .st = states,
                 .slot = slot,
                 .pos = pos,
                 .K = K,
                 .n_tok = n,
                 .n = channels,
                 .dim = channels};
    ew_run(be, &a, (int64_t)n * channels * K);
}

static void cpu_silu(zi_backend *be, float *x, size_t n) {
    ew_args a = {.op = EW_SILU, .k = cb(be)->k, .y = x, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_sigmoid_mul(zi_backend *be, float *x, const float *g, size_t n) {
    ew_args a = {.op = EW_SIGMUL, .k = cb(be)->k, .y = x, .x = g, .n = (int64_t)n};
    ew_run(be, &a, (int64_t)n * 4);
}

static void cpu_delta_net(zi_backend *be, float *out, const float *qkv, const float *b,
                          const float *alpha, const float *dt_bias, const float *av, float *states,
                          const int32_t *slot, const int32_t *pos, int n, int nk, int nv, int d,
                          float eps) {
    assert(d >= 1 && d <= 1024 && nk >= 1 && nv % nk == 0);
    ew_args a = {.op = EW_DELTA,
                 .k = cb(be)->k,
                 .y = out,
                 .x = qkv,
                 .beta = b,
                 .alpha = alpha,
                 .dtb = dt_bias,
                 .av = av,
                 .st = states,
                 .slot = slot,
                 .pos = pos,
                 .n_tok = n,
                 .n = nv,
                 .dim = nv,
                 .K = d,
                 .nk = nk,
                 .eps = eps};
    ew_run(be, &a, (int64_t)n * nv * d * d * 4);
}

static void cpu_ssm_scan(zi_backend *be, float *out, const float *xbc, const float *dt,
                         const float *dt_bias, const float *av, const float *dd, float *states,
                         const int32_t *slot, const int32_t *pos, int n, int H, int P, int G,
                         int N) {
    assert(H >= 1 && P >= 1 && N >= 1 && G >= 1 && H % G == 0 && out != xbc);
    ew_args a = {.op = EW_SSM,
                 .k = cb(be)->k,
                 .y = out,
                 .x = xbc,
                 .alpha = dt,
                 .dtb = dt_bias,
                 .av = av,
                 .dd = dd,
                 .st = states,
                 .slot = slot,
                 .pos = pos,
                 .n_tok = n,
                 .n = H,
                 .dim = H,
                 .sp = P,
                 .sg = G,
                 .sn = N};
    ew_run(be, &a, (int64_t)n * H * P * N * 4);
}

static void cpu_rmsnorm_groups(zi_backend *be, float *y, const float *x, const float *w,
                               int n_tokens, int dim, int groups, float eps) {
    assert(groups >= 1 && dim % groups == 0);
    ew_args a = {.op = EW_GNORM,
                 .y = y,
                 .x = x,
                 .w = w,
                 .n = (int64_t)n_tokens * groups,
                 .dim = dim,
                 .sg = groups,
                 .eps = eps};
    ew_run(be, &a, (int64_t)n_tokens * dim * 4);
}

static void cpu_backend_free(zi_backend *be) {
    cpu_backend *c = cb(be);
    if (!c) return;
    zi_pool_free(c->pool);
    zi_tile_ctx_free(c->tile);
    free(c->act.q);
    free(c->act.d);
    free(c->act.s);
    free(c->act_s16);
    free(c->scratch);
    free(c->attn_blocks);
    for (int e = 0; e < 2; e++) {
        free(c->rope[e].cs);
        free(c->rope[e].pos);
    }
    free(c->mm_next);
    free(c->deq_rows);
    free(c);
}

/* LoRA (backend.h's lora): each thread takes a share of the tokens; a
 * token's c = scale * A x (the table's lora_down: float32 sums, the same
 * bits whatever else the pass holds), then y += B c in one sweep of y
 * (lora_up). */
typedef struct lora_args {
    const zi_cpu_kernels *k;
    float *y;
    const float *x;
    int n_tokens;
    int64_t rows, cols;
    const zi_lora_row *r;
} lora_args;

static void lora_worker(void *ctx, int ith, int nth) {
    const lora_args *a = ctx;
    float c[ZI_LORA_MAX_RANK];
    for (int tk = ith; tk < a->n_tokens; tk += nth) {
        const zi_lora_row *r = &a->r[tk];
        if (!r->a) continue;
        const float *x = a->x + (size_t)tk * a->cols;
        const int f16 = r->type == ZI_TYPE_F16;
        a->k->lora_down(c, r->a, x, r->rank, a->cols, f16);
        for (int k = 0; k < r->rank; k++) c[k] *= r->scale;
        a->k->lora_up(a->y + (size_t)tk * a->rows, c, r->bt, r->rank, a->rows, f16);
    }
}

static void cpu_lora(zi_backend *be, float *y, const float *x, int n_tokens, int64_t rows,
                     int64_t cols, const zi_lora_row *r) {
    lora_args a = {cb(be)->k, y, x, n_tokens, rows, cols, r};
    int64_t work = 0;
    for (int t = 0; t < n_tokens; t++)
        if (r[t].a) {
            assert(r[t].rank >= 1 && r[t].rank <= ZI_LORA_MAX_RANK);
            work += (int64_t)r[t].rank * (rows + cols);
        }
    if (work == 0) return;
    if (work >= 65536 && n_tokens > 1)
        zi_pool_run(cb(be)->pool, lora_worker, &a);
    else
        lora_worker(&a, 0, 1);
}

/* The speech codec decoder's ops (cpu_audio.h). */
static void cpu_conv1d(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                       int n, int cin, int cout, int K) {
    zi_cpu_conv1d(cb(be)->pool, cb(be)->k, y, x, w, b, n, cin, cout, K);
}

static void cpu_conv1d_dw(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                          int n, int channels, int K) {
    zi_cpu_conv1d_dw(cb(be)->pool, y, x, w, b, n, channels, K);
}

static void cpu_group_norm(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                           int n, int channels, int groups, float eps) {
    zi_cpu_group_norm(cb(be)->pool, y, x, w, b, n, channels, groups, eps);
}

static void cpu_istft(zi_backend *be, float *out, const float *spec, float *frames, int n,
                      int n_fft, int hop) {
    zi_cpu_istft(cb(be)->pool, out, spec, frames, n, n_fft, hop);
}

/* Every zi_kv_type (q_layout_of); the caches made before keep their
 * layout, so the model sets it before making one (backend.h). */
static int cpu_set_kv_type(zi_backend *be, int t, zi_error *err) {
    if (t < 0 || t >= ZI_KV_TYPE_COUNT)
        return zi_error_set(err, ZI_EINVAL, "--kv-type %d: expected default, f16, q8_0 or q4_0", t);
    be->kv_type = t;
    return ZI_OK;
}

static const zi_backend_ops cpu_ops = {
    .name = "cpu",
    .free_backend = cpu_backend_free,
    .weight_init = cpu_weight_init,
    .weight_free = cpu_weight_free,
    .weight_view = cpu_weight_view,
    .vector_init = cpu_vector_init,
    .reserve = cpu_reserve,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .matmul = cpu_matmul,
    .matmul_n = cpu_matmul_n,
    .matmul_groups = cpu_matmul_groups,
    .matmul_tile = cpu_matmul_tile,
    .weight_prepare_tile = cpu_weight_prepare_tile,
    .get_rows = cpu_get_rows,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .rope_neox = cpu_rope_neox,
    .kv_store = cpu_kv_store,
    .attention = cpu_attention,
    .span_attention = cpu_span_attention,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .add = cpu_add,
    .lora = cpu_lora,
    .add_bias = cpu_add_bias,
    .layernorm = cpu_layernorm,
    .gelu = cpu_gelu,
    .swiglu_oai = cpu_swiglu_oai,
    .gather_rows = cpu_gather_rows,
    .weighted_sum_rows = cpu_weighted_sum_rows,
    .mul = cpu_mul,
    .conv_state = cpu_conv_state,
    .silu = cpu_silu,
    .sigmoid_mul = cpu_sigmoid_mul,
    .delta_net = cpu_delta_net,
    .ssm_scan = cpu_ssm_scan,
    .rmsnorm_groups = cpu_rmsnorm_groups,
    .conv1d = cpu_conv1d,
    .conv1d_dw = cpu_conv1d_dw,
    .group_norm = cpu_group_norm,
    .istft = cpu_istft,
    .sync = cpu_sync,
    .set_kv_type = cpu_set_kv_type,
};

int zi_cpu_backend_create(const zi_cpu_options *opt, zi_backend **out, zi_error *err) {
    int n = opt && opt->n_threads > 0 ? opt->n_threads : 0;
    if (n == 0) { /* the CPUs this process may run on (affinity, cpusets) */
        cpu_set_t set;
        n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                        : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (n < 1) n = 1;
        if (n > 1024) n = 1024;
    }
    if (n > 1024) return zi_error_set(err, ZI_EINVAL, "--threads %d is more than 1024", n);
    const int act_bits = opt && opt->act_bits ? opt->act_bits : 16;
    if (act_bits != 8 && act_bits != 16)
        return zi_error_set(err, ZI_EINVAL, "--act-bits %d: expected 8 or 16", act_bits);
    const zi_cpu_kernels *k =
        opt && opt->isa ? zi_cpu_kernels_by_name(opt->isa) : zi_cpu_kernels_select();
    if (!k)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "CPU kernel set '%s' is unknown or not supported by this CPU "
                            "(ZINFER_CPU_ISA / --isa: scalar, avx2, avx512)",
                            opt && opt->isa ? opt->isa : getenv("ZINFER_CPU_ISA"));
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return zi_error_set(err, ZI_ENOMEM, "out of memory creating the CPU backend");
    c->base.ops = &cpu_ops;
    c->base.kv_k_bytes = 2; /* int16 K rows with a float scale, float16 V (kv_worker) */
    c->base.kv_k_row_extra = sizeof(float);
    c->base.kv_v_bytes = 2;
    c->base.host_memory = true;
    c->base.attn_window = true; /* task_view */
    c->base.attn_softcap = true; /* attend's softcap */
    c->base.attn_sinks = true;   /* zi_kv_head.sinks */
    c->base.rope_yarn = true;    /* rope_angle's YaRN */
    c->k = k;
    c->act.no_residual = act_bits == 8;
    c->pool = zi_pool_create(n);
    c->mm_next = aligned_alloc(64, (size_t)n * sizeof *c->mm_next);
    c->tile = c->pool ? zi_tile_ctx_create(c->pool) : NULL;
    if (!c->pool || !c->mm_next || !c->tile) {
        zi_tile_ctx_free(c->tile);
        zi_pool_free(c->pool);
        free(c->mm_next);
        free(c);
        return zi_error_set(err, ZI_ENOMEM, "cannot start %d CPU threads", n);
    }
    *out = &c->base;
    return ZI_OK;
}

const char *zi_cpu_backend_isa(const zi_backend *be) { return ((const cpu_backend *)be)->k->isa; }
int zi_cpu_backend_threads(const zi_backend *be) {
    return zi_pool_size(((const cpu_backend *)be)->pool);
}
int zi_cpu_backend_act_bits(const zi_backend *be) {
    return ((const cpu_backend *)be)->act.no_residual ? 8 : 16;
}
