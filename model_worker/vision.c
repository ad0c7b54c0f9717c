/*
 * vision.c - the SigLIP image towers of llama.cpp's projector files (see
 * vision.h): loading and one tile's forward pass.
 */
#include "vision.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "weights.h"

typedef struct vision_layer {
    zi_weight wq, wk, wv, wo, up, down;
    float *bq, *bk, *bv, *bo, *b_up, *b_down;
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
} vision_layer;

struct zi_vision {
    zi_vision_config c;
    zi_backend *be;
    zi_gguf *g; /* kept open: F16/F32 weights may point into its mapping */
    zi_weight patch;     /* [n_embd][3 * patch^2]: the convolution as a product */
    float *patch_b;      /* [n_embd] or NULL */
    float *pos;          /* [n_patches][n_embd] */
    vision_layer *layers;
    float *post_w, *post_b; /* post LayerNorm, or NULL */
    zi_weight proj;         /* [lm_dim][n_embd] (gemma3) or [lm_dim][n_embd * s^2] */
    float *proj_t;          /* gemma3: the host copy proj points at (transposed) */
    float *soft_norm;       /* gemma3: [n_embd] */
    /* the pass's buffers (backend memory) and host scratch */
    float *x, *xn, *q, *k, *v, *att, *ff, *mrg, *out;
    float *cols;     /* host: [n_patches][3 * patch^2] */
    int32_t *idx;    /* host: the pooling's or shuffle's rows */
    float *wts;      /* host: the pooling's weights */
    int32_t *order;  /* host: span_attention's rows, 0..n_patches-1 */
    int32_t starts[2];
    int merged_rows, merged_dim; /* the projector's input */
};

/* ---- loading ---- */

/* A tensor of the file with exactly these dims (ne[0] first). */
static const zi_gguf_tensor *find_shaped(const zi_gguf *g, const char *name, int n_dims,
                                         const int64_t *ne, int required, zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) {
        if (required) zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
        return NULL;
    }
    int ok = (int)t->n_dims == n_dims;
    for (int i = 0; ok && i < n_dims; i++) ok = t->ne[i] == ne[i];
    if (!ok) {
        zi_error_set(err, ZI_EFORMAT,
                     "tensor '%s' has shape [%lld, %lld, %lld, %lld] (%u dims), expected %d dims "
                     "[%lld, %lld, ...]",
                     name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                     (long long)t->ne[3], t->n_dims, n_dims, (long long)ne[0],
                     (long long)(n_dims > 1 ? ne[1] : 1));
        return NULL;
    }
    return t;
}

static int load_matrix(zi_vision *v, const char *name, int64_t cols, int64_t rows, zi_weight *w,
                       zi_error *err) {
    const int64_t ne[2] = {cols, rows};
    const zi_gguf_tensor *t = find_shaped(v->g, name, 2, ne, 1, err);
    if (!t) return err->code;
    return v->be->ops->weight_init(v->be, w, t, err);
}

/* A vector of n floats (backend memory); NULL and ZI_OK when optional and
 * absent. */
static int load_vec(zi_vision *v, const char *name, int64_t n, int required, float **out,
                    zi_error *err) {
    *out = NULL;
    const int64_t ne[1] = {n};
    const zi_gguf_tensor *t = find_shaped(v->g, name, 1, ne, required, err);
    if (!t) return required || zi_gguf_find_tensor(v->g, name) ? err->code : ZI_OK;
    *out = v->be->ops->vector_init(v->be, t, err);
    return *out ? ZI_OK : (err->code ? err->code : ZI_ENOMEM);
}

static int load_tower(zi_vision *v, zi_error *err) {
    const zi_vision_config *c = &v->c;
    zi_backend *be = v->be;
    const int64_t E = c->n_embd, F = c->n_ff, P = c->patch_size;
    char name[96];
    int rc;
    /* The convolution [P, P, 3, E] as a product: row e, column (ch*P + ky)*P + kx. */
    const int64_t pne[4] = {P, P, 3, E};
    const zi_gguf_tensor *t = find_shaped(v->g, "v.patch_embd.weight", 4, pne, 1, err);
    if (!t) return err->code;
    zi_gguf_tensor flat = *t;
    flat.n_dims = 2, flat.ne[0] = 3 * P * P, flat.ne[1] = E, flat.ne[2] = flat.ne[3] = 1;
    if ((rc = be->ops->weight_init(be, &v->patch, &flat, err))) return rc;
    if ((rc = load_vec(v, "v.patch_embd.bias", E, 0, &v->patch_b, err))) return rc;
    const int64_t posne[2] = {E, c->n_patches};
    if (!(t = find_shaped(v->g, "v.position_embd.weight", 2, posne, 1, err))) return err->code;
    if (!(v->pos = be->ops->vector_init(be, t, err))) return err->code ? err->code : ZI_ENOMEM;
    v->layers = calloc((size_t)c->n_layers, sizeof *v->layers);
    if (!v->layers) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        vision_layer *L = &v->layers[l];
        struct {
            const char *n;
            int64_t cols, rows;
            zi_weight *w;
            float **b;
        } mats[] = {{"attn_q", E, E, &L->wq, &L->bq},       {"attn_k", E, E, &L->wk, &L->bk},
                    {"attn_v", E, E, &L->wv, &L->bv},       {"attn_out", E, E, &L->wo, &L->bo},
                    {"ffn_up", E, F, &L->up, &L->b_up}, {"ffn_down", F, E, &L->down, &L->b_down}};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
            snprintf(name, sizeof name, "v.blk.%d.%s.weight", l, mats[i].n);
            if ((rc = load_matrix(v, name, mats[i].cols, mats[i].rows, mats[i].w, err))) return rc;
            snprintf(name, sizeof name, "v.blk.%d.%s.bias", l, mats[i].n);
            if ((rc = load_vec(v, name, mats[i].rows, 0, mats[i].b, err))) return rc;
        }
        struct {
            const char *n;
            float **p;
        } norms[] = {{"ln1.weight", &L->ln1_w},
                     {"ln1.bias", &L->ln1_b},
                     {"ln2.weight", &L->ln2_w},
                     {"ln2.bias", &L->ln2_b}};
        for (size_t i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "v.blk.%d.%s", l, norms[i].n);
            if ((rc = load_vec(v, name, E, 1, norms[i].p, err))) return rc;
        }
        if (zi_gguf_find_tensor(v->g, (snprintf(name, sizeof name, "v.blk.%d.ffn_gate.weight", l),
                                       name)))
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "tensor '%s': gated feed-forward towers are not supported", name);
    }
    if (zi_gguf_find_tensor(v->g, "v.pre_ln.weight"))
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tensor 'v.pre_ln.weight': towers with a pre-LayerNorm are not "
                            "supported (SigLIP has none)");
    if ((rc = load_vec(v, "v.post_ln.weight", E, 0, &v->post_w, err))) return rc;
    if (v->post_w && (rc = load_vec(v, "v.post_ln.bias", E, 1, &v->post_b, err))) return rc;
    return ZI_OK;
}

static int load_projector(zi_vision *v, zi_error *err) {
    const zi_vision_config *c = &v->c;
    zi_backend *be = v->be;
    const int64_t E = c->n_embd, D = c->lm_dim;
    int rc;
    if (c->kind == ZI_VISION_IDEFICS3) {
        const int64_t cols = E * c->n_merge * c->n_merge;
        return load_matrix(v, "mm.model.fc.weight", cols, D, &v->proj, err);
    }
    if ((rc = load_vec(v, "mm.soft_emb_norm.weight", E, 1, &v->soft_norm, err))) return rc;
    /* llama.cpp multiplies by this tensor's transpose: [E rows][D] in the
     * file; the products here want [D rows][E]. */
    const int64_t ne[2] = {D, E};
    const zi_gguf_tensor *t = find_shaped(v->g, "mm.input_projection.weight", 2, ne, 1, err);
    if (!t) return err->code;
    float *f = zi_vector_dequantize(t, err);
    if (!f) return err->code ? err->code : ZI_ENOMEM;
    v->proj_t = malloc((size_t)D * (size_t)E * sizeof(float));
    if (!v->proj_t) {
        free(f);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for mm.input_projection.weight");
    }
    for (int64_t e = 0; e < E; e++)
        for (int64_t d = 0; d < D; d++) v->proj_t[d * E + e] = f[e * D + d];
    free(f);
    zi_gguf_tensor tt = *t;
    tt.type = ZI_TYPE_F32, tt.ne[0] = E, tt.ne[1] = D;
    tt.nbytes = (uint64_t)D * (uint64_t)E * sizeof(float), tt.data = v->proj_t;
    return be->ops->weight_init(be, &v->proj, &tt, err);
}

static int alloc_buffers(zi_vision *v, zi_error *err) {
    const zi_vision_config *c = &v->c;
    zi_backend *be = v->be;
    const size_t T = (size_t)c->n_patches, E = (size_t)c->n_embd, F = (size_t)c->n_ff;
    const size_t s2 = (size_t)c->n_merge * (size_t)c->n_merge, P = (size_t)c->patch_size;
    v->merged_rows = c->n_tokens;
    v->merged_dim = c->kind == ZI_VISION_GEMMA3 ? c->n_embd : c->n_embd * c->n_merge * c->n_merge;
    float **bufs[] = {&v->x, &v->xn, &v->q, &v->k, &v->v, &v->att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = be->ops->alloc(be, T * E * sizeof(float))))
            return zi_error_set(err, ZI_ENOMEM, "out of memory for the image tower's activations");
    v->ff = be->ops->alloc(be, T * (F > 3 * P * P ? F : 3 * P * P) * sizeof(float));
    v->mrg = be->ops->alloc(be, T * E * sizeof(float)); /* shuffled: n_tokens * s^2 rows of E */
    v->out = be->ops->alloc(be, (size_t)c->n_tokens * (size_t)c->lm_dim * sizeof(float));
    v->cols = malloc(T * 3 * P * P * sizeof(float));
    v->idx = malloc(T * sizeof(int32_t));
    v->wts = malloc(T * sizeof(float));
    if (!v->ff || !v->mrg || !v->out || !v->cols || !v->idx || !v->wts)
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the image tower's activations");
    (void)s2;
    /* The pooling or shuffle: which patch goes where (vision.h). Patches
     * are row-major over the side x side grid, as the convolution lays
     * them out; so are the merged tokens over the (side/s)^2 grid. */
    const int side = c->image_size / c->patch_size, s = c->n_merge, ms = side / s;
    for (int ty = 0; ty < ms; ty++)
        for (int tx = 0; tx < ms; tx++)
            for (int dy = 0; dy < s; dy++)
                for (int dx = 0; dx < s; dx++) {
                    const int tok = ty * ms + tx, j = dy * s + dx;
                    v->idx[tok * s * s + j] = (ty * s + dy) * side + tx * s + dx;
                    v->wts[tok * s * s + j] = 1.0f / (float)(s * s);
                }
    v->order = malloc(T * sizeof(int32_t));
    if (!v->order) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; i < T; i++) v->order[i] = (int32_t)i;
    v->starts[0] = 0, v->starts[1] = (int32_t)T;
    return be->ops->reserve(be, (int)T,
                            (int64_t)(F > (size_t)v->merged_dim ? F : (size_t)v->merged_dim) +
                                (int64_t)(3 * P * P),
                            1, err);
}

/* The backend's tile products' packs, made at load so that an encode does
 * not pay for them; a weight that cannot be packed runs as matmul. */
static void prepare_tiles(zi_vision *v) {
    zi_backend *be = v->be;
    if (!be->ops->matmul_tile || !be->ops->weight_prepare_tile) return;
    zi_error e = {0};
    for (int l = 0; l < v->c.n_layers; l++) {
        vision_layer *L = &v->layers[l];
        zi_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->up, &L->down};
        for (size_t i = 0; i < 6; i++) be->ops->weight_prepare_tile(be, ws[i], &e);
    }
    be->ops->weight_prepare_tile(be, &v->patch, &e);
    be->ops->weight_prepare_tile(be, &v->proj, &e);
}

int zi_vision_load(const char *path, zi_backend *be, int lm_dim, zi_vision **out, zi_error *err) {
    *out = NULL;
    const zi_backend_ops *op = be->ops;
    if (!op->layernorm || !op->gelu || !op->add_bias || !op->span_attention || !op->gather_rows ||
        !op->weighted_sum_rows)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "this backend lacks the ops an image tower needs (layernorm, gelu, "
                            "span_attention, gather_rows, weighted_sum_rows)");
    zi_vision *v = calloc(1, sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    v->be = be;
    int rc = zi_gguf_open(path, &v->g, err);
    if (!rc) rc = zi_vision_read_config(v->g, lm_dim, &v->c, err);
    if (!rc) rc = load_tower(v, err);
    if (!rc) rc = load_projector(v, err);
    if (!rc) rc = alloc_buffers(v, err);
    if (!rc) prepare_tiles(v);
    if (rc) {
        zi_error_prefix(err, "%s", path);
        zi_vision_free(v);
        return rc;
    }
    *out = v;
    return ZI_OK;
}

const zi_vision_config *zi_vision_get_config(const zi_vision *v) { return &v->c; }

/* ---- the forward pass ---- */

/* A product over the whole tile: the backend's tile product where it has
 * one (any summation order, float32-level; no batch invariance to keep
 * for a fixed-size image), else matmul. */
static void tile_mm(const zi_vision *v, float *y, const zi_weight *w, const float *x, int n) {
    const zi_backend_ops *op = v->be->ops;
    if (op->matmul_tile)
        op->matmul_tile(v->be, y, w, x, n);
    else
        op->matmul(v->be, y, w, x, n);
}

int zi_vision_encode(zi_vision *v, const float *pixels, float *out, zi_error *err) {
    const zi_vision_config *c = &v->c;
    zi_backend *be = v->be;
    const zi_backend_ops *op = be->ops;
    const int T = c->n_patches, E = c->n_embd, F = c->n_ff, P = c->patch_size;
    const int side = c->image_size / P, K = 3 * P * P;
    const size_t xn = (size_t)T * E;
    for (size_t i = 0, n = (size_t)c->image_size * c->image_size * 3; i < n; i++)
        if (!isfinite(pixels[i]))
            return zi_error_set(err, ZI_EINVAL, "pixel value %zu is not finite", i);
    /* im2col: patch (py, px) row-major; column (ch * P + ky) * P + kx. */
    for (int py = 0; py < side; py++)
        for (int px = 0; px < side; px++) {
            float *col = v->cols + ((size_t)py * side + px) * K;
            for (int ch = 0; ch < 3; ch++)
                for (int ky = 0; ky < P; ky++)
                    for (int kx = 0; kx < P; kx++)
                        col[(ch * P + ky) * P + kx] =
                            pixels[(((size_t)py * P + ky) * c->image_size + (size_t)px * P + kx) * 3 +
                                   ch];
        }
    op->upload(be, v->ff, v->cols, (size_t)T * K * sizeof(float));
    tile_mm(v, v->x, &v->patch, v->ff, T);
    if (v->patch_b) op->add_bias(be, v->x, v->patch_b, T, E);
    op->add(be, v->x, v->pos, xn);

    zi_attn_shape shape = {.n_heads = c->n_heads,
                           .n_kv_heads = c->n_heads,
                           .head_dim = E / c->n_heads,
                           .block_size = 1,
                           .max_ctx = T,
                           .scale = 1.0f / sqrtf((float)(E / c->n_heads)),
                           .tile_precision = 1};
    for (int l = 0; l < c->n_layers; l++) {
        const vision_layer *L = &v->layers[l];
        op->layernorm(be, v->xn, v->x, L->ln1_w, L->ln1_b, T, E, c->eps);
        tile_mm(v, v->q, &L->wq, v->xn, T);
        tile_mm(v, v->k, &L->wk, v->xn, T);
        tile_mm(v, v->v, &L->wv, v->xn, T);
        if (L->bq) op->add_bias(be, v->q, L->bq, T, E);
        if (L->bk) op->add_bias(be, v->k, L->bk, T, E);
        if (L->bv) op->add_bias(be, v->v, L->bv, T, E);
        op->span_attention(be, v->att, v->q, v->k, v->v, v->order, v->starts, 1, &shape);
        tile_mm(v, v->xn, &L->wo, v->att, T);
        if (L->bo) op->add_bias(be, v->xn, L->bo, T, E);
        op->add(be, v->x, v->xn, xn);
        op->layernorm(be, v->xn, v->x, L->ln2_w, L->ln2_b, T, E, c->eps);
        tile_mm(v, v->ff, &L->up, v->xn, T);
        if (L->b_up) op->add_bias(be, v->ff, L->b_up, T, F);
        op->gelu(be, v->ff, (size_t)T * F);
        tile_mm(v, v->xn, &L->down, v->ff, T);
        if (L->b_down) op->add_bias(be, v->xn, L->b_down, T, E);
        op->add(be, v->x, v->xn, xn);
    }
    if (v->post_w) op->layernorm(be, v->x, v->x, v->post_w, v->post_b, T, E, c->eps);

    const int s2 = c->n_merge * c->n_merge;
    if (c->kind == ZI_VISION_GEMMA3) {
        /* The mean of each s x s block of patches, then the soft-embedding
         * norm (an RMS norm times its weight) and the projection. */
        op->weighted_sum_rows(be, v->mrg, v->x, v->idx, v->wts, c->n_tokens, s2, E);
        op->rmsnorm(be, v->mrg, v->mrg, v->soft_norm, c->n_tokens, E, c->eps);
    } else {
        /* Each token's s x s patches side by side: rows of E in order. */
        op->gather_rows(be, v->mrg, v->x, v->idx, c->n_tokens * s2, E);
    }
    tile_mm(v, v->out, &v->proj, v->mrg, c->n_tokens);
    int rc = op->sync(be, err);
    if (rc) return rc;
    op->download(be, out, v->out, (size_t)c->n_tokens * c->lm_dim * sizeof(float));
    return ZI_OK;
}

void zi_vision_free(zi_vision *v) {
    if (!v) return;
    zi_backend *be = v->be;
    const zi_backend_ops *op = be->ops;
    if (v->layers) {
        for (int l = 0; l < v->c.n_layers; l++) {
            vision_layer *L = &v->layers[l];
            zi_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->up, &L->down};
            for (size_t i = 0; i < 6; i++)
                if (ws[i]->data) op->weight_free(be, ws[i]);
            float *fs[] = {L->bq,  L->bk,    L->bv,    L->bo,    L->b_up,
                           L->b_down, L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b};
            for (size_t i = 0; i < 10; i++) op->free(be, fs[i]);
        }
        free(v->layers);
    }
    if (v->patch.data) op->weight_free(be, &v->patch);
    if (v->proj.data) op->weight_free(be, &v->proj);
    float *fs[] = {v->patch_b, v->pos, v->post_w, v->post_b, v->soft_norm, v->x,  v->xn,
                   v->q,       v->k,   v->v,      v->att,    v->ff,        v->mrg, v->out};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) op->free(be, fs[i]);
    free(v->proj_t);
    free(v->cols);
    free(v->idx);
    free(v->wts);
    free(v->order);
    if (v->g) zi_gguf_close(v->g);
    free(v);
}
