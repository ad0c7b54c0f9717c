/*
 * lora.c - LoRA adapters (lora.h): the --lora value, reading and checking
 * an adapter file against the base model, and its A and B in float32 in
 * backend memory for the model's lora op (kernels/backend.h).
 */
#include "lora.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

/* The GGUF names of the targets, in zi_lora_target's order. */
static const char *const target_names[ZI_LORA_N_TARGETS] = {
    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down",
};

typedef struct lora_term {
    void *a, *b; /* A and B transposed (backend.h's zi_lora_row), backend memory, the
                  * file's type; NULL: none */
    int type;
    const zi_gguf_tensor *ta, *tb;
} lora_term;

struct zi_lora {
    zi_model *m;
    char name[ZI_LORA_NAME_MAX];
    float user_scale, alpha;
    int rank, n_layers, n_weights;
    uint64_t bytes;   /* A and B of every term, in backend memory */
    uint64_t key;     /* zi_lora_key */
    lora_term *terms; /* [n_layers][ZI_LORA_N_TARGETS] */
};

int zi_lora_spec_parse(const char *s, zi_lora_spec *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    out->scale = 1.0f;
    const char *eq = strchr(s, '=');
    if (!eq || eq == s)
        return zi_error_set(err, ZI_EINVAL, "--lora '%s': expected NAME=FILE[:SCALE]", s);
    size_t nl = (size_t)(eq - s);
    if (nl >= sizeof out->name)
        return zi_error_set(err, ZI_EINVAL, "--lora '%s': the name is longer than %d bytes", s,
                            ZI_LORA_NAME_MAX - 1);
    for (size_t i = 0; i < nl; i++)
        if (s[i] == ':' || (unsigned char)s[i] <= ' ')
            return zi_error_set(err, ZI_EINVAL,
                                "--lora '%s': a name has no spaces, control characters or ':'", s);
    memcpy(out->name, s, nl);
    const char *file = eq + 1;
    size_t fl = strlen(file);
    const char *colon = strrchr(file, ':');
    if (colon && colon[1]) { /* a number after the last ':' is the scale */
        char *end;
        errno = 0;
        double v = strtod(colon + 1, &end);
        if (*end == '\0' && errno == 0) {
            if (!isfinite(v) || fabs(v) > 1e6)
                return zi_error_set(err, ZI_EINVAL, "--lora '%s': the scale is not a finite number",
                                    s);
            out->scale = (float)v;
            fl = (size_t)(colon - file);
        }
    }
    if (fl == 0) return zi_error_set(err, ZI_EINVAL, "--lora '%s': no FILE after '='", s);
    if (fl >= sizeof out->path)
        return zi_error_set(err, ZI_EINVAL, "--lora '%s': the path is too long", s);
    memcpy(out->path, file, fl);
    return ZI_OK;
}

/* A (lora_a) in backend memory as the file has it, F32 or F16 (NULL: out
 * of memory). */
static void *upload_a(zi_backend *be, const zi_gguf_tensor *t) {
    size_t bytes = (size_t)(t->ne[0] * t->ne[1]) * (t->type == ZI_TYPE_F16 ? 2 : 4);
    void *dev = be->ops->alloc(be, bytes);
    if (dev) be->ops->upload(be, dev, t->data, bytes);
    return dev;
}

/* B (lora_b, ne [rank, rows]) transposed to [rank][rows], of the file's
 * type, in backend memory: the lora op's bt (NULL: out of memory). */
static void *upload_bt(zi_backend *be, const zi_gguf_tensor *t) {
    const size_t rank = (size_t)t->ne[0], rows = (size_t)t->ne[1], n = rank * rows;
    const size_t es = t->type == ZI_TYPE_F16 ? 2 : 4;
    uint8_t *host = malloc(n * es);
    void *dev = host ? be->ops->alloc(be, n * es) : NULL;
    if (!dev) {
        free(host);
        return NULL;
    }
    const uint8_t *p = t->data;
    for (size_t i = 0; i < n; i++) /* element i is B[i / rank][i % rank] */
        memcpy(host + ((i % rank) * rows + i / rank) * es, p + i * es, es);
    be->ops->upload(be, dev, host, n * es);
    free(host);
    return dev;
}

/* Splits "blk.N.TARGET.weight.lora_X" into layer, target and a/b (is_b);
 * base gets the adapted weight's name. ZI_EINVAL/ZI_EUNSUPPORTED naming
 * the tensor. */
static int parse_name(const char *file, const zi_gguf_tensor *t, char *base, size_t cap, int *layer,
                      int *target, int *is_b, zi_error *err) {
    char name[256];
    if (t->name.len >= sizeof name)
        return zi_error_set(err, ZI_EINVAL, "%s: a tensor name is longer than %zu bytes", file,
                            sizeof name - 1);
    memcpy(name, t->name.ptr, t->name.len);
    name[t->name.len] = '\0';
    size_t n = t->name.len;
    if (n > 7 && !strcmp(name + n - 7, ".lora_a"))
        *is_b = 0;
    else if (n > 7 && !strcmp(name + n - 7, ".lora_b"))
        *is_b = 1;
    else
        return zi_error_set(err, ZI_EINVAL, "%s: tensor '%s' is neither a .lora_a nor a .lora_b",
                            file, name);
    name[n - 7] = '\0';
    snprintf(base, cap, "%s", name);
    int l = -1, used = 0;
    char tg[64];
    if (sscanf(name, "blk.%d.%63[a-z_].weight%n", &l, tg, &used) != 2 || name[used] != '\0' ||
        l < 0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: tensor '%s': only a layer's attention and feed-forward weights "
                            "(blk.N.attn_q ... ffn_down) can be adapted",
                            file, name);
    for (int i = 0; i < ZI_LORA_N_TARGETS; i++)
        if (!strcmp(tg, target_names[i])) {
            *layer = l, *target = i;
            return ZI_OK;
        }
    return zi_error_set(err, ZI_EUNSUPPORTED,
                        "%s: tensor '%s.lora_%c': '%s' is not a weight zinfer adapts (attn_q, "
                        "attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down)",
                        file, base, *is_b ? 'b' : 'a', tg);
}

/* Checks the metadata: an adapter, a LoRA, for m's architecture. */
static int check_meta(const zi_gguf *g, const char *file, const zi_model_config *c, float *alpha,
                      zi_error *err) {
    zi_str s;
    if (!zi_gguf_find_kv(g, "general.type"))
        return zi_error_set(err, ZI_EINVAL, "%s: not an adapter (no general.type key)", file);
    if (zi_gguf_get_str(g, "general.type", &s, err)) return zi_error_prefix(err, "%s", file);
    if (!zi_str_eq(s, "adapter"))
        return zi_error_set(err, ZI_EINVAL, "%s: not an adapter (general.type is '%.*s')", file,
                            (int)(s.len > 64 ? 64 : s.len), s.ptr);
    if (zi_gguf_get_str(g, "adapter.type", &s, err)) return zi_error_prefix(err, "%s", file);
    if (!zi_str_eq(s, "lora"))
        return zi_error_set(err, ZI_EUNSUPPORTED, "%s: adapter.type is '%.*s', not 'lora'", file,
                            (int)(s.len > 64 ? 64 : s.len), s.ptr);
    if (zi_gguf_get_str(g, "general.architecture", &s, err))
        return zi_error_prefix(err, "%s", file);
    if (!zi_str_eq(s, c->arch))
        return zi_error_set(err, ZI_EINVAL,
                            "%s: general.architecture is '%.*s', the model's is '%s'", file,
                            (int)(s.len > 64 ? 64 : s.len), s.ptr, c->arch);
    if (zi_gguf_get_f32_or(g, "adapter.lora.alpha", 0.0f, alpha, err))
        return zi_error_prefix(err, "%s", file);
    if (!isfinite(*alpha))
        return zi_error_set(err, ZI_EINVAL, "%s: adapter.lora.alpha is not finite", file);
    return ZI_OK;
}

/* Checks one complete pair against the base weight and the rank so far. */
static int check_pair(const char *file, const zi_gguf *mg, const char *base, const lora_term *tm,
                      int *rank, char *rank_from, size_t rf_cap, zi_error *err) {
    const zi_gguf_tensor *a = tm->ta, *b = tm->tb;
    if (!a || !b)
        return zi_error_set(err, ZI_EINVAL, "%s: '%s.lora_%c' is missing (its lora_%c is there)",
                            file, base, a ? 'b' : 'a', a ? 'a' : 'b');
    const zi_gguf_tensor *w = zi_gguf_find_tensor(mg, base);
    if (!w)
        return zi_error_set(err, ZI_EINVAL, "%s: tensor '%s.lora_a': the model has no '%s'", file,
                            base, base);
    for (int i = 0; i < 2; i++) {
        const zi_gguf_tensor *t = i ? b : a;
        if (t->n_dims != 2)
            return zi_error_set(err, ZI_EINVAL, "%s: tensor '%s.lora_%c' has %u dimensions, not 2",
                                file, base, i ? 'b' : 'a', t->n_dims);
        if (t->type != ZI_TYPE_F32 && t->type != ZI_TYPE_F16)
            return zi_error_set(err, ZI_EUNSUPPORTED,
                                "%s: tensor '%s.lora_%c' is %s: adapters must be F32 or F16", file,
                                base, i ? 'b' : 'a', zi_ggml_type_name(t->type));
    }
    if (a->type != b->type)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: tensor '%s': lora_a is %s and lora_b %s: one type for both", file,
                            base, zi_ggml_type_name(a->type), zi_ggml_type_name(b->type));
    if (a->ne[0] != w->ne[0])
        return zi_error_set(err, ZI_EINVAL,
                            "%s: tensor '%s.lora_a' has shape [%lld, %lld]: '%s' takes %lld inputs "
                            "(ne[0])",
                            file, base, (long long)a->ne[0], (long long)a->ne[1], base,
                            (long long)w->ne[0]);
    if (b->ne[1] != w->ne[1])
        return zi_error_set(err, ZI_EINVAL,
                            "%s: tensor '%s.lora_b' has shape [%lld, %lld]: '%s' has %lld outputs "
                            "(ne[1])",
                            file, base, (long long)b->ne[0], (long long)b->ne[1], base,
                            (long long)w->ne[1]);
    if (a->ne[1] != b->ne[0])
        return zi_error_set(err, ZI_EINVAL,
                            "%s: tensor '%s': lora_a's rank %lld (ne[1]) differs from lora_b's "
                            "%lld (ne[0])",
                            file, base, (long long)a->ne[1], (long long)b->ne[0]);
    if (a->ne[1] < 1 || a->ne[1] > ZI_LORA_MAX_RANK)
        return zi_error_set(err, ZI_EUNSUPPORTED, "%s: tensor '%s': rank %lld is not in 1..%d",
                            file, base, (long long)a->ne[1], ZI_LORA_MAX_RANK);
    if (*rank == 0) {
        *rank = (int)a->ne[1];
        snprintf(rank_from, rf_cap, "%s", base);
    } else if (a->ne[1] != *rank) {
        return zi_error_set(err, ZI_EINVAL, "%s: tensor '%s' has rank %lld, '%s' has rank %d", file,
                            base, (long long)a->ne[1], rank_from, *rank);
    }
    return ZI_OK;
}

int zi_lora_load(zi_model *m, const zi_lora_spec *spec, zi_lora **out, zi_error *err) {
    *out = NULL;
    const char *file = spec->path;
    const zi_model_config *c = zi_model_get_config(m);
    zi_backend *be = zi_model_backend(m);
    if (!be->ops->lora)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: the %s backend does not run LoRA adapters (the CPU's does)", file,
                            be->ops->name);
    if (c->encoder)
        return zi_error_set(err, ZI_EUNSUPPORTED, "%s: '%s' is an encoder: no LoRA adapters", file,
                            c->arch);
    zi_gguf *g = NULL;
    int rc = zi_gguf_open(file, &g, err);
    if (rc) return rc;
    zi_lora *l = calloc(1, sizeof *l);
    if (l) l->terms = calloc((size_t)c->n_layers * ZI_LORA_N_TARGETS, sizeof *l->terms);
    if (!l || !l->terms) {
        rc = zi_error_set(err, ZI_ENOMEM, "%s: out of memory", file);
        goto done;
    }
    l->m = m, l->n_layers = c->n_layers, l->user_scale = spec->scale;
    snprintf(l->name, sizeof l->name, "%s", spec->name);
    if ((rc = check_meta(g, file, c, &l->alpha, err))) goto done;

    uint64_t nt = zi_gguf_tensor_count(g);
    if (nt == 0) {
        rc = zi_error_set(err, ZI_EINVAL, "%s: the adapter has no tensors", file);
        goto done;
    }
    for (uint64_t i = 0; i < nt; i++) {
        const zi_gguf_tensor *t = zi_gguf_tensor_at(g, i);
        char base[256];
        int layer = 0, target = 0, is_b = 0;
        if ((rc = parse_name(file, t, base, sizeof base, &layer, &target, &is_b, err))) goto done;
        if (layer >= c->n_layers || !zi_gguf_find_tensor(zi_model_gguf(m), base)) {
            rc = zi_error_set(err, ZI_EINVAL, "%s: tensor '%s.lora_%c': the model has no '%s'",
                              file, base, is_b ? 'b' : 'a', base);
            goto done;
        }
        lora_term *tm = &l->terms[(size_t)layer * ZI_LORA_N_TARGETS + target];
        const zi_gguf_tensor **slot = is_b ? &tm->tb : &tm->ta;
        if (*slot) {
            rc = zi_error_set(err, ZI_EINVAL, "%s: tensor '%s.lora_%c' appears twice", file, base,
                              is_b ? 'b' : 'a');
            goto done;
        }
        *slot = t;
    }
    char rank_from[256] = "";
    for (int li = 0; li < c->n_layers; li++)
        for (int ti = 0; ti < ZI_LORA_N_TARGETS; ti++) {
            lora_term *tm = &l->terms[(size_t)li * ZI_LORA_N_TARGETS + ti];
            if (!tm->ta && !tm->tb) continue;
            char base[128];
            snprintf(base, sizeof base, "blk.%d.%s.weight", li, target_names[ti]);
            if ((rc = check_pair(file, zi_model_gguf(m), base, tm, &l->rank, rank_from,
                                 sizeof rank_from, err)))
                goto done;
            l->n_weights++;
        }
    for (size_t i = 0; i < (size_t)c->n_layers * ZI_LORA_N_TARGETS; i++) {
        lora_term *tm = &l->terms[i];
        if (!tm->ta) continue;
        tm->a = upload_a(be, tm->ta);
        tm->b = tm->a ? upload_bt(be, tm->tb) : NULL;
        tm->type = tm->ta->type;
        l->bytes += tm->ta->nbytes + tm->tb->nbytes;
        if (!tm->b) {
            rc = zi_error_set(err, ZI_ENOMEM, "%s: out of memory for the adapter's tensors", file);
            goto done;
        }
        tm->ta = tm->tb = NULL; /* the file is closed below */
    }
done:
    zi_gguf_close(g);
    if (rc) {
        zi_lora_free(l);
        return rc;
    }
    *out = l;
    return ZI_OK;
}

void zi_lora_free(zi_lora *l) {
    if (!l) return;
    zi_backend *be = zi_model_backend(l->m);
    for (size_t i = 0; l->terms && i < (size_t)l->n_layers * ZI_LORA_N_TARGETS; i++) {
        if (l->terms[i].a) be->ops->free(be, l->terms[i].a);
        if (l->terms[i].b) be->ops->free(be, l->terms[i].b);
    }
    free(l->terms);
    free(l);
}

const char *zi_lora_name(const zi_lora *l) {
    return l->name;
}
float zi_lora_default_scale(const zi_lora *l) {
    return l->user_scale;
}
int zi_lora_rank(const zi_lora *l) {
    return l->rank;
}
float zi_lora_alpha(const zi_lora *l) {
    return l->alpha;
}
uint64_t zi_lora_bytes(const zi_lora *l) {
    return l->bytes;
}

int zi_lora_n_weights(const zi_lora *l) {
    return l->n_weights;
}
const zi_model *zi_lora_model(const zi_lora *l) {
    return l->m;
}
uint64_t zi_lora_key(const zi_lora *l) {
    return l->key;
}
void zi_lora_set_key(zi_lora *l, uint64_t key) {
    l->key = key;
}

float zi_lora_scale(const zi_lora *l, float user_scale) {
    return l->alpha != 0.0f ? user_scale * l->alpha / (float)l->rank : user_scale;
}

int zi_lora_term(const zi_lora *l, int layer, zi_lora_target t, const void **a, const void **bt,
                 int *type) {
    assert(layer >= 0 && layer < l->n_layers && t >= 0 && t < ZI_LORA_N_TARGETS);
    const lora_term *tm = &l->terms[(size_t)layer * ZI_LORA_N_TARGETS + t];
    if (!tm->a) return 0;
    *a = tm->a, *bt = tm->b, *type = tm->type;
    return 1;
}
