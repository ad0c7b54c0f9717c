/*
 * test_mem_plan.c - the worker's memory plan and default budget
 * (model_worker/mem_plan.h): the sum (weights, KV cache in whole blocks per
 * sequence, working buffers, a draft model's cache with its extra block per
 * slot), its refusals, the share of MemAvailable, and the error that says
 * what does not fit with the numbers and the flags to change; and the
 * start-up pipe a child of `zinfer serve` reports such an error through
 * (common/startup.h).
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

#include "mem_plan.h"
#include "startup.h"

static void test_plan_sum(void **state) {
    (void)state;
    zi_mem_model m = {.weight_bytes = 1000, .kv_bytes_per_token = 10, .work_bytes = 5};
    zi_mem_plan p;
    zi_error err = {0};
    /* 20 positions take two blocks of 16: 32 per sequence, 64 for two. */
    assert_int_equal(zi_mem_plan_make(&m, NULL, 2, 20, 16, &p, &err), ZI_OK);
    assert_int_equal(p.slots, 2);
    assert_int_equal(p.ctx, 20);
    assert_int_equal(p.kv_tokens, 64);
    assert_int_equal(p.kv_bytes, 640);
    assert_int_equal(p.weight_bytes, 1000);
    assert_int_equal(p.kv_bytes_per_token, 10);
    assert_int_equal(p.work_bytes, 5);
    assert_int_equal(p.total_bytes, 1645);
    /* A whole number of blocks adds nothing. */
    assert_int_equal(zi_mem_plan_make(&m, NULL, 8, 4096, 16, &p, &err), ZI_OK);
    assert_int_equal(p.kv_tokens, 8 * 4096);
    assert_int_equal(p.total_bytes, 1000 + 8 * 4096 * 10 + 5);
}

static void test_plan_draft(void **state) {
    (void)state;
    zi_mem_model m = {.weight_bytes = 1000, .kv_bytes_per_token = 10, .work_bytes = 5};
    zi_mem_model d = {.weight_bytes = 100, .kv_bytes_per_token = 3, .work_bytes = 2};
    zi_mem_plan p;
    zi_error err = {0};
    assert_int_equal(zi_mem_plan_make(&m, &d, 2, 20, 16, &p, &err), ZI_OK);
    /* The draft's cache holds the model's 64 tokens and a block per slot. */
    assert_int_equal(p.kv_bytes, 64 * 10 + (64 + 2 * 16) * 3);
    assert_int_equal(p.weight_bytes, 1100);
    assert_int_equal(p.work_bytes, 7);
    assert_int_equal(p.kv_bytes_per_token, 13);
    assert_int_equal(p.total_bytes, 1100 + 928 + 7);
}

/* A hybrid's recurrent states: a row per slot, and the prefix cache's
 * checkpoint rows only when it is on (--no-prefix-cache keeps none). */
static void test_plan_states(void **state) {
    (void)state;
    zi_mem_model m = {.weight_bytes = 1000,
                      .kv_bytes_per_token = 10,
                      .work_bytes = 5,
                      .state_bytes_per_slot = 7,
                      .state_ckpts_per_slot = 2};
    zi_mem_plan p;
    zi_error err = {0};
    assert_int_equal(zi_mem_plan_make(&m, NULL, 2, 20, 16, &p, &err), ZI_OK);
    assert_int_equal(p.kv_bytes, 640 + 2 * 3 * 7);
    assert_int_equal(p.total_bytes, 1000 + 640 + 42 + 5);
    m.state_ckpts_per_slot = 0;
    assert_int_equal(zi_mem_plan_make(&m, NULL, 2, 20, 16, &p, &err), ZI_OK);
    assert_int_equal(p.kv_bytes, 640 + 2 * 7);
    assert_int_equal(p.total_bytes, 1000 + 640 + 14 + 5);
}

static void test_plan_refusals(void **state) {
    (void)state;
    zi_mem_model m = {.weight_bytes = 1, .kv_bytes_per_token = 1, .work_bytes = 1};
    zi_mem_plan p;
    zi_error err = {0};
    assert_int_equal(zi_mem_plan_make(&m, NULL, 0, 16, 16, &p, &err), ZI_EINVAL);
    assert_int_equal(zi_mem_plan_make(&m, NULL, 1, 0, 16, &p, &err), ZI_EINVAL);
    assert_int_equal(zi_mem_plan_make(&m, NULL, 1, 16, 0, &p, &err), ZI_EINVAL);
    zi_mem_model huge = {.weight_bytes = 1, .kv_bytes_per_token = UINT64_MAX / 4, .work_bytes = 1};
    assert_int_equal(zi_mem_plan_make(&huge, NULL, 1024, 1 << 20, 16, &p, &err), ZI_ERANGE);
    assert_non_null(strstr(err.msg, "overflow"));
    zi_mem_model w = {.weight_bytes = UINT64_MAX, .kv_bytes_per_token = 1, .work_bytes = 1};
    assert_int_equal(zi_mem_plan_make(&w, NULL, 1, 16, 16, &p, &err), ZI_ERANGE);
}

static void test_usable_share(void **state) {
    (void)state;
    assert_int_equal(ZI_MEM_SHARE_PCT, 90);
    assert_int_equal(zi_mem_usable(0), 0);
    assert_int_equal(zi_mem_usable(1000), 900);
    assert_int_equal(zi_mem_usable(1001), 900);
    assert_int_equal(zi_mem_usable(10ull << 30), (10ull << 30) / 10 * 9);
    /* No overflow near the top. */
    assert_true(zi_mem_usable(UINT64_MAX) > UINT64_MAX / 10 * 8);
    assert_true(zi_mem_usable(UINT64_MAX) <= UINT64_MAX / 10 * 9 + 9);
}

static void test_check(void **state) {
    (void)state;
    /* 808 MiB of weights, 32.5 KiB a token (a Llama 3.2 1B shape), the
     * defaults: 8 x 4096. */
    zi_mem_model m = {
        .weight_bytes = 808ull << 20, .kv_bytes_per_token = 33280, .work_bytes = 37ull << 20};
    zi_mem_plan p;
    zi_error err = {0};
    assert_int_equal(zi_mem_plan_make(&m, NULL, 8, 4096, 16, &p, &err), ZI_OK);
    assert_int_equal(p.kv_bytes, 1040ull << 20);
    uint64_t need = p.total_bytes;
    /* Unknown memory: nothing to check against. */
    assert_int_equal(zi_mem_plan_check(&p, 1, 0, &err), ZI_OK);
    /* Exactly 90% is enough; one byte less is not. */
    uint64_t avail = need / 9 * 10 + 20;
    assert_int_equal(zi_mem_plan_check(&p, 1, avail, &err), ZI_OK);
    err = (zi_error){0};
    assert_int_equal(zi_mem_plan_check(&p, 1, need, &err), ZI_ENOMEM);
    /* The numbers and the flags to change. */
    char want[160];
    assert_non_null(strstr(err.msg, "weights 808.0 MiB"));
    assert_non_null(strstr(err.msg, "KV cache 33280 bytes per token x 8 slots x 4096 positions "
                                    "= 1040.0 MiB"));
    snprintf(want, sizeof want, "needed %.1f MiB,", (double)need / 1048576.0);
    assert_non_null(strstr(err.msg, want));
    snprintf(want, sizeof want, "available %.1f MiB (90%% of MemAvailable %.1f MiB)",
             (double)zi_mem_usable(need) / 1048576.0, (double)need / 1048576.0);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "--ctx-size"));
    assert_non_null(strstr(err.msg, "--slots"));
    assert_non_null(strstr(err.msg, "--memory-budget"));
    assert_null(strstr(err.msg, "--workers"));
    assert_null(strchr(err.msg, '\n'));
    /* Workers add up: one fits, three do not. */
    avail = need / 9 * 10 * 2;
    assert_int_equal(zi_mem_plan_check(&p, 1, avail, &err), ZI_OK);
    assert_int_equal(zi_mem_plan_check(&p, 3, avail, &err), ZI_ENOMEM);
    snprintf(want, sizeof want, "x 3 workers = %.1f MiB", (double)(3 * need) / 1048576.0);
    assert_non_null(strstr(err.msg, want));
    assert_non_null(strstr(err.msg, "--workers"));
}

static void test_available(void **state) {
    (void)state;
    /* Linux has MemAvailable; whatever it is, it is less than 2^50. */
    uint64_t a = zi_mem_available();
    if (access("/proc/meminfo", R_OK) == 0) assert_true(a > 0);
    assert_true(a < (1ull << 50));
}

static void test_startup_pipe(void **state) {
    (void)state;
    unsetenv(ZI_STARTUP_FD_ENV);
    assert_false(zi_startup_report("nobody listens"));
    int fds[2];
    assert_int_equal(zi_startup_pipe(fds), 0);
    /* What the forked child does, here in one process. */
    zi_startup_pipe_child(fds[1]);
    char num[16];
    snprintf(num, sizeof num, "%d", fds[1]);
    assert_string_equal(getenv(ZI_STARTUP_FD_ENV), num);
    assert_true(zi_startup_report("worker: does not fit\nsecond line"));
    close(fds[1]);
    char buf[64];
    zi_startup_pipe_read(fds[0], buf, sizeof buf);
    assert_string_equal(buf, "worker: does not fit"); /* one line */
    /* An empty pipe reads "" at once (non-blocking). */
    assert_int_equal(zi_startup_pipe(fds), 0);
    zi_startup_pipe_read(fds[0], buf, sizeof buf);
    assert_string_equal(buf, "");
    close(fds[1]);
    /* A variable naming something other than a pipe is not written to. */
    char path[] = "/tmp/zi_startup_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    snprintf(num, sizeof num, "%d", fd);
    setenv(ZI_STARTUP_FD_ENV, num, 1);
    assert_false(zi_startup_report("not here"));
    assert_int_equal(lseek(fd, 0, SEEK_END), 0);
    close(fd);
    unlink(path);
    setenv(ZI_STARTUP_FD_ENV, "12x", 1);
    assert_false(zi_startup_report("not here"));
    unsetenv(ZI_STARTUP_FD_ENV);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_sum),     cmocka_unit_test(test_plan_draft),
        cmocka_unit_test(test_plan_states),  cmocka_unit_test(test_plan_refusals),
        cmocka_unit_test(test_usable_share), cmocka_unit_test(test_check),
        cmocka_unit_test(test_available),    cmocka_unit_test(test_startup_pipe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
