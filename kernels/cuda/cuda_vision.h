/*
 * cuda_vision.h - the CUDA kernels of the encoders' ops (the image towers
 * of model_worker/vision.h, the bert encoders, a decoder's whole embedding
 * inputs): LayerNorm with a bias, GELU, the weighted sum of rows and the
 * attention over a pass's own rows (span_attention), behind plain C launch
 * functions.
 *
 * As cuda_kernels.h: pointers are device pointers, int32 arrays are device
 * copies of the interface's host arrays (cuda_backend.c stages them), every
 * launcher queues work on `stream`, never allocates or synchronizes, and
 * returns the launch status. Each op is backend.h's op of the same name,
 * computed as the CPU backend defines it (kernels/cpu/cpu_backend.c,
 * span_attention.c): the same float32 expressions where the CPU's are
 * float32, double where the CPU's are double, so the results agree within
 * float32 rounding (tests/gpu/test_cuda_backend.c, test_vision_ops).
 */
#ifndef ZI_CUDA_VISION_H
#define ZI_CUDA_VISION_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* y = (x - mean(x)) / sqrt(var(x) + eps) * w + b per row of dim (y may be
 * x): the mean, the variance and the factor in double, then one float
 * multiply and one float add (no fused multiply-add), as the CPU. */
cudaError_t zi_cuda_layernorm(float *y, const float *x, const float *w, const float *b,
                              int n_tokens, int dim, float eps, cudaStream_t stream);

/* x[i] = gelu(x[i]), GELU's tanh approximation as the geglu kernel
 * computes it (the CPU's gelu is its geglu with an up of ones). */
cudaError_t zi_cuda_gelu(float *x, size_t n, cudaStream_t stream);

/* out[t] = sum over j < k, in that order, of w[t*k + j] * y[idx[t*k + j]]
 * for t < n_out, rows of dim floats (out must not alias y); each product
 * and sum rounded on its own, as the CPU's loop. */
cudaError_t zi_cuda_weighted_sum_rows(float *out, const float *y, const int32_t *idx,
                                      const float *w, int n_out, int k, int dim,
                                      cudaStream_t stream);

/* Rows of a span one block of span_attention takes for heads of head_dim
 * (the host splits each span into tiles of this many rows). */
int zi_cuda_span_tile_rows(int head_dim);

/*
 * backend.h's span_attention: span r's rows are order[starts[r]] ..
 * order[starts[r+1] - 1] of q ([.][n_heads * head_dim]) and k, v
 * ([.][n_kv_heads * head_dim]); tile t < n_tiles is rows order[tiles[2t]]
 * onwards of span tiles[2t + 1] (zi_cuda_span_tile_rows of them at most,
 * never past the span). Each row attends to its span's rows (with causal,
 * those up to itself), per head, GQA as attention. The scores, the softmax
 * and the weighted sum of V are in double (products of floats exact, as
 * the CPU's exact path), or with f32 in float32 (the CPU's tile_precision
 * path: any order, ~1e-6 relative). head_dim 1..ZI_CUDA_MAX_HEAD_DIM.
 */
cudaError_t zi_cuda_span_attention(float *out, const float *q, const float *k, const float *v,
                                   const int32_t *order, const int32_t *starts,
                                   const int32_t *tiles, int n_tiles, int n_heads, int n_kv_heads,
                                   int head_dim, float scale, int causal, int f32,
                                   cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
