/*
 * http_server.h - zinfer-http's HTTP side on libmicrohttpd: the listening
 * socket, one thread per connection (a blocking wait for the router's
 * tokens costs a thread, never a busy loop), the limits that keep a slow
 * or hostile client from holding a thread or memory forever (connections,
 * body size, header size, inactivity timeout), the API key, and the
 * streaming of Server-Sent Events. What each path answers is
 * http_endpoints.h.
 */
#ifndef ZI_HTTP_SERVER_H
#define ZI_HTTP_SERVER_H

#include <stddef.h>

#include "log.h"

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

/* Serves until SIGINT/SIGTERM (zi_stop_requested). 0, or 1 when the
 * address cannot be listened on (the message is logged). */
int zi_http_serve(const zi_http_config *cfg);

#endif
