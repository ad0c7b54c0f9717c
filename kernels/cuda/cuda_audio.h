/*
 * cuda_audio.h - the CUDA kernels of the speech codec decoder's ops
 * (model_worker/wavtokenizer.h): conv1d, conv1d_dw, group_norm and istft,
 * behind plain C launch functions.
 *
 * As cuda_kernels.h: pointers are device pointers, every launcher queues
 * work on `stream`, never allocates or synchronizes, and returns the
 * launch status; the shapes are checked by the caller (cuda_backend.c).
 * Each op is backend.h's op of the same name, computed as the CPU backend
 * defines it (kernels/cpu/cpu_audio.c): double where the CPU's sums are
 * double, float32 steps rounded one by one (no fused multiply-add) where
 * the CPU's are float32, so the results agree within float32 rounding
 * (tests/gpu/test_cuda_backend.c, test_audio_ops).
 */
#ifndef ZI_CUDA_AUDIO_H
#define ZI_CUDA_AUDIO_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest n_fft zi_cuda_istft takes (the CPU's ZI_ISTFT_MAX_FFT). */
#define ZI_CUDA_ISTFT_MAX_FFT 4096

/* y[t][o] = b[o] + the sum over taps j < K, in order, of tap j's dot
 * product of w[j][o][.] with frame t + j - K/2 of x (zero outside the n
 * frames); each dot product summed in double and rounded to float (the
 * CPU's float32 dot: agreement within float rounding, not bits). b may be
 * NULL; y must not alias x. */
cudaError_t zi_cuda_conv1d(float *y, const float *x, const float *w, const float *b, int n, int cin,
                           int cout, int K, cudaStream_t stream);

/* y[t][c] = b[c] + the sum over j < K, in order, of w[c*K + j] x[t + j -
 * K/2][c], each product and sum a float rounded on its own, as the CPU;
 * b may be NULL; y must not alias x. */
cudaError_t zi_cuda_conv1d_dw(float *y, const float *x, const float *w, const float *b, int n,
                              int channels, int K, cudaStream_t stream);

/* GroupNorm over the n frames of `groups` runs of channels / groups
 * channels: mean and biased variance in double, then the CPU's float
 * multiply and add. y may be x. */
cudaError_t zi_cuda_group_norm(float *y, const float *x, const float *w, const float *b, int n,
                               int channels, int groups, float eps, cudaStream_t stream);

/* backend.h's istft: spec [n][n_fft + 2] to out (n * hop samples) through
 * frames ([n][n_fft] scratch), in double but for the stored floats. n_fft
 * even, 4..ZI_CUDA_ISTFT_MAX_FFT, 1 <= hop <= n_fft. */
cudaError_t zi_cuda_istft(float *out, const float *spec, float *frames, int n, int n_fft, int hop,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
