/*
 * chat_tools.h - tool calls and tool results for chat templates that do
 * not render them (docs/protocol.md, "Messages"). Whether a template does
 * is found once by rendering a probe conversation, as llama.cpp's
 * capability check does: an assistant message whose tool_calls carry a
 * marker argument value, then a tool message with a marker content; both
 * markers must show in the output (a template that raises on them, or
 * drops them, does not render tools). For such a template a request's tool
 * messages become user turns "<tool_response>\n...\n</tool_response>" and
 * an assistant's calls Hermes `<tool_call>` blocks after its content, so
 * that the model still sees its calls and their results.
 */
#ifndef ZI_CHAT_TOOLS_H
#define ZI_CHAT_TOOLS_H

#include <stddef.h>

#include "chat_template.h"
#include "types.h"
#include "zi_error.h"

/* What a template does with tool messages (zi_chat_tools_native). */
enum {
    ZI_CHAT_TOOLS_NATIVE = 1, /* renders tool calls and results itself */
    /* ... but fails on the None content of an assistant's call message
     * (Qwen 3's `'</think>' in message.content`): it gets "" (as llama.cpp
     * gives such templates) */
    ZI_CHAT_TOOLS_EMPTY_CONTENT = 2,
};

/* ZI_CHAT_TOOLS_NATIVE when t renders both an assistant's tool_calls
 * (content None) and a tool message's content given tools; with
 * ZI_CHAT_TOOLS_EMPTY_CONTENT too when it does so only with content "";
 * 0 otherwise. bos / eos as the server renders with (NULL: undefined). */
int zi_chat_tools_native(const zi_chat_template *t, const char *bos_token, const char *eos_token);

/* Message i, m (a tool message, or an assistant message with tool_calls),
 * as the text of a plain turn: "<tool_response>\n{content}\n</tool_response>",
 * or its content then, per call, "\n<tool_call>\n{"name": ..., "arguments":
 * ...}\n</tool_call>" (arguments as sent: a map as JSON, a string as its
 * text; the first block without "\n" when there is no content). *text is
 * malloc'd, *len its length. ZI_ENOMEM, or ZI_EFORMAT naming
 * messages[i].tool_calls when they are not the decoder's msgpack. */
int zi_chat_tools_hermes_text(const zi_message *m, size_t i, char **text, size_t *len,
                              zi_error *err);

#endif
