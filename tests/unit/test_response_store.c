/*
 * test_response_store.c - cmocka tests for the Responses API's store
 * (http/response_store.c): both bounds (entries, bytes) evict the least
 * recently used entries, a get makes an entry the most recent, a put of an
 * existing id replaces it, an entry larger than the byte bound is not kept,
 * delete, and several threads putting and getting at once keep the bounds
 * and lose nothing they should keep.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <pthread.h>

#include "response_store.h"

static int has(zi_response_store *s, const char *id) {
    char *r = NULL, *i = NULL;
    int rc = zi_response_store_get(s, id, &r, &i);
    assert_true(rc == 0 || rc == 1);
    free(r);
    free(i);
    return rc == 0;
}

static void test_entry_bound_lru(void **unused) {
    (void)unused;
    zi_response_store *s = zi_response_store_new(3, 1 << 20);
    assert_non_null(s);
    assert_int_equal(zi_response_store_put(s, "a", "{\"id\":\"a\"}", "[]"), 0);
    assert_int_equal(zi_response_store_put(s, "b", "{}", "[]"), 0);
    assert_int_equal(zi_response_store_put(s, "c", "{}", "[]"), 0);
    assert_true(has(s, "a")); /* a is now the most recent; b the least */
    assert_int_equal(zi_response_store_put(s, "d", "{}", "[]"), 0);
    assert_false(has(s, "b"));
    assert_true(has(s, "a") && has(s, "c") && has(s, "d"));
    size_t n, bytes;
    zi_response_store_usage(s, &n, &bytes);
    assert_int_equal(n, 3);
    char *r = NULL, *i = NULL;
    assert_int_equal(zi_response_store_get(s, "a", &r, &i), 0);
    assert_string_equal(r, "{\"id\":\"a\"}");
    assert_string_equal(i, "[]");
    free(r);
    free(i);
    /* the same id again replaces the entry */
    assert_int_equal(zi_response_store_put(s, "a", "{\"v\":2}", "[1]"), 0);
    zi_response_store_usage(s, &n, NULL);
    assert_int_equal(n, 3);
    assert_int_equal(zi_response_store_get(s, "a", &r, NULL), 0);
    assert_string_equal(r, "{\"v\":2}");
    free(r);
    assert_int_equal(zi_response_store_delete(s, "a"), 0);
    assert_int_equal(zi_response_store_delete(s, "a"), 1);
    assert_false(has(s, "a"));
    zi_response_store_free(s);
}

static void test_byte_bound(void **unused) {
    (void)unused;
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    /* room for about three entries of ~1 KB and their bookkeeping */
    zi_response_store *s = zi_response_store_new(100, 3500);
    assert_non_null(s);
    const char *ids[] = {"r0", "r1", "r2", "r3", "r4"};
    for (int k = 0; k < 5; k++) assert_int_equal(zi_response_store_put(s, ids[k], big, "[]"), 0);
    size_t n, bytes;
    zi_response_store_usage(s, &n, &bytes);
    assert_true(bytes <= 3500);
    assert_true(n >= 2 && n <= 3);
    assert_false(has(s, "r0"));
    assert_true(has(s, "r4") && has(s, "r3"));
    /* larger than the whole bound: not kept, nothing evicted for it */
    char *huge = malloc(5000);
    memset(huge, 'y', 4999);
    huge[4999] = 0;
    assert_int_equal(zi_response_store_put(s, "h", huge, "[]"), 1);
    free(huge);
    assert_false(has(s, "h"));
    zi_response_store_usage(s, &n, NULL);
    assert_true(n >= 2);
    /* an over-long id is not kept */
    char longid[ZI_RESPONSE_ID_MAX + 8];
    memset(longid, 'i', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    assert_int_equal(zi_response_store_put(s, longid, "{}", "[]"), 1);
    zi_response_store_free(s);
    /* a store that keeps nothing */
    s = zi_response_store_new(0, 1 << 20);
    assert_int_equal(zi_response_store_put(s, "a", "{}", "[]"), 1);
    assert_false(has(s, "a"));
    zi_response_store_free(s);
}

typedef struct worker {
    zi_response_store *s;
    int t;
} worker;

static void *hammer(void *p) {
    worker *w = p;
    char id[32];
    for (int k = 0; k < 2000; k++) {
        snprintf(id, sizeof id, "t%d-%d", w->t, k);
        if (zi_response_store_put(w->s, id, "{\"x\":1}", "[]")) return (void *)1;
        char *r = NULL;
        /* just put: found unless the other threads evicted it since */
        int rc = zi_response_store_get(w->s, id, &r, NULL);
        if (rc < 0 || (rc == 0 && strcmp(r, "{\"x\":1}"))) return (void *)1;
        free(r);
        if (k % 3 == 0) zi_response_store_delete(w->s, id);
    }
    return NULL;
}

static void test_threads(void **unused) {
    (void)unused;
    zi_response_store *s = zi_response_store_new(50, 1 << 20);
    pthread_t th[4];
    worker w[4];
    for (int t = 0; t < 4; t++) {
        w[t] = (worker){s, t};
        assert_int_equal(pthread_create(&th[t], NULL, hammer, &w[t]), 0);
    }
    for (int t = 0; t < 4; t++) {
        void *rv;
        pthread_join(th[t], &rv);
        assert_null(rv);
    }
    size_t n, bytes;
    zi_response_store_usage(s, &n, &bytes);
    assert_true(n <= 50 && n > 0);
    assert_true(has(s, "t0-1999") || has(s, "t1-1999") || has(s, "t2-1999") || has(s, "t3-1999"));
    zi_response_store_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_entry_bound_lru),
        cmocka_unit_test(test_byte_bound),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
