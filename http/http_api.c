/*
 * http_api.c - OpenAI's chat completions and completions as zi_http_api
 * instances (http_api.h): the request parsed by http_request.c, the answer
 * rendered by http_reply.c, errors in OpenAI's shape (http_error.c).
 */
#include "http_api.h"

static int parse_chat(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                      zi_http_error *e) {
    return zi_http_parse_generate(body, len, ZI_HTTP_CHAT, &ctx->cfg.images, g, e);
}

static int parse_completion(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                            zi_http_error *e) {
    return zi_http_parse_generate(body, len, ZI_HTTP_COMPLETION, &ctx->cfg.images, g, e);
}

/* vLLM's way: data: {"error": {...}}, then the stream's usual end. */
static int openai_stream_error(zi_http_result *r, const zi_http_error *e, char **out, size_t *len,
                               size_t *cap) {
    (void)r;
    return zi_http_render_stream_error(e, out, len, cap) ||
                   zi_http_buf_add(out, len, cap, "data: [DONE]\n\n", 14)
               ? -1
               : 0;
}

const zi_http_api zi_http_api_chat = {
    .name = "chat.completions",
    .parse = parse_chat,
    .full = zi_http_render_full,
    .delta = zi_http_render_delta,
    .end = zi_http_render_end,
    .stream_error = openai_stream_error,
    .error_json = zi_http_error_json,
};

const zi_http_api zi_http_api_completions = {
    .name = "completions",
    .parse = parse_completion,
    .full = zi_http_render_full,
    .delta = zi_http_render_delta,
    .end = zi_http_render_end,
    .stream_error = openai_stream_error,
    .error_json = zi_http_error_json,
};
