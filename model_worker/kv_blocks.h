/*
 * kv_blocks.h - the block allocator of the paged KV cache, with prefix
 * caching (the bookkeeping half of the seeds' KVCacheMixin, docs/types.md;
 * the memory itself is the model's zi_kv_cache, zi_kv_cache_create_paged).
 *
 * The cache is a fixed pool of n_blocks blocks of block_size token
 * positions, sized once from the memory budget, so KV memory can never
 * exceed it. Every block is in exactly one of three states:
 *
 *   used    refcount >= 1: in the block table of at least one sequence;
 *   cached  refcount 0 but registered under a prefix hash: its K/V are
 *           still valid and a later sequence with the same prefix may take
 *           it back (zi_kv_blocks_match); evictable, least recently
 *           released first;
 *   free    refcount 0, holding nothing.
 *
 * Invariant (asserted by zi_kv_blocks_check, which the tests call after
 * every operation): used + cached + free == n_blocks, every block is in the
 * list its state says, and the hash table maps exactly the registered
 * blocks.
 *
 * Prefix hashes chain: the hash of a sequence's i-th full block covers its
 * tokens and the hash of block i-1 (zi_kv_blocks_hash), so equal hashes
 * mean equal whole prefixes. A registered block also keeps its tokens and
 * its parent's hash, and a match compares them, so a 64-bit hash collision
 * cannot hand a sequence wrong K/V.
 *
 * Not thread-safe: one generator owns one zi_kv_blocks.
 */
#ifndef ZI_KV_BLOCKS_H
#define ZI_KV_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

/* The most blocks a pool may have (2^26: 2^30 positions at 16 tokens a
 * block, more than any memory budget yields). It keeps the int32_t block
 * ids and the prefix table's uint32_t size (a power of two, at least twice
 * the blocks) well inside 32 bits, and the bookkeeping arrays bounded. A
 * block count chosen from memory (the generator's default, the worker's
 * sizing) is capped here; zi_kv_blocks_create refuses more. */
#define ZI_KV_BLOCKS_MAX (1 << 26)

typedef struct zi_kv_blocks zi_kv_blocks;

typedef struct zi_kv_blocks_stats {
    int32_t n_blocks, block_size;
    int32_t used, cached, free;
    uint64_t match_queries; /* blocks looked up by zi_kv_blocks_match */
    uint64_t match_hits;    /* of those, found cached or in use */
    uint64_t evictions;     /* cached blocks reused for something else */
} zi_kv_blocks_stats;

/* n_blocks 1..ZI_KV_BLOCKS_MAX, block_size 1..4096. */
int zi_kv_blocks_create(int32_t n_blocks, int32_t block_size, zi_kv_blocks **out, zi_error *err);
void zi_kv_blocks_free(zi_kv_blocks *kb);

/* A block for new K/V, refcount 1: a free one, else the least recently
 * released cached one (its registration is dropped: an eviction). -1 when
 * every block is used. */
int32_t zi_kv_blocks_alloc(zi_kv_blocks *kb);
/* Blocks that zi_kv_blocks_alloc could still hand out (free + cached). */
int32_t zi_kv_blocks_available(const zi_kv_blocks *kb);
/* Drops one reference; at 0 the block becomes cached (if registered) or
 * free. */
void zi_kv_blocks_release(zi_kv_blocks *kb, int32_t id);

/* The chained hash of one full block: its block_size tokens after the
 * prefix whose last block hashed to parent (0 for the first block). */
uint64_t zi_kv_blocks_hash(const zi_kv_blocks *kb, uint64_t parent, const int32_t *tokens);

/* Registers a used, full block (its tokens, and the hash of the block
 * before it) so that later sequences can share it, and returns its hash
 * (the parent of the next block). If another block is already registered
 * under the same prefix, nothing changes (this one stays private and
 * becomes free when released). */
uint64_t zi_kv_blocks_register(zi_kv_blocks *kb, int32_t id, uint64_t parent,
                               const int32_t *tokens);

/*
 * Prefix lookup for a sequence whose tokens are tokens[0..n_tokens): walks
 * its full blocks from the first, at most max_blocks of them, while each is
 * registered; takes a reference on each one found (a cached block becomes
 * used again) and writes their ids to ids_out. Returns the number found;
 * *last_hash gets the hash of the last one (0 when none).
 */
int32_t zi_kv_blocks_match(zi_kv_blocks *kb, const int32_t *tokens, int64_t n_tokens,
                           int32_t max_blocks, int32_t *ids_out, uint64_t *last_hash);
/* The same for a chain whose first block's parent is seed instead of 0
 * (registered with zi_kv_blocks_register(kb, id, seed, tokens)): K/V
 * computed under something besides the tokens, such as a LoRA adapter
 * (model_worker/lora.h), is only shared under the same seed. *last_hash
 * is seed when nothing matched. hashes_out (NULL: not wanted) gets each
 * found block's chained hash, for a caller that needs more than the last
 * one (a hybrid's state checkpoints, generator.c). */
int32_t zi_kv_blocks_match_seeded(zi_kv_blocks *kb, uint64_t seed, const int32_t *tokens,
                                  int64_t n_tokens, int32_t max_blocks, int32_t *ids_out,
                                  uint64_t *hashes_out, uint64_t *last_hash);

/* Is block id registered (zi_kv_blocks_register took it, and it has not
 * been evicted since)? */
int zi_kv_blocks_registered(const zi_kv_blocks *kb, int32_t id);

/* Called by zi_kv_blocks_alloc when it evicts a cached block, before the
 * block is handed out again: its id, hash, parent hash and tokens, while
 * its K/V are still valid (the disk tier writes them out, kv_disk.h). The
 * hook must not call back into kb. fn NULL: none (the default). */
typedef void (*zi_kv_blocks_evict_fn)(void *ctx, int32_t id, uint64_t hash, uint64_t parent,
                                      const int32_t *tokens);
void zi_kv_blocks_set_evict_hook(zi_kv_blocks *kb, zi_kv_blocks_evict_fn fn, void *ctx);

void zi_kv_blocks_get_stats(const zi_kv_blocks *kb, zi_kv_blocks_stats *out);
/* Checks the invariant above; ZI_EINVAL naming the first violation. */
int zi_kv_blocks_check(const zi_kv_blocks *kb, zi_error *err);

#endif
