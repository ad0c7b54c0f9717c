/*
 * chat_tools.c - the probe for templates that render tool messages, and
 * the Hermes text of tool messages for those that do not (chat_tools.h).
 */
#include "chat_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#define S(lit)                                                                                     \
    {                                                                                              \
        .kind = ZI_CHAT_STR, .u.s = { lit, sizeof lit - 1 }                                        \
    }
#define K(lit) lit, sizeof lit - 1

/* Markers no template writes by itself. */
static const char ARG_MARK[] = "zi_probe_value_7f3a", RESULT_MARK[] = "zi_probe_result_7f3a";

int zi_chat_tools_native(const zi_chat_template *t, const char *bos_token, const char *eos_token) {
    /* {"city": ARG_MARK} */
    static const zi_chat_pair args[] = {{K("city"), S("zi_probe_value_7f3a")}};
    static const zi_chat_pair fn[] = {
        {K("name"), S("get_weather")},
        {K("arguments"), {.kind = ZI_CHAT_DICT, .u.dict = {args, 1}}},
    };
    /* Mistral's templates want ids of 9 letters and digits. */
    static const zi_chat_pair call[] = {
        {K("id"), S("call12345")},
        {K("type"), S("function")},
        {K("function"), {.kind = ZI_CHAT_DICT, .u.dict = {fn, 2}}},
    };
    static const zi_chat_value calls[] = {{.kind = ZI_CHAT_DICT, .u.dict = {call, 3}}};
    static const zi_chat_pair m0[] = {{K("role"), S("user")},
                                      {K("content"), S("What is the weather in Paris?")}};
    static const zi_chat_pair m1[] = {
        {K("role"), S("assistant")},
        {K("content"), {.kind = ZI_CHAT_NONE}},
        {K("tool_calls"), {.kind = ZI_CHAT_LIST, .u.list = {calls, 1}}},
    };
    static const zi_chat_pair m1e[] = {
        {K("role"), S("assistant")},
        {K("content"), S("")},
        {K("tool_calls"), {.kind = ZI_CHAT_LIST, .u.list = {calls, 1}}},
    };
    static const zi_chat_pair m2[] = {
        {K("role"), S("tool")},
        {K("content"), S("zi_probe_result_7f3a")},
        {K("tool_call_id"), S("call12345")},
        {K("name"), S("get_weather")},
    };
    static const zi_chat_value msgs[] = {{.kind = ZI_CHAT_DICT, .u.dict = {m0, 2}},
                                         {.kind = ZI_CHAT_DICT, .u.dict = {m1, 3}},
                                         {.kind = ZI_CHAT_DICT, .u.dict = {m2, 4}}};
    static const zi_chat_value msgs_e[] = {{.kind = ZI_CHAT_DICT, .u.dict = {m0, 2}},
                                           {.kind = ZI_CHAT_DICT, .u.dict = {m1e, 3}},
                                           {.kind = ZI_CHAT_DICT, .u.dict = {m2, 4}}};
    static const zi_chat_value messages[] = {{.kind = ZI_CHAT_LIST, .u.list = {msgs, 3}},
                                             {.kind = ZI_CHAT_LIST, .u.list = {msgs_e, 3}}};
    /* tools: [{"type": "function", "function": {"name", "description", "parameters"}}] */
    static const zi_chat_pair city[] = {{K("type"), S("string")}};
    static const zi_chat_pair props[] = {{K("city"), {.kind = ZI_CHAT_DICT, .u.dict = {city, 1}}}};
    static const zi_chat_value req[] = {S("city")};
    static const zi_chat_pair params[] = {
        {K("type"), S("object")},
        {K("properties"), {.kind = ZI_CHAT_DICT, .u.dict = {props, 1}}},
        {K("required"), {.kind = ZI_CHAT_LIST, .u.list = {req, 1}}},
    };
    static const zi_chat_pair tfn[] = {
        {K("name"), S("get_weather")},
        {K("description"), S("The weather in a city")},
        {K("parameters"), {.kind = ZI_CHAT_DICT, .u.dict = {params, 3}}},
    };
    static const zi_chat_pair tool[] = {
        {K("type"), S("function")}, {K("function"), {.kind = ZI_CHAT_DICT, .u.dict = {tfn, 3}}}};
    static const zi_chat_value tools[] = {{.kind = ZI_CHAT_DICT, .u.dict = {tool, 2}}};
    static const zi_chat_var vars[] = {{K("tools"), {.kind = ZI_CHAT_LIST, .u.list = {tools, 1}}}};
    /* content None first, as the request sends it; then "" */
    for (int k = 0; k < 2; k++) {
        zi_chat_render_opts o = {.add_generation_prompt = 1,
                                 .bos_token = bos_token,
                                 .eos_token = eos_token,
                                 .vars = vars,
                                 .n_vars = 1,
                                 .messages = &messages[k]};
        char *out = NULL;
        zi_error err = {0};
        if (zi_chat_template_render(t, NULL, 0, &o, &out, NULL, &err)) continue;
        int native = strstr(out, ARG_MARK) && strstr(out, RESULT_MARK);
        free(out);
        if (native) return ZI_CHAT_TOOLS_NATIVE | (k ? ZI_CHAT_TOOLS_EMPTY_CONTENT : 0);
    }
    return 0;
}

/* ---- msgpack as JSON (Python's json.dumps, ensure_ascii off) ------------- */

static void json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        case '\b':
            fputs("\\b", f);
            break;
        case '\f':
            fputs("\\f", f);
            break;
        default:
            if (c < 0x20)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

/* The decoder bounded the depth (codec.h), so the recursion is bounded. */
static int json_value(FILE *f, const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        fputs("null", f);
        return 0;
    case MSGPACK_OBJECT_BOOLEAN:
        fputs(o->via.boolean ? "true" : "false", f);
        return 0;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%llu", (unsigned long long)o->via.u64);
        return 0;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        fprintf(f, "%lld", (long long)o->via.i64);
        return 0;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        fprintf(f, "%.17g", o->via.f64);
        return 0;
    case MSGPACK_OBJECT_STR:
        json_str(f, o->via.str.ptr, o->via.str.size);
        return 0;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i) fputs(", ", f);
            if (json_value(f, &o->via.array.ptr[i])) return -1;
        }
        fputc(']', f);
        return 0;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR) return -1;
            if (i) fputs(", ", f);
            json_str(f, kv->key.via.str.ptr, kv->key.via.str.size);
            fputs(": ", f);
            if (json_value(f, &kv->val)) return -1;
        }
        fputc('}', f);
        return 0;
    default:
        return -1;
    }
}

static const msgpack_object *get(const msgpack_object *map, const char *key) {
    if (!map || map->type != MSGPACK_OBJECT_MAP) return NULL;
    size_t kl = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl &&
            !memcmp(k->via.str.ptr, key, kl))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

/* One call's {"name": ..., "arguments": ...}; -1 when malformed. */
static int call_json(FILE *f, const msgpack_object *call) {
    const msgpack_object *fn = get(call, "function");
    const msgpack_object *name = get(fn, "name"), *args = get(fn, "arguments");
    if (!name || name->type != MSGPACK_OBJECT_STR || !args) return -1;
    fputs("{\"name\": ", f);
    json_str(f, name->via.str.ptr, name->via.str.size);
    fputs(", \"arguments\": ", f);
    if (args->type == MSGPACK_OBJECT_STR) /* OpenAI's JSON text, as it is */
        fwrite(args->via.str.ptr, 1, args->via.str.size, f);
    else if (json_value(f, args))
        return -1;
    fputc('}', f);
    return 0;
}

int zi_chat_tools_hermes_text(const zi_message *m, size_t i, char **text, size_t *len,
                              zi_error *err) {
    *text = NULL, *len = 0;
    FILE *f = open_memstream(text, len);
    if (!f) return zi_error_set(err, ZI_ENOMEM, "messages[%zu]: out of memory", i);
    const char *content = m->content.p ? m->content.p : "";
    int bad = 0;
    if (!strcmp(m->role.p ? m->role.p : "", "tool")) {
        fputs("<tool_response>\n", f);
        fwrite(content, 1, m->content.len, f);
        fputs("\n</tool_response>", f);
    } else {
        fwrite(content, 1, m->content.len, f);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        bad = msgpack_unpack_next(&u, (const char *)m->tool_calls.p, m->tool_calls.len, NULL) !=
                  MSGPACK_UNPACK_SUCCESS ||
              u.data.type != MSGPACK_OBJECT_ARRAY;
        for (uint32_t k = 0; !bad && k < u.data.via.array.size; k++) {
            fputs(k || m->content.len ? "\n<tool_call>\n" : "<tool_call>\n", f);
            bad = call_json(f, &u.data.via.array.ptr[k]);
            fputs("\n</tool_call>", f);
        }
        msgpack_unpacked_destroy(&u);
    }
    int ferr = fclose(f);
    if (bad || ferr) {
        free(*text);
        *text = NULL, *len = 0;
        return bad ? zi_error_set(err, ZI_EFORMAT, "messages[%zu].tool_calls: malformed", i)
                   : zi_error_set(err, ZI_ENOMEM, "messages[%zu]: out of memory", i);
    }
    return ZI_OK;
}
