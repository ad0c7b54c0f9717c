/*
 * chat_vars.h - a request's `tools` and `chat_template_options` as extra
 * chat-template variables (zi_chat_var, chat_template/chat_template.h).
 *
 * Hugging Face renders apply_chat_template(messages, tools=tools,
 * add_generation_prompt=True, **chat_template_options): the tool list
 * becomes the template variable `tools` and each option a variable of its
 * own. The codec keeps both fields as opaque msgpack bytes (zi_request's
 * tools and chat_template_options), having checked the tools' shape (the
 * seed's TokenGeneratorRequestTool, protocol/codec.h); this module checks
 * the option names and converts both into zi_chat_value trees that own
 * copies of their strings, so the msgpack buffers may go away before the
 * render.
 *
 * Everything here reads client input: failures are ZI_EINVAL (ZI_ENOMEM
 * for allocation, ZI_EUNSUPPORTED for an integer beyond 64 bits) with a
 * message starting with the path at fault, e.g.
 * "chat_template_options.x[0]: map keys must be strings".
 */
#ifndef ZI_CHAT_VARS_H
#define ZI_CHAT_VARS_H

#include <stddef.h>

#include <msgpack.h>

#include "chat_template.h"
#include "types.h"
#include "zi_error.h"

/* Nesting limit of a converted value, the value itself being level 1 (the
 * codec's default; chat_template_options entries start at level 2). */
#define ZI_CHAT_VARS_MAX_DEPTH 16

/* Storage for trees: everything made with one arena is freed at once by
 * zi_chat_arena_free. Zero-initialise it before first use. */
typedef struct zi_chat_arena {
    void *blocks; /* internal: malloc'd blocks, newest first */
} zi_chat_arena;

/* Frees every tree made with a and leaves it empty (reusable). */
void zi_chat_arena_free(zi_chat_arena *a);

/*
 * Converts o into *out: nil -> None, bool, positive and negative integers
 * (ZI_EUNSUPPORTED above INT64_MAX), float32/float64 -> float, str,
 * array -> list, map -> dict (keys must be strings; pair order kept).
 * Refused (ZI_EINVAL): bin and ext objects, non-string map keys, strings or
 * keys that are not UTF-8, nesting deeper than ZI_CHAT_VARS_MAX_DEPTH.
 * path (NULL: "value") starts every message. The tree's storage, strings
 * included, comes from a; on failure *out is None and a is as it was.
 */
int zi_chat_value_from_msgpack(const msgpack_object *o, const char *path, zi_chat_arena *a,
                               zi_chat_value *out, zi_error *err);

/* A request's template variables, for zi_chat_render_opts.vars / n_vars. */
typedef struct zi_chat_vars {
    zi_chat_var *v;
    size_t n;
    zi_chat_arena arena; /* owns v and the trees */
} zi_chat_vars;

/*
 * Builds *out (zeroed first; free with zi_chat_vars_free, also after a
 * failure) from a request's tools and chat_template_options objects,
 * either of which may be NULL or nil (absent):
 *  - tools must be an array (its entries are not looked into: the request
 *    decoder checked them); a non-empty one becomes the variable `tools`
 *    (an empty one leaves `tools` undefined, as apply_chat_template's
 *    tools=None does);
 *  - chat_template_options must be a map with string keys; each entry
 *    becomes a variable of that name, in order. A name the renderer sets
 *    itself (zi_chat_var_reserved) is refused ("chat_template_options.
 *    messages: a name the renderer sets itself"), so is `tools` (tools
 *    travel in the request's own field) and a key given twice.
 */
int zi_chat_vars_from_msgpack(const msgpack_object *tools, const msgpack_object *options,
                              zi_chat_vars *out, zi_error *err);

void zi_chat_vars_free(zi_chat_vars *v);

/*
 * A request's messages as the template's `messages`
 * (zi_chat_render_opts.messages): a list of dicts with "role", "content"
 * (None where the message's content_null is set), "tool_calls" (the
 * assistant's calls, converted from their msgpack with
 * zi_chat_value_from_msgpack), "tool_call_id" and "name" where given, in
 * that order. tool_caps is what zi_chat_tools_native said of the
 * template (chat_tools.h): without ZI_CHAT_TOOLS_NATIVE a tool message
 * and an assistant's calls become {"role", "content"} text turns instead
 * (a tool message then a "user" turn); with ZI_CHAT_TOOLS_EMPTY_CONTENT a
 * null content is "" rather than None. Role, content, tool_call_id and name strings refer
 * to r's, which must outlive the render; the rest comes from a.
 */
int zi_chat_messages_from_request(const zi_request *r, int tool_caps, zi_chat_arena *a,
                                  zi_chat_value *out, zi_error *err);

/*
 * What the tokenizer process renders for a request: r's messages
 * (zi_chat_messages_from_request, tool_caps as there) with its tools and chat_template_options
 * (the request's msgpack objects, either may be NULL: see
 * zi_chat_vars_from_msgpack), add_generation_prompt true, and the model's
 * BOS / EOS texts (NULL: undefined). *out as zi_chat_template_render
 * gives it (free() it). Errors: those of zi_chat_vars_from_msgpack as they
 * are (their messages start with the tools / chat_template_options path),
 * and those of the render prefixed "messages: " (e.g. "messages: Conversation
 * roles must alternate ...", "messages: chat template line 3 col 5: ...").
 */
int zi_chat_render_request(const zi_chat_template *t, int tool_caps, const zi_request *r,
                           const msgpack_object *tools, const msgpack_object *options,
                           const char *bos_token, const char *eos_token, char **out,
                           size_t *out_len, zi_error *err);

#endif
