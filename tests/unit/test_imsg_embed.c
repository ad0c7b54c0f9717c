/*
 * test_imsg_embed.c - the embed op's messages (protocol/imsg_embed.h) and
 * request type (protocol/embeddings.h): each packs and unpacks to the same
 * values, the float32 matrix is numpy's layout, and bad inputs are
 * refused naming the field.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "codec.h"
#include "embeddings.h"
#include "imsg_embed.h"

/* Parses a built message (the caller destroys u). */
static const msgpack_object *parse(const zi_msg *m, msgpack_unpacked *u) {
    msgpack_unpacked_init(u);
    assert_int_equal(msgpack_unpack_next(u, m->sb.data, m->sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    return &u->data;
}

static void test_pooling_names(void **state) {
    (void)state;
    zi_pooling p;
    assert_int_equal(zi_pooling_parse("cls", 3, &p), ZI_OK);
    assert_int_equal(p, ZI_POOLING_CLS);
    assert_string_equal(zi_pooling_name(ZI_POOLING_LAST), "last");
    assert_int_equal(zi_pooling_parse("rank", 4, &p), ZI_OK);
    assert_int_equal(p, ZI_POOLING_RANK); /* llama.cpp's 4: a reranker's head */
    assert_string_equal(zi_pooling_name(ZI_POOLING_RANK), "rank");
    assert_int_equal(zi_pooling_parse("ranked", 6, &p), ZI_EINVAL);
}

static void test_embed_round_trip(void **state) {
    (void)state;
    zi_error err = {0};
    zi_embeddings_request req = {0};
    int32_t a[3] = {5, 6, 7}, b[1] = {9};
    assert_int_equal(zi_embeddings_request_add(&req, a, 3, &err), ZI_OK);
    assert_int_equal(zi_embeddings_request_add(&req, b, 1, &err), ZI_OK);
    assert_int_equal(zi_embeddings_request_add(&req, b, 0, &err), ZI_EINVAL);
    zi_msg m;
    zi_im_embed e = {.rid = 42,
                     .prompt_tokens = 4,
                     .truncated = 1,
                     .pooling = {"last", 4},
                     .normalize = true,
                     .req = &req};
    assert_int_equal(zi_im_embed_pack(ZI_IM_EMBED, &e, &m, &err), ZI_OK);
    msgpack_unpacked u;
    const msgpack_object *o = parse(&m, &u);
    assert_int_equal(zi_im_type_of(o), ZI_IM_EMBED);
    zi_im_embed d;
    assert_int_equal(zi_im_embed_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 42);
    assert_int_equal(d.prompt_tokens, 4);
    assert_int_equal(d.truncated, 1);
    assert_true(d.normalize);
    assert_int_equal(d.pooling.n, 4);
    assert_memory_equal(d.pooling.p, "last", 4);
    zi_embeddings_request back;
    assert_int_equal(zi_im_embed_inputs_decode(d.inputs, 16, 16, &back, &err), ZI_OK);
    assert_int_equal(back.n_inputs, 2);
    assert_int_equal(back.start[1], 3);
    assert_int_equal(back.start[2], 4);
    const int32_t want[4] = {5, 6, 7, 9};
    assert_memory_equal(back.ids, want, sizeof want);
    zi_embeddings_request_free(&back);
    /* limits: inputs, tokens */
    assert_int_equal(zi_im_embed_inputs_decode(d.inputs, 1, 16, &back, &err), ZI_EINVAL);
    assert_non_null(strstr(err.msg, "input:"));
    assert_int_equal(zi_im_embed_inputs_decode(d.inputs, 16, 3, &back, &err), ZI_EINVAL);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
    zi_embeddings_request_free(&req);
}

static void test_inputs_refused(void **state) {
    (void)state;
    zi_error err = {0};
    zi_embeddings_request r;
    /* [[1, 2], []] and [[1], "x"] */
    msgpack_sbuffer sb;
    msgpack_packer pk;
    for (int k = 0; k < 2; k++) {
        msgpack_sbuffer_init(&sb);
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_array(&pk, 2);
        msgpack_pack_int(&pk, 1);
        msgpack_pack_int(&pk, 2);
        if (k == 0)
            msgpack_pack_array(&pk, 0);
        else
            msgpack_pack_str_with_body(&pk, "x", 1);
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
        assert_int_equal(zi_im_embed_inputs_decode(&u.data, 16, 16, &r, &err), ZI_EINVAL);
        assert_memory_equal(err.msg, "input[1]", 8);
        msgpack_unpacked_destroy(&u);
        msgpack_sbuffer_destroy(&sb);
    }
}

static void test_embedded_matrix(void **state) {
    (void)state;
    zi_error err = {0};
    float v[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};
    int64_t counts[2] = {4, 9};
    zi_embeddings_response r = {.embeddings = v,
                                .rows = 2,
                                .dim = 3,
                                .token_counts = counts,
                                .n_inputs = 2,
                                .pooling = ZI_POOLING_MEAN};
    zi_msg m;
    assert_int_equal(zi_im_embedded_pack(&(zi_im_embedded){.rid = 7, .resp = &r}, &m, &err), ZI_OK);
    msgpack_unpacked u;
    const msgpack_object *o = parse(&m, &u);
    zi_im_embedded d;
    assert_int_equal(zi_im_embedded_unpack(o, &d, &err), ZI_OK);
    assert_int_equal(d.rid, 7);
    const msgpack_object *shape = zi_map_get(d.embeddings, "shape");
    const msgpack_object *data = zi_map_get(d.embeddings, "data");
    assert_int_equal(shape->via.array.size, 2);
    assert_int_equal(shape->via.array.ptr[0].via.u64, 2);
    assert_int_equal(shape->via.array.ptr[1].via.u64, 3);
    assert_int_equal(data->via.bin.size, sizeof v);
    assert_memory_equal(data->via.bin.ptr, v, sizeof v); /* little-endian host */
    assert_int_equal(d.token_counts->via.array.ptr[1].via.u64, 9);
    /* the client's result passes them on, with usage */
    zi_msg c;
    assert_int_equal(zi_im_embed_result_pack(&(zi_im_embed_result){.id = {"a", 1},
                                                                   .embeddings = d.embeddings,
                                                                   .token_counts = d.token_counts,
                                                                   .pooling = d.pooling,
                                                                   .prompt_tokens = 13},
                                             &c),
                     ZI_OK);
    msgpack_unpacked cu;
    const msgpack_object *co = parse(&c, &cu);
    assert_true(zi_map_str_is(co, "event", "result"));
    assert_true(zi_map_str_is(co, "pooling", "mean"));
    int64_t pt = 0;
    assert_int_equal(zi_map_int(zi_map_get(co, "usage"), "total_tokens", &pt, NULL), ZI_OK);
    assert_int_equal(pt, 13);
    msgpack_unpacked_destroy(&cu);
    zi_msg_free(&c);
    msgpack_unpacked_destroy(&u);
    zi_msg_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pooling_names),
        cmocka_unit_test(test_embed_round_trip),
        cmocka_unit_test(test_inputs_refused),
        cmocka_unit_test(test_embedded_matrix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
