/*
 * cuda_kernels.h - the CUDA kernels of the backend, behind plain C launch
 * functions.
 *
 * cuda_kernels.cu holds the kernels; cuda_backend.c (C, compiled by the host
 * compiler with the project's warnings) calls these launchers, so the only
 * code nvcc compiles is device code and its launch glue. Every launcher
 * queues work on `stream`, never allocates, never synchronizes, and returns
 * the launch status (cudaGetLastError), so all of them may be captured in a
 * CUDA graph.
 *
 * Pointers are device pointers; int32 metadata arrays (ids, pos, seq) are
 * device copies of the interface's host arrays. Matrices are row-major with
 * one row per token, as in backend.h.
 */
#ifndef ZI_CUDA_KERNELS_H
#define ZI_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Products with at most this many tokens use the matrix-vector kernel (the
 * weights are read once for all tokens); above it, dequantize + cuBLAS. */
#define ZI_CUDA_MMV_MAX_TOKENS 8

/* Attention splits a long context over at most this many blocks per
 * (token, head) and merges the parts (flash-decoding). */
#define ZI_CUDA_ATTN_MAX_SPLIT 32

/* Largest head dimension the attention kernel handles (the model's limit). */
#define ZI_CUDA_MAX_HEAD_DIM 1024

/* cudaSuccess when this build holds code the current device can run, else
 * cudaFuncGetAttributes's error (cudaErrorNoKernelImageForDevice, ...). */
cudaError_t zi_cuda_kernels_check(void);
/* An empty kernel (one thread): what one kernel node of a graph costs,
 * for the benchmark's floor. */
cudaError_t zi_cuda_noop(cudaStream_t s);

/* y[t * rows + r] = dot(W row r, x[t * cols ..]) for t < n_tokens
 * (1..ZI_CUDA_MMV_MAX_TOKENS). W has `type` (a zi_ggml_type) rows of
 * row_bytes; cols is a multiple of the type's block. Types: F32, F16, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS, MXFP4 (the
 * weights are decoded exactly as the CPU backend decodes them; qdecode.h). */
cudaError_t zi_cuda_mmv(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                        const float *x, float *y, int n_tokens, cudaStream_t stream);

/* W (rows x cols of `type`) -> fp16, row-major, into out (rows * cols
 * halves). For every quantized type zi_cuda_mmv takes, BF16 and F32. */
cudaError_t zi_cuda_to_f16(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                           void *out, cudaStream_t stream);

/* W (rows x cols of `type`) -> float32, row-major, into out (rows * cols
 * floats), exactly. For every type zi_cuda_mmv takes. */
cudaError_t zi_cuda_to_f32(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                           float *out, cudaStream_t stream);

/* n floats -> fp16 (out holds n halves). */
cudaError_t zi_cuda_f32_to_f16(const float *x, void *out, size_t n, cudaStream_t stream);

/* y[i * cols ..] = row ids[i] of the table, dequantized to float. */
cudaError_t zi_cuda_get_rows(int type, const void *table, size_t row_bytes, int64_t cols,
                             const int32_t *ids, int n, float *y, cudaStream_t stream);

/* y = x / sqrt(mean(x^2) + eps) * w per row of dim (y may be x). */
cudaError_t zi_cuda_rmsnorm(float *y, const float *x, const float *w, int n_tokens, int dim,
                            float eps, cudaStream_t stream);

/* A RoPE's frequencies: backend.h's zi_rope_freqs, its factors (rope_dim/2
 * floats, NULL for all 1) in device memory. */
typedef struct zi_cuda_rope_freqs {
    float base, freq_scale, mscale;
    float ext_factor, corr_lo, corr_hi; /* YaRN (ext_factor 0: none) */
    const float *factors;
} zi_cuda_rope_freqs;

/* Adjacent-pair RoPE in place, x [n_tokens][n_heads][head_dim]; the same
 * angles as the CPU backend (computed in double): pair i turns by
 * pos * freq_scale * base^(-2i/rope_dim) / factors[i], mixed with the
 * unscaled angle by YaRN's ramp when ext_factor is set (backend.h), cos
 * and sin times mscale. */
cudaError_t zi_cuda_rope(float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
                         int rope_dim, const zi_cuda_rope_freqs *rf, cudaStream_t stream);

/* The same rotation in the NEOX layout: pair i is (x[i], x[i + rope_dim/2])
 * with the angle of the adjacent layout's pair 2i (gemma, qwen2, ...).
 * rope_dim even and <= head_dim, else cudaErrorInvalidValue. */
cudaError_t zi_cuda_rope_neox(float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
                              int rope_dim, const zi_cuda_rope_freqs *rf, cudaStream_t stream);

/*
 * The paged KV cache (backend.h): per layer a pool [n_blocks][block_size]
 * [kvd] floats; token t's sequence is row seq[t] of `tables` (rows of
 * `stride` block ids, a device copy), and position p of it lives in block
 * tables[seq[t] * stride + p / block_size], row p % block_size.
 */

/* Writes k/v[t] (kvd floats each) at position pos[t] of token t's sequence. */
cudaError_t zi_cuda_kv_store(float *kc, float *vc, const float *k, const float *v,
                             const int32_t *pos, const int32_t *seq, const int32_t *tables,
                             int stride, int block_size, int n_tokens, int kvd,
                             cudaStream_t stream);

/*
 * out[t][h] = softmax(q[t][h] . K[start..pos[t]] * scale) V over token t's
 * sequence (with softcap > 0 each score s first becomes softcap * tanh(s /
 * softcap), attention logit soft-capping), where start = 0, or with window > 0 (a sliding-window
 * layer) max(0, w - window + 1), w = win_pos[t] (backend.h's zi_batch_view.win_pos: an image
 * token whose pos is its tile's reach), or pos[t] when win_pos is NULL; head h reads KV head h /
 * (n_heads / n_kv_heads). Only blocks
 * holding positions start..pos[t] are looked up. n_split > 1 splits those positions of each (token,
 * head) over n_split blocks whose partial results go to scratch (n_tokens * n_heads * n_split *
 * (head_dim + 2) floats) and are merged by a second kernel; n_split == 1
 * needs no scratch. sinks (NULL: none; device memory, n_heads floats):
 * gpt-oss's attention sinks, each a term e^(sink - max) in its head's
 * softmax denominator (backend.h's zi_attn_shape.sinks).
 */
cudaError_t zi_cuda_attention(float *out, const float *q, const float *kc, const float *vc,
                              const int32_t *pos, const int32_t *win_pos, const int32_t *seq,
                              const int32_t *tables, int stride, int block_size, int n_tokens,
                              int n_heads, int n_kv_heads, int head_dim, float scale, float softcap,
                              int window, const float *sinks, int n_split, float *scratch,
                              cudaStream_t stream);

/* out[i] = silu(gate[i]) * up[i] (out may alias gate). */
cudaError_t zi_cuda_swiglu(float *out, const float *gate, const float *up, size_t n,
                           cudaStream_t stream);

/* gpt-oss's clamped SwiGLU (backend.h's swiglu_oai): with x = min(gate[i],
 * limit) and v = clamp(up[i], -limit, limit), out[i] = x / (1 +
 * e^(-alpha x)) * (v + 1), as the CPU backend computes it (out may alias
 * gate). */
cudaError_t zi_cuda_swiglu_oai(float *out, const float *gate, const float *up, size_t n,
                               float alpha, float limit, cudaStream_t stream);

/* out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation computed as the
 * CPU backend does (out may alias gate). */
cudaError_t zi_cuda_geglu(float *out, const float *gate, const float *up, size_t n,
                          cudaStream_t stream);

/* x[i] *= s */
cudaError_t zi_cuda_scale(float *x, float s, size_t n, cudaStream_t stream);

/* x[i] = cap * tanh(x[i] / cap), in double (cap > 0). */
cudaError_t zi_cuda_softcap(float *x, float cap, size_t n, cudaStream_t stream);

/* x[i] += y[i] */
cudaError_t zi_cuda_add(float *x, const float *y, size_t n, cudaStream_t stream);

/* x[r][i] += bias[i] for r < n_rows, i < dim (a bias vector on every row). */
cudaError_t zi_cuda_add_bias(float *x, const float *bias, int n_rows, int dim, cudaStream_t stream);

/* One token's LoRA term (backend.h's zi_lora_row, its pointers device
 * memory), as the lora kernels read it from a device array; a NULL: the
 * token has none. */
typedef struct zi_cuda_lora_row {
    const void *a, *bt; /* A [rank][cols], B transposed [rank][rows] */
    float scale;
    int32_t rank; /* 1..512 */
    int32_t f16;  /* A and B are fp16 (else float32) */
    int32_t pad;
} zi_cuda_lora_row;

/* The LoRA term of a product, added to it: for each token t < n_tokens
 * whose r[t].a is set, c = r[t].scale * A x[t] (c: a row of scratch,
 * max_rank floats a token), then y[t] += B c. Each dot product is summed
 * in float32 in an order fixed by its length alone, so a token's result
 * does not depend on the rest of the batch. r and scratch are device
 * memory; max_rank is the largest r[t].rank. */
cudaError_t zi_cuda_lora(float *y, const float *x, int n_tokens, int64_t rows, int64_t cols,
                         const zi_cuda_lora_row *r, int max_rank, float *scratch,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
