/*
 * http_api.h - one generation API of zinfer-http: how its request body
 * becomes the router's `generate` requests and how the router's replies
 * become its answer. OpenAI's chat completions and completions
 * (http_request.c, http_reply.c) are two; Anthropic's Messages and
 * OpenAI's Responses are others. http_endpoints.c runs each the same way:
 * parse, send one request per choice, gather the frames (http_reply.h's
 * zi_http_result, the same for all), render. So streaming, cancellation,
 * failover, deadlines and structured output work alike under every API.
 */
#ifndef ZI_HTTP_API_H
#define ZI_HTTP_API_H

#include <jansson.h>
#include <stddef.h>

#include "http_ctx.h"
#include "http_error.h"
#include "http_reply.h"
#include "http_request.h"
#include "http_router.h"

typedef struct zi_http_api {
    const char *name; /* for logs: "chat.completions", "messages", ... */
    /* The body (len bytes, not NUL-terminated) into g, its router requests
     * built (zi_http_parse_generate_json does that from an OpenAI-shaped
     * object). 0, or -1 with e set naming the client's field. ctx is the
     * process' context (a store of earlier answers lives there, say).
     * A g->model left "" skips the served-model check. */
    int (*parse)(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g, zi_http_error *e);
    /* The whole answer (no stream), once every choice is final. NULL with e
     * set. */
    json_t *(*full)(zi_http_result *r, zi_http_conn *c, zi_http_error *e);
    /* A stream's bytes for delta d, appended to *out (zi_http_buf_add).
     * 0, or -1 with e set. */
    int (*delta)(zi_http_result *r, const zi_http_delta *d, zi_http_conn *c, char **out,
                 size_t *len, size_t *cap, zi_http_error *e);
    /* A stream's last bytes, after every choice's final delta. 0 or -1. */
    int (*end)(zi_http_result *r, char **out, size_t *len, size_t *cap);
    /* An error inside a stream: its bytes and the stream's last ones (the
     * stream ends after them). 0 or -1. */
    int (*stream_error)(zi_http_result *r, const zi_http_error *e, char **out, size_t *len,
                        size_t *cap);
    /* An error answered with its status before any stream began: the body
     * (a new reference). */
    json_t *(*error_json)(const zi_http_error *e);
} zi_http_api;

/* OpenAI's POST /v1/chat/completions and POST /v1/completions. */
extern const zi_http_api zi_http_api_chat;
extern const zi_http_api zi_http_api_completions;

#endif
