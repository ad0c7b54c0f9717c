/*
 * test_kv_blocks.c - the paged KV cache's block allocator and prefix cache
 * (model_worker/kv_blocks.h): states, eviction order, prefix matching with
 * chained hashes, and the invariant after every operation of a long random
 * run (the pool never hands out more blocks than it has).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kv_blocks.h"

#define BS 4

static void check(const zi_kv_blocks *kb) {
    zi_error err = {0};
    int rc = zi_kv_blocks_check(kb, &err);
    if (rc) fail_msg("%s", err.msg);
}

static void test_alloc_release_evict(void **state) {
    (void)state;
    zi_kv_blocks *kb;
    zi_error err = {0};
    assert_int_equal(zi_kv_blocks_create(0, BS, &kb, &err), ZI_EINVAL);
    assert_int_equal(zi_kv_blocks_create(3, BS, &kb, &err), ZI_OK);
    int32_t a = zi_kv_blocks_alloc(kb), b = zi_kv_blocks_alloc(kb), c = zi_kv_blocks_alloc(kb);
    assert_int_equal(a, 0);
    assert_int_equal(b, 1);
    assert_int_equal(c, 2);
    assert_int_equal(zi_kv_blocks_alloc(kb), -1); /* never more than the pool */
    assert_int_equal(zi_kv_blocks_available(kb), 0);
    check(kb);
    int32_t t1[BS] = {1, 2, 3, 4}, t2[BS] = {5, 6, 7, 8};
    uint64_t ha = zi_kv_blocks_register(kb, a, 0, t1);
    assert_true(ha == zi_kv_blocks_hash(kb, 0, t1));
    zi_kv_blocks_register(kb, b, ha, t2);
    zi_kv_blocks_release(kb, b); /* cached, released first */
    zi_kv_blocks_release(kb, a); /* cached */
    zi_kv_blocks_release(kb, c); /* unregistered: free */
    check(kb);
    zi_kv_blocks_stats st;
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.cached, 2);
    assert_int_equal(st.free, 1);
    assert_int_equal(st.used, 0);
    /* The free block goes first, then the least recently released (b). */
    assert_int_equal(zi_kv_blocks_alloc(kb), c);
    assert_int_equal(zi_kv_blocks_alloc(kb), b);
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.evictions, 1);
    check(kb);
    /* a is still cached: a prefix [1 2 3 4 | 5 6 7 8] finds only a now. */
    int32_t toks[2 * BS + 1] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, ids[4];
    uint64_t last = 99;
    assert_int_equal(zi_kv_blocks_match(kb, toks, 2 * BS + 1, 4, ids, &last), 1);
    assert_int_equal(ids[0], a);
    assert_int_equal(last, ha);
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.used, 3);
    check(kb);
    zi_kv_blocks_free(kb);
}

/* A chain registered under a seed (a LoRA adapter's key) is found under
 * that seed only; seed 0 is the plain chain. */
static void test_seeded_chains(void **state) {
    (void)state;
    zi_kv_blocks *kb;
    zi_error err = {0};
    assert_int_equal(zi_kv_blocks_create(4, BS, &kb, &err), ZI_OK);
    int32_t t[2 * BS] = {1, 2, 3, 4, 5, 6, 7, 8}, ids[2];
    int32_t a = zi_kv_blocks_alloc(kb), b = zi_kv_blocks_alloc(kb);
    uint64_t h = zi_kv_blocks_register(kb, a, 77, t);
    uint64_t h2 = zi_kv_blocks_register(kb, b, h, t + BS), hs[2] = {0};
    zi_kv_blocks_release(kb, b);
    zi_kv_blocks_release(kb, a);
    uint64_t last = 5;
    assert_int_equal(zi_kv_blocks_match(kb, t, 2 * BS, 2, ids, &last), 0);
    assert_int_equal(last, 0);
    assert_int_equal(zi_kv_blocks_match_seeded(kb, 78, t, 2 * BS, 2, ids, NULL, &last), 0);
    assert_int_equal(last, 78);
    assert_int_equal(zi_kv_blocks_match_seeded(kb, 77, t, 2 * BS, 2, ids, hs, &last), 2);
    assert_int_equal(ids[0], a);
    assert_int_equal(ids[1], b);
    assert_int_equal(hs[0], h); /* each block's chained hash, as registered */
    assert_int_equal(hs[1], h2);
    assert_int_equal(last, h2);
    check(kb);
    zi_kv_blocks_release(kb, ids[1]);
    zi_kv_blocks_release(kb, ids[0]);
    zi_kv_blocks_free(kb);
}

static void test_prefix_sharing(void **state) {
    (void)state;
    zi_kv_blocks *kb;
    zi_error err = {0};
    assert_int_equal(zi_kv_blocks_create(8, BS, &kb, &err), ZI_OK);
    int32_t seq[3 * BS] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21};
    int32_t own[3];
    uint64_t parent = 0;
    for (int i = 0; i < 3; i++) {
        own[i] = zi_kv_blocks_alloc(kb);
        zi_kv_blocks_register(kb, own[i], parent, seq + i * BS);
        parent = zi_kv_blocks_hash(kb, parent, seq + i * BS);
    }
    /* A second sequence shares all three while the first still runs. */
    int32_t ids[3];
    assert_int_equal(zi_kv_blocks_match(kb, seq, 3 * BS, 3, ids, NULL), 3);
    assert_memory_equal(ids, own, sizeof own);
    /* max_blocks and a partial last block limit the match. */
    int32_t more[3], none[2];
    assert_int_equal(zi_kv_blocks_match(kb, seq, 3 * BS - 1, 3, more, NULL), 2);
    assert_int_equal(zi_kv_blocks_match(kb, seq, 3 * BS, 1, more + 2, NULL), 1);
    /* Same tokens after a different prefix: no match (hashes chain). */
    int32_t other[2 * BS] = {0, 0, 0, 0, 14, 15, 16, 17};
    assert_int_equal(zi_kv_blocks_match(kb, other, 2 * BS, 2, none, NULL), 0);
    /* Registering a second block for a known prefix keeps the first. */
    int32_t dup = zi_kv_blocks_alloc(kb);
    zi_kv_blocks_register(kb, dup, 0, seq);
    zi_kv_blocks_release(kb, dup);
    zi_kv_blocks_stats st;
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.free, 5); /* dup went back to free, unregistered */
    check(kb);
    /* Releasing every reference caches the blocks; they match again. */
    for (int i = 0; i < 3; i++) zi_kv_blocks_release(kb, own[i]), zi_kv_blocks_release(kb, ids[i]);
    for (int i = 0; i < 3; i++) zi_kv_blocks_release(kb, more[i]); /* the extra matches */
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.used, 0);
    assert_int_equal(st.cached, 3);
    check(kb);
    assert_int_equal(zi_kv_blocks_match(kb, seq, 3 * BS, 3, ids, NULL), 3);
    zi_kv_blocks_get_stats(kb, &st);
    assert_int_equal(st.cached, 0);
    assert_true(st.match_hits >= 9);
    check(kb);
    zi_kv_blocks_free(kb);
}

/* Random alloc/register/match/release against a reference count of
 * references per block; the invariant is checked after every operation. */
static void test_random_run(void **state) {
    (void)state;
    enum { N = 24, HELD = 64 };
    zi_kv_blocks *kb;
    zi_error err = {0};
    assert_int_equal(zi_kv_blocks_create(N, BS, &kb, &err), ZI_OK);
    int32_t held[HELD];
    int n_held = 0, refs[N] = {0};
    uint64_t rng = 42;
    for (int op = 0; op < 20000; op++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t r = (uint32_t)(rng >> 33);
        int32_t toks[3 * BS];
        for (int i = 0; i < 3 * BS; i++) toks[i] = (int32_t)((r >> (i % 8)) % 3); /* many repeats */
        if (r % 4 == 0 && n_held < HELD) {
            int32_t id = zi_kv_blocks_alloc(kb);
            int total = 0;
            for (int i = 0; i < N; i++) total += refs[i] > 0;
            assert_true(id >= 0 || total == N);
            if (id >= 0) {
                assert_int_equal(refs[id], 0);
                refs[id]++;
                held[n_held++] = id;
                if (r & 16) zi_kv_blocks_register(kb, id, r % 2, toks);
            }
        } else if (r % 4 == 1 && n_held + 3 <= HELD) {
            int32_t ids[3];
            int32_t got = zi_kv_blocks_match(kb, toks, 3 * BS, 3, ids, NULL);
            for (int i = 0; i < got; i++) refs[ids[i]]++, held[n_held++] = ids[i];
        } else if (n_held > 0) {
            int k = (int)(r % (uint32_t)n_held);
            refs[held[k]]--;
            zi_kv_blocks_release(kb, held[k]);
            held[k] = held[--n_held];
        }
        check(kb);
        zi_kv_blocks_stats st;
        zi_kv_blocks_get_stats(kb, &st);
        int in_use = 0;
        for (int i = 0; i < N; i++) in_use += refs[i] > 0;
        assert_int_equal(st.used, in_use);
    }
    zi_kv_blocks_free(kb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release_evict),
        cmocka_unit_test(test_prefix_sharing),
        cmocka_unit_test(test_seeded_chains),
        cmocka_unit_test(test_random_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
