/*
 * kv_disk.h - the disk tier of the paged KV cache's prefix blocks
 * (--kv-disk DIR, --kv-disk-bytes N; docs/engine.md, "The disk tier").
 *
 * A full block that the prefix cache registered (kv_blocks.h) is written
 * to DIR as one file, so that a later request with the same prefix finds
 * its K/V there after the block has left memory, or after the worker
 * restarted (a SIGKILL and the supervisor's restart, a failover's
 * replacement). Writes are asynchronous: the step copies the block into a
 * bounded queue (zi_kv_disk_write_begin) and a writer thread writes the
 * file; when the queue is full the write is dropped, never waited for.
 * Reads are synchronous (zi_kv_disk_read, at a request's admission).
 *
 * Files are content-addressed: the name is
 *   zkv-<identity>-<prefix hash>.blk
 * with identity a 64-bit hash of everything that decides a block's bytes
 * (zi_kv_disk_identity: the model file's weights and metadata, the KV
 * type and layout, the block size and layer/head shape) and prefix hash the
 * block's chained hash (kv_blocks.h). The file holds a header (magic,
 * version, the whole identity, the hash and its parent, the block's tokens,
 * the payload's size and checksum, the header's own checksum), then the
 * payload. A reader checks all of it and loads nothing from a file that is
 * corrupt (a checksum or magic fails), truncated (a size is short), foreign
 * (another model's identity) or stale (another format version, KV type or
 * layout); it logs each kind once, counts it, and removes the file so
 * that a good one can take its place. A file whose tokens differ from the
 * ones looked up (a 64-bit hash collision) is a miss.
 *
 * Several workers may share DIR: a file is written under a temporary name
 * and renamed into place (readers see a whole file or none), and readers
 * verify the checksum. The directory's size is bounded by max_bytes: the
 * writer thread tracks the bytes it adds and re-measures DIR (every
 * worker's files) when that passes the bound, or every 256 writes, then
 * removes the least recently used files (by modification time; a read hit
 * touches its file) until DIR holds at most 90% of the bound. With several
 * workers the bound holds up to what the others wrote since the last
 * measurement.
 *
 * A directory that cannot be created, written (read-only, full) or read
 * costs only the disk tier's hits: every request is still served, its
 * prefix computed (cold); each kind of failure is logged once.
 *
 * Thread safety: one thread (the generator's) calls everything here; the
 * writer thread is internal.
 */
#ifndef ZI_KV_DISK_H
#define ZI_KV_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "log.h"
#include "zi_error.h"

/* The file format's version: a file of another one is stale. */
#define ZI_KV_DISK_VERSION 1

/* What decides a block's bytes. Two workers share a file only when all of
 * it is equal. */
typedef struct zi_kv_disk_identity {
    uint64_t model; /* zi_kv_disk_model_id of the model file */
    /* The KV type and the computation behind it, from the backend: "cpu
     * k2+4 v2 avx512 a16" (its name, K and V value bytes, on the CPU the
     * kernels' ISA and activation bits); a worker with another --kv-type,
     * --act-bits or ISA writes other files. */
    char kv_tag[48];
    uint32_t block_size; /* positions per block */
    uint32_t n_layers;   /* layers with K/V */
    uint32_t n_kv_heads, head_dim;
    uint64_t k_bytes, v_bytes; /* one block's K and V in one layer, in bytes */
} zi_kv_disk_identity;

/* A 64-bit identity of a model file's contents: its size, every metadata
 * key with its value (string arrays by their length: the vocabulary does
 * not change K/V), and every tensor's name, type, shape, offset and the
 * first and last 256 bytes of its data. Cheap at load (no pass over the
 * weights), and different for any other model or quantization. */
uint64_t zi_kv_disk_model_id(const zi_gguf *g);

/* The payload's bytes: n_layers * (k_bytes + v_bytes), layer by layer, K
 * then V (zi_kv_cache_read_block's order). */
uint64_t zi_kv_disk_payload_bytes(const zi_kv_disk_identity *id);

/* One block's file, header and tokens included: what a block takes in
 * DIR (zinfer info reports it). */
uint64_t zi_kv_disk_file_bytes(const zi_kv_disk_identity *id);

/* Counters (zi_kv_disk_get_stats); times in microseconds. */
typedef struct zi_kv_disk_stats {
    uint64_t hit_blocks;     /* blocks read back */
    uint64_t miss_blocks;    /* lookups that found no usable file */
    uint64_t rejected;       /* files found corrupt, truncated, foreign or stale */
    uint64_t written_blocks; /* files written */
    uint64_t dropped_writes; /* blocks not written: the queue was full, or a write failed */
    uint64_t read_us, write_us;
    uint64_t bytes; /* in DIR, as last measured plus what this worker wrote since */
} zi_kv_disk_stats;

typedef struct zi_kv_disk zi_kv_disk;

/*
 * Opens the tier on dir (created when missing, one level), bounded by
 * max_bytes (> 0), with at most queue_bytes of blocks waiting to be
 * written (at least 4 blocks' worth). Starts the writer thread, which first
 * measures the directory and removes temporary files older than a minute
 * (left by a killed writer). log (may be NULL) gets each problem once.
 * Fails only on bad arguments, memory or the thread; a directory that
 * cannot be used is logged and leaves the tier working as all misses.
 */
int zi_kv_disk_open(const char *dir, uint64_t max_bytes, uint64_t queue_bytes,
                    const zi_kv_disk_identity *id, const zi_logger *log, zi_kv_disk **out,
                    zi_error *err);
/* Writes what is queued, stops the writer and frees everything. */
void zi_kv_disk_close(zi_kv_disk *d);

/*
 * Queues the block of hash `hash` (its parent's hash `parent`, its
 * block_size tokens) for writing: returns the buffer of
 * zi_kv_disk_payload_bytes bytes to fill with its K/V, then call
 * zi_kv_disk_write_commit. NULL when the queue is full (the write is
 * dropped, counted). Nothing else may be called between the two.
 */
void *zi_kv_disk_write_begin(zi_kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens);
void zi_kv_disk_write_commit(zi_kv_disk *d);

/*
 * Looks up the block of hash `hash` (parent, tokens as above) and reads
 * its payload into `payload` (zi_kv_disk_payload_bytes bytes). 1: found
 * and verified, payload filled; 0: a miss (no file, another prefix under
 * the same hash, or a file rejected as the top of this file says).
 */
int zi_kv_disk_read(zi_kv_disk *d, uint64_t hash, uint64_t parent, const int32_t *tokens,
                    void *payload);

void zi_kv_disk_get_stats(zi_kv_disk *d, zi_kv_disk_stats *out);

/* Waits until the queue is empty (tests; zi_kv_disk_close does it too). */
void zi_kv_disk_flush(zi_kv_disk *d);

/*
 * The tier's sharing id: two workers' ids are equal exactly when they
 * read each other's files, that is when their directories are the same
 * one (the same DIR on one host, or one network share seen from several)
 * and their files' identity is the same (zi_kv_disk_identity). It is a
 * hash of both: the directory by the random id in its id file
 * (ZI_KV_DISK_DIR_ID_FILE, created on first use, so that two paths to one
 * directory agree and two directories with the same path on two hosts do
 * not), the identity by its hash. Never 0, except when the id file can be
 * neither read nor created (logged once): then 0. The worker reports it
 * in its register so that the router's prefix affinity knows which
 * workers share a disk tier (docs/architecture.md).
 */
uint64_t zi_kv_disk_share_id(const zi_kv_disk *d);

/* The file in DIR that names it: 16 hex digits and a newline. */
#define ZI_KV_DISK_DIR_ID_FILE "zinfer-kv-dir.id"

/* The path of the file of hash `hash` under d (for tests and logs). */
void zi_kv_disk_path(const zi_kv_disk *d, uint64_t hash, char *out, size_t cap);

#endif
