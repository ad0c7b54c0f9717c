/*
 * http_embed.h - POST /v1/embeddings (docs/http.md): OpenAI's request
 * shape turned into the router's `embed` op (docs/protocol.md), and its
 * result into OpenAI's answer.
 */
#ifndef ZI_HTTP_EMBED_H
#define ZI_HTTP_EMBED_H

#include <jansson.h>
#include <stddef.h>

#include "http_error.h"
#include "wire.h"

/*
 * The embed request for body o (a JSON object): `input` (a string, an
 * array of strings, an array of token ids, or an array of arrays of ids),
 * `encoding_format` ("float" or "base64"; *base64 set), `dimensions`
 * (refused: the model's size only), `user` (ignored), `model` (checked by
 * the caller), and zinfer's `normalize` (default true, as OpenAI's
 * vectors are), `truncate` (default false) and `pooling` ("mean", "cls",
 * "last"; default the model's). Any other key is refused. 0 with m
 * initialised and filled (id "e"), or -1 with e set (400, naming the
 * param).
 */
int zi_http_embed_request(json_t *o, zi_msg *m, int *base64, zi_http_error *e);

/* OpenAI's answer ({"object": "list", "data": [{"object": "embedding",
 * "index", "embedding"}], "model", "usage"}) for the router's result
 * frame r; NULL with e set when the result is malformed or not one row per
 * input (a model whose pooling is none). */
json_t *zi_http_embed_answer(const msgpack_object *r, const char *model, int base64,
                             zi_http_error *e);

#endif
