/*
 * sampling.cu - the GPU sampler (see sampling.h): the kernel, one thread
 * block per row, and its host-side driver.
 *
 * The kernel runs the passes of zi_gpu_sample_ref (sampling_ref.c) with the
 * same helpers (sampling_ref.h), each pass split over the block: thread i
 * takes tokens i, i + blockDim, ... and the block combines with a
 * fixed-order reduction (sums, counts, the best token) or a block-wide scan
 * (the m-th tied token, the draw's crossing point, both in id order). Fixed
 * orders make the result a pure function of the inputs, run after run.
 */
extern "C" {
#include "zi_error.h"
}

#include "sampling.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "sampling_ref.h"

namespace {

constexpr int kT = 1024; /* threads per row */
constexpr int kWarps = kT / 32;

struct Shared {
    double d[kWarps];
    int32_t i[kWarps];
    float f[kWarps];
};

/* Sum over the block, in a fixed order; every thread gets the result. */
__device__ double block_sum(double v, Shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sh.d[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < kWarps; w++) s += sh.d[w];
    __syncthreads();
    return s;
}

__device__ int32_t block_min_int(int32_t v, Shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) sh.i[warp] = v;
    __syncthreads();
    int32_t m = INT32_MAX;
    for (int w = 0; w < kWarps; w++) m = min(m, sh.i[w]);
    __syncthreads();
    return m;
}

__device__ int32_t block_max_int(int32_t v, Shared &sh) {
    return -block_min_int(-v, sh); /* v >= -1 here, so negation cannot overflow */
}

/* The best (value, id) over the block (id -1: none). */
__device__ void block_best(float *v, int32_t *id, Shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    float bv = *v;
    int32_t bi = *id;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi >= 0 && (bi < 0 || zi_gs_better(ov, oi, bv, bi))) bv = ov, bi = oi;
    }
    if (lane == 0) sh.f[warp] = bv, sh.i[warp] = bi;
    __syncthreads();
    bv = -INFINITY;
    bi = -1;
    for (int w = 0; w < kWarps; w++)
        if (sh.i[w] >= 0 && (bi < 0 || zi_gs_better(sh.f[w], sh.i[w], bv, bi)))
            bv = sh.f[w], bi = sh.i[w];
    __syncthreads();
    *v = bv;
    *id = bi;
}

/* Inclusive prefix sum over the block in thread order; *total gets the
 * block's sum. */
__device__ double block_scan(double v, double *total, Shared &sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    if (lane == 31) sh.d[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double x = lane < kWarps ? sh.d[lane] : 0.0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const double n = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += n;
        }
        if (lane < kWarps) sh.d[lane] = x;
    }
    __syncthreads();
    const double before = warp > 0 ? sh.d[warp - 1] : 0.0;
    *total = sh.d[kWarps - 1];
    __syncthreads();
    return v + before;
}

/* The first token, in id order, with f(t) > 0 at which the running sum of
 * f reaches target (>= target, or > target when strict); -1 if none. */
template <class F>
__device__ int32_t first_cross(int32_t n, F f, double target, bool strict, Shared &sh) {
    double carry = 0.0;
    for (int32_t base = 0; base < n; base += kT) {
        const int32_t t = base + static_cast<int32_t>(threadIdx.x);
        const double v = t < n ? f(t) : 0.0;
        double total;
        const double run = block_scan(v, &total, sh) + carry;
        const bool hit = v > 0.0 && (strict ? run > target : run >= target);
        const int32_t first = block_min_int(hit ? t : INT32_MAX, sh);
        if (first != INT32_MAX) return first;
        carry += total;
    }
    return -1;
}

/* The row r reads: its rewrite (steps 1-4) when it has one, else the
 * model's logits. */
__device__ const float *row_logits(const float *logits, size_t ld, const float *work, int32_t n,
                                   const zi_gpu_sample_params &p) {
    if (p.flags & ZI_GS_PREP) return work + static_cast<size_t>(blockIdx.x) * n;
    return p.src ? p.src : logits + static_cast<size_t>(blockIdx.x) * ld;
}

/* Steps 1-4 (zi_gpu_prepare_ref): row r's logits with the bitmask applied
 * into work row r, then its listed tokens penalised (or forbidden). The
 * entries name distinct tokens (zi_gpu_pen_build), so the second pass has
 * no two threads on one token; __syncthreads orders it after the copy. */
__global__ void __launch_bounds__(kT)
    prep_kernel(const float *__restrict__ logits, size_t ld, float *__restrict__ work, int32_t n,
                const zi_gpu_sample_params *__restrict__ params,
                const zi_gpu_pen *__restrict__ ents, const uint32_t *__restrict__ masks,
                size_t words) {
    const zi_gpu_sample_params p = params[blockIdx.x];
    if (!(p.flags & ZI_GS_PREP)) return; /* uniform over the block */
    const float *src = p.src ? p.src : logits + static_cast<size_t>(blockIdx.x) * ld;
    float *dst = work + static_cast<size_t>(blockIdx.x) * n;
    const uint32_t *mask =
        p.mask_row >= 0 ? masks + static_cast<size_t>(p.mask_row) * words : nullptr;
    for (int32_t t = static_cast<int32_t>(threadIdx.x); t < n; t += kT)
        dst[t] = zi_gs_allowed(mask, t) ? src[t] : -INFINITY;
    __syncthreads();
    for (uint32_t i = threadIdx.x; i < p.n_ent; i += kT) {
        const zi_gpu_pen e = ents[p.ent_off + i];
        if (e.id < 0 || e.id >= n) continue; /* checked on the host; never trusted */
        dst[e.id] = zi_gs_allowed(mask, e.id) ? zi_gs_penalised(src[e.id], &p, e.count) : -INFINITY;
    }
}

__global__ void __launch_bounds__(kT)
    sample_kernel(const float *__restrict__ logits, size_t ld, const float *__restrict__ work,
                  int32_t n, const zi_gpu_sample_params *__restrict__ params,
                  int32_t *__restrict__ out) {
    __shared__ Shared sh;
    const zi_gpu_sample_params p = params[blockIdx.x];
    const float *lg = row_logits(logits, ld, work, n, p);
    const int32_t tid = static_cast<int32_t>(threadIdx.x);

    /* pass 1: the best token and the candidate count */
    float bv = -INFINITY;
    int32_t bi = -1;
    double cnt = 0.0;
    for (int32_t t = tid; t < n; t += kT) {
        const float v = lg[t];
        if (!zi_gs_candidate(v)) continue;
        cnt += 1.0;
        if (bi < 0 || zi_gs_better(v, t, bv, bi)) bv = v, bi = t;
    }
    block_best(&bv, &bi, sh);
    const double n_cand = block_sum(cnt, sh);
    if (!(p.temperature > 0.0) || p.top_k == 1 || bi < 0) {
        if (tid == 0) out[blockIdx.x] = bi;
        return; /* uniform: every thread holds the same bi */
    }
    const float vmax = bv;
    const float inv_t = static_cast<float>(1.0 / p.temperature);
    zi_gpu_cut cut = {0u, INT32_MAX};

    /* top_k: the k-th best key by binary search on counts, then its ties */
    const int64_t k = p.top_k >= 1 && p.top_k < n ? p.top_k : 0;
    if (k && n_cand > static_cast<double>(k)) {
        uint32_t lo = 0, hi = 0xffffffffu;
        while (lo < hi) {
            const uint32_t mid =
                lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
            double c = 0.0;
            for (int32_t t = tid; t < n; t += kT) {
                const float v = lg[t];
                c += zi_gs_candidate(v) && zi_gs_key(v) >= mid ? 1.0 : 0.0;
            }
            if (block_sum(c, sh) >= static_cast<double>(k))
                lo = mid;
            else
                hi = mid - 1;
        }
        double gt = 0.0;
        for (int32_t t = tid; t < n; t += kT) {
            const float v = lg[t];
            gt += zi_gs_candidate(v) && zi_gs_key(v) > lo ? 1.0 : 0.0;
        }
        gt = block_sum(gt, sh);
        const uint32_t kk = lo;
        cut.id = first_cross(
            n,
            [&](int32_t t) {
                const float v = lg[t];
                return zi_gs_candidate(v) && zi_gs_key(v) == kk ? 1.0 : 0.0;
            },
            static_cast<double>(k) - gt, false, sh);
        cut.key = kk;
    }

    /* top_p over the renormalised top_k set */
    if (p.top_p < 1.0) {
        double z = 0.0;
        for (int32_t t = tid; t < n; t += kT) {
            const float v = lg[t];
            if (zi_gs_candidate(v) && zi_gs_in_cut(zi_gs_key(v), t, cut))
                z += zi_gs_weight(v, vmax, inv_t);
        }
        const double target = p.top_p * block_sum(z, sh);
        uint32_t lo = 0, hi = 0xffffffffu;
        while (lo < hi) {
            const uint32_t mid =
                lo + static_cast<uint32_t>((static_cast<uint64_t>(hi) - lo + 1) / 2);
            double s = 0.0;
            for (int32_t t = tid; t < n; t += kT) {
                const float v = lg[t];
                const uint32_t key = zi_gs_key(v);
                if (zi_gs_candidate(v) && zi_gs_in_cut(key, t, cut) && key >= mid)
                    s += zi_gs_weight(v, vmax, inv_t);
            }
            if (block_sum(s, sh) >= target)
                lo = mid;
            else
                hi = mid - 1;
        }
        const uint32_t kp = lo;
        double s_gt = 0.0, eq = 0.0;
        for (int32_t t = tid; t < n; t += kT) {
            const float v = lg[t];
            const uint32_t key = zi_gs_key(v);
            if (!zi_gs_candidate(v) || !zi_gs_in_cut(key, t, cut)) continue;
            if (key > kp) s_gt += zi_gs_weight(v, vmax, inv_t);
            eq += key == kp ? 1.0 : 0.0;
        }
        s_gt = block_sum(s_gt, sh);
        const int64_t n_eq = static_cast<int64_t>(block_sum(eq, sh));
        if (n_eq > 0) { /* else rounding left the whole set short of target: keep all */
            const double w = zi_gs_weight(zi_gs_unkey(kp), vmax, inv_t);
            const int64_t m = zi_gs_ties_needed(target, s_gt, w, n_eq);
            const zi_gpu_cut kcut = cut;
            cut.id = first_cross(
                n,
                [&](int32_t t) {
                    const float v = lg[t];
                    const uint32_t key = zi_gs_key(v);
                    return zi_gs_candidate(v) && zi_gs_in_cut(key, t, kcut) && key == kp ? 1.0
                                                                                         : 0.0;
                },
                static_cast<double>(m), false, sh);
            cut.key = kp;
        }
    }

    /* min_p, then the draw over the survivors in id order */
    const float thr = zi_gs_min_p_threshold(p.min_p);
    const zi_gpu_cut fcut = cut;
    auto weight_of = [&](int32_t t) -> double {
        const float v = lg[t];
        if (!zi_gs_candidate(v) || !zi_gs_in_cut(zi_gs_key(v), t, fcut)) return 0.0;
        const float w = zi_gs_weight(v, vmax, inv_t);
        return w >= thr && w > 0.0f ? static_cast<double>(w) : 0.0;
    };
    double zs = 0.0;
    int32_t last = -1;
    for (int32_t t = tid; t < n; t += kT) {
        const double w = weight_of(t);
        if (w > 0.0) zs += w, last = t;
    }
    zs = block_sum(zs, sh);
    last = block_max_int(last, sh);
    const double target = zi_gs_uniform(p.seed, p.step) * zs;
    int32_t tok = first_cross(n, weight_of, target, true, sh);
    if (tok < 0) tok = last; /* rounding left target at the very top */
    if (tid == 0) out[blockIdx.x] = tok;
}

} // namespace

struct zi_cuda_sampler {
    cudaStream_t stream;
    int device;
    int32_t n_vocab;
    int max_rows;
    size_t words; /* bitmask words per row: ceil(n_vocab / 32) */
    /* One call's parameters, entries and bitmasks, packed: pinned host and
     * device copies of stage_cap bytes, sent in one transfer. */
    unsigned char *h_stage, *d_stage;
    size_t stage_cap;
    float *d_work; /* [max_rows][n_vocab] rewritten rows (steps 1-4); on first need */
    int32_t *h_tokens, *d_tokens;
    zi_gpu_pen_scratch pen;
    zi_cuda_sample_row_full *full; /* [max_rows] plain rows converted */
    cudaEvent_t done;
    int pending, n_rows;
};

static int cuda_fail(zi_error *err, const char *what, cudaError_t e) {
    return zi_error_set(err, ZI_EIO, "GPU sampler: %s: %s: %s", what, cudaGetErrorName(e),
                        cudaGetErrorString(e));
}

static size_t align16(size_t x) {
    return (x + 15) & ~static_cast<size_t>(15);
}

/* Room for need bytes in both staging buffers (nothing is in flight). */
static int stage_reserve(zi_cuda_sampler *s, size_t need, zi_error *err) {
    if (need <= s->stage_cap) return ZI_OK;
    size_t cap = s->stage_cap * 2 > need ? s->stage_cap * 2 : need;
    cudaFreeHost(s->h_stage);
    cudaFree(s->d_stage);
    s->h_stage = s->d_stage = nullptr;
    s->stage_cap = 0;
    cudaError_t e = cudaMallocHost(reinterpret_cast<void **>(&s->h_stage), cap);
    if (e != cudaSuccess) return cuda_fail(err, "cudaMallocHost (staging)", e);
    e = cudaMalloc(reinterpret_cast<void **>(&s->d_stage), cap);
    if (e != cudaSuccess) {
        cudaFreeHost(s->h_stage);
        s->h_stage = nullptr;
        return cuda_fail(err, "cudaMalloc (staging)", e);
    }
    s->stage_cap = cap;
    return ZI_OK;
}

extern "C" int zi_cuda_sampler_create(zi_backend *be, int32_t n_vocab, int max_rows,
                                      zi_cuda_sampler **out, zi_error *err) {
    if (!be || !out || !be->ops || strcmp(be->ops->name, "cuda") != 0)
        return zi_error_set(err, ZI_EINVAL, "GPU sampler: needs a CUDA backend");
    if (n_vocab < 1 || n_vocab > (1 << 28) || max_rows < 1 || max_rows > 65535)
        return zi_error_set(err, ZI_EINVAL, "GPU sampler: n_vocab %d or max_rows %d out of range",
                            (int)n_vocab, max_rows);
    *out = NULL;
    zi_cuda_sampler *s = static_cast<zi_cuda_sampler *>(calloc(1, sizeof *s));
    if (!s) return zi_error_set(err, ZI_ENOMEM, "GPU sampler: out of memory");
    s->stream = static_cast<cudaStream_t>(zi_cuda_backend_stream(be));
    s->device = zi_cuda_backend_device(be);
    s->n_vocab = n_vocab;
    s->max_rows = max_rows;
    s->words = (static_cast<size_t>(n_vocab) + 31) / 32;
    int rc = zi_gpu_pen_scratch_init(&s->pen, n_vocab, err);
    if (rc) {
        free(s);
        return rc;
    }
    s->full = static_cast<zi_cuda_sample_row_full *>(calloc(max_rows, sizeof *s->full));
    if (!s->full) {
        zi_cuda_sampler_free(s);
        return zi_error_set(err, ZI_ENOMEM, "GPU sampler: out of memory");
    }
    cudaError_t e = cudaSetDevice(s->device);
    const char *what = "cudaSetDevice";
    if (e == cudaSuccess) {
        what = "cudaMallocHost";
        e = cudaMallocHost(reinterpret_cast<void **>(&s->h_tokens), sizeof(int32_t) * max_rows);
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc";
        e = cudaMalloc(reinterpret_cast<void **>(&s->d_tokens), sizeof(int32_t) * max_rows);
    }
    if (e == cudaSuccess) {
        what = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming);
    }
    if (e != cudaSuccess) {
        rc = cuda_fail(err, what, e);
        zi_cuda_sampler_free(s);
        return rc;
    }
    /* parameters for max_rows rows and some history: most calls never grow it */
    if ((rc = stage_reserve(s, align16(sizeof(zi_gpu_sample_params) * max_rows) + (64u << 10),
                            err))) {
        zi_cuda_sampler_free(s);
        return rc;
    }
    *out = s;
    return ZI_OK;
}

extern "C" void zi_cuda_sampler_free(zi_cuda_sampler *s) {
    if (!s) return;
    if (s->pending) cudaEventSynchronize(s->done);
    if (s->done) cudaEventDestroy(s->done);
    cudaFree(s->d_stage);
    cudaFree(s->d_work);
    cudaFree(s->d_tokens);
    cudaFreeHost(s->h_stage);
    cudaFreeHost(s->h_tokens);
    zi_gpu_pen_scratch_free(&s->pen);
    free(s->full);
    free(s);
}

/* What a row puts in the staging buffer, at most (entries before dedup). */
static size_t row_entries_max(const zi_cuda_sample_row_full *r) {
    return r->n_prompt + r->n_generated + r->n_eos_forbid;
}

extern "C" int zi_cuda_sampler_sample_full_async(zi_cuda_sampler *s, const float *d_logits,
                                                 size_t ld, const zi_cuda_sample_row_full *rows,
                                                 int n_rows, zi_error *err) {
    if (s) s->n_rows = 0; /* until this call is queued: a wait after a failure finds nothing */
    if (!s || !d_logits || !rows || n_rows < 1 || n_rows > s->max_rows ||
        ld < static_cast<size_t>(s->n_vocab))
        return zi_error_set(err, ZI_EINVAL,
                            "GPU sampler: bad arguments (%d rows of at most %d, ld %zu < n_vocab "
                            "%d, or NULL)",
                            n_rows, s ? s->max_rows : 0, ld, s ? (int)s->n_vocab : 0);
    /* the pinned buffers may still feed the previous call's copies */
    if (s->pending) {
        cudaError_t e = cudaEventSynchronize(s->done);
        if (e != cudaSuccess) return cuda_fail(err, "cudaEventSynchronize", e);
        s->pending = 0;
    }
    /* the layout of this call's staging: parameters, entries, bitmasks */
    size_t max_ent = 0, n_masks = 0;
    for (int r = 0; r < n_rows; r++) {
        if (!rows[r].params)
            return zi_error_set(err, ZI_EINVAL, "GPU sampler: row %d: params is NULL", r);
        max_ent += row_entries_max(&rows[r]);
        n_masks += rows[r].bitmask != NULL;
    }
    if (max_ent > UINT32_MAX)
        return zi_error_set(err, ZI_EINVAL, "GPU sampler: %zu history entries in one call",
                            max_ent);
    const size_t off_ent = align16(sizeof(zi_gpu_sample_params) * n_rows);
    const size_t off_mask = align16(off_ent + sizeof(zi_gpu_pen) * max_ent);
    int rc = stage_reserve(s, off_mask + sizeof(uint32_t) * s->words * n_masks, err);
    if (rc) return rc;
    zi_gpu_sample_params *hp = reinterpret_cast<zi_gpu_sample_params *>(s->h_stage);
    zi_gpu_pen *he = reinterpret_cast<zi_gpu_pen *>(s->h_stage + off_ent);
    uint32_t *hm = reinterpret_cast<uint32_t *>(s->h_stage + off_mask);
    uint32_t n_ent = 0;
    int32_t mask_rows = 0;
    int any_prep = 0;
    for (int r = 0; r < n_rows; r++) {
        const zi_cuda_sample_row_full *row = &rows[r];
        zi_gpu_sample_params *p = &hp[r];
        if ((rc = zi_gpu_sample_params_set(p, row->params, row->step, err))) {
            zi_error_prefix(err, "row %d", r);
            return rc;
        }
        if ((p->flags & (ZI_GS_REP | ZI_GS_FP)) && !row->prompt_ids && !row->generated_ids)
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "GPU sampler: row %d asks for penalties but carries no token "
                                "history (prompt_ids and generated_ids are NULL)",
                                r);
        p->src = row->logits;
        uint32_t k = 0;
        rc = zi_gpu_pen_build(&s->pen, p, row->prompt_ids, row->n_prompt, row->generated_ids,
                              row->n_generated, row->eos_forbid, row->n_eos_forbid, he + n_ent, &k,
                              err);
        if (rc) {
            zi_error_prefix(err, "row %d", r);
            return rc;
        }
        p->ent_off = n_ent;
        p->n_ent = k;
        n_ent += k;
        if (row->bitmask) {
            memcpy(hm + static_cast<size_t>(mask_rows) * s->words, row->bitmask,
                   sizeof(uint32_t) * s->words);
            p->mask_row = mask_rows++;
        }
        if (k > 0 || row->bitmask) p->flags |= ZI_GS_PREP, any_prep = 1;
    }
    cudaError_t e;
    if (any_prep && !s->d_work) {
        e = cudaMalloc(reinterpret_cast<void **>(&s->d_work),
                       sizeof(float) * static_cast<size_t>(s->n_vocab) * s->max_rows);
        if (e != cudaSuccess) {
            s->d_work = nullptr;
            return cuda_fail(err, "cudaMalloc (rewritten rows)", e);
        }
    }
    /* one transfer: the used prefix of each section (the layout keeps offsets) */
    const size_t bytes = mask_rows > 0 ? off_mask + sizeof(uint32_t) * s->words * mask_rows
                                       : off_ent + sizeof(zi_gpu_pen) * n_ent;
    e = cudaMemcpyAsync(s->d_stage, s->h_stage, bytes, cudaMemcpyHostToDevice, s->stream);
    if (e != cudaSuccess) return cuda_fail(err, "cudaMemcpyAsync (parameters)", e);
    const zi_gpu_sample_params *dp = reinterpret_cast<const zi_gpu_sample_params *>(s->d_stage);
    if (any_prep) {
        prep_kernel<<<n_rows, kT, 0, s->stream>>>(
            d_logits, ld, s->d_work, s->n_vocab, dp,
            reinterpret_cast<const zi_gpu_pen *>(s->d_stage + off_ent),
            reinterpret_cast<const uint32_t *>(s->d_stage + off_mask), s->words);
        if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail(err, "prep_kernel launch", e);
    }
    sample_kernel<<<n_rows, kT, 0, s->stream>>>(d_logits, ld, s->d_work, s->n_vocab, dp,
                                                s->d_tokens);
    if ((e = cudaGetLastError()) != cudaSuccess) return cuda_fail(err, "sample_kernel launch", e);
    e = cudaMemcpyAsync(s->h_tokens, s->d_tokens, sizeof(int32_t) * n_rows, cudaMemcpyDeviceToHost,
                        s->stream);
    if (e != cudaSuccess) return cuda_fail(err, "cudaMemcpyAsync (tokens)", e);
    if ((e = cudaEventRecord(s->done, s->stream)) != cudaSuccess)
        return cuda_fail(err, "cudaEventRecord", e);
    s->pending = 1;
    s->n_rows = n_rows;
    return ZI_OK;
}

extern "C" int zi_cuda_sampler_sample_async(zi_cuda_sampler *s, const float *d_logits, size_t ld,
                                            const zi_cuda_sample_row *rows, int n_rows,
                                            zi_error *err) {
    if (!s || !rows || n_rows < 1 || n_rows > s->max_rows)
        return zi_cuda_sampler_sample_full_async(s, d_logits, ld, nullptr, n_rows, err);
    for (int r = 0; r < n_rows; r++) {
        memset(&s->full[r], 0, sizeof s->full[r]);
        s->full[r].params = rows[r].params;
        s->full[r].step = rows[r].step;
    }
    return zi_cuda_sampler_sample_full_async(s, d_logits, ld, s->full, n_rows, err);
}

extern "C" int zi_cuda_sampler_ready(zi_cuda_sampler *s) {
    return s && (!s->pending || cudaEventQuery(s->done) == cudaSuccess);
}

extern "C" int zi_cuda_sampler_wait(zi_cuda_sampler *s, const int32_t **tokens, zi_error *err) {
    if (!s || !tokens) return zi_error_set(err, ZI_EINVAL, "GPU sampler: NULL sampler or tokens");
    if (!s->n_rows) return zi_error_set(err, ZI_EINVAL, "GPU sampler: nothing was queued");
    if (s->pending) {
        cudaError_t e = cudaEventSynchronize(s->done);
        if (e != cudaSuccess) return cuda_fail(err, "cudaEventSynchronize", e);
        s->pending = 0;
    }
    *tokens = s->h_tokens;
    for (int r = 0; r < s->n_rows; r++)
        if (s->h_tokens[r] < 0)
            return zi_error_set(err, ZI_ERANGE,
                                "GPU sampler: row %d: no eligible token (all logits -inf/NaN or "
                                "masked)",
                                r);
    return ZI_OK;
}
