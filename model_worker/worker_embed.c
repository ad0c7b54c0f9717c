/*
 * worker_embed.c - see worker_embed.h.
 */
#include "worker_embed.h"

#include <stdlib.h>
#include <string.h>

int zi_embed_job_start(zi_embed_job *j, uint64_t rid, const msgpack_object *msg,
                       const zi_embed_model *m, zi_error *err) {
    memset(j, 0, sizeof *j);
    j->rid = rid;
    zi_im_embed e;
    int rc = zi_im_embed_unpack(msg, &e, err);
    if (rc) return rc;
    j->truncated = e.truncated;
    zi_pooling pooling;
    if (e.pooling.p) {
        if (zi_pooling_parse(e.pooling.p, e.pooling.n, &pooling) != ZI_OK)
            return zi_error_set(err, ZI_EINVAL, "pooling: one of none, mean, cls, last, rank");
    } else if (m->pooling < 0) {
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "pooling: the model's pooling is not supported; ask for none, "
                            "mean, cls or last");
    } else {
        pooling = (zi_pooling)m->pooling;
    }
    if (pooling == ZI_POOLING_RANK && !m->rank)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "pooling: rank needs a reranker (a model file with a classification "
                            "head, cls.weight or cls.output.weight); this one has none");
    j->rank = pooling == ZI_POOLING_RANK ? m->rank : NULL;
    rc = zi_im_embed_inputs_decode(e.inputs, ZI_EMBED_MAX_INPUTS_CAP, ZI_EMBED_MAX_TOKENS_CAP,
                                   &j->req, err);
    if (rc) return rc;
    j->req.pooling = (int)pooling;
    j->req.normalize = e.normalize;
    size_t n = j->req.n_inputs;
    for (size_t i = 0; !rc && i < n; i++) {
        size_t s = j->req.start[i], len = j->req.start[i + 1] - s;
        if ((int64_t)len > m->ctx)
            rc = zi_error_set(err, ZI_EINVAL,
                              "input[%zu]: %zu tokens exceed this worker's context of %d", i, len,
                              m->ctx);
        for (size_t k = 0; !rc && k < len; k++)
            if (j->req.ids[s + k] >= m->vocab)
                rc =
                    zi_error_set(err, ZI_EINVAL,
                                 "input[%zu]: token id %d is outside this model's vocabulary of %d",
                                 i, j->req.ids[s + k], m->vocab);
    }
    if (!rc && !(j->in = calloc(n, sizeof *j->in)))
        rc = zi_error_set(err, ZI_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < n; i++) {
        int32_t len = (int32_t)(j->req.start[i + 1] - j->req.start[i]);
        rc = zi_embed_input_init(&j->in[i], j->req.ids + j->req.start[i], len, m->dim, pooling,
                                 e.normalize, (len + m->block_size - 1) / m->block_size, err);
        if (!rc) {
            j->in[i].encoder = m->whole;
            j->in[i].whole = m->whole || (pooling == ZI_POOLING_RANK && len <= m->max_batch);
        }
    }
    if (rc) zi_embed_job_free(j, NULL);
    return rc;
}

bool zi_embed_job_done(const zi_embed_job *j) {
    for (size_t i = 0; i < j->req.n_inputs; i++)
        if (!j->in[i].done) return false;
    return true;
}

int zi_embed_job_pack(const zi_embed_job *j, zi_msg *out, zi_error *err) {
    size_t n = j->req.n_inputs;
    int dim = j->rank ? zi_rank_head_outputs(j->rank) : n ? j->in[0].dim : 1;
    zi_embeddings_response r = {.dim = dim, .n_inputs = n, .pooling = (zi_pooling)j->req.pooling};
    for (size_t i = 0; i < n; i++) r.rows += zi_embed_out_rows(j->in[i].pooling, j->in[i].n_tokens);
    r.embeddings = malloc((size_t)r.rows * (size_t)dim * sizeof *r.embeddings + 1);
    r.token_counts = malloc(n * sizeof *r.token_counts + 1);
    if (!r.embeddings || !r.token_counts) {
        zi_embeddings_response_free(&r);
        zi_msg_init(out);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for %lld embeddings", (long long)r.rows);
    }
    float *p = r.embeddings;
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)zi_embed_out_rows(j->in[i].pooling, j->in[i].n_tokens) * (size_t)dim;
        if (j->rank)
            zi_rank_head_apply(j->rank, j->in[i].out, p); /* the pooled state -> scores */
        else
            memcpy(p, j->in[i].out, k * sizeof *p);
        p += k;
        r.token_counts[i] = j->in[i].n_tokens;
    }
    int rc = zi_im_embedded_pack(
        &(zi_im_embedded){.rid = (int64_t)j->rid, .truncated = j->truncated, .resp = &r}, out, err);
    zi_embeddings_response_free(&r);
    return rc;
}

void zi_embed_job_free(zi_embed_job *j, zi_generator *g) {
    for (size_t i = 0; j->in && i < j->req.n_inputs; i++) {
        if (g) zi_generator_release_embed(g, &j->in[i]);
        if (j->in[i].out || j->in[i].blocks) zi_embed_input_free(&j->in[i]);
    }
    free(j->in);
    zi_embeddings_request_free(&j->req);
    memset(j, 0, sizeof *j);
}
