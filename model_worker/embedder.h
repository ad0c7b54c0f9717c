/*
 * embedder.h - one embedding input's state and the pooling math (the
 * seeds' EmbeddingsGenerator, docs/engine.md "Embeddings").
 *
 * An embedding input is a prefill-only sequence: the generator feeds its
 * tokens through the same steps as the text contexts
 * (zi_generator_next_token_embed), in one or more chunks, into KV blocks
 * of its own that are given back as soon as the last chunk ran (never
 * registered for prefix sharing). The model returns the final hidden state
 * (after the output norm, before the output head: what llama.cpp's
 * embedding mode pools for decoder models) of the tokens the pooling needs,
 * and zi_embed_take folds each into the result:
 *
 *   none  every token's vector, [n_tokens][dim];
 *   mean  the average over the tokens (summed in double);
 *   cls   the first token's;
 *   last  the last token's;
 *   rank  an encoder's first token's, a decoder's last token's, for a
 *         reranker's head (rank_head.h, applied by worker_embed.c); never
 *         normalized.
 *
 * (zi_pooling, protocol/embeddings.h: llama.cpp's values). With normalize each
 * vector (each token's, for none) is scaled to unit L2 norm (a zero vector
 * stays zero), as llama-cpp-python's embed(normalize=True).
 */
#ifndef ZI_EMBEDDER_H
#define ZI_EMBEDDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "embeddings.h"
#include "zi_error.h"

typedef struct zi_embed_input {
    /* set by zi_embed_input_init */
    const int32_t *tokens; /* borrowed: must outlive the input */
    int32_t n_tokens;      /* >= 1 */
    int dim;
    zi_pooling pooling;
    bool normalize;
    bool whole;  /* run in one step, never cut into chunks (an encoder's; a decoder's
                    rank input that fits a step, for float32 attention) */
    bool encoder; /* rank pools an encoder's first token, a decoder's last */
    float *out;  /* [zi_embed_out_rows][dim], the result once done */
    double *acc; /* [dim] mean pooling's running sum */
    /* the generator's (generator.c) */
    int32_t n_fed;   /* tokens already run */
    int32_t *blocks; /* [max_blocks] its KV blocks while it runs */
    int32_t n_blocks, max_blocks;
    int32_t step_len; /* tokens in the current step */
    bool done;        /* out holds the result; no blocks held */
} zi_embed_input;

/* Rows of the result: n_tokens for none, else 1. */
int32_t zi_embed_out_rows(zi_pooling p, int32_t n_tokens);

/* Sets e up for tokens[0..n_tokens) (n_tokens >= 1) and allocates its
 * result, sum and block table (max_blocks entries). */
int zi_embed_input_init(zi_embed_input *e, const int32_t *tokens, int32_t n_tokens, int dim,
                        zi_pooling pooling, bool normalize, int32_t max_blocks, zi_error *err);
/* Frees what init allocated (the caller gives the blocks back first:
 * zi_generator_release_embed). */
void zi_embed_input_free(zi_embed_input *e);

/* Whether the hidden state at position pos is needed by the pooling. */
bool zi_embed_wants(const zi_embed_input *e, int32_t pos);
/* Folds the hidden state h (dim floats) of position pos, one the pooling
 * wants, into the result. */
void zi_embed_take(zi_embed_input *e, int32_t pos, const float *h);
/* After the last token: the mean's division and the normalisation. */
void zi_embed_finish(zi_embed_input *e);

/*
 * One step's embedding rows, appended to a batch (generator.c): the batch
 * arrays and block tables, the table row the first input gets, and what
 * zi_embed_schedule put there.
 */
typedef struct zi_kv_blocks zi_kv_blocks;
typedef struct zi_embed_step {
    int32_t *tokens, *pos, *seq;
    uint8_t *want_logits, *want_hidden; /* want_hidden: 0 for the tokens before */
    uint8_t *f32_attn; /* or NULL: 1 for a whole input's tokens (zi_batch.f32_attn) */
    int32_t *tables;                    /* rows of table_stride entries */
    int32_t table_stride;
    int block_size;
    int n_tokens;             /* in: tokens already in the batch; out: with the inputs' */
    int first_row;            /* the table row (sequence) of the first input */
    zi_embed_input **stepped; /* out: the inputs in the step, n_stepped of them */
    int n_stepped;
    int n_hidden; /* out: hidden-state rows wanted */
} zi_embed_step;

/* Appends the unfinished inputs of in[0..n), in order, to the step while
 * budget tokens remain: an input takes the blocks of its whole length from
 * kb when it starts, or waits when too few are available (it never takes
 * another sequence's); a window is cut to the budget (chunks), except that
 * a whole input (an encoder's, a decoder's rank input) is never cut: it
 * takes whole_budget (>= budget: the step's room without the prompt chunk's
 * cap, so that steady decoding cannot starve it) and waits for a step
 * with room for all of it. Both budgets shrink by what is taken.
 * s->stepped has room for n. */
void zi_embed_schedule(zi_embed_input *const *in, size_t n, zi_kv_blocks *kb, int budget,
                       int whole_budget, zi_embed_step *s);
/* After the pass: each stepped input takes its hidden rows (hidden, packed
 * in batch order, dim floats each) and moves on; one that is complete is
 * finished (zi_embed_finish), its blocks given back, and done. */
void zi_embed_collect(const zi_embed_step *s, const float *hidden, zi_kv_blocks *kb);
/* Gives e's blocks back (also for a cancelled input). */
void zi_embed_release(zi_embed_input *e, zi_kv_blocks *kb);

/* Scales v[0..n) to unit L2 norm (the norm summed in double); a zero
 * vector is left as it is. */
void zi_embed_l2_normalize(float *v, int n);

#endif
