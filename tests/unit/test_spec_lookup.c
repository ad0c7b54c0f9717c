/*
 * test_spec_lookup.c - prompt-lookup speculation (model_worker/spec_lookup.h
 * and its use in generator.c).
 *
 * The proposer's n-gram match (longest suffix first, most recent
 * occurrence, draft cut at k and at the end of the tokens), the greedy
 * acceptance rule, and the adaptive draft length (grow, shrink, pause,
 * re-probe). Then, over the real model (skipped without it): greedy
 * contexts batched with speculation on give token for token what they give
 * with it off, in a roomy cache and in a tight one that forces chunked
 * prefill, preemption and prefix sharing, with max_new_tokens and stop ids
 * cut exactly; a second round whose prompts are the first round's whole
 * sequences reuses the blocks registered during speculation (a block with
 * an unverified draft's K/V would change its tokens).
 */
#include <math.h>
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
#include "chi2.h"
#include "cpu_backend.h"
#include "generator.h"
#include "model.h"
#include "sampler.h"
#include "spec_lookup.h"
#include "tokenizer.h"
#include "vocab_trie.h"

#define LEN(a) ((int64_t)(sizeof(a) / sizeof((a)[0])))

static void check_chi2(const long *counts, const double *p, int n, long total, int pass) {
    int df;
    double stat = chi2(counts, p, n, total, &df);
    assert_true(df >= 1 && df <= 60);
    double crit = CHI2_999[df - 1];
    print_message("chi2 = %.2f, df = %d, critical(0.001) = %.3f\n", stat, df, crit);
    if (pass) {
        for (int i = 0; i < n; i++)
            if (p[i] == 0 && counts[i] != 0) fail_msg("cell %d has p = 0 but was drawn", i);
        if (!(stat < crit)) fail_msg("chi2 %.2f >= %.3f (df %d)", stat, crit, df);
    } else if (!(stat > crit)) {
        fail_msg("wrong reference not rejected: chi2 %.2f <= %.3f", stat, crit);
    }
}

static void test_propose(void **state) {
    (void)state;
    int32_t out[ZI_SPEC_MAX_DRAFT];
    /* no earlier occurrence of the last token */
    int32_t t0[] = {1, 2, 3, 4};
    assert_int_equal(zi_spec_propose(t0, LEN(t0), 4, out), 0);
    assert_int_equal(zi_spec_propose(t0, 1, 4, out), 0);
    assert_int_equal(zi_spec_propose(t0, LEN(t0), 0, out), 0);
    /* suffix "7 8" occurs at 1..2 (followed by 9 10 11) and "8" alone at 5
     * (followed by 5): the longer match wins */
    int32_t t1[] = {5, 7, 8, 9, 10, 8, 5, 11, 7, 8};
    assert_int_equal(zi_spec_propose(t1, LEN(t1), 3, out), 3);
    assert_int_equal(out[0], 9);
    assert_int_equal(out[1], 10);
    assert_int_equal(out[2], 8);
    /* the draft stops at the end of the tokens */
    int32_t t2[] = {1, 2, 3, 1, 2};
    assert_int_equal(zi_spec_propose(t2, LEN(t2), 8, out), 3);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 2);
    /* equally long matches: the most recent occurrence */
    int32_t t3[] = {4, 5, 1, 4, 5, 2, 4, 5};
    assert_int_equal(zi_spec_propose(t3, LEN(t3), 1, out), 1);
    assert_int_equal(out[0], 2);
    /* a single recurring token is too weak a match (ZI_SPEC_MIN_NGRAM 2) */
    int32_t t6[] = {1, 2, 3, 2};
    assert_int_equal(zi_spec_propose(t6, LEN(t6), 4, out), 0);
    /* a run: the suffix overlaps its earlier occurrence */
    int32_t t4[] = {6, 6, 6, 6, 6, 6};
    assert_int_equal(zi_spec_propose(t4, LEN(t4), 8, out), 1);
    assert_int_equal(out[0], 6);
    /* k is capped at ZI_SPEC_MAX_DRAFT */
    int32_t t5[40];
    for (int i = 0; i < 20; i++) t5[i] = t5[20 + i] = 100 + i;
    assert_int_equal(zi_spec_propose(t5, 22, 100, out), ZI_SPEC_MAX_DRAFT);
    for (int i = 0; i < ZI_SPEC_MAX_DRAFT; i++) assert_int_equal(out[i], 102 + i);
}

static void test_accept(void **state) {
    (void)state;
    int32_t draft[] = {5, 6, 7};
    int32_t all[] = {5, 6, 7, 8}, none[] = {9, 6, 7, 8}, two[] = {5, 6, 1, 8};
    assert_int_equal(zi_spec_accept(draft, 3, all), 3);  /* emits 5 6 7 8 */
    assert_int_equal(zi_spec_accept(draft, 3, none), 0); /* emits 9 */
    assert_int_equal(zi_spec_accept(draft, 3, two), 2);  /* emits 5 6 1 */
    assert_int_equal(zi_spec_accept(draft, 0, all), 0);
}

static void test_adaptive_length(void **state) {
    (void)state;
    zi_spec_state s;
    zi_spec_state_init(&s);
    assert_int_equal(zi_spec_draft_len(&s, 100), ZI_SPEC_START_DRAFT);
    assert_int_equal(zi_spec_draft_len(&s, 2), 2); /* capped by the caller */
    zi_spec_record(&s, 3, 3);                      /* all kept: grows */
    assert_int_equal(zi_spec_draft_len(&s, 100), ZI_SPEC_START_DRAFT + 2);
    for (int i = 0; i < 10; i++) zi_spec_record(&s, s.k, s.k);
    assert_int_equal(zi_spec_draft_len(&s, 100), ZI_SPEC_MAX_DRAFT);
    zi_spec_record(&s, 8, 5); /* some kept: accepted + 1 */
    assert_int_equal(zi_spec_draft_len(&s, 100), 6);
    zi_spec_record(&s, 6, 0); /* none kept: halves */
    assert_int_equal(zi_spec_draft_len(&s, 100), 3);
    zi_spec_record(&s, 3, 0); /* the second failure in a row: a pause */
    for (int i = 0; i < ZI_SPEC_MIN_PAUSE; i++) assert_int_equal(zi_spec_draft_len(&s, 100), 0);
    assert_int_equal(zi_spec_draft_len(&s, 100), ZI_SPEC_START_DRAFT); /* re-probe */
    zi_spec_record(&s, 3, 0); /* a failed re-probe: twice the pause */
    for (int i = 0; i < 2 * ZI_SPEC_MIN_PAUSE; i++) assert_int_equal(zi_spec_draft_len(&s, 100), 0);
    assert_true(zi_spec_draft_len(&s, 100) > 0);
    zi_spec_record(&s, 3, 1); /* less than half kept: still a failure */
    assert_int_equal(zi_spec_draft_len(&s, 100), 0);
    while (zi_spec_draft_len(&s, 100) == 0) {
    }
    zi_spec_record(&s, 2, 1); /* half kept resets the pauses */
    assert_int_equal(s.fails, 0);
    assert_int_equal(s.next_pause, ZI_SPEC_MIN_PAUSE);
    for (int i = 0; i < 100; i++) zi_spec_record(&s, 1, 0);
    assert_true(s.next_pause <= ZI_SPEC_MAX_PAUSE && s.pause <= ZI_SPEC_MAX_PAUSE);
}

/* ---- sampled acceptance: the distribution is the target's -------------- */

#define SV 6         /* a toy vocabulary */
#define NTRIAL 60000 /* seeds */

/* Sampled speculation, driven through the real pieces (zi_sampler_sample
 * draws each row with the uniform of (seed, step), zi_spec_accept keeps
 * what agrees) on a toy two-token "model": p1 for the first token, p2(.|a)
 * after a. The draft is x then y. Over many seeds the pairs emitted match
 * p1(a) p2(b|a) (chi-square), the draft x is accepted with probability
 * p1(x), a rejected first token follows p1 without x renormalised (the
 * residual), and every seed gives the very tokens of plain sampling. A
 * wrong rule (keep the draft always) fails the same test. */
static void test_sampled_distribution(void **state) {
    (void)state;
    zi_error err = {0};
    zi_sampler *s;
    assert_int_equal(zi_sampler_create(&s, SV, &err), ZI_OK);
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.temperature = 1.0;
    sp.top_k = 5; /* token 5, the least likely, is never drawn */
    static float l1[SV] = {0.5f, 1.2f, 0.9f, -0.3f, 0.1f, -1.0f}, l2[SV][SV];
    for (int a = 0; a < SV; a++)
        for (int b = 0; b < SV; b++)
            l2[a][b] = (float)((a * 7 + b * 3) % 5) * 0.4f - (float)b * 0.05f;
    /* the reference: softmax over the top 5 of each row */
    double p1[SV], p2[SV][SV], joint[SV * SV];
    const float *rowsl[SV + 1] = {l1, l2[0], l2[1], l2[2], l2[3], l2[4], l2[5]};
    double *rowsp[SV + 1] = {p1, p2[0], p2[1], p2[2], p2[3], p2[4], p2[5]};
    for (int r = 0; r <= SV; r++) {
        const float *l = rowsl[r];
        int worst = 0; /* the lowest logit, ties: the higher id */
        for (int t = 1; t < SV; t++)
            if (l[t] <= l[worst]) worst = t;
        double z = 0;
        for (int t = 0; t < SV; t++) z += rowsp[r][t] = t == worst ? 0 : exp(l[t]);
        for (int t = 0; t < SV; t++) rowsp[r][t] /= z;
    }
    for (int a = 0; a < SV; a++)
        for (int b = 0; b < SV; b++) joint[a * SV + b] = p1[a] * p2[a][b];
    const int32_t draft[2] = {2, 1}; /* x = 2, y = 1 */
    static long pairs[SV * SV], always[SV * SV], resid[SV];
    long accepted = 0, rejected = 0;
    for (long n = 0; n < NTRIAL; n++) {
        sp.seed = (uint64_t)n * 2654435761u;
        /* the verification: the token's row and the row after draft x */
        zi_sampler_row rows[2] = {{.logits = l1, .params = &sp, .step = 0},
                                  {.logits = l2[draft[0]], .params = &sp, .step = 1}};
        int32_t target[2];
        assert_int_equal(zi_sampler_sample(s, rows, 2, target, &err), ZI_OK);
        int a = zi_spec_accept(draft, 1, target);
        int32_t e0 = target[0], e1;
        if (a == 1) {
            accepted++;
            e1 = target[1];
        } else { /* the next step samples after the emitted token */
            rejected++;
            resid[e0]++;
            zi_sampler_row r1 = {.logits = l2[e0], .params = &sp, .step = 1};
            assert_int_equal(zi_sampler_sample(s, &r1, 1, &e1, &err), ZI_OK);
        }
        pairs[e0 * SV + e1]++;
        always[draft[0] * SV + target[1]]++;
        /* plain sampling, the same seed: the same tokens */
        int32_t plain0, plain1;
        assert_int_equal(zi_sampler_sample(s, &rows[0], 1, &plain0, &err), ZI_OK);
        zi_sampler_row r1 = {.logits = l2[plain0], .params = &sp, .step = 1};
        assert_int_equal(zi_sampler_sample(s, &r1, 1, &plain1, &err), ZI_OK);
        assert_int_equal(plain0, e0);
        assert_int_equal(plain1, e1);
    }
    check_chi2(pairs, joint, SV * SV, NTRIAL, 1);
    check_chi2(always, joint, SV * SV, NTRIAL, 0);
    /* acceptance: p1(x) within 4 standard deviations */
    double px = p1[draft[0]], sd = sqrt(px * (1 - px) / NTRIAL);
    print_message("accepted %.4f, p1(x) %.4f\n", (double)accepted / NTRIAL, px);
    assert_true(fabs((double)accepted / NTRIAL - px) < 4 * sd);
    /* the residual: p1 without x, renormalised */
    double pr[SV];
    for (int t = 0; t < SV; t++) pr[t] = t == draft[0] ? 0 : p1[t] / (1 - px);
    check_chi2(resid, pr, SV, rejected, 1);
    zi_sampling_params_free(&sp);
    zi_sampler_free(s);
}

/* ---- over the real model ------------------------------------------------ */

#define N_PROMPTS 5
/* Tokens per prompt; under AddressSanitizer (several times the cost of a
 * token) 24: the tight cache still preempts, the stop id and the grammars'
 * sentences still fall inside. */
#if defined(__SANITIZE_ADDRESS__)
#define GEN 24
#else
#define GEN 40
#endif

static const char *texts[N_PROMPTS] = {
    ("<|im_start|>user\nRepeat this text exactly: The quick brown fox jumps over the lazy dog. "
     "A journey of a thousand miles begins with a single step.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    ("<|im_start|>user\nFix the bug: def add(a, b):\n    return a - b\n<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "def fibonacci(n):",
};

typedef struct fixture {
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
    /* structured output (test_constrained_same_tokens_on_and_off): when
     * grammars is set, run_with constrains prompt i by grammars[i] (NULL:
     * none), with the tokenizer's EOS */
    zi_grammar_vocab *vocab;
    const char *const *grammars;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char path[4096];
    int rc = zi_test_model_open(&f->be, &f->model, &f->tok, path, sizeof path);
    if (rc <= 0) free(f);
    *state = rc > 0 ? f : NULL;
    return rc < 0 ? -1 : 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    zi_grammar_vocab_free(f->vocab);
    zi_test_model_close(f->be, f->model, f->tok);
    free(f);
    return 0;
}

typedef struct run_out {
    int32_t tok[N_PROMPTS][GEN];
    int64_t n[N_PROMPTS];
    int status[N_PROMPTS];
} run_out;

/* Sets prompt i's sampling parameters beyond the greedy defaults. */
typedef void (*tweak_fn)(zi_sampling_params *sp, int i);

/* Runs the n prompts batched to the end (prompt i gets max_new_tokens
 * GEN - i, and stop id `stop` when >= 0 for odd i, and what tweak sets
 * when not NULL), checking the block pool after every step. */
static void run_with(fixture *f, const zi_generator_config *cfg, int32_t *const *ids,
                     const size_t *n_ids, int n, int32_t stop, tweak_fn tweak, run_out *out,
                     zi_generator_stats *st) {
    zi_error err = {0};
    zi_generator *g;
    assert_int_equal(zi_generator_create(f->model, cfg, &g, &err), ZI_OK);
    if (f->grammars) assert_int_equal(zi_generator_set_grammar_vocab(g, f->vocab, &err), ZI_OK);
    zi_text_context ctx[N_PROMPTS], *live[N_PROMPTS];
    for (int i = 0; i < n; i++) {
        zi_sampling_params sp;
        zi_sampling_params_init(&sp); /* greedy (top_k 1) */
        sp.max_new_tokens = GEN - i;
        if (tweak) tweak(&sp, i);
        assert_int_equal(zi_text_context_init(&ctx[i], ids[i], n_ids[i], 512, &sp, &err), ZI_OK);
        zi_sampling_params_free(&sp);
        if (stop >= 0 && i % 2)
            assert_int_equal(
                zi_i32_list_set(&ctx[i].sampling_params.stop_token_ids, &stop, 1, &err), ZI_OK);
        if (f->grammars && f->grammars[i]) {
            int32_t eos = zi_tokenizer_eos(f->tok);
            assert_int_equal(
                zi_string_set(&ctx[i].grammar, f->grammars[i], strlen(f->grammars[i]), &err),
                ZI_OK);
            assert_int_equal(zi_i32_list_set(&ctx[i].eos_token_ids, &eos, 1, &err), ZI_OK);
            if (zi_generator_check_constraint(g, &ctx[i], &err)) fail_msg("%s", err.msg);
        }
        live[i] = &ctx[i];
    }
    size_t n_live = (size_t)n;
    for (int rounds = 0; n_live > 0 && rounds < 4000; rounds++) {
        if (zi_generator_next_token(g, live, n_live, 1, &err)) fail_msg("%s", err.msg);
        if (zi_generator_check(g, &err)) fail_msg("%s", err.msg);
        n_live = zi_test_drop_done(g, live, n_live);
    }
    assert_int_equal(n_live, 0);
    for (int i = 0; i < n; i++) {
        out->n[i] = zi_text_context_generated_count(&ctx[i]);
        assert_true(out->n[i] <= GEN - i); /* max_new_tokens, never more */
        memset(out->tok[i], 0, sizeof out->tok[i]);
        memcpy(out->tok[i], zi_text_context_generated_tokens(&ctx[i]),
               (size_t)out->n[i] * sizeof(int32_t));
        out->status[i] = ctx[i].status;
        zi_text_context_free(&ctx[i]);
    }
    zi_generator_get_stats(g, st);
    assert_int_equal(st->kv_used, 0);
    zi_generator_free(g);
}

static void run(fixture *f, const zi_generator_config *cfg, int32_t *const *ids,
                const size_t *n_ids, int n, int32_t stop, run_out *out, zi_generator_stats *st) {
    run_with(f, cfg, ids, n_ids, n, stop, NULL, out, st);
}

static void compare(const run_out *a, const run_out *b, int n) {
    for (int i = 0; i < n; i++) {
        assert_int_equal(a->n[i], b->n[i]);
        assert_int_equal(a->status[i], b->status[i]);
        assert_memory_equal(a->tok[i], b->tok[i], sizeof a->tok[i]);
    }
}

static void test_same_tokens_on_and_off(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        assert_int_equal(
            zi_tokenizer_encode(f->tok, texts[i], strlen(texts[i]), 1, 1, &ids[i], &n_ids[i], &err),
            ZI_OK);
    zi_generator_config roomy = {
        .n_slots = N_PROMPTS, .ctx = 512, .max_batch_tokens = 256, .prefix_cache = 1};
    /* 16 blocks of 8 positions for 5 sequences of up to ~80: preemption,
     * chunked prefill and a step budget that cuts drafts */
    zi_generator_config tight = {.n_slots = N_PROMPTS,
                                 .ctx = 128,
                                 .max_batch_tokens = 20,
                                 .kv_blocks = 16,
                                 .block_size = 8,
                                 .prefill_chunk = 8,
                                 .prefix_cache = 1};
    static run_out off, on;
    zi_generator_stats st;
    run(f, &roomy, ids, n_ids, N_PROMPTS, -1, &off, &st);
    assert_int_equal(st.spec_steps, 0);
    roomy.spec_lookup = 1;
    run(f, &roomy, ids, n_ids, N_PROMPTS, -1, &on, &st);
    compare(&off, &on, N_PROMPTS);
    printf("roomy: %llu verifications, %llu drafted, %llu accepted\n",
           (unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
           (unsigned long long)st.spec_accepted);
    assert_true(st.spec_accepted > 0);
    for (int i = 0; i < N_PROMPTS; i++) assert_int_equal(off.n[i], GEN - i); /* no EOS here */

    tight.spec_lookup = 1;
    run(f, &tight, ids, n_ids, N_PROMPTS, -1, &on, &st);
    compare(&off, &on, N_PROMPTS);
    printf("tight: %llu verifications, %llu accepted, %llu preemptions\n",
           (unsigned long long)st.spec_steps, (unsigned long long)st.spec_accepted,
           (unsigned long long)st.preemptions);
    assert_true(st.spec_accepted > 0 && st.preemptions > 0);

    /* a stop id: the first occurrence ends the sequence either way */
    int32_t stop = off.tok[1][7];
    roomy.spec_lookup = 0;
    run(f, &roomy, ids, n_ids, N_PROMPTS, stop, &off, &st);
    roomy.spec_lookup = 1;
    run(f, &roomy, ids, n_ids, N_PROMPTS, stop, &on, &st);
    compare(&off, &on, N_PROMPTS);
    assert_int_equal(on.status[1], ZI_GEN_STOP);
    assert_true(on.n[1] <= 8 && on.tok[1][on.n[1] - 1] == stop);

    /* Round 2 over one generator: the prompts are round 1's sequences, so
     * a prefix match takes blocks registered while drafts were verified. */
    zi_generator_config shared = roomy;
    shared.block_size = 4;
    for (int s = 0; s < 2; s++) {
        shared.spec_lookup = s;
        zi_generator *g;
        assert_int_equal(zi_generator_create(f->model, &shared, &g, &err), ZI_OK);
        int32_t toks[2][GEN * 3];
        for (int r = 0; r < 2; r++) {
            zi_text_context c;
            zi_sampling_params sp;
            zi_sampling_params_init(&sp);
            sp.max_new_tokens = GEN;
            int32_t *p = r ? toks[0] : ids[0];
            size_t np = r ? n_ids[0] + GEN : n_ids[0];
            if (r) { /* round 1's whole sequence */
                memcpy(toks[0], ids[0], n_ids[0] * sizeof(int32_t));
                memcpy(toks[0] + n_ids[0], toks[1], GEN * sizeof(int32_t));
            }
            assert_int_equal(zi_text_context_init(&c, p, np, 512, &sp, &err), ZI_OK);
            zi_text_context *one[1] = {&c};
            while (!zi_text_context_is_done(&c))
                assert_int_equal(zi_generator_next_token(g, one, 1, 1, &err), ZI_OK);
            assert_int_equal(zi_text_context_generated_count(&c), GEN);
            if (!r)
                memcpy(toks[1], zi_text_context_generated_tokens(&c), GEN * sizeof(int32_t));
            else {
                static int32_t second[2][GEN];
                memcpy(second[s], zi_text_context_generated_tokens(&c), GEN * sizeof(int32_t));
                if (s) assert_memory_equal(second[0], second[1], sizeof second[0]);
            }
            zi_generator_release(g, &c);
            zi_text_context_free(&c);
            zi_sampling_params_free(&sp);
        }
        zi_generator_stats gs;
        zi_generator_get_stats(g, &gs);
        assert_true(gs.prefix_hit_tokens >= (uint64_t)n_ids[0]); /* round 2 found round 1's */
        if (s) assert_true(gs.spec_accepted > 0);
        zi_generator_free(g);
    }
    for (int i = 0; i < N_PROMPTS; i++) free(ids[i]);
}

/* Seeded sampling: temperature, top_p, min_p; the rows after each draft
 * draw with the uniform the token would get without speculation. */
static void tweak_sampled(zi_sampling_params *sp, int i) {
    sp->top_k = 0;
    sp->temperature = 0.3 + 0.2 * i;
    sp->top_p = i % 2 ? 0.9 : 1.0;
    sp->min_p = i == 2 ? 0.05 : 0.0;
    sp->seed = 1234 + (uint64_t)i;
}

/* Sampled requests batched with speculation on give, seed for seed, the
 * tokens they give with it off (the acceptance rule uses the same draws:
 * test_sampled_distribution), and drafts get accepted. */
static void test_sampled_same_tokens_on_and_off(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        assert_int_equal(
            zi_tokenizer_encode(f->tok, texts[i], strlen(texts[i]), 1, 1, &ids[i], &n_ids[i], &err),
            ZI_OK);
    zi_generator_config cfg = {
        .n_slots = N_PROMPTS, .ctx = 512, .max_batch_tokens = 256, .prefix_cache = 1};
    static run_out off, on;
    zi_generator_stats st;
    run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tweak_sampled, &off, &st);
    cfg.spec_lookup = 1;
    run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tweak_sampled, &on, &st);
    compare(&off, &on, N_PROMPTS);
    printf("sampled: %llu verifications, %llu drafted, %llu accepted\n",
           (unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
           (unsigned long long)st.spec_accepted);
    assert_true(st.spec_accepted > 0);
    for (int i = 0; i < N_PROMPTS; i++) free(ids[i]);
}

/* Penalties, a logit bias and min_new_tokens, greedy (even i) and
 * sampled (odd i): each verification row sees the drafts before it as
 * generated, and the EOS mask while min_new_tokens is not reached. */
static void tweak_penalised(zi_sampling_params *sp, int i) {
    if (i % 2) {
        sp->top_k = 40;
        sp->temperature = 0.5;
        sp->seed = 99 + (uint64_t)i;
    }
    sp->repetition_penalty = 1.05 + 0.05 * (i % 3);
    sp->frequency_penalty = i == 1 ? 0.0 : 0.1 * i;
    sp->presence_penalty = i == 3 ? 0.3 : 0.0;
    sp->min_new_tokens = 5 * i;
    sp->logit_bias.v = calloc(2, sizeof *sp->logit_bias.v);
    assert_non_null(sp->logit_bias.v);
    sp->logit_bias.v[0] = (zi_token_bias){.id = 13, .bias = 1.5f}; /* a newline */
    sp->logit_bias.v[1] = (zi_token_bias){.id = 30, .bias = -2.0f};
    sp->logit_bias.n = 2;
}

static void test_penalised_same_tokens_on_and_off(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        assert_int_equal(
            zi_tokenizer_encode(f->tok, texts[i], strlen(texts[i]), 1, 1, &ids[i], &n_ids[i], &err),
            ZI_OK);
    zi_generator_config cfg = {
        .n_slots = N_PROMPTS, .ctx = 512, .max_batch_tokens = 256, .prefix_cache = 1};
    static run_out off, on;
    zi_generator_stats st;
    run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tweak_penalised, &off, &st);
    cfg.spec_lookup = 1;
    run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tweak_penalised, &on, &st);
    compare(&off, &on, N_PROMPTS);
    printf("penalised: %llu verifications, %llu drafted, %llu accepted\n",
           (unsigned long long)st.spec_steps, (unsigned long long)st.spec_drafted,
           (unsigned long long)st.spec_accepted);
    assert_true(st.spec_accepted > 0);
    for (int i = 0; i < N_PROMPTS; i++) free(ids[i]);
}

/* Structured output: each verification row is masked by the grammar after
 * the drafts before it, and drafts the grammar refuses are cut before they
 * are fed. Grammars that refuse some of what the prompts repeat (a letter,
 * a digit, a minus sign: the lookup drafts copy them), one that must end
 * (EOS), one that cuts the text short of max_new_tokens (the budget of
 * each row); greedy and seeded sampled: the same tokens on and off. */
static const char *const grammars[N_PROMPTS] = {
    "root ::= [^qz]*",
    "root ::= ([0-9]+ \", \")* [0-9] [0-9]?",
    "root ::= \"The capital of France is \" [A-Z] [a-z]+ \".\"",
    "root ::= [^-]*",
    NULL,
};

static void test_constrained_same_tokens_on_and_off(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    if (!f->vocab)
        assert_int_equal(zi_grammar_vocab_create(zi_tokenizer_vocab_size(f->tok),
                                                 zi_tokenizer_constraint_bytes, f->tok, &f->vocab,
                                                 &err),
                         ZI_OK);
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++)
        assert_int_equal(
            zi_tokenizer_encode(f->tok, texts[i], strlen(texts[i]), 1, 1, &ids[i], &n_ids[i], &err),
            ZI_OK);
    f->grammars = grammars;
    for (int sampled = 0; sampled < 2; sampled++) {
        zi_generator_config cfg = {
            .n_slots = N_PROMPTS, .ctx = 512, .max_batch_tokens = 256, .prefix_cache = 1};
        static run_out off, on;
        zi_generator_stats st;
        tweak_fn tw = sampled ? tweak_sampled : NULL;
        run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tw, &off, &st);
        cfg.spec_lookup = 1;
        run_with(f, &cfg, ids, n_ids, N_PROMPTS, -1, tw, &on, &st);
        compare(&off, &on, N_PROMPTS);
        printf("constrained%s: %llu verifications, %llu drafted, %llu accepted\n",
               sampled ? ", sampled" : "", (unsigned long long)st.spec_steps,
               (unsigned long long)st.spec_drafted, (unsigned long long)st.spec_accepted);
        assert_true(st.spec_accepted > 0);
        /* the grammar's sentence, then EOS */
        assert_int_equal(off.status[2], ZI_GEN_END_OF_SEQUENCE);
    }
    f->grammars = NULL;
    for (int i = 0; i < N_PROMPTS; i++) free(ids[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_propose),
        cmocka_unit_test(test_accept),
        cmocka_unit_test(test_adaptive_length),
        cmocka_unit_test(test_sampled_distribution),
        cmocka_unit_test(test_same_tokens_on_and_off),
        cmocka_unit_test(test_sampled_same_tokens_on_and_off),
        cmocka_unit_test(test_penalised_same_tokens_on_and_off),
        cmocka_unit_test(test_constrained_same_tokens_on_and_off),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
