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

#include "http_ctx.h"

/* Serves until SIGINT/SIGTERM (zi_stop_requested). 0, or 1 when the
 * address cannot be listened on (the message is logged). The settings are
 * ctx->cfg; ctx is what every callback and endpoint gets. */
int zi_http_serve(zi_http_ctx *ctx);

#endif
