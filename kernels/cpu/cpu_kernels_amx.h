/*
 * cpu_kernels_amx.h - the 16-row products on AMX-INT8 tiles (mm_r16_amx)
 * and mm_r16, the avx512 table's 16-row entry, which sends batches to the
 * tiles where the CPU has them and the rest to mm_r16_vnni. One of the
 * units that cpu_kernels_impl.h includes, in its order, once per
 * instruction set.
 *
 * What each table compiles here:
 *   scalar   nothing.
 *   AVX2     nothing (its 16-row entry is mm_r16_avx2, cpu_kernels_matmul.h).
 *   AVX-512  mm_r16 (#if ZI_HAVE_VNNI && __AVX512F__), and with it, on
 *            x86-64 Linux with GCC 11 or clang 12 and later, ZI_HAVE_AMX:
 *            mm_r16_amx and its helpers, compiled for amx-tile,amx-int8 by
 *            a target attribute (ZI_AMX_FN), not by the file's flags, and
 *            run only when amx_usable() says the CPU and kernel allow it.
 */
#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__) && defined(__x86_64__) &&                       \
    defined(__linux__) && (defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11)
#define ZI_HAVE_AMX 1
#include <cpuid.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ZI_AMX_FN __attribute__((target("amx-tile,amx-int8")))
/* Fewer tokens than this stay on the VNNI kernel: a chunk costs the tile
 * unit about the same for 2 tokens as for 8 (~40 ns per 16 x 32 block), so
 * AMX wins from ~4 tokens (Q4_1 576x3072: 2 tokens 8.3 vs 6.3 ns per row
 * block and token, 4: 4.8 vs 5.4, 16: 3.3 vs 5.4). */
#define ZI_AMX_MIN_TOKENS 4

/*
 * AMX-INT8 (Sapphire Rapids and later) for batched products in the 16-row
 * layout. The chunk of a block column is exactly the B operand's VNNI layout
 * (row r = chunk r: four codes of each of 16 rows), and the activation rows
 * q1, q2 of consecutive tokens lie nb*32 bytes apart, so one tile load
 * stacks [q1 t0, q2 t0, q1 t1, ...] for block k: one TDPBSUD (M = 2 x up to
 * 8 tokens, K = 32, N = 16 rows) leaves in C row 2i the q1 sums and in row
 * 2i+1 the q2 sums of token i, each lane one weight row: the same exact
 * integers as the VNNI kernel, so the float steps after them (the same ones,
 * in the same order) give bit-identical outputs. The vector units are left
 * with the per-token float work: ~6 ops per token and block instead of ~24.
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

/* Scratch for a ring of 4 blocks in flight: C results (16 x 64 bytes) and
 * unpacked Q4 block columns (8 x 64 bytes). */
typedef struct amx_scratch {
    _Alignas(64) int32_t c[4][16][16];
    _Alignas(64) uint8_t b[4][512];
} amx_scratch;

/* How many blocks the tile unit runs ahead of the float steps that read its
 * results back (a tile store is not forwarded to loads right away). */
#define ZI_AMX_AHEAD 2

/* Q4 codes of block column kk as bytes, into ring slot kk % 4 (one issue
 * ahead of its tile load, so the stores have reached the cache), unless the
 * caller unpacked the whole group (ub). */
#define AMX_UNPACK(kk)                                                                             \
    do {                                                                                           \
        if (kind != KQ8_0 && !ub && (kk) < nb) {                                                   \
            const uint8_t *G_ = base + (size_t)(kk) * gb;                                         \
            uint8_t *d_ = sc->b[(kk) & 3];                                                         \
            for (int p_ = 0; p_ < 4; p_++) {                                                       \
                __m512i x_ = _mm512_loadu_si512((const void *)(G_ + 64 * p_));                     \
                _mm512_store_si512((void *)(d_ + 128 * p_), _mm512_and_si512(x_, m4));             \
                _mm512_store_si512((void *)(d_ + 128 * p_ + 64),                                   \
                                   _mm512_and_si512(_mm512_srli_epi16(x_, 4), m4));                \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* Integer sums of block column kk into C ring slot kk % 4. Tiles: 0/1 C, 2/3
 * A (activations), 4/5 B (weights), by the parity of kk. */
#define AMX_ISSUE(CT, AT, BT, kk)                                                                  \
    do {                                                                                           \
        const uint8_t *G_ = base + (size_t)(kk) * gb;                                             \
        for (size_t o_ = 0; o_ < gb; o_ += 64)                                                     \
            _mm_prefetch((const char *)(G_ + 8 * gb + o_), _MM_HINT_T0);                           \
        __asm__ volatile("" ::: "memory"); /* the tile load reads unpacked codes */                \
        _tile_loadd(AT, qa + (size_t)(kk) * ZI_QK, astride);                                      \
        _tile_loadd(BT,                                                                            \
                    kind == KQ8_0 ? (const void *)G_                                               \
                    : ub          ? (const void *)(ub + (size_t)(kk) * 512)                       \
                                  : (const void *)sc->b[(kk) & 3],                                 \
                    64);                                                                           \
        _tile_zero(CT);                                                                            \
        _tile_dpbsud(CT, AT, BT);                                                                  \
        _tile_stored(CT, sc->c[(kk) & 3], 64);                                                     \
    } while (0)

#define AMX_STEP(kk)                                                                               \
    do {                                                                                           \
        AMX_UNPACK((kk) + 1);                                                                      \
        if ((kk) & 1)                                                                              \
            AMX_ISSUE(1, 3, 5, kk);                                                                \
        else                                                                                       \
            AMX_ISSUE(0, 2, 4, kk);                                                                \
    } while (0)

/* The float steps of mm_r16_vnni for block k of NT tokens, from C rows. */
static inline __attribute__((always_inline)) void amx_finish_block(int kind, const uint8_t *G,
                                                                   const int32_t *c,
                                                                   const zi_q8_act *a, int t0,
                                                                   int NT, int64_t k, __m512 *acc,
                                                                   __m512 *offv) {
    const int64_t nb = a->nb;
    const uint8_t *scp = G + (kind == KQ8_0 ? 512 : 256);
    __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)scp));
    __m512 cw = kind == KQ4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scp + 32)))
                              : _mm512_mul_ps(dw, _mm512_set1_ps(kind == KQ4_0 ? -8.0f : -128.0f));
    for (int i = 0; i < NT; i++) {
        const int64_t t = t0 + i;
        __m512i hi = _mm512_load_si512((const void *)(c + 32 * i));
        __m512i lo = _mm512_load_si512((const void *)(c + 32 * i + 16));
        __m512 p = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo));
        acc[i] = _mm512_fmadd_ps(p, _mm512_mul_ps(dw, _mm512_set1_ps(a->d[t * nb + k])), acc[i]);
        offv[i] = _mm512_fmadd_ps(cw, _mm512_set1_ps(a->s[t * nb + k]), offv[i]);
    }
}

/* Rows 16R..16R+15 for tokens t0..t0+NT-1 (NT <= 8, the tile rows / 2). */
static inline __attribute__((always_inline)) ZI_AMX_FN void
amx_group(int kind, const uint8_t *base, const uint8_t *ub, const zi_q8_act *a, int t0, int NT,
          float *y, int64_t ldy, int64_t row0, amx_scratch *sc) {
    const int64_t nb = a->nb;
    const size_t gb = 16 * block_bytes(kind);
    const size_t astride = (size_t)nb * ZI_QK; /* q1 t, q2 t, q1 t+1, ... */
    const int8_t *qa = a->q + (size_t)t0 * nb * 2 * ZI_QK;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    __m512 acc[8], offv[8];
    for (int i = 0; i < NT; i++) acc[i] = offv[i] = _mm512_setzero_ps();
    /* The tile unit runs ZI_AMX_AHEAD blocks ahead of the float steps. */
    AMX_UNPACK(0);
    for (int64_t k = 0; k < ZI_AMX_AHEAD && k < nb; k++) AMX_STEP(k);
    for (int64_t k = 0; k < nb; k++) {
        if (k + ZI_AMX_AHEAD < nb) AMX_STEP(k + ZI_AMX_AHEAD);
        amx_finish_block(kind, base + (size_t)k * gb, sc->c[k & 3][0], a, t0, NT, k, acc, offv);
    }
    for (int i = 0; i < NT; i++)
        _mm512_storeu_ps(y + (t0 + i) * ldy + row0, _mm512_add_ps(acc[i], offv[i]));
}

/* mm_r16 on AMX. Tokens go in chunks of NT = ceil(n / chunks) <= 8 (the
 * tile shape is fixed per call); the last chunk starts at n - NT and may
 * redo a few tokens of the one before, which rewrites the same values. */
static ZI_AMX_FN void mm_r16_amx(int type, const uint8_t *w, size_t row_bytes, int64_t r0,
                                 int64_t r1, const zi_q8_act *a, int n_tokens, float *y,
                                 int64_t ldy) {
    const int kind = type == ZI_TYPE_Q4_0 ? KQ4_0 : type == ZI_TYPE_Q4_1 ? KQ4_1 : KQ8_0;
    const int chunks = (n_tokens + 7) / 8, NT = (n_tokens + chunks - 1) / chunks;
    _Alignas(64) amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 2; i++) {
        cfg.rows[i] = (uint8_t)(2 * NT), cfg.colsb[i] = 64;     /* C */
        cfg.rows[2 + i] = (uint8_t)(2 * NT), cfg.colsb[2 + i] = 32; /* A */
        cfg.rows[4 + i] = 8, cfg.colsb[4 + i] = 64;             /* B */
    }
    _tile_loadconfig(&cfg);
    amx_scratch sc;
    /* Q4 codes of a whole group as bytes, once for all chunks (most products:
     * up to 2048 columns); wider rows unpack block by block in the ring. */
    _Alignas(64) uint8_t ubuf[64][512];
    const int64_t nb = a->nb;
    const uint8_t *ub = kind != KQ8_0 && nb <= 64 ? ubuf[0] : NULL;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    for (int64_t R = r0 / 16; R < r1 / 16; R++) {
        const uint8_t *base = w + (size_t)R * 16 * row_bytes;
        for (int64_t k = 0; ub && k < nb; k++) {
            const uint8_t *G = base + (size_t)k * 16 * block_bytes(kind);
            for (int p = 0; p < 4; p++) {
                __m512i x = _mm512_loadu_si512((const void *)(G + 64 * p));
                _mm512_store_si512((void *)(ubuf[k] + 128 * p), _mm512_and_si512(x, m4));
                _mm512_store_si512((void *)(ubuf[k] + 128 * p + 64),
                                   _mm512_and_si512(_mm512_srli_epi16(x, 4), m4));
            }
        }
        for (int c = 0; c < chunks; c++) {
            int t0 = c == chunks - 1 ? n_tokens - NT : c * NT;
            switch (NT) { /* constant token counts: accumulators stay in registers */
            case 1: amx_group(kind, base, ub, a, t0, 1, y, ldy, R * 16, &sc); break;
            case 2: amx_group(kind, base, ub, a, t0, 2, y, ldy, R * 16, &sc); break;
            case 3: amx_group(kind, base, ub, a, t0, 3, y, ldy, R * 16, &sc); break;
            case 4: amx_group(kind, base, ub, a, t0, 4, y, ldy, R * 16, &sc); break;
            case 5: amx_group(kind, base, ub, a, t0, 5, y, ldy, R * 16, &sc); break;
            case 6: amx_group(kind, base, ub, a, t0, 6, y, ldy, R * 16, &sc); break;
            case 7: amx_group(kind, base, ub, a, t0, 7, y, ldy, R * 16, &sc); break;
            default: amx_group(kind, base, ub, a, t0, 8, y, ldy, R * 16, &sc); break;
            }
        }
    }
    _tile_release();
}
#endif

#if defined(ZI_HAVE_VNNI) && defined(__AVX512F__)
/* Batches go to the tile unit where there is one; a token or a few (decode)
 * stay on the VNNI kernel, which is bound by reading the weights then. */
static void mm_r16(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                   const zi_q8_act *a, int n_tokens, float *y, int64_t ldy) {
#if defined(ZI_HAVE_AMX)
    if (n_tokens >= ZI_AMX_MIN_TOKENS && amx_usable()) {
        mm_r16_amx(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
        return;
    }
#endif
    mm_r16_vnni(type, w, row_bytes, r0, r1, a, n_tokens, y, ldy);
}
#endif
