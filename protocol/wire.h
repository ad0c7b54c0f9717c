/*
 * wire.h - the small pieces every zinfer process uses to talk over ZeroMQ:
 * building one msgpack map per frame, reading fields out of a parsed map,
 * sending a (routed) frame, and a monotonic clock for heartbeats.
 *
 * The router, tokenizer and worker processes (router/, tokenizer_proc/,
 * model_worker/) send and receive with these helpers; each internal message
 * is encoded and decoded by protocol/imsg.h, and the types it carries
 * (requests, contexts) by protocol/codec.h.
 */
#ifndef ZI_WIRE_H
#define ZI_WIRE_H

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

/* Sends data as one frame, preceded by the routing frames of a ROUTER
 * socket when ident is not NULL (ident, then an empty delimiter frame when
 * delim is set). Returns 0, or -1 with errno set (EHOSTUNREACH when a
 * ROUTER_MANDATORY peer is gone). Never blocks on a full queue for longer
 * than the socket's send timeout. */
int zi_send(void *sock, const void *ident, size_t ident_len, bool delim, const void *data,
            size_t len);
/* zi_send of a built message; an empty one (a failed encoder's) is not
 * sent: -1 with errno EINVAL. */
int zi_send_msg(void *sock, const void *ident, size_t ident_len, bool delim, const zi_msg *m);

/* Milliseconds of CLOCK_MONOTONIC. */
int64_t zi_now_ms(void);

/* The field path at the start of an error message ("sampling_params.top_p:
 * ..." gives "sampling_params.top_p"), copied into out (cap bytes); empty
 * when the message does not start with one. */
void zi_error_field(const char *msg, char *out, size_t cap);

/* A backend's DEALER socket connected to the router at `router`: no linger,
 * deep queues, and a 1 s send timeout, so a long-gone router cannot freeze
 * the process (its successor asks backends to register again); a CURVE
 * client when curve is on (NULL: plain; protocol/curve.h). NULL with err set
 * when the address is bad. */
struct zi_curve_client;
void *zi_backend_socket(void *zctx, const char *router, const struct zi_curve_client *curve,
                        zi_error *err);

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
    ZI_KV_SPEC_STEPS,    /* speculation (docs/speculative.md): verifications, */
    ZI_KV_SPEC_DRAFTED,  /* draft tokens fed, */
    ZI_KV_SPEC_ACCEPTED, /* and accepted */
    ZI_N_KV_STATS
};
extern const char *const zi_kv_stat_names[ZI_N_KV_STATS];

#endif
