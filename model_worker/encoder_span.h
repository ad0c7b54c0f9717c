/*
 * encoder_span.h - how far each token of an encoder's pass attends
 * (family.h "encoder": bert, nomic-bert).
 *
 * The attention op (kernels/backend.h) lets a token at position p see
 * positions 0..p of its sequence: causal. An encoder's token sees its
 * whole input. model.c gets that from the same op by giving the attention,
 * for each token, its input's last position in place of its own, once
 * kv_store has written every position of the input: this module computes
 * those positions, and checks that each input really is whole in the pass
 * (its tokens are positions 0..n-1 of its sequence), since a part of an
 * input would attend to stale cache rows.
 *
 * A backend with span_attention (kernels/backend.h) does better: it attends
 * within each input over the pass's own float32 K/V, no cache between, and
 * model.c hands it the tokens grouped by input (zi_encoder_groups).
 */
#ifndef ZI_ENCODER_SPAN_H
#define ZI_ENCODER_SPAN_H

#include <stdint.h>

#include "zi_error.h"

/* For tokens i < n_tokens at positions pos[i] of sequences seq[i] (each
 * in 0..n_rows-1): span[i] = the last position of seq[i] in the pass.
 * scratch holds 2 * n_rows ints. ZI_EINVAL, naming the sequence, when a
 * sequence's token count is not its last position + 1 (not whole). */
int zi_encoder_spans(const int32_t *pos, const int32_t *seq, int n_tokens, int n_rows,
                     int32_t *span, int32_t *scratch, zi_error *err);

/* Groups tokens i < n_tokens by sequence seq[i] (in 0..n_rows-1) for
 * span_attention: order lists the token indices sequence by sequence, in
 * ascending sequence and, within one, in batch order; group g < *n_groups
 * is order[starts[g]] .. order[starts[g+1] - 1]. order holds n_tokens
 * ints, starts n_rows + 1, scratch n_rows. */
void zi_encoder_groups(const int32_t *seq, int n_tokens, int n_rows, int32_t *order,
                       int32_t *starts, int *n_groups, int32_t *scratch);

#endif
