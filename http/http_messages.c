/*
 * http_messages.c - Anthropic's Messages API (http_messages.h): the
 * request checked and translated into an OpenAI chat-completions object,
 * the reply rendered from chat_stream's events as Anthropic's message or
 * its event stream, errors in Anthropic's shape.
 */
#include "http_messages.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_stream.h"
#include "codec.h"
#include "utf8.h"

/* ---- errors ------------------------------------------------------------- */

static const char *error_type(int status) {
    switch (status) {
    case 400:
    case 405:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "overloaded_error";
    case 504:
        return "timeout_error";
    default:
        return "api_error";
    }
}

json_t *zi_http_messages_error_json(const zi_http_error *e) {
    json_t *msg = json_string(e->message);
    json_t *in = json_object();
    json_object_set_new(in, "type", json_string(error_type(e->status)));
    json_object_set_new(in, "message", msg ? msg : json_string("(message not valid UTF-8)"));
    json_t *o = json_object();
    json_object_set_new(o, "type", json_string("error"));
    json_object_set_new(o, "error", in);
    return o;
}

int zi_http_messages_path(const char *path) {
    return !strcmp(path, "/v1/messages") || !strncmp(path, "/v1/messages/", 13);
}

/* A 400 naming field: "field: what is wrong". */
static int bad(zi_http_error *e, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(zi_http_error *e, const char *field, const char *fmt, ...) {
    char why[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return zi_http_fail(e, 400, "invalid_request", field, "%s: %s", field, why);
}

/* A key of o that is not in allowed (NULL-ended) is refused, as
 * Anthropic's API refuses it. path: o's own field ("" at the top). */
static int only_keys(json_t *o, const char *path, const char *const *allowed, zi_http_error *e) {
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int ok = 0;
        for (int i = 0; allowed[i] && !ok; i++) ok = !strcmp(key, allowed[i]);
        if (ok) continue;
        char f[200];
        snprintf(f, sizeof f, "%s%s%.100s", path, path[0] ? "." : "", key);
        return bad(e, f, "Extra inputs are not permitted");
    }
    return 0;
}

/* ---- the request -------------------------------------------------------- */

/* The translation's state. */
typedef struct tr {
    json_t *oai; /* the OpenAI chat-completions object being built */
    int count;   /* for count_tokens */
    long long max_tokens;
    int has_max;
    int omit_thinking;      /* thinking.display "omitted" */
    const char *format;     /* the structured output's field (output_config.format or
                             * output_format), or NULL */
    zi_http_images *images; /* the image blocks' images, in the order of their markers */
} tr;

static char *join_texts(json_t *texts) {
    size_t n = 0, i;
    json_t *t;
    json_array_foreach(texts, i, t) n += json_string_length(t) + 1;
    char *s = malloc(n + 1), *p = s;
    if (!s) return NULL;
    json_array_foreach(texts, i, t) {
        if (i) *p++ = '\n';
        memcpy(p, json_string_value(t), json_string_length(t));
        p += json_string_length(t);
    }
    *p = 0;
    return s;
}

/* Text blocks ({"type": "text", "text", "cache_control"?, "citations"?})
 * of an array, their texts appended to texts. What: the array's field. */
static int text_block(json_t *b, const char *bf, json_t *texts, zi_http_error *e) {
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    if (only_keys(b, bf, keys, e)) return -1;
    json_t *t = json_object_get(b, "text");
    char f[160];
    snprintf(f, sizeof f, "%s.text", bf);
    if (!t) return bad(e, f, "Field required");
    if (!json_is_string(t)) return zi_http_want(e, f, "a string", t);
    json_array_append(texts, t);
    return 0;
}

/* An image block ({"type": "image", "source": {"type": "base64",
 * "media_type", "data"} or {"type": "url", "url"}, "cache_control"?}):
 * its image decoded into im, ZI_MEDIA_MARKER appended to texts. */
static int image_block(json_t *b, const char *bf, zi_http_images *im, json_t *texts,
                       zi_http_error *e) {
    static const char *const keys[] = {"type", "source", "cache_control", NULL};
    static const char *const b64_keys[] = {"type", "media_type", "data", NULL};
    static const char *const url_keys[] = {"type", "url", NULL};
    if (only_keys(b, bf, keys, e)) return -1;
    char f[200], ff[220];
    json_t *src = json_object_get(b, "source");
    snprintf(f, sizeof f, "%.150s.source", bf);
    if (!src) return bad(e, f, "Field required");
    if (!json_is_object(src)) return zi_http_want(e, f, "an object", src);
    json_t *st = json_object_get(src, "type");
    snprintf(ff, sizeof ff, "%s.type", f);
    if (!st) return bad(e, ff, "Field required");
    if (!json_is_string(st)) return zi_http_want(e, ff, "a string", st);
    int rc;
    if (!strcmp(json_string_value(st), "base64")) {
        if (only_keys(src, f, b64_keys, e)) return -1;
        json_t *mt = json_object_get(src, "media_type"), *d = json_object_get(src, "data");
        snprintf(ff, sizeof ff, "%s.%s", f, !mt ? "media_type" : "data");
        if (!mt || !d) return bad(e, ff, "Field required");
        snprintf(ff, sizeof ff, "%s.media_type", f);
        if (!json_is_string(mt)) return zi_http_want(e, ff, "a string", mt);
        if (strncmp(json_string_value(mt), "image/", 6) || json_string_length(mt) < 7)
            return bad(e, ff,
                       "'%.60s' is not an image media type (image/jpeg, image/png, "
                       "image/gif, image/webp)",
                       json_string_value(mt));
        snprintf(ff, sizeof ff, "%s.data", f);
        if (!json_is_string(d)) return zi_http_want(e, ff, "a string", d);
        rc = zi_http_images_add_base64(im, json_string_value(d), json_string_length(d), ff, e);
    } else if (!strcmp(json_string_value(st), "url")) {
        if (only_keys(src, f, url_keys, e)) return -1;
        json_t *u = json_object_get(src, "url");
        snprintf(ff, sizeof ff, "%s.url", f);
        if (!u) return bad(e, ff, "Field required");
        if (!json_is_string(u)) return zi_http_want(e, ff, "a string", u);
        rc = zi_http_images_add_url(im, json_string_value(u), json_string_length(u), ff, e);
    } else {
        return zi_http_fail(e, 400, "unsupported_value", ff,
                            "%s: '%.40s' image sources are not supported (base64 and url are)", ff,
                            json_string_value(st));
    }
    if (rc) return -1;
    json_t *m = json_string(ZI_MEDIA_MARKER);
    json_array_append_new(texts, m);
    return 0;
}

/* Refusal of a block type zinfer does not serve. */
static int unserved_block(const char *bf, const char *type, zi_http_error *e) {
    if (!strcmp(type, "image") || !strcmp(type, "document"))
        return zi_http_fail(e, 400, "unsupported_value", bf,
                            "%s: '%s' blocks are not supported here (images go in a user or "
                            "assistant message's content; documents are not served)",
                            bf, type);
    char f[160];
    snprintf(f, sizeof f, "%s.type", bf);
    return zi_http_fail(e, 400, "unsupported_value", f,
                        "%s: '%.60s' blocks are not supported (text, tool_use, tool_result and "
                        "thinking are)",
                        f, type);
}

/* A tool_result's content: absent, a string, or text blocks. *out: the
 * text (malloc'd). */
static int tool_result_text(json_t *b, const char *bf, char **out, zi_http_error *e) {
    json_t *c = zi_http_get(b, "content");
    char f[160];
    snprintf(f, sizeof f, "%s.content", bf);
    if (!c) {
        *out = strdup("");
    } else if (json_is_string(c)) {
        *out = strndup(json_string_value(c), json_string_length(c));
    } else {
        if (!json_is_array(c)) return zi_http_want(e, f, "a string or an array of text blocks", c);
        json_t *texts = json_array(), *x;
        size_t k;
        json_array_foreach(c, k, x) {
            char xf[200];
            snprintf(xf, sizeof xf, "%s.%zu", f, k);
            json_t *t = json_is_object(x) ? json_object_get(x, "type") : NULL;
            int rc;
            if (!json_is_object(x))
                rc = zi_http_want(e, xf, "a content block object", x);
            else if (!json_is_string(t)) {
                char tf[208];
                snprintf(tf, sizeof tf, "%s.type", xf);
                rc = zi_http_want(e, tf, "a string", t);
            } else if (strcmp(json_string_value(t), "text"))
                rc = unserved_block(xf, json_string_value(t), e);
            else
                rc = text_block(x, xf, texts, e);
            if (rc) {
                json_decref(texts);
                return -1;
            }
        }
        *out = join_texts(texts);
        json_decref(texts);
    }
    return *out ? 0 : zi_http_fail(e, 500, "internal", NULL, "out of memory");
}

/* system: a string or text blocks -> the first message. */
static int tr_system(json_t *root, tr *t, json_t *out, zi_http_error *e) {
    json_t *s = zi_http_get(root, "system");
    if (!s) return 0;
    char *text = NULL;
    if (json_is_string(s)) {
        text = strndup(json_string_value(s), json_string_length(s));
    } else {
        if (!json_is_array(s))
            return zi_http_want(e, "system", "a string or an array of text blocks", s);
        json_t *texts = json_array(), *b;
        size_t i;
        json_array_foreach(s, i, b) {
            char bf[64];
            snprintf(bf, sizeof bf, "system.%zu", i);
            json_t *ty = json_is_object(b) ? json_object_get(b, "type") : NULL;
            int rc = 0;
            if (!json_is_object(b))
                rc = zi_http_want(e, bf, "a text block object", b);
            else if (!json_is_string(ty) || strcmp(json_string_value(ty), "text")) {
                char tf[80];
                snprintf(tf, sizeof tf, "%s.type", bf);
                rc = bad(e, tf, "expected \"text\"");
            } else
                rc = text_block(b, bf, texts, e);
            if (rc) {
                json_decref(texts);
                return -1;
            }
        }
        text = join_texts(texts);
        json_decref(texts);
    }
    (void)t;
    if (!text) return zi_http_fail(e, 500, "internal", NULL, "out of memory");
    if (text[0])
        json_array_append_new(out, json_pack("{s:s, s:s}", "role", "system", "content", text));
    free(text);
    return 0;
}

/* One message's content blocks into OpenAI messages appended to out.
 * prev_ids: the tool_use ids of the previous (assistant) message, which
 * this one's tool_result blocks must answer; ids gets this one's. */
static int tr_blocks(json_t *c, const char *f, int user, json_t *prev_ids, json_t *ids, json_t *out,
                     zi_http_images *im, zi_http_error *e) {
    json_t *texts = json_array(), *calls = json_array(), *thoughts = json_array(), *b;
    size_t j;
    int rc = 0;
    if (!json_array_size(c)) rc = bad(e, f, "at least one content block is required");
    json_array_foreach(c, j, b) {
        if (rc) break;
        char bf[128], ff[160];
        snprintf(bf, sizeof bf, "%s.%zu", f, j);
        if (!json_is_object(b)) {
            rc = zi_http_want(e, bf, "a content block object", b);
            break;
        }
        json_t *ty = json_object_get(b, "type");
        snprintf(ff, sizeof ff, "%s.type", bf);
        if (!ty) {
            rc = bad(e, ff, "Field required");
            break;
        }
        if (!json_is_string(ty)) {
            rc = zi_http_want(e, ff, "a string", ty);
            break;
        }
        const char *type = json_string_value(ty);
        if (!strcmp(type, "text")) {
            rc = text_block(b, bf, texts, e);
        } else if (!strcmp(type, "image")) {
            rc = image_block(b, bf, im, texts, e);
        } else if (!strcmp(type, "tool_use")) {
            static const char *const keys[] = {"type",          "id", "name", "input",
                                               "cache_control", NULL};
            if (user) {
                rc = bad(e, ff, "tool_use blocks belong in assistant messages");
                break;
            }
            if ((rc = only_keys(b, bf, keys, e))) break;
            json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name"),
                   *input = json_object_get(b, "input");
            const char *miss = !id ? "id" : !name ? "name" : !input ? "input" : NULL;
            if (miss) {
                snprintf(ff, sizeof ff, "%s.%s", bf, miss);
                rc = bad(e, ff, "Field required");
                break;
            }
            snprintf(ff, sizeof ff, "%s.id", bf);
            if (!json_is_string(id) || !json_string_length(id)) {
                rc = zi_http_want(e, ff, "a non-empty string", id);
                break;
            }
            size_t k;
            json_t *x;
            json_array_foreach(ids, k, x) if (json_equal(x, id)) {
                rc = bad(e, ff, "'%.100s' is used by an earlier tool_use block",
                         json_string_value(id));
                break;
            }
            if (rc) break;
            snprintf(ff, sizeof ff, "%s.name", bf);
            if (!json_is_string(name) || !json_string_length(name)) {
                rc = zi_http_want(e, ff, "a non-empty string", name);
                break;
            }
            snprintf(ff, sizeof ff, "%s.input", bf);
            if (!json_is_object(input)) {
                rc = zi_http_want(e, ff, "an object", input);
                break;
            }
            char *args = json_dumps(input, JSON_COMPACT);
            json_t *call = args ? json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type",
                                            "function", "function", "name", name, "arguments", args)
                                : NULL;
            free(args);
            if (!call) {
                rc = zi_http_fail(e, 500, "internal", NULL, "out of memory");
                break;
            }
            json_array_append_new(calls, call);
            json_array_append(ids, id);
        } else if (!strcmp(type, "tool_result")) {
            static const char *const keys[] = {"type",     "tool_use_id",   "content",
                                               "is_error", "cache_control", NULL};
            if (!user) {
                rc = bad(e, ff, "tool_result blocks belong in user messages");
                break;
            }
            if ((rc = only_keys(b, bf, keys, e))) break;
            if (json_array_size(texts)) {
                rc = bad(e, bf, "tool_result blocks must come before any text in the message");
                break;
            }
            json_t *id = json_object_get(b, "tool_use_id"), *ie = zi_http_get(b, "is_error");
            snprintf(ff, sizeof ff, "%s.tool_use_id", bf);
            if (!id) {
                rc = bad(e, ff, "Field required");
                break;
            }
            if (!json_is_string(id)) {
                rc = zi_http_want(e, ff, "a string", id);
                break;
            }
            int found = 0;
            size_t k;
            json_t *x;
            json_array_foreach(prev_ids, k, x) found |= json_equal(x, id);
            if (!found) {
                rc = bad(e, ff,
                         "'%.100s' answers no tool_use block of the previous message (each "
                         "tool_result must answer a tool_use of the assistant message before it)",
                         json_string_value(id));
                break;
            }
            snprintf(ff, sizeof ff, "%s.is_error", bf);
            if (ie && !json_is_boolean(ie)) {
                rc = zi_http_want(e, ff, "a boolean", ie);
                break;
            }
            char *text;
            if ((rc = tool_result_text(b, bf, &text, e))) break;
            /* The model reads an error as the tool's output, marked. */
            size_t n = strlen(text);
            char *content = malloc(n + 8);
            if (content)
                snprintf(content, n + 8, "%s%s", ie && json_is_true(ie) ? "Error: " : "", text);
            free(text);
            json_t *tm = content ? json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id", id,
                                             "content", content)
                                 : NULL;
            free(content);
            if (!tm) {
                rc = zi_http_fail(e, 500, "internal", NULL, "out of memory");
                break;
            }
            json_array_append_new(out, tm);
        } else if (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking")) {
            /* Earlier thinking reaches the template as the message's
             * reasoning_content (Qwen 3's shows it in the turns after the
             * last user message, a tool loop's); redacted thinking has no
             * text to show. */
            static const char *const tk[] = {"type", "thinking", "signature", NULL};
            static const char *const rk[] = {"type", "data", NULL};
            if (user) {
                rc = bad(e, ff, "%s blocks belong in assistant messages", type);
                break;
            }
            if ((rc = only_keys(b, bf, type[0] == 't' ? tk : rk, e)) || type[0] == 'r') continue;
            json_t *th = json_object_get(b, "thinking");
            snprintf(ff, sizeof ff, "%s.thinking", bf);
            if (!th)
                rc = bad(e, ff, "Field required");
            else if (!json_is_string(th))
                rc = zi_http_want(e, ff, "a string", th);
            else
                json_array_append(thoughts, th);
        } else {
            rc = unserved_block(bf, type, e);
        }
    }
    if (!rc) {
        char *text = json_array_size(texts) ? join_texts(texts) : NULL;
        if (json_array_size(texts) && !text)
            rc = zi_http_fail(e, 500, "internal", NULL, "out of memory");
        json_t *m = NULL;
        if (rc) {
        } else if (!user && json_array_size(calls)) {
            m = json_pack("{s:s, s:o, s:O}", "role", "assistant", "content",
                          text ? json_string(text) : json_null(), "tool_calls", calls);
        } else if (text || !user) {
            m = json_pack("{s:s, s:s}", "role", user ? "user" : "assistant", "content",
                          text ? text : "");
        }
        char *thought = json_array_size(thoughts) ? join_texts(thoughts) : NULL;
        if (m && thought) json_object_set_new(m, "reasoning_content", json_string(thought));
        if (m) json_array_append_new(out, m);
        free(text);
        free(thought);
    }
    json_decref(texts);
    json_decref(calls);
    json_decref(thoughts);
    return rc;
}

static int tr_messages(json_t *root, json_t *out, zi_http_images *im, zi_http_error *e) {
    json_t *ms = json_object_get(root, "messages");
    if (!ms) return bad(e, "messages", "Field required");
    if (!json_is_array(ms)) return zi_http_want(e, "messages", "an array of messages", ms);
    if (!json_array_size(ms)) return bad(e, "messages", "at least one message is required");
    json_t *prev = json_array(), *m;
    size_t i;
    int rc = 0;
    const char *last_role = "user";
    json_array_foreach(ms, i, m) {
        static const char *const keys[] = {"role", "content", NULL};
        char f[64], ff[96];
        snprintf(f, sizeof f, "messages.%zu", i);
        if (!json_is_object(m)) {
            rc = zi_http_want(e, f, "a message object", m);
            break;
        }
        if ((rc = only_keys(m, f, keys, e))) break;
        json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
        snprintf(ff, sizeof ff, "%s.role", f);
        if (!role) {
            rc = bad(e, ff, "Field required");
            break;
        }
        if (!json_is_string(role) || (strcmp(json_string_value(role), "user") &&
                                      strcmp(json_string_value(role), "assistant"))) {
            rc = bad(e, ff, "expected 'user' or 'assistant'%s",
                     json_is_string(role) && !strcmp(json_string_value(role), "system")
                         ? " (the system prompt is the top-level system field)"
                         : "");
            break;
        }
        int user = json_string_value(role)[0] == 'u';
        last_role = user ? "user" : "assistant";
        snprintf(ff, sizeof ff, "%s.content", f);
        if (!c) {
            rc = bad(e, ff, "Field required");
            break;
        }
        json_t *ids = json_array();
        if (json_is_string(c))
            json_array_append_new(out, json_pack("{s:s, s:O}", "role", last_role, "content", c));
        else if (!json_is_array(c))
            rc = zi_http_want(e, ff, "a string or an array of content blocks", c);
        else
            rc = tr_blocks(c, ff, user, prev, ids, out, im, e);
        json_decref(prev);
        prev = ids;
        if (rc) break;
    }
    json_decref(prev);
    if (rc) return -1;
    if (!strcmp(last_role, "assistant")) {
        char f[64];
        snprintf(f, sizeof f, "messages.%zu", json_array_size(ms) - 1);
        return bad(e, f,
                   "a final assistant message (a prefill) is not supported: the reply is a "
                   "new assistant turn after the last user message");
    }
    return 0;
}

/* tools -> OpenAI function tools; the names into names. */
static int tr_tools(json_t *root, json_t *oai, json_t *names, zi_http_error *e) {
    json_t *tools = zi_http_get(root, "tools"), *tool;
    if (!tools) return 0;
    if (!json_is_array(tools)) return zi_http_want(e, "tools", "an array of tools", tools);
    json_t *out = json_array();
    size_t i;
    json_object_set_new(oai, "tools", out);
    json_array_foreach(tools, i, tool) {
        static const char *const keys[] = {"type",          "name",   "description", "input_schema",
                                           "cache_control", "strict", NULL};
        char f[64], ff[96];
        snprintf(f, sizeof f, "tools.%zu", i);
        if (!json_is_object(tool)) return zi_http_want(e, f, "a tool object", tool);
        json_t *ty = zi_http_get(tool, "type");
        snprintf(ff, sizeof ff, "%s.type", f);
        if (ty && !json_is_string(ty)) return zi_http_want(e, ff, "a string", ty);
        if (ty && strcmp(json_string_value(ty), "custom"))
            return zi_http_fail(e, 400, "unsupported_value", ff,
                                "%s: '%.80s' is a server tool, which this server does not run "
                                "(only custom tools: {\"name\", \"description\", "
                                "\"input_schema\"})",
                                ff, json_string_value(ty));
        if (only_keys(tool, f, keys, e)) return -1;
        json_t *name = json_object_get(tool, "name"), *desc = zi_http_get(tool, "description"),
               *schema = json_object_get(tool, "input_schema");
        snprintf(ff, sizeof ff, "%s.name", f);
        if (!name) return bad(e, ff, "Field required");
        if (!json_is_string(name)) return zi_http_want(e, ff, "a string", name);
        const char *s = json_string_value(name);
        size_t n = json_string_length(name), k;
        int okname = n >= 1 && n <= 128;
        for (k = 0; k < n && okname; k++)
            okname = (s[k] >= 'a' && s[k] <= 'z') || (s[k] >= 'A' && s[k] <= 'Z') ||
                     (s[k] >= '0' && s[k] <= '9') || s[k] == '_' || s[k] == '-';
        if (!okname)
            return bad(e, ff,
                       "must be 1 to 128 letters, digits, '_' or '-' (^[a-zA-Z0-9_-]{1,128}$)");
        json_t *x;
        json_array_foreach(names, k, x) if (json_equal(x, name)) return bad(
            e, ff, "'%s' names an earlier tool too (tool names must be unique)", s);
        snprintf(ff, sizeof ff, "%s.description", f);
        if (desc && !json_is_string(desc)) return zi_http_want(e, ff, "a string", desc);
        snprintf(ff, sizeof ff, "%s.input_schema", f);
        if (!schema) return bad(e, ff, "Field required");
        if (!json_is_object(schema)) return zi_http_want(e, ff, "a JSON schema object", schema);
        json_t *st = json_object_get(schema, "type");
        if (!json_is_string(st) || strcmp(json_string_value(st), "object"))
            return bad(e, ff, "its type must be \"object\"");
        json_t *fn = json_pack("{s:O, s:O}", "name", name, "parameters", schema);
        if (desc) json_object_set(fn, "description", desc);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        json_array_append(names, name);
    }
    return 0;
}

/* tool_choice {type: auto|any|tool|none, name, disable_parallel_tool_use}
 * -> OpenAI's. any / tool hold decoding to a call (the grammar engine),
 * which makes exactly one call, so disable_parallel_tool_use holds. */
static int tr_tool_choice(json_t *root, tr *t, json_t *names, zi_http_error *e) {
    json_t *tc = zi_http_get(root, "tool_choice");
    if (!tc) return 0;
    if (!json_is_object(tc)) return zi_http_want(e, "tool_choice", "an object", tc);
    json_t *ty = json_object_get(tc, "type"), *dp = zi_http_get(tc, "disable_parallel_tool_use");
    if (!ty) return bad(e, "tool_choice.type", "Field required");
    if (!json_is_string(ty)) return zi_http_want(e, "tool_choice.type", "a string", ty);
    const char *type = json_string_value(ty);
    static const char *const k_tool[] = {"type", "name", "disable_parallel_tool_use", NULL};
    static const char *const k_other[] = {"type", "disable_parallel_tool_use", NULL};
    static const char *const k_none[] = {"type", NULL};
    int is_tool = !strcmp(type, "tool"), is_none = !strcmp(type, "none");
    if (!is_tool && !is_none && strcmp(type, "auto") && strcmp(type, "any"))
        return bad(e, "tool_choice.type", "expected 'auto', 'any', 'tool' or 'none', got '%.60s'",
                   type);
    if (only_keys(tc, "tool_choice", is_tool ? k_tool : is_none ? k_none : k_other, e)) return -1;
    if (dp && !json_is_boolean(dp))
        return zi_http_want(e, "tool_choice.disable_parallel_tool_use", "a boolean", dp);
    if ((is_tool || !strcmp(type, "any")) && !json_array_size(names))
        return bad(e, "tool_choice", "type '%s' needs tools", type);
    json_t *oc;
    if (is_tool) {
        json_t *name = json_object_get(tc, "name"), *x;
        if (!name) return bad(e, "tool_choice.name", "Field required");
        if (!json_is_string(name)) return zi_http_want(e, "tool_choice.name", "a string", name);
        int found = 0;
        size_t k;
        json_array_foreach(names, k, x) found |= json_equal(x, name);
        if (!found)
            return bad(e, "tool_choice.name", "'%.100s' is not one of the tools",
                       json_string_value(name));
        oc = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name);
    } else {
        oc = json_string(is_none ? "none" : !strcmp(type, "any") ? "required" : "auto");
    }
    /* count_tokens renders the same prompt without holding decoding. */
    if (t->count && !json_is_string(oc)) json_decref(oc), oc = json_string("auto");
    if (t->count && !strcmp(json_string_value(oc), "required"))
        json_decref(oc), oc = json_string("auto");
    if (json_array_size(names) || !json_is_string(oc) || strcmp(json_string_value(oc), "auto"))
        json_object_set_new(t->oai, "tool_choice", oc);
    else
        json_decref(oc);
    return 0;
}

/* thinking {type: enabled, budget_tokens, display} | {type: disabled} |
 * {type: adaptive, display} -> the chat template's enable_thinking and a
 * thinking budget. */
static int tr_thinking(json_t *root, tr *t, zi_http_error *e) {
    json_t *th = zi_http_get(root, "thinking");
    if (!th) return 0;
    if (!json_is_object(th)) return zi_http_want(e, "thinking", "an object", th);
    json_t *ty = json_object_get(th, "type");
    if (!ty) return bad(e, "thinking.type", "Field required");
    if (!json_is_string(ty)) return zi_http_want(e, "thinking.type", "a string", ty);
    const char *type = json_string_value(ty);
    static const char *const k_en[] = {"type", "budget_tokens", "display", NULL};
    static const char *const k_ad[] = {"type", "display", NULL};
    static const char *const k_dis[] = {"type", NULL};
    int en = !strcmp(type, "enabled"), ad = !strcmp(type, "adaptive");
    if (!en && !ad && strcmp(type, "disabled"))
        return bad(e, "thinking.type", "expected 'enabled', 'disabled' or 'adaptive', got '%.60s'",
                   type);
    if (only_keys(th, "thinking", en ? k_en : ad ? k_ad : k_dis, e)) return -1;
    json_t *kw = json_object();
    json_object_set_new(kw, "enable_thinking", json_boolean(en || ad));
    json_object_set_new(t->oai, "chat_template_kwargs", kw);
    json_t *d = zi_http_get(th, "display");
    if (d) {
        if (!json_is_string(d) ||
            (strcmp(json_string_value(d), "summarized") && strcmp(json_string_value(d), "omitted")))
            return bad(e, "thinking.display", "expected 'summarized' or 'omitted'");
        t->omit_thinking = !strcmp(json_string_value(d), "omitted");
    }
    if (!en) return 0;
    json_t *b = json_object_get(th, "budget_tokens");
    if (!b) return bad(e, "thinking.budget_tokens", "Field required");
    if (!json_is_integer(b)) return zi_http_want(e, "thinking.budget_tokens", "an integer", b);
    long long v = json_integer_value(b);
    if (v < 1 || v > ZI_HTTP_MAX_THINKING)
        return bad(e, "thinking.budget_tokens", "%lld is outside [1, %d]", v, ZI_HTTP_MAX_THINKING);
    if (t->has_max && v >= t->max_tokens)
        return bad(e, "thinking.budget_tokens", "%lld must be less than max_tokens (%lld)", v,
                   t->max_tokens);
    /* The worker ends the section at the budget (docs/http.md, "Reasoning"). */
    json_object_set_new(t->oai, "max_thinking_tokens", json_integer(v));
    return 0;
}

/* output_config {effort, format} (and the beta's top-level output_format):
 * the effort -> the chat template's reasoning_effort (templates know low,
 * medium and high: xhigh and max are high); a json_schema format -> the
 * response_format that holds the text to the schema (the grammar engine). */
static int tr_output(json_t *root, tr *t, zi_http_error *e) {
    json_t *oc = zi_http_get(root, "output_config"), *of = zi_http_get(root, "output_format"),
           *fmt = NULL;
    static const char *const k_oc[] = {"effort", "format", NULL};
    static const char *const k_fmt[] = {"type", "schema", NULL};
    if (oc) {
        if (!json_is_object(oc)) return zi_http_want(e, "output_config", "an object", oc);
        if (only_keys(oc, "output_config", k_oc, e)) return -1;
        json_t *ef = zi_http_get(oc, "effort");
        if (ef) {
            static const char *const levels[][2] = {{"low", "low"},   {"medium", "medium"},
                                                    {"high", "high"}, {"xhigh", "high"},
                                                    {"max", "high"},  {NULL, NULL}};
            int k = 0;
            while (json_is_string(ef) && levels[k][0] &&
                   strcmp(levels[k][0], json_string_value(ef)))
                k++;
            if (!json_is_string(ef) || !levels[k][0])
                return bad(e, "output_config.effort",
                           "expected 'low', 'medium', 'high', 'xhigh' or 'max'");
            json_object_set_new(t->oai, "reasoning_effort", json_string(levels[k][1]));
        }
        if ((fmt = zi_http_get(oc, "format"))) t->format = "output_config.format";
    }
    if (of) {
        if (fmt)
            return bad(e, "output_format", "give one of output_config.format and output_format");
        fmt = of, t->format = "output_format";
    }
    if (!fmt) return 0;
    char f[48];
    const char *p = t->format;
    if (!json_is_object(fmt)) return zi_http_want(e, p, "an object", fmt);
    if (only_keys(fmt, p, k_fmt, e)) return -1;
    json_t *ty = json_object_get(fmt, "type"), *sc = json_object_get(fmt, "schema");
    snprintf(f, sizeof f, "%s.type", p);
    if (!json_is_string(ty) || strcmp(json_string_value(ty), "json_schema"))
        return bad(e, f, "expected 'json_schema'");
    snprintf(f, sizeof f, "%s.schema", p);
    if (!sc) return bad(e, f, "Field required");
    if (!json_is_object(sc)) return zi_http_want(e, f, "a JSON schema object", sc);
    json_t *tc = json_object_get(t->oai, "tool_choice");
    if (json_is_object(tc) || (json_is_string(tc) && !strcmp(json_string_value(tc), "required")))
        return bad(e, p, "cannot be combined with a tool_choice that forces a call");
    if (json_object_get(t->oai, "grammar")) return bad(e, p, "give one of %s and grammar", p);
    if (!t->count) /* (the prompt is the same without it) */
        json_object_set_new(t->oai, "response_format",
                            json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema",
                                      "name", "output", "schema", sc));
    return 0;
}

static int tr_number(json_t *root, const char *key, double lo, double hi, json_t *oai,
                     zi_http_error *e) {
    json_t *v = zi_http_get(root, key);
    if (!v) return 0;
    if (!json_is_number(v)) return zi_http_want(e, key, "a number", v);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return bad(e, key, "%g is outside [%g, %g]", x, lo, hi);
    json_object_set(oai, key, v);
    return 0;
}

/* The whole request (root) -> t->oai. */
static int translate(json_t *root, tr *t, zi_http_error *e) {
    static const char *const keys[] = {
        "model",         "messages",    "max_tokens", "system",       "stop_sequences",
        "stream",        "temperature", "top_p",      "top_k",        "tools",
        "tool_choice",   "thinking",    "metadata",   "service_tier", "cache_control",
        "inference_geo", "speed",       "timeout_ms", "grammar",      "output_config",
        "output_format", "keep_alive",  NULL};
    /* Known to Anthropic's API, not served here: refused by name. */
    static const char *const unserved[] = {"container", "mcp_servers", "context_management", NULL};
    json_t *v;
    for (int i = 0; unserved[i]; i++)
        if (zi_http_get(root, unserved[i]))
            return zi_http_fail(e, 400, "unsupported_value", unserved[i],
                                "%s: not supported by this server", unserved[i]);
    if (only_keys(root, "", keys, e)) return -1;
    json_t *m = json_object_get(root, "model");
    if (!m) return bad(e, "model", "Field required");
    if (!json_is_string(m) || !json_string_length(m))
        return zi_http_want(e, "model", "a non-empty string", m);
    v = json_object_get(root, "max_tokens");
    if (!v && !t->count) return bad(e, "max_tokens", "Field required");
    if (v) {
        if (!json_is_integer(v)) return zi_http_want(e, "max_tokens", "an integer", v);
        if (json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
            return bad(e, "max_tokens", "%lld is outside [1, %d]", (long long)json_integer_value(v),
                       INT32_MAX);
        t->max_tokens = json_integer_value(v), t->has_max = 1;
        if (!t->count) json_object_set(t->oai, "max_tokens", v);
    }
    json_t *msgs = json_array();
    json_object_set_new(t->oai, "messages", msgs);
    if (tr_system(root, t, msgs, e) || tr_messages(root, msgs, t->images, e)) return -1;
    if (tr_number(root, "temperature", 0, 1, t->oai, e) ||
        tr_number(root, "top_p", 0, 1, t->oai, e))
        return -1;
    if ((v = zi_http_get(root, "top_k"))) {
        if (!json_is_integer(v)) return zi_http_want(e, "top_k", "an integer", v);
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(e, "top_k", "%lld is outside [0, %d]", (long long)json_integer_value(v),
                       INT32_MAX);
        json_object_set(t->oai, "top_k", v);
    }
    if ((v = zi_http_get(root, "stop_sequences"))) {
        if (!json_is_array(v)) return zi_http_want(e, "stop_sequences", "an array of strings", v);
        if (json_array_size(v) > ZI_HTTP_MAX_STOP)
            return bad(e, "stop_sequences", "at most %d sequences", ZI_HTTP_MAX_STOP);
        size_t i;
        json_t *s;
        json_array_foreach(v, i, s) if (!json_is_string(s) || !json_string_length(s)) {
            char f[48];
            snprintf(f, sizeof f, "stop_sequences.%zu", i);
            return zi_http_want(e, f, "a non-empty string", s);
        }
        if (json_array_size(v)) json_object_set(t->oai, "stop", v);
    }
    if ((v = zi_http_get(root, "stream"))) {
        if (!json_is_boolean(v)) return zi_http_want(e, "stream", "a boolean", v);
        if (t->count && json_is_true(v)) return bad(e, "stream", "count_tokens does not stream");
        if (!t->count) json_object_set(t->oai, "stream", v);
    }
    if ((v = zi_http_get(root, "metadata"))) {
        static const char *const mk[] = {"user_id", NULL};
        if (!json_is_object(v)) return zi_http_want(e, "metadata", "an object", v);
        if (only_keys(v, "metadata", mk, e)) return -1;
        json_t *u = zi_http_get(v, "user_id");
        if (u && !json_is_string(u)) return zi_http_want(e, "metadata.user_id", "a string", u);
    }
    if ((v = zi_http_get(root, "service_tier")) && !json_is_string(v))
        return zi_http_want(e, "service_tier", "a string", v);
    if ((v = zi_http_get(root, "timeout_ms"))) json_object_set(t->oai, "timeout_ms", v);
    if ((v = zi_http_get(root, "keep_alive"))) json_object_set(t->oai, "keep_alive", v);
    if ((v = zi_http_get(root, "grammar"))) {
        if (!json_is_string(v)) return zi_http_want(e, "grammar", "a string", v);
        if (!t->count) json_object_set(t->oai, "grammar", v);
    }
    json_t *names = json_array();
    int rc = tr_tools(root, t->oai, names, e) || tr_tool_choice(root, t, names, e) ||
             tr_thinking(root, t, e) || tr_output(root, t, e);
    json_decref(names);
    return rc ? -1 : 0;
}

/* An error of the OpenAI parse (or of the router, through field_map)
 * named by OpenAI's field: renamed to this API's. */
static const char *const RENAME[] = {"stop",
                                     "stop_sequences",
                                     "tools.function.parameters",
                                     "tools.input_schema",
                                     "response_format",
                                     "tool_choice",
                                     "chat_template_kwargs",
                                     "thinking",
                                     "max_thinking_tokens",
                                     "thinking.budget_tokens",
                                     "enable_thinking",
                                     "thinking",
                                     NULL};

static const char *rename_field(const char *f, size_t *n) {
    for (int i = 0; RENAME[i]; i += 2) {
        *n = strlen(RENAME[i]);
        if (!strncmp(f, RENAME[i], *n) && (f[*n] == 0 || f[*n] == '.' || f[*n] == '['))
            return RENAME[i + 1];
    }
    *n = 0;
    if (!strncmp(f, "messages[", 9)) { /* indexes differ after the translation */
        *n = strlen(f);
        return "messages";
    }
    if (!strncmp(f, "tools[", 6)) {
        *n = strlen(f);
        return "tools";
    }
    return NULL;
}

static void rename_error(zi_http_error *e) {
    size_t n;
    const char *to = e->param[0] ? rename_field(e->param, &n) : NULL;
    if (!to) return;
    char param[sizeof e->param], *msg = NULL;
    snprintf(param, sizeof param, "%s%.100s", to, e->param + n);
    size_t pl = strlen(e->param);
    int has = !strncmp(e->message, e->param, pl);
    if (asprintf(&msg, "%s%s%s", param, has ? "" : ": ", e->message + (has ? pl : 0)) < 0) return;
    memcpy(e->param, param, sizeof param);
    snprintf(e->message, sizeof e->message, "%.*s", (int)sizeof e->message - 1, msg);
    free(msg);
}

static int parse_any(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                     zi_http_error *e, int count) {
    memset(g, 0, sizeof *g);
    json_t *root = zi_http_parse_object(body, len, e);
    if (!root) return -1;
    zi_http_images im;
    zi_http_images_init(&im, &ctx->cfg.images);
    tr t = {.oai = json_object(), .count = count, .images = &im};
    int rc = translate(root, &t, e);
    json_t *stops = json_incref(zi_http_get(root, "stop_sequences"));
    json_decref(root);
    if (!rc && count) {
        /* One greedy token: the router's usage then counts the prompt. */
        json_object_set_new(t.oai, "max_tokens", json_integer(1));
        json_object_set_new(t.oai, "top_k", json_integer(1));
        json_object_del(t.oai, "stop");
        json_object_del(t.oai, "max_thinking_tokens"); /* (the prompt is the same) */
    }
    if (!rc && (rc = zi_http_parse_generate_json(t.oai, ZI_HTTP_CHAT, &im, g, e))) rename_error(e);
    zi_http_images_free(&im); /* the requests hold their copies */
    json_decref(t.oai);
    if (rc) {
        json_decref(stops);
        return -1;
    }
    /* The router's fields, by this API's names: a forced call's schema
     * first (its arguments are the tool's input_schema), then the OpenAI
     * parse's map renamed. */
    const char *map[40] = {"response_format.json_schema.properties.arguments",
                           "tools.input_schema",
                           "response_format.json_schema.schema.properties.arguments",
                           "tools.input_schema",
                           "max_thinking_tokens",
                           "thinking.budget_tokens"};
    int k = 6;
    if (t.format) { /* the schema's errors, by the client's field */
        int oc = !strcmp(t.format, "output_config.format");
        map[k++] = "response_format.json_schema";
        map[k++] = oc ? "output_config.format.schema" : "output_format.schema";
        map[k++] = "response_format";
        map[k++] = oc ? "output_config.format" : "output_format";
    }
    for (int i = 0; g->field_map[i] && k + 2 < 40; i += 2) {
        size_t n;
        const char *to = rename_field(g->field_map[i + 1], &n);
        map[k++] = g->field_map[i];
        map[k++] = to && !g->field_map[i + 1][n] ? to : g->field_map[i + 1];
    }
    map[k] = NULL;
    memcpy(g->field_map, map, sizeof map);
    /* This API has its own blocks for the thinking: always apart. */
    g->reasoning.format = ZI_REASONING_SEPARATE;
    g->reasoning.format_given = 1;
    g->api_req = json_pack("{s:o, s:b}", "stop_sequences", stops ? stops : json_array(),
                           "omit_thinking", t.omit_thinking);
    return 0;
}

static int parse_messages(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                          zi_http_error *e) {
    return parse_any(ctx, body, len, g, e, 0);
}

static int parse_count(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                       zi_http_error *e) {
    return parse_any(ctx, body, len, g, e, 1);
}

/* ---- the reply ---------------------------------------------------------- */

enum { B_NONE, B_THINK, B_TEXT, B_TOOL };

/* A reply being rendered: the stream's events or the whole message's
 * blocks, from the same chat_stream events. */
typedef struct mstate {
    zi_chat_stream *cs;
    int started;    /* message_start sent */
    int open;       /* the open block's kind (B_NONE: none) */
    int n_blocks;   /* blocks opened */
    int call;       /* B_TOOL: the call's index */
    int omit;       /* thinking.display omitted */
    json_t *blocks; /* whole: the blocks; NULL when streaming */
    char *args;     /* whole: the open tool_use block's arguments */
    size_t alen, acap;
    char **out; /* stream: where the events go */
    size_t *len, *cap;
} mstate;

static void mstate_free(void *p) {
    mstate *s = p;
    if (!s) return;
    if (s->cs) zi_chat_stream_free(s->cs);
    json_decref(s->blocks);
    free(s->args);
    free(s);
}

/* r's renderer state, made on first use (the message's id "msg_..."). */
static mstate *state(zi_http_result *r) {
    if (r->api_state) return r->api_state;
    mstate *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->omit = json_is_true(json_object_get(r->g->api_req, "omit_thinking"));
    r->api_state = s;
    r->api_state_free = mstate_free;
    const char *hex = strchr(r->id, '-');
    char id[sizeof r->id];
    snprintf(id, sizeof id, "msg_%.40s", hex ? hex + 1 : r->id);
    memcpy(r->id, id, sizeof id);
    return s;
}

/* Appends "event: name\ndata: <o>\n\n" and drops o. */
static int sse(char **out, size_t *len, size_t *cap, const char *name, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) return -1;
    int rc = zi_http_buf_add(out, len, cap, "event: ", 7) ||
             zi_http_buf_add(out, len, cap, name, strlen(name)) ||
             zi_http_buf_add(out, len, cap, "\ndata: ", 7) ||
             zi_http_buf_add(out, len, cap, s, strlen(s)) ||
             zi_http_buf_add(out, len, cap, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

static int emit(mstate *s, const char *name, json_t *o) {
    return sse(s->out, s->len, s->cap, name, o);
}

static int block_close(mstate *s) {
    if (s->open == B_NONE) return 0;
    int kind = s->open, index = s->n_blocks - 1;
    s->open = B_NONE;
    if (!s->blocks) {
        /* Anthropic's streams end a thinking block with its signature;
         * local models have none to give. */
        if (kind == B_THINK &&
            emit(s, "content_block_delta",
                 json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta", "index",
                           index, "delta", "type", "signature_delta", "signature", "")))
            return -1;
        return emit(s, "content_block_stop",
                    json_pack("{s:s, s:i}", "type", "content_block_stop", "index", index));
    }
    if (kind == B_TOOL) {
        json_t *in = s->alen ? json_loadb(s->args, s->alen, 0, NULL) : NULL;
        json_object_set_new(json_array_get(s->blocks, index), "input",
                            json_is_object(in) ? in : json_object());
        if (in && !json_is_object(in)) json_decref(in);
        s->alen = 0;
    }
    return 0;
}

static int block_open(mstate *s, int kind, const zi_ts_event *ev) {
    if (block_close(s)) return -1;
    json_t *b;
    if (kind == B_THINK)
        b = json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "");
    else if (kind == B_TEXT)
        b = json_pack("{s:s, s:s}", "type", "text", "text", "");
    else
        b = json_pack("{s:s, s:s, s:o}", "type", "tool_use", "id", ev->id, "name",
                      zi_http_jstr(ev->text, ev->len));
    if (!b) return -1;
    s->open = kind;
    int index = s->n_blocks++;
    if (s->blocks) return json_array_append_new(s->blocks, b);
    if (kind == B_TOOL) json_object_set_new(b, "input", json_object());
    return emit(s, "content_block_start",
                json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", index,
                          "content_block", b));
}

/* The open block gains n bytes of its text. */
static int block_add(mstate *s, const char *text, size_t n) {
    int index = s->n_blocks - 1;
    if (!n) return 0;
    if (s->blocks) {
        if (s->open == B_TOOL) return zi_http_buf_add(&s->args, &s->alen, &s->acap, text, n);
        json_t *b = json_array_get(s->blocks, index);
        const char *key = s->open == B_THINK ? "thinking" : "text";
        json_t *old = json_object_get(b, key);
        size_t m = json_string_length(old);
        char *all = malloc(m + n + 1);
        if (!all) return -1;
        memcpy(all, json_string_value(old), m);
        memcpy(all + m, text, n);
        json_t *nv = zi_http_jstr(all, m + n);
        free(all);
        return json_object_set_new(b, key, nv);
    }
    const char *dt = s->open == B_THINK  ? "thinking_delta"
                     : s->open == B_TEXT ? "text_delta"
                                         : "input_json_delta";
    const char *key = s->open == B_THINK ? "thinking" : s->open == B_TEXT ? "text" : "partial_json";
    return emit(s, "content_block_delta",
                json_pack("{s:s, s:i, s:{s:s, s:o}}", "type", "content_block_delta", "index", index,
                          "delta", "type", dt, key, zi_http_jstr(text, n)));
}

/* chat_stream's events (tool_stream.h) as blocks: a change of kind closes
 * the open block and opens the next; each call is a block of its own. */
static int on_event(void *arg, const zi_ts_event *ev) {
    mstate *s = arg;
    switch (ev->kind) {
    case ZI_TS_REASONING:
        if (s->open != B_THINK && block_open(s, B_THINK, ev)) return -1;
        return s->omit ? 0 : block_add(s, ev->text, ev->len);
    case ZI_TS_CONTENT:
        if (!ev->len) return 0;
        if (s->open != B_TEXT && block_open(s, B_TEXT, ev)) return -1;
        return block_add(s, ev->text, ev->len);
    case ZI_TS_CALL:
        s->call = ev->index;
        return block_open(s, B_TOOL, ev);
    case ZI_TS_ARGS:
        return s->open == B_TOOL && s->call == ev->index ? block_add(s, ev->text, ev->len) : 0;
    }
    return 0;
}

static const char *stop_reason(const zi_http_choice *c, int calls_ok) {
    if (calls_ok) return "tool_use";
    if (!strcmp(c->status, "maximum_length")) return "max_tokens";
    if (!strcmp(c->status, "stop")) return "stop_sequence";
    return "end_turn";
}

/* The stop sequence that ended the text, as the router's final names it. */
static json_t *stop_sequence(const zi_http_result *r) {
    const char *s = r->ch[0].stop_string;
    if (strcmp(r->ch[0].status, "stop") || !s) return json_null();
    return zi_http_jstr(s, strlen(s));
}

static json_t *usage(const zi_http_result *r) {
    return json_pack("{s:I, s:I}", "input_tokens", (json_int_t)r->ch[0].prompt_tokens,
                     "output_tokens", (json_int_t)r->ch[0].completion_tokens);
}

static json_t *full_messages(zi_http_result *r, zi_http_conn *conn, zi_http_error *e) {
    (void)conn;
    mstate *s = state(r);
    zi_http_choice *c = &r->ch[0];
    const char *text = c->text ? c->text : "";
    zi_chat_stream *cs = s ? zi_chat_stream_new(r->g) : NULL;
    if (!cs) goto oom;
    s->blocks = json_array();
    int rc = zi_chat_stream_feed(cs, text, c->len, on_event, s) ||
             zi_chat_stream_finish(cs, on_event, s) || block_close(s);
    int calls_ok = zi_chat_stream_calls_ok(cs);
    zi_chat_stream_free(cs);
    if (rc) goto oom;
    size_t i;
    json_t *b;
    int tools_seen = 0;
    json_array_foreach(s->blocks, i, b) tools_seen |=
        !strcmp(json_string_value(json_object_get(b, "type")), "tool_use");
    if (tools_seen && !calls_ok) {
        /* A malformed or cut call: the text after the thinking is all text,
         * as chat completions answer it unstreamed. */
        char *reasoning, *content;
        size_t rl, cl;
        json_t *calls = NULL; /* none: the calls were not whole */
        if (zi_chat_stream_split(r->g, text, c->len, &reasoning, &rl, &content, &cl, &calls))
            goto oom;
        json_decref(calls);
        json_decref(s->blocks);
        s->blocks = json_array();
        if (rl)
            json_array_append_new(s->blocks,
                                  json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking",
                                            s->omit ? json_string("") : zi_http_jstr(reasoning, rl),
                                            "signature", ""));
        if (cl)
            json_array_append_new(s->blocks, json_pack("{s:s, s:o}", "type", "text", "text",
                                                       zi_http_jstr(content, cl)));
        free(reasoning);
        free(content);
    }
    json_t *o =
        json_pack("{s:s, s:s, s:s, s:o, s:O, s:s, s:o, s:o}", "id", r->id, "type", "message",
                  "role", "assistant", "model", zi_http_jstr(r->model, strlen(r->model)), "content",
                  s->blocks, "stop_reason", stop_reason(c, calls_ok), "stop_sequence",
                  stop_sequence(r), "usage", usage(r));
    if (!o) goto oom;
    return o;
oom:
    zi_http_fail(e, 500, "internal", NULL, "out of memory");
    return NULL;
}

static int delta_messages(zi_http_result *r, const zi_http_delta *d, zi_http_conn *conn, char **out,
                          size_t *len, size_t *cap, zi_http_error *e) {
    (void)conn;
    mstate *s = state(r);
    if (!s) goto oom;
    s->out = out, s->len = len, s->cap = cap;
    zi_http_choice *c = &r->ch[d->index];
    if (!s->started) {
        s->started = 1;
        /* The router's first chunk told the prompt's length (message_delta
         * says it again, with the output's). */
        json_t *msg = json_pack("{s:s, s:s, s:s, s:o, s:[], s:n, s:n, s:{s:I, s:i}}", "id", r->id,
                                "type", "message", "role", "assistant", "model",
                                zi_http_jstr(r->model, strlen(r->model)), "content", "stop_reason",
                                "stop_sequence", "usage", "input_tokens",
                                (json_int_t)c->prompt_tokens, "output_tokens", 0);
        if (emit(s, "message_start",
                 json_pack("{s:s, s:o}", "type", "message_start", "message", msg)) ||
            emit(s, "ping", json_pack("{s:s}", "type", "ping")))
            goto oom;
        if (!(s->cs = zi_chat_stream_new(r->g))) goto oom;
    }
    if (zi_chat_stream_feed(s->cs, c->text ? c->text + d->text_from : "", c->len - d->text_from,
                            on_event, s))
        goto oom;
    if (d->final && (zi_chat_stream_finish(s->cs, on_event, s) || block_close(s))) goto oom;
    return 0;
oom:
    return zi_http_fail(e, 500, "internal", NULL, "out of memory");
}

static int end_messages(zi_http_result *r, char **out, size_t *len, size_t *cap) {
    mstate *s = state(r);
    if (!s) return -1;
    s->out = out, s->len = len, s->cap = cap;
    int calls_ok = s->cs && zi_chat_stream_calls_ok(s->cs);
    return emit(s, "message_delta",
                json_pack("{s:s, s:{s:s, s:o}, s:o}", "type", "message_delta", "delta",
                          "stop_reason", stop_reason(&r->ch[0], calls_ok), "stop_sequence",
                          stop_sequence(r), "usage", usage(r))) ||
                   emit(s, "message_stop", json_pack("{s:s}", "type", "message_stop"))
               ? -1
               : 0;
}

static int stream_error_messages(zi_http_result *r, const zi_http_error *e, char **out, size_t *len,
                                 size_t *cap) {
    (void)r;
    return sse(out, len, cap, "error", zi_http_messages_error_json(e));
}

const zi_http_api zi_http_api_messages = {
    .name = "messages",
    .parse = parse_messages,
    .full = full_messages,
    .delta = delta_messages,
    .end = end_messages,
    .stream_error = stream_error_messages,
    .error_json = zi_http_messages_error_json,
};

/* count_tokens: the one-token generation's prompt length. */
static json_t *full_count(zi_http_result *r, zi_http_conn *conn, zi_http_error *e) {
    (void)conn;
    json_t *o = json_pack("{s:I}", "input_tokens", (json_int_t)r->ch[0].prompt_tokens);
    if (!o) zi_http_fail(e, 500, "internal", NULL, "out of memory");
    return o;
}

const zi_http_api zi_http_api_count_tokens = {
    .name = "messages.count_tokens",
    .parse = parse_count,
    .full = full_count,
    .delta = delta_messages,
    .end = end_messages,
    .stream_error = stream_error_messages,
    .error_json = zi_http_messages_error_json,
};
