/*
 * chat_template_cmd.c - `zinfer chat-template`: one template, JSON requests
 * in, renderings out (see chat_template_cmd.h and USAGE below).
 *
 * Glue only: JSON (jansson, which keeps object keys in their order) ->
 * zi_chat_value trees -> zi_chat_template_render. Objects become dicts in
 * the order their keys were written, as Python's json.loads gives them to
 * jinja2, so tojson and items() agree with the reference.
 */
#include "chat_template_cmd.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "chat_template_source.h"
#include "zi_error.h"

static const char USAGE[] =
    "usage: zinfer chat-template --chat-template FILE|NAME [--jsonl] < request.json\n"
    "       zinfer chat-template --chat-template FILE|NAME --print-template\n"
    "\n"
    "Renders a Jinja chat template with the request on stdin, a JSON object:\n"
    "  messages               list of message objects (role, content, tool_calls,\n"
    "                         tool_call_id, ... passed to the template as they are)\n"
    "  tools                  list (the template's `tools`; undefined when absent)\n"
    "  add_generation_prompt  bool (default false)\n"
    "  bos_token, eos_token   strings (undefined when absent)\n"
    "  variables              object: more template variables (enable_thinking, ...)\n"
    "  now                    seconds since the epoch for strftime_now (UTC);\n"
    "                         absent: the current local time\n"
    "The rendering is written to stdout as it is (no newline added).\n"
    "\n"
    "  --chat-template FILE|NAME  the template: a built-in NAME (%s)\n"
    "                   or a FILE (at most 4 MiB); --template is the same option\n"
    "  --print-template  write the template's source to stdout and exit\n"
    "  --jsonl   one request per stdin line; one stdout line per request:\n"
    "            {\"prompt\": TEXT} or {\"error\": KIND, \"message\": TEXT}\n"
    "\n"
    "Exit status: 0 rendered, 1 render failed, unreadable input, or no such template\n"
    "or file, 2 bad usage, 3 the template is refused at load (its line and column\n"
    "are in the message).\n";

/* ---- JSON -> zi_chat_value -------------------------------------------- */

/* Trees are malloc'd; free_value releases one. */
static void free_value(zi_chat_value *v) {
    if (v->kind == ZI_CHAT_LIST) {
        for (size_t i = 0; i < v->u.list.n; i++) free_value((zi_chat_value *)&v->u.list.v[i]);
        free((void *)v->u.list.v);
    } else if (v->kind == ZI_CHAT_DICT) {
        for (size_t i = 0; i < v->u.dict.n; i++) free_value((zi_chat_value *)&v->u.dict.v[i].value);
        free((void *)v->u.dict.v);
    }
}

/* depth is bounded by jansson's parser (2048); the renderer refuses trees
 * deeper than ZI_CHAT_VALUE_MAX_DEPTH. */
static int from_json(const json_t *j, zi_chat_value *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    switch (json_typeof(j)) {
    case JSON_NULL:
        out->kind = ZI_CHAT_NONE;
        return ZI_OK;
    case JSON_TRUE:
    case JSON_FALSE:
        out->kind = ZI_CHAT_BOOL;
        out->u.b = json_is_true(j);
        return ZI_OK;
    case JSON_INTEGER:
        out->kind = ZI_CHAT_INT;
        out->u.i = json_integer_value(j);
        return ZI_OK;
    case JSON_REAL:
        out->kind = ZI_CHAT_FLOAT;
        out->u.f = json_real_value(j);
        return ZI_OK;
    case JSON_STRING:
        out->kind = ZI_CHAT_STR;
        out->u.s.p = json_string_value(j);
        out->u.s.len = json_string_length(j);
        return ZI_OK;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        zi_chat_value *v = calloc(n ? n : 1, sizeof *v);
        if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        out->kind = ZI_CHAT_LIST;
        out->u.list.v = v;
        for (size_t i = 0; i < n; i++) {
            out->u.list.n = i + 1;
            int rc = from_json(json_array_get(j, i), &v[i], err);
            if (rc) return rc;
        }
        return ZI_OK;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(j);
        zi_chat_pair *v = calloc(n ? n : 1, sizeof *v);
        if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        out->kind = ZI_CHAT_DICT;
        out->u.dict.v = v;
        const char *key;
        json_t *val;
        size_t i = 0;
        json_object_foreach((json_t *)j, key, val) {
            if (i == n) break;
            v[i].key = key;
            v[i].key_len = strlen(key);
            out->u.dict.n = ++i;
            int rc = from_json(val, &v[i - 1].value, err);
            if (rc) return rc;
        }
        return ZI_OK;
    }
    }
    return zi_error_set(err, ZI_EINVAL, "unknown JSON value");
}

/* ---- one request -------------------------------------------------------- */

/* Renders request j with t: 0 with *out set (free it), or an error code
 * with err set. */
static int render_request(const zi_chat_template *t, const json_t *j, char **out, size_t *out_len,
                          zi_error *err) {
    *out = NULL;
    if (!json_is_object(j)) return zi_error_set(err, ZI_EINVAL, "the request is not a JSON object");
    const json_t *msgs = json_object_get(j, "messages");
    const json_t *tools = json_object_get(j, "tools");
    const json_t *agp = json_object_get(j, "add_generation_prompt");
    const json_t *bos = json_object_get(j, "bos_token");
    const json_t *eos = json_object_get(j, "eos_token");
    const json_t *vars = json_object_get(j, "variables");
    const json_t *now = json_object_get(j, "now");
    if (!json_is_array(msgs)) return zi_error_set(err, ZI_EINVAL, "messages: not a list");
    if (tools && !json_is_array(tools) && !json_is_null(tools))
        return zi_error_set(err, ZI_EINVAL, "tools: not a list");
    if (agp && !json_is_boolean(agp))
        return zi_error_set(err, ZI_EINVAL, "add_generation_prompt: not a bool");
    if ((bos && !json_is_string(bos)) || (eos && !json_is_string(eos)))
        return zi_error_set(err, ZI_EINVAL, "bos_token / eos_token: not a string");
    if (vars && !json_is_object(vars))
        return zi_error_set(err, ZI_EINVAL, "variables: not an object");
    if (now && !json_is_integer(now)) return zi_error_set(err, ZI_EINVAL, "now: not an integer");

    size_t n_vars = (vars ? json_object_size(vars) : 0) + (tools && !json_is_null(tools));
    zi_chat_var *v = calloc(n_vars + 1, sizeof *v);
    zi_chat_value mv;
    memset(&mv, 0, sizeof mv);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    size_t k = 0;
    int rc = from_json(msgs, &mv, err);
    if (!rc && tools && !json_is_null(tools)) {
        v[k].name = "tools";
        v[k].name_len = 5;
        rc = from_json(tools, &v[k++].value, err);
    }
    const char *key;
    json_t *val;
    if (vars) json_object_foreach((json_t *)vars, key, val) {
            if (rc || k == n_vars) break;
            v[k].name = key;
            v[k].name_len = strlen(key);
            rc = from_json(val, &v[k++].value, err);
        }
    if (!rc) {
        zi_chat_render_opts o = {
            .add_generation_prompt = agp && json_is_true(agp),
            .bos_token = bos ? json_string_value(bos) : NULL,
            .eos_token = eos ? json_string_value(eos) : NULL,
            .vars = v,
            .n_vars = k,
            .messages = &mv,
            .now = now ? (int64_t)json_integer_value(now) : 0,
        };
        rc = zi_chat_template_render(t, NULL, 0, &o, out, out_len, err);
    }
    for (size_t i = 0; i < k; i++) free_value(&v[i].value);
    free(v);
    free_value(&mv);
    return rc;
}

static void print_jsonl(json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        free(s);
    }
    json_decref(j);
    fflush(stdout);
}

static const char *error_kind(int code) {
    switch (code) {
    case ZI_EUNSUPPORTED:
        return "unsupported";
    case ZI_ERANGE:
        return "limit";
    case ZI_ENOMEM:
        return "memory";
    default:
        return "error";
    }
}

int zi_chat_template_main(int argc, char **argv) {
    const char *path = NULL;
    int jsonl = 0, print = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            char names[128];
            printf(USAGE, zi_chat_template_name_list(names, sizeof names));
            return 0;
        } else if ((!strcmp(argv[i], "--template") || !strcmp(argv[i], "--chat-template")) &&
                   i + 1 < argc) {
            path = argv[++i];
        } else if (!strcmp(argv[i], "--jsonl")) {
            jsonl = 1;
        } else if (!strcmp(argv[i], "--print-template")) {
            print = 1;
        } else {
            fprintf(stderr,
                    "zinfer chat-template: unknown or incomplete option '%s' "
                    "(see zinfer chat-template --help)\n",
                    argv[i]);
            return 2;
        }
    }
    if (!path) {
        fputs("zinfer chat-template: --chat-template FILE|NAME is required "
              "(see zinfer chat-template --help)\n",
              stderr);
        return 2;
    }
    /* --template is the older spelling: the same lookup (a built-in name,
     * else a file). */
    zi_error err = {0};
    char *src = NULL;
    size_t len = 0;
    if (zi_chat_template_load(path, &src, &len, &err)) {
        fprintf(stderr, "zinfer: chat-template: %s\n", err.msg);
        return 1;
    }
    if (print) {
        fwrite(src, 1, len, stdout);
        free(src);
        return 0;
    }
    zi_chat_template *t = NULL;
    if (zi_chat_template_compile(src, len, &t, &err)) {
        free(src);
        fprintf(stderr, "zinfer: chat-template: %s: %s\n", path, err.msg);
        return 3;
    }
    free(src);
    int status = 0;
    json_error_t jerr;
    if (jsonl) {
        char *line = NULL;
        size_t lcap = 0;
        ssize_t n;
        while ((n = getline(&line, &lcap, stdin)) > 0) {
            json_t *req = json_loadb(line, (size_t)n, JSON_DECODE_ANY, &jerr);
            char *out = NULL;
            size_t out_len = 0;
            zi_error_clear(&err);
            int rc = req ? render_request(t, req, &out, &out_len, &err)
                         : zi_error_set(&err, ZI_EINVAL, "bad JSON: %s", jerr.text);
            json_t *res = json_object();
            if (rc) {
                json_object_set_new(res, "error", json_string(error_kind(rc)));
                json_object_set_new(res, "message", json_string(err.msg));
            } else {
                json_object_set_new(res, "prompt", json_stringn(out, out_len));
            }
            print_jsonl(res);
            free(out);
            json_decref(req);
        }
        free(line);
    } else {
        json_t *req = json_loadf(stdin, JSON_DECODE_ANY, &jerr);
        char *out = NULL;
        size_t out_len = 0;
        int rc = req ? render_request(t, req, &out, &out_len, &err)
                     : zi_error_set(&err, ZI_EINVAL, "bad JSON request: %s", jerr.text);
        if (rc) {
            fprintf(stderr, "zinfer: chat-template: %s\n", err.msg);
            status = 1;
        } else {
            fwrite(out, 1, out_len, stdout);
        }
        free(out);
        json_decref(req);
    }
    zi_chat_template_free(t);
    return status;
}
