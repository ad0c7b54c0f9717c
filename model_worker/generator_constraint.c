/*
 * generator_constraint.c - structured output in the generator: each
 * constrained sequence's grammar state (a JSON schema compiled to a grammar,
 * or a grammar; grammar.h), caught up with its generated tokens before each
 * draw, and the mask of the tokens allowed next (generator_impl.h; the
 * public calls are in generator.h).
 */
#include <stdlib.h>

#include "generator_impl.h"

/* FNV-1a over token ids, continuing from h (TOKEN_HASH_SEED: none yet). */
#define TOKEN_HASH_SEED 0xcbf29ce484222325ull
static uint64_t token_hash(uint64_t h, const int32_t *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    return h;
}

/* Structured output: the tokens that keep context c's completion a
 * prefix of its grammar's (grammar.h; a JSON schema compiled to one), into
 * mask row `row`. The state catches up with the tokens generated since the
 * last step (all of them again after a rollback); tokens that do not
 * continue it (none should: each was drawn under this mask) leave only the
 * end-of-sequence ids. Near the request's length limit only the tokens
 * after which the text can still be finished are allowed. */
const int32_t *zi_gen_grammar_mask(zi_generator *g, const zi_text_context *c, int row) {
    gseq *q = zi_gen_seq_of(g, c);
    const int32_t *gen = c->tokens + c->prompt_len;
    int64_t n_gen = c->end_idx - c->prompt_len;
    if (q->js_fed >= 0 &&
        (q->js_fed > n_gen || token_hash(TOKEN_HASH_SEED, gen, q->js_fed) != q->js_hash))
        q->js_fed = -1;
    if (q->js_fed < 0) { /* (the worker compiled it at admission: a cache hit) */
        zi_grammar_state_free(q->gs);
        q->gs = NULL;
        q->js_bad = (!q->gram && zi_grammar_cache_get(g->grammars, c, &q->gram, NULL) != ZI_OK) ||
                    zi_grammar_state_create(q->gram, &q->gs, NULL) != ZI_OK;
        q->js_fed = 0, q->js_hash = TOKEN_HASH_SEED;
    }
    q->js_hash = token_hash(q->js_hash, gen + q->js_fed, n_gen - q->js_fed);
    for (; q->js_fed < n_gen; q->js_fed++)
        if (!q->js_bad && !zi_grammar_feed_token(g->json, q->gs, gen[q->js_fed])) q->js_bad = 1;
    size_t words = ((size_t)g->n_vocab + 31) / 32;
    int32_t *m = g->json_masks + (size_t)row * words;
    if (!q->js_bad) {
        /* the tokens this completion may still take, this one included:
         * near the limit the mask closes the text instead of letting it
         * be cut (grammar.h) */
        int64_t budget = c->max_length - c->end_idx;
        zi_grammar_allowed_within(g->json, q->gs, c->eos_token_ids.v, c->eos_token_ids.n, budget,
                                  m);
        size_t w = 0; /* never a row with nothing to draw */
        while (w < words && m[w] == 0) w++;
        if (w == words) q->js_bad = 1;
    }
    if (q->js_bad) zi_json_eos_only(g->n_vocab, c->eos_token_ids.v, c->eos_token_ids.n, m);
    return m;
}

int zi_generator_set_json_vocab(zi_generator *g, const zi_json_vocab *v, zi_error *err) {
    if (v && zi_json_vocab_size(v) != g->n_vocab)
        return zi_error_set(err, ZI_EINVAL,
                            "structured output: the tokenizer has %d tokens, the model %d",
                            (int)zi_json_vocab_size(v), g->n_vocab);
    if (v && !g->grammars && zi_grammar_cache_create(&g->grammars, err)) return ZI_ENOMEM;
    if (v && !g->json_masks) {
        size_t words = ((size_t)g->n_vocab + 31) / 32;
        g->json_masks = malloc((size_t)g->cfg.n_slots * words * sizeof *g->json_masks);
        if (!g->json_masks) return zi_error_set(err, ZI_ENOMEM, "out of memory");
    }
    g->json = v;
    return ZI_OK;
}

bool zi_generator_has_json(const zi_generator *g) {
    return g->json != NULL;
}

int zi_generator_check_constraint(zi_generator *g, const zi_text_context *c, zi_error *err) {
    const zi_grammar *gr = NULL;
    if (!c->has_json_schema && !c->grammar.len) return ZI_OK;
    if (!g->grammars)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: this worker cannot constrain decoding (no tokenizer in its model "
                            "file)",
                            c->has_json_schema ? "response_format" : "grammar");
    int rc = zi_grammar_cache_get(g->grammars, c, &gr, err);
    zi_grammar_cache_put(g->grammars, gr);
    return rc;
}
