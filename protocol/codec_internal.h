/*
 * codec_internal.h - what the codec's files share, and nothing else
 * includes. The codec (codec.h is its interface) is split along its seams:
 *
 *   codec_scan.c    the non-allocating pre-scan of raw bytes
 *                   (zi_msgpack_check / _parse / _peek_str), zi_map_get
 *   codec_fields.c  the decoder's state (zi_dec: limits, error, key path)
 *                   and its field readers: integers, floats, strings,
 *                   string lists, token and float arrays, opaque values
 *   codec_decode.c  the type decoders built from those readers
 *   codec_encode.c  the encoders, and encoding to bytes
 *
 * Every reader fails with ZI_EINVAL (or ZI_ENOMEM) and a message that
 * starts with the field path the decoder has pushed, so an error names the
 * field it is about ("sampling_params.top_p: ...").
 */
#ifndef ZI_CODEC_INTERNAL_H
#define ZI_CODEC_INTERNAL_H

#include <stdbool.h>
#include <string.h>

#include "codec.h"
#include "keypath.h"

/* Identifiers (ids, model names, roles) are echoed in logs and replies;
 * keep them short. Decoders refuse longer ones and encoders do not make
 * them. */
#define ZI_CODEC_ID_MAX_BYTES 256

/* lim, or the defaults (written to *tmp) when lim is NULL. */
static inline const zi_codec_limits *zi_codec_limits_or_default(const zi_codec_limits *lim,
                                                                zi_codec_limits *tmp) {
    if (lim) return lim;
    *tmp = zi_codec_limits_default();
    return tmp;
}

/* lim->max_depth, held below msgpack-c's own limit. */
static inline size_t zi_codec_depth_cap(const zi_codec_limits *lim) {
    return lim->max_depth > ZI_CODEC_DEPTH_CAP ? ZI_CODEC_DEPTH_CAP : lim->max_depth;
}

/* The TextContext's fields, indices into the decoder's key list
 * (codec_decode.c); the encoder writes all C_N of them (but C_GRAMMAR and
 * C_REGEX only when set). */
enum {
    C_RID,
    C_PROMPT,
    C_MAXLEN,
    C_TOKENS,
    C_EOS,
    C_EOSSEQ,
    C_LP,
    C_LPECHO,
    C_IGNEOS,
    C_SCHEMA,
    C_SP,
    C_MATCHER,
    C_STATUS,
    C_CACHE,
    C_SIZE,
    C_START,
    C_ACTIVE,
    C_END,
    C_CSTART,
    C_CEND,
    C_PLEN,
    C_COMMIT,
    C_LPDATA,
    C_INIT,
    C_DRAFT,
    C_GRAMMAR,    /* written only when the context has a grammar */
    C_REGEX,      /* written only when the context has a regex */
    C_THINK,      /* thinking_budget, thinking_open, thinking_end: written only */
    C_THINK_OPEN, /* with a budget */
    C_THINK_END,
    C_THINK_HARMONY, /* with a budget */
    C_IMAGES,        /* written only when the context has images */
    C_LORA,          /* written only when the context has adapters */
    C_TTS,           /* written only for a speech request */
    C_N
};

/* ---- the decoder's state (codec_fields.c) ------------------------------ */

typedef struct zi_dec {
    const zi_codec_limits *lim;
    zi_error *err;
    const char *root; /* names the object in messages while path is empty */
    zi_keypath path;
} zi_dec;

/* path: where the object sits in a larger message ("" or NULL at the top);
 * root: its name in messages while no field is pushed ("request", ...). */
void zi_dec_init(zi_dec *d, const zi_codec_limits *lim, const char *path, const char *root,
                 zi_error *err);
/* Push ".k" (or "k" at the top) / "[i]" onto the path; each returns the
 * length to give zi_dec_pop to take it off again. */
size_t zi_dec_push_key(zi_dec *d, const char *k);
size_t zi_dec_push_idx(zi_dec *d, size_t i);
void zi_dec_pop(zi_dec *d, size_t old);

/* Sets d->err to code and "<path>: <message>"; returns code. */
__attribute__((format(printf, 3, 4))) int zi_dec_fail(zi_dec *d, int code, const char *fmt, ...);
/* "expected <want>, got <o's type>" at the current path. */
int zi_dec_wrong_type(zi_dec *d, const msgpack_object *o, const char *want);
/* zi_dec_fail with the field name pushed onto the path for the message:
 * "<path>.name: <message>". */
__attribute__((format(printf, 4, 5))) int zi_dec_fail_at(zi_dec *d, const char *name, int code,
                                                         const char *fmt, ...);
/* "<path>.name: missing required field". */
int zi_dec_missing(zi_dec *d, const char *name);
/* o is a container of type t (an array or a map; else "expected <want>")
 * with at most max entries (else "<n> <noun> exceed the limit of <max>"). */
int zi_dec_sized(zi_dec *d, const msgpack_object *o, msgpack_object_type t, const char *want,
                 const char *noun, size_t max);

/* Absent (NULL) or nil: optional fields treat both as "not given". */
static inline bool zi_dec_is_nil(const msgpack_object *o) {
    return !o || o->type == MSGPACK_OBJECT_NIL;
}

/* True when k is the string name. */
static inline bool zi_dec_is_key(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
           memcmp(k->via.str.ptr, name, n) == 0;
}

/* Matches the keys of map o against names[0..nf): vals[i] is the value of
 * names[i] or NULL. Refuses non-string keys, unknown keys (naming them) and
 * repeated keys; then, in order, a missing names[0..nreq) (the required
 * fields a type lists first). */
int zi_dec_read_map(zi_dec *d, const msgpack_object *o, const char *const *names, size_t nf,
                    size_t nreq, const msgpack_object **vals);

/* ---- field readers: each checks o's type and range at the current path --- */

int zi_dec_bool(zi_dec *d, const msgpack_object *o, bool *out);
/* An integer in [lo, hi]. */
int zi_dec_i64(zi_dec *d, const msgpack_object *o, int64_t lo, int64_t hi, int64_t *out);
/* A number (integers are accepted where floats are meant, as Python does);
 * NaN and infinities pass here and are judged by the type's validator. */
int zi_dec_f64(zi_dec *d, const msgpack_object *o, double *out);

/* String flags: no NUL byte, not empty, an identifier (at most
 * ZI_CODEC_ID_MAX_BYTES instead of lim->max_string_bytes). */
enum { ZI_STR_NO_NUL = 1, ZI_STR_NONEMPTY = 2, ZI_STR_ID = 4 };

/* Checks a msgpack str: length limit, UTF-8 (common/utf8.h), flags. */
int zi_dec_check_str(zi_dec *d, const msgpack_object *o, int flags);
/* zi_dec_check_str, then a copy into *out. */
int zi_dec_str(zi_dec *d, const msgpack_object *o, int flags, zi_string *out);
/* A list of strings (at most lim->max_items); `single` also accepts one
 * string (the request's stop). Appends to *out. */
int zi_dec_str_list(zi_dec *d, const msgpack_object *o, int flags, bool single, zi_str_list *out);

/* Token ids (see zi_codec_decode_tokens); *ids_out is malloc'd. */
int zi_dec_tokens(zi_dec *d, const msgpack_object *o, int32_t **ids_out, size_t *n_out);
/* The same, but any int32 (a context's tokens: images' keys are negative;
 * zi_text_context_check judges them). */
int zi_dec_tokens_any(zi_dec *d, const msgpack_object *o, int32_t **ids_out, size_t *n_out);
/* zi_dec_tokens into a list (its old contents freed). */
int zi_dec_i32_list(zi_dec *d, const msgpack_object *o, zi_i32_list *out);
/* Floats from numpy float32 or a plain array of numbers; *out is malloc'd. */
int zi_dec_f32(zi_dec *d, const msgpack_object *o, float **out, size_t *n_out);

/* An opaque value (tools, response_format, chat_template_options) of type
 * want ("what" names it in the error), checked all through (valid strings
 * within limits, no extension types, no NaN, depth counted from `depth`)
 * and re-encoded as msgpack bytes into *out. */
int zi_dec_opaque(zi_dec *d, const msgpack_object *o, msgpack_object_type want, const char *what,
                  size_t depth, zi_bytes *out);

#endif
