/*
 * weights.c - see weights.h.
 */
#include "weights.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/quant.h"

int zi_weight_describe(const zi_gguf_tensor *t, zi_weight *w, zi_error *err) {
    if (t->n_dims != 2)
        return zi_error_set(err, ZI_EFORMAT, "tensor '%.*s' has %u dimensions, expected 2",
                            (int)t->name.len, t->name.ptr, t->n_dims);
    switch (t->type) {
    case ZI_TYPE_F32:
    case ZI_TYPE_F16:
    case ZI_TYPE_BF16:
    case ZI_TYPE_Q4_0:
    case ZI_TYPE_Q4_1:
    case ZI_TYPE_Q8_0:
        break;
    default:
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "tensor '%.*s' has type %s, not usable as a matrix", (int)t->name.len,
                            t->name.ptr, zi_ggml_type_name(t->type));
    }
    if (zi_ggml_type_block_elems(t->type) == ZI_QK && t->ne[0] % ZI_QK != 0)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%.*s': row length %lld is not a multiple of 32",
                            (int)t->name.len, t->name.ptr, (long long)t->ne[0]);
    memset(w, 0, sizeof *w);
    w->type = t->type;
    w->cols = t->ne[0];
    w->rows = t->ne[1];
    w->row_bytes =
        (size_t)t->ne[0] / zi_ggml_type_block_elems(t->type) * zi_ggml_type_block_bytes(t->type);
    w->data = w->file_data = t->data;
    return ZI_OK;
}

float *zi_vector_dequantize(const zi_gguf_tensor *t, zi_error *err) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (t->type != ZI_TYPE_F32 && t->type != ZI_TYPE_F16 && t->type != ZI_TYPE_BF16) {
        zi_error_set(err, ZI_EUNSUPPORTED,
                     "tensor '%.*s' has type %s; a norm weight must be F32/F16/BF16",
                     (int)t->name.len, t->name.ptr, zi_ggml_type_name(t->type));
        return NULL;
    }
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) {
        zi_error_set(err, ZI_ENOMEM, "out of memory for tensor '%.*s'", (int)t->name.len,
                     t->name.ptr);
        return NULL;
    }
    zi_dequantize_row(t->type, t->data, v, n);
    return v;
}
