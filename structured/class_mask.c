/*
 * class_mask.c - per (class, vocabulary) token masks for the grammar
 * mask's fast path (see class_mask.h): one forward pass over the trie
 * decodes each node's path as UTF-8 and checks each whole character
 * against the class, one backward pass marks the subtrees holding a token
 * not wholly in the class.
 */
#include "class_mask.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    uint64_t ascii[2];
    uint32_t (*ranges)[2]; /* owned copy */
    uint32_t n;
    uint64_t used; /* 0: empty slot */
    zi_class_mask m;
} entry;

struct zi_class_masks {
    entry e[ZI_CLASS_MASK_MAX];
    uint64_t clock;
};

zi_class_masks *zi_class_masks_create(void) {
    return calloc(1, sizeof(zi_class_masks));
}

static void entry_clear(entry *x) {
    free(x->ranges);
    free(x->m.mask);
    free(x->m.outside);
    free(x->m.by_len);
    free(x->m.max_len);
    memset(x, 0, sizeof *x);
}

void zi_class_masks_free(zi_class_masks *cm) {
    if (!cm) return;
    for (int i = 0; i < ZI_CLASS_MASK_MAX; i++) entry_clear(&cm->e[i]);
    free(cm);
}

static bool key_has(const zi_class_key *k, uint32_t cp) {
    if (cp < 128) return k->ascii[cp >> 6] >> (cp & 63) & 1;
    uint32_t lo = 0, hi = k->n; /* the first range with hi >= cp */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (k->ranges[mid][1] < cp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < k->n && k->ranges[lo][0] <= cp;
}

/* Per node while decoding its path: BAD (a character outside the class or
 * not UTF-8), or the UTF-8 bytes still to come (0: whole characters). */
enum { BAD = 0xff };

static int compute(zi_class_mask *m, const zi_vocab_trie *t, int32_t n_vocab,
                   const zi_class_key *k) {
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    int32_t n = t->n;
    size_t words = ((size_t)n_vocab + 31) / 32, owords = ((size_t)n + 63) / 64;
    uint8_t *need = malloc((size_t)n), *len = malloc((size_t)n);
    uint32_t *acc = malloc((size_t)n * sizeof *acc);
    uint8_t *chars = malloc((size_t)n); /* whole characters on the path, saturating */
    int32_t *parent = malloc((size_t)n * sizeof *parent);
    m->mask = calloc(words, sizeof *m->mask);
    m->outside = calloc(owords, sizeof *m->outside);
    m->max_len = calloc((size_t)n, 1);
    m->by_len = malloc((size_t)n_vocab * sizeof *m->by_len);
    int64_t count[ZI_CLASS_MASK_LEN + 1] = {0};
    int rc =
        need && len && acc && chars && parent && m->mask && m->outside && m->max_len && m->by_len
            ? 0
            : -1;
    if (rc) goto out;
    /* children are made after their parent (vocab_trie.c appends), so one
     * pass in index order sees each parent first */
    need[0] = 0, len[0] = 0, acc[0] = 0, parent[0] = -1, chars[0] = 0;
    m->n_allowed = 0;
    for (int32_t i = 0; i < n; i++) {
        for (int32_t c = t->nodes[i].child; c >= 0; c = t->nodes[c].sibling) {
            uint8_t b = t->nodes[c].byte, nd = BAD, ln = 0;
            uint32_t a = 0;
            parent[c] = i;
            if (need[i] == BAD) {
            } else if (need[i] == 0) {
                if (b < 0x80) {
                    nd = key_has(k, b) ? 0 : BAD;
                } else {
                    int q = b >= 0xC2 && b <= 0xDF   ? 1
                            : b >= 0xE0 && b <= 0xEF ? 2
                            : b >= 0xF0 && b <= 0xF4 ? 3
                                                     : 0;
                    if (q) nd = (uint8_t)q, ln = (uint8_t)q, a = b & (0x3Fu >> q);
                }
            } else if ((b & 0xC0) == 0x80) {
                nd = (uint8_t)(need[i] - 1), ln = len[i], a = acc[i] << 6 | (b & 0x3Fu);
                if (nd == 0 &&
                    (a < min[ln] || a > 0x10FFFF || (a >= 0xD800 && a <= 0xDFFF) || !key_has(k, a)))
                    nd = BAD;
            }
            need[c] = nd, len[c] = ln, acc[c] = a;
            chars[c] = chars[i] + (nd == 0 && chars[i] < ZI_CLASS_MASK_LEN);
        }
    }
    for (int32_t i = n - 1; i > 0; i--) {
        bool whole = need[i] == 0, out = false;
        for (int32_t id = t->nodes[i].tok; id >= 0; id = t->tok_next[id]) {
            if (whole && id < n_vocab) {
                m->mask[id >> 5] |= (int32_t)(1u << (id & 31));
                m->n_allowed++;
                count[chars[i]]++;
                if (chars[i] > m->max_len[i]) m->max_len[i] = chars[i];
            } else {
                out = true;
            }
        }
        if (m->max_len[i] > m->max_len[parent[i]]) m->max_len[parent[i]] = m->max_len[i];
        if (out || (m->outside[i >> 6] >> (i & 63) & 1)) {
            m->outside[i >> 6] |= 1ull << (i & 63);
            m->outside[parent[i] >> 6] |= 1ull << (parent[i] & 63);
        }
    }
    /* the tokens by length: a counting sort */
    int64_t at = 0;
    for (int k = 0; k <= ZI_CLASS_MASK_LEN; k++) {
        int64_t c = count[k];
        count[k] = at, at += c;
        m->len_end[k] = (int32_t)at;
    }
    for (int32_t i = 1; i < n; i++)
        if (need[i] == 0)
            for (int32_t id = t->nodes[i].tok; id >= 0; id = t->tok_next[id])
                if (id < n_vocab) m->by_len[count[chars[i]]++] = id;
out:
    free(need), free(len), free(acc), free(chars), free(parent);
    return rc;
}

const zi_class_mask *zi_class_masks_get(zi_class_masks *cm, const zi_vocab_trie *t, int32_t n_vocab,
                                        const zi_class_key *k) {
    if (!cm) return NULL;
    entry *lru = &cm->e[0];
    for (int i = 0; i < ZI_CLASS_MASK_MAX; i++) {
        entry *x = &cm->e[i];
        if (x->used && x->n == k->n && x->ascii[0] == k->ascii[0] && x->ascii[1] == k->ascii[1] &&
            !memcmp(x->ranges, k->ranges, (size_t)k->n * sizeof *k->ranges)) {
            x->used = ++cm->clock;
            return &x->m;
        }
        if (x->used < lru->used) lru = x;
    }
    entry_clear(lru);
    lru->ranges = malloc((size_t)(k->n ? k->n : 1) * sizeof *lru->ranges);
    if (!lru->ranges || compute(&lru->m, t, n_vocab, k)) {
        entry_clear(lru);
        return NULL;
    }
    memcpy(lru->ranges, k->ranges, (size_t)k->n * sizeof *k->ranges);
    memcpy(lru->ascii, k->ascii, sizeof lru->ascii);
    lru->n = k->n;
    lru->used = ++cm->clock;
    return &lru->m;
}
