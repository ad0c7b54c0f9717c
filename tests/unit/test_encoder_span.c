/*
 * test_encoder_span.c - an encoder's pass (family.h "encoder"): the
 * attention spans that make attention bidirectional within an input
 * (encoder_span.h), and the embedder's scheduling of whole inputs, which
 * wait for a step with room instead of being cut into chunks (embedder.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "embedder.h"
#include "encoder_span.h"
#include "kv_blocks.h"

static void test_spans(void **state) {
    (void)state;
    /* Two inputs interleaved in one pass: rows 0 (3 tokens) and 2 (2). */
    const int32_t pos[] = {0, 0, 1, 2, 1}, seq[] = {0, 2, 0, 0, 2};
    int32_t span[5], scratch[6];
    zi_error err = {0};
    assert_int_equal(zi_encoder_spans(pos, seq, 5, 3, span, scratch, &err), ZI_OK);
    const int32_t want[] = {2, 1, 2, 2, 1};
    assert_memory_equal(span, want, sizeof want);
    /* The same tokens grouped by input for span_attention: row 0's, then
     * row 2's, each in batch order; row 1 (no tokens) gives no group. */
    int32_t order[5], starts[4];
    int n_groups = -1;
    zi_encoder_groups(seq, 5, 3, order, starts, &n_groups, scratch);
    const int32_t want_order[] = {0, 2, 3, 1, 4}, want_starts[] = {0, 3, 5};
    assert_int_equal(n_groups, 2);
    assert_memory_equal(order, want_order, sizeof want_order);
    assert_memory_equal(starts, want_starts, sizeof want_starts);
    /* A part of an input (positions 1..2 without 0) is refused by row. */
    const int32_t pos2[] = {1, 2}, seq2[] = {1, 1};
    assert_int_equal(zi_encoder_spans(pos2, seq2, 2, 2, span, scratch, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "sequence 1"));
    assert_non_null(strstr(err.msg, "whole in one pass"));
}

/* Schedules in[] into a step of budget tokens (whole inputs: whole_budget);
 * returns the tokens taken. */
static int schedule2(zi_embed_input *const *in, size_t n, zi_kv_blocks *kb, int budget,
                     int whole_budget, zi_embed_step *s) {
    static int32_t tokens[64], pos[64], seq[64], tables[8 * 16];
    static uint8_t want_logits[64], want_hidden[64];
    static zi_embed_input *stepped[8];
    *s = (zi_embed_step){.tokens = tokens,
                         .pos = pos,
                         .seq = seq,
                         .want_logits = want_logits,
                         .want_hidden = want_hidden,
                         .tables = tables,
                         .table_stride = 16,
                         .block_size = 4,
                         .stepped = stepped};
    zi_embed_schedule(in, n, kb, budget, whole_budget, s);
    return s->n_tokens;
}

static int schedule(zi_embed_input *const *in, size_t n, zi_kv_blocks *kb, int budget,
                    zi_embed_step *s) {
    return schedule2(in, n, kb, budget, budget, s);
}

static void test_whole_inputs_wait(void **state) {
    (void)state;
    zi_kv_blocks *kb;
    zi_error err = {0};
    assert_int_equal(zi_kv_blocks_create(32, 4, &kb, &err), ZI_OK);
    int32_t ids[10] = {0};
    zi_embed_input a, b;
    assert_int_equal(zi_embed_input_init(&a, ids, 6, 2, ZI_POOLING_CLS, false, 4, &err), ZI_OK);
    assert_int_equal(zi_embed_input_init(&b, ids, 3, 2, ZI_POOLING_CLS, false, 4, &err), ZI_OK);
    a.whole = b.whole = true;
    zi_embed_input *in[] = {&a, &b};
    zi_embed_step s;
    /* A budget of 5: a (6 tokens) waits, uncut, and takes no blocks; b runs. */
    assert_int_equal(schedule(in, 2, kb, 5, &s), 3);
    assert_int_equal(s.n_stepped, 1);
    assert_ptr_equal(s.stepped[0], &b);
    assert_int_equal(a.n_blocks, 0);
    float hidden[2] = {1, 2};
    zi_embed_collect(&s, hidden, kb);
    assert_true(b.done);
    /* The next step has room: a runs whole. */
    assert_int_equal(schedule(in, 2, kb, 8, &s), 6);
    assert_int_equal(s.n_stepped, 1);
    assert_ptr_equal(s.stepped[0], &a);
    zi_embed_collect(&s, hidden, kb);
    assert_true(a.done);
    /* Without whole, the same input is cut to the budget (a chunk). */
    zi_embed_input c;
    assert_int_equal(zi_embed_input_init(&c, ids, 6, 2, ZI_POOLING_CLS, false, 4, &err), ZI_OK);
    zi_embed_input *in2[] = {&c};
    assert_int_equal(schedule(in2, 1, kb, 5, &s), 5);
    zi_embed_release(&c, kb);
    /* A step whose prompt chunk leaves 2 tokens but whose batch has room
     * for 7: a whole input of 6 runs (decoding cannot starve it), a cut
     * one after it gets what is left of the chunk's 2, nothing. */
    zi_embed_input d, f;
    assert_int_equal(zi_embed_input_init(&d, ids, 6, 2, ZI_POOLING_CLS, false, 4, &err), ZI_OK);
    assert_int_equal(zi_embed_input_init(&f, ids, 3, 2, ZI_POOLING_CLS, false, 4, &err), ZI_OK);
    d.whole = true;
    zi_embed_input *in3[] = {&d, &f};
    assert_int_equal(schedule2(in3, 2, kb, 2, 7, &s), 6);
    assert_int_equal(s.n_stepped, 1);
    assert_ptr_equal(s.stepped[0], &d);
    zi_embed_release(&d, kb);
    zi_embed_input_free(&d);
    zi_embed_input_free(&f);
    zi_embed_input_free(&a);
    zi_embed_input_free(&b);
    zi_embed_input_free(&c);
    zi_kv_blocks_free(kb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spans),
        cmocka_unit_test(test_whole_inputs_wait),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
