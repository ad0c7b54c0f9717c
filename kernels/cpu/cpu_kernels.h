/*
 * cpu_kernels.h - the CPU inner loops, one table per instruction set.
 *
 * The same source (cpu_kernels_impl.h) is compiled three times: plain C
 * (kernels_scalar.c), with AVX2+FMA+F16C (kernels_avx2.c) and with
 * AVX-512 BW/VL/VNNI (kernels_avx512.c). Each compilation exports one table;
 * zi_cpu_kernels_select() picks the best table this CPU supports at run
 * time, so one binary runs everywhere and uses what the machine has. The
 * environment variable ZINFER_CPU_ISA=scalar|avx2|avx512 forces a table
 * (tests compare every table against the scalar one).
 *
 * Kernels work on row ranges so the backend's thread pool can split a
 * matrix by rows; they never allocate and never synchronize.
 */
#ifndef ZI_CPU_KERNELS_H
#define ZI_CPU_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h" /* zi_kv_type */
#include "quant.h"

/*
 * One KV head's part of a paged cache, as attend reads it (the layout is
 * cpu_backend.c's). Position j (counted from `first`, below) lives in block
 * b = blocks[(first + j) / bs], row r = (first + j) % bs: its K row is hd int16 codes at k + b *
 * kstride + r * hd, to be multiplied by the float at ks + b * sstride + r; its V row is hd float16
 * values at v + b * vstride + r * hd. That is the default --kv-type's
 * layout (ZI_KV_DEFAULT); with another (type), kq and vq hold the rows
 * instead: K row at kq + b * kstride + r * krow, V row at vq + b * vstride
 * + r * vrow, strides in bytes, each row hd float16 values or hd / 32
 * Q8_0 or Q4_0 blocks (quant.h's).
 */
typedef struct zi_kv_head {
    const int16_t *k;
    const float *ks;
    const uint16_t *v;
    const int32_t *blocks;
    int bs;
    size_t kstride, sstride, vstride;
    int type;               /* zi_kv_type */
    const uint8_t *kq, *vq; /* type != ZI_KV_DEFAULT: the rows (above) */
    size_t krow, vrow;
    /* The kernel's position j is the cache's position first + j (a sliding
     * window starts past 0); 0 <= first < bs, blocks already advanced. */
    int first;
    /* Attention sinks (gpt-oss): a learned logit per query head that takes
     * a share of the softmax without a value row: sum += exp(sink - max).
     * sinks[g] is the call's query head g's (attend_block: row r's is
     * sinks[r % G]); NULL: none. */
    const float *sinks;
} zi_kv_head;

/*
 * The quantized KV formats (ZI_KV_Q8_0, ZI_KV_Q4_0) keep each K and V row
 * rotated by the orthonormal Hadamard matrix H of its size (Sylvester's,
 * times 1 / sqrt(n)), as llama.cpp does for its quantized caches: a few
 * large channels of a row (K's outliers) are spread over all its values,
 * so a 32-value block's scale fits them all far better. H is symmetric
 * and H H = I: attention rotates the query (scores are unchanged, (Hq) .
 * (Hk) = q . k) and rotates its output back (a sum of rotated V rows).
 * Rows of 32..256 values, a power of two (the usual head sizes); others
 * are stored unrotated.
 */
static inline int zi_kv_rotated(int type, int n) {
    return (type == ZI_KV_Q8_0 || type == ZI_KV_Q4_0) && n >= 32 && n <= 256 && !(n & (n - 1));
}

/* x = H x for n values (zi_kv_rotated's n): the butterflies of the fast
 * Walsh-Hadamard transform in float, then one multiply by 1 / sqrt(n);
 * the same operations, so the same bits, wherever it runs. */
static inline void zi_kv_rotate(float *x, int n) {
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b, x[j + h] = a - b;
            }
    const float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

typedef struct zi_cpu_kernels {
    const char *isa;
    /* x[0..n) -> row `row` of a (n = 32 * a->nb). */
    void (*quantize_act)(const float *x, const zi_q8_act *a, int64_t row);
    /*
     * Quantized matrix product over rows [r0, r1):
     *   y[t * ldy + r] = dot(W row r, activation t)  for t < n_tokens
     * W rows are row_bytes apart; activation rows come from `a`.
     */
    void (*mm_q4_0)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const zi_q8_act *a,
                    int n_tokens, float *y, int64_t ldy);
    void (*mm_q4_1)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const zi_q8_act *a,
                    int n_tokens, float *y, int64_t ldy);
    void (*mm_q8_0)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const zi_q8_act *a,
                    int n_tokens, float *y, int64_t ldy);
    /*
     * The same products for weights in the 16-row layout (repack.h) or, for
     * the types repack_x.h lists, its extended layout; r0 and r1 multiples
     * of 16. NULL in the scalar table, whose weights stay in GGUF layout.
     * Batches of 4 or more tokens run on the AMX tile unit where the CPU
     * has AMX-INT8 and Linux grants it (bit-identical results;
     * ZINFER_CPU_AMX=0 keeps them on VNNI).
     */
    void (*mm_r16)(int type, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                   const zi_q8_act *a, int n_tokens, float *y, int64_t ldy);
    /* 1 if this table's mm_r16 runs batches on AMX tiles on this machine
     * (asks Linux for the tile state the first time). NULL where the table
     * has no AMX kernel (scalar, avx2, or a compiler without AMX). */
    int (*amx)(void);
    /* Float-weight products (F32/F16/BF16 rows) with float activations of
     * length n, n apart. */
    void (*mm_f32)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t n, int n_tokens, float *y, int64_t ldy);
    void (*mm_f16)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                   int64_t n, int n_tokens, float *y, int64_t ldy);
    void (*mm_bf16)(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const float *x,
                    int64_t n, int n_tokens, float *y, int64_t ldy);
    /*
     * Attention of G query heads that share one KV head (grouped-query
     * attention) over positions 0..n-1 of kv (below): q and out are G rows
     * of hd floats, scores is scratch for G*n floats. out[g] =
     * softmax(q[g] . K^T * scale) V. Each K and V row is read once for all
     * G heads. softcap > 0: each score s becomes softcap * tanh(s / softcap)
     * before the softmax (attention logit soft-capping; the same loop in
     * every table, softcap_scores).
     */
    void (*attend)(const float *q, int G, const zi_kv_head *kv, int n, int hd, float scale,
                   float softcap, float *scores, float *out);
    /*
     * attend for B consecutive tokens of one sequence (a prompt's): token b
     * has its G query rows at q + b * qs and attends to positions 0..n+b-1
     * (n for the first token); its output goes to out + b * os; scores is
     * scratch for G * B * (n + B - 1) floats; G * B <= 64. Each token's
     * output is bit-identical to attend's for it alone; the AVX-512 table
     * reads each cached K and V row once for the whole block.
     */
    void (*attend_block)(const float *q, size_t qs, int G, int B, const zi_kv_head *kv, int n,
                         int hd, float scale, float softcap, float *scores, float *out, size_t os);
    /* dst[i] = x[i] rounded to float16 (to nearest, ties to even), i < n. */
    void (*to_f16)(uint16_t *dst, const float *x, int64_t n);
    /* Attention helpers over float vectors. */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* out[r] = dot(a, b + r * stride, n) for r < 4, the same bits as four
     * dot calls (one weight row against four rows of input). */
    void (*dot4)(const float *a, const float *b, size_t stride, int64_t n, float *out);
    void (*axpy)(float *y, float a, const float *x, int64_t n); /* y += a*x */
    void (*scale)(float *y, float a, int64_t n);                /* y *= a */
    /* A LoRA term's first product (backend.h's lora): c[k] = dot(row k of
     * a, x) for k < rank, rows of n values (float16 when f16, else
     * float32), in float32: up to 8 rows at once over one pass of x, each
     * row's sum in 8 lanes then reduced (the same bits for a token
     * whatever the rest of the pass). */
    void (*lora_down)(float *c, const void *a, const float *x, int rank, int64_t n, int f16);
    /* A LoRA term's second product (backend.h's lora): y[i] += the sum
     * over k < rank, in k's order, of c[k] * bt[k * rows + i], each step a
     * fused multiply-add; bt float16 when f16, else float32. One pass over
     * y, whatever the rank. */
    void (*lora_up)(float *y, const float *c, const void *bt, int rank, int64_t rows, int f16);
    /* out[i] = g[i] / (1 + expf(-g[i])) * u[i] (SwiGLU); out may be g. */
    void (*swiglu)(float *out, const float *g, const float *u, int64_t n);
    /* out[i] = gelu_tanh(g[i]) * u[i] (GeGLU, GELU's tanh approximation);
     * out may be g. The SIMD tables give the scalar loop's bits. */
    void (*geglu)(float *out, const float *g, const float *u, int64_t n);
    /* x[i] = x[i] / (1 + expf(-x[i])) (SiLU), in place; SwiGLU's expf. */
    void (*silu)(float *x, int64_t n);
    /* y[i] = y[i] / (1 + expf(-g[i])) (y times sigmoid(g)). */
    void (*sigmoid_mul)(float *y, const float *g, int64_t n);
    /*
     * The gated delta rule (backend.h's delta_net) for a run of n
     * consecutive tokens of one sequence on one value head, on its state S
     * (d x d floats, [key i][value j]). Token t's k and q are rows t of k
     * and q (d floats each, already normalized, q scaled by 1/sqrt(d)), its
     * v is at v + t * vs, beta[t] = sigmoid(b), decay[t] = e^g: S = decay
     * S; u = beta (v - S^T k); S += k u^T; out + t * os = S^T q (d
     * floats). In float32, each sum over i in order with fused
     * multiply-adds: a token's results are the same bits in a run of any
     * length and in every table.
     */
    void (*delta_rule)(float *S, int d, int n, const float *k, const float *q, const float *v,
                       size_t vs, const float *beta, const float *decay, float *out, size_t os);
    /*
     * The Mamba-2 scan (backend.h's ssm_scan, less its D skip) for a run
     * of n consecutive tokens of one sequence on one head, on its state S
     * (N x P floats, [state n][column p]). Token t's x is at x + t * xs (P
     * floats), its B and C at B + t * bs and C + t * bs (N floats each),
     * d[t] its softplus'd step and dA[t] = exp(d[t] a): S[n][p] = dA S[n][p]
     * + (d x[p]) B[n]; out + t * os = the sums over n of S[n][p] C[n] (P
     * floats). In float32 with fused multiply-adds, each sum over n in
     * order: a token's results are the same bits in a run of any length
     * and in every table.
     */
    void (*ssm_run)(float *S, int P, int N, int n, const float *x, size_t xs, const float *B,
                    const float *C, size_t bs, const float *d, const float *dA, float *out,
                    size_t os);
} zi_cpu_kernels;

extern const zi_cpu_kernels zi_cpu_kernels_scalar;
extern const zi_cpu_kernels zi_cpu_kernels_avx2;
extern const zi_cpu_kernels zi_cpu_kernels_avx512;

/* The best table for this CPU, or the one ZINFER_CPU_ISA names (NULL if it
 * names one this CPU cannot run or an unknown name). */
const zi_cpu_kernels *zi_cpu_kernels_select(void);
/* The table called `isa` if this CPU can run it, else NULL. */
const zi_cpu_kernels *zi_cpu_kernels_by_name(const char *isa);

#endif
