/*
 * router_watch.c - deadlines and disconnects (router_impl.h lists the
 * router's files).
 *
 * Deadlines: a generate request with a timeout_ms (or, without one, the
 * router's --request-timeout) that is still in flight at its deadline,
 * wherever it is (encoding, queued, running, decoding, waiting for a
 * failover), ends with a "final" of status "deadline_exceeded"; its claims
 * on backends go as for a client cancel (end_request). Checked on the
 * router's 100 ms tick.
 *
 * Disconnects: a ZeroMQ socket monitor on each ROUTER socket reports
 * ZMQ_EVENT_DISCONNECTED with the connection's file descriptor, not the
 * peer's routing id (ZMQ_ROUTER_NOTIFY, which would give the id, is a
 * draft option this libzmq build refuses). Every frame read carries its
 * connection's fd (ZMQ_SRCFD), so the router keeps, per fd, a hash of the
 * routing id last seen on it. When that fd disconnects: a client's
 * requests in flight are cancelled (no reply: nobody is there to read
 * it), a backend is declared dead at once (failover starts without
 * waiting for --heartbeat-timeout, which stays the fallback for a peer
 * that hangs without closing its connection). ZeroMQ heartbeats on the
 * client socket (--client-heartbeat) close connections whose peer went
 * silent, which the monitor then reports.
 *
 * An fd is reused by the kernel once closed, and the monitor's events and
 * the socket's frames arrive on different queues: when a frame comes on
 * fd X from another routing id than the one recorded, X's previous
 * connection has closed, so its peer is handled as gone right then and
 * the disconnect event still to come for it is skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "router_impl.h"

/* The largest fd tracked; a peer on a larger one is noticed only by the
 * other ways (a failed send, heartbeats). */
#define WATCH_MAX_FD (1 << 20)

static uint64_t ident_hash(const unsigned char *p, size_t n, bool front) {
    uint64_t h = 1469598103934665603ULL ^ (front ? 1 : 2); /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h ? h : 1;
}

static bool on_fd(const void *val, const void *arg) {
    const rreq *r = val;
    return r->client_fd == *(const int *)arg;
}

/* The peer that was on fd is gone. */
static void peer_gone(router *rt, int fd, bool front) {
    if (front) {
        size_t pos = 0;
        for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, on_fd, &fd));) {
            zi_log(&rt->log, ZI_LOG_INFO,
                   "request %llu: its client disconnected; cancelled (worker slot freed)",
                   (unsigned long long)r->rid);
            if (r->kind == K_GENERATE) rt->metrics.finished[ZI_IM_FIN_CANCELLED]++;
            end_request(rt, r); /* it leaves the walk's match */
        }
        return;
    }
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].fd == fd)
            backend_died(rt, (int)i, "its connection closed");
}

void watch_frame(router *rt, int fd, bool front, const unsigned char *ident, size_t len) {
    rt->cur_fd = fd;
    if (fd < 0 || fd >= WATCH_MAX_FD) return;
    if ((size_t)fd >= rt->n_conns) {
        size_t n = rt->n_conns ? rt->n_conns : 64;
        while (n <= (size_t)fd) n *= 2;
        conn_rec *p = realloc(rt->conns, n * sizeof *p);
        if (!p) return; /* not tracked: noticed the other ways */
        memset(p + rt->n_conns, 0, (n - rt->n_conns) * sizeof *p);
        rt->conns = p, rt->n_conns = n;
    }
    conn_rec *c = &rt->conns[fd];
    uint64_t h = ident_hash(ident, len, front);
    if (c->hash == h) return;
    if (c->hash) { /* fd reused: the previous connection has closed */
        peer_gone(rt, fd, c->front);
        c->skip++;
    }
    c->hash = h;
    c->front = front;
}

/* One monitor event: ZMQ_EVENT_DISCONNECTED with the fd. */
static void on_event(router *rt, void *mon) {
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
    int fd = (int)val;
    if (id != ZMQ_EVENT_DISCONNECTED || fd < 0 || (size_t)fd >= rt->n_conns) return;
    conn_rec *c = &rt->conns[fd];
    if (c->skip) {
        c->skip--;
        return;
    }
    if (!c->hash) return; /* a connection that sent nothing */
    c->hash = 0;
    peer_gone(rt, fd, c->front);
}

void watch_drain(router *rt, void *mon) {
    for (int k = 0; k < 256; k++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(mon, ZMQ_EVENTS, &ev, &sz) || !(ev & ZMQ_POLLIN)) break;
        on_event(rt, mon);
    }
}

void *watch_start(router *rt, void *zctx, void *sock, const char *name) {
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zinfer-router-monitor-%s", name);
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_DISCONNECTED) != 0) return NULL;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (mon && zmq_connect(mon, ep) != 0) {
        zmq_close(mon);
        mon = NULL;
    }
    if (!mon)
        zi_log(&rt->log, ZI_LOG_WARN,
               "no socket monitor on the %s socket: disconnects are noticed only by failed "
               "sends and heartbeats",
               name);
    return mon;
}

static bool past_deadline(const void *val, const void *arg) {
    const rreq *r = val;
    return r->deadline_ms && r->deadline_ms <= *(const int64_t *)arg;
}

void deadline_check(router *rt, int64_t now) {
    size_t pos = 0;
    for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, past_deadline, &now));)
        send_final(rt, r, "deadline_exceeded"); /* ends it: it leaves the match */
}
