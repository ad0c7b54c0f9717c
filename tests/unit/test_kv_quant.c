/*
 * test_kv_quant.c - the CPU backend's KV cache in the --kv-type formats
 * other than the default (f16, q8_0, q4_0; backend.h zi_kv_type):
 * kv_store writes rows that GGUF's own decoding (zi_dequantize_row) reads
 * back within the format's rounding, byte for byte as llama.cpp's
 * reference quantizers write them; attention over them, in every kernel
 * table, equals a scalar double reference computed from those decoded
 * values (so attention reads the blocks, nothing else), stays near the
 * unrounded values' attention by the format's error, gives a prompt's
 * tokens in one pass what each gets alone, and the same bits on 1 and 2
 * threads; the sizes and the option's errors.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "cpu_backend.h"
#include "cpu_kernels.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "test_rand.h"

static zi_test_rng rng = {0x6b765f7175616e74ULL};

static float frand(float lo, float hi) {
    return zi_test_frand(&rng, lo, hi);
}

static const int TYPES[] = {ZI_KV_F16, ZI_KV_Q8_0, ZI_KV_Q4_0};
static const int GGML[] = {ZI_TYPE_F16, ZI_TYPE_Q8_0, ZI_TYPE_Q4_0};

static zi_backend *make_backend(const char *isa, int threads, int type) {
    zi_backend *be = NULL;
    zi_error err = {0};
    zi_cpu_options o = {.n_threads = threads, .isa = isa};
    assert_int_equal(zi_cpu_backend_create(&o, &be, &err), ZI_OK);
    assert_int_equal(zi_backend_set_kv_type(be, type, &err), ZI_OK);
    assert_int_equal(be->kv_type, type);
    return be;
}

/* llama.cpp's quantize_row_q8_0_ref and quantize_row_q4_0_ref for one
 * block, as ggml-quants.c writes them. */
static void ref_q8_0(const float *x, zi_block_q8_0 *y) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
    y->d = zi_f32_to_f16(d);
    for (int j = 0; j < 32; j++) y->qs[j] = (int8_t)roundf(x[j] * id);
}

static void ref_q4_0(const float *x, zi_block_q4_0 *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) amax = fabsf(x[j]), max = x[j];
    const float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
    y->d = zi_f32_to_f16(d);
    for (int j = 0; j < 16; j++) {
        const int8_t a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[16 + j] * id + 8.5f);
        const uint8_t xi0 = (uint8_t)(a < 15 ? a : 15), xi1 = (uint8_t)(b < 15 ? b : 15);
        y->qs[j] = (uint8_t)(xi0 | (xi1 << 4));
    }
}

/* y = H x in double, H the n x n Sylvester Hadamard matrix / sqrt(n)
 * (entry (i, j): (-1)^popcount(i & j)), written out: what zi_kv_rotate
 * computes by butterflies. */
static void hadamard(const float *x, double *y, int n) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int j = 0; j < n; j++)
            s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[j];
        y[i] = s / sqrt((double)n);
    }
}

/* The rotation of the quantized formats: H by its definition, within
 * float rounding, its own inverse; which rows it applies to. */
static void test_rotation(void **state) {
    (void)state;
    for (int n = 32; n <= 256; n *= 2) {
        float x[256], y[256];
        double want[256];
        for (int i = 0; i < n; i++) x[i] = y[i] = frand(-4, 4);
        x[3] = y[3] = 60.0f; /* an outlier */
        zi_kv_rotate(y, n);
        hadamard(x, want, n);
        for (int i = 0; i < n; i++) assert_true(fabs(y[i] - want[i]) < 1e-4);
        zi_kv_rotate(y, n);
        for (int i = 0; i < n; i++) assert_true(fabsf(y[i] - x[i]) < 1e-4f);
    }
    assert_true(zi_kv_rotated(ZI_KV_Q8_0, 64) && zi_kv_rotated(ZI_KV_Q4_0, 256));
    assert_false(zi_kv_rotated(ZI_KV_F16, 64) || zi_kv_rotated(ZI_KV_DEFAULT, 64));
    assert_false(zi_kv_rotated(ZI_KV_Q8_0, 96) || zi_kv_rotated(ZI_KV_Q8_0, 512));
}

/* A backend with only its own layout (CUDA's: no set_kv_type) refuses the
 * other types by name and keeps the default. */
static void test_backend_without_types(void **state) {
    (void)state;
    static const zi_backend_ops ops = {.name = "cuda"};
    zi_backend be = {.ops = &ops};
    zi_error err = {0};
    assert_int_equal(zi_backend_set_kv_type(&be, ZI_KV_DEFAULT, &err), ZI_OK);
    assert_int_equal(zi_backend_set_kv_type(&be, ZI_KV_Q8_0, &err), ZI_EUNSUPPORTED);
    assert_string_equal(err.msg, "--kv-type q8_0: the cuda backend keeps its own KV layout "
                                 "(only --kv-type default there)");
    assert_int_equal(be.kv_type, ZI_KV_DEFAULT);
}

/* Row sizes: the formats' blocks, the default's unchanged. */
static void test_row_bytes(void **state) {
    (void)state;
    zi_backend *be = make_backend(NULL, 1, ZI_KV_DEFAULT);
    assert_int_equal(zi_backend_kv_row_bytes(be, 64, 0), 64 * 2 + 4);
    assert_int_equal(zi_backend_kv_row_bytes(be, 64, 1), 64 * 2);
    zi_error err = {0};
    const uint64_t want[3][2] = {{128, 128}, {68, 68}, {36, 36}};
    for (int t = 0; t < 3; t++) {
        assert_int_equal(zi_backend_set_kv_type(be, TYPES[t], &err), ZI_OK);
        assert_int_equal(zi_backend_kv_row_bytes(be, 64, 0), want[t][0]);
        assert_int_equal(zi_backend_kv_row_bytes(be, 64, 1), want[t][1]);
    }
    assert_int_equal(zi_backend_set_kv_type(be, ZI_KV_TYPE_COUNT, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "--kv-type"));
    assert_int_equal(zi_backend_set_kv_type(be, -1, &err), ZI_EINVAL);
    assert_string_equal(zi_kv_type_name(ZI_KV_DEFAULT), "default");
    assert_string_equal(zi_kv_type_name(ZI_KV_Q4_0), "q4_0");
    zi_backend_free(be);
}

/* The model's KV sizing (the memory plan's, the worker's): SmolLM2-135M's
 * shape, 30 layers x 3 KV heads of 64, per position. */
static void test_bytes_per_token(void **state) {
    (void)state;
    zi_model_config c = {.n_layers = 30, .n_kv_heads = 3, .head_dim = 64};
    const uint64_t want[4] = {30 * 3 * (64 * 4 + 4), 30 * 3 * 256, 30 * 3 * 136, 30 * 3 * 72};
    zi_backend *be = make_backend(NULL, 1, ZI_KV_DEFAULT);
    zi_error err = {0};
    for (int t = 0; t < ZI_KV_TYPE_COUNT; t++) {
        assert_int_equal(zi_backend_set_kv_type(be, t, &err), ZI_OK);
        assert_int_equal(zi_model_config_kv_bytes_per_token(&c, be), want[t]);
    }
    zi_backend_free(be);
}

/* kv_store's rows: llama.cpp's reference quantizers' bytes (Q8_0, Q4_0,
 * of the rotated row; float16 rounded to nearest), which GGUF's decoding
 * (rotated back) reads within the format's step; the default layout's caches are not touched by a
 * type set on another backend. Values include a zero block and a block
 * whose largest magnitude is negative (Q4_0's sign). */
static void test_store_rows(void **state) {
    (void)state;
    enum { HD = 64, KVH = 2, BS = 4, NPOS = 7 };
    const int kvd = KVH * HD, nblk = 2;
    float k[NPOS * KVH * HD], v[NPOS * KVH * HD];
    for (int i = 0; i < NPOS * kvd; i++) k[i] = frand(-3, 3), v[i] = frand(-1, 1);
    for (int i = 0; i < 32; i++) k[kvd + i] = 0.0f; /* position 1, head 0: a zero block */
    k[2 * kvd + 5] = -7.5f;                         /* position 2: largest negative */
    int32_t table[2] = {1, 0}, pos[NPOS], seq[NPOS] = {0};
    for (int t = 0; t < NPOS; t++) pos[t] = t;
    for (int ti = 0; ti < 3; ti++) {
        zi_backend *be = make_backend(NULL, 2, TYPES[ti]);
        const size_t krow = zi_backend_kv_row_bytes(be, HD, 0),
                     vrow = zi_backend_kv_row_bytes(be, HD, 1);
        uint8_t *kc = calloc((size_t)nblk * BS * KVH, krow),
                *vc = calloc((size_t)nblk * BS * KVH, vrow);
        zi_attn_shape sh = {.n_heads = KVH,
                            .n_kv_heads = KVH,
                            .head_dim = HD,
                            .block_size = BS,
                            .max_ctx = NPOS,
                            .scale = 1.0f};
        zi_batch_view all = {NPOS, pos, seq, table, 2, NULL};
        be->ops->kv_store(be, kc, vc, k, v, &all, &sh);
        for (int p = 0; p < NPOS; p++)
            for (int h = 0; h < KVH; h++) {
                const size_t r = (size_t)table[p / BS] * BS * KVH + (size_t)h * BS + p % BS;
                for (int which = 0; which < 2; which++) {
                    const uint8_t *row = which ? vc + r * vrow : kc + r * krow;
                    const float *x0 = (which ? v : k) + p * kvd + h * HD;
                    float y[HD], x[HD];
                    double yd[HD];
                    assert_int_equal(zi_dequantize_row(GGML[ti], row, y, HD), 0);
                    memcpy(x, x0, sizeof x);
                    if (TYPES[ti] != ZI_KV_F16) { /* compare in the rotated frame */
                        assert_true(zi_kv_rotated(TYPES[ti], HD));
                        zi_kv_rotate(x, HD);
                        hadamard(y, yd, HD); /* and the unrotated values, below */
                    }
                    for (int b = 0; b < HD / 32; b++) {
                        float amax = 0.0f;
                        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * b + i]));
                        /* half a step (Q4_0: a whole one, its clamp at +7 steps of 8),
                         * and the float16 scale's rounding over up to 127 steps */
                        const float tol = TYPES[ti] == ZI_KV_F16 ? amax * 0x1p-11f
                                          : TYPES[ti] == ZI_KV_Q8_0
                                              ? amax / 127.0f * 0.5f + amax * 0x1p-10f
                                              : amax / 8.0f + amax * 0x1p-10f;
                        for (int i = 32 * b; i < 32 * b + 32; i++)
                            if (fabsf(y[i] - x[i]) > tol ||
                                (TYPES[ti] != ZI_KV_F16 &&
                                 fabs(yd[i] - x0[i]) > (TYPES[ti] == ZI_KV_Q8_0 ? 0.1 : 1.0)))
                                fail_msg("%s pos %d head %d %c[%d]: %g stored as %g",
                                         zi_kv_type_name(TYPES[ti]), p, h, which ? 'v' : 'k', i,
                                         x[i], y[i]);
                        if (TYPES[ti] == ZI_KV_Q8_0) {
                            zi_block_q8_0 want;
                            ref_q8_0(x + 32 * b, &want);
                            assert_memory_equal(row + 34 * b, &want, sizeof want);
                        } else if (TYPES[ti] == ZI_KV_Q4_0) {
                            zi_block_q4_0 want;
                            ref_q4_0(x + 32 * b, &want);
                            assert_memory_equal(row + 18 * b, &want, sizeof want);
                        } else {
                            for (int i = 32 * b; i < 32 * b + 32; i++) {
                                uint16_t hv;
                                memcpy(&hv, row + 2 * i, 2);
                                assert_int_equal(hv, zi_f32_to_f16(x[i]));
                            }
                        }
                    }
                }
            }
        free(kc), free(vc);
        zi_backend_free(be);
    }
}

/* softmax(q . K * scale) V in double, for query head h over the n first
 * positions of rows K and V (kvd apart, KV head g); cap > 0: each score s
 * soft-capped to cap * tanh(s / cap). */
static void ref_attention(const float *q, const float *K, const float *V, int n, int hd, int kvd,
                          int g, float scale, float cap, double *out) {
    double w[128], sum = 0, mx = -1e300;
    for (int j = 0; j < n; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)q[i] * K[(size_t)j * kvd + g * hd + i];
        w[j] = d * scale;
        if (cap > 0) w[j] = cap * tanh(w[j] / cap);
        mx = w[j] > mx ? w[j] : mx;
    }
    for (int j = 0; j < n; j++) sum += w[j] = exp(w[j] - mx);
    for (int i = 0; i < hd; i++) {
        double r = 0;
        for (int j = 0; j < n; j++) r += w[j] / sum * V[(size_t)j * kvd + g * hd + i];
        out[i] = r;
    }
}

/* Attention over each format, every table, head sizes 64 (AVX-512's 16
 * positions a time), 96 (AVX2's 8, AVX-512's row by row; stored
 * unrotated), 32 (AVX-512 sums 4 rows at a time) and 256, GQA groups of
 * 3, cache blocks of 16 and 5 out of order, 1-90 positions, and a
 * sliding window of 40 with soft-capping: equal to the
 * double reference on the decoded cache (rotated back) within
 * float32 rounding, near the unrounded K and V by the format's error; a prompt's tokens in one pass
 * as alone, bit for bit; 1 and 2 threads the same. */
static void test_attention_formats(void **state) {
    (void)state;
    const char *isas[] = {"scalar", "avx2", "avx512"};
    const int heads = 6, kvh = 2, npos = 90, hds[] = {32, 64, 96, 256};
    for (size_t ii = 0; ii < 3; ii++) {
        if (!zi_cpu_kernels_by_name(isas[ii])) continue;
        for (int ti = 0; ti < 3; ti++)
            for (int hi = 0; hi < 4; hi++)
                for (int var = 0; var < 3; var++) {
                    const int bs = var == 0 ? 5 : 16, win = var == 2 ? 40 : 0;
                    const float cap = var == 2 ? 3.0f : 0.0f;
                    const int hd = hds[hi], kvd = kvh * hd, nblk = (npos + bs - 1) / bs + 1;
                    float *k = malloc(sizeof(float) * npos * kvd),
                          *v = malloc(sizeof(float) * npos * kvd),
                          *kd = malloc(sizeof(float) * npos * kvd),
                          *vd = malloc(sizeof(float) * npos * kvd);
                    float *q = malloc(sizeof(float) * npos * heads * hd);
                    float *all_out[2] = {malloc(sizeof(float) * npos * heads * hd),
                                         malloc(sizeof(float) * npos * heads * hd)};
                    float *one = malloc(sizeof(float) * heads * hd);
                    for (int i = 0; i < npos * kvd; i++) k[i] = frand(-2, 2), v[i] = frand(-1, 1);
                    for (int i = 0; i < npos * heads * hd; i++) q[i] = frand(-1, 1);
                    int32_t table[32], pos[90], seq[90];
                    for (int b = 0; b < nblk; b++) table[b] = nblk - 1 - b; /* reversed */
                    for (int t = 0; t < npos; t++) pos[t] = t, seq[t] = 0;
                    zi_attn_shape sh = {.n_heads = heads,
                                        .n_kv_heads = kvh,
                                        .head_dim = hd,
                                        .block_size = bs,
                                        .max_ctx = npos,
                                        .scale = 1.0f / sqrtf((float)hd),
                                        .window = win,
                                        .softcap = cap};
                    for (int nt = 1; nt <= 2; nt++) {
                        zi_backend *be = make_backend(isas[ii], nt, TYPES[ti]);
                        zi_error err = {0};
                        assert_int_equal(be->ops->reserve(be, npos, kvd, npos, &err), ZI_OK);
                        const size_t krow = zi_backend_kv_row_bytes(be, hd, 0),
                                     vrow = zi_backend_kv_row_bytes(be, hd, 1);
                        const size_t rows = (size_t)nblk * bs * kvh;
                        uint8_t *kc = calloc(rows, krow), *vc = calloc(rows, vrow);
                        zi_batch_view all = {npos, pos, seq, table, 32, NULL};
                        be->ops->kv_store(be, kc, vc, k, v, &all, &sh);
                        /* the cache decoded by GGUF's rules, rotated back */
                        for (int p = 0; p < npos; p++)
                            for (int g = 0; g < kvh; g++) {
                                size_t r =
                                    (size_t)table[p / bs] * bs * kvh + (size_t)g * bs + p % bs;
                                float *kr = kd + p * kvd + g * hd, *vr = vd + p * kvd + g * hd;
                                assert_int_equal(zi_dequantize_row(GGML[ti], kc + r * krow, kr, hd),
                                                 0);
                                assert_int_equal(zi_dequantize_row(GGML[ti], vc + r * vrow, vr, hd),
                                                 0);
                                if (zi_kv_rotated(TYPES[ti], hd)) {
                                    double t[256];
                                    hadamard(kr, t, hd);
                                    for (int i = 0; i < hd; i++) kr[i] = (float)t[i];
                                    hadamard(vr, t, hd);
                                    for (int i = 0; i < hd; i++) vr[i] = (float)t[i];
                                }
                            }
                        /* the whole prompt in one pass (attend_block) */
                        be->ops->attention(be, all_out[nt - 1], q, kc, vc, &all, &sh);
                        for (int t = 0; t < npos; t += t < 20 ? 1 : 7) {
                            zi_batch_view bt = {1, &pos[t], &seq[t], table, 32, NULL};
                            const float *qt = q + (size_t)t * heads * hd;
                            be->ops->attention(be, one, qt, kc, vc, &bt, &sh);
                            if (memcmp(one, all_out[nt - 1] + (size_t)t * heads * hd,
                                       sizeof(float) * heads * hd))
                                fail_msg("%s %s hd %d bs %d: token %d differs from alone", isas[ii],
                                         zi_kv_type_name(TYPES[ti]), hd, bs, t);
                            for (int h = 0; h < heads; h++) {
                                double rd[256], rf[256];
                                const int g = h / (heads / kvh);
                                const int f = win && t >= win ? t - win + 1 : 0; /* first */
                                ref_attention(qt + h * hd, kd + (size_t)f * kvd,
                                              vd + (size_t)f * kvd, t + 1 - f, hd, kvd, g, sh.scale,
                                              cap, rd);
                                ref_attention(qt + h * hd, k + (size_t)f * kvd, v + (size_t)f * kvd,
                                              t + 1 - f, hd, kvd, g, sh.scale, cap, rf);
                                const double qtol = TYPES[ti] == ZI_KV_F16    ? 2e-3
                                                    : TYPES[ti] == ZI_KV_Q8_0 ? 2e-2
                                                                              : 0.25;
                                for (int i = 0; i < hd; i++) {
                                    const double got = one[h * hd + i];
                                    if (fabs(got - rd[i]) > 2e-5 || fabs(got - rf[i]) > qtol)
                                        fail_msg("%s %s hd %d bs %d pos %d head %d [%d]: %.7g, "
                                                 "decoded cache's %.7g, unrounded %.7g",
                                                 isas[ii], zi_kv_type_name(TYPES[ti]), hd, bs, t, h,
                                                 i, got, rd[i], rf[i]);
                                }
                            }
                        }
                        free(kc), free(vc);
                        zi_backend_free(be);
                    }
                    assert_memory_equal(all_out[0], all_out[1], sizeof(float) * npos * heads * hd);
                    free(k), free(v), free(kd), free(vd), free(q), free(one);
                    free(all_out[0]), free(all_out[1]);
                }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotation),   cmocka_unit_test(test_backend_without_types),
        cmocka_unit_test(test_row_bytes),  cmocka_unit_test(test_bytes_per_token),
        cmocka_unit_test(test_store_rows), cmocka_unit_test(test_attention_formats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
