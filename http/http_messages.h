/*
 * http_messages.h - Anthropic's Messages API for zinfer-http
 * (docs/http.md, "Anthropic Messages"): POST /v1/messages and POST
 * /v1/messages/count_tokens as generation APIs (http_api.h).
 *
 * A Messages request is checked field by field (errors name the client's
 * field as Anthropic's API does: "messages.1.content.0.tool_use_id") and
 * translated into an OpenAI chat-completions object, which
 * zi_http_parse_generate_json turns into the router's request: system
 * prompt, text, tool_use and tool_result blocks, tools and tool_choice
 * (any / tool held by the grammar engine), sampling, stop sequences and
 * thinking. The reply is rendered from chat_stream's events (reasoning,
 * text, tool calls), so a streamed message (message_start,
 * content_block_start / delta / stop, message_delta, message_stop, ping)
 * joins to exactly the unstreamed one. Errors are Anthropic's
 * {"type": "error", "error": {"type", "message"}}.
 */
#ifndef ZI_HTTP_MESSAGES_H
#define ZI_HTTP_MESSAGES_H

#include <jansson.h>

#include "http_api.h"
#include "http_error.h"

/* POST /v1/messages. */
extern const zi_http_api zi_http_api_messages;

/* POST /v1/messages/count_tokens: {"input_tokens": N}, the prompt's tokens
 * as the same request to /v1/messages counts them (usage.input_tokens). */
extern const zi_http_api zi_http_api_count_tokens;

/* An error in Anthropic's shape, {"type": "error", "error": {"type",
 * "message"}}, its type from e->status (400 invalid_request_error, 401
 * authentication_error, 403 permission_error, 404 not_found_error, 413
 * request_too_large, 429 rate_limit_error, 503 overloaded_error, 504
 * timeout_error, others api_error). A new reference. */
json_t *zi_http_messages_error_json(const zi_http_error *e);

/* 1 when path is one of the Messages API's (its errors take that shape). */
int zi_http_messages_path(const char *path);

#endif
