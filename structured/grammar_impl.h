/*
 * grammar_impl.h - the compiled form of a GBNF grammar, shared by its
 * compiler (grammar_parse.c) and its matcher (grammar.c); not for other
 * modules (they use grammar.h).
 *
 * A rule is a run of elements in one array: its alternatives one after
 * another, each closed by G_ALT, the last by G_END. An element is a
 * character class (G_CHAR, v = class index) or a rule reference (G_REF,
 * v = rule index). Classes are sorted, merged code point ranges (negation
 * and '.' are resolved at compile time), with a bitmap for ASCII.
 *
 * rest_min[i] is the fewest UTF-8 bytes of text that take the grammar from
 * element i to the end of i's alternative (0 at its G_ALT / G_END; a class
 * counts its shortest character, a reference its rule's shortest text;
 * ZI_GMIN_INF where no finite text does): a stack's shortest way to the end
 * of the grammar is the sum over its positions (grammar.c keeps it in each
 * stack node), which is what lets a completion close within its budget.
 */
#ifndef ZI_GRAMMAR_IMPL_H
#define ZI_GRAMMAR_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "grammar.h"

enum { G_END = 0, G_ALT = 1, G_CHAR = 2, G_REF = 3 };

typedef struct gelem {
    uint32_t type : 2;
    uint32_t v : 30;
} gelem;

typedef struct gclass {
    uint64_t ascii[2]; /* code points < 128 */
    uint32_t off, n;   /* ranges[off .. off+n), sorted, disjoint */
} gclass;

struct zi_grammar {
    gelem *elems;
    int32_t n_elems;
    int32_t n_rules, root;
    int32_t *alt_off;   /* [n_rules + 1]: rule r's alternatives start at */
    int32_t *alt_start; /*   alt_start[alt_off[r] .. alt_off[r+1]) (element indexes) */
    gclass *classes;
    int32_t n_classes;
    uint32_t (*ranges)[2]; /* [lo, hi] inclusive */
    int32_t n_ranges;
    uint32_t *rest_min; /* [n_elems], see above */
};

/* "No finite text": sums saturate here (two of them still fit 32 bits). */
#define ZI_GMIN_INF 0x3fffffffu

static inline uint32_t zi_gmin_add(uint32_t a, uint32_t b) {
    uint32_t s = a + b;
    return s > ZI_GMIN_INF ? ZI_GMIN_INF : s;
}

/* Whether class c holds code point cp. */
static inline bool zi_gclass_has(const zi_grammar *g, const gclass *c, uint32_t cp) {
    if (cp < 128) return c->ascii[cp >> 6] >> (cp & 63) & 1;
    uint32_t lo = c->off, hi = c->off + c->n; /* first range with hi >= cp */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (g->ranges[mid][1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->off + c->n && g->ranges[lo][0] <= cp;
}

/* Whether class c holds any code point in [a, b]. */
static inline bool zi_gclass_meets(const zi_grammar *g, const gclass *c, uint32_t a, uint32_t b) {
    uint32_t lo = c->off, hi = c->off + c->n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (g->ranges[mid][1] < a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < c->off + c->n && g->ranges[lo][0] <= b;
}

#endif
