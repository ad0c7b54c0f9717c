/*
 * test_http_page.c - the chat page's table (http/http_page.h): which paths
 * name a file and which do not (nothing outside the table, no "..", no
 * subfolders), each file's Content-Type, and the embedded bytes equal to
 * the files in http/page/ (run from the source root, as meson does).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "http_page.h"

static void paths(void **state) {
    (void)state;
    const zi_http_page_file *f = zi_http_page_find("/");
    assert_non_null(f);
    assert_string_equal(f->name, "index.html");
    assert_ptr_equal(zi_http_page_find("/?x=1"), f);
    assert_ptr_equal(zi_http_page_find("/page/index.html"), f);
    assert_string_equal(zi_http_page_find("/page/chat.js")->name, "chat.js");
    assert_string_equal(zi_http_page_find("/page/chat.css?v=2")->name, "chat.css");
    const char *none[] = {"",
                          "/page/",
                          "/page",
                          "/pagechat.js",
                          "//",
                          "/page/x.js",
                          "/page/../chat.js",
                          "/page/a/chat.js",
                          "/chat.js",
                          "/index.html",
                          "/page/chat.js/",
                          "/PAGE/chat.js",
                          "/v1/models",
                          "/page/chat.jsx"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        if (zi_http_page_find(none[i])) fail_msg("'%s' names a file", none[i]);
    }
    assert_null(zi_http_page_find(NULL));
}

static void types(void **state) {
    (void)state;
    assert_string_equal(zi_http_page_type(zi_http_page_find("/")), "text/html; charset=utf-8");
    assert_string_equal(zi_http_page_type(zi_http_page_find("/page/chat.js")),
                        "text/javascript; charset=utf-8");
    assert_string_equal(zi_http_page_type(zi_http_page_find("/page/chat.css")),
                        "text/css; charset=utf-8");
    zi_http_page_file odd = {"README", (const unsigned char *)"", 0};
    assert_string_equal(zi_http_page_type(&odd), "application/octet-stream");
}

static void bytes_are_the_files(void **state) {
    (void)state;
    int n = 0;
    for (const zi_http_page_file *f = zi_http_page_files; f->name; f++, n++) {
        char path[256];
        snprintf(path, sizeof path, "http/page/%s", f->name);
        FILE *in = fopen(path, "rb");
        if (!in) fail_msg("cannot open %s (run from the source root)", path);
        char *buf = malloc(f->size + 1);
        assert_non_null(buf);
        size_t got = fread(buf, 1, f->size + 1, in);
        fclose(in);
        assert_int_equal(got, f->size);
        assert_memory_equal(buf, f->data, f->size);
        assert_int_equal(f->data[f->size], 0);
        free(buf);
    }
    assert_int_equal(n, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(paths),
        cmocka_unit_test(types),
        cmocka_unit_test(bytes_are_the_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
