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
