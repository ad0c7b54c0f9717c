/*
 * chat_template.h - renders chat messages into a prompt with a model's
 * Jinja chat template (GGUF key tokenizer.chat_template).
 *
 * The tokenizer process compiles the model's template once and renders
 * every "messages" request with it before encoding. The engine is a Jinja
 * subset interpreter written for chat templates; its output matches what
 * Hugging Face transformers' apply_chat_template produces (jinja2 with
 * trim_blocks=True, lstrip_blocks=True, the loopcontrols extension, a
 * json.dumps-based tojson filter and the raise_exception / strftime_now
 * globals) byte for byte for everything it supports. docs/chat_template.md
 * lists the supported syntax, filters, tests and methods, and what is not
 * supported.
 *
 * Templates are untrusted input: compile and render never abort or read
 * outside their buffers, and a render is bounded in output size, memory,
 * loop iterations, work steps and nesting depth (see zi_chat_render_opts).
 *
 * A compiled template is immutable; several threads may render with the
 * same template at once.
 */
#ifndef ZI_CHAT_TEMPLATE_H
#define ZI_CHAT_TEMPLATE_H

#include <stddef.h>

#include "zi_error.h"

typedef struct zi_chat_template zi_chat_template;

/* One message. role and content are UTF-8 (validated by render). A length
 * of 0 means "NUL-terminated, use strlen". content == NULL gives the
 * template a content of none (Python None), as for tool-call messages. */
typedef struct zi_chat_message {
    const char *role;
    const char *content;
    size_t role_len;
    size_t content_len;
} zi_chat_message;

/* Defaults for the limits below (used where a field is 0). */
#define ZI_CHAT_TEMPLATE_MAX_SOURCE ((size_t)4 << 20)             /* template bytes */
#define ZI_CHAT_TEMPLATE_DEFAULT_MAX_OUTPUT ((size_t)16 << 20)    /* rendered bytes */
#define ZI_CHAT_TEMPLATE_DEFAULT_MAX_MEMORY ((size_t)256 << 20)   /* working memory */
#define ZI_CHAT_TEMPLATE_DEFAULT_MAX_ITERATIONS ((size_t)1000000) /* all loops together */
#define ZI_CHAT_TEMPLATE_DEFAULT_MAX_STEPS ((size_t)100000000)    /* evaluation work units */
#define ZI_CHAT_TEMPLATE_MAX_DEPTH 500 /* nested evaluation, macro recursion included */

typedef struct zi_chat_render_opts {
    /* The template variables. add_generation_prompt is a bool; bos_token
     * and eos_token (NUL-terminated) are left undefined when NULL. The
     * template also sees `messages` (a list of {"role", "content"}
     * mappings) and the globals raise_exception, strftime_now, namespace,
     * range and dict. */
    int add_generation_prompt;
    const char *bos_token;
    const char *eos_token;
    /* Limits; 0 selects the default above. Exceeding one fails the render
     * with ZI_ERANGE (ZI_ENOMEM for max_memory). */
    size_t max_output;
    size_t max_memory;
    size_t max_iterations;
    size_t max_steps;
} zi_chat_render_opts;

/*
 * Compiles src[0..len) into *out (free with zi_chat_template_free).
 * Errors: ZI_EINVAL (NULL arguments, source not UTF-8), ZI_ERANGE (source
 * over ZI_CHAT_TEMPLATE_MAX_SOURCE), ZI_EFORMAT (syntax error),
 * ZI_EUNSUPPORTED (valid Jinja that this engine does not implement, such
 * as {% include %} or recursive loops), ZI_ENOMEM. Messages read
 * "chat template line L col C: what is wrong". Unknown filter and test
 * names are not compile errors: they fail the render only if reached.
 */
int zi_chat_template_compile(const char *src, size_t len, zi_chat_template **out, zi_error *err);

/*
 * Renders msgs[0..n) (msgs may be NULL when n is 0) with opts (NULL: all
 * defaults, add_generation_prompt false, no bos/eos). On success *out is a
 * malloc'd NUL-terminated string (free() it) of *out_len bytes (out_len
 * may be NULL). On failure *out is NULL and:
 *  - ZI_EINVAL: a message is not valid UTF-8 or has a NULL role; the
 *    template called raise_exception(msg) - err->msg is then exactly msg,
 *    without a location, so it can be shown to the client as is; or the
 *    template failed at run time (an undefined value used in arithmetic,
 *    a type error, ...), with "chat template line L col C: ...";
 *  - ZI_EUNSUPPORTED: the template reached a filter, test, method or
 *    operation this engine does not implement;
 *  - ZI_ERANGE: a limit of opts was exceeded, or the nesting depth;
 *  - ZI_ENOMEM: max_memory exceeded or allocation failed.
 */
int zi_chat_template_render(const zi_chat_template *t, const zi_chat_message *msgs, size_t n,
                            const zi_chat_render_opts *opts, char **out, size_t *out_len,
                            zi_error *err);

void zi_chat_template_free(zi_chat_template *t);

#endif
