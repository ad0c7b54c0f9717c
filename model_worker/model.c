/*
 * model.c - the Llama-family forward pass (see model.h).
 *
 * Short on purpose: every operation is a call into the backend, so this file
 * is the architecture and nothing else. Buffers are sized for the largest
 * batch seen so far and reused.
 */
#include "model.h"

#include "encoder_span.h"
#include "family.h"
#include "lora.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zi_layer {
    float *attn_norm, *ffn_norm;
    float *q_norm, *k_norm;                /* family qk_norm, else NULL */
    float *post_attn_norm, *post_ffn_norm; /* family post_norms, else NULL */
    float *bq, *bk, *bv;                   /* Q/K/V biases when the file has them */
    float *sinks;                          /* family attn_sinks: one logit per head */
    /* encoders (family.h): the LayerNorms after the attention and the
     * feed-forward residuals, and the optional biases */
    float *ln_attn, *ln_attn_b, *ln_out, *ln_out_b, *bo, *b_up, *b_down;
    int local;                                      /* a sliding-window layer */
    zi_weight wq, wk, wv, wo, w_gate, w_up, w_down; /* w_gate..w_down: a dense layer's */
    zi_moe_layer moe; /* a mixture of experts' (cfg.moe.n_expert > 0) */
    /* A hybrid's recurrent layer (family.h's recurrent) in place of the
     * attention: lfm2's short convolution, its in_proj split at load into
     * the b, c and x rows, the kernel ([dim][conv_len]) and out_proj. */
    int recurrent;
    zi_weight sc_b, sc_c, sc_x, sc_out;
    float *sc_conv;
    /* qwen35's gated DeltaNet: attn_qkv, attn_gate, ssm_alpha, ssm_beta,
     * ssm_out; the convolution's kernel, ssm_dt.bias, ssm_a, ssm_norm */
    zi_weight dn_qkv, dn_z, dn_alpha, dn_beta, dn_out;
    float *dn_conv, *dn_dt, *dn_a, *dn_norm;
    /* granitehybrid's Mamba-2: ssm_in's z, xBC and dt rows, ssm_out; the
     * convolution's kernel and bias, ssm_dt.bias, ssm_a, ssm_d, ssm_norm */
    zi_weight mb_z, mb_xbc, mb_dt, mb_out;
    float *mb_conv, *mb_conv_b, *mb_dt_b, *mb_a, *mb_d, *mb_norm;
} zi_layer;

struct zi_model {
    zi_model_config cfg;
    /* A pass's LoRA terms for one product (lora_apply), [lora_cap] */
    zi_lora_row *lora_rows;
    int lora_cap;
    zi_backend *be;
    zi_gguf *gguf;
    zi_weight tok_embd, output;
    float *output_norm;
    /* RoPE frequency factors, rope_dim/2 each, or NULL: Llama 3's
     * rope_freqs; phi3's long and short ones, picked per pass by the
     * cache's context (llama.cpp's get_rope_factors). */
    float *rope_freqs, *rope_long, *rope_short;
    float *output_bias; /* output.bias when the file has it (qwen2 may) */
    /* encoders: position_embd (abs_pos), token_types row 0 (NULL: none),
     * token_embd_norm; and, per pass, each token's attention span (the
     * last position of its input) with the per-row counts behind it, and
     * the tokens grouped by input for span_attention (encoder_span.h):
     * order lives after span's span_cap ints, starts after row_n's 2 * row_cap */
    zi_weight pos_embd;
    float *type0, *embd_norm, *embd_norm_b;
    int32_t *span, *row_n, *order, *starts;
    int span_cap, row_cap;
    /* A pass's token ids with 0 where an input embedding replaces the
     * token (zi_batch.embd_rows: those ids need not be in the vocabulary,
     * a prefix cache keys image positions by them), for get_rows */
    int32_t *embd_ids;
    int embd_ids_cap;
    /* A hybrid's pass: each token's state slot (check_states) */
    int32_t *tok_slot;
    int tok_slot_cap;
    /* gated attention (family.h's attn_gate): the rows of each head's
     * query, then of its gate, in attn_q's output (host memory, 2 * cap *
     * n_heads) */
    int32_t *gate_idx;
    zi_layer *layers;
    uint64_t weight_bytes;
    uint64_t weight_macs;  /* multiply-adds of the products per token */
    uint64_t expert_bytes; /* of weight_bytes, the routed experts' */
    zi_moe_scratch *moe_scratch;
    /* activation buffers, in backend memory, for up to `cap` tokens */
    int cap;
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *tmp;
    int logits_cap;
    float *logits;
    int reserved_tokens, reserved_ctx; /* what the backend's scratch is sized for */
    zi_model_progress_fn progress;
    void *progress_arg;
};

struct zi_kv_cache {
    zi_model *m;
    int n_blocks, block_size, max_ctx;
    void **k, **v; /* per layer: n_blocks blocks, the backend's layout (backend.h);
                    * NULL for a recurrent layer */
    /* A hybrid's state slots (zi_kv_cache_add_states): per recurrent layer
     * n_states rows of (conv_len - 1) * dim floats (backend memory), and
     * each slot's length, the positions its state covers. */
    int n_states;
    float **conv, **ssm; /* ssm: the recurrent states past the window (qwen35's S) */
    int32_t *state_len;
    int32_t *state_next, *state_row; /* [n_states] a pass's check (check_states) */
};

/* ---- loading ---- */

static int meta_u32(const zi_gguf *g, const char *arch, const char *key, uint32_t *out,
                    zi_error *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    return zi_gguf_get_u32(g, full, out, err);
}

/* Granite's multipliers and RoPE switch (family.h's granite_scales): each
 * a finite number >= 0 (0 or absent: unused); attention.scale replaces
 * 1/sqrt(head_dim) when above 0. */
static int load_granite_scales(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    c->embedding_scale = c->residual_scale = c->logit_scale = 0.0f;
    c->no_rope = 0;
    if (!c->family->granite_scales) return ZI_OK;
    static const char *const names[] = {"embedding_scale", "residual_scale", "logit_scale",
                                        "attention.scale"};
    float *dst[] = {&c->embedding_scale, &c->residual_scale, &c->logit_scale, NULL};
    char key[128];
    int rc;
    for (int i = 0; i < 4; i++) {
        float v;
        snprintf(key, sizeof key, "%s.%s", c->arch, names[i]);
        if ((rc = zi_gguf_get_f32_or(g, key, 0.0f, &v, err))) return rc;
        if (!(v >= 0.0f) || !isfinite(v))
            return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, v);
        if (dst[i])
            *dst[i] = v;
        else if (v > 0.0f)
            c->attn_scale = v;
    }
    int finetuned;
    snprintf(key, sizeof key, "%s.rope.scaling.finetuned", c->arch);
    if ((rc = zi_gguf_get_bool_or(g, key, 1, &finetuned, err))) return rc;
    c->no_rope = !finetuned;
    return ZI_OK;
}

/* The keys only some families use, with the family's defaults (family.h). */
static int load_family_config(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    const zi_family *f = c->family;
    char key[128];
    int rc;
    c->attn_scale = 1.0f / sqrtf((float)c->head_dim);
    if (f->scale_by_dim_layers && c->n_layers == f->scale_by_dim_layers)
        c->attn_scale = 1.0f / sqrtf((float)(c->dim / c->n_heads));
    snprintf(key, sizeof key, "%s.final_logit_softcapping", c->arch);
    if ((rc = zi_gguf_get_f32_or(g, key, f->final_softcap, &c->final_softcap, err))) return rc;
    if (!(c->final_softcap >= 0.0f) || !isfinite(c->final_softcap))
        return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, c->final_softcap);
    c->attn_softcap = 0.0f;
    if (f->attn_softcap > 0.0f) { /* only families that cap attention read it */
        snprintf(key, sizeof key, "%s.attn_logit_softcapping", c->arch);
        if ((rc = zi_gguf_get_f32_or(g, key, f->attn_softcap, &c->attn_softcap, err))) return rc;
        if (!(c->attn_softcap >= 0.0f) || !isfinite(c->attn_softcap))
            return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, c->attn_softcap);
    }
    if ((rc = load_granite_scales(g, c, err))) return rc;
    uint32_t v;
    snprintf(key, sizeof key, "%s.attention.sliding_window", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)f->swa_default, &v, err))) return rc;
    if (v > (1u << 30)) return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", key, v);
    c->sliding_window = f->swa_pattern ? (int)v : 0;
    if (c->sliding_window) {
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", c->arch);
        const zi_gguf_kv *pat = zi_gguf_find_kv(g, key);
        if (pat && pat->type == ZI_GGUF_ARRAY) { /* per layer: read by load_weights */
            if (pat->arr_type != ZI_GGUF_BOOL || pat->arr_len != (uint64_t)c->n_layers)
                return zi_error_set(err, ZI_EFORMAT, "%s must be %d bools", key, c->n_layers);
            c->swa_pattern = -1;
        } else {
            if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)f->swa_pattern, &v, err))) return rc;
            if (v > (1u << 24))
                return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", key, v);
            c->swa_pattern = (int)v;
        }
        snprintf(key, sizeof key, "%s.rope.freq_base_swa", c->arch);
        const float base_swa = f->rope_base_swa > 0.0f ? f->rope_base_swa : c->rope_base;
        if ((rc = zi_gguf_get_f32_or(g, key, base_swa, &c->rope_base_swa, err))) return rc;
        if (!(c->rope_base_swa > 0.0f) || !isfinite(c->rope_base_swa))
            return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, c->rope_base_swa);
    }
    return ZI_OK;
}

/* rope.scaling.*, as llama.cpp reads them (llama-model.cpp load_hparams,
 * llama-context.cpp): the type defaults to "linear", whose factor (default
 * 1) divides every angle; "none" never scales; "longrope" (phi3's
 * long-context files) scales the same way and takes its per-pair factors
 * from rope_factors_long/short; attn_factor (default 1) multiplies cos and
 * sin whatever the type. YaRN and anything else are refused by name. */
static int load_rope_scaling(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    char key[128];
    int rc;
    c->rope_freq_scale = c->rope_attn_factor = 1.0f;
    c->rope_longrope = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", c->arch);
    const zi_gguf_kv *type = zi_gguf_find_kv(g, key);
    int none = 0;
    if (type) {
        if (type->type != ZI_GGUF_STRING)
            return zi_error_set(err, ZI_EFORMAT, "%s is not a string", key);
        zi_str t = type->str;
        none = zi_str_eq(t, "none");
        c->rope_longrope = zi_str_eq(t, "longrope");
        c->rope_yarn = zi_str_eq(t, "yarn");
        if (!none && !c->rope_longrope && !c->rope_yarn && !zi_str_eq(t, "linear"))
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "%s = '%.*s' is not supported (only none, linear, longrope, yarn)",
                                key, (int)(t.len > 64 ? 64 : t.len), t.ptr);
    }
    float factor = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", c->arch);
    if (!zi_gguf_find_kv(g, key)) snprintf(key, sizeof key, "%s.rope.scale_linear", c->arch);
    if ((rc = zi_gguf_get_f32_or(g, key, 0.0f, &factor, err))) return rc;
    if (!(factor >= 0.0f) || !isfinite(factor) || (factor > 0.0f && factor < 1e-6f))
        return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, factor);
    if (!none && factor > 0.0f) c->rope_freq_scale = 1.0f / factor;
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", c->arch);
    if ((rc = zi_gguf_get_f32_or(g, key, 1.0f, &c->rope_attn_factor, err))) return rc;
    if (!(c->rope_attn_factor > 0.0f) || !isfinite(c->rope_attn_factor))
        return zi_error_set(err, ZI_EFORMAT, "%s = %g is out of range", key, c->rope_attn_factor);
    uint32_t v;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)c->ctx_train, &v, err))) return rc;
    if (v == 0 || v > (1u << 24))
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", key, v);
    c->rope_orig_ctx = (int)v;
    /* YaRN's magnitude: llama.cpp sets yarn_attn_factor to get_mscale(f) /
     * (1 + 0.1 ln f) (= 1 for f > 1) and ggml's rope_yarn multiplies it by
     * 1 + 0.1 ln f again. */
    if (c->rope_yarn && !(c->rope_base > 1.0f)) /* YaRN's corr dims divide by ln(base) */
        return zi_error_set(err, ZI_EFORMAT, "%s.rope.freq_base = %g must be above 1 with yarn",
                            c->arch, c->rope_base);
    if (c->rope_yarn && factor > 1.0f)
        c->rope_attn_factor *= (float)(1.0 + 0.1 * log((double)factor));
    return ZI_OK;
}

/* ggml_rope_yarn_corr_dims for RoPE base `base`: the pair indices where
 * YaRN's ramp starts and ends (beta_fast 32, beta_slow 1). */
static void yarn_corr_dims(const zi_model_config *c, float base, float *lo, float *hi) {
    const double pi = 3.14159265358979323846;
#define ZI_CORR_DIM(beta)                                                                          \
    ((double)c->rope_dim * log((double)c->rope_orig_ctx / ((beta)*2 * pi)) /                       \
     (2 * log((double)base)))
    const double start = floor(ZI_CORR_DIM(32.0)), end = ceil(ZI_CORR_DIM(1.0));
#undef ZI_CORR_DIM
    *lo = (float)(start > 0.0 ? start : 0.0);
    *hi = (float)(end < c->rope_dim - 1 ? end : c->rope_dim - 1);
}

/* A mixture of experts' routing keys (moe.h), when the family has experts
 * (ZI_MOE_ALWAYS) or the file says so (ZI_MOE_IF_KEYED: Mixtral's llama
 * files carry llama.expert_count). */
static int load_moe_config(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    const zi_family *f = c->family;
    char key[128];
    uint32_t n = 0;
    memset(&c->moe, 0, sizeof c->moe);
    if (f->moe == ZI_MOE_NONE) return ZI_OK;
    snprintf(key, sizeof key, "%s.expert_count", c->arch);
    if (f->moe == ZI_MOE_IF_KEYED) {
        int rc = zi_gguf_get_u32_or(g, key, 0, &n, err);
        if (rc) return rc;
        if (n == 0) return ZI_OK;
    }
    int rc = zi_moe_read_params(g, c->arch, c->ffn_dim, f->moe_ffn_full ? c->ffn_dim : 0,
                                f->moe_norm, f->moe_shared, &c->moe, err);
    c->moe.gating = f->moe_gating;
    c->moe.oai = f->moe_oai;
    return rc;
}

/* Whether layer l is a local (sliding-window) layer: llama.cpp's
 * set_swa_pattern without dense_first (n = 0: every layer). */
static int layer_is_local(const zi_model_config *c, int l) {
    if (!c->sliding_window || c->swa_pattern < 0) return 0;
    return c->swa_pattern == 0 || l % c->swa_pattern < c->swa_pattern - 1;
}

/* The u32 or i32 array `key` (its length into *n), or ZI_EFORMAT naming it. */
static int int_array(const zi_gguf *g, const char *key, const uint8_t **d, uint64_t *n,
                     zi_error *err) {
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, key);
    *d = NULL, *n = 0;
    if (!kv || kv->type != ZI_GGUF_ARRAY ||
        (kv->arr_type != ZI_GGUF_INT32 && kv->arr_type != ZI_GGUF_UINT32))
        return zi_error_set(err, ZI_EFORMAT, "%s must be an array of integers", key);
    const void *p;
    int rc = zi_gguf_get_array(g, key, kv->arr_type, &p, n, err);
    *d = p;
    return rc;
}

/*
 * A hybrid's layer pattern. attention.head_count_kv (key) is a number, or
 * for a hybrid an array with one entry per layer; lfm2 (ZI_REC_SHORTCONV)
 * marks its recurrent layers with 0 there, the others all alike; qwen35
 * (ZI_REC_DELTANET) with attention.recurrent_layers (bools, one per block,
 * the MTP blocks too) or else every layer but each full_attention_interval-
 * th (default 4). Sets *kv_heads (head_count when absent) and
 * *n_recurrent; recurrent_of (when not NULL) gets each layer's kind.
 */
static int layer_kinds(const zi_gguf *g, const zi_model_config *c, const char *key,
                       uint32_t *kv_heads, int *n_recurrent, uint8_t *recurrent_of, zi_error *err) {
    const int rec = c->family->recurrent;
    const zi_gguf_kv *kvk = zi_gguf_find_kv(g, key);
    *n_recurrent = 0;
    if (!kvk || kvk->type != ZI_GGUF_ARRAY || !rec) {
        int rc = zi_gguf_get_u32_or(g, key, (uint32_t)c->n_heads, kv_heads, err);
        if (rc || rec != ZI_REC_DELTANET) return rc;
    } else {
        const uint8_t *d = NULL;
        uint64_t n = 0;
        int rc = int_array(g, key, &d, &n, err);
        if (rc) return rc;
        if (n < (uint64_t)c->n_layers || (rec != ZI_REC_DELTANET && n != (uint64_t)c->n_layers))
            return zi_error_set(err, ZI_EFORMAT, "%s must be %d integers, one per layer", key,
                                c->n_layers);
        *kv_heads = 0;
        for (int l = 0; l < c->n_layers; l++) {
            uint32_t h;
            memcpy(&h, d + 4 * (size_t)l, 4);
            if (rec != ZI_REC_DELTANET) { /* lfm2, granitehybrid: 0 marks recurrent */
                if (recurrent_of) recurrent_of[l] = h == 0;
                if (h == 0) {
                    ++*n_recurrent;
                    continue;
                }
            }
            if (h && *kv_heads && h != *kv_heads)
                return zi_error_set(err, ZI_EUNSUPPORTED,
                                    "%s: layer %d has %u KV heads, an earlier layer %u (the "
                                    "attention layers must agree)",
                                    key, l, h, *kv_heads);
            if (h) *kv_heads = h;
        }
        if (*kv_heads == 0) *kv_heads = (uint32_t)c->n_heads; /* no attention layer */
        if (rec != ZI_REC_DELTANET) return ZI_OK;
    }
    /* ZI_REC_DELTANET: its own keys say which layers are recurrent */
    char k2[128];
    snprintf(k2, sizeof k2, "%s.attention.recurrent_layers", c->arch);
    const zi_gguf_kv *rl = zi_gguf_find_kv(g, k2);
    uint32_t interval = 4;
    if (rl) {
        const void *d;
        uint64_t n;
        int rc = zi_gguf_get_array(g, k2, ZI_GGUF_BOOL, &d, &n, err);
        if (rc) return rc;
        if (n != (uint64_t)c->n_layers + (uint64_t)c->n_nextn)
            return zi_error_set(err, ZI_EFORMAT, "%s must be %d bools, one per block", k2,
                                c->n_layers + c->n_nextn);
        for (int l = 0; l < c->n_layers; l++) {
            const int r = ((const uint8_t *)d)[l] != 0;
            if (recurrent_of) recurrent_of[l] = (uint8_t)r;
            *n_recurrent += r;
        }
        return ZI_OK;
    }
    snprintf(k2, sizeof k2, "%s.full_attention_interval", c->arch);
    int rc = zi_gguf_get_u32_or(g, k2, 4, &interval, err);
    if (rc) return rc;
    if (interval < 1 || interval > (1u << 20))
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", k2, interval);
    for (int l = 0; l < c->n_layers; l++) {
        const int r = (l + 1) % (int)interval != 0;
        if (recurrent_of) recurrent_of[l] = (uint8_t)r;
        *n_recurrent += r;
    }
    return ZI_OK;
}

/* A u32 key of the arch in [lo, hi], or ZI_EFORMAT naming it. */
static int u32_in(const zi_gguf *g, const char *arch, const char *key, uint32_t lo, uint32_t hi,
                  int *out, zi_error *err) {
    uint32_t v;
    int rc = meta_u32(g, arch, key, &v, err);
    if (rc) return rc;
    if (v < lo || v > hi)
        return zi_error_set(err, ZI_EFORMAT, "%s.%s = %u is out of range (%u..%u)", arch, key, v,
                            lo, hi);
    *out = (int)v;
    return ZI_OK;
}

/* granitehybrid's Mamba-2 keys (ssm.*) into c, checked against each
 * other: heads split the inner channels evenly and groups the heads. */
static int load_mamba2_config(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    int rc;
    if ((rc = u32_in(g, c->arch, "ssm.conv_kernel", 2, 64, &c->conv_len, err)) ||
        (rc = u32_in(g, c->arch, "ssm.inner_size", 1, 1 << 20, &c->ssm_inner, err)) ||
        (rc = u32_in(g, c->arch, "ssm.state_size", 1, 4096, &c->ssm_state, err)) ||
        (rc = u32_in(g, c->arch, "ssm.time_step_rank", 1, 4096, &c->ssm_heads, err)) ||
        (rc = u32_in(g, c->arch, "ssm.group_count", 1, 4096, &c->ssm_groups, err)))
        return rc;
    if (c->ssm_inner % c->ssm_heads)
        return zi_error_set(err, ZI_EFORMAT,
                            "%s.ssm.inner_size = %d is not a multiple of ssm.time_step_rank = %d",
                            c->arch, c->ssm_inner, c->ssm_heads);
    if (c->ssm_heads % c->ssm_groups)
        return zi_error_set(err, ZI_EFORMAT,
                            "%s.ssm.time_step_rank = %d is not a multiple of ssm.group_count = %d",
                            c->arch, c->ssm_heads, c->ssm_groups);
    /* Granite 4.0-H-Tiny / -Small route experts (and a shared one) in
     * place of the dense feed-forward: not run yet, refused by name */
    char key[128];
    uint32_t experts;
    snprintf(key, sizeof key, "%s.expert_count", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, 0, &experts, err))) return rc;
    if (experts > 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s = %u: zinfer runs granitehybrid's dense feed-forward only", key,
                            experts);
    return ZI_OK;
}

/* The layer pattern of a hybrid (layer_kinds) and its recurrent layers'
 * keys into c. */
static int load_layer_kinds(const zi_gguf *g, zi_model_config *c, const char *key,
                            uint32_t *kv_heads, zi_error *err) {
    int rc = layer_kinds(g, c, key, kv_heads, &c->n_recurrent, NULL, err);
    c->conv_len = c->dn_k_heads = c->dn_v_heads = c->dn_head_dim = 0;
    c->ssm_inner = c->ssm_heads = c->ssm_groups = c->ssm_state = 0;
    if (rc || !c->n_recurrent) return rc;
    if (c->n_recurrent == c->n_layers) /* the KV cache's sizing divides by its bytes a token */
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: all %d layers are recurrent; zinfer runs hybrids with at least "
                            "one attention layer (%s.attention.head_count_kv, "
                            "attention.recurrent_layers, full_attention_interval)",
                            c->arch, c->n_layers, c->arch);
    if (c->family->recurrent == ZI_REC_SHORTCONV)
        return u32_in(g, c->arch, "shortconv.l_cache", 2, 64, &c->conv_len, err);
    if (c->family->recurrent == ZI_REC_MAMBA2) return load_mamba2_config(g, c, err);
    int inner = 0;
    if ((rc = u32_in(g, c->arch, "ssm.conv_kernel", 2, 64, &c->conv_len, err)) ||
        (rc = u32_in(g, c->arch, "ssm.state_size", 1, 1024, &c->dn_head_dim, err)) ||
        (rc = u32_in(g, c->arch, "ssm.group_count", 1, 4096, &c->dn_k_heads, err)) ||
        (rc = u32_in(g, c->arch, "ssm.time_step_rank", 1, 4096, &c->dn_v_heads, err)) ||
        (rc = u32_in(g, c->arch, "ssm.inner_size", 1, 1 << 24, &inner, err)))
        return rc;
    if (c->dn_v_heads % c->dn_k_heads)
        return zi_error_set(err, ZI_EFORMAT,
                            "%s.ssm.time_step_rank = %d is not a multiple of ssm.group_count = %d",
                            c->arch, c->dn_v_heads, c->dn_k_heads);
    if ((int64_t)inner != (int64_t)c->dn_v_heads * c->dn_head_dim)
        return zi_error_set(err, ZI_EFORMAT,
                            "%s.ssm.inner_size = %d is not time_step_rank x state_size (%d x %d)",
                            c->arch, inner, c->dn_v_heads, c->dn_head_dim);
    return ZI_OK;
}

/* The channels of a recurrent layer's convolution, and the floats of its
 * recurrent state besides the convolution's window (per sequence). */
static int64_t conv_channels(const zi_model_config *c) {
    if (c->family->recurrent == ZI_REC_DELTANET)
        return (int64_t)(2 * c->dn_k_heads + c->dn_v_heads) * c->dn_head_dim;
    if (c->family->recurrent == ZI_REC_MAMBA2)
        return (int64_t)c->ssm_inner + 2 * (int64_t)c->ssm_groups * c->ssm_state;
    return c->dim;
}
static int64_t rec_state_floats(const zi_model_config *c) {
    if (c->family->recurrent == ZI_REC_DELTANET)
        return (int64_t)c->dn_v_heads * c->dn_head_dim * c->dn_head_dim;
    if (c->family->recurrent == ZI_REC_MAMBA2) /* H heads of P x N */
        return (int64_t)c->ssm_inner * c->ssm_state;
    return 0;
}

/* qwen35's interleaved M-RoPE (rope.dimension_sections): for text, every
 * pair whose section is t, h or w turns by the position, so it is plain
 * NEOX RoPE when every pair falls in those; a section e pair (which text
 * leaves unturned) is refused. */
static int check_rope_sections(const zi_gguf *g, const zi_model_config *c, zi_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", c->arch);
    const uint8_t *d = NULL;
    uint64_t n = 0;
    int rc = int_array(g, key, &d, &n, err);
    if (rc) return rc;
    int32_t sec[4] = {0, 0, 0, 0};
    for (uint64_t i = 0; i < n && i < 4; i++) memcpy(&sec[i], d + 4 * i, 4);
    int64_t sum = 0;
    for (int i = 0; i < 4; i++) {
        if (sec[i] < 0 || sec[i] > (1 << 16))
            return zi_error_set(err, ZI_EFORMAT, "%s has an entry %d out of range", key, sec[i]);
        sum += sec[i];
    }
    if (sum == 0) return zi_error_set(err, ZI_EFORMAT, "%s sums to 0", key);
    for (int i = 0; i < c->rope_dim / 2; i++) {
        const int64_t s = i % sum;
        const int turned = (s % 3 == 0 && s < 3 * (int64_t)sec[0]) ||
                           (s % 3 == 1 && s < 3 * (int64_t)sec[1]) ||
                           (s % 3 == 2 && s < 3 * (int64_t)sec[2]);
        if (!turned)
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "%s = [%d, %d, %d, %d] leaves RoPE pair %d to the e section, which "
                                "zinfer does not run",
                                key, sec[0], sec[1], sec[2], sec[3], i);
    }
    return ZI_OK;
}

static int load_config(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    zi_str arch;
    int rc = zi_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc) return rc;
    const zi_family *fam = zi_family_find(arch.ptr, arch.len);
    if (!fam)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "unsupported architecture '%.*s' (general.architecture); zinfer "
                            "supports: %s",
                            (int)(arch.len > 64 ? 64 : arch.len), arch.ptr, zi_family_names());
    snprintf(c->arch, sizeof c->arch, "%s", fam->arch);
    c->family = fam;
    uint32_t v;
    struct {
        const char *key;
        int *dst;
    } req[] = {{"block_count", &c->n_layers},
               {"embedding_length", &c->dim},
               {"feed_forward_length", &c->ffn_dim},
               {"attention.head_count", &c->n_heads},
               {"context_length", &c->ctx_train}};
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++) {
        if ((rc = meta_u32(g, c->arch, req[i].key, &v, err))) return rc;
        if (v == 0 || v > (1u << 24))
            return zi_error_set(err, ZI_EFORMAT, "%s.%s = %u is out of range", c->arch, req[i].key,
                                v);
        *req[i].dst = (int)v;
    }
    char key[128];
    c->n_nextn = 0;
    if (fam->recurrent == ZI_REC_DELTANET) { /* MTP blocks, counted in block_count */
        snprintf(key, sizeof key, "%s.nextn_predict_layers", c->arch);
        if ((rc = zi_gguf_get_u32_or(g, key, 0, &v, err))) return rc;
        if (v >= (uint32_t)c->n_layers)
            return zi_error_set(err, ZI_EFORMAT, "%s = %u leaves no layer of block_count %d", key,
                                v, c->n_layers);
        c->n_nextn = (int)v;
        c->n_layers -= c->n_nextn;
    }
    snprintf(key, sizeof key, "%s.attention.head_count_kv", c->arch);
    if ((rc = load_layer_kinds(g, c, key, &v, err))) return rc;
    if (v == 0 || v > (uint32_t)c->n_heads || c->n_heads % (int)v != 0)
        return zi_error_set(err, ZI_EFORMAT, "%s = %u does not divide head_count %d", key, v,
                            c->n_heads);
    c->n_kv_heads = (int)v;
    snprintf(key, sizeof key, "%s.attention.key_length", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)(c->dim / c->n_heads), &v, err))) return rc;
    c->head_dim = (int)v;
    /* 1024 bounds the attention's per-head stack buffers and keeps every
     * product of dimensions far from overflow; real models use 64..256. */
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > 1024)
        return zi_error_set(err, ZI_EFORMAT, "head dimension %d is not an even number <= 1024",
                            c->head_dim);
    snprintf(key, sizeof key, "%s.attention.value_length", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)c->head_dim, &v, err))) return rc;
    if ((int)v != c->head_dim)
        return zi_error_set(err, ZI_EUNSUPPORTED, "%s = %u differs from key_length %d", key, v,
                            c->head_dim);
    snprintf(key, sizeof key, "%s.rope.dimension_count", c->arch);
    if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)c->head_dim, &v, err))) return rc;
    c->rope_dim = (int)v;
    if (c->rope_dim <= 0 || c->rope_dim > c->head_dim || c->rope_dim % 2)
        return zi_error_set(err, ZI_EFORMAT, "%s = %d must be even and at most the head dim %d",
                            key, c->rope_dim, c->head_dim);
    snprintf(key, sizeof key, "%s.rope.freq_base", c->arch);
    if ((rc = zi_gguf_get_f32_or(g, key, 10000.0f, &c->rope_base, err))) return rc;
    c->encoder = fam->encoder;
    snprintf(key, sizeof key,
             fam->encoder ? "%s.attention.layer_norm_epsilon"
                          : "%s.attention.layer_norm_rms_epsilon",
             c->arch);
    if ((rc = zi_gguf_get_f32_or(g, key, 1e-5f, &c->norm_eps, err))) return rc;
    if (!(c->rope_base > 0.0f) || !(c->norm_eps >= 0.0f) || !isfinite(c->rope_base))
        return zi_error_set(err, ZI_EFORMAT, "rope.freq_base %g / rms epsilon %g out of range",
                            c->rope_base, c->norm_eps);
    if ((rc = load_rope_scaling(g, c, err))) return rc;
    if (fam->recurrent == ZI_REC_DELTANET && (rc = check_rope_sections(g, c, err))) return rc;
    if ((rc = load_family_config(g, c, err))) return rc;
    return load_moe_config(g, c, err);
}

/* Finds tensor `name` and checks its shape is exactly (ne0, ne1). */
static int find_tensor(const zi_gguf *g, const char *name, int64_t ne0, int64_t ne1,
                       const zi_gguf_tensor **out, zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
    int64_t want_dims = ne1 > 1 ? 2 : 1;
    if ((int64_t)t->n_dims != want_dims || t->ne[0] != ne0 || t->ne[1] != ne1)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
                            (long long)ne0, (long long)ne1);
    *out = t;
    return ZI_OK;
}

static int load_matrix(zi_model *m, const char *name, int64_t cols, int64_t rows, zi_weight *w,
                       zi_error *err) {
    const zi_gguf_tensor *t = NULL;
    int rc = find_tensor(m->gguf, name, cols, rows, &t, err);
    if (rc) return rc;
    if ((rc = m->be->ops->weight_init(m->be, w, t, err))) return rc;
    /* A backend that copied the weight (repacked or uploaded it) no longer
     * needs the file's pages; the embedding's come back for get_rows. */
    if (w->owned) zi_gguf_drop_pages(m->gguf, t);
    m->weight_bytes += w->data_bytes; /* as the backend holds it */
    m->weight_macs += (uint64_t)rows * (uint64_t)cols;
    return ZI_OK;
}

/* Rows r0 .. r0+n-1 of the [cols] x [total] matrix `name` as a weight of
 * their own: a fused tensor (phi3's attn_qkv, ffn_up) split at load, so
 * that the forward pass and the backends see ordinary weights. The rows of
 * a GGUF matrix are contiguous, whole blocks each. */
static int load_matrix_rows(zi_model *m, const char *name, int64_t cols, int64_t total, int64_t r0,
                            int64_t n, zi_weight *w, zi_error *err) {
    const zi_gguf_tensor *t = NULL;
    int rc = find_tensor(m->gguf, name, cols, total, &t, err);
    if (rc) return rc;
    zi_gguf_tensor part = *t;
    uint64_t row_bytes = t->nbytes / (uint64_t)total;
    part.ne[1] = n;
    part.offset += (uint64_t)r0 * row_bytes;
    part.nbytes = (uint64_t)n * row_bytes;
    if (t->data) part.data = (const char *)t->data + (uint64_t)r0 * row_bytes;
    if ((rc = m->be->ops->weight_init(m->be, w, &part, err))) return rc;
    if (w->owned) zi_gguf_drop_pages(m->gguf, &part);
    m->weight_bytes += w->data_bytes;
    m->weight_macs += (uint64_t)n * (uint64_t)cols;
    return ZI_OK;
}

/* An optional 1-D tensor: *out stays NULL when the file has none. */
static int load_opt_vector(zi_model *m, const char *name, int64_t n, float **out, zi_error *err);

static int load_vector(zi_model *m, const char *name, int64_t n, float **out, zi_error *err) {
    const zi_gguf_tensor *t = NULL;
    int rc = find_tensor(m->gguf, name, n, 1, &t, err);
    if (rc) return rc;
    *out = m->be->ops->vector_init(m->be, t, err);
    if (*out) return ZI_OK;
    return err && err->code ? err->code : zi_error_set(err, ZI_ENOMEM, "cannot load '%s'", name);
}

/* A vector the file may leave out (a bias): NULL when absent, else loaded
 * and shape-checked as load_vector. */
static int load_opt_vector(zi_model *m, const char *name, int64_t n, float **out, zi_error *err) {
    *out = NULL;
    return zi_gguf_find_tensor(m->gguf, name) ? load_vector(m, name, n, out, err) : ZI_OK;
}

/* Whether the file has any Q/K/V bias or output.bias (the backend then
 * needs add_bias). */
static int has_biases(const zi_model *m) {
    if (zi_gguf_find_tensor(m->gguf, "output.bias")) return 1;
    char n[96];
    static const char *const which[] = {"q", "k", "v", "output"};
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < 4; i++) {
            snprintf(n, sizeof n, "blk.%d.attn_%s.bias", l, which[i]);
            if (zi_gguf_find_tensor(m->gguf, n)) return 1;
        }
    return 0;
}

/* An encoder's embedding tensors (family.h): position_embd (abs_pos),
 * token_types' row 0 as a vector (every token is type 0; the table itself
 * is not kept), token_embd_norm and its bias. */
static int load_encoder_embd(zi_model *m, zi_error *err) {
    const zi_model_config *c = &m->cfg;
    int rc;
    if (c->family->abs_pos &&
        (rc = load_matrix(m, "position_embd.weight", c->dim, c->ctx_train, &m->pos_embd, err)))
        return rc;
    if (c->family->abs_pos) /* rows looked up, not multiplied */
        m->weight_macs -= (uint64_t)c->dim * (uint64_t)c->ctx_train;
    const zi_gguf_tensor *tt = zi_gguf_find_tensor(m->gguf, "token_types.weight");
    if (tt) {
        if (tt->ne[0] != c->dim || tt->ne[1] < 1 || tt->ne[1] > 1024)
            return zi_error_set(err, ZI_EFORMAT,
                                "tensor 'token_types.weight' has shape [%lld, %lld], expected "
                                "[%d, 1..1024]",
                                (long long)tt->ne[0], (long long)tt->ne[1], c->dim);
        zi_weight types = {0};
        const int32_t type0 = 0;
        if ((rc = m->be->ops->weight_init(m->be, &types, tt, err))) return rc;
        m->type0 = m->be->ops->alloc(m->be, (size_t)c->dim * sizeof(float));
        if (m->type0) m->be->ops->get_rows(m->be, m->type0, &types, &type0, 1);
        m->be->ops->weight_free(m->be, &types);
        if (!m->type0) return zi_error_set(err, ZI_ENOMEM, "out of memory for token_types");
    }
    if ((rc = load_vector(m, "token_embd_norm.weight", c->dim, &m->embd_norm, err)) ||
        (rc = load_vector(m, "token_embd_norm.bias", c->dim, &m->embd_norm_b, err)))
        return rc;
    return ZI_OK;
}

/* An encoder layer's LayerNorms and optional output/feed-forward biases. */
static int load_encoder_layer(zi_model *m, int l, zi_layer *L, zi_error *err) {
    const zi_model_config *c = &m->cfg;
    char n[96];
    int rc;
#define ZI_NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = load_vector(m, ZI_NAME("attn_output_norm.weight"), c->dim, &L->ln_attn, err)) ||
        (rc = load_vector(m, ZI_NAME("attn_output_norm.bias"), c->dim, &L->ln_attn_b, err)) ||
        (rc = load_vector(m, ZI_NAME("layer_output_norm.weight"), c->dim, &L->ln_out, err)) ||
        (rc = load_vector(m, ZI_NAME("layer_output_norm.bias"), c->dim, &L->ln_out_b, err)) ||
        (rc = load_opt_vector(m, ZI_NAME("attn_output.bias"), c->dim, &L->bo, err)) ||
        (rc = load_opt_vector(m, ZI_NAME("ffn_up.bias"), c->ffn_dim, &L->b_up, err)) ||
        (rc = load_opt_vector(m, ZI_NAME("ffn_down.bias"), c->dim, &L->b_down, err)))
        return rc;
#undef ZI_NAME
    return ZI_OK;
}

/* A vector stored as a {ne0, ne1} tensor (Mamba-2's ssm_a, ssm_d {1, H}
 * and ssm_norm {di / G, G}), one or two dims alike: converters write the
 * second dim even when it is 1. */
static int load_vector_2d(zi_model *m, const char *name, int64_t ne0, int64_t ne1, float **out,
                          zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(m->gguf, name);
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims > 2 || t->ne[0] != ne0 || t->ne[1] != ne1)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
                            (long long)ne0, (long long)ne1);
    *out = m->be->ops->vector_init(m->be, t, err);
    if (*out) return ZI_OK;
    return err && err->code ? err->code : zi_error_set(err, ZI_ENOMEM, "cannot load '%s'", name);
}

/* granitehybrid's Mamba-2 layer l (family.h's ZI_REC_MAMBA2) past its
 * norms: ssm_in split at load into its z, xBC and dt rows, the
 * convolution's kernel and bias (required: llama.cpp's graph needs it
 * too), ssm_dt.bias, ssm_a, ssm_d, ssm_norm (one weight per group),
 * ssm_out. */
static int load_mamba2_layer(zi_model *m, int l, zi_layer *L, zi_error *err) {
    const zi_model_config *c = &m->cfg;
    char n[96];
    int rc;
    const zi_gguf_tensor *t = NULL;
    const int64_t d = c->dim, di = c->ssm_inner, ch = conv_channels(c), H = c->ssm_heads,
                  all = di + ch + H, G = c->ssm_groups;
#define ZI_NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = find_tensor(m->gguf, ZI_NAME("ssm_conv1d.weight"), c->conv_len, ch, &t, err)))
        return rc;
    if (!(L->mb_conv = m->be->ops->vector_init(m->be, t, err)))
        return err && err->code ? err->code : zi_error_set(err, ZI_ENOMEM, "cannot load '%s'", n);
    if ((rc = load_matrix_rows(m, ZI_NAME("ssm_in.weight"), d, all, 0, di, &L->mb_z, err)) ||
        (rc = load_matrix_rows(m, n, d, all, di, ch, &L->mb_xbc, err)) ||
        (rc = load_matrix_rows(m, n, d, all, di + ch, H, &L->mb_dt, err)) ||
        (rc = load_matrix(m, ZI_NAME("ssm_out.weight"), di, d, &L->mb_out, err)) ||
        (rc = load_vector(m, ZI_NAME("ssm_conv1d.bias"), ch, &L->mb_conv_b, err)) ||
        (rc = load_vector(m, ZI_NAME("ssm_dt.bias"), H, &L->mb_dt_b, err)) ||
        (rc = load_vector_2d(m, ZI_NAME("ssm_a"), 1, H, &L->mb_a, err)) ||
        (rc = load_vector_2d(m, ZI_NAME("ssm_d"), 1, H, &L->mb_d, err)) ||
        (rc = load_vector_2d(m, ZI_NAME("ssm_norm.weight"), di / G, G, &L->mb_norm, err)))
        return rc;
#undef ZI_NAME
    return ZI_OK;
}

/* A hybrid's recurrent layer l (family.h's recurrent): its pre-norms and
 * lfm2's short convolution, in_proj's rows split into b, c and x. */
static int load_recurrent_layer(zi_model *m, int l, zi_layer *L, zi_error *err) {
    const zi_model_config *c = &m->cfg;
    char n[96];
    int rc;
    const zi_gguf_tensor *t = NULL;
#define ZI_NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = load_vector(m, ZI_NAME("attn_norm.weight"), c->dim, &L->attn_norm, err)) ||
        (rc = load_vector(m,
                          c->family->ffn_norm_post_attn ? ZI_NAME("post_attention_norm.weight")
                                                        : ZI_NAME("ffn_norm.weight"),
                          c->dim, &L->ffn_norm, err)))
        return rc;
    const int64_t d = c->dim;
    if (c->family->recurrent == ZI_REC_MAMBA2) return load_mamba2_layer(m, l, L, err);
    if (c->family->recurrent == ZI_REC_DELTANET) {
        const int64_t ch = conv_channels(c), hv = c->dn_v_heads,
                      inner = (int64_t)hv * c->dn_head_dim;
        if ((rc = find_tensor(m->gguf, ZI_NAME("ssm_conv1d.weight"), c->conv_len, ch, &t, err)))
            return rc;
        if (!(L->dn_conv = m->be->ops->vector_init(m->be, t, err)))
            return err && err->code ? err->code
                                    : zi_error_set(err, ZI_ENOMEM, "cannot load '%s'", n);
        if ((rc = load_matrix(m, ZI_NAME("attn_qkv.weight"), d, ch, &L->dn_qkv, err)) ||
            (rc = load_matrix(m, ZI_NAME("attn_gate.weight"), d, inner, &L->dn_z, err)) ||
            (rc = load_matrix(m, ZI_NAME("ssm_alpha.weight"), d, hv, &L->dn_alpha, err)) ||
            (rc = load_matrix(m, ZI_NAME("ssm_beta.weight"), d, hv, &L->dn_beta, err)) ||
            (rc = load_matrix(m, ZI_NAME("ssm_out.weight"), inner, d, &L->dn_out, err)) ||
            (rc = load_vector(m, ZI_NAME("ssm_dt.bias"), hv, &L->dn_dt, err)) ||
            (rc = load_vector(m, ZI_NAME("ssm_a"), hv, &L->dn_a, err)) ||
            (rc = load_vector(m, ZI_NAME("ssm_norm.weight"), c->dn_head_dim, &L->dn_norm, err)))
            return rc;
        return ZI_OK;
    }
    if ((rc = find_tensor(m->gguf, ZI_NAME("shortconv.conv.weight"), c->conv_len, c->dim, &t, err)))
        return rc;
    if (!(L->sc_conv = m->be->ops->vector_init(m->be, t, err)))
        return err && err->code ? err->code : zi_error_set(err, ZI_ENOMEM, "cannot load '%s'", n);
    if ((rc = load_matrix_rows(m, ZI_NAME("shortconv.in_proj.weight"), d, 3 * d, 0, d, &L->sc_b,
                               err)) ||
        (rc = load_matrix_rows(m, n, d, 3 * d, d, d, &L->sc_c, err)) ||
        (rc = load_matrix_rows(m, n, d, 3 * d, 2 * d, d, &L->sc_x, err)) ||
        (rc = load_matrix(m, ZI_NAME("shortconv.out_proj.weight"), d, d, &L->sc_out, err)))
        return rc;
#undef ZI_NAME
    return ZI_OK;
}

static int load_weights(zi_model *m, zi_error *err) {
    const zi_model_config *c = &m->cfg;
    int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    int rc;
    const zi_gguf_tensor *emb = zi_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return zi_error_set(err, ZI_EFORMAT, "missing tensor 'token_embd.weight'");
    if (emb->ne[1] < 1 || emb->ne[1] > (1 << 24))
        return zi_error_set(err, ZI_EFORMAT, "token_embd.weight has %lld rows; expected 1..%d",
                            (long long)emb->ne[1], 1 << 24);
    m->cfg.n_vocab = (int)emb->ne[1];
    /* Nine tensors per layer (six with fused QKV and gate/up): refuse a
     * block_count the file cannot back before allocating for it. */
    const zi_family *f = c->family;
    const uint64_t per_layer = f->fused_qkv && f->fused_gate_up ? 6 : 9;
    if ((uint64_t)c->n_layers * per_layer > zi_gguf_tensor_count(m->gguf))
        return zi_error_set(err, ZI_EFORMAT,
                            "%s.block_count = %d, but the file has only %llu tensors", c->arch,
                            c->n_layers, (unsigned long long)zi_gguf_tensor_count(m->gguf));
    uint32_t vocab;
    char key[128];
    snprintf(key, sizeof key, "%s.vocab_size", c->arch);
    if ((rc = zi_gguf_get_u32_or(m->gguf, key, (uint32_t)emb->ne[1], &vocab, err))) return rc;
    if ((int64_t)vocab != emb->ne[1])
        return zi_error_set(err, ZI_EFORMAT, "%s = %u but token_embd.weight has %lld rows", key,
                            vocab, (long long)emb->ne[1]);
    if ((rc = load_matrix(m, "token_embd.weight", c->dim, c->n_vocab, &m->tok_embd, err)))
        return rc;
    if (!f->encoder && (rc = load_vector(m, f->output_norm ? f->output_norm : "output_norm.weight",
                                         c->dim, &m->output_norm, err)))
        return rc;
    if (zi_gguf_find_tensor(m->gguf, "output.weight")) {
        if ((rc = load_matrix(m, "output.weight", c->dim, c->n_vocab, &m->output, err))) return rc;
    } else {
        m->output = m->tok_embd;
        m->output.owned = NULL; /* shared, freed once with tok_embd */
        m->cfg.tied_output = 1;
    }
    /* The embedding's rows are looked up; only an output head multiplies. */
    if (!m->cfg.tied_output || f->encoder)
        m->weight_macs -= (uint64_t)c->dim * (uint64_t)c->n_vocab;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return zi_error_set(err, ZI_ENOMEM, "out of memory for %d layers", c->n_layers);
    /* Optional RoPE factors, shared by all layers (llama.cpp: the tensors
     * without a block number; TENSOR_NOT_REQUIRED). */
    const int64_t half = c->rope_dim / 2;
    if (f->rope_long_short || c->rope_longrope) {
        if ((rc = load_opt_vector(m, "rope_factors_long.weight", half, &m->rope_long, err)) ||
            (rc = load_opt_vector(m, "rope_factors_short.weight", half, &m->rope_short, err)))
            return rc;
    } else if ((rc = load_opt_vector(m, "rope_freqs.weight", half, &m->rope_freqs, err))) {
        return rc;
    }
    const uint8_t *local_arr = NULL; /* an array-valued sliding_window_pattern */
    if (c->swa_pattern < 0) {
        const void *d;
        uint64_t n;
        snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", c->arch);
        if ((rc = zi_gguf_get_array(m->gguf, key, ZI_GGUF_BOOL, &d, &n, err))) return rc;
        local_arr = d;
    }
    int any_local = 0;
    for (int l = 0; l < c->n_layers; l++) {
        m->layers[l].local = local_arr ? local_arr[l] != 0 : layer_is_local(c, l);
        any_local |= m->layers[l].local;
    }
    if (c->n_recurrent > 0) { /* which layers (load_layer_kinds counted them) */
        uint8_t *rec = calloc((size_t)c->n_layers, 1);
        uint32_t kvh;
        int n_rec = 0;
        snprintf(key, sizeof key, "%s.attention.head_count_kv", c->arch);
        rc = rec ? layer_kinds(m->gguf, c, key, &kvh, &n_rec, rec, err)
                 : zi_error_set(err, ZI_ENOMEM, "out of memory");
        for (int l = 0; !rc && l < c->n_layers; l++) m->layers[l].recurrent = rec[l];
        free(rec);
        if (rc) return rc;
        assert(n_rec == c->n_recurrent);
    }
    if ((rc = zi_family_check_backend(f, m->be, any_local, c->final_softcap > 0.0f,
                                      c->attn_softcap > 0.0f, has_biases(m) || c->moe.oai,
                                      c->moe.n_expert > 0, err)) ||
        (rc = zi_family_check_rope(f, m->be, c->rope_yarn, err)))
        return rc;
    if ((rc = load_opt_vector(m, "output.bias", c->n_vocab, &m->output_bias, err))) return rc;
    if (f->encoder && (rc = load_encoder_embd(m, err))) return rc;
    for (int l = 0; l < c->n_layers; l++) {
        zi_layer *L = &m->layers[l];
        char n[96];
#define ZI_NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
        if (L->recurrent) {
            if ((rc = load_recurrent_layer(m, l, L, err))) return rc;
        } else if (f->qk_norm && ((rc = load_vector(m, ZI_NAME("attn_q_norm.weight"), c->head_dim,
                                                    &L->q_norm, err)) ||
                                  (rc = load_vector(m, ZI_NAME("attn_k_norm.weight"), c->head_dim,
                                                    &L->k_norm, err))))
            return rc;
        if (f->post_norms && ((rc = load_vector(m, ZI_NAME("post_attention_norm.weight"), c->dim,
                                                &L->post_attn_norm, err)) ||
                              (rc = load_vector(m, ZI_NAME("post_ffw_norm.weight"), c->dim,
                                                &L->post_ffn_norm, err))))
            return rc;
        if (f->encoder && (rc = load_encoder_layer(m, l, L, err))) return rc;
        if (!L->recurrent && f->attn_sinks &&
            (rc = load_vector(m, ZI_NAME("attn_sinks.weight"), c->n_heads, &L->sinks, err)))
            return rc;
        if (!f->encoder && !L->recurrent &&
            (rc = load_opt_vector(m, ZI_NAME("attn_output.bias"), c->dim, &L->bo, err)))
            return rc;
        if (L->recurrent) {
            /* its norms and convolution: load_recurrent_layer */
        } else if ((!f->encoder &&
                    ((rc = load_vector(m, ZI_NAME("attn_norm.weight"), c->dim, &L->attn_norm,
                                       err)) ||
                     (rc = load_vector(m,
                                       f->ffn_norm_post_attn ? ZI_NAME("post_attention_norm.weight")
                                                             : ZI_NAME("ffn_norm.weight"),
                                       c->dim, &L->ffn_norm, err)))) ||
                   (rc = load_matrix(m, ZI_NAME("attn_output.weight"), qd, c->dim, &L->wo, err)) ||
                   (rc = load_opt_vector(m, ZI_NAME("attn_q.bias"), qd, &L->bq, err)) ||
                   (rc = load_opt_vector(m, ZI_NAME("attn_k.bias"), kvd, &L->bk, err)) ||
                   (rc = load_opt_vector(m, ZI_NAME("attn_v.bias"), kvd, &L->bv, err)))
            return rc;
        if (L->recurrent) {
            /* no attention */
        } else if (f->fused_qkv && zi_gguf_find_tensor(m->gguf, ZI_NAME("attn_qkv.weight"))) {
            const int64_t all = qd + 2 * kvd;
            if ((rc = load_matrix_rows(m, n, c->dim, all, 0, qd, &L->wq, err)) ||
                (rc = load_matrix_rows(m, n, c->dim, all, qd, kvd, &L->wk, err)) ||
                (rc = load_matrix_rows(m, n, c->dim, all, qd + kvd, kvd, &L->wv, err)))
                return rc;
        } else if ((rc = load_matrix(m, ZI_NAME("attn_q.weight"), c->dim,
                                     f->attn_gate ? 2 * qd : qd, &L->wq, err)) ||
                   (rc = load_matrix(m, ZI_NAME("attn_k.weight"), c->dim, kvd, &L->wk, err)) ||
                   (rc = load_matrix(m, ZI_NAME("attn_v.weight"), c->dim, kvd, &L->wv, err))) {
            return rc;
        }
        if (c->moe.n_expert > 0) {
            if ((rc = zi_moe_load_layer(m->gguf, m->be, l, c->dim, &c->moe, &L->moe,
                                        &m->weight_bytes, &m->weight_macs, err)))
                return rc;
            m->expert_bytes += L->moe.expert_bytes;
        } else if ((rc = load_matrix(m, ZI_NAME("ffn_down.weight"), c->ffn_dim, c->dim, &L->w_down,
                                     err))) {
            return rc;
        } else if (f->fused_gate_up) {
            const int64_t ff = c->ffn_dim;
            if ((rc = load_matrix_rows(m, ZI_NAME("ffn_up.weight"), c->dim, 2 * ff, 0, ff,
                                       &L->w_gate, err)) ||
                (rc = load_matrix_rows(m, n, c->dim, 2 * ff, ff, ff, &L->w_up, err)))
                return rc;
        } else if (f->gelu_ffn) {
            if ((rc = load_matrix(m, ZI_NAME("ffn_up.weight"), c->dim, c->ffn_dim, &L->w_up, err)))
                return rc;
        } else if ((rc = load_matrix(m, ZI_NAME("ffn_gate.weight"), c->dim, c->ffn_dim, &L->w_gate,
                                     err)) ||
                   (rc = load_matrix(m, ZI_NAME("ffn_up.weight"), c->dim, c->ffn_dim, &L->w_up,
                                     err))) {
            return rc;
        }
#undef ZI_NAME
    }
    return ZI_OK;
}

int zi_model_load(const char *path, zi_backend *be, zi_model **out, zi_error *err) {
    zi_model *m = calloc(1, sizeof *m);
    if (!m) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    m->be = be;
    int rc = zi_gguf_open(path, &m->gguf, err);
    if (!rc) rc = load_config(m->gguf, &m->cfg, err);
    if (!rc) rc = load_weights(m, err);
    if (rc) {
        if (m->gguf) zi_error_prefix(err, "%s", path);
        zi_model_free(m);
        return rc;
    }
    *out = m;
    return ZI_OK;
}

static void free_buffers(zi_model *m) {
    zi_backend *be = m->be;
    float **bufs[] = {&m->x, &m->xn, &m->q, &m->k, &m->v, &m->att, &m->gate, &m->up, &m->tmp};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        be->ops->free(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    be->ops->free(be, m->logits);
    m->logits = NULL;
    m->cap = m->logits_cap = 0;
}

void zi_model_free(zi_model *m) {
    if (!m) return;
    zi_backend *be = m->be;
    free_buffers(m);
    free(m->lora_rows);
    if (m->layers) {
        for (int l = 0; l < m->cfg.n_layers; l++) {
            zi_layer *L = &m->layers[l];
            zi_weight *ws[] = {&L->wq,     &L->wk,     &L->wv,     &L->wo,       &L->w_gate,
                               &L->w_up,   &L->w_down, &L->sc_b,   &L->sc_c,     &L->sc_x,
                               &L->sc_out, &L->dn_qkv, &L->dn_z,   &L->dn_alpha, &L->dn_beta,
                               &L->dn_out, &L->mb_z,   &L->mb_xbc, &L->mb_dt,    &L->mb_out};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) be->ops->weight_free(be, ws[i]);
            zi_moe_free_layer(be, &m->cfg.moe, &L->moe);
            float *vecs[] = {
                L->attn_norm,     L->ffn_norm, L->q_norm,   L->k_norm,    L->post_attn_norm,
                L->post_ffn_norm, L->bq,       L->bk,       L->bv,        L->ln_attn,
                L->ln_attn_b,     L->ln_out,   L->ln_out_b, L->bo,        L->b_up,
                L->b_down,        L->sinks,    L->sc_conv,  L->dn_conv,   L->dn_dt,
                L->dn_a,          L->dn_norm,  L->mb_conv,  L->mb_conv_b, L->mb_dt_b,
                L->mb_a,          L->mb_d,     L->mb_norm};
            for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) be->ops->free(be, vecs[i]);
        }
        free(m->layers);
    }
    if (!m->cfg.tied_output) be->ops->weight_free(be, &m->output);
    be->ops->weight_free(be, &m->tok_embd);
    be->ops->free(be, m->output_norm);
    be->ops->free(be, m->rope_freqs);
    be->ops->free(be, m->rope_long);
    be->ops->free(be, m->rope_short);
    be->ops->free(be, m->output_bias);
    be->ops->weight_free(be, &m->pos_embd);
    be->ops->free(be, m->type0);
    be->ops->free(be, m->embd_norm);
    be->ops->free(be, m->embd_norm_b);
    free(m->span);
    free(m->embd_ids);
    free(m->tok_slot);
    free(m->gate_idx);
    free(m->row_n);
    zi_moe_scratch_free(be, m->moe_scratch);
    zi_gguf_close(m->gguf);
    free(m);
}

const zi_model_config *zi_model_get_config(const zi_model *m) {
    return &m->cfg;
}

zi_backend *zi_model_backend(const zi_model *m) {
    return m->be;
}
int zi_model_read_config(const zi_gguf *g, zi_model_config *c, zi_error *err) {
    memset(c, 0, sizeof *c);
    return load_config(g, c, err);
}
const zi_gguf *zi_model_gguf(const zi_model *m) {
    return m->gguf;
}
uint64_t zi_model_weight_bytes(const zi_model *m) {
    return m->weight_bytes;
}

uint64_t zi_model_active_weight_bytes(const zi_model *m) {
    const zi_moe_params *p = &m->cfg.moe;
    /* An embedding that is not also the head is looked up, a row a token. */
    uint64_t b = m->weight_bytes - (m->cfg.tied_output ? 0 : m->tok_embd.data_bytes);
    if (p->n_expert == 0) return b;
    return b - m->expert_bytes +
           m->expert_bytes / (uint64_t)p->n_expert * (uint64_t)p->n_expert_used;
}

uint64_t zi_model_weight_macs(const zi_model *m) {
    return m->weight_macs;
}

void zi_model_set_progress(zi_model *m, zi_model_progress_fn fn, void *arg) {
    m->progress = fn;
    m->progress_arg = arg;
}

/* ---- KV cache ---- */

uint64_t zi_model_config_kv_bytes_per_token(const zi_model_config *c, const zi_backend *be) {
    return (uint64_t)(c->n_layers - c->n_recurrent) * (uint64_t)c->n_kv_heads *
           (zi_backend_kv_row_bytes(be, c->head_dim, 0) +
            zi_backend_kv_row_bytes(be, c->head_dim, 1));
}

uint64_t zi_model_kv_bytes_per_token(const zi_model *m) {
    return zi_model_config_kv_bytes_per_token(&m->cfg, m->be);
}

uint64_t zi_model_estimate_kv_cache_size(const zi_model *m, uint64_t available_cache_memory,
                                         int block_size) {
    uint64_t per_block =
        zi_model_kv_bytes_per_token(m) * (uint64_t)(block_size > 0 ? block_size : 1);
    return available_cache_memory / per_block * per_block;
}

/* The widths (floats a token) of a pass's activation buffers: q and att
 * (qd), k and v (kvd), gate and up (ffn); x, xn and tmp are dim wide.
 * ensure_buffers allocates them and zi_model_config_work_bytes counts
 * them, so the memory budget sees what a pass takes. */
static void buffer_widths(const zi_model_config *c, size_t *qd_out, size_t *kvd_out,
                          size_t *ffn_out) {
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t ffn = c->moe.n_expert > 0 ? 0 : (size_t)c->ffn_dim; /* moe.c has its own */
    if (c->n_recurrent) { /* the recurrent blocks' rows in gate, up, att, k and v */
        const size_t wide = (size_t)(c->dim > conv_channels(c) ? c->dim : conv_channels(c)),
                     inner = (size_t)c->dn_v_heads * c->dn_head_dim;
        ffn = ffn > wide ? ffn : wide;
        qd = qd > (size_t)c->dim ? qd : (size_t)c->dim;
        qd = qd > inner ? qd : inner;
        qd = qd > (size_t)c->ssm_inner ? qd : (size_t)c->ssm_inner; /* Mamba-2's z */
        kvd = kvd > (size_t)c->dn_v_heads ? kvd : (size_t)c->dn_v_heads;
        kvd = kvd > (size_t)c->ssm_heads ? kvd : (size_t)c->ssm_heads; /* its dt */
    }
    if (c->family && c->family->attn_gate) ffn = ffn > 2 * qd ? ffn : 2 * qd; /* q and gates */
    *qd_out = qd, *kvd_out = kvd, *ffn_out = ffn;
}

uint64_t zi_model_config_work_bytes(const zi_model_config *c, int max_batch_tokens,
                                    int max_logit_rows) {
    /* Activations of one pass (model.c's buffers, floats) and the logits
     * rows. */
    uint64_t T = (uint64_t)(max_batch_tokens > 0 ? max_batch_tokens : 1);
    uint64_t R = (uint64_t)(max_logit_rows > 0 ? max_logit_rows : 1);
    size_t qd, kvd, ffn;
    buffer_widths(c, &qd, &kvd, &ffn);
    uint64_t act =
        T * 4u *
        ((uint64_t)4 * (uint64_t)c->dim + (uint64_t)2 * qd + (uint64_t)2 * kvd + (uint64_t)2 * ffn);
    if (c->moe.n_expert > 0) act += zi_moe_work_bytes(&c->moe, (int)T, c->dim);
    return act + 2 * R * 4u * (uint64_t)(c->n_vocab > 0 ? c->n_vocab : 0);
}

uint64_t zi_model_memory_left_for_kv(const zi_model *m, uint64_t memory_budget,
                                     int max_batch_tokens, int max_logit_rows) {
    /* The working buffers and the weights as the backend holds them. */
    uint64_t used =
        m->weight_bytes + zi_model_config_work_bytes(&m->cfg, max_batch_tokens, max_logit_rows);
    return memory_budget > used ? memory_budget - used : 0;
}

int zi_kv_cache_create_paged(zi_model *m, int n_blocks, int block_size, int max_ctx,
                             zi_kv_cache **out, zi_error *err) {
    if (n_blocks < 1 || block_size < 1 || block_size > 4096 || max_ctx < 1)
        return zi_error_set(err, ZI_EINVAL,
                            "KV cache: %d blocks of %d positions, sequences of up to %d "
                            "(need >= 1 block of 1..4096 positions)",
                            n_blocks, block_size, max_ctx);
    zi_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return zi_error_set(err, ZI_ENOMEM, "out of memory for the KV cache");
    if (m->be->kv_type != ZI_KV_DEFAULT && m->be->kv_type != ZI_KV_F16 && m->cfg.head_dim % 32) {
        free(kv);
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "--kv-type %s: this model's head size %d is not a multiple of the "
                            "format's 32-value blocks (use --kv-type default or f16)",
                            zi_kv_type_name(m->be->kv_type), m->cfg.head_dim);
    }
    kv->m = m;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->max_ctx = max_ctx;
    int L = m->cfg.n_layers;
    kv->k = calloc((size_t)L, sizeof *kv->k);
    kv->v = calloc((size_t)L, sizeof *kv->v);
    size_t rows = 0, kbytes = 0, vbytes = 0;
    if (__builtin_mul_overflow((size_t)n_blocks, (size_t)block_size, &rows) ||
        __builtin_mul_overflow(rows, (size_t)m->cfg.n_kv_heads, &rows) ||
        __builtin_mul_overflow(rows, (size_t)zi_backend_kv_row_bytes(m->be, m->cfg.head_dim, 0),
                               &kbytes) ||
        __builtin_mul_overflow(rows, (size_t)zi_backend_kv_row_bytes(m->be, m->cfg.head_dim, 1),
                               &vbytes)) {
        zi_kv_cache_free(kv);
        return zi_error_set(err, ZI_ERANGE, "a KV cache of %d blocks x %d positions is too large",
                            n_blocks, block_size);
    }
    int ok = kv->k && kv->v;
    for (int l = 0; ok && l < L; l++) {
        if (m->layers[l].recurrent) continue; /* its state: zi_kv_cache_add_states */
        kv->k[l] = m->be->ops->alloc(m->be, kbytes);
        kv->v[l] = m->be->ops->alloc(m->be, vbytes);
        ok = kv->k[l] && kv->v[l];
    }
    if (!ok) {
        zi_kv_cache_free(kv);
        return zi_error_set(err, ZI_ENOMEM,
                            "cannot allocate a KV cache of %d blocks x %d "
                            "positions (%.1f MiB)",
                            n_blocks, block_size,
                            (L - m->cfg.n_recurrent) * (double)(kbytes + vbytes) / (1 << 20));
    }
    *out = kv;
    return ZI_OK;
}

void zi_kv_cache_free(zi_kv_cache *kv) {
    if (!kv) return;
    zi_backend *be = kv->m->be;
    for (int l = 0; l < kv->m->cfg.n_layers; l++) {
        if (kv->k && kv->k[l]) be->ops->free(be, kv->k[l]);
        if (kv->v && kv->v[l]) be->ops->free(be, kv->v[l]);
        if (kv->conv && kv->conv[l]) be->ops->free(be, kv->conv[l]);
        if (kv->ssm && kv->ssm[l]) be->ops->free(be, kv->ssm[l]);
    }
    free(kv->k);
    free(kv->v);
    free(kv->conv);
    free(kv->ssm);
    free(kv->state_len);
    free(kv->state_next);
    free(kv->state_row);
    free(kv);
}

uint64_t zi_model_config_state_bytes_per_slot(const zi_model_config *c) {
    if (c->n_recurrent == 0) return 0;
    return (uint64_t)c->n_recurrent *
           ((uint64_t)(c->conv_len - 1) * (uint64_t)conv_channels(c) +
            (uint64_t)rec_state_floats(c)) *
           sizeof(float);
}

uint64_t zi_model_state_bytes_per_slot(const zi_model *m) {
    return zi_model_config_state_bytes_per_slot(&m->cfg);
}

int zi_kv_cache_add_states(zi_kv_cache *kv, int n_slots, zi_error *err) {
    const zi_model *m = kv->m;
    const zi_model_config *c = &m->cfg;
    if (c->n_recurrent == 0) return ZI_OK; /* nothing to keep */
    if (kv->n_states)
        return zi_error_set(err, ZI_EINVAL, "the KV cache has its %d state slots already",
                            kv->n_states);
    if (n_slots < 1 || n_slots > (1 << 20))
        return zi_error_set(err, ZI_EINVAL, "%d state slots (need 1..%d)", n_slots, 1 << 20);
    const size_t row = (size_t)(c->conv_len - 1) * (size_t)conv_channels(c) * sizeof(float),
                 srow = (size_t)rec_state_floats(c) * sizeof(float);
    kv->conv = calloc((size_t)c->n_layers, sizeof *kv->conv);
    kv->ssm = calloc((size_t)c->n_layers, sizeof *kv->ssm);
    kv->state_len = calloc((size_t)n_slots, sizeof *kv->state_len);
    kv->state_next = calloc((size_t)n_slots, sizeof *kv->state_next);
    kv->state_row = calloc((size_t)n_slots, sizeof *kv->state_row);
    int ok = kv->conv && kv->ssm && kv->state_len && kv->state_next && kv->state_row;
    for (int l = 0; ok && l < c->n_layers; l++) {
        if (!m->layers[l].recurrent) continue;
        ok = (kv->conv[l] = m->be->ops->alloc(m->be, row * n_slots)) != NULL;
        if (ok && srow) ok = (kv->ssm[l] = m->be->ops->alloc(m->be, srow * n_slots)) != NULL;
    }
    if (!ok) {
        for (int l = 0; kv->conv && kv->ssm && l < c->n_layers; l++) {
            if (kv->conv[l]) m->be->ops->free(m->be, kv->conv[l]);
            if (kv->ssm[l]) m->be->ops->free(m->be, kv->ssm[l]);
        }
        free(kv->conv);
        free(kv->ssm);
        kv->ssm = NULL;
        free(kv->state_len);
        free(kv->state_next);
        free(kv->state_row);
        kv->conv = NULL, kv->state_len = kv->state_next = kv->state_row = NULL;
        return zi_error_set(err, ZI_ENOMEM, "cannot allocate %d recurrent state slots (%.1f MiB)",
                            n_slots,
                            (double)zi_model_state_bytes_per_slot(m) * n_slots / (1 << 20));
    }
    kv->n_states = n_slots;
    return ZI_OK;
}

int zi_kv_cache_copy_state(zi_kv_cache *kv, int dst, int src, zi_error *err) {
    const zi_model *m = kv->m;
    const zi_model_config *c = &m->cfg;
    assert(dst >= 0 && dst < kv->n_states && src >= 0 && src < kv->n_states);
    if (!m->be->host_memory)
        return zi_error_set(err, ZI_EUNSUPPORTED, "the %s backend cannot copy recurrent states",
                            m->be->ops->name);
    const size_t row = (size_t)(c->conv_len - 1) * (size_t)conv_channels(c),
                 srow = (size_t)rec_state_floats(c);
    for (int l = 0; l < c->n_layers && dst != src; l++) {
        if (!m->layers[l].recurrent) continue;
        memcpy(kv->conv[l] + (size_t)dst * row, kv->conv[l] + (size_t)src * row,
               row * sizeof(float));
        if (srow)
            memcpy(kv->ssm[l] + (size_t)dst * srow, kv->ssm[l] + (size_t)src * srow,
                   srow * sizeof(float));
    }
    kv->state_len[dst] = kv->state_len[src];
    return ZI_OK;
}

int zi_kv_cache_state_slots(const zi_kv_cache *kv) {
    return kv->n_states;
}

int32_t zi_kv_cache_state_length(const zi_kv_cache *kv, int slot) {
    assert(slot >= 0 && slot < kv->n_states);
    return kv->state_len[slot];
}

int zi_kv_cache_ctx(const zi_kv_cache *kv) {
    return kv->max_ctx;
}
int zi_kv_cache_blocks(const zi_kv_cache *kv) {
    return kv->n_blocks;
}
int zi_kv_cache_block_size(const zi_kv_cache *kv) {
    return kv->block_size;
}
uint64_t zi_kv_cache_bytes(const zi_kv_cache *kv) {
    return (uint64_t)kv->n_blocks * (uint64_t)kv->block_size * zi_model_kv_bytes_per_token(kv->m);
}

void zi_kv_cache_block_layout(const zi_kv_cache *kv, int *n_layers, uint64_t *k_bytes,
                              uint64_t *v_bytes) {
    const zi_model *m = kv->m;
    const uint64_t rows = (uint64_t)kv->block_size * (uint64_t)m->cfg.n_kv_heads;
    *n_layers = m->cfg.n_layers - m->cfg.n_recurrent;
    *k_bytes = rows * zi_backend_kv_row_bytes(m->be, m->cfg.head_dim, 0);
    *v_bytes = rows * zi_backend_kv_row_bytes(m->be, m->cfg.head_dim, 1);
}

/* Copies block `block` of every attention layer between the pools and
 * buf (K then V, layer by layer): a block is one contiguous range of each
 * pool (backend.h), whatever its inner layout. */
static int copy_block(zi_kv_cache *kv, int block, void *buf, int to_cache) {
    if (block < 0 || block >= kv->n_blocks) return ZI_EINVAL;
    int n;
    uint64_t kb, vb;
    zi_kv_cache_block_layout(kv, &n, &kb, &vb);
    zi_backend *be = kv->m->be;
    uint8_t *p = buf;
    for (int l = 0; l < kv->m->cfg.n_layers; l++) {
        if (!kv->k[l]) continue;
        uint8_t *k = (uint8_t *)kv->k[l] + (size_t)block * kb;
        uint8_t *v = (uint8_t *)kv->v[l] + (size_t)block * vb;
        if (to_cache) {
            be->ops->upload(be, k, p, kb);
            be->ops->upload(be, v, p + kb, vb);
        } else {
            be->ops->download(be, p, k, kb);
            be->ops->download(be, p + kb, v, vb);
        }
        p += kb + vb;
    }
    return ZI_OK;
}

int zi_kv_cache_read_block(zi_kv_cache *kv, int block, void *dst) {
    return copy_block(kv, block, dst, 0);
}

int zi_kv_cache_write_block(zi_kv_cache *kv, int block, const void *src) {
    return copy_block(kv, block, (void *)src, 1);
}

/* ---- forward ---- */

/* own_logits: the pass writes its logits into m->logits (backend memory)
 * rather than the caller's host buffer. */
static int ensure_buffers(zi_model *m, int n_tokens, int n_wanted, bool own_logits, zi_error *err) {
    zi_backend *be = m->be;
    const zi_model_config *c = &m->cfg;
    if (n_tokens > m->cap) {
        free_buffers(m);
        size_t T = (size_t)n_tokens;
        size_t qd, kvd, ffn;
        buffer_widths(c, &qd, &kvd, &ffn);
        if (c->family->attn_gate) { /* attn_q's queries and gates in gate (split: q, up) */
            int32_t *gi = realloc(m->gate_idx, 2 * T * (size_t)c->n_heads * sizeof *gi);
            if (!gi) return zi_error_set(err, ZI_ENOMEM, "out of memory");
            m->gate_idx = gi;
            for (size_t r = 0; r < T * (size_t)c->n_heads; r++)
                gi[r] = (int32_t)(2 * r), gi[T * (size_t)c->n_heads + r] = (int32_t)(2 * r + 1);
        }
        struct {
            float **p;
            size_t n;
        } want[] = {{&m->x, c->dim},        {&m->xn, c->dim},     {&m->q, qd},
                    {&m->k, kvd},           {&m->v, kvd},         {&m->att, qd},
                    {&m->gate, ffn}, {&m->up, ffn}, {&m->tmp, c->dim}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            *want[i].p = be->ops->alloc(be, T * want[i].n * sizeof(float));
            if (!*want[i].p) {
                free_buffers(m);
                return zi_error_set(err, ZI_ENOMEM, "out of memory for a batch of %d tokens",
                                    n_tokens);
            }
        }
        m->cap = n_tokens;
    }
    if (n_wanted > m->logits_cap && (own_logits || !be->host_memory)) {
        be->ops->free(be, m->logits);
        m->logits = be->ops->alloc(be, (size_t)n_wanted * c->n_vocab * sizeof(float));
        m->logits_cap = m->logits ? n_wanted : 0;
        if (!m->logits)
            return zi_error_set(err, ZI_ENOMEM, "out of memory for %d rows of logits", n_wanted);
    }
    return ZI_OK;
}

/* b->attn_pos (model.h): each reach is at or past the token's own
 * position and within its sequence's tokens of this pass, which run
 * without a gap from their first position, so every position reached is
 * written by this pass or was cached before it. */
static int check_attn_pos(const zi_model *m, const zi_batch *b, zi_error *err) {
    if (m->cfg.encoder)
        return zi_error_set(err, ZI_EUNSUPPORTED, "'%s' is an encoder: attn_pos is for decoders",
                            m->cfg.arch);
    const int rows = b->n_table_rows;
    int32_t *lo = malloc(3 * (size_t)rows * sizeof *lo);
    if (!lo) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    int32_t *hi = lo + rows, *cnt = hi + rows;
    for (int r = 0; r < rows; r++) lo[r] = INT32_MAX, hi[r] = -1, cnt[r] = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        const int r = b->seq[i];
        lo[r] = b->pos[i] < lo[r] ? b->pos[i] : lo[r];
        hi[r] = b->pos[i] > hi[r] ? b->pos[i] : hi[r];
        cnt[r]++;
    }
    int rc = ZI_OK;
    for (int i = 0; i < b->n_tokens && !rc; i++) {
        const int r = b->seq[i];
        if (b->attn_pos[i] == b->pos[i]) continue;
        if (b->attn_pos[i] < b->pos[i] || b->attn_pos[i] > hi[r])
            rc = zi_error_set(err, ZI_EINVAL,
                              "attn_pos[%d] = %d is outside %d..%d (its position .. the last of "
                              "its sequence in the pass)",
                              i, b->attn_pos[i], b->pos[i], hi[r]);
        else if (cnt[r] != hi[r] - lo[r] + 1)
            rc = zi_error_set(err, ZI_EINVAL,
                              "sequence %d's tokens in the pass are not positions %d..%d without "
                              "a gap, which attn_pos[%d] needs",
                              r, lo[r], hi[r], i);
    }
    free(lo);
    return rc;
}

static int validate_batch(const zi_model *m, const zi_kv_cache *kv, const zi_batch *b,
                          zi_error *err) {
    if (b->n_tokens < 1) return zi_error_set(err, ZI_EINVAL, "empty batch");
    if (!b->block_tables)
        return zi_error_set(err, ZI_EINVAL, "a paged KV cache needs the batch's block tables");
    if (b->n_table_rows < 1 || b->table_stride < 1)
        return zi_error_set(err, ZI_EINVAL, "block tables of %d rows x %d entries", b->n_table_rows,
                            b->table_stride);
    const int32_t *tables = b->block_tables;
    int stride = b->table_stride, rows = b->n_table_rows;
    int bs = kv->block_size;
    for (int i = 0; i < b->n_tokens; i++) {
        const int embedded = b->embd_rows && b->embd_rows[i] >= 0; /* its id is a key only */
        if (!embedded && (b->tokens[i] < 0 || b->tokens[i] >= m->cfg.n_vocab))
            return zi_error_set(err, ZI_EINVAL,
                                "token id %d at index %d is outside the vocabulary "
                                "(0..%d)",
                                b->tokens[i], i, m->cfg.n_vocab - 1);
        if (b->seq[i] < 0 || b->seq[i] >= rows)
            return zi_error_set(err, ZI_EINVAL, "sequence %d at index %d is outside 0..%d",
                                b->seq[i], i, rows - 1);
        if (b->pos[i] < 0 || b->pos[i] >= kv->max_ctx || b->pos[i] / bs >= stride)
            return zi_error_set(err, ZI_ERANGE,
                                "position %d at index %d is outside the context "
                                "of %d tokens",
                                b->pos[i], i,
                                kv->max_ctx < stride * bs ? kv->max_ctx : stride * bs);
    }
    /* Every block a token reads or writes exists: check each row once, up
     * to the furthest position any token of the pass reaches in it. */
    for (int i = 0; i < b->n_tokens; i++) {
        const int32_t *row = tables + (size_t)b->seq[i] * stride;
        for (int j = 0; j <= b->pos[i] / bs; j++)
            if (row[j] < 0 || row[j] >= kv->n_blocks)
                return zi_error_set(err, ZI_EINVAL,
                                    "block table row %d entry %d is %d, outside 0..%d", b->seq[i],
                                    j, row[j], kv->n_blocks - 1);
    }
    if (b->embd_rows) {
        if (m->cfg.encoder)
            return zi_error_set(err, ZI_EUNSUPPORTED, "'%s' is an encoder: it takes no input embeddings",
                                m->cfg.arch);
        if (!b->embd) return zi_error_set(err, ZI_EINVAL, "embd_rows without embd");
        for (int i = 0; i < b->n_tokens; i++)
            if (b->embd_rows[i] < -1)
                return zi_error_set(err, ZI_EINVAL, "embd_rows[%d] = %d is negative", i,
                                    b->embd_rows[i]);
    }
    return b->attn_pos ? check_attn_pos(m, b, err) : ZI_OK;
}

int zi_model_check_batch(const zi_model *m, const zi_kv_cache *kv, const zi_batch *b,
                         zi_error *err) {
    return validate_batch(m, kv, b, err);
}

/* Embeddings: the final-normed hidden state of every token the batch wants
 * it for, packed, into b->hidden. m->tmp (T rows) is free once the layers
 * are done; on a host-memory backend the norm writes b->hidden directly. */
static void collect_hidden(zi_model *m, const zi_batch *b) {
    zi_backend *be = m->be;
    const zi_model_config *c = &m->cfg;
    if (c->encoder) { /* no output norm: the last layer's rows as they are */
        size_t row = (size_t)c->dim * sizeof(float);
        for (int i = 0, j = 0; i < b->n_tokens; i++)
            if (b->want_hidden[i])
                be->ops->download(be, (char *)b->hidden + row * j++, m->x + (size_t)i * c->dim,
                                  row);
        return;
    }
    float *dst = be->host_memory ? b->hidden : m->tmp;
    int j = 0;
    for (int i = 0; i < b->n_tokens; i++) {
        if (!b->want_hidden[i]) continue;
        be->ops->rmsnorm(be, dst + (size_t)j * c->dim, m->x + (size_t)i * c->dim, m->output_norm, 1,
                         c->dim, c->norm_eps);
        j++;
    }
    if (!be->host_memory && j > 0)
        be->ops->download(be, b->hidden, m->tmp, (size_t)j * c->dim * sizeof(float));
}

/* m->span / m->order for T tokens, m->row_n / m->starts for rows
 * sequences. */
static int span_buffers(zi_model *m, int T, int rows, zi_error *err) {
    if (T > m->span_cap) {
        int32_t *p = realloc(m->span, (size_t)T * 2 * sizeof *p);
        if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory for a batch of %d tokens", T);
        m->span = p, m->order = p + T, m->span_cap = T;
    }
    if (rows > m->row_cap) {
        int32_t *p = realloc(m->row_n, ((size_t)rows * 3 + 1) * sizeof *p);
        if (!p) return zi_error_set(err, ZI_ENOMEM, "out of memory for %d sequences", rows);
        m->row_n = p, m->starts = p + 2 * rows, m->row_cap = rows;
    }
    return ZI_OK;
}

/* A decoder's whole embedding inputs (zi_batch.f32_attn) grouped for
 * span_attention into m->order / m->starts: *n_groups of them, 0 when
 * there are none or the backend has no span_attention. ZI_EINVAL when a
 * flagged sequence is not whole in the pass (positions 0..n-1, in order,
 * contiguous). */
static int decoder_f32_spans(zi_model *m, const zi_batch *b, int *n_groups, zi_error *err) {
    *n_groups = 0;
    if (!b->f32_attn || !m->be->ops->span_attention) return ZI_OK;
    int rc = span_buffers(m, b->n_tokens, b->n_table_rows, err);
    int k = 0, g = 0;
    for (int i = 0; !rc && i < b->n_tokens; i++) {
        if (!b->f32_attn[i]) continue;
        int first = k == 0 || m->order[k - 1] != i - 1 || b->seq[i - 1] != b->seq[i];
        if (b->pos[i] != (first ? 0 : b->pos[i - 1] + 1))
            return zi_error_set(err, ZI_EINVAL,
                                "f32_attn: token %d (sequence %d, position %d) is not part of a "
                                "sequence whole in the pass",
                                i, b->seq[i], b->pos[i]);
        if (first) m->starts[g++] = k;
        m->order[k++] = i;
    }
    if (rc) return rc;
    m->starts[g] = k;
    *n_groups = g;
    return ZI_OK;
}

/* An encoder's attention spans (encoder_span.h) into m->span, and when
 * the backend has span_attention, its tokens grouped by input into
 * m->order / m->starts (*n_spans groups; else 0); a position past the
 * learned ones is refused (abs_pos). */
static int encoder_spans(zi_model *m, const zi_batch *b, int *n_spans, zi_error *err) {
    const int T = b->n_tokens, rows = b->n_table_rows;
    int brc = span_buffers(m, T, rows, err);
    if (brc) return brc;
    *n_spans = 0;
    for (int i = 0; m->cfg.family->abs_pos && i < T; i++)
        if (b->pos[i] >= m->cfg.ctx_train)
            return zi_error_set(err, ZI_ERANGE,
                                "position %d at index %d is outside the %d learned positions",
                                b->pos[i], i, m->cfg.ctx_train);
    int rc = zi_encoder_spans(b->pos, b->seq, T, rows, m->span, m->row_n, err);
    if (rc == ZI_OK && m->be->ops->span_attention)
        zi_encoder_groups(b->seq, T, rows, m->order, m->starts, n_spans, m->row_n);
    return rc;
}

/* An encoder's input embedding (family.h): token + type 0 (+ position),
 * then the embedding LayerNorm. */
static void encoder_embed(zi_model *m, const zi_batch *b) {
    zi_backend *be = m->be;
    const zi_model_config *c = &m->cfg;
    const int T = b->n_tokens;
    if (m->type0) be->ops->add_bias(be, m->x, m->type0, T, c->dim);
    if (c->family->abs_pos) {
        be->ops->get_rows(be, m->tmp, &m->pos_embd, b->pos, T);
        be->ops->add(be, m->x, m->tmp, (size_t)T * c->dim);
    }
    be->ops->layernorm(be, m->x, m->x, m->embd_norm, m->embd_norm_b, T, c->dim, c->norm_eps);
}

/*
 * Queues one pass on the backend. The logits go to host_out when it is not
 * NULL (directly when the backend's memory is the host's, else into
 * m->logits and then a download), and stay in m->logits when it is NULL.
 * Nothing waits for the backend here: the caller syncs.
 */
/* A hybrid's state slots for the pass (zi_kv_cache_add_states): each
 * token's slot into m->tok_slot, each slot named by one table row, and
 * each slot's tokens continuing its state (or starting it over at
 * position 0). Nothing changes when the pass is refused. */
static int check_states(zi_model *m, zi_kv_cache *kv, const zi_batch *b, zi_error *err) {
    const int T = b->n_tokens;
    if (!kv->n_states)
        return zi_error_set(err, ZI_EINVAL,
                            "'%s' keeps recurrent states, and the KV cache has no state slots",
                            m->cfg.arch);
    if (T > m->tok_slot_cap) {
        int32_t *n = realloc(m->tok_slot, (size_t)T * sizeof *n);
        if (!n) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        m->tok_slot = n, m->tok_slot_cap = T;
    }
    for (int i = 0; i < T; i++) {
        const int r = b->seq[i], s = b->state_slots ? b->state_slots[r] : r;
        if (s < 0 || s >= kv->n_states)
            return zi_error_set(err, ZI_EINVAL, "state slot %d of table row %d is outside 0..%d", s,
                                r, kv->n_states - 1);
        m->tok_slot[i] = s;
        kv->state_next[s] = kv->state_len[s];
        kv->state_row[s] = -1;
    }
    for (int i = 0; i < T; i++) {
        const int s = m->tok_slot[i];
        const int first = kv->state_row[s] < 0;
        if (first) kv->state_row[s] = b->seq[i];
        if (kv->state_row[s] != b->seq[i])
            return zi_error_set(err, ZI_EINVAL, "state slot %d is named by table rows %d and %d", s,
                                kv->state_row[s], b->seq[i]);
        if (!first && b->pos[i] == 0) /* its K/V would be read by the tokens before it */
            return zi_error_set(err, ZI_EINVAL,
                                "token %d starts state slot %d over after earlier tokens of it in "
                                "the same pass",
                                i, s);
        if (b->pos[i] != 0 && b->pos[i] != kv->state_next[s])
            return zi_error_set(err, ZI_EINVAL,
                                "token %d is at position %d of state slot %d, whose state covers "
                                "%d positions: a hybrid's sequence is fed in order from its start",
                                i, b->pos[i], s, kv->state_next[s]);
        kv->state_next[s] = b->pos[i] + 1;
    }
    return ZI_OK;
}

/* lfm2's short-convolution block on the normalized rows `in` (T tokens),
 * its output added to the residual stream x: in_proj's b, c and x rows,
 * y = c * conv(b * x) with the window carried in layer l's states,
 * out_proj. */
static void shortconv_block(zi_model *m, zi_kv_cache *kv, int l, const float *in,
                            const zi_batch *b) {
    zi_backend *be = m->be;
    const zi_backend_ops *op = be->ops;
    const zi_layer *L = &m->layers[l];
    const int T = b->n_tokens, dim = m->cfg.dim;
    const size_t n = (size_t)T * dim;
    float *outs[3] = {m->gate, m->up, m->att}; /* b, c, x */
    const zi_weight *ws[3] = {&L->sc_b, &L->sc_c, &L->sc_x};
    op->matmul_n(be, 3, outs, ws, in, T);
    op->mul(be, m->gate, m->att, n); /* b * x */
    op->conv_state(be, m->att, m->gate, L->sc_conv, m->cfg.conv_len, dim, kv->conv[l], m->tok_slot,
                   b->pos, T);
    op->mul(be, m->att, m->up, n); /* c * conv */
    op->matmul(be, m->tmp, &L->sc_out, m->att, T);
    op->add(be, m->x, m->tmp, n);
}

/* qwen35's gated DeltaNet block on the normalized rows `in`, its output
 * added to the residual stream x: attn_qkv, the causal convolution and
 * SiLU (the window in layer l's states), the gated delta rule (its S per
 * value head in layer l's states), the per-head RMSNorm times
 * silu(attn_gate in), ssm_out. */
static void deltanet_block(zi_model *m, zi_kv_cache *kv, int l, const float *in,
                           const zi_batch *b) {
    zi_backend *be = m->be;
    const zi_backend_ops *op = be->ops;
    const zi_layer *L = &m->layers[l];
    const zi_model_config *c = &m->cfg;
    const int T = b->n_tokens, hv = c->dn_v_heads, dh = c->dn_head_dim;
    const int64_t ch = conv_channels(c);
    const size_t inner = (size_t)T * hv * dh;
    float *outs[4] = {m->gate, m->att, m->k, m->v}; /* qkv, z, beta, alpha */
    const zi_weight *ws[4] = {&L->dn_qkv, &L->dn_z, &L->dn_beta, &L->dn_alpha};
    op->matmul_n(be, 4, outs, ws, in, T);
    op->conv_state(be, m->up, m->gate, L->dn_conv, c->conv_len, (int)ch, kv->conv[l], m->tok_slot,
                   b->pos, T);
    op->silu(be, m->up, (size_t)T * ch);
    op->delta_net(be, m->gate, m->up, m->k, m->v, L->dn_dt, L->dn_a, kv->ssm[l], m->tok_slot,
                  b->pos, T, c->dn_k_heads, hv, dh, c->norm_eps);
    op->rmsnorm(be, m->gate, m->gate, L->dn_norm, T * hv, dh, c->norm_eps);
    op->swiglu(be, m->att, m->att, m->gate, inner); /* silu(z) * o */
    op->matmul(be, m->tmp, &L->dn_out, m->att, T);
    op->add(be, m->x, m->tmp, (size_t)T * c->dim);
}

/* granitehybrid's Mamba-2 block on the normalized rows `in`, its output
 * (times residual_scale when set) added to the residual stream x: ssm_in's
 * z, xBC and dt rows; the causal convolution over xBC plus its bias and
 * SiLU (the window in layer l's conv states); the selective scan with its
 * D skip (the P x N states per head in layer l's ssm states); times
 * silu(z); RMSNorm per group; ssm_out. */
static void mamba2_block(zi_model *m, zi_kv_cache *kv, int l, const float *in, const zi_batch *b) {
    zi_backend *be = m->be;
    const zi_backend_ops *op = be->ops;
    const zi_layer *L = &m->layers[l];
    const zi_model_config *c = &m->cfg;
    const int T = b->n_tokens, H = c->ssm_heads, di = c->ssm_inner;
    const int64_t ch = conv_channels(c);
    float *outs[3] = {m->att, m->gate, m->k}; /* z, xBC, dt */
    const zi_weight *ws[3] = {&L->mb_z, &L->mb_xbc, &L->mb_dt};
    op->matmul_n(be, 3, outs, ws, in, T);
    op->conv_state(be, m->up, m->gate, L->mb_conv, c->conv_len, (int)ch, kv->conv[l], m->tok_slot,
                   b->pos, T);
    op->add_bias(be, m->up, L->mb_conv_b, T, (int)ch);
    op->silu(be, m->up, (size_t)T * ch);
    op->ssm_scan(be, m->gate, m->up, m->k, L->mb_dt_b, L->mb_a, L->mb_d, kv->ssm[l], m->tok_slot,
                 b->pos, T, H, di / H, c->ssm_groups, c->ssm_state);
    op->swiglu(be, m->att, m->att, m->gate, (size_t)T * di); /* silu(z) * y */
    op->rmsnorm_groups(be, m->att, m->att, L->mb_norm, T, di, c->ssm_groups, c->norm_eps);
    op->matmul(be, m->tmp, &L->mb_out, m->att, T);
    if (c->residual_scale > 0.0f) op->scale(be, m->tmp, c->residual_scale, (size_t)T * c->dim);
    op->add(be, m->x, m->tmp, (size_t)T * c->dim);
}

/* Checks a pass's adapters (zi_batch.lora) and sizes lora_rows; *on: some
 * token runs one. */
static int lora_prepare(zi_model *m, const zi_batch *b, int *on, zi_error *err) {
    *on = 0;
    if (!b->lora || b->lora_k <= 0) return ZI_OK;
    for (int i = 0; i < b->n_tokens * b->lora_k; i++) {
        if (!b->lora[i]) continue;
        if (zi_lora_model(b->lora[i]) != m)
            return zi_error_set(err, ZI_EINVAL, "token %d's adapter '%s' is another model's",
                                i / b->lora_k, zi_lora_name(b->lora[i]));
        if (b->lora_scale && !isfinite(b->lora_scale[i]))
            return zi_error_set(err, ZI_EINVAL, "token %d's adapter scale is not finite",
                                i / b->lora_k);
        *on = 1;
    }
    if (*on && b->n_tokens > m->lora_cap) {
        zi_lora_row *n = realloc(m->lora_rows, (size_t)b->n_tokens * sizeof *n);
        if (!n) return zi_error_set(err, ZI_ENOMEM, "out of memory");
        m->lora_rows = n, m->lora_cap = b->n_tokens;
    }
    return ZI_OK;
}

/* Adds the pass's LoRA terms for layer l's weight tg (w: its rows and
 * cols) to y, from the product's input x: for each adapter place j, the
 * tokens whose j-th adapter adapts that weight (one op call a place). */
static void lora_apply(zi_model *m, const zi_batch *b, int l, zi_lora_target tg, const zi_weight *w,
                       float *y, const float *x) {
    for (int j = 0; j < b->lora_k; j++) {
        int any = 0;
        for (int i = 0; i < b->n_tokens; i++) {
            const size_t k = (size_t)i * b->lora_k + j;
            zi_lora_row *r = &m->lora_rows[i];
            const zi_lora *ad = b->lora[k];
            const float s = !ad             ? 0.0f
                            : b->lora_scale ? b->lora_scale[k]
                                            : zi_lora_default_scale(ad);
            r->a = NULL;
            if (s != 0.0f && zi_lora_term(ad, l, tg, &r->a, &r->bt, &r->type)) {
                r->rank = zi_lora_rank(ad);
                r->scale = zi_lora_scale(ad, s);
                any = 1;
            }
        }
        if (any) m->be->ops->lora(m->be, y, x, b->n_tokens, w->rows, w->cols, m->lora_rows);
    }
}

static int forward_enqueue(zi_model *m, zi_kv_cache *kv, const zi_batch *b, float *host_out,
                           int *rows_out, zi_error *err) {
    int rc = validate_batch(m, kv, b, err);
    if (rc) return rc;
    if (m->cfg.n_recurrent && (rc = check_states(m, kv, b, err))) return rc;
    int lora_on = 0;
    if ((rc = lora_prepare(m, b, &lora_on, err))) return rc;
    if (b->want_hidden && !b->hidden)
        return zi_error_set(err, ZI_EINVAL, "want_hidden without a hidden buffer");
    int T = b->n_tokens, n_wanted = 0, n_spans = 0, n_f32 = 0;
    for (int i = 0; i < T; i++) n_wanted += b->want_logits ? b->want_logits[i] != 0 : i == T - 1;
    *rows_out = n_wanted;
    if (m->cfg.encoder && n_wanted > 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "'%s' is an encoder: it returns embeddings, not logits", m->cfg.arch);
    if (m->cfg.encoder && (rc = encoder_spans(m, b, &n_spans, err))) return rc;
    if (!m->cfg.encoder && (rc = decoder_f32_spans(m, b, &n_f32, err))) return rc;
    if ((rc = ensure_buffers(m, T, n_wanted, host_out == NULL, err))) return rc;
    /* A mixture of experts quantizes each token's rows for its chosen
     * experts at once (moe.c's matmul_groups): T * n_expert_used tokens,
     * of its scratch grown before anything runs. */
    const zi_moe_params *moe = &m->cfg.moe;
    const int reserve_T = moe->n_expert > 0 ? T * moe->n_expert_used : T;
    if (moe->n_expert > 0 &&
        (rc = zi_moe_reserve(&m->moe_scratch, m->be, moe, T, m->cfg.dim, err)))
        return rc;
    if (reserve_T > m->reserved_tokens || kv->max_ctx > m->reserved_ctx) {
        /* the widest input of a product (a mixture of experts has no
         * dense feed-forward: its experts' width instead) */
        const int ffn_in = moe->n_expert > 0 ? 0 : m->cfg.ffn_dim;
        int64_t cols = ffn_in > m->cfg.dim ? ffn_in : m->cfg.dim;
        int64_t qd = (int64_t)m->cfg.n_heads * m->cfg.head_dim;
        if (qd > cols) cols = qd;
        if (m->cfg.moe.ffn_dim > cols) cols = m->cfg.moe.ffn_dim;
        if (m->cfg.moe.shared_ffn_dim > cols) cols = m->cfg.moe.shared_ffn_dim;
        if ((int64_t)m->cfg.dn_v_heads * m->cfg.dn_head_dim > cols) /* ssm_out's */
            cols = (int64_t)m->cfg.dn_v_heads * m->cfg.dn_head_dim;
        if (m->cfg.ssm_inner > cols) cols = m->cfg.ssm_inner; /* Mamba-2's ssm_out */
        int rt = reserve_T > m->reserved_tokens ? reserve_T : m->reserved_tokens;
        int rctx = kv->max_ctx > m->reserved_ctx ? kv->max_ctx : m->reserved_ctx;
        if ((rc = m->be->ops->reserve(m->be, rt, cols, rctx, err))) return rc;
        m->reserved_tokens = rt;
        m->reserved_ctx = rctx;
    }

    zi_backend *be = m->be;
    const zi_backend_ops *op = be->ops;
    const zi_model_config *c = &m->cfg;
    zi_batch_view view = {T, b->pos, b->seq, b->block_tables, b->table_stride, NULL};
    zi_batch_view att_view = view; /* an encoder's tokens see their whole input */
    if (c->encoder) att_view.pos = m->span;
    if (b->attn_pos) att_view.pos = b->attn_pos, att_view.win_pos = b->pos;
    zi_attn_shape shape = {c->n_heads,
                           c->n_kv_heads,
                           c->head_dim,
                           kv->block_size,
                           kv->max_ctx,
                           c->attn_scale,
                           0 /* window: per layer */,
                           c->attn_softcap,
                           NULL /* sinks: per layer */, 0 /* causal: span_attention's */,
                           0 /* tile_precision: exact */};
    const zi_family *f = c->family;
    const size_t xn = (size_t)T * c->dim;
    /* The family's variants of the same steps (family.h). */
    void (*rope)(zi_backend *, float *, const int32_t *, int, int, int, int,
                 const zi_rope_freqs *) = f->rope_neox ? op->rope_neox : op->rope;
    void (*glu)(zi_backend *, float *, const float *, const float *, size_t) =
        f->geglu ? op->geglu : op->swiglu;

    /* llama.cpp's get_rope_factors: rope_freqs when the file has it, else
     * the long factors when a sequence may outgrow the original context,
     * else the short ones. Local layers never scale their angles (its
     * rope_freq_scale_train_swa = 1). */
    const float *factors = m->rope_freqs                    ? m->rope_freqs
                           : kv->max_ctx > c->rope_orig_ctx ? m->rope_long
                                                            : m->rope_short;
    zi_rope_freqs rf_global = {.base = c->rope_base,
                               .freq_scale = c->rope_freq_scale,
                               .mscale = c->rope_attn_factor,
                               .factors = factors};
    zi_rope_freqs rf_local = {.base = c->rope_base_swa,
                              .freq_scale = f->swa_rope_scaled ? c->rope_freq_scale : 1.0f,
                              .mscale = c->rope_attn_factor,
                              .factors = factors};
    if (c->rope_yarn) {
        rf_global.ext_factor = 1.0f;
        yarn_corr_dims(c, rf_global.base, &rf_global.corr_lo, &rf_global.corr_hi);
        if (f->swa_rope_scaled) {
            rf_local.ext_factor = 1.0f;
            yarn_corr_dims(c, rf_local.base, &rf_local.corr_lo, &rf_local.corr_hi);
        } else if (c->rope_freq_scale < 1.0f) { /* unscaled: without YaRN's magnitude */
            rf_local.mscale /= (float)(1.0 + 0.1 * log(1.0 / (double)c->rope_freq_scale));
        }
    }

    const int32_t *ids = b->tokens;
    if (b->embd_rows) {
        if (T > m->embd_ids_cap) {
            int32_t *n = realloc(m->embd_ids, (size_t)T * sizeof *n);
            if (!n) return zi_error_set(err, ZI_ENOMEM, "out of memory");
            m->embd_ids = n, m->embd_ids_cap = T;
        }
        for (int i = 0; i < T; i++) m->embd_ids[i] = b->embd_rows[i] >= 0 ? 0 : b->tokens[i];
        ids = m->embd_ids;
    }
    op->get_rows(be, m->x, &m->tok_embd, ids, T);
    if (f->embd_scale) op->scale(be, m->x, sqrtf((float)c->dim), xn);
    if (c->embedding_scale > 0.0f) op->scale(be, m->x, c->embedding_scale, xn);
    for (int i = 0; b->embd_rows && i < T; i++) /* after the scale: token rows only */
        if (b->embd_rows[i] >= 0)
            op->upload(be, m->x + (size_t)i * c->dim, b->embd + (size_t)b->embd_rows[i] * c->dim,
                       (size_t)c->dim * sizeof(float));
    if (f->encoder) encoder_embed(m, b);
    /* An encoder's blocks read the residual stream itself (post-norm). */
    const float *in = f->encoder ? m->x : m->xn;
    for (int l = 0; l < c->n_layers; l++) {
        const zi_layer *L = &m->layers[l];
        if (!f->encoder) op->rmsnorm(be, m->xn, m->x, L->attn_norm, T, c->dim, c->norm_eps);
        if (L->recurrent) {
            if (f->recurrent == ZI_REC_MAMBA2)
                mamba2_block(m, kv, l, in, b);
            else if (f->recurrent == ZI_REC_DELTANET)
                deltanet_block(m, kv, l, in, b);
            else
                shortconv_block(m, kv, l, in, b);
        } else {
            float *qkv_out[3] = {f->attn_gate ? m->gate : m->q, m->k, m->v};
            const zi_weight *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
            op->matmul_n(be, 3, qkv_out, qkv_w, in, T);
            for (int i = 0; lora_on && i < 3; i++)
                lora_apply(m, b, l, ZI_LORA_Q + i, qkv_w[i], qkv_out[i], in);
            if (f->attn_gate) { /* per head [query, gate]: queries to q, gates to up */
                const int rows = T * c->n_heads;
                op->gather_rows(be, m->q, m->gate, m->gate_idx, rows, c->head_dim);
                op->gather_rows(be, m->up, m->gate, m->gate_idx + (size_t)m->cap * c->n_heads, rows,
                                c->head_dim);
            }
            if (L->bq) op->add_bias(be, m->q, L->bq, T, c->n_heads * c->head_dim);
            if (L->bk) op->add_bias(be, m->k, L->bk, T, c->n_kv_heads * c->head_dim);
            if (L->bv) op->add_bias(be, m->v, L->bv, T, c->n_kv_heads * c->head_dim);
            if (L->q_norm) { /* per head: rows of head_dim */
                op->rmsnorm(be, m->q, m->q, L->q_norm, T * c->n_heads, c->head_dim, c->norm_eps);
                op->rmsnorm(be, m->k, m->k, L->k_norm, T * c->n_kv_heads, c->head_dim, c->norm_eps);
            }
            const zi_rope_freqs *rf = L->local ? &rf_local : &rf_global;
            if (!f->abs_pos && !c->no_rope) {
                rope(be, m->q, b->pos, T, c->n_heads, c->head_dim, c->rope_dim, rf);
                rope(be, m->k, b->pos, T, c->n_kv_heads, c->head_dim, c->rope_dim, rf);
            }
            shape.window = L->local ? c->sliding_window : 0;
            shape.sinks = L->sinks;
            if (n_spans > 0) { /* an encoder's inputs, each over its own float32 K/V */
                op->span_attention(be, m->att, m->q, m->k, m->v, m->order, m->starts, n_spans,
                                   &shape);
            } else {
                op->kv_store(be, kv->k[l], kv->v[l], m->k, m->v, &view, &shape);
                op->attention(be, m->att, m->q, kv->k[l], kv->v[l], &att_view, &shape);
                /* A decoder's whole embedding inputs again, over the pass's
                 * float32 K/V (zi_batch.f32_attn): their rows of att replaced. */
                if (n_f32 > 0 && !shape.window && shape.softcap == 0.0f && !shape.sinks) {
                    shape.causal = 1;
                    op->span_attention(be, m->att, m->q, m->k, m->v, m->order, m->starts, n_f32,
                                       &shape);
                    shape.causal = 0;
                }
            }
            if (f->attn_gate)
                op->sigmoid_mul(be, m->att, m->up, (size_t)T * c->n_heads * c->head_dim);
            op->matmul(be, m->tmp, &L->wo, m->att, T);
            if (lora_on) lora_apply(m, b, l, ZI_LORA_O, &L->wo, m->tmp, m->att);
            if (L->bo) op->add_bias(be, m->tmp, L->bo, T, c->dim);
            if (L->post_attn_norm)
                op->rmsnorm(be, m->tmp, m->tmp, L->post_attn_norm, T, c->dim, c->norm_eps);
            if (c->residual_scale > 0.0f) op->scale(be, m->tmp, c->residual_scale, xn);
            op->add(be, m->x, m->tmp, xn);
        }
        if (f->encoder)
            op->layernorm(be, m->x, m->x, L->ln_attn, L->ln_attn_b, T, c->dim, c->norm_eps);

        if (!f->encoder) op->rmsnorm(be, m->xn, m->x, L->ffn_norm, T, c->dim, c->norm_eps);
        if (c->moe.n_expert > 0) { /* routed experts (moe.h) into tmp */
            if ((rc = zi_moe_forward(&m->moe_scratch, be, &c->moe, &L->moe, m->tmp, m->xn, T,
                                     c->dim, err))) {
                for (int i = 0; c->n_recurrent && i < T; i++) /* part-way: start over */
                    kv->state_len[m->tok_slot[i]] = -1;
                return rc;
            }
        } else if (f->gelu_ffn) { /* down(gelu(up x + b)), no gate */
            op->matmul(be, m->gate, &L->w_up, in, T);
            if (L->b_up) op->add_bias(be, m->gate, L->b_up, T, c->ffn_dim);
            op->gelu(be, m->gate, (size_t)T * c->ffn_dim);
        } else {
            float *ffn_out[2] = {m->gate, m->up};
            const zi_weight *ffn_w[2] = {&L->w_gate, &L->w_up};
            op->matmul_n(be, 2, ffn_out, ffn_w, in, T);
            for (int i = 0; lora_on && i < 2; i++)
                lora_apply(m, b, l, ZI_LORA_GATE + i, ffn_w[i], ffn_out[i], in);
            glu(be, m->gate, m->gate, m->up, (size_t)T * c->ffn_dim);
        }
        if (c->moe.n_expert == 0) {
            op->matmul(be, m->tmp, &L->w_down, m->gate, T);
            if (lora_on) lora_apply(m, b, l, ZI_LORA_DOWN, &L->w_down, m->tmp, m->gate);
        }
        if (L->b_down) op->add_bias(be, m->tmp, L->b_down, T, c->dim);
        if (L->post_ffn_norm)
            op->rmsnorm(be, m->tmp, m->tmp, L->post_ffn_norm, T, c->dim, c->norm_eps);
        if (c->residual_scale > 0.0f) op->scale(be, m->tmp, c->residual_scale, xn);
        op->add(be, m->x, m->tmp, xn);
        if (f->encoder)
            op->layernorm(be, m->x, m->x, L->ln_out, L->ln_out_b, T, c->dim, c->norm_eps);
        if (m->progress) m->progress(m->progress_arg);
    }
    for (int i = 0; c->n_recurrent && i < T; i++) /* in order: each slot's last */
        kv->state_len[m->tok_slot[i]] = b->pos[i] + 1;
    /* Normalize only the rows whose logits are wanted, packed together: in
     * one call when every row is (a decode step; on a GPU one kernel, not
     * one per sequence). */
    if (n_wanted == T) {
        op->rmsnorm(be, m->xn, m->x, m->output_norm, T, c->dim, c->norm_eps);
    } else {
        int j = 0;
        for (int i = 0; i < T; i++) {
            int want = b->want_logits ? b->want_logits[i] != 0 : i == T - 1;
            if (!want) continue;
            op->rmsnorm(be, m->xn + (size_t)j * c->dim, m->x + (size_t)i * c->dim, m->output_norm,
                        1, c->dim, c->norm_eps);
            j++;
        }
    }
    if (b->want_hidden) collect_hidden(m, b);
    if (n_wanted == 0) return ZI_OK; /* a pass that only fills the cache */
    float *out = host_out && be->host_memory ? host_out : m->logits;
    op->matmul(be, out, &m->output, m->xn, n_wanted);
    if (m->output_bias) op->add_bias(be, out, m->output_bias, n_wanted, c->n_vocab);
    if (c->final_softcap > 0.0f)
        op->softcap(be, out, c->final_softcap, (size_t)n_wanted * c->n_vocab);
    if (c->logit_scale > 0.0f) /* Granite divides its logits */
        op->scale(be, out, 1.0f / c->logit_scale, (size_t)n_wanted * c->n_vocab);
    if (host_out && !be->host_memory)
        op->download(be, host_out, m->logits, (size_t)n_wanted * c->n_vocab * sizeof(float));
    return ZI_OK;
}

int zi_model_forward(zi_model *m, zi_kv_cache *kv, const zi_batch *b, float *logits,
                     zi_error *err) {
    int rows;
    int rc = forward_enqueue(m, kv, b, logits, &rows, err);
    return rc ? rc : m->be->ops->sync(m->be, err);
}

const float *zi_model_device_logits(const zi_model *m) {
    return m->logits;
}

int zi_model_forward_async(zi_model *m, zi_kv_cache *kv, const zi_batch *b, const float **logits,
                           int *n_rows, zi_error *err) {
    int rows = 0;
    if (b->want_hidden || m->cfg.encoder)
        return zi_error_set(err, ZI_EINVAL, "an asynchronous pass returns no hidden states");
    int rc = forward_enqueue(m, kv, b, NULL, &rows, err);
    if (rc) return rc;
    if (logits) *logits = m->logits;
    if (n_rows) *n_rows = rows;
    return ZI_OK;
}
