/*
 * tile_cache.h - the image tiles a worker encoded lately, by content:
 * (image hash, tile index) -> the tile's soft tokens. A prefix cache
 * reuses an image's positions only when whole blocks of them are cached;
 * a tile that a block boundary cuts, or a repeated image after other
 * text, would otherwise run through the tower again. Bounded by bytes,
 * the least recently used tile goes first.
 */
#ifndef ZI_TILE_CACHE_H
#define ZI_TILE_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct zi_tile_cache zi_tile_cache;

/* A cache of at most max_bytes of soft tokens (0: caches nothing);
 * NULL when out of memory. */
zi_tile_cache *zi_tile_cache_create(size_t max_bytes);
void zi_tile_cache_free(zi_tile_cache *c);

/* Copies the n floats cached for (hash, tile) to out and returns 1, or
 * returns 0 (a miss, or a hit of another length). */
int zi_tile_cache_get(zi_tile_cache *c, uint64_t hash, int tile, float *out, size_t n);

/* Keeps a copy of data (n floats) for (hash, tile), evicting the least
 * recently used tiles to make room; does nothing for a tile larger than
 * the whole cache or when memory is short. */
void zi_tile_cache_put(zi_tile_cache *c, uint64_t hash, int tile, const float *data, size_t n);

/* Hits and misses so far (get's answers). */
void zi_tile_cache_stats(const zi_tile_cache *c, uint64_t *hits, uint64_t *misses);

#endif
