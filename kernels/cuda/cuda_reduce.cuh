/*
 * cuda_reduce.cuh - warp and block reductions in a fixed order, shared by
 * the CUDA op files (cuda_vision.cu, cuda_audio.cu): the same inputs give
 * the same sum on every run, which the ops' "no run-to-run change" rests
 * on. Device code only (templates and inline functions, one copy a
 * translation unit).
 */
#ifndef ZI_CUDA_REDUCE_CUH
#define ZI_CUDA_REDUCE_CUH

namespace zi_cuda_reduce {

constexpr int kWarp = 32;

/* The sum of v over a warp's 32 lanes, every lane getting it. */
template <class T> __device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Block-wide sum of a double for blocks of Threads (a multiple of 32), in
 * a fixed order, every thread getting it; callable twice in a row (the
 * partials are read before they are reused). */
template <int Threads> __device__ double block_sum_double(double v) {
    static_assert(Threads % kWarp == 0, "whole warps");
    __shared__ double part[Threads / kWarp];
    v = warp_sum(v);
    const int wid = threadIdx.x / kWarp, lane = threadIdx.x & (kWarp - 1);
    if (lane == 0) part[wid] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < Threads / kWarp; i++) s += part[i];
    __syncthreads();
    return s;
}

} // namespace zi_cuda_reduce

#endif
