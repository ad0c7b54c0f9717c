/*
 * device_sampler.c - see device_sampler.h. With CUDA: a zi_cuda_sampler on
 * the model's backend and a table of zi_cuda_sample_row_full rows filled
 * from the generator's zi_sampler_row rows. A build without CUDA has no
 * device to sample on: zi_device_sampler_create hands back no bridge and
 * every step samples on the host (the complete behaviour there).
 */
#include "device_sampler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZI_HAVE_CUDA

#include "cuda_backend.h"
#include "sampling.h"

/*
 * Decode steps from CUDA graphs (cuda_backend.h): a step's pass of a
 * shape seen before is captured once and then replayed, so its few
 * hundred kernels cost one launch. The shape is the key: the pass's
 * tokens, the block-table entries it reads ((largest sequence row + 1) x
 * table stride) and the stride. A key's first pass runs op by op (so
 * nothing allocates in the capture), its second is captured and launched,
 * later ones are launched. Only plain passes qualify (graph_eligible):
 * every token wants logits, no LoRA, images, embedding inputs or hidden
 * states, no recurrent layers (their state slots are not restaged), no
 * experts (moe.c routes on the host in the middle of a pass). When
 * the backend has freed memory since a capture (a buffer grew for a larger
 * pass), every graph is dropped and the keys start over.
 * ZINFER_CUDA_GRAPHS=0 runs every pass op by op.
 */
#define GRAPH_SLOTS 16       /* graphs kept; the least recently used goes */
#define GRAPH_MAX_TOKENS 256 /* decode batches; longer passes are prefill */

enum { GRAPH_SEEN = 1, GRAPH_CAPTURED, GRAPH_FAILED };

typedef struct graph_slot {
    int n_tokens, n_table, stride; /* the key (n_tokens 0: a free slot) */
    int state;                     /* GRAPH_* */
    zi_cuda_graph *g;
    const float *logits; /* where a replay leaves them (the captured pass's) */
    int n_rows;
    uint64_t used; /* the clock at its last use */
} graph_slot;

struct zi_device_sampler {
    zi_model *model;
    zi_backend *be;
    zi_cuda_sampler *cs;
    zi_cuda_sample_row_full *rows; /* [max_rows] */
    int max_rows;
    const float *logits; /* the last pass's rows (device) */
    int n_logit_rows;
    size_t ld; /* floats per logits row: the model's n_vocab */
    uint64_t count;
    int graphs_on;
    graph_slot graphs[GRAPH_SLOTS];
    uint64_t clock, replays, captures;
};

int zi_device_sampler_compiled(void) {
    return 1;
}

int zi_device_sampler_create(zi_model *m, int32_t n_vocab, int max_rows, zi_device_sampler **out,
                             zi_error *err) {
    *out = NULL;
    zi_backend *be = zi_model_backend(m);
    if (!be || !be->ops || strcmp(be->ops->name, "cuda") != 0 || !zi_cuda_backend_stream(be))
        return ZI_OK;
    const char *env = getenv("ZINFER_GPU_SAMPLER");
    if (env && strcmp(env, "0") == 0) return ZI_OK;
    if (max_rows > 65535) max_rows = 65535; /* the generator then samples more on the host */
    zi_device_sampler *d = calloc(1, sizeof *d);
    if (!d) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    d->model = m;
    d->be = be;
    d->max_rows = max_rows;
    d->ld = (size_t)zi_model_get_config(m)->n_vocab;
    /* a hybrid's state slots are not restaged by a replay, and a mixture
     * of experts routes on the host in the middle of the pass (moe.c) */
    const zi_model_config *mc = zi_model_get_config(m);
    const char *genv = getenv("ZINFER_CUDA_GRAPHS");
    d->graphs_on =
        !(genv && strcmp(genv, "0") == 0) && mc->n_recurrent == 0 && mc->moe.n_expert == 0;
    d->rows = calloc((size_t)max_rows, sizeof *d->rows);
    int rc = d->rows ? zi_cuda_sampler_create(be, n_vocab, max_rows, &d->cs, err)
                     : zi_error_set(err, ZI_ENOMEM, "out of memory");
    if (rc) {
        zi_device_sampler_free(d);
        return rc;
    }
    *out = d;
    return ZI_OK;
}

static void graphs_drop(zi_device_sampler *d) {
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        zi_cuda_graph_free(d->graphs[i].g);
        d->graphs[i] = (graph_slot){0};
    }
}

void zi_device_sampler_free(zi_device_sampler *d) {
    if (!d) return;
    graphs_drop(d);
    zi_cuda_sampler_free(d->cs);
    free(d->rows);
    free(d);
}

/* Whether pass b may run from a graph (the top comment's rules). A replay
 * skips the model's batch checks, so they are made here (a batch that
 * fails them runs op by op, where the model reports it); the positions
 * are checked against the cache again by zi_cuda_graph_launch. */
static int graph_eligible(const zi_device_sampler *d, const zi_kv_cache *kv, const zi_batch *b) {
    const int T = b->n_tokens;
    if (!d->graphs_on || T < 1 || T > GRAPH_MAX_TOKENS) return 0;
    if (b->want_hidden || b->f32_attn || b->embd || b->embd_rows || b->attn_pos || b->state_slots ||
        (b->lora && b->lora_k > 0))
        return 0;
    if (!b->want_logits && T > 1) return 0; /* only the last token's: not a decode step */
    for (int i = 0; b->want_logits && i < T; i++)
        if (!b->want_logits[i]) return 0;
    return zi_model_check_batch(d->model, kv, b, NULL) == ZI_OK;
}

/* The slot of b's shape: found, or a free one, or the least recently used
 * (its graph freed). */
static graph_slot *graph_slot_for(zi_device_sampler *d, const zi_batch *b) {
    int max_seq = 0;
    for (int i = 0; i < b->n_tokens; i++)
        if (b->seq[i] > max_seq) max_seq = b->seq[i];
    const int n_table = (max_seq + 1) * b->table_stride;
    graph_slot *lru = &d->graphs[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        graph_slot *s = &d->graphs[i];
        if (s->n_tokens == b->n_tokens && s->n_table == n_table && s->stride == b->table_stride) {
            s->used = ++d->clock;
            return s;
        }
        if (s->used < lru->used) lru = s;
    }
    zi_cuda_graph_free(lru->g);
    *lru = (graph_slot){
        .n_tokens = b->n_tokens, .n_table = n_table, .stride = b->table_stride, .used = ++d->clock};
    return lru;
}

typedef struct capture_arg {
    zi_device_sampler *d;
    zi_kv_cache *kv;
    const zi_batch *b;
} capture_arg;

static int capture_pass(void *arg, zi_error *err) {
    capture_arg *a = arg;
    return zi_model_forward_async(a->d->model, a->kv, a->b, &a->d->logits, &a->d->n_logit_rows,
                                  err);
}

static int graph_launch(zi_device_sampler *d, graph_slot *s, zi_kv_cache *kv, const zi_batch *b,
                        zi_error *err) {
    const zi_batch_view v = {b->n_tokens, b->pos, b->seq, b->block_tables, b->table_stride, NULL};
    zi_attn_shape shape = {0};
    shape.block_size = zi_kv_cache_block_size(kv);
    shape.max_ctx = zi_kv_cache_ctx(kv);
    int rc = zi_cuda_graph_launch(s->g, b->tokens, &v, &shape, err);
    if (rc) return rc;
    d->logits = s->logits;
    d->n_logit_rows = s->n_rows;
    d->replays++;
    return ZI_OK;
}

int zi_device_sampler_forward(zi_device_sampler *d, zi_kv_cache *kv, const zi_batch *b,
                              zi_error *err) {
    d->logits = NULL;
    d->n_logit_rows = 0;
    graph_slot *s = graph_eligible(d, kv, b) ? graph_slot_for(d, b) : NULL;
    if (s && s->state == GRAPH_CAPTURED && zi_cuda_graph_stale(s->g)) {
        graphs_drop(d); /* memory freed since: every graph may read it */
        s = graph_slot_for(d, b);
    }
    zi_error gerr = {0};
    const char *what = NULL;
    if (s && s->state == GRAPH_SEEN) {
        capture_arg a = {d, kv, b};
        if (zi_cuda_graph_capture(d->be, capture_pass, &a, &s->g, &gerr) == ZI_OK) {
            s->state = GRAPH_CAPTURED;
            s->logits = d->logits;
            s->n_rows = d->n_logit_rows;
            if (++d->captures == 1)
                fprintf(stderr,
                        "zinfer-worker: decode steps replay CUDA graphs (the first: %d tokens, "
                        "%zu nodes; ZINFER_CUDA_GRAPHS=0 turns them off)\n",
                        b->n_tokens, zi_cuda_graph_nodes(s->g));
        } else {
            what = "capture";
        }
    }
    if (s && s->state == GRAPH_CAPTURED) {
        if (graph_launch(d, s, kv, b, &gerr) == ZI_OK) return ZI_OK;
        what = "launch";
    }
    if (what) {
        /* this shape runs op by op from now on; an error of the backend
         * itself shows in the pass below */
        zi_cuda_graph_free(s->g);
        s->g = NULL;
        s->state = GRAPH_FAILED;
        fprintf(stderr, "zinfer-worker: %d-token passes run op by op: CUDA graph %s: %s\n",
                b->n_tokens, what, gerr.msg);
        d->logits = NULL;
        d->n_logit_rows = 0;
    }
    int rc = zi_model_forward_async(d->model, kv, b, &d->logits, &d->n_logit_rows, err);
    if (!rc && s && !s->state) s->state = GRAPH_SEEN;
    return rc;
}

int zi_device_sampler_sample(zi_device_sampler *d, const zi_sampler_row *rows, const int *src_row,
                             int n_rows, int32_t *out, zi_error *err) {
    if (n_rows < 1) return ZI_OK;
    if (n_rows > d->max_rows || !d->logits)
        return zi_error_set(err, ZI_EINVAL, "GPU sampling: %d rows (at most %d) or no pass", n_rows,
                            d->max_rows);
    for (int k = 0; k < n_rows; k++) {
        if (src_row[k] < 0 || src_row[k] >= d->n_logit_rows)
            return zi_error_set(err, ZI_EINVAL, "GPU sampling: logits row %d of %d", src_row[k],
                                d->n_logit_rows);
        const zi_sampler_row *r = &rows[k];
        if (r->n_more_generated) /* speculation's rows sample on the host */
            return zi_error_set(err, ZI_EINVAL, "GPU sampling: row %d has more_generated_ids", k);
        d->rows[k] = (zi_cuda_sample_row_full){
            .params = r->params,
            .step = r->step,
            .logits = d->logits + (size_t)src_row[k] * d->ld,
            .prompt_ids = r->prompt_ids,
            .n_prompt = r->n_prompt,
            .generated_ids = r->generated_ids,
            .n_generated = r->n_generated,
            .bitmask = r->bitmask,
            .eos_forbid = r->eos_forbid,
            .n_eos_forbid = r->n_eos_forbid,
        };
        /* the CPU sampler takes a NULL history of length 0; the GPU one
         * reads NULL as "no history given" and refuses penalties then */
        static const int32_t none[1] = {0};
        if (!d->rows[k].prompt_ids && !r->n_prompt) d->rows[k].prompt_ids = none;
    }
    int rc = zi_cuda_sampler_sample_full_async(d->cs, d->logits, d->ld, d->rows, n_rows, err);
    const int32_t *tok = NULL;
    if (!rc) rc = zi_cuda_sampler_wait(d->cs, &tok, err);
    if (rc && rc != ZI_ERANGE) return rc;
    memcpy(out, tok, (size_t)n_rows * sizeof *out);
    for (int k = 0; k < n_rows; k++) d->count += out[k] >= 0;
    return rc;
}

int zi_device_sampler_finish(zi_device_sampler *d, zi_error *err) {
    return d->be->ops->sync(d->be, err);
}

uint64_t zi_device_sampler_count(const zi_device_sampler *d) {
    return d ? d->count : 0;
}

void zi_device_sampler_graph_stats(const zi_device_sampler *d, uint64_t *captures,
                                   uint64_t *replays) {
    *captures = d ? d->captures : 0;
    *replays = d ? d->replays : 0;
}

#else /* no CUDA: never a bridge */

int zi_device_sampler_compiled(void) {
    return 0;
}

int zi_device_sampler_create(zi_model *m, int32_t n_vocab, int max_rows, zi_device_sampler **out,
                             zi_error *err) {
    (void)m, (void)n_vocab, (void)max_rows, (void)err;
    *out = NULL;
    return ZI_OK;
}

void zi_device_sampler_free(zi_device_sampler *d) {
    (void)d;
}

int zi_device_sampler_forward(zi_device_sampler *d, zi_kv_cache *kv, const zi_batch *b,
                              zi_error *err) {
    (void)d, (void)kv, (void)b;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

int zi_device_sampler_sample(zi_device_sampler *d, const zi_sampler_row *rows, const int *src_row,
                             int n_rows, int32_t *out, zi_error *err) {
    (void)d, (void)rows, (void)src_row, (void)n_rows, (void)out;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

int zi_device_sampler_finish(zi_device_sampler *d, zi_error *err) {
    (void)d;
    return zi_error_set(err, ZI_EUNSUPPORTED, "GPU sampling: not compiled in");
}

uint64_t zi_device_sampler_count(const zi_device_sampler *d) {
    (void)d;
    return 0;
}

void zi_device_sampler_graph_stats(const zi_device_sampler *d, uint64_t *captures,
                                   uint64_t *replays) {
    (void)d;
    *captures = *replays = 0;
}

#endif
