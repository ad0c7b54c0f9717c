/*
 * cpu_audio.h - the CPU backend's ops for the speech codec decoder
 * (zi_backend_ops conv1d, conv1d_dw, group_norm and istft, whose contracts
 * kernels/backend.h gives; model_worker/wavtokenizer.h is the network).
 *
 * Each runs on the backend's pool, split so that every output value is
 * computed by one thread in a fixed order: the results do not depend on
 * the thread count. The convolution's sums over input channels are the
 * kernel table's dot products (zi_cpu_kernels.dot4 and dot: 16 or 8 float lanes,
 * or plain C); the norms' statistics and the inverse STFT (a mixed-radix
 * FFT) run in double.
 */
#ifndef ZI_CPU_AUDIO_H
#define ZI_CPU_AUDIO_H

#include "cpu_kernels.h"
#include "threadpool.h"

/* The largest n_fft zi_cpu_istft takes (its tables are on the stack). */
#define ZI_ISTFT_MAX_FFT 4096

void zi_cpu_conv1d(zi_pool *pool, const zi_cpu_kernels *k, float *y, const float *x, const float *w,
                   const float *b, int n, int cin, int cout, int K);
void zi_cpu_conv1d_dw(zi_pool *pool, float *y, const float *x, const float *w, const float *b,
                      int n, int channels, int K);
void zi_cpu_group_norm(zi_pool *pool, float *y, const float *x, const float *w, const float *b,
                       int n, int channels, int groups, float eps);
void zi_cpu_istft(zi_pool *pool, float *out, const float *spec, float *frames, int n, int n_fft,
                  int hop);

#endif
