/*
 * test_generator_images.c - images in the generator's contexts, over the
 * real default model (llama family: no embedding scale).
 *
 * The "vision tower" here is a callback that returns rows of the model's
 * own token-embedding matrix (dequantized from the file's token_embd) for
 * ids written into the image's pixels. So a prompt whose image positions
 * stand for ids X must give exactly the tokens and log probabilities of
 * the plain prompt with X in place (causal tiles), under any chunking. A
 * non_causal tile is compared with the same context run in one pass, and
 * must differ from the causal one. Also: chunked prefill never splits a
 * non_causal tile, even beside decodes with a small prompt chunk; the
 * prefix cache reuses a repeated image's blocks without calling the
 * encoder for tiles it covers, and never shares blocks between two images
 * at the same positions; a tile larger than a step is refused; the
 * repetition penalty and prompt lookup run over such prompts; echo is
 * refused. Skipped without the model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <time.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "model_fixture.h"

#include "dequant.h"
#include "gguf.h"

#define ERR_HAS_MSG(m, s)                                                                          \
    do {                                                                                           \
        if (!strstr((m), (s))) fail_msg("message \"%s\" lacks \"%s\"", (m), (s));                  \
    } while (0)

#define GEN 8
#define NLP 3 /* top log probabilities compared */

static const char *text =
    "<|im_start|>user\nDescribe the picture of a red boat on a calm lake at dawn, in two "
    "sentences.<|im_end|>\n<|im_start|>assistant\n";

typedef struct fixture {
    zi_backend *be;
    zi_model *model;
    zi_tokenizer *tok;
    int32_t *ids;
    size_t n_ids;
    const zi_gguf_tensor *te; /* token_embd.weight */
    size_t row_bytes;
    int dim;
    int calls; /* encode_ids calls */
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    char path[4096];
    int rc = zi_test_model_open(&f->be, &f->model, &f->tok, path, sizeof path);
    if (rc == 1 && zi_test_encode_all(f->tok, &text, 1, &f->ids, &f->n_ids)) rc = -1;
    if (rc == 1) {
        f->te = zi_gguf_find_tensor(zi_model_gguf(f->model), "token_embd.weight");
        f->dim = zi_model_get_config(f->model)->dim;
        if (!f->te || f->te->ne[0] != f->dim)
            rc = -1;
        else
            f->row_bytes = (size_t)(f->te->nbytes / (uint64_t)f->te->ne[1]);
    }
    if (rc <= 0) free(f);
    *state = rc > 0 ? f : NULL;
    return rc < 0 ? -1 : 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    if (!f) return 0;
    free(f->ids);
    zi_test_model_close(f->be, f->model, f->tok);
    free(f);
    return 0;
}

/* The test's vision tower: tile `tile`'s first tile_tokens pixel values
 * are token ids; their embedding rows are the soft tokens. */
static int encode_ids(void *user, const zi_ctx_image *im, int tile, float *out, zi_error *err) {
    fixture *f = user;
    f->calls++;
    const float *px = im->pixels + (size_t)tile * (size_t)im->tile_size * (size_t)im->tile_size * 3;
    for (int j = 0; j < im->tile_tokens; j++) {
        int64_t id = (int64_t)px[j];
        if (id < 0 || id >= f->te->ne[1])
            return zi_error_set(err, ZI_EINVAL, "encode_ids: id %lld", (long long)id);
        zi_dequantize_row(f->te->type, (const uint8_t *)f->te->data + (size_t)id * f->row_bytes,
                          out + (size_t)j * (size_t)f->dim, f->dim);
    }
    return ZI_OK;
}

static zi_sampling_params greedy(void) {
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = GEN;
    sp.ignore_eos = true;
    return sp;
}

/* A plain context of ids[0..n). */
static void plain_context(const int32_t *ids, size_t n, const zi_sampling_params *sp,
                          zi_text_context *c) {
    zi_error err = {0};
    assert_int_equal(zi_text_context_init(c, ids, n, 256, sp, &err), ZI_OK);
    c->log_probabilities = NLP;
}

/* The same with one image of n_tiles tiles of T soft tokens at first[],
 * standing for the ids there (those of `as`, or of ids where as is NULL). */
static void image_context(const int32_t *ids, size_t n, const int32_t *as, int n_tiles,
                          const int32_t *first, int T, bool non_causal,
                          const zi_sampling_params *sp, zi_text_context *c) {
    plain_context(ids, n, sp, c);
    zi_ctx_image im = {.n_tiles = n_tiles, .tile_tokens = T, .non_causal = non_causal};
    im.tile_size = 1;
    while (im.tile_size * im.tile_size * 3 < T) im.tile_size++;
    size_t per = (size_t)im.tile_size * (size_t)im.tile_size * 3;
    im.tile_first = malloc((size_t)n_tiles * sizeof *im.tile_first);
    im.pixels = calloc((size_t)n_tiles * per, sizeof *im.pixels);
    for (int t = 0; t < n_tiles; t++) {
        im.tile_first[t] = first[t];
        for (int j = 0; j < T; j++)
            im.pixels[(size_t)t * per + (size_t)j] = (float)(as ? as : ids)[first[t] + j];
    }
    im.hash = zi_ctx_image_hash(im.pixels, (size_t)n_tiles * per);
    zi_error err = {0};
    assert_int_equal(zi_text_context_add_image(c, &im, &err), ZI_OK);
    assert_true(c->tokens[first[0]] < 0);
}

/* Runs the contexts to the end in steps of one, checking after each that
 * no window ended inside a non_causal tile. */
static void run(zi_generator *g, zi_text_context **b, size_t n) {
    zi_error err = {0};
    zi_text_context *live[8];
    memcpy(live, b, n * sizeof *b);
    for (int guard = 0; n > 0 && guard < 2000; guard++) {
        if (zi_generator_next_token(g, live, n, 1, &err)) fail_msg("%s", err.msg);
        if (zi_generator_check(g, &err)) fail_msg("%s", err.msg);
        for (size_t i = 0; i < n; i++) {
            const zi_text_context *c = live[i];
            for (size_t k = 0; k < c->n_images; k++) {
                const zi_ctx_image *im = &c->images[k];
                for (int t = 0; im->non_causal && t < im->n_tiles; t++)
                    if (c->start_idx > im->tile_first[t] &&
                        c->start_idx < im->tile_first[t] + im->tile_tokens)
                        fail_msg("a window ended inside a non_causal tile (%d..%d) at %lld",
                                 im->tile_first[t], im->tile_first[t] + im->tile_tokens - 1,
                                 (long long)c->start_idx);
            }
        }
        n = zi_test_drop_done(g, live, n);
    }
    assert_int_equal(n, 0);
}

/* a's and b's generated tokens and log probabilities are the same bits */
static void assert_same_output(const zi_text_context *a, const zi_text_context *b) {
    assert_int_equal(zi_text_context_generated_count(a), GEN);
    assert_int_equal(zi_text_context_generated_count(b), GEN);
    assert_memory_equal(zi_text_context_generated_tokens(a), zi_text_context_generated_tokens(b),
                        GEN * sizeof(int32_t));
    for (int64_t k = a->prompt_len; k < a->end_idx; k++) {
        const zi_logprobs *x = a->lp_data[k], *y = b->lp_data[k];
        assert_non_null(x);
        assert_non_null(y);
        assert_memory_equal(x->token_logprobs, y->token_logprobs, sizeof(float));
        assert_int_equal(x->top[0].n, y->top[0].n);
        assert_memory_equal(x->top[0].ids, y->top[0].ids, x->top[0].n * sizeof(int32_t));
        assert_memory_equal(x->top[0].logprobs, y->top[0].logprobs, x->top[0].n * sizeof(float));
    }
}

static zi_generator *make_gen(fixture *f, int budget, int prefill_chunk, int prefix, int bs) {
    zi_generator *g;
    zi_error err = {0};
    zi_generator_config cfg = {.n_slots = 4,
                               .ctx = 256,
                               .max_batch_tokens = budget,
                               .prefill_chunk = prefill_chunk,
                               .prefix_cache = prefix,
                               .block_size = bs,
                               .encode_tile = encode_ids,
                               .encode_user = f};
    if (zi_generator_create(f->model, &cfg, &g, &err)) fail_msg("%s", err.msg);
    return g;
}

/* Causal tiles that stand for the prompt's own ids give the plain
 * prompt's output exactly, in one pass and in chunks that split tiles. */
static void test_causal_equals_text(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_sampling_params sp = greedy();
    const int32_t first[2] = {3, 12}; /* text between the tiles */
    zi_text_context plain, one, chunked;
    plain_context(f->ids, f->n_ids, &sp, &plain);
    image_context(f->ids, f->n_ids, NULL, 2, first, 6, false, &sp, &one);
    image_context(f->ids, f->n_ids, NULL, 2, first, 6, false, &sp, &chunked);
    zi_generator *g = make_gen(f, 512, 0, 0, 16);
    zi_text_context *b[1] = {&plain};
    run(g, b, 1);
    f->calls = 0;
    b[0] = &one;
    run(g, b, 1);
    assert_int_equal(f->calls, 2);
    zi_generator_stats st;
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.images_encoded, 1);
    assert_int_equal(st.tiles_encoded, 2);
    assert_true(st.image_encode_ms >= 0);
    zi_generator_free(g);
    g = make_gen(f, 4, 0, 0, 16); /* windows of 4: tiles split across steps */
    b[0] = &chunked;
    run(g, b, 1);
    assert_same_output(&plain, &one);
    assert_same_output(&plain, &chunked);
    zi_generator_free(g);
    zi_text_context_free(&plain);
    zi_text_context_free(&one);
    zi_text_context_free(&chunked);
    zi_sampling_params_free(&sp);
}

/* non_causal tiles: the same output under any chunking and beside a
 * decoding stream with a small prompt chunk (a tile never split), and
 * not the causal output. */
static void test_non_causal_chunks(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_sampling_params sp = greedy();
    const int32_t first[2] = {3, 12};
    zi_text_context one, causal, ctx[3], other;
    image_context(f->ids, f->n_ids, NULL, 2, first, 6, true, &sp, &one);
    image_context(f->ids, f->n_ids, NULL, 2, first, 6, false, &sp, &causal);
    zi_generator *g = make_gen(f, 512, 0, 0, 16);
    zi_text_context *b[2] = {&one};
    run(g, b, 1);
    b[0] = &causal;
    run(g, b, 1);
    zi_generator_free(g);
    /* attn_pos took effect: the first token's log probabilities differ */
    assert_memory_not_equal(one.lp_data[one.prompt_len]->top[0].logprobs,
                            causal.lp_data[causal.prompt_len]->top[0].logprobs,
                            NLP * sizeof(float));
    const int budgets[3] = {6, 7, 10};
    for (int k = 0; k < 3; k++) {
        image_context(f->ids, f->n_ids, NULL, 2, first, 6, true, &sp, &ctx[k]);
        g = make_gen(f, budgets[k], 0, 0, 4);
        b[0] = &ctx[k];
        run(g, b, 1);
        assert_same_output(&one, &ctx[k]);
        zi_generator_free(g);
    }
    /* beside a decoding stream, prompt chunk 2 < the tile's 6 tokens */
    g = make_gen(f, 8, 2, 0, 16);
    zi_text_context late;
    image_context(f->ids, f->n_ids, NULL, 2, first, 6, true, &sp, &late);
    zi_sampling_params sp2 = greedy();
    sp2.max_new_tokens = 40;
    plain_context(f->ids, 5, &sp2, &other);
    zi_error err = {0};
    zi_text_context *ob[1] = {&other};
    assert_int_equal(zi_generator_next_token(g, ob, 1, 2, &err), ZI_OK); /* decoding now */
    b[0] = &other, b[1] = &late;
    run(g, b, 2);
    assert_same_output(&one, &late);
    zi_generator_free(g);
    zi_text_context_free(&one);
    zi_text_context_free(&causal);
    zi_text_context_free(&late);
    zi_text_context_free(&other);
    for (int k = 0; k < 3; k++) zi_text_context_free(&ctx[k]);
    zi_sampling_params_free(&sp);
    zi_sampling_params_free(&sp2);
}

/* The prefix cache: the same image again reuses the blocks and never
 * encodes a tile they cover; another image at the same positions shares
 * no block holding its tokens, and gives its own ids' output. */
static void test_prefix_cache(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_sampling_params sp = greedy();
    const int32_t first[1] = {2};
    const int T = 8;
    /* other ids for the second image: the prompt's, shifted */
    int32_t *as = malloc(f->n_ids * sizeof *as), *alt = malloc(f->n_ids * sizeof *alt);
    for (size_t i = 0; i < f->n_ids; i++) as[i] = alt[i] = f->ids[i];
    for (int j = 0; j < T; j++) as[first[0] + j] = alt[first[0] + j] = 300 + j;
    zi_generator *g = make_gen(f, 512, 0, 1, 4);
    zi_text_context a, a2, c, plain_c;
    image_context(f->ids, f->n_ids, NULL, 1, first, T, true, &sp, &a);
    zi_text_context *b[1] = {&a};
    f->calls = 0;
    run(g, b, 1);
    assert_int_equal(f->calls, 1);
    zi_generator_stats s0, s1, s2;
    zi_generator_get_stats(g, &s0);
    /* the same image: blocks reused, no encoding */
    image_context(f->ids, f->n_ids, NULL, 1, first, T, true, &sp, &a2);
    b[0] = &a2;
    run(g, b, 1);
    zi_generator_get_stats(g, &s1);
    assert_int_equal(f->calls, 1);
    assert_int_equal(s1.tiles_encoded, s0.tiles_encoded);
    uint64_t hit = s1.prefix_hit_tokens - s0.prefix_hit_tokens;
    assert_true(hit >= (uint64_t)(first[0] + T)); /* past the image */
    assert_same_output(&a, &a2);
    /* another image at the same positions: the first block holds its keys */
    image_context(f->ids, f->n_ids, as, 1, first, T, true, &sp, &c);
    b[0] = &c;
    run(g, b, 1);
    zi_generator_get_stats(g, &s2);
    assert_int_equal(f->calls, 2);
    assert_int_equal(s2.prefix_hit_tokens, s1.prefix_hit_tokens); /* block 0 has 2..3 */
    /* and its output is its own image's: that image alone, in a fresh
     * generator without a prefix cache */
    zi_generator *g2 = make_gen(f, 512, 0, 0, 16);
    image_context(alt, f->n_ids, NULL, 1, first, T, true, &sp, &plain_c);
    b[0] = &plain_c;
    run(g2, b, 1);
    assert_same_output(&c, &plain_c);
    zi_generator_free(g2);
    zi_generator_free(g);
    zi_text_context_free(&a);
    zi_text_context_free(&a2);
    zi_text_context_free(&c);
    zi_text_context_free(&plain_c);
    free(as);
    free(alt);
    zi_sampling_params_free(&sp);
}

/* The disk tier (kv_disk.h) holds a context's blocks before its first
 * image only (the image's K/V come from the worker's projector, which its
 * files do not name): a new generator on the same directory reads those
 * back, encodes the tile again, and gives the same output. */
static void test_disk_tier_stops_at_images(void **state) {
    fixture *f = *state;
    if (!f) skip();
    if (f->n_ids < 24) skip();
    char dir[64]; /* this process's and this moment's: mkdir fails on a stale one */
    snprintf(dir, sizeof dir, "/tmp/zi_gen_images_disk_%d_%lld", (int)getpid(),
             (long long)time(NULL));
    assert_int_equal(mkdir(dir, 0700), 0);
    zi_sampling_params sp = greedy();
    const int32_t first[1] = {10};
    const int T = 8;
    zi_error err = {0};
    zi_text_context a, a2;
    zi_generator_stats st;
    zi_generator *g = make_gen(f, 512, 0, 1, 4);
    if (zi_generator_open_kv_disk(g, dir, 1 << 30, "test", NULL, &err)) fail_msg("%s", err.msg);
    image_context(f->ids, f->n_ids, NULL, 1, first, T, true, &sp, &a);
    zi_text_context *b[1] = {&a};
    run(g, b, 1);
    zi_generator_free(g); /* writes what is queued */
    g = make_gen(f, 512, 0, 1, 4);
    if (zi_generator_open_kv_disk(g, dir, 1 << 30, "test", NULL, &err)) fail_msg("%s", err.msg);
    image_context(f->ids, f->n_ids, NULL, 1, first, T, true, &sp, &a2);
    b[0] = &a2;
    f->calls = 0;
    run(g, b, 1);
    zi_generator_get_stats(g, &st);
    assert_int_equal(st.disk_hit_blocks, 2); /* positions 0..7; block 2 holds the image's 10 */
    assert_int_equal(st.prefix_hit_tokens, 8);
    assert_int_equal(f->calls, 1);
    assert_same_output(&a, &a2);
    zi_generator_free(g);
    zi_text_context_free(&a);
    zi_text_context_free(&a2);
    zi_sampling_params_free(&sp);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c blk > /dev/null && rm -rf '%s'", dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* Refusals at admission: a non_causal tile over the step's budget, echo,
 * a generator without an encoder; and the sampler's history and prompt
 * lookup never see the keys. */
static void test_refusals_and_paths(void **state) {
    fixture *f = *state;
    if (!f) skip();
    zi_sampling_params sp = greedy();
    const int32_t first[1] = {3};
    zi_text_context c;
    image_context(f->ids, f->n_ids, NULL, 1, first, 6, true, &sp, &c);
    zi_error err = {0};
    zi_generator *g = make_gen(f, 5, 0, 0, 16);
    assert_int_equal(zi_generator_check_images(g, &c, &err), ZI_EINVAL);
    ERR_HAS_MSG(err.msg, "a tile of 6 soft tokens");
    ERR_HAS_MSG(err.msg, "--batch-size to at least 6");
    zi_text_context *b[1] = {&c};
    assert_int_equal(zi_generator_next_token(g, b, 1, 1, &err), ZI_EINVAL);
    assert_false(zi_text_context_is_assigned_to_cache(&c));
    zi_generator_free(g);
    g = make_gen(f, 64, 0, 0, 16);
    c.log_probabilities_echo = true;
    assert_int_equal(zi_generator_check_images(g, &c, &err), ZI_EUNSUPPORTED);
    ERR_HAS_MSG(err.msg, "echo");
    c.log_probabilities_echo = false;
    assert_int_equal(zi_generator_check_images(g, &c, &err), ZI_OK);
    zi_generator_free(g);
    zi_generator_config cfg = {.n_slots = 1, .ctx = 256, .max_batch_tokens = 64};
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_OK);
    assert_int_equal(zi_generator_check_images(g, &c, &err), ZI_EUNSUPPORTED);
    ERR_HAS_MSG(err.msg, "no vision tower");
    zi_generator_free(g);
    cfg.encode_tile = encode_ids;
    cfg.image_dim = f->dim + 1;
    assert_int_equal(zi_generator_create(f->model, &cfg, &g, &err), ZI_EINVAL);
    zi_text_context_free(&c);

    /* penalties over a prompt with keys (the sampler refuses ids outside
     * the vocabulary: it must get the prompt without them), and prompt
     * lookup: the same tokens as without speculation */
    zi_sampling_params pen = greedy();
    pen.repetition_penalty = 1.3;
    pen.frequency_penalty = 0.5;
    zi_text_context p1, s1, s2;
    image_context(f->ids, f->n_ids, NULL, 1, first, 6, true, &pen, &p1);
    image_context(f->ids, f->n_ids, NULL, 1, first, 6, true, &sp, &s1);
    image_context(f->ids, f->n_ids, NULL, 1, first, 6, true, &sp, &s2);
    g = make_gen(f, 64, 0, 0, 16);
    b[0] = &p1;
    run(g, b, 1);
    assert_int_equal(zi_text_context_generated_count(&p1), GEN);
    b[0] = &s1;
    run(g, b, 1);
    zi_generator_free(g);
    zi_generator_config sc = {.n_slots = 1,
                              .ctx = 256,
                              .max_batch_tokens = 64,
                              .spec_lookup = 1,
                              .encode_tile = encode_ids,
                              .encode_user = f};
    assert_int_equal(zi_generator_create(f->model, &sc, &g, &err), ZI_OK);
    s2.log_probabilities = 0, s1.log_probabilities = 0; /* (only tokens compared) */
    b[0] = &s2;
    run(g, b, 1);
    assert_memory_equal(zi_text_context_generated_tokens(&s1),
                        zi_text_context_generated_tokens(&s2), GEN * sizeof(int32_t));
    zi_generator_free(g);
    zi_text_context_free(&p1);
    zi_text_context_free(&s1);
    zi_text_context_free(&s2);
    zi_sampling_params_free(&pen);
    zi_sampling_params_free(&sp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_causal_equals_text), cmocka_unit_test(test_non_causal_chunks),
        cmocka_unit_test(test_prefix_cache),       cmocka_unit_test(test_disk_tier_stops_at_images),
        cmocka_unit_test(test_refusals_and_paths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
