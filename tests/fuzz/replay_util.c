/*
 * replay_util.c - see replay_util.h.
 */
#include "replay_util.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

uint64_t zi_replay_xorshift(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

uint64_t zi_replay_splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint8_t *zi_replay_slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            uint8_t *p = realloc(buf, cap = cap ? cap * 2 : 65536);
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

void zi_replay_run(const uint8_t *data, size_t size) {
    uint8_t *copy = calloc(size ? size : 1, 1); /* calloc: size 0 passes a defined byte */
    if (!copy) exit(1);
    if (size) memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
}

size_t zi_replay_damage(const uint8_t *src, size_t len, uint64_t *seed,
                        const zi_replay_plan *plan) {
    assert(plan->n_bytes > 0 && plan->max_delete > 0 && plan->max_repeat > 0);
    size_t runs = 0;
    zi_replay_run(src, len), runs++;
    for (int k = 0; k < plan->truncations && len; k++)
        zi_replay_run(src, zi_replay_xorshift(seed) % len), runs++;
    size_t cap = len * 2 + 16;
    uint8_t *buf = malloc(cap);
    if (!buf) exit(1);
    for (int k = 0; k < plan->mutations && len; k++) {
        memcpy(buf, src, len);
        size_t n = len;
        for (int e = 1 + (int)(zi_replay_xorshift(seed) % 4); e > 0 && n > 0; e--) {
            size_t at = zi_replay_xorshift(seed) % n;
            switch (zi_replay_xorshift(seed) % 4) {
            case 0:
                buf[at] ^= (uint8_t)(1u << (zi_replay_xorshift(seed) % 8));
                break;
            case 1:
                buf[at] = plan->bytes[zi_replay_xorshift(seed) % plan->n_bytes];
                break;
            case 2: { /* delete a run */
                size_t dl = 1 + zi_replay_xorshift(seed) % plan->max_delete;
                if (at + dl > n) dl = n - at;
                memmove(buf + at, buf + at + dl, n - at - dl);
                n -= dl;
                break;
            }
            default: { /* repeat a run */
                size_t dl = 1 + zi_replay_xorshift(seed) % plan->max_repeat;
                if (at + dl > n) dl = n - at;
                if (n + dl > cap) break;
                memmove(buf + at + dl, buf + at, n - at);
                n += dl;
            }
            }
        }
        zi_replay_run(buf, n), runs++;
    }
    free(buf);
    return runs;
}
