/*
 * grammar.c - the matcher of grammar.h: a set of parse stacks advanced
 * byte by byte, and the allowed-token mask by a walk of the vocabulary
 * trie from that set.
 *
 * A stack is a chain of arena nodes (position, parent): the position is an
 * element of the compiled grammar still to match, the parent the stack
 * below (-1: none). Nodes are hash-consed, so two equal stacks are one
 * node id and a set of stacks needs no deeper comparison. Each advance
 * stamps the nodes it visits, which removes duplicates in O(1). During a
 * mask walk the nodes made below a trie node are released when the walk
 * leaves it (the arena and the hash chains are LIFO); after a committed
 * feed the arena is compacted to the nodes still reachable once it grows.
 *
 * Each node also holds its stack's shortest way to the end of the grammar
 * in bytes (grammar_impl.h's rest_min summed down the chain), so the mask
 * walk knows, for every token, the least text still owed after it: the
 * budget check of zi_grammar_allowed_within costs one minimum per trie
 * node.
 *
 * Out of memory: a stack dropped for want of room would silently narrow
 * what is allowed, so the allocations an answer depends on (the work list,
 * the arena, the scratch sets) set s->oom when they fail, and the public
 * call under way reports ZI_ENOMEM, leaving the state as it was. Memory
 * that only speeds things up (the walk memo, the mask cache, a rehash, a
 * compaction, the fast path) is done without when short.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "class_mask.h"
#include "grammar_impl.h"
#include "grow.h"

typedef struct gnode {
    int32_t pos, parent;
    int32_t hnext; /* hash chain */
    uint32_t stamp;
    uint32_t depth;
    uint32_t minb; /* the fewest bytes that finish this stack */
} gnode;

typedef struct level { /* a set of stacks after some bytes */
    int32_t *tops;     /* [ZI_GRAMMAR_MAX_STACKS] node ids, each at a G_CHAR */
    int32_t n;
    bool can_end;
    uint8_t u8_need, u8_len; /* UTF-8 bytes still to come, and the character's length */
    uint32_t u8_acc;         /* its bits so far */
} level;

/* A mask computed before, keyed by the stack set it was computed at: node
 * ids name whole stacks (hash-consing) and committed nodes keep their ids
 * until a compaction, which empties the cache. A completion inside a long
 * string or list comes back to the same set at every step. */
#define MASK_CACHE 4

typedef struct mcached {
    int32_t *tops, n; /* n < 0: empty */
    bool can_end;
    uint8_t u8_need, u8_len;
    uint32_t u8_acc;
    int32_t *mask;
    uint32_t max_after; /* the most bytes a token of mask leaves owed */
    uint64_t used;      /* for least-recently-used replacement */
} mcached;

/* The memo of one mask walk: the distinct stack sets it meets, interned
 * (ids), and for each the set every byte leads to, so a byte from a set
 * already seen costs a lookup instead of an advance. Inside a string most
 * trie nodes lead back to the same set. */
#define WALK_MAX_SETS 4096
#define WALK_MAX_NODES (1 << 20) /* arena nodes one walk may keep */
#define WM_UNKNOWN (-3)
#define WM_DEAD (-2)

typedef struct wset {
    int32_t off, n; /* tops in pool[off .. off+n) */
    bool can_end;
    uint8_t u8_need, u8_len;
    uint32_t u8_acc, hash;
    uint32_t minb; /* level_min of the set */
} wset;

typedef struct wmemo {
    wset *sets;
    int32_t n_sets;
    int32_t *pool;
    int32_t n_pool;
    size_t cap_pool;
    int32_t *next;                /* [WALK_MAX_SETS * 256] */
    int32_t *table;               /* [2 * WALK_MAX_SETS] set ids by hash, -1: empty */
    int32_t mark;                 /* the arena before the walk */
    bool full;                    /* over WALK_MAX_NODES: nothing more kept */
    uint32_t limit;               /* a token leaving more bytes owed is not set */
    uint32_t max_set, least_over; /* the most owed of a token set, the
                                   * least owed of one over limit */
} wmemo;

struct zi_grammar_state {
    const zi_grammar *g;
    gnode *nodes;
    int32_t n;
    size_t cap;
    int32_t *bucket;
    uint32_t n_bucket; /* a power of two */
    uint32_t stamp;
    int32_t compact_at;
    level cur;
    level **lv; /* scratch sets for feeds and the trie walk, by depth (each
                 * allocated apart, so growing lv moves none) */
    int32_t n_lv;
    int32_t *work;
    int32_t n_work;
    size_t cap_work;
    mcached cache[MASK_CACHE];
    int32_t cache_words; /* the mask length the cache holds */
    uint64_t clock;
    wmemo wm;
    bool oom;           /* an allocation an answer needs failed in this call */
    int64_t fail_after; /* growths of the work list and arena left before they
                         * fail (zi_grammar_state_fail_after; < 0: never) */
};

static uint32_t hash(int32_t pos, int32_t parent) {
    return ((uint32_t)pos * 0x9E3779B1u) ^ ((uint32_t)parent * 0x85EBCA77u);
}

static int rehash(zi_grammar_state *s, uint32_t n_bucket) {
    int32_t *b = malloc(n_bucket * sizeof *b);
    if (!b) return ZI_ENOMEM;
    free(s->bucket);
    s->bucket = b, s->n_bucket = n_bucket;
    memset(b, 0xff, n_bucket * sizeof *b);
    for (int32_t i = 0; i < s->n; i++) { /* in order: the newest heads each chain */
        uint32_t h = hash(s->nodes[i].pos, s->nodes[i].parent) & (n_bucket - 1);
        s->nodes[i].hnext = b[h], b[h] = i;
    }
    return ZI_OK;
}

/* zi_grow for the arrays an answer needs, which fails once the test hook
 * (fail_after) runs out, as memory would; s->oom set on failure. */
static void *grow_needed(zi_grammar_state *s, void *p, size_t *cap, size_t elem, size_t first) {
    void *q = s->fail_after == 0 ? NULL : zi_grow(p, cap, elem, first);
    if (q && s->fail_after > 0) s->fail_after--;
    if (!q) s->oom = true;
    return q;
}

/* The node (pos, parent), made if new; -2 when the stack would be too
 * deep (that stack is dropped) or the arena cannot grow (s->oom). */
static int32_t cons(zi_grammar_state *s, int32_t pos, int32_t parent) {
    assert(pos >= 0 && pos < s->g->n_elems && parent >= -1 && parent < s->n);
    uint32_t h = hash(pos, parent) & (s->n_bucket - 1);
    for (int32_t i = s->bucket[h]; i >= 0; i = s->nodes[i].hnext)
        if (s->nodes[i].pos == pos && s->nodes[i].parent == parent) return i;
    uint32_t depth = parent >= 0 ? s->nodes[parent].depth + 1 : 1;
    if (depth > ZI_GRAMMAR_MAX_DEPTH) return -2;
    uint32_t minb = zi_gmin_add(s->g->rest_min[pos], parent >= 0 ? s->nodes[parent].minb : 0);
    if ((size_t)s->n == s->cap) {
        gnode *q = grow_needed(s, s->nodes, &s->cap, sizeof *q, 1024);
        if (!q) return -2;
        s->nodes = q;
    }
    if ((uint32_t)s->n >= s->n_bucket && rehash(s, s->n_bucket * 2) == ZI_OK)
        h = hash(pos, parent) & (s->n_bucket - 1);
    s->nodes[s->n] =
        (gnode){.pos = pos, .parent = parent, .hnext = s->bucket[h], .depth = depth, .minb = minb};
    s->bucket[h] = s->n;
    return s->n++;
}

/* Drops the nodes made since mark (LIFO, so each is its chain's head). */
static void release(zi_grammar_state *s, int32_t mark) {
    assert(mark >= 0 && mark <= s->n);
    while (s->n > mark) {
        gnode *x = &s->nodes[--s->n];
        s->bucket[hash(x->pos, x->parent) & (s->n_bucket - 1)] = x->hnext;
    }
}

/* Pushes node x (or -1: an empty stack) on the work list; false (s->oom)
 * when it cannot grow. */
static bool push_work(zi_grammar_state *s, int32_t x) {
    assert(x >= -2 && x < s->n);
    if ((size_t)s->n_work == s->cap_work) {
        int32_t *q = grow_needed(s, s->work, &s->cap_work, sizeof *q, 256);
        if (!q) return false;
        s->work = q;
    }
    s->work[s->n_work++] = x;
    return true;
}

/* Expands the stacks on the work list into out: a rule reference becomes
 * its alternatives, a finished alternative returns to its parent, a class
 * is a top. Visits at most ZI_GRAMMAR_MAX_EXPAND nodes; false when that
 * bound or ZI_GRAMMAR_MAX_STACKS cut the expansion short. */
static bool expand(zi_grammar_state *s, level *out) {
    const zi_grammar *g = s->g;
    int32_t budget = ZI_GRAMMAR_MAX_EXPAND;
    bool whole = true;
    while (s->n_work > 0 && (budget-- > 0 || (whole = false))) {
        int32_t x = s->work[--s->n_work];
        if (x == -1) {
            out->can_end = true;
            continue;
        }
        if (x < 0 || s->nodes[x].stamp == s->stamp) continue;
        assert(x < s->n && (size_t)s->n_work < s->cap_work);
        s->nodes[x].stamp = s->stamp;
        gnode nd = s->nodes[x];
        assert(nd.depth >= 1 && nd.depth <= ZI_GRAMMAR_MAX_DEPTH);
        gelem e = g->elems[nd.pos];
        assert(e.type != G_CHAR || (int32_t)e.v < g->n_classes);
        assert(e.type != G_REF || (int32_t)e.v < g->n_rules);
        if (e.type == G_CHAR) {
            if (out->n < ZI_GRAMMAR_MAX_STACKS)
                out->tops[out->n++] = x;
            else
                whole = false;
        } else if (e.type != G_REF) {
            push_work(s, nd.parent);
        } else {
            /* a reference last in its alternative returns straight to the
             * parent (a tail call), so right recursion such as x* keeps
             * the stack flat */
            int32_t ret =
                g->elems[nd.pos + 1].type <= G_ALT ? nd.parent : cons(s, nd.pos + 1, nd.parent);
            if (ret < -1) continue;
            for (int32_t a = g->alt_off[e.v + 1] - 1; a >= g->alt_off[e.v]; a--)
                push_work(s, cons(s, g->alt_start[a], ret));
        }
    }
    s->n_work = 0;
    assert(out->n <= ZI_GRAMMAR_MAX_STACKS);
    return whole;
}

static bool advance(zi_grammar_state *s, const level *in, uint8_t b, level *out) {
    const zi_grammar *g = s->g;
    out->n = 0, out->can_end = false;
    uint32_t cp = 0;
    if (in->u8_need == 0) {
        if (b < 0x80) {
            cp = b;
            out->u8_need = out->u8_len = 0;
        } else {
            int need = b >= 0xC2 && b <= 0xDF   ? 1
                       : b >= 0xE0 && b <= 0xEF ? 2
                       : b >= 0xF0 && b <= 0xF4 ? 3
                                                : 0;
            if (!need) return false;
            out->u8_need = out->u8_len = (uint8_t)need;
            out->u8_acc = b & (0x3Fu >> need);
        }
    } else {
        if ((b & 0xC0) != 0x80) return false;
        out->u8_need = in->u8_need - 1, out->u8_len = in->u8_len;
        out->u8_acc = in->u8_acc << 6 | (b & 0x3Fu);
    }
    if (out->u8_need > 0) {
        /* a partial character: keep the stacks whose class meets the
         * characters it can still become */
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        int sh = 6 * out->u8_need;
        uint32_t lo = out->u8_acc << sh, hi = lo | ((1u << sh) - 1);
        if (lo < min[out->u8_len]) lo = min[out->u8_len];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi) return false;
        for (int32_t k = 0; k < in->n; k++)
            if (zi_gclass_meets(g, &g->classes[g->elems[s->nodes[in->tops[k]].pos].v], lo, hi))
                out->tops[out->n++] = in->tops[k];
        return out->n > 0;
    }
    if (in->u8_need > 0) {
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        cp = out->u8_acc;
        if (cp < min[out->u8_len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    }
    s->stamp++;
    for (int32_t k = 0; k < in->n; k++) {
        assert(in->tops[k] >= 0 && in->tops[k] < s->n);
        const gnode *t = &s->nodes[in->tops[k]];
        if (!zi_gclass_has(g, &g->classes[g->elems[t->pos].v], cp)) continue;
        int32_t x = cons(s, t->pos + 1, t->parent);
        if (x < 0 || !push_work(s, x)) continue;
        expand(s, out);
    }
    return out->n > 0 || out->can_end;
}

static level *scratch(zi_grammar_state *s, int32_t d) {
    if (d >= s->n_lv) {
        int32_t n = d + 8;
        level **q = realloc(s->lv, (size_t)n * sizeof *q);
        if (!q) return NULL;
        s->lv = q;
        for (int32_t k = s->n_lv; k < n; k++) {
            q[k] = calloc(1, sizeof **q);
            if (q[k]) q[k]->tops = malloc(ZI_GRAMMAR_MAX_STACKS * sizeof(int32_t));
            if (!q[k] || !q[k]->tops) {
                if (q[k]) free(q[k]);
                s->n_lv = k;
                return NULL;
            }
        }
        s->n_lv = n;
    }
    return s->lv[d];
}

static void copy_level(level *dst, const level *src) {
    int32_t *t = dst->tops;
    *dst = *src;
    dst->tops = t;
    memcpy(t, src->tops, (size_t)src->n * sizeof *t);
}

/* The fewest bytes that finish some stack of l (0: it can end now); a
 * character begun counts its missing bytes instead of its class's
 * shortest. */
static uint32_t level_min(const zi_grammar_state *s, const level *l) {
    if (l->can_end && l->u8_need == 0) return 0;
    const uint32_t *rest = s->g->rest_min;
    uint32_t m = ZI_GMIN_INF;
    for (int32_t k = 0; k < l->n; k++) {
        const gnode *t = &s->nodes[l->tops[k]];
        uint32_t v = t->minb;
        if (l->u8_need && v < ZI_GMIN_INF) /* the class's share is rest[pos] - rest[pos + 1] */
            v = v - (rest[t->pos] - rest[t->pos + 1]) + l->u8_need;
        if (v < m) m = v;
    }
    return m;
}

void zi_grammar_state_free(zi_grammar_state *s) {
    if (!s) return;
    for (int32_t k = 0; k < s->n_lv; k++) {
        free(s->lv[k]->tops);
        free(s->lv[k]);
    }
    free(s->lv);
    free(s->nodes);
    free(s->bucket);
    free(s->work);
    free(s->cur.tops);
    free(s->wm.sets);
    free(s->wm.pool);
    free(s->wm.next);
    free(s->wm.table);
    for (int k = 0; k < MASK_CACHE; k++) {
        free(s->cache[k].tops);
        free(s->cache[k].mask);
    }
    free(s);
}

int zi_grammar_state_create(const zi_grammar *g, zi_grammar_state **out, zi_error *err) {
    *out = NULL;
    zi_grammar_state *s = calloc(1, sizeof *s);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "out of memory for a grammar state");
    s->g = g;
    s->cap = 1024;
    s->compact_at = 1 << 15;
    s->nodes = malloc((size_t)s->cap * sizeof *s->nodes);
    s->cur.tops = malloc(ZI_GRAMMAR_MAX_STACKS * sizeof(int32_t));
    if (!s->nodes || !s->cur.tops || rehash(s, 1024) || !scratch(s, 2)) {
        zi_grammar_state_free(s);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a grammar state");
    }
    s->stamp = 1;
    s->fail_after = -1;
    for (int k = 0; k < MASK_CACHE; k++) s->cache[k].n = -1;
    for (int32_t a = g->alt_off[g->root + 1] - 1; a >= g->alt_off[g->root]; a--)
        push_work(s, cons(s, g->alt_start[a], -1));
    expand(s, &s->cur);
    if (s->oom) { /* a root alternative dropped: the state would be wrong */
        zi_grammar_state_free(s);
        return zi_error_set(err, ZI_ENOMEM, "out of memory for a grammar state");
    }
    *out = s;
    return ZI_OK;
}

void zi_grammar_state_fail_after(zi_grammar_state *s, int64_t n) {
    s->fail_after = n < 0 ? -1 : n;
}

/* The report of a call that ran out of memory (s->oom). */
static int oom_error(zi_error *err) {
    return zi_error_set(err, ZI_ENOMEM, "grammar: out of memory matching the text");
}

/* Rebuilds the arena from the nodes the current stacks reach. */
static void compact(zi_grammar_state *s) {
    int32_t *map = malloc((size_t)s->n * sizeof *map);
    gnode *old = malloc((size_t)s->n * sizeof *old);
    if (!map || !old) goto out;
    memcpy(old, s->nodes, (size_t)s->n * sizeof *old);
    memset(map, 0xff, (size_t)s->n * sizeof *map);
    release(s, 0);
    for (int32_t k = 0; k < s->cur.n; k++) {
        /* the chain below this top, bottom first */
        int32_t chain[ZI_GRAMMAR_MAX_DEPTH], d = 0;
        for (int32_t x = s->cur.tops[k]; x >= 0 && map[x] < 0; x = old[x].parent) {
            assert(d < ZI_GRAMMAR_MAX_DEPTH);
            chain[d++] = x;
        }
        while (d > 0) {
            int32_t x = chain[--d], p = old[x].parent;
            map[x] = cons(s, old[x].pos, p >= 0 ? map[p] : -1);
        }
        s->cur.tops[k] = map[s->cur.tops[k]];
    }
out:
    free(map);
    free(old);
    if (s->n * 2 > s->compact_at) s->compact_at *= 2;
    for (int k = 0; k < MASK_CACHE; k++) s->cache[k].n = -1; /* ids renumbered */
}

/* Advances a copy of the current set over p[0..n): *ok says whether every
 * byte was taken; the set reached is in scratch(s, 0). ZI_OK, or ZI_ENOMEM
 * (s->oom). The nodes made stay: the caller keeps or releases them. */
static int advance_all(zi_grammar_state *s, const uint8_t *p, size_t n, bool *ok) {
    *ok = false;
    s->oom = false;
    level *a = scratch(s, 0), *b = scratch(s, 1);
    if (!a || !b) return ZI_ENOMEM;
    copy_level(a, &s->cur);
    bool taken = true;
    for (size_t i = 0; taken && i < n; i++) {
        taken = advance(s, a, p[i], b);
        if (s->oom) return ZI_ENOMEM; /* taken or not, some stack may be missing */
        level t = *a;
        *a = *b, *b = t;
    }
    *ok = taken;
    return ZI_OK;
}

int zi_grammar_feed(zi_grammar_state *s, const uint8_t *p, size_t n, bool *taken, zi_error *err) {
    int32_t mark = s->n;
    int rc = advance_all(s, p, n, taken);
    if (rc || !*taken) {
        release(s, mark);
        return rc ? oom_error(err) : ZI_OK;
    }
    copy_level(&s->cur, s->lv[0]);
    if (s->n > s->compact_at) compact(s);
    return ZI_OK;
}

int zi_grammar_accepts(zi_grammar_state *s, const uint8_t *p, size_t n, bool *taken,
                       zi_error *err) {
    int32_t mark = s->n;
    int rc = advance_all(s, p, n, taken);
    release(s, mark);
    return rc ? oom_error(err) : ZI_OK;
}

bool zi_grammar_can_end(const zi_grammar_state *s) {
    return s->cur.can_end && s->cur.u8_need == 0;
}

int zi_grammar_state_stacks(const zi_grammar_state *s) {
    return s->cur.n;
}

static uint32_t set_hash(const level *l) {
    uint32_t h = 2166136261u ^ ((uint32_t)l->can_end | (uint32_t)l->u8_need << 1 |
                                (uint32_t)l->u8_len << 3 | l->u8_acc << 6);
    for (int32_t k = 0; k < l->n; k++) h = (h ^ (uint32_t)l->tops[k]) * 16777619u;
    return h;
}

/* The id of set l in the memo, added if new; -1 when the memo is full. */
static int32_t intern(zi_grammar_state *s, const level *l) {
    wmemo *m = &s->wm;
    uint32_t h = set_hash(l), mask = 2 * WALK_MAX_SETS - 1;
    for (uint32_t i = h & mask;; i = (i + 1) & mask) {
        int32_t id = m->table[i];
        if (id < 0) break;
        const wset *w = &m->sets[id];
        if (w->hash == h && w->n == l->n && w->can_end == l->can_end && w->u8_need == l->u8_need &&
            w->u8_len == l->u8_len && w->u8_acc == l->u8_acc &&
            !memcmp(m->pool + w->off, l->tops, (size_t)l->n * sizeof *l->tops))
            return id;
    }
    if (m->n_sets >= WALK_MAX_SETS || m->full) return -1;
    /* (no room: not memoized, which costs time only) */
    if (zi_grow_to((void **)&m->pool, &m->cap_pool, sizeof *m->pool, (size_t)m->n_pool + l->n, 256))
        return -1;
    int32_t id = m->n_sets++;
    m->sets[id] = (wset){.off = m->n_pool,
                         .n = l->n,
                         .can_end = l->can_end,
                         .u8_need = l->u8_need,
                         .u8_len = l->u8_len,
                         .u8_acc = l->u8_acc,
                         .hash = h,
                         .minb = level_min(s, l)};
    memcpy(m->pool + m->n_pool, l->tops, (size_t)l->n * sizeof *l->tops);
    m->n_pool += l->n;
    for (int k = 0; k < 256; k++) m->next[id * 256 + k] = WM_UNKNOWN;
    uint32_t i = h & mask;
    while (m->table[i] >= 0) i = (i + 1) & mask;
    m->table[i] = id;
    return id;
}

static void set_to_level(const wmemo *m, int32_t id, level *out) {
    assert(id >= 0 && id < m->n_sets);
    const wset *w = &m->sets[id];
    assert(w->n <= ZI_GRAMMAR_MAX_STACKS && w->off + w->n <= m->n_pool);
    memcpy(out->tops, m->pool + w->off, (size_t)w->n * sizeof *out->tops);
    out->n = w->n, out->can_end = w->can_end;
    out->u8_need = w->u8_need, out->u8_len = w->u8_len, out->u8_acc = w->u8_acc;
}

/* What a walk may skip: a subtree whose tokens are all wholly in the fast
 * path's class (not outside) and of at most r characters. */
typedef struct skipper {
    const uint64_t *outside;
    const uint8_t *max_len;
    int32_t r;
} skipper;

/* Sets the bits of the tokens below trie node `node` that set in (memo id
 * in_id, -1: none) takes; stops at once when memory runs out (s->oom). */
static void walk(zi_grammar_state *s, const zi_vocab_trie *t, int32_t node, const level *in,
                 int32_t in_id, int32_t d, int32_t *mask, const skipper *sk) {
    level *out = scratch(s, d);
    wmemo *m = &s->wm;
    if (!out) {
        s->oom = true;
        return;
    }
    assert(in_id < m->n_sets && in->n <= ZI_GRAMMAR_MAX_STACKS);
    for (int32_t c = t->nodes[node].child; c >= 0 && !s->oom; c = t->nodes[c].sibling) {
        if (sk && !(sk->outside[c >> 6] >> (c & 63) & 1) && sk->max_len[c] <= sk->r)
            continue; /* allowed already */
        uint8_t b = t->nodes[c].byte;
        int32_t r = in_id >= 0 ? m->next[in_id * 256 + b] : WM_UNKNOWN, mark = s->n;
        if (r == WM_DEAD) continue;
        if (r >= 0) {
            set_to_level(m, r, out);
        } else if (!advance(s, in, b, out) || s->oom) {
            if (in_id >= 0 && !s->oom) m->next[in_id * 256 + b] = WM_DEAD;
            release(s, mark);
            continue;
        } else {
            if (s->n - m->mark > WALK_MAX_NODES) m->full = true;
            r = intern(s, out);
            if (in_id >= 0 && r >= 0) m->next[in_id * 256 + b] = r;
        }
        if (t->nodes[c].tok >= 0) {
            uint32_t owed = r >= 0 ? m->sets[r].minb : level_min(s, out);
            if (owed <= m->limit) {
                for (int32_t id = t->nodes[c].tok; id >= 0; id = t->tok_next[id])
                    mask[id >> 5] |= (int32_t)(1u << (id & 31));
                if (owed > m->max_set) m->max_set = owed;
            } else if (owed < m->least_over) {
                m->least_over = owed;
            }
        }
        if (t->nodes[c].child >= 0 && out->n > 0) walk(s, t, c, out, r, d + 1, mask, sk);
        if (r < 0) release(s, mark); /* not interned: nothing refers to its nodes */
    }
}

/* Walks the trie from the current set with a fresh memo (skipping the
 * subtrees sk says are set already, when not NULL), setting the tokens
 * that leave at most limit bytes owed; m->max_set and m->least_over say
 * what the walk saw. */
static void walk_all(zi_grammar_state *s, const zi_vocab_trie *t, int32_t *mask, const skipper *sk,
                     uint32_t limit) {
    wmemo *m = &s->wm;
    m->limit = limit, m->max_set = 0, m->least_over = ZI_GMIN_INF;
    if (!m->sets) {
        m->sets = malloc(WALK_MAX_SETS * sizeof *m->sets);
        m->next = malloc((size_t)WALK_MAX_SETS * 256 * sizeof *m->next);
        m->table = malloc(2 * WALK_MAX_SETS * sizeof *m->table);
        if (!m->sets || !m->next || !m->table) { /* no memo: every byte advanced */
            free(m->sets), free(m->next), free(m->table);
            m->sets = NULL, m->next = NULL, m->table = NULL;
            walk(s, t, 0, &s->cur, -1, 0, mask, sk);
            return;
        }
    }
    m->n_sets = 0, m->n_pool = 0, m->mark = s->n, m->full = false;
    memset(m->table, 0xff, 2 * WALK_MAX_SETS * sizeof *m->table);
    walk(s, t, 0, &s->cur, intern(s, &s->cur), 0, mask, sk);
    release(s, m->mark);
}

/* ---- the fast path (class_mask.h) --------------------------------------- */

/* Sets larger than this are walked whole (the check below costs one
 * expansion per top). */
#define FAST_MAX_TOPS 64
/* Classes of fewer code points are walked (a walk that few tokens survive
 * is cheap, and each class's masks cost a pass over the trie once). */
#define FAST_MIN_CLASS 1024

static bool big_class(const zi_grammar *g, const gclass *c) {
    uint64_t n = 0;
    for (uint32_t i = c->off; i < c->off + c->n; i++) n += g->ranges[i][1] - g->ranges[i][0] + 1;
    return n >= FAST_MIN_CLASS;
}

static bool classes_meet(const zi_grammar *g, const gclass *a, const gclass *b) {
    if ((a->ascii[0] & b->ascii[0]) | (a->ascii[1] & b->ascii[1])) return true;
    uint32_t i = a->off, j = b->off, ie = a->off + a->n, je = b->off + b->n;
    while (i < ie && j < je) {
        if (g->ranges[i][1] < g->ranges[j][0])
            i++;
        else if (g->ranges[j][1] < g->ranges[i][0])
            j++;
        else
            return true;
    }
    return false;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The set that a character of top's class leads to from top alone; false
 * when the expansion was cut short by a limit. */
static bool step_one(zi_grammar_state *s, int32_t top, level *out) {
    out->n = 0, out->can_end = false, out->u8_need = out->u8_len = 0, out->u8_acc = 0;
    s->stamp++;
    int32_t x = cons(s, s->nodes[top].pos + 1, s->nodes[top].parent);
    if (x < 0 || !push_work(s, x)) {
        s->n_work = 0;
        return false;
    }
    return expand(s, out);
}

static bool subset(const level *l, const int32_t *sorted, int32_t n) {
    for (int32_t k = 0; k < l->n; k++)
        if (!bsearch(&l->tops[k], sorted, (size_t)n, sizeof *sorted, cmp_i32)) return false;
    return true;
}

static bool same_class(const zi_grammar *g, const gclass *a, const gclass *b) {
    return a == b || (a->n == b->n && a->ascii[0] == b->ascii[0] && a->ascii[1] == b->ascii[1] &&
                      !memcmp(g->ranges + a->off, g->ranges + b->off, a->n * sizeof *g->ranges));
}

static const gclass *top_class(const zi_grammar_state *s, const level *l, int32_t k) {
    return &s->g->classes[s->g->elems[s->nodes[l->tops[k]].pos].v];
}

/* Whether every character of C (the class of in's top t) leads from in to
 * exactly one set, then in out (its tops sorted): t's own step gives out,
 * and every other top whose class meets C steps into out. tmp: scratch. */
static bool class_step(zi_grammar_state *s, const level *in, int32_t t, const gclass *C, level *out,
                       level *tmp) {
    if (!step_one(s, in->tops[t], out) || out->n == 0) return false;
    qsort(out->tops, (size_t)out->n, sizeof *out->tops, cmp_i32);
    for (int32_t u = 0; u < in->n; u++)
        if (u != t && classes_meet(s->g, C, top_class(s, in, u)) &&
            !(step_one(s, in->tops[u], tmp) && subset(tmp, out->tops, out->n)))
            return false;
    return true;
}

/* A class C of a top of the current set S_0 such that every character of
 * C leads from S_i to one S_i+1 for i < *r (S_1 = S_0: for ever, *r =
 * ZI_CLASS_MASK_LEN): then a token of at most *r whole characters all in
 * C is allowed (the sets are never empty), and only the other tokens need
 * the walk. A string body [^"]* is a fixed point; [^"]{0,40} a chain of
 * up to 40 sets. NULL when none (or no memory). *owed: the most bytes
 * owed after such a token (the largest level_min of S_1 .. S_r). */
static const zi_class_mask *fast_class(zi_grammar_state *s, const zi_grammar_vocab *v, int32_t *r,
                                       uint32_t *owed) {
    const zi_grammar *g = s->g;
    const level *c = &s->cur;
    zi_class_masks *cm = zi_grammar_vocab_class_masks(v);
    if (!cm || c->u8_need || c->n == 0 || c->n > FAST_MAX_TOPS) return NULL;
    level *L[3] = {scratch(s, 0), scratch(s, 1), scratch(s, 2)}, *s0 = scratch(s, 3),
          *tmp = scratch(s, 4);
    if (!L[0] || !L[1] || !L[2] || !s0 || !tmp) return NULL;
    copy_level(s0, c);
    qsort(s0->tops, (size_t)s0->n, sizeof *s0->tops, cmp_i32);
    int32_t mark = s->n;
    for (int32_t k = 0; k < c->n; k++) {
        const gclass *C = top_class(s, c, k);
        if (!big_class(g, C) || !class_step(s, c, k, C, L[0], tmp)) {
            release(s, mark);
            continue;
        }
        int32_t steps = 1;
        *owed = 0;
        for (;;) {
            const level *prev = steps == 1 ? s0 : L[(steps - 2) % 3], *cur = L[(steps - 1) % 3];
            uint32_t o = level_min(s, cur);
            if (o > *owed) *owed = o;
            if (cur->n == prev->n &&
                !memcmp(cur->tops, prev->tops, (size_t)cur->n * sizeof *cur->tops)) {
                steps = ZI_CLASS_MASK_LEN; /* a fixed point */
                break;
            }
            if (steps == ZI_CLASS_MASK_LEN - 1) break; /* longer tokens are told apart no more */
            int32_t t = 0;
            while (t < cur->n && !same_class(g, top_class(s, cur, t), C)) t++;
            if (t == cur->n || !class_step(s, cur, t, C, L[steps % 3], tmp)) break;
            steps++;
        }
        release(s, mark);
        zi_class_key key = {.ascii = {C->ascii[0], C->ascii[1]},
                            .ranges = (const uint32_t(*)[2])(g->ranges + C->off),
                            .n = C->n};
        *r = steps;
        return zi_class_masks_get(cm, zi_grammar_vocab_trie(v), zi_grammar_vocab_size(v), &key);
    }
    return NULL;
}

/* The mask of every token s takes, from the cache or by a walk (cached
 * then), EOS ids not yet touched; *max_after: the most bytes a token of it
 * leaves owed. False when memory ran out (s->oom; nothing cached). */
static bool mask_all(const zi_grammar_vocab *v, zi_grammar_state *s, int32_t words, int32_t *mask,
                     uint32_t *max_after) {
    const level *c = &s->cur;
    mcached *hit = NULL, *lru = &s->cache[0];
    if (s->cache_words != words) {
        for (int k = 0; k < MASK_CACHE; k++) s->cache[k].n = -1;
        s->cache_words = words;
    }
    for (int k = 0; k < MASK_CACHE && !hit; k++) {
        mcached *e = &s->cache[k];
        if (e->n == c->n && e->can_end == c->can_end && e->u8_need == c->u8_need &&
            e->u8_len == c->u8_len && e->u8_acc == c->u8_acc &&
            !memcmp(e->tops, c->tops, (size_t)c->n * sizeof *c->tops))
            hit = e;
        if (e->used < lru->used) lru = e;
    }
    if (hit) {
        memcpy(mask, hit->mask, (size_t)words * sizeof *mask);
        hit->used = ++s->clock;
        *max_after = hit->max_after;
        return true;
    }
    memset(mask, 0, (size_t)words * sizeof *mask);
    *max_after = 0;
    if (c->n > 0) {
        int32_t r = 0;
        uint32_t owed = 0;
        const zi_class_mask *fm = fast_class(s, v, &r, &owed);
        if (s->oom) { /* the fast path ran short: the full walk alone answers */
            s->oom = false;
            fm = NULL;
        }
        skipper sk = {0};
        if (fm && r >= ZI_CLASS_MASK_LEN) {
            memcpy(mask, fm->mask, (size_t)words * sizeof *mask);
        } else if (fm) {
            for (int32_t i = 0; i < fm->len_end[r]; i++)
                mask[fm->by_len[i] >> 5] |= (int32_t)(1u << (fm->by_len[i] & 31));
        }
        if (fm) sk = (skipper){.outside = fm->outside, .max_len = fm->max_len, .r = r};
        walk_all(s, zi_grammar_vocab_trie(v), mask, fm ? &sk : NULL, ZI_GMIN_INF);
        if (s->oom) return false;
        *max_after = s->wm.max_set > owed || !fm ? s->wm.max_set : owed;
    }
    if (!lru->mask) lru->mask = malloc((size_t)words * sizeof *mask);
    if (!lru->tops) lru->tops = malloc(ZI_GRAMMAR_MAX_STACKS * sizeof *lru->tops);
    if (lru->mask && lru->tops) { /* no room: just not cached */
        memcpy(lru->mask, mask, (size_t)words * sizeof *mask);
        memcpy(lru->tops, c->tops, (size_t)c->n * sizeof *c->tops);
        lru->n = c->n, lru->can_end = c->can_end;
        lru->u8_need = c->u8_need, lru->u8_len = c->u8_len, lru->u8_acc = c->u8_acc;
        lru->max_after = *max_after;
        lru->used = ++s->clock;
    }
    return true;
}

int zi_grammar_allowed(const zi_grammar_vocab *v, zi_grammar_state *s, const int32_t *eos,
                       size_t n_eos, int32_t *mask, zi_error *err) {
    return zi_grammar_allowed_within(v, s, eos, n_eos, -1, mask, err);
}

int zi_grammar_allowed_within(const zi_grammar_vocab *v, zi_grammar_state *s, const int32_t *eos,
                              size_t n_eos, int64_t budget, int32_t *mask, zi_error *err) {
    int32_t V = zi_grammar_vocab_size(v), words = (V + 31) / 32;
    uint32_t max_after = 0;
    bool end = zi_grammar_can_end(s);
    s->oom = false;
    if (!mask_all(v, s, words, mask, &max_after)) return oom_error(err);
    /* After this token, budget - 1 tokens remain, one of them the EOS: a
     * token may leave at most budget - 2 bytes owed (a byte is at most a
     * token). Over that, the walk again with the limit and no fast path;
     * but not when the text cannot be finished in the budget anyway (its
     * shortest end is longer): a walk per step would buy nothing. */
    if (budget >= 0 && s->cur.n > 0 && (int64_t)max_after > budget - 2 &&
        (int64_t)level_min(s, &s->cur) <= budget - 1) {
        uint32_t limit = budget < 2                 ? 0
                         : budget - 2 < ZI_GMIN_INF ? (uint32_t)(budget - 2)
                                                    : ZI_GMIN_INF;
        memset(mask, 0, (size_t)words * sizeof *mask);
        walk_all(s, zi_grammar_vocab_trie(v), mask, NULL, limit);
        if (s->oom) return oom_error(err);
        bool any = false;
        for (int32_t w = 0; w < words && !any; w++) any = mask[w] != 0;
        if (!any && !end) /* nothing fits: the tokens that leave the least owed */
            walk_all(s, zi_grammar_vocab_trie(v), mask, NULL, s->wm.least_over);
        if (s->oom) return oom_error(err);
    }
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] >= 0 && eos[i] < V) {
            if (end)
                mask[eos[i] >> 5] |= (int32_t)(1u << (eos[i] & 31));
            else
                mask[eos[i] >> 5] &= ~(int32_t)(1u << (eos[i] & 31));
        }
    return ZI_OK;
}

int zi_grammar_feed_token(const zi_grammar_vocab *v, zi_grammar_state *s, int32_t id, bool *taken,
                          zi_error *err) {
    size_t n;
    const uint8_t *p = zi_grammar_vocab_token(v, id, &n);
    *taken = false;
    return n > 0 ? zi_grammar_feed(s, p, n, taken, err) : ZI_OK;
}
