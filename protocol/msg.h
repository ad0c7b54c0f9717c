/*
 * msg.h - one msgpack map per frame: building a message, packing keys and
 * values, reading fields out of a parsed map, a monotonic clock, the field
 * an error message names, and the KV counters a heartbeat carries. No
 * sockets: the encoders (imsg.h) and the router core use these without
 * ZeroMQ; sending is wire.h's.
 */
#ifndef ZI_MSG_H
#define ZI_MSG_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "codec.h" /* zi_map_get */
#include "zi_error.h"

/* A message being built: a growing buffer and a packer writing into it. */
typedef struct zi_msg {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} zi_msg;

void zi_msg_init(zi_msg *m);
void zi_msg_free(zi_msg *m);

/* Packs a string (NUL-terminated, or n bytes). */
void zi_pack_str(msgpack_packer *pk, const char *s);
void zi_pack_strn(msgpack_packer *pk, const char *s, size_t n);
/* Packs a key followed by a string / integer / bool value. */
void zi_pack_kv_str(msgpack_packer *pk, const char *key, const char *val);
void zi_pack_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t n);
void zi_pack_kv_int(msgpack_packer *pk, const char *key, int64_t val);
void zi_pack_kv_bool(msgpack_packer *pk, const char *key, bool val);

/* The string under key: *s and *n point into the object. ZI_EINVAL when absent
 * or not a string (message names key). */
int zi_map_str(const msgpack_object *o, const char *key, const char **s, size_t *n, zi_error *err);
/* The integer under key (ZI_EINVAL when absent or not an integer). */
int zi_map_int(const msgpack_object *o, const char *key, int64_t *out, zi_error *err);
/* True when key holds the string s. */
bool zi_map_str_is(const msgpack_object *o, const char *key, const char *s);

/* Milliseconds of CLOCK_MONOTONIC. */
int64_t zi_now_ms(void);

/* The field path at the start of an error message ("sampling_params.top_p:
 * ..." gives "sampling_params.top_p"), copied into out (cap bytes); empty
 * when the message does not start with one. */
void zi_error_field(const char *msg, char *out, size_t cap);

/* The KV-cache counters a worker's heartbeat carries in its "kv" map, and
 * that `health` sums (docs/protocol.md): indices into zi_kv_stat_names. */
enum {
    ZI_KV_BLOCKS,
    ZI_KV_BLOCK_SIZE,
    ZI_KV_USED,
    ZI_KV_CACHED,
    ZI_KV_FREE,
    ZI_KV_PREFIX_QUERY_TOKENS,
    ZI_KV_PREFIX_HIT_TOKENS,
    ZI_KV_PREEMPTIONS,
    ZI_KV_EVICTIONS,
    ZI_KV_SPEC_STEPS,      /* speculation (docs/speculative.md): verifications, */
    ZI_KV_SPEC_DRAFTED,    /* draft tokens fed, */
    ZI_KV_SPEC_ACCEPTED,   /* and accepted */
    ZI_KV_IMAGE_TILES,     /* images (--mmproj): tiles run through the tower, */
    ZI_KV_IMAGE_ENCODE_US, /* and the microseconds that took */
    /* the prefix cache per tier, in blocks (docs/engine.md, "The disk tier"): */
    ZI_KV_MEM_HIT_BLOCKS,   /* found in memory, */
    ZI_KV_MEM_MISS_BLOCKS,  /* lookups memory could not answer, */
    ZI_KV_DISK_HIT_BLOCKS,  /* read back from --kv-disk, */
    ZI_KV_DISK_MISS_BLOCKS, /* lookups the disk could not answer; */
    ZI_KV_DISK_BYTES,       /* bytes in the --kv-disk directory, */
    ZI_KV_DISK_WRITTEN,     /* block files written, */
    ZI_KV_DISK_DROPPED,     /* blocks not written (queue full, write failed), */
    ZI_KV_DISK_REJECTED,    /* files ignored (corrupt, truncated, foreign, stale), */
    ZI_KV_DISK_READ_US,     /* microseconds reading, */
    ZI_KV_DISK_WRITE_US,    /* and writing (the writer thread's) */
    ZI_KV_ORPHANS_DROPPED,  /* sequences dropped when no router came back (--orphan-timeout) */
    ZI_N_KV_STATS
};
extern const char *const zi_kv_stat_names[ZI_N_KV_STATS];

#endif
