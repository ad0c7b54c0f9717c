/*
 * zinfer_client.c - the C client for zinfer's client protocol v1
 * (zinfer_client.h): msgpack request maps out, reply maps in, over one
 * ZeroMQ DEALER socket.
 *
 * Replies are decoded into owned zi_client_event records as they arrive;
 * those of requests other than the one a caller waits for go into a FIFO
 * (a singly linked list), so several requests can be in flight on one
 * client, as the protocol allows. Nothing received from the socket is
 * trusted: every key is type-checked, and a malformed frame becomes a
 * ZI_EFORMAT status naming the key, never a crash.
 *
 * Router restarts (docs/protocol.md, "Router restart"): the socket has a
 * routing id of its own, a socket monitor reports its connection closing
 * and opening again, and then each open generate request gets a "resume"
 * with the token ids received so far; a router that stays away longer
 * than the router timeout ends each with a "router_lost" error made here.
 */
#include "zinfer_client.h"

#include <errno.h>
#include <inttypes.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

typedef struct pending {
    zi_client_event ev;
    struct pending *next;
} pending;

/* A generate request in flight, and the token ids its chunks brought. */
typedef struct open_req {
    char id[ZI_CLIENT_ID_MAX + 1];
    int64_t held;
    int resumed; /* a resume went out for it */
} open_req;

/* Resumed requests that ended: a request the old router never got may be
 * answered twice (its generate refused by the new router, then its
 * resume); frames of these ids are dropped. The latest ENDED_MAX. */
#define ENDED_MAX 32

struct zi_client {
    void *ctx;
    void *sock;
    void *mon; /* the monitor's PAIR socket: the connection's events */
    int timeout_ms;
    int router_timeout_ms; /* 0: none */
    int64_t lost_ms;       /* when the connection to the router closed (0: it is up) */
    int connected;         /* it has been connected once */
    uint64_t next_id;
    pending *head, *tail; /* replies received but not yet asked for */
    open_req *open;
    size_t n_open, cap_open;
    char ended[ENDED_MAX][ZI_CLIENT_ID_MAX + 1];
    size_t n_ended; /* ever; the ring holds the latest ENDED_MAX */
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- connection ---- */

int zi_client_connect(zi_client **out, const char *addr, int timeout_ms, zi_error *err) {
    return zi_client_connect_curve(out, addr, timeout_ms, NULL, NULL, err);
}

/* Sets the CURVE client options: the secret key, its public key (derived)
 * and the router's. */
static int set_curve(void *sock, const char *secret_z85, const char *router_z85, zi_error *err) {
    char pub[41];
    if (!secret_z85 || !router_z85)
        return zi_error_set(err, ZI_EINVAL, "%s: missing (CURVE needs both keys)",
                            secret_z85 ? "router_public_z85" : "secret_z85");
    if (strlen(secret_z85) != 40 || zmq_curve_public(pub, secret_z85) != 0)
        return zi_error_set(err, ZI_EINVAL, "secret_z85: not a 40-character Z85 key");
    if (strlen(router_z85) != 40)
        return zi_error_set(err, ZI_EINVAL, "router_public_z85: not a 40-character Z85 key");
    /* 41 bytes (with the NUL): ZeroMQ reads the option as Z85 text. */
    if (zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, secret_z85, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, pub, 41) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, router_z85, 41) != 0)
        return zi_error_set(err, ZI_EINVAL, "CURVE keys: %s", zmq_strerror(zmq_errno()));
    return ZI_OK;
}

int zi_client_connect_curve(zi_client **out, const char *addr, int timeout_ms,
                            const char *secret_z85, const char *router_public_z85, zi_error *err) {
    if (!out || !addr) return zi_error_set(err, ZI_EINVAL, "connect: NULL argument");
    *out = NULL;
    if (timeout_ms <= 0)
        return zi_error_set(err, ZI_EINVAL, "timeout_ms: %d is not positive", timeout_ms);
    zi_client *c = calloc(1, sizeof *c);
    if (!c) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    c->timeout_ms = timeout_ms;
    c->ctx = zmq_ctx_new();
    c->sock = c->ctx ? zmq_socket(c->ctx, ZMQ_DEALER) : NULL;
    if (!c->sock) {
        int rc = zi_error_set(err, ZI_EIO, "cannot create a ZeroMQ socket: %s",
                              zmq_strerror(zmq_errno()));
        zi_client_close(c);
        return rc;
    }
    /* Closing must not hang on unsent requests; a send to a router that
     * never comes up fails after the timeout instead of blocking. */
    int linger = 0;
    zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &timeout_ms, sizeof timeout_ms);
    if (secret_z85 || router_public_z85) {
        int rc = set_curve(c->sock, secret_z85, router_public_z85, err);
        if (rc) {
            zi_client_close(c);
            return rc;
        }
    }
    /* A routing id of its own (ZeroMQ's is random per connection), so a
     * restarted router knows whose requests workers hand back; ZMTP
     * heartbeats notice a router whose host vanished. */
    unsigned char rnd[12] = {0};
    FILE *ur = fopen("/dev/urandom", "rb");
    size_t got = ur ? fread(rnd, 1, sizeof rnd, ur) : 0;
    if (ur) fclose(ur);
    if (got < sizeof rnd) { /* no /dev/urandom: the pid, the time, the address */
        uint64_t x = (uint64_t)getpid() ^ ((uint64_t)now_ms() << 20) ^ (uint64_t)(uintptr_t)c;
        memcpy(rnd, &x, sizeof x);
    }
    char rid[3 + 2 * sizeof rnd + 1] = "zc-";
    for (size_t i = 0; i < sizeof rnd; i++) snprintf(rid + 3 + 2 * i, 3, "%02x", rnd[i]);
    int hb_ivl = 1000, hb_timeout = 5000;
    zmq_setsockopt(c->sock, ZMQ_ROUTING_ID, rid, strlen(rid));
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof hb_ivl);
    zmq_setsockopt(c->sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_timeout, sizeof hb_timeout);
    char mon_addr[64];
    snprintf(mon_addr, sizeof mon_addr, "inproc://zi-client-%p", (void *)c);
    if (zmq_socket_monitor(c->sock, mon_addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) ||
        !(c->mon = zmq_socket(c->ctx, ZMQ_PAIR)) || zmq_connect(c->mon, mon_addr)) {
        int rc =
            zi_error_set(err, ZI_EIO, "cannot watch the connection: %s", zmq_strerror(zmq_errno()));
        zi_client_close(c);
        return rc;
    }
    zmq_setsockopt(c->mon, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(c->sock, addr) != 0) {
        int rc = zi_error_set(err, ZI_EINVAL, "router address '%.200s': %s", addr,
                              zmq_strerror(zmq_errno()));
        zi_client_close(c);
        return rc;
    }
    *out = c;
    return ZI_OK;
}

void zi_client_close(zi_client *c) {
    if (!c) return;
    while (c->head) {
        pending *p = c->head;
        c->head = p->next;
        zi_client_event_free(&p->ev);
        free(p);
    }
    if (c->sock) zmq_socket_monitor(c->sock, NULL, 0);
    if (c->mon) zmq_close(c->mon);
    if (c->sock) zmq_close(c->sock);
    if (c->ctx) zmq_ctx_term(c->ctx);
    free(c->open);
    free(c);
}

void zi_client_set_router_timeout(zi_client *c, int ms) {
    if (c) c->router_timeout_ms = ms > 0 ? ms : 0;
}

/* Notes generate request id as open (a resume names it); out of memory
 * only loses the resume. */
static void open_add(zi_client *c, const char *id) {
    if (c->n_open == c->cap_open) {
        size_t cap = c->cap_open ? 2 * c->cap_open : 8;
        open_req *p = realloc(c->open, cap * sizeof *p);
        if (!p) return;
        c->open = p;
        c->cap_open = cap;
    }
    open_req *o = &c->open[c->n_open++];
    snprintf(o->id, sizeof o->id, "%s", id);
    o->held = 0;
    o->resumed = 0;
    for (size_t i = 0; i < ENDED_MAX && i < c->n_ended; i++) /* an id used again */
        if (!strcmp(c->ended[i], id)) c->ended[i][0] = '\0';
}

/* ---- sending ---- */

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static int send_buf(zi_client *c, const msgpack_sbuffer *sb, zi_error *err) {
    if (zmq_send(c->sock, sb->data, sb->size, 0) < 0)
        return zi_error_set(err, ZI_EIO, "sending to the router: %s",
                            errno == EAGAIN ? "timed out (is the router running?)"
                                            : zmq_strerror(zmq_errno()));
    return ZI_OK;
}

static int make_id(zi_client *c, const char *given, char *id_out, size_t id_cap, zi_error *err) {
    char buf[ZI_CLIENT_ID_MAX + 1];
    if (given) {
        size_t n = strlen(given);
        if (n == 0 || n > ZI_CLIENT_ID_MAX)
            return zi_error_set(err, ZI_EINVAL, "id: length %zu is outside 1..%d", n,
                                ZI_CLIENT_ID_MAX);
        memcpy(buf, given, n + 1);
    } else {
        /* The pid keeps ids of two clients sharing a socket-less name
         * apart in logs; uniqueness per socket is what the router needs. */
        snprintf(buf, sizeof buf, "c%ld-%" PRIu64, (long)getpid(), c->next_id++);
    }
    if (id_out) {
        if (strlen(buf) + 1 > id_cap)
            return zi_error_set(err, ZI_EINVAL, "id: output buffer of %zu bytes is too small",
                                id_cap);
        memcpy(id_out, buf, strlen(buf) + 1);
    }
    return ZI_OK;
}

void zi_client_request_init(zi_client_request *r) {
    if (!r) return;
    memset(r, 0, sizeof *r);
    r->max_new_tokens = -1;
    r->stream = 1;
}

int zi_client_generate(zi_client *c, const zi_client_request *r, char *id_out, size_t id_cap,
                       zi_error *err) {
    if (!c || !r || !id_out) return zi_error_set(err, ZI_EINVAL, "generate: NULL argument");
    if (!r->prompt && !r->prompt_ids)
        return zi_error_set(err, ZI_EINVAL, "prompt: neither text nor token ids given");
    int rc = make_id(c, r->id, id_out, id_cap, err);
    if (rc) return rc;
    size_t nsp = (r->max_new_tokens > 0) + (r->ignore_eos != 0) + (r->set_temperature != 0) +
                 (r->set_top_k != 0) + (r->n_stop > 0);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4 + (nsp > 0));
    pack_str(&pk, "op");
    pack_str(&pk, "generate");
    pack_str(&pk, "id");
    pack_str(&pk, id_out);
    pack_str(&pk, "stream");
    if (r->stream)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    pack_str(&pk, "prompt");
    if (r->prompt) {
        pack_str(&pk, r->prompt);
    } else {
        /* Token ids go numpy-style (int64 little-endian), as the router
         * itself sends them. */
        size_t nb = r->n_prompt_ids * 8;
        unsigned char *data = malloc(nb ? nb : 1);
        if (!data) {
            msgpack_sbuffer_destroy(&sb);
            return zi_error_set(err, ZI_ENOMEM, "out of memory");
        }
        for (size_t i = 0; i < r->n_prompt_ids; i++) {
            uint64_t v = (uint64_t)(int64_t)r->prompt_ids[i];
            for (int b = 0; b < 8; b++) data[i * 8 + b] = (unsigned char)(v >> (8 * b));
        }
        msgpack_pack_map(&pk, 4);
        pack_str(&pk, "__np__");
        msgpack_pack_true(&pk);
        pack_str(&pk, "dtype");
        pack_str(&pk, "int64");
        pack_str(&pk, "shape");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, r->n_prompt_ids);
        pack_str(&pk, "data");
        msgpack_pack_bin(&pk, nb);
        msgpack_pack_bin_body(&pk, data, nb);
        free(data);
    }
    if (nsp) {
        pack_str(&pk, "sampling_params");
        msgpack_pack_map(&pk, nsp);
        if (r->max_new_tokens > 0) {
            pack_str(&pk, "max_new_tokens");
            msgpack_pack_int64(&pk, r->max_new_tokens);
        }
        if (r->ignore_eos) {
            pack_str(&pk, "ignore_eos");
            msgpack_pack_true(&pk);
        }
        if (r->set_temperature) {
            pack_str(&pk, "temperature");
            msgpack_pack_double(&pk, r->temperature);
        }
        if (r->set_top_k) {
            pack_str(&pk, "top_k");
            msgpack_pack_int64(&pk, r->top_k);
        }
        if (r->n_stop) {
            pack_str(&pk, "stop");
            msgpack_pack_array(&pk, r->n_stop);
            for (size_t i = 0; i < r->n_stop; i++) pack_str(&pk, r->stop[i] ? r->stop[i] : "");
        }
    }
    rc = send_buf(c, &sb, err);
    if (!rc) open_add(c, id_out);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

int zi_client_cancel(zi_client *c, const char *id, zi_error *err) {
    if (!c || !id) return zi_error_set(err, ZI_EINVAL, "cancel: NULL argument");
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    pack_str(&pk, "op");
    pack_str(&pk, "cancel");
    pack_str(&pk, "id");
    pack_str(&pk, id);
    int rc = send_buf(c, &sb, err);
    msgpack_sbuffer_destroy(&sb);
    return rc;
}

/* ---- decoding replies ---- */

void zi_client_event_free(zi_client_event *ev) {
    if (!ev) return;
    free(ev->id);
    free(ev->text);
    free(ev->token_ids);
    free(ev->status);
    free(ev->code);
    free(ev->message);
    free(ev->field);
    free(ev->raw);
    memset(ev, 0, sizeof *ev);
}

static bool key_is(const msgpack_object *k, const char *s) {
    size_t n = strlen(s);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && !memcmp(k->via.str.ptr, s, n);
}

/* A copy of a msgpack string, NUL-terminated; *len gets its length. */
static int dup_str(const msgpack_object *o, const char *key, char **out, size_t *len,
                   zi_error *err) {
    if (o->type != MSGPACK_OBJECT_STR)
        return zi_error_set(err, ZI_EFORMAT, "reply: %s is not a string", key);
    if (*out) return zi_error_set(err, ZI_EFORMAT, "reply: duplicate key %s", key);
    *out = malloc(o->via.str.size + 1);
    if (!*out) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    memcpy(*out, o->via.str.ptr, o->via.str.size);
    (*out)[o->via.str.size] = '\0';
    if (len) *len = o->via.str.size;
    return ZI_OK;
}

static int get_int(const msgpack_object *o, const char *key, int64_t *v, zi_error *err) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= (uint64_t)INT64_MAX)
        *v = (int64_t)o->via.u64;
    else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        *v = o->via.i64;
    else
        return zi_error_set(err, ZI_EFORMAT, "reply: %s is not an integer", key);
    return ZI_OK;
}

static const msgpack_object *map_get(const msgpack_object *m, const char *key) {
    if (m->type != MSGPACK_OBJECT_MAP) return NULL;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (key_is(&m->via.map.ptr[i].key, key)) return &m->via.map.ptr[i].val;
    return NULL;
}

/* Token ids: a numpy-style map (int64 or int32, little-endian) or a plain
 * array of integers. */
static int get_ids(const msgpack_object *o, const char *key, int64_t **out, size_t *n,
                   zi_error *err) {
    if (*out) return zi_error_set(err, ZI_EFORMAT, "reply: duplicate key %s", key);
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        *n = o->via.array.size;
        *out = malloc((*n ? *n : 1) * sizeof **out);
        if (!*out) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        for (size_t i = 0; i < *n; i++)
            if (get_int(&o->via.array.ptr[i], key, &(*out)[i], err)) return err->code;
        return ZI_OK;
    }
    const msgpack_object *np = map_get(o, "__np__"), *dt = map_get(o, "dtype"),
                         *data = map_get(o, "data");
    if (!np || np->type != MSGPACK_OBJECT_BOOLEAN || !np->via.boolean || !dt || !data ||
        dt->type != MSGPACK_OBJECT_STR || data->type != MSGPACK_OBJECT_BIN)
        return zi_error_set(err, ZI_EFORMAT, "reply: %s is neither an array nor numpy-style", key);
    size_t w;
    if (key_is(dt, "int64"))
        w = 8;
    else if (key_is(dt, "int32"))
        w = 4;
    else
        return zi_error_set(err, ZI_EFORMAT, "reply: %s.dtype %.*s is not int64 or int32", key,
                            (int)(dt->via.str.size > 32 ? 32 : dt->via.str.size), dt->via.str.ptr);
    if (data->via.bin.size % w)
        return zi_error_set(err, ZI_EFORMAT, "reply: %s.data has %u bytes, not a multiple of %zu",
                            key, data->via.bin.size, w);
    *n = data->via.bin.size / w;
    *out = malloc((*n ? *n : 1) * sizeof **out);
    if (!*out) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    const unsigned char *p = (const unsigned char *)data->via.bin.ptr;
    for (size_t i = 0; i < *n; i++) {
        uint64_t v = 0;
        for (size_t b = 0; b < w; b++) v |= (uint64_t)p[i * w + b] << (8 * b);
        /* Sign-extend int32 values. */
        (*out)[i] = w == 4 ? (int64_t)(int32_t)(uint32_t)v : (int64_t)v;
    }
    return ZI_OK;
}

static int decode_pair(const msgpack_object *k, const msgpack_object *v, zi_client_event *ev,
                       bool *have_event, zi_error *err) {
    if (key_is(k, "id")) return dup_str(v, "id", &ev->id, NULL, err);
    if (key_is(k, "text")) return dup_str(v, "text", &ev->text, &ev->text_len, err);
    if (key_is(k, "status")) return dup_str(v, "status", &ev->status, NULL, err);
    if (key_is(k, "code")) return dup_str(v, "code", &ev->code, NULL, err);
    if (key_is(k, "message")) return dup_str(v, "message", &ev->message, NULL, err);
    if (key_is(k, "field")) return dup_str(v, "field", &ev->field, NULL, err);
    if (key_is(k, "token_ids"))
        return get_ids(v, "token_ids", &ev->token_ids, &ev->n_token_ids, err);
    if (key_is(k, "workers")) return get_int(v, "workers", &ev->workers, err);
    if (key_is(k, "tokenizers")) return get_int(v, "tokenizers", &ev->tokenizers, err);
    if (key_is(k, "waiting")) return get_int(v, "waiting", &ev->waiting, err);
    if (key_is(k, "running")) return get_int(v, "running", &ev->running, err);
    if (key_is(k, "usage")) {
        if (v->type != MSGPACK_OBJECT_MAP)
            return zi_error_set(err, ZI_EFORMAT, "reply: usage is not a map");
        const msgpack_object *p = map_get(v, "prompt_tokens"), *c = map_get(v, "completion_tokens");
        if ((p && get_int(p, "usage.prompt_tokens", &ev->prompt_tokens, err)) ||
            (c && get_int(c, "usage.completion_tokens", &ev->completion_tokens, err)))
            return err->code;
        return ZI_OK;
    }
    if (key_is(k, "event")) {
        static const struct {
            const char *name;
            zi_client_event_kind kind;
        } kinds[] = {{"chunk", ZI_CLIENT_CHUNK},
                     {"final", ZI_CLIENT_FINAL},
                     {"error", ZI_CLIENT_ERROR},
                     {"result", ZI_CLIENT_RESULT}};
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (key_is(v, kinds[i].name)) {
                ev->kind = kinds[i].kind;
                *have_event = true;
                return ZI_OK;
            }
        return zi_error_set(err, ZI_EFORMAT, "reply: event is not chunk, final, error or result");
    }
    return ZI_OK; /* other keys (models, logprobs, ...) stay in raw */
}

static int decode_event(const void *buf, size_t len, zi_client_event *ev, zi_error *err) {
    memset(ev, 0, sizeof *ev);
    ev->prompt_tokens = ev->completion_tokens = -1;
    ev->workers = ev->tokenizers = ev->waiting = ev->running = -1;
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t off = 0;
    int rc = ZI_OK;
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        rc = zi_error_set(err, ZI_EFORMAT, "reply: %zu bytes are not one msgpack object", len);
    else if (u.data.type != MSGPACK_OBJECT_MAP)
        rc = zi_error_set(err, ZI_EFORMAT, "reply: not a msgpack map");
    bool have_event = false;
    for (uint32_t i = 0; !rc && i < u.data.via.map.size; i++)
        rc = decode_pair(&u.data.via.map.ptr[i].key, &u.data.via.map.ptr[i].val, ev, &have_event,
                         err);
    if (!rc && !ev->id) rc = zi_error_set(err, ZI_EFORMAT, "reply: id missing");
    if (!rc && !have_event) rc = zi_error_set(err, ZI_EFORMAT, "reply: event missing");
    if (!rc && !(ev->raw = malloc(len ? len : 1)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (!rc) {
        memcpy(ev->raw, buf, len);
        ev->raw_len = len;
    }
    msgpack_unpacked_destroy(&u);
    if (rc) zi_client_event_free(ev);
    return rc;
}

/* Counts what ev brings to its open request (a chunk's ids), or ends it
 * (a final or error). 0, or 1 for a frame to drop (one after the end of a
 * resumed request). */
static int track(zi_client *c, const zi_client_event *ev) {
    for (size_t i = 0; i < c->n_open; i++) {
        if (strcmp(c->open[i].id, ev->id)) continue;
        if (ev->kind == ZI_CLIENT_CHUNK) {
            c->open[i].held += (int64_t)ev->n_token_ids;
        } else {
            if (c->open[i].resumed)
                snprintf(c->ended[c->n_ended++ % ENDED_MAX], sizeof c->ended[0], "%s", ev->id);
            c->open[i] = c->open[--c->n_open];
        }
        return 0;
    }
    for (size_t i = 0; ev->id[0] && i < ENDED_MAX && i < c->n_ended; i++)
        if (!strcmp(c->ended[i], ev->id)) return 1;
    return 0;
}

/* Appends ev to the kept replies (it is freed on failure). */
static int keep(zi_client *c, zi_client_event *ev, zi_error *err) {
    pending *p = malloc(sizeof *p);
    if (!p) {
        zi_client_event_free(ev);
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    p->ev = *ev;
    p->next = NULL;
    if (c->tail)
        c->tail->next = p;
    else
        c->head = p;
    c->tail = p;
    return ZI_OK;
}

/* One frame waiting on the socket (flags: 0 or ZMQ_DONTWAIT), decoded and
 * counted: ZI_OK, 1 when none waits (ZMQ_DONTWAIT), 2 when it was dropped
 * (track), else an error. */
static int read_frame(zi_client *c, int flags, zi_client_event *ev, zi_error *err) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, c->sock, flags) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&msg);
        if (e == EAGAIN) return 1;
        return zi_error_set(err, ZI_EIO, "receiving from the router: %s", zmq_strerror(e));
    }
    int rc = decode_event(zmq_msg_data(&msg), zmq_msg_size(&msg), ev, err);
    zmq_msg_close(&msg);
    if (!rc && track(c, ev)) {
        zi_client_event_free(ev);
        return 2;
    }
    return rc;
}

/* A connection event. After a reconnect: what the old connection
 * delivered first is kept (counted, so no token comes twice), then every
 * open generate request is resumed. */
static int on_monitor(zi_client *c, zi_error *err) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    int n = zmq_msg_recv(&m, c->mon, ZMQ_DONTWAIT);
    uint16_t event = 0;
    if (n >= 2) memcpy(&event, zmq_msg_data(&m), 2);
    int more = n >= 0 && zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) { /* the endpoint frame */
        zmq_msg_init(&m);
        more = zmq_msg_recv(&m, c->mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    if (event == ZMQ_EVENT_DISCONNECTED && !c->lost_ms) c->lost_ms = now_ms();
    if (event != ZMQ_EVENT_CONNECTED) return ZI_OK;
    if (c->connected) {
        for (;;) {
            zi_client_event ev;
            int rc = read_frame(c, ZMQ_DONTWAIT, &ev, err);
            if (rc == 1) break;
            if (rc == 2) continue;
            if (rc || (rc = keep(c, &ev, err))) return rc;
        }
        for (size_t i = 0; i < c->n_open; i++) {
            msgpack_sbuffer sb;
            msgpack_sbuffer_init(&sb);
            msgpack_packer pk;
            msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
            msgpack_pack_map(&pk, 3);
            pack_str(&pk, "op");
            pack_str(&pk, "resume");
            pack_str(&pk, "id");
            pack_str(&pk, c->open[i].id);
            pack_str(&pk, "tokens");
            msgpack_pack_int64(&pk, c->open[i].held);
            c->open[i].resumed = 1;
            int rc = send_buf(c, &sb, err);
            msgpack_sbuffer_destroy(&sb);
            if (rc) return rc;
        }
    }
    c->connected = 1;
    c->lost_ms = 0;
    return ZI_OK;
}

/* The router stayed away too long: each open request ends with one
 * "router_lost" error, kept for its caller. */
static int router_lost(zi_client *c, zi_error *err) {
    static const char msg[] = "the router went away and did not come back within the router "
                              "timeout";
    while (c->n_open > 0) {
        const char *id = c->open[c->n_open - 1].id;
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_map(&pk, 4);
        pack_str(&pk, "id");
        pack_str(&pk, id);
        pack_str(&pk, "event");
        pack_str(&pk, "error");
        pack_str(&pk, "code");
        pack_str(&pk, "router_lost");
        pack_str(&pk, "message");
        pack_str(&pk, msg);
        zi_client_event ev;
        int rc = decode_event(sb.data, sb.size, &ev, err);
        msgpack_sbuffer_destroy(&sb);
        c->n_open--;
        if (rc || (rc = keep(c, &ev, err))) return rc;
    }
    c->lost_ms = 0;
    return ZI_OK;
}

/* The next frame from the socket (ZI_OK), or 1 when replies were kept
 * meanwhile (a reconnect's, router_lost errors): look at them first. */
static int recv_event(zi_client *c, zi_client_event *ev, zi_error *err) {
    int64_t deadline = now_ms() + c->timeout_ms;
    pending *had = c->tail;
    for (;;) {
        int64_t now = now_ms(), wait = deadline - now;
        if (wait <= 0)
            return zi_error_set(err, ZI_EIO,
                                "no reply from the router within %d ms (is it running?)",
                                c->timeout_ms);
        if (c->lost_ms && c->router_timeout_ms && c->n_open) {
            int64_t left = c->lost_ms + c->router_timeout_ms - now;
            if (left <= 0) {
                int rc = router_lost(c, err);
                return rc ? rc : 1;
            }
            if (left < wait) wait = left;
        }
        zmq_pollitem_t it[2] = {{c->sock, 0, ZMQ_POLLIN, 0}, {c->mon, 0, ZMQ_POLLIN, 0}};
        int pr = zmq_poll(it, 2, (long)wait);
        if (pr < 0 && zmq_errno() == EINTR) continue;
        if (pr < 0)
            return zi_error_set(err, ZI_EIO, "waiting for the router: %s",
                                zmq_strerror(zmq_errno()));
        if (it[1].revents & ZMQ_POLLIN) {
            int rc = on_monitor(c, err);
            if (rc) return rc;
            if (c->tail != had) return 1;
        }
        if (it[0].revents & ZMQ_POLLIN) {
            int rc = read_frame(c, ZMQ_DONTWAIT, ev, err);
            if (rc != 1 && rc != 2) return rc;
        }
    }
}

int zi_client_next_event(zi_client *c, const char *id, zi_client_event *ev, zi_error *err) {
    if (!c || !ev) return zi_error_set(err, ZI_EINVAL, "next_event: NULL argument");
    /* First the replies kept from earlier calls, oldest first. */
    for (pending **pp = &c->head, *prev = NULL; *pp; prev = *pp, pp = &(*pp)->next) {
        pending *p = *pp;
        if (id && strcmp(p->ev.id, id)) continue;
        *ev = p->ev;
        *pp = p->next;
        if (c->tail == p) c->tail = prev;
        free(p);
        return ZI_OK;
    }
    for (;;) {
        int rc = recv_event(c, ev, err);
        if (rc == 1) return zi_client_next_event(c, id, ev, err); /* replies were kept */
        if (rc) return rc;
        /* An error with id "" answers a frame the router could not parse;
         * it belongs to whoever is waiting. */
        if (!id || !strcmp(ev->id, id) || (ev->kind == ZI_CLIENT_ERROR && !ev->id[0])) return ZI_OK;
        rc = keep(c, ev, err);
        if (rc) return rc;
    }
}

/* ---- one-shot operations ---- */

/* Sends {"op": op, "id": <new>, text / token_ids / add_special} and waits
 * for its answer; an "error" reply becomes ZI_EINVAL. */
static int call(zi_client *c, const char *op, const char *text, int add_special, const int64_t *ids,
                size_t n_ids, zi_client_event *out, zi_error *err) {
    char id[ZI_CLIENT_ID_MAX + 1];
    int rc = make_id(c, NULL, id, sizeof id, err);
    if (rc) return rc;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2 + (text ? 2 : 0) + (ids ? 1 : 0));
    pack_str(&pk, "op");
    pack_str(&pk, op);
    pack_str(&pk, "id");
    pack_str(&pk, id);
    if (text) {
        pack_str(&pk, "text");
        pack_str(&pk, text);
        pack_str(&pk, "add_special");
        if (add_special)
            msgpack_pack_true(&pk);
        else
            msgpack_pack_false(&pk);
    }
    if (ids) {
        pack_str(&pk, "token_ids");
        msgpack_pack_array(&pk, n_ids);
        for (size_t i = 0; i < n_ids; i++) msgpack_pack_int64(&pk, ids[i]);
    }
    rc = send_buf(c, &sb, err);
    msgpack_sbuffer_destroy(&sb);
    if (rc) return rc;
    if ((rc = zi_client_next_event(c, id, out, err))) return rc;
    if (out->kind == ZI_CLIENT_ERROR) {
        rc = zi_error_set(err, ZI_EINVAL, "%s: %s: %s", op, out->code ? out->code : "error",
                          out->message ? out->message : "(no message)");
        zi_client_event_free(out);
        return rc;
    }
    if (out->kind != ZI_CLIENT_RESULT) {
        zi_client_event_free(out);
        return zi_error_set(err, ZI_EFORMAT, "%s: the reply is not a result", op);
    }
    return ZI_OK;
}

int zi_client_health(zi_client *c, zi_client_event *result, zi_error *err) {
    if (!c || !result) return zi_error_set(err, ZI_EINVAL, "health: NULL argument");
    return call(c, "health", NULL, 0, NULL, 0, result, err);
}

int zi_client_tokenize(zi_client *c, const char *text, int add_special, int64_t **ids,
                       size_t *n_ids, zi_error *err) {
    if (!c || !text || !ids || !n_ids)
        return zi_error_set(err, ZI_EINVAL, "tokenize: NULL argument");
    zi_client_event ev;
    int rc = call(c, "tokenize", text, add_special, NULL, 0, &ev, err);
    if (rc) return rc;
    if (!ev.token_ids) {
        zi_client_event_free(&ev);
        return zi_error_set(err, ZI_EFORMAT, "tokenize: the result has no token_ids");
    }
    *ids = ev.token_ids;
    *n_ids = ev.n_token_ids;
    ev.token_ids = NULL;
    zi_client_event_free(&ev);
    return ZI_OK;
}

int zi_client_detokenize(zi_client *c, const int64_t *ids, size_t n_ids, char **text,
                         size_t *text_len, zi_error *err) {
    static const int64_t none[1] = {0};
    if (!c || (!ids && n_ids) || !text)
        return zi_error_set(err, ZI_EINVAL, "detokenize: NULL argument");
    zi_client_event ev;
    int rc = call(c, "detokenize", NULL, 0, ids ? ids : none, n_ids, &ev, err);
    if (rc) return rc;
    if (!ev.text) {
        zi_client_event_free(&ev);
        return zi_error_set(err, ZI_EFORMAT, "detokenize: the result has no text");
    }
    *text = ev.text;
    if (text_len) *text_len = ev.text_len;
    ev.text = NULL;
    zi_client_event_free(&ev);
    return ZI_OK;
}
