/*
 * cuda_backend.c - see cuda_backend.h. The host side of the CUDA backend,
 * in C: the op table, device memory, metadata staging, cuBLAS (loaded with
 * dlopen), and the calls to the kernel launchers of cuda_kernels.h.
 *
 * Every op queues on c->stream and returns. The first CUDA error an op sees
 * is kept in c->status / c->err (zi_cuda_backend_status); after it, ops do
 * nothing, since a failed launch usually means a lost context.
 */
#include "cuda_backend.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "cuda_audio.h"
#include "cuda_kernels.h"
#include "cuda_recurrent.h"
#include "cuda_vision.h"
#include "gguf.h"
#include "quant.h"
#include "tp.h"
#include "weights.h"

/* The product of this weight is summed over tensor-parallel ranks
 * (a column-split weight, tp.h); the data is in the file's layout. */
#define ZI_CUDA_LAYOUT_ALLREDUCE 0x100
/* No fp16 copy will be made of this weight (the policy said no once). */
#define ZI_CUDA_LAYOUT_NO_F16 0x200
/* zi_weight.aux is matmul_tile's float32 copy of the weight, not an fp16
 * one (made by weight_prepare_tile; no fp16 copy is made then). */
#define ZI_CUDA_LAYOUT_TILE_F32 0x400

/* cuBLAS's workspace, set explicitly so cuBLAS never allocates inside a
 * graph capture (32 MiB is NVIDIA's recommendation for Hopper). */
#define ZI_CUBLAS_WORKSPACE (32u << 20)

/* Scratch for split attention (partial softmax states), in floats. */
#define ZI_ATTN_SCRATCH_FLOATS ((size_t)4 << 20)

/* The attention split (cuda_attention): positions per split at least, and
 * the blocks of 4 warps per multiprocessor it aims for (16 fill one). */
#define ZI_ATTN_MIN_CHUNK 32
#define ZI_ATTN_BLOCKS_PER_SM 16

/* Host arrays the ops receive, staged to the device: token ids, positions,
 * sequence rows, and the rows of the block tables the pass reads; a hybrid's
 * state slots (one a token) and gather_rows' row indices, in two slots
 * used in turn: qwen35's layers gather with two index arrays one after the
 * other, and each slot then keeps one of them (no copy after the first
 * layer, no wait on the previous copy's event); attention's win_pos
 * (zi_batch_view: an image's tokens); weighted_sum_rows' row
 * indices and weights (the float bits as int32); span_attention's order,
 * starts and tiles, one array. reserve() sizes the slots up to
 * META_WINPOS; the block-table, gather, weighted-sum and span slots grow
 * on first use (never during a capture). */
enum {
    META_IDS,
    META_POS,
    META_SEQ,
    META_SLOT,
    META_WINPOS,
    META_TAB,
    META_GATHER,
    META_GATHER2,
    META_WSUM_IDX,
    META_WSUM_W,
    META_SPAN,
    META_N
};

typedef struct stage_slot {
    int32_t *h, *d; /* pinned staging, device copy */
    size_t cap;     /* entries */
    int64_t n;      /* entries staged, -1 for none */
    cudaEvent_t ev; /* marks the last copy out of h */
    /* Graph capture (zi_cuda_graph_capture): the capture that last copied
     * this slot, how many copies it captured and of how many entries. */
    uint64_t cap_epoch;
    int cap_copies;
    int64_t cap_n;
} stage_slot;

/* cuBLAS, loaded on first use. */
static struct {
    pthread_once_t once;
    void *lib;
    char why[256];
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                              const void *, const void *, cudaDataType, int, const void *,
                              cudaDataType, int, const void *, void *, cudaDataType, int,
                              cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_string)(cublasStatus_t); /* optional */
} blas = {.once = PTHREAD_ONCE_INIT};

typedef struct cuda_backend {
    zi_backend base;
    int device;
    int sms; /* multiprocessors, for the attention split */
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    zi_tp *tp, *own_tp;      /* own_tp: the one-rank communicator made when none was given */
    stage_slot meta[META_N]; /* per-pass metadata */
    int gather_turn;         /* gather_rows' next slot: META_GATHER or, 1, META_GATHER2 */
    /* fp16 operands of the cuBLAS path */
    void *w16, *x16;
    size_t w16_cap, x16_cap; /* halves */
    size_t max_w16;          /* largest weight that needs converting, in elements */
    float *attn_scratch;
    /* the lora op's per-token rows (host, then their device copy) and its
     * c = scale * A x rows */
    zi_cuda_lora_row *lora_h, *lora_d;
    size_t lora_cap; /* rows */
    float *lora_c;
    size_t lora_c_cap;      /* floats */
    int32_t *span_h;        /* span_attention's order, starts and tiles, host side */
    size_t span_cap;        /* entries */
    int f16_weights;        /* zi_cuda_options.f16_weights */
    size_t f16_bytes;       /* held in fp16 weight copies */
    uint64_t capture_epoch; /* counts captures; nonzero while capturing */
    uint64_t free_epoch;    /* counts frees of device or staging memory (dev_free) */
    int capturing;
    int status;
    zi_error err;
} cuda_backend;

static cuda_backend *cb(zi_backend *be) {
    return (cuda_backend *)be;
}
static cudaError_t stage_grow(cuda_backend *c, int slot, size_t want);

/* Records the first failure; returns 1 when the op must stop. */
static int failed(cuda_backend *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return c->status != ZI_OK;
    if (c->status == ZI_OK)
        c->status = zi_error_set(&c->err, ZI_EIO, "CUDA device %d: %s: %s: %s", c->device, what,
                                 cudaGetErrorName(e), cudaGetErrorString(e));
    return 1;
}

static void fail_msg(cuda_backend *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_msg(cuda_backend *c, int code, const char *fmt, ...) {
    if (c->status != ZI_OK) return;
    char msg[ZI_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->status = zi_error_set(&c->err, code, "CUDA device %d: %s", c->device, msg);
}

/* ---- cuBLAS through dlopen ---- */

/* dlsym's void * into a function pointer, without the ISO C cast. */
static int sym(void *lib, const char *name, void *fn_ptr, size_t fn_size) {
    void *p = dlsym(lib, name);
    if (!p) return 0;
    memcpy(fn_ptr, &p, fn_size);
    return 1;
}

#define ZI_STR2(x) #x
#define ZI_STR(x) ZI_STR2(x)

static void blas_load(void) {
    /* the soname of the cuBLAS these headers describe, then any */
    const char *names[] = {"libcublas.so." ZI_STR(CUBLAS_VER_MAJOR), "libcublas.so"};
    for (size_t i = 0; i < 2 && !blas.lib; i++) blas.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!blas.lib) {
        const char *e = dlerror();
        snprintf(blas.why, sizeof blas.why, "cannot load %s: %s", names[0], e ? e : "not found");
        return;
    }
#define ZI_SYM(field, name)                                                                        \
    if (!sym(blas.lib, name, &blas.field, sizeof blas.field)) {                                    \
        snprintf(blas.why, sizeof blas.why, "%s has no symbol %s", names[0], name);                \
        dlclose(blas.lib);                                                                         \
        blas.lib = NULL;                                                                           \
        return;                                                                                    \
    }
    ZI_SYM(create, "cublasCreate_v2")
    ZI_SYM(destroy, "cublasDestroy_v2")
    ZI_SYM(set_stream, "cublasSetStream_v2")
    ZI_SYM(set_workspace, "cublasSetWorkspace_v2")
    ZI_SYM(gemm_ex, "cublasGemmEx")
#undef ZI_SYM
    sym(blas.lib, "cublasGetStatusString", &blas.status_string, sizeof blas.status_string);
}

static const char *blas_status(cublasStatus_t s) {
    static const char unknown[] = "cuBLAS error";
    return blas.status_string ? blas.status_string(s) : unknown;
}

/* ---- device queries ---- */

int zi_cuda_device_count(int *n, zi_error *err) {
    int count = 0;
    *n = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    (void)cudaGetLastError(); /* reported here: it must not reach a later launch check */
    if (e != cudaSuccess)
        return zi_error_set(err, ZI_EUNSUPPORTED, "cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                            cudaGetErrorString(e));
    if (count <= 0) return zi_error_set(err, ZI_EUNSUPPORTED, "cudaGetDeviceCount: no CUDA device");
    *n = count;
    return ZI_OK;
}

int zi_cuda_device_name(int dev, char *buf, size_t cap, zi_error *err) {
    struct cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, dev);
    (void)cudaGetLastError();
    if (e != cudaSuccess)
        return zi_error_set(err, ZI_EUNSUPPORTED, "cudaGetDeviceProperties(%d): %s: %s", dev,
                            cudaGetErrorName(e), cudaGetErrorString(e));
    snprintf(buf, cap, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
             (double)p.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
    return ZI_OK;
}

/* Frees device memory (cudaFree waits for the device: no queued op still
 * uses it). A captured graph may hold the address, so the free is counted:
 * zi_cuda_graph_stale then says the graph must not be replayed. */
static void dev_free(cuda_backend *c, void *p) {
    if (!p) return;
    cudaFree(p);
    c->free_epoch++;
}

/* ---- weights ---- */

static int cuda_weight_init(zi_backend *be, zi_weight *w, const zi_gguf_tensor *t, zi_error *err) {
    cuda_backend *c = cb(be);
    int rc = zi_weight_describe(t, w, err);
    if (rc) return rc;
    /* The device kernels (cuda_kernels.cu) take every type the GGUF reader
     * accepts; a new reader type is refused here until they do. */
    switch (w->type) {
    case ZI_TYPE_F32:
    case ZI_TYPE_F16:
    case ZI_TYPE_BF16:
    case ZI_TYPE_Q4_0:
    case ZI_TYPE_Q4_1:
    case ZI_TYPE_Q5_0:
    case ZI_TYPE_Q5_1:
    case ZI_TYPE_Q8_0:
    case ZI_TYPE_Q2_K:
    case ZI_TYPE_Q3_K:
    case ZI_TYPE_Q4_K:
    case ZI_TYPE_Q5_K:
    case ZI_TYPE_Q6_K:
    case ZI_TYPE_IQ4_NL:
    case ZI_TYPE_IQ4_XS:
    case ZI_TYPE_MXFP4:
        break;
    default:
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tensor '%.*s' has type %s, which the CUDA backend does not support "
                            "yet (--device cpu does)",
                            (int)t->name.len, t->name.ptr, zi_ggml_type_name(w->type));
    }
    /* cuBLAS takes int dimensions */
    if (t->ne[0] > INT32_MAX || t->ne[1] > INT32_MAX)
        return zi_error_set(err, ZI_ERANGE, "tensor '%.*s' is too large (%lld x %lld)",
                            (int)t->name.len, t->name.ptr, (long long)t->ne[1],
                            (long long)t->ne[0]);
    size_t bytes = w->row_bytes * (size_t)w->rows;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, bytes ? bytes : 1);
    if (e == cudaSuccess) e = cudaMemcpy(d, t->data, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(d);
        (void)cudaGetLastError(); /* reported here, not by the next launch check */
        return zi_error_set(
            err, ZI_ENOMEM, "CUDA device %d: uploading tensor '%.*s' (%.1f MiB): %s", c->device,
            (int)t->name.len, t->name.ptr, bytes / 1048576.0, cudaGetErrorString(e));
    }
    /* kept on the device in the file's encoding; get_rows reads the same copy */
    w->data = w->file_data = w->owned = d;
    if (zi_tp_split_for_tensor(t->name.ptr, (size_t)t->name.len) == ZI_TP_SPLIT_COLS)
        w->layout = ZI_CUDA_LAYOUT_ALLREDUCE;
    /* the dequantizing scratch fits the largest product's weight: a 3-D
     * tensor of experts multiplies only through its views (weight_view) */
    if (w->type != ZI_TYPE_F16 && w->type != ZI_TYPE_F32 && t->ne[2] <= 1) {
        size_t elems = (size_t)w->rows * (size_t)w->cols;
        if (elems > c->max_w16) c->max_w16 = elems;
    }
    return ZI_OK;
}

static void cuda_weight_free(zi_backend *be, zi_weight *w) {
    cuda_backend *c = cb(be);
    dev_free(c, w->owned);
    w->owned = NULL;
    if (w->aux) {
        dev_free(c, w->aux);
        if (!(w->layout & ZI_CUDA_LAYOUT_TILE_F32))
            c->f16_bytes -= (size_t)w->rows * (size_t)w->cols * 2;
    }
    w->aux = NULL;
}

static float *cuda_vector_init(zi_backend *be, const zi_gguf_tensor *t, zi_error *err) {
    cuda_backend *c = cb(be);
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    float *h = zi_vector_dequantize(t, err);
    if (!h) return NULL;
    void *d = NULL;
    cudaError_t e = cudaMalloc(&d, (size_t)n * sizeof(float));
    if (e == cudaSuccess) e = cudaMemcpy(d, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    if (e != cudaSuccess) {
        cudaFree(d);
        (void)cudaGetLastError();
        zi_error_set(err, ZI_ENOMEM, "CUDA device %d: uploading tensor '%.*s': %s", c->device,
                     (int)t->name.len, t->name.ptr, cudaGetErrorString(e));
        return NULL;
    }
    return d;
}

/* ---- memory ---- */

/* Grows a device buffer to `bytes` (contents dropped). */
static cudaError_t grow(cuda_backend *c, void **p, size_t *cap, size_t want, size_t elem) {
    if (want <= *cap) return cudaSuccess;
    dev_free(c, *p);
    *p = NULL;
    *cap = 0;
    cudaError_t e = cudaMalloc(p, want * elem);
    if (e == cudaSuccess) *cap = want;
    return e;
}

static int cuda_reserve(zi_backend *be, int n_tokens, int64_t max_cols, int ctx, zi_error *err) {
    cuda_backend *c = cb(be);
    (void)ctx; /* attention reads the cache in place: nothing per position */
    if (c->status) {
        if (err) *err = c->err;
        return c->status;
    }
    cudaError_t e = cudaSetDevice(c->device);
    const char *what = "cudaSetDevice";
    for (int i = META_IDS; i <= META_WINPOS && e == cudaSuccess; i++) {
        what = "staging buffers";
        e = stage_grow(c, i, (size_t)n_tokens);
    }
    if (e == cudaSuccess && n_tokens > ZI_CUDA_MMV_MAX_TOKENS) {
        what = "cudaMalloc (fp16 operands)";
        e = grow(c, &c->x16, &c->x16_cap, (size_t)n_tokens * (size_t)max_cols, 2);
        if (e == cudaSuccess) e = grow(c, &c->w16, &c->w16_cap, c->max_w16, 2);
    }
    if (e == cudaSuccess && !c->attn_scratch) {
        what = "cudaMalloc (attention scratch)";
        e = cudaMalloc((void **)&c->attn_scratch, ZI_ATTN_SCRATCH_FLOATS * sizeof(float));
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zi_error_set(err, ZI_ENOMEM, "CUDA device %d: reserving for %d tokens: %s: %s",
                            c->device, n_tokens, what, cudaGetErrorString(e));
    }
    return ZI_OK;
}

static void *cuda_alloc(zi_backend *be, size_t bytes) {
    cuda_backend *c = cb(be);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* the NULL reports it; keep it from later launch checks */
        return NULL;
    }
    /* zeroed, in stream order: every later op sees the zeros */
    if (cudaMemsetAsync(p, 0, bytes ? bytes : 1, c->stream) != cudaSuccess) {
        cudaFree(p);
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_free(zi_backend *be, void *p) {
    dev_free(cb(be), p);
}

/* Both copies wait for the stream: the host may reuse or read its buffer as
 * soon as the call returns, pinned or not. */
static void cuda_upload(zi_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_backend *c = cb(be);
    if (c->status || !bytes) return;
    if (failed(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream), "upload"))
        return;
    failed(c, cudaStreamSynchronize(c->stream), "upload (synchronize)");
}

static void cuda_download(zi_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_backend *c = cb(be);
    if (c->status || !bytes) return;
    if (failed(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream), "download"))
        return;
    failed(c, cudaStreamSynchronize(c->stream), "download (synchronize)");
}

static int cuda_sync(zi_backend *be, zi_error *err) {
    cuda_backend *c = cb(be);
    failed(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize");
    return zi_cuda_backend_status(be, err);
}

/* Grows a staging slot to `want` entries (contents dropped). */
static cudaError_t stage_grow(cuda_backend *c, int slot, size_t want) {
    stage_slot *m = &c->meta[slot];
    if (want <= m->cap) return cudaSuccess;
    /* the old buffers may still feed queued copies and kernels */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    cudaFreeHost(m->h); /* a graph's copies read it: counted as dev_free's are */
    dev_free(c, m->d);
    m->h = m->d = NULL;
    m->cap = 0;
    m->n = -1;
    want += want / 4; /* tables grow with the batch: leave room */
    if (e == cudaSuccess) e = cudaMallocHost((void **)&m->h, want * sizeof(int32_t));
    if (e == cudaSuccess) e = cudaMalloc((void **)&m->d, want * sizeof(int32_t));
    if (e == cudaSuccess) m->cap = want;
    return e;
}

/*
 * The device copy of a host metadata array. Ops of one pass pass the same
 * arrays again and again, so the copy is skipped when the slot already
 * holds these contents. Rewriting the pinned slot first waits for its
 * previous copy to have left (an event), which has normally long happened:
 * the previous pass ended with sync(). Only the block-table slot may grow
 * here (its size is not known at reserve); that happens on the first pass
 * reading more table than any before, never during a graph capture.
 */
static const int32_t *stage(cuda_backend *c, int slot, const int32_t *src, size_t n) {
    stage_slot *m = &c->meta[slot];
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (failed(c, cudaStreamIsCapturing(c->stream, &cap), "cudaStreamIsCapturing")) return NULL;
    if (n > m->cap) {
        if ((slot != META_TAB && slot != META_GATHER && slot != META_GATHER2 &&
             slot != META_WSUM_IDX && slot != META_WSUM_W && slot != META_SPAN) ||
            cap != cudaStreamCaptureStatusNone) {
            fail_msg(c, ZI_EINVAL,
                     "a batch needs %zu metadata entries, but reserve() made room "
                     "for %zu%s",
                     n, m->cap,
                     cap != cudaStreamCaptureStatusNone
                         ? " (run a pass of this size before capturing a graph)"
                         : "");
            return NULL;
        }
        if (failed(c, stage_grow(c, slot, n), "growing the block-table, gather or span staging"))
            return NULL;
    }
    /* A capture must copy each slot once, whatever the slot held before:
     * the graph's copy is what brings a replay's metadata to the device. */
    int captured_here = c->capturing && m->cap_epoch == c->capture_epoch;
    if ((!c->capturing || captured_here) && m->n == (int64_t)n &&
        memcmp(m->h, src, n * sizeof *src) == 0)
        return m->d;
    if (c->capturing) {
        m->cap_copies = captured_here ? m->cap_copies + 1 : 1;
        m->cap_epoch = c->capture_epoch;
        m->cap_n = (int64_t)n;
    }
    /* while capturing nothing runs; the graph's copy reads the staging at replay */
    if (cap == cudaStreamCaptureStatusNone && m->n >= 0 &&
        failed(c, cudaEventSynchronize(m->ev), "cudaEventSynchronize (staging)"))
        return NULL;
    memcpy(m->h, src, n * sizeof *src);
    m->n = (int64_t)n;
    if (failed(c, cudaMemcpyAsync(m->d, m->h, n * sizeof *src, cudaMemcpyHostToDevice, c->stream),
               "cudaMemcpyAsync (batch metadata)"))
        return NULL;
    if (cap == cudaStreamCaptureStatusNone &&
        failed(c, cudaEventRecord(m->ev, c->stream), "cudaEventRecord"))
        return NULL;
    return m->d;
}

/* The device copies of a view's positions, sequence rows and the block
 * table rows they use (rows 0..max seq, a prefix of the host table), after
 * checking on the host, where the arrays are, that every position is inside
 * its table and the context: a bad batch fails with a message, not a
 * device fault. *max_len gets the longest attention span. */
static int stage_view(cuda_backend *c, const zi_batch_view *b, const zi_attn_shape *s,
                      const int32_t **pos, const int32_t **seq, const int32_t **tab, int *max_len) {
    if (!b->block_tables || b->table_stride < 1 || s->block_size < 1) {
        fail_msg(c, ZI_EINVAL, "attention needs block tables (stride %d, block size %d)",
                 b->table_stride, s->block_size);
        return 0;
    }
    int mx = 0, max_seq = 0;
    int64_t limit = (int64_t)b->table_stride * s->block_size;
    if (s->max_ctx < limit) limit = s->max_ctx;
    for (int i = 0; i < b->n_tokens; i++) {
        if (b->pos[i] < 0 || b->pos[i] >= limit || b->seq[i] < 0) {
            fail_msg(c, ZI_ERANGE, "token %d: position %d of sequence %d is outside 0..%lld", i,
                     b->pos[i], b->seq[i], (long long)limit - 1);
            return 0;
        }
        if (b->pos[i] + 1 > mx) mx = b->pos[i] + 1;
        if (b->seq[i] > max_seq) max_seq = b->seq[i];
    }
    *max_len = mx;
    *pos = stage(c, META_POS, b->pos, (size_t)b->n_tokens);
    *seq = *pos ? stage(c, META_SEQ, b->seq, (size_t)b->n_tokens) : NULL;
    *tab =
        *seq ? stage(c, META_TAB, b->block_tables, ((size_t)max_seq + 1) * (size_t)b->table_stride)
             : NULL;
    return *tab != NULL;
}

/* ---- matmul ---- */

static cublasStatus_t gemm(cuda_backend *c, const zi_weight *w, const void *a, cudaDataType at,
                           const void *x, cudaDataType xt, float *y, int n_tokens) {
    const float one = 1.0f, zero = 0.0f;
    /* row-major Y[n][rows] = X[n][cols] W^T is column-major Y^T = W^T(T) X^T */
    return blas.gemm_ex(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, n_tokens, (int)w->cols,
                        &one, a, at, (int)w->cols, x, xt, (int)w->cols, &zero, y, CUDA_R_32F,
                        (int)w->rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static void mmv_chunks(cuda_backend *c, float *y, const zi_weight *w, const float *x,
                       int n_tokens) {
    for (int t0 = 0; t0 < n_tokens; t0 += ZI_CUDA_MMV_MAX_TOKENS) {
        int nt = n_tokens - t0 < ZI_CUDA_MMV_MAX_TOKENS ? n_tokens - t0 : ZI_CUDA_MMV_MAX_TOKENS;
        cudaError_t e =
            zi_cuda_mmv(w->type, w->data, w->row_bytes, w->rows, w->cols, x + (size_t)t0 * w->cols,
                        y + (size_t)t0 * w->rows, nt, c->stream);
        if (failed(c, e, "matrix-vector kernel")) return;
    }
}

/*
 * The weight in fp16 for cuBLAS, made on its first large product (not
 * during a graph capture, where nothing may allocate: a warm-up pass of
 * the captured shape has made it by then) when zi_cuda_options allows;
 * NULL: dequantize per product. The copy is the backend's derived state
 * (zi_weight.aux), hence the cast.
 */
static const void *f16_copy(cuda_backend *c, const zi_weight *cw) {
    zi_weight *w = (zi_weight *)cw;
    if (w->layout & ZI_CUDA_LAYOUT_TILE_F32) return NULL; /* aux is float32 */
    if (w->aux) return w->aux;
    if (c->f16_weights < 0 || (w->layout & ZI_CUDA_LAYOUT_NO_F16)) return NULL;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess ||
        cap != cudaStreamCaptureStatusNone)
        return NULL;
    size_t bytes = (size_t)w->rows * (size_t)w->cols * 2, free_b = 0, total_b = 0;
    if (c->f16_weights == 0 && (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess ||
                                free_b < bytes + ZI_CUDA_F16_HEADROOM)) {
        (void)cudaGetLastError();
        w->layout |= ZI_CUDA_LAYOUT_NO_F16;
        return NULL;
    }
    void *p = NULL;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        (void)cudaGetLastError(); /* no copy: the per-product path still works */
        w->layout |= ZI_CUDA_LAYOUT_NO_F16;
        return NULL;
    }
    if (failed(c, zi_cuda_to_f16(w->type, w->data, w->row_bytes, w->rows, w->cols, p, c->stream),
               "dequantize to f16 (weight copy)")) {
        cudaFree(p);
        return NULL;
    }
    w->aux = p;
    c->f16_bytes += bytes;
    return p;
}

static void cuda_matmul_n(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                          const float *x, int n_tokens) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    int64_t cols = ws[0]->cols;
    size_t x_elems = (size_t)n_tokens * (size_t)cols;
    int x16_done = 0;
    for (int i = 0; i < n && !c->status; i++) {
        const zi_weight *w = ws[i];
        if (n_tokens <= ZI_CUDA_MMV_MAX_TOKENS) {
            mmv_chunks(c, ys[i], w, x, n_tokens);
        } else if (w->type == ZI_TYPE_F32) {
            cublasStatus_t s = gemm(c, w, w->data, CUDA_R_32F, x, CUDA_R_32F, ys[i], n_tokens);
            if (s != CUBLAS_STATUS_SUCCESS)
                fail_msg(c, ZI_EIO, "cublasGemmEx (f32, %lld x %lld, %d tokens): %s",
                         (long long)w->rows, (long long)w->cols, n_tokens, blas_status(s));
        } else {
            const void *a = w->type == ZI_TYPE_F16 ? w->data : f16_copy(c, w);
            if (x_elems > c->x16_cap ||
                (!a && (size_t)w->rows * (size_t)w->cols > c->w16_cap)) {
                /* scratch too small (a weight loaded after reserve): the
                 * matrix-vector kernel in chunks is slower but needs none */
                mmv_chunks(c, ys[i], w, x, n_tokens);
            } else {
                if (!x16_done) { /* one conversion of x serves every product */
                    if (failed(c, zi_cuda_f32_to_f16(x, c->x16, x_elems, c->stream),
                               "f32 -> f16"))
                        return;
                    x16_done = 1;
                }
                if (!a) {
                    if (failed(c,
                               zi_cuda_to_f16(w->type, w->data, w->row_bytes, w->rows, w->cols,
                                              c->w16, c->stream),
                               "dequantize to f16"))
                        return;
                    a = c->w16; /* reused by the next product: stream order protects it */
                }
                cublasStatus_t s = gemm(c, w, a, CUDA_R_16F, c->x16, CUDA_R_16F, ys[i], n_tokens);
                if (s != CUBLAS_STATUS_SUCCESS)
                    fail_msg(c, ZI_EIO, "cublasGemmEx (f16, %lld x %lld, %d tokens): %s",
                             (long long)w->rows, (long long)w->cols, n_tokens, blas_status(s));
            }
        }
        if (!c->status && (w->layout & ZI_CUDA_LAYOUT_ALLREDUCE)) {
            zi_error e = {0};
            if (zi_tp_all_reduce_sum(c->tp, ys[i], (size_t)n_tokens * (size_t)w->rows, c->stream,
                                     &e))
                fail_msg(c, e.code, "%s", e.msg);
        }
    }
}

static void cuda_matmul(zi_backend *be, float *y, const zi_weight *w, const float *x,
                        int n_tokens) {
    cuda_matmul_n(be, 1, &y, &w, x, n_tokens);
}

/* backend.h's matmul_groups (a mixture of experts' chosen experts, each
 * over its tokens): one product per group, as matmul would run it; a
 * decode step's groups are a few tokens each (the matrix-vector kernel). */
static void cuda_matmul_groups(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                               const float *x, int n_rows, const int32_t *first,
                               const int32_t *count) {
    cuda_backend *c = cb(be);
    for (int i = 0; i < n && !c->status; i++) {
        if (first[i] < 0 || count[i] < 1 || first[i] > n_rows - count[i]) {
            fail_msg(c, ZI_EINVAL, "matmul_groups: group %d takes rows %d..%d of %d", i, first[i],
                     first[i] + count[i] - 1, n_rows);
            return;
        }
        cuda_matmul(be, ys[i], ws[i], x + (size_t)first[i] * (size_t)ws[i]->cols, count[i]);
    }
}

/* backend.h's weight_view: the rows of the file's encoding, in place (one
 * upload for all of a tensor's experts). */
static int cuda_weight_view(zi_backend *be, const zi_weight *w, int64_t r0, int64_t n,
                            zi_weight *out, zi_error *err) {
    cuda_backend *c = cb(be);
    if (r0 < 0 || n < 1 || r0 > w->rows - n)
        return zi_error_set(err, ZI_EINVAL, "weight view: rows %lld..%lld of %lld", (long long)r0,
                            (long long)(r0 + n - 1), (long long)w->rows);
    *out = *w;
    out->rows = n;
    out->data = out->file_data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
    out->data_bytes = (size_t)n * w->row_bytes;
    out->owned = NULL;
    out->aux = NULL;
    /* No fp16 copy: a prefill reaches most experts, and their copies would
     * hold about four times the experts' bytes; a large product
     * dequantizes the expert into the scratch, sized for it here. */
    out->layout = (w->layout & ~ZI_CUDA_LAYOUT_TILE_F32) | ZI_CUDA_LAYOUT_NO_F16;
    if (w->type != ZI_TYPE_F16 && w->type != ZI_TYPE_F32 &&
        (size_t)n * (size_t)w->cols > c->max_w16)
        c->max_w16 = (size_t)n * (size_t)w->cols;
    return ZI_OK;
}

/* ---- the other ops ---- */

static void cuda_get_rows(zi_backend *be, float *y, const zi_weight *table, const int32_t *ids,
                          int n) {
    cuda_backend *c = cb(be);
    if (c->status || n <= 0) return;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= table->rows) {
            fail_msg(c, ZI_EINVAL, "token id %d at index %d is outside 0..%lld", ids[i], i,
                     (long long)table->rows - 1);
            return;
        }
    const int32_t *d_ids = stage(c, META_IDS, ids, (size_t)n);
    if (!d_ids) return;
    failed(c,
           zi_cuda_get_rows(table->type, table->file_data, table->row_bytes, table->cols, d_ids, n,
                            y, c->stream),
           "get_rows kernel");
}

static void cuda_rmsnorm(zi_backend *be, float *y, const float *x, const float *w, int n_tokens,
                         int dim, float eps) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_rmsnorm(y, x, w, n_tokens, dim, eps, c->stream), "rmsnorm kernel");
}

static zi_cuda_rope_freqs rope_freqs(const zi_rope_freqs *rf) {
    return (zi_cuda_rope_freqs){.base = rf->base,
                                .freq_scale = rf->freq_scale,
                                .mscale = rf->mscale,
                                .ext_factor = rf->ext_factor,
                                .corr_lo = rf->corr_lo,
                                .corr_hi = rf->corr_hi,
                                .factors = rf->factors};
}

static void cuda_rope(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                      int head_dim, int rope_dim, const zi_rope_freqs *rf) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    const int32_t *d_pos = stage(c, META_POS, pos, (size_t)n_tokens);
    if (!d_pos) return;
    const zi_cuda_rope_freqs f = rope_freqs(rf);
    failed(c, zi_cuda_rope(x, d_pos, n_tokens, n_heads, head_dim, rope_dim, &f, c->stream),
           "rope kernel");
}

static void cuda_rope_neox(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                           int head_dim, int rope_dim, const zi_rope_freqs *rf) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    const int32_t *d_pos = stage(c, META_POS, pos, (size_t)n_tokens);
    if (!d_pos) return;
    const zi_cuda_rope_freqs f = rope_freqs(rf);
    failed(c, zi_cuda_rope_neox(x, d_pos, n_tokens, n_heads, head_dim, rope_dim, &f, c->stream),
           "rope_neox kernel");
}

static void cuda_kv_store(zi_backend *be, void *kcache, void *vcache, const float *k,
                          const float *v, const zi_batch_view *b, const zi_attn_shape *s) {
    cuda_backend *c = cb(be);
    if (c->status || b->n_tokens <= 0) return;
    const int32_t *d_pos, *d_seq, *d_tab;
    int max_len;
    if (!stage_view(c, b, s, &d_pos, &d_seq, &d_tab, &max_len)) return;
    failed(c,
           zi_cuda_kv_store(kcache, vcache, k, v, d_pos, d_seq, d_tab, b->table_stride,
                            s->block_size, b->n_tokens, s->n_kv_heads * s->head_dim, c->stream),
           "kv_store kernel");
}

static void cuda_attention(zi_backend *be, float *out, const float *q, const void *kcache,
                           const void *vcache, const zi_batch_view *b, const zi_attn_shape *s) {
    cuda_backend *c = cb(be);
    if (c->status || b->n_tokens <= 0) return;
    const int32_t *d_pos, *d_seq, *d_tab;
    int max_len;
    if (!stage_view(c, b, s, &d_pos, &d_seq, &d_tab, &max_len)) return;
    if (s->window < 0) {
        fail_msg(c, ZI_EINVAL, "attention window %d is negative", s->window);
        return;
    }
    /* The longest span a token reads: a sliding window bounds it (from
     * win_pos where given: an image token's window counts from its own
     * position, its pos is its tile's reach). */
    const int32_t *d_win = NULL;
    if (b->win_pos) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (failed(c, cudaStreamIsCapturing(c->stream, &cap), "cudaStreamIsCapturing")) return;
        if (cap != cudaStreamCaptureStatusNone) { /* a graph's replay would not restage it */
            fail_msg(c, ZI_EUNSUPPORTED, "attention with win_pos in a graph capture");
            return;
        }
        for (int t = 0; t < b->n_tokens; t++)
            if (b->win_pos[t] < 0 || b->win_pos[t] > b->pos[t]) {
                fail_msg(c, ZI_ERANGE, "token %d: win_pos %d is outside 0..%d", t, b->win_pos[t],
                         b->pos[t]);
                return;
            }
        if (!(d_win = stage(c, META_WINPOS, b->win_pos, (size_t)b->n_tokens))) return;
    }
    if (s->window > 0) {
        int mx = 0;
        for (int t = 0; t < b->n_tokens; t++) {
            const int wp = b->win_pos ? b->win_pos[t] : b->pos[t];
            const int start = wp >= s->window ? wp - s->window + 1 : 0;
            if (b->pos[t] + 1 - start > mx) mx = b->pos[t] + 1 - start;
        }
        max_len = mx;
    }
    /* A block's warps walk their positions one after another, each a wait
     * on memory, and a decode step has few (token, head) blocks: split the
     * positions (flash-decoding) into chunks of at least ZI_ATTN_MIN_CHUNK,
     * towards ZI_ATTN_BLOCKS_PER_SM blocks per multiprocessor. The split
     * changes only the speed (and the order of the final sums), never which
     * positions are read. */
    int64_t blocks = (int64_t)b->n_tokens * s->n_heads;
    int64_t target = (int64_t)ZI_ATTN_BLOCKS_PER_SM * c->sms;
    int n_split = 1;
    if (blocks < target && max_len >= 2 * ZI_ATTN_MIN_CHUNK && c->attn_scratch) {
        int64_t want = (target + blocks - 1) / blocks;
        int64_t by_len = max_len / ZI_ATTN_MIN_CHUNK;
        n_split = (int)(want < by_len ? want : by_len);
        if (n_split > ZI_CUDA_ATTN_MAX_SPLIT) n_split = ZI_CUDA_ATTN_MAX_SPLIT;
        while (n_split > 1 && (size_t)blocks * (size_t)n_split * (size_t)(s->head_dim + 2) >
                                  ZI_ATTN_SCRATCH_FLOATS)
            n_split--;
        if (n_split < 1) n_split = 1;
    }
    failed(c,
           zi_cuda_attention(out, q, kcache, vcache, d_pos, d_win, d_seq, d_tab, b->table_stride,
                             s->block_size, b->n_tokens, s->n_heads, s->n_kv_heads, s->head_dim,
                             s->scale, s->softcap, s->window, s->sinks, n_split, c->attn_scratch,
                             c->stream),
           "attention kernel");
}

static void cuda_swiglu(zi_backend *be, float *out, const float *gate, const float *up, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_swiglu(out, gate, up, n, c->stream), "swiglu kernel");
}

static void cuda_swiglu_oai(zi_backend *be, float *out, const float *gate, const float *up,
                            size_t n, float alpha, float limit) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_swiglu_oai(out, gate, up, n, alpha, limit, c->stream), "swiglu_oai kernel");
}

static void cuda_geglu(zi_backend *be, float *out, const float *gate, const float *up, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_geglu(out, gate, up, n, c->stream), "geglu kernel");
}

static void cuda_scale(zi_backend *be, float *x, float s, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_scale(x, s, n, c->stream), "scale kernel");
}

static void cuda_softcap(zi_backend *be, float *x, float cap, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_softcap(x, cap, n, c->stream), "softcap kernel");
}

static void cuda_add(zi_backend *be, float *x, const float *y, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_add(x, y, n, c->stream), "add kernel");
}

/* LoRA (backend.h's lora): the tokens' rows copied to the device (from
 * pageable memory, which cudaMemcpyAsync has read when it returns, so the
 * host array is free again at once; the device copy is reused in stream
 * order), then zi_cuda_lora's two kernels. Not in a graph: a replay would
 * run the captured adapters whatever the next batch asks. */
static void cuda_lora(zi_backend *be, float *y, const float *x, int n_tokens, int64_t rows,
                      int64_t cols, const zi_lora_row *r) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    int max_rank = 0;
    for (int t = 0; t < n_tokens; t++)
        if (r[t].a) {
            if (r[t].rank < 1 || r[t].rank > ZI_LORA_MAX_RANK ||
                (r[t].type != ZI_TYPE_F32 && r[t].type != ZI_TYPE_F16)) {
                fail_msg(c, ZI_EINVAL, "token %d's LoRA term: rank %d, type %d", t, r[t].rank,
                         r[t].type);
                return;
            }
            if (r[t].rank > max_rank) max_rank = r[t].rank;
        }
    if (max_rank == 0) return;
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (failed(c, cudaStreamIsCapturing(c->stream, &cap), "cudaStreamIsCapturing")) return;
    if (cap != cudaStreamCaptureStatusNone) {
        fail_msg(c, ZI_EUNSUPPORTED, "a pass with LoRA adapters cannot be captured in a graph");
        return;
    }
    if ((size_t)n_tokens > c->lora_cap) {
        zi_cuda_lora_row *h = realloc(c->lora_h, (size_t)n_tokens * sizeof *h);
        if (!h) {
            fail_msg(c, ZI_ENOMEM, "out of memory for %d LoRA rows", n_tokens);
            return;
        }
        c->lora_h = h;
        if (failed(c, cudaStreamSynchronize(c->stream), "cudaStreamSynchronize (lora rows)"))
            return;
        dev_free(c, c->lora_d);
        c->lora_d = NULL;
        c->lora_cap = 0;
        if (failed(c, cudaMalloc((void **)&c->lora_d, (size_t)n_tokens * sizeof *c->lora_d),
                   "cudaMalloc (lora rows)"))
            return;
        c->lora_cap = (size_t)n_tokens;
    }
    void *scratch = c->lora_c;
    if (failed(
            c,
            grow(c, &scratch, &c->lora_c_cap, (size_t)n_tokens * (size_t)max_rank, sizeof(float)),
            "cudaMalloc (lora scratch)"))
        return;
    c->lora_c = scratch;
    for (int t = 0; t < n_tokens; t++)
        c->lora_h[t] = (zi_cuda_lora_row){.a = r[t].a,
                                          .bt = r[t].a ? r[t].bt : NULL,
                                          .scale = r[t].scale,
                                          .rank = r[t].a ? r[t].rank : 0,
                                          .f16 = r[t].type == ZI_TYPE_F16};
    if (failed(c,
               cudaMemcpyAsync(c->lora_d, c->lora_h, (size_t)n_tokens * sizeof *c->lora_h,
                               cudaMemcpyHostToDevice, c->stream),
               "cudaMemcpyAsync (lora rows)"))
        return;
    failed(c, zi_cuda_lora(y, x, n_tokens, rows, cols, c->lora_d, max_rank, c->lora_c, c->stream),
           "lora kernels");
}

static void cuda_add_bias(zi_backend *be, float *x, const float *bias, int n_rows, int dim) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_add_bias(x, bias, n_rows, dim, c->stream), "add_bias kernel");
}

/* ---- the hybrid families' ops (cuda_recurrent.h) ---- */

static void cuda_mul(zi_backend *be, float *x, const float *y, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_mul(x, y, n, c->stream), "mul kernel");
}

static void cuda_silu(zi_backend *be, float *x, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_silu(x, n, c->stream), "silu kernel");
}

static void cuda_sigmoid_mul(zi_backend *be, float *x, const float *g, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_sigmoid_mul(x, g, n, c->stream), "sigmoid_mul kernel");
}

static void cuda_gather_rows(zi_backend *be, float *y, const float *x, const int32_t *idx, int n,
                             int dim) {
    cuda_backend *c = cb(be);
    if (c->status || n <= 0) return;
    const int slot = c->gather_turn ? META_GATHER2 : META_GATHER;
    c->gather_turn = !c->gather_turn;
    const int32_t *d_idx = stage(c, slot, idx, (size_t)n);
    if (!d_idx) return;
    failed(c, zi_cuda_gather_rows(y, x, d_idx, n, dim, c->stream), "gather_rows kernel");
}

static void cuda_rmsnorm_groups(zi_backend *be, float *y, const float *x, const float *w,
                                int n_tokens, int dim, int groups, float eps) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    failed(c, zi_cuda_rmsnorm_groups(y, x, w, n_tokens, dim, groups, eps, c->stream),
           "rmsnorm_groups kernel");
}

/* The state slots and positions of a recurrent op's tokens on the device
 * (false after a failure, which the backend's status holds). */
static bool stage_states(cuda_backend *c, const int32_t *slot, const int32_t *pos, int n,
                         const int32_t **d_slot, const int32_t **d_pos) {
    *d_slot = stage(c, META_SLOT, slot, (size_t)n);
    *d_pos = *d_slot ? stage(c, META_POS, pos, (size_t)n) : NULL;
    return *d_pos != NULL;
}

static void cuda_conv_state(zi_backend *be, float *y, const float *x, const float *w, int K,
                            int channels, float *states, const int32_t *slot, const int32_t *pos,
                            int n) {
    cuda_backend *c = cb(be);
    const int32_t *ds, *dp;
    if (c->status || n <= 0 || !stage_states(c, slot, pos, n, &ds, &dp)) return;
    failed(c, zi_cuda_conv_state(y, x, w, K, channels, states, ds, dp, n, c->stream),
           "conv_state kernel");
}

static void cuda_delta_net(zi_backend *be, float *out, const float *qkv, const float *b,
                           const float *alpha, const float *dt_bias, const float *a, float *states,
                           const int32_t *slot, const int32_t *pos, int n, int nk, int nv, int d,
                           float eps) {
    cuda_backend *c = cb(be);
    const int32_t *ds, *dp;
    if (c->status || n <= 0 || !stage_states(c, slot, pos, n, &ds, &dp)) return;
    failed(c,
           zi_cuda_delta_net(out, qkv, b, alpha, dt_bias, a, states, ds, dp, n, nk, nv, d, eps,
                             c->stream),
           "delta_net kernel");
}

static void cuda_ssm_scan(zi_backend *be, float *out, const float *xbc, const float *dt,
                          const float *dt_bias, const float *a, const float *dd, float *states,
                          const int32_t *slot, const int32_t *pos, int n, int H, int P, int G,
                          int N) {
    cuda_backend *c = cb(be);
    const int32_t *ds, *dp;
    if (c->status || n <= 0 || !stage_states(c, slot, pos, n, &ds, &dp)) return;
    failed(c,
           zi_cuda_ssm_scan(out, xbc, dt, dt_bias, a, dd, states, ds, dp, n, H, P, G, N, c->stream),
           "ssm_scan kernel");
}

/* ---- the encoders' ops (cuda_vision.h): image towers, bert ---- */

static void cuda_layernorm(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                           int n_tokens, int dim, float eps) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_layernorm(y, x, w, b, n_tokens, dim, eps, c->stream), "layernorm kernel");
}

static void cuda_gelu(zi_backend *be, float *x, size_t n) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    failed(c, zi_cuda_gelu(x, n, c->stream), "gelu kernel");
}

static void cuda_weighted_sum_rows(zi_backend *be, float *out, const float *y, const int32_t *idx,
                                   const float *w, int n_out, int k, int dim) {
    cuda_backend *c = cb(be);
    if (c->status || n_out <= 0) return;
    if (k < 1) {
        fail_msg(c, ZI_EINVAL, "weighted_sum_rows: %d rows a sum", k);
        return;
    }
    const size_t n = (size_t)n_out * (size_t)k;
    for (size_t i = 0; i < n; i++)
        if (idx[i] < 0) {
            fail_msg(c, ZI_EINVAL, "weighted_sum_rows: row index %d at %zu is negative", idx[i], i);
            return;
        }
    /* the weights travel as their bits through an int32 staging slot */
    const int32_t *d_idx = stage(c, META_WSUM_IDX, idx, n);
    const int32_t *d_w = d_idx ? stage(c, META_WSUM_W, (const int32_t *)(const void *)w, n) : NULL;
    if (!d_w) return;
    failed(c,
           zi_cuda_weighted_sum_rows(out, y, d_idx, (const float *)(const void *)d_w, n_out, k, dim,
                                     c->stream),
           "weighted_sum_rows kernel");
}

/* The spans checked on the host (backend.h's contract, where the CPU
 * asserts), then order, starts and the tiles of each span (blocks of
 * zi_cuda_span_tile_rows rows: start index, span) staged as one array.
 * Float32 where the caller allows it (tile_precision on a bidirectional
 * span, as the CPU's tile path), else double. */
static void cuda_span_attention(zi_backend *be, float *out, const float *q, const float *k,
                                const float *v, const int32_t *order, const int32_t *starts,
                                int n_spans, const zi_attn_shape *s) {
    cuda_backend *c = cb(be);
    if (c->status || n_spans <= 0) return;
    if (s->head_dim <= 0 || s->head_dim > ZI_CUDA_MAX_HEAD_DIM || s->n_kv_heads <= 0 ||
        s->n_heads <= 0 || s->n_heads % s->n_kv_heads != 0 || s->n_heads > 65535) {
        fail_msg(c, ZI_EINVAL, "span_attention: %d heads of %d over %d KV heads", s->n_heads,
                 s->head_dim, s->n_kv_heads);
        return;
    }
    if (s->window != 0 || s->softcap != 0.0f || s->sinks) {
        fail_msg(c, ZI_EUNSUPPORTED,
                 "span_attention: a window, soft-capping or sinks (window %d, softcap %g)",
                 s->window, (double)s->softcap);
        return;
    }
    if (starts[0] != 0) {
        fail_msg(c, ZI_EINVAL, "span_attention: starts[0] is %d, not 0", starts[0]);
        return;
    }
    const int qt = zi_cuda_span_tile_rows(s->head_dim);
    size_t n_tiles = 0;
    for (int r = 0; r < n_spans; r++) {
        if (starts[r + 1] <= starts[r]) {
            fail_msg(c, ZI_EINVAL, "span_attention: span %d is empty (starts %d, %d)", r, starts[r],
                     starts[r + 1]);
            return;
        }
        n_tiles += (size_t)(starts[r + 1] - starts[r] + qt - 1) / (size_t)qt;
    }
    const size_t rows = (size_t)starts[n_spans];
    for (size_t i = 0; i < rows; i++)
        if (order[i] < 0) {
            fail_msg(c, ZI_EINVAL, "span_attention: row %d at %zu is negative", order[i], i);
            return;
        }
    const size_t total = rows + (size_t)n_spans + 1 + 2 * n_tiles;
    if (n_tiles > INT32_MAX || total > INT32_MAX) {
        fail_msg(c, ZI_ERANGE, "span_attention: %zu rows in %d spans", rows, n_spans);
        return;
    }
    if (total > c->span_cap) {
        int32_t *p = realloc(c->span_h, total * sizeof *p);
        if (!p) {
            fail_msg(c, ZI_ENOMEM, "span_attention: out of memory for %zu entries", total);
            return;
        }
        c->span_h = p, c->span_cap = total;
    }
    int32_t *h = c->span_h;
    memcpy(h, order, rows * sizeof *h);
    memcpy(h + rows, starts, ((size_t)n_spans + 1) * sizeof *h);
    int32_t *tiles = h + rows + n_spans + 1;
    size_t t = 0;
    for (int r = 0; r < n_spans; r++)
        for (int32_t i = starts[r]; i < starts[r + 1]; i += qt)
            tiles[2 * t] = i, tiles[2 * t + 1] = r, t++;
    const int32_t *d = stage(c, META_SPAN, h, total);
    if (!d) return;
    const int f32 = s->tile_precision && !s->causal;
    failed(c,
           zi_cuda_span_attention(out, q, k, v, d, d + rows, d + rows + n_spans + 1, (int)n_tiles,
                                  s->n_heads, s->n_kv_heads, s->head_dim, s->scale, s->causal, f32,
                                  c->stream),
           "span_attention kernel");
}

/* ---- the speech codec decoder's ops (cuda_audio.h) ---- */

/* The shapes checked on the host where the CPU asserts (backend.h's
 * contract): a bad one fails the backend with its values. */
static void cuda_conv1d(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                        int n, int cin, int cout, int K) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    if (x == y || n < 1 || K < 1 || cin < 1 || cout < 1) {
        fail_msg(c, ZI_EINVAL, "conv1d: %d frames of %d to %d channels, %d taps%s", n, cin, cout, K,
                 x == y ? ", y aliases x" : "");
        return;
    }
    failed(c, zi_cuda_conv1d(y, x, w, b, n, cin, cout, K, c->stream), "conv1d kernel");
}

static void cuda_conv1d_dw(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                           int n, int channels, int K) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    if (x == y || n < 1 || K < 1 || channels < 1) {
        fail_msg(c, ZI_EINVAL, "conv1d_dw: %d frames of %d channels, %d taps%s", n, channels, K,
                 x == y ? ", y aliases x" : "");
        return;
    }
    failed(c, zi_cuda_conv1d_dw(y, x, w, b, n, channels, K, c->stream), "conv1d_dw kernel");
}

static void cuda_group_norm(zi_backend *be, float *y, const float *x, const float *w,
                            const float *b, int n, int channels, int groups, float eps) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    if (n < 1 || groups < 1 || groups > 65535 || channels < 1 || channels % groups != 0) {
        fail_msg(c, ZI_EINVAL, "group_norm: %d frames of %d channels in %d groups", n, channels,
                 groups);
        return;
    }
    failed(c, zi_cuda_group_norm(y, x, w, b, n, channels, groups, eps, c->stream),
           "group_norm kernel");
}

static void cuda_istft(zi_backend *be, float *out, const float *spec, float *frames, int n,
                       int n_fft, int hop) {
    cuda_backend *c = cb(be);
    if (c->status) return;
    if (n < 1 || n_fft < 4 || n_fft % 2 != 0 || n_fft > ZI_CUDA_ISTFT_MAX_FFT || hop < 1 ||
        hop > n_fft) {
        fail_msg(c, ZI_EINVAL, "istft: %d frames, n_fft %d (even, 4..%d), hop %d", n, n_fft,
                 ZI_CUDA_ISTFT_MAX_FFT, hop);
        return;
    }
    failed(c, zi_cuda_istft(out, spec, frames, n, n_fft, hop, c->stream), "istft kernel");
}

/* matmul_tile's float32 copy of a weight that is not float32 already, in
 * w->aux (in place of an fp16 copy, which is then released). */
static int cuda_weight_prepare_tile(zi_backend *be, zi_weight *w, zi_error *err) {
    cuda_backend *c = cb(be);
    if (w->type == ZI_TYPE_F32 || (w->layout & ZI_CUDA_LAYOUT_TILE_F32)) return ZI_OK;
    if (c->status) {
        if (err) *err = c->err;
        return c->status;
    }
    enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess ||
        cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return zi_error_set(err, ZI_EINVAL, "CUDA device %d: a tile weight prepared in a capture",
                            c->device);
    }
    const size_t bytes = (size_t)w->rows * (size_t)w->cols * sizeof(float);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaSuccess)
        e = zi_cuda_to_f32(w->type, w->data, w->row_bytes, w->rows, w->cols, p, c->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        (void)cudaGetLastError(); /* matmul_tile runs as matmul for this weight */
        return zi_error_set(err, ZI_ENOMEM,
                            "CUDA device %d: float32 copy of a %lld x %lld weight (%.1f MiB): %s",
                            c->device, (long long)w->rows, (long long)w->cols, bytes / 1048576.0,
                            cudaGetErrorString(e));
    }
    if (w->aux) { /* an fp16 copy made by an earlier matmul: the float32 one serves both */
        cudaStreamSynchronize(c->stream);
        dev_free(c, w->aux);
        c->f16_bytes -= (size_t)w->rows * (size_t)w->cols * 2;
    }
    w->aux = p;
    w->layout |= ZI_CUDA_LAYOUT_TILE_F32 | ZI_CUDA_LAYOUT_NO_F16;
    return ZI_OK;
}

/* y = x W^T in float32 (cuBLAS's fp32 GEMM, no TF32: the handle keeps the
 * default math mode) from the weight's float32 values, for a whole image
 * tile: the products' fp16 activations would cost the tower ~1e-3. */
static void cuda_matmul_tile(zi_backend *be, float *y, const zi_weight *w, const float *x,
                             int n_tokens) {
    cuda_backend *c = cb(be);
    if (c->status || n_tokens <= 0) return;
    if (w->type != ZI_TYPE_F32 && !(w->layout & ZI_CUDA_LAYOUT_TILE_F32)) {
        /* made on first use when the caller did not prepare it: the copy
         * is part of the weight (weight_free releases it) */
        zi_error e = {0};
        if (cuda_weight_prepare_tile(be, (zi_weight *)w, &e)) {
            cuda_matmul(be, y, w, x, n_tokens);
            return;
        }
    }
    const void *a = w->type == ZI_TYPE_F32 ? w->data : w->aux;
    cublasStatus_t st = gemm(c, w, a, CUDA_R_32F, x, CUDA_R_32F, y, n_tokens);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fail_msg(c, ZI_EIO, "cublasGemmEx (tile f32, %lld x %lld, %d tokens): %s",
                 (long long)w->rows, (long long)w->cols, n_tokens, blas_status(st));
        return;
    }
    if (w->layout & ZI_CUDA_LAYOUT_ALLREDUCE) {
        zi_error e = {0};
        if (zi_tp_all_reduce_sum(c->tp, y, (size_t)n_tokens * (size_t)w->rows, c->stream, &e))
            fail_msg(c, e.code, "%s", e.msg);
    }
}

static void cuda_backend_free(zi_backend *be) {
    cuda_backend *c = cb(be);
    if (!c) return;
    if (c->stream) cudaStreamSynchronize(c->stream);
    if (c->blas) blas.destroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->w16);
    cudaFree(c->x16);
    cudaFree(c->attn_scratch);
    cudaFree(c->lora_d);
    cudaFree(c->lora_c);
    free(c->lora_h);
    free(c->span_h);
    for (int i = 0; i < META_N; i++) {
        cudaFree(c->meta[i].d);
        cudaFreeHost(c->meta[i].h);
        if (c->meta[i].ev) cudaEventDestroy(c->meta[i].ev);
    }
    if (c->stream) cudaStreamDestroy(c->stream);
    zi_tp_free(c->own_tp);
    free(c);
}

static const zi_backend_ops cuda_ops = {
    .name = "cuda",
    .free_backend = cuda_backend_free,
    .weight_init = cuda_weight_init,
    .weight_free = cuda_weight_free,
    .weight_view = cuda_weight_view,
    .vector_init = cuda_vector_init,
    .reserve = cuda_reserve,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .matmul = cuda_matmul,
    .matmul_n = cuda_matmul_n,
    .matmul_groups = cuda_matmul_groups,
    .matmul_tile = cuda_matmul_tile,
    .weight_prepare_tile = cuda_weight_prepare_tile,
    .get_rows = cuda_get_rows,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .rope_neox = cuda_rope_neox,
    .kv_store = cuda_kv_store,
    .attention = cuda_attention,
    .span_attention = cuda_span_attention,
    .swiglu = cuda_swiglu,
    .swiglu_oai = cuda_swiglu_oai,
    .geglu = cuda_geglu,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .add_bias = cuda_add_bias,
    .add = cuda_add,
    .lora = cuda_lora,
    .layernorm = cuda_layernorm,
    .gelu = cuda_gelu,
    .gather_rows = cuda_gather_rows,
    .weighted_sum_rows = cuda_weighted_sum_rows,
    .mul = cuda_mul,
    .conv_state = cuda_conv_state,
    .silu = cuda_silu,
    .sigmoid_mul = cuda_sigmoid_mul,
    .delta_net = cuda_delta_net,
    .ssm_scan = cuda_ssm_scan,
    .rmsnorm_groups = cuda_rmsnorm_groups,
    .conv1d = cuda_conv1d,
    .conv1d_dw = cuda_conv1d_dw,
    .group_norm = cuda_group_norm,
    .istft = cuda_istft,
    .sync = cuda_sync,
};

int zi_cuda_backend_create(const zi_cuda_options *o, zi_backend **out, zi_error *err) {
    int dev = o ? o->device : 0, count = 0;
    int rc = zi_cuda_device_count(&count, err);
    if (rc) return rc;
    if (dev < 0 || dev >= count)
        return zi_error_set(err, ZI_EINVAL, "CUDA device %d does not exist (%d found: 0..%d)", dev,
                            count, count - 1);
    if (o && o->tp && zi_tp_world_size(o->tp) > 1)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tensor parallelism over %d GPUs: the model does not shard its "
                            "attention yet (docs/cuda.md)",
                            zi_tp_world_size(o->tp));
    pthread_once(&blas.once, blas_load);
    if (!blas.lib) return zi_error_set(err, ZI_EUNSUPPORTED, "cuBLAS: %s", blas.why);

    cuda_backend *c = calloc(1, sizeof *c);
    if (!c) return zi_error_set(err, ZI_ENOMEM, "out of memory creating the CUDA backend");
    c->base.ops = &cuda_ops;
    c->base.kv_k_bytes = c->base.kv_v_bytes = 4; /* float32 K and V: the kernels read floats */
    c->base.attn_window = true;                  /* the attention kernel reads the window only */
    c->base.attn_softcap = true;                 /* and caps its scores (cap_score) */
    c->base.attn_sinks = true;                   /* and adds the sinks to its denominators */
    c->base.rope_yarn = true;                    /* rope_cs mixes YaRN's angles */
    c->device = dev;
    c->f16_weights = o ? o->f16_weights : 0;
    for (int i = 0; i < META_N; i++) c->meta[i].n = -1;
    const char *what = "cudaSetDevice";
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess) {
        what = "cudaDeviceGetAttribute";
        e = cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, dev);
    }
    if (e == cudaSuccess) {
        /* a device this build has no kernels for fails here, with a clear name */
        what = "kernel image check (this build has sm_80 and sm_90 code)";
        e = zi_cuda_kernels_check();
    }
    if (e == cudaSuccess) {
        what = "cudaStreamCreate";
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    }
    for (int i = 0; i < META_N && e == cudaSuccess; i++) {
        what = "cudaEventCreate";
        e = cudaEventCreateWithFlags(&c->meta[i].ev, cudaEventDisableTiming);
    }
    if (e == cudaSuccess) {
        what = "cudaMalloc (cuBLAS workspace)";
        e = cudaMalloc(&c->blas_ws, ZI_CUBLAS_WORKSPACE);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        zi_error_set(err, ZI_EUNSUPPORTED, "CUDA device %d: %s: %s: %s", dev, what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
        cuda_backend_free(&c->base);
        return ZI_EUNSUPPORTED;
    }
    cublasStatus_t s = blas.create(&c->blas);
    const char *bwhat = "cublasCreate";
    if (s != CUBLAS_STATUS_SUCCESS) c->blas = NULL; /* no handle to destroy */
    if (s == CUBLAS_STATUS_SUCCESS) {
        bwhat = "cublasSetStream";
        s = blas.set_stream(c->blas, c->stream);
    }
    if (s == CUBLAS_STATUS_SUCCESS) {
        bwhat = "cublasSetWorkspace";
        s = blas.set_workspace(c->blas, c->blas_ws, ZI_CUBLAS_WORKSPACE);
    }
    if (s != CUBLAS_STATUS_SUCCESS) {
        zi_error_set(err, ZI_EUNSUPPORTED, "CUDA device %d: %s: %s", dev, bwhat, blas_status(s));
        cuda_backend_free(&c->base);
        return ZI_EUNSUPPORTED;
    }
    if (o && o->tp) {
        c->tp = o->tp;
    } else {
        /* one rank: the same all-reduce calls, answered without NCCL */
        zi_tp_options to = {.world_size = 1, .rank = 0, .device = dev};
        if ((rc = zi_tp_create(&to, &c->own_tp, err))) {
            cuda_backend_free(&c->base);
            return rc;
        }
        c->tp = c->own_tp;
    }
    *out = &c->base;
    return ZI_OK;
}

int zi_cuda_backend_status(zi_backend *be, zi_error *err) {
    cuda_backend *c = cb(be);
    if (c->status && err) *err = c->err;
    return c->status;
}

size_t zi_cuda_backend_f16_bytes(const zi_backend *be) {
    return ((const cuda_backend *)be)->f16_bytes;
}

int zi_cuda_backend_device(const zi_backend *be) {
    return ((const cuda_backend *)be)->device;
}

void *zi_cuda_backend_stream(const zi_backend *be) {
    return (void *)((const cuda_backend *)be)->stream;
}

/* ---- CUDA graphs ---- */

struct zi_cuda_graph {
    cuda_backend *c;
    cudaGraphExec_t exec;
    size_t nodes;
    uint64_t epoch;      /* the capture's */
    uint64_t free_epoch; /* the backend's at capture: nothing freed since while equal */
    /* Per metadata slot, the entries the graph copies at each launch (-1:
     * it copies none): a snapshot, since a later capture overwrites the
     * slot's own record (stage_slot.cap_*). */
    int64_t copies[META_N];
    cudaEvent_t done; /* after the last launch: its copies have read the staging */
    int launched;
};

int zi_cuda_graph_capture(zi_backend *be, zi_cuda_enqueue_fn fn, void *arg, zi_cuda_graph **out,
                          zi_error *err) {
    cuda_backend *c = cb(be);
    *out = NULL;
    if (c->status) {
        if (err) *err = c->err;
        return c->status;
    }
    zi_cuda_graph *g = calloc(1, sizeof *g);
    if (!g) return zi_error_set(err, ZI_ENOMEM, "out of memory for a CUDA graph");
    g->c = c;
    /* the staging is rewritten below: earlier copies out of it must be done */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    const char *what = "cudaStreamSynchronize";
    if (e == cudaSuccess) {
        what = "cudaStreamBeginCapture";
        e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        free(g);
        return zi_error_set(err, ZI_EIO, "CUDA device %d: %s: %s", c->device, what,
                            cudaGetErrorString(e));
    }
    g->epoch = ++c->capture_epoch;
    g->free_epoch = c->free_epoch;
    c->capturing = 1;
    zi_error ferr = {0};
    int rc = fn(arg, &ferr);
    c->capturing = 0;
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(c->stream, &graph);
    for (int i = 0; i < META_N; i++) {
        stage_slot *m = &c->meta[i];
        g->copies[i] = m->cap_epoch == g->epoch ? m->cap_n : -1;
        if (g->copies[i] < 0) continue;
        /* The capture wrote the pass's entries into the pinned slot, but
         * nothing copied them to the device (the graph will, when
         * launched): an op-by-op pass with the same entries must not skip
         * its copy, whether or not this capture succeeds. */
        m->n = -1;
        if (!rc && m->cap_copies > 1)
            rc = zi_error_set(&ferr, ZI_EUNSUPPORTED,
                              "the captured pass staged metadata slot %d %d times with different "
                              "contents: a replay cannot restage it",
                              i, m->cap_copies);
        /* zi_cuda_graph_launch restages ids, positions, sequence rows and
         * tables; any other slot would replay the capture's contents */
        if (!rc && i != META_IDS && i != META_POS && i != META_SEQ && i != META_TAB)
            rc = zi_error_set(&ferr, ZI_EUNSUPPORTED,
                              "the captured pass reads metadata slot %d (gathers, spans or LoRA "
                              "rows), which a replay does not restage",
                              i);
    }
    if (!rc && c->status) rc = c->status, ferr = c->err;
    if (!rc && e != cudaSuccess)
        rc = zi_error_set(&ferr, ZI_EIO, "CUDA device %d: cudaStreamEndCapture: %s", c->device,
                          cudaGetErrorString(e));
    if (!rc && (e = cudaGraphGetNodes(graph, NULL, &g->nodes)) != cudaSuccess)
        rc = zi_error_set(&ferr, ZI_EIO, "cudaGraphGetNodes: %s", cudaGetErrorString(e));
    if (!rc && (e = cudaGraphInstantiate(&g->exec, graph, 0)) != cudaSuccess)
        rc = zi_error_set(&ferr, ZI_EIO, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    if (!rc && (e = cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming)) != cudaSuccess)
        rc = zi_error_set(&ferr, ZI_EIO, "cudaEventCreate: %s", cudaGetErrorString(e));
    if (graph) cudaGraphDestroy(graph);
    if (rc) {
        (void)cudaGetLastError();
        if (err) *err = ferr;
        zi_cuda_graph_free(g);
        return rc;
    }
    *out = g;
    return ZI_OK;
}

/* Whether n entries fit a slot the graph copies (it copies exactly its
 * captured count). */
static int restage_check(const zi_cuda_graph *g, int slot, size_t n, zi_error *err) {
    if (g->copies[slot] < 0) return ZI_OK; /* the captured pass never read it */
    if (g->copies[slot] != (int64_t)n)
        return zi_error_set(err, ZI_EINVAL,
                            "graph launch: metadata slot %d has %zu entries, the captured pass "
                            "%lld (replay only passes of the captured shape)",
                            slot, n, (long long)g->copies[slot]);
    return ZI_OK;
}

/* Writes n entries into a slot the graph copies (restage_check passed for
 * every slot first: a refused launch leaves the staging as it was, so the
 * next pass's skip of an unchanged slot stays right), once the slot's last
 * copy out of it (an op's, or another graph's) has left. */
static int restage(zi_cuda_graph *g, int slot, const int32_t *src, size_t n) {
    stage_slot *m = &g->c->meta[slot];
    if (g->copies[slot] < 0) return 0;
    if (m->n >= 0 && failed(g->c, cudaEventSynchronize(m->ev), "cudaEventSynchronize (staging)"))
        return 1;
    memcpy(m->h, src, n * sizeof *src);
    m->n = (int64_t)n; /* the device copy holds these once the graph ran */
    return 0;
}

int zi_cuda_graph_launch(zi_cuda_graph *g, const int32_t *ids, const zi_batch_view *v,
                         const zi_attn_shape *s, zi_error *err) {
    cuda_backend *c = g->c;
    if (c->status) {
        if (err) *err = c->err;
        return c->status;
    }
    if (g->launched && cudaEventSynchronize(g->done) != cudaSuccess) {
        (void)cudaGetLastError();
        return zi_error_set(err, ZI_EIO, "CUDA device %d: graph launch: waiting for the last one",
                            c->device);
    }
    if (v->win_pos)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "graph launch: a view with win_pos (an image's tokens) runs op by op");
    if (zi_cuda_graph_stale(g))
        return zi_error_set(err, ZI_EINVAL,
                            "graph launch: device memory was freed since the capture (a buffer "
                            "grew): capture the pass again");
    /* the same host checks as the ops make on their metadata */
    int max_seq = 0;
    int64_t limit = (int64_t)v->table_stride * s->block_size;
    if (s->max_ctx < limit) limit = s->max_ctx;
    for (int i = 0; i < v->n_tokens; i++) {
        if (v->pos[i] < 0 || v->pos[i] >= limit || v->seq[i] < 0)
            return zi_error_set(err, ZI_ERANGE,
                                "graph launch: token %d: position %d of sequence %d is outside "
                                "0..%lld",
                                i, v->pos[i], v->seq[i], (long long)limit - 1);
        if (v->seq[i] > max_seq) max_seq = v->seq[i];
    }
    const size_t T = (size_t)v->n_tokens;
    const size_t n_tab = ((size_t)max_seq + 1) * (size_t)v->table_stride;
    int rc = restage_check(g, META_IDS, T, err);
    if (!rc) rc = restage_check(g, META_POS, T, err);
    if (!rc) rc = restage_check(g, META_SEQ, T, err);
    if (!rc) rc = restage_check(g, META_TAB, n_tab, err);
    if (rc) return rc;
    if (restage(g, META_IDS, ids, T) || restage(g, META_POS, v->pos, T) ||
        restage(g, META_SEQ, v->seq, T) || restage(g, META_TAB, v->block_tables, n_tab) ||
        failed(c, cudaGraphLaunch(g->exec, c->stream), "cudaGraphLaunch") ||
        failed(c, cudaEventRecord(g->done, c->stream), "cudaEventRecord (graph)")) {
        if (err) *err = c->err;
        return c->status;
    }
    /* the graph's copies read the restaged slots: the next rewrite of one
     * (stage, restage) waits for this launch */
    for (int i = 0; i < META_N; i++)
        if (g->copies[i] >= 0 && c->meta[i].n >= 0 &&
            failed(c, cudaEventRecord(c->meta[i].ev, c->stream), "cudaEventRecord (staging)")) {
            if (err) *err = c->err;
            return c->status;
        }
    g->launched = 1;
    return ZI_OK;
}

int zi_cuda_graph_stale(const zi_cuda_graph *g) {
    return g->c->free_epoch != g->free_epoch;
}

size_t zi_cuda_graph_nodes(const zi_cuda_graph *g) {
    return g->nodes;
}

void zi_cuda_graph_free(zi_cuda_graph *g) {
    if (!g) return;
    if (g->launched) cudaEventSynchronize(g->done);
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->done) cudaEventDestroy(g->done);
    free(g);
}
