/*
 * fuzz_gguf_replay.c - runs the GGUF fuzz entry point as an ordinary test.
 *
 * libFuzzer needs clang; this cmocka program needs neither and runs in every
 * build (meson test 'fuzz_gguf_replay'). It feeds LLVMFuzzerTestOneInput
 * (tests/fuzz/fuzz_gguf.c, linked in) with every file in tests/fuzz/corpus/
 * and with a fixed, seeded set of mutations of a valid file generated here
 * (bit flips, byte and word overwrites with edge values, truncations,
 * insertions, deletions, copied ranges). The entry point traps on any broken
 * promise; under -fsanitize=address,undefined any bad read is reported too.
 * Each input is copied into an exact-size heap buffer so ASan sees overreads.
 *
 * Corpus files named ok_* must open and bad_* must be rejected; others only
 * must not crash. `fuzz_gguf_replay --write-seed FILE` writes the generated
 * valid file (the corpus seed ok_valid_v3.gguf).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gguf.h"
#include "gguf_writer.h"
#include "replay_util.h"

#define CORPUS_DIR "tests/fuzz/corpus"
#define N_MUTATIONS 20000

/* A valid v3 file with every value type, nested and string arrays, an
 * explicit alignment and one tensor of each supported type. */
static void build_seed(wbuf *b) {
    static const struct {
        const char *name;
        uint32_t n_dims;
        uint64_t ne[4];
        uint32_t type;
        uint64_t nbytes;
    } ts[] = {
        {"a.f32", 2, {4, 2}, ZI_TYPE_F32, 32},     {"b.f16", 1, {6}, ZI_TYPE_F16, 12},
        {"c.bf16", 3, {2, 1, 2}, ZI_TYPE_BF16, 8}, {"d.q4_0", 1, {32}, ZI_TYPE_Q4_0, 18},
        {"e.q4_1", 2, {32, 2}, ZI_TYPE_Q4_1, 40},  {"f.q8_0", 4, {32, 1, 1, 1}, ZI_TYPE_Q8_0, 34},
    };
    const size_t nt = sizeof ts / sizeof ts[0];
    const uint32_t align = 16;
    wbuf kv = {0};
    size_t n = 0;
    /* Bytes per value of each type (0: string and array, written below). */
    static const int size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    for (uint32_t t = 0; t <= 12; t++) {
        if (!size[t]) continue;
        char k[16];
        snprintf(k, sizeof k, "s.%u", t); /* a scalar */
        w_key(&kv, k, t);
        w_le(&kv, t == ZI_GGUF_BOOL ? 1 : 0x0102030405060708ull, size[t]);
        n++;
        snprintf(k, sizeof k, "a.%u", t); /* a two-element array */
        w_key(&kv, k, ZI_GGUF_ARRAY);
        w_le(&kv, t, 4), w_le(&kv, 2, 8);
        for (int i = 0; i < 2; i++)
            w_le(&kv, t == ZI_GGUF_BOOL ? (uint64_t)i : 0x11u * (unsigned)(i + 1), size[t]);
        n++;
    }
    w_key(&kv, "general.name", 8), w_str(&kv, "seed"), n++;
    w_key(&kv, "tok", 9), w_le(&kv, 8, 4), w_le(&kv, 3, 8);
    w_str(&kv, "<s>"), w_str(&kv, ""), w_str(&kv, "hello"), n++;
    w_key(&kv, "nest", 9), w_le(&kv, 9, 4), w_le(&kv, 2, 8);
    w_le(&kv, 9, 4), w_le(&kv, 1, 8), w_le(&kv, 5, 4), w_le(&kv, 1, 8), w_le(&kv, 42, 4);
    w_le(&kv, 8, 4), w_le(&kv, 1, 8), w_str(&kv, "x"), n++;
    w_key(&kv, "general.alignment", 4), w_le(&kv, align, 4), n++;

    w_bytes(b, "GGUF", 4);
    w_le(b, 3, 4), w_le(b, nt, 8), w_le(b, n, 8);
    w_bytes(b, kv.p, kv.n);
    free(kv.p);
    uint64_t off = 0;
    for (size_t i = 0; i < nt; i++) {
        w_str(b, ts[i].name);
        w_le(b, ts[i].n_dims, 4);
        for (uint32_t d = 0; d < ts[i].n_dims; d++) w_le(b, ts[i].ne[d], 8);
        w_le(b, ts[i].type, 4), w_le(b, off, 8);
        off = (off + ts[i].nbytes + align - 1) / align * align;
    }
    while (b->n % align) w_le(b, 0, 1);
    size_t start = b->n;
    for (size_t i = 0; i < nt; i++) {
        while ((b->n - start) % align) w_le(b, 0, 1);
        for (uint64_t j = 0; j < ts[i].nbytes; j++) w_le(b, (uint8_t)(i * 13 + j), 1);
    }
}

/* Runs the entry point over an exact-size copy of the bytes; returns 1 when
 * the input opened (so the test can check both paths are exercised). */
static int run_one(const uint8_t *d, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n) memcpy(copy, d, n);
    LLVMFuzzerTestOneInput(copy, n);
    zi_gguf *g;
    int ok = zi_gguf_open_memory(copy, n, &g, NULL) == ZI_OK;
    zi_gguf_close(g);
    free(copy);
    return ok;
}

static void test_corpus(void **state) {
    (void)state;
    const char *dir_path = getenv("ZI_FUZZ_CORPUS");
    if (!dir_path) dir_path = CORPUS_DIR;
    DIR *dir = opendir(dir_path);
    if (!dir) fail_msg("cannot open corpus directory %s (run from the source root)", dir_path);
    size_t files = 0, opened = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (e->d_name[0] == '.' || (len > 3 && strcmp(e->d_name + len - 3, ".md") == 0)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir_path, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) fail_msg("cannot read %s", path);
        wbuf b = {0};
        uint8_t chunk[4096];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) w_bytes(&b, chunk, got);
        fclose(f);
        int ok = run_one(b.p, b.n);
        free(b.p);
        /* Names say what to expect: ok_* must open, bad_* must be rejected. */
        if (strncmp(e->d_name, "ok_", 3) == 0 && !ok) fail_msg("%s should open", path);
        if (strncmp(e->d_name, "bad_", 4) == 0 && ok) fail_msg("%s should be rejected", path);
        opened += (size_t)ok;
        files++;
    }
    closedir(dir);
    print_message("corpus: %zu files, %zu open\n", files, opened);
    assert_true(files >= 10);
    assert_true(opened >= 5); /* the ok_ seeds */
}

/* The mutations' random numbers (replay_util.h: splitmix64, so a fixed seed
 * gives the same mutations on every run). */
static uint64_t next(uint64_t *s) {
    return zi_replay_splitmix(s);
}

static void mutate(wbuf *m, uint64_t *rng) {
    static const uint64_t edges[] = {0,
                                     1,
                                     2,
                                     3,
                                     4,
                                     5,
                                     8,
                                     9,
                                     12,
                                     13,
                                     14,
                                     16,
                                     31,
                                     32,
                                     0x7f,
                                     0x80,
                                     0xff,
                                     0x7fff,
                                     0xffff,
                                     0x7fffffff,
                                     0x80000000u,
                                     0xffffffffu,
                                     1ull << 32,
                                     1ull << 40,
                                     0x7fffffffffffffffull,
                                     0x8000000000000000ull,
                                     0xfffffffffffffff0ull,
                                     0xffffffffffffffffull};
    const size_t ne = sizeof edges / sizeof edges[0];
    int ops = 1 + (int)(next(rng) % 4);
    for (int k = 0; k < ops; k++) {
        size_t pos = m->n ? (size_t)(next(rng) % m->n) : 0;
        switch (next(rng) % 8) {
        case 0: /* flip a bit */
            if (m->n) m->p[pos] ^= (uint8_t)(1u << (next(rng) % 8));
            break;
        case 1: /* set a byte */
            if (m->n) m->p[pos] = (uint8_t)(next(rng) % 2 ? next(rng) : edges[next(rng) % ne]);
            break;
        case 2:   /* overwrite a 4- or 8-byte word with an edge value */
        case 3: { /* (twice as likely: counts and lengths are words) */
            int w = next(rng) % 2 ? 8 : 4;
            uint64_t v = edges[next(rng) % ne];
            if (next(rng) % 4 == 0) v = m->n - next(rng) % 16; /* near the file size */
            for (int i = 0; i < w && pos + (size_t)i < m->n; i++)
                m->p[pos + (size_t)i] = (uint8_t)(v >> (8 * i));
            break;
        }
        case 4: /* truncate */
            m->n = m->n ? (size_t)(next(rng) % m->n) : 0;
            break;
        case 5: { /* insert a large number (or random bytes) */
            uint8_t ins[8];
            uint64_t v = edges[next(rng) % ne];
            size_t len = 1 + (size_t)(next(rng) % 8);
            for (size_t i = 0; i < len; i++) ins[i] = (uint8_t)(v >> (8 * i));
            w_bytes(m, ins, len); /* grow, then shift the tail */
            memmove(m->p + pos + len, m->p + pos, m->n - len - pos);
            memcpy(m->p + pos, ins, len);
            break;
        }
        case 6: { /* delete a range */
            size_t len = m->n - pos ? 1 + (size_t)(next(rng) % (m->n - pos)) % 32 : 0;
            memmove(m->p + pos, m->p + pos + len, m->n - pos - len);
            m->n -= len;
            break;
        }
        case 7: { /* copy a range over another place */
            if (!m->n) break;
            size_t src = (size_t)(next(rng) % m->n);
            size_t len = 1 + (size_t)(next(rng) % 24);
            if (len > m->n - src) len = m->n - src;
            if (len > m->n - pos) len = m->n - pos;
            memmove(m->p + pos, m->p + src, len);
            break;
        }
        }
    }
}

static void test_mutations(void **state) {
    (void)state;
    wbuf seed = {0};
    build_seed(&seed);
    assert_int_equal(run_one(seed.p, seed.n), 1); /* the seed itself is valid */
    uint64_t rng = 0x5eed2024;
    size_t opened = 0;
    wbuf m = {0};
    for (int i = 0; i < N_MUTATIONS; i++) {
        m.n = 0;
        w_bytes(&m, seed.p, seed.n);
        mutate(&m, &rng);
        opened += (size_t)run_one(m.p, m.n);
    }
    print_message("mutations: %d run, %zu opened\n", N_MUTATIONS, opened);
    /* Both paths must be exercised: some mutants still open (e.g. data or
     * value bytes changed), most are rejected. */
    assert_true(opened > N_MUTATIONS / 50);
    assert_true(opened < N_MUTATIONS / 2);
    free(m.p);
    free(seed.p);
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "--write-seed") == 0) {
        wbuf b = {0};
        build_seed(&b);
        FILE *f = fopen(argv[2], "wb");
        if (!f || fwrite(b.p, 1, b.n, f) != b.n || fclose(f) != 0) return 1;
        free(b.p);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests_name("fuzz_gguf_replay", tests, NULL, NULL);
}
