/*
 * embeddings.h - the seeds' EmbeddingsGenerator request and response, in
 * C form (docs/types.md, docs/protocol.md "embed"), and the pooling names
 * they share with the worker (model_worker/embedder.h).
 *
 * A request is many inputs, each a list of token ids (the tokenizer
 * process encodes the client's strings), with the pooling to apply and
 * whether to L2-normalise; the response is one float32 matrix of
 * [rows][dim] (one row per input, or one per token with pooling none) and
 * each input's token count.
 */
#ifndef ZI_EMBEDDINGS_H
#define ZI_EMBEDDINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* llama.cpp's enum llama_pooling_type values. */
typedef enum zi_pooling {
    ZI_POOLING_NONE = 0,
    ZI_POOLING_MEAN = 1,
    ZI_POOLING_CLS = 2,
    ZI_POOLING_LAST = 3,
    ZI_POOLING_RANK = 4, /* a reranker's score: its classification head (rank_head.h) */
} zi_pooling;
#define ZI_POOLING_MODEL (-1) /* a request's "use the model's" */

/* "none", "mean", "cls", "last", "rank" -> *out; ZI_EINVAL for any other
 * name. */
int zi_pooling_parse(const char *name, size_t len, zi_pooling *out);
const char *zi_pooling_name(zi_pooling p);

/* Limits of one embed request (the router's --max-embed-inputs and
 * --max-embed-tokens default to these; OpenAI allows 2048 inputs). */
#define ZI_EMBED_MAX_INPUTS_DEFAULT 2048
#define ZI_EMBED_MAX_TOKENS_DEFAULT 65536
/* The most either option may be set to (the worker's own bound too). */
#define ZI_EMBED_MAX_INPUTS_CAP 65536
#define ZI_EMBED_MAX_TOKENS_CAP (1 << 20)

/* The seeds' EmbeddingsGenerator input: a batch of inputs of one request. */
typedef struct zi_embeddings_request {
    size_t n_inputs;
    int32_t *ids;  /* every input's token ids, concatenated */
    size_t *start; /* [n_inputs + 1]: input i is ids[start[i] .. start[i + 1]) */
    int pooling;   /* a zi_pooling, or ZI_POOLING_MODEL */
    bool normalize;
} zi_embeddings_request;

/* Appends one input (n >= 1 ids) to r (which starts zeroed). */
int zi_embeddings_request_add(zi_embeddings_request *r, const int32_t *ids, size_t n,
                              zi_error *err);
void zi_embeddings_request_free(zi_embeddings_request *r);

/* The seeds' EmbeddingsResponse: embeddings[rows][dim] float32, and each
 * input's token count. */
typedef struct zi_embeddings_response {
    float *embeddings;
    int64_t rows, dim;
    int64_t *token_counts; /* [n_inputs] */
    size_t n_inputs;
    zi_pooling pooling; /* the pooling applied */
} zi_embeddings_response;

void zi_embeddings_response_free(zi_embeddings_response *r);

#endif
