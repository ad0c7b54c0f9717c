/*
 * backend.h - the compute interface the model is written against.
 *
 * The Llama model (model_worker/model.c) never touches numbers itself: it
 * asks a zi_backend to run each operation. The CPU backend (kernels/cpu/)
 * implements it with a thread pool and SIMD kernels chosen at run time; the
 * CUDA backend (kernels/cuda/) implements the same table on a GPU. So the
 * model is written once, and a backend is free to lay out weights however
 * suits it (mapped in place, repacked, uploaded).
 *
 * Buffers: activation and KV-cache memory is allocated by the backend
 * (zi_backend_ops.alloc) and is only ever touched by the backend's ops or
 * copied with upload/download; on the CPU these are plain host pointers,
 * and an op there may take the caller's memory too (host_memory).
 * All float activations are float32, row-major, one row per token.
 *
 * Batches: one forward pass carries any mix of tokens from any sequences
 * (prefill chunks and decode steps together). zi_batch_view tells the
 * attention op, for each token, its position and which block table it
 * reads; a token attends to positions 0..pos of its own sequence (or, on a
 * sliding-window layer, the last zi_attn_shape.window of them).
 *
 * The KV cache is paged: per layer, one K and one V pool of fixed-size
 * blocks of block_size positions x n_kv_heads * head_dim values, of
 * kv_k_bytes (+ kv_k_row_extra a row) and kv_v_bytes each (zi_backend),
 * or, with a quantized KV type (zi_kv_type, --kv-type), the rows
 * zi_backend_kv_row_bytes gives; how a block lays them out is the
 * backend's (kv_store and attention are the only readers). A
 * sequence's position p lives in block table[p / block_size], row
 * p % block_size. Blocks are shared between sequences with a common prefix
 * (prefix caching, model_worker/kv_blocks.h); a shared block is only read.
 */
#ifndef ZI_BACKEND_H
#define ZI_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "zi_error.h"

typedef struct zi_backend zi_backend;

/* How the KV cache holds its values (--kv-type; zi_backend.kv_type). The
 * values are the option's choices' indexes (common/options.c). */
typedef enum zi_kv_type {
    /* The backend's own layout, as it always was: on the CPU int16 K rows
     * with one float scale each and float16 V (kv_k_bytes ...), on CUDA
     * float32 K and V. */
    ZI_KV_DEFAULT = 0,
    ZI_KV_F16,  /* K and V float16 */
    ZI_KV_Q8_0, /* K and V in llama.cpp's Q8_0 blocks: 32 int8 codes, a float16 scale */
    ZI_KV_Q4_0, /* K and V in Q4_0 blocks: 32 4-bit codes (minus 8), a float16 scale */
    ZI_KV_TYPE_COUNT
} zi_kv_type;

/* The --kv-type word of t ("default", "f16", "q8_0", "q4_0"; "?" out of
 * range). */
static inline const char *zi_kv_type_name(int t) {
    static const char *const names[ZI_KV_TYPE_COUNT] = {"default", "f16", "q8_0", "q4_0"};
    return t >= 0 && t < ZI_KV_TYPE_COUNT ? names[t] : "?";
}

/* A weight matrix [rows][cols] (cols = ne[0] in GGUF terms) as the backend
 * prepared it. `data` is backend-owned or points into the file mapping. */
typedef struct zi_weight {
    int type;         /* zi_ggml_type of the stored data */
    int64_t rows;     /* output features */
    int64_t cols;     /* input features (the dot-product length) */
    const void *data; /* as the backend lays it out (see layout) */
    size_t row_bytes;
    int layout;            /* 0: the file's; else a backend-specific repacking */
    size_t data_bytes;     /* bytes of `data` (the memory the weight holds) */
    const void *file_data; /* the rows in the file's layout (get_rows reads these) */
    void *owned;           /* non-NULL when the backend allocated a copy */
    /* A second form the backend derived from the weight (the CUDA
     * backend's fp16 copy for large batches, or its float32 one for
     * matmul_tile; the CPU's tile pack), made lazily by its ops or by
     * weight_prepare_tile and released by weight_free; NULL: none. Not
     * counted in data_bytes. */
    void *aux;
} zi_weight;

/* What attention needs to know about the tokens of one forward pass. */
typedef struct zi_batch_view {
    int n_tokens;
    const int32_t *pos;          /* [n_tokens] position of each token in its sequence */
    const int32_t *seq;          /* [n_tokens] the row of block_tables its sequence uses */
    const int32_t *block_tables; /* [rows][table_stride] block ids, host memory */
    int table_stride;
    /* NULL, or [n_tokens]: where each token's sliding window counts from,
     * when the attention's pos is a reach past the token (model.h
     * zi_batch.attn_pos: an image's tokens see their whole tile): the
     * window then covers win_pos - window + 1 .. pos, as llama.cpp masks
     * by the query's own position. Only attention reads it. */
    const int32_t *win_pos;
} zi_batch_view;

/* Shape of the attention / KV cache, fixed per model and cache. */
typedef struct zi_attn_shape {
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int block_size; /* positions per KV block */
    int max_ctx;    /* positions per sequence at most (sizes attention scratch) */
    float scale;    /* usually 1/sqrt(head_dim) */
    /* Sliding-window attention: a token at position p attends to positions
     * max(0, p - window + 1)..p only (llama.cpp's standard SWA mask: key
     * position k is hidden when p - k >= window). 0: all of 0..p. Only a
     * backend with attn_window set honours it (the model checks). */
    int window;
    /* Attention logit soft-capping (gemma2): each score s = q.k * scale
     * becomes softcap * tanh(s / softcap) before the softmax. 0: none. Only
     * a backend with attn_softcap set honours it (the model checks). */
    float softcap;
    /* Attention sinks (gpt-oss): n_heads learned logits (backend memory,
     * vector_init), one per query head, each in its head's softmax
     * denominator with no value row: out = sum_j e^(s_j - m) v_j /
     * (sum_j e^(s_j - m) + e^(sink - m)). NULL: none. Only a backend with
     * attn_sinks set honours it (the model checks). */
    const float *sinks;
    /* span_attention only: each row attends to the rows of its span up to
     * itself (a span's rows in position order), as a decoder does; 0:
     * to the whole span (an encoder). */
    int causal;
    /* span_attention only: nonzero lets the backend compute in float32
     * precision (any summation order, ~1e-6 relative per output) instead
     * of double, for a fixed-size input such as an image tile; honoured
     * where a backend has a faster such path (the CPU's, tile_mm.h) and
     * the span is bidirectional with no window, softcap or sinks. 0: the
     * exact path (the text encoders' embeddings). */
    int tile_precision;
} zi_attn_shape;

/* The angles of a RoPE call (llama.cpp's ggml_rope_ext): pair i (0 <= i <
 * rope_dim/2) of a token at position pos turns by
 *   theta = freq_scale * e,  e = pos * base^(-2i/rope_dim) / factors[i]
 * and the rotated values are multiplied by mscale (cos and sin both).
 * With YaRN (ext_factor != 0, a backend with rope_yarn): theta =
 * freq_scale * e * (1 - r) + e * r, r = ext_factor * (1 - clamp((i -
 * corr_lo) / max(0.001, corr_hi - corr_lo), 0, 1)) (ggml's rope_yarn; the
 * model folds YaRN's magnitude correction into mscale). Plain RoPE is
 * {base, 1, 1, NULL} and the YaRN fields 0. */
typedef struct zi_rope_freqs {
    float base;       /* rope.freq_base */
    float freq_scale; /* 1 / rope.scaling.factor ("linear" scaling), else 1 */
    float mscale;     /* rope.scaling.attn_factor (phi3's long-context files), else 1 */
    /* rope_dim/2 divisors of each pair's frequency, in backend memory
     * (vector_init): Llama 3's rope_freqs, phi3's rope_factors_long/short.
     * NULL: all 1. */
    const float *factors;
    float ext_factor;       /* YaRN's extrapolation mix, 0: none */
    float corr_lo, corr_hi; /* YaRN's correction dims (ggml_rope_yarn_corr_dims) */
} zi_rope_freqs;

/* One token's low-rank term of a product (a LoRA adapter,
 * model_worker/lora.h), in backend memory: a = A ([rank][cols]) and bt = B
 * transposed ([rank][rows]: the term is then one sweep along y), both of
 * type (ZI_TYPE_F32 or ZI_TYPE_F16, as the file holds them), and the
 * scale the term is multiplied by; a NULL: the token has none. */
typedef struct zi_lora_row {
    const void *a, *bt;
    int type;
    int rank; /* 1..ZI_LORA_MAX_RANK */
    float scale;
} zi_lora_row;

/* The largest adapter rank a backend's lora op takes. */
#define ZI_LORA_MAX_RANK 512

typedef struct zi_backend_ops {
    const char *name;
    void (*free_backend)(zi_backend *be); /* zi_backend_free() calls it */

    /* Prepares a 2-D tensor from the file as a weight (map, repack or
     * upload). ZI_EUNSUPPORTED when the backend cannot use its type. */
    int (*weight_init)(zi_backend *be, zi_weight *w, const zi_gguf_tensor *t, zi_error *err);
    void (*weight_free)(zi_backend *be, zi_weight *w);
    /* *out = rows r0 .. r0+n-1 of w as a weight of their own, sharing w's
     * memory (out->owned NULL: weight_free on it frees nothing; w must
     * outlive it). The experts of a 3-D tensor are prepared as one weight
     * and viewed per expert: one allocation (in huge pages on the CPU)
     * instead of hundreds. ZI_EINVAL when the rows do not split there (the
     * CPU's 16-row layouts need r0 and n multiples of 16). Optional (NULL:
     * each expert is prepared on its own). */
    int (*weight_view)(zi_backend *be, const zi_weight *w, int64_t r0, int64_t n, zi_weight *out,
                       zi_error *err);
    /* A 1-D float vector (norm weights) in backend memory, released with
     * free(); NULL on failure, with err set. */
    float *(*vector_init)(zi_backend *be, const zi_gguf_tensor *t, zi_error *err);

    /* Sizes the backend's scratch for passes of up to n_tokens tokens, rows
     * of up to max_cols inputs and attention over up to ctx positions, so
     * that the ops below never allocate. The model calls it before a pass
     * larger than any before. */
    int (*reserve)(zi_backend *be, int n_tokens, int64_t max_cols, int ctx, zi_error *err);
    void *(*alloc)(zi_backend *be, size_t bytes); /* zeroed; NULL on failure */
    void (*free)(zi_backend *be, void *p);
    void (*upload)(zi_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(zi_backend *be, void *dst, const void *src, size_t bytes);

    /* y[t][r] = dot(W[r], x[t]) for t < n_tokens, r < W->rows. */
    void (*matmul)(zi_backend *be, float *y, const zi_weight *w, const float *x, int n_tokens);
    /* n products of one input: ys[i] = x ws[i]^T, all ws[i] with the same
     * cols. The same as n matmul calls, but a backend can prepare x once
     * and run them as one job (Q/K/V, gate/up). */
    void (*matmul_n)(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                     const float *x, int n_tokens);
    /* n products, each over its own rows of x ([n_rows][cols], all ws[i]
     * with the same cols): ys[i] ([count[i]][ws[i]->rows]) = rows first[i]
     * .. first[i] + count[i] - 1 of x times ws[i]^T (count[i] >= 1; first
     * and count are host memory). The same as n matmul calls, as one job:
     * the chosen experts of a pass, each over its tokens
     * (model_worker/moe.h). The caller's reserve covers n_rows tokens.
     * Optional (NULL: the model refuses expert models on the backend). */
    void (*matmul_groups)(zi_backend *be, int n, float *const *ys, const zi_weight *const *ws,
                          const float *x, int n_rows, const int32_t *first, const int32_t *count);
    /* y = x W^T as matmul, for a whole fixed-size input (an image tile)
     * where batch invariance is not needed: any summation order, float32-
     * level accuracy (each output within ~1e-5 of the sum of its terms'
     * magnitudes, the CPU's bf16 hi/lo split; usually far closer). A
     * backend may keep a repacked copy of w in w->aux, made by
     * weight_prepare_tile or on the first call, freed by weight_free.
     * Optional (NULL: the caller uses matmul). */
    void (*matmul_tile)(zi_backend *be, float *y, const zi_weight *w, const float *x,
                        int n_tokens);
    /* Prepares w for matmul_tile ahead of the first product (at load, so
     * that an encode does not pay for it). Optional (NULL: nothing to do);
     * a failure only means matmul_tile runs as matmul for w. */
    int (*weight_prepare_tile)(zi_backend *be, zi_weight *w, zi_error *err);
    /* The LoRA term of a product, added to it: y[t] += B (r[t].scale *
     * A x[t]) for every t < n_tokens whose r[t].a is set, x rows of
     * cols floats and y rows of rows floats (r is host memory). In float32
     * from x as it is (not the products' 16-bit activations), each token
     * on its own in a fixed order, so a token's result never depends on
     * the rest of the pass (batch invariance). Optional (NULL: the model
     * refuses adapters on the backend). */
    void (*lora)(zi_backend *be, float *y, const float *x, int n_tokens, int64_t rows, int64_t cols,
                 const zi_lora_row *r);
    /* Row i of `rows` (ids[i]) of an embedding table, dequantized. */
    void (*get_rows)(zi_backend *be, float *y, const zi_weight *table, const int32_t *ids, int n);
    /* y = x / sqrt(mean(x^2) + eps) * w, per row of length dim. y may be x. */
    void (*rmsnorm)(zi_backend *be, float *y, const float *x, const float *w, int n_tokens, int dim,
                    float eps);
    /* Rotates pairs (x[2i], x[2i+1]) of the first rope_dim dims of each
     * head by pos * theta_i, theta_i as zi_rope_freqs says (plain RoPE:
     * base^(-2i/rope_dim)), in place. x is [n_tokens][n_heads][head_dim]. */
    void (*rope)(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                 int head_dim, int rope_dim, const zi_rope_freqs *rf);
    /* The same rotation in the NEOX layout (pair i is (x[i], x[i +
     * rope_dim/2])), as llama.cpp's LLAMA_ROPE_TYPE_NEOX families (gemma,
     * qwen2, phi3, ...) are stored. Optional: NULL where a backend lacks it,
     * and the model refuses such a family on that backend. */
    void (*rope_neox)(zi_backend *be, float *x, const int32_t *pos, int n_tokens, int n_heads,
                      int head_dim, int rope_dim, const zi_rope_freqs *rf);
    /* Writes k and v ([n_tokens][n_kv_heads*head_dim]) into the layer's
     * block pools at each token's position (through its block table). */
    void (*kv_store)(zi_backend *be, void *kcache, void *vcache, const float *k, const float *v,
                     const zi_batch_view *b, const zi_attn_shape *s);
    /* out[t] = softmax(q[t] K^T * scale) V over positions 0..pos[t] of
     * token t's sequence, per head (GQA: head h reads kv head h /
     * (n_heads/n_kv)). */
    void (*attention)(zi_backend *be, float *out, const float *q, const void *kcache,
                      const void *vcache, const zi_batch_view *b, const zi_attn_shape *s);
    /* Bidirectional attention over the pass's own float32 rows, for the
     * encoders (model_worker/encoder_span.h): span r < n_spans is rows
     * order[starts[r]] .. order[starts[r+1] - 1] of q [.][n_heads*head_dim]
     * and k, v [.][n_kv_heads*head_dim]; out[t] = softmax(q[t] K^T * scale)
     * V over the rows of t's span, per head (GQA as attention), nothing
     * cached; order and starts are host memory, s's window and softcap 0;
     * with s->causal, a row sees its span's rows up to itself (a decoder's
     * embedding inputs run whole in one pass, model.h zi_batch.f32_attn).
     * Accumulates in double where a backend can (the CPU's does): within
     * float rounding of exact. Optional (NULL: the model runs encoders
     * through kv_store and attention, every token given its input's last
     * position). */
    void (*span_attention)(zi_backend *be, float *out, const float *q, const float *k,
                           const float *v, const int32_t *order, const int32_t *starts, int n_spans,
                           const zi_attn_shape *s);
    /* out[i] = silu(gate[i]) * up[i]; out may alias gate. */
    void (*swiglu)(zi_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* gpt-oss's clamped SwiGLU (ggml_swiglu_oai): with x = min(gate[i],
     * limit) and y = clamp(up[i], -limit, limit), out[i] = x / (1 +
     * e^(-alpha x)) * (y + 1); out may alias gate. Optional (as
     * rope_neox). */
    void (*swiglu_oai)(zi_backend *be, float *out, const float *gate, const float *up, size_t n,
                       float alpha, float limit);
    /* out[i] = gelu(gate[i]) * up[i], GELU's tanh approximation
     * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (GeGLU, the gemma
     * feed-forward); out may alias gate. Optional (as rope_neox). */
    void (*geglu)(zi_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* x[i] *= s (gemma's embedding scale). Optional (as rope_neox). */
    void (*scale)(zi_backend *be, float *x, float s, size_t n);
    /* x[i] = cap * tanh(x[i] / cap) (gemma2/3's final logit soft-capping).
     * Optional (as rope_neox). */
    void (*softcap)(zi_backend *be, float *x, float cap, size_t n);
    /* x[i] += y[i] */
    void (*add)(zi_backend *be, float *x, const float *y, size_t n);
    /* y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, per row of length
     * dim (LayerNorm with a bias, the bert encoders'); y may be x.
     * Optional (as rope_neox). */
    void (*layernorm)(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                      int n_tokens, int dim, float eps);
    /* x[i] = gelu(x[i]), the tanh approximation of geglu (the bert
     * encoders' ungated feed-forward). Optional (as rope_neox). */
    void (*gelu)(zi_backend *be, float *x, size_t n);
    /* x[r][i] += bias[i] for r < n_rows, i < dim: a bias vector (from
     * vector_init) added to every row (qwen2's Q/K/V biases). Optional (as
     * rope_neox). */
    void (*add_bias)(zi_backend *be, float *x, const float *bias, int n_rows, int dim);
    /* y[i] = x[idx[i]] for i < n, rows of dim floats; idx is host memory.
     * A mixture of experts gathers each expert's tokens into one block of
     * rows with it (model_worker/moe.h). Optional (NULL: the model refuses
     * expert models on the backend). */
    void (*gather_rows)(zi_backend *be, float *y, const float *x, const int32_t *idx, int n,
                        int dim);
    /* out[t] = sum over j < k, in that order, of w[t*k + j] * y[idx[t*k + j]]
     * for t < n_out, rows of dim floats; idx and w are host memory. The
     * weighted sum of each token's chosen experts' outputs: a token's sum
     * depends on its own k rows only, never on the other tokens of the
     * pass (batch invariance). out must not alias y. Optional (as
     * gather_rows). */
    void (*weighted_sum_rows)(zi_backend *be, float *out, const float *y, const int32_t *idx,
                              const float *w, int n_out, int k, int dim);
    /* x[i] *= y[i] (the gates of the hybrid families' recurrent layers).
     * Optional (NULL: the model refuses the hybrid families on the
     * backend). */
    void (*mul)(zi_backend *be, float *x, const float *y, size_t n);
    /* A causal convolution over time, channel by channel, whose window is
     * carried from pass to pass in a state (LFM2's short convolution): for
     * tokens i < n in order and channels c, y[i][c] = the sum over j < K - 1
     * of w[c*K + j] * s[j][c], then + w[c*K + K - 1] * x[i][c], in that
     * order, where s is the last K - 1 inputs of token i's sequence, oldest
     * first: row slot[i] of states ((K - 1) * channels floats, [j][c]), or
     * zeros when pos[i] == 0; the row then shifts x[i] in. Rows of x and y
     * are `channels` floats; a slot's tokens come in position order; slot
     * and pos are host memory; y must not alias x. A channel's outputs
     * depend on its own sequence's inputs only (batch invariance).
     * Optional (as mul). */
    void (*conv_state)(zi_backend *be, float *y, const float *x, const float *w, int K,
                       int channels, float *states, const int32_t *slot, const int32_t *pos, int n);
    /* x[i] = silu(x[i]) = x[i] / (1 + e^-x[i]) (the convolution's
     * activation in gated DeltaNet and Mamba-2 layers). Optional (as mul). */
    void (*silu)(zi_backend *be, float *x, size_t n);
    /* x[i] *= sigmoid(g[i]) (qwen35's gated attention output). Optional (as
     * mul). */
    void (*sigmoid_mul)(zi_backend *be, float *x, const float *g, size_t n);
    /* The gated delta rule (qwen35's gated DeltaNet layers), token by token
     * in order, each of the nv value heads h with its own state S (d x d,
     * [key i][value j]) in row slot[t] of states (nv * d * d floats a
     * slot; zeros when pos[t] == 0). Token t's row of qkv holds q and k
     * for nk key heads (nk * d each) then v for nv value heads; value head
     * h reads key head h % nk. With q and k divided by sqrt(sum of squares
     * + eps) and q by sqrt(d), beta = sigmoid(b[t][h]) and g =
     * softplus(alpha[t][h] + dt_bias[h]) * a[h] (softplus(x) = x above
     * 20): S = e^g S; u = beta (v - S^T k); S += k u^T; out[t][h] = S^T q
     * (rows of nv * d). b and alpha rows are nv floats. A head's outputs
     * depend on its own sequence only. Optional (as mul). */
    void (*delta_net)(zi_backend *be, float *out, const float *qkv, const float *b,
                      const float *alpha, const float *dt_bias, const float *a, float *states,
                      const int32_t *slot, const int32_t *pos, int n, int nk, int nv, int d,
                      float eps);
    /* The Mamba-2 selective scan (granitehybrid's SSM layers), token by
     * token in order, each of the H heads h with its own state S (N x P,
     * [n][p], so that a column's recurrence is one vector lane) in row
     * slot[t] of states (H * P * N floats a slot; zeros when pos[t] ==
     * 0). Token t's row of xbc holds x (H heads of P), then B and C (G
     * groups of N each); head h reads group h / (H / G). With d =
     * softplus(dt[t][h] + dt_bias[h]) (x above 20) and dA = exp(d *
     * a[h]): S[n][p] = dA S[n][p] + d x[p] B[n]; out[t][h][p] = sum over n
     * of S[n][p] C[n], + dd[h] x[p] (the D skip). dt rows are H floats,
     * out rows H * P; the recurrence and its sums in float32 (the CPU's
     * are the same bits whatever the batch), the step in double. A
     * head's outputs depend on its own sequence only. Optional (as mul). */
    void (*ssm_scan)(zi_backend *be, float *out, const float *xbc, const float *dt,
                     const float *dt_bias, const float *a, const float *dd, float *states,
                     const int32_t *slot, const int32_t *pos, int n, int H, int P, int G, int N);
    /* RMSNorm in groups (Mamba-2's gated norm): each row of dim floats is
     * `groups` runs of dim / groups, each normalized on its own (y = x /
     * sqrt(mean(x^2) + eps)) then multiplied by w[i] (dim floats, one per
     * column). y may be x. Optional (as mul). */
    void (*rmsnorm_groups)(zi_backend *be, float *y, const float *x, const float *w, int n_tokens,
                           int dim, int groups, float eps);
    /* The speech codec decoder's ops (model_worker/wavtokenizer.h), over
     * frames: x is [n][channels], one row a frame. Optional (NULL: the
     * decoder is refused on the backend, naming the op).
     * conv1d: a 1-D convolution over the frames, zero-padded K/2 frames
     * each side (ggml_conv_1d_ph, a cross-correlation): y[t][o] = b[o] +
     * the sum over taps j < K and inputs i < cin of w[(j*cout + o)*cin +
     * i] x[t + j - K/2][i] (w taps first, [K][cout][cin]; K = 1 is a
     * product with a bias); b may be NULL; y must not alias x. In float32,
     * each tap's sum over i a dot product of the kernel table's. */
    void (*conv1d)(zi_backend *be, float *y, const float *x, const float *w, const float *b, int n,
                   int cin, int cout, int K);
    /* The depthwise form (each channel convolved with its own kernel):
     * y[t][c] = b[c] + the sum over j < K, in order, of w[c*K + j] x[t + j
     * - K/2][c]; y must not alias x. */
    void (*conv1d_dw)(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                      int n, int channels, int K);
    /* GroupNorm over frames (ggml_group_norm as llama.cpp's LLM_NORM_GROUP
     * uses it): the channels in `groups` runs of channels / groups, each run
     * normalized over all n frames' values of its channels (mean and biased
     * variance summed in double), then y = (x - mean) / sqrt(var + eps) *
     * w[c] + b[c]; y may be x. */
    void (*group_norm)(zi_backend *be, float *y, const float *x, const float *w, const float *b,
                       int n, int channels, int groups, float eps);
    /* The WavTokenizer head and inverse STFT: spec is [n][n_fft + 2], per
     * frame H = n_fft/2 + 1 log-magnitudes then H phases; S[m] = min(e^mag,
     * 100) (cos p + i sin p); each frame irfft(S, n_fft) (the imaginary
     * parts of bins 0 and n_fft/2 ignored) times the periodic Hann window
     * into frames ([n][n_fft] scratch), overlap-added at t * hop, divided by
     * the overlap-added squared window, (n_fft - hop) / 2 samples cut at
     * each end: out holds n * hop samples. In double but for the stored
     * floats; n_fft even, at most 4096, hop <= n_fft. */
    void (*istft)(zi_backend *be, float *out, const float *spec, float *frames, int n, int n_fft,
                  int hop);
    /* Waits until all queued work is done (nothing to wait for on the CPU)
     * and returns the first error any op met since the backend was made,
     * with its message in *err (err may be NULL): ops return nothing, so a
     * failed launch or a device fault is seen here, and a forward pass that
     * met one fails instead of handing back stale logits. */
    int (*sync)(zi_backend *be, zi_error *err);
    /* Makes the KV caches allocated from now on hold values as type t
     * (zi_kv_type other than ZI_KV_DEFAULT); called before any cache is made.
     * Optional: NULL where the backend has only its own layout
     * (zi_backend_set_kv_type refuses the others there). */
    int (*set_kv_type)(zi_backend *be, int t, zi_error *err);
} zi_backend_ops;

struct zi_backend {
    const zi_backend_ops *ops;
    /* Bytes of one cached K value and of one V value (4: float32, 2:
     * float16 or int16), and the bytes a K row of head_dim values carries
     * besides them (the CPU's int16 rows: a float scale). The model sizes
     * the KV pools with them; only the backend's ops read the pools. */
    int kv_k_bytes, kv_v_bytes, kv_k_row_extra;
    /* The KV type (zi_kv_type) the caches are made with; kv_k_bytes ...
     * describe ZI_KV_DEFAULT's layout only (zi_backend_kv_row_bytes covers
     * every type). */
    int kv_type;
    /* Its buffers are host memory (the CPU backend): an op may then write
     * straight into the caller's memory, and the model has the output
     * product fill the caller's logits instead of copying them (16 rows:
     * 3 MiB a step). */
    bool host_memory;
    /* Its attention honours zi_attn_shape.window (sliding-window layers). */
    bool attn_window;
    /* Its attention honours zi_attn_shape.softcap (attention logit
     * soft-capping). */
    bool attn_softcap;
    /* Its attention honours zi_attn_shape.sinks. */
    bool attn_sinks;
    /* Its rope and rope_neox honour zi_rope_freqs' YaRN fields. */
    bool rope_yarn;
};

/* The bytes one cached K row (v == 0) or V row (v != 0) of head_dim
 * values takes in be's caches: the ZI_KV_DEFAULT layout's from kv_k_bytes ...,
 * the others' from their formats (a quantized row: head_dim / 32 blocks of
 * 34 or 18 bytes; head_dim is then a multiple of 32, which
 * zi_kv_cache_create_paged checks; a rest is counted as a whole block). */
static inline uint64_t zi_backend_kv_row_bytes(const zi_backend *be, int head_dim, int v) {
    const uint64_t hd = head_dim > 0 ? (uint64_t)head_dim : 0, blocks = (hd + 31) / 32;
    switch (be->kv_type) {
    case ZI_KV_F16:
        return hd * 2;
    case ZI_KV_Q8_0:
        return blocks * 34;
    case ZI_KV_Q4_0:
        return blocks * 18;
    default:
        return v ? hd * (uint64_t)be->kv_v_bytes
                 : hd * (uint64_t)be->kv_k_bytes + (uint64_t)be->kv_k_row_extra;
    }
}

/* Sets be's KV type t (zi_kv_type) before it makes a cache: ZI_EINVAL for
 * a value out of range, ZI_EUNSUPPORTED naming --kv-type and the backend
 * when it keeps only its own layout (ZI_KV_DEFAULT is always accepted). */
static inline int zi_backend_set_kv_type(zi_backend *be, int t, zi_error *err) {
    if (t < 0 || t >= ZI_KV_TYPE_COUNT)
        return zi_error_set(err, ZI_EINVAL, "--kv-type %d: expected default, f16, q8_0 or q4_0", t);
    if (t == be->kv_type) return ZI_OK;
    if (!be->ops->set_kv_type)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "--kv-type %s: the %s backend keeps its own KV layout (only "
                            "--kv-type default there)",
                            zi_kv_type_name(t), be->ops->name);
    return be->ops->set_kv_type(be, t, err);
}

/* Frees a backend and everything it allocated (NULL: nothing). */
static inline void zi_backend_free(zi_backend *be) {
    if (be) be->ops->free_backend(be);
}

#endif
