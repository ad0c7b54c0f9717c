/*
 * generator_constraint.c - structured output in the generator: each
 * constrained sequence's grammar state (a JSON schema compiled to a grammar,
 * or a grammar; grammar.h), caught up with its generated tokens before each
 * draw, and the mask of the tokens allowed next, for its own row and for
 * the row after each draft when it speculates (generator_impl.h; the
 * public calls are in generator.h).
 */
#include <assert.h>
#include <stdlib.h>

#include "generator_impl.h"

/* FNV-1a over token ids, continuing from h (TOKEN_HASH_SEED: none yet). */
#define TOKEN_HASH_SEED 0xcbf29ce484222325ull
static uint64_t token_hash(uint64_t h, const int32_t *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 0x100000001b3ull;
    return h;
}

/* Catches q's grammar state up with c's generated tokens: it follows on
 * from the tokens fed last step when they are still a prefix of them (the
 * hash), else (a rollback: a preemption's reset, drafts fed last step and
 * rejected) it starts over from the first generated token. ZI_ENOMEM
 * when memory runs out (the grammar cannot say which tokens are allowed:
 * the step fails rather than constrain the text wrongly); the state then
 * starts over at the next step. */
static int catch_up(zi_generator *g, const zi_text_context *c, gseq *q, zi_error *err) {
    const int32_t *gen = c->tokens + c->prompt_len;
    int64_t n_gen = c->end_idx - c->prompt_len;
    if (q->gr_fed >= 0 &&
        (q->gr_fed > n_gen || token_hash(TOKEN_HASH_SEED, gen, q->gr_fed) != q->gr_hash))
        q->gr_fed = -1;
    if (q->gr_fed < 0) { /* (the worker compiled it at admission: a cache hit) */
        zi_grammar_state_free(q->gs);
        q->gs = NULL;
        zi_error e = {0};
        int rc = q->gram ? ZI_OK : zi_grammar_cache_get(g->grammars, c, &q->gram, &e);
        if (!rc) rc = zi_grammar_state_create(q->gram, &q->gs, &e);
        if (rc == ZI_ENOMEM) return zi_error_set(err, rc, "structured output: %s", e.msg);
        q->gr_bad = rc != ZI_OK; /* a grammar that does not compile: only EOS */
        q->gr_fed = 0, q->gr_hash = TOKEN_HASH_SEED;
    }
    for (int64_t i = q->gr_fed; !q->gr_bad && i < n_gen; i++) {
        bool taken;
        if (zi_grammar_feed_token(g->gvocab, q->gs, gen[i], &taken, err)) {
            q->gr_fed = -1; /* fed in part: start over */
            return ZI_ENOMEM;
        }
        if (!taken) q->gr_bad = 1;
    }
    q->gr_hash = token_hash(q->gr_hash, gen + q->gr_fed, n_gen - q->gr_fed);
    q->gr_fed = n_gen;
    return ZI_OK;
}

/* The tokens that keep the completion a prefix of its grammar's after
 * the state's text, into m, for a completion that may take `budget` more
 * tokens, this one included: near the limit the mask closes the text
 * instead of letting it be cut (grammar.h). A state that broke (no token
 * should: each was drawn under this mask) leaves only the end-of-sequence
 * ids. ZI_ENOMEM when memory runs out. */
static int mask_row(zi_generator *g, const zi_text_context *c, gseq *q, int64_t budget, int32_t *m,
                    zi_error *err) {
    size_t words = ((size_t)g->n_vocab + 31) / 32;
    if (!q->gr_bad) {
        int rc = zi_grammar_allowed_within(g->gvocab, q->gs, c->eos_token_ids.v, c->eos_token_ids.n,
                                           budget, m, err);
        if (rc) return rc;
        size_t w = 0; /* never a row with nothing to draw */
        while (w < words && m[w] == 0) w++;
        if (w == words) q->gr_bad = 1;
    }
    if (q->gr_bad) zi_grammar_eos_only(g->n_vocab, c->eos_token_ids.v, c->eos_token_ids.n, m);
    return ZI_OK;
}

int zi_gen_grammar_masks(zi_generator *g, const zi_text_context *c, const int32_t *draft,
                         int n_draft, zi_error *err) {
    gseq *q = zi_gen_seq_of(g, c);
    size_t words = ((size_t)g->n_vocab + 31) / 32;
    if (!q->masks && !(q->masks = malloc(ZI_SPEC_ROWS * words * sizeof *q->masks))) {
        zi_error_set(err, ZI_ENOMEM, "out of memory for structured-output masks");
        return -1;
    }
    assert(n_draft >= 0 && n_draft <= ZI_SPEC_MAX_DRAFT);
    if (catch_up(g, c, q, err) || mask_row(g, c, q, c->max_length - c->end_idx, q->masks, err))
        return -1;
    q->masked = 1;
    int kept = 0;
    while (kept < n_draft) {
        /* draft `kept` is fed at position end_idx + kept: the row before
         * it must allow it, or no draw there can give it */
        int32_t t = draft[kept];
        const int32_t *m = q->masks + (size_t)kept * words;
        if (t < 0 || t >= g->n_vocab || !((uint32_t)m[t >> 5] >> (t & 31) & 1u)) break;
        int32_t *next = q->masks + (size_t)(kept + 1) * words;
        bool taken = false;
        if (!q->gr_bad && zi_grammar_feed_token(g->gvocab, q->gs, t, &taken, err)) return -1;
        if (taken) {
            q->gr_hash = token_hash(q->gr_hash, &t, 1);
            q->gr_fed++;
            if (mask_row(g, c, q, c->max_length - (c->end_idx + kept + 1), next, err)) return -1;
            kept++;
            continue;
        }
        /* Not fed: an end-of-sequence id (allowed: the text is whole) ends
         * the completion, so it is kept and the row after it, never
         * emitted, gets a mask that still has something to draw; any other
         * token (none should be: the mask holds what the grammar takes)
         * is cut. */
        for (size_t e = 0; e < c->eos_token_ids.n; e++)
            if (c->eos_token_ids.v[e] == t) {
                zi_grammar_eos_only(g->n_vocab, c->eos_token_ids.v, c->eos_token_ids.n, next);
                kept++;
                break;
            }
        break;
    }
    return kept;
}

int zi_generator_set_grammar_vocab(zi_generator *g, const zi_grammar_vocab *v, zi_error *err) {
    if (v && zi_grammar_vocab_size(v) != g->n_vocab)
        return zi_error_set(err, ZI_EINVAL,
                            "structured output: the tokenizer has %d tokens, the model %d",
                            (int)zi_grammar_vocab_size(v), g->n_vocab);
    if (v && !g->grammars && zi_grammar_cache_create(&g->grammars, err)) return ZI_ENOMEM;
    g->gvocab = v;
    return ZI_OK;
}

int zi_generator_check_constraint(zi_generator *g, const zi_text_context *c, zi_error *err) {
    const zi_grammar *gr = NULL;
    if (!zi_text_context_constrained(c)) return ZI_OK;
    if (!g->grammars)
        return zi_error_set(err, ZI_EUNSUPPORTED,
                            "%s: this worker cannot constrain decoding (no tokenizer in its model "
                            "file)",
                            c->has_json_schema ? "response_format"
                            : c->regex.len     ? "regex"
                                               : "grammar");
    int rc = zi_grammar_cache_get(g->grammars, c, &gr, err);
    zi_grammar_cache_put(g->grammars, gr);
    return rc;
}
