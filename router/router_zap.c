/*
 * router_zap.c - the router's ZAP handler thread (router_zap.h): reads each
 * ZAP request, checks the CURVE key against the list of the socket's
 * domain, answers 200 or 400.
 */
#include "router_zap.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

/* A ZAP request has 7 frames before the credentials (RFC 27, the REP
 * socket having taken the envelope); CURVE sends one credential. */
enum { ZAP_FRAMES_MAX = 8 };

static bool already_logged(zi_zap *z, char sock, const uint8_t *key) {
    uint8_t k[33];
    k[0] = (uint8_t)sock;
    memcpy(k + 1, key, 32);
    for (size_t i = 0; i < z->n_logged; i++)
        if (!memcmp(z->logged[i], k, sizeof k)) return true;
    if (z->n_logged < ZI_ZAP_LOGGED_MAX) {
        memcpy(z->logged[z->n_logged++], k, sizeof k);
        return false;
    }
    if (!z->logged_full) {
        z->logged_full = true;
        zi_log(z->log, ZI_LOG_WARN, "%d different keys refused: further refusals are not logged",
               ZI_ZAP_LOGGED_MAX);
    }
    return true;
}

bool zi_zap_allow(zi_zap *z, const char *domain, size_t domain_len, const char *address,
                  size_t address_len, const uint8_t *key, size_t key_len) {
    bool backend = domain_len == strlen(ZI_ZAP_DOMAIN_BACKEND) &&
                   !memcmp(domain, ZI_ZAP_DOMAIN_BACKEND, domain_len);
    bool client = domain_len == strlen(ZI_ZAP_DOMAIN_CLIENT) &&
                  !memcmp(domain, ZI_ZAP_DOMAIN_CLIENT, domain_len);
    /* Only CURVE reaches here with a 32-byte key; anything else (an
     * unknown domain, another mechanism) is refused. */
    if (key_len != 32 || (!backend && !client)) return false;
    const zi_curve_keys *list = backend ? z->backend : z->client;
    if (!list || zi_curve_keys_has(list, key)) return true;
    if (!already_logged(z, backend ? 'b' : 'c', key)) {
        char z85[ZI_CURVE_Z85_LEN + 1];
        if (!zmq_z85_encode(z85, key, 32)) snprintf(z85, sizeof z85, "?");
        int alen = address_len > 64 ? 64 : (int)address_len;
        zi_log(z->log, ZI_LOG_WARN,
               "refused a %s connection from %.*s: key %.8s... is not in %s (logged once per "
               "key and socket)",
               backend ? "backend" : "client", alen, address, z85,
               backend ? "--backend-keys" : "--client-keys");
    }
    return false;
}

static void reply(void *sock, const zmq_msg_t *rid, bool ok) {
    zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
    zmq_send(sock, zmq_msg_data((zmq_msg_t *)rid), zmq_msg_size((zmq_msg_t *)rid), ZMQ_SNDMORE);
    zmq_send(sock, ok ? "200" : "400", 3, ZMQ_SNDMORE);
    const char *text = ok ? "OK" : "key not allowed";
    zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
    zmq_send(sock, "", 0, ZMQ_SNDMORE); /* user id */
    zmq_send(sock, "", 0, 0);           /* metadata */
}

/* Reads one request (all its frames) and answers it. */
static void handle(zi_zap *z) {
    zmq_msg_t f[ZAP_FRAMES_MAX];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, z->sock, 0) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < ZAP_FRAMES_MAX)
            f[n++] = tmp;
        else
            zmq_msg_close(&tmp);
    }
    /* version, request id, domain, address, identity, mechanism, key */
    if (n >= 2) {
        bool ok = n == 7 && zmq_msg_size(&f[0]) == 3 && !memcmp(zmq_msg_data(&f[0]), "1.0", 3) &&
                  zi_zap_allow(z, zmq_msg_data(&f[2]), zmq_msg_size(&f[2]), zmq_msg_data(&f[3]),
                               zmq_msg_size(&f[3]), zmq_msg_data(&f[6]), zmq_msg_size(&f[6]));
        reply(z->sock, &f[1], ok);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&f[i]);
}

static void *run(void *arg) {
    zi_zap *z = arg;
    while (!atomic_load(&z->stop)) {
        zmq_pollitem_t it = {z->sock, 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(&it, 1, 200);
        if (pr < 0 && errno != EINTR) break;
        if (pr > 0) handle(z);
    }
    return NULL;
}

int zi_zap_start(zi_zap *z, void *zctx, const zi_curve_keys *backend, const zi_curve_keys *client,
                 const zi_logger *lg, zi_error *err) {
    memset(z, 0, sizeof *z);
    assert(backend);
    z->backend = backend;
    z->client = client;
    z->log = lg;
    atomic_init(&z->stop, false);
    z->logged = calloc(ZI_ZAP_LOGGED_MAX, sizeof *z->logged);
    z->sock = z->logged ? zmq_socket(zctx, ZMQ_REP) : NULL;
    int zero = 0;
    if (z->sock) zmq_setsockopt(z->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (!z->sock || zmq_bind(z->sock, "inproc://zeromq.zap.01") != 0) {
        int rc = zi_error_set(err, ZI_EIO, "ZAP handler: %s", zmq_strerror(zmq_errno()));
        zi_zap_stop(z);
        return rc;
    }
    /* The socket moves to the thread: pthread_create is the full memory
     * barrier ZeroMQ asks for; this thread never touches it again. */
    if (pthread_create(&z->thread, NULL, run, z) != 0) {
        int rc = zi_error_set(err, ZI_EIO, "ZAP handler: cannot start a thread");
        zi_zap_stop(z);
        return rc;
    }
    z->running = true;
    return ZI_OK;
}

void zi_zap_stop(zi_zap *z) {
    if (z->running) {
        atomic_store(&z->stop, true);
        pthread_join(z->thread, NULL);
        z->running = false;
    }
    if (z->sock) zmq_close(z->sock);
    z->sock = NULL;
    free(z->logged);
    z->logged = NULL;
}
