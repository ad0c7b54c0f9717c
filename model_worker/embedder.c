/*
 * embedder.c - see embedder.h.
 */
#include "embedder.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kv_blocks.h"

int32_t zi_embed_out_rows(zi_pooling p, int32_t n_tokens) {
    return p == ZI_POOLING_NONE ? n_tokens : 1;
}

int zi_embed_input_init(zi_embed_input *e, const int32_t *tokens, int32_t n_tokens, int dim,
                        zi_pooling pooling, bool normalize, int32_t max_blocks, zi_error *err) {
    memset(e, 0, sizeof *e);
    if (n_tokens < 1 || dim < 1 || max_blocks < 1 || (unsigned)pooling > ZI_POOLING_RANK)
        return zi_error_set(err, ZI_EINVAL,
                            "embedding input: %d tokens, dim %d, pooling %d (an input needs a "
                            "token)",
                            n_tokens, dim, (int)pooling);
    e->tokens = tokens;
    e->n_tokens = n_tokens;
    e->dim = dim;
    e->pooling = pooling;
    e->normalize = normalize;
    e->max_blocks = max_blocks;
    e->out = calloc((size_t)zi_embed_out_rows(pooling, n_tokens) * (size_t)dim, sizeof *e->out);
    e->acc = calloc((size_t)dim, sizeof *e->acc);
    e->blocks = malloc((size_t)max_blocks * sizeof *e->blocks);
    if (!e->out || !e->acc || !e->blocks) {
        zi_embed_input_free(e);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for an embedding of %d tokens",
                            n_tokens);
    }
    return ZI_OK;
}

void zi_embed_input_free(zi_embed_input *e) {
    assert(e->n_blocks == 0);
    free(e->out);
    free(e->acc);
    free(e->blocks);
    e->out = NULL, e->acc = NULL, e->blocks = NULL;
}

bool zi_embed_wants(const zi_embed_input *e, int32_t pos) {
    switch (e->pooling) {
    case ZI_POOLING_CLS:
        return pos == 0;
    case ZI_POOLING_LAST:
        return pos == e->n_tokens - 1;
    case ZI_POOLING_RANK: /* llama.cpp's: an encoder's first token, a decoder's last */
        return pos == (e->encoder ? 0 : e->n_tokens - 1);
    default:
        return true;
    }
}

void zi_embed_take(zi_embed_input *e, int32_t pos, const float *h) {
    assert(pos >= 0 && pos < e->n_tokens && zi_embed_wants(e, pos));
    size_t d = (size_t)e->dim;
    if (e->pooling == ZI_POOLING_MEAN)
        for (size_t i = 0; i < d; i++) e->acc[i] += h[i];
    else
        memcpy(e->out + (e->pooling == ZI_POOLING_NONE ? (size_t)pos * d : 0), h, d * sizeof *h);
}

void zi_embed_finish(zi_embed_input *e) {
    if (e->pooling == ZI_POOLING_MEAN)
        for (int i = 0; i < e->dim; i++) e->out[i] = (float)(e->acc[i] / e->n_tokens);
    if (!e->normalize || e->pooling == ZI_POOLING_RANK) return;
    int32_t rows = zi_embed_out_rows(e->pooling, e->n_tokens);
    for (int32_t r = 0; r < rows; r++) zi_embed_l2_normalize(e->out + (size_t)r * e->dim, e->dim);
}

void zi_embed_l2_normalize(float *v, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i] * v[i];
    if (s <= 0) return;
    double inv = 1.0 / sqrt(s);
    for (int i = 0; i < n; i++) v[i] = (float)(v[i] * inv);
}

void zi_embed_schedule(zi_embed_input *const *in, size_t n, zi_kv_blocks *kb, int budget,
                       int whole_budget, zi_embed_step *s) {
    assert(whole_budget >= budget);
    s->n_stepped = s->n_hidden = 0;
    int bs = s->block_size;
    for (size_t k = 0; k < n && whole_budget > 0; k++) {
        zi_embed_input *e = in[k];
        if (e->done) continue;
        int room = e->whole ? whole_budget : budget;
        if (room <= 0 || (e->whole && e->n_tokens - e->n_fed > room)) continue; /* never cut */
        if (e->n_blocks == 0) {
            int32_t need = (e->n_tokens + bs - 1) / bs;
            assert(need <= e->max_blocks && need <= s->table_stride);
            if (zi_kv_blocks_available(kb) < need) continue; /* waits for memory */
            for (int32_t j = 0; j < need; j++) e->blocks[e->n_blocks++] = zi_kv_blocks_alloc(kb);
        }
        int len = e->n_tokens - e->n_fed;
        if (len > room) len = room;
        int32_t row = s->first_row + s->n_stepped;
        memcpy(s->tables + (size_t)row * s->table_stride, e->blocks,
               (size_t)e->n_blocks * sizeof *e->blocks);
        for (int j = 0; j < len; j++) {
            int T = s->n_tokens++;
            int32_t pos = e->n_fed + j;
            s->tokens[T] = e->tokens[pos];
            s->pos[T] = pos;
            s->seq[T] = row;
            s->want_logits[T] = 0;
            s->want_hidden[T] = zi_embed_wants(e, pos);
            if (s->f32_attn) s->f32_attn[T] = e->whole;
            s->n_hidden += s->want_hidden[T];
        }
        e->step_len = len;
        budget -= len;
        whole_budget -= len;
        s->stepped[s->n_stepped++] = e;
    }
}

void zi_embed_release(zi_embed_input *e, zi_kv_blocks *kb) {
    for (int32_t i = e->n_blocks; i-- > 0;) zi_kv_blocks_release(kb, e->blocks[i]);
    e->n_blocks = 0;
}

void zi_embed_collect(const zi_embed_step *s, const float *hidden, zi_kv_blocks *kb) {
    const float *h = hidden;
    for (int k = 0; k < s->n_stepped; k++) {
        zi_embed_input *e = s->stepped[k];
        for (int32_t j = 0; j < e->step_len; j++) {
            int32_t pos = e->n_fed + j;
            if (!zi_embed_wants(e, pos)) continue;
            zi_embed_take(e, pos, h);
            h += e->dim;
        }
        e->n_fed += e->step_len;
        e->step_len = 0;
        if (e->n_fed == e->n_tokens) {
            zi_embed_finish(e);
            zi_embed_release(e, kb);
            e->done = true;
        }
    }
}
