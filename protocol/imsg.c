/*
 * imsg.c - the server's messages: the counting map builder and one encoder
 * and decoder per message (see imsg.h; keys in docs/protocol.md).
 *
 * Every encoder lists its keys in the order the processes always wrote
 * them, so the frames are byte for byte those of the hand-counted code this
 * replaced.
 */
#include "imsg.h"
#include "imsg_lora.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"

/* ---- the map builder ------------------------------------------------------- */

/* Room for the largest map header (0xdf and 4 bytes of count) ahead of the
 * entries: closing writes the smallest header that fits the count just
 * before them, so a message's entries are never copied to put it first. */
#define HDR_ROOM 5

void zi_imap_init(zi_imap *b) {
    static const char room[HDR_ROOM];
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
    b->n = 0;
    b->bad = msgpack_sbuffer_write(&b->sb, room, HDR_ROOM) != 0;
}

void zi_imap_free(zi_imap *b) {
    msgpack_sbuffer_destroy(&b->sb);
    msgpack_sbuffer_init(&b->sb);
}

void zi_imap_fail(zi_imap *b) {
    b->bad = true;
}

static void pack_strn(zi_imap *b, const char *s, size_t n) {
    if (msgpack_pack_str(&b->pk, n) != 0 || (n && msgpack_pack_str_body(&b->pk, s, n) != 0))
        b->bad = true;
}

msgpack_packer *zi_imap_key(zi_imap *b, const char *key) {
    b->n++;
    pack_strn(b, key, strlen(key));
    return &b->pk;
}

void zi_imap_strn(zi_imap *b, const char *key, const char *val, size_t n) {
    zi_imap_key(b, key);
    pack_strn(b, val, n);
}

void zi_imap_str(zi_imap *b, const char *key, const char *val) {
    zi_imap_strn(b, key, val, strlen(val));
}

void zi_imap_int(zi_imap *b, const char *key, int64_t val) {
    if (msgpack_pack_int64(zi_imap_key(b, key), val) != 0) b->bad = true;
}

void zi_imap_bool(zi_imap *b, const char *key, bool val) {
    msgpack_packer *pk = zi_imap_key(b, key);
    if ((val ? msgpack_pack_true(pk) : msgpack_pack_false(pk)) != 0) b->bad = true;
}

void zi_imap_double(zi_imap *b, const char *key, double val) {
    if (msgpack_pack_double(zi_imap_key(b, key), val) != 0) b->bad = true;
}

void zi_imap_object(zi_imap *b, const char *key, const msgpack_object *o) {
    if (o && msgpack_pack_object(zi_imap_key(b, key), *o) != 0) b->bad = true;
}

void zi_imap_map(zi_imap *b, const char *key, zi_imap *child) {
    if (zi_imap_close(child, zi_imap_key(b, key)) != ZI_OK) b->bad = true;
}

uint32_t zi_imap_count(const zi_imap *b) {
    return b->n;
}

/* Writes the header for b's count just before its entries; returns the
 * offset in b->sb where the map begins. */
static size_t put_header(zi_imap *b) {
    uint32_t n = b->n;
    unsigned char h[HDR_ROOM];
    size_t len;
    if (n < 16) {
        h[0] = (unsigned char)(0x80 | n); /* fixmap */
        len = 1;
    } else if (n < 65536) {
        h[0] = 0xde; /* map 16 */
        h[1] = (unsigned char)(n >> 8), h[2] = (unsigned char)n;
        len = 3;
    } else {
        h[0] = 0xdf; /* map 32 */
        for (int k = 0; k < 4; k++) h[1 + k] = (unsigned char)(n >> (24 - 8 * k));
        len = 5;
    }
    memcpy(b->sb.data + HDR_ROOM - len, h, len);
    return HDR_ROOM - len;
}

int zi_imap_close(zi_imap *b, msgpack_packer *out) {
    int rc = b->bad ? ZI_ENOMEM : ZI_OK;
    if (!rc) {
        size_t at = put_header(b);
        if (out->callback(out->data, b->sb.data + at, b->sb.size - at) != 0) rc = ZI_ENOMEM;
    }
    zi_imap_free(b);
    return rc;
}

/* The header goes in place and out takes over b's buffer: no copy. */
int zi_imap_close_msg(zi_imap *b, zi_msg *out) {
    zi_msg_init(out);
    if (b->bad) {
        zi_imap_free(b);
        return ZI_ENOMEM;
    }
    size_t at = put_header(b);
    memmove(b->sb.data, b->sb.data + at, b->sb.size - at);
    out->sb = b->sb;
    out->sb.size -= at;
    msgpack_packer_init(&out->pk, &out->sb, msgpack_sbuffer_write);
    msgpack_sbuffer_init(&b->sb); /* given to out */
    return ZI_OK;
}

/* Closes b into out, unless a field failed (rc): then out stays empty, as
 * the failed field's key may be counted with no value. The caller frees
 * out either way. The field's error comes first. */
static int finish(zi_imap *b, int rc, zi_msg *out) {
    if (rc) zi_imap_fail(b);
    int rc2 = zi_imap_close_msg(b, out);
    return rc ? rc : rc2;
}

/* ---- typed or passed-through values ---------------------------------------- */

zi_im_str zi_im_str_at(const msgpack_object *o, const char *key) {
    const msgpack_object *v = zi_map_get(o, key);
    if (!v || v->type != MSGPACK_OBJECT_STR) return (zi_im_str){NULL, 0};
    return (zi_im_str){v->via.str.ptr, v->via.str.size};
}

void zi_im_ids_free(zi_im_ids *ids) {
    free(ids->own);
    ids->own = NULL;
    ids->v = NULL;
    ids->n = 0;
}

/* Packs ids under key when set. */
static int put_ids(zi_imap *b, const char *key, const zi_im_ids *ids, zi_error *err) {
    if (!ids->set) return ZI_OK;
    if (ids->raw) {
        zi_imap_object(b, key, ids->raw);
        return ZI_OK;
    }
    int rc = zi_codec_pack_tokens(zi_imap_key(b, key), ids->v, ids->n, err);
    if (rc) zi_imap_fail(b); /* its key is counted: the map must not go out */
    return rc;
}

/* Packs ids under key, set or not: a field every sender writes. */
static int put_req_ids(zi_imap *b, const char *key, const zi_im_ids *ids, zi_error *err) {
    zi_im_ids req = *ids;
    req.set = true;
    return put_ids(b, key, &req, err);
}

/* Packs log probabilities under key when present. */
static int put_lps(zi_imap *b, const char *key, const zi_im_lps *lps, zi_error *err) {
    if (lps->raw) {
        zi_imap_object(b, key, lps->raw);
        return ZI_OK;
    }
    int rc = lps->lp ? zi_codec_pack_logprobs(zi_imap_key(b, key), lps->lp, err) : ZI_OK;
    if (rc) zi_imap_fail(b); /* its key is counted: the map must not go out */
    return rc;
}

static void put_str(zi_imap *b, const char *key, zi_im_str s) {
    zi_imap_strn(b, key, s.p ? s.p : "", s.p ? s.n : 0);
}

/* A raw ids value (present when o is not NULL). */
static zi_im_ids raw_ids(const msgpack_object *o) {
    return (zi_im_ids){.set = o != NULL, .raw = o};
}

/* The token ids under "token_ids", decoded into ids->own for a process
 * that reads them: "token_ids: missing" or the codec's token errors. */
static int get_tokens(const msgpack_object *o, zi_im_ids *ids, zi_error *err) {
    const msgpack_object *to = zi_map_get(o, "token_ids");
    *ids = raw_ids(to);
    zi_codec_limits lim = zi_codec_limits_default();
    int rc = to ? zi_codec_decode_tokens(to, &lim, "token_ids", &ids->own, &ids->n, err)
                : zi_error_set(err, ZI_EINVAL, "token_ids: missing");
    ids->v = ids->own;
    return rc;
}

/* The string under key, or absent (p NULL) when missing or not a string. */
static zi_im_str get_str(const msgpack_object *o, const char *key) {
    const msgpack_object *v = zi_map_get(o, key);
    if (!v || v->type != MSGPACK_OBJECT_STR) return (zi_im_str){0};
    return (zi_im_str){v->via.str.size ? v->via.str.ptr : "", v->via.str.size};
}

/* The int64 under key, or dflt. */
static int64_t get_int(const msgpack_object *o, const char *key, int64_t dflt) {
    int64_t v;
    return zi_map_int(o, key, &v, NULL) == ZI_OK ? v : dflt;
}

/* The status string under key, parsed; ZI_EINVAL when it is not one. */
static int get_status(const msgpack_object *o, zi_im_str *s, zi_gen_status *g) {
    *s = get_str(o, "status");
    if (!s->p) return ZI_EINVAL;
    return zi_gen_status_parse(s->p, s->n, g, NULL);
}

/* ---- message types ---------------------------------------------------------- */

static const char *const TYPE_NAMES[ZI_IM_N_TYPES] = {
    [ZI_IM_UNKNOWN] = "",
    [ZI_IM_REGISTER] = "register",
    [ZI_IM_HEARTBEAT] = "heartbeat",
    [ZI_IM_ERROR] = "error",
    [ZI_IM_REREGISTER] = "reregister",
    [ZI_IM_ENCODE] = "encode",
    [ZI_IM_ENCODED] = "encoded",
    [ZI_IM_DECODE] = "decode",
    [ZI_IM_DECODED] = "decoded",
    [ZI_IM_RELEASE] = "release",
    [ZI_IM_TOKENIZE] = "tokenize",
    [ZI_IM_TOKENIZED] = "tokenized",
    [ZI_IM_DETOKENIZE] = "detokenize",
    [ZI_IM_DETOKENIZED] = "detokenized",
    [ZI_IM_START] = "start",
    [ZI_IM_CANCEL] = "cancel",
    [ZI_IM_TOKENS] = "tokens",
    [ZI_IM_EMBED_ENCODE] = "embed_encode",
    [ZI_IM_EMBED_ENCODED] = "embed_encoded",
    [ZI_IM_EMBED] = "embed",
    [ZI_IM_EMBEDDED] = "embedded",
    [ZI_IM_LORA] = "lora",
    [ZI_IM_LORA_DONE] = "lora_done",
};

const char *zi_im_type_name(zi_im_type t) {
    return t > ZI_IM_UNKNOWN && t < ZI_IM_N_TYPES ? TYPE_NAMES[t] : "";
}

zi_im_type zi_im_type_of(const msgpack_object *o) {
    const char *s;
    size_t n;
    if (zi_map_str(o, "type", &s, &n, NULL) != ZI_OK) return ZI_IM_UNKNOWN;
    for (int t = ZI_IM_UNKNOWN + 1; t < ZI_IM_N_TYPES; t++)
        if (strlen(TYPE_NAMES[t]) == n && !memcmp(s, TYPE_NAMES[t], n)) return (zi_im_type)t;
    return ZI_IM_UNKNOWN;
}

int zi_im_rid(const msgpack_object *o, int64_t *rid, zi_error *err) {
    return zi_map_int(o, "rid", rid, err);
}

/* A message map begun with its type (and rid when has_rid). */
static void begin(zi_imap *b, zi_im_type t, bool has_rid, int64_t rid) {
    zi_imap_init(b);
    zi_imap_str(b, "type", TYPE_NAMES[t]);
    if (has_rid) zi_imap_int(b, "rid", rid);
}

/* ---- registration and liveness ---------------------------------------------- */

int zi_im_register_pack(const zi_im_register *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_REGISTER, false, 0);
    zi_imap_str(&b, "role", m->worker ? "worker" : "tokenizer");
    if (m->worker) {
        zi_imap_int(&b, "slots", m->slots);
        zi_imap_int(&b, "max_length", m->max_length);
    }
    if (m->model.p) put_str(&b, "model", m->model); /* a tokenizer's: the model it reads */
    zi_imap_int(&b, "vocab", m->vocab);
    if (m->n_loras) zi_im_lora_names_put(&b, "loras", m->loras, m->n_loras);
    int rc = ZI_OK;
    if (m->n_live > 0) {
        msgpack_packer *pk = zi_imap_key(&b, "live");
        msgpack_pack_array(pk, (uint32_t)m->n_live);
        for (size_t i = 0; i < m->n_live && !rc; i++) {
            const zi_im_live *l = &m->live[i];
            zi_imap e;
            zi_imap_init(&e);
            zi_imap_int(&e, "rid", l->rid);
            msgpack_packer *sk = zi_imap_key(&e, "start");
            if (msgpack_pack_bin(sk, l->start_len) ||
                msgpack_pack_bin_body(sk, l->start, l->start_len))
                zi_imap_fail(&e);
            rc = put_req_ids(&e, "token_ids", &l->token_ids, NULL);
            put_str(&e, "status", l->status);
            if (rc)
                zi_imap_free(&e);
            else
                rc = zi_imap_close(&e, pk);
        }
        if (rc) zi_imap_fail(&b);
    }
    if (m->worker && m->n_prefix_keys > 0) {
        msgpack_packer *pk = zi_imap_key(&b, "prefix_keys");
        if (msgpack_pack_array(pk, (uint32_t)m->n_prefix_keys)) zi_imap_fail(&b);
        for (size_t i = 0; i < m->n_prefix_keys; i++)
            if (msgpack_pack_uint64(pk, m->prefix_keys[i])) zi_imap_fail(&b);
    }
    if (m->worker && m->kv_disk_id) {
        zi_imap kd;
        zi_imap_init(&kd);
        put_str(&kd, "dir", m->kv_disk_dir);
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)m->kv_disk_id);
        zi_imap_str(&kd, "id", hex);
        zi_imap_map(&b, "kv_disk", &kd);
    }
    int rc2 = zi_imap_close_msg(&b, out);
    return rc ? rc : rc2;
}

int zi_im_live_unpack(const msgpack_object *o, zi_im_live *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    if (o->type != MSGPACK_OBJECT_MAP) return zi_error_set(err, ZI_EINVAL, "live: not a map");
    int rc = zi_im_rid(o, &m->rid, err);
    if (!rc && m->rid <= 0) rc = zi_error_set(err, ZI_EINVAL, "rid: not positive");
    const msgpack_object *st = zi_map_get(o, "start");
    if (!rc && (!st || st->type != MSGPACK_OBJECT_BIN))
        rc = zi_error_set(err, ZI_EINVAL, "start: missing or not bin");
    if (!rc) m->start = st->via.bin.ptr, m->start_len = st->via.bin.size;
    if (!rc) rc = get_tokens(o, &m->token_ids, err);
    if (!rc) rc = zi_map_str(o, "status", &m->status.p, &m->status.n, err);
    if (!rc) rc = zi_gen_status_parse(m->status.p, m->status.n, &m->gstatus, err);
    return rc;
}

void zi_im_register_unpack(const msgpack_object *o, zi_im_register *m) {
    memset(m, 0, sizeof *m);
    m->worker = zi_map_str_is(o, "role", "worker");
    int64_t v = get_int(o, "slots", 0);
    m->slots = v > 0 && v < 65536 ? v : 1;
    v = get_int(o, "max_length", 0);
    m->max_length = v > 1 ? v : 2048;
    m->vocab = get_int(o, "vocab", 0);
    m->model = get_str(o, "model");
    const msgpack_object *l = zi_map_get(o, "loras");
    m->loras_obj = l && l->type == MSGPACK_OBJECT_ARRAY ? l : NULL;
    const msgpack_object *live = zi_map_get(o, "live");
    m->live_obj = live && live->type == MSGPACK_OBJECT_ARRAY ? live : NULL;
    const msgpack_object *pk = zi_map_get(o, "prefix_keys");
    m->prefix_keys_obj = pk && pk->type == MSGPACK_OBJECT_ARRAY ? pk : NULL;
    const msgpack_object *kd = zi_map_get(o, "kv_disk");
    if (!kd || kd->type != MSGPACK_OBJECT_MAP) return;
    zi_im_str id = get_str(kd, "id");
    uint64_t id64 = 0;
    for (size_t i = 0; id.p && id.n == 16 && i < 16; i++) {
        char c = id.p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) {
            id64 = 0;
            break;
        }
        id64 = id64 << 4 | (uint64_t)d;
    }
    m->kv_disk_id = id64;
    if (id64) m->kv_disk_dir = get_str(kd, "dir");
}

int zi_im_reregister_pack(zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_REREGISTER, false, 0);
    return zi_imap_close_msg(&b, out);
}

int zi_im_heartbeat_pack(const zi_im_heartbeat *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_HEARTBEAT, false, 0);
    zi_imap_int(&b, "load", m->load);
    if (m->has_kv) {
        zi_imap kv;
        zi_imap_init(&kv);
        for (int i = 0; i < ZI_N_KV_STATS; i++) zi_imap_int(&kv, zi_kv_stat_names[i], m->kv[i]);
        zi_imap_map(&b, "kv", &kv);
    }
    return zi_imap_close_msg(&b, out);
}

void zi_im_heartbeat_unpack(const msgpack_object *o, zi_im_heartbeat *m) {
    memset(m, 0, sizeof *m);
    m->load = get_int(o, "load", 0);
    const msgpack_object *kv = zi_map_get(o, "kv");
    if (!kv || kv->type != MSGPACK_OBJECT_MAP) return;
    m->has_kv = true;
    for (int i = 0; i < ZI_N_KV_STATS; i++)
        m->kv_set[i] = zi_map_int(kv, zi_kv_stat_names[i], &m->kv[i], NULL) == ZI_OK;
}

int zi_im_error_pack(const zi_im_error *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_ERROR, true, m->rid);
    zi_imap_str(&b, "code", m->code);
    zi_imap_str(&b, "message", m->message);
    char field[128];
    const char *f = m->field;
    if (!f) {
        zi_error_field(m->message, field, sizeof field);
        f = field;
    }
    if (f[0]) zi_imap_str(&b, "field", f);
    return zi_imap_close_msg(&b, out);
}

void zi_im_error_unpack(const msgpack_object *o, zi_im_error *m) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    zi_im_str s = get_str(o, "code");
    if (s.p && s.n < sizeof m->code_buf) {
        memcpy(m->code_buf, s.p, s.n);
        m->code = m->code_buf;
    }
    s = get_str(o, "message");
    if (s.p) {
        size_t n = s.n < sizeof m->message_buf ? s.n : sizeof m->message_buf - 1;
        memcpy(m->message_buf, s.p, n);
        m->message = m->message_buf;
    }
    s = get_str(o, "field");
    if (s.p && s.n < sizeof m->field_buf) {
        memcpy(m->field_buf, s.p, s.n);
        m->field = m->field_buf;
    }
}

/* ---- router <-> tokenizer --------------------------------------------------- */

/* encode and encoded have one shape: rid, an optional integer (max_length,
 * prompt_tokens), then a value the codec packs (the request, the context).
 * Begins such a message in b and returns the packer for that value. */
static msgpack_packer *begin_counted(zi_imap *b, zi_im_type t, int64_t rid, const char *key,
                                     bool has, int64_t v, const char *value_key) {
    begin(b, t, true, rid);
    if (has) zi_imap_int(b, key, v);
    return zi_imap_key(b, value_key);
}

/* Reads that shape: the rid (0 when not an int64), the integer (*has when
 * it is an int64) and the value, returned (NULL: absent). */
static const msgpack_object *get_counted(const msgpack_object *o, int64_t *rid, const char *key,
                                         bool *has, int64_t *v, const char *value_key) {
    *rid = get_int(o, "rid", 0);
    *has = zi_map_int(o, key, v, NULL) == ZI_OK;
    return zi_map_get(o, value_key);
}

int zi_im_encode_pack(const zi_im_encode *m, zi_msg *out, zi_error *err) {
    zi_imap b;
    msgpack_packer *pk = begin_counted(&b, ZI_IM_ENCODE, m->rid, "max_length", m->has_max_length,
                                       m->max_length, "request");
    return finish(&b, zi_codec_pack_request(pk, m->request, err), out);
}

int zi_im_encode_unpack(const msgpack_object *o, zi_im_encode *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->request_obj =
        get_counted(o, &m->rid, "max_length", &m->has_max_length, &m->max_length, "request");
    return m->request_obj ? ZI_OK : zi_error_set(err, ZI_EINVAL, "request: missing");
}

int zi_im_encoded_pack(const zi_im_encoded *m, zi_msg *out, zi_error *err) {
    zi_imap b;
    msgpack_packer *pk = begin_counted(&b, ZI_IM_ENCODED, m->rid, "prompt_tokens",
                                       m->has_prompt_tokens, m->prompt_tokens, "context");
    return finish(&b, zi_codec_pack_text_context(pk, m->context, err), out);
}

void zi_im_encoded_unpack(const msgpack_object *o, zi_im_encoded *m) {
    memset(m, 0, sizeof *m);
    m->context_obj = get_counted(o, &m->rid, "prompt_tokens", &m->has_prompt_tokens,
                                 &m->prompt_tokens, "context");
}

/* What rides along with tokens, decode and decoded, each when present, in
 * the order every sender wrote them: log probabilities, the echoed
 * prompt's ids, its text (decoded only) and its log probabilities. The
 * text is packed also after an error: the field packers stop at one. */
static int put_extras(zi_imap *b, const zi_im_lps *lps, const zi_im_ids *prompt_ids,
                      zi_im_str prompt_text, const zi_im_lps *prompt_lps, zi_error *err) {
    int rc = put_lps(b, "logprobs", lps, err);
    if (!rc) rc = put_ids(b, "prompt_token_ids", prompt_ids, err);
    if (prompt_text.p) put_str(b, "prompt_text", prompt_text);
    if (!rc) rc = put_lps(b, "prompt_logprobs", prompt_lps, err);
    return rc;
}

/* "audio": passed on as it came, or packed from its parts. */
static void put_audio(zi_imap *b, const zi_im_audio *a) {
    if (a->raw) {
        zi_imap_object(b, "audio", a->raw);
    } else if (a->data) {
        zi_imap c;
        zi_imap_init(&c);
        msgpack_packer *pk = zi_imap_key(&c, "data");
        if (msgpack_pack_bin(pk, a->len) || msgpack_pack_bin_body(pk, a->data, a->len))
            zi_imap_fail(&c);
        zi_imap_str(&c, "format", a->format ? a->format : "f32");
        zi_imap_int(&c, "sample_rate", a->sample_rate);
        zi_imap_map(b, "audio", &c);
    }
}

/* Those fields as they came, to pass on (prompt_text apart: its own field). */
static void get_extras(const msgpack_object *o, zi_im_lps *lps, zi_im_ids *prompt_ids,
                       zi_im_lps *prompt_lps) {
    lps->raw = zi_map_get(o, "logprobs");
    *prompt_ids = raw_ids(zi_map_get(o, "prompt_token_ids"));
    prompt_lps->raw = zi_map_get(o, "prompt_logprobs");
}

/* tokens and decode: the same keys under another type. */
static int tokens_pack(zi_im_type t, const zi_im_tokens *m, zi_msg *out, zi_error *err) {
    zi_imap b;
    begin(&b, t, true, m->rid);
    int rc = put_req_ids(&b, "token_ids", &m->token_ids, err);
    put_str(&b, "status", m->status);
    if (!rc)
        rc = put_extras(&b, &m->logprobs, &m->prompt_token_ids, (zi_im_str){0}, &m->prompt_logprobs,
                        err);
    put_audio(&b, &m->audio);
    return finish(&b, rc, out);
}

int zi_im_tokens_pack(const zi_im_tokens *m, zi_msg *out, zi_error *err) {
    return tokens_pack(ZI_IM_TOKENS, m, out, err);
}

int zi_im_tokens_unpack(const msgpack_object *o, zi_im_tokens *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    m->token_ids = raw_ids(zi_map_get(o, "token_ids"));
    get_extras(o, &m->logprobs, &m->prompt_token_ids, &m->prompt_logprobs);
    m->audio.raw = zi_map_get(o, "audio");
    if (!m->token_ids.set || get_status(o, &m->status, &m->gstatus) != ZI_OK)
        return zi_error_set(err, ZI_EINVAL, "malformed tokens message");
    return ZI_OK;
}

int zi_im_decode_pack(const zi_im_tokens *m, zi_msg *out, zi_error *err) {
    return tokens_pack(ZI_IM_DECODE, m, out, err);
}

int zi_im_decode_unpack(const msgpack_object *o, zi_im_tokens *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    get_extras(o, &m->logprobs, &m->prompt_token_ids, &m->prompt_logprobs);
    m->audio.raw = zi_map_get(o, "audio");
    int rc = get_tokens(o, &m->token_ids, err);
    if (!rc) rc = zi_map_str(o, "status", &m->status.p, &m->status.n, err);
    if (!rc) rc = zi_gen_status_parse(m->status.p, m->status.n, &m->gstatus, err);
    return rc;
}

void zi_im_tokens_free(zi_im_tokens *m) {
    zi_im_ids_free(&m->token_ids);
    zi_im_ids_free(&m->prompt_token_ids);
}

int zi_im_decoded_pack(const zi_im_decoded *m, zi_msg *out, zi_error *err) {
    /* What rides along first, then the message's own keys: the order the
     * tokenizer always wrote. */
    zi_imap b;
    zi_imap_init(&b);
    int rc = put_extras(&b, &m->logprobs, &m->prompt_token_ids, m->prompt_text, &m->prompt_logprobs,
                        err);
    zi_imap_str(&b, "type", TYPE_NAMES[ZI_IM_DECODED]);
    zi_imap_int(&b, "rid", m->rid);
    put_str(&b, "text", m->text);
    if (!rc) rc = put_req_ids(&b, "token_ids", &m->token_ids, err);
    put_str(&b, "status", m->status);
    if (m->reasoning_open) zi_imap_bool(&b, "reasoning_open", true);
    if (m->reasoning_harmony) zi_imap_bool(&b, "reasoning_harmony", true);
    if (m->stop_string.p) put_str(&b, "stop_string", m->stop_string);
    put_audio(&b, &m->audio);
    return finish(&b, rc, out);
}

/* A key that is true, or absent / anything else (false). */
static bool get_true(const msgpack_object *o, const char *key) {
    const msgpack_object *v = zi_map_get(o, key);
    return v && v->type == MSGPACK_OBJECT_BOOLEAN && v->via.boolean;
}

int zi_im_decoded_unpack(const msgpack_object *o, zi_im_decoded *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    m->text = get_str(o, "text");
    m->token_ids = raw_ids(zi_map_get(o, "token_ids"));
    get_extras(o, &m->logprobs, &m->prompt_token_ids, &m->prompt_logprobs);
    m->prompt_text_obj = zi_map_get(o, "prompt_text");
    m->reasoning_open = get_true(o, "reasoning_open");
    m->reasoning_harmony = get_true(o, "reasoning_harmony");
    m->stop_string = get_str(o, "stop_string");
    m->audio.raw = zi_map_get(o, "audio");
    if (!m->text.p || !m->token_ids.set || get_status(o, &m->status, &m->gstatus) != ZI_OK)
        return zi_error_set(err, ZI_EINVAL, "malformed decoded message");
    return ZI_OK;
}

/* A message of type t with the rid alone (cancel, release). */
static int rid_only_pack(zi_im_type t, int64_t rid, zi_msg *out) {
    zi_imap b;
    begin(&b, t, true, rid);
    return zi_imap_close_msg(&b, out);
}

int zi_im_cancel_pack(int64_t rid, zi_msg *out) {
    return rid_only_pack(ZI_IM_CANCEL, rid, out);
}

int zi_im_release_pack(int64_t rid, zi_msg *out) {
    return rid_only_pack(ZI_IM_RELEASE, rid, out);
}

/* A message of type t with rid and token ids (detokenize, tokenized). A
 * failure to pack the ids fails the message (zi_imap_close_msg: ZI_ENOMEM). */
static int ids_only_pack(zi_im_type t, int64_t rid, const zi_im_ids *ids, zi_msg *out) {
    zi_imap b;
    begin(&b, t, true, rid);
    put_req_ids(&b, "token_ids", ids, NULL);
    return zi_imap_close_msg(&b, out);
}

int zi_im_tokenize_pack(const zi_im_tokenize *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_TOKENIZE, true, m->rid);
    put_str(&b, "text", m->text);
    if (m->has_add_special) zi_imap_bool(&b, "add_special", m->add_special);
    return zi_imap_close_msg(&b, out);
}

int zi_im_tokenize_unpack(const msgpack_object *o, zi_im_tokenize *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    const msgpack_object *as = zi_map_get(o, "add_special");
    m->has_add_special = as && as->type == MSGPACK_OBJECT_BOOLEAN;
    m->add_special = m->has_add_special ? as->via.boolean : true;
    return zi_map_str(o, "text", &m->text.p, &m->text.n, err);
}

int zi_im_detokenize_pack(const zi_im_detokenize *m, zi_msg *out) {
    return ids_only_pack(ZI_IM_DETOKENIZE, m->rid, &m->token_ids, out);
}

int zi_im_detokenize_unpack(const msgpack_object *o, zi_im_detokenize *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    return get_tokens(o, &m->token_ids, err);
}

int zi_im_tokenized_pack(const zi_im_util_reply *m, zi_msg *out) {
    return ids_only_pack(ZI_IM_TOKENIZED, m->rid, &m->token_ids, out);
}

int zi_im_detokenized_pack(const zi_im_util_reply *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_DETOKENIZED, true, m->rid);
    put_str(&b, "text", m->text);
    return zi_imap_close_msg(&b, out);
}

int zi_im_util_reply_unpack(const msgpack_object *o, const char *key, zi_im_util_reply *m,
                            zi_error *err) {
    memset(m, 0, sizeof *m);
    m->rid = get_int(o, "rid", 0);
    m->value_obj = zi_map_get(o, key);
    if (!m->value_obj) return zi_error_set(err, ZI_EINVAL, "%s: missing", key);
    if (!strcmp(key, "text"))
        m->text = get_str(o, "text");
    else
        m->token_ids = raw_ids(m->value_obj);
    return ZI_OK;
}

/* ---- router -> worker ------------------------------------------------------- */

int zi_im_start_pack(const zi_im_start *m, zi_msg *out) {
    zi_imap b;
    begin(&b, ZI_IM_START, true, m->rid);
    zi_imap_object(&b, "context", m->context);
    zi_imap_object(&b, "note", m->note);
    if (m->prefix_key && msgpack_pack_uint64(zi_imap_key(&b, "prefix_key"), m->prefix_key))
        zi_imap_fail(&b);
    return zi_imap_close_msg(&b, out);
}

int zi_im_start_unpack(const msgpack_object *o, zi_im_start *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->context = zi_map_get(o, "context");
    m->note = zi_map_get(o, "note");
    const msgpack_object *k = zi_map_get(o, "prefix_key");
    if (k && k->type == MSGPACK_OBJECT_POSITIVE_INTEGER) m->prefix_key = k->via.u64;
    return zi_im_rid(o, &m->rid, err);
}

/* ---- router -> client ------------------------------------------------------- */

/* A reply map begun with the request's id and the event. */
static void begin_reply(zi_imap *b, zi_im_str id, const char *event) {
    zi_imap_init(b);
    put_str(b, "id", id);
    zi_imap_str(b, "event", event);
}

/* The id of a reply whose event must be `event`. */
static int reply_head(const msgpack_object *o, const char *event, zi_im_str *id, zi_error *err) {
    if (!zi_map_str_is(o, "event", event))
        return zi_error_set(err, ZI_EINVAL, "event: not \"%s\"", event);
    return zi_map_str(o, "id", &id->p, &id->n, err);
}

int zi_im_chunk_pack(const zi_im_chunk *m, zi_msg *out) {
    zi_imap b;
    begin_reply(&b, m->id, "chunk");
    put_str(&b, "text", m->text);
    zi_imap_object(&b, "token_ids", m->token_ids);
    zi_imap_object(&b, "logprobs", m->logprobs);
    zi_imap_object(&b, "prompt_token_ids", m->prompt_token_ids);
    zi_imap_object(&b, "prompt_logprobs", m->prompt_logprobs);
    zi_imap_object(&b, "prompt_text", m->prompt_text);
    if (m->resumed) zi_imap_bool(&b, "resumed", true);
    if (m->reasoning_open) zi_imap_bool(&b, "reasoning_open", true);
    if (m->reasoning_harmony) zi_imap_bool(&b, "reasoning_harmony", true);
    if (m->prompt_tokens > 0) zi_imap_int(&b, "prompt_tokens", m->prompt_tokens);
    zi_imap_object(&b, "audio", m->audio);
    return zi_imap_close_msg(&b, out);
}

int zi_im_chunk_unpack(const msgpack_object *o, zi_im_chunk *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "chunk", &m->id, err);
    if (!rc) rc = zi_map_str(o, "text", &m->text.p, &m->text.n, err);
    m->token_ids = zi_map_get(o, "token_ids");
    if (!rc && !m->token_ids) rc = zi_error_set(err, ZI_EINVAL, "token_ids: missing");
    m->logprobs = zi_map_get(o, "logprobs");
    m->prompt_token_ids = zi_map_get(o, "prompt_token_ids");
    m->prompt_logprobs = zi_map_get(o, "prompt_logprobs");
    m->prompt_text = zi_map_get(o, "prompt_text");
    const msgpack_object *res = zi_map_get(o, "resumed");
    m->resumed = res && res->type == MSGPACK_OBJECT_BOOLEAN && res->via.boolean;
    m->reasoning_open = get_true(o, "reasoning_open");
    m->reasoning_harmony = get_true(o, "reasoning_harmony");
    int64_t pt;
    if (!zi_map_int(o, "prompt_tokens", &pt, NULL)) m->prompt_tokens = pt;
    m->audio = zi_map_get(o, "audio");
    return rc;
}

int zi_im_final_pack(const zi_im_final *m, zi_msg *out, zi_error *err) {
    zi_imap b, usage;
    begin_reply(&b, m->id, "final");
    put_str(&b, "status", m->status);
    zi_imap_int(&b, "index", m->index);
    zi_imap_init(&usage);
    zi_imap_int(&usage, "prompt_tokens", m->prompt_tokens);
    zi_imap_int(&usage, "completion_tokens", m->completion_tokens);
    zi_imap_map(&b, "usage", &usage);
    if (m->stop_string.p) put_str(&b, "stop_string", m->stop_string);
    int rc = ZI_OK;
    if (m->has_text) {
        put_str(&b, "text", m->text);
        rc = put_lps(&b, "logprobs", &m->logprobs, err);
        zi_imap_object(&b, "prompt_token_ids", m->prompt_token_ids);
        zi_imap_object(&b, "prompt_logprobs", m->prompt_logprobs);
        zi_imap_object(&b, "prompt_text", m->prompt_text);
    }
    return finish(&b, rc, out);
}

int zi_im_final_unpack(const msgpack_object *o, zi_im_final *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "final", &m->id, err);
    if (!rc) rc = zi_map_str(o, "status", &m->status.p, &m->status.n, err);
    if (!rc) rc = zi_map_int(o, "index", &m->index, err);
    const msgpack_object *usage = zi_map_get(o, "usage");
    if (!rc && !usage) rc = zi_error_set(err, ZI_EINVAL, "usage: missing");
    if (!rc) rc = zi_map_int(usage, "prompt_tokens", &m->prompt_tokens, err);
    if (!rc) rc = zi_map_int(usage, "completion_tokens", &m->completion_tokens, err);
    m->text = get_str(o, "text");
    m->has_text = m->text.p != NULL;
    m->stop_string = get_str(o, "stop_string");
    m->logprobs.raw = zi_map_get(o, "logprobs");
    m->prompt_token_ids = zi_map_get(o, "prompt_token_ids");
    m->prompt_logprobs = zi_map_get(o, "prompt_logprobs");
    m->prompt_text = zi_map_get(o, "prompt_text");
    return rc;
}

int zi_im_client_error_pack(const zi_im_client_error *m, zi_msg *out) {
    zi_imap b;
    begin_reply(&b, m->id, "error");
    put_str(&b, "code", m->code);
    put_str(&b, "message", m->message);
    if (m->field.p) put_str(&b, "field", m->field);
    return zi_imap_close_msg(&b, out);
}

int zi_im_client_error_unpack(const msgpack_object *o, zi_im_client_error *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "error", &m->id, err);
    if (!rc) rc = zi_map_str(o, "code", &m->code.p, &m->code.n, err);
    if (!rc) rc = zi_map_str(o, "message", &m->message.p, &m->message.n, err);
    m->field = get_str(o, "field");
    return rc;
}

int zi_im_health_pack(const zi_im_health *m, zi_msg *out) {
    zi_imap b, kv;
    begin_reply(&b, m->id, "result");
    put_str(&b, "status", m->status);
    zi_imap_int(&b, "workers", m->workers);
    zi_imap_int(&b, "tokenizers", m->tokenizers);
    zi_imap_int(&b, "waiting", m->waiting);
    zi_imap_int(&b, "running", m->running);
    zi_imap_init(&kv);
    for (int k = 0; k < ZI_N_KV_STATS; k++) zi_imap_int(&kv, zi_kv_stat_names[k], m->kv[k]);
    zi_imap_double(&kv, "prefix_hit_rate", m->prefix_hit_rate);
    zi_imap_map(&b, "kv", &kv);
    return zi_imap_close_msg(&b, out);
}

int zi_im_health_unpack(const msgpack_object *o, zi_im_health *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "result", &m->id, err);
    if (!rc) rc = zi_map_str(o, "status", &m->status.p, &m->status.n, err);
    if (!rc) rc = zi_map_int(o, "workers", &m->workers, err);
    if (!rc) rc = zi_map_int(o, "tokenizers", &m->tokenizers, err);
    if (!rc) rc = zi_map_int(o, "waiting", &m->waiting, err);
    if (!rc) rc = zi_map_int(o, "running", &m->running, err);
    const msgpack_object *kv = zi_map_get(o, "kv");
    if (!rc && !kv) rc = zi_error_set(err, ZI_EINVAL, "kv: missing");
    for (int k = 0; !rc && k < ZI_N_KV_STATS; k++)
        rc = zi_map_int(kv, zi_kv_stat_names[k], &m->kv[k], err);
    const msgpack_object *hr = rc ? NULL : zi_map_get(kv, "prefix_hit_rate");
    if (!rc && (!hr || (hr->type != MSGPACK_OBJECT_FLOAT64 && hr->type != MSGPACK_OBJECT_FLOAT32)))
        rc = zi_error_set(err, ZI_EINVAL, "kv.prefix_hit_rate: not a float");
    if (!rc) m->prefix_hit_rate = hr->via.f64;
    return rc;
}

const double zi_im_hist_bounds[ZI_IM_HIST_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};
const char *const zi_im_hist_names[ZI_IM_N_HIST] = {"time_to_first_token", "inter_token_latency",
                                                    "e2e_latency", "queue_time"};
const char *const zi_im_finish_names[ZI_IM_N_FIN] = {
    "end_of_sequence", "maximum_length", "stop", "cancelled", "deadline_exceeded", "error"};

void zi_im_hist_observe(zi_im_hist *h, double seconds) {
    int k = 0;
    while (k < ZI_IM_HIST_BUCKETS && seconds > zi_im_hist_bounds[k]) k++;
    h->count[k]++;
    h->sum += seconds;
}

int zi_im_metrics_pack(const zi_im_metrics *m, zi_msg *out) {
    zi_imap b, fin, hists;
    begin_reply(&b, m->id, "result");
    zi_imap_int(&b, "running", m->running);
    zi_imap_int(&b, "waiting", m->waiting);
    zi_imap_int(&b, "prompt_tokens", m->prompt_tokens);
    zi_imap_int(&b, "generation_tokens", m->generation_tokens);
    zi_imap_init(&fin);
    for (int k = 0; k < ZI_IM_N_FIN; k++) zi_imap_int(&fin, zi_im_finish_names[k], m->finished[k]);
    zi_imap_map(&b, "finished", &fin);
    msgpack_packer *pk = zi_imap_key(&b, "le");
    msgpack_pack_array(pk, ZI_IM_HIST_BUCKETS);
    for (int k = 0; k < ZI_IM_HIST_BUCKETS; k++) msgpack_pack_double(pk, zi_im_hist_bounds[k]);
    zi_imap_init(&hists);
    for (int h = 0; h < ZI_IM_N_HIST; h++) {
        zi_imap one;
        zi_imap_init(&one);
        msgpack_packer *c = zi_imap_key(&one, "counts");
        msgpack_pack_array(c, ZI_IM_HIST_BUCKETS + 1);
        for (int k = 0; k <= ZI_IM_HIST_BUCKETS; k++) msgpack_pack_int64(c, m->hist[h].count[k]);
        zi_imap_double(&one, "sum", m->hist[h].sum);
        zi_imap_map(&hists, zi_im_hist_names[h], &one);
    }
    zi_imap_map(&b, "histograms", &hists);
    pk = zi_imap_key(&b, "workers");
    size_t n = m->n_workers < ZI_IM_MAX_WORKERS ? m->n_workers : ZI_IM_MAX_WORKERS;
    msgpack_pack_array(pk, n);
    for (size_t w = 0; w < n; w++) {
        zi_imap e;
        zi_imap_init(&e);
        for (int k = 0; k < ZI_N_KV_STATS; k++)
            zi_imap_int(&e, zi_kv_stat_names[k], m->worker_kv[w][k]);
        if (zi_imap_close(&e, pk) != ZI_OK) zi_imap_fail(&b);
    }
    return zi_imap_close_msg(&b, out);
}

int zi_im_metrics_unpack(const msgpack_object *o, zi_im_metrics *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "result", &m->id, err);
    if (!rc) rc = zi_map_int(o, "running", &m->running, err);
    if (!rc) rc = zi_map_int(o, "waiting", &m->waiting, err);
    if (!rc) rc = zi_map_int(o, "prompt_tokens", &m->prompt_tokens, err);
    if (!rc) rc = zi_map_int(o, "generation_tokens", &m->generation_tokens, err);
    const msgpack_object *fin = rc ? NULL : zi_map_get(o, "finished");
    if (!rc && !fin) rc = zi_error_set(err, ZI_EINVAL, "finished: missing");
    for (int k = 0; !rc && k < ZI_IM_N_FIN; k++)
        rc = zi_map_int(fin, zi_im_finish_names[k], &m->finished[k], err);
    const msgpack_object *hs = rc ? NULL : zi_map_get(o, "histograms");
    if (!rc && !hs) rc = zi_error_set(err, ZI_EINVAL, "histograms: missing");
    for (int h = 0; !rc && h < ZI_IM_N_HIST; h++) {
        const msgpack_object *one = zi_map_get(hs, zi_im_hist_names[h]);
        const msgpack_object *c = one ? zi_map_get(one, "counts") : NULL;
        const msgpack_object *sum = one ? zi_map_get(one, "sum") : NULL;
        if (!c || c->type != MSGPACK_OBJECT_ARRAY || c->via.array.size != ZI_IM_HIST_BUCKETS + 1 ||
            !sum || (sum->type != MSGPACK_OBJECT_FLOAT64 && sum->type != MSGPACK_OBJECT_FLOAT32)) {
            rc = zi_error_set(err, ZI_EINVAL, "histograms.%s: not {counts[%d], sum}",
                              zi_im_hist_names[h], ZI_IM_HIST_BUCKETS + 1);
            break;
        }
        for (int k = 0; k <= ZI_IM_HIST_BUCKETS; k++) {
            const msgpack_object *x = &c->via.array.ptr[k];
            if (x->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                rc = zi_error_set(err, ZI_EINVAL, "histograms.%s.counts[%d]: not a count",
                                  zi_im_hist_names[h], k);
                break;
            }
            m->hist[h].count[k] = (int64_t)x->via.u64;
        }
        m->hist[h].sum = sum->via.f64;
    }
    const msgpack_object *ws = rc ? NULL : zi_map_get(o, "workers");
    if (!rc && (!ws || ws->type != MSGPACK_OBJECT_ARRAY || ws->via.array.size > ZI_IM_MAX_WORKERS))
        rc = zi_error_set(err, ZI_EINVAL, "workers: not an array of up to %d", ZI_IM_MAX_WORKERS);
    for (size_t w = 0; !rc && w < ws->via.array.size; w++) {
        for (int k = 0; !rc && k < ZI_N_KV_STATS; k++)
            rc = zi_map_int(&ws->via.array.ptr[w], zi_kv_stat_names[k], &m->worker_kv[w][k], err);
        m->n_workers = w + 1;
    }
    return rc;
}

int zi_im_models_pack(const zi_im_models *m, zi_msg *out) {
    zi_imap b;
    begin_reply(&b, m->id, "result");
    msgpack_packer *pk = zi_imap_key(&b, "models");
    size_t n = m->n < ZI_IM_MAX_MODELS ? m->n : ZI_IM_MAX_MODELS;
    msgpack_pack_array(pk, n);
    for (size_t k = 0; k < n; k++) {
        zi_imap e;
        zi_imap_init(&e);
        put_str(&e, "name", m->v[k].name);
        zi_imap_int(&e, "max_length", m->v[k].max_length);
        zi_imap_int(&e, "vocab", m->v[k].vocab);
        if (m->v[k].state.p) put_str(&e, "state", m->v[k].state);
        if (m->v[k].has_usage) {
            zi_imap_int(&e, "waiting", m->v[k].waiting);
            zi_imap_int(&e, "active", m->v[k].active);
            zi_imap_int(&e, "idle_ms", m->v[k].idle_ms);
            if (m->v[k].want.p) put_str(&e, "want", m->v[k].want);
            zi_imap_int(&e, "keep_alive_ms", m->v[k].keep_alive_ms);
        }
        if (zi_imap_close(&e, pk) != ZI_OK) zi_imap_fail(&b);
    }
    return zi_imap_close_msg(&b, out);
}

int zi_im_models_unpack(const msgpack_object *o, zi_im_models *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "result", &m->id, err);
    const msgpack_object *a = rc ? NULL : zi_map_get(o, "models");
    if (!rc && (!a || a->type != MSGPACK_OBJECT_ARRAY || a->via.array.size > ZI_IM_MAX_MODELS))
        rc = zi_error_set(err, ZI_EINVAL, "models: not an array of up to %d", ZI_IM_MAX_MODELS);
    for (size_t k = 0; !rc && k < a->via.array.size; k++) {
        const msgpack_object *e = &a->via.array.ptr[k];
        zi_im_model_entry *d = &m->v[m->n++];
        rc = zi_map_str(e, "name", &d->name.p, &d->name.n, err);
        if (!rc) rc = zi_map_int(e, "max_length", &d->max_length, err);
        if (!rc) rc = zi_map_int(e, "vocab", &d->vocab, err);
        if (!rc && zi_map_get(e, "state"))
            rc = zi_map_str(e, "state", &d->state.p, &d->state.n, err);
        d->has_usage = zi_map_get(e, "idle_ms") != NULL;
        if (!rc && d->has_usage) rc = zi_map_int(e, "waiting", &d->waiting, err);
        if (!rc && d->has_usage) rc = zi_map_int(e, "active", &d->active, err);
        if (!rc && d->has_usage) rc = zi_map_int(e, "idle_ms", &d->idle_ms, err);
        if (!rc && zi_map_get(e, "want")) rc = zi_map_str(e, "want", &d->want.p, &d->want.n, err);
        d->keep_alive_ms = -1;
        if (!rc && zi_map_get(e, "keep_alive_ms"))
            rc = zi_map_int(e, "keep_alive_ms", &d->keep_alive_ms, err);
    }
    return rc;
}

int zi_im_model_status_pack(const zi_im_model_status *m, zi_msg *out) {
    zi_imap b;
    begin_reply(&b, m->id, "result");
    put_str(&b, "model", m->model);
    put_str(&b, "status", m->status);
    return zi_imap_close_msg(&b, out);
}

int zi_im_model_status_unpack(const msgpack_object *o, zi_im_model_status *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    int rc = reply_head(o, "result", &m->id, err);
    if (!rc) rc = zi_map_str(o, "model", &m->model.p, &m->model.n, err);
    if (!rc) rc = zi_map_str(o, "status", &m->status.p, &m->status.n, err);
    return rc;
}

int zi_im_result_pack(const zi_im_result *m, zi_msg *out) {
    zi_imap b;
    begin_reply(&b, m->id, "result");
    zi_imap_object(&b, m->key, m->value);
    return zi_imap_close_msg(&b, out);
}

int zi_im_result_unpack(const msgpack_object *o, const char *key, zi_im_result *m, zi_error *err) {
    memset(m, 0, sizeof *m);
    m->key = key;
    int rc = reply_head(o, "result", &m->id, err);
    m->value = zi_map_get(o, key);
    if (!rc && !m->value) rc = zi_error_set(err, ZI_EINVAL, "%s: missing", key);
    return rc;
}
