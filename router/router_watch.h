/*
 * router_watch.h - the router shell's socket monitors (router_watch.c):
 * which connection each frame came on, and which connections closed, on
 * the client and backend ROUTER sockets. What they find goes to the core
 * (router_core.h) as the zi_router_conn of each frame and as
 * zi_router_client_gone / zi_router_backend_gone. Part of the
 * zinfer-router executable only (it uses ZeroMQ); its names carry no
 * prefix for that reason.
 */
#ifndef ZI_ROUTER_WATCH_H
#define ZI_ROUTER_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "router_core.h"

/* What the shell knows of one connection fd of one socket, from its
 * monitor's events: the connections accepted and closed on it so far.
 * Connection number acc is open while acc > disc. */
typedef struct conn_rec {
    uint32_t acc, disc;
} conn_rec;

/* Both monitors: [0] the backend socket's, [1] the client socket's. */
typedef struct router_watch {
    void *mon[2];       /* NULL: no monitor (disconnects noticed the other ways) */
    conn_rec *conns[2]; /* indexed by fd */
    size_t n_conns[2];
} router_watch;

/* A frame arrived on connection fd (-1: unknown) of the client (front) or
 * backend socket: reads that socket's monitor first (events go to rt),
 * then returns the frame's connection; *stale is set when that
 * connection had already closed before the frame was read. */
zi_router_conn watch_frame(router_watch *w, zi_router *rt, int fd, bool front, bool *stale);

/* Starts the monitor of sock (w->mon[front]), which reports its
 * connections accepted and closed; on failure it is NULL (logged:
 * disconnects are then noticed the other ways). Returns ZI_OK or ZI_EIO. */
int watch_start(router_watch *w, const zi_logger *log, void *zctx, void *sock, bool front);

/* Handles the events ready on the monitor of the client (front) or
 * backend socket: a connection that closed goes to rt (its client's
 * requests are cancelled without a reply, its backend dies). */
void watch_drain(router_watch *w, zi_router *rt, bool front);

/* Closes the monitors and frees the tables. */
void watch_stop(router_watch *w);

#endif
