/*
 * family.c - the table of supported model families (see family.h).
 *
 * Each row is what llama.cpp does for that architecture
 * (src/models/<arch>.cpp and llama-model.cpp), recorded as facts: the
 * forward pass itself is model.c's, shared by all rows.
 */
#include "family.h"

#include "moe.h"

#include <string.h>

static const zi_family families[] = {
    /* Llama 2/3 and the files that reuse its architecture name (SmolLM2);
     * with llama.expert_count, Mixtral: softmax over all experts, top-k,
     * renormalized, experts feed_forward_length wide (models/llama.cpp). */
    {.arch = "llama", .moe = ZI_MOE_IF_KEYED, .moe_norm = 1, .moe_ffn_full = 1},
    /* Gemma 3: NEOX RoPE, Q/K norms, post-norms, GeGLU, embedding scale,
     * five local layers of every six with RoPE base 10000 (llama.cpp:
     * load_swa_pattern(ml, 6), rope_freq_base_train_swa = 10000), the 27B's
     * attention scale from embedding_length / head_count. */
    {.arch = "gemma3",
     .rope_neox = 1,
     .qk_norm = 1,
     .post_norms = 1,
     .geglu = 1,
     .embd_scale = 1,
     .swa_pattern = 6,
     .rope_base_swa = 10000.0f,
     .scale_by_dim_layers = 62},
    /* Phi-3: NEOX RoPE, fused QKV (attn_qkv, or separate tensors), fused
     * gate and up (ffn_up of 2 x ffn rows), long-context files' RoPE
     * factors rope_factors_long/short. Its files' attention.sliding_window
     * is ignored, as llama.cpp does (phi3.cpp sets n_swa = 0). */
    {.arch = "phi3", .rope_neox = 1, .rope_long_short = 1, .fused_qkv = 1, .fused_gate_up = 1},
    /* Qwen 2 / 2.5: the llama block with NEOX RoPE; its Q/K/V biases (and an
     * optional output.bias) are loaded whenever present (model.c). */
    {.arch = "qwen2", .rope_neox = 1},
    /* Qwen 3: NEOX RoPE and per-head Q/K RMSNorm before it, no biases. */
    {.arch = "qwen3", .rope_neox = 1, .qk_norm = 1},
    /* Qwen3-MoE (Qwen3-30B-A3B, 235B-A22B): qwen3's attention; routed
     * experts, softmax over all then the top expert_used_count, their
     * weights renormalized (llama.cpp's qwen3moe.cpp: norm_w true). */
    {.arch = "qwen3moe", .rope_neox = 1, .qk_norm = 1, .moe = ZI_MOE_ALWAYS, .moe_norm = 1},
    /* Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): qwen2's attention with
     * its biases; routed experts whose weights are not renormalized, plus a
     * shared expert under a sigmoid gate (qwen2moe.cpp). */
    {.arch = "qwen2moe", .rope_neox = 1, .moe = ZI_MOE_ALWAYS, .moe_shared = 1},
    /* gpt-oss (llama.cpp's openai-moe.cpp): NEOX RoPE with YaRN on every
     * layer; even layers local (load_swa_pattern(ml, 2)) with the global
     * RoPE base; attention sinks; Q/K/V and output biases; the
     * feed-forward's norm named post_attention_norm; routed experts with
     * biases, top-k logits then a softmax over them, not renormalized, and
     * the clamped SwiGLU. */
    {.arch = "gpt-oss",
     .rope_neox = 1,
     .swa_pattern = 2,
     .swa_default = 128,
     .rope_base_swa = 0.0f,
     .swa_rope_scaled = 1,
     .attn_sinks = 1,
     .ffn_norm_post_attn = 1,
     .moe = ZI_MOE_ALWAYS,
     .moe_gating = ZI_GATING_SOFTMAX_WEIGHT,
     .moe_oai = 1},
    /* Gemma 2 (llama.cpp's llama_model_gemma2): NEOX RoPE, post-norms,
     * GeGLU, embedding scale; attention.sliding_window defaults to 4096 and
     * load_swa_pattern(ml, 2) makes the even layers local, with RoPE base
     * rope.freq_base_swa defaulting to rope.freq_base; attention scores
     * capped at attn_logit_softcapping (default 50) and logits at
     * final_logit_softcapping (default 30); the 46-layer 27B's attention
     * scale from embedding_length / head_count. No Q/K norms. */
    {.arch = "gemma2",
     .rope_neox = 1,
     .post_norms = 1,
     .geglu = 1,
     .embd_scale = 1,
     .swa_pattern = 2,
     .swa_default = 4096,
     .rope_base_swa = 0.0f,
     .attn_softcap = 50.0f,
     .final_softcap = 30.0f,
     .scale_by_dim_layers = 46},
    /* BERT encoders (bge, MiniLM; llama.cpp's bert graph): learned
     * absolute positions, token type 0, post-norm LayerNorms, biases, GELU
     * feed-forward, bidirectional attention, no RoPE. */
    {.arch = "bert", .encoder = 1, .abs_pos = 1, .gelu_ffn = 1},
    /* nomic-embed-text (llama.cpp's nomic-bert): the bert block with NEOX
     * RoPE instead of positions, fused QKV and a SwiGLU feed-forward. */
    {.arch = "nomic-bert", .encoder = 1, .rope_neox = 1, .fused_qkv = 1},
    /* LFM2 (LiquidAI, models/lfm2.cpp): a hybrid of short gated
     * convolutions (the layers with head_count_kv 0) and GQA attention
     * layers with per-head Q/K norms and NEOX RoPE; every layer's
     * feed-forward is SwiGLU; the output norm is token_embd_norm. */
    {.arch = "lfm2",
     .rope_neox = 1,
     .qk_norm = 1,
     .recurrent = ZI_REC_SHORTCONV,
     .output_norm = "token_embd_norm.weight"},
    /* Qwen3.5 (models/qwen35.cpp, delta-net-base.cpp): gated DeltaNet
     * layers between gated attention layers (per-head Q/K norms, partial
     * NEOX RoPE over rope.dimension_count: text positions make its
     * interleaved M-RoPE that, an output gate); the feed-forward's norm
     * is post_attention_norm. */
    {.arch = "qwen35",
     .rope_neox = 1,
     .qk_norm = 1,
     .ffn_norm_post_attn = 1,
     .recurrent = ZI_REC_DELTANET,
     .attn_gate = 1},
    /* IBM Granite 4.0-H (models/granite-hybrid.cpp, mamba-base.cpp):
     * Mamba-2 layers between attention layers (NORM RoPE only when
     * rope.scaling.finetuned says so), Granite's multipliers. */
    {.arch = "granitehybrid", .recurrent = ZI_REC_MAMBA2, .granite_scales = 1},
};

const zi_family *zi_family_find(const char *arch, size_t len) {
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strlen(families[i].arch) == len && memcmp(families[i].arch, arch, len) == 0)
            return &families[i];
    return NULL;
}

const char *zi_family_names(void) {
    return "llama, gemma3, phi3, qwen2, qwen3, qwen3moe, qwen2moe, gpt-oss, gemma2, bert, "
           "nomic-bert, lfm2, qwen35, granitehybrid";
}

int zi_family_check_backend(const zi_family *f, const zi_backend *be, int has_local_layers,
                            int softcap, int attn_softcap, int bias, int experts, zi_error *err) {
    const zi_backend_ops *op = be->ops;
    const char *missing =
        f->rope_neox && !op->rope_neox          ? "NEOX RoPE"
        : f->geglu && !op->geglu                ? "GeGLU"
        : f->embd_scale && !op->scale           ? "scale"
        : softcap && !op->softcap               ? "logit soft-capping"
        : has_local_layers && !be->attn_window  ? "sliding-window attention"
        : attn_softcap && !be->attn_softcap     ? "attention logit soft-capping"
        : (bias || f->encoder) && !op->add_bias ? "bias add"
        : f->encoder && !op->layernorm          ? "LayerNorm"
        : f->gelu_ffn && !op->gelu              ? "GELU"
        : experts && (!op->gather_rows || !op->weighted_sum_rows || !op->matmul_groups)
            ? "expert routing"
        : f->moe_oai && !op->swiglu_oai                                    ? "clamped SwiGLU"
        : f->attn_sinks && !be->attn_sinks                                 ? "attention sinks"
        : f->recurrent && (!op->mul || !op->conv_state)                    ? "recurrent layers"
        : f->recurrent == ZI_REC_DELTANET && (!op->silu || !op->delta_net) ? "gated DeltaNet"
        : f->recurrent == ZI_REC_MAMBA2 &&
                (!op->silu || !op->ssm_scan || !op->rmsnorm_groups || !op->add_bias || !op->scale)
            ? "Mamba-2 layers"
        : f->attn_gate && (!op->sigmoid_mul || !op->gather_rows) ? "gated attention"
                                                                 : NULL;
    if (missing)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "the %s backend cannot run architecture '%s' yet (no %s)", op->name,
                            f->arch, missing);
    return ZI_OK;
}

int zi_family_check_rope(const zi_family *f, const zi_backend *be, int yarn, zi_error *err) {
    if (yarn && !be->rope_yarn)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "the %s backend cannot run architecture '%s' yet (no YaRN RoPE: "
                            "%s.rope.scaling.type = yarn)",
                            be->ops->name, f->arch, f->arch);
    return ZI_OK;
}
