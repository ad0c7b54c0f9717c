/*
 * test_utf8.c - cmocka tests for common/utf8.c, the one strict UTF-8
 * validator: valid 1-4 byte forms, overlong forms, surrogates, code points
 * above U+10FFFF, stray and missing continuation bytes, the offset of the
 * first bad byte, and the cleaner (what the router relies on to never send
 * a client an invalid msgpack str). The exhaustive cases check zi_utf8_next
 * against the definition (decode the bits, then refuse overlong values,
 * surrogates and values above U+10FFFF) over every 1-3 byte sequence and
 * every code point.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "utf8.h"

/* The definition, written differently from utf8.c: the length the lead
 * byte claims, the bits, then the value's range. */
static size_t ref_next(const unsigned char *s, size_t n, uint32_t *cp) {
    if (n == 0) return 0;
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t v = len == 1 ? c : c & (0xffu >> (len + 1));
    for (size_t k = 1; k < len; k++) {
        if (s[k] >> 6 != 2) return 0;
        v = v << 6 | (s[k] & 0x3f);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (v < min[len] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
    *cp = v;
    return len;
}

static size_t encode(uint32_t cp, unsigned char *o) {
    if (cp < 0x80) return o[0] = (unsigned char)cp, 1;
    if (cp < 0x800) return o[0] = (unsigned char)(0xc0 | cp >> 6), o[1] = 0x80 | (cp & 0x3f), 2;
    if (cp < 0x10000)
        return o[0] = (unsigned char)(0xe0 | cp >> 12), o[1] = 0x80 | (cp >> 6 & 0x3f),
               o[2] = 0x80 | (cp & 0x3f), 3;
    return o[0] = (unsigned char)(0xf0 | cp >> 18), o[1] = 0x80 | (cp >> 12 & 0x3f),
           o[2] = 0x80 | (cp >> 6 & 0x3f), o[3] = 0x80 | (cp & 0x3f), 4;
}

static void test_valid_forms(void **state) {
    (void)state;
    uint32_t cp = 0;
    assert_int_equal(zi_utf8_next((const unsigned char *)"A", 1, &cp), 1);
    assert_int_equal(cp, 'A');
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xc2\x80", 2, &cp), 2);
    assert_int_equal(cp, 0x80);
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xdf\xbf", 2, &cp), 2);
    assert_int_equal(cp, 0x7ff);
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xe0\xa0\x80", 3, &cp), 3);
    assert_int_equal(cp, 0x800);
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xef\xbf\xbf", 3, &cp), 3);
    assert_int_equal(cp, 0xffff);
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xed\x9f\xbf", 3, &cp), 3);
    assert_int_equal(cp, 0xd7ff); /* just below the surrogates */
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xee\x80\x80", 3, &cp), 3);
    assert_int_equal(cp, 0xe000); /* just above them */
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xf0\x90\x80\x80", 4, &cp), 4);
    assert_int_equal(cp, 0x10000);
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xf4\x8f\xbf\xbf", 4, &cp), 4);
    assert_int_equal(cp, 0x10ffff);
    /* cp may be NULL; a NUL byte is a valid character. */
    assert_int_equal(zi_utf8_next((const unsigned char *)"\xf0\x9f\x98\x80", 4, NULL), 4);
    assert_int_equal(zi_utf8_next((const unsigned char *)"", 1, &cp), 1);
    assert_true(zi_utf8_valid("", 0));
    assert_true(zi_utf8_valid(NULL, 0));
    assert_true(zi_utf8_valid("a\0b", 3));
    assert_true(zi_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf", 19));
}

static void test_overlong(void **state) {
    (void)state;
    static const char *const bad[] = {
        "\xc0\x80",             /* U+0000 in two bytes */
        "\xc0\xaf",             /* '/' */
        "\xc1\xbf",             /* U+007F */
        "\xe0\x80\x80",         /* U+0000 in three */
        "\xe0\x9f\xbf",         /* U+07FF in three */
        "\xf0\x80\x80\x80",     /* U+0000 in four */
        "\xf0\x8f\xbf\xbf",     /* U+FFFF in four */
        "\xf8\x88\x80\x80\x80", /* five-byte form */
        "\xfc\x84\x80\x80\x80\x80",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t n = strlen(bad[i]);
        assert_int_equal(zi_utf8_next((const unsigned char *)bad[i], n, NULL), 0);
        assert_false(zi_utf8_valid(bad[i], n));
        assert_int_equal(zi_utf8_bad_at(bad[i], n), 0);
    }
}

static void test_surrogates(void **state) {
    (void)state;
    assert_false(zi_utf8_valid("\xed\xa0\x80", 3)); /* U+D800 */
    assert_false(zi_utf8_valid("\xed\xad\xbf", 3)); /* U+DB7F */
    assert_false(zi_utf8_valid("\xed\xb0\x80", 3)); /* U+DC00 */
    assert_false(zi_utf8_valid("\xed\xbf\xbf", 3)); /* U+DFFF */
    /* A CESU-8 pair (U+1F600 as two surrogates) is not UTF-8. */
    assert_false(zi_utf8_valid("\xed\xa0\xbd\xed\xb8\x80", 6));
    assert_int_equal(zi_utf8_bad_at("ok\xed\xa0\x80", 5), 2);
}

static void test_above_max(void **state) {
    (void)state;
    assert_false(zi_utf8_valid("\xf4\x90\x80\x80", 4)); /* U+110000 */
    assert_false(zi_utf8_valid("\xf4\xbf\xbf\xbf", 4));
    assert_false(zi_utf8_valid("\xf5\x80\x80\x80", 4)); /* leads F5..FF never start one */
    assert_false(zi_utf8_valid("\xf7\xbf\xbf\xbf", 4));
    assert_false(zi_utf8_valid("\xff", 1));
    assert_false(zi_utf8_valid("\xfe", 1));
}

static void test_truncated_and_stray(void **state) {
    (void)state;
    /* Every proper prefix of a multi-byte character is refused. */
    static const char *const whole[] = {"\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(whole[i]);
        for (size_t k = 1; k < n; k++) {
            assert_int_equal(zi_utf8_next((const unsigned char *)whole[i], k, NULL), 0);
            assert_false(zi_utf8_valid(whole[i], k));
        }
        assert_true(zi_utf8_valid(whole[i], n));
    }
    assert_int_equal(zi_utf8_next((const unsigned char *)"a", 0, NULL), 0);
    /* A continuation byte missing in the middle, or one too many. */
    assert_false(zi_utf8_valid("\xe2\x82"
                               "a",
                               3));
    assert_false(zi_utf8_valid("\xc3\xa9\xa9", 3));
    assert_false(zi_utf8_valid("\x80", 1));
    assert_false(zi_utf8_valid("\xbf", 1));
    /* The offset is the start of the bad sequence. */
    assert_int_equal(zi_utf8_bad_at("abc", 3), 3);
    assert_int_equal(zi_utf8_bad_at("ab\xc3", 3), 2);
    assert_int_equal(zi_utf8_bad_at("\xc3\xa9x\xe2\x82", 6), 3);
    assert_int_equal(zi_utf8_bad_at("\xc3\xa9\xa9", 3), 2);
}

/* Every sequence of one to three bytes, and a four-byte sweep over each
 * lead byte and second byte, against the definition. */
static void test_exhaustive_short(void **state) {
    (void)state;
    unsigned char s[4];
    for (unsigned a = 0; a < 256; a++) {
        s[0] = (unsigned char)a;
        uint32_t c1 = 0, c2 = 0;
        size_t want = ref_next(s, 1, &c2);
        assert_int_equal(zi_utf8_next(s, 1, &c1), want);
        for (unsigned b = 0; b < 256; b++) {
            s[1] = (unsigned char)b;
            want = ref_next(s, 2, &c2);
            size_t got = zi_utf8_next(s, 2, &c1);
            assert_int_equal(got, want);
            if (got) assert_int_equal(c1, c2);
            for (unsigned c = 0; c < 256; c++) {
                s[2] = (unsigned char)c;
                want = ref_next(s, 3, &c2);
                got = zi_utf8_next(s, 3, &c1);
                assert_int_equal(got, want);
                if (got) assert_int_equal(c1, c2);
            }
            static const unsigned third[] = {0x7f, 0x80, 0xbf, 0xc0}; /* around 80..BF */
            for (size_t t = 0; t < 4; t++) {
                s[2] = (unsigned char)third[t];
                s[3] = 0x80;
                want = ref_next(s, 4, &c2);
                got = zi_utf8_next(s, 4, &c1);
                assert_int_equal(got, want);
                if (got) assert_int_equal(c1, c2);
            }
        }
    }
}

/* Every code point round-trips, except the surrogates, which are refused. */
static void test_every_code_point(void **state) {
    (void)state;
    unsigned char s[4];
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        size_t n = encode(cp, s);
        uint32_t got = 0xffffffff;
        size_t l = zi_utf8_next(s, n, &got);
        if (cp >= 0xd800 && cp <= 0xdfff) {
            assert_int_equal(l, 0);
        } else {
            assert_int_equal(l, n);
            assert_int_equal(got, cp);
        }
    }
}

static void test_clean(void **state) {
    (void)state;
    size_t n = 0;
    /* Each bad byte becomes one U+FFFD; good characters are kept. */
    char *c = zi_utf8_clean("a\x98"
                            "b\xed\xa0\x80"
                            "\xc3\xa9",
                            8, &n);
    assert_non_null(c);
    assert_string_equal(c, "a\xef\xbf\xbd"
                           "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"
                           "\xc3\xa9");
    assert_int_equal(n, strlen(c));
    assert_true(zi_utf8_valid(c, n));
    free(c);
    c = zi_utf8_clean("ok \xc3\xa9", 5, &n); /* a clean string comes back as it was */
    assert_string_equal(c, "ok \xc3\xa9");
    assert_int_equal(n, 5);
    free(c);
    c = zi_utf8_clean("", 0, &n);
    assert_string_equal(c, "");
    assert_int_equal(n, 0);
    free(c);
    c = zi_utf8_clean("\xf4\x90\x80\x80", 4, NULL);
    assert_string_equal(c, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_forms),         cmocka_unit_test(test_overlong),
        cmocka_unit_test(test_surrogates),          cmocka_unit_test(test_above_max),
        cmocka_unit_test(test_truncated_and_stray), cmocka_unit_test(test_exhaustive_short),
        cmocka_unit_test(test_every_code_point),    cmocka_unit_test(test_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
