/*
 * rank_head.c - see rank_head.h.
 */
#include "rank_head.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dequant.h"

/* Tensor `name` as rows x cols floats (malloc'd) into *out; *out NULL
 * when the file has no such tensor. */
static int read_tensor(const zi_gguf *g, const char *name, int64_t rows, int64_t cols, float **out,
                       zi_error *err) {
    *out = NULL;
    const zi_gguf_tensor *t = zi_gguf_find_tensor(g, name);
    if (!t) return ZI_OK;
    int64_t r = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) r *= t->ne[d];
    if (t->ne[0] != cols || r != rows)
        return zi_error_set(err, ZI_EFORMAT, "%s: shape [%lld, %lld], expected [%lld, %lld]", name,
                            (long long)t->ne[0], (long long)r, (long long)cols, (long long)rows);
    size_t row_bytes = (size_t)t->nbytes / (size_t)rows;
    if (!(*out = malloc((size_t)rows * (size_t)cols * sizeof **out)))
        return zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (int64_t i = 0; i < rows; i++)
        if (zi_dequantize_row(t->type, (const uint8_t *)t->data + (size_t)i * row_bytes,
                              *out + (size_t)i * (size_t)cols, cols) != ZI_OK) {
            free(*out);
            *out = NULL;
            return zi_error_set(err, ZI_EFORMAT, "%s: type %s cannot be read", name,
                                zi_ggml_type_name(t->type));
        }
    return ZI_OK;
}

int zi_rank_head_load(zi_rank_head *h, const zi_gguf *g, const char *arch, int dim, bool softmax,
                      zi_error *err) {
    memset(h, 0, sizeof *h);
    h->dim = dim;
    h->softmax = softmax;
    char key[96];
    snprintf(key, sizeof key, "%s.classifier.output_labels", arch);
    const zi_gguf_kv *kv = zi_gguf_find_kv(g, key);
    if (kv && kv->type == ZI_GGUF_ARRAY && kv->arr_len > ZI_RANK_MAX_OUTPUTS)
        return zi_error_set(err, ZI_EFORMAT, "%s: %llu labels (at most %d)", key,
                            (unsigned long long)kv->arr_len, ZI_RANK_MAX_OUTPUTS);
    h->n_out = kv && kv->type == ZI_GGUF_ARRAY && kv->arr_len > 0 ? (int)kv->arr_len : 1;
    int rc = read_tensor(g, "cls.weight", dim, dim, &h->cls_w, err);
    if (!rc) rc = read_tensor(g, "cls.bias", 1, dim, &h->cls_b, err);
    if (!rc) rc = read_tensor(g, "cls.output.weight", h->n_out, dim, &h->out_w, err);
    if (!rc) rc = read_tensor(g, "cls.output.bias", 1, h->n_out, &h->out_b, err);
    if (!rc && !h->cls_w && !h->out_w)
        rc = zi_error_set(err, ZI_EUNSUPPORTED,
                          "rank pooling: the file has no classification head (cls.weight or "
                          "cls.output.weight)");
    if (!rc && h->cls_b && !h->cls_w)
        rc = zi_error_set(err, ZI_EFORMAT, "cls.bias: the file has no cls.weight");
    if (!rc && h->out_b && !h->out_w)
        rc = zi_error_set(err, ZI_EFORMAT, "cls.output.bias: the file has no cls.output.weight");
    int m = h->n_out > dim ? h->n_out : dim;
    if (!rc && !(h->scratch = malloc(2 * (size_t)m * sizeof *h->scratch)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (rc) zi_rank_head_free(h);
    return rc;
}

void zi_rank_head_free(zi_rank_head *h) {
    free(h->cls_w);
    free(h->cls_b);
    free(h->out_w);
    free(h->out_b);
    free(h->scratch);
    memset(h, 0, sizeof *h);
}

int zi_rank_head_outputs(const zi_rank_head *h) {
    return h->out_w ? h->n_out : h->dim;
}

void zi_rank_head_apply(zi_rank_head *h, const float *x, float *out) {
    int d = h->dim, n = zi_rank_head_outputs(h);
    double *v = h->scratch, *o = h->scratch + (n > d ? n : d);
    for (int i = 0; i < d; i++) v[i] = x[i];
    if (h->cls_w) {
        for (int r = 0; r < d; r++) {
            double s = h->cls_b ? h->cls_b[r] : 0.0;
            const float *w = h->cls_w + (size_t)r * (size_t)d;
            for (int i = 0; i < d; i++) s += (double)w[i] * v[i];
            o[r] = tanh(s);
        }
        memcpy(v, o, (size_t)d * sizeof *v);
    }
    if (h->out_w) {
        for (int r = 0; r < n; r++) {
            double s = h->out_b ? h->out_b[r] : 0.0;
            const float *w = h->out_w + (size_t)r * (size_t)d;
            for (int i = 0; i < d; i++) s += (double)w[i] * v[i];
            o[r] = s;
        }
    } else {
        memcpy(o, v, (size_t)d * sizeof *o);
    }
    if (h->softmax) {
        double mx = o[0], sum = 0;
        for (int i = 1; i < n; i++) mx = o[i] > mx ? o[i] : mx;
        for (int i = 0; i < n; i++) sum += (o[i] = exp(o[i] - mx));
        for (int i = 0; i < n; i++) o[i] /= sum;
    }
    for (int i = 0; i < n; i++) out[i] = (float)o[i];
}
