/*
 * test_types.c - cmocka tests for protocol/types.c: SamplingParams defaults
 * and validation, and every TextContext index operation checked against the
 * seed's description with exact index values after each sequence of
 * operations (context encoding, token generation, chunked prefill,
 * jump_ahead, rollback, reset for eviction, available steps, the
 * min_new_tokens EOS mask, cache slots), plus the misuse errors; and
 * common/grow.h, by which the lists grow.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grow.h"
#include "types.h"

/* The four indices at once, so a failure shows which sequence broke. */
#define IDX(c, s, a, e, k)                                                                         \
    do {                                                                                           \
        assert_int_equal((c)->start_idx, (s));                                                     \
        assert_int_equal((c)->active_idx, (a));                                                    \
        assert_int_equal((c)->end_idx, (e));                                                       \
        assert_int_equal((c)->committed_idx, (k));                                                 \
    } while (0)

#define ERR_HAS(e, s)                                                                              \
    do {                                                                                           \
        if (!strstr((e).msg, (s)))                                                                 \
            fail_msg("message \"%s\" does not contain \"%s\"", (e).msg, (s));                      \
    } while (0)

static const int32_t P10[10] = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};

static void new_ctx(zi_text_context *c, size_t n, int64_t max_length,
                    const zi_sampling_params *sp) {
    zi_error e = {0};
    int rc = zi_text_context_init(c, P10, n, max_length, sp, &e);
    if (rc) fail_msg("init: %s", e.msg);
}

/* ---- SamplingParams -------------------------------------------------------- */

static void test_sampling_defaults(void **state) {
    (void)state;
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    assert_int_equal(sp.top_k, 1);
    assert_true(sp.top_p == 1.0);
    assert_true(sp.min_p == 0.0);
    assert_true(sp.temperature == 1.0);
    assert_true(sp.frequency_penalty == 0.0);
    assert_true(sp.presence_penalty == 0.0);
    assert_true(sp.repetition_penalty == 1.0);
    assert_int_equal(sp.max_new_tokens, -1);
    assert_int_equal(sp.min_new_tokens, 0);
    assert_false(sp.ignore_eos);
    assert_int_equal(sp.stop.n, 0);
    assert_int_equal(sp.stop_token_ids.n, 0);
    assert_true(sp.detokenize);
    assert_int_equal(sp.seed, 0);
    zi_error e = {0};
    assert_int_equal(zi_sampling_params_validate(&sp, NULL, &e), ZI_OK);
    zi_sampling_params_free(&sp);
}

typedef struct bad_sp {
    void (*set)(zi_sampling_params *);
    const char *msg; /* expected message, exactly, with path "sp" */
} bad_sp;

static void s_topk(zi_sampling_params *s) {
    s->top_k = -2;
}
static void s_topp0(zi_sampling_params *s) {
    s->top_p = 0.0;
}
static void s_topp15(zi_sampling_params *s) {
    s->top_p = 1.5;
}
static void s_toppnan(zi_sampling_params *s) {
    s->top_p = NAN;
}
static void s_minp(zi_sampling_params *s) {
    s->min_p = -0.25;
}
static void s_minp2(zi_sampling_params *s) {
    s->min_p = 1.5;
}
static void s_temp(zi_sampling_params *s) {
    s->temperature = -1;
}
static void s_tempinf(zi_sampling_params *s) {
    s->temperature = INFINITY;
}
static void s_tempnan(zi_sampling_params *s) {
    s->temperature = NAN;
}
static void s_freq(zi_sampling_params *s) {
    s->frequency_penalty = 2.5;
}
static void s_freqnan(zi_sampling_params *s) {
    s->frequency_penalty = NAN;
}
static void s_pres(zi_sampling_params *s) {
    s->presence_penalty = -3;
}
static void s_rep(zi_sampling_params *s) {
    s->repetition_penalty = 0;
}
static void s_repnan(zi_sampling_params *s) {
    s->repetition_penalty = NAN;
}
static void s_max0(zi_sampling_params *s) {
    s->max_new_tokens = 0;
}
static void s_maxneg(zi_sampling_params *s) {
    s->max_new_tokens = -7;
}
static void s_min(zi_sampling_params *s) {
    s->min_new_tokens = -1;
}
static void s_minmax(zi_sampling_params *s) {
    s->max_new_tokens = 4;
    s->min_new_tokens = 5;
}
static void s_stop(zi_sampling_params *s) {
    zi_str_list_push(&s->stop, "ok", 2, NULL);
    zi_str_list_push(&s->stop, "", 0, NULL);
}
static void s_stopid(zi_sampling_params *s) {
    zi_i32_list_push(&s->stop_token_ids, 3, NULL);
    zi_i32_list_push(&s->stop_token_ids, -4, NULL);
}

static void test_sampling_validate(void **state) {
    (void)state;
    const bad_sp cases[] = {
        {s_topk, "sp.top_k: -2 is invalid (use -1 or 0 for no limit, or k >= 1)"},
        {s_topp0, "sp.top_p: 0 is outside (0, 1]"},
        {s_topp15, "sp.top_p: 1.5 is outside (0, 1]"},
        {s_toppnan, "sp.top_p: NaN is not allowed"},
        {s_minp, "sp.min_p: -0.25 is outside [0, 1]"},
        {s_minp2, "sp.min_p: 1.5 is outside [0, 1]"},
        {s_temp, "sp.temperature: -1 is outside [0, 1e+06]"},
        {s_tempinf, "sp.temperature: inf is outside [0, 1e+06]"},
        {s_tempnan, "sp.temperature: NaN is not allowed"},
        {s_freq, "sp.frequency_penalty: 2.5 is outside [-2, 2]"},
        {s_freqnan, "sp.frequency_penalty: NaN is not allowed"},
        {s_pres, "sp.presence_penalty: -3 is outside [-2, 2]"},
        {s_rep, "sp.repetition_penalty: 0 is outside (0, 1e+06]"},
        {s_repnan, "sp.repetition_penalty: NaN is not allowed"},
        {s_max0, "sp.max_new_tokens: 0 is invalid (must be >= 1, or none)"},
        {s_maxneg, "sp.max_new_tokens: -7 is invalid (must be >= 1, or none)"},
        {s_min, "sp.min_new_tokens: -1 is negative"},
        {s_minmax, "sp.min_new_tokens: 5 exceeds max_new_tokens 4"},
        {s_stop, "sp.stop[1]: empty stop string"},
        {s_stopid, "sp.stop_token_ids[1]: -4 is not a token id"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        zi_sampling_params sp;
        zi_sampling_params_init(&sp);
        cases[i].set(&sp);
        zi_error e = {0};
        assert_int_equal(zi_sampling_params_validate(&sp, "sp", &e), ZI_EINVAL);
        assert_string_equal(e.msg, cases[i].msg);
        zi_sampling_params_free(&sp);
    }
    /* The edges of each accepted range pass; no path means bare names. */
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.top_k = -1;
    sp.top_p = 1e-9;
    sp.min_p = 1.0;
    sp.temperature = 0.0;
    sp.frequency_penalty = -2.0;
    sp.presence_penalty = 2.0;
    sp.repetition_penalty = 1e-3;
    sp.max_new_tokens = 1;
    sp.min_new_tokens = 1;
    zi_error e = {0};
    assert_int_equal(zi_sampling_params_validate(&sp, NULL, &e), ZI_OK);
    sp.top_k = 0;
    assert_int_equal(zi_sampling_params_validate(&sp, "", &e), ZI_OK);
    sp.top_p = 2;
    assert_int_equal(zi_sampling_params_validate(&sp, NULL, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "top_p: 2 is outside (0, 1]");
    assert_int_equal(zi_sampling_params_validate(NULL, NULL, &e), ZI_EINVAL);
}

static void test_sampling_copy(void **state) {
    (void)state;
    zi_sampling_params a, b;
    zi_sampling_params_init(&a);
    a.top_k = 40;
    a.seed = 77;
    assert_int_equal(zi_str_list_push(&a.stop, "END", 3, NULL), ZI_OK);
    assert_int_equal(zi_i32_list_push(&a.stop_token_ids, 9, NULL), ZI_OK);
    assert_int_equal(zi_sampling_params_copy(&b, &a, NULL), ZI_OK);
    zi_sampling_params_free(&a); /* b must own its own copies */
    assert_int_equal(b.top_k, 40);
    assert_int_equal(b.seed, 77);
    assert_int_equal(b.stop.n, 1);
    assert_string_equal(b.stop.v[0].p, "END");
    assert_int_equal(b.stop_token_ids.n, 1);
    assert_int_equal(b.stop_token_ids.v[0], 9);
    zi_sampling_params_free(&b);
}

/* ---- statuses, log probabilities, responses -------------------------------- */

static void test_status_names(void **state) {
    (void)state;
    const char *names[] = {"active", "end_of_sequence", "maximum_length",
                           "stop",   "cancelled",       "deadline_exceeded"};
    for (int i = 0; i < ZI_GEN_STATUS_COUNT; i++) {
        assert_string_equal(zi_gen_status_name(i), names[i]);
        zi_gen_status s;
        assert_int_equal(zi_gen_status_parse(names[i], strlen(names[i]), &s, NULL), ZI_OK);
        assert_int_equal(s, i);
        assert_int_equal(zi_gen_status_is_done(s), i != ZI_GEN_ACTIVE);
    }
    assert_null(zi_gen_status_name(6));
    assert_null(zi_gen_status_name(-1));
    zi_gen_status s;
    zi_error e = {0};
    assert_int_equal(zi_gen_status_parse("Active", 6, &s, &e), ZI_EINVAL);
    ERR_HAS(e, "status: unknown value");
    assert_int_equal(zi_gen_status_parse("stop", 3, &s, &e), ZI_EINVAL); /* "sto" */
}

static void test_logprobs(void **state) {
    (void)state;
    zi_logprobs lp;
    zi_logprobs_init(&lp);
    int32_t ids[2] = {5, 9};
    float v[2] = {-0.5f, -1.5f};
    assert_int_equal(zi_logprobs_push(&lp, -0.5f, ids, v, 2, NULL), ZI_OK);
    assert_int_equal(zi_logprobs_push(&lp, -INFINITY, NULL, NULL, 0, NULL),
                     ZI_OK); /* p = 0 is fine */
    zi_error e = {0};
    assert_int_equal(zi_logprobs_push(&lp, NAN, NULL, NULL, 0, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "token_log_probabilities[2]: nan is not a log probability");
    assert_int_equal(zi_logprobs_push(&lp, INFINITY, NULL, NULL, 0, &e), ZI_EINVAL);
    float bad[2] = {-1.0f, NAN};
    assert_int_equal(zi_logprobs_push(&lp, -1.0f, ids, bad, 2, &e), ZI_EINVAL);
    ERR_HAS(e, "top_log_probabilities[2][9]");
    int32_t neg[1] = {-1};
    assert_int_equal(zi_logprobs_push(&lp, -1.0f, neg, v, 1, &e), ZI_EINVAL);
    ERR_HAS(e, "top_log_probabilities[2]: -1 is not a token id");
    assert_int_equal(lp.n, 2); /* failed pushes added nothing */
    zi_logprobs c;
    assert_int_equal(zi_logprobs_copy(&c, &lp, NULL), ZI_OK);
    zi_logprobs_free(&lp);
    assert_int_equal(c.n, 2);
    assert_int_equal(c.top[0].n, 2);
    assert_int_equal(c.top[0].ids[1], 9);
    assert_true(c.top[0].logprobs[1] == -1.5f);
    assert_true(isinf(c.token_logprobs[1]));
    assert_int_equal(c.top[1].n, 0);
    zi_logprobs_free(&c);
}

static void test_responses(void **state) {
    (void)state;
    zi_text_generation_response r;
    zi_text_generation_response_init(&r);
    zi_text_response t;
    zi_text_response_init(&t);
    t.token = 42;
    assert_int_equal(zi_text_generation_response_append(&r, &t, NULL), ZI_OK);
    t.is_text = true;
    assert_int_equal(zi_string_set(&t.text, "hi", 2, NULL), ZI_OK);
    t.logprobs = calloc(1, sizeof *t.logprobs);
    assert_int_equal(zi_logprobs_push(t.logprobs, -0.25f, NULL, NULL, 0, NULL), ZI_OK);
    assert_int_equal(zi_text_generation_response_append(&r, &t, NULL), ZI_OK);
    zi_text_response_free(&t); /* the response holds copies */
    assert_int_equal(r.n, 2);
    assert_false(r.tokens[0].is_text);
    assert_int_equal(r.tokens[0].token, 42);
    assert_null(r.tokens[0].logprobs);
    assert_true(r.tokens[1].is_text);
    assert_string_equal(r.tokens[1].text.p, "hi");
    assert_true(r.tokens[1].logprobs->token_logprobs[0] == -0.25f);
    assert_int_equal(r.final_status, ZI_GEN_ACTIVE);
    zi_text_generation_response_free(&r);
    assert_int_equal(r.n, 0);
}

static void test_request_basics(void **state) {
    (void)state;
    zi_request r;
    zi_request_init(&r);
    assert_true(r.stream);
    assert_int_equal(r.prompt_kind, ZI_PROMPT_NONE);
    assert_int_equal(r.sampling_params.top_k, 1);
    assert_int_equal(zi_request_add_message(&r, "user", "hello", 5, NULL), ZI_OK);
    assert_int_equal(zi_request_add_message(&r, "assistant", "hi", 2, NULL), ZI_OK);
    assert_int_equal(r.n_messages, 2);
    assert_string_equal(r.messages[1].role.p, "assistant");
    assert_int_equal(r.messages[0].content.len, 5);
    zi_error e = {0};
    assert_int_equal(zi_request_add_message(&r, NULL, "x", 1, &e), ZI_EINVAL);
    zi_request_free(&r);
    assert_int_equal(r.n_messages, 0);
    assert_true(r.stream);
}

/* ---- TextContext ----------------------------------------------------------- */

static void test_ctx_init(void **state) {
    (void)state;
    zi_text_context c;
    new_ctx(&c, 5, 100, NULL);
    IDX(&c, 0, 5, 5, 0);
    assert_int_equal(c.prompt_len, 5);
    assert_int_equal(c.size, 128);
    assert_int_equal(c.max_length, 100);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    assert_int_equal(c.cache_seq_id, -1);
    assert_true(c.is_initial_prompt);
    assert_int_equal(zi_text_context_active_length(&c), 5);
    assert_int_equal(zi_text_context_current_length(&c), 5);
    assert_true(zi_text_context_is_ce(&c));
    assert_false(zi_text_context_is_done(&c));
    assert_memory_equal(zi_text_context_next_tokens(&c), P10, 5 * sizeof(int32_t));
    assert_int_equal(zi_text_context_generated_count(&c), 0);
    assert_int_equal(c.completion_start_idx, 5);
    assert_int_equal(c.completion_end_idx, 5);
    assert_int_equal(c.tokens[5], 0); /* preallocated slots are zero */
    zi_error e = {0};
    assert_int_equal(zi_text_context_check(&c, &e), ZI_OK);
    zi_text_context_free(&c);
    assert_null(c.tokens);

    /* max_new_tokens lowers max_length to prompt + max_new_tokens. */
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.max_new_tokens = 10;
    sp.ignore_eos = true;
    new_ctx(&c, 5, 100, &sp);
    assert_int_equal(c.max_length, 15);
    assert_true(c.ignore_eos);
    zi_text_context_free(&c);
    sp.max_new_tokens = 500; /* more than the model allows: the model wins */
    new_ctx(&c, 5, 100, &sp);
    assert_int_equal(c.max_length, 100);
    zi_text_context_free(&c);
}

static void test_ctx_init_errors(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    assert_int_equal(zi_text_context_init(&c, P10, 0, 100, NULL, &e), ZI_EINVAL);
    ERR_HAS(e, "prompt: empty");
    assert_int_equal(zi_text_context_init(&c, NULL, 3, 100, NULL, &e), ZI_EINVAL);
    int32_t neg[3] = {1, -2, 3};
    assert_int_equal(zi_text_context_init(&c, neg, 3, 100, NULL, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "prompt[1]: -2 is not a token id");
    assert_int_equal(zi_text_context_init(&c, P10, 10, 10, NULL, &e), ZI_ERANGE);
    assert_string_equal(e.msg, "prompt: 10 tokens leave no room under max_length 10");
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.min_new_tokens = 8;
    assert_int_equal(zi_text_context_init(&c, P10, 5, 12, &sp, &e), ZI_EINVAL);
    ERR_HAS(e, "sampling_params.min_new_tokens");
    sp.min_new_tokens = 0;
    sp.top_p = 7;
    assert_int_equal(zi_text_context_init(&c, P10, 5, 12, &sp, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "sampling_params.top_p: 7 is outside (0, 1]");
    assert_null(c.tokens);
    zi_text_context_free(&c); /* safe after a failed init */
    assert_int_equal(zi_text_context_init(NULL, P10, 5, 12, NULL, &e), ZI_EINVAL);
}

/* Context encoding then token generation, one token per step. */
static void test_ctx_update_sequence(void **state) {
    (void)state;
    zi_text_context c;
    new_ctx(&c, 5, 100, NULL);
    zi_error e = {0};
    assert_int_equal(zi_text_context_update(&c, 7, NULL, &e), ZI_OK);
    IDX(&c, 5, 6, 6, 0);
    assert_int_equal(c.tokens[5], 7);
    assert_false(c.is_initial_prompt);
    assert_false(zi_text_context_is_ce(&c));
    assert_int_equal(zi_text_context_active_length(&c), 1);
    assert_int_equal(*zi_text_context_next_tokens(&c), 7);
    assert_int_equal(zi_text_context_generated_count(&c), 1);
    assert_int_equal(c.completion_end_idx, 6);
    assert_int_equal(zi_text_context_update(&c, 8, NULL, &e), ZI_OK);
    IDX(&c, 6, 7, 7, 0);
    assert_int_equal(zi_text_context_generated_tokens(&c)[0], 7);
    assert_int_equal(zi_text_context_generated_tokens(&c)[1], 8);
    /* The prefix cache commits what the model has seen. */
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 6, &e), ZI_OK);
    IDX(&c, 6, 7, 7, 6);
    assert_int_equal(zi_text_context_update(&c, 9, NULL, &e), ZI_OK);
    IDX(&c, 7, 8, 8, 6);
    assert_int_equal(zi_text_context_update(&c, -1, NULL, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "update: -1 is not a token id");
    IDX(&c, 7, 8, 8, 6);
    zi_text_context_free(&c);
}

/* Chunked prefill: the window start..active covers part of the prompt. */
static void test_ctx_chunked_prefill(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 10, 100, NULL);
    assert_int_equal(zi_text_context_limit_active(&c, 4, &e), ZI_OK);
    IDX(&c, 0, 4, 10, 0);
    assert_int_equal(zi_text_context_active_length(&c), 4);
    assert_int_equal(zi_text_context_current_length(&c), 4);
    /* The sample after a partial prompt is dropped; the window moves on. */
    assert_int_equal(zi_text_context_update(&c, 99, NULL, &e), ZI_OK);
    IDX(&c, 4, 10, 10, 0);
    assert_int_equal(zi_text_context_generated_count(&c), 0);
    assert_int_equal(c.tokens[10], 0);
    assert_int_equal(c.completion_end_idx, 10);
    assert_true(c.is_initial_prompt);
    /* The scheduler may also shrink the window with bump_token_indices, as
     * the seed's scheduler does. */
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, -2, 0, 0, &e), ZI_OK);
    IDX(&c, 4, 8, 10, 0);
    assert_memory_equal(zi_text_context_next_tokens(&c), P10 + 4, 4 * sizeof(int32_t));
    assert_int_equal(zi_text_context_update(&c, 98, NULL, &e), ZI_OK);
    IDX(&c, 8, 10, 10, 0);
    assert_int_equal(zi_text_context_limit_active(&c, 4, &e), ZI_OK); /* 2 left: unchanged */
    IDX(&c, 8, 10, 10, 0);
    assert_int_equal(zi_text_context_update(&c, 5, NULL, &e), ZI_OK);
    IDX(&c, 10, 11, 11, 0);
    assert_int_equal(c.tokens[10], 5);
    assert_int_equal(zi_text_context_generated_count(&c), 1);
    assert_int_equal(zi_text_context_limit_active(&c, 0, &e), ZI_EINVAL);
    ERR_HAS(e, "max_tokens 0");
    /* jump_ahead is refused while a chunked prompt is pending. */
    assert_int_equal(zi_text_context_set_token_indices(&c, 0, 3, ZI_IDX_KEEP, ZI_IDX_KEEP, &e),
                     ZI_OK);
    IDX(&c, 0, 3, 11, 0);
    assert_int_equal(zi_text_context_jump_ahead(&c, 4, &e), ZI_EINVAL);
    ERR_HAS(e, "chunked prompt is pending (active_idx 3 < end_idx 11)");
    zi_text_context_free(&c);
}

static void test_ctx_bump_set(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    /* start beyond active: refused, nothing changes */
    assert_int_equal(zi_text_context_bump_token_indices(&c, 6, 0, 0, 0, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "start_idx: 6 is beyond active_idx 5");
    IDX(&c, 0, 5, 5, 0);
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 1, 0, 0, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "active_idx: 6 is beyond end_idx 5");
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 1, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "committed_idx: 1 is beyond start_idx 0");
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, -1, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "committed_idx: -1 is negative");
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, -5, -1, 0, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "end_idx: 4 is below prompt_len 5");
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 124, 0, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "end_idx: 129 is beyond the token array (size 128)");
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, INT64_MAX, 0, 0, &e), ZI_EINVAL);
    ERR_HAS(e, "overflow");
    IDX(&c, 0, 5, 5, 0);
    /* All four move together; the result is checked as a whole. */
    assert_int_equal(zi_text_context_bump_token_indices(&c, 3, 1, 2, 2, &e), ZI_OK);
    IDX(&c, 3, 6, 7, 2);
    assert_int_equal(zi_text_context_bump_token_indices(&c, -1, -1, -2, -2, &e), ZI_OK);
    IDX(&c, 2, 5, 5, 0);
    /* set: ZI_IDX_KEEP leaves an index alone (the seed's None). */
    assert_int_equal(zi_text_context_set_token_indices(&c, 4, ZI_IDX_KEEP, ZI_IDX_KEEP, 1, &e),
                     ZI_OK);
    IDX(&c, 4, 5, 5, 1);
    assert_int_equal(
        zi_text_context_set_token_indices(&c, ZI_IDX_KEEP, 3, ZI_IDX_KEEP, ZI_IDX_KEEP, &e),
        ZI_EINVAL);
    assert_string_equal(e.msg, "start_idx: 4 is beyond active_idx 3");
    IDX(&c, 4, 5, 5, 1);
    assert_int_equal(
        zi_text_context_set_token_indices(&c, INT64_MIN + 1, ZI_IDX_KEEP, ZI_IDX_KEEP, 0, &e),
        ZI_EINVAL);
    assert_int_equal(zi_text_context_set_token_indices(&c, ZI_IDX_KEEP, ZI_IDX_KEEP, ZI_IDX_KEEP,
                                                       ZI_IDX_KEEP, &e),
                     ZI_OK);
    IDX(&c, 4, 5, 5, 1);
    zi_text_context_free(&c);
    /* A zeroed (never initialised) context is refused, not crashed on. */
    zi_text_context_zero(&c);
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 0, &e), ZI_EINVAL);
    ERR_HAS(e, "not initialised");
    assert_int_equal(zi_text_context_bump_token_indices(NULL, 0, 0, 0, 0, &e), ZI_EINVAL);
}

static void test_ctx_jump_ahead(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    assert_int_equal(zi_text_context_update(&c, 7, NULL, &e), ZI_OK);
    IDX(&c, 5, 6, 6, 0);
    assert_int_equal(zi_text_context_jump_ahead(&c, 9, &e), ZI_OK);
    IDX(&c, 5, 7, 7, 0);
    assert_int_equal(c.tokens[6], 9);
    assert_int_equal(zi_text_context_active_length(&c), 2); /* both go in next step */
    assert_int_equal(c.completion_end_idx, 7);              /* and 9 goes to the user */
    assert_int_equal(zi_text_context_jump_ahead(&c, 10, &e), ZI_OK);
    IDX(&c, 5, 8, 8, 0);
    assert_int_equal(zi_text_context_update(&c, 3, NULL, &e), ZI_OK);
    IDX(&c, 8, 9, 9, 0);
    int64_t first, count;
    zi_text_context_take_outstanding(&c, &first, &count);
    assert_int_equal(first, 5);
    assert_int_equal(count, 4);
    assert_int_equal(c.tokens[first + 3], 3);
    assert_int_equal(zi_text_context_jump_ahead(&c, -3, &e), ZI_EINVAL);
    zi_text_context_free(&c);
    /* On a fresh context jump_ahead grows the context-encoding window. */
    new_ctx(&c, 5, 100, NULL);
    assert_int_equal(zi_text_context_jump_ahead(&c, 1, &e), ZI_OK);
    IDX(&c, 0, 6, 6, 0);
    assert_false(c.is_initial_prompt);
    zi_text_context_free(&c);
}

static void test_ctx_rollback(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    for (int32_t t = 30; t < 33; t++)
        assert_int_equal(zi_text_context_update(&c, t, NULL, &e), ZI_OK);
    IDX(&c, 7, 8, 8, 0);
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 7, &e), ZI_OK);
    IDX(&c, 7, 8, 8, 7);
    /* Remove the last 2: token 30 at index 5 must be fed again. */
    assert_int_equal(zi_text_context_rollback(&c, 2, &e), ZI_OK);
    IDX(&c, 5, 6, 6, 5);
    assert_int_equal(c.tokens[5], 30);
    assert_int_equal(c.tokens[6], 0);
    assert_int_equal(c.tokens[7], 0);
    assert_int_equal(c.completion_end_idx, 6);
    assert_int_equal(zi_text_context_generated_count(&c), 1);
    assert_int_equal(zi_text_context_update(&c, 40, NULL, &e), ZI_OK);
    IDX(&c, 6, 7, 7, 5);
    /* Prompt tokens cannot be rolled back. */
    assert_int_equal(zi_text_context_rollback(&c, 3, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "rollback: 3 tokens is outside [0, 2 generated]");
    assert_int_equal(zi_text_context_rollback(&c, -1, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_rollback(&c, 0, &e), ZI_OK);
    IDX(&c, 6, 7, 7, 5);
    /* Everything generated: back to the last prompt token. */
    assert_int_equal(zi_text_context_rollback(&c, 2, &e), ZI_OK);
    IDX(&c, 4, 5, 5, 4);
    assert_int_equal(zi_text_context_generated_count(&c), 0);
    zi_text_context_free(&c);

    /* A rolled-back EOS makes the context active again; CANCELLED stays. */
    new_ctx(&c, 3, 100, NULL);
    int32_t eos = 2;
    assert_int_equal(zi_text_context_set_eos(&c, &eos, 1, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 2, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_END_OF_SEQUENCE);
    assert_int_equal(zi_text_context_rollback(&c, 1, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    IDX(&c, 2, 3, 3, 0);
    assert_int_equal(zi_text_context_update(&c, 6, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_update_status(&c, ZI_GEN_CANCELLED, &e), ZI_OK);
    assert_int_equal(zi_text_context_rollback(&c, 1, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_CANCELLED);
    zi_text_context_free(&c);
}

static void test_ctx_reset(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    assert_int_equal(zi_text_context_update(&c, 21, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 22, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_bump_token_indices(&c, 0, 0, 0, 4, &e), ZI_OK);
    assert_int_equal(zi_text_context_assign_to_cache(&c, 3, &e), ZI_OK);
    IDX(&c, 6, 7, 7, 4);
    /* Evicted: all 7 tokens are re-encoded in the next CE step. */
    zi_text_context_reset(&c);
    IDX(&c, 0, 7, 7, 0);
    assert_true(c.is_initial_prompt);
    assert_true(zi_text_context_is_ce(&c));
    assert_int_equal(zi_text_context_active_length(&c), 7);
    assert_int_equal(c.prompt_len, 5); /* still 2 generated tokens */
    assert_int_equal(zi_text_context_generated_count(&c), 2);
    assert_int_equal(c.cache_seq_id, 3); /* the caller releases the slot */
    assert_memory_equal(zi_text_context_next_tokens(&c), P10, 5 * sizeof(int32_t));
    assert_int_equal(zi_text_context_next_tokens(&c)[6], 22);
    /* Re-encoding may itself be chunked. */
    assert_int_equal(zi_text_context_limit_active(&c, 4, &e), ZI_OK);
    IDX(&c, 0, 4, 7, 0);
    assert_int_equal(zi_text_context_update(&c, 77, NULL, &e), ZI_OK);
    IDX(&c, 4, 7, 7, 0);
    assert_int_equal(zi_text_context_update(&c, 23, NULL, &e), ZI_OK);
    IDX(&c, 7, 8, 8, 0);
    assert_int_equal(c.tokens[7], 23);
    assert_false(c.is_initial_prompt);
    zi_text_context_reset(NULL); /* harmless */
    zi_text_context_free(&c);
}

/* Reset and rollback while a chunk is pending (a context that is
 * re-encoding in chunks after an eviction), and rollback of other endings:
 * the seeds' "all tokens become the new prompt" and "remove the last n". */
static void test_ctx_reset_rollback_mid_chunk(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    for (int32_t t = 21; t <= 25; t++)
        assert_int_equal(zi_text_context_update(&c, t, NULL, &e), ZI_OK);
    IDX(&c, 9, 10, 10, 0);
    zi_text_context_reset(&c);
    assert_int_equal(zi_text_context_limit_active(&c, 4, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 99, NULL, &e), ZI_OK); /* chunk done */
    assert_int_equal(zi_text_context_limit_active(&c, 2, &e), ZI_OK);
    IDX(&c, 4, 6, 10, 0);
    /* A second eviction mid-chunk: every token is the next prompt. */
    zi_text_context_reset(&c);
    IDX(&c, 0, 10, 10, 0);
    assert_int_equal(zi_text_context_active_length(&c), 10);
    /* Rollback with a chunk pending before the new end keeps that window. */
    assert_int_equal(zi_text_context_limit_active(&c, 4, &e), ZI_OK);
    IDX(&c, 0, 4, 10, 0);
    assert_int_equal(zi_text_context_rollback(&c, 2, &e), ZI_OK);
    IDX(&c, 0, 4, 8, 0);
    /* ... and a chunk reaching past it is cut at the new end. */
    assert_int_equal(zi_text_context_update(&c, 98, NULL, &e), ZI_OK);
    IDX(&c, 4, 8, 8, 0);
    assert_int_equal(zi_text_context_limit_active(&c, 3, &e), ZI_OK);
    IDX(&c, 4, 7, 8, 0);
    assert_int_equal(zi_text_context_rollback(&c, 2, &e), ZI_OK);
    IDX(&c, 4, 6, 6, 0);
    assert_int_equal(c.tokens[5], 21);
    zi_text_context_free(&c);

    /* Rollback undoes MAXIMUM_LENGTH and STOP too. */
    new_ctx(&c, 5, 7, NULL);
    assert_int_equal(zi_text_context_update(&c, 21, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 22, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_MAXIMUM_LENGTH);
    assert_int_equal(zi_text_context_rollback(&c, 1, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    IDX(&c, 5, 6, 6, 0);
    zi_text_context_free(&c);
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    int32_t stop_id = 31;
    sp.stop_token_ids.v = &stop_id, sp.stop_token_ids.n = 1;
    new_ctx(&c, 5, 100, &sp);
    assert_int_equal(zi_text_context_update(&c, 31, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_STOP);
    assert_int_equal(zi_text_context_rollback(&c, 1, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    zi_text_context_free(&c);
}

/* jump_ahead ends a context the way update does: an EOS id. */
static void test_ctx_jump_ahead_eos(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    int32_t eos = 2;
    assert_int_equal(zi_text_context_set_eos(&c, &eos, 1, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 21, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_jump_ahead(&c, 2, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_END_OF_SEQUENCE);
    IDX(&c, 5, 7, 7, 0);
    zi_text_context_free(&c);
}

static void test_ctx_num_steps(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    int32_t *big = calloc(100, sizeof *big);
    assert_int_equal(zi_text_context_init(&c, big, 100, 1000, NULL, &e), ZI_OK);
    free(big);
    int64_t n = -5;
    /* CE: the first step feeds 0..99, each later step one more position. */
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 200, &n, &e), ZI_OK);
    assert_int_equal(n, 101);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 100, &n, &e), ZI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 99, &n, &e), ZI_OK);
    assert_int_equal(n, 0);
    assert_int_equal(zi_text_context_update(&c, 1, NULL, &e), ZI_OK);
    IDX(&c, 100, 101, 101, 0);
    /* TG: equals the seed's max_seq_len - start_idx. */
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 200, &n, &e), ZI_OK);
    assert_int_equal(n, 100);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 50, &n, &e), ZI_OK);
    assert_int_equal(n, 0);
    /* A pending chunk allows one step. */
    zi_text_context_reset(&c);
    assert_int_equal(zi_text_context_limit_active(&c, 30, &e), ZI_OK);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 200, &n, &e), ZI_OK);
    assert_int_equal(n, 1);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 20, &n, &e), ZI_OK);
    assert_int_equal(n, 0);
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 0, &n, &e), ZI_EINVAL);
    ERR_HAS(e, "max_seq_len 0");
    assert_int_equal(zi_text_context_compute_num_available_steps(&c, 10, NULL, &e), ZI_EINVAL);
    zi_text_context_free(&c);
}

static void test_ctx_min_token_mask(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.min_new_tokens = 3;
    new_ctx(&c, 5, 100, &sp);
    uint8_t m[8];
    assert_int_equal(zi_text_context_min_token_mask(&c, 5, m, &e), ZI_OK);
    const uint8_t want0[5] = {1, 1, 1, 0, 0}; /* tokens 1..3 must not be EOS */
    assert_memory_equal(m, want0, 5);
    assert_int_equal(zi_text_context_update(&c, 7, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 8, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_min_token_mask(&c, 4, m, &e), ZI_OK);
    const uint8_t want1[4] = {1, 0, 0, 0};
    assert_memory_equal(m, want1, 4);
    /* Chunked prompt: positions still inside the prompt are not masked. */
    zi_text_context_reset(&c);
    assert_int_equal(zi_text_context_set_token_indices(&c, 0, 2, ZI_IDX_KEEP, ZI_IDX_KEEP, &e),
                     ZI_OK);
    assert_int_equal(zi_text_context_min_token_mask(&c, 8, m, &e), ZI_OK);
    const uint8_t want2[8] = {0, 0, 0, 1, 1, 1, 0, 0};
    assert_memory_equal(m, want2, 8);
    assert_int_equal(zi_text_context_min_token_mask(&c, 0, m, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_min_token_mask(&c, 3, NULL, &e), ZI_EINVAL);
    zi_text_context_free(&c);
    /* min_new_tokens = 0: never masked */
    new_ctx(&c, 5, 100, NULL);
    assert_int_equal(zi_text_context_min_token_mask(&c, 3, m, &e), ZI_OK);
    const uint8_t want3[3] = {0, 0, 0};
    assert_memory_equal(m, want3, 3);
    zi_text_context_free(&c);
}

static void test_ctx_status(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    int32_t eos[3] = {2, 3, 2};
    /* EOS id */
    new_ctx(&c, 5, 100, NULL);
    assert_int_equal(zi_text_context_set_eos(&c, eos, 3, &e), ZI_OK);
    assert_int_equal(c.eos_token_ids.n, 2); /* a set */
    assert_int_equal(zi_text_context_update(&c, 3, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_END_OF_SEQUENCE);
    assert_true(zi_text_context_is_done(&c));
    assert_int_equal(zi_text_context_update(&c, 4, NULL, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "update: the context is done (status end_of_sequence)");
    assert_int_equal(zi_text_context_jump_ahead(&c, 4, &e), ZI_EINVAL);
    IDX(&c, 5, 6, 6, 0);
    zi_text_context_free(&c);
    /* ignore_eos: EOS is an ordinary token; max_length still ends it. */
    zi_sampling_params sp;
    zi_sampling_params_init(&sp);
    sp.ignore_eos = true;
    sp.max_new_tokens = 2;
    new_ctx(&c, 5, 100, &sp);
    assert_int_equal(zi_text_context_set_eos(&c, eos, 1, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 2, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    assert_int_equal(zi_text_context_update(&c, 2, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_MAXIMUM_LENGTH);
    assert_int_equal(c.end_idx, 7);
    zi_text_context_free(&c);
    zi_sampling_params_free(&sp);
    /* stop_token_ids give STOP, even with ignore_eos */
    zi_sampling_params_init(&sp);
    sp.ignore_eos = true;
    assert_int_equal(zi_i32_list_push(&sp.stop_token_ids, 44, NULL), ZI_OK);
    new_ctx(&c, 5, 100, &sp);
    assert_int_equal(zi_text_context_update(&c, 43, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    assert_int_equal(zi_text_context_update(&c, 44, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_STOP);
    zi_text_context_free(&c);
    zi_sampling_params_free(&sp);
    /* EOS sequence, matched only within generated tokens */
    new_ctx(&c, 5, 100, NULL);
    int32_t seq[2] = {15, 50}; /* 15 is the prompt's last token */
    assert_int_equal(zi_text_context_add_eos_sequence(&c, seq, 2, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 50, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    assert_int_equal(zi_text_context_update(&c, 15, NULL, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 50, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_END_OF_SEQUENCE);
    assert_int_equal(zi_text_context_add_eos_sequence(&c, seq, 0, &e), ZI_EINVAL);
    int32_t badseq[1] = {-1};
    assert_int_equal(zi_text_context_add_eos_sequence(&c, badseq, 1, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_set_eos(&c, badseq, 1, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "eos_token_ids[0]: -1 is not a token id");
    assert_int_equal(c.eos_token_ids.n, 0); /* unchanged */
    /* update_status */
    assert_int_equal(zi_text_context_update_status(&c, 9, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "update_status: 9 is not a generation status");
    assert_int_equal(zi_text_context_update_status(&c, ZI_GEN_ACTIVE, &e), ZI_OK);
    assert_int_equal(zi_text_context_update(&c, 1, NULL, &e), ZI_OK);
    zi_text_context_free(&c);
    /* max_length reached exactly at end_idx == max_length */
    new_ctx(&c, 5, 7, NULL);
    assert_int_equal(zi_text_context_update(&c, 1, NULL, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_ACTIVE);
    assert_int_equal(zi_text_context_jump_ahead(&c, 1, &e), ZI_OK);
    assert_int_equal(c.status, ZI_GEN_MAXIMUM_LENGTH);
    zi_text_context_free(&c);
}

static void test_ctx_cache(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    int64_t id = -9;
    assert_false(zi_text_context_is_assigned_to_cache(&c));
    assert_int_equal(zi_text_context_cache_seq_id(&c, &id, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "cache_seq_id: not assigned to a cache slot");
    assert_int_equal(zi_text_context_assign_to_cache(&c, -1, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_assign_to_cache(&c, 0, &e), ZI_OK);
    assert_true(zi_text_context_is_assigned_to_cache(&c));
    assert_int_equal(zi_text_context_cache_seq_id(&c, &id, &e), ZI_OK);
    assert_int_equal(id, 0);
    assert_int_equal(zi_text_context_assign_to_cache(&c, 4, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "assign_to_cache: already assigned to cache slot 0");
    assert_int_equal(zi_text_context_unassign_from_cache(&c, &e), ZI_OK);
    assert_int_equal(zi_text_context_unassign_from_cache(&c, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_assign_to_cache(&c, 4, &e), ZI_OK);
    assert_int_equal(c.cache_seq_id, 4);
    zi_text_context_free(&c);
}

/* The array grows in whole chunks and keeps its tokens. */
static void test_ctx_growth(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    int32_t p[127];
    for (int i = 0; i < 127; i++) p[i] = i;
    assert_int_equal(zi_text_context_init(&c, p, 127, 100000, NULL, &e), ZI_OK);
    assert_int_equal(c.size, 128);
    assert_int_equal(zi_text_context_update(&c, 1000, NULL, &e), ZI_OK);
    assert_int_equal(c.size, 128);
    assert_int_equal(zi_text_context_update(&c, 1001, NULL, &e), ZI_OK);
    assert_int_equal(c.size, 256);
    for (int i = 0; i < 300; i++)
        assert_int_equal(zi_text_context_update(&c, 2000 + i, NULL, &e), ZI_OK);
    IDX(&c, 428, 429, 429, 0);
    assert_int_equal(c.size % ZI_CTX_CHUNK, 0);
    assert_true(c.size >= 429);
    for (int i = 0; i < 127; i++) assert_int_equal(c.tokens[i], i);
    assert_int_equal(c.tokens[127], 1000);
    assert_int_equal(c.tokens[128], 1001);
    assert_int_equal(c.tokens[428], 2299);
    assert_int_equal(zi_text_context_check(&c, &e), ZI_OK);
    zi_text_context_free(&c);
}

static void test_ctx_outstanding_logprobs(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    int64_t first = -1, count = -1;
    zi_text_context_take_outstanding(&c, &first, &count);
    assert_int_equal(first, 5);
    assert_int_equal(count, 0);
    for (int i = 0; i < 3; i++) {
        zi_logprobs *lp = malloc(sizeof *lp);
        zi_logprobs_init(lp);
        int32_t id = 100 + i;
        float v = -0.5f * (float)i;
        assert_int_equal(zi_logprobs_push(lp, v, &id, &v, 1, NULL), ZI_OK);
        assert_int_equal(zi_text_context_update(&c, 100 + i, lp, &e), ZI_OK);
    }
    zi_text_context_take_outstanding(&c, &first, &count);
    assert_int_equal(first, 5);
    assert_int_equal(count, 3);
    assert_int_equal(c.tokens[first + 2], 102);
    assert_non_null(c.lp_data[7]);
    assert_int_equal(c.lp_data[7]->top[0].ids[0], 102);
    zi_text_context_take_outstanding(&c, &first, &count);
    assert_int_equal(first, 8);
    assert_int_equal(count, 0);
    /* Rolled-back tokens lose their log probabilities. */
    assert_int_equal(zi_text_context_rollback(&c, 1, &e), ZI_OK);
    assert_null(c.lp_data[7]);
    assert_int_equal(c.completion_start_idx, 7);
    assert_int_equal(c.completion_end_idx, 7);
    /* lp is consumed even when update fails (no leak under ASan). */
    zi_logprobs *lp = malloc(sizeof *lp);
    zi_logprobs_init(lp);
    assert_int_equal(zi_text_context_update(&c, -5, lp, &e), ZI_EINVAL);
    /* draft offset */
    assert_int_equal(zi_text_context_set_draft_offset(&c, 8, &e), ZI_EINVAL);
    assert_int_equal(zi_text_context_set_draft_offset(&c, 6, &e), ZI_OK);
    assert_int_equal(c.draft_offset, 6);
    /* echo: prompt tokens 1..prompt_len-1 take log probabilities; 0 and
     * generated indices do not, and lp is consumed either way. */
    for (int64_t idx = -1; idx <= 6; idx++) {
        zi_logprobs *p = malloc(sizeof *p);
        zi_logprobs_init(p);
        float v = -1.0f;
        assert_int_equal(zi_logprobs_push(p, v, NULL, NULL, 0, NULL), ZI_OK);
        int ok = idx >= 1 && idx < 5;
        assert_int_equal(zi_text_context_set_prompt_logprobs(&c, idx, p, &e),
                         ok ? ZI_OK : ZI_ERANGE);
        if (ok) assert_ptr_equal(c.lp_data[idx], p);
    }
    assert_null(c.lp_data[0]);
    assert_non_null(strstr(e.msg, "1..4"));
    zi_text_context_free(&c);
}

static void test_ctx_check(void **state) {
    (void)state;
    zi_text_context c;
    zi_error e = {0};
    new_ctx(&c, 5, 100, NULL);
    c.completion_start_idx = 2;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    ERR_HAS(e, "completion_start_idx: 2");
    c.completion_start_idx = 5;
    c.max_length = 5;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    ERR_HAS(e, "max_length: 5");
    c.max_length = 100;
    c.status = (zi_gen_status)7;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    ERR_HAS(e, "status: 7");
    c.status = ZI_GEN_ACTIVE;
    c.tokens[2] = -3;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "tokens[2]: -3 is not a token id");
    c.tokens[2] = 3;
    assert_int_equal(zi_text_context_check(&c, &e), ZI_OK);
    zi_text_context_free(&c);
}

/* zi_grow: first size, then doubling with the contents kept; a size that
 * would overflow leaves the array and its capacity as they were. zi_grow_to
 * the same, doubling until a count fits. */
static void test_grow(void **state) {
    (void)state;
    size_t cap = 0;
    int32_t *v = zi_grow(NULL, &cap, sizeof *v, 4);
    assert_non_null(v);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 4; i++) v[i] = 10 + i;
    int32_t *w = zi_grow(v, &cap, sizeof *w, 4);
    assert_non_null(w);
    assert_int_equal(cap, 8);
    for (int i = 0; i < 4; i++) assert_int_equal(w[i], 10 + i);
    size_t huge = SIZE_MAX / 2 + 1;
    assert_null(zi_grow(w, &huge, 1, 4)); /* doubling overflows */
    assert_true(huge == SIZE_MAX / 2 + 1);
    size_t big = SIZE_MAX / 16;
    assert_null(zi_grow(w, &big, 16, 4)); /* bytes overflow */
    assert_true(big == SIZE_MAX / 16);
    assert_int_equal(w[3], 13); /* still the caller's */
    /* zi_grow_to: nothing when there is room; else doubled until enough */
    void *p = w;
    assert_int_equal(zi_grow_to(&p, &cap, sizeof *w, 8, 4), ZI_OK);
    assert_true(p == w && cap == 8);
    assert_int_equal(zi_grow_to(&p, &cap, sizeof *w, 20, 4), ZI_OK);
    assert_int_equal(cap, 32);
    assert_int_equal(((int32_t *)p)[3], 13);
    assert_int_equal(zi_grow_to(&p, &cap, sizeof *w, SIZE_MAX / 2 + 2, 4), ZI_ENOMEM);
    assert_int_equal(zi_grow_to(&p, &cap, 16, SIZE_MAX / 16 + 1, 4), ZI_ENOMEM);
    assert_int_equal(cap, 32); /* unchanged, still the caller's */
    free(p);
    void *q = NULL;
    size_t qcap = 0;
    assert_int_equal(zi_grow_to(&q, &qcap, 1, 300, 256), ZI_OK); /* first, then doubled */
    assert_true(q != NULL && qcap == 512);
    free(q);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grow),
        cmocka_unit_test(test_sampling_defaults),
        cmocka_unit_test(test_sampling_validate),
        cmocka_unit_test(test_sampling_copy),
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_logprobs),
        cmocka_unit_test(test_responses),
        cmocka_unit_test(test_request_basics),
        cmocka_unit_test(test_ctx_init),
        cmocka_unit_test(test_ctx_init_errors),
        cmocka_unit_test(test_ctx_update_sequence),
        cmocka_unit_test(test_ctx_chunked_prefill),
        cmocka_unit_test(test_ctx_bump_set),
        cmocka_unit_test(test_ctx_jump_ahead),
        cmocka_unit_test(test_ctx_rollback),
        cmocka_unit_test(test_ctx_reset),
        cmocka_unit_test(test_ctx_reset_rollback_mid_chunk),
        cmocka_unit_test(test_ctx_jump_ahead_eos),
        cmocka_unit_test(test_ctx_num_steps),
        cmocka_unit_test(test_ctx_min_token_mask),
        cmocka_unit_test(test_ctx_status),
        cmocka_unit_test(test_ctx_cache),
        cmocka_unit_test(test_ctx_growth),
        cmocka_unit_test(test_ctx_outstanding_logprobs),
        cmocka_unit_test(test_ctx_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
