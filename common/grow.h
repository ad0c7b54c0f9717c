/*
 * grow.h - growing an array by doubling, the one way zinfer's appendable
 * arrays (queues, token lists, node tables) get more room.
 *
 * Each such array is a pointer, a count and a capacity; when the count
 * reaches the capacity the caller asks zi_grow for a larger block, or
 * zi_grow_to for room for a known count (a scratch array sized per call).
 * Doubling keeps appends amortised O(1); the overflow check is written
 * once here.
 */
#ifndef ZI_GROW_H
#define ZI_GROW_H

#include <stddef.h>

/* The array p (capacity *cap elements of elem bytes; p may be NULL when
 * *cap is 0) reallocated to twice its capacity, or to `first` elements when
 * it has none; *cap is updated. NULL when that size overflows or memory is
 * short: then p is untouched, still the caller's, and *cap unchanged. */
void *zi_grow(void *p, size_t *cap, size_t elem, size_t first);

/* Makes the array *p (capacity *cap elements of elem bytes; *p may be NULL
 * when *cap is 0) hold at least need elements: nothing changes when it
 * does; else it is reallocated to `first` elements (when it has none)
 * doubled until enough, and *cap updated. ZI_OK, or ZI_ENOMEM when that
 * size overflows or memory is short: then *p and *cap are unchanged. */
int zi_grow_to(void **p, size_t *cap, size_t elem, size_t need, size_t first);

#endif
