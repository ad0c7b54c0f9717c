/*
 * test_spec_draft.c - draft-model speculation (model_worker/spec_draft.h and
 * its use in generator.c), over the default model (skipped without it)
 * used as its own draft, so that every proposal is known: the model's
 * greedy continuation.
 *
 * The proposer: k tokens for several sequences batched, equal to the
 * generator's greedy tokens, with catch-up in passes smaller than a prompt;
 * after a partial rejection (the sequence continues with another token
 * than the draft's) the next proposal equals that of a fresh cache, so the
 * rejected positions' K/V were rolled back. The vocabulary check: a model
 * agrees with itself, and Gemma 3 (when present) is refused naming both
 * files. The generator: greedy and seeded sampled contexts, batched, in a
 * tight cache (chunked prefill, preemption), give with a draft model the
 * tokens they give without; the drafts are accepted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model_fixture.h"

#include "args.h"
#include "cpu_backend.h"
#include "generator.h"
#include "model.h"
#include "spec_draft.h"
#include "tokenizer.h"
#include "vocab_trie.h"

#define N_PROMPTS 3
#define GEN 24

static const char *texts[N_PROMPTS] = {
    ("<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
};

typedef struct fixture {
    char path[4096];
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    /* when set, run() constrains every prompt by this grammar */
    const char *grammar;
    zi_grammar_vocab *vocab;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    int rc = zi_test_model_open(&f->be, &f->model, &f->tok, f->path, sizeof f->path);
    if (rc == 1 && zi_test_encode_all(f->tok, texts, N_PROMPTS, f->ids, f->n_ids)) rc = -1;
    if (rc <= 0) free(f);
    *state = rc > 0 ? f : NULL;
    return rc < 0 ? -1 : 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    for (int i = 0; i < N_PROMPTS; i++) free(f->ids[i]);
    zi_grammar_vocab_free(f->vocab);
    zi_test_model_close(f->be, f->model, f->tok);
    free(f);
    return 0;
}

typedef struct run_out {
    int32_t tok[N_PROMPTS][GEN];
    int64_t n[N_PROMPTS];
} run_out;

/* The prompts batched to the end with cfg (seed > 0: sampled, seeded). */
static void run(fixture *f, const zi_generator_config *cfg, uint64_t seed, run_out *out,
                zi_generator_stats *st) {
    zi_error err = {0};
    zi_generator *g;
    assert_int_equal(zi_generator_create(f->model, cfg, &g, &err), ZI_OK);
    if (f->grammar) assert_int_equal(zi_generator_set_grammar_vocab(g, f->vocab, &err), ZI_OK);
    zi_text_context ctx[N_PROMPTS], *live[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        zi_sampling_params sp;
        zi_sampling_params_init(&sp); /* greedy */
        sp.max_new_tokens = GEN - i;
        if (seed) {
            sp.temperature = 0.8f, sp.top_k = 0, sp.top_p = 0.95f;
            sp.seed = seed + (uint64_t)i;
        }
        assert_int_equal(zi_text_context_init(&ctx[i], f->ids[i], f->n_ids[i], 256, &sp, &err),
                         ZI_OK);
        zi_sampling_params_free(&sp);
        if (f->grammar) {
            assert_int_equal(zi_string_set(&ctx[i].grammar, f->grammar, strlen(f->grammar), &err),
                             ZI_OK);
            if (zi_generator_check_constraint(g, &ctx[i], &err)) fail_msg("%s", err.msg);
        }
        live[i] = &ctx[i];
    }
    size_t n_live = N_PROMPTS;
    for (int rounds = 0; n_live > 0 && rounds < 2000; rounds++) {
        if (zi_generator_next_token(g, live, n_live, 1, &err)) fail_msg("%s", err.msg);
        if (zi_generator_check(g, &err)) fail_msg("%s", err.msg);
        n_live = zi_test_drop_done(g, live, n_live);
    }
    assert_int_equal(n_live, 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        out->n[i] = zi_text_context_generated_count(&ctx[i]);
        assert_true(out->n[i] <= GEN - i);
        memset(out->tok[i], 0, sizeof out->tok[i]);
        memcpy(out->tok[i], zi_text_context_generated_tokens(&ctx[i]),
               (size_t)out->n[i] * sizeof(int32_t));
        zi_text_context_free(&ctx[i]);
    }
    zi_generator_get_stats(g, st);
    zi_generator_free(g);
}

static void test_proposals_and_rollback(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    zi_generator_config cfg = {.n_slots = N_PROMPTS, .ctx = 256, .max_batch_tokens = 64};
    run_out greedy;
    zi_generator_stats st;
    run(f, &cfg, 0, &greedy, &st);

    /* passes of 8 tokens: the prompts (20+ tokens) catch up over several */
    zi_spec_draft *d, *fresh;
    int V = zi_model_get_config(f->model)->n_vocab;
    assert_int_equal(zi_spec_draft_create(f->model, N_PROMPTS, 256, 64, 16, 8, V, &d, &err), ZI_OK);
    assert_int_equal(zi_spec_draft_create(f->model, 1, 256, 16, 16, 8, V, &fresh, &err), ZI_OK);
    int32_t seq[N_PROMPTS][128], out[N_PROMPTS][8];
    zi_spec_draft_req req[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        memcpy(seq[i], f->ids[i], f->n_ids[i] * sizeof(int32_t));
        seq[i][f->n_ids[i]] = greedy.tok[i][0]; /* the target's first token */
        int k = 6 - i;
        assert_int_equal(zi_spec_draft_reserve(d, i, (int64_t)f->n_ids[i] + 1, k), k);
        req[i] = (zi_spec_draft_req){i, seq[i], (int64_t)f->n_ids[i] + 1, k, out[i]};
    }
    assert_int_equal(zi_spec_draft_propose(d, req, N_PROMPTS, &err), ZI_OK);
    for (int i = 0; i < N_PROMPTS; i++) /* the model's own greedy continuation */
        assert_memory_equal(out[i], greedy.tok[i] + 1, (size_t)req[i].k * sizeof(int32_t));

    /* Rejection after 2 drafts: the sequence goes on with another token;
     * the next proposal must be what a fresh cache proposes. */
    for (int i = 0; i < N_PROMPTS; i++) {
        int64_t n = (int64_t)f->n_ids[i] + 1;
        memcpy(seq[i] + n, out[i], 2 * sizeof(int32_t));
        seq[i][n + 2] = (out[i][2] + 1) % V;
        req[i].n_tokens = n + 3;
        req[i].k = 4;
        assert_int_equal(zi_spec_draft_reserve(d, i, req[i].n_tokens, 4), 4);
    }
    assert_int_equal(zi_spec_draft_propose(d, req, N_PROMPTS, &err), ZI_OK);
    for (int i = 0; i < N_PROMPTS; i++) {
        int32_t want[8];
        zi_spec_draft_req one = {0, seq[i], req[i].n_tokens, 4, want};
        zi_spec_draft_reset(fresh, 0);
        assert_int_equal(zi_spec_draft_reserve(fresh, 0, one.n_tokens, 4), 4);
        assert_int_equal(zi_spec_draft_propose(fresh, &one, 1, &err), ZI_OK);
        assert_memory_equal(out[i], want, 4 * sizeof(int32_t));
    }
    /* a slot's room is bounded by the pool: 16 blocks of 16 positions */
    assert_int_equal(zi_spec_draft_reserve(fresh, 0, 250, 8), 7);
    zi_spec_draft_free(d);
    zi_spec_draft_free(fresh);
}

static void test_vocabulary_check(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    assert_int_equal(zi_spec_draft_check_vocab(f->model, "a.gguf", f->model, "b.gguf", &err),
                     ZI_OK);
    char gemma[4200];
    const char *slash = strrchr(f->path, '/');
    snprintf(gemma, sizeof gemma, "%.*s/gemma-3-270m-q4_k_m.gguf", (int)(slash - f->path), f->path);
    if (access(gemma, R_OK) != 0) return;
    zi_model *g;
    assert_int_equal(zi_model_load(gemma, f->be, &g, &err), ZI_OK);
    assert_int_equal(zi_spec_draft_check_vocab(f->model, f->path, g, gemma, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, gemma));
    assert_non_null(strstr(err.msg, f->path));
    zi_model_free(g);
}

static void test_generator_same_tokens(void **state) {
    fixture *f = *state;
    if (!f) skip();
    /* 8 blocks of 8 positions for 3 sequences of up to ~55: preemption,
     * chunked prefill, drafts cut by the step's budget */
    zi_generator_config tight = {.n_slots = N_PROMPTS,
                                 .ctx = 64,
                                 .max_batch_tokens = 16,
                                 .kv_blocks = 8,
                                 .block_size = 8,
                                 .prefill_chunk = 8,
                                 .prefix_cache = 1};
    for (uint64_t seed = 0; seed <= 7; seed += 7) {
        run_out off, on;
        zi_generator_stats st;
        run(f, &tight, seed, &off, &st);
        tight.draft_model = f->model;
        run(f, &tight, seed, &on, &st);
        tight.draft_model = NULL;
        for (int i = 0; i < N_PROMPTS; i++) {
            assert_int_equal(off.n[i], on.n[i]);
            assert_memory_equal(off.tok[i], on.tok[i], sizeof off.tok[i]);
        }
        printf("seed %llu: %llu verifications, %llu drafted, %llu accepted, %llu preemptions\n",
               (unsigned long long)seed, (unsigned long long)st.spec_steps,
               (unsigned long long)st.draft_model_drafted,
               (unsigned long long)st.draft_model_accepted, (unsigned long long)st.preemptions);
        assert_true(st.draft_model_accepted > 0 && st.draft_model_drafted == st.spec_drafted);
        if (!seed) assert_true(st.preemptions > 0);
    }
}

/* Structured output with a draft model: its drafts (the model's own
 * unconstrained greedy continuation here) are cut after the pass at the
 * first token the grammar refuses (words of letters and digits, at most
 * one space, comma or period between them: ", " is refused), each
 * verification row masked by the grammar after the drafts before it (a
 * separator or not before it changes the mask); the same tokens as
 * without, greedy and seeded. */
static void test_constrained_same_tokens(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    if (!f->vocab)
        assert_int_equal(zi_grammar_vocab_create(zi_tokenizer_vocab_size(f->tok),
                                                 zi_tokenizer_constraint_bytes, f->tok, &f->vocab,
                                                 &err),
                         ZI_OK);
    f->grammar = "root ::= ([A-Za-z0-9]+ [ ,.]?)+";
    zi_generator_config cfg = {.n_slots = N_PROMPTS, .ctx = 256, .max_batch_tokens = 64};
    for (uint64_t seed = 0; seed <= 7; seed += 7) {
        run_out off, on;
        zi_generator_stats st;
        run(f, &cfg, seed, &off, &st);
        cfg.draft_model = f->model;
        run(f, &cfg, seed, &on, &st);
        cfg.draft_model = NULL;
        for (int i = 0; i < N_PROMPTS; i++) {
            assert_int_equal(off.n[i], on.n[i]);
            assert_memory_equal(off.tok[i], on.tok[i], sizeof off.tok[i]);
        }
        printf("constrained, seed %llu: %llu verifications, %llu drafted, %llu accepted\n",
               (unsigned long long)seed, (unsigned long long)st.spec_steps,
               (unsigned long long)st.draft_model_drafted,
               (unsigned long long)st.draft_model_accepted);
        /* some drafts refused by the grammar, some accepted */
        assert_true(st.draft_model_accepted > 0 &&
                    st.draft_model_accepted < st.draft_model_drafted);
    }
    f->grammar = NULL;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proposals_and_rollback),
        cmocka_unit_test(test_vocabulary_check),
        cmocka_unit_test(test_generator_same_tokens),
        cmocka_unit_test(test_constrained_same_tokens),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
