/*
 * router_watch.c - the router shell's socket monitors (router_watch.h;
 * router_impl.h lists the router's files).
 *
 * A ZeroMQ socket monitor on each ROUTER socket reports
 * ZMQ_EVENT_ACCEPTED and ZMQ_EVENT_DISCONNECTED with the connection's file
 * descriptor, not the peer's routing id (ZMQ_ROUTER_NOTIFY, which would give
 * the id, is a draft option this libzmq build refuses). Every frame read
 * carries its connection's fd (ZMQ_SRCFD). When a connection closes, the
 * core hears of it (zi_router_client_gone, zi_router_backend_gone: a
 * client's requests in flight from it are cancelled, a backend dies).
 * ZeroMQ heartbeats on the client socket (--client-heartbeat) close
 * connections whose peer went silent, which the monitor then reports.
 *
 * The kernel reuses an fd once it is closed, and the events and the frames
 * arrive on different queues, so a frame must be matched to the right
 * connection on its fd. The monitor's events come in order (one I/O
 * thread), and a connection's ACCEPTED event is queued before any frame of
 * it can be read. So the monitor is read before every frame: the frame then
 * belongs to the last connection accepted on its fd (number acc), or, when
 * that one has closed too (acc == disc), to a connection already gone: such
 * a stale frame's request is cancelled at once (router.c). A request or
 * backend remembers (fd, number), and a DISCONNECTED event ends exactly the
 * connection numbered acc on its fd: never a newer connection that reuses
 * the fd. (A frame of an older, closed connection read after a newer one
 * was accepted is taken as the newer one's: its request is then cancelled
 * when the newer one closes, late but never wrongly.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "router_watch.h"
#include "zi_error.h"

/* The largest fd tracked; a peer on a larger one is noticed only by the
 * other ways (a failed send, heartbeats). */
#define WATCH_MAX_FD (1 << 20)

/* Connection number epoch on fd has closed. */
static void peer_gone(zi_router *rt, int fd, uint32_t epoch, bool front) {
    zi_router_conn c = {fd, epoch};
    if (front)
        zi_router_client_gone(rt, c);
    else
        zi_router_backend_gone(rt, c);
}

/* The record of fd on socket s (0 backend, 1 client), grown as needed;
 * NULL when not tracked. */
static conn_rec *conn_at(router_watch *w, int s, int fd) {
    if (fd < 0 || fd >= WATCH_MAX_FD) return NULL;
    if ((size_t)fd >= w->n_conns[s]) {
        size_t n = w->n_conns[s] ? w->n_conns[s] : 64;
        while (n <= (size_t)fd) n *= 2;
        conn_rec *p = realloc(w->conns[s], n * sizeof *p);
        if (!p) return NULL; /* not tracked: noticed the other ways */
        memset(p + w->n_conns[s], 0, (n - w->n_conns[s]) * sizeof *p);
        w->conns[s] = p, w->n_conns[s] = n;
    }
    return &w->conns[s][fd];
}

zi_router_conn watch_frame(router_watch *w, zi_router *rt, int fd, bool front, bool *stale) {
    watch_drain(w, rt, front);
    zi_router_conn c = {fd, 0};
    *stale = false;
    if (!w->mon[front]) return c;
    conn_rec *cr = (size_t)fd < w->n_conns[front] && fd >= 0 ? &w->conns[front][fd] : NULL;
    if (!cr) return c; /* no event yet for it: accepted before the monitor started */
    c.epoch = cr->acc;
    *stale = cr->acc > 0 && cr->acc == cr->disc;
    return c;
}

/* One monitor event: ACCEPTED or DISCONNECTED, with the fd. */
static void on_event(router_watch *w, zi_router *rt, bool front) {
    void *mon = w->mon[front];
    zmq_msg_t ev, addr;
    zmq_msg_init(&ev);
    zmq_msg_init(&addr);
    if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&ev);
        zmq_msg_close(&addr);
        return;
    }
    if (zmq_msg_more(&ev)) zmq_msg_recv(&addr, mon, ZMQ_DONTWAIT);
    uint16_t id = 0;
    uint32_t val = 0;
    if (zmq_msg_size(&ev) >= 6) {
        memcpy(&id, zmq_msg_data(&ev), 2);
        memcpy(&val, (char *)zmq_msg_data(&ev) + 2, 4);
    }
    zmq_msg_close(&ev);
    zmq_msg_close(&addr);
    conn_rec *c = conn_at(w, front, (int)val);
    if (!c) return;
    if (id == ZMQ_EVENT_ACCEPTED) {
        /* A connection whose close was never reported is over too. */
        if (c->acc > c->disc) peer_gone(rt, (int)val, c->acc, front);
        c->acc++;
        c->disc = c->acc - 1;
    } else if (id == ZMQ_EVENT_DISCONNECTED) {
        peer_gone(rt, (int)val, c->acc, front);
        /* one accepted before the monitor started counts as number 0 */
        c->disc = c->acc;
    }
}

void watch_drain(router_watch *w, zi_router *rt, bool front) {
    void *mon = w->mon[front];
    if (!mon) return;
    for (int k = 0; k < 256; k++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(mon, ZMQ_EVENTS, &ev, &sz) || !(ev & ZMQ_POLLIN)) break;
        on_event(w, rt, front);
    }
}

int watch_start(router_watch *w, const zi_logger *log, void *zctx, void *sock, bool front) {
    char ep[64];
    const char *name = front ? "client" : "backend";
    snprintf(ep, sizeof ep, "inproc://zinfer-router-monitor-%s", name);
    void *mon = NULL;
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        mon = zmq_socket(zctx, ZMQ_PAIR);
        if (mon && zmq_connect(mon, ep) != 0) {
            zmq_close(mon);
            mon = NULL;
        }
    }
    if (!mon)
        zi_log(log, ZI_LOG_WARN,
               "no socket monitor on the %s socket: disconnects are noticed only by failed "
               "sends and heartbeats",
               name);
    w->mon[front] = mon;
    return mon ? ZI_OK : ZI_EIO;
}

void watch_stop(router_watch *w) {
    for (int s = 0; s < 2; s++) {
        if (w->mon[s]) zmq_close(w->mon[s]);
        w->mon[s] = NULL;
        free(w->conns[s]);
        w->conns[s] = NULL;
        w->n_conns[s] = 0;
    }
}
