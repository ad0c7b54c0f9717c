/*
 * tile_cache.c - see tile_cache.h. A worker holds few tiles (a 256-token
 * gemma3 tile of 2560 floats is 2.5 MiB at the 128 MiB default), so the
 * entries are a plain array searched linearly.
 */
#include "tile_cache.h"

#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t hash, used; /* used: the tick of its last get or put */
    int tile;
    size_t n;
    float *data;
} entry;

struct zi_tile_cache {
    size_t max_bytes, bytes;
    entry *e;
    size_t n, cap;
    uint64_t tick, hits, misses;
};

zi_tile_cache *zi_tile_cache_create(size_t max_bytes) {
    zi_tile_cache *c = calloc(1, sizeof *c);
    if (c) c->max_bytes = max_bytes;
    return c;
}

void zi_tile_cache_free(zi_tile_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->n; i++) free(c->e[i].data);
    free(c->e);
    free(c);
}

static entry *find(zi_tile_cache *c, uint64_t hash, int tile) {
    for (size_t i = 0; i < c->n; i++)
        if (c->e[i].hash == hash && c->e[i].tile == tile) return &c->e[i];
    return NULL;
}

int zi_tile_cache_get(zi_tile_cache *c, uint64_t hash, int tile, float *out, size_t n) {
    entry *e = find(c, hash, tile);
    if (!e || e->n != n) {
        c->misses++;
        return 0;
    }
    memcpy(out, e->data, n * sizeof *out);
    e->used = ++c->tick;
    c->hits++;
    return 1;
}

static void drop(zi_tile_cache *c, size_t i) {
    c->bytes -= c->e[i].n * sizeof(float);
    free(c->e[i].data);
    c->e[i] = c->e[--c->n];
}

void zi_tile_cache_put(zi_tile_cache *c, uint64_t hash, int tile, const float *data, size_t n) {
    const size_t bytes = n * sizeof(float);
    if (bytes > c->max_bytes || find(c, hash, tile)) return;
    while (c->bytes + bytes > c->max_bytes && c->n > 0) { /* the least recently used */
        size_t lru = 0;
        for (size_t i = 1; i < c->n; i++)
            if (c->e[i].used < c->e[lru].used) lru = i;
        drop(c, lru);
    }
    if (c->n == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 16;
        entry *ne = realloc(c->e, cap * sizeof *ne);
        if (!ne) return;
        c->e = ne, c->cap = cap;
    }
    float *d = malloc(bytes ? bytes : 1);
    if (!d) return;
    memcpy(d, data, bytes);
    c->e[c->n++] = (entry){.hash = hash, .used = ++c->tick, .tile = tile, .n = n, .data = d};
    c->bytes += bytes;
}

void zi_tile_cache_stats(const zi_tile_cache *c, uint64_t *hits, uint64_t *misses) {
    *hits = c->hits, *misses = c->misses;
}
