/*
 * http_responses.h - OpenAI's Responses API (POST /v1/responses, GET and
 * DELETE /v1/responses/{id}; docs/http.md, "Responses") as a generation
 * API of zinfer-http (http_api.h).
 *
 * A request's own fields are checked here, each error naming the Responses
 * field (`input[2].content[0].type`, `text.format.schema`, ...), then the
 * request is translated into a chat-completions object (input items and
 * instructions into messages, function tools, tool_choice, text.format into
 * response_format, max_output_tokens into max_tokens, reasoning.effort into
 * reasoning_effort) that zi_http_parse_generate_json turns into the
 * router's request. The model's text is split by chat_stream into
 * reasoning, message text and function calls, which become the output
 * items, whole or as the Responses stream events; the whole and the
 * streamed answer come from the same events, so they agree.
 *
 * `store: true` keeps the response in the process' bounded store
 * (response_store.h); `previous_response_id` continues from a kept one,
 * its input and output items before this request's input.
 */
#ifndef ZI_HTTP_RESPONSES_H
#define ZI_HTTP_RESPONSES_H

#include <jansson.h>

#include "http_api.h"
#include "http_ctx.h"
#include "http_error.h"

/* POST /v1/responses. */
extern const zi_http_api zi_http_api_responses;

/* GET /v1/responses/{id} (del 0): the stored response object; DELETE (del
 * 1): {"id", "object": "response.deleted", "deleted": true}. A new
 * reference, or NULL with e set (404 naming response_id when id is not
 * kept). */
json_t *zi_http_responses_stored(zi_http_ctx *ctx, const char *id, int del, zi_http_error *e);

#endif
