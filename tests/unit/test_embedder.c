/*
 * test_embedder.c - embeddings: the pooling math (embedder.h) on made-up
 * hidden states, and the generator's embedding path over the real model:
 * an input embedded alone equals the same input embedded in chunks beside
 * generating sequences, the generations' tokens are those generated
 * alone, and every block an input took is given back (the default model;
 * those cases are skipped without it).
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
#include "cpu_backend.h"
#include "embedder.h"
#include "generator.h"
#include "model.h"
#include "tokenizer.h"

static void test_pooling_names(void **state) {
    (void)state;
    zi_pooling p;
    const char *names[] = {"none", "mean", "cls", "last", "rank"};
    for (int i = 0; i < 5; i++) {
        assert_int_equal(zi_pooling_parse(names[i], strlen(names[i]), &p), ZI_OK);
        assert_int_equal((int)p, i); /* llama.cpp's llama_pooling_type values */
        assert_string_equal(zi_pooling_name(p), names[i]);
    }
    assert_int_equal(zi_pooling_parse("ranks", 5, &p), ZI_EINVAL);
    assert_int_equal(zi_pooling_parse("mea", 3, &p), ZI_EINVAL);
}

/* Feeds n_tok made-up hidden states (h[t][d] = t + 1 + d * 0.5, token 1
 * negated) through zi_embed_take/finish. */
static void pool(zi_pooling p, bool normalize, int n_tok, zi_embed_input *e) {
    static const int32_t toks[8] = {0};
    zi_error err = {0};
    assert_int_equal(zi_embed_input_init(e, toks, n_tok, 3, p, normalize, 4, &err), ZI_OK);
    for (int t = 0; t < n_tok; t++) {
        float h[3];
        for (int d = 0; d < 3; d++) h[d] = (t == 1 ? -1.0f : 1.0f) * (t + 1 + d * 0.5f);
        if (zi_embed_wants(e, t)) zi_embed_take(e, t, h);
    }
    zi_embed_finish(e);
}

static void test_pooling_math(void **state) {
    (void)state;
    zi_embed_input e;
    /* mean of rows (1, 1.5, 2), -(2, 2.5, 3), (3, 3.5, 4) */
    pool(ZI_POOLING_MEAN, false, 3, &e);
    assert_int_equal(zi_embed_out_rows(e.pooling, 3), 1);
    assert_float_equal(e.out[0], 2.0f / 3, 1e-6);
    assert_float_equal(e.out[1], 2.5f / 3, 1e-6);
    assert_float_equal(e.out[2], 1.0f, 1e-6);
    zi_embed_input_free(&e);
    pool(ZI_POOLING_CLS, false, 3, &e);
    assert_true(zi_embed_wants(&e, 0) && !zi_embed_wants(&e, 1) && !zi_embed_wants(&e, 2));
    assert_true(e.out[0] == 1.0f && e.out[1] == 1.5f && e.out[2] == 2.0f);
    zi_embed_input_free(&e);
    pool(ZI_POOLING_LAST, false, 3, &e);
    assert_true(!zi_embed_wants(&e, 0) && zi_embed_wants(&e, 2));
    assert_true(e.out[0] == 3.0f && e.out[1] == 3.5f && e.out[2] == 4.0f);
    zi_embed_input_free(&e);
    /* none, normalised per token */
    pool(ZI_POOLING_NONE, true, 3, &e);
    assert_int_equal(zi_embed_out_rows(e.pooling, 3), 3);
    for (int t = 0; t < 3; t++) {
        double s = 0;
        for (int d = 0; d < 3; d++) s += (double)e.out[t * 3 + d] * e.out[t * 3 + d];
        assert_float_equal(s, 1.0, 1e-6);
    }
    float n1 = sqrtf(4 + 6.25f + 9);
    assert_float_equal(e.out[3], -2.0f / n1, 1e-6);
    zi_embed_input_free(&e);
    /* normalize mean; a zero vector stays zero */
    pool(ZI_POOLING_LAST, true, 1, &e);
    float n0 = sqrtf(1 + 2.25f + 4);
    assert_float_equal(e.out[1], 1.5f / n0, 1e-6);
    zi_embed_input_free(&e);
    float z[4] = {0};
    zi_embed_l2_normalize(z, 4);
    assert_true(z[0] == 0 && z[3] == 0);
    /* bad arguments are refused */
    zi_error err = {0};
    int32_t tok = 0;
    assert_int_equal(zi_embed_input_init(&e, &tok, 0, 3, ZI_POOLING_MEAN, false, 4, &err),
                     ZI_EINVAL);
}

/* ---- the generator path, over the real model ---- */

typedef struct fixture {
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
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
    zi_test_model_close(f->be, f->model, f->tok);
    free(f);
    return 0;
}

#define N_EMB 4
static const char *emb_texts[N_EMB] = {
    "The quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "hello",
    "def add(a, b):\n    return a + b\n",
};
static const zi_pooling emb_pool[N_EMB] = {ZI_POOLING_MEAN, ZI_POOLING_NONE, ZI_POOLING_CLS,
                                           ZI_POOLING_LAST};
#define GEN 8
#define CTX 128

static void new_gen(fixture *f, zi_text_context *c, int32_t **ids) {
    const char *t = "Once upon a time";
    size_t n = 0;
    zi_error err = {0};
    assert_int_equal(zi_tokenizer_encode(f->tok, t, strlen(t), 1, 1, ids, &n, &err), ZI_OK);
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = GEN;
    sp.ignore_eos = true;
    assert_int_equal(zi_text_context_init(c, *ids, n, CTX, &sp, &err), ZI_OK);
    zi_sampling_params_free(&sp);
}

static void test_embed_alone_equals_batched(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    int dim = zi_model_get_config(f->model)->dim;
    int32_t *ids[N_EMB];
    size_t n_ids[N_EMB];
    for (int i = 0; i < N_EMB; i++)
        assert_int_equal(zi_tokenizer_encode(f->tok, emb_texts[i], strlen(emb_texts[i]), 1, 1,
                                             &ids[i], &n_ids[i], &err),
                         ZI_OK);
    int32_t max_blocks = (CTX + 15) / 16;

    /* alone: one input per call, a generator of its own each time */
    zi_embed_input alone[N_EMB];
    int32_t gen_alone[GEN];
    zi_generator *g1;
    zi_generator_config c1 = {.n_slots = 1, .ctx = CTX, .max_batch_tokens = 256};
    assert_int_equal(zi_generator_create(f->model, &c1, &g1, &err), ZI_OK);
    for (int i = 0; i < N_EMB; i++) {
        assert_int_equal(zi_embed_input_init(&alone[i], ids[i], (int32_t)n_ids[i], dim, emb_pool[i],
                                             i == 0, max_blocks, &err),
                         ZI_OK);
        zi_embed_input *e = &alone[i];
        assert_int_equal(zi_generator_next_token_embed(g1, NULL, 0, &e, 1, 4, &err), ZI_OK);
        assert_true(alone[i].done);
        assert_int_equal(alone[i].n_blocks, 0);
    }
    zi_generator_stats st;
    zi_generator_get_stats(g1, &st);
    assert_int_equal(st.kv_used, 0);
    assert_int_equal(st.kv_cached, 0); /* never registered */
    zi_text_context c;
    int32_t *gids;
    new_gen(f, &c, &gids);
    zi_text_context *b[1] = {&c};
    assert_int_equal(zi_generator_next_token(g1, b, 1, GEN + 2, &err), ZI_OK);
    memcpy(gen_alone, zi_text_context_generated_tokens(&c), sizeof gen_alone);
    zi_generator_release(g1, &c);
    zi_text_context_free(&c);
    free(gids);
    zi_generator_free(g1);

    /* together: a generation decoding while the inputs run in chunks of a
     * 5-token budget beside it */
    zi_generator *g;
    zi_generator_config c2 = {.n_slots = 2, .ctx = CTX, .max_batch_tokens = 5};
    assert_int_equal(zi_generator_create(f->model, &c2, &g, &err), ZI_OK);
    new_gen(f, &c, &gids);
    assert_int_equal(zi_generator_next_token(g, b, 1, 2, &err), ZI_OK);
    zi_embed_input tog[N_EMB];
    zi_embed_input *ep[N_EMB];
    for (int i = 0; i < N_EMB; i++) {
        assert_int_equal(zi_embed_input_init(&tog[i], ids[i], (int32_t)n_ids[i], dim, emb_pool[i],
                                             i == 0, max_blocks, &err),
                         ZI_OK);
        ep[i] = &tog[i];
    }
    int rounds = 0, all = 0;
    while (!all && rounds++ < 200) {
        size_t nb = zi_text_context_is_done(&c) ? 0 : 1;
        assert_int_equal(zi_generator_next_token_embed(g, b, nb, ep, N_EMB, 1, &err), ZI_OK);
        all = 1;
        for (int i = 0; i < N_EMB; i++) all &= tog[i].done;
    }
    assert_true(all);
    assert_int_equal(zi_generator_next_token(g, b, 1, GEN + 2, &err), ZI_OK);
    assert_int_equal(zi_text_context_generated_count(&c), GEN);
    assert_memory_equal(zi_text_context_generated_tokens(&c), gen_alone, sizeof gen_alone);
    for (int i = 0; i < N_EMB; i++) {
        size_t nf = (size_t)zi_embed_out_rows(emb_pool[i], (int32_t)n_ids[i]) * dim;
        assert_memory_equal(tog[i].out, alone[i].out, nf * sizeof(float));
        zi_embed_input_free(&tog[i]);
        zi_embed_input_free(&alone[i]);
        free(ids[i]);
    }
    zi_generator_release(g, &c);
    zi_text_context_free(&c);
    free(gids);
    assert_int_equal(zi_generator_check(g, &err), ZI_OK);
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.kv_used, 0);
    zi_generator_free(g);
}

/* An input longer than the context is refused, nothing run. */
static void test_embed_too_long(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_error err = {0};
    zi_generator *g;
    zi_generator_config cfg = {.n_slots = 1, .ctx = 16, .max_batch_tokens = 64};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    int32_t toks[17] = {0};
    zi_embed_input e;
    int dim = zi_model_get_config(f->model)->dim;
    assert_int_equal(zi_embed_input_init(&e, toks, 17, dim, ZI_POOLING_MEAN, false, 2, &err),
                     ZI_OK);
    zi_embed_input *ep = &e;
    assert_int_equal(zi_generator_next_token_embed(g, NULL, 0, &ep, 1, 1, &err), ZI_ERANGE);
    assert_false(e.done);
    zi_embed_input_free(&e);
    zi_generator_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pooling_names),
        cmocka_unit_test(test_pooling_math),
        cmocka_unit_test_setup_teardown(test_embed_alone_equals_batched, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embed_too_long, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
