/*
 * fuzz_chat_template_replay.c - runs the chat-template fuzz entry point
 * (fuzz_chat_template.c) without libFuzzer, as a test: on every template
 * of tests/fixtures/chat_templates/ and of llama.cpp's vendored corpus
 * ($ZINFER_HOME/llama.cpp-vendor/models/templates, when present) and of
 * tests/fuzz/corpus_chat_template/ (what fuzzing kept), whole,
 * cut short at 64 seeded places, and with 64 seeded byte-level mutations
 * each (bytes flipped, a byte set to one of the template syntax's
 * characters, a run deleted or repeated). tests/unit/test_chat_template.c
 * mutates by inserting syntax pieces; this covers truncation and raw byte
 * damage (invalid UTF-8 included). A broken promise traps.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay_util.h"
#include "vendor_dir.h"

static size_t run_file(const char *path, uint64_t *seed) {
    static const char syntax[] = "{}%#-+()[]'\"|~.,\n \\\x80\xff";
    const zi_replay_plan plan = {64, 64, (const uint8_t *)syntax, sizeof syntax - 1, 32, 64};
    size_t len;
    uint8_t *src = zi_replay_slurp(path, &len);
    if (!src) {
        fprintf(stderr, "fuzz_chat_template_replay: cannot read %s\n", path);
        exit(1);
    }
    size_t runs = zi_replay_damage(src, len, seed, &plan);
    free(src);
    return runs;
}

/* Every .jinja file of dir (every file not starting with '.' when
 * any_name: a fuzzer's corpus names its files by their hash). */
static size_t run_dir(const char *dir, bool any_name, uint64_t *seed, size_t *files) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t runs = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (any_name ? e->d_name[0] == '.' : nl < 7 || strcmp(e->d_name + nl - 6, ".jinja"))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        runs += run_file(path, seed);
        (*files)++;
    }
    closedir(d);
    return runs;
}

int main(void) {
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    size_t files = 0, runs = run_dir("tests/fixtures/chat_templates", false, &seed, &files);
    if (!files) {
        fprintf(stderr, "fuzz_chat_template_replay: no templates in tests/fixtures/chat_templates "
                        "(run from the repository root)\n");
        return 1;
    }
    char dir[2048];
    zi_test_vendor_dir(dir, sizeof dir, "templates");
    size_t vendored = 0;
    runs += run_dir(dir, false, &seed, &vendored);
    /* what fuzzing runs kept (scripts/fuzz-run merges into it) */
    runs += run_dir("tests/fuzz/corpus_chat_template", true, &seed, &files);
    printf("fuzz_chat_template_replay: %zu inputs from %zu templates (%zu vendored%s)\n", runs,
           files + vendored, vendored, vendored ? "" : ": not found, skipped");
    return 0;
}
