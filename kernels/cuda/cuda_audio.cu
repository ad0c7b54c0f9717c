/*
 * cuda_audio.cu - the device code of the speech codec decoder's ops (see
 * cuda_audio.h for each launcher's contract). One thread an output value
 * for the convolutions and the overlap-add, one block a group or a frame
 * for the reductions; reductions run in a fixed order, so results do not
 * change from run to run.
 */
#include "cuda_audio.h"

#include <math.h>
#include <stdint.h>

#include "cuda_reduce.cuh"

namespace {

constexpr int kThreads = 256;
constexpr double kPi = 3.14159265358979323846;
constexpr int kMaxBins = ZI_CUDA_ISTFT_MAX_FFT / 2 + 1;

unsigned blocks_for(int64_t n) {
    const int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

__device__ __forceinline__ double block_sum_double(double v) {
    return zi_cuda_reduce::block_sum_double<kThreads>(v);
}

/* One thread an output (t, o), adjacent threads adjacent o (the frame's
 * input row is shared by the warp). */
__global__ void __launch_bounds__(kThreads)
    conv1d_kernel(float *__restrict__ y, const float *__restrict__ x, const float *__restrict__ w,
                  const float *__restrict__ b, int n, int cin, int cout, int K) {
    const int64_t total = static_cast<int64_t>(n) * cout;
    const int pad = K / 2;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * kThreads) {
        const int t = static_cast<int>(e / cout), o = static_cast<int>(e % cout);
        float acc = b ? b[o] : 0.0f;
        for (int j = 0; j < K; j++) {
            const int s = t + j - pad;
            if (s < 0 || s >= n) continue;
            const float *wr = w + (static_cast<int64_t>(j) * cout + o) * cin;
            const float *xr = x + static_cast<int64_t>(s) * cin;
            double d = 0.0;
            for (int i = 0; i < cin; i++) d += static_cast<double>(wr[i]) * xr[i];
            acc = __fadd_rn(acc, static_cast<float>(d));
        }
        y[e] = acc;
    }
}

__global__ void __launch_bounds__(kThreads)
    conv1d_dw_kernel(float *__restrict__ y, const float *__restrict__ x,
                     const float *__restrict__ w, const float *__restrict__ b, int n, int C,
                     int K) {
    const int64_t total = static_cast<int64_t>(n) * C;
    const int pad = K / 2;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; e < total;
         e += static_cast<int64_t>(gridDim.x) * kThreads) {
        const int t = static_cast<int>(e / C), c = static_cast<int>(e % C);
        float acc = b ? b[c] : 0.0f;
        for (int j = 0; j < K; j++) {
            const int s = t + j - pad;
            if (s < 0 || s >= n) continue;
            acc = __fadd_rn(acc, __fmul_rn(w[static_cast<int64_t>(c) * K + j],
                                           x[static_cast<int64_t>(s) * C + c]));
        }
        y[e] = acc;
    }
}

/* One block a group: its statistics over all frames in double, then the
 * CPU's float expression. Only this block touches the group's values, so
 * y may be x (every read of the statistics precedes the writes). */
__global__ void __launch_bounds__(kThreads)
    group_norm_kernel(float *y, const float *x, const float *__restrict__ w,
                      const float *__restrict__ b, int n, int C, int dg, float eps) {
    const int c0 = static_cast<int>(blockIdx.x) * dg;
    const int64_t cnt = static_cast<int64_t>(n) * dg;
    double s = 0.0;
    for (int64_t e = threadIdx.x; e < cnt; e += kThreads) s += x[(e / dg) * C + c0 + e % dg];
    const double mean = block_sum_double(s) / static_cast<double>(cnt);
    double v = 0.0;
    for (int64_t e = threadIdx.x; e < cnt; e += kThreads) {
        const double d = static_cast<double>(x[(e / dg) * C + c0 + e % dg]) - mean;
        v += d * d;
    }
    v = block_sum_double(v);
    const double r = 1.0 / sqrt(v / static_cast<double>(cnt) + static_cast<double>(eps));
    for (int64_t e = threadIdx.x; e < cnt; e += kThreads) {
        const int c = c0 + static_cast<int>(e % dg);
        const int64_t i = (e / dg) * C + c;
        const float nv = static_cast<float>((static_cast<double>(x[i]) - mean) * r);
        y[i] = __fadd_rn(__fmul_rn(nv, w[c]), b[c]);
    }
}

/* One block a frame: the head (magnitude and phase to H complex bins, in
 * shared memory), each sample the real part of the inverse DFT over the
 * Hermitian extension, summed directly in double, over N, times the
 * periodic Hann window. */
__global__ void __launch_bounds__(kThreads)
    irfft_kernel(float *__restrict__ frames, const float *__restrict__ spec, int N) {
    __shared__ double sr[kMaxBins], si[kMaxBins];
    const int H = N / 2 + 1;
    const float *s = spec + static_cast<int64_t>(blockIdx.x) * (N + 2);
    for (int m = threadIdx.x; m < H; m += kThreads) {
        double mag = exp(static_cast<double>(s[m]));
        if (mag > 100.0) mag = 100.0;
        const double ph = s[H + m];
        sr[m] = mag * cos(ph);
        si[m] = (m == 0 || m == H - 1) ? 0.0 : mag * sin(ph); /* irfft ignores them */
    }
    __syncthreads();
    float *fr = frames + static_cast<int64_t>(blockIdx.x) * N;
    for (int k = threadIdx.x; k < N; k += kThreads) {
        double acc = 0.0;
        for (int m = 0; m < N; m++) {
            const double r = m < H ? sr[m] : sr[N - m], im = m < H ? si[m] : -si[N - m];
            const int64_t j = static_cast<int64_t>(k) * m % N;
            double sn, cs;
            sincospi(2.0 * static_cast<double>(j) / N, &sn, &cs);
            acc += r * cs - im * sn;
        }
        fr[k] = static_cast<float>(acc / N * (0.5 - 0.5 * cospi(2.0 * k / N)));
    }
}

/* One thread an output sample: the frames covering it in frame order,
 * over the overlap-added squared window (the CPU's ola_worker). */
__global__ void __launch_bounds__(kThreads)
    ola_kernel(float *__restrict__ out, const float *__restrict__ frames, int n, int N, int hop) {
    const int64_t total = static_cast<int64_t>(n) * hop;
    const int pad = (N - hop) / 2;
    for (int64_t s = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; s < total;
         s += static_cast<int64_t>(gridDim.x) * kThreads) {
        const int64_t g = s + pad;
        const int64_t fa = g - N + 1 <= 0 ? 0 : (g - N + 1 + hop - 1) / hop;
        int64_t fb = g / hop;
        if (fb > n - 1) fb = n - 1;
        double acc = 0.0, env = 0.0;
        for (int64_t f = fa; f <= fb; f++) {
            const int64_t i = g - f * hop;
            const double wv = 0.5 - 0.5 * cos(2.0 * kPi * static_cast<double>(i) / N);
            acc += frames[f * N + i];
            env += wv * wv;
        }
        out[s] = static_cast<float>(acc / env);
    }
}

} // namespace

extern "C" {

cudaError_t zi_cuda_conv1d(float *y, const float *x, const float *w, const float *b, int n, int cin,
                           int cout, int K, cudaStream_t stream) {
    if (n <= 0 || cout <= 0) return cudaSuccess;
    conv1d_kernel<<<blocks_for(static_cast<int64_t>(n) * cout), kThreads, 0, stream>>>(
        y, x, w, b, n, cin, cout, K);
    return cudaGetLastError();
}

cudaError_t zi_cuda_conv1d_dw(float *y, const float *x, const float *w, const float *b, int n,
                              int channels, int K, cudaStream_t stream) {
    if (n <= 0 || channels <= 0) return cudaSuccess;
    conv1d_dw_kernel<<<blocks_for(static_cast<int64_t>(n) * channels), kThreads, 0, stream>>>(
        y, x, w, b, n, channels, K);
    return cudaGetLastError();
}

cudaError_t zi_cuda_group_norm(float *y, const float *x, const float *w, const float *b, int n,
                               int channels, int groups, float eps, cudaStream_t stream) {
    if (n <= 0 || groups <= 0) return cudaSuccess;
    group_norm_kernel<<<static_cast<unsigned>(groups), kThreads, 0, stream>>>(
        y, x, w, b, n, channels, channels / groups, eps);
    return cudaGetLastError();
}

cudaError_t zi_cuda_istft(float *out, const float *spec, float *frames, int n, int n_fft, int hop,
                          cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    irfft_kernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(frames, spec, n_fft);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    ola_kernel<<<blocks_for(static_cast<int64_t>(n) * hop), kThreads, 0, stream>>>(out, frames, n,
                                                                                   n_fft, hop);
    return cudaGetLastError();
}

} // extern "C"
