/*
 * grow.c - growing an array by doubling (grow.h).
 */
#include "grow.h"

#include <stdint.h>
#include <stdlib.h>

void *zi_grow(void *p, size_t *cap, size_t elem, size_t first) {
    size_t n = *cap ? *cap : first;
    if (*cap && n > SIZE_MAX / 2) return NULL;
    if (*cap) n *= 2;
    if (elem && n > SIZE_MAX / elem) return NULL;
    void *q = realloc(p, n * elem);
    if (!q) return NULL;
    *cap = n;
    return q;
}
