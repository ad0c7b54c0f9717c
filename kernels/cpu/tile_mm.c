/*
 * tile_mm.c - products over a whole image tile on AMX-BF16 tiles (split
 * into bf16 hi + lo) or AVX-512 FMA, and the float32 attention built on
 * them; see tile_mm.h. Functions that use the instructions carry target
 * attributes: the file itself is compiled for the baseline, and nothing
 * here runs unless zi_tile_kind() found the instructions.
 */
#include "tile_mm.h"

#include <assert.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dequant.h"

#if defined(__x86_64__) && defined(__linux__) &&                                                   \
    (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ZI_TILE_X86 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* Panels of 16 outputs; AMX chunks of 32 inputs, each a hi and a lo tile of
 * 16 rows x 64 bytes (512 bf16). */
#define TP 16
#define TC 32
#define TILE_ELEMS 512
#define CHUNK_ELEMS (2 * TILE_ELEMS)

struct zi_tile_b {
    int kind;
    int64_t n, k;
    int64_t np; /* panels: ceil(n / 16) */
    int64_t kc; /* AMX: chunks ceil(k / 32); FMA: k */
    void *data; /* AMX: uint16 [np][kc][hi, lo][512]; FMA: float [np][k][16] */
};

struct zi_tile_ctx {
    zi_pool *pool;
    void *a;      /* packed activations (AMX) */
    size_t a_cap; /* bytes */
    float *cbuf;  /* outputs of sizes the tiles do not cover exactly */
    size_t c_cap;
    void *kv; /* attention: every kv head's K and V packs */
    size_t kv_cap;
    void *thr; /* attention: per-thread blocks */
    size_t thr_cap;
};

/* Grows *p to at least `bytes` (64-byte aligned, contents dropped). */
static int grow(void **p, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return 0;
    void *n = NULL;
    if (posix_memalign(&n, 64, bytes) != 0) return -1;
    free(*p);
    *p = n;
    *cap = bytes;
    return 0;
}

zi_tile_ctx *zi_tile_ctx_create(zi_pool *pool) {
    zi_tile_ctx *c = calloc(1, sizeof *c);
    if (c) c->pool = pool;
    return c;
}

void zi_tile_ctx_free(zi_tile_ctx *c) {
    if (!c) return;
    free(c->a);
    free(c->cbuf);
    free(c->kv);
    free(c->thr);
    free(c);
}

void zi_tile_b_free(zi_tile_b *b) {
    if (!b) return;
    free(b->data);
    free(b);
}

#ifndef ZI_TILE_X86
int zi_tile_kind(void) { return ZI_TILE_NONE; }
zi_tile_b *zi_tile_pack_weight(zi_tile_ctx *c, const zi_weight *w, zi_error *err) {
    (void)c, (void)w;
    zi_error_set(err, ZI_EUNSUPPORTED, "no tile kernels on this CPU");
    return NULL;
}
int zi_tile_matmul(zi_tile_ctx *c, float *y, const zi_tile_b *b, const float *x, int n_tokens) {
    (void)c, (void)y, (void)b, (void)x, (void)n_tokens;
    return ZI_EUNSUPPORTED;
}
int zi_tile_span_attention(zi_tile_ctx *c, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts,
                           int n_spans, const zi_attn_shape *s) {
    (void)c, (void)out, (void)q, (void)k, (void)v, (void)order, (void)starts, (void)n_spans, (void)s;
    return ZI_EUNSUPPORTED;
}
#else

#define TILE_AVX __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define TILE_AMX __attribute__((target("avx512f,avx512bw,avx512vl,fma,amx-tile,amx-bf16")))
#define INL __attribute__((always_inline)) inline

int zi_tile_kind(void) {
    static int state; /* 0: not asked yet, else kind + 1 */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s) return s - 1;
    unsigned eax, ebx, ecx, edx;
    int kind = ZI_TILE_NONE;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma")) {
        kind = ZI_TILE_FMA;
        const char *env = getenv("ZINFER_CPU_AMX");
        if (!(env && strcmp(env, "0") == 0) && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
            (edx >> 22 & 1) && (edx >> 24 & 1) && /* AMX-BF16, AMX-TILE */
            syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0)
            kind = ZI_TILE_AMX;
    }
    __atomic_store_n(&state, kind + 1, __ATOMIC_RELEASE);
    return kind;
}

/* ---- packing ---- */

/* 16 floats as bf16 hi = rne(x) and lo = rne(x - hi). */
static INL TILE_AVX void split16(__m512 x, __m256i *hi, __m256i *lo) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    const __m512i b = _mm512_castps_si512(x);
    const __m512i h = _mm512_and_si512(
        _mm512_add_epi32(b, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(b, 16), one))),
        top);
    const __m512i r = _mm512_castps_si512(_mm512_sub_ps(x, _mm512_castsi512_ps(h)));
    const __m512i l =
        _mm512_add_epi32(r, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(r, 16), one)));
    *hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16));
    *lo = _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16));
}

static INL TILE_AVX __mmask16 tail_mask(int64_t left) {
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
}

/* A (AMX): rows i < mp (rows from m on are zero) of k floats, row i at
 * base + (idx ? idx[i] : i) * stride, into 16-row blocks: block b, chunk c,
 * part (hi, lo) at dst + ((b * kc + c) * 2 + part) * 512, row i % 16 of the
 * tile 32 bf16 wide. Columns from k on are zero. */
static TILE_AVX void pack_a_amx(uint16_t *dst, const float *base, size_t stride,
                                const int32_t *idx, int64_t m, int64_t mp, int64_t k, int64_t kc) {
    for (int64_t i = 0; i < mp; i++) {
        uint16_t *d = dst + (size_t)(i / 16) * kc * CHUNK_ELEMS + (size_t)(i % 16) * 32;
        if (i >= m) {
            for (int64_t c = 0; c < kc; c++) {
                memset(d + c * CHUNK_ELEMS, 0, 64);
                memset(d + c * CHUNK_ELEMS + TILE_ELEMS, 0, 64);
            }
            continue;
        }
        const float *x = base + (size_t)(idx ? idx[i] : i) * stride;
        for (int64_t c = 0; c < kc; c++)
            for (int h = 0; h < 2; h++) {
                const int64_t k0 = c * TC + h * 16;
                __m256i hi, lo;
                split16(_mm512_maskz_loadu_ps(tail_mask(k - k0), x + k0), &hi, &lo);
                _mm256_storeu_si256((__m256i *)(d + c * CHUNK_ELEMS + h * 16), hi);
                _mm256_storeu_si256((__m256i *)(d + c * CHUNK_ELEMS + TILE_ELEMS + h * 16), lo);
            }
    }
}

/* B (AMX), output row j (x: its k floats, NULL: zeros) into panel j / 16:
 * tile row r, column j % 16 holds the pair (k = 2r, 2r + 1) of the chunk. */
static TILE_AVX void pack_b_row_amx(uint16_t *dst, int64_t kc, int64_t j, const float *x,
                                    int64_t k) {
    uint32_t *p = (uint32_t *)(dst + (size_t)(j / TP) * kc * CHUNK_ELEMS) + j % TP;
    const __m512i vidx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(16));
    for (int64_t c = 0; c < kc; c++) {
        __m256i h0, l0, h1, l1;
        const int64_t k0 = c * TC;
        const __m512 x0 = x ? _mm512_maskz_loadu_ps(tail_mask(k - k0), x + k0) : _mm512_setzero_ps();
        const __m512 x1 =
            x ? _mm512_maskz_loadu_ps(tail_mask(k - k0 - 16), x + k0 + 16) : _mm512_setzero_ps();
        split16(x0, &h0, &l0);
        split16(x1, &h1, &l1);
        const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1);
        const __m512i lv = _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1);
        uint32_t *t = p + (size_t)c * (CHUNK_ELEMS / 2);
        _mm512_i32scatter_epi32(t, vidx, hv, 4);
        _mm512_i32scatter_epi32(t + TILE_ELEMS / 2, vidx, lv, 4);
    }
}

/* B (AMX) as the transpose of rows: B[d][u] = row u's value d, for d < n
 * (dims at base + (idx ? idx[u] : u) * stride), u < k keys (from k on:
 * zero); panels of 16 dims, chunks of 32 keys. */
static TILE_AVX void pack_b_cols_amx(uint16_t *dst, const float *base, size_t stride,
                                     const int32_t *idx, int64_t n, int64_t k, int64_t kc) {
    const int64_t np = (n + TP - 1) / TP;
    for (int64_t p = 0; p < np; p++) {
        const __mmask16 mk = tail_mask(n - p * TP);
        for (int64_t c = 0; c < kc; c++) {
            uint16_t *t = dst + (size_t)(p * kc + c) * CHUNK_ELEMS;
            for (int r = 0; r < 16; r++) {
                const int64_t u0 = c * TC + 2 * r, u1 = u0 + 1;
                __m512 x0 = _mm512_setzero_ps(), x1 = _mm512_setzero_ps();
                if (u0 < k)
                    x0 = _mm512_maskz_loadu_ps(mk, base + (size_t)(idx ? idx[u0] : u0) * stride + p * TP);
                if (u1 < k)
                    x1 = _mm512_maskz_loadu_ps(mk, base + (size_t)(idx ? idx[u1] : u1) * stride + p * TP);
                __m256i h0, l0, h1, l1;
                split16(x0, &h0, &l0);
                split16(x1, &h1, &l1);
                const __m512i hv = _mm512_or_si512(_mm512_cvtepu16_epi32(h0),
                                                   _mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
                const __m512i lv = _mm512_or_si512(_mm512_cvtepu16_epi32(l0),
                                                   _mm512_slli_epi32(_mm512_cvtepu16_epi32(l1), 16));
                _mm512_storeu_si512(t + r * 32, hv);
                _mm512_storeu_si512(t + TILE_ELEMS + r * 32, lv);
            }
        }
    }
}

/* B (FMA), output row j (NULL: zeros) into panel j / 16: [k][16]. */
static void pack_b_row_fma(float *dst, int64_t k, int64_t j, const float *x) {
    float *p = dst + (size_t)(j / TP) * k * TP + j % TP;
    for (int64_t i = 0; i < k; i++) p[i * TP] = x ? x[i] : 0.0f;
}

/* ---- the AMX kernels ---- */

typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* Every tile 16 rows x 64 bytes: C 0..3 (float 16 x 16), A 4, 5 (16 x 32
 * bf16), B 6, 7 (16 pairs x 16). */
static TILE_AMX void amx_config(void) {
    _Alignas(64) amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    __asm__ volatile("" : : "r"(&cfg) : "memory"); /* ldtilecfg reads it */
    _tile_loadconfig(&cfg);
}

/* C (MT x NT blocks of 16 x 16, at C, ldc floats a row) = (or +=, load_c)
 * the nc chunks of A blocks (a, a + astep) times B panels (b, b + bstep):
 * w_hi x_hi + w_lo x_hi + w_hi x_lo per chunk. */
static INL TILE_AMX void amx_block(const int MT, const int NT, const uint16_t *a, size_t astep,
                                   const uint16_t *b, size_t bstep, int64_t nc, float *C,
                                   size_t ldc, int load_c) {
    const size_t ld = ldc * sizeof(float);
    if (load_c) {
        _tile_loadd(0, C, ld);
        if (NT > 1) _tile_loadd(1, C + 16, ld);
        if (MT > 1) _tile_loadd(2, C + 16 * ldc, ld);
        if (MT > 1 && NT > 1) _tile_loadd(3, C + 16 * ldc + 16, ld);
    } else {
        _tile_zero(0);
        if (NT > 1) _tile_zero(1);
        if (MT > 1) _tile_zero(2);
        if (MT > 1 && NT > 1) _tile_zero(3);
    }
#define AMX_DP4()                                                                                  \
    do {                                                                                           \
        _tile_dpbf16ps(0, 4, 6);                                                                   \
        if (NT > 1) _tile_dpbf16ps(1, 4, 7);                                                       \
        if (MT > 1) _tile_dpbf16ps(2, 5, 6);                                                       \
        if (MT > 1 && NT > 1) _tile_dpbf16ps(3, 5, 7);                                             \
    } while (0)
    for (int64_t c = 0; c < nc; c++) {
        const uint16_t *a0 = a + c * CHUNK_ELEMS, *a1 = a0 + astep;
        const uint16_t *b0 = b + c * CHUNK_ELEMS, *b1 = b0 + bstep;
        _tile_loadd(4, a0, 64);
        if (MT > 1) _tile_loadd(5, a1, 64);
        _tile_loadd(6, b0, 64);
        if (NT > 1) _tile_loadd(7, b1, 64);
        AMX_DP4();
        _tile_loadd(4, a0 + TILE_ELEMS, 64);
        if (MT > 1) _tile_loadd(5, a1 + TILE_ELEMS, 64);
        AMX_DP4();
        _tile_loadd(4, a0, 64);
        if (MT > 1) _tile_loadd(5, a1, 64);
        _tile_loadd(6, b0 + TILE_ELEMS, 64);
        if (NT > 1) _tile_loadd(7, b1 + TILE_ELEMS, 64);
        AMX_DP4();
    }
#undef AMX_DP4
    _tile_stored(0, C, ld);
    if (NT > 1) _tile_stored(1, C + 16, ld);
    if (MT > 1) _tile_stored(2, C + 16 * ldc, ld);
    if (MT > 1 && NT > 1) _tile_stored(3, C + 16 * ldc + 16, ld);
}

/* C [mb * 16][np * 16] (ldc) = (+=) chunks [0, nc) of A blocks (block bm,
 * chunk c at A + (bm * akc + c) * 1024) times B panels (panel p, chunk c
 * at B + (p * bkc + c) * 1024). The tile configuration must be loaded. */
static TILE_AMX void amx_gemm(const uint16_t *A, int64_t akc, int64_t mb, const uint16_t *B,
                              int64_t bkc, int64_t np, int64_t nc, float *C, size_t ldc,
                              int load_c) {
    const size_t astep = (size_t)akc * CHUNK_ELEMS, bstep = (size_t)bkc * CHUNK_ELEMS;
    for (int64_t bm = 0; bm < mb; bm += 2)
        for (int64_t p = 0; p < np; p += 2) {
            const uint16_t *a = A + bm * astep, *b = B + p * bstep;
            float *c = C + (size_t)bm * 16 * ldc + (size_t)p * 16;
            const int two_m = bm + 1 < mb, two_n = p + 1 < np;
            if (two_m && two_n)
                amx_block(2, 2, a, astep, b, bstep, nc, c, ldc, load_c);
            else if (two_m)
                amx_block(2, 1, a, astep, b, bstep, nc, c, ldc, load_c);
            else if (two_n)
                amx_block(1, 2, a, astep, b, bstep, nc, c, ldc, load_c);
            else
                amx_block(1, 1, a, astep, b, bstep, nc, c, ldc, load_c);
        }
}

/* ---- the FMA kernels ---- */

/* C rows [R][up to 32 cols: ncols] (=, += with acc) = A rows (lda) times two
 * (NT) panels of B (bstep floats apart), k inputs. */
static INL TILE_AVX void fma_block(const int R, const int NT, const float *A, size_t lda,
                                   const float *B, size_t bstep, int64_t k, float *C, size_t ldc,
                                   int ncols, int acc) {
    __m512 c0[8], c1[8];
    for (int r = 0; r < R; r++) c0[r] = c1[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i++) {
        const __m512 b0 = _mm512_loadu_ps(B + i * TP);
        const __m512 b1 = NT > 1 ? _mm512_loadu_ps(B + bstep + i * TP) : b0;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(A[r * lda + i]);
            c0[r] = _mm512_fmadd_ps(a, b0, c0[r]);
            if (NT > 1) c1[r] = _mm512_fmadd_ps(a, b1, c1[r]);
        }
    }
    const __mmask16 m0 = tail_mask(ncols), m1 = tail_mask(ncols - 16);
    for (int r = 0; r < R; r++) {
        float *y = C + r * ldc;
        __m512 v0 = c0[r], v1 = c1[r];
        if (acc) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, y));
            if (NT > 1) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, y + 16));
        }
        _mm512_mask_storeu_ps(y, m0, v0);
        if (NT > 1) _mm512_mask_storeu_ps(y + 16, m1, v1);
    }
}

/* C [m][ncols] (ldc; = or += with acc) = A [m][k] (lda) times B's panels
 * (panel p at B + p * bstep, [k][16]), ncols <= their 16 columns each. */
static TILE_AVX void fma_gemm(const float *A, size_t lda, int64_t m, const float *B, size_t bstep,
                              int64_t ncols, int64_t k, float *C, size_t ldc, int acc) {
    const int64_t np = (ncols + TP - 1) / TP;
    for (int64_t i = 0; i < m; i += 8) {
        const int R = m - i < 8 ? (int)(m - i) : 8;
        for (int64_t p = 0; p < np; p += 2) {
            const int nc = (int)(ncols - p * TP);
            const float *a = A + i * lda, *b = B + p * bstep;
            float *c = C + i * ldc + p * TP;
#define FMA_CASE(RR)                                                                               \
    case RR:                                                                                       \
        if (p + 1 < np)                                                                            \
            fma_block(RR, 2, a, lda, b, bstep, k, c, ldc, nc, acc);                                \
        else                                                                                       \
            fma_block(RR, 1, a, lda, b, bstep, k, c, ldc, nc, acc);                                \
        break;
            switch (R) {
                FMA_CASE(1)
                FMA_CASE(2)
                FMA_CASE(3)
                FMA_CASE(4)
                FMA_CASE(5)
                FMA_CASE(6)
                FMA_CASE(7)
                FMA_CASE(8)
            }
#undef FMA_CASE
        }
    }
}

/* ---- weights ---- */

typedef struct pack_args {
    zi_tile_b *b;
    const zi_weight *w;
    float *rows; /* per thread: one row dequantized */
} pack_args;

static void pack_worker(void *p, int ith, int nth) {
    const pack_args *a = p;
    zi_tile_b *b = a->b;
    const int64_t rows = b->np * TP;
    const int64_t lo = rows * ith / nth / TP * TP, hi = rows * (ith + 1) / nth / TP * TP;
    float *x = a->rows + (size_t)ith * (size_t)((b->k + 15) / 16 * 16);
    const uint8_t *src = a->w->layout ? a->w->file_data : a->w->data;
    for (int64_t j = lo; j < hi; j++) {
        const float *row = NULL;
        if (j < b->n) {
            zi_dequantize_row(a->w->type, src + (size_t)j * a->w->row_bytes, x, b->k);
            row = x;
        }
        if (b->kind == ZI_TILE_AMX)
            pack_b_row_amx(b->data, b->kc, j, row, b->k);
        else
            pack_b_row_fma(b->data, b->k, j, row);
    }
}

zi_tile_b *zi_tile_pack_weight(zi_tile_ctx *c, const zi_weight *w, zi_error *err) {
    const int kind = zi_tile_kind();
    if (kind == ZI_TILE_NONE) {
        zi_error_set(err, ZI_EUNSUPPORTED, "the CPU has neither AMX-BF16 nor AVX-512");
        return NULL;
    }
    if (w->layout && !w->file_data) {
        zi_error_set(err, ZI_EUNSUPPORTED, "weight of layout %d has no file rows to pack",
                     w->layout);
        return NULL;
    }
    zi_tile_b *b = calloc(1, sizeof *b);
    if (!b) {
        zi_error_set(err, ZI_ENOMEM, "out of memory");
        return NULL;
    }
    b->kind = kind, b->n = w->rows, b->k = w->cols, b->np = (w->rows + TP - 1) / TP;
    b->kc = kind == ZI_TILE_AMX ? (w->cols + TC - 1) / TC : w->cols;
    const size_t bytes = kind == ZI_TILE_AMX
                             ? (size_t)b->np * (size_t)b->kc * CHUNK_ELEMS * sizeof(uint16_t)
                             : (size_t)b->np * (size_t)b->k * TP * sizeof(float);
    const int nth = zi_pool_size(c->pool);
    float *rows = malloc((size_t)nth * (size_t)((w->cols + 15) / 16 * 16) * sizeof(float));
    if (posix_memalign(&b->data, 64, bytes) != 0) b->data = NULL;
    if (!b->data || !rows) {
        free(rows);
        zi_tile_b_free(b);
        zi_error_set(err, ZI_ENOMEM, "out of memory packing a %lld x %lld weight for the tiles",
                     (long long)w->rows, (long long)w->cols);
        return NULL;
    }
    pack_args a = {b, w, rows};
    zi_pool_run(c->pool, pack_worker, &a);
    free(rows);
    return b;
}

/* ---- products ---- */

/* The AMX product's blocking (kernels/cpu/tile_mm.c, measured on a
 * 2-core Sapphire Rapids share at 4096 x 1152 x 1152..4304): C is taken
 * in groups of AMX_GROUP 16-row blocks x AMX_NBP panels (256 x 384
 * floats, 384 KB, stays in L2) and each group runs through K in passes of
 * AMX_KCB chunks (256 inputs), so that the 32-row A block of a pass (32
 * KB) stays in L1 while it meets the group's panels. Groups of 4 blocks
 * ran at half the speed (C went back to L3 between passes). */
#define AMX_KCB 8
#define AMX_GROUP 16
#define AMX_NBP 24
/* The FMA product's block of B: about 1 MB of L2. */
#define TILE_B_BLOCK (1u << 20)

typedef struct mm_args {
    /* the next task (AMX): threads take tasks as they come free, so that
     * one that the machine's other work delays does not hold up the rest */
    atomic_llong next;
    const zi_tile_b *b;
    const void *a; /* AMX: packed blocks; FMA: x */
    const float *x;
    int64_t m, mp;
    float *C;
    size_t ldc;
} mm_args;

static TILE_AMX void mm_amx_worker(void *p, int ith, int nth) {
    (void)ith, (void)nth;
    mm_args *a = p;
    const zi_tile_b *b = a->b;
    const int64_t mb = a->mp / 16;
    /* tasks: (group of AMX_GROUP row blocks, block of AMX_NBP panels) */
    const int64_t ng = (mb + AMX_GROUP - 1) / AMX_GROUP, npb = (b->np + AMX_NBP - 1) / AMX_NBP;
    const uint16_t *A = a->a, *B = b->data;
    int configured = 0;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (t >= ng * npb) break;
        if (!configured) amx_config(), configured = 1;
        const int64_t g0 = t / npb * AMX_GROUP, p0 = t % npb * AMX_NBP;
        const int64_t g1 = g0 + AMX_GROUP < mb ? g0 + AMX_GROUP : mb;
        const int64_t np = b->np - p0 < AMX_NBP ? b->np - p0 : AMX_NBP;
        for (int64_t c0 = 0; c0 < b->kc; c0 += AMX_KCB) {
            const int64_t nc = b->kc - c0 < AMX_KCB ? b->kc - c0 : AMX_KCB;
            amx_gemm(A + ((size_t)g0 * b->kc + c0) * CHUNK_ELEMS, b->kc, g1 - g0,
                     B + ((size_t)p0 * b->kc + c0) * CHUNK_ELEMS, b->kc, np, nc,
                     a->C + (size_t)g0 * 16 * a->ldc + p0 * TP, a->ldc, c0 > 0);
        }
    }
    if (configured) _tile_release();
}

typedef struct pa_args {
    uint16_t *dst;
    const float *x;
    int64_t m, mp, k, kc;
} pa_args;

static void pack_a_worker(void *p, int ith, int nth) {
    const pa_args *a = p;
    const int64_t blocks = a->mp / 16;
    const int64_t lo = blocks * ith / nth, hi = blocks * (ith + 1) / nth;
    if (lo >= hi) return;
    const int64_t r0 = lo * 16, r1 = hi * 16;
    int64_t m = a->m - r0; /* real rows of the range; the rest zero */
    if (m > r1 - r0) m = r1 - r0;
    if (m < 0) m = 0;
    pack_a_amx(a->dst + (size_t)lo * a->kc * CHUNK_ELEMS, a->x + (size_t)r0 * a->k, (size_t)a->k,
               NULL, m, r1 - r0, a->k, a->kc);
}

static TILE_AVX void mm_fma_worker(void *p, int ith, int nth) {
    const mm_args *a = p;
    const zi_tile_b *b = a->b;
    const int64_t units = (a->m + 7) / 8;
    const int64_t lo = units * ith / nth * 8, hi0 = units * (ith + 1) / nth * 8;
    const int64_t hi = hi0 < a->m ? hi0 : a->m;
    if (lo >= hi) return;
    int64_t nbp = TILE_B_BLOCK / ((size_t)b->k * TP * sizeof(float)) & ~(int64_t)1;
    if (nbp < 2) nbp = 2;
    for (int64_t p0 = 0; p0 < b->np; p0 += nbp) {
        const int64_t np = b->np - p0 < nbp ? b->np - p0 : nbp;
        int64_t ncols = b->n - p0 * TP;
        if (ncols > np * TP) ncols = np * TP;
        fma_gemm(a->x + (size_t)lo * b->k, (size_t)b->k, hi - lo,
                 (const float *)b->data + (size_t)p0 * b->k * TP, (size_t)b->k * TP, ncols, b->k,
                 a->C + (size_t)lo * a->ldc + p0 * TP, a->ldc, 0);
    }
}

int zi_tile_matmul(zi_tile_ctx *c, float *y, const zi_tile_b *b, const float *x, int n_tokens) {
    assert(b && n_tokens >= 0);
    if (n_tokens == 0) return ZI_OK;
    mm_args a = {.b = b, .x = x, .m = n_tokens, .C = y, .ldc = (size_t)b->n};
    atomic_init(&a.next, 0);
    if (b->kind == ZI_TILE_FMA) {
        zi_pool_run(c->pool, mm_fma_worker, &a);
        return ZI_OK;
    }
    a.mp = (n_tokens + 15) / 16 * 16;
    if (grow(&c->a, &c->a_cap, (size_t)a.mp * (size_t)b->kc * CHUNK_ELEMS * sizeof(uint16_t)))
        return ZI_ENOMEM;
    pa_args pa = {c->a, x, n_tokens, a.mp, b->k, b->kc};
    zi_pool_run(c->pool, pack_a_worker, &pa);
    a.a = c->a;
    /* The tiles write whole 16 x 16 blocks: straight into y when they
     * cover it exactly, else through a padded buffer. */
    const int exact = a.mp == n_tokens && b->np * TP == b->n;
    if (!exact) {
        if (grow((void **)&c->cbuf, &c->c_cap, (size_t)a.mp * (size_t)b->np * TP * sizeof(float)))
            return ZI_ENOMEM;
        a.C = c->cbuf, a.ldc = (size_t)b->np * TP;
    }
    zi_pool_run(c->pool, mm_amx_worker, &a);
    if (!exact)
        for (int64_t t = 0; t < n_tokens; t++)
            memcpy(y + (size_t)t * b->n, c->cbuf + (size_t)t * a.ldc, (size_t)b->n * sizeof(float));
    return ZI_OK;
}

/* ---- attention ---- */

/* Query rows per task and keys per block of the online softmax (a
 * multiple of 32: K's packs cover whole blocks). One thread, 16 heads x 72
 * over 4096 rows: 256 x 128 took 385-400 ms, 128 x 256 410-415, 256 x 256
 * 400-420, 512 x 128 410-440, 64 x 256 445-460 (the more query rows, the
 * fewer passes over each head's K and V packs, 2.8 MB there; the fewer
 * keys, the smaller the S and P blocks). */
#define ATT_QB 256
#define ATT_KB 128

/* Query rows per task and keys per block of the online softmax. */

/* e^x for x <= 0 (x < -87: 0), about 1 ulp: x = n ln2 + r, |r| <= ln2/2,
 * e^r by its Taylor polynomial to r^7. */
static INL TILE_AVX __m512 exp_neg(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

typedef struct att_args {
    atomic_llong next; /* the next task (head, query block), as mm_args */
    zi_tile_ctx *ctx;
    int kind;
    float *out;
    const float *q;
    const int32_t *rows; /* the span's rows (order + starts[r]) */
    int64_t T;           /* the span's rows */
    const zi_attn_shape *s;
    int64_t kc_hd, kc_t, np_t, np_hd; /* AMX chunks of head_dim and of T; panels */
    size_t kpack, vpack;              /* elements of one kv head's K and V packs */
    const float *k, *v;               /* pack_kv: the sources */
    size_t thr_bytes;
    int64_t qb, kb; /* query rows per task, keys per block */
} att_args;

static TILE_AVX void pack_kv_worker(void *p, int ith, int nth) {
    const att_args *a = p;
    const zi_attn_shape *s = a->s;
    const int hd = s->head_dim, G = s->n_kv_heads;
    const size_t kvdim = (size_t)G * hd;
    /* tasks: (kv head, K or V) */
    for (int task = ith; task < 2 * G; task += nth) {
        const int g = task / 2, is_v = task % 2;
        if (a->kind == ZI_TILE_AMX) {
            uint16_t *base = (uint16_t *)a->ctx->kv + (size_t)g * (a->kpack + a->vpack);
            if (!is_v)
                for (int64_t j = 0; j < a->np_t * TP; j++)
                    pack_b_row_amx(base, a->kc_hd, j,
                                   j < a->T ? a->k + (size_t)a->rows[j] * kvdim + (size_t)g * hd
                                            : NULL,
                                   hd);
            else
                pack_b_cols_amx(base + a->kpack, a->v + (size_t)g * hd, kvdim, a->rows, hd, a->T,
                                a->kc_t);
        } else {
            float *base = (float *)a->ctx->kv + (size_t)g * (a->kpack + a->vpack);
            if (!is_v) {
                for (int64_t j = 0; j < a->np_t * TP; j++)
                    pack_b_row_fma(base, hd, j,
                                   j < a->T ? a->k + (size_t)a->rows[j] * kvdim + (size_t)g * hd
                                            : NULL);
            } else {
                /* V's panels: [np_hd][T][16], dims of a key side by side. */
                float *vb = base + a->kpack;
                for (int64_t pp = 0; pp < a->np_hd; pp++) {
                    const __mmask16 mk = tail_mask(hd - pp * TP);
                    for (int64_t u = 0; u < a->T; u++)
                        _mm512_storeu_ps(vb + ((size_t)pp * a->T + u) * TP,
                                         _mm512_maskz_loadu_ps(mk, a->v + (size_t)a->rows[u] * kvdim +
                                                                       (size_t)g * hd + pp * TP));
                }
            }
        }
    }
}

/* One task: query rows [i0, i1) of the span, head h. */
static INL TILE_AVX void attend_task(const att_args *a, int h, int64_t i0, int64_t i1,
                                     uint8_t *thr) {
    const zi_attn_shape *s = a->s;
    const int hd = s->head_dim, g = h / (s->n_heads / s->n_kv_heads);
    const int64_t m = i1 - i0, mp = (m + 15) / 16 * 16, T = a->T;
    const size_t qstride = (size_t)s->n_heads * hd, ldo = (size_t)a->np_hd * TP;
    /* the thread's blocks: S [QB][KB], P [QB][KB], O [QB][ldo], m, l, and
     * (AMX) the packed Q and P */
    float *S = (float *)thr, *P = S + a->qb * a->kb, *O = P + a->qb * a->kb;
    float *mx = O + a->qb * ldo, *l = mx + a->qb;
    uint16_t *Qa = (uint16_t *)(l + a->qb);
    uint16_t *Pa = Qa + (size_t)(a->qb / 16) * a->kc_hd * CHUNK_ELEMS;
    float *Qf = (float *)Qa; /* FMA: Q's rows gathered */
    const int amx = a->kind == ZI_TILE_AMX;
    if (amx)
        pack_a_amx(Qa, a->q + (size_t)h * hd, qstride, a->rows + i0, m, mp, hd, a->kc_hd);
    else
        for (int64_t i = 0; i < m; i++)
            memcpy(Qf + i * hd, a->q + (size_t)a->rows[i0 + i] * qstride + (size_t)h * hd,
                   (size_t)hd * sizeof(float));
    memset(O, 0, (size_t)mp * ldo * sizeof(float));
    for (int64_t i = 0; i < m; i++) mx[i] = -INFINITY, l[i] = 0.0f;
    const float *kv = a->kind == ZI_TILE_AMX ? NULL : (const float *)a->ctx->kv;
    const uint16_t *kvh = (const uint16_t *)a->ctx->kv;
    const size_t hoff = (size_t)g * (a->kpack + a->vpack);
    const __m512 scale = _mm512_set1_ps(s->scale);
    for (int64_t u0 = 0; u0 < T; u0 += a->kb) {
        const int64_t nk = T - u0 < a->kb ? T - u0 : a->kb;
        const int64_t npk = (nk + TP - 1) / TP, nck = (nk + TC - 1) / TC;
        if (amx)
            amx_gemm(Qa, a->kc_hd, mp / 16, kvh + hoff + (size_t)(u0 / TP) * a->kc_hd * CHUNK_ELEMS,
                     a->kc_hd, npk, a->kc_hd, S, a->kb, 0);
        else
            fma_gemm(Qf, (size_t)hd, m, kv + hoff + (size_t)(u0 / TP) * hd * TP, (size_t)hd * TP,
                     nk, hd, S, a->kb, 0);
        for (int64_t i = 0; i < m; i++) {
            float *srow = S + i * a->kb, *prow = P + i * a->kb;
            __m512 vm = _mm512_set1_ps(-INFINITY);
            for (int64_t j = 0; j < nk; j += 16)
                vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                            tail_mask(nk - j), srow + j));
            const float bm = _mm512_reduce_max_ps(vm) * s->scale;
            if (bm > mx[i]) {
                const float f = mx[i] == -INFINITY ? 0.0f : expf(mx[i] - bm);
                l[i] *= f;
                const __m512 vf = _mm512_set1_ps(f);
                for (size_t d = 0; d < ldo; d += 16)
                    _mm512_storeu_ps(O + i * ldo + d, _mm512_mul_ps(_mm512_loadu_ps(O + i * ldo + d), vf));
                mx[i] = bm;
            }
            const __m512 vmx = _mm512_set1_ps(mx[i]);
            __m512 sum = _mm512_setzero_ps();
            for (int64_t j = 0; j < nck * TC; j += 16) {
                const __mmask16 mk = tail_mask(nk - j);
                const __m512 e = _mm512_maskz_mov_ps(
                    mk, exp_neg(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(mk, srow + j), scale, vmx)));
                sum = _mm512_add_ps(sum, e);
                _mm512_storeu_ps(prow + j, e);
            }
            l[i] += _mm512_reduce_add_ps(sum);
        }
        if (amx) {
            pack_a_amx(Pa, P, a->kb, NULL, m, mp, nk, nck);
            amx_gemm(Pa, nck, mp / 16, kvh + hoff + a->kpack + (size_t)(u0 / TC) * CHUNK_ELEMS,
                     a->kc_t, a->np_hd, nck, O, ldo, 1);
        } else {
            fma_gemm(P, a->kb, m, kv + hoff + a->kpack + (size_t)u0 * TP, (size_t)T * TP, hd, nk,
                     O, ldo, 1);
        }
    }
    for (int64_t i = 0; i < m; i++) {
        float *o = a->out + (size_t)a->rows[i0 + i] * qstride + (size_t)h * hd;
        const float inv = 1.0f / l[i];
        for (int d = 0; d < hd; d++) o[d] = O[i * ldo + d] * inv;
    }
}

static TILE_AMX void attend_worker_amx(void *p, int ith, int nth) {
    (void)nth;
    att_args *a = p;
    const int64_t qb = (a->T + a->qb - 1) / a->qb, tasks = qb * a->s->n_heads;
    uint8_t *thr = (uint8_t *)a->ctx->thr + (size_t)ith * a->thr_bytes;
    int configured = 0;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (t >= tasks) break;
        if (!configured) amx_config(), configured = 1;
        const int h = (int)(t / qb);
        const int64_t i0 = t % qb * a->qb, i1 = i0 + a->qb < a->T ? i0 + a->qb : a->T;
        attend_task(a, h, i0, i1, thr);
    }
    if (configured) _tile_release();
}

static TILE_AVX void attend_worker_fma(void *p, int ith, int nth) {
    (void)nth;
    att_args *a = p;
    const int64_t qb = (a->T + a->qb - 1) / a->qb, tasks = qb * a->s->n_heads;
    uint8_t *thr = (uint8_t *)a->ctx->thr + (size_t)ith * a->thr_bytes;
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&a->next, 1, memory_order_relaxed);
        if (t >= tasks) break;
        const int h = (int)(t / qb);
        const int64_t i0 = t % qb * a->qb, i1 = i0 + a->qb < a->T ? i0 + a->qb : a->T;
        attend_task(a, h, i0, i1, thr);
    }
}

int zi_tile_span_attention(zi_tile_ctx *c, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts,
                           int n_spans, const zi_attn_shape *s) {
    assert(!s->causal && s->window == 0 && s->softcap == 0.0f && !s->sinks);
    assert(s->head_dim > 0 && s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0);
    assert(s->scale > 0.0f);
    const int kind = zi_tile_kind();
    if (kind == ZI_TILE_NONE) return ZI_EUNSUPPORTED;
    const int hd = s->head_dim;
    for (int r = 0; r < n_spans; r++) {
        att_args a = {.ctx = c, .kind = kind, .out = out, .q = q, .k = k, .v = v, .s = s};
        atomic_init(&a.next, 0);
        a.rows = order + starts[r];
        a.T = starts[r + 1] - starts[r];
        a.np_t = (a.T + TP - 1) / TP;
        a.np_hd = (hd + TP - 1) / TP;
        size_t esz;
        if (kind == ZI_TILE_AMX) {
            a.kc_hd = (hd + TC - 1) / TC;
            a.kc_t = (a.T + TC - 1) / TC;
            /* K's panels cover whole key blocks (a->kb is a multiple of 32) */
            a.np_t = (a.T + TC - 1) / TC * 2;
            a.kpack = (size_t)a.np_t * a.kc_hd * CHUNK_ELEMS;
            a.vpack = (size_t)a.np_hd * a.kc_t * CHUNK_ELEMS;
            esz = sizeof(uint16_t);
        } else {
            a.kpack = (size_t)a.np_t * hd * TP;
            a.vpack = (size_t)a.np_hd * a.T * TP;
            esz = sizeof(float);
        }
        const size_t ldo = (size_t)a.np_hd * TP;
        a.qb = ATT_QB, a.kb = ATT_KB;
        a.thr_bytes = (2 * a.qb * a.kb + a.qb * ldo + 2 * a.qb) * sizeof(float) +
                      (a.qb / 16) * (size_t)(a.kc_hd + (a.kb / TC)) * CHUNK_ELEMS * 2 +
                      (size_t)a.qb * hd * sizeof(float);
        a.thr_bytes = (a.thr_bytes + 63) / 64 * 64;
        const int nth = zi_pool_size(c->pool);
        if (grow(&c->kv, &c->kv_cap, (a.kpack + a.vpack) * esz * (size_t)s->n_kv_heads) ||
            grow(&c->thr, &c->thr_cap, a.thr_bytes * (size_t)nth))
            return ZI_ENOMEM;
        zi_pool_run(c->pool, pack_kv_worker, &a);
        zi_pool_run(c->pool, kind == ZI_TILE_AMX ? attend_worker_amx : attend_worker_fma, &a);
    }
    return ZI_OK;
}
#endif
