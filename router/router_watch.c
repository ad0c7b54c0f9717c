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
 * ZMQ_EVENT_ACCEPTED and ZMQ_EVENT_DISCONNECTED with the connection's file
 * descriptor, not the peer's routing id (ZMQ_ROUTER_NOTIFY, which would give
 * the id, is a draft option this libzmq build refuses). Every frame read
 * carries its connection's fd (ZMQ_SRCFD). When a connection closes, a
 * client's requests in flight from it are cancelled (no reply: nobody is
 * there to read it), a backend is declared dead at once (failover starts
 * without waiting for --heartbeat-timeout, which stays the fallback for a
 * peer that hangs without closing its connection). ZeroMQ heartbeats on
 * the client socket (--client-heartbeat) close connections whose peer went
 * silent, which the monitor then reports.
 *
 * The kernel reuses an fd once it is closed, and the events and the frames
 * arrive on different queues, so a frame must be matched to the right
 * connection on its fd. The monitor's events come in order (one I/O
 * thread), and a connection's ACCEPTED event is queued before any frame of
 * it can be read. So the monitor is read before every frame: the frame then
 * belongs to the last connection accepted on its fd (number acc), or, when
 * that one has closed too (acc == disc), to a connection already gone: such
 * a stale frame's request is cancelled at once. A request or backend
 * remembers (fd, number), and a DISCONNECTED event ends exactly the
 * connection numbered acc on its fd: never a newer connection that reuses
 * the fd. (A frame of an older, closed connection read after a newer one
 * was accepted is taken as the newer one's: its request is then cancelled
 * when the newer one closes, late but never wrongly.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "router_impl.h"

/* The largest fd tracked; a peer on a larger one is noticed only by the
 * other ways (a failed send, heartbeats). */
#define WATCH_MAX_FD (1 << 20)

typedef struct conn_key {
    int fd;
    uint32_t epoch;
} conn_key;

static bool on_conn(const void *val, const void *arg) {
    const rreq *r = val;
    const conn_key *k = arg;
    return r->client_fd == k->fd && r->client_epoch == k->epoch;
}

/* Connection number epoch on fd has closed. */
static void peer_gone(router *rt, int fd, uint32_t epoch, bool front) {
    if (front) {
        conn_key k = {fd, epoch};
        size_t pos = 0;
        for (rreq *r; (r = zi_req_table_find(&rt->reqs, &pos, on_conn, &k));) {
            zi_log(&rt->log, ZI_LOG_INFO,
                   "request %llu: its client disconnected; cancelled (worker slot freed)",
                   (unsigned long long)r->rid);
            if (r->kind == K_GENERATE) rt->metrics.finished[ZI_IM_FIN_CANCELLED]++;
            end_request(rt, r); /* it leaves the walk's match */
        }
        return;
    }
    for (size_t i = 0; i < rt->n_be; i++)
        if (rt->be[i].alive && rt->be[i].fd == fd && rt->be[i].epoch == epoch)
            backend_died(rt, (int)i, "its connection closed");
}

/* The record of fd on socket s (0 backend, 1 client), grown as needed;
 * NULL when not tracked. */
static conn_rec *conn_at(router *rt, int s, int fd) {
    if (fd < 0 || fd >= WATCH_MAX_FD) return NULL;
    if ((size_t)fd >= rt->n_conns[s]) {
        size_t n = rt->n_conns[s] ? rt->n_conns[s] : 64;
        while (n <= (size_t)fd) n *= 2;
        conn_rec *p = realloc(rt->conns[s], n * sizeof *p);
        if (!p) return NULL; /* not tracked: noticed the other ways */
        memset(p + rt->n_conns[s], 0, (n - rt->n_conns[s]) * sizeof *p);
        rt->conns[s] = p, rt->n_conns[s] = n;
    }
    return &rt->conns[s][fd];
}

void watch_frame(router *rt, int fd, bool front) {
    watch_drain(rt, front);
    rt->cur_fd = fd;
    rt->cur_epoch = 0;
    rt->cur_stale = false;
    if (!rt->mon[front]) return;
    conn_rec *c = (size_t)fd < rt->n_conns[front] && fd >= 0 ? &rt->conns[front][fd] : NULL;
    if (!c) return; /* no event yet for it: accepted before the monitor started */
    rt->cur_epoch = c->acc;
    rt->cur_stale = c->acc > 0 && c->acc == c->disc;
}

void watch_stale_frame(router *rt) {
    if (rt->cur_stale) peer_gone(rt, rt->cur_fd, rt->cur_epoch, true);
}

/* One monitor event: ACCEPTED or DISCONNECTED, with the fd. */
static void on_event(router *rt, bool front) {
    void *mon = rt->mon[front];
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
    conn_rec *c = conn_at(rt, front, (int)val);
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

void watch_drain(router *rt, bool front) {
    void *mon = rt->mon[front];
    if (!mon) return;
    for (int k = 0; k < 256; k++) {
        int ev = 0;
        size_t sz = sizeof ev;
        if (zmq_getsockopt(mon, ZMQ_EVENTS, &ev, &sz) || !(ev & ZMQ_POLLIN)) break;
        on_event(rt, front);
    }
}

void watch_start(router *rt, void *zctx, void *sock, bool front) {
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
        zi_log(&rt->log, ZI_LOG_WARN,
               "no socket monitor on the %s socket: disconnects are noticed only by failed "
               "sends and heartbeats",
               name);
    rt->mon[front] = mon;
}

void watch_stop(router *rt) {
    for (int s = 0; s < 2; s++) {
        if (rt->mon[s]) zmq_close(rt->mon[s]);
        rt->mon[s] = NULL;
        free(rt->conns[s]);
        rt->conns[s] = NULL;
        rt->n_conns[s] = 0;
    }
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
