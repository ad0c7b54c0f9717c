/*
 * tp.c - see tp.h. Compiled in every build: the split rules and the
 * one-rank communicator need neither CUDA nor NCCL; the NCCL parts exist
 * only under ZI_HAVE_NCCL and reach the library through dlopen, so linking
 * this file never pulls libnccl into a process.
 */
#include "tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZI_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>

_Static_assert(sizeof(ncclUniqueId) == ZI_TP_ID_BYTES, "zi_tp_id is an ncclUniqueId");
#endif

struct zi_tp {
    int world, rank, device;
    int nccl; /* 1: all-reduce through comm */
#ifdef ZI_HAVE_NCCL
    ncclComm_t comm;
#endif
};

/* ---- split rules ---- */

static int ends_with(const char *s, size_t len, const char *suffix) {
    size_t n = strlen(suffix);
    return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

zi_tp_split zi_tp_split_for_tensor(const char *name, size_t len) {
    if (!name) return ZI_TP_REPLICATED;
    /* only the per-layer blocks ("blk.N.<what>.weight") are split */
    if (len < 4 || memcmp(name, "blk.", 4) != 0) return ZI_TP_REPLICATED;
    static const char *const rows[] = {".attn_q.weight", ".attn_k.weight", ".attn_v.weight",
                                       ".ffn_gate.weight", ".ffn_up.weight"};
    static const char *const cols[] = {".attn_output.weight", ".ffn_down.weight"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (ends_with(name, len, rows[i])) return ZI_TP_SPLIT_ROWS;
    for (size_t i = 0; i < sizeof cols / sizeof cols[0]; i++)
        if (ends_with(name, len, cols[i])) return ZI_TP_SPLIT_COLS;
    return ZI_TP_REPLICATED;
}

int zi_tp_shard(int64_t n, int64_t unit, int world, int rank, int64_t *lo, int64_t *hi,
                zi_error *err) {
    if (world < 1 || rank < 0 || rank >= world)
        return zi_error_set(err, ZI_EINVAL, "tensor parallel: rank %d outside 0..%d", rank,
                            world - 1);
    if (n < 0 || unit < 1 || n % unit != 0)
        return zi_error_set(err, ZI_EINVAL,
                            "tensor parallel: %lld elements are not whole units of %lld",
                            (long long)n, (long long)unit);
    int64_t units = n / unit;
    if (units % world != 0)
        return zi_error_set(err, ZI_EINVAL,
                            "tensor parallel: %lld units of %lld elements do not split evenly "
                            "over %d ranks",
                            (long long)units, (long long)unit, world);
    int64_t per = units / world;
    *lo = (int64_t)rank * per * unit;
    *hi = *lo + per * unit;
    return ZI_OK;
}

/* ---- NCCL, loaded on first use ---- */

#ifdef ZI_HAVE_NCCL
static struct {
    pthread_once_t once;
    void *lib;
    char why[256]; /* why loading failed */
    ncclResult_t (*get_unique_id)(ncclUniqueId *);
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*comm_destroy)(ncclComm_t);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                               ncclComm_t, cudaStream_t);
    const char *(*error_string)(ncclResult_t);
} nccl = {.once = PTHREAD_ONCE_INIT};

/* dlsym's void * into a function pointer, without the ISO C cast. */
static int sym(void *lib, const char *name, void *fn_ptr, size_t fn_size) {
    void *p = dlsym(lib, name);
    if (!p) return 0;
    memcpy(fn_ptr, &p, fn_size);
    return 1;
}

static void nccl_load(void) {
    const char *names[] = {"libnccl.so.2", "libnccl.so"};
    for (size_t i = 0; i < 2 && !nccl.lib; i++) nccl.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!nccl.lib) {
        const char *e = dlerror();
        snprintf(nccl.why, sizeof nccl.why, "cannot load libnccl.so.2: %s", e ? e : "not found");
        return;
    }
#define ZI_SYM(field, name)                                                                        \
    if (!sym(nccl.lib, name, &nccl.field, sizeof nccl.field)) {                                    \
        snprintf(nccl.why, sizeof nccl.why, "libnccl.so.2 has no symbol %s", name);                \
        dlclose(nccl.lib);                                                                         \
        nccl.lib = NULL;                                                                           \
        return;                                                                                    \
    }
    ZI_SYM(get_unique_id, "ncclGetUniqueId")
    ZI_SYM(comm_init_rank, "ncclCommInitRank")
    ZI_SYM(comm_destroy, "ncclCommDestroy")
    ZI_SYM(all_reduce, "ncclAllReduce")
    ZI_SYM(error_string, "ncclGetErrorString")
#undef ZI_SYM
}

static int nccl_ready(zi_error *err) {
    pthread_once(&nccl.once, nccl_load);
    if (!nccl.lib) return zi_error_set(err, ZI_EUNSUPPORTED, "NCCL: %s", nccl.why);
    return ZI_OK;
}

static int nccl_fail(zi_error *err, const char *call, ncclResult_t r) {
    return zi_error_set(err, ZI_EIO, "NCCL: %s: %s (%d)", call, nccl.error_string(r), (int)r);
}
#endif

int zi_tp_nccl_compiled(void) {
#ifdef ZI_HAVE_NCCL
    return 1;
#else
    return 0;
#endif
}

int zi_tp_new_id(zi_tp_id *id, zi_error *err) {
#ifdef ZI_HAVE_NCCL
    int rc = nccl_ready(err);
    if (rc) return rc;
    ncclUniqueId u;
    ncclResult_t r = nccl.get_unique_id(&u);
    if (r != ncclSuccess) return nccl_fail(err, "ncclGetUniqueId", r);
    memcpy(id->bytes, &u, sizeof u);
    return ZI_OK;
#else
    (void)id;
    return zi_error_set(err, ZI_EUNSUPPORTED,
                        "tensor parallelism needs NCCL, and this zinfer was built without it "
                        "(nccl.h / libnccl not found at configure time)");
#endif
}

int zi_tp_create(const zi_tp_options *o, zi_tp **out, zi_error *err) {
    if (!o || !out) return zi_error_set(err, ZI_EINVAL, "tensor parallel: NULL options or out");
    *out = NULL;
    if (o->world_size < 1 || o->world_size > 1024 || o->rank < 0 || o->rank >= o->world_size)
        return zi_error_set(err, ZI_EINVAL, "tensor parallel: rank %d of world size %d", o->rank,
                            o->world_size);
    int use_nccl = o->world_size > 1 || o->force_nccl;
    if (use_nccl && o->world_size > 1 && !o->id)
        return zi_error_set(err, ZI_EINVAL,
                            "tensor parallel: %d ranks need the rendezvous id of rank 0",
                            o->world_size);
#ifndef ZI_HAVE_NCCL
    if (use_nccl)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tensor parallelism over NCCL (world size %d%s): this zinfer was "
                            "built without NCCL (nccl.h / libnccl not found at configure time)",
                            o->world_size, o->force_nccl ? ", NCCL forced" : "");
#endif
    zi_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return zi_error_set(err, ZI_ENOMEM, "tensor parallel: out of memory");
    tp->world = o->world_size;
    tp->rank = o->rank;
    tp->device = o->device;
#ifdef ZI_HAVE_NCCL
    if (use_nccl) {
        int rc = nccl_ready(err);
        zi_tp_id own;
        if (!rc && !o->id) rc = zi_tp_new_id(&own, err); /* one rank: its own rendezvous */
        if (rc) {
            free(tp);
            return rc;
        }
        ncclUniqueId u;
        memcpy(&u, o->id ? o->id->bytes : own.bytes, sizeof u);
        cudaError_t ce = cudaSetDevice(o->device);
        if (ce != cudaSuccess) {
            (void)cudaGetLastError(); /* reported here, not by a later launch check */
            free(tp);
            return zi_error_set(err, ZI_EUNSUPPORTED, "tensor parallel: cudaSetDevice(%d): %s",
                                o->device, cudaGetErrorString(ce));
        }
        ncclResult_t r = nccl.comm_init_rank(&tp->comm, o->world_size, u, o->rank);
        if (r != ncclSuccess) {
            free(tp);
            return nccl_fail(err, "ncclCommInitRank", r);
        }
        tp->nccl = 1;
    }
#endif
    *out = tp;
    return ZI_OK;
}

void zi_tp_free(zi_tp *tp) {
    if (!tp) return;
#ifdef ZI_HAVE_NCCL
    if (tp->nccl) nccl.comm_destroy(tp->comm);
#endif
    free(tp);
}

int zi_tp_world_size(const zi_tp *tp) {
    return tp ? tp->world : 1;
}
int zi_tp_rank(const zi_tp *tp) {
    return tp ? tp->rank : 0;
}
int zi_tp_uses_nccl(const zi_tp *tp) {
    return tp ? tp->nccl : 0;
}

int zi_tp_all_reduce_sum(zi_tp *tp, float *buf, size_t n, void *stream, zi_error *err) {
    if (!tp || !tp->nccl || n == 0) return ZI_OK; /* one rank: the sum is the buffer */
#ifdef ZI_HAVE_NCCL
    ncclResult_t r =
        nccl.all_reduce(buf, buf, n, ncclFloat32, ncclSum, tp->comm, (cudaStream_t)stream);
    if (r != ncclSuccess) return nccl_fail(err, "ncclAllReduce", r);
    return ZI_OK;
#else
    (void)buf;
    (void)stream;
    return zi_error_set(err, ZI_EUNSUPPORTED, "tensor parallel: built without NCCL");
#endif
}
