/*
 * test_cuda_backend.c - the CUDA backend on a real GPU, against the CPU
 * backend and double-precision references. Built only with CUDA
 * (tests/gpu/meson.build); on a machine without a usable GPU it prints why
 * and exits 77, which meson and scripts/run_tests.py report as skipped.
 *
 *   ops      every backend op on random data: matmul for each weight type
 *            on both paths (matrix-vector for <= 8 tokens, dequantize +
 *            cuBLAS above), matmul_n, get_rows, rmsnorm, rope, kv_store and
 *            attention on a shuffled paged cache (split and unsplit),
 *            swiglu, add; a bad token id is reported, not a device fault;
 *            the experts' ops (weight_view, matmul_groups, swiglu_oai)
 *   gemma    rope_neox, geglu, scale, softcap and per-head rmsnorm vs the
 *            CPU; sliding-window attention (windows 1..past the context,
 *            split and unsplit) vs the CPU and a double reference
 *   lora     the lora op (a LoRA term per token, two adapters of different
 *            ranks, float32 and fp16, some tokens without) vs the CPU's
 *            and a double reference; a token's rows do not depend on the
 *            rest of the batch
 *   graph    a layer's ops captured in a CUDA graph and replayed give the
 *            eager results (no allocation or host sync inside the ops);
 *            two shapes' graphs launched in turn, a failed capture and a
 *            refused launch leave the metadata right
 *   model    the real model's logits on CUDA vs CPU: mean KL < 1e-3 over a
 *            few prompts; 32 greedy tokens equal; batched decode equals
 *            each sequence alone; one-rank NCCL all-reduce changes nothing
 *   encoder  layernorm, gelu, weighted_sum_rows, span_attention (exact
 *            and tile-precision paths, causal, GQA, shuffled spans) and
 *            matmul_tile for every type vs the CPU / double arithmetic;
 *            gemma3 and idefics3 image towers (small random projector
 *            files written here) encode the same soft tokens as the CPU
 *   audio    the speech decoder's conv1d, conv1d_dw, group_norm and istft
 *            vs the CPU's on random inputs
 *   sampler  the GPU sampler against its C reference (sampling_ref.h)
 *            draw for draw, a chi-square test against the exact
 *            distribution, greedy and odd rows
 *
 * ZINFER_GPU_TEST_QUICK=1 skips the model tests (for compute-sanitizer,
 * which slows kernels ~100x). The model is $ZINFER_MODEL or the default
 * download; the model tests are skipped without it.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "chi2.h"
#include "test_rand.h"
#include <cuda_runtime_api.h>

#include "args.h"
#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_kernels.h" /* ZI_CUDA_MMV_MAX_TOKENS */
#include "family.h"
#include "gguf.h"
#include "gguf_writer.h"
#include "kv_fixed.h"
#include "model.h"
#include "quant.h"
#include "sampling.h"
#include "sampling_ref.h"
#include "tokenizer.h"
#include "tp.h"
#include "types.h"
#include "vision.h"

static zi_test_rng rng = {0x9e3779b97f4a7c15ull};
static double urand(void) {
    return zi_test_urand(&rng);
}
static float frand(float lo, float hi) {
    return zi_test_frand(&rng, lo, hi);
}

static zi_backend *g_cpu, *g_gpu;

static int quick(void) {
    const char *q = getenv("ZINFER_GPU_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

static void check_status(void) {
    zi_error err = {0};
    if (zi_cuda_backend_status(g_gpu, &err)) fail_msg("CUDA backend: %s", err.msg);
}

/* ---- buffers ---- */

static float *put(zi_backend *be, const float *h, size_t n) {
    float *d = be->ops->alloc(be, n * sizeof(float) + 64);
    assert_non_null(d);
    if (h) be->ops->upload(be, d, h, n * sizeof(float));
    return d;
}

static void get(zi_backend *be, float *h, const float *d, size_t n) {
    be->ops->download(be, h, d, n * sizeof(float));
    be->ops->sync(be, NULL); /* errors: check_status() */
}

static float *frandom(size_t n, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) x[i] = frand(lo, hi);
    return x;
}

/* max |a - b| / (max |b| + tiny) */
static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d || e != e) d = e;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

/* ---- weights ---- */

/* Random rows of `type` (test_rand.h), float types in [-0.5, 0.5]; the
 * types zi_test_make_rows does not write are random blocks (every code and
 * sub-scale random, scales small). */
static void *make_rows(int type, int rows, int cols, size_t *row_bytes) {
    const int plain = type == ZI_TYPE_Q4_0 || type == ZI_TYPE_Q4_1 || type == ZI_TYPE_Q8_0 ||
                      type == ZI_TYPE_F16 || type == ZI_TYPE_BF16 || type == ZI_TYPE_F32;
    void *w = plain ? zi_test_make_rows(&rng, type, rows, cols, 0.5f, row_bytes)
                    : zi_test_random_blocks(&rng, type, rows, cols, row_bytes);
    assert_non_null(w);
    return w;
}

static zi_gguf_tensor tensor(const char *name, int type, int rows, int cols, const void *data,
                             size_t row_bytes) {
    zi_gguf_tensor t;
    memset(&t, 0, sizeof t);
    t.name.ptr = name;
    t.name.len = strlen(name);
    t.n_dims = 2;
    t.ne[0] = cols;
    t.ne[1] = rows;
    t.ne[2] = t.ne[3] = 1;
    t.type = type;
    t.nbytes = row_bytes * (size_t)rows;
    t.data = data;
    return t;
}

/* Every type the backend takes (the K-quants need cols % 256 == 0). */
static const int TYPES[] = {ZI_TYPE_Q4_0, ZI_TYPE_Q4_1,   ZI_TYPE_Q8_0,   ZI_TYPE_F16,
                            ZI_TYPE_BF16, ZI_TYPE_F32,    ZI_TYPE_Q5_0,   ZI_TYPE_Q5_1,
                            ZI_TYPE_Q2_K, ZI_TYPE_Q3_K,   ZI_TYPE_Q4_K,   ZI_TYPE_Q5_K,
                            ZI_TYPE_Q6_K, ZI_TYPE_IQ4_NL, ZI_TYPE_IQ4_XS, ZI_TYPE_MXFP4};

/* Checks y [n][rows] = x [n][cols] times rows r0 .. r0 + rows - 1 of the
 * quantized weight wd (row_bytes rb, `type`), transposed, against double
 * arithmetic on the dequantized rows: each output within tol of the sum of
 * its terms' magnitudes (the fp16 operands of the cuBLAS path: ~2^-11
 * relative each; the matrix-vector kernel: float sums). what names the
 * case in a failure. */
static void check_products(int type, const void *wd, size_t rb, int r0, int rows, int cols,
                           const float *x, int n, const float *y, const char *what) {
    const double tol = n <= ZI_CUDA_MMV_MAX_TOKENS ? 2e-5 : 3e-3;
    float *row = malloc(sizeof(float) * (size_t)cols);
    assert_non_null(row);
    for (int r = 0; r < rows; r++) {
        zi_dequantize_row(type, (const uint8_t *)wd + rb * (size_t)(r0 + r), row, cols);
        for (int tk = 0; tk < n; tk++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < cols; c++) {
                const double p = (double)row[c] * x[(size_t)tk * cols + c];
                ref += p;
                mag += fabs(p);
            }
            const double got = y[(size_t)tk * rows + r];
            if (!(fabs(got - ref) <= tol * mag + 1e-6))
                fail_msg("%s %s %dx%d, %d tokens: y[%d][%d] = %.7g, want %.7g (|wx| %.3g)",
                         zi_ggml_type_name(type), what, rows, cols, n, tk, r, got, ref, mag);
        }
    }
    free(row);
}

/* matmul on both paths for every type, against double arithmetic on the
 * dequantized weights. */
static void test_matmul(void **state) {
    (void)state;
    const int shapes[][2] = {{96, 256}, {520, 1536}}; /* rows, cols */
    const int tokens[] = {1, 2, 3, 8, 9, 64};
    zi_error err = {0};
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++)
        for (int si = 0; si < 2; si++) {
            int type = TYPES[ti], rows = shapes[si][0], cols = shapes[si][1];
            size_t rb;
            void *wd = make_rows(type, rows, cols, &rb);
            zi_gguf_tensor t = tensor("blk.0.ffn_up.weight", type, rows, cols, wd, rb);
            zi_weight w;
            assert_int_equal(g_gpu->ops->weight_init(g_gpu, &w, &t, &err), ZI_OK);
            assert_int_equal(g_gpu->ops->reserve(g_gpu, 64, cols, 64, &err), ZI_OK);
            for (size_t ni = 0; ni < sizeof tokens / sizeof tokens[0]; ni++) {
                int n = tokens[ni];
                float *x = frandom((size_t)n * cols, -1.0f, 1.0f);
                float *dx = put(g_gpu, x, (size_t)n * cols),
                      *dy = put(g_gpu, NULL, (size_t)n * rows);
                g_gpu->ops->matmul(g_gpu, dy, &w, dx, n);
                float *y = malloc(sizeof(float) * (size_t)n * rows);
                get(g_gpu, y, dy, (size_t)n * rows);
                check_status();
                check_products(type, wd, rb, 0, rows, cols, x, n, y, "matmul");
                g_gpu->ops->free(g_gpu, dx);
                g_gpu->ops->free(g_gpu, dy);
                free(x);
                free(y);
            }
            g_gpu->ops->weight_free(g_gpu, &w);
            free(wd);
        }
}

/* matmul_n is n matmuls; and the CPU backend agrees (quantized activations
 * there: ~1e-4). */
static void test_matmul_n_vs_cpu(void **state) {
    (void)state;
    zi_error err = {0};
    const int rows[3] = {576, 192, 192}, cols = 576;
    zi_weight wc[3], wg[3];
    void *data[3];
    for (int i = 0; i < 3; i++) {
        size_t rb;
        data[i] = make_rows(ZI_TYPE_Q4_1, rows[i], cols, &rb);
        zi_gguf_tensor t = tensor("blk.0.attn_q.weight", ZI_TYPE_Q4_1, rows[i], cols, data[i], rb);
        assert_int_equal(g_cpu->ops->weight_init(g_cpu, &wc[i], &t, &err), ZI_OK);
        assert_int_equal(g_gpu->ops->weight_init(g_gpu, &wg[i], &t, &err), ZI_OK);
    }
    for (int n = 1; n <= 33; n += 16) {
        assert_int_equal(g_cpu->ops->reserve(g_cpu, n, cols, 64, &err), ZI_OK);
        assert_int_equal(g_gpu->ops->reserve(g_gpu, n, cols, 64, &err), ZI_OK);
        float *x = frandom((size_t)n * cols, -1, 1);
        float *yc[3], *yg[3], *dyg[3], *dyc[3];
        float *dxc = put(g_cpu, x, (size_t)n * cols), *dxg = put(g_gpu, x, (size_t)n * cols);
        for (int i = 0; i < 3; i++) {
            dyc[i] = put(g_cpu, NULL, (size_t)n * rows[i]);
            dyg[i] = put(g_gpu, NULL, (size_t)n * rows[i]);
        }
        const zi_weight *pc[3] = {&wc[0], &wc[1], &wc[2]}, *pg[3] = {&wg[0], &wg[1], &wg[2]};
        g_cpu->ops->matmul_n(g_cpu, 3, dyc, pc, dxc, n);
        g_gpu->ops->matmul_n(g_gpu, 3, dyg, pg, dxg, n);
        for (int i = 0; i < 3; i++) {
            size_t m = (size_t)n * rows[i];
            yc[i] = malloc(m * sizeof(float));
            yg[i] = malloc(m * sizeof(float));
            get(g_cpu, yc[i], dyc[i], m);
            get(g_gpu, yg[i], dyg[i], m);
            double e = rel_err(yg[i], yc[i], m);
            print_message("matmul_n %d tokens, product %d: rel err vs CPU %.2e\n", n, i, e);
            assert_true(e < (n <= 8 ? 1e-3 : 5e-3));
            free(yc[i]);
            free(yg[i]);
            g_cpu->ops->free(g_cpu, dyc[i]);
            g_gpu->ops->free(g_gpu, dyg[i]);
        }
        g_cpu->ops->free(g_cpu, dxc);
        g_gpu->ops->free(g_gpu, dxg);
        free(x);
    }
    check_status();
    for (int i = 0; i < 3; i++) {
        g_cpu->ops->weight_free(g_cpu, &wc[i]);
        g_gpu->ops->weight_free(g_gpu, &wg[i]);
        free(data[i]);
    }
}

static void test_get_rows(void **state) {
    (void)state;
    zi_error err = {0};
    const int rows = 100, cols = 512, n = 7;
    int32_t ids[7] = {0, 99, 5, 5, 42, 17, 98};
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
        size_t rb;
        void *wd = make_rows(TYPES[ti], rows, cols, &rb);
        zi_gguf_tensor t = tensor("token_embd.weight", TYPES[ti], rows, cols, wd, rb);
        zi_weight w;
        assert_int_equal(g_gpu->ops->weight_init(g_gpu, &w, &t, &err), ZI_OK);
        assert_int_equal(g_gpu->ops->reserve(g_gpu, n, cols, 64, &err), ZI_OK);
        float *dy = put(g_gpu, NULL, (size_t)n * cols);
        g_gpu->ops->get_rows(g_gpu, dy, &w, ids, n);
        float y[7 * 512], want[512];
        get(g_gpu, y, dy, (size_t)n * cols);
        check_status();
        for (int i = 0; i < n; i++) {
            zi_dequantize_row(TYPES[ti], (const uint8_t *)wd + rb * (size_t)ids[i], want, cols);
            for (int c = 0; c < cols; c++)
                if (fabsf(y[i * cols + c] - want[c]) > 1e-6f * fabsf(want[c]) + 1e-30f)
                    fail_msg("%s row %d col %d: %g vs %g", zi_ggml_type_name(TYPES[ti]), ids[i], c,
                             y[i * cols + c], want[c]);
        }
        g_gpu->ops->free(g_gpu, dy);
        g_gpu->ops->weight_free(g_gpu, &w);
        free(wd);
    }
}

/* A mixture of experts' ops: experts viewed out of one tensor
 * (weight_view), products over groups of rows (matmul_groups, on both
 * paths: groups of up to 8 rows and more) against double arithmetic on
 * the dequantized rows, and the clamped SwiGLU against the CPU backend. */
static void test_moe_ops(void **state) {
    (void)state;
    zi_error err = {0};
    const int E = 6, R = 96, cols = 512, n_rows = 40;
    const int types[] = {ZI_TYPE_Q4_K, ZI_TYPE_MXFP4, ZI_TYPE_Q8_0};
    /* groups: expert e over rows first[g] .. first[g] + count[g] - 1 */
    const int n = 4, expert[4] = {5, 0, 3, 3};
    const int32_t first[4] = {0, 3, 4, 30}, count[4] = {3, 1, 26, 10};
    assert_int_equal(g_gpu->ops->reserve(g_gpu, n_rows, cols, 64, &err), ZI_OK);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        size_t rb;
        uint8_t *wd = make_rows(type, E * R, cols, &rb);
        zi_gguf_tensor t = tensor("blk.0.ffn_up_exps.weight", type, E * R, cols, wd, rb);
        zi_weight all, views[6];
        assert_int_equal(g_gpu->ops->weight_init(g_gpu, &all, &t, &err), ZI_OK);
        for (int e = 0; e < E; e++)
            assert_int_equal(
                g_gpu->ops->weight_view(g_gpu, &all, (int64_t)e * R, R, &views[e], &err), ZI_OK);
        assert_int_equal(
            g_gpu->ops->weight_view(g_gpu, &all, (int64_t)E * R - 1, 2, &views[0], &err),
            ZI_EINVAL); /* past the last row */
        assert_int_equal(g_gpu->ops->weight_view(g_gpu, &all, 0, R, &views[0], &err), ZI_OK);
        float *x = frandom((size_t)n_rows * cols, -1, 1);
        float *dx = put(g_gpu, x, (size_t)n_rows * cols);
        float *dys[4], *ys[4];
        const zi_weight *ws[4];
        for (int g = 0; g < n; g++) {
            dys[g] = put(g_gpu, NULL, (size_t)count[g] * R);
            ys[g] = malloc(sizeof(float) * (size_t)count[g] * R);
            ws[g] = &views[expert[g]];
        }
        g_gpu->ops->matmul_groups(g_gpu, n, dys, ws, dx, n_rows, first, count);
        for (int g = 0; g < n; g++) get(g_gpu, ys[g], dys[g], (size_t)count[g] * R);
        check_status();
        for (int g = 0; g < n; g++) /* group g: expert expert[g]'s rows */
            check_products(type, wd, rb, expert[g] * R, R, cols, x + (size_t)first[g] * cols,
                           count[g], ys[g], "matmul_groups");
        for (int g = 0; g < n; g++) {
            g_gpu->ops->free(g_gpu, dys[g]);
            free(ys[g]);
        }
        for (int e = 0; e < E; e++) g_gpu->ops->weight_free(g_gpu, &views[e]);
        g_gpu->ops->weight_free(g_gpu, &all);
        g_gpu->ops->free(g_gpu, dx);
        free(x);
        free(wd);
    }
    /* the clamped SwiGLU, gpt-oss's constants, both sides of the limits */
    const size_t m = 4096;
    float *gt = frandom(m, -10, 10), *up = frandom(m, -10, 10);
    float *res[2];
    zi_backend *bes[2] = {g_cpu, g_gpu};
    for (int k = 0; k < 2; k++) {
        zi_backend *be = bes[k];
        float *dg = put(be, gt, m), *du = put(be, up, m);
        be->ops->swiglu_oai(be, dg, dg, du, m, 1.702f, 7.0f);
        res[k] = malloc(sizeof(float) * m);
        get(be, res[k], dg, m);
        be->ops->free(be, dg);
        be->ops->free(be, du);
    }
    check_status();
    const double e = rel_err(res[1], res[0], m);
    print_message("swiglu_oai: rel err vs CPU %.2e\n", e);
    assert_true(e < 1e-6);
    free(res[0]);
    free(res[1]);
    free(gt);
    free(up);
}

/* The element-wise ops against the CPU backend on the same inputs. */
static void test_elementwise(void **state) {
    (void)state;
    zi_error err = {0};
    const int T = 37, dim = 576, nh = 9, hd = 64;
    assert_int_equal(g_gpu->ops->reserve(g_gpu, T, dim, 64, &err), ZI_OK);
    assert_int_equal(g_cpu->ops->reserve(g_cpu, T, dim, 64, &err), ZI_OK);
    size_t n = (size_t)T * dim;
    float *x = frandom(n, -3, 3), *w = frandom(dim, 0.5f, 1.5f), *u = frandom(n, -2, 2);
    float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
    int32_t pos[37];
    for (int i = 0; i < T; i++) pos[i] = i * 113; /* up to 4068: the angles need double */
    zi_backend *bes[2] = {g_cpu, g_gpu};
    float *out[2] = {a, b};
    /* rmsnorm (in place as well), rope (full and partial), swiglu, add */
    for (int k = 0; k < 2; k++) {
        zi_backend *be = bes[k];
        float *dx = put(be, x, n), *dw = put(be, w, dim), *dy = put(be, NULL, n),
              *du = put(be, u, n);
        be->ops->rmsnorm(be, dy, dx, dw, T, dim, 1e-5f);
        be->ops->rmsnorm(be, dx, dx, dw, T, dim, 1e-5f);
        be->ops->add(be, dy, dx, n);
        const zi_rope_freqs r1 = {10000.0f, 1.0f, 1.0f, NULL, 0, 0, 0},
                            r2 = {500000.0f, 1.0f, 1.0f, NULL, 0, 0, 0};
        be->ops->rope(be, dy, pos, T, nh, hd, hd, &r1);
        be->ops->rope(be, dy, pos, T, nh, hd, 32, &r2);
        be->ops->swiglu(be, dy, dy, du, n);
        be->ops->add(be, dy, du, n);
        get(be, out[k], dy, n);
        be->ops->free(be, dx);
        be->ops->free(be, dw);
        be->ops->free(be, dy);
        be->ops->free(be, du);
    }
    check_status();
    double e = rel_err(b, a, n);
    print_message("rmsnorm/rope/swiglu/add: rel err vs CPU %.2e\n", e);
    assert_true(e < 1e-5);
    free(x);
    free(w);
    free(u);
    free(a);
    free(b);
}

/* kv_store + attention on a paged cache whose block ids are shuffled:
 * three sequences (20, 41 and 600 positions), queries mixing prefill and
 * decode, one long enough for the split path. Each backend lays out (and
 * types) its pool its own way, so only the attention outputs are compared. */
static void run_attention(zi_backend *be, const float *kv_src, const float *q_host, float *out,
                          const int32_t *tables, int stride, int n_blocks) {
    const int nh = 9, nkv = 3, hd = 64, bs = 16, kvd = nkv * hd;
    zi_attn_shape s = {nh, nkv, hd, bs, 1024, 0.125f, 0, 0, NULL, 0, 0};
    zi_error err = {0};
    assert_int_equal(be->ops->reserve(be, 64, 1536, 1024, &err), ZI_OK);
    size_t pool = (size_t)n_blocks * bs * kvd;
    float *kc = put(be, NULL, pool), *vc = put(be, NULL, pool);
    const int lens[3] = {20, 41, 600};
    /* store every sequence's K/V in chunks of up to 64 tokens */
    int32_t pos[64], seq[64];
    float *dk = put(be, NULL, 64 * (size_t)kvd), *dv = put(be, NULL, 64 * (size_t)kvd);
    size_t src = 0;
    for (int sq = 0; sq < 3; sq++)
        for (int p0 = 0; p0 < lens[sq]; p0 += 64) {
            int m = lens[sq] - p0 < 64 ? lens[sq] - p0 : 64;
            for (int i = 0; i < m; i++) pos[i] = p0 + i, seq[i] = sq;
            be->ops->upload(be, dk, kv_src + src, (size_t)m * kvd * sizeof(float));
            be->ops->upload(be, dv, kv_src + src + 700 * (size_t)kvd,
                            (size_t)m * kvd * sizeof(float));
            src += (size_t)m * kvd;
            zi_batch_view v = {m, pos, seq, tables, stride, NULL};
            be->ops->kv_store(be, kc, vc, dk, dv, &v, &s);
        }
    /* queries: seq 0 at 19, seq 1 at 0..40, seq 2 at 599 and 300 */
    int32_t qp[44], qs[44];
    int nq = 0;
    qp[nq] = 19, qs[nq++] = 0;
    for (int i = 0; i <= 40; i++) qp[nq] = i, qs[nq++] = 1;
    qp[nq] = 599, qs[nq++] = 2;
    qp[nq] = 300, qs[nq++] = 2;
    float *dq = put(be, q_host, (size_t)nq * nh * hd), *dout = put(be, NULL, (size_t)nq * nh * hd);
    zi_batch_view v = {nq, qp, qs, tables, stride, NULL};
    be->ops->attention(be, dout, dq, kc, vc, &v, &s);
    get(be, out, dout, (size_t)nq * nh * hd);
    /* a lone decode token at 599: few blocks, long span (the split path) */
    zi_batch_view one = {1, &qp[42], &qs[42], tables, stride, NULL};
    be->ops->attention(be, dout, dq, kc, vc, &one, &s);
    get(be, out + (size_t)nq * nh * hd, dout, (size_t)nh * hd);
    be->ops->free(be, kc);
    be->ops->free(be, vc);
    be->ops->free(be, dk);
    be->ops->free(be, dv);
    be->ops->free(be, dq);
    be->ops->free(be, dout);
}

static void test_attention_paged(void **state) {
    (void)state;
    const int nh = 9, hd = 64, kvd = 3 * 64, bs = 16, stride = 64, n_blocks = 64;
    /* blocks needed: 2 + 3 + 38 = 43 of 64, assigned in a shuffled order */
    int32_t perm[64], tables[3 * 64];
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(urand() * (i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int need[3] = {2, 3, 38};
    int next = 0;
    for (int s = 0; s < 3; s++)
        for (int j = 0; j < stride; j++) tables[s * stride + j] = j < need[s] ? perm[next++] : -1;
    (void)bs;
    float *kv = frandom(1400 * (size_t)kvd, -1, 1);
    /* K/V values that float16 holds exactly: the CPU caches V as float16,
     * the GPU as float32, and both then attend over the same numbers. */
    for (size_t i = 0; i < 1400 * (size_t)kvd; i++) kv[i] = zi_f16_to_f32(zi_f32_to_f16(kv[i]));
    float *q = frandom(44 * (size_t)nh * hd, -2, 2);
    size_t nout = 45 * (size_t)nh * hd;
    float *oc = malloc(nout * sizeof(float)), *og = malloc(nout * sizeof(float));
    run_attention(g_cpu, kv, q, oc, tables, stride, n_blocks);
    run_attention(g_gpu, kv, q, og, tables, stride, n_blocks);
    check_status();
    double e = rel_err(og, oc, nout);
    print_message("attention (paged, split and unsplit): rel err vs CPU %.2e\n", e);
    assert_true(e < 2e-5);
    free(kv);
    free(q);
    free(oc);
    free(og);
}

/* ---- the optional ops of the gemma families ---- */

/* rope and rope_neox with frequency factors (in device memory, as the
 * model's rope_freqs / rope_factors_long), a linear scale and an attention
 * factor (llama 3, phi3) against the CPU backend, several shapes each. */
static void test_rope_factors_vs_cpu(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *bes[2] = {g_cpu, g_gpu};
    assert_int_equal(g_gpu->ops->reserve(g_gpu, 64, 4096, 64, &err), ZI_OK);
    assert_int_equal(g_cpu->ops->reserve(g_cpu, 64, 4096, 64, &err), ZI_OK);
    /* tokens, heads, head_dim, rope_dim */
    const int rs[][4] = {{1, 4, 128, 128}, {7, 3, 64, 32}, {37, 9, 96, 96}, {3, 5, 64, 46}};
    for (size_t si = 0; si < sizeof rs / sizeof rs[0]; si++)
        for (int neox = 0; neox < 2; neox++)
            for (int yarn = 0; yarn < 2; yarn++) {
                const int T = rs[si][0], nh = rs[si][1], hd = rs[si][2], rd = rs[si][3];
                size_t n = (size_t)T * nh * hd;
                float *x = frandom(n, -2, 2), *fac = frandom((size_t)rd / 2, 1, 40),
                      *o[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
                int32_t pos[64];
                for (int i = 0; i < T; i++) pos[i] = (int32_t)(urand() * 131072); /* phi3 128k */
                for (int k = 0; k < 2; k++) {
                    float *d = put(bes[k], x, n), *df = put(bes[k], fac, (size_t)rd / 2);
                    /* YaRN as gpt-oss has it: factor 32, the ramp over pairs
                     * 8.5 .. 20.3 (yarn_corr_dims of base 150000, 64 dims) */
                    const zi_rope_freqs rf = {si % 2 ? 10000.0f : 500000.0f,
                                              yarn     ? 1.0f / 32.0f
                                              : si % 2 ? 0.25f
                                                       : 1.0f,
                                              si % 2 ? 1.0f : 1.19f,
                                              df,
                                              yarn ? 1.0f : 0.0f,
                                              yarn ? 8.5f : 0.0f,
                                              yarn ? 20.3f : 0.0f};
                    (neox ? bes[k]->ops->rope_neox : bes[k]->ops->rope)(bes[k], d, pos, T, nh, hd,
                                                                        rd, &rf);
                    get(bes[k], o[k], d, n);
                    bes[k]->ops->free(bes[k], d);
                    bes[k]->ops->free(bes[k], df);
                }
                check_status();
                double e = rel_err(o[1], o[0], n);
                print_message("rope%s%s with factors %d tokens x %d heads of %d, rope_dim %d: rel "
                              "err vs CPU %.2e\n",
                              neox ? "_neox" : "", yarn ? " (YaRN)" : "", T, nh, hd, rd, e);
                assert_true(e < 1e-6);
                for (size_t i = 0; i < n; i++)
                    if ((int)(i % (size_t)hd) >= rd) assert_true(o[1][i] == x[i]);
                free(x);
                free(fac);
                free(o[0]);
                free(o[1]);
            }
}

/* rope_neox, geglu (separate and in place), scale, softcap and the per-head
 * Q/K rmsnorm (rows of head_dim, 16 up to 256, odd ones too) against the
 * CPU backend on the same inputs, several shapes each. */
static void test_gemma_ops(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *bes[2] = {g_cpu, g_gpu};
    /* every op and capability the gemma3 row asks for: it loads on CUDA */
    const zi_family *g3 = zi_family_find("gemma3", 6);
    assert_non_null(g3);
    if (zi_family_check_backend(g3, g_gpu, 1, 1, 0, 0, 0, &err))
        fail_msg("gemma3 on CUDA: %s", err.msg);
    assert_int_equal(g_gpu->ops->reserve(g_gpu, 64, 4096, 64, &err), ZI_OK);
    assert_int_equal(g_cpu->ops->reserve(g_cpu, 64, 4096, 64, &err), ZI_OK);
    /* rope_neox: tokens, heads, head_dim, rope_dim (half of 46 is odd) */
    const int rs[][4] = {{1, 4, 256, 256}, {7, 3, 64, 32}, {37, 9, 64, 64},
                         {5, 1, 256, 128}, {3, 5, 64, 46}, {2, 2, 16, 16}};
    for (size_t si = 0; si < sizeof rs / sizeof rs[0]; si++) {
        const int T = rs[si][0], nh = rs[si][1], hd = rs[si][2], rd = rs[si][3];
        size_t n = (size_t)T * nh * hd;
        float *x = frandom(n, -2, 2),
              *o[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
        int32_t pos[64];
        for (int i = 0; i < T; i++) pos[i] = (int32_t)(urand() * 32768); /* gemma3's context */
        for (int k = 0; k < 2; k++) {
            float *d = put(bes[k], x, n);
            const zi_rope_freqs rf = {si % 2 ? 10000.0f : 1e6f, 1.0f, 1.0f, NULL, 0, 0, 0};
            bes[k]->ops->rope_neox(bes[k], d, pos, T, nh, hd, rd, &rf);
            get(bes[k], o[k], d, n);
            bes[k]->ops->free(bes[k], d);
        }
        check_status();
        double e = rel_err(o[1], o[0], n);
        print_message("rope_neox %d tokens x %d heads of %d, rope_dim %d: rel err vs CPU %.2e\n", T,
                      nh, hd, rd, e);
        assert_true(e < 1e-6);
        /* the dims past rope_dim are untouched */
        for (size_t i = 0; i < n; i++)
            if ((int)(i % (size_t)hd) >= rd) assert_true(o[1][i] == x[i]);
        free(x);
        free(o[0]);
        free(o[1]);
    }
    /* element-wise ops over odd lengths, one past a grid-stride chunk too */
    const size_t lens[] = {1, 17, 1000, 4097, 2048 * 37, 65536 * 256 + 3};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        float *g = frandom(n, -6, 6), *u = frandom(n, -2, 2), *lg = frandom(n, -100, 100);
        float *o[2][4];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            for (int j = 0; j < 4; j++) o[k][j] = malloc(n * sizeof(float));
            float *dg = put(be, g, n), *du = put(be, u, n), *dy = put(be, NULL, n),
                  *dl = put(be, lg, n);
            be->ops->geglu(be, dy, dg, du, n); /* separate output */
            get(be, o[k][0], dy, n);
            be->ops->geglu(be, dg, dg, du, n); /* in place, as the model */
            get(be, o[k][1], dg, n);
            be->ops->scale(be, du, 25.298221f, n); /* sqrt(640) */
            get(be, o[k][2], du, n);
            be->ops->softcap(be, dl, li % 2 ? 30.0f : 50.0f, n);
            get(be, o[k][3], dl, n);
            float *bufs[] = {dg, du, dy, dl};
            for (int j = 0; j < 4; j++) be->ops->free(be, bufs[j]);
        }
        check_status();
        static const char *names[] = {"geglu", "geglu in place", "scale", "softcap"};
        for (int j = 0; j < 4; j++) {
            double e = rel_err(o[1][j], o[0][j], n);
            print_message("%s over %zu: rel err vs CPU %.2e\n", names[j], n, e);
            assert_true(e < 1e-6);
        }
        assert_memory_equal(o[1][0], o[1][1], n * sizeof(float));
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 4; j++) free(o[k][j]);
        free(g);
        free(u);
        free(lg);
    }
    /* per-head rmsnorm: rows of head_dim, in place */
    const int rn[][2] = {{1, 16}, {36, 16}, {36, 256}, {1000, 256}, {9, 17}, {4, 1}, {3, 1024}};
    for (size_t si = 0; si < sizeof rn / sizeof rn[0]; si++) {
        const int rows = rn[si][0], dim = rn[si][1];
        size_t n = (size_t)rows * dim;
        float *x = frandom(n, -3, 3), *w = frandom((size_t)dim, 0.5f, 1.5f);
        float *o[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
        for (int k = 0; k < 2; k++) {
            float *dx = put(bes[k], x, n), *dw = put(bes[k], w, (size_t)dim);
            bes[k]->ops->rmsnorm(bes[k], dx, dx, dw, rows, dim, 1e-6f);
            get(bes[k], o[k], dx, n);
            bes[k]->ops->free(bes[k], dx);
            bes[k]->ops->free(bes[k], dw);
        }
        check_status();
        double e = rel_err(o[1], o[0], n);
        print_message("rmsnorm %d rows of %d (in place): rel err vs CPU %.2e\n", rows, dim, e);
        assert_true(e < 1e-6);
        free(x);
        free(w);
        free(o[0]);
        free(o[1]);
    }
}

/*
 * Sliding-window attention. Three sequences of 40, 75 and 1500 positions on
 * a shuffled paged cache (block size 16); two batches per window:
 *   A  75 tokens (the whole of sequence 1) plus decode tokens of sequences
 *      0 and 2 at several positions: n_tokens * n_heads blocks, unsplit;
 *   B  three decode tokens, at 1499 and 1234 of sequence 2 and 5 of
 *      sequence 0: few blocks and (window 0, 700, 5000) a long span, so the
 *      split path, with empty splits for the short token;
 *   C  an image tile of 64 tokens of sequence 2 (1000..1063) attending to
 *      the whole tile, each window counted from the token's own position
 *      (zi_batch_view.win_pos).
 * Windows 1, 3, 17, 700, and 5000 (more than the context: the same as 0).
 * K values are multiples of 1/32767 with one +-1 a row, which the CPU's
 * int16 rows hold (nearly) exactly, and V values float16 holds: the CPU and
 * the GPU then attend over the same numbers, and both are checked against a
 * double-precision reference that applies the window itself.
 */
enum { WA_SEQS = 3, WA_MAXQ = 96 };
static const int wa_lens[WA_SEQS] = {40, 75, 1500};

typedef struct wa_case {
    int nh, nkv, hd, window;
    float softcap; /* attention logit soft-capping (gemma2), 0: none */
    int sinks;     /* gpt-oss's attention sinks: wa_sink's, or none */
} wa_case;

/* Head h's sink logit (the scores here are about +-1..3). */
static float wa_sink(int h) {
    return 0.5f + 0.37f * (float)(h % 7);
}

/* Batch `which` (0..WA_BATCHES-1): positions qp, sequences qs, and qw,
 * where each token's window counts from (its own position; batch 2 is a
 * 64-token image tile of sequence 2 at 1000..1063 whose tokens attend to
 * the whole tile, zi_batch_view.win_pos: qp is the tile's last). */
enum { WA_BATCHES = 3 };
static int wa_batch(int which, int32_t *qp, int32_t *qs, int32_t *qw) {
    int nq = 0;
    if (which == 2) {
        for (int i = 0; i < 64; i++) qp[nq] = 1063, qw[nq] = 1000 + i, qs[nq++] = 2;
        return nq;
    }
    if (which == 0) {
        for (int i = 0; i < wa_lens[1]; i++) qp[nq] = i, qs[nq++] = 1;
        const int dec[][2] = {{0, 39}, {0, 0}, {0, 16}, {2, 1499}, {2, 17}, {2, 700}, {2, 1023}};
        for (int i = 0; i < 7; i++) qs[nq] = dec[i][0], qp[nq++] = dec[i][1];
    } else {
        qp[nq] = 1499, qs[nq++] = 2;
        qp[nq] = 1234, qs[nq++] = 2;
        qp[nq] = 5, qs[nq++] = 0;
    }
    for (int i = 0; i < nq; i++) qw[i] = qp[i];
    return nq;
}

/* K/V of sequence sq at position p: rows [sq][p][kvd] of kv (K), then V. */
static size_t wa_row(int sq, int p, int kvd) {
    size_t off = 0;
    for (int i = 0; i < sq; i++) off += (size_t)wa_lens[i];
    return (off + (size_t)p) * (size_t)kvd;
}

static void run_window_attention(zi_backend *be, const wa_case *wc, const float *k, const float *v,
                                 const float *q, float *out, const int32_t *tables, int stride,
                                 int n_blocks) {
    const int bs = 16, kvd = wc->nkv * wc->hd, qd = wc->nh * wc->hd;
    zi_attn_shape s = {wc->nh,     wc->nkv,    wc->hd, bs, 2048, 1.0f / sqrtf((float)wc->hd),
                       wc->window, wc->softcap, NULL, 0, 0};
    zi_error err = {0};
    assert_int_equal(be->ops->reserve(be, WA_MAXQ, 4096, 2048, &err), ZI_OK);
    float sink_h[64], *dsinks = NULL;
    if (wc->sinks) {
        for (int h = 0; h < wc->nh; h++) sink_h[h] = wa_sink(h);
        s.sinks = dsinks = put(be, sink_h, (size_t)wc->nh);
    }
    size_t pool = (size_t)n_blocks * bs * kvd;
    float *kc = put(be, NULL, pool), *vc = put(be, NULL, pool);
    int32_t pos[64], seq[64];
    float *dk = put(be, NULL, 64 * (size_t)kvd), *dv = put(be, NULL, 64 * (size_t)kvd);
    for (int sq = 0; sq < WA_SEQS; sq++)
        for (int p0 = 0; p0 < wa_lens[sq]; p0 += 64) {
            int m = wa_lens[sq] - p0 < 64 ? wa_lens[sq] - p0 : 64;
            for (int i = 0; i < m; i++) pos[i] = p0 + i, seq[i] = sq;
            be->ops->upload(be, dk, k + wa_row(sq, p0, kvd), (size_t)m * kvd * sizeof(float));
            be->ops->upload(be, dv, v + wa_row(sq, p0, kvd), (size_t)m * kvd * sizeof(float));
            zi_batch_view bv = {m, pos, seq, tables, stride, NULL};
            be->ops->kv_store(be, kc, vc, dk, dv, &bv, &s);
        }
    float *dq = put(be, q, (size_t)WA_MAXQ * qd), *dout = put(be, NULL, (size_t)WA_MAXQ * qd);
    size_t done = 0;
    for (int which = 0; which < WA_BATCHES; which++) {
        int32_t qp[WA_MAXQ], qs[WA_MAXQ], qw[WA_MAXQ];
        int nq = wa_batch(which, qp, qs, qw);
        zi_batch_view bv = {nq, qp, qs, tables, stride, which == 2 ? qw : NULL};
        be->ops->attention(be, dout, dq, kc, vc, &bv, &s);
        get(be, out + done, dout, (size_t)nq * qd);
        done += (size_t)nq * qd;
    }
    float *bufs[] = {kc, vc, dk, dv, dq, dout, dsinks};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->ops->free(be, bufs[i]);
}

/* The double-precision reference of the same batches. */
static void window_reference(const wa_case *wc, const float *k, const float *v, const float *q,
                             double *out) {
    const int kvd = wc->nkv * wc->hd, hd = wc->hd;
    const double scale = 1.0f / sqrtf((float)hd); /* the float the backends get */
    double *sc = malloc(sizeof(double) * 2048);
    size_t done = 0;
    for (int which = 0; which < WA_BATCHES; which++) {
        int32_t qp[WA_MAXQ], qs[WA_MAXQ], qw[WA_MAXQ];
        int nq = wa_batch(which, qp, qs, qw);
        for (int t = 0; t < nq; t++)
            for (int h = 0; h < wc->nh; h++) {
                const int kvh = h / (wc->nh / wc->nkv), p = qp[t], w = qw[t];
                const int start = wc->window > 0 && w >= wc->window ? w - wc->window + 1 : 0;
                const float *qr = q + ((size_t)t * wc->nh + h) * hd;
                double mx = -INFINITY, sum = 0;
                for (int j = start; j <= p; j++) {
                    const float *kr = k + wa_row(qs[t], j, kvd) + (size_t)kvh * hd;
                    double d = 0;
                    for (int e = 0; e < hd; e++) d += (double)qr[e] * kr[e];
                    sc[j] = d * scale;
                    if (wc->softcap > 0) sc[j] = wc->softcap * tanh(sc[j] / wc->softcap);
                    if (sc[j] > mx) mx = sc[j];
                }
                for (int j = start; j <= p; j++) sum += sc[j] = exp(sc[j] - mx);
                if (wc->sinks) sum += exp((double)wa_sink(h) - mx);
                double *o = out + done + ((size_t)t * wc->nh + h) * hd;
                for (int e = 0; e < hd; e++) o[e] = 0;
                for (int j = start; j <= p; j++) {
                    const float *vr = v + wa_row(qs[t], j, kvd) + (size_t)kvh * hd;
                    for (int e = 0; e < hd; e++) o[e] += sc[j] / sum * vr[e];
                }
            }
        done += (size_t)nq * wc->nh * hd;
    }
    free(sc);
}

static double rel_err_d(const float *a, const double *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (e > d || e != e) d = e;
        if (fabs(b[i]) > m) m = fabs(b[i]);
    }
    return d / m;
}

static void test_attention_window(void **state) {
    (void)state;
    const int bs = 16, stride = 128, n_blocks = 128;
    /* blocks: 3 + 5 + 94 = 102 of 128, in a shuffled order */
    int32_t perm[128], tables[WA_SEQS * 128];
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(urand() * (i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int next = 0;
    for (int s = 0; s < WA_SEQS; s++) {
        int need = (wa_lens[s] + bs - 1) / bs;
        for (int j = 0; j < stride; j++) tables[s * stride + j] = j < need ? perm[next++] : -1;
    }
    const wa_case shapes[] = {{8, 2, 64, 0, 0, 0}, {4, 1, 256, 0, 0, 0}};
    /* (window, soft-cap, sinks): cases 7-8 cap scores of about +-0.7 at
     * 0.5; the last two add sinks (gpt-oss: all positions, and a window
     * of 128) */
    const int windows[] = {0, 1, 3, 17, 700, 5000, 0, 17, 0, 128};
    const float caps[] = {0, 0, 0, 0, 0, 0, 0.5f, 0.5f, 0, 0};
    const int sinks[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        wa_case wc = shapes[si];
        const int kvd = wc.nkv * wc.hd, qd = wc.nh * wc.hd;
        size_t rows = (size_t)wa_lens[0] + wa_lens[1] + wa_lens[2];
        float *k = malloc(rows * kvd * sizeof(float)), *v = frandom(rows * kvd, -1, 1);
        for (size_t r = 0; r < rows * (size_t)wc.nkv; r++) {
            float *kr = k + r * (size_t)wc.hd;
            for (int e = 0; e < wc.hd; e++) kr[e] = (float)((int)(urand() * 65535) - 32767) / 32767;
            kr[(int)(urand() * wc.hd)] = urand() < 0.5 ? -1.0f : 1.0f; /* the row's max |k| */
        }
        for (size_t i = 0; i < rows * kvd; i++) v[i] = zi_f16_to_f32(zi_f32_to_f16(v[i]));
        float *q = frandom((size_t)WA_MAXQ * qd, -2, 2);
        size_t nout = (size_t)(wa_lens[1] + 7 + 3 + 64) * qd;
        float *oc = malloc(nout * sizeof(float)), *og = malloc(nout * sizeof(float));
        float *og0 = malloc(nout * sizeof(float));
        double *ref = malloc(nout * sizeof(double));
        for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
            wc.window = windows[wi];
            wc.softcap = caps[wi];
            wc.sinks = sinks[wi];
            run_window_attention(g_cpu, &wc, k, v, q, oc, tables, stride, n_blocks);
            run_window_attention(g_gpu, &wc, k, v, q, og, tables, stride, n_blocks);
            check_status();
            window_reference(&wc, k, v, q, ref);
            double eg = rel_err_d(og, ref, nout), ec = rel_err_d(oc, ref, nout);
            double e = rel_err(og, oc, nout);
            print_message("attention %d heads (%d KV) of %d, window %d, softcap %g, sinks %d: rel "
                          "err GPU vs double %.2e, CPU vs double %.2e, GPU vs CPU %.2e\n",
                          wc.nh, wc.nkv, wc.hd, wc.window, wc.softcap, wc.sinks, eg, ec, e);
            assert_true(eg < 1e-5);
            assert_true(e < 2e-5);
            if (wc.window == 0 && wc.softcap == 0 && !wc.sinks)
                memcpy(og0, og, nout * sizeof(float));
            /* a window past the context reads what no window reads: the
             * same positions, the same split, the same floats */
            if (wc.window == 5000) assert_memory_equal(og, og0, nout * sizeof(float));
            /* the cap changed the result (not silently ignored) */
            if (wc.softcap > 0 && wc.window == 0) assert_true(rel_err(og, og0, nout) > 1e-3);
            /* and so did the sinks */
            if (wc.sinks && wc.window == 0) assert_true(rel_err(og, og0, nout) > 1e-3);
        }
        free(k);
        free(v);
        free(q);
        free(oc);
        free(og);
        free(og0);
        free(ref);
    }
}

/* add_bias (qwen2's Q/K/V and output biases) against the CPU backend:
 * one float add per element, so equal bits; and the qwen2, qwen3 and
 * gemma2 rows load on CUDA (every op and capability they ask for). */
static void test_family_bias_ops(void **state) {
    (void)state;
    zi_error err = {0};
    const char *fams[] = {"qwen2", "qwen3", "gemma2"};
    for (int i = 0; i < 3; i++) {
        const zi_family *f = zi_family_find(fams[i], strlen(fams[i]));
        assert_non_null(f);
        if (zi_family_check_backend(f, g_gpu, 1, 1, 1, 1, 0, &err))
            fail_msg("%s on CUDA: %s", fams[i], err.msg);
    }
    zi_backend *bes[2] = {g_cpu, g_gpu};
    const int shapes[][2] = {{1, 896}, {7, 128}, {300, 64}, {5, 151936}, {3, 1}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int rows = shapes[si][0], dim = shapes[si][1];
        size_t n = (size_t)rows * dim;
        float *x = frandom(n, -10, 10), *b = frandom((size_t)dim, -3, 3);
        float *o[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
        for (int k = 0; k < 2; k++) {
            float *d = put(bes[k], x, n), *db = put(bes[k], b, (size_t)dim);
            bes[k]->ops->add_bias(bes[k], d, db, rows, dim);
            get(bes[k], o[k], d, n);
            bes[k]->ops->free(bes[k], d);
            bes[k]->ops->free(bes[k], db);
        }
        check_status();
        assert_memory_equal(o[0], o[1], n * sizeof(float));
        for (size_t i = 0; i < n; i++) assert_true(o[0][i] == x[i] + b[i % (size_t)dim]);
        free(x), free(b), free(o[0]), free(o[1]);
    }
}

/* One adapter's A ([rank][cols]) and B transposed ([rank][rows]) as the
 * lora op takes them, of `type` (F32 or F16), on be; the float values in
 * *ah / *bh (rounded to fp16 for F16) for the reference. */
static void lora_put(zi_backend *be, int type, int rank, int rows, int cols, const float *ah,
                     const float *bh, void **a, void **bt) {
    const size_t na = (size_t)rank * cols, nb = (size_t)rank * rows;
    const size_t es = type == ZI_TYPE_F16 ? 2 : 4;
    *a = be->ops->alloc(be, na * es);
    *bt = be->ops->alloc(be, nb * es);
    assert_non_null(*a);
    assert_non_null(*bt);
    if (type == ZI_TYPE_F16) {
        uint16_t *h = malloc((na > nb ? na : nb) * 2);
        for (size_t i = 0; i < na; i++) h[i] = zi_f32_to_f16(ah[i]);
        be->ops->upload(be, *a, h, na * 2);
        for (size_t i = 0; i < nb; i++) h[i] = zi_f32_to_f16(bh[i]);
        be->ops->upload(be, *bt, h, nb * 2);
        free(h);
    } else {
        be->ops->upload(be, *a, ah, na * 4);
        be->ops->upload(be, *bt, bh, nb * 4);
    }
}

/* The lora op (backend.h) on CUDA against the CPU's and a double
 * reference: y[t] = y0[t] + B (s A x[t]) for the tokens with an adapter,
 * y0 untouched for the others; two adapters (rank 8 float32 and rank 37
 * fp16) mixed token by token, sizes that are not multiples of a warp. A
 * token's output is the same bits alone as in the batch. */
static void test_lora(void **state) {
    (void)state;
    const int rows = 333, cols = 577, T = 11;
    const int ranks[2] = {8, 37}, types[2] = {ZI_TYPE_F32, ZI_TYPE_F16};
    const float scales[2] = {0.75f, -2.0f};
    float *ah[2], *bh[2];
    void *a[2][2], *bt[2][2]; /* [backend][adapter] */
    zi_backend *bes[2] = {g_cpu, g_gpu};
    for (int k = 0; k < 2; k++) {
        ah[k] = frandom((size_t)ranks[k] * cols, -0.1f, 0.1f);
        bh[k] = frandom((size_t)ranks[k] * rows, -0.1f, 0.1f);
        if (types[k] == ZI_TYPE_F16) {
            for (size_t i = 0; i < (size_t)ranks[k] * cols; i++)
                ah[k][i] = zi_f16_to_f32(zi_f32_to_f16(ah[k][i]));
            for (size_t i = 0; i < (size_t)ranks[k] * rows; i++)
                bh[k][i] = zi_f16_to_f32(zi_f32_to_f16(bh[k][i]));
        }
        for (int b = 0; b < 2; b++)
            lora_put(bes[b], types[k], ranks[k], rows, cols, ah[k], bh[k], &a[b][k], &bt[b][k]);
    }
    /* token t: adapter t % 3 (2: none) */
    float *x = frandom((size_t)T * cols, -1, 1), *y0 = frandom((size_t)T * rows, -1, 1);
    float *out[2], *ref = malloc((size_t)T * rows * sizeof(float));
    zi_lora_row r[2][11];
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < T; t++) {
            const int k = t % 3;
            r[b][t] = k == 2 ? (zi_lora_row){0}
                             : (zi_lora_row){.a = a[b][k],
                                             .bt = bt[b][k],
                                             .type = types[k],
                                             .rank = ranks[k],
                                             .scale = scales[k]};
        }
    for (int t = 0; t < T; t++) {
        const int k = t % 3;
        for (int i = 0; i < rows; i++) {
            double acc = y0[(size_t)t * rows + i];
            for (int q = 0; k < 2 && q < ranks[k]; q++) {
                double c = 0;
                for (int j = 0; j < cols; j++)
                    c += (double)ah[k][(size_t)q * cols + j] * x[(size_t)t * cols + j];
                acc += scales[k] * c * bh[k][(size_t)q * rows + i];
            }
            ref[(size_t)t * rows + i] = (float)acc;
        }
    }
    for (int b = 0; b < 2; b++) {
        out[b] = malloc((size_t)T * rows * sizeof(float));
        float *dx = put(bes[b], x, (size_t)T * cols), *dy = put(bes[b], y0, (size_t)T * rows);
        bes[b]->ops->lora(bes[b], dy, dx, T, rows, cols, r[b]);
        get(bes[b], out[b], dy, (size_t)T * rows);
        check_status();
        bes[b]->ops->free(bes[b], dx);
        bes[b]->ops->free(bes[b], dy);
    }
    double e_ref = rel_err(out[1], ref, (size_t)T * rows);
    double e_cpu = rel_err(out[1], out[0], (size_t)T * rows);
    print_message("lora: max rel err vs double %.2e, vs cpu %.2e\n", e_ref, e_cpu);
    assert_true(e_ref < 1e-5);
    assert_true(e_cpu < 1e-5);
    for (int t = 2; t < T; t += 3) /* no adapter: y untouched */
        assert_memory_equal(out[1] + (size_t)t * rows, y0 + (size_t)t * rows, rows * sizeof(float));
    /* batch invariance: token 4 alone gives the same bits */
    float *one = malloc((size_t)rows * sizeof(float));
    float *dx = put(g_gpu, x + (size_t)4 * cols, (size_t)cols);
    float *dy = put(g_gpu, y0 + (size_t)4 * rows, (size_t)rows);
    g_gpu->ops->lora(g_gpu, dy, dx, 1, rows, cols, &r[1][4]);
    get(g_gpu, one, dy, (size_t)rows);
    check_status();
    assert_memory_equal(one, out[1] + (size_t)4 * rows, rows * sizeof(float));
    g_gpu->ops->free(g_gpu, dx);
    g_gpu->ops->free(g_gpu, dy);
    for (int k = 0; k < 2; k++) {
        for (int b = 0; b < 2; b++) {
            bes[b]->ops->free(bes[b], a[b][k]);
            bes[b]->ops->free(bes[b], bt[b][k]);
        }
        free(ah[k]), free(bh[k]);
    }
    free(one), free(x), free(y0), free(ref), free(out[0]), free(out[1]);
}

/* A bad id is an error with a message, and the backend says so. */
/* The hybrid families' ops (cuda_recurrent.h) against the CPU backend's:
 * the gates, gather, grouped RMSNorm, and the three recurrences over
 * sequences interleaved token by token in two calls (the states carried
 * between them, one sequence restarted at position 0); outputs and states
 * agree within float32 rounding. The three families then pass the CUDA
 * backend's op check. */
static void test_hybrid_ops(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *bes[2] = {g_cpu, g_gpu};
    const char *archs[] = {"lfm2", "qwen35", "granitehybrid"};
    for (int i = 0; i < 3; i++) {
        const zi_family *f = zi_family_find(archs[i], strlen(archs[i]));
        assert_non_null(f);
        if (zi_family_check_backend(f, g_gpu, 0, 0, 0, 0, 0, &err))
            fail_msg("%s on CUDA: %s", archs[i], err.msg);
    }
    assert_int_equal(g_gpu->ops->reserve(g_gpu, 64, 4096, 64, &err), ZI_OK);
    assert_int_equal(g_cpu->ops->reserve(g_cpu, 64, 4096, 64, &err), ZI_OK);
    /* element-wise: mul, silu, sigmoid_mul */
    enum { NE = 4097 };
    float *x = frandom(NE, -8, 8), *y = frandom(NE, -3, 3), *o[2][3];
    for (int k = 0; k < 2; k++) {
        zi_backend *be = bes[k];
        for (int j = 0; j < 3; j++) o[k][j] = malloc(NE * sizeof(float));
        float *dx = put(be, x, NE), *dy = put(be, y, NE);
        be->ops->mul(be, dx, dy, NE);
        get(be, o[k][0], dx, NE);
        be->ops->upload(be, dx, x, NE * sizeof(float));
        be->ops->silu(be, dx, NE);
        get(be, o[k][1], dx, NE);
        be->ops->upload(be, dx, x, NE * sizeof(float));
        be->ops->sigmoid_mul(be, dx, dy, NE);
        get(be, o[k][2], dx, NE);
        be->ops->free(be, dx), be->ops->free(be, dy);
    }
    check_status();
    for (int j = 0; j < 3; j++) {
        double e = rel_err(o[1][j], o[0][j], NE);
        print_message("hybrid element-wise op %d: rel err vs CPU %.2e\n", j, e);
        assert_true(e < 1e-6);
        free(o[0][j]), free(o[1][j]);
    }
    free(x), free(y);
    /* gather_rows (more indices than reserve's tokens) and rmsnorm_groups */
    {
        enum { ROWS = 50, DIM = 96, NI = 200, T = 5, G = 4 };
        float *src = frandom(ROWS * DIM, -2, 2), *w = frandom(DIM, 0.5f, 1.5f), *go[2], *no[2];
        int32_t idx[NI];
        for (int i = 0; i < NI; i++) idx[i] = (int32_t)((i * 7 + 3) % ROWS);
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            go[k] = malloc(sizeof(float) * NI * DIM), no[k] = malloc(sizeof(float) * T * DIM);
            float *ds = put(be, src, ROWS * DIM), *dg = put(be, NULL, NI * DIM),
                  *dw = put(be, w, DIM);
            be->ops->gather_rows(be, dg, ds, idx, NI, DIM);
            get(be, go[k], dg, NI * DIM);
            be->ops->rmsnorm_groups(be, ds, ds, dw, T, DIM, G, 1e-6f); /* in place */
            get(be, no[k], ds, T * DIM);
            be->ops->free(be, ds), be->ops->free(be, dg), be->ops->free(be, dw);
        }
        check_status();
        assert_memory_equal(go[0], go[1], sizeof(float) * NI * DIM);
        double e = rel_err(no[1], no[0], T * DIM);
        print_message("rmsnorm_groups: rel err vs CPU %.2e\n", e);
        assert_true(e < 1e-6);
        free(src), free(w), free(go[0]), free(go[1]), free(no[0]), free(no[1]);
    }
    /* the recurrences: 17 tokens of 3 sequences interleaved, in calls of
     * 10 and 7 tokens; sequence 1 starts over at token 12 */
    enum { N = 17, S = 3 };
    int32_t slot[N], pos[N], len[S] = {0, 0, 0};
    for (int i = 0; i < N; i++) {
        slot[i] = i % S;
        if (i == 12) len[1] = 0;
        pos[i] = len[slot[i]]++;
    }
    const int cut[3] = {0, 10, N};
    { /* conv_state, K = 4, 300 channels */
        enum { K = 4, C = 300 };
        float *xi = frandom(N * C, -2, 2), *w = frandom(C * K, -1, 1), *out[2], *st[2];
        const size_t ns = (size_t)S * (K - 1) * C;
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            out[k] = malloc(sizeof(float) * N * C), st[k] = malloc(sizeof(float) * ns);
            float *dx = put(be, xi, N * C), *dy = put(be, NULL, N * C), *dw = put(be, w, C * K),
                  *ds = put(be, NULL, ns);
            for (int c = 0; c < 2; c++) {
                const int a = cut[c], n = cut[c + 1] - a;
                be->ops->conv_state(be, dy + (size_t)a * C, dx + (size_t)a * C, dw, K, C, ds,
                                    slot + a, pos + a, n);
            }
            get(be, out[k], dy, N * C);
            get(be, st[k], ds, ns);
            be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dw);
            be->ops->free(be, ds);
        }
        check_status();
        double e = rel_err(out[1], out[0], N * C), es = rel_err(st[1], st[0], ns);
        print_message("conv_state: rel err vs CPU %.2e, states %.2e\n", e, es);
        assert_true(e < 1e-6 && es == 0.0);
        free(xi), free(w), free(out[0]), free(out[1]), free(st[0]), free(st[1]);
    }
    { /* delta_net: 2 key heads, 4 value heads of 128 */
        enum { NK = 2, NV = 4, D = 128 };
        const size_t row = (size_t)(2 * NK + NV) * D, ns = (size_t)S * NV * D * D;
        float *qkv = frandom(N * row, -1, 1), *b = frandom(N * NV, -3, 3),
              *al = frandom(N * NV, -4, 2), *dtb = frandom(NV, -1, 1), *av = frandom(NV, -2, -0.1f);
        float *out[2], *st[2];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            out[k] = malloc(sizeof(float) * N * NV * D), st[k] = malloc(sizeof(float) * ns);
            float *dq = put(be, qkv, N * row), *db = put(be, b, N * NV), *da = put(be, al, N * NV),
                  *dt = put(be, dtb, NV), *dav = put(be, av, NV), *dy = put(be, NULL, N * NV * D),
                  *ds = put(be, NULL, ns);
            for (int c = 0; c < 2; c++) {
                const int a = cut[c], n = cut[c + 1] - a;
                be->ops->delta_net(be, dy + (size_t)a * NV * D, dq + (size_t)a * row,
                                   db + (size_t)a * NV, da + (size_t)a * NV, dt, dav, ds, slot + a,
                                   pos + a, n, NK, NV, D, 1e-6f);
            }
            get(be, out[k], dy, N * NV * D);
            get(be, st[k], ds, ns);
            float *fr[] = {dq, db, da, dt, dav, dy, ds};
            for (int j = 0; j < 7; j++) be->ops->free(be, fr[j]);
        }
        check_status();
        double e = rel_err(out[1], out[0], N * NV * D), es = rel_err(st[1], st[0], ns);
        print_message("delta_net: rel err vs CPU %.2e, states %.2e\n", e, es);
        assert_true(e < 1e-5 && es < 1e-5);
        free(qkv), free(b), free(al), free(dtb), free(av);
        free(out[0]), free(out[1]), free(st[0]), free(st[1]);
    }
    { /* ssm_scan: 6 heads of 64 reading 2 groups of 32 */
        enum { H = 6, P = 64, G = 2, NS = 32 };
        const size_t row = (size_t)H * P + 2 * G * NS, ns = (size_t)S * H * P * NS;
        float *xbc = frandom(N * row, -1, 1), *dt = frandom(N * H, -4, 2), *dtb = frandom(H, -1, 1),
              *av = frandom(H, -4, -0.5f), *dd = frandom(H, 0.5f, 1.5f);
        dt[5 * H + 1] = 25.0f; /* softplus past 20 */
        float *out[2], *st[2];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            out[k] = malloc(sizeof(float) * N * H * P), st[k] = malloc(sizeof(float) * ns);
            float *dx = put(be, xbc, N * row), *ddt = put(be, dt, N * H), *db = put(be, dtb, H),
                  *da = put(be, av, H), *dD = put(be, dd, H), *dy = put(be, NULL, N * H * P),
                  *ds = put(be, NULL, ns);
            for (int c = 0; c < 2; c++) {
                const int a = cut[c], n = cut[c + 1] - a;
                be->ops->ssm_scan(be, dy + (size_t)a * H * P, dx + (size_t)a * row,
                                  ddt + (size_t)a * H, db, da, dD, ds, slot + a, pos + a, n, H, P,
                                  G, NS);
            }
            get(be, out[k], dy, N * H * P);
            get(be, st[k], ds, ns);
            float *fr[] = {dx, ddt, db, da, dD, dy, ds};
            for (int j = 0; j < 7; j++) be->ops->free(be, fr[j]);
        }
        check_status();
        double e = rel_err(out[1], out[0], N * H * P), es = rel_err(st[1], st[0], ns);
        print_message("ssm_scan: rel err vs CPU %.2e, states %.2e\n", e, es);
        assert_true(e < 1e-5 && es < 1e-5);
        free(xbc), free(dt), free(dtb), free(av), free(dd);
        free(out[0]), free(out[1]), free(st[0]), free(st[1]);
    }
}

/* ---- the encoders' ops (cuda_vision.h) ---- */

/* LayerNorm (rows far from a zero mean too, in place and not), GELU and
 * weighted_sum_rows against the CPU backend's; the bert rows then pass
 * the CUDA backend's op check. LayerNorm's and the weighted sum's float
 * steps are the CPU's (no fused multiply-add): equal bits expected but
 * only float rounding of the double sums asserted. */
static void test_encoder_elementwise(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *bes[2] = {g_cpu, g_gpu};
    const char *fams[] = {"bert", "nomic-bert"};
    for (int i = 0; i < 2; i++) {
        const zi_family *f = zi_family_find(fams[i], strlen(fams[i]));
        assert_non_null(f);
        if (zi_family_check_backend(f, g_gpu, 0, 0, 0, 1, 0, &err))
            fail_msg("%s on CUDA: %s", fams[i], err.msg);
    }
    const int ln[][2] = {{1, 1152}, {7, 768}, {300, 64}, {5, 4099}, {64, 1152}, {3, 1}};
    for (size_t si = 0; si < sizeof ln / sizeof ln[0]; si++) {
        const int rows = ln[si][0], dim = ln[si][1];
        const size_t n = (size_t)rows * dim;
        float *x = frandom(n, -3, 3), *w = frandom((size_t)dim, 0.5f, 1.5f),
              *b = frandom((size_t)dim, -1, 1);
        if (si % 2)
            for (size_t i = 0; i < n; i++) x[i] += 50.0f; /* the mean dominates */
        float *o[2][2];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            o[k][0] = malloc(n * sizeof(float)), o[k][1] = malloc(n * sizeof(float));
            float *dx = put(be, x, n), *dy = put(be, NULL, n), *dw = put(be, w, (size_t)dim),
                  *db = put(be, b, (size_t)dim);
            be->ops->layernorm(be, dy, dx, dw, db, rows, dim, 1e-6f);
            get(be, o[k][0], dy, n);
            be->ops->layernorm(be, dx, dx, dw, db, rows, dim, 1e-5f); /* in place */
            get(be, o[k][1], dx, n);
            be->ops->free(be, dx), be->ops->free(be, dy), be->ops->free(be, dw);
            be->ops->free(be, db);
        }
        check_status();
        for (int j = 0; j < 2; j++) {
            size_t same = 0;
            for (size_t i = 0; i < n; i++) same += o[0][j][i] == o[1][j][i];
            double e = rel_err(o[1][j], o[0][j], n);
            print_message("layernorm %d rows of %d%s: rel err vs CPU %.2e, %zu/%zu equal\n", rows,
                          dim, j ? " (in place)" : "", e, same, n);
            assert_true(e < 1e-6);
            free(o[0][j]), free(o[1][j]);
        }
        free(x), free(w), free(b);
    }
    const size_t lens[] = {1, 17, 4097, 300 * 1152 + 5};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const size_t n = lens[li];
        float *x = frandom(n, -8, 8), *o[2];
        for (int k = 0; k < 2; k++) {
            o[k] = malloc(n * sizeof(float));
            float *d = put(bes[k], x, n);
            bes[k]->ops->gelu(bes[k], d, n);
            get(bes[k], o[k], d, n);
            bes[k]->ops->free(bes[k], d);
        }
        check_status();
        double e = rel_err(o[1], o[0], n);
        print_message("gelu over %zu: rel err vs CPU %.2e\n", n, e);
        assert_true(e < 1e-6);
        free(x), free(o[0]), free(o[1]);
    }
    /* weighted_sum_rows: gemma3's pooling (16 rows of a 8 x 8 grid each,
     * weights 1/16), a mixture's top-4 and single rows */
    const int ws[][4] = {{4, 16, 1152, 64}, {37, 4, 896, 50}, {9, 1, 100, 9}};
    for (size_t si = 0; si < sizeof ws / sizeof ws[0]; si++) {
        const int n_out = ws[si][0], k = ws[si][1], dim = ws[si][2], src_rows = ws[si][3];
        const size_t ny = (size_t)src_rows * dim, no = (size_t)n_out * dim, ni = (size_t)n_out * k;
        float *y = frandom(ny, -4, 4), *w = malloc(ni * sizeof(float)), *o[2];
        int32_t *idx = malloc(ni * sizeof(int32_t));
        for (size_t i = 0; i < ni; i++) {
            idx[i] = (int32_t)(urand() * src_rows) % src_rows;
            w[i] = si == 0 ? 1.0f / 16.0f : frand(0.0f, 1.0f);
        }
        for (int b = 0; b < 2; b++) {
            o[b] = malloc(no * sizeof(float));
            float *dy = put(bes[b], y, ny), *dout = put(bes[b], NULL, no);
            bes[b]->ops->weighted_sum_rows(bes[b], dout, dy, idx, w, n_out, k, dim);
            get(bes[b], o[b], dout, no);
            bes[b]->ops->free(bes[b], dy), bes[b]->ops->free(bes[b], dout);
        }
        check_status();
        size_t same = 0;
        for (size_t i = 0; i < no; i++) same += o[0][i] == o[1][i];
        double e = rel_err(o[1], o[0], no);
        print_message("weighted_sum_rows %d x %d rows of %d: rel err vs CPU %.2e, %zu/%zu equal\n",
                      n_out, k, dim, e, same, no);
        assert_true(e < 1e-6);
        free(y), free(w), free(idx), free(o[0]), free(o[1]);
    }
}

/* The speech codec decoder's ops (backend.h; the CPU's in cpu_audio.c)
 * against the CPU backend's on random inputs: conv1d (with and without a
 * bias, K of 1, 3 and 7, a frame shorter than the kernel), conv1d_dw,
 * group_norm out of place and in place, and istft for WavTokenizer's
 * shape and small n_fft of radix 2, 3, 5 and 7 (the CPU's direct path).
 * conv1d's tap sums are the CPU's float32 dot products summed in double
 * here: within float rounding; the rest double or the same float steps. */
static void test_audio_ops_vs_cpu(void **state) {
    (void)state;
    zi_backend *bes[2] = {g_cpu, g_gpu};
    assert_non_null(g_gpu->ops->conv1d);
    assert_non_null(g_gpu->ops->conv1d_dw);
    assert_non_null(g_gpu->ops->group_norm);
    assert_non_null(g_gpu->ops->istft);
    const int cv[][5] = {{1, 8, 5, 7, 1},
                         {37, 64, 48, 7, 1},
                         {100, 96, 96, 3, 0},
                         {13, 17, 33, 1, 1},
                         {4, 512, 768, 7, 1}};
    for (size_t si = 0; si < sizeof cv / sizeof cv[0]; si++) {
        const int n = cv[si][0], cin = cv[si][1], cout = cv[si][2], K = cv[si][3];
        const size_t nx = (size_t)n * cin, ny = (size_t)n * cout, nw = (size_t)K * cout * cin;
        float *x = frandom(nx, -1, 1), *w = frandom(nw, -0.5f, 0.5f),
              *b = frandom((size_t)cout, -1, 1), *o[2];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            o[k] = malloc(ny * sizeof(float));
            float *dx = put(be, x, nx), *dw = put(be, w, nw), *db = put(be, b, (size_t)cout),
                  *dy = put(be, NULL, ny);
            be->ops->conv1d(be, dy, dx, dw, cv[si][4] ? db : NULL, n, cin, cout, K);
            get(be, o[k], dy, ny);
            be->ops->free(be, dx), be->ops->free(be, dw), be->ops->free(be, db);
            be->ops->free(be, dy);
        }
        check_status();
        double e = rel_err(o[1], o[0], ny);
        print_message("conv1d %d frames %d -> %d, K %d%s: rel err vs CPU %.2e\n", n, cin, cout, K,
                      cv[si][4] ? "" : " (no bias)", e);
        assert_true(e < 1e-5);
        free(x), free(w), free(b), free(o[0]), free(o[1]);
    }
    const int dw[][3] = {{50, 64, 7}, {1, 3, 7}, {9, 768, 3}, {200, 768, 7}};
    for (size_t si = 0; si < sizeof dw / sizeof dw[0]; si++) {
        const int n = dw[si][0], C = dw[si][1], K = dw[si][2];
        const size_t nx = (size_t)n * C;
        float *x = frandom(nx, -2, 2), *w = frandom((size_t)C * K, -1, 1),
              *b = frandom((size_t)C, -1, 1), *o[2];
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            o[k] = malloc(nx * sizeof(float));
            float *dx = put(be, x, nx), *dwt = put(be, w, (size_t)C * K),
                  *db = put(be, b, (size_t)C), *dy = put(be, NULL, nx);
            be->ops->conv1d_dw(be, dy, dx, dwt, db, n, C, K);
            get(be, o[k], dy, nx);
            be->ops->free(be, dx), be->ops->free(be, dwt), be->ops->free(be, db);
            be->ops->free(be, dy);
        }
        check_status();
        size_t same = 0;
        for (size_t i = 0; i < nx; i++) same += o[0][i] == o[1][i];
        double e = rel_err(o[1], o[0], nx);
        print_message("conv1d_dw %d frames of %d, K %d: rel err vs CPU %.2e, %zu/%zu equal\n", n, C,
                      K, e, same, nx);
        assert_true(e < 1e-6);
        free(x), free(w), free(b), free(o[0]), free(o[1]);
    }
    const int gn[][3] = {{37, 64, 32}, {100, 768, 1}, {1, 6, 3}, {75, 768, 32}};
    for (size_t si = 0; si < sizeof gn / sizeof gn[0]; si++) {
        const int n = gn[si][0], C = gn[si][1], G = gn[si][2];
        const size_t nx = (size_t)n * C;
        float *x = frandom(nx, -3, 3), *w = frandom((size_t)C, 0.5f, 1.5f),
              *b = frandom((size_t)C, -1, 1), *o[2][2];
        if (si % 2)
            for (size_t i = 0; i < nx; i++) x[i] += 20.0f; /* the mean dominates */
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            o[k][0] = malloc(nx * sizeof(float)), o[k][1] = malloc(nx * sizeof(float));
            float *dx = put(be, x, nx), *dwt = put(be, w, (size_t)C), *db = put(be, b, (size_t)C),
                  *dy = put(be, NULL, nx);
            be->ops->group_norm(be, dy, dx, dwt, db, n, C, G, 1e-6f);
            get(be, o[k][0], dy, nx);
            be->ops->group_norm(be, dx, dx, dwt, db, n, C, G, 1e-5f); /* in place */
            get(be, o[k][1], dx, nx);
            be->ops->free(be, dx), be->ops->free(be, dwt), be->ops->free(be, db);
            be->ops->free(be, dy);
        }
        check_status();
        for (int j = 0; j < 2; j++) {
            double e = rel_err(o[1][j], o[0][j], nx);
            print_message("group_norm %d frames of %d in %d groups%s: rel err vs CPU %.2e\n", n, C,
                          G, j ? " (in place)" : "", e);
            assert_true(e < 1e-6);
            free(o[0][j]), free(o[1][j]);
        }
        free(x), free(w), free(b);
    }
    const int is[][3] = {{20, 1280, 320}, {3, 16, 4}, {1, 8, 4}, {11, 30, 7}, {6, 14, 5}};
    for (size_t si = 0; si < sizeof is / sizeof is[0]; si++) {
        const int n = is[si][0], N = is[si][1], hop = is[si][2], H = N / 2 + 1;
        const size_t ns = (size_t)n * (N + 2), no = (size_t)n * hop, nf = (size_t)n * N;
        float *spec = malloc(ns * sizeof(float)), *o[2];
        for (int f = 0; f < n; f++)
            for (int m = 0; m < H; m++) {
                spec[(size_t)f * (N + 2) + m] = frand(-3, 5.5f); /* some clipped at 100 */
                spec[(size_t)f * (N + 2) + H + m] = frand(-3.2f, 3.2f);
            }
        for (int k = 0; k < 2; k++) {
            zi_backend *be = bes[k];
            o[k] = malloc(no * sizeof(float));
            float *ds = put(be, spec, ns), *dfr = put(be, NULL, nf), *dout = put(be, NULL, no);
            be->ops->istft(be, dout, ds, dfr, n, N, hop);
            get(be, o[k], dout, no);
            be->ops->free(be, ds), be->ops->free(be, dfr), be->ops->free(be, dout);
        }
        check_status();
        double e = rel_err(o[1], o[0], no);
        print_message("istft %d frames, n_fft %d, hop %d: rel err vs CPU %.2e\n", n, N, hop, e);
        assert_true(e < 1e-6);
        free(spec), free(o[0]), free(o[1]);
    }
}

/* span_attention against the CPU backend's: spans of 1 to 1024 rows whose
 * rows are shuffled through q/k/v (rows in no span stay untouched), GQA,
 * bidirectional and causal, heads of 32 to 600 dims (several slabs of
 * 128 and every accumulator width), on the exact (double) path and the
 * tile_precision (float32) one. */
static void test_span_attention_vs_cpu(void **state) {
    (void)state;
    zi_backend *bes[2] = {g_cpu, g_gpu};
    static const struct {
        int n_heads, n_kv, hd, causal, tile, n_spans, lens[6];
    } cases[] = {
        {4, 2, 64, 0, 0, 5, {1, 5, 17, 40, 100}},
        {4, 2, 64, 1, 0, 5, {1, 5, 17, 40, 100}},
        {2, 2, 72, 0, 0, 2, {300, 33}},
        {2, 1, 256, 1, 0, 2, {70, 3}},
        {1, 1, 600, 0, 0, 2, {50, 20}},
        {3, 3, 130, 0, 0, 1, {45}},
        {6, 2, 32, 1, 0, 3, {33, 16, 2}},
        {16, 16, 72, 0, 1, 1, {1024}},
        {2, 2, 64, 1, 1, 1, {200}},
        {4, 4, 64, 0, 1, 3, {64, 7, 130}},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = cases[ci].n_heads, KV = cases[ci].n_kv, hd = cases[ci].hd;
        const int n_spans = cases[ci].n_spans;
        int32_t starts[7] = {0};
        for (int r = 0; r < n_spans; r++) starts[r + 1] = starts[r] + cases[ci].lens[r];
        const int used = starts[n_spans], R = used + 3; /* three rows in no span */
        int32_t *order = malloc(sizeof(int32_t) * (size_t)R);
        for (int i = 0; i < R; i++) order[i] = i;
        for (int i = R - 1; i > 0; i--) { /* shuffled */
            int j = (int)(urand() * (i + 1)) % (i + 1);
            int32_t t = order[i];
            order[i] = order[j], order[j] = t;
        }
        const size_t nq = (size_t)R * H * hd, nkv = (size_t)R * KV * hd;
        float *q = frandom(nq, -2, 2), *k = frandom(nkv, -2, 2), *v = frandom(nkv, -1, 1), *o[2];
        zi_attn_shape s = {.n_heads = H,
                           .n_kv_heads = KV,
                           .head_dim = hd,
                           .block_size = 1,
                           .max_ctx = R,
                           .scale = 1.0f / sqrtf((float)hd),
                           .causal = cases[ci].causal,
                           .tile_precision = cases[ci].tile};
        for (int b = 0; b < 2; b++) {
            zi_backend *be = bes[b];
            o[b] = malloc(nq * sizeof(float));
            float *dq = put(be, q, nq), *dk = put(be, k, nkv), *dv = put(be, v, nkv),
                  *dout = put(be, NULL, nq);
            be->ops->span_attention(be, dout, dq, dk, dv, order, starts, n_spans, &s);
            get(be, o[b], dout, nq);
            be->ops->free(be, dq), be->ops->free(be, dk), be->ops->free(be, dv);
            be->ops->free(be, dout);
        }
        check_status();
        double e = rel_err(o[1], o[0], nq);
        print_message("span_attention %d spans (%d rows), %d heads of %d over %d, %s%s: rel err vs "
                      "CPU %.2e\n",
                      n_spans, used, H, hd, KV, cases[ci].causal ? "causal" : "bidirectional",
                      cases[ci].tile ? ", tile precision" : "", e);
        assert_true(e < (cases[ci].tile && !cases[ci].causal ? 2e-5 : 1e-6));
        for (int i = used; i < R; i++) /* untouched */
            for (int j = 0; j < H * hd; j++)
                assert_true(o[1][(size_t)order[i] * H * hd + j] == 0.0f);
        free(order), free(q), free(k), free(v), free(o[0]), free(o[1]);
    }
}

/* matmul_tile in float32 for every type against double arithmetic on the
 * dequantized weight (backend.h: within ~1e-5 of the sum of the terms'
 * magnitudes; the products' fp16 path would be ~1e-3 off), prepared ahead
 * or on first use, after and before products by matmul on the same weight
 * (its fp16 copy replaced by the float32 one, which matmul then leaves
 * alone); the fp16 bytes held return to where they were. */
static void test_matmul_tile(void **state) {
    (void)state;
    zi_error err = {0};
    const int rows = 200, cols = 256, tokens[] = {1, 9, 300};
    assert_int_equal(g_gpu->ops->reserve(g_gpu, 300, cols, 64, &err), ZI_OK);
    const size_t f16_before = zi_cuda_backend_f16_bytes(g_gpu);
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
        const int type = TYPES[ti];
        size_t rb;
        void *wd = make_rows(type, rows, cols, &rb);
        zi_gguf_tensor t = tensor("v.blk.0.ffn_up.weight", type, rows, cols, wd, rb);
        zi_weight w;
        assert_int_equal(g_gpu->ops->weight_init(g_gpu, &w, &t, &err), ZI_OK);
        double *wf = malloc(sizeof(double) * (size_t)rows * cols);
        float *row = malloc(sizeof(float) * (size_t)cols);
        for (int r = 0; r < rows; r++) {
            zi_dequantize_row(type, (const uint8_t *)wd + rb * (size_t)r, row, cols);
            for (int c = 0; c < cols; c++) wf[(size_t)r * cols + c] = row[c];
        }
        if (ti % 2) assert_int_equal(g_gpu->ops->weight_prepare_tile(g_gpu, &w, &err), ZI_OK);
        for (int pass = 0; pass < 3; pass++) {
            /* 0: matmul (its fp16 copy made), 1: matmul_tile, 2: matmul again */
            for (size_t ni = 0; ni < sizeof tokens / sizeof tokens[0]; ni++) {
                const int n = pass == 1 ? tokens[ni] : 64;
                if (pass != 1 && ni > 0) break;
                float *x = frandom((size_t)n * cols, -1, 1);
                float *dx = put(g_gpu, x, (size_t)n * cols),
                      *dy = put(g_gpu, NULL, (size_t)n * rows);
                if (pass == 1)
                    g_gpu->ops->matmul_tile(g_gpu, dy, &w, dx, n);
                else
                    g_gpu->ops->matmul(g_gpu, dy, &w, dx, n);
                float *y = malloc(sizeof(float) * (size_t)n * rows);
                get(g_gpu, y, dy, (size_t)n * rows);
                check_status();
                const double tol = pass == 1 ? 1e-5 : 3e-3;
                double worst = 0;
                for (int tk = 0; tk < n; tk++)
                    for (int r = 0; r < rows; r++) {
                        double ref = 0, mag = 0;
                        for (int c = 0; c < cols; c++) {
                            double p = wf[(size_t)r * cols + c] * x[(size_t)tk * cols + c];
                            ref += p, mag += fabs(p);
                        }
                        const double got = y[(size_t)tk * rows + r],
                                     e = fabs(got - ref) / (mag + 1e-30);
                        if (e > worst) worst = e;
                        if (!(fabs(got - ref) <= tol * mag + 1e-7))
                            fail_msg(
                                "%s, pass %d, %d tokens: y[%d][%d] = %.9g, want %.9g (|wx| %.3g)",
                                zi_ggml_type_name(type), pass, n, tk, r, got, ref, mag);
                    }
                if (pass == 1)
                    print_message("matmul_tile %s %dx%d, %d tokens: worst error / |wx| %.2e\n",
                                  zi_ggml_type_name(type), rows, cols, n, worst);
                g_gpu->ops->free(g_gpu, dx), g_gpu->ops->free(g_gpu, dy);
                free(x), free(y);
            }
        }
        g_gpu->ops->weight_free(g_gpu, &w);
        free(wf), free(row), free(wd);
    }
    assert_true(zi_cuda_backend_f16_bytes(g_gpu) == f16_before);
}

/* ---- an image tower end to end (model_worker/vision.h) ---- */

typedef struct mm_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[4];
    int type;
    void *data;
    size_t bytes;
} mm_tensor;

static void mm_add(mm_tensor *ts, int *n, const char *name, uint32_t n_dims, const uint64_t *ne,
                   int type, float fmax) {
    mm_tensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n_dims = n_dims, t->type = type;
    uint64_t elems = 1;
    for (uint32_t i = 0; i < 4; i++) t->ne[i] = i < n_dims ? ne[i] : 1, elems *= t->ne[i];
    if (type == ZI_TYPE_F16) { /* rows of ne[0] */
        size_t rb;
        t->data = zi_test_make_rows(&rng, ZI_TYPE_F16, (int)(elems / ne[0]), (int)ne[0], fmax, &rb);
        assert_non_null(t->data);
        t->bytes = rb * (size_t)(elems / ne[0]);
    } else { /* norms near 1 (fmax < 0: 1 +- |fmax|), else +- fmax */
        float *f = malloc(elems * sizeof(float));
        for (uint64_t i = 0; i < elems; i++)
            f[i] = fmax < 0 ? 1.0f + frand(fmax, -fmax) : frand(-fmax, fmax);
        t->data = f, t->bytes = elems * sizeof(float);
    }
}

/* A random-weight projector of the kind's layout (tests/e2e/vision_files.py
 * writes the real widths; these are small), written to path: patch
 * embedding F32, matrices F16, norms and biases F32. */
static void write_projector(const char *path, const char *kind, int image, int patch, int E, int F,
                            int heads, int layers, int merge, int lm_dim) {
    enum { MAXT = 64 };
    mm_tensor ts[MAXT];
    int nt = 0;
    const int np = (image / patch) * (image / patch);
    const float inv = 1.7f / sqrtf((float)E), invf = 1.7f / sqrtf((float)F);
    char name[64];
    mm_add(ts, &nt, "v.patch_embd.weight", 4,
           (const uint64_t[]){(uint64_t)patch, (uint64_t)patch, 3, (uint64_t)E}, ZI_TYPE_F32,
           1.7f / sqrtf(3.0f * patch * patch));
    mm_add(ts, &nt, "v.patch_embd.bias", 1, (const uint64_t[]){(uint64_t)E}, ZI_TYPE_F32, 0.05f);
    mm_add(ts, &nt, "v.position_embd.weight", 2, (const uint64_t[]){(uint64_t)E, (uint64_t)np},
           ZI_TYPE_F32, 0.5f);
    for (int l = 0; l < layers; l++) {
        const char *mats[] = {"attn_q", "attn_k", "attn_v", "attn_out", "ffn_up", "ffn_down"};
        for (int i = 0; i < 6; i++) {
            const uint64_t cols = i == 5 ? (uint64_t)F : (uint64_t)E;
            const uint64_t rows = i == 4 ? (uint64_t)F : (uint64_t)E;
            snprintf(name, sizeof name, "v.blk.%d.%s.weight", l, mats[i]);
            mm_add(ts, &nt, name, 2, (const uint64_t[]){cols, rows}, ZI_TYPE_F16,
                   i == 5 ? invf : inv);
            snprintf(name, sizeof name, "v.blk.%d.%s.bias", l, mats[i]);
            mm_add(ts, &nt, name, 1, (const uint64_t[]){rows}, ZI_TYPE_F32, 0.05f);
        }
        const char *norms[] = {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "v.blk.%d.%s", l, norms[i]);
            mm_add(ts, &nt, name, 1, (const uint64_t[]){(uint64_t)E}, ZI_TYPE_F32,
                   i % 2 ? 0.05f : -0.1f);
        }
    }
    mm_add(ts, &nt, "v.post_ln.weight", 1, (const uint64_t[]){(uint64_t)E}, ZI_TYPE_F32, -0.1f);
    mm_add(ts, &nt, "v.post_ln.bias", 1, (const uint64_t[]){(uint64_t)E}, ZI_TYPE_F32, 0.05f);
    const int gemma = strcmp(kind, "gemma3") == 0;
    if (gemma) {
        mm_add(ts, &nt, "mm.soft_emb_norm.weight", 1, (const uint64_t[]){(uint64_t)E}, ZI_TYPE_F32,
               -0.3f);
        mm_add(ts, &nt, "mm.input_projection.weight", 2,
               (const uint64_t[]){(uint64_t)lm_dim, (uint64_t)E}, ZI_TYPE_F16, inv);
    } else {
        const uint64_t k = (uint64_t)E * merge * merge;
        mm_add(ts, &nt, "mm.model.fc.weight", 2, (const uint64_t[]){k, (uint64_t)lm_dim},
               ZI_TYPE_F16, 1.7f / sqrtf((float)k));
    }
    assert_true(nt <= MAXT);
    wbuf b = {0};
    w_header(&b, 3, (uint64_t)nt, 15);
    kv_str(&b, "general.architecture", "clip");
    kv_bool(&b, "clip.has_vision_encoder", 1);
    kv_str(&b, "clip.projector_type", kind);
    kv_bool(&b, "clip.use_gelu", 1);
    kv_u32(&b, "clip.vision.image_size", (uint32_t)image);
    kv_u32(&b, "clip.vision.patch_size", (uint32_t)patch);
    kv_u32(&b, "clip.vision.embedding_length", (uint32_t)E);
    kv_u32(&b, "clip.vision.feed_forward_length", (uint32_t)F);
    kv_u32(&b, "clip.vision.block_count", (uint32_t)layers);
    kv_u32(&b, "clip.vision.attention.head_count", (uint32_t)heads);
    const char *arrays[] = {"clip.vision.image_mean", "clip.vision.image_std"};
    for (int i = 0; i < 2; i++) {
        w_key(&b, arrays[i], ZI_GGUF_ARRAY);
        w_u32(&b, ZI_GGUF_FLOAT32);
        w_u64(&b, 3);
        for (int j = 0; j < 3; j++) w_f32(&b, 0.5f);
    }
    w_key(&b, "clip.vision.attention.layer_norm_epsilon", ZI_GGUF_FLOAT32);
    w_f32(&b, 1e-6f);
    kv_u32(&b, "clip.vision.projector.scale_factor", (uint32_t)merge);
    kv_u32(&b, "clip.vision.projection_dim", (uint32_t)lm_dim);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        w_tinfo(&b, ts[i].name, ts[i].n_dims, ts[i].ne, (uint32_t)ts[i].type, off);
        off += (ts[i].bytes + 31) / 32 * 32;
    }
    w_pad(&b, 32);
    for (int i = 0; i < nt; i++) {
        w_bytes(&b, ts[i].data, ts[i].bytes);
        w_pad(&b, 32);
        free(ts[i].data);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fwrite(b.p, 1, b.n, f) == b.n);
    assert_int_equal(fclose(f), 0);
    free(b.p);
}

/* Both projector kinds, small random towers (64 patches: several tiles of
 * span_attention's rows; gemma3's pooling by weighted_sum_rows, idefics3's
 * shuffle by gather_rows) loaded on the CPU and on CUDA: the same pixels
 * give the same soft tokens within float32 rounding (both backends run the
 * tower's float32 paths: tile products, tile-precision attention). */
static void test_vision_tower_vs_cpu(void **state) {
    (void)state;
    static const struct {
        const char *kind;
        int image, patch, E, F, heads, layers, merge, lm_dim;
    } towers[] = {
        {"gemma3", 112, 14, 144, 304, 2, 2, 4, 96},
        {"idefics3", 64, 8, 128, 256, 4, 2, 2, 64},
    };
    for (size_t ti = 0; ti < sizeof towers / sizeof towers[0]; ti++) {
        char path[96]; /* a new file, this process's own */
        snprintf(path, sizeof path, "/tmp/zinfer-gpu-mmproj-%d-%zu", (int)getpid(), ti);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        assert_true(fd >= 0);
        close(fd);
        write_projector(path, towers[ti].kind, towers[ti].image, towers[ti].patch, towers[ti].E,
                        towers[ti].F, towers[ti].heads, towers[ti].layers, towers[ti].merge,
                        towers[ti].lm_dim);
        zi_backend *bes[2] = {g_cpu, g_gpu};
        zi_vision *v[2] = {NULL, NULL};
        zi_error err = {0};
        for (int b = 0; b < 2; b++)
            if (zi_vision_load(path, bes[b], towers[ti].lm_dim, &v[b], &err))
                fail_msg("%s tower on %s: %s", towers[ti].kind, bes[b]->ops->name, err.msg);
        const zi_vision_config *c = zi_vision_get_config(v[0]);
        const size_t npx = (size_t)c->image_size * c->image_size * 3;
        const size_t nout = (size_t)c->n_tokens * c->lm_dim;
        float *px = frandom(npx, -1, 1),
              *o[2] = {malloc(nout * sizeof(float)), malloc(nout * sizeof(float))};
        for (int b = 0; b < 2; b++)
            if (zi_vision_encode(v[b], px, o[b], &err))
                fail_msg("%s tower on %s: encode: %s", towers[ti].kind, bes[b]->ops->name, err.msg);
        check_status();
        double worst_cos = 0;
        for (int t = 0; t < c->n_tokens; t++) {
            double ab = 0, aa = 0, bb = 0;
            for (int d = 0; d < c->lm_dim; d++) {
                const double a = o[0][(size_t)t * c->lm_dim + d],
                             g = o[1][(size_t)t * c->lm_dim + d];
                ab += a * g, aa += a * a, bb += g * g;
            }
            const double cd = 1.0 - ab / sqrt(aa * bb);
            if (cd > worst_cos) worst_cos = cd;
        }
        const double e = rel_err(o[1], o[0], nout);
        print_message("%s tower (%d patches, %d tokens of %d): rel err vs CPU %.2e, worst cosine "
                      "distance %.2e\n",
                      towers[ti].kind, c->n_patches, c->n_tokens, c->lm_dim, e, worst_cos);
        assert_true(e < 1e-4);
        assert_true(worst_cos < 1e-8);
        zi_vision_free(v[0]);
        zi_vision_free(v[1]);
        unlink(path);
        free(px), free(o[0]), free(o[1]);
    }
}

static void test_bad_id_reported(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *be = NULL;
    zi_cuda_options o = {.device = 0};
    assert_int_equal(zi_cuda_backend_create(&o, &be, &err), ZI_OK);
    size_t rb;
    void *wd = make_rows(ZI_TYPE_F16, 10, 64, &rb);
    zi_gguf_tensor t = tensor("token_embd.weight", ZI_TYPE_F16, 10, 64, wd, rb);
    zi_weight w;
    assert_int_equal(be->ops->weight_init(be, &w, &t, &err), ZI_OK);
    assert_int_equal(be->ops->reserve(be, 4, 64, 16, &err), ZI_OK);
    float *dy = put(be, NULL, 4 * 64);
    int32_t ids[2] = {3, 10};
    be->ops->get_rows(be, dy, &w, ids, 2);
    assert_int_equal(zi_cuda_backend_status(be, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "token id 10 at index 1"));
    be->ops->free(be, dy);
    be->ops->weight_free(be, &w);
    zi_backend_free(be);
    free(wd);
}

/* One layer of up to 4 tokens of sequence 0 on the GPU (gl_setup): its
 * weight, buffers, a shuffled block table and its shapes; gl_pass queues
 * its ops on the batch v (for zi_cuda_graph_capture too). */
typedef struct gl_ctx {
    zi_weight w;
    void *wd;
    float *x, *nw; /* host inputs */
    float *dx, *dn, *dh, *dq, *da, *kc, *vc;
    int32_t seq[4], tab[16];
    zi_batch_view v;
    zi_attn_shape s;
    int dim, nh, hd;
    const int32_t *pos2; /* non-NULL: rope a second time at these positions */
} gl_ctx;

static void gl_setup(gl_ctx *g) {
    zi_error err = {0};
    const int dim = 576, nh = 9, nkv = 3, hd = 64, kvd = nkv * hd, bs = 16;
    memset(g, 0, sizeof *g);
    size_t rb;
    g->wd = make_rows(ZI_TYPE_Q4_1, dim, dim, &rb);
    zi_gguf_tensor t = tensor("blk.0.attn_output.weight", ZI_TYPE_Q4_1, dim, dim, g->wd, rb);
    assert_int_equal(g_gpu->ops->weight_init(g_gpu, &g->w, &t, &err), ZI_OK);
    assert_int_equal(g_gpu->ops->reserve(g_gpu, 4, dim, 256, &err), ZI_OK);
    g->x = frandom((size_t)4 * dim, -1, 1);
    g->nw = frandom(dim, 0.5f, 1.5f);
    g->dx = put(g_gpu, g->x, (size_t)4 * dim);
    g->dn = put(g_gpu, g->nw, dim);
    g->dh = put(g_gpu, NULL, (size_t)4 * dim);
    g->dq = put(g_gpu, NULL, (size_t)4 * dim);
    g->da = put(g_gpu, NULL, (size_t)4 * nh * hd);
    g->kc = put(g_gpu, NULL, 16 * (size_t)bs * kvd);
    g->vc = put(g_gpu, NULL, 16 * (size_t)bs * kvd);
    for (int i = 0; i < 16; i++) g->tab[i] = (i * 7) % 16; /* a shuffled table */
    g->v = (zi_batch_view){4, NULL, g->seq, g->tab, 16, NULL};
    g->s = (zi_attn_shape){nh, nkv, hd, bs, 256, 0.125f, 0, 0, NULL, 0, 0};
    g->dim = dim;
    g->nh = nh;
    g->hd = hd;
}

static void gl_free(gl_ctx *g) {
    float *bufs[] = {g->dx, g->dn, g->dh, g->dq, g->da, g->kc, g->vc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) g_gpu->ops->free(g_gpu, bufs[i]);
    g_gpu->ops->weight_free(g_gpu, &g->w);
    free(g->wd);
    free(g->x);
    free(g->nw);
}

static int gl_pass(void *arg, zi_error *err) {
    (void)err;
    gl_ctx *g = arg;
    const int T = g->v.n_tokens;
    const zi_rope_freqs rp = {10000.0f, 1.0f, 1.0f, NULL, 0, 0, 0};
    g_gpu->ops->rmsnorm(g_gpu, g->dh, g->dx, g->dn, T, g->dim, 1e-5f);
    g_gpu->ops->matmul(g_gpu, g->dq, &g->w, g->dh, T);
    g_gpu->ops->rope(g_gpu, g->dq, g->v.pos, T, g->nh, g->hd, g->hd, &rp);
    if (g->pos2) g_gpu->ops->rope(g_gpu, g->dq, g->pos2, T, g->nh, g->hd, g->hd, &rp);
    g_gpu->ops->kv_store(g_gpu, g->kc, g->vc, g->dq, g->dq, &g->v, &g->s);
    g_gpu->ops->attention(g_gpu, g->da, g->dq, g->kc, g->vc, &g->v, &g->s);
    g_gpu->ops->add(g_gpu, g->da, g->dh, (size_t)T * g->dim);
    return ZI_OK;
}

/* Runs ctx's pass op by op (graph NULL) or from graph, at positions pos;
 * out gets its output. */
static void gl_run(gl_ctx *ctx, zi_cuda_graph *graph, const int32_t *pos, float *out) {
    zi_error err = {0};
    ctx->v.pos = pos;
    if (graph)
        assert_int_equal(zi_cuda_graph_launch(graph, NULL, &ctx->v, &ctx->s, &err), ZI_OK);
    else
        gl_pass(ctx, &err);
    get(g_gpu, out, ctx->da, (size_t)ctx->v.n_tokens * ctx->dim);
    check_status();
}

/* One layer's ops captured in a CUDA graph (the stream's own capture, not
 * zi_cuda_graph_capture) and replayed: the same results as eager
 * execution, so the ops allocate and synchronize nothing. */
static void test_graph_capture(void **state) {
    (void)state;
    gl_ctx g;
    gl_setup(&g);
    const int32_t pos[4] = {0, 1, 2, 3};
    float *eager = malloc(sizeof(float) * 4 * g.dim), *replay = malloc(sizeof(float) * 4 * g.dim);
    gl_run(&g, NULL, pos, eager); /* eager: also stages the batch's metadata */
    cudaStream_t st = (cudaStream_t)zi_cuda_backend_stream(g_gpu);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    zi_error err = {0};
    assert_int_equal(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    gl_pass(&g, &err);
    assert_int_equal(cudaStreamEndCapture(st, &graph), cudaSuccess);
    check_status();
    assert_int_equal(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    g_gpu->ops->upload(g_gpu, g.da, g.x, sizeof(float) * 4 * g.dim); /* scribble on the output */
    assert_int_equal(cudaGraphLaunch(exec, st), cudaSuccess);
    get(g_gpu, replay, g.da, (size_t)4 * g.dim);
    check_status();
    assert_memory_equal(eager, replay, sizeof(float) * 4 * g.dim);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    gl_free(&g);
    free(eager);
    free(replay);
}

/* Graphs of two shapes kept together, as the worker keeps them: launching
 * the first after the second was captured restages the first's own
 * metadata; a capture that fails (a slot staged twice with different
 * contents) leaves nothing staged that the next op-by-op pass would skip
 * copying; and a launch of the wrong shape is refused. */
static void test_graphs_interleaved(void **state) {
    (void)state;
    zi_error err = {0};
    gl_ctx a;
    gl_setup(&a);
    const int dim = a.dim;
    gl_ctx b = a; /* the same buffers, a 2-token batch */
    b.v.seq = b.seq;
    b.v.block_tables = b.tab;
    b.v.n_tokens = 2;
    const int32_t a1[4] = {0, 1, 2, 3}, b1[2] = {4, 5}, a2[4] = {6, 7, 8, 9};
    float *out = malloc(sizeof(float) * 4 * dim), *want = malloc(sizeof(float) * 4 * dim);
    gl_run(&a, NULL, a1, out); /* each shape once op by op: nothing allocates in a capture */
    gl_run(&b, NULL, b1, out);
    zi_cuda_graph *ga = NULL, *gb = NULL;
    a.v.pos = a1;
    assert_int_equal(zi_cuda_graph_capture(g_gpu, gl_pass, &a, &ga, &err), ZI_OK);
    gl_run(&a, ga, a1, out);
    b.v.pos = b1;
    assert_int_equal(zi_cuda_graph_capture(g_gpu, gl_pass, &b, &gb, &err), ZI_OK);
    gl_run(&b, gb, b1, out);
    /* the first graph again, at new positions, after the second's capture */
    gl_run(&a, ga, a2, out);
    gl_run(&a, NULL, a2, want);
    assert_memory_equal(out, want, sizeof(float) * 4 * dim);
    /* a wrong shape: refused, and nothing changed */
    assert_int_equal(zi_cuda_graph_launch(ga, NULL, &b.v, &b.s, &err), ZI_EINVAL);
    check_status();
    /* a failed capture staging a1 last, while the device holds a2's
     * positions; then op by op at a1, which must be copied again */
    gl_run(&a, NULL, a1, want);
    gl_run(&a, NULL, a2, out);
    zi_cuda_graph *bad = NULL;
    a.v.pos = a1;
    a.pos2 = a2;
    assert_int_equal(zi_cuda_graph_capture(g_gpu, gl_pass, &a, &bad, &err), ZI_EUNSUPPORTED);
    assert_null(bad);
    a.pos2 = NULL;
    check_status();
    gl_run(&a, NULL, a1, out);
    assert_memory_equal(out, want, sizeof(float) * 4 * dim);
    zi_cuda_graph_free(ga);
    zi_cuda_graph_free(gb);
    gl_free(&a);
    free(out);
    free(want);
}

/* ---- the real model ---- */

typedef struct model_pair {
    zi_model *cpu, *gpu;
    zi_tokenizer *tok;
} model_pair;

static model_pair g_models;

static int have_models(void) {
    if (quick()) {
        print_message("ZINFER_GPU_TEST_QUICK: model tests skipped\n");
        return 0;
    }
    if (!g_models.cpu) print_message("model not found: model tests skipped\n");
    return g_models.cpu != NULL;
}

/* logits [n][V] of ids (all positions) on model m, in a fresh cache */
static float *all_logits(zi_model *m, const int32_t *ids, int n) {
    int V = zi_model_get_config(m)->n_vocab;
    zi_kv_fixed kv;
    zi_error err = {0};
    assert_int_equal(zi_kv_fixed_create(m, 1, 512, &kv, &err), ZI_OK);
    int32_t *pos = malloc(sizeof(int32_t) * n), *seq = calloc((size_t)n, sizeof(int32_t));
    uint8_t *want = malloc((size_t)n);
    for (int i = 0; i < n; i++) pos[i] = i, want[i] = 1;
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    zi_batch b = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = seq, .want_logits = want};
    zi_kv_fixed_use(&kv, &b);
    int rc = zi_model_forward(m, kv.kv, &b, lg, &err);
    if (rc) fail_msg("forward: %s", err.msg);
    zi_kv_fixed_free(&kv);
    free(pos);
    free(seq);
    free(want);
    return lg;
}

static double kl(const float *p_logits, const float *q_logits, int V) {
    double mp = -INFINITY, mq = -INFINITY, zp = 0, zq = 0, d = 0;
    for (int i = 0; i < V; i++) {
        if (p_logits[i] > mp) mp = p_logits[i];
        if (q_logits[i] > mq) mq = q_logits[i];
    }
    for (int i = 0; i < V; i++) zp += exp(p_logits[i] - mp), zq += exp(q_logits[i] - mq);
    for (int i = 0; i < V; i++) {
        double lp = p_logits[i] - mp - log(zp), lq = q_logits[i] - mq - log(zq);
        d += exp(lp) * (lp - lq);
    }
    return d;
}

static void prompt_ids(int which, int32_t **ids, int *n) {
    static const char *texts[] = {
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "The quick brown fox jumps over the lazy dog. In 1905, Albert Einstein published four "
        "papers that changed physics: on the photoelectric effect, Brownian motion, special "
        "relativity and the equivalence of mass and energy.",
    };
    size_t m;
    zi_error err = {0};
    assert_int_equal(
        zi_tokenizer_encode(g_models.tok, texts[which], strlen(texts[which]), 1, 1, ids, &m, &err),
        ZI_OK);
    *n = (int)m;
}

static void test_model_logits_kl(void **state) {
    (void)state;
    if (!have_models()) skip();
    int V = zi_model_get_config(g_models.cpu)->n_vocab;
    double sum = 0, worst = 0;
    int count = 0;
    for (int p = 0; p < 3; p++) {
        int32_t *ids;
        int n;
        prompt_ids(p, &ids, &n);
        float *a = all_logits(g_models.cpu, ids, n), *b = all_logits(g_models.gpu, ids, n);
        check_status();
        for (int i = 0; i < n; i++) {
            double d = kl(a + (size_t)i * V, b + (size_t)i * V, V);
            sum += d;
            count++;
            if (d > worst) worst = d;
        }
        free(a);
        free(b);
        free(ids);
    }
    print_message("logits CUDA vs CPU: mean KL %.3g, max %.3g over %d positions\n", sum / count,
                  worst, count);
    assert_true(sum / count < 1e-3);
}

static int32_t argmax(const float *x, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* greedy continuation: prefill in one pass, then one token per pass */
static void greedy(zi_model *m, const int32_t *ids, int n, int gen, int32_t *out, float *gap) {
    int V = zi_model_get_config(m)->n_vocab;
    zi_kv_fixed kv;
    zi_error err = {0};
    assert_int_equal(zi_kv_fixed_create(m, 1, 512, &kv, &err), ZI_OK);
    int32_t pos[512], seq[512] = {0};
    for (int i = 0; i < n; i++) pos[i] = i;
    float *lg = malloc(sizeof(float) * V);
    zi_batch b = {.n_tokens = n, .tokens = ids, .pos = pos, .seq = seq};
    zi_kv_fixed_use(&kv, &b);
    assert_int_equal(zi_model_forward(m, kv.kv, &b, lg, &err), ZI_OK);
    for (int g = 0; g < gen; g++) {
        out[g] = argmax(lg, V);
        float best = lg[out[g]], second = -INFINITY;
        for (int i = 0; i < V; i++)
            if (i != out[g] && lg[i] > second) second = lg[i];
        gap[g] = best - second;
        int32_t p = n + g;
        zi_batch d = {.n_tokens = 1, .tokens = &out[g], .pos = &p, .seq = seq};
        zi_kv_fixed_use(&kv, &d);
        if (g + 1 < gen) assert_int_equal(zi_model_forward(m, kv.kv, &d, lg, &err), ZI_OK);
    }
    zi_kv_fixed_free(&kv);
    free(lg);
}

static void test_model_greedy_32(void **state) {
    (void)state;
    if (!have_models()) skip();
    for (int p = 0; p < 3; p++) {
        int32_t *ids, a[32], b[32];
        float ga[32], gb[32];
        int n;
        prompt_ids(p, &ids, &n);
        greedy(g_models.cpu, ids, n, 32, a, ga);
        greedy(g_models.gpu, ids, n, 32, b, gb);
        check_status();
        for (int i = 0; i < 32; i++)
            if (a[i] != b[i])
                fail_msg("prompt %d: token %d differs: CPU %d (gap %.4f), CUDA %d (gap %.4f)", p, i,
                         a[i], ga[i], b[i], gb[i]);
        free(ids);
    }
}

/* Four sequences decoding together give each one's logits alone. */
static void test_model_batched_decode(void **state) {
    (void)state;
    if (!have_models()) skip();
    zi_model *m = g_models.gpu;
    int V = zi_model_get_config(m)->n_vocab;
    zi_error err = {0};
    zi_kv_fixed kv;
    assert_int_equal(zi_kv_fixed_create(m, 4, 256, &kv, &err), ZI_OK);
    int32_t *ids[3];
    int n[3];
    for (int p = 0; p < 3; p++) prompt_ids(p, &ids[p], &n[p]);
    float *alone = malloc(sizeof(float) * 4 * V), *together = malloc(sizeof(float) * 4 * V);
    int32_t tok[4] = {42, 1000, 7, 999}, pos[4], seq[4] = {0, 1, 2, 3};
    /* prefill sequences 0..2 with the prompts and sequence 3 with prompt 0 again */
    for (int s = 0; s < 4; s++) {
        const int32_t *pi = ids[s % 3];
        int pn = n[s % 3];
        int32_t pp[512], ps[512];
        for (int i = 0; i < pn; i++) pp[i] = i, ps[i] = s;
        zi_batch b = {.n_tokens = pn, .tokens = pi, .pos = pp, .seq = ps};
        zi_kv_fixed_use(&kv, &b);
        assert_int_equal(zi_model_forward(m, kv.kv, &b, together, &err), ZI_OK);
        pos[s] = pn;
    }
    for (int s = 0; s < 4; s++) { /* alone: one token per pass */
        zi_batch b = {.n_tokens = 1, .tokens = &tok[s], .pos = &pos[s], .seq = &seq[s]};
        zi_kv_fixed_use(&kv, &b);
        assert_int_equal(zi_model_forward(m, kv.kv, &b, alone + (size_t)s * V, &err), ZI_OK);
    }
    uint8_t want[4] = {1, 1, 1, 1}; /* together: rewrite the same positions in one pass */
    zi_batch b = {.n_tokens = 4, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    zi_kv_fixed_use(&kv, &b);
    assert_int_equal(zi_model_forward(m, kv.kv, &b, together, &err), ZI_OK);
    check_status();
    double e = rel_err(together, alone, (size_t)4 * V);
    print_message("batched decode vs alone: rel err %.2e\n", e);
    assert_true(e < 1e-4);
    zi_kv_fixed_free(&kv);
    for (int p = 0; p < 3; p++) free(ids[p]);
    free(alone);
    free(together);
}

/* The row-split all-reduce through a real one-rank NCCL communicator. */
static void test_tp_nccl_one_rank(void **state) {
    (void)state;
    if (!have_models()) skip();
    if (!zi_tp_nccl_compiled()) {
        print_message("built without NCCL: skipped\n");
        skip();
    }
    zi_error err = {0};
    zi_tp *tp = NULL;
    zi_tp_options to = {.world_size = 1, .rank = 0, .device = 0, .force_nccl = 1};
    if (zi_tp_create(&to, &tp, &err)) fail_msg("%s", err.msg);
    assert_int_equal(zi_tp_uses_nccl(tp), 1);
    zi_backend *be = NULL;
    zi_cuda_options o = {.device = 0, .tp = tp};
    assert_int_equal(zi_cuda_backend_create(&o, &be, &err), ZI_OK);
    char path[4096];
    zi_default_model_path(path, sizeof path);
    zi_model *m = NULL;
    assert_int_equal(zi_model_load(path, be, &m, &err), ZI_OK);
    int32_t *ids;
    int n;
    prompt_ids(0, &ids, &n);
    float *a = all_logits(g_models.gpu, ids, n), *b = all_logits(m, ids, n);
    assert_int_equal(zi_cuda_backend_status(be, &err), ZI_OK);
    int V = zi_model_get_config(m)->n_vocab;
    /* a one-rank sum is the buffer itself; only cuBLAS's choice of
     * algorithm on another handle could move a last bit */
    double e = rel_err(b, a, (size_t)n * V);
    print_message("one-rank NCCL vs none: rel err %.2e\n", e);
    assert_true(e <= 1e-6);
    free(a);
    free(b);
    free(ids);
    zi_model_free(m);
    zi_backend_free(be);
    zi_tp_free(tp);
}

/* ---- the GPU sampler ---- */

static zi_sampling_params sparams(double t, int k, double p, double m, uint64_t seed) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.temperature = t;
    sp.top_k = k;
    sp.top_p = p;
    sp.min_p = m;
    sp.seed = seed;
    return sp;
}

/* Samples rows x steps of one logit row on the GPU (100 rows per call). */
static void gpu_draws(zi_cuda_sampler *s, const float *d_row, int V, const zi_sampling_params *sp,
                      int count, int32_t *out) {
    zi_error err = {0};
    zi_cuda_sample_row rows[100];
    for (int b = 0; b < count; b += 100) {
        int m = count - b < 100 ? count - b : 100;
        for (int r = 0; r < m; r++) rows[r].params = sp, rows[r].step = (uint64_t)(b + r);
        /* ld 0 is refused: each row is read from its own copy */
        if (zi_cuda_sampler_sample_async(s, d_row, (size_t)V, rows, m, &err))
            fail_msg("sample_async: %s", err.msg);
        const int32_t *tok;
        if (zi_cuda_sampler_wait(s, &tok, &err)) fail_msg("wait: %s", err.msg);
        memcpy(out + b, tok, sizeof(int32_t) * (size_t)m);
    }
}

static void test_sampler_vs_reference(void **state) {
    (void)state;
    enum { V = 49152, ROWS = 100 };
    zi_error err = {0};
    float *lg = malloc(sizeof(float) * V);
    for (int i = 0; i < V; i++) lg[i] = (float)((urand() * 2 - 1) * 6.0);
    /* ROWS copies, so row r is at d + r * V */
    float *rows = malloc(sizeof(float) * (size_t)V * ROWS);
    for (int r = 0; r < ROWS; r++) memcpy(rows + (size_t)r * V, lg, sizeof(float) * V);
    float *d = put(g_gpu, rows, (size_t)V * ROWS);
    zi_cuda_sampler *s = NULL;
    assert_int_equal(zi_cuda_sampler_create(g_gpu, V, ROWS, &s, &err), ZI_OK);
    struct {
        double t, p, m;
        int k;
    } cfg[] = {{0.0, 1, 0, 0},     {1.0, 1.0, 0.0, 0},  {0.7, 1.0, 0.0, 40},
               {1.0, 0.9, 0.0, 0}, {1.2, 1.0, 0.05, 0}, {0.9, 0.95, 0.02, 100}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        zi_sampling_params sp = sparams(cfg[c].t, cfg[c].k, cfg[c].p, cfg[c].m, 1234 + c);
        zi_cuda_sample_row rr[ROWS];
        for (int r = 0; r < ROWS; r++) rr[r].params = &sp, rr[r].step = (uint64_t)r;
        assert_int_equal(zi_cuda_sampler_sample_async(s, d, (size_t)V, rr, ROWS, &err), ZI_OK);
        const int32_t *tok;
        assert_int_equal(zi_cuda_sampler_wait(s, &tok, &err), ZI_OK);
        assert_true(zi_cuda_sampler_ready(s));
        int diff = 0;
        for (int r = 0; r < ROWS; r++) {
            zi_gpu_sample_params g;
            zi_gpu_sample_params_set(&g, &sp, (uint64_t)r, &err);
            if (tok[r] != zi_gpu_sample_ref(lg, V, &g)) diff++;
        }
        print_message("config %zu: %d of %d tokens differ from the reference\n", c, diff, ROWS);
        assert_true(diff <= 1); /* expf's last bits may move a boundary */
        zi_sampling_params_free(&sp);
    }
    zi_cuda_sampler_free(s);
    g_gpu->ops->free(g_gpu, d);
    free(lg);
    free(rows);
    check_status();
}

static void test_sampler_chi2(void **state) {
    (void)state;
    enum { NV = 50, NS = 8000 };
    zi_error err = {0};
    float lg[NV];
    for (int i = 0; i < NV; i++)
        lg[i] = (float)(2.0 * sin(1.3 * i + 0.5) + 1.5 * cos(0.37 * i) - 0.01 * i);
    float *rows = malloc(sizeof(float) * NV * 100);
    for (int r = 0; r < 100; r++) memcpy(rows + r * NV, lg, sizeof lg);
    float *d = put(g_gpu, rows, (size_t)NV * 100);
    zi_cuda_sampler *s = NULL;
    assert_int_equal(zi_cuda_sampler_create(g_gpu, NV, 100, &s, &err), ZI_OK);
    struct {
        double t, p, m;
        int k;
    } cfg[] = {{1.0, 1.0, 0.0, 0}, {0.7, 1.0, 0.0, 5}, {1.0, 0.8, 0.0, 0}, {1.3, 0.9, 0.02, 20}};
    static int32_t tok[NS];
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        zi_sampling_params sp = sparams(cfg[c].t, cfg[c].k, cfg[c].p, cfg[c].m, 99);
        gpu_draws(s, d, NV, &sp, NS, tok);
        /* the exact distribution: the reference's survivors, weights renormalised */
        zi_gpu_sample_params g;
        zi_gpu_sample_params_set(&g, &sp, 0, &err);
        uint8_t keep[NV];
        zi_gpu_sample_ref_survivors(lg, NV, &g, keep);
        float vmax = -INFINITY;
        for (int i = 0; i < NV; i++) vmax = lg[i] > vmax ? lg[i] : vmax;
        double p[NV], z = 0;
        for (int i = 0; i < NV; i++)
            z += p[i] = keep[i] ? zi_gs_weight(lg[i], vmax, (float)(1.0 / g.temperature)) : 0.0;
        long cnt[NV] = {0};
        for (int i = 0; i < NS; i++) {
            assert_true(tok[i] >= 0 && tok[i] < NV);
            if (!keep[tok[i]])
                fail_msg("config %zu drew token %d, which no filter keeps", c, tok[i]);
            cnt[tok[i]]++;
        }
        for (int i = 0; i < NV; i++) p[i] /= z;
        int df = 0;
        double stat = chi2(cnt, p, NV, NS, &df);
        assert_true(df >= 1 && df <= 60);
        print_message("config %zu: chi2 %.2f, df %d, critical %.2f\n", c, stat, df,
                      CHI2_999[df - 1]);
        assert_true(stat < CHI2_999[df - 1]);
        zi_sampling_params_free(&sp);
    }
    zi_cuda_sampler_free(s);
    g_gpu->ops->free(g_gpu, d);
    free(rows);
}

static void test_sampler_odd_rows(void **state) {
    (void)state;
    enum { NV = 8 };
    zi_error err = {0};
    float rows[3][NV] = {{1, 5, 5, NAN, -INFINITY, 2, 5, 0},
                         {NAN, -INFINITY, NAN, -INFINITY, NAN, NAN, -INFINITY, NAN},
                         {1, INFINITY, 3, INFINITY, NAN, 0, 0, 0}};
    float *d = put(g_gpu, &rows[0][0], 3 * NV);
    zi_cuda_sampler *s = NULL;
    assert_int_equal(zi_cuda_sampler_create(g_gpu, NV, 3, &s, &err), ZI_OK);
    zi_sampling_params greedy = sparams(0.0, 0, 1.0, 0.0, 1);
    zi_cuda_sample_row r[3] = {{&greedy, 0}, {&greedy, 0}, {&greedy, 0}};
    assert_int_equal(zi_cuda_sampler_sample_async(s, d, NV, r, 3, &err), ZI_OK);
    const int32_t *tok;
    assert_int_equal(zi_cuda_sampler_wait(s, &tok, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "row 1"));
    assert_int_equal(tok[0], 1); /* ties: the lowest id */
    assert_int_equal(tok[1], -1);
    assert_int_equal(tok[2], 1);
    zi_sampling_params pen = sparams(1.0, 0, 1.0, 0.0, 1);
    pen.repetition_penalty = 1.3;
    zi_cuda_sample_row rp = {&pen, 0};
    assert_int_equal(zi_cuda_sampler_sample_async(s, d, NV, &rp, 1, &err), ZI_EUNSUPPORTED);
    assert_int_equal(zi_cuda_sampler_sample_async(s, d, NV - 1, r, 1, &err), ZI_EINVAL);
    zi_cuda_sampler_free(s);
    g_gpu->ops->free(g_gpu, d);
    zi_sampling_params_free(&greedy);
    zi_sampling_params_free(&pen);
}

/* ---- setup ---- */

static int setup(void **state) {
    (void)state;
    zi_error err = {0};
    zi_cpu_options co = {0};
    if (zi_cpu_backend_create(&co, &g_cpu, &err)) {
        fprintf(stderr, "CPU backend: %s\n", err.msg);
        return -1;
    }
    zi_cuda_options o = {.device = 0};
    if (zi_cuda_backend_create(&o, &g_gpu, &err)) {
        fprintf(stderr, "CUDA backend: %s\n", err.msg);
        return -1;
    }
    char path[4096];
    zi_default_model_path(path, sizeof path);
    if (!quick() && access(path, R_OK) == 0) {
        if (zi_model_load(path, g_cpu, &g_models.cpu, &err) ||
            zi_model_load(path, g_gpu, &g_models.gpu, &err) ||
            zi_tokenizer_load(zi_model_gguf(g_models.cpu), &g_models.tok, &err)) {
            fprintf(stderr, "loading %s: %s\n", path, err.msg);
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    zi_tokenizer_free(g_models.tok);
    zi_model_free(g_models.cpu);
    zi_model_free(g_models.gpu);
    zi_backend_free(g_gpu);
    zi_backend_free(g_cpu);
    return 0;
}

int main(void) {
    int n = 0;
    zi_error err = {0};
    if (zi_cuda_device_count(&n, &err) != ZI_OK) {
        printf("SKIP: no usable CUDA device: %s\n", err.msg);
        return 77; /* meson's and scripts/run_tests.py's "skipped" */
    }
    char name[512];
    if (zi_cuda_device_name(0, name, sizeof name, &err) == ZI_OK) printf("device 0: %s\n", name);
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess && p.major < 8) {
        printf("SKIP: compute capability %d.%d; this build has code for 8.x and 9.0\n", p.major,
               p.minor);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_matmul_n_vs_cpu),
        cmocka_unit_test(test_get_rows),
        cmocka_unit_test(test_moe_ops),
        cmocka_unit_test(test_elementwise),
        cmocka_unit_test(test_attention_paged),
        cmocka_unit_test(test_gemma_ops),
        cmocka_unit_test(test_rope_factors_vs_cpu),
        cmocka_unit_test(test_attention_window),
        cmocka_unit_test(test_family_bias_ops),
        cmocka_unit_test(test_hybrid_ops),
        cmocka_unit_test(test_encoder_elementwise),
        cmocka_unit_test(test_span_attention_vs_cpu),
        cmocka_unit_test(test_audio_ops_vs_cpu),
        cmocka_unit_test(test_matmul_tile),
        cmocka_unit_test(test_vision_tower_vs_cpu),
        cmocka_unit_test(test_bad_id_reported),
        cmocka_unit_test(test_lora),
        cmocka_unit_test(test_graph_capture),
        cmocka_unit_test(test_graphs_interleaved),
        cmocka_unit_test(test_sampler_vs_reference),
        cmocka_unit_test(test_sampler_chi2),
        cmocka_unit_test(test_sampler_odd_rows),
        cmocka_unit_test(test_model_logits_kl),
        cmocka_unit_test(test_model_greedy_32),
        cmocka_unit_test(test_model_batched_decode),
        cmocka_unit_test(test_tp_nccl_one_rank),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
