/*
 * req_table.h - the router's table of requests in flight: a hash map from
 * the router's internal request id (a non-zero uint64 it assigns in order)
 * to the request's record.
 *
 * The router looks a request up on every frame a backend sends about it
 * (tokens, decoded text), so lookups are O(1): open addressing with linear
 * probing, deletion by backward shift (no tombstones, so a long-running
 * router never degrades), growth at 1/2 load. Iteration order is
 * unspecified; entries are removed while walking with zi_req_table_find.
 */
#ifndef ZI_REQ_TABLE_H
#define ZI_REQ_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zi_error.h"

typedef struct zi_req_slot {
    uint64_t key; /* 0 = empty */
    void *val;
} zi_req_slot;

typedef struct zi_req_table {
    zi_req_slot *slots;
    size_t cap; /* a power of two, or 0 before the first put */
    size_t count;
} zi_req_table;

void zi_req_table_init(zi_req_table *t);
/* Frees the table itself, not the values. */
void zi_req_table_free(zi_req_table *t);
/* Inserts key -> val. ZI_EINVAL for key 0 or a key already present,
 * ZI_ENOMEM when growing fails. */
int zi_req_table_put(zi_req_table *t, uint64_t key, void *val, zi_error *err);
/* The value of key, or NULL. */
void *zi_req_table_get(const zi_req_table *t, uint64_t key);
/* Removes key and returns its value (NULL when absent). */
void *zi_req_table_del(zi_req_table *t, uint64_t key);
static inline size_t zi_req_table_count(const zi_req_table *t) {
    return t->count;
}
/* The first value at a slot >= *pos for which match(val, arg) is true,
 * or NULL; *pos is left at its slot. Allocates nothing. To take out every
 * match in one pass, start at *pos = 0 and, after deleting (only) the value
 * found, call again with the same *pos: the backward shift may move a later
 * entry into that slot, but never one from past *pos to before it (a probe
 * run that wraps past the last slot ends at an empty one before reaching
 * *pos again). */
void *zi_req_table_find(const zi_req_table *t, size_t *pos,
                        bool (*match)(const void *val, const void *arg), const void *arg);

#endif
