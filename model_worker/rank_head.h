/*
 * rank_head.h - a reranker's classification head (llama.cpp's `rank`
 * pooling, docs/engine.md "Reranking"): the pooled hidden state of a
 * (query, document) pair turned into its scores.
 *
 * Cross-encoders (bert-family files with `cls.weight`/`cls.bias`, a dense
 * layer then tanh, and `cls.output.weight`/`.bias`, the projection to the
 * labels; either may be missing, as in llama.cpp) pool the first token;
 * causal rerankers (Qwen3-Reranker: `cls.output.weight` holds the rows of
 * the "yes" and "no" tokens of the output head) pool the last token, and
 * qwen3's take the softmax over the labels, as llama.cpp does for that
 * architecture only. The score is the first output.
 *
 * The head is small (at most dim x dim + labels x dim), so it runs on the
 * host in double from the file's values, which keeps the scores at the
 * hidden state's own accuracy.
 */
#ifndef ZI_RANK_HEAD_H
#define ZI_RANK_HEAD_H

#include <stdbool.h>

#include "gguf.h"
#include "zi_error.h"

/* The most labels a head may have (a file's larger count is refused). */
#define ZI_RANK_MAX_OUTPUTS 65536

typedef struct zi_rank_head {
    int dim;         /* the hidden state's size */
    int n_out;       /* outputs: the labels (`{arch}.classifier.output_labels`), else 1 */
    float *cls_w;    /* [dim][dim] or NULL: the dense layer (then tanh) */
    float *cls_b;    /* [dim] or NULL */
    float *out_w;    /* [n_out][dim] or NULL: the projection to the outputs */
    float *out_b;    /* [n_out] or NULL */
    bool softmax;    /* over the outputs (qwen3's rerankers) */
    double *scratch; /* zi_rank_head_apply's */
} zi_rank_head;

/* Reads the head of a `rank` model from g: arch names the metadata keys,
 * dim is the hidden size, softmax whether the outputs end in a softmax.
 * ZI_OK with *h filled, ZI_EUNSUPPORTED when the file has neither
 * cls.weight nor cls.output.weight, ZI_EFORMAT (naming the tensor) for a
 * tensor of the wrong shape or a type that cannot be read. Free with
 * zi_rank_head_free. */
int zi_rank_head_load(zi_rank_head *h, const zi_gguf *g, const char *arch, int dim, bool softmax,
                      zi_error *err);
void zi_rank_head_free(zi_rank_head *h);

/* The outputs (zi_rank_head_outputs floats) for the pooled hidden state x
 * (dim floats). Uses h's scratch: one call at a time. */
void zi_rank_head_apply(zi_rank_head *h, const float *x, float *out);

/* How many floats zi_rank_head_apply writes: n_out, or dim without a
 * projection (all of the dense layer's values; the score is the first). */
int zi_rank_head_outputs(const zi_rank_head *h);

#endif
