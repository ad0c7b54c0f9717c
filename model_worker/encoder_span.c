/*
 * encoder_span.c - see encoder_span.h.
 */
#include "encoder_span.h"

#include <assert.h>

int zi_encoder_spans(const int32_t *pos, const int32_t *seq, int n_tokens, int n_rows,
                     int32_t *span, int32_t *scratch, zi_error *err) {
    int32_t *n = scratch, *last = scratch + n_rows; /* tokens, last position per row */
    for (int r = 0; r < n_rows; r++) n[r] = 0, last[r] = -1;
    for (int i = 0; i < n_tokens; i++) {
        assert(seq[i] >= 0 && seq[i] < n_rows); /* the model validated the batch */
        n[seq[i]]++;
        if (pos[i] > last[seq[i]]) last[seq[i]] = pos[i];
    }
    for (int i = 0; i < n_tokens; i++) {
        int r = seq[i];
        if (n[r] != last[r] + 1)
            return zi_error_set(err, ZI_EINVAL,
                                "sequence %d: an encoder runs an input whole in one pass (%d "
                                "tokens up to position %d)",
                                r, n[r], last[r]);
        span[i] = last[r];
    }
    return ZI_OK;
}

void zi_encoder_groups(const int32_t *seq, int n_tokens, int n_rows, int32_t *order,
                       int32_t *starts, int *n_groups, int32_t *scratch) {
    int32_t *next = scratch; /* tokens per row, then where its next one goes */
    for (int r = 0; r < n_rows; r++) next[r] = 0;
    for (int i = 0; i < n_tokens; i++) {
        assert(seq[i] >= 0 && seq[i] < n_rows);
        next[seq[i]]++;
    }
    int g = 0, off = 0;
    for (int r = 0; r < n_rows; r++) {
        if (next[r] == 0) continue;
        int n = next[r];
        starts[g++] = off, next[r] = off, off += n;
    }
    starts[g] = off;
    *n_groups = g;
    for (int i = 0; i < n_tokens; i++) order[next[seq[i]]++] = i;
}
