/*
 * cpu_kernels_amx.h - the 16-row products on AMX-INT8 tiles, for every
 * type stored in a 16-row layout (repack.h's Q4_0/Q4_1/Q8_0 and
 * repack_x.h's extended one: Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K..Q6_K,
 * MXFP4), and mm_r16_any, the avx512 table's 16-row entry, which sends
 * batches to the tiles where the CPU has them and the rest to the VNNI
 * kernels (mm_r16_vnni, mm_r16x). One of the units that cpu_kernels_impl.h
 * includes, in its order, once per instruction set.
 *
 * What each table compiles here:
 *   scalar   nothing.
 *   AVX2     nothing (its 16-row entry is in cpu_kernels_r16x.h).
 *   AVX-512  mm_r16_any (#if ZI_HAVE_VNNI && __AVX512F__), and with it, on
 *            x86-64 Linux with GCC 11 or clang 12 and later, ZI_HAVE_AMX:
 *            the tile driver (amx_rows) and its helpers, compiled for
 *            amx-tile,amx-int8 by a target attribute (ZI_AMX_FN), not by
 *            the file's flags, and run only when amx_usable() says the CPU
 *            and kernel allow it.
 */
#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__) && defined(__x86_64__) &&                       \
    defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ZI_HAVE_AMX 1
#include <cpuid.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ZI_AMX_FN __attribute__((target("amx-tile,amx-int8")))
/* Fewer tokens than this stay on the VNNI kernels: a chunk costs the tile
 * unit about the same for 2 tokens as for 8 (~40 ns per 16 x 32 block), so
 * AMX wins from ~4 tokens (Q4_1 576x3072: 2 tokens 8.3 vs 6.3 ns per row
 * block and token, 4: 4.8 vs 5.4, 16: 3.3 vs 5.4). */
#define ZI_AMX_MIN_TOKENS 4

/*
 * The tile driver. A block column of a 16-row group, its codes as unsigned
 * bytes in the order vpdpbusd takes (byte 64v + 4i + e = code of element
 * 4v + e of row i), is exactly the B operand's layout (8 rows of 64 bytes:
 * K = 32, N = 16 weight rows). The activation rows q1, q2 of consecutive
 * tokens lie nb*32 bytes apart (quant.h), so one tile load stacks [q1 t0,
 * q2 t0, q1 t1, ...] for block k: one TDPBSUD (M = 2 x up to 8 tokens)
 * leaves in C row 2i the q1 sums and in row 2i+1 the q2 sums of token i,
 * each lane one weight row. Types whose scales cover 16 values
 * (repack_x.h's halves: Q2_K, Q3_K, Q6_K) need the two halves' sums apart:
 * two TDPBSUD of K = 16 (A and B tiles of half a block). These are the same
 * exact integers as the VNNI kernels', and the float steps after them the
 * same operations in the same order (amx_finish), so the outputs are
 * bit-identical, and a token's do not depend on its batch. The vector units
 * are left with the per-token float work and, once per group for all the
 * batch's tokens, the decoding of the codes.
 *
 * Loops, per 16-row group: the block columns go in windows of up to
 * AMX_KC (decoded once into a buffer the B loads read, L1-sized), the
 * tokens in chunks of NT <= 8 (the accumulators stay in registers across a
 * window); past one window, each chunk's accumulators wait in a spill
 * buffer between windows (the same floats, so the same sums). The tile unit
 * runs ZI_AMX_AHEAD blocks ahead of the float steps that read its results
 * back (a tile store is not forwarded to loads right away).
 */

/* Linux keeps the tile state off until a process asks (ARCH_REQ_XCOMP_PERM);
 * asked once. ZINFER_CPU_AMX=0 keeps the VNNI kernel (for comparisons). */
static int amx_usable(void) {
    static int state; /* 0: not asked yet, 1: usable, -1: not */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    const char *env = getenv("ZINFER_CPU_AMX");
    unsigned eax, ebx, ecx, edx;
    int ok = !(env && strcmp(env, "0") == 0) && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
             (edx >> 24 & 1) && (edx >> 25 & 1) && /* AMX-TILE, AMX-INT8 */
             syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    __atomic_store_n(&state, ok ? 1 : -1, __ATOMIC_RELEASE);
    return ok;
}

typedef struct amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* A type as the driver sees it; every field a constant once inlined. */
typedef struct amx_type {
    int kind; /* KQ4_0, KQ4_1, KQ8_0 (repack.h), or AMX_X (repack_x.h) */
    int planes, lut, halves, cws, sub, e8m0; /* the extended format (repack_x.h) */
    float zp;
} amx_type;
#define AMX_X 3

#define ZI_AMX_AHEAD 3 /* 2: 4-8% slower on 32-token Q4_K experts */
_Static_assert(ZI_AMX_AHEAD < 4, "the ring of C results (amx_scratch.c) holds 4 blocks");
#define AMX_KC 64     /* block columns decoded at a time: 32 KB */
#define AMX_SPAN 32   /* token chunks per pass over a window: 256 tokens */

/* Scratch of one call: a ring of 4 blocks' C results (each half's), the
 * decoded window (codes, and the extended layout's scales as float32),
 * and the accumulators that wait between windows. */
typedef struct amx_scratch {
    _Alignas(64) int32_t c[4][2][16][16];
    _Alignas(64) uint8_t ub[AMX_KC][512];
    _Alignas(64) float xs[AMX_KC][4][16]; /* the extended layout's dw0, dw1, cw0, cw1 */
    _Alignas(64) float spill[AMX_SPAN][2][8][16];
} amx_scratch;

static inline size_t amx_group_bytes(const amx_type ty) {
    return ty.kind != AMX_X ? 16 * block_bytes(ty.kind)
                            : r16x_col_bytes(ty.planes, ty.halves, ty.cws, ty.sub, ty.e8m0);
}

/* The codes of block column G as B-tile bytes at d (Q8_0's need none: the
 * tile loads them from the weights). */
static inline __attribute__((always_inline)) void amx_decode(const amx_type ty, const uint8_t *G,
                                                             uint8_t *d) {
    __m512i c[8];
    if (ty.kind == AMX_X) {
        r16x_decode512(ty.planes, ty.lut, G, c);
    } else {
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (int p = 0; p < 4; p++) {
            __m512i x = _mm512_loadu_si512((const void *)(G + 64 * p));
            c[2 * p] = _mm512_and_si512(x, m4);
            c[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m4);
        }
    }
    for (int v = 0; v < 8; v++) _mm512_store_si512((void *)(d + 64 * v), c[v]);
}

/* One TDPBSUD: C tile CT = A tile AT (from a, astride apart) x B tile BT
 * (from b, 64 apart). */
#define AMX_TDP(CT, AT, BT, a, astride, b)                                                         \
    do {                                                                                           \
        _tile_loadd(AT, a, astride);                                                               \
        _tile_loadd(BT, b, 64);                                                                    \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
    } while (0)

/* The integer sums of one block column into the C tiles of its parity.
 * Tiles: whole blocks C 0/1, A 2/3, B 4/5 by the block's parity; halves C
 * 0/1 (parity 0) and 2/3 (parity 1), A 4/5 and B 6/7 by half. */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_tdp(const amx_type ty, int parity, const int8_t *a, size_t astride, const uint8_t *b) {
    __asm__ volatile("" ::: "memory"); /* the tile loads read decoded codes */
    if (!ty.halves) {
        if (parity)
            AMX_TDP(1, 3, 5, a, astride, b);
        else
            AMX_TDP(0, 2, 4, a, astride, b);
    } else if (parity) {
        AMX_TDP(2, 4, 6, a, astride, b);
        AMX_TDP(3, 5, 7, a + 16, astride, b + 256);
    } else {
        AMX_TDP(0, 4, 6, a, astride, b);
        AMX_TDP(1, 5, 7, a + 16, astride, b + 256);
    }
}

/* The C tiles of a parity to ring slot c (c[h] for half h). Issued after
 * the next block's products, so that the tile unit is not left waiting
 * for a product to finish before the store can go. */
static inline __attribute__((always_inline)) ZI_AMX_FN void amx_store(const amx_type ty,
                                                                      int parity,
                                                                      int32_t (*c)[16][16]) {
    if (!ty.halves) {
        if (parity)
            _tile_stored(1, c[0], 64);
        else
            _tile_stored(0, c[0], 64);
    } else if (parity) {
        _tile_stored(2, c[0], 64);
        _tile_stored(3, c[1], 64);
    } else {
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
    }
}

/* 16 lanes of 256 * (C row 2i) + (C row 2i + 1): token i's integer sums. */
static inline __m512i amx_sums(const int32_t *c, int i) {
    __m512i hi = _mm512_load_si512((const void *)(c + 32 * i));
    __m512i lo = _mm512_load_si512((const void *)(c + 32 * i + 16));
    return _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
}

/* The float steps of the VNNI kernel (mm_r16_vnni, r16x_vnni_rows) for
 * block column k of the group at base, NT tokens from t0, from ring slot c. */
static inline __attribute__((always_inline)) void
amx_finish(const amx_type ty, const uint8_t *base, int32_t (*c)[16][16], const float (*xs)[16],
           const zi_q8_act *a, int t0, int NT, int64_t k, __m512 *acc) {
    const int64_t nb = a->nb;
    const uint8_t *G = base + (size_t)k * amx_group_bytes(ty);
    if (ty.kind != AMX_X) {
        const uint8_t *scp = G + (ty.kind == KQ8_0 ? 512 : 256);
        __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)scp));
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++) {
            const int64_t t = t0 + i;
            __m512 p = _mm512_cvtepi32_ps(amx_sums(c[0][0], i));
            acc[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[t * nb + k])), acc[i]);
        }
        return;
    }
    /* The column's scales, made once for the window (amx_rows). */
    const __m512 dw0 = _mm512_load_ps(xs[0]), dw1 = _mm512_load_ps(xs[1]);
#pragma GCC unroll 8 /* accumulators in registers, not on the stack */
    for (int i = 0; i < NT; i++) {
        const int64_t t = t0 + i;
        const float da = a->d[t * nb + k];
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(amx_sums(c[0][0], i)),
                                 _mm512_mul_ps(dw0, _mm512_set1_ps(da)), acc[i]);
        if (ty.halves)
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(amx_sums(c[1][0], i)),
                                     _mm512_mul_ps(dw1, _mm512_set1_ps(da)), acc[i]);
    }
}

/* The other half of the VNNI kernels' float steps, their offv: each
 * block's zero points (cw) times the activations' block sums, for block
 * columns [k0, k1) of NT tokens from t0. Apart from the loop that reads
 * the tile unit's results back, in the same order (block by block), so
 * the same floats. Inside that loop they cost Q6_K's 768 x 2048 product
 * of 32 tokens 0.605 ms against 0.570 here (Q4_K's alike, 0.35 ms). */
static inline __attribute__((always_inline)) void
amx_offsets(const amx_type ty, const uint8_t *base, const float (*xs)[4][16], const zi_q8_act *a,
            int t0, int NT, int64_t k0, int64_t k1, __m512 *offv) {
    const size_t gb = amx_group_bytes(ty);
    for (int64_t k = k0; k < k1; k++) {
        __m512 cw0, cw1 = _mm512_setzero_ps();
        if (ty.kind != AMX_X) {
            const uint8_t *scp = base + (size_t)k * gb + (ty.kind == KQ8_0 ? 512 : 256);
            __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)scp));
            cw0 = ty.kind == KQ4_1
                      ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scp + 32)))
                      : _mm512_mul_ps(dw, _mm512_set1_ps(ty.kind == KQ4_0 ? -8.0f : -128.0f));
        } else {
            cw0 = _mm512_load_ps(xs[k - k0][2]);
            cw1 = _mm512_load_ps(xs[k - k0][3]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NT; i++)
            offv[i] = r16x_off(offv[i], cw0, cw1, a, t0 + i, k, ty.kind == AMX_X && ty.halves);
    }
}

/* Block columns [k0, k1) of group `base` for tokens t0..t0+NT-1 (NT <= 8),
 * onto their accumulators; sc->ub holds the window's decoded columns
 * (unused for Q8_0). */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_window(const amx_type ty, const uint8_t *base, const zi_q8_act *a, int t0, int NT, int64_t k0,
           int64_t k1, __m512 *acc, amx_scratch *sc) {
    const int64_t nb = a->nb;
    const size_t gb = amx_group_bytes(ty);
    const size_t astride = (size_t)nb * ZI_QK; /* q1 t, q2 t, q1 t+1, ... */
    const int8_t *qa = a->q + (size_t)t0 * nb * 2 * ZI_QK;
#define AMX_B(kk)                                                                                  \
    (ty.kind == KQ8_0 ? base + (size_t)(kk) * gb : sc->ub[(kk) - k0])
#define AMX_STORE(kk) amx_store(ty, (int)((kk) & 1), sc->c[(kk) & 3])
    /* Block j's products go ZI_AMX_AHEAD blocks before its float steps, its
     * store right after block j + 1's products (or, for the window's last
     * block, just before its float steps). */
#define AMX_TDP_NEXT()                                                                             \
    do {                                                                                           \
        amx_tdp(ty, (int)(next & 1), qa + (size_t)next * ZI_QK, astride, AMX_B(next));             \
        if (next > k0) AMX_STORE(next - 1);                                                        \
        next++;                                                                                    \
    } while (0)
    int64_t next = k0;
    while (next < k1 && next < k0 + ZI_AMX_AHEAD) AMX_TDP_NEXT();
    for (int64_t k = k0; k < k1; k++) {
        if (next == k + 1) AMX_STORE(k); /* the window's last block */
        amx_finish(ty, base, sc->c[k & 3], sc->xs[k - k0], a, t0, NT, k, acc);
        if (next < k1) AMX_TDP_NEXT();
    }
#undef AMX_TDP_NEXT
#undef AMX_STORE
#undef AMX_B
}

/* One token chunk's pass over a window, its accumulators from (or to) the
 * spill slot s unless the window is the row's first (last). */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_chunk(const amx_type ty, const uint8_t *base, const zi_q8_act *a, int t0, int NT, int64_t k0,
          int64_t k1, float (*s)[8][16], float *y, int64_t ldy, int64_t row0,
          amx_scratch *sc) {
    __m512 acc[8], offv[8];
    for (int i = 0; i < NT; i++) {
        acc[i] = k0 ? _mm512_load_ps(s[0][i]) : _mm512_setzero_ps();
        offv[i] = k0 ? _mm512_load_ps(s[1][i]) : _mm512_setzero_ps();
    }
    amx_window(ty, base, a, t0, NT, k0, k1, acc, sc);
    amx_offsets(ty, base, (const float(*)[4][16])sc->xs, a, t0, NT, k0, k1, offv);
    for (int i = 0; i < NT; i++) {
        if (k1 < a->nb) {
            _mm512_store_ps(s[0][i], acc[i]);
            _mm512_store_ps(s[1][i], offv[i]);
        } else {
            _mm512_storeu_ps(y + (t0 + i) * ldy + row0, _mm512_add_ps(acc[i], offv[i]));
        }
    }
}

/* Rows [r0, r1) of one type on the tiles. Tokens go in chunks of NT =
 * ceil(n / chunks) <= 8 (the tile shape is fixed per call); the last chunk
 * starts at n - NT and may redo a few tokens of the one before, which
 * rewrites the same values. */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_rows(const amx_type ty, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
         const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
    const int chunks = (n_tokens + 7) / 8, NT = (n_tokens + chunks - 1) / chunks;
    const int64_t nb = a->nb;
    const size_t gb = amx_group_bytes(ty);
    _Alignas(64) amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.rows[i] = (uint8_t)(2 * NT), cfg.colsb[i] = 64;
    if (!ty.halves) {
        for (int i = 2; i < 4; i++) cfg.colsb[i] = 32; /* A: K = 32 */
        for (int i = 4; i < 6; i++) cfg.rows[i] = 8;   /* B: 8 x 64 */
        cfg.rows[6] = cfg.rows[7] = 0, cfg.colsb[6] = cfg.colsb[7] = 0;
    } else {
        for (int i = 4; i < 6; i++) cfg.colsb[i] = 16; /* A: K = 16 */
        for (int i = 6; i < 8; i++) cfg.rows[i] = 4;   /* B: 4 x 64 */
    }
    /* GCC does not see that ldtilecfg reads the struct: keep its stores. */
    __asm__ volatile("" : : "r"(&cfg) : "memory");
    _tile_loadconfig(&cfg);
    amx_scratch sc;
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        int64_t decoded = -1; /* the first column of the window in sc.ub */
        for (int c0 = 0; c0 < chunks; c0 += AMX_SPAN) {
            const int c1 = c0 + AMX_SPAN < chunks ? c0 + AMX_SPAN : chunks;
            for (int64_t k0 = 0; k0 < nb; k0 += AMX_KC) {
                const int64_t k1 = k0 + AMX_KC < nb ? k0 + AMX_KC : nb;
                if (ty.kind != KQ8_0 && decoded != k0) {
                    for (int64_t k = k0; k < k1; k++) {
                        const uint8_t *G = base + (size_t)k * gb;
                        for (size_t o = 0; o < gb; o += 64)
                            _mm_prefetch((const char *)(G + 8 * gb + o), _MM_HINT_T0);
                        amx_decode(ty, G, sc.ub[k - k0]);
                        if (ty.kind == AMX_X) {
                            __m512 v[4];
                            r16x_col_scales(ty.planes, ty.halves, ty.cws, ty.sub, ty.e8m0, ty.zp,
                                            base, gb, nb, k, &v[0], &v[1], &v[2], &v[3]);
                            for (int j = 0; j < 4; j++) _mm512_store_ps(sc.xs[k - k0][j], v[j]);
                        }
                    }
                    decoded = k0;
                }
                for (int c = c0; c < c1; c++) {
                    const int t0 = c == chunks - 1 ? n_tokens - NT : c * NT;
                    float(*s)[8][16] = sc.spill[c - c0];
#define AMX_CHUNK(N)                                                                               \
    amx_chunk(ty, base, a, t0, N, k0, k1, s, y, ldy, R * 16, &sc)
                    switch (NT) { /* constant token counts: accumulators stay in registers */
                    case 1: AMX_CHUNK(1); break;
                    case 2: AMX_CHUNK(2); break;
                    case 3: AMX_CHUNK(3); break;
                    case 4: AMX_CHUNK(4); break;
                    case 5: AMX_CHUNK(5); break;
                    case 6: AMX_CHUNK(6); break;
                    case 7: AMX_CHUNK(7); break;
                    default: AMX_CHUNK(8); break;
                    }
#undef AMX_CHUNK
                }
            }
        }
    }
    _tile_release();
}

/* mm_r16 on the tiles for every type in a 16-row layout: one copy of the
 * driver per type, its fields constants. Returns 0 for another type. */
static ZI_AMX_FN int mm_r16_amx(int type, const uint8_t *w, size_t row_bytes, int64_t r0,
                                int64_t r1, const zi_q8_act *a, int n_tokens, float *y,
                                int64_t ldy) {
#define AMX_ROWS(...) amx_rows((amx_type){__VA_ARGS__}, w, row_bytes, r0, r1, a, n_tokens, y, ldy)
#define AMX_X_CASE(T, P, L, H, C, F, E, Z)                                                         \
    case T: AMX_ROWS(AMX_X, P, L, H, C, F, E, Z); return 1;
    switch (type) {
    case ZI_TYPE_Q4_0: AMX_ROWS(KQ4_0, 0, 0, 0, 0, 0, 0, 0.0f); return 1;
    case ZI_TYPE_Q4_1: AMX_ROWS(KQ4_1, 0, 0, 0, 0, 0, 0, 0.0f); return 1;
    case ZI_TYPE_Q8_0: AMX_ROWS(KQ8_0, 0, 0, 0, 0, 0, 0, 0.0f); return 1;
        ZI_R16X_TYPES(AMX_X_CASE)
    default: return 0;
    }
#undef AMX_X_CASE
#undef AMX_ROWS
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* The avx512 table's 16-row entry. Batches go to the tile unit where there
 * is one; a token or a few (decode) stay on the VNNI kernels, which are
 * bound by reading the weights then. */
static void mm_r16_any(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                       const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
#if defined(ZI_HAVE_AMX)
    if (n_tokens >= ZI_AMX_MIN_TOKENS && amx_usable() &&
        mm_r16_amx(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy))
        return;
#endif
    if (!mm_r16x(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy))
        mm_r16_vnni(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
}
#endif
