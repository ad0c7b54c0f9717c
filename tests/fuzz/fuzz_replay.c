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

#include "replay_util.h"

/* The edits' bytes: msgpack type markers and JSON, GBNF and regex syntax. */
static const uint8_t telling[] = {0x00, 0xff, 0x7f, 0x80, 0xc0, 0xc1, 0xd9, 0xdc, 0xdd,
                                  0xde, 0xdf, 0x90, 0x9f, 0xa0, 0xbf, '"',  '\\', '[',
                                  ']',  '{',  '}',  '(',  ')',  '*',  '|',  '?'};
static const zi_replay_plan plan = {16, 48, telling, sizeof telling, 16, 32};

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
        uint8_t *src = zi_replay_slurp(path, &len);
        if (!src) {
            fprintf(stderr, "%s: cannot read %s\n", argv[0], path);
            closedir(d);
            return 1;
        }
        runs += zi_replay_damage(src, len, &seed, &plan);
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
