/*
 * test_req_table.c - cmocka tests for router/req_table.c: put/get/del,
 * refusal of key 0 and duplicates, growth, deletion inside probe runs
 * (backward shift keeps every other key reachable), and a long random
 * put/del sequence checked against a plain array model.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "req_table.h"

static void test_put_get_del(void **state) {
    (void)state;
    zi_req_table t;
    zi_req_table_init(&t);
    zi_error e = {0};
    int a = 1, b = 2;
    assert_null(zi_req_table_get(&t, 5));
    assert_int_equal(zi_req_table_put(&t, 5, &a, &e), ZI_OK);
    assert_int_equal(zi_req_table_put(&t, 6, &b, &e), ZI_OK);
    assert_ptr_equal(zi_req_table_get(&t, 5), &a);
    assert_ptr_equal(zi_req_table_get(&t, 6), &b);
    assert_int_equal(zi_req_table_count(&t), 2);
    assert_ptr_equal(zi_req_table_del(&t, 5), &a);
    assert_null(zi_req_table_get(&t, 5));
    assert_null(zi_req_table_del(&t, 5));
    assert_ptr_equal(zi_req_table_get(&t, 6), &b);
    assert_int_equal(zi_req_table_count(&t), 1);
    zi_req_table_free(&t);
}

static void test_refuses_zero_and_duplicates(void **state) {
    (void)state;
    zi_req_table t;
    zi_req_table_init(&t);
    zi_error e = {0};
    int a = 1;
    assert_int_equal(zi_req_table_put(&t, 0, &a, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "0"));
    assert_int_equal(zi_req_table_put(&t, 9, &a, &e), ZI_OK);
    assert_int_equal(zi_req_table_put(&t, 9, &a, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "already"));
    assert_int_equal(zi_req_table_count(&t), 1);
    assert_null(zi_req_table_get(&t, 0));
    zi_req_table_free(&t);
}

static bool any(const void *val, const void *arg) {
    (void)val;
    (void)arg;
    return true;
}

static void test_growth_and_values(void **state) {
    (void)state;
    zi_req_table t;
    zi_req_table_init(&t);
    zi_error e = {0};
    enum { N = 5000 };
    static int vals[N + 1];
    for (uint64_t k = 1; k <= N; k++)
        assert_int_equal(zi_req_table_put(&t, k, &vals[k], &e), ZI_OK);
    assert_int_equal(zi_req_table_count(&t), N);
    assert_true(t.cap >= 2 * N);
    for (uint64_t k = 1; k <= N; k++) assert_ptr_equal(zi_req_table_get(&t, k), &vals[k]);
    size_t seen = 0, pos = 0;
    for (int *v; (v = zi_req_table_find(&t, &pos, any, NULL)); pos++) {
        ptrdiff_t d = v - vals;
        assert_true(d >= 1 && d <= N);
        seen++;
    }
    assert_int_equal(seen, N);
    zi_req_table_free(&t);
}

static bool is_even(const void *val, const void *arg) {
    (void)arg;
    return *(const int *)val % 2 == 0;
}

/* find: the values that match, taken out in one walk of the table (the
 * router's way of ending requests without allocating). */
static void test_find_and_remove(void **state) {
    (void)state;
    zi_req_table t;
    zi_req_table_init(&t);
    zi_error e = {0};
    enum { N = 300 };
    static int vals[N + 1];
    for (uint64_t k = 1; k <= N; k++) {
        vals[k] = (int)k;
        assert_int_equal(zi_req_table_put(&t, k, &vals[k], &e), ZI_OK);
    }
    int taken = 0;
    size_t pos = 0;
    for (int *v; (v = zi_req_table_find(&t, &pos, is_even, NULL));) {
        assert_int_equal(*v % 2, 0);
        assert_ptr_equal(zi_req_table_del(&t, (uint64_t)*v), v);
        taken++;
    }
    assert_int_equal(taken, N / 2);
    assert_int_equal(zi_req_table_count(&t), N - N / 2);
    for (uint64_t k = 1; k <= N; k++)
        assert_true((zi_req_table_get(&t, k) != NULL) == (k % 2 == 1));
    zi_req_table_free(&t);
    pos = 0;
    assert_null(zi_req_table_find(&t, &pos, is_even, NULL)); /* empty table */
}

static uint64_t next_rand(uint64_t *s);

static bool key_in_set(const void *val, const void *arg) {
    return (*(const uint64_t *)val % 3) == *(const uint64_t *)arg;
}

/* One walk takes out every match whatever the layout: random keys near
 * half load, so probe runs are long and some wrap past the last slot (the
 * case where the backward shift moves entries from the front to the back). */
static void test_find_one_walk_random(void **state) {
    (void)state;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    int wrapped = 0;
    for (int trial = 0; trial < 400; trial++) {
        zi_req_table t;
        zi_req_table_init(&t);
        zi_error e = {0};
        static uint64_t keys[60];
        int n = 20 + (int)(next_rand(&seed) % 40);
        for (int i = 0; i < n; i++) {
            do keys[i] = next_rand(&seed) | 1;
            while (zi_req_table_get(&t, keys[i]));
            assert_int_equal(zi_req_table_put(&t, keys[i], &keys[i], &e), ZI_OK);
        }
        wrapped += t.slots[0].key && t.slots[t.cap - 1].key;
        uint64_t r = trial % 3;
        size_t pos = 0;
        int taken = 0;
        for (uint64_t *v; (v = zi_req_table_find(&t, &pos, key_in_set, &r));) {
            assert_ptr_equal(zi_req_table_del(&t, *v), v);
            taken++;
        }
        int want = 0;
        for (int i = 0; i < n; i++) {
            bool match = keys[i] % 3 == r;
            want += match;
            assert_true((zi_req_table_get(&t, keys[i]) != NULL) == !match);
        }
        assert_int_equal(taken, want);
        assert_int_equal(zi_req_table_count(&t), (size_t)(n - want));
        zi_req_table_free(&t);
    }
    assert_true(wrapped > 20); /* the wrapping case did occur */
}

/* xorshift64: a fixed, reproducible sequence. */
static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void test_random_against_model(void **state) {
    (void)state;
    enum { KEYS = 300, OPS = 200000 };
    void *model[KEYS + 1];
    memset(model, 0, sizeof model);
    static int vals[KEYS + 1];
    zi_req_table t;
    zi_req_table_init(&t);
    zi_error e = {0};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    size_t count = 0;
    for (int op = 0; op < OPS; op++) {
        uint64_t k = 1 + next_rand(&rng) % KEYS;
        if (next_rand(&rng) & 1) {
            int rc = zi_req_table_put(&t, k, &vals[k], &e);
            assert_int_equal(rc, model[k] ? ZI_EINVAL : ZI_OK);
            if (!model[k]) model[k] = &vals[k], count++;
        } else {
            assert_ptr_equal(zi_req_table_del(&t, k), model[k]);
            if (model[k]) model[k] = NULL, count--;
        }
        if (op % 1000 == 0)
            for (uint64_t j = 1; j <= KEYS; j++)
                assert_ptr_equal(zi_req_table_get(&t, j), model[j]);
    }
    assert_int_equal(zi_req_table_count(&t), count);
    for (uint64_t j = 1; j <= KEYS; j++) assert_ptr_equal(zi_req_table_get(&t, j), model[j]);
    zi_req_table_free(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_del),
        cmocka_unit_test(test_refuses_zero_and_duplicates),
        cmocka_unit_test(test_growth_and_values),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_find_and_remove),
        cmocka_unit_test(test_find_one_walk_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
