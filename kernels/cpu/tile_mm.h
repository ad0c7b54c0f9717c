/*
 * tile_mm.h - the CPU backend's products over a whole fixed-size input (an
 * image tile): zi_backend_ops.matmul_tile and span_attention's
 * float32-level path (zi_attn_shape.tile_precision), kernels/backend.h.
 *
 * Unlike the batch-invariant matmul, these may sum in any order; each
 * output is within float32-level rounding of exact (see below), far inside
 * what an image tower needs. Two kinds of kernel, chosen once per process:
 *
 *   AMX  (AMX-BF16 tiles, Sapphire Rapids and later; ZINFER_CPU_AMX=0 turns
 *        it off): every operand is split into two bfloat16 halves, hi =
 *        bf16(x) and lo = bf16(x - hi) (16 significant bits; an f16 weight's
 *        11 bits are held exactly), and each product is w_hi x_hi + w_hi x_lo
 *        + w_lo x_hi, three TDPBF16PS accumulating in float32. Per term the
 *        relative error is about 2^-17 (the dropped lo x lo term and the
 *        activations' 16 bits); the sums are float32.
 *   FMA  (AVX-512F without AMX): float32 products with fused multiply-adds,
 *        weights repacked into 16-wide panels, an 8 x 32 outer-product
 *        microkernel.
 *   none (no AVX-512): zi_tile_kind() is 0 and the backend runs the
 *        ordinary products instead.
 *
 * The right operand (a weight, or attention's K and V) is packed once into
 * the kind's layout (zi_tile_b); a weight's pack lives in zi_weight.aux.
 */
#ifndef ZI_TILE_MM_H
#define ZI_TILE_MM_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "threadpool.h"

enum { ZI_TILE_NONE = 0, ZI_TILE_FMA = 1, ZI_TILE_AMX = 2 };

/* The kind this process uses (asks Linux for the tile state once; the
 * environment's ZINFER_CPU_AMX=0 keeps FMA). */
int zi_tile_kind(void);

/* A right operand B, n rows (outputs) of k values, in a kind's layout. */
typedef struct zi_tile_b zi_tile_b;

/* The scratch of the tile products (packed activations, attention's K/V
 * packs), grown as needed and kept between calls; one per backend. */
typedef struct zi_tile_ctx zi_tile_ctx;

zi_tile_ctx *zi_tile_ctx_create(zi_pool *pool);
void zi_tile_ctx_free(zi_tile_ctx *c);

/* Packs weight w (any type zi_dequantize_row reads, rows in the file's
 * layout at w->file_data, or w->data where the layout is the file's) for
 * kind zi_tile_kind(). NULL with err set on failure (ZI_ENOMEM,
 * ZI_EUNSUPPORTED when the kind is none). */
zi_tile_b *zi_tile_pack_weight(zi_tile_ctx *c, const zi_weight *w, zi_error *err);
void zi_tile_b_free(zi_tile_b *b);

/* y[t][r] = dot(B[r], x[t]) for t < n_tokens (x rows of b's k floats, y
 * rows of b's n). Returns ZI_ENOMEM (y untouched) when the scratch cannot
 * grow. */
int zi_tile_matmul(zi_tile_ctx *c, float *y, const zi_tile_b *b, const float *x, int n_tokens);

/* span_attention (span_attention.h) in float32 precision: scores of Q
 * blocks against K blocks on the tile kernels, an online softmax in float,
 * P.V on the tile kernels. Requires s->causal, window, softcap 0 and no
 * sinks. Returns ZI_ENOMEM (out untouched) when scratch cannot grow. */
int zi_tile_span_attention(zi_tile_ctx *c, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts,
                           int n_spans, const zi_attn_shape *s);

#endif
