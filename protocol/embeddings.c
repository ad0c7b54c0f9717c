/*
 * embeddings.c - see embeddings.h.
 */
#include "embeddings.h"

#include <stdlib.h>
#include <string.h>

static const char *const POOLING_NAMES[] = {"none", "mean", "cls", "last", "rank"};

int zi_pooling_parse(const char *name, size_t len, zi_pooling *out) {
    for (int i = 0; i <= ZI_POOLING_RANK; i++)
        if (strlen(POOLING_NAMES[i]) == len && !memcmp(POOLING_NAMES[i], name, len)) {
            *out = (zi_pooling)i;
            return ZI_OK;
        }
    return ZI_EINVAL;
}

const char *zi_pooling_name(zi_pooling p) {
    return (unsigned)p <= ZI_POOLING_RANK ? POOLING_NAMES[p] : "?";
}

int zi_embeddings_request_add(zi_embeddings_request *r, const int32_t *ids, size_t n,
                              zi_error *err) {
    if (n == 0) return zi_error_set(err, ZI_EINVAL, "an embedding input needs at least one token");
    size_t have = r->n_inputs ? r->start[r->n_inputs] : 0;
    size_t *st = realloc(r->start, (r->n_inputs + 2) * sizeof *st);
    if (!st) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    r->start = st;
    int32_t *v = realloc(r->ids, (have + n) * sizeof *v);
    if (!v) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    r->ids = v;
    memcpy(v + have, ids, n * sizeof *v);
    st[r->n_inputs] = have;
    st[++r->n_inputs] = have + n;
    return ZI_OK;
}

void zi_embeddings_request_free(zi_embeddings_request *r) {
    free(r->ids);
    free(r->start);
    memset(r, 0, sizeof *r);
}

void zi_embeddings_response_free(zi_embeddings_response *r) {
    free(r->embeddings);
    free(r->token_counts);
    memset(r, 0, sizeof *r);
}
