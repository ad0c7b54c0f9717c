/*
 * cuda_vision.cu - the device code of the encoders' ops (see cuda_vision.h
 * for each launcher's contract). Reductions run in a fixed order, so
 * results do not change from run to run.
 */
#include "cuda_vision.h"

#include <math.h>
#include <stdint.h>

#include "cuda_kernels.h"
#include "cuda_reduce.cuh"

namespace {

using zi_cuda_reduce::kWarp;
using zi_cuda_reduce::warp_sum;
constexpr int kThreads = 256; /* element-wise and row kernels */

/* span_attention: warps a block, keys a chunk (one a lane while scoring),
 * dims of K and q staged in shared memory at a time */
constexpr int kSpanWarps = 4;
constexpr int kSpanKeys = 32;
constexpr int kSpanSlab = 128;

template <class T> __device__ __forceinline__ T warp_max(T v) {
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) {
        const T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

__device__ __forceinline__ float acc_exp(float x) {
    return expf(x);
}
__device__ __forceinline__ double acc_exp(double x) {
    return exp(x);
}

__device__ __forceinline__ double block_sum_double(double v) {
    return zi_cuda_reduce::block_sum_double<kThreads>(v);
}

/* One block a row: the CPU backend's layernorm_rows, expression for
 * expression (the final multiply and add rounded separately: the CPU's C
 * is compiled without contraction). */
__global__ void __launch_bounds__(kThreads)
    layernorm_kernel(float *y, const float *x, const float *__restrict__ w,
                     const float *__restrict__ b, int dim, float eps) {
    const float *xr = x + static_cast<int64_t>(blockIdx.x) * dim;
    float *yr = y + static_cast<int64_t>(blockIdx.x) * dim;
    double s = 0.0;
    for (int i = threadIdx.x; i < dim; i += kThreads) s += xr[i];
    const double mean = block_sum_double(s) / dim;
    double var = 0.0;
    for (int i = threadIdx.x; i < dim; i += kThreads) {
        const double d = static_cast<double>(xr[i]) - mean;
        var += d * d;
    }
    var = block_sum_double(var);
    const double r = 1.0 / sqrt(var / dim + static_cast<double>(eps));
    for (int i = threadIdx.x; i < dim; i += kThreads) {
        const float n = static_cast<float>((static_cast<double>(xr[i]) - mean) * r);
        yr[i] = __fadd_rn(__fmul_rn(n, w[i]), b[i]);
    }
}

/* The geglu kernel's GELU (cuda_kernels.cu), constant for constant, with
 * an up of one. */
__global__ void gelu_kernel(float *x, size_t n) {
    const float k1 = 1.5957691216057308f, k3 = 0.0713548162726009f;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float g = x[i];
        const float z = k1 * g + k3 * (g * g * g);
        x[i] = g / (1.0f + expf(-z));
    }
}

/* One block an output row; each column's terms in j order. */
__global__ void wsum_kernel(float *__restrict__ out, const float *__restrict__ y,
                            const int32_t *__restrict__ idx, const float *__restrict__ w, int k,
                            int dim) {
    const int64_t t = blockIdx.x;
    const int32_t *ti = idx + t * k;
    const float *tw = w + t * k;
    float *o = out + t * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float acc = __fmul_rn(tw[0], y[static_cast<int64_t>(ti[0]) * dim + i]);
        for (int j = 1; j < k; j++)
            acc = __fadd_rn(acc, __fmul_rn(tw[j], y[static_cast<int64_t>(ti[j]) * dim + i]));
        o[i] = acc;
    }
}

/* span_attention's dims a lane (accumulator registers per row) for heads
 * of hd, and rows a warp for DPL dims a lane (RW x DPL registers). */
__host__ __device__ constexpr int span_dims_per_lane(int hd) {
    return hd <= 64 ? 2 : hd <= 128 ? 4 : hd <= 256 ? 8 : hd <= 512 ? 16 : 32;
}
__host__ __device__ constexpr int span_rows_per_warp(int dpl) {
    return dpl <= 8 ? 4 : dpl == 16 ? 2 : 1;
}

/*
 * span_attention: one block a (tile of a span's rows, head). Each warp
 * owns RW rows; the keys go by in chunks of 32. For a chunk, the block
 * stages the keys' K rows and its rows' q in shared memory (128 dims at a
 * time) and lane j scores key j against each of its warp's rows in Acc;
 * then, per row, the chunk's maximum and sum (warp reductions) update the
 * online softmax (running maximum m, sum l, the earlier terms scaled by
 * exp(old m - new m)), and lane j's weights go to shared memory for the
 * weighted sum of V, where each lane owns dims lane, lane + 32, ... of the
 * accumulator and reads V rows from global memory (coalesced; the warps
 * of a block read the same rows). Acc double: every product of two floats
 * is exact and the sums lose ~1e-16 (the CPU's exact path); float: the
 * tile_precision path.
 */
template <class Acc, int DPL>
__global__ void __launch_bounds__(kSpanWarps *kWarp)
    span_attn_kernel(float *__restrict__ out, const float *__restrict__ q,
                     const float *__restrict__ k, const float *__restrict__ v,
                     const int32_t *__restrict__ order, const int32_t *__restrict__ starts,
                     const int32_t *__restrict__ tiles, int n_heads, int n_kv_heads, int hd,
                     float scale, int causal) {
    constexpr int RW = span_rows_per_warp(DPL);
    constexpr int QT = kSpanWarps * RW;
    constexpr int KS = kSpanSlab + 1; /* padded: lane j's reads hit bank (j + d) % 32 */
    __shared__ float sk[kSpanKeys * KS];
    __shared__ float sq[QT * kSpanSlab];
    __shared__ Acc sp[kSpanWarps][RW][kSpanKeys];
    __shared__ int32_t skey[kSpanKeys]; /* the chunk's keys' rows */
    __shared__ int32_t srow[QT];        /* the tile's rows, -1 past the span */

    const int h = blockIdx.y;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x & (kWarp - 1);
    const int i0 = tiles[2 * blockIdx.x], r = tiles[2 * blockIdx.x + 1];
    const int s0 = starts[r], s1 = starts[r + 1];
    const int n_rows = min(QT, s1 - i0);
    const int64_t qd = static_cast<int64_t>(n_heads) * hd;
    const int64_t kvd = static_cast<int64_t>(n_kv_heads) * hd;
    const int64_t qoff = static_cast<int64_t>(h) * hd;
    const int64_t kvoff = static_cast<int64_t>(h / (n_heads / n_kv_heads)) * hd;
    /* causal: no row of the tile sees past its last row */
    const int jend = causal ? i0 + n_rows : s1;
    const bool q_once = hd <= kSpanSlab; /* q staged once for all chunks */

    for (int t = threadIdx.x; t < QT; t += blockDim.x) srow[t] = t < n_rows ? order[i0 + t] : -1;
    __syncthreads();
    if (q_once)
        for (int e = threadIdx.x; e < QT * hd; e += blockDim.x) {
            const int row = e / hd, d = e % hd;
            sq[row * kSpanSlab + d] = srow[row] >= 0 ? q[srow[row] * qd + qoff + d] : 0.0f;
        }

    Acc m[RW], l[RW], acc[RW][DPL];
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[rr][j] = 0;
    }
    const Acc sc = static_cast<Acc>(scale);

    for (int j0 = s0; j0 < jend; j0 += kSpanKeys) {
        const int nk = min(kSpanKeys, jend - j0);
        __syncthreads(); /* the previous chunk is done with skey, sk and sp */
        if (threadIdx.x < kSpanKeys)
            skey[threadIdx.x] = static_cast<int>(threadIdx.x) < nk ? order[j0 + threadIdx.x] : -1;
        Acc s[RW];
#pragma unroll
        for (int rr = 0; rr < RW; rr++) s[rr] = 0;
        for (int d0 = 0; d0 < hd; d0 += kSpanSlab) {
            const int nd = min(kSpanSlab, hd - d0);
            __syncthreads(); /* skey written; the previous slab read */
            for (int e = threadIdx.x; e < kSpanKeys * nd; e += blockDim.x) {
                const int key = e / nd, d = e % nd;
                sk[key * KS + d] = skey[key] >= 0 ? k[skey[key] * kvd + kvoff + d0 + d] : 0.0f;
            }
            if (!q_once)
                for (int e = threadIdx.x; e < QT * nd; e += blockDim.x) {
                    const int row = e / nd, d = e % nd;
                    sq[row * kSpanSlab + d] =
                        srow[row] >= 0 ? q[srow[row] * qd + qoff + d0 + d] : 0.0f;
                }
            __syncthreads();
            const float *kr = sk + lane * KS;
            const float *qr = sq + warp * RW * kSpanSlab;
            for (int d = 0; d < nd; d++) {
                const Acc kv = static_cast<Acc>(kr[d]);
#pragma unroll
                for (int rr = 0; rr < RW; rr++)
                    s[rr] += static_cast<Acc>(qr[rr * kSpanSlab + d]) * kv;
            }
        }
        /* the online softmax, row by row (uniform across the warp) */
        const int jk = j0 + lane; /* this lane's key, an index into order */
#pragma unroll
        for (int rr = 0; rr < RW; rr++) {
            const int row = warp * RW + rr;
            const bool ok = row < n_rows && lane < nk && (!causal || jk <= i0 + row);
            const Acc x = ok ? s[rr] * sc : static_cast<Acc>(-INFINITY);
            const Acc cm = warp_max(x);
            if (cm == static_cast<Acc>(-INFINITY)) { /* nothing this row sees here */
                sp[warp][rr][lane] = 0;
                continue;
            }
            const Acc mn = m[rr] > cm ? m[rr] : cm;
            const Acc c = acc_exp(m[rr] - mn); /* 0 while m is -inf */
            const Acc p = ok ? acc_exp(x - mn) : static_cast<Acc>(0);
            l[rr] = l[rr] * c + warp_sum(p);
#pragma unroll
            for (int j = 0; j < DPL; j++) acc[rr][j] *= c;
            m[rr] = mn;
            sp[warp][rr][lane] = p;
        }
        __syncwarp();
        for (int jj = 0; jj < nk; jj++) {
            const float *vr = v + skey[jj] * kvd + kvoff;
            Acc vv[DPL];
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane + j * kWarp;
                vv[j] = d < hd ? static_cast<Acc>(vr[d]) : static_cast<Acc>(0);
            }
#pragma unroll
            for (int rr = 0; rr < RW; rr++) {
                const Acc p = sp[warp][rr][jj];
#pragma unroll
                for (int j = 0; j < DPL; j++) acc[rr][j] += p * vv[j];
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < RW; rr++) {
        const int row = warp * RW + rr;
        if (row >= n_rows) continue;
        float *o = out + srow[row] * qd + qoff;
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            const int d = lane + j * kWarp;
            if (d < hd) o[d] = static_cast<float>(acc[rr][j] / l[rr]);
        }
    }
}

template <class Acc, int DPL>
cudaError_t launch_span(float *out, const float *q, const float *k, const float *v,
                        const int32_t *order, const int32_t *starts, const int32_t *tiles,
                        int n_tiles, int n_heads, int n_kv_heads, int hd, float scale, int causal,
                        cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(n_heads));
    const unsigned threads = kSpanWarps * kWarp;
    span_attn_kernel<Acc, DPL><<<grid, threads, 0, stream>>>(
        out, q, k, v, order, starts, tiles, n_heads, n_kv_heads, hd, scale, causal);
    return cudaGetLastError();
}

template <class Acc>
cudaError_t span_by_dim(float *out, const float *q, const float *k, const float *v,
                        const int32_t *order, const int32_t *starts, const int32_t *tiles,
                        int n_tiles, int n_heads, int n_kv_heads, int hd, float scale, int causal,
                        cudaStream_t stream) {
#define ZI_SPAN(DPL)                                                                               \
    launch_span<Acc, DPL>(out, q, k, v, order, starts, tiles, n_tiles, n_heads, n_kv_heads, hd,    \
                          scale, causal, stream)
    switch (span_dims_per_lane(hd)) {
    case 2:
        return ZI_SPAN(2);
    case 4:
        return ZI_SPAN(4);
    case 8:
        return ZI_SPAN(8);
    case 16:
        return ZI_SPAN(16);
    default:
        return ZI_SPAN(32);
    }
#undef ZI_SPAN
}

unsigned ew_blocks(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b > 65536 ? 65536 : b);
}

} // namespace

extern "C" {

cudaError_t zi_cuda_layernorm(float *y, const float *x, const float *w, const float *b,
                              int n_tokens, int dim, float eps, cudaStream_t stream) {
    if (n_tokens <= 0 || dim <= 0) return cudaSuccess;
    const unsigned blocks = static_cast<unsigned>(n_tokens);
    layernorm_kernel<<<blocks, kThreads, 0, stream>>>(y, x, w, b, dim, eps);
    return cudaGetLastError();
}

cudaError_t zi_cuda_gelu(float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const unsigned blocks = ew_blocks(n);
    gelu_kernel<<<blocks, kThreads, 0, stream>>>(x, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_weighted_sum_rows(float *out, const float *y, const int32_t *idx,
                                      const float *w, int n_out, int k, int dim,
                                      cudaStream_t stream) {
    if (n_out <= 0 || dim <= 0) return cudaSuccess;
    if (k < 1) return cudaErrorInvalidValue;
    const unsigned blocks = static_cast<unsigned>(n_out);
    const unsigned threads = dim < 256 ? 128 : 256;
    wsum_kernel<<<blocks, threads, 0, stream>>>(out, y, idx, w, k, dim);
    return cudaGetLastError();
}

int zi_cuda_span_tile_rows(int head_dim) {
    return kSpanWarps * span_rows_per_warp(span_dims_per_lane(head_dim));
}

cudaError_t zi_cuda_span_attention(float *out, const float *q, const float *k, const float *v,
                                   const int32_t *order, const int32_t *starts,
                                   const int32_t *tiles, int n_tiles, int n_heads, int n_kv_heads,
                                   int head_dim, float scale, int causal, int f32,
                                   cudaStream_t stream) {
    if (n_tiles <= 0) return cudaSuccess;
    if (head_dim <= 0 || head_dim > ZI_CUDA_MAX_HEAD_DIM || n_heads <= 0 || n_kv_heads <= 0 ||
        n_heads % n_kv_heads != 0 || n_heads > 65535)
        return cudaErrorInvalidValue;
    if (f32)
        return span_by_dim<float>(out, q, k, v, order, starts, tiles, n_tiles, n_heads, n_kv_heads,
                                  head_dim, scale, causal, stream);
    return span_by_dim<double>(out, q, k, v, order, starts, tiles, n_tiles, n_heads, n_kv_heads,
                               head_dim, scale, causal, stream);
}

} // extern "C"
