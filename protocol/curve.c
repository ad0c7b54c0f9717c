/*
 * curve.c - ZeroMQ CURVE keys: key files, key lists, key generation, socket
 * options and the handshake watch of a connecting socket (curve.h,
 * docs/security.md).
 */
#include "curve.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

static const char Z85_CHARS[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

static bool is_z85(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!s[i] || !strchr(Z85_CHARS, s[i])) return false;
    return true;
}

/* '#' is itself a Z85 character, but no key starts with it: its value
 * (84) times 85^4 overflows the 32 bits a group of five characters holds.
 * So a line starting with '#' is always a comment. */
static bool is_comment(const char *s) {
    return s[0] == '#';
}

static int key_from_z85(const char *s, size_t n, zi_curve_key *k) {
    if (n != ZI_CURVE_Z85_LEN || !is_z85(s, n)) return -1;
    memcpy(k->z85, s, n);
    k->z85[n] = 0;
    return zmq_z85_decode(k->raw, k->z85) ? 0 : -1;
}

int zi_curve_parse(const char *text, size_t len, const char *name, zi_curve_keys *out,
                   zi_error *err) {
    assert(text || !len);
    size_t line = 0;
    for (size_t pos = 0; pos < len;) {
        line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        const char *s = text + pos;
        size_t n = end - pos;
        pos = end + 1;
        if (n > ZI_CURVE_LINE_MAX)
            return zi_error_set(err, ZI_EFORMAT, "%s:%zu: line longer than %d bytes", name, line,
                                ZI_CURVE_LINE_MAX);
        while (n && (*s == ' ' || *s == '\t')) s++, n--;
        while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
        if (!n || is_comment(s)) continue;
        zi_curve_key k;
        if (n != ZI_CURVE_Z85_LEN)
            return zi_error_set(err, ZI_EFORMAT,
                                "%s:%zu: not a key: %zu characters, a Z85 key has %d", name, line,
                                n, ZI_CURVE_Z85_LEN);
        if (key_from_z85(s, n, &k))
            return zi_error_set(err, ZI_EFORMAT, "%s:%zu: not a key: not valid Z85", name, line);
        if (out->n >= ZI_CURVE_MAX_KEYS)
            return zi_error_set(err, ZI_ERANGE, "%s:%zu: more than %d keys", name, line,
                                ZI_CURVE_MAX_KEYS);
        zi_curve_key *v = realloc(out->v, (out->n + 1) * sizeof *v);
        if (!v) return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", name);
        out->v = v;
        out->v[out->n++] = k;
    }
    return ZI_OK;
}

void zi_curve_keys_free(zi_curve_keys *k) {
    if (!k) return;
    free(k->v);
    k->v = NULL;
    k->n = 0;
}

bool zi_curve_keys_has(const zi_curve_keys *k, const uint8_t raw[32]) {
    for (size_t i = 0; k && i < k->n; i++)
        if (!memcmp(k->v[i].raw, raw, 32)) return true;
    return false;
}

/* Reads a whole key file (at most ZI_CURVE_FILE_MAX bytes); for a secret,
 * checks its mode first. *buf is malloc'd. */
static int read_file(const char *opt, const char *path, bool secret, char **buf, size_t *len,
                     zi_error *err) {
    if (zi_curve_is_key_text(path))
        return zi_error_set(err, ZI_EINVAL,
                            "%s takes a key file's name, not a key: a command line is visible "
                            "to every user (write it to a file, or use `zinfer keygen`)",
                            opt);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return zi_error_set(err, ZI_EIO, "%s %s: %s", opt, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zi_error_set(err, ZI_EINVAL, "%s %s: not a regular file", opt, path);
    }
    if (secret && (st.st_mode & 077)) {
        close(fd);
        return zi_error_set(err, ZI_EINVAL,
                            "%s %s: a secret key readable by others (mode %03o): run chmod 600 "
                            "%s",
                            opt, path, (unsigned)(st.st_mode & 0777), path);
    }
    if (st.st_size > (off_t)ZI_CURVE_FILE_MAX) {
        close(fd);
        return zi_error_set(err, ZI_ERANGE, "%s %s: larger than %u bytes", opt, path,
                            ZI_CURVE_FILE_MAX);
    }
    *buf = malloc((size_t)st.st_size + 1);
    if (!*buf) {
        close(fd);
        return zi_error_set(err, ZI_ENOMEM, "%s %s: out of memory", opt, path);
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, *buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return ZI_OK;
}

int zi_curve_load_list(const char *opt, const char *path, zi_curve_keys *out, zi_error *err) {
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(opt, path, false, &buf, &len, err);
    if (rc) return rc;
    rc = zi_curve_parse(buf, len, path, out, err);
    free(buf);
    if (!rc && out->n == 0)
        rc = zi_error_set(err, ZI_EFORMAT, "%s %s: no key in the file", opt, path);
    return rc;
}

int zi_curve_load_key(const char *opt, const char *path, bool secret, zi_curve_key *out,
                      zi_error *err) {
    char *buf = NULL;
    size_t len = 0;
    int rc = read_file(opt, path, secret, &buf, &len, err);
    if (rc) return rc;
    zi_curve_keys k = {0};
    rc = zi_curve_parse(buf, len, path, &k, err);
    /* A secret key's text is not left in freed memory. */
    memset(buf, 0, len);
    free(buf);
    if (!rc && k.n != 1)
        rc = zi_error_set(err, ZI_EFORMAT, "%s %s: %zu keys in the file, expected one", opt, path,
                          k.n);
    if (!rc) *out = k.v[0];
    if (k.v) memset(k.v, 0, k.n * sizeof *k.v);
    zi_curve_keys_free(&k);
    return rc;
}

int zi_curve_public(const zi_curve_key *secret, zi_curve_key *pub, zi_error *err) {
    if (zmq_curve_public(pub->z85, secret->z85) != 0)
        return zi_error_set(err, ZI_EUNSUPPORTED, "cannot derive a public key: %s",
                            zmq_strerror(zmq_errno()));
    return key_from_z85(pub->z85, strlen(pub->z85), pub)
               ? zi_error_set(err, ZI_EFORMAT, "derived key is not Z85")
               : ZI_OK;
}

int zi_curve_client_load(const char *secret_path, const char *server_path, zi_curve_client *out,
                         zi_error *err) {
    memset(out, 0, sizeof *out);
    if (!secret_path && !server_path) return ZI_OK;
    if (!secret_path || !server_path)
        return zi_error_set(err, ZI_EINVAL, "%s needs %s too (docs/security.md)",
                            secret_path ? "--curve-secret" : "--router-key",
                            secret_path ? "--router-key" : "--curve-secret");
    int rc = zi_curve_load_key("--curve-secret", secret_path, true, &out->secret, err);
    if (!rc) rc = zi_curve_public(&out->secret, &out->pub, err);
    if (!rc) rc = zi_curve_load_key("--router-key", server_path, false, &out->server, err);
    out->on = rc == ZI_OK;
    return rc;
}

bool zi_curve_is_key_text(const char *s) {
    struct stat st;
    return s && strlen(s) == ZI_CURVE_Z85_LEN && is_z85(s, ZI_CURVE_Z85_LEN) && stat(s, &st) != 0;
}

/* Creates path with mode and writes text; O_EXCL unless force (then an
 * existing file is replaced). */
static int write_new(const char *path, const char *text, mode_t mode, bool force, zi_error *err) {
    if (force && unlink(path) != 0 && errno != ENOENT)
        return zi_error_set(err, ZI_EIO, "%s: %s", path, strerror(errno));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return zi_error_set(err, ZI_EIO, "%s: %s%s", path, strerror(errno),
                            errno == EEXIST ? " (--force replaces it)" : "");
    size_t n = strlen(text);
    ssize_t w = write(fd, text, n);
    int rc = (w == (ssize_t)n && fchmod(fd, mode) == 0) ? ZI_OK : -1;
    if (close(fd) != 0) rc = -1;
    if (rc) return zi_error_set(err, ZI_EIO, "%s: %s", path, strerror(errno));
    return ZI_OK;
}

int zi_curve_keygen(const char *out, bool force, zi_curve_key *pub, zi_error *err) {
    char pz[ZI_CURVE_Z85_LEN + 1], sz[ZI_CURVE_Z85_LEN + 1];
    if (zmq_curve_keypair(pz, sz) != 0)
        return zi_error_set(err, ZI_EUNSUPPORTED, "this libzmq has no CURVE: %s",
                            zmq_strerror(zmq_errno()));
    size_t n = strlen(out);
    if (n == 0 || n > 4000) return zi_error_set(err, ZI_EINVAL, "OUT: empty or too long");
    char kpath[4100], ppath[4100], text[512];
    snprintf(kpath, sizeof kpath, "%s.key", out);
    snprintf(ppath, sizeof ppath, "%s.pub", out);
    struct stat st;
    if (!force && (stat(kpath, &st) == 0 || stat(ppath, &st) == 0))
        return zi_error_set(err, ZI_EINVAL, "%s: exists (--force replaces it)",
                            stat(kpath, &st) == 0 ? kpath : ppath);
    snprintf(text, sizeof text,
             "# zinfer CURVE secret key (Z85), made by `zinfer keygen`: keep it private.\n"
             "# Its public key is in %s.pub.\n%s\n",
             out, sz);
    int rc = write_new(kpath, text, 0600, force, err);
    memset(text, 0, sizeof text);
    memset(sz, 0, sizeof sz);
    if (rc) return rc;
    snprintf(text, sizeof text,
             "# zinfer CURVE public key (Z85): list it in the router's --backend-keys or\n"
             "# --client-keys file, or give it to --router-key.\n%s\n",
             pz);
    rc = write_new(ppath, text, 0644, force, err);
    if (rc) {
        unlink(kpath);
        return rc;
    }
    if (pub && key_from_z85(pz, strlen(pz), pub))
        return zi_error_set(err, ZI_EFORMAT, "generated key is not Z85");
    return ZI_OK;
}

bool zi_addr_is_loopback(const char *addr) {
    if (!strncmp(addr, "ipc://", 6) || !strncmp(addr, "inproc://", 9)) return true;
    if (strncmp(addr, "tcp://", 6) != 0) return false;
    const char *h = addr + 6;
    /* A "source;destination" form names the local end first: only the
     * destination matters for a bind, which has none. */
    const char *colon = strrchr(h, ':');
    if (!colon) return false;
    size_t n = (size_t)(colon - h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') h++, n -= 2;
    char host[256];
    if (n == 0 || n >= sizeof host) return false;
    memcpy(host, h, n);
    host[n] = 0;
    if (!strcmp(host, "localhost") || !strcmp(host, "lo") || !strcmp(host, "::1")) return true;
    unsigned a, b, c, d;
    char extra;
    return sscanf(host, "%u.%u.%u.%u%c", &a, &b, &c, &d, &extra) == 4 && a == 127 && b < 256 &&
           c < 256 && d < 256;
}

int zi_curve_set_server(void *sock, const zi_curve_key *secret, const char *domain, zi_error *err) {
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret->raw, 32) != 0 ||
        zmq_setsockopt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) != 0)
        return zi_error_set(err, ZI_EUNSUPPORTED, "CURVE server: %s", zmq_strerror(zmq_errno()));
    return ZI_OK;
}

int zi_curve_set_client(void *sock, const zi_curve_client *c, zi_error *err) {
    if (!c || !c->on) return ZI_OK;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, c->server.raw, 32) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, c->pub.raw, 32) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, c->secret.raw, 32) != 0)
        return zi_error_set(err, ZI_EUNSUPPORTED, "CURVE client: %s", zmq_strerror(zmq_errno()));
    return ZI_OK;
}

int zi_curve_watch_start(zi_curve_watch *w, void *zctx, void *sock, const char *peer,
                         const zi_curve_client *curve, const zi_logger *lg, zi_error *err) {
    memset(w, 0, sizeof *w);
    w->log = lg;
    w->peer = peer;
    w->curve = curve;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zi-curve-watch-%p", sock);
    int ev = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
             ZMQ_EVENT_DISCONNECTED;
    if (zmq_socket_monitor(sock, ep, ev) != 0)
        return zi_error_set(err, ZI_EIO, "socket monitor: %s", zmq_strerror(zmq_errno()));
    w->mon = zmq_socket(zctx, ZMQ_PAIR);
    int zero = 0;
    if (w->mon) zmq_setsockopt(w->mon, ZMQ_LINGER, &zero, sizeof zero);
    if (!w->mon || zmq_connect(w->mon, ep) != 0) {
        if (w->mon) zmq_close(w->mon);
        w->mon = NULL;
        return zi_error_set(err, ZI_EIO, "socket monitor: %s", zmq_strerror(zmq_errno()));
    }
    return ZI_OK;
}

void zi_curve_watch_poll(zi_curve_watch *w) {
    if (!w->mon) return;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&m) >= 6) {
            memcpy(&event, zmq_msg_data(&m), 2);
            memcpy(&value, (char *)zmq_msg_data(&m) + 2, 4);
        }
        while (zmq_msg_more(&m)) { /* the endpoint frame */
            zmq_msg_close(&m);
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, w->mon, ZMQ_DONTWAIT) < 0) break;
        }
        zmq_msg_close(&m);
        bool curve = w->curve && w->curve->on;
        if (event == ZMQ_EVENT_DISCONNECTED) {
            w->down = true;
            continue;
        }
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            w->down = false;
            if (w->last_failure)
                zi_log(w->log, ZI_LOG_INFO, "handshake with %s succeeded%s", w->peer,
                       curve ? " (CURVE)" : "");
            w->last_failure = 0;
            continue;
        }
        /* Two kinds of failure: a refused key, and any other (each
         * reported by one or two events); each is said once. */
        int kind = event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ? 1 : 2;
        if (kind == w->last_failure) continue;
        w->last_failure = kind;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            zi_log(w->log, ZI_LOG_ERROR,
                   "%s refused this process's key %s (status %u): the key is not in its "
                   "allowed list (docs/security.md); retrying",
                   w->peer, curve ? w->curve->pub.z85 : "(none)", value);
        else if (curve)
            zi_log(w->log, ZI_LOG_ERROR,
                   "the CURVE handshake with %s failed: its key is not the one in --router-key "
                   "(%.8s...), or it does not use CURVE; not connected, retrying",
                   w->peer, w->curve->server.z85);
        else
            zi_log(w->log, ZI_LOG_ERROR,
                   "the handshake with %s failed: it may require CURVE keys (--curve-secret, "
                   "--router-key; docs/security.md); not connected, retrying",
                   w->peer);
    }
}

void zi_curve_watch_stop(zi_curve_watch *w) {
    if (!w->mon) return;
    zmq_close(w->mon);
    w->mon = NULL;
}
