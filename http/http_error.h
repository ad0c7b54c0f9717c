/*
 * http_error.h - zinfer-http's errors in OpenAI's shape,
 * {"error": {"message", "type", "param", "code"}}, with their HTTP status,
 * and the mapping of the router's error replies (docs/protocol.md: code,
 * message, field) onto them (docs/http.md lists every status).
 */
#ifndef ZI_HTTP_ERROR_H
#define ZI_HTTP_ERROR_H

#include <jansson.h>
#include <stddef.h>

#define ZI_HTTP_MSG_MAX 600

/* One error to send: status, OpenAI "type" and "code", the request field at
 * fault ("param", empty when none) and a message that names the problem. */
typedef struct zi_http_error {
    int status;
    const char *type; /* "invalid_request_error", ... (static strings) */
    char code[48];    /* "invalid_value", "model_not_found", ... or "" */
    char param[128];
    char message[ZI_HTTP_MSG_MAX];
} zi_http_error;

/* Fills e; status decides the type (400/404/405/413 invalid_request_error,
 * 401 authentication_error, 429 rate_limit_error, 503 service_unavailable,
 * 504 timeout_error, others server_error). code and param may be NULL (copied). Returns -1 (so
 * parsers can write `return zi_http_fail(...)`). */
int zi_http_fail(zi_http_error *e, int status, const char *code, const char *param, const char *fmt,
                 ...) __attribute__((format(printf, 5, 6)));

/* "an object", "an array", "a string", "an integer", "a number", "a
 * boolean" or "null" (v NULL too): a JSON value's type in an error. */
const char *zi_http_type_name(const json_t *v);

/* A 400 invalid_type naming field: "field: expected <what>, got <type>".
 * Returns -1. */
int zi_http_want(zi_http_error *e, const char *field, const char *what, const json_t *v);

/* A 400 unknown_parameter naming the first key of o not among keys[0..n)
 * (the endpoints that refuse unknown fields). 0 when every key is known. */
int zi_http_known_keys(json_t *o, const char *const *keys, size_t n, zi_http_error *e);

/* The error object as JSON (a new reference). */
json_t *zi_http_error_json(const zi_http_error *e);

/* A router "error" reply (code, message, field; field may be NULL) as an
 * HTTP error. field_map translates the router's field names back to the
 * request's (pairs of router prefix, OpenAI name; NULL-terminated; may be
 * NULL): "sampling_params.max_new_tokens" -> "max_tokens". An unknown
 * model_name is a 404 model_not_found; overloaded 429, unavailable 503,
 * worker_lost and internal 500. Returns -1. */
int zi_http_router_error(zi_http_error *e, const char *code, const char *message, const char *field,
                         const char *const *field_map);

#endif
