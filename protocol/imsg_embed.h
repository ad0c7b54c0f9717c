/*
 * imsg_embed.h - the messages of the `embed` op (docs/protocol.md), one
 * struct, encoder and decoder each, as protocol/imsg.h does for the others
 * (built with its zi_imap, so no map count is written by hand):
 *
 *   router -> tokenizer  embed_encode   the client's inputs, to encode
 *   tokenizer -> router  embed_encoded  each input's token ids
 *   router -> worker     embed          the same, to run
 *   worker -> router     embedded       the [rows, dim] float32 matrix
 *   router -> client     result         embeddings, token_counts, usage
 *
 * Decoders read without copying (strings and passed-through objects point
 * into the parsed message); zi_im_embed_inputs_decode copies the ids.
 */
#ifndef ZI_IMSG_EMBED_H
#define ZI_IMSG_EMBED_H

#include "embeddings.h"
#include "imsg.h"

/* embed_encode: rid, the context limit (the smallest worker's), the
 * request's token bound, truncate, pooling (p NULL: absent, the model's),
 * normalize, a reranker's query, and the client's `input` as it came. */
typedef struct zi_im_embed_encode {
    int64_t rid, max_length, max_tokens;
    bool truncate, normalize;
    zi_im_str pooling;
    zi_im_str query; /* p NULL: absent; else each input is a document paired with it (rank) */
    const msgpack_object *input;
} zi_im_embed_encode;
int zi_im_embed_encode_pack(const zi_im_embed_encode *m, zi_msg *out);
/* ZI_EINVAL naming the key when input is missing or max_length,
 * max_tokens are not positive integers; truncate and normalize absent are
 * false, pooling not a string is absent. */
int zi_im_embed_encode_unpack(const msgpack_object *o, zi_im_embed_encode *m, zi_error *err);

/* embed_encoded (type ZI_IM_EMBED_ENCODED) and embed (ZI_IM_EMBED): rid,
 * inputs (an array of numpy-style int64 arrays), prompt_tokens (their
 * total), truncated (how many inputs truncate cut), pooling (p NULL:
 * absent), normalize. */
typedef struct zi_im_embed {
    int64_t rid, prompt_tokens, truncated;
    zi_im_str pooling;
    bool normalize;
    const zi_embeddings_request *req; /* pack: the inputs, typed; or */
    const msgpack_object *inputs;     /* pack when req is NULL (passed through); unpack */
} zi_im_embed;
int zi_im_embed_pack(zi_im_type type, const zi_im_embed *m, zi_msg *out, zi_error *err);
/* ZI_EINVAL ("inputs: missing", "inputs: not an array") ; rid is read
 * first (0 when not an int64). */
int zi_im_embed_unpack(const msgpack_object *o, zi_im_embed *m, zi_error *err);
/* The inputs of an embed message into out (zeroed first; pooling and
 * normalize left to the caller): at most max_inputs inputs of 1 or more
 * ids, max_tokens ids in all; errors name "input[i]". */
int zi_im_embed_inputs_decode(const msgpack_object *inputs, size_t max_inputs, size_t max_tokens,
                              zi_embeddings_request *out, zi_error *err);

/* embedded: rid, embeddings (numpy-style float32, shape [rows, dim]),
 * token_counts (an array of integers), pooling (its name), truncated (the
 * embed message's, passed back). */
typedef struct zi_im_embedded {
    int64_t rid, truncated;
    const zi_embeddings_response *resp;                        /* pack */
    const msgpack_object *embeddings, *token_counts, *pooling; /* unpack */
} zi_im_embedded;
int zi_im_embedded_pack(const zi_im_embedded *m, zi_msg *out, zi_error *err);
/* ZI_EINVAL when embeddings or token_counts is missing; rid read first. */
int zi_im_embedded_unpack(const msgpack_object *o, zi_im_embedded *m, zi_error *err);

/* The client's result: {"id", "event": "result", "embeddings",
 * "token_counts", "pooling", "truncated", "usage": {"prompt_tokens",
 * "total_tokens"}}. */
typedef struct zi_im_embed_result {
    zi_im_str id;
    const msgpack_object *embeddings, *token_counts, *pooling;
    int64_t truncated, prompt_tokens;
} zi_im_embed_result;
int zi_im_embed_result_pack(const zi_im_embed_result *m, zi_msg *out);

/* A numpy-style float32 array of shape [rows, dim] (rows * dim floats at v). */
int zi_im_pack_f32_matrix(msgpack_packer *pk, const float *v, int64_t rows, int64_t dim,
                          zi_error *err);

#endif
