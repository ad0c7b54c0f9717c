/*
 * test_curve.c - cmocka tests for protocol/curve.c (key files and lists,
 * key generation, loopback addresses) and the router's ZAP decision
 * (router/router_zap.c): good files with comments, malformed lines named
 * with file and line, wrong lengths, a secret key readable by others, a
 * key given where a file belongs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "curve.h"
#include "router_zap.h"

/* Two keys from ZeroMQ's CURVE tests; K3 has a '#' where a group of five
 * characters starts, which overflows 32 bits: never a key, so a line
 * starting with '#' is always a comment. */
#define K1 "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
#define K2 "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
#define K3 "#TKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"

static void test_parse_good(void **state) {
    (void)state;
    const char *text = "# a comment\n\n  " K1 "  \r\n#another comment line\n" K2 "\n" K3 "\n";
    zi_curve_keys k = {0};
    zi_error e = {0};
    assert_int_equal(zi_curve_parse(text, strlen(text), "f", &k, &e), ZI_OK);
    assert_int_equal(k.n, 2);
    assert_string_equal(k.v[0].z85, K1);
    assert_string_equal(k.v[1].z85, K2);
    assert_true(zi_curve_keys_has(&k, k.v[1].raw));
    uint8_t other[32] = {0};
    assert_false(zi_curve_keys_has(&k, other));
    zi_curve_keys_free(&k);
    /* Only comments: no keys, not an error here (a list asks for one). */
    assert_int_equal(zi_curve_parse("# x\n\n", 5, "f", &k, &e), ZI_OK);
    assert_int_equal(k.n, 0);
}

static void test_parse_malformed(void **state) {
    (void)state;
    zi_curve_keys k = {0};
    zi_error e = {0};
    const char *short_key = "# c\n" K1 "\nrq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf\n";
    assert_int_equal(zi_curve_parse(short_key, strlen(short_key), "keys.txt", &k, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "keys.txt:3: not a key: 39 characters, a Z85 key has 40");
    zi_curve_keys_free(&k);
    const char *bad_char = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf\"\n";
    assert_int_equal(zi_curve_parse(bad_char, strlen(bad_char), "b", &k, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "b:1: not a key: not valid Z85");
    /* Z85 characters, but a group's value past 32 bits. */
    const char *overflow = "# c\n  "
                           "$TKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
                           "\n";
    assert_int_equal(zi_curve_parse(overflow, strlen(overflow), "o", &k, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "o:2: not a key: not valid Z85");
    const char *two = K1 " " K2 "\n";
    assert_int_equal(zi_curve_parse(two, strlen(two), "t", &k, &e), ZI_EFORMAT);
    assert_string_equal(e.msg, "t:1: not a key: 81 characters, a Z85 key has 40");
    char longline[ZI_CURVE_LINE_MAX + 10];
    memset(longline, 'a', sizeof longline);
    assert_int_equal(zi_curve_parse(longline, sizeof longline, "l", &k, &e), ZI_EFORMAT);
    assert_non_null(strstr(e.msg, "l:1: line longer than"));
    zi_curve_keys_free(&k);
}

static void write_file(const char *path, const char *text, mode_t mode) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void test_files(void **state) {
    (void)state;
    char dir[] = "/tmp/zi_curve_testXXXXXX";
    assert_non_null(mkdtemp(dir));
    char out[256], path[300], pubp[300];
    snprintf(out, sizeof out, "%s/a", dir);
    zi_error e = {0};
    zi_curve_key pub, sec, pub2, derived;
    assert_int_equal(zi_curve_keygen(out, false, &pub, &e), ZI_OK);
    snprintf(path, sizeof path, "%s.key", out);
    snprintf(pubp, sizeof pubp, "%s.pub", out);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    /* Refuses to overwrite; --force replaces. */
    assert_int_equal(zi_curve_keygen(out, false, NULL, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "exists"));
    assert_int_equal(zi_curve_load_key("--curve-secret", path, true, &sec, &e), ZI_OK);
    assert_int_equal(zi_curve_load_key("--router-key", pubp, false, &pub2, &e), ZI_OK);
    assert_int_equal(zi_curve_public(&sec, &derived, &e), ZI_OK);
    assert_string_equal(derived.z85, pub.z85);
    assert_string_equal(pub2.z85, pub.z85);
    zi_curve_keys list = {0};
    assert_int_equal(zi_curve_load_list("--backend-keys", pubp, &list, &e), ZI_OK);
    assert_int_equal(list.n, 1);
    zi_curve_keys_free(&list);
    assert_int_equal(zi_curve_keygen(out, true, &pub2, &e), ZI_OK);
    assert_string_not_equal(pub2.z85, pub.z85);
    /* A secret readable by others is refused, naming the mode. */
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(zi_curve_load_key("--curve-secret", path, true, &sec, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "readable by others (mode 644)"));
    /* Two keys where one belongs; no key in a list. */
    snprintf(path, sizeof path, "%s/two", dir);
    write_file(path, K1 "\n" K2 "\n", 0600);
    assert_int_equal(zi_curve_load_key("--curve-secret", path, true, &sec, &e), ZI_EFORMAT);
    assert_non_null(strstr(e.msg, "2 keys in the file, expected one"));
    snprintf(path, sizeof path, "%s/none", dir);
    write_file(path, "# nobody\n", 0644);
    assert_int_equal(zi_curve_load_list("--client-keys", path, &list, &e), ZI_EFORMAT);
    assert_non_null(strstr(e.msg, "--client-keys"));
    assert_non_null(strstr(e.msg, "no key in the file"));
    /* A key where a file name belongs. */
    assert_true(zi_curve_is_key_text(K1));
    assert_false(zi_curve_is_key_text(path));
    assert_int_equal(zi_curve_load_key("--router-key", K1, false, &sec, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "--router-key takes a key file's name, not a key"));
    assert_int_equal(zi_curve_load_key("--router-key", "/nonexistent/x", false, &sec, &e), ZI_EIO);
    /* One of the two client options without the other. */
    zi_curve_client cc;
    assert_int_equal(zi_curve_client_load(NULL, NULL, &cc, &e), ZI_OK);
    assert_false(cc.on);
    assert_int_equal(zi_curve_client_load(NULL, pubp, &cc, &e), ZI_EINVAL);
    assert_non_null(strstr(e.msg, "--router-key needs --curve-secret"));
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_loopback(void **state) {
    (void)state;
    assert_true(zi_addr_is_loopback("tcp://127.0.0.1:5556"));
    assert_true(zi_addr_is_loopback("tcp://127.1.2.3:1"));
    assert_true(zi_addr_is_loopback("tcp://localhost:5556"));
    assert_true(zi_addr_is_loopback("tcp://[::1]:5556"));
    assert_true(zi_addr_is_loopback("tcp://lo:5556"));
    assert_true(zi_addr_is_loopback("ipc:///tmp/zinfer.sock"));
    assert_true(zi_addr_is_loopback("inproc://x"));
    assert_false(zi_addr_is_loopback("tcp://*:5556"));
    assert_false(zi_addr_is_loopback("tcp://0.0.0.0:5556"));
    assert_false(zi_addr_is_loopback("tcp://10.0.0.5:5556"));
    assert_false(zi_addr_is_loopback("tcp://eth0:5556"));
    assert_false(zi_addr_is_loopback("tcp://127.0.0.1.evil:5556"));
    assert_false(zi_addr_is_loopback("tcp://[::]:5556"));
    assert_false(zi_addr_is_loopback("udp://127.0.0.1:5556"));
}

static void test_zap_decision(void **state) {
    (void)state;
    zi_curve_keys backend = {0}, client = {0};
    zi_error e = {0};
    assert_int_equal(zi_curve_parse(K1, 40, "b", &backend, &e), ZI_OK);
    assert_int_equal(zi_curve_parse(K2, 40, "c", &client, &e), ZI_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *logf = open_memstream(&buf, &len);
    zi_logger lg = {.out = logf, .level = ZI_LOG_INFO, .tag = "t"};
    zi_zap z = {.backend = &backend, .client = &client, .log = &lg};
    z.logged = calloc(ZI_ZAP_LOGGED_MAX, sizeof *z.logged);
    const uint8_t *k1 = backend.v[0].raw, *k2 = client.v[0].raw;
    assert_true(zi_zap_allow(&z, "backend", 7, "1.2.3.4", 7, k1, 32));
    assert_false(zi_zap_allow(&z, "backend", 7, "1.2.3.4", 7, k2, 32));
    assert_false(zi_zap_allow(&z, "backend", 7, "1.2.3.4", 7, k2, 32)); /* logged once */
    assert_true(zi_zap_allow(&z, "client", 6, "5.6.7.8", 7, k2, 32));
    assert_false(zi_zap_allow(&z, "client", 6, "5.6.7.8", 7, k1, 32));
    assert_false(zi_zap_allow(&z, "other", 5, "x", 1, k1, 32));
    assert_false(zi_zap_allow(&z, "backend", 7, "x", 1, k1, 31));
    z.client = NULL; /* no client list: any key */
    assert_true(zi_zap_allow(&z, "client", 6, "5.6.7.8", 7, k1, 32));
    fclose(logf);
    /* One line for the backend refusal of K2 (refused twice), one for the
     * client refusal of K1: once per key and socket. */
    assert_non_null(strstr(buf, "refused a backend connection from 1.2.3.4: key JTKVSB%%"));
    assert_null(strstr(strstr(buf, "JTKVSB") + 1, "JTKVSB"));
    assert_non_null(strstr(buf, "refused a client connection from 5.6.7.8: key rq:rM>}U"));
    assert_null(strstr(buf, "backend connection from 1.2.3.4: key rq:rM"));
    free(buf);
    free(z.logged);
    zi_curve_keys_free(&backend);
    zi_curve_keys_free(&client);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_good),   cmocka_unit_test(test_parse_malformed),
        cmocka_unit_test(test_files),        cmocka_unit_test(test_loopback),
        cmocka_unit_test(test_zap_decision),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
