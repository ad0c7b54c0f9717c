/*
 * generator.c - see generator.h.
 *
 * One step: gather every live context's active window into one zi_batch
 * (tokens, positions, slots; logits wanted only at each window's last
 * token), run the model once, then pick and record each context's token.
 */
#include "generator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct zi_generator {
    zi_model *model;
    zi_kv_cache *kv;
    zi_generator_config cfg;
    int n_vocab;
    uint8_t *slot_used; /* [n_slots] */
    int slots_used;
    /* step buffers, max_batch_tokens long */
    int32_t *tokens, *pos, *seq;
    uint8_t *want;
    zi_text_context **stepped; /* contexts in this step, in batch order */
    float *logits;             /* [n_slots][n_vocab] */
};

int zi_generator_create(zi_model *m, const zi_generator_config *cfg, zi_generator **out,
                        zi_error *err) {
    if (cfg->n_slots < 1 || cfg->n_slots > 65536 || cfg->ctx < 2 || cfg->max_batch_tokens < 1 ||
        cfg->max_batch_tokens > (1 << 20))
        return zi_error_set(err, ZI_EINVAL,
                            "generator: n_slots %d (1..65536), ctx %d (>= 2), max_batch_tokens %d "
                            "(1..1048576) out of range",
                            cfg->n_slots, cfg->ctx, cfg->max_batch_tokens);
    zi_generator *g = calloc(1, sizeof *g);
    if (!g) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    g->model = m;
    g->cfg = *cfg;
    g->n_vocab = zi_model_get_config(m)->n_vocab;
    int rc = zi_kv_cache_create(m, cfg->n_slots, cfg->ctx, &g->kv, err);
    if (rc) {
        free(g);
        return rc;
    }
    size_t B = (size_t)cfg->max_batch_tokens, S = (size_t)cfg->n_slots;
    g->slot_used = calloc(S, 1);
    g->tokens = malloc(B * sizeof *g->tokens);
    g->pos = malloc(B * sizeof *g->pos);
    g->seq = malloc(B * sizeof *g->seq);
    g->want = malloc(B);
    g->stepped = malloc(S * sizeof *g->stepped);
    g->logits = malloc(S * (size_t)g->n_vocab * sizeof *g->logits);
    if (!g->slot_used || !g->tokens || !g->pos || !g->seq || !g->want || !g->stepped ||
        !g->logits) {
        zi_generator_free(g);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a generator of %d slots", cfg->n_slots);
    }
    *out = g;
    return ZI_OK;
}

void zi_generator_free(zi_generator *g) {
    if (!g) return;
    zi_kv_cache_free(g->kv);
    free(g->slot_used);
    free(g->tokens);
    free(g->pos);
    free(g->seq);
    free(g->want);
    free(g->stepped);
    free(g->logits);
    free(g);
}

int zi_generator_slots_used(const zi_generator *g) { return g->slots_used; }

void zi_generator_release(zi_generator *g, zi_text_context *ctx) {
    int64_t slot;
    if (zi_text_context_cache_seq_id(ctx, &slot, NULL) != ZI_OK) return;
    if (slot >= 0 && slot < g->cfg.n_slots && g->slot_used[slot]) {
        g->slot_used[slot] = 0;
        g->slots_used--;
    }
    zi_text_context_unassign_from_cache(ctx, NULL);
}

/* Only greedy decoding until the sampling processor exists: refuse what
 * would silently be ignored. */
static int check_sampling(const zi_text_context *c, zi_error *err) {
    const zi_sampling_params *sp = &c->sampling_params;
    int greedy = sp->top_k == 1 || sp->temperature == 0.0;
    if (!greedy || sp->frequency_penalty != 0.0 || sp->presence_penalty != 0.0 ||
        sp->repetition_penalty != 1.0)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "request %.*s: only greedy decoding (top_k=1 or temperature=0, no "
                            "penalties) is implemented so far",
                            (int)c->request_id.len, c->request_id.p ? c->request_id.p : "");
    return ZI_OK;
}

/* Gives every context in the batch a slot, or fails without changing any. */
static int assign_slots(zi_generator *g, zi_text_context *const *batch, size_t n, zi_error *err) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (!zi_text_context_is_assigned_to_cache(batch[i]) && !zi_text_context_is_done(batch[i]))
            need++;
        int rc = check_sampling(batch[i], err);
        if (rc) return rc;
        if (batch[i]->end_idx > g->cfg.ctx)
            return zi_error_set(err, ZI_ERANGE, "a context of %lld tokens exceeds the %d positions "
                                "of a cache slot", (long long)batch[i]->end_idx, g->cfg.ctx);
    }
    if (need > (size_t)(g->cfg.n_slots - g->slots_used))
        return zi_error_set(err, ZI_ENOMEM, "no free KV-cache slot (%d of %d in use, %zu needed)",
                            g->slots_used, g->cfg.n_slots, need);
    int next = 0;
    for (size_t i = 0; i < n; i++) {
        zi_text_context *c = batch[i];
        if (zi_text_context_is_assigned_to_cache(c) || zi_text_context_is_done(c)) continue;
        while (g->slot_used[next]) next++;
        g->slot_used[next] = 1;
        g->slots_used++;
        zi_text_context_assign_to_cache(c, next, NULL);
    }
    return ZI_OK;
}

/* argmax over the logits, with the end-of-generation ids masked while
 * min_new_tokens is not yet reached. */
static int32_t pick(const zi_text_context *c, float *logits, int n_vocab) {
    uint8_t mask = 0;
    if (zi_text_context_min_token_mask(c, 1, &mask, NULL) == ZI_OK && mask) {
        for (size_t i = 0; i < c->eos_token_ids.n; i++)
            if (c->eos_token_ids.v[i] < n_vocab) logits[c->eos_token_ids.v[i]] = -INFINITY;
        const zi_i32_list *st = &c->sampling_params.stop_token_ids;
        for (size_t i = 0; i < st->n; i++)
            if (st->v[i] < n_vocab) logits[st->v[i]] = -INFINITY;
    }
    int32_t best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

/* One step over the live contexts; *any_live is set when something ran. */
static int step(zi_generator *g, zi_text_context *const *batch, size_t n, int *any_live,
                zi_error *err) {
    int budget = g->cfg.max_batch_tokens, T = 0, n_stepped = 0;
    for (size_t i = 0; i < n && budget > 0; i++) {
        zi_text_context *c = batch[i];
        if (zi_text_context_is_done(c)) continue;
        int64_t len = zi_text_context_active_length(c);
        if (len > budget) { /* chunked prefill: the rest waits for later steps */
            int rc = zi_text_context_limit_active(c, budget, err);
            if (rc) return rc;
            len = budget;
        }
        int64_t slot;
        zi_text_context_cache_seq_id(c, &slot, NULL);
        for (int64_t j = 0; j < len; j++) {
            g->tokens[T] = c->tokens[c->start_idx + j];
            g->pos[T] = (int32_t)(c->start_idx + j);
            g->seq[T] = (int32_t)slot;
            g->want[T] = j == len - 1;
            T++;
        }
        budget -= (int)len;
        g->stepped[n_stepped++] = c;
    }
    *any_live = n_stepped > 0;
    if (!n_stepped) return ZI_OK;
    zi_batch b = {T, g->tokens, g->pos, g->seq, g->want};
    int rc = zi_model_forward(g->model, g->kv, &b, g->logits, err);
    if (rc) return rc;
    for (int i = 0; i < n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        int32_t tok = pick(c, g->logits + (size_t)i * g->n_vocab, g->n_vocab);
        if ((rc = zi_text_context_update(c, tok, NULL, err))) return rc;
    }
    return ZI_OK;
}

int zi_generator_next_token(zi_generator *g, zi_text_context *const *batch, size_t n,
                            int num_steps, zi_error *err) {
    if (n > (size_t)g->cfg.n_slots)
        return zi_error_set(err, ZI_EINVAL, "a batch of %zu contexts exceeds the %d slots", n,
                            g->cfg.n_slots);
    int rc = assign_slots(g, batch, n, err);
    for (int s = 0; !rc && s < num_steps; s++) {
        int live = 0;
        rc = step(g, batch, n, &live, err);
        if (!live) break;
    }
    return rc;
}
