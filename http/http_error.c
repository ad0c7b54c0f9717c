/*
 * http_error.c - OpenAI-shaped errors and the router's error codes mapped
 * onto HTTP statuses (http_error.h).
 */
#include "http_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *type_of(int status) {
    switch (status) {
    case 400:
    case 404:
    case 405:
    case 409:
    case 413:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable_error";
    case 504:
        return "timeout_error";
    default:
        return "server_error";
    }
}

int zi_http_fail(zi_http_error *e, int status, const char *code, const char *param, const char *fmt,
                 ...) {
    e->status = status;
    e->type = type_of(status);
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

json_t *zi_http_error_json(const zi_http_error *e) {
    json_t *in = json_object();
    /* The message may hold a piece of the client's input: jansson refuses
     * invalid UTF-8, so such a message is replaced rather than lost. */
    json_t *msg = json_string(e->message);
    json_object_set_new(in, "message", msg ? msg : json_string("(message not valid UTF-8)"));
    json_object_set_new(in, "type", json_string(e->type));
    json_t *param = e->param[0] ? json_string(e->param) : NULL;
    json_object_set_new(in, "param", param ? param : json_null());
    json_object_set_new(in, "code", e->code[0] ? json_string(e->code) : json_null());
    json_t *o = json_object();
    json_object_set_new(o, "error", in);
    return o;
}

/* field with its router prefix replaced by the request's name; out may be
 * field itself unchanged. */
static void map_field(const char *field, const char *const *map, char *out, size_t cap) {
    snprintf(out, cap, "%s", field);
    if (!map) return;
    for (int i = 0; map[i]; i += 2) {
        size_t n = strlen(map[i]);
        if (!strncmp(field, map[i], n) &&
            (map[i][n - 1] == '.' || field[n] == '\0' || field[n] == '.' || field[n] == '[')) {
            snprintf(out, cap, "%s%s", map[i + 1], field + n);
            return;
        }
    }
}

int zi_http_router_error(zi_http_error *e, const char *code, const char *message, const char *field,
                         const char *const *field_map) {
    char param[128] = "";
    if (field && field[0]) map_field(field, field_map, param, sizeof param);
    /* The router's message starts with its own field path: say the
     * request's name instead, so the message names what the client sent. */
    const char *rest = message;
    size_t fl = field ? strlen(field) : 0;
    if (fl && !strncmp(message, field, fl)) rest = message + fl;
    char msg[ZI_HTTP_MSG_MAX];
    if (rest != message)
        snprintf(msg, sizeof msg, "%s%s", param, rest);
    else
        snprintf(msg, sizeof msg, "%s", message);
    if (!strcmp(code, "invalid_request") && field && !strcmp(field, "model_name"))
        return zi_http_fail(e, 404, "model_not_found", "model", "%s", msg);
    if (!strcmp(code, "invalid_request"))
        return zi_http_fail(e, 400, "invalid_value", param, "%s", msg);
    if (!strcmp(code, "unsupported"))
        return zi_http_fail(e, 400, "unsupported_value", param, "%s", msg);
    if (!strcmp(code, "overloaded")) return zi_http_fail(e, 429, "overloaded", NULL, "%s", msg);
    if (!strcmp(code, "unavailable")) return zi_http_fail(e, 503, "unavailable", NULL, "%s", msg);
    /* LoRA adapters loaded and unloaded while serving (docs/lora.md) */
    if (!strcmp(code, "not_found")) return zi_http_fail(e, 404, "not_found", param, "%s", msg);
    if (!strcmp(code, "in_use")) return zi_http_fail(e, 409, "in_use", param, "%s", msg);
    if (!strcmp(code, "insufficient_memory"))
        return zi_http_fail(e, 507, "insufficient_memory", param, "%s", msg);
    return zi_http_fail(e, 500, code, param, "%s", msg);
}

const char *zi_http_type_name(const json_t *v) {
    switch (v ? json_typeof(v) : JSON_NULL) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

int zi_http_want(zi_http_error *e, const char *field, const char *what, const json_t *v) {
    return zi_http_fail(e, 400, "invalid_type", field, "%s: expected %s, got %s", field, what,
                        zi_http_type_name(v));
}

int zi_http_known_keys(json_t *o, const char *const *keys, size_t n, zi_http_error *e) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int known = 0;
        for (size_t i = 0; i < n; i++) known |= !strcmp(k, keys[i]);
        if (!known) return zi_http_fail(e, 400, "unknown_parameter", k, "%s: unknown parameter", k);
    }
    return 0;
}
