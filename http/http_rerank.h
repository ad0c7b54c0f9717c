/*
 * http_rerank.h - POST /v1/rerank and /rerank (docs/http.md, "Rerank"):
 * the Jina / Cohere request shape llama-server and vLLM take, turned into
 * the router's `embed` op with a `query` (docs/protocol.md: each document
 * paired with the query and scored by the model's classification head,
 * llama.cpp's rank pooling), and the scores back as ranked results.
 */
#ifndef ZI_HTTP_RERANK_H
#define ZI_HTTP_RERANK_H

#include <jansson.h>

#include "http_error.h"
#include "wire.h"

/* What the answer needs of the request. */
typedef struct zi_http_rerank {
    json_t *docs;         /* the documents' texts (a new array of strings) */
    size_t top_n;         /* results to return: top_n, else every document */
    int return_documents; /* each result carries {"document": {"text"}} */
} zi_http_rerank;

/*
 * The embed request for body o (a JSON object): `query` (a non-empty
 * string), `documents` (a non-empty array of strings or {"text": str}
 * objects, at most the router's --max-embed-inputs), `top_n` (a positive
 * integer), `return_documents` (bool, default false), `model` (checked by
 * the caller), zinfer's `truncate` (bool, default false: a pair longer
 * than the context is a 400 naming documents[i]); any other key is a 400
 * naming it. 0 with m and rr filled (free rr with zi_http_rerank_free), or
 * -1 with e set.
 */
int zi_http_rerank_request(json_t *o, zi_msg *m, zi_http_rerank *rr, zi_http_error *e);
void zi_http_rerank_free(zi_http_rerank *rr);

/* A router error about the embed op's `input` renamed to the request's
 * `documents` (param and message), so it names the client's field. */
void zi_http_rerank_error_fields(zi_http_error *e);

/* The answer ({"model", "object": "list", "usage", "results": [{"index",
 * "relevance_score", "document"?}]}, best first, ties in document order)
 * for the router's result frame r; NULL with e set when it is malformed. */
json_t *zi_http_rerank_answer(const msgpack_object *r, const char *model, const zi_http_rerank *rr,
                              zi_http_error *e);

#endif
