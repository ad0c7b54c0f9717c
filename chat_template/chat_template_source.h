/*
 * chat_template_source.h - where a chat template's source comes from when
 * the model file's own (tokenizer.chat_template) is not used: the option
 * `--chat-template FILE|NAME` of zinfer serve, zinfer-tokenizer and
 * zinfer chat-template.
 *
 * NAME is one of the templates built into zinfer (compiled in as strings,
 * so that every binary has them wherever it is installed or copied, with
 * no data directory to find): minimal renderings of well-known prompt
 * formats, written for this engine's Jinja subset:
 *
 *   chatml    <|im_start|>ROLE\nCONTENT<|im_end|>\n
 *   gemma     <start_of_turn>user|model ... <end_of_turn>; system messages
 *             folded into the next user turn, as Gemma 3's template does
 *   llama3    <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *   mistral   [INST] ... [/INST] (Mistral 7B Instruct v0.3's format; the
 *             system message goes before the last user message)
 *   phi3      <|ROLE|>\nCONTENT<|end|>\n
 *
 * For conversations of plain system/user/assistant messages each renders
 * what the published template of its family renders (tests/e2e/
 * test_chat_template_option.py). Where the published templates refuse a
 * conversation (roles that do not alternate, a system message for Gemma 2)
 * these render it anyway: other roles (tool) become user turns.
 *
 * Anything else is a file path. A built-in name wins over a file of the
 * same name in the working directory (write ./gemma for the file).
 */
#ifndef ZI_CHAT_TEMPLATE_SOURCE_H
#define ZI_CHAT_TEMPLATE_SOURCE_H

#include <stddef.h>

#include "chat_template.h"
#include "zi_error.h"

/* The built-in names, in alphabetical order, NULL-terminated. */
extern const char *const zi_chat_template_names[];

/* The built-in template called name (static storage), or NULL. */
const char *zi_chat_template_builtin(const char *name);

/* The names joined by ", " into buf (for messages); returns buf. */
const char *zi_chat_template_name_list(char *buf, size_t cap);

/* The source that arg (a built-in name or a file path) names, malloc'd and
 * NUL-terminated, into *src and *len. Errors name the file: ZI_EIO when it
 * cannot be opened or read (and, for an arg that could be a name, the
 * built-in names), ZI_ERANGE when it is over ZI_CHAT_TEMPLATE_MAX_SOURCE
 * bytes, ZI_EINVAL when it is not a regular file or is empty. */
int zi_chat_template_load(const char *arg, char **src, size_t *len, zi_error *err);

/* zi_chat_template_load, then zi_chat_template_compile; a compile error is
 * prefixed with the file (or "built-in template NAME"). */
int zi_chat_template_from_arg(const char *arg, zi_chat_template **out, zi_error *err);

#endif
