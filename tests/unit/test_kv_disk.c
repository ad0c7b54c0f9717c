/*
 * test_kv_disk.c - the KV cache's disk tier (model_worker/kv_disk.h):
 * blocks written and read back bit for bit; a file corrupt (payload or
 * header bit flipped), truncated, another model's (foreign) or of another
 * KV layout (stale) is rejected, counted and removed, never loaded; a hash
 * collision is a miss; the directory's bound removes the least recently
 * used files; two tiers share one directory, and their sharing ids say
 * so (equal through two paths to one directory and across reopening,
 * different for another directory or identity); an unusable directory
 * only costs hits.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kv_disk.h"

#define BS 4

static const zi_logger QUIET = {.out = NULL, .level = ZI_LOG_OFF, .tag = "test"};

static zi_kv_disk_identity ident(uint64_t model, const char *tag) {
    zi_kv_disk_identity id = {.model = model,
                              .block_size = BS,
                              .n_layers = 3,
                              .n_kv_heads = 2,
                              .head_dim = 8,
                              .k_bytes = 100,
                              .v_bytes = 64};
    snprintf(id.kv_tag, sizeof id.kv_tag, "%s", tag);
    return id;
}

static void fill(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((seed * 131 + i * 7) ^ (i >> 3));
}

static void tokens_of(uint64_t h, int32_t *t) {
    for (int i = 0; i < BS; i++) t[i] = (int32_t)(h * 10 + (uint64_t)i);
}

/* Writes block h (parent h - 1, its tokens and payload from h). */
static void put(zi_kv_disk *d, const zi_kv_disk_identity *id, uint64_t h) {
    int32_t t[BS];
    tokens_of(h, t);
    uint8_t *buf = zi_kv_disk_write_begin(d, h, h - 1, t);
    assert_non_null(buf);
    fill(buf, zi_kv_disk_payload_bytes(id), h);
    zi_kv_disk_write_commit(d);
}

/* Reads block h back; 1 when found, and then its payload is checked. */
static int get(zi_kv_disk *d, const zi_kv_disk_identity *id, uint64_t h) {
    int32_t t[BS];
    tokens_of(h, t);
    size_t n = zi_kv_disk_payload_bytes(id);
    uint8_t *buf = malloc(n), *want = malloc(n);
    fill(want, n, h);
    int ok = zi_kv_disk_read(d, h, h - 1, t, buf);
    if (ok) assert_memory_equal(buf, want, n);
    free(buf);
    free(want);
    return ok;
}

/* A new directory, this process's own: its n-th (mkdir fails on a stale
 * one). */
static char *tmpdir(void) {
    static int n;
    char *dir = malloc(96);
    if (!dir) abort(); /* not assert_non_null: GCC must see dir is never NULL after */
    snprintf(dir, 96, "/tmp/zi_kv_disk_%d_%lld_%d", (int)getpid(), (long long)time(NULL), n++);
    assert_int_equal(mkdir(dir, 0700), 0);
    return dir;
}

static void rmdir_all(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static zi_kv_disk *open_tier(const char *dir, uint64_t max, const zi_kv_disk_identity *id) {
    zi_kv_disk *d = NULL;
    zi_error err = {0};
    int rc = zi_kv_disk_open(dir, max, 1 << 20, id, &QUIET, &d, &err);
    if (rc) fail_msg("%s", err.msg);
    return d;
}

static void test_roundtrip(void **state) {
    (void)state;
    char *dir = tmpdir();
    zi_kv_disk_identity id = ident(42, "cpu k2+4 v2 a16");
    assert_int_equal(zi_kv_disk_payload_bytes(&id), 3 * 164);
    zi_kv_disk *d = open_tier(dir, 1 << 20, &id);
    for (uint64_t h = 1; h <= 5; h++) put(d, &id, h);
    zi_kv_disk_flush(d);
    for (uint64_t h = 1; h <= 5; h++) assert_true(get(d, &id, h));
    assert_false(get(d, &id, 99)); /* never written */
    /* the same hash with other tokens (a collision) or parent: a miss, the
     * file kept */
    int32_t t[BS];
    tokens_of(3, t);
    t[1] ^= 1;
    uint8_t buf[3 * 164];
    assert_int_equal(zi_kv_disk_read(d, 3, 2, t, buf), 0);
    tokens_of(3, t);
    assert_int_equal(zi_kv_disk_read(d, 3, 7, t, buf), 0);
    assert_true(get(d, &id, 3));
    zi_kv_disk_stats st;
    zi_kv_disk_get_stats(d, &st);
    assert_int_equal(st.written_blocks, 5);
    assert_int_equal(st.hit_blocks, 6);
    assert_int_equal(st.miss_blocks, 3);
    assert_int_equal(st.rejected, 0);
    assert_int_equal(st.bytes, 5 * (144 + BS * 4 + 3 * 164));
    zi_kv_disk_close(d);
    /* a restart finds them */
    d = open_tier(dir, 1 << 20, &id);
    for (uint64_t h = 1; h <= 5; h++) assert_true(get(d, &id, h));
    zi_kv_disk_close(d);
    rmdir_all(dir);
    free(dir);
}

static void flip(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    if (off < 0) {
        fseek(f, 0, SEEK_END);
        off += ftell(f);
    }
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void test_rejects(void **state) {
    (void)state;
    char *dir = tmpdir();
    zi_kv_disk_identity id = ident(42, "cpu k2+4 v2 a16");
    zi_kv_disk_identity other = ident(43, "cpu k2+4 v2 a16"); /* another model */
    zi_kv_disk_identity q8 = ident(42, "cpu q8_0");           /* another KV type */
    zi_kv_disk *d = open_tier(dir, 1 << 20, &id);
    zi_kv_disk *o = open_tier(dir, 1 << 20, &other);
    zi_kv_disk *s = open_tier(dir, 1 << 20, &q8);
    for (uint64_t h = 1; h <= 8; h++) {
        put(d, &id, h);
        put(o, &other, h);
        put(s, &q8, h);
    }
    zi_kv_disk_flush(d);
    zi_kv_disk_flush(o);
    zi_kv_disk_flush(s);
    char p[4096], q[4096];
    zi_kv_disk_path(d, 1, p, sizeof p);
    flip(p, -1); /* the payload's last byte */
    zi_kv_disk_path(d, 2, p, sizeof p);
    flip(p, 150); /* a token in the header */
    zi_kv_disk_path(d, 3, p, sizeof p);
    assert_int_equal(truncate(p, 400), 0);
    zi_kv_disk_path(d, 4, p, sizeof p);
    assert_int_equal(truncate(p, 100), 0);
    zi_kv_disk_path(d, 5, p, sizeof p);
    zi_kv_disk_path(o, 5, q, sizeof q);
    assert_int_equal(rename(q, p), 0); /* another model's file under this one's name */
    zi_kv_disk_path(d, 6, p, sizeof p);
    zi_kv_disk_path(s, 6, q, sizeof q);
    assert_int_equal(rename(q, p), 0); /* another KV type's */
    zi_kv_disk_path(d, 7, p, sizeof p);
    flip(p, 0); /* the magic */
    for (uint64_t h = 1; h <= 7; h++) assert_false(get(d, &id, h));
    assert_true(get(d, &id, 8));
    zi_kv_disk_stats st;
    zi_kv_disk_get_stats(d, &st);
    assert_int_equal(st.rejected, 7);
    for (uint64_t h = 1; h <= 7; h++) { /* removed, so that a good file can take the place */
        zi_kv_disk_path(d, h, p, sizeof p);
        assert_int_equal(access(p, F_OK), -1);
    }
    /* the others' own files are theirs: untouched, and never ours */
    assert_true(get(o, &other, 8));
    assert_true(get(s, &q8, 8));
    /* rewritten, read again */
    put(d, &id, 1);
    zi_kv_disk_flush(d);
    assert_true(get(d, &id, 1));
    zi_kv_disk_close(d);
    zi_kv_disk_close(o);
    zi_kv_disk_close(s);
    rmdir_all(dir);
    free(dir);
}

static uint64_t dir_bytes(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cat '%s'/zkv-* 2>/dev/null | wc -c", dir);
    FILE *f = popen(cmd, "r");
    unsigned long long n = 0;
    assert_int_equal(fscanf(f, "%llu", &n), 1);
    pclose(f);
    return n;
}

static void test_lru_bound(void **state) {
    (void)state;
    char *dir = tmpdir();
    zi_kv_disk_identity id = ident(42, "cpu");
    const uint64_t file = 144 + BS * 4 + 3 * 164;
    zi_kv_disk *d = open_tier(dir, 10 * file, &id);
    for (uint64_t h = 1; h <= 30; h++) {
        put(d, &id, h);
        zi_kv_disk_flush(d);
        if (h > 1) assert_true(get(d, &id, 1)); /* kept in use: the newest */
        usleep(2000);                           /* distinct modification times */
    }
    zi_kv_disk_stats st;
    zi_kv_disk_get_stats(d, &st);
    assert_true(st.bytes <= 10 * file);
    assert_int_equal(st.bytes, dir_bytes(dir));
    assert_true(get(d, &id, 1));
    assert_true(get(d, &id, 30));
    assert_true(get(d, &id, 29));
    assert_false(get(d, &id, 2)); /* the least recently used went first */
    assert_false(get(d, &id, 10));
    zi_kv_disk_close(d);
    rmdir_all(dir);
    free(dir);
}

static void test_shared_dir(void **state) {
    (void)state;
    char *dir = tmpdir();
    zi_kv_disk_identity id = ident(42, "cpu");
    zi_kv_disk *a = open_tier(dir, 1 << 20, &id), *b = open_tier(dir, 1 << 20, &id);
    for (uint64_t h = 1; h <= 40; h++) {
        put(a, &id, h);
        put(b, &id, 41 - h);
    }
    zi_kv_disk_flush(a);
    zi_kv_disk_flush(b);
    for (uint64_t h = 1; h <= 40; h++) {
        assert_true(get(a, &id, h));
        assert_true(get(b, &id, h));
    }
    zi_kv_disk_stats sa, sb;
    zi_kv_disk_get_stats(a, &sa);
    zi_kv_disk_get_stats(b, &sb);
    assert_int_equal(sa.rejected + sb.rejected, 0);
    assert_true(sa.written_blocks + sb.written_blocks >= 40);
    zi_kv_disk_close(a);
    zi_kv_disk_close(b);
    rmdir_all(dir);
    free(dir);
}

/* The sharing id: one directory's id file, created once, and the
 * identity. */
static void test_share_id(void **state) {
    (void)state;
    char *dir = tmpdir(), *other = tmpdir(), link_path[512], path[512];
    snprintf(link_path, sizeof link_path, "%s/alias", other);
    assert_int_equal(symlink(dir, link_path), 0);
    zi_kv_disk_identity id = ident(42, "cpu"), id2 = ident(42, "cuda");
    zi_kv_disk *a = open_tier(dir, 1 << 20, &id), *b = open_tier(link_path, 1 << 20, &id);
    uint64_t sa = zi_kv_disk_share_id(a);
    assert_int_not_equal(sa, 0);
    assert_int_equal(zi_kv_disk_share_id(b), sa); /* another path to the same directory */
    zi_kv_disk_close(a);
    zi_kv_disk_close(b);
    /* the id file: 16 hex digits and a newline, kept */
    snprintf(path, sizeof path, "%s/%s", dir, ZI_KV_DISK_DIR_ID_FILE);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, 17);
    a = open_tier(dir, 1 << 20, &id);
    assert_int_equal(zi_kv_disk_share_id(a), sa); /* reopened (a restarted worker) */
    put(a, &id, 1);
    zi_kv_disk_flush(a);
    zi_kv_disk_close(a);
    a = open_tier(dir, 1 << 20, &id2); /* files the first cannot read */
    assert_int_not_equal(zi_kv_disk_share_id(a), 0);
    assert_int_not_equal(zi_kv_disk_share_id(a), sa);
    zi_kv_disk_close(a);
    b = open_tier(other, 1 << 20, &id); /* another directory */
    assert_int_not_equal(zi_kv_disk_share_id(b), 0);
    assert_int_not_equal(zi_kv_disk_share_id(b), sa);
    zi_kv_disk_close(b);
    /* a directory that cannot be had has no id */
    snprintf(path, sizeof path, "%s/%s/kv", dir, ZI_KV_DISK_DIR_ID_FILE);
    a = open_tier(path, 1 << 20, &id);
    assert_int_equal(zi_kv_disk_share_id(a), 0);
    zi_kv_disk_close(a);
    rmdir_all(dir);
    rmdir_all(other);
    free(dir);
    free(other);
}

static void test_unusable_dir(void **state) {
    (void)state;
    char *dir = tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/file", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    snprintf(path, sizeof path, "%s/file/kv", dir); /* cannot be created: not a directory */
    zi_kv_disk_identity id = ident(42, "cpu");
    zi_kv_disk *d = open_tier(path, 1 << 20, &id);
    put(d, &id, 1);
    zi_kv_disk_flush(d);
    assert_false(get(d, &id, 1));
    zi_kv_disk_stats st;
    zi_kv_disk_get_stats(d, &st);
    assert_int_equal(st.written_blocks, 0);
    zi_kv_disk_close(d);
    /* a bound smaller than one block: nothing written, nothing fails */
    d = open_tier(dir, 100, &id);
    put(d, &id, 1);
    zi_kv_disk_flush(d);
    assert_false(get(d, &id, 1));
    zi_kv_disk_close(d);
    zi_error err = {0};
    assert_int_equal(zi_kv_disk_open(dir, 0, 0, &id, &QUIET, &d, &err), ZI_EINVAL);
    rmdir_all(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),    cmocka_unit_test(test_rejects),
        cmocka_unit_test(test_lru_bound),    cmocka_unit_test(test_shared_dir),
        cmocka_unit_test(test_unusable_dir), cmocka_unit_test(test_share_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
