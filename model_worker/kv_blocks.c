/*
 * kv_blocks.c - see kv_blocks.h.
 *
 * Free blocks sit on a stack; cached blocks on a doubly linked list in
 * release order (head = least recently released = next to evict), which
 * lets a prefix match take a block out of the middle in O(1). Registered
 * blocks are found through an open-addressing hash table (linear probing,
 * backward-shift deletion) keyed by their chained prefix hash.
 *
 * Debug builds (meson's b_ndebug=if-release keeps assert() in every build
 * but release) assert the invariant's cheap parts at each operation, O(1)
 * each: a block leaves a list in the state that list holds, refcounts never
 * go below 1 while used, and the table and the registered flags agree.
 * zi_kv_blocks_check is the whole walk, for the tests.
 */
#include "kv_blocks.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

enum { ST_FREE = 0, ST_USED = 1, ST_CACHED = 2 };

struct zi_kv_blocks {
    int32_t n, bs;
    int32_t *ref;
    uint8_t *state;
    uint8_t *reg; /* registered under hash[] */
    uint64_t *hash, *parent;
    int32_t *tokens; /* [n][bs], for registered blocks */
    int32_t *free_stack, n_free;
    int32_t *prev, *next, lru_head, lru_tail, n_cached; /* the cached list */
    int32_t *table;                                     /* [cap]: block id or -1 */
    uint32_t cap_mask;
    zi_kv_blocks_stats st;
    zi_kv_blocks_evict_fn on_evict; /* zi_kv_blocks_set_evict_hook */
    void *evict_ctx;
};

_Static_assert(ZI_KV_BLOCKS_MAX == 1 << 26, "the message below says 2^26");

int zi_kv_blocks_create(int32_t n_blocks, int32_t block_size, zi_kv_blocks **out, zi_error *err) {
    *out = NULL;
    if (n_blocks < 1 || n_blocks > ZI_KV_BLOCKS_MAX || block_size < 1 || block_size > 4096)
        return zi_error_set(err, ZI_EINVAL,
                            "kv cache: %d blocks of %d tokens (need 1..2^26 blocks of 1..4096)",
                            (int)n_blocks, (int)block_size);
    zi_kv_blocks *kb = calloc(1, sizeof *kb);
    if (!kb) return zi_error_set(err, ZI_ENOMEM, "out of memory for the KV block table");
    size_t n = (size_t)n_blocks;
    uint32_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    kb->n = n_blocks;
    kb->bs = block_size;
    kb->ref = calloc(n, sizeof *kb->ref);
    kb->state = calloc(n, 1);
    kb->reg = calloc(n, 1);
    kb->hash = calloc(n, sizeof *kb->hash);
    kb->parent = calloc(n, sizeof *kb->parent);
    kb->tokens = malloc(n * (size_t)block_size * sizeof *kb->tokens);
    kb->free_stack = malloc(n * sizeof *kb->free_stack);
    kb->prev = malloc(n * sizeof *kb->prev);
    kb->next = malloc(n * sizeof *kb->next);
    kb->table = malloc(cap * sizeof *kb->table);
    if (!kb->ref || !kb->state || !kb->reg || !kb->hash || !kb->parent || !kb->tokens ||
        !kb->free_stack || !kb->prev || !kb->next || !kb->table) {
        zi_kv_blocks_free(kb);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a KV block table of %d blocks",
                            (int)n_blocks);
    }
    kb->cap_mask = cap - 1;
    memset(kb->table, 0xff, cap * sizeof *kb->table);
    /* Lowest ids on top, so a fresh cache hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) kb->free_stack[i] = n_blocks - 1 - i;
    kb->n_free = n_blocks;
    kb->lru_head = kb->lru_tail = -1;
    kb->st.n_blocks = n_blocks;
    kb->st.block_size = block_size;
    *out = kb;
    return ZI_OK;
}

void zi_kv_blocks_free(zi_kv_blocks *kb) {
    if (!kb) return;
    free(kb->ref);
    free(kb->state);
    free(kb->reg);
    free(kb->hash);
    free(kb->parent);
    free(kb->tokens);
    free(kb->free_stack);
    free(kb->prev);
    free(kb->next);
    free(kb->table);
    free(kb);
}

/* ---- the cached list ---- */

static void lru_remove(zi_kv_blocks *kb, int32_t id) {
    int32_t p = kb->prev[id], q = kb->next[id];
    assert(kb->state[id] == ST_CACHED && kb->ref[id] == 0 && kb->reg[id] && kb->n_cached > 0);
    assert(p >= 0 ? kb->next[p] == id : kb->lru_head == id);
    assert(q >= 0 ? kb->prev[q] == id : kb->lru_tail == id);
    if (p >= 0)
        kb->next[p] = q;
    else
        kb->lru_head = q;
    if (q >= 0)
        kb->prev[q] = p;
    else
        kb->lru_tail = p;
    kb->n_cached--;
}

static void lru_append(zi_kv_blocks *kb, int32_t id) {
    assert(kb->state[id] == ST_CACHED && kb->ref[id] == 0 && kb->reg[id]);
    assert(kb->n_cached + kb->n_free < kb->n);
    kb->prev[id] = kb->lru_tail;
    kb->next[id] = -1;
    if (kb->lru_tail >= 0)
        kb->next[kb->lru_tail] = id;
    else
        kb->lru_head = id;
    kb->lru_tail = id;
    kb->n_cached++;
}

/* ---- the hash table ---- */

static uint64_t mix64(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t zi_kv_blocks_hash(const zi_kv_blocks *kb, uint64_t parent, const int32_t *tokens) {
    uint64_t h = mix64(parent ^ 0x6b76626c6f636b73ULL);
    for (int32_t i = 0; i < kb->bs; i++) h = mix64(h ^ (uint32_t)tokens[i]);
    return h;
}

/* The table slot holding hash h, or the empty slot where it would go. */
static uint32_t table_find(const zi_kv_blocks *kb, uint64_t h) {
    uint32_t i = (uint32_t)h & kb->cap_mask;
    while (kb->table[i] >= 0 && kb->hash[kb->table[i]] != h) i = (i + 1) & kb->cap_mask;
    return i;
}

static void unregister(zi_kv_blocks *kb, int32_t id) {
    assert(kb->reg[id]);
    uint32_t i = table_find(kb, kb->hash[id]);
    kb->reg[id] = 0;
    assert(kb->table[i] == id);
    if (kb->table[i] != id) return; /* not reachable: registered blocks are in the table */
    /* Backward-shift deletion keeps every probe chain unbroken. */
    uint32_t j = i;
    for (;;) {
        kb->table[i] = -1;
        for (;;) {
            j = (j + 1) & kb->cap_mask;
            if (kb->table[j] < 0) return;
            uint32_t home = (uint32_t)kb->hash[kb->table[j]] & kb->cap_mask;
            /* Move table[j] into the hole at i unless its home lies in (i, j]. */
            if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) break;
        }
        kb->table[i] = kb->table[j];
        i = j;
    }
}

/* ---- blocks ---- */

int32_t zi_kv_blocks_alloc(zi_kv_blocks *kb) {
    int32_t id;
    if (kb->n_free > 0) {
        id = kb->free_stack[--kb->n_free];
        assert(kb->state[id] == ST_FREE && kb->ref[id] == 0 && !kb->reg[id]);
    } else if (kb->lru_head >= 0) {
        id = kb->lru_head;
        lru_remove(kb, id);
        if (kb->on_evict)
            kb->on_evict(kb->evict_ctx, id, kb->hash[id], kb->parent[id],
                         kb->tokens + (size_t)id * kb->bs);
        unregister(kb, id);
        kb->st.evictions++;
    } else {
        assert(kb->n_cached == 0);
        return -1;
    }
    kb->state[id] = ST_USED;
    kb->ref[id] = 1;
    return id;
}

int32_t zi_kv_blocks_available(const zi_kv_blocks *kb) {
    return kb->n_free + kb->n_cached;
}

void zi_kv_blocks_release(zi_kv_blocks *kb, int32_t id) {
    if (id < 0 || id >= kb->n || kb->state[id] != ST_USED) return;
    assert(kb->ref[id] > 0); /* used means referenced */
    if (--kb->ref[id] > 0) return;
    if (kb->reg[id]) {
        kb->state[id] = ST_CACHED;
        lru_append(kb, id);
    } else {
        assert(kb->n_free + kb->n_cached < kb->n);
        kb->state[id] = ST_FREE;
        kb->free_stack[kb->n_free++] = id;
    }
}

uint64_t zi_kv_blocks_register(zi_kv_blocks *kb, int32_t id, uint64_t parent,
                               const int32_t *tokens) {
    uint64_t h = zi_kv_blocks_hash(kb, parent, tokens);
    if (id < 0 || id >= kb->n || kb->state[id] != ST_USED || kb->reg[id]) return h;
    uint32_t i = table_find(kb, h);
    if (kb->table[i] >= 0) return h; /* this prefix already has a block */
    assert(kb->ref[id] > 0);
    kb->reg[id] = 1;
    kb->hash[id] = h;
    kb->parent[id] = parent;
    memcpy(kb->tokens + (size_t)id * kb->bs, tokens, (size_t)kb->bs * sizeof *tokens);
    kb->table[i] = id;
    return h;
}

int32_t zi_kv_blocks_match(zi_kv_blocks *kb, const int32_t *tokens, int64_t n_tokens,
                           int32_t max_blocks, int32_t *ids_out, uint64_t *last_hash) {
    return zi_kv_blocks_match_seeded(kb, 0, tokens, n_tokens, max_blocks, ids_out, NULL, last_hash);
}

int32_t zi_kv_blocks_match_seeded(zi_kv_blocks *kb, uint64_t seed, const int32_t *tokens,
                                  int64_t n_tokens, int32_t max_blocks, int32_t *ids_out,
                                  uint64_t *hashes_out, uint64_t *last_hash) {
    uint64_t parent = seed;
    int32_t found = 0;
    for (; found < max_blocks && (int64_t)(found + 1) * kb->bs <= n_tokens; found++) {
        const int32_t *tk = tokens + (size_t)found * kb->bs;
        uint64_t h = zi_kv_blocks_hash(kb, parent, tk);
        int32_t id = kb->table[table_find(kb, h)];
        kb->st.match_queries++;
        if (id < 0 || kb->parent[id] != parent ||
            memcmp(kb->tokens + (size_t)id * kb->bs, tk, (size_t)kb->bs * sizeof *tk))
            break;
        kb->st.match_hits++;
        /* Only registered blocks are in the table, and never free ones. */
        assert(kb->reg[id] && kb->hash[id] == h && kb->state[id] != ST_FREE);
        if (kb->state[id] == ST_CACHED) {
            lru_remove(kb, id);
            kb->state[id] = ST_USED;
        }
        kb->ref[id]++;
        ids_out[found] = id;
        if (hashes_out) hashes_out[found] = h;
        parent = h;
    }
    if (last_hash) *last_hash = parent;
    return found;
}

int zi_kv_blocks_registered(const zi_kv_blocks *kb, int32_t id) {
    return id >= 0 && id < kb->n && kb->reg[id];
}

void zi_kv_blocks_set_evict_hook(zi_kv_blocks *kb, zi_kv_blocks_evict_fn fn, void *ctx) {
    kb->on_evict = fn;
    kb->evict_ctx = ctx;
}

void zi_kv_blocks_get_stats(const zi_kv_blocks *kb, zi_kv_blocks_stats *out) {
    *out = kb->st;
    out->free = kb->n_free;
    out->cached = kb->n_cached;
    out->used = kb->n - kb->n_free - kb->n_cached;
}

int zi_kv_blocks_check(const zi_kv_blocks *kb, zi_error *err) {
    int32_t used = 0, n_reg = 0;
    for (int32_t i = 0; i < kb->n; i++) {
        if ((kb->state[i] == ST_USED) != (kb->ref[i] > 0) || kb->ref[i] < 0)
            return zi_error_set(err, ZI_EINVAL, "kv blocks: block %d state %d, refcount %d", (int)i,
                                kb->state[i], (int)kb->ref[i]);
        used += kb->state[i] == ST_USED;
        n_reg += kb->reg[i];
        if (kb->state[i] == ST_CACHED && !kb->reg[i])
            return zi_error_set(err, ZI_EINVAL, "kv blocks: cached block %d is not registered",
                                (int)i);
    }
    int32_t seen = 0;
    for (int32_t id = kb->lru_head, prev = -1; id >= 0; prev = id, id = kb->next[id], seen++) {
        if (seen > kb->n || kb->state[id] != ST_CACHED || kb->prev[id] != prev)
            return zi_error_set(err, ZI_EINVAL, "kv blocks: the cached list is broken at %d",
                                (int)id);
    }
    if (seen != kb->n_cached)
        return zi_error_set(err, ZI_EINVAL, "kv blocks: %d cached blocks listed, %d counted",
                            (int)seen, (int)kb->n_cached);
    for (int32_t i = 0; i < kb->n_free; i++)
        if (kb->state[kb->free_stack[i]] != ST_FREE || kb->reg[kb->free_stack[i]])
            return zi_error_set(err, ZI_EINVAL, "kv blocks: block %d on the free stack is in use",
                                (int)kb->free_stack[i]);
    if (used + kb->n_cached + kb->n_free != kb->n)
        return zi_error_set(err, ZI_EINVAL, "kv blocks: %d used + %d cached + %d free != %d blocks",
                            (int)used, (int)kb->n_cached, (int)kb->n_free, (int)kb->n);
    int32_t in_table = 0;
    for (uint32_t i = 0; i <= kb->cap_mask; i++) {
        int32_t id = kb->table[i];
        if (id < 0) continue;
        in_table++;
        if (!kb->reg[id] || kb->table[table_find(kb, kb->hash[id])] != id)
            return zi_error_set(err, ZI_EINVAL, "kv blocks: table slot %u (block %d) is stale", i,
                                (int)id);
    }
    if (in_table != n_reg)
        return zi_error_set(err, ZI_EINVAL, "kv blocks: %d registered blocks, %d in the table",
                            (int)n_reg, (int)in_table);
    return ZI_OK;
}
