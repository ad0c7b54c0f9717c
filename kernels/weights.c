/*
 * weights.c - see weights.h.
 */
#include "weights.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/dequant.h"

int zi_weight_describe(const zi_gguf_tensor *t, zi_weight *w, zi_error *err) {
    if (t->n_dims != 2)
        return zi_error_set(err, ZI_EFORMAT, "tensor '%.*s' has %u dimensions, expected 2",
                            (int)t->name.len, t->name.ptr, t->n_dims);
    /* Every type the GGUF reader accepts is a matrix type; a hand-made
     * tensor (tests) may still carry another. */
    const size_t be = zi_ggml_type_block_elems(t->type);
    if (be == 0)
        return zi_error_set(
            err, ZI_EUNSUPPORTED, "tensor '%.*s' has type %s (%d), not usable as a matrix",
            (int)t->name.len, t->name.ptr, zi_ggml_type_name(t->type), (int)t->type);
    if (t->ne[0] % (int64_t)be != 0)
        return zi_error_set(err, ZI_EFORMAT,
                            "tensor '%.*s': row length %lld is not a multiple of %s's block of %zu",
                            (int)t->name.len, t->name.ptr, (long long)t->ne[0],
                            zi_ggml_type_name(t->type), be);
    memset(w, 0, sizeof *w);
    w->type = t->type;
    w->cols = t->ne[0];
    w->rows = t->ne[1];
    w->row_bytes =
        (size_t)t->ne[0] / zi_ggml_type_block_elems(t->type) * zi_ggml_type_block_bytes(t->type);
    w->data = w->file_data = t->data;
    w->data_bytes = w->row_bytes * (size_t)w->rows;
    return ZI_OK;
}

float *zi_vector_dequantize(const zi_gguf_tensor *t, zi_error *err) {
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    const size_t be = zi_ggml_type_block_elems(t->type);
    if (be == 0 || t->ne[0] % (int64_t)be != 0) {
        zi_error_set(err, ZI_EUNSUPPORTED,
                     "tensor '%.*s' has type %s and %lld values; a vector must be whole blocks "
                     "of a supported type",
                     (int)t->name.len, t->name.ptr, zi_ggml_type_name(t->type),
                     (long long)t->ne[0]);
        return NULL;
    }
    float *v = malloc((size_t)n * sizeof(float));
    if (!v) {
        zi_error_set(err, ZI_ENOMEM, "out of memory for tensor '%.*s'", (int)t->name.len,
                     t->name.ptr);
        return NULL;
    }
    zi_dequantize_row(t->type, t->data, v, n); /* ne[0] is whole blocks, so n is */
    return v;
}
