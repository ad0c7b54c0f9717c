/*
 * family.h - what each supported model family (GGUF general.architecture)
 * changes in the one forward pass of model.c, as data.
 *
 * model.c is written once: the Llama block (RMSNorm -> attention -> residual
 * -> RMSNorm -> gated feed-forward -> residual). A family is a row of the
 * table in family.c that switches the small differences on: the RoPE pair
 * layout, per-head Q/K norms, norms after the attention and feed-forward
 * blocks, GeGLU instead of SwiGLU, an embedding scale, local
 * (sliding-window) layers with their own RoPE base, attention and final
 * logit soft-capping, and the defaults of the keys a family's files may
 * leave out. Q/K/V biases (blk.N.attn_q.bias, ...) need no switch: every
 * family loads them when the file has them (qwen2's do), as llama.cpp's
 * create_tensor_qkv does. The bert encoders are rows too (encoder): the
 * same pass with post-norm LayerNorms, biases, bidirectional attention
 * and no output head. Mixtures of experts (qwen3moe, qwen2moe, Mixtral's
 * llama files) replace the feed-forward with routed experts (moe.h): the
 * rows say whether a family has them and how it weighs the chosen ones.
 * docs/models.md says how to add one.
 */
#ifndef ZI_FAMILY_H
#define ZI_FAMILY_H

#include "backend.h"
#include "zi_error.h"

typedef struct zi_family {
    const char *arch; /* general.architecture */
    /* RoPE pairs (x[i], x[i + rope_dim/2]) (llama.cpp's NEOX type) instead of
     * (x[2i], x[2i+1]) (its NORM type, which llama files use). */
    int rope_neox;
    /* Per-head RMSNorm of Q and K before RoPE: blk.N.attn_q_norm.weight and
     * attn_k_norm.weight, head_dim long. */
    int qk_norm;
    /* RMSNorm of the attention and feed-forward outputs before each residual
     * add: blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight. */
    int post_norms;
    /* Feed-forward gelu_tanh(gate) * up instead of silu(gate) * up. */
    int geglu;
    /* The token embedding times sqrt(embedding_length). */
    int embd_scale;
    /* Local layers when the file has attention.sliding_window: the default
     * of attention.sliding_window_pattern n (layer l is local when
     * l % n < n - 1; llama.cpp's set_swa_pattern), 0 for none. */
    int swa_pattern;
    /* The default of attention.sliding_window when the file lacks it (gemma2:
     * 4096); 0: no local layers without the key (gemma3). */
    int swa_default;
    /* The default of rope.freq_base_swa, the local layers' RoPE base; 0:
     * rope.freq_base (gemma2). */
    float rope_base_swa;
    /* Attention logit soft-capping: the default of attn_logit_softcapping
     * (gemma2: 50); 0: the family never caps attention scores (the key is
     * ignored, as llama.cpp's attn_soft_cap = false). */
    float attn_softcap;
    /* The default of final_logit_softcapping (gemma2: 30, always applied);
     * 0: only when the file has the key. */
    float final_softcap;
    /* The attention scale when no key gives it: 0 for 1/sqrt(key_length);
     * n: for files of n layers, 1/sqrt(embedding_length / head_count)
     * (gemma3 27B, whose query_pre_attn_scalar the file does not carry;
     * llama.cpp's rule). */
    int scale_by_dim_layers;
    /* RoPE frequency factors from rope_factors_long / rope_factors_short
     * (phi3; a llama file with rope.scaling.type "longrope" too) instead of
     * rope_freqs (llama 3). */
    int rope_long_short;
    /* Q, K and V from one product when the file has blk.N.attn_qkv.weight
     * ([dim] x [q + k + v rows], in that order), else three tensors. */
    int fused_qkv;
    /* Gate and up from one blk.N.ffn_up.weight of 2 * feed_forward_length
     * rows (gate first: ggml_swiglu's halves), no ffn_gate. */
    int fused_gate_up;
    /* A bert-style encoder (llama.cpp's bert and nomic-bert graphs): the
     * embedding plus token_types.weight's row 0 (type 0 for every token,
     * when the file has the tensor), LayerNorm with bias (token_embd_norm)
     * before the first layer; no pre-norms; after each residual add a
     * LayerNorm with bias (attn_output_norm, layer_output_norm); optional
     * biases of attn_output, ffn_up and ffn_down; bidirectional attention
     * within one input (each input runs whole in one pass); eps from
     * attention.layer_norm_epsilon; no output norm or head: embeddings
     * only, generation is refused. */
    int encoder;
    /* Learned absolute positions (position_embd.weight, context_length
     * rows) added to the embedding, and no RoPE (bert). */
    int abs_pos;
    /* Feed-forward down(gelu(up x)) without a gate (bert). */
    int gelu_ffn;
    /* Routed experts instead of the dense feed-forward (moe.h):
     * ZI_MOE_NONE never, ZI_MOE_IF_KEYED when the file's expert_count is
     * above 0 (llama: Mixtral), ZI_MOE_ALWAYS (qwen3moe, qwen2moe; the file
     * must give expert_count and expert_used_count). */
    int moe;
    /* The default of expert_weights_norm: the chosen experts' weights
     * divided by their sum (llama.cpp's norm_w: true for qwen3moe and
     * Mixtral, false for qwen2moe). */
    int moe_norm;
    /* The experts' width when the file has no expert_feed_forward_length:
     * 0 for feed_forward_length / expert_used_count (the Qwen MoEs), 1 for
     * feed_forward_length itself (Mixtral's llama files). */
    int moe_ffn_full;
    /* How the router's logits weigh the chosen experts: ZI_GATING_SOFTMAX
     * (0) or ZI_GATING_SOFTMAX_WEIGHT (gpt-oss) (moe.h). */
    int moe_gating;
    /* The experts' activation is gpt-oss's clamped SwiGLU (alpha 1.702,
     * limit 7: llama.cpp's LLM_FFN_SWIGLU_OAI_MOE) instead of SwiGLU; the
     * router and the experts have biases (ffn_gate_inp.bias,
     * ffn_{gate,up,down}_exps.bias). */
    int moe_oai;
    /* A learned logit per head in the attention's softmax:
     * blk.N.attn_sinks.weight, head_count long (gpt-oss). */
    int attn_sinks;
    /* The feed-forward's pre-norm is blk.N.post_attention_norm.weight, not
     * ffn_norm (gpt-oss's files name it so; it is no post-norm). */
    int ffn_norm_post_attn;
    /* Local layers scale their RoPE like the global ones (gpt-oss: YaRN on
     * every layer); 0: local layers never scale (gemma). */
    int swa_rope_scaled;
    /* A shared expert beside the routed ones, gated by
     * sigmoid(ffn_gate_inp_shexp . x) (qwen2moe). */
    int moe_shared;
    /* A hybrid: which of its layers keep a recurrent state instead of
     * attention, and what that layer is (ZI_REC_*). ZI_REC_SHORTCONV
     * (lfm2): the layers whose attention.head_count_kv (an array, one per
     * layer) is 0; each runs in_proj (dim -> 3 dim: b, c, x), y = c *
     * conv(b * x) over time (shortconv.conv, shortconv.l_cache wide, its
     * window carried in the state), out_proj. ZI_REC_DELTANET (qwen35):
     * the layers attention.recurrent_layers marks (else all but every
     * full_attention_interval-th) run a gated DeltaNet: attn_qkv, a causal
     * convolution (ssm_conv1d, ssm.conv_kernel wide) and SiLU, the gated
     * delta rule over per-head states (ssm.*, backend.h's delta_net), a
     * per-head RMSNorm (ssm_norm) times silu(attn_gate x), ssm_out.
     * ZI_REC_MAMBA2 (granitehybrid): the layers whose
     * attention.head_count_kv entry is 0 run Mamba-2: ssm_in (z | xBC |
     * dt), a causal convolution over xBC (ssm_conv1d, ssm.conv_kernel
     * wide, plus its bias) and SiLU, the selective scan (backend.h's
     * ssm_scan: per-head P x N states, ssm_dt.bias, ssm_a, ssm_d), times
     * silu(z), an RMSNorm per group of ssm.group_count (ssm_norm),
     * ssm_out. */
    int recurrent;
    /* The output norm's tensor name when not output_norm.weight (lfm2's
     * files call it token_embd_norm.weight). */
    const char *output_norm;
    /* Gated attention (qwen35): attn_q gives, per head, the query then a
     * gate of head_dim each; the attention's output is multiplied by
     * sigmoid(gate) before attn_output. */
    int attn_gate;
    /* Granite's multipliers (granitehybrid), each read from the file and
     * unused when absent or 0: the embedding times embedding_scale, every
     * block's output (attention, recurrent, feed-forward) times
     * residual_scale before its residual add, the attention scale
     * attention.scale, the logits divided by logit_scale; and
     * rope.scaling.finetuned (default true) switches RoPE on (false: the
     * attention layers take no position, Granite 4.0-H's files). */
    int granite_scales;
} zi_family;

/* zi_family.moe */
enum { ZI_MOE_NONE = 0, ZI_MOE_IF_KEYED = 1, ZI_MOE_ALWAYS = 2 };
/* zi_family.recurrent */
enum { ZI_REC_NONE = 0, ZI_REC_SHORTCONV = 1, ZI_REC_DELTANET = 2, ZI_REC_MAMBA2 = 3 };

/* The family of general.architecture `arch` (len bytes), or NULL. */
const zi_family *zi_family_find(const char *arch, size_t len);
/* The supported architectures, comma-separated, for error messages. */
const char *zi_family_names(void);
/* ZI_EUNSUPPORTED, naming the family and the missing op, when backend be
 * lacks an op the family (with these options) needs: has_local_layers,
 * softcap (final logits), attn_softcap (attention scores), bias (Q/K/V or
 * output biases), experts (routed experts: gather and weighted sums of
 * rows, grouped products); an encoder needs LayerNorm and bias add, gelu_ffn GELU. */
int zi_family_check_backend(const zi_family *f, const zi_backend *be, int has_local_layers,
                            int softcap, int attn_softcap, int bias, int experts, zi_error *err);
/* ZI_EUNSUPPORTED, naming the file's key, when be lacks YaRN RoPE and the
 * file asks for it (yarn: rope.scaling.type "yarn"). */
int zi_family_check_rope(const zi_family *f, const zi_backend *be, int yarn, zi_error *err);

#endif
