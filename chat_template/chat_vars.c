/*
 * chat_vars.c - a request's tools and chat_template_options as
 * chat-template variables (see chat_vars.h).
 *
 * A msgpack object becomes a zi_chat_value tree in two passes: the first
 * walks it, refusing what has no Python value here (bin, ext, non-string
 * keys, too deep, integers beyond 64 bits) and counting list items, dict
 * pairs and string bytes; the second fills one malloc'd block of exactly
 * that size. zi_chat_value_check (chat_template.h) then checks the UTF-8,
 * with the same path in its messages.
 */
#include "chat_vars.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_tools.h"
#include "codec.h"
#include "keypath.h"

/* ---- arena ------------------------------------------------------------- */

typedef union block {
    union block *next;
    max_align_t align_;
} block;

static void *arena_alloc(zi_chat_arena *a, size_t n) {
    if (n > SIZE_MAX - sizeof(block)) return NULL;
    block *b = malloc(sizeof(block) + n);
    if (!b) return NULL;
    b->next = a->blocks;
    a->blocks = b;
    return b + 1;
}

/* Frees the newest block (p, from arena_alloc), undoing that allocation. */
static void arena_drop(zi_chat_arena *a, void *p) {
    block *b = (block *)p - 1;
    a->blocks = b->next;
    free(b);
}

void zi_chat_arena_free(zi_chat_arena *a) {
    if (!a) return;
    block *b = a->blocks;
    while (b) {
        block *next = b->next;
        free(b);
        b = next;
    }
    a->blocks = NULL;
}

/* ---- msgpack -> tree ------------------------------------------------------ */

typedef struct conv {
    zi_error *err;
    zi_keypath p;
    size_t nvals, npairs, nstr; /* pass 1: what the tree needs */
    zi_chat_value *vals;        /* pass 2: where the next items go */
    zi_chat_pair *pairs;
    char *strs;
} conv;

static int measure(conv *c, const msgpack_object *o, size_t depth) {
    if (depth > ZI_CHAT_VARS_MAX_DEPTH)
        return zi_error_set(c->err, ZI_EINVAL, "%s: nested deeper than %d levels", c->p.s,
                            ZI_CHAT_VARS_MAX_DEPTH);
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
    case MSGPACK_OBJECT_BOOLEAN:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return ZI_OK;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (o->via.u64 > (uint64_t)INT64_MAX)
            return zi_error_set(c->err, ZI_EUNSUPPORTED, "%s: %llu does not fit in 64 bits", c->p.s,
                                (unsigned long long)o->via.u64);
        return ZI_OK;
    case MSGPACK_OBJECT_STR:
        c->nstr += o->via.str.size;
        return ZI_OK;
    case MSGPACK_OBJECT_ARRAY:
        c->nvals += o->via.array.size;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            size_t old = zi_keypath_push(&c->p, "[%u]", i);
            int rc = measure(c, &o->via.array.ptr[i], depth + 1);
            zi_keypath_pop(&c->p, old);
            if (rc) return rc;
        }
        return ZI_OK;
    case MSGPACK_OBJECT_MAP:
        c->npairs += o->via.map.size;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (k->type != MSGPACK_OBJECT_STR)
                return zi_error_set(c->err, ZI_EINVAL,
                                    "%s: map keys must be strings (key #%u is %s)", c->p.s, i,
                                    zi_msgpack_type_name(k));
            c->nstr += k->via.str.size;
            size_t old = zi_keypath_push_key(&c->p, ".", k->via.str.ptr, k->via.str.size);
            int rc = measure(c, &o->via.map.ptr[i].val, depth + 1);
            zi_keypath_pop(&c->p, old);
            if (rc) return rc;
        }
        return ZI_OK;
    case MSGPACK_OBJECT_BIN:
        return zi_error_set(c->err, ZI_EINVAL, "%s: binary data is not accepted (send a string)",
                            c->p.s);
    default:
        return zi_error_set(c->err, ZI_EINVAL, "%s: extension types are not accepted", c->p.s);
    }
}

static const char *copy_str(conv *c, const char *s, size_t n) {
    char *d = c->strs;
    if (n) memcpy(d, s, n);
    c->strs += n;
    return d;
}

/* Pass 2, over an object pass 1 accepted. */
static void fill(conv *c, const msgpack_object *o, zi_chat_value *out) {
    memset(out, 0, sizeof *out);
    switch (o->type) {
    case MSGPACK_OBJECT_BOOLEAN:
        out->kind = ZI_CHAT_BOOL;
        out->u.b = o->via.boolean ? 1 : 0;
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        out->kind = ZI_CHAT_INT;
        out->u.i = (int64_t)o->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        out->kind = ZI_CHAT_INT;
        out->u.i = o->via.i64;
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        out->kind = ZI_CHAT_FLOAT;
        out->u.f = o->via.f64;
        break;
    case MSGPACK_OBJECT_STR:
        out->kind = ZI_CHAT_STR;
        out->u.s.p = copy_str(c, o->via.str.ptr, o->via.str.size);
        out->u.s.len = o->via.str.size;
        break;
    case MSGPACK_OBJECT_ARRAY: {
        zi_chat_value *items = c->vals;
        c->vals += o->via.array.size;
        for (uint32_t i = 0; i < o->via.array.size; i++) fill(c, &o->via.array.ptr[i], &items[i]);
        out->kind = ZI_CHAT_LIST;
        out->u.list.v = items;
        out->u.list.n = o->via.array.size;
        break;
    }
    case MSGPACK_OBJECT_MAP: {
        zi_chat_pair *pairs = c->pairs;
        c->pairs += o->via.map.size;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            pairs[i].key = copy_str(c, k->via.str.ptr, k->via.str.size);
            pairs[i].key_len = k->via.str.size;
            fill(c, &o->via.map.ptr[i].val, &pairs[i].value);
        }
        out->kind = ZI_CHAT_DICT;
        out->u.dict.v = pairs;
        out->u.dict.n = o->via.map.size;
        break;
    }
    default: /* nil (pass 1 refused the rest) */
        out->kind = ZI_CHAT_NONE;
        break;
    }
}

/* zi_chat_value_from_msgpack with o at nesting level depth. */
static int from_msgpack(const msgpack_object *o, const char *where, size_t depth, zi_chat_arena *a,
                        zi_chat_value *out, zi_error *err) {
    conv c;
    memset(&c, 0, sizeof c);
    c.err = err;
    zi_keypath_push(&c.p, "%s", where ? where : "value");
    memset(out, 0, sizeof *out);
    out->kind = ZI_CHAT_NONE;
    int rc = measure(&c, o, depth);
    if (rc) return rc;
    size_t nv = c.nvals, np = c.npairs, ns = c.nstr;
    if (nv > SIZE_MAX / 2 / sizeof(zi_chat_value) || np > SIZE_MAX / 4 / sizeof(zi_chat_pair) ||
        ns > SIZE_MAX / 8)
        return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", c.p.s);
    size_t bytes = nv * sizeof(zi_chat_value) + np * sizeof(zi_chat_pair) + ns;
    char *mem = NULL;
    if (bytes) {
        mem = arena_alloc(a, bytes);
        if (!mem) return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", c.p.s);
    }
    c.vals = (zi_chat_value *)mem;
    c.pairs = (zi_chat_pair *)(mem + nv * sizeof(zi_chat_value));
    c.strs = mem + nv * sizeof(zi_chat_value) + np * sizeof(zi_chat_pair);
    zi_chat_value v;
    fill(&c, o, &v);
    rc = zi_chat_value_check(&v, c.p.s, err);
    if (rc) {
        if (mem) arena_drop(a, mem);
        return rc;
    }
    *out = v;
    return ZI_OK;
}

int zi_chat_value_from_msgpack(const msgpack_object *o, const char *path, zi_chat_arena *a,
                               zi_chat_value *out, zi_error *err) {
    if (!o || !a || !out)
        return zi_error_set(err, ZI_EINVAL, "%s: NULL argument", path ? path : "value");
    return from_msgpack(o, path, 1, a, out, err);
}

/* ---- a request's variables ------------------------------------------------ */

static int is_nil(const msgpack_object *o) {
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

static int vars_build(const msgpack_object *tools, const msgpack_object *options, zi_chat_vars *out,
                      zi_error *err) {
    int have_tools = !is_nil(tools);
    if (have_tools) { /* its shape was checked when the request was decoded (codec.h) */
        if (tools->type != MSGPACK_OBJECT_ARRAY)
            return zi_error_set(err, ZI_EINVAL, "tools: must be an array, not %s",
                                zi_msgpack_type_name(tools));
        have_tools = tools->via.array.size > 0;
    }
    size_t nopt = 0;
    if (!is_nil(options)) {
        if (options->type != MSGPACK_OBJECT_MAP)
            return zi_error_set(err, ZI_EINVAL, "chat_template_options: must be a map, not %s",
                                zi_msgpack_type_name(options));
        nopt = options->via.map.size;
    }
    size_t count = (size_t)have_tools + nopt;
    if (!count) return ZI_OK;
    out->v = arena_alloc(&out->arena, count * sizeof *out->v);
    if (!out->v) return zi_error_set(err, ZI_ENOMEM, "chat template variables: out of memory");
    if (have_tools) {
        zi_chat_var *v = &out->v[out->n];
        v->name = "tools";
        v->name_len = 5;
        int rc = from_msgpack(tools, "tools", 1, &out->arena, &v->value, err);
        if (rc) return rc;
        out->n++;
    }
    for (uint32_t i = 0; i < nopt; i++) {
        const msgpack_object *k = &options->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return zi_error_set(err, ZI_EINVAL,
                                "chat_template_options: map keys must be strings (key #%u is %s)",
                                i, zi_msgpack_type_name(k));
        const char *name = k->via.str.ptr ? k->via.str.ptr : "";
        size_t len = k->via.str.size;
        char where[48];
        snprintf(where, sizeof where, "chat_template_options key #%u", i);
        zi_chat_value kv = {0};
        kv.kind = ZI_CHAT_STR;
        kv.u.s.p = name;
        kv.u.s.len = len;
        int rc = zi_chat_value_check(&kv, where, err);
        if (rc) return rc;
        zi_keypath p = {{0}, 0};
        zi_keypath_push_key(&p, "chat_template_options.", name, len);
        if (zi_chat_var_reserved(name, len))
            return zi_error_set(err, ZI_EINVAL, "%s: a name the renderer sets itself", p.s);
        if (len == 5 && memcmp(name, "tools", 5) == 0)
            return zi_error_set(err, ZI_EINVAL, "%s: send tools in the request's tools field", p.s);
        for (uint32_t j = 0; j < i; j++)
            if (options->via.map.ptr[j].key.via.str.size == len &&
                (len == 0 || memcmp(options->via.map.ptr[j].key.via.str.ptr, name, len) == 0))
                return zi_error_set(err, ZI_EINVAL, "%s: given twice", p.s);
        zi_chat_var *v = &out->v[out->n];
        char *copy = arena_alloc(&out->arena, len ? len : 1);
        if (!copy) return zi_error_set(err, ZI_ENOMEM, "%s: out of memory", p.s);
        if (len) memcpy(copy, name, len);
        v->name = copy;
        v->name_len = len;
        rc = from_msgpack(&options->via.map.ptr[i].val, p.s, 2, &out->arena, &v->value, err);
        if (rc) return rc;
        out->n++;
    }
    return ZI_OK;
}

int zi_chat_vars_from_msgpack(const msgpack_object *tools, const msgpack_object *options,
                              zi_chat_vars *out, zi_error *err) {
    if (!out) return zi_error_set(err, ZI_EINVAL, "chat template variables: NULL argument");
    memset(out, 0, sizeof *out);
    int rc = vars_build(tools, options, out, err);
    if (rc) zi_chat_vars_free(out);
    return rc;
}

void zi_chat_vars_free(zi_chat_vars *v) {
    if (!v) return;
    zi_chat_arena_free(&v->arena);
    v->v = NULL;
    v->n = 0;
}

/* ---- messages ------------------------------------------------------------ */

/* A string value referring to s[0..n) (the request outlives the render). */
static zi_chat_value str_value(const char *s, size_t n) {
    zi_chat_value v = {.kind = ZI_CHAT_STR};
    v.u.s.p = n ? s : "";
    v.u.s.len = n;
    return v;
}

/* A tool message or an assistant's calls as a plain turn's text
 * (chat_tools.h), copied into a. */
static int hermes_message(const zi_message *m, size_t i, zi_chat_arena *a, zi_chat_pair *kv,
                          zi_error *err) {
    char *txt;
    size_t tl;
    int rc = zi_chat_tools_hermes_text(m, i, &txt, &tl, err);
    if (rc) return rc;
    char *copy = arena_alloc(a, tl + 1);
    if (!copy) {
        free(txt);
        return zi_error_set(err, ZI_ENOMEM, "messages: out of memory");
    }
    memcpy(copy, txt, tl);
    copy[tl] = '\0';
    free(txt);
    int tool = m->role.len == 4 && !memcmp(m->role.p, "tool", 4);
    kv[0] =
        (zi_chat_pair){"role", 4, tool ? str_value("user", 4) : str_value(m->role.p, m->role.len)};
    kv[1] = (zi_chat_pair){"content", 7, str_value(copy, tl)};
    return ZI_OK;
}

int zi_chat_messages_from_request(const zi_request *r, int tool_caps, zi_chat_arena *a,
                                  zi_chat_value *out, zi_error *err) {
    *out = (zi_chat_value){.kind = ZI_CHAT_NONE};
    if (!r || !a) return zi_error_set(err, ZI_EINVAL, "messages: NULL pointer");
    size_t n = r->n_messages;
    zi_chat_value *items = arena_alloc(a, (n ? n : 1) * sizeof *items);
    if (!items) return zi_error_set(err, ZI_ENOMEM, "messages: out of memory");
    for (size_t i = 0; i < n; i++) {
        const zi_message *m = &r->messages[i];
        zi_chat_pair *kv = arena_alloc(a, 6 * sizeof *kv);
        if (!kv) return zi_error_set(err, ZI_ENOMEM, "messages: out of memory");
        size_t k = 0;
        if (!(tool_caps & ZI_CHAT_TOOLS_NATIVE) &&
            (m->tool_calls.len || (m->role.len == 4 && !memcmp(m->role.p, "tool", 4)))) {
            int rc = hermes_message(m, i, a, kv, err);
            if (rc) return rc;
            items[i] = (zi_chat_value){.kind = ZI_CHAT_DICT};
            items[i].u.dict.v = kv;
            items[i].u.dict.n = 2;
            continue;
        }
        kv[k++] = (zi_chat_pair){"role", 4, str_value(m->role.p, m->role.len)};
        kv[k] = (zi_chat_pair){"content", 7, str_value(m->content.p, m->content.len)};
        if (m->content_null && !(tool_caps & ZI_CHAT_TOOLS_EMPTY_CONTENT))
            kv[k].value = (zi_chat_value){.kind = ZI_CHAT_NONE};
        k++;
        if (m->tool_calls.len) {
            msgpack_unpacked u;
            msgpack_unpacked_init(&u);
            size_t off = 0;
            int ok = msgpack_unpack_next(&u, (const char *)m->tool_calls.p, m->tool_calls.len,
                                         &off) == MSGPACK_UNPACK_SUCCESS;
            char path[64];
            snprintf(path, sizeof path, "messages[%zu].tool_calls", i);
            int rc = ok ? zi_chat_value_from_msgpack(&u.data, path, a, &kv[k].value, err)
                        : zi_error_set(err, ZI_EFORMAT, "%s: not msgpack", path);
            msgpack_unpacked_destroy(&u);
            if (rc) return rc;
            kv[k].key = "tool_calls";
            kv[k++].key_len = 10;
        }
        if (m->tool_call_id.len)
            kv[k++] = (zi_chat_pair){"tool_call_id", 12,
                                     str_value(m->tool_call_id.p, m->tool_call_id.len)};
        if (m->name.len) kv[k++] = (zi_chat_pair){"name", 4, str_value(m->name.p, m->name.len)};
        if (m->reasoning_content.len)
            kv[k++] = (zi_chat_pair){"reasoning_content", 17,
                                     str_value(m->reasoning_content.p, m->reasoning_content.len)};
        items[i] = (zi_chat_value){.kind = ZI_CHAT_DICT};
        items[i].u.dict.v = kv;
        items[i].u.dict.n = k;
    }
    out->kind = ZI_CHAT_LIST;
    out->u.list.v = items;
    out->u.list.n = n;
    return ZI_OK;
}

int zi_chat_render_request(const zi_chat_template *t, int tool_caps, const zi_request *r,
                           const msgpack_object *tools, const msgpack_object *options,
                           const char *bos_token, const char *eos_token, char **out,
                           size_t *out_len, zi_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!t || !r || !out) return zi_error_set(err, ZI_EINVAL, "messages: NULL pointer");
    zi_chat_vars cv;
    int rc = zi_chat_vars_from_msgpack(tools, options, &cv, err);
    if (rc) { /* its messages name their own paths (tools[0]..., chat_template_options.x) */
        zi_chat_vars_free(&cv);
        return rc;
    }
    zi_chat_value mv;
    rc = zi_chat_messages_from_request(r, tool_caps, &cv.arena, &mv, err);
    if (!rc) {
        zi_chat_render_opts ro = {.add_generation_prompt = 1,
                                  .bos_token = bos_token,
                                  .eos_token = eos_token,
                                  .vars = cv.v,
                                  .n_vars = cv.n,
                                  .messages = &mv};
        rc = zi_chat_template_render(t, NULL, 0, &ro, out, out_len, err);
        if (rc) zi_error_prefix(err, "messages");
    }
    zi_chat_vars_free(&cv);
    return rc;
}
