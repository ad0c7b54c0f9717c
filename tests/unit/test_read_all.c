/*
 * test_read_all.c - zi_read_all (common/read_all.h): a stream read whole,
 * NUL-terminated, at the limit and one byte past it, empty, larger than the
 * first buffer, and from a pipe.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "read_all.h"
#include "zi_error.h"

/* A temporary file holding n bytes of a pattern, rewound. */
static FILE *file_of(size_t n) {
    FILE *f = tmpfile();
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) fputc('a' + (int)(i % 26), f);
    rewind(f);
    return f;
}

static void check_pattern(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) assert_int_equal(p[i], 'a' + (int)(i % 26));
    assert_int_equal(p[n], 0);
}

static void test_empty(void **state) {
    (void)state;
    FILE *f = file_of(0);
    char *p = NULL;
    size_t n = 7;
    assert_int_equal(zi_read_all(f, 10, &p, &n), ZI_OK);
    assert_int_equal(n, 0);
    assert_non_null(p);
    assert_int_equal(p[0], 0);
    free(p);
    fclose(f);
}

static void test_at_limit_and_past_it(void **state) {
    (void)state;
    FILE *f = file_of(1000);
    char *p = NULL;
    size_t n = 0;
    assert_int_equal(zi_read_all(f, 1000, &p, &n), ZI_OK);
    assert_int_equal(n, 1000);
    check_pattern(p, n);
    free(p);
    rewind(f);
    assert_int_equal(zi_read_all(f, 999, &p, &n), ZI_ERANGE);
    assert_null(p);
    assert_int_equal(n, 0);
    fclose(f);
}

static void test_larger_than_first_buffer(void **state) {
    (void)state;
    const size_t big = (3u << 20) + 17; /* past several doublings of 64 KiB */
    FILE *f = file_of(big);
    char *p = NULL;
    size_t n = 0;
    assert_int_equal(zi_read_all(f, (size_t)16 << 20, &p, &n), ZI_OK);
    assert_int_equal(n, big);
    check_pattern(p, n);
    free(p);
    rewind(f);
    assert_int_equal(zi_read_all(f, big - 1, &p, &n), ZI_ERANGE);
    fclose(f);
}

static void test_pipe(void **state) {
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    const char msg[] = "{\"text\": \"from a pipe\"}";
    assert_int_equal(write(fd[1], msg, sizeof msg - 1), (ssize_t)(sizeof msg - 1));
    close(fd[1]);
    FILE *f = fdopen(fd[0], "rb");
    assert_non_null(f);
    char *p = NULL;
    size_t n = 0;
    assert_int_equal(zi_read_all(f, SIZE_MAX, &p, &n), ZI_OK); /* no limit: no wrap */
    assert_int_equal(n, sizeof msg - 1);
    assert_string_equal(p, msg);
    free(p);
    fclose(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_at_limit_and_past_it),
        cmocka_unit_test(test_larger_than_first_buffer),
        cmocka_unit_test(test_pipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
