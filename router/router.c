/*
 * router.c - the `zinfer-router` process: the front door of the server.
 *
 * Two ROUTER sockets: clients connect to --bind (client protocol v1,
 * docs/protocol.md), tokenizer and worker processes connect to --backend
 * and register. A generate request travels
 *
 *   client -> [validate, admit, assign rid] -> tokenizer "encode"
 *          -> "encoded" context -> queue -> least-loaded worker "start"
 *          -> "tokens" (per step) -> the request's tokenizer "decode"
 *          -> "decoded" text -> client "chunk" ... "final"
 *
 * The router is single-threaded: one zmq_poll loop over both sockets, with
 * a 100 ms tick for heartbeat checks. Every admitted request lives in the
 * request table (req_table.h) until exactly one terminal frame ("final" or
 * "error") has been sent for it: every path that ends a request goes
 * through end_request(), which sends nothing itself but undoes the
 * request's claims on backends (queue place, worker slot, tokenizer
 * decode state).
 *
 * A backend that misses heartbeats for --heartbeat-timeout ms is dead. The
 * requests a dead worker ran resume on another worker from the token they
 * had reached (router_failover.c), so the client sees each token once; a
 * request waits for a worker at most --failover-timeout ms after the last
 * one died, then ends with "worker_lost". A dead tokenizer's requests
 * move to another tokenizer, which rebuilds their decode state from the
 * ids already decoded.
 *
 * Every message, to a backend or to a client, is encoded and decoded by
 * protocol/imsg.h.
 *
 * With --curve-secret both sockets can be CURVE servers: the backend one
 * always (only --backend-keys may connect), the client one when
 * --client-keys is given; the ZAP handler thread (router_zap.h) decides.
 * docs/security.md.
 *
 * This file is main, the shell around the router core (router_core.h:
 * the request state machine, driven by events, with no sockets): the
 * options, the two sockets and the outbox that sends on them, the poll
 * loop that turns frames, monitor events (router_watch.h) and its 100 ms
 * tick into the core's events, and shutdown. router_impl.h lists the
 * core's files and holds the router struct.
 */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#include "duration.h"
#include "options.h"
#include "log.h"
#include "curve.h"
#include "router_impl.h"
#include "router_watch.h"
#include "router_zap.h"
#include "stop_signal.h"
#include "wire.h"

static const char USAGE[] =
    "usage: zinfer-router [options]\n"
    "\n"
    "The front door of the zinfer server: clients connect to --bind (msgpack\n"
    "over ZeroMQ, docs/protocol.md); tokenizer and worker processes connect\n"
    "to --backend and register. Options (their ranges and defaults from\n"
    "common/options.c, as `zinfer serve` checks them):\n"
    "\n";

/* The shell's state: the core, the sockets, their monitors. */
typedef struct shell {
    router *rt;
    void *front, *back; /* the client and backend ROUTER sockets */
    router_watch watch;
} shell;

/* The core's outbox (zi_router_io.send): one frame on a socket. */
static int shell_send(void *ctx, zi_router_side side, const unsigned char *ident, size_t ident_len,
                      bool delim, const void *data, size_t len) {
    shell *sh = ctx;
    return zi_send(side == ZI_ROUTER_CLIENT ? sh->front : sh->back, ident, ident_len, delim, data,
                   len);
}

/* The core's clocks. */
static int64_t shell_now_ms(void *ctx) {
    (void)ctx;
    return zi_now_ms();
}

static int64_t shell_wall_ns(void *ctx) {
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Reads one multipart message: the routing id, an optional empty delimiter
 * (REQ clients), then the payload. */
static void recv_routed(shell *sh, void *sock, bool front) {
    router *rt = sh->rt;
    zmq_msg_t parts[4];
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t tmp;
        zmq_msg_init(&tmp);
        if (zmq_msg_recv(&tmp, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&tmp);
            break;
        }
        more = zmq_msg_more(&tmp);
        if (n < 4)
            parts[n++] = tmp;
        else
            zmq_msg_close(&tmp); /* over-long envelopes are dropped below */
    }
    bool ok = n == 2 || (n == 3 && zmq_msg_size(&parts[1]) == 0);
    if (ok && zmq_msg_size(&parts[0]) <= IDENT_MAX) {
        zmq_msg_t *id = &parts[0], *pl = &parts[n - 1];
        /* The connection's fd: how a disconnect finds its peer (router_watch.c). */
        bool stale = false;
        zi_router_conn conn =
            watch_frame(&sh->watch, rt, zmq_msg_get(pl, ZMQ_SRCFD), front, &stale);
        if (front) {
            zi_router_client_frame(rt, conn, zmq_msg_data(id), zmq_msg_size(id), n == 3,
                                   zmq_msg_data(pl), zmq_msg_size(pl));
            /* Its connection had closed before it was read: what it
             * started is cancelled at once, without a reply. */
            if (stale) zi_router_client_gone(rt, conn);
        } else
            zi_router_backend_frame(rt, conn, zmq_msg_data(id), zmq_msg_size(id), zmq_msg_data(pl),
                                    zmq_msg_size(pl));
    } else if (n > 0) {
        zi_log(&rt->log, ZI_LOG_WARN, "dropped a message with %d frames (expected 2)", n);
    }
    for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
}

/* Reads the messages ready on a socket, at most 256 in one turn of the
 * loop, so that the other socket and the heartbeat check keep their turn. */
static void drain(shell *sh, void *sock, bool front) {
    for (int k = 0; k < 256; k++) {
        int ev = 0;
        size_t sz = sizeof ev;
        zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &sz);
        if (!(ev & ZMQ_POLLIN)) break;
        recv_routed(sh, sock, front);
    }
}

/* The security options (docs/security.md): key files, or NULL. */
typedef struct sec_opts {
    const char *secret, *backend_keys, *client_keys;
    bool insecure;
} sec_opts;

/* The flag-only rules of the security options (no file read), checked by
 * parse_args so that --check-args refuses what a start would: 2 (logged)
 * when they conflict. */
static int check_sec(router *rt, const sec_opts *sec, const char *back) {
    if (!sec->secret && (sec->backend_keys || sec->client_keys)) {
        zi_log(&rt->log, ZI_LOG_ERROR, "%s needs --curve-secret (the router's own key)",
               sec->backend_keys ? "--backend-keys" : "--client-keys");
        return 2;
    }
    if (sec->secret && !sec->backend_keys) {
        zi_log(&rt->log, ZI_LOG_ERROR,
               "--curve-secret needs --backend-keys: the workers' and tokenizers' public keys");
        return 2;
    }
    if (!sec->secret && !zi_addr_is_loopback(back) && !sec->insecure) {
        zi_log(&rt->log, ZI_LOG_ERROR,
               "--backend %s is not a loopback address: anyone who reaches it could "
               "register as a worker and read prompts. Give --curve-secret and "
               "--backend-keys (docs/security.md), or --insecure",
               back);
        return 2;
    }
    return 0;
}

/* The command line, each value checked against options.h's table (as
 * `zinfer serve` checks what it passes on). 0 to go on, else the exit
 * status: 0 for --help and --check-args, 2 for a bad option. */
static int parse_args(int argc, char **argv, router *rt, const char **bind, const char **back,
                      sec_opts *sec) {
    zi_error err = {0};
    bool check_only = false;
    /* The defaults are the table's, set by zi_router_init. */
    *bind = zi_option_get(ZI_O_BIND)->def_text;
    *back = zi_option_get(ZI_O_BACKEND)->def_text;
    for (int i = 1; i < argc; i++) {
        zi_opt_id id;
        long long x;
        const char *v;
        if (zi_options_next(ZI_OWN_ROUTER, argc, argv, &i, &id, &x, &v, &err)) {
            fprintf(stderr, "zinfer-router: %s\n", err.msg);
            return 2;
        }
        switch (id) {
        case ZI_O_HELP:
            fputs(USAGE, stdout);
            zi_options_usage(stdout, ZI_OWN_ROUTER, 30);
            exit(0);
        case ZI_O_CHECK_ARGS:
            check_only = true;
            break;
        case ZI_O_INSECURE:
            sec->insecure = true;
            break;
        case ZI_O_BIND:
            *bind = v;
            break;
        case ZI_O_BACKEND:
            *back = v;
            break;
        case ZI_O_ROUTER_CURVE_SECRET:
            sec->secret = v;
            break;
        case ZI_O_BACKEND_KEYS:
            sec->backend_keys = v;
            break;
        case ZI_O_CLIENT_KEYS:
            sec->client_keys = v;
            break;
        case ZI_O_MAX_QUEUE:
            rt->max_queue = x;
            break;
        case ZI_O_MAX_QUEUE_PER_MODEL:
            rt->max_model_queue = x;
            break;
        case ZI_O_RESUME_GRACE:
            rt->resume_grace = x;
            break;
        case ZI_O_MAX_PROMPT_TOKENS:
            rt->max_prompt = x;
            break;
        case ZI_O_MAX_NEW_TOKENS:
            rt->max_new = x;
            break;
        case ZI_O_MAX_THINKING_TOKENS:
            rt->max_thinking = x;
            break;
        case ZI_O_MAX_EMBED_INPUTS:
            rt->max_embed_inputs = x;
            break;
        case ZI_O_MAX_EMBED_TOKENS:
            rt->max_embed_tokens = x;
            break;
        case ZI_O_HEARTBEAT_TIMEOUT:
            rt->hb_timeout = x;
            break;
        case ZI_O_FAILOVER_TIMEOUT:
            rt->failover_timeout = x;
            break;
        case ZI_O_REQUEST_TIMEOUT:
            rt->req_timeout = x;
            break;
        case ZI_O_CLIENT_HEARTBEAT:
            rt->client_hb = x;
            break;
        case ZI_O_MAX_FRAME_BYTES:
            rt->max_frame = x;
            break;
        case ZI_O_LOAD_ON_DEMAND:
            zi_router_set_on_demand(rt, true);
            break;
        case ZI_O_KEEP_ALIVE: {
            int64_t ms;
            if (zi_duration_parse(v, strlen(v), "--keep-alive", &ms, &err)) {
                fprintf(stderr, "zinfer-router: %s\n", err.msg);
                return 2;
            }
            zi_router_set_keep_alive(rt, ms);
            break;
        }
        case ZI_O_SERVED_MODELS: /* NAME[,NAME...] */
            for (const char *p = v;;) {
                size_t n = strcspn(p, ",");
                char name[4 * ZI_ROUTER_MODEL_NAME]; /* a longer one is still refused */
                snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1),
                         p);
                if (zi_router_add_model(rt, name, &err)) {
                    fprintf(stderr, "zinfer-router: %s\n", err.msg);
                    return 2;
                }
                if (!p[n]) break;
                p += n + 1;
            }
            break;
        case ZI_O_MODELS_AT_START:
            zi_router_set_starting(rt, (size_t)x);
            break;
        case ZI_O_LOG_LEVEL:
            rt->log.level = (int)x;
            break;
        default:
            break; /* the table gives the router no other option */
        }
    }
    int rc = check_sec(rt, sec, *back);
    if (rc) return rc;
    if (check_only) exit(0);
    return 0;
}

/* hb_ms: ZMTP heartbeat interval (0: none); hb_timeout_ms: a connection
 * silent that long after a ping is closed. max_msg: the largest message
 * ZeroMQ takes from a peer (-1: any); one
 * larger closes that peer's connection without a reply, and is never held
 * in memory whole. */
static void *make_router_socket(router *rt, void *zctx, const char *addr, const char *what,
                                int64_t max_msg, const zi_curve_key *secret, long long hb_ms,
                                long long hb_timeout_ms) {
    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    zi_error err = {0};
    if (secret && zi_curve_set_server(s, secret, what, &err) != ZI_OK) {
        zi_log(&rt->log, ZI_LOG_ERROR, "the %s socket: %s", what, err.msg);
        zmq_close(s);
        return NULL;
    }
    int one = 1, zero = 0;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_msg, sizeof max_msg);
    /* Unroutable sends fail (EHOSTUNREACH) instead of vanishing: that is
     * how a departed client is noticed. No high-water mark: the router
     * never blocks on one slow peer. */
    zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (hb_ms > 0) { /* ZMTP heartbeats: a silent peer's connection is closed */
        int ivl = (int)hb_ms, timeout = (int)hb_timeout_ms;
        zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
        zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
        zmq_setsockopt(s, ZMQ_HEARTBEAT_TTL, &timeout, sizeof timeout);
    }
    if (zmq_bind(s, addr) != 0) {
        zi_log(&rt->log, ZI_LOG_ERROR, "cannot bind the %s socket to %s: %s", what, addr,
               zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* The keys the router runs with (docs/security.md). */
typedef struct router_keys {
    bool on; /* --curve-secret given */
    zi_curve_key secret, pub;
    zi_curve_keys backend, client;
} router_keys;

static void free_keys(router_keys *k) {
    memset(&k->secret, 0, sizeof k->secret);
    zi_curve_keys_free(&k->backend);
    zi_curve_keys_free(&k->client);
}

/* Checks the security options together and reads the key files. Nonzero
 * (logged) when they do not fit: a list without a secret key, a secret
 * without a backend list, a non-loopback backend without keys and without
 * --insecure, a bad key file. */
/* The keys the security options name (check_sec has passed): 2 (logged)
 * when a file cannot be read. */
static int load_keys(router *rt, const sec_opts *sec, const char *back, router_keys *k) {
    zi_error err = {0};
    if (!sec->secret) {
        if (!zi_addr_is_loopback(back))
            zi_log(&rt->log, ZI_LOG_WARN,
                   "--insecure: backend socket %s accepts any worker or tokenizer", back);
        return 0;
    }
    int rc = zi_curve_load_key("--curve-secret", sec->secret, true, &k->secret, &err);
    if (!rc) rc = zi_curve_public(&k->secret, &k->pub, &err);
    if (!rc) rc = zi_curve_load_list("--backend-keys", sec->backend_keys, &k->backend, &err);
    if (!rc && sec->client_keys)
        rc = zi_curve_load_list("--client-keys", sec->client_keys, &k->client, &err);
    if (rc) {
        zi_log(&rt->log, ZI_LOG_ERROR, "%s", err.msg);
        free_keys(k);
        return 2;
    }
    k->on = true;
    return 0;
}

int main(int argc, char **argv) {
    router rt;
    shell sh = {.rt = &rt};
    /* The core's defaults, then parse_args sets the option table's. */
    if (zi_router_init(
            &rt,
            &(zi_router_io){
                .ctx = &sh, .send = shell_send, .now_ms = shell_now_ms, .wall_ns = shell_wall_ns},
            (zi_logger){.out = stderr, .level = ZI_LOG_INFO, .tag = "zinfer-router"}))
        return 1; /* (an outbox without a function: never with the one above) */
    const char *bind = "tcp://127.0.0.1:5555", *back = "tcp://127.0.0.1:5556";
    sec_opts sec = {0};
    int rc = parse_args(argc, argv, &rt, &bind, &back, &sec);
    if (rc) return rc;
    router_keys keys = {0};
    if (load_keys(&rt, &sec, back, &keys)) return 2;
    zi_stop_signals_install();
    void *zctx = zmq_ctx_new();
    /* The ZAP handler is bound before any CURVE socket, so that no
     * handshake happens without it. */
    zi_zap zap = {0};
    zi_error err = {0};
    if (keys.on && zi_zap_start(&zap, zctx, &keys.backend, sec.client_keys ? &keys.client : NULL,
                                &rt.log, &err)) {
        zi_log(&rt.log, ZI_LOG_ERROR, "%s", err.msg);
        zmq_ctx_term(zctx);
        free_keys(&keys);
        return 1;
    }
    /* Frames up to --max-frame-bytes are read, larger ones up to 4x that
     * are answered with an error, anything larger drops the connection:
     * one client cannot make the router hold an unbounded frame. */
    sh.front =
        make_router_socket(&rt, zctx, bind, ZI_ZAP_DOMAIN_CLIENT, 4 * (int64_t)rt.max_frame,
                           sec.client_keys ? &keys.secret : NULL, rt.client_hb, 3 * rt.client_hb);
    /* Backends' connections carry ZMTP heartbeats both ways, with the
     * backends' values (protocol/wire.h): a backend host that went silent
     * without a close (its network, its power) has its connection closed
     * here after ZI_BACKEND_HB_TIMEOUT_MS, so it is declared dead then
     * (router_watch.c) even under a longer --heartbeat-timeout. Its own end
     * drops the connection as soon, so when it is back it registers anew
     * and drops what it ran: keeping it alive here longer only held those
     * requests (tests/e2e/test_multihost.py). */
    sh.back = sh.front ? make_router_socket(&rt, zctx, back, ZI_ZAP_DOMAIN_BACKEND, -1,
                                            keys.on ? &keys.secret : NULL, ZI_BACKEND_HB_IVL_MS,
                                            ZI_BACKEND_HB_TIMEOUT_MS)
                       : NULL;
    if (!sh.front || !sh.back) {
        if (sh.front) zmq_close(sh.front);
        zi_zap_stop(&zap);
        zmq_ctx_term(zctx);
        free_keys(&keys);
        return 1;
    }
    zi_log(&rt.log, ZI_LOG_INFO, "clients on %s%s, backends on %s%s", bind,
           sec.client_keys ? " (CURVE, listed keys only)" : "", back,
           keys.on ? " (CURVE, listed keys only)" : "");
    if (keys.on)
        zi_log(&rt.log, ZI_LOG_INFO, "router public key %s; %zu backend key(s)%s", keys.pub.z85,
               keys.backend.n, sec.client_keys ? ", client keys on" : "");
    watch_start(&sh.watch, &rt.log, zctx, sh.front, true);
    watch_start(&sh.watch, &rt.log, zctx, sh.back, false);
    int64_t last_check = zi_now_ms(), last_trim = last_check;
    while (!zi_stop_requested()) {
        zmq_pollitem_t it[4] = {{sh.front, 0, ZMQ_POLLIN, 0}, {sh.back, 0, ZMQ_POLLIN, 0}};
        int n_it = 2;
        for (int m = 0; m < 2; m++)
            if (sh.watch.mon[m]) it[n_it++] = (zmq_pollitem_t){sh.watch.mon[m], 0, ZMQ_POLLIN, 0};
        int pr = zmq_poll(it, n_it, 100);
        if (pr < 0 && errno != EINTR) {
            zi_log(&rt.log, ZI_LOG_ERROR, "poll: %s", zmq_strerror(errno));
            break;
        }
        /* Backends first: their replies free capacity for new requests. */
        if (pr > 0 && (it[1].revents & ZMQ_POLLIN)) drain(&sh, sh.back, false);
        if (pr > 0 && (it[0].revents & ZMQ_POLLIN)) drain(&sh, sh.front, true);
        /* Connections accepted and closed (each frame read also reads its
         * socket's monitor first: router_watch.c). */
        watch_drain(&sh.watch, &rt, false);
        watch_drain(&sh.watch, &rt, true);
        int64_t now = zi_now_ms();
        if (now - last_check >= 100) { /* heartbeats, failover timeouts, deadlines */
            last_check = now;
            zi_router_tick(&rt);
        }
#ifdef __GLIBC__
        /* The router's heap is a few MB that rise and fall with the load;
         * glibc keeps freed pages of its arenas (ZeroMQ's I/O thread has
         * its own) resident, so the resident size would follow the
         * highest burst ever seen. Handing free pages back every 10 s
         * keeps it at what is in use (the soak checks that it stays flat). */
        if (now - last_trim >= 10000) {
            last_trim = now;
            malloc_trim(0);
        }
#endif
    }
    /* Shutting down: every request still in flight gets its terminal frame. */
    zi_log(&rt.log, ZI_LOG_INFO, "shutting down with %zu requests in flight",
           zi_req_table_count(&rt.reqs));
    zi_router_shutdown(&rt);
    /* The sockets drop unsent frames on close (LINGER 0, so that a gone peer
     * never holds the router); the terminal frames just queued get a
     * second to leave. */
    int linger_ms = 1000;
    zmq_setsockopt(sh.front, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_close(sh.front);
    zmq_close(sh.back);
    watch_stop(&sh.watch);
    zi_zap_stop(&zap);
    zmq_ctx_term(zctx);
    free_keys(&keys);
    return 0;
}
