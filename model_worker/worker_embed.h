/*
 * worker_embed.h - the worker's embed requests (docs/protocol.md "embed"):
 * one job per request, one zi_embed_input (embedder.h) per input, run by
 * the generator beside the text contexts (zi_generator_next_token_embed),
 * answered with one "embedded" message when every input is done.
 */
#ifndef ZI_WORKER_EMBED_H
#define ZI_WORKER_EMBED_H

#include <stdint.h>

#include "embedder.h"
#include "embeddings.h"
#include "generator.h"
#include "imsg_embed.h"
#include "rank_head.h"

typedef struct zi_embed_job {
    uint64_t rid;
    zi_embeddings_request req;
    zi_embed_input *in; /* [req.n_inputs] */
    int64_t truncated;  /* the embed message's, passed back */
    zi_rank_head *rank; /* pooling rank: the model's head (borrowed) */
} zi_embed_job;

/* The model's embedding defaults, from its file: `{arch}.pooling_type`
 * (llama.cpp's key) when present, else mean; pooling is -2 for a pooling
 * this version does not run (rank without a classification head, or an
 * unknown value). */
typedef struct zi_embed_model {
    int dim, ctx, vocab, block_size;
    int pooling;
    bool whole;         /* an encoder's inputs run whole (zi_embed_input.whole) */
    int max_batch;      /* a step's tokens at most: a decoder's rank input up to this
                           long runs whole too, for float32 attention (zi_batch.f32_attn) */
    zi_rank_head *rank; /* the file's classification head, or NULL */
} zi_embed_model;

/* Reads the job from an embed message: the inputs (every id inside the
 * vocabulary, each input at most ctx tokens, ZI_EMBED_MAX_INPUTS_CAP
 * inputs and ZI_EMBED_MAX_TOKENS_CAP tokens at most), pooling (the
 * message's, else the model's), normalize. Errors name the field
 * ("input[i]", "pooling"); ZI_EUNSUPPORTED for a pooling it cannot run. */
int zi_embed_job_start(zi_embed_job *j, uint64_t rid, const msgpack_object *msg,
                       const zi_embed_model *m, zi_error *err);
/* Every input done. */
bool zi_embed_job_done(const zi_embed_job *j);
/* The "embedded" message of a done job. */
int zi_embed_job_pack(const zi_embed_job *j, zi_msg *out, zi_error *err);
/* Gives back the blocks of unfinished inputs (g may be NULL when none
 * ran) and frees the job. */
void zi_embed_job_free(zi_embed_job *j, zi_generator *g);

#endif
