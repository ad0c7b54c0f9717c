/*
 * wavtokenizer.c - the WavTokenizer speech codec decoder (see
 * wavtokenizer.h): loading and one sequence's decode.
 */
#include "wavtokenizer.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "weights.h"

#define ARCH "wavtokenizer-dec"
#define POSNET_MAX 6   /* llama.cpp's posnet has six fixed slots */
#define MAX_WIDTH 1024 /* the attention block's one head (span_attention's limit) */

/* One posnet layer: a resnet block (norms 0, 1; convs 0, 1), the attention
 * block (norm 0; convs q, k, v, o) or the final norm (norm 0). */
typedef struct wt_posnet {
    float *nw[2], *nb[2];
    float *cw[4], *cb[4];
} wt_posnet;

typedef struct wt_convnext {
    float *dw, *dw_b, *ln_w, *ln_b, *pw1, *pw1_b, *pw2, *pw2_b; /* pw2: gamma folded in */
} wt_convnext;

struct zi_wavtok {
    zi_wavtok_config c;
    zi_backend *be;
    zi_gguf *g; /* kept open: the embedding table may point into its mapping */
    zi_weight tok;
    float *conv_w, *conv_b;
    wt_posnet pos[POSNET_MAX];
    float *tn_w, *tn_b; /* token_embd_norm */
    wt_convnext *cnx;
    float *on_w, *on_b; /* output_norm */
    float *out_w, *out_b;
};

/* ---- loading ---- */

static int get_int(const zi_gguf *g, const char *key, int lo, int hi, int *out, zi_error *err) {
    char k[128];
    snprintf(k, sizeof k, ARCH ".%s", key);
    uint32_t v;
    int rc = zi_gguf_get_u32(g, k, &v, err);
    if (rc) return rc;
    if ((int64_t)v < lo || (int64_t)v > hi)
        return zi_error_set(err, ZI_EFORMAT, "key %s is %u, expected %d..%d", k, v, lo, hi);
    *out = (int)v;
    return ZI_OK;
}

static int get_eps(const zi_gguf *g, const char *key, float *out, zi_error *err) {
    char k[128];
    snprintf(k, sizeof k, ARCH ".%s", key);
    int rc = zi_gguf_get_f32(g, k, out, err);
    if (!rc && !(*out > 0.0f && *out < 1.0f))
        return zi_error_set(err, ZI_EFORMAT, "key %s is %g, expected a small positive number", k,
                            (double)*out);
    return rc;
}

static int read_config(const zi_gguf *g, zi_wavtok_config *c, zi_error *err) {
    zi_str s;
    int rc = zi_gguf_get_str(g, "general.architecture", &s, err);
    if (rc) return rc;
    if (s.len != strlen(ARCH) || memcmp(s.ptr, ARCH, s.len))
        return zi_error_set(err, ZI_EFORMAT,
                            "general.architecture is '%.*s': not a speech codec decoder (" ARCH ")",
                            (int)s.len, s.ptr);
    int cnx_embd = 0;
    if ((rc = get_int(g, "features_length", 1, 65536, &c->n_features, err)) ||
        (rc = get_int(g, "embedding_length", 6, 2 * 4096 + 2, &c->n_out, err)) ||
        (rc = get_int(g, "posnet.embedding_length", 1, MAX_WIDTH, &c->n_embd, err)) ||
        (rc = get_int(g, "posnet.block_count", 0, POSNET_MAX, &c->posnet_layers, err)) ||
        (rc = get_int(g, "convnext.embedding_length", 1, MAX_WIDTH, &cnx_embd, err)) ||
        (rc = get_int(g, "convnext.block_count", 0, 1024, &c->convnext_layers, err)) ||
        (rc = get_int(g, "feed_forward_length", 1, 1 << 20, &c->n_ff, err)) ||
        (rc = get_int(g, "attention.group_norm_groups", 1, MAX_WIDTH, &c->groups, err)) ||
        (rc = get_eps(g, "attention.group_norm_epsilon", &c->group_eps, err)) ||
        (rc = get_eps(g, "attention.layer_norm_epsilon", &c->norm_eps, err)))
        return rc;
    if (cnx_embd != c->n_embd)
        return zi_error_set(err, ZI_EFORMAT,
                            "key " ARCH
                            ".convnext.embedding_length is %d, expected the posnet's %d",
                            cnx_embd, c->n_embd);
    if (c->n_embd % c->groups)
        return zi_error_set(err, ZI_EFORMAT,
                            "key " ARCH ".attention.group_norm_groups (%d) does not divide the "
                            "width %d",
                            c->groups, c->n_embd);
    if (c->n_out % 2)
        return zi_error_set(err, ZI_EFORMAT,
                            "key " ARCH ".embedding_length is %d: n_fft + 2 must be even",
                            c->n_out);
    c->n_fft = c->n_out - 2;
    c->hop = c->n_fft / 4;
    c->sample_rate = 24000;
    return ZI_OK;
}

/* The tensor name with exactly these dims (ne[0] first; dims past n_dims
 * and the file's past its n_dims count as 1). */
static const zi_gguf_tensor *find_shaped(const zi_gguf *g, const char *name, int n_dims,
                                         const int64_t *ne, zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) {
        zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
        return NULL;
    }
    for (int i = 0; i < ZI_GGUF_MAX_DIMS; i++) {
        const int64_t want = i < n_dims ? ne[i] : 1, got = i < (int)t->n_dims ? t->ne[i] : 1;
        if (want != got) {
            zi_error_set(err, ZI_EFORMAT,
                         "tensor '%s' has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                         name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                         (long long)ne[0], (long long)(n_dims > 1 ? ne[1] : 1),
                         (long long)(n_dims > 2 ? ne[2] : 1));
            return NULL;
        }
    }
    return t;
}

/* host (n floats, taken) into backend memory at *out. */
static int to_backend(zi_wavtok *w, float *host, size_t n, float **out, zi_error *err) {
    *out = w->be->ops->alloc(w->be, n * sizeof(float));
    if (*out) w->be->ops->upload(w->be, *out, host, n * sizeof(float));
    free(host);
    return *out ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory for the decoder's weights");
}

/* A tensor of the given shape as float32 host memory (*out malloc'd). */
static int load_host(zi_wavtok *w, const char *name, int n_dims, const int64_t *ne, float **out,
                     zi_error *err) {
    const zi_gguf_tensor *t = find_shaped(w->g, name, n_dims, ne, err);
    if (!t) return err->code;
    *out = zi_vector_dequantize(t, err);
    return *out ? ZI_OK : err->code;
}

/* A vector (of ne {n} or {1, n} as llama.cpp reads it) into backend memory. */
static int load_vec(zi_wavtok *w, const char *name, int64_t n, int two_d, float **out,
                    zi_error *err) {
    const int64_t ne2[2] = {1, n}, ne1[1] = {n};
    float *h;
    int rc = two_d ? load_host(w, name, 2, ne2, &h, err) : load_host(w, name, 1, ne1, &h, err);
    return rc ? rc : to_backend(w, h, (size_t)n, out, err);
}

/* A convolution [K, cin, cout] (the file's w[o][i][j]) laid taps first,
 * [K][cout][cin] (backend.h's conv1d), with its bias [1, cout]. */
static int load_conv(zi_wavtok *w, const char *base, int K, int cin, int cout, float **wt,
                     float **bias, zi_error *err) {
    char name[96];
    snprintf(name, sizeof name, "%s.weight", base);
    const int64_t ne[3] = {K, cin, cout};
    float *h, *r;
    int rc = load_host(w, name, 3, ne, &h, err);
    if (rc) return rc;
    if (!(r = malloc((size_t)K * cin * cout * sizeof(float)))) {
        free(h);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for tensor '%s'", name);
    }
    for (int o = 0; o < cout; o++)
        for (int i = 0; i < cin; i++)
            for (int j = 0; j < K; j++)
                r[((size_t)j * cout + o) * cin + i] = h[((size_t)o * cin + i) * K + j];
    free(h);
    if ((rc = to_backend(w, r, (size_t)K * cin * cout, wt, err))) return rc;
    snprintf(name, sizeof name, "%s.bias", base);
    return load_vec(w, name, cout, 1, bias, err);
}

static int load_posnet(zi_wavtok *w, int i, zi_error *err) {
    const int C = w->c.n_embd;
    wt_posnet *p = &w->pos[i];
    char name[96], base[64];
    int rc;
    if (i == 0 || i == 1 || i == 3 || i == 4) {
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "posnet.%d.norm%d.weight", i, k + 1);
            if ((rc = load_vec(w, name, C, 1, &p->nw[k], err))) return rc;
            snprintf(name, sizeof name, "posnet.%d.norm%d.bias", i, k + 1);
            if ((rc = load_vec(w, name, C, 1, &p->nb[k], err))) return rc;
            snprintf(base, sizeof base, "posnet.%d.conv%d", i, k + 1);
            if ((rc = load_conv(w, base, 3, C, C, &p->cw[k], &p->cb[k], err))) return rc;
        }
        return ZI_OK;
    }
    /* 2: the attention block; 5: the final norm (both named attn_norm) */
    snprintf(name, sizeof name, "posnet.%d.attn_norm.weight", i);
    if ((rc = load_vec(w, name, C, 1, &p->nw[0], err))) return rc;
    snprintf(name, sizeof name, "posnet.%d.attn_norm.bias", i);
    if ((rc = load_vec(w, name, C, 1, &p->nb[0], err))) return rc;
    if (i == 5) return ZI_OK;
    static const char *const qkvo[4] = {"attn_q", "attn_k", "attn_v", "attn_output"};
    for (int k = 0; k < 4; k++) {
        snprintf(base, sizeof base, "posnet.%d.%s", i, qkvo[k]);
        if ((rc = load_conv(w, base, 1, C, C, &p->cw[k], &p->cb[k], err))) return rc;
    }
    return ZI_OK;
}

static int load_convnext(zi_wavtok *w, int i, zi_error *err) {
    const int C = w->c.n_embd, FF = w->c.n_ff;
    wt_convnext *L = &w->cnx[i];
    char name[96];
    int rc;
    float *h, *pw2, *pb2, *gamma;
    const int64_t dwne[3] = {7, 1, C}, pw1ne[2] = {C, FF}, pw2ne[2] = {FF, C}, vne[1] = {C};
    snprintf(name, sizeof name, "convnext.%d.dw.weight", i);
    if ((rc = load_host(w, name, 3, dwne, &h, err)) ||
        (rc = to_backend(w, h, (size_t)7 * C, &L->dw, err)))
        return rc;
    snprintf(name, sizeof name, "convnext.%d.dw.bias", i);
    if ((rc = load_vec(w, name, C, 1, &L->dw_b, err))) return rc;
    snprintf(name, sizeof name, "convnext.%d.norm.weight", i);
    if ((rc = load_vec(w, name, C, 0, &L->ln_w, err))) return rc;
    snprintf(name, sizeof name, "convnext.%d.norm.bias", i);
    if ((rc = load_vec(w, name, C, 0, &L->ln_b, err))) return rc;
    snprintf(name, sizeof name, "convnext.%d.pw1.weight", i);
    if ((rc = load_host(w, name, 2, pw1ne, &h, err)) ||
        (rc = to_backend(w, h, (size_t)FF * C, &L->pw1, err)))
        return rc;
    snprintf(name, sizeof name, "convnext.%d.pw1.bias", i);
    if ((rc = load_vec(w, name, FF, 0, &L->pw1_b, err))) return rc;
    /* gamma * (pw2 h + b) = (gamma pw2) h + gamma b: the scale folded in */
    snprintf(name, sizeof name, "convnext.%d.gamma.weight", i);
    if ((rc = load_host(w, name, 1, vne, &gamma, err))) return rc;
    snprintf(name, sizeof name, "convnext.%d.pw2.weight", i);
    if ((rc = load_host(w, name, 2, pw2ne, &pw2, err))) {
        free(gamma);
        return rc;
    }
    snprintf(name, sizeof name, "convnext.%d.pw2.bias", i);
    if ((rc = load_host(w, name, 1, vne, &pb2, err))) {
        free(gamma);
        free(pw2);
        return rc;
    }
    for (int o = 0; o < C; o++) {
        for (int k = 0; k < FF; k++) pw2[(size_t)o * FF + k] *= gamma[o];
        pb2[o] *= gamma[o];
    }
    free(gamma);
    if ((rc = to_backend(w, pw2, (size_t)C * FF, &L->pw2, err))) {
        free(pb2);
        return rc;
    }
    return to_backend(w, pb2, (size_t)C, &L->pw2_b, err);
}

static int load_all(zi_wavtok *w, zi_error *err) {
    zi_wavtok_config *c = &w->c;
    zi_backend *be = w->be;
    const int C = c->n_embd;
    int rc;
    const zi_gguf_tensor *t = zi_gguf_find_tensor(w->g, "token_embd.weight");
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor 'token_embd.weight'");
    uint32_t nv = 0;
    if ((rc = zi_gguf_get_u32_or(w->g, ARCH ".vocab_size", (uint32_t)t->ne[1], &nv, err)))
        return rc;
    const int64_t tne[2] = {c->n_features, nv};
    if (!(t = find_shaped(w->g, "token_embd.weight", 2, tne, err))) return err->code;
    if (nv < 1 || nv > (1u << 24))
        return zi_error_set(err, ZI_EFORMAT, "key " ARCH ".vocab_size is %u", nv);
    c->n_vocab = (int)nv;
    if ((rc = be->ops->weight_init(be, &w->tok, t, err))) return rc;
    if ((rc = load_conv(w, "conv1d", 7, c->n_features, C, &w->conv_w, &w->conv_b, err))) return rc;
    for (int i = 0; i < c->posnet_layers; i++)
        if ((rc = load_posnet(w, i, err))) return rc;
    if ((rc = load_vec(w, "token_embd_norm.weight", C, 0, &w->tn_w, err)) ||
        (rc = load_vec(w, "token_embd_norm.bias", C, 0, &w->tn_b, err)))
        return rc;
    if (c->convnext_layers && !(w->cnx = calloc((size_t)c->convnext_layers, sizeof *w->cnx)))
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (int i = 0; i < c->convnext_layers; i++)
        if ((rc = load_convnext(w, i, err))) return rc;
    if ((rc = load_vec(w, "output_norm.weight", C, 0, &w->on_w, err)) ||
        (rc = load_vec(w, "output_norm.bias", C, 0, &w->on_b, err)))
        return rc;
    const int64_t one_ne[2] = {C, c->n_out};
    float *h;
    if ((rc = load_host(w, "output.weight", 2, one_ne, &h, err)) ||
        (rc = to_backend(w, h, (size_t)C * c->n_out, &w->out_w, err)))
        return rc;
    return load_vec(w, "output.bias", c->n_out, 0, &w->out_b, err);
}

/* The first op the decoder needs that be lacks, or NULL. */
static const char *missing_op(const zi_backend_ops *op) {
    if (!op->conv1d) return "conv1d";
    if (!op->conv1d_dw) return "conv1d_dw";
    if (!op->group_norm) return "group_norm";
    if (!op->istft) return "istft";
    if (!op->layernorm) return "layernorm";
    if (!op->gelu) return "gelu";
    if (!op->silu) return "silu";
    if (!op->span_attention) return "span_attention";
    if (!op->get_rows || !op->add) return "get_rows";
    return NULL;
}

int zi_wavtok_load(const char *path, zi_backend *be, zi_wavtok **out, zi_error *err) {
    *out = NULL;
    const char *miss = missing_op(be->ops);
    if (miss)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "the %s backend has no %s op, which the speech codec decoder needs "
                            "(it runs on the cpu backend)",
                            be->ops->name, miss);
    zi_wavtok *w = calloc(1, sizeof *w);
    if (!w) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    w->be = be;
    int rc = zi_gguf_open(path, &w->g, err);
    if (!rc) rc = read_config(w->g, &w->c, err);
    if (!rc && w->c.n_fft > 4096)
        rc = zi_error_set(err, ZI_EFORMAT,
                          "key " ARCH ".embedding_length is %d: n_fft %d is over 4096", w->c.n_out,
                          w->c.n_fft);
    if (!rc) rc = load_all(w, err);
    if (rc) {
        zi_error_prefix(err, "%s", path);
        zi_wavtok_free(w);
        return rc;
    }
    *out = w;
    return ZI_OK;
}

const zi_wavtok_config *zi_wavtok_get_config(const zi_wavtok *w) {
    return &w->c;
}

static void fr(zi_backend *be, void *p) {
    if (p) be->ops->free(be, p);
}

void zi_wavtok_free(zi_wavtok *w) {
    if (!w) return;
    zi_backend *be = w->be;
    if (w->tok.rows) be->ops->weight_free(be, &w->tok);
    fr(be, w->conv_w), fr(be, w->conv_b);
    for (int i = 0; i < POSNET_MAX; i++) {
        wt_posnet *p = &w->pos[i];
        for (int k = 0; k < 2; k++) fr(be, p->nw[k]), fr(be, p->nb[k]);
        for (int k = 0; k < 4; k++) fr(be, p->cw[k]), fr(be, p->cb[k]);
    }
    fr(be, w->tn_w), fr(be, w->tn_b);
    for (int i = 0; w->cnx && i < w->c.convnext_layers; i++) {
        wt_convnext *L = &w->cnx[i];
        fr(be, L->dw), fr(be, L->dw_b), fr(be, L->ln_w), fr(be, L->ln_b);
        fr(be, L->pw1), fr(be, L->pw1_b), fr(be, L->pw2), fr(be, L->pw2_b);
    }
    free(w->cnx);
    fr(be, w->on_w), fr(be, w->on_b), fr(be, w->out_w), fr(be, w->out_b);
    zi_gguf_close(w->g);
    free(w);
}

/* ---- decoding ---- */

int zi_wavtok_decode(zi_wavtok *w, const int32_t *codes, int n, float *spec, float *audio,
                     zi_error *err) {
    const zi_wavtok_config *c = &w->c;
    zi_backend *be = w->be;
    const zi_backend_ops *op = be->ops;
    if (n < 1) return zi_error_set(err, ZI_EINVAL, "no codes to decode");
    if ((int64_t)n * c->n_out > INT32_MAX || (int64_t)n * c->n_ff > INT32_MAX)
        return zi_error_set(err, ZI_ERANGE, "%d codes are too many to decode at once", n);
    for (int i = 0; i < n; i++)
        if (codes[i] < 0 || codes[i] >= c->n_vocab)
            return zi_error_set(err, ZI_EINVAL,
                                "code %d at position %d is out of range (the decoder has codes "
                                "0..%d)",
                                (int)codes[i], i, c->n_vocab - 1);
    const int F = c->n_features, C = c->n_embd, FF = c->n_ff, NO = c->n_out;
    const size_t nz = (size_t)n;
    /* buffers (backend memory): emb, x, h, h2, q, k, v, ff, spec, frames, audio */
    const size_t sizes[11] = {nz * F, nz * C,  nz * C,  nz * C,        nz * C,     nz * C,
                              nz * C, nz * FF, nz * NO, nz * c->n_fft, nz * c->hop};
    float *b[11] = {0};
    int32_t *order = malloc(nz * sizeof *order);
    int rc = order ? ZI_OK : zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (int i = 0; !rc && i < 11; i++)
        if (!(b[i] = op->alloc(be, sizes[i] * sizeof(float))))
            rc = zi_error_set(err, ZI_ENOMEM, "out of memory decoding %d codes", n);
    if (rc) goto done;
    float *emb = b[0], *x = b[1], *h = b[2], *h2 = b[3], *q = b[4], *k = b[5], *v = b[6],
          *ff = b[7], *sp = b[8], *frames = b[9], *au = b[10];
    for (int i = 0; i < n; i++) order[i] = i;
    op->get_rows(be, emb, &w->tok, codes, n);
    op->conv1d(be, x, emb, w->conv_w, w->conv_b, n, F, C, 7);
    for (int i = 0; i < c->posnet_layers; i++) {
        const wt_posnet *p = &w->pos[i];
        if (i == 0 || i == 1 || i == 3 || i == 4) {
            op->group_norm(be, h, x, p->nw[0], p->nb[0], n, C, c->groups, c->group_eps);
            op->silu(be, h, nz * C);
            op->conv1d(be, h2, h, p->cw[0], p->cb[0], n, C, C, 3);
            op->group_norm(be, h2, h2, p->nw[1], p->nb[1], n, C, c->groups, c->group_eps);
            op->silu(be, h2, nz * C);
            op->conv1d(be, h, h2, p->cw[1], p->cb[1], n, C, C, 3);
            op->add(be, x, h, nz * C);
        } else if (i == 2) {
            op->group_norm(be, h, x, p->nw[0], p->nb[0], n, C, c->groups, c->group_eps);
            op->conv1d(be, q, h, p->cw[0], p->cb[0], n, C, C, 1);
            op->conv1d(be, k, h, p->cw[1], p->cb[1], n, C, C, 1);
            op->conv1d(be, v, h, p->cw[2], p->cb[2], n, C, C, 1);
            const zi_attn_shape s = {.n_heads = 1,
                                     .n_kv_heads = 1,
                                     .head_dim = C,
                                     .block_size = 1,
                                     .max_ctx = n,
                                     .scale = (float)(1.0 / sqrt((double)C))};
            const int32_t starts[2] = {0, n};
            op->span_attention(be, h2, q, k, v, order, starts, 1, &s);
            op->conv1d(be, h, h2, p->cw[3], p->cb[3], n, C, C, 1);
            op->add(be, x, h, nz * C);
        } else {
            op->group_norm(be, x, x, p->nw[0], p->nb[0], n, C, c->groups, c->group_eps);
        }
    }
    op->layernorm(be, x, x, w->tn_w, w->tn_b, n, C, c->norm_eps);
    for (int i = 0; i < c->convnext_layers; i++) {
        const wt_convnext *L = &w->cnx[i];
        op->conv1d_dw(be, h, x, L->dw, L->dw_b, n, C, 7);
        op->layernorm(be, h, h, L->ln_w, L->ln_b, n, C, c->norm_eps);
        op->conv1d(be, ff, h, L->pw1, L->pw1_b, n, C, FF, 1);
        op->gelu(be, ff, nz * FF);
        op->conv1d(be, h, ff, L->pw2, L->pw2_b, n, FF, C, 1);
        op->add(be, x, h, nz * C);
    }
    op->layernorm(be, h, x, w->on_w, w->on_b, n, C, c->norm_eps);
    op->conv1d(be, sp, h, w->out_w, w->out_b, n, C, NO, 1);
    if (audio) op->istft(be, au, sp, frames, n, c->n_fft, c->hop);
    if ((rc = op->sync(be, err))) goto done;
    if (spec) op->download(be, spec, sp, nz * NO * sizeof(float));
    if (audio) op->download(be, audio, au, nz * c->hop * sizeof(float));
done:
    for (int i = 0; i < 11; i++)
        if (b[i]) op->free(be, b[i]);
    free(order);
    return rc;
}
