/*
 * http_responses.c - OpenAI's Responses API (http_responses.h): the
 * request checked and translated into the chat-completions shape, the
 * model's text rendered as output items, whole or as stream events, and
 * the store's GET and DELETE.
 */
#include "http_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "chat_stream.h"
#include "response_store.h"
#include "utf8.h"

/* ---- request ----------------------------------------------------------- */

static int oom(zi_http_error *e) {
    return zi_http_fail(e, 500, "internal", NULL, "out of memory");
}

/* One of the words of list (NULL-ended), or -1. */
static int one_of(const char *s, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(s, list[i])) return i;
    return -1;
}

/* A field that must be, when given, a string that is one of list. */
static int get_word(json_t *o, const char *key, const char *field, const char *const *list,
                    const char *said, zi_http_error *e) {
    json_t *v = zi_http_get(o, key);
    if (!v) return 0;
    if (!json_is_string(v)) return zi_http_want(e, field, "a string", v);
    if (one_of(json_string_value(v), list) < 0)
        return zi_http_fail(e, 400, "invalid_value", field, "%s: '%s' is not one of %s", field,
                            json_string_value(v), said);
    return 0;
}

/* Fields this server knows and does not serve: refused, never ignored. */
static int refuse_unserved(json_t *o, zi_http_error *e) {
    json_t *v;
    if ((v = zi_http_get(o, "background"))) {
        if (!json_is_boolean(v)) return zi_http_want(e, "background", "a boolean", v);
        if (json_is_true(v))
            return zi_http_fail(e, 400, "unsupported_value", "background",
                                "background: background responses are not supported");
    }
    if ((v = zi_http_get(o, "truncation"))) {
        if (!json_is_string(v)) return zi_http_want(e, "truncation", "a string", v);
        if (strcmp(json_string_value(v), "disabled"))
            return zi_http_fail(e, 400, "unsupported_value", "truncation",
                                "truncation: only \"disabled\" is supported (a conversation "
                                "longer than the context is an error)");
    }
    if ((v = zi_http_get(o, "include"))) {
        if (!json_is_array(v)) return zi_http_want(e, "include", "an array of strings", v);
        if (json_array_size(v)) {
            json_t *x = json_array_get(v, 0);
            return zi_http_fail(e, 400, "unsupported_value", "include[0]",
                                "include[0]: '%s' cannot be included (nothing extra is)",
                                json_is_string(x) ? json_string_value(x) : "?");
        }
    }
    static const char *const refused[][2] = {
        {"conversation", "conversations are not supported (use previous_response_id)"},
        {"prompt", "prompt templates are not supported"},
        {"top_logprobs", "log probabilities are not supported here (use /v1/chat/completions)"},
        {"max_tool_calls", "a limit on tool calls is not supported"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (zi_http_get(o, refused[i][0]))
            return zi_http_fail(e, 400, "unsupported_value", refused[i][0], "%s: %s", refused[i][0],
                                refused[i][1]);
    if ((v = zi_http_get(o, "metadata"))) {
        if (!json_is_object(v)) return zi_http_want(e, "metadata", "an object of strings", v);
        if (json_object_size(v) > 16)
            return zi_http_fail(e, 400, "invalid_value", "metadata",
                                "metadata: at most 16 keys, got %zu", json_object_size(v));
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            char f[128];
            snprintf(f, sizeof f, "metadata.%.64s", k);
            if (strlen(k) > 64)
                return zi_http_fail(e, 400, "invalid_value", "metadata",
                                    "metadata: a key is longer than 64 characters");
            if (!json_is_string(x)) return zi_http_want(e, f, "a string", x);
            if (json_string_length(x) > 512)
                return zi_http_fail(e, 400, "invalid_value", f, "%s: longer than 512 characters",
                                    f);
        }
    }
    static const char *const bools[] = {"stream", "store", "parallel_tool_calls", NULL};
    for (int i = 0; bools[i]; i++)
        if ((v = zi_http_get(o, bools[i])) && !json_is_boolean(v))
            return zi_http_want(e, bools[i], "a boolean", v);
    static const char *const strs[] = {"model",
                                       "user",
                                       "previous_response_id",
                                       "instructions",
                                       "service_tier",
                                       "prompt_cache_key",
                                       "safety_identifier",
                                       NULL};
    for (int i = 0; strs[i]; i++)
        if ((v = zi_http_get(o, strs[i])) && !json_is_string(v))
            return zi_http_want(e, strs[i], "a string", v);
    static const char *const nums[] = {"temperature", "top_p", NULL};
    for (int i = 0; nums[i]; i++)
        if ((v = zi_http_get(o, nums[i])) && !json_is_number(v))
            return zi_http_want(e, nums[i], "a number", v);
    /* OpenAI's range (the router would take up to 1e6) */
    if ((v = zi_http_get(o, "temperature")) &&
        !(json_number_value(v) >= 0 && json_number_value(v) <= 2))
        return zi_http_fail(e, 400, "invalid_value", "temperature",
                            "temperature: %g is outside [0, 2]", json_number_value(v));
    if ((v = zi_http_get(o, "max_output_tokens"))) {
        if (!json_is_integer(v)) return zi_http_want(e, "max_output_tokens", "an integer", v);
        if (json_integer_value(v) < 1 || json_integer_value(v) > INT32_MAX)
            return zi_http_fail(e, 400, "invalid_value", "max_output_tokens",
                                "max_output_tokens: %lld is outside [1, %d]",
                                (long long)json_integer_value(v), INT32_MAX);
    }
    return 0;
}

/* An input_image part ({"type": "input_image", "image_url", "detail"?}):
 * its image decoded into im. */
static int image_part(json_t *part, const char *f, zi_http_images *im, zi_http_error *e) {
    char pf[192];
    json_t *d = zi_http_get(part, "detail"), *u = zi_http_get(part, "image_url");
    snprintf(pf, sizeof pf, "%.160s.detail", f);
    if (d && !json_is_string(d)) return zi_http_want(e, pf, "a string", d);
    if (d && one_of(json_string_value(d), (const char *const[]){"auto", "low", "high", NULL}) < 0)
        return zi_http_fail(e, 400, "invalid_value", pf,
                            "%s: '%.40s' is not one of auto, low, high", pf, json_string_value(d));
    snprintf(pf, sizeof pf, "%.160s.image_url", f);
    if (!u && zi_http_get(part, "file_id"))
        return zi_http_fail(e, 400, "unsupported_value", pf,
                            "%s: file ids are not served: send the image as image_url, a data: "
                            "URL (data:image/png;base64,...)",
                            pf);
    if (!u) return zi_http_fail(e, 400, "missing", pf, "%s is missing", pf);
    if (!json_is_string(u)) return zi_http_want(e, pf, "a string", u);
    return zi_http_images_add_url(im, json_string_value(u), json_string_length(u), pf, e);
}

/* A content part's text, or an error naming f (input[i].content[j]). An
 * input_image part, where im is not NULL (a message's content), is decoded
 * into im and *text set to NULL: the caller writes ZI_MEDIA_MARKER. */
static int part_text(json_t *part, const char *f, zi_http_images *im, json_t **text,
                     zi_http_error *e) {
    char pf[192];
    if (!json_is_object(part)) return zi_http_want(e, f, "a content part object", part);
    json_t *t = json_object_get(part, "type");
    snprintf(pf, sizeof pf, "%.160s.type", f);
    if (!json_is_string(t)) return zi_http_want(e, pf, "a string", t);
    const char *ty = json_string_value(t);
    static const char *const texts[] = {"input_text", "output_text", "text", NULL};
    static const char *const media[] = {"input_image", "input_file", "input_audio", NULL};
    if (im && !strcmp(ty, "input_image")) {
        *text = NULL;
        return image_part(part, f, im, e);
    }
    if (one_of(ty, media) >= 0)
        return zi_http_fail(e, 400, "unsupported_value", pf,
                            "%s: '%s' parts are not supported (only input_text, output_text%s)", pf,
                            ty, im ? " and input_image" : "");
    if (!strcmp(ty, "refusal")) {
        json_t *r = json_object_get(part, "refusal");
        snprintf(pf, sizeof pf, "%.160s.refusal", f);
        if (!json_is_string(r)) return zi_http_want(e, pf, "a string", r);
        *text = r;
        return 0;
    }
    if (one_of(ty, texts) < 0)
        return zi_http_fail(e, 400, "invalid_value", pf,
                            "%s: '%s' is not a content part type (input_text, output_text)", pf,
                            ty);
    json_t *tx = json_object_get(part, "text");
    snprintf(pf, sizeof pf, "%.160s.text", f);
    if (!json_is_string(tx)) return zi_http_want(e, pf, "a string", tx);
    *text = tx;
    return 0;
}

/* content (a string, or an array of text parts) as the chat shape's: a
 * string, or an array of {"type": "text", "text"} parts. im: where a
 * message's images go (NULL: no images allowed here). */
static int content_of(json_t *c, const char *f, zi_http_images *im, json_t **out,
                      zi_http_error *e) {
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c)) return zi_http_want(e, f, "a string or an array of content parts", c);
    json_t *parts = json_array();
    size_t j;
    json_t *p;
    json_array_foreach(c, j, p) {
        char pf[192];
        snprintf(pf, sizeof pf, "%.140s[%zu]", f, j);
        json_t *tx = NULL;
        if (part_text(p, pf, im, &tx, e)) {
            json_decref(parts);
            return -1;
        }
        if (tx)
            json_array_append_new(parts, json_pack("{s:s, s:O}", "type", "text", "text", tx));
        else /* an image, where it was */
            json_array_append_new(parts,
                                  json_pack("{s:s, s:s}", "type", "text", "text", ZI_MEDIA_MARKER));
    }
    *out = parts;
    return 0;
}

/* The input items (earlier turns' first: the first `own` of them came from
 * previous_response_id) as chat messages appended to msgs. Fields are
 * named input[i] counting from this request's own items. */
static int items_to_messages(json_t *items, size_t own, json_t *msgs, zi_http_images *im,
                             zi_http_error *e) {
    json_t *names = json_object(); /* call_id -> the function's name */
    size_t i;
    json_t *it;
    int rc = 0;
    json_array_foreach(items, i, it) {
        char f[96], ff[160];
        if (i < own)
            snprintf(f, sizeof f, "previous_response_id");
        else
            snprintf(f, sizeof f, "input[%zu]", i - own);
        if (!json_is_object(it)) {
            rc = zi_http_want(e, f, "an input item object", it);
            break;
        }
        json_t *t = zi_http_get(it, "type");
        snprintf(ff, sizeof ff, "%s.type", f);
        if (t && !json_is_string(t)) {
            rc = zi_http_want(e, ff, "a string", t);
            break;
        }
        const char *ty = t ? json_string_value(t) : "message";
        if (!strcmp(ty, "message")) {
            json_t *r = json_object_get(it, "role");
            snprintf(ff, sizeof ff, "%s.role", f);
            if (!json_is_string(r)) {
                rc = zi_http_want(e, ff, "a string", r);
                break;
            }
            static const char *const roles[] = {"user", "system", "developer", "assistant", NULL};
            if (one_of(json_string_value(r), roles) < 0) {
                rc = zi_http_fail(e, 400, "invalid_value", ff,
                                  "%s: '%s' is not one of user, system, developer, assistant", ff,
                                  json_string_value(r));
                break;
            }
            json_t *c = json_object_get(it, "content"), *content;
            snprintf(ff, sizeof ff, "%s.content", f);
            if (!c) {
                rc = zi_http_fail(e, 400, "missing", ff, "%s is missing", ff);
                break;
            }
            if ((rc = content_of(c, ff, im, &content, e))) break;
            json_array_append_new(msgs, json_pack("{s:O, s:o}", "role", r, "content", content));
        } else if (!strcmp(ty, "function_call")) {
            static const char *const keys[] = {"call_id", "name", "arguments"};
            json_t *v[3];
            for (int k = 0; k < 3 && !rc; k++) {
                v[k] = json_object_get(it, keys[k]);
                snprintf(ff, sizeof ff, "%s.%s", f, keys[k]);
                if (!json_is_string(v[k]))
                    rc = zi_http_want(e, ff, "a string", v[k]);
                else if (k < 2 && !json_string_length(v[k]))
                    rc = zi_http_fail(e, 400, "invalid_value", ff, "%s is empty", ff);
            }
            if (rc) break;
            json_t *args = json_loads(json_string_value(v[2]), JSON_DECODE_ANY, NULL);
            if (!args) {
                snprintf(ff, sizeof ff, "%s.arguments", f);
                rc = zi_http_fail(e, 400, "invalid_value", ff, "%s: not a JSON text", ff);
                break;
            }
            json_decref(args);
            json_t *call = json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", v[0], "type", "function",
                                     "function", "name", v[1], "arguments", v[2]);
            json_object_set(names, json_string_value(v[0]), v[1]);
            /* An assistant turn's calls go with its text, as chat has them. */
            json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
            const char *lr = json_string_value(json_object_get(last, "role"));
            if (lr && !strcmp(lr, "assistant")) {
                json_t *tc = json_object_get(last, "tool_calls");
                if (!tc) json_object_set_new(last, "tool_calls", tc = json_array());
                json_array_append_new(tc, call);
            } else {
                json_array_append_new(msgs, json_pack("{s:s, s:n, s:[o]}", "role", "assistant",
                                                      "content", "tool_calls", call));
            }
        } else if (!strcmp(ty, "function_call_output")) {
            json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
            snprintf(ff, sizeof ff, "%s.call_id", f);
            if (!json_is_string(id)) {
                rc = zi_http_want(e, ff, "a string", id);
                break;
            }
            json_t *name = json_object_get(names, json_string_value(id));
            if (!name) {
                rc = zi_http_fail(e, 400, "invalid_value", ff,
                                  "%s: no function_call item before it has call_id '%s'", ff,
                                  json_string_value(id));
                break;
            }
            snprintf(ff, sizeof ff, "%s.output", f);
            if (!out) {
                rc = zi_http_fail(e, 400, "missing", ff, "%s is missing", ff);
                break;
            }
            json_t *content;
            if ((rc = content_of(out, ff, NULL, &content, e))) break;
            json_array_append_new(msgs,
                                  json_pack("{s:s, s:O, s:O, s:o}", "role", "tool", "tool_call_id",
                                            id, "name", name, "content", content));
        } else if (!strcmp(ty, "reasoning")) {
            /* An earlier turn's reasoning: templates drop it from the
             * history, and so does this translation. */
        } else {
            static const char *const known[] = {"item_reference",          "file_search_call",
                                                "web_search_call",         "computer_call",
                                                "computer_call_output",    "code_interpreter_call",
                                                "image_generation_call",   "local_shell_call",
                                                "local_shell_call_output", "mcp_call",
                                                "mcp_list_tools",          "mcp_approval_request",
                                                "mcp_approval_response",   "custom_tool_call",
                                                "custom_tool_call_output", NULL};
            snprintf(ff, sizeof ff, "%s.type", f);
            rc = one_of(ty, known) >= 0
                     ? zi_http_fail(e, 400, "unsupported_value", ff,
                                    "%s: '%s' items are not supported (message, function_call, "
                                    "function_call_output, reasoning)",
                                    ff, ty)
                     : zi_http_fail(e, 400, "invalid_value", ff,
                                    "%s: '%s' is not an input item type", ff, ty);
            break;
        }
    }
    json_decref(names);
    return rc;
}

/* tools (Responses' flat function tools) into the chat shape. */
static int translate_tools(json_t *o, json_t *chat, zi_http_error *e) {
    json_t *tools = zi_http_get(o, "tools");
    if (!tools) return 0;
    if (!json_is_array(tools)) return zi_http_want(e, "tools", "an array of tools", tools);
    json_t *out = json_array();
    json_object_set_new(chat, "tools", out);
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        char f[64], ff[96];
        snprintf(f, sizeof f, "tools[%zu]", i);
        if (!json_is_object(t)) return zi_http_want(e, f, "a tool object", t);
        json_t *ty = json_object_get(t, "type");
        snprintf(ff, sizeof ff, "%s.type", f);
        if (!json_is_string(ty)) return zi_http_want(e, ff, "a string", ty);
        if (strcmp(json_string_value(ty), "function")) {
            static const char *const known[] = {"web_search",
                                                "web_search_preview",
                                                "web_search_2025_08_26",
                                                "web_search_preview_2025_03_11",
                                                "file_search",
                                                "code_interpreter",
                                                "mcp",
                                                "computer_use_preview",
                                                "computer",
                                                "image_generation",
                                                "local_shell",
                                                "shell",
                                                "custom",
                                                "apply_patch",
                                                NULL};
            if (one_of(json_string_value(ty), known) >= 0)
                return zi_http_fail(e, 400, "unsupported_value", ff,
                                    "%s: '%s' tools are not supported (only function tools)", ff,
                                    json_string_value(ty));
            return zi_http_fail(e, 400, "invalid_value", ff, "%s: '%s' is not a tool type", ff,
                                json_string_value(ty));
        }
        json_t *name = json_object_get(t, "name"), *desc = zi_http_get(t, "description"),
               *params = zi_http_get(t, "parameters"), *strict = zi_http_get(t, "strict");
        snprintf(ff, sizeof ff, "%s.name", f);
        if (!json_is_string(name)) return zi_http_want(e, ff, "a string", name);
        if (!json_string_length(name) || json_string_length(name) > 128)
            return zi_http_fail(e, 400, "invalid_value", ff, "%s: expected 1 to 128 characters",
                                ff);
        snprintf(ff, sizeof ff, "%s.description", f);
        if (desc && !json_is_string(desc)) return zi_http_want(e, ff, "a string", desc);
        snprintf(ff, sizeof ff, "%s.parameters", f);
        if (params && !json_is_object(params))
            return zi_http_want(e, ff, "a JSON schema object", params);
        snprintf(ff, sizeof ff, "%s.strict", f);
        if (strict && !json_is_boolean(strict)) return zi_http_want(e, ff, "a boolean", strict);
        json_t *fn = json_pack("{s:O}", "name", name);
        if (desc) json_object_set(fn, "description", desc);
        if (params) json_object_set(fn, "parameters", params);
        json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn));
    }
    return 0;
}

static int translate_tool_choice(json_t *o, json_t *chat, zi_http_error *e) {
    json_t *tc = zi_http_get(o, "tool_choice"), *tools = zi_http_get(o, "tools");
    if (!tc) return 0;
    int have = json_is_array(tools) && json_array_size(tools);
    if (json_is_string(tc)) {
        static const char *const words[] = {"none", "auto", "required", NULL};
        int w = one_of(json_string_value(tc), words);
        if (w < 0)
            return zi_http_fail(e, 400, "invalid_value", "tool_choice",
                                "tool_choice: '%s' is not one of none, auto, required or "
                                "{\"type\": \"function\", \"name\"}",
                                json_string_value(tc));
        if (w == 2 && !have)
            return zi_http_fail(e, 400, "invalid_value", "tool_choice",
                                "tool_choice: \"required\" needs tools");
        json_object_set(chat, "tool_choice", tc);
        return 0;
    }
    if (!json_is_object(tc)) return zi_http_want(e, "tool_choice", "a string or an object", tc);
    json_t *ty = json_object_get(tc, "type");
    if (!json_is_string(ty)) return zi_http_want(e, "tool_choice.type", "a string", ty);
    if (strcmp(json_string_value(ty), "function"))
        return zi_http_fail(e, 400, "unsupported_value", "tool_choice.type",
                            "tool_choice.type: '%s' is not supported (only \"function\")",
                            json_string_value(ty));
    json_t *name = json_object_get(tc, "name");
    if (!json_is_string(name)) return zi_http_want(e, "tool_choice.name", "a string", name);
    size_t i;
    json_t *t;
    int found = 0;
    if (have) json_array_foreach(tools, i, t) found |= json_equal(json_object_get(t, "name"), name);
    if (!found)
        return zi_http_fail(e, 400, "invalid_value", "tool_choice.name",
                            "tool_choice.name: '%s' is not one of the tools",
                            json_string_value(name));
    json_object_set_new(chat, "tool_choice",
                        json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name));
    return 0;
}

/* text.format into response_format; text.verbosity checked (the model has
 * no such knob: every value gives the same answer). */
static int translate_text(json_t *o, json_t *chat, zi_http_error *e) {
    json_t *text = zi_http_get(o, "text");
    if (!text) return 0;
    if (!json_is_object(text)) return zi_http_want(e, "text", "an object", text);
    static const char *const verb[] = {"low", "medium", "high", NULL};
    if (get_word(text, "verbosity", "text.verbosity", verb, "low, medium, high", e)) return -1;
    json_t *fm = zi_http_get(text, "format");
    if (!fm) return 0;
    if (!json_is_object(fm)) return zi_http_want(e, "text.format", "an object", fm);
    json_t *ty = json_object_get(fm, "type");
    if (!json_is_string(ty)) return zi_http_want(e, "text.format.type", "a string", ty);
    const char *t = json_string_value(ty);
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object")) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return zi_http_fail(e, 400, "invalid_value", "text.format.type",
                            "text.format.type: '%s' is not one of text, json_object, json_schema",
                            t);
    json_t *name = json_object_get(fm, "name"), *schema = json_object_get(fm, "schema"),
           *strict = zi_http_get(fm, "strict"), *desc = zi_http_get(fm, "description");
    if (!json_is_string(name)) return zi_http_want(e, "text.format.name", "a string", name);
    size_t n = json_string_length(name);
    const char *s = json_string_value(name);
    int ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
             (s[i] >= '0' && s[i] <= '9') || s[i] == '_' || s[i] == '-';
    if (!ok)
        return zi_http_fail(e, 400, "invalid_value", "text.format.name",
                            "text.format.name: expected 1 to 64 letters, digits, _ or -");
    if (!json_is_object(schema))
        return zi_http_want(e, "text.format.schema", "a JSON schema object", schema);
    if (strict && !json_is_boolean(strict))
        return zi_http_want(e, "text.format.strict", "a boolean", strict);
    if (desc && !json_is_string(desc))
        return zi_http_want(e, "text.format.description", "a string", desc);
    json_t *js = json_pack("{s:O, s:O}", "name", name, "schema", schema);
    if (strict) json_object_set(js, "strict", strict);
    json_object_set_new(chat, "response_format",
                        json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

/* reasoning: effort into the chat parse's reasoning_effort (none: no
 * thinking); *summary set when a summary was asked for. */
static int translate_reasoning(json_t *o, json_t *chat, int *summary, zi_http_error *e) {
    json_t *r = zi_http_get(o, "reasoning");
    *summary = 0;
    if (!r) return 0;
    if (!json_is_object(r)) return zi_http_want(e, "reasoning", "an object", r);
    static const char *const efforts[] = {"none", "minimal", "low", "medium",
                                          "high", "xhigh",   NULL};
    if (get_word(r, "effort", "reasoning.effort", efforts,
                 "none, minimal, low, medium, high, xhigh", e))
        return -1;
    static const char *const sums[] = {"auto", "concise", "detailed", NULL};
    if (get_word(r, "summary", "reasoning.summary", sums, "auto, concise, detailed", e) ||
        get_word(r, "generate_summary", "reasoning.generate_summary", sums,
                 "auto, concise, detailed", e))
        return -1;
    *summary = zi_http_get(r, "summary") || zi_http_get(r, "generate_summary");
    json_t *eff = zi_http_get(r, "effort");
    if (!eff) return 0;
    /* Templates know low, medium and high (gpt-oss); none turns thinking
     * off, minimal and xhigh go to their nearest. */
    const char *w = json_string_value(eff);
    if (!strcmp(w, "none"))
        json_object_set_new(chat, "enable_thinking", json_false());
    else
        json_object_set_new(chat, "reasoning_effort",
                            json_string(!strcmp(w, "minimal") ? "low"
                                        : !strcmp(w, "xhigh") ? "high"
                                                              : w));
    return 0;
}

/* An error of the chat parse (which names chat's fields) in Responses'
 * names; the translation checked most first, so this is the rare rest. */
static void rename_error(zi_http_error *e) {
    static const char *const names[][2] = {
        {"max_completion_tokens", "max_output_tokens"},
        {"max_tokens", "max_output_tokens"},
        {"response_format.json_schema.schema", "text.format.schema"},
        {"response_format", "text.format"},
        {"tools.function.parameters", "tools.parameters"},
        {"tool_choice.function.name", "tool_choice.name"},
        {"messages", "input"},
        {"reasoning_effort", "reasoning.effort"},
        {"enable_thinking", "reasoning.effort"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t n = strlen(names[i][0]);
        if (strncmp(e->param, names[i][0], n)) continue;
        char param[sizeof e->param], msg[sizeof e->message];
        snprintf(param, sizeof param, "%s%s", names[i][1], e->param + n);
        const char *rest =
            !strncmp(e->message, e->param, strlen(e->param)) ? e->message + strlen(e->param) : NULL;
        if (rest) {
            snprintf(msg, sizeof msg, "%s%s", param, rest);
            snprintf(e->message, sizeof e->message, "%s", msg);
        }
        snprintf(e->param, sizeof e->param, "%s", param);
        return;
    }
}

/* The router's field names (field_map's right sides are chat's) in
 * Responses' names, and its structured-output fields. */
static void rename_field_map(zi_http_gen *g) {
    int j = 0;
    for (; g->field_map[j]; j += 2) {
        const char *v = g->field_map[j + 1];
        if (!strcmp(v, "max_tokens") || !strcmp(v, "max_completion_tokens"))
            g->field_map[j + 1] = "max_output_tokens";
        else if (!strcmp(v, "tools.function.parameters"))
            g->field_map[j + 1] = "tools.parameters";
        else if (!strcmp(v, "response_format"))
            g->field_map[j + 1] = "text.format";
    }
    /* a json_schema's errors; the map has room (40 slots, chat uses <20) */
    if (j + 5 < (int)(sizeof g->field_map / sizeof g->field_map[0])) {
        g->field_map[j++] = "response_format.json_schema.schema";
        g->field_map[j++] = "text.format.schema";
        g->field_map[j++] = "response_format";
        g->field_map[j++] = "text.format";
        g->field_map[j] = NULL;
    }
}

/* previous_response_id's conversation: its input items then its output
 * items, appended to items. 404 naming the field when it is not kept. */
static int previous_items(zi_http_ctx *ctx, const char *id, json_t *items, zi_http_error *e) {
    char *resp = NULL, *its = NULL;
    int rc = ctx->responses ? zi_response_store_get(ctx->responses, id, &resp, &its) : 1;
    if (rc < 0) return oom(e);
    if (rc)
        return zi_http_fail(e, 404, "not_found", "previous_response_id",
                            "previous_response_id: no stored response has id '%.80s' (it was "
                            "not stored with store: true, or was deleted or evicted)",
                            id);
    json_t *r = json_loads(resp, 0, NULL), *in = json_loads(its, 0, NULL);
    free(resp);
    free(its);
    if (!r || !in) {
        json_decref(r);
        json_decref(in);
        return oom(e);
    }
    json_array_extend(items, in);
    json_array_extend(items, json_object_get(r, "output"));
    json_decref(r);
    json_decref(in);
    return 0;
}

/* The request's settings echoed in every response object, as OpenAI
 * does (its defaults for what the request left out). */
static json_t *echo_of(json_t *o) {
    json_t *x = json_object(), *v;
    json_object_set(x, "instructions", (v = zi_http_get(o, "instructions")) ? v : json_null());
    json_object_set(x, "max_output_tokens",
                    (v = zi_http_get(o, "max_output_tokens")) ? v : json_null());
    json_object_set_new(x, "temperature",
                        (v = zi_http_get(o, "temperature")) ? json_incref(v) : json_real(1.0));
    json_object_set_new(x, "top_p",
                        (v = zi_http_get(o, "top_p")) ? json_incref(v) : json_real(1.0));
    json_object_set_new(x, "tools", (v = zi_http_get(o, "tools")) ? json_incref(v) : json_array());
    json_object_set_new(x, "tool_choice",
                        (v = zi_http_get(o, "tool_choice")) ? json_incref(v) : json_string("auto"));
    json_t *text = json_object(), *t = zi_http_get(o, "text");
    json_object_set_new(text, "format",
                        t && zi_http_get(t, "format") ? json_incref(zi_http_get(t, "format"))
                                                      : json_pack("{s:s}", "type", "text"));
    json_object_set_new(text, "verbosity",
                        t && zi_http_get(t, "verbosity") ? json_incref(zi_http_get(t, "verbosity"))
                                                         : json_string("medium"));
    json_object_set_new(x, "text", text);
    json_t *r = zi_http_get(o, "reasoning");
    json_object_set_new(
        x, "reasoning",
        json_pack("{s:O, s:O}", "effort",
                  r && zi_http_get(r, "effort") ? zi_http_get(r, "effort") : json_null(), "summary",
                  r && zi_http_get(r, "summary")            ? zi_http_get(r, "summary")
                  : r && zi_http_get(r, "generate_summary") ? zi_http_get(r, "generate_summary")
                                                            : json_null()));
    json_object_set(x, "previous_response_id",
                    (v = zi_http_get(o, "previous_response_id")) ? v : json_null());
    json_object_set_new(x, "store", json_boolean(json_is_true(zi_http_get(o, "store"))));
    json_object_set_new(x, "parallel_tool_calls",
                        json_boolean(!json_is_false(zi_http_get(o, "parallel_tool_calls"))));
    json_object_set_new(x, "metadata",
                        (v = zi_http_get(o, "metadata")) ? json_incref(v) : json_object());
    json_object_set(x, "user", (v = zi_http_get(o, "user")) ? v : json_null());
    json_object_set_new(x, "truncation", json_string("disabled"));
    json_object_set_new(x, "background", json_false());
    json_object_set_new(x, "max_tool_calls", json_null());
    json_object_set_new(x, "service_tier", json_string("default"));
    json_object_set_new(x, "top_logprobs", json_integer(0));
    return x;
}

static int parse_responses(zi_http_ctx *ctx, const char *body, size_t len, zi_http_gen *g,
                           zi_http_error *e) {
    memset(g, 0, sizeof *g);
    json_t *o = zi_http_parse_object(body, len, e);
    if (!o) return -1;
    json_t *chat = json_object(), *items = json_array(), *msgs = json_array(), *v;
    int summary = 0, rc = refuse_unserved(o, e);
    size_t own = 0;
    if (!rc && (v = zi_http_get(o, "previous_response_id")))
        rc = previous_items(ctx, json_string_value(v), items, e);
    own = json_array_size(items);
    json_t *in = zi_http_get(o, "input");
    if (!rc && !in) rc = zi_http_fail(e, 400, "missing", "input", "input is missing");
    if (!rc && json_is_string(in)) {
        json_array_append_new(
            items, json_pack("{s:s, s:s, s:O}", "type", "message", "role", "user", "content", in));
    } else if (!rc) {
        if (!json_is_array(in))
            rc = zi_http_want(e, "input", "a string or an array of input items", in);
        else if (!json_array_size(in))
            rc = zi_http_fail(e, 400, "invalid_value", "input", "input is empty");
        else
            json_array_extend(items, in);
    }
    if (!rc && (v = zi_http_get(o, "instructions")))
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", v));
    zi_http_images im;
    zi_http_images_init(&im, &ctx->cfg.images);
    if (!rc) rc = items_to_messages(items, own, msgs, &im, e);
    if (!rc && !json_array_size(msgs))
        rc = zi_http_fail(e, 400, "invalid_value", "input",
                          "input: no message to answer (only reasoning items)");
    if (!rc) rc = translate_tools(o, chat, e);
    if (!rc) rc = translate_tool_choice(o, chat, e);
    if (!rc) rc = translate_text(o, chat, e);
    if (!rc) rc = translate_reasoning(o, chat, &summary, e);
    if (!rc) {
        json_object_set(chat, "messages", msgs);
        /* grammar, timeout_ms, ignore_eos, keep_alive: zinfer's extensions,
         * as on chat completions (docs/http.md) */
        static const char *const same[] = {"model",      "temperature", "top_p",
                                           "stream",     "grammar",     "timeout_ms",
                                           "ignore_eos", "keep_alive",  NULL};
        for (int i = 0; same[i]; i++)
            if ((v = zi_http_get(o, same[i]))) json_object_set(chat, same[i], v);
        if ((v = zi_http_get(o, "max_output_tokens"))) json_object_set(chat, "max_tokens", v);
        rc = zi_http_parse_generate_json(chat, ZI_HTTP_CHAT, &im, g, e);
        if (rc) rename_error(e);
    }
    zi_http_images_free(&im); /* the requests hold their copies */
    if (!rc) {
        rename_field_map(g);
        /* Responses always has the reasoning apart: its own output item. */
        g->reasoning.format = ZI_REASONING_SEPARATE;
        g->reasoning.format_given = 1; /* whatever --reasoning-format says */
        /* The conversation's input items (the earlier turns' first), for
         * the store. */
        g->api_req = json_pack("{s:o, s:O, s:b, s:b}", "echo", echo_of(o), "items", items, "store",
                               json_is_true(zi_http_get(o, "store")), "summary", summary);
        if (!g->api_req) rc = oom(e);
    }
    if (rc) zi_http_gen_free(g);
    json_decref(chat);
    json_decref(items);
    json_decref(msgs);
    json_decref(o);
    return rc;
}

/* ---- rendering ---------------------------------------------------------- */

typedef enum item_kind { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL } item_kind;

/* A response being rendered: the output items so far and the open one. */
typedef struct rs_state {
    zi_chat_stream *cs;
    json_t *output; /* the output items */
    item_kind open; /* the kind of the last item, while it is open */
    int call_index; /* chat_stream's index of the open call */
    char *buf;      /* the open item's text (reasoning, text or arguments) */
    size_t len, cap;
    long long seq; /* the next event's sequence_number */
    int summary;   /* reasoning.summary asked for */
    /* Where events go: NULL while rendering a whole response. */
    char **out;
    size_t *out_len, *out_cap;
    int bad; /* out of memory */
} rs_state;

static void state_free(void *p) {
    rs_state *st = p;
    if (!st) return;
    if (st->cs) zi_chat_stream_free(st->cs);
    json_decref(st->output);
    free(st->buf);
    free(st);
}

/* An id: prefix and 24 random hex digits. */
static void new_id(char *out, size_t cap, const char *prefix) {
    unsigned char rnd[12] = {0};
    if (getrandom(rnd, sizeof rnd, 0) != sizeof rnd) {
        /* no randomness: the clock keeps ids apart well enough */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        memcpy(rnd, &ts.tv_nsec, sizeof ts.tv_nsec < sizeof rnd ? sizeof ts.tv_nsec : sizeof rnd);
    }
    int k = snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof rnd && k + 2 < (int)cap; i++)
        k += snprintf(out + k, cap - (size_t)k, "%02x", rnd[i]);
}

/* The state of r, made at its first use: the response's id in r->id. */
static rs_state *state_of(zi_http_result *r) {
    if (r->api_state) return r->api_state;
    rs_state *st = calloc(1, sizeof *st);
    if (!st) return NULL;
    st->cs = zi_chat_stream_new(r->g);
    st->output = json_array();
    if (!st->cs || !st->output) {
        state_free(st);
        return NULL;
    }
    st->summary = json_is_true(json_object_get(r->g->api_req, "summary"));
    new_id(r->id, sizeof r->id, "resp_");
    r->api_state = st;
    r->api_state_free = state_free;
    return st;
}

/* Sends one event (its type and sequence_number added), when streaming;
 * drops ev. */
static void emit(rs_state *st, const char *type, json_t *ev) {
    if (!ev) {
        st->bad = 1;
        return;
    }
    if (st->out) {
        json_object_set_new(ev, "type", json_string(type));
        json_object_set_new(ev, "sequence_number", json_integer(st->seq++));
        char *s = json_dumps(ev, JSON_COMPACT);
        if (!s || zi_http_buf_add(st->out, st->out_len, st->out_cap, "event: ", 7) ||
            zi_http_buf_add(st->out, st->out_len, st->out_cap, type, strlen(type)) ||
            zi_http_buf_add(st->out, st->out_len, st->out_cap, "\ndata: ", 7) ||
            zi_http_buf_add(st->out, st->out_len, st->out_cap, s, strlen(s)) ||
            zi_http_buf_add(st->out, st->out_len, st->out_cap, "\n\n", 2))
            st->bad = 1;
        free(s);
    }
    json_decref(ev);
}

static json_t *last_item(rs_state *st) {
    return json_array_get(st->output, json_array_size(st->output) - 1);
}

static const char *item_id(rs_state *st) {
    return json_string_value(json_object_get(last_item(st), "id"));
}

static int out_index(rs_state *st) {
    return (int)json_array_size(st->output) - 1;
}

/* Opens a new output item of kind k (item: its fields at the start). */
static void open_item(rs_state *st, item_kind k, json_t *item) {
    json_array_append_new(st->output, item);
    st->open = k;
    st->len = 0;
    emit(st, "response.output_item.added",
         json_pack("{s:i, s:O}", "output_index", out_index(st), "item", item));
    if (k == ITEM_REASONING)
        emit(st, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", item_id(st), "output_index",
                       out_index(st), "content_index", 0, "part", "type", "reasoning_text", "text",
                       ""));
    else if (k == ITEM_MESSAGE)
        emit(st, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", item_id(st),
                       "output_index", out_index(st), "content_index", 0, "part", "type",
                       "output_text", "text", "", "annotations", "logprobs"));
}

/* Closes the open item: its whole text in the item and the done events.
 * status: "completed", or "incomplete" when the output was cut short. */
static void close_item(rs_state *st, const char *status) {
    if (st->open == ITEM_NONE) return;
    json_t *item = last_item(st), *text = zi_http_jstr(st->buf, st->len);
    const char *id = item_id(st);
    int oi = out_index(st);
    if (!text) {
        st->bad = 1;
        return;
    }
    if (st->open == ITEM_REASONING) {
        emit(st, "response.reasoning_text.done",
             json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index",
                       0, "text", text));
        json_t *part = json_pack("{s:s, s:O}", "type", "reasoning_text", "text", text);
        emit(st, "response.content_part.done",
             json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index",
                       0, "part", part));
        json_object_set_new(item, "content", json_pack("[o]", part));
        if (st->summary) {
            /* No summarizer: the summary is the reasoning itself. */
            json_t *sp = json_pack("{s:s, s:O}", "type", "summary_text", "text", text);
            emit(st, "response.reasoning_summary_part.added",
                 json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", id, "output_index", oi,
                           "summary_index", 0, "part", "type", "summary_text", "text", ""));
            emit(st, "response.reasoning_summary_text.delta",
                 json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi,
                           "summary_index", 0, "delta", text));
            emit(st, "response.reasoning_summary_text.done",
                 json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi,
                           "summary_index", 0, "text", text));
            emit(st, "response.reasoning_summary_part.done",
                 json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi,
                           "summary_index", 0, "part", sp));
            json_object_set_new(item, "summary", json_pack("[o]", sp));
        }
    } else if (st->open == ITEM_MESSAGE) {
        emit(st, "response.output_text.done",
             json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", id, "output_index", oi,
                       "content_index", 0, "text", text, "logprobs"));
        json_t *part = json_pack("{s:s, s:O, s:[], s:[]}", "type", "output_text", "text", text,
                                 "annotations", "logprobs");
        emit(st, "response.content_part.done",
             json_pack("{s:s, s:i, s:i, s:O}", "item_id", id, "output_index", oi, "content_index",
                       0, "part", part));
        json_object_set_new(item, "content", json_pack("[o]", part));
    } else {
        emit(st, "response.function_call_arguments.done",
             json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", oi, "arguments", text));
        json_object_set(item, "arguments", text);
    }
    json_decref(text);
    json_object_set_new(item, "status", json_string(status));
    emit(st, "response.output_item.done",
         json_pack("{s:i, s:O}", "output_index", oi, "item", item));
    st->open = ITEM_NONE;
}

/* chat_stream's events as output items and their events. */
static int on_event(void *arg, const zi_ts_event *ev) {
    rs_state *st = arg;
    char id[48];
    if (!ev->len && ev->kind != ZI_TS_CALL) return 0;
    switch (ev->kind) {
    case ZI_TS_REASONING:
        if (st->open != ITEM_REASONING) {
            close_item(st, "completed");
            new_id(id, sizeof id, "rs_");
            open_item(st, ITEM_REASONING,
                      json_pack("{s:s, s:s, s:[], s:[], s:s}", "id", id, "type", "reasoning",
                                "summary", "content", "status", "in_progress"));
        }
        emit(st, "response.reasoning_text.delta",
             json_pack("{s:s, s:i, s:i, s:o}", "item_id", item_id(st), "output_index",
                       out_index(st), "content_index", 0, "delta",
                       zi_http_jstr(ev->text, ev->len)));
        break;
    case ZI_TS_CONTENT:
        if (st->open != ITEM_MESSAGE) {
            close_item(st, "completed");
            new_id(id, sizeof id, "msg_");
            open_item(st, ITEM_MESSAGE,
                      json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", id, "type", "message", "role",
                                "assistant", "status", "in_progress", "content"));
        }
        emit(st, "response.output_text.delta",
             json_pack("{s:s, s:i, s:i, s:o, s:[]}", "item_id", item_id(st), "output_index",
                       out_index(st), "content_index", 0, "delta", zi_http_jstr(ev->text, ev->len),
                       "logprobs"));
        break;
    case ZI_TS_CALL:
        close_item(st, "completed");
        new_id(id, sizeof id, "fc_");
        open_item(st, ITEM_CALL,
                  json_pack("{s:s, s:s, s:s, s:o, s:s, s:s}", "id", id, "type", "function_call",
                            "call_id", ev->id, "name", zi_http_jstr(ev->text, ev->len), "arguments",
                            "", "status", "in_progress"));
        st->call_index = ev->index;
        return st->bad ? -1 : 0;
    case ZI_TS_ARGS:
        if (st->open != ITEM_CALL || st->call_index != ev->index) return 0;
        emit(st, "response.function_call_arguments.delta",
             json_pack("{s:s, s:i, s:o}", "item_id", item_id(st), "output_index", out_index(st),
                       "delta", zi_http_jstr(ev->text, ev->len)));
        break;
    }
    if (zi_http_buf_add(&st->buf, &st->len, &st->cap, ev->text, ev->len)) st->bad = 1;
    return st->bad ? -1 : 0;
}

/* The response object: status "in_progress" (no usage yet), "completed",
 * "incomplete" or "failed" (error set). */
static json_t *response_json(zi_http_result *r, rs_state *st, const char *status,
                             const zi_http_error *err) {
    json_t *echo = json_object_get(r->g->api_req, "echo");
    json_t *o =
        json_pack("{s:s, s:s, s:I, s:s, s:s}", "id", r->id, "object", "response", "created_at",
                  (json_int_t)r->created, "status", status, "model", r->model);
    if (!o) return NULL;
    json_object_update(o, echo);
    json_object_set_new(o, "output", json_deep_copy(st->output));
    json_object_set_new(o, "incomplete_details",
                        !strcmp(status, "incomplete")
                            ? json_pack("{s:s}", "reason", "max_output_tokens")
                            : json_null());
    json_object_set_new(o, "error",
                        err ? json_pack("{s:s, s:o}", "code",
                                        err->status == 429 ? "rate_limit_exceeded" : "server_error",
                                        "message", zi_http_jstr(err->message, strlen(err->message)))
                            : json_null());
    if (!strcmp(status, "in_progress")) {
        json_object_set_new(o, "usage", json_null());
        return o;
    }
    long long pt = r->ch[0].prompt_tokens, ct = r->ch[0].completion_tokens;
    json_object_set_new(o, "completed_at", json_integer((json_int_t)time(NULL)));
    json_object_set_new(o, "usage",
                        json_pack("{s:I, s:{s:i}, s:I, s:{s:i}, s:I}", "input_tokens",
                                  (json_int_t)pt, "input_tokens_details", "cached_tokens", 0,
                                  "output_tokens", (json_int_t)ct, "output_tokens_details",
                                  "reasoning_tokens", 0, "total_tokens", (json_int_t)(pt + ct)));
    return o;
}

/* Keeps a finished response when the request said store: true. */
static void store_response(zi_http_result *r, json_t *resp) {
    if (!r->ctx || !r->ctx->responses || !json_is_true(json_object_get(r->g->api_req, "store")))
        return;
    char *rs = json_dumps(resp, JSON_COMPACT);
    char *is = json_dumps(json_object_get(r->g->api_req, "items"), JSON_COMPACT);
    if (rs && is) zi_response_store_put(r->ctx->responses, r->id, rs, is);
    free(rs);
    free(is);
}

/* The end of the output: the last item closed, the final status. */
static const char *finish(zi_http_result *r, rs_state *st) {
    int cut = !strcmp(r->ch[0].status, "maximum_length");
    if (zi_chat_stream_finish(st->cs, on_event, st)) st->bad = 1;
    close_item(st, cut ? "incomplete" : "completed");
    return cut ? "incomplete" : "completed";
}

static json_t *full_responses(zi_http_result *r, zi_http_conn *c, zi_http_error *e) {
    (void)c;
    rs_state *st = state_of(r);
    if (!st) return oom(e), NULL;
    zi_http_choice *ch = &r->ch[0];
    if (zi_chat_stream_feed(st->cs, ch->text ? ch->text : "", ch->len, on_event, st)) st->bad = 1;
    const char *status = finish(r, st);
    json_t *o = st->bad ? NULL : response_json(r, st, status, NULL);
    if (!o) return oom(e), NULL;
    store_response(r, o);
    return o;
}

static int delta_responses(zi_http_result *r, const zi_http_delta *d, zi_http_conn *c, char **out,
                           size_t *len, size_t *cap, zi_http_error *e) {
    (void)c;
    rs_state *st = state_of(r);
    if (!st) return oom(e);
    st->out = out, st->out_len = len, st->out_cap = cap;
    if (d->first) {
        emit(st, "response.created",
             json_pack("{s:o}", "response", response_json(r, st, "in_progress", NULL)));
        emit(st, "response.in_progress",
             json_pack("{s:o}", "response", response_json(r, st, "in_progress", NULL)));
    }
    zi_http_choice *ch = &r->ch[d->index];
    if (ch->len > d->text_from &&
        zi_chat_stream_feed(st->cs, ch->text + d->text_from, ch->len - d->text_from, on_event, st))
        st->bad = 1;
    if (d->final) {
        const char *status = finish(r, st);
        json_t *o = response_json(r, st, status, NULL);
        if (o) store_response(r, o);
        emit(st, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed",
             o ? json_pack("{s:o}", "response", o) : NULL);
    }
    st->out = NULL;
    return st->bad ? oom(e) : 0;
}

/* Responses' stream has no closing sentinel: it ends with the connection. */
static int end_responses(zi_http_result *r, char **out, size_t *len, size_t *cap) {
    (void)r, (void)out, (void)len, (void)cap;
    return 0;
}

/* An error inside the stream: an `error` event, then response.failed. */
static int stream_error_responses(zi_http_result *r, const zi_http_error *e, char **out,
                                  size_t *len, size_t *cap) {
    rs_state *st = state_of(r);
    if (!st) return -1;
    st->out = out, st->out_len = len, st->out_cap = cap;
    /* (the message may quote the client's bytes: cleaned to UTF-8) */
    json_t *ev = json_pack("{s:s, s:o}", "code", e->code[0] ? e->code : "server_error", "message",
                           zi_http_jstr(e->message, strlen(e->message)));
    if (ev)
        json_object_set_new(ev, "param",
                            e->param[0] ? zi_http_jstr(e->param, strlen(e->param)) : json_null());
    emit(st, "error", ev);
    close_item(st, "incomplete");
    emit(st, "response.failed", json_pack("{s:o}", "response", response_json(r, st, "failed", e)));
    st->out = NULL;
    return st->bad ? -1 : 0;
}

const zi_http_api zi_http_api_responses = {
    .name = "responses",
    .parse = parse_responses,
    .full = full_responses,
    .delta = delta_responses,
    .end = end_responses,
    .stream_error = stream_error_responses,
    .error_json = zi_http_error_json,
};

/* ---- GET and DELETE ------------------------------------------------------ */

json_t *zi_http_responses_stored(zi_http_ctx *ctx, const char *id, int del, zi_http_error *e) {
    char *resp = NULL;
    int rc = !ctx->responses ? 1
             : del           ? zi_response_store_delete(ctx->responses, id)
                             : zi_response_store_get(ctx->responses, id, &resp, NULL);
    if (rc < 0) return oom(e), NULL;
    if (rc) {
        zi_http_fail(e, 404, "not_found", "response_id",
                     "response_id: no stored response has id '%.80s' (it was not stored with "
                     "store: true, or was deleted or evicted)",
                     id);
        return NULL;
    }
    if (del)
        return json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1);
    json_t *o = json_loads(resp, 0, NULL);
    free(resp);
    if (!o) oom(e);
    return o;
}
