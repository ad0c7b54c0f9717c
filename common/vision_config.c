/*
 * vision_config.c - a projector file's image-tower settings (see
 * vision_config.h).
 */
#include "vision_config.h"

#include <math.h>
#include <string.h>

/* Bounds that keep every size product small; real towers are far inside
 * (SigLIP so400m: 1152 wide, 27 layers, 4096 patches). */
#define ZI_VISION_MAX_SIDE 4096
#define ZI_VISION_MAX_EMBD 16384
/* A head's width: the CPU's span attention keeps one head's accumulators
 * on the stack (kernels/cpu/span_attention.h ZI_SPAN_ATTN_MAX_HEAD_DIM). */
#define ZI_VISION_MAX_HEAD_DIM 1024
/* Patches a tile, and values a merged token (idefics3's n_embd x s^2):
 * SigLIP so400m has 4096 and 1152 x 16. */
#define ZI_VISION_MAX_PATCHES 16384
#define ZI_VISION_MAX_MERGED (1 << 18)
#define ZI_VISION_MAX_LAYERS 256

static int get_u32_key(const zi_gguf *g, const char *key, int lo, int hi, int *out,
                       zi_error *err) {
    uint32_t v;
    int rc = zi_gguf_get_u32(g, key, &v, err);
    if (rc) return rc;
    if (v < (uint32_t)lo || v > (uint32_t)hi)
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range (%d..%d)", key, v, lo, hi);
    *out = (int)v;
    return ZI_OK;
}

static int get_f32x3(const zi_gguf *g, const char *key, float out[3], zi_error *err) {
    const void *data;
    uint64_t n;
    int rc = zi_gguf_get_array(g, key, ZI_GGUF_FLOAT32, &data, &n, err);
    if (rc) return rc;
    if (n != 3) return zi_error_set(err, ZI_EFORMAT, "%s has %llu values, expected 3", key,
                                    (unsigned long long)n);
    memcpy(out, data, 3 * sizeof(float));
    for (int i = 0; i < 3; i++)
        if (!isfinite(out[i]))
            return zi_error_set(err, ZI_EFORMAT, "%s[%d] is not finite", key, i);
    return ZI_OK;
}

int zi_vision_read_config(const zi_gguf *g, int lm_dim, zi_vision_config *c, zi_error *err) {
    memset(c, 0, sizeof *c);
    zi_str s;
    int rc;
    if ((rc = zi_gguf_get_str(g, "general.architecture", &s, err))) return rc;
    if (!zi_str_eq(s, "clip"))
        return zi_error_set(err, ZI_EFORMAT,
                            "general.architecture is '%.*s': not a projector file (clip)",
                            (int)s.len, s.ptr);
    int has_vision = 0;
    if ((rc = zi_gguf_get_bool_or(g, "clip.has_vision_encoder", 0, &has_vision, err))) return rc;
    if (!has_vision)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "clip.has_vision_encoder is not true: the file has no image tower");
    const char *key = zi_gguf_find_kv(g, "clip.vision.projector_type") ? "clip.vision.projector_type"
                                                                       : "clip.projector_type";
    if ((rc = zi_gguf_get_str(g, key, &s, err))) return rc;
    if (zi_str_eq(s, "gemma3"))
        c->kind = ZI_VISION_GEMMA3;
    else if (zi_str_eq(s, "idefics3"))
        c->kind = ZI_VISION_IDEFICS3;
    else
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s '%.*s' is not supported (supported: gemma3, idefics3)", key,
                            (int)s.len, s.ptr);
    int gelu = 0, silu = 0;
    if ((rc = zi_gguf_get_bool_or(g, "clip.use_gelu", 0, &gelu, err))) return rc;
    if ((rc = zi_gguf_get_bool_or(g, "clip.use_silu", 0, &silu, err))) return rc;
    if (!gelu || silu)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "the tower's feed-forward is not GELU (clip.use_gelu is not true): "
                            "only GELU towers are supported");
    if ((rc = get_u32_key(g, "clip.vision.image_size", 1, ZI_VISION_MAX_SIDE, &c->image_size, err)) ||
        (rc = get_u32_key(g, "clip.vision.patch_size", 1, ZI_VISION_MAX_SIDE, &c->patch_size, err)) ||
        (rc = get_u32_key(g, "clip.vision.embedding_length", 1, ZI_VISION_MAX_EMBD, &c->n_embd,
                          err)) ||
        (rc = get_u32_key(g, "clip.vision.feed_forward_length", 1, 4 * ZI_VISION_MAX_EMBD,
                          &c->n_ff, err)) ||
        (rc = get_u32_key(g, "clip.vision.block_count", 1, ZI_VISION_MAX_LAYERS, &c->n_layers,
                          err)) ||
        (rc = get_u32_key(g, "clip.vision.attention.head_count", 1, ZI_VISION_MAX_EMBD,
                          &c->n_heads, err)))
        return rc;
    if ((rc = zi_gguf_get_f32(g, "clip.vision.attention.layer_norm_epsilon", &c->eps, err)))
        return rc;
    if (!(c->eps > 0.0f && c->eps < 1.0f))
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.attention.layer_norm_epsilon = %g is out of range",
                            (double)c->eps);
    if ((rc = get_f32x3(g, "clip.vision.image_mean", c->mean, err)) ||
        (rc = get_f32x3(g, "clip.vision.image_std", c->std, err)))
        return rc;
    for (int i = 0; i < 3; i++)
        if (!(c->std[i] > 0.0f))
            return zi_error_set(err, ZI_EFORMAT, "clip.vision.image_std[%d] = %g is not positive",
                                i, (double)c->std[i]);
    if (c->image_size % c->patch_size)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.image_size %d is not a multiple of patch_size %d",
                            c->image_size, c->patch_size);
    if (c->n_embd % c->n_heads)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.embedding_length %d is not a multiple of head_count %d",
                            c->n_embd, c->n_heads);
    if (c->n_embd / c->n_heads > ZI_VISION_MAX_HEAD_DIM)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.embedding_length %d / head_count %d: heads of %d values, "
                            "more than %d",
                            c->n_embd, c->n_heads, c->n_embd / c->n_heads, ZI_VISION_MAX_HEAD_DIM);
    const int side = c->image_size / c->patch_size;
    if ((int64_t)side * side > ZI_VISION_MAX_PATCHES)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.image_size %d / patch_size %d: %lld patches a tile, more "
                            "than %d",
                            c->image_size, c->patch_size, (long long)side * side,
                            ZI_VISION_MAX_PATCHES);
    c->n_patches = side * side;
    uint32_t merge = c->kind == ZI_VISION_GEMMA3 ? 4 : 0;
    if ((rc = zi_gguf_get_u32_or(g, "clip.vision.projector.scale_factor", merge, &merge, err)))
        return rc;
    if (merge < 2 || merge > (uint32_t)side || side % (int)merge)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.projector.scale_factor = %u does not divide the %d "
                            "patches of a side",
                            merge, side);
    c->n_merge = (int)merge;
    if (c->kind == ZI_VISION_IDEFICS3 && (int64_t)c->n_embd * merge * merge > ZI_VISION_MAX_MERGED)
        return zi_error_set(err, ZI_EFORMAT,
                            "clip.vision.projector.scale_factor %u: merged tokens of %lld values, "
                            "more than %d",
                            merge, (long long)c->n_embd * merge * merge, ZI_VISION_MAX_MERGED);
    c->n_tokens = (side / c->n_merge) * (side / c->n_merge);
    if (c->kind == ZI_VISION_IDEFICS3) {
        uint32_t pre = 0;
        if ((rc = zi_gguf_get_u32_or(g, "clip.vision.preproc_image_size", 0, &pre, err))) return rc;
        if (pre > 16u * ZI_VISION_MAX_SIDE)
            return zi_error_set(err, ZI_EFORMAT, "clip.vision.preproc_image_size = %u is out of range",
                                pre);
        c->preproc_size = (int)pre;
    }
    /* The projector's output width, from its tensor. */
    const zi_gguf_tensor *pt = zi_gguf_find_tensor(
        g, c->kind == ZI_VISION_GEMMA3 ? "mm.input_projection.weight" : "mm.model.fc.weight");
    if (!pt)
        return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'",
                            c->kind == ZI_VISION_GEMMA3 ? "mm.input_projection.weight"
                                                        : "mm.model.fc.weight");
    if (pt->n_dims != 2)
        return zi_error_set(err, ZI_EFORMAT, "tensor '%.*s' has %u dims, expected 2",
                            (int)pt->name.len, pt->name.ptr, pt->n_dims);
    c->lm_dim = (int)(c->kind == ZI_VISION_GEMMA3 ? pt->ne[0] : pt->ne[1]);
    if (lm_dim > 0 && c->lm_dim != lm_dim)
        return zi_error_set(err, ZI_EFORMAT,
                            "the projector makes embeddings of %d values, the text model takes %d "
                            "(a projector for another model?)",
                            c->lm_dim, lm_dim);
    return ZI_OK;
}

int zi_vision_config_load(const char *path, int lm_dim, zi_vision_config *c, zi_error *err) {
    zi_gguf *g = NULL;
    int rc = zi_gguf_open(path, &g, err);
    if (!rc) rc = zi_vision_read_config(g, lm_dim, c, err);
    if (rc) zi_error_prefix(err, "%s", path);
    zi_gguf_close(g);
    return rc;
}
