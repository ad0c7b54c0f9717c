/*
 * http_server.c - the libmicrohttpd daemon of zinfer-http (http_server.h).
 *
 * A request's body is gathered (up to max_body; a larger Content-Length is
 * refused before any of it is read) and the API key checked; then
 * zi_http_handle answers, and its JSON or its SSE stream is sent. MHD's
 * connection timeout closes a connection idle for timeout_s, whether it
 * stalls in its headers, its body, or reading a stream; a stream whose
 * connection closes is freed, which cancels its generation.
 *
 * A client that dribbles its header a byte at a time is never idle, so the
 * header has a total limit too (header_timeout_s): MHD's connection
 * notifications keep a list of the open connections (ctx->watch), each
 * with the time by which its request's header must be whole: header_timeout_s
 * after accept for the first request; timeout_s + header_timeout_s after
 * the previous answer for a kept-alive connection's next one (it may idle
 * as long as before, then has the header's time). The access handler's
 * first call (made once the header is whole) stops that clock. The serving loop looks at the list
 * every 100 ms and shuts down the socket of a connection waiting too long:
 * MHD then sees the connection end, as if the client had closed it, and
 * cleans it up in its own thread (the socket stays open until MHD's
 * "closed" notification, which unlinks it under the same mutex first).
 */
#include "http_server.h"

#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <microhttpd.h>

#include "http_endpoints.h"
#include "http_error.h"
#include "http_messages.h"
#include "http_page.h"
#include "stop_signal.h"

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

typedef struct req_state {
    char *body;
    size_t len, cap;
    int too_large;
} req_state;

static int64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The connection's node in ctx->watch (NULL when it could not be made). */
static zi_http_watched *watched_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Stops the header clock of conn's node (waiting 0), or starts it for a
 * kept-alive connection's next request (waiting 1): that one may first idle
 * for the idle timeout, as before, and then has the header's time. */
static void header_clock(zi_http_ctx *ctx, struct MHD_Connection *conn, int waiting) {
    zi_http_watched *w = watched_of(conn);
    if (!w) return;
    pthread_mutex_lock(&ctx->watch.mu);
    w->waiting = waiting;
    if (waiting)
        w->deadline_ms =
            mono_ms() + ((int64_t)ctx->cfg.timeout_s + ctx->cfg.header_timeout_s) * 1000;
    pthread_mutex_unlock(&ctx->watch.mu);
}

/* MHD's connection notifications: link a node at accept, unlink it at
 * close (before MHD closes the socket). */
static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe) {
    zi_http_ctx *ctx = cls;
    zi_http_watch *wl = &ctx->watch;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        zi_http_watched *w = ci ? calloc(1, sizeof *w) : NULL;
        *socket_context = w;
        if (!w) return; /* not watched: the idle timeout still bounds it */
        w->fd = (int)ci->connect_fd;
        w->waiting = 1;
        w->deadline_ms = mono_ms() + (int64_t)ctx->cfg.header_timeout_s * 1000;
        pthread_mutex_lock(&wl->mu);
        w->next = wl->head;
        if (wl->head) wl->head->prev = w;
        wl->head = w;
        pthread_mutex_unlock(&wl->mu);
        return;
    }
    zi_http_watched *w = *socket_context;
    if (!w) return;
    pthread_mutex_lock(&wl->mu);
    if (w->prev)
        w->prev->next = w->next;
    else
        wl->head = w->next;
    if (w->next) w->next->prev = w->prev;
    pthread_mutex_unlock(&wl->mu);
    free(w);
    *socket_context = NULL;
}

/* The watchdog's round: shuts down the socket of every connection whose
 * header is overdue (once; MHD closes it). */
static void cut_slow_headers(zi_http_ctx *ctx) {
    int64_t now = mono_ms();
    pthread_mutex_lock(&ctx->watch.mu);
    for (zi_http_watched *w = ctx->watch.head; w; w = w->next)
        if (w->waiting && !w->cut && now >= w->deadline_ms) {
            w->cut = 1;
            shutdown(w->fd, SHUT_RDWR);
            zi_log(ctx->cfg.lg, ZI_LOG_DEBUG,
                   "closing a connection: its request header was not whole in time "
                   "(--header-timeout %u s)",
                   ctx->cfg.header_timeout_s);
        }
    pthread_mutex_unlock(&ctx->watch.mu);
}

static MHD_Result_t queue_json(struct MHD_Connection *conn, int status, json_t *o,
                               const char *allow) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return MHD_NO;
    size_t n = strlen(s);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    /* 504 is a passed deadline: the same request would time out again, so
     * the OpenAI SDKs (which retry 408 and 5xx) are told not to. */
    if (status == 504) MHD_add_response_header(r, "x-should-retry", "false");
    MHD_Result_t rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

/* An error before a path's handler ran, in the shape of the path's API. */
static MHD_Result_t queue_error(struct MHD_Connection *conn, const char *url,
                                const zi_http_error *e) {
    return queue_json(conn, e->status,
                      url && zi_http_messages_path(url) ? zi_http_messages_error_json(e)
                                                        : zi_http_error_json(e),
                      NULL);
}

/* A file of the chat page (http_page.h): GET and HEAD (MHD drops the
 * body), with its type and the policy that keeps the page to this origin;
 * another method is a 405. */
static MHD_Result_t queue_page(struct MHD_Connection *conn, const char *method,
                               const zi_http_page_file *f) {
    if (strcmp(method, "GET") && strcmp(method, "HEAD")) {
        zi_http_error e;
        zi_http_fail(&e, 405, "method_not_allowed", NULL,
                     "%s: the method is not allowed on the chat page (use GET)", method);
        return queue_json(conn, e.status, zi_http_error_json(&e), "GET, HEAD");
    }
    /* the bytes are the binary's own constant data: MHD need not copy them */
    struct MHD_Response *r =
        MHD_create_response_from_buffer(f->size, (void *)f->data, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", zi_http_page_type(f));
    MHD_add_response_header(r, "Content-Security-Policy", ZI_HTTP_PAGE_CSP);
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_Result_t rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = zi_http_stream_read(cls, buf, max);
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void free_stream(void *cls) {
    zi_http_stream_free(cls);
}

static ssize_t read_audio(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    ssize_t n = zi_http_audio_read(cls, buf, max);
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void free_audio(void *cls) {
    zi_http_audio_free(cls);
}

/* h against the key, in time independent of where they differ. */
static int key_matches(const char *h, const char *key) {
    size_t n = strlen(h), k = strlen(key);
    unsigned char diff = n != k;
    for (size_t i = 0; i < n && i < k; i++) diff |= (unsigned char)(h[i] ^ key[i]);
    return !diff;
}

/* The key as OpenAI's clients send it (Authorization: Bearer KEY) or as
 * Anthropic's do (x-api-key: KEY); either header may hold it. */
static int authorized(const zi_http_config *cfg, struct MHD_Connection *conn) {
    const char *key = cfg->api_key;
    if (!key || !key[0]) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    int ok = h && !strncasecmp(h, "Bearer ", 7) && key_matches(h + 7, key);
    return ok | (x && key_matches(x, key));
}

static MHD_Result_t on_request(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
    (void)version;
    zi_http_ctx *ctx = cls;
    const zi_http_config *cfg = &ctx->cfg;
    req_state *st = *con_cls;
    zi_http_error e;
    if (!st) {
        header_clock(ctx, conn, 0); /* the header is whole */
        if (!(st = calloc(1, sizeof *st))) return MHD_NO;
        *con_cls = st;
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > cfg->max_body) {
            zi_http_fail(&e, 413, "body_too_large", NULL,
                         "the body (%s bytes) is larger than the limit of %zu bytes", cl,
                         cfg->max_body);
            return queue_error(conn, url, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) { /* more of the body: kept up to the limit, then dropped */
        if (st->len + *upload_size > cfg->max_body) st->too_large = 1;
        if (!st->too_large) {
            if (st->len + *upload_size > st->cap) {
                size_t c = st->cap ? st->cap : 4096;
                while (c < st->len + *upload_size) c *= 2;
                char *b = realloc(st->body, c);
                if (!b) return MHD_NO;
                st->body = b, st->cap = c;
            }
            memcpy(st->body + st->len, upload, *upload_size);
            st->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (st->too_large) {
        zi_http_fail(&e, 413, "body_too_large", NULL,
                     "the body is larger than the limit of %zu bytes", cfg->max_body);
        return queue_error(conn, url, &e);
    }
    /* The chat page is public, as llama-server's web UI is: it holds no
     * data, and the API it calls checks the key (the page has a field). */
    const zi_http_page_file *page = cfg->no_webui ? NULL : zi_http_page_find(url);
    if (page) return queue_page(conn, method, page);
    if (strcmp(url, "/health") && !authorized(cfg, conn)) {
        zi_http_fail(&e, 401, "invalid_api_key", NULL,
                     "a valid API key is needed: send 'Authorization: Bearer KEY' or "
                     "'x-api-key: KEY'");
        return queue_error(conn, url, &e);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    int fd = ci ? (int)ci->connect_fd : -1;
    zi_http_answer a;
    zi_http_handle(ctx, method, url, st->body ? st->body : "", st->len, fd, &a);
    zi_log(cfg->lg, ZI_LOG_DEBUG, "%s %s -> %d%s", method, url, a.status,
           a.stream ? " (stream)" : "");
    if (a.text) {
        struct MHD_Response *r =
            MHD_create_response_from_buffer(a.text_len, a.text, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            free(a.text);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type",
                                a.content_type ? a.content_type
                                               : "text/plain; version=0.0.4; charset=utf-8");
        MHD_Result_t rc = MHD_queue_response(conn, (unsigned)a.status, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (a.audio) { /* chunked: the bytes as the speech op's chunks bring them */
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                                   read_audio, a.audio, free_audio);
        if (!r) {
            zi_http_audio_free(a.audio);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", a.content_type);
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_Result_t rc = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        return rc;
    }
    if (!a.stream) return queue_json(conn, a.status, a.json, a.allow);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_stream,
                                                               a.stream, free_stream);
    if (!r) {
        zi_http_stream_free(a.stream);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_Result_t rc = MHD_queue_response(conn, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)toe;
    header_clock(cls, conn, 1); /* a kept-alive connection waits for the next header */
    req_state *st = *con_cls;
    if (st) {
        free(st->body);
        free(st);
    }
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    const zi_http_ctx *ctx = cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = '\0';
    zi_log(ctx->cfg.lg, ZI_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

int zi_http_serve(zi_http_ctx *ctx) {
    const zi_http_config *cfg = &ctx->cfg;
    signal(SIGPIPE, SIG_IGN);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) {
        zi_log(cfg->lg, ZI_LOG_ERROR, "cannot resolve %s: %s", cfg->host, gai_strerror(gai));
        return 1;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_request, ctx, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT,
        cfg->timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, cfg->max_header,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, ctx, MHD_OPTION_NOTIFY_CONNECTION, on_connection,
        ctx, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, ctx, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        zi_log(cfg->lg, ZI_LOG_ERROR, "cannot listen on %s:%d (in use, or not an address here)",
               cfg->host, cfg->port);
        return 1;
    }
    zi_log(cfg->lg, ZI_LOG_INFO, "serving OpenAI HTTP on http://%s:%d", cfg->host, cfg->port);
    while (!zi_stop_requested()) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        cut_slow_headers(ctx);
    }
    zi_log(cfg->lg, ZI_LOG_INFO, "stopping");
    MHD_stop_daemon(d);
    return 0;
}
