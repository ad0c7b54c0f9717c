/*
 * test_backend_select.c - cmocka tests of the host-side logic around the
 * backends that needs no GPU: the device-string parser, the selector's
 * errors (unknown string, CUDA not compiled in, no usable CUDA device), the
 * `zinfer devices` listing, and the tensor-parallel split rules and
 * one-rank communicator (kernels/cuda/tp.h).
 *
 * Built in both configurations; the expectations for "cuda" follow
 * ZI_HAVE_CUDA (without it: "built without CUDA"; with it on a machine
 * without a GPU: the CUDA runtime's reason; with a GPU: a backend).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend_select.h"
#include "tp.h"
#ifdef ZI_HAVE_CUDA
#include "cuda_backend.h"
#endif

static void test_parse_accepts(void **state) {
    (void)state;
    zi_error err = {0};
    zi_device_spec d = {ZI_DEVICE_CUDA, 9};
    assert_int_equal(zi_device_parse(NULL, &d, &err), ZI_OK);
    assert_int_equal(d.kind, ZI_DEVICE_CPU);
    assert_int_equal(zi_device_parse("cpu", &d, &err), ZI_OK);
    assert_int_equal(d.kind, ZI_DEVICE_CPU);
    assert_int_equal(d.index, 0);
    assert_int_equal(zi_device_parse("cuda", &d, &err), ZI_OK);
    assert_int_equal(d.kind, ZI_DEVICE_CUDA);
    assert_int_equal(d.index, 0);
    assert_int_equal(zi_device_parse("cuda:0", &d, &err), ZI_OK);
    assert_int_equal(d.index, 0);
    assert_int_equal(zi_device_parse("cuda:7", &d, &err), ZI_OK);
    assert_int_equal(d.kind, ZI_DEVICE_CUDA);
    assert_int_equal(d.index, 7);
    assert_int_equal(zi_device_parse("cuda:1023", &d, &err), ZI_OK);
    assert_int_equal(d.index, 1023);
    assert_int_equal(zi_device_parse("cuda:007", &d, &err), ZI_OK);
    assert_int_equal(d.index, 7);
}

static void expect_parse_error(const char *s, const char *needle) {
    zi_error err = {0};
    zi_device_spec d;
    int rc = zi_device_parse(s, &d, &err);
    if (rc != ZI_EINVAL) fail_msg("'%s' parsed (rc %d)", s, rc);
    if (!strstr(err.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", s, err.msg, needle);
    if (!strstr(err.msg, "cpu, cuda or cuda:N") && !strstr(err.msg, "above"))
        fail_msg("'%s': message '%s' does not list the accepted forms", s, err.msg);
}

static void test_parse_refuses(void **state) {
    (void)state;
    expect_parse_error("", "empty device");
    expect_parse_error("gpu", "unknown device 'gpu'");
    expect_parse_error("CUDA", "unknown device 'CUDA'");
    expect_parse_error("cpu:0", "unknown device 'cpu:0'");
    expect_parse_error("cudax", "unknown device 'cudax'");
    expect_parse_error(" cuda", "unknown device ' cuda'");
    expect_parse_error("cuda:", "no device number");
    expect_parse_error("cuda:-1", "'-1' is not a device number");
    expect_parse_error("cuda:1x", "'1x' is not a device number");
    expect_parse_error("cuda: 1", "' 1' is not a device number");
    expect_parse_error("cuda:1024", "above 1023");
    expect_parse_error("cuda:99999999999999999999999", "above 1023");
    /* a long string is cut in the message, never overflows it */
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    expect_parse_error(big, "unknown device 'xxxx");
}

static void test_create_cpu(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *be = NULL;
    assert_int_equal(zi_backend_create_for_device("cpu", 1, 0, &be, &err), ZI_OK);
    assert_non_null(be);
    assert_string_equal(be->ops->name, "cpu");
    float *x = be->ops->alloc(be, 4 * sizeof(float));
    float y[4] = {1, 2, 3, 4}, z[4];
    be->ops->upload(be, x, y, sizeof y);
    be->ops->add(be, x, x, 4);
    be->ops->download(be, z, x, sizeof z);
    assert_int_equal(be->ops->sync(be, NULL), ZI_OK);
    assert_true(z[3] == 8.0f);
    be->ops->free(be, x);
    zi_backend_free(be);
    be = NULL;
    assert_int_equal(zi_backend_create_for_device(NULL, 0, 0, &be, &err), ZI_OK);
    assert_string_equal(be->ops->name, "cpu");
    zi_backend_free(be);
}

static void test_create_errors(void **state) {
    (void)state;
    zi_error err = {0};
    zi_backend *be = NULL;
    assert_int_equal(zi_backend_create_for_device("tpu:0", 1, 0, &be, &err), ZI_EINVAL);
    assert_null(be);
    assert_non_null(strstr(err.msg, "unknown device 'tpu:0'"));

    const char *names[] = {"cuda", "cuda:0", "cuda:1023"};
    for (size_t i = 0; i < 3; i++) {
        zi_error_clear(&err);
        int rc = zi_backend_create_for_device(names[i], 1, 0, &be, &err);
        print_message("%s -> %d: %s\n", names[i], rc, err.msg);
        if (rc == ZI_OK) { /* a GPU is here: only cuda:1023 cannot exist */
            assert_true(i < 2);
            assert_string_equal(be->ops->name, "cuda");
            zi_backend_free(be);
            be = NULL;
            continue;
        }
        assert_null(be);
        char head[96];
        snprintf(head, sizeof head, "device '%s'", names[i]);
        if (strncmp(err.msg, head, strlen(head)) != 0)
            fail_msg("message '%s' does not start with %s", err.msg, head);
#ifdef ZI_HAVE_CUDA
        int n = 0;
        zi_error e2 = {0};
        if (zi_cuda_device_count(&n, &e2) != ZI_OK) {
            /* no usable GPU: the CUDA runtime's own reason is passed on */
            assert_int_equal(rc, ZI_EUNSUPPORTED);
            assert_non_null(strstr(err.msg, "no usable CUDA device"));
            assert_non_null(strstr(err.msg, "cudaGetDeviceCount"));
            assert_non_null(strstr(err.msg, e2.msg));
        } else if (i == 2) {
            assert_int_equal(rc, ZI_EINVAL);
            assert_non_null(strstr(err.msg, "CUDA device"));
            assert_non_null(strstr(err.msg, "cuda:0..cuda:"));
        }
#else
        assert_int_equal(rc, ZI_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "built without CUDA"));
#endif
    }
}

static void test_list_devices(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    zi_backend_list_devices(f);
    fclose(f);
    print_message("%s", buf);
    assert_true(strncmp(buf, "cpu: compiled in, kernels ", 26) == 0);
    assert_int_equal(zi_backend_cuda_compiled(),
#ifdef ZI_HAVE_CUDA
                     1
#else
                     0
#endif
    );
#ifdef ZI_HAVE_CUDA
    const char *cuda = strstr(buf, "\ncuda: compiled in, ");
    assert_non_null(cuda);
    int n = 0;
    zi_error e = {0};
    if (zi_cuda_device_count(&n, &e) != ZI_OK) {
        /* "cuda: compiled in, 0 devices found (<cudaGetDeviceCount's error>)" */
        assert_non_null(strstr(cuda, "0 devices found ("));
        assert_non_null(strstr(cuda, e.msg));
    } else {
        assert_non_null(strstr(buf, "\n  cuda:0  "));
    }
#else
    assert_non_null(strstr(buf, "\ncuda: not compiled in"));
#endif
    assert_non_null(
        strstr(buf, zi_tp_nccl_compiled() ? "\nnccl: compiled in" : "\nnccl: not compiled in"));
    /* one line per entry, newline-terminated */
    assert_true(len > 0 && buf[len - 1] == '\n');
    free(buf);
}

static void test_tp_split_rules(void **state) {
    (void)state;
    struct {
        const char *name;
        zi_tp_split split;
    } cases[] = {
        {"blk.0.attn_q.weight", ZI_TP_SPLIT_ROWS},
        {"blk.11.attn_k.weight", ZI_TP_SPLIT_ROWS},
        {"blk.3.attn_v.weight", ZI_TP_SPLIT_ROWS},
        {"blk.3.ffn_gate.weight", ZI_TP_SPLIT_ROWS},
        {"blk.29.ffn_up.weight", ZI_TP_SPLIT_ROWS},
        {"blk.0.attn_output.weight", ZI_TP_SPLIT_COLS},
        {"blk.7.ffn_down.weight", ZI_TP_SPLIT_COLS},
        {"blk.0.attn_norm.weight", ZI_TP_REPLICATED},
        {"blk.0.ffn_norm.weight", ZI_TP_REPLICATED},
        {"token_embd.weight", ZI_TP_REPLICATED},
        {"output.weight", ZI_TP_REPLICATED},
        {"output_norm.weight", ZI_TP_REPLICATED},
        {"attn_q.weight", ZI_TP_REPLICATED},
        {"blk.0.attn_q.bias", ZI_TP_REPLICATED},
        {"", ZI_TP_REPLICATED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (zi_tp_split_for_tensor(cases[i].name, strlen(cases[i].name)) != cases[i].split)
            fail_msg("%s: wrong split", cases[i].name);
    /* GGUF names are not NUL-terminated: only len bytes count */
    const char *s = "blk.0.attn_output.weightXYZ";
    assert_int_equal(zi_tp_split_for_tensor(s, strlen(s) - 3), ZI_TP_SPLIT_COLS);
    assert_int_equal(zi_tp_split_for_tensor(s, strlen(s)), ZI_TP_REPLICATED);
    assert_int_equal(zi_tp_split_for_tensor(NULL, 0), ZI_TP_REPLICATED);
}

static void test_tp_shard(void **state) {
    (void)state;
    zi_error err = {0};
    int64_t lo, hi, next = 0;
    for (int r = 0; r < 3; r++) { /* 9 heads of 64 over 3 ranks */
        assert_int_equal(zi_tp_shard(576, 64, 3, r, &lo, &hi, &err), ZI_OK);
        assert_int_equal(lo, next);
        assert_int_equal(hi - lo, 192);
        next = hi;
    }
    assert_int_equal(next, 576);
    assert_int_equal(zi_tp_shard(576, 64, 1, 0, &lo, &hi, &err), ZI_OK);
    assert_true(lo == 0 && hi == 576);
    assert_int_equal(zi_tp_shard(576, 64, 2, 0, &lo, &hi, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "9 units of 64 elements do not split evenly over 2 ranks"));
    assert_int_equal(zi_tp_shard(100, 32, 1, 0, &lo, &hi, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "not whole units of 32"));
    assert_int_equal(zi_tp_shard(64, 32, 2, 2, &lo, &hi, &err), ZI_EINVAL);
    assert_int_equal(zi_tp_shard(64, 32, 0, 0, &lo, &hi, &err), ZI_EINVAL);
    assert_int_equal(zi_tp_shard(64, 0, 1, 0, &lo, &hi, &err), ZI_EINVAL);
}

static void test_tp_one_rank(void **state) {
    (void)state;
    zi_error err = {0};
    zi_tp *tp = NULL;
    zi_tp_options o = {.world_size = 1, .rank = 0, .device = 0};
    assert_int_equal(zi_tp_create(&o, &tp, &err), ZI_OK);
    assert_int_equal(zi_tp_world_size(tp), 1);
    assert_int_equal(zi_tp_rank(tp), 0);
    assert_int_equal(zi_tp_uses_nccl(tp), 0);
    /* one rank: the buffer is the sum; nothing is touched (a host buffer is fine) */
    float buf[3] = {1, 2, 3};
    assert_int_equal(zi_tp_all_reduce_sum(tp, buf, 3, NULL, &err), ZI_OK);
    assert_true(buf[0] == 1 && buf[1] == 2 && buf[2] == 3);
    zi_tp_free(tp);
    assert_int_equal(zi_tp_all_reduce_sum(NULL, buf, 3, NULL, &err), ZI_OK);

    zi_tp_options bad[] = {{.world_size = 0},
                           {.world_size = 2, .rank = 2},
                           {.world_size = 1, .rank = -1},
                           {.world_size = 2, .rank = 1}};
    for (size_t i = 0; i < 4; i++) {
        tp = NULL;
        zi_error_clear(&err);
        assert_int_equal(zi_tp_create(&bad[i], &tp, &err), ZI_EINVAL);
        assert_null(tp);
        assert_true(err.msg[0] != '\0');
    }
    assert_non_null(strstr(err.msg, "rendezvous id")); /* 2 ranks without an id */
    if (!zi_tp_nccl_compiled()) {
        zi_tp_options f = {.world_size = 1, .force_nccl = 1};
        assert_int_equal(zi_tp_create(&f, &tp, &err), ZI_EUNSUPPORTED);
        assert_non_null(strstr(err.msg, "built without NCCL"));
        zi_tp_id id;
        assert_int_equal(zi_tp_new_id(&id, &err), ZI_EUNSUPPORTED);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_accepts), cmocka_unit_test(test_parse_refuses),
        cmocka_unit_test(test_create_cpu),    cmocka_unit_test(test_create_errors),
        cmocka_unit_test(test_list_devices),  cmocka_unit_test(test_tp_split_rules),
        cmocka_unit_test(test_tp_shard),      cmocka_unit_test(test_tp_one_rank),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
