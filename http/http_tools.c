/*
 * http_tools.c - tool calls: request side and output parsing
 * (http_tools.h).
 */
#include "http_tools.h"

#include "tool_stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(zi_http_error *e, const char *field, const char *why) {
    return zi_http_fail(e, 400, "invalid_value", field, "%s: %s", field, why);
}

void zi_http_tools_free(zi_http_tools *t) {
    json_decref(t->tools);
    json_decref(t->names);
    memset(t, 0, sizeof *t);
}

int zi_http_tools_parse(json_t *root, zi_http_tools *t, zi_http_error *e) {
    memset(t, 0, sizeof *t);
    json_t *tools = json_object_get(root, "tools");
    json_t *choice = json_object_get(root, "tool_choice");
    if (tools && json_is_null(tools)) tools = NULL;
    if (choice && json_is_null(choice)) choice = NULL;
    if (tools && !json_is_array(tools)) return bad(e, "tools", "expected an array of tools");
    if (!tools || !json_array_size(tools)) {
        if (choice && !(json_is_string(choice) && (!strcmp(json_string_value(choice), "none") ||
                                                   !strcmp(json_string_value(choice), "auto"))))
            return bad(e, "tool_choice", "needs tools");
        return 0;
    }
    t->tools = json_array();
    t->names = json_array();
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        char f[64];
        snprintf(f, sizeof f, "tools[%zu]", i);
        json_t *type = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
        if (!json_is_object(tool) || !json_is_string(type) ||
            strcmp(json_string_value(type), "function") || !json_is_object(fn)) {
            zi_http_tools_free(t);
            return bad(e, f, "expected {\"type\": \"function\", \"function\": {...}}");
        }
        json_t *name = json_object_get(fn, "name"), *desc = json_object_get(fn, "description"),
               *params = json_object_get(fn, "parameters");
        snprintf(f, sizeof f, "tools[%zu].function", i);
        if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 128 ||
            (desc && !json_is_null(desc) && !json_is_string(desc)) ||
            (params && !json_is_null(params) && !json_is_object(params))) {
            zi_http_tools_free(t);
            return bad(e, f,
                       "needs a name (1..128 bytes), and a string description and an "
                       "object of parameters when given");
        }
        /* Only the keys the router takes ("strict" and others dropped). */
        json_t *nf = json_object();
        json_object_set(nf, "name", name);
        if (json_is_string(desc)) json_object_set(nf, "description", desc);
        if (json_is_object(params)) json_object_set(nf, "parameters", params);
        json_t *nt = json_object();
        json_object_set_new(nt, "type", json_string("function"));
        json_object_set_new(nt, "function", nf);
        json_array_append_new(t->tools, nt);
        json_array_append(t->names, name);
    }
    t->choice = ZI_TOOLS_AUTO;
    if (!choice) return 0;
    if (json_is_string(choice)) {
        const char *c = json_string_value(choice);
        if (!strcmp(c, "none"))
            t->choice = ZI_TOOLS_OFF;
        else if (!strcmp(c, "required"))
            t->choice = ZI_TOOLS_REQUIRED;
        else if (strcmp(c, "auto")) {
            zi_http_tools_free(t);
            return bad(e, "tool_choice", "expected none, auto, required or a named function");
        }
        return 0;
    }
    json_t *fn = json_object_get(choice, "function");
    json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
    if (!json_is_string(name)) {
        zi_http_tools_free(t);
        return bad(e, "tool_choice",
                   "expected none, auto, required or {\"type\": \"function\", "
                   "\"function\": {\"name\": ...}}");
    }
    json_t *x;
    int found = 0;
    json_array_foreach(t->names, i, x) found |= json_equal(x, name);
    if (!found) {
        zi_http_tools_free(t);
        return zi_http_fail(e, 400, "invalid_value", "tool_choice",
                            "tool_choice: '%s' is not one of the tools", json_string_value(name));
    }
    t->choice = ZI_TOOLS_NAMED;
    snprintf(t->named, sizeof t->named, "%s", json_string_value(name));
    return 0;
}

json_t *zi_http_tools_response_format(const zi_http_tools *t) {
    if (t->choice != ZI_TOOLS_REQUIRED && t->choice != ZI_TOOLS_NAMED) return NULL;
    json_t *props = json_object(), *args = NULL;
    const char *one = t->choice == ZI_TOOLS_NAMED ? t->named
                      : json_array_size(t->names) == 1
                          ? json_string_value(json_array_get(t->names, 0))
                          : NULL; /* required, and only one tool to call */
    if (one) {
        json_object_set_new(props, "name", json_pack("{s:s}", "const", one));
        size_t i;
        json_t *tool;
        json_array_foreach(t->tools, i, tool) {
            json_t *fn = json_object_get(tool, "function");
            if (!strcmp(json_string_value(json_object_get(fn, "name")), one))
                args = json_deep_copy(json_object_get(fn, "parameters"));
        }
    } else {
        json_object_set_new(props, "name", json_pack("{s:O}", "enum", t->names));
    }
    /* Several tools' parameters cannot be told apart without anyOf (which
     * the constraint does not take): any object then. */
    json_object_set_new(props, "arguments", args ? args : json_pack("{s:s}", "type", "object"));
    json_t *schema = json_pack("{s:s, s:o, s:[s,s]}", "type", "object", "properties", props,
                               "required", "name", "arguments");
    return json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema", "name",
                     "tool_call", "schema", schema);
}

int zi_http_tools_message(json_t *msg, size_t i, json_t *nm, zi_http_error *e) {
    const char *role = json_string_value(json_object_get(msg, "role"));
    char fld[96];
    if (role && !strcmp(role, "tool")) {
        static const char *const keys[] = {"tool_call_id", "name"};
        for (int k = 0; k < 2; k++) {
            json_t *v = json_object_get(msg, keys[k]);
            if (!v || json_is_null(v)) continue;
            snprintf(fld, sizeof fld, "messages[%zu].%s", i, keys[k]);
            if (!json_is_string(v)) return bad(e, fld, "expected a string");
            json_object_set(nm, keys[k], v);
        }
        return 0;
    }
    json_t *calls = json_object_get(msg, "tool_calls"), *c, *out = json_array();
    size_t j;
    json_array_foreach(calls, j, c) {
        json_t *fn = json_object_get(c, "function"), *id = json_object_get(c, "id");
        json_t *name = json_is_object(fn) ? json_object_get(fn, "name") : NULL;
        json_t *args = json_is_object(fn) ? json_object_get(fn, "arguments") : NULL;
        json_t *parsed = json_is_string(args)
                             ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL)
                             : NULL;
        if (!json_is_string(name) || !json_string_length(name) || !parsed ||
            (id && !json_is_null(id) && !json_is_string(id))) {
            json_decref(parsed);
            json_decref(out);
            snprintf(fld, sizeof fld, "messages[%zu].tool_calls[%zu]", i, j);
            return bad(e, fld,
                       "expected {\"id\"?: str, \"function\": {\"name\": str, \"arguments\": a "
                       "JSON text}}");
        }
        /* Object arguments go as a map, which is what chat templates read
         * (arguments.city, arguments | tojson); any other JSON as its text. */
        json_t *call = json_pack("{s:s, s:{s:O, s:O}}", "type", "function", "function", "name",
                                 name, "arguments", json_is_object(parsed) ? parsed : args);
        if (json_is_string(id)) json_object_set(call, "id", id);
        json_decref(parsed);
        json_array_append_new(out, call);
    }
    json_object_set_new(nm, "tool_calls", out);
    return 0;
}

/* ---- parsing the model's calls ------------------------------------------ */

json_t *zi_http_tools_extract(const zi_http_tools *t, const char *text, size_t len,
                              char **content) {
    *content = NULL;
    if (t->choice == ZI_TOOLS_OFF || !t->names) return NULL;
    json_t *calls = NULL;
    /* Out of memory reads as no calls: the text is then sent as it is. */
    if (zi_tool_stream_parse_all(t->names, zi_http_tools_format(t), t->tools, text, len, &calls,
                                 content))
        return NULL;
    return calls;
}

zi_tool_format zi_http_tools_format(const zi_http_tools *t) {
    if (t->choice == ZI_TOOLS_REQUIRED || t->choice == ZI_TOOLS_NAMED) return ZI_TF_GENERIC;
    return t->format;
}
