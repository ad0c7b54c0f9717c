/*
 * model.h - the Llama-family transformer, written once against the backend
 * interface (kernels/backend.h).
 *
 * zi_model_load() maps a GGUF file, reads every hyper-parameter from its
 * metadata (nothing is hard-coded), checks that each tensor the architecture
 * needs is present with the right shape and a supported type, and hands the
 * weights to the backend. zi_model_forward() runs one batched forward pass
 * over any mix of sequences and positions, writing K/V into a zi_kv_cache
 * and returning logits for the tokens that ask for them.
 *
 * Architecture (GGUF "llama"): token embedding; per layer RMSNorm ->
 * Q,K,V projections -> RoPE (adjacent-pair layout, as GGUF llama files are
 * stored) -> causal grouped-query attention -> output projection ->
 * residual; RMSNorm -> SwiGLU feed-forward -> residual; final RMSNorm and the
 * output head (output.weight, or the tied token embedding). Other families
 * (family.h: "gemma3") switch on small differences in the same pass: NEOX
 * RoPE, Q/K norms, post-block norms, GeGLU, an embedding scale,
 * sliding-window layers with their own RoPE base, final logit soft-capping;
 * and the bert encoders (post-norm LayerNorms, biases, absolute positions,
 * bidirectional attention, no output head).
 */
#ifndef ZI_MODEL_H
#define ZI_MODEL_H

#include <stdint.h>

#include "backend.h"
#include "gguf.h"
#include "moe.h"
#include "zi_error.h"

typedef struct zi_model_config {
    char arch[32];
    int n_layers;
    int dim;     /* embedding_length */
    int ffn_dim; /* feed_forward_length */
    int n_heads;
    int n_kv_heads;
    int head_dim; /* dim / n_heads */
    int rope_dim; /* rope.dimension_count, defaults to head_dim */
    int n_vocab;
    int ctx_train; /* context_length the model was trained for */
    float rope_base;
    float norm_eps;
    int tied_output; /* 1 when the output head is token_embd.weight */
    /* Family options (family.h): from the file, else the family's defaults. */
    const struct zi_family *family;
    float attn_scale;    /* softmax(q.k * attn_scale) */
    int sliding_window;  /* attention.sliding_window: local layers' span, 0: none */
    int swa_pattern;     /* attention.sliding_window_pattern (an array: -1, per layer) */
    float rope_base_swa; /* rope.freq_base_swa: the local layers' RoPE base */
    float final_softcap; /* final_logit_softcapping, 0: none */
    /* RoPE scaling (llama.cpp's rope.scaling.* without YaRN). */
    float rope_freq_scale;  /* 1 / rope.scaling.factor, 1 for type none */
    float rope_attn_factor; /* rope.scaling.attn_factor: cos, sin times it */
    int rope_longrope;      /* rope.scaling.type "longrope": rope_factors_long/short */
    int rope_orig_ctx;      /* rope.scaling.original_context_length (context_length) */
    /* rope.scaling.type "yarn" (gpt-oss): ggml's rope_yarn with ext_factor
     * 1, beta_fast 32, beta_slow 1 over rope_orig_ctx; rope_attn_factor
     * then includes YaRN's magnitude 1 + 0.1 ln(factor) (llama.cpp's
     * llama_context for files without yarn_log_multiplier). */
    int rope_yarn;
    float attn_softcap;  /* attn_logit_softcapping (families that cap), 0: none */
    /* An encoder (family.h: bert, nomic-bert): it returns hidden states
     * only (a pass that wants logits is ZI_EUNSUPPORTED), each input runs
     * whole in one pass and attends to all of itself; norm_eps is its
     * attention.layer_norm_epsilon. */
    int encoder;
    /* Routed experts instead of the dense feed-forward (moe.h; family.h's
     * moe): n_expert 0 for a dense model. */
    zi_moe_params moe;
    /* A hybrid (family.h's recurrent): n_recurrent of the n_layers keep a
     * recurrent state instead of attention and a KV cache; conv_len is
     * shortconv.l_cache, their convolution's width (its state holds
     * conv_len - 1 inputs). 0 for a model of attention layers only. */
    int n_recurrent;
    int conv_len;
    /* gated DeltaNet (qwen35): ssm.group_count key heads, ssm.time_step_rank
     * value heads, each ssm.state_size wide */
    int dn_k_heads, dn_v_heads, dn_head_dim;
    /* qwen35's multi-token-prediction blocks (nextn_predict_layers), the
     * last of block_count, not run: n_layers leaves them out */
    int n_nextn;
    /* Mamba-2 (granitehybrid): ssm.inner_size channels, ssm.time_step_rank
     * heads of ssm_inner / ssm_heads, ssm.group_count groups of B and C,
     * each ssm.state_size wide */
    int ssm_inner, ssm_heads, ssm_groups, ssm_state;
    /* Granite's multipliers (family.h's granite_scales), 0: unused;
     * no_rope: rope.scaling.finetuned false, the attention takes no
     * position */
    float embedding_scale, residual_scale, logit_scale;
    int no_rope;
} zi_model_config;

typedef struct zi_model zi_model;

/* Loads the model at path onto backend be (which must outlive the model).
 * The GGUF stays mapped for the model's lifetime; zi_model_gguf() lends it
 * to the tokenizer. Errors name the file and the key/tensor at fault. */
int zi_model_load(const char *path, zi_backend *be, zi_model **out, zi_error *err);
void zi_model_free(zi_model *m);
const zi_model_config *zi_model_get_config(const zi_model *m);
/* The backend the model was loaded onto (zi_model_load's be). */
zi_backend *zi_model_backend(const zi_model *m);
/* The hyper-parameters from the file's metadata alone, with the checks
 * zi_model_load makes on them (an unsupported architecture or rope scaling
 * is ZI_EUNSUPPORTED), for describing a file without loading its weights
 * (`zinfer info`). n_vocab and tied_output come from the tensors and are
 * left 0. */
int zi_model_read_config(const zi_gguf *g, zi_model_config *c, zi_error *err);
const zi_gguf *zi_model_gguf(const zi_model *m);
/* Bytes of weight data the model reads per token, as the backend holds it
 * (zi_weight.data_bytes: a repacked copy may be larger than the file's; for
 * bandwidth estimates and the memory budget). */
uint64_t zi_model_weight_bytes(const zi_model *m);
/* The part of those bytes one token reads (the bytes a decode step
 * streams, for bandwidth yardsticks): all but an embedding table that is
 * not also the output head (a row of it is looked up); of a mixture of
 * experts, the routed experts' share n_expert_used / n_expert. */
uint64_t zi_model_active_weight_bytes(const zi_model *m);
/* Multiply-adds of the weight products per token: every matrix the forward
 * pass multiplies a token's activations by, the output head included
 * (embedding lookups are not products; of the routed experts, the
 * n_expert_used a token runs). The yardstick of prefill speed
 * against the machine's int8 peak (`zinfer bench --json`). */
uint64_t zi_model_weight_macs(const zi_model *m);

/*
 * The KV cache: K and V for every layer, in backend memory, as a pool of
 * n_blocks blocks of block_size positions (the values' sizes and layout are
 * the backend's: kernels/backend.h). Memory is n_blocks * block_size * zi_model_kv_bytes_per_token
 * bytes, allocated once: it never grows.
 *
 * The caller owns the blocks and passes block tables with every batch: the
 * generator, with model_worker/kv_blocks.h, or code that feeds the model
 * directly with fixed tables (zi_kv_fixed, model_worker/kv_fixed.h).
 */
typedef struct zi_kv_cache zi_kv_cache;
int zi_kv_cache_create_paged(zi_model *m, int n_blocks, int block_size, int max_ctx,
                             zi_kv_cache **out, zi_error *err);
void zi_kv_cache_free(zi_kv_cache *kv);     /* before the model it belongs to */
int zi_kv_cache_ctx(const zi_kv_cache *kv); /* positions per sequence at most */
int zi_kv_cache_blocks(const zi_kv_cache *kv);
int zi_kv_cache_block_size(const zi_kv_cache *kv);
uint64_t zi_kv_cache_bytes(const zi_kv_cache *kv);
/* One block's bytes in each attention layer's K and V pool (the disk
 * tier's layout identity, model_worker/kv_disk.h), and the layers that have
 * them (n_layers less the recurrent ones). */
void zi_kv_cache_block_layout(const zi_kv_cache *kv, int *n_layers, uint64_t *k_bytes,
                              uint64_t *v_bytes);
/* Block `block`'s K/V in every attention layer, copied out to dst or in
 * from src: n_layers * (k_bytes + v_bytes) bytes, layer by layer, K then
 * V, as the backend lays them out. For the disk tier: a block written back
 * must have been read from a cache of the same model and layout.
 * ZI_EINVAL for a block outside the pool. */
int zi_kv_cache_read_block(zi_kv_cache *kv, int block, void *dst);
int zi_kv_cache_write_block(zi_kv_cache *kv, int block, const void *src);

/*
 * The recurrent states of a hybrid (zi_model_config.n_recurrent > 0): a
 * fixed set of n_slots state slots beside the blocks, each holding one
 * sequence's recurrent layers' states after the positions it has taken
 * in. zi_kv_cache_add_states allocates them once (zeroed: a slot starts
 * empty); a pass names each sequence's slot (zi_batch.state_slots). A
 * slot's state covers positions 0..n-1 of its sequence, n its length
 * (zi_kv_cache_state_length): a token at position 0 starts it over, and
 * any other token must be at position n (the pass then fails, nothing
 * run, ZI_EINVAL): a hybrid's sequence is fed in order from its start,
 * never rolled back or resumed from cached blocks alone.
 */
int zi_kv_cache_add_states(zi_kv_cache *kv, int n_slots, zi_error *err);
/* Copies slot src's state and length into slot dst (a checkpoint taken,
 * or one restored: generator.h's prefix reuse). ZI_EUNSUPPORTED on a
 * backend whose memory is not the host's (no hybrid runs there yet). */
int zi_kv_cache_copy_state(zi_kv_cache *kv, int dst, int src, zi_error *err);
int zi_kv_cache_state_slots(const zi_kv_cache *kv); /* 0: none */
/* The positions slot `slot`'s state covers (0: empty). */
int32_t zi_kv_cache_state_length(const zi_kv_cache *kv, int slot);
/* Bytes of one slot's states (0 for a model without recurrent layers). */
uint64_t zi_model_state_bytes_per_slot(const zi_model *m);
uint64_t zi_model_config_state_bytes_per_slot(const zi_model_config *c);

/* KV bytes per cached token (all attention layers, K and V). */
uint64_t zi_model_kv_bytes_per_token(const zi_model *m);
/* The same for a model of config c (zi_model_read_config) on backend be,
 * without loading it: zi_model_kv_bytes_per_token is this function. */
uint64_t zi_model_config_kv_bytes_per_token(const zi_model_config *c, const zi_backend *be);
/* The seeds' estimate_kv_cache_size: the bytes of KV cache, in whole blocks
 * of block_size positions, that fit in available_cache_memory. */
uint64_t zi_model_estimate_kv_cache_size(const zi_model *m, uint64_t available_cache_memory,
                                         int block_size);
/* The seeds' estimate_memory_footprint: of memory_budget bytes, what is
 * left for the KV cache once the weights, the activations of a pass of
 * max_batch_tokens tokens and max_logit_rows rows of logits (twice: the
 * model's and the caller's) are counted (0 when nothing is). */
uint64_t zi_model_memory_left_for_kv(const zi_model *m, uint64_t memory_budget,
                                     int max_batch_tokens, int max_logit_rows);
/* The working buffers zi_model_memory_left_for_kv counts besides the
 * weights (the activations of a max_batch_tokens pass and max_logit_rows
 * rows of logits, twice), for a model of config c with c->n_vocab rows of
 * output (zi_model_read_config leaves n_vocab 0: the caller fills it in
 * from the tensors to count a file it has not loaded). */
uint64_t zi_model_config_work_bytes(const zi_model_config *c, int max_batch_tokens,
                                    int max_logit_rows);

/* One forward pass. Token i has id tokens[i] at position pos[i] of
 * sequence seq[i], a row of block_tables (rows of table_stride block ids;
 * n_table_rows of them). Positions 0..pos[i]-1 of
 * that sequence must already be in the cache (written by earlier passes or
 * earlier in this batch). When want_logits is NULL only the last token's
 * logits are returned; otherwise those of every token i with
 * want_logits[i] != 0, in order. */
typedef struct zi_batch {
    int n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *seq;
    const uint8_t *want_logits;
    const int32_t *block_tables;
    int n_table_rows, table_stride;
    /* Embeddings (optional): the final hidden state (after the output norm,
     * before the output head, as llama.cpp's embedding mode pools it) of
     * every token i with want_hidden[i] != 0, in order, into hidden
     * (an encoder's: the last layer's output, it has no output norm)
     * (n_hidden_wanted * dim floats, host memory). NULL: none. */
    const uint8_t *want_hidden;
    float *hidden;
    /* A decoder's embedding inputs that run whole in this pass (NULL:
     * none): the tokens i with f32_attn[i] != 0 attend within their
     * sequence over the pass's own float32 K/V, causally (span_attention),
     * rather than the cache's float16 V, where the backend has it and the
     * layer has no window, soft-capping or sinks. Each such sequence must
     * be whole here: positions 0..n-1 in order, contiguous in the batch.
     * Encoders ignore it (they always do so, bidirectionally). */
    const uint8_t *f32_attn;
    /* Input embeddings (NULL: none): token i with embd_rows[i] >= 0 enters
     * as row embd_rows[i] of embd (host memory, rows of dim floats) in
     * place of its token's embedding row (an image's soft tokens,
     * vision.h); the family's embedding scale is not applied to it, as
     * llama.cpp scales token embeddings only. tokens[i] is then only a
     * key (a prefix cache's: any int32, e.g. one derived from the image's
     * hash), never looked up. Decoders only. */
    const float *embd;
    const int32_t *embd_rows;
    /* Attention reach (NULL: causal): token i attends to positions
     * 0..attn_pos[i] of its sequence, attn_pos[i] >= pos[i], where the
     * positions past its own are tokens of this same pass (they are in the
     * cache before any token attends): gemma3 decodes an image's soft
     * tokens non-causally, each seeing the whole image (llama.cpp's
     * mtmd_decode_use_non_causal). Decoders only. */
    const int32_t *attn_pos;
    /* A hybrid's state slots (zi_kv_cache_add_states): row r of
     * block_tables is the sequence of slot state_slots[r]; NULL: slot r.
     * Each slot at most one row. */
    const int32_t *state_slots;
    /* LoRA adapters (lora.h; NULL or lora_k 0: none): token i runs the
     * adapters lora[i * lora_k + j], j < lora_k (NULL: none; each loaded
     * for this model), at the user's scales lora_scale[i * lora_k + j]
     * (NULL: each adapter's default; lora.h zi_lora_scale makes it the
     * product's): each adapted product gets their terms for that token,
     * in float32, in j's order. */
    const struct zi_lora *const *lora;
    const float *lora_scale;
    int lora_k;
} zi_batch;

/* Validates the batch (ids inside the vocabulary, sequences inside the
 * tables, positions inside the cache, table entries inside the pool) and
 * runs it; buffers grow to the largest batch seen.
 * logits gets n_wanted * n_vocab floats (host memory). */
int zi_model_forward(zi_model *m, zi_kv_cache *kv, const zi_batch *b, float *logits, zi_error *err);

/* The checks zi_model_forward makes of a batch before it runs anything
 * (ids inside the vocabulary, sequences inside the tables, positions
 * inside the cache, table entries inside the pool, input embeddings and
 * attention reach well formed): for a caller that replays a captured pass
 * (device_sampler.c), where the model's own checks do not run. */
int zi_model_check_batch(const zi_model *m, const zi_kv_cache *kv, const zi_batch *b,
                         zi_error *err);

/* The same pass, queued on the backend and not waited for (a batch that
 * wants hidden states is refused, ZI_EINVAL: zi_model_forward returns them): the logits of
 * the wanted rows (*n_rows of them, n_vocab floats each) stay in backend
 * memory at *logits (device memory on a GPU), for work queued behind the
 * pass (the GPU sampler) to read; valid until the next pass. The caller
 * calls the backend's sync() before it reads anything the pass wrote, and
 * errors of the queued ops are seen there. The batch is validated and the
 * buffers are sized here, so a pass of a shape run once before allocates
 * nothing and can be captured in a CUDA graph. */
int zi_model_forward_async(zi_model *m, zi_kv_cache *kv, const zi_batch *b, const float **logits,
                           int *n_rows, zi_error *err);

/* Where zi_model_forward_async leaves the logits (backend memory; NULL
 * before the first pass that kept any): a CUDA graph replaying a captured
 * pass writes them there too. */
const float *zi_model_device_logits(const zi_model *m);

/* A function zi_model_forward calls after every layer (NULL: none), so that
 * a caller stays responsive during a long pass: the worker sends its
 * heartbeats from it. It must not call into the model. */
typedef void (*zi_model_progress_fn)(void *arg);
void zi_model_set_progress(zi_model *m, zi_model_progress_fn fn, void *arg);

#endif
