/*
 * wire.h - frames over ZeroMQ: sending a (routed) frame or a built message
 * (msg.h), and a backend's DEALER socket to the router. The router,
 * tokenizer and worker processes send with these; what a message holds is
 * built with msg.h and encoded by imsg.h (internal messages) and codec.h
 * (requests, contexts).
 */
#ifndef ZI_WIRE_H
#define ZI_WIRE_H

#include <stdbool.h>
#include <stddef.h>

#include "msg.h"
#include "zi_error.h"

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

/* Sends a built message to a backend's router (a DEALER socket: no
 * routing frames) and frees it; zi_send_msg's result (a failed encoder's
 * empty message is not sent: -1). */
int zi_im_send(void *sock, zi_msg *m);

/* ZMTP heartbeats of a backend's connection to the router, on both ends
 * (zi_backend_socket, router.c): a PING every IVL ms; a connection with
 * nothing from the other side for TIMEOUT ms after one is dropped, and
 * the backend makes it again, each attempt bounded by CONNECT_TIMEOUT ms
 * (docs/deploy.md). */
#define ZI_BACKEND_HB_IVL_MS 1000
#define ZI_BACKEND_HB_TIMEOUT_MS 5000
#define ZI_BACKEND_CONNECT_TIMEOUT_MS 3000

/* A backend's DEALER socket connected to the router at `router`: no linger,
 * deep queues, and a 1 s send timeout, so a long-gone router cannot freeze
 * the process (its successor asks backends to register again); ZMTP
 * heartbeats and a bounded connect, so a router host that went silent is
 * reconnected to soon after it is reachable again; a CURVE client when
 * curve is on (NULL: plain; protocol/curve.h). NULL with err set when the
 * address is bad. */
struct zi_curve_client;
void *zi_backend_socket(void *zctx, const char *router, const struct zi_curve_client *curve,
                        zi_error *err);

#endif
