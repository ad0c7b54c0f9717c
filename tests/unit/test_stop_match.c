/*
 * test_stop_match.c - cmocka tests for tokenizer_proc/stop_match.c: stop
 * strings found inside one piece and across piece (token) boundaries, the
 * earliest of several stops winning, held-back text released when it turns
 * out not to be a stop, nothing released after a stop, flush at the end,
 * multi-byte characters never split, no stops at all, and text passed
 * through unmatched (zi_stop_pass).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "stop_match.h"

typedef struct run {
    char *out;
    size_t len;
    bool stopped;
} run;

static void init(zi_stop_matcher *m, const char *const *stops, size_t n) {
    size_t lens[8] = {0};
    for (size_t i = 0; i < n; i++) lens[i] = strlen(stops[i]);
    zi_error e = {0};
    assert_int_equal(zi_stop_init(m, stops, lens, n, &e), ZI_OK);
}

/* Feeds one piece; returns what this piece released (a fresh string). */
static char *feed(zi_stop_matcher *m, const char *piece, run *r) {
    zi_error e = {0};
    size_t before = r->len;
    assert_int_equal(zi_stop_feed(m, piece, strlen(piece), &r->out, &r->len, &r->stopped, &e),
                     ZI_OK);
    char *s = malloc(r->len - before + 1);
    memcpy(s, r->out ? r->out + before : "", r->len - before);
    s[r->len - before] = '\0';
    return s;
}

#define FEED_EXPECT(m, piece, r, want)                                                             \
    do {                                                                                           \
        char *got_ = feed((m), (piece), (r));                                                      \
        assert_string_equal(got_, (want));                                                         \
        free(got_);                                                                                \
    } while (0)

static void test_no_stops_passes_through(void **state) {
    (void)state;
    zi_stop_matcher m;
    init(&m, NULL, 0);
    run r = {0};
    FEED_EXPECT(&m, "Hello", &r, "Hello");
    FEED_EXPECT(&m, " world", &r, " world");
    assert_false(r.stopped);
    assert_int_equal(m.matched, -1);
    zi_error e = {0};
    assert_int_equal(zi_stop_flush(&m, &r.out, &r.len, &e), ZI_OK);
    assert_string_equal(r.out, "Hello world");
    free(r.out);
    zi_stop_free(&m);
}

static void test_stop_inside_one_piece(void **state) {
    (void)state;
    const char *stops[] = {"END"};
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "abc END def", &r, "abc ");
    assert_true(r.stopped);
    FEED_EXPECT(&m, "more", &r, ""); /* nothing after a stop */
    assert_true(r.stopped);
    free(r.out);
    zi_stop_free(&m);
}

static void test_stop_across_pieces(void **state) {
    (void)state;
    const char *stops[] = {"<end>"};
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "one <", &r, "one "); /* "<" held: it may start the stop */
    FEED_EXPECT(&m, "en", &r, "");
    assert_false(r.stopped);
    FEED_EXPECT(&m, "d> two", &r, "");
    assert_true(r.stopped);
    assert_int_equal(r.len, 4);
    assert_memory_equal(r.out, "one ", 4);
    free(r.out);
    zi_stop_free(&m);
}

static void test_false_start_is_released(void **state) {
    (void)state;
    const char *stops[] = {"<end>"};
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "a <e", &r, "a ");
    FEED_EXPECT(&m, "x", &r, "<ex"); /* "<ex" can no longer become "<end>" */
    FEED_EXPECT(&m, "<", &r, "");
    zi_error e = {0};
    assert_int_equal(zi_stop_flush(&m, &r.out, &r.len, &e), ZI_OK);
    assert_string_equal(r.out, "a <ex<");
    assert_false(r.stopped);
    free(r.out);
    zi_stop_free(&m);
}

static void test_earliest_stop_wins(void **state) {
    (void)state;
    const char *stops[] = {"world", "lo w", "zzz"};
    zi_stop_matcher m;
    init(&m, stops, 3);
    run r = {0};
    FEED_EXPECT(&m, "hel", &r, "he");     /* "l" may start "lo w" */
    FEED_EXPECT(&m, "lo world", &r, "l"); /* "lo w" starts before "world" */
    assert_true(r.stopped);
    assert_int_equal(r.len, 3);
    assert_int_equal(m.matched, 1); /* the one that ended it, for the final frame */
    free(r.out);
    zi_stop_free(&m);
}

static void test_overlapping_prefix_held(void **state) {
    (void)state;
    /* "aab" after "aaa": the held suffix must be the longest one that is
     * still a stop prefix ("aa"), so the match is found. */
    const char *stops[] = {"aab"};
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "xaaa", &r, "xa");
    FEED_EXPECT(&m, "b!", &r, "");
    assert_true(r.stopped);
    assert_int_equal(r.len, 2);
    assert_memory_equal(r.out, "xa", 2);
    free(r.out);
    zi_stop_free(&m);
}

static void test_multibyte_not_split(void **state) {
    (void)state;
    /* The stop starts with the same lead byte as a character in the text;
     * a release never ends inside "é" (0xc3 0xa9). */
    const char *stops[] = {"\xc3\xa8t"}; /* "èt" */
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "caf\xc3\xa9", &r, "caf\xc3\xa9");
    FEED_EXPECT(&m, " \xc3\xa8", &r, " "); /* "è" held whole */
    FEED_EXPECT(&m, "s", &r, "\xc3\xa8s");
    FEED_EXPECT(&m, "\xc3\xa8t", &r, "");
    assert_true(r.stopped);
    assert_string_equal(r.out, "caf\xc3\xa9 \xc3\xa8s");
    free(r.out);
    zi_stop_free(&m);
}

static void test_flush_after_stop_releases_nothing(void **state) {
    (void)state;
    const char *stops[] = {"STOP", ""}; /* the empty stop is ignored */
    zi_stop_matcher m;
    init(&m, stops, 2);
    assert_int_equal(m.n, 1);
    run r = {0};
    FEED_EXPECT(&m, "xSTOPy", &r, "x");
    zi_error e = {0};
    assert_int_equal(zi_stop_flush(&m, &r.out, &r.len, &e), ZI_OK);
    assert_int_equal(r.len, 1);
    free(r.out);
    zi_stop_free(&m);
}

static void test_flush_releases_held_prefix(void **state) {
    (void)state;
    const char *stops[] = {"###"};
    zi_stop_matcher m;
    init(&m, stops, 1);
    run r = {0};
    FEED_EXPECT(&m, "end ##", &r, "end ");
    zi_error e = {0};
    assert_int_equal(zi_stop_flush(&m, &r.out, &r.len, &e), ZI_OK);
    assert_string_equal(r.out, "end ##");
    free(r.out);
    zi_stop_free(&m);
}

/* zi_stop_pass (a request's first min_new_tokens tokens): its text is
 * released whole even when it holds a stop string; matching starts with the
 * next fed piece, and nothing is released after a stop. */
static void test_pass_skips_matching(void **state) {
    (void)state;
    zi_stop_matcher m;
    const char *stops[] = {"END"};
    init(&m, stops, 1);
    run r = {0};
    zi_error e = {0};
    assert_int_equal(zi_stop_pass(&m, "an END here", 11, &r.out, &r.len, &e), ZI_OK);
    assert_int_equal(r.len, 11);
    assert_memory_equal(r.out, "an END here", 11);
    FEED_EXPECT(&m, " E", &r, " "); /* "E" may start a stop: held */
    assert_int_equal(zi_stop_pass(&m, "Nx", 2, &r.out, &r.len, &e), ZI_OK); /* held "E" first */
    assert_int_equal(r.len, 15);
    assert_memory_equal(r.out + 12, "ENx", 3);
    FEED_EXPECT(&m, " the END.", &r, " the ");
    assert_true(r.stopped);
    assert_int_equal(zi_stop_pass(&m, "more", 4, &r.out, &r.len, &e), ZI_OK);
    assert_int_equal(r.len, 20);
    free(r.out);
    zi_stop_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_stops_passes_through),
        cmocka_unit_test(test_stop_inside_one_piece),
        cmocka_unit_test(test_stop_across_pieces),
        cmocka_unit_test(test_false_start_is_released),
        cmocka_unit_test(test_earliest_stop_wins),
        cmocka_unit_test(test_overlapping_prefix_held),
        cmocka_unit_test(test_multibyte_not_split),
        cmocka_unit_test(test_flush_after_stop_releases_nothing),
        cmocka_unit_test(test_flush_releases_held_prefix),
        cmocka_unit_test(test_pass_skips_matching),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
