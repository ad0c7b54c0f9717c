/*
 * cuda_backend.h - the CUDA implementation of the backend interface
 * (kernels/backend.h), for NVIDIA GPUs of compute capability 8.0 and 9.0
 * (A100, H100/H200) and anything that runs their PTX.
 *
 * The model (model_worker/model.c) drives it exactly like the CPU backend:
 * every op is queued on one CUDA stream owned by the backend and returns at
 * once; sync() waits for the stream. Buffers from alloc() are device memory,
 * so the model's pointer arithmetic on them works unchanged; only upload()
 * and download() cross to the host.
 *
 * Weights: weight_init() copies each matrix to the device in its GGUF
 * encoding (Q4_0, Q4_1, Q8_0 blocks, F16, BF16, F32), so quantized models
 * keep their small size on the GPU. Products with few tokens (decode, up to
 * ZI_CUDA_MMV_MAX_TOKENS in cuda_kernels.h) use a matrix-vector kernel that
 * decodes the blocks in registers and multiplies float32 activations; larger
 * batches dequantize the weight to fp16 in a scratch buffer and call cuBLAS
 * (cublasGemmEx, fp16 inputs, fp32 accumulation and output).
 *
 * The per-token metadata the interface passes as host arrays (token ids,
 * positions, slots) is staged through pinned memory and copied to the
 * device once per forward pass (a content check skips the copy when the
 * next op passes the same array). After reserve() no op allocates or
 * synchronizes with the host, so a decode step can be captured in a CUDA
 * graph (docs/cuda.md says what a graph runner must add).
 *
 * Libraries: the CUDA runtime is linked statically (about 1 MB); cuBLAS
 * (and NCCL, kernels/cuda/tp.h) are loaded with dlopen when a CUDA backend
 * is created, so CPU-only runs of the same binaries never map them (cuBLAS
 * alone would add ~150 MB of resident memory to every process).
 *
 * Errors: creation fails with a zi_error naming the device and the CUDA or
 * cuBLAS call. The ops of backend.h return nothing, so a failure inside one
 * (a launch error, a device fault) is recorded: zi_cuda_backend_status()
 * returns the first one, and later ops become no-ops.
 *
 * This header can be included by C code that is built without CUDA; the
 * functions exist only when the build defines ZI_HAVE_CUDA.
 */
#ifndef ZI_CUDA_BACKEND_H
#define ZI_CUDA_BACKEND_H

#include <stddef.h>

#include "backend.h"
#include "zi_error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zi_tp zi_tp;

typedef struct zi_cuda_options {
    int device; /* CUDA device ordinal, 0 .. zi_cuda_device_count() - 1 */
    /* Tensor parallelism (kernels/cuda/tp.h): NULL runs as a single rank
     * (the all-reduce after row-split projections is then a no-op). A
     * communicator of world size 1 with NCCL forced runs that all-reduce
     * through NCCL; world sizes above 1 are refused until the model shards
     * its attention (docs/cuda.md). Borrowed: must outlive the backend. */
    zi_tp *tp;
    /* fp16 copies of quantized weights for products of more than
     * ZI_CUDA_MMV_MAX_TOKENS tokens (cuBLAS reads fp16): 0, the default,
     * makes one on a weight's first such product while the device keeps
     * ZI_CUDA_F16_HEADROOM bytes free after it; 1 always; -1 never (each
     * product then dequantizes the weight into a scratch buffer first:
     * less memory, about three times the bytes moved per product). */
    int f16_weights;
} zi_cuda_options;

/* Device memory the automatic fp16 weight copies leave free. */
#define ZI_CUDA_F16_HEADROOM ((size_t)2 << 30)

/* Creates a backend on device o->device (o may be NULL: device 0). Fails
 * with ZI_EUNSUPPORTED when there is no such device or the CUDA driver or
 * cuBLAS cannot be loaded, naming the call and its error. */
int zi_cuda_backend_create(const zi_cuda_options *o, zi_backend **out, zi_error *err);

/* The number of CUDA devices. On failure (no driver, driver too old, no
 * device) *n is 0 and the error names cudaGetDeviceCount's error, e.g.
 * "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is
 * detected"; ZI_OK with *n == 0 never happens. */
int zi_cuda_device_count(int *n, zi_error *err);

/* "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB)" for device dev, into buf. */
int zi_cuda_device_name(int dev, char *buf, size_t cap, zi_error *err);

/* The first error an op hit (ZI_OK if none), with its message in err. */
int zi_cuda_backend_status(zi_backend *be, zi_error *err);

/* Bytes of fp16 weight copies the backend holds (zi_cuda_options). */
size_t zi_cuda_backend_f16_bytes(const zi_backend *be);

/* The backend's device and stream (a cudaStream_t), for modules that queue
 * work behind the model's (the GPU sampler, kernels/cuda/sampling.h). */
int zi_cuda_backend_device(const zi_backend *be);
void *zi_cuda_backend_stream(const zi_backend *be);

/*
 * CUDA graphs: a decode step of one shape captured once and replayed, so
 * its few hundred small kernels cost one launch.
 *
 * zi_cuda_graph_capture() runs fn(arg), which must queue exactly one pass
 * on the backend (zi_model_forward_async, say) of a shape that has run
 * before (so nothing allocates), and captures what it queues. The pass's
 * metadata (token ids, positions, sequence rows, block-table rows) reach
 * the device by copies out of the backend's pinned staging, captured with
 * the kernels; zi_cuda_graph_launch() writes a new pass's metadata into
 * that staging and launches the graph. The new pass must have the captured
 * shape: as many tokens, the same sequence rows in use (the table prefix
 * the pass reads) and positions inside the cache; what the kernels do is
 * fixed at capture (for the attention, only its split across blocks, which
 * changes speed, never results). The caller waits for the stream (sync())
 * before reading what a launch wrote, as for any pass.
 */
typedef struct zi_cuda_graph zi_cuda_graph;
typedef int (*zi_cuda_enqueue_fn)(void *arg, zi_error *err);
int zi_cuda_graph_capture(zi_backend *be, zi_cuda_enqueue_fn fn, void *arg, zi_cuda_graph **out,
                          zi_error *err);
/* ids: the pass's token ids (v->n_tokens of them, inside the vocabulary:
 * the model's batch checks do not run on a replay); v: the pass's
 * positions, sequence rows and block tables as the model's zi_batch has
 * them; s: block_size and max_ctx of the cache (the rest is not read). */
int zi_cuda_graph_launch(zi_cuda_graph *g, const int32_t *ids, const zi_batch_view *v,
                         const zi_attn_shape *s, zi_error *err);
/* 1 when the backend freed device or staging memory since g was captured
 * (a buffer grew for a larger pass, a weight was unloaded): g may read
 * freed memory, so zi_cuda_graph_launch refuses it; capture the pass
 * again (after a pass of its shape has run op by op). */
int zi_cuda_graph_stale(const zi_cuda_graph *g);
size_t zi_cuda_graph_nodes(const zi_cuda_graph *g); /* kernels and copies in it */
void zi_cuda_graph_free(zi_cuda_graph *g);

#ifdef __cplusplus
}
#endif

#endif
