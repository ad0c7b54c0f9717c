/*
 * cuda_recurrent.h - the CUDA kernels of the hybrid families' recurrent
 * layers (lfm2's short convolution, qwen35's gated DeltaNet, granitehybrid's
 * Mamba-2) and the small ops around them, behind plain C launch functions.
 *
 * As cuda_kernels.h: pointers are device pointers, int32 arrays (slot, pos,
 * idx) are device copies of the interface's host arrays (cuda_backend.c
 * stages them), every launcher queues work on `stream`, never allocates or
 * synchronizes, and returns the launch status. Each op is backend.h's op of
 * the same name; the CUDA backend's results agree with the CPU backend's
 * within float32 rounding (tests/gpu/test_cuda_backend.c), not bit for bit.
 */
#ifndef ZI_CUDA_RECURRENT_H
#define ZI_CUDA_RECURRENT_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Largest state head width the DeltaNet and scan kernels take (one thread a
 * column, a block a head); model.c's head limit is the same. */
#define ZI_CUDA_REC_MAX_COLS 1024

/* x[i] *= y[i] */
cudaError_t zi_cuda_mul(float *x, const float *y, size_t n, cudaStream_t stream);

/* x[i] = x[i] / (1 + e^-x[i]) */
cudaError_t zi_cuda_silu(float *x, size_t n, cudaStream_t stream);

/* x[i] = x[i] / (1 + e^-g[i]) */
cudaError_t zi_cuda_sigmoid_mul(float *x, const float *g, size_t n, cudaStream_t stream);

/* y[i] = x[idx[i]] for i < n, rows of dim floats. */
cudaError_t zi_cuda_gather_rows(float *y, const float *x, const int32_t *idx, int n, int dim,
                                cudaStream_t stream);

/* backend.h's rmsnorm_groups: n_rows * groups runs of dim / groups. */
cudaError_t zi_cuda_rmsnorm_groups(float *y, const float *x, const float *w, int n_tokens, int dim,
                                   int groups, float eps, cudaStream_t stream);

/* backend.h's conv_state: one thread a channel, the tokens in order. */
cudaError_t zi_cuda_conv_state(float *y, const float *x, const float *w, int K, int channels,
                               float *states, const int32_t *slot, const int32_t *pos, int n,
                               cudaStream_t stream);

/* backend.h's delta_net: a block a value head, a thread a state column
 * (d <= ZI_CUDA_REC_MAX_COLS), the tokens in order. */
cudaError_t zi_cuda_delta_net(float *out, const float *qkv, const float *b, const float *alpha,
                              const float *dt_bias, const float *a, float *states,
                              const int32_t *slot, const int32_t *pos, int n, int nk, int nv, int d,
                              float eps, cudaStream_t stream);

/* backend.h's ssm_scan: a block a head, a thread a column p (P <=
 * ZI_CUDA_REC_MAX_COLS), the tokens in order. */
cudaError_t zi_cuda_ssm_scan(float *out, const float *xbc, const float *dt, const float *dt_bias,
                             const float *a, const float *dd, float *states, const int32_t *slot,
                             const int32_t *pos, int n, int H, int P, int G, int N,
                             cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
