/*
 * generator.c - see generator.h.
 *
 * One step: gather every live context's active window into one zi_batch
 * (tokens, positions, slots; logits wanted at each window's last token, and
 * at every token of a prompt window whose log probabilities are echoed), run
 * the model once, sample every context whose window reached its last token
 * with the fused sampling processor (sampler.h), and record each token with
 * its log probabilities when they were asked for.
 */
#include "generator.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampler.h"

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
    int *first_row;            /* [n_slots] each stepped context's first logits row */
    float *logits;             /* [logit_rows][n_vocab]: one per context, more for echo */
    size_t logit_rows;
    /* sampling */
    zi_sampler *sampler;
    zi_sampler_row *rows; /* [n_slots] */
    int *row_ctx;         /* [n_slots] sampled row -> stepped index */
    int32_t *out_tok, *sample_tok; /* [n_slots] */
    int32_t *forbid;               /* EOS ids masked by min_new_tokens */
    size_t forbid_cap;
    int32_t *top_ids; /* log-probability scratch */
    float *top_lps;
    size_t top_cap, top_lps_cap;
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
    g->logit_rows = S;
    g->first_row = malloc(S * sizeof *g->first_row);
    g->rows = malloc(S * sizeof *g->rows);
    g->row_ctx = malloc(S * sizeof *g->row_ctx);
    g->out_tok = malloc(S * sizeof *g->out_tok);
    g->sample_tok = malloc(S * sizeof *g->sample_tok);
    if (!g->slot_used || !g->tokens || !g->pos || !g->seq || !g->want || !g->stepped ||
        !g->logits || !g->first_row || !g->rows || !g->row_ctx || !g->out_tok ||
        !g->sample_tok) {
        zi_generator_free(g);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a generator of %d slots", cfg->n_slots);
    }
    if ((rc = zi_sampler_create(&g->sampler, g->n_vocab, err))) {
        zi_generator_free(g);
        return rc;
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
    free(g->first_row);
    free(g->rows);
    free(g->row_ctx);
    free(g->out_tok);
    free(g->sample_tok);
    free(g->forbid);
    free(g->top_ids);
    free(g->top_lps);
    zi_sampler_destroy(g->sampler);
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

/* Gives every context in the batch a slot, or fails without changing any. */
static int assign_slots(zi_generator *g, zi_text_context *const *batch, size_t n, zi_error *err) {
    size_t need = 0;
    for (size_t i = 0; i < n; i++) {
        if (!zi_text_context_is_assigned_to_cache(batch[i]) && !zi_text_context_is_done(batch[i]))
            need++;
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

/* Grows a scratch array to hold n elements of size sz. */
static int grow(void **p, size_t *cap, size_t n, size_t sz, zi_error *err) {
    if (n <= *cap) return ZI_OK;
    size_t c = *cap ? *cap : 16;
    while (c < n) c *= 2;
    void *q = realloc(*p, c * sz);
    if (!q) return zi_error_set(err, ZI_ENOMEM, "out of memory for %zu sampling entries", n);
    *p = q;
    *cap = c;
    return ZI_OK;
}

/* One position's log probabilities (the token's and the top n) as a fresh
 * single-entry zi_logprobs, for zi_text_context_update and friends. */
static int make_logprobs(zi_generator *g, const float *row, int32_t token, int64_t top_n,
                         zi_logprobs **out, zi_error *err) {
    int32_t n = (int32_t)(top_n < g->n_vocab ? top_n : g->n_vocab);
    int rc = grow((void **)&g->top_ids, &g->top_cap, (size_t)n, sizeof *g->top_ids, err);
    if (!rc && (size_t)n > g->top_lps_cap)
        rc = grow((void **)&g->top_lps, &g->top_lps_cap, (size_t)n, sizeof *g->top_lps, err);
    float tok_lp = 0;
    if (!rc)
        rc = zi_sampler_logprobs(row, g->n_vocab, token, n, &tok_lp, g->top_ids, g->top_lps, err);
    if (rc) return rc;
    zi_logprobs *lp = malloc(sizeof *lp);
    if (!lp) return zi_error_set(err, ZI_ENOMEM, "out of memory for log probabilities");
    zi_logprobs_init(lp);
    if ((rc = zi_logprobs_push(lp, tok_lp, g->top_ids, g->top_lps, (size_t)n, err))) {
        zi_logprobs_free(lp);
        free(lp);
        return rc;
    }
    *out = lp;
    return ZI_OK;
}

/* Does this window need the log probabilities of its prompt tokens (echo)?
 * Then every position's logits are kept, not only the last one's. */
static int wants_echo(const zi_text_context *c) {
    return c->log_probabilities > 0 && c->log_probabilities_echo &&
           c->start_idx + 1 < c->prompt_len;
}

/* One step over the live contexts; *any_live is set when something ran. */
static int step(zi_generator *g, zi_text_context *const *batch, size_t n, int *any_live,
                zi_error *err) {
    int budget = g->cfg.max_batch_tokens, T = 0, n_stepped = 0, n_rows = 0;
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
        int echo = wants_echo(c);
        g->first_row[n_stepped] = n_rows;
        for (int64_t j = 0; j < len; j++) {
            g->tokens[T] = c->tokens[c->start_idx + j];
            g->pos[T] = (int32_t)(c->start_idx + j);
            g->seq[T] = (int32_t)slot;
            g->want[T] = echo || j == len - 1;
            n_rows += g->want[T];
            T++;
        }
        budget -= (int)len;
        g->stepped[n_stepped++] = c;
    }
    *any_live = n_stepped > 0;
    if (!n_stepped) return ZI_OK;
    int rc = grow((void **)&g->logits, &g->logit_rows, (size_t)n_rows,
                  (size_t)g->n_vocab * sizeof *g->logits, err);
    if (rc) return rc;
    zi_batch b = {T, g->tokens, g->pos, g->seq, g->want};
    if ((rc = zi_model_forward(g->model, g->kv, &b, g->logits, err))) return rc;

    /* Sample every context whose window reached the end of its tokens (a
     * chunk in the middle of a prompt has nothing to sample). */
    size_t n_forbid = 0;
    for (int i = 0; i < n_stepped; i++) {
        const zi_text_context *c = g->stepped[i];
        n_forbid += c->eos_token_ids.n + c->sampling_params.stop_token_ids.n;
    }
    if ((rc = grow((void **)&g->forbid, &g->forbid_cap, n_forbid, sizeof *g->forbid, err)))
        return rc;
    int n_sample = 0;
    size_t used = 0;
    for (int i = 0; i < n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        g->sample_tok[i] = 0;
        if (c->active_idx < c->end_idx) continue;
        zi_sampler_row *r = &g->rows[n_sample];
        g->row_ctx[n_sample++] = i;
        int last = i + 1 < n_stepped ? g->first_row[i + 1] - 1 : n_rows - 1;
        int64_t n_gen = c->end_idx - c->prompt_len;
        uint8_t mask = 0;
        zi_text_context_min_token_mask(c, 1, &mask, NULL);
        *r = (zi_sampler_row){
            .logits = g->logits + (size_t)last * g->n_vocab,
            .params = &c->sampling_params,
            .prompt_ids = c->tokens,
            .n_prompt = (size_t)c->prompt_len,
            .generated_ids = c->tokens + c->prompt_len,
            .n_generated = (size_t)n_gen,
            .step = (uint64_t)n_gen,
            .eos_forbid = g->forbid + used,
        };
        if (mask) {
            const zi_i32_list *e = &c->eos_token_ids, *st = &c->sampling_params.stop_token_ids;
            memcpy(g->forbid + used, e->v, e->n * sizeof *e->v);
            memcpy(g->forbid + used + e->n, st->v, st->n * sizeof *st->v);
            r->n_eos_forbid = e->n + st->n;
            used += r->n_eos_forbid;
        }
    }
    if (n_sample && (rc = zi_sampler_sample(g->sampler, g->rows, (size_t)n_sample, g->out_tok,
                                            err)))
        return rc;
    for (int k = 0; k < n_sample; k++) g->sample_tok[g->row_ctx[k]] = g->out_tok[k];

    for (int i = 0; i < n_stepped; i++) {
        zi_text_context *c = g->stepped[i];
        int first = g->first_row[i];
        int last = i + 1 < n_stepped ? g->first_row[i + 1] - 1 : n_rows - 1;
        if (c->log_probabilities > 0 && c->log_probabilities_echo) {
            /* echo: prompt token p+1 given positions 0..p (a window that
             * wanted no echo has one row, at a position past the prompt). */
            for (int row = first; row <= last; row++) {
                int64_t p = c->start_idx + (row - first);
                if (p + 1 >= c->prompt_len) break;
                zi_logprobs *lp = NULL;
                rc = make_logprobs(g, g->logits + (size_t)row * g->n_vocab, c->tokens[p + 1],
                                   c->log_probabilities, &lp, err);
                if (!rc) rc = zi_text_context_set_prompt_logprobs(c, p + 1, lp, err);
                if (rc) return rc;
            }
        }
        int32_t tok = g->sample_tok[i];
        zi_logprobs *lp = NULL;
        if (c->log_probabilities > 0 && c->active_idx == c->end_idx &&
            (rc = make_logprobs(g, g->logits + (size_t)last * g->n_vocab, tok,
                                c->log_probabilities, &lp, err)))
            return rc;
        if ((rc = zi_text_context_update(c, tok, lp, err))) return rc;
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
