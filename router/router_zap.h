/*
 * router_zap.h - the router's ZAP handler (ZeroMQ's authentication
 * protocol, RFC 27): decides which CURVE public keys may connect to the
 * router's sockets (docs/security.md).
 *
 * The handler is a thread with a REP socket on inproc://zeromq.zap.01 in
 * the router's ZeroMQ context; libzmq asks it about every CURVE handshake.
 * The socket's ZAP domain says which list applies: "backend" (workers and
 * tokenizers, --backend-keys) or "client" (--client-keys). A key not
 * listed is refused (status 400); each refused key is logged once per
 * socket, with
 * its first characters and the peer's address. Everything the thread uses
 * is in its zi_zap struct: the lists are read-only after start, the
 * "already logged" set is the thread's alone.
 */
#ifndef ZI_ROUTER_ZAP_H
#define ZI_ROUTER_ZAP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "curve.h"
#include "log.h"

#define ZI_ZAP_DOMAIN_BACKEND "backend"
#define ZI_ZAP_DOMAIN_CLIENT "client"
#define ZI_ZAP_LOGGED_MAX 1024 /* refused keys remembered for "log once" */

typedef struct zi_zap {
    const zi_curve_keys *backend; /* allowed on the backend socket */
    const zi_curve_keys *client;  /* allowed on the client socket; NULL: any */
    const zi_logger *log;
    void *sock; /* REP on inproc://zeromq.zap.01 */
    pthread_t thread;
    bool running;
    atomic_bool stop;
    uint8_t (*logged)[33]; /* refused (socket, key) pairs already logged: the
                              socket's byte ('b' or 'c'), then the key
                              [ZI_ZAP_LOGGED_MAX] */
    size_t n_logged;
    bool logged_full; /* said that further refusals go unlogged */
} zi_zap;

/* Binds the handler's socket in zctx (before any CURVE socket binds) and
 * starts its thread. The lists and the logger must outlive zi_zap_stop. */
int zi_zap_start(zi_zap *z, void *zctx, const zi_curve_keys *backend, const zi_curve_keys *client,
                 const zi_logger *lg, zi_error *err);
/* Stops the thread (within 200 ms) and closes its socket; before
 * zmq_ctx_term. Safe on a handler never started. */
void zi_zap_stop(zi_zap *z);

/* The decision on one handshake, logging a refusal (once per key and
 * socket): true
 * when the key may connect. Exposed for tests; the thread calls it. */
bool zi_zap_allow(zi_zap *z, const char *domain, size_t domain_len, const char *address,
                  size_t address_len, const uint8_t *key, size_t key_len);

#endif
