/*
 * test_moe.c - the mixture-of-experts routing (moe.h) and the CPU
 * backend's row gather and weighted row sum it runs on.
 *
 * Routing is checked against values worked out by hand from llama.cpp's
 * build_moe_ffn: softmax then top-k (with and without renormalizing, with a
 * scale), top-k then softmax (gpt-oss), ties going to the lower expert id.
 * The row ops are checked against plain loops, on sizes that run on one
 * thread and on the pool.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpu_backend.h"
#include "gguf.h"
#include "moe.h"

static void softmax_top2(void **state) {
    (void)state;
    zi_moe_params p = {.n_expert = 4, .n_expert_used = 2, .gating = ZI_GATING_SOFTMAX};
    const float z[2][4] = {{0.0f, 2.0f, 1.0f, -1.0f}, {3.0f, 3.0f, 0.0f, 0.0f}};
    int32_t ids[4];
    float w[4];
    zi_moe_route(&p, &z[0][0], 2, ids, w);
    const double s0 = 1 + exp(2) + exp(1) + exp(-1);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_float_equal(w[0], exp(2) / s0, 1e-7);
    assert_float_equal(w[1], exp(1) / s0, 1e-7);
    /* a tie: the lower id first */
    assert_int_equal(ids[2], 0);
    assert_int_equal(ids[3], 1);
    /* renormalized, then scaled */
    p.norm = 1;
    p.scale = 2.5f;
    zi_moe_route(&p, &z[0][0], 1, ids, w);
    assert_float_equal(w[0], 2.5 * exp(2) / (exp(2) + exp(1)), 1e-6);
    assert_float_equal(w[1], 2.5 * exp(1) / (exp(2) + exp(1)), 1e-6);
    /* a scale of 1 (or 0) leaves the weights alone */
    p.scale = 1.0f;
    zi_moe_route(&p, &z[0][0], 1, ids, w);
    assert_float_equal(w[0] + w[1], 1.0, 1e-7);
}

static void softmax_weight_top3(void **state) {
    (void)state;
    zi_moe_params p = {.n_expert = 5, .n_expert_used = 3, .gating = ZI_GATING_SOFTMAX_WEIGHT};
    const float z[5] = {-5.0f, 0.5f, 4.0f, 1.0f, 0.25f};
    int32_t ids[3];
    float w[3];
    zi_moe_route(&p, z, 1, ids, w);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 3);
    assert_int_equal(ids[2], 1);
    const double s = exp(4.0) + exp(1.0) + exp(0.5);
    assert_float_equal(w[0], exp(4.0) / s, 1e-7);
    assert_float_equal(w[1], exp(1.0) / s, 1e-7);
    assert_float_equal(w[2], exp(0.5) / s, 1e-7);
}

/* Every token picks all experts: k = n, weights in logit order. */
static void all_experts(void **state) {
    (void)state;
    zi_moe_params p = {.n_expert = 3, .n_expert_used = 3, .gating = ZI_GATING_SOFTMAX};
    const float z[3] = {1.0f, 3.0f, 2.0f};
    int32_t ids[3];
    float w[3];
    zi_moe_route(&p, z, 1, ids, w);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 0);
    assert_float_equal(w[0] + w[1] + w[2], 1.0, 1e-6);
}

static void row_ops(void **state) {
    (void)state;
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options opt = {.n_threads = 2};
    assert_int_equal(zi_cpu_backend_create(&opt, &be, &err), ZI_OK);
    assert_non_null(be->ops->gather_rows);
    assert_non_null(be->ops->weighted_sum_rows);
    /* dims: small (calling thread) and large (pool) */
    const int dims[2] = {8, 4096};
    for (int di = 0; di < 2; di++) {
        const int dim = dims[di], n_in = 7, n_out = 5, k = 3;
        float *x = malloc(sizeof(float) * n_in * dim), *y = malloc(sizeof(float) * 9 * dim);
        float *out = malloc(sizeof(float) * n_out * dim);
        for (int i = 0; i < n_in * dim; i++) x[i] = (float)((i * 37) % 101) / 7.0f - 5.0f;
        const int32_t gidx[9] = {6, 0, 3, 3, 1, 5, 2, 4, 0};
        be->ops->gather_rows(be, y, x, gidx, 9, dim);
        for (int r = 0; r < 9; r++)
            assert_memory_equal(y + (size_t)r * dim, x + (size_t)gidx[r] * dim,
                                sizeof(float) * dim);
        const int32_t sidx[15] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 7, 6, 2, 2, 2};
        const float w[15] = {0.5f, 0.25f, 0.25f, 1, 0, 0, -1, 2, 0.125f, 0.3f, 0.3f, 0.4f, 1, 1, 1};
        be->ops->weighted_sum_rows(be, out, y, sidx, w, n_out, k, dim);
        for (int t = 0; t < n_out; t++)
            for (int i = 0; i < dim; i++) {
                float want = w[t * k] * y[(size_t)sidx[t * k] * dim + i];
                for (int j = 1; j < k; j++)
                    want += w[t * k + j] * y[(size_t)sidx[t * k + j] * dim + i];
                assert_true(out[(size_t)t * dim + i] == want); /* the same order: exact */
            }
        free(x);
        free(y);
        free(out);
    }
    zi_backend_free(be);
}

/* gpt-oss's clamped SwiGLU against its formula (ggml_swiglu_oai). */
static void swiglu_oai(void **state) {
    (void)state;
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options opt = {.n_threads = 2};
    assert_int_equal(zi_cpu_backend_create(&opt, &be, &err), ZI_OK);
    enum { N = 40000 }; /* above the pool's threshold */
    float *g = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    float *out = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) {
        g[i] = (float)((int64_t)i * 7919 % 2001 - 1000) / 50.0f; /* -20 .. 20 */
        u[i] = (float)((int64_t)i * 104729 % 2001 - 1000) / 60.0f;
    }
    be->ops->swiglu_oai(be, out, g, u, N, 1.702f, 7.0f);
    for (int i = 0; i < N; i++) {
        const double x = g[i] < 7.0f ? g[i] : 7.0, y = u[i] < -7.0f  ? -7.0
                                                       : u[i] > 7.0f ? 7.0
                                                                     : u[i];
        const double want = x / (1.0 + exp(-1.702 * x)) * (y + 1.0);
        assert_float_equal(out[i], want, 1e-5 * (1.0 + fabs(want)));
    }
    free(g);
    free(u);
    free(out);
    zi_backend_free(be);
}

/* Rows of a weight viewed (weight_view) give the products a weight made of
 * those rows alone gives, bit for bit; a view that splits a 16-row group
 * is refused; matmul_groups equals a matmul per product over its rows. */
static void weight_views(void **state) {
    (void)state;
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options opt = {.n_threads = 2};
    assert_int_equal(zi_cpu_backend_create(&opt, &be, &err), ZI_OK);
    enum { ROWS = 64, COLS = 256, T = 5 };
    const int types[2] = {ZI_TYPE_Q8_0, ZI_TYPE_Q4_K};
    for (int ti = 0; ti < 2; ti++) {
        const int type = types[ti];
        const size_t rb =
            (size_t)COLS / zi_ggml_type_block_elems(type) * zi_ggml_type_block_bytes(type);
        uint8_t *data = malloc(rb * ROWS);
        uint32_t seed = 12345;
        for (size_t i = 0; i < rb * ROWS; i++) {
            seed = seed * 1103515245u + 12345u;
            data[i] = (uint8_t)(seed >> 16);
        }
        /* every block's float16 scales small and finite: bytes 0..1 (and
         * 2..3 for Q4_K) of each block */
        const size_t bb = zi_ggml_type_block_bytes(type);
        for (size_t b = 0; b < rb * ROWS / bb; b++) {
            data[b * bb + 1] = 0x20;
            if (type == ZI_TYPE_Q4_K) data[b * bb + 3] = 0x20;
        }
        zi_gguf_tensor t = {.name = {"w", 1},
                            .n_dims = 2,
                            .ne = {COLS, ROWS, 1, 1},
                            .type = type,
                            .nbytes = rb * ROWS,
                            .data = data};
        zi_weight all, view, part;
        assert_int_equal(be->ops->weight_init(be, &all, &t, &err), ZI_OK);
        assert_int_equal(be->ops->weight_view(be, &all, 32, 16, &view, &err), ZI_OK);
        assert_null(view.owned);
        zi_gguf_tensor slice = t;
        slice.ne[1] = 16;
        slice.nbytes = rb * 16;
        slice.data = data + rb * 32;
        assert_int_equal(be->ops->weight_init(be, &part, &slice, &err), ZI_OK);
        assert_int_equal(be->ops->reserve(be, T, COLS, 16, &err), ZI_OK);
        float x[T * COLS], y1[T * 16], y2[T * 16];
        for (int i = 0; i < T * COLS; i++) x[i] = (float)((i * 37) % 19) / 9.0f - 1.0f;
        be->ops->matmul(be, y1, &view, x, T);
        be->ops->matmul(be, y2, &part, x, T);
        assert_memory_equal(y1, y2, sizeof y1);
        be->ops->matmul(be, y1, &view, x, 1);
        be->ops->matmul(be, y2, &part, x, 1);
        assert_memory_equal(y1, y2, sizeof(float) * 16);
        /* matmul_groups: each product over its own rows of x, as matmul */
        {
            float g1[3 * 16], g2[2 * 16], w1[3 * 16], w2[2 * 16];
            float *ys[2] = {g1, g2};
            const zi_weight *ws[2] = {&view, &part};
            const int32_t first[2] = {1, 3}, count[2] = {3, 2};
            be->ops->matmul_groups(be, 2, ys, ws, x, T, first, count);
            be->ops->matmul(be, w1, &view, x + 1 * COLS, 3);
            be->ops->matmul(be, w2, &part, x + 3 * COLS, 2);
            assert_memory_equal(g1, w1, sizeof g1);
            assert_memory_equal(g2, w2, sizeof g2);
        }
        if (all.layout)
            assert_int_equal(be->ops->weight_view(be, &all, 8, 16, &view, &err), ZI_EINVAL);
        assert_int_equal(be->ops->weight_view(be, &all, 56, 16, &view, &err), ZI_EINVAL);
        be->ops->weight_free(be, &view); /* frees nothing */
        be->ops->weight_free(be, &part);
        be->ops->weight_free(be, &all);
        free(data);
    }
    zi_backend_free(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(softmax_top2), cmocka_unit_test(softmax_weight_top3),
        cmocka_unit_test(all_experts),  cmocka_unit_test(row_ops),
        cmocka_unit_test(swiglu_oai),   cmocka_unit_test(weight_views),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
