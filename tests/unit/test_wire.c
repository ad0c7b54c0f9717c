/*
 * test_wire.c - cmocka tests for protocol/msg.c: reading fields out of a
 * msgpack map (present, absent, wrong type, out of range) and the field
 * path taken from an error message. UTF-8 validation and cleaning
 * (common/utf8.h) are tested in test_utf8.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "wire.h"

static void test_map_fields(void **state) {
    (void)state;
    zi_msg m;
    zi_msg_init(&m);
    msgpack_pack_map(&m.pk, 4);
    zi_pack_kv_str(&m.pk, "type", "tokens");
    zi_pack_kv_int(&m.pk, "rid", 42);
    zi_pack_kv_int(&m.pk, "neg", -7);
    zi_pack_str(&m.pk, "big");
    msgpack_pack_uint64(&m.pk, UINT64_MAX);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, m.sb.data, m.sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    const msgpack_object *o = &u.data;
    zi_error e = {0};
    const char *s;
    size_t n;
    int64_t v;
    assert_int_equal(zi_map_str(o, "type", &s, &n, &e), ZI_OK);
    assert_int_equal(n, 6);
    assert_memory_equal(s, "tokens", 6);
    assert_true(zi_map_str_is(o, "type", "tokens"));
    assert_false(zi_map_str_is(o, "type", "token"));
    assert_false(zi_map_str_is(o, "rid", "42"));
    assert_int_equal(zi_map_int(o, "rid", &v, &e), ZI_OK);
    assert_int_equal(v, 42);
    assert_int_equal(zi_map_int(o, "neg", &v, &e), ZI_OK);
    assert_int_equal(v, -7);
    assert_int_equal(zi_map_int(o, "big", &v, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "big: out of range");
    assert_int_equal(zi_map_int(o, "type", &v, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "type: not an integer");
    assert_int_equal(zi_map_str(o, "rid", &s, &n, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "rid: not a string");
    assert_int_equal(zi_map_str(o, "nope", &s, &n, &e), ZI_EINVAL);
    assert_string_equal(e.msg, "nope: missing");
    assert_null(zi_map_get(o, "ri"));
    assert_null(zi_map_get(zi_map_get(o, "rid"), "x")); /* not a map */
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

static void test_error_field(void **state) {
    (void)state;
    char f[64];
    zi_error_field("sampling_params.top_p: 1.5 is outside (0, 1]", f, sizeof f);
    assert_string_equal(f, "sampling_params.top_p");
    zi_error_field("messages[2].role: \"x\" is not a role", f, sizeof f);
    assert_string_equal(f, "messages[2].role");
    zi_error_field("the frame is not a map", f, sizeof f); /* spaces: no path */
    assert_string_equal(f, "");
    zi_error_field(": starts with a colon", f, sizeof f);
    assert_string_equal(f, "");
    zi_error_field("prompt", f, sizeof f); /* no colon */
    assert_string_equal(f, "");
    zi_error_field("averyveryverylongfieldname: x", f, 8); /* does not fit */
    assert_string_equal(f, "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_map_fields),
        cmocka_unit_test(test_error_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
