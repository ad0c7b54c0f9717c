/*
 * wire.c - ZeroMQ sends and the backends' DEALER socket (see wire.h).
 */
#include "wire.h"
#include "curve.h"

#include <errno.h>
#include <zmq.h>

int zi_send(void *sock, const void *ident, size_t ident_len, bool delim, const void *data,
            size_t len) {
    if (ident) {
        if (zmq_send(sock, ident, ident_len, ZMQ_SNDMORE) < 0) return -1;
        if (delim && zmq_send(sock, "", 0, ZMQ_SNDMORE) < 0) return -1;
    }
    return zmq_send(sock, data, len, 0) < 0 ? -1 : 0;
}

int zi_send_msg(void *sock, const void *ident, size_t ident_len, bool delim, const zi_msg *m) {
    if (m->sb.size == 0) { /* what a failed imsg encoder leaves: never a frame */
        errno = EINVAL;
        return -1;
    }
    return zi_send(sock, ident, ident_len, delim, m->sb.data, m->sb.size);
}

int zi_im_send(void *sock, zi_msg *m) {
    int rc = zi_send_msg(sock, NULL, 0, false, m);
    zi_msg_free(m);
    return rc;
}

void *zi_backend_socket(void *zctx, const char *router, const zi_curve_client *curve,
                        zi_error *err) {
    void *sock = zmq_socket(zctx, ZMQ_DEALER);
    if (!sock) {
        zi_error_set(err, ZI_EIO, "cannot create a socket: %s", zmq_strerror(errno));
        return NULL;
    }
    int linger = 0, hwm = 100000, sndtimeo = 1000;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    /* A router on another host can vanish without a FIN or RST (a cable,
     * a switch, a host that lost power). Without these the connection
     * waits on TCP's retransmission backoff: a worker whose network came
     * back after a minute re-registered up to two minutes later
     * (tests/e2e/test_multihost.py measured 25 s after a 27 s outage).
     * ZMTP heartbeats (answered by ZeroMQ's I/O threads, however busy the
     * process) drop a connection silent for ZI_BACKEND_HB_TIMEOUT_MS and
     * ZeroMQ reconnects every 100 ms; each attempt gives up after
     * ZI_BACKEND_CONNECT_TIMEOUT_MS rather than after the kernel's SYN
     * retries (two minutes), so the first attempt after the network is
     * back gets through. The router pings with the same values and drops
     * its end as soon (router.c). The timeout is the router's default
     * --heartbeat-timeout. */
    int hb_ivl = ZI_BACKEND_HB_IVL_MS, hb_timeout = ZI_BACKEND_HB_TIMEOUT_MS;
    int connect_timeout = ZI_BACKEND_CONNECT_TIMEOUT_MS;
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    zmq_setsockopt(sock, ZMQ_CONNECT_TIMEOUT, &connect_timeout, sizeof connect_timeout);
    if (zi_curve_set_client(sock, curve, err) != ZI_OK) {
        zmq_close(sock);
        return NULL;
    }
    if (zmq_connect(sock, router) != 0) {
        zi_error_set(err, ZI_EINVAL, "--router %s: %s", router, zmq_strerror(errno));
        zmq_close(sock);
        return NULL;
    }
    return sock;
}
