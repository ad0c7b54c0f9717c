/*
 * http_tools.h - OpenAI tool calls for zinfer-http (docs/http.md, "Tool
 * calls"): the request's `tools` and `tool_choice` checked and turned into
 * what the router takes (its `tools` for the chat template; for
 * `tool_choice` "required" or a named function, a json_schema response
 * format that holds decoding to a valid call), tool results and earlier
 * calls in `messages` in the router's shape, and the model's text parsed
 * back into `tool_calls` in the model's format (tool_formats.h; by
 * default Hermes/Qwen `<tool_call>{...}</tool_call>`, Mistral
 * `[TOOL_CALLS][...]`, and a bare JSON call as the fallback).
 */
#ifndef ZI_HTTP_TOOLS_H
#define ZI_HTTP_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "http_error.h"
#include "tool_formats.h"

typedef enum zi_http_tool_choice {
    ZI_TOOLS_OFF,      /* no tools, or tool_choice "none" */
    ZI_TOOLS_AUTO,     /* the model may call one */
    ZI_TOOLS_REQUIRED, /* it must call one (decoding constrained) */
    ZI_TOOLS_NAMED,    /* it must call this one (decoding constrained) */
} zi_http_tool_choice;

typedef struct zi_http_tools {
    zi_http_tool_choice choice;
    json_t
        *tools; /* the router's shape: [{"type", "function": {name, description?, parameters?}}] */
    json_t *names; /* the functions' names (strings) */
    char named[256];
    /* The model's tool-call format (--tool-call-format, or the template's;
     * set by the endpoint, GENERIC when zeroed). A forced call (REQUIRED,
     * NAMED) is decoded as bare JSON, which the generic parser reads. */
    zi_tool_format format;
} zi_http_tools;

/* Reads `tools` and `tool_choice` of root into t (zeroed first). 0, or -1
 * with e set naming the field. Free with zi_http_tools_free. */
int zi_http_tools_parse(json_t *root, zi_http_tools *t, zi_http_error *e);
void zi_http_tools_free(zi_http_tools *t);

/* For REQUIRED / NAMED: the response_format that makes the completion a
 * call, {"type": "json_schema", "json_schema": {"name": "tool_call",
 * "schema": {"type": "object", "properties": {"name": ..., "arguments":
 * ...}, "required": [...]}}} (a new reference); else NULL. */
json_t *zi_http_tools_response_format(const zi_http_tools *t);

/* The tool parts of message i, msg (a `tool` message, or an assistant
 * message with tool_calls), added to nm, the router's message (role and
 * content set): a tool message's "tool_call_id" and "name", an assistant's
 * "tool_calls" ([{"id"?, "type": "function", "function": {"name",
 * "arguments"}}], arguments as a map when their JSON text is an object).
 * The router's tokenizer renders them with the template, or as text turns
 * for a template without tool support (docs/protocol.md). -1 with e set
 * (naming messages[i]...) when malformed. */
int zi_http_tools_message(json_t *msg, size_t i, json_t *nm, zi_http_error *e);

/* The tool calls in a completion's whole text (tool_stream.h, which the
 * streamed reply uses too, so both say the same): a new array of OpenAI
 * tool_calls ({"id", "type": "function", "function": {"name", "arguments":
 * the model's text of the arguments object}}), or NULL when the text holds
 * none, names no known function, or a call is malformed or cut short.
 * *content gets the text outside the calls (malloc'd; NULL when none);
 * with no calls, where the format drops markers from the text (gpt-oss's
 * message headers, ...), the text without them, as the stream sends it
 * (else NULL: the text is the content as it is). */
json_t *zi_http_tools_extract(const zi_http_tools *t, const char *text, size_t len, char **content);

/* The format t's completions are parsed in: t->format, or GENERIC when
 * the call is forced (its JSON constraint writes a bare call). */
zi_tool_format zi_http_tools_format(const zi_http_tools *t);

#endif
