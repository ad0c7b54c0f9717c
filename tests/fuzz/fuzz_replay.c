/*
 * fuzz_replay.c - runs a libFuzzer entry point without libFuzzer, as a
 * test (the frame, internal message, GBNF, JSON schema and regex targets
 * each link it with their own fuzz_*.c): every file of the corpus
 * directory given as argv[1], whole, cut short at 16 seeded places, and
 * with 48 seeded byte-level mutations each (a bit flipped, a byte set to
 * one of a few telling values, a run deleted or repeated). The corpora
 * hold the seeds and every input a fuzzing run kept, so the replay keeps
 * what the runs covered and any regression input covered in CI. A broken
 * promise traps (the test fails). Usage: fuzz_X_replay CORPUS_DIR
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static uint8_t *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            uint8_t *p = realloc(buf, cap = cap ? cap * 2 : 4096);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    fclose(f);
    *len = n;
    return buf;
}

/* One input copied to the heap at its exact size, so that ASan sees any
 * read past its end. */
static void run(const uint8_t *p, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) exit(1);
    if (n) memcpy(copy, p, n);
    LLVMFuzzerTestOneInput(copy, n);
    free(copy);
}

static size_t run_file(const uint8_t *src, size_t len, uint64_t *seed) {
    static const uint8_t telling[] = {0x00, 0xff, 0x7f, 0x80, 0xc0, 0xc1, 0xd9, 0xdc, 0xdd,
                                      0xde, 0xdf, 0x90, 0x9f, 0xa0, 0xbf, '"',  '\\', '[',
                                      ']',  '{',  '}',  '(',  ')',  '*',  '|',  '?'};
    size_t runs = 0;
    run(src, len), runs++;
    for (int k = 0; k < 16 && len; k++) run(src, rng(seed) % len), runs++;
    uint8_t *buf = malloc(len * 2 + 16);
    if (!buf) exit(1);
    for (int k = 0; k < 48 && len; k++) {
        memcpy(buf, src, len);
        size_t n = len;
        for (int e = 1 + (int)(rng(seed) % 4); e > 0 && n > 0; e--) {
            size_t at = rng(seed) % n;
            switch (rng(seed) % 4) {
            case 0:
                buf[at] ^= (uint8_t)(1u << (rng(seed) % 8));
                break;
            case 1:
                buf[at] = telling[rng(seed) % sizeof telling];
                break;
            case 2: { /* delete a run */
                size_t dl = 1 + rng(seed) % 16;
                if (at + dl > n) dl = n - at;
                memmove(buf + at, buf + at + dl, n - at - dl);
                n -= dl;
                break;
            }
            default: { /* repeat a run */
                size_t dl = 1 + rng(seed) % 32;
                if (at + dl > n) dl = n - at;
                if (n + dl > len * 2 + 16) break;
                memmove(buf + at + dl, buf + at, n - at);
                n += dl;
            }
            }
        }
        run(buf, n), runs++;
    }
    free(buf);
    return runs;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    DIR *d = opendir(argv[1]);
    if (!d) {
        fprintf(stderr, "%s: cannot open %s (run from the repository root)\n", argv[0], argv[1]);
        return 1;
    }
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t files = 0, runs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", argv[1], e->d_name);
        size_t len;
        uint8_t *src = slurp(path, &len);
        if (!src) {
            fprintf(stderr, "%s: cannot read %s\n", argv[0], path);
            closedir(d);
            return 1;
        }
        runs += run_file(src, len, &seed);
        free(src);
        files++;
    }
    closedir(d);
    if (!files) {
        fprintf(stderr, "%s: no inputs in %s\n", argv[0], argv[1]);
        return 1;
    }
    printf("%s: %zu inputs from %zu files of %s\n", argv[0], runs, files, argv[1]);
    return 0;
}
