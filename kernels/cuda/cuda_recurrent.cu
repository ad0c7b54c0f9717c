/*
 * cuda_recurrent.cu - device code of cuda_recurrent.h: the element-wise
 * gates, the gather, the grouped RMSNorm, and the three recurrences of the
 * hybrid families (short convolution, gated delta rule, Mamba-2 scan).
 *
 * The recurrences run each sequence's tokens in order inside one thread
 * block, one thread per independent state column, so a pass of any mix of
 * sequences needs one launch and a token's result depends on its own
 * sequence only (batch invariance). The per-token scalars (norms, gates,
 * steps) are computed in double as the CPU backend does; the recurrences
 * are float32 with fused multiply-adds in the CPU kernels' order.
 */
#include "cuda_recurrent.h"

#include <math.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

unsigned ew_blocks(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b > 65536 ? 65536 : b);
}

__global__ void mul_kernel(float *x, const float *__restrict__ y, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] *= y[i];
}

__global__ void silu_kernel(float *x, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = x[i] / (1.0f + expf(-x[i]));
}

__global__ void sigmoid_mul_kernel(float *x, const float *__restrict__ g, size_t n) {
    const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
    for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = x[i] / (1.0f + expf(-g[i]));
}

/* A block a row. */
__global__ void gather_rows_kernel(float *__restrict__ y, const float *__restrict__ x,
                                   const int32_t *__restrict__ idx, int dim) {
    const float *src = x + static_cast<int64_t>(idx[blockIdx.x]) * dim;
    float *dst = y + static_cast<int64_t>(blockIdx.x) * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
}

/* Block-wide sum of a double, in a fixed order (deterministic); every
 * thread gets the sum. For blocks of a multiple of kWarp threads. */
__device__ double block_sum(double v) {
    __shared__ double part[ZI_CUDA_REC_MAX_COLS / kWarp];
    __shared__ double total;
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int wid = threadIdx.x / kWarp, lane = threadIdx.x & (kWarp - 1);
    if (lane == 0) part[wid] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < static_cast<int>(blockDim.x) / kWarp; i++) s += part[i];
        total = s;
    }
    __syncthreads();
    const double s = total;
    __syncthreads(); /* total and part are free for the next call */
    return s;
}

/* A block a (token, group) row of dg floats. */
__global__ void rmsnorm_groups_kernel(float *y, const float *x, const float *__restrict__ w, int dg,
                                      int groups, float eps) {
    const int64_t r = blockIdx.x;
    const float *xr = x + r * dg;
    float *yr = y + r * dg;
    const float *wr = w + (r % groups) * dg;
    double ss = 0.0;
    for (int i = threadIdx.x; i < dg; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
    ss = block_sum(ss);
    const float rr = static_cast<float>(1.0 / sqrt(ss / dg + static_cast<double>(eps)));
    for (int i = threadIdx.x; i < dg; i += blockDim.x) yr[i] = xr[i] * rr * wr[i];
}

/* A thread a channel c; the window row slot[i] of states is [j][c]. */
__global__ void conv_state_kernel(float *__restrict__ y, const float *__restrict__ x,
                                  const float *__restrict__ w, int K, int C, float *states,
                                  const int32_t *__restrict__ slot, const int32_t *__restrict__ pos,
                                  int n) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *wc = w + static_cast<int64_t>(c) * K;
    for (int i = 0; i < n; i++) {
        float *s = states + static_cast<int64_t>(slot[i]) * (K - 1) * C + c;
        if (pos[i] == 0)
            for (int j = 0; j < K - 1; j++) s[static_cast<int64_t>(j) * C] = 0.0f;
        float acc = 0.0f;
        for (int j = 0; j < K - 1; j++) acc += wc[j] * s[static_cast<int64_t>(j) * C];
        const float xi = x[static_cast<int64_t>(i) * C + c];
        y[static_cast<int64_t>(i) * C + c] = acc + wc[K - 1] * xi;
        for (int j = 0; j + 1 < K - 1; j++)
            s[static_cast<int64_t>(j) * C] = s[static_cast<int64_t>(j + 1) * C];
        s[static_cast<int64_t>(K - 2) * C] = xi;
    }
}

__device__ double softplus(double v) {
    return v > 20.0 ? v : log1p(exp(v));
}

/* A block a value head h, thread j a column of its state S (d x d, [i][j],
 * in global memory: threads read consecutive floats of a row). Per token:
 * q and k normalized into shared memory, then S = decay S; u = beta (v_j -
 * sum_i S[i][j] k[i]); S[i][j] += k[i] u; out_j = sum_i S[i][j] q[i]. */
__global__ void delta_net_kernel(float *__restrict__ out, const float *__restrict__ qkv,
                                 const float *__restrict__ b, const float *__restrict__ alpha,
                                 const float *__restrict__ dt_bias, const float *__restrict__ a,
                                 float *states, const int32_t *__restrict__ slot,
                                 const int32_t *__restrict__ pos, int n, int nk, int nv, int d,
                                 float eps) {
    __shared__ float qn[ZI_CUDA_REC_MAX_COLS], kn[ZI_CUDA_REC_MAX_COLS];
    const int h = blockIdx.x, j = threadIdx.x;
    const int64_t row = static_cast<int64_t>(2 * nk + nv) * d, sz = static_cast<int64_t>(d) * d;
    for (int t = 0; t < n; t++) {
        float *S = states + (static_cast<int64_t>(slot[t]) * nv + h) * sz;
        const float *q = qkv + t * row + static_cast<int64_t>(h % nk) * d;
        const float *k = q + static_cast<int64_t>(nk) * d;
        const float qj = j < d ? q[j] : 0.0f, kj = j < d ? k[j] : 0.0f;
        const double sq = block_sum(static_cast<double>(qj) * qj),
                     sk = block_sum(static_cast<double>(kj) * kj);
        const double rq = 1.0 / (sqrt(sq + eps) * sqrt(static_cast<double>(d))),
                     rk = 1.0 / sqrt(sk + eps);
        if (j < d) {
            qn[j] = static_cast<float>(qj * rq);
            kn[j] = static_cast<float>(kj * rk);
        }
        __syncthreads();
        if (j < d) {
            const float beta =
                static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(b[t * nv + h]))));
            const double g = static_cast<double>(alpha[t * nv + h]) + dt_bias[h];
            const float decay = static_cast<float>(exp(softplus(g) * a[h]));
            if (pos[t] == 0)
                for (int i = 0; i < d; i++) S[static_cast<int64_t>(i) * d + j] = 0.0f;
            float u = 0.0f;
            for (int i = 0; i < d; i++)
                u = fmaf(S[static_cast<int64_t>(i) * d + j] * decay, kn[i], u);
            const float v = qkv[t * row + static_cast<int64_t>(2 * nk + h) * d + j];
            u = beta * (v - u);
            float o = 0.0f;
            for (int i = 0; i < d; i++) {
                float *sp = S + static_cast<int64_t>(i) * d + j;
                const float sv = fmaf(kn[i], u, *sp * decay);
                *sp = sv;
                o = fmaf(sv, qn[i], o);
            }
            out[static_cast<int64_t>(t) * nv * d + static_cast<int64_t>(h) * d + j] = o;
        }
        __syncthreads(); /* qn and kn are rewritten for the next token */
    }
}

/* A block a head h, thread p a column of its state S (N x P, [n][p]). */
__global__ void ssm_scan_kernel(float *__restrict__ out, const float *__restrict__ xbc,
                                const float *__restrict__ dt, const float *__restrict__ dt_bias,
                                const float *__restrict__ a, const float *__restrict__ dd,
                                float *states, const int32_t *__restrict__ slot,
                                const int32_t *__restrict__ pos, int n, int H, int P, int G,
                                int N) {
    const int h = blockIdx.x, p = threadIdx.x;
    if (p >= P) return;
    const int64_t row = static_cast<int64_t>(H) * P + static_cast<int64_t>(2) * G * N,
                  sz = static_cast<int64_t>(P) * N;
    const int64_t boff = static_cast<int64_t>(H) * P + static_cast<int64_t>(h / (H / G)) * N;
    for (int t = 0; t < n; t++) {
        float *S = states + (static_cast<int64_t>(slot[t]) * H + h) * sz;
        if (pos[t] == 0)
            for (int k = 0; k < N; k++) S[static_cast<int64_t>(k) * P + p] = 0.0f;
        const double v = static_cast<double>(dt[static_cast<int64_t>(t) * H + h]) + dt_bias[h];
        const double step = softplus(v);
        const float d = static_cast<float>(step), dA = static_cast<float>(exp(step * a[h]));
        const float x = xbc[t * row + static_cast<int64_t>(h) * P + p];
        const float *B = xbc + t * row + boff, *C = B + static_cast<int64_t>(G) * N;
        const float dx = d * x;
        float o = 0.0f;
        for (int k = 0; k < N; k++) {
            float *sp = S + static_cast<int64_t>(k) * P + p;
            const float sv = fmaf(dx, B[k], *sp * dA);
            *sp = sv;
            o = fmaf(sv, C[k], o);
        }
        out[static_cast<int64_t>(t) * H * P + static_cast<int64_t>(h) * P + p] =
            static_cast<float>(o + static_cast<double>(dd[h]) * x);
    }
}

/* Threads for a block of `cols` columns: a multiple of the warp. */
unsigned col_threads(int cols) {
    return static_cast<unsigned>((cols + kWarp - 1) / kWarp * kWarp);
}

} // namespace

extern "C" {

cudaError_t zi_cuda_mul(float *x, const float *y, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    mul_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, y, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_silu(float *x, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    silu_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_sigmoid_mul(float *x, const float *g, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    sigmoid_mul_kernel<<<ew_blocks(n), kThreads, 0, stream>>>(x, g, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_gather_rows(float *y, const float *x, const int32_t *idx, int n, int dim,
                                cudaStream_t stream) {
    if (n <= 0 || dim <= 0) return cudaSuccess;
    const unsigned threads = dim < kThreads ? col_threads(dim) : kThreads;
    gather_rows_kernel<<<static_cast<unsigned>(n), threads, 0, stream>>>(y, x, idx, dim);
    return cudaGetLastError();
}

cudaError_t zi_cuda_rmsnorm_groups(float *y, const float *x, const float *w, int n_tokens, int dim,
                                   int groups, float eps, cudaStream_t stream) {
    if (n_tokens <= 0 || groups <= 0 || dim % groups) return cudaErrorInvalidValue;
    const int dg = dim / groups;
    rmsnorm_groups_kernel<<<static_cast<unsigned>(n_tokens * groups), kThreads, 0, stream>>>(
        y, x, w, dg, groups, eps);
    return cudaGetLastError();
}

cudaError_t zi_cuda_conv_state(float *y, const float *x, const float *w, int K, int channels,
                               float *states, const int32_t *slot, const int32_t *pos, int n,
                               cudaStream_t stream) {
    if (n <= 0 || channels <= 0) return cudaSuccess;
    if (K < 2) return cudaErrorInvalidValue;
    const unsigned blocks = static_cast<unsigned>((channels + 127) / 128);
    conv_state_kernel<<<blocks, 128, 0, stream>>>(y, x, w, K, channels, states, slot, pos, n);
    return cudaGetLastError();
}

cudaError_t zi_cuda_delta_net(float *out, const float *qkv, const float *b, const float *alpha,
                              const float *dt_bias, const float *a, float *states,
                              const int32_t *slot, const int32_t *pos, int n, int nk, int nv, int d,
                              float eps, cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (d < 1 || d > ZI_CUDA_REC_MAX_COLS || nk < 1 || nv < 1) return cudaErrorInvalidValue;
    delta_net_kernel<<<static_cast<unsigned>(nv), col_threads(d), 0, stream>>>(
        out, qkv, b, alpha, dt_bias, a, states, slot, pos, n, nk, nv, d, eps);
    return cudaGetLastError();
}

cudaError_t zi_cuda_ssm_scan(float *out, const float *xbc, const float *dt, const float *dt_bias,
                             const float *a, const float *dd, float *states, const int32_t *slot,
                             const int32_t *pos, int n, int H, int P, int G, int N,
                             cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    if (P < 1 || P > ZI_CUDA_REC_MAX_COLS || H < 1 || G < 1 || H % G || N < 1)
        return cudaErrorInvalidValue;
    ssm_scan_kernel<<<static_cast<unsigned>(H), col_threads(P), 0, stream>>>(
        out, xbc, dt, dt_bias, a, dd, states, slot, pos, n, H, P, G, N);
    return cudaGetLastError();
}

} // extern "C"
