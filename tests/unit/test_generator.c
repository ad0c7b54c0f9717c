/*
 * test_generator.c - continuous batching over the real model.
 *
 * Every prompt generated alone (greedy, or sampled with a seed and
 * penalties; one with echoed log probabilities) must give exactly the tokens
 * and log probabilities it gets when it shares steps with others that join
 * and leave at different times, under a step budget small enough to force
 * chunked prefill; direct forward passes over a fixed cache (zi_kv_fixed)
 * give the same greedy tokens; contexts held to an OuteTTS codec plan
 * (codec_mask.h) too. Needs the default model ($ZINFER_MODEL or
 * the downloaded one); skipped without it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "model_fixture.h"

#include "args.h"
#include "codec_mask.h"
#include "cpu_backend.h"
#include "generator.h"
#include "kv_fixed.h"
#include "model.h"
#include "tokenizer.h"

#define N_PROMPTS 5
#define GEN 12
#define ECHO 3 /* the prompt whose log probabilities are echoed */

static const char *texts[N_PROMPTS] = {
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):",
    "The quick brown fox",
    ("<|im_start|>user\nList three colors, one per line, and explain why the sky looks blue "
     "during the day but red at sunset.<|im_end|>\n<|im_start|>assistant\n"),
    "1, 2, 3, 4,",
};

typedef struct fixture {
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
    int32_t *ids[N_PROMPTS];
    size_t n_ids[N_PROMPTS];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char path[4096];
    int rc = zi_test_model_open(&f->be, &f->model, &f->tok, path, sizeof path);
    if (rc == 1 && zi_test_encode_all(f->tok, texts, N_PROMPTS, f->ids, f->n_ids)) rc = -1;
    if (rc <= 0) free(f);
    *state = rc > 0 ? f : NULL;
    return rc < 0 ? -1 : 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    for (int i = 0; i < N_PROMPTS; i++) free(f->ids[i]);
    zi_test_model_close(f->be, f->model, f->tok);
    free(f);
    return 0;
}

static void new_context(fixture *f, int i, zi_text_context *c) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = GEN;
    sp.ignore_eos = true;
    if (i % 2) { /* sampled, seeded, penalised: must not depend on the batch either */
        sp.temperature = 0.9;
        sp.top_k = 0;
        sp.top_p = 0.95;
        sp.repetition_penalty = 1.1;
        sp.seed = 1000 + (uint64_t)i;
    }
    zi_error err = {0};
    assert_int_equal(zi_text_context_init(c, f->ids[i], f->n_ids[i], 256, &sp, &err), ZI_OK);
    if (i == ECHO) { /* log probabilities of the prompt and of the output */
        c->log_probabilities = 3;
        c->log_probabilities_echo = true;
    }
    zi_sampling_params_free(&sp);
}

/* Each prompt's GEN tokens (and ECHO's log probabilities) generated alone. */
static int32_t g_alone[N_PROMPTS][GEN];

static void test_batched_equals_alone(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int32_t alone[N_PROMPTS][GEN];
    float alone_lp[256]; /* ECHO's token log probabilities, by index */
    size_t n_lp = 0;

    zi_generator *g1;
    zi_generator_config c1 = {.n_slots = 1, .ctx = 256, .max_batch_tokens = 512};
    assert_int_equal(zi_generator_create(f->model, &c1, &g1, &err), ZI_OK);
    for (int i = 0; i < N_PROMPTS; i++) {
        zi_text_context c;
        new_context(f, i, &c);
        zi_text_context *b[1] = {&c};
        assert_int_equal(zi_generator_next_token(g1, b, 1, GEN + 5, &err), ZI_OK);
        assert_int_equal(c.status, ZI_GEN_MAXIMUM_LENGTH);
        assert_int_equal(zi_text_context_generated_count(&c), GEN);
        memcpy(alone[i], zi_text_context_generated_tokens(&c), sizeof alone[i]);
        if (i == ECHO) {
            n_lp = (size_t)c.end_idx;
            assert_null(c.lp_data[0]);
            for (size_t k = 1; k < n_lp; k++) {
                assert_non_null(c.lp_data[k]);
                assert_int_equal(c.lp_data[k]->top[0].n, 3);
                alone_lp[k] = c.lp_data[k]->token_logprobs[0];
                assert_true(alone_lp[k] <= 0.0f);
            }
        } else {
            assert_null(c.lp_data[c.end_idx - 1]);
        }
        zi_generator_release(g1, &c);
        assert_int_equal(zi_generator_slots_used(g1), 0);
        zi_text_context_free(&c);
    }
    zi_generator_free(g1);

    /* Together: 5 slots, a 7-token step budget (long prompts are cut into
     * chunks and share steps with decodes); contexts 0-1 start, 2-4 join
     * after 3 steps, and each leaves (is released) as soon as it is done. */
    zi_generator *g;
    zi_generator_config c5 = {.n_slots = N_PROMPTS, .ctx = 256, .max_batch_tokens = 7};
    assert_int_equal(zi_generator_create(f->model, &c5, &g, &err), ZI_OK);
    zi_text_context ctx[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) new_context(f, i, &ctx[i]);
    zi_text_context *live[N_PROMPTS];
    size_t n_live = 2;
    live[0] = &ctx[0];
    live[1] = &ctx[1];
    assert_int_equal(zi_generator_next_token(g, live, n_live, 3, &err), ZI_OK);
    for (int i = 2; i < N_PROMPTS; i++) live[n_live++] = &ctx[i];
    int rounds = 0;
    while (n_live > 0 && rounds++ < 200) {
        assert_int_equal(zi_generator_next_token(g, live, n_live, 1, &err), ZI_OK);
        n_live = zi_test_drop_done(g, live, n_live);
    }
    assert_int_equal(n_live, 0);
    assert_int_equal(zi_generator_slots_used(g), 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(zi_text_context_generated_count(&ctx[i]), GEN);
        assert_memory_equal(zi_text_context_generated_tokens(&ctx[i]), alone[i], sizeof alone[i]);
        memcpy(g_alone[i], alone[i], sizeof alone[i]);
        if (i == ECHO) /* chunked prefill kept every prompt position's logits too */
            for (size_t k = 1; k < n_lp; k++)
                assert_true(ctx[i].lp_data[k]->token_logprobs[0] == alone_lp[k]);
        zi_text_context_free(&ctx[i]);
    }
    zi_generator_free(g);
}

/* An OuteTTS codec plan (codec_mask.h) on two contexts, one greedy and one
 * sampled, beside a plain one: each token is one the plan allows, and each
 * context gets the same tokens alone and batched (the mask is the
 * sequence's own). Made-up marker ids in the model's vocabulary: the
 * generator does not care what the tokens mean. */
static void test_codec_plan_batched(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    const zi_codec_ids ids = {.code0 = 1000,
                              .n_codes = 500,
                              .time0 = 2000,
                              .n_times = 100,
                              .code_start = 5,
                              .code_end = 6,
                              .newline = 198,
                              .audio_end = 7};
    const int32_t w0[] = {300, 301}, w1[] = {302};
    const int32_t *words[] = {w0, w1};
    const size_t nw[] = {2, 1};
    zi_codec_plan *plan;
    assert_int_equal(zi_codec_plan_create(&ids, words, nw, 2, &plan, &err), ZI_OK);
    enum { N = 3, LEN = 40 };
    int32_t alone[N][LEN];
    int64_t n_alone[N];
    zi_text_context ctx[N];
    for (int round = 0; round < 2; round++) {
        zi_generator *g;
        zi_generator_config cfg = {.n_slots = N, .ctx = 256, .max_batch_tokens = round ? 7 : 512};
        assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
        for (int i = 0; i < N; i++) {
            zi_sampling_params sp;
            zi_sampling_params_init(&sp);
            sp.max_new_tokens = LEN;
            if (i == 1) sp.temperature = 1.0, sp.top_k = 0, sp.seed = 99;
            assert_int_equal(zi_text_context_init(&ctx[i], f->ids[i], f->n_ids[i], 256, &sp, &err),
                             ZI_OK);
            zi_sampling_params_free(&sp);
            if (i < 2) {
                ctx[i].codec_plan = plan;
                assert_int_equal(zi_text_context_set_eos(&ctx[i], &ids.audio_end, 1, &err), ZI_OK);
            }
        }
        zi_text_context *live[N];
        size_t n_live = 0;
        for (int i = 0; i < N; i++) {
            if (!round) { /* alone: one at a time */
                zi_text_context *b[1] = {&ctx[i]};
                while (!zi_text_context_is_done(&ctx[i]))
                    assert_int_equal(zi_generator_next_token(g, b, 1, 1, &err), ZI_OK);
                zi_generator_release(g, &ctx[i]);
            } else {
                live[n_live++] = &ctx[i];
            }
        }
        for (int r = 0; n_live > 0 && r < 400; r++) {
            assert_int_equal(zi_generator_next_token(g, live, n_live, 1, &err), ZI_OK);
            n_live = zi_test_drop_done(g, live, n_live);
        }
        assert_int_equal(n_live, 0);
        int32_t *m = malloc(((size_t)zi_model_get_config(f->model)->n_vocab + 31) / 32 * 4);
        for (int i = 0; i < N; i++) {
            int64_t n = zi_text_context_generated_count(&ctx[i]);
            const int32_t *t = zi_text_context_generated_tokens(&ctx[i]);
            if (!round) {
                n_alone[i] = n;
                memcpy(alone[i], t, (size_t)n * sizeof *t);
            } else {
                assert_int_equal(n, n_alone[i]);
                assert_memory_equal(t, alone[i], (size_t)n * sizeof *t);
            }
            for (int64_t k = 0; i < 2 && k < n; k++) { /* every token in the plan's mask */
                zi_codec_plan_mask(plan, t, (size_t)k, zi_model_get_config(f->model)->n_vocab, m);
                assert_true((uint32_t)m[t[k] >> 5] >> (t[k] & 31) & 1u);
            }
            if (i < 2) { /* the forced start: word 0, a duration, <|code_start|>, a code */
                assert_true(n >= 5);
                assert_int_equal(t[0], 300);
                assert_int_equal(t[1], 301);
                assert_true(t[2] >= 2000 && t[2] < 2100);
                assert_int_equal(t[3], 5);
                assert_true(t[4] >= 1000 && t[4] < 1500);
            }
            zi_text_context_free(&ctx[i]);
        }
        free(m);
        zi_generator_free(g);
    }
    zi_codec_plan_free(plan);
}

static void test_slots(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 1, .ctx = 64, .max_batch_tokens = 64};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    zi_text_context a, b;
    new_context(f, 1, &a);
    new_context(f, 2, &b);
    zi_text_context *both[2] = {&a, &b};
    assert_int_equal(zi_generator_next_token(g, both, 2, 1, &err), ZI_EINVAL); /* 2 > 1 slot */
    zi_text_context *one[1] = {&a};
    assert_int_equal(zi_generator_next_token(g, one, 1, 1, &err), ZI_OK);
    one[0] = &b;
    assert_int_equal(zi_generator_next_token(g, one, 1, 1, &err), ZI_ENOMEM);
    assert_non_null(strstr(err.msg, "no free KV-cache slot"));
    assert_int_equal(zi_text_context_generated_count(&b), 0); /* nothing ran */
    zi_generator_release(g, &a);
    zi_text_context_free(&a);
    zi_text_context_free(&b);
    zi_generator_free(g);
}

/* A pool too small for every sequence at once (preemption) with prefix
 * caching, two rounds of the same prompts (the second finds their blocks
 * cached): every context still gets exactly its tokens alone, and the
 * pool's invariant holds after every step. */
static void test_paged_preemption_and_prefix(void **state) {
    fixture *f = *state;
    if (!f) skip();
    if (g_alone[0][0] == 0 && g_alone[0][1] == 0) skip(); /* needs the first test */
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 2 * N_PROMPTS,
                               .ctx = 128,
                               .max_batch_tokens = 24,
                               .kv_blocks = 8, /* 128 positions for ~10 sequences */
                               .block_size = 16,
                               .prefill_chunk = 8,
                               .prefix_cache = 1};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    zi_generator_stats st;
    for (int round = 0; round < 2; round++) {
        zi_text_context ctx[2 * N_PROMPTS];
        zi_text_context *live[2 * N_PROMPTS];
        size_t n_live = 0;
        for (int i = 0; i < 2 * N_PROMPTS; i++) {
            if (i % N_PROMPTS == ECHO) continue;
            new_context(f, i % N_PROMPTS, &ctx[i]);
            live[n_live++] = &ctx[i];
        }
        size_t all = n_live;
        zi_text_context *keep[2 * N_PROMPTS];
        memcpy(keep, live, sizeof live);
        int rounds = 0;
        while (n_live > 0 && rounds++ < 2000) {
            assert_int_equal(zi_generator_next_token(g, live, n_live, 1, &err), ZI_OK);
            if (zi_generator_check(g, &err)) fail_msg("%s", err.msg);
            zi_generator_get_stats(g, &st);
            assert_int_equal(st.kv_blocks, 8); /* the pool is the budget: it never grows */
            n_live = zi_test_drop_done(g, live, n_live);
        }
        assert_int_equal(n_live, 0);
        for (size_t j = 0; j < all; j++) {
            int i = (int)(keep[j] - ctx) % N_PROMPTS;
            assert_int_equal(zi_text_context_generated_count(keep[j]), GEN);
            assert_memory_equal(zi_text_context_generated_tokens(keep[j]), g_alone[i],
                                sizeof g_alone[i]);
            zi_text_context_free(keep[j]);
        }
    }
    zi_generator_get_stats(g, &st);
    printf("paged: %llu preemptions, prefix cache %llu of %llu prompt tokens, %llu evictions\n",
           (unsigned long long)st.preemptions, (unsigned long long)st.prefix_hit_tokens,
           (unsigned long long)st.prefix_query_tokens, (unsigned long long)st.evictions);
    assert_true(st.preemptions > 0);
    assert_true(st.prefix_hit_tokens > 0);
    assert_int_equal(st.kv_used, 0);
    zi_generator_free(g);
}

/* Greedy GEN tokens of prompt ids[0..n) through g, into out. */
static void run_one(zi_generator *g, const int32_t *ids, size_t n, int32_t *out) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = GEN;
    sp.ignore_eos = true;
    zi_error err = {0};
    zi_text_context c;
    assert_int_equal(zi_text_context_init(&c, ids, n, 128, &sp, &err), ZI_OK);
    zi_text_context *b[1] = {&c};
    for (int i = 0; i < 200 && c.status == ZI_GEN_ACTIVE; i++) {
        assert_int_equal(zi_generator_next_token(g, b, 1, 1, &err), ZI_OK);
        if (zi_generator_check(g, &err)) fail_msg("%s", err.msg);
    }
    assert_int_equal(zi_text_context_generated_count(&c), GEN);
    memcpy(out, zi_text_context_generated_tokens(&c), GEN * sizeof *out);
    zi_generator_release(g, &c);
    zi_text_context_free(&c);
    zi_sampling_params_free(&sp);
}

static zi_generator *disk_gen(fixture *f, int kv_blocks, const char *dir, const char *tag) {
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 1,
                               .ctx = 128,
                               .max_batch_tokens = 64,
                               .kv_blocks = kv_blocks,
                               .block_size = 16,
                               .prefix_cache = 1};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    if (dir && zi_generator_open_kv_disk(g, dir, 1 << 30, tag, NULL, &err)) fail_msg("%s", err.msg);
    return g;
}

/* The disk tier (kv_disk.h): a pool too small to keep a prompt's blocks
 * cached reads them back from disk, a new generator on the same directory
 * (a restarted worker) finds every one there, and another KV tag none;
 * the tokens are the cold run's every time. */
static void test_kv_disk_tier(void **state) {
    fixture *f = *state;
    if (!f) skip();
    char dir[64]; /* this process's and this moment's: mkdir fails on a stale one */
    snprintf(dir, sizeof dir, "/tmp/zi_gen_kv_disk_%d_%lld", (int)getpid(), (long long)time(NULL));
    assert_int_equal(mkdir(dir, 0700), 0);
    /* a 100-token prompt (6 blocks a lookup may take), and a filler */
    int32_t prompt[100], filler[100], want[GEN], got[GEN], scratch[GEN];
    size_t n = 0;
    for (int i = 0; n < 100; i = (i + 1) % N_PROMPTS)
        for (size_t k = 0; k < f->n_ids[i] && n < 100; k++) prompt[n++] = f->ids[i][k];
    for (size_t k = 0; k < 100; k++) filler[k] = prompt[99 - k];
    zi_generator *g = disk_gen(f, 0, NULL, NULL);
    run_one(g, prompt, 100, want);
    zi_generator_free(g);

    g = disk_gen(f, 8, dir, "test"); /* 8 blocks: one sequence's worth */
    run_one(g, prompt, 100, got);
    assert_memory_equal(got, want, sizeof want);
    run_one(g, filler, 100, scratch); /* evicts the prompt's blocks */
    run_one(g, prompt, 100, got);
    assert_memory_equal(got, want, sizeof want);
    zi_generator_stats st;
    zi_generator_get_stats(g, &st);
    printf("disk tier, small pool: %llu blocks from memory, %llu from disk (%llu us), %llu "
           "written (%llu us in the steps' copies, %llu us writing)\n",
           (unsigned long long)st.mem_hit_blocks, (unsigned long long)st.disk_hit_blocks,
           (unsigned long long)st.disk_read_us, (unsigned long long)st.disk_written_blocks,
           (unsigned long long)st.disk_queue_us, (unsigned long long)st.disk_write_us);
    /* the filler left the first block cached (released last) */
    assert_int_equal(st.mem_hit_blocks + st.disk_hit_blocks, 6);
    assert_true(st.disk_hit_blocks >= 5);
    assert_int_equal(st.disk_rejected, 0);
    zi_generator_free(g); /* writes what is queued */

    g = disk_gen(f, 0, dir, "test");
    run_one(g, prompt, 100, got);
    assert_memory_equal(got, want, sizeof want);
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.disk_hit_blocks, 6);
    assert_int_equal(st.mem_hit_blocks, 0);
    assert_int_equal(st.prefix_hit_tokens, 96);
    zi_generator_free(g);

    g = disk_gen(f, 0, dir, "other"); /* another KV type: none of those files */
    run_one(g, prompt, 100, got);
    assert_memory_equal(got, want, sizeof want);
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.disk_hit_blocks, 0);
    assert_int_equal(st.disk_miss_blocks, 1);
    zi_generator_free(g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

/* num_steps > 1 gives the tokens of num_steps single steps, stops at the
 * stop conditions (here a stop token id) and does not feed a done context. */
static void test_multi_step(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 2, .ctx = 256, .max_batch_tokens = 64};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    zi_text_context a, b;
    new_context(f, 1, &a);
    new_context(f, 1, &b);
    zi_text_context *one[1] = {&a};
    for (int s = 0; s < GEN; s++) assert_int_equal(zi_generator_next_token(g, one, 1, 1, &err), 0);
    one[0] = &b;
    assert_int_equal(zi_generator_next_token(g, one, 1, 4, &err), ZI_OK);
    assert_int_equal(zi_text_context_generated_count(&b), 4);
    assert_int_equal(zi_generator_next_token(g, one, 1, 100, &err), ZI_OK);
    assert_int_equal(b.status, ZI_GEN_MAXIMUM_LENGTH);
    assert_memory_equal(zi_text_context_generated_tokens(&a), zi_text_context_generated_tokens(&b),
                        GEN * sizeof(int32_t));
    int32_t stop = zi_text_context_generated_tokens(&a)[5];
    zi_generator_release(g, &b);
    zi_text_context_free(&b);
    new_context(f, 1, &b);
    assert_int_equal(zi_i32_list_set(&b.sampling_params.stop_token_ids, &stop, 1, &err), ZI_OK);
    assert_int_equal(zi_generator_next_token(g, one, 1, 100, &err), ZI_OK);
    assert_int_equal(b.status, ZI_GEN_STOP);
    int64_t n = zi_text_context_generated_count(&b);
    assert_true(n <= 6 && zi_text_context_generated_tokens(&b)[n - 1] == stop);
    zi_generator_release(g, &a);
    zi_generator_release(g, &b);
    zi_text_context_free(&a);
    zi_text_context_free(&b);
    zi_generator_free(g);
}

/* A burst of prompts beside one running decode is fed at the pace of
 * prompt-only steps: with the adaptive chunk (prefill_chunk 0) each waiting
 * prompt gets a decode step's time, and before any decode-only step is
 * measured that is 16 prompt tokens each, so 8 waiting prompts get 128
 * tokens in the first step beside the decode (16 in all, before: they
 * trickled in). Oldest first: the first prompts enter whole. */
static void test_burst_prefill(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 9, .ctx = 256, .max_batch_tokens = 256};
    assert_true(8 * f->n_ids[3] > 16 * 8);
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    zi_text_context c[9], *live[9];
    zi_sampling_params sp;
    zi_sampling_params_init(&sp); /* greedy */
    sp.max_new_tokens = GEN;
    for (int i = 0; i < 9; i++) { /* the longest prompt (~40 tokens): 8 of them exceed 128 */
        assert_int_equal(zi_text_context_init(&c[i], f->ids[3], f->n_ids[3], 256, &sp, &err),
                         ZI_OK);
        live[i] = &c[i];
    }
    zi_sampling_params_free(&sp);
    assert_int_equal(zi_generator_next_token(g, live, 1, 1, &err), ZI_OK); /* prompt-only */
    assert_int_equal(zi_text_context_generated_count(&c[0]), 1);
    assert_int_equal(zi_generator_next_token(g, live, 9, 1, &err), ZI_OK);
    zi_generator_stats st;
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.prefill_chunk, 16 * 8);
    int64_t fed = 0, left = 16 * 8;
    for (int i = 1; i < 9; i++) {
        int64_t n = (int64_t)c[i].start_idx, want = (int64_t)f->n_ids[3];
        fed += n;
        assert_int_equal(n, want < left ? want : left); /* oldest first, whole while it lasts */
        left -= n;
    }
    assert_int_equal(fed, 16 * 8);
    assert_int_equal(zi_text_context_generated_count(&c[0]), 2);
    for (int i = 0; i < 9; i++) {
        zi_generator_release(g, &c[i]);
        zi_text_context_free(&c[i]);
    }
    zi_generator_free(g);
}

/* The one KV mode from outside the generator: direct forward passes over a
 * fixed cache (zi_kv_fixed, what `zinfer logits` and `bench` use), greedy
 * by argmax, give the generator's greedy tokens. */
static void test_fixed_cache_equals_generator(void **state) {
    fixture *f = *state;
    if (!f) skip();
    if (g_alone[0][0] == 0 && g_alone[0][1] == 0) skip(); /* needs the first test */
    zi_error err = {0};
    int V = zi_model_get_config(f->model)->n_vocab;
    zi_kv_fixed kv;
    assert_int_equal(zi_kv_fixed_create(f->model, 2, 256, &kv, &err), ZI_OK);
    assert_int_equal(kv.n_seqs, 2);
    assert_int_equal(kv.stride, 256 / ZI_KV_FIXED_BLOCK);
    int n = (int)f->n_ids[0];
    int32_t pos[256], seq[256];
    float *lg = malloc(sizeof(float) * (size_t)V);
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 1; /* the second sequence's blocks */
    zi_batch b = {.n_tokens = n, .tokens = f->ids[0], .pos = pos, .seq = seq};
    zi_kv_fixed_use(&kv, &b);
    assert_int_equal(zi_model_forward(f->model, kv.kv, &b, lg, &err), ZI_OK);
    for (int g = 0; g < GEN; g++) {
        int32_t best = 0;
        for (int i = 1; i < V; i++)
            if (lg[i] > lg[best]) best = i;
        assert_int_equal(best, g_alone[0][g]);
        int32_t p = n + g;
        zi_batch d = {.n_tokens = 1, .tokens = &best, .pos = &p, .seq = seq};
        zi_kv_fixed_use(&kv, &d);
        assert_int_equal(zi_model_forward(f->model, kv.kv, &d, lg, &err), ZI_OK);
    }
    b.block_tables = NULL; /* every batch carries its tables */
    assert_int_equal(zi_model_forward(f->model, kv.kv, &b, lg, &err), ZI_EINVAL);
    free(lg);
    zi_kv_fixed_free(&kv);
}

/* sample_vocab: draws stay below it (a model's padded rows are never
 * drawn), and it cannot exceed the model's vocabulary. Like the sampler's
 * vocabulary, it bounds the prompt's ids too (the penalties index them). */
static void test_sample_vocab(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int V = zi_model_get_config(f->model)->n_vocab;
    zi_generator *g;
    zi_generator_config cfg = {
        .n_slots = 1, .ctx = 256, .max_batch_tokens = 64, .sample_vocab = V + 1};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_EINVAL);
    cfg.sample_vocab = 300;
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    int32_t prompt[8] = {1, 42, 7, 250, 13, 99, 5, 200}; /* ids below it too (penalties) */
    for (int i = 0; i < 2; i++) {                        /* greedy and sampled */
        zi_sampling_params sp;
        zi_sampling_params_init(&sp);
        sp.max_new_tokens = GEN;
        sp.ignore_eos = true;
        sp.temperature = i ? 1.5 : 0.0;
        sp.top_k = 0;
        sp.seed = 9;
        zi_text_context c;
        assert_int_equal(zi_text_context_init(&c, prompt, 8, 256, &sp, &err), ZI_OK);
        zi_sampling_params_free(&sp);
        zi_text_context *one[1] = {&c};
        assert_int_equal(zi_generator_next_token(g, one, 1, GEN, &err), ZI_OK);
        assert_int_equal(zi_text_context_generated_count(&c), GEN);
        for (int k = 0; k < GEN; k++) assert_true(zi_text_context_generated_tokens(&c)[k] < 300);
        zi_generator_release(g, &c);
        zi_text_context_free(&c);
    }
    zi_generator_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_equals_alone),
        cmocka_unit_test(test_paged_preemption_and_prefix),
        cmocka_unit_test(test_kv_disk_tier),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_multi_step),
        cmocka_unit_test(test_burst_prefill),
        cmocka_unit_test(test_fixed_cache_equals_generator),
        cmocka_unit_test(test_sample_vocab),
        cmocka_unit_test(test_codec_plan_batched),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
