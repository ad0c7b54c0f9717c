/*
 * codec_decode.c - the type decoders of codec.h (sampling parameters,
 * requests, log probabilities, responses, contexts), built from the field
 * readers of codec_fields.c, and decoding from bytes.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec_internal.h"
#include "duration.h"

/* ---- decoders -------------------------------------------------------------- */

/* A present value of the wanted type at d's path + "." + name, or an
 * error; optional ones may be absent. */
static int need_field(zi_dec *d, const msgpack_object *o, const char *name, msgpack_object_type t,
                      const char *what, bool optional) {
    if (!o) return optional ? ZI_OK : zi_dec_missing(d, name);
    if (o->type == t) return ZI_OK;
    size_t old = zi_dec_push_key(d, name);
    int rc = zi_dec_wrong_type(d, o, what);
    zi_dec_pop(d, old);
    return rc;
}

/* Defines fn, a public decoder of codec.h: it refuses NULL pointers
 * (naming root), then runs dec, a static decoder of `type` below, on a
 * decoder rooted at path with lim or the defaults. */
#define PUBLIC_DECODER(fn, type, root, dec)                                                        \
    int fn(const msgpack_object *o, const zi_codec_limits *lim, const char *path, type *out,       \
           zi_error *err) {                                                                        \
        if (!o || !out) return zi_error_set(err, ZI_EINVAL, root ": NULL pointer");                \
        zi_codec_limits tmp;                                                                       \
        zi_dec d;                                                                                  \
        zi_dec_init(&d, zi_codec_limits_or_default(lim, &tmp), path, root, err);                   \
        return dec(&d, o, out);                                                                    \
    }

/* The seed's TokenGeneratorRequestTool list: [{"type": str, "function":
 * {"name": non-empty str, "description": str, "parameters": map}}], no
 * other keys. Checked here, at admission, so that the tokenizer turns a
 * list it can trust into the template's `tools`. */
static int dec_tools(zi_dec *d, const msgpack_object *o) {
    static const char *const tool_keys[] = {"type", "function"};
    static const char *const fn_keys[] = {"name", "description", "parameters"};
    if (o->type != MSGPACK_OBJECT_ARRAY) return zi_dec_wrong_type(d, o, "an array");
    int rc = ZI_OK;
    for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
        size_t old = zi_dec_push_idx(d, i);
        const msgpack_object *tv[2], *fv[3];
        rc = zi_dec_read_map(d, &o->via.array.ptr[i], tool_keys, 2, 0, tv);
        if (!rc) rc = need_field(d, tv[0], "type", MSGPACK_OBJECT_STR, "a string", false);
        if (!rc) rc = need_field(d, tv[1], "function", MSGPACK_OBJECT_MAP, "a map", false);
        if (!rc) {
            size_t fold = zi_dec_push_key(d, "function");
            rc = zi_dec_read_map(d, tv[1], fn_keys, 3, 0, fv);
            if (!rc) rc = need_field(d, fv[0], "name", MSGPACK_OBJECT_STR, "a string", false);
            if (!rc && fv[0]->via.str.size == 0)
                rc = zi_dec_fail_at(d, "name", ZI_EINVAL, "must not be empty");
            if (!rc) rc = need_field(d, fv[1], "description", MSGPACK_OBJECT_STR, "a string", true);
            if (!rc) rc = need_field(d, fv[2], "parameters", MSGPACK_OBJECT_MAP, "a map", true);
            zi_dec_pop(d, fold);
        }
        zi_dec_pop(d, old);
    }
    return rc;
}

/* Runs a getter with the field name pushed onto the path. */
#define AT(d, name, expr)                                                                          \
    do {                                                                                           \
        size_t at_old_ = zi_dec_push_key((d), (name));                                             \
        rc = (expr);                                                                               \
        zi_dec_pop((d), at_old_);                                                                  \
        if (rc) goto fail;                                                                         \
    } while (0)

/* logit_bias: a map token id -> bias. Keys are non-negative integers, or
 * strings of decimal digits (JSON clients can only send strings); values
 * numbers in [-100, 100]. The map's size is checked before anything is
 * allocated. */
static int dec_logit_bias(zi_dec *d, const msgpack_object *o, zi_logit_bias *out) {
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_MAP, "a map of token id to bias", "entries",
                          ZI_LOGIT_BIAS_MAX);
    if (rc || o->via.map.size == 0) return rc;
    out->v = malloc(o->via.map.size * sizeof *out->v);
    if (!out->v) return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        int64_t id = -1;
        if (k->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            id = k->via.u64 > INT32_MAX ? -1 : (int64_t)k->via.u64;
            if (id < 0)
                return zi_dec_fail(d, ZI_EINVAL, "key %llu is not a token id",
                                   (unsigned long long)k->via.u64);
        } else if (k->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            return zi_dec_fail(d, ZI_EINVAL, "key %lld is not a token id", (long long)k->via.i64);
        } else if (k->type == MSGPACK_OBJECT_STR) {
            const char *s = k->via.str.ptr;
            size_t n = k->via.str.size;
            id = 0;
            for (size_t j = 0; j < n && id >= 0; j++)
                id = s[j] >= '0' && s[j] <= '9' && j < 10 ? id * 10 + (s[j] - '0') : -1;
            if (n == 0 || id < 0 || id > INT32_MAX) {
                char nm[48];
                zi_printable(nm, sizeof nm, s, n);
                return zi_dec_fail(d, ZI_EINVAL, "key \"%s\" is not a token id", nm);
            }
        } else {
            return zi_dec_fail(d, ZI_EINVAL, "key #%u is %s, not a token id", i,
                               zi_msgpack_type_name(k));
        }
        double b;
        char at[16];
        snprintf(at, sizeof at, "%lld", (long long)id);
        size_t old = zi_dec_push_key(d, at);
        rc = zi_dec_f64(d, &o->via.map.ptr[i].val, &b);
        if (!rc && !(b >= -ZI_LOGIT_BIAS_LIMIT && b <= ZI_LOGIT_BIAS_LIMIT))
            rc = zi_dec_fail(d, ZI_EINVAL, "bias %g is outside [-100, 100]", b);
        zi_dec_pop(d, old);
        if (rc) return rc;
        out->v[out->n++] = (zi_token_bias){(int32_t)id, (float)b};
    }
    return ZI_OK;
}

/* "lora": an array of at most ZI_MAX_LORA maps, each {"id": int} or
 * {"name": str}, and "scale" (a finite number, default 1). */
static int dec_lora(zi_dec *d, const msgpack_object *o, zi_lora_ref *out, size_t *n_out) {
    static const char *const names[] = {"id", "name", "scale"};
    *n_out = 0;
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY,
                          "an array of {\"id\" or \"name\", "
                          "\"scale\"} maps",
                          "adapters", ZI_MAX_LORA);
    for (uint32_t i = 0; !rc && i < o->via.array.size; i++) {
        size_t old = zi_dec_push_idx(d, i);
        const msgpack_object *v[3];
        zi_lora_ref *r = &out[i];
        memset(r, 0, sizeof *r);
        r->id = -1, r->scale = 1.0f;
        rc = zi_dec_read_map(d, &o->via.array.ptr[i], names, 3, 0, v);
        if (!rc && zi_dec_is_nil(v[0]) == zi_dec_is_nil(v[1]))
            rc = zi_dec_fail(d, ZI_EINVAL, "give one of \"id\" and \"name\"");
        if (!rc && !zi_dec_is_nil(v[0])) {
            int64_t id;
            size_t o2 = zi_dec_push_key(d, "id");
            rc = zi_dec_i64(d, v[0], 0, 1023, &id);
            zi_dec_pop(d, o2);
            r->id = (int32_t)id;
        }
        if (!rc && !zi_dec_is_nil(v[1])) {
            size_t o2 = zi_dec_push_key(d, "name");
            rc = zi_dec_check_str(d, v[1], ZI_STR_NO_NUL | ZI_STR_NONEMPTY);
            if (!rc && v[1]->via.str.size >= ZI_LORA_REF_NAME_MAX)
                rc = zi_dec_fail(d, ZI_EINVAL, "longer than %d bytes", ZI_LORA_REF_NAME_MAX - 1);
            if (!rc) memcpy(r->name, v[1]->via.str.ptr, v[1]->via.str.size);
            zi_dec_pop(d, o2);
        }
        if (!rc && !zi_dec_is_nil(v[2])) {
            double sc;
            size_t o2 = zi_dec_push_key(d, "scale");
            rc = zi_dec_f64(d, v[2], &sc);
            if (!rc && !(fabs(sc) <= 1e6))
                rc = zi_dec_fail(d, ZI_EINVAL, "%g is not a finite number within +-1e6", sc);
            r->scale = (float)sc;
            zi_dec_pop(d, o2);
        }
        zi_dec_pop(d, old);
        if (!rc) *n_out = i + 1;
    }
    return rc;
}

static int dec_sampling(zi_dec *d, const msgpack_object *o, zi_sampling_params *sp) {
    static const char *const names[] = {"top_k",
                                        "top_p",
                                        "min_p",
                                        "temperature",
                                        "frequency_penalty",
                                        "presence_penalty",
                                        "repetition_penalty",
                                        "max_new_tokens",
                                        "min_new_tokens",
                                        "ignore_eos",
                                        "stop",
                                        "stop_token_ids",
                                        "detokenize",
                                        "seed",
                                        "logit_bias",
                                        "speculate"};
    enum { N = sizeof names / sizeof names[0] };
    const msgpack_object *v[N];
    zi_sampling_params_init(sp);
    int rc = zi_dec_read_map(d, o, names, N, 0, v);
    if (rc) return rc;
    int64_t i;
    if (v[0]) {
        AT(d, "top_k", zi_dec_i64(d, v[0], INT32_MIN, INT32_MAX, &i));
        sp->top_k = (int32_t)i;
    }
    if (v[1]) AT(d, "top_p", zi_dec_f64(d, v[1], &sp->top_p));
    if (v[2]) AT(d, "min_p", zi_dec_f64(d, v[2], &sp->min_p));
    if (v[3]) AT(d, "temperature", zi_dec_f64(d, v[3], &sp->temperature));
    if (v[4]) AT(d, "frequency_penalty", zi_dec_f64(d, v[4], &sp->frequency_penalty));
    if (v[5]) AT(d, "presence_penalty", zi_dec_f64(d, v[5], &sp->presence_penalty));
    if (v[6]) AT(d, "repetition_penalty", zi_dec_f64(d, v[6], &sp->repetition_penalty));
    if (!zi_dec_is_nil(v[7]))
        AT(d, "max_new_tokens", zi_dec_i64(d, v[7], -1, INT32_MAX, &sp->max_new_tokens));
    if (v[8]) AT(d, "min_new_tokens", zi_dec_i64(d, v[8], 0, INT32_MAX, &sp->min_new_tokens));
    if (v[9]) AT(d, "ignore_eos", zi_dec_bool(d, v[9], &sp->ignore_eos));
    if (!zi_dec_is_nil(v[10]))
        AT(d, "stop", zi_dec_str_list(d, v[10], ZI_STR_NONEMPTY, false, &sp->stop));
    if (!zi_dec_is_nil(v[11]))
        AT(d, "stop_token_ids", zi_dec_i32_list(d, v[11], &sp->stop_token_ids));
    if (v[12]) AT(d, "detokenize", zi_dec_bool(d, v[12], &sp->detokenize));
    if (v[13]) {
        size_t old = zi_dec_push_key(d, "seed");
        if (v[13]->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            sp->seed = v[13]->via.u64;
        else if (v[13]->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            rc = zi_dec_fail(d, ZI_EINVAL, "%lld is negative", (long long)v[13]->via.i64);
        else
            rc = zi_dec_wrong_type(d, v[13], "an integer");
        zi_dec_pop(d, old);
        if (rc) goto fail;
    }
    if (!zi_dec_is_nil(v[14])) AT(d, "logit_bias", dec_logit_bias(d, v[14], &sp->logit_bias));
    if (v[15]) AT(d, "speculate", zi_dec_bool(d, v[15], &sp->speculate));
    if ((rc = zi_sampling_params_validate(sp, d->path.s, d->err))) goto fail;
    return ZI_OK;
fail:
    zi_sampling_params_free(sp);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_sampling_params, zi_sampling_params, "sampling_params", dec_sampling)

/* Appends text to s (joining message parts). */
static int str_append(zi_string *s, const char *p, size_t n, const char *sep) {
    size_t sl = (s->len && sep) ? strlen(sep) : 0;
    char *q = realloc(s->p, s->len + sl + n + 1);
    if (!q) return ZI_ENOMEM;
    memcpy(q + s->len, sep ? sep : "", sl);
    if (n) memcpy(q + s->len + sl, p, n);
    s->len += sl + n;
    q[s->len] = '\0';
    s->p = q;
    return ZI_OK;
}

/* A message's content: a string, or a list of text parts
 * {"type": "text", "text" | "content": str}, joined with "\n". */
static int dec_content(zi_dec *d, const msgpack_object *o, zi_string *out) {
    if (o->type == MSGPACK_OBJECT_STR) return zi_dec_str(d, o, 0, out);
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY, "a string or an array of parts", "parts",
                          d->lim->max_items);
    if (rc) return rc;
    if (zi_string_set(out, "", 0, NULL)) return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < o->via.array.size; i++) {
        static const char *const names[] = {"type", "text", "content"};
        const msgpack_object *v[3];
        size_t old = zi_dec_push_idx(d, i);
        rc = zi_dec_read_map(d, &o->via.array.ptr[i], names, 3, 1, v);
        if (!rc) {
            size_t o2 = zi_dec_push_key(d, "type");
            rc = zi_dec_check_str(d, v[0], ZI_STR_ID);
            if (!rc && !zi_dec_is_key(v[0], "text")) {
                char nm[80];
                zi_printable(nm, sizeof nm, v[0]->via.str.ptr, v[0]->via.str.size);
                rc = zi_dec_fail(d, ZI_EUNSUPPORTED,
                                 "part type \"%s\" is not supported (text only)", nm);
            }
            zi_dec_pop(d, o2);
        }
        if (!rc && !!v[1] == !!v[2])
            rc = zi_dec_fail(d, ZI_EINVAL, "a text part needs exactly one of text or content");
        if (!rc) {
            const msgpack_object *t = v[1] ? v[1] : v[2];
            size_t o2 = zi_dec_push_key(d, v[1] ? "text" : "content");
            rc = zi_dec_check_str(d, t, 0);
            if (!rc && str_append(out, t->via.str.ptr, t->via.str.size, "\n"))
                rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
            if (!rc && out->len > d->lim->max_string_bytes)
                rc = zi_dec_fail(d, ZI_EINVAL, "content exceeds the limit of %zu bytes",
                                 d->lim->max_string_bytes);
            zi_dec_pop(d, o2);
        }
        zi_dec_pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

/* An assistant message's tool_calls: [{"id": str, "type": "function",
 * "function": {"name": non-empty str, "arguments": map or str}}], 1 to
 * max_items calls, no other keys; id and type may be left out (Hugging
 * Face's examples do). Kept as msgpack for the chat template. */
static int dec_tool_calls(zi_dec *d, const msgpack_object *o, zi_bytes *out) {
    static const char *const call_keys[] = {"id", "type", "function"};
    static const char *const fn_keys[] = {"name", "arguments"};
    int rc =
        zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY, "an array of calls", "calls", d->lim->max_items);
    if (rc) return rc;
    if (o->via.array.size == 0) return zi_dec_fail(d, ZI_EINVAL, "must not be empty");
    for (uint32_t i = 0; i < o->via.array.size && !rc; i++) {
        size_t old = zi_dec_push_idx(d, i);
        const msgpack_object *cv[3], *fv[2];
        rc = zi_dec_read_map(d, &o->via.array.ptr[i], call_keys, 3, 0, cv);
        if (!rc && cv[0]) {
            size_t o2 = zi_dec_push_key(d, "id");
            rc = zi_dec_check_str(d, cv[0], ZI_STR_ID);
            zi_dec_pop(d, o2);
        }
        if (!rc && cv[1]) {
            size_t o2 = zi_dec_push_key(d, "type");
            rc = zi_dec_check_str(d, cv[1], 0);
            if (!rc && !zi_dec_is_key(cv[1], "function"))
                rc = zi_dec_fail(d, ZI_EINVAL, "must be \"function\"");
            zi_dec_pop(d, o2);
        }
        if (!rc) rc = need_field(d, cv[2], "function", MSGPACK_OBJECT_MAP, "a map", false);
        if (!rc) {
            size_t fold = zi_dec_push_key(d, "function");
            rc = zi_dec_read_map(d, cv[2], fn_keys, 2, 2, fv);
            if (!rc) {
                size_t o2 = zi_dec_push_key(d, "name");
                rc = zi_dec_check_str(d, fv[0], ZI_STR_ID | ZI_STR_NONEMPTY);
                zi_dec_pop(d, o2);
            }
            if (!rc && fv[1]->type != MSGPACK_OBJECT_MAP && fv[1]->type != MSGPACK_OBJECT_STR) {
                size_t o2 = zi_dec_push_key(d, "arguments");
                rc = zi_dec_wrong_type(d, fv[1], "a map or a JSON string");
                zi_dec_pop(d, o2);
            }
            zi_dec_pop(d, fold);
        }
        zi_dec_pop(d, old);
    }
    /* request (1) > messages (2) > message (3) > tool_calls (4) */
    if (!rc) rc = zi_dec_opaque(d, o, MSGPACK_OBJECT_ARRAY, "an array", 4, out);
    return rc;
}

static int dec_messages(zi_dec *d, const msgpack_object *o, zi_request *r) {
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY, "an array of messages", "messages",
                          d->lim->max_items);
    if (rc) return rc;
    uint32_t n = o->via.array.size;
    if (n == 0) return zi_dec_fail(d, ZI_EINVAL, "must not be empty");
    r->messages = calloc(n, sizeof *r->messages);
    if (!r->messages) return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        static const char *const names[] = {"role",         "content", "tool_calls",
                                            "tool_call_id", "name",    "reasoning_content"};
        const msgpack_object *v[6];
        zi_message *m = &r->messages[i];
        r->n_messages = i + 1; /* so a failure frees what was filled */
        size_t old = zi_dec_push_idx(d, i);
        rc = zi_dec_read_map(d, &o->via.array.ptr[i], names, 6, 1, v);
        bool assistant = false, tool = false;
        if (!rc) {
            size_t o2 = zi_dec_push_key(d, "role");
            rc = zi_dec_str(d, v[0], ZI_STR_ID, &m->role);
            assistant = !rc && !strcmp(m->role.p, "assistant");
            tool = !rc && !strcmp(m->role.p, "tool");
            if (!rc && !assistant && !tool && strcmp(m->role.p, "system") &&
                strcmp(m->role.p, "user")) {
                char nm[80];
                zi_printable(nm, sizeof nm, m->role.p, m->role.len);
                rc = zi_dec_fail(d, ZI_EINVAL,
                                 "\"%s\" is not a role (system, user, assistant or tool)", nm);
            }
            zi_dec_pop(d, o2);
        }
        if (!rc && v[2] && !zi_dec_is_nil(v[2])) {
            size_t o2 = zi_dec_push_key(d, "tool_calls");
            rc = assistant
                     ? dec_tool_calls(d, v[2], &m->tool_calls)
                     : zi_dec_fail(d, ZI_EINVAL, "only an assistant message makes tool calls");
            zi_dec_pop(d, o2);
        }
        if (!rc && v[3] && !zi_dec_is_nil(v[3])) {
            size_t o2 = zi_dec_push_key(d, "tool_call_id");
            rc = tool ? zi_dec_str(d, v[3], ZI_STR_ID, &m->tool_call_id)
                      : zi_dec_fail(d, ZI_EINVAL, "only a tool message answers a tool call");
            zi_dec_pop(d, o2);
        }
        if (!rc && v[4] && !zi_dec_is_nil(v[4])) {
            size_t o2 = zi_dec_push_key(d, "name");
            rc = tool ? zi_dec_str(d, v[4], ZI_STR_ID, &m->name)
                      : zi_dec_fail(d, ZI_EINVAL, "only a tool message names its function");
            zi_dec_pop(d, o2);
        }
        if (!rc && v[5] && !zi_dec_is_nil(v[5])) {
            size_t o2 = zi_dec_push_key(d, "reasoning_content");
            rc = assistant ? zi_dec_str(d, v[5], 0, &m->reasoning_content)
                           : zi_dec_fail(d, ZI_EINVAL, "only an assistant message has reasoning");
            zi_dec_pop(d, o2);
        }
        if (!rc && zi_dec_is_nil(v[1])) { /* absent or nil */
            if (m->tool_calls.len) {
                m->content_null = true;
                if (zi_string_set(&m->content, "", 0, NULL))
                    rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
            } else {
                rc = v[1] ? zi_dec_fail_at(d, "content", ZI_EINVAL,
                                           "may be null only in an assistant message with "
                                           "tool_calls")
                          : zi_dec_missing(d, "content");
            }
        } else if (!rc) {
            size_t o2 = zi_dec_push_key(d, "content");
            rc = dec_content(d, v[1], &m->content);
            zi_dec_pop(d, o2);
        }
        zi_dec_pop(d, old);
        if (rc) return rc;
    }
    return ZI_OK;
}

/* images: a list of bin, then the markers counted against it (the
 * tokenizer process splits the text at them, one image each). */
static int dec_images(zi_dec *d, const msgpack_object *o, zi_request *r) {
    int rc = zi_dec_sized(d, o, MSGPACK_OBJECT_ARRAY, "an array of bytes (msgpack bin)", "images",
                          d->lim->max_images);
    if (rc) return rc;
    uint32_t n = o->via.array.size;
    if (!n) return ZI_OK; /* asks for nothing */
    if (!(r->images = calloc(n, sizeof *r->images)))
        return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; i < n && !rc; i++) {
        const msgpack_object *b = &o->via.array.ptr[i];
        size_t old = zi_dec_push_idx(d, i);
        if (b->type != MSGPACK_OBJECT_BIN)
            rc = zi_dec_wrong_type(d, b, "bytes (msgpack bin)");
        else if (b->via.bin.size == 0)
            rc = zi_dec_fail(d, ZI_EINVAL, "an empty image");
        else if (b->via.bin.size > d->lim->max_image_bytes)
            rc = zi_dec_fail(d, ZI_EINVAL, "%u bytes exceed the limit of %zu bytes per image",
                             b->via.bin.size, d->lim->max_image_bytes);
        else if (zi_bytes_set(&r->images[i], b->via.bin.ptr, b->via.bin.size, NULL))
            rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
        else
            r->n_images = i + 1;
        zi_dec_pop(d, old);
    }
    if (rc) return rc;
    if (r->prompt_kind == ZI_PROMPT_TOKENS)
        return zi_dec_fail(d, ZI_EINVAL,
                           "a prompt of token ids cannot place images: send a text prompt with "
                           "one " ZI_MEDIA_MARKER " marker per image, or messages");
    size_t k = 0;
    const char *where = "the prompt holds";
    if (r->prompt_kind == ZI_PROMPT_TEXT) {
        k = zi_media_marker_count(r->prompt_text.p, r->prompt_text.len);
    } else {
        where = "the messages' contents hold";
        for (size_t i = 0; i < r->n_messages; i++)
            k += zi_media_marker_count(r->messages[i].content.p, r->messages[i].content.len);
    }
    if (k != n)
        return zi_dec_fail(d, ZI_EINVAL,
                           "%u image%s, but %s %zu " ZI_MEDIA_MARKER
                           " marker%s (one marks where each image goes)",
                           n, n == 1 ? "" : "s", where, k, k == 1 ? "" : "s");
    return ZI_OK;
}

static int dec_request(zi_dec *d, const msgpack_object *o, zi_request *r) {
    static const char *const names[] = {"op",
                                        "id",
                                        "index",
                                        "model_name",
                                        "prompt",
                                        "messages",
                                        "images",
                                        "tools",
                                        "response_format",
                                        "timestamp_ns",
                                        "request_path",
                                        "logprobs",
                                        "echo",
                                        "stop",
                                        "chat_template_options",
                                        "sampling_params",
                                        "stream",
                                        "grammar",
                                        "regex",
                                        "timeout_ms",
                                        "max_thinking_tokens",
                                        "skip_special_tokens",
                                        "lora",
                                        "keep_alive",
                                        "input",
                                        "voice",
                                        "format",
                                        "audio_prompt_transcription",
                                        "audio_prompt_tokens",
                                        "audio_prompt_word_codes"};
    enum { N = sizeof names / sizeof names[0] };
    enum {
        OP,
        ID,
        INDEX,
        MODEL,
        PROMPT,
        MESSAGES,
        IMAGES,
        TOOLS,
        RFMT,
        TS,
        PATH,
        LOGPROBS,
        ECHO,
        STOP,
        CTO,
        SP,
        STREAM,
        GRAMMAR,
        REGEX,
        TIMEOUT,
        THINKING,
        SKIPSPECIAL,
        LORA,
        KEEPALIVE,
        INPUT,
        VOICE,
        FORMAT,
        APTEXT,
        APTOKENS,
        APWORDS
    };
    const msgpack_object *v[N];
    zi_request_init(r);
    int rc = zi_dec_read_map(d, o, names, N, 0, v);
    if (rc) return rc;
    if (v[OP]) {
        size_t old = zi_dec_push_key(d, "op");
        rc = zi_dec_check_str(d, v[OP], ZI_STR_ID);
        r->speech = !rc && zi_dec_is_key(v[OP], "speech");
        if (!rc && !r->speech && !zi_dec_is_key(v[OP], "generate"))
            rc = zi_dec_fail(d, ZI_EINVAL, "a request's op must be \"generate\" or \"speech\"");
        zi_dec_pop(d, old);
        if (rc) goto fail;
    }
    /* speech: "input" is its prompt; what shapes a text completion is refused */
    static const int not_speech[] = {PROMPT,   MESSAGES, IMAGES,  TOOLS, RFMT,     ECHO,
                                     LOGPROBS, STOP,     GRAMMAR, REGEX, THINKING, CTO};
    for (size_t i = 0; r->speech && i < sizeof not_speech / sizeof *not_speech; i++) {
        const msgpack_object *x = v[not_speech[i]];
        /* false and 0 are the defaults (the router's encode writes them) */
        bool off = zi_dec_is_nil(x) || (x->type == MSGPACK_OBJECT_BOOLEAN && !x->via.boolean) ||
                   (x->type == MSGPACK_OBJECT_POSITIVE_INTEGER && x->via.u64 == 0);
        if (!off) {
            rc =
                zi_dec_fail_at(d, names[not_speech[i]], ZI_EINVAL, "not taken by a speech request");
            goto fail;
        }
    }
    const int only_speech[] = {INPUT, VOICE, FORMAT, APTEXT, APTOKENS, APWORDS};
    for (size_t i = 0; !r->speech && i < 6; i++)
        if (!zi_dec_is_nil(v[only_speech[i]])) {
            rc = zi_dec_fail_at(d, names[only_speech[i]], ZI_EINVAL,
                                "only taken by a speech request (op \"speech\")");
            goto fail;
        }
    if (r->speech) {
        if (zi_dec_is_nil(v[INPUT])) {
            rc = zi_dec_missing(d, "input");
            goto fail;
        }
        AT(d, "input", zi_dec_str(d, v[INPUT], ZI_STR_NO_NUL, &r->prompt_text));
        if (!r->prompt_text.len) {
            rc = zi_dec_fail_at(d, "input", ZI_EINVAL, "the text is empty");
            goto fail;
        }
        r->prompt_kind = ZI_PROMPT_TEXT;
        if (!zi_dec_is_nil(v[VOICE]))
            AT(d, "voice",
               zi_dec_str(d, v[VOICE], ZI_STR_ID | ZI_STR_NO_NUL | ZI_STR_NONEMPTY, &r->voice));
        /* the seeds' speaker prompt: all three or none, not with a voice */
        int n_ap =
            !zi_dec_is_nil(v[APTEXT]) + !zi_dec_is_nil(v[APTOKENS]) + !zi_dec_is_nil(v[APWORDS]);
        if (n_ap && (n_ap < 3 || r->voice.len)) {
            rc = zi_dec_fail_at(d, "audio_prompt_transcription", ZI_EINVAL,
                                "a speaker prompt needs audio_prompt_transcription, "
                                "audio_prompt_tokens and audio_prompt_word_codes, and no voice");
            goto fail;
        }
        if (n_ap) {
            AT(d, "audio_prompt_transcription",
               zi_dec_str(d, v[APTEXT], ZI_STR_NO_NUL | ZI_STR_NONEMPTY, &r->ap_text));
            AT(d, "audio_prompt_tokens", zi_dec_i32_list(d, v[APTOKENS], &r->ap_tokens));
            AT(d, "audio_prompt_word_codes", zi_dec_i32_list(d, v[APWORDS], &r->ap_word_codes));
        }
        if (!zi_dec_is_nil(v[FORMAT])) {
            size_t old = zi_dec_push_key(d, "format");
            rc = zi_dec_check_str(d, v[FORMAT], ZI_STR_ID);
            if (!rc && !zi_dec_is_key(v[FORMAT], "f32") && !zi_dec_is_key(v[FORMAT], "s16"))
                rc = zi_dec_fail(d, ZI_EINVAL, "must be \"f32\" or \"s16\"");
            r->speech_format = !rc && zi_dec_is_key(v[FORMAT], "s16");
            zi_dec_pop(d, old);
            if (rc) goto fail;
        }
    }
    if (!v[ID]) {
        rc = zi_dec_missing(d, "id");
        goto fail;
    }
    AT(d, "id", zi_dec_str(d, v[ID], ZI_STR_ID | ZI_STR_NO_NUL | ZI_STR_NONEMPTY, &r->id));
    if (v[INDEX]) AT(d, "index", zi_dec_i64(d, v[INDEX], 0, INT64_MAX, &r->index));
    if (!zi_dec_is_nil(v[MODEL]))
        AT(d, "model_name", zi_dec_str(d, v[MODEL], ZI_STR_ID | ZI_STR_NO_NUL, &r->model_name));
    if (!zi_dec_is_nil(v[PROMPT])) {
        if (v[PROMPT]->type == MSGPACK_OBJECT_STR) {
            AT(d, "prompt", zi_dec_str(d, v[PROMPT], ZI_STR_NONEMPTY, &r->prompt_text));
            r->prompt_kind = ZI_PROMPT_TEXT;
        } else {
            AT(d, "prompt", zi_dec_i32_list(d, v[PROMPT], &r->prompt_tokens));
            r->prompt_kind = ZI_PROMPT_TOKENS;
            if (r->prompt_tokens.n == 0) {
                rc = zi_dec_fail_at(d, "prompt", ZI_EINVAL, "must not be empty");
                goto fail;
            }
        }
    }
    if (!zi_dec_is_nil(v[MESSAGES])) AT(d, "messages", dec_messages(d, v[MESSAGES], r));
    if (!r->speech && (r->prompt_kind != ZI_PROMPT_NONE) == (r->n_messages > 0)) {
        rc = zi_dec_fail_at(d, "prompt", ZI_EINVAL,
                            "exactly one of prompt and messages is required");
        goto fail;
    }
    if (!zi_dec_is_nil(v[IMAGES])) AT(d, "images", dec_images(d, v[IMAGES], r));
    if (!zi_dec_is_nil(v[TOOLS])) {
        AT(d, "tools", dec_tools(d, v[TOOLS]));
        AT(d, "tools", zi_dec_opaque(d, v[TOOLS], MSGPACK_OBJECT_ARRAY, "an array", 2, &r->tools));
    }
    if (!zi_dec_is_nil(v[RFMT]))
        AT(d, "response_format",
           zi_dec_opaque(d, v[RFMT], MSGPACK_OBJECT_MAP, "a map", 2, &r->response_format));
    if (!zi_dec_is_nil(v[GRAMMAR])) {
        AT(d, "grammar", zi_dec_str(d, v[GRAMMAR], ZI_STR_NONEMPTY, &r->grammar));
        if (r->response_format.len) {
            rc = zi_dec_fail_at(d, "grammar", ZI_EINVAL,
                                "cannot be combined with response_format (give one of them)");
            goto fail;
        }
    }
    if (!zi_dec_is_nil(v[REGEX])) {
        AT(d, "regex", zi_dec_str(d, v[REGEX], ZI_STR_NONEMPTY, &r->regex));
        if (r->response_format.len || r->grammar.len) {
            rc = zi_dec_fail_at(d, "regex", ZI_EINVAL,
                                "cannot be combined with response_format or grammar (give one of "
                                "them)");
            goto fail;
        }
    }
    if (v[TS]) AT(d, "timestamp_ns", zi_dec_i64(d, v[TS], 0, INT64_MAX, &r->timestamp_ns));
    if (!zi_dec_is_nil(v[TIMEOUT]))
        AT(d, "timeout_ms", zi_dec_i64(d, v[TIMEOUT], 1, ZI_MAX_TIMEOUT_MS, &r->timeout_ms));
    if (!zi_dec_is_nil(v[KEEPALIVE])) { /* Ollama's: seconds, or "5m"; negative: forever */
        const msgpack_object *ka = v[KEEPALIVE];
        zi_error ke = {0};
        int krc;
        if (ka->type == MSGPACK_OBJECT_STR)
            krc = zi_duration_parse(ka->via.str.ptr, ka->via.str.size, "keep_alive",
                                    &r->keep_alive_ms, &ke);
        else if (ka->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            krc = zi_duration_seconds((double)ka->via.u64, "keep_alive", &r->keep_alive_ms, &ke);
        else if (ka->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            krc = zi_duration_seconds((double)ka->via.i64, "keep_alive", &r->keep_alive_ms, &ke);
        else if (ka->type == MSGPACK_OBJECT_FLOAT32 || ka->type == MSGPACK_OBJECT_FLOAT64)
            krc = zi_duration_seconds(ka->via.f64, "keep_alive", &r->keep_alive_ms, &ke);
        else
            krc = zi_error_set(&ke, ZI_EINVAL,
                               "keep_alive: a number of seconds or a duration string");
        if (krc) {
            rc = zi_dec_fail_at(d, "keep_alive", ZI_EINVAL, "%s", ke.msg + strlen("keep_alive: "));
            goto fail;
        }
        r->has_keep_alive = true;
    }
    if (v[SKIPSPECIAL])
        AT(d, "skip_special_tokens", zi_dec_bool(d, v[SKIPSPECIAL], &r->skip_special_tokens));
    if (!zi_dec_is_nil(v[LORA])) AT(d, "lora", dec_lora(d, v[LORA], r->lora, &r->n_lora));
    if (!zi_dec_is_nil(v[THINKING]))
        AT(d, "max_thinking_tokens",
           zi_dec_i64(d, v[THINKING], 1, ZI_MAX_THINKING_TOKENS, &r->max_thinking_tokens));
    if (v[PATH])
        AT(d, "request_path", zi_dec_str(d, v[PATH], ZI_STR_ID | ZI_STR_NO_NUL, &r->request_path));
    if (v[LOGPROBS])
        AT(d, "logprobs", zi_dec_i64(d, v[LOGPROBS], 0, d->lim->max_logprobs, &r->logprobs));
    if (v[ECHO]) AT(d, "echo", zi_dec_bool(d, v[ECHO], &r->echo));
    if (!zi_dec_is_nil(v[STOP]))
        AT(d, "stop", zi_dec_str_list(d, v[STOP], ZI_STR_NONEMPTY, true, &r->stop));
    if (!zi_dec_is_nil(v[CTO]))
        AT(d, "chat_template_options",
           zi_dec_opaque(d, v[CTO], MSGPACK_OBJECT_MAP, "a map", 2, &r->chat_template_options));
    if (!zi_dec_is_nil(v[SP]))
        AT(d, "sampling_params", dec_sampling(d, v[SP], &r->sampling_params));
    if (v[STREAM]) AT(d, "stream", zi_dec_bool(d, v[STREAM], &r->stream));
    if (r->speech && !r->stream) { /* its audio comes in chunks only */
        rc = zi_dec_fail_at(d, "stream", ZI_EINVAL,
                            "a speech request streams its audio in chunks (must be true)");
        goto fail;
    }
    /* Only the chat template reads tools and options: with a prompt they
     * would be ignored, so they are refused (empty ones are nothing). */
    if (r->prompt_kind != ZI_PROMPT_NONE) {
        const char *which = !zi_dec_is_nil(v[TOOLS]) && v[TOOLS]->via.array.size ? "tools"
                            : !zi_dec_is_nil(v[CTO]) && v[CTO]->via.map.size
                                ? "chat_template_options"
                                : NULL;
        if (which) {
            rc = zi_dec_fail_at(d, which, ZI_EINVAL,
                                "only used with messages (the chat template renders them); "
                                "this request has a prompt");
            goto fail;
        }
    }
    return ZI_OK;
fail:
    zi_request_free(r);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_request, zi_request, "request", dec_request)

static int dec_logprobs(zi_dec *d, const msgpack_object *o, zi_logprobs *lp) {
    static const char *const names[] = {"token_log_probabilities", "top_log_probabilities"};
    const msgpack_object *v[2];
    zi_logprobs_init(lp);
    float *tl = NULL;
    size_t n = 0;
    int rc = zi_dec_read_map(d, o, names, 2, 2, v);
    if (rc) return rc;
    AT(d, names[0], zi_dec_f32(d, v[0], &tl, &n));
    for (size_t i = 0; i < n; i++) {
        if (isnan(tl[i]) || (isinf(tl[i]) && tl[i] > 0)) {
            size_t old = zi_dec_push_key(d, names[0]);
            size_t o2 = zi_dec_push_idx(d, i);
            rc = zi_dec_fail(d, ZI_EINVAL, "%g is not a log probability", (double)tl[i]);
            zi_dec_pop(d, o2);
            zi_dec_pop(d, old);
            goto fail;
        }
    }
    {
        size_t old = zi_dec_push_key(d, names[1]);
        const msgpack_object *t = v[1];
        if (t->type != MSGPACK_OBJECT_ARRAY)
            rc = zi_dec_wrong_type(d, t, "an array of maps");
        else if (t->via.array.size != n)
            rc = zi_dec_fail(d, ZI_EINVAL, "%u entries, but token_log_probabilities has %zu",
                             t->via.array.size, n);
        for (size_t i = 0; i < n && !rc; i++) {
            size_t o2 = zi_dec_push_idx(d, i);
            const msgpack_object *m = &t->via.array.ptr[i];
            int32_t *ids = NULL;
            float *lps = NULL;
            uint32_t k = 0;
            rc = zi_dec_sized(d, m, MSGPACK_OBJECT_MAP, "a map of token id to log probability",
                              "entries", d->lim->max_items);
            if (!rc && m->via.map.size) {
                ids = malloc(m->via.map.size * sizeof *ids);
                lps = malloc(m->via.map.size * sizeof *lps);
                if (!ids || !lps) rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
            }
            for (; !rc && k < m->via.map.size; k++) {
                int64_t id;
                double x = 0;
                if ((rc = zi_dec_i64(d, &m->via.map.ptr[k].key, 0, INT32_MAX, &id))) break;
                for (uint32_t j = 0; j < k && !rc; j++)
                    if (ids[j] == (int32_t)id)
                        rc =
                            zi_dec_fail(d, ZI_EINVAL, "token id %lld appears twice", (long long)id);
                if (rc) break;
                char key[32];
                snprintf(key, sizeof key, "%lld", (long long)id);
                size_t o3 = zi_dec_push_key(d, key);
                rc = zi_dec_f64(d, &m->via.map.ptr[k].val, &x);
                if (!rc && (isnan(x) || (isinf(x) && x > 0)))
                    rc = zi_dec_fail(d, ZI_EINVAL, "%g is not a log probability", x);
                zi_dec_pop(d, o3);
                ids[k] = (int32_t)id;
                lps[k] = (float)x;
            }
            if (!rc && zi_logprobs_push(lp, tl[i], ids, lps, k, NULL))
                rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
            zi_dec_pop(d, o2);
            free(ids);
            free(lps);
        }
        zi_dec_pop(d, old);
        if (rc) goto fail;
    }
    free(tl);
    return ZI_OK;
fail:
    free(tl);
    zi_logprobs_free(lp);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_logprobs, zi_logprobs, "log_probabilities", dec_logprobs)

/* A LogProbabilities map or nil into a fresh heap object (*out NULL for nil). */
static int dec_logprobs_opt(zi_dec *d, const msgpack_object *o, zi_logprobs **out) {
    *out = NULL;
    if (zi_dec_is_nil(o)) return ZI_OK;
    zi_logprobs *lp = malloc(sizeof *lp);
    if (!lp) return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    int rc = dec_logprobs(d, o, lp);
    if (rc) {
        free(lp);
        return rc;
    }
    *out = lp;
    return ZI_OK;
}

static int dec_text_response(zi_dec *d, const msgpack_object *o, zi_text_response *r) {
    static const char *const names[] = {"next_token", "log_probabilities"};
    const msgpack_object *v[2];
    zi_text_response_init(r);
    int rc = zi_dec_read_map(d, o, names, 2, 1, v);
    if (rc) return rc;
    if (v[0]->type == MSGPACK_OBJECT_STR) {
        AT(d, "next_token", zi_dec_str(d, v[0], 0, &r->text));
        r->is_text = true;
    } else {
        int64_t t = 0;
        size_t old = zi_dec_push_key(d, "next_token");
        if (v[0]->type != MSGPACK_OBJECT_POSITIVE_INTEGER &&
            v[0]->type != MSGPACK_OBJECT_NEGATIVE_INTEGER)
            rc = zi_dec_wrong_type(d, v[0], "a token id or a string");
        else
            rc = zi_dec_i64(d, v[0], 0, INT32_MAX, &t);
        zi_dec_pop(d, old);
        if (rc) goto fail;
        r->token = (int32_t)t;
    }
    if (v[1]) AT(d, "log_probabilities", dec_logprobs_opt(d, v[1], &r->logprobs));
    return ZI_OK;
fail:
    zi_text_response_free(r);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_text_response, zi_text_response, "text_response", dec_text_response)

static int get_status(zi_dec *d, const msgpack_object *o, zi_gen_status *out) {
    int rc = zi_dec_check_str(d, o, ZI_STR_ID);
    if (rc) return rc;
    if (zi_gen_status_parse(o->via.str.ptr, o->via.str.size, out, NULL)) {
        char nm[80];
        zi_printable(nm, sizeof nm, o->via.str.ptr, o->via.str.size);
        return zi_dec_fail(
            d, ZI_EINVAL,
            "\"%s\" is not a status (active, end_of_sequence, maximum_length, stop, cancelled, "
            "deadline_exceeded)",
            nm);
    }
    return ZI_OK;
}

static int dec_tgr(zi_dec *d, const msgpack_object *o, zi_text_generation_response *r) {
    static const char *const names[] = {"tokens", "final_status"};
    const msgpack_object *v[2];
    zi_text_generation_response_init(r);
    int rc = zi_dec_read_map(d, o, names, 2, 2, v);
    if (rc) return rc;
    AT(d, "final_status", get_status(d, v[1], &r->final_status));
    {
        size_t old = zi_dec_push_key(d, "tokens");
        const msgpack_object *t = v[0];
        rc = zi_dec_sized(d, t, MSGPACK_OBJECT_ARRAY, "an array", "responses", d->lim->max_tokens);
        if (!rc && t->via.array.size && !(r->tokens = calloc(t->via.array.size, sizeof *r->tokens)))
            rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
        for (uint32_t i = 0; !rc && i < t->via.array.size; i++) {
            size_t o2 = zi_dec_push_idx(d, i);
            rc = dec_text_response(d, &t->via.array.ptr[i], &r->tokens[i]);
            if (!rc) r->n = i + 1;
            zi_dec_pop(d, o2);
        }
        zi_dec_pop(d, old);
        if (rc) goto fail;
    }
    return ZI_OK;
fail:
    zi_text_generation_response_free(r);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_text_generation_response, zi_text_generation_response,
               "text_generation_response", dec_tgr)

/* The TextContext keys, in the order of the C_ indices (codec_internal.h):
 * the seed dataclass's field names (private ones keep their underscore),
 * plus request_id. */
static const char *const ctx_names[C_N] = {"request_id",
                                           "prompt",
                                           "max_length",
                                           "tokens",
                                           "eos_token_ids",
                                           "eos_sequences",
                                           "log_probabilities",
                                           "log_probabilities_echo",
                                           "ignore_eos",
                                           "json_schema",
                                           "sampling_params",
                                           "_matcher",
                                           "_status",
                                           "_cache_seq_id",
                                           "_size",
                                           "_start_idx",
                                           "_active_idx",
                                           "_end_idx",
                                           "_completion_start_idx",
                                           "_completion_end_idx",
                                           "_prompt_len",
                                           "_committed_idx",
                                           "_log_probabilities_data",
                                           "_is_initial_prompt",
                                           "_draft_offset",
                                           "grammar",
                                           "regex",
                                           "thinking_budget",
                                           "thinking_open",
                                           "thinking_end",
                                           "thinking_harmony",
                                           "images",
                                           "lora",
                                           "tts"};

/* An index field: absent or -1 means "derive" (returned as -1). */
static int get_idx(zi_dec *d, const msgpack_object *o, const char *name, int64_t *out) {
    *out = -1;
    if (!o) return ZI_OK;
    size_t old = zi_dec_push_key(d, name);
    int rc = zi_dec_i64(d, o, -1, INT32_MAX, out);
    zi_dec_pop(d, old);
    return rc;
}

/* dec_context's phases, in the order the fields are read (so the first
 * error a context holds is the one reported). v is zi_dec_read_map's value array,
 * indexed by the C_ names; on failure the caller frees the context. */

/* request_id, the original prompt, max_length, and the tokens sent
 * (*toks, malloc'd, copied into the context by ctx_window). */
static int ctx_tokens(zi_dec *d, const msgpack_object *const *v, zi_text_context *c, int32_t **toks,
                      size_t *ntok) {
    int rc = ZI_OK;
    if (!zi_dec_is_nil(v[C_RID]))
        AT(d, "request_id", zi_dec_str(d, v[C_RID], ZI_STR_ID | ZI_STR_NO_NUL, &c->request_id));
    if (!zi_dec_is_nil(v[C_PROMPT])) {
        /* The original prompt: text is kept; token ids are already the
         * start of `tokens`, so they are only checked. */
        if (v[C_PROMPT]->type == MSGPACK_OBJECT_STR)
            AT(d, "prompt", zi_dec_str(d, v[C_PROMPT], 0, &c->prompt));
        else {
            int32_t *p = NULL;
            size_t pn = 0;
            AT(d, "prompt", zi_dec_tokens(d, v[C_PROMPT], &p, &pn));
            free(p);
        }
    }
    AT(d, "max_length", zi_dec_i64(d, v[C_MAXLEN], 1, INT32_MAX, &c->max_length));
    /* any int32: images' keys are negative (checked against the images) */
    AT(d, "tokens", zi_dec_tokens_any(d, v[C_TOKENS], toks, ntok));
fail:
    return rc;
}

/* What ends generation besides the length: eos_token_ids and
 * eos_sequences. */
static int ctx_eos(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    int rc = ZI_OK;
    if (!zi_dec_is_nil(v[C_EOS])) {
        zi_i32_list l = {NULL, 0};
        AT(d, "eos_token_ids", zi_dec_i32_list(d, v[C_EOS], &l));
        rc = zi_text_context_set_eos(c, l.v, l.n, NULL);
        zi_i32_list_free(&l);
        if (rc) return zi_dec_fail_at(d, "eos_token_ids", rc, "out of memory");
    }
    if (!zi_dec_is_nil(v[C_EOSSEQ])) {
        size_t old = zi_dec_push_key(d, "eos_sequences");
        const msgpack_object *s = v[C_EOSSEQ];
        rc = zi_dec_sized(d, s, MSGPACK_OBJECT_ARRAY, "an array of token id arrays", "sequences",
                          d->lim->max_items);
        for (uint32_t i = 0; !rc && i < s->via.array.size; i++) {
            size_t o2 = zi_dec_push_idx(d, i);
            int32_t *q = NULL;
            size_t qn = 0;
            rc = zi_dec_tokens(d, &s->via.array.ptr[i], &q, &qn);
            if (!rc && qn == 0) rc = zi_dec_fail(d, ZI_EINVAL, "empty sequence");
            if (!rc && zi_text_context_add_eos_sequence(c, q, qn, NULL))
                rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
            free(q);
            zi_dec_pop(d, o2);
        }
        zi_dec_pop(d, old);
    }
fail:
    return rc;
}

/* The request's options: log probabilities, ignore_eos, the JSON schema,
 * the sampling parameters, and the state that travels with them (no
 * matcher; the status; the cache sequence). */
static int ctx_options(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    int rc = ZI_OK;
    if (!zi_dec_is_nil(v[C_LP]))
        AT(d, "log_probabilities",
           zi_dec_i64(d, v[C_LP], 0, d->lim->max_logprobs, &c->log_probabilities));
    if (v[C_LPECHO])
        AT(d, "log_probabilities_echo", zi_dec_bool(d, v[C_LPECHO], &c->log_probabilities_echo));
    if (v[C_IGNEOS]) AT(d, "ignore_eos", zi_dec_bool(d, v[C_IGNEOS], &c->ignore_eos));
    if (!zi_dec_is_nil(v[C_SCHEMA])) {
        AT(d, "json_schema", zi_dec_str(d, v[C_SCHEMA], 0, &c->json_schema));
        c->has_json_schema = true;
    }
    if (!zi_dec_is_nil(v[C_GRAMMAR])) {
        AT(d, "grammar", zi_dec_str(d, v[C_GRAMMAR], ZI_STR_NONEMPTY, &c->grammar));
        if (c->has_json_schema)
            return zi_dec_fail_at(d, "grammar", ZI_EINVAL, "cannot be combined with json_schema");
    }
    if (!zi_dec_is_nil(v[C_REGEX])) {
        AT(d, "regex", zi_dec_str(d, v[C_REGEX], ZI_STR_NONEMPTY, &c->regex));
        if (c->has_json_schema || c->grammar.len)
            return zi_dec_fail_at(d, "regex", ZI_EINVAL,
                                  "cannot be combined with json_schema or grammar");
    }
    if (!zi_dec_is_nil(v[C_SP]))
        AT(d, "sampling_params", dec_sampling(d, v[C_SP], &c->sampling_params));
    if (!zi_dec_is_nil(v[C_THINK])) {
        AT(d, "thinking_budget",
           zi_dec_i64(d, v[C_THINK], 0, ZI_MAX_THINKING_TOKENS, &c->thinking_budget));
        if (v[C_THINK_OPEN])
            AT(d, "thinking_open", zi_dec_bool(d, v[C_THINK_OPEN], &c->thinking_open));
        if (!zi_dec_is_nil(v[C_THINK_END]))
            AT(d, "thinking_end", zi_dec_i32_list(d, v[C_THINK_END], &c->thinking_end));
        if (v[C_THINK_HARMONY])
            AT(d, "thinking_harmony",
               zi_dec_bool(d, v[C_THINK_HARMONY], &c->thinking_harmony));
        if (c->thinking_budget && !c->thinking_end.n)
            return zi_dec_fail_at(d, "thinking_end", ZI_EINVAL,
                                  "a thinking budget needs the ids that end the section");
    }
    if (!zi_dec_is_nil(v[C_LORA])) AT(d, "lora", dec_lora(d, v[C_LORA], c->lora, &c->n_lora));
    if (!zi_dec_is_nil(v[C_MATCHER]))
        return zi_dec_fail_at(d, "_matcher", ZI_EINVAL,
                              "a grammar matcher cannot travel (must be nil)");
    if (v[C_STATUS]) AT(d, "_status", get_status(d, v[C_STATUS], &c->status));
    if (!zi_dec_is_nil(v[C_CACHE]))
        AT(d, "_cache_seq_id", zi_dec_i64(d, v[C_CACHE], 0, INT64_MAX, &c->cache_seq_id));
fail:
    return rc;
}

/* The index fields, derived where absent as the seed's __post_init__ does
 * and checked against the ntok tokens sent; then toks[0, _end_idx) copied
 * into room for whole chunks (padding beyond _end_idx is dropped). */
static int ctx_window(zi_dec *d, const msgpack_object *const *v, zi_text_context *c,
                      const int32_t *toks, size_t ntok) {
    int64_t size = -1, start, active, end, cstart, cend, plen, commit;
    int rc;
    if ((rc = get_idx(d, v[C_SIZE], "_size", &size))) return rc;
    if ((rc = get_idx(d, v[C_START], "_start_idx", &start))) return rc;
    if ((rc = get_idx(d, v[C_ACTIVE], "_active_idx", &active))) return rc;
    if ((rc = get_idx(d, v[C_END], "_end_idx", &end))) return rc;
    if ((rc = get_idx(d, v[C_CSTART], "_completion_start_idx", &cstart))) return rc;
    if ((rc = get_idx(d, v[C_CEND], "_completion_end_idx", &cend))) return rc;
    if ((rc = get_idx(d, v[C_PLEN], "_prompt_len", &plen))) return rc;
    if ((rc = get_idx(d, v[C_COMMIT], "_committed_idx", &commit))) return rc;
    if (start < 0) start = 0;
    if (commit < 0) commit = 0;
    if (active < 0) active = (int64_t)ntok;
    if (end < 0) end = active;
    if (cstart < 0) cstart = active;
    if (cend < 0) cend = active;
    if (plen < 0) plen = active;
    if (end > (int64_t)ntok)
        return zi_dec_fail_at(d, "_end_idx", ZI_EINVAL, "%lld is beyond the %zu tokens sent",
                              (long long)end, ntok);
    if (size >= 0 && size < end)
        return zi_dec_fail_at(d, "_size", ZI_EINVAL, "%lld is below _end_idx %lld", (long long)size,
                              (long long)end);
    if (end < 1)
        return zi_dec_fail_at(d, "tokens", ZI_EINVAL, "a context needs at least one token");
    int64_t cap = (end + ZI_CTX_CHUNK - 1) / ZI_CTX_CHUNK * ZI_CTX_CHUNK;
    c->tokens = calloc((size_t)cap, sizeof *c->tokens);
    c->lp_data = calloc((size_t)cap, sizeof *c->lp_data);
    if (!c->tokens || !c->lp_data) return zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    c->size = cap;
    memcpy(c->tokens, toks, (size_t)end * sizeof *toks);
    c->start_idx = start;
    c->active_idx = active;
    c->end_idx = end;
    c->completion_start_idx = cstart;
    c->completion_end_idx = cend;
    c->prompt_len = plen;
    c->committed_idx = commit;
    return ZI_OK;
}

/* _log_probabilities_data: token index (below _end_idx, each once) to
 * that token's log probabilities or nil. */
static int ctx_lp_data(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    if (zi_dec_is_nil(v[C_LPDATA])) return ZI_OK;
    int rc = ZI_OK;
    size_t old = zi_dec_push_key(d, "_log_probabilities_data");
    const msgpack_object *m = v[C_LPDATA];
    if (m->type != MSGPACK_OBJECT_MAP)
        rc = zi_dec_wrong_type(d, m, "a map of token index to log probabilities");
    for (uint32_t i = 0; !rc && i < m->via.map.size; i++) {
        int64_t idx;
        rc = zi_dec_i64(d, &m->via.map.ptr[i].key, 0, c->end_idx - 1, &idx);
        if (rc) break;
        char key[32];
        snprintf(key, sizeof key, "%lld", (long long)idx);
        size_t o2 = zi_dec_push_key(d, key);
        if (c->lp_data[idx])
            rc = zi_dec_fail(d, ZI_EINVAL, "index appears twice");
        else
            rc = dec_logprobs_opt(d, &m->via.map.ptr[i].val, &c->lp_data[idx]);
        zi_dec_pop(d, o2);
    }
    zi_dec_pop(d, old);
    return rc;
}

/* The prompt flag and the draft offset (speculative decoding's state). */
static int ctx_state(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    int rc = ZI_OK;
    if (v[C_INIT]) AT(d, "_is_initial_prompt", zi_dec_bool(d, v[C_INIT], &c->is_initial_prompt));
    if (v[C_DRAFT])
        AT(d, "_draft_offset", zi_dec_i64(d, v[C_DRAFT], 0, INT32_MAX, &c->draft_offset));
fail:
    return rc;
}

static const char *const image_names[] = {"hash",       "n_tiles",    "tile_size", "tile_tokens",
                                          "tile_first", "non_causal", "pixels"};
enum { I_HASH, I_NTILES, I_SIZE, I_TOKENS, I_FIRST, I_NONCAUSAL, I_PIXELS, I_N };

/* One image of a context (types.h's zi_ctx_image): all fields required;
 * tile_first as many positions as tiles, pixels exactly n_tiles *
 * tile_size^2 * 3 float32 little-endian bytes, all finite, hashing to
 * hash. Positions are judged against the prompt afterwards
 * (zi_text_context_check). */
static int dec_image(zi_dec *d, const msgpack_object *o, zi_ctx_image *im) {
    const msgpack_object *v[I_N];
    int rc = zi_dec_read_map(d, o, image_names, I_N, I_N, v);
    if (rc) return rc;
    if (v[I_HASH]->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
        size_t old = zi_dec_push_key(d, "hash");
        rc = v[I_HASH]->type == MSGPACK_OBJECT_NEGATIVE_INTEGER
                 ? zi_dec_fail(d, ZI_EINVAL, "%lld is negative (a uint64)",
                               (long long)v[I_HASH]->via.i64)
                 : zi_dec_wrong_type(d, v[I_HASH], "an unsigned 64-bit integer");
        zi_dec_pop(d, old);
        return rc;
    }
    im->hash = v[I_HASH]->via.u64;
    int64_t n_tiles, size, tokens;
    AT(d, "n_tiles", zi_dec_i64(d, v[I_NTILES], 1, (int64_t)d->lim->max_items, &n_tiles));
    AT(d, "tile_size", zi_dec_i64(d, v[I_SIZE], 1, ZI_CTX_IMAGE_MAX_SIDE, &size));
    AT(d, "tile_tokens", zi_dec_i64(d, v[I_TOKENS], 1, INT32_MAX, &tokens));
    im->n_tiles = (int32_t)n_tiles, im->tile_size = (int32_t)size;
    im->tile_tokens = (int32_t)tokens;
    AT(d, "non_causal", zi_dec_bool(d, v[I_NONCAUSAL], &im->non_causal));
    size_t nf = 0;
    AT(d, "tile_first", zi_dec_tokens(d, v[I_FIRST], &im->tile_first, &nf));
    if (nf != (size_t)n_tiles)
        return zi_dec_fail_at(d, "tile_first", ZI_EINVAL, "%zu positions for %lld tiles", nf,
                              (long long)n_tiles);
    /* counts below 2^13 squared times 2^12 tiles: no overflow in 64 bits */
    uint64_t n_pix = (uint64_t)n_tiles * (uint64_t)size * (uint64_t)size * 3;
    size_t old = zi_dec_push_key(d, "pixels");
    const msgpack_object *px = v[I_PIXELS];
    if (px->type != MSGPACK_OBJECT_BIN)
        rc = zi_dec_wrong_type(d, px, "bytes (msgpack bin of float32)");
    else if ((uint64_t)px->via.bin.size != n_pix * 4)
        rc = zi_dec_fail(d, ZI_EINVAL,
                         "%u bytes, but %lld tiles of %lld x %lld x 3 float32 are %llu bytes",
                         px->via.bin.size, (long long)n_tiles, (long long)size, (long long)size,
                         (unsigned long long)(n_pix * 4));
    else if (!(im->pixels = malloc((size_t)n_pix * sizeof *im->pixels)))
        rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory for %llu pixel values",
                         (unsigned long long)n_pix);
    for (size_t k = 0; !rc && k < (size_t)n_pix; k++) {
        const uint8_t *b = (const uint8_t *)px->via.bin.ptr + 4 * k;
        uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                     (uint32_t)b[3] << 24;
        memcpy(&im->pixels[k], &u, 4);
        if (!isfinite(im->pixels[k]))
            rc = zi_dec_fail(d, ZI_EINVAL, "value %zu is not finite", k);
    }
    zi_dec_pop(d, old);
    if (rc) return rc;
    if (zi_ctx_image_hash(im->pixels, (size_t)n_pix) != im->hash)
        return zi_dec_fail_at(d, "hash", ZI_EINVAL,
                              "does not match the pixels (zi_ctx_image_hash)");
fail:
    return rc;
}

/* images: a list of image maps (at most lim->max_images). */
static int ctx_images(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    if (zi_dec_is_nil(v[C_IMAGES])) return ZI_OK;
    const msgpack_object *a = v[C_IMAGES];
    size_t old = zi_dec_push_key(d, "images");
    int rc = zi_dec_sized(d, a, MSGPACK_OBJECT_ARRAY, "an array of images", "images",
                          d->lim->max_images);
    uint32_t n = rc ? 0 : a->via.array.size;
    if (n && !(c->images = calloc(n, sizeof *c->images)))
        rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
    for (uint32_t i = 0; !rc && i < n; i++) {
        size_t o2 = zi_dec_push_idx(d, i);
        c->n_images = i + 1; /* freed with the context on failure */
        rc = dec_image(d, &a->via.array.ptr[i], &c->images[i]);
        zi_dec_pop(d, o2);
    }
    zi_dec_pop(d, old);
    return rc;
}

/* "tts": {"ids": 8 ints, "words": [[ids]...] (1..4096 words, each 1..256
 * ids), "format": "f32" | "s16"}: a speech request's plan inputs. */
static int ctx_tts(zi_dec *d, const msgpack_object *const *v, zi_text_context *c) {
    if (zi_dec_is_nil(v[C_TTS])) return ZI_OK;
    static const char *const names[] = {"ids", "words", "format"};
    const msgpack_object *t[3];
    size_t old = zi_dec_push_key(d, "tts");
    int rc = zi_dec_read_map(d, v[C_TTS], names, 3, 3, t);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!rc) { /* any int32: code_start is -1 in OuteTTS 0.3 (the worker checks them) */
        size_t o2 = zi_dec_push_key(d, "ids");
        rc = zi_dec_tokens_any(d, t[0], &ids, &n_ids);
        if (!rc && n_ids != 8) rc = zi_dec_fail(d, ZI_EINVAL, "must hold 8 ids");
        for (size_t i = 0; !rc && i < 8; i++) c->tts_ids[i] = ids[i];
        zi_dec_pop(d, o2);
    }
    free(ids);
    if (!rc) {
        size_t o2 = zi_dec_push_key(d, "format");
        rc = zi_dec_check_str(d, t[2], ZI_STR_ID);
        if (!rc && (zi_dec_is_key(t[2], "f32") || zi_dec_is_key(t[2], "s16")))
            c->tts_format = zi_dec_is_key(t[2], "s16");
        else if (!rc)
            rc = zi_dec_fail(d, ZI_EINVAL, "must be \"f32\" or \"s16\"");
        zi_dec_pop(d, o2);
    }
    if (!rc) {
        size_t o2 = zi_dec_push_key(d, "words");
        rc = zi_dec_sized(d, t[1], MSGPACK_OBJECT_ARRAY, "an array", "words", ZI_TTS_MAX_WORDS);
        size_t n = rc ? 0 : t[1]->via.array.size;
        if (!rc && n == 0) rc = zi_dec_fail(d, ZI_EINVAL, "must not be empty");
        if (!rc && !(c->tts_words = calloc(n, sizeof *c->tts_words)))
            rc = zi_dec_fail(d, ZI_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < n; i++) {
            size_t o3 = zi_dec_push_idx(d, i);
            c->n_tts_words = i + 1;
            rc = zi_dec_i32_list(d, &t[1]->via.array.ptr[i], &c->tts_words[i]);
            if (!rc && (c->tts_words[i].n == 0 || c->tts_words[i].n > ZI_TTS_MAX_WORD_IDS))
                rc = zi_dec_fail(d, ZI_EINVAL, "a word must have 1 to %d ids", ZI_TTS_MAX_WORD_IDS);
            zi_dec_pop(d, o3);
        }
        zi_dec_pop(d, o2);
    }
    zi_dec_pop(d, old);
    return rc;
}

/* A TextContext: the fields phase by phase, then the context's own
 * invariants (zi_text_context_check, prefixed with the path). */
static int dec_context(zi_dec *d, const msgpack_object *o, zi_text_context *c) {
    const msgpack_object *v[C_N];
    zi_text_context_zero(c);
    int32_t *toks = NULL;
    size_t ntok = 0;
    int rc = zi_dec_read_map(d, o, ctx_names, C_N, 0, v);
    if (rc) return rc;
    /* Both required, tokens named first when neither is given. */
    if (!v[C_TOKENS]) return zi_dec_missing(d, "tokens");
    if (!v[C_MAXLEN]) return zi_dec_missing(d, "max_length");
    if ((rc = ctx_tokens(d, v, c, &toks, &ntok)) || (rc = ctx_eos(d, v, c)) ||
        (rc = ctx_options(d, v, c)) || (rc = ctx_window(d, v, c, toks, ntok)) ||
        (rc = ctx_lp_data(d, v, c)) || (rc = ctx_state(d, v, c)) || (rc = ctx_images(d, v, c)) ||
        (rc = ctx_tts(d, v, c)))
        goto fail;
    if ((rc = zi_text_context_check(c, d->err))) {
        if (d->path.n) zi_error_prefix(d->err, "%s", d->path.s);
        goto fail;
    }
    free(toks);
    return ZI_OK;
fail:
    free(toks);
    zi_text_context_free(c);
    return rc;
}

PUBLIC_DECODER(zi_codec_decode_text_context, zi_text_context, "context", dec_context)

/* Defines fn, a from-bytes decoder of codec.h: out starts empty (init),
 * then the bytes are pre-scanned and parsed and the one object decoded. */
#define FROM_BYTES(fn, type, root, init, decode)                                                   \
    int fn(const void *buf, size_t len, const zi_codec_limits *lim, type *out, zi_error *err) {    \
        if (!out) return zi_error_set(err, ZI_EINVAL, root ": NULL output");                       \
        init(out);                                                                                 \
        msgpack_unpacked u;                                                                        \
        int rc = zi_msgpack_parse(buf, len, lim, &u, err);                                         \
        if (rc) return rc;                                                                         \
        rc = decode(&u.data, lim, NULL, out, err);                                                 \
        msgpack_unpacked_destroy(&u);                                                              \
        return rc;                                                                                 \
    }

FROM_BYTES(zi_codec_request_from_bytes, zi_request, "request", zi_request_init,
           zi_codec_decode_request)
FROM_BYTES(zi_codec_text_context_from_bytes, zi_text_context, "context", zi_text_context_zero,
           zi_codec_decode_text_context)
