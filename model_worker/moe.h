/*
 * moe.h - the mixture-of-experts feed-forward block, against the backend
 * interface like the rest of the forward pass (model.c calls it in place of
 * the dense feed-forward on layers that have experts).
 *
 * A layer has n_expert experts, each a small gated feed-forward
 * (ffn_gate_exps, ffn_up_exps, ffn_down_exps: 3-D tensors whose slice e is
 * expert e), and a router (ffn_gate_inp: dim -> n_expert logits). Per token
 * the router's logits pick n_expert_used experts and their weights
 * (zi_moe_route, llama.cpp's build_moe_ffn); the block's output is the
 * weighted sum of the chosen experts' outputs, plus, in qwen2moe, a shared
 * expert every token runs, weighted by sigmoid(ffn_gate_inp_shexp . x).
 *
 * How a pass runs it: the router's product, then routing on the host (it
 * decides which products run, so the host needs it anyway), then the
 * tokens grouped by expert (gather_rows: one block of rows per expert, in
 * token order), one product per chosen expert over its tokens, all of
 * them in two backend jobs (matmul_groups: gate and up, then down; decode
 * reads only the chosen experts' weights: bytes per token follow the
 * active parameters), and each token's weighted sum (weighted_sum_rows),
 * in the order of its choice. Each expert's weights are an ordinary zi_weight
 * (the slice of the 3-D tensor), so every product kernel, repacking and
 * the 16-bit-activation exactness of the dense path apply unchanged, and a
 * token's result does not depend on the other tokens of the pass.
 */
#ifndef ZI_MOE_H
#define ZI_MOE_H

#include <stdint.h>

#include "backend.h"
#include "gguf.h"
#include "zi_error.h"

/* How the router's logits become the chosen experts' weights. */
enum {
    /* softmax over all experts, then the top n_expert_used probabilities
     * (qwen3moe, qwen2moe, Mixtral) */
    ZI_GATING_SOFTMAX = 0,
    /* the top n_expert_used logits, then a softmax over those (gpt-oss) */
    ZI_GATING_SOFTMAX_WEIGHT = 1,
};

/* Routing parameters, from the file (model.c reads them). */
typedef struct zi_moe_params {
    int n_expert, n_expert_used;
    int ffn_dim;        /* an expert's feed-forward width */
    int shared_ffn_dim; /* the shared expert's, 0: none */
    int gating;         /* ZI_GATING_* */
    int norm;           /* divide the chosen weights by their sum */
    float scale;        /* then multiply them by it (0 or 1: not) */
    /* gpt-oss: biases on the router and every expert product, and the
     * clamped SwiGLU (backend.h's swiglu_oai, alpha 1.702, limit 7). */
    int oai;
} zi_moe_params;

/* One layer's experts, as the backend holds them. */
typedef struct zi_moe_layer {
    zi_weight router;            /* ffn_gate_inp: dim -> n_expert */
    zi_weight *gate, *up, *down; /* n_expert each */
    /* Where the backend has weight_view: each 3-D tensor prepared as one
     * weight, of which gate[e], up[e], down[e] are views; else all zero. */
    zi_weight gate_all, up_all, down_all;
    /* params.oai: the router's bias [n_expert] and the experts' ([n_expert]
     * rows of ffn_dim, ffn_dim, dim), backend memory; else NULL */
    float *router_b, *b_gate, *b_up, *b_down;
    /* the shared expert (qwen2moe), else all zero */
    zi_weight sh_gate, sh_up, sh_down, sh_inp; /* sh_inp: dim -> 1 */
    uint64_t expert_bytes;                     /* the bytes of all routed experts' weights */
} zi_moe_layer;

/* Per-model working memory of the block, grown to the largest pass. */
typedef struct zi_moe_scratch zi_moe_scratch;

/* The routing parameters of a file with experts: <arch>.expert_count,
 * expert_used_count (1 <= used <= count <= 1024), expert_feed_forward_length
 * (default ffn_default: llama.cpp takes feed_forward_length / used for the
 * Qwen MoEs, feed_forward_length itself for Mixtral),
 * expert_shared_feed_forward_length (when shared: default ffn_dim),
 * expert_weights_norm (default norm); scale 0 (expert_weights_scale is
 * not read, as llama.cpp does not for these families). Errors name the
 * key. */
int zi_moe_read_params(const zi_gguf *g, const char *arch, int ffn_dim, int ffn_default, int norm,
                       int shared, zi_moe_params *p, zi_error *err);

/* gpt-oss's clamped SwiGLU constants (llama-graph.cpp, LLM_FFN_SWIGLU_OAI_MOE). */
#define ZI_MOE_OAI_ALPHA 1.702f
#define ZI_MOE_OAI_LIMIT 7.0f

/* Loads layer l's router and experts onto be, checking every shape against
 * p and dim (errors name the tensor), and adds the bytes the backend holds
 * to *bytes and the multiply-adds one token does (the chosen experts only)
 * to *macs. */
int zi_moe_load_layer(const zi_gguf *g, zi_backend *be, int l, int dim, const zi_moe_params *p,
                      zi_moe_layer *L, uint64_t *bytes, uint64_t *macs, zi_error *err);
void zi_moe_free_layer(zi_backend *be, const zi_moe_params *p, zi_moe_layer *L);

/* For each of n tokens, the chosen experts ids[t*k..] (k =
 * p->n_expert_used) and their weights w[t*k..], in llama.cpp's order (the
 * largest first; ties: the lower id), from logits [n][n_expert] (host
 * memory). Computed in double, rounded once. */
void zi_moe_route(const zi_moe_params *p, const float *logits, int n, int32_t *ids, float *w);

/* Grows *s for passes of up to T tokens (zi_moe_forward then allocates
 * nothing): the model calls it before a pass, so that a pass that cannot
 * get its memory fails before it writes anything (the KV cache). */
int zi_moe_reserve(zi_moe_scratch **s, zi_backend *be, const zi_moe_params *p, int T, int dim,
                   zi_error *err);

/* out[t] = the block's output for the T rows of x ([T][dim], backend
 * memory); out must not alias x. ZI_ENOMEM when the scratch cannot grow. */
int zi_moe_forward(zi_moe_scratch **s, zi_backend *be, const zi_moe_params *p,
                   const zi_moe_layer *L, float *out, const float *x, int T, int dim,
                   zi_error *err);
void zi_moe_scratch_free(zi_backend *be, zi_moe_scratch *s);

/* The bytes of working memory zi_moe_forward uses for a pass of T tokens
 * (for the memory budget). */
uint64_t zi_moe_work_bytes(const zi_moe_params *p, int T, int dim);

#endif
