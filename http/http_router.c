/*
 * http_router.c - zinfer-http's router connection (http_router.h).
 *
 * A generation's connection survives a router restart (docs/protocol.md,
 * "Router restart"): its socket has a routing id of its own, a socket
 * monitor reports the connection opening again, and then, once what the
 * old connection delivered has been read, each open generate request gets
 * a "resume" with the token ids received so far, so the HTTP stream goes
 * on where it stopped.
 */
#include "http_router.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "codec.h"
#include "stop_signal.h"

/* A generate request in flight on a connection, and the ids it received. */
typedef struct conn_open {
    char id[64];
    int64_t held;
} conn_open;

struct zi_http_conn {
    zi_http_ctx *ctx;
    void *sock;
    void *lookup; /* for token texts, so their replies never mix with a generation's */
    int watch_client;
    char model[128]; /* the model of the token texts ("" the default) */
    void *mon;       /* the connection's events (NULL: not watched) */
    int connected;   /* it has been connected once */
    int resume_due;  /* it connected again: resume once the old frames are read */
    conn_open *open;
    size_t n_open, cap_open;
};

void zi_http_conn_set_model(zi_http_conn *c, const char *model) {
    snprintf(c->model, sizeof c->model, "%s", model ? model : "");
}

/* A token id's key in the token-text cache: the id (under 2^31) with a
 * hash of its model above it, so that two models' texts never mix (the
 * default model's is the id alone). */
static int64_t text_key(const zi_http_conn *c, int64_t id) {
    uint32_t h = 0;
    for (const char *p = c->model; *p; p++) h = h * 31 + (unsigned char)*p;
    return (int64_t)(h & 0x7fffffff) << 32 | (id & 0xffffffff);
}

static void *open_socket(const zi_http_ctx *ctx) {
    void *s = zmq_socket(ctx->zctx, ZMQ_DEALER);
    if (!s) return NULL;
    int linger = 1000, sndtimeo = 1000;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    if (zmq_connect(s, ctx->router_addr) != 0) {
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* The generation socket of c, with a routing id of its own (a restarted
 * router knows whose requests workers hand back by it) and a monitor
 * (its connection opening again). Without the monitor (no inproc room)
 * it works as before, without resumes. */
static void *open_watched(zi_http_conn *c) {
    void *s = zmq_socket(c->ctx->zctx, ZMQ_DEALER);
    if (!s) return NULL;
    unsigned char rnd[12] = {0};
    FILE *ur = fopen("/dev/urandom", "rb");
    size_t got = ur ? fread(rnd, 1, sizeof rnd, ur) : 0;
    if (ur) fclose(ur);
    if (got < sizeof rnd) { /* the pid, the time, the address */
        uint64_t x = (uint64_t)getpid() ^ ((uint64_t)zi_now_ms() << 20) ^ (uint64_t)(uintptr_t)c;
        memcpy(rnd, &x, sizeof x);
    }
    char rid[3 + 2 * sizeof rnd + 1] = "zh-";
    for (size_t i = 0; i < sizeof rnd; i++) snprintf(rid + 3 + 2 * i, 3, "%02x", rnd[i]);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, rid, strlen(rid));
    int linger = 1000, sndtimeo = 1000, zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &sndtimeo, sizeof sndtimeo);
    /* unique in the shared context: a closed connection's monitor name
     * may linger a moment */
    char addr[96];
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    snprintf(addr, sizeof addr, "inproc://zi-http-conn-%p-%lld-%ld", (void *)c,
             (long long)ts.tv_sec, ts.tv_nsec);
    if (zmq_socket_monitor(s, addr, ZMQ_EVENT_CONNECTED) == 0 &&
        (c->mon = zmq_socket(c->ctx->zctx, ZMQ_PAIR))) {
        zmq_setsockopt(c->mon, ZMQ_LINGER, &zero, sizeof zero);
        if (zmq_connect(c->mon, addr) != 0) {
            zmq_close(c->mon);
            c->mon = NULL;
        }
    }
    if (!c->mon) zmq_socket_monitor(s, NULL, 0);
    if (zmq_connect(s, c->ctx->router_addr) != 0) {
        if (c->mon) zmq_socket_monitor(s, NULL, 0), zmq_close(c->mon), c->mon = NULL;
        zmq_close(s);
        return NULL;
    }
    return s;
}

int zi_http_conn_open(zi_http_ctx *ctx, zi_http_conn **out, zi_http_error *e) {
    zi_http_conn *c = calloc(1, sizeof *c);
    if (c) c->ctx = ctx, c->sock = open_watched(c);
    if (!c || !c->sock) {
        free(c);
        return zi_http_fail(e, 500, "internal", NULL, "cannot open a socket to the router: %s",
                            zmq_strerror(zmq_errno()));
    }
    c->watch_client = 1;
    *out = c;
    return 0;
}

void zi_http_conn_close(zi_http_conn *c) {
    if (!c) return;
    if (c->mon) {
        zmq_socket_monitor(c->sock, NULL, 0);
        zmq_close(c->mon);
    }
    zmq_close(c->sock);
    if (c->lookup) zmq_close(c->lookup);
    free(c->open);
    free(c);
}

static int send_on(void *sock, const zi_msg *m, zi_http_error *e) {
    if (zi_send_msg(sock, NULL, 0, false, m) != 0)
        return zi_http_fail(e, 503, "unavailable", NULL, "the router does not take requests: %s",
                            zmq_strerror(errno));
    return 0;
}

int zi_http_conn_send(zi_http_conn *c, const zi_msg *m, zi_http_error *e) {
    int rc = send_on(c->sock, m, e);
    const char *op, *id;
    size_t op_n, id_n;
    /* a generate is open until its final or error: a resume names it */
    if (!rc && c->mon && zi_msgpack_peek_str(m->sb.data, m->sb.size, "op", &op, &op_n) &&
        op_n == 8 && !memcmp(op, "generate", 8) &&
        zi_msgpack_peek_str(m->sb.data, m->sb.size, "id", &id, &id_n) && id_n < 64) {
        if (c->n_open == c->cap_open) {
            size_t cap = c->cap_open ? 2 * c->cap_open : 4;
            conn_open *p = realloc(c->open, cap * sizeof *p);
            if (p) c->open = p, c->cap_open = cap;
        }
        if (c->n_open < c->cap_open) {
            conn_open *o = &c->open[c->n_open++];
            memcpy(o->id, id, id_n);
            o->id[id_n] = '\0';
            o->held = 0;
        }
    }
    return rc;
}

void zi_http_frame_free(zi_http_frame *f) {
    if (f->buf) msgpack_unpacked_destroy(&f->u);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

void zi_http_frame_str(const msgpack_object *map, const char *key, char *out, size_t cap) {
    const msgpack_object *v = zi_map_get(map, key);
    out[0] = '\0';
    if (v && v->type == MSGPACK_OBJECT_STR) {
        size_t n = v->via.str.size < cap - 1 ? v->via.str.size : cap - 1;
        memcpy(out, v->via.str.ptr, n);
        out[n] = '\0';
    }
}

/* True when the client closed its end (EOF or reset); false when it is
 * still there (then bytes it pipelined are left for later). */
static int client_gone(int fd, int *watch) {
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return 1;
    if (r < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
    *watch = 0; /* readable with data: stop watching, or poll would spin */
    return 0;
}

/* One frame from sock into f: 1, 0 on timeout, -1 client gone. */
static int recv_on(void *sock, int client_fd, int *watch, int timeout_ms, zi_http_frame *f) {
    memset(f, 0, sizeof *f);
    int64_t deadline = zi_now_ms() + timeout_ms;
    for (;;) {
        int64_t left = deadline - zi_now_ms();
        if (left < 0) return ZI_HTTP_RECV_TIMEOUT;
        if (zi_stop_requested()) return ZI_HTTP_RECV_GONE; /* shutting down */
        zmq_pollitem_t items[2] = {{sock, 0, ZMQ_POLLIN, 0}, {NULL, client_fd, ZMQ_POLLIN, 0}};
        int n_items = client_fd >= 0 && *watch ? 2 : 1;
        int r = zmq_poll(items, n_items, left > 1000 ? 1000 : (long)left);
        if (r < 0) continue; /* EINTR */
        if (n_items == 2 && (items[1].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) &&
            client_gone(client_fd, watch))
            return ZI_HTTP_RECV_GONE;
        if (!(items[0].revents & ZMQ_POLLIN)) continue;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        size_t len = zmq_msg_size(&msg);
        char *buf = malloc(len ? len : 1);
        if (!buf) {
            zmq_msg_close(&msg);
            continue;
        }
        memcpy(buf, zmq_msg_data(&msg), len);
        zmq_msg_close(&msg);
        zi_error err = {0};
        if (zi_msgpack_parse(buf, len, NULL, &f->u, &err) != 0) {
            free(buf);
            continue;
        }
        if (f->u.data.type != MSGPACK_OBJECT_MAP) {
            msgpack_unpacked_destroy(&f->u);
            free(buf);
            continue;
        }
        f->buf = buf;
        f->len = len;
        f->root = &f->u.data;
        return ZI_HTTP_RECV_FRAME;
    }
}

/* Counts what frame f brings to its open request (a chunk's ids), or
 * ends it (a final or error). */
static void conn_track(zi_http_conn *c, const zi_http_frame *f) {
    char id[64], ev[16];
    zi_http_frame_str(f->root, "id", id, sizeof id);
    zi_http_frame_str(f->root, "event", ev, sizeof ev);
    for (size_t i = 0; i < c->n_open; i++) {
        if (strcmp(c->open[i].id, id)) continue;
        if (!strcmp(ev, "chunk")) {
            const msgpack_object *t = zi_map_get(f->root, "token_ids");
            zi_codec_limits lim = zi_codec_limits_default();
            int32_t *ids = NULL;
            size_t n = 0;
            if (t && zi_codec_decode_tokens(t, &lim, "token_ids", &ids, &n, NULL) == ZI_OK)
                c->open[i].held += (int64_t)n;
            free(ids);
        } else {
            c->open[i] = c->open[--c->n_open];
        }
        return;
    }
}

/* The monitor's events: a connection after the first is a router that
 * came back (or the same one after a network break). */
static void conn_events(zi_http_conn *c) {
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&m) >= 2) memcpy(&event, zmq_msg_data(&m), 2);
        int more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&m);
            more = zmq_msg_recv(&m, c->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (event != ZMQ_EVENT_CONNECTED) continue;
        if (c->connected && c->n_open) c->resume_due = 1;
        c->connected = 1;
    }
}

static void send_resumes(zi_http_conn *c) {
    zi_http_error e;
    for (size_t i = 0; i < c->n_open; i++) {
        zi_msg m;
        zi_msg_init(&m);
        msgpack_pack_map(&m.pk, 3);
        zi_pack_kv_str(&m.pk, "op", "resume");
        zi_pack_kv_str(&m.pk, "id", c->open[i].id);
        zi_pack_str(&m.pk, "tokens");
        msgpack_pack_int64(&m.pk, c->open[i].held);
        send_on(c->sock, &m, &e);
        zi_msg_free(&m);
    }
}

int zi_http_conn_recv(zi_http_conn *c, int client_fd, int timeout_ms, zi_http_frame *f) {
    if (!c->mon) return recv_on(c->sock, client_fd, &c->watch_client, timeout_ms, f);
    int64_t deadline = zi_now_ms() + timeout_ms;
    for (;;) {
        conn_events(c);
        if (c->resume_due) {
            /* What the old connection delivered first (counted), then the
             * resumes: no token comes twice. */
            int quiet = 0;
            if (recv_on(c->sock, -1, &quiet, 0, f) == ZI_HTTP_RECV_FRAME) {
                conn_track(c, f);
                return ZI_HTTP_RECV_FRAME;
            }
            send_resumes(c);
            c->resume_due = 0;
        }
        int64_t left = deadline - zi_now_ms();
        if (left < 0) return ZI_HTTP_RECV_TIMEOUT;
        /* a short wait: the monitor is looked at between them */
        int rc = recv_on(c->sock, client_fd, &c->watch_client, left > 200 ? 200 : (int)left, f);
        if (rc == ZI_HTTP_RECV_FRAME) conn_track(c, f);
        if (rc != ZI_HTTP_RECV_TIMEOUT) return rc;
    }
}

/* An "error" frame as e. */
static int frame_error(const msgpack_object *root, zi_http_error *e) {
    char code[64], msg[ZI_HTTP_MSG_MAX], field[128];
    zi_http_frame_str(root, "code", code, sizeof code);
    zi_http_frame_str(root, "message", msg, sizeof msg);
    zi_http_frame_str(root, "field", field, sizeof field);
    return zi_http_router_error(e, code, msg, field, NULL);
}

static int call_on(void *sock, const zi_msg *m, const char *id, int timeout_ms, zi_http_frame *f,
                   zi_http_error *e) {
    if (send_on(sock, m, e)) return -1;
    int64_t deadline = zi_now_ms() + timeout_ms;
    int watch = 0;
    for (;;) {
        int64_t left = deadline - zi_now_ms();
        if (left <= 0 || recv_on(sock, -1, &watch, (int)left, f) != ZI_HTTP_RECV_FRAME)
            return zi_http_fail(e, 503, "unavailable", NULL,
                                "the router did not answer within %d ms", timeout_ms);
        char fid[300], ev[16];
        zi_http_frame_str(f->root, "id", fid, sizeof fid);
        zi_http_frame_str(f->root, "event", ev, sizeof ev);
        if (!strcmp(fid, id) || (!fid[0] && !strcmp(ev, "error"))) {
            if (!strcmp(ev, "result")) return 0;
            int rc = strcmp(ev, "error") ? zi_http_fail(e, 500, "internal", NULL,
                                                        "unexpected reply '%s' from the router", ev)
                                         : frame_error(f->root, e);
            zi_http_frame_free(f);
            return rc;
        }
        zi_http_frame_free(f); /* a late reply to an earlier request */
    }
}

int zi_http_call(zi_http_conn *c, const zi_msg *m, const char *id, int timeout_ms, zi_http_frame *f,
                 zi_http_error *e) {
    return call_on(c->sock, m, id, timeout_ms, f, e);
}

/* ---- token texts ------------------------------------------------------ */

/* The table is the context's zi_http_tok_cache (http_ctx.h); t->mu is
 * held by the caller of these. */

static size_t slot_of(const zi_http_tok_cache *t, int64_t id, size_t cap) {
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    size_t i = (size_t)(h >> 20) & (cap - 1);
    while (t->text[i] && t->ids[i] != id) i = (i + 1) & (cap - 1);
    return i;
}

static const char *tok_get(const zi_http_tok_cache *t, int64_t id) {
    if (!t->cap) return NULL;
    return t->text[slot_of(t, id, t->cap)];
}

static void tok_put(zi_http_tok_cache *t, int64_t id, char *text) {
    if ((t->n + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        int64_t *ids = calloc(cap, sizeof *ids);
        char **texts = calloc(cap, sizeof *texts);
        if (!ids || !texts) {
            free(ids);
            free(texts);
            free(text);
            return;
        }
        int64_t *old_ids = t->ids;
        char **old_text = t->text;
        size_t old_cap = t->cap;
        t->ids = ids, t->text = texts, t->cap = cap;
        for (size_t i = 0; i < old_cap; i++)
            if (old_text[i]) {
                size_t s = slot_of(t, old_ids[i], cap);
                t->ids[s] = old_ids[i], t->text[s] = old_text[i];
            }
        free(old_ids);
        free(old_text);
    }
    size_t s = slot_of(t, id, t->cap);
    if (t->text[s]) {
        free(text);
        return;
    }
    t->ids[s] = id, t->text[s] = text;
    t->n++;
}

int zi_http_token_texts(zi_http_conn *c, const int64_t *ids, size_t n, const char **out,
                        zi_http_error *e) {
    zi_http_tok_cache *t = &c->ctx->tok;
    size_t missing = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++) missing += !(out[i] = tok_get(t, text_key(c, ids[i])));
    pthread_mutex_unlock(&t->mu);
    if (!missing) return 0;
    if (!c->lookup && !(c->lookup = open_socket(c->ctx)))
        return zi_http_fail(e, 500, "internal", NULL, "cannot open a socket to the router");
    /* Ask for every missing id at once (the router answers them in any
     * order), then wait for all. */
    size_t asked = 0;
    for (size_t i = 0; i < n; i++) {
        if (out[i]) continue;
        int dup = 0;
        for (size_t j = 0; j < i && !dup; j++) dup = !out[j] && ids[j] == ids[i];
        if (dup) continue;
        char rid[32];
        snprintf(rid, sizeof rid, "t%lld", (long long)ids[i]);
        zi_msg m;
        zi_msg_init(&m);
        msgpack_pack_map(&m.pk, 3 + (c->model[0] != 0));
        zi_pack_kv_str(&m.pk, "op", "detokenize");
        zi_pack_kv_str(&m.pk, "id", rid);
        if (c->model[0]) zi_pack_kv_str(&m.pk, "model_name", c->model);
        zi_pack_str(&m.pk, "token_ids");
        msgpack_pack_array(&m.pk, 1);
        msgpack_pack_int64(&m.pk, ids[i]);
        int rc = send_on(c->lookup, &m, e);
        zi_msg_free(&m);
        if (rc) return -1;
        asked++;
    }
    int watch = 0;
    int64_t deadline = zi_now_ms() + 30000;
    while (asked) {
        zi_http_frame f;
        int64_t left = deadline - zi_now_ms();
        if (left <= 0 || recv_on(c->lookup, -1, &watch, (int)left, &f) != ZI_HTTP_RECV_FRAME)
            return zi_http_fail(e, 503, "unavailable", NULL,
                                "the router did not detokenize the log probabilities' tokens");
        char fid[300], ev[16];
        zi_http_frame_str(f.root, "id", fid, sizeof fid);
        zi_http_frame_str(f.root, "event", ev, sizeof ev);
        if (fid[0] != 't') {
            zi_http_frame_free(&f);
            continue;
        }
        if (!strcmp(ev, "error")) {
            int rc = frame_error(f.root, e);
            zi_http_frame_free(&f);
            return rc;
        }
        const msgpack_object *tx = zi_map_get(f.root, "text");
        char *text = NULL;
        if (tx && tx->type == MSGPACK_OBJECT_STR && (text = malloc(tx->via.str.size + 1))) {
            memcpy(text, tx->via.str.ptr, tx->via.str.size);
            text[tx->via.str.size] = '\0';
        }
        if (text) {
            pthread_mutex_lock(&t->mu);
            tok_put(t, text_key(c, strtoll(fid + 1, NULL, 10)), text);
            pthread_mutex_unlock(&t->mu);
        }
        zi_http_frame_free(&f);
        asked--;
    }
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < n; i++)
        if (!out[i]) out[i] = tok_get(t, text_key(c, ids[i]));
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < n; i++)
        if (!out[i]) out[i] = ""; /* out of memory: an empty text rather than a crash */
    return 0;
}

/* ---- arrays ------------------------------------------------------------ */

/* The numpy-style map's dtype, shape and data, when o is one. */
static int np_parts(const msgpack_object *o, const char **dtype, size_t *dl, const char **data,
                    size_t *len) {
    if (o->type != MSGPACK_OBJECT_MAP) return -1;
    const msgpack_object *dt = zi_map_get(o, "dtype"), *d = zi_map_get(o, "data");
    if (!dt || dt->type != MSGPACK_OBJECT_STR || !d || d->type != MSGPACK_OBJECT_BIN) return -1;
    *dtype = dt->via.str.ptr, *dl = dt->via.str.size;
    *data = d->via.bin.ptr, *len = d->via.bin.size;
    return 0;
}

int zi_http_decode_ids(const msgpack_object *o, int64_t **ids, size_t *n) {
    *ids = NULL, *n = 0;
    const char *dt, *data;
    size_t dl, len;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        size_t k = o->via.array.size;
        if (k && !(*ids = malloc(k * sizeof **ids))) return -1;
        for (size_t i = 0; i < k; i++) {
            const msgpack_object *x = &o->via.array.ptr[i];
            if (x->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                free(*ids);
                *ids = NULL;
                return -1;
            }
            (*ids)[i] = (int64_t)x->via.u64;
        }
        *n = k;
        return 0;
    }
    if (np_parts(o, &dt, &dl, &data, &len)) return -1;
    size_t w = dl == 5 && !memcmp(dt, "int64", 5) ? 8 : dl == 5 && !memcmp(dt, "int32", 5) ? 4 : 0;
    if (!w || len % w) return -1;
    size_t k = len / w;
    if (k && !(*ids = malloc(k * sizeof **ids))) return -1;
    for (size_t i = 0; i < k; i++) {
        if (w == 8) {
            int64_t v;
            memcpy(&v, data + 8 * i, 8); /* little-endian hosts only, as the server */
            (*ids)[i] = v;
        } else {
            int32_t v;
            memcpy(&v, data + 4 * i, 4);
            (*ids)[i] = v;
        }
    }
    *n = k;
    return 0;
}

int zi_http_decode_floats(const msgpack_object *o, double **v, size_t *n) {
    *v = NULL, *n = 0;
    const char *dt, *data;
    size_t dl, len;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        size_t k = o->via.array.size;
        if (k && !(*v = malloc(k * sizeof **v))) return -1;
        for (size_t i = 0; i < k; i++) {
            const msgpack_object *x = &o->via.array.ptr[i];
            if (x->type == MSGPACK_OBJECT_FLOAT32 || x->type == MSGPACK_OBJECT_FLOAT64)
                (*v)[i] = x->via.f64;
            else if (x->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
                (*v)[i] = (double)x->via.i64;
            else if (x->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                (*v)[i] = (double)x->via.u64;
            else {
                free(*v);
                *v = NULL;
                return -1;
            }
        }
        *n = k;
        return 0;
    }
    if (np_parts(o, &dt, &dl, &data, &len)) return -1;
    size_t w = dl == 7 && !memcmp(dt, "float32", 7)   ? 4
               : dl == 7 && !memcmp(dt, "float64", 7) ? 8
                                                      : 0;
    if (!w || len % w) return -1;
    size_t k = len / w;
    if (k && !(*v = malloc(k * sizeof **v))) return -1;
    for (size_t i = 0; i < k; i++) {
        if (w == 4) {
            float x;
            memcpy(&x, data + 4 * i, 4);
            (*v)[i] = x;
        } else {
            memcpy(&(*v)[i], data + 8 * i, 8);
        }
    }
    *n = k;
    return 0;
}
