/*
 * http_ctx.h - the state of one zinfer-http process, in one struct that
 * http_main.c creates and passes down (no file-scope globals): the HTTP
 * settings, the router's address and how long to wait for it, the served
 * models once the router named them, and the text of single token ids (for
 * log probabilities, per model). libmicrohttpd hands it back to the server's
 * callbacks as their `cls`; the endpoints and the router connection get it
 * as a parameter (a zi_http_conn remembers the context it was opened on).
 *
 * Threads: one per HTTP connection, all sharing the context. cfg, lim,
 * zctx and router_addr are set before serving and only read after; model,
 * tok and watch change while serving and are guarded by their own mutex.
 */
#ifndef ZI_HTTP_CTX_H
#define ZI_HTTP_CTX_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "http_images.h"
#include "log.h"
#include "zi_error.h"

/* The most models --model-tool-call-format names (zinfer serve's). */
#define ZI_HTTP_MAX_TOOL_FORMATS 64

/* The HTTP side's settings (http_server.h). */
typedef struct zi_http_config {
    char host[256]; /* listen address (name or IP) */
    int port;
    const char *api_key;       /* NULL or "": no key needed */
    size_t max_body;           /* bytes of one request body (else 413) */
    size_t max_header;         /* bytes of one request's header (MHD's per-connection memory) */
    unsigned max_connections;  /* open connections at once (more are refused) */
    unsigned timeout_s;        /* a connection idle this long is closed */
    unsigned header_timeout_s; /* a request's header must be whole this long after the
                                  connection opened (after the previous answer, once
                                  idle for timeout_s) */
    /* images in one request, and bytes of one (--max-images,
     * --max-image-bytes; http_images.h) */
    zi_http_image_limits images;
    /* --tool-call-format (a zi_tool_format; AUTO parses as generic: zinfer
     * serve passes the one its chat template asks for) */
    int tool_format;
    /* --model-tool-call-format NAME=F: a model's own format (zinfer serve
     * passes each model's when it has several: their chat templates
     * differ); a model not listed takes tool_format (zi_http_tool_format) */
    struct {
        char name[128];
        int format;
    } model_tool_format[ZI_HTTP_MAX_TOOL_FORMATS];
    int n_model_tool_format;
    const zi_logger *lg;
    int reasoning_format; /* zi_reasoning_format: a chat request's unless it names one */
    int no_webui;         /* --no-webui: no chat page at / (http_page.h) */
} zi_http_config;

/* The waits the endpoints allow the router (http_endpoints.h). */
typedef struct zi_http_limits {
    int router_timeout_ms; /* the longest wait for the router's next reply */
    int health_timeout_ms; /* the longest wait for health / models / metrics */
} zi_http_limits;

/* The router's models op, remembered once it answered with every model
 * loaded (the models of a running server do not change); n is 0 until
 * then. name[0] is the default model. */
#define ZI_HTTP_MAX_MODELS 64
typedef struct zi_http_model {
    pthread_mutex_t mu;
    int n;
    char name[ZI_HTTP_MAX_MODELS][128];
    long long max_length[ZI_HTTP_MAX_MODELS];
} zi_http_model;

/* Token id -> text: an open-addressing table grown at half full; entries
 * are never removed (a vocabulary is finite), so a text stays valid until
 * zi_http_ctx_destroy. */
typedef struct zi_http_tok_cache {
    pthread_mutex_t mu;
    int64_t *ids;
    char **text;
    size_t cap, n;
} zi_http_tok_cache;

/* One open connection, as the header watchdog sees it (http_server.c):
 * its socket, and by when its request's header must be whole (waiting 0:
 * a request is being read or answered). Linked into zi_http_watch while
 * libmicrohttpd has the connection open; the socket is open as long as
 * the node is linked (libmicrohttpd says "closed" before closing it). */
typedef struct zi_http_watched {
    struct zi_http_watched *prev, *next;
    int fd;
    int waiting;
    int cut;             /* the watchdog shut the socket down already */
    int64_t deadline_ms; /* CLOCK_MONOTONIC */
} zi_http_watched;

/* The connections open now; the mutex guards the list and every node. */
typedef struct zi_http_watch {
    pthread_mutex_t mu;
    zi_http_watched *head;
} zi_http_watch;

typedef struct zi_http_ctx {
    zi_http_config cfg;
    zi_http_limits lim;
    void *zctx;              /* the ZeroMQ context (the caller's; not terminated here) */
    const char *router_addr; /* the router's client address (the caller's string) */
    zi_http_model model;
    zi_http_tok_cache tok;
    zi_http_watch watch;
    /* The Responses API's stored responses (response_store.h: thread safe
     * on its own); made by the caller after zi_http_ctx_init, which leaves
     * it NULL (then nothing is stored), and freed by the caller. */
    struct zi_response_store *responses;
} zi_http_ctx;

/* Copies cfg and lim, keeps zctx and router_addr, and starts with no model
 * and no token texts known. 0, or -1 when a mutex cannot be made. */
int zi_http_ctx_init(zi_http_ctx *x, const zi_http_config *cfg, const zi_http_limits *lim,
                     void *zctx, const char *router_addr);
/* Frees the token texts and the mutexes; no thread may use x any more. */
void zi_http_ctx_destroy(zi_http_ctx *x);

/* Adds --model-tool-call-format's value v (NAME=F[,NAME=F...], F a
 * --tool-call-format choice other than auto) to cfg: 0, or -1 with err
 * naming the flag and the bad part (an entry without '=', an empty or
 * over-long name, an unknown format, more than ZI_HTTP_MAX_TOOL_FORMATS
 * models). A name given again takes the later format. */
int zi_http_model_tool_formats_add(zi_http_config *cfg, const char *v, zi_error *err);

/* The tool-call format (a zi_tool_format) of a request for model (its
 * served name, the default resolved; "MODEL:ADAPTER" is MODEL's): the one
 * --model-tool-call-format gives that model, else cfg->tool_format. */
int zi_http_tool_format(const zi_http_config *cfg, const char *model);

#endif
