/*
 * vendor_dir.h - where scripts/fetch-llamacpp-vendor puts llama.cpp's
 * vendored files ($ZINFER_HOME/llama.cpp-vendor/models, ZINFER_HOME
 * defaulting to ~/.cache/zinfer), for the tests and fuzz replays that read
 * its vocabularies and chat templates (and skip them when absent).
 */
#ifndef ZI_TEST_VENDOR_DIR_H
#define ZI_TEST_VENDOR_DIR_H

#include <stdio.h>
#include <stdlib.h>

/* The folder models/SUB of the vendored files ("" for models itself). */
static inline void zi_test_vendor_dir(char *buf, size_t cap, const char *sub) {
    const char *home = getenv("ZINFER_HOME");
    const char *sep = *sub ? "/" : "";
    if (home && *home)
        snprintf(buf, cap, "%s/llama.cpp-vendor/models%s%s", home, sep, sub);
    else
        snprintf(buf, cap, "%s/.cache/zinfer/llama.cpp-vendor/models%s%s",
                 getenv("HOME") ? getenv("HOME") : "", sep, sub);
}

#endif
