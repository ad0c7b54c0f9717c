/*
 * tp.h - tensor parallelism: the communicator a group of GPUs uses to sum
 * partial results (NCCL all-reduce), and the rules saying which weights are
 * split how.
 *
 * The split is Megatron's for a Llama block. Q/K/V and gate/up are split by
 * output rows: each rank computes its own heads and its own slice of the
 * feed-forward, with no communication. attn_output and ffn_down are split
 * by input columns: each rank multiplies its slice of the input by its
 * slice of the columns, and the partial outputs are summed over the ranks
 * by an all-reduce, the only communication (two per layer). Embeddings,
 * norms and the output head are replicated.
 *
 * The CUDA backend calls zi_tp_all_reduce_sum() after every product with a
 * column-split weight. With one rank that call returns at once (unless NCCL
 * is forced, which runs a real one-rank NCCL all-reduce: how a single GPU
 * tests the path), so a single GPU runs the same code as a group. The model
 * does not shard its attention yet, so the backend refuses world sizes
 * above 1 for now (docs/cuda.md).
 *
 * NCCL is optional at build time: meson defines ZI_HAVE_NCCL only when
 * nccl.h and libnccl are found. It is loaded with dlopen on first use
 * (libnccl is ~220 MB; processes that do not use it never map it). Without
 * ZI_HAVE_NCCL, world size 1 works and anything needing NCCL fails with
 * ZI_EUNSUPPORTED saying so.
 *
 * The pure functions (split rules, shard ranges) need no GPU and are unit
 * tested on the CPU.
 */
#ifndef ZI_TP_H
#define ZI_TP_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

typedef enum zi_tp_split {
    ZI_TP_REPLICATED = 0, /* every rank holds the whole tensor */
    ZI_TP_SPLIT_ROWS = 1, /* output features split; no communication */
    ZI_TP_SPLIT_COLS = 2, /* input features split; outputs all-reduced */
} zi_tp_split;

/* How tensor `name` (GGUF name, len bytes, not NUL-terminated) is split. */
zi_tp_split zi_tp_split_for_tensor(const char *name, size_t len);

/* Rank `rank`'s slice [*lo, *hi) of n elements split over world ranks in
 * whole units of `unit` elements (a head: head_dim; a quantized block: 32).
 * ZI_EINVAL naming the numbers when n is not a multiple of unit or the
 * units do not divide evenly over the ranks. */
int zi_tp_shard(int64_t n, int64_t unit, int world, int rank, int64_t *lo, int64_t *hi,
                zi_error *err);

/* The rendezvous id rank 0 creates and sends to the others (e.g. over the
 * router's ZeroMQ connection). Same size as NCCL's ncclUniqueId. */
#define ZI_TP_ID_BYTES 128
typedef struct zi_tp_id {
    unsigned char bytes[ZI_TP_ID_BYTES];
} zi_tp_id;

typedef struct zi_tp_options {
    int world_size;     /* ranks in the group, >= 1 */
    int rank;           /* this process's rank, 0 .. world_size - 1 */
    int device;         /* CUDA device of this rank */
    const zi_tp_id *id; /* from rank 0's zi_tp_new_id; NULL allowed for world_size 1 */
    int force_nccl;     /* world_size 1: still run the all-reduce through NCCL */
} zi_tp_options;

typedef struct zi_tp zi_tp;

/* 1 when this build can use NCCL (ZI_HAVE_NCCL). */
int zi_tp_nccl_compiled(void);

/* A fresh rendezvous id (loads NCCL). */
int zi_tp_new_id(zi_tp_id *id, zi_error *err);

/* Joins the group (NCCL's ncclCommInitRank, which blocks until every rank
 * has joined). World size 1 without force_nccl touches neither NCCL nor
 * the GPU. */
int zi_tp_create(const zi_tp_options *o, zi_tp **out, zi_error *err);
void zi_tp_free(zi_tp *tp);

int zi_tp_world_size(const zi_tp *tp);
int zi_tp_rank(const zi_tp *tp);
int zi_tp_uses_nccl(const zi_tp *tp);

/* buf[0..n) (device floats) = the sum of every rank's buf, in place,
 * queued on `stream` (a cudaStream_t). A no-op for one rank without NCCL.
 * Capturable in a CUDA graph (NCCL >= 2.9). */
int zi_tp_all_reduce_sum(zi_tp *tp, float *buf, size_t n, void *stream, zi_error *err);

#endif
