/*
 * chat_stream.h - a chat completion's text split as it arrives into
 * reasoning, content and tool calls: the reasoning splitter in front of
 * tool_stream (docs/http.md, "Reasoning"). Chat completions, Messages and
 * Responses all render their replies from its events, streamed or whole.
 *
 * The thinking section is `<think>...</think>` (Qwen 3, DeepSeek R1 and its
 * distills, SmolLM3): it is recognized at the text's start (after
 * whitespace), or from the start when the rendered prompt already opened it
 * (g->reasoning.open; an opening marker the model writes again is dropped).
 * The reasoning is the section's text without its leading and trailing
 * whitespace; the content is the text after the closing marker without its
 * leading whitespace, passed through tool_stream when the request has tools
 * (so calls inside the reasoning are reasoning). A section never closed is
 * all reasoning. A text that does not start with the section is content,
 * byte for byte.
 *
 * gpt-oss's harmony messages are recognized at the text's start too
 * (`<|channel|>` or `<|start|>`): the analysis channel is reasoning, a
 * message to=functions.NAME of a known tool is a call (its body the
 * arguments), any other body content.
 *
 * Each byte is reported once, held back only while it may still be part of
 * a marker (a split `</thi`) or is whitespace that may yet be trimmed; so
 * feeding a text in any pieces reports the same joined reasoning, content
 * and calls as feeding it whole. With reasoning format none everything goes
 * through to tool_stream (or out as content, without tools) unchanged.
 */
#ifndef ZI_CHAT_STREAM_H
#define ZI_CHAT_STREAM_H

#include <stddef.h>

#include "http_request.h"
#include "tool_stream.h"

typedef struct zi_chat_stream zi_chat_stream;

/* g: the parsed request: its tools (tool_stream runs when tools.choice is
 * not ZI_TOOLS_OFF; the names are borrowed, so g outlives the stream) and
 * its reasoning settings (format, open). NULL: out of memory. */
zi_chat_stream *zi_chat_stream_new(const zi_http_gen *g);

/* Appends n bytes of completion and reports, through emit, what became
 * certain: REASONING, CONTENT, and with tools CALL and ARGS (tool_stream.h).
 * 0, -1 out of memory, or emit's non-zero return. */
int zi_chat_stream_feed(zi_chat_stream *cs, const char *text, size_t n, zi_ts_emit emit, void *arg);

/* The completion ended: reports everything still held. Same returns. */
int zi_chat_stream_finish(zi_chat_stream *cs, zi_ts_emit emit, void *arg);

/* After finish: 1 when calls were made and every one is whole and valid
 * (zi_tool_stream_calls_ok); 0 without tools. */
int zi_chat_stream_calls_ok(const zi_chat_stream *cs);

void zi_chat_stream_free(zi_chat_stream *cs);

/* A whole completion split as the stream would report it: *reasoning and
 * *content malloc'd NUL-terminated (either may be ""), and with tools
 * *calls a new array of OpenAI tool calls ({"id", "type": "function",
 * "function": {"name", "arguments"}}) when calls were made and every one
 * is whole and valid. Without such calls *calls is NULL and *content is
 * all the text but the reasoning, as the model wrote it (a broken call's
 * text included). 0, or -1 out of memory (all NULL). */
int zi_chat_stream_split(const zi_http_gen *g, const char *text, size_t len, char **reasoning,
                         size_t *rlen, char **content, size_t *clen, json_t **calls);

#endif
