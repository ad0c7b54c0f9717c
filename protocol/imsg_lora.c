/*
 * imsg_lora.c - see imsg_lora.h.
 */
#include "imsg_lora.h"

#include <math.h>
#include <string.h>

#include "codec.h"

void zi_im_lora_names_put(zi_imap *b, const char *key, const char *const *names, size_t n) {
    msgpack_packer *pk = zi_imap_key(b, key);
    if (msgpack_pack_array(pk, n)) {
        zi_imap_fail(b);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const char *s = names[i] ? names[i] : "";
        if (msgpack_pack_str(pk, strlen(s)) || msgpack_pack_str_body(pk, s, strlen(s))) {
            zi_imap_fail(b);
            return;
        }
    }
}

int zi_im_lora_pack(const zi_im_lora *m, zi_msg *out) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "type", zi_im_type_name(ZI_IM_LORA));
    zi_imap_int(&b, "rid", m->rid);
    zi_imap_str(&b, "action", m->load ? "load" : "unload");
    zi_imap_strn(&b, "name", m->name.p ? m->name.p : "", m->name.n);
    if (m->load) {
        zi_imap_strn(&b, "path", m->path.p ? m->path.p : "", m->path.n);
        zi_imap_double(&b, "scale", m->scale);
    }
    return zi_imap_close_msg(&b, out);
}

int zi_im_lora_unpack(const msgpack_object *o, zi_im_lora *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->scale = 1.0;
    int rc = zi_im_rid(o, &m->rid, err);
    if (rc) return rc;
    if (zi_map_str_is(o, "action", "load"))
        m->load = true;
    else if (!zi_map_str_is(o, "action", "unload"))
        return zi_error_set(err, ZI_EINVAL, "action: not \"load\" or \"unload\"");
    m->name = zi_im_str_at(o, "name");
    if (!m->name.p || !m->name.n) return zi_error_set(err, ZI_EINVAL, "name: missing or empty");
    if (!m->load) return ZI_OK;
    m->path = zi_im_str_at(o, "path");
    if (!m->path.p || !m->path.n) return zi_error_set(err, ZI_EINVAL, "path: missing or empty");
    const msgpack_object *s = zi_map_get(o, "scale");
    if (s) {
        if (s->type == MSGPACK_OBJECT_FLOAT32 || s->type == MSGPACK_OBJECT_FLOAT64)
            m->scale = s->via.f64;
        else if (s->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            m->scale = (double)s->via.u64;
        else if (s->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            m->scale = (double)s->via.i64;
        else
            return zi_error_set(err, ZI_EINVAL, "scale: not a number");
        if (!isfinite(m->scale)) return zi_error_set(err, ZI_EINVAL, "scale: not finite");
    }
    return ZI_OK;
}

int zi_im_lora_done_pack(const zi_im_lora_done *m, zi_msg *out) {
    zi_imap b;
    zi_imap_init(&b);
    zi_imap_str(&b, "type", zi_im_type_name(ZI_IM_LORA_DONE));
    zi_imap_int(&b, "rid", m->rid);
    zi_imap_bool(&b, "ok", m->ok);
    if (m->code.p) zi_imap_strn(&b, "code", m->code.p, m->code.n);
    if (m->message.p) zi_imap_strn(&b, "message", m->message.p, m->message.n);
    zi_imap_int(&b, "id", m->id);
    zi_im_lora_names_put(&b, "loras", m->names, m->n_names);
    return zi_imap_close_msg(&b, out);
}

void zi_im_lora_done_unpack(const msgpack_object *o, zi_im_lora_done *m) {
    memset(m, 0, sizeof *m);
    int64_t v;
    m->rid = zi_map_int(o, "rid", &v, NULL) == ZI_OK ? v : 0;
    const msgpack_object *ok = zi_map_get(o, "ok");
    m->ok = ok && ok->type == MSGPACK_OBJECT_BOOLEAN && ok->via.boolean;
    m->code = zi_im_str_at(o, "code");
    m->message = zi_im_str_at(o, "message");
    m->id = zi_map_int(o, "id", &v, NULL) == ZI_OK ? v : -1;
    const msgpack_object *l = zi_map_get(o, "loras");
    m->loras = l && l->type == MSGPACK_OBJECT_ARRAY ? l : NULL;
}
