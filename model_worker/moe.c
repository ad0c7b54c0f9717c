/*
 * moe.c - the mixture-of-experts feed-forward block (see moe.h).
 *
 * Routing follows llama.cpp's build_moe_ffn (src/llama-graph.cpp) for the
 * gating functions zinfer's families use; the products are the backend's.
 */
#include "moe.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest expert count accepted: real files have 8..512 (Qwen3: 128,
 * DeepSeek/Kimi: 256..384); the bound keeps every size product small. */
#define ZI_MOE_MAX_EXPERTS 1024

struct zi_moe_scratch {
    int cap;   /* tokens the buffers hold */
    int k_cap; /* rows per token they hold (n_expert_used + a shared expert) */
    int e_cap; /* experts the host arrays hold */
    /* host memory */
    float *host_logits;     /* [cap][n_expert], when the backend's memory is not the host's */
    int32_t *ids;           /* [cap][k]: the chosen experts, llama.cpp's order */
    float *w;               /* [cap][k_cap]: their weights (then the shared gate) */
    int32_t *slot;          /* [cap][k_cap]: the row of y holding each */
    int32_t *src;           /* [cap * k]: the token of each grouped row */
    int32_t *count, *first; /* [e_cap]: rows per expert and where they start */
    float *sh_logit;        /* [cap]: the shared expert's gate logits, on the host */
    /* [2 * e_cap]: grouped_experts' products: outputs, weights, rows */
    float **gu_out;
    const zi_weight **gu_w;
    int32_t *gu_first, *gu_count;
    /* backend memory */
    float *logits;  /* [cap][n_expert] */
    float *xg;      /* [cap * k][dim]: the input rows grouped by expert */
    float *g, *u;   /* [cap * k_cap][ffn]: gate and up (the shared expert's too) */
    float *y;       /* [cap * k_cap][dim]: the experts' outputs, then the shared one's */
    float *sh_gate; /* [cap]: the shared expert's gate logits */
};

/* ---- loading ---- */

int zi_moe_read_params(const zi_gguf *g, const char *arch, int ffn_dim, int ffn_default, int norm,
                       int shared, zi_moe_params *p, zi_error *err) {
    char key[128];
    uint32_t v;
    int rc;
    memset(p, 0, sizeof *p);
    snprintf(key, sizeof key, "%s.expert_count", arch);
    if ((rc = zi_gguf_get_u32(g, key, &v, err))) return rc;
    if (v < 1 || v > ZI_MOE_MAX_EXPERTS)
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range (1..%d)", key, v,
                            ZI_MOE_MAX_EXPERTS);
    p->n_expert = (int)v;
    snprintf(key, sizeof key, "%s.expert_used_count", arch);
    if ((rc = zi_gguf_get_u32(g, key, &v, err))) return rc;
    if (v < 1 || v > (uint32_t)p->n_expert)
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range (1..expert_count %d)", key, v,
                            p->n_expert);
    p->n_expert_used = (int)v;
    snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
    if ((rc = zi_gguf_get_u32_or(
             g, key, (uint32_t)(ffn_default ? ffn_default : ffn_dim / p->n_expert_used), &v, err)))
        return rc;
    if (v < 1 && !zi_gguf_find_kv(g, key)) /* derived: feed_forward_length / used */
        return zi_error_set(err, ZI_EFORMAT,
                            "%s is absent and %s.feed_forward_length %d / expert_used_count %d "
                            "is 0",
                            key, arch, ffn_dim, p->n_expert_used);
    if (v < 1 || v > (1u << 20))
        return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", key, v);
    p->ffn_dim = (int)v;
    if (shared) {
        snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
        if ((rc = zi_gguf_get_u32_or(g, key, (uint32_t)ffn_dim, &v, err))) return rc;
        if (v < 1 || v > (1u << 20))
            return zi_error_set(err, ZI_EFORMAT, "%s = %u is out of range", key, v);
        p->shared_ffn_dim = (int)v;
    }
    snprintf(key, sizeof key, "%s.expert_weights_norm", arch);
    if ((rc = zi_gguf_get_bool_or(g, key, norm, &p->norm, err))) return rc;
    /* expert_weights_scale is not read: llama.cpp reads it only for the
     * families that use it (deepseek, glm4-moe, ...), none of zinfer's, and
     * a Mixtral file with the key runs unscaled there. */
    p->scale = 0.0f;
    p->gating = ZI_GATING_SOFTMAX;
    return ZI_OK;
}

/* A 2-D weight from the file, its shape checked: [cols] x [rows]. */
static int load_2d(const zi_gguf *g, zi_backend *be, const char *name, int64_t cols, int64_t rows,
                   zi_weight *w, uint64_t *bytes, zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
    const uint32_t want_dims = rows > 1 ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != cols || t->ne[1] != rows)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims,
                            (long long)cols, (long long)rows);
    zi_gguf_tensor two = *t;
    two.n_dims = 2; /* a router of one row (sh_inp) is a 1-D tensor in the file */
    int rc = be->ops->weight_init(be, w, &two, err);
    if (rc) return rc;
    if (w->owned) zi_gguf_drop_pages(g, &two);
    *bytes += w->data_bytes;
    return ZI_OK;
}

/* A bias of n x m floats (a vector when n is 1), shape-checked, in backend
 * memory. */
static int load_bias(const zi_gguf *g, zi_backend *be, const char *name, int64_t m, int64_t n,
                     float **out, zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != (n > 1 ? 2u : 1u) || t->ne[0] != m || t->ne[1] != n)
        return zi_error_set(
            err, ZI_EFORMAT, "tensor '%s' has shape [%lld, %lld] (%u dims), expected [%lld, %lld]",
            name, (long long)t->ne[0], (long long)t->ne[1], t->n_dims, (long long)m, (long long)n);
    *out = be->ops->vector_init(be, t, err);
    return *out ? ZI_OK : err && err->code ? err->code : ZI_ENOMEM;
}

/* The n_expert slices of the 3-D tensor name ([cols] x [rows] x [n]) as
 * weights of their own: slice e's rows are contiguous, whole blocks. */
static int load_experts(const zi_gguf *g, zi_backend *be, const char *name, int64_t cols,
                        int64_t rows, int n, zi_weight *all, zi_weight **out, uint64_t *bytes,
                        zi_error *err) {
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) return zi_error_set(err, ZI_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != 3 || t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != n)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%s' has shape [%lld, %lld, %lld] (%u dims), expected "
                            "[%lld, %lld, %d]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            t->n_dims, (long long)cols, (long long)rows, n);
    zi_weight *ws = calloc((size_t)n, sizeof *ws);
    if (!ws) return zi_error_set(err, ZI_ENOMEM, "out of memory for tensor '%s'", name);
    *out = ws;
    const uint64_t slice = t->nbytes / (uint64_t)n;
    /* One weight of n * rows rows, viewed per expert; where the backend
     * cannot split it at each expert (the CPU's 16-row layouts need rows a
     * multiple of 16, as every real file's are), each expert on its own
     * below. */
    if (be->ops->weight_view) {
        zi_gguf_tensor flat = *t;
        flat.n_dims = 2;
        flat.ne[1] = rows * n;
        flat.ne[2] = 1;
        int rc = be->ops->weight_init(be, all, &flat, err);
        if (rc) return rc;
        int e = 0;
        while (e < n &&
               be->ops->weight_view(be, all, (int64_t)e * rows, rows, &ws[e], NULL) == ZI_OK)
            e++;
        if (e == n) {
            if (all->owned) zi_gguf_drop_pages(g, &flat);
            *bytes += all->data_bytes;
            return ZI_OK;
        }
        memset(ws, 0, (size_t)n * sizeof *ws); /* views own nothing */
        be->ops->weight_free(be, all);
        memset(all, 0, sizeof *all);
    }
    for (int e = 0; e < n; e++) {
        zi_gguf_tensor part = *t;
        part.n_dims = 2;
        part.ne[2] = 1;
        part.offset += (uint64_t)e * slice;
        part.nbytes = slice;
        if (t->data) part.data = (const char *)t->data + (uint64_t)e * slice;
        int rc = be->ops->weight_init(be, &ws[e], &part, err);
        if (rc) {
            zi_error_prefix(err, "expert %d", e);
            return rc;
        }
        if (ws[e].owned) zi_gguf_drop_pages(g, &part);
        *bytes += ws[e].data_bytes;
    }
    return ZI_OK;
}

int zi_moe_load_layer(const zi_gguf *g, zi_backend *be, int l, int dim, const zi_moe_params *p,
                      zi_moe_layer *L, uint64_t *bytes, uint64_t *macs, zi_error *err) {
    char n[96];
    int rc;
    const int E = p->n_expert, ff = p->ffn_dim;
    uint64_t eb = 0;
#define ZI_NAME(suffix) (snprintf(n, sizeof n, "blk.%d." suffix, l), n)
    if ((rc = load_2d(g, be, ZI_NAME("ffn_gate_inp.weight"), dim, E, &L->router, bytes, err)) ||
        (rc = load_experts(g, be, ZI_NAME("ffn_gate_exps.weight"), dim, ff, E, &L->gate_all,
                           &L->gate, &eb, err)) ||
        (rc = load_experts(g, be, ZI_NAME("ffn_up_exps.weight"), dim, ff, E, &L->up_all, &L->up,
                           &eb, err)) ||
        (rc = load_experts(g, be, ZI_NAME("ffn_down_exps.weight"), ff, dim, E, &L->down_all,
                           &L->down, &eb, err)))
        return rc;
    *macs += (uint64_t)dim * (uint64_t)E + 3u * (uint64_t)dim * (uint64_t)ff * p->n_expert_used;
    if (p->oai && ((rc = load_bias(g, be, ZI_NAME("ffn_gate_inp.bias"), E, 1, &L->router_b, err)) ||
                   (rc = load_bias(g, be, ZI_NAME("ffn_gate_exps.bias"), ff, E, &L->b_gate, err)) ||
                   (rc = load_bias(g, be, ZI_NAME("ffn_up_exps.bias"), ff, E, &L->b_up, err)) ||
                   (rc = load_bias(g, be, ZI_NAME("ffn_down_exps.bias"), dim, E, &L->b_down, err))))
        return rc;
    if (p->shared_ffn_dim) {
        const int sf = p->shared_ffn_dim;
        if ((rc = load_2d(g, be, ZI_NAME("ffn_gate_inp_shexp.weight"), dim, 1, &L->sh_inp, bytes,
                          err)) ||
            (rc = load_2d(g, be, ZI_NAME("ffn_gate_shexp.weight"), dim, sf, &L->sh_gate, bytes,
                          err)) ||
            (rc = load_2d(g, be, ZI_NAME("ffn_up_shexp.weight"), dim, sf, &L->sh_up, bytes, err)) ||
            (rc = load_2d(g, be, ZI_NAME("ffn_down_shexp.weight"), sf, dim, &L->sh_down, bytes,
                          err)))
            return rc;
        *macs += (uint64_t)dim + 3u * (uint64_t)dim * (uint64_t)sf;
    }
#undef ZI_NAME
    L->expert_bytes = eb;
    *bytes += eb;
    return ZI_OK;
}

void zi_moe_free_layer(zi_backend *be, const zi_moe_params *p, zi_moe_layer *L) {
    zi_weight *sets[] = {L->gate, L->up, L->down};
    for (int s = 0; s < 3; s++) {
        for (int e = 0; sets[s] && e < p->n_expert; e++) be->ops->weight_free(be, &sets[s][e]);
        free(sets[s]);
    }
    zi_weight *ws[] = {&L->router, &L->sh_gate,  &L->sh_up,  &L->sh_down,
                       &L->sh_inp, &L->gate_all, &L->up_all, &L->down_all};
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) be->ops->weight_free(be, ws[i]);
    float *bs[] = {L->router_b, L->b_gate, L->b_up, L->b_down};
    for (size_t i = 0; i < sizeof bs / sizeof bs[0]; i++) be->ops->free(be, bs[i]);
    memset(L, 0, sizeof *L);
}

/* ---- routing ---- */

void zi_moe_route(const zi_moe_params *p, const float *logits, int n, int32_t *ids, float *w) {
    const int E = p->n_expert, k = p->n_expert_used;
    double prob[ZI_MOE_MAX_EXPERTS];
    for (int t = 0; t < n; t++) {
        const float *z = logits + (size_t)t * E;
        int32_t *id = ids + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        /* The selection score: the softmax (monotonic in the logits, so
         * the same experts either way; the probabilities are the weights
         * under ZI_GATING_SOFTMAX). */
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
        for (int e = 0; e < E; e++) sum += prob[e] = exp((double)z[e] - mx);
        /* Top k by selection sort: k is small (2..8 of up to 128). */
        double chosen[ZI_MOE_MAX_EXPERTS];
        unsigned char taken[ZI_MOE_MAX_EXPERTS] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || z[e] > z[best])) best = e;
            taken[best] = 1;
            id[j] = best;
            chosen[j] = p->gating == ZI_GATING_SOFTMAX ? prob[best] / sum : (double)z[best];
        }
        if (p->gating == ZI_GATING_SOFTMAX_WEIGHT) { /* softmax over the chosen logits */
            double m = chosen[0], s = 0.0;
            for (int j = 0; j < k; j++) s += chosen[j] = exp(chosen[j] - m);
            for (int j = 0; j < k; j++) chosen[j] /= s;
        }
        if (p->norm) { /* llama.cpp clamps the sum at float16's smallest normal */
            double s = 0.0;
            for (int j = 0; j < k; j++) s += chosen[j];
            if (s < 6.103515625e-5) s = 6.103515625e-5;
            for (int j = 0; j < k; j++) chosen[j] /= s;
        }
        const double scale = p->scale != 0.0f && p->scale != 1.0f ? p->scale : 1.0;
        for (int j = 0; j < k; j++) wt[j] = (float)(chosen[j] * scale);
    }
}

/* ---- the pass ---- */

uint64_t zi_moe_work_bytes(const zi_moe_params *p, int T, int dim) {
    const uint64_t t = (uint64_t)(T > 0 ? T : 1), k = (uint64_t)p->n_expert_used;
    const uint64_t kk = k + (p->shared_ffn_dim ? 1 : 0);
    const uint64_t ff = (uint64_t)(p->ffn_dim > p->shared_ffn_dim ? p->ffn_dim : p->shared_ffn_dim);
    const uint64_t E = (uint64_t)p->n_expert;
    /* scratch_grow's arrays: logits (and their host copy), w, xg, g, u, y,
     * the shared gate and its host copy; ids, slot, src, count, first,
     * gu_first, gu_count; gu_out and gu_w */
    const uint64_t floats = t * E * 2 + t * kk + t * k * (uint64_t)dim + t * kk * ff * 2 +
                            t * kk * (uint64_t)dim + t * 2;
    const uint64_t ints = t * k + t * kk + t * k + E * 2 + E * 4;
    return floats * sizeof(float) + ints * sizeof(int32_t) + E * 4 * sizeof(void *);
}

void zi_moe_scratch_free(zi_backend *be, zi_moe_scratch *s) {
    if (!s) return;
    free(s->host_logits);
    free(s->ids);
    free(s->w);
    free(s->slot);
    free(s->src);
    free(s->count);
    free(s->first);
    free(s->sh_logit);
    free(s->gu_out);
    free((void *)s->gu_w);
    free(s->gu_first);
    free(s->gu_count);
    float *dev[] = {s->logits, s->xg, s->g, s->u, s->y, s->sh_gate};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->ops->free(be, dev[i]);
    free(s);
}

static int scratch_grow(zi_moe_scratch **sp, zi_backend *be, const zi_moe_params *p, int T, int dim,
                        zi_error *err) {
    zi_moe_scratch *s = *sp;
    const int k = p->n_expert_used, kk = k + (p->shared_ffn_dim ? 1 : 0);
    if (s && s->cap >= T && s->k_cap >= kk && s->e_cap >= p->n_expert) return ZI_OK;
    zi_moe_scratch_free(be, s);
    *sp = s = calloc(1, sizeof *s);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "out of memory for the experts' buffers");
    const size_t t = (size_t)T, E = (size_t)p->n_expert;
    const size_t ff = (size_t)(p->ffn_dim > p->shared_ffn_dim ? p->ffn_dim : p->shared_ffn_dim);
    s->host_logits = be->host_memory ? NULL : malloc(t * E * sizeof(float));
    s->ids = malloc(t * (size_t)k * sizeof(int32_t));
    s->w = malloc(t * (size_t)kk * sizeof(float));
    s->slot = malloc(t * (size_t)kk * sizeof(int32_t));
    s->src = malloc(t * (size_t)k * sizeof(int32_t));
    s->count = malloc(E * sizeof(int32_t));
    s->first = malloc(E * sizeof(int32_t));
    s->sh_logit = malloc(t * sizeof(float));
    s->gu_out = malloc(2 * E * sizeof *s->gu_out);
    s->gu_w = malloc(2 * E * sizeof *s->gu_w);
    s->gu_first = malloc(2 * E * sizeof *s->gu_first);
    s->gu_count = malloc(2 * E * sizeof *s->gu_count);
    s->logits = be->ops->alloc(be, t * E * sizeof(float));
    s->xg = be->ops->alloc(be, t * (size_t)k * (size_t)dim * sizeof(float));
    s->g = be->ops->alloc(be, t * (size_t)kk * ff * sizeof(float));
    s->u = be->ops->alloc(be, t * (size_t)kk * ff * sizeof(float));
    s->y = be->ops->alloc(be, t * (size_t)kk * (size_t)dim * sizeof(float));
    s->sh_gate = be->ops->alloc(be, t * sizeof(float));
    if ((!be->host_memory && !s->host_logits) || !s->ids || !s->w || !s->slot || !s->src ||
        !s->count || !s->first || !s->sh_logit || !s->gu_out || !s->gu_w || !s->gu_first ||
        !s->gu_count || !s->logits || !s->xg || !s->g || !s->u || !s->y || !s->sh_gate) {
        zi_moe_scratch_free(be, s);
        *sp = NULL;
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the experts of %d tokens", T);
    }
    s->cap = T;
    s->k_cap = kk;
    s->e_cap = p->n_expert;
    return ZI_OK;
}

/* The experts' activation: SwiGLU, or gpt-oss's clamped one. */
static void expert_act(zi_backend *be, const zi_moe_params *p, float *g, const float *u, size_t n) {
    if (p->oai)
        be->ops->swiglu_oai(be, g, g, u, n, ZI_MOE_OAI_ALPHA, ZI_MOE_OAI_LIMIT);
    else
        be->ops->swiglu(be, g, g, u, n);
}

/* Every chosen expert's products of the pass as two jobs (matmul_groups):
 * gate and up of all of them over their rows of xg, then down over their
 * rows of g; one activation over all rows between. Two pool jobs and two
 * quantizations a layer instead of two per expert: per-expert jobs are
 * short (a prompt's expert has ~T*k/n_expert tokens, a decode step's one),
 * and each ended at a barrier and started streaming its weights cold. */
static void grouped_experts(zi_moe_scratch *s, zi_backend *be, const zi_moe_params *p,
                            const zi_moe_layer *L, int T, int E, int dim) {
    const zi_backend_ops *op = be->ops;
    const int ff = p->ffn_dim, rows = T * p->n_expert_used;
    int m = 0;
    for (int e = 0; e < E; e++) {
        if (s->count[e] == 0) continue;
        const size_t r0 = (size_t)s->first[e];
        s->gu_first[m] = s->gu_first[m + 1] = s->first[e];
        s->gu_count[m] = s->gu_count[m + 1] = s->count[e];
        s->gu_out[m] = s->g + r0 * ff, s->gu_w[m++] = &L->gate[e];
        s->gu_out[m] = s->u + r0 * ff, s->gu_w[m++] = &L->up[e];
    }
    op->matmul_groups(be, m, s->gu_out, s->gu_w, s->xg, rows, s->gu_first, s->gu_count);
    if (p->oai)
        for (int e = 0; e < E; e++) {
            if (s->count[e] == 0) continue;
            const size_t r0 = (size_t)s->first[e];
            op->add_bias(be, s->g + r0 * ff, L->b_gate + (size_t)e * ff, s->count[e], ff);
            op->add_bias(be, s->u + r0 * ff, L->b_up + (size_t)e * ff, s->count[e], ff);
        }
    expert_act(be, p, s->g, s->u, (size_t)rows * ff);
    m = 0;
    for (int e = 0; e < E; e++) {
        if (s->count[e] == 0) continue;
        s->gu_first[m] = s->first[e], s->gu_count[m] = s->count[e];
        s->gu_out[m] = s->y + (size_t)s->first[e] * dim, s->gu_w[m++] = &L->down[e];
    }
    op->matmul_groups(be, m, s->gu_out, s->gu_w, s->g, rows, s->gu_first, s->gu_count);
    if (p->oai)
        for (int e = 0; e < E; e++)
            if (s->count[e])
                op->add_bias(be, s->y + (size_t)s->first[e] * dim, L->b_down + (size_t)e * dim,
                             s->count[e], dim);
}

int zi_moe_reserve(zi_moe_scratch **s, zi_backend *be, const zi_moe_params *p, int T, int dim,
                   zi_error *err) {
    return scratch_grow(s, be, p, T, dim, err);
}

int zi_moe_forward(zi_moe_scratch **sp, zi_backend *be, const zi_moe_params *p,
                   const zi_moe_layer *L, float *out, const float *x, int T, int dim,
                   zi_error *err) {
    const zi_backend_ops *op = be->ops;
    const int E = p->n_expert, k = p->n_expert_used;
    const int kk = k + (p->shared_ffn_dim ? 1 : 0);
    int rc = scratch_grow(sp, be, p, T, dim, err);
    if (rc) return rc;
    zi_moe_scratch *s = *sp;

    /* Route: the router's logits to the host, the choice made there. */
    op->matmul(be, s->logits, &L->router, x, T);
    if (L->router_b) op->add_bias(be, s->logits, L->router_b, T, E);
    const float *logits = s->logits;
    if (!be->host_memory) {
        op->download(be, s->host_logits, s->logits, (size_t)T * E * sizeof(float));
        logits = s->host_logits;
    }
    zi_moe_route(p, logits, T, s->ids, s->w + 0); /* weights repacked below */

    /* Group: rows first[e] .. first[e] + count[e] - 1 of xg are expert e's
     * tokens in token order; slot says which row holds (t, j). */
    memset(s->count, 0, (size_t)E * sizeof *s->count);
    for (int i = 0; i < T * k; i++) s->count[s->ids[i]]++;
    for (int e = 0, at = 0; e < E; e++) {
        s->first[e] = at;
        at += s->count[e];
    }
    memset(s->count, 0, (size_t)E * sizeof *s->count);
    /* w is [T][k] from zi_moe_route; spread it to [T][kk] from the end so
     * that nothing is overwritten before it is read. */
    for (int t = T - 1; kk != k && t >= 0; t--)
        for (int j = k - 1; j >= 0; j--) s->w[t * kk + j] = s->w[t * k + j];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < k; j++) {
            const int e = s->ids[t * k + j], row = s->first[e] + s->count[e]++;
            s->src[row] = t;
            s->slot[t * kk + j] = row;
        }
    op->gather_rows(be, s->xg, x, s->src, T * k, dim);
    grouped_experts(s, be, p, L, T, E, dim);

    /* The shared expert: every token, in rows T*k .. T*k + T - 1 of y,
     * weighted by sigmoid of its gate (qwen2moe.cpp adds it after the
     * routed sum: last in each token's order). */
    if (p->shared_ffn_dim) {
        const int sf = p->shared_ffn_dim;
        float *gu[2] = {s->g, s->u};
        const zi_weight *wgu[2] = {&L->sh_gate, &L->sh_up};
        op->matmul_n(be, 2, gu, wgu, x, T);
        op->swiglu(be, s->g, s->g, s->u, (size_t)T * sf);
        op->matmul(be, s->y + (size_t)T * k * dim, &L->sh_down, s->g, T);
        op->matmul(be, s->sh_gate, &L->sh_inp, x, T);
        const float *gl = s->sh_gate;
        if (!be->host_memory) {
            op->download(be, s->sh_logit, s->sh_gate, (size_t)T * sizeof(float));
            gl = s->sh_logit;
        }
        for (int t = 0; t < T; t++) {
            s->w[t * kk + k] = (float)(1.0 / (1.0 + exp(-(double)gl[t])));
            s->slot[t * kk + k] = T * k + t;
        }
    }
    op->weighted_sum_rows(be, out, s->y, s->slot, s->w, T, kk, dim);
    return ZI_OK;
}
