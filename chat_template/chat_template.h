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
 * Besides the messages, a render can pass extra top-level variables, as
 * apply_chat_template(messages, tools=tools, **chat_template_options)
 * does: each is a zi_chat_value tree (None, bool, int, float, str, list,
 * dict), which the template sees as the Python value jinja2 would.
 * chat_template/chat_vars.h builds them from a request's msgpack.
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
#include <stdint.h>

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

/*
 * A value given to the template: a tree of Python values. Strings (and
 * dict keys) are UTF-8 of an explicit length, not NUL-terminated; a
 * pointer may be NULL only when its length or count is 0. Dicts keep their
 * pairs in order, as Python dicts do: items(), keys(), iteration and tojson
 * follow it; a key given twice keeps its first place and its last value
 * (what Python's dict() does with such pairs). Lists and dicts may be
 * nested at most ZI_CHAT_VALUE_MAX_DEPTH levels (the top value is level 1).
 * The renderer only reads a tree; it must stay valid during the render.
 */
enum {
    ZI_CHAT_NONE,  /* None */
    ZI_CHAT_BOOL,  /* u.b: 0 is False, anything else True */
    ZI_CHAT_INT,   /* u.i */
    ZI_CHAT_FLOAT, /* u.f (NaN and infinities print as Python prints them) */
    ZI_CHAT_STR,   /* u.s */
    ZI_CHAT_LIST,  /* u.list */
    ZI_CHAT_DICT,  /* u.dict */
};

#define ZI_CHAT_VALUE_MAX_DEPTH 32

typedef struct zi_chat_value zi_chat_value;
typedef struct zi_chat_pair zi_chat_pair;

struct zi_chat_value {
    int kind; /* ZI_CHAT_* */
    union {
        int b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t len;
        } s;
        struct {
            const zi_chat_value *v;
            size_t n;
        } list;
        struct {
            const zi_chat_pair *v; /* in insertion order */
            size_t n;
        } dict;
    } u;
};

/* One dict entry: a string key and its value. */
struct zi_chat_pair {
    const char *key;
    size_t key_len;
    zi_chat_value value;
};

/* An extra top-level template variable, such as `tools` or a
 * chat_template_options entry (`date_string`, `enable_thinking`, ...). The
 * name is UTF-8 of an explicit length (any string; one that is not a
 * Jinja name is simply unreachable). */
typedef struct zi_chat_var {
    const char *name;
    size_t name_len;
    zi_chat_value value;
} zi_chat_var;

typedef struct zi_chat_render_opts {
    /* The template variables. add_generation_prompt is a bool; bos_token
     * and eos_token (NUL-terminated) are left undefined when NULL. The
     * template also sees `messages` (a list of {"role", "content"}
     * mappings) and the globals raise_exception, strftime_now, namespace,
     * range and dict. */
    int add_generation_prompt;
    const char *bos_token;
    const char *eos_token;
    /* Extra variables vars[0..n_vars) (vars may be NULL when n_vars is 0).
     * A name is refused (ZI_EINVAL, "chat template: messages: a name the
     * renderer sets itself") when zi_chat_var_reserved says so, and when
     * it appears twice; every value must pass zi_chat_value_check. Their
     * conversion to the template's values counts against max_memory and
     * max_steps like everything else the render makes. */
    const zi_chat_var *vars;
    size_t n_vars;
    /* When not NULL, the template's `messages`: a list (zi_chat_value_check
     * must pass) whose items are dicts with a string "role" (and whatever
     * else the client sent: content, tool_calls, tool_call_id, name,
     * reasoning_content, ...). It replaces the msgs argument of render,
     * which must then be empty. */
    const zi_chat_value *messages;
    /* strftime_now's moment: 0 is the current local time; any other value
     * is that many seconds since the epoch, formatted as UTC (for
     * reproducible renderings). */
    int64_t now;
    /* Limits; 0 selects the default above. Exceeding one fails the render
     * with ZI_ERANGE (ZI_ENOMEM for max_memory). */
    size_t max_output;
    size_t max_memory;
    size_t max_iterations;
    size_t max_steps;
} zi_chat_render_opts;

/*
 * 1 when name[0..len) is a name the renderer defines itself and so cannot
 * be an extra variable: messages, add_generation_prompt, bos_token,
 * eos_token, and the globals raise_exception, strftime_now, namespace,
 * range and dict. 0 otherwise (NULL name: 0).
 */
int zi_chat_var_reserved(const char *name, size_t len);

/*
 * Checks a value tree: known kinds, no NULL pointer with a non-zero
 * length or count, strings and dict keys well-formed UTF-8, nesting at
 * most ZI_CHAT_VALUE_MAX_DEPTH. ZI_EINVAL otherwise, with a message that
 * starts with the place at fault, built from path (NULL: "value"), e.g.
 * "tools[0].function.name: not valid UTF-8 at byte 3".
 */
int zi_chat_value_check(const zi_chat_value *v, const char *path, zi_error *err);

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
 *  - ZI_EINVAL: a message is not valid UTF-8 or has a NULL role; an
 *    extra variable is refused (see zi_chat_render_opts.vars); the
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
