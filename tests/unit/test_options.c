/*
 * test_options.c - the option table (common/options.h) is whole and says
 * the same thing everywhere: every entry is complete and its default lies
 * in its range, names are unique within each process, the bounds it
 * shares with the protocol layer agree with protocol/'s constants, values
 * at each bound are accepted and one past it refused with the usual
 * message, and --help prints each range the parser checks. The ranges
 * themselves, through the real binaries, are tests/e2e/test_options.py's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "embeddings.h"
#include "options.h"
#include "types.h"

static const unsigned PROCS[] = {ZI_OWN_ROUTER, ZI_OWN_TOKENIZER, ZI_OWN_WORKER, ZI_OWN_HTTP,
                                 ZI_OWN_SERVE | ZI_OWN_SERVE_PASS};

static int numeric(const zi_option *o) {
    return o->type == ZI_OPT_INT || o->type == ZI_OPT_SIZE;
}

static void every_entry_is_whole(void **state) {
    (void)state;
    for (int i = 0; i < ZI_O_COUNT; i++) {
        const zi_option *o = zi_option_get((zi_opt_id)i);
        assert_non_null(o);
        assert_non_null(o->name);
        assert_true(!strncmp(o->name, "--", 2));
        assert_non_null(o->help);
        assert_true(o->owners & (ZI_OWN_CHILDREN | ZI_OWN_SERVE | ZI_OWN_SERVE_PASS));
        /* serve acts on it or passes it on, not both; passing needs a child */
        assert_false((o->owners & ZI_OWN_SERVE) && (o->owners & ZI_OWN_SERVE_PASS));
        if (o->owners & ZI_OWN_SERVE_PASS) assert_true(o->owners & ZI_OWN_CHILDREN);
        assert_int_equal(o->metavar == NULL, o->type == ZI_OPT_FLAG);
        if (numeric(o) || o->type == ZI_OPT_HOSTPORT) assert_true(o->lo <= o->hi);
        /* A default stated as a value is one the option accepts. */
        int said = !(o->def_text && !o->def_text[0]);
        if (numeric(o) && said && !o->def_text) assert_true(o->lo <= o->def && o->def <= o->hi);
        if (o->type == ZI_OPT_ENUM) assert_non_null(o->choices);
        if (o->choices) {
            /* every choice parses; the default is one of them */
            char buf[256], def[32];
            snprintf(buf, sizeof buf, "%s", o->choices);
            snprintf(def, sizeof def, "%lld", o->def);
            int k = 0, has_def = 0;
            for (char *w = strtok(buf, "|"); w; w = strtok(NULL, "|"), k++) {
                long long v = -1;
                zi_error err = {0};
                assert_int_equal(zi_option_parse(o, o->name, w, &v, &err), ZI_OK);
                has_def |= o->type == ZI_OPT_ENUM ? v == o->def : !strcmp(w, def);
                if (o->type == ZI_OPT_ENUM) assert_int_equal(v, k);
            }
            assert_true(has_def);
        }
    }
    assert_null(zi_option_get(ZI_O_COUNT));
}

static void names_are_unique_per_process(void **state) {
    (void)state;
    for (size_t p = 0; p < sizeof PROCS / sizeof PROCS[0]; p++)
        for (int i = 0; i < ZI_O_COUNT; i++) {
            const zi_option *o = zi_option_get((zi_opt_id)i);
            if (!(o->owners & PROCS[p])) continue;
            int serve = PROCS[p] & ZI_OWN_SERVE;
            const char *name = serve && o->serve_name ? o->serve_name : o->name;
            zi_opt_id found;
            assert_ptr_equal(zi_option_find(PROCS[p], name, &found), o);
            assert_int_equal(found, i);
        }
    /* serve knows a renamed option only by its own name */
    assert_null(zi_option_find(ZI_OWN_SERVE | ZI_OWN_SERVE_PASS, "--listen", NULL));
    assert_non_null(zi_option_find(ZI_OWN_SERVE | ZI_OWN_SERVE_PASS, "--http", NULL));
    assert_null(zi_option_find(ZI_OWN_ROUTER, "--slots", NULL));
    assert_ptr_equal(zi_option_find(ZI_OWN_WORKER, "-h", NULL), zi_option_get(ZI_O_HELP));
}

/* common/ includes nothing from protocol/, so options.c writes these
 * numbers itself: they must stay the protocol's. */
static void bounds_agree_with_the_protocol(void **state) {
    (void)state;
    assert_int_equal(zi_option_get(ZI_O_REQUEST_TIMEOUT)->hi, ZI_MAX_TIMEOUT_MS);
    assert_int_equal(zi_option_get(ZI_O_MAX_EMBED_INPUTS)->hi, ZI_EMBED_MAX_INPUTS_CAP);
    assert_int_equal(zi_option_get(ZI_O_MAX_EMBED_TOKENS)->hi, ZI_EMBED_MAX_TOKENS_CAP);
    assert_int_equal(zi_option_def(ZI_O_MAX_EMBED_INPUTS), ZI_EMBED_MAX_INPUTS_DEFAULT);
    assert_int_equal(zi_option_def(ZI_O_MAX_EMBED_TOKENS), ZI_EMBED_MAX_TOKENS_DEFAULT);
    assert_int_equal(zi_option_get(ZI_O_MAX_IMAGES)->hi, ZI_REQUEST_MAX_IMAGES);
    assert_int_equal(zi_option_get(ZI_O_MAX_IMAGE_BYTES)->hi, ZI_REQUEST_MAX_IMAGE_BYTES);
}

static void bounds_are_checked_with_the_usual_message(void **state) {
    (void)state;
    for (int i = 0; i < ZI_O_COUNT; i++) {
        const zi_option *o = zi_option_get((zi_opt_id)i);
        if (!numeric(o) || o->choices) continue;
        long long in[2] = {o->lo, o->hi}, out[2] = {o->lo - 1, o->hi + 1};
        for (int k = 0; k < 2; k++) {
            char s[32], want[160];
            long long v = -1;
            zi_error err = {0};
            snprintf(s, sizeof s, "%lld", in[k]);
            assert_int_equal(zi_option_parse(o, o->name, s, &v, &err), ZI_OK);
            assert_int_equal(v, in[k]);
            snprintf(s, sizeof s, "%lld", out[k]);
            assert_int_equal(zi_option_parse(o, o->name, s, &v, &err), ZI_EINVAL);
            snprintf(want, sizeof want,
                     o->type == ZI_OPT_SIZE ? "%s: '%s' is not a size in %lld..%lld bytes"
                                            : "%s: '%s' is not an integer in %lld..%lld",
                     o->name, s, o->lo, o->hi);
            assert_true(!strncmp(err.msg, want, strlen(want)));
        }
    }
    long long v;
    zi_error err = {0};
    const zi_option *bits = zi_option_get(ZI_O_ACT_BITS);
    assert_int_equal(zi_option_parse(bits, "--act-bits", "12", &v, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "--act-bits: '12' is not 8 or 16");
    const zi_option *lvl = zi_option_get(ZI_O_LOG_LEVEL);
    assert_int_equal(zi_option_parse(lvl, "--log-level", "warn", &v, &err), ZI_OK);
    assert_int_equal(v, 2);
    assert_int_equal(zi_option_parse(lvl, "--log-level", "war", &v, &err), ZI_EINVAL);
    assert_string_equal(err.msg, "--log-level: 'war' is not debug, info, warn, error or off");
}

static void host_port(void **state) {
    (void)state;
    const zi_option *o = zi_option_get(ZI_O_LISTEN);
    char host[ZI_OPT_HOST_MAX];
    int port = 0;
    zi_error err = {0};
    assert_int_equal(
        zi_option_host_port(o, "--listen", "[::1]:8080", host, sizeof host, &port, &err), ZI_OK);
    assert_string_equal(host, "::1");
    assert_int_equal(port, 8080);
    assert_int_equal(zi_option_host_port(o, "--listen", "h:65535", host, sizeof host, &port, &err),
                     ZI_OK);
    const char *bad[] = {"h:0", "h:65536", ":80", "h:", "h", "h:8x", "nope", "[::1]:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(zi_option_host_port(o, "--http", bad[i], host, sizeof host, &port, &err),
                         ZI_EINVAL);
        char want[64];
        snprintf(want, sizeof want, "--http: '%s' is not HOST:PORT", bad[i]);
        assert_string_equal(err.msg, want);
    }
    char longest[ZI_OPT_HOST_MAX + 8];
    memset(longest, 'a', ZI_OPT_HOST_MAX);
    snprintf(longest + ZI_OPT_HOST_MAX - 1, 8, ":80"); /* a host of MAX - 1 bytes fits */
    assert_int_equal(zi_option_host_port(o, "--listen", longest, host, sizeof host, &port, &err),
                     ZI_OK);
    memset(longest, 'a', ZI_OPT_HOST_MAX);
    snprintf(longest + ZI_OPT_HOST_MAX, 8, ":80");
    assert_int_equal(zi_option_host_port(o, "--listen", longest, host, sizeof host, &port, &err),
                     ZI_EINVAL);
}

static void next_reads_flags_values_and_errors(void **state) {
    (void)state;
    char *argv[] = {"x", "--no-prefix-cache", "--slots", "9", "--bogus", "--slots"};
    int argc = 6, i = 1;
    zi_opt_id id;
    long long num;
    const char *str;
    zi_error err = {0};
    assert_int_equal(zi_options_next(ZI_OWN_WORKER, argc, argv, &i, &id, &num, &str, &err), ZI_OK);
    assert_int_equal(id, ZI_O_NO_PREFIX_CACHE);
    assert_null(str);
    i = 2;
    assert_int_equal(zi_options_next(ZI_OWN_WORKER, argc, argv, &i, &id, &num, &str, &err), ZI_OK);
    assert_int_equal(id, ZI_O_SLOTS);
    assert_int_equal(num, 9);
    assert_int_equal(i, 3);
    i = 4;
    assert_int_equal(zi_options_next(ZI_OWN_WORKER, argc, argv, &i, &id, &num, &str, &err),
                     ZI_EINVAL);
    assert_string_equal(err.msg, "unknown option '--bogus' (see --help)");
    i = 5;
    assert_int_equal(zi_options_next(ZI_OWN_WORKER, argc, argv, &i, &id, &num, &str, &err),
                     ZI_EINVAL);
    assert_string_equal(err.msg, "--slots needs a value (see --help)");
    /* --slots is the worker's and serve's, not the router's */
    i = 2;
    assert_int_equal(zi_options_next(ZI_OWN_ROUTER, argc, argv, &i, &id, &num, &str, &err),
                     ZI_EINVAL);
}

/* --help of each process: every range the parser checks is printed, and
 * no line is wider than 79 columns. */
static void help_states_each_checked_range(void **state) {
    (void)state;
    for (size_t p = 0; p < sizeof PROCS / sizeof PROCS[0]; p++) {
        unsigned sets[3] = {PROCS[p], ZI_OWN_SERVE, 0};
        if (PROCS[p] & ZI_OWN_SERVE) sets[0] = ZI_OWN_SERVE_PASS;
        for (int s = 0; sets[s]; s++) {
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            assert_non_null(f);
            zi_options_usage(f, sets[s], 28);
            fclose(f);
            for (char *line = text; *line;) {
                size_t n = strcspn(line, "\n");
                assert_true(n <= 79);
                line += n + (line[n] == '\n');
            }
            for (int i = 0; i < ZI_O_COUNT; i++) {
                const zi_option *o = zi_option_get((zi_opt_id)i);
                if ((o->owners & sets[s]) != sets[s]) continue;
                const char *name = sets[s] & (ZI_OWN_SERVE | ZI_OWN_SERVE_PASS) && o->serve_name
                                       ? o->serve_name
                                       : o->name;
                char *at = strstr(text, name);
                assert_non_null(at);
                if (o->type != ZI_OPT_INT || o->choices) continue;
                char range[64];
                snprintf(range, sizeof range, "[%lld..%lld]", o->lo, o->hi);
                assert_non_null(strstr(at, range));
            }
            free(text);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_entry_is_whole),
        cmocka_unit_test(names_are_unique_per_process),
        cmocka_unit_test(bounds_agree_with_the_protocol),
        cmocka_unit_test(bounds_are_checked_with_the_usual_message),
        cmocka_unit_test(host_port),
        cmocka_unit_test(next_reads_flags_values_and_errors),
        cmocka_unit_test(help_states_each_checked_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
