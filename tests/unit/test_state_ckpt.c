/*
 * test_state_ckpt.c - the table of a hybrid's state checkpoints
 * (model_worker/state_ckpt.h): a checkpoint is found only for the exact
 * prefix it was taken of (hash and tokens both); an owner's newer
 * checkpoint of a kind replaces its older one; a full table gives way to
 * the least recently used, unowned ones first; disowned checkpoints stay
 * findable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "state_ckpt.h"

static void test_find_exact(void **state) {
    (void)state;
    zi_state_ckpts *t = NULL;
    zi_error err = {0};
    assert_int_equal(zi_state_ckpts_create(3, &t, &err), ZI_OK);
    int32_t a[32], b[32];
    for (int i = 0; i < 32; i++) a[i] = i, b[i] = i;
    b[31] = 99;
    assert_int_equal(zi_state_ckpts_find(t, 7, a, 32), -1);
    int r = zi_state_ckpts_take(t, 0, ZI_CKPT_PROMPT, 7, a, 32);
    assert_true(r >= 0 && r < 3);
    assert_int_equal(zi_state_ckpts_find(t, 7, a, 32), r);
    assert_int_equal(zi_state_ckpts_find(t, 7, b, 32), -1); /* same hash, other tokens */
    assert_int_equal(zi_state_ckpts_find(t, 8, a, 32), -1);
    assert_int_equal(zi_state_ckpts_find(t, 7, a, 16), -1);
    /* taking the same prefix again gives the same row */
    assert_int_equal(zi_state_ckpts_take(t, 1, ZI_CKPT_LATEST, 7, a, 32), r);
    assert_int_equal(zi_state_ckpts_count(t), 3);
    zi_state_ckpts_free(t);
}

static void test_replace_and_evict(void **state) {
    (void)state;
    zi_state_ckpts *t = NULL;
    zi_error err = {0};
    assert_int_equal(zi_state_ckpts_create(3, &t, &err), ZI_OK);
    int32_t tk[64];
    for (int i = 0; i < 64; i++) tk[i] = 1000 + i;
    /* owner 0: a prompt checkpoint, then latest ones replacing each other */
    int p = zi_state_ckpts_take(t, 0, ZI_CKPT_PROMPT, 1, tk, 16);
    int l1 = zi_state_ckpts_take(t, 0, ZI_CKPT_LATEST, 2, tk, 32);
    int l2 = zi_state_ckpts_take(t, 0, ZI_CKPT_LATEST, 3, tk, 48);
    assert_int_equal(l1, l2);
    assert_true(p != l1);
    assert_int_equal(zi_state_ckpts_find(t, 2, tk, 32), -1);
    assert_int_equal(zi_state_ckpts_find(t, 3, tk, 48), l2);
    /* owner 1 takes the free row */
    int o1 = zi_state_ckpts_take(t, 1, ZI_CKPT_PROMPT, 4, tk, 64);
    assert_true(o1 != p && o1 != l2);
    /* full: owner 2 takes owner 2's... none, no unowned: the least recently used */
    zi_state_ckpts_find(t, 1, tk, 16); /* p used now */
    int o2 = zi_state_ckpts_take(t, 2, ZI_CKPT_PROMPT, 5, tk, 16);
    assert_int_equal(o2, l2); /* l2 was used least recently */
    /* disowned checkpoints stay findable, and go first when the table is full */
    zi_state_ckpts_disown(t, 1);
    assert_int_equal(zi_state_ckpts_find(t, 4, tk, 64), o1);
    int o3 = zi_state_ckpts_take(t, 3, ZI_CKPT_PROMPT, 6, tk, 32);
    assert_int_equal(o3, o1);
    assert_int_equal(zi_state_ckpts_find(t, 4, tk, 64), -1);
    zi_state_ckpts_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_find_exact),
        cmocka_unit_test(test_replace_and_evict),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
