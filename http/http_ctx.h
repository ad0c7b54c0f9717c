/*
 * http_ctx.h - the state of one zinfer-http process, in one struct that
 * http_main.c creates and passes down (no file-scope globals): the HTTP
 * settings, the router's address and how long to wait for it, the served
 * model once the router named it, and the text of single token ids (for
 * log probabilities). libmicrohttpd hands it back to the server's
 * callbacks as their `cls`; the endpoints and the router connection get it
 * as a parameter (a zi_http_conn remembers the context it was opened on).
 *
 * Threads: one per HTTP connection, all sharing the context. cfg, lim,
 * zctx and router_addr are set before serving and only read after; model
 * and tok change while serving and are guarded by their own mutex.
 */
#ifndef ZI_HTTP_CTX_H
#define ZI_HTTP_CTX_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "log.h"

/* The HTTP side's settings (http_server.h). */
typedef struct zi_http_config {
    char host[256]; /* listen address (name or IP) */
    int port;
    const char *api_key;      /* NULL or "": no key needed */
    size_t max_body;          /* bytes of one request body (else 413) */
    size_t max_header;        /* bytes of one request's header (MHD's per-connection memory) */
    unsigned max_connections; /* open connections at once (more are refused) */
    unsigned timeout_s;       /* a connection idle this long is closed */
    const zi_logger *lg;
} zi_http_config;

/* The waits the endpoints allow the router (http_endpoints.h). */
typedef struct zi_http_limits {
    int router_timeout_ms; /* the longest wait for the router's next reply */
    int health_timeout_ms; /* the longest wait for health / models / metrics */
} zi_http_limits;

/* The router's models op, remembered once it answered (the model of a
 * running server does not change); name is "" until then. */
typedef struct zi_http_model {
    pthread_mutex_t mu;
    char name[256];
    long long max_length;
} zi_http_model;

/* Token id -> text: an open-addressing table grown at half full; entries
 * are never removed (a vocabulary is finite), so a text stays valid until
 * zi_http_ctx_destroy. */
typedef struct zi_http_tok_cache {
    pthread_mutex_t mu;
    int64_t *ids;
    char **text;
    size_t cap, n;
} zi_http_tok_cache;

typedef struct zi_http_ctx {
    zi_http_config cfg;
    zi_http_limits lim;
    void *zctx;              /* the ZeroMQ context (the caller's; not terminated here) */
    const char *router_addr; /* the router's client address (the caller's string) */
    zi_http_model model;
    zi_http_tok_cache tok;
} zi_http_ctx;

/* Copies cfg and lim, keeps zctx and router_addr, and starts with no model
 * and no token texts known. 0, or -1 when a mutex cannot be made. */
int zi_http_ctx_init(zi_http_ctx *x, const zi_http_config *cfg, const zi_http_limits *lim,
                     void *zctx, const char *router_addr);
/* Frees the token texts and the mutexes; no thread may use x any more. */
void zi_http_ctx_destroy(zi_http_ctx *x);

#endif
