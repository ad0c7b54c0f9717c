/*
 * span_attention.h - the CPU backend's exact attention over a pass's own
 * rows (zi_backend_ops.span_attention, kernels/backend.h): bidirectional
 * for encoders, causal (s->causal) for a decoder's embedding inputs that
 * run whole in one pass (model_worker/model.h, zi_batch.f32_attn).
 *
 * An encoder's token attends to every token of its input, all of which are
 * in the pass (model_worker/encoder_span.h); a causal row to those of its
 * span up to itself. This reads the pass's own
 * float32 Q/K/V, not the KV cache (whose int16 K and float16 V rows put a
 * decoder-sized 1e-4 into an encoder's embedding), and computes the scores,
 * the softmax and the weighted sum of V in double: the products of two
 * floats are exact in double and the sums lose ~1e-16, so only the final
 * rounding of each output to float is left. Double costs little here: an
 * encoder's attention is a few percent of its pass (the matmuls dominate).
 * An image tile's 4096 rows are another matter: the backend sends spans
 * with zi_attn_shape.tile_precision to tile_mm.h's float32 attention
 * instead (cpu_backend.c).
 */
#ifndef ZI_SPAN_ATTENTION_H
#define ZI_SPAN_ATTENTION_H

#include <stdint.h>

#include "backend.h"
#include "threadpool.h"

/* Largest head_dim it takes (the accumulator of one head is on the stack;
 * model.c refuses larger heads). */
#define ZI_SPAN_ATTN_MAX_HEAD_DIM 1024

/* For each span r < n_spans, whose tokens are rows order[starts[r]] ..
 * order[starts[r+1] - 1] of q [.][n_heads*head_dim] and k, v
 * [.][n_kv_heads*head_dim]: out[t] = softmax(q[t] K^T * scale) V over the
 * span's rows, per head (GQA: head h reads kv head h / (n_heads/n_kv)).
 * order and starts are host memory; starts[0] = 0 and starts[n_spans] is
 * the number of rows. s->window and s->softcap must be 0 (no encoder has
 * them). Runs on the pool's threads, one (row, head) at a time; each
 * result depends only on its span's rows in span order. */
void zi_cpu_span_attention(zi_pool *pool, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts, int n_spans,
                           const zi_attn_shape *s);

#endif
