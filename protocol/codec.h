/*
 * codec.h - msgpack encoding and decoding of the types in types.h.
 *
 * Every zinfer message is one msgpack map per ZeroMQ frame, with string keys
 * named as in the seed documents (docs/types.md lists every key). Token
 * arrays and float arrays travel numpy-style, so a Python peer reads them
 * with numpy.frombuffer:
 *
 *   {"__np__": true, "dtype": "int64" | "int32" | "float32",
 *    "shape": [n], "data": <bin, n * itemsize bytes, little-endian>}
 *
 * Tokens are written as int64 and floats as float32; on decoding, token ids
 * may also come as int32 arrays or as plain msgpack arrays of integers, and
 * floats as plain arrays of numbers.
 *
 * Decoding is for hostile input. zi_msgpack_parse first walks the raw bytes
 * without allocating (well-formedness, every declared count against the
 * bytes left, nesting depth), so msgpack-c never sizes an allocation from an
 * unchecked count. The zi_codec_decode_* functions then check each object
 * against its type: wrong types, missing required fields, unknown or
 * duplicate fields, out-of-range values, NaN, invalid UTF-8, over-long
 * strings and arrays all fail with ZI_EINVAL and a message that starts with
 * the field path, e.g. "sampling_params.top_p: 1.5 is outside (0, 1]" or
 * "messages[2].role: ...". Bytes that are not msgpack at all give
 * ZI_EFORMAT. On failure the output struct is left in its init state.
 *
 * Decoders take `path`, the name of the object inside a larger message
 * ("" or NULL at the top level, where messages name fields directly).
 * Encoders write into a msgpack_packer (so a type can be one field of a
 * larger message) and fail only with ZI_ENOMEM (the buffer could not grow)
 * or ZI_EINVAL (a struct that breaks its own invariants).
 *
 * Implemented in codec_scan.c (the pre-scan), codec_fields.c (field
 * readers), codec_decode.c and codec_encode.c; codec_internal.h says what
 * they share. What a request's response_format asks for is read by
 * response_format.h, not here.
 */
#ifndef ZI_CODEC_H
#define ZI_CODEC_H

#include <msgpack.h>
#include <stddef.h>
#include <stdint.h>

#include "types.h"
#include "zi_error.h"

/* msgpack-c's own parser stops at 32 nested containers; stay below it. */
#define ZI_CODEC_DEPTH_CAP 30

typedef struct zi_codec_limits {
    size_t max_tokens;       /* elements of one token or float array (default 1 << 20) */
    size_t max_string_bytes; /* bytes of one string (default 4 MiB) */
    size_t max_depth;        /* nested maps/arrays, the top map is 1 (default 16, cap 30) */
    size_t max_items;        /* entries of any other list or map: messages,
                                stop strings, top log probabilities (default 4096) */
    int64_t max_logprobs;    /* largest "logprobs" a request may ask for (default 20) */
    size_t max_images;       /* entries of a request's images (default ZI_CODEC_MAX_IMAGES) */
    size_t max_image_bytes;  /* bytes of one image (default ZI_CODEC_MAX_IMAGE_BYTES) */
} zi_codec_limits;

/* The defaults of those two: the protocol's ceilings (types.h), above
 * zinfer-http's --max-images and --max-image-bytes; the router's
 * --max-frame-bytes bounds a whole request below them anyway. */
#define ZI_CODEC_MAX_IMAGES ZI_REQUEST_MAX_IMAGES
#define ZI_CODEC_MAX_IMAGE_BYTES ZI_REQUEST_MAX_IMAGE_BYTES

zi_codec_limits zi_codec_limits_default(void);

/* ---- whole messages -------------------------------------------------------- */

/* Checks that buf[0..len) is exactly one well-formed msgpack object within
 * the limits (depth; every array/map count plausible for the bytes left and
 * at most max(max_tokens, max_items)), without allocating. ZI_EFORMAT for
 * malformed or truncated bytes or trailing bytes, ZI_EINVAL for a limit,
 * with the byte offset and the key path reached. lim may be NULL (defaults). */
int zi_msgpack_check(const void *buf, size_t len, const zi_codec_limits *lim, zi_error *err);

/* zi_msgpack_check, then msgpack_unpack_next into *out (initialised here).
 * On success the caller calls msgpack_unpacked_destroy(out); on failure
 * nothing is left to destroy. Objects point into buf: keep it alive. */
int zi_msgpack_parse(const void *buf, size_t len, const zi_codec_limits *lim, msgpack_unpacked *out,
                     zi_error *err);

/* For a frame zi_msgpack_check refused (too deep, too large, bad bytes
 * later on): when buf starts with a map whose entries up to key are well
 * formed and key's value is a string, points *out at its bytes (unchecked
 * UTF-8) and returns true. The walk does not recurse and allocates
 * nothing, so any nesting is fine. The router uses it to put a refused
 * request's id on its error frame. */
bool zi_msgpack_peek_str(const void *buf, size_t len, const char *key, const char **out,
                         size_t *out_len);

/* The value stored under key in map o, or NULL (also when o is no map). */
const msgpack_object *zi_map_get(const msgpack_object *o, const char *key);

/* "a string", "an integer", "a map", ...: an object's type in messages. */
const char *zi_msgpack_type_name(const msgpack_object *o);

/* ---- arrays ---------------------------------------------------------------- */

/* Token ids as a numpy-style int64 array. */
int zi_codec_pack_tokens(msgpack_packer *pk, const int32_t *ids, size_t n, zi_error *err);
/* Floats as a numpy-style float32 array. */
int zi_codec_pack_f32(msgpack_packer *pk, const float *v, size_t n, zi_error *err);
/* Token ids from a numpy-style int64/int32 array or a plain array of
 * integers; each id in [0, 2^31-1], at most lim->max_tokens. *ids is
 * malloc'd (NULL when n is 0). */
int zi_codec_decode_tokens(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                           int32_t **ids, size_t *n, zi_error *err);

/* ---- the types ------------------------------------------------------------- */

int zi_codec_pack_sampling_params(msgpack_packer *pk, const zi_sampling_params *sp, zi_error *err);
int zi_codec_pack_request(msgpack_packer *pk, const zi_request *r, zi_error *err);
int zi_codec_pack_text_context(msgpack_packer *pk, const zi_text_context *ctx, zi_error *err);
int zi_codec_pack_logprobs(msgpack_packer *pk, const zi_logprobs *lp, zi_error *err);
int zi_codec_pack_text_response(msgpack_packer *pk, const zi_text_response *r, zi_error *err);
int zi_codec_pack_text_generation_response(msgpack_packer *pk, const zi_text_generation_response *r,
                                           zi_error *err);

/* Missing fields take the seed's defaults. */
int zi_codec_decode_sampling_params(const msgpack_object *o, const zi_codec_limits *lim,
                                    const char *path, zi_sampling_params *out, zi_error *err);
/* Required: "id" and exactly one of "prompt" / "messages". "images" is a
 * list of msgpack bin (each non-empty, at most lim->max_images of them and
 * lim->max_image_bytes each: "images[3]: ..."); with images, the prompt
 * must be text, and it (or the messages' contents together) must hold
 * exactly one ZI_MEDIA_MARKER per image. An "op" key is
 * accepted when it is "generate" (the client protocol's frame). "tools"
 * must have the seed's TokenGeneratorRequestTool shape: maps with exactly
 * "type" (a string) and "function", a map with "name" (a non-empty
 * string) and optionally "description" (a string) and "parameters" (a
 * map), e.g. "tools[1].function.name: missing required field". */
int zi_codec_decode_request(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                            zi_request *out, zi_error *err);
/* Required: "tokens" and "max_length". Index fields left out or -1 are
 * derived as the seed's TextContext does (active/end/prompt_len from the
 * token count); the result passes zi_text_context_check. */
int zi_codec_decode_text_context(const msgpack_object *o, const zi_codec_limits *lim,
                                 const char *path, zi_text_context *out, zi_error *err);
int zi_codec_decode_logprobs(const msgpack_object *o, const zi_codec_limits *lim, const char *path,
                             zi_logprobs *out, zi_error *err);
int zi_codec_decode_text_response(const msgpack_object *o, const zi_codec_limits *lim,
                                  const char *path, zi_text_response *out, zi_error *err);
int zi_codec_decode_text_generation_response(const msgpack_object *o, const zi_codec_limits *lim,
                                             const char *path, zi_text_generation_response *out,
                                             zi_error *err);

/* ---- to and from bytes ----------------------------------------------------- */

/* Encode into a fresh malloc'd buffer (*buf, *len; free() it). */
int zi_codec_request_to_bytes(const zi_request *r, char **buf, size_t *len, zi_error *err);
int zi_codec_text_context_to_bytes(const zi_text_context *ctx, char **buf, size_t *len,
                                   zi_error *err);
/* zi_msgpack_parse + decode. lim may be NULL (defaults). */
int zi_codec_request_from_bytes(const void *buf, size_t len, const zi_codec_limits *lim,
                                zi_request *out, zi_error *err);
int zi_codec_text_context_from_bytes(const void *buf, size_t len, const zi_codec_limits *lim,
                                     zi_text_context *out, zi_error *err);

#endif
