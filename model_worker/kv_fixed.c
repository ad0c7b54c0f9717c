/*
 * kv_fixed.c - a paged KV cache with fixed block tables (kv_fixed.h).
 */
#include "kv_fixed.h"

#include <stdlib.h>
#include <string.h>

int zi_kv_fixed_create(zi_model *m, int32_t n_seqs, int32_t ctx, zi_kv_fixed *out, zi_error *err) {
    memset(out, 0, sizeof *out);
    /* The messages call a sequence a "slot", as the worker's --slots does. */
    if (n_seqs < 1 || ctx < 1)
        return zi_error_set(err, ZI_EINVAL, "KV cache needs at least 1 slot and 1 position");
    int64_t stride = ((int64_t)ctx + ZI_KV_FIXED_BLOCK - 1) / ZI_KV_FIXED_BLOCK;
    if (stride * n_seqs > (1 << 30))
        return zi_error_set(err, ZI_ERANGE, "a KV cache of %d slots x %d positions is too large",
                            (int)n_seqs, (int)ctx);
    int32_t n_blocks = (int32_t)(stride * n_seqs);
    int rc = zi_kv_cache_create_paged(m, n_blocks, ZI_KV_FIXED_BLOCK, ctx, &out->kv, err);
    if (rc) return rc;
    /* A hybrid's recurrent states: one slot per sequence, slot = row. */
    if ((rc = zi_kv_cache_add_states(out->kv, n_seqs, err))) {
        zi_kv_fixed_free(out);
        return rc;
    }
    if (!(out->tables = malloc((size_t)n_blocks * sizeof *out->tables))) {
        zi_kv_fixed_free(out);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for the KV cache's slot table");
    }
    for (int32_t i = 0; i < n_blocks; i++) out->tables[i] = i;
    out->n_seqs = n_seqs;
    out->stride = (int32_t)stride;
    return ZI_OK;
}

void zi_kv_fixed_free(zi_kv_fixed *f) {
    zi_kv_cache_free(f->kv);
    free(f->tables);
    memset(f, 0, sizeof *f);
}

void zi_kv_fixed_use(const zi_kv_fixed *f, zi_batch *b) {
    b->block_tables = f->tables;
    b->n_table_rows = f->n_seqs;
    b->table_stride = f->stride;
}
