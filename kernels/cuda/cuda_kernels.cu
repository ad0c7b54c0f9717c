/*
 * cuda_kernels.cu - the device code of the CUDA backend (see cuda_kernels.h
 * for each launcher's contract, cuda_backend.c for how they are used).
 *
 * Numerics follow the CPU backend where it matters for agreement: RMSNorm
 * sums squares in double, RoPE computes its angles in double, softmax uses
 * expf (not the fast intrinsic), and the decode products multiply float32
 * activations by the exactly decoded weights (the CPU gets the same
 * accuracy from its two-half int8 activations). Reductions are in a fixed
 * order, so results do not change from run to run.
 */
#include "cuda_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "gguf.h"
#include "qdecode.h"

namespace {

constexpr int kWarp = 32;
constexpr int kMmvWarps = 4;  /* rows per block of the matrix-vector kernel */
constexpr int kAttnWarps = 4; /* warps sharing one (token, head) */
constexpr int kThreads = 256; /* element-wise kernels */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* GGUF blocks are only 2-byte aligned (18- and 34-byte blocks), so reads
 * are 16-bit. */
__device__ __forceinline__ float load_f16(const uint8_t *p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t *>(p)));
}

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
    return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

/*
 * Block decoders: half h (0 or 1) of a 32-value block gives 16 weights as
 * two runs of 8, wa at values [oa, oa + 8) and wb at [ob, ob + 8). For the
 * 4-bit types a byte holds value i (low nibble) and value i + 16 (high), so
 * half h takes bytes 8h..8h+7: values 8h.. and 16 + 8h..
 */
struct BlockQ4_0 {
    static constexpr int kBytes = 18;
    __device__ static void decode(const uint8_t *blk, int h, float *wa, float *wb, int *oa,
                                  int *ob) {
        const float d = load_f16(blk);
        const uint16_t *q = reinterpret_cast<const uint16_t *>(blk + 2 + 8 * h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t two = q[i];
            const uint32_t b0 = two & 0xffu, b1 = two >> 8;
            wa[2 * i] = (static_cast<int>(b0 & 15u) - 8) * d;
            wb[2 * i] = (static_cast<int>(b0 >> 4) - 8) * d;
            wa[2 * i + 1] = (static_cast<int>(b1 & 15u) - 8) * d;
            wb[2 * i + 1] = (static_cast<int>(b1 >> 4) - 8) * d;
        }
        *oa = 8 * h;
        *ob = 16 + 8 * h;
    }
};

struct BlockQ4_1 {
    static constexpr int kBytes = 20;
    __device__ static void decode(const uint8_t *blk, int h, float *wa, float *wb, int *oa,
                                  int *ob) {
        const float d = load_f16(blk), m = load_f16(blk + 2);
        const uint16_t *q = reinterpret_cast<const uint16_t *>(blk + 4 + 8 * h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t two = q[i];
            const uint32_t b0 = two & 0xffu, b1 = two >> 8;
            wa[2 * i] = static_cast<float>(b0 & 15u) * d + m;
            wb[2 * i] = static_cast<float>(b0 >> 4) * d + m;
            wa[2 * i + 1] = static_cast<float>(b1 & 15u) * d + m;
            wb[2 * i + 1] = static_cast<float>(b1 >> 4) * d + m;
        }
        *oa = 8 * h;
        *ob = 16 + 8 * h;
    }
};

struct BlockQ8_0 {
    static constexpr int kBytes = 34;
    __device__ static void decode(const uint8_t *blk, int h, float *wa, float *wb, int *oa,
                                  int *ob) {
        const float d = load_f16(blk);
        const uint16_t *q = reinterpret_cast<const uint16_t *>(blk + 2 + 16 * h);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t a = q[i], b = q[i + 4];
            wa[2 * i] = static_cast<float>(static_cast<int8_t>(a & 0xffu)) * d;
            wa[2 * i + 1] = static_cast<float>(static_cast<int8_t>(a >> 8)) * d;
            wb[2 * i] = static_cast<float>(static_cast<int8_t>(b & 0xffu)) * d;
            wb[2 * i + 1] = static_cast<float>(static_cast<int8_t>(b >> 8)) * d;
        }
        *oa = 16 * h;
        *ob = 16 * h + 8;
    }
};

/*
 * The kernels below take a row and a 32-value sub-block index ib
 * (decode_sub), so that one kernel serves the 32-value blocks above and
 * the 256-value K-quant blocks, whose decoders (qdecode.h, shared with the
 * C unit test that checks them against the CPU backend) find sub-block ib
 * inside block ib / 8.
 */
template <class B> struct Block32 {
    __device__ static void decode_sub(const uint8_t *row, int64_t ib, int h, float *wa, float *wb,
                                      int *oa, int *ob) {
        B::decode(row + ib * B::kBytes, h, wa, wb, oa, ob);
    }
};

#define ZI_QD_BLOCK(NAME, FN)                                                                      \
    struct NAME {                                                                                  \
        __device__ static void decode_sub(const uint8_t *row, int64_t ib, int h, float *wa,        \
                                          float *wb, int *oa, int *ob) {                           \
            FN(row, ib, h, wa, wb, oa, ob);                                                        \
        }                                                                                          \
    };
ZI_QD_BLOCK(BlockQ5_0, zi_qd_q5_0)
ZI_QD_BLOCK(BlockQ5_1, zi_qd_q5_1)
ZI_QD_BLOCK(BlockIQ4_NL, zi_qd_iq4_nl)
ZI_QD_BLOCK(BlockMXFP4, zi_qd_mxfp4)
ZI_QD_BLOCK(BlockQ2_K, zi_qd_q2_k)
ZI_QD_BLOCK(BlockQ3_K, zi_qd_q3_k)
ZI_QD_BLOCK(BlockQ4_K, zi_qd_q4_k)
ZI_QD_BLOCK(BlockQ5_K, zi_qd_q5_k)
ZI_QD_BLOCK(BlockQ6_K, zi_qd_q6_k)
ZI_QD_BLOCK(BlockIQ4_XS, zi_qd_iq4_xs)
#undef ZI_QD_BLOCK

/* Every quantized type the kernels take, as X(type, decoder): the switches
 * of the launchers below are written once from it. */
#define ZI_CUDA_QUANT_TYPES(X)                                                                     \
    X(ZI_TYPE_Q4_0, Block32<BlockQ4_0>)                                                            \
    X(ZI_TYPE_Q4_1, Block32<BlockQ4_1>)                                                            \
    X(ZI_TYPE_Q8_0, Block32<BlockQ8_0>)                                                            \
    X(ZI_TYPE_Q5_0, BlockQ5_0)                                                                     \
    X(ZI_TYPE_Q5_1, BlockQ5_1)                                                                     \
    X(ZI_TYPE_IQ4_NL, BlockIQ4_NL)                                                                 \
    X(ZI_TYPE_MXFP4, BlockMXFP4)                                                                   \
    X(ZI_TYPE_Q2_K, BlockQ2_K)                                                                     \
    X(ZI_TYPE_Q3_K, BlockQ3_K)                                                                     \
    X(ZI_TYPE_Q4_K, BlockQ4_K)                                                                     \
    X(ZI_TYPE_Q5_K, BlockQ5_K)                                                                     \
    X(ZI_TYPE_Q6_K, BlockQ6_K)                                                                     \
    X(ZI_TYPE_IQ4_XS, BlockIQ4_XS)

/* Writes the NT warp sums of one row (lane 0 stores). */
template <int NT>
__device__ __forceinline__ void store_row(const float *acc, float *y, int64_t rows, int64_t r,
                                          int nt) {
    const int lane = threadIdx.x & (kWarp - 1);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[t * rows + r] = s;
    }
}

/*
 * Quantized matrix-vector product: one warp per weight row, two lanes per
 * 32-value sub-block (a warp covers 16 consecutive sub-blocks per step, so
 * its loads are contiguous), NT token accumulators per lane so each weight is decoded
 * once for every token of the batch.
 */
template <class B, int NT>
__global__ void __launch_bounds__(kMmvWarps *kWarp)
    mmv_quant(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
              const float *__restrict__ x, float *__restrict__ y, int nt) {
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kMmvWarps + (threadIdx.x / kWarp);
    if (r >= rows) return; /* a whole warp leaves together: the shuffles stay full */
    const uint8_t *wr = w + r * row_bytes;
    const int64_t nb = cols / 32;
    const int h = lane & 1;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int64_t ib = lane >> 1; ib < nb; ib += kWarp / 2) {
        float wa[8], wb[8];
        int oa, ob;
        B::decode_sub(wr, ib, h, wa, wb, &oa, &ob);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            const float *xb = x + t * cols + ib * 32;
            const float4 a0 = __ldg(reinterpret_cast<const float4 *>(xb + oa));
            const float4 a1 = __ldg(reinterpret_cast<const float4 *>(xb + oa + 4));
            const float4 b0 = __ldg(reinterpret_cast<const float4 *>(xb + ob));
            const float4 b1 = __ldg(reinterpret_cast<const float4 *>(xb + ob + 4));
            float s = wa[0] * a0.x;
            s = fmaf(wa[1], a0.y, s);
            s = fmaf(wa[2], a0.z, s);
            s = fmaf(wa[3], a0.w, s);
            s = fmaf(wa[4], a1.x, s);
            s = fmaf(wa[5], a1.y, s);
            s = fmaf(wa[6], a1.z, s);
            s = fmaf(wa[7], a1.w, s);
            s = fmaf(wb[0], b0.x, s);
            s = fmaf(wb[1], b0.y, s);
            s = fmaf(wb[2], b0.z, s);
            s = fmaf(wb[3], b0.w, s);
            s = fmaf(wb[4], b1.x, s);
            s = fmaf(wb[5], b1.y, s);
            s = fmaf(wb[6], b1.z, s);
            s = fmaf(wb[7], b1.w, s);
            acc[t] += s;
        }
    }
    store_row<NT>(acc, y, rows, r, nt);
}

/* Element i of a float-typed row. */
template <int TYPE> __device__ __forceinline__ float load_w(const uint8_t *row, int64_t i);
template <> __device__ __forceinline__ float load_w<ZI_TYPE_F32>(const uint8_t *row, int64_t i) {
    return reinterpret_cast<const float *>(row)[i];
}
template <> __device__ __forceinline__ float load_w<ZI_TYPE_F16>(const uint8_t *row, int64_t i) {
    return __half2float(reinterpret_cast<const __half *>(row)[i]);
}
template <> __device__ __forceinline__ float load_w<ZI_TYPE_BF16>(const uint8_t *row, int64_t i) {
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t *>(row)[i]);
}

/* Eight consecutive weights from a 16-byte aligned address (32 for F32). */
template <int TYPE> __device__ __forceinline__ void load_w8(const uint8_t *p, float *w);
template <> __device__ __forceinline__ void load_w8<ZI_TYPE_F32>(const uint8_t *p, float *w) {
    const float4 a = *reinterpret_cast<const float4 *>(p);
    const float4 b = *reinterpret_cast<const float4 *>(p + 16);
    w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
template <> __device__ __forceinline__ void load_w8<ZI_TYPE_F16>(const uint8_t *p, float *w) {
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
        w[2 * i] = f.x;
        w[2 * i + 1] = f.y;
    }
}
template <> __device__ __forceinline__ void load_w8<ZI_TYPE_BF16>(const uint8_t *p, float *w) {
    const uint4 v = *reinterpret_cast<const uint4 *>(p);
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __uint_as_float(u[i] << 16);
        w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

/* Float-typed matrix-vector product: one warp per row, eight weights per
 * lane per step when rows are 16-byte aligned (cols % 8 == 0). */
template <int TYPE, int NT>
__global__ void __launch_bounds__(kMmvWarps *kWarp)
    mmv_float(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows, int64_t cols,
              const float *__restrict__ x, float *__restrict__ y, int nt) {
    const int lane = threadIdx.x & (kWarp - 1);
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kMmvWarps + (threadIdx.x / kWarp);
    if (r >= rows) return;
    const uint8_t *wr = w + r * row_bytes;
    const int64_t esz = TYPE == ZI_TYPE_F32 ? 4 : 2;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    int64_t done = 0;
    if (cols % 8 == 0) {
        for (int64_t i = static_cast<int64_t>(lane) * 8; i < cols; i += kWarp * 8) {
            float wv[8];
            load_w8<TYPE>(wr + i * esz, wv);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const float *xp = x + t * cols + i;
                const float4 a = __ldg(reinterpret_cast<const float4 *>(xp));
                const float4 b = __ldg(reinterpret_cast<const float4 *>(xp + 4));
                float s = wv[0] * a.x;
                s = fmaf(wv[1], a.y, s);
                s = fmaf(wv[2], a.z, s);
                s = fmaf(wv[3], a.w, s);
                s = fmaf(wv[4], b.x, s);
                s = fmaf(wv[5], b.y, s);
                s = fmaf(wv[6], b.z, s);
                s = fmaf(wv[7], b.w, s);
                acc[t] += s;
            }
        }
        done = cols;
    }
    for (int64_t i = done + lane; i < cols; i += kWarp) {
        const float wv = load_w<TYPE>(wr, i);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < nt) acc[t] = fmaf(wv, x[t * cols + i], acc[t]);
    }
    store_row<NT>(acc, y, rows, r, nt);
}

template <int NT>
cudaError_t launch_mmv(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                       const float *x, float *y, int nt, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>((rows + kMmvWarps - 1) / kMmvWarps));
    const dim3 block(kMmvWarps * kWarp);
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    switch (type) {
#define ZI_CASE(T, B)                                                                              \
    case T:                                                                                        \
        mmv_quant<B, NT><<<grid, block, 0, s>>>(wb, row_bytes, rows, cols, x, y, nt);              \
        break;
        ZI_CUDA_QUANT_TYPES(ZI_CASE)
#undef ZI_CASE
    case ZI_TYPE_F32:
        mmv_float<ZI_TYPE_F32, NT><<<grid, block, 0, s>>>(wb, row_bytes, rows, cols, x, y, nt);
        break;
    case ZI_TYPE_F16:
        mmv_float<ZI_TYPE_F16, NT><<<grid, block, 0, s>>>(wb, row_bytes, rows, cols, x, y, nt);
        break;
    case ZI_TYPE_BF16:
        mmv_float<ZI_TYPE_BF16, NT><<<grid, block, 0, s>>>(wb, row_bytes, rows, cols, x, y, nt);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

/* Dequantizes 32-value sub-block ib of a row into v[32]. */
template <class B>
__device__ __forceinline__ void decode_block(const uint8_t *row, int64_t ib, float *v) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float wa[8], wb[8];
        int oa, ob;
        B::decode_sub(row, ib, h, wa, wb, &oa, &ob);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            v[oa + j] = wa[j];
            v[ob + j] = wb[j];
        }
    }
}

/* A decoded block of 32 values stored into a dense row: float16 in four
 * 16-byte stores, float32 as it is (exact). */
__device__ __forceinline__ void put_block(__half *dst, const float *v) {
    __half2 hv[16];
#pragma unroll
    for (int i = 0; i < 16; i++) hv[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
    uint4 *d = reinterpret_cast<uint4 *>(dst);
    const uint4 *src = reinterpret_cast<const uint4 *>(hv);
#pragma unroll
    for (int i = 0; i < 4; i++) d[i] = src[i];
}

__device__ __forceinline__ void put_block(float *dst, const float *v) {
#pragma unroll
    for (int i = 0; i < 32; i++) dst[i] = v[i];
}

__device__ __forceinline__ void put_one(__half *dst, float v) {
    *dst = __float2half_rn(v);
}
__device__ __forceinline__ void put_one(float *dst, float v) {
    *dst = v;
}

/* Quantized rows into a dense T matrix: one thread per 32-value sub-block. */
template <class B, typename T>
__global__ void quant_to_dense(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows,
                               int64_t cols, T *__restrict__ out) {
    const int64_t nb = cols / 32;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= rows * nb) return;
    const int64_t r = idx / nb, ib = idx % nb;
    float v[32];
    decode_block<B>(w + r * row_bytes, ib, v);
    put_block(out + r * cols + ib * 32, v);
}

/* Float rows (F16, BF16, F32) into a dense T matrix: one thread a value. */
template <int TYPE, typename T>
__global__ void float_to_dense(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows,
                               int64_t cols, T *__restrict__ out) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= rows * cols) return;
    const int64_t r = idx / cols, c = idx % cols;
    put_one(out + idx, load_w<TYPE>(w + r * row_bytes, c));
}

__global__ void f32_to_f16(const float *__restrict__ x, __half *__restrict__ out, size_t n) {
    const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(x[i]);
}

/* One block per id; quantized tables: one thread per sub-block of 32. */
template <class B>
__global__ void get_rows_quant(const uint8_t *__restrict__ t, size_t row_bytes, int64_t cols,
                               const int32_t *__restrict__ ids, float *__restrict__ y) {
    const int64_t row = ids[blockIdx.x];
    const int64_t nb = cols / 32;
    float *yr = y + static_cast<int64_t>(blockIdx.x) * cols;
    for (int64_t ib = threadIdx.x; ib < nb; ib += blockDim.x) {
        float v[32];
        decode_block<B>(t + row * row_bytes, ib, v);
#pragma unroll
        for (int i = 0; i < 32; i++) yr[ib * 32 + i] = v[i];
    }
}

template <int TYPE>
__global__ void get_rows_float(const uint8_t *__restrict__ t, size_t row_bytes, int64_t cols,
                               const int32_t *__restrict__ ids, float *__restrict__ y) {
    const uint8_t *src = t + static_cast<int64_t>(ids[blockIdx.x]) * row_bytes;
    float *yr = y + static_cast<int64_t>(blockIdx.x) * cols;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = load_w<TYPE>(src, i);
}

/* Block-wide sum of a double, for blocks of kThreads. */
__device__ double block_sum_double(double v) {
    __shared__ double part[kThreads / kWarp];
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int wid = threadIdx.x / kWarp, lane = threadIdx.x & (kWarp - 1);
    if (lane == 0) part[wid] = v;
    __syncthreads();
    double s = 0.0;
    for (int i = 0; i < kThreads / kWarp; i++) s += part[i]; /* fixed order: deterministic */
    __syncthreads();
    return s;
}

__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(float *y, const float *x, const float *__restrict__ w, int dim, float eps) {
    const float *xr = x + static_cast<int64_t>(blockIdx.x) * dim;
    float *yr = y + static_cast<int64_t>(blockIdx.x) * dim;
    double ss = 0.0;
    for (int i = threadIdx.x; i < dim; i += kThreads) ss += static_cast<double>(xr[i]) * xr[i];
    ss = block_sum_double(ss);
    /* the CPU backend's expression, operation for operation */
    const float r = static_cast<float>(1.0 / sqrt(ss / dim + static_cast<double>(eps)));
    for (int i = threadIdx.x; i < dim; i += kThreads) yr[i] = xr[i] * r * w[i];
}

/* The angle of the pair starting at dim i (i even) at position p, as
 * backend.h's zi_rope_freqs says (YaRN's mix included), and its cos and sin
 * times mscale: the CPU backend's rope_angle, operation for operation, in
 * double. */
__device__ void rope_cs(double p, int i, int rope_dim, const zi_cuda_rope_freqs &rf, float *c,
                        float *s) {
    double e = p * pow(static_cast<double>(rf.base), -static_cast<double>(i) / rope_dim);
    if (rf.factors) e /= static_cast<double>(rf.factors[i / 2]);
    double theta = e * static_cast<double>(rf.freq_scale);
    if (rf.ext_factor != 0.0f) {
        const double lo = rf.corr_lo, hi = rf.corr_hi;
        double y = (static_cast<double>(i / 2) - lo) / (hi - lo > 0.001 ? hi - lo : 0.001);
        y = y < 0.0 ? 0.0 : y > 1.0 ? 1.0 : y;
        const double mix = (1.0 - y) * static_cast<double>(rf.ext_factor);
        theta = theta * (1.0 - mix) + e * mix;
    }
    *c = static_cast<float>(cos(theta) * static_cast<double>(rf.mscale));
    *s = static_cast<float>(sin(theta) * static_cast<double>(rf.mscale));
}

/* One block per token; thread i handles pair i of every head. */
__global__ void rope_kernel(float *x, const int32_t *__restrict__ pos, int n_heads, int head_dim,
                            int rope_dim, zi_cuda_rope_freqs rf) {
    const int t = blockIdx.x;
    const double p = static_cast<double>(pos[t]);
    for (int i = 2 * threadIdx.x; i < rope_dim; i += 2 * blockDim.x) {
        float c, s;
        rope_cs(p, i, rope_dim, rf, &c, &s);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
            const float x0 = v[i], x1 = v[i + 1];
            v[i] = x0 * c - x1 * s;
            v[i + 1] = x0 * s + x1 * c;
        }
    }
}

/* The NEOX layout of the same rotation: pair i is (v[i], v[i + rope_dim/2])
 * and takes the angle of rope_kernel's pair starting at 2i (the CPU
 * backend's rope_rows, neox case). */
__global__ void rope_neox_kernel(float *x, const int32_t *__restrict__ pos, int n_heads,
                                 int head_dim, int rope_dim, zi_cuda_rope_freqs rf) {
    const int t = blockIdx.x, half = rope_dim / 2;
    const double p = static_cast<double>(pos[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float c, s;
        rope_cs(p, 2 * i, rope_dim, rf, &c, &s);
        for (int h = 0; h < n_heads; h++) {
            float *v = x + (static_cast<int64_t>(t) * n_heads + h) * head_dim;
            const float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * c - x1 * s;
            v[i + half] = x0 * s + x1 * c;
        }
    }
}

__global__ void kv_store_kernel(float *kc, float *vc, const float *__restrict__ k,
                                const float *__restrict__ v, const int32_t *__restrict__ pos,
                                const int32_t *__restrict__ seq, const int32_t *__restrict__ tables,
                                int stride, int bs, int kvd) {
    const int t = blockIdx.x, p = pos[t];
    const int64_t blk = tables[static_cast<int64_t>(seq[t]) * stride + p / bs];
    const size_t off = (static_cast<size_t>(blk) * bs + static_cast<size_t>(p % bs)) * kvd;
    const size_t src = static_cast<size_t>(t) * kvd;
    for (int e = threadIdx.x; e < kvd; e += blockDim.x) {
        kc[off + e] = k[src + e];
        vc[off + e] = v[src + e];
    }
}

/* One position of a warp's online softmax: score sc, V row values v
 * (this lane's dims); m, l, acc are the running max, sum and weighted V. */
/* A score after attention logit soft-capping (cap > 0; 0: unchanged),
 * cap * tanh(sc / cap) as the CPU backend's attend (which uses double). */
__device__ __forceinline__ float cap_score(float sc, float cap) {
    return cap > 0.0f ? static_cast<float>(cap * tanh(static_cast<double>(sc) / cap)) : sc;
}

template <int DPL>
__device__ __forceinline__ void attn_step(float sc, const float *v, int lane, int hd, float &m,
                                          float &l, float *acc) {
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new); /* m = -inf at the first position: 0 */
    const float e = expf(sc - m_new);
    l = l * corr + e;
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane * DPL + j;
        acc[j] = acc[j] * corr + (d < hd ? e * v[j] : 0.0f);
    }
    m = m_new;
}

/*
 * Attention, one block per (token, head, split): the block's warps take
 * positions round-robin (each looks its row up in the block table), each keeping an online softmax
 * (running max m, sum l, weighted V sum acc) over its positions; then the warps' states are merged
 * through shared memory. Lane l holds dims [l*DPL, l*DPL + DPL) of the head in registers (DPL
 * = 2..32 covers head_dim up to 1024). With one split the block writes the output; with several it
 * writes (m, l, acc) to scratch for attn_merge.
 */
template <int DPL>
__global__ void __launch_bounds__(kAttnWarps *kWarp)
    attn_kernel(float *__restrict__ out, const float *__restrict__ q, const float *__restrict__ kc,
                const float *__restrict__ vc, const int32_t *__restrict__ pos,
                const int32_t *__restrict__ win_pos, const int32_t *__restrict__ seq,
                const int32_t *__restrict__ tables, int stride, int bs, int n_heads, int n_kv_heads,
                int hd, float scale, float softcap, int window, const float *__restrict__ sinks,
                int n_split, float *__restrict__ scratch) {
    extern __shared__ float smem[]; /* [kAttnWarps][hd] acc, then m[], l[] */
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x / kWarp, lane = threadIdx.x & (kWarp - 1);
    const int kvd = n_kv_heads * hd;
    const int kvh = h / (n_heads / n_kv_heads);
    /* positions start..pos[t]: all of them, or the last `window` counted
     * from win_pos[t] where given (the CPU backend's task_view); the
     * splits divide that span */
    const int end = pos[t] + 1;
    const int wp = win_pos ? win_pos[t] : pos[t];
    const int start = window > 0 && wp >= window ? wp - window + 1 : 0;
    const int n = end - start;
    const int chunk = (n + n_split - 1) / n_split;
    const int p0 = start + split * chunk, p1 = min(end, p0 + chunk);
    const float *qr = q + (static_cast<int64_t>(t) * n_heads + h) * hd;
    const int32_t *blocks = tables + static_cast<int64_t>(seq[t]) * stride;
    const size_t head = static_cast<size_t>(kvh) * hd;

    float qv[DPL], acc[DPL];
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane * DPL + j;
        qv[j] = d < hd ? qr[d] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    /* Each position is a chain of waits (its K and V rows, a warp sum), so
     * a warp loads two positions' rows before it reduces either; the
     * softmax still takes them in order (p, then p + kAttnWarps), so the
     * arithmetic is the one-at-a-time loop's. */
    int p = p0 + warp;
    if constexpr (DPL <= 8) {
        for (; p + kAttnWarps < p1; p += 2 * kAttnWarps) {
            const size_t row0 = (static_cast<size_t>(blocks[p / bs]) * bs + p % bs) * kvd + head;
            const int p2 = p + kAttnWarps;
            const size_t row1 = (static_cast<size_t>(blocks[p2 / bs]) * bs + p2 % bs) * kvd + head;
            float k0[DPL], k1[DPL], v0[DPL], v1[DPL];
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane * DPL + j;
                k0[j] = d < hd ? kc[row0 + d] : 0.0f;
                k1[j] = d < hd ? kc[row1 + d] : 0.0f;
                v0[j] = d < hd ? vc[row0 + d] : 0.0f;
                v1[j] = d < hd ? vc[row1 + d] : 0.0f;
            }
            float dot0 = 0.0f, dot1 = 0.0f;
#pragma unroll
            for (int j = 0; j < DPL; j++) {
                const int d = lane * DPL + j;
                if (d < hd) {
                    dot0 = fmaf(qv[j], k0[j], dot0);
                    dot1 = fmaf(qv[j], k1[j], dot1);
                }
            }
            const float sc0 = cap_score(warp_sum(dot0) * scale, softcap),
                        sc1 = cap_score(warp_sum(dot1) * scale, softcap);
            attn_step<DPL>(sc0, v0, lane, hd, m, l, acc);
            attn_step<DPL>(sc1, v1, lane, hd, m, l, acc);
        }
    }
    for (; p < p1; p += kAttnWarps) {
        /* position p: block blocks[p / bs], row p % bs of the pool */
        const size_t row = (static_cast<size_t>(blocks[p / bs]) * bs + p % bs) * kvd + head;
        const float *kr = kc + row;
        const float *vr = vc + row;
        float dot = 0.0f, vv[DPL];
#pragma unroll
        for (int j = 0; j < DPL; j++) {
            const int d = lane * DPL + j;
            if (d < hd) dot = fmaf(qv[j], kr[d], dot);
            vv[j] = d < hd ? vr[d] : 0.0f;
        }
        attn_step<DPL>(cap_score(warp_sum(dot) * scale, softcap), vv, lane, hd, m, l, acc);
    }

    /* merge the warps: weights exp(m_w - M); a warp that saw nothing has
     * m_w = -inf and weight 0 (never exp(-inf - -inf)) */
    float *sacc = smem, *sm = smem + kAttnWarps * hd, *sl = sm + kAttnWarps;
#pragma unroll
    for (int j = 0; j < DPL; j++) {
        const int d = lane * DPL + j;
        if (d < hd) sacc[warp * hd + d] = acc[j];
    }
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
    for (int i = 0; i < kAttnWarps; i++) M = fmaxf(M, sm[i]);
    float wgt[kAttnWarps], L = 0.0f;
    for (int i = 0; i < kAttnWarps; i++) {
        wgt[i] = sm[i] == -INFINITY ? 0.0f : expf(sm[i] - M);
        L += sl[i] * wgt[i];
    }
    if (n_split == 1) {
        float *orow = out + (static_cast<int64_t>(t) * n_heads + h) * hd;
        /* the sink's term in the denominator, after the positions, in
         * double as the CPU backend adds it */
        if (sinks) L = static_cast<float>(L + exp(static_cast<double>(sinks[h]) - M));
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float s = 0.0f;
            for (int i = 0; i < kAttnWarps; i++) s = fmaf(sacc[i * hd + d], wgt[i], s);
            orow[d] = s * inv;
        }
    } else {
        float *part =
            scratch + ((static_cast<int64_t>(t) * n_heads + h) * n_split + split) * (hd + 2);
        if (threadIdx.x == 0) {
            part[0] = M;
            part[1] = L;
        }
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float s = 0.0f;
            for (int i = 0; i < kAttnWarps; i++) s = fmaf(sacc[i * hd + d], wgt[i], s);
            part[2 + d] = s;
        }
    }
}

/* Merges the n_split partial states of each (token, head). */
__global__ void attn_merge(float *__restrict__ out, const float *__restrict__ scratch, int n_heads,
                           int hd, const float *__restrict__ sinks, int n_split) {
    const int t = blockIdx.x, h = blockIdx.y;
    const float *parts = scratch + (static_cast<int64_t>(t) * n_heads + h) * n_split * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < n_split; s++) M = fmaxf(M, parts[s * (hd + 2)]);
    float L = 0.0f;
    for (int s = 0; s < n_split; s++) {
        const float ms = parts[s * (hd + 2)];
        if (ms != -INFINITY) L += parts[s * (hd + 2) + 1] * expf(ms - M);
    }
    if (sinks) L = static_cast<float>(L + exp(static_cast<double>(sinks[h]) - M));
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float *orow = out + (static_cast<int64_t>(t) * n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < n_split; s++) {
            const float ms = parts[s * (hd + 2)];
            if (ms != -INFINITY) acc = fmaf(parts[s * (hd + 2) + 2 + d], expf(ms - M), acc);
        }
        orow[d] = acc * inv;
    }
}

template <int DPL>
cudaError_t launch_attn(float *out, const float *q, const float *kc, const float *vc,
                        const int32_t *pos, const int32_t *win_pos, const int32_t *seq,
                        const int32_t *tables, int stride, int bs, int n_tokens, int n_heads,
                        int n_kv_heads, int hd, float scale, float softcap, int window,
                        const float *sinks, int n_split, float *scratch, cudaStream_t s) {
    const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_heads),
                    static_cast<unsigned>(n_split));
    const size_t shmem = (static_cast<size_t>(kAttnWarps) * hd + 2 * kAttnWarps) * sizeof(float);
    attn_kernel<DPL><<<grid, kAttnWarps * kWarp, shmem, s>>>(
        out, q, kc, vc, pos, win_pos, seq, tables, stride, bs, n_heads, n_kv_heads, hd, scale,
        softcap, window, sinks, n_split, scratch);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1) return e;
    const dim3 mgrid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_heads));
    const int merge_threads = hd < 128 ? 64 : 128;
    attn_merge<<<mgrid, merge_threads, 0, s>>>(out, scratch, n_heads, hd, sinks, n_split);
    return cudaGetLastError();
}

__global__ void swiglu_kernel(float *out, const float *gate, const float *__restrict__ up,
                              size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* gpt-oss's clamped SwiGLU (backend.h's swiglu_oai), the CPU backend's
 * expression operation for operation, with expf. */
__global__ void swiglu_oai_kernel(float *out, const float *gate, const float *__restrict__ up,
                                  size_t n, float alpha, float limit) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float x = gate[i] < limit ? gate[i] : limit;
        const float v = up[i] < -limit ? -limit : up[i] > limit ? limit : up[i];
        out[i] = x / (1.0f + expf(-alpha * x)) * (v + 1.0f);
    }
}

/* GELU's tanh approximation written as g / (1 + exp(-2y)), y = sqrt(2/pi)
 * (g + 0.044715 g^3): the CPU backend's geglu_f32, constant for constant,
 * with expf (not __expf) for agreement. */
__global__ void geglu_kernel(float *out, const float *gate, const float *__restrict__ up,
                             size_t n) {
    const float k1 = 1.5957691216057308f, k3 = 0.0713548162726009f;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += stride) {
        const float g = gate[i];
        const float z = k1 * g + k3 * (g * g * g);
        out[i] = g / (1.0f + expf(-z)) * up[i];
    }
}

__global__ void scale_kernel(float *x, float f, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] *= f;
}

/* In double, as the CPU backend: tanhf's error would be multiplied by the
 * cap (30 for gemma2's logits). */
__global__ void softcap_kernel(float *x, float cap, size_t n) {
    const double c = cap;
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = static_cast<float>(c * tanh(x[i] / c));
}

__global__ void add_kernel(float *x, const float *__restrict__ y, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] += y[i];
}

/* x[r][i] += bias[i], rows of dim, n = rows * dim elements. */
__global__ void add_bias_kernel(float *x, const float *__restrict__ bias, int dim, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] += bias[i % static_cast<size_t>(dim)];
}

/* Blocks for n elements, grid-stride beyond 65536 blocks. */
unsigned ew_blocks(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b > 65536 ? 65536 : b);
}

} // namespace

/* Weights of a type into a dense T matrix (zi_cuda_to_f16, zi_cuda_to_f32);
 * f16_source: whether F16 weights are taken (the float16 copy has none
 * to make: they are used as they are). */
template <typename T>
static cudaError_t to_dense(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                            T *out, bool f16_source, cudaStream_t stream) {
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    const int64_t nb = rows * (cols / 32), ne = rows * cols;
    const unsigned gq = static_cast<unsigned>((nb + kThreads - 1) / kThreads);
    const unsigned gf = static_cast<unsigned>((ne + kThreads - 1) / kThreads);
    switch (type) {
#define ZI_CASE(TY, B)                                                                             \
    case TY:                                                                                       \
        quant_to_dense<B, T><<<gq, kThreads, 0, stream>>>(wb, row_bytes, rows, cols, out);         \
        break;
        ZI_CUDA_QUANT_TYPES(ZI_CASE)
#undef ZI_CASE
    case ZI_TYPE_F16:
        if (!f16_source) return cudaErrorInvalidValue;
        float_to_dense<ZI_TYPE_F16, T><<<gf, kThreads, 0, stream>>>(wb, row_bytes, rows, cols, out);
        break;
    case ZI_TYPE_BF16:
        float_to_dense<ZI_TYPE_BF16, T>
            <<<gf, kThreads, 0, stream>>>(wb, row_bytes, rows, cols, out);
        break;
    case ZI_TYPE_F32:
        float_to_dense<ZI_TYPE_F32, T><<<gf, kThreads, 0, stream>>>(wb, row_bytes, rows, cols, out);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" {

cudaError_t zi_cuda_kernels_check(void) {
    cudaFuncAttributes a;
    return cudaFuncGetAttributes(&a, add_kernel);
}

cudaError_t zi_cuda_mmv(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                        const float *x, float *y, int n_tokens, cudaStream_t stream) {
    if (rows <= 0 || n_tokens <= 0) return cudaSuccess;
    if (n_tokens == 1) return launch_mmv<1>(type, w, row_bytes, rows, cols, x, y, 1, stream);
    if (n_tokens == 2) return launch_mmv<2>(type, w, row_bytes, rows, cols, x, y, 2, stream);
    if (n_tokens <= 4) return launch_mmv<4>(type, w, row_bytes, rows, cols, x, y, n_tokens, stream);
    if (n_tokens <= ZI_CUDA_MMV_MAX_TOKENS)
        return launch_mmv<ZI_CUDA_MMV_MAX_TOKENS>(type, w, row_bytes, rows, cols, x, y, n_tokens,
                                                  stream);
    return cudaErrorInvalidValue;
}

cudaError_t zi_cuda_to_f16(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                           void *out, cudaStream_t stream) {
    return to_dense(type, w, row_bytes, rows, cols, static_cast<__half *>(out), false, stream);
}

cudaError_t zi_cuda_to_f32(int type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                           float *out, cudaStream_t stream) {
    return to_dense(type, w, row_bytes, rows, cols, out, true, stream);
}

cudaError_t zi_cuda_f32_to_f16(const float *x, void *out, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const unsigned g = static_cast<unsigned>((n + kThreads - 1) / kThreads);
    f32_to_f16<<<g, kThreads, 0, stream>>>(x, static_cast<__half *>(out), n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_get_rows(int type, const void *table, size_t row_bytes, int64_t cols,
                             const int32_t *ids, int n, float *y, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const uint8_t *t = static_cast<const uint8_t *>(table);
    const unsigned g = static_cast<unsigned>(n);
    switch (type) {
#define ZI_CASE(TY, B)                                                                             \
    case TY:                                                                                       \
        get_rows_quant<B><<<g, 128, 0, stream>>>(t, row_bytes, cols, ids, y);                      \
        break;
        ZI_CUDA_QUANT_TYPES(ZI_CASE)
#undef ZI_CASE
    case ZI_TYPE_F32:
        get_rows_float<ZI_TYPE_F32><<<g, 256, 0, stream>>>(t, row_bytes, cols, ids, y);
        break;
    case ZI_TYPE_F16:
        get_rows_float<ZI_TYPE_F16><<<g, 256, 0, stream>>>(t, row_bytes, cols, ids, y);
        break;
    case ZI_TYPE_BF16:
        get_rows_float<ZI_TYPE_BF16><<<g, 256, 0, stream>>>(t, row_bytes, cols, ids, y);
        break;
    default:
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t zi_cuda_rmsnorm(float *y, const float *x, const float *w, int n_tokens, int dim,
                            float eps, cudaStream_t stream) {
    if (n_tokens <= 0) return cudaSuccess;
    rmsnorm_kernel<<<static_cast<unsigned>(n_tokens), kThreads, 0, stream>>>(y, x, w, dim, eps);
    return cudaGetLastError();
}

cudaError_t zi_cuda_rope(float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
                         int rope_dim, const zi_cuda_rope_freqs *rf, cudaStream_t stream) {
    if (n_tokens <= 0 || rope_dim <= 0) return cudaSuccess;
    const int threads = rope_dim / 2 < 128 ? (rope_dim / 2 + 31) / 32 * 32 : 128;
    rope_kernel<<<static_cast<unsigned>(n_tokens), threads, 0, stream>>>(x, pos, n_heads, head_dim,
                                                                         rope_dim, *rf);
    return cudaGetLastError();
}

cudaError_t zi_cuda_rope_neox(float *x, const int32_t *pos, int n_tokens, int n_heads, int head_dim,
                              int rope_dim, const zi_cuda_rope_freqs *rf, cudaStream_t stream) {
    if (n_tokens <= 0 || rope_dim <= 0) return cudaSuccess;
    if (rope_dim % 2 || rope_dim > head_dim) return cudaErrorInvalidValue;
    const int threads = rope_dim / 2 < 128 ? (rope_dim / 2 + 31) / 32 * 32 : 128;
    rope_neox_kernel<<<static_cast<unsigned>(n_tokens), threads, 0, stream>>>(
        x, pos, n_heads, head_dim, rope_dim, *rf);
    return cudaGetLastError();
}

cudaError_t zi_cuda_kv_store(float *kc, float *vc, const float *k, const float *v,
                             const int32_t *pos, const int32_t *seq, const int32_t *tables,
                             int stride, int block_size, int n_tokens, int kvd,
                             cudaStream_t stream) {
    if (n_tokens <= 0) return cudaSuccess;
    if (block_size < 1 || stride < 1) return cudaErrorInvalidValue;
    const unsigned blocks = static_cast<unsigned>(n_tokens), threads = kvd < 256 ? 128 : 256;
    kv_store_kernel<<<blocks, threads, 0, stream>>>(kc, vc, k, v, pos, seq, tables, stride,
                                                    block_size, kvd);
    return cudaGetLastError();
}

cudaError_t zi_cuda_attention(float *out, const float *q, const float *kc, const float *vc,
                              const int32_t *pos, const int32_t *win_pos, const int32_t *seq,
                              const int32_t *tables, int stride, int block_size, int n_tokens,
                              int n_heads, int n_kv_heads, int head_dim, float scale, float softcap,
                              int window, const float *sinks, int n_split, float *scratch,
                              cudaStream_t stream) {
    if (n_tokens <= 0) return cudaSuccess;
    if (head_dim <= 0 || head_dim > ZI_CUDA_MAX_HEAD_DIM || n_kv_heads <= 0 || window < 0 ||
        !(softcap >= 0.0f) || n_heads % n_kv_heads != 0 || n_split < 1 ||
        n_split > ZI_CUDA_ATTN_MAX_SPLIT || (n_split > 1 && !scratch) || block_size < 1 ||
        stride < 1)
        return cudaErrorInvalidValue;
#define ZI_ATTN(DPL)                                                                               \
    launch_attn<DPL>(out, q, kc, vc, pos, win_pos, seq, tables, stride, block_size, n_tokens,      \
                     n_heads, n_kv_heads, head_dim, scale, softcap, window, sinks, n_split,        \
                     scratch, stream)
    if (head_dim <= 64) return ZI_ATTN(2);
    if (head_dim <= 128) return ZI_ATTN(4);
    if (head_dim <= 256) return ZI_ATTN(8);
    if (head_dim <= 512) return ZI_ATTN(16);
    return ZI_ATTN(32);
#undef ZI_ATTN
}

cudaError_t zi_cuda_swiglu(float *out, const float *gate, const float *up, size_t n,
                           cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    swiglu_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_swiglu_oai(float *out, const float *gate, const float *up, size_t n,
                               float alpha, float limit, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    swiglu_oai_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(out, gate, up, n, alpha, limit);
    return cudaGetLastError();
}

cudaError_t zi_cuda_geglu(float *out, const float *gate, const float *up, size_t n,
                          cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    geglu_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(out, gate, up, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_scale(float *x, float s, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    scale_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, s, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_softcap(float *x, float cap, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    softcap_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, cap, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_add(float *x, const float *y, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    add_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_add_bias(float *x, const float *bias, int n_rows, int dim,
                             cudaStream_t stream) {
    if (n_rows <= 0 || dim <= 0) return cudaSuccess;
    const size_t n = static_cast<size_t>(n_rows) * static_cast<size_t>(dim);
    add_bias_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, bias, dim, n);
    return cudaGetLastError();
}

} // extern "C"

__global__ void noop_kernel() {}

cudaError_t zi_cuda_noop(cudaStream_t s) {
    noop_kernel<<<1, 1, 0, s>>>();
    return cudaGetLastError();
}

/* ---- LoRA (zi_cuda_lora) ---- */

namespace {

constexpr int kLoraWarps = 8; /* A rows (rank entries) per block of lora_down */

__device__ __forceinline__ float lora_elem(const void *p, size_t i, int f16) {
    return f16 ? __half2float(reinterpret_cast<const __half *>(p)[i])
               : reinterpret_cast<const float *>(p)[i];
}

/* c[t][k] = scale * dot(A row k, x[t]): one warp per (token, k), lanes
 * striding over cols, then a fixed butterfly: the same bits for a token
 * whatever else the batch holds. */
__global__ void __launch_bounds__(kLoraWarps *kWarp)
    lora_down_kernel(float *__restrict__ c, const float *__restrict__ x, int64_t cols,
                     const zi_cuda_lora_row *__restrict__ r, int max_rank) {
    const int t = blockIdx.y;
    const int k = blockIdx.x * kLoraWarps + threadIdx.x / kWarp;
    const int lane = threadIdx.x % kWarp;
    const zi_cuda_lora_row row = r[t];
    if (!row.a || k >= row.rank) return;
    const float *xt = x + static_cast<size_t>(t) * static_cast<size_t>(cols);
    const size_t base = static_cast<size_t>(k) * static_cast<size_t>(cols);
    float s = 0.0f;
    for (int64_t i = lane; i < cols; i += kWarp)
        s = fmaf(lora_elem(row.a, base + static_cast<size_t>(i), row.f16), xt[i], s);
    s = warp_sum(s);
    if (lane == 0) c[static_cast<size_t>(t) * max_rank + k] = s * row.scale;
}

/* y[t][i] += sum over k of c[t][k] * Bt[k][i], k in order: one thread per
 * output row i. */
__global__ void __launch_bounds__(kThreads)
    lora_up_kernel(float *__restrict__ y, const float *__restrict__ c, int64_t rows,
                   const zi_cuda_lora_row *__restrict__ r, int max_rank) {
    const int t = blockIdx.y;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    const zi_cuda_lora_row row = r[t];
    if (!row.a || i >= rows) return;
    const float *ct = c + static_cast<size_t>(t) * max_rank;
    float *yt = y + static_cast<size_t>(t) * static_cast<size_t>(rows);
    float acc = yt[i];
    for (int k = 0; k < row.rank; k++)
        acc = fmaf(
            ct[k],
            lora_elem(row.bt,
                      static_cast<size_t>(k) * static_cast<size_t>(rows) + static_cast<size_t>(i),
                      row.f16),
            acc);
    yt[i] = acc;
}

} // namespace

cudaError_t zi_cuda_lora(float *y, const float *x, int n_tokens, int64_t rows, int64_t cols,
                         const zi_cuda_lora_row *r, int max_rank, float *scratch,
                         cudaStream_t stream) {
    if (n_tokens <= 0 || rows <= 0 || cols <= 0 || max_rank <= 0) return cudaSuccess;
    const dim3 down((max_rank + kLoraWarps - 1) / kLoraWarps, n_tokens);
    lora_down_kernel<<<down, kLoraWarps * kWarp, 0, stream>>>(scratch, x, cols, r, max_rank);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    const dim3 up(static_cast<unsigned>((rows + kThreads - 1) / kThreads), n_tokens);
    lora_up_kernel<<<up, kThreads, 0, stream>>>(y, scratch, rows, r, max_rank);
    return cudaGetLastError();
}
