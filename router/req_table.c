/*
 * req_table.c - open-addressing hash map of request ids (see req_table.h).
 *
 * Debug builds assert the table's invariants where they are cheap (O(1)
 * per operation, O(n) only inside a growth that is O(n) anyway): the
 * capacity is a power of two, the load stays at most 1/2 (so every probe
 * run ends at an empty slot), count matches the occupied slots.
 */
#include "req_table.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64's finaliser: ids are sequential, so mix them before masking. */
static size_t hash(uint64_t k) {
    k ^= k >> 30;
    k *= 0xbf58476d1ce4e5b9ull;
    k ^= k >> 27;
    k *= 0x94d049bb133111ebull;
    k ^= k >> 31;
    return (size_t)k;
}

void zi_req_table_init(zi_req_table *t) {
    memset(t, 0, sizeof *t);
}

void zi_req_table_free(zi_req_table *t) {
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static void insert_raw(zi_req_slot *slots, size_t cap, uint64_t key, void *val) {
    assert(key != 0 && cap > 0 && (cap & (cap - 1)) == 0);
    size_t i = hash(key) & (cap - 1);
    while (slots[i].key) i = (i + 1) & (cap - 1);
    slots[i].key = key;
    slots[i].val = val;
}

static int grow(zi_req_table *t, zi_error *err) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    zi_req_slot *s = calloc(cap, sizeof *s);
    if (!s) return zi_error_set(err, ZI_ENOMEM, "out of memory growing the request table");
    size_t moved = 0;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].key) insert_raw(s, cap, t->slots[i].key, t->slots[i].val), moved++;
    assert(moved == t->count);
    (void)moved;
    free(t->slots);
    t->slots = s;
    t->cap = cap;
    return ZI_OK;
}

static long find(const zi_req_table *t, uint64_t key) {
    if (!t->cap || !key) return -1;
    size_t i = hash(key) & (t->cap - 1);
    while (t->slots[i].key) {
        if (t->slots[i].key == key) return (long)i;
        i = (i + 1) & (t->cap - 1);
    }
    return -1;
}

int zi_req_table_put(zi_req_table *t, uint64_t key, void *val, zi_error *err) {
    if (!key) return zi_error_set(err, ZI_EINVAL, "request id 0 is reserved");
    if (find(t, key) >= 0)
        return zi_error_set(err, ZI_EINVAL, "request id %llu is already in the table",
                            (unsigned long long)key);
    if ((t->count + 1) * 2 > t->cap) {
        int rc = grow(t, err);
        if (rc) return rc;
    }
    insert_raw(t->slots, t->cap, key, val);
    t->count++;
    assert(t->count * 2 <= t->cap);
    return ZI_OK;
}

void *zi_req_table_get(const zi_req_table *t, uint64_t key) {
    long i = find(t, key);
    return i < 0 ? NULL : t->slots[i].val;
}

void *zi_req_table_del(zi_req_table *t, uint64_t key) {
    long at = find(t, key);
    if (at < 0) return NULL;
    assert(t->count > 0 && t->count * 2 <= t->cap);
    void *val = t->slots[at].val;
    size_t mask = t->cap - 1, i = (size_t)at;
    /* Backward-shift deletion: move later members of the probe run into the
     * hole when the hole lies between their home slot and where they sit. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!t->slots[j].key) break;
        size_t home = hash(t->slots[j].key) & mask;
        int between = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (between) {
            assert(t->slots[j].key != key); /* keys are unique */
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->slots[i].key = 0;
    t->slots[i].val = NULL;
    t->count--;
    return val;
}

void *zi_req_table_find(const zi_req_table *t, size_t *pos,
                        bool (*match)(const void *val, const void *arg), const void *arg) {
    for (; *pos < t->cap; ++*pos)
        if (t->slots[*pos].key && match(t->slots[*pos].val, arg)) return t->slots[*pos].val;
    return NULL;
}
